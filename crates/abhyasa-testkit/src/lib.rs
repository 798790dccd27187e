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

/// A loopback UDP address nothing listens on (bound, read, released).
pub fn free_udp() -> SocketAddr {
    UdpSocket::bind("127.0.0.1:0")
        .and_then(|s| s.local_addr())
        .expect("a loopback UDP port")
}

/// A loopback TCP port nothing listens on (bound, read, released).
pub fn free_tcp() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("a loopback TCP port")
        .port()
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
