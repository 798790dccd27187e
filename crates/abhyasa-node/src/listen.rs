//! What every TCP listener beside the node shares (the admin interface, the A2A HTTPS face,
//! MCP over HTTP): nothing a client does may stop it or take the descriptors the node's store
//! and peers need.
//!
//! - A failed `accept` (EMFILE, ENFILE: descriptors exhausted) is logged and retried with
//!   backoff ([`AcceptBackoff`]); it never ends the listener.
//! - Connections that have not yet shown who they are — still in their TLS handshake, or
//!   not yet past their first request head — are counted ([`Waiting`]); past a cap the
//!   oldest is closed for the new one, so idle connections cannot crowd out a real client.
//!   The cap is a share of the process's descriptor limit ([`waiting_cap`]), the rest kept
//!   for the store, the peers and the other listeners.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use tokio::task::AbortHandle;

/// Connections one listener lets wait at once: `1/share` of this process's descriptor soft
/// limit, within 16..=1,024.
pub fn waiting_cap(share: u64) -> usize {
    let soft = rlimit::getrlimit(rlimit::Resource::NOFILE).map_or(1_024, |(soft, _)| soft);
    usize::try_from(soft / share.max(1))
        .unwrap_or(1_024)
        .clamp(16, 1_024)
}

/// The connections of one listener still waiting to show who they are, oldest first. Shared
/// by the accept loop and the connections' tasks.
#[derive(Clone)]
pub struct Waiting {
    inner: Arc<Mutex<WaitingInner>>,
    cap: usize,
}

#[derive(Default)]
struct WaitingInner {
    last: u64,
    queue: VecDeque<(u64, AbortHandle)>,
}

impl Waiting {
    /// At most `cap` (at least one) connections wait at once.
    pub fn new(cap: usize) -> Self {
        Self {
            inner: Arc::default(),
            cap: cap.max(1),
        }
    }

    fn lock(&self) -> MutexGuard<'_, WaitingInner> {
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// A fresh id for the next connection.
    pub fn next_id(&self) -> u64 {
        let mut g = self.lock();
        g.last += 1;
        g.last
    }

    /// Counts connection `id` (served by the task of `handle`) as waiting; aborts the oldest
    /// waiting ones past the cap. Returns how many were closed.
    pub fn admit(&self, id: u64, handle: AbortHandle) -> usize {
        let mut g = self.lock();
        g.queue.retain(|(_, h)| !h.is_finished());
        let mut closed = 0;
        while g.queue.len() >= self.cap {
            if let Some((_, oldest)) = g.queue.pop_front() {
                oldest.abort();
                closed += 1;
            }
        }
        g.queue.push_back((id, handle));
        closed
    }

    /// Connection `id` has shown who it is (or ended): it no longer counts.
    pub fn done(&self, id: u64) {
        self.lock().queue.retain(|(i, _)| *i != id);
    }

    /// How many wait now.
    #[cfg(test)]
    fn len(&self) -> usize {
        let mut g = self.lock();
        g.queue.retain(|(_, h)| !h.is_finished());
        g.queue.len()
    }
}

/// Connections already authenticated, counted per peer (a member's certificate, a bearer
/// token): past `cap` a peer's new connection is refused, so one peer holding many cannot
/// take the descriptors another needs. Each claim is a [`PeerSlot`], given back when dropped.
#[derive(Clone)]
pub struct PerPeer<K> {
    inner: Arc<Mutex<std::collections::HashMap<K, usize>>>,
    cap: usize,
}

impl<K: Clone + Eq + std::hash::Hash> PerPeer<K> {
    /// At most `cap` (at least one) connections per peer.
    pub fn new(cap: usize) -> Self {
        Self {
            inner: Arc::default(),
            cap: cap.max(1),
        }
    }

