//! Durable custody state in redb.
//!
//! ```text
//!  Custodian/Receiver ──poll_persist──▶ Op ──▶ GroupCommit (one writer thread)
//!                                               │ drains up to N ops or T ms
//!                                               ▼
//!                                 one redb write txn, Durability::Immediate
//!                                               │ commit returns
//!                                               ▼
//!                         every waiter released ──▶ handle_persisted ──▶ transmit / ack
//! ```
//!
//! One database file per node holds the custodian's pending set, terminal records, escalation
//! log and reconciliation notes; the principal-side state; and the receiver's applied-id
//! ledger and effect state. Each [`Op`] is applied inside the commit that carries it, so an
//! applied id is never on disk without its effect (AB-3), a pending record never without the
//! principal's own decision at issue, an escalation never without its safe action (AB-4).
//!
//! A commit that returns an error has an *unknown* outcome: the store is poisoned and must be
//! reopened, and the machines recovered from what is on disk. Nothing assumes a rollback.
//!
//! ```
//! use abhyasa_custody::*;
//! use abhyasa_store::{Op, Store, StoreConfig};
//! use abhyasa_wire::*;
//!
//! let dir = tempfile::tempdir().unwrap();
//! let mut store = Store::open(dir.path().join("node.redb"), StoreConfig::default()).unwrap();
//! let p = AgentId::new("principal").unwrap();
//! let mut c = Custodian::new(p.clone(), CustodianConfig::default(), 1);
//! c.issue(UnixMillis(0), Obligation {
//!     id: ObligationId::from_u128(1),
//!     issuer: p.clone(),
//!     target: AgentId::new("agent").unwrap(),
//!     created_at: UnixMillis(0),
//!     deadline: UnixMillis(60_000),
//!     max_retries: 8,
//!     sequence: None,
//!     payload: Payload::OauthToken(TokenPayload {
//!         action: TokenAction::Revoke,
//!         token_id: TokenId::new("tok").unwrap(),
//!         client_id: ClientId::new("cli").unwrap(),
//!         expires_at: None,
//!     }),
//! }).unwrap();
//! let persist = c.poll_persist().unwrap();
//! store.commit(&[Op::Custodian(persist.record)]).unwrap();
//! c.handle_persisted(UnixMillis(0), persist.token);
//! assert!(c.poll_transmit().is_some());
//!
//! // After a crash: the pending set, with its deadline and attempts, and the withhold at issue.
//! drop((c, store));
//! let store = Store::open(dir.path().join("node.redb"), StoreConfig::default()).unwrap();
//! let c = store.recover_custodian(p, CustodianConfig::default(), 2, UnixMillis(10)).unwrap();
//! assert_eq!(c.pending_len(), 1);
//! assert!(c.principal().is_revoked(&TokenId::new("tok").unwrap()));
//! ```

#![warn(missing_docs, unreachable_pub)]

mod events;
mod group;
mod open;
mod rows;
mod tables;

use std::path::Path;

use abhyasa_custody::{
    Adjustment, AppliedRecord, Authorization, Custodian, CustodianConfig, CustodianRecord,
    EscalatedRecord, GovernedKey, PendingRecord, PrincipalState, PrincipalUpdate, Receiver,
    ReceiverConfig, ReceiverEffect, ReceiverRecord, ReceiverState, WeightBounds, WeightChange,
};
use abhyasa_wire::{
    encode, AgentId, Escalation, ObligationId, ReconciliationNote, SafeAction, Scope,
    TerminalRecord, TokenId, UnixMillis, WeightKey,
};
use redb::{
    Database, Durability, ReadableDatabase, ReadableTable, ReadableTableMetadata, WriteTransaction,
};

/// One row of the receiver's apply log.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AppliedEntry {
    /// The obligation, as applied.
    pub obligation: abhyasa_wire::Obligation,
    /// When it was applied.
    pub at: UnixMillis,
    /// How many earlier applies of the same id the log holds (0 unless applied twice).
    pub earlier: u32,
}

