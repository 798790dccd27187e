//! The node's local admin interface: JSON lines over TCP on a loopback address, used by
//! `abhyasa issue`, `abhyasa status` and `abhyasa ledger …`. One request per connection.

use std::net::SocketAddr;
use std::time::{SystemTime, UNIX_EPOCH};

use abhyasa_node::{Admission, Node, Status};
use abhyasa_wire::{
    AgentId, BeliefUpdatePayload, ClientId, ConsentDecision, ConsentPayload, Obligation,
    ObligationId, Payload, Scope, TokenAction, TokenId, TokenPayload, UnixMillis, WeightDelta,
    WeightKey,
};
use serde::{Deserialize, Serialize};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};

/// An obligation as the command line describes it; the node fills in issuer, id and times.
/// As JSON (the admin protocol, the MCP `abhyasa_issue` tool) the same fields, snake_case;
/// absent options are absent.
#[derive(Clone, Debug, Default, Serialize, Deserialize, clap::Args)]
#[serde(deny_unknown_fields)]
pub struct IssueSpec {
    /// The agent that must honour it.
    #[arg(long)]
    pub target: String,
    /// `anumati.consent`, `phala.belief_update` or `oauth.token`.
    #[arg(long)]
    pub kind: String,
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

fn default_client() -> String {
    "client".into()
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
        let payload = match self.kind.as_str() {
            "anumati.consent" => Payload::AnumatiConsent(ConsentPayload {
                decision: Some(match need(&self.decision, "decision")?.as_str() {
                    "grant" => ConsentDecision::Grant,
                    "revoke" => ConsentDecision::Revoke,
                    other => ConsentDecision::Unrecognized(other.to_owned()),
                }),
                scope: Scope::new(need(&self.scope, "scope")?).map_err(|e| e.to_string())?,
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
                    ttl_ms: 3_600_000,
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
            }),
            other => return Err(format!("unknown kind {other:?}")),
        };
        let now = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap_or_default()
            .as_millis() as u64;
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
    /// Routing weights in millionths.
    pub routes: Vec<(String, String, i64)>,
    /// As an agent: what this node honours, per principal.
    #[serde(default)]
    pub honours: HonoursJson,
    /// As an agent: what it applied most recently (oldest first).
    #[serde(default)]
    pub applied: Vec<AppliedJson>,
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
    /// (principal, key, weight in millionths) preference weights set by principals.
    pub weights: Vec<(String, String, i64)>,
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
}

impl From<Status> for StatusJson {
    fn from(s: Status) -> Self {
        Self {
            agent: s.agent.to_string(),
            peers: s.peers.iter().map(ToString::to_string).collect(),
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
                .routes()
                .map(|((t, k), w)| (t.to_string(), k.to_string(), w))
                .collect(),
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
                    .weights()
                    .map(|((p, k), w)| (p.to_string(), k.to_string(), w))
                    .collect(),
                dropped_tokens: s
                    .honours
                    .dropped_tokens()
                    .map(ToString::to_string)
                    .collect(),
            },
        }
    }
}

/// Serves admin requests for `node` on `addr` until the listener fails.
pub async fn serve(node: std::sync::Arc<Node>, addr: SocketAddr) -> std::io::Result<()> {
    let listener = tokio::net::TcpListener::bind(addr).await?;
    loop {
        let (stream, _) = listener.accept().await?;
        let node = node.clone();
        tokio::spawn(async move {
            let (r, mut w) = stream.into_split();
            let mut line = String::new();
            if BufReader::new(r).read_line(&mut line).await.is_err() {
                return;
            }
            let reply = match serde_json::from_str::<Request>(&line) {
                Ok(Request::Issue(spec)) => {
                    match spec.build(node.agent(), |span| node.default_retries(span)) {
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
                    }
                }
                Ok(Request::Ledger(req)) => match req.command() {
                    Ok(cmd) => match node.ledger(cmd).await {
                        Ok(r) => crate::ledger_cli::reply_json(&r),
                        Err(e) => serde_json::json!({"ok": false, "error": e.to_string()}),
                    },
                    Err(e) => serde_json::json!({"ok": false, "error": e.to_string()}),
                },
                Ok(Request::Status) => match node.status().await {
                    Ok(s) => serde_json::json!({"ok": true, "status": StatusJson::from(s)}),
                    Err(e) => serde_json::json!({"ok": false, "error": e.to_string()}),
                },
                Err(e) => serde_json::json!({"ok": false, "error": format!("bad request: {e}")}),
            };
            let _ = w.write_all(format!("{reply}\n").as_bytes()).await;
        });
    }
}

/// Sends one request to a node's admin address and returns its JSON reply.
pub async fn request(
    addr: SocketAddr,
    req: &Request,
) -> Result<serde_json::Value, Box<dyn std::error::Error>> {
    let stream = tokio::net::TcpStream::connect(addr).await?;
    let (r, mut w) = stream.into_split();
    w.write_all(format!("{}\n", serde_json::to_string(req)?).as_bytes())
        .await?;
    let mut line = String::new();
    BufReader::new(r).read_line(&mut line).await?;
    Ok(serde_json::from_str(&line)?)
}
