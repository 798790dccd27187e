//! The budget ledger, durable: reserve → dispatch → gateway acceptance → effect → receipt →
//! settle, every step committed to redb (`Durability::Immediate`) before what depends on it
//! is exposed, with N operations per commit (group commit); and the independent checker's
//! time on a large history.

use std::time::{Duration, Instant};

use abhyasa::ledger::check::{check, EffectInstance, World};
use abhyasa::ledger::*;
use abhyasa::store::{GroupCommit, GroupConfig, Op, Store, StoreConfig};
use abhyasa::wire::{AgentId, UnixMillis};
use criterion::{criterion_group, criterion_main, BatchSize, Criterion, Throughput};

fn id(s: &str) -> AgentId {
    AgentId::new(s).unwrap()
}

fn keys() -> Keyring {
    Keyring::new([
        (id("issuer"), signing_key([1; 32]).verifying_key()),
        (id("r"), signing_key([2; 32]).verifying_key()),
        (id("g"), signing_key([3; 32]).verifying_key()),
    ])
    .with_issuers([id("issuer")])
}

const CREDIT: CreditId = CreditId::from_u128(1);

fn setup() -> (Branch, Gateway) {
    setup_with(BranchConfig::default())
}

/// [`setup`] with another branch configuration.
fn setup_with(config: BranchConfig) -> (Branch, Gateway) {
    let (mut r, g) = unsettled_setup_with(config);
    while let Some((t, _)) = r.poll_persist() {
        r.handle_persisted(t);
    }
    (r, g)
}

/// A branch with its grant applied but not yet handed to a store.
fn unsettled_setup_with(config: BranchConfig) -> (Branch, Gateway) {
    let mut r = Branch::new(id("r"), signing_key([2; 32]), keys(), config);
    let g = Gateway::new(id("g"), signing_key([3; 32]), keys());
    let grant = RootGrant {
        root: RootId::from_u128(1),
        issuer: id("issuer"),
        holder: id("r"),
        budget: Vector::of(&[("cents", u64::MAX / 2), ("calls", u64::MAX / 2)]).unwrap(),
        label: Label::of(&["tools"]).unwrap(),
        issued_at: UnixMillis(0),
    };
    r.grant(
        Signed::sign(&grant, &id("issuer"), &signing_key([1; 32])),
        CREDIT,
    )
    .unwrap();
    (r, g)
}

fn effect(n: u64) -> Effect {
    Effect {
        purpose: Dim::new("tools").unwrap(),
        operation: format!("call-{n}"),
        max_charge: Vector::of(&[("cents", 1_000), ("calls", 3)]).unwrap(),
        carried_by: None,
    }
}

/// Drains a branch's steps into one commit, then releases what they gated.
fn commit_branch(r: &mut Branch, store: &mut Store) {
    let mut ops = Vec::new();
    let mut tokens = Vec::new();
    while let Some((t, s)) = r.poll_persist() {
        ops.push(Op::Ledger(s));
        tokens.push(t);
    }
    store.commit(&ops).unwrap();
    for t in tokens {
        r.handle_persisted(t);
    }
}

fn commit_gateway(g: &mut Gateway, store: &mut Store) {
    let mut ops = Vec::new();
    let mut tokens = Vec::new();
    while let Some((t, rec)) = g.poll_persist() {
        ops.push(Op::Gateway(rec));
        tokens.push(t);
    }
    store.commit(&ops).unwrap();
    for t in tokens {
        g.handle_persisted(t);
    }
}

/// `n` full cycles, four group commits (branch, gateway acceptance, gateway receipt, branch).
fn cycles(r: &mut Branch, g: &mut Gateway, bs: &mut Store, gs: &mut Store, next: &mut u64, n: u64) {
    for _ in 0..n {
        *next += 1;
        let key = OpKey::from_u128(u128::from(*next));
        r.reserve(UnixMillis(0), CREDIT, effect(*next), &id("g"), key)
            .unwrap();
        r.dispatch(UnixMillis(0), key).unwrap();
    }
    commit_branch(r, bs);
    while let Some((_, m)) = r.poll_transmit() {
        g.handle_message(UnixMillis(0), &id("r"), m);
    }
    commit_gateway(g, gs);
    let charge = Vector::of(&[("cents", 730), ("calls", 1)]).unwrap();
    while let Some(e) = g.poll_execute() {
        g.handle_executed(&e.payer, e.key, charge.clone());
    }
    commit_gateway(g, gs);
    while let Some((_, m)) = g.poll_transmit() {
        r.handle_message(UnixMillis(1), &id("g"), m);
    }
    commit_branch(r, bs);
    assert!(r.poll_event().is_some(), "settled");
    while r.poll_event().is_some() {}
}

