//! `abhyasa sweep`: end-to-end measurements over loopback QUIC through the in-process netem
//! emulator that are distributions rather than single timings, written as CSV and SVG plots.
//!
//! - [`partition`]: how often custody escalates an obligation whose target becomes reachable
//!   again before its deadline, as a function of partition length over the deadline;
//! - [`loss`]: time to discharge one obligation (durable on both ends) against loss, with the
//!   first attempt on a stream or as a datagram;
//! - [`recovery`]: time from restart to resumed custody with many obligations pending;
//! - [`memory`]: resident memory per pending obligation, and over a million obligations.
//!
//! Every point runs real nodes (each with its own redb file under a temporary directory) and
//! real QUIC sessions; only the link is emulated.

use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use abhyasa_custody::{Channel, Custodian, CustodianConfig};
use abhyasa_moq::{Ca, Identity};
use abhyasa_netem::Impairment;
use abhyasa_node::{Node, NodeEvent};
use abhyasa_store::{Op, Store, StoreConfig};
use abhyasa_wire::{
    AgentId, ClientId, ConsentDecision, ConsentPayload, Obligation, ObligationId, Outcome, Payload,
    Scope, TokenAction, TokenId, TokenPayload, UnixMillis,
};
use tokio::sync::broadcast::error::RecvError;

/// Errors of a sweep.
pub type Error = Box<dyn std::error::Error + Send + Sync>;

/// The principal and agent of every sweep.
struct Pair {
    ca: Ca,
    principal: AgentId,
    agent: AgentId,
}

impl Pair {
    fn new() -> Result<Self, Error> {
        Ok(Self {
            ca: Ca::generate("abhyasa-sweep")?,
            principal: AgentId::new("principal")?,
            agent: AgentId::new("agent-1")?,
        })
    }

    fn identity(&self, who: &AgentId) -> Result<Identity, Error> {
        Ok(self.ca.issue(who)?)
    }

    /// Starts the agent, then the principal dialing it, both sending through `spec`.
    async fn start(
        &self,
        dir: &Path,
        spec: &Impairment,
        custodian: CustodianConfig,
        seed: u64,
    ) -> Result<(Arc<Node>, Node), Error> {
        let agent = Node::builder(self.identity(&self.agent)?)
            .state_dir(dir.join("agent"))
            .impair(spec.clone(), seed)
            .build()
            .await?;
        let principal = Node::builder(self.identity(&self.principal)?)
            .peer(self.agent.clone(), agent.local_addr())
            .state_dir(dir.join("principal"))
            .custodian(custodian)
            .impair(spec.clone(), seed ^ 0x5eed)
            .build()
            .await?;
        Ok((Arc::new(principal), agent))
    }

    /// A token revocation to the agent, unique per `n` and per run.
    fn obligation(&self, n: u64, deadline_ms: u64) -> Obligation {
        let t = unix_ms();
        Obligation {
            id: ObligationId::from_u128((u128::from(t) << 40) | u128::from(n)),
            issuer: self.principal.clone(),
            target: self.agent.clone(),
            created_at: UnixMillis(t),
            deadline: UnixMillis(t + deadline_ms),
            max_retries: 1_000,
            sequence: None,
            payload: Payload::OauthToken(TokenPayload {
                action: TokenAction::Revoke,
                token_id: TokenId::new(format!("tok-{n}")).expect("a valid token id"),
                client_id: ClientId::new("sweep").expect("a valid client id"),
                expires_at: None,
            }),
        }
    }
}

/// Wall-clock time, ms since the Unix epoch.
pub(crate) fn unix_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap_or_default()
        .as_millis() as u64
}

/// Issues one obligation and waits for its end: (outcome, attempts, issue→terminal time).
async fn discharge(node: &Node, o: Obligation) -> Result<(Outcome, u32, Duration), Error> {
    let started = Instant::now();
    let h = node.issue(o).await?;
    let (record, _) = h.outcome().await.ok_or("the node stopped")?;
    Ok((record.outcome, record.attempts, started.elapsed()))
}

fn temp_dir() -> Result<tempfile::TempDir, Error> {
    // Under the working directory: the same file system the benchmarks commit to.
    Ok(tempfile::tempdir_in(std::env::current_dir()?)?)
}

