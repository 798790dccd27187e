//! A pending obligation's attempts: its timers and backoff, each send, and how it ends
//! (applied, declined, escalated with its safe action).

use super::*;

impl Custodian {
    /// Runs every timer due at `now`. A spurious call is a no-op.
    pub fn handle_timeout(&mut self, now: UnixMillis) {
        while let Some(&(at, id)) = self.timers.first() {
            if at > now {
                break;
            }
            self.timers.pop_first();
            self.on_timer(now, id);
        }
    }

    pub(super) fn on_timer(&mut self, now: UnixMillis, id: ObligationId) {
        let Some(p) = self.pending.get(&id) else {
            return;
        };
        if now >= p.obligation.deadline {
            self.escalate(now, id, EscalationCause::Deadline);
            return;
        }
        let rt = self.config.response_timeout_ms;
        match p.phase {
            Phase::AwaitingPersist | Phase::Queued { .. } => self.rearm(id, p.obligation.deadline),
            Phase::InFlight { since } if now < since.saturating_add(rt) => {
                self.rearm(id, since.saturating_add(rt));
            }
            Phase::InFlight { .. } if p.attempts >= p.budget() => {
                self.escalate(now, id, EscalationCause::RetriesExhausted);
            }
            Phase::InFlight { .. } => {
                let deadline = p.obligation.deadline;
                // Time a re-offer skipped is waited out now, on top of this backoff.
                let ahead = p.ahead;
                let delay = self.backoff(id);
                let p = self.pending.get_mut(&id).expect("pending checked above");
                p.ahead = 0;
                p.repaying = ahead > 0;
                let wake = now
                    .saturating_add(delay)
                    .saturating_add(ahead)
                    .min(deadline);
                self.set_phase(now, id, Phase::Backoff);
                self.rearm(id, wake);
            }
            Phase::Backoff if now < p.wake => self.rearm(id, p.wake),
            Phase::Backoff if p.attempts >= p.budget() => {
                // Recovered after the last attempt: give it one response timeout.
                let wake = now.saturating_add(rt).min(p.obligation.deadline);
                self.set_phase(now, id, Phase::InFlight { since: now });
                self.rearm(id, wake);
            }
            Phase::Backoff => {
                self.set_phase(now, id, Phase::AwaitingPersist);
                let p = self.pending.get_mut(&id).expect("pending checked above");
                p.attempts += 1;
                p.repaying = false;
                let (attempts, last_observed, deadline) =
                    (p.attempts, p.last_observed, p.obligation.deadline);
                let token = self.persist(CustodianRecord::Attempt {
                    id,
                    attempts,
                    last_observed,
                });
                self.gate(
                    token,
                    Gate::Send {
                        id,
                        attempt: attempts,
                    },
                );
                self.rearm(id, deadline);
            }
        }
    }

    /// Full jitter over `min(cap, base·2^(k-1))`, with the cap below the obligation's lifetime.
    pub(super) fn backoff(&mut self, id: ObligationId) -> u64 {
        let p = &self.pending[&id];
        let span = p
            .obligation
            .deadline
            .saturating_since(p.obligation.created_at);
        let ceiling = self.config.backoff_ceiling(span, p.attempts);
        self.rng.0.random_range(0..=ceiling)
    }

    pub(super) fn send(&mut self, now: UnixMillis, id: ObligationId, attempt: u32) {
        let Some(p) = self.pending.get(&id) else {
            return; // Discharged while the record was being written.
        };
        if p.attempts != attempt
            || p.phase != Phase::AwaitingPersist
            || now >= p.obligation.deadline
        {
            return;
        }
        let target = p.obligation.target.clone();
        let window = self.config.max_inflight_per_target.max(1);
        if self.inflight.get(&target).copied().unwrap_or(0) >= window {
            self.set_phase(now, id, Phase::Queued { attempt });
            self.queued.entry(target).or_default().push_back(id);
            return;
        }
        self.transmit(now, id, attempt);
    }

    /// Puts attempt `attempt` of `id` on the wire and starts its response timer.
    pub(super) fn transmit(&mut self, now: UnixMillis, id: ObligationId, attempt: u32) {
        let rt = self.config.response_timeout_ms;
        self.set_phase(now, id, Phase::InFlight { since: now });
        let p = &self.pending[&id];
        let wake = now.saturating_add(rt).min(p.obligation.deadline);
        self.transmits.push_back(Transmit {
            to: p.obligation.target.clone(),
            obligation: p.obligation.clone(),
            attempt,
            channel: if attempt == 1 {
                self.config.first_attempt
            } else {
                Channel::Stream
            },
        });
        self.stats.attempts += 1;
        self.rearm(id, wake);
    }

    pub(super) fn escalate(&mut self, now: UnixMillis, id: ObligationId, cause: EscalationCause) {
        let p = &self.pending[&id];
        let Some(safe_action) =
            safe_action(self.config.mutation(), &p.obligation, self.retention())
        else {
            // Only admissible obligations are ever pending (issue and recover check), and
            // every admissible obligation has `safe(O)`.
            debug_assert!(false, "pending obligation {id} without a safe action");
            return;
        };
        let escalation = Escalation {
            obligation_id: id,
            kind: p.obligation.kind(),
            target: p.obligation.target.clone(),
            attempts: p.attempts,
            cause,
            last_observed: p.last_observed,
            safe_action: safe_action.clone(),
            at: now,
        };
        let target = p.obligation.target.clone();
        let update = if self.config.mutation() == Some(Mutation::EscalateWithoutSafeAction) {
            None
        } else {
            Some(PrincipalUpdate::Safe(safe_action))
        };
        self.terminate_with(
            now,
            id,
            Outcome::Escalated(cause),
            update,
            Some(escalation),
            None,
        );
        self.remember_escalation(id, target);
    }

    pub(super) fn terminate(
        &mut self,
        now: UnixMillis,
        id: ObligationId,
        outcome: Outcome,
        principal: Option<PrincipalUpdate>,
    ) {
        self.terminate_with(now, id, outcome, principal, None, None);
    }

    pub(super) fn terminate_with(
        &mut self,
        now: UnixMillis,
        id: ObligationId,
        outcome: Outcome,
        principal: Option<PrincipalUpdate>,
        escalation: Option<Escalation>,
        detail: Option<Detail>,
    ) {
        if !self.pending.contains_key(&id) {
            return;
        }
        // Leaving custody frees its place in the window.
        self.set_phase(now, id, Phase::Backoff);
        let Some(p) = self.pending.remove(&id) else {
            return;
        };
        if let Some(n) = self.pending_per_target.get_mut(&p.obligation.target) {
            *n -= 1;
            if *n == 0 {
                self.pending_per_target.remove(&p.obligation.target);
            }
        }
        self.timers.remove(&(p.wake, id));
        self.remember_ended(id, p.obligation.deadline);
        if let Some(update) = &principal {
            self.principal.apply(update, id);
        }
        let record = TerminalRecord {
            obligation_id: id,
            kind: p.obligation.kind(),
            target: p.obligation.target,
            outcome,
            attempts: p.attempts,
            at: now,
            detail,
        };
        let token = self.persist(CustodianRecord::Terminal {
            record: record.clone(),
            escalation: escalation.clone(),
            principal,
        });
        self.gate(
            token,
            Gate::Event(Box::new(CustodianEvent::Terminal { record, escalation })),
        );
    }
}
