//! Applying a step: the one place a branch's state changes, for a live step and a replayed
//! one alike (the journal is the state).

use super::*;

impl Branch {
    /// Applies `step` and hands it out for persistence, with `msgs` released after it.
    pub(super) fn commit(
        &mut self,
        step: Step,
        msgs: Vec<(AgentId, LedgerMessage)>,
    ) -> Result<(), LedgerError> {
        self.commit_known(step, msgs, None)
    }

    /// [`commit`](Self::commit) of a reservation whose permit this branch has just built
    /// from its effect (`known`: the permit's body, as signed).
    pub(super) fn commit_known(
        &mut self,
        step: Step,
        msgs: Vec<(AgentId, LedgerMessage)>,
        known: Option<Permit>,
    ) -> Result<(), LedgerError> {
        if !self.apply_known(&step, known)? {
            return Ok(()); // A replay: nothing to write.
        }
        self.journal_len += 1;
        let token = PersistToken(self.next_token);
        self.next_token += 1;
        let resendable = match &step {
            Step::Dispatch { key } => Some(Undurable::Dispatch(*key)),
            Step::Seal { cert } => cert.peek().ok().map(|c| Undurable::Seal(c.transfer)),
            Step::Accept { cert, .. } | Step::Refuse { cert, .. } | Step::Claim { cert, .. } => {
                cert.peek()
                    .ok()
                    .map(|c| Undurable::Decision(c.root, c.transfer))
            }
            Step::Decided { decision } => {
                decision.peek().ok().map(|d| Undurable::Outcome(d.transfer))
            }
            Step::Reclaim { decision } => {
                decision.peek().ok().map(|d| Undurable::Outcome(d.transfer))
            }
            _ => None,
        };
        if let Some(k) = resendable {
            self.in_flight.insert(token, k);
            self.in_flight_by.insert(k, token);
        }
        self.persists.push_back((token, step));
        if self.config.mutation() == Some(LedgerMutation::SendBeforePersist) {
            self.transmits.extend(msgs);
        } else if !msgs.is_empty() {
            self.gated.insert(token, msgs);
        }
        Ok(())
    }

    /// Applies one step. `Ok(false)`: it had already taken effect (a replay).
    pub(super) fn apply(&mut self, step: &Step) -> Result<bool, LedgerError> {
        self.apply_known(step, None)
    }

    /// [`apply`](Self::apply); `known`: a reservation's permit body, built by this branch
    /// from the step's own effect (so neither is read back nor compared again).
    pub(super) fn apply_known(
        &mut self,
        step: &Step,
        known: Option<Permit>,
    ) -> Result<bool, LedgerError> {
        self.resend_armed |= self.config.mutation() != Some(LedgerMutation::TimerNotRearmed)
            || self.last_resend == UnixMillis(0);
        match step {
            Step::Grant { grant, credit } => self.apply_grant(step, grant, credit),
            Step::Split {
                parent,
                child,
                amount,
                label,
            } => self.apply_split(step, parent, child, amount, label),
            Step::Seal { cert } => self.apply_seal(cert),
            Step::Accept {
                cert,
                credit,
                confirmation,
                ..
            } => self.apply_accept(step, cert, credit, confirmation.as_ref()),
            Step::Refuse { cert, .. } => self.apply_refuse(step, cert),
            Step::Claim { cert, credit, .. } => self.apply_claim(step, cert, credit),
            Step::Reclaimed { cert, decision } => self.apply_reclaimed(step, cert, decision),
            Step::Reclaim { decision } => self.apply_reclaim(decision),
            Step::Decided { decision } => self.apply_decided(decision),
            Step::Reserve { permit, effect } => self.apply_reserve(permit, effect, known),
            Step::Dispatch { key } => self.apply_dispatch(key),
            Step::ReleaseUnsent { key } => self.apply_release_unsent(key),
            Step::Settle { key, receipt } => self.apply_settle(key, receipt),
            Step::NoEffect { key, proof } => self.apply_no_effect(key, proof),
            Step::Forfeit { key } => self.apply_forfeit(key),
            Step::Annotate { key, receipt } => self.apply_annotate(key, receipt),
            Step::Join { inputs, output } => self.apply_join(step, inputs, output),
            Step::Fenced { fenced } => self.apply_fenced(fenced),
            Step::Reissue {
                credit,
                successor,
                last,
            } => self.apply_reissue(step, credit, successor, last.as_deref()),
            Step::Checkpoint(record) => self.apply_checkpoint(record),
            Step::Refund { key } => self.apply_refund(key),
        }
    }

