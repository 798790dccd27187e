//! Enforcement points: the principal's node as the decision point that existing
//! infrastructure already knows how to ask.
//!
//! A revocation is the principal's own decision, in force on its side the moment it is
//! issued; custody carries it to the agent. These endpoints make "its side" reach the
//! services that actually let authority be exercised:
//!
//! - `POST /oauth2/introspect` — OAuth 2.0 Token Introspection (RFC 7662). A token this node
//!   revoked (or whose revocation escalated) is `{"active": false}` from the moment the
//!   revocation is issued; any other token is answered by the upstream introspection endpoint
//!   when one is configured (the node as a filtering proxy in front of the real authorization
//!   server: an upstream `active` answer past its own `exp`, or for a token revoked while the
//!   upstream was asked, is turned inactive), else `{"active": false}` with the reason logged.
//!   A refusal names the obligation in the `Abhyasa-Obligation` response header, leaving the
//!   body the RFC's shape.
//! - `POST /oauth2/revoke` — OAuth 2.0 Token Revocation (RFC 7009): the revocation becomes a
//!   custody obligation to each agent that holds the token ([`EnforceConfig::holders`]); the
//!   answer (200) comes once the node has admitted them, and the token is refused from then on.
//! - `/authz` and `/authz/<anything>`, any method — a check for proxies, compatible with nginx
//!   `auth_request` and Envoy's `ext_authz` (HTTP mode): the request names the agent
//!   (`Abhyasa-Agent`), and the scopes it exercises (`Abhyasa-Scope`, comma-separated or
//!   repeated) or the bearer token it presents (`Authorization: Bearer …`, as the proxy
//!   forwards it). 200 allows; 403 refuses, naming the obligation (`Abhyasa-Obligation`), where
//!   it stands (`Abhyasa-Obligation-State`: pending, applied, declined, escalated) and why
//!   (`Abhyasa-Refusal`). A check that names no agent for a scope, or names a scope or token
//!   that is not a valid name, is refused too: a proxy check fails closed.
//!
//! Every request must show the node's enforcement key: `Authorization: Bearer <key>`, or as
//! OAuth clients authenticate, HTTP Basic with the key as the password (any client id), or
//! for `/authz`, whose `Authorization` header is the end user's, `Abhyasa-Key: <key>`. The
//! listener is loopback only ([`abhyasa_http`]).

