//! Principal-side outcomes: safe actions, escalations, terminal records.

use serde::{Deserialize, Serialize};

use crate::ack::DeclineReason;
use crate::ids::{AgentId, ObligationId, Scope, TokenId, UnixMillis, WeightKey};
use crate::obligation::Kind;

/// A principal-side action that needs no remote cooperation. Applying one twice equals
/// applying it once: each is a set-to-safe or an adjustment keyed by the obligation id.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case", deny_unknown_fields)]
pub enum SafeAction {
    /// Stop permitting `target` to exercise `scope` (fail-closed). A decision with a newer
    /// sequence on the same scope is not overridden.
    WithholdScope {
        /// The agent whose authority is withheld.
        target: AgentId,
        /// The scope.
        scope: Scope,
        /// The sequence of the decision this withhold comes from.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        sequence: Option<u64>,
    },
    /// Down-weight principal-side routing to `target` on `weight_key` by `amount` millionths,
    /// keyed by the obligation so it lands once.
    DownWeight {
        /// The obligation this adjustment belongs to.
        obligation_id: ObligationId,
        /// The agent routed to less.
        target: AgentId,
        /// The routing weight.
        weight_key: WeightKey,
        /// By how much, in millionths (positive).
        amount: u32,
        /// When an adjustment that never lapses may be folded into the base weight
        /// (deadline + retention).
        fold_after: UnixMillis,
        /// When the belief update's `ttl_ms` runs out (`created_at + ttl_ms`): from then on
        /// the down-weight no longer applies, and its record goes. `None` in a record written
        /// before updates lapsed: such an adjustment folds into the base at `fold_after`.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        lapses_at: Option<UnixMillis>,
    },
    /// The principal's authorization service stops honouring the token.
    StopHonouringToken {
        /// The token.
        token_id: TokenId,
        /// When the token itself expires, if known: from then on the action holds without
        /// a record (no service honours an expired token), and the record is forgotten.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        expires_at: Option<UnixMillis>,
    },
}

/// Why custody ended in the fail-safe.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum EscalationCause {
    /// The absolute deadline passed.
    Deadline,
    /// The attempt budget ran out first.
    RetriesExhausted,
}

/// The last thing the custodian observed from the target before escalating.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum LastObserved {
    /// No ack of any kind.
    NoAck,
    /// A `deferred` ack.
    Deferred,
}

/// A principal-visible, durable record that custody ended in the fail-safe.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Escalation {
    /// The obligation.
    pub obligation_id: ObligationId,
    /// Its kind.
    pub kind: Kind,
    /// Its target.
    pub target: AgentId,
    /// Attempts made.
    pub attempts: u32,
    /// Deadline or retry budget.
    pub cause: EscalationCause,
    /// What was last seen from the target.
    pub last_observed: LastObserved,
    /// The safe action applied.
    pub safe_action: SafeAction,
    /// When.
    pub at: UnixMillis,
}

/// How custody of one obligation ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Outcome {
    /// The target applied it.
    Applied,
    /// The target declined it; the safe action was applied.
    Declined(DeclineReason),
    /// The fail-safe ran.
    Escalated(EscalationCause),
    /// Inadmissible: sent once, not under custody.
    BestEffort,
}

/// The durable record of a terminal outcome, kept for audit.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TerminalRecord {
    /// The obligation.
    pub obligation_id: ObligationId,
    /// Its kind.
    pub kind: Kind,
    /// Its target.
    pub target: AgentId,
    /// How it ended.
    pub outcome: Outcome,
    /// Attempts made (zero for best-effort: it was not under custody).
    pub attempts: u32,
    /// When.
    pub at: UnixMillis,
    /// A decline's reason in the agent's own words, as its ack gave it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub detail: Option<crate::Detail>,
}

/// A late `applied` ack noted against an escalation; the safe action stays.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ReconciliationNote {
    /// The escalated obligation.
    pub obligation_id: ObligationId,
    /// The target that acked.
    pub target: AgentId,
    /// The ack's own time.
    pub acked_at: UnixMillis,
    /// When the custodian received it.
    pub noted_at: UnixMillis,
}
