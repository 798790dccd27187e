//! MCP over the node's QUIC endpoint, in the MCP-over-MOQT layout ([`crate::channel`]):
//! an rmcp transport over an [`McpChannel`], the server loop that serves every MCP session
//! peers open to a node, and a principal's link that keeps one session to an agent up.

use std::sync::Arc;
use std::time::Duration;

use abhyasa_node::{Node, NodeError};
use abhyasa_wire::AgentId;
use rmcp::service::{RoleClient, RunningService, RxJsonRpcMessage, ServiceRole, TxJsonRpcMessage};
use rmcp::transport::Transport;
use rmcp::ServiceExt as _;
use tokio::sync::{mpsc, Mutex};
use tracing::{debug, info, warn};

use crate::channel::{McpChannel, McpSender, MCP_PATH};
use crate::client::PrincipalClient;
use crate::server::{AgentServer, HostTool};

/// Why a message could not be carried.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
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
/// [`AgentServer`] whose principal is the peer its certificate names, with `tools`. The
/// node's [`MCP_PATH`] port is taken when this is called, so sessions opened from then on
/// wait for the returned future; it runs until the node stops, and is `Err` if another task
/// already serves the node's MCP sessions.
pub fn serve_quic(
    node: Node,
    tools: Vec<HostTool>,
) -> impl std::future::Future<Output = Result<(), NodeError>> + Send + 'static {
    serve_quic_for(node, tools, None)
}

/// [`serve_quic`], with the host tools served only to the deployment members in `callers`
/// (`None`: every member). A member outside it still gets an MCP session — obligations it
/// issues in its own name ride its calls, and `abhyasa_deliver` / `abhyasa_custody_status`
/// answer — but no host tool is listed or run for it.
pub fn serve_quic_for(
    node: Node,
    tools: Vec<HostTool>,
    callers: Option<std::collections::BTreeSet<AgentId>>,
) -> impl std::future::Future<Output = Result<(), NodeError>> + Send + 'static {
    // Registered now, not at the first poll: a session opened before the task runs waits.
    let port = node.port(MCP_PATH);
    serve_port(node, port, tools, callers)
}

