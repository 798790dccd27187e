//! Writing a batch: every [`Op`] applied to its tables in one redb transaction, one commit.

use super::*;
use crate::open::{append, Open};

impl Store {
    /// Applies `ops` in one write transaction with `Durability::Immediate`.
    pub fn commit(&mut self, ops: &[Op]) -> Result<(), StoreError> {
        self.commit_with(ops, Durability::Immediate)
    }

    /// Applies `ops` in one write transaction with the given durability. `Durability::None`
    /// is for measuring the best-effort baseline only: it promises nothing after a crash.
    pub fn commit_with(&mut self, ops: &[Op], durability: Durability) -> Result<(), StoreError> {
        if self.poisoned {
            return Err(StoreError::Poisoned);
        }
        // Any failure from here on leaves the mirrors possibly ahead of the disk.
        self.poisoned = true;
        let mut txn = self.db.begin_write()?;
        txn.set_durability(durability)?;
        txn.set_quick_repair(self.config.quick_repair);
        let mut open = Open::new(&txn);
        let t = &mut open;
        for op in ops {
            match op {
                Op::Custodian(r) => self.apply_custodian(t, r)?,
                Op::Receiver(r) => self.apply_receiver(t, r)?,
                Op::Ledger(abhyasa_ledger::Step::Checkpoint(record)) => {
                    // Compaction: the checkpoint stands for every step before it.
                    t.ledger_checkpoint()?
                        .insert(0, encode(&**record).as_slice())?;
                    t.ledger_journal()?.retain(|_, _| false)?;
                }
                Op::Ledger(step) => append(t.ledger_journal()?, &encode(step))?,
                Op::Gateway(abhyasa_ledger::GatewayRecord::Checkpoint(record)) => {
                    t.gateway_checkpoint()?
                        .insert(0, encode(&**record).as_slice())?;
                    t.gateway_log()?.retain(|_, _| false)?;
                }
                Op::Gateway(record) => append(t.gateway_log()?, &encode(record))?,
                Op::Event { event, at } => self.record_event(t, event, *at)?,
                Op::EventsDelivered { through } => {
                    let outbox = t.events_outbox()?;
                    for row in outbox.extract_from_if(..=*through, |_, _| true)? {
                        row?;
                    }
                }
            }
        }
        drop(open);
        txn.commit()
            .map_err(|e| StoreError::CommitUnknown(e.to_string()))?;
        self.poisoned = false;
        Ok(())
    }

    pub(super) fn apply_custodian(
        &mut self,
        t: &mut Open<'_>,
        record: &CustodianRecord,
    ) -> Result<(), StoreError> {
        match record {
            CustodianRecord::Pending {
                obligation,
                attempts,
                principal,
            } => {
                let row = PendingRow {
                    obligation: obligation.clone(),
                    attempts: *attempts,
                    last_observed: abhyasa_wire::LastObserved::NoAck,
                };
                t.pending()?
                    .insert(obligation.id.to_u128(), encode(&row).as_slice())?;
                self.apply_principal(t, principal.as_ref(), obligation.id)?;
            }
            CustodianRecord::Attempt {
                id,
                attempts,
                last_observed,
            } => {
                let pending = t.pending()?;
                let key = id.to_u128();
                let row = pending.get(key)?.map(|v| v.value().to_vec());
                if let Some(bytes) = row {
                    let mut row: PendingRow = rows::decode("custodian.pending", key, &bytes)?;
                    row.attempts = *attempts;
                    row.last_observed = *last_observed;
                    pending.insert(key, encode(&row).as_slice())?;
                }
            }
            CustodianRecord::Terminal {
                record,
                escalation,
                principal,
            } => {
                let key = record.obligation_id.to_u128();
                t.pending()?.remove(key)?;
                t.terminal()?.insert(key, encode(record).as_slice())?;
                t.terminal_by_time()?.insert((record.at.0, key), ())?;
                if let Some(e) = escalation {
                    t.escalations()?.insert(key, encode(e).as_slice())?;
                    t.escalations_by_time()?.insert((e.at.0, key), ())?;
                }
                if let Some(event) =
                    events::of_terminal(record, escalation.as_ref(), principal.as_ref())
                {
                    self.record_event(t, &event, record.at)?;
                }
                self.apply_principal(t, principal.as_ref(), record.obligation_id)?;
            }
            CustodianRecord::Reconciliation(note) => {
                t.notes()?
                    .insert(note.obligation_id.to_u128(), encode(note).as_slice())?;
            }
        }
        Ok(())
    }

