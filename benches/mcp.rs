//! Custody over the MCP binding beside native MOQT, measured in one run, both ends durable
//! (each node commits to its own redb file): discharge of one obligation at a time (issue →
//! pending record → carried → applied and committed by the agent → ack → terminal record),
//! and 256 in flight (obligations/s). Paths: native MOQT tracks; MCP over an in-process
//! pipe (what a stdio server is, minus the process boundary); MCP over the nodes' QUIC
//! endpoints in the MCP-over-MOQT layout. No impairment: the cost of the binding itself.

use std::sync::Arc;
use std::time::{Duration, Instant};

use abhyasa::custody::CustodianConfig;
use abhyasa::moq::Ca;
use abhyasa::node::Node;
use abhyasa::wire::{AgentId, Outcome};
use abhyasa_mcp::{connect_quic, serve_quic, AgentServer, PrincipalClient};
use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use rmcp::ServiceExt as _;

mod common;
use common::obligation;

const BATCH: u64 = 256;

/// What keeps a path's MCP pieces alive while it is measured.
type Keep = Option<(
    PrincipalClient,
    rmcp::service::RunningService<rmcp::RoleClient, ()>,
)>;

async fn pair(ca: &Ca, dir: &std::path::Path, path: &str) -> (Arc<Node>, Node, Keep) {
    let (p, a) = (
        AgentId::new("principal").unwrap(),
        AgentId::new("agent-1").unwrap(),
    );
    let agent = Node::builder(ca.issue(&a).unwrap())
        .state_dir(dir.join("a"))
        .build()
        .await
        .unwrap();
    let mut b = Node::builder(ca.issue(&p).unwrap())
        .state_dir(dir.join("p"))
        .custodian(CustodianConfig {
            response_timeout_ms: 2_000,
            ..CustodianConfig::default()
        });
    if path == "moqt" {
        b = b.peer(a.clone(), agent.local_addr());
    }
    let principal = b.build().await.unwrap();
    let keep = match path {
        "mcp_pipe" => {
            let (x, y) = tokio::io::duplex(1 << 20);
            let (xr, xw) = tokio::io::split(x);
            let (yr, yw) = tokio::io::split(y);
            let server = AgentServer::new(agent.clone(), p.clone());
            tokio::spawn(async move {
                if let Ok(r) = server.serve((xr, xw)).await {
                    let _ = r.waiting().await;
                }
            });
            let service = ().serve((yr, yw)).await.unwrap();
            let client = PrincipalClient::attach(
                principal.clone(),
                a.clone(),
                service.peer().clone(),
                Duration::ZERO,
            )
            .await
            .unwrap();
            Some((client, service))
        }
        "mcp_quic" => {
            tokio::spawn(serve_quic(agent.clone(), vec![]));
            let (client, service) =
                connect_quic(&principal, &a, agent.local_addr(), Duration::ZERO)
                    .await
                    .unwrap();
            Some((client, service))
        }
        _ => None,
    };
    // One obligation end to end before measuring.
    let h = principal.issue(obligation(0, &a, 120_000)).await.unwrap();
    assert_eq!(h.outcome().await.unwrap().0.outcome, Outcome::Applied);
    (Arc::new(principal), agent, keep)
}

fn mcp(c: &mut Criterion) {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let ca = Ca::generate("bench").unwrap();
    let a = AgentId::new("agent-1").unwrap();
    let mut n = 1u128;
    for path in ["moqt", "mcp_pipe", "mcp_quic"] {
        let dir = tempfile::tempdir_in(std::env::current_dir().unwrap()).unwrap();
        let (principal, agent, keep) = rt.block_on(pair(&ca, dir.path(), path));
        {
            let mut g = c.benchmark_group("binding_discharge_one");
            g.sample_size(30)
                .warm_up_time(Duration::from_secs(1))
                .measurement_time(Duration::from_secs(5));
            g.bench_function(path, |b| {
                b.iter_custom(|iters| {
                    rt.block_on(async {
                        let start = Instant::now();
                        for _ in 0..iters {
                            n += 1;
                            let h = principal.issue(obligation(n, &a, 120_000)).await.unwrap();
                            assert_eq!(h.outcome().await.unwrap().0.outcome, Outcome::Applied);
                        }
                        start.elapsed()
                    })
                })
            });
        }
        {
            let mut g = c.benchmark_group("binding_in_flight_256");
            g.sample_size(10)
                .warm_up_time(Duration::from_secs(1))
                .measurement_time(Duration::from_secs(6))
                .throughput(Throughput::Elements(BATCH));
            g.bench_function(path, |b| {
                b.iter_custom(|iters| {
                    rt.block_on(async {
                        let start = Instant::now();
                        for _ in 0..iters {
                            let mut tasks = Vec::new();
                            for _ in 0..BATCH {
                                n += 1;
                                let (principal, o) =
                                    (principal.clone(), obligation(n, &a, 120_000));
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
                    })
                })
            });
        }
        rt.block_on(async {
            drop(keep);
            if let Ok(p) = Arc::try_unwrap(principal) {
                p.shutdown().await;
            }
            agent.shutdown().await;
        });
    }
}

criterion_group!(benches, mcp);
criterion_main!(benches);
