//! `abhyasa soak`: one principal and many agents, each an `abhyasa node` process, under a
//! steady mix of obligations of every kind while links are partitioned and healed and agents
//! are SIGKILLed and restarted. Each agent is reached through a userspace relay
//! (`abhyasa_netem::relay`) that the soak stops for a partition and starts again to heal it.
//!
//! Every second it samples the principal's resident memory and open files (from `/proc`) and
//! its pending count; at the end it heals everything, waits for the pending set to drain,
//! stops the nodes and audits their stores: every issue the principal acked must be terminal
//! (nothing lost), no receiver may have applied an id twice, and the audit's checks
//! (`abhyasa check`) must pass. Latency (ack of the issue → terminal record) is reported per
//! minute of issuing.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use abhyasa_moq::Ca;
use abhyasa_netem::relay::{Relay, RelayConfig};
use abhyasa_netem::Impairment;
use abhyasa_wire::{AgentId, ObligationId};
use rand::{Rng, SeedableRng};

use crate::admin::{self, AdminAddr, AdminTarget, IssueSpec, Request};
use crate::audit::{self, AuditReport, NodeRows};
use crate::sweep::{self, Axes, Series};

type Error = Box<dyn std::error::Error>;

/// What to run.
#[derive(Clone, Debug)]
pub struct SoakConfig {
    /// The `abhyasa` binary to run the nodes with.
    pub exe: PathBuf,
    /// How long to issue and inject faults.
    pub duration: Duration,
    /// Agents.
    pub agents: usize,
    /// Obligations issued per second.
    pub rate: f64,
    /// Deadline of each obligation, ms.
    pub deadline_ms: u64,
    /// A fault (partition or SIGKILL of an agent) every this long.
    pub fault_every: Duration,
    /// Working directory (certificates, configs, states).
    pub dir: PathBuf,
    /// Seed of the workload and the faults.
    pub seed: u64,
    /// Each node's store page cache (`[limits] store_cache_bytes`); `None`: the default.
    pub store_cache_bytes: Option<usize>,
    /// The kinds of the mix, drawn uniformly (all three by default).
    pub kinds: Vec<SoakKind>,
    /// Run the attacks of [`crate::adversary`] against `agent-0` instead of partitions and
    /// kills: the honest principal's obligations must then all apply.
    pub adversary: bool,
}

/// `agent-0`'s applied ids per issuer under `--adversary`: small, so the crowding member
/// reaches its share within seconds.
pub const ADVERSARY_MAX_APPLIED: usize = 1_000;

/// A kind of obligation the soak issues.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum SoakKind {
    /// `anumati.consent`: grants (best effort) and revocations on 8 scopes, with sequences.
    Consent,
    /// `phala.belief_update`: down-weights on 8 keys.
    Belief,
    /// `oauth.token`: revocations of distinct tokens.
    Token,
}

/// One sample of the principal process.
#[derive(Clone, Copy, Debug)]
pub struct Sample {
    /// Seconds since the start.
    pub t_s: f64,
    /// Resident memory, KiB.
    pub rss_kib: u64,
    /// Open file descriptors.
    pub fds: u64,
    /// Obligations pending at the principal.
    pub pending: u64,
    /// Resident memory of `agent-0`, KiB: the agent the soak partitions but never kills, so
    /// one process lives the whole run.
    pub agent_rss_kib: u64,
    /// Its open file descriptors.
    pub agent_fds: u64,
    /// Issues acked so far.
    pub acked: u64,
}

/// Latency of the obligations whose issue was acked in one minute.
#[derive(Clone, Copy, Debug)]
pub struct MinuteLatency {
    /// Minute of the soak (0-based).
    pub minute: u64,
    /// Obligations.
    pub n: usize,
    /// Median, ms.
    pub p50_ms: u64,
    /// 99th percentile, ms.
    pub p99_ms: u64,
    /// Largest, ms.
    pub max_ms: u64,
}

