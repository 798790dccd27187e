//! `oauth.token`: revoke or issue a token.
//! Its payload, checks and words are `abhyasa-wire`'s `kinds/token.rs`.

use abhyasa_wire::{Obligation, SafeAction, TokenAction, TokenPayload};

use super::{GovernedKey, KindRules, PrincipalUpdate, ReceiverEffect};

/// `oauth.token`.
pub struct OauthToken;

impl KindRules for OauthToken {
    type Payload = TokenPayload;

    fn admissible(p: &TokenPayload) -> bool {
        p.action == TokenAction::Revoke
    }

    fn safe(_o: &Obligation, p: &TokenPayload, _retention: u64) -> Option<SafeAction> {
        Self::admissible(p).then(|| SafeAction::StopHonouringToken {
            token_id: p.token_id.clone(),
            expires_at: p.expires_at,
        })
    }

    fn on_issue(o: &Obligation, p: &TokenPayload) -> Option<PrincipalUpdate> {
        // A revocation is the principal's own decision: stop honouring at once.
        Self::safe(o, p, 0).map(PrincipalUpdate::Safe)
    }

    fn governed_key(o: &Obligation, p: &TokenPayload) -> GovernedKey {
        GovernedKey::Token(o.issuer.clone(), p.token_id.clone())
    }

    fn effect(_o: &Obligation, p: &TokenPayload) -> ReceiverEffect {
        match p.action {
            TokenAction::Revoke => ReceiverEffect::DropToken(p.token_id.clone(), p.expires_at),
            TokenAction::Issue => ReceiverEffect::CacheToken(p.token_id.clone(), p.expires_at),
        }
    }
}