pub(crate) fn percentile(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    let rank = (p * (sorted.len() - 1) as f64).round() as usize;
    sorted[rank.min(sorted.len() - 1)]
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

// ---------------------------------------------------------------------------------------------
// Partition sweep

/// Settings of the partition sweep.
#[derive(Clone, Debug)]
pub struct PartitionSweep {
    /// Deadline of every obligation, ms after issue.
    pub deadline_ms: u64,
    /// Obligations issued at the start of each partition (the sample of each point).
    pub obligations: u64,
    /// Partition lengths, as fractions of the deadline.
    pub fractions: Vec<f64>,
    /// Backoff caps to compare, one curve each (ms).
    pub caps_ms: Vec<u64>,
    /// Response timeout of each attempt (ms).
    pub response_timeout_ms: u64,
}

impl Default for PartitionSweep {
    fn default() -> Self {
        Self {
            deadline_ms: 1_000,
            obligations: 100,
            fractions: (0..=12).map(|i| f64::from(i) / 10.0).collect(),
            caps_ms: vec![50, 250],
            response_timeout_ms: 100,
        }
    }
}

/// One point of the partition sweep.
#[derive(Clone, Debug, PartialEq)]
pub struct PartitionPoint {
    /// Backoff cap of the curve (ms).
    pub cap_ms: u64,
    /// Partition length (ms).
    pub partition_ms: u64,
    /// Partition length over the deadline.
    pub fraction: f64,
    /// Obligations issued.
    pub issued: u64,
    /// Ended applied.
    pub applied: u64,
    /// Ended escalated.
    pub escalated: u64,
    /// Of these, escalated although the partition ended before their deadline.
    pub spurious: u64,
    /// Obligations whose deadline fell after the partition ended (could have been applied).
    pub reachable: u64,
    /// Median issue→applied time of the applied ones (ms).
    pub applied_p50_ms: f64,
}

impl PartitionPoint {
    /// Spurious escalations over the obligations that could have been applied.
    pub fn spurious_rate(&self) -> f64 {
        if self.reachable == 0 {
            f64::NAN
        } else {
            self.spurious as f64 / self.reachable as f64
        }
    }
}

/// Runs the partition sweep: for each cap and each length, two fresh nodes with 10 ms each
/// way; the session is up, then both sockets blackhole for the length, and `obligations`
/// revocations are issued at once as the partition starts. An escalation counts as spurious
/// when the partition ended before the obligation's deadline.
pub async fn partition(s: &PartitionSweep) -> Result<Vec<PartitionPoint>, Error> {
    let pair = Pair::new()?;
    let base: Impairment = "delay 10ms".parse()?;
    let mut points = Vec::new();
    for (ci, &cap) in s.caps_ms.iter().enumerate() {
        for (fi, &fraction) in s.fractions.iter().enumerate() {
            let dir = temp_dir()?;
            let partition_ms = (fraction * s.deadline_ms as f64).round() as u64;
            let custodian = CustodianConfig {
                response_timeout_ms: s.response_timeout_ms,
                backoff_base_ms: 20.min(cap),
                backoff_cap_ms: cap,
                ..CustodianConfig::default()
            };
            let seed = (ci * 1_000 + fi) as u64;
            let (principal, agent) = pair.start(dir.path(), &base, custodian, seed).await?;
            // The session is up once one obligation has been applied.
            let (warm, _, _) =
                discharge(&principal, pair.obligation(u64::MAX >> 24, 30_000)).await?;
            if warm != Outcome::Applied {
                return Err(format!("warm-up obligation ended {warm:?}").into());
            }
            // Blackhole both directions from the same instant.
            let lead = Duration::from_millis(5);
            let begin = Instant::now() + lead;
            for node in [&*principal, &agent] {
                let h = node.impairment().ok_or("node without impairment")?;
                let mut spec = base.clone();
                spec.partitions
                    .push((h.elapsed() + lead, Duration::from_millis(partition_ms)));
                h.set_rules(spec);
            }
            tokio::time::sleep_until((begin + Duration::from_millis(1)).into()).await;
            let end = begin + Duration::from_millis(partition_ms);
            let mut tasks = tokio::task::JoinSet::new();
            for n in 0..s.obligations {
                let (node, o) = (principal.clone(), pair.obligation(n, s.deadline_ms));
                let deadline = Instant::now() + Duration::from_millis(s.deadline_ms);
                tasks.spawn(async move { (discharge(&node, o).await, deadline) });
            }
            let mut p = PartitionPoint {
                cap_ms: cap,
                partition_ms,
                fraction,
                issued: s.obligations,
                applied: 0,
                escalated: 0,
                spurious: 0,
                reachable: 0,
                applied_p50_ms: f64::NAN,
            };
            let mut applied_ms = Vec::new();
            while let Some(joined) = tasks.join_next().await {
                let (result, deadline) = joined?;
                let (outcome, _, took) = result?;
                let reachable = deadline > end;
                p.reachable += u64::from(reachable);
                match outcome {
                    Outcome::Applied => {
                        p.applied += 1;
                        applied_ms.push(ms(took));
                    }
                    Outcome::Escalated(_) => {
                        p.escalated += 1;
                        p.spurious += u64::from(reachable);
                    }
                    other => return Err(format!("unexpected outcome {other:?}").into()),
                }
            }
            applied_ms.sort_by(f64::total_cmp);
            p.applied_p50_ms = percentile(&applied_ms, 0.5);
            eprintln!(
                "partition: cap={cap}ms length={partition_ms}ms applied={} escalated={} spurious={}/{}",
                p.applied, p.escalated, p.spurious, p.reachable
            );
            points.push(p);
            let principal = Arc::try_unwrap(principal).map_err(|_| "principal still shared")?;
            principal.shutdown().await;
            agent.shutdown().await;
        }
    }
    Ok(points)
}

/// The partition sweep as CSV.
pub fn partition_csv(points: &[PartitionPoint]) -> String {
    let mut out = String::from(
        "cap_ms,partition_ms,partition_over_deadline,issued,applied,escalated,reachable,spurious,spurious_rate,applied_p50_ms\n",
    );
    for p in points {
        let _ = writeln!(
            out,
            "{},{},{:.2},{},{},{},{},{},{:.4},{:.1}",
            p.cap_ms,
            p.partition_ms,
            p.fraction,
            p.issued,
            p.applied,
            p.escalated,
            p.reachable,
            p.spurious,
            p.spurious_rate(),
            p.applied_p50_ms
        );
    }
    out
}

// ---------------------------------------------------------------------------------------------
// Loss sweep

/// Settings of the loss sweep.
#[derive(Clone, Debug)]
pub struct LossSweep {
    /// Loss rates in percent, each applied to both directions.
    pub loss_percent: Vec<f64>,
    /// Obligations discharged one after another at each point.
    pub obligations: u64,
}

impl Default for LossSweep {
    fn default() -> Self {
        Self {
            loss_percent: vec![0.0, 1.0, 5.0, 10.0, 20.0],
            obligations: 60,
        }
    }
}

/// One point of the loss sweep.
#[derive(Clone, Debug, PartialEq)]
pub struct LossPoint {
    /// How the first attempt travelled.
    pub first_attempt: Channel,
    /// Loss each way (percent).
    pub loss_percent: f64,
    /// Median issue→applied time (ms).
    pub p50_ms: f64,
    /// 90th percentile (ms).
    pub p90_ms: f64,
    /// Mean custody attempts per obligation.
    pub mean_attempts: f64,
}

/// Runs the loss sweep: 10 ms each way, obligations discharged one at a time (each durable
/// on both ends), first attempt on a stream and as a datagram.
pub async fn loss(s: &LossSweep) -> Result<Vec<LossPoint>, Error> {
    let pair = Pair::new()?;
    let mut points = Vec::new();
    for (ci, channel) in [Channel::Stream, Channel::Datagram].into_iter().enumerate() {
        for (li, &loss) in s.loss_percent.iter().enumerate() {
            let dir = temp_dir()?;
            let spec: Impairment = format!("delay 10ms loss {loss}%").parse()?;
            let custodian = CustodianConfig {
                response_timeout_ms: 100,
                backoff_base_ms: 20,
                backoff_cap_ms: 200,
                first_attempt: channel,
                ..CustodianConfig::default()
            };
            let (principal, agent) = pair
                .start(dir.path(), &spec, custodian, (ci * 100 + li) as u64)
                .await?;
            discharge(&principal, pair.obligation(u64::MAX >> 24, 60_000)).await?;
            let (mut times, mut attempts) = (Vec::new(), 0u64);
            for n in 0..s.obligations {
                let (outcome, a, took) = discharge(&principal, pair.obligation(n, 60_000)).await?;
                if outcome != Outcome::Applied {
                    return Err(format!("obligation ended {outcome:?} at {loss}% loss").into());
                }
                times.push(ms(took));
                attempts += u64::from(a);
            }
            times.sort_by(f64::total_cmp);
            let p = LossPoint {
                first_attempt: channel,
                loss_percent: loss,
                p50_ms: percentile(&times, 0.5),
                p90_ms: percentile(&times, 0.9),
                mean_attempts: attempts as f64 / s.obligations as f64,
            };
            eprintln!(
                "loss: first_attempt={} loss={loss}% p50={:.1}ms p90={:.1}ms attempts={:.2}",
                channel_name(channel),
                p.p50_ms,
                p.p90_ms,
                p.mean_attempts
            );
            points.push(p);
            let principal = Arc::try_unwrap(principal).map_err(|_| "principal still shared")?;
            principal.shutdown().await;
            agent.shutdown().await;
        }
    }
    Ok(points)
}

fn channel_name(c: Channel) -> &'static str {
    match c {
        Channel::Stream => "stream",
        Channel::Datagram => "datagram",
    }
}