/// One full cycle with every record "persisted" at once (no store); returns the effect.
fn in_memory_cycle(r: &mut Branch, g: &mut Gateway, n: u64) -> EffectInstance {
    let key = OpKey::from_u128(u128::from(n));
    r.reserve(UnixMillis(0), CREDIT, effect(n), &id("g"), key)
        .unwrap();
    r.dispatch(UnixMillis(0), key).unwrap();
    while let Some((t, _)) = r.poll_persist() {
        r.handle_persisted(t);
    }
    let (_, m) = r.poll_transmit().unwrap();
    g.handle_message(UnixMillis(0), &id("r"), m);
    while let Some((t, _)) = g.poll_persist() {
        g.handle_persisted(t);
    }
    let e = g.poll_execute().unwrap();
    let charge = Vector::of(&[("cents", 730), ("calls", 1)]).unwrap();
    g.handle_executed(&e.payer, e.key, charge.clone());
    while let Some((t, _)) = g.poll_persist() {
        g.handle_persisted(t);
    }
    let (_, m) = g.poll_transmit().unwrap();
    r.handle_message(UnixMillis(1), &id("g"), m);
    while let Some((t, _)) = r.poll_persist() {
        r.handle_persisted(t);
    }
    while r.poll_event().is_some() {}
    EffectInstance {
        gateway: id("g"),
        payer: e.payer,
        key,
        charge,
        expires: e.expires,
    }
}

fn durable_cycles(c: &mut Criterion) {
    let dir = tempfile::tempdir_in(std::env::current_dir().unwrap()).unwrap();
    let mut grp = c.benchmark_group("ledger_durable_cycle");
    grp.sample_size(10)
        .warm_up_time(Duration::from_millis(500))
        .measurement_time(Duration::from_secs(4));
    for batch in [1u64, 16, 256] {
        let (mut r, mut g) = setup();
        let mut bs = Store::open(
            dir.path().join(format!("b{batch}.redb")),
            StoreConfig::default(),
        )
        .unwrap();
        let mut gs = Store::open(
            dir.path().join(format!("g{batch}.redb")),
            StoreConfig::default(),
        )
        .unwrap();
        let mut next = 0;
        grp.throughput(Throughput::Elements(batch));
        grp.bench_function(
            format!("reserve_dispatch_accept_receipt_settle_{batch}_per_commit"),
            |b| b.iter(|| cycles(&mut r, &mut g, &mut bs, &mut gs, &mut next, batch)),
        );
    }
    // The same cycle with no store at all: the cost of signatures and bookkeeping alone.
    let (mut r, mut g) = setup();
    let mut next = 0u64;
    grp.throughput(Throughput::Elements(1));
    grp.bench_function("in_memory_cycle_no_store", |b| {
        b.iter(|| {
            next += 1;
            in_memory_cycle(&mut r, &mut g, next)
        })
    });
    grp.finish();
}

/// Most records one side commits at once in [`two_nodes`] (a group commit's cap).
const MAX_GROUP: usize = 256;

/// What a node of [`two_nodes`] is woken by: messages from the other node, or word that its
/// oldest outstanding commit is durable.
enum Wake {
    Messages(Vec<LedgerMessage>),
    Durable,
    Stop,
}

/// Where a node of [`two_nodes`] commits: on its own thread, waiting for each commit
/// (`Inline`), or — as `abhyasa node` does — through the group-commit writer thread
/// (`Writer`), going on with its work while a commit runs. Either way the node hears
/// [`Wake::Durable`] once per commit, in order, and only then releases what it gated.
enum Disk {
    Inline(Box<Store>),
    Writer(GroupCommit),
}

