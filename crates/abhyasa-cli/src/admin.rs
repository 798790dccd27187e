//! The node's local admin interface, used by `abhyasa issue`, `abhyasa status` and
//! `abhyasa ledger …`: one JSON line per connection, `{"request": …}` (and `"token"` over
//! TCP), one JSON line back. By default a Unix domain socket in the state directory that only
//! the node's own user may open; over TCP only on loopback (unless allowed) and only with the
//! token the node keeps in its state directory. Whoever passes holds the principal's authority:
//! it may issue obligations and spend the node's budget.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::{SystemTime, UNIX_EPOCH};

use abhyasa_node::listen::{AcceptBackoff, Waiting};
use abhyasa_node::{Admission, Node, Status};
use abhyasa_wire::{
    AgentId, BeliefUpdatePayload, ClientId, ConsentDecision, ConsentPayload, Kind, Obligation,
    ObligationId, Payload, RegisteredPayload, Scope, TokenAction, TokenId, TokenPayload,
    UnixMillis, WeightDelta, WeightKey,
};
use serde::{Deserialize, Serialize};
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};

/// An obligation as the command line describes it; the node fills in issuer, id and times.
/// As JSON (the admin protocol, the MCP `abhyasa_issue` tool) the same fields, snake_case;
/// absent options are absent.
#[derive(Clone, Debug, Default, Serialize, Deserialize, clap::Args)]
#[serde(deny_unknown_fields)]
pub struct IssueSpec {
    /// The agent that must honour it.
    #[arg(long)]
    pub target: String,
    /// `anumati.consent`, `phala.belief_update`, `oauth.token`, or a kind this build
    /// registers (its payload in `--payload`).
    #[arg(long)]
    pub kind: String,
    /// A registered kind: its payload, as JSON (the payload type's serde shape).
    #[arg(long, value_parser = json_value)]
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub payload: Option<serde_json::Value>,
    /// Consent: `grant` or `revoke`.
    #[arg(long)]
    pub decision: Option<String>,
    /// Consent: the scope.
    #[arg(long)]
    pub scope: Option<String>,
    /// Belief update: the weight key.
    #[arg(long)]
    pub weight_key: Option<String>,
    /// Belief update: the delta in [-1, 1].
    #[arg(long, allow_hyphen_values = true)]
    pub delta: Option<f64>,
    /// Token: `revoke` or `issue`.
    #[arg(long)]
    pub action: Option<String>,
    /// Token: the token id.
    #[arg(long)]
    pub token: Option<String>,
    /// Token: the client id.
    #[arg(long, default_value = "client")]
    #[serde(default = "default_client")]
    pub client: String,
    /// Token: when the token itself expires, ms from now (its records are forgotten then;
    /// without it they are kept for good).
    #[arg(long)]
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub token_expires_in_ms: Option<u64>,
    /// Consent grant: its lease, ms from now. The authority lapses then, on the agent's side
    /// and at every enforcement point, unless a later grant renews it.
    #[arg(long)]
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lease_ms: Option<u64>,
    /// Belief update: how long the weight change holds, ms from now (at least 1). It lapses
    /// then on the agent's side, and so does the principal's down-weight if custody of a
    /// correction ends without `applied`.
    #[arg(long, default_value_t = 3_600_000)]
    #[serde(default = "default_ttl_ms")]
    pub ttl_ms: u64,
    /// Deadline, ms from now.
    #[arg(long, default_value_t = 30_000)]
    #[serde(default = "default_deadline_ms")]
    pub deadline_ms: u64,
    /// Attempt budget after the first attempt. Default: derived from the deadline and the
    /// node's backoff so that the deadline normally binds.
    #[arg(long)]
    pub max_retries: Option<u32>,
    /// Issuance sequence on the governed key.
    #[arg(long)]
    pub sequence: Option<u64>,
}

fn json_value(s: &str) -> Result<serde_json::Value, String> {
    serde_json::from_str(s).map_err(|e| format!("not JSON: {e}"))
}

fn default_client() -> String {
    "client".into()
}

fn default_ttl_ms() -> u64 {
    3_600_000
}

fn default_deadline_ms() -> u64 {
    30_000
}

