//! The oracles at the end of a run: every admissible obligation ended applied, declined or
//! escalated, nothing applied twice, and each receiver's state agrees with its replay.

use super::*;

impl World {
    pub(super) fn violation(&mut self, what: String) {
        self.report.violations.push(what);
    }

    pub(super) fn check_end(&mut self) {
        let bounds = self.scenario.custodian.weight_bounds;
        // The retention of keyed down-weights, from the custodian's configured skew (SPEC:
        // distinguishable until deadline + twice the skew).
        let retention = self.scenario.custodian.max_clock_skew_ms * 2;
        for (id, o) in &self.issued.clone() {
            let admissible = oracle::admissible(o);
            let p = self.issuer_of(o);
            let terminal = self.cdisks[p].terminal.get(id).cloned();
            if !admissible {
                if self.ever_pending.contains(id) {
                    self.violation(format!("inadmissible {id} was taken under custody"));
                }
                match terminal.map(|t| t.outcome) {
                    Some(Outcome::BestEffort) | None => self.report.best_effort += 1,
                    Some(other) => self.violation(format!("inadmissible {id} ended {other:?}")),
                }
                continue;
            }
            let Some(terminal) = terminal else {
                self.report.lost += 1;
                self.violation(format!(
                    "admissible {id} ({}) not terminal after its deadline: silently lost",
                    o.kind()
                ));
                continue;
            };
            let target = self.nodes.iter().position(|n| n.agent == o.target);
            let applied_there = target
                .filter(|&t| !self.is_principal(t))
                .is_some_and(|t| self.rdisk(t).apply_count.contains_key(id));
            match &terminal.outcome {
                Outcome::Applied => {
                    self.report.applied += 1;
                    if !applied_there {
                        self.violation(format!(
                            "{id} discharged as applied but never applied by its target"
                        ));
                    }
                }
                Outcome::Declined(reason) => {
                    self.report.declined += 1;
                    if applied_there {
                        self.violation(format!("{id} ended declined but its target applied it"));
                    }
                    let sent = self
                        .declined_by_target
                        .get(id)
                        .is_some_and(|r| r.contains(reason));
                    if !sent {
                        self.violation(format!(
                            "{id} ended declined ({reason:?}) but its target never declined it so"
                        ));
                    }
                }
                Outcome::Escalated(_) => {
                    self.report.escalated += 1;
                    let expected = oracle::expected_safe(o, retention);
                    match self.cdisks[p].escalations.get(id) {
                        Some(e) if Some(&e.safe_action) == expected.as_ref() => {}
                        Some(e) => self.violation(format!(
                            "escalated {id} with safe action {:?}, expected {expected:?}",
                            e.safe_action
                        )),
                        None => {
                            self.violation(format!("escalated {id} without an escalation record"))
                        }
                    }
                    let at = terminal.at;
                    let deadline = o.deadline;
                    // On time, or as the first act of a recovery that found it overdue.
                    if at > deadline && !self.custodian_restarts.contains(&(p, at)) {
                        self.violation(format!(
                            "{id} escalated at {at}, after its deadline {deadline} with the custodian up"
                        ));
                    }
                }
                Outcome::BestEffort => self.violation(format!("admissible {id} ended best-effort")),
            }
            // AB-2: at most the first attempt and `max_retries` retries ever left.
            let sent = self.transmissions.get(id).copied().unwrap_or(0);
            if sent > o.max_retries + 1 {
                self.violation(format!(
                    "{id} transmitted {sent} times with max_retries {}",
                    o.max_retries
                ));
            }
        }
        for p in 0..self.principals {
            // Each principal's state is exactly what the decisions it saw make it.
            let principal = self.cdisks[p]
                .principal
                .clone()
                .unwrap_or_else(|| PrincipalState::new(bounds));
            let agent = self.nodes[p].agent.clone();
            let now = self.time(p);
            for d in self.principal_oracles[p].differences(&principal, bounds, now) {
                self.violation(format!("{agent}: {d}"));
            }
            if let Some(m) = &self.nodes[p].machine {
                if m.custodian().principal() != &principal {
                    self.violation(format!(
                        "{agent}: principal state in memory differs from disk at the end"
                    ));
                }
            }
            if !self.cdisks[p].pending.is_empty() {
                let n = self.cdisks[p].pending.len();
                self.violation(format!("{agent}: {n} obligations still pending at the end"));
            }
        }
        self.check_receivers();
    }

    /// Each receiver's state is what its applies (in commit order) make it; sequences on a
    /// governed key only rise (AB-3); a sequenced revocation stays withheld unless a newer
    /// grant was applied after it.
    pub(super) fn check_receivers(&mut self) {
        let (min, max) = (
            self.scenario.receiver.weight_min,
            self.scenario.receiver.weight_max,
        );
        let mut found = Vec::new();
        for (i, disk) in self.rdisks.iter().enumerate() {
            let agent = &self.nodes[i + self.principals].agent;
            let mut expected = ReceiverOracle::new(min, max);
            let mut last: BTreeMap<oracle::Governed, u64> = BTreeMap::new();
            let log: Vec<&Obligation> = disk
                .apply_log
                .iter()
                .filter_map(|id| self.all.get(id))
                .collect();
            for (k, o) in log.iter().enumerate() {
                expected.apply(o);
                if let Some(seq) = o.sequence {
                    let key = oracle::governed(o);
                    if let Some(&prev) = last.get(&key) {
                        if seq <= prev {
                            found.push(format!(
                                "{agent} applied {} with sequence {seq} after sequence {prev} on {key:?}",
                                o.id
                            ));
                        }
                    }
                    last.insert(key, seq);
                }
                let Payload::AnumatiConsent(p) = &o.payload else {
                    continue;
                };
                let (Some(seq), true) = (o.sequence, oracle::restrictive(o)) else {
                    continue;
                };
                let lifted = log[k + 1..].iter().any(|later| {
                    matches!(&later.payload, Payload::AnumatiConsent(q) if q.scope == p.scope)
                        && later.issuer == o.issuer
                        && !oracle::restrictive(later)
                        && later.sequence.is_none_or(|s| s > seq)
                });
                if !lifted && !disk.state.is_withheld(&o.issuer, &p.scope) {
                    found.push(format!(
                        "{agent} applied revocation {} (sequence {seq}) of {} but does not withhold it",
                        o.id, p.scope
                    ));
                }
            }
            let now = self.time(i + self.principals);
            found.extend(expected.differences(agent, &disk.state, now));
        }
        for f in found {
            self.violation(f);
        }
    }
}
