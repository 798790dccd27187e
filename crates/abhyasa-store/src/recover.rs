//! Recovery: the state each machine restarts from, read back from the tables.

use super::*;

impl Store {
    /// What a custodian needs to resume: reads only the pending set, the principal state and
    /// the `recent` latest escalations — never the terminal history.
    pub fn custodian_recovery(&self, recent: usize) -> Result<CustodianRecovery, StoreError> {
        let txn = self.db.begin_read()?;
        let mut pending = Vec::new();
        let mut corrupt = Vec::new();
        for entry in txn.open_table(PENDING)?.iter()? {
            let (k, v) = entry?;
            match rows::decode::<PendingRow>("custodian.pending", k.value(), v.value()) {
                Ok(row) => pending.push(row.into()),
                Err(e) => corrupt.push(e),
            }
        }
        let escalations = txn.open_table(ESCALATIONS)?;
        let notes = txn.open_table(NOTES)?;
        let mut escalated = Vec::new();
        for entry in txn
            .open_table(ESCALATIONS_BY_TIME)?
            .iter()?
            .rev()
            .take(recent)
        {
            let id = entry?.0.value().1;
            if let Some(v) = escalations.get(id)? {
                let e: Escalation = rows::decode("custodian.escalations", id, v.value())?;
                escalated.push(EscalatedRecord {
                    id: e.obligation_id,
                    target: e.target,
                    reconciled: notes.get(id)?.is_some(),
                });
            }
        }
        escalated.reverse();
        Ok(CustodianRecovery {
            pending,
            principal: self.principal.clone(),
            escalated,
            corrupt,
        })
    }

    /// Recovers a custodian: original deadlines and attempt counts, overdue ones escalate at
    /// the first `handle_timeout`.
    pub fn recover_custodian(
        &self,
        agent: AgentId,
        config: CustodianConfig,
        seed: u64,
        now: UnixMillis,
    ) -> Result<Custodian, StoreError> {
        let r = self.custodian_recovery(config.escalation_memory)?;
        // Fail closed: a pending row that does not read is an obligation under custody that
        // would otherwise vanish without an outcome.
        if let Some(e) = r.corrupt.into_iter().next() {
            return Err(e);
        }
        Ok(Custodian::recover(
            agent,
            config,
            seed,
            r.principal,
            r.pending,
            r.escalated,
            now,
        ))
    }

    /// Recovers a receiver: its applied ids, last sequences and effect state as one commit
    /// left them.
    pub fn recover_receiver(
        &self,
        agent: AgentId,
        config: ReceiverConfig,
    ) -> Result<Receiver, StoreError> {
        let txn = self.db.begin_read()?;
        let mut applied = Vec::new();
        let log = txn.open_table(RECV_APPLY_LOG)?;
        for entry in txn.open_table(APPLIED)?.iter()? {
            let (k, v) = entry?;
            // The obligation applied under this id (its first entry in the apply log, written
            // in the same commit): its digest tells a different obligation under the same id.
            // Its issuer, from the same row: whose per-issuer count the id is in.
            let row = log.get((k.value(), 0))?;
            let digest = row
                .as_ref()
                .map(|row| abhyasa_wire::Obligation::digest_of_encoded(row.value().1));
            let issuer = match &row {
                Some(row) => Some(
                    abhyasa_wire::decode_obligation(row.value().1)
                        .map_err(|e| StoreError::Corrupt {
                            table: "receiver.apply_log",
                            key: ObligationId::from_u128(k.value()).to_string(),
                            detail: e.to_string(),
                        })?
                        .issuer,
                ),
                None => None,
            };
            applied.push(AppliedRecord {
                id: ObligationId::from_u128(k.value()),
                expires: UnixMillis(v.value()),
                digest,
                issuer,
            });
        }
        let mut governed = Vec::new();
        let mut sequences = Vec::new();
        for entry in txn.open_table(RECV_GOVERNED)?.iter()? {
            let (k, v) = entry?;
            let (kind, issuer, name) = k.value();
            if issuer == rows::NO_PARTY {
                continue; // a token's record: state, read by `load_receiver_state`
            }
            // The kind's state is the mirror's (`load_receiver_state`): not decoded here.
            let (sequence, by, _) = v.value();
            let Some(key) = rows::parse_governed_key(kind, issuer, name) else {
                return Err(StoreError::Corrupt {
                    table: "receiver.governed",
                    key: format!("{kind}/{issuer}/{name}"),
                    detail: "unreadable governed key".into(),
                });
            };
            if let Some(seq) = sequence {
                sequences.push((key.clone(), seq));
            }
            if by.is_some() {
                governed.push(key);
            }
        }
        Ok(Receiver::recover(
            agent,
            config,
            applied,
            sequences,
            governed,
            self.receiver.clone(),
        ))
    }