impl IssueSpec {
    /// The obligation, issued by `issuer` now; `default_retries` sizes the budget from the
    /// deadline when none is given.
    pub fn build(
        &self,
        issuer: &AgentId,
        default_retries: impl Fn(u64) -> u32,
    ) -> Result<Obligation, String> {
        let need = |v: &Option<String>, what: &str| {
            v.clone()
                .ok_or_else(|| format!("--{what} is required for {}", self.kind))
        };
        let now = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap_or_default()
            .as_millis() as u64;
        let payload = match self.kind.as_str() {
            "anumati.consent" => Payload::AnumatiConsent(ConsentPayload {
                decision: Some(match need(&self.decision, "decision")?.as_str() {
                    "grant" => ConsentDecision::Grant,
                    "revoke" => ConsentDecision::Revoke,
                    other => ConsentDecision::Unrecognized(other.to_owned()),
                }),
                scope: Scope::new(need(&self.scope, "scope")?).map_err(|e| e.to_string())?,
                expires_at: self
                    .lease_ms
                    .map(|ms| now.checked_add(ms).map(UnixMillis))
                    .map(|at| at.ok_or("--lease-ms is too large"))
                    .transpose()?,
            }),
            "phala.belief_update" => {
                let delta = self
                    .delta
                    .ok_or("--delta is required for phala.belief_update")?;
                if !(-1.0..=1.0).contains(&delta) {
                    return Err("--delta must be within [-1, 1]".into());
                }
                Payload::PhalaBeliefUpdate(BeliefUpdatePayload {
                    weight_key: WeightKey::new(need(&self.weight_key, "weight-key")?)
                        .map_err(|e| e.to_string())?,
                    weight_delta: WeightDelta((delta * f64::from(WeightDelta::ONE)).round() as i32),
                    ttl_ms: match self.ttl_ms {
                        0 => return Err("--ttl-ms must be at least 1".into()),
                        ms => ms,
                    },
                })
            }
            "oauth.token" => Payload::OauthToken(TokenPayload {
                action: match need(&self.action, "action")?.as_str() {
                    "revoke" => TokenAction::Revoke,
                    "issue" => TokenAction::Issue,
                    other => return Err(format!("unknown token action {other:?}")),
                },
                token_id: TokenId::new(need(&self.token, "token")?).map_err(|e| e.to_string())?,
                client_id: ClientId::new(self.client.clone()).map_err(|e| e.to_string())?,
                expires_at: self
                    .token_expires_in_ms
                    .map(|ms| now.checked_add(ms).map(UnixMillis))
                    .map(|at| at.ok_or("--token-expires-in-ms is too large"))
                    .transpose()?,
            }),
            other => match Kind::from_name(other) {
                Some(Kind::Registered(name)) => {
                    let json = self
                        .payload
                        .as_ref()
                        .ok_or_else(|| format!("--payload is required for {name}"))?;
                    let value = ciborium::Value::serialized(json).map_err(|e| e.to_string())?;
                    Payload::Registered(
                        RegisteredPayload::read(name, value)
                            .map_err(|e| format!("--payload for {name}: {e}"))?,
                    )
                }
                _ => return Err(format!("unknown kind {other:?}")),
            },
        };
        Ok(Obligation {
            id: ObligationId::from_u128(rand::random()),
            issuer: issuer.clone(),
            target: AgentId::new(self.target.clone()).map_err(|e| e.to_string())?,
            created_at: UnixMillis(now),
            deadline: UnixMillis(now + self.deadline_ms),
            max_retries: self
                .max_retries
                .unwrap_or_else(|| default_retries(self.deadline_ms)),
            sequence: self.sequence,
            payload,
        })
    }
}

/// One admin request.
#[derive(Debug, Serialize, Deserialize)]
#[serde(tag = "op", rename_all = "snake_case")]
pub enum Request {
    /// Issue an obligation.
    Issue(Box<IssueSpec>),
    /// Report status.
    Status,
    /// A ledger request.
    Ledger(crate::ledger_cli::LedgerRequest),
}

