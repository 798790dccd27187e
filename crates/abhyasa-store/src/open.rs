//! The tables one write transaction has open: each opened when a record first needs it and
//! kept until the commit.
//!
//! Opening and closing a redb table costs about as much as the insert it serves, and a busy
//! group commit writes thousands of records, each touching two to five tables; opened once
//! per record, the opening was a quarter of the writer's CPU (docs/BENCHMARKS.md, "The
//! writer's tables, opened once per commit"). A table is still opened only if some record
//! needs it, so a commit creates no table the code before this did not.

use redb::{ReadableTable, Table, WriteTransaction};

use crate::tables::*;
use crate::StoreError;

macro_rules! open_tables {
    ($($(#[$doc:meta])* $field:ident: $def:ident <$k:ty, $v:ty>,)*) => {
        /// The open tables of one write transaction; drop it before the commit.
        pub(crate) struct Open<'txn> {
            txn: &'txn WriteTransaction,
            $($field: Option<Table<'txn, $k, $v>>,)*
        }

        impl<'txn> Open<'txn> {
            /// Nothing open yet.
            pub(crate) fn new(txn: &'txn WriteTransaction) -> Self {
                Self {
                    txn,
                    $($field: None,)*
                }
            }

            $(
                $(#[$doc])*
                pub(crate) fn $field(&mut self) -> Result<&mut Table<'txn, $k, $v>, StoreError> {
                    let txn = self.txn;
                    Ok(match &mut self.$field {
                        Some(table) => table,
                        slot => slot.insert(txn.open_table($def)?),
                    })
                }
            )*
        }
    };
}

type Str = &'static str;
type Bytes = &'static [u8];

open_tables! {
    /// `meta`.
    meta: META<Str, u64>,
    /// `custodian.pending`.
    pending: PENDING<u128, Bytes>,
    /// `custodian.terminal`.
    terminal: TERMINAL<u128, Bytes>,
    /// `custodian.terminal_by_time`.
    terminal_by_time: TERMINAL_BY_TIME<(u64, u128), ()>,
    /// `custodian.escalations`.
    escalations: ESCALATIONS<u128, Bytes>,
    /// `custodian.escalations_by_time`.
    escalations_by_time: ESCALATIONS_BY_TIME<(u64, u128), ()>,
    /// `custodian.notes`.
    notes: NOTES<u128, Bytes>,
    /// `principal.governed`.
    principal_governed: PRINCIPAL_GOVERNED<(u8, Str, Str), (Option<u64>, Option<u128>, Bytes)>,
    /// `principal.adjustments`.
    adjustments: ADJUSTMENTS<u128, (Str, Str, u32, u64)>,
    /// `principal.adjustment_lapses`.
    adjustment_lapses: ADJUSTMENT_LAPSES<u128, u64>,
    /// `receiver.governed`.
    recv_governed: RECV_GOVERNED<(u8, Str, Str), (Option<u64>, Option<u128>, Bytes)>,
    /// `receiver.applied`.
    applied: APPLIED<u128, u64>,
    /// `receiver.applied_by_expiry`.
    applied_by_expiry: APPLIED_BY_EXPIRY<(u64, u128), ()>,
    /// `receiver.apply_log`.
    apply_log: RECV_APPLY_LOG<(u128, u32), (u64, Bytes)>,
    /// `receiver.weight_changes`.
    weight_changes: RECV_WEIGHT_CHANGES<u128, (Str, Str, i32, u64)>,
    /// `ledger.journal`.
    ledger_journal: LEDGER_JOURNAL<u64, Bytes>,
    /// `ledger.checkpoint`.
    ledger_checkpoint: LEDGER_CHECKPOINT<u64, Bytes>,
    /// `gateway.log`.
    gateway_log: GATEWAY_LOG<u64, Bytes>,
    /// `gateway.checkpoint`.
    gateway_checkpoint: GATEWAY_CHECKPOINT<u64, Bytes>,
    /// `events.outbox`.
    events_outbox: EVENTS_OUTBOX<u64, Bytes>,
    /// `events.keys`.
    event_keys: EVENT_KEYS<Str, u64>,
    /// `events.keys_by_time`.
    event_keys_by_time: EVENT_KEYS_BY_TIME<(u64, Str), ()>,
}

/// Appends `bytes` after the last row of an append-only log keyed by sequence.
pub(crate) fn append(log: &mut Table<'_, u64, Bytes>, bytes: &[u8]) -> Result<(), StoreError> {
    let next = log.last()?.map_or(0, |(k, _)| k.value() + 1);
    log.insert(next, bytes)?;
    Ok(())
}
