//! The ledger messages a branch takes from its peers: claims, source decisions, transfers,
//! receipts and proofs, each checked against its signer before it becomes a step.

use super::*;

impl Branch {
    /// Handles a message from `from`. Bad messages are reported as events, never applied.
    pub fn handle_message(&mut self, now: UnixMillis, from: &AgentId, msg: LedgerMessage) {
        self.observe(now);
        if let Err(e) = self.on_message(now, from, msg) {
            self.events.push_back(LedgerEvent::Rejected(e));
        }
    }

    pub(super) fn on_message(
        &mut self,
        _now: UnixMillis,
        from: &AgentId,
        msg: LedgerMessage,
    ) -> Result<(), LedgerError> {
        // The session proves who sent a message; evidence must also be signed by the party it
        // is about (SPEC: evidence binds its signer). The signature itself is verified where
        // the step is applied, which is also where a journal replays it at recovery.
        match msg {
            LedgerMessage::Transfer(cert) => self.on_transfer(from, cert),
            LedgerMessage::Decision(decision) => {
                let d = decision.peek()?;
                let Some(out) = self.outgoing.get(&d.transfer) else {
                    return Err(LedgerError::UnknownTransfer(d.transfer));
                };
                self.party("a transfer decision", from, &out.body.destination)?;
                if out.body.confirm {
                    return self.on_claim(from, decision, d);
                }
                if out.state != OutgoingState::Sealed {
                    return Ok(()); // Already decided: a repeat.
                }
                let credit = out.body.source_credit;
                self.commit(Step::Decided { decision }, Vec::new())?;
                self.roll_if_done(credit)
            }
            LedgerMessage::SourceDecision(decision) => self.on_source_decision(from, decision),
            LedgerMessage::Receipt(receipt) => {
                let r = receipt.peek()?;
                if self.ended.contains_key(&r.key) {
                    return Ok(()); // Ended and folded: a repeat.
                }
                let op = self
                    .ops
                    .get(&r.key)
                    .ok_or(LedgerError::UnknownOperation(r.key))?;
                self.party("a receipt", from, &op.binding.receiver)?;
                match op.state {
                    OpState::Quarantined => self.end_operation(
                        r.key,
                        Step::Settle {
                            key: r.key,
                            receipt,
                        },
                    ),
                    OpState::Forfeited { annotation: None }
                        if self.config.mutation()
                            == Some(LedgerMutation::UnforfeitOnLateEvidence) =>
                    {
                        self.commit(
                            Step::Settle {
                                key: r.key,
                                receipt,
                            },
                            Vec::new(),
                        )
                    }
                    OpState::Forfeited { annotation: None } => self.commit(
                        Step::Annotate {
                            key: r.key,
                            receipt,
                        },
                        Vec::new(),
                    ),
                    _ => Ok(()), // A repeat, or evidence that came too late to matter.
                }
            }
            LedgerMessage::NoEffect(proof) => {
                let p = proof.peek()?;
                if self.ended.contains_key(&p.key) {
                    return Ok(()); // Ended and folded: a repeat.
                }
                let op = self
                    .ops
                    .get(&p.key)
                    .ok_or(LedgerError::UnknownOperation(p.key))?;
                self.party("a no-effect proof", from, &op.binding.receiver)?;
                if op.state != OpState::Quarantined {
                    return Ok(());
                }
                self.end_operation(p.key, Step::NoEffect { key: p.key, proof })
            }
            LedgerMessage::Refused { key, reason } => {
                // Only an event: a refusal is unsigned and names a key, not the dispatch it
                // answers — a copy of the permit with another effect attached (on the path)
                // is refused under the same key — so it never stops the resends.
                self.events.push_back(LedgerEvent::Refused { key, reason });
                Ok(())
            }
            LedgerMessage::Pending { .. } => Ok(()),
            LedgerMessage::Horizon { horizon } => {
                // Only a gateway this branch pays through speaks for its own log; the next
                // checkpoint forgets what the instant covers.
                let pays_there = self.ended.values().any(|e| &e.receiver == from)
                    || self.ops.values().any(|o| &o.binding.receiver == from);
                if !pays_there {
                    return Err(LedgerError::WrongState(
                        "a horizon from an agent this branch never paid through",
                    ));
                }
                self.raise_horizon(from, horizon);
                Ok(())
            }
            LedgerMessage::Fenced(fenced) => {
                let f = fenced.peek()?;
                self.party("a fenced reply", from, &f.gateway)?;
                let c = self
                    .credits
                    .get(&f.credit)
                    .ok_or(LedgerError::UnknownCredit(f.credit))?;
                if f.epoch <= c.epoch {
                    return Ok(());
                }
                // Ask right away about every quarantined dispatch below the new fence.
                let queries: Vec<_> = self
                    .ops
                    .values()
                    .filter(|o| {
                        o.state == OpState::Quarantined
                            && o.binding.credit == f.credit
                            && &o.binding.receiver == from
                    })
                    .map(|o| {
                        (
                            from.clone(),
                            LedgerMessage::Query {
                                key: o.binding.key,
                                binding: Box::new(o.binding.clone()),
                            },
                        )
                    })
                    .collect();
                let credit = f.credit;
                self.commit(Step::Fenced { fenced }, queries)?;
                self.roll_if_done(credit)
            }
            LedgerMessage::Dispatch { .. }
            | LedgerMessage::Query { .. }
            | LedgerMessage::Fence(_) => Err(LedgerError::WrongState(
                "a gateway message sent to a branch",
            )),
        }
    }

