//! The `abhyasa` command.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use crate::admin::{self, AdminAddr, AdminTarget, IssueSpec, Request, StatusJson};
use crate::demo::{self, DemoConfig};
use crate::ledger_cli;
use crate::soak;
use crate::sweep;
use abhyasa_custody::{Channel, CustodianConfig};
use abhyasa_moq::{Ca, Congestion, Identity, TransportSettings};
use abhyasa_node::Node;
use abhyasa_wire::AgentId;
use clap::{Parser, Subcommand};
use serde::Deserialize;

#[derive(Parser)]
#[command(
    version,
    about = "Deliver-or-report custody of governance obligations over QUIC"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// A principal and two agents on loopback QUIC, in one process, no setup.
    Demo {
        /// Obligations to issue.
        #[arg(long, default_value_t = 24)]
        count: u32,
        /// Deadline of each obligation, ms.
        #[arg(long, default_value_t = 3_000)]
        deadline_ms: u64,
        /// Impair the principal ↔ agent-0 link (both directions) through the userspace netem relay.
        #[command(flatten)]
        impair: ImpairmentArgs,
    },
    /// One principal and many agents (node processes) under a steady mix of obligations while
    /// links are partitioned and agents SIGKILLed (agent-0 only partitioned); samples the
    /// principal's and agent-0's memory and open files, and audits every store at the end
    /// (docs/SOAK.md).
    Soak {
        /// How long to issue and inject faults: `90s`, `10m`, `1h` (a plain number: seconds).
        #[arg(long, default_value = "10m", value_parser = parse_duration)]
        duration: Duration,
        /// Agents.
        #[arg(long, default_value_t = 8)]
        agents: usize,
        /// Obligations issued per second.
        #[arg(long, default_value_t = 50.0)]
        rate: f64,
        /// Deadline of each obligation, ms.
        #[arg(long, default_value_t = 20_000)]
        deadline_ms: u64,
        /// A partition or a SIGKILL of an agent every this many ms.
        #[arg(long, default_value_t = 2_000)]
        fault_every_ms: u64,
        /// Seed of the workload and the faults.
        #[arg(long, default_value_t = 1)]
        seed: u64,
        /// Where to write soak.csv, soak-latency.csv and soak.svg.
        #[arg(long)]
        out: Option<PathBuf>,
        /// Working directory for certificates, configs, states and node logs (default: a
        /// temporary one, removed at the end).
        #[arg(long)]
        dir: Option<PathBuf>,
        /// Each node's store page cache, MiB (`[limits] store_cache_bytes`; default the
        /// node's own, 64).
        #[arg(long)]
        store_cache_mib: Option<usize>,
        /// The kinds of the mix, comma-separated (default: all three, drawn uniformly).
        #[arg(long, value_enum, value_delimiter = ',')]
        kinds: Vec<soak::SoakKind>,
        /// Instead of partitions and kills, attack agent-0 beside the honest principal: 2,000
        /// idle admin connections, 300 stalled QUIC setups, four sessions of never-ended
        /// streams, and a member crowding its applied ids (docs/SECURITY.md). Every honest
        /// obligation under custody must then end applied.
        #[arg(long)]
        adversary: bool,
    },
    /// A UDP relay that impairs traffic like `tc netem`, to put between two nodes.
    Netem {
        /// Where clients (a dialing node) send.
        #[arg(long)]
        listen: SocketAddr,
        /// Where the relay forwards (the dialed node).
        #[arg(long)]
        forward: SocketAddr,
        #[command(flatten)]
        both: ImpairmentArgs,
        /// Extra words for client→server only, e.g. "loss 10%".
        #[arg(long, default_value = "")]
        up: String,
        /// Extra words for server→client only.
        #[arg(long, default_value = "")]
        down: String,
        /// Seed for every random choice.
        #[arg(long, default_value_t = 1)]
        seed: u64,
    },
    /// Deployment CA and agent certificates.
    Certs {
        #[command(subcommand)]
        command: CertsCommand,
    },
    /// Run a node from a TOML config.
    Node {
        /// The config file.
        #[arg(long)]
        config: PathBuf,
    },
    /// Run a node from a TOML config and serve MCP on this process's stdin/stdout: the
    /// obligations riding each tool call are applied before the tool runs, and `[mcp]`
    /// tools are refused while what they use is withheld or revoked.
    Mcp {
        /// The config file (with an `[mcp]` section).
        #[arg(long)]
        config: PathBuf,
        /// Serve over stdio (for hosts that spawn MCP servers).
        #[arg(long, conflicts_with = "http")]
        stdio: bool,
        /// Serve over streamable HTTP at `http://ADDR/mcp` (loopback only: plain HTTP
        /// authenticates no one, so every session acts as `[mcp] principal`).
        #[arg(long)]
        http: Option<SocketAddr>,
    },
    /// Print the node's A2A AgentCard (with the Abhyasa extension and its per-kind profiles),
    /// as the node serves it at `/.well-known/agent-card.json` when `[a2a]` is configured.
    Card {
        /// The config file.
        #[arg(long)]
        config: PathBuf,
    },
    /// Print an obligation as base64 CBOR (an entry of MCP's `org.abhyasa/obligations`), for
    /// clients in other languages.
    Encode {
        /// The issuing principal.
        #[arg(long)]
        issuer: String,
        /// The obligation id (32 hex digits); random when absent.
        #[arg(long)]
        id: Option<String>,
        #[command(flatten)]
        spec: Box<IssueSpec>,
    },
    /// Audit stopped nodes from their state directories alone (`--state NAME=DIR`, once per
    /// node): nothing pending and terminal at once, every escalation's safe action in force,
    /// no id applied twice, nothing applied that its principal does not know or declined.
    /// Exits non-zero on any violation.
    Check {
        /// `agent=state-dir`, once per node.
        #[arg(long = "state", required = true)]
        states: Vec<String>,
    },
    /// Submit an obligation to a running node.
    Issue {
        #[command(flatten)]
        admin: AdminTarget,
        #[command(flatten)]
        spec: Box<IssueSpec>,
    },
    /// Show a running node's pending set, outcomes, escalations and principal state.
    Status {
        #[command(flatten)]
        admin: AdminTarget,
        /// Print JSON.
        #[arg(long)]
        json: bool,
    },
    /// The budget ledger: grant, delegate, spend, reclaim and status through a running node's
    /// admin interface; check stopped nodes' state.
    Ledger {
        #[command(subcommand)]
        command: crate::ledger_cmd::LedgerCli,
    },
    /// End-to-end sweeps over loopback QUIC through the emulator, written as CSV and SVG.
    Sweep {
        #[command(subcommand)]
        which: SweepCommand,
        /// Where the CSV and SVG files go.
        #[arg(long, global = true, default_value = "docs/bench")]
        out: PathBuf,
    },
}

