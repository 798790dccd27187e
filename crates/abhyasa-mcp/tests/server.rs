//! An rmcp client drives the agent's MCP server over an in-process pipe: obligations ride
//! tool calls, acks come back on results, governed tools obey what the node applied.

use std::sync::Arc;

use abhyasa_mcp::{
    acks_from_meta, obligations_to_meta, AgentServer, Governance, META_OBLIGATIONS,
    TOOL_CUSTODY_STATUS, TOOL_DELIVER,
};
use abhyasa_moq::Ca;
use abhyasa_node::Node;
use abhyasa_wire::{
    AckStatus, ConsentDecision, ConsentPayload, Obligation, ObligationId, Payload, Scope, TokenId,
};
use rmcp::model::{CallToolRequestParams, CallToolResult, RequestMetaObject};
use rmcp::service::{RunningService, ServiceError};
use rmcp::RoleClient;
use serde_json::{json, Value};

mod common;
use common::{connect, consent, host_tool, id, obligation, revoke_token};

fn token_revoke(n: u128, token: &str) -> Obligation {
    revoke_token(n, token, 60_000)
}

struct Fixture {
    _dir: tempfile::TempDir,
    node: Node,
    client: RunningService<RoleClient, ()>,
    calendar_runs: Arc<std::sync::atomic::AtomicU32>,
}

async fn fixture() -> Fixture {
    let dir = tempfile::tempdir().unwrap();
    let ca = Ca::generate("t").unwrap();
    let node = Node::builder(ca.issue(&id("agent-1")).unwrap())
        .state_dir(dir.path().join("agent"))
        .build()
        .await
        .unwrap();
    let calendar_runs = Arc::new(std::sync::atomic::AtomicU32::new(0));
    let server = AgentServer::new(node.clone(), id("principal"))
        .tool(host_tool(
            "calendar_read",
            Governance {
                scopes: vec![Scope::new("calendar.read").unwrap()],
                token: None,
                budget: None,
            },
            calendar_runs.clone(),
        ))
        .tool(host_tool(
            "mail_send",
            Governance {
                scopes: vec![],
                token: Some(TokenId::new("tok-mail").unwrap()),
                budget: None,
            },
            Arc::new(Default::default()),
        ));
    let (client, _server) = connect(server).await;
    Fixture {
        _dir: dir,
        node,
        client,
        calendar_runs,
    }
}

fn call(name: &'static str, obligations: &[Obligation], args: Value) -> CallToolRequestParams {
    let mut p = CallToolRequestParams::new(name);
    if !obligations.is_empty() {
        let mut meta = RequestMetaObject::new();
        meta.0
            .insert(META_OBLIGATIONS.into(), obligations_to_meta(obligations));
        p.meta = Some(meta);
    }
    if let Value::Object(m) = args {
        p.arguments = Some(m);
    }
    p
}

fn acks(r: &CallToolResult) -> Vec<abhyasa_wire::CustodyAck> {
    r.meta
        .as_ref()
        .map(|m| acks_from_meta(&m.0).unwrap())
        .unwrap_or_default()
}

