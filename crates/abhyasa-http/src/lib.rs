//! The plain-HTTP listener that Abhyasa's local HTTP faces share (MCP over streamable HTTP,
//! the enforcement points): whoever reaches one acts with the node's authority, so
//!
//! - it listens on loopback only ([`bind`] refuses any other address);
//! - every request must carry the key the face was given — `Authorization: Bearer <key>`, or
//!   where the `Authorization` header belongs to someone else (a proxy's check forwards the
//!   end user's), a header of the face's choosing ([`Key::header`]); the comparison takes time
//!   that does not depend on where the key differs; a request without it is answered 401 and
//!   reaches nothing;
//! - connections that have not yet shown the key are counted, and past a quarter of the
//!   descriptor limit the oldest is closed for the new one; connections past the check share
//!   one cap of the same size (every holder of the key is one peer), past which the answer is
//!   503 and the connection is closed ([`abhyasa_node::listen`]);
//! - a request's head must arrive within [`IDLE_TIMEOUT`], and a failed `accept` (descriptors
//!   exhausted) is retried with backoff, never ending the listener.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use abhyasa_node::listen::{waiting_cap, AcceptBackoff, PeerSlot, PerPeer, Waiting};
use axum::http::{header, HeaderName, StatusCode};
use axum::response::IntoResponse as _;
use tokio::task::JoinHandle;

/// How long a connection may take to send a request's head, and may stay idle between
/// requests (a response in progress, such as an event stream, is not idle).
pub const IDLE_TIMEOUT: Duration = Duration::from_secs(30);

/// Why a listener did not start.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum HttpError {
    /// Not a loopback address.
    #[error("{0} is not a loopback address: a plain-HTTP face of the node must stay on this host")]
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

/// The key every request must show.
#[derive(Clone, Debug)]
pub struct Key {
    secret: Arc<str>,
    header: Option<HeaderName>,
    basic: bool,
}

impl Key {
    /// A key shown as `Authorization: Bearer <secret>`.
    pub fn bearer(secret: impl Into<Arc<str>>) -> Self {
        Self {
            secret: secret.into(),
            header: None,
            basic: false,
        }
    }

    /// Also accepts the key as the password of HTTP Basic authentication (any user name): how
    /// OAuth clients authenticate to an authorization server's endpoints (RFC 6749 §2.3.1,
    /// `client_secret_basic`), which RFC 7662 and RFC 7009 callers use.
    pub fn basic(mut self) -> Self {
        self.basic = true;
        self
    }

    /// Also accepts the key as the whole value of `header` (for requests whose
    /// `Authorization` header is the end user's, as a proxy's check forwards it).
    pub fn header(mut self, header: HeaderName) -> Self {
        self.header = Some(header);
        self
    }

    /// Whether `headers` show the key.
    pub fn shown(&self, headers: &axum::http::HeaderMap) -> bool {
        use subtle::ConstantTimeEq as _;
        let matches = |given: &str| bool::from(given.as_bytes().ct_eq(self.secret.as_bytes()));
        let bearer = headers
            .get_all(header::AUTHORIZATION)
            .iter()
            .filter_map(|v| v.to_str().ok())
            .filter_map(|v| v.strip_prefix("Bearer "))
            .any(matches);
        let basic = self.basic
            && headers
                .get_all(header::AUTHORIZATION)
                .iter()
                .filter_map(|v| v.to_str().ok())
                .filter_map(|v| v.strip_prefix("Basic "))
                .filter_map(|b| {
                    use base64::Engine as _;
                    base64::engine::general_purpose::STANDARD
                        .decode(b.trim())
                        .ok()
                })
                .filter_map(|b| String::from_utf8(b).ok())
                .any(|pair| {
                    pair.split_once(':')
                        .is_some_and(|(_, password)| matches(password))
                });
        let own = self.header.as_ref().is_some_and(|h| {
            headers
                .get_all(h)
                .iter()
                .filter_map(|v| v.to_str().ok())
                .any(matches)
        });
        bearer || basic || own
    }
}

/// A bound listener, not yet serving.
pub struct Bound {
    listener: tokio::net::TcpListener,
    local_addr: SocketAddr,
}

impl Bound {
    /// Where it listens.
    pub fn local_addr(&self) -> SocketAddr {
        self.local_addr
    }
}

/// Binds `addr`, which must be a loopback address.
pub async fn bind(addr: SocketAddr) -> Result<Bound, HttpError> {
    if !addr.ip().is_loopback() {
        return Err(HttpError::NotLoopback(addr));
    }
    let listener = tokio::net::TcpListener::bind(addr)
        .await
        .map_err(|source| HttpError::Bind { addr, source })?;
    let local_addr = listener
        .local_addr()
        .map_err(|source| HttpError::Bind { addr, source })?;
    Ok(Bound {
        listener,
        local_addr,
    })
}