/// What a soak found.
#[derive(Debug)]
pub struct SoakReport {
    /// Samples, one a second.
    pub samples: Vec<Sample>,
    /// Latency per minute.
    pub latency: Vec<MinuteLatency>,
    /// Issues acked (under custody) by the principal.
    pub acked: u64,
    /// Issues refused (with the reason counted by text).
    pub refused: BTreeMap<String, u64>,
    /// Agents SIGKILLed and restarted.
    pub kills: u64,
    /// Links partitioned and healed.
    pub partitions: u64,
    /// Agents the principal had a session with after the heal (all of them when healing works).
    pub peers_up: usize,
    /// Agents.
    pub agents: usize,
    /// Acked issues with neither a terminal record nor a pending row at the end.
    pub lost: u64,
    /// Acked issues still pending after the drain.
    pub still_pending: u64,
    /// Outcomes of the acked issues, by name.
    pub outcomes: BTreeMap<String, u64>,
    /// The audit of every store.
    pub audit: AuditReport,
    /// Under `--adversary`: what the attacks did.
    pub adversary: Option<Arc<crate::adversary::AdversaryStats>>,
    /// The honest principal's obligations under custody (not best effort), and how many of
    /// them ended `applied`; the same for those to `agent-0`, the agent attacked.
    pub honest: HonestCount,
}

/// Obligations of the honest principal under custody, and those applied.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct HonestCount {
    /// To any agent: under custody.
    pub custody: u64,
    /// ... ended `applied`.
    pub applied: u64,
    /// ... declined `superseded`: a later decision of the principal on the same key (a
    /// grant, sent best effort) was applied first, after the first attempt of this one was
    /// lost (a datagram dropped under load): what the principal last decided is in force.
    pub superseded: u64,
    /// To `agent-0`: under custody.
    pub agent0_custody: u64,
    /// ... ended `applied`.
    pub agent0_applied: u64,
    /// ... declined `superseded`.
    pub agent0_superseded: u64,
}

impl SoakReport {
    /// The last line of `abhyasa soak`: ends `lost=0 double_applied=0 violations=0` when clean.
    pub fn summary(&self) -> String {
        let (first, last) = (self.samples.first(), self.samples.last());
        format!(
            "soak: acked={} refused={} kills={} partitions={} outcomes={:?} rss_kib first={} last={} max={} fds first={} last={} agent0_rss_kib first={} last={} max={} agent0_fds max={} honest_applied={}/{} honest_superseded={} agent0_honest_applied={}/{} agent0_honest_superseded={} peers_up={}/{} still_pending={} lost={} double_applied={} violations={}",
            self.acked,
            self.refused.values().sum::<u64>(),
            self.kills,
            self.partitions,
            self.outcomes,
            first.map_or(0, |s| s.rss_kib),
            last.map_or(0, |s| s.rss_kib),
            self.samples.iter().map(|s| s.rss_kib).max().unwrap_or(0),
            first.map_or(0, |s| s.fds),
            last.map_or(0, |s| s.fds),
            first.map_or(0, |s| s.agent_rss_kib),
            last.map_or(0, |s| s.agent_rss_kib),
            self.samples.iter().map(|s| s.agent_rss_kib).max().unwrap_or(0),
            self.samples.iter().map(|s| s.agent_fds).max().unwrap_or(0),
            self.honest.applied,
            self.honest.custody,
            self.honest.superseded,
            self.honest.agent0_applied,
            self.honest.agent0_custody,
            self.honest.agent0_superseded,
            self.peers_up,
            self.agents,
            self.still_pending,
            self.lost,
            self.audit.double_applied,
            self.audit.violations.len(),
        )
    }

    /// Whether nothing was lost, applied twice or left pending, and the audit passed; under
    /// `--adversary` also every honest obligation under custody applied, or was superseded by
    /// the principal's own later decision (nothing declined otherwise, nothing escalated).
    pub fn clean(&self) -> bool {
        let honest = self.adversary.is_none()
            || self.honest.applied + self.honest.superseded == self.honest.custody;
        honest
            && self.lost == 0
            && self.peers_up == self.agents
            && self.still_pending == 0
            && self.audit.double_applied == 0
            && self.audit.violations.is_empty()
    }
}

pub(crate) struct Proc {
    pub(crate) child: Child,
    exe: PathBuf,
    config: PathBuf,
    pub(crate) log: PathBuf,
}

impl Proc {
    /// `exe node --config config`, its stderr appended to `log`.
    pub(crate) fn start(exe: &Path, config: &Path, log: &Path) -> std::io::Result<Self> {
        let child = Command::new(exe)
            .args(["node", "--config"])
            .arg(config)
            .stdout(Stdio::null())
            .stderr(
                std::fs::OpenOptions::new()
                    .create(true)
                    .append(true)
                    .open(log)?,
            )
            .spawn()?;
        Ok(Self {
            child,
            exe: exe.to_owned(),
            config: config.to_owned(),
            log: log.to_owned(),
        })
    }

