//! `abhyasa demo`: a principal and two agents as real nodes on loopback QUIC, in one process,
//! with fresh certificates and a temporary state directory.
//!
//! The principal issues a mix of every kind, both polarities, to `agent-0` and `agent-1`.
//! The link to `agent-0` is cut and restored, and `agent-0` is restarted mid-run; `agent-1`
//! never comes up, so its admissible obligations escalate at their (short) deadline. The
//! summary is computed from both nodes' durable state after they have shut down.

use std::collections::BTreeMap;
use std::path::Path;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use abhyasa_custody::{kinds, CustodianConfig};
use abhyasa_moq::Ca;
use abhyasa_node::{Node, NodeEvent};
use abhyasa_store::{Store, StoreConfig};
use abhyasa_wire::{
    AgentId, BeliefUpdatePayload, ClientId, ConsentDecision, ConsentPayload, Obligation,
    ObligationId, Outcome, Payload, Scope, TerminalRecord, TokenAction, TokenId, TokenPayload,
    UnixMillis, WeightDelta, WeightKey,
};

/// Demo settings.
#[derive(Clone, Debug)]
pub struct DemoConfig {
    /// Obligations to issue.
    pub count: u32,
    /// Deadline of each, ms after issue.
    pub deadline_ms: u64,
    /// Impairment of the principal ↔ agent-0 link (both directions), through the userspace
    /// netem relay.
    pub impairment: Option<abhyasa_netem::Impairment>,
}

impl Default for DemoConfig {
    fn default() -> Self {
        Self {
            count: 24,
            deadline_ms: 3_000,
            impairment: None,
        }
    }
}

/// What the demo counted from durable state.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Summary {
    /// Obligations issued.
    pub obligations: u64,
    /// Ended applied.
    pub applied: u64,
    /// Ended declined.
    pub declined: u64,
    /// Ended escalated.
    pub escalated: u64,
    /// Sent best-effort.
    pub best_effort: u64,
    /// Admissible obligations with no terminal record on the principal's disk.
    pub lost: u64,
    /// Obligations whose effect shows more than once on a receiver's disk.
    pub double_applied: u64,
}

impl std::fmt::Display for Summary {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "summary: obligations={} applied={} declined={} escalated={} best_effort={} lost={} double_applied={}",
            self.obligations, self.applied, self.declined, self.escalated, self.best_effort, self.lost, self.double_applied
        )
    }
}

fn now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap_or_default()
        .as_millis() as u64
}

fn id(s: &str) -> AgentId {
    AgentId::new(s).expect("valid agent id")
}

/// Obligation `i` of the demo: kinds and polarities rotate; every third goes to `agent-1`.
/// Belief updates use their own weight key and delta, so a double apply would show.
fn obligation(i: u32, deadline_ms: u64) -> Obligation {
    let admissible = i % 2 == 0;
    let payload = match (i / 2) % 3 {
        0 => Payload::AnumatiConsent(ConsentPayload {
            decision: Some(if admissible {
                ConsentDecision::Revoke
            } else {
                ConsentDecision::Grant
            }),
            scope: Scope::new(format!("calendar.{i}")).expect("valid"),
            expires_at: None,
        }),
        1 => Payload::PhalaBeliefUpdate(BeliefUpdatePayload {
            weight_key: WeightKey::new(format!("supplier/{i}")).expect("valid"),
            weight_delta: WeightDelta(delta(i) as i32 * if admissible { 1 } else { -1 }),
            ttl_ms: 60_000,
        }),
        _ => Payload::OauthToken(TokenPayload {
            action: if admissible {
                TokenAction::Revoke
            } else {
                TokenAction::Issue
            },
            token_id: TokenId::new(format!("tok-{i}")).expect("valid"),
            client_id: ClientId::new("mail-client").expect("valid"),
            expires_at: None,
        }),
    };
    let t = now();
    Obligation {
        id: ObligationId::from_u128((u128::from(t) << 32) | u128::from(i)),
        issuer: id("principal"),
        target: id(if i % 3 == 2 { "agent-1" } else { "agent-0" }),
        created_at: UnixMillis(t),
        deadline: UnixMillis(t + deadline_ms),
        max_retries: 20,
        sequence: None,
        payload,
    }
}

fn delta(i: u32) -> i64 {
    -1_000 * (i64::from(i) + 1)
}

