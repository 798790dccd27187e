//! An MCP host that embeds an Abhyasa node and serves two governed tools over QUIC, and a
//! principal that uses them: a call that runs, a consent revocation under custody riding the
//! principal's next call, the same tool refused, the other tool still running.
//!
//! `cargo run --example mcp_host`

use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use abhyasa::custody::CustodianConfig;
use abhyasa::moq::Ca;
use abhyasa::node::Node;
use abhyasa::wire::{
    AgentId, ConsentDecision, ConsentPayload, Obligation, ObligationId, Payload, Scope, TokenId,
    UnixMillis,
};
use abhyasa_mcp::{connect_quic, serve_quic, Governance, HostTool};
use rmcp::model::{CallToolRequestParams, CallToolResult, ContentBlock, Tool};

fn tool(name: &'static str, what: &'static str, governance: Governance) -> HostTool {
    let schema = serde_json::json!({"type": "object"})
        .as_object()
        .cloned()
        .unwrap_or_default();
    HostTool {
        tool: Tool::new(name, what, Arc::new(schema)),
        governance,
        run: Arc::new(move |_| {
            Box::pin(async move { CallToolResult::success(vec![ContentBlock::text(what)]) })
        }),
    }
}

fn text(r: &CallToolResult) -> String {
    let t: Vec<String> = r
        .content
        .iter()
        .filter_map(|c| c.as_text().map(|t| t.text.clone()))
        .collect();
    if r.is_error == Some(true) {
        t.join(" ") // The host's refusal says what refused it.
    } else {
        format!("ok: {}", t.join(" "))
    }
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let dir = tempfile::tempdir()?;
    let ca = Ca::generate("mcp host example")?;
    let (p, a) = (AgentId::new("principal")?, AgentId::new("calendar-agent")?);

    // The host: a node, and MCP served on the node's own QUIC endpoint.
    let host = Node::builder(ca.issue(&a)?)
        .state_dir(dir.path().join("host"))
        .build()
        .await?;
    let tools = vec![
        tool(
            "calendar_read",
            "Monday: 3 events",
            Governance {
                scopes: vec![Scope::new("calendar.read")?],
                token: None,
                budget: None,
            },
        ),
        tool(
            "mail_send",
            "mail sent",
            Governance {
                scopes: vec![],
                token: Some(TokenId::new("tok-mail")?),
                budget: None,
            },
        ),
    ];
    tokio::spawn(serve_quic(host.clone(), tools));
    println!(
        "host {a} serves calendar_read and mail_send over MCP on QUIC {}",
        host.local_addr()
    );

    // The principal: its own node; its custodian reaches the host through the MCP session.
    let principal = Node::builder(ca.issue(&p)?)
        .state_dir(dir.path().join("principal"))
        .custodian(CustodianConfig {
            response_timeout_ms: 300,
            ..CustodianConfig::default()
        })
        .build()
        .await?;
    let (client, _session) = connect_quic(
        &principal,
        &a,
        host.local_addr(),
        Duration::from_millis(500),
    )
    .await?;

    let r = client
        .call_tool(CallToolRequestParams::new("calendar_read"))
        .await?;
    println!("calendar_read -> {}", text(&r));

    let now = SystemTime::now().duration_since(UNIX_EPOCH)?.as_millis() as u64;
    let revoke = Obligation {
        id: ObligationId::from_u128(u128::from(now)),
        issuer: p.clone(),
        target: a.clone(),
        created_at: UnixMillis(now),
        deadline: UnixMillis(now + 30_000),
        max_retries: principal.default_retries(30_000),
        sequence: None,
        payload: Payload::AnumatiConsent(ConsentPayload {
            decision: Some(ConsentDecision::Revoke),
            scope: Scope::new("calendar.read")?,
            expires_at: None,
        }),
    };
    println!(
        "principal revokes consent to calendar.read (obligation {})",
        revoke.id
    );
    let handle = principal.issue(revoke).await?;

    // The revocation rides this very call and refuses it.
    let r = client
        .call_tool(CallToolRequestParams::new("calendar_read"))
        .await?;
    println!("calendar_read -> {}", text(&r));
    let r = client
        .call_tool(CallToolRequestParams::new("mail_send"))
        .await?;
    println!("mail_send -> {}", text(&r));
    if let Some((record, _)) = handle.outcome().await {
        println!(
            "custody of the revocation: {}",
            abhyasa::wire::words::outcome(&record.outcome, record.attempts)
        );
    }
    principal.shutdown().await;
    host.shutdown().await;
    Ok(())
}
