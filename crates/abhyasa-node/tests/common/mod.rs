//! Fixtures shared by the node tests.
#![allow(dead_code)] // Each test binary uses its own subset.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use abhyasa_moq::{Ca, Session, SessionEvent};
use abhyasa_node::Node;
use tokio::sync::mpsc;

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

/// A raw custody session of `who` with the node, set up (the node subscribed to all three
/// tracks addressed to it), with its events and endpoint.
pub async fn session(
    ca: &Ca,
    who: &AgentId,
    node: &Node,
) -> (Session, mpsc::Receiver<SessionEvent>, quinn::Endpoint) {
    let ep = abhyasa_moq::endpoint(
        &ca.issue(who).unwrap(),
        "127.0.0.1:0".parse().unwrap(),
        &abhyasa_moq::TransportSettings::default(),
    )
    .unwrap();
    let (s, mut rx) = Session::connect(&ep, node.local_addr(), node.agent(), who)
        .await
        .unwrap();
    // The node has subscribed to all that is addressed to it: the session is up on its side.
    tokio::time::timeout(Duration::from_secs(5), async {
        let mut tracks = std::collections::BTreeSet::new();
        while let Some(e) = rx.recv().await {
            if let SessionEvent::PeerSubscribed(t) = e {
                tracks.insert(format!("{t:?}"));
                if tracks.len() == 3 {
                    return;
                }
            }
        }
    })
    .await
    .expect("the node subscribed");
    (s, rx, ep)
}