pub mod nginx;

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use abhyasa_node::{Ask, Node, NodeError, Verdict};
use abhyasa_wire::{
    AgentId, ClientId, Obligation, ObligationId, Payload, Scope, TokenAction, TokenId,
    TokenPayload, UnixMillis,
};
use axum::http::{HeaderMap, HeaderName, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use tracing::{info, warn};

pub use abhyasa_http::{HttpError, Server};

/// The header that names the agent in a proxy check.
pub const AGENT_HEADER: HeaderName = HeaderName::from_static("abhyasa-agent");
/// The header that names the scopes a proxied call exercises.
pub const SCOPE_HEADER: HeaderName = HeaderName::from_static("abhyasa-scope");
/// The header a proxy shows the enforcement key in (its `Authorization` is the end user's).
pub const KEY_HEADER: HeaderName = HeaderName::from_static("abhyasa-key");
/// The response header naming the obligation behind a refusal (32 hex digits).
pub const OBLIGATION_HEADER: HeaderName = HeaderName::from_static("abhyasa-obligation");
/// The response header saying where that obligation stands.
pub const STATE_HEADER: HeaderName = HeaderName::from_static("abhyasa-obligation-state");
/// The response header saying why a check was refused, in words.
pub const REFUSAL_HEADER: HeaderName = HeaderName::from_static("abhyasa-refusal");

/// The most scopes one check may name.
pub const MAX_SCOPES: usize = 32;
/// The largest form body taken (introspection and revocation requests are a few hundred
/// bytes).
pub const MAX_FORM: usize = 16 * 1024;
/// How long the upstream introspection endpoint may take before the answer fails closed.
pub const UPSTREAM_TIMEOUT: Duration = Duration::from_secs(5);

/// An upstream introspection endpoint: the real authorization server, asked about tokens
/// this node does not govern.
#[derive(Clone, Debug)]
pub struct Upstream {
    /// Its introspection URL (`http://` or `https://`).
    pub url: String,
    /// The `Authorization` header value this node presents to it (RFC 7662 §2.1: the
    /// protected resource authenticates), e.g. `Basic …` or `Bearer …`.
    pub authorization: Option<String>,
    /// Roots for an `https://` URL (none: only `http://` works).
    pub roots: Option<rustls::RootCertStore>,
}

/// What the enforcement points serve, and how.
#[derive(Clone, Debug)]
pub struct EnforceConfig {
    /// Where to listen (loopback only).
    pub listen: SocketAddr,
    /// The key every request must show (`None` only where every local user is trusted:
    /// tests).
    pub key: Option<String>,
    /// The authorization server asked about tokens this node does not govern.
    pub upstream: Option<Upstream>,
    /// The agents an RFC 7009 revocation is carried to (the token's holders); with none,
    /// `/oauth2/revoke` answers 503.
    pub holders: Vec<AgentId>,
    /// The deadline given to a revocation's obligations.
    pub revoke_deadline: Duration,
    /// The client id a revocation names when the request gives none.
    pub client_id: ClientId,
}

impl EnforceConfig {
    /// Loopback `listen`, no key, no upstream, no holders, 30 s revocation deadline.
    pub fn new(listen: SocketAddr) -> Self {
        Self {
            listen,
            key: None,
            upstream: None,
            holders: Vec::new(),
            revoke_deadline: Duration::from_secs(30),
            client_id: ClientId::new("abhyasa-enforce").expect("a valid client id"),
        }
    }
}

/// Why the enforcement points did not start.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum EnforceError {
    /// The listener.
    #[error(transparent)]
    Http(#[from] HttpError),
    /// The upstream client could not be built.
    #[error("upstream introspection client: {0}")]
    Upstream(#[from] reqwest::Error),
    /// The upstream client's TLS could not be set up.
    #[error("upstream introspection TLS: {0}")]
    Tls(#[from] rustls::Error),
}

struct State {
    node: Node,
    config: EnforceConfig,
    upstream: Option<reqwest::Client>,
}

/// Serves the enforcement points for `node` (which acts as the principal) until the returned
/// server is dropped.
pub async fn serve(node: Node, config: EnforceConfig) -> Result<Server, EnforceError> {
    let bound = abhyasa_http::bind(config.listen).await?;
    let upstream = match &config.upstream {
        None => None,
        Some(u) => {
            // Roots only for an `https://` upstream; with none, `http://` alone works.
            let roots = u.roots.clone().unwrap_or_else(rustls::RootCertStore::empty);
            let provider = Arc::new(rustls::crypto::ring::default_provider());
            let tls = rustls::ClientConfig::builder_with_provider(provider)
                .with_safe_default_protocol_versions()?
                .with_root_certificates(roots)
                .with_no_client_auth();
            let b = reqwest::Client::builder()
                .timeout(UPSTREAM_TIMEOUT)
                .redirect(reqwest::redirect::Policy::none())
                .use_preconfigured_tls(tls);
            Some(b.build()?)
        }
    };
    let key = config
        .key
        .clone()
        .map(|k| abhyasa_http::Key::bearer(k).header(KEY_HEADER).basic());
    let state = Arc::new(State {
        node,
        config,
        upstream,
    });
    let app = axum::Router::new()
        .route(
            "/oauth2/introspect",
            axum::routing::post(introspect).with_state(state.clone()),
        )
        .route(
            "/oauth2/revoke",
            axum::routing::post(revoke).with_state(state.clone()),
        )
        .route(
            "/authz",
            axum::routing::any(check).with_state(state.clone()),
        )
        .route(
            "/authz/{*rest}",
            axum::routing::any(check).with_state(state),
        );
    Ok(abhyasa_http::serve(bound, app, key, "enforce"))
}

/// The fields of an introspection or revocation request that the node reads.
#[derive(serde::Deserialize)]
struct TokenForm {
    token: Option<String>,
    #[allow(dead_code)]
    token_type_hint: Option<String>,
    client_id: Option<String>,
}

fn oauth_error(status: StatusCode, error: &str, description: &str) -> Response {
    (
        status,
        [(axum::http::header::CACHE_CONTROL, "no-store")],
        axum::Json(serde_json::json!({"error": error, "error_description": description})),
    )
        .into_response()
}

fn inactive(refusal: Option<&abhyasa_node::Refusal>) -> Response {
    let mut headers = HeaderMap::new();
    headers.insert(
        axum::http::header::CACHE_CONTROL,
        HeaderValue::from_static("no-store"),
    );
    if let Some(r) = refusal {
        name_refusal(&mut headers, r);
    }
    (
        StatusCode::OK,
        headers,
        axum::Json(serde_json::json!({"active": false})),
    )
        .into_response()
}

fn name_refusal(headers: &mut HeaderMap, r: &abhyasa_node::Refusal) {
    if let Some(id) = r.obligation {
        if let Ok(v) = HeaderValue::from_str(&id.to_string()) {
            headers.insert(OBLIGATION_HEADER, v);
        }
    }
    if let Ok(v) = HeaderValue::from_str(&r.carried.to_string()) {
        headers.insert(STATE_HEADER, v);
    }
}

/// Reads a form body, refusing one that is too large or does not read.
async fn read_form(body: axum::body::Body) -> Result<TokenForm, Response> {
    let bytes = axum::body::to_bytes(body, MAX_FORM).await.map_err(|_| {
        oauth_error(
            StatusCode::PAYLOAD_TOO_LARGE,
            "invalid_request",
            "the request body is too large",
        )
    })?;
    serde_urlencoded::from_bytes(&bytes).map_err(|e| {
        oauth_error(
            StatusCode::BAD_REQUEST,
            "invalid_request",
            &format!("the body is not a form: {e}"),
        )
    })
}

/// Reads a form body and its required `token` parameter.
async fn read_token_form(body: axum::body::Body) -> Result<(String, TokenForm), Response> {
    let mut form = read_form(body).await?;
    match form.token.take().filter(|t| !t.is_empty()) {
        Some(token) => Ok((token, form)),
        None => Err(oauth_error(
            StatusCode::BAD_REQUEST,
            "invalid_request",
            "the token parameter is required",
        )),
    }
}

fn unavailable(e: &NodeError) -> Response {
    oauth_error(
        StatusCode::SERVICE_UNAVAILABLE,
        "temporarily_unavailable",
        &e.to_string(),
    )
}

async fn introspect(
    axum::extract::State(state): axum::extract::State<Arc<State>>,
    body: axum::body::Body,
) -> Response {
    let (raw, _) = match read_token_form(body).await {
        Ok(t) => t,
        Err(r) => return r,
    };
    // A token that is not a valid name here was never revoked here: only the upstream can
    // say anything about it.
    let governed = TokenId::new(raw.clone()).ok();
    if let Some(token) = &governed {
        match state.node.decide(Ask::Token(token.clone())).await {
            Ok(Verdict::Refuse(r)) => {
                info!(obligation = ?r.obligation, state = %r.carried, "introspection: revoked");
                return inactive(Some(&r));
            }
            Ok(_) => {}
            Err(e) => return unavailable(&e),
        }
    }
    let (Some(upstream), Some(client)) = (&state.config.upstream, &state.upstream) else {
        warn!("introspection: a token this node does not govern, and no upstream to ask: inactive");
        return inactive(None);
    };
    let answer = match ask_upstream(client, upstream, &raw).await {
        Ok(a) => a,
        Err(e) => {
            warn!(%e, "introspection: the upstream did not answer; inactive (fail closed)");
            return inactive(None);
        }
    };
    if answer.get("active") != Some(&serde_json::Value::Bool(true)) {
        return (
            StatusCode::OK,
            [(axum::http::header::CACHE_CONTROL, "no-store")],
            axum::Json(answer),
        )
            .into_response();
    }
    // Active upstream: still refused if past its own expiry (the lease the token carries), or
    // if this node revoked it while the upstream was asked.
    let now_s = state.node.now().0 / 1_000;
    if let Some(exp) = answer.get("exp").and_then(serde_json::Value::as_u64) {
        if exp <= now_s {
            info!(
                exp,
                now = now_s,
                "introspection: upstream says active past exp; inactive"
            );
            return inactive(None);
        }
    }
    if let Some(token) = &governed {
        match state.node.decide(Ask::Token(token.clone())).await {
            Ok(Verdict::Refuse(r)) => return inactive(Some(&r)),
            Ok(_) => {}
            Err(e) => return unavailable(&e),
        }
    }
    (
        StatusCode::OK,
        [(axum::http::header::CACHE_CONTROL, "no-store")],
        axum::Json(answer),
    )
        .into_response()
}

/// Why the upstream gave no usable answer.
#[derive(Debug, thiserror::Error)]
enum UpstreamError {
    #[error("{0}")]
    Http(#[from] reqwest::Error),
    #[error("answered {0}")]
    Status(reqwest::StatusCode),
    #[error("not an introspection response: {0}")]
    Shape(String),
}

async fn ask_upstream(
    client: &reqwest::Client,
    upstream: &Upstream,
    token: &str,
) -> Result<serde_json::Map<String, serde_json::Value>, UpstreamError> {
    let body = serde_urlencoded::to_string([("token", token)])
        .map_err(|e| UpstreamError::Shape(e.to_string()))?;
    let mut req = client
        .post(&upstream.url)
        .header(
            reqwest::header::CONTENT_TYPE,
            "application/x-www-form-urlencoded",
        )
        .header(reqwest::header::ACCEPT, "application/json")
        .body(body);
    if let Some(auth) = &upstream.authorization {
        req = req.header(reqwest::header::AUTHORIZATION, auth);
    }
    let resp = req.send().await?;
    if !resp.status().is_success() {
        return Err(UpstreamError::Status(resp.status()));
    }
    let bytes = resp.bytes().await?;
    if bytes.len() > MAX_FORM * 4 {
        return Err(UpstreamError::Shape(format!("{} bytes", bytes.len())));
    }
    match serde_json::from_slice::<serde_json::Value>(&bytes) {
        Ok(serde_json::Value::Object(map)) if map.get("active").is_some_and(|a| a.is_boolean()) => {
            Ok(map)
        }
        Ok(_) => Err(UpstreamError::Shape("no boolean `active`".into())),
        Err(e) => Err(UpstreamError::Shape(e.to_string())),
    }
}

async fn revoke(
    axum::extract::State(state): axum::extract::State<Arc<State>>,
    body: axum::body::Body,
) -> Response {
    let (raw, form) = match read_token_form(body).await {
        Ok(t) => t,
        Err(r) => return r,
    };
    // RFC 7009 answers 200 for a token the server does not know; but a revocation this node
    // cannot carry would be lost in silence, so it is refused in words instead.
    let token = match TokenId::new(raw.clone()) {
        Ok(t) => t,
        Err(e) => {
            return oauth_error(
                StatusCode::BAD_REQUEST,
                "invalid_request",
                &format!("this node cannot govern that token: {e}"),
            )
        }
    };
    if state.config.holders.is_empty() {
        return oauth_error(
            StatusCode::SERVICE_UNAVAILABLE,
            "temporarily_unavailable",
            "no holder agents are configured to carry the revocation to",
        );
    }
    // The upstream knows the token's own expiry and client: the revocation's record then
    // lapses with the token instead of being kept for good.
    let mut expires_at = None;
    let mut client_id = form.client_id.and_then(|c| ClientId::new(c).ok());
    if let (Some(upstream), Some(client)) = (&state.config.upstream, &state.upstream) {
        if let Ok(answer) = ask_upstream(client, upstream, &raw).await {
            expires_at = answer
                .get("exp")
                .and_then(serde_json::Value::as_u64)
                .and_then(|s| s.checked_mul(1_000))
                .map(UnixMillis);
            if client_id.is_none() {
                client_id = answer
                    .get("client_id")
                    .and_then(serde_json::Value::as_str)
                    .and_then(|c| ClientId::new(c).ok());
            }
        }
    }
    let client_id = client_id.unwrap_or_else(|| state.config.client_id.clone());
    let now = state.node.now();
    let span = u64::try_from(state.config.revoke_deadline.as_millis()).unwrap_or(u64::MAX);
    let mut issued = Vec::new();
    for holder in &state.config.holders {
        let o = Obligation {
            id: ObligationId::from_u128(rand::random()),
            issuer: state.node.agent().clone(),
            target: holder.clone(),
            created_at: now,
            deadline: UnixMillis(now.0.saturating_add(span)),
            max_retries: state.node.default_retries(span),
            sequence: None,
            payload: Payload::OauthToken(TokenPayload {
                action: TokenAction::Revoke,
                token_id: token.clone(),
                client_id: client_id.clone(),
                expires_at,
            }),
        };
        let id = o.id;
        match state.node.issue(o).await {
            Ok(_) => issued.push(id),
            Err(e) => {
                warn!(%e, %holder, "revocation not admitted");
                // Those admitted stand (and the token is refused already); the caller is told
                // the rest were not, and may send it again.
                return unavailable(&e);
            }
        }
    }
    info!(?issued, "RFC 7009 revocation under custody");
    let mut headers = HeaderMap::new();
    headers.insert(
        axum::http::header::CACHE_CONTROL,
        HeaderValue::from_static("no-store"),
    );
    let ids: Vec<String> = issued.iter().map(ToString::to_string).collect();
    if let Ok(v) = HeaderValue::from_str(&ids.join(",")) {
        headers.insert(OBLIGATION_HEADER, v);
    }
    (StatusCode::OK, headers).into_response()
}

/// A check's refusal: 403 with the reason in words and, where there is one, the obligation.
fn forbid(reason: &str, refusal: Option<&abhyasa_node::Refusal>) -> Response {
    let mut headers = HeaderMap::new();
    if let Ok(v) = HeaderValue::from_str(reason) {
        headers.insert(REFUSAL_HEADER, v);
    }
    if let Some(r) = refusal {
        name_refusal(&mut headers, r);
    }
    headers.insert(
        axum::http::header::CACHE_CONTROL,
        HeaderValue::from_static("no-store"),
    );
    (StatusCode::FORBIDDEN, headers, format!("{reason}\n")).into_response()
}

async fn check(
    axum::extract::State(state): axum::extract::State<Arc<State>>,
    headers: HeaderMap,
) -> Response {
    let text = |name: &HeaderName| -> Result<Vec<String>, String> {
        let mut out = Vec::new();
        for v in headers.get_all(name) {
            let v = v
                .to_str()
                .map_err(|_| format!("the {name} header is not text"))?;
            out.extend(
                v.split(',')
                    .map(str::trim)
                    .filter(|s| !s.is_empty())
                    .map(str::to_owned),
            );
        }
        Ok(out)
    };
    let scopes = match text(&SCOPE_HEADER) {
        Ok(s) => s,
        Err(e) => return forbid(&e, None),
    };
    if scopes.len() > MAX_SCOPES {
        return forbid(&format!("more than {MAX_SCOPES} scopes named"), None);
    }
    let mut asks = Vec::new();
    if !scopes.is_empty() {
        let agents: Vec<&HeaderValue> = headers.get_all(&AGENT_HEADER).iter().collect();
        let agent = match agents.as_slice() {
            [one] => match one
                .to_str()
                .map_err(|_| "the agent header is not text".to_owned())
                .and_then(agent_named)
            {
                Ok(a) => a,
                Err(e) => return forbid(&e, None),
            },
            [] => return forbid("a scope was named without the agent exercising it", None),
            _ => return forbid("more than one agent named", None),
        };
        for s in &scopes {
            match Scope::new(s.clone()) {
                Ok(scope) => asks.push(Ask::Scope {
                    agent: agent.clone(),
                    scope,
                }),
                Err(e) => return forbid(&format!("scope {s:?}: {e}"), None),
            }
        }
    }
    let bearers: Vec<&str> = headers
        .get_all(axum::http::header::AUTHORIZATION)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .filter_map(|v| v.strip_prefix("Bearer "))
        .collect();
    for b in bearers {
        // A token that is not a valid name here was never revoked here.
        if let Ok(token) = TokenId::new(b) {
            asks.push(Ask::Token(token));
        }
    }
    for ask in asks {
        match state.node.decide(ask.clone()).await {
            Ok(Verdict::Refuse(r)) => {
                let reason = match (&ask, r.lease_ended) {
                    (Ask::Scope { agent, scope }, Some(end)) => {
                        format!("the lease on scope {scope} for {agent} ended at unix time {end}")
                    }
                    (Ask::Scope { agent, scope }, None) => {
                        format!("scope {scope} is withheld from {agent}")
                    }
                    (Ask::Token(_), _) => "the bearer token is revoked".to_owned(),
                };
                let reason = match (r.obligation, &r.carried) {
                    (Some(id), carried) => format!("{reason} by obligation {id} ({carried})"),
                    (None, _) => reason,
                };
                info!(%reason, "check refused");
                return forbid(&reason, Some(&r));
            }
            Ok(_) => {}
            Err(e) => {
                return (StatusCode::SERVICE_UNAVAILABLE, format!("{e}\n")).into_response();
            }
        }
    }
    StatusCode::OK.into_response()
}

/// The agent an `Abhyasa-Agent` header names: its id, or a client certificate's subject as a
/// proxy words it (RFC 2253, `CN=agent-1,O=…`, nginx's `$ssl_client_s_dn`; or OpenSSL's
/// one-line form, `/O=…/CN=agent-1`), whose common name is the agent id the deployment CA
/// issued it for.
pub fn agent_named(value: &str) -> Result<AgentId, String> {
    let value = value.trim();
    let name = if value.contains('=') {
        value
            .split([',', '/'])
            .map(str::trim)
            .find_map(|rdn| rdn.strip_prefix("CN="))
            .ok_or_else(|| format!("the subject {value:?} names no CN"))?
    } else {
        value
    };
    AgentId::new(name).map_err(|e| format!("agent {name:?}: {e}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_agent_is_named_by_its_id_or_its_certificates_subject() {
        let a = AgentId::new("agent-1").unwrap();
        assert_eq!(agent_named("agent-1"), Ok(a.clone()));
        assert_eq!(agent_named(" CN=agent-1,O=abhyasa"), Ok(a.clone()));
        assert_eq!(agent_named("O=abhyasa, CN=agent-1"), Ok(a.clone()));
        assert_eq!(agent_named("/O=abhyasa/CN=agent-1"), Ok(a));
        assert!(agent_named("O=abhyasa").unwrap_err().contains("no CN"));
        assert!(agent_named("").is_err());
    }
}
