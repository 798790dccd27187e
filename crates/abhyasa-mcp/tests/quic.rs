//! MCP over the nodes' QUIC endpoints (MCP-over-MOQT layout): the principal's custodian
//! reaches the agent through an MCP session on the same certificates and port as custody,
//! under loss and across a restart of the agent. Outcomes are checked from both nodes.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use abhyasa_custody::CustodianConfig;
use abhyasa_mcp::{connect_quic, serve_quic, Governance, HostTool, PrincipalLink};
use abhyasa_moq::Ca;
use abhyasa_node::Node;
use abhyasa_wire::{
    AgentId, ClientId, ConsentDecision, ConsentPayload, Obligation, ObligationId, Outcome, Payload,
    Scope, TokenAction, TokenId, TokenPayload, UnixMillis,
};
use rmcp::model::{CallToolRequestParams, CallToolResult, ContentBlock, Tool};

fn id(s: &str) -> AgentId {
    AgentId::new(s).unwrap()
}

fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_millis() as u64
}

fn custodian() -> CustodianConfig {
    CustodianConfig {
        response_timeout_ms: 200,
        backoff_base_ms: 50,
        backoff_cap_ms: 400,
        ..CustodianConfig::default()
    }
}

fn token(n: u128, deadline_ms: u64) -> Obligation {
    let t = now_ms();
    Obligation {
        id: ObligationId::from_u128(n),
        issuer: id("principal"),
        target: id("agent-1"),
        created_at: UnixMillis(t),
        deadline: UnixMillis(t + deadline_ms),
        max_retries: 60,
        sequence: None,
        payload: Payload::OauthToken(TokenPayload {
            action: TokenAction::Revoke,
            token_id: TokenId::new(format!("tok-{n}")).unwrap(),
            client_id: ClientId::new("c").unwrap(),
        }),
    }
}

fn calendar(runs: Arc<AtomicU32>) -> HostTool {
    let schema = serde_json::json!({"type": "object"})
        .as_object()
        .cloned()
        .unwrap();
    HostTool {
        tool: Tool::new("calendar_read", "reads the calendar", Arc::new(schema)),
        governance: Governance {
            scopes: vec![Scope::new("calendar.read").unwrap()],
            token: None,
        },
        run: Arc::new(move |_| {
            let runs = runs.clone();
            Box::pin(async move {
                runs.fetch_add(1, Ordering::SeqCst);
                CallToolResult::success(vec![ContentBlock::text("3 events")])
            })
        }),
    }
}

async fn agent_at(ca: &Ca, dir: &std::path::Path, addr: SocketAddr, link: Option<&str>) -> Node {
    let mut b = Node::builder(ca.issue(&id("agent-1")).unwrap())
        .listen(addr)
        .state_dir(dir.join("agent"));
    if let Some(l) = link {
        b = b.impair(l.parse().unwrap(), 2);
    }
    b.build().await.unwrap()
}

async fn principal(ca: &Ca, dir: &std::path::Path, link: Option<&str>) -> Node {
    let mut b = Node::builder(ca.issue(&id("principal")).unwrap())
        .state_dir(dir.join("principal"))
        .custodian(custodian());
    if let Some(l) = link {
        b = b.impair(l.parse().unwrap(), 1);
    }
    b.build().await.unwrap()
}