impl Disk {
    fn open(path: std::path::PathBuf, writer: bool) -> Self {
        let store = Store::open(&path, StoreConfig::default()).unwrap();
        match writer {
            false => Disk::Inline(Box::new(store)),
            true => Disk::Writer(GroupCommit::spawn(
                store,
                GroupConfig::default(),
                move || Store::open(&path, StoreConfig::default()),
            )),
        }
    }

    fn commit(&mut self, ops: Vec<Op>, wake: &std::sync::mpsc::Sender<Wake>) {
        match self {
            Disk::Inline(store) => {
                store.commit(&ops).unwrap();
                wake.send(Wake::Durable).unwrap();
            }
            Disk::Writer(w) => {
                let wake = wake.clone();
                w.submit_then(ops, move |outcome| {
                    outcome.expect("a benchmark commit");
                    let _ = wake.send(Wake::Durable);
                });
            }
        }
    }
}

/// Drains a branch's or gateway's steps into one commit; the tokens wait in `commits` for
/// their [`Wake::Durable`].
fn submit<S>(
    steps: impl Iterator<Item = (PersistToken, S)>,
    op: fn(S) -> Op,
    disk: &mut Disk,
    commits: &mut std::collections::VecDeque<Vec<PersistToken>>,
    wake: &std::sync::mpsc::Sender<Wake>,
) {
    let (tokens, ops): (Vec<_>, Vec<_>) = steps.map(|(t, s)| (t, op(s))).unzip();
    if !ops.is_empty() {
        commits.push_back(tokens);
        disk.commit(ops, wake);
    }
}

/// Blocks for what wakes a node (unless `busy`: it has work queued), then takes everything
/// else already there. Messages go to `inbox`; returns the commits now durable, and whether
/// to stop.
fn wake_up(
    rx: &std::sync::mpsc::Receiver<Wake>,
    busy: bool,
    inbox: &mut std::collections::VecDeque<LedgerMessage>,
) -> (usize, bool) {
    let first = if busy { None } else { rx.recv().ok() };
    let (mut durable, mut stop) = (0, false);
    for w in first
        .into_iter()
        .chain(std::iter::from_fn(|| rx.try_recv().ok()))
    {
        match w {
            Wake::Messages(m) => inbox.extend(m),
            Wake::Durable => durable += 1,
            Wake::Stop => stop = true,
        }
    }
    (durable, stop)
}

/// The gateway as its own node: a thread with its own store that takes every dispatch that
/// has arrived (at most [`MAX_GROUP`]) and commits the acceptances; once they are durable
/// runs the effects and commits the receipts; once those are durable sends them back.
fn gateway_node(
    disk: Disk,
    to_payer: std::sync::mpsc::Sender<Wake>,
    together: bool,
) -> (std::sync::mpsc::Sender<Wake>, std::thread::JoinHandle<()>) {
    let (wake, rx) = std::sync::mpsc::channel();
    let me = wake.clone();
    // Named, so a per-thread profile (`perf report --sort comm`) tells the nodes apart.
    let gateway = std::thread::Builder::new().name("gateway-node".into());
    let spawned = gateway.spawn(move || {
        let mut disk = disk;
        let mut g = Gateway::new(id("g"), signing_key([3; 32]), keys());
        let keyring = g.keyring().clone();
        let charge = Vector::of(&[("cents", 730), ("calls", 1)]).unwrap();
        let mut inbox = std::collections::VecDeque::new();
        let mut commits = std::collections::VecDeque::new();
        let flush = |g: &mut Gateway, disk: &mut Disk, commits: &mut _| {
            submit(
                std::iter::from_fn(|| g.poll_persist()),
                Op::Gateway,
                disk,
                commits,
                &me,
            )
        };
        loop {
            let (durable, stop) = wake_up(&rx, false, &mut inbox);
            if stop {
                return;
            }
            for tokens in commits.drain(..durable) {
                for t in tokens {
                    g.handle_persisted(t);
                }
            }
            while let Some(e) = g.poll_execute() {
                g.handle_executed(&e.payer, e.key, charge.clone());
            }
            let replies: Vec<_> =
                std::iter::from_fn(|| g.poll_transmit().map(|(_, m)| m)).collect();
            if !replies.is_empty() && to_payer.send(Wake::Messages(replies)).is_err() {
                return;
            }
            // Every dispatch that has arrived, in groups of at most MAX_GROUP, each group's
            // acceptances in one commit (the first with the receipts of the effects run
            // above); the receipts alone when no dispatch came.
            while !inbox.is_empty() {
                let n = inbox.len().min(MAX_GROUP);
                if together {
                    keyring.verify_together(inbox.iter().take(n));
                }
                for m in inbox.drain(..n) {
                    g.handle_message(UnixMillis(0), &id("r"), m);
                }
                flush(&mut g, &mut disk, &mut commits);
            }
            flush(&mut g, &mut disk, &mut commits);
        }
    });
    (wake, spawned.expect("a thread for the gateway node"))
}

