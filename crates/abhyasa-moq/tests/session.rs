//! Sessions between real QUIC endpoints on loopback.

use std::net::SocketAddr;
use std::time::Duration;

use abhyasa_moq::{
    endpoint, Accepted, Ca, Session, SessionEvent, SessionLimits, Track, TransportSettings,
};
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
    serve_with(ep, me, SessionLimits::default())
}

/// [`serve`], holding each peer to `limits`.
fn serve_with(
    ep: quinn::Endpoint,
    me: AgentId,
    limits: SessionLimits,
) -> mpsc::Receiver<(Session, mpsc::Receiver<SessionEvent>)> {
    let (tx, rx) = mpsc::channel(16);
    tokio::spawn(async move {
        while let Some(incoming) = ep.accept().await {
            let tx = tx.clone();
            let me = me.clone();
            tokio::spawn(async move {
                if let Ok(Accepted::Custody(s, r)) =
                    Session::accept_any_with(incoming, &me, limits, &Default::default()).await
                {
                    let _ = tx.send((s, r)).await;
                }
            });
        }
    });
    rx
}

type Side = (Session, mpsc::Receiver<SessionEvent>);

/// Agent A serving with `limits` and agent B connected to it, each subscribed to all three
/// tracks the other addresses to it. The endpoints are returned to keep them open.
async fn pair(limits: SessionLimits) -> (Side, Side, [quinn::Endpoint; 2]) {
    let ca = Ca::generate("t").unwrap();
    let (a, b) = (id("agent-a"), id("agent-b"));
    let ea = ep(&ca, &a);
    let eb = ep(&ca, &b);
    let mut accepted = serve_with(ea.clone(), a.clone(), limits);
    let (sb, mut rb) = Session::connect(&eb, ea.local_addr().unwrap(), &a, &b)
        .await
        .unwrap();
    let (sa, mut ra) = tokio::time::timeout(Duration::from_secs(5), accepted.recv())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(sa.peer(), &b);
    assert_eq!(sb.peer(), &a);
    for rx in [&mut ra, &mut rb] {
        for t in [Track::Obligations, Track::Acks, Track::Ledger] {
            next(rx, |e| *e == SessionEvent::PeerSubscribed(t)).await;
        }
    }
    ((sa, ra), (sb, rb), [ea, eb])
}