    /// `from` must be `expected`: the party a piece of evidence is about.
    pub(super) fn party(
        &self,
        what: &'static str,
        from: &AgentId,
        expected: &AgentId,
    ) -> Result<(), LedgerError> {
        if from == expected || self.config.mutation() == Some(LedgerMutation::EvidenceFromAnyMember)
        {
            return Ok(());
        }
        Err(LedgerError::WrongParty {
            what,
            expected: expected.clone(),
            signer: from.clone(),
        })
    }

    /// Opens evidence that must be signed by `expected`: the signature verified with the
    /// keyring, the signer checked (at every apply, so also when a journal is replayed).
    pub(super) fn evidence<T: SignedObject>(
        &self,
        what: &'static str,
        signed: &Signed<T>,
        expected: &AgentId,
    ) -> Result<T, LedgerError> {
        let lax = match self.config.mutation() {
            Some(LedgerMutation::EvidenceFromAnyMember) => true,
            Some(LedgerMutation::CancelTransferOnTimeout) => what == "a transfer decision",
            _ => false,
        };
        let signer = if lax { &signed.signer } else { expected };
        if &signed.signer != signer {
            return Err(LedgerError::WrongParty {
                what,
                expected: expected.clone(),
                signer: signed.signer.clone(),
            });
        }
        Ok(self.keys.open(signed, signer)?)
    }

    /// As source of a certificate that asks for confirmation: the destination's decision is
    /// a claim (or a refusal). A claim on a sealed transfer is confirmed — the compare-and-set
    /// — and answered; a repeated one gets the same answer; a claim on a reclaimed transfer
    /// gets the reclaim.
    pub(super) fn on_claim(
        &mut self,
        from: &AgentId,
        decision: Signed<TransferDecision>,
        d: TransferDecision,
    ) -> Result<(), LedgerError> {
        let out = &self.outgoing[&d.transfer];
        let answer = match &out.state {
            OutgoingState::Sealed => {
                let credit = out.body.source_credit;
                let reply = match d.credit {
                    Some(c) => vec![(
                        from.clone(),
                        LedgerMessage::SourceDecision(self.source_decision(&out.body, Some(c))),
                    )],
                    None => Vec::new(), // A refusal: the atoms come back, nothing to answer.
                };
                self.commit(Step::Decided { decision }, reply)?;
                return self.roll_if_done(credit);
            }
            OutgoingState::Accepted(prior) => {
                let confirmed = prior.peek()?.credit;
                if confirmed != d.credit {
                    return Err(LedgerError::Mismatch(
                        "a claim other than the one confirmed",
                    ));
                }
                self.source_decision(&out.body, confirmed)
            }
            OutgoingState::Reclaimed(r) => r.clone(),
            OutgoingState::Cancelled(_) => return Ok(()),
        };
        let reply = (from.clone(), LedgerMessage::SourceDecision(answer));
        // Not before the decision it repeats is durable.
        match self.in_flight_by.get(&Undurable::Outcome(d.transfer)) {
            Some(t) => self.gated.entry(*t).or_default().push(reply),
            None => self.transmits.push_back(reply),
        }
        Ok(())
    }

