//! `abhyasa sweep fanout`: one principal and N agents, each a real node with its own redb file,
//! meeting directly (the principal dials every agent) or at an unmodified `moq-relay` (each
//! agent subscribing only to the principal's namespace). The agents run as nodes in this
//! process or, with `--processes`, each as its own `abhyasa node` process; the principal is
//! always in this process, issuing through the `Node` API. Per point: durable obligations per
//! second with a bounded window in flight, issue→`applied` percentiles, time for every agent
//! to be reachable, and resident memory per node.

use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use std::net::SocketAddr;
use std::process::Command;

use abhyasa_custody::CustodianConfig;
use abhyasa_moq::Ca;
use abhyasa_node::Node;
use abhyasa_store::StoreConfig;
use abhyasa_wire::{
    AgentId, ConsentDecision, ConsentPayload, Obligation, ObligationId, Outcome, Payload, Scope,
    UnixMillis,
};

use crate::admin::{self, AdminAddr, AdminTarget, Request};
use crate::soak::Proc;
use crate::sweep::{percentile, plot, proc_kib, rss_kib, unix_ms, write, Axes, Error, Series};

/// What to sweep.
#[derive(Clone, Debug)]
pub struct FanoutSweep {
    /// Agent counts.
    pub agents: Vec<usize>,
    /// Obligations issued per point, spread over the agents round-robin.
    pub obligations: u64,
    /// Obligations in flight at once.
    pub window: usize,
    /// Whether to run the direct points.
    pub direct: bool,
    /// The `moq-relay` binary: relay points run only with it.
    pub relay: Option<PathBuf>,
    /// Run every agent as its own `abhyasa node` process, started from this binary; `None`:
    /// every agent is a node in this process.
    pub processes: Option<PathBuf>,
}

/// One point.
#[derive(Clone, Debug)]
pub struct FanoutPoint {
    /// `direct` or `relay`.
    pub mode: &'static str,
    /// Whether each agent was its own process (`--processes`).
    pub processes: bool,
    /// Agents.
    pub agents: usize,
    /// Obligations issued.
    pub obligations: u64,
    /// Of them, ended other than `applied` (escalated at the deadline when the machine could
    /// not keep up).
    pub not_applied: u64,
    /// Seconds from start until the principal could reach every agent.
    pub connect_s: f64,
    /// Obligations applied per second, first issue to last outcome.
    pub per_s: f64,
    /// Issue→applied, median and 99th percentile, ms.
    pub p50_ms: f64,
    /// See `p50_ms`.
    pub p99_ms: f64,
    /// Memory with every node up, divided by the nodes, KiB: this process's resident growth
    /// and, with agents as processes, their proportional set sizes.
    pub kib_per_node: f64,
    /// Acks the agents sent per group over the point (their `sent` objects over groups):
    /// 1.0 when each agent applied and acked its obligations one at a time, more when they
    /// arrived and were acked together.
    pub acks_per_group: f64,
}

/// The `moq-relay` binary, when installed (`abhyasa_moq::moq_relay_binary`).
pub fn relay_binary() -> Option<PathBuf> {
    abhyasa_moq::moq_relay_binary()
}

/// A consent revocation `n` from `principal` to `target`.
fn obligation(principal: &AgentId, target: &AgentId, n: u64) -> Result<Obligation, Error> {
    let t = unix_ms();
    Ok(Obligation {
        id: ObligationId::from_u128((u128::from(t) << 40) | u128::from(n)),
        issuer: principal.clone(),
        target: target.clone(),
        created_at: UnixMillis(t),
        deadline: UnixMillis(t + 120_000),
        max_retries: 1_000,
        sequence: None,
        payload: Payload::AnumatiConsent(ConsentPayload {
            decision: Some(ConsentDecision::Revoke),
            scope: Scope::new(format!("scope-{}", n % 8))?,
            expires_at: None,
        }),
    })
}

/// Each node's store page cache: small, as N nodes share this machine.
const STORE_CACHE_BYTES: usize = 1 << 20;