#[tokio::test]
async fn two_agents_exchange_objects_on_streams_and_datagrams() {
    let ((sa, mut ra), (sb, mut rb), _eps) = pair(SessionLimits::default()).await;
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

/// A hand-driven MOQT client: setup, then whatever the test writes. Also returns the
/// SERVER_SETUP's parameters and what was read past it.
async fn raw_client(
    ep: &quinn::Endpoint,
    addr: SocketAddr,
    server: &AgentId,
) -> (
    quinn::Connection,
    quinn::SendStream,
    quinn::RecvStream,
    Vec<KeyValue>,
    Vec<u8>,
) {
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
    match read_one(&mut recv, &mut buf).await {
        Control::ServerSetup {
            version: DRAFT_14,
            params,
        } => (conn, send, recv, params, buf),
        other => panic!("{other:?}"),
    }
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
    let (_conn, mut send, mut recv, _, _) = raw_client(&eb, ea.local_addr().unwrap(), &a).await;
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
    let (conn, mut send, _recv, _, _) = raw_client(&eb, ea.local_addr().unwrap(), &a).await;
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
    closed_with(&conn, 0x15, "").await;
}

/// Waits for `conn` to be closed by its peer with `code` and a reason containing `says`.
async fn closed_with(conn: &quinn::Connection, code: u32, says: &str) {
    let closed = tokio::time::timeout(Duration::from_secs(5), conn.closed())
        .await
        .expect("closed in time");
    match closed {
        quinn::ConnectionError::ApplicationClosed(c) => {
            assert_eq!(c.error_code, quinn::VarInt::from_u32(code), "{c:?}");
            let reason = String::from_utf8_lossy(&c.reason);
            assert!(reason.contains(says), "{reason}");
        }
        other => panic!("closed otherwise: {other:?}"),
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

/// `SessionLimits::max_requests`: the setup grants exactly that many requests (MAX_REQUEST_ID
/// = 2 × the limit, ids stepping by two); the last request within it is answered, the next
/// closes the session with TOO_MANY_REQUESTS (0x7) and a reason naming the limit.
#[tokio::test]
async fn a_request_past_the_session_limit_closes_it_with_too_many_requests() {
    const LIMIT: u64 = 4;
    let ca = Ca::generate("t").unwrap();
    let (a, b) = (id("agent-a"), id("agent-b"));
    let ea = ep(&ca, &a);
    let limits = SessionLimits {
        max_requests: LIMIT,
        ..SessionLimits::default()
    };
    let _accepted = serve_with(ea.clone(), a.clone(), limits);
    let eb = ep(&ca, &b);
    let (conn, mut send, mut recv, params, _) = raw_client(&eb, ea.local_addr().unwrap(), &a).await;
    let mut buf = Vec::new();
    assert!(
        params.contains(&KeyValue::Int {
            key: 2,
            value: 2 * LIMIT
        }),
        "{params:?}"
    );
    let subscribe = |request_id| Control::Subscribe {
        request_id,
        namespace: abhyasa_moq::namespace(&a),
        name: b"to/agent-b".to_vec(),
        priority: 0,
        group_order: 1,
        forward: 1,
        filter: Filter::LargestObject,
        params: vec![],
    };
    // At the limit: requests 0, 2, 4, 6 are all answered.
    let mut out = Vec::new();
    for n in 0..LIMIT {
        subscribe(2 * n).encode(&mut out);
    }
    send.write_all(&out).await.unwrap();
    let mut answered = Vec::new();
    while answered.len() < LIMIT as usize {
        if let Control::SubscribeOk { request_id, .. } = read_one(&mut recv, &mut buf).await {
            answered.push(request_id);
        }
    }
    assert_eq!(answered, vec![0, 2, 4, 6]);
    assert!(conn.close_reason().is_none(), "{:?}", conn.close_reason());
    // One past it.
    let mut out = Vec::new();
    subscribe(2 * LIMIT).encode(&mut out);
    send.write_all(&out).await.unwrap();
    closed_with(&conn, 0x7, "limit is 4 per session").await;
}

/// `SessionLimits::max_objects_per_group`: a group at the limit arrives whole; of a group past
/// it only the first objects are taken and the session goes on.
#[tokio::test]
async fn objects_past_the_group_limit_are_ignored_and_the_session_goes_on() {
    let limits = SessionLimits {
        max_objects_per_group: 3,
        ..SessionLimits::default()
    };
    let ((_sa, mut ra), (sb, _rb), _eps) = pair(limits).await;
    let objects = |tag: &str, n: usize| -> Vec<Vec<u8>> {
        (0..n).map(|i| format!("{tag}{i}").into_bytes()).collect()
    };
    sb.send_group(Track::Obligations, &objects("at", 3), false)
        .await
        .unwrap();
    sb.send_group(Track::Obligations, &objects("past", 5), false)
        .await
        .unwrap();
    sb.send_group(Track::Obligations, &objects("after", 1), false)
        .await
        .unwrap();
    let mut got = Vec::new();
    while got.len() < 7 {
        if let SessionEvent::Object { payload, .. } =
            next(&mut ra, |e| matches!(e, SessionEvent::Object { .. })).await
        {
            got.push(String::from_utf8(payload).unwrap());
        }
    }
    // Streams may be read in any order; within each, order is kept.
    got.sort();
    assert_eq!(
        got,
        ["after0", "at0", "at1", "at2", "past0", "past1", "past2"]
    );
    // Nothing more: past3 and past4 were not taken.
    let more = tokio::time::timeout(Duration::from_millis(300), async {
        loop {
            if let Some(SessionEvent::Object { payload, .. }) = ra.recv().await {
                return payload;
            }
        }
    })
    .await;
    assert!(more.is_err(), "an object past the limit: {more:?}");
}

/// One object on a subgroup stream of `alias`, as the publisher side writes it.
fn subgroup(alias: u64, group: u64, payload: &[u8]) -> Vec<u8> {
    use abhyasa_wire::moqt::{ObjectBody, StreamObject, SubgroupHeader, SubgroupId};
    let mut out = Vec::new();
    SubgroupHeader {
        track_alias: alias,
        group,
        subgroup: SubgroupId::Zero,
        priority: 0,
        extensions: false,
        end_of_group: true,
    }
    .encode(&mut out);
    StreamObject {
        object_id_delta: 0,
        extensions: vec![],
        body: ObjectBody::Payload(payload.to_vec()),
    }
    .encode(false, &mut out);
    out
}

/// Data may overtake the SUBSCRIBE_OK that grants its track alias (draft-14 §10.4.2). An
/// object on a stream whose alias the pending answer then grants is delivered, not dropped;
/// once every subscription is answered, a stream of an alias never granted is dropped and
/// the session goes on.
#[tokio::test]
async fn an_object_that_overtakes_its_subscribe_ok_is_delivered() {
    let ca = Ca::generate("t").unwrap();
    let (a, b) = (id("agent-a"), id("agent-b"));
    let ea = ep(&ca, &a);
    let mut accepted = serve(ea.clone(), a.clone());
    let eb = ep(&ca, &b);
    let (conn, mut send, mut recv, _, mut buf) =
        raw_client(&eb, ea.local_addr().unwrap(), &a).await;
    let (_sa, mut ra) = tokio::time::timeout(Duration::from_secs(5), accepted.recv())
        .await
        .unwrap()
        .unwrap();
    // A subscribes to what B addresses to it; B answers none of it yet.
    let mut obligations_request = None;
    let mut others = Vec::new();
    while obligations_request.is_none() || others.len() < 2 {
        if let Control::Subscribe {
            request_id, name, ..
        } = read_one(&mut recv, &mut buf).await
        {
            if name == b"to/agent-a" {
                obligations_request = Some(request_id);
            } else {
                others.push(request_id);
            }
        }
    }
    // The object first, on its own stream, well before the answer that names its alias.
    const ALIAS: u64 = 7;
    let mut uni = conn.open_uni().await.unwrap();
    uni.write_all(&subgroup(ALIAS, 0, b"early")).await.unwrap();
    uni.finish().unwrap();
    tokio::time::sleep(Duration::from_millis(150)).await;
    let ok = |request_id, track_alias| Control::SubscribeOk {
        request_id,
        track_alias,
        expires: 0,
        group_order: 1,
        largest: None,
        params: vec![],
    };
    let mut out = Vec::new();
    ok(obligations_request.unwrap(), ALIAS).encode(&mut out);
    for (n, r) in others.iter().enumerate() {
        ok(*r, 100 + n as u64).encode(&mut out);
    }
    send.write_all(&out).await.unwrap();
    let e = next(&mut ra, |e| matches!(e, SessionEvent::Object { .. })).await;
    assert_eq!(
        e,
        SessionEvent::Object {
            track: Track::Obligations,
            payload: b"early".to_vec()
        }
    );
    // Every subscription answered: an alias never granted is dropped, and what follows on a
    // granted one still arrives.
    for (alias, group, payload) in [(99, 0, &b"stray"[..]), (ALIAS, 1, &b"later"[..])] {
        let mut uni = conn.open_uni().await.unwrap();
        uni.write_all(&subgroup(alias, group, payload))
            .await
            .unwrap();
        uni.finish().unwrap();
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let e = next(&mut ra, |e| matches!(e, SessionEvent::Object { .. })).await;
    assert_eq!(
        e,
        SessionEvent::Object {
            track: Track::Obligations,
            payload: b"later".to_vec()
        }
    );
    assert!(conn.close_reason().is_none());
}

/// A raw client connected to a served agent A with every one of A's subscriptions answered;
/// the obligations track (what A reads from the client) has alias [`RAW_ALIAS`].
async fn raw_client_answered(
    ca: &Ca,
) -> (
    quinn::Connection,
    mpsc::Receiver<SessionEvent>,
    [quinn::Endpoint; 2],
    Session,
) {
    let (a, b) = (id("agent-a"), id("agent-b"));
    let ea = ep(ca, &a);
    let mut accepted = serve(ea.clone(), a.clone());
    let eb = ep(ca, &b);
    let (conn, mut send, mut recv, _, mut buf) =
        raw_client(&eb, ea.local_addr().unwrap(), &a).await;
    let (sa, ra) = tokio::time::timeout(Duration::from_secs(5), accepted.recv())
        .await
        .unwrap()
        .unwrap();
    let mut out = Vec::new();
    let mut answered = 0;
    while answered < 3 {
        if let Control::Subscribe {
            request_id, name, ..
        } = read_one(&mut recv, &mut buf).await
        {
            let track_alias = if name == b"to/agent-a" {
                RAW_ALIAS
            } else {
                100 + answered
            };
            Control::SubscribeOk {
                request_id,
                track_alias,
                expires: 0,
                group_order: 1,
                largest: None,
                params: vec![],
            }
            .encode(&mut out);
            answered += 1;
        }
    }
    send.write_all(&out).await.unwrap();
    // Keep the control stream open for the session's life.
    std::mem::forget(send);
    (conn, ra, [ea, eb], sa)
}

const RAW_ALIAS: u64 = 7;

/// The start of a subgroup stream whose one object claims `len` payload bytes.
fn subgroup_head(alias: u64, group: u64, len: u64) -> Vec<u8> {
    use abhyasa_wire::moqt::{SubgroupHeader, SubgroupId};
    let mut out = Vec::new();
    SubgroupHeader {
        track_alias: alias,
        group,
        subgroup: SubgroupId::Zero,
        priority: 0,
        extensions: false,
        end_of_group: true,
    }
    .encode(&mut out);
    // Object id delta 0, then the payload length (a QUIC varint of 4 bytes).
    out.push(0);
    assert!(len < 1 << 30);
    out.extend_from_slice(&((len as u32) | 0x8000_0000).to_be_bytes());
    out
}

/// Streams of a session are read side by side: streams that never end (a member's, of about a
/// megabyte each, more in all than the session may hold) delay nothing sent after them, the
/// oldest are stopped when the session's room runs out, and the rest at their deadline.
#[tokio::test]
async fn a_stream_that_never_ends_delays_nothing_behind_it() {
    let ca = Ca::generate("t").unwrap();
    let (conn, mut ra, _eps, _sa) = raw_client_answered(&ca).await;
    // Twelve streams of a megabyte each, never finished: 12 MB past the session's 8 MiB.
    let mut stalled = Vec::new();
    for group in 0..12u64 {
        let mut uni = conn.open_uni().await.unwrap();
        uni.write_all(&subgroup_head(RAW_ALIAS, group, 2 << 20))
            .await
            .unwrap();
        uni.write_all(&vec![0x5a; 1 << 20]).await.unwrap();
        stalled.push(uni);
    }
    // Then an object on a stream that ends, as an honest sender writes it.
    let mut uni = conn.open_uni().await.unwrap();
    uni.write_all(&subgroup(RAW_ALIAS, 100, b"after"))
        .await
        .unwrap();
    uni.finish().unwrap();
    let e = tokio::time::timeout(
        Duration::from_secs(3),
        next(&mut ra, |e| matches!(e, SessionEvent::Object { .. })),
    )
    .await
    .expect("the object behind the stalled streams, well before their deadline");
    assert_eq!(
        e,
        SessionEvent::Object {
            track: Track::Obligations,
            payload: b"after".to_vec()
        }
    );
    // The oldest stalled streams were stopped for room, before any deadline.
    let stopped_early = tokio::time::timeout(Duration::from_secs(2), stalled[0].stopped())
        .await
        .expect("the oldest stalled stream stopped for room");
    assert_eq!(stopped_early.unwrap(), Some(0u32.into()));
    // The newest is stopped at the stream deadline (10 s), not before the room ran out.
    let last = stalled.last_mut().unwrap();
    let at_deadline = tokio::time::timeout(Duration::from_secs(15), last.stopped())
        .await
        .expect("every stalled stream stopped by its deadline");
    assert_eq!(at_deadline.unwrap(), Some(0u32.into()));
    assert!(conn.close_reason().is_none(), "the session goes on");
}
