//! Throughput with many obligations in flight over QUIC on loopback: custody (durable on both
//! ends, group commit, acks) against a best-effort baseline that sends the same encoded
//! objects on the same MOQT track layout with no custody, no acks and no durability. The
//! ratio of the two is the overhead of custody.

use std::sync::Arc;
use std::time::{Duration, Instant};

use abhyasa::custody::{CustodianConfig, ReceiverConfig};
use abhyasa::moq::{endpoint, Ca, Session, SessionEvent, SessionLimits, Track, TransportSettings};
use abhyasa::node::{Limits, Node};
use abhyasa::wire::{encode, AgentId, Outcome};
use criterion::{criterion_group, criterion_main, Criterion, Throughput};

mod common;
use common::{obligation, Writers};

#[cfg(feature = "mimalloc")]
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

const BATCH: u64 = 500;

/// The runtime every group here runs its nodes on: two workers, as the machine has cores.
fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap()
}

/// A group with this file's sampling: 10 samples of 8 s after 1 s of warm-up.
fn group<'a>(
    c: &'a mut Criterion,
    name: &str,
) -> criterion::BenchmarkGroup<'a, criterion::measurement::WallTime> {
    let mut g = c.benchmark_group(name);
    g.sample_size(10)
        .warm_up_time(Duration::from_secs(1))
        .measurement_time(Duration::from_secs(8));
    g
}

/// A principal and its agent on loopback, each with its own store, after one obligation
/// has gone through (sessions up).
fn nodes(
    rt: &tokio::runtime::Runtime,
    ca: &Ca,
    p: &AgentId,
    a: &AgentId,
    group: abhyasa::store::GroupConfig,
    per_group: usize,
) -> (Arc<Node>, Node, tempfile::TempDir) {
    let limits = Limits {
        session: SessionLimits {
            max_objects_per_group: per_group,
            ..SessionLimits::default()
        },
        ..Limits::default()
    };
    let dir = tempfile::tempdir_in(std::env::current_dir().unwrap()).unwrap();
    let (principal, agent) = rt.block_on(async {
        let agent = Node::builder(ca.issue(a).unwrap())
            .state_dir(dir.path().join("a"))
            .group(group)
            .limits(limits)
            // Every obligation revokes a token of its own, and one pair of nodes serves every
            // window size in turn: past the default 100,000 keys governed per issuer the
            // agent would (rightly) decline `over_limit`, a limit this bench does not measure.
            .receiver(ReceiverConfig {
                max_governed: 10_000_000,
                ..ReceiverConfig::default()
            })
            .build()
            .await
            .unwrap();
        let principal = Node::builder(ca.issue(p).unwrap())
            .peer(a.clone(), agent.local_addr())
            .state_dir(dir.path().join("p"))
            .group(group)
            .limits(limits)
            .custodian(CustodianConfig {
                response_timeout_ms: 2_000,
                ..CustodianConfig::default()
            })
            .build()
            .await
            .unwrap();
        let h = principal.issue(obligation(0, a, 120_000)).await.unwrap();
        h.outcome().await.unwrap();
        (Arc::new(principal), agent)
    });
    (principal, agent, dir)
}

/// `iters` times: `batch` obligations issued at once (each on its own task, to `targets` in
/// turn), every one awaited to `applied`.
async fn issue_and_await(
    principal: &Arc<Node>,
    targets: &[AgentId],
    n: &mut u128,
    iters: u64,
    batch: u64,
) -> Duration {
    let start = Instant::now();
    for _ in 0..iters {
        let mut tasks = Vec::new();
        for k in 0..batch {
            *n += 1;
            let target = &targets[k as usize % targets.len()];
            let (principal, o) = (principal.clone(), obligation(*n, target, 120_000));
            tasks.push(tokio::spawn(async move {
                let h = principal.issue(o).await.unwrap();
                h.outcome().await.unwrap().0.outcome
            }));
        }
        for t in tasks {
            assert_eq!(t.await.unwrap(), Outcome::Applied);
        }
    }
    start.elapsed()
}

