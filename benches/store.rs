//! Durable custody persistence per obligation: one `Durability::Immediate` commit per
//! obligation, group commit at several batch sizes, and `Durability::None` as the best-effort
//! baseline; raw fsync latency of the same disk in the same run for reference; and recovery
//! time with a large terminal history (which recovery must not read).

use std::hint::black_box;
use std::io::Write;
use std::time::{Duration, Instant};

use abhyasa_custody::{Custodian, CustodianConfig, CustodianRecord, ReceiverRecord};
use abhyasa_store::{Op, Store, StoreConfig};
use abhyasa_wire::{
    AckStatus, AgentId, BeliefUpdatePayload, ClientId, CustodyAck, Obligation, ObligationId,
    Payload, TokenAction, TokenId, TokenPayload, UnixMillis, WeightDelta, WeightKey,
};
use criterion::{criterion_group, criterion_main, BatchSize, Criterion, Throughput};
use redb::Durability;

/// A custodian configuration without the admission limits: the benches hold more pending
/// obligations and principal entries than a node would admit.
fn unbounded() -> CustodianConfig {
    CustodianConfig {
        max_pending: usize::MAX,
        max_principal_entries: usize::MAX,
        ..CustodianConfig::default()
    }
}

fn obligation(id: u128) -> Obligation {
    Obligation {
        id: ObligationId::from_u128(id),
        issuer: AgentId::new("principal").unwrap(),
        target: AgentId::new("agent-1").unwrap(),
        created_at: UnixMillis(0),
        deadline: UnixMillis(60_000),
        max_retries: 12,
        sequence: None,
        payload: Payload::OauthToken(TokenPayload {
            action: TokenAction::Revoke,
            token_id: TokenId::new(format!("tok-{id}")).unwrap(),
            client_id: ClientId::new("mail-client").unwrap(),
            expires_at: None,
        }),
    }
}

/// The pending record an issue hands out: what custody must make durable before sending.
fn pending_op(c: &mut Custodian, id: u128) -> Op {
    c.issue(UnixMillis(0), obligation(id)).unwrap();
    let p = c.poll_persist().unwrap();
    assert!(matches!(p.record, CustodianRecord::Pending { .. }));
    Op::Custodian(p.record)
}

fn fresh_store(dir: &tempfile::TempDir, name: &str) -> Store {
    Store::open(dir.path().join(name), StoreConfig::default()).unwrap()
}

fn persistence(c: &mut Criterion) {
    let dir = tempfile::tempdir_in(std::env::current_dir().unwrap()).unwrap();
    let mut g = c.benchmark_group("durable_write_per_obligation");
    g.sample_size(10)
        .warm_up_time(Duration::from_millis(500))
        .measurement_time(Duration::from_secs(3));

    // Raw fsync of a 4 KiB write on the same file system, for reference.
    g.throughput(Throughput::Elements(1));
    g.bench_function("raw_fsync_4k", |b| {
        let mut f = std::fs::File::create(dir.path().join("fsync.bin")).unwrap();
        let page = [7u8; 4096];
        b.iter(|| {
            f.write_all(&page).unwrap();
            f.sync_data().unwrap();
        })
    });

    let mut custodian = Custodian::new(AgentId::new("principal").unwrap(), unbounded(), 1);
    let mut next = 0u128;
    let mut id = || {
        next += 1;
        next
    };

    let mut store = fresh_store(&dir, "single.redb");
    g.bench_function("commit_per_obligation_immediate", |b| {
        b.iter_batched(
            || pending_op(&mut custodian, id()),
            |op| store.commit(black_box(&[op])).unwrap(),
            BatchSize::SmallInput,
        )
    });

    let mut store = fresh_store(&dir, "none.redb");
    g.bench_function("commit_per_obligation_durability_none", |b| {
        b.iter_batched(
            || pending_op(&mut custodian, id()),
            |op| {
                store
                    .commit_with(black_box(&[op]), Durability::None)
                    .unwrap()
            },
            BatchSize::SmallInput,
        )
    });

    for batch in [16u64, 64, 256, 1024] {
        let mut store = fresh_store(&dir, &format!("group-{batch}.redb"));
        g.throughput(Throughput::Elements(batch));
        g.bench_function(format!("group_commit_{batch}"), |b| {
            b.iter_batched(
                || {
                    (0..batch)
                        .map(|_| pending_op(&mut custodian, id()))
                        .collect::<Vec<_>>()
                },
                |ops| store.commit(black_box(&ops)).unwrap(),
                BatchSize::SmallInput,
            )
        });
    }
    g.finish();
}