    /// Applies a [`Step::Grant`].
    fn apply_grant(
        &mut self,
        step: &Step,
        grant: &Signed<RootGrant>,
        credit: &CreditId,
    ) -> Result<bool, LedgerError> {
        let g = self.verified_grant(grant)?;
        if self.roots.contains_key(&g.root) {
            return self.replayed(credit, step, "root grant");
        }
        if self.credits.contains_key(credit) {
            return Err(LedgerError::IdInUse("credit"));
        }
        self.origins.insert(*credit, step.clone());
        self.credits.insert(
            *credit,
            Credit {
                id: *credit,
                root: g.root,
                label: g.label.clone(),
                generation: 0,
                epoch: 0,
                available: Footprint::full(&g.budget),
                fenced: false,
                closed: false,
                successor: None,
            },
        );
        self.roots.insert(g.root, g);
        Ok(true)
    }

    /// Applies a [`Step::Split`].
    fn apply_split(
        &mut self,
        step: &Step,
        parent: &CreditId,
        child: &CreditId,
        amount: &Vector,
        label: &Label,
    ) -> Result<bool, LedgerError> {
        if self.credits.contains_key(child) {
            return self.replayed(child, step, "credit");
        }
        let p = self.working_credit(*parent)?;
        if !label.within(&p.label) {
            return Err(LedgerError::LabelNotAttenuated);
        }
        let (taken, rest) = take(p, amount)?;
        let c = Credit {
            id: *child,
            root: p.root,
            label: label.clone(),
            generation: 0,
            epoch: 0,
            available: taken,
            fenced: false,
            closed: false,
            successor: None,
        };
        self.credits.get_mut(parent).expect("checked").available = rest;
        self.credits.insert(*child, c);
        self.origins.insert(*child, step.clone());
        Ok(true)
    }

    /// Applies a [`Step::Seal`].
    fn apply_seal(&mut self, cert: &Signed<TransferCert>) -> Result<bool, LedgerError> {
        let body = cert.peek()?;
        if let Some(out) = self.outgoing.get(&body.transfer) {
            return if out.cert == *cert {
                Ok(false)
            } else {
                Err(LedgerError::IdInUse("transfer"))
            };
        }
        let c = self.working_credit(body.source_credit)?;
        let rest = c
            .available
            .subtract(&body.footprint)
            .ok_or(LedgerError::Insufficient {
                need: body.footprint.size(),
                have: c.available.size(),
            })?;
        self.credits
            .get_mut(&body.source_credit)
            .expect("checked")
            .available = rest;
        self.outgoing.insert(
            body.transfer,
            Outgoing {
                cert: cert.clone(),
                body,
                state: OutgoingState::Sealed,
            },
        );
        Ok(true)
    }

    /// Applies a [`Step::Accept`].
    fn apply_accept(
        &mut self,
        step: &Step,
        cert: &Signed<TransferCert>,
        credit: &CreditId,
        confirmation: Option<&Signed<SourceDecision>>,
    ) -> Result<bool, LedgerError> {
        let body = self.addressed_here(cert)?;
        if body.confirm {
            self.confirmed(&body, *credit, confirmation)?;
        }
        let replay = self.config.mutation() == Some(LedgerMutation::AcceptReplayedTransfer);
        match self.incoming.get(&(body.root, body.transfer)) {
            // The claim this confirmation answers: it becomes the credit now.
            Some(Step::Claim { credit: c, .. }) if c == credit => {}
            Some(Step::Claim { .. }) => {
                return Err(LedgerError::Mismatch("a credit other than the one claimed"))
            }
            Some(_) if !replay => return Ok(false),
            _ => {}
        }
        if self.credits.contains_key(credit) {
            return self.replayed(credit, step, "credit");
        }
        self.origins.insert(*credit, step.clone());
        self.credits.insert(
            *credit,
            Credit {
                id: *credit,
                root: body.root,
                label: body.label.clone(),
                generation: 0,
                epoch: 0,
                available: body.footprint.clone(),
                fenced: false,
                closed: false,
                successor: None,
            },
        );
        self.incoming
            .insert((body.root, body.transfer), step.clone());
        Ok(true)
    }

