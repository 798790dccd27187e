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
mod config;
mod serve;
pub use config::check_config_text;
use config::*;
use serve::*;

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
    /// One principal and N agents, met directly and (with `moq-relay` installed by
    /// scripts/moq-relay.sh) at the relay: obligations/s, latency, memory/node.
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
        /// Run each agent as its own `abhyasa node` process (this binary); by default every
        /// agent is a node in this process. The principal stays in this process.
        #[arg(long)]
        processes: bool,
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
                    processes,
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
                        processes: if processes {
                            Some(std::env::current_exe()?)
                        } else {
                            None
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

/// The bearer token of `abhyasa mcp --http`, in the state directory.
const MCP_TOKEN_FILE: &str = "mcp.token";

/// The enforcement key's file name in a state directory.
const ENFORCE_KEY_FILE: &str = "enforce.key";

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
