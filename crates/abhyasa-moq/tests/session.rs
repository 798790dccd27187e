//! Sessions between real QUIC endpoints on loopback.

use std::net::SocketAddr;
use std::time::Duration;

use abhyasa_moq::{endpoint, Ca, Session, SessionEvent, Track, TransportSettings};
use abhyasa_wire::moqt::{Control, Filter, KeyValue, DRAFT_14};
use abhyasa_wire::AgentId;
use tokio::sync::mpsc;

fn id(s: &str) -> AgentId {
    AgentId::new(s).unwrap()
}

fn loopback() -> SocketAddr {
    "127.0.0.1:0".parse().unwrap()
}

/// An endpoint on loopback for `agent`, with a certificate from `ca`.
fn ep(ca: &Ca, agent: &AgentId) -> quinn::Endpoint {
    endpoint(
        &ca.issue(agent).unwrap(),
        loopback(),
        &TransportSettings::default(),
    )
    .unwrap()
}

async fn next(
    rx: &mut mpsc::Receiver<SessionEvent>,
    want: impl Fn(&SessionEvent) -> bool,
) -> SessionEvent {
    tokio::time::timeout(Duration::from_secs(5), async {
        loop {
            let e = rx.recv().await.expect("session events");
            if want(&e) {
                return e;
            }
        }
    })
    .await
    .expect("event in time")
}

/// A listening agent that accepts sessions and forwards their events.
fn serve(
    ep: quinn::Endpoint,
    me: AgentId,
) -> mpsc::Receiver<(Session, mpsc::Receiver<SessionEvent>)> {
    let (tx, rx) = mpsc::channel(16);
    tokio::spawn(async move {
        while let Some(incoming) = ep.accept().await {
            let tx = tx.clone();
            let me = me.clone();
            tokio::spawn(async move {
                if let Ok(s) = Session::accept(incoming, &me).await {
                    let _ = tx.send(s).await;
                }
            });
        }
    });
    rx
}

#[tokio::test]
async fn two_agents_exchange_objects_on_streams_and_datagrams() {
    let ca = Ca::generate("t").unwrap();
    let (a, b) = (id("agent-a"), id("agent-b"));
    let ea = ep(&ca, &a);
    let eb = ep(&ca, &b);
    let mut accepted = serve(ea.clone(), a.clone());
    let (sb, mut rb) = Session::connect(&eb, ea.local_addr().unwrap(), &a, &b)
        .await
        .unwrap();
    let (sa, mut ra) = tokio::time::timeout(Duration::from_secs(5), accepted.recv())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(sa.peer(), &b);
    assert_eq!(sb.peer(), &a);
    // Each side subscribes to all three tracks the other addresses to it.
    for rx in [&mut ra, &mut rb] {
        for t in [Track::Obligations, Track::Acks, Track::Ledger] {
            next(rx, |e| *e == SessionEvent::PeerSubscribed(t)).await;
        }
    }
    // Obligations from B to A on a subgroup stream, two objects in one group.
    sb.send_group(
        Track::Obligations,
        &[b"one".to_vec(), b"two".to_vec()],
        false,
    )
    .await
    .unwrap();
    for want in [b"one".to_vec(), b"two".to_vec()] {
        let e = next(&mut ra, |e| matches!(e, SessionEvent::Object { .. })).await;
        assert_eq!(
            e,
            SessionEvent::Object {
                track: Track::Obligations,
                payload: want
            }
        );
    }
    // An ack from A to B as a datagram.
    sa.send_group(Track::Acks, &[b"ack".to_vec()], true)
        .await
        .unwrap();
    let e = next(&mut rb, |e| matches!(e, SessionEvent::Object { .. })).await;
    assert_eq!(
        e,
        SessionEvent::Object {
            track: Track::Acks,
            payload: b"ack".to_vec()
        }
    );
    // Too big for a datagram: falls back to a stream.
    let big = vec![7u8; 4_000];
    sa.send_group(Track::Ledger, std::slice::from_ref(&big), true)
        .await
        .unwrap();
    let e = next(&mut rb, |e| matches!(e, SessionEvent::Object { .. })).await;
    assert_eq!(
        e,
        SessionEvent::Object {
            track: Track::Ledger,
            payload: big
        }
    );
}