    /// Applies a [`Step::Refuse`].
    fn apply_refuse(
        &mut self,
        step: &Step,
        cert: &Signed<TransferCert>,
    ) -> Result<bool, LedgerError> {
        let body = cert.peek()?;
        if self.incoming.contains_key(&(body.root, body.transfer)) {
            return Ok(false);
        }
        self.incoming
            .insert((body.root, body.transfer), step.clone());
        Ok(true)
    }

    /// Applies a [`Step::Claim`].
    fn apply_claim(
        &mut self,
        step: &Step,
        cert: &Signed<TransferCert>,
        credit: &CreditId,
    ) -> Result<bool, LedgerError> {
        let body = self.addressed_here(cert)?;
        if !body.confirm {
            return Err(LedgerError::Mismatch(
                "a claim on a transfer that does not ask for confirmation",
            ));
        }
        if self.incoming.contains_key(&(body.root, body.transfer)) {
            return Ok(false);
        }
        if self.credits.contains_key(credit) {
            return Err(LedgerError::IdInUse("credit"));
        }
        self.incoming
            .insert((body.root, body.transfer), step.clone());
        Ok(true)
    }

    /// Applies a [`Step::Reclaimed`].
    fn apply_reclaimed(
        &mut self,
        step: &Step,
        cert: &Signed<TransferCert>,
        decision: &Signed<SourceDecision>,
    ) -> Result<bool, LedgerError> {
        let body = self.addressed_here(cert)?;
        let d = self.evidence("a source decision", decision, &body.source)?;
        if !bound_to(&d, &body) || d.credit.is_some() {
            return Err(LedgerError::Mismatch("a reclaim of another transfer"));
        }
        match self.incoming.get(&(body.root, body.transfer)) {
            Some(Step::Claim { .. }) => {}
            Some(Step::Reclaimed { .. }) => return Ok(false),
            _ => {
                return Err(LedgerError::WrongState(
                    "a reclaim of a transfer not claimed",
                ))
            }
        }
        self.incoming
            .insert((body.root, body.transfer), step.clone());
        Ok(true)
    }

    /// Applies a [`Step::Reclaim`].
    fn apply_reclaim(&mut self, decision: &Signed<SourceDecision>) -> Result<bool, LedgerError> {
        let transfer = decision.peek()?.transfer;
        let out = self
            .outgoing
            .get(&transfer)
            .ok_or(LedgerError::UnknownTransfer(transfer))?;
        let d = self.evidence("a source decision", decision, &out.body.source)?;
        if !bound_to(&d, &out.body) || d.credit.is_some() {
            return Err(LedgerError::Mismatch("a reclaim of another transfer"));
        }
        if !out.body.confirm {
            return Err(LedgerError::WrongState(
                "a reclaim of a transfer whose destination decides alone",
            ));
        }
        let after_confirm = self.config.mutation() == Some(LedgerMutation::ReclaimAfterConfirm)
            && matches!(out.state, OutgoingState::Accepted(_));
        match &out.state {
            OutgoingState::Sealed => {}
            _ if after_confirm => {}
            OutgoingState::Reclaimed(r) if r == decision => return Ok(false),
            _ => return Err(LedgerError::WrongState("a reclaim of a decided transfer")),
        }
        let out = self.outgoing.get_mut(&transfer).expect("checked");
        out.state = OutgoingState::Reclaimed(decision.clone());
        let (credit, fp) = (out.body.source_credit, out.body.footprint.clone());
        self.give_back(credit, &fp)?;
        self.events
            .push_back(LedgerEvent::TransferReclaimed { transfer });
        Ok(true)
    }

