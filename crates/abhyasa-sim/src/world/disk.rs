//! The simulated disks: commits (with a crash after one), what each record writes, and a
//! node's crash, boot and restart from what it wrote.

use super::*;

impl World {
    pub(super) fn commit(&mut self, node: usize, crash_after: bool) {
        let commits = std::mem::take(&mut self.nodes[node].queue);
        self.nodes[node].commit_scheduled = false;
        let mut tokens = Vec::with_capacity(commits.len());
        for c in commits {
            for record in c.records {
                match record {
                    Record::Custodian(r) if self.is_principal(node) => {
                        self.apply_custodian(node, r)
                    }
                    Record::Receiver(r) if !self.is_principal(node) => self.apply_receiver(node, r),
                    other => self.violation(format!(
                        "{} wrote a record of a role it never had: {other:?}",
                        self.nodes[node].agent
                    )),
                }
            }
            tokens.push(c.token);
        }
        if crash_after {
            // Power lost right after the commit returned, before anything was released.
            self.crash(node);
            let at = self.now + self.scenario.commit_crash_downtime;
            self.push(at, Event::Restart(node));
            return;
        }
        let now = self.time(node);
        match &mut self.nodes[node].machine {
            Some(m) => tokens.into_iter().for_each(|t| m.handle_committed(now, t)),
            None => return,
        }
        self.flush(node);
        if self.is_principal(node) && self.nodes[node].queue.is_empty() {
            self.check_principal_memory(node);
        }
    }

    /// With nothing left to write, the custodian's principal state in memory is what its disk
    /// holds: a decision is never in memory alone (a refused issue changes nothing).
    pub(super) fn check_principal_memory(&mut self, p: usize) {
        let Some(c) = self.nodes[p].machine.as_ref().map(|m| m.custodian()) else {
            return;
        };
        let disk = self.cdisks[p]
            .principal
            .clone()
            .unwrap_or_else(|| PrincipalState::new(self.scenario.custodian.weight_bounds));
        if c.principal() != &disk {
            self.violation(format!(
                "principal state in memory differs from disk at {} with nothing left to write",
                self.now
            ));
        }
    }

    pub(super) fn index_of(&self, id: ObligationId) -> Option<usize> {
        self.scenario.obligations.iter().position(|o| o.id == id)
    }

    pub(super) fn apply_custodian(&mut self, p: usize, record: CustodianRecord) {
        let principal = self.cdisks[p]
            .principal
            .get_or_insert_with(|| PrincipalState::new(self.scenario.custodian.weight_bounds));
        match record {
            CustodianRecord::Pending {
                obligation,
                attempts,
                principal: update,
            } => {
                if let Some(u) = &update {
                    principal.apply(u, obligation.id);
                }
                self.principal_oracles[p].issued(&obligation);
                self.ever_pending.insert(obligation.id);
                self.cdisks[p].pending.insert(
                    obligation.id,
                    PendingRecord {
                        obligation,
                        attempts,
                        last_observed: LastObserved::NoAck,
                    },
                );
            }
            CustodianRecord::Attempt {
                id,
                attempts,
                last_observed,
            } => {
                if let Some(r) = self.cdisks[p].pending.get_mut(&id) {
                    r.attempts = attempts;
                    r.last_observed = last_observed;
                }
            }
            CustodianRecord::Terminal {
                record,
                escalation,
                principal: update,
            } => {
                if let Some(u) = &update {
                    principal.apply(u, record.obligation_id);
                }
                let id = record.obligation_id;
                if let Some(o) = self.all.get(&id) {
                    match record.outcome {
                        Outcome::BestEffort => self.principal_oracles[p].issued(o),
                        Outcome::Declined(_) | Outcome::Escalated(_) => {
                            self.principal_oracles[p].unconfirmed(o)
                        }
                        Outcome::Applied => self.principal_oracles[p].applied(o),
                    }
                }
                self.cdisks[p].pending.remove(&id);
                if let Some(e) = escalation {
                    self.cdisks[p].escalations.insert(id, e);
                }
                if let Some(prev) = self.cdisks[p].terminal.insert(id, record) {
                    self.violation(format!("{id} terminated twice (first {:?})", prev.outcome));
                }
            }
            CustodianRecord::Reconciliation(note) => {
                let n = self.cdisks[p].notes.entry(note.obligation_id).or_insert(0);
                *n += 1;
                let n = *n;
                if n > 1 {
                    let id = note.obligation_id;
                    self.violation(format!("late applied of {id} noted {n} times"));
                }
            }
        }
    }

