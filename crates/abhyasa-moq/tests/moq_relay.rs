//! Our draft-14 wire through an unmodified MOQT relay: `moq-relay` 0.17.10 from crates.io (the
//! moq-dev project), built once by `scripts/moq-relay.sh`. A principal publishes its namespace,
//! an agent finds it with SUBSCRIBE_NAMESPACE and subscribes to `to/<agent>` in it, and an
//! obligation the principal sends on that track reaches the agent through the relay intact.
//! Every message we send is encoded, and every message the relay sends is decoded, by our codec
//! (`abhyasa_wire::moqt`); the relay's side is all its own.
//!
//! This is the ground relay mode (issue 15) stands on, not relay mode itself: no `Node` rides
//! the relay yet. Without the relay binary the test says it skipped and passes.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use abhyasa_moq::{endpoint, moq_relay_binary, namespace, Ca, MoqRelayProcess, TransportSettings};
use abhyasa_wire::moqt::{
    Control, Filter, KeyValue, Namespace, ObjectBody, StreamObject, SubgroupHeader, SubgroupId,
    DRAFT_14,
};
use abhyasa_wire::{
    AgentId, ClientId, Obligation, ObligationId, Payload, TokenAction, TokenId, TokenPayload,
    UnixMillis,
};

const WAIT: Duration = Duration::from_secs(10);

fn id(s: &str) -> AgentId {
    AgentId::new(s).unwrap()
}

/// Starts the relay (its certificate issued by `ca` for `relay`, files under `dir`) on a free
/// loopback port, or says it skipped and returns `None` when there is no binary.
fn start_relay(ca: &Ca, dir: &std::path::Path) -> Option<(MoqRelayProcess, SocketAddr, PathBuf)> {
    let Some(bin) = moq_relay_binary() else {
        eprintln!(
            "SKIPPED: no moq-relay binary (scripts/moq-relay.sh builds it; or set ABHYASA_MOQ_RELAY)"
        );
        return None;
    };
    ca.issue(&id("relay")).unwrap().save(dir).unwrap();
    let port = std::net::UdpSocket::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let addr: SocketAddr = format!("127.0.0.1:{port}").parse().unwrap();
    let relay = MoqRelayProcess::spawn(&bin, addr, dir).unwrap();
    Some((relay, addr, bin))
}

/// One side's control stream, read with our codec.
struct ControlStream {
    send: quinn::SendStream,
    recv: quinn::RecvStream,
    buf: Vec<u8>,
}

impl ControlStream {
    async fn send(&mut self, msg: Control) {
        let mut out = Vec::new();
        msg.encode(&mut out);
        self.send.write_all(&out).await.unwrap();
    }

    /// The next message that is not flow control (MAX_REQUEST_ID, REQUESTS_BLOCKED) nor the
    /// relay's own SUBSCRIBE_NAMESPACE (it asks every session for the namespaces it may
    /// publish; answered OK here: what we publish, we announce with PUBLISH_NAMESPACE).
    async fn recv(&mut self, who: &str) -> Control {
        loop {
            if let Some((msg, used)) = Control::decode(&self.buf)
                .unwrap_or_else(|e| panic!("{who}: the relay sent what our codec refuses: {e}"))
            {
                self.buf.drain(..used);
                match msg {
                    Control::MaxRequestId { .. } | Control::RequestsBlocked { .. } => continue,
                    Control::SubscribeNamespace { request_id, .. } => {
                        self.send(Control::SubscribeNamespaceOk { request_id })
                            .await;
                        continue;
                    }
                    msg => return msg,
                }
            }
            let chunk = tokio::time::timeout(WAIT, self.recv.read_chunk(4096, true))
                .await
                .unwrap_or_else(|_| panic!("{who}: no control message from the relay in {WAIT:?}"))
                .unwrap()
                .unwrap_or_else(|| panic!("{who}: the relay closed the control stream"));
            self.buf.extend_from_slice(&chunk.bytes);
        }
    }
}