    pub(super) fn load_principal(&self) -> Result<PrincipalState, StoreError> {
        let txn = self.db.begin_read()?;
        let mut auths = Vec::new();
        let mut tokens = Vec::new();
        let mut revoked_by = Vec::new();
        for entry in txn.open_table(PRINCIPAL_GOVERNED)?.iter()? {
            let (k, v) = entry?;
            let t = "principal.governed";
            let row = rows::GovernedRow::decode(t, k.value(), v.value())?;
            match (k.value(), row.state) {
                (
                    (rows::SCOPE, target, scope),
                    Some(rows::KindState::Scope { withheld, until }),
                ) => auths.push((
                    (
                        rows::name(t, target, AgentId::new)?,
                        rows::name(t, scope, Scope::new)?,
                    ),
                    Authorization {
                        withheld,
                        sequence: row.sequence,
                        by: row.by.map(ObligationId::from_u128),
                        until: until.filter(|_| !withheld).map(UnixMillis),
                    },
                )),
                (
                    (rows::TOKEN, rows::NO_PARTY, token),
                    Some(rows::KindState::RevokedToken { until }),
                ) => {
                    let token = rows::name(t, token, TokenId::new)?;
                    if let Some(by) = row.by {
                        revoked_by.push((token.clone(), ObligationId::from_u128(by)));
                    }
                    tokens.push((token, until.map(UnixMillis)));
                }
                ((kind, party, name), _) => {
                    return Err(StoreError::Corrupt {
                        table: t,
                        key: format!("{kind}/{party}/{name}"),
                        detail: "not a row this layout writes".into(),
                    })
                }
            }
        }
        let mut bases = Vec::new();
        for entry in txn.open_table(ROUTING_BASE)?.iter()? {
            let (k, v) = entry?;
            let (target, key) = k.value();
            let t = "principal.routing_base";
            bases.push((
                (
                    rows::name(t, target, AgentId::new)?,
                    rows::name(t, key, WeightKey::new)?,
                ),
                v.value(),
            ));
        }
        let mut adjustments = Vec::new();
        let lapses = txn.open_table(ADJUSTMENT_LAPSES)?;
        for entry in txn.open_table(ADJUSTMENTS)?.iter()? {
            let (k, v) = entry?;
            let (target, key, amount, fold_after) = v.value();
            let t = "principal.adjustments";
            adjustments.push((
                ObligationId::from_u128(k.value()),
                Adjustment {
                    target: rows::name(t, target, AgentId::new)?,
                    weight_key: rows::name(t, key, WeightKey::new)?,
                    amount,
                    fold_after: UnixMillis(fold_after),
                    lapses_at: lapses.get(k.value())?.map(|v| UnixMillis(v.value())),
                },
            ));
        }
        Ok(PrincipalState::from_parts(
            self.config.principal_weights,
            auths,
            bases,
            adjustments,
            tokens,
        )
        .with_token_revocations(revoked_by))
    }

    pub(super) fn load_receiver_state(&self) -> Result<ReceiverState, StoreError> {
        let txn = self.db.begin_read()?;
        let mut withheld = Vec::new();
        let mut leases = Vec::new();
        let (mut dropped, mut cached) = (Vec::new(), Vec::new());
        for entry in txn.open_table(RECV_GOVERNED)?.iter()? {
            let (k, v) = entry?;
            let t = "receiver.governed";
            let row = rows::GovernedRow::decode(t, k.value(), v.value())?;
            let (_, party, name) = k.value();
            match row.state {
                Some(rows::KindState::Scope { withheld: w, until }) => {
                    let key = (
                        rows::name(t, party, AgentId::new)?,
                        rows::name(t, name, Scope::new)?,
                    );
                    if let Some(end) = until {
                        leases.push((key.clone(), UnixMillis(end)));
                    }
                    if w {
                        withheld.push(key);
                    }
                }
                Some(rows::KindState::Token {
                    dropped: d, until, ..
                }) => {
                    let token = (rows::name(t, name, TokenId::new)?, until.map(UnixMillis));
                    if d {
                        dropped.push(token);
                    } else {
                        cached.push(token);
                    }
                }
                Some(rows::KindState::RevokedToken { .. }) | None => {}
            }
        }
        let mut weights = Vec::new();
        for entry in txn.open_table(RECV_WEIGHTS)?.iter()? {
            let (k, v) = entry?;
            let (issuer, key) = k.value();
            let t = "receiver.weights";
            weights.push((
                (
                    rows::name(t, issuer, AgentId::new)?,
                    rows::name(t, key, WeightKey::new)?,
                ),
                v.value(),
            ));
        }
        let mut changes = Vec::new();
        for entry in txn.open_table(RECV_WEIGHT_CHANGES)?.iter()? {
            let (k, v) = entry?;
            let (issuer, key, delta, lapses_at) = v.value();
            let t = "receiver.weight_changes";
            changes.push((
                rows::name(t, issuer, AgentId::new)?,
                rows::name(t, key, WeightKey::new)?,
                WeightChange {
                    by: ObligationId::from_u128(k.value()),
                    delta,
                    lapses_at: UnixMillis(lapses_at),
                },
            ));
        }
        let (min, max) = self.config.receiver_weights;
        Ok(
            ReceiverState::from_parts(withheld, weights, dropped, cached)
                .with_bounds(min, max)
                .with_weight_changes(changes)
                .with_leases(leases),
        )
    }
}
