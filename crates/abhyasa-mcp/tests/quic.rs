//! MCP over the nodes' QUIC endpoints (MCP-over-MOQT layout): the principal's custodian
//! reaches the agent through an MCP session on the same certificates and port as custody,
//! under loss and across a restart of the agent. Outcomes are checked from both nodes.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;
use std::time::Duration;

use abhyasa_mcp::{connect_quic, serve_quic, PrincipalLink};
use abhyasa_moq::Ca;
use abhyasa_node::Node;
use abhyasa_wire::{ConsentDecision, Obligation, ObligationId, Outcome, Payload};
use rmcp::model::CallToolRequestParams;

mod common;
use common::{calendar, consent, custodian, free_addr, id, revoke_token};

fn token(n: u128, deadline_ms: u64) -> Obligation {
    revoke_token(n, &format!("tok-{n}"), deadline_ms)
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
    let revoke = consent(1, ConsentDecision::Revoke, "calendar.read", 20_000);
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

/// Which members may call host tools over MCP-over-QUIC is the operator's choice (it was
/// every member): a member outside `callers` still gets a session and delivers its own
/// obligations, but sees and runs no host tool; a member inside it runs them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn host_tools_over_quic_are_served_only_to_the_callers_named() {
    let dir = tempfile::tempdir().unwrap();
    let ca = Ca::generate("t").unwrap();
    let agent = agent_at(&ca, dir.path(), free_addr(), None).await;
    let runs = Arc::new(AtomicU32::new(0));
    let callers = [id("principal")].into_iter().collect();
    tokio::spawn(abhyasa_mcp::serve_quic_for(
        agent.clone(),
        vec![calendar(runs.clone())],
        Some(callers),
    ));
    let names = |tools: Vec<rmcp::model::Tool>| -> Vec<String> {
        tools.into_iter().map(|t| t.name.to_string()).collect()
    };
    // A member not named: custody tools only, the host tool neither listed nor run.
    let mallory = Node::builder(ca.issue(&id("mallory")).unwrap())
        .state_dir(dir.path().join("mallory"))
        .custodian(custodian())
        .build()
        .await
        .unwrap();
    let (client, service) = connect_quic(
        &mallory,
        &id("agent-1"),
        agent.local_addr(),
        Duration::from_secs(5),
    )
    .await
    .unwrap();
    let listed = names(service.peer().list_all_tools().await.unwrap());
    assert!(!listed.contains(&"calendar_read".to_string()), "{listed:?}");
    assert!(
        listed.contains(&"abhyasa_deliver".to_string()),
        "{listed:?}"
    );
    assert!(client
        .call_tool(CallToolRequestParams::new("calendar_read"))
        .await
        .is_err());
    assert_eq!(runs.load(Ordering::SeqCst), 0);
    // The member named runs it.
    let p = principal(&ca, dir.path(), None).await;
    let (client, service) = connect_quic(
        &p,
        &id("agent-1"),
        agent.local_addr(),
        Duration::from_secs(5),
    )
    .await
    .unwrap();
    assert!(names(service.peer().list_all_tools().await.unwrap())
        .contains(&"calendar_read".to_string()));
    let r = client
        .call_tool(CallToolRequestParams::new("calendar_read"))
        .await
        .unwrap();
    assert_eq!(r.is_error, Some(false));
    assert_eq!(runs.load(Ordering::SeqCst), 1);
    mallory.shutdown().await;
    p.shutdown().await;
    agent.shutdown().await;
}