pub use redb::StorageBackend;

pub use events::{LeaseSide, OperatorEvent, OutboxEntry};
pub use group::{GroupCommit, GroupConfig, GroupError, GroupStats, MaintenanceTicket, Ticket};
use rows::PendingRow;
use tables::*;

/// One durable change, as handed out by a machine's `poll_persist`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Op {
    /// A custodian record (pending, attempt, terminal, reconciliation).
    Custodian(CustodianRecord),
    /// A receiver record (apply, prune).
    Receiver(ReceiverRecord),
    /// A ledger branch step, appended to the journal.
    Ledger(abhyasa_ledger::Step),
    /// A gateway record, appended to the acceptance log.
    Gateway(abhyasa_ledger::GatewayRecord),
    /// An event for the operator's outbox, recorded at `at` (with [`StoreConfig::events`];
    /// one already recorded under its key is not recorded again). Escalations and declines
    /// need none: the store records them with their terminal record.
    Event {
        /// The event.
        event: OperatorEvent,
        /// When.
        at: UnixMillis,
    },
    /// The node's sinks took every outbox row up to and including `through`: they leave it.
    EventsDelivered {
        /// The last row taken.
        through: u64,
    },
}

/// Store settings.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StoreConfig {
    /// Bounds of principal-side routing weights (must match the custodian's).
    pub principal_weights: WeightBounds,
    /// Bounds of receiver preference weights, in millionths (must match the receiver's).
    pub receiver_weights: (i64, i64),
    /// Terminal records, escalations and notes older than this are pruned by [`Store::maintain`].
    pub retention_ms: u64,
    /// At most this many terminal records are kept; the oldest go first.
    pub max_terminal: u64,
    /// At most this many rows are pruned by one [`Store::maintain`] call.
    pub max_prune_per_call: usize,
    /// Compact the file after this many rows were pruned since the last compaction.
    pub compact_after_pruned: u64,
    /// redb quick-repair: slower commits, near-instant reopen after a crash.
    pub quick_repair: bool,
    /// Verify every page's checksum when a file is opened (one read of the whole file): a file
    /// damaged outside redb is refused as corrupted instead of trusted. Default on.
    pub verify_on_open: bool,
    /// redb's page cache, in bytes (redb's own default is 1 GiB, which a long-running node
    /// fills as its file grows: resident memory then follows the file).
    pub cache_bytes: usize,
    /// Keep the operator's outbox ([`OperatorEvent`]): escalations and declines with their
    /// terminal records, ended leases at maintenance, [`Op::Event`]s. Off: none are kept
    /// (a node with no event sink).
    pub events: bool,
}

impl Default for StoreConfig {
    fn default() -> Self {
        Self {
            principal_weights: WeightBounds::default(),
            receiver_weights: (-1_000_000, 1_000_000),
            retention_ms: 7 * 24 * 3_600_000,
            max_terminal: 1_000_000,
            max_prune_per_call: 10_000,
            compact_after_pruned: 100_000,
            quick_repair: false,
            verify_on_open: true,
            cache_bytes: 64 << 20,
            events: false,
        }
    }
}