/// Runs the demo, printing progress; returns the summary computed from durable state.
pub async fn run(config: DemoConfig) -> Result<Summary, Box<dyn std::error::Error>> {
    let dir = tempfile::tempdir()?;
    let ca = Ca::generate("abhyasa demo deployment")?;
    let (p, a0, a1) = (id("principal"), id("agent-0"), id("agent-1"));
    let (a0_addr, a1_addr) = (crate::free_addr()?, crate::free_addr()?);
    let custodian = CustodianConfig {
        response_timeout_ms: 150,
        backoff_base_ms: 50,
        backoff_cap_ms: 300,
        ..CustodianConfig::default()
    };
    let start_agent = |d: &Path| {
        Node::builder(ca.issue(&a0).expect("issue"))
            .listen(a0_addr)
            .state_dir(d.join("agent-0"))
            .build()
    };
    let mut agent0 = Some(start_agent(dir.path()).await?);
    // With an impairment, the principal reaches agent-0 through the netem relay.
    let relay = match &config.impairment {
        Some(spec) => Some(
            abhyasa_netem::relay::Relay::start(abhyasa_netem::relay::RelayConfig {
                listen: "127.0.0.1:0".parse()?,
                forward: a0_addr,
                up: spec.clone(),
                down: spec.clone(),
                seed: 1,
            })
            .await?,
        ),
        None => None,
    };
    let a0_dial = relay.as_ref().map_or(a0_addr, |r| r.local_addr());
    if let Some(spec) = &config.impairment {
        println!("link principal <-> agent-0 impaired both ways: {spec}");
    }
    let principal = Node::builder(ca.issue(&p)?)
        .peer(a0.clone(), a0_dial)
        .peer(a1.clone(), a1_addr) // agent-1 never comes up
        .state_dir(dir.path().join("principal"))
        .custodian(custodian)
        .build()
        .await?;
    println!("principal, agent-0 on {a0_addr}; agent-1 ({a1_addr}) stays offline; QUIC + MOQT draft-14, mutual TLS");
    let started = Instant::now();
    let mut events = principal.events();
    let mut issued: BTreeMap<ObligationId, Obligation> = BTreeMap::new();
    let mut done = 0u64;
    let mut records: Vec<TerminalRecord> = Vec::new();
    let drain = |events: &mut tokio::sync::broadcast::Receiver<NodeEvent>,
                 issued: &BTreeMap<ObligationId, Obligation>,
                 done: &mut u64,
                 finished: &mut Vec<TerminalRecord>| {
        while let Ok(e) = events.try_recv() {
            progress(&e, &started, issued);
            if let NodeEvent::Terminal { record, .. } = e {
                *done += 1;
                finished.push(record);
            }
        }
    };
    for i in 0..config.count {
        let o = obligation(i, config.deadline_ms);
        issued.insert(o.id, o.clone());
        principal.issue(o).await?;
        if i == 8 {
            println!(
                "  {:6.2}s  cutting the link to agent-0 for 800 ms",
                started.elapsed().as_secs_f64()
            );
            principal
                .block_peer(a0.clone(), Duration::from_millis(800))
                .await?;
        }
        if i == 16 {
            println!(
                "  {:6.2}s  restarting agent-0",
                started.elapsed().as_secs_f64()
            );
            if let Some(n) = agent0.take() {
                n.shutdown().await;
            }
            agent0 = Some(start_agent(dir.path()).await?);
        }
        drain(&mut events, &issued, &mut done, &mut records);
        tokio::time::sleep(Duration::from_millis(60)).await;
    }
    let limit = Instant::now() + Duration::from_millis(config.deadline_ms + 5_000);
    while done < issued.len() as u64 && Instant::now() < limit {
        if let Ok(Ok(e)) = tokio::time::timeout(Duration::from_millis(200), events.recv()).await {
            progress(&e, &started, &issued);
            if let NodeEvent::Terminal { record, .. } = e {
                done += 1;
                records.push(record);
            }
        }
    }
    if let Some(agent) = &agent0 {
        governed_tool_story(&principal, agent, config.deadline_ms, &started).await?;
        crate::demo_nginx::story(&principal, agent, config.deadline_ms, &started).await;
    }
    principal.shutdown().await;
    if let Some(n) = agent0 {
        n.shutdown().await;
    }
    if let Some(r) = relay {
        let s = r.stats();
        println!(
            "relay: up {} offered, {} lost, {} duplicated; down {} offered, {} lost, {} duplicated",
            s.up.offered,
            s.up.lost,
            s.up.duplicated,
            s.down.offered,
            s.down.lost,
            s.down.duplicated
        );
    }
    report(&records, &issued);
    summarize(dir.path(), &issued)
}

