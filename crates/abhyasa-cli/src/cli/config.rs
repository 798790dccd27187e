//! The node's configuration file (TOML): every section, its defaults, and the checks run
//! before a node starts on it.

use super::*;

/// `abhyasa node` configuration.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct NodeConfig {
    pub(super) agent: String,
    pub(super) listen: SocketAddr,
    pub(super) certs: PathBuf,
    pub(super) state: PathBuf,
    /// The admin interface: a socket path or `host:port`; default `<state>/admin.sock`.
    pub(super) admin: Option<String>,
    /// Allow a TCP admin address that is not loopback (a token is still required).
    #[serde(default)]
    pub(super) admin_allow_remote: bool,
    #[serde(default)]
    pub(super) peers: Vec<PeerConfig>,
    /// MOQT relays to meet peers at (`[[relays]] url = "moqt://host:port"`).
    #[serde(default)]
    pub(super) relays: Vec<RelayConfig>,
    #[serde(default)]
    pub(super) custody: CustodyConfig,
    #[serde(default)]
    pub(super) transport: TransportConfig,
    #[serde(default)]
    pub(super) limits: LimitsConfig,
    /// Present: the node takes part in the budget ledger.
    pub(super) ledger: Option<LedgerConfig>,
    /// Present: `abhyasa mcp` serves these tools for this principal.
    pub(super) mcp: Option<crate::mcp_cli::McpConfig>,
    /// Present: the node serves the A2A binding over HTTPS.
    pub(super) a2a: Option<A2aConfig>,
    /// Present: the node serves its enforcement points (docs/ENFORCEMENT.md).
    pub(super) enforce: Option<EnforceSection>,
    /// Present: a command decides, before each apply, whether this agent applies, declines
    /// or defers (docs/CUSTODY.md, "Agents decide").
    pub(super) policy: Option<crate::policy::PolicySection>,
    /// Present: the node keeps its outbox and delivers it (docs/OPERATOR.md, "Events out").
    pub(super) events: Option<crate::operator::EventsSection>,
    /// Present: the node serves its metrics and console (docs/OPERATOR.md).
    pub(super) observe: Option<crate::operator::ObserveSection>,
}

/// `[enforce]`: RFC 7662 introspection, RFC 7009 revocation and the proxy check, answered
/// from this node's decisions as principal (docs/ENFORCEMENT.md).
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct EnforceSection {
    /// Where to listen: loopback only.
    pub(super) listen: SocketAddr,
    /// The key callers show (created 0600 when absent); default `<state>/enforce.key`.
    #[serde(default)]
    pub(super) key_file: Option<PathBuf>,
    /// The agents an RFC 7009 revocation is carried to; default every `[[peers]]` id.
    #[serde(default)]
    pub(super) holders: Option<Vec<String>>,
    /// The deadline of a revocation's obligations, ms.
    #[serde(default = "default_revoke_deadline_ms")]
    pub(super) revoke_deadline_ms: u64,
    /// The client id a revocation names when the request and the upstream give none.
    #[serde(default)]
    pub(super) client_id: Option<String>,
    /// The authorization server asked about tokens this node does not govern.
    #[serde(default)]
    pub(super) upstream: Option<UpstreamSection>,
}

pub(super) fn default_revoke_deadline_ms() -> u64 {
    30_000
}

/// `[enforce.upstream]`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct UpstreamSection {
    /// The upstream's introspection URL.
    pub(super) url: String,
    /// A file (0600) holding the `Authorization` header value to present, e.g. `Basic …`.
    #[serde(default)]
    pub(super) authorization_file: Option<PathBuf>,
    /// PEM roots for an `https://` URL.
    #[serde(default)]
    pub(super) ca: Option<PathBuf>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub(super) struct LedgerConfig {
    /// Also a gateway, running effects with the reference executor (`<state>/effects.log`).
    pub(super) gateway: bool,
    /// Resend period of undecided transfers and dispatches, ms.
    pub(super) resend_ms: u64,
    /// Journal steps past which the branch takes no new work (`docs/LIMITS.md`).
    pub(super) max_journal_steps: u64,
    /// Journal steps after which the branch checkpoints and the journal before it is
    /// dropped (`docs/LEDGER.md`); 0: never.
    pub(super) checkpoint_steps: u64,
    /// How long a permit this branch signs stays valid, ms (0: for ever, and gateways that
    /// forget settled acceptances — `gateway_retain_ms` > 0, the default — refuse it).
    pub(super) permit_ttl_ms: u64,
    /// As a gateway: how long a settled acceptance is kept after its permit expired, ms
    /// (0: for ever).
    pub(super) gateway_retain_ms: u64,
    /// Who may sign root grants (their certificates `<name>.pem` are in the certs directory).
    pub(super) issuers: Vec<String>,
}

