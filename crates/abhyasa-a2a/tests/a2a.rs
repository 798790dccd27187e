//! The A2A binding between two in-process nodes over mutually authenticated HTTPS on loopback:
//! custody of every kind, across a restart of the agent; the card read with the official A2A
//! Rust types; a JSON obligation in the reference's shape; bad input refused with nothing
//! applied. Outcomes are checked from both nodes' durable state.

use std::net::SocketAddr;
use std::time::Duration;

use abhyasa_a2a::json::JsonAck;
use abhyasa_a2a::{serve, spawn_peer, A2aPeer, A2aServer, CardSettings, EXTENSION_URI};
use abhyasa_moq::{Ca, Identity};
use abhyasa_node::Node;
use abhyasa_testkit::{free_udp, id, now_ms};
use abhyasa_wire::{
    BeliefUpdatePayload, ClientId, ConsentDecision, ConsentPayload, Kind, Obligation, Outcome,
    Payload, Scope, TokenAction, TokenId, TokenPayload, UnixMillis, WeightDelta, WeightKey,
};

fn free_tcp() -> SocketAddr {
    SocketAddr::from(([127, 0, 0, 1], abhyasa_testkit::free_tcp()))
}

fn settings(https: SocketAddr) -> CardSettings {
    CardSettings {
        backoff_base_seconds: 1.0,
        backoff_cap_seconds: 30,
        ..CardSettings::new(id("agent-1"), format!("https://agent-1:{}", https.port()))
    }
}

async fn agent(identity: &Identity, dir: &std::path::Path, https: SocketAddr) -> (Node, A2aServer) {
    let node = Node::builder(identity.clone())
        .listen(free_udp())
        .state_dir(dir.join("agent"))
        .build()
        .await
        .unwrap();
    let server = serve(node.clone(), identity, https, &settings(https).card())
        .await
        .unwrap();
    (node, server)
}

async fn principal(identity: &Identity, dir: &std::path::Path) -> Node {
    Node::builder(identity.clone())
        .state_dir(dir.join("principal"))
        .custodian(abhyasa_custody::CustodianConfig {
            response_timeout_ms: 300,
            backoff_base_ms: 50,
            backoff_cap_ms: 400,
            ..Default::default()
        })
        .build()
        .await
        .unwrap()
}

fn obligation(n: u128, payload: Payload) -> Obligation {
    abhyasa_testkit::obligation(n, &id("principal"), &id("agent-1"), 30_000, 60, payload)
}

