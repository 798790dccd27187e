//! What the crash-test peers share: stopping at a named point for the test to SIGKILL, and
//! the store with its group-commit writer.

use std::fmt::Debug;
use std::io::Write;
use std::path::Path;
use std::time::{SystemTime, UNIX_EPOCH};

use abhyasa_store::{GroupCommit, GroupConfig, Store, StoreConfig, StoreError};
use abhyasa_wire::UnixMillis;

/// A named crash point.
pub(crate) trait KillPoint: Copy + PartialEq + Debug {
    /// Whether the peer waits there (else the kill races with the work that follows).
    fn pauses(self) -> bool;
}

/// Where this run of a peer stops: the `nth` time it reaches `kill_at`.
pub(crate) struct Points<P> {
    kill_at: Option<P>,
    nth: u32,
    seen: u32,
}

impl<P: KillPoint> Points<P> {
    pub(crate) fn new(kill_at: Option<P>, nth: u32) -> Self {
        Self {
            kill_at,
            nth,
            seen: 0,
        }
    }

    /// Announces `AT <point>` on stdout when this is the point to stop at, and (for a
    /// pausing point) waits for the kill.
    pub(crate) fn reach(&mut self, point: P) {
        if self.kill_at != Some(point) {
            return;
        }
        self.seen += 1;
        if self.seen != self.nth {
            return;
        }
        let mut out = std::io::stdout().lock();
        let _ = writeln!(out, "AT {point:?}");
        let _ = out.flush();
        drop(out);
        if point.pauses() {
            loop {
                std::thread::park();
            }
        }
    }
}

/// Opens the store behind a group-commit writer that reopens it after a failed commit.
pub(crate) fn open_group(db: &Path) -> Result<GroupCommit, StoreError> {
    let store = Store::open(db, StoreConfig::default())?;
    let path = db.to_path_buf();
    Ok(GroupCommit::spawn(
        store,
        GroupConfig::default(),
        move || Store::open(&path, StoreConfig::default()),
    ))
}

/// Wall-clock time for the machines the peers drive.
pub(crate) fn now() -> UnixMillis {
    let d = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap_or_default();
    UnixMillis(d.as_millis() as u64)
}
