//! Time to discharge one obligation over QUIC through the in-process netem emulator, durable
//! on both ends (each node commits to its own redb file with `Durability::Immediate`): issue →
//! pending record committed → sent on a subgroup stream → applied and committed by the agent →
//! ack → terminal record committed. 10 ms each way (20 ms RTT), at several loss rates, with
//! the first attempt on a stream (the default) and as a datagram (retries on streams).

use std::time::{Duration, Instant};

use abhyasa::custody::{Channel, CustodianConfig};
use abhyasa::moq::Ca;
use abhyasa::node::Node;
use abhyasa::wire::{AgentId, Outcome};
use criterion::{criterion_group, criterion_main, Criterion};

mod common;
use common::obligation;

fn discharge(c: &mut Criterion) {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let mut g = c.benchmark_group("discharge_one_obligation_20ms_rtt");
    g.sample_size(10)
        .warm_up_time(Duration::from_secs(1))
        .measurement_time(Duration::from_secs(6));
    let ca = Ca::generate("bench").unwrap();
    let (p, a) = (
        AgentId::new("principal").unwrap(),
        AgentId::new("agent-1").unwrap(),
    );
    for (channel, first) in [("stream", Channel::Stream), ("datagram", Channel::Datagram)] {
        for (name, loss) in [
            ("loss_0", ""),
            ("loss_1", "loss 1%"),
            ("loss_5", "loss 5%"),
            ("loss_10", "loss 10%"),
            ("loss_20", "loss 20%"),
            ("bursty_gemodel_2_25", "loss gemodel 2% 25%"),
        ] {
            let spec = format!("delay 10ms {loss}");
            let dir = tempfile::tempdir_in(std::env::current_dir().unwrap()).unwrap();
            let (principal, agent) = rt.block_on(async {
                let agent = Node::builder(ca.issue(&a).unwrap())
                    .state_dir(dir.path().join("a"))
                    .impair(spec.parse().unwrap(), 1)
                    .build()
                    .await
                    .unwrap();
                let principal = Node::builder(ca.issue(&p).unwrap())
                    .peer(a.clone(), agent.local_addr())
                    .state_dir(dir.path().join("p"))
                    .custodian(CustodianConfig {
                        response_timeout_ms: 100,
                        backoff_base_ms: 20,
                        backoff_cap_ms: 200,
                        first_attempt: first,
                        ..CustodianConfig::default()
                    })
                    .impair(spec.parse().unwrap(), 2)
                    .build()
                    .await
                    .unwrap();
                // Wait for the session before measuring.
                let h = principal.issue(obligation(0, &a, 60_000)).await.unwrap();
                h.outcome().await.unwrap();
                (principal, agent)
            });
            let mut n = 1u128;
            g.bench_function(format!("{channel}/{name}"), |b| {
                b.iter_custom(|iters| {
                    rt.block_on(async {
                        let start = Instant::now();
                        for _ in 0..iters {
                            n += 1;
                            let h = principal.issue(obligation(n, &a, 60_000)).await.unwrap();
                            let (record, _) = h.outcome().await.unwrap();
                            assert_eq!(record.outcome, Outcome::Applied);
                        }
                        start.elapsed()
                    })
                })
            });
            rt.block_on(async {
                principal.shutdown().await;
                agent.shutdown().await;
            });
        }
    }
    g.finish();
}

criterion_group!(benches, discharge);
criterion_main!(benches);