/// The payer's side of [`two_nodes`]: keeps `in_flight` operations outstanding until `total`
/// have settled. Each round settles the receipts that have arrived (at most [`MAX_GROUP`])
/// and reserves and dispatches their replacements, committed together; the permits go out
/// once durable.
#[allow(clippy::too_many_arguments)]
fn pay(
    r: &mut Branch,
    disk: &mut Disk,
    (wake, rx): (
        &std::sync::mpsc::Sender<Wake>,
        &std::sync::mpsc::Receiver<Wake>,
    ),
    to_gateway: &std::sync::mpsc::Sender<Wake>,
    next: &mut u64,
    in_flight: u64,
    total: u64,
    together: bool,
) {
    let keyring = r.keyring().clone();
    let (mut started, mut settled, mut outstanding) = (0u64, 0u64, 0u64);
    let mut replies = std::collections::VecDeque::new();
    let mut commits = std::collections::VecDeque::new();
    while settled < total || !commits.is_empty() {
        let room = in_flight.saturating_sub(outstanding).min(total - started);
        for _ in 0..room.min(MAX_GROUP as u64) {
            *next += 1;
            let key = OpKey::from_u128(u128::from(*next));
            r.reserve(UnixMillis(0), CREDIT, effect(*next), &id("g"), key)
                .unwrap();
            r.dispatch(UnixMillis(0), key).unwrap();
            started += 1;
            outstanding += 1;
        }
        submit(
            std::iter::from_fn(|| r.poll_persist()),
            Op::Ledger,
            disk,
            &mut commits,
            wake,
        );
        let (durable, _) = wake_up(rx, !replies.is_empty(), &mut replies);
        for tokens in commits.drain(..durable) {
            for t in tokens {
                r.handle_persisted(t);
            }
        }
        let permits: Vec<_> = std::iter::from_fn(|| r.poll_transmit().map(|(_, m)| m)).collect();
        if !permits.is_empty() {
            to_gateway.send(Wake::Messages(permits)).unwrap();
        }
        let n = replies.len().min(MAX_GROUP);
        if together {
            keyring.verify_together(replies.iter().take(n));
        }
        for m in replies.drain(..n) {
            r.handle_message(UnixMillis(1), &id("g"), m);
        }
        // The settle steps are committed with the next round's dispatches.
        while let Some(e) = r.poll_event() {
            if matches!(e, LedgerEvent::Settled { .. }) {
                settled += 1;
                outstanding -= 1;
            }
        }
    }
}

/// Payer and gateway as two nodes on two threads — as deployed, each agent its own process —
/// each with its own store and group commit, so one signs and verifies while the other does:
/// `in_flight` operations outstanding, cycles/s over `per_iteration` settled cycles. Each side
/// verifies the signatures of what it takes at once one by one as it handles them, or
/// (`_together`) in one batch first; and commits on its own thread, or (`_writer`) through
/// the group-commit writer thread as `abhyasa node` does.
fn two_nodes(c: &mut Criterion) {
    let dir = tempfile::tempdir_in(std::env::current_dir().unwrap()).unwrap();
    let mut grp = c.benchmark_group("ledger_two_nodes");
    grp.sample_size(10)
        .warm_up_time(Duration::from_millis(500))
        .measurement_time(Duration::from_secs(5));
    let runs = [
        (1u64, false, false),
        (16, false, false),
        (256, false, false),
        (256, true, false),
        (256, true, true),
        (1024, false, false),
        (1024, true, false),
        (1024, true, true),
    ];
    for (in_flight, together, writer) in runs {
        let name = format!(
            "in_flight_{in_flight}{}{}",
            if together { "_together" } else { "" },
            if writer { "_writer" } else { "" }
        );
        let (wake, rx) = std::sync::mpsc::channel();
        let (to_gateway, gateway) = gateway_node(
            Disk::open(dir.path().join(format!("g-{name}.redb")), writer),
            wake.clone(),
            together,
        );
        let (mut r, _) = setup();
        let mut disk = Disk::open(dir.path().join(format!("b-{name}.redb")), writer);
        let mut next = 0;
        let per_iteration = (in_flight * 4).max(16);
        grp.throughput(Throughput::Elements(per_iteration));
        grp.bench_function(name, |b| {
            b.iter_custom(|iterations| {
                let started = Instant::now();
                pay(
                    &mut r,
                    &mut disk,
                    (&wake, &rx),
                    &to_gateway,
                    &mut next,
                    in_flight,
                    iterations * per_iteration,
                    together,
                );
                started.elapsed()
            })
        });
        to_gateway.send(Wake::Stop).unwrap();
        gateway.join().unwrap();
    }
    grp.finish();
}