/// Status as JSON.
#[derive(Debug, Serialize, Deserialize)]
pub struct StatusJson {
    /// This node.
    pub agent: String,
    /// Peers with a live session.
    pub peers: Vec<String>,
    /// Objects (obligations, ledger messages) dropped unread per peer by the rate limit
    /// (`[limits] requests_per_second_per_peer`).
    #[serde(default)]
    pub slowed: std::collections::BTreeMap<String, u64>,
    /// Obligations and acks dropped per peer because their end-to-end signature did not
    /// verify.
    #[serde(default)]
    pub unverified: std::collections::BTreeMap<String, u64>,
    /// Set while the store refuses commits for want of space (new work refused).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub store_full: Option<String>,
    /// Custody objects (obligations, acks) sent since the node started.
    #[serde(default)]
    pub sent_objects: u64,
    /// The groups they left in (what is ready at once goes in one group per peer).
    #[serde(default)]
    pub sent_groups: u64,
    /// Durable commits of the store writer since the node started.
    #[serde(default)]
    pub commits: u64,
    /// The time they took, summed, in microseconds (`commit_micros / commits`: the mean).
    #[serde(default)]
    pub commit_micros: u64,
    /// Events in the outbox not yet taken by every sink (`[events]`).
    #[serde(default)]
    pub outbox: u64,
    /// The pending set.
    pub pending: Vec<PendingJson>,
    /// Recent outcomes.
    pub recent: Vec<OutcomeJson>,
    /// Escalations with their safe actions.
    pub escalations: Vec<OutcomeJson>,
    /// Principal state: withheld (target, scope), revoked tokens, routing weights.
    pub withheld: Vec<(String, String)>,
    /// Tokens the principal no longer honours.
    pub revoked_tokens: Vec<String>,
    /// Routing weights as decimals (1 is the full weight).
    pub routes: Vec<(String, String, f64)>,
    /// As an agent: what this node honours, per principal.
    #[serde(default)]
    pub honours: HonoursJson,
    /// As an agent: what it applied most recently (oldest first).
    #[serde(default)]
    pub applied: Vec<AppliedJson>,
    /// Applies the node keeps a record of that `applied` does not show (older ones).
    #[serde(default)]
    pub applied_not_shown: u64,
    /// As an agent: what its receiver holds in memory, by kind of entry.
    #[serde(default)]
    pub receiver_held: ReceiverHeldJson,
}

/// What a node's receiver holds in memory (bounded by maintenance).
#[derive(Debug, Default, Serialize, Deserialize)]
pub struct ReceiverHeldJson {
    /// Applied ids remembered until their deadline plus the clock-skew allowance.
    pub applied: usize,
    /// Token records, kept until the token's own expiry (or for good without one).
    pub token_records: usize,
    /// Last sequences, one per governed key.
    pub sequences: usize,
    /// Belief updates' weight changes, kept until maintenance after they lapse.
    #[serde(default)]
    pub weight_changes: usize,
}

/// An obligation this node applied, as JSON.
#[derive(Debug, Serialize, Deserialize)]
pub struct AppliedJson {
    /// Id (hex).
    pub id: String,
    /// Its principal.
    pub issuer: String,
    /// Its kind.
    pub kind: String,
    /// What it says, in words.
    pub says: String,
    /// When it was applied (unix ms).
    pub at: u64,
}

/// What a node honours as an agent, per principal (its receiver's durable state).
#[derive(Debug, Default, Serialize, Deserialize)]
pub struct HonoursJson {
    /// (principal, scope) pairs it no longer exercises.
    pub withheld: Vec<(String, String)>,
    /// (principal, key, weight as a decimal) preference weights set by principals.
    pub weights: Vec<(String, String, f64)>,
    /// Tokens it dropped.
    pub dropped_tokens: Vec<String>,
}

/// A pending obligation as JSON.
#[derive(Debug, Serialize, Deserialize)]
pub struct PendingJson {
    /// Id (hex).
    pub id: String,
    /// Kind.
    pub kind: String,
    /// Target.
    pub target: String,
    /// Deadline (unix ms).
    pub deadline: u64,
    /// Attempts so far.
    pub attempts: u32,
    /// What it says, in words.
    #[serde(default)]
    pub says: String,
}

/// An outcome as JSON.
#[derive(Debug, Serialize, Deserialize)]
pub struct OutcomeJson {
    /// Id (hex).
    pub id: String,
    /// Kind.
    pub kind: String,
    /// Target.
    pub target: String,
    /// Outcome or escalation cause.
    pub outcome: String,
    /// Attempts.
    pub attempts: u32,
    /// When (unix ms).
    pub at: u64,
    /// The safe action, for escalations, in words.
    pub safe_action: Option<String>,
    /// The outcome in words, with its attempts.
    #[serde(default)]
    pub words: String,
    /// A decline's reason in the agent's own words (a decline of its policy).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub detail: Option<String>,
}

/// Millionths as a decimal (`-250000` is `-0.25`).
fn millionths(w: i64) -> f64 {
    w as f64 / 1e6
}