/// Why a store operation failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum StoreError {
    /// redb refused to open or create the database.
    #[error("opening the database: {0}")]
    Open(#[from] redb::DatabaseError),
    /// The file was written by an incompatible layout.
    #[error("schema version {found} is not {expected} (written by another version of abhyasa; this build does not convert it)")]
    Schema {
        /// Found in the file.
        found: u64,
        /// This build's.
        expected: u64,
    },
    /// A file-system operation around the database failed.
    #[error("file system: {0}")]
    Io(#[from] std::io::Error),
    /// Opening the database file at `path` failed.
    #[error("{}: {source}", path.display())]
    File {
        /// The database file.
        path: std::path::PathBuf,
        /// Why.
        source: Box<StoreError>,
    },
    /// A read or write inside a transaction failed.
    #[error("storage: {0}")]
    Storage(String),
    /// A commit failed: its outcome is unknown. The store is poisoned; reopen it and recover.
    #[error("commit outcome unknown: {0}")]
    CommitUnknown(String),
    /// The store was poisoned by an earlier commit error; reopen it.
    #[error("store poisoned by an earlier commit error; reopen it")]
    Poisoned,
    /// A row could not be read back.
    #[error("corrupt row in {table} at {key}: {detail}")]
    Corrupt {
        /// The table.
        table: &'static str,
        /// The key, as text.
        key: String,
        /// What was wrong.
        detail: String,
    },
}

macro_rules! storage_from {
    ($($t:ty),*) => {$(
        impl From<$t> for StoreError {
            fn from(e: $t) -> Self {
                StoreError::Storage(e.to_string())
            }
        }
    )*};
}
storage_from!(
    redb::TransactionError,
    redb::TableError,
    redb::StorageError,
    redb::SetDurabilityError,
    redb::CompactionError
);

/// What recovery reads for a custodian.
#[derive(Debug)]
pub struct CustodianRecovery {
    /// The pending set, with original deadlines and attempt counts.
    pub pending: Vec<PendingRecord>,
    /// Principal-side state.
    pub principal: PrincipalState,
    /// The most recent escalations (for reconciling late acks).
    pub escalated: Vec<EscalatedRecord>,
    /// Pending rows that could not be read ([`Store::recover_custodian`] refuses to recover
    /// past them).
    pub corrupt: Vec<StoreError>,
}

/// What one [`Store::maintain`] call did.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Maintenance {
    /// Keyed down-weights folded into base weights (records from before updates lapsed) or
    /// dropped at their lapse.
    pub folded: usize,
    /// The agent's weight changes forgotten after they lapsed.
    pub weights_lapsed: usize,
    /// Terminal records pruned.
    pub terminal_pruned: usize,
    /// Escalations (and their notes) pruned.
    pub escalations_pruned: usize,
    /// Token records forgotten after the token's own expiry (revoked by the principal,
    /// dropped or cached by the receiver).
    pub tokens_expired: usize,
    /// Leases found ended and recorded in the outbox (with [`StoreConfig::events`]).
    pub leases_ended: usize,
    /// Whether the file was compacted.
    pub compacted: bool,
}

/// What the store holds of an id it knows: its terminal record and escalation once it ended
/// (`None` while it is pending).
pub type Known = Option<(TerminalRecord, Option<Escalation>)>;

/// A node's durable state. Single writer: see [`GroupCommit`] for sharing it.
pub struct Store {
    db: Database,
    config: StoreConfig,
    principal: PrincipalState,
    receiver: ReceiverState,
    poisoned: bool,
    pruned_since_compaction: u64,
}

impl std::fmt::Debug for Store {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Store")
            .field("poisoned", &self.poisoned)
            .finish_non_exhaustive()
    }
}

impl Store {
    /// Opens (or creates) the database file at `path`.
    ///
    /// Creation is atomic: a new database is initialized under `<path>.creating`, synced, and
    /// renamed into place, so a crash during creation leaves no half-made file at `path`.
    /// Errors name the file: `<path>: <what is wrong>`.
    pub fn open(path: impl AsRef<Path>, config: StoreConfig) -> Result<Self, StoreError> {
        let path = path.as_ref();
        Self::open_at(path, config).map_err(|e| StoreError::File {
            path: path.to_owned(),
            source: Box::new(e),
        })
    }

