//! Fixtures shared by the node tests.
#![allow(dead_code)] // Each test binary uses its own subset.

use std::time::Duration;

use abhyasa_moq::{Ca, Session, SessionEvent};
use abhyasa_node::Node;
use tokio::sync::mpsc;

use abhyasa_wire::AgentId;

#[allow(unused_imports)] // Each test binary uses its own subset.
pub use abhyasa_testkit::{
    free_udp as free_addr, id, now_ms, revoke, short_custodian as custodian,
};

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