impl Default for LedgerConfig {
    fn default() -> Self {
        Self {
            gateway: false,
            resend_ms: 500,
            max_journal_steps: abhyasa_ledger::BranchConfig::default().max_journal_steps,
            checkpoint_steps: abhyasa_ledger::BranchConfig::default().checkpoint_steps,
            permit_ttl_ms: 3_600_000,
            gateway_retain_ms: 86_400_000,
            issuers: vec!["issuer".into()],
        }
    }
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub(super) struct TransportConfig {
    pub(super) keep_alive_ms: u64,
    pub(super) idle_timeout_ms: u64,
    pub(super) initial_rtt_ms: u64,
    pub(super) congestion: String,
    /// Re-dial a dialed peer whose connection went silent for this long; 0 turns it off.
    pub(super) stall_redial_ms: u64,
}

impl Default for TransportConfig {
    fn default() -> Self {
        let d = TransportSettings::default();
        Self {
            keep_alive_ms: d.keep_alive.as_millis() as u64,
            idle_timeout_ms: d.idle_timeout.as_millis() as u64,
            initial_rtt_ms: d.initial_rtt.as_millis() as u64,
            congestion: "cubic".into(),
            stall_redial_ms: TransportSettings::default()
                .stall_redial
                .map_or(0, |d| d.as_millis() as u64),
        }
    }
}

impl TransportConfig {
    pub(super) fn settings(&self) -> Result<TransportSettings> {
        let congestion = match self.congestion.as_str() {
            "cubic" => Congestion::Cubic,
            "newreno" => Congestion::NewReno,
            "bbr" => Congestion::Bbr,
            other => {
                return Err(format!(
                    "unknown congestion controller {other:?} (cubic, newreno, bbr)"
                )
                .into())
            }
        };
        Ok(TransportSettings {
            keep_alive: Duration::from_millis(self.keep_alive_ms),
            idle_timeout: Duration::from_millis(self.idle_timeout_ms),
            initial_rtt: Duration::from_millis(self.initial_rtt_ms),
            congestion,
            stall_redial: (self.stall_redial_ms > 0)
                .then(|| Duration::from_millis(self.stall_redial_ms)),
            ..TransportSettings::default()
        })
    }
}

/// An MOQT relay (draft-14, e.g. `moq-relay` 0.17) the node meets its peers at.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RelayConfig {
    /// `moqt://host:port`.
    pub(super) url: String,
    /// The name the relay's certificate carries (as its agent id when the deployment CA
    /// issued it, as a DNS name under `ca`); default `relay`.
    #[serde(default = "default_relay_name")]
    pub(super) name: String,
    /// Meet only these peers here (subscribe to their namespaces only); default: everyone.
    /// Applies to every relay of the node.
    #[serde(default)]
    pub(super) peers: Option<Vec<String>>,
    /// The relay operator's CA certificate (PEM) that issued the relay's certificate for
    /// `name`, when it is not the deployment CA.
    #[serde(default)]
    pub(super) ca: Option<PathBuf>,
    /// Or the SHA-256 of the relay's certificate (DER), hex, colons allowed (a self-signed
    /// relay: `openssl x509 -in relay.pem -outform der | sha256sum`).
    #[serde(default)]
    pub(super) fingerprint: Option<String>,
}

pub(super) fn default_relay_name() -> String {
    "relay".into()
}

