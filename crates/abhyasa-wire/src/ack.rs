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
        }
    }
}
