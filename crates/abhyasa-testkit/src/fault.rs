//! A fault-injecting redb [`StorageBackend`] for crash tests: an in-memory disk with a
//! volatile image (what writes reach) and a durable image (what survived the last sync).
//!
//! - [`FaultPlan::PowerLossAfterSync`]`(n)`: right after the n-th sync completes the power
//!   goes; every later write and sync fails, and only the durable image survives.
//! - [`FaultPlan::FailSync`]`(n)`: the n-th sync returns an I/O error and persists nothing;
//!   the device is dead from then on.
//!
//! - [`FaultPlan::NoSpace`]: the file system is full, as a sparse file sees it — growing the
//!   file, or writing to a block never written before (a hole), fails with ENOSPC (`os error
//!   28`) and changes nothing; rewriting blocks already written, reads and syncs go on — until
//!   [`FaultyBackend::arm`] sets another plan. What a full file system does to a store,
//!   without a file system.
//!
//! - [`FaultPlan::Stall`]: the device stops answering syncs (a hung disk, a lost network
//!   volume): every sync waits, and nothing it would persist is durable, until
//!   [`FaultyBackend::arm`] sets another plan.
//!
//! [`FaultyBackend::power_cycle`] gives a fresh backend on the surviving durable image.

use std::io;
use std::sync::{Arc, Condvar, Mutex, MutexGuard};

use redb::StorageBackend;

/// When the backend fails.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FaultPlan {
    /// Never.
    None,
    /// Power loss right after this (1-based) sync.
    PowerLossAfterSync(u64),
    /// This (1-based) sync fails with an I/O error.
    FailSync(u64),
    /// Full: writes, growth and syncs fail with ENOSPC until another plan is armed.
    NoSpace,
    /// Hung: syncs wait until another plan is armed.
    Stall,
}

#[derive(Debug)]
struct Disk {
    volatile: Vec<u8>,
    durable: Vec<u8>,
    syncs: u64,
    plan: FaultPlan,
    dead: bool,
    /// Operations refused under [`FaultPlan::NoSpace`].
    refused: u64,
    /// Syncs waiting now on a [`FaultPlan::Stall`].
    stalled: u64,
    /// The 4 KiB blocks ever written (what a full file system can still rewrite).
    written: std::collections::BTreeSet<u64>,
}

const BLOCK: u64 = 4096;

/// The backend. Clones share one disk, so a test keeps a handle while redb owns another.
#[derive(Clone, Debug)]
pub struct FaultyBackend(Arc<Shared>);

#[derive(Debug)]
struct Shared {
    disk: Mutex<Disk>,
    /// Signalled when a plan is armed (a stalled sync waits on it).
    armed: Condvar,
}

impl FaultyBackend {
    /// An empty disk with a fault plan.
    pub fn new(plan: FaultPlan) -> Self {
        Self::with_image(Vec::new(), plan)
    }

    fn with_image(image: Vec<u8>, plan: FaultPlan) -> Self {
        let image_len = image.len() as u64;
        Self(Arc::new(Shared {
            disk: Mutex::new(Disk {
                volatile: image.clone(),
                durable: image,
                syncs: 0,
                plan,
                dead: false,
                refused: 0,
                stalled: 0,
                written: (0..image_len.div_ceil(BLOCK)).collect(),
            }),
            armed: Condvar::new(),
        }))
    }

    /// A fresh backend on what survived (the durable image), with a new fault plan.
    pub fn power_cycle(&self, plan: FaultPlan) -> Self {
        Self::with_image(self.disk().durable.clone(), plan)
    }

    /// Arms a fault counted from now: `FailSync(1)` fails the next sync.
    pub fn arm(&self, plan: FaultPlan) {
        let mut disk = self.disk();
        let base = disk.syncs;
        disk.plan = match plan {
            FaultPlan::None => FaultPlan::None,
            FaultPlan::PowerLossAfterSync(n) => FaultPlan::PowerLossAfterSync(base + n),
            FaultPlan::FailSync(n) => FaultPlan::FailSync(base + n),
            FaultPlan::NoSpace => FaultPlan::NoSpace,
            FaultPlan::Stall => FaultPlan::Stall,
        };
        drop(disk);
        self.0.armed.notify_all();
    }