/// A permit and the receipt that answers it, as a cycle makes them.
fn permit_and_receipt() -> (Signed<Permit>, Signed<Receipt>) {
    let (mut r, mut g) = setup();
    let key = OpKey::from_u128(1);
    r.reserve(UnixMillis(0), CREDIT, effect(1), &id("g"), key)
        .unwrap();
    r.dispatch(UnixMillis(0), key).unwrap();
    while let Some((t, _)) = r.poll_persist() {
        r.handle_persisted(t);
    }
    let Some((_, LedgerMessage::Dispatch { permit, effect })) = r.poll_transmit() else {
        panic!("no dispatch")
    };
    g.handle_message(
        UnixMillis(0),
        &id("r"),
        LedgerMessage::Dispatch {
            permit: permit.clone(),
            effect,
        },
    );
    while let Some((t, _)) = g.poll_persist() {
        g.handle_persisted(t);
    }
    let e = g.poll_execute().unwrap();
    g.handle_executed(
        &e.payer,
        e.key,
        Vector::of(&[("cents", 730), ("calls", 1)]).unwrap(),
    );
    while let Some((t, _)) = g.poll_persist() {
        g.handle_persisted(t);
    }
    let Some((_, LedgerMessage::Receipt(receipt))) = g.poll_transmit() else {
        panic!("no receipt")
    };
    (permit, receipt)
}

/// The cryptography a cycle cannot avoid, measured beside the cycles: the payer signs a
/// permit and verifies a receipt, the gateway verifies the permit and signs the receipt
/// (each with its encoding, and on opening the strict decode a branch or gateway does).
fn signature_floor(c: &mut Criterion) {
    let mut grp = c.benchmark_group("ledger_signature_floor");
    grp.sample_size(20)
        .warm_up_time(Duration::from_millis(300))
        .measurement_time(Duration::from_secs(2));
    let (permit, receipt) = permit_and_receipt();
    let (payer, gateway) = (signing_key([2; 32]), signing_key([3; 32]));
    let (permit_body, receipt_body) = (permit.peek().unwrap(), receipt.peek().unwrap());
    grp.bench_function("sign_a_permit", |b| {
        b.iter(|| Signed::sign(&permit_body, &id("r"), &payer))
    });
    grp.bench_function("verify_a_permit", |b| {
        b.iter(|| permit.open(&payer.verifying_key()).unwrap())
    });
    grp.bench_function("sign_a_receipt", |b| {
        b.iter(|| Signed::sign(&receipt_body, &id("g"), &gateway))
    });
    grp.bench_function("verify_a_receipt", |b| {
        b.iter(|| receipt.open(&gateway.verifying_key()).unwrap())
    });
    // The same signature check, 64 receipts from one gateway in one batch (per receipt:
    // divide by 64). Only the signatures: what `verify_together` adds to the decode.
    let v = receipt.to_verify();
    let signature = v.signature.unwrap();
    grp.bench_function("verify_64_receipt_signatures_together", |b| {
        b.iter(|| {
            let mut batch = abhyasa_wire::sig::Batch::new();
            for _ in 0..64 {
                batch.push(&gateway.verifying_key(), &v.message, &signature);
            }
            assert!(batch.verify_all().into_iter().all(|ok| ok));
        })
    });
    grp.finish();
}