    /// Records `event` in the outbox at `at`, unless the store keeps no events or one with its
    /// key is already recorded (within the retention).
    pub(super) fn record_event(
        &self,
        t: &mut Open<'_>,
        event: &OperatorEvent,
        at: UnixMillis,
    ) -> Result<(), StoreError> {
        if !self.config.events {
            return Ok(());
        }
        let key = event.key();
        let keys = t.event_keys()?;
        if keys.get(key.as_str())?.is_some() {
            return Ok(());
        }
        keys.insert(key.as_str(), at.0)?;
        t.event_keys_by_time()?.insert((at.0, key.as_str()), ())?;
        let meta = t.meta()?;
        let seq = meta.get(EVENTS_NEXT_SEQ)?.map_or(0, |v| v.value());
        meta.insert(EVENTS_NEXT_SEQ, seq + 1)?;
        let row = events::OutboxRow {
            key,
            at,
            event: event.clone(),
        };
        t.events_outbox()?.insert(seq, encode(&row).as_slice())?;
        Ok(())
    }

    /// Applies a principal update carried by obligation `by` to the mirror (the one place its
    /// semantics live) and writes back exactly the rows it touches.
    pub(super) fn apply_principal(
        &mut self,
        t: &mut Open<'_>,
        update: Option<&PrincipalUpdate>,
        by: ObligationId,
    ) -> Result<(), StoreError> {
        let Some(update) = update else {
            return Ok(());
        };
        if !self.principal.apply(update, by) {
            return Ok(());
        }
        match update {
            PrincipalUpdate::Grant { target, scope, .. }
            | PrincipalUpdate::AwaitGrant { target, scope, .. }
            | PrincipalUpdate::Safe(SafeAction::WithholdScope { target, scope, .. }) => {
                if let Some(a) = self.principal.authorization(target, scope) {
                    let row = rows::GovernedRow {
                        sequence: a.sequence,
                        by: a.by.map(ObligationId::to_u128),
                        state: Some(rows::KindState::Scope {
                            withheld: a.withheld,
                            until: a.until.map(|end| end.0),
                        }),
                    };
                    let key = (rows::SCOPE, target.as_str(), scope.as_str());
                    row.write(t.principal_governed()?, key)?;
                }
            }
            PrincipalUpdate::Safe(SafeAction::DownWeight {
                obligation_id,
                target,
                weight_key,
                amount,
                fold_after,
                lapses_at,
            }) => {
                t.adjustments()?.insert(
                    obligation_id.to_u128(),
                    (target.as_str(), weight_key.as_str(), *amount, fold_after.0),
                )?;
                if let Some(end) = lapses_at {
                    t.adjustment_lapses()?
                        .insert(obligation_id.to_u128(), end.0)?;
                }
            }
            PrincipalUpdate::Safe(SafeAction::StopHonouringToken { token_id, .. }) => {
                if let Some(until) = self.principal.revoked_until(token_id) {
                    let row = rows::GovernedRow {
                        sequence: None,
                        by: self
                            .principal
                            .token_revoked_by(token_id)
                            .map(ObligationId::to_u128),
                        state: Some(rows::KindState::RevokedToken {
                            until: until.map(|at| at.0),
                        }),
                    };
                    let key = (rows::TOKEN, rows::NO_PARTY, token_id.as_str());
                    row.write(t.principal_governed()?, key)?;
                }
            }
        }
        Ok(())
    }

