//! Discharge of one obligation at a time beside its physical floor, in one run (issue #13):
//! a raw 4 KiB append + `fdatasync`, one redb `Durability::Immediate` commit, a loopback QUIC
//! round trip, and discharge between two nodes on loopback (both ends durable) with the
//! group-commit writer lingering 500 µs for company (the old default) and committing at once
//! (the new one). Custody puts three durable commits and one round trip on the critical path.

use std::io::Write;
use std::time::{Duration, Instant};

use abhyasa::custody::CustodianConfig;
use abhyasa::moq::{endpoint, Ca, TransportSettings};
use abhyasa::node::Node;
use abhyasa::store::GroupConfig;
use abhyasa::wire::{AgentId, Outcome};
use criterion::{criterion_group, criterion_main, Criterion};

mod common;
use common::obligation;

fn floor(c: &mut Criterion) {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let mut g = c.benchmark_group("discharge_floor");
    g.sample_size(20)
        .warm_up_time(Duration::from_secs(1))
        .measurement_time(Duration::from_secs(4));
    let dir = tempfile::tempdir_in(std::env::current_dir().unwrap()).unwrap();

    // A raw append of 4 KiB and fdatasync.
    let mut f = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(dir.path().join("raw.log"))
        .unwrap();
    let block = vec![7u8; 4096];
    g.bench_function("append_4k_fdatasync", |b| {
        b.iter(|| {
            f.write_all(&block).unwrap();
            f.sync_data().unwrap();
        })
    });

    // One redb commit with one row, Durability::Immediate (redb's default).
    let db = redb::Database::create(dir.path().join("floor.redb")).unwrap();
    let table: redb::TableDefinition<'_, u64, &[u8]> = redb::TableDefinition::new("t");
    let mut k = 0u64;
    g.bench_function("redb_immediate_commit", |b| {
        b.iter(|| {
            k += 1;
            let tx = db.begin_write().unwrap();
            tx.open_table(table)
                .unwrap()
                .insert(k, &block[..256])
                .unwrap();
            tx.commit().unwrap();
        })
    });

    // A loopback QUIC round trip on an open connection (1 byte on a new stream and back),
    // with the same certificates and settings as the nodes.
    let ca = Ca::generate("bench").unwrap();
    let (p, a) = (
        AgentId::new("principal").unwrap(),
        AgentId::new("agent-1").unwrap(),
    );
    let conn = rt.block_on(async {
        let settings = TransportSettings::default();
        let server = endpoint(
            &ca.issue(&a).unwrap(),
            "127.0.0.1:0".parse().unwrap(),
            &settings,
        )
        .unwrap();
        let addr = server.local_addr().unwrap();
        tokio::spawn(async move {
            while let Some(incoming) = server.accept().await {
                tokio::spawn(async move {
                    let Ok(conn) = incoming.await else { return };
                    while let Ok((mut tx, mut rx)) = conn.accept_bi().await {
                        let mut byte = [0u8; 1];
                        if rx.read_exact(&mut byte).await.is_ok() {
                            let _ = tx.write_all(&byte).await;
                            let _ = tx.finish();
                        }
                    }
                });
            }
        });
        let client = endpoint(
            &ca.issue(&p).unwrap(),
            "127.0.0.1:0".parse().unwrap(),
            &settings,
        )
        .unwrap();
        client.connect(addr, a.as_str()).unwrap().await.unwrap()
    });
    g.bench_function("quic_loopback_round_trip", |b| {
        b.iter_custom(|iters| {
            rt.block_on(async {
                let start = Instant::now();
                for _ in 0..iters {
                    let (mut tx, mut rx) = conn.open_bi().await.unwrap();
                    tx.write_all(&[1]).await.unwrap();
                    let mut byte = [0u8; 1];
                    rx.read_exact(&mut byte).await.unwrap();
                }
                start.elapsed()
            })
        })
    });

    for (name, linger) in [
        ("discharge_group_linger_500us", Duration::from_micros(500)),
        ("discharge_group_at_once", Duration::ZERO),
    ] {
        let sub = tempfile::tempdir_in(dir.path()).unwrap();
        let group = GroupConfig {
            max_delay: linger,
            ..GroupConfig::default()
        };
        let (principal, agent) = rt.block_on(async {
            let agent = Node::builder(ca.issue(&a).unwrap())
                .state_dir(sub.path().join("a"))
                .group(group)
                .build()
                .await
                .unwrap();
            let principal = Node::builder(ca.issue(&p).unwrap())
                .peer(a.clone(), agent.local_addr())
                .state_dir(sub.path().join("p"))
                .group(group)
                .custodian(CustodianConfig::default())
                .build()
                .await
                .unwrap();
            let h = principal.issue(obligation(0, &a, 60_000)).await.unwrap();
            h.outcome().await.unwrap();
            (principal, agent)
        });
        let mut n = 1u128;
        g.bench_function(name, |b| {
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
    g.finish();
}

criterion_group!(benches, floor);
criterion_main!(benches);
