//! The enforcement points against a principal node and a real agent node on loopback QUIC,
//! asked over HTTP: a revocation refuses from the moment it is issued, names its obligation,
//! and holds while the obligation escalates; tokens this node does not govern are answered by
//! an upstream introspection endpoint (a small HTTP server here), filtered.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use abhyasa_custody::CustodianConfig;
use abhyasa_enforce::{EnforceConfig, Upstream};
use abhyasa_moq::Ca;
use abhyasa_node::{Ask, Carried, Node, Verdict};
use abhyasa_wire::{
    AgentId, ConsentDecision, ConsentPayload, Obligation, ObligationId, Outcome, Payload, Scope,
    TokenId, UnixMillis,
};

const KEY: &str = "0123456789abcdef0123456789abcdef";

fn id(s: &str) -> AgentId {
    AgentId::new(s).unwrap()
}

struct Pair {
    _dir: tempfile::TempDir,
    principal: Node,
    _agent: Option<Node>,
}

/// A principal dialing `agent-1`; with `agent_up` false nothing listens where it dials.
async fn pair(agent_up: bool) -> Pair {
    let dir = tempfile::tempdir().unwrap();
    let ca = Ca::generate("t").unwrap();
    let (agent, addr) = if agent_up {
        let a = Node::builder(ca.issue(&id("agent-1")).unwrap())
            .state_dir(dir.path().join("a"))
            .build()
            .await
            .unwrap();
        let addr = a.local_addr();
        (Some(a), addr)
    } else {
        // A port nothing answers on.
        let s = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
        let addr = s.local_addr().unwrap();
        drop(s);
        (None, addr)
    };
    let principal = Node::builder(ca.issue(&id("principal")).unwrap())
        .state_dir(dir.path().join("p"))
        .peer(id("agent-1"), addr)
        .custodian(CustodianConfig {
            response_timeout_ms: 300,
            backoff_base_ms: 50,
            backoff_cap_ms: 200,
            ..CustodianConfig::default()
        })
        .build()
        .await
        .unwrap();
    Pair {
        _dir: dir,
        principal,
        _agent: agent,
    }
}

fn consent(
    node: &Node,
    n: u128,
    decision: ConsentDecision,
    seq: u64,
    deadline_ms: u64,
) -> Obligation {
    let now = node.now();
    Obligation {
        id: ObligationId::from_u128(n),
        issuer: id("principal"),
        target: id("agent-1"),
        created_at: now,
        deadline: UnixMillis(now.0 + deadline_ms),
        max_retries: node.default_retries(deadline_ms),
        sequence: Some(seq),
        payload: Payload::AnumatiConsent(ConsentPayload {
            decision: Some(decision),
            scope: Scope::new("calendar.read").unwrap(),
            expires_at: None,
        }),
    }
}

async fn serve(node: &Node, upstream: Option<Upstream>) -> (abhyasa_enforce::Server, String) {
    let mut c = EnforceConfig::new("127.0.0.1:0".parse().unwrap());
    c.key = Some(KEY.into());
    c.holders = vec![id("agent-1")];
    c.upstream = upstream;
    let server = abhyasa_enforce::serve(node.clone(), c).await.unwrap();
    let base = format!("http://{}", server.local_addr());
    (server, base)
}

async fn check(base: &str, scope: Option<&str>, bearer: Option<&str>) -> reqwest::Response {
    let mut r = client()
        .get(format!("{base}/authz/calendar/today"))
        .header("abhyasa-key", KEY)
        .header("abhyasa-agent", "agent-1");
    if let Some(s) = scope {
        r = r.header("abhyasa-scope", s);
    }
    if let Some(b) = bearer {
        r = r.bearer_auth(b);
    }
    r.send().await.unwrap()
}

/// A plain-HTTP client (reqwest is built here without a default TLS provider).
fn client() -> reqwest::Client {
    let tls = rustls::ClientConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .unwrap()
    .with_root_certificates(rustls::RootCertStore::empty())
    .with_no_client_auth();
    reqwest::Client::builder()
        .use_preconfigured_tls(tls)
        .build()
        .unwrap()
}