    /// The same node started again (after a SIGKILL).
    fn restart(&mut self) -> Result<(), Error> {
        *self = Self::start(&self.exe, &self.config, &self.log)?;
        Ok(())
    }

    fn sigkill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    pub(crate) fn sigterm(&mut self) {
        let _ = Command::new("kill")
            .args(["-TERM", &self.child.id().to_string()])
            .status();
        let _ = self.child.wait();
    }
}

impl Drop for Proc {
    /// A node still running when its handle goes — the run failed midway, or returned early —
    /// is killed and reaped, not left behind listening and dialing.
    fn drop(&mut self) {
        if matches!(self.child.try_wait(), Ok(None)) {
            self.sigkill();
        }
    }
}

fn free_udp() -> Result<SocketAddr, Error> {
    Ok(crate::free_addr()?)
}

fn free_tcp() -> Result<SocketAddr, Error> {
    Ok(std::net::TcpListener::bind("127.0.0.1:0")?.local_addr()?)
}

/// Resident memory (KiB) and open files of a process, from `/proc`.
fn proc_usage(pid: u32) -> (u64, u64) {
    let rss = crate::sweep::proc_kib(&format!("/proc/{pid}/status"), "VmRSS").unwrap_or(0);
    let fds = std::fs::read_dir(format!("/proc/{pid}/fd")).map_or(0, |d| d.count() as u64);
    (rss, fds)
}

/// A relay to stop for a partition and start again to heal it.
struct Link {
    relay: Option<Relay>,
    listen: SocketAddr,
    forward: SocketAddr,
}

impl Link {
    async fn heal(&mut self) -> Result<(), Error> {
        self.relay = Some(start_relay(self.listen, self.forward).await?);
        Ok(())
    }
}