/// The loss sweep as CSV.
pub fn loss_csv(points: &[LossPoint]) -> String {
    let mut out = String::from("first_attempt,loss_percent,p50_ms,p90_ms,mean_attempts\n");
    for p in points {
        let _ = writeln!(
            out,
            "{},{},{:.2},{:.2},{:.3}",
            channel_name(p.first_attempt),
            p.loss_percent,
            p.p50_ms,
            p.p90_ms,
            p.mean_attempts
        );
    }
    out
}

// ---------------------------------------------------------------------------------------------
// Memory sweep

/// Settings of the memory sweep.
#[derive(Clone, Debug)]
pub struct MemorySweep {
    /// Obligations left pending (their agent unreachable) for the per-obligation figure.
    pub pending: u64,
    /// Obligations passed through a principal and its agent for the long-run figure.
    pub through: u64,
    /// Resident memory is sampled after every this many.
    pub sample_every: u64,
    /// Obligations in flight while passing through.
    pub window: u64,
    /// Each node's redb page cache.
    pub cache_bytes: usize,
}

impl Default for MemorySweep {
    fn default() -> Self {
        Self {
            pending: 100_000,
            through: 1_000_000,
            sample_every: 50_000,
            window: 1_024,
            cache_bytes: 4 << 20,
        }
    }
}