fn recovery(c: &mut Criterion) {
    let dir = tempfile::tempdir_in(std::env::current_dir().unwrap()).unwrap();
    let mut g = c.benchmark_group("recovery");
    g.sample_size(10)
        .warm_up_time(Duration::from_millis(500))
        .measurement_time(Duration::from_secs(3));
    let p = AgentId::new("principal").unwrap();
    // 1,000 pending, with and without 100,000 terminal records beside them.
    for terminal in [0u128, 100_000] {
        let path = dir.path().join(format!("recover-{terminal}.redb"));
        let mut store = Store::open(&path, StoreConfig::default()).unwrap();
        let mut c = Custodian::new(p.clone(), unbounded(), 1);
        let started = Instant::now();
        // Terminal history that leaves principal state alone: corrective belief updates the
        // target applied (no withhold at issue, no safe action).
        let target = AgentId::new("agent-1").unwrap();
        for chunk in 0..(terminal / 10_000) {
            let mut ops = Vec::new();
            for i in 0..10_000u128 {
                let id = 1_000_000 + chunk * 10_000 + i;
                let mut o = obligation(id);
                o.payload = Payload::PhalaBeliefUpdate(BeliefUpdatePayload {
                    weight_key: WeightKey::new(format!("w{id}")).unwrap(),
                    weight_delta: WeightDelta(-1),
                    ttl_ms: 1,
                });
                c.issue(UnixMillis(0), o).unwrap();
                c.handle_ack(
                    UnixMillis(1),
                    &target,
                    CustodyAck {
                        obligation_id: ObligationId::from_u128(id),
                        target: target.clone(),
                        status: AckStatus::Applied,
                        acked_at: UnixMillis(1),
                        detail: None,
                    },
                );
            }
            while let Some(r) = c.poll_persist() {
                ops.push(Op::Custodian(r.record));
            }
            store.commit(&ops).unwrap();
        }
        let mut ops = Vec::new();
        for i in 0..1_000u128 {
            ops.push(pending_op(&mut c, i));
        }
        store.commit(&ops).unwrap();
        eprintln!(
            "built a store with {terminal} terminal records in {:?}",
            started.elapsed()
        );
        drop(store);
        // Verified (every page's checksum read: the default) and trusted as redb finds it.
        for (how, verify) in [("", true), ("_unverified", false)] {
            let config = StoreConfig {
                verify_on_open: verify,
                ..StoreConfig::default()
            };
            g.bench_function(
                format!("open_and_recover_1k_pending_{terminal}_terminal{how}"),
                |b| {
                    b.iter(|| {
                        let store = Store::open(&path, config.clone()).unwrap();
                        let c = store
                            .recover_custodian(
                                p.clone(),
                                CustodianConfig::default(),
                                2,
                                UnixMillis(1),
                            )
                            .unwrap();
                        assert_eq!(c.pending_len(), 1_000);
                    })
                },
            );
        }
    }
    g.finish();
}

/// The writer's CPU per record, without the disk (`Durability::None`): 1,024 records of one
/// kind per commit, as the node's group commit hands them over under load — the issue's
/// pending record, the agent's apply (its applied id, sequence, governed-by row, apply log and
/// effect) and the discharge's terminal record.
fn writer_cpu(c: &mut Criterion) {
    const BATCH: u64 = 1_024;
    let dir = tempfile::tempdir_in(std::env::current_dir().unwrap()).unwrap();
    let mut g = c.benchmark_group("writer_cpu");
    g.sample_size(10)
        .warm_up_time(Duration::from_millis(500))
        .measurement_time(Duration::from_secs(3))
        .throughput(Throughput::Elements(BATCH));
    let (p, a) = (
        AgentId::new("principal").unwrap(),
        AgentId::new("agent-1").unwrap(),
    );
    let mut custodian = Custodian::new(p, unbounded(), 1);
    let mut next = 0u128;
    // One batch of each: the pending records, then the same obligations' terminal records.
    let mut cycle = move || {
        let (mut pending, mut terminal, mut applied) = (Vec::new(), Vec::new(), Vec::new());
        for _ in 0..BATCH {
            next += 1;
            let o = obligation(next);
            pending.push(pending_op(&mut custodian, next));
            custodian.handle_ack(
                UnixMillis(1),
                &a,
                CustodyAck {
                    obligation_id: o.id,
                    target: a.clone(),
                    status: AckStatus::Applied,
                    acked_at: UnixMillis(1),
                    detail: None,
                },
            );
            while let Some(r) = custodian.poll_persist() {
                terminal.push(Op::Custodian(r.record));
            }
            applied.push(Op::Receiver(ReceiverRecord::Apply {
                id: o.id,
                issuer: o.issuer.clone(),
                effect: abhyasa_custody::kinds::effect(&o).expect("a built-in kind has an effect"),
                obligation: Box::new(o),
                at: UnixMillis(1),
                expires: UnixMillis(120_000),
                sequence: None,
            }));
        }
        [pending, applied, terminal]
    };
    let mut store = fresh_store(&dir, "writer-cpu.redb");
    for (i, name) in ["pending", "apply", "terminal"].into_iter().enumerate() {
        g.bench_function(format!("{name}_{BATCH}"), |b| {
            b.iter_custom(|iters| {
                let mut timed = Duration::ZERO;
                for _ in 0..iters {
                    let all = cycle();
                    // The records before this kind's go in first, outside the timing.
                    for earlier in &all[..i] {
                        store.commit_with(earlier, Durability::None).unwrap();
                    }
                    let started = Instant::now();
                    store
                        .commit_with(black_box(&all[i]), Durability::None)
                        .unwrap();
                    timed += started.elapsed();
                }
                timed
            })
        });
    }
    g.finish();
}

criterion_group!(benches, persistence, recovery, writer_cpu);
criterion_main!(benches);
