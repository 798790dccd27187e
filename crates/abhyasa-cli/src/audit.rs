//! `abhyasa check --state NAME=DIR …`: an audit of stopped nodes from their redb files alone.
//!
//! It reads rows (pending and terminal records, escalations, principal state, each
//! receiver's apply log) and checks them with its own bookkeeping — never by asking the
//! custodian or the receiver what they think:
//!
//! - **C1** no obligation is both pending and terminal at its principal;
//! - **C2** every escalation has a terminal record that says escalated or declined;
//! - **C3** every escalation's safe action is in force in the principal's state (a withheld
//!   scope, unless a newer decision on it superseded the withhold; a down-weight still held,
//!   unless its fold time has passed and it was folded into the base; a revoked token);
//! - **C4** no receiver applied an id twice (its apply log has one row per apply);
//! - **C5** across nodes: an obligation a receiver applied was issued by a principal that
//!   knows it (pending or terminal), and that principal did not record it as declined;
//! - **C6** across nodes: an obligation a principal recorded as applied is in its target's
//!   apply log (when the target's state is given; a row pruned after its deadline is
//!   counted as unverifiable, not as a violation);
//! - **C7** (when the issued set is known, as in the demo) every admissible obligation issued
//!   is pending or terminal: none lost.

use std::collections::{BTreeMap, BTreeSet};

use abhyasa_custody::kinds;
use abhyasa_store::{AppliedEntry, Store, StoreError};
use abhyasa_wire::{
    AgentId, Obligation, ObligationId, Outcome, SafeAction, TerminalRecord, UnixMillis,
};

/// One node's durable state, read once.
pub struct NodeRows {
    /// The node's agent id.
    pub agent: AgentId,
    pending: BTreeSet<ObligationId>,
    terminal: BTreeMap<ObligationId, TerminalRecord>,
    escalations: Vec<abhyasa_wire::Escalation>,
    principal: abhyasa_custody::PrincipalState,
    apply_log: Vec<AppliedEntry>,
}

impl NodeRows {
    /// Reads what the audit needs from `store`.
    pub fn read(agent: AgentId, store: &Store) -> Result<Self, StoreError> {
        Ok(Self {
            agent,
            pending: store
                .pending()?
                .into_iter()
                .map(|p| p.obligation.id)
                .collect(),
            terminal: store
                .terminal_records()?
                .into_iter()
                .map(|t| (t.obligation_id, t))
                .collect(),
            escalations: store.escalations()?,
            principal: store.principal().clone(),
            apply_log: store.apply_log()?,
        })
    }

    /// The receiver's apply log, oldest first.
    pub fn apply_log(&self) -> &[AppliedEntry] {
        &self.apply_log
    }

    /// The principal's terminal record of `id`.
    pub fn terminal(&self, id: ObligationId) -> Option<&TerminalRecord> {
        self.terminal.get(&id)
    }

    /// How many terminal records the principal holds.
    pub fn terminal_count(&self) -> usize {
        self.terminal.len()
    }

    /// Whether the principal holds `id` pending.
    pub fn is_pending(&self, id: ObligationId) -> bool {
        self.pending.contains(&id)
    }
}

/// What the audit found.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct AuditReport {
    /// Nodes read.
    pub nodes: usize,
    /// Obligations pending at their principals.
    pub pending: u64,
    /// Terminal records by outcome.
    pub applied: u64,
    /// Declined.
    pub declined: u64,
    /// Escalated.
    pub escalated: u64,
    /// Sent best-effort.
    pub best_effort: u64,
    /// Applies in receivers' logs.
    pub applies: u64,
    /// Ids applied more than once (C4).
    pub double_applied: u64,
    /// Issued admissible obligations neither pending nor terminal (C7).
    pub lost: u64,
    /// Applied records whose apply row was pruned (C6 cannot say).
    pub unverifiable: u64,
    /// Every violation, named by its check.
    pub violations: Vec<String>,
}

impl AuditReport {
    /// One line.
    pub fn summary(&self) -> String {
        format!(
            "nodes={} pending={} applied={} declined={} escalated={} best_effort={} applies={} unverifiable={} lost={} double_applied={} violations={}",
            self.nodes,
            self.pending,
            self.applied,
            self.declined,
            self.escalated,
            self.best_effort,
            self.applies,
            self.unverifiable,
            self.lost,
            self.double_applied,
            self.violations.len()
        )
    }
}

/// Whether `action` is in force in `p`, read from its rows (C3).
fn in_force(p: &abhyasa_custody::PrincipalState, action: &SafeAction, now: UnixMillis) -> bool {
    match action {
        SafeAction::WithholdScope {
            target,
            scope,
            sequence,
        } => match p.authorization(target, scope) {
            Some(a) if a.withheld => true,
            // A newer decision on the scope superseded the withhold.
            Some(a) => matches!((a.sequence, sequence), (Some(now_seq), Some(s)) if now_seq > *s),
            None => false,
        },
        SafeAction::DownWeight {
            obligation_id,
            fold_after,
            ..
        } => p.adjustments().any(|(id, _)| id == *obligation_id) || *fold_after <= now,
        // Past the token's own expiry no service honours it: the record may be forgotten.
        SafeAction::StopHonouringToken {
            token_id,
            expires_at,
        } => p.is_revoked(token_id) || expires_at.is_some_and(|at| at <= now),
    }
}