#[derive(Subcommand)]
enum SweepCommand {
    /// Spurious escalations against partition length over the deadline.
    Partition {
        /// Deadline of each obligation, ms.
        #[arg(long, default_value_t = 1_000)]
        deadline_ms: u64,
        /// Obligations issued per point.
        #[arg(long, default_value_t = 100)]
        obligations: u64,
        /// Partition lengths as fractions of the deadline, comma-separated.
        #[arg(
            long,
            value_delimiter = ',',
            default_value = "0,0.1,0.2,0.3,0.4,0.5,0.6,0.7,0.8,0.9,1.0,1.1,1.2"
        )]
        fractions: Vec<f64>,
        /// Backoff caps to compare, ms, comma-separated.
        #[arg(long, value_delimiter = ',', default_value = "50,250")]
        caps_ms: Vec<u64>,
    },
    /// Discharge time against loss, first attempt on a stream and as a datagram.
    Loss {
        /// Loss rates in percent, comma-separated.
        #[arg(long, value_delimiter = ',', default_value = "0,1,5,10,20")]
        loss: Vec<f64>,
        /// Obligations per point.
        #[arg(long, default_value_t = 60)]
        obligations: u64,
    },
    /// Restart with many obligations pending: time to resumed custody.
    Recovery {
        /// Pending sizes, comma-separated.
        #[arg(long, value_delimiter = ',', default_value = "1000,10000,100000")]
        pending: Vec<u64>,
        /// Restarts per size.
        #[arg(long, default_value_t = 3)]
        runs: u32,
    },
    /// One principal and N agents in this process, met directly and (with `moq-relay`
    /// installed by scripts/moq-relay.sh) at the relay: obligations/s, latency, memory/node.
    Fanout {
        /// Agent counts, comma-separated.
        #[arg(long, value_delimiter = ',', default_value = "10,100,1000")]
        agents: Vec<usize>,
        /// Obligations per point, spread over the agents.
        #[arg(long, default_value_t = 5_000)]
        obligations: u64,
        /// Obligations in flight at once.
        #[arg(long, default_value_t = 256)]
        window: usize,
        /// Only the direct points, even when the relay is installed.
        #[arg(long, conflicts_with = "relay_only")]
        direct_only: bool,
        /// Only the relay points (it must be installed).
        #[arg(long)]
        relay_only: bool,
    },
    /// Resident memory per pending obligation, and over a million obligations passed through.
    Memory {
        /// Obligations left pending (their agent unreachable).
        #[arg(long, default_value_t = 100_000)]
        pending: u64,
        /// Obligations passed through a principal and its agent.
        #[arg(long, default_value_t = 1_000_000)]
        through: u64,
        /// Sample resident memory after every this many.
        #[arg(long, default_value_t = 50_000)]
        sample_every: u64,
    },
}

/// netem words as flags, applied to both directions.
#[derive(clap::Args, Debug, Default)]
struct ImpairmentArgs {
    /// Independent loss, e.g. 5%.
    #[arg(long)]
    loss: Option<String>,
    /// One-way delay, e.g. 20ms.
    #[arg(long)]
    delay: Option<String>,
    /// Delay jitter, e.g. 5ms.
    #[arg(long)]
    jitter: Option<String>,
    /// Duplication, e.g. 1%.
    #[arg(long)]
    duplicate: Option<String>,
    /// Reordering, e.g. 10% (needs a delay).
    #[arg(long)]
    reorder: Option<String>,
    /// Link rate, e.g. 10mbit.
    #[arg(long)]
    rate: Option<String>,
    /// A blackhole window START:LENGTH after the start, e.g. 1s:2s (repeatable).
    #[arg(long)]
    partition: Vec<String>,
}

impl ImpairmentArgs {
    /// The flags as netem words.
    fn words(&self) -> String {
        let mut w = Vec::new();
        if let Some(l) = &self.loss {
            w.push(format!("loss {l}"));
        }
        if let Some(d) = &self.delay {
            w.push(format!(
                "delay {d} {}",
                self.jitter.as_deref().unwrap_or("0ms")
            ));
        }
        if let Some(d) = &self.duplicate {
            w.push(format!("duplicate {d}"));
        }
        if let Some(r) = &self.reorder {
            w.push(format!("reorder {r}"));
        }
        if let Some(r) = &self.rate {
            w.push(format!("rate {r}"));
        }
        for p in &self.partition {
            w.push(format!("partition {}", p.replace(':', " ")));
        }
        w.join(" ")
    }
}

#[derive(Subcommand)]
enum CertsCommand {
    /// Create the deployment CA (`ca.pem`, `ca.key`).
    Init {
        /// Directory.
        #[arg(long, default_value = "certs")]
        dir: PathBuf,
    },
    /// Issue a certificate for an agent (`<agent>.pem`, `<agent>.key`).
    Issue {
        /// The agent id.
        agent: String,
        /// Directory holding the CA.
        #[arg(long, default_value = "certs")]
        dir: PathBuf,
    },
}

/// `abhyasa node` configuration.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct NodeConfig {
    agent: String,
    listen: SocketAddr,
    certs: PathBuf,
    state: PathBuf,
    /// The admin interface: a socket path or `host:port`; default `<state>/admin.sock`.
    admin: Option<String>,
    /// Allow a TCP admin address that is not loopback (a token is still required).
    #[serde(default)]
    admin_allow_remote: bool,
    #[serde(default)]
    peers: Vec<PeerConfig>,
    /// MOQT relays to meet peers at (`[[relays]] url = "moqt://host:port"`).
    #[serde(default)]
    relays: Vec<RelayConfig>,
    #[serde(default)]
    custody: CustodyConfig,
    #[serde(default)]
    transport: TransportConfig,
    #[serde(default)]
    limits: LimitsConfig,
    /// Present: the node takes part in the budget ledger.
    ledger: Option<LedgerConfig>,
    /// Present: `abhyasa mcp` serves these tools for this principal.
    mcp: Option<crate::mcp_cli::McpConfig>,
    /// Present: the node serves the A2A binding over HTTPS.
    a2a: Option<A2aConfig>,
    /// Present: the node serves its enforcement points (docs/ENFORCEMENT.md).
    enforce: Option<EnforceSection>,
    /// Present: a command decides, before each apply, whether this agent applies, declines
    /// or defers (docs/CUSTODY.md, "Agents decide").
    policy: Option<crate::policy::PolicySection>,
    /// Present: the node keeps its outbox and delivers it (docs/OPERATOR.md, "Events out").
    events: Option<crate::operator::EventsSection>,
    /// Present: the node serves its metrics and console (docs/OPERATOR.md).
    observe: Option<crate::operator::ObserveSection>,
}

/// `[enforce]`: RFC 7662 introspection, RFC 7009 revocation and the proxy check, answered
/// from this node's decisions as principal (docs/ENFORCEMENT.md).
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct EnforceSection {
    /// Where to listen: loopback only.
    listen: SocketAddr,
    /// The key callers show (created 0600 when absent); default `<state>/enforce.key`.
    #[serde(default)]
    key_file: Option<PathBuf>,
    /// The agents an RFC 7009 revocation is carried to; default every `[[peers]]` id.
    #[serde(default)]
    holders: Option<Vec<String>>,
    /// The deadline of a revocation's obligations, ms.
    #[serde(default = "default_revoke_deadline_ms")]
    revoke_deadline_ms: u64,
    /// The client id a revocation names when the request and the upstream give none.
    #[serde(default)]
    client_id: Option<String>,
    /// The authorization server asked about tokens this node does not govern.
    #[serde(default)]
    upstream: Option<UpstreamSection>,
}

fn default_revoke_deadline_ms() -> u64 {
    30_000
}

/// `[enforce.upstream]`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct UpstreamSection {
    /// The upstream's introspection URL.
    url: String,
    /// A file (0600) holding the `Authorization` header value to present, e.g. `Basic …`.
    #[serde(default)]
    authorization_file: Option<PathBuf>,
    /// PEM roots for an `https://` URL.
    #[serde(default)]
    ca: Option<PathBuf>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, default)]
