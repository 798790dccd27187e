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

use abhyasa_ledger::{CreditId, OpKey, Receipt, Signed};
use abhyasa_node::{LedgerCommand, LedgerReply, Node, NodeError};
use abhyasa_wire::AgentId;
use base64::engine::general_purpose::STANDARD;
use base64::Engine as _;
use rmcp::model::{CallToolRequestParams, CallToolResult, RequestMetaObject};
use rmcp::service::{Peer, ServiceError};
use rmcp::RoleClient;
use serde_json::Value;
use tokio::sync::mpsc;
use tracing::debug;

use crate::budget::{permit_to_meta, receipt_from_meta, tool_effect, PermitError, ToolBudget};
use crate::envelope::{acks_from_meta, META_OBLIGATIONS, META_PERMIT};
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

/// A budget-gated call, carried: what the tool answered, the receipt on its result, and the
/// operation's state in this node's branch once the receipt was handed to it.
#[derive(Debug)]
pub struct BudgetedCall {
    /// The tool's result.
    pub result: CallToolResult,
    /// The gateway's receipt, when the result carried one.
    pub receipt: Option<Signed<Receipt>>,
    /// The operation's state after the receipt (`settled`), or `quarantined` without one.
    pub state: &'static str,
}

/// Why a budget-gated call did not complete.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum BudgetedCallError {
    /// The branch refused to reserve (no such credit, too little, purpose not allowed …).
    #[error("ledger: {0}")]
    Ledger(#[from] NodeError),
    /// The call failed on the way: the operation stays charged (quarantined) until a
    /// retry with the same key gets its receipt, or a fence proves it never ran.
    #[error("mcp: {0}")]
    Call(#[from] ServiceError),
    /// The result carried a receipt that does not read.
    #[error("{0}")]
    Receipt(#[from] PermitError),
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

    /// Calls a budget-gated tool of the agent (the gateway): this node's branch reserves the
    /// call's maximum from `credit` under `key` and signs the permit, durable before it rides
    /// the call; the receipt on the result settles the branch. A call that fails leaves the
    /// operation charged: call again with the same `key` and arguments (the same permit; the
    /// gateway answers a replay with its first receipt and never runs the tool twice).
    pub async fn call_budgeted(
        &self,
        mut params: CallToolRequestParams,
        credit: CreditId,
        key: OpKey,
        budget: &ToolBudget,
    ) -> Result<BudgetedCall, BudgetedCallError> {
        let args = params.arguments.clone().unwrap_or_default();
        let effect = tool_effect(&params.name, &args, budget);
        let permit = self
            .node
            .carried_permit(credit, effect, self.agent.clone(), key)
            .await?;
        params
            .meta
            .get_or_insert_with(RequestMetaObject::new)
            .0
            .insert(META_PERMIT.into(), permit_to_meta(&permit));
        let result = self.call_tool(params).await?;
        let receipt = match &result.meta {
            Some(m) => receipt_from_meta(&m.0)?,
            None => None,
        };
        let state = match &receipt {
            Some(r) => {
                let cmd = LedgerCommand::Receipt {
                    gateway: self.agent.clone(),
                    receipt: Box::new(r.clone()),
                };
                match self.node.ledger(cmd).await? {
                    LedgerReply::Operation { state, .. } => state,
                    _ => "unknown",
                }
            }
            None => "quarantined",
        };
        Ok(BudgetedCall {
            result,
            receipt,
            state,
        })
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
