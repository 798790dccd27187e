//! Discharge of one obligation at a time beside its physical floor, in one run (issue #13):
//! a raw 4 KiB append + `fdatasync`, one redb `Durability::Immediate` commit, a loopback QUIC
//! round trip, and discharge between two nodes on loopback (both ends durable) with the
//! group-commit writer lingering 500 µs for company (the old default) and committing at once
//! (the new one). Custody puts three durable commits and one round trip on the critical path.

use std::io::Write;
use std::time::{Duration, Instant};

use abhyasa::custody::CustodianConfig;
use abhyasa::moq::{endpoint, Ca, SignedKind, Signer, TransportSettings, Verifier};
use abhyasa::node::Node;
use abhyasa::store::GroupConfig;
use abhyasa::wire::{AgentId, Outcome};
use criterion::{criterion_group, criterion_main, Criterion};

mod common;
use common::{obligation, Writers};

/// A principal and its agent on loopback, both durable under `dir`, after one obligation has
/// gone through (sessions up).
async fn pair(
    ca: &Ca,
    p: &AgentId,
    a: &AgentId,
    dir: &std::path::Path,
    group: GroupConfig,
) -> (Node, Node) {
    let agent = Node::builder(ca.issue(a).unwrap())
        .state_dir(dir.join("a"))
        .group(group)
        .build()
        .await
        .unwrap();
    let principal = Node::builder(ca.issue(p).unwrap())
        .peer(a.clone(), agent.local_addr())
        .state_dir(dir.join("p"))
        .group(group)
        .custodian(CustodianConfig::default())
        .build()
        .await
        .unwrap();
    let h = principal.issue(obligation(0, a, 60_000)).await.unwrap();
    h.outcome().await.unwrap();
    (principal, agent)
}

/// `iters` obligations, each issued and awaited to `applied` before the next.
async fn one_at_a_time(
    principal: &Node,
    a: &AgentId,
    n: &mut u128,
    iters: u64,
    each: &mut Vec<Duration>,
) -> Duration {
    let start = Instant::now();
    for _ in 0..iters {
        *n += 1;
        let one = Instant::now();
        let h = principal.issue(obligation(*n, a, 60_000)).await.unwrap();
        let (record, _) = h.outcome().await.unwrap();
        each.push(one.elapsed());
        assert_eq!(record.outcome, Outcome::Applied);
    }
    start.elapsed()
}

/// The median and 99th percentile of every discharge timed (warm-up included).
fn percentiles(name: &str, each: &mut [Duration]) {
    each.sort_unstable();
    let at = |q: f64| each[((each.len() - 1) as f64 * q).round() as usize];
    if !each.is_empty() {
        println!(
            "{name}: {} discharges one at a time, p50 {:.3} ms, p99 {:.3} ms",
            each.len(),
            at(0.5).as_secs_f64() * 1e3,
            at(0.99).as_secs_f64() * 1e3
        );
    }
}

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

    // End-to-end signatures (issue #15): what each obligation and each ack costs its sender
    // (sign) and its receiver (verify, the certificate already validated once and cached;
    // and a first sight of a certificate, validated against the CA).
    let signer = Signer::new(&ca.issue(&p).unwrap()).unwrap();
    let cbor = abhyasa::wire::encode(&obligation(1, &a, 60_000));
    let signed = signer.sign(SignedKind::Obligation, &cbor);
    let verifier = Verifier::new(ca.certificate().clone());
    g.bench_function("sign_obligation", |b| {
        b.iter(|| signer.sign(SignedKind::Obligation, &cbor))
    });
    g.bench_function("verify_obligation_cached_certificate", |b| {
        b.iter(|| verifier.open(SignedKind::Obligation, &signed).unwrap())
    });
    // A group's worth from one sender, as a session's task verifies what arrived together
    // (per obligation: divide by 64).
    let group: Vec<Vec<u8>> = (0..64)
        .map(|i| {
            let cbor = abhyasa::wire::encode(&obligation(i, &a, 60_000));
            signer.sign(SignedKind::Obligation, &cbor)
        })
        .collect();
    g.bench_function("verify_64_obligations_together_cached_certificate", |b| {
        b.iter(|| {
            let opened =
                verifier.open_all(group.iter().map(|s| (SignedKind::Obligation, s.as_slice())));
            assert!(opened.iter().all(Result::is_ok));
        })
    });
    // The same 64 signed as one group: one signature over their Merkle root, each envelope
    // with its inclusion proof (issue 41); signing them, and opening them together.
    let cbors: Vec<Vec<u8>> = (0..64)
        .map(|i| abhyasa::wire::encode(&obligation(i, &a, 60_000)))
        .collect();
    g.bench_function("sign_64_obligations_one_by_one", |b| {
        b.iter(|| {
            cbors
                .iter()
                .map(|c| signer.sign(SignedKind::Obligation, c))
                .collect::<Vec<_>>()
        })
    });
    g.bench_function("sign_64_obligations_as_one_group", |b| {
        b.iter(|| signer.sign_group(SignedKind::Obligation, &cbors))
    });
    let grouped = signer.sign_group(SignedKind::Obligation, &cbors);
    g.bench_function("verify_64_group_signed_obligations_together", |b| {
        b.iter(|| {
            let opened = verifier.open_all(
                grouped
                    .iter()
                    .map(|s| (SignedKind::Obligation, s.as_slice())),
            );
            assert!(opened.iter().all(Result::is_ok));
        })
    });
    g.bench_function("verify_obligation_first_sight", |b| {
        b.iter(|| {
            Verifier::new(ca.certificate().clone())
                .open(SignedKind::Obligation, &signed)
                .unwrap()
        })
    });
    println!(
        "signed obligation: {} bytes of CBOR, {} bytes signed ({} bytes as one of a group of 64)",
        cbor.len(),
        signed.len(),
        grouped[0].len()
    );

    for (name, linger) in [
        ("discharge_group_linger_500us", Duration::from_micros(500)),
        ("discharge_group_at_once", Duration::ZERO),
    ] {
        let sub = tempfile::tempdir_in(dir.path()).unwrap();
        let group = GroupConfig {
            max_delay: linger,
            ..GroupConfig::default()
        };
        let (principal, agent) = rt.block_on(pair(&ca, &p, &a, sub.path(), group));
        let mut n = 1u128;
        let mut each = Vec::new();
        let before = rt.block_on(Writers::read(&principal, &agent));
        g.bench_function(name, |b| {
            b.iter_custom(|iters| {
                rt.block_on(one_at_a_time(&principal, &a, &mut n, iters, &mut each))
            })
        });
        let after = rt.block_on(Writers::read(&principal, &agent));
        percentiles(name, &mut each);
        // The commits the discharges made, as both writers timed them: three per discharge
        // (two at the principal, one at the agent), and the mean — the floor's commit as
        // this workload's own tables and disk pay it, beside the empty commit above.
        before.report(&after, name, each.len() as u64);
        rt.block_on(async {
            principal.shutdown().await;
            agent.shutdown().await;
        });
    }
    g.finish();
}