fn free_addr() -> SocketAddr {
    std::net::UdpSocket::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_governed_tool_over_quic_is_refused_by_the_revocation_that_rides_the_call() {
    let dir = tempfile::tempdir().unwrap();
    let ca = Ca::generate("t").unwrap();
    let agent = agent_at(&ca, dir.path(), free_addr(), None).await;
    let runs = Arc::new(AtomicU32::new(0));
    tokio::spawn(serve_quic(agent.clone(), vec![calendar(runs.clone())]));
    let p = principal(&ca, dir.path(), None).await;
    let (client, _service) = connect_quic(
        &p,
        &id("agent-1"),
        agent.local_addr(),
        Duration::from_secs(5),
    )
    .await
    .unwrap();
    let r = client
        .call_tool(CallToolRequestParams::new("calendar_read"))
        .await
        .unwrap();
    assert_eq!(r.is_error, Some(false));
    let mut revoke = token(1, 20_000);
    revoke.payload = Payload::AnumatiConsent(ConsentPayload {
        decision: Some(ConsentDecision::Revoke),
        scope: Scope::new("calendar.read").unwrap(),
    });
    let h = p.issue(revoke.clone()).await.unwrap();
    // Released before the call starts (issue has returned): it rides this call.
    let r = client
        .call_tool(CallToolRequestParams::new("calendar_read"))
        .await
        .unwrap();
    assert_eq!(
        r.is_error,
        Some(true),
        "the revocation riding the call refuses it"
    );
    let text: String = r
        .content
        .iter()
        .filter_map(|c| c.as_text().map(|t| t.text.clone()))
        .collect();
    assert!(text.contains(&revoke.id.to_string()), "{text}");
    assert_eq!(runs.load(Ordering::SeqCst), 1);
    let (record, _) = tokio::time::timeout(Duration::from_secs(5), h.outcome())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(record.outcome, Outcome::Applied);
    p.shutdown().await;
    agent.shutdown().await;
}

/// Every obligation ends applied exactly once or escalated, read from both nodes: the
/// principal's terminal records and the agent's applied ids and dropped tokens.
async fn ends_once(p: &Node, agent: &Node, sent: &[Obligation]) -> (u32, u32) {
    let status = p.status().await.unwrap();
    let (mut applied, mut escalated) = (0, 0);
    let honours = agent.honours().await.unwrap();
    let ids: Vec<ObligationId> = sent.iter().map(|o| o.id).collect();
    let on_agent = agent.applied(ids).await.unwrap();
    for (o, on_agent) in sent.iter().zip(on_agent) {
        let r = status
            .recent
            .iter()
            .find(|r| r.obligation_id == o.id)
            .unwrap_or_else(|| panic!("{} has no terminal record", o.id));
        let Payload::OauthToken(t) = &o.payload else {
            unreachable!()
        };
        match r.outcome {
            Outcome::Applied => {
                applied += 1;
                assert!(on_agent && honours.is_dropped(&t.token_id), "{}", o.id);
            }
            Outcome::Escalated(_) => escalated += 1,
            other => panic!("{}: {other:?}", o.id),
        }
    }
    // Applied once: the agent's apply log holds each id at most once.
    let log = agent.status().await.unwrap().applied;
    for o in sent {
        let n = log.iter().filter(|a| a.obligation.id == o.id).count();
        assert!(n <= 1, "{} applied {n} times", o.id);
    }
    (applied, escalated)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn custody_over_mcp_over_quic_survives_loss_and_an_agent_restart() {
    let dir = tempfile::tempdir().unwrap();
    let ca = Ca::generate("t").unwrap();
    let addr = free_addr();
    let link = "loss 10% delay 5ms 2ms";
    let mut agent = agent_at(&ca, dir.path(), addr, Some(link)).await;
    let mut serving = tokio::spawn(serve_quic(agent.clone(), vec![]));
    let p = principal(&ca, dir.path(), Some(link)).await;
    let _link = PrincipalLink::spawn(p.clone(), id("agent-1"), addr, Duration::from_millis(10));

    let sent: Vec<Obligation> = (100..130).map(|n| token(n, 30_000)).collect();
    let mut handles = Vec::new();
    for (i, o) in sent.iter().enumerate() {
        handles.push(p.issue(o.clone()).await.unwrap());
        tokio::time::sleep(Duration::from_millis(20)).await;
        if i == 12 {
            // The agent goes away mid-run and comes back on the same address and state.
            serving.abort();
            agent.shutdown().await;
            tokio::time::sleep(Duration::from_millis(300)).await;
            agent = agent_at(&ca, dir.path(), addr, Some(link)).await;
            serving = tokio::spawn(serve_quic(agent.clone(), vec![]));
        }
    }
    for h in handles {
        let (record, _) = tokio::time::timeout(Duration::from_secs(40), h.outcome())
            .await
            .expect("custody ends by the deadline")
            .unwrap();
        assert!(
            matches!(record.outcome, Outcome::Applied | Outcome::Escalated(_)),
            "{:?}",
            record.outcome
        );
    }
    let (applied, escalated) = ends_once(&p, &agent, &sent).await;
    println!(
        "mcp-over-quic: applied={applied} escalated={escalated} of {}",
        sent.len()
    );
    // With a 30 s deadline and a link back within a second, everything is applied.
    assert_eq!(applied, sent.len() as u32);
    serving.abort();
    p.shutdown().await;
    agent.shutdown().await;
}
