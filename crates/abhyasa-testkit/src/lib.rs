//! Fixtures the tests and benchmarks of every crate share: names, the clock, free loopback
//! ports, obligations, short custody timers, a poll with a deadline, and a disk that fails on
//! cue ([`fault`]). A dev-dependency only: no crate a user links depends on it.
//!
//! Fixtures panic on failure (a test that cannot bind a loopback port has nothing to test).

#![warn(missing_docs)]

pub mod fault;

use std::net::{SocketAddr, TcpListener, UdpSocket};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use abhyasa_custody::CustodianConfig;
use abhyasa_wire::{
    AgentId, ClientId, Obligation, ObligationId, Payload, TokenAction, TokenId, TokenPayload,
    UnixMillis,
};

/// The agent id `s` (which must be a valid one).
pub fn id(s: &str) -> AgentId {
    AgentId::new(s).expect("a valid agent id")
}

/// Now, in unix ms.
pub fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .expect("a clock after 1970")
        .as_millis() as u64
}

/// Ports handed out by [`free_udp`] and [`free_tcp`] come from below Linux's default ephemeral
/// range (32768–60999), so no socket bound to port 0 (a QUIC client, another process) can take
/// one while its owner is down between a SIGKILL and a restart; and this process never hands out
/// the same port twice, so tests running side by side cannot be given one port.
const PORTS: std::ops::Range<u16> = 20_000..32_000;

/// The next port of [`PORTS`] for which `free` holds, never one handed out before by this
/// process. Each process starts at an offset of its own so that test binaries run at the same
/// time rarely probe the same ports (and a port in use is skipped anyway).
fn next_port(free: impl Fn(u16) -> bool) -> u16 {
    use std::sync::atomic::{AtomicU32, Ordering};
    static NEXT: AtomicU32 = AtomicU32::new(u32::MAX);
    let span = u32::from(PORTS.end - PORTS.start);
    let _ = NEXT.compare_exchange(
        u32::MAX,
        std::process::id().wrapping_mul(7_919) % span,
        Ordering::Relaxed,
        Ordering::Relaxed,
    );
    for _ in 0..span {
        let n = NEXT.fetch_add(1, Ordering::Relaxed) % span;
        let port = PORTS.start + n as u16;
        if free(port) {
            return port;
        }
    }
    panic!("no free loopback port in {PORTS:?}")
}

/// A loopback UDP address nothing listens on (probed, released), from outside the ephemeral
/// range and never handed out before by this process.
pub fn free_udp() -> SocketAddr {
    let port = next_port(|p| UdpSocket::bind(("127.0.0.1", p)).is_ok());
    SocketAddr::from(([127, 0, 0, 1], port))
}

/// A loopback TCP port nothing listens on (probed, released), from outside the ephemeral range
/// and never handed out before by this process.
pub fn free_tcp() -> u16 {
    next_port(|p| TcpListener::bind(("127.0.0.1", p)).is_ok())
}

/// Polls `f` every 100 ms until it holds; panics naming `what` after `limit`.
pub fn wait_for(what: &str, limit: Duration, mut f: impl FnMut() -> bool) {
    let until = Instant::now() + limit;
    while Instant::now() < until {
        if f() {
            return;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    panic!("timed out waiting for {what}");
}

/// Custody timers short enough for tests to run in seconds (150 ms response timeout,
/// backoff from 50 to 300 ms).
pub fn short_custodian() -> CustodianConfig {
    CustodianConfig {
        response_timeout_ms: 150,
        backoff_base_ms: 50,
        backoff_cap_ms: 300,
        ..CustodianConfig::default()
    }
}

/// Obligation `n` from `issuer` to `target` carrying `payload`, created now, due
/// `deadline_ms` from now, with `max_retries`.
pub fn obligation(
    n: u128,
    issuer: &AgentId,
    target: &AgentId,
    deadline_ms: u64,
    max_retries: u32,
    payload: Payload,
) -> Obligation {
    let t = now_ms();
    Obligation {
        id: ObligationId::from_u128(n),
        issuer: issuer.clone(),
        target: target.clone(),
        created_at: UnixMillis(t),
        deadline: UnixMillis(t + deadline_ms),
        max_retries,
        sequence: None,
        payload,
    }
}

/// The revocation of token `token` (client `c`, no expiry).
pub fn token_revocation(token: &str) -> Payload {
    Payload::OauthToken(TokenPayload {
        action: TokenAction::Revoke,
        token_id: TokenId::new(token).expect("a valid token id"),
        client_id: ClientId::new("c").expect("a valid client id"),
        expires_at: None,
    })
}

/// A revocation of token `tok-<n>` from `principal` to `target`, due `deadline_ms` from now,
/// with 40 retries.
pub fn revoke(n: u128, target: &AgentId, deadline_ms: u64) -> Obligation {
    obligation(
        n,
        &id("principal"),
        target,
        deadline_ms,
        40,
        token_revocation(&format!("tok-{n}")),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_revocation_is_due_after_it_is_made_and_names_its_token() {
        let o = revoke(7, &id("agent-1"), 5_000);
        assert_eq!(o.id, ObligationId::from_u128(7));
        assert_eq!(o.deadline.0 - o.created_at.0, 5_000);
        assert_eq!(o.issuer, id("principal"));
        let Payload::OauthToken(t) = &o.payload else {
            panic!("a token payload")
        };
        assert_eq!(t.token_id.as_str(), "tok-7");
    }

    #[test]
    fn free_ports_are_on_loopback_and_not_zero() {
        let a = free_udp();
        assert!(a.ip().is_loopback() && a.port() != 0);
        assert_ne!(free_tcp(), 0);
    }
}

#[cfg(test)]
mod port_tests {
    use super::*;

    #[test]
    fn ports_are_never_handed_out_twice_and_are_not_ephemeral() {
        let mut seen = std::collections::BTreeSet::new();
        for _ in 0..200 {
            let udp = free_udp().port();
            let tcp = free_tcp();
            for p in [udp, tcp] {
                assert!(PORTS.contains(&p), "{p} is outside {PORTS:?}");
                assert!(seen.insert(p), "{p} handed out twice");
            }
        }
    }
}