impl From<Status> for StatusJson {
    fn from(s: Status) -> Self {
        Self {
            agent: s.agent.to_string(),
            peers: s.peers.iter().map(ToString::to_string).collect(),
            slowed: s.slowed.iter().map(|(p, n)| (p.to_string(), *n)).collect(),
            unverified: s
                .unverified
                .iter()
                .map(|(p, n)| (p.to_string(), *n))
                .collect(),
            sent_objects: s.sent.objects,
            sent_groups: s.sent.groups,
            commits: s.commits.count,
            commit_micros: u64::try_from(s.commits.busy.as_micros()).unwrap_or(u64::MAX),
            outbox: s.outbox,
            store_full: s.store_full.clone(),
            pending: s
                .pending
                .iter()
                .map(|(o, n)| PendingJson {
                    id: o.id.to_string(),
                    kind: o.kind().to_string(),
                    target: o.target.to_string(),
                    deadline: o.deadline.0,
                    attempts: *n,
                    says: abhyasa_wire::words::obligation(o),
                })
                .collect(),
            recent: s
                .recent
                .iter()
                .map(|r| OutcomeJson {
                    id: r.obligation_id.to_string(),
                    kind: r.kind.to_string(),
                    target: r.target.to_string(),
                    outcome: format!("{:?}", r.outcome),
                    attempts: r.attempts,
                    at: r.at.0,
                    safe_action: None,
                    words: abhyasa_wire::words::outcome(&r.outcome, r.attempts),
                    detail: r.detail.as_ref().map(ToString::to_string),
                })
                .collect(),
            escalations: s
                .escalations
                .iter()
                .map(|e| OutcomeJson {
                    id: e.obligation_id.to_string(),
                    kind: e.kind.to_string(),
                    target: e.target.to_string(),
                    outcome: format!("{:?}", e.cause),
                    attempts: e.attempts,
                    at: e.at.0,
                    safe_action: Some(abhyasa_wire::words::safe_action(&e.safe_action)),
                    words: abhyasa_wire::words::outcome(
                        &abhyasa_wire::Outcome::Escalated(e.cause),
                        e.attempts,
                    ),
                    detail: None,
                })
                .collect(),
            withheld: s
                .principal
                .authorizations()
                .filter(|(_, a)| a.withheld)
                .map(|((t, sc), _)| (t.to_string(), sc.to_string()))
                .collect(),
            revoked_tokens: s
                .principal
                .revoked_tokens()
                .map(ToString::to_string)
                .collect(),
            routes: s
                .principal
                .routes(s.at)
                .map(|((t, k), w)| (t.to_string(), k.to_string(), millionths(w)))
                .collect(),
            applied_not_shown: s.applied_total.saturating_sub(s.applied.len() as u64),
            applied: s
                .applied
                .iter()
                .map(|a| AppliedJson {
                    id: a.obligation.id.to_string(),
                    issuer: a.obligation.issuer.to_string(),
                    kind: a.obligation.kind().to_string(),
                    says: abhyasa_wire::words::obligation(&a.obligation),
                    at: a.at.0,
                })
                .collect(),
            honours: HonoursJson {
                withheld: s
                    .honours
                    .withheld()
                    .map(|(p, sc)| (p.to_string(), sc.to_string()))
                    .collect(),
                weights: s
                    .honours
                    .weights(s.at)
                    .map(|((p, k), w)| (p.to_string(), k.to_string(), millionths(w)))
                    .collect(),
                dropped_tokens: s
                    .honours
                    .dropped_tokens()
                    .map(ToString::to_string)
                    .collect(),
            },
            receiver_held: ReceiverHeldJson {
                applied: s.receiver_held.applied,
                token_records: s.receiver_held.token_records,
                sequences: s.receiver_held.sequences,
                weight_changes: s.receiver_held.weight_changes,
            },
        }
    }
}

/// Where a node's admin interface listens: a Unix domain socket (the default,
/// `<state>/admin.sock`, mode 0600, only the node's own user may connect) or a TCP address
/// (every request must carry the token the node writes to `<state>/admin.token`, mode 0600).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum AdminAddr {
    /// A Unix domain socket at this path.
    Unix(PathBuf),
    /// A TCP address.
    Tcp(SocketAddr),
}

impl AdminAddr {
    /// Parses `ip:port` as TCP and `name:port` (e.g. `localhost:7701`) as TCP at the name's
    /// first address (a name that does not resolve is an error, never a socket file of that
    /// name); `unix:PATH`, a path with a `/`, or any other word is a socket path, and an
    /// existing directory (a node's state directory) stands for the `admin.sock` inside it.
    pub fn parse(s: &str) -> Result<Self, String> {
        if let Ok(a) = s.parse::<SocketAddr>() {
            return Ok(Self::Tcp(a));
        }
        let explicit_path = s.starts_with("unix:") || s.contains('/');
        let path = PathBuf::from(s.strip_prefix("unix:").unwrap_or(s));
        if path.is_dir() {
            return Ok(Self::Unix(path.join(SOCKET_FILE)));
        }
        let host_port = s
            .rsplit_once(':')
            .filter(|(host, port)| !host.is_empty() && port.parse::<u16>().is_ok());
        match host_port {
            Some(_) if !explicit_path && !path.exists() => {
                use std::net::ToSocketAddrs as _;
                let addrs: Vec<SocketAddr> = s
                    .to_socket_addrs()
                    .map_err(|e| {
                        format!(
                            "admin address {s:?}: {e}; write an IP address \
                             (127.0.0.1:PORT) or a socket path (unix:{s} for a file of \
                             that name)"
                        )
                    })?
                    .collect();
                // A name with a loopback address (localhost) is taken at that address.
                addrs
                    .iter()
                    .find(|a| a.ip().is_loopback())
                    .or(addrs.first())
                    .map(|a| Self::Tcp(*a))
                    .ok_or_else(|| format!("admin address {s:?} resolves to no address"))
            }
            _ => Ok(Self::Unix(path)),
        }
    }
}

