//! What people see of a node (docs/OPERATOR.md): on one loopback listener, behind the admin
//! key (as `Authorization: Bearer <key>`, or as the password of HTTP Basic, which a browser
//! asks its user for),
//!
//! - `GET /metrics`: the node's counters and levels in the Prometheus text format;
//! - `GET /`: the console, one server-rendered page — what is pending, recent outcomes with
//!   their attempts, escalations with the safe action applied, the decisions in force and what
//!   this node honours, leases, budget by bucket and by child;
//! - `GET /events`: the console's live part, re-rendered and pushed as a server-sent event
//!   (`view`) whenever the node reports something, and at least every second while anything
//!   is pending (attempts and deadlines move).

#![warn(missing_docs, unreachable_pub)]

pub mod console;
pub mod metrics;

use std::convert::Infallible;
use std::net::SocketAddr;
use std::time::Duration;

use abhyasa_node::ledger::LedgerStatus;
use abhyasa_node::{LedgerCommand, LedgerReply, Node, Status};
use axum::http::header;
use axum::response::sse::{Event, KeepAlive, Sse};
use axum::response::{Html, IntoResponse, Response};
use axum::routing::get;

/// The longest the console waits before it looks again.
const TICK: Duration = Duration::from_secs(1);
/// Changes closer together than this are pushed as one.
const COALESCE: Duration = Duration::from_millis(150);

/// Where and how to serve.
#[derive(Clone, Debug)]
pub struct ObserveConfig {
    /// A loopback address.
    pub listen: SocketAddr,
    /// The key every request must show; `None` only where every local user is trusted.
    pub key: Option<String>,
}

/// Why the listener did not start.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ObserveError {
    /// The listener could not be bound.
    #[error(transparent)]
    Http(#[from] abhyasa_http::HttpError),
}

/// What the node holds now: its status and, if it takes part in the ledger, its ledger.
async fn snapshot(node: &Node) -> Option<(Status, Option<LedgerStatus>)> {
    let status = node.status().await.ok()?;
    let ledger = match node.ledger(LedgerCommand::Status).await {
        Ok(LedgerReply::Status(s)) => Some(*s),
        _ => None,
    };
    Some((status, ledger))
}

fn stopped() -> Response {
    (
        axum::http::StatusCode::SERVICE_UNAVAILABLE,
        "the node has stopped",
    )
        .into_response()
}

async fn metrics_text(node: Node) -> Response {
    let Some((status, ledger)) = snapshot(&node).await else {
        return stopped();
    };
    (
        [(
            header::CONTENT_TYPE,
            prometheus_client::encoding::prometheus_text::CONTENT_TYPE,
        )],
        metrics::render(node.metrics(), &status, ledger.as_ref()),
    )
        .into_response()
}

async fn console_page(node: Node) -> Response {
    let Some((status, ledger)) = snapshot(&node).await else {
        return stopped();
    };
    (
        [(header::CACHE_CONTROL, "no-store")],
        Html(console::page(&status, ledger.as_ref()).into_string()),
    )
        .into_response()
}

/// The live part, pushed whenever it changes.
fn live_events(
    node: Node,
) -> Sse<impl futures_util::Stream<Item = Result<Event, Infallible>> + Send + 'static> {
    let events = node.events();
    let stream = futures_util::stream::unfold(
        (node, events, None::<String>),
        |(node, mut events, last)| async move {
            let mut first = last.is_none();
            loop {
                if !first {
                    // Wake on the node's next report, or the tick; then take whatever else
                    // came meanwhile, so a burst is one push.
                    tokio::select! {
                        r = events.recv() => {
                            if matches!(r, Err(tokio::sync::broadcast::error::RecvError::Closed)) {
                                return None;
                            }
                            tokio::time::sleep(COALESCE).await;
                            while events.try_recv().is_ok() {}
                        }
                        () = tokio::time::sleep(TICK) => {}
                    }
                }
                first = false;
                let (status, ledger) = snapshot(&node).await?;
                let html = console::live(&status, ledger.as_ref()).into_string();
                if last.as_deref() != Some(html.as_str()) {
                    let event = Event::default().event("view").data(&html);
                    return Some((Ok(event), (node, events, Some(html))));
                }
            }
        },
    );
    Sse::new(stream).keep_alive(KeepAlive::new().interval(Duration::from_secs(15)))
}

/// A running listener; dropping it stops it.
pub struct Server {
    inner: abhyasa_http::Server,
}

impl Server {
    /// Where it listens.
    pub fn local_addr(&self) -> SocketAddr {
        self.inner.local_addr()
    }
}

/// Serves the metrics and the console of `node`.
pub async fn serve(node: Node, config: ObserveConfig) -> Result<Server, ObserveError> {
    let bound = abhyasa_http::bind(config.listen).await?;
    let app = axum::Router::new()
        .route(
            "/metrics",
            get({
                let node = node.clone();
                move || metrics_text(node.clone())
            }),
        )
        .route(
            "/",
            get({
                let node = node.clone();
                move || console_page(node.clone())
            }),
        )
        .route(
            "/events",
            get({
                let node = node.clone();
                move || {
                    let node = node.clone();
                    async move { live_events(node) }
                }
            }),
        );
    let key = config.key.map(|k| abhyasa_http::Key::bearer(k).basic());
    Ok(Server {
        inner: abhyasa_http::serve(bound, app, key, "console"),
    })
}
