//! The node's HTTPS face: card, per-kind obligation endpoints, custody-ack endpoint.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use abhyasa_moq::{agent_of, Identity};
use abhyasa_node::{Node, NodeError};
use abhyasa_wire::{AgentId, CustodyAck, Kind};
use axum::body::Bytes;
use axum::extract::{DefaultBodyLimit, Path, State};
use axum::http::{header, HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Extension, Router};
use hyper_util::rt::TokioIo;
use hyper_util::service::TowerToHyperService;
use tokio::net::TcpListener;
use tokio::task::JoinHandle;
use tracing::{debug, info, warn};

use crate::card::{AgentCard, ACK_PATH, CARD_PATH};
use crate::json::{from_json, unknown_fields, JsonAck, JsonObligation};
use crate::A2aError;

/// How many times an obligation whose apply is still being written is handed to the receiver
/// again (after 10, 20, 40, 80 ms) before the answer is `503`.
const ACK_WAITS: u32 = 5;

/// Largest request body taken (an obligation is at most a few KiB).
pub const MAX_BODY: usize = 64 * 1024;

const CBOR: &str = "application/cbor";
const JSON: &str = "application/json";

/// A running A2A server.
pub struct A2aServer {
    local_addr: SocketAddr,
    task: JoinHandle<()>,
}

impl A2aServer {
    /// Where it listens.
    pub fn local_addr(&self) -> SocketAddr {
        self.local_addr
    }

    /// Stops accepting connections.
    pub fn abort(&self) {
        self.task.abort();
    }
}

impl Drop for A2aServer {
    fn drop(&mut self) {
        self.task.abort();
    }
}

#[derive(Clone)]
struct Shared {
    node: Node,
    card: Arc<Vec<u8>>,
}

/// The authenticated client.
#[derive(Clone)]
struct Peer(AgentId);

/// Serves `card` and the binding's endpoints for `node` on `listen`, over HTTPS with
/// `identity` (client certificates from the deployment CA required).
pub async fn serve(
    node: Node,
    identity: &Identity,
    listen: SocketAddr,
    card: &AgentCard,
) -> Result<A2aServer, A2aError> {
    let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(crate::tls::server(identity)?));
    let listener = TcpListener::bind(listen).await?;
    let local_addr = listener.local_addr()?;
    let shared = Shared {
        node,
        card: Arc::new(serde_json::to_vec_pretty(card).unwrap_or_default()),
    };
    let app = Router::new()
        .route(CARD_PATH, get(get_card))
        .route("/abhyasa/v1/obligations/{kind}", post(post_obligation))
        .route(ACK_PATH, post(post_ack))
        .layer(DefaultBodyLimit::max(MAX_BODY))
        .with_state(shared);
    let task = tokio::spawn(async move {
        // Connections live in the accept task: stopping the server ends them too (a client's
        // kept-alive connection must not outlive the node it was talking to).
        let mut connections = tokio::task::JoinSet::new();
        loop {
            while connections.try_join_next().is_some() {}
            let (tcp, from) = match listener.accept().await {
                Ok(x) => x,
                Err(e) => {
                    warn!("a2a: accept: {e}");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            };
            let acceptor = acceptor.clone();
            let app = app.clone();
            connections.spawn(async move {
                let tls = match tokio::time::timeout(Duration::from_secs(10), acceptor.accept(tcp))
                    .await
                {
                    Ok(Ok(tls)) => tls,
                    Ok(Err(e)) => {
                        debug!("a2a: TLS from {from}: {e}");
                        return;
                    }
                    Err(_) => return,
                };
                let peer = tls
                    .get_ref()
                    .1
                    .peer_certificates()
                    .and_then(|c| c.first())
                    .and_then(|c| agent_of(c).ok());
                let Some(peer) = peer else {
                    debug!("a2a: {from} presented no agent certificate");
                    return;
                };
                let svc = TowerToHyperService::new(app.layer(Extension(Peer(peer))));
                let _ = hyper::server::conn::http1::Builder::new()
                    .serve_connection(TokioIo::new(tls), svc)
                    .await;
            });
        }
    });
    Ok(A2aServer { local_addr, task })
}

async fn get_card(State(s): State<Shared>) -> Response {
    ([(header::CONTENT_TYPE, JSON)], s.card.as_ref().clone()).into_response()
}

fn error(status: StatusCode, message: impl std::fmt::Display) -> Response {
    let body = serde_json::json!({ "error": message.to_string() });
    (status, [(header::CONTENT_TYPE, JSON)], body.to_string()).into_response()
}

/// `true` for CBOR, `false` for JSON; `None` for anything else.
fn is_cbor(headers: &HeaderMap) -> Option<bool> {
    let ct = headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("");
    let ct = ct.split(';').next().unwrap_or("").trim();
    match ct {
        CBOR => Some(true),
        JSON => Some(false),
        _ => None,
    }
}

fn node_error(e: NodeError) -> Response {
    match e {
        // The commit's outcome is unknown or the node is going down: the custodian retries.
        NodeError::IssueAgain { .. } | NodeError::Stopped => {
            error(StatusCode::SERVICE_UNAVAILABLE, format!("try again: {e}"))
        }
        e => error(StatusCode::INTERNAL_SERVER_ERROR, e),
    }
}

