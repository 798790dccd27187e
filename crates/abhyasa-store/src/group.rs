//! Group commit: one writer thread owns the [`Store`]; callers submit ops and wait on a
//! [`Ticket`], or hand [`GroupCommit::submit_then`] a function the writer calls with the
//! outcome (an async caller's way: no thread blocks on the commit). The writer takes the
//! first request and everything already queued behind it (up to `max_ops`) and commits at once, in **one** `Durability::Immediate` transaction, then
//! releases every waiter with the same outcome. Nothing waits for company when the writer is
//! idle: what arrives while a commit runs forms the next batch. (`max_delay` adds an optional
//! linger for company.)
//!
//! A commit error is an unknown outcome: every waiter of that batch gets
//! [`GroupError::Unknown`], the writer reopens the store through the `reopen` function it was
//! given, and [`GroupStats::generation`] rises. A caller that sees `Unknown` must rebuild its
//! machine from the reopened store (`recover_custodian` / `recover_receiver` via
//! [`GroupCommit::read`]) — never assume the batch rolled back or landed.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::{self, Receiver, RecvTimeoutError, Sender, SyncSender};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crate::{Op, Store, StoreError};

/// Batching bounds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct GroupConfig {
    /// Most ops in one commit.
    pub max_ops: usize,
    /// Longest a batch lingers for company after taking what is already queued (0, the
    /// default: commit at once — requests that arrive during a commit batch by themselves).
    pub max_delay: Duration,
    /// How long dropping the writer waits for the commit under way (default 10 s). A writer
    /// stuck past it (a disk that stopped answering syncs) is left to finish on its own
    /// thread rather than hang whoever drops it — often a runtime thread; the store stays
    /// open until it does.
    pub drop_wait: Duration,
}

impl Default for GroupConfig {
    fn default() -> Self {
        Self {
            max_ops: 4_096,
            max_delay: Duration::ZERO,
            drop_wait: Duration::from_secs(10),
        }
    }
}

/// Why a submitted batch did not commit.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum GroupError {
    /// The commit failed: it may or may not have landed. Recover from the store.
    #[error("commit outcome unknown: {0}")]
    Unknown(String),
    /// The writer is gone (shut down, or the store could not be reopened).
    #[error("the store writer has stopped")]
    Stopped,
}

/// Counters of the writer.
#[derive(Debug, Default)]
pub struct GroupStats {
    /// Commits made.
    pub commits: AtomicU64,
    /// Ops committed.
    pub ops: AtomicU64,
    /// Time spent in those commits, in nanoseconds: from the write transaction's start to
    /// its durable end (`fdatasync` included), summed. Over `commits`, the mean commit as
    /// the node's own writes see it (its tables, its disk), not a bench's empty one.
    pub busy_nanos: AtomicU64,
    /// Times the store was reopened after an unknown outcome.
    pub generation: AtomicU64,
}

type ReadFn = Box<dyn FnOnce(&Store) + Send>;
type DoneFn = Box<dyn FnOnce(Result<(), GroupError>) + Send>;
type Reopen = Box<dyn FnMut() -> Result<Store, StoreError> + Send>;

enum Request {
    Write {
        ops: Vec<Op>,
        done: DoneFn,
    },
    Read(ReadFn),
    Maintain {
        now: abhyasa_wire::UnixMillis,
        done: SyncSender<Result<crate::Maintenance, GroupError>>,
    },
}

/// Waits for the commit that carries a submitted batch.
#[derive(Debug)]
pub struct Ticket(Receiver<Result<(), GroupError>>);

impl Ticket {
    /// Blocks until the batch's commit returned.
    pub fn wait(self) -> Result<(), GroupError> {
        self.0.recv().unwrap_or(Err(GroupError::Stopped))
    }
}

/// Waits for a queued maintenance run.
#[derive(Debug)]
pub struct MaintenanceTicket(Receiver<Result<crate::Maintenance, GroupError>>);