    pub(super) fn apply_receiver(
        &mut self,
        t: &mut Open<'_>,
        record: &ReceiverRecord,
    ) -> Result<(), StoreError> {
        match record {
            ReceiverRecord::Apply {
                id,
                issuer,
                obligation,
                at,
                expires,
                sequence,
                effect,
            } => {
                // The applied id, its sequence and its effect: this one transaction.
                let key = id.to_u128();
                {
                    let log = t.apply_log()?;
                    let n = log.range((key, 0)..=(key, u32::MAX))?.count() as u32;
                    log.insert((key, n), (at.0, encode(obligation.as_ref()).as_slice()))?;
                }
                t.applied()?.insert(key, expires.0)?;
                t.applied_by_expiry()?.insert((expires.0, key), ())?;
                // The key's one row: the obligation now in force on it, its sequence and
                // what the effect left of the kind's state.
                let state = self.apply_effect(t, effect, issuer)?;
                let governed = effect.governed_key(issuer);
                let table = t.recv_governed()?;
                let gkey = rows::governed_key(&governed);
                let mut row = rows::GovernedRow::read(table, "receiver.governed", gkey)?;
                row.by = Some(key);
                if state.is_some() {
                    row.state = state;
                }
                match sequence {
                    Some((k, seq)) if *k == governed => row.sequence = Some(*seq),
                    Some((k, seq)) => {
                        let other = rows::governed_key(k);
                        let mut r = rows::GovernedRow::read(table, "receiver.governed", other)?;
                        r.sequence = Some(*seq);
                        r.write(table, other)?;
                    }
                    None => {}
                }
                row.write(table, gkey)?;
            }
            ReceiverRecord::Prune { before } => {
                let mut gone = Vec::new();
                for entry in t
                    .applied_by_expiry()?
                    .extract_from_if(..(before.0, 0u128), |_, _| true)?
                {
                    gone.push(entry?.0.value().1);
                }
                for id in gone {
                    t.applied()?.remove(id)?;
                    for e in t
                        .apply_log()?
                        .extract_from_if((id, 0)..=(id, u32::MAX), |_, _| true)?
                    {
                        e?;
                    }
                }
            }
        }
        Ok(())
    }

    /// Applies `effect` to the mirror and writes the rows of the tables a kind keeps apart
    /// (weight changes, token records); returns the kind state the key's governed row takes,
    /// for the kinds that keep it there.
    pub(super) fn apply_effect(
        &mut self,
        t: &mut Open<'_>,
        effect: &ReceiverEffect,
        issuer: &AgentId,
    ) -> Result<Option<rows::KindState>, StoreError> {
        self.receiver.apply(effect);
        match effect {
            ReceiverEffect::WithholdScope(issuer, scope)
            | ReceiverEffect::GrantScope(issuer, scope, _) => {
                return Ok(Some(rows::KindState::Scope {
                    withheld: self.receiver.is_withheld(issuer, scope),
                    until: self.receiver.lease(issuer, scope).map(|end| end.0),
                }));
            }
            ReceiverEffect::AdjustWeight(issuer, key, change) => {
                t.weight_changes()?.insert(
                    change.by.to_u128(),
                    (
                        issuer.as_str(),
                        key.as_str(),
                        change.delta,
                        change.lapses_at.0,
                    ),
                )?;
            }
            ReceiverEffect::DropToken(token, _) | ReceiverEffect::CacheToken(token, _) => {
                // The token's record, with every issuer that acted on it: at the record's
                // expiry, maintenance deletes their rows with it.
                if let Some((dropped, until)) = self.receiver.token_record(token) {
                    let table = t.recv_governed()?;
                    let key = (rows::TOKEN, rows::NO_PARTY, token.as_str());
                    let mut row = rows::GovernedRow::read(table, "receiver.governed", key)?;
                    let mut issuers = match row.state {
                        Some(rows::KindState::Token { issuers, .. }) => issuers,
                        _ => Vec::new(),
                    };
                    if !issuers.iter().any(|i| i == issuer.as_str()) {
                        issuers.push(issuer.as_str().to_owned());
                    }
                    row.state = Some(rows::KindState::Token {
                        dropped,
                        until: until.map(|at| at.0),
                        issuers,
                    });
                    row.write(table, key)?;
                }
            }
        }
        Ok(None)
    }
}