/// Dials the relay as `agent` (the relay's certificate is issued by our CA for `relay`), opens
/// the control stream and does the draft-14 setup.
async fn connect(
    ca: &Ca,
    agent: &AgentId,
    relay: SocketAddr,
) -> (quinn::Connection, ControlStream) {
    let e = endpoint(
        &ca.issue(agent).unwrap(),
        "127.0.0.1:0".parse().unwrap(),
        &TransportSettings::default(),
    )
    .unwrap();
    let conn = e.connect(relay, "relay").unwrap().await.unwrap();
    let (send, recv) = conn.open_bi().await.unwrap();
    let mut control = ControlStream {
        send,
        recv,
        buf: Vec::new(),
    };
    control
        .send(Control::ClientSetup {
            versions: vec![DRAFT_14],
            params: vec![KeyValue::Int {
                key: 0x02, // MAX_REQUEST_ID
                value: 100,
            }],
        })
        .await;
    match control.recv(agent.as_str()).await {
        Control::ServerSetup { version, .. } => assert_eq!(version, DRAFT_14),
        other => panic!("expected SERVER_SETUP, got {other:?}"),
    }
    (conn, control)
}

fn obligation(principal: &AgentId, agent: &AgentId) -> Obligation {
    Obligation {
        id: ObligationId::from_u128(0x00c0_ffee),
        issuer: principal.clone(),
        target: agent.clone(),
        created_at: UnixMillis(1_700_000_000_000),
        deadline: UnixMillis(1_700_000_060_000),
        max_retries: 3,
        sequence: Some(1),
        payload: Payload::OauthToken(TokenPayload {
            action: TokenAction::Revoke,
            token_id: TokenId::new("tok-relay").unwrap(),
            client_id: ClientId::new("c").unwrap(),
            expires_at: Some(UnixMillis(1_700_003_600_000)),
        }),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_obligation_reaches_its_agent_through_an_unmodified_moq_relay() {
    let dir = tempfile::tempdir().unwrap();
    let ca = Ca::generate("relay-test").unwrap();
    let Some((_relay, addr, bin)) = start_relay(&ca, dir.path()) else {
        return;
    };
    // The relay listens once its socket is bound: retry the dial until then.
    let (principal, agent) = (id("principal"), id("agent-1"));
    let started = std::time::Instant::now();
    let (p_conn, mut p) = loop {
        match tokio::time::timeout(Duration::from_secs(2), connect(&ca, &principal, addr)).await {
            Ok(c) => break c,
            Err(_) if started.elapsed() < WAIT => continue,
            Err(_) => panic!("the relay did not answer in {WAIT:?}"),
        }
    };

    // The principal publishes its namespace.
    p.send(Control::PublishNamespace {
        request_id: 0,
        namespace: namespace(&principal),
        params: vec![],
    })
    .await;
    match p.recv("principal").await {
        Control::PublishNamespaceOk { request_id } => assert_eq!(request_id, 0),
        other => panic!("expected PUBLISH_NAMESPACE_OK, got {other:?}"),
    }

    // The agent finds it under ("abhyasa", "v1").
    let (a_conn, mut a) = connect(&ca, &agent, addr).await;
    a.send(Control::SubscribeNamespace {
        request_id: 0,
        prefix: Namespace::from_strs(&["abhyasa", "v1"]),
        params: vec![],
    })
    .await;
    let (mut ok, mut found) = (false, false);
    while !(ok && found) {
        match a.recv("agent").await {
            Control::SubscribeNamespaceOk { request_id } => {
                assert_eq!(request_id, 0);
                ok = true;
            }
            Control::PublishNamespace {
                request_id,
                namespace: ns,
                ..
            } => {
                assert_eq!(ns, namespace(&principal));
                a.send(Control::PublishNamespaceOk { request_id }).await;
                found = true;
            }
            other => panic!("expected SUBSCRIBE_NAMESPACE_OK or PUBLISH_NAMESPACE, got {other:?}"),
        }
    }

    // The agent subscribes to the track addressed to it; the relay asks the principal.
    a.send(Control::Subscribe {
        request_id: 2,
        namespace: namespace(&principal),
        name: b"to/agent-1".to_vec(),
        priority: 0,
        group_order: 1,
        forward: 1,
        filter: Filter::LargestObject,
        params: vec![],
    })
    .await;
    let upstream = match p.recv("principal").await {
        Control::Subscribe {
            request_id,
            namespace: ns,
            name,
            ..
        } => {
            assert_eq!(ns, namespace(&principal));
            assert_eq!(name, b"to/agent-1");
            request_id
        }
        other => panic!("expected the relay's SUBSCRIBE, got {other:?}"),
    };
    const OUR_ALIAS: u64 = 7;
    p.send(Control::SubscribeOk {
        request_id: upstream,
        track_alias: OUR_ALIAS,
        expires: 0,
        group_order: 1,
        largest: None,
        params: vec![],
    })
    .await;
    let alias = match a.recv("agent").await {
        Control::SubscribeOk {
            request_id,
            track_alias,
            ..
        } => {
            assert_eq!(request_id, 2);
            track_alias
        }
        other => panic!("expected SUBSCRIBE_OK, got {other:?}"),
    };

    // One obligation on a subgroup stream, as a node sends it.
    let sent = obligation(&principal, &agent);
    let payload = abhyasa_wire::encode(&sent);
    let mut stream = Vec::new();
    SubgroupHeader {
        track_alias: OUR_ALIAS,
        group: 0,
        subgroup: SubgroupId::Zero,
        priority: 0,
        extensions: false,
        end_of_group: true,
    }
    .encode(&mut stream);
    StreamObject {
        object_id_delta: 0,
        extensions: vec![],
        body: ObjectBody::Payload(payload.clone()),
    }
    .encode(false, &mut stream);
    let mut uni = p_conn.open_uni().await.unwrap();
    uni.write_all(&stream).await.unwrap();
    uni.finish().unwrap();

    // It arrives on the agent's alias, the object byte for byte, the obligation as sent.
    let mut recv = tokio::time::timeout(WAIT, a_conn.accept_uni())
        .await
        .expect("no data stream from the relay")
        .unwrap();
    let bytes = tokio::time::timeout(WAIT, recv.read_to_end(1 << 20))
        .await
        .expect("the relay's data stream did not end")
        .unwrap();
    let (header, used) = SubgroupHeader::decode(&bytes)
        .expect("our codec reads the relay's subgroup header")
        .expect("a whole header");
    assert_eq!(header.track_alias, alias);
    assert_eq!(header.group, 0);
    let (object, _) = StreamObject::decode(&bytes[used..], header.extensions)
        .expect("our codec reads the relay's object")
        .expect("a whole object");
    assert_eq!(object.body, ObjectBody::Payload(payload));
    let ObjectBody::Payload(got) = object.body else {
        unreachable!()
    };
    assert_eq!(abhyasa_wire::decode_obligation(&got).unwrap(), sent);
    eprintln!(
        "moq-relay interop: setup, PUBLISH_NAMESPACE, SUBSCRIBE_NAMESPACE, SUBSCRIBE and one \
         obligation ({} bytes) through {}",
        got.len(),
        bin.display()
    );
}

/// Dials the relay as `agent` with a `RelaySession`, retrying until the relay listens.
async fn relay_session(
    ca: &Ca,
    agent: &AgentId,
    addr: SocketAddr,
) -> (
    abhyasa_moq::RelaySession,
    tokio::sync::mpsc::Receiver<abhyasa_moq::RelayEvent>,
    quinn::Endpoint,
) {
    let e = endpoint(
        &ca.issue(agent).unwrap(),
        "127.0.0.1:0".parse().unwrap(),
        &TransportSettings::default(),
    )
    .unwrap();
    let started = std::time::Instant::now();
    loop {
        match tokio::time::timeout(
            Duration::from_secs(2),
            abhyasa_moq::RelaySession::connect(&e, addr, &id("relay"), agent),
        )
        .await
        {
            Ok(Ok((s, rx))) => return (s, rx, e),
            _ if started.elapsed() < WAIT => tokio::time::sleep(Duration::from_millis(50)).await,
            other => panic!("no relay session in {WAIT:?}: {other:?}"),
        }
    }
}

/// The next event `want` picks, within `WAIT`.
async fn next_relay_event<T>(
    rx: &mut tokio::sync::mpsc::Receiver<abhyasa_moq::RelayEvent>,
    want: impl Fn(abhyasa_moq::RelayEvent) -> Option<T>,
) -> T {
    tokio::time::timeout(WAIT, async {
        loop {
            let e = rx.recv().await.expect("relay session events");
            if let abhyasa_moq::RelayEvent::Closed(why) = &e {
                panic!("relay session closed: {why}");
            }
            if let Some(t) = want(e) {
                return t;
            }
        }
    })
    .await
    .expect("a relay event in time")
}

/// Picks an object `from` sends: its track and payload.
fn object_from(
    from: &AgentId,
) -> impl Fn(abhyasa_moq::RelayEvent) -> Option<(abhyasa_moq::Track, Vec<u8>)> {
    let from = from.clone();
    move |e| match e {
        abhyasa_moq::RelayEvent::Object {
            from: f,
            track,
            payload,
        } if f == from => Some((track, payload)),
        _ => None,
    }
}

/// Two nodes' `RelaySession`s meet at the unmodified relay with nothing configured but its
/// address: each finds the other's namespace, subscribes to what is addressed to it, and is
/// told when the other subscribed; then objects flow both ways on streams, and a datagram
/// (each its own group) as well.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_relay_sessions_find_each_other_and_exchange_objects() {
    use abhyasa_moq::{RelayEvent, Track};
    let dir = tempfile::tempdir().unwrap();
    let ca = Ca::generate("relay-test").unwrap();
    let Some((_relay, addr, _)) = start_relay(&ca, dir.path()) else {
        return;
    };
    let (principal, agent) = (id("principal"), id("agent-1"));
    let (p, mut prx, _pe) = relay_session(&ca, &principal, addr).await;
    let (a, mut arx, _ae) = relay_session(&ca, &agent, addr).await;
    // Each learns the other subscribed to all three tracks addressed to it.
    for (rx, other) in [(&mut prx, &agent), (&mut arx, &principal)] {
        let mut tracks = std::collections::BTreeSet::new();
        while tracks.len() < 3 {
            let t = next_relay_event(rx, |e| match e {
                RelayEvent::PeerSubscribed { peer, track } => Some((peer, track)),
                _ => None,
            })
            .await;
            assert_eq!(&t.0, other);
            tracks.insert(t.1);
        }
    }
    assert!(p.is_subscribed(&agent, Track::Obligations));
    assert!(!p.is_subscribed(&id("agent-2"), Track::Obligations));
    // Until the far side's SUBSCRIBE_OK reaches us, objects could still be dropped by the
    // relay (no subscriber yet): give the subscriptions a moment to settle.
    tokio::time::sleep(Duration::from_millis(200)).await;

    p.send_group(&agent, Track::Obligations, &[b"obligation".to_vec()], false)
        .await
        .unwrap();
    assert_eq!(
        next_relay_event(&mut arx, object_from(&principal)).await,
        (Track::Obligations, b"obligation".to_vec())
    );
    a.send_group(&principal, Track::Acks, &[b"ack".to_vec()], false)
        .await
        .unwrap();
    assert_eq!(
        next_relay_event(&mut prx, object_from(&agent)).await,
        (Track::Acks, b"ack".to_vec())
    );
    p.send_group(&agent, Track::Obligations, &[b"best effort".to_vec()], true)
        .await
        .unwrap();
    assert_eq!(
        next_relay_event(&mut arx, object_from(&principal)).await,
        (Track::Obligations, b"best effort".to_vec())
    );
    // Nobody subscribed for agent-2: nothing to send it on.
    assert!(p
        .send_group(&id("agent-2"), Track::Obligations, &[vec![1]], false)
        .await
        .is_err());

    // agent-2 means to meet only the principal there: the principal hears from it, agent-1
    // does not (no subscriptions between the two agents at the relay).
    let e2 = endpoint(
        &ca.issue(&id("agent-2")).unwrap(),
        "127.0.0.1:0".parse().unwrap(),
        &TransportSettings::default(),
    )
    .unwrap();
    let (c, _crx) = abhyasa_moq::RelaySession::connect_with(
        &e2,
        addr,
        &id("relay"),
        &id("agent-2"),
        Some([principal.clone()].into_iter().collect()),
        None,
    )
    .await
    .unwrap();
    let heard = next_relay_event(&mut prx, |e| match e {
        RelayEvent::PeerSubscribed { peer, .. } => Some(peer),
        _ => None,
    })
    .await;
    assert_eq!(heard, id("agent-2"));
    let from_agent_2 = tokio::time::timeout(Duration::from_millis(500), async {
        loop {
            match arx.recv().await {
                Some(RelayEvent::PeerSubscribed { peer, .. }) if peer == id("agent-2") => {
                    return peer
                }
                Some(_) => {}
                None => std::future::pending::<()>().await,
            }
        }
    })
    .await;
    assert!(from_agent_2.is_err(), "agent-2 subscribed to agent-1");
    // Nor did the relay tell agent-2 of agent-1 at all: it asked for the principal's
    // namespace alone. agent-1 asked for every namespace and was told of both.
    assert_eq!(c.peers_seen(), std::slice::from_ref(&principal));
    assert_eq!(a.peers_seen(), [id("agent-2"), principal.clone()]);
}

/// A member that opens a stream through the relay and never ends it holds nothing up: the
/// agent's relay session reads its streams side by side, so an object the principal sends
/// after it arrives at once (read one stream at a time, it waited behind the open one).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stream_left_open_through_the_relay_delays_nothing_behind_it() {
    use abhyasa_moq::{RelayEvent, Track};
    let dir = tempfile::tempdir().unwrap();
    let ca = Ca::generate("relay-test").unwrap();
    let Some((_relay, addr, _)) = start_relay(&ca, dir.path()) else {
        return;
    };
    let (principal, agent, stalling) = (id("principal"), id("agent-1"), id("agent-2"));
    let (_a, mut arx, _ae) = relay_session(&ca, &agent, addr).await;

    // The stalling member speaks raw MOQT: it publishes its namespace and answers the
    // relay's subscriptions on behalf of agent-1 with aliases of its own.
    let (h_conn, mut h) = connect(&ca, &stalling, addr).await;
    h.send(Control::PublishNamespace {
        request_id: 0,
        namespace: namespace(&stalling),
        params: vec![],
    })
    .await;
    let mut obligations_alias = None;
    // Three tracks: obligations, acks, ledger.
    let mut answered = 0;
    while answered < 3 {
        match h.recv("agent-2").await {
            Control::PublishNamespaceOk { request_id } => assert_eq!(request_id, 0),
            // The relay tells it of others' namespaces too; it subscribes to none.
            Control::PublishNamespace { request_id, .. } => {
                h.send(Control::PublishNamespaceOk { request_id }).await;
            }
            Control::Subscribe {
                request_id, name, ..
            } => {
                let alias = 100 + request_id;
                if name == Track::Obligations.name(&agent) {
                    obligations_alias = Some(alias);
                }
                h.send(Control::SubscribeOk {
                    request_id,
                    track_alias: alias,
                    expires: 0,
                    group_order: 1,
                    largest: None,
                    params: vec![],
                })
                .await;
                answered += 1;
            }
            other => panic!("expected PUBLISH_NAMESPACE_OK or SUBSCRIBE, got {other:?}"),
        }
    }
    let alias = obligations_alias.expect("agent-1 subscribed to agent-2's obligations");

    let (p, _prx, _pe) = relay_session(&ca, &principal, addr).await;
    next_relay_event(&mut arx, |e| match e {
        RelayEvent::PeerSubscribed { peer, .. } if peer == principal => Some(()),
        _ => None,
    })
    .await;
    tokio::time::sleep(Duration::from_millis(300)).await;

    // One whole object on a stream left open.
    let mut stream = Vec::new();
    SubgroupHeader {
        track_alias: alias,
        group: 0,
        subgroup: SubgroupId::Zero,
        priority: 0,
        extensions: false,
        end_of_group: false,
    }
    .encode(&mut stream);
    StreamObject {
        object_id_delta: 0,
        extensions: vec![],
        body: ObjectBody::Payload(b"first, and the stream stays open".to_vec()),
    }
    .encode(false, &mut stream);
    let mut open = h_conn.open_uni().await.unwrap();
    open.write_all(&stream).await.unwrap();
    // Time for the relay to carry the open stream to agent-1 ahead of anything else.
    tokio::time::sleep(Duration::from_millis(500)).await;
    // The principal's object, sent while that stream is still open, arrives at once: well
    // before the open stream's own deadline (10 s) could have freed a one-at-a-time reader.
    let sent = std::time::Instant::now();
    p.send_group(&agent, Track::Obligations, &[b"behind it".to_vec()], false)
        .await
        .unwrap();
    let got = tokio::time::timeout(
        Duration::from_secs(3),
        next_relay_event(&mut arx, object_from(&principal)),
    )
    .await
    .expect("the principal's object waited behind the open stream");
    assert_eq!(got, (Track::Obligations, b"behind it".to_vec()));
    eprintln!(
        "through the relay, an object behind an open stream arrived in {} ms",
        sent.elapsed().as_millis()
    );
    // The open stream was carried all along: ended now, its object is delivered (objects of
    // a stream are taken when it ends).
    open.finish().unwrap();
    assert_eq!(
        next_relay_event(&mut arx, object_from(&stalling)).await,
        (
            Track::Obligations,
            b"first, and the stream stays open".to_vec()
        )
    );
}
