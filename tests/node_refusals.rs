//! A running node (the `Node` runtime, in this process) against peers that should be refused:
//! a certificate from another deployment CA, a subscription to another agent's track, garbage
//! on the control stream. Each is refused on its own session while a legitimate peer's custody
//! keeps working.

use std::net::SocketAddr;
use std::time::Duration;

use abhyasa::moq::{endpoint, namespace, Ca, TransportSettings};
use abhyasa::node::{Admission, Node};
use abhyasa::wire::moqt::{Control, Filter, KeyValue, DRAFT_14};
use abhyasa::wire::{AgentId, Outcome};

fn id(s: &str) -> AgentId {
    AgentId::new(s).unwrap()
}

fn loopback() -> SocketAddr {
    "127.0.0.1:0".parse().unwrap()
}

async fn setup(
    ep: &quinn::Endpoint,
    addr: SocketAddr,
    server: &AgentId,
) -> (quinn::Connection, quinn::SendStream, quinn::RecvStream) {
    let conn = ep.connect(addr, server.as_str()).unwrap().await.unwrap();
    let (mut send, recv) = conn.open_bi().await.unwrap();
    let mut out = Vec::new();
    Control::ClientSetup {
        versions: vec![DRAFT_14],
        params: vec![KeyValue::Int { key: 2, value: 64 }],
    }
    .encode(&mut out);
    send.write_all(&out).await.unwrap();
    (conn, send, recv)
}

async fn read_until(
    recv: &mut quinn::RecvStream,
    buf: &mut Vec<u8>,
    want: impl Fn(&Control) -> bool,
) -> Control {
    loop {
        while let Some((m, used)) = Control::decode(buf).unwrap() {
            buf.drain(..used);
            if want(&m) {
                return m;
            }
        }
        let mut chunk = [0u8; 2048];
        let n = tokio::time::timeout(Duration::from_secs(5), recv.read(&mut chunk))
            .await
            .unwrap()
            .unwrap()
            .unwrap();
        buf.extend_from_slice(&chunk[..n]);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_refuses_bad_peers_and_keeps_serving_good_ones() {
    let dir = tempfile::tempdir().unwrap();
    let ca = Ca::generate("deployment").unwrap();
    let (p, a, m) = (id("principal"), id("agent-1"), id("mallory"));
    let agent = Node::builder(ca.issue(&a).unwrap())
        .state_dir(dir.path().join("a"))
        .build()
        .await
        .unwrap();
    let addr = agent.local_addr();
    let principal = Node::builder(ca.issue(&p).unwrap())
        .peer(a.clone(), addr)
        .state_dir(dir.path().join("p"))
        .build()
        .await
        .unwrap();

    // 1. A certificate from another CA: no session at all.
    let rogue = Ca::generate("someone else").unwrap();
    let e_rogue = endpoint(
        &rogue.issue(&m).unwrap(),
        loopback(),
        &TransportSettings::default(),
    )
    .unwrap();
    let refused = tokio::time::timeout(Duration::from_secs(5), async {
        e_rogue.connect(addr, a.as_str()).unwrap().await
    })
    .await
    .unwrap();
    assert!(refused.is_err(), "a foreign certificate got a connection");

    // 2. A member of the deployment subscribing to a track addressed to someone else.
    let em = endpoint(
        &ca.issue(&m).unwrap(),
        loopback(),
        &TransportSettings::default(),
    )
    .unwrap();
    let (conn, mut send, mut recv) = setup(&em, addr, &a).await;
    let mut buf = Vec::new();
    read_until(&mut recv, &mut buf, |c| {
        matches!(c, Control::ServerSetup { .. })
    })
    .await;
    let mut out = Vec::new();
    Control::Subscribe {
        request_id: 0,
        namespace: namespace(&a),
        name: b"acks/principal".to_vec(),
        priority: 0,
        group_order: 1,
        forward: 1,
        filter: Filter::LargestObject,
        params: vec![],
    }
    .encode(&mut out);
    send.write_all(&out).await.unwrap();
    let answer = read_until(&mut recv, &mut buf, |c| {
        matches!(
            c,
            Control::SubscribeError { .. } | Control::SubscribeOk { .. }
        )
    })
    .await;
    assert!(
        matches!(answer, Control::SubscribeError { code: 0x1, .. }),
        "{answer:?}"
    );

    // 3. Garbage on that control stream: this session is closed with PROTOCOL_VIOLATION.
    send.write_all(&[0x3f, 0x00, 0x01, 0xff]).await.unwrap();
    match tokio::time::timeout(Duration::from_secs(5), conn.closed())
        .await
        .unwrap()
    {
        quinn::ConnectionError::ApplicationClosed(c) => {
            assert_eq!(c.error_code, quinn::VarInt::from_u32(0x3))
        }
        other => panic!("closed otherwise: {other}"),
    }

    // The principal's custody with the agent is untouched.
    let handle = principal
        .issue(abhyasa_testkit::revoke(1, &a, 20_000))
        .await
        .unwrap();
    assert_eq!(handle.admission(), Admission::Custody);
    let (record, _) = tokio::time::timeout(Duration::from_secs(10), handle.outcome())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(record.outcome, Outcome::Applied);
    principal.shutdown().await;
    agent.shutdown().await;
}