async fn post_obligation(
    State(s): State<Shared>,
    Extension(Peer(peer)): Extension<Peer>,
    Path(kind): Path<String>,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let Some(kind) = Kind::from_name(&kind) else {
        return error(
            StatusCode::NOT_FOUND,
            format!("no endpoint for kind {kind:?}"),
        );
    };
    let Some(cbor) = is_cbor(&headers) else {
        return error(
            StatusCode::UNSUPPORTED_MEDIA_TYPE,
            "send application/cbor or application/json",
        );
    };
    // The object for the receiver, and how the issuer spelled its id (for a JSON answer).
    let (object, spelled) = if cbor {
        // What does not decode still goes to the receiver: it declines what it can read the
        // envelope of, and ignores the rest (the custodian then retries and escalates).
        if let Ok(o) = abhyasa_wire::decode_obligation(&body) {
            if o.kind() != kind {
                return error(
                    StatusCode::BAD_REQUEST,
                    format!(
                        "a {} obligation posted to the {kind:?} endpoint",
                        o.kind().as_str()
                    ),
                );
            }
        }
        (body.to_vec(), None)
    } else {
        let j: JsonObligation = match from_json("obligation", &body) {
            Ok(j) => j,
            Err(e) => return error(StatusCode::BAD_REQUEST, e),
        };
        let ignored = unknown_fields(&body);
        if !ignored.is_empty() {
            info!(%peer, fields = ?ignored, "a2a: ignored fields this binding does not know");
        }
        if j.kind != kind.as_str() {
            return error(
                StatusCode::BAD_REQUEST,
                format!(
                    "a {} obligation posted to the {} endpoint",
                    j.kind,
                    kind.as_str()
                ),
            );
        }
        match j.to_wire(&peer) {
            Ok(o) => (abhyasa_wire::encode(&o), Some(j.obligation_id)),
            Err(e) => return error(StatusCode::BAD_REQUEST, e),
        }
    };
    let decoded = abhyasa_wire::decode_obligation(&object).ok();
    let mut ack = None;
    for attempt in 0..ACK_WAITS {
        match s.node.deliver(peer.clone(), vec![object.clone()]).await {
            Ok(a) => ack = a.into_iter().next().flatten(),
            Err(e) => return node_error(e),
        }
        if ack.is_some() {
            break;
        }
        match &decoded {
            // Best effort: taken, never acked.
            Some(o) if !abhyasa_custody::kinds::admissible(o) => {
                return StatusCode::ACCEPTED.into_response()
            }
            Some(o) if o.issuer != peer => {
                return error(
                    StatusCode::FORBIDDEN,
                    format!(
                        "the obligation names issuer {}, signed in as {peer}",
                        o.issuer
                    ),
                )
            }
            Some(_) => {}
            None => {
                return error(
                    StatusCode::BAD_REQUEST,
                    "not an obligation the receiver can read or decline",
                )
            }
        }
        // A repeat of an apply still being written: its ack comes once it is durable.
        tokio::time::sleep(Duration::from_millis(10 << attempt)).await;
    }
    match ack {
        Some(ack) => match spelled {
            None => (
                StatusCode::OK,
                [(header::CONTENT_TYPE, CBOR)],
                abhyasa_wire::encode(&ack),
            )
                .into_response(),
            Some(id) => {
                let mut json = JsonAck::of(&ack, &id);
                json.detail = decline_detail(&ack, decoded.as_ref(), s.node.agent());
                (
                    StatusCode::OK,
                    [(header::CONTENT_TYPE, JSON)],
                    serde_json::to_string(&json).unwrap_or_default(),
                )
                    .into_response()
            }
        },
        // Still being written after the waits: the custodian delivers it again.
        None => error(
            StatusCode::SERVICE_UNAVAILABLE,
            "the apply is not durable yet; deliver it again",
        ),
    }
}

/// A decline in words, for the person reading a JSON answer.
fn decline_detail(
    ack: &CustodyAck,
    o: Option<&abhyasa_wire::Obligation>,
    me: &AgentId,
) -> Option<String> {
    let abhyasa_wire::AckStatus::Declined(reason) = ack.status else {
        return None;
    };
    use abhyasa_wire::DeclineReason as R;
    Some(match (reason, o) {
        (R::Refused, Some(o)) if &o.target != me => format!(
            "not addressed to this agent: the obligation names target {}, this is {me}",
            o.target
        ),
        (R::IdConflict, _) => "this obligation id was applied with other content; \
                               an obligation needs an id of its own"
            .into(),
        (R::Expired, Some(o)) => format!(
            "past its deadline ({}) on arrival",
            crate::json::format_time(o.deadline)
        ),
        (R::Superseded, _) => {
            "its sequence is not newer than the last applied on its governed key".into()
        }
        (R::Malformed, _) => "its payload cannot be read".into(),
        (R::UnknownKind, _) => "its kind is unknown to this agent".into(),
        _ => return None,
    })
}

async fn post_ack(
    State(s): State<Shared>,
    Extension(Peer(peer)): Extension<Peer>,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let ack: CustodyAck = match is_cbor(&headers) {
        Some(true) => match abhyasa_wire::decode(&body) {
            Ok(a) => a,
            Err(e) => return error(StatusCode::BAD_REQUEST, format!("not a CustodyAck: {e}")),
        },
        Some(false) => match from_json::<JsonAck>("ack", &body).and_then(|j| j.to_wire()) {
            Ok(a) => a,
            Err(e) => return error(StatusCode::BAD_REQUEST, e),
        },
        None => {
            return error(
                StatusCode::UNSUPPORTED_MEDIA_TYPE,
                "send application/cbor or application/json",
            )
        }
    };
    if ack.target != peer {
        return error(
            StatusCode::FORBIDDEN,
            format!("an ack from {} signed in as {peer}", ack.target),
        );
    }
    match s.node.acks_in(peer, vec![ack]).await {
        Ok(()) => StatusCode::NO_CONTENT.into_response(),
        Err(e) => node_error(e),
    }
}
