//! The node's clock: every timer of the node is a deadline on it.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use abhyasa_wire::UnixMillis;

fn wall_clock() -> UnixMillis {
    let d = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap_or_default();
    UnixMillis(d.as_millis() as u64)
}

/// The node's clock: Unix milliseconds read off tokio's monotonic clock from an anchor taken
/// at start. Every timer of the node is a deadline on this clock, so a test on tokio's paused
/// clock moves the node's time with its own, and a step of the wall clock backwards never
/// moves a deadline. [`Clock::resync`] (with maintenance) moves the anchor forward when the
/// wall clock has run ahead of it, never back.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Clock {
    unix_ms: u64,
    at: tokio::time::Instant,
}

impl Clock {
    pub(crate) fn start() -> Self {
        Self {
            unix_ms: wall_clock().0,
            at: tokio::time::Instant::now(),
        }
    }

    pub(crate) fn now(&self) -> UnixMillis {
        let elapsed = u64::try_from(self.at.elapsed().as_millis()).unwrap_or(u64::MAX);
        UnixMillis(self.unix_ms.saturating_add(elapsed))
    }

    /// The instant at which this clock reads `t` (now, for a time already past).
    pub(crate) fn instant(&self, t: UnixMillis) -> tokio::time::Instant {
        let now = self.now();
        tokio::time::Instant::now() + Duration::from_millis(t.0.saturating_sub(now.0))
    }

    /// Moves the anchor forward to the wall clock if that has run ahead; never back.
    pub(super) fn resync(&mut self) {
        let (wall, now) = (wall_clock().0, self.now().0);
        if wall > now {
            self.unix_ms = self.unix_ms.saturating_add(wall - now);
        }
    }
}