    /// Applies a [`Step::Decided`].
    fn apply_decided(&mut self, decision: &Signed<TransferDecision>) -> Result<bool, LedgerError> {
        let transfer = decision.peek()?.transfer;
        let out = self
            .outgoing
            .get(&transfer)
            .ok_or(LedgerError::UnknownTransfer(transfer))?;
        let d = self.evidence("a transfer decision", decision, &out.body.destination)?;
        // Bound to this very certificate: its digest, source, root and destination.
        let bound = d.cert == out.body.digest()
            && d.source == out.body.source
            && d.root == out.body.root
            && d.destination == out.body.destination;
        let any = self.config.mutation() == Some(LedgerMutation::EvidenceFromAnyMember);
        if !bound && !any {
            return Err(LedgerError::Mismatch("decision on another certificate"));
        }
        let out = self.outgoing.get_mut(&transfer).expect("checked");
        if out.state != OutgoingState::Sealed {
            return Ok(false);
        }
        if d.credit.is_some() {
            out.state = OutgoingState::Accepted(decision.clone());
            self.events.push_back(LedgerEvent::TransferAccepted {
                transfer: d.transfer,
            });
        } else {
            out.state = OutgoingState::Cancelled(decision.clone());
            let (credit, fp) = (out.body.source_credit, out.body.footprint.clone());
            self.give_back(credit, &fp)?;
            self.events.push_back(LedgerEvent::TransferCancelled {
                transfer: d.transfer,
            });
        }
        Ok(true)
    }

    /// Applies a [`Step::Reserve`].
    fn apply_reserve(
        &mut self,
        permit: &Signed<Permit>,
        effect: &Effect,
        known: Option<Permit>,
    ) -> Result<bool, LedgerError> {
        let built_here = known.is_some();
        let p = match known {
            Some(p) => p,
            None => permit.peek()?,
        };
        if self.ended.contains_key(&p.binding.key) {
            return Err(LedgerError::IdInUse("operation key"));
        }
        if let Some(op) = self.ops.get(&p.binding.key) {
            return if op.permit == *permit && op.effect == *effect {
                Ok(false)
            } else {
                Err(LedgerError::IdInUse("operation key"))
            };
        }
        // The escrow covers the maximum exactly, for the effect the binding names.
        let short = self.config.mutation() == Some(LedgerMutation::ReserveBelowMaximum);
        if p.footprint.size() != p.binding.max_charge && !short {
            return Err(LedgerError::Mismatch(
                "reservation other than the maximum charge",
            ));
        }
        if !built_here
            && (effect.digest() != p.binding.effect || effect.max_charge != p.binding.max_charge)
        {
            return Err(LedgerError::Mismatch("permit for another effect"));
        }
        let c = self.working_credit(p.binding.credit)?;
        if p.binding.generation != c.generation || p.binding.epoch != c.epoch {
            return Err(LedgerError::Mismatch(
                "permit for another generation or epoch of its credit",
            ));
        }
        let rest = c
            .available
            .subtract(&p.footprint)
            .ok_or(LedgerError::Insufficient {
                need: p.footprint.size(),
                have: c.available.size(),
            })?;
        self.credits
            .get_mut(&p.binding.credit)
            .expect("checked")
            .available = rest;
        self.ops.insert(
            p.binding.key,
            Operation {
                permit: permit.clone(),
                binding_digest: p.binding.digest(),
                binding: p.binding,
                effect: effect.clone(),
                footprint: p.footprint,
                state: OpState::Reserved,
                dispatched: false,
                sent_at: None,
            },
        );
        Ok(true)
    }

    /// Applies a [`Step::Dispatch`].
    fn apply_dispatch(&mut self, key: &OpKey) -> Result<bool, LedgerError> {
        let op = self.op_mut(*key)?;
        match op.state {
            OpState::Reserved => {
                op.state = OpState::Quarantined;
                op.dispatched = true;
            }
            OpState::Released => return Err(LedgerError::WrongState("dispatch after release")),
            _ => return Ok(false),
        }
        Ok(true)
    }

