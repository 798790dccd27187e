//! MCP over streamable HTTP (rmcp's server transport), for hosts that speak HTTP locally.
//!
//! Every session acts as the one configured `principal`, as over stdio: whoever reaches the
//! server may deliver obligations in the principal's name and call its budget-gated tools. So
//! it listens on loopback only, every request must carry the bearer token the server was given
//! (`Authorization: Bearer …`; `abhyasa mcp --http` keeps it in `<state>/mcp.token`, mode 0600),
//! and a request with an `Origin` header (a browser page) is refused, so a web page cannot
//! drive it through the user's browser. Agents reach each other over QUIC, where the
//! certificate names the peer.

use std::net::SocketAddr;
use std::sync::Arc;

use abhyasa_node::Node;
use abhyasa_wire::AgentId;
use rmcp::transport::streamable_http_server::session::local::LocalSessionManager;
use rmcp::transport::streamable_http_server::{StreamableHttpServerConfig, StreamableHttpService};

pub use abhyasa_http::{HttpError, Server as HttpServer, IDLE_TIMEOUT};

use crate::{AgentServer, HostTool};

/// The path MCP is served under.
pub const HTTP_PATH: &str = "/mcp";

/// Serves MCP for `node` at `http://<listen>/mcp`, every session acting as `principal`, with
/// `tools` governed. With `bearer`, a request without `Authorization: Bearer <bearer>` is
/// answered 401 and reaches nothing (`None` only where every local user is trusted: tests
/// and benchmarks). The listener is [`abhyasa_http`]'s: loopback only, waiting and
/// authorized connections bounded.
pub async fn serve_http(
    node: Node,
    principal: AgentId,
    tools: Vec<HostTool>,
    listen: SocketAddr,
    bearer: Option<String>,
) -> Result<HttpServer, HttpError> {
    let bound = abhyasa_http::bind(listen).await?;
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
        // An empty allow-list, enforced: any request with an Origin header is refused.
        StreamableHttpServerConfig::default().enforce_origin_validation(),
    );
    let app = axum::Router::new().nest_service(HTTP_PATH, service);
    let key = bearer.map(abhyasa_http::Key::bearer);
    Ok(abhyasa_http::serve(bound, app, key, "mcp http"))
}