/// One sample of the memory sweep.
#[derive(Clone, Debug, PartialEq)]
pub struct MemoryPoint {
    /// `pending` (the agent unreachable) or `through` (applied and discharged).
    pub phase: &'static str,
    /// Obligations issued so far in this phase.
    pub obligations: u64,
    /// This process's resident memory, KiB (both nodes live in it).
    pub rss_kib: u64,
    /// Seconds since the phase started.
    pub t_s: f64,
}

/// This process's resident memory, KiB (Linux `/proc/self/status`).
pub(crate) fn rss_kib() -> Result<u64, Error> {
    proc_kib("/proc/self/status", "VmRSS").ok_or_else(|| "no VmRSS in /proc/self/status".into())
}

/// One `Field:   N kB` line of a procfs file (`status`, `smaps_rollup`), as KiB; `None` where
/// the file cannot be read (the process gone, or no procfs) or holds no such line.
pub(crate) fn proc_kib(path: &str, field: &str) -> Option<u64> {
    std::fs::read_to_string(path).ok().and_then(|s| {
        s.lines()
            .find_map(|l| l.strip_prefix(field)?.strip_prefix(':'))
            .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
    })
}

/// A consent revocation on one of eight scopes: custody, and nothing kept for good by the
/// agent (a token revocation is, by design, so it would measure the workload, not the node).
fn consent(pair: &Pair, n: u64, deadline_ms: u64) -> Result<Obligation, Error> {
    let mut o = pair.obligation(n, deadline_ms);
    o.payload = Payload::AnumatiConsent(ConsentPayload {
        decision: Some(ConsentDecision::Revoke),
        scope: Scope::new(format!("scope-{}", n % 8))?,
        expires_at: None,
    });
    Ok(o)
}

/// Issues `range` at once (each on its own task) and returns the handles.
async fn issue_all(
    pair: &Arc<Pair>,
    node: &Arc<Node>,
    range: std::ops::Range<u64>,
    deadline_ms: u64,
) -> Result<Vec<abhyasa_node::IssueHandle>, Error> {
    let mut tasks = tokio::task::JoinSet::new();
    for n in range {
        let (pair, node) = (pair.clone(), node.clone());
        tasks.spawn(async move {
            let o = consent(&pair, n, deadline_ms)?;
            Ok::<_, Error>(node.issue(o).await?)
        });
    }
    let mut handles = Vec::new();
    while let Some(h) = tasks.join_next().await {
        handles.push(h??);
    }
    Ok(handles)
}

