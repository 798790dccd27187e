//! A UDP relay that impairs both directions: clients send to `listen`, the relay forwards to
//! `forward`, and replies go back to the client that last sent. Put it between two unmodified
//! nodes: dial the relay's address instead of the peer's.

use std::cmp::Reverse;
use std::collections::BinaryHeap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tokio::net::UdpSocket;

use crate::{Emulator, Impairment, Stats, Verdict};

/// Relay settings.
#[derive(Clone, Debug)]
pub struct RelayConfig {
    /// Where clients send.
    pub listen: SocketAddr,
    /// Where the relay forwards.
    pub forward: SocketAddr,
    /// Client → server impairment.
    pub up: Impairment,
    /// Server → client impairment.
    pub down: Impairment,
    /// Seed for both directions.
    pub seed: u64,
}

/// Counters of a running relay.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RelayStats {
    /// Client → server.
    pub up: Stats,
    /// Server → client.
    pub down: Stats,
}

/// A running relay.
#[derive(Debug)]
pub struct Relay {
    local: SocketAddr,
    stats: Arc<Mutex<RelayStats>>,
    task: tokio::task::JoinHandle<()>,
}

impl Relay {
    /// Binds and starts the relay.
    pub async fn start(config: RelayConfig) -> std::io::Result<Relay> {
        let front = UdpSocket::bind(config.listen).await?;
        let back_bind: SocketAddr = if config.forward.is_ipv4() {
            "0.0.0.0:0".parse().expect("valid")
        } else {
            "[::]:0".parse().expect("valid")
        };
        let back = UdpSocket::bind(back_bind).await?;
        back.connect(config.forward).await?;
        let local = front.local_addr()?;
        let stats = Arc::new(Mutex::new(RelayStats::default()));
        let task = tokio::spawn(run(front, back, config, stats.clone()));
        Ok(Relay { local, stats, task })
    }

    /// The address clients send to.
    pub fn local_addr(&self) -> SocketAddr {
        self.local
    }

    /// Counters so far.
    pub fn stats(&self) -> RelayStats {
        *self.stats.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Stops the relay.
    pub fn stop(self) {
        self.task.abort();
    }
}

impl Drop for Relay {
    fn drop(&mut self) {
        self.task.abort();
    }
}

#[derive(PartialEq, Eq, PartialOrd, Ord)]
struct Due {
    at: u64,
    seq: u64,
    up: bool,
    bytes: Vec<u8>,
}

async fn run(
    front: UdpSocket,
    back: UdpSocket,
    config: RelayConfig,
    stats: Arc<Mutex<RelayStats>>,
) {
    let start = Instant::now();
    let now = || start.elapsed().as_micros() as u64;
    let mut up = Emulator::new(config.up, config.seed);
    let mut down = Emulator::new(config.down, config.seed ^ 0x5bd1_e995);
    let mut queue: BinaryHeap<Reverse<Due>> = BinaryHeap::new();
    let mut client: Option<SocketAddr> = None;
    let mut seq = 0u64;
    let (mut a, mut b) = (vec![0u8; 65_536], vec![0u8; 65_536]);
    loop {
        let wait = queue
            .peek()
            .map(|Reverse(d)| Duration::from_micros(d.at.saturating_sub(now())))
            .unwrap_or(Duration::from_secs(3600));
        tokio::select! {
            r = front.recv_from(&mut a) => {
                let Ok((n, from)) = r else { continue };
                client = Some(from);
                if let Verdict::Deliver(times) = up.handle_packet(now(), n) {
                    for at in times {
                        seq += 1;
                        queue.push(Reverse(Due { at, seq, up: true, bytes: a[..n].to_vec() }));
                    }
                }
            }
            r = back.recv(&mut b) => {
                let Ok(n) = r else { continue };
                if let Verdict::Deliver(times) = down.handle_packet(now(), n) {
                    for at in times {
                        seq += 1;
                        queue.push(Reverse(Due { at, seq, up: false, bytes: b[..n].to_vec() }));
                    }
                }
            }
            () = tokio::time::sleep(wait) => {
                let t = now();
                while queue.peek().is_some_and(|Reverse(d)| d.at <= t) {
                    let Some(Reverse(d)) = queue.pop() else { break };
                    if d.up {
                        let _ = back.send(&d.bytes).await;
                    } else if let Some(c) = client {
                        let _ = front.send_to(&d.bytes, c).await;
                    }
                }
            }
        }
        *stats.lock().unwrap_or_else(|e| e.into_inner()) = RelayStats {
            up: up.stats(),
            down: down.stats(),
        };
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn the_relay_delays_both_ways_and_counts_losses() {
        let server = UdpSocket::bind("127.0.0.1:0").await.unwrap();
        let server_addr = server.local_addr().unwrap();
        tokio::spawn(async move {
            let mut buf = [0u8; 2048];
            while let Ok((n, from)) = server.recv_from(&mut buf).await {
                let _ = server.send_to(&buf[..n], from).await;
            }
        });
        let relay = Relay::start(RelayConfig {
            listen: "127.0.0.1:0".parse().unwrap(),
            forward: server_addr,
            up: "delay 20ms".parse().unwrap(),
            down: "delay 20ms".parse().unwrap(),
            seed: 1,
        })
        .await
        .unwrap();
        let client = UdpSocket::bind("127.0.0.1:0").await.unwrap();
        client.connect(relay.local_addr()).await.unwrap();
        let mut buf = [0u8; 64];
        for i in 0..5u8 {
            let sent = Instant::now();
            client.send(&[i]).await.unwrap();
            let n = tokio::time::timeout(Duration::from_secs(2), client.recv(&mut buf))
                .await
                .unwrap()
                .unwrap();
            assert_eq!(&buf[..n], &[i]);
            let rtt = sent.elapsed();
            assert!(
                rtt >= Duration::from_millis(40),
                "round trip {rtt:?} under the 40 ms configured"
            );
        }
        let s = relay.stats();
        assert_eq!((s.up.offered, s.down.offered), (5, 5));
    }
}
