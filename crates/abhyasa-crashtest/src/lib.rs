//! The processes the SIGKILL crash tests kill, at named points: custody peers
//! ([`crashpeer`]) and ledger branches and gateway ([`ledgerpeer`]) on real redb stores over
//! UDP on loopback. Not part of what embedders link; the tests live in `tests/`.

#![warn(missing_docs)]

pub mod crashpeer;
mod killpoint;
pub mod ledgerpeer;

use std::net::{SocketAddr, UdpSocket};
use std::time::{Duration, Instant};

/// How long a restarted peer keeps trying to bind its fixed address while something else holds
/// it for a moment (a test's port probe, which binds and releases).
const BIND_PATIENCE: Duration = Duration::from_secs(5);

/// Binds the peer's fixed address, retrying while it is in use for up to [`BIND_PATIENCE`]. The
/// tests hand each peer a port they probed free, and restart peers on the same port many times;
/// another test's probe can hold that port for the instant between its bind and its release.
/// A port held for longer is a real conflict, and the error says so.
fn bind_fixed(addr: SocketAddr) -> std::io::Result<UdpSocket> {
    bind_within(addr, BIND_PATIENCE)
}

fn bind_within(addr: SocketAddr, patience: Duration) -> std::io::Result<UdpSocket> {
    let until = Instant::now() + patience;
    loop {
        match UdpSocket::bind(addr) {
            Err(e) if e.kind() == std::io::ErrorKind::AddrInUse && Instant::now() < until => {
                std::thread::sleep(Duration::from_millis(20));
            }
            r => return r,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_port_held_for_a_moment_is_bound_once_released_and_one_held_for_good_is_an_error() {
        let held = UdpSocket::bind("127.0.0.1:0").unwrap();
        let addr = held.local_addr().unwrap();
        let release = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(200));
            drop(held);
        });
        let bound = bind_within(addr, Duration::from_secs(5)).expect("bound after the release");
        assert_eq!(bound.local_addr().unwrap(), addr);
        release.join().unwrap();

        let err = bind_within(addr, Duration::from_millis(100)).unwrap_err();
        assert_eq!(err.kind(), std::io::ErrorKind::AddrInUse);
    }
}