fn text(r: &CallToolResult) -> String {
    r.content
        .iter()
        .filter_map(|c| c.as_text().map(|t| t.text.clone()))
        .collect::<Vec<_>>()
        .join(" ")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn obligations_ride_calls_and_a_revocation_governs_that_very_call() {
    let f = fixture().await;
    let names: Vec<String> = f
        .client
        .list_all_tools()
        .await
        .unwrap()
        .into_iter()
        .map(|t| t.name.to_string())
        .collect();
    for n in [
        TOOL_DELIVER,
        TOOL_CUSTODY_STATUS,
        "calendar_read",
        "mail_send",
    ] {
        assert!(names.iter().any(|x| x == n), "{n} missing from {names:?}");
    }

    // The tool runs while consent stands.
    let r = f
        .client
        .call_tool(call("calendar_read", &[], json!({})))
        .await
        .unwrap();
    assert_eq!(r.is_error, Some(false), "{}", text(&r));
    assert_eq!(f.calendar_runs.load(std::sync::atomic::Ordering::SeqCst), 1);

    // Two obligations on abhyasa_deliver: two acks, applied.
    let (mail, other) = (
        token_revoke(1, "tok-mail"),
        consent(2, ConsentDecision::Revoke, "files.write", 60_000),
    );
    let r = f
        .client
        .call_tool(call(
            TOOL_DELIVER,
            &[mail.clone(), other.clone()],
            json!({}),
        ))
        .await
        .unwrap();
    let got = acks(&r);
    assert_eq!(got.len(), 2, "{got:?}");
    assert_eq!(got[0].obligation_id, mail.id);
    assert_eq!(got[1].obligation_id, other.id);
    assert!(got.iter().all(|a| a.status == AckStatus::Applied));

    // A revocation riding the calendar call itself: that very call is refused, naming it,
    // and the ack comes back on the refusal.
    let revoke = consent(3, ConsentDecision::Revoke, "calendar.read", 60_000);
    let r = f
        .client
        .call_tool(call(
            "calendar_read",
            std::slice::from_ref(&revoke),
            json!({}),
        ))
        .await
        .unwrap();
    assert_eq!(r.is_error, Some(true));
    let why = text(&r);
    assert!(
        why.contains("calendar.read") && why.contains(&revoke.id.to_string()),
        "{why}"
    );
    assert_eq!(
        acks(&r).iter().map(|a| a.obligation_id).collect::<Vec<_>>(),
        vec![revoke.id]
    );
    assert_eq!(
        f.calendar_runs.load(std::sync::atomic::Ordering::SeqCst),
        1,
        "the tool did not run"
    );

    // The revoked token governs the mail tool.
    let r = f
        .client
        .call_tool(call("mail_send", &[], json!({})))
        .await
        .unwrap();
    assert_eq!(r.is_error, Some(true));
    assert!(
        text(&r).contains("tok-mail") && text(&r).contains(&mail.id.to_string()),
        "{}",
        text(&r)
    );

    // A grant restores the scope (a later obligation on the same key).
    let grant = consent(4, ConsentDecision::Grant, "calendar.read", 60_000);
    let r = f
        .client
        .call_tool(call(
            "calendar_read",
            std::slice::from_ref(&grant),
            json!({}),
        ))
        .await
        .unwrap();
    assert_eq!(r.is_error, Some(false), "{}", text(&r));
    assert_eq!(f.calendar_runs.load(std::sync::atomic::Ordering::SeqCst), 2);

    // Re-sent under a new JSON-RPC id: acked again, not applied twice (the grant stays).
    let r = f
        .client
        .call_tool(call(TOOL_DELIVER, std::slice::from_ref(&revoke), json!({})))
        .await
        .unwrap();
    assert_eq!(acks(&r)[0].status, AckStatus::Applied);
    let honours = f.node.honours().await.unwrap();
    assert!(
        !honours.is_withheld(&id("principal"), &Scope::new("calendar.read").unwrap()),
        "a duplicate revoke must not be applied again over the later grant"
    );

    // Status by id: applied ones get an ack.
    let unknown = ObligationId::from_u128(99);
    let r = f
        .client
        .call_tool(call(
            TOOL_CUSTODY_STATUS,
            &[],
            json!({"ids": [revoke.id.to_string(), unknown.to_string()]}),
        ))
        .await
        .unwrap();
    let s = r.structured_content.clone().unwrap();
    assert_eq!(s[revoke.id.to_string()], "applied");
    assert_eq!(s[unknown.to_string()], "unknown");
    assert_eq!(
        acks(&r).iter().map(|a| a.obligation_id).collect::<Vec<_>>(),
        vec![revoke.id]
    );

    // No arguments (reproduced: `{}` was a -32602 protocol error): everything applied
    // recently for this principal, each with an ack.
    let r = f
        .client
        .call_tool(call(TOOL_CUSTODY_STATUS, &[], json!({})))
        .await
        .unwrap();
    assert_ne!(r.is_error, Some(true), "{}", text(&r));
    let s = r.structured_content.clone().unwrap();
    assert_eq!(s[revoke.id.to_string()]["status"], "applied");
    assert_eq!(s[revoke.id.to_string()]["kind"], "anumati.consent");
    assert!(acks(&r).iter().any(|a| a.obligation_id == revoke.id));
    // Bad arguments: a tool result with isError, naming what to fix — not a protocol error.
    for (args, says) in [
        (json!({"ids": "nope"}), "must be an array"),
        (json!({"ids": ["xyz"]}), "32 lowercase hex digits"),
        // An id in upper case is another spelling, not the same id: refused, not folded.
        (
            json!({"ids": ["ABCDEF0123456789ABCDEF0123456789"]}),
            "32 lowercase hex digits",
        ),
        (json!({"id": []}), "unknown argument"),
    ] {
        let r = f
            .client
            .call_tool(call(TOOL_CUSTODY_STATUS, &[], args.clone()))
            .await
            .unwrap_or_else(|e| panic!("{args}: a protocol error: {e}"));
        assert_eq!(r.is_error, Some(true), "{args}");
        assert!(text(&r).contains(says), "{args}: {}", text(&r));
    }
    f.client.cancel().await.unwrap();
    f.node.shutdown().await;
}

/// A grant with a lease lets a governed tool run only until the lease ends; a token cached
/// with its own expiry governs its tool only until then. No sweep runs first: the gate reads
/// the clock.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_gate_ends_a_lease_and_an_expired_token_when_they_end() {
    let f = fixture().await;
    let end = abhyasa_wire::UnixMillis(f.node.now().0 + 1_500);
    let mut grant = consent(1, ConsentDecision::Grant, "calendar.read", 60_000);
    if let Payload::AnumatiConsent(c) = &mut grant.payload {
        c.expires_at = Some(end);
    }
    let mut issue = revoke_token(2, "tok-mail", 60_000);
    if let Payload::OauthToken(t) = &mut issue.payload {
        t.action = abhyasa_wire::TokenAction::Issue;
        t.expires_at = Some(end);
    }
    let r = f
        .client
        .call_tool(call("calendar_read", &[grant.clone(), issue], json!({})))
        .await
        .unwrap();
    assert_eq!(r.is_error, Some(false), "{}", text(&r));
    let r = f
        .client
        .call_tool(call("mail_send", &[], json!({})))
        .await
        .unwrap();
    assert_eq!(r.is_error, Some(false), "{}", text(&r));
    tokio::time::sleep(std::time::Duration::from_millis(
        end.0 - f.node.now().0 + 50,
    ))
    .await;
    let r = f
        .client
        .call_tool(call("calendar_read", &[], json!({})))
        .await
        .unwrap();
    assert_eq!(r.is_error, Some(true), "the lease ended");
    let why = text(&r);
    assert!(
        why.contains("lease")
            && why.contains("calendar.read")
            && why.contains(&grant.id.to_string()),
        "{why}"
    );
    let r = f
        .client
        .call_tool(call("mail_send", &[], json!({})))
        .await
        .unwrap();
    assert_eq!(r.is_error, Some(true), "the token expired");
    assert!(
        text(&r).contains("tok-mail") && text(&r).contains("expired"),
        "{}",
        text(&r)
    );
    assert_eq!(f.calendar_runs.load(std::sync::atomic::Ordering::SeqCst), 1);
    f.client.cancel().await.unwrap();
    f.node.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_malformed_envelope_is_invalid_params_and_nothing_is_applied() {
    let f = fixture().await;
    let good = consent(1, ConsentDecision::Revoke, "calendar.read", 60_000);
    let mut p = call("calendar_read", std::slice::from_ref(&good), json!({}));
    // A second entry that is not base64: the whole envelope is refused.
    p.meta
        .as_mut()
        .unwrap()
        .0
        .get_mut(META_OBLIGATIONS)
        .unwrap()
        .as_array_mut()
        .unwrap()
        .push(json!("not base64!"));
    let e = f.client.call_tool(p).await.unwrap_err();
    match e {
        ServiceError::McpError(e) => {
            assert_eq!(e.code.0, -32602);
            assert!(e.message.contains(META_OBLIGATIONS), "{}", e.message);
        }
        other => panic!("expected a JSON-RPC error, got {other:?}"),
    }
    assert_eq!(f.node.honours().await.unwrap().withheld().count(), 0);
    assert_eq!(f.node.applied(vec![good.id]).await.unwrap(), vec![false]);
    assert_eq!(f.calendar_runs.load(std::sync::atomic::Ordering::SeqCst), 0);

    // In another principal's name: dropped as forged, no ack, nothing applied; the tool runs.
    let forged = obligation(
        5,
        "mallory",
        60_000,
        Payload::AnumatiConsent(ConsentPayload {
            decision: Some(ConsentDecision::Revoke),
            scope: Scope::new("calendar.read").unwrap(),
            expires_at: None,
        }),
    );
    let r = f
        .client
        .call_tool(call("calendar_read", &[forged], json!({})))
        .await
        .unwrap();
    assert_eq!(r.is_error, Some(false));
    assert!(acks(&r).is_empty());
    assert_eq!(f.node.honours().await.unwrap().withheld().count(), 0);
    f.client.cancel().await.unwrap();
    f.node.shutdown().await;
}

fn resource_json(r: &rmcp::model::ReadResourceResult) -> Value {
    match &r.contents[0] {
        rmcp::model::ResourceContents::TextResourceContents { text, .. } => {
            serde_json::from_str(text).unwrap()
        }
        other => panic!("{other:?}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn routing_weights_and_what_the_agent_honours_are_readable_as_resources() {
    let f = fixture().await;
    let uris: Vec<String> = f
        .client
        .list_all_resources()
        .await
        .unwrap()
        .into_iter()
        .map(|r| r.uri.clone())
        .collect();
    assert_eq!(
        uris,
        [abhyasa_mcp::RESOURCE_WEIGHTS, abhyasa_mcp::RESOURCE_HONOURS]
    );
    let read = |uri: &'static str| {
        let client = &f.client;
        async move {
            client
                .read_resource(rmcp::model::ReadResourceRequestParams::new(uri))
                .await
                .unwrap()
        }
    };
    // Nothing applied yet.
    let w = resource_json(&read(abhyasa_mcp::RESOURCE_WEIGHTS).await);
    assert_eq!(w, json!({"principal": "principal", "weights": {}}));
    // A corrective update, a consent revocation and a token revocation ride a call.
    let down = obligation(
        40,
        "principal",
        60_000,
        Payload::PhalaBeliefUpdate(abhyasa_wire::BeliefUpdatePayload {
            weight_key: abhyasa_wire::WeightKey::new("supplier/acme").unwrap(),
            weight_delta: abhyasa_wire::WeightDelta(-250_000),
            ttl_ms: 60_000,
        }),
    );
    let revoke = consent(41, ConsentDecision::Revoke, "calendar.read", 60_000);
    let r = f
        .client
        .call_tool(call(
            TOOL_DELIVER,
            &[down, revoke, token_revoke(42, "tok-mail")],
            json!({}),
        ))
        .await
        .unwrap();
    assert_eq!(acks(&r).len(), 3);
    let w = resource_json(&read(abhyasa_mcp::RESOURCE_WEIGHTS).await);
    assert_eq!(
        w,
        json!({"principal": "principal", "weights": {"supplier/acme": -0.25}})
    );
    let h = resource_json(&read(abhyasa_mcp::RESOURCE_HONOURS).await);
    assert_eq!(h["withheld_scopes"], json!(["calendar.read"]));
    assert_eq!(h["dropped_tokens"], json!(["tok-mail"]));
    assert_eq!(h["weights"]["supplier/acme"], json!(-0.25));
    // An unknown resource is an error, not an empty answer.
    let err = f
        .client
        .read_resource(rmcp::model::ReadResourceRequestParams::new(
            "abhyasa://nope",
        ))
        .await;
    assert!(err.is_err());
    drop(f.node);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn plain_http_is_served_on_loopback_only() {
    let f = fixture().await;
    let err = abhyasa_mcp::http::serve_http(
        f.node.clone(),
        id("principal"),
        vec![],
        "0.0.0.0:0".parse().unwrap(),
        None,
    )
    .await
    .err()
    .expect("refused");
    assert!(
        matches!(err, abhyasa_mcp::http::HttpError::NotLoopback(_)),
        "{err}"
    );
    let server = abhyasa_mcp::http::serve_http(
        f.node.clone(),
        id("principal"),
        vec![],
        "127.0.0.1:0".parse().unwrap(),
        None,
    )
    .await
    .unwrap();
    assert!(server.local_addr().ip().is_loopback());
}

/// One raw HTTP/1.1 POST of an MCP `initialize` with `headers`; the status code.
async fn post_initialize(addr: std::net::SocketAddr, headers: &[(&str, &str)]) -> u16 {
    use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
    let body = r#"{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-06-18","capabilities":{},"clientInfo":{"name":"raw","version":"0"}}}"#;
    let mut req = format!(
        "POST /mcp HTTP/1.1\r\nHost: {addr}\r\nContent-Type: application/json\r\n\
         Accept: application/json, text/event-stream\r\nContent-Length: {}\r\nConnection: close\r\n",
        body.len()
    );
    for (k, v) in headers {
        req.push_str(&format!("{k}: {v}\r\n"));
    }
    req.push_str("\r\n");
    req.push_str(body);
    let mut s = tokio::net::TcpStream::connect(addr).await.unwrap();
    s.write_all(req.as_bytes()).await.unwrap();
    let mut head = [0u8; 12];
    s.read_exact(&mut head).await.unwrap();
    std::str::from_utf8(&head[9..12]).unwrap().parse().unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn plain_http_needs_the_bearer_token_and_refuses_browsers() {
    let f = fixture().await;
    let token = "5ec2e7".repeat(8);
    let server = abhyasa_mcp::http::serve_http(
        f.node.clone(),
        id("principal"),
        vec![],
        "127.0.0.1:0".parse().unwrap(),
        Some(token.clone()),
    )
    .await
    .unwrap();
    let addr = server.local_addr();
    let bearer = format!("Bearer {token}");
    let mut wrong = token.clone().into_bytes();
    wrong[47] ^= 1;
    let wrong = format!("Bearer {}", String::from_utf8(wrong).unwrap());
    assert_eq!(post_initialize(addr, &[]).await, 401, "no token");
    assert_eq!(
        post_initialize(addr, &[("Authorization", &wrong)]).await,
        401
    );
    assert_eq!(
        post_initialize(addr, &[("Authorization", &token)]).await,
        401,
        "the token without the Bearer scheme"
    );
    assert_eq!(
        post_initialize(addr, &[("Authorization", &bearer)]).await,
        200
    );
    // A browser page (it sends Origin) is refused even with the token.
    let refused = post_initialize(
        addr,
        &[
            ("Authorization", &bearer),
            ("Origin", "http://attacker.example"),
        ],
    )
    .await;
    assert_eq!(refused, 403, "a request with an Origin header");
}
