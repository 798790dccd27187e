//! Fixtures shared by the MCP binding's tests.
#![allow(dead_code)] // Each test binary uses its own subset.

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;

use abhyasa_mcp::{Governance, HostTool};
use abhyasa_wire::{ConsentDecision, ConsentPayload, Obligation, Payload, Scope};

#[allow(unused_imports)] // Each test binary uses its own subset.
pub use abhyasa_testkit::{free_udp as free_addr, id, now_ms, short_custodian as custodian};
use rmcp::model::{CallToolResult, ContentBlock, Tool};
use rmcp::service::RunningService;
use rmcp::{RoleClient, ServerHandler, ServiceExt};

/// Obligation `n` from `issuer` to `agent-1`, due `deadline_ms` from now.
pub fn obligation(n: u128, issuer: &str, deadline_ms: u64, payload: Payload) -> Obligation {
    abhyasa_testkit::obligation(n, &id(issuer), &id("agent-1"), deadline_ms, 60, payload)
}

/// A consent decision on `scope` from `principal`.
pub fn consent(n: u128, decision: ConsentDecision, scope: &str, deadline_ms: u64) -> Obligation {
    obligation(
        n,
        "principal",
        deadline_ms,
        Payload::AnumatiConsent(ConsentPayload {
            decision: Some(decision),
            scope: Scope::new(scope).unwrap(),
            expires_at: None,
        }),
    )
}

/// A revocation of token `token` from `principal`.
pub fn revoke_token(n: u128, token: &str, deadline_ms: u64) -> Obligation {
    obligation(
        n,
        "principal",
        deadline_ms,
        abhyasa_testkit::token_revocation(token),
    )
}

/// A host tool `name` governed by `governance` that answers with its name and counts its
/// runs in `runs`.
pub fn host_tool(name: &'static str, governance: Governance, runs: Arc<AtomicU32>) -> HostTool {
    let schema = serde_json::json!({"type": "object"})
        .as_object()
        .cloned()
        .unwrap();
    HostTool {
        tool: Tool::new(name, "a governed test tool", Arc::new(schema)),
        governance,
        run: Arc::new(move |_| {
            let runs = runs.clone();
            Box::pin(async move {
                runs.fetch_add(1, Ordering::SeqCst);
                CallToolResult::success(vec![ContentBlock::text(format!("{name} ran"))])
            })
        }),
    }
}

/// `calendar_read`, which uses the consent scope `calendar.read`.
pub fn calendar(runs: Arc<AtomicU32>) -> HostTool {
    host_tool(
        "calendar_read",
        Governance {
            scopes: vec![Scope::new("calendar.read").unwrap()],
            token: None,
            budget: None,
        },
        runs,
    )
}

/// The client's end of an in-process pipe.
pub type PipeEnd = (
    tokio::io::ReadHalf<tokio::io::DuplexStream>,
    tokio::io::WriteHalf<tokio::io::DuplexStream>,
);

/// Serves `handler` on one end of an in-process pipe; the other end is for a client.
pub fn serve_on_pipe<S: ServerHandler>(handler: S) -> (PipeEnd, tokio::task::JoinHandle<()>) {
    let (a, b) = tokio::io::duplex(1 << 16);
    let (ar, aw) = tokio::io::split(a);
    let server = tokio::spawn(async move {
        if let Ok(running) = handler.serve((ar, aw)).await {
            let _ = running.waiting().await;
        }
    });
    (tokio::io::split(b), server)
}

/// Serves `handler` to a new rmcp client over an in-process pipe.
pub async fn connect<S: ServerHandler>(
    handler: S,
) -> (RunningService<RoleClient, ()>, tokio::task::JoinHandle<()>) {
    let (end, server) = serve_on_pipe(handler);
    (().serve(end).await.unwrap(), server)
}