impl RelayConfig {
    /// How the relay's certificate is trusted: by `ca`, by `fingerprint`, or (neither) as a
    /// deployment certificate naming `name`.
    pub(super) fn trust(&self) -> std::result::Result<abhyasa_moq::RelayTrust, String> {
        use abhyasa_moq::RelayTrust;
        match (&self.ca, &self.fingerprint) {
            (Some(_), Some(_)) => Err(format!(
                "relay {:?}: give `ca` or `fingerprint`, not both",
                self.url
            )),
            (Some(path), None) => abhyasa_moq::read_certificate(path)
                .map(RelayTrust::Ca)
                .map_err(|e| format!("relay ca: {e}")),
            (None, Some(hexed)) => {
                let digits: String = hexed.chars().filter(|c| *c != ':').collect();
                hex::decode(digits.trim())
                    .ok()
                    .and_then(|b| <[u8; 32]>::try_from(b).ok())
                    .map(RelayTrust::Fingerprint)
                    .ok_or_else(|| {
                        format!("relay fingerprint {hexed:?}: expected 32 bytes of hex (SHA-256)")
                    })
            }
            (None, None) => Ok(RelayTrust::Deployment),
        }
    }

    /// The relay's address, from `moqt://host:port` (a name is resolved once, at start).
    pub(super) fn addr(&self) -> std::result::Result<SocketAddr, String> {
        use std::net::ToSocketAddrs;
        let rest = self
            .url
            .strip_prefix("moqt://")
            .ok_or_else(|| format!("relay url {:?}: expected moqt://host:port", self.url))?;
        rest.trim_end_matches('/')
            .to_socket_addrs()
            .map_err(|e| format!("relay url {:?}: {e}", self.url))?
            .next()
            .ok_or_else(|| format!("relay url {:?}: no address", self.url))
    }
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct PeerConfig {
    pub(super) id: String,
    /// Where it listens (every transport but an MCP server reached by `command`).
    #[serde(default)]
    pub(super) addr: Option<SocketAddr>,
    /// `"moqt"` (the default: a MOQT session over QUIC), `"mcp"` (an MCP session over QUIC in
    /// the MCP-over-MOQT layout, to a peer serving `[mcp]`, or over the stdio of `command`) or
    /// `"a2a"` (HTTPS, the peer's card).
    #[serde(default)]
    pub(super) transport: Option<String>,
    /// For `mcp`: an MCP server this node spawns and speaks to over its stdin/stdout, e.g.
    /// `["abhyasa", "mcp", "--config", "agent.toml", "--stdio"]` (configured with `[mcp]
    /// principal` = this node). Restarted when it exits.
    #[serde(default)]
    pub(super) command: Option<Vec<String>>,
    /// For `mcp`: a streamable HTTP server's `http://` URL (e.g. `abhyasa mcp --http`).
    #[serde(default)]
    pub(super) url: Option<String>,
    /// For `mcp` with `url`: the server's bearer token file (`abhyasa mcp --http` writes
    /// `<its state>/mcp.token`).
    #[serde(default)]
    pub(super) token_file: Option<PathBuf>,
    /// For `a2a`: the card's URL (default `https://<id>:<addr port>/.well-known/agent-card.json`,
    /// with `<id>` resolved to `addr`).
    #[serde(default)]
    pub(super) card: Option<String>,
}

impl PeerConfig {
    /// The address, which this peer's transport needs.
    pub(super) fn addr(&self) -> std::result::Result<SocketAddr, String> {
        self.addr.ok_or_else(|| {
            format!(
                "peer {}: addr is needed for transport {:?}",
                self.id,
                self.transport.as_deref().unwrap_or("moqt")
            )
        })
    }

