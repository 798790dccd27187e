//! The custody acknowledgment: it attests application, not receipt.

use serde::{Deserialize, Serialize};

use crate::ids::{AgentId, ObligationId, UnixMillis};

/// A receiver's answer to an obligation.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CustodyAck {
    /// The obligation answered.
    pub obligation_id: ObligationId,
    /// Who acks: the obligation's target. The custodian also checks the session identity.
    pub target: AgentId,
    /// What the receiver did.
    pub status: AckStatus,
    /// When the receiver acked, by its own clock.
    pub acked_at: UnixMillis,
    /// A decline's reason in the agent's own words (with [`DeclineReason::Policy`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub detail: Option<Detail>,
}

/// A short text an agent gives with a decline of its own judgement: at most
/// [`Detail::MAX_LEN`] bytes, no control characters (it is shown to people and logged).
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize)]
#[serde(transparent)]
pub struct Detail(String);

impl Detail {
    /// Longest detail, in bytes.
    pub const MAX_LEN: usize = 256;

    /// A detail, or why `text` cannot be one.
    pub fn new(text: impl Into<String>) -> Result<Self, &'static str> {
        let text = text.into();
        if text.len() > Self::MAX_LEN {
            return Err("a decline's detail is over 256 bytes");
        }
        if text.chars().any(char::is_control) {
            return Err("a decline's detail has a control character");
        }
        Ok(Self(text))
    }

    /// `text` cut to [`Detail::MAX_LEN`] bytes (at a character boundary) with control
    /// characters replaced by spaces: what an agent's own words become when they are too long.
    pub fn lossy(text: &str) -> Self {
        let mut out = String::new();
        for c in text.chars() {
            let c = if c.is_control() { ' ' } else { c };
            if out.len() + c.len_utf8() > Self::MAX_LEN {
                break;
            }
            out.push(c);
        }
        Self(out)
    }

    /// The text.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl std::fmt::Display for Detail {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl<'de> Deserialize<'de> for Detail {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let text = String::deserialize(deserializer)?;
        Detail::new(text).map_err(serde::de::Error::custom)
    }
}

/// What a receiver did with an obligation.
///
/// On the wire: `"applied"`, `"deferred"`, or `{"declined": "<reason>"}`, so a decline can
/// never lack its reason.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum AckStatus {
    /// Applied now, or recognized as applied before. Discharges custody.
    Applied,
    /// Refused accountably. Discharges custody; never retried.
    Declined(DeclineReason),
    /// Received, not yet applied. Custody stays; nothing is extended.
    Deferred,
}

/// Why a receiver declined.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum DeclineReason {
    /// Past its deadline on arrival.
    Expired,
    /// Its sequence is not newer than the last applied on its governed key.
    Superseded,
    /// The receiver refuses it (for example: not addressed to it).
    Refused,
    /// Its payload cannot be read.
    Malformed,
    /// Its kind is unknown to the receiver.
    UnknownKind,
    /// Its id is one the receiver has applied, but the content differs: never acked
    /// `applied` (that would discharge an obligation nobody applied).
    IdConflict,
    /// The receiver holds as many governed records for the obligation's issuer as it keeps
    /// for one issuer, and this obligation would add one (a limit per issuer, so no member
    /// exhausts what another's obligations need).
    OverLimit,
    /// The agent's own policy declines it; the ack's `detail` says why in its words.
    Policy,
}

impl DeclineReason {
    /// The wire word.
    pub const fn as_str(self) -> &'static str {
        match self {
            DeclineReason::Expired => "expired",
            DeclineReason::Superseded => "superseded",
            DeclineReason::Refused => "refused",
            DeclineReason::Malformed => "malformed",
            DeclineReason::UnknownKind => "unknown_kind",
            DeclineReason::IdConflict => "id_conflict",
            DeclineReason::OverLimit => "over_limit",
            DeclineReason::Policy => "policy",
        }
    }
}
