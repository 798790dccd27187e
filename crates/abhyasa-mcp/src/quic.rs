//! MCP over the node's QUIC endpoint, in the MCP-over-MOQT layout (`abhyasa_moq::mcp`):
//! an rmcp transport over an [`McpChannel`], the server loop that serves every MCP session
//! peers open to a node, and a principal's link that keeps one session to an agent up.

use std::sync::Arc;
use std::time::Duration;

use abhyasa_moq::{McpChannel, McpSender};
use abhyasa_node::{Node, NodeError};
use abhyasa_wire::AgentId;
use rmcp::service::{RoleClient, RunningService, RxJsonRpcMessage, ServiceRole, TxJsonRpcMessage};
use rmcp::transport::Transport;
use rmcp::ServiceExt as _;
use tokio::sync::{mpsc, Mutex};
use tracing::{debug, info, warn};

use crate::client::PrincipalClient;
use crate::server::{AgentServer, HostTool};

/// Why a message could not be carried.
#[derive(Debug, thiserror::Error)]
pub enum QuicTransportError {
    /// The message did not serialize.
    #[error("json: {0}")]
    Json(#[from] serde_json::Error),
    /// The session could not carry it.
    #[error("session: {0}")]
    Send(#[from] abhyasa_moq::SendError),
}

/// An rmcp transport over one MCP-over-MOQT session: each JSON-RPC message is one object.
pub struct QuicTransport {
    sender: McpSender,
    incoming: mpsc::Receiver<Vec<u8>>,
    peer: AgentId,
}

impl QuicTransport {
    /// Carries MCP over `channel`.
    pub fn new(channel: McpChannel) -> Self {
        let peer = channel.peer().clone();
        let (sender, incoming) = channel.split();
        Self {
            sender,
            incoming,
            peer,
        }
    }
}

impl<R: ServiceRole> Transport<R> for QuicTransport {
    type Error = QuicTransportError;

    fn send(
        &mut self,
        item: TxJsonRpcMessage<R>,
    ) -> impl std::future::Future<Output = Result<(), Self::Error>> + Send + 'static {
        let sender = self.sender.clone();
        let bytes = serde_json::to_vec(&item);
        async move {
            sender.send(&bytes?).await?;
            Ok(())
        }
    }

    async fn receive(&mut self) -> Option<RxJsonRpcMessage<R>> {
        loop {
            let bytes = self.incoming.recv().await?;
            match serde_json::from_slice(&bytes) {
                Ok(m) => return Some(m),
                // A message that is not JSON-RPC: skipped, as a stdio transport would.
                Err(e) => warn!(peer = %self.peer, %e, "unreadable MCP message over QUIC"),
            }
        }
    }

    fn close(&mut self) -> impl std::future::Future<Output = Result<(), Self::Error>> + Send {
        self.sender.close("mcp session closed");
        std::future::ready(Ok(()))
    }
}

/// Serves MCP to every peer that opens a session to `node` over QUIC: each session gets an
/// [`AgentServer`] whose principal is the peer its certificate names, with `tools`. Runs
/// until the node stops; `Err` if another task already serves the node's MCP sessions.
pub async fn serve_quic(node: Node, tools: Vec<HostTool>) -> Result<(), NodeError> {
    let Some(mut sessions) = node.mcp_sessions() else {
        return Err(NodeError::Mcp(
            "MCP sessions are already being served".into(),
        ));
    };
    while let Some(channel) = sessions.recv().await {
        let peer = channel.peer().clone();
        let mut server = AgentServer::new(node.clone(), peer.clone());
        for t in &tools {
            server = server.tool(t.clone());
        }
        tokio::spawn(async move {
            match server.serve(QuicTransport::new(channel)).await {
                Ok(running) => {
                    let _ = running.waiting().await;
                    debug!(%peer, "MCP session over QUIC ended");
                }
                Err(e) => debug!(%peer, %e, "MCP session over QUIC did not start"),
            }
        });
    }
    Ok(())
}

/// Opens an MCP session to `agent` at `addr` over `node`'s endpoint and attaches the node's
/// custodian to it. Keep the returned service alive as long as the client is used.
pub async fn connect_quic(
    node: &Node,
    agent: &AgentId,
    addr: std::net::SocketAddr,
    linger: Duration,
) -> Result<(PrincipalClient, RunningService<RoleClient, ()>), NodeError> {
    let channel = node.mcp_connect(agent, addr).await?;
    let service =
        ().serve(QuicTransport::new(channel))
            .await
            .map_err(|e| NodeError::Mcp(e.to_string()))?;
    let client =
        PrincipalClient::attach(node.clone(), agent.clone(), service.peer().clone(), linger)
            .await?;
    Ok((client, service))
}

/// A principal's MCP session to one agent over QUIC, kept up: when it ends (the agent
/// restarts, the link drops), a fresh session is opened and custody re-offers what is
/// pending. Dropping the link stops it.
pub struct PrincipalLink {
    current: Arc<Mutex<Option<PrincipalClient>>>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for PrincipalLink {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl PrincipalLink {
    /// Starts keeping a session from `node` to `agent` at `addr`.
    pub fn spawn(node: Node, agent: AgentId, addr: std::net::SocketAddr, linger: Duration) -> Self {
        let current = Arc::new(Mutex::new(None));
        let slot = current.clone();
        let task = tokio::spawn(async move {
            let mut backoff = Duration::from_millis(50);
            loop {
                match connect_quic(&node, &agent, addr, linger).await {
                    Ok((client, service)) => {
                        info!(%agent, "MCP session over QUIC up");
                        backoff = Duration::from_millis(50);
                        *slot.lock().await = Some(client);
                        let _ = service.waiting().await;
                        *slot.lock().await = None;
                        info!(%agent, "MCP session over QUIC down");
                    }
                    Err(e) => debug!(%agent, %e, "MCP session over QUIC failed"),
                }
                tokio::time::sleep(backoff).await;
                backoff = (backoff * 2).min(Duration::from_secs(1));
            }
        });
        Self { current, task }
    }

    /// The client of the session up now, if any.
    pub async fn client(&self) -> Option<PrincipalClient> {
        self.current.lock().await.clone()
    }
}
