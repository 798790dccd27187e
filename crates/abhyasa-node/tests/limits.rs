//! The node's limits at its boundary with peers (`Limits`), each at the limit and one past it:
//! sessions per peer, and obligations per second per peer. (Requests per session and objects
//! per group are tested on the session itself, in `abhyasa-moq`; pending obligations and
//! applied ids in `abhyasa-custody`.)

mod common;

use std::time::{Duration, Instant};

use abhyasa_custody::CustodianConfig;
use abhyasa_moq::Ca;
use abhyasa_node::{Limits, Node};
use abhyasa_wire::Outcome;
use common::{free_addr, id, revoke, session};

/// Waits until `conn` closes and returns its reason, or `None` if it is still open after
/// `wait`.
async fn closed_within(conn: &quinn::Connection, wait: Duration) -> Option<String> {
    match tokio::time::timeout(wait, conn.closed()).await {
        Ok(quinn::ConnectionError::ApplicationClosed(c)) => {
            Some(String::from_utf8_lossy(&c.reason).into_owned())
        }
        Ok(other) => Some(format!("{other:?}")),
        Err(_) => None,
    }
}

/// A node `agent-a` with `limits`, storing under `dir`.
async fn node_with(ca: &Ca, dir: &std::path::Path, limits: Limits) -> Node {
    Node::builder(ca.issue(&id("agent-a")).unwrap())
        .state_dir(dir)
        .limits(limits)
        .build()
        .await
        .unwrap()
}

/// `sessions_per_peer`: at the limit every session of the peer stays up; one more closes that
/// peer's oldest with a reason naming the limit, and another peer's session is untouched.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_session_past_the_per_peer_limit_replaces_the_oldest_and_others_stay() {
    let dir = tempfile::tempdir().unwrap();
    let ca = Ca::generate("t").unwrap();
    let limits = Limits {
        sessions_per_peer: 2,
        ..Limits::default()
    };
    let node = node_with(&ca, dir.path(), limits).await;
    let (b, c) = (id("agent-b"), id("agent-c"));
    let (other, _rc, _ec) = session(&ca, &c, &node).await;
    let (first, _r1, _e1) = session(&ca, &b, &node).await;
    let (second, _r2, _e2) = session(&ca, &b, &node).await;
    // At the limit: both of b's sessions are up.
    let settle = Duration::from_millis(300);
    assert_eq!(closed_within(first.connection(), settle).await, None);
    assert_eq!(closed_within(second.connection(), settle).await, None);
    // One past it: the oldest goes, naming the limit.
    let (third, _r3, _e3) = session(&ca, &b, &node).await;
    let reason = closed_within(first.connection(), Duration::from_secs(5))
        .await
        .expect("the oldest session is closed");
    assert!(reason.contains("sessions per peer limit (2)"), "{reason}");
    assert_eq!(closed_within(second.connection(), settle).await, None);
    assert_eq!(closed_within(third.connection(), settle).await, None);
    assert_eq!(closed_within(other.connection(), settle).await, None);
    node.shutdown().await;
}

/// Waits for the outcomes of `handles`; returns when the last ended.
async fn outcomes(handles: Vec<abhyasa_node::IssueHandle>) -> Vec<Outcome> {
    let mut out = Vec::new();
    for h in handles {
        let (record, _) = tokio::time::timeout(Duration::from_secs(30), h.outcome())
            .await
            .expect("an outcome in time")
            .expect("the node runs");
        out.push(record.outcome);
    }
    out
}

const RATE: u32 = 20;

