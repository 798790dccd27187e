//! A branch's timers: resends of what its peers have not answered, and the deadlines after
//! which a transfer is decided.

use super::*;

impl Branch {
    /// Sends again what is still undecided: sealed transfers and quarantined dispatches
    /// (the gateway answers a repeated key with its prior decision). Never refunds.
    pub fn handle_timeout(&mut self, now: UnixMillis) {
        self.observe(now);
        if now.0 < self.last_resend.0.saturating_add(self.config.resend_ms) {
            return;
        }
        self.last_resend = now;
        self.resend(now);
        self.resend_armed =
            self.undecided() && self.config.mutation() != Some(LedgerMutation::TimerNotRearmed);
    }

    /// Whether anything [`resend`](Self::resend) looks at is still undecided.
    pub(super) fn undecided(&self) -> bool {
        self.credits.values().any(|c| c.fenced && !c.closed)
            || self
                .outgoing
                .values()
                .any(|o| o.state == OutgoingState::Sealed)
            || self
                .incoming
                .values()
                .any(|s| matches!(s, Step::Claim { .. }))
            || self.ops.values().any(|o| o.state == OpState::Quarantined)
    }

    pub(super) fn resend(&mut self, now: UnixMillis) {
        // A fenced generation whose last operation ended before a crash (the reissue not yet
        // written) closes now.
        let fenced: Vec<CreditId> = self
            .credits
            .values()
            .filter(|c| c.fenced && !c.closed)
            .map(|c| c.id)
            .collect();
        for credit in fenced {
            let _ = self.roll_if_done(credit);
        }
        let mut give_up = Vec::new();
        for out in self.outgoing.values() {
            if out.state == OutgoingState::Sealed
                && !self
                    .in_flight_by
                    .contains_key(&Undurable::Seal(out.body.transfer))
            {
                self.transmits.push_back((
                    out.body.destination.clone(),
                    LedgerMessage::Transfer(out.cert.clone()),
                ));
                let n = self.resends.entry(out.body.transfer).or_insert(0);
                *n += 1;
                if self.config.mutation() == Some(LedgerMutation::CancelTransferOnTimeout) && *n > 2
                {
                    give_up.push(TransferDecision {
                        root: out.body.root,
                        transfer: out.body.transfer,
                        cert: out.body.digest(),
                        source: out.body.source.clone(),
                        destination: out.body.destination.clone(),
                        credit: None,
                    });
                }
            }
        }
        for d in give_up {
            let decision = Signed::sign(&d, &self.me, &self.key);
            let _ = self.commit(Step::Decided { decision }, Vec::new());
        }
        // Claims the source has not answered (its answer may have been lost).
        for ((root, transfer), step) in &self.incoming {
            if let Step::Claim { cert, decision, .. } = step {
                if self
                    .in_flight_by
                    .contains_key(&Undurable::Decision(*root, *transfer))
                {
                    continue;
                }
                if let Ok(c) = cert.peek() {
                    self.transmits
                        .push_back((c.source, LedgerMessage::Decision(decision.clone())));
                }
            }
        }
        let mut refunds = Vec::new();
        for (key, op) in &mut self.ops {
            if op.state != OpState::Quarantined
                || self.in_flight_by.contains_key(&Undurable::Dispatch(*key))
            {
                continue;
            }
            let stale = op
                .sent_at
                .is_some_and(|t| now.0 >= t.0.saturating_add(self.config.resend_ms));
            if self.config.mutation() == Some(LedgerMutation::RefundOnTimeout) && stale {
                refunds.push(*key);
                continue;
            }
            if op.sent_at.is_some() && !stale {
                continue; // Sent less than a resend period ago.
            }
            op.sent_at = Some(now);
            let fenced = self
                .credits
                .get(&op.binding.credit)
                .is_some_and(|c| c.epoch > op.binding.epoch);
            let msg = if fenced {
                // The gateway refuses this permit now; ask what became of it instead.
                LedgerMessage::Query {
                    key: *key,
                    binding: Box::new(op.binding.clone()),
                }
            } else {
                LedgerMessage::Dispatch {
                    permit: op.permit.clone(),
                    effect: op.effect.clone(),
                }
            };
            self.transmits.push_back((op.binding.receiver.clone(), msg));
        }
        for key in refunds {
            let _ = self.commit(Step::Refund { key }, Vec::new());
        }
    }
}