async fn start_relay(listen: SocketAddr, forward: SocketAddr) -> Result<Relay, Error> {
    // The port was just released by the relay being replaced: retry while it frees up.
    let mut tries = 0;
    loop {
        let config = RelayConfig {
            listen,
            forward,
            up: Impairment::default(),
            down: Impairment::default(),
            seed: 0,
        };
        match Relay::start(config).await {
            Ok(r) => return Ok(r),
            Err(e) if tries < 50 => {
                tries += 1;
                tracing::debug!(%e, "relay port not free yet");
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            Err(e) => return Err(format!("relay on {listen}: {e}").into()),
        }
    }
}

fn target(state: &Path) -> AdminTarget {
    AdminTarget {
        admin: AdminAddr::Unix(state.join(admin::SOCKET_FILE)),
        admin_token: None,
    }
}

/// Peers the node at `state` has a live session with.
async fn peers_up(state: &Path) -> Option<usize> {
    let reply = admin::request(&target(state), Request::Status).await.ok()?;
    Some(reply["status"]["peers"].as_array()?.len())
}

async fn pending_count(state: &Path) -> Option<u64> {
    let reply = admin::request(&target(state), Request::Status).await.ok()?;
    Some(reply["status"]["pending"].as_array()?.len() as u64)
}

/// How long after an obligation's deadline the revoked token itself expires.
const TOKEN_LIFETIME_AFTER_DEADLINE_MS: u64 = 60_000;

/// One obligation of the mix: consent (grant or revoke), belief update, token revocation.
fn spec(
    rng: &mut impl Rng,
    kinds: &[SoakKind],
    agent: &str,
    n: u64,
    deadline_ms: u64,
) -> IssueSpec {
    let mut s = IssueSpec {
        target: agent.to_owned(),
        kind: String::new(),
        payload: None,
        decision: None,
        scope: None,
        weight_key: None,
        delta: None,
        action: None,
        token: None,
        client: "client".into(),
        token_expires_in_ms: None,
        deadline_ms,
        max_retries: None,
        sequence: None,
        lease_ms: None,
        ttl_ms: 3_600_000,
    };
    let all = [SoakKind::Consent, SoakKind::Belief, SoakKind::Token];
    let kinds = if kinds.is_empty() { &all[..] } else { kinds };
    match kinds[rng.random_range(0..kinds.len())] {
        SoakKind::Consent => {
            s.kind = "anumati.consent".into();
            s.decision = Some(
                if rng.random_bool(0.5) {
                    "grant"
                } else {
                    "revoke"
                }
                .into(),
            );
            s.scope = Some(format!("scope-{}", rng.random_range(0..8)));
            s.sequence = Some(n);
        }
        SoakKind::Belief => {
            s.kind = "phala.belief_update".into();
            s.weight_key = Some(format!("supplier/{}", rng.random_range(0..8)));
            s.delta = Some(-0.1);
        }
        SoakKind::Token => {
            s.kind = "oauth.token".into();
            s.action = Some("revoke".into());
            s.token = Some(format!("tok-{n}"));
            // Tokens expire as access tokens do, here a minute after custody of the
            // revocation ends: the principal and the agent forget it then (SOAK.md).
            s.token_expires_in_ms = Some(deadline_ms + TOKEN_LIFETIME_AFTER_DEADLINE_MS);
        }
    }
    s
}

/// Runs a soak in `config.dir` (created; certificates, configs, states and node logs there).
pub async fn run(config: &SoakConfig) -> Result<SoakReport, Error> {
    let dir = &config.dir;
    std::fs::create_dir_all(dir)?;
    let certs = dir.join("certs");
    std::fs::create_dir_all(&certs)?;
    let ca = Ca::generate("abhyasa soak CA")?;
    ca.save(&certs)?;
    let names: Vec<String> = (0..config.agents).map(|i| format!("agent-{i}")).collect();
    let attackers: &[&str] = if config.adversary {
        &["eve", "mallory"]
    } else {
        &[]
    };
    for n in std::iter::once("principal")
        .chain(names.iter().map(String::as_str))
        .chain(attackers.iter().copied())
    {
        ca.issue(&AgentId::new(n)?)?.save(&certs)?;
    }
    // Agents listen on their own ports; the principal reaches each through its relay.
    let mut agents = Vec::new();
    let mut relays = Vec::new();
    let mut peers = String::new();
    let limits = config
        .store_cache_bytes
        .map(|b| format!("\n[limits]\nstore_cache_bytes = {b}\n"))
        .unwrap_or_default();
    // Under --adversary, agent-0 also serves its admin interface on TCP (what the idle
    // connections aim at) and keeps few applied ids per issuer (what the member crowds).
    let mut attacked: Option<(SocketAddr, SocketAddr)> = None;
    for name in &names {
        let (listen, relay) = (free_udp()?, free_udp()?);
        let state = dir.join(format!("state-{name}"));
        let cfg = dir.join(format!("{name}.toml"));
        let (admin_line, limits) = if config.adversary && attacked.is_none() {
            let admin_tcp = free_tcp()?;
            attacked = Some((listen, admin_tcp));
            let cache = config
                .store_cache_bytes
                .map(|b| format!("store_cache_bytes = {b}\n"))
                .unwrap_or_default();
            (
                format!("admin = \"{admin_tcp}\"\n"),
                format!("\n[limits]\nmax_applied = {ADVERSARY_MAX_APPLIED}\n{cache}"),
            )
        } else {
            (String::new(), limits.clone())
        };
        std::fs::write(
            &cfg,
            format!(
                "agent = \"{name}\"\nlisten = \"{listen}\"\ncerts = \"{}\"\nstate = \"{}\"\n{admin_line}{limits}",
                certs.display(),
                state.display()
            ),
        )?;
        agents.push((
            Proc::start(&config.exe, &cfg, &dir.join(format!("{name}.log")))?,
            state,
        ));
        relays.push(Link {
            relay: Some(start_relay(relay, listen).await?),
            listen: relay,
            forward: listen,
        });
        peers.push_str(&format!(
            "\n[[peers]]\nid = \"{name}\"\naddr = \"{relay}\"\n"
        ));
    }
    let p_state = dir.join("state-principal");
    let p_cfg = dir.join("principal.toml");
    std::fs::write(
        &p_cfg,
        format!(
            "agent = \"principal\"\nlisten = \"{}\"\ncerts = \"{}\"\nstate = \"{}\"\n{limits}\n[custody]\nmaintenance_ms = 5000\n{peers}",
            free_udp()?,
            certs.display(),
            p_state.display()
        ),
    )?;
    let mut principal = Proc::start(&config.exe, &p_cfg, &dir.join("principal.log"))?;
    let ready = Instant::now() + Duration::from_secs(30);
    while pending_count(&p_state).await.is_none() {
        if Instant::now() > ready {
            return Err("the principal did not start within 30 s".into());
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // The attackers: mallory's node (a member issuing in its own name, straight to agent-0)
    // and eve's connections.
    let mut mallory = None;
    let mut attacks = None;
    if let Some((agent0, admin_tcp)) = attacked {
        let m_state = dir.join("state-mallory");
        let m_cfg = dir.join("mallory.toml");
        std::fs::write(
            &m_cfg,
            format!(
                "agent = \"mallory\"\nlisten = \"{}\"\ncerts = \"{}\"\nstate = \"{}\"\n\n[[peers]]\nid = \"{}\"\naddr = \"{agent0}\"\n",
                free_udp()?,
                certs.display(),
                m_state.display(),
                names[0],
            ),
        )?;
        mallory = Some((
            Proc::start(&config.exe, &m_cfg, &dir.join("mallory.log"))?,
            m_state.clone(),
        ));
        attacks = Some(crate::adversary::start(crate::adversary::Target {
            agent: AgentId::new(&names[0])?,
            quic: agent0,
            admin_tcp,
            eve: abhyasa_moq::Identity::load(&certs, &AgentId::new("eve")?)?,
            mallory_state: m_state,
        })?);
    }

    let mut rng = rand::rngs::StdRng::seed_from_u64(config.seed);
    let start = Instant::now();
    // id, acked at (unix ms), second, to agent-0
    let mut acked: Vec<(ObligationId, u64, u64, bool)> = Vec::new();
    let mut refused: BTreeMap<String, u64> = BTreeMap::new();
    let mut samples = Vec::new();
    let (mut kills, mut partitions) = (0u64, 0u64);
    // Faults in progress: (when it heals, agent index, kind).
    let mut healing: Vec<(Instant, usize, bool)> = Vec::new();
    let mut next_issue = start;
    let mut next_fault = start + config.fault_every;
    let mut next_sample = start;
    let issue_every = Duration::from_secs_f64(1.0 / config.rate.max(0.001));
    let mut n = 0u64;
    while start.elapsed() < config.duration {
        let now = Instant::now();
        if now >= next_sample {
            let (rss_kib, fds) = proc_usage(principal.child.id());
            let (agent_rss_kib, agent_fds) = proc_usage(agents[0].0.child.id());
            samples.push(Sample {
                t_s: start.elapsed().as_secs_f64(),
                rss_kib,
                fds,
                agent_rss_kib,
                agent_fds,
                pending: pending_count(&p_state).await.unwrap_or(0),
                acked: acked.len() as u64,
            });
            next_sample += Duration::from_secs(1);
        }
        // Heal what is due.
        let due;
        (due, healing) = healing.into_iter().partition(|h| h.0 <= now);
        for (_, a, partition) in due {
            if partition {
                relays[a].heal().await?;
            } else {
                agents[a].0.restart()?;
            }
        }
        if now >= next_fault && !config.adversary {
            next_fault += config.fault_every;
            let a = rng.random_range(0..config.agents);
            if !healing.iter().any(|h| h.1 == a) {
                // agent-0 is only ever partitioned: its one process is watched for the run.
                let partition = rng.random_bool(0.5) || a == 0;
                let back = now + Duration::from_millis(rng.random_range(1_000..6_000));
                if partition {
                    if let Some(r) = relays[a].relay.take() {
                        r.stop();
                    }
                    partitions += 1;
                } else {
                    agents[a].0.sigkill();
                    kills += 1;
                }
                healing.push((back, a, partition));
            }
        }
        if now >= next_issue {
            next_issue += issue_every;
            n += 1;
            let a = rng.random_range(0..config.agents);
            let agent = &names[a];
            let reply = admin::request(
                &target(&p_state),
                Request::Issue(Box::new(spec(
                    &mut rng,
                    &config.kinds,
                    agent,
                    n,
                    config.deadline_ms,
                ))),
            )
            .await?;
            if reply["ok"] == true {
                let id = reply["id"]
                    .as_str()
                    .and_then(|s| u128::from_str_radix(s, 16).ok())
                    .ok_or_else(|| format!("an issue acked without an id: {reply}"))?;
                acked.push((
                    ObligationId::from_u128(id),
                    crate::sweep::unix_ms(),
                    start.elapsed().as_secs(),
                    a == 0,
                ));
            } else {
                let why = reply["error"].as_str().unwrap_or("?").to_owned();
                *refused.entry(why).or_default() += 1;
            }
        }
        let wake = next_issue.min(next_sample).min(next_fault);
        tokio::time::sleep(wake.saturating_duration_since(Instant::now())).await;
    }

    let adversary = attacks.map(|a| {
        let stats = a.stats.clone();
        a.stop();
        stats
    });
    // Heal everything and let the pending set drain (at most one deadline and a margin).
    for (_, a, partition) in healing {
        if partition {
            relays[a].heal().await?;
        } else {
            agents[a].0.restart()?;
        }
    }
    let drain = Instant::now() + Duration::from_millis(config.deadline_ms + 10_000);
    while Instant::now() < drain && pending_count(&p_state).await != Some(0) {
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    // Every agent back: the principal holds a session with each (at most 10 s more).
    let back = Instant::now() + Duration::from_secs(10);
    let mut up = peers_up(&p_state).await.unwrap_or(0);
    while Instant::now() < back && up < config.agents {
        tokio::time::sleep(Duration::from_millis(200)).await;
        up = peers_up(&p_state).await.unwrap_or(0);
    }
    principal.sigterm();
    for (a, _) in &mut agents {
        a.sigterm();
    }
    if let Some((m, _)) = &mut mallory {
        m.sigterm();
    }
    for r in relays.into_iter().filter_map(|l| l.relay) {
        r.stop();
    }

    // The audit, from the stores.
    let open = |name: &str, state: &Path| -> Result<NodeRows, Error> {
        let store = abhyasa_store::Store::open(
            state.join("node.redb"),
            abhyasa_store::StoreConfig::default(),
        )
        .map_err(|e| format!("{name}: {e}"))?;
        Ok(NodeRows::read(AgentId::new(name)?, &store).map_err(|e| format!("{name}: {e}"))?)
    };
    let mut rows = vec![open("principal", &p_state)?];
    for (name, (_, state)) in names.iter().zip(&agents) {
        rows.push(open(name, state)?);
    }
    if let Some((_, state)) = &mallory {
        rows.push(open("mallory", state)?);
    }
    let report = audit::audit(
        &rows,
        None,
        abhyasa_wire::UnixMillis(crate::sweep::unix_ms()),
    );
    let p = &rows[0];
    let (mut lost, mut still_pending) = (0, 0);
    let mut outcomes: BTreeMap<String, u64> = BTreeMap::new();
    let mut per_minute: BTreeMap<u64, Vec<u64>> = BTreeMap::new();
    let mut honest = HonestCount::default();
    for (id, at, second, to_agent0) in &acked {
        match p.terminal(*id) {
            Some(t) => {
                if t.outcome != abhyasa_wire::Outcome::BestEffort {
                    let applied = u64::from(t.outcome == abhyasa_wire::Outcome::Applied);
                    let superseded = u64::from(
                        t.outcome
                            == abhyasa_wire::Outcome::Declined(
                                abhyasa_wire::DeclineReason::Superseded,
                            ),
                    );
                    honest.custody += 1;
                    honest.applied += applied;
                    honest.superseded += superseded;
                    if *to_agent0 {
                        honest.agent0_custody += 1;
                        honest.agent0_applied += applied;
                        honest.agent0_superseded += superseded;
                    }
                }
                let name = format!("{:?}", t.outcome);
                let name = name.split(['(', ' ', '{']).next().unwrap_or("?").to_owned();
                *outcomes.entry(name).or_default() += 1;
                per_minute
                    .entry(second / 60)
                    .or_default()
                    .push(t.at.0.saturating_sub(*at));
            }
            None if p.is_pending(*id) => still_pending += 1,
            None => {
                if lost < 3 {
                    eprintln!(
                        "lost: {id} (the principal holds {} terminal records)",
                        p.terminal_count()
                    );
                }
                lost += 1;
            }
        }
    }
    let latency = per_minute
        .into_iter()
        .map(|(minute, mut v)| {
            v.sort_unstable();
            let q = |f: f64| v[((v.len() - 1) as f64 * f).round() as usize];
            MinuteLatency {
                minute,
                n: v.len(),
                p50_ms: q(0.5),
                p99_ms: q(0.99),
                max_ms: *v.last().unwrap_or(&0),
            }
        })
        .collect();
    Ok(SoakReport {
        samples,
        latency,
        acked: acked.len() as u64,
        peers_up: up,
        agents: config.agents,
        refused,
        kills,
        partitions,
        lost,
        still_pending,
        outcomes,
        audit: report,
        adversary,
        honest,
    })
}

/// Writes `soak.csv` (samples), `soak-latency.csv` and `soak.svg` (memory and open files over
/// time) under `out`.
pub fn write(report: &SoakReport, out: &Path) -> Result<(), sweep::Error> {
    let mut csv = String::from("t_s,rss_kib,fds,pending,acked,agent_rss_kib,agent_fds\n");
    for s in &report.samples {
        csv.push_str(&format!(
            "{:.1},{},{},{},{},{},{}\n",
            s.t_s, s.rss_kib, s.fds, s.pending, s.acked, s.agent_rss_kib, s.agent_fds
        ));
    }
    sweep::write(out, "soak.csv", &csv)?;
    let mut lat = String::from("minute,n,p50_ms,p99_ms,max_ms\n");
    for m in &report.latency {
        lat.push_str(&format!(
            "{},{},{},{},{}\n",
            m.minute, m.n, m.p50_ms, m.p99_ms, m.max_ms
        ));
    }
    sweep::write(out, "soak-latency.csv", &lat)?;
    let attacked = report.adversary.is_some();
    let mut series = vec![
        Series {
            label: "principal RSS, MiB".into(),
            points: report
                .samples
                .iter()
                .map(|s| (s.t_s, s.rss_kib as f64 / 1024.0))
                .collect(),
        },
        Series {
            label: if attacked {
                "agent-0 RSS, MiB (under attack)".into()
            } else {
                "agent-0 RSS, MiB (partitioned, never killed)".into()
            },
            points: report
                .samples
                .iter()
                .map(|s| (s.t_s, s.agent_rss_kib as f64 / 1024.0))
                .collect(),
        },
        Series {
            label: "principal open files".into(),
            points: report
                .samples
                .iter()
                .map(|s| (s.t_s, s.fds as f64))
                .collect(),
        },
        Series {
            label: "pending".into(),
            points: report
                .samples
                .iter()
                .map(|s| (s.t_s, s.pending as f64))
                .collect(),
        },
    ];
    if attacked {
        series.push(Series {
            label: "agent-0 open files".into(),
            points: report
                .samples
                .iter()
                .map(|s| (s.t_s, s.agent_fds as f64))
                .collect(),
        });
    }
    sweep::plot(
        &out.join("soak.svg"),
        &Axes {
            title: if attacked {
                "soak --adversary: agent-0 under every attack at once, beside the honest principal"
            } else {
                "soak: the principal and agent-0 over time (agents partitioned and SIGKILLed)"
            },
            x: "seconds",
            y: "MiB / files / obligations",
            log_x: false,
        },
        &series,
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_proc_dropped_while_running_is_killed_and_reaped() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        let exe = dir.path().join("node");
        std::fs::write(&exe, "#!/bin/sh\nexec sleep 60\n").unwrap();
        std::fs::set_permissions(&exe, std::fs::Permissions::from_mode(0o755)).unwrap();
        let p = Proc::start(&exe, &dir.path().join("c.toml"), &dir.path().join("log")).unwrap();
        let pid = p.child.id();
        assert!(std::path::Path::new(&format!("/proc/{pid}")).exists());
        drop(p);
        assert!(
            !std::path::Path::new(&format!("/proc/{pid}")).exists(),
            "the process outlived its handle"
        );
    }

    fn kinds_issued(kinds: &[SoakKind]) -> std::collections::BTreeSet<String> {
        let mut rng = rand::rngs::StdRng::seed_from_u64(7);
        (0..300)
            .map(|n| spec(&mut rng, kinds, "agent-0", n, 1_000).kind)
            .collect()
    }

    #[test]
    fn the_mix_holds_only_the_kinds_asked_for() {
        let token = kinds_issued(&[SoakKind::Token]);
        assert_eq!(token.into_iter().collect::<Vec<_>>(), ["oauth.token"]);
        let two = kinds_issued(&[SoakKind::Consent, SoakKind::Belief]);
        assert_eq!(
            two.into_iter().collect::<Vec<_>>(),
            ["anumati.consent", "phala.belief_update"]
        );
        // None named: all three.
        assert_eq!(kinds_issued(&[]).len(), 3);
    }
}