/// Runs the memory sweep. Pending: a principal whose agent never answers takes `pending`
/// obligations (deadline an hour away); the growth of resident memory over them, divided by
/// their number, is the cost of one pending obligation (the custodian's state, the node's
/// waiter, and whatever redb keeps of its row within the page cache). Through: a principal
/// and its agent in this process pass `through` obligations, `window` in flight, each awaited
/// to `applied`; resident memory is sampled as they go.
pub async fn memory(s: &MemorySweep) -> Result<Vec<MemoryPoint>, Error> {
    let pair = Arc::new(Pair::new()?);
    let dir = temp_dir()?;
    let store = |cache| StoreConfig {
        cache_bytes: cache,
        ..StoreConfig::default()
    };
    let mut points = Vec::new();

    // Pending: nobody listens at the agent's address (a port bound, then released).
    let nobody = std::net::UdpSocket::bind("127.0.0.1:0")?.local_addr()?;
    let principal = Arc::new(
        Node::builder(pair.identity(&pair.principal)?)
            .peer(pair.agent.clone(), nobody)
            .state_dir(dir.path().join("pending"))
            .custodian(unbounded())
            .store(store(s.cache_bytes))
            .build()
            .await?,
    );
    // A first batch warms the runtime, the session machinery and redb's cache.
    let warm = s.window.min(s.pending);
    let mut held = issue_all(&pair, &principal, 0..warm, 3_600_000).await?;
    let started = Instant::now();
    let mut issued = warm;
    points.push(MemoryPoint {
        phase: "pending",
        obligations: issued,
        rss_kib: rss_kib()?,
        t_s: 0.0,
    });
    while issued < s.pending {
        let next = (issued + s.sample_every.max(1)).min(s.pending);
        let mut from = issued;
        while from < next {
            let to = (from + s.window.max(1)).min(next);
            held.extend(issue_all(&pair, &principal, from..to, 3_600_000).await?);
            from = to;
        }
        issued = next;
        points.push(MemoryPoint {
            phase: "pending",
            obligations: issued,
            rss_kib: rss_kib()?,
            t_s: started.elapsed().as_secs_f64(),
        });
        eprintln!(
            "memory: pending={issued} rss={} KiB",
            points.last().map_or(0, |p| p.rss_kib)
        );
    }
    let status = principal.status().await?;
    if (status.pending.len() as u64) < s.pending {
        return Err(format!("{} of {} pending", status.pending.len(), s.pending).into());
    }
    drop(held);
    match Arc::try_unwrap(principal) {
        Ok(node) => node.shutdown().await,
        Err(_) => return Err("the pending principal is still shared".into()),
    }

    // Through.
    let agent = Node::builder(pair.identity(&pair.agent)?)
        .state_dir(dir.path().join("agent"))
        .store(store(s.cache_bytes))
        .build()
        .await?;
    let principal = Arc::new(
        Node::builder(pair.identity(&pair.principal)?)
            .peer(pair.agent.clone(), agent.local_addr())
            .state_dir(dir.path().join("principal"))
            .custodian(unbounded())
            .store(store(s.cache_bytes))
            .build()
            .await?,
    );
    let base = 1u64 << 32; // ids apart from the pending phase's
    let started = Instant::now();
    let mut done = 0u64;
    points.push(MemoryPoint {
        phase: "through",
        obligations: 0,
        rss_kib: rss_kib()?,
        t_s: 0.0,
    });
    while done < s.through {
        let to = (done + s.window.max(1)).min(s.through);
        let handles = issue_all(&pair, &principal, base + done..base + to, 60_000).await?;
        for h in handles {
            let (record, _) = h.outcome().await.ok_or("the principal stopped")?;
            if record.outcome != Outcome::Applied {
                return Err(format!("obligation {record:?} not applied").into());
            }
        }
        let sampled_before = done / s.sample_every.max(1);
        done = to;
        if done / s.sample_every.max(1) != sampled_before || done == s.through {
            points.push(MemoryPoint {
                phase: "through",
                obligations: done,
                rss_kib: rss_kib()?,
                t_s: started.elapsed().as_secs_f64(),
            });
            eprintln!(
                "memory: through={done} rss={} KiB ({:.0}/s)",
                points.last().map_or(0, |p| p.rss_kib),
                done as f64 / started.elapsed().as_secs_f64()
            );
        }
    }
    match Arc::try_unwrap(principal) {
        Ok(node) => node.shutdown().await,
        Err(_) => return Err("the principal is still shared".into()),
    }
    agent.shutdown().await;
    Ok(points)
}

/// The memory sweep as CSV.
pub fn memory_csv(points: &[MemoryPoint]) -> String {
    let mut out = String::from("phase,obligations,rss_kib,t_s\n");
    for p in points {
        let _ = writeln!(
            out,
            "{},{},{},{:.1}",
            p.phase, p.obligations, p.rss_kib, p.t_s
        );
    }
    out
}

/// Runs the memory sweep and writes `memory.csv` and `memory.svg` under `out`.
pub async fn memory_to(s: &MemorySweep, out: &Path) -> Result<Vec<MemoryPoint>, Error> {
    let points = memory(s).await?;
    write(out, "memory.csv", &memory_csv(&points))?;
    let line = |phase: &str, label: &str| Series {
        label: label.into(),
        points: points
            .iter()
            .filter(|p| p.phase == phase)
            .map(|p| (p.obligations as f64, p.rss_kib as f64 / 1024.0))
            .collect(),
    };
    plot(
        &out.join("memory.svg"),
        &Axes {
            title: "Resident memory of a principal (and its agent, through)",
            x: "obligations",
            y: "MiB",
            log_x: false,
        },
        &[
            line("pending", "pending (agent unreachable)"),
            line("through", "applied and discharged (principal and agent)"),
        ],
    )?;
    Ok(points)
}

// Recovery sweep

/// Settings of the recovery sweep.
#[derive(Clone, Debug)]
pub struct RecoverySweep {
    /// Pending obligations on disk at restart.
    pub pending: Vec<u64>,
    /// Restarts measured per size.
    pub runs: u32,
}

impl Default for RecoverySweep {
    fn default() -> Self {
        Self {
            pending: vec![1_000, 10_000, 100_000],
            runs: 3,
        }
    }
}

