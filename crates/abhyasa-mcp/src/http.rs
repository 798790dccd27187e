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
use std::time::Duration;

use abhyasa_node::listen::{waiting_cap, AcceptBackoff, PeerSlot, PerPeer, Waiting};

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
/// `tools` governed. With `bearer`, a request without `Authorization: Bearer <bearer>` is
/// answered 401 and reaches nothing (`None` only where every local user is trusted: tests
/// and benchmarks).
pub async fn serve_http(
    node: Node,
    principal: AgentId,
    tools: Vec<HostTool>,
    listen: SocketAddr,
    bearer: Option<String>,
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
        // An empty allow-list, enforced: any request with an Origin header is refused.
        StreamableHttpServerConfig::default().enforce_origin_validation(),
    );
    let app = axum::Router::new().nest_service(HTTP_PATH, service);
    let bearer: Option<Arc<str>> = bearer.map(Arc::from);
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
    let task = tokio::spawn(accept_loop(listener, app, bearer));
    Ok(HttpServer { local_addr, task })
}

/// How long a connection may take to send a request's head, and may stay idle between
/// requests (a response in progress, such as an event stream, is not idle).
pub const IDLE_TIMEOUT: Duration = Duration::from_secs(30);

/// Accepts until the server is dropped. A connection counts as waiting until a request of
/// it passes the bearer check; at most a quarter of the descriptor limit wait (16..=1,024),
/// past it the oldest is closed. A failed accept (EMFILE) is retried with backoff.
async fn accept_loop(
    listener: tokio::net::TcpListener,
    app: axum::Router,
    bearer: Option<Arc<str>>,
) {
    // Connections live in this task: dropping the server ends them too.
    let mut connections = tokio::task::JoinSet::new();
    let waiting = Waiting::new(waiting_cap(4));
    // Connections whose request passed the bearer check: every holder of the token is one
    // peer here, so they share one cap (a quarter of the descriptor limit too).
    let authorized: PerPeer<()> = PerPeer::new(waiting_cap(4));
    let mut backoff = AcceptBackoff::default();
    loop {
        while connections.try_join_next().is_some() {}
        let tcp = match listener.accept().await {
            Ok((tcp, _)) => {
                backoff.reset();
                tcp
            }
            Err(e) => {
                backoff.failed("mcp http", &e).await;
                continue;
            }
        };
        let id = waiting.next_id();
        let w = waiting.clone();
        let authorized = authorized.clone();
        let slot: Arc<std::sync::Mutex<Option<PeerSlot<()>>>> = Arc::default();
        // The first authorized request takes the connection off the waiting list and counts
        // it as authorized; past that cap it is answered 503 and closed.
        let shown = axum::middleware::from_fn(
            move |request: axum::extract::Request, next: axum::middleware::Next| {
                w.done(id);
                let admitted = {
                    let mut held = slot.lock().unwrap_or_else(|e| e.into_inner());
                    if held.is_none() {
                        *held = authorized.claim(());
                    }
                    held.is_some()
                };
                async move {
                    if admitted {
                        return next.run(request).await;
                    }
                    use axum::response::IntoResponse as _;
                    tracing::warn!("MCP connection refused: as many authorized as allowed");
                    (
                        axum::http::StatusCode::SERVICE_UNAVAILABLE,
                        [(axum::http::header::CONNECTION, "close")],
                        "too many authorized connections; try again",
                    )
                        .into_response()
                }
            },
        );
        let mut conn_app = app.clone().layer(shown);
        if let Some(token) = &bearer {
            conn_app = conn_app.layer(axum::middleware::from_fn_with_state(
                token.clone(),
                require_bearer,
            ));
        }
        // Served once counted, so its end is never noted before its start.
        let (counted, wait_counted) = tokio::sync::oneshot::channel::<()>();
        let handle = connections.spawn(async move {
            let _ = wait_counted.await;
            let _ = hyper::server::conn::http1::Builder::new()
                .timer(hyper_util::rt::TokioTimer::new())
                .header_read_timeout(IDLE_TIMEOUT)
                .serve_connection(
                    hyper_util::rt::TokioIo::new(tcp),
                    hyper_util::service::TowerToHyperService::new(conn_app),
                )
                .await;
        });
        waiting.admit(id, handle);
        let _ = counted.send(());
    }
}

/// Lets a request through only with `Authorization: Bearer <token>` (compared in time that does
/// not depend on where it differs); otherwise 401, and the MCP service never sees it.
async fn require_bearer(
    axum::extract::State(token): axum::extract::State<Arc<str>>,
    request: axum::extract::Request,
    next: axum::middleware::Next,
) -> axum::response::Response {
    use axum::response::IntoResponse as _;
    use subtle::ConstantTimeEq as _;
    let given = request
        .headers()
        .get(axum::http::header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "));
    if given.is_some_and(|g| bool::from(g.as_bytes().ct_eq(token.as_bytes()))) {
        next.run(request).await
    } else {
        tracing::warn!("MCP request without a valid bearer token refused");
        (
            axum::http::StatusCode::UNAUTHORIZED,
            [(axum::http::header::WWW_AUTHENTICATE, "Bearer")],
            "missing or wrong bearer token",
        )
            .into_response()
    }
}
