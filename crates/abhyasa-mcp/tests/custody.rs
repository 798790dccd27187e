//! Custody over MCP between two nodes: the principal's custodian reaches the agent through
//! an MCP session (`PrincipalClient`), the agent's node serves it (`AgentServer`). Outcomes
//! are read from both nodes' durable state afterwards.

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;
use std::time::Duration;

use abhyasa_mcp::{AgentServer, PrincipalClient};
use abhyasa_moq::Ca;
use abhyasa_node::Node;
use abhyasa_wire::{
    ConsentDecision, EscalationCause, Obligation, ObligationId, Outcome, Payload, Scope,
};
use rmcp::model::CallToolRequestParams;
use rmcp::ServerHandler;

mod common;
use common::{calendar, connect, consent, custodian, id, revoke_token};

struct Pair {
    _dir: tempfile::TempDir,
    principal: Node,
    agent: Node,
}

async fn pair() -> Pair {
    let dir = tempfile::tempdir().unwrap();
    let ca = Ca::generate("t").unwrap();
    let agent = Node::builder(ca.issue(&id("agent-1")).unwrap())
        .state_dir(dir.path().join("a"))
        .build()
        .await
        .unwrap();
    let principal = Node::builder(ca.issue(&id("principal")).unwrap())
        .state_dir(dir.path().join("p"))
        .custodian(custodian())
        .build()
        .await
        .unwrap();
    Pair {
        _dir: dir,
        principal,
        agent,
    }
}

impl Pair {
    /// The principal's custody reaching `agent-1` through the MCP session `client`, an
    /// obligation waiting at most `linger_ms` for a host's call to ride.
    async fn attach(
        &self,
        client: &rmcp::service::RunningService<rmcp::RoleClient, ()>,
        linger_ms: u64,
    ) -> PrincipalClient {
        PrincipalClient::attach(
            self.principal.clone(),
            id("agent-1"),
            client.peer().clone(),
            Duration::from_millis(linger_ms),
        )
        .await
        .unwrap()
    }
}