/// Benchmarks `name`: `in_flight` obligations issued at once to `a`, each awaited to
/// `applied`.
/// Then prints what both store writers did during it (see [`Writers::report`]).
#[allow(clippy::too_many_arguments)]
fn bench_issue(
    g: &mut criterion::BenchmarkGroup<'_, criterion::measurement::WallTime>,
    name: &str,
    rt: &tokio::runtime::Runtime,
    principal: &Arc<Node>,
    agent: &Node,
    a: &AgentId,
    n: &mut u128,
    in_flight: u64,
) {
    let (before, first) = (rt.block_on(Writers::read(principal, agent)), *n);
    g.bench_function(name, |b| {
        b.iter_custom(|iters| {
            rt.block_on(issue_and_await(
                principal,
                std::slice::from_ref(a),
                n,
                iters,
                in_flight,
            ))
        })
    });
    let after = rt.block_on(Writers::read(principal, agent));
    before.report(&after, name, u64::try_from(*n - first).unwrap_or(u64::MAX));
}

async fn stop(principal: Arc<Node>, agent: Node) {
    if let Ok(p) = Arc::try_unwrap(principal) {
        p.shutdown().await;
    }
    agent.shutdown().await;
}

/// Custody throughput as the number in flight grows (issue #13 measured it falling past
/// 1,024): 256, 1,024 and 4,096 issued at once to one agent, each awaited to `applied` — the
/// nodes sending what is ready in groups of up to 64 objects (the default), and one object per
/// group (`objects_per_group = 1`, how a node sent before), in the same run.
fn window(c: &mut Criterion) {
    let rt = runtime();
    let mut g = group(c, "custody_in_flight");
    let ca = Ca::generate("bench").unwrap();
    let (p, a) = (
        AgentId::new("principal").unwrap(),
        AgentId::new("agent-1").unwrap(),
    );
    let mut n = 1u128;
    for (suffix, per_group) in [("", 64), ("_one_per_group", 1)] {
        let (principal, agent, _dir) = nodes(&rt, &ca, &p, &a, Default::default(), per_group);
        for in_flight in [256u64, 1_024, 4_096] {
            g.throughput(Throughput::Elements(in_flight));
            let name = format!("{in_flight}{suffix}");
            bench_issue(
                &mut g, &name, &rt, &principal, &agent, &a, &mut n, in_flight,
            );
        }
        rt.block_on(stop(principal, agent));
    }
    g.finish();
}

/// The same with the obligations spread over 10 and 100 agents (each its own node, store and
/// QUIC session, all in this process): 1,024 and 4,096 in flight, round robin.
fn targets(c: &mut Criterion) {
    let rt = runtime();
    let mut g = group(c, "custody_targets");
    let ca = Ca::generate("bench").unwrap();
    let p = AgentId::new("principal").unwrap();
    for agents in [10usize, 100] {
        let dir = tempfile::tempdir_in(std::env::current_dir().unwrap()).unwrap();
        let ids: Vec<AgentId> = (0..agents)
            .map(|i| AgentId::new(format!("agent-{i}")).unwrap())
            .collect();
        let (principal, nodes) = rt.block_on(async {
            let mut nodes = Vec::new();
            for id in &ids {
                nodes.push(
                    Node::builder(ca.issue(id).unwrap())
                        .state_dir(dir.path().join(id.as_str()))
                        .build()
                        .await
                        .unwrap(),
                );
            }
            let mut b = Node::builder(ca.issue(&p).unwrap())
                .state_dir(dir.path().join("p"))
                .custodian(CustodianConfig {
                    response_timeout_ms: 5_000,
                    ..CustodianConfig::default()
                });
            for (id, node) in ids.iter().zip(&nodes) {
                b = b.peer(id.clone(), node.local_addr());
            }
            let principal = Arc::new(b.build().await.unwrap());
            for (i, id) in ids.iter().enumerate() {
                let h = principal
                    .issue(obligation(i as u128, id, 120_000))
                    .await
                    .unwrap();
                assert_eq!(h.outcome().await.unwrap().0.outcome, Outcome::Applied);
            }
            (principal, nodes)
        });
        let mut n = 1_000u128;
        for in_flight in [1_024u64, 4_096] {
            g.throughput(Throughput::Elements(in_flight));
            g.bench_function(format!("{agents}_agents_{in_flight}_in_flight"), |b| {
                b.iter_custom(|iters| {
                    rt.block_on(issue_and_await(&principal, &ids, &mut n, iters, in_flight))
                })
            });
        }
        rt.block_on(async {
            if let Ok(p) = Arc::try_unwrap(principal) {
                p.shutdown().await;
            }
            for node in nodes {
                node.shutdown().await;
            }
        });
    }
    g.finish();
}