/// A running listener; dropping it stops it and every connection it holds.
pub struct Server {
    local_addr: SocketAddr,
    task: JoinHandle<()>,
}

impl Server {
    /// Where it listens.
    pub fn local_addr(&self) -> SocketAddr {
        self.local_addr
    }

    /// Runs until the server stops.
    pub async fn wait(mut self) {
        let _ = (&mut self.task).await;
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// Serves `app` on `bound`. With `key`, a request that does not show it is answered 401 and
/// reaches nothing (`None` only where every local user is trusted: tests and benchmarks).
/// `label` names the face in logs.
pub fn serve(bound: Bound, app: axum::Router, key: Option<Key>, label: &'static str) -> Server {
    let local_addr = bound.local_addr;
    let task = tokio::spawn(accept_loop(bound.listener, app, key, label));
    Server { local_addr, task }
}

/// Accepts until the server is dropped. A connection counts as waiting until a request of
/// it passes the key check; at most a quarter of the descriptor limit wait (16..=1,024), past
/// it the oldest is closed. A failed accept (EMFILE) is retried with backoff.
async fn accept_loop(
    listener: tokio::net::TcpListener,
    app: axum::Router,
    key: Option<Key>,
    label: &'static str,
) {
    // Connections live in this task: dropping the server ends them too.
    let mut connections = tokio::task::JoinSet::new();
    let waiting = Waiting::new(waiting_cap(4));
    // Connections whose request passed the key check: every holder of the key is one peer
    // here, so they share one cap (a quarter of the descriptor limit too).
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
                backoff.failed(label, &e).await;
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
                    tracing::warn!("{label} connection refused: as many authorized as allowed");
                    (
                        StatusCode::SERVICE_UNAVAILABLE,
                        [(header::CONNECTION, "close")],
                        "too many authorized connections; try again",
                    )
                        .into_response()
                }
            },
        );
        let mut conn_app = app.clone().layer(shown);
        if let Some(key) = &key {
            let key = key.clone();
            conn_app = conn_app.layer(axum::middleware::from_fn(
                move |request: axum::extract::Request, next: axum::middleware::Next| {
                    let shown = key.shown(request.headers());
                    let basic = key.basic;
                    async move {
                        if shown {
                            return next.run(request).await;
                        }
                        tracing::warn!("{label} request without a valid key refused");
                        let mut refusal = (
                            StatusCode::UNAUTHORIZED,
                            [(header::WWW_AUTHENTICATE, "Bearer")],
                            "missing or wrong bearer token",
                        )
                            .into_response();
                        if basic {
                            // A browser asks its user for the key (as the password) on this
                            // challenge, and shows it on every request after.
                            refusal.headers_mut().append(
                                header::WWW_AUTHENTICATE,
                                axum::http::HeaderValue::from_static(
                                    "Basic realm=\"abhyasa\", charset=\"UTF-8\"",
                                ),
                            );
                        }
                        refusal
                    }
                },
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

#[cfg(test)]
mod tests {
    use super::*;
    use axum::http::{HeaderMap, HeaderValue};

    fn with(name: &str, value: &str) -> HeaderMap {
        let mut h = HeaderMap::new();
        h.insert(
            HeaderName::from_bytes(name.as_bytes()).unwrap(),
            HeaderValue::from_str(value).unwrap(),
        );
        h
    }

    #[test]
    fn a_key_is_shown_only_where_the_face_accepts_it() {
        let secret = "0123456789abcdef";
        // base64("rs:0123456789abcdef"), base64("rs:wrong")
        let basic_ok = "Basic cnM6MDEyMzQ1Njc4OWFiY2RlZg==";
        let basic_wrong = "Basic cnM6d3Jvbmc=";
        let bearer = Key::bearer(secret);
        assert!(bearer.shown(&with("authorization", "Bearer 0123456789abcdef")));
        assert!(!bearer.shown(&with("authorization", "Bearer 0123456789abcdeF")));
        assert!(!bearer.shown(&with("authorization", basic_ok)));
        assert!(!bearer.shown(&with("abhyasa-key", secret)));
        let all = Key::bearer(secret)
            .header(HeaderName::from_static("abhyasa-key"))
            .basic();
        assert!(all.shown(&with("authorization", basic_ok)));
        assert!(!all.shown(&with("authorization", basic_wrong)));
        assert!(!all.shown(&with("authorization", "Basic !!!")));
        assert!(all.shown(&with("abhyasa-key", secret)));
        assert!(!all.shown(&with("abhyasa-key", "Bearer 0123456789abcdef")));
        assert!(!all.shown(&HeaderMap::new()));
    }
}
