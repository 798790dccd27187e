//! Maintenance: retention (terminal records, escalations, the apply log, notes), expired
//! tokens, and the ended leases recorded for the operator.

use super::*;

impl Store {
    /// Folds principal adjustments, prunes old terminal records, escalations and notes within
    /// the configured bounds, and compacts the file when enough was pruned. One transaction.
    pub fn maintain(&mut self, now: UnixMillis) -> Result<Maintenance, StoreError> {
        if self.poisoned {
            return Err(StoreError::Poisoned);
        }
        self.poisoned = true;
        let mut report = Maintenance::default();
        let txn = self.db.begin_write()?;
        {
            let folded = self.principal.fold(now);
            report.folded = folded.len();
            let mut adjustments = txn.open_table(ADJUSTMENTS)?;
            let mut lapses = txn.open_table(ADJUSTMENT_LAPSES)?;
            let mut bases = txn.open_table(ROUTING_BASE)?;
            for (id, target, key) in folded {
                adjustments.remove(id.to_u128())?;
                lapses.remove(id.to_u128())?;
                if let Some(base) = self.principal.routing_base(&target, &key) {
                    bases.insert((target.as_str(), key.as_str()), base)?;
                }
            }
            let mut changes = txn.open_table(RECV_WEIGHT_CHANGES)?;
            let lapsed = self
                .receiver
                .lapse_weights(now, self.config.max_prune_per_call);
            report.weights_lapsed = lapsed.len();
            for (_, _, by) in lapsed {
                changes.remove(by.to_u128())?;
            }
        }
        let budget = self.config.max_prune_per_call;
        {
            let mut principal = txn.open_table(PRINCIPAL_GOVERNED)?;
            for (token, _) in self.principal.expire_tokens(now, budget) {
                principal.remove((rows::TOKEN, rows::NO_PARTY, token.as_str()))?;
                report.tokens_expired += 1;
            }
            // The agent's record goes with the rows of every issuer that acted on the token.
            let mut governed = txn.open_table(RECV_GOVERNED)?;
            for (token, _) in self.receiver.expire_tokens(now, budget) {
                let key = (rows::TOKEN, rows::NO_PARTY, token.as_str());
                let row = rows::GovernedRow::read(&governed, "receiver.governed", key)?;
                if let Some(rows::KindState::Token { issuers, .. }) = row.state {
                    for issuer in issuers {
                        governed.remove((rows::TOKEN, issuer.as_str(), token.as_str()))?;
                    }
                }
                governed.remove(key)?;
                report.tokens_expired += 1;
            }
        }
        let cutoff = now.0.saturating_sub(self.config.retention_ms);
        report.terminal_pruned = prune_by_time(
            &txn,
            TERMINAL_BY_TIME,
            TERMINAL,
            cutoff,
            self.config.max_terminal,
            budget,
        )?;
        let notes = {
            let mut n = Vec::new();
            let by_time = txn.open_table(ESCALATIONS_BY_TIME)?;
            for entry in by_time.range(..(cutoff, 0u128))?.take(budget) {
                n.push(entry?.0.value().1);
            }
            n
        };
        report.escalations_pruned = prune_by_time(
            &txn,
            ESCALATIONS_BY_TIME,
            ESCALATIONS,
            cutoff,
            u64::MAX,
            budget,
        )?;
        {
            let mut t = txn.open_table(NOTES)?;
            for id in notes {
                t.remove(id)?;
            }
        }
        if self.config.events {
            report.leases_ended = self.record_ended_leases(&txn, now, budget)?;
            // A key is remembered as long as a terminal record: an event recorded again
            // after that carries the same key.
            let mut keys = txn.open_table(EVENT_KEYS)?;
            let mut by_time = txn.open_table(EVENT_KEYS_BY_TIME)?;
            for row in by_time
                .extract_from_if(..(cutoff, ""), |_, _| true)?
                .take(budget)
            {
                let (k, _) = row?;
                keys.remove(k.value().1)?;
            }
        }
        txn.commit()
            .map_err(|e| StoreError::CommitUnknown(e.to_string()))?;
        self.pruned_since_compaction +=
            (report.terminal_pruned + report.escalations_pruned + report.tokens_expired) as u64;
        if self.pruned_since_compaction >= self.config.compact_after_pruned {
            report.compacted = self.db.compact()?;
            self.pruned_since_compaction = 0;
        }
        self.poisoned = false;
        Ok(report)
    }

    /// Records every lease that ended by `now` (the principal's grants and the agent's held
    /// scopes) and is not recorded yet, at most `budget` of them.
    pub(super) fn record_ended_leases(
        &self,
        txn: &WriteTransaction,
        now: UnixMillis,
        budget: usize,
    ) -> Result<usize, StoreError> {
        let principal = self
            .principal
            .authorizations()
            .filter_map(|((agent, scope), a)| match a.until {
                Some(end) if !a.withheld && end <= now => {
                    Some((LeaseSide::Principal, agent, scope, end))
                }
                _ => None,
            });
        let agent = self
            .receiver
            .leases()
            .filter(|(_, end)| *end <= now)
            .map(|((issuer, scope), end)| (LeaseSide::Agent, issuer, scope, end));
        let mut recorded = 0;
        let keys = txn.open_table(EVENT_KEYS)?;
        let mut ended = Vec::new();
        for (side, agent, scope, end) in principal.chain(agent) {
            let event = OperatorEvent::LeaseEnded {
                side,
                agent: agent.clone(),
                scope: scope.clone(),
                ended_at: end,
            };
            if keys.get(event.key().as_str())?.is_none() {
                ended.push(event);
                if ended.len() >= budget {
                    break;
                }
            }
        }
        drop(keys);
        let mut open = crate::open::Open::new(txn);
        for event in ended {
            self.record_event(&mut open, &event, now)?;
            recorded += 1;
        }
        Ok(recorded)
    }
}