    /// Applies a [`Step::ReleaseUnsent`].
    fn apply_release_unsent(&mut self, key: &OpKey) -> Result<bool, LedgerError> {
        let late = self.config.mutation() == Some(LedgerMutation::ReleaseAfterDispatch);
        let op = self.op_mut(*key)?;
        match op.state {
            OpState::Reserved if !op.dispatched => {
                op.state = OpState::Released;
                let (credit, fp) = (op.binding.credit, op.footprint.clone());
                self.give_back(credit, &fp)?;
            }
            OpState::Quarantined if late => {
                op.state = OpState::Released;
                let (credit, fp) = (op.binding.credit, op.footprint.clone());
                self.give_back(credit, &fp)?;
            }
            OpState::Released => return Ok(false),
            _ => return Err(LedgerError::WrongState("release of a dispatched operation")),
        }
        Ok(true)
    }

    /// Applies a [`Step::Settle`].
    fn apply_settle(
        &mut self,
        key: &OpKey,
        receipt: &Signed<Receipt>,
    ) -> Result<bool, LedgerError> {
        let gateway = self.op_mut(*key)?.binding.receiver.clone();
        let r = self.evidence("a receipt", receipt, &gateway)?;
        let unforfeit = self.config.mutation() == Some(LedgerMutation::UnforfeitOnLateEvidence);
        let op = self.op_mut(*key)?;
        match op.state {
            OpState::Quarantined => {}
            OpState::Forfeited { .. } if unforfeit => {}
            OpState::Settled { .. } => return Ok(false),
            _ => {
                return Err(LedgerError::WrongState(
                    "settle of an unquarantined operation",
                ))
            }
        }
        if r.key != *key || r.binding != op.binding_digest {
            return Err(LedgerError::Mismatch("receipt for another binding"));
        }
        if !r.actual.le(&op.binding.max_charge) {
            // A conflicting receipt: the atoms stay quarantined.
            return Err(LedgerError::Mismatch("receipt above the maximum charge"));
        }
        let (charged, remainder) = op
            .footprint
            .take(&r.actual)
            .ok_or(LedgerError::Mismatch("receipt not within the reservation"))?;
        op.state = OpState::Settled {
            charged,
            receipt: receipt.clone(),
        };
        let credit = op.binding.credit;
        self.give_back(credit, &remainder)?;
        self.events.push_back(LedgerEvent::Settled {
            key: *key,
            actual: r.actual,
        });
        Ok(true)
    }

    /// Applies a [`Step::NoEffect`].
    fn apply_no_effect(
        &mut self,
        key: &OpKey,
        proof: &Signed<NoEffect>,
    ) -> Result<bool, LedgerError> {
        let gateway = self.op_mut(*key)?.binding.receiver.clone();
        let p = self.evidence("a no-effect proof", proof, &gateway)?;
        let op = self.op_mut(*key)?;
        match op.state {
            OpState::Quarantined => {}
            OpState::NoEffect(_) => return Ok(false),
            _ => {
                return Err(LedgerError::WrongState(
                    "no-effect for an unquarantined operation",
                ))
            }
        }
        if p.key != *key
            || p.binding != op.binding_digest
            || p.gateway != op.binding.receiver
            || p.fence <= op.binding.epoch
        {
            return Err(LedgerError::Mismatch(
                "no-effect proof for another binding or unfenced",
            ));
        }
        op.state = OpState::NoEffect(proof.clone());
        let (credit, fp) = (op.binding.credit, op.footprint.clone());
        self.give_back(credit, &fp)?;
        self.events.push_back(LedgerEvent::NoEffect { key: *key });
        Ok(true)
    }

    /// Applies a [`Step::Forfeit`].
    fn apply_forfeit(&mut self, key: &OpKey) -> Result<bool, LedgerError> {
        let op = self.op_mut(*key)?;
        match op.state {
            OpState::Quarantined => op.state = OpState::Forfeited { annotation: None },
            OpState::Forfeited { .. } => return Ok(false),
            _ => {
                return Err(LedgerError::WrongState(
                    "forfeit of an unquarantined operation",
                ))
            }
        }
        Ok(true)
    }