fn checker(c: &mut Criterion) {
    let mut grp = c.benchmark_group("ledger_checker");
    grp.sample_size(10)
        .warm_up_time(Duration::from_millis(500))
        .measurement_time(Duration::from_secs(4));
    for history in [1_000u64, 10_000] {
        // Built when the benchmark runs (not when a filter leaves it out).
        let mut built = None;
        let k = keys();
        grp.throughput(Throughput::Elements(history));
        grp.bench_function(format!("check_{history}_settled_operations"), |b| {
            let (r, g, effects) = built.get_or_insert_with(|| {
                // No checkpoint: every settled operation stays whole for the checker to read.
                let (mut r, mut g) = setup_with(never_checkpoint());
                let mut effects = Vec::new();
                let started = Instant::now();
                for n in 1..=history {
                    effects.push(in_memory_cycle(&mut r, &mut g, n));
                }
                eprintln!(
                    "built a history of {history} settled operations in {:?}",
                    started.elapsed()
                );
                (r, g, effects)
            });
            let (r, g, effects) = (&*r, &*g, &*effects);
            b.iter_batched(
                || (),
                |_| {
                    let found = check(&World {
                        branches: &[r],
                        gateways: &[g],
                        effects,
                        keys: &k,
                    });
                    assert!(found.is_empty(), "{found:?}");
                },
                BatchSize::SmallInput,
            )
        });
    }
    grp.finish();
}

/// One checkpoint when it falls due: a branch whose history holds `ended` ended operations
/// folds the `ended / 6` settled since its last checkpoint (a cycle is three journal steps,
/// and the default rule checkpoints once the journal holds half as many steps as the state
/// has rows). Only the checkpoint is timed; the cycles before it run in memory.
fn checkpoint_cost(c: &mut Criterion) {
    let mut grp = c.benchmark_group("ledger_checkpoint");
    grp.sample_size(10)
        .sampling_mode(criterion::SamplingMode::Flat)
        .warm_up_time(Duration::from_millis(100))
        .measurement_time(Duration::from_secs(1));
    for ended in [5_000u64, 20_000, 80_000] {
        let cycles = |r: &mut Branch, g: &mut Gateway, next: &mut u64, n: u64| {
            for _ in 0..n {
                *next += 1;
                in_memory_cycle(r, g, *next);
            }
        };
        // Built when the benchmark runs (not when a filter leaves it out).
        let mut built = None;
        grp.bench_function(format!("fold_{}_into_{ended}_ended", ended / 6), |b| {
            let (r, g, next) = built.get_or_insert_with(|| {
                let (mut r, mut g) = setup_with(never_checkpoint());
                let mut next = 0;
                cycles(&mut r, &mut g, &mut next, ended);
                r.checkpoint().unwrap();
                while let Some((t, _)) = r.poll_persist() {
                    r.handle_persisted(t);
                }
                (r, g, next)
            });
            b.iter_custom(|iterations| {
                let mut timed = Duration::ZERO;
                for _ in 0..iterations {
                    cycles(r, g, next, ended / 6);
                    let started = Instant::now();
                    r.checkpoint().unwrap();
                    timed += started.elapsed();
                    while let Some((t, _)) = r.poll_persist() {
                        r.handle_persisted(t);
                    }
                }
                timed
            })
        });
    }
    grp.finish();
}

fn never_checkpoint() -> BranchConfig {
    BranchConfig {
        checkpoint_steps: 0,
        ..BranchConfig::default()
    }
}