/// One point: `agents` agents, met directly or at the relay `relay`.
async fn point(s: &FanoutSweep, agents: usize, relay: Option<&Path>) -> Result<FanoutPoint, Error> {
    let dir = tempfile::tempdir_in(std::env::current_dir()?)?;
    let ca = Ca::generate("abhyasa-fanout")?;
    let principal_id = AgentId::new("principal")?;
    let store = StoreConfig {
        cache_bytes: STORE_CACHE_BYTES,
        ..StoreConfig::default()
    };
    let _relay = match relay {
        Some(bin) => {
            ca.issue(&AgentId::new("relay")?)?.save(dir.path())?;
            let port = std::net::UdpSocket::bind("127.0.0.1:0")?
                .local_addr()?
                .port();
            let addr: std::net::SocketAddr = format!("127.0.0.1:{port}").parse()?;
            let relay = abhyasa_moq::MoqRelayProcess::spawn(bin, addr, dir.path())?;
            Some((relay, addr))
        }
        None => None,
    };
    let rss0 = rss_kib()?;
    let started = Instant::now();
    let relay_at = _relay.as_ref().map(|(_, addr)| *addr);
    let ids = (0..agents)
        .map(|i| AgentId::new(format!("agent-{i}")))
        .collect::<Result<Vec<_>, _>>()?;
    let mut agents_up = match &s.processes {
        Some(exe) => Agents::Processes(spawn_agents(exe, &ca, &ids, dir.path(), relay_at).await?),
        None => {
            let mut nodes = Vec::with_capacity(agents);
            for a in &ids {
                let mut b = Node::builder(ca.issue(a)?)
                    .state_dir(dir.path().join(a.as_str()))
                    .store(store.clone());
                if let Some(addr) = relay_at {
                    b = b
                        .relay(AgentId::new("relay")?, addr)
                        .relay_peers([principal_id.clone()]);
                }
                let node = b.build().await?;
                nodes.push((node.local_addr(), node));
            }
            Agents::Here(nodes)
        }
    };
    let mut b = Node::builder(ca.issue(&principal_id)?)
        .state_dir(dir.path().join("principal"))
        .store(store.clone())
        .custodian(CustodianConfig {
            max_pending: usize::MAX,
            max_pending_per_target: usize::MAX,
            ..CustodianConfig::default()
        });
    match relay_at {
        Some(addr) => b = b.relay(AgentId::new("relay")?, addr),
        None => {
            for (a, addr) in ids.iter().zip(agents_up.addrs()) {
                b = b.peer(a.clone(), addr);
            }
        }
    }
    let principal = Arc::new(b.build().await?);
    let reach = Instant::now() + Duration::from_secs(300);
    loop {
        let up = principal.status().await?.peers.len();
        if up == agents {
            break;
        }
        if Instant::now() > reach {
            return Err(format!("{up} of {agents} agents reachable after 300 s").into());
        }
        if let Agents::Processes(procs) = &mut agents_up {
            exited(procs)?;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let connect_s = started.elapsed().as_secs_f64();
    let kib_per_node =
        (rss_kib()?.saturating_sub(rss0) + agents_up.pss_kib()) as f64 / (agents + 1) as f64;

    let window = Arc::new(tokio::sync::Semaphore::new(s.window.max(1)));
    let mut tasks = tokio::task::JoinSet::new();
    let started = Instant::now();
    for n in 0..s.obligations {
        let permit = window.clone().acquire_owned().await?;
        let o = obligation(&principal_id, &ids[n as usize % agents], n)?;
        let principal = principal.clone();
        tasks.spawn(async move {
            let t = Instant::now();
            let h = principal.issue(o).await?;
            let (record, _) = h.outcome().await.ok_or("the principal stopped")?;
            drop(permit);
            let applied = record.outcome == Outcome::Applied;
            Ok::<_, Error>(applied.then(|| t.elapsed().as_secs_f64() * 1e3))
        });
    }
    let mut ms = Vec::with_capacity(s.obligations as usize);
    let mut not_applied = 0;
    while let Some(r) = tasks.join_next().await {
        match r?? {
            Some(t) => ms.push(t),
            None => not_applied += 1,
        }
    }
    let took = started.elapsed().as_secs_f64();
    ms.sort_by(f64::total_cmp);
    let (acks, groups) = agents_up.sent(dir.path(), &ids).await?;
    let point = FanoutPoint {
        mode: if relay.is_some() { "relay" } else { "direct" },
        processes: s.processes.is_some(),
        agents,
        obligations: s.obligations,
        not_applied,
        connect_s,
        per_s: ms.len() as f64 / took,
        p50_ms: percentile(&ms, 0.5),
        p99_ms: percentile(&ms, 0.99),
        kib_per_node,
        acks_per_group: acks as f64 / groups.max(1) as f64,
    };
    match Arc::try_unwrap(principal) {
        Ok(p) => p.shutdown().await,
        Err(_) => return Err("the principal is still shared".into()),
    }
    agents_up.stop().await?;
    Ok(point)
}

/// The agents of one point.
enum Agents {
    /// Nodes in this process, with their addresses.
    Here(Vec<(SocketAddr, Node)>),
    /// `abhyasa node` processes, with their addresses.
    Processes(Vec<(SocketAddr, Proc)>),
}

impl Agents {
    fn addrs(&self) -> Vec<SocketAddr> {
        match self {
            Self::Here(nodes) => nodes.iter().map(|(a, _)| *a).collect(),
            Self::Processes(procs) => procs.iter().map(|(a, _)| *a).collect(),
        }
    }

    /// The agent processes' memory, KiB (nodes here count in this process's own resident
    /// growth). A process counts its proportional set size: its private pages plus its share
    /// of pages it shares, so the binary's text, mapped by every agent, is counted once over
    /// all of them rather than once per agent as resident size would.
    fn pss_kib(&self) -> u64 {
        match self {
            Self::Here(_) => 0,
            Self::Processes(procs) => procs
                .iter()
                .map(|(_, p)| {
                    proc_kib(&format!("/proc/{}/smaps_rollup", p.child.id()), "Pss").unwrap_or(0)
                })
                .sum(),
        }
    }

    /// The custody objects (acks, for an agent) every agent has sent, and the groups they
    /// left in, summed: from each node's status, or each process's admin socket.
    async fn sent(&self, dir: &Path, ids: &[AgentId]) -> Result<(u64, u64), Error> {
        let (mut objects, mut groups) = (0, 0);
        match self {
            Self::Here(nodes) => {
                for (_, n) in nodes {
                    let sent = n.status().await?.sent;
                    objects += sent.objects;
                    groups += sent.groups;
                }
            }
            Self::Processes(_) => {
                for a in ids {
                    let reply = admin::request(&admin_target(dir, a), Request::Status)
                        .await
                        .map_err(|e| format!("{a}'s status: {e}"))?;
                    let field = |name: &str| {
                        reply["status"][name]
                            .as_u64()
                            .ok_or_else(|| format!("{a}'s status has no {name}: {reply}"))
                    };
                    objects += field("sent_objects")?;
                    groups += field("sent_groups")?;
                }
            }
        }
        Ok((objects, groups))
    }

    /// Stops every agent: a node here by its shutdown, a process by SIGTERM (all signalled
    /// first, then awaited). A process that had already exited is an error: it died mid-run.
    async fn stop(self) -> Result<(), Error> {
        match self {
            Self::Here(nodes) => {
                for (_, n) in nodes {
                    n.shutdown().await;
                }
                Ok(())
            }
            Self::Processes(mut procs) => {
                let died = exited(&mut procs);
                let pids: Vec<String> = procs
                    .iter()
                    .map(|(_, p)| p.child.id().to_string())
                    .collect();
                let _ = Command::new("kill").arg("-TERM").args(&pids).status();
                for (_, p) in &mut procs {
                    let _ = p.child.wait();
                }
                died
            }
        }
    }
}

/// Starts one `abhyasa node` process per agent (certificates, configs, states and logs under
/// `dir`), each meeting the principal at `relay` or listening for it to dial, and waits until
/// each answers on its admin socket.
async fn spawn_agents(
    exe: &Path,
    ca: &Ca,
    ids: &[AgentId],
    dir: &Path,
    relay: Option<SocketAddr>,
) -> Result<Vec<(SocketAddr, Proc)>, Error> {
    ca.save(dir)?;
    let relays = relay
        .map(|addr| format!("\n[[relays]]\nurl = \"moqt://{addr}\"\npeers = [\"principal\"]\n"))
        .unwrap_or_default();
    let mut procs = Vec::with_capacity(ids.len());
    for a in ids {
        ca.issue(a)?.save(dir)?;
        let listen = crate::free_addr()?;
        let config = dir.join(format!("{a}.toml"));
        std::fs::write(
            &config,
            format!(
                "agent = \"{a}\"\nlisten = \"{listen}\"\ncerts = \"{}\"\nstate = \"{}\"\n\n[limits]\nstore_cache_bytes = {}\n{relays}",
                dir.display(),
                dir.join(a.as_str()).display(),
                STORE_CACHE_BYTES,
            ),
        )?;
        procs.push((
            listen,
            Proc::start(exe, &config, &dir.join(format!("{a}.log")))?,
        ));
    }
    let ready = Instant::now() + Duration::from_secs(120);
    for a in ids {
        let target = admin_target(dir, a);
        while admin::request(&target, Request::Status).await.is_err() {
            exited(&mut procs)?;
            if Instant::now() > ready {
                return Err(format!("{a} did not answer on its admin socket within 120 s").into());
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
    Ok(procs)
}

/// The admin socket of agent `a`'s process, whose state is under `dir`.
fn admin_target(dir: &Path, a: &AgentId) -> AdminTarget {
    AdminTarget {
        admin: AdminAddr::Unix(dir.join(a.as_str()).join(admin::SOCKET_FILE)),
        admin_token: None,
    }
}

/// An error naming the first agent process that has exited, with the end of its log.
fn exited(procs: &mut [(SocketAddr, Proc)]) -> Result<(), Error> {
    for (_, p) in procs.iter_mut() {
        if let Some(status) = p.child.try_wait()? {
            let log = std::fs::read_to_string(&p.log).unwrap_or_default();
            let tail: Vec<&str> = log.lines().rev().take(5).collect();
            return Err(format!(
                "an agent process exited ({status}); the end of {}:\n{}",
                p.log.display(),
                tail.into_iter().rev().collect::<Vec<_>>().join("\n")
            )
            .into());
        }
    }
    Ok(())
}

/// Runs the sweep: every agent count directly, then (with the relay binary) through the relay.
pub async fn fanout(s: &FanoutSweep) -> Result<Vec<FanoutPoint>, Error> {
    let mut points = Vec::new();
    let modes: Vec<Option<&Path>> = s
        .direct
        .then_some(None)
        .into_iter()
        .chain(s.relay.as_deref().map(Some))
        .collect();
    for relay in modes {
        for &n in &s.agents {
            let p = point(s, n, relay).await?;
            eprintln!(
                "fanout: {}{} agents={} connect={:.1}s {:.0}/s p50={:.1}ms p99={:.1}ms {:.0} KiB/node acks/group={:.2} not_applied={}",
                p.mode, if p.processes { " (agents as processes)" } else { "" }, p.agents, p.connect_s, p.per_s, p.p50_ms, p.p99_ms, p.kib_per_node, p.acks_per_group, p.not_applied
            );
            points.push(p);
        }
    }
    if s.relay.is_none() {
        eprintln!("fanout: SKIPPED the relay points: no moq-relay binary (scripts/moq-relay.sh)");
    }
    Ok(points)
}

/// The sweep as CSV.
pub fn fanout_csv(points: &[FanoutPoint]) -> String {
    let mut out = String::from(
        "mode,agents,obligations,not_applied,connect_s,per_s,p50_ms,p99_ms,kib_per_node,acks_per_group,agents_as\n",
    );
    for p in points {
        let _ = writeln!(
            out,
            "{},{},{},{},{:.2},{:.0},{:.2},{:.2},{:.0},{:.2},{}",
            p.mode,
            p.agents,
            p.obligations,
            p.not_applied,
            p.connect_s,
            p.per_s,
            p.p50_ms,
            p.p99_ms,
            p.kib_per_node,
            p.acks_per_group,
            if p.processes { "processes" } else { "threads" }
        );
    }
    out
}

/// Runs the sweep and writes `fanout.csv`, `fanout.svg` (obligations/s) and
/// `fanout-latency.svg` (p50, p99) under `out`.
pub async fn fanout_to(s: &FanoutSweep, out: &Path) -> Result<Vec<FanoutPoint>, Error> {
    let points = fanout(s).await?;
    write(out, "fanout.csv", &fanout_csv(&points))?;
    let line = |mode: &str, label: String, y: fn(&FanoutPoint) -> f64| Series {
        label,
        points: points
            .iter()
            .filter(|p| p.mode == mode)
            .map(|p| (p.agents as f64, y(p)))
            .collect(),
    };
    let modes: Vec<&str> = ["direct", "relay"]
        .into_iter()
        .filter(|m| points.iter().any(|p| p.mode == *m))
        .collect();
    let name = |m: &str| match s.processes {
        Some(_) => format!("{m}, agents as processes"),
        None => m.to_string(),
    };
    plot(
        &out.join("fanout.svg"),
        &Axes {
            title: "One principal, N agents: durable obligations per second",
            x: "agents",
            y: "obligations/s",
            log_x: true,
        },
        &modes
            .iter()
            .map(|m| line(m, name(m), |p| p.per_s))
            .collect::<Vec<_>>(),
    )?;
    let mut latency = Vec::new();
    for m in &modes {
        latency.push(line(m, format!("{} p50", name(m)), |p| p.p50_ms));
        latency.push(line(m, format!("{} p99", name(m)), |p| p.p99_ms));
    }
    plot(
        &out.join("fanout-latency.svg"),
        &Axes {
            title: "One principal, N agents: issue to applied",
            x: "agents",
            y: "ms",
            log_x: true,
        },
        &latency,
    )?;
    Ok(points)
}