/// `requests_per_second_per_peer`: a burst at the limit is taken whole; past it the peer is
/// slowed (its objects dropped unread until its bucket refills, its custody retrying them),
/// never refused: everything is applied, and not faster than the rate allows. Another peer
/// sending meanwhile loses nothing to the limit.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_peer_past_its_rate_is_slowed_and_another_is_not() {
    let dir = tempfile::tempdir().unwrap();
    let ca = Ca::generate("t").unwrap();
    let a = id("agent-a");
    let a_addr = free_addr();
    let agent = Node::builder(ca.issue(&a).unwrap())
        .listen(a_addr)
        .state_dir(dir.path().join("a"))
        .limits(Limits {
            requests_per_second_per_peer: RATE,
            ..Limits::default()
        })
        .build()
        .await
        .unwrap();
    // A response timeout well above an ack's round trip on a busy machine: each obligation is
    // sent once unless the limit drops it.
    let patient = CustodianConfig {
        response_timeout_ms: 1_500,
        backoff_base_ms: 50,
        backoff_cap_ms: 300,
        ..CustodianConfig::default()
    };
    let principal = |name: &str| {
        Node::builder(ca.issue(&id(name)).unwrap())
            .peer(a.clone(), a_addr)
            .state_dir(dir.path().join(name))
            .custodian(patient.clone())
            .build()
    };
    let (p, q) = (
        principal("principal").await.unwrap(),
        principal("principal-2").await.unwrap(),
    );
    tokio::time::timeout(Duration::from_secs(10), async {
        while agent.status().await.unwrap().peers.len() < 2 {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await
    .expect("both principals connect");
    tokio::time::sleep(Duration::from_millis(200)).await;

    // At the limit: one second's worth at once, all taken, none dropped.
    let mut handles = Vec::new();
    for n in 0..u128::from(RATE) {
        handles.push(p.issue(revoke(n, &a, 30_000)).await.unwrap());
    }
    assert!(outcomes(handles)
        .await
        .iter()
        .all(|o| *o == Outcome::Applied));
    assert!(agent.status().await.unwrap().slowed.is_empty());

    // Past it: three seconds' worth at once from one principal, a few from the other.
    tokio::time::sleep(Duration::from_millis(1_100)).await; // the bucket is full again
    let start = Instant::now();
    let mut handles = Vec::new();
    for n in 100..100 + 3 * u128::from(RATE) {
        handles.push(p.issue(revoke(n, &a, 30_000)).await.unwrap());
    }
    let mut others = Vec::new();
    for n in 1_000..1_010 {
        let mut o = revoke(n, &a, 30_000);
        o.issuer = id("principal-2");
        others.push(q.issue(o).await.unwrap());
    }
    let fast = outcomes(handles).await;
    let took = start.elapsed();
    assert!(fast.iter().all(|o| *o == Outcome::Applied), "{fast:?}");
    assert!(outcomes(others)
        .await
        .iter()
        .all(|o| *o == Outcome::Applied));
    // 3 × RATE with RATE in the bucket: the other 2 × RATE wait for two seconds of refill.
    assert!(
        took >= Duration::from_millis(1_900),
        "{} obligations past a rate of {RATE}/s applied in {took:?}",
        3 * RATE
    );
    let slowed = agent.status().await.unwrap().slowed;
    assert!(
        slowed.get(&id("principal")).is_some_and(|n| *n > 0),
        "{slowed:?}"
    );
    assert_eq!(slowed.get(&id("principal-2")), None, "{slowed:?}");
    for n in [p, q, agent] {
        n.shutdown().await;
    }
}

/// Ledger messages draw from the same bucket: of ten seconds' worth sent at once, at least
/// one second's worth is taken and the rest, less what the bucket refilled meanwhile, is
/// dropped unread and counted (a branch resends on its period).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ledger_messages_past_the_rate_are_dropped_and_counted() {
    let dir = tempfile::tempdir().unwrap();
    let ca = Ca::generate("t").unwrap();
    let limits = Limits {
        requests_per_second_per_peer: RATE,
        ..Limits::default()
    };
    let node = node_with(&ca, dir.path(), limits).await;
    let b = id("agent-b");
    let (s, _r, _e) = session(&ca, &b, &node).await;
    let sent = 10 * u64::from(RATE);
    let started = Instant::now();
    for n in 0..sent {
        s.send_group(
            abhyasa_moq::Track::Ledger,
            &[format!("m{n}").into_bytes()],
            false,
        )
        .await
        .unwrap();
    }
    // Wait until the count settles. Everything sent arrived between `started` and then, so
    // the bucket took at most its burst (one second's worth) plus what it refilled over that
    // time; the rest must have been dropped. (The bucket's arithmetic is tested exactly in
    // the node's unit tests; a slow machine only lowers the bound, never below zero here
    // unless settling took nine seconds.)
    let mut slowed = 0;
    let until = Instant::now() + Duration::from_secs(10);
    let mut last_change = Instant::now();
    while Instant::now() < until
        && (slowed == 0 || last_change.elapsed() < Duration::from_millis(500))
    {
        let now = node
            .status()
            .await
            .unwrap()
            .slowed
            .get(&b)
            .copied()
            .unwrap_or(0);
        if now != slowed {
            slowed = now;
            last_change = Instant::now();
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // Objects taken after the last drop do not move the count: the bucket may have refilled
    // until the count was last read, not only until it last changed.
    let window = started.elapsed().as_secs_f64();
    let may_take = u64::from(RATE) + (f64::from(RATE) * window).ceil() as u64;
    let must_drop = sent.saturating_sub(may_take).max(1);
    assert!(
        (must_drop..=sent - u64::from(RATE)).contains(&slowed),
        "{slowed} of {sent} dropped at {RATE}/s over {window:.2} s (at least {must_drop})"
    );
    node.shutdown().await;
}

/// A client endpoint for `identity` that grants the node no flow-control credit at all: a
/// member that never reads what the node sends (its SERVER_SETUP write can never finish).
fn deaf_endpoint(identity: &abhyasa_moq::Identity) -> quinn::Endpoint {
    use quinn::rustls;
    let provider = std::sync::Arc::new(rustls::crypto::ring::default_provider());
    let mut roots = rustls::RootCertStore::empty();
    roots.add(identity.ca.clone()).unwrap();
    let mut tls = rustls::ClientConfig::builder_with_provider(provider)
        .with_protocol_versions(&[&rustls::version::TLS13])
        .unwrap()
        .with_root_certificates(roots)
        .with_client_auth_cert(identity.chain.clone(), identity.private_key())
        .unwrap();
    tls.alpn_protocols = vec![abhyasa_wire::moqt::ALPN.to_vec()];
    let mut transport = quinn::TransportConfig::default();
    transport.stream_receive_window(0u32.into());
    transport.receive_window(0u32.into());
    transport.keep_alive_interval(Some(Duration::from_millis(500)));
    let mut client = quinn::ClientConfig::new(std::sync::Arc::new(
        quinn::crypto::rustls::QuicClientConfig::try_from(tls).unwrap(),
    ));
    client.transport_config(std::sync::Arc::new(transport));
    let mut ep = quinn::Endpoint::client("127.0.0.1:0".parse().unwrap()).unwrap();
    ep.set_default_client_config(client);
    ep
}

/// Connections that never finish their setup: a member sends CLIENT_SETUP and never reads the
/// answer (its keep-alives keep the connection alive). Such a setup used to hold its
/// connection for good; now past `MAX_SETUPS` of them the oldest is closed for the new one,
/// every one is closed by `SETUP_DEADLINE`, and an honest session comes up meanwhile.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn setups_that_never_finish_are_closed_and_crowd_out_no_one() {
    use abhyasa_wire::moqt::{Control, KeyValue, DRAFT_14};
    let dir = tempfile::tempdir().unwrap();
    let ca = Ca::generate("t").unwrap();
    let node = node_with(&ca, dir.path(), Limits::default()).await;
    let ep = deaf_endpoint(&ca.issue(&id("agent-m")).unwrap());
    let mut setup = Vec::new();
    Control::ClientSetup {
        versions: vec![DRAFT_14],
        params: vec![KeyValue::Int { key: 2, value: 100 }],
    }
    .encode(&mut setup);
    let started = Instant::now();
    let mut stalled = Vec::new();
    for _ in 0..abhyasa_node::MAX_SETUPS + 8 {
        let conn = ep
            .connect(node.local_addr(), "agent-a")
            .unwrap()
            .await
            .unwrap();
        let (mut send, _recv) = conn.open_bi().await.unwrap();
        send.write_all(&setup).await.unwrap();
        stalled.push((conn, send, _recv));
    }
    // Past the cap: the oldest stalled setups were closed for the newest.
    assert!(
        closed_within(&stalled[0].0, Duration::from_secs(2))
            .await
            .is_some(),
        "the oldest stalled setup is closed past the cap"
    );
    // An honest member's session comes up all the same.
    let (honest, _rx, _ep) =
        tokio::time::timeout(Duration::from_secs(5), session(&ca, &id("agent-b"), &node))
            .await
            .expect("an honest session up within 5 s");
    // And the newest is closed by the setup deadline (it used to stay up for good).
    let newest = &stalled.last().unwrap().0;
    let wait =
        (abhyasa_node::SETUP_DEADLINE + Duration::from_secs(5)).saturating_sub(started.elapsed());
    assert!(
        closed_within(newest, wait).await.is_some(),
        "a setup is closed by its deadline"
    );
    assert_eq!(
        closed_within(honest.connection(), Duration::from_millis(200)).await,
        None,
        "the honest session stays"
    );
    node.shutdown().await;
}

/// The bindings' port: a session whose CLIENT_SETUP names a path goes to the binding that
/// registered that path, authenticated (the certificate's agent); a path no one registered is
/// closed with a reason; a path has one binding until its receiver is dropped.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_binding_session_reaches_the_port_of_its_path_and_no_other() {
    let dir = tempfile::tempdir().unwrap();
    let ca = Ca::generate("t").unwrap();
    let node = node_with(&ca, &dir.path().join("a"), Limits::default()).await;
    let dialer = Node::builder(ca.issue(&id("agent-b")).unwrap())
        .state_dir(dir.path().join("b"))
        .build()
        .await
        .unwrap();
    let mut port = node.port(b"/wt").unwrap();
    assert!(matches!(
        node.port(b"/wt"),
        Err(abhyasa_node::NodeError::Binding(_))
    ));

    let ours = dialer
        .dial(b"/wt", node.agent(), node.local_addr())
        .await
        .unwrap();
    let theirs = tokio::time::timeout(Duration::from_secs(5), port.recv())
        .await
        .expect("routed in time")
        .expect("the port is open");
    assert_eq!(theirs.path(), b"/wt");
    assert_eq!(theirs.peer(), &id("agent-b"));
    assert_eq!(ours.peer(), node.agent());

    let stray = dialer
        .dial(b"/mcp", node.agent(), node.local_addr())
        .await
        .expect_err("a path no binding serves is refused");
    assert!(
        stray.to_string().contains("no binding serves this path"),
        "{stray}"
    );
    assert_eq!(
        closed_within(ours.connection(), Duration::from_millis(200)).await,
        None
    );

    drop(port);
    assert!(node.port(b"/wt").is_ok(), "a dropped port frees its path");
    dialer.shutdown().await;
    node.shutdown().await;
}