/// One restart of the recovery sweep.
#[derive(Clone, Debug, PartialEq)]
pub struct RecoveryRun {
    /// Pending obligations on disk.
    pub pending: u64,
    /// Which run.
    pub run: u32,
    /// Store opened and custodian recovered, without the network (ms).
    pub store_recover_ms: f64,
    /// Restart → node running (store opened, both machines recovered, endpoint bound) (ms).
    pub node_up_ms: f64,
    /// Restart → first re-offered obligation applied by the agent and its terminal record
    /// committed: custody has resumed (ms).
    pub first_discharge_ms: f64,
    /// Restart → every pending obligation discharged (ms).
    pub all_discharged_ms: f64,
}

/// Writes a principal database holding `n` pending revocations to the agent (deadline an
/// hour away).
fn pending_database(pair: &Pair, path: &Path, n: u64) -> Result<(), Error> {
    let mut store = Store::open(path, StoreConfig::default())?;
    let mut c = Custodian::new(pair.principal.clone(), unbounded(), 1);
    let now = unix_ms();
    for chunk in (0..n).collect::<Vec<_>>().chunks(10_000) {
        let mut ops = Vec::with_capacity(chunk.len());
        for &i in chunk {
            c.issue(UnixMillis(now), pair.obligation(i, 3_600_000))?;
            while let Some(r) = c.poll_persist() {
                ops.push(Op::Custodian(r.record));
            }
        }
        store.commit(&ops)?;
    }
    Ok(())
}

fn unbounded() -> CustodianConfig {
    CustodianConfig {
        max_pending: usize::MAX,
        max_pending_per_target: usize::MAX,
        max_principal_entries: usize::MAX,
        ..CustodianConfig::default()
    }
}

/// Runs the recovery sweep: a principal restarts on a database with `pending` obligations
/// under custody while its agent is up (loopback, no impairment).
pub async fn recovery(s: &RecoverySweep) -> Result<Vec<RecoveryRun>, Error> {
    let pair = Pair::new()?;
    let mut runs = Vec::new();
    for &n in &s.pending {
        let dir = temp_dir()?;
        let template = dir.path().join("template.redb");
        let built = Instant::now();
        pending_database(&pair, &template, n)?;
        eprintln!("recovery: wrote {n} pending in {:?}", built.elapsed());
        for run in 0..s.runs {
            let state = dir.path().join(format!("run-{run}"));
            std::fs::create_dir_all(state.join("principal"))?;
            std::fs::copy(&template, state.join("principal").join("node.redb"))?;
            std::fs::copy(&template, state.join("offline.redb"))?;

            let started = Instant::now();
            let store = Store::open(state.join("offline.redb"), StoreConfig::default())?;
            let c = store.recover_custodian(
                pair.principal.clone(),
                unbounded(),
                2,
                UnixMillis(unix_ms()),
            )?;
            if c.pending_len() as u64 != n {
                return Err(format!("recovered {} of {n} pending", c.pending_len()).into());
            }
            let store_recover = started.elapsed();
            drop((c, store));

            let agent = Node::builder(pair.identity(&pair.agent)?)
                .state_dir(state.join("agent"))
                .build()
                .await?;
            let started = Instant::now();
            let principal = Node::builder(pair.identity(&pair.principal)?)
                .peer(pair.agent.clone(), agent.local_addr())
                .state_dir(state.join("principal"))
                .custodian(unbounded())
                .build()
                .await?;
            let mut events = principal.events();
            let node_up = started.elapsed();
            let (mut first, mut done) = (None, 0u64);
            let limit = Duration::from_secs(120 + n / 500);
            while done < n {
                let e = tokio::time::timeout_at((started + limit).into(), events.recv())
                    .await
                    .map_err(|_| format!("{done} of {n} discharged after {limit:?}"))?;
                match e {
                    Ok(NodeEvent::Terminal { record, .. }) => {
                        if record.outcome != Outcome::Applied {
                            return Err(format!("recovered obligation {record:?}").into());
                        }
                        first.get_or_insert_with(|| started.elapsed());
                        done += 1;
                    }
                    Ok(_) => {}
                    // Only terminal events flow here; the skipped ones are counted.
                    Err(RecvError::Lagged(k)) => {
                        first.get_or_insert_with(|| started.elapsed());
                        done += k;
                    }
                    Err(RecvError::Closed) => return Err("the node stopped".into()),
                }
            }
            let all = started.elapsed();
            // The durable count must agree with the events.
            let status = principal.status().await?;
            if !status.pending.is_empty() {
                return Err(format!("{} still pending", status.pending.len()).into());
            }
            let r = RecoveryRun {
                pending: n,
                run,
                store_recover_ms: ms(store_recover),
                node_up_ms: ms(node_up),
                first_discharge_ms: ms(first.unwrap_or(all)),
                all_discharged_ms: ms(all),
            };
            eprintln!(
                "recovery: pending={n} run={run} store={:.1}ms up={:.1}ms first={:.1}ms all={:.0}ms",
                r.store_recover_ms, r.node_up_ms, r.first_discharge_ms, r.all_discharged_ms
            );
            runs.push(r);
            principal.shutdown().await;
            agent.shutdown().await;
            std::fs::remove_dir_all(&state)?;
        }
    }
    Ok(runs)
}

