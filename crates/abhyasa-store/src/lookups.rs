//! Look-ups beside the writer: reads of committed rows that do not wait for the commit under
//! way.
//!
//! The writer thread owns the [`Store`] and answers reads between its commits, so a read
//! asked during a commit waits for its `fdatasync`. A node asks one read on the hot path: when
//! obligations are issued, which of their ids the store already knows (issuing is idempotent
//! on the id). redb serves read transactions on any thread while a write transaction runs, so
//! the writer publishes its database here and a caller reads the last committed state at
//! once. The writer withdraws it before it closes the file (to reopen it after a commit of
//! unknown outcome: a file can be open only once) or compacts it (which needs the database to
//! itself), and waits for reads under way to end; meanwhile [`Lookups::known`] answers `None`
//! and the caller asks the writer as before.

use std::sync::{Arc, RwLock};
use std::time::{Duration, Instant};

use abhyasa_wire::{Escalation, ObligationId, TerminalRecord};
use redb::{Database, ReadTransaction, ReadableDatabase};

use crate::tables::{ESCALATIONS, PENDING, TERMINAL};
use crate::{rows, StoreError};

/// What the store holds of an id it knows: its terminal record and escalation once it ended
/// (`None` while it is pending).
pub type Known = Option<(TerminalRecord, Option<Escalation>)>;

/// The writer's database, published for look-ups from other threads. Cloning shares it.
#[derive(Clone, Debug, Default)]
pub struct Lookups {
    slot: Arc<RwLock<Option<Arc<Database>>>>,
}

impl Lookups {
    /// The ids of `ids` the store knows (pending or ended), each with what [`Known`] says, as
    /// the last commit left them; `None` when the database is not published (the writer is
    /// reopening or compacting it, or has stopped): ask the writer instead.
    pub fn known(
        &self,
        ids: &[ObligationId],
    ) -> Option<Result<Vec<(ObligationId, Known)>, StoreError>> {
        let db = self
            .slot
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .clone()?;
        Some(
            db.begin_read()
                .map_err(StoreError::from)
                .and_then(|txn| known_in(&txn, ids)),
        )
    }

    /// Publishes `db`.
    pub(crate) fn publish(&self, db: &Arc<Database>) {
        *self.slot.write().unwrap_or_else(|e| e.into_inner()) = Some(Arc::clone(db));
    }

    /// Withdraws the published database (if it is `db`) and waits, at most `within`, until no
    /// look-up holds it; whether none does.
    pub(crate) fn withdraw(&self, db: &Arc<Database>, within: Duration) -> bool {
        {
            let mut slot = self.slot.write().unwrap_or_else(|e| e.into_inner());
            if slot.as_ref().is_some_and(|d| Arc::ptr_eq(d, db)) {
                *slot = None;
            }
        }
        let until = Instant::now() + within;
        // A look-up holds its clone for one read transaction: microseconds.
        while Arc::strong_count(db) > 1 {
            if Instant::now() >= until {
                return false;
            }
            std::thread::sleep(Duration::from_micros(50));
        }
        true
    }
}

/// The ids of `ids` the store knows in `txn`, with what it holds of each.
pub(crate) fn known_in(
    txn: &ReadTransaction,
    ids: &[ObligationId],
) -> Result<Vec<(ObligationId, Known)>, StoreError> {
    let mut out = Vec::new();
    for &id in ids {
        if let Some(known) = known(txn, id)? {
            out.push((id, known));
        }
    }
    Ok(out)
}

/// Whether the store knows `id` in `txn`, and what it holds of it.
fn known(txn: &ReadTransaction, id: ObligationId) -> Result<Option<Known>, StoreError> {
    let key = id.to_u128();
    if txn.open_table(PENDING)?.get(key)?.is_some() {
        return Ok(Some(None));
    }
    let Some(row) = txn.open_table(TERMINAL)?.get(key)? else {
        return Ok(None);
    };
    let terminal: TerminalRecord = rows::decode("custodian.terminal", key, row.value())?;
    let escalation = match txn.open_table(ESCALATIONS)?.get(key)? {
        Some(row) => Some(rows::decode("custodian.escalations", key, row.value())?),
        None => None,
    };
    Ok(Some(Some((terminal, escalation))))
}