fn throughput(c: &mut Criterion) {
    let rt = runtime();
    let mut g = group(c, "obligations_in_flight_500");
    g.throughput(Throughput::Elements(BATCH));
    let ca = Ca::generate("bench").unwrap();
    let (p, a) = (
        AgentId::new("principal").unwrap(),
        AgentId::new("agent-1").unwrap(),
    );

    // Custody: 500 issued at once, each awaited to `applied` — with the group-commit writer
    // committing at once when idle (the default) and lingering 500 µs for company (the old
    // default), in the same run.
    let mut n = 1u128;
    for (name, linger) in [
        ("custody_durable", Duration::ZERO),
        ("custody_durable_linger_500us", Duration::from_micros(500)),
    ] {
        let group = abhyasa::store::GroupConfig {
            max_delay: linger,
            ..Default::default()
        };
        let (principal, agent, _dir) = nodes(&rt, &ca, &p, &a, group, 64);
        bench_issue(&mut g, name, &rt, &principal, &agent, &a, &mut n, BATCH);
        rt.block_on(stop(principal, agent));
    }

    // Best effort: the same objects on the same track, one group each, no custody.
    let (sender, mut events) = rt.block_on(async {
        let loopback = "127.0.0.1:0".parse().unwrap();
        let ea = endpoint(
            &ca.issue(&a).unwrap(),
            loopback,
            &TransportSettings::default(),
        )
        .unwrap();
        let ep = endpoint(
            &ca.issue(&p).unwrap(),
            loopback,
            &TransportSettings::default(),
        )
        .unwrap();
        let server = tokio::spawn({
            let (ea, a) = (ea.clone(), a.clone());
            async move {
                Session::accept(ea.accept().await.unwrap(), &a)
                    .await
                    .unwrap()
            }
        });
        let (sp, _rp) = Session::connect(&ep, ea.local_addr().unwrap(), &a, &p)
            .await
            .unwrap();
        let (_sa, ra) = server.await.unwrap();
        while !sp.is_subscribed(Track::Obligations) {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        (sp, ra)
    });
    // One object per group, each on its own task (how a node sent before 2026-12-02), and
    // groups of 64 (as custody now sends what is ready at once).
    for (name, per_group) in [
        ("best_effort_no_custody", 1),
        ("best_effort_groups_of_64", 64),
    ] {
        g.bench_function(name, |b| {
            b.iter_custom(|iters| {
                rt.block_on(async {
                    let start = Instant::now();
                    for _ in 0..iters {
                        let objects: Vec<Vec<u8>> = (0..BATCH)
                            .map(|_| {
                                n += 1;
                                encode(&obligation(n, &a, 120_000))
                            })
                            .collect();
                        let tasks: Vec<_> = objects
                            .chunks(per_group)
                            .map(|chunk| {
                                let (s, chunk) = (sender.clone(), chunk.to_vec());
                                tokio::spawn(async move {
                                    s.send_group(Track::Obligations, &chunk, false).await
                                })
                            })
                            .collect();
                        let mut got = 0;
                        while got < BATCH {
                            if let Some(SessionEvent::Object { .. }) = events.recv().await {
                                got += 1;
                            }
                        }
                        for t in tasks {
                            t.await.unwrap().unwrap();
                        }
                    }
                    start.elapsed()
                })
            })
        });
    }
    g.finish();
}

criterion_group!(benches, throughput, window, targets);
criterion_main!(benches);