fn header(r: &reqwest::Response, name: &str) -> Option<String> {
    r.headers()
        .get(name)
        .map(|v| v.to_str().unwrap().to_owned())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_revocation_refuses_from_its_issue_and_names_its_obligation() {
    let p = pair(true).await;
    let (_server, base) = serve(&p.principal, None).await;

    // No decision yet: the check lets the call through.
    assert_eq!(
        check(&base, Some("calendar.read"), None).await.status(),
        200
    );
    // Without the key nothing is answered.
    let r = client()
        .get(format!("{base}/authz"))
        .header("abhyasa-agent", "agent-1")
        .header("abhyasa-scope", "calendar.read")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 401);
    let r = client()
        .get(format!("{base}/authz"))
        .header("abhyasa-key", "not-the-key-not-the-key-not-the")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 401);

    // The revocation refuses from the moment it is issued, before any ack.
    let handle = p
        .principal
        .issue(consent(&p.principal, 1, ConsentDecision::Revoke, 1, 60_000))
        .await
        .unwrap();
    let r = check(&base, Some("calendar.read"), None).await;
    assert_eq!(r.status(), 403);
    assert_eq!(
        header(&r, "abhyasa-obligation").as_deref(),
        Some(format!("{}", ObligationId::from_u128(1)).as_str())
    );
    let refusal = header(&r, "abhyasa-refusal").unwrap();
    assert!(
        refusal.contains("calendar.read") && refusal.contains("agent-1"),
        "{refusal}"
    );
    // Other scopes and other agents are not touched by it.
    assert_eq!(check(&base, Some("mail.send"), None).await.status(), 200);
    let (record, _) = handle.outcome().await.unwrap();
    assert_eq!(record.outcome, Outcome::Applied);
    let r = check(&base, Some("mail.send, calendar.read"), None).await;
    assert_eq!(r.status(), 403);
    assert_eq!(
        header(&r, "abhyasa-obligation-state").as_deref(),
        Some("applied")
    );

    // A newer grant lifts it, once agent-1 confirms it (fail-closed until then), for its
    // lease.
    let mut grant = consent(&p.principal, 2, ConsentDecision::Grant, 2, 60_000);
    let lease = UnixMillis(p.principal.now().0 + 2_500);
    if let Payload::AnumatiConsent(c) = &mut grant.payload {
        c.expires_at = Some(lease);
    }
    let handle = p.principal.issue(grant).await.unwrap();
    let unconfirmed = check(&base, Some("calendar.read"), None).await;
    if unconfirmed.status() == 403 {
        // Refused while pending, naming the grant (unless the ack beat the check).
        assert_eq!(
            header(&unconfirmed, "abhyasa-obligation").as_deref(),
            Some(format!("{}", ObligationId::from_u128(2)).as_str())
        );
    } else {
        assert_eq!(unconfirmed.status(), 200);
    }
    let (record, _) = handle.outcome().await.unwrap();
    assert_eq!(record.outcome, Outcome::Applied);
    assert_eq!(
        check(&base, Some("calendar.read"), None).await.status(),
        200
    );
    let ask = Ask::Scope {
        agent: id("agent-1"),
        scope: Scope::new("calendar.read").unwrap(),
    };
    assert_eq!(
        p.principal.decide(ask.clone()).await.unwrap(),
        Verdict::Allow {
            obligation: Some(ObligationId::from_u128(2)),
            until: Some(lease),
        }
    );
    // The lease ends with no renewal: refused from its end on, saying so.
    let wait = lease.0.saturating_sub(p.principal.now().0) + 50;
    tokio::time::sleep(std::time::Duration::from_millis(wait)).await;
    let lapsed = check(&base, Some("calendar.read"), None).await;
    assert_eq!(lapsed.status(), 403);
    let refusal = header(&lapsed, "abhyasa-refusal").unwrap();
    assert!(
        refusal.contains("lease") && refusal.contains("ended"),
        "{refusal}"
    );
    assert!(matches!(
        p.principal.decide(ask).await.unwrap(),
        Verdict::Refuse(r) if r.lease_ended == Some(lease)
    ));

    // A check that cannot be read fails closed, saying why.
    let no_agent = client()
        .get(format!("{base}/authz"))
        .header("abhyasa-key", KEY)
        .header("abhyasa-scope", "calendar.read")
        .send()
        .await
        .unwrap();
    assert_eq!(no_agent.status(), 403);
    assert!(header(&no_agent, "abhyasa-refusal")
        .unwrap()
        .contains("without the agent"));
    let long = "s".repeat(300);
    let bad_scope = check(&base, Some(&long), None).await;
    assert_eq!(bad_scope.status(), 403);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_the_agent_down_the_refusal_holds_while_the_obligation_escalates() {
    let p = pair(false).await;
    let (_server, base) = serve(&p.principal, None).await;
    let handle = p
        .principal
        .issue(consent(&p.principal, 7, ConsentDecision::Revoke, 1, 1_500))
        .await
        .unwrap();
    let r = check(&base, Some("calendar.read"), None).await;
    assert_eq!(r.status(), 403);
    assert_eq!(
        header(&r, "abhyasa-obligation-state").as_deref(),
        Some("pending")
    );
    let (record, escalation) = handle.outcome().await.unwrap();
    assert!(matches!(record.outcome, Outcome::Escalated(_)));
    assert!(escalation.is_some());
    let r = check(&base, Some("calendar.read"), None).await;
    assert_eq!(r.status(), 403);
    assert_eq!(
        header(&r, "abhyasa-obligation-state").as_deref(),
        Some("escalated")
    );
    assert_eq!(
        header(&r, "abhyasa-obligation").as_deref(),
        Some(format!("{}", ObligationId::from_u128(7)).as_str())
    );
}

