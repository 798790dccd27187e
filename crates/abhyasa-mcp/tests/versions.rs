//! The MCP protocol versions the agent's server speaks: a client that asks for 2025-11-25
//! (or an older revision rmcp knows) gets that revision, and the custody envelope works on it;
//! one that names 2026-07-28 in an `initialize` gets 2025-11-25, and a 2026-07-28 client that
//! discovers the server (`server/discover`, self-contained requests) gets 2026-07-28.

use std::sync::atomic::AtomicU32;
use std::sync::Arc;

use abhyasa_mcp::{acks_from_meta, obligations_to_meta, AgentServer, META_OBLIGATIONS};
use abhyasa_moq::Ca;
use abhyasa_node::Node;
use abhyasa_wire::{ConsentDecision, ObligationId};
use rmcp::model::{
    CallToolRequestParams, ClientCapabilities, ClientConfig, Implementation, ProtocolVersion,
    RequestMetaObject,
};
use rmcp::ServiceExt;

mod common;
use common::{calendar, consent, id, serve_on_pipe};

async fn negotiated(version: ProtocolVersion) -> (ProtocolVersion, usize) {
    negotiated_by(version, None).await
}

async fn negotiated_by(
    version: ProtocolVersion,
    discover: Option<rmcp::ClientLifecycleMode>,
) -> (ProtocolVersion, usize) {
    let dir = tempfile::tempdir().unwrap();
    let ca = Ca::generate("t").unwrap();
    let node = Node::builder(ca.issue(&id("agent-1")).unwrap())
        .state_dir(dir.path().join("agent"))
        .build()
        .await
        .unwrap();
    let server =
        AgentServer::new(node, id("principal")).tool(calendar(Arc::new(AtomicU32::new(0))));
    let (end, _server) = serve_on_pipe(server);
    let mut config = ClientConfig::new(
        ClientCapabilities::default(),
        Implementation::new("versions-test", "1"),
    );
    config.protocol_version = version;
    let client = match discover {
        None => config.serve(end).await.unwrap(),
        Some(mode) => {
            use rmcp::ClientServiceExt as _;
            config.serve_with_lifecycle(end, mode).await.unwrap()
        }
    };
    let got = client.peer_info().unwrap().protocol_version.clone();
    let o = consent(1, ConsentDecision::Revoke, "files.write", 60_000);
    let mut p = CallToolRequestParams::new("abhyasa_deliver");
    let mut meta = RequestMetaObject::new();
    meta.0
        .insert(META_OBLIGATIONS.into(), obligations_to_meta(&[o]));
    p.meta = Some(meta);
    let r = client.call_tool(p).await.unwrap();
    let acks = acks_from_meta(&r.meta.unwrap().0).unwrap();
    assert!(acks
        .iter()
        .all(|a| a.obligation_id == ObligationId::from_u128(1)));
    (got, acks.len())
}

#[tokio::test]
async fn a_client_gets_the_revision_it_asks_for_and_the_envelope_works_on_it() {
    for v in [
        ProtocolVersion::V_2025_11_25,
        ProtocolVersion::V_2025_06_18,
        ProtocolVersion::V_2025_03_26,
    ] {
        let (got, acks) = negotiated(v.clone()).await;
        assert_eq!(got, v);
        assert_eq!(acks, 1, "{v:?}");
    }
}

/// 2026-07-28 has no `initialize`: a client that names it in one is answered with the newest
/// revision that has the handshake, and everything works on that.
#[tokio::test]
async fn a_client_asking_for_2026_07_28_in_an_initialize_is_answered_2025_11_25() {
    let (got, acks) = negotiated(ProtocolVersion::V_2026_07_28).await;
    assert_eq!(got, ProtocolVersion::LATEST_WITH_INITIALIZE);
    assert_eq!(got, ProtocolVersion::V_2025_11_25);
    assert_eq!(acks, 1);
}

/// 2026-07-28 proper: `server/discover`, then self-contained requests; the envelope rides them.
#[tokio::test]
async fn a_2026_07_28_client_discovers_the_server_and_the_envelope_works() {
    let mode = rmcp::ClientLifecycleMode::Discover {
        preferred_versions: vec![ProtocolVersion::V_2026_07_28],
    };
    let (got, acks) = negotiated_by(ProtocolVersion::V_2026_07_28, Some(mode)).await;
    assert_eq!(got, ProtocolVersion::V_2026_07_28);
    assert_eq!(acks, 1);
}
