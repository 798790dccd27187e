//! Writing a batch: every [`Op`] applied to its tables in one redb transaction, one commit.

use super::*;

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
        for op in ops {
            match op {
                Op::Custodian(r) => self.apply_custodian(&txn, r)?,
                Op::Receiver(r) => self.apply_receiver(&txn, r)?,
                Op::Ledger(abhyasa_ledger::Step::Checkpoint(record)) => {
                    // Compaction: the checkpoint stands for every step before it.
                    txn.open_table(LEDGER_CHECKPOINT)?
                        .insert(0, encode(&**record).as_slice())?;
                    txn.open_table(LEDGER_JOURNAL)?.retain(|_, _| false)?;
                }
                Op::Ledger(step) => append(&txn, LEDGER_JOURNAL, &encode(step))?,
                Op::Gateway(abhyasa_ledger::GatewayRecord::Checkpoint(record)) => {
                    txn.open_table(GATEWAY_CHECKPOINT)?
                        .insert(0, encode(&**record).as_slice())?;
                    txn.open_table(GATEWAY_LOG)?.retain(|_, _| false)?;
                }
                Op::Gateway(record) => append(&txn, GATEWAY_LOG, &encode(record))?,
                Op::Event { event, at } => self.record_event(&txn, event, *at)?,
                Op::EventsDelivered { through } => {
                    let mut outbox = txn.open_table(EVENTS_OUTBOX)?;
                    for row in outbox.extract_from_if(..=*through, |_, _| true)? {
                        row?;
                    }
                }
            }
        }
        txn.commit()
            .map_err(|e| StoreError::CommitUnknown(e.to_string()))?;
        self.poisoned = false;
        Ok(())
    }

    pub(super) fn apply_custodian(
        &mut self,
        txn: &WriteTransaction,
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
                txn.open_table(PENDING)?
                    .insert(obligation.id.to_u128(), encode(&row).as_slice())?;
                self.apply_principal(txn, principal.as_ref(), obligation.id)?;
            }
            CustodianRecord::Attempt {
                id,
                attempts,
                last_observed,
            } => {
                let mut pending = txn.open_table(PENDING)?;
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
                txn.open_table(PENDING)?.remove(key)?;
                txn.open_table(TERMINAL)?
                    .insert(key, encode(record).as_slice())?;
                txn.open_table(TERMINAL_BY_TIME)?
                    .insert((record.at.0, key), ())?;
                if let Some(e) = escalation {
                    txn.open_table(ESCALATIONS)?
                        .insert(key, encode(e).as_slice())?;
                    txn.open_table(ESCALATIONS_BY_TIME)?
                        .insert((e.at.0, key), ())?;
                }
                if let Some(event) =
                    events::of_terminal(record, escalation.as_ref(), principal.as_ref())
                {
                    self.record_event(txn, &event, record.at)?;
                }
                self.apply_principal(txn, principal.as_ref(), record.obligation_id)?;
            }
            CustodianRecord::Reconciliation(note) => {
                txn.open_table(NOTES)?
                    .insert(note.obligation_id.to_u128(), encode(note).as_slice())?;
            }
        }
        Ok(())
    }

    /// Records `event` in the outbox at `at`, unless the store keeps no events or one with its
    /// key is already recorded (within the retention).
    pub(super) fn record_event(
        &self,
        txn: &WriteTransaction,
        event: &OperatorEvent,
        at: UnixMillis,
    ) -> Result<(), StoreError> {
        if !self.config.events {
            return Ok(());
        }
        let key = event.key();
        let mut keys = txn.open_table(EVENT_KEYS)?;
        if keys.get(key.as_str())?.is_some() {
            return Ok(());
        }
        keys.insert(key.as_str(), at.0)?;
        txn.open_table(EVENT_KEYS_BY_TIME)?
            .insert((at.0, key.as_str()), ())?;
        let mut meta = txn.open_table(META)?;
        let seq = meta.get(EVENTS_NEXT_SEQ)?.map_or(0, |v| v.value());
        meta.insert(EVENTS_NEXT_SEQ, seq + 1)?;
        let row = events::OutboxRow {
            key,
            at,
            event: event.clone(),
        };
        txn.open_table(EVENTS_OUTBOX)?
            .insert(seq, encode(&row).as_slice())?;
        Ok(())
    }

    /// Applies a principal update carried by obligation `by` to the mirror (the one place its
    /// semantics live) and writes back exactly the rows it touches.
    pub(super) fn apply_principal(
        &mut self,
        txn: &WriteTransaction,
        update: Option<&PrincipalUpdate>,
        by: ObligationId,
    ) -> Result<(), StoreError> {
        let Some(update) = update else {
            return Ok(());
        };
        let held_token = match update {
            PrincipalUpdate::Safe(SafeAction::StopHonouringToken { token_id, .. }) => {
                self.principal.revoked_until(token_id).flatten()
            }
            _ => None,
        };
        if !self.principal.apply(update, by) {
            return Ok(());
        }
        match update {
            PrincipalUpdate::Grant { target, scope, .. }
            | PrincipalUpdate::AwaitGrant { target, scope, .. }
            | PrincipalUpdate::Safe(SafeAction::WithholdScope { target, scope, .. }) => {
                if let Some(a) = self.principal.authorization(target, scope) {
                    let key = (target.as_str(), scope.as_str());
                    txn.open_table(AUTHORIZATIONS)?
                        .insert(key, (a.withheld, a.sequence))?;
                    if let Some(by) = a.by {
                        txn.open_table(AUTHORIZATION_BY)?
                            .insert(key, by.to_u128())?;
                    }
                    let mut leases = txn.open_table(AUTHORIZATION_UNTIL)?;
                    match a.until {
                        Some(end) => leases.insert(key, end.0)?,
                        None => leases.remove(key)?,
                    };
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
                txn.open_table(ADJUSTMENTS)?.insert(
                    obligation_id.to_u128(),
                    (target.as_str(), weight_key.as_str(), *amount, fold_after.0),
                )?;
                if let Some(end) = lapses_at {
                    txn.open_table(ADJUSTMENT_LAPSES)?
                        .insert(obligation_id.to_u128(), end.0)?;
                }
            }
            PrincipalUpdate::Safe(SafeAction::StopHonouringToken { token_id, .. }) => {
                txn.open_table(REVOKED_TOKENS)?
                    .insert(token_id.as_str(), ())?;
                if let Some(by) = self.principal.token_revoked_by(token_id) {
                    txn.open_table(TOKEN_REVOKED_BY)?
                        .insert(token_id.as_str(), by.to_u128())?;
                }
                let mut by_expiry = txn.open_table(REVOKED_TOKENS_BY_EXPIRY)?;
                if let Some(at) = held_token {
                    by_expiry.remove((at.0, token_id.as_str()))?;
                }
                if let Some(Some(at)) = self.principal.revoked_until(token_id) {
                    by_expiry.insert((at.0, token_id.as_str()), ())?;
                }
            }
        }
        Ok(())
    }

    pub(super) fn apply_receiver(
        &mut self,
        txn: &WriteTransaction,
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
                    let mut log = txn.open_table(RECV_APPLY_LOG)?;
                    let n = log.range((key, 0)..=(key, u32::MAX))?.count() as u32;
                    log.insert((key, n), (at.0, encode(obligation.as_ref()).as_slice()))?;
                }
                let governed = effect.governed_key(issuer);
                txn.open_table(GOVERNED_BY)?
                    .insert(rows::governed_key(&governed), key)?;
                txn.open_table(APPLIED)?.insert(key, expires.0)?;
                txn.open_table(APPLIED_BY_EXPIRY)?
                    .insert((expires.0, key), ())?;
                if let Some((governed, seq)) = sequence {
                    txn.open_table(LAST_SEQUENCE)?
                        .insert(rows::governed_key(governed), *seq)?;
                }
                self.apply_effect(txn, effect, issuer)?;
            }
            ReceiverRecord::Prune { before } => {
                let mut by_expiry = txn.open_table(APPLIED_BY_EXPIRY)?;
                let mut applied = txn.open_table(APPLIED)?;
                let mut log = txn.open_table(RECV_APPLY_LOG)?;
                let gone = by_expiry.extract_from_if(..(before.0, 0u128), |_, _| true)?;
                for entry in gone {
                    let (k, _) = entry?;
                    let id = k.value().1;
                    applied.remove(id)?;
                    for e in log.extract_from_if((id, 0)..=(id, u32::MAX), |_, _| true)? {
                        e?;
                    }
                }
            }
        }
        Ok(())
    }

    pub(super) fn apply_effect(
        &mut self,
        txn: &WriteTransaction,
        effect: &ReceiverEffect,
        issuer: &AgentId,
    ) -> Result<(), StoreError> {
        let held_token = match effect {
            ReceiverEffect::DropToken(token, _) | ReceiverEffect::CacheToken(token, _) => {
                self.receiver.token_record(token)
            }
            _ => None,
        };
        self.receiver.apply(effect);
        match effect {
            ReceiverEffect::WithholdScope(issuer, scope)
            | ReceiverEffect::GrantScope(issuer, scope, _) => {
                let key = (issuer.as_str(), scope.as_str());
                let mut t = txn.open_table(RECV_WITHHELD)?;
                if self.receiver.is_withheld(issuer, scope) {
                    t.insert(key, ())?;
                } else {
                    t.remove(key)?;
                }
                let mut leases = txn.open_table(RECV_LEASES)?;
                match self.receiver.lease(issuer, scope) {
                    Some(end) => leases.insert(key, end.0)?,
                    None => leases.remove(key)?,
                };
            }
            ReceiverEffect::AdjustWeight(issuer, key, change) => {
                txn.open_table(RECV_WEIGHT_CHANGES)?.insert(
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
                let now = self.receiver.token_record(token);
                if let Some((dropped, _)) = now {
                    txn.open_table(RECV_TOKENS)?
                        .insert(token.as_str(), dropped)?;
                }
                // The expiry rows follow the record's expiry; the issuers named by the old
                // rows move with it, so each governed-by row and last sequence is forgotten
                // with the record. A record kept for good has its rows at `FOR_GOOD`, so its
                // issuers move too when another issuer gives the token an expiry.
                let mut by_expiry = txn.open_table(RECV_TOKENS_BY_EXPIRY)?;
                let mut issuers = vec![issuer.as_str().to_owned()];
                let row_at = |e: Option<UnixMillis>| e.map_or(FOR_GOOD, |e| e.0);
                let old = held_token.map(|(_, e)| row_at(e));
                let new = now.map(|(_, e)| row_at(e));
                if let Some(at) = old.filter(|at| Some(*at) != new) {
                    issuers.extend(token_expiry_rows(&mut by_expiry, at, token.as_str(), true)?);
                }
                if let Some(at) = new {
                    for i in &issuers {
                        by_expiry.insert((at, token.as_str(), i.as_str()), ())?;
                    }
                }
            }
        }
        Ok(())
    }
}