/// The recovery sweep as CSV (every run).
pub fn recovery_csv(runs: &[RecoveryRun]) -> String {
    let mut out = String::from(
        "pending,run,store_recover_ms,node_up_ms,first_discharge_ms,all_discharged_ms\n",
    );
    for r in runs {
        let _ = writeln!(
            out,
            "{},{},{:.2},{:.2},{:.2},{:.1}",
            r.pending,
            r.run,
            r.store_recover_ms,
            r.node_up_ms,
            r.first_discharge_ms,
            r.all_discharged_ms
        );
    }
    out
}

/// Median of each column of the recovery runs, per pending size.
pub fn recovery_medians(runs: &[RecoveryRun]) -> Vec<RecoveryRun> {
    let mut sizes: Vec<u64> = runs.iter().map(|r| r.pending).collect();
    sizes.dedup();
    sizes
        .into_iter()
        .map(|n| {
            let of = |f: fn(&RecoveryRun) -> f64| {
                let mut v: Vec<f64> = runs.iter().filter(|r| r.pending == n).map(f).collect();
                v.sort_by(f64::total_cmp);
                percentile(&v, 0.5)
            };
            RecoveryRun {
                pending: n,
                run: 0,
                store_recover_ms: of(|r| r.store_recover_ms),
                node_up_ms: of(|r| r.node_up_ms),
                first_discharge_ms: of(|r| r.first_discharge_ms),
                all_discharged_ms: of(|r| r.all_discharged_ms),
            }
        })
        .collect()
}

// ---------------------------------------------------------------------------------------------
// Output

/// One line of a plot.
pub struct Series {
    /// Legend label.
    pub label: String,
    /// Points (x, y); NaN y values are skipped.
    pub points: Vec<(f64, f64)>,
}

/// Axes of a plot.
pub struct Axes<'a> {
    /// Title.
    pub title: &'a str,
    /// X axis label.
    pub x: &'a str,
    /// Y axis label.
    pub y: &'a str,
    /// Logarithmic x axis.
    pub log_x: bool,
}

/// Draws `series` as an SVG line plot at `path`.
pub fn plot(path: &Path, axes: &Axes<'_>, series: &[Series]) -> Result<(), Error> {
    use plotters::prelude::*;
    let finite = || {
        series
            .iter()
            .flat_map(|s| s.points.iter())
            .filter(|(x, y)| x.is_finite() && y.is_finite())
    };
    let (mut x0, mut x1, mut y1) = (f64::MAX, f64::MIN, 0f64);
    for &(x, y) in finite() {
        (x0, x1, y1) = (x0.min(x), x1.max(x), y1.max(y));
    }
    if x0 > x1 {
        return Err(format!("nothing to plot in {}", path.display()).into());
    }
    if x0 == x1 {
        x1 = x0 + 1.0;
    }
    let y1 = if y1 > 0.0 { y1 * 1.1 } else { 1.0 };
    let root = SVGBackend::new(path, (800, 480)).into_drawing_area();
    root.fill(&WHITE)?;
    let colors = [BLUE, RED, GREEN, MAGENTA, CYAN, BLACK];
    let mut chart = ChartBuilder::on(&root);
    chart
        .caption(axes.title, ("sans-serif", 20))
        .margin(15)
        .x_label_area_size(45)
        .y_label_area_size(60);
    macro_rules! draw {
        ($chart:expr) => {{
            let mut chart = $chart;
            chart
                .configure_mesh()
                .x_desc(axes.x)
                .y_desc(axes.y)
                .draw()?;
            for (i, s) in series.iter().enumerate() {
                let color = colors[i % colors.len()];
                let pts: Vec<(f64, f64)> = s
                    .points
                    .iter()
                    .copied()
                    .filter(|(x, y)| x.is_finite() && y.is_finite())
                    .collect();
                chart
                    .draw_series(LineSeries::new(pts.clone(), color.stroke_width(2)))?
                    .label(s.label.clone())
                    .legend(move |(x, y)| {
                        PathElement::new(vec![(x, y), (x + 20, y)], color.stroke_width(2))
                    });
                chart.draw_series(pts.into_iter().map(|p| Circle::new(p, 3, color.filled())))?;
            }
            chart
                .configure_series_labels()
                .background_style(WHITE.mix(0.8))
                .border_style(BLACK)
                .draw()?;
        }};
    }
    if axes.log_x {
        draw!(chart.build_cartesian_2d((x0..x1).log_scale(), 0f64..y1)?);
    } else {
        draw!(chart.build_cartesian_2d(x0..x1, 0f64..y1)?);
    }
    root.present()?;
    Ok(())
}

