//! An impaired UDP socket for quinn: every datagram an endpoint sends passes through a netem
//! rule core ([`abhyasa_netem::Emulator`]) first — dropped, delayed, duplicated or reordered
//! in process, with no relay and no kernel netem. Impair both endpoints' sockets to impair
//! both directions.

use std::fmt;
use std::io;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use abhyasa_netem::{Emulator, Impairment, Stats, Verdict};
use quinn::udp::{RecvMeta, Transmit};
use quinn::{AsyncUdpSocket, UdpPoller};

/// A socket whose sends are impaired. Receives pass through untouched.
pub struct ImpairedSocket {
    inner: Arc<dyn AsyncUdpSocket>,
    emulator: Arc<Mutex<Emulator>>,
    start: Instant,
    handle: tokio::runtime::Handle,
}

/// Reads the counters of an impaired socket, and changes its rules, while quinn owns it.
#[derive(Clone)]
pub struct ImpairmentHandle {
    emulator: Arc<Mutex<Emulator>>,
    start: Instant,
}

impl ImpairmentHandle {
    /// Counters so far.
    pub fn stats(&self) -> Stats {
        self.lock().stats()
    }

    /// Time since the socket was created: the clock its partition windows are measured on.
    pub fn elapsed(&self) -> Duration {
        self.start.elapsed()
    }

    /// Replaces the rules from the next packet on (the seeded randomness and the counters
    /// carry over). With [`elapsed`](Self::elapsed) this schedules a partition that starts
    /// at the same moment on several sockets.
    pub fn set_rules(&self, spec: Impairment) {
        self.lock().set_spec(spec);
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Emulator> {
        self.emulator.lock().unwrap_or_else(|e| e.into_inner())
    }
}

impl fmt::Debug for ImpairmentHandle {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_tuple("ImpairmentHandle")
            .field(&self.stats())
            .finish()
    }
}

impl ImpairedSocket {
    /// Wraps `inner` (a socket from quinn's runtime). Must be called inside a tokio runtime.
    pub fn new(
        inner: Arc<dyn AsyncUdpSocket>,
        spec: Impairment,
        seed: u64,
    ) -> (Arc<Self>, ImpairmentHandle) {
        let emulator = Arc::new(Mutex::new(Emulator::new(spec, seed)));
        let start = Instant::now();
        let socket = Arc::new(Self {
            inner,
            emulator: emulator.clone(),
            start,
            handle: tokio::runtime::Handle::current(),
        });
        (socket, ImpairmentHandle { emulator, start })
    }
}

impl fmt::Debug for ImpairedSocket {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ImpairedSocket").finish_non_exhaustive()
    }
}

impl AsyncUdpSocket for ImpairedSocket {
    fn create_io_poller(self: Arc<Self>) -> Pin<Box<dyn UdpPoller>> {
        self.inner.clone().create_io_poller()
    }

    fn try_send(&self, transmit: &Transmit<'_>) -> io::Result<()> {
        let now = self.start.elapsed().as_micros() as u64;
        let verdict = self
            .emulator
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .handle_packet(now, transmit.contents.len());
        let Verdict::Deliver(times) = verdict else {
            return Ok(()); // Lost on the wire: the sender cannot tell.
        };
        for at in times {
            if at <= now {
                self.inner.try_send(transmit)?;
                continue;
            }
            // Later: own the bytes and send from a timer task.
            let (inner, contents) = (self.inner.clone(), transmit.contents.to_vec());
            let (destination, ecn, segment_size, src_ip) = (
                transmit.destination,
                transmit.ecn,
                transmit.segment_size,
                transmit.src_ip,
            );
            self.handle.spawn(async move {
                tokio::time::sleep(Duration::from_micros(at - now)).await;
                let t = Transmit {
                    destination,
                    ecn,
                    contents: &contents,
                    segment_size,
                    src_ip,
                };
                for _ in 0..100 {
                    match inner.try_send(&t) {
                        Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                            tokio::time::sleep(Duration::from_micros(200)).await;
                        }
                        _ => break,
                    }
                }
            });
        }
        Ok(())
    }

    fn poll_recv(
        &self,
        cx: &mut Context<'_>,
        bufs: &mut [io::IoSliceMut<'_>],
        meta: &mut [RecvMeta],
    ) -> Poll<io::Result<usize>> {
        self.inner.poll_recv(cx, bufs, meta)
    }

    fn local_addr(&self) -> io::Result<SocketAddr> {
        self.inner.local_addr()
    }

    fn max_transmit_segments(&self) -> usize {
        1 // One datagram per transmit, so each is impaired on its own.
    }

    fn max_receive_segments(&self) -> usize {
        self.inner.max_receive_segments()
    }

    fn may_fragment(&self) -> bool {
        self.inner.may_fragment()
    }
}
