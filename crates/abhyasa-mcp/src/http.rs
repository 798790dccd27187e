//! MCP over streamable HTTP (rmcp's server transport), for hosts that speak HTTP locally.
//!
//! Plain HTTP authenticates no one: every session acts as the one configured `principal`, as
//! over stdio. So it listens on loopback only; agents reach each other over QUIC, where the
//! certificate names the peer.

use std::net::SocketAddr;
use std::sync::Arc;

use abhyasa_node::Node;
use abhyasa_wire::AgentId;
use rmcp::transport::streamable_http_server::session::local::LocalSessionManager;
use rmcp::transport::streamable_http_server::{StreamableHttpServerConfig, StreamableHttpService};
use tokio::task::JoinHandle;

use crate::{AgentServer, HostTool};

/// The path MCP is served under.
pub const HTTP_PATH: &str = "/mcp";

/// Why the HTTP server did not start.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum HttpError {
    /// Not a loopback address.
    #[error("{0} is not a loopback address: MCP over plain HTTP authenticates no one")]
    NotLoopback(SocketAddr),
    /// The socket could not be bound.
    #[error("bind {addr}: {source}")]
    Bind {
        /// Where.
        addr: SocketAddr,
        /// Why.
        source: std::io::Error,
    },
}

/// A running streamable-HTTP MCP server.
pub struct HttpServer {
    local_addr: SocketAddr,
    task: JoinHandle<()>,
}

impl HttpServer {
    /// Where it listens (`http://<addr>/mcp`).
    pub fn local_addr(&self) -> SocketAddr {
        self.local_addr
    }

    /// Runs until the server stops.
    pub async fn wait(mut self) {
        let _ = (&mut self.task).await;
    }
}

impl Drop for HttpServer {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// Serves MCP for `node` at `http://<listen>/mcp`, every session acting as `principal`, with
/// `tools` governed.
pub async fn serve_http(
    node: Node,
    principal: AgentId,
    tools: Vec<HostTool>,
    listen: SocketAddr,
) -> Result<HttpServer, HttpError> {
    if !listen.ip().is_loopback() {
        return Err(HttpError::NotLoopback(listen));
    }
    let tools = Arc::new(tools);
    let service = StreamableHttpService::new(
        move || {
            let mut s = AgentServer::new(node.clone(), principal.clone());
            for t in tools.iter() {
                s = s.tool(t.clone());
            }
            Ok(s)
        },
        Arc::new(LocalSessionManager::default()),
        StreamableHttpServerConfig::default(),
    );
    let app = axum::Router::new().nest_service(HTTP_PATH, service);
    let listener = tokio::net::TcpListener::bind(listen)
        .await
        .map_err(|source| HttpError::Bind {
            addr: listen,
            source,
        })?;
    let local_addr = listener.local_addr().map_err(|source| HttpError::Bind {
        addr: listen,
        source,
    })?;
    let task = tokio::spawn(async move {
        let _ = axum::serve(listener, app).await;
    });
    Ok(HttpServer { local_addr, task })
}