impl std::fmt::Display for AdminAddr {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Unix(p) => write!(f, "unix:{}", p.display()),
            Self::Tcp(a) => write!(f, "{a}"),
        }
    }
}

impl std::str::FromStr for AdminAddr {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Self::parse(s)
    }
}

/// The admin socket's file name in a state directory.
pub const SOCKET_FILE: &str = "admin.sock";
/// The admin token's file name in a state directory.
pub const TOKEN_FILE: &str = "admin.token";

/// Why the admin interface would not start, or a request was not sent.
#[derive(Debug, thiserror::Error)]
pub enum AdminError {
    /// A TCP admin address that is not loopback, without `admin_allow_remote = true`.
    #[error("admin address {0} is not a loopback address; anyone who can reach it could issue obligations as this node (set admin_allow_remote = true to allow it; a token is still required)")]
    NotLoopback(SocketAddr),
    /// Another process already serves the socket.
    #[error("{0}: another process is serving this admin socket")]
    InUse(PathBuf),
    /// Something that is not a socket is in the way.
    #[error("{0}: exists and is not a socket; not removing it")]
    NotASocket(PathBuf),
    /// The token file can be read by other users.
    #[error("{path}: admin token is readable by other users (mode {mode:o}); chmod 600 it")]
    TokenExposed {
        /// The token file.
        path: PathBuf,
        /// Its permission bits.
        mode: u32,
    },
    /// The token file does not hold a token.
    #[error("{0}: not an admin token (expected 64 hex digits)")]
    BadToken(PathBuf),
    /// A TCP admin address without a token to send.
    #[error(
        "a TCP admin address needs --admin-token FILE (the node writes it to <state>/{TOKEN_FILE})"
    )]
    NoToken,
    /// I/O on the socket, the token or the connection.
    #[error("{0}: {1}")]
    Io(String, std::io::Error),
}

/// One request on the wire: the token (TCP only) and the request.
#[derive(Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct Envelope {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    token: Option<String>,
    request: Request,
}

enum Listener {
    Unix {
        listener: tokio::net::UnixListener,
        owner: u32,
    },
    Tcp {
        listener: tokio::net::TcpListener,
        token: [u8; 32],
    },
}

/// A bound admin interface, not yet serving.
pub struct AdminServer {
    listener: Listener,
    addr: AdminAddr,
}