/// Audits `nodes` (each node's rows); `issued`, when known, is every obligation issued.
pub fn audit(nodes: &[NodeRows], issued: Option<&[Obligation]>, now: UnixMillis) -> AuditReport {
    let mut r = AuditReport {
        nodes: nodes.len(),
        ..AuditReport::default()
    };
    let by_agent: BTreeMap<&AgentId, &NodeRows> = nodes.iter().map(|n| (&n.agent, n)).collect();
    for n in nodes {
        let me = &n.agent;
        r.pending += n.pending.len() as u64;
        for t in n.terminal.values() {
            match t.outcome {
                Outcome::Applied => r.applied += 1,
                Outcome::Declined(_) => r.declined += 1,
                Outcome::Escalated(_) => r.escalated += 1,
                Outcome::BestEffort => r.best_effort += 1,
            }
            if n.pending.contains(&t.obligation_id) {
                r.violations.push(format!(
                    "C1 {me}: {} is both pending and terminal",
                    t.obligation_id
                ));
            }
        }
        for e in &n.escalations {
            match n.terminal.get(&e.obligation_id).map(|t| t.outcome) {
                Some(Outcome::Escalated(_) | Outcome::Declined(_)) => {}
                other => r.violations.push(format!(
                    "C2 {me}: escalation of {} but its terminal record says {other:?}",
                    e.obligation_id
                )),
            }
            if !in_force(&n.principal, &e.safe_action, now) {
                r.violations.push(format!(
                    "C3 {me}: the safe action of {} is not in force: {}",
                    e.obligation_id,
                    abhyasa_wire::words::safe_action(&e.safe_action)
                ));
            }
        }
        let mut seen: BTreeMap<ObligationId, u32> = BTreeMap::new();
        for a in &n.apply_log {
            r.applies += 1;
            let count = seen.entry(a.obligation.id).or_insert(0);
            *count += 1;
            if *count == 2 || (a.earlier > 0 && *count == 1) {
                r.double_applied += 1;
                r.violations.push(format!(
                    "C4 {me}: {} ({}) applied more than once",
                    a.obligation.id,
                    abhyasa_wire::words::obligation(&a.obligation)
                ));
            }
            if let Some(p) = by_agent.get(&a.obligation.issuer) {
                let id = a.obligation.id;
                match p.terminal.get(&id).map(|t| t.outcome) {
                    Some(Outcome::Declined(reason)) => r.violations.push(format!(
                        "C5 {me}: applied {id}, which {} recorded as declined ({})",
                        p.agent,
                        reason.as_str()
                    )),
                    Some(_) => {}
                    None if p.pending.contains(&id) => {}
                    None => r.violations.push(format!(
                        "C5 {me}: applied {id}, which its principal {} does not know",
                        p.agent
                    )),
                }
            }
        }
    }
    // C6: what principals recorded as applied is in the target's log.
    for n in nodes {
        for t in n.terminal.values() {
            if t.outcome != Outcome::Applied {
                continue;
            }
            let Some(target) = by_agent.get(&t.target) else {
                continue;
            };
            let logged = target
                .apply_log
                .iter()
                .any(|a| a.obligation.id == t.obligation_id);
            if !logged {
                r.unverifiable += 1;
            }
        }
    }
    // C7: nothing issued is lost.
    if let Some(issued) = issued {
        for o in issued {
            let Some(p) = by_agent.get(&o.issuer) else {
                continue;
            };
            let known = p.pending.contains(&o.id) || p.terminal.contains_key(&o.id);
            if !known && kinds::admissible(o) {
                r.lost += 1;
                r.violations.push(format!(
                    "C7 {}: {} ({}) issued but neither pending nor terminal",
                    p.agent,
                    o.id,
                    abhyasa_wire::words::obligation(o)
                ));
            }
        }
    }
    r
}

#[cfg(test)]
mod tests {
    use super::*;
    use abhyasa_custody::{PrincipalState, WeightBounds};
    use abhyasa_wire::TokenId;

    fn stop(expires_at: Option<u64>) -> SafeAction {
        SafeAction::StopHonouringToken {
            token_id: TokenId::new("tok").unwrap(),
            expires_at: expires_at.map(UnixMillis),
        }
    }

    #[test]
    fn a_token_stop_is_in_force_with_its_record_or_once_the_token_expired() {
        let none = PrincipalState::new(WeightBounds::default());
        // No record: in force only from the token's own expiry on, never without one.
        assert!(!in_force(&none, &stop(Some(10)), UnixMillis(9)));
        assert!(in_force(&none, &stop(Some(10)), UnixMillis(10)));
        assert!(!in_force(&none, &stop(None), UnixMillis(u64::MAX)));
        // With the record: in force at any time.
        let mut held = none.clone();
        held.apply_safe(&stop(Some(10)));
        assert!(in_force(&held, &stop(Some(10)), UnixMillis(0)));
    }
}