/// One of each kind, in turn.
fn nth(n: u128) -> Obligation {
    let payload = match n % 3 {
        0 => Payload::AnumatiConsent(ConsentPayload {
            decision: Some(ConsentDecision::Revoke),
            scope: Scope::new(format!("scope-{n}")).unwrap(),
            expires_at: None,
        }),
        1 => Payload::PhalaBeliefUpdate(BeliefUpdatePayload {
            weight_key: WeightKey::new(format!("supplier/{n}")).unwrap(),
            weight_delta: WeightDelta(-250_000),
            ttl_ms: 60_000,
        }),
        _ => Payload::OauthToken(TokenPayload {
            action: TokenAction::Revoke,
            token_id: TokenId::new(format!("tok-{n}")).unwrap(),
            client_id: ClientId::new("c").unwrap(),
            expires_at: None,
        }),
    };
    obligation(n, payload)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn custody_over_a2a_applies_every_kind_once_across_an_agent_restart() {
    let dir = tempfile::tempdir().unwrap();
    let ca = Ca::generate("t").unwrap();
    let (agent_id, principal_id) = (
        ca.issue(&id("agent-1")).unwrap(),
        ca.issue(&id("principal")).unwrap(),
    );
    let https = free_tcp();
    let (mut agent_node, mut server) = agent(&agent_id, dir.path(), https).await;
    let p = principal(&principal_id, dir.path()).await;
    let _peer = spawn_peer(
        p.clone(),
        &principal_id,
        A2aPeer {
            agent: id("agent-1"),
            card_url: format!(
                "https://agent-1:{}/.well-known/agent-card.json",
                https.port()
            ),
            addr: Some(https),
        },
    )
    .unwrap();

    let sent: Vec<Obligation> = (300..330).map(nth).collect();
    let mut handles = Vec::new();
    for (i, o) in sent.iter().enumerate() {
        handles.push(p.issue(o.clone()).await.unwrap());
        tokio::time::sleep(Duration::from_millis(15)).await;
        if i == 12 {
            // The agent goes away mid-run and comes back on the same address and state.
            server.abort();
            drop(server);
            agent_node.shutdown().await;
            tokio::time::sleep(Duration::from_millis(300)).await;
            (agent_node, server) = agent(&agent_id, dir.path(), https).await;
        }
    }
    for h in handles {
        let (record, _) = tokio::time::timeout(Duration::from_secs(40), h.outcome())
            .await
            .expect("custody ends by the deadline")
            .unwrap();
        assert_eq!(record.outcome, Outcome::Applied, "{}", record.obligation_id);
    }
    // From the agent's own durable state: each applied, once, and honoured.
    let on_agent = agent_node
        .applied(sent.iter().map(|o| o.id).collect())
        .await
        .unwrap();
    assert!(on_agent.iter().all(|a| *a));
    let log = agent_node.status().await.unwrap().applied;
    for o in &sent {
        assert!(log.iter().filter(|a| a.obligation.id == o.id).count() <= 1);
    }
    // The card's profiles are checked at issue: a budget that does not span the deadline
    // under the card's backoff (1 s doubling, capped at 30 s: 1+2+4+8+16 = 31 s ≥ 30 s, so 5)
    // is refused with the number needed, and nothing is issued.
    let mut short = nth(400);
    short.max_retries = 4;
    match p.issue(short.clone()).await {
        Err(abhyasa_node::NodeError::Issue(abhyasa_custody::IssueError::BudgetTooSmall {
            given,
            needed,
            ..
        })) => assert_eq!((given, needed), (4, 5)),
        other => panic!("{other:?}"),
    }
    short.max_retries = 5;
    let (record, _) = p.issue(short).await.unwrap().outcome().await.unwrap();
    assert_eq!(record.outcome, Outcome::Applied);
    let honours = agent_node.honours().await.unwrap();
    assert!(honours.is_dropped(&TokenId::new("tok-302").unwrap()));
    assert!(honours.is_withheld(&id("principal"), &Scope::new("scope-300").unwrap()));
    drop(server);
    p.shutdown().await;
    agent_node.shutdown().await;
}

/// An agent node serving the binding, and the principal's HTTPS client for it.
struct Served {
    _dir: tempfile::TempDir,
    agent_node: Node,
    _server: A2aServer,
    https: SocketAddr,
    peer: A2aPeer,
    http: reqwest::Client,
}

async fn served() -> Served {
    let dir = tempfile::tempdir().unwrap();
    let ca = Ca::generate("t").unwrap();
    let (agent_id, principal_id) = (
        ca.issue(&id("agent-1")).unwrap(),
        ca.issue(&id("principal")).unwrap(),
    );
    let https = free_tcp();
    let (agent_node, server) = agent(&agent_id, dir.path(), https).await;
    let peer = A2aPeer {
        agent: id("agent-1"),
        card_url: format!(
            "https://agent-1:{}/.well-known/agent-card.json",
            https.port()
        ),
        addr: Some(https),
    };
    let http = abhyasa_a2a::client::http_client(&principal_id, &peer).unwrap();
    Served {
        _dir: dir,
        agent_node,
        _server: server,
        https,
        peer,
        http,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_card_reads_with_the_official_a2a_types_and_json_obligations_get_json_acks() {
    let Served {
        _dir,
        agent_node,
        _server,
        https,
        peer,
        http,
    } = served().await;

    // The card, as the A2A project's Rust types read it.
    let body = http
        .get(&peer.card_url)
        .send()
        .await
        .unwrap()
        .bytes()
        .await
        .unwrap();
    let card: a2a::AgentCard = serde_json::from_slice(&body).expect("a2a-lf reads the card");
    assert_eq!(card.name, "agent-1");
    let ext = card
        .capabilities
        .extensions
        .as_ref()
        .and_then(|e| e.iter().find(|e| e.uri == EXTENSION_URI))
        .expect("the Abhyasa extension");
    let params = ext.params.as_ref().unwrap();
    let kinds = params["supported_kinds"].as_array().unwrap();
    assert_eq!(kinds.len(), 3);
    assert_eq!(kinds[0]["kind"], "anumati.consent");

    // A JSON obligation in the reference's shape.
    let url = |k: Kind| {
        format!(
            "https://agent-1:{}/abhyasa/v1/obligations/{}",
            https.port(),
            k.as_str()
        )
    };
    let created = abhyasa_a2a::json::format_time(UnixMillis(now_ms()));
    let revoke = serde_json::json!({
        "obligation_id": "rev-calendar-1",
        "kind": "anumati.consent",
        "target": "agent-1",
        "payload": {"decision": "revoke", "scope": "calendar.read"},
        "deadline_seconds": 3600,
        "max_retries": 15,
        "created_at": created,
        "sequence": null
    });
    for _ in 0..2 {
        // Twice: the second is recognized, not applied again.
        let r = http
            .post(url(Kind::AnumatiConsent))
            .header("content-type", "application/json")
            .body(revoke.to_string())
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 200);
        let ack: JsonAck = serde_json::from_slice(&r.bytes().await.unwrap()).unwrap();
        assert_eq!(ack.obligation_id, "rev-calendar-1");
        assert_eq!(ack.status, "applied");
        assert_eq!(ack.target, "agent-1");
    }
    let honours = agent_node.honours().await.unwrap();
    assert!(honours.is_withheld(&id("principal"), &Scope::new("calendar.read").unwrap()));
    let applied = agent_node.status().await.unwrap().applied;
    assert_eq!(applied.len(), 1, "applied once");
    assert_eq!(
        applied[0].obligation.issuer,
        id("principal"),
        "the issuer is who signed in"
    );

    // Bad input: a clear error, nothing applied.
    let bad = [
        (
            url(Kind::AnumatiConsent),
            "application/json",
            b"{\"obligation_id\": 1}".to_vec(),
            400,
        ),
        (
            url(Kind::OauthToken),
            "application/json",
            revoke.to_string().into_bytes(),
            400,
        ),
        (
            url(Kind::AnumatiConsent),
            "text/plain",
            b"revoke".to_vec(),
            415,
        ),
        (
            format!(
                "https://agent-1:{}/abhyasa/v1/obligations/x.y",
                https.port()
            ),
            "application/json",
            revoke.to_string().into_bytes(),
            404,
        ),
        (
            url(Kind::AnumatiConsent),
            "application/json",
            vec![b' '; 70_000],
            413,
        ),
        // CBOR that is no obligation at all, and one in another issuer's name.
        (
            url(Kind::OauthToken),
            "application/cbor",
            vec![0xa1, 0x01],
            400,
        ),
        (
            url(Kind::OauthToken),
            "application/cbor",
            abhyasa_wire::encode(&Obligation {
                issuer: id("mallory"),
                ..nth(500)
            }),
            403,
        ),
    ];
    for (u, ct, body, status) in bad {
        let r = http
            .post(&u)
            .header("content-type", ct)
            .body(body)
            .send()
            .await
            .unwrap();
        assert_eq!(r.status().as_u16(), status, "{u} {ct}");
    }
    assert_eq!(agent_node.status().await.unwrap().applied.len(), 1);
    // A best-effort kind (a preference raised) is taken and not acked: 202.
    let mut raise = revoke.clone();
    raise["obligation_id"] = "raise-1".into();
    raise["kind"] = "phala.belief_update".into();
    raise["payload"] = serde_json::json!({"weight_delta": 0.25, "weight_key": "supplier/a"});
    let r = http
        .post(url(Kind::PhalaBeliefUpdate))
        .header("content-type", "application/json")
        .body(raise.to_string())
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 202);

    // Without a certificate from the deployment CA there is no connection at all.
    let other = Ca::generate("other")
        .unwrap()
        .issue(&id("principal"))
        .unwrap();
    let stranger = abhyasa_a2a::client::http_client(&other, &peer).unwrap();
    assert!(stranger.get(&peer.card_url).send().await.is_err());
    agent_node.shutdown().await;
}

/// Reproduced from outside: a 32-hex id and the same digits as a dashed UUID (or in another
/// letter case) mapped to one id, so a second revocation under the other spelling was acked
/// `applied` and never applied — a custodian discharging on that ack loses the revocation
/// silently. Each spelling is its own id now; and a known id arriving with other content is
/// declined `id_conflict`, never acked `applied`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_spellings_of_one_uuid_are_two_obligations_and_a_reused_id_is_never_acked_applied() {
    let Served {
        _dir,
        agent_node,
        _server,
        https,
        peer: _,
        http,
    } = served().await;
    let url = format!(
        "https://agent-1:{}/abhyasa/v1/obligations/anumati.consent",
        https.port()
    );
    let created = abhyasa_a2a::json::format_time(UnixMillis(now_ms()));
    let revoke = |spelling: &str, scope: &str| {
        serde_json::json!({
            "obligation_id": spelling,
            "kind": "anumati.consent",
            "target": "agent-1",
            "payload": {"decision": "revoke", "scope": scope},
            "deadline_seconds": 3600,
            "max_retries": 15,
            "created_at": created,
            // A field the reference may add some day: ignored, not refused.
            "trace_id": "abc",
        })
    };
    let post = |body: serde_json::Value| {
        let (http, url) = (http.clone(), url.clone());
        async move {
            let r = http
                .post(&url)
                .header("content-type", "application/json")
                .body(body.to_string())
                .send()
                .await
                .unwrap();
            assert_eq!(r.status(), 200);
            serde_json::from_slice::<JsonAck>(&r.bytes().await.unwrap()).unwrap()
        }
    };
    let spellings = [
        ("0f8fad5b-d9cb-469f-a165-70867728950e", "scope-a"),
        ("0f8fad5bd9cb469fa16570867728950e", "scope-b"),
        ("0F8FAD5B-D9CB-469F-A165-70867728950E", "scope-c"),
    ];
    for (spelling, scope) in spellings {
        let ack = post(revoke(spelling, scope)).await;
        assert_eq!(ack.obligation_id, spelling);
        assert_eq!(ack.status, "applied", "{spelling}: {ack:?}");
    }
    let honours = agent_node.honours().await.unwrap();
    for (spelling, scope) in spellings {
        assert!(
            honours.is_withheld(&id("principal"), &Scope::new(scope).unwrap()),
            "{scope} (under {spelling}) acked applied but not withheld"
        );
    }
    assert_eq!(agent_node.status().await.unwrap().applied.len(), 3);

    // The first spelling again, with other content: declined, and scope-d not withheld.
    let ack = post(revoke(spellings[0].0, "scope-d")).await;
    assert_eq!(ack.status, "declined", "{ack:?}");
    assert_eq!(ack.reason.as_deref(), Some("id_conflict"));
    assert!(ack.detail.is_some_and(|d| d.contains("other content")));
    // Its own content again: still applied (a redelivery).
    let ack = post(revoke(spellings[0].0, "scope-a")).await;
    assert_eq!(ack.status, "applied");

    // Not addressed to this agent: declined, saying so.
    let mut elsewhere = revoke("for-agent-2", "scope-e");
    elsewhere["target"] = "agent-2".into();
    let ack = post(elsewhere).await;
    assert_eq!(ack.status, "declined");
    assert_eq!(ack.reason.as_deref(), Some("refused"));
    assert!(
        ack.detail
            .as_deref()
            .is_some_and(|d| d.contains("not addressed to this agent")),
        "{ack:?}"
    );
    assert_eq!(agent_node.status().await.unwrap().applied.len(), 3);

    // The same over CBOR: another obligation under an applied id is declined too.
    let mut o = nth(900);
    let r = http
        .post(url.clone())
        .header("content-type", "application/cbor")
        .body(abhyasa_wire::encode(&o))
        .send()
        .await
        .unwrap();
    let ack: abhyasa_wire::CustodyAck = abhyasa_wire::decode(&r.bytes().await.unwrap()).unwrap();
    assert_eq!(ack.status, abhyasa_wire::AckStatus::Applied);
    o.payload = Payload::AnumatiConsent(ConsentPayload {
        decision: Some(ConsentDecision::Revoke),
        scope: Scope::new("another-scope").unwrap(),
        expires_at: None,
    });
    let r = http
        .post(url.clone())
        .header("content-type", "application/cbor")
        .body(abhyasa_wire::encode(&o))
        .send()
        .await
        .unwrap();
    let ack: abhyasa_wire::CustodyAck = abhyasa_wire::decode(&r.bytes().await.unwrap()).unwrap();
    assert_eq!(
        ack.status,
        abhyasa_wire::AckStatus::Declined(abhyasa_wire::DeclineReason::IdConflict)
    );
    agent_node.shutdown().await;
}