/// A small authorization server: `tok-live` is active until an hour from now, `tok-old` says
/// active but its `exp` has passed, anything else is inactive. It records the Authorization
/// header each request came with.
async fn upstream_server(down: bool) -> (SocketAddr, Arc<AtomicU32>, Arc<Mutex<Vec<String>>>) {
    let asked = Arc::new(AtomicU32::new(0));
    let auths = Arc::new(Mutex::new(Vec::new()));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    if down {
        drop(listener);
        return (addr, asked, auths);
    }
    let (a, h) = (asked.clone(), auths.clone());
    let app = axum::Router::new().route(
        "/introspect",
        axum::routing::post(move |headers: axum::http::HeaderMap, body: String| {
            let (a, h) = (a.clone(), h.clone());
            async move {
                a.fetch_add(1, Ordering::SeqCst);
                h.lock().unwrap().push(
                    headers
                        .get("authorization")
                        .map(|v| v.to_str().unwrap().to_owned())
                        .unwrap_or_default(),
                );
                let now = std::time::SystemTime::now()
                    .duration_since(std::time::UNIX_EPOCH)
                    .unwrap()
                    .as_secs();
                let answer = if body == "token=tok-live" {
                    serde_json::json!({"active": true, "exp": now + 3600, "client_id": "app-1", "scope": "calendar.read"})
                } else if body == "token=tok-old" {
                    serde_json::json!({"active": true, "exp": now - 10})
                } else {
                    serde_json::json!({"active": false})
                };
                axum::Json(answer)
            }
        }),
    );
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    (addr, asked, auths)
}