struct LedgerConfig {
    /// Also a gateway, running effects with the reference executor (`<state>/effects.log`).
    gateway: bool,
    /// Resend period of undecided transfers and dispatches, ms.
    resend_ms: u64,
    /// Journal steps past which the branch takes no new work (`docs/LIMITS.md`).
    max_journal_steps: u64,
    /// Journal steps after which the branch checkpoints and the journal before it is
    /// dropped (`docs/LEDGER.md`); 0: never.
    checkpoint_steps: u64,
    /// How long a permit this branch signs stays valid, ms (0: for ever, and gateways that
    /// forget settled acceptances — `gateway_retain_ms` > 0, the default — refuse it).
    permit_ttl_ms: u64,
    /// As a gateway: how long a settled acceptance is kept after its permit expired, ms
    /// (0: for ever).
    gateway_retain_ms: u64,
    /// Who may sign root grants (their certificates `<name>.pem` are in the certs directory).
    issuers: Vec<String>,
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
struct TransportConfig {
    keep_alive_ms: u64,
    idle_timeout_ms: u64,
    initial_rtt_ms: u64,
    congestion: String,
    /// Re-dial a dialed peer whose connection went silent for this long; 0 turns it off.
    stall_redial_ms: u64,
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
    fn settings(&self) -> Result<TransportSettings> {
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
struct RelayConfig {
    /// `moqt://host:port`.
    url: String,
    /// The name the relay's certificate carries (as its agent id when the deployment CA
    /// issued it, as a DNS name under `ca`); default `relay`.
    #[serde(default = "default_relay_name")]
    name: String,
    /// Meet only these peers here (subscribe to their namespaces only); default: everyone.
    /// Applies to every relay of the node.
    #[serde(default)]
    peers: Option<Vec<String>>,
    /// The relay operator's CA certificate (PEM) that issued the relay's certificate for
    /// `name`, when it is not the deployment CA.
    #[serde(default)]
    ca: Option<PathBuf>,
    /// Or the SHA-256 of the relay's certificate (DER), hex, colons allowed (a self-signed
    /// relay: `openssl x509 -in relay.pem -outform der | sha256sum`).
    #[serde(default)]
    fingerprint: Option<String>,
}

fn default_relay_name() -> String {
    "relay".into()
}

impl RelayConfig {
    /// How the relay's certificate is trusted: by `ca`, by `fingerprint`, or (neither) as a
    /// deployment certificate naming `name`.
    fn trust(&self) -> std::result::Result<abhyasa_moq::RelayTrust, String> {
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
    fn addr(&self) -> std::result::Result<SocketAddr, String> {
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
struct PeerConfig {
    id: String,
    /// Where it listens (every transport but an MCP server reached by `command`).
    #[serde(default)]
    addr: Option<SocketAddr>,
    /// `"moqt"` (the default: a MOQT session over QUIC), `"mcp"` (an MCP session over QUIC in
    /// the MCP-over-MOQT layout, to a peer serving `[mcp]`, or over the stdio of `command`) or
    /// `"a2a"` (HTTPS, the peer's card).
    #[serde(default)]
    transport: Option<String>,
    /// For `mcp`: an MCP server this node spawns and speaks to over its stdin/stdout, e.g.
    /// `["abhyasa", "mcp", "--config", "agent.toml", "--stdio"]` (configured with `[mcp]
    /// principal` = this node). Restarted when it exits.
    #[serde(default)]
    command: Option<Vec<String>>,
    /// For `mcp`: a streamable HTTP server's `http://` URL (e.g. `abhyasa mcp --http`).
    #[serde(default)]
    url: Option<String>,
    /// For `mcp` with `url`: the server's bearer token file (`abhyasa mcp --http` writes
    /// `<its state>/mcp.token`).
    #[serde(default)]
    token_file: Option<PathBuf>,
    /// For `a2a`: the card's URL (default `https://<id>:<addr port>/.well-known/agent-card.json`,
    /// with `<id>` resolved to `addr`).
    #[serde(default)]
    card: Option<String>,
}

impl PeerConfig {
    /// The address, which this peer's transport needs.
    fn addr(&self) -> std::result::Result<SocketAddr, String> {
        self.addr.ok_or_else(|| {
            format!(
                "peer {}: addr is needed for transport {:?}",
                self.id,
                self.transport.as_deref().unwrap_or("moqt")
            )
        })
    }

    /// How an `mcp` peer is reached.
    fn mcp_route(&self) -> std::result::Result<abhyasa_mcp::McpRoute, String> {
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
struct A2aConfig {
    /// Where the HTTPS server listens.
    listen: SocketAddr,
    /// The base URL the card names (default `https://<agent>:<listen port>`).
    #[serde(default)]
    public: Option<String>,
    /// Whether the card marks the extension required.
    #[serde(default)]
    required: bool,
    /// The deadline each kind's profile is made for, seconds (default 3600), by kind name.
    #[serde(default)]
    deadline_seconds: std::collections::BTreeMap<String, u64>,
}

/// `[limits]`: what the node holds its peers and itself to (`docs/LIMITS.md`). Each past its
/// limit ends in an error that names it.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, default)]
struct LimitsConfig {
    /// Obligations under custody at once, in all.
    max_pending: usize,
    /// Obligations under custody at once for one target.
    max_pending_per_target: usize,
    /// Principal-side entries (authorizations, keyed adjustments, revoked tokens).
    max_principal_entries: usize,
    /// Applied ids this node, as agent, retains per issuer (each until its deadline plus the
    /// clock skew); past it that issuer's new obligations are deferred.
    max_applied: usize,
    /// Governed keys (scopes, weight keys, tokens) this node, as agent, holds per issuer;
    /// an obligation that would add one past it is declined `over_limit`.
    max_governed: usize,
    /// Sessions one peer may hold with this node; a newer one closes its oldest.
    sessions_per_peer: usize,
    /// Requests (subscriptions among them) one peer may make on one session.
    requests_per_session: u64,
    /// Objects taken from one group of a peer's; the rest is ignored.
    objects_per_group: usize,
    /// Objects (obligations on any binding, ledger messages) one peer may hand in per
    /// second; past it they are dropped unread and sent again later. 0: no limit.
    requests_per_second_per_peer: u32,
    /// How long terminal records, escalations and notes are kept, ms.
    history_retention_ms: u64,
    /// Most terminal records kept (the oldest go first).
    max_terminal_records: u64,
    /// The store's page cache, bytes: with the in-memory state, what bounds resident memory.
    store_cache_bytes: usize,
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
            history_retention_ms: s.retention_ms,
            max_terminal_records: s.max_terminal,
            store_cache_bytes: s.cache_bytes,
        }
    }
}

impl LimitsConfig {
    /// Every limit must let something through: a zero would refuse all work (the rate, where
    /// 0 means no limit, aside). An Abhyasa peer makes four requests per session.
    fn check(&self) -> Result<()> {
        let counts = [
            ("max_pending", self.max_pending as u64),
            ("max_pending_per_target", self.max_pending_per_target as u64),
            ("max_principal_entries", self.max_principal_entries as u64),
            ("max_applied", self.max_applied as u64),
            ("max_governed", self.max_governed as u64),
            ("sessions_per_peer", self.sessions_per_peer as u64),
            ("objects_per_group", self.objects_per_group as u64),
            ("max_terminal_records", self.max_terminal_records),
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
struct CustodyConfig {
    response_timeout_ms: u64,
    backoff_base_ms: u64,
    backoff_cap_ms: u64,
    /// `"stream"` (default) or `"datagram"`: how the first attempt travels.
    first_attempt: String,
    /// Kinds whose obligations must carry a retry budget that spans their deadline (the
    /// retry rule (docs/DESIGN.md, "On the wire")); a shorter one is refused with the number needed.
    require_spanning_budget: Vec<abhyasa_wire::Kind>,
    /// How often maintenance runs (folding principal down-weights, pruning old history).
    maintenance_ms: u64,
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

type Result<T> = std::result::Result<T, Box<dyn std::error::Error>>;

/// Parses the command line and runs the command.
#[tokio::main]
pub async fn main() -> ExitCode {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_env("ABHYASA_LOG")
                .unwrap_or_else(|_| "warn".into()),
        )
        .with_writer(std::io::stderr)
        .init();
    match run(Cli::parse().command).await {
        Ok(code) => code,
        Err(e) => {
            eprintln!("abhyasa: {e}");
            ExitCode::FAILURE
        }
    }
}

async fn run(command: Command) -> Result<ExitCode> {
    match command {
        Command::Soak {
            duration,
            agents,
            rate,
            deadline_ms,
            fault_every_ms,
            seed,
            out,
            dir,
            store_cache_mib,
            kinds,
            adversary,
        } => {
            // The attackers hold thousands of connections from this process.
            raise_descriptor_limit();
            let tmp = tempfile::tempdir()?;
            let report = soak::run(&soak::SoakConfig {
                exe: std::env::current_exe()?,
                duration,
                agents: agents.max(1),
                rate,
                deadline_ms,
                fault_every: Duration::from_millis(fault_every_ms.max(100)),
                dir: dir.unwrap_or_else(|| tmp.path().to_owned()),
                seed,
                store_cache_bytes: store_cache_mib.map(|m| m << 20),
                kinds,
                adversary,
            })
            .await?;
            for m in &report.latency {
                println!(
                    "minute {}: {} obligations, latency p50 {} ms, p99 {} ms, max {} ms",
                    m.minute, m.n, m.p50_ms, m.p99_ms, m.max_ms
                );
            }
            for (why, n) in &report.refused {
                println!("refused {n}: {why}");
            }
            for v in &report.audit.violations {
                println!("violation: {v}");
            }
            if let Some(out) = out {
                soak::write(&report, &out).map_err(|e| e.to_string())?;
                println!(
                    "wrote soak.csv, soak-latency.csv and soak.svg under {}",
                    out.display()
                );
            }
            if let Some(a) = &report.adversary {
                println!("{}", a.summary());
            }
            println!("{}", report.summary());
            Ok(if report.clean() {
                ExitCode::SUCCESS
            } else {
                ExitCode::FAILURE
            })
        }
        Command::Sweep { which, out } => {
            let r = match which {
                SweepCommand::Partition {
                    deadline_ms,
                    obligations,
                    fractions,
                    caps_ms,
                } => sweep::partition_to(
                    &sweep::PartitionSweep {
                        deadline_ms,
                        obligations,
                        fractions,
                        caps_ms,
                        ..Default::default()
                    },
                    &out,
                )
                .await
                .map(|p| print!("{}", sweep::partition_csv(&p))),
                SweepCommand::Loss { loss, obligations } => sweep::loss_to(
                    &sweep::LossSweep {
                        loss_percent: loss,
                        obligations,
                    },
                    &out,
                )
                .await
                .map(|p| print!("{}", sweep::loss_csv(&p))),
                SweepCommand::Recovery { pending, runs } => {
                    sweep::recovery_to(&sweep::RecoverySweep { pending, runs }, &out)
                        .await
                        .map(|r| print!("{}", sweep::recovery_csv(&sweep::recovery_medians(&r))))
                }
                SweepCommand::Fanout {
                    agents,
                    obligations,
                    window,
                    direct_only,
                    relay_only,
                } => crate::fanout::fanout_to(
                    &crate::fanout::FanoutSweep {
                        agents,
                        obligations,
                        window,
                        direct: !relay_only,
                        relay: if direct_only {
                            None
                        } else {
                            crate::fanout::relay_binary()
                        },
                    },
                    &out,
                )
                .await
                .map(|p| print!("{}", crate::fanout::fanout_csv(&p))),
                SweepCommand::Memory {
                    pending,
                    through,
                    sample_every,
                } => sweep::memory_to(
                    &sweep::MemorySweep {
                        pending,
                        through,
                        sample_every,
                        ..Default::default()
                    },
                    &out,
                )
                .await
                .map(|p| print!("{}", sweep::memory_csv(&p))),
            };
            r.map_err(|e| e.to_string())?;
            println!("wrote {}", out.display());
            Ok(ExitCode::SUCCESS)
        }
        Command::Demo {
            count,
            deadline_ms,
            impair,
        } => {
            let words = impair.words();
            let impairment = if words.is_empty() {
                None
            } else {
                Some(words.parse::<abhyasa_netem::Impairment>()?)
            };
            let summary = demo::run(DemoConfig {
                count,
                deadline_ms,
                impairment,
            })
            .await?;
            println!("{summary}");
            let clean = summary.lost == 0 && summary.double_applied == 0;
            Ok(if clean {
                ExitCode::SUCCESS
            } else {
                ExitCode::FAILURE
            })
        }
        Command::Certs {
            command: CertsCommand::Init { dir },
        } => {
            let ca = Ca::generate("abhyasa deployment CA")?;
            ca.save(&dir)?;
            // The budget issuer signs root grants with its certificate key, like every
            // ledger signer.
            ca.issue(&AgentId::new("issuer")?)?.save(&dir)?;
            println!(
                "wrote {0}/ca.pem, {0}/ca.key and the budget issuer's {0}/issuer.pem, {0}/issuer.key",
                dir.display()
            );
            Ok(ExitCode::SUCCESS)
        }
        Command::Certs {
            command: CertsCommand::Issue { agent, dir },
        } => {
            let agent = AgentId::new(agent)?;
            Ca::load(&dir)?.issue(&agent)?.save(&dir)?;
            println!("wrote {0}/{agent}.pem and {0}/{agent}.key", dir.display());
            Ok(ExitCode::SUCCESS)
        }
        Command::Node { config } => node(config).await,
        Command::Netem {
            listen,
            forward,
            both,
            up,
            down,
            seed,
        } => {
            let base = both.words();
            let up: abhyasa_netem::Impairment = format!("{base} {up}").parse()?;
            let down: abhyasa_netem::Impairment = format!("{base} {down}").parse()?;
            println!("netem relay {listen} -> {forward}\n  up:   {up}\n  down: {down}");
            let relay = abhyasa_netem::relay::Relay::start(abhyasa_netem::relay::RelayConfig {
                listen,
                forward,
                up,
                down,
                seed,
            })
            .await?;
            tokio::signal::ctrl_c().await?;
            let s = relay.stats();
            println!("up: {:?}\ndown: {:?}", s.up, s.down);
            Ok(ExitCode::SUCCESS)
        }
        Command::Mcp {
            config,
            stdio,
            http,
        } => mcp(config, stdio, http).await,
        Command::Card { config } => {
            let config = read_config(&config)?;
            let card = valid_card(&config)?;
            println!("{}", serde_json::to_string_pretty(&card)?);
            Ok(ExitCode::SUCCESS)
        }
        Command::Check { states } => {
            let mut stores = Vec::new();
            for s in &states {
                let (agent, dir) = s
                    .split_once('=')
                    .ok_or_else(|| format!("--state {s}: expected NAME=DIR"))?;
                let store = abhyasa_store::Store::open(
                    std::path::Path::new(dir).join("node.redb"),
                    abhyasa_store::StoreConfig::default(),
                )
                .map_err(|e| format!("{agent} ({dir}): {e}"))?;
                stores.push((AgentId::new(agent)?, store));
            }
            let mut rows = Vec::new();
            for (agent, store) in &stores {
                rows.push(
                    crate::audit::NodeRows::read(agent.clone(), store)
                        .map_err(|e| format!("{agent}: {e}"))?,
                );
            }
            let now = abhyasa_wire::UnixMillis(
                std::time::SystemTime::now()
                    .duration_since(std::time::UNIX_EPOCH)?
                    .as_millis() as u64,
            );
            let report = crate::audit::audit(&rows, None, now);
            for v in &report.violations {
                println!("violation: {v}");
            }
            println!("check: {}", report.summary());
            Ok(if report.violations.is_empty() {
                ExitCode::SUCCESS
            } else {
                ExitCode::FAILURE
            })
        }
        Command::Encode { issuer, id, spec } => {
            let issuer = AgentId::new(issuer)?;
            let defaults = CustodianConfig::default();
            let mut o = spec.build(&issuer, |span| defaults.default_retries(span))?;
            if let Some(id) = id {
                let n = u128::from_str_radix(&id, 16)
                    .ok()
                    .filter(|_| id.len() == 32)
                    .ok_or("--id must be 32 hex digits")?;
                o.id = abhyasa_wire::ObligationId::from_u128(n);
            }
            use base64::Engine as _;
            println!(
                "{}",
                base64::engine::general_purpose::STANDARD.encode(abhyasa_wire::encode(&o))
            );
            Ok(ExitCode::SUCCESS)
        }
        Command::Issue { admin, spec } => {
            let reply = admin::request(&admin, Request::Issue(spec)).await?;
            println!("{reply}");
            Ok(if reply["ok"] == true {
                ExitCode::SUCCESS
            } else {
                ExitCode::FAILURE
            })
        }
        Command::Ledger { command } => crate::ledger_cmd::ledger(command).await,
        Command::Status { admin, json } => {
            let reply = admin::request(&admin, Request::Status).await?;
            if reply["ok"] != true {
                eprintln!("{reply}");
                return Ok(ExitCode::FAILURE);
            }
            let status: StatusJson = serde_json::from_value(reply["status"].clone())?;
            if json {
                println!("{}", serde_json::to_string_pretty(&status)?);
            } else {
                print_status(&status);
            }
            Ok(ExitCode::SUCCESS)
        }
    }
}

/// `90s`, `10m`, `1h` or a plain number of seconds.
fn parse_duration(s: &str) -> std::result::Result<Duration, String> {
    let (n, unit) = match s.find(|c: char| !c.is_ascii_digit()) {
        Some(i) => s.split_at(i),
        None => (s, "s"),
    };
    let n: u64 = n
        .parse()
        .map_err(|_| format!("{s:?}: expected e.g. 90s, 10m or 1h"))?;
    let secs = match unit {
        "s" => n,
        "m" => n.saturating_mul(60),
        "h" => n.saturating_mul(3600),
        _ => return Err(format!("{s:?}: the unit must be s, m or h")),
    };
    Ok(Duration::from_secs(secs))
}

fn read_config(path: &std::path::Path) -> Result<NodeConfig> {
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
    fn check(&self) -> Result<()> {
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
    fn channel(&self) -> Result<Channel> {
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

async fn node(path: PathBuf) -> Result<ExitCode> {
    let config = read_config(&path)?;
    let agent = AgentId::new(config.agent.clone())?;
    let node = Arc::new(build_node(&config).await?);
    let admin = bind_admin(&config)?;
    println!(
        "node {agent} listening on {} (admin {})",
        node.local_addr(),
        admin.addr()
    );
    let _bindings = start_bindings(&config, &node).await?;
    let admin = tokio::spawn(admin.serve(node.clone()));
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())?;
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {}
        _ = term.recv() => {}
        r = admin => {
            eprintln!("admin interface stopped: {r:?}");
        }
    }
    if let Ok(node) = Arc::try_unwrap(node) {
        node.shutdown().await;
    }
    println!("node {agent} stopped");
    Ok(ExitCode::SUCCESS)
}

async fn mcp(path: PathBuf, stdio: bool, http: Option<SocketAddr>) -> Result<ExitCode> {
    if !stdio && http.is_none() {
        return Err("abhyasa mcp: say how to serve (--stdio or --http ADDR)".into());
    }
    let config = read_config(&path)?;
    let Some(mcp) = config.mcp.clone() else {
        return Err(format!("{}: no [mcp] section", path.display()).into());
    };
    let principal = AgentId::new(mcp.principal.clone().ok_or_else(|| {
        format!(
            "{}: [mcp] principal is needed for --stdio and --http",
            path.display()
        )
    })?)?;
    let mut tools = mcp_tools(&config)?;
    let node_tools = mcp.node_tools(config.ledger.is_some())?;
    let node = build_node(&config).await?;
    // The node's own tools only where the operator granted them: each carries the node's
    // whole authority (issuing as it, spending its budget).
    for t in node_tools {
        tools.push(match t {
            crate::mcp_cli::NodeTool::Issue => crate::mcp_cli::issue_tool(node.clone()),
            crate::mcp_cli::NodeTool::Ledger => crate::mcp_cli::ledger_tool(node.clone()),
        });
    }
    let admin = bind_admin(&config)?;
    let admin_addr = admin.addr();
    let _bindings = start_bindings(&config, &node).await?;
    let admin = tokio::spawn(admin.serve(Arc::new(node.clone())));
    let served: Result<()> = match http {
        Some(addr) => {
            let server =
                abhyasa_mcp::http::serve_http(node.clone(), principal.clone(), tools, addr, {
                    let path = config.state.join(MCP_TOKEN_FILE);
                    Some(hex::encode(admin::load_or_create_token(&path)?))
                })
                .await?;
            // Stdout says where, once; the node's logs go to stderr.
            println!(
                "MCP on http://{}{} for {principal} (bearer token in {})",
                server.local_addr(),
                abhyasa_mcp::http::HTTP_PATH,
                config.state.join(MCP_TOKEN_FILE).display()
            );
            let mut term =
                tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())?;
            tokio::select! {
                _ = tokio::signal::ctrl_c() => {}
                _ = term.recv() => {}
                _ = server.wait() => {}
            }
            Ok(())
        }
        None => {
            // Stdout carries MCP: everything else goes to stderr.
            eprintln!(
                "node {} listening on {} (admin {}); MCP on stdio for {principal}",
                node.agent(),
                node.local_addr(),
                admin_addr
            );
            crate::mcp_cli::serve_stdio(node.clone(), principal, tools).await
        }
    };
    admin.abort();
    let _ = admin.await;
    node.shutdown().await;
    served?;
    Ok(ExitCode::SUCCESS)
}

/// The bearer token of `abhyasa mcp --http`, in the state directory.
const MCP_TOKEN_FILE: &str = "mcp.token";

/// Binds the node's admin interface: `admin` from the config, or `<state>/admin.sock`.
fn bind_admin(config: &NodeConfig) -> Result<admin::AdminServer> {
    let addr = match config.admin.as_deref() {
        None => AdminAddr::Unix(config.state.join(admin::SOCKET_FILE)),
        Some(a) => AdminAddr::parse(a).map_err(|e| format!("admin: {e}"))?,
    };
    Ok(admin::AdminServer::bind(
        &addr,
        &config.state,
        config.admin_allow_remote,
    )?)
}

/// Raises this process's soft limit on open descriptors to its hard limit: a node holds a
/// descriptor per connection on each listener, and the soft limit (often 1,024) is what idle
/// connections exhausted first.
fn raise_descriptor_limit() {
    match rlimit::increase_nofile_limit(u64::MAX) {
        Ok(n) => tracing::debug!(limit = n, "open descriptor limit"),
        Err(e) => tracing::warn!(%e, "could not raise the open descriptor limit"),
    }
}

async fn build_node(config: &NodeConfig) -> Result<Node> {
    raise_descriptor_limit();
    let agent = AgentId::new(config.agent.clone())?;
    let identity = Identity::load(&config.certs, &agent)?;
    let mut builder = Node::builder(identity)
        .listen(config.listen)
        .transport(config.transport.settings()?)
        .state_dir(&config.state)
        .custodian(CustodianConfig {
            response_timeout_ms: config.custody.response_timeout_ms,
            backoff_base_ms: config.custody.backoff_base_ms,
            backoff_cap_ms: config.custody.backoff_cap_ms,
            first_attempt: config.custody.channel()?,
            require_spanning_budget: config
                .custody
                .require_spanning_budget
                .iter()
                .copied()
                .collect(),
            max_pending: config.limits.max_pending,
            max_pending_per_target: config.limits.max_pending_per_target,
            max_principal_entries: config.limits.max_principal_entries,
            ..CustodianConfig::default()
        })
        .receiver(abhyasa_custody::ReceiverConfig {
            max_applied: config.limits.max_applied,
            max_governed: config.limits.max_governed,
            ..abhyasa_custody::ReceiverConfig::default()
        })
        .store(abhyasa_store::StoreConfig {
            retention_ms: config.limits.history_retention_ms,
            max_terminal: config.limits.max_terminal_records,
            cache_bytes: config.limits.store_cache_bytes,
            events: config.events.is_some(),
            ..abhyasa_store::StoreConfig::default()
        })
        .limits(abhyasa_node::Limits {
            sessions_per_peer: config.limits.sessions_per_peer,
            session: abhyasa_moq::SessionLimits {
                max_requests: config.limits.requests_per_session,
                max_objects_per_group: config.limits.objects_per_group,
            },
            requests_per_second_per_peer: config.limits.requests_per_second_per_peer,
        })
        .maintenance(Duration::from_millis(config.custody.maintenance_ms));
    config.check()?;
    if let Some(p) = &config.policy {
        builder = builder.policy(p.policy());
    }
    for p in &config.peers {
        // `a2a` and `mcp` peers are reached by `start_bindings` once the node runs.
        if p.transport.as_deref().unwrap_or("moqt") == "moqt" {
            builder = builder.peer(AgentId::new(p.id.clone())?, p.addr()?);
        }
    }
    for r in &config.relays {
        builder = builder.relay_trusting(AgentId::new(r.name.clone())?, r.addr()?, r.trust()?);
        if let Some(peers) = &r.peers {
            let peers: std::result::Result<Vec<_>, _> =
                peers.iter().map(|p| AgentId::new(p.clone())).collect();
            builder = builder.relay_peers(peers?);
        }
    }
    if let Some(l) = &config.ledger {
        let executor: Option<Arc<dyn abhyasa_node::Executor>> = if l.gateway {
            {
                use std::os::unix::fs::DirBuilderExt;
                std::fs::DirBuilder::new()
                    .recursive(true)
                    .mode(0o700)
                    .create(&config.state)?;
            }
            Some(Arc::new(
                ledger_cli::FileExecutor::open(&config.state.join("effects.log"))
                    .map_err(|e| e.to_string())?,
            ))
        } else {
            None
        };
        builder = builder.ledger(abhyasa_node::LedgerSetup {
            keys: ledger_cli::load_keyring(&config.certs, &l.issuers).map_err(|e| e.to_string())?,
            executor,
            resend_ms: l.resend_ms,
            max_journal_steps: l.max_journal_steps,
            checkpoint_steps: l.checkpoint_steps,
            permit_ttl_ms: l.permit_ttl_ms,
            gateway_retain_ms: (l.gateway_retain_ms > 0).then_some(l.gateway_retain_ms),
        });
    }
    Ok(builder.build().await?)
}

/// The card this node's config describes.
fn card_settings(config: &NodeConfig) -> Result<abhyasa_a2a::CardSettings> {
    let agent = AgentId::new(config.agent.clone())?;
    let a2a = config
        .a2a
        .as_ref()
        .ok_or("no [a2a] section: the node serves no card")?;
    let mut deadline_seconds = std::collections::BTreeMap::new();
    for (k, s) in &a2a.deadline_seconds {
        let kind = abhyasa_wire::Kind::from_name(k)
            .ok_or_else(|| format!("[a2a] deadline_seconds: unknown kind {k:?}"))?;
        if *s == 0 {
            return Err(format!("[a2a] deadline_seconds.{k} must be > 0").into());
        }
        deadline_seconds.insert(kind, *s);
    }
    Ok(abhyasa_a2a::CardSettings {
        base_url: a2a
            .public
            .clone()
            .unwrap_or_else(|| format!("https://{agent}:{}", a2a.listen.port())),
        agent,
        required: a2a.required,
        deadline_seconds,
        backoff_base_seconds: config.custody.backoff_base_ms as f64 / 1_000.0,
        backoff_cap_seconds: config.custody.backoff_cap_ms.div_ceil(1_000).max(1),
        moqt_endpoint: Some(format!("moqt://{}:{}", config.agent, config.listen.port())),
    })
}

/// The card this node's config describes, checked as any reader checks it (a profile whose
/// budget cannot span its deadline is refused with the number needed).
fn valid_card(config: &NodeConfig) -> Result<abhyasa_a2a::AgentCard> {
    let card = card_settings(config)?.card();
    card.abhyasa()
        .map_err(|e| format!("[a2a]: the card would be refused: {e}"))?;
    Ok(card)
}

/// What a running node serves and reaches besides MOQT; dropping it stops them.
struct Bindings {
    _observe: Option<abhyasa_observe::Server>,
    _events: Option<abhyasa_events::Delivery>,
    _enforce: Option<abhyasa_enforce::Server>,
    _a2a: Option<abhyasa_a2a::A2aServer>,
    a2a_peers: Vec<tokio::task::JoinHandle<()>>,
    _mcp_links: Vec<abhyasa_mcp::PrincipalLink>,
    mcp_server: Option<tokio::task::JoinHandle<()>>,
}

impl Drop for Bindings {
    fn drop(&mut self) {
        for t in self.a2a_peers.iter().chain(self.mcp_server.iter()) {
            t.abort();
        }
    }
}

/// The `[[mcp.tools]]`; a priced tool needs this node to be a ledger gateway.
fn mcp_tools(config: &NodeConfig) -> Result<Vec<abhyasa_mcp::HostTool>> {
    let mut tools = Vec::new();
    let gateway = config.ledger.as_ref().is_some_and(|l| l.gateway);
    for t in config.mcp.iter().flat_map(|m| &m.tools) {
        if t.cost.is_some() && !gateway {
            return Err(format!(
                "mcp tool {}: a tool with a cost runs under ledger permits; this node must be a gateway ([ledger] gateway = true)",
                t.name
            )
            .into());
        }
        tools.push(crate::mcp_cli::command_tool(t)?);
    }
    Ok(tools)
}

/// Serves `[a2a]` and `[mcp]` (MCP sessions over the node's QUIC endpoint, with the
/// `[[mcp.tools]]` governed), and reaches the `transport = "a2a"` and `"mcp"` peers.
async fn start_bindings(config: &NodeConfig, node: &Node) -> Result<Bindings> {
    let mut mcp_server = None;
    if let Some(mcp) = &config.mcp {
        let tools = mcp_tools(config)?;
        let callers = mcp.quic_callers()?;
        let node = node.clone();
        mcp_server = Some(tokio::spawn(async move {
            if let Err(e) = abhyasa_mcp::serve_quic_for(node, tools, callers).await {
                eprintln!("MCP over QUIC stopped: {e}");
            }
        }));
    }
    let mut mcp_links = Vec::new();
    for p in config
        .peers
        .iter()
        .filter(|p| p.transport.as_deref() == Some("mcp"))
    {
        mcp_links.push(abhyasa_mcp::PrincipalLink::spawn_route(
            node.clone(),
            AgentId::new(p.id.clone())?,
            p.mcp_route()?,
            Duration::from_millis(10),
        ));
    }
    let (a2a, a2a_peers) = start_a2a(config, node).await?;
    let enforce = start_enforce(config, node).await?;
    let events = match &config.events {
        None => None,
        Some(e) => {
            let identity = Identity::load(&config.certs, &AgentId::new(config.agent.clone())?)?;
            Some(e.start(node, &identity).await?)
        }
    };
    let observe = match &config.observe {
        None => None,
        Some(o) => Some(o.start(node, &config.state).await?),
    };
    Ok(Bindings {
        _observe: observe,
        _events: events,
        _enforce: enforce,
        _a2a: a2a,
        a2a_peers,
        _mcp_links: mcp_links,
        mcp_server,
    })
}

/// The enforcement key's file name in a state directory.
const ENFORCE_KEY_FILE: &str = "enforce.key";

/// Serves `[enforce]`.
async fn start_enforce(
    config: &NodeConfig,
    node: &Node,
) -> Result<Option<abhyasa_enforce::Server>> {
    let Some(e) = &config.enforce else {
        return Ok(None);
    };
    let key_path = e
        .key_file
        .clone()
        .unwrap_or_else(|| config.state.join(ENFORCE_KEY_FILE));
    let mut c = abhyasa_enforce::EnforceConfig::new(e.listen);
    c.key = Some(hex::encode(admin::load_or_create_token(&key_path)?));
    c.holders = match &e.holders {
        Some(h) => h
            .iter()
            .map(|a| AgentId::new(a.clone()))
            .collect::<std::result::Result<_, _>>()?,
        None => config
            .peers
            .iter()
            .map(|p| AgentId::new(p.id.clone()))
            .collect::<std::result::Result<_, _>>()?,
    };
    c.revoke_deadline = Duration::from_millis(e.revoke_deadline_ms);
    if let Some(id) = &e.client_id {
        c.client_id = abhyasa_wire::ClientId::new(id.clone())
            .map_err(|err| format!("[enforce] client_id {id:?}: {err}"))?;
    }
    if let Some(u) = &e.upstream {
        let authorization = match &u.authorization_file {
            None => None,
            Some(path) => Some(secret_file(path)?),
        };
        let roots =
            u.ca.as_deref()
                .map(crate::operator::read_roots)
                .transpose()?;
        c.upstream = Some(abhyasa_enforce::Upstream {
            url: u.url.clone(),
            authorization,
            roots,
        });
    }
    let server = abhyasa_enforce::serve(node.clone(), c).await?;
    eprintln!(
        "node {}: enforcement points on http://{} (key in {})",
        node.agent(),
        server.local_addr(),
        key_path.display()
    );
    Ok(Some(server))
}

/// Reads a secret from a file that only its owner may read (trimmed).
fn secret_file(path: &std::path::Path) -> Result<String> {
    use std::os::unix::fs::PermissionsExt as _;
    let meta = std::fs::metadata(path).map_err(|e| format!("{}: {e}", path.display()))?;
    let mode = meta.permissions().mode() & 0o777;
    if mode & 0o077 != 0 {
        return Err(format!(
            "{}: readable by other users (mode {mode:o}); chmod 600 it",
            path.display()
        )
        .into());
    }
    let text = std::fs::read_to_string(path).map_err(|e| format!("{}: {e}", path.display()))?;
    Ok(text.trim().to_owned())
}

/// Serves `[a2a]` and reaches the `transport = "a2a"` peers.
async fn start_a2a(
    config: &NodeConfig,
    node: &Node,
) -> Result<(
    Option<abhyasa_a2a::A2aServer>,
    Vec<tokio::task::JoinHandle<()>>,
)> {
    let agent = AgentId::new(config.agent.clone())?;
    let identity = Identity::load(&config.certs, &agent)?;
    let server = match &config.a2a {
        Some(a2a) => {
            let card = valid_card(config)?;
            let server = abhyasa_a2a::serve(node.clone(), &identity, a2a.listen, &card).await?;
            eprintln!("node {agent}: A2A on https://{}", server.local_addr());
            Some(server)
        }
        None => None,
    };
    let mut peers = Vec::new();
    for p in config
        .peers
        .iter()
        .filter(|p| p.transport.as_deref() == Some("a2a"))
    {
        let id = AgentId::new(p.id.clone())?;
        let addr = p.addr()?;
        let card_url = p
            .card
            .clone()
            .unwrap_or_else(|| format!("https://{id}:{}/.well-known/agent-card.json", addr.port()));
        peers.push(abhyasa_a2a::spawn_peer(
            node.clone(),
            &identity,
            abhyasa_a2a::A2aPeer {
                agent: id,
                card_url,
                addr: Some(addr),
            },
        )?);
    }
    Ok((server, peers))
}

fn print_status(s: &StatusJson) {
    if let Some(full) = &s.store_full {
        println!("STORE FULL: {full}");
    }
    println!("agent {}   peers: {}", s.agent, s.peers.join(", "));
    for (peer, n) in &s.slowed {
        println!("slowed: {n} object(s) from {peer} dropped by the per-peer rate limit");
    }
    for (peer, n) in &s.unverified {
        println!("unverified: {n} object(s) from {peer} dropped: signature does not verify");
    }
    if s.sent_objects > 0 {
        println!(
            "sent: {} custody object(s) in {} group(s)",
            s.sent_objects, s.sent_groups
        );
    }
    println!("\nas principal — pending ({}):", s.pending.len());
    for p in &s.pending {
        let says = if p.says.is_empty() {
            format!("{} for {}", p.kind, p.target)
        } else {
            p.says.clone()
        };
        println!("  {}  {says}: {} attempt(s) so far", p.id, p.attempts);
    }
    println!(
        "\nrecent outcomes ({}{}):",
        s.recent.len(),
        if s.recent.len() > 20 {
            ", the latest 20 shown; --json has them all"
        } else {
            ""
        }
    );
    for r in s.recent.iter().rev().take(20) {
        println!("  {}  {} for {}: {}", r.id, r.kind, r.target, r.words);
    }
    println!("\nescalations ({}):", s.escalations.len());
    for e in &s.escalations {
        println!(
            "  {}  {} for {}: {}; {}",
            e.id,
            e.kind,
            e.target,
            e.words,
            e.safe_action.as_deref().unwrap_or("")
        );
    }
    println!("\nsafe actions and decisions in force:");
    for (t, sc) in &s.withheld {
        println!("  withheld {sc} for {t}");
    }
    for t in &s.revoked_tokens {
        println!("  stopped honouring token {t}");
    }
    for (t, k, w) in &s.routes {
        println!("  routing {k} for {t}: weight {w:.3}");
    }
    let h = &s.honours;
    println!("\nas agent — honours:");
    for (p, sc) in &h.withheld {
        println!("  does not use {sc} for {p}");
    }
    for (p, k, w) in &h.weights {
        println!("  weighs {k} at {w:+.3} for {p}");
    }
    for t in &h.dropped_tokens {
        println!("  dropped token {t}");
    }
    if h.withheld.is_empty() && h.weights.is_empty() && h.dropped_tokens.is_empty() {
        println!("  nothing yet");
    }
    let m = &s.receiver_held;
    println!(
        "  in memory: {} applied ids, {} token records, {} last sequences",
        m.applied, m.token_records, m.sequences
    );
    println!("\nrecently applied ({}):", s.applied.len());
    for a in s.applied.iter().rev().take(20) {
        println!("  {}  {} (from {})", a.id, a.says, a.issuer);
    }
    let not_shown = s.applied_not_shown + s.applied.len().saturating_sub(20) as u64;
    if not_shown > 0 {
        println!("  … and {not_shown} older applied record(s) not shown");
    }
}

#[cfg(test)]
mod tests {
    use super::check_config_text;

    const BASE: &str = r#"
agent = "agent-1"
listen = "127.0.0.1:0"
certs = "certs"
state = "state"
"#;

    /// `[events]` and `[observe]` are checked before anything starts: a sink named, URLs of
    /// a scheme that can be reached, roots for https, a loopback console.
    #[test]
    fn events_and_observe_sections_are_checked_before_the_start() {
        let with = |extra: &str| check_config_text(&format!("{BASE}{extra}"));
        assert!(with("[events.webhook]\nurl = \"http://127.0.0.1:9/h\"\n").is_ok());
        assert!(with("[events.exec]\ncommand = \"/bin/true\"\n").is_ok());
        let no_sink = with("[events]\nbackoff_min_ms = 10\n").unwrap_err();
        assert!(no_sink.contains("names no sink"), "{no_sink}");
        let https = with("[events.webhook]\nurl = \"https://hooks.example/h\"\n").unwrap_err();
        assert!(https.contains("needs `ca`"), "{https}");
        let scheme = with("[events.webhook]\nurl = \"ftp://hooks.example/h\"\n").unwrap_err();
        assert!(scheme.contains("not http:// or https://"), "{scheme}");
        let backoff = with(
            "[events]\nbackoff_min_ms = 500\nbackoff_max_ms = 100\n[events.exec]\ncommand = \"/bin/true\"\n",
        )
        .unwrap_err();
        assert!(backoff.contains("backoff_min_ms"), "{backoff}");
        assert!(with("[observe]\nlisten = \"127.0.0.1:9464\"\n").is_ok());
        let remote = with("[observe]\nlisten = \"0.0.0.0:9464\"\n").unwrap_err();
        assert!(remote.contains("not a loopback address"), "{remote}");
    }

    #[test]
    fn a_relay_is_configured_by_url_and_name_and_bad_ones_are_refused() {
        let with = |relays: &str| check_config_text(&format!("{BASE}{relays}"));
        assert_eq!(
            with("[[relays]]\nurl = \"moqt://127.0.0.1:4443\"\n"),
            Ok(())
        );
        assert_eq!(
            with("[[relays]]\nurl = \"moqt://127.0.0.1:4443/\"\nname = \"relay-eu.1\"\n"),
            Ok(())
        );
        assert_eq!(
            with("[[relays]]\nurl = \"moqt://127.0.0.1:4443\"\npeers = [\"principal\"]\n"),
            Ok(())
        );
        let refused = [
            (
                "[[relays]]\nurl = \"https://127.0.0.1:4443\"\n",
                "expected moqt://host:port",
            ),
            ("[[relays]]\nurl = \"moqt://127.0.0.1\"\n", "relay url"),
            (
                "[[relays]]\nurl = \"moqt://127.0.0.1:1\"\nname = \"Relay/1\"\n",
                "relay name",
            ),
            ("[[relays]]\nname = \"relay\"\n", "missing field `url`"),
            (
                "[[relays]]\nurl = \"moqt://127.0.0.1:1\"\ncert = \"x\"\n",
                "unknown field `cert`",
            ),
            (
                "[[relays]]\nurl = \"moqt://127.0.0.1:1\"\nca = \"/nonexistent/ca.pem\"\n",
                "relay ca: /nonexistent/ca.pem",
            ),
            (
                "[[relays]]\nurl = \"moqt://127.0.0.1:1\"\nfingerprint = \"ab:cd\"\n",
                "expected 32 bytes of hex",
            ),
            (
                "[[relays]]\nurl = \"moqt://127.0.0.1:1\"\nfingerprint = \"zz\"\n",
                "expected 32 bytes of hex",
            ),
            (
                "[[relays]]\nurl = \"moqt://127.0.0.1:1\"\npeers = [\"a b\"]\n",
                "relay peer",
            ),
        ];
        for (text, says) in refused {
            let err = with(text).expect_err(text);
            assert!(err.contains(says), "{text}: {err}");
        }
    }

    #[test]
    fn a_relay_is_trusted_by_its_operators_ca_or_a_fingerprint_but_not_both() {
        let dir = tempfile::tempdir().unwrap();
        let ca = abhyasa_moq::Ca::generate("relay operator").unwrap();
        ca.save(dir.path()).unwrap();
        let pem = dir.path().join("ca.pem");
        let config = |extra: &str| -> super::RelayConfig {
            toml::from_str(&format!("url = \"moqt://127.0.0.1:1\"\n{extra}")).unwrap()
        };
        let by_ca = config(&format!("ca = {:?}", pem.display().to_string()));
        assert_eq!(
            by_ca.trust(),
            Ok(abhyasa_moq::RelayTrust::Ca(ca.certificate().clone()))
        );
        let hexed = "00:11:22:33:44:55:66:77:88:99:aa:bb:cc:dd:ee:ff:00:11:22:33:44:55:66:77:88:99:aa:bb:cc:dd:ee:ff";
        let mut want = [0u8; 32];
        for (i, b) in want.iter_mut().enumerate() {
            *b = (i as u8 % 16) * 0x11;
        }
        assert_eq!(
            config(&format!("fingerprint = {hexed:?}")).trust(),
            Ok(abhyasa_moq::RelayTrust::Fingerprint(want))
        );
        assert_eq!(config("").trust(), Ok(abhyasa_moq::RelayTrust::Deployment));
        let both = config(&format!(
            "ca = {:?}\nfingerprint = {hexed:?}",
            pem.display().to_string()
        ));
        assert!(both.trust().unwrap_err().contains("not both"));
        std::fs::write(dir.path().join("bad.pem"), "no").unwrap();
        let bad = config(&format!(
            "ca = {:?}",
            dir.path().join("bad.pem").display().to_string()
        ));
        assert!(bad.trust().unwrap_err().contains("not a PEM certificate"));
    }
}
