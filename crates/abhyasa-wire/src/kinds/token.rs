//! `oauth.token` on the wire: the payload and its words. Its rules are
//! `abhyasa_custody::kinds::OauthToken`'s.

use serde::{Deserialize, Serialize};

use crate::ids::{ClientId, TokenId, UnixMillis};

/// OAuth token action.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum TokenAction {
    /// Stop honouring the token: restrictive.
    Revoke,
    /// A new or refreshed token: benign on loss (the client retries).
    Issue,
}

/// OAuth token revocation or issue.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct TokenPayload {
    /// Revoke or issue.
    pub action: TokenAction,
    /// The token.
    pub token_id: TokenId,
    /// The client it was issued to.
    pub client_id: ClientId,
    /// When the token itself expires (its `exp`), if the issuer says. Past it no
    /// authorization service honours the token, so the principal's "not honoured" record and
    /// the receiver's dropped or cached record are forgotten then; without it they are kept
    /// for good.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub expires_at: Option<UnixMillis>,
}

impl TokenPayload {
    /// What the payload says: `revoke tok-1`.
    pub(crate) fn words(&self) -> String {
        let action = match self.action {
            TokenAction::Revoke => "revoke",
            TokenAction::Issue => "issue",
        };
        format!("{action} {}", self.token_id)
    }
}
