//! Gateway checkpoints: the acceptance log's live state in one record signed by the
//! gateway, so the log before it can go. What a `Pruned` record forgot is gone from it; what
//! remains — live acceptances with their permits and receipts, fences, the horizon — is kept
//! whole. Recovery verifies the checkpoint's signature with the gateway's own key and
//! starts from it, trusting its rows as a replay of the log trusts the log's records (the
//! signature covers them all); the log auditor verifies every permit and receipt again.

use std::collections::BTreeMap;

use abhyasa_wire::ledger::*;
use abhyasa_wire::{AgentId, UnixMillis};
use serde::{Deserialize, Serialize};

use super::{Acceptance, AcceptanceState, Gateway, GatewayRecord};
use crate::{LedgerError, PersistToken};

/// The domain tag a gateway checkpoint's signature covers.
const TAG: &str = "gateway_checkpoint";

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct Row {
    payer: AgentId,
    binding: Binding,
    permit: Signed<Permit>,
    effect: Effect,
    receipt: Option<Signed<Receipt>>,
    accepted: u32,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct GatewaySnapshot {
    gateway: AgentId,
    /// Log records folded into this checkpoint, over every compaction so far.
    folded_records: u64,
    horizon: UnixMillis,
    fences: Vec<(CreditId, u64)>,
    log: Vec<Row>,
}

/// What the log auditor reads from a gateway checkpoint.
pub(crate) struct GatewaySeed {
    pub(crate) horizon: UnixMillis,
    pub(crate) fences: Vec<(CreditId, u64)>,
    /// (payer, key), binding, receipted.
    pub(crate) log: Vec<((AgentId, OpKey), Binding, bool)>,
    /// Each row's permit and receipt, for the auditor to verify.
    pub(crate) evidence: Vec<(Signed<Permit>, Option<Signed<Receipt>>)>,
}

impl GatewaySnapshot {
    pub(crate) fn open(
        record: &SignedRecord,
        gateway: &AgentId,
        keys: &crate::Keyring,
    ) -> Result<Self, LedgerError> {
        let s: GatewaySnapshot =
            crate::open_checkpoint(record, gateway, keys, TAG, "a gateway checkpoint")?;
        if &s.gateway != gateway {
            return Err(LedgerError::WrongState("checkpoint of another gateway"));
        }
        Ok(s)
    }

    pub(crate) fn seed(&self) -> GatewaySeed {
        GatewaySeed {
            horizon: self.horizon,
            fences: self.fences.clone(),
            log: self
                .log
                .iter()
                .map(|r| {
                    (
                        (r.payer.clone(), r.binding.key),
                        r.binding.clone(),
                        r.receipt.is_some(),
                    )
                })
                .collect(),
            evidence: self
                .log
                .iter()
                .map(|r| (r.permit.clone(), r.receipt.clone()))
                .collect(),
        }
    }
}

impl Gateway {
    /// Compact the log at the next poll once this many records were written since the last
    /// checkpoint (and at least half as many as the log has live acceptances); 0: never.
    pub fn checkpointing(mut self, records: u64) -> Self {
        self.checkpoint_records = records;
        self
    }

    /// Queues a checkpoint of the gateway's state behind every record queued before it
    /// (a store deletes the log before it in the commit that writes it). Returns the
    /// records it stands for.
    pub fn checkpoint(&mut self) -> u64 {
        let folded = self.records;
        let snap = self.snapshot(self.folded_records + folded);
        let record = SignedRecord::sign(TAG, abhyasa_wire::encode(&snap), &self.me, &self.key);
        self.folded_records += folded;
        self.records = 1;
        let t = PersistToken(self.next_token);
        self.next_token += 1;
        self.persists
            .push_back((t, GatewayRecord::Checkpoint(Box::new(record))));
        folded
    }

    /// Log records folded into the checkpoint the log starts with (0 without one).
    pub fn folded_records(&self) -> u64 {
        self.folded_records
    }

    pub(super) fn checkpoint_due(&self) -> bool {
        let every = self.checkpoint_records;
        every > 0 && self.records >= every.max(self.log.len() as u64 / 2)
    }

    fn snapshot(&self, folded_records: u64) -> GatewaySnapshot {
        GatewaySnapshot {
            gateway: self.me.clone(),
            folded_records,
            horizon: self.horizon,
            fences: self.fences.iter().map(|(c, e)| (*c, *e)).collect(),
            log: self
                .log
                .iter()
                .map(|((payer, _), a)| Row {
                    payer: payer.clone(),
                    binding: a.binding.clone(),
                    permit: a.permit.clone(),
                    effect: a.effect.clone(),
                    receipt: match &a.state {
                        AcceptanceState::Done(r) => Some(r.clone()),
                        AcceptanceState::Accepted => None,
                    },
                    accepted: a.accepted,
                })
                .collect(),
        }
    }

    /// Applies a checkpoint record: first in a log, the gateway becomes its state (each row
    /// consistent with its permit and receipt); after other records, the state replayed so far
    /// must be exactly the checkpoint's. A checkpoint that fails either is skipped and the
    /// gateway stays as it was.
    pub(super) fn apply_checkpoint(&mut self, record: &SignedRecord) -> Result<(), LedgerError> {
        let snap = GatewaySnapshot::open(record, &self.me, &self.keys)?;
        if self.records > 0 || self.folded_records > 0 {
            let total = self.folded_records + self.records;
            if self.snapshot(total) != snap {
                return Err(LedgerError::WrongState(
                    "gateway checkpoint does not match the log before it",
                ));
            }
            self.folded_records = total;
            self.records = 0;
            return Ok(());
        }
        let mut log = BTreeMap::new();
        for r in snap.log {
            let p = r.permit.peek()?;
            if p.binding != r.binding || r.binding.payer != r.payer {
                return Err(LedgerError::Mismatch(
                    "checkpoint row other than its permit",
                ));
            }
            let state = match r.receipt {
                Some(receipt) => {
                    let body = receipt.peek()?;
                    if body.key != r.binding.key || body.binding != r.binding.digest() {
                        return Err(LedgerError::Mismatch(
                            "checkpoint receipt of another binding",
                        ));
                    }
                    AcceptanceState::Done(receipt)
                }
                None => AcceptanceState::Accepted,
            };
            let a = Acceptance {
                binding: r.binding,
                permit: r.permit,
                effect: r.effect,
                state,
                accepted: r.accepted,
                receipt_durable: false,
            };
            if log.insert((r.payer, a.binding.key), a).is_some() {
                return Err(LedgerError::WrongState(
                    "checkpoint names an acceptance twice",
                ));
            }
        }
        let mut fences = BTreeMap::new();
        for (c, e) in snap.fences {
            if fences.insert(c, e).is_some() {
                return Err(LedgerError::WrongState("checkpoint names a fence twice"));
            }
        }
        self.log = log;
        self.fences = fences;
        self.horizon = snap.horizon;
        self.folded_records = snap.folded_records;
        Ok(())
    }
}