impl MaintenanceTicket {
    /// Blocks until the maintenance ran; its report.
    pub fn wait(self) -> Result<crate::Maintenance, GroupError> {
        self.0.recv().unwrap_or(Err(GroupError::Stopped))
    }
}

/// The group-commit writer.
#[derive(Debug)]
pub struct GroupCommit {
    tx: Option<Sender<Request>>,
    worker: Option<JoinHandle<Option<Store>>>,
    /// Disconnected when the writer thread has returned (its sender dropped).
    exited: std::sync::Mutex<Receiver<()>>,
    drop_wait: Duration,
    stats: Arc<GroupStats>,
}

impl GroupCommit {
    /// Starts the writer thread on `store`; `reopen` opens the same database again after a
    /// commit error.
    pub fn spawn(
        store: Store,
        config: GroupConfig,
        reopen: impl FnMut() -> Result<Store, StoreError> + Send + 'static,
    ) -> Self {
        let (tx, rx) = mpsc::channel();
        let stats = Arc::new(GroupStats::default());
        let worker_stats = Arc::clone(&stats);
        let (exiting, exited) = mpsc::sync_channel(0);
        let drop_wait = config.drop_wait;
        let worker = std::thread::Builder::new()
            .name("abhyasa-store".into())
            .spawn(move || {
                let _exiting = exiting;
                run(store, config, Box::new(reopen), &rx, &worker_stats)
            })
            .expect("spawning the store writer thread");
        Self {
            tx: Some(tx),
            worker: Some(worker),
            exited: std::sync::Mutex::new(exited),
            drop_wait,
            stats,
        }
    }

    /// Queues `ops` for the next group commit.
    pub fn submit(&self, ops: Vec<Op>) -> Ticket {
        let (done, wait) = mpsc::sync_channel(1);
        self.submit_then(ops, move |outcome| {
            let _ = done.send(outcome);
        });
        Ticket(wait)
    }

    /// Queues `ops` for the next group commit; the writer thread calls `done` with the
    /// commit's outcome (an async caller sends it into its own channel, with no thread
    /// blocked on a [`Ticket`]). If the writer has stopped, `done` is dropped uncalled.
    pub fn submit_then(
        &self,
        ops: Vec<Op>,
        done: impl FnOnce(Result<(), GroupError>) + Send + 'static,
    ) {
        if let Some(tx) = &self.tx {
            // A send error means the writer stopped; the dropped `done` reports it.
            let _ = tx.send(Request::Write {
                ops,
                done: Box::new(done),
            });
        }
    }

    /// Runs `f` on the writer thread, between commits, and returns its result.
    pub fn read<T: Send + 'static>(
        &self,
        f: impl FnOnce(&Store) -> T + Send + 'static,
    ) -> Result<T, GroupError> {
        let (done, wait) = mpsc::sync_channel(1);
        self.read_then(move |store| {
            let _ = done.send(f(store));
        })?;
        wait.recv().map_err(|_| GroupError::Stopped)
    }

    /// Runs `f` on the writer thread, between commits, without waiting for it: `f` sends its
    /// result wherever the caller waits (an async caller, into its own channel). If the
    /// writer has stopped, `f` is dropped unrun.
    pub fn read_then(&self, f: impl FnOnce(&Store) + Send + 'static) -> Result<(), GroupError> {
        let tx = self.tx.as_ref().ok_or(GroupError::Stopped)?;
        tx.send(Request::Read(Box::new(f)))
            .map_err(|_| GroupError::Stopped)
    }

    /// Queues [`Store::maintain`] on the writer thread, after the writes queued before it.
    /// A failure is an unknown outcome, handled as a failed commit: the store is reopened and
    /// the caller must recover from it.
    pub fn maintain(&self, now: abhyasa_wire::UnixMillis) -> MaintenanceTicket {
        let (done, wait) = mpsc::sync_channel(1);
        if let Some(tx) = &self.tx {
            let _ = tx.send(Request::Maintain { now, done });
        }
        MaintenanceTicket(wait)
    }

    /// The writer's counters.
    pub fn stats(&self) -> &GroupStats {
        &self.stats
    }

    /// Commits what is queued, stops the writer and hands the store back.
    pub fn shutdown(mut self) -> Option<Store> {
        self.tx.take();
        self.worker.take().and_then(|w| w.join().ok()).flatten()
    }
}