    fn open_at(path: &Path, config: StoreConfig) -> Result<Self, StoreError> {
        if !path.exists() {
            let mut creating = path.as_os_str().to_owned();
            creating.push(".creating");
            let creating = std::path::PathBuf::from(creating);
            match std::fs::remove_file(&creating) {
                Ok(()) => {}
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                Err(e) => return Err(e.into()),
            }
            // The state is private: created 0600 before redb writes to it (redb creates a
            // file with the process's default mode).
            {
                use std::os::unix::fs::OpenOptionsExt;
                std::fs::OpenOptions::new()
                    .write(true)
                    .create_new(true)
                    .mode(0o600)
                    .open(&creating)?;
            }
            let db = Database::builder().create(&creating)?;
            drop(Self::init(db, config.clone())?);
            std::fs::rename(&creating, path)?;
            if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
                std::fs::File::open(dir)?.sync_all()?;
            }
        }
        // Every page's checksum is verified on open: a file damaged outside redb is refused as
        // corrupted instead of being trusted (a plain open may panic on it).
        let db = Database::builder()
            .set_check_integrity_on_open(config.verify_on_open)
            .set_cache_size(config.cache_bytes)
            .create(path)?;
        Self::init(db, config)
    }

    /// Opens (or creates) a database on a custom backend: memory, or a disk that fails on cue
    /// (`abhyasa_testkit::fault`, in tests).
    pub fn open_backend(
        backend: impl StorageBackend,
        config: StoreConfig,
    ) -> Result<Self, StoreError> {
        let db = Database::builder()
            .set_cache_size(config.cache_bytes)
            .create_with_backend(backend)?;
        Self::init(db, config)
    }

    fn init(db: Database, config: StoreConfig) -> Result<Self, StoreError> {
        // A file from another layout is refused before anything is written to it.
        {
            let read = db.begin_read()?;
            let found = match read.open_table(META) {
                Ok(meta) => meta.get("schema")?.map(|v| v.value()),
                Err(redb::TableError::TableDoesNotExist(_)) => None,
                Err(e) => return Err(e.into()),
            };
            if let Some(found) = found.filter(|v| *v != SCHEMA_VERSION && *v != 1) {
                return Err(StoreError::Schema {
                    found,
                    expected: SCHEMA_VERSION,
                });
            }
        }
        let mut txn = db.begin_write()?;
        txn.set_durability(Durability::Immediate)?;
        {
            let mut meta = txn.open_table(META)?;
            let found = meta.get("schema")?.map(|v| v.value());
            match found {
                None => {
                    meta.insert("schema", SCHEMA_VERSION)?;
                }
                Some(v) if v == SCHEMA_VERSION => {}
                // Layout 1 is converted in this transaction: all of it or none.
                Some(1) => {
                    convert::layout1_to_2(&txn)?;
                    meta.insert("schema", SCHEMA_VERSION)?;
                }
                Some(found) => {
                    return Err(StoreError::Schema {
                        found,
                        expected: SCHEMA_VERSION,
                    })
                }
            }
            // Create every table so readers never meet a missing one.
            txn.open_table(PENDING)?;
            txn.open_table(TERMINAL)?;
            txn.open_table(TERMINAL_BY_TIME)?;
            txn.open_table(ESCALATIONS)?;
            txn.open_table(ESCALATIONS_BY_TIME)?;
            txn.open_table(NOTES)?;
            txn.open_table(PRINCIPAL_GOVERNED)?;
            txn.open_table(ROUTING_BASE)?;
            txn.open_table(ADJUSTMENTS)?;
            txn.open_table(ADJUSTMENT_LAPSES)?;
            txn.open_table(RECV_GOVERNED)?;
            txn.open_table(APPLIED)?;
            txn.open_table(APPLIED_BY_EXPIRY)?;
            txn.open_table(RECV_WEIGHTS)?;
            txn.open_table(RECV_WEIGHT_CHANGES)?;
            txn.open_table(RECV_APPLY_LOG)?;
            txn.open_table(LEDGER_JOURNAL)?;
            txn.open_table(LEDGER_CHECKPOINT)?;
            txn.open_table(GATEWAY_LOG)?;
            txn.open_table(GATEWAY_CHECKPOINT)?;
            txn.open_table(EVENTS_OUTBOX)?;
            txn.open_table(EVENT_KEYS)?;
            txn.open_table(EVENT_KEYS_BY_TIME)?;
        }
        txn.commit()
            .map_err(|e| StoreError::CommitUnknown(e.to_string()))?;
        let mut store = Self {
            db,
            principal: PrincipalState::new(config.principal_weights),
            receiver: ReceiverState::new(config.receiver_weights.0, config.receiver_weights.1),
            config,
            poisoned: false,
            pruned_since_compaction: 0,
        };
        store.principal = store.load_principal()?;
        store.receiver = store.load_receiver_state()?;
        Ok(store)
    }

    /// Up to `limit` outbox rows after `after` (all from the start with `None`), oldest first.
    pub fn outbox(&self, after: Option<u64>, limit: usize) -> Result<Vec<OutboxEntry>, StoreError> {
        let txn = self.db.begin_read()?;
        let table = txn.open_table(EVENTS_OUTBOX)?;
        let range = match after {
            Some(a) => table.range(a.saturating_add(1)..)?,
            None => table.range(0..)?,
        };
        let mut out = Vec::new();
        for entry in range.take(limit) {
            let (k, v) = entry?;
            let row: events::OutboxRow =
                rows::decode("events.outbox", k.value().into(), v.value())?;
            out.push(OutboxEntry {
                seq: k.value(),
                key: row.key,
                at: row.at,
                event: row.event,
            });
        }
        Ok(out)
    }

    /// Rows in the outbox (recorded, not yet taken by every sink).
    pub fn outbox_len(&self) -> Result<u64, StoreError> {
        let txn = self.db.begin_read()?;
        Ok(txn.open_table(EVENTS_OUTBOX)?.len()?)
    }

    /// Principal-side state as committed.
    pub fn principal(&self) -> &PrincipalState {
        &self.principal
    }

    /// The receiver's effect state as committed.
    pub fn receiver_state(&self) -> &ReceiverState {
        &self.receiver
    }

    /// Whether the receiver has applied `id` (and still remembers it: applied ids are kept
    /// until their deadline plus the clock-skew allowance).
    pub fn is_applied(&self, id: ObligationId) -> Result<bool, StoreError> {
        let txn = self.db.begin_read()?;
        Ok(txn.open_table(APPLIED)?.get(id.to_u128())?.is_some())
    }

    /// Every apply this receiver still remembers, in apply order (oldest first): the
    /// obligation, when it was applied, and how many times its id was applied before (0
    /// unless something applied it twice).
    pub fn apply_log(&self) -> Result<Vec<AppliedEntry>, StoreError> {
        let txn = self.db.begin_read()?;
        let table = match txn.open_table(RECV_APPLY_LOG) {
            Ok(t) => t,
            Err(redb::TableError::TableDoesNotExist(_)) => return Ok(Vec::new()),
            Err(e) => return Err(e.into()),
        };
        let mut out = Vec::new();
        for row in table.iter()? {
            let (k, v) = row?;
            let (id, n) = k.value();
            let (at, bytes) = v.value();
            let obligation =
                abhyasa_wire::decode_obligation(bytes).map_err(|e| StoreError::Corrupt {
                    table: "receiver.apply_log",
                    key: format!("{id:032x}/{n}"),
                    detail: e.to_string(),
                })?;
            out.push(AppliedEntry {
                obligation,
                at: UnixMillis(at),
                earlier: n,
            });
        }
        out.sort_by_key(|e| (e.at, e.obligation.id));
        Ok(out)
    }

    /// The obligation last applied on `key`, if recorded.
    pub fn governed_by(&self, key: &GovernedKey) -> Result<Option<ObligationId>, StoreError> {
        let txn = self.db.begin_read()?;
        let table = match txn.open_table(RECV_GOVERNED) {
            Ok(t) => t,
            Err(redb::TableError::TableDoesNotExist(_)) => return Ok(None),
            Err(e) => return Err(e.into()),
        };
        let row = rows::GovernedRow::read(&table, "receiver.governed", rows::governed_key(key))?;
        Ok(row.by.map(ObligationId::from_u128))
    }

    /// The ids of `ids` the custodian side knows (pending or terminal), each with what
    /// [`Known`] says: what issuing, idempotent on the id, answers for them. One read.
    pub fn known(&self, ids: &[ObligationId]) -> Result<Vec<(ObligationId, Known)>, StoreError> {
        let txn = self.db.begin_read()?;
        let (pending, terminal) = (txn.open_table(PENDING)?, txn.open_table(TERMINAL)?);
        let escalations = txn.open_table(ESCALATIONS)?;
        let mut out = Vec::new();
        for &id in ids {
            let key = id.to_u128();
            if pending.get(key)?.is_some() {
                out.push((id, None));
            } else if let Some(row) = terminal.get(key)? {
                // Known either way: a record that does not read leaves the outcome unknown
                // rather than the id free to be taken into custody again.
                let record = rows::decode("custodian.terminal", key, row.value()).ok();
                let escalation = escalations
                    .get(key)?
                    .and_then(|row| rows::decode("custodian.escalations", key, row.value()).ok());
                out.push((id, record.map(|r| (r, escalation))));
            }
        }
        Ok(out)
    }

    /// Whether the custodian side knows `id` (pending or terminal): issuing is idempotent.
    pub fn knows(&self, id: ObligationId) -> Result<bool, StoreError> {
        let txn = self.db.begin_read()?;
        let key = id.to_u128();
        Ok(txn.open_table(PENDING)?.get(key)?.is_some()
            || txn.open_table(TERMINAL)?.get(key)?.is_some())
    }

    /// The terminal record of `id`, if kept.
    pub fn terminal(&self, id: ObligationId) -> Result<Option<TerminalRecord>, StoreError> {
        self.row(TERMINAL, "custodian.terminal", id)
    }

    /// The `n` most recent terminal records, oldest first: read through the time index, so
    /// the cost is `n` rows however long the history (a status request must not read it all).
    pub fn recent_terminal(&self, n: usize) -> Result<Vec<TerminalRecord>, StoreError> {
        self.recent(TERMINAL_BY_TIME, TERMINAL, "custodian.terminal", n)
    }

    /// The `n` most recent escalations, oldest first (as [`Store::recent_terminal`]).
    pub fn recent_escalations(&self, n: usize) -> Result<Vec<Escalation>, StoreError> {
        self.recent(ESCALATIONS_BY_TIME, ESCALATIONS, "custodian.escalations", n)
    }

    /// The escalation of `id`, if kept.
    pub fn escalation(&self, id: ObligationId) -> Result<Option<Escalation>, StoreError> {
        self.row(ESCALATIONS, "custodian.escalations", id)
    }

    /// The row of `id` in `table` (named `name` in errors), decoded, if kept.
    fn row<T: serde::de::DeserializeOwned>(
        &self,
        table: redb::TableDefinition<'_, u128, &[u8]>,
        name: &'static str,
        id: ObligationId,
    ) -> Result<Option<T>, StoreError> {
        let txn = self.db.begin_read()?;
        let key = id.to_u128();
        let row = txn.open_table(table)?.get(key)?;
        row.map(|v| rows::decode(name, key, v.value())).transpose()
    }

    /// The `n` most recent applies this receiver remembers, oldest first (as
    /// [`Store::apply_log`]): every row's time is read, but only those `n` are decoded and held.
    pub fn recent_applied(&self, n: usize) -> Result<Vec<AppliedEntry>, StoreError> {
        let txn = self.db.begin_read()?;
        let table = match txn.open_table(RECV_APPLY_LOG) {
            Ok(t) => t,
            Err(redb::TableError::TableDoesNotExist(_)) => return Ok(Vec::new()),
            Err(e) => return Err(e.into()),
        };
        // The newest `n` keys by (at, id): a min-heap of the best so far.
        let mut newest = std::collections::BinaryHeap::new();
        for row in table.iter()? {
            let (k, v) = row?;
            let (id, seq) = k.value();
            newest.push(std::cmp::Reverse((v.value().0, id, seq)));
            if newest.len() > n {
                newest.pop();
            }
        }
        let mut keys: Vec<_> = newest.into_iter().map(|r| r.0).collect();
        keys.sort_unstable();
        let mut out = Vec::with_capacity(keys.len());
        for (at, id, seq) in keys {
            let Some(row) = table.get((id, seq))? else {
                continue;
            };
            let bytes = row.value().1;
            let obligation =
                abhyasa_wire::decode_obligation(bytes).map_err(|e| StoreError::Corrupt {
                    table: "receiver.apply_log",
                    key: format!("{id:032x}/{seq}"),
                    detail: e.to_string(),
                })?;
            out.push(AppliedEntry {
                obligation,
                at: UnixMillis(at),
                earlier: seq,
            });
        }
        Ok(out)
    }

    fn recent<T: serde::de::DeserializeOwned>(
        &self,
        by_time: redb::TableDefinition<'_, (u64, u128), ()>,
        rows_table: redb::TableDefinition<'_, u128, &[u8]>,
        name: &'static str,
        n: usize,
    ) -> Result<Vec<T>, StoreError> {
        let txn = self.db.begin_read()?;
        let index = txn.open_table(by_time)?;
        let table = txn.open_table(rows_table)?;
        let mut out = Vec::new();
        for entry in index.iter()?.rev().take(n) {
            let (_, id) = entry?.0.value();
            if let Some(v) = table.get(id)? {
                out.push(rows::decode(name, id, v.value())?);
            }
        }
        out.reverse();
        Ok(out)
    }

    /// Every terminal record kept, in id order.
    pub fn terminal_records(&self) -> Result<Vec<TerminalRecord>, StoreError> {
        self.all(TERMINAL, "custodian.terminal")
    }

    /// Every escalation kept, in id order.
    pub fn escalations(&self) -> Result<Vec<Escalation>, StoreError> {
        self.all(ESCALATIONS, "custodian.escalations")
    }

    /// Every reconciliation note kept, in id order.
    pub fn notes(&self) -> Result<Vec<ReconciliationNote>, StoreError> {
        self.all(NOTES, "custodian.notes")
    }

    /// The ledger journal, in order: the latest checkpoint (if the journal was compacted),
    /// then the steps after it. A record that does not decode is an error naming it.
    pub fn ledger_journal(&self) -> Result<Vec<abhyasa_ledger::Step>, StoreError> {
        let mut steps: Vec<abhyasa_ledger::Step> = self
            .checkpoint(LEDGER_CHECKPOINT, "ledger.checkpoint")?
            .map(|c| abhyasa_ledger::Step::Checkpoint(Box::new(c)))
            .into_iter()
            .collect();
        steps.extend(self.log(LEDGER_JOURNAL, "ledger.journal")?);
        Ok(steps)
    }

    /// The checkpoint row of `table`, if one was written.
    fn checkpoint(
        &self,
        table: redb::TableDefinition<'_, u64, &[u8]>,
        name: &'static str,
    ) -> Result<Option<abhyasa_wire::ledger::SignedRecord>, StoreError> {
        let txn = self.db.begin_read()?;
        let t = match txn.open_table(table) {
            Ok(t) => t,
            Err(redb::TableError::TableDoesNotExist(_)) => return Ok(None),
            Err(e) => return Err(e.into()),
        };
        let Some(row) = t.get(0)? else {
            return Ok(None);
        };
        abhyasa_wire::decode_with_limit(row.value(), abhyasa_ledger::MAX_CHECKPOINT_BYTES + 4096)
            .map(Some)
            .map_err(|e| StoreError::Corrupt {
                table: name,
                key: format!("{:032x}", 0),
                detail: e.to_string(),
            })
    }

    /// The gateway's acceptance log, in order.
    pub fn gateway_log(&self) -> Result<Vec<abhyasa_ledger::GatewayRecord>, StoreError> {
        let mut records: Vec<abhyasa_ledger::GatewayRecord> = self
            .checkpoint(GATEWAY_CHECKPOINT, "gateway.checkpoint")?
            .map(|c| abhyasa_ledger::GatewayRecord::Checkpoint(Box::new(c)))
            .into_iter()
            .collect();
        records.extend(self.log(GATEWAY_LOG, "gateway.log")?);
        Ok(records)
    }

    fn log<T: serde::de::DeserializeOwned>(
        &self,
        table: redb::TableDefinition<'_, u64, &[u8]>,
        name: &'static str,
    ) -> Result<Vec<T>, StoreError> {
        let txn = self.db.begin_read()?;
        let mut out = Vec::new();
        for entry in txn.open_table(table)?.iter()? {
            let (k, v) = entry?;
            out.push(rows::decode(name, u128::from(k.value()), v.value())?);
        }
        Ok(out)
    }

    /// The pending set, in id order.
    pub fn pending(&self) -> Result<Vec<PendingRecord>, StoreError> {
        let rows: Vec<PendingRow> = self.all(PENDING, "custodian.pending")?;
        Ok(rows.into_iter().map(Into::into).collect())
    }

    /// Whether the receiver's ledger holds `id`, and until when.
    pub fn applied(&self, id: ObligationId) -> Result<Option<UnixMillis>, StoreError> {
        let txn = self.db.begin_read()?;
        Ok(txn
            .open_table(APPLIED)?
            .get(id.to_u128())?
            .map(|v| UnixMillis(v.value())))
    }

    /// Number of applied ids held.
    pub fn applied_len(&self) -> Result<u64, StoreError> {
        let txn = self.db.begin_read()?;
        Ok(txn.open_table(APPLIED)?.len()?)
    }

    /// Applies the apply log holds (one row per apply; pruned with the applied id).
    pub fn apply_log_len(&self) -> Result<u64, StoreError> {
        let txn = self.db.begin_read()?;
        Ok(txn.open_table(RECV_APPLY_LOG)?.len()?)
    }

    /// Number of terminal records held.
    pub fn terminal_len(&self) -> Result<u64, StoreError> {
        let txn = self.db.begin_read()?;
        Ok(txn.open_table(TERMINAL)?.len()?)
    }

    fn all<T: serde::de::DeserializeOwned>(
        &self,
        table: redb::TableDefinition<'_, u128, &[u8]>,
        name: &'static str,
    ) -> Result<Vec<T>, StoreError> {
        let txn = self.db.begin_read()?;
        let mut out = Vec::new();
        for entry in txn.open_table(table)?.iter()? {
            let (k, v) = entry?;
            out.push(rows::decode(name, k.value(), v.value())?);
        }
        Ok(out)
    }
}

fn prune_by_time(
    txn: &WriteTransaction,
    by_time: redb::TableDefinition<'_, (u64, u128), ()>,
    rows: redb::TableDefinition<'_, u128, &[u8]>,
    cutoff: u64,
    max_kept: u64,
    budget: usize,
) -> Result<usize, StoreError> {
    let mut index = txn.open_table(by_time)?;
    let mut table = txn.open_table(rows)?;
    let excess = index.len()?.saturating_sub(max_kept);
    let mut victims = Vec::new();
    for (i, entry) in index.iter()?.enumerate() {
        if victims.len() >= budget {
            break;
        }
        let (at, id) = entry?.0.value();
        if at >= cutoff && (i as u64) >= excess {
            break;
        }
        victims.push((at, id));
    }
    for &(at, id) in &victims {
        index.remove((at, id))?;
        table.remove(id)?;
    }
    Ok(victims.len())
}

mod apply;
mod convert;
mod maintain;
mod recover;
#[cfg(test)]
mod tests;
