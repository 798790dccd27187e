//! The node's HTTPS face: card, per-kind obligation endpoints, custody-ack endpoint.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use abhyasa_moq::{agent_of, Identity};
use abhyasa_node::listen::{waiting_cap, AcceptBackoff, PerPeer, Waiting};
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
use tracing::{debug, info};

use crate::card::{AgentCard, ACK_PATH, CARD_PATH, EXTENSION_URI, MESSAGE_SEND_PATH};
use crate::json::{from_json, unknown_fields, JsonAck, JsonObligation};
use crate::A2aError;

/// How many times an obligation whose apply is still being written is handed to the receiver
/// again (after 10, 20, 40, 80 ms) before the answer is `503`.
const ACK_WAITS: u32 = 5;

/// Largest request body taken (an obligation is at most a few KiB).
pub const MAX_BODY: usize = 64 * 1024;

const CBOR: &str = "application/cbor";
const JSON: &str = "application/json";

/// How long a connection may take to finish its TLS handshake.
pub const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);
/// How long a connection may take to send a request's head, and may stay idle between
/// requests.
pub const IDLE_TIMEOUT: Duration = Duration::from_secs(30);

/// Connections one member (by its certificate's agent id) may hold past their handshake; a
/// new one beyond is closed at once. As many as this binding's own client keeps in flight
/// to one peer.
pub const MAX_CONNECTIONS_PER_MEMBER: usize = 64;

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
        .route(MESSAGE_SEND_PATH, post(post_message))
        .layer(DefaultBodyLimit::max(MAX_BODY))
        .with_state(shared);
    let task = tokio::spawn(async move {
        // Connections live in the accept task: stopping the server ends them too (a client's
        // kept-alive connection must not outlive the node it was talking to).
        let mut connections = tokio::task::JoinSet::new();
        // Connections still in their TLS handshake (no certificate shown yet): what a stranger
        // on the network can hold. At most `cap` at once; past it the oldest is closed.
        // A quarter of the descriptor limit (16..=1,024); the rest stay for the store, the
        // peers and the other listeners.
        let handshaking = Waiting::new(waiting_cap(4));
        // Connections past their handshake, per member: one member holding many takes no
        // other's place.
        let members: PerPeer<AgentId> = PerPeer::new(MAX_CONNECTIONS_PER_MEMBER);
        let mut backoff = AcceptBackoff::default();
        loop {
            while connections.try_join_next().is_some() {}
            let (tcp, from) = match listener.accept().await {
                Ok(x) => {
                    backoff.reset();
                    x
                }
                Err(e) => {
                    // EMFILE / ENFILE: descriptors run out; never a reason to stop serving.
                    backoff.failed("a2a", &e).await;
                    continue;
                }
            };
            let acceptor = acceptor.clone();
            let app = app.clone();
            let id = handshaking.next_id();
            let done = handshaking.clone();
            let members = members.clone();
            // The handshake starts once the connection is counted, so its end is never
            // noted before its start.
            let (counted, wait_counted) = tokio::sync::oneshot::channel::<()>();
            let handle = connections.spawn(async move {
                let _ = wait_counted.await;
                let tls = tokio::time::timeout(HANDSHAKE_TIMEOUT, acceptor.accept(tcp)).await;
                done.done(id);
                let tls = match tls {
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
                let Some(_slot) = members.claim(peer.clone()) else {
                    tracing::warn!(
                        %peer,
                        limit = MAX_CONNECTIONS_PER_MEMBER,
                        "a2a: a member's connection refused: it holds as many as it may"
                    );
                    return;
                };
                let svc = TowerToHyperService::new(app.layer(Extension(Peer(peer))));
                // A request's head must arrive within the timeout — also the next one on a
                // kept-alive connection, so an idle connection is closed after it.
                let _ = hyper::server::conn::http1::Builder::new()
                    .timer(hyper_util::rt::TokioTimer::new())
                    .header_read_timeout(IDLE_TIMEOUT)
                    .serve_connection(TokioIo::new(tls), svc)
                    .await;
            });
            handshaking.admit(id, handle);
            let _ = counted.send(());
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
    let ack = match deliver_one(&s, &peer, object, decoded.as_ref()).await {
        Ok(Delivered::Ack(ack)) => Some(ack),
        Ok(Delivered::BestEffort) => return StatusCode::ACCEPTED.into_response(),
        Ok(Delivered::NotYetDurable) => None,
        Err(r) => return r,
    };
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
        (R::OverLimit, Some(o)) => format!(
            "this agent holds as many governed records for issuer {} as it keeps for one \
             issuer ([limits] max_governed); the obligation would add one",
            o.issuer
        ),
        (R::UnknownKind, _) => "its kind is unknown to this agent".into(),
        _ => return None,
    })
}

/// What became of one obligation handed to the receiver.
enum Delivered {
    /// Its ack (applied, declined or deferred), durable.
    Ack(CustodyAck),
    /// A best-effort kind: taken, never acked.
    BestEffort,
    /// A repeat whose apply is still being written after the waits: deliver it again.
    NotYetDurable,
}

/// Hands `object` (from `peer`; `decoded` if it reads) to the receiver, waiting out a repeat
/// of an apply still being written.
async fn deliver_one(
    s: &Shared,
    peer: &AgentId,
    object: Vec<u8>,
    decoded: Option<&abhyasa_wire::Obligation>,
) -> Result<Delivered, Response> {
    for attempt in 0..ACK_WAITS {
        match s.node.deliver(peer.clone(), vec![object.clone()]).await {
            Ok(a) => {
                if let Some(ack) = a.into_iter().next().flatten() {
                    return Ok(Delivered::Ack(ack));
                }
            }
            Err(e) => return Err(node_error(e)),
        }
        match decoded {
            Some(o) if !abhyasa_custody::kinds::admissible(o) => return Ok(Delivered::BestEffort),
            Some(o) if &o.issuer != peer => {
                return Err(error(
                    StatusCode::FORBIDDEN,
                    format!(
                        "the obligation names issuer {}, signed in as {peer}",
                        o.issuer
                    ),
                ))
            }
            Some(_) => {}
            None => {
                return Err(error(
                    StatusCode::BAD_REQUEST,
                    "not an obligation the receiver can read or decline",
                ))
            }
        }
        // A repeat of an apply still being written: its ack comes once it is durable.
        tokio::time::sleep(Duration::from_millis(10 << attempt)).await;
    }
    Ok(Delivered::NotYetDurable)
}

/// An error in the shape of the A2A HTTP+JSON binding (`google.rpc.Status` under `error`),
/// which the A2A SDKs read.
fn a2a_error(status: StatusCode, message: impl std::fmt::Display) -> Response {
    let code = match status {
        StatusCode::BAD_REQUEST => "INVALID_ARGUMENT",
        StatusCode::FORBIDDEN => "PERMISSION_DENIED",
        StatusCode::SERVICE_UNAVAILABLE => "UNAVAILABLE",
        StatusCode::UNSUPPORTED_MEDIA_TYPE => "INVALID_ARGUMENT",
        _ => "INTERNAL",
    };
    let body = serde_json::json!({
        "error": { "code": status.as_u16(), "status": code, "message": message.to_string() }
    });
    (status, [(header::CONTENT_TYPE, JSON)], body.to_string()).into_response()
}

/// A2A `message:send` (the HTTP+JSON binding the card advertises): the obligations a
/// message carries as parts — `data` parts in the reference's JSON shape, or `raw` parts of
/// media type `application/cbor` holding our wire object — are delivered in order, and the
/// reply is a message with one `data` part per obligation: its CustodyAck in the reference's
/// JSON (or `{"obligation_id", "status": "best_effort"}` for a kind that is never acked). A
/// part that is not an obligation refuses the whole message (400 naming the part) and nothing
/// in it is delivered; parts of other kinds (text, files) are not obligations and are
/// refused the same way, so nothing is silently dropped.
async fn post_message(
    State(s): State<Shared>,
    Extension(Peer(peer)): Extension<Peer>,
    body: Bytes,
) -> Response {
    use base64::Engine as _;
    let request: serde_json::Value = match serde_json::from_slice(&body) {
        Ok(v) => v,
        Err(e) => {
            return a2a_error(
                StatusCode::BAD_REQUEST,
                format!("not a SendMessageRequest: {e}"),
            )
        }
    };
    let message = &request["message"];
    let Some(parts) = message["parts"].as_array().filter(|p| !p.is_empty()) else {
        return a2a_error(
            StatusCode::BAD_REQUEST,
            "message.parts: a message carrying obligations has at least one part",
        );
    };
    // Every part read before anything is delivered.
    let mut objects = Vec::with_capacity(parts.len());
    for (i, part) in parts.iter().enumerate() {
        let read = if let Some(data) = part.get("data") {
            serde_json::from_value::<JsonObligation>(data.clone())
                .map_err(|e| format!("not an obligation in the reference's JSON: {e}"))
                .and_then(|j| {
                    let o = j.to_wire(&peer).map_err(|e| e.to_string())?;
                    Ok((abhyasa_wire::encode(&o), Some(j.obligation_id), Some(o)))
                })
        } else if let Some(raw) = part.get("raw").and_then(|r| r.as_str()) {
            let media = part.get("mediaType").and_then(|m| m.as_str());
            if media != Some(CBOR) {
                Err(format!(
                    "a raw part must have mediaType {CBOR:?}, not {media:?}"
                ))
            } else {
                base64::engine::general_purpose::STANDARD
                    .decode(raw)
                    .map_err(|e| format!("raw is not base64: {e}"))
                    .map(|bytes| {
                        let o = abhyasa_wire::decode_obligation(&bytes).ok();
                        (bytes, None, o)
                    })
            }
        } else {
            Err(
                "neither a data part (an obligation in the reference's JSON) nor a raw \
                 application/cbor part"
                    .into(),
            )
        };
        match read {
            Ok(x) => objects.push(x),
            Err(why) => {
                return a2a_error(
                    StatusCode::BAD_REQUEST,
                    format!("message.parts[{i}]: {why}"),
                )
            }
        }
    }
    let mut replies = Vec::with_capacity(objects.len());
    for (object, spelled, decoded) in objects {
        let spelled = spelled.unwrap_or_else(|| {
            decoded
                .as_ref()
                .map(|o| crate::json::id_string(o.id))
                .unwrap_or_default()
        });
        let part = match deliver_one(&s, &peer, object, decoded.as_ref()).await {
            Ok(Delivered::Ack(ack)) => {
                let mut json = JsonAck::of(&ack, &spelled);
                json.detail = decline_detail(&ack, decoded.as_ref(), s.node.agent());
                serde_json::to_value(json).unwrap_or_default()
            }
            Ok(Delivered::BestEffort) => {
                serde_json::json!({ "obligation_id": spelled, "status": "best_effort" })
            }
            Ok(Delivered::NotYetDurable) => {
                return a2a_error(
                    StatusCode::SERVICE_UNAVAILABLE,
                    format!("the apply of {spelled} is not durable yet; send the message again"),
                )
            }
            Err(r) => return r,
        };
        replies.push(serde_json::json!({ "data": part, "mediaType": JSON }));
    }
    let mut reply = serde_json::json!({
        "messageId": format!("ack-{}", message["messageId"].as_str().unwrap_or("")),
        "role": "ROLE_AGENT",
        "parts": replies,
        "extensions": [EXTENSION_URI],
    });
    for echo in ["contextId", "taskId"] {
        if let Some(v) = message.get(echo) {
            reply[echo] = v.clone();
        }
    }
    (
        StatusCode::OK,
        [(header::CONTENT_TYPE, JSON)],
        serde_json::json!({ "message": reply }).to_string(),
    )
        .into_response()
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
