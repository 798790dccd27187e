//! The operator's outbox: what an operator must hear of — an escalation, a decline, a lease
//! that ended, budget held in quarantine or forfeited — written in the commit that makes it
//! true, so a crash can lose none (docs/OPERATOR.md).
//!
//! Each event has a key fixed by what it is about (an escalation's key is its obligation's,
//! a lease's the grant and the moment it ended), so an event written twice — after a crash
//! that lost only the delivery, or a refusal that came again — is written once, and a sink
//! that sees one twice knows it by the key. Rows leave the outbox only when the node's sinks
//! took them ([`crate::Op::EventsDelivered`]).

use abhyasa_ledger::{CreditId, OpKey, Refusal, Vector};
use abhyasa_wire::{AgentId, Escalation, SafeAction, Scope, TerminalRecord, UnixMillis};
use serde::{Deserialize, Serialize};
use sha2::{Digest as _, Sha256};

/// Which side of a grant a lease ended on.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum LeaseSide {
    /// This node granted the scope (as principal): it no longer permits it.
    Principal,
    /// This node held the scope (as agent): it no longer exercises it.
    Agent,
}

impl LeaseSide {
    /// `principal` or `agent`.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Principal => "principal",
            Self::Agent => "agent",
        }
    }
}

/// Something an operator must hear of.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum OperatorEvent {
    /// Custody ended without the target's `applied`: the fail-safe ran (its safe action is
    /// in the escalation).
    Escalated(Escalation),
    /// The target declined; the principal's safe action (if the kind has one) was applied.
    Declined {
        /// The terminal record (the decline's reason, and the agent's own words if any).
        record: TerminalRecord,
        /// The safe action applied on this side.
        safe_action: Option<SafeAction>,
    },
    /// A lease ran out without a renewal.
    LeaseEnded {
        /// Which side.
        side: LeaseSide,
        /// The agent the grant was to (principal side) or from (agent side).
        agent: AgentId,
        /// The scope.
        scope: Scope,
        /// When it ended.
        ended_at: UnixMillis,
    },
    /// A gateway refused a dispatched permit: the operation's atoms stay quarantined (charged)
    /// until a fenced no-effect proof or a forfeit.
    BudgetQuarantined {
        /// The operation.
        key: OpKey,
        /// The gateway.
        gateway: AgentId,
        /// The paying credit.
        credit: CreditId,
        /// What stays charged.
        max_charge: Vector,
        /// Why the gateway refused.
        refusal: Refusal,
    },
    /// An operation was forfeited: its atoms stay charged for good.
    BudgetForfeited {
        /// The operation.
        key: OpKey,
        /// The gateway.
        gateway: AgentId,
        /// The paying credit.
        credit: CreditId,
        /// What stays charged.
        max_charge: Vector,
    },
}

impl OperatorEvent {
    /// The event's type, as sinks name it: `obligation.escalated`, `obligation.declined`,
    /// `lease.ended`, `budget.quarantined`, `budget.forfeited`.
    pub fn kind(&self) -> &'static str {
        match self {
            Self::Escalated(_) => "obligation.escalated",
            Self::Declined { .. } => "obligation.declined",
            Self::LeaseEnded { .. } => "lease.ended",
            Self::BudgetQuarantined { .. } => "budget.quarantined",
            Self::BudgetForfeited { .. } => "budget.forfeited",
        }
    }

    /// The idempotency key: fixed by what the event is about, so the same event always has
    /// the same key (`escalated-<obligation>`, `declined-<obligation>`,
    /// `lease-ended-<digest of side, agent, scope and end>`, `quarantined-<operation>`,
    /// `forfeited-<operation>`). Visible ASCII, at most 48 bytes.
    pub fn key(&self) -> String {
        match self {
            Self::Escalated(e) => format!("escalated-{}", e.obligation_id),
            Self::Declined { record, .. } => format!("declined-{}", record.obligation_id),
            Self::LeaseEnded {
                side,
                agent,
                scope,
                ended_at,
            } => {
                let mut h = Sha256::new();
                for part in [side.as_str(), agent.as_str(), scope.as_str()] {
                    h.update((part.len() as u64).to_be_bytes());
                    h.update(part.as_bytes());
                }
                h.update(ended_at.0.to_be_bytes());
                let digest = h.finalize();
                let hex: String = digest[..16].iter().map(|b| format!("{b:02x}")).collect();
                format!("lease-ended-{hex}")
            }
            Self::BudgetQuarantined { key, .. } => format!("quarantined-{key}"),
            Self::BudgetForfeited { key, .. } => format!("forfeited-{key}"),
        }
    }
}

/// One row of the outbox.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct OutboxEntry {
    /// Its place in the outbox: increasing, never reused.
    pub seq: u64,
    /// The idempotency key ([`OperatorEvent::key`]).
    pub key: String,
    /// When it was recorded (the node's clock).
    pub at: UnixMillis,
    /// The event.
    pub event: OperatorEvent,
}

/// The stored form of an outbox row (the key and sequence are the table's).
#[derive(Serialize, Deserialize)]
pub(crate) struct OutboxRow {
    pub(crate) key: String,
    pub(crate) at: UnixMillis,
    pub(crate) event: OperatorEvent,
}

/// The events a terminal record makes: an escalation, or a decline with the safe action
/// applied with it.
pub(crate) fn of_terminal(
    record: &TerminalRecord,
    escalation: Option<&Escalation>,
    principal: Option<&abhyasa_custody::PrincipalUpdate>,
) -> Option<OperatorEvent> {
    match (record.outcome, escalation) {
        (_, Some(e)) => Some(OperatorEvent::Escalated(e.clone())),
        (abhyasa_wire::Outcome::Declined(_), None) => Some(OperatorEvent::Declined {
            record: record.clone(),
            safe_action: match principal {
                Some(abhyasa_custody::PrincipalUpdate::Safe(a)) => Some(a.clone()),
                _ => None,
            },
        }),
        _ => None,
    }
}