    /// Applies a [`Step::Annotate`].
    fn apply_annotate(
        &mut self,
        key: &OpKey,
        receipt: &Signed<Receipt>,
    ) -> Result<bool, LedgerError> {
        let gateway = self.op_mut(*key)?.binding.receiver.clone();
        self.evidence("a receipt", receipt, &gateway)?;
        let op = self.op_mut(*key)?;
        match &op.state {
            OpState::Forfeited { annotation: None } => {
                op.state = OpState::Forfeited {
                    annotation: Some(receipt.clone()),
                }
            }
            OpState::Forfeited { .. } => return Ok(false),
            _ => {
                return Err(LedgerError::WrongState(
                    "annotation of an unforfeited operation",
                ))
            }
        }
        Ok(true)
    }

    /// Applies a [`Step::Join`].
    fn apply_join(
        &mut self,
        step: &Step,
        inputs: &[CreditId],
        output: &CreditId,
    ) -> Result<bool, LedgerError> {
        if self.credits.contains_key(output) {
            return self.replayed(output, step, "join output");
        }
        let checked = self.config.mutation() != Some(LedgerMutation::JoinWithoutDisjointness);
        let footprint = self.join_footprint(inputs, *output, checked)?;
        let first = &self.credits[&inputs[0]];
        let (root, label) = (first.root, first.label.clone());
        // The output's label is the inputs' common lower bound.
        let label = inputs.iter().fold(label, |l, i| {
            Label(
                l.0.intersection(&self.credits[i].label.0)
                    .cloned()
                    .collect(),
            )
        });
        for i in inputs {
            let c = self.credits.get_mut(i).expect("checked");
            c.closed = true;
            c.available = Footprint::default();
        }
        self.origins.insert(*output, step.clone());
        self.credits.insert(
            *output,
            Credit {
                id: *output,
                root,
                label,
                generation: 0,
                epoch: 0,
                available: footprint,
                fenced: false,
                closed: false,
                successor: None,
            },
        );
        Ok(true)
    }

    /// Applies a [`Step::Fenced`].
    fn apply_fenced(&mut self, fenced: &Signed<Fenced>) -> Result<bool, LedgerError> {
        let gateway = fenced.peek()?.gateway;
        let f = self.evidence("a fenced reply", fenced, &gateway)?;
        // Only a gateway this credit dispatched to can fence it.
        let dispatched_there = self
            .ops
            .values()
            .any(|o| o.binding.credit == f.credit && o.binding.receiver == gateway);
        let any = self.config.mutation() == Some(LedgerMutation::EvidenceFromAnyMember);
        if !dispatched_there && !any {
            return Err(LedgerError::Mismatch(
                "fenced by a gateway the credit never used",
            ));
        }
        let c = self
            .credits
            .get_mut(&f.credit)
            .ok_or(LedgerError::UnknownCredit(f.credit))?;
        if f.epoch <= c.epoch {
            return Ok(false);
        }
        // The generation is fenced, not bumped in place: it takes no new work, and
        // closes into a fresh one (`Reissue`) once its last operation ends.
        c.epoch = f.epoch;
        c.fenced = true;
        Ok(true)
    }