#[tokio::test]
async fn a_certificate_from_another_ca_is_refused() {
    let (ca, rogue_ca) = (Ca::generate("t").unwrap(), Ca::generate("other").unwrap());
    let (a, b) = (id("agent-a"), id("agent-b"));
    let ea = ep(&ca, &a);
    let mut accepted = serve(ea.clone(), a.clone());
    let eb = ep(&rogue_ca, &b);
    let r = Session::connect(&eb, ea.local_addr().unwrap(), &a, &b).await;
    assert!(r.is_err(), "a foreign certificate got a session");
    assert!(
        tokio::time::timeout(Duration::from_millis(500), accepted.recv())
            .await
            .is_err()
    );
}

#[tokio::test]
async fn dialing_one_agent_and_reaching_another_is_refused() {
    let ca = Ca::generate("t").unwrap();
    let (a, b) = (id("agent-a"), id("agent-b"));
    let ea = ep(&ca, &a);
    let _accepted = serve(ea.clone(), a.clone());
    let eb = ep(&ca, &b);
    let r = Session::connect(&eb, ea.local_addr().unwrap(), &id("agent-c"), &b).await;
    assert!(r.is_err());
}

/// A hand-driven MOQT client: setup, then whatever the test writes.
async fn raw_client(
    ep: &quinn::Endpoint,
    addr: SocketAddr,
    server: &AgentId,
) -> (quinn::Connection, quinn::SendStream, quinn::RecvStream) {
    let conn = ep.connect(addr, server.as_str()).unwrap().await.unwrap();
    let (mut send, mut recv) = conn.open_bi().await.unwrap();
    let mut out = Vec::new();
    Control::ClientSetup {
        versions: vec![DRAFT_14],
        params: vec![KeyValue::Int { key: 2, value: 100 }],
    }
    .encode(&mut out);
    send.write_all(&out).await.unwrap();
    let mut buf = Vec::new();
    let setup = read_one(&mut recv, &mut buf).await;
    assert!(
        matches!(
            setup,
            Control::ServerSetup {
                version: DRAFT_14,
                ..
            }
        ),
        "{setup:?}"
    );
    (conn, send, recv)
}

async fn read_one(recv: &mut quinn::RecvStream, buf: &mut Vec<u8>) -> Control {
    loop {
        if let Some((m, used)) = Control::decode(buf).unwrap() {
            buf.drain(..used);
            return m;
        }
        let mut chunk = [0u8; 1024];
        let n = tokio::time::timeout(Duration::from_secs(5), recv.read(&mut chunk))
            .await
            .unwrap()
            .unwrap()
            .unwrap();
        buf.extend_from_slice(&chunk[..n]);
    }
}

#[tokio::test]
async fn subscribing_to_another_agents_track_is_refused() {
    let ca = Ca::generate("t").unwrap();
    let (a, b) = (id("agent-a"), id("agent-b"));
    let ea = ep(&ca, &a);
    let _accepted = serve(ea.clone(), a.clone());
    let eb = ep(&ca, &b);
    let (_conn, mut send, mut recv) = raw_client(&eb, ea.local_addr().unwrap(), &a).await;
    let subscribe = |request_id, name: &str| Control::Subscribe {
        request_id,
        namespace: abhyasa_moq::namespace(&a),
        name: name.as_bytes().to_vec(),
        priority: 0,
        group_order: 1,
        forward: 1,
        filter: Filter::LargestObject,
        params: vec![],
    };
    let mut out = Vec::new();
    subscribe(0, "to/agent-c").encode(&mut out); // addressed to someone else
    subscribe(2, "to/agent-b").encode(&mut out); // addressed to the subscriber
    send.write_all(&out).await.unwrap();
    let mut buf = Vec::new();
    let mut answers = Vec::new();
    while answers.len() < 2 {
        // Skip the server's own PUBLISH_NAMESPACE and SUBSCRIBEs.
        let m = read_one(&mut recv, &mut buf).await;
        if matches!(
            m,
            Control::SubscribeError { .. } | Control::SubscribeOk { .. }
        ) {
            answers.push(m);
        }
    }
    assert!(
        matches!(
            answers[0],
            Control::SubscribeError {
                request_id: 0,
                code: 0x1,
                ..
            }
        ),
        "{:?}",
        answers[0]
    );
    assert!(
        matches!(answers[1], Control::SubscribeOk { request_id: 2, .. }),
        "{:?}",
        answers[1]
    );
}