/// Reproduced from outside: the official `a2a-sdk` client built from our card called
/// `POST /message:send` (the interface the card advertises) and got 404. It is served:
/// obligations ride a message as parts, their acks come back as parts of the reply.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn message_send_carries_obligations_as_parts_and_answers_their_acks() {
    use base64::Engine as _;
    let Served {
        _dir,
        agent_node,
        _server,
        https,
        peer: _,
        http,
    } = served().await;
    let url = format!("https://agent-1:{}/message:send", https.port());
    let created = abhyasa_a2a::json::format_time(UnixMillis(now_ms()));
    let json_part = serde_json::json!({
        "obligation_id": "msg-revoke-1",
        "kind": "anumati.consent",
        "target": "agent-1",
        "payload": {"decision": "revoke", "scope": "contacts.read"},
        "deadline_seconds": 3600,
        "max_retries": 15,
        "created_at": created,
    });
    let cbor = nth(2); // a token revocation
                       // Best effort: a preference raised (a grant would be under custody: it fails closed).
    let raise = serde_json::json!({
        "obligation_id": "msg-raise-1",
        "kind": "phala.belief_update",
        "target": "agent-1",
        "payload": {"weight_delta": 0.25, "weight_key": "supplier/a"},
        "deadline_seconds": 3600,
        "max_retries": 15,
        "created_at": created,
    });
    let send = |parts: serde_json::Value| {
        let (http, url) = (http.clone(), url.clone());
        async move {
            let body = serde_json::json!({
                "message": {
                    "messageId": "m-1",
                    "contextId": "ctx-1",
                    "role": "ROLE_USER",
                    "parts": parts,
                    "extensions": [EXTENSION_URI],
                }
            });
            let r = http
                .post(&url)
                .header("content-type", "application/json")
                .body(body.to_string())
                .send()
                .await
                .unwrap();
            let status = r.status().as_u16();
            let v: serde_json::Value = serde_json::from_slice(&r.bytes().await.unwrap()).unwrap();
            (status, v)
        }
    };
    // A part that is no obligation refuses the whole message: nothing applied.
    let (status, v) = send(serde_json::json!([
        {"data": json_part},
        {"text": "please revoke"},
    ]))
    .await;
    assert_eq!(status, 400, "{v}");
    assert!(v["error"]["message"]
        .as_str()
        .unwrap()
        .contains("message.parts[1]"));
    assert!(agent_node.status().await.unwrap().applied.is_empty());

    let (status, v) = send(serde_json::json!([
        {"data": json_part},
        {"raw": base64::engine::general_purpose::STANDARD.encode(abhyasa_wire::encode(&cbor)),
         "mediaType": "application/cbor"},
        {"data": raise},
    ]))
    .await;
    assert_eq!(status, 200, "{v}");
    let reply = &v["message"];
    assert_eq!(reply["role"], "ROLE_AGENT");
    assert_eq!(reply["contextId"], "ctx-1");
    let parts = reply["parts"].as_array().unwrap();
    assert_eq!(parts.len(), 3);
    assert_eq!(parts[0]["data"]["obligation_id"], "msg-revoke-1");
    assert_eq!(parts[0]["data"]["status"], "applied");
    assert_eq!(
        parts[1]["data"]["obligation_id"],
        abhyasa_a2a::json::id_string(cbor.id)
    );
    assert_eq!(parts[1]["data"]["status"], "applied");
    assert_eq!(parts[2]["data"]["status"], "best_effort");
    let honours = agent_node.honours().await.unwrap();
    assert!(honours.is_withheld(&id("principal"), &Scope::new("contacts.read").unwrap()));
    assert!(honours.is_dropped(&TokenId::new("tok-2").unwrap()));
    agent_node.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_member_holding_its_share_of_connections_crowds_out_no_other_member() {
    use abhyasa_a2a::server::MAX_CONNECTIONS_PER_MEMBER;
    let dir = tempfile::tempdir().unwrap();
    let ca = Ca::generate("t").unwrap();
    let (agent_id, greedy, other) = (
        ca.issue(&id("agent-1")).unwrap(),
        ca.issue(&id("principal")).unwrap(),
        ca.issue(&id("member-2")).unwrap(),
    );
    let https = free_tcp();
    let (agent_node, _server) = agent(&agent_id, dir.path(), https).await;
    let peer = A2aPeer {
        agent: id("agent-1"),
        card_url: format!(
            "https://agent-1:{}/.well-known/agent-card.json",
            https.port()
        ),
        addr: Some(https),
    };
    let card = |c: reqwest::Client| {
        let url = peer.card_url.clone();
        async move {
            let ok = c
                .get(&url)
                .send()
                .await
                .is_ok_and(|r| r.status().is_success());
            (ok, c)
        }
    };
    // One member opens more connections than its share, each kept open by its own client.
    let mut held = Vec::new();
    let mut served = 0;
    for _ in 0..MAX_CONNECTIONS_PER_MEMBER + 8 {
        let (ok, c) = card(abhyasa_a2a::client::http_client(&greedy, &peer).unwrap()).await;
        served += usize::from(ok);
        held.push(c);
    }
    assert_eq!(served, MAX_CONNECTIONS_PER_MEMBER);
    // Another member is served while they are held.
    let (ok, _c) = card(abhyasa_a2a::client::http_client(&other, &peer).unwrap()).await;
    assert!(ok, "another member was refused");
    // Closed, they give their places back.
    drop(held);
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    loop {
        let (ok, _c) = card(abhyasa_a2a::client::http_client(&greedy, &peer).unwrap()).await;
        if ok {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "the member's places never came back"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    agent_node.shutdown().await;
}