/// Restart: open the store, read the branch's journal (or the gateway's log) and rebuild the
/// machine from it, every signature it relies on verified again with a fresh keyring (a new
/// process remembers no verification). Journals of 10,000 and 100,000 steps kept whole, and
/// the same histories compacted: one checkpoint standing for all of them (its signature
/// verified, every footprint re-validated).
fn restart(c: &mut Criterion) {
    let dir = tempfile::tempdir_in(std::env::current_dir().unwrap()).unwrap();
    let mut grp = c.benchmark_group("ledger_restart");
    grp.sample_size(10)
        .warm_up_time(Duration::from_millis(500))
        .measurement_time(Duration::from_secs(8));
    for steps in [10_000u64, 100_000] {
        let (bp, gp, cp, gcp) = (
            dir.path().join(format!("rb{steps}.redb")),
            dir.path().join(format!("rg{steps}.redb")),
            dir.path().join(format!("rc{steps}.redb")),
            dir.path().join(format!("rgc{steps}.redb")),
        );
        // Built when the first of its benchmarks runs (not when a filter leaves them out).
        let built = std::cell::OnceCell::new();
        let build = || {
            let (mut r, mut g) = unsettled_setup_with(never_checkpoint());
            let mut bs = Store::open(&bp, StoreConfig::default()).unwrap();
            let mut gs = Store::open(&gp, StoreConfig::default()).unwrap();
            commit_branch(&mut r, &mut bs); // The grant.
            let mut next = 0;
            let started = Instant::now();
            // A grant, then three steps per cycle (reserve, dispatch, settle).
            while r.journal_len() < steps {
                let left = (steps - r.journal_len()).div_ceil(3).min(256);
                cycles(&mut r, &mut g, &mut bs, &mut gs, &mut next, left);
            }
            eprintln!(
                "built a journal of {} steps and a gateway log of {} records in {:?}",
                bs.ledger_journal().unwrap().len(),
                gs.gateway_log().unwrap().len(),
                started.elapsed()
            );
            // The same history compacted, in a store of its own.
            r.checkpoint().unwrap();
            let mut cs = Store::open(&cp, StoreConfig::default()).unwrap();
            commit_branch(&mut r, &mut cs);
            eprintln!(
                "its checkpoint: {} bytes of redb file",
                std::fs::metadata(&cp).unwrap().len()
            );
            // And the gateway's log, compacted likewise.
            g.checkpoint();
            let mut gcs = Store::open(&gcp, StoreConfig::default()).unwrap();
            let records: Vec<Op> =
                std::iter::from_fn(|| g.poll_persist().map(|(_, r)| Op::Gateway(r))).collect();
            gcs.commit(&records).unwrap();
        };
        grp.throughput(Throughput::Elements(steps));
        grp.bench_function(format!("branch_from_{steps}_journal_steps"), |b| {
            built.get_or_init(build);
            b.iter(|| {
                let store = Store::open(&bp, StoreConfig::default()).unwrap();
                let journal = store.ledger_journal().unwrap();
                let (r, rejected) = Branch::recover(
                    id("r"),
                    signing_key([2; 32]),
                    keys(),
                    BranchConfig::default(),
                    journal,
                );
                assert!(rejected.is_empty(), "{:?}", rejected.first());
                r.journal_len()
            })
        });
        grp.bench_function(format!("branch_from_a_checkpoint_of_{steps}_steps"), |b| {
            built.get_or_init(build);
            b.iter(|| {
                let store = Store::open(&cp, StoreConfig::default()).unwrap();
                let journal = store.ledger_journal().unwrap();
                assert_eq!(journal.len(), 1);
                let (r, rejected) = Branch::recover(
                    id("r"),
                    signing_key([2; 32]),
                    keys(),
                    BranchConfig::default(),
                    journal,
                );
                assert!(rejected.is_empty(), "{:?}", rejected.first());
                assert!(r.folded_steps() >= steps);
                r.folded_steps()
            })
        });
        grp.bench_function(format!("gateway_from_the_same_run_{steps}"), |b| {
            built.get_or_init(build);
            b.iter(|| {
                let store = Store::open(&gp, StoreConfig::default()).unwrap();
                let log = store.gateway_log().unwrap();
                let n = log.len();
                let _g = Gateway::recover(id("g"), signing_key([3; 32]), keys(), log);
                n
            })
        });
        grp.bench_function(
            format!("gateway_from_a_checkpoint_of_the_same_run_{steps}"),
            |b| {
                built.get_or_init(build);
                b.iter(|| {
                    let store = Store::open(&gcp, StoreConfig::default()).unwrap();
                    let log = store.gateway_log().unwrap();
                    assert_eq!(log.len(), 1);
                    let g = Gateway::recover_checked(id("g"), signing_key([3; 32]), keys(), log)
                        .unwrap();
                    g.folded_records()
                })
            },
        );
    }
    grp.finish();
}

criterion_group!(
    benches,
    durable_cycles,
    two_nodes,
    signature_floor,
    checker,
    checkpoint_cost,
    restart
);
criterion_main!(benches);