impl AdminServer {
    /// Binds the admin interface at `addr` for the node whose state directory is `state`.
    /// A Unix socket replaces a stale socket file (one nobody answers on) and is made 0600;
    /// a TCP address must be loopback unless `allow_remote`, and gets the state directory's
    /// token (created, 0600, when absent).
    pub fn bind(addr: &AdminAddr, state: &Path, allow_remote: bool) -> Result<Self, AdminError> {
        use std::os::unix::fs::{FileTypeExt, MetadataExt, PermissionsExt};
        let io = |what: &Path| {
            let what = what.display().to_string();
            move |e| AdminError::Io(what, e)
        };
        let listener = match addr {
            AdminAddr::Unix(path) => {
                if let Ok(meta) = std::fs::symlink_metadata(path) {
                    if !meta.file_type().is_socket() {
                        return Err(AdminError::NotASocket(path.clone()));
                    }
                    if std::os::unix::net::UnixStream::connect(path).is_ok() {
                        return Err(AdminError::InUse(path.clone()));
                    }
                    std::fs::remove_file(path).map_err(io(path))?;
                }
                let listener = tokio::net::UnixListener::bind(path).map_err(io(path))?;
                std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600))
                    .map_err(io(path))?;
                // The file's owner is this process's user; connections from anyone else are
                // refused even in the moment before the mode was set.
                let owner = std::fs::metadata(path).map_err(io(path))?.uid();
                Listener::Unix { listener, owner }
            }
            AdminAddr::Tcp(a) => {
                if !a.ip().is_loopback() && !allow_remote {
                    return Err(AdminError::NotLoopback(*a));
                }
                let token = load_or_create_token(&state.join(TOKEN_FILE))?;
                let listener = std::net::TcpListener::bind(a)
                    .and_then(|l| {
                        l.set_nonblocking(true)?;
                        tokio::net::TcpListener::from_std(l)
                    })
                    .map_err(|e| AdminError::Io(a.to_string(), e))?;
                Listener::Tcp { listener, token }
            }
        };
        Ok(Self {
            listener,
            addr: addr.clone(),
        })
    }

    /// Where it listens (a TCP port 0 resolved).
    pub fn addr(&self) -> AdminAddr {
        match &self.listener {
            Listener::Tcp { listener, .. } => listener
                .local_addr()
                .map_or_else(|_| self.addr.clone(), AdminAddr::Tcp),
            Listener::Unix { .. } => self.addr.clone(),
        }
    }

    /// Serves admin requests for `node`, for as long as the node runs. Nothing a client does
    /// stops it: a failed `accept` (EMFILE, ENFILE: descriptors exhausted) is logged and
    /// retried with backoff; a connection must send its request line within
    /// [`REQUEST_TIMEOUT`] and its answer is written within the same bound; and at most
    /// [`MAX_CONNECTIONS`] connections wait for their request line — past that, the oldest
    /// waiting one is closed, so idle connections cannot crowd out the operator's.
    pub async fn serve(self, node: std::sync::Arc<Node>) -> std::io::Result<()> {
        let waiting = Waiting::new(MAX_CONNECTIONS);
        let mut backoff = AcceptBackoff::default();
        loop {
            let accepted = match &self.listener {
                Listener::Unix { listener, .. } => {
                    listener.accept().await.map(|(s, _)| Accepted::Unix(s))
                }
                Listener::Tcp { listener, .. } => listener
                    .accept()
                    .await
                    .map(|(s, peer)| Accepted::Tcp(s, peer)),
            };
            let accepted = match accepted {
                Ok(a) => {
                    backoff.reset();
                    a
                }
                Err(e) => {
                    backoff.failed("admin", &e).await;
                    continue;
                }
            };
            let node = node.clone();
            let id = waiting.next_id();
            let task = match (accepted, &self.listener) {
                (Accepted::Unix(stream), Listener::Unix { owner, .. }) => {
                    let (owner, waiting) = (*owner, waiting.clone());
                    let uid = stream.peer_cred().map(|c| c.uid()).ok();
                    tokio::spawn(async move {
                        let (r, w) = stream.into_split();
                        let allowed = if uid == Some(owner) {
                            Ok(())
                        } else {
                            Err(format!(
                                "unauthorized: uid {uid:?} is not the node's user ({owner})"
                            ))
                        };
                        answer(&node, r, w, || waiting.done(id), |_| allowed).await;
                    })
                }
                (Accepted::Tcp(stream, peer), Listener::Tcp { token, .. }) => {
                    let (token, waiting) = (*token, waiting.clone());
                    tokio::spawn(async move {
                        let (r, w) = stream.into_split();
                        answer(&node, r, w, || waiting.done(id), |given| {
                            if given.is_some_and(|g| token_matches(g, &token)) {
                                Ok(())
                            } else {
                                tracing::warn!(%peer, "admin request without a valid token refused");
                                Err(format!(
                                    "unauthorized: this admin interface needs the token in <state>/{TOKEN_FILE}"
                                ))
                            }
                        })
                        .await;
                    })
                }
                _ => continue,
            };
            waiting.admit(id, task.abort_handle());
        }
    }
}

enum Accepted {
    Unix(tokio::net::UnixStream),
    Tcp(tokio::net::TcpStream, SocketAddr),
}

/// How long a connection may take to send its request line, and its answer to be written.
pub const REQUEST_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(10);
/// Connections that may wait for their request line at once; past it the oldest is closed.
pub const MAX_CONNECTIONS: usize = 64;

/// Reads the token at `path`, or creates one (32 random bytes as hex, mode 0600, never
/// overwriting) when absent. A token other users can read is refused.
pub(crate) fn load_or_create_token(path: &Path) -> Result<[u8; 32], AdminError> {
    use std::io::Write as _;
    use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
    let io = |e| AdminError::Io(path.display().to_string(), e);
    match std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(path)
    {
        Ok(mut f) => {
            let mut token = [0u8; 32];
            rand::Rng::fill(&mut rand::rng(), &mut token);
            f.write_all(format!("{}\n", hex::encode(token)).as_bytes())
                .and_then(|()| f.sync_all())
                .map_err(io)?;
            Ok(token)
        }
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {
            let mode = std::fs::metadata(path).map_err(io)?.permissions().mode();
            if mode & 0o077 != 0 {
                return Err(AdminError::TokenExposed {
                    path: path.to_owned(),
                    mode: mode & 0o777,
                });
            }
            read_token(path)
        }
        Err(e) => Err(io(e)),
    }
}