/// Writes `text` to `dir/name`, creating `dir`.
pub fn write(dir: &Path, name: &str, text: &str) -> Result<PathBuf, Error> {
    std::fs::create_dir_all(dir)?;
    let path = dir.join(name);
    std::fs::write(&path, text)?;
    Ok(path)
}

/// Runs the partition sweep and writes `partition.csv` and `partition.svg` under `out`.
pub async fn partition_to(s: &PartitionSweep, out: &Path) -> Result<Vec<PartitionPoint>, Error> {
    let points = partition(s).await?;
    write(out, "partition.csv", &partition_csv(&points))?;
    let series: Vec<Series> = s
        .caps_ms
        .iter()
        .map(|&cap| Series {
            label: format!("backoff cap {cap} ms"),
            points: points
                .iter()
                .filter(|p| p.cap_ms == cap)
                .map(|p| (p.fraction, p.spurious_rate()))
                .collect(),
        })
        .collect();
    plot(
        &out.join("partition.svg"),
        &Axes {
            title: &format!(
                "Spurious escalation vs partition length (deadline {} ms, 20 ms RTT)",
                s.deadline_ms
            ),
            x: "partition length / deadline",
            y: "escalated, of those reachable before the deadline",
            log_x: false,
        },
        &series,
    )?;
    Ok(points)
}

/// Runs the loss sweep and writes `loss.csv` and `loss.svg` under `out`.
pub async fn loss_to(s: &LossSweep, out: &Path) -> Result<Vec<LossPoint>, Error> {
    let points = loss(s).await?;
    write(out, "loss.csv", &loss_csv(&points))?;
    let mut series = Vec::new();
    for channel in [Channel::Stream, Channel::Datagram] {
        for (name, f) in [
            ("p50", (|p: &LossPoint| p.p50_ms) as fn(&LossPoint) -> f64),
            ("p90", |p: &LossPoint| p.p90_ms),
        ] {
            series.push(Series {
                label: format!("first attempt on a {}, {name}", channel_name(channel)),
                points: points
                    .iter()
                    .filter(|p| p.first_attempt == channel)
                    .map(|p| (p.loss_percent, f(p)))
                    .collect(),
            });
        }
    }
    plot(
        &out.join("loss.svg"),
        &Axes {
            title: "Time to discharge one obligation (durable both ends, 20 ms RTT)",
            x: "loss each way (%)",
            y: "ms",
            log_x: false,
        },
        &series,
    )?;
    Ok(points)
}

/// Runs the recovery sweep and writes `recovery.csv` (every run) and `recovery.svg`
/// (medians) under `out`.
pub async fn recovery_to(s: &RecoverySweep, out: &Path) -> Result<Vec<RecoveryRun>, Error> {
    let runs = recovery(s).await?;
    write(out, "recovery.csv", &recovery_csv(&runs))?;
    let medians = recovery_medians(&runs);
    let line = |label: &str, f: fn(&RecoveryRun) -> f64| Series {
        label: label.into(),
        points: medians.iter().map(|r| (r.pending as f64, f(r))).collect(),
    };
    plot(
        &out.join("recovery.svg"),
        &Axes {
            title: "Restart with N obligations pending (median)",
            x: "pending obligations",
            y: "ms",
            log_x: true,
        },
        &[
            line("store open + custodian recovered", |r| r.store_recover_ms),
            line("node up", |r| r.node_up_ms),
            line("first re-offered obligation discharged", |r| {
                r.first_discharge_ms
            }),
        ],
    )?;
    plot(
        &out.join("recovery-drain.svg"),
        &Axes {
            title: "Restart with N obligations pending: all discharged (median)",
            x: "pending obligations",
            y: "ms",
            log_x: true,
        },
        &[line("every pending obligation discharged", |r| {
            r.all_discharged_ms
        })],
    )?;
    Ok(runs)
}

#[cfg(test)]
mod tests {
    use super::proc_kib;

    #[test]
    fn proc_kib_reads_the_named_field_and_not_one_it_prefixes() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("smaps_rollup");
        std::fs::write(&path, "Rss:  900 kB\nPss_Anon:  5 kB\nPss:    7 kB\n").unwrap();
        let path = path.to_str().unwrap();
        assert_eq!(proc_kib(path, "Pss"), Some(7));
        assert_eq!(proc_kib(path, "Pss_Anon"), Some(5));
        assert_eq!(proc_kib(path, "Swap"), None);
        assert_eq!(proc_kib("/nonexistent/status", "VmRSS"), None);
    }
}