/// The `nats-server` binary: `$ABHYASA_NATS_SERVER`, the one `scripts/nats-server.sh`
/// installs, or `nats-server` on `PATH`.
fn nats_server() -> Option<std::path::PathBuf> {
    let installed = std::env::var_os("ABHYASA_CACHE")
        .map(std::path::PathBuf::from)
        .or_else(|| {
            std::env::var_os("HOME").map(|h| std::path::Path::new(&h).join(".cache/abhyasa"))
        })
        .map(|c| c.join("nats-server-2.15.1/bin/nats-server"));
    let on_path = std::env::var_os("PATH").and_then(|paths| {
        std::env::split_paths(&paths)
            .map(|d| d.join("nats-server"))
            .find(|p| p.is_file())
    });
    std::env::var_os("ABHYASA_NATS_SERVER")
        .map(std::path::PathBuf::from)
        .into_iter()
        .chain(installed)
        .chain(on_path)
        .find(|p| p.is_file())
}

/// Publishes one message to the stream and waits for its acknowledgement (stored, synced).
async fn publish_acked(js: &async_nats::jetstream::Context, payload: &bytes::Bytes) {
    js.publish("to.agent-1", payload.clone())
        .await
        .unwrap()
        .await
        .unwrap();
}

/// The same run, side by side: custody between two Abhyasa nodes, and NATS JetStream (file
/// storage, `sync_interval: always`: every write synced before it is acknowledged) with the
/// `async-nats` client, on the same disk and loopback, carrying the same encoded obligation.
/// One at a time: custody's issue → applied → discharged, against JetStream's publish →
/// acknowledged, and publish → acknowledged → pulled by a consumer → acknowledged back with
/// confirmation (`double_ack`). 256 in flight: the same, 256 at once, all awaited.
fn jetstream(c: &mut Criterion) {
    let Some(server) = nats_server() else {
        eprintln!(
            "SKIPPED jetstream_side_by_side: no nats-server (run scripts/nats-server.sh, or set \
             ABHYASA_NATS_SERVER)"
        );
        return;
    };
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let dir = tempfile::tempdir_in(std::env::current_dir().unwrap()).unwrap();
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let config = dir.path().join("nats.conf");
    std::fs::write(
        &config,
        format!(
            "listen: 127.0.0.1:{port}\njetstream {{\n  store_dir: \"{}\"\n  sync_interval: always\n}}\n",
            dir.path().join("js").display()
        ),
    )
    .unwrap();
    let mut child = std::process::Command::new(&server)
        .arg("-c")
        .arg(&config)
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let url = format!("nats://127.0.0.1:{port}");

    let mut g = c.benchmark_group("jetstream_side_by_side");
    g.sample_size(20)
        .warm_up_time(Duration::from_secs(1))
        .measurement_time(Duration::from_secs(4));

    // Abhyasa: two nodes, both ends durable.
    let ca = Ca::generate("bench").unwrap();
    let (p, a) = (
        AgentId::new("principal").unwrap(),
        AgentId::new("agent-1").unwrap(),
    );
    let (principal, agent) = rt.block_on(pair(&ca, &p, &a, dir.path(), GroupConfig::default()));
    let mut n = 1u128;
    let mut each = Vec::new();
    g.bench_function("abhyasa_discharge_one", |b| {
        b.iter_custom(|iters| rt.block_on(one_at_a_time(&principal, &a, &mut n, iters, &mut each)))
    });
    percentiles("abhyasa_discharge_one", &mut each);
    g.bench_function("abhyasa_discharge_256_in_flight", |b| {
        b.iter_custom(|iters| {
            rt.block_on(async {
                let start = Instant::now();
                for _ in 0..iters {
                    let batch: Vec<_> = (0..256)
                        .map(|_| {
                            n += 1;
                            principal.issue(obligation(n, &a, 60_000))
                        })
                        .collect();
                    let handles = futures::future::join_all(batch).await;
                    let outcomes = futures::future::join_all(
                        handles.into_iter().map(|h| h.unwrap().outcome()),
                    )
                    .await;
                    for o in outcomes {
                        assert_eq!(o.unwrap().0.outcome, Outcome::Applied);
                    }
                }
                start.elapsed()
            })
        })
    });
    rt.block_on(async {
        principal.shutdown().await;
        agent.shutdown().await;
    });

    // JetStream: one stream on file storage, one durable pull consumer with explicit acks.
    use async_nats::jetstream::{self, consumer, stream};
    use futures::StreamExt;
    let payload = bytes::Bytes::from(abhyasa::wire::encode(&obligation(0, &a, 60_000)));
    let (js, mut messages) = rt.block_on(async {
        let mut client = None;
        for _ in 0..100 {
            match async_nats::connect(&url).await {
                Ok(c) => {
                    client = Some(c);
                    break;
                }
                Err(_) => tokio::time::sleep(Duration::from_millis(50)).await,
            }
        }
        let js = jetstream::new(client.expect("nats-server did not come up"));
        let s = js
            .get_or_create_stream(stream::Config {
                name: "OBLIGATIONS".into(),
                subjects: vec!["to.>".into()],
                storage: stream::StorageType::File,
                ..Default::default()
            })
            .await
            .unwrap();
        let worker: consumer::PullConsumer = s
            .get_or_create_consumer(
                "agent-1",
                consumer::pull::Config {
                    durable_name: Some("agent-1".into()),
                    ack_policy: consumer::AckPolicy::Explicit,
                    ..Default::default()
                },
            )
            .await
            .unwrap();
        let messages = worker.messages().await.unwrap();
        (js, messages)
    });
    g.bench_function("jetstream_publish_acked_one", |b| {
        b.iter_custom(|iters| {
            rt.block_on(async {
                let start = Instant::now();
                for _ in 0..iters {
                    publish_acked(&js, &payload).await;
                }
                let elapsed = start.elapsed();
                // Drain what the consumer was handed, outside the timing.
                for _ in 0..iters {
                    let m = messages.next().await.unwrap().unwrap();
                    m.double_ack().await.unwrap();
                }
                elapsed
            })
        })
    });
    g.bench_function("jetstream_end_to_end_one", |b| {
        b.iter_custom(|iters| {
            rt.block_on(async {
                let start = Instant::now();
                for _ in 0..iters {
                    publish_acked(&js, &payload).await;
                    let m = messages.next().await.unwrap().unwrap();
                    assert_eq!(m.payload, payload);
                    m.double_ack().await.unwrap();
                }
                start.elapsed()
            })
        })
    });
    g.bench_function("jetstream_end_to_end_256_in_flight", |b| {
        b.iter_custom(|iters| {
            rt.block_on(async {
                let start = Instant::now();
                for _ in 0..iters {
                    let mut acks = Vec::with_capacity(256);
                    for _ in 0..256 {
                        acks.push(js.publish("to.agent-1", payload.clone()).await.unwrap());
                    }
                    for a in futures::future::join_all(
                        acks.into_iter().map(std::future::IntoFuture::into_future),
                    )
                    .await
                    {
                        a.unwrap();
                    }
                    let mut got = Vec::with_capacity(256);
                    for _ in 0..256 {
                        got.push(messages.next().await.unwrap().unwrap());
                    }
                    for r in futures::future::join_all(got.iter().map(|m| m.double_ack())).await {
                        r.unwrap();
                    }
                }
                start.elapsed()
            })
        })
    });
    g.finish();
    drop(messages);
    let _ = child.kill();
    let _ = child.wait();
}

criterion_group!(benches, floor, jetstream);
criterion_main!(benches);