async fn outcome(node: &Node, o: Obligation, limit: Duration) -> Outcome {
    let h = node.issue(o).await.unwrap();
    tokio::time::timeout(limit, h.outcome())
        .await
        .expect("custody ends by the deadline")
        .expect("an outcome")
        .0
        .outcome
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn obligations_reach_the_agent_over_mcp_and_ride_the_hosts_calls() {
    let p = pair().await;
    let runs = Arc::new(AtomicU32::new(0));
    let server = AgentServer::new(p.agent.clone(), id("principal")).tool(calendar(runs.clone()));
    let (client, _server) = connect(server).await;
    // A long linger: an obligation waits for the host's next call.
    let mcp = p.attach(&client, 2_000).await;

    let r = mcp
        .call_tool(CallToolRequestParams::new("calendar_read"))
        .await
        .unwrap();
    assert_eq!(r.is_error, Some(false));
    // The revocation is issued; the host's next call carries it and is refused by it.
    let revoke = consent(1, ConsentDecision::Revoke, "calendar.read", 20_000);
    let h = p.principal.issue(revoke.clone()).await.unwrap();
    // Released before the call starts (issue has returned): it rides this call.
    let r = mcp
        .call_tool(CallToolRequestParams::new("calendar_read"))
        .await
        .unwrap();
    assert_eq!(
        r.is_error,
        Some(true),
        "the revocation riding the call refuses it"
    );
    assert_eq!(runs.load(Ordering::SeqCst), 1);
    let (record, _) = tokio::time::timeout(Duration::from_secs(5), h.outcome())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(record.outcome, Outcome::Applied);
    assert!(p
        .agent
        .honours()
        .await
        .unwrap()
        .is_withheld(&id("principal"), &Scope::new("calendar.read").unwrap()));
    p.principal.shutdown().await;
    p.agent.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_no_call_due_abhyasa_deliver_carries_them_and_each_is_applied_once() {
    let p = pair().await;
    let server = AgentServer::new(p.agent.clone(), id("principal"));
    let (client, _server) = connect(server).await;
    let _mcp = p.attach(&client, 10).await;
    let sent: Vec<Obligation> = (10..30)
        .map(|n| revoke_token(n, &format!("tok-{n}"), 20_000))
        .collect();
    let mut handles = Vec::new();
    for o in &sent {
        handles.push(p.principal.issue(o.clone()).await.unwrap());
    }
    for h in handles {
        let (record, _) = tokio::time::timeout(Duration::from_secs(10), h.outcome())
            .await
            .unwrap()
            .unwrap();
        assert_eq!(record.outcome, Outcome::Applied);
    }
    let ids: Vec<ObligationId> = sent.iter().map(|o| o.id).collect();
    assert!(p.agent.applied(ids).await.unwrap().iter().all(|a| *a));
    let honours = p.agent.honours().await.unwrap();
    for o in &sent {
        let Payload::OauthToken(t) = &o.payload else {
            unreachable!()
        };
        assert!(honours.is_dropped(&t.token_id));
    }
    p.principal.shutdown().await;
    p.agent.shutdown().await;
}

/// An MCP server that knows nothing of Abhyasa.
#[derive(Clone)]
struct Plain;

impl ServerHandler for Plain {}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_that_ignores_the_envelope_never_acks_and_custody_escalates() {
    let p = pair().await;
    let (client, _server) = connect(Plain).await;
    let _mcp = p.attach(&client, 10).await;
    let h = p
        .principal
        .issue(consent(40, ConsentDecision::Revoke, "calendar.read", 1_500))
        .await
        .unwrap();
    let (record, escalation) = tokio::time::timeout(Duration::from_secs(5), h.outcome())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(
        record.outcome,
        Outcome::Escalated(EscalationCause::Deadline)
    );
    assert!(
        record.attempts > 1,
        "retried, not dropped: {}",
        record.attempts
    );
    let safe = escalation.expect("an escalation").safe_action;
    assert!(
        matches!(safe, abhyasa_wire::SafeAction::WithholdScope { .. }),
        "{safe:?}"
    );
    p.principal.shutdown().await;
    p.agent.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_lost_mid_run_is_a_partition_custody_survives() {
    let p = pair().await;
    let (client, server) = connect(AgentServer::new(p.agent.clone(), id("principal"))).await;
    let mcp = p.attach(&client, 10).await;
    assert_eq!(
        outcome(
            &p.principal,
            revoke_token(50, "tok-50", 20_000),
            Duration::from_secs(5)
        )
        .await,
        Outcome::Applied
    );
    // The server goes away: calls fail, custody keeps retrying.
    server.abort();
    drop(client);
    let pending: Vec<Obligation> = (51..56)
        .map(|n| revoke_token(n, &format!("tok-{n}"), 20_000))
        .collect();
    let mut handles = Vec::new();
    for o in &pending {
        handles.push(p.principal.issue(o.clone()).await.unwrap());
    }
    tokio::time::sleep(Duration::from_millis(500)).await;
    drop(mcp);
    // A new session: attaching re-offers what is pending.
    let (client, _server) = connect(AgentServer::new(p.agent.clone(), id("principal"))).await;
    let _mcp = p.attach(&client, 10).await;
    for h in handles {
        let (record, _) = tokio::time::timeout(Duration::from_secs(10), h.outcome())
            .await
            .unwrap()
            .unwrap();
        assert_eq!(record.outcome, Outcome::Applied);
    }
    // Applied once each: every token dropped, and the receiver holds each id once.
    let ids: Vec<ObligationId> = pending.iter().map(|o| o.id).collect();
    assert!(p.agent.applied(ids).await.unwrap().iter().all(|a| *a));
    p.principal.shutdown().await;
    p.agent.shutdown().await;
}