/// The story MCP hosts care about: agent-0 serves a tool over MCP that uses the consent
/// scope `calendar.read`; the principal calls it (it runs), revokes the consent under
/// custody, and calls it again (refused, naming the obligation).
async fn governed_tool_story(
    principal: &Node,
    agent: &Node,
    deadline_ms: u64,
    started: &Instant,
) -> Result<(), Box<dyn std::error::Error>> {
    use abhyasa_mcp::rmcp::model::{CallToolRequestParams, CallToolResult, ContentBlock, Tool};
    use abhyasa_mcp::rmcp::ServiceExt as _;
    use abhyasa_mcp::{AgentServer, Governance, HostTool};
    use std::sync::Arc;

    let scope = Scope::new("calendar.read")?;
    let schema = serde_json::json!({"type": "object"})
        .as_object()
        .cloned()
        .unwrap_or_default();
    let tool = HostTool {
        tool: Tool::new(
            "calendar_read",
            "Reads the principal's calendar",
            Arc::new(schema),
        ),
        governance: Governance {
            scopes: vec![scope.clone()],
            token: None,
            budget: None,
        },
        run: Arc::new(|_| {
            Box::pin(async {
                CallToolResult::success(vec![ContentBlock::text("3 events on Monday")])
            })
        }),
    };
    let server = AgentServer::new(agent.clone(), principal.agent().clone()).tool(tool);
    let (a, b) = tokio::io::duplex(1 << 16);
    let (ar, aw) = tokio::io::split(a);
    let (br, bw) = tokio::io::split(b);
    tokio::spawn(async move {
        if let Ok(running) = server.serve((ar, aw)).await {
            let _ = running.waiting().await;
        }
    });
    let client = ().serve((br, bw)).await?;
    let say = |what: &str| println!("  {:6.2}s  {what}", started.elapsed().as_secs_f64());
    let answer = |r: &CallToolResult| {
        let text: Vec<String> = r
            .content
            .iter()
            .filter_map(|c| c.as_text().map(|t| t.text.clone()))
            .collect();
        if r.is_error == Some(true) {
            text.join(" ") // The server's refusal says what refused it.
        } else {
            format!("ok: {}", text.join(" "))
        }
    };
    println!(
        "MCP: agent-0 serves calendar_read (uses consent scope calendar.read) to the principal"
    );
    let r = client
        .call_tool(CallToolRequestParams::new("calendar_read"))
        .await?;
    say(&format!("calendar_read -> {}", answer(&r)));
    let t = now();
    let revoke = Obligation {
        id: ObligationId::from_u128(u128::from(t) << 40 | 0xcafe),
        issuer: principal.agent().clone(),
        target: agent.agent().clone(),
        created_at: UnixMillis(t),
        deadline: UnixMillis(t + deadline_ms),
        max_retries: principal.default_retries(deadline_ms),
        sequence: None,
        payload: Payload::AnumatiConsent(ConsentPayload {
            decision: Some(ConsentDecision::Revoke),
            scope,
            expires_at: None,
        }),
    };
    let words = abhyasa_wire::words::obligation(&revoke);
    let handle = principal.issue(revoke).await?;
    match tokio::time::timeout(Duration::from_millis(deadline_ms + 2_000), handle.outcome()).await {
        Ok(Some((record, escalation))) => {
            let safe = escalation
                .map(|e| format!("; {}", abhyasa_wire::words::safe_action(&e.safe_action)))
                .unwrap_or_default();
            say(&format!(
                "{words}: {}{safe}",
                abhyasa_wire::words::outcome(&record.outcome, record.attempts)
            ));
        }
        _ => say(&format!("{words}: no outcome yet")),
    }
    let r = client
        .call_tool(CallToolRequestParams::new("calendar_read"))
        .await?;
    say(&format!("calendar_read -> {}", answer(&r)));
    let _ = client.cancel().await;
    Ok(())
}