    /// How an `mcp` peer is reached.
    pub(super) fn mcp_route(&self) -> std::result::Result<abhyasa_mcp::McpRoute, String> {
        match (&self.command, &self.url, self.addr) {
            (Some(_), Some(_), _) => Err(format!("peer {}: command or url, not both", self.id)),
            (Some(c), None, _) if c.is_empty() => {
                Err(format!("peer {}: command is empty", self.id))
            }
            (Some(c), None, _) => Ok(abhyasa_mcp::McpRoute::Command(c.clone())),
            (None, Some(u), _) if !u.starts_with("http://") => Err(format!(
                "peer {}: url must be http:// (streamable HTTP on loopback), not {u:?}",
                self.id
            )),
            (None, Some(u), _) => Ok(abhyasa_mcp::McpRoute::Url {
                url: u.clone(),
                token_file: self.token_file.clone(),
            }),
            (None, None, Some(a)) => Ok(abhyasa_mcp::McpRoute::Quic(a)),
            (None, None, None) => Err(format!(
                "peer {}: an mcp peer needs addr (MCP over QUIC), command (stdio) or url (HTTP)",
                self.id
            )),
        }
    }
}

/// `[a2a]`: the node's HTTPS face (docs/A2A.md).
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct A2aConfig {
    /// Where the HTTPS server listens.
    pub(super) listen: SocketAddr,
    /// The base URL the card names (default `https://<agent>:<listen port>`).
    #[serde(default)]
    pub(super) public: Option<String>,
    /// Whether the card marks the extension required.
    #[serde(default)]
    pub(super) required: bool,
    /// The deadline each kind's profile is made for, seconds (default 3600), by kind name.
    #[serde(default)]
    pub(super) deadline_seconds: std::collections::BTreeMap<String, u64>,
}

/// `[limits]`: what the node holds its peers and itself to (`docs/LIMITS.md`). Each past its
/// limit ends in an error that names it.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub(super) struct LimitsConfig {
    /// Obligations under custody at once, in all.
    pub(super) max_pending: usize,
    /// Obligations under custody at once for one target.
    pub(super) max_pending_per_target: usize,
    /// Principal-side entries (authorizations, keyed adjustments, revoked tokens).
    pub(super) max_principal_entries: usize,
    /// Applied ids this node, as agent, retains per issuer (each until its deadline plus the
    /// clock skew); past it that issuer's new obligations are deferred.
    pub(super) max_applied: usize,
    /// Governed keys (scopes, weight keys, tokens) this node, as agent, holds per issuer;
    /// an obligation that would add one past it is declined `over_limit`.
    pub(super) max_governed: usize,
    /// Sessions one peer may hold with this node; a newer one closes its oldest.
    pub(super) sessions_per_peer: usize,
    /// Requests (subscriptions among them) one peer may make on one session.
    pub(super) requests_per_session: u64,
    /// Objects taken from one group of a peer's; the rest is ignored.
    pub(super) objects_per_group: usize,
    /// Objects (obligations on any binding, ledger messages) one peer may hand in per
    /// second; past it they are dropped unread and sent again later. 0: no limit.
    pub(super) requests_per_second_per_peer: u32,
    /// How long a ledger request waits for its durable answer, ms; past it the request
    /// fails `no durable answer` (ask again with the same key).
    pub(super) answer_within_ms: u64,
    /// How long terminal records, escalations and notes are kept, ms.
    pub(super) history_retention_ms: u64,
    /// Most terminal records kept (the oldest go first).
    pub(super) max_terminal_records: u64,
    /// The store's page cache, bytes: with the in-memory state, what bounds resident memory.
    pub(super) store_cache_bytes: usize,
}

impl Default for LimitsConfig {
    fn default() -> Self {
        let (c, r, n, s) = (
            CustodianConfig::default(),
            abhyasa_custody::ReceiverConfig::default(),
            abhyasa_node::Limits::default(),
            abhyasa_store::StoreConfig::default(),
        );
        Self {
            max_pending: c.max_pending,
            max_pending_per_target: c.max_pending_per_target,
            max_principal_entries: c.max_principal_entries,
            max_applied: r.max_applied,
            max_governed: r.max_governed,
            sessions_per_peer: n.sessions_per_peer,
            requests_per_session: n.session.max_requests,
            objects_per_group: n.session.max_objects_per_group,
            requests_per_second_per_peer: n.requests_per_second_per_peer,
            answer_within_ms: n.answer_within.as_millis() as u64,
            history_retention_ms: s.retention_ms,
            max_terminal_records: s.max_terminal,
            store_cache_bytes: s.cache_bytes,
        }
    }
}

