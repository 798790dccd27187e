//! What the simulated agents do: split, transfer, reserve, dispatch, settle, reclaim, fence,
//! join — each chosen by the seed.

use super::*;

impl Sim {
    /// One random action by a live branch.
    pub(super) fn act(&mut self, name: &'static str) {
        let now = self.now;
        let Some(b) = self.branches.get(name).and_then(|n| n.machine.as_ref()) else {
            return;
        };
        let live: Vec<(CreditId, Vector, Label)> = b
            .credits()
            .filter(|c| !c.closed && !c.fenced && !c.available.is_empty())
            .map(|c| (c.id, c.available.size(), c.label.clone()))
            .collect();
        // Where each credit came from (the source of the transfer that created it).
        let came_from: BTreeMap<CreditId, AgentId> = b
            .incoming()
            .filter_map(|s| match s {
                Step::Accept { cert, credit, .. } => Some((*credit, cert.peek().ok()?.source)),
                _ => None,
            })
            .collect();
        let (reserved, stuck) = open_ops(b);
        let roll: f64 = self.rng.random();
        if let Some(&key) = reserved.first() {
            // Finish what was reserved: dispatch it, or release it unsent.
            if self.rng.random_bool(0.85) {
                self.with_branch(name, |b, _| b.dispatch(UnixMillis(now), key));
                self.quarantined_since.entry(key).or_insert(now);
            } else {
                self.with_branch(name, |b, _| b.release_unsent(key));
            }
            return;
        }
        for (key, credit) in stuck {
            if self.rng.random_bool(self.p.misuse) {
                // An application mistake: the ledger must refuse it.
                self.with_branch(name, |b, _| b.release_unsent(key));
                return;
            }
            let since = *self.quarantined_since.entry(key).or_insert(now);
            if now >= since + self.p.forfeit_after && self.rng.random_bool(0.3) {
                self.with_branch(name, |b, _| b.forfeit(key));
                return;
            }
            if now >= since + self.p.reclaim_after && self.rng.random_bool(0.3) {
                self.with_branch(name, |b, _| b.request_fence(credit));
                return;
            }
        }
        // A reclaimable transfer still in transit (its child silent, slow, or cut off): now
        // and then the source takes it back, racing the child's claim.
        let in_transit: Vec<TransferId> = b
            .outgoing()
            .filter(|o| o.body.confirm && o.state == OutgoingState::Sealed)
            .map(|o| o.body.transfer)
            .collect();
        if !in_transit.is_empty() && self.rng.random_bool(self.p.reclaim_transfer) {
            let t = in_transit[self.rng.random_range(0..in_transit.len())];
            self.with_branch(name, |b, _| b.reclaim_transfer(t));
            return;
        }
        // Now and then a reclaim of a transfer that cannot be taken back (confirmed, or not
        // reclaimable): the ledger must refuse it.
        if self.rng.random_bool(self.p.misuse) {
            let decided = b
                .outgoing()
                .find(|o| o.state != OutgoingState::Sealed)
                .map(|o| o.body.transfer);
            if let Some(t) = decided {
                self.with_branch(name, |b, _| b.reclaim_transfer(t));
                return;
            }
        }
        if live.is_empty() {
            return;
        }
        let (credit, avail, label) = live[self.rng.random_range(0..live.len())].clone();
        if roll < self.p.spend_rate {
            let max = random_part(&mut self.rng, &avail);
            let gateway = GATEWAYS[self.rng.random_range(0..GATEWAYS.len())];
            let purpose = random_purpose(&mut self.rng, &label);
            let effect = Effect {
                purpose,
                operation: format!("call-{}", self.next_id),
                max_charge: max,
                carried_by: None,
            };
            let key = OpKey::from_u128(self.fresh());
            let now = UnixMillis(self.now);
            self.with_branch(name, |b, _| {
                b.reserve(now, credit, effect, &agent(gateway), key)
            });
        } else if roll < self.p.spend_rate + 0.2 && !children(name).is_empty() {
            let to = children(name)[self.rng.random_range(0..children(name).len())];
            let amount = random_part(&mut self.rng, &avail);
            let t = TransferId::from_u128(self.fresh());
            let label = random_label(&mut self.rng, &label);
            // Half of them reclaimable: the child takes them only on the source's
            // confirmation, and the source may take them back until it confirms.
            let reclaimable = self.rng.random_bool(0.5);
            self.with_branch(name, |b, _| {
                if reclaimable {
                    b.transfer_reclaimable(credit, t, &amount, &agent(to), label)
                } else {
                    b.transfer(credit, t, &amount, &agent(to), label)
                }
            });
        } else if roll < self.p.spend_rate + 0.3 {
            let child = CreditId::from_u128(self.fresh());
            let amount = random_part(&mut self.rng, &avail);
            let label = random_label(&mut self.rng, &label);
            self.with_branch(name, |b, _| b.split(credit, child, amount, label));
        } else if roll < self.p.spend_rate + 0.4 {
            // Join two live credits; sometimes an aliased "diamond" join of one credit with
            // itself, which must be refused.
            let other = if self.rng.random_bool(0.3) || live.len() < 2 {
                credit
            } else {
                live[self.rng.random_range(0..live.len())].0
            };
            let out = CreditId::from_u128(self.fresh());
            let diamond = match (came_from.get(&credit), came_from.get(&other)) {
                (Some(x), Some(y)) => x != y,
                _ => false,
            };
            if self
                .with_branch(name, |b, _| b.join(vec![credit, other], out))
                .is_some()
                && diamond
            {
                self.report.diamonds += 1;
            }
        } else if roll < self.p.spend_rate + 0.45 {
            // Terminal rollover: refused while the generation has work in progress.
            self.with_branch(name, |b, _| b.reissue(credit));
        } else if roll < self.p.spend_rate + 0.5 {
            // Return what is unused to where it came from (refused for a credit that did not
            // come by transfer); a repeated return id stutters.
            let t = TransferId::from_u128(self.fresh());
            if self
                .with_branch(name, |b, _| b.return_rights(credit, t))
                .is_some()
            {
                self.report.returns += 1;
                if self.rng.random_bool(0.2) {
                    self.with_branch(name, |b, _| b.return_rights(credit, t));
                }
            }
        } else if name == "c" && self.rng.random_bool(0.2) {
            let refusing = self.rng.random_bool(0.3);
            self.with_branch(name, |b, _| {
                b.set_refusing(refusing);
                Ok(())
            });
        }
    }

    pub(super) fn act_settle(&mut self, name: &'static str) {
        let now = self.now;
        let Some(b) = self.branches.get_mut(name).and_then(|n| n.machine.as_mut()) else {
            return;
        };
        // What a gateway has forgotten can only be forfeited: nothing will ever prove it
        // had no effect.
        let mut forgotten = Vec::new();
        while let Some(e) = b.poll_event() {
            if let abhyasa_ledger::LedgerEvent::Refused {
                key,
                reason: abhyasa_ledger::Refusal::Forgotten,
            } = e
            {
                forgotten.push(key);
            }
        }
        let (reserved, _) = open_ops(b);
        for key in reserved {
            self.with_branch(name, |b, _| b.release_unsent(key));
        }
        for key in forgotten {
            self.with_branch(name, |b, _| b.forfeit(key));
        }
        let Some(b) = self.branches.get(name).and_then(|n| n.machine.as_ref()) else {
            return;
        };
        let (_, stuck) = open_ops(b);
        for (key, credit) in stuck {
            let since = *self.quarantined_since.entry(key).or_insert(now);
            if now >= since + 2_000 {
                self.with_branch(name, |b, _| b.request_fence(credit));
            }
        }
    }
}