    /// Applies a [`Step::Reissue`].
    fn apply_reissue(
        &mut self,
        step: &Step,
        credit: &CreditId,
        successor: &CreditId,
        last: Option<&Step>,
    ) -> Result<bool, LedgerError> {
        if self.credits.contains_key(successor) {
            return self.replayed(successor, step, "reissue target");
        }
        let c = self
            .credits
            .get(credit)
            .ok_or(LedgerError::UnknownCredit(*credit))?;
        if c.successor.is_some() {
            return Err(LedgerError::IdInUse(
                "a generation already reissued to another credit",
            ));
        }
        if c.closed {
            return Err(LedgerError::UnknownCredit(*credit));
        }
        let fused = match last {
            None => None,
            Some(Step::Settle { key, .. } | Step::NoEffect { key, .. }) => Some(*key),
            Some(_) => {
                return Err(LedgerError::WrongState(
                    "a reissue fuses only a settlement or a no-effect proof",
                ))
            }
        };
        if let Some(key) = fused {
            // Only the fenced generation's own final operation, fenced above its epoch.
            let op = self
                .ops
                .get(&key)
                .ok_or(LedgerError::UnknownOperation(key))?;
            if op.binding.credit != *credit
                || op.state != OpState::Quarantined
                || !c.fenced
                || c.epoch <= op.binding.epoch
            {
                return Err(LedgerError::WrongState(
                    "a fused reissue ends the fenced generation's own last operation",
                ));
            }
        }
        let (open, sealed) = self.in_progress(*credit);
        let lax = self.config.mutation() == Some(LedgerMutation::ReissueWithWorkInProgress);
        if (sealed || open.iter().any(|k| Some(*k) != fused)) && !lax {
            return Err(LedgerError::WrongState(
                "reissue of a generation with work in progress",
            ));
        }
        let generation = c.generation.checked_add(1).ok_or(LedgerError::Overflow)?;
        if let Some(last) = last {
            if !self.apply(last)? {
                return Err(LedgerError::WrongState("the fused step had already ended"));
            }
        }
        let c = self.credits.get_mut(credit).expect("checked");
        let available = std::mem::take(&mut c.available);
        c.closed = true;
        c.successor = Some(*successor);
        let (root, label, epoch) = (c.root, c.label.clone(), c.epoch);
        self.credits.insert(
            *successor,
            Credit {
                id: *successor,
                root,
                label,
                generation,
                epoch,
                available,
                fenced: false,
                closed: false,
                successor: None,
            },
        );
        self.origins.insert(*successor, step.clone());
        self.events.push_back(LedgerEvent::Reissued {
            credit: *credit,
            successor: *successor,
        });
        Ok(true)
    }

    /// Applies a [`Step::Refund`].
    fn apply_refund(&mut self, key: &OpKey) -> Result<bool, LedgerError> {
        let op = self.op_mut(*key)?;
        if op.state != OpState::Quarantined {
            return Ok(false);
        }
        op.state = OpState::Refunded;
        let (credit, fp) = (op.binding.credit, op.footprint.clone());
        self.give_back(credit, &fp)?;
        Ok(true)
    }

    pub(super) fn join_footprint(
        &self,
        inputs: &[CreditId],
        output: CreditId,
        checked: bool,
    ) -> Result<Footprint, LedgerError> {
        if inputs.len() < 2 {
            return Err(LedgerError::Join("fewer than two inputs"));
        }
        if self.credits.contains_key(&output) {
            return Err(LedgerError::IdInUse("join output"));
        }
        let mut seen = BTreeSet::new();
        let mut root = None;
        let mut out = Footprint::default();
        for i in inputs {
            let c = self.working_credit(*i)?;
            if checked && !seen.insert(*i) {
                return Err(LedgerError::Join("an input appears twice"));
            }
            if *root.get_or_insert(c.root) != c.root {
                return Err(LedgerError::Join("inputs of different roots"));
            }
            let busy = self.ops.values().any(|o| {
                o.binding.credit == *i
                    && matches!(o.state, OpState::Reserved | OpState::Quarantined)
            });
            let sealed = self
                .outgoing
                .values()
                .any(|o| o.body.source_credit == *i && o.state == OutgoingState::Sealed);
            if busy || sealed {
                return Err(LedgerError::Join(
                    "an input has an operation or a transfer in progress",
                ));
            }
            out = if checked {
                out.union(&c.available)
                    .ok_or(LedgerError::Join("inputs are not disjoint"))?
            } else {
                out.concat_unchecked(&c.available)
            };
        }
        Ok(out)
    }

    pub(super) fn op_mut(&mut self, key: OpKey) -> Result<&mut Operation, LedgerError> {
        self.ops
            .get_mut(&key)
            .ok_or(LedgerError::UnknownOperation(key))
    }

    pub(super) fn give_back(
        &mut self,
        credit: CreditId,
        fp: &Footprint,
    ) -> Result<(), LedgerError> {
        if fp.is_empty() {
            return Ok(());
        }
        let c = self
            .credits
            .get_mut(&credit)
            .ok_or(LedgerError::UnknownCredit(credit))?;
        c.available = c
            .available
            .union(fp)
            .ok_or(LedgerError::WrongState("returned atoms already available"))?;
        Ok(())
    }
}