async fn introspect(
    base: &str,
    token: &str,
) -> (reqwest::StatusCode, Option<String>, serde_json::Value) {
    let r = client()
        .post(format!("{base}/oauth2/introspect"))
        .bearer_auth(KEY)
        .header("content-type", "application/x-www-form-urlencoded")
        .body(format!("token={token}&token_type_hint=access_token"))
        .send()
        .await
        .unwrap();
    let status = r.status();
    let named = header(&r, "abhyasa-obligation");
    (status, named, r.json().await.unwrap())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn introspection_refuses_what_the_node_revoked_and_filters_its_upstream() {
    let p = pair(true).await;
    let (up, asked, auths) = upstream_server(false).await;
    let (_server, base) = serve(
        &p.principal,
        Some(Upstream {
            url: format!("http://{up}/introspect"),
            authorization: Some("Basic cnM6c2VjcmV0".into()),
            roots: None,
        }),
    )
    .await;

    // Tokens this node does not govern: the upstream's answer, passed through or filtered.
    let (s, named, live) = introspect(&base, "tok-live").await;
    assert_eq!(s, 200);
    assert_eq!(live["active"], true);
    assert_eq!(live["client_id"], "app-1");
    assert_eq!(named, None);
    let (_, _, old) = introspect(&base, "tok-old").await;
    assert_eq!(old, serde_json::json!({"active": false}), "past its exp");
    let (_, _, unknown) = introspect(&base, "tok-unknown").await;
    assert_eq!(unknown["active"], false);
    assert_eq!(asked.load(Ordering::SeqCst), 3);
    assert!(auths
        .lock()
        .unwrap()
        .iter()
        .all(|a| a == "Basic cnM6c2VjcmV0"));

    // RFC 7009 revocation: carried to the holder under custody, refused at once.
    let r = client()
        .post(format!("{base}/oauth2/revoke"))
        .bearer_auth(KEY)
        .header("content-type", "application/x-www-form-urlencoded")
        .body("token=tok-live")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    let carried = ObligationId::from_u128(
        u128::from_str_radix(&header(&r, "abhyasa-obligation").unwrap(), 16).unwrap(),
    );
    let (s, named, body) = introspect(&base, "tok-live").await;
    assert_eq!(s, 200);
    assert_eq!(body, serde_json::json!({"active": false}));
    assert_eq!(named, Some(carried.to_string()));
    // The upstream is not asked about a token the node refuses.
    assert_eq!(
        asked.load(Ordering::SeqCst),
        4,
        "3 + one at revocation + none now"
    );
    // The record lapses with the token: its expiry came from the upstream's `exp`.
    let status = p.principal.status().await.unwrap();
    let until = status
        .principal
        .revoked_until(&TokenId::new("tok-live").unwrap())
        .unwrap()
        .expect("an expiry from the upstream");
    assert!(until.0 > p.principal.now().0 + 3_000_000);
    // The proxy check refuses the bearer too.
    let r = check(&base, None, Some("tok-live")).await;
    assert_eq!(r.status(), 403);
    assert_eq!(header(&r, "abhyasa-obligation"), Some(carried.to_string()));
    assert_eq!(check(&base, None, Some("tok-other")).await.status(), 200);
    // And the holder drops it once the obligation is applied.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    loop {
        let s = p.principal.status().await.unwrap();
        if s.recent
            .iter()
            .any(|r| r.obligation_id == carried && r.outcome == Outcome::Applied)
        {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "revocation not applied"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    match p
        .principal
        .decide(Ask::Token(TokenId::new("tok-live").unwrap()))
        .await
        .unwrap()
    {
        Verdict::Refuse(r) => assert_eq!(r.carried, Carried::Ended(Outcome::Applied)),
        other => panic!("{other:?}"),
    }

    // Bad requests are refused in the RFC's words.
    let r = client()
        .post(format!("{base}/oauth2/introspect"))
        .bearer_auth(KEY)
        .header("content-type", "application/x-www-form-urlencoded")
        .body("token_type_hint=access_token")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 400);
    assert_eq!(
        r.json::<serde_json::Value>().await.unwrap()["error"],
        "invalid_request"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_a_working_upstream_an_ungoverned_token_is_inactive() {
    let p = pair(true).await;
    let (none, _) = serve(&p.principal, None).await;
    let base = format!("http://{}", none.local_addr());
    assert_eq!(
        introspect(&base, "tok-live").await.2,
        serde_json::json!({"active": false})
    );
    let (up, _, _) = upstream_server(true).await;
    let (_down, base) = serve(
        &p.principal,
        Some(Upstream {
            url: format!("http://{up}/introspect"),
            authorization: None,
            roots: None,
        }),
    )
    .await;
    assert_eq!(
        introspect(&base, "tok-live").await.2,
        serde_json::json!({"active": false})
    );
}