    pub(super) fn apply_receiver(&mut self, node: usize, record: ReceiverRecord) {
        let disk = &mut self.rdisks[node - self.principals];
        match record {
            ReceiverRecord::Apply {
                id,
                obligation,
                expires,
                sequence,
                effect,
                ..
            } => {
                if !self.all.contains_key(&id) {
                    self.report.violations.push(format!(
                        "{} applied {id}, an id nobody issued (a binding mapped a text id to \
                         another obligation's)",
                        self.nodes[node].agent
                    ));
                }
                disk.applied.insert(
                    id,
                    (expires, obligation.digest(), obligation.issuer.clone()),
                );
                if let Some((key, seq)) = sequence {
                    disk.last_sequence.insert(key, seq);
                }
                disk.governed
                    .insert(effect.governed_key(&obligation.issuer));
                disk.state.apply(&effect);
                disk.apply_log.push(id);
                let count = disk.apply_count.entry(id).or_insert(0);
                *count += 1;
                if *count > 1 {
                    self.report.double_applied += 1;
                    let what = format!("{id} applied {count} times at {}", self.nodes[node].agent);
                    self.violation(what);
                }
            }
            ReceiverRecord::Prune { before } => disk.applied.retain(|_, (e, _, _)| *e >= before),
        }
    }

    pub(super) fn crash(&mut self, node: usize) {
        let n = &mut self.nodes[node];
        if n.machine.is_none() {
            return;
        }
        n.machine = None;
        n.queue.clear();
        n.commit_scheduled = false;
        n.incarnation += 1;
        self.report.crashes += 1;
        if self.is_principal(node) {
            // Obligations not yet accepted were never under custody: the application, which
            // saw no acceptance, issues them again.
            let me = self.nodes[node].agent.clone();
            let unaccepted: Vec<ObligationId> = self
                .issued
                .values()
                .filter(|o| o.issuer == me)
                .filter(|o| oracle::admissible(o) && !self.accepted.contains(&o.id))
                .map(|o| o.id)
                .collect();
            for id in unaccepted {
                self.issued.remove(&id);
                if let Some(i) = self.index.remove(&id) {
                    let at = self.now + 1;
                    self.push(at, Event::Issue(i));
                }
            }
        }
    }

    pub(super) fn boot(&mut self, node: usize) {
        let now = self.time(node);
        let seed = self.rng.random::<u64>();
        let agent = self.nodes[node].agent.clone();
        let (cc, rc) = (
            self.scenario.custodian.clone(),
            self.scenario.receiver.clone(),
        );
        let (custodian, receiver) = if self.is_principal(node) {
            let cdisk = &self.cdisks[node];
            let principal = cdisk
                .principal
                .clone()
                .unwrap_or_else(|| PrincipalState::new(self.scenario.custodian.weight_bounds));
            let escalated = cdisk.escalations.values().map(|e| EscalatedRecord {
                id: e.obligation_id,
                target: e.target.clone(),
                reconciled: cdisk.notes.contains_key(&e.obligation_id),
            });
            let c = Custodian::recover(
                agent.clone(),
                cc,
                seed,
                principal,
                cdisk.pending.values().cloned().collect::<Vec<_>>(),
                escalated.collect::<Vec<_>>(),
                now,
            );
            (c, Receiver::new(agent.clone(), rc))
        } else {
            let disk = self.rdisk(node);
            let r = Receiver::recover(
                agent.clone(),
                rc,
                disk.applied
                    .iter()
                    .map(|(&id, (expires, digest, issuer))| AppliedRecord {
                        id,
                        expires: *expires,
                        digest: Some(*digest),
                        issuer: Some(issuer.clone()),
                    }),
                disk.last_sequence.clone(),
                disk.governed.iter().cloned(),
                disk.state.clone(),
            );
            (Custodian::new(agent.clone(), cc, seed), r)
        };
        let config = MachineConfig {
            // Maintenance folds the store at the same time; the simulated disks do not fold.
            maintenance_ms: u64::MAX / 4,
            mutation: self.scenario.node.mutation,
            ..MachineConfig::default()
        };
        let mut m = NodeMachine::new(now, config, custodian, receiver, None);
        // Every link is a session (the network decides what gets through); text targets are
        // reached over their binding.
        for (i, other) in self.nodes.iter().enumerate() {
            if i == node || self.is_principal(i) == self.is_principal(node) {
                continue;
            }
            m.session_up(&other.agent);
            if self.is_principal(node) && self.scenario.node.text_targets.contains(&i) {
                m.attach(now, &other.agent);
            }
        }
        self.nodes[node].machine = Some(Box::new(m));
    }

    pub(super) fn restart(&mut self, node: usize) {
        if self.is_principal(node) {
            let now = self.time(node);
            self.custodian_restarts.insert((node, now));
        }
        self.boot(node);
        // Recovery work (escalating what is overdue, resuming attempts) happens at once.
        self.fire_timer(node);
        // The sessions of the node that came back are set up again.
        let at = self.now;
        self.ready_after(node, at);
    }
}