/// One line of progress, in words.
fn progress(e: &NodeEvent, started: &Instant, issued: &BTreeMap<ObligationId, Obligation>) {
    let t = started.elapsed().as_secs_f64();
    match e {
        NodeEvent::Terminal { record, escalation } => {
            let what = issued.get(&record.obligation_id).map_or_else(
                || format!("{} for {}", record.kind, record.target),
                abhyasa_wire::words::obligation,
            );
            let safe = escalation
                .as_ref()
                .map(|e| format!("; {}", abhyasa_wire::words::safe_action(&e.safe_action)))
                .unwrap_or_default();
            println!(
                "  {t:6.2}s  {what}: {}{safe}",
                abhyasa_wire::words::outcome(&record.outcome, record.attempts)
            );
        }
        NodeEvent::PeerUp(peer) => println!("  {t:6.2}s  session up with {peer}"),
        NodeEvent::PeerDown(peer) => println!("  {t:6.2}s  session down with {peer}"),
        _ => {}
    }
}

/// Latency from issue to `applied`, and attempts per obligation under custody.
fn report(records: &[TerminalRecord], issued: &BTreeMap<ObligationId, Obligation>) {
    let mut latency: Vec<u64> = records
        .iter()
        .filter(|r| r.outcome == Outcome::Applied)
        .filter_map(|r| {
            issued
                .get(&r.obligation_id)
                .map(|o| r.at.0.saturating_sub(o.created_at.0))
        })
        .collect();
    latency.sort_unstable();
    let pct = |p: f64| {
        latency
            .get(((latency.len() as f64 - 1.0) * p).round() as usize)
            .copied()
            .unwrap_or(0)
    };
    if !latency.is_empty() {
        println!(
            "latency issue -> applied (ms): p50={} p90={} p99={} max={} (n={})",
            pct(0.5),
            pct(0.9),
            pct(0.99),
            latency[latency.len() - 1],
            latency.len()
        );
    }
    let attempts: Vec<u32> = records
        .iter()
        .filter(|r| r.outcome != Outcome::BestEffort)
        .map(|r| r.attempts)
        .collect();
    if !attempts.is_empty() {
        let mean = f64::from(attempts.iter().sum::<u32>()) / attempts.len() as f64;
        let mut hist: BTreeMap<u32, usize> = BTreeMap::new();
        for a in &attempts {
            *hist.entry(*a).or_default() += 1;
        }
        println!("attempts per obligation under custody: mean={mean:.2} histogram={hist:?}");
    }
}

/// Counts outcomes from the principal's store and audits both stores with `abhyasa check`'s
/// audit (the summary's `lost` and `double_applied` are its C7 and C4, plus an independent
/// look at each belief update's weight on the agent).
fn summarize(
    dir: &Path,
    issued: &BTreeMap<ObligationId, Obligation>,
) -> Result<Summary, Box<dyn std::error::Error>> {
    let pstore = Store::open(
        dir.join("principal").join("node.redb"),
        StoreConfig::default(),
    )?;
    let astore = Store::open(
        dir.join("agent-0").join("node.redb"),
        StoreConfig::default(),
    )?;
    let rows = [
        crate::audit::NodeRows::read(id("principal"), &pstore)?,
        crate::audit::NodeRows::read(id("agent-0"), &astore)?,
    ];
    let all: Vec<Obligation> = issued.values().cloned().collect();
    let audit = crate::audit::audit(&rows, Some(&all), UnixMillis(now()));
    for v in &audit.violations {
        println!("audit violation: {v}");
    }
    println!("audit: {}", audit.summary());
    let mut s = Summary {
        obligations: issued.len() as u64,
        lost: audit.lost,
        double_applied: audit.double_applied,
        ..Summary::default()
    };
    for o in issued.values() {
        match rows[0].terminal(o.id).map(|t| t.outcome) {
            Some(Outcome::Applied) => s.applied += 1,
            Some(Outcome::Declined(_)) => s.declined += 1,
            Some(Outcome::Escalated(_)) => s.escalated += 1,
            Some(Outcome::BestEffort) => s.best_effort += 1,
            None if kinds::admissible(o) => {} // Counted by the audit (C7) if not pending.
            None => s.best_effort += 1,
        }
        // A belief update's weight on its own key is its delta once, or nothing.
        if let Payload::PhalaBeliefUpdate(p) = &o.payload {
            // Read at its creation: a change that has lapsed since still shows there.
            let w = astore
                .receiver_state()
                .weight(&o.issuer, &p.weight_key, o.created_at);
            let once = i64::from(p.weight_delta.0);
            if w != 0 && w != once {
                s.double_applied += 1;
            }
        }
    }
    Ok(s)
}