impl Drop for GroupCommit {
    /// Stops the writer: what is queued is committed, and the store closed, before the drop
    /// returns — unless that takes longer than [`GroupConfig::drop_wait`] (a hung disk); then
    /// the writer is left to finish on its own thread and the store stays open until it does.
    fn drop(&mut self) {
        self.tx.take();
        if let Some(w) = self.worker.take() {
            let exited = self.exited.get_mut().unwrap_or_else(|e| e.into_inner());
            match exited.recv_timeout(self.drop_wait) {
                Err(RecvTimeoutError::Timeout) => drop(w),
                _ => {
                    let _ = w.join();
                }
            }
        }
    }
}

fn run(
    store: Store,
    config: GroupConfig,
    mut reopen: Reopen,
    rx: &Receiver<Request>,
    stats: &GroupStats,
) -> Option<Store> {
    let mut store = store;
    let mut reads = Vec::new();
    let mut maintenance = Vec::new();
    while let Ok(first) = rx.recv() {
        let mut ops = Vec::new();
        let mut waiters = Vec::new();
        let mut take = |req: Request, ops: &mut Vec<Op>| match req {
            Request::Write { ops: o, done } => {
                ops.extend(o);
                waiters.push(done);
            }
            Request::Read(f) => reads.push(f),
            Request::Maintain { now, done } => maintenance.push((now, done)),
        };
        take(first, &mut ops);
        // What is already queued joins without waiting.
        while ops.len() < config.max_ops {
            match rx.try_recv() {
                Ok(req) => take(req, &mut ops),
                Err(_) => break,
            }
        }
        if !config.max_delay.is_zero() {
            let until = Instant::now() + config.max_delay;
            while ops.len() < config.max_ops {
                let left = until.saturating_duration_since(Instant::now());
                match rx.recv_timeout(left) {
                    Ok(req) => take(req, &mut ops),
                    Err(RecvTimeoutError::Timeout | RecvTimeoutError::Disconnected) => break,
                }
            }
        }
        let started = Instant::now();
        let outcome = if ops.is_empty() {
            Ok(())
        } else {
            store
                .commit(&ops)
                .map_err(|e| GroupError::Unknown(e.to_string()))
        };
        if outcome.is_ok() && !ops.is_empty() {
            let busy = u64::try_from(started.elapsed().as_nanos()).unwrap_or(u64::MAX);
            stats.commits.fetch_add(1, Ordering::Relaxed);
            stats.ops.fetch_add(ops.len() as u64, Ordering::Relaxed);
            stats.busy_nanos.fetch_add(busy, Ordering::Relaxed);
        }
        if outcome.is_err() {
            // Unknown outcome: never reuse this handle's view of the file. Close it (the file
            // can only be open once) and reopen before anyone is told, so a waiter that
            // recovers right away reads the reopened store.
            drop(store);
            match reopen() {
                Ok(fresh) => {
                    store = fresh;
                    stats.generation.fetch_add(1, Ordering::Relaxed);
                }
                Err(_) => {
                    for w in waiters {
                        w(Err(GroupError::Stopped));
                    }
                    return None;
                }
            }
        }
        for w in waiters {
            w(outcome.clone());
        }
        for f in reads.drain(..) {
            f(&store);
        }
        for (now, done) in maintenance.drain(..) {
            match store.maintain(now) {
                Ok(report) => {
                    let _ = done.send(Ok(report));
                }
                Err(e) => {
                    drop(store);
                    let Ok(fresh) = reopen() else {
                        let _ = done.send(Err(GroupError::Stopped));
                        return None;
                    };
                    store = fresh;
                    stats.generation.fetch_add(1, Ordering::Relaxed);
                    let _ = done.send(Err(GroupError::Unknown(e.to_string())));
                }
            }
        }
    }
    Some(store)
}