#[tokio::test]
async fn garbage_on_the_control_stream_closes_only_that_session() {
    let ca = Ca::generate("t").unwrap();
    let (a, b, c) = (id("agent-a"), id("agent-b"), id("agent-c"));
    let ea = ep(&ca, &a);
    let mut accepted = serve(ea.clone(), a.clone());
    // A good session from C.
    let ec = ep(&ca, &c);
    let (sc, mut rc) = Session::connect(&ec, ea.local_addr().unwrap(), &a, &c)
        .await
        .unwrap();
    let (sa_c, mut ra_c) = accepted.recv().await.unwrap();
    next(&mut rc, |e| *e == SessionEvent::PeerSubscribed(Track::Acks)).await;
    // B sends an unknown message type after setup.
    let eb = ep(&ca, &b);
    let (conn, mut send, _recv) = raw_client(&eb, ea.local_addr().unwrap(), &a).await;
    send.write_all(&[0x3f, 0x00, 0x00]).await.unwrap();
    let err = tokio::time::timeout(Duration::from_secs(5), conn.closed())
        .await
        .unwrap();
    match err {
        quinn::ConnectionError::ApplicationClosed(close) => {
            assert_eq!(close.error_code, quinn::VarInt::from_u32(0x3), "{close:?}");
        }
        other => panic!("closed otherwise: {other}"),
    }
    // C's session still works both ways.
    next(&mut ra_c, |e| {
        *e == SessionEvent::PeerSubscribed(Track::Obligations)
    })
    .await;
    sc.send_group(Track::Obligations, &[b"still here".to_vec()], false)
        .await
        .unwrap();
    let e = next(&mut ra_c, |e| matches!(e, SessionEvent::Object { .. })).await;
    assert_eq!(
        e,
        SessionEvent::Object {
            track: Track::Obligations,
            payload: b"still here".to_vec()
        }
    );
    assert!(sa_c.connection().close_reason().is_none());
}

#[tokio::test]
async fn a_client_without_draft_14_fails_version_negotiation() {
    let ca = Ca::generate("t").unwrap();
    let (a, b) = (id("agent-a"), id("agent-b"));
    let ea = ep(&ca, &a);
    let _accepted = serve(ea.clone(), a.clone());
    let eb = ep(&ca, &b);
    let conn = eb
        .connect(ea.local_addr().unwrap(), a.as_str())
        .unwrap()
        .await
        .unwrap();
    let (mut send, _recv) = conn.open_bi().await.unwrap();
    let mut out = Vec::new();
    // Draft 13 only, and an unknown setup parameter (ignored, not an error).
    Control::ClientSetup {
        versions: vec![0xff00_000d],
        params: vec![KeyValue::Int {
            key: 0x3e,
            value: 1,
        }],
    }
    .encode(&mut out);
    send.write_all(&out).await.unwrap();
    let err = tokio::time::timeout(Duration::from_secs(5), conn.closed())
        .await
        .unwrap();
    match err {
        quinn::ConnectionError::ApplicationClosed(close) => {
            assert_eq!(close.error_code, quinn::VarInt::from_u32(0x15), "{close:?}");
        }
        other => panic!("closed otherwise: {other}"),
    }
}

#[tokio::test]
async fn an_impaired_socket_delays_and_drops_what_its_endpoint_sends() {
    let ca = Ca::generate("t").unwrap();
    let (a, b) = (id("agent-a"), id("agent-b"));
    let ea = ep(&ca, &a);
    let mut accepted = serve(ea.clone(), a.clone());
    let (eb, impairment) = abhyasa_moq::impaired_endpoint(
        &ca.issue(&b).unwrap(),
        loopback(),
        &TransportSettings::default(),
        "delay 50ms loss 20%".parse().unwrap(),
        7,
    )
    .unwrap();
    let started = std::time::Instant::now();
    let (sb, _rb) = Session::connect(&eb, ea.local_addr().unwrap(), &a, &b)
        .await
        .unwrap();
    // The handshake and CLIENT_SETUP each wait for a delayed datagram from B.
    assert!(
        started.elapsed() >= Duration::from_millis(100),
        "{:?}",
        started.elapsed()
    );
    let (_sa, mut ra) = accepted.recv().await.unwrap();
    next(&mut ra, |e| *e == SessionEvent::PeerSubscribed(Track::Acks)).await;
    // QUIC recovers what the 20% loss takes: every object arrives.
    for i in 0..20u8 {
        while !sb.is_subscribed(Track::Obligations) {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        sb.send_group(Track::Obligations, &[vec![i]], false)
            .await
            .unwrap();
    }
    let mut got = Vec::new();
    while got.len() < 20 {
        if let SessionEvent::Object { payload, .. } =
            next(&mut ra, |e| matches!(e, SessionEvent::Object { .. })).await
        {
            got.push(payload[0]);
        }
    }
    got.sort_unstable();
    assert_eq!(got, (0..20).collect::<Vec<u8>>());
    let stats = impairment.stats();
    assert!(stats.lost > 0 && stats.offered > stats.lost, "{stats:?}");
}