/// Reads a token file (64 hex digits).
pub fn read_token(path: &Path) -> Result<[u8; 32], AdminError> {
    let text =
        std::fs::read_to_string(path).map_err(|e| AdminError::Io(path.display().to_string(), e))?;
    hex::decode(text.trim())
        .ok()
        .and_then(|b| <[u8; 32]>::try_from(b).ok())
        .ok_or_else(|| AdminError::BadToken(path.to_owned()))
}

/// Compares a presented token with the node's in time independent of where they differ.
fn token_matches(given: &str, token: &[u8; 32]) -> bool {
    use subtle::ConstantTimeEq as _;
    hex::decode(given)
        .ok()
        .and_then(|b| <[u8; 32]>::try_from(b).ok())
        .is_some_and(|g| bool::from(g.ct_eq(token)))
}

/// Reads one request line, checks `authorize` with its token, answers one line.
async fn answer<R, W>(
    node: &Node,
    r: R,
    mut w: W,
    read: impl FnOnce(),
    authorize: impl FnOnce(Option<&str>) -> Result<(), String>,
) where
    R: tokio::io::AsyncRead + Unpin,
    W: tokio::io::AsyncWrite + Unpin,
{
    let mut line = String::new();
    // One request per connection, bounded in size and in time: a line longer than this is
    // refused unread, and a connection that sends nothing is closed.
    let mut reader = BufReader::new(r.take(MAX_REQUEST_BYTES));
    match tokio::time::timeout(REQUEST_TIMEOUT, reader.read_line(&mut line)).await {
        Ok(Ok(_)) => read(),
        _ => return,
    }
    let reply = match serde_json::from_str::<Envelope>(&line) {
        Err(_) if !line.ends_with('\n') && line.len() as u64 >= MAX_REQUEST_BYTES => {
            serde_json::json!({"ok": false, "error": format!("request longer than {MAX_REQUEST_BYTES} bytes")})
        }
        Err(e) => serde_json::json!({"ok": false, "error": format!("bad request: {e}")}),
        Ok(env) => match authorize(env.token.as_deref()) {
            Err(e) => serde_json::json!({"ok": false, "error": e}),
            Ok(()) => handle(node, env.request).await,
        },
    };
    let _ = tokio::time::timeout(
        REQUEST_TIMEOUT,
        w.write_all(format!("{reply}\n").as_bytes()),
    )
    .await;
}

/// The longest admin request line accepted.
pub const MAX_REQUEST_BYTES: u64 = 64 * 1024;

async fn handle(node: &Node, request: Request) -> serde_json::Value {
    match request {
        Request::Issue(spec) => match spec.build(node.agent(), |span| node.default_retries(span)) {
            Ok(o) => {
                let id = o.id;
                match node.issue(o).await.map(|h| h.admission()) {
                    Ok(a) => {
                        serde_json::json!({"ok": true, "id": id.to_string(), "admission": match a {
                            Admission::Custody => "custody",
                            Admission::BestEffort => "best_effort",
                        }})
                    }
                    Err(e) => serde_json::json!({"ok": false, "error": e.to_string()}),
                }
            }
            Err(e) => serde_json::json!({"ok": false, "error": e}),
        },
        Request::Ledger(req) => match req.run(node).await {
            Ok(v) => v,
            Err(e) => serde_json::json!({"ok": false, "error": e.to_string()}),
        },
        Request::Status => match node.status().await {
            Ok(s) => serde_json::json!({"ok": true, "status": StatusJson::from(s)}),
            Err(e) => serde_json::json!({"ok": false, "error": e.to_string()}),
        },
    }
}

/// How a client reaches a node's admin interface.
#[derive(Clone, Debug, clap::Args)]
pub struct AdminTarget {
    /// The node's admin interface: its state directory or socket path (Unix socket), or
    /// `host:port` (TCP; then --admin-token is needed).
    #[arg(long, default_value = "state")]
    pub admin: AdminAddr,
    /// The node's admin token file (`<state>/admin.token`), for a TCP admin address.
    #[arg(long)]
    pub admin_token: Option<PathBuf>,
}

