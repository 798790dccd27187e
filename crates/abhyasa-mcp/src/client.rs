//! The principal's side as an MCP client: the custodian's obligations for the agent behind
//! an MCP session ride the next `tools/call` the host makes, or `abhyasa_deliver` when no
//! call comes soon; the acks on each result go back to the custodian.
//!
//! Deliver-or-report is the custodian's, unchanged: this driver only carries objects. An
//! object it fails to carry (the call fails, the server dies, the server does not understand
//! the envelope and never acks) is retried by custody on its schedule and, past the deadline,
//! escalated with its safe action.

use std::sync::Arc;
use std::task::Poll;
use std::time::Duration;

use abhyasa_node::{Node, NodeError};
use abhyasa_wire::AgentId;
use base64::engine::general_purpose::STANDARD;
use base64::Engine as _;
use rmcp::model::{CallToolRequestParams, CallToolResult, RequestMetaObject};
use rmcp::service::{Peer, ServiceError};
use rmcp::RoleClient;
use serde_json::Value;
use tokio::sync::mpsc;
use tracing::debug;

use crate::envelope::{acks_from_meta, META_OBLIGATIONS};
use crate::server::TOOL_DELIVER;

/// Obligation objects waiting for a call to carry them: the custodian's channel for the
/// agent, and what the pump already took off it. A call takes both under one lock, so an
/// obligation released before the call starts (as every obligation whose `issue` has
/// returned is) rides that call.
struct Outbox {
    inner: std::sync::Mutex<Waiting>,
}

struct Waiting {
    rx: mpsc::UnboundedReceiver<Vec<u8>>,
    taken: Vec<Vec<u8>>,
}

impl Outbox {
    fn lock(&self) -> std::sync::MutexGuard<'_, Waiting> {
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Everything waiting, now.
    fn take_all(&self) -> Vec<Vec<u8>> {
        let mut w = self.lock();
        let mut all = std::mem::take(&mut w.taken);
        while let Ok(o) = w.rx.try_recv() {
            all.push(o);
        }
        all
    }

    fn is_empty(&self) -> bool {
        let w = self.lock();
        w.taken.is_empty() && w.rx.is_empty()
    }

    /// Waits until something arrives; `false` once the custodian let go of the channel.
    async fn arrival(&self) -> bool {
        std::future::poll_fn(|cx| {
            let mut w = self.lock();
            match w.rx.poll_recv(cx) {
                Poll::Ready(Some(o)) => {
                    w.taken.push(o);
                    Poll::Ready(true)
                }
                Poll::Ready(None) => Poll::Ready(false),
                Poll::Pending => Poll::Pending,
            }
        })
        .await
    }
}

/// A custodian's MCP client for one agent. Clones share it.
#[derive(Clone)]
pub struct PrincipalClient {
    node: Node,
    agent: AgentId,
    peer: Peer<RoleClient>,
    outbox: Arc<Outbox>,
    /// Held so the last clone dropped stops the pump.
    _pump: Arc<Pump>,
}

struct Pump(Option<tokio::task::JoinHandle<()>>);

impl Drop for Pump {
    fn drop(&mut self) {
        if let Some(t) = &self.0 {
            t.abort();
        }
    }
}

impl PrincipalClient {
    /// Attaches `node`'s custodian to `agent` through the MCP session `peer` (an rmcp
    /// client). Obligations not picked up by a host call within `linger` go on
    /// `abhyasa_deliver`. What is pending for `agent` is re-offered at once.
    pub async fn attach(
        node: Node,
        agent: AgentId,
        peer: Peer<RoleClient>,
        linger: Duration,
    ) -> Result<Self, NodeError> {
        let rx = node.attach(agent.clone()).await?;
        let outbox = Arc::new(Outbox {
            inner: std::sync::Mutex::new(Waiting {
                rx,
                taken: Vec::new(),
            }),
        });
        let this = Self {
            node,
            agent,
            peer,
            outbox,
            _pump: Arc::new(Pump(None)),
        };
        let pump = {
            let this = this.clone();
            tokio::spawn(async move { this.pump(linger).await })
        };
        Ok(Self {
            _pump: Arc::new(Pump(Some(pump))),
            ..this
        })
    }

    /// The agent this client reaches.
    pub fn agent(&self) -> &AgentId {
        &self.agent
    }

    /// Calls a tool; the obligations waiting for the agent ride it, and the acks on its
    /// result reach the custodian. On an error the obligations it carried are retried by
    /// custody.
    pub async fn call_tool(
        &self,
        mut params: CallToolRequestParams,
    ) -> Result<CallToolResult, ServiceError> {
        let objects = self.outbox.take_all();
        if !objects.is_empty() {
            let meta = params.meta.get_or_insert_with(RequestMetaObject::new);
            let entries = objects
                .iter()
                .map(|o| Value::String(STANDARD.encode(o)))
                .collect();
            meta.0
                .insert(META_OBLIGATIONS.into(), Value::Array(entries));
        }
        let result = self.peer.call_tool(params).await?;
        if let Some(meta) = &result.meta {
            match acks_from_meta(&meta.0) {
                Ok(acks) => {
                    let _ = self.node.acks_in(self.agent.clone(), acks).await;
                }
                Err(e) => debug!(agent = %self.agent, %e, "unreadable acks on a result"),
            }
        }
        Ok(result)
    }

    /// Carries what no host call picked up within `linger`.
    async fn pump(self, linger: Duration) {
        while self.outbox.arrival().await {
            tokio::time::sleep(linger).await;
            if self.outbox.is_empty() {
                continue; // A host call took them.
            }
            if let Err(e) = self
                .call_tool(CallToolRequestParams::new(TOOL_DELIVER))
                .await
            {
                debug!(agent = %self.agent, %e, "abhyasa_deliver failed; custody retries");
            }
        }
    }
}