    /// As destination: the source's answer to this branch's claim — its confirmation (the
    /// credit is made) or its reclaim (the claim ends, nothing is taken).
    pub(super) fn on_source_decision(
        &mut self,
        from: &AgentId,
        decision: Signed<SourceDecision>,
    ) -> Result<(), LedgerError> {
        let d = decision.peek()?;
        self.party("a source decision", from, &d.source)?;
        let Some(Step::Claim {
            cert,
            credit,
            decision: claim,
        }) = self.incoming.get(&(d.root, d.transfer))
        else {
            return Ok(()); // Not claimed, or already settled: nothing waits for it.
        };
        let (cert, credit, claim) = (cert.clone(), *credit, claim.clone());
        if d.credit.is_some() {
            self.commit(
                Step::Accept {
                    cert,
                    credit,
                    decision: claim,
                    confirmation: Some(decision),
                },
                Vec::new(),
            )?;
            self.events
                .push_back(LedgerEvent::CreditReceived { credit });
            Ok(())
        } else {
            self.commit(Step::Reclaimed { cert, decision }, Vec::new())
        }
    }

    pub(super) fn on_transfer(
        &mut self,
        from: &AgentId,
        cert: Signed<TransferCert>,
    ) -> Result<(), LedgerError> {
        let body = cert.peek()?;
        self.party("a transfer certificate", from, &body.source)?;
        let body = self.evidence("a transfer certificate", &cert, &body.source)?;
        if body.destination != self.me {
            return Err(LedgerError::Mismatch(
                "transfer addressed to another branch",
            ));
        }
        let replay = self.config.mutation() == Some(LedgerMutation::AcceptReplayedTransfer);
        if let Some(prior) = self.incoming.get(&(body.root, body.transfer)) {
            if !replay {
                // Decided before: answer with the same decision.
                let decision = match prior {
                    Step::Accept { decision, .. }
                    | Step::Refuse { decision, .. }
                    | Step::Claim { decision, .. } => decision.clone(),
                    _ => return Ok(()), // Reclaimed: the source decided already.
                };
                let reply = (from.clone(), LedgerMessage::Decision(decision));
                // Not before the decision is durable: a crash could lose it after the source
                // acted on it.
                match self
                    .in_flight_by
                    .get(&Undurable::Decision(body.root, body.transfer))
                {
                    Some(t) => self.gated.entry(*t).or_default().push(reply),
                    None => self.transmits.push_back(reply),
                }
                return Ok(());
            }
        }
        let credit = derive_credit_id(&self.me, body.root, body.transfer, self.journal_len);
        let refuse = self.refusing || self.room().is_err();
        let d = TransferDecision {
            root: body.root,
            transfer: body.transfer,
            cert: body.digest(),
            source: body.source.clone(),
            destination: self.me.clone(),
            credit: (!refuse).then_some(credit),
        };
        let decision = Signed::sign(&d, &self.me, &self.key);
        let reply = vec![(from.clone(), LedgerMessage::Decision(decision.clone()))];
        let wait = self.config.mutation() != Some(LedgerMutation::AcceptWithoutConfirmation);
        if refuse {
            self.commit(Step::Refuse { cert, decision }, reply)
        } else if body.confirm && wait {
            // A claim: the credit is made only when the source confirms it.
            self.commit(
                Step::Claim {
                    cert,
                    credit,
                    decision,
                },
                reply,
            )
        } else {
            self.commit(
                Step::Accept {
                    cert,
                    credit,
                    decision,
                    confirmation: None,
                },
                reply,
            )?;
            self.events
                .push_back(LedgerEvent::CreditReceived { credit });
            Ok(())
        }
    }
}
