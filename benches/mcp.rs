//! Custody over the MCP binding beside native MOQT, measured in one run, both ends durable
//! (each node commits to its own redb file): discharge of one obligation at a time (issue →
//! pending record → carried → applied and committed by the agent → ack → terminal record),
//! and 256 in flight (obligations/s). Paths: native MOQT tracks; MCP over an in-process
//! pipe (what a stdio server is, minus the process boundary); MCP over the stdio of a real
//! `abhyasa mcp --stdio` child process; MCP on streamable HTTP to a real `abhyasa mcp --http`
//! process; MCP over the nodes' QUIC endpoints in the MCP-over-MOQT layout. No impairment:
//! the cost of the binding itself.

use std::sync::Arc;
use std::time::{Duration, Instant};

use abhyasa::custody::CustodianConfig;
use abhyasa::moq::Ca;
use abhyasa::node::Node;
use abhyasa::wire::{AgentId, Outcome};
use abhyasa_mcp::{
    connect_command, connect_quic, connect_url, serve_quic, AgentServer, PrincipalClient,
};
use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use rmcp::ServiceExt as _;

mod common;
use common::obligation;

const BATCH: u64 = 256;

/// What keeps a path's MCP pieces alive while it is measured.
type Keep = Option<(
    PrincipalClient,
    rmcp::service::RunningService<rmcp::RoleClient, ()>,
    Option<tokio::process::Child>,
)>;

fn free_port(udp: bool) -> u16 {
    if udp {
        std::net::UdpSocket::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port()
    } else {
        std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port()
    }
}

/// Certificates and a config for an `abhyasa mcp` agent process in `dir`, made with the CLI.
fn agent_process_config(dir: &std::path::Path) -> std::path::PathBuf {
    let certs = dir.join("certs");
    let certs = certs.to_str().unwrap();
    for args in [
        vec!["certs", "init", "--dir", certs],
        vec!["certs", "issue", "agent-1", "--dir", certs],
    ] {
        let ok = std::process::Command::new(env!("CARGO_BIN_EXE_abhyasa"))
            .args(&args)
            .output()
            .unwrap()
            .status
            .success();
        assert!(ok, "abhyasa {args:?}");
    }
    let cfg = dir.join("agent.toml");
    std::fs::write(
        &cfg,
        format!(
            "agent = \"agent-1\"\nlisten = \"127.0.0.1:{}\"\ncerts = \"{certs}\"\nstate = \"{}\"\n\n[mcp]\nprincipal = \"principal\"\n",
            free_port(true),
            dir.join("a").display(),
        ),
    )
    .unwrap();
    cfg
}

async fn pair(ca: &Ca, dir: &std::path::Path, path: &str) -> (Arc<Node>, Option<Node>, Keep) {
    let (p, a) = (
        AgentId::new("principal").unwrap(),
        AgentId::new("agent-1").unwrap(),
    );
    let in_process = !matches!(path, "mcp_stdio" | "mcp_http");
    let agent = match in_process {
        true => Some(
            Node::builder(ca.issue(&a).unwrap())
                .state_dir(dir.join("a"))
                .build()
                .await
                .unwrap(),
        ),
        false => None,
    };
    let agent_addr = agent.as_ref().map(|n| n.local_addr());
    let mut b = Node::builder(ca.issue(&p).unwrap())
        .state_dir(dir.join("p"))
        .custodian(CustodianConfig {
            response_timeout_ms: 2_000,
            ..CustodianConfig::default()
        });
    if path == "moqt" {
        b = b.peer(a.clone(), agent_addr.unwrap());
    }
    let principal = b.build().await.unwrap();
    let keep = match path {
        "mcp_pipe" => {
            let (x, y) = tokio::io::duplex(1 << 20);
            let (xr, xw) = tokio::io::split(x);
            let (yr, yw) = tokio::io::split(y);
            let server = AgentServer::new(agent.clone().unwrap(), p.clone());
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
            Some((client, service, None))
        }
        "mcp_quic" => {
            tokio::spawn(serve_quic(agent.clone().unwrap(), vec![]));
            let (client, service) =
                connect_quic(&principal, &a, agent_addr.unwrap(), Duration::ZERO)
                    .await
                    .unwrap();
            Some((client, service, None))
        }
        "mcp_stdio" => {
            let cfg = agent_process_config(dir);
            let command = [
                env!("CARGO_BIN_EXE_abhyasa"),
                "mcp",
                "--config",
                cfg.to_str().unwrap(),
                "--stdio",
            ]
            .map(String::from);
            let (client, service, child) =
                connect_command(&principal, &a, &command, Duration::ZERO)
                    .await
                    .unwrap();
            Some((client, service, Some(child)))
        }
        "mcp_http" => {
            use tokio::io::AsyncBufReadExt as _;
            let cfg = agent_process_config(dir);
            let addr = format!("127.0.0.1:{}", free_port(false));
            let mut child = tokio::process::Command::new(env!("CARGO_BIN_EXE_abhyasa"))
                .args(["mcp", "--config", cfg.to_str().unwrap(), "--http", &addr])
                .stdout(std::process::Stdio::piped())
                .stderr(std::process::Stdio::null())
                .kill_on_drop(true)
                .spawn()
                .unwrap();
            // It says where once it listens.
            let mut line = String::new();
            tokio::io::BufReader::new(child.stdout.take().unwrap())
                .read_line(&mut line)
                .await
                .unwrap();
            assert!(line.starts_with("MCP on http://"), "{line}");
            let token = std::fs::read_to_string(dir.join("a").join("mcp.token")).unwrap();
            let (client, service) = connect_url(
                &principal,
                &a,
                &format!("http://{addr}/mcp"),
                Some(token.trim()),
                Duration::ZERO,
            )
            .await
            .unwrap();
            Some((client, service, Some(child)))
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
    for path in ["moqt", "mcp_pipe", "mcp_stdio", "mcp_http", "mcp_quic"] {
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
            if let Some(agent) = agent {
                agent.shutdown().await;
            }
        });
    }
}

criterion_group!(benches, mcp);
criterion_main!(benches);