    /// A slot for one more connection of `peer`, or `None` when it holds `cap` already.
    pub fn claim(&self, peer: K) -> Option<PeerSlot<K>> {
        let mut g = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        let n = g.entry(peer.clone()).or_default();
        if *n >= self.cap {
            return None;
        }
        *n += 1;
        Some(PeerSlot {
            owner: self.clone(),
            peer,
        })
    }

    /// Connections `peer` holds now.
    pub fn held(&self, peer: &K) -> usize {
        let g = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        g.get(peer).copied().unwrap_or(0)
    }
}

/// One connection counted against its peer's share ([`PerPeer::claim`]); dropping it gives
/// the place back.
pub struct PeerSlot<K: Clone + Eq + std::hash::Hash> {
    owner: PerPeer<K>,
    peer: K,
}

impl<K: Clone + Eq + std::hash::Hash> Drop for PeerSlot<K> {
    fn drop(&mut self) {
        let mut g = self.owner.inner.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(n) = g.get_mut(&self.peer) {
            *n = n.saturating_sub(1);
            if *n == 0 {
                g.remove(&self.peer);
            }
        }
    }
}

/// The pause after a failed `accept`: 10 ms, doubling to 1 s, back to 10 ms after a success.
#[derive(Debug)]
pub struct AcceptBackoff {
    next: Duration,
}

impl Default for AcceptBackoff {
    fn default() -> Self {
        Self { next: Self::MIN }
    }
}

impl AcceptBackoff {
    /// The first pause.
    pub const MIN: Duration = Duration::from_millis(10);
    /// The longest pause.
    pub const MAX: Duration = Duration::from_secs(1);

    /// An accept succeeded.
    pub fn reset(&mut self) {
        self.next = Self::MIN;
    }

    /// An accept of `listener` failed with `error`: logs it and sleeps the pause.
    pub async fn failed(&mut self, listener: &str, error: &std::io::Error) {
        tracing::warn!(
            listener,
            %error,
            retry_in_ms = self.next.as_millis() as u64,
            "accept failed; retrying"
        );
        tokio::time::sleep(self.next).await;
        self.next = (self.next * 2).min(Self::MAX);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_peer_holds_at_most_its_share_and_a_dropped_slot_gives_it_back() {
        let p = PerPeer::new(2);
        let a1 = p.claim("a").expect("first");
        let _a2 = p.claim("a").expect("second");
        assert!(p.claim("a").is_none(), "a third past the cap");
        // Another peer has a share of its own.
        let _b = p.claim("b").expect("another peer");
        assert_eq!((p.held(&"a"), p.held(&"b")), (2, 1));
        drop(a1);
        assert_eq!(p.held(&"a"), 1);
        assert!(p.claim("a").is_some());
    }

    #[tokio::test]
    async fn past_the_cap_the_oldest_waiting_connection_is_closed() {
        let w = Waiting::new(2);
        let mut tasks = Vec::new();
        for _ in 0..3 {
            let t = tokio::spawn(std::future::pending::<()>());
            let id = w.next_id();
            tasks.push((id, w.admit(id, t.abort_handle()), t));
        }
        assert_eq!(
            tasks.iter().map(|t| t.1).collect::<Vec<_>>(),
            [0, 0, 1],
            "the third connection closes one"
        );
        let (first, _, t) = tasks.remove(0);
        assert!(t.await.unwrap_err().is_cancelled(), "the oldest is closed");
        assert_eq!(w.len(), 2);
        // One that showed who it is no longer counts, and is never closed for another.
        w.done(tasks[0].0);
        assert_eq!(w.len(), 1);
        let t = tokio::spawn(std::future::pending::<()>());
        let id = w.next_id();
        assert_eq!(w.admit(id, t.abort_handle()), 0);
        assert!(id > first);
        assert!(!tasks[0].2.is_finished());
    }

    #[test]
    fn the_cap_is_a_share_of_the_descriptor_limit_within_bounds() {
        let cap = waiting_cap(4);
        assert!((16..=1_024).contains(&cap));
        assert!(waiting_cap(1_000_000) == 16);
    }
}
