//! Fixtures shared by the node tests.
#![allow(dead_code)] // Each test binary uses its own subset.

use std::time::{SystemTime, UNIX_EPOCH};

use abhyasa_custody::CustodianConfig;
use abhyasa_wire::{
    AgentId, ClientId, Obligation, ObligationId, Payload, TokenAction, TokenId, TokenPayload,
    UnixMillis,
};

/// An agent id.
pub fn id(s: &str) -> AgentId {
    AgentId::new(s).unwrap()
}

/// Now, in unix ms.
pub fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_millis() as u64
}

/// A loopback address nothing listens on.
pub fn free_addr() -> std::net::SocketAddr {
    std::net::UdpSocket::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
}

/// A token revocation `tok-<n>` from `principal` to `target`, due `deadline_ms` from now.
pub fn revoke(n: u128, target: &AgentId, deadline_ms: u64) -> Obligation {
    let t = now_ms();
    Obligation {
        id: ObligationId::from_u128(n),
        issuer: id("principal"),
        target: target.clone(),
        created_at: UnixMillis(t),
        deadline: UnixMillis(t + deadline_ms),
        max_retries: 40,
        sequence: None,
        payload: Payload::OauthToken(TokenPayload {
            action: TokenAction::Revoke,
            token_id: TokenId::new(format!("tok-{n}")).unwrap(),
            client_id: ClientId::new("c").unwrap(),
            expires_at: None,
        }),
    }
}

/// Short custody timers, so tests run in seconds.
pub fn custodian() -> CustodianConfig {
    CustodianConfig {
        response_timeout_ms: 150,
        backoff_base_ms: 50,
        backoff_cap_ms: 300,
        ..CustodianConfig::default()
    }
}