impl LimitsConfig {
    /// Every limit must let something through: a zero would refuse all work (the rate, where
    /// 0 means no limit, aside). An Abhyasa peer makes four requests per session.
    pub(super) fn check(&self) -> Result<()> {
        let counts = [
            ("max_pending", self.max_pending as u64),
            ("max_pending_per_target", self.max_pending_per_target as u64),
            ("max_principal_entries", self.max_principal_entries as u64),
            ("max_applied", self.max_applied as u64),
            ("max_governed", self.max_governed as u64),
            ("sessions_per_peer", self.sessions_per_peer as u64),
            ("objects_per_group", self.objects_per_group as u64),
            ("max_terminal_records", self.max_terminal_records),
            ("answer_within_ms", self.answer_within_ms),
        ];
        for (name, value) in counts {
            if value == 0 {
                return Err(format!("[limits] {name} must be at least 1").into());
            }
        }
        if self.requests_per_session < 4 {
            return Err(format!(
                "[limits] requests_per_session must be at least 4 (a session makes four), not {}",
                self.requests_per_session
            )
            .into());
        }
        Ok(())
    }
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub(super) struct CustodyConfig {
    pub(super) response_timeout_ms: u64,
    pub(super) backoff_base_ms: u64,
    pub(super) backoff_cap_ms: u64,
    /// `"stream"` (default) or `"datagram"`: how the first attempt travels.
    pub(super) first_attempt: String,
    /// Kinds whose obligations must carry a retry budget that spans their deadline (the
    /// retry rule (docs/DESIGN.md, "On the wire")); a shorter one is refused with the number needed.
    pub(super) require_spanning_budget: Vec<abhyasa_wire::Kind>,
    /// How often maintenance runs (folding principal down-weights, pruning old history).
    pub(super) maintenance_ms: u64,
}

impl Default for CustodyConfig {
    fn default() -> Self {
        let d = CustodianConfig::default();
        Self {
            response_timeout_ms: d.response_timeout_ms,
            backoff_base_ms: d.backoff_base_ms,
            backoff_cap_ms: d.backoff_cap_ms,
            first_attempt: "stream".into(),
            require_spanning_budget: Vec::new(),
            maintenance_ms: 60_000,
        }
    }
}

pub(super) fn read_config(path: &std::path::Path) -> Result<NodeConfig> {
    let text = std::fs::read_to_string(path).map_err(|e| format!("{}: {e}", path.display()))?;
    toml::from_str(&text).map_err(|e| format!("{}: {e}", path.display()).into())
}

/// Reads a node config as `abhyasa node` does and makes every check that needs neither the
/// disk nor the network (names, transport and custody settings, each peer's route). The
/// config fuzz target (`fuzz/fuzz_targets/config.rs`) drives it with arbitrary text.
pub fn check_config_text(text: &str) -> std::result::Result<(), String> {
    let config: NodeConfig = toml::from_str(text).map_err(|e| e.to_string())?;
    config.check().map_err(|e| e.to_string())
}

impl NodeConfig {
    /// What can be checked without the disk or the network.
    pub(super) fn check(&self) -> Result<()> {
        AgentId::new(self.agent.clone())?;
        self.transport.settings()?;
        self.custody.channel()?;
        self.limits.check()?;
        if let Some(p) = &self.policy {
            p.check()?;
        }
        if let Some(e) = &self.events {
            e.check()?;
        }
        if let Some(o) = &self.observe {
            o.check()?;
        }
        for p in &self.peers {
            AgentId::new(p.id.clone())?;
            match p.transport.as_deref().unwrap_or("moqt") {
                "moqt" | "a2a" => {
                    p.addr()?;
                }
                "mcp" => {
                    p.mcp_route()?;
                }
                other => {
                    return Err(format!(
                        "peer {}: transport must be \"moqt\", \"mcp\" or \"a2a\", not {other:?}",
                        p.id
                    )
                    .into())
                }
            }
        }
        for r in &self.relays {
            AgentId::new(r.name.clone()).map_err(|e| format!("relay name {:?}: {e}", r.name))?;
            r.addr()?;
            r.trust()?;
            for p in r.peers.iter().flatten() {
                AgentId::new(p.clone()).map_err(|e| format!("relay peer {p:?}: {e}"))?;
            }
        }
        Ok(())
    }
}

impl CustodyConfig {
    /// How the first attempt travels.
    pub(super) fn channel(&self) -> Result<Channel> {
        match self.first_attempt.as_str() {
            "stream" => Ok(Channel::Stream),
            "datagram" => Ok(Channel::Datagram),
            other => Err(format!(
                "custody.first_attempt must be \"stream\" or \"datagram\", not {other:?}"
            )
            .into()),
        }
    }
}