async fn serve_port(
    node: Node,
    port: Result<mpsc::Receiver<abhyasa_moq::BoundConnection>, NodeError>,
    tools: Vec<HostTool>,
    callers: Option<std::collections::BTreeSet<AgentId>>,
) -> Result<(), NodeError> {
    let mut sessions = port?;
    while let Some(bound) = sessions.recv().await {
        let channel = McpChannel::serve(bound);
        let peer = channel.peer().clone();
        let mut server = AgentServer::new(node.clone(), peer.clone());
        let allowed = callers.as_ref().is_none_or(|c| c.contains(&peer));
        if allowed {
            for t in &tools {
                server = server.tool(t.clone());
            }
        } else if !tools.is_empty() {
            debug!(%peer, "MCP session over QUIC: not a host-tool caller; custody tools only");
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
    let bound = node.dial(MCP_PATH, agent, addr).await?;
    let channel = McpChannel::open(bound)
        .await
        .map_err(|e| NodeError::Binding(e.to_string()))?;
    let service =
        ().serve(QuicTransport::new(channel))
            .await
            .map_err(|e| NodeError::Binding(e.to_string()))?;
    let client =
        PrincipalClient::attach(node.clone(), agent.clone(), service.peer().clone(), linger)
            .await?;
    Ok((client, service))
}

/// How a principal reaches an agent's MCP server.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum McpRoute {
    /// Over the node's QUIC endpoint, in the MCP-over-MOQT layout, to the agent at this
    /// address (mutually authenticated with the deployment's certificates).
    Quic(std::net::SocketAddr),
    /// A server this node spawns and speaks to over its stdin/stdout (program and
    /// arguments), e.g. `abhyasa mcp --config agent.toml --stdio`. The child is the agent;
    /// it must be configured to act for this node (`[mcp] principal`). It is killed when the
    /// link is dropped and started again when it exits.
    Command(Vec<String>),
    /// A server on streamable HTTP at this `http://` URL (e.g. `abhyasa mcp --http`, which
    /// acts for its configured `[mcp] principal`; plain HTTP carries no identity, so keep it
    /// on loopback). `token_file`: the server's bearer token (64 hex digits on one line; read at
    /// each connection attempt, so a server that starts later or makes a new one is followed).
    Url {
        /// `http://host:port/mcp`.
        url: String,
        /// The bearer token's file.
        token_file: Option<std::path::PathBuf>,
    },
}

/// Opens an MCP session to the streamable HTTP server at `url` (`http://…`), presenting
/// `bearer` (`Authorization: Bearer …`) when given, attaching `node`'s custodian. Keep the
/// returned service alive as long as the client is used.
pub async fn connect_url(
    node: &Node,
    agent: &AgentId,
    url: &str,
    bearer: Option<&str>,
    linger: Duration,
) -> Result<(PrincipalClient, RunningService<RoleClient, ()>), NodeError> {
    if !url.starts_with("http://") {
        return Err(NodeError::Binding(format!(
            "{url}: only http:// URLs (streamable HTTP on loopback) are reached; use addr for MCP over QUIC with certificates"
        )));
    }
    // The HTTP client's TLS stack takes the process's default provider: ring, as everywhere
    // in Abhyasa (already installed is fine).
    let _ = rustls::crypto::ring::default_provider().install_default();
    let mut config =
        rmcp::transport::streamable_http_client::StreamableHttpClientTransportConfig::with_uri(
            url.to_owned(),
        );
    if let Some(token) = bearer {
        config = config.auth_header(token.to_owned());
    }
    let transport = rmcp::transport::StreamableHttpClientTransport::from_config(config);
    let service = ().serve(transport).await.map_err(|e| NodeError::Binding(e.to_string()))?;
    let client =
        PrincipalClient::attach(node.clone(), agent.clone(), service.peer().clone(), linger)
            .await?;
    Ok((client, service))
}

/// Reads a bearer token file: one line, the token.
fn read_bearer(path: &std::path::Path) -> Result<String, NodeError> {
    let text = std::fs::read_to_string(path)
        .map_err(|e| NodeError::Binding(format!("bearer token {}: {e}", path.display())))?;
    let token = text.trim();
    if token.is_empty() || token.lines().count() != 1 {
        return Err(NodeError::Binding(format!(
            "bearer token {}: expected one line",
            path.display()
        )));
    }
    Ok(token.to_owned())
}

/// Spawns `command` and opens an MCP session over its stdio, attaching `node`'s custodian.
/// Keep the returned service and child alive as long as the client is used.
pub async fn connect_command(
    node: &Node,
    agent: &AgentId,
    command: &[String],
    linger: Duration,
) -> Result<
    (
        PrincipalClient,
        RunningService<RoleClient, ()>,
        tokio::process::Child,
    ),
    NodeError,
> {
    let program = command
        .first()
        .ok_or_else(|| NodeError::Binding("the server command is empty".into()))?;
    let mut child = tokio::process::Command::new(program)
        .args(&command[1..])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .map_err(|e| NodeError::Binding(format!("could not start {program}: {e}")))?;
    let (Some(stdout), Some(stdin)) = (child.stdout.take(), child.stdin.take()) else {
        return Err(NodeError::Binding(format!("{program}: no stdio")));
    };
    let service = ().serve((stdout, stdin)).await.map_err(|e| NodeError::Binding(e.to_string()))?;
    let client =
        PrincipalClient::attach(node.clone(), agent.clone(), service.peer().clone(), linger)
            .await?;
    Ok((client, service, child))
}

/// A principal's MCP session to one agent, kept up: when it ends (the agent restarts or
/// exits, the link drops), a fresh session is opened (a fresh child, for a command) and
/// custody re-offers what is pending. Dropping the link stops it.
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
    /// Starts keeping a session from `node` to `agent` at `addr` over QUIC.
    pub fn spawn(node: Node, agent: AgentId, addr: std::net::SocketAddr, linger: Duration) -> Self {
        Self::spawn_route(node, agent, McpRoute::Quic(addr), linger)
    }

    /// Starts keeping a session from `node` to `agent` by `route`.
    pub fn spawn_route(node: Node, agent: AgentId, route: McpRoute, linger: Duration) -> Self {
        let current = Arc::new(Mutex::new(None));
        let slot = current.clone();
        let task = tokio::spawn(async move {
            let mut backoff = Duration::from_millis(50);
            loop {
                let session = match &route {
                    McpRoute::Quic(addr) => connect_quic(&node, &agent, *addr, linger)
                        .await
                        .map(|(c, s)| (c, s, None)),
                    McpRoute::Command(command) => connect_command(&node, &agent, command, linger)
                        .await
                        .map(|(c, s, child)| (c, s, Some(child))),
                    McpRoute::Url { url, token_file } => {
                        match token_file.as_deref().map(read_bearer).transpose() {
                            Ok(bearer) => {
                                connect_url(&node, &agent, url, bearer.as_deref(), linger)
                                    .await
                                    .map(|(c, s)| (c, s, None))
                            }
                            Err(e) => Err(e),
                        }
                    }
                };
                match session {
                    Ok((client, service, child)) => {
                        info!(%agent, ?route, "MCP session up");
                        backoff = Duration::from_millis(50);
                        *slot.lock().await = Some(client);
                        let _ = service.waiting().await;
                        *slot.lock().await = None;
                        drop(child); // Killed if it is still running.
                        info!(%agent, "MCP session down");
                    }
                    Err(e) => debug!(%agent, %e, "MCP session failed"),
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