    /// Writes, growths and syncs refused for want of space so far.
    pub fn refused_for_space(&self) -> u64 {
        self.disk().refused
    }

    /// Syncs completed so far.
    pub fn syncs(&self) -> u64 {
        self.disk().syncs
    }

    /// Syncs held now by [`FaultPlan::Stall`] (a writer is inside its commit).
    pub fn stalled(&self) -> u64 {
        self.disk().stalled
    }

    /// Whether the fault has struck.
    pub fn is_dead(&self) -> bool {
        self.disk().dead
    }

    fn disk(&self) -> MutexGuard<'_, Disk> {
        // A panic while holding the lock cannot leave the images half-written: every
        // mutation below is a single assignment or copy.
        self.0.disk.lock().unwrap_or_else(|e| e.into_inner())
    }
}

fn dead() -> io::Error {
    io::Error::other("injected fault: device is gone")
}

impl Disk {
    /// Fails, while the disk is full, an operation that needs new space: bytes `offset..end`
    /// of which some lie past the end or in a block never written.
    fn check_space(&mut self, offset: u64, end: u64) -> Result<(), io::Error> {
        if self.plan != FaultPlan::NoSpace || offset >= end {
            return Ok(());
        }
        let past_end = end > self.volatile.len() as u64;
        let hole = (offset / BLOCK..end.div_ceil(BLOCK)).any(|b| !self.written.contains(&b));
        if past_end || hole {
            self.refused += 1;
            // ENOSPC: "No space left on device (os error 28)".
            return Err(io::Error::from_raw_os_error(28));
        }
        Ok(())
    }
}

impl StorageBackend for FaultyBackend {
    fn len(&self) -> Result<u64, io::Error> {
        Ok(self.disk().volatile.len() as u64)
    }

    fn read(&self, offset: u64, out: &mut [u8]) -> Result<(), io::Error> {
        let disk = self.disk();
        let start = usize::try_from(offset).map_err(|_| io::Error::other("offset overflow"))?;
        let end = start
            .checked_add(out.len())
            .filter(|&e| e <= disk.volatile.len())
            .ok_or_else(|| io::Error::new(io::ErrorKind::UnexpectedEof, "read past the end"))?;
        out.copy_from_slice(&disk.volatile[start..end]);
        Ok(())
    }

    fn set_len(&self, len: u64) -> Result<(), io::Error> {
        let mut disk = self.disk();
        if disk.dead {
            return Err(dead());
        }
        let current = disk.volatile.len() as u64;
        disk.check_space(current, len)?;
        let len = usize::try_from(len).map_err(|_| io::Error::other("length overflow"))?;
        disk.volatile.resize(len, 0);
        Ok(())
    }

    fn sync_data(&self) -> Result<(), io::Error> {
        let mut disk = self.disk();
        if disk.plan == FaultPlan::Stall {
            disk.stalled += 1;
            while disk.plan == FaultPlan::Stall {
                disk = self.0.armed.wait(disk).unwrap_or_else(|e| e.into_inner());
            }
            disk.stalled -= 1;
        }
        if disk.dead {
            return Err(dead());
        }
        disk.syncs += 1;
        match disk.plan {
            FaultPlan::FailSync(n) if disk.syncs == n => {
                disk.dead = true;
                return Err(io::Error::other("injected fault: fsync failed"));
            }
            FaultPlan::PowerLossAfterSync(n) if disk.syncs == n => {
                disk.durable = disk.volatile.clone();
                disk.dead = true;
            }
            _ => disk.durable = disk.volatile.clone(),
        }
        Ok(())
    }

    fn write(&self, offset: u64, data: &[u8]) -> Result<(), io::Error> {
        let mut disk = self.disk();
        if disk.dead {
            return Err(dead());
        }
        let start = usize::try_from(offset).map_err(|_| io::Error::other("offset overflow"))?;
        let end = start
            .checked_add(data.len())
            .ok_or_else(|| io::Error::other("write overflow"))?;
        disk.check_space(offset, end as u64)?;
        if !data.is_empty() {
            let blocks = offset / BLOCK..(end as u64).div_ceil(BLOCK);
            disk.written.extend(blocks);
        }
        if end > disk.volatile.len() {
            disk.volatile.resize(end, 0);
        }
        disk.volatile[start..end].copy_from_slice(data);
        Ok(())
    }
}