/// Sends one request to a node's admin interface and returns its JSON reply.
pub async fn request(
    target: &AdminTarget,
    req: Request,
) -> Result<serde_json::Value, Box<dyn std::error::Error>> {
    let line = |token| -> Result<String, serde_json::Error> {
        Ok(format!(
            "{}\n",
            serde_json::to_string(&Envelope {
                token,
                request: req,
            })?
        ))
    };
    let mut reply = String::new();
    match &target.admin {
        AdminAddr::Unix(path) => {
            let stream = tokio::net::UnixStream::connect(path)
                .await
                .map_err(|e| AdminError::Io(format!("admin socket {}", path.display()), e))?;
            let (r, mut w) = stream.into_split();
            w.write_all(line(None)?.as_bytes()).await?;
            BufReader::new(r).read_line(&mut reply).await?;
        }
        AdminAddr::Tcp(addr) => {
            let token = read_token(target.admin_token.as_deref().ok_or(AdminError::NoToken)?)?;
            let stream = tokio::net::TcpStream::connect(addr)
                .await
                .map_err(|e| AdminError::Io(format!("admin address {addr}"), e))?;
            let (r, mut w) = stream.into_split();
            w.write_all(line(Some(hex::encode(token)))?.as_bytes())
                .await?;
            BufReader::new(r).read_line(&mut reply).await?;
        }
    }
    Ok(serde_json::from_str(&reply)?)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Reproduced: `admin = "localhost:PORT"` silently became a Unix socket file named
    /// `localhost:PORT`. A name with a port resolves (to loopback for localhost) or is
    /// refused; a socket path stays a socket path.
    #[test]
    fn a_host_name_with_a_port_is_tcp_or_an_error_never_a_socket_file() {
        match AdminAddr::parse("localhost:7701").unwrap() {
            AdminAddr::Tcp(a) => {
                assert!(a.ip().is_loopback(), "{a}");
                assert_eq!(a.port(), 7701);
            }
            a => panic!("{a}"),
        }
        assert_eq!(
            AdminAddr::parse("127.0.0.1:7701").unwrap(),
            AdminAddr::Tcp("127.0.0.1:7701".parse().unwrap())
        );
        let e = AdminAddr::parse("no-such-host.invalid:7701").unwrap_err();
        assert!(e.contains("127.0.0.1:PORT") && e.contains("unix:"), "{e}");
        assert_eq!(
            AdminAddr::parse("unix:localhost:7701").unwrap(),
            AdminAddr::Unix("localhost:7701".into())
        );
        assert_eq!(
            AdminAddr::parse("./run/admin.sock").unwrap(),
            AdminAddr::Unix("./run/admin.sock".into())
        );
        assert_eq!(
            AdminAddr::parse("admin.sock").unwrap(),
            AdminAddr::Unix("admin.sock".into())
        );
    }

    /// Weights read as decimals on both sides, and the applies not shown are counted.
    #[test]
    fn status_json_gives_weights_as_decimals_and_counts_what_it_does_not_show() {
        use abhyasa_custody::{PrincipalUpdate, ReceiverEffect, WeightChange};
        let (p, a) = (AgentId::new("p").unwrap(), AgentId::new("a").unwrap());
        let key = WeightKey::new("supplier.acme").unwrap();
        let mut principal = abhyasa_custody::PrincipalState::new(Default::default());
        principal.apply(
            &PrincipalUpdate::Safe(abhyasa_wire::SafeAction::DownWeight {
                obligation_id: ObligationId::from_u128(1),
                target: a.clone(),
                weight_key: key.clone(),
                amount: 250_000,
                fold_after: UnixMillis(1_000_000),
                lapses_at: Some(UnixMillis(1_000_000)),
            }),
            ObligationId::from_u128(1),
        );
        let mut honours = abhyasa_custody::ReceiverState::new(-1_000_000, 1_000_000);
        honours.apply(&ReceiverEffect::AdjustWeight(
            p.clone(),
            key,
            WeightChange {
                by: ObligationId::from_u128(2),
                delta: -125_000,
                lapses_at: UnixMillis(1_000_000),
            },
        ));
        let status = Status {
            agent: p,
            at: UnixMillis(10),
            pending: Vec::new(),
            recent: Vec::new(),
            escalations: Vec::new(),
            principal,
            honours,
            receiver_held: Default::default(),
            applied: Vec::new(),
            peers: Vec::new(),
            slowed: Default::default(),
            unverified: Default::default(),
            sent: Default::default(),
            store_full: None,
            outbox: 0,
            store_bytes: None,
            applied_total: 73,
            commits: Default::default(),
        };
        let json = serde_json::to_value(StatusJson::from(status)).unwrap();
        assert_eq!(
            json["routes"],
            serde_json::json!([["a", "supplier.acme", 0.75]])
        );
        assert_eq!(
            json["honours"]["weights"],
            serde_json::json!([["p", "supplier.acme", -0.125]])
        );
        assert_eq!(json["applied_not_shown"], 73);
    }
}
