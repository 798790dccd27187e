use std::collections::BTreeMap;
use std::time::Duration;

use abhyasa_custody::{AckTransmit, CustodianEvent, Receiver, ReceiverConfig, ReceiverRecord};
use abhyasa_wire::{
    AckStatus, BeliefUpdatePayload, ClientId, ConsentDecision, ConsentPayload, EscalationCause,
    Obligation, Outcome, Payload, TokenAction, TokenPayload, WeightDelta,
};

use super::*;
use abhyasa_testkit::fault::{FaultPlan, FaultyBackend};

fn p() -> AgentId {
    AgentId::new("p").unwrap()
}

fn q() -> AgentId {
    AgentId::new("q").unwrap()
}

fn a() -> AgentId {
    AgentId::new("a").unwrap()
}

fn obligation(id: u128, payload: Payload) -> Obligation {
    Obligation {
        id: ObligationId::from_u128(id),
        issuer: p(),
        target: a(),
        created_at: UnixMillis(0),
        deadline: UnixMillis(1_000),
        max_retries: 3,
        sequence: Some(id as u64),
        payload,
    }
}

fn belief(id: u128, delta: i32) -> Obligation {
    obligation(
        id,
        Payload::PhalaBeliefUpdate(BeliefUpdatePayload {
            weight_key: WeightKey::new(format!("k{id}")).unwrap(),
            weight_delta: WeightDelta(delta),
            ttl_ms: 60_000,
        }),
    )
}

fn revoke_scope(id: u128) -> Obligation {
    obligation(
        id,
        Payload::AnumatiConsent(ConsentPayload {
            decision: Some(ConsentDecision::Revoke),
            scope: Scope::new(format!("s{id}")).unwrap(),
            expires_at: None,
        }),
    )
}

fn revoke_token(id: u128) -> Obligation {
    obligation(
        id,
        Payload::OauthToken(TokenPayload {
            action: TokenAction::Revoke,
            token_id: TokenId::new(format!("t{id}")).unwrap(),
            client_id: ClientId::new("c").unwrap(),
            expires_at: None,
        }),
    )
}

/// A revocation (or, with `issue`, an issue) of token `t{id}` that expires at `expires_at`.
fn token_until(id: u128, issue: bool, expires_at: Option<u64>) -> Obligation {
    obligation(
        id,
        Payload::OauthToken(TokenPayload {
            action: if issue {
                TokenAction::Issue
            } else {
                TokenAction::Revoke
            },
            token_id: TokenId::new(format!("t{id}")).unwrap(),
            client_id: ClientId::new("c").unwrap(),
            expires_at: expires_at.map(UnixMillis),
        }),
    )
}

fn memory_store() -> (Store, FaultyBackend) {
    let backend = FaultyBackend::new(FaultPlan::None);
    (
        Store::open_backend(backend.clone(), StoreConfig::default()).unwrap(),
        backend,
    )
}

/// Power-cycles the disk in place and opens a store on what survived.
fn reopen(backend: &mut FaultyBackend) -> Store {
    *backend = backend.power_cycle(FaultPlan::None);
    Store::open_backend(backend.clone(), StoreConfig::default()).unwrap()
}

/// Persists every record the custodian hands out, one commit each.
fn persist_custodian(c: &mut Custodian, store: &mut Store, now: u64) {
    while let Some(rec) = c.poll_persist() {
        store.commit(&[Op::Custodian(rec.record)]).unwrap();
        c.handle_persisted(UnixMillis(now), rec.token);
    }
}

fn persist_receiver(r: &mut Receiver, store: &mut Store) -> Vec<AckTransmit> {
    while let Some(rec) = r.poll_persist() {
        store.commit(&[Op::Receiver(rec.record)]).unwrap();
        r.handle_persisted(rec.token);
    }
    std::iter::from_fn(|| r.poll_transmit()).collect()
}

#[test]
fn custodian_state_survives_a_reopen() {
    let (mut store, mut backend) = memory_store();
    let cfg = CustodianConfig {
        response_timeout_ms: 100,
        backoff_base_ms: 50,
        ..CustodianConfig::default()
    };
    let mut c = Custodian::new(p(), cfg, 1);
    for o in [belief(1, -300_000), revoke_scope(2), revoke_token(3)] {
        c.issue(UnixMillis(0), o).unwrap();
    }
    persist_custodian(&mut c, &mut store, 0);
    // Retry once, so an attempt record is written.
    let t = c.poll_timeout().unwrap();
    c.handle_timeout(t);
    let t = c.poll_timeout().unwrap();
    c.handle_timeout(t);
    persist_custodian(&mut c, &mut store, t.0);
    let attempts: Vec<u32> = c.pending().map(|(_, n)| n).collect();
    drop(store);

    let store = reopen(&mut backend);
    let pending = store.pending().unwrap();
    assert_eq!(pending.len(), 3);
    assert_eq!(
        pending.iter().map(|p| p.attempts).collect::<Vec<_>>(),
        attempts
    );
    assert!(pending
        .iter()
        .all(|p| p.obligation.deadline == UnixMillis(1_000)));
    // The withholds at issue are durable with the pending records.
    assert!(store
        .principal()
        .is_withheld(&a(), &Scope::new("s2").unwrap()));
    assert!(store.principal().is_revoked(&TokenId::new("t3").unwrap()));
    assert_eq!(store.principal(), c.principal());

    // Recovered past the deadline: every one escalates at once, safe actions on disk.
    let mut store = store;
    let mut c = store
        .recover_custodian(p(), CustodianConfig::default(), 2, UnixMillis(5_000))
        .unwrap();
    c.handle_timeout(UnixMillis(5_000));
    persist_custodian(&mut c, &mut store, 5_000);
    assert!(store.pending().unwrap().is_empty());
    let escalations = store.escalations().unwrap();
    assert_eq!(escalations.len(), 3);
    assert!(escalations
        .iter()
        .all(|e| e.cause == EscalationCause::Deadline));
    drop(store);
    let store = reopen(&mut backend);
    for e in store.escalations().unwrap() {
        assert!(store.principal().holds(&e.safe_action), "{e:?}");
    }
    assert_eq!(store.terminal_records().unwrap().len(), 3);
    assert_eq!(
        store
            .principal()
            .routing_weight(&a(), &WeightKey::new("k1").unwrap(), UnixMillis(5_000)),
        700_000
    );
}

#[test]
fn an_apply_and_its_effect_are_one_commit_and_survive() {
    let (mut store, mut backend) = memory_store();
    let mut r = Receiver::new(a(), ReceiverConfig::default());
    r.handle_obligation(UnixMillis(0), &p(), belief(1, -250_000));
    r.handle_obligation(UnixMillis(0), &p(), revoke_scope(2));
    r.handle_obligation(UnixMillis(0), &p(), revoke_token(3));
    let acks = persist_receiver(&mut r, &mut store);
    assert_eq!(acks.len(), 3);
    drop(store);
    let store = reopen(&mut backend);
    let mut r = store
        .recover_receiver(a(), ReceiverConfig::default())
        .unwrap();
    for id in 1..=3 {
        assert!(store
            .applied(ObligationId::from_u128(id))
            .unwrap()
            .is_some());
    }
    assert_eq!(
        store
            .receiver_state()
            .weight(&p(), &WeightKey::new("k1").unwrap(), UnixMillis(10)),
        -250_000
    );
    assert!(store
        .receiver_state()
        .is_withheld(&p(), &Scope::new("s2").unwrap()));
    assert!(store
        .receiver_state()
        .is_dropped(&TokenId::new("t3").unwrap()));
    // A redelivery after the restart is re-acked, not re-applied.
    let d = r.handle_obligation(UnixMillis(10), &p(), belief(1, -250_000));
    assert_eq!(d, abhyasa_custody::Disposition::Duplicate);
    assert!(r.poll_persist().is_none());
    assert_eq!(
        r.poll_transmit().map(|t| t.ack.status),
        Some(AckStatus::Applied)
    );
    // Supersession survives too: sequence 2 on scope s2 is the last applied.
    let mut older = revoke_scope(4);
    older.sequence = Some(1);
    if let Payload::AnumatiConsent(c) = &mut older.payload {
        c.scope = Scope::new("s2").unwrap();
    }
    assert!(matches!(
        r.handle_obligation(UnixMillis(10), &p(), older),
        abhyasa_custody::Disposition::Declined(_)
    ));
}

#[test]
fn prune_removes_expired_applied_ids() {
    let (mut store, _) = memory_store();
    let mut r = Receiver::new(a(), ReceiverConfig::default());
    r.handle_obligation(UnixMillis(0), &p(), belief(1, -1));
    persist_receiver(&mut r, &mut store);
    assert_eq!(store.applied_len().unwrap(), 1);
    let expiry = r.poll_timeout().unwrap();
    r.handle_timeout(expiry);
    let rec = r.poll_persist().unwrap();
    assert!(matches!(rec.record, ReceiverRecord::Prune { .. }));
    store.commit(&[Op::Receiver(rec.record)]).unwrap();
    assert_eq!(store.applied_len().unwrap(), 0);
    // The effect stays: pruning forgets the id, not what it did.
    assert_eq!(
        store
            .receiver_state()
            .weight(&p(), &WeightKey::new("k1").unwrap(), expiry),
        -1
    );
}

#[test]
fn a_reconciliation_note_is_kept() {
    let (mut store, mut backend) = memory_store();
    let mut c = Custodian::new(p(), CustodianConfig::default(), 1);
    c.issue(UnixMillis(0), revoke_token(1)).unwrap();
    persist_custodian(&mut c, &mut store, 0);
    c.handle_timeout(UnixMillis(1_000));
    persist_custodian(&mut c, &mut store, 1_000);
    drop(store);
    let mut store = reopen(&mut backend);
    // The recovered custodian still recognizes the late ack.
    let mut c = store
        .recover_custodian(p(), CustodianConfig::default(), 2, UnixMillis(1_100))
        .unwrap();
    let ack = abhyasa_wire::CustodyAck {
        obligation_id: ObligationId::from_u128(1),
        target: a(),
        status: AckStatus::Applied,
        acked_at: UnixMillis(1_050),
        detail: None,
    };
    assert_eq!(
        c.handle_ack(UnixMillis(1_100), &a(), ack.clone()),
        abhyasa_custody::AckDisposition::Reconciled
    );
    persist_custodian(&mut c, &mut store, 1_100);
    let notes = store.notes().unwrap();
    assert_eq!(notes.len(), 1);
    assert!(matches!(
        c.poll_event(),
        Some(CustodianEvent::Reconciled(_))
    ));
    assert!(store.principal().is_revoked(&TokenId::new("t1").unwrap()));
    // After another restart the same late ack is not noted a second time.
    drop(store);
    let mut store = reopen(&mut backend);
    let mut c = store
        .recover_custodian(p(), CustodianConfig::default(), 3, UnixMillis(1_200))
        .unwrap();
    assert_eq!(
        c.handle_ack(UnixMillis(1_200), &a(), ack),
        abhyasa_custody::AckDisposition::IgnoredUnknown
    );
    persist_custodian(&mut c, &mut store, 1_200);
    assert_eq!(store.notes().unwrap().len(), 1);
    assert!(c.poll_event().is_none());
}

/// A file on a disk in memory, written directly with redb by `write` (one commit): what an
/// older or newer build would have left.
fn raw_file(write: impl FnOnce(&redb::WriteTransaction)) -> FaultyBackend {
    let backend = FaultyBackend::new(FaultPlan::None);
    let db = redb::Database::builder()
        .create_with_backend(backend.clone())
        .unwrap();
    let txn = db.begin_write().unwrap();
    write(&txn);
    txn.commit().unwrap();
    backend
}

/// A file of layout 1, written table by table as that layout's builds wrote it (one of its
/// later tables, `principal.authorization_by`, missing a row as in a file an older build
/// wrote), opens as layout 2 with the same state: what each side enforces, the obligation
/// named in force, and the sequences a recovered receiver declines against.
#[test]
fn a_layout_1_file_is_converted_when_opened() {
    let backend = raw_file(|txn| {
        {
            txn.open_table(META).unwrap().insert("schema", 1).unwrap();
            let mut auths = txn.open_table(layout1::AUTHORIZATIONS).unwrap();
            auths.insert(("a", "s1"), (false, Some(4))).unwrap();
            auths.insert(("a", "s2"), (true, Some(5))).unwrap();
            let mut by = txn.open_table(layout1::AUTHORIZATION_BY).unwrap();
            by.insert(("a", "s1"), 40).unwrap();
            let mut until = txn.open_table(layout1::AUTHORIZATION_UNTIL).unwrap();
            until.insert(("a", "s1"), 50_000).unwrap();
            let mut seqs = txn.open_table(layout1::LAST_SEQUENCE).unwrap();
            seqs.insert((0, "p", "s1"), 7).unwrap();
            seqs.insert((2, "p", "t9"), 9).unwrap();
            let mut governed = txn.open_table(layout1::GOVERNED_BY).unwrap();
            governed.insert((0, "p", "s1"), 70).unwrap();
            governed.insert((0, "p", "s3"), 71).unwrap();
            governed.insert((2, "p", "t9"), 90).unwrap();
            let mut withheld = txn.open_table(layout1::RECV_WITHHELD).unwrap();
            withheld.insert(("p", "s1"), ()).unwrap();
            let mut leases = txn.open_table(layout1::RECV_LEASES).unwrap();
            leases.insert(("p", "s3"), 60_000).unwrap();
            // Tokens: the principal revoked t1 until 70 s (by obligation 11) and t2 for good;
            // the agent dropped t9, acted on by p (kept for good, as older builds left it)
            // and by q (until 80 s).
            let mut revoked = txn.open_table(layout1::REVOKED_TOKENS).unwrap();
            revoked.insert("t1", ()).unwrap();
            revoked.insert("t2", ()).unwrap();
            let mut until = txn.open_table(layout1::REVOKED_TOKENS_BY_EXPIRY).unwrap();
            until.insert((70_000, "t1"), ()).unwrap();
            let mut by = txn.open_table(layout1::TOKEN_REVOKED_BY).unwrap();
            by.insert("t1", 11).unwrap();
            let mut tokens = txn.open_table(layout1::RECV_TOKENS).unwrap();
            tokens.insert("t9", true).unwrap();
            let mut until = txn.open_table(layout1::RECV_TOKENS_BY_EXPIRY).unwrap();
            until.insert((u64::MAX, "t9", "p"), ()).unwrap();
            until.insert((80_000, "t9", "q"), ()).unwrap();
            governed.insert((2, "q", "t9"), 91).unwrap();
        }
    });
    let scope = |s: &str| Scope::new(s).unwrap();
    let id = ObligationId::from_u128;
    let check = |store: &Store| {
        assert_eq!(
            store.principal().authorization(&a(), &scope("s1")),
            Some(Authorization {
                withheld: false,
                sequence: Some(4),
                by: Some(id(40)),
                until: Some(UnixMillis(50_000)),
            })
        );
        assert_eq!(
            store.principal().authorization(&a(), &scope("s2")),
            Some(Authorization {
                withheld: true,
                sequence: Some(5),
                by: None,
                until: None,
            })
        );
        let agent = store.receiver_state();
        assert!(agent.is_withheld(&p(), &scope("s1")));
        assert!(!agent.is_withheld(&p(), &scope("s3")));
        assert_eq!(agent.lease(&p(), &scope("s3")), Some(UnixMillis(60_000)));
        assert_eq!(agent.lease(&p(), &scope("s1")), None);
        let named = |key| store.governed_by(&key).unwrap();
        assert_eq!(named(GovernedKey::Scope(p(), scope("s1"))), Some(id(70)));
        assert_eq!(named(GovernedKey::Scope(p(), scope("s3"))), Some(id(71)));
        let t9 = TokenId::new("t9").unwrap();
        assert_eq!(named(GovernedKey::Token(p(), t9.clone())), Some(id(90)));
        assert_eq!(named(GovernedKey::Token(q(), t9.clone())), Some(id(91)));
        assert_eq!(
            agent.token_record(&t9),
            Some((true, Some(UnixMillis(80_000))))
        );
        let (t1, t2) = (TokenId::new("t1").unwrap(), TokenId::new("t2").unwrap());
        let principal = store.principal();
        assert_eq!(principal.revoked_until(&t1), Some(Some(UnixMillis(70_000))));
        assert_eq!(principal.token_revoked_by(&t1), Some(id(11)));
        assert_eq!(principal.revoked_until(&t2), Some(None));
        assert_eq!(principal.token_revoked_by(&t2), None);
        let mut r = store
            .recover_receiver(a(), ReceiverConfig::default())
            .unwrap();
        let superseded =
            abhyasa_custody::Disposition::Declined(abhyasa_wire::DeclineReason::Superseded);
        let mut s1 = revoke_scope(100);
        s1.payload = revoke_scope(1).payload;
        s1.sequence = Some(7);
        assert_eq!(r.handle_obligation(UnixMillis(1), &p(), s1), superseded);
        let mut t9 = revoke_token(101);
        t9.payload = revoke_token(9).payload;
        t9.sequence = Some(9);
        assert_eq!(r.handle_obligation(UnixMillis(1), &p(), t9), superseded);
        // No sequence was kept on s3: a first one is newer.
        let mut s3 = revoke_scope(102);
        s3.payload = revoke_scope(3).payload;
        s3.sequence = Some(1);
        assert_ne!(r.handle_obligation(UnixMillis(1), &p(), s3), superseded);
    };
    let mut backend = backend.power_cycle(FaultPlan::None);
    let store = Store::open_backend(backend.clone(), StoreConfig::default()).unwrap();
    check(&store);
    let txn = store.db.begin_read().unwrap();
    let names: Vec<String> = txn
        .list_tables()
        .unwrap()
        .map(|t| redb::TableHandle::name(&t).to_owned())
        .collect();
    for gone in [
        "principal.authorizations",
        "principal.authorization_by",
        "principal.authorization_until",
        "receiver.last_sequence",
        "receiver.governed_by",
        "receiver.withheld",
        "receiver.leases",
        "principal.revoked_tokens",
        "principal.revoked_tokens_by_expiry",
        "principal.token_revoked_by",
        "receiver.tokens",
        "receiver.tokens_by_expiry",
    ] {
        assert!(!names.iter().any(|n| n == gone), "{gone} is still there");
    }
    let schema = txn
        .open_table(META)
        .unwrap()
        .get("schema")
        .unwrap()
        .unwrap();
    assert_eq!(schema.value(), SCHEMA_VERSION);
    drop((schema, txn, store));
    // Opened again, as layout 2: the same state.
    let mut store = reopen(&mut backend);
    check(&store);
    // At t9's expiry its record goes, with the rows of both issuers that acted on it; t1's
    // revocation ends; t2's stays.
    store.maintain(UnixMillis(80_000)).unwrap();
    let t = |n: &str| TokenId::new(n).unwrap();
    assert_eq!(store.receiver_state().token_record(&t("t9")), None);
    for issuer in [p(), q()] {
        let key = GovernedKey::Token(issuer, t("t9"));
        assert_eq!(store.governed_by(&key).unwrap(), None);
    }
    let store = reopen(&mut backend);
    assert_eq!(store.receiver_state().token_record(&t("t9")), None);
    assert_eq!(store.principal().revoked_until(&t("t1")), None);
    assert_eq!(store.principal().revoked_until(&t("t2")), Some(None));
}

#[test]
fn an_unknown_schema_is_refused() {
    let backend = raw_file(|txn| {
        txn.open_table(META).unwrap().insert("schema", 99).unwrap();
    });
    let err = Store::open_backend(backend.power_cycle(FaultPlan::None), StoreConfig::default())
        .unwrap_err();
    assert!(
        matches!(
            err,
            StoreError::Schema {
                found: 99,
                expected: 2
            }
        ),
        "{err}"
    );
}

#[test]
fn a_failed_sync_poisons_the_store_and_leaves_a_recoverable_file() {
    let backend = FaultyBackend::new(FaultPlan::None);
    let mut store = Store::open_backend(backend.clone(), StoreConfig::default()).unwrap();
    let mut c = Custodian::new(p(), CustodianConfig::default(), 1);
    c.issue(UnixMillis(0), revoke_token(1)).unwrap();
    persist_custodian(&mut c, &mut store, 0);
    drop(store);
    let failing = backend.power_cycle(FaultPlan::None);
    let mut store = Store::open_backend(failing.clone(), StoreConfig::default()).unwrap();
    failing.arm(FaultPlan::FailSync(1));
    c.issue(UnixMillis(0), revoke_token(2)).unwrap();
    let rec = c.poll_persist().unwrap();
    assert!(matches!(
        store.commit(&[Op::Custodian(rec.record)]),
        Err(StoreError::CommitUnknown(_))
    ));
    assert!(matches!(store.commit(&[]), Err(StoreError::Poisoned)));
    drop(store);
    let store =
        Store::open_backend(failing.power_cycle(FaultPlan::None), StoreConfig::default()).unwrap();
    // What was acknowledged before is there; the failed commit is not.
    assert!(store.knows(ObligationId::from_u128(1)).unwrap());
    assert!(!store.knows(ObligationId::from_u128(2)).unwrap());
}

#[test]
fn group_commit_batches_concurrent_writers() {
    let (store, _) = memory_store();
    let group = std::sync::Arc::new(GroupCommit::spawn(
        store,
        GroupConfig {
            max_ops: 1_000,
            max_delay: Duration::from_millis(5),
            ..GroupConfig::default()
        },
        || Err(StoreError::Poisoned),
    ));
    let mut handles = Vec::new();
    for t in 0..8u128 {
        let group = std::sync::Arc::clone(&group);
        handles.push(std::thread::spawn(move || {
            for i in 0..25u128 {
                let mut c = Custodian::new(p(), CustodianConfig::default(), 1);
                c.issue(UnixMillis(0), revoke_token(t * 1_000 + i)).unwrap();
                let rec = c.poll_persist().unwrap();
                group
                    .submit(vec![Op::Custodian(rec.record)])
                    .wait()
                    .unwrap();
            }
        }));
    }
    for h in handles {
        h.join().unwrap();
    }
    let stats = group.stats();
    let ops = stats.ops.load(std::sync::atomic::Ordering::Relaxed);
    let commits = stats.commits.load(std::sync::atomic::Ordering::Relaxed);
    assert_eq!(ops, 200);
    assert!(
        commits < ops,
        "no batching: {commits} commits for {ops} ops"
    );
    let pending = group.read(|s| s.pending().unwrap().len()).unwrap();
    assert_eq!(pending, 200);
}

/// A custodian's first record submitted to `group` with `disk` stalled: the custodian, the
/// commit's ticket and the syncs completed before it.
fn a_stalled_commit(
    group: &GroupCommit,
    disk: &FaultyBackend,
) -> (Custodian, crate::group::Ticket, u64) {
    let mut c = Custodian::new(p(), CustodianConfig::default(), 1);
    c.issue(UnixMillis(0), revoke_token(1)).unwrap();
    let rec = c.poll_persist().unwrap();
    disk.arm(FaultPlan::Stall);
    let syncs = disk.syncs();
    (c, group.submit(vec![Op::Custodian(rec.record)]), syncs)
}

/// The writer counts the time its commits take, the disk's sync included: a commit held by a
/// stalled disk for 80 ms adds at least 80 ms; a commit that fails adds neither a commit nor
/// time.
#[test]
fn the_writer_counts_the_time_its_commits_take() {
    let (store, disk) = memory_store();
    let group = GroupCommit::spawn(store, GroupConfig::default(), || Err(StoreError::Poisoned));
    let busy = |g: &GroupCommit| {
        Duration::from_nanos(
            g.stats()
                .busy_nanos
                .load(std::sync::atomic::Ordering::Relaxed),
        )
    };
    let (mut c, ticket, syncs) = a_stalled_commit(&group, &disk);
    // The commit is on the disk, stalled, before the clock starts.
    while disk.stalled() == 0 {
        std::thread::sleep(Duration::from_millis(1));
    }
    std::thread::sleep(Duration::from_millis(80));
    disk.arm(FaultPlan::None);
    assert_eq!(ticket.wait(), Ok(()));
    assert!(disk.syncs() > syncs);
    let stats = group.stats();
    assert_eq!(stats.commits.load(std::sync::atomic::Ordering::Relaxed), 1);
    let held = busy(&group);
    assert!(
        held >= Duration::from_millis(80),
        "a commit stalled 80 ms counted {held:?}"
    );
    // A commit that fails is no commit and no time.
    disk.arm(FaultPlan::FailSync(1));
    c.issue(UnixMillis(0), revoke_token(2)).unwrap();
    let rec = c.poll_persist().unwrap();
    let failed = group.submit(vec![Op::Custodian(rec.record)]).wait();
    assert!(failed.is_err(), "{failed:?}");
    assert_eq!(stats.commits.load(std::sync::atomic::Ordering::Relaxed), 1);
    assert_eq!(busy(&group), held);
}

/// Dropping the writer waits for the commit under way — unless the disk stopped answering:
/// then the drop returns after `drop_wait` instead of hanging whoever drops it (a node's core
/// task, on a runtime thread), and the commit finishes when the disk answers.
#[test]
fn dropping_the_writer_over_a_hung_disk_returns_after_its_wait() {
    let (store, disk) = memory_store();
    let group = GroupCommit::spawn(
        store,
        GroupConfig {
            drop_wait: Duration::from_millis(200),
            ..GroupConfig::default()
        },
        || Err(StoreError::Poisoned),
    );
    let (_, ticket, syncs) = a_stalled_commit(&group, &disk);
    let (dropped, returned) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        drop(group);
        let _ = dropped.send(());
    });
    returned
        .recv_timeout(Duration::from_secs(10))
        .expect("the drop returns though the disk hangs");
    assert_eq!(disk.syncs(), syncs, "the commit is still stalled");
    disk.arm(FaultPlan::None);
    assert_eq!(
        ticket.wait(),
        Ok(()),
        "the commit lands once the disk answers"
    );
    assert!(disk.syncs() > syncs, "the stalled commit synced");
}

#[test]
fn group_commit_reports_unknown_outcome_and_reopens() {
    let backend = FaultyBackend::new(FaultPlan::None);
    let store = Store::open_backend(backend.clone(), StoreConfig::default()).unwrap();
    drop(store);
    let failing = backend.power_cycle(FaultPlan::None);
    let store = Store::open_backend(failing.clone(), StoreConfig::default()).unwrap();
    failing.arm(FaultPlan::FailSync(1));
    let reopened = failing.clone();
    let group = GroupCommit::spawn(store, GroupConfig::default(), move || {
        Store::open_backend(
            reopened.power_cycle(FaultPlan::None),
            StoreConfig::default(),
        )
    });
    let mut c = Custodian::new(p(), CustodianConfig::default(), 1);
    c.issue(UnixMillis(0), revoke_token(1)).unwrap();
    let rec = c.poll_persist().unwrap();
    let err = group.submit(vec![Op::Custodian(rec.record.clone())]).wait();
    assert!(matches!(err, Err(GroupError::Unknown(_))), "{err:?}");
    assert_eq!(
        group
            .stats()
            .generation
            .load(std::sync::atomic::Ordering::Relaxed),
        1
    );
    // The recovered custodian does not have it: the caller issues again.
    let known = group
        .read(|s| s.knows(ObligationId::from_u128(1)).unwrap())
        .unwrap();
    assert!(!known);
    group
        .submit(vec![Op::Custodian(rec.record)])
        .wait()
        .unwrap();
    assert!(group
        .read(|s| s.knows(ObligationId::from_u128(1)).unwrap())
        .unwrap());
}

#[test]
fn retention_prunes_history_and_keeps_the_file_bounded() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("r.redb");
    let config = StoreConfig {
        retention_ms: 1_000,
        compact_after_pruned: 500,
        ..StoreConfig::default()
    };
    let mut store = Store::open(&path, config.clone()).unwrap();
    let mut sizes = Vec::new();
    for round in 0..12u64 {
        let mut c = Custodian::new(p(), CustodianConfig::default(), round);
        let base = u128::from(round) * 10_000;
        let now = round * 10_000;
        let mut ops = Vec::new();
        for i in 0..300u128 {
            let mut o = revoke_token(base + i);
            o.created_at = UnixMillis(now);
            o.deadline = UnixMillis(now + 1_000);
            c.issue(UnixMillis(now), o).unwrap();
        }
        c.handle_timeout(UnixMillis(now + 1_000));
        while let Some(rec) = c.poll_persist() {
            ops.push(Op::Custodian(rec.record));
        }
        store.commit(&ops).unwrap();
        let m = store.maintain(UnixMillis(now + 5_000)).unwrap();
        assert_eq!(m.terminal_pruned, 300, "round {round}");
        assert_eq!(store.terminal_len().unwrap(), 0);
        sizes.push(std::fs::metadata(&path).unwrap().len());
    }
    // Revoked tokens are principal state and stay; the history does not pile up.
    assert_eq!(store.principal().revoked_tokens().count(), 3_600);
    let early = sizes[3];
    let late = *sizes.last().unwrap();
    assert!(
        late <= early * 3,
        "file grew from {early} to {late}: {sizes:?}"
    );
}

/// What issuing an id the store knows answers: a pending one known with no outcome yet, an
/// ended one with its terminal record and escalation, an unknown one not at all.
#[test]
fn known_ids_are_read_in_one_batch_with_their_outcomes() {
    let (mut store, _) = memory_store();
    let mut c = Custodian::new(p(), CustodianConfig::default(), 1);
    c.issue(UnixMillis(0), revoke_token(1)).unwrap();
    let mut late = revoke_token(2);
    late.deadline = UnixMillis(10_000);
    c.issue(UnixMillis(0), late).unwrap();
    persist_custodian(&mut c, &mut store, 0);
    c.handle_timeout(UnixMillis(1_000));
    persist_custodian(&mut c, &mut store, 1_000);
    let id = ObligationId::from_u128;
    let known = store.known(&[id(1), id(2), id(3)]).unwrap();
    assert_eq!(known.len(), 2, "{known:?}");
    let (first, ended) = &known[0];
    assert_eq!(*first, id(1));
    let (record, escalation) = ended.as_ref().expect("obligation 1 ended");
    assert!(matches!(record.outcome, Outcome::Escalated(_)));
    assert_eq!(escalation.as_ref().map(|e| e.obligation_id), Some(id(1)));
    assert_eq!(known[1], (id(2), None), "obligation 2 is pending");
}

#[test]
fn terminal_outcomes_are_readable() {
    let (mut store, _) = memory_store();
    let mut c = Custodian::new(p(), CustodianConfig::default(), 1);
    c.issue(UnixMillis(0), revoke_token(1)).unwrap();
    persist_custodian(&mut c, &mut store, 0);
    let ack = abhyasa_wire::CustodyAck {
        obligation_id: ObligationId::from_u128(1),
        target: a(),
        status: AckStatus::Applied,
        acked_at: UnixMillis(3),
        detail: None,
    };
    c.handle_ack(UnixMillis(3), &a(), ack);
    persist_custodian(&mut c, &mut store, 3);
    let t = store.terminal(ObligationId::from_u128(1)).unwrap().unwrap();
    assert_eq!(t.outcome, Outcome::Applied);
    assert!(store.pending().unwrap().is_empty());
}

#[test]
fn the_apply_log_keeps_each_apply_and_is_pruned_with_its_id() {
    let (mut store, mut backend) = memory_store();
    let mut r = Receiver::new(a(), ReceiverConfig::default());
    r.handle_obligation(UnixMillis(5), &p(), revoke_token(1));
    r.handle_obligation(UnixMillis(7), &p(), belief(2, -3));
    persist_receiver(&mut r, &mut store);
    let log = store.apply_log().unwrap();
    let seen: Vec<(ObligationId, u64, u32)> = log
        .iter()
        .map(|e| (e.obligation.id, e.at.0, e.earlier))
        .collect();
    assert_eq!(
        seen,
        vec![
            (ObligationId::from_u128(1), 5, 0),
            (ObligationId::from_u128(2), 7, 0)
        ]
    );
    assert_eq!(log[0].obligation, revoke_token(1));

    // An apply record for an id applied before (what a double apply would write) is kept
    // as a second row, not merged into the first.
    let again = ReceiverRecord::Apply {
        id: ObligationId::from_u128(1),
        issuer: p(),
        obligation: Box::new(revoke_token(1)),
        at: UnixMillis(9),
        expires: UnixMillis(1_000),
        sequence: None,
        effect: abhyasa_custody::ReceiverEffect::DropToken(TokenId::new("t1").unwrap(), None),
    };
    store.commit(&[Op::Receiver(again)]).unwrap();
    let store = reopen(&mut backend);
    let earlier: Vec<u32> = store
        .apply_log()
        .unwrap()
        .iter()
        .filter(|e| e.obligation.id == ObligationId::from_u128(1))
        .map(|e| e.earlier)
        .collect();
    assert_eq!(earlier, vec![0, 1]);

    // Pruning an id's applied record takes its log rows with it.
    let mut store = store;
    store
        .commit(&[Op::Receiver(ReceiverRecord::Prune {
            before: UnixMillis(u64::MAX),
        })])
        .unwrap();
    assert_eq!(store.apply_log().unwrap(), vec![]);
}

#[test]
fn a_pending_row_that_does_not_read_stops_recovery() {
    let (mut store, mut backend) = memory_store();
    let mut c = Custodian::new(p(), CustodianConfig::default(), 1);
    for o in [revoke_scope(1), revoke_token(2)] {
        c.issue(UnixMillis(0), o).unwrap();
    }
    persist_custodian(&mut c, &mut store, 0);
    // A row whose bytes are intact for redb but are not a pending record (written by a bug,
    // or another build): the obligation under custody must not vanish without an outcome.
    {
        let txn = store.db.begin_write().unwrap();
        txn.open_table(PENDING)
            .unwrap()
            .insert(2u128, [0xfbu8, 0x3f, 0xc0, 0, 0, 0, 0, 0, 0].as_slice())
            .unwrap();
        txn.commit().unwrap();
    }
    drop(store);
    let store = reopen(&mut backend);
    let err = store
        .recover_custodian(p(), CustodianConfig::default(), 2, UnixMillis(10))
        .unwrap_err();
    assert!(
        matches!(
            err,
            StoreError::Corrupt {
                table: "custodian.pending",
                ..
            }
        ),
        "{err}"
    );
    assert!(err.to_string().contains("custodian.pending"), "{err}");
}

/// `recent_terminal`, `recent_escalations` and `recent_applied` return the newest `n` by time
/// (not by id), oldest first — the expected sets computed here from what was written.
#[test]
fn the_most_recent_history_is_read_by_time_without_reading_it_all() {
    let (mut store, _) = memory_store();
    // Times scrambled against ids: at = 37·id mod 101 (distinct for ids 1..=100).
    let at = |id: u128| ((id * 37) % 101) as u64;
    let mut ops = Vec::new();
    for id in 1..=100u128 {
        let record = TerminalRecord {
            obligation_id: ObligationId::from_u128(id),
            kind: abhyasa_wire::Kind::OauthToken,
            target: a(),
            outcome: Outcome::Escalated(EscalationCause::Deadline),
            attempts: 1,
            at: UnixMillis(at(id)),
            detail: None,
        };
        // Every third one escalated.
        let escalation = (id % 3 == 0).then(|| Escalation {
            obligation_id: ObligationId::from_u128(id),
            kind: abhyasa_wire::Kind::OauthToken,
            target: a(),
            attempts: 1,
            cause: EscalationCause::Deadline,
            last_observed: abhyasa_wire::LastObserved::NoAck,
            safe_action: SafeAction::StopHonouringToken {
                token_id: TokenId::new(format!("t{id}")).unwrap(),
                expires_at: None,
            },
            at: UnixMillis(at(id)),
        });
        ops.push(Op::Custodian(abhyasa_custody::CustodianRecord::Terminal {
            record,
            escalation,
            principal: None,
        }));
    }
    store.commit(&ops).unwrap();
    let newest = |ids: Vec<u128>, n: usize| -> Vec<u128> {
        let mut by_time: Vec<(u64, u128)> = ids.into_iter().map(|id| (at(id), id)).collect();
        by_time.sort_unstable();
        by_time[by_time.len().saturating_sub(n)..]
            .iter()
            .map(|&(_, id)| id)
            .collect()
    };
    let got: Vec<u128> = store
        .recent_terminal(7)
        .unwrap()
        .iter()
        .map(|r| r.obligation_id.to_u128())
        .collect();
    assert_eq!(got, newest((1..=100).collect(), 7));
    let got: Vec<u128> = store
        .recent_escalations(5)
        .unwrap()
        .iter()
        .map(|e| e.obligation_id.to_u128())
        .collect();
    assert_eq!(got, newest((1..=100).filter(|id| id % 3 == 0).collect(), 5));
    // More than there are: all of them, in time order.
    assert_eq!(store.recent_terminal(1_000).unwrap().len(), 100);
    assert_eq!(
        store
            .escalation(ObligationId::from_u128(9))
            .unwrap()
            .map(|e| e.at),
        Some(UnixMillis(at(9)))
    );
    assert_eq!(store.escalation(ObligationId::from_u128(10)).unwrap(), None);

    // Applies at scrambled times; the newest 4, oldest first.
    let mut r = Receiver::new(a(), ReceiverConfig::default());
    for id in 1..=20u128 {
        r.handle_obligation(UnixMillis(at(id)), &p(), revoke_token(id));
    }
    persist_receiver(&mut r, &mut store);
    let got: Vec<(u128, u64)> = store
        .recent_applied(4)
        .unwrap()
        .iter()
        .map(|e| (e.obligation.id.to_u128(), e.at.0))
        .collect();
    let want: Vec<(u128, u64)> = newest((1..=20).collect(), 4)
        .into_iter()
        .map(|id| (id, at(id)))
        .collect();
    assert_eq!(got, want);
}

#[test]
fn token_records_are_forgotten_on_disk_at_the_tokens_own_expiry_and_not_before() {
    let (mut store, mut backend) = memory_store();
    let t = |n: u32| TokenId::new(format!("t{n}")).unwrap();
    // The principal revokes t1 (expires at 2,000), t2 (5,000) and t3 (no expiry: for good).
    let mut c = Custodian::new(p(), CustodianConfig::default(), 1);
    for (id, exp) in [(1, Some(2_000)), (2, Some(5_000)), (3, None)] {
        c.issue(UnixMillis(0), token_until(id, false, exp)).unwrap();
    }
    persist_custodian(&mut c, &mut store, 0);
    // The receiver drops t11 (2,000), caches t12 (5,000) and drops t13 (for good).
    // Each with a sequence: the last sequence goes with the record.
    let mut r = Receiver::new(a(), ReceiverConfig::default());
    for (id, issue, exp) in [
        (11, false, Some(2_000)),
        (12, true, Some(5_000)),
        (13, false, None),
    ] {
        let mut o = token_until(id, issue, exp);
        o.sequence = Some(id as u64);
        r.handle_obligation(UnixMillis(5), &p(), o);
    }
    persist_receiver(&mut r, &mut store);
    let sequences = |s: &Store| {
        s.recover_receiver(a(), ReceiverConfig::default())
            .unwrap()
            .held()
            .sequences
    };
    let governed = |s: &Store, n: u32| {
        s.governed_by(&GovernedKey::Token(p(), t(n)))
            .unwrap()
            .map(|id| id.to_u128())
    };
    let principal = |s: &Store| s.principal().revoked_tokens().cloned().collect::<Vec<_>>();
    let dropped = |s: &Store| {
        s.receiver_state()
            .dropped_tokens()
            .cloned()
            .collect::<Vec<_>>()
    };
    let cached = |s: &Store| {
        s.receiver_state()
            .cached_tokens()
            .cloned()
            .collect::<Vec<_>>()
    };

    // Expiries survive a power cycle.
    let mut store = reopen(&mut backend);
    assert_eq!(
        store.principal().revoked_until(&t(1)),
        Some(Some(UnixMillis(2_000)))
    );
    assert_eq!(store.principal().revoked_until(&t(3)), Some(None));
    // So does the obligation that revoked each: what an enforcement point names.
    for n in 1..=3 {
        assert_eq!(
            store.principal().token_revoked_by(&t(n)),
            Some(ObligationId::from_u128(u128::from(n)))
        );
    }
    assert_eq!(
        store.receiver_state().token_record(&t(12)),
        Some((false, Some(UnixMillis(5_000))))
    );
    assert_eq!(governed(&store, 11), Some(11));
    assert_eq!(sequences(&store), 3);

    assert_eq!(store.maintain(UnixMillis(1_999)).unwrap().tokens_expired, 0);
    assert_eq!(sequences(&store), 3);
    assert_eq!(store.maintain(UnixMillis(2_000)).unwrap().tokens_expired, 2);
    let mut store = reopen(&mut backend);
    assert_eq!(principal(&store), vec![t(2), t(3)]);
    assert_eq!(store.principal().token_revoked_by(&t(1)), None);
    assert_eq!(store.principal().token_revocations().count(), 2);
    assert_eq!(dropped(&store), vec![t(13)]);
    assert_eq!(cached(&store), vec![t(12)]);
    assert_eq!(governed(&store, 11), None);
    assert_eq!(governed(&store, 12), Some(12));
    assert_eq!(sequences(&store), 2);

    assert_eq!(
        store.maintain(UnixMillis(10_000)).unwrap().tokens_expired,
        2
    );
    let store = reopen(&mut backend);
    assert_eq!(principal(&store), vec![t(3)]);
    assert_eq!(dropped(&store), vec![t(13)]);
    assert_eq!(cached(&store), Vec::<TokenId>::new());
    assert_eq!(governed(&store, 12), None);
    assert_eq!(governed(&store, 13), Some(13));
    assert_eq!(sequences(&store), 1);
}

/// A token cached for good by one issuer, then dropped until an expiry by another: at that
/// expiry every issuer's last sequence and governed-by row goes with the record, on disk as in
/// memory (the first issuer's rows used to stay on disk for good and come back at restart).
#[test]
fn a_token_kept_for_good_then_given_an_expiry_takes_every_issuers_rows_with_it() {
    let (mut store, mut backend) = memory_store();
    let q = AgentId::new("q").unwrap();
    let token = TokenId::new("t").unwrap();
    let from = |id: u128, issuer: &AgentId, action: TokenAction, expires: Option<u64>| {
        let mut o = obligation(
            id,
            Payload::OauthToken(TokenPayload {
                action,
                token_id: token.clone(),
                client_id: ClientId::new("c").unwrap(),
                expires_at: expires.map(UnixMillis),
            }),
        );
        o.issuer = issuer.clone();
        o
    };
    let rows = |s: &Store| {
        let held = s
            .recover_receiver(a(), ReceiverConfig::default())
            .unwrap()
            .held();
        let governed = [p(), q.clone()].map(|i| {
            s.governed_by(&GovernedKey::Token(i, token.clone()))
                .unwrap()
        });
        (held.sequences, governed.iter().flatten().count())
    };
    let mut r = Receiver::new(a(), ReceiverConfig::default());
    // p caches the token for good (sequence 1).
    r.handle_obligation(UnixMillis(5), &p(), from(1, &p(), TokenAction::Issue, None));
    persist_receiver(&mut r, &mut store);
    let mut store = reopen(&mut backend);
    assert_eq!(
        store.receiver_state().token_record(&token),
        Some((false, None))
    );
    assert_eq!(rows(&store), (1, 1));
    // q revokes it until 2,000 (sequence 2): the record is dropped until then.
    r.handle_obligation(
        UnixMillis(6),
        &q,
        from(2, &q, TokenAction::Revoke, Some(2_000)),
    );
    persist_receiver(&mut r, &mut store);
    let mut store = reopen(&mut backend);
    assert_eq!(
        store.receiver_state().token_record(&token),
        Some((true, Some(UnixMillis(2_000))))
    );
    assert_eq!(rows(&store), (2, 2));
    assert_eq!(store.maintain(UnixMillis(1_999)).unwrap().tokens_expired, 0);
    assert_eq!(store.maintain(UnixMillis(2_000)).unwrap().tokens_expired, 1);
    let store = reopen(&mut backend);
    assert_eq!(store.receiver_state().token_record(&token), None);
    assert_eq!(rows(&store), (0, 0), "rows outlived the token's record");
}

/// The applied ids a store recovers carry the digest of what was applied under them, so a
/// recovered receiver still declines other content under a known id (and re-acks the same).
#[test]
fn a_recovered_receiver_still_tells_other_content_under_a_known_id() {
    let (mut store, mut backend) = memory_store();
    let mut r = Receiver::new(a(), ReceiverConfig::default());
    r.handle_obligation(UnixMillis(0), &p(), revoke_scope(2));
    assert_eq!(persist_receiver(&mut r, &mut store).len(), 1);
    drop(store);
    let store = reopen(&mut backend);
    let mut r = store
        .recover_receiver(a(), ReceiverConfig::default())
        .unwrap();
    let mut other = revoke_scope(2);
    other.payload = Payload::AnumatiConsent(ConsentPayload {
        decision: Some(ConsentDecision::Revoke),
        scope: abhyasa_wire::Scope::new("another.scope").unwrap(),
        expires_at: None,
    });
    assert_eq!(
        r.handle_obligation(UnixMillis(1), &p(), other),
        abhyasa_custody::Disposition::Declined(abhyasa_wire::DeclineReason::IdConflict)
    );
    assert_eq!(
        r.handle_obligation(UnixMillis(1), &p(), revoke_scope(2)),
        abhyasa_custody::Disposition::Duplicate
    );
    let acks: Vec<AckStatus> = std::iter::from_fn(|| r.poll_transmit())
        .map(|t| t.ack.status)
        .collect();
    assert_eq!(
        acks,
        vec![
            AckStatus::Declined(abhyasa_wire::DeclineReason::IdConflict),
            AckStatus::Applied
        ]
    );
}

/// A recovered receiver counts each applied id and governed key against its issuer, read back
/// from the apply log and the governed-by rows: a member at its limits is still held to them,
/// and the principal is not.
#[test]
fn a_recovered_receiver_keeps_each_issuers_limits() {
    let (mut store, mut backend) = memory_store();
    let config = ReceiverConfig {
        max_applied: 2,
        max_governed: 2,
        ..ReceiverConfig::default()
    };
    let member = AgentId::new("member").unwrap();
    let by_member = |id: u128| {
        let mut o = revoke_token(id);
        o.issuer = member.clone();
        o
    };
    let mut r = Receiver::new(a(), config.clone());
    for id in [1, 2] {
        r.handle_obligation(UnixMillis(0), &member, by_member(id));
    }
    assert_eq!(persist_receiver(&mut r, &mut store).len(), 2);
    drop(store);
    let store = reopen(&mut backend);
    let mut r = store.recover_receiver(a(), config).unwrap();
    assert_eq!(r.held().governed, 2);
    assert_eq!(
        r.handle_obligation(UnixMillis(1), &member, by_member(3)),
        abhyasa_custody::Disposition::Deferred,
        "the member's applied ids, recovered with their issuer, fill its share"
    );
    assert_eq!(
        r.handle_obligation(UnixMillis(1), &p(), revoke_token(4)),
        abhyasa_custody::Disposition::Applying
    );
}

/// State files are private: a store file is created 0600 (it was 0644, readable by every
/// user of the machine).
#[test]
fn a_new_store_file_is_private() {
    use std::os::unix::fs::PermissionsExt;
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("node.redb");
    drop(Store::open(&path, StoreConfig::default()).unwrap());
    let mode = std::fs::metadata(&path).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode, 0o600, "node.redb mode {mode:o}");
    // And it reopens as a store.
    drop(Store::open(&path, StoreConfig::default()).unwrap());
}

/// The obligation whose decision is in force on a scope is kept with it across a restart, and
/// a newer decision renames it: an enforcement point names the one that stands.
#[test]
fn a_scope_decision_keeps_the_obligation_that_carried_it_across_a_restart() {
    let (mut store, mut backend) = memory_store();
    let mut c = Custodian::new(p(), CustodianConfig::default(), 1);
    let scope = Scope::new("s1").unwrap();
    c.issue(UnixMillis(0), revoke_scope(1)).unwrap();
    persist_custodian(&mut c, &mut store, 0);
    let by = |s: &Store| s.principal().authorization(&a(), &scope).and_then(|x| x.by);
    let mut store = reopen(&mut backend);
    assert_eq!(by(&store), Some(ObligationId::from_u128(1)));
    assert!(store.principal().is_withheld(&a(), &scope));
    // A grant with a newer sequence and a lease takes the name at once, but opens the scope
    // only when its target confirms it (fail-closed), until its lease.
    let mut grant = revoke_scope(1);
    grant.id = ObligationId::from_u128(2);
    grant.sequence = Some(2);
    grant.payload = Payload::AnumatiConsent(ConsentPayload {
        decision: Some(ConsentDecision::Grant),
        scope: scope.clone(),
        expires_at: Some(UnixMillis(90_000)),
    });
    c.issue(UnixMillis(1), grant).unwrap();
    persist_custodian(&mut c, &mut store, 1);
    let mut store = reopen(&mut backend);
    assert_eq!(by(&store), Some(ObligationId::from_u128(2)));
    assert!(store.principal().is_withheld(&a(), &scope));
    c.handle_ack(
        UnixMillis(2),
        &a(),
        abhyasa_wire::CustodyAck {
            obligation_id: ObligationId::from_u128(2),
            target: a(),
            status: AckStatus::Applied,
            acked_at: UnixMillis(2),
            detail: None,
        },
    );
    persist_custodian(&mut c, &mut store, 2);
    let store = reopen(&mut backend);
    assert_eq!(by(&store), Some(ObligationId::from_u128(2)));
    let held = store.principal().authorization(&a(), &scope).unwrap();
    assert!(
        !held.withheld && held.until == Some(UnixMillis(90_000)),
        "{held:?}"
    );
    assert_eq!(
        store.principal().permits(&a(), &scope, UnixMillis(89_999)),
        Some(true)
    );
    assert_eq!(
        store.principal().permits(&a(), &scope, UnixMillis(90_000)),
        Some(false)
    );
}

/// A granted scope's lease is the agent's across a restart, and a withhold ends it.
#[test]
fn an_agents_lease_survives_a_restart_and_a_withhold_ends_it() {
    let (mut store, mut backend) = memory_store();
    let scope = Scope::new("s1").unwrap();
    let mut r = store
        .recover_receiver(a(), ReceiverConfig::default())
        .unwrap();
    let consent = |n: u128, decision, lease: Option<u64>| {
        let mut o = revoke_scope(n);
        o.sequence = Some(n as u64);
        o.payload = Payload::AnumatiConsent(ConsentPayload {
            decision: Some(decision),
            scope: Scope::new("s1").unwrap(),
            expires_at: lease.map(UnixMillis),
        });
        o
    };
    r.handle_obligation(
        UnixMillis(1),
        &p(),
        consent(1, ConsentDecision::Grant, Some(50_000)),
    );
    persist_receiver(&mut r, &mut store);
    let mut store = reopen(&mut backend);
    let state = store.receiver_state();
    assert_eq!(state.lease(&p(), &scope), Some(UnixMillis(50_000)));
    assert!(state.permits(&p(), &scope, UnixMillis(49_999)));
    assert!(!state.permits(&p(), &scope, UnixMillis(50_000)));
    let mut r = store
        .recover_receiver(a(), ReceiverConfig::default())
        .unwrap();
    r.handle_obligation(
        UnixMillis(2),
        &p(),
        consent(2, ConsentDecision::Revoke, None),
    );
    persist_receiver(&mut r, &mut store);
    let store = reopen(&mut backend);
    assert_eq!(store.receiver_state().lease(&p(), &scope), None);
    assert!(!store.receiver_state().permits(&p(), &scope, UnixMillis(3)));
}

#[test]
fn weight_changes_lapse_on_both_sides_across_a_restart_and_upkeep_forgets_them() {
    let (mut store, mut backend) = memory_store();
    // The agent: two changes on one key, lapsing at 60_000 (ttl from creation at 0) and,
    // created later, at 70_000. Their sum clips at the floor.
    let mut r = Receiver::new(a(), ReceiverConfig::default());
    let mut late = belief(2, -900_000);
    late.created_at = UnixMillis(10_000);
    late.deadline = UnixMillis(11_000);
    if let Payload::PhalaBeliefUpdate(b) = &mut late.payload {
        b.weight_key = WeightKey::new("k1").unwrap();
    }
    r.handle_obligation(UnixMillis(0), &p(), belief(1, -300_000));
    r.handle_obligation(UnixMillis(10_000), &p(), late);
    persist_receiver(&mut r, &mut store);
    // The principal: an escalated belief update's down-weight, lapsing at 60_000.
    let mut c = Custodian::new(p(), CustodianConfig::default(), 1);
    c.issue(UnixMillis(0), belief(3, -400_000)).unwrap();
    persist_custodian(&mut c, &mut store, 0);
    c.handle_timeout(UnixMillis(1_000));
    persist_custodian(&mut c, &mut store, 1_000);
    drop(store);

    let mut store = reopen(&mut backend);
    let k1 = WeightKey::new("k1").unwrap();
    let k3 = WeightKey::new("k3").unwrap();
    let agent = |s: &Store, t| s.receiver_state().weight(&p(), &k1, UnixMillis(t));
    let route = |s: &Store, t| s.principal().routing_weight(&a(), &k3, UnixMillis(t));
    assert_eq!(agent(&store, 10_000), -1_000_000);
    assert_eq!(agent(&store, 59_999), -1_000_000);
    assert_eq!(agent(&store, 60_000), -900_000);
    assert_eq!(agent(&store, 70_000), 0);
    assert_eq!(
        (route(&store, 59_999), route(&store, 60_000)),
        (600_000, 1_000_000)
    );
    // Upkeep between the lapses forgets exactly the lapsed ones, durably.
    let report = store.maintain(UnixMillis(65_000)).unwrap();
    assert_eq!((report.weights_lapsed, report.folded), (1, 1));
    drop(store);
    let mut store = reopen(&mut backend);
    assert_eq!(store.receiver_state().weight_changes().count(), 1);
    assert_eq!(agent(&store, 65_000), -900_000);
    assert_eq!(store.principal().entries(), 0);
    assert_eq!(route(&store, 65_000), 1_000_000);
    assert_eq!(
        store.maintain(UnixMillis(70_000)).unwrap().weights_lapsed,
        1
    );
    assert_eq!(store.receiver_state().weight_changes().count(), 0);
    // A receiver recovered from the store holds the same view.
    let r = store
        .recover_receiver(a(), ReceiverConfig::default())
        .unwrap();
    assert_eq!(r.state(), store.receiver_state());
}

/// Opens (or, power-cycled, reopens) a store that keeps the operator's outbox.
fn events_store(backend: &mut FaultyBackend, cycle: bool) -> Store {
    if cycle {
        *backend = backend.power_cycle(FaultPlan::None);
    }
    let config = StoreConfig {
        events: true,
        ..StoreConfig::default()
    };
    Store::open_backend(backend.clone(), config).unwrap()
}

/// Escalations and declines are in the outbox with their terminal records, an applied
/// outcome is not; each key once; rows leave when delivered and the sequence never goes
/// back; it all survives a power cycle; a store that keeps no events records none.
#[test]
fn the_outbox_holds_each_escalation_and_decline_once_until_delivered() {
    let mut backend = FaultyBackend::new(FaultPlan::None);
    let mut store = events_store(&mut backend, false);
    let mut c = Custodian::new(p(), CustodianConfig::default(), 1);
    for o in [revoke_scope(1), revoke_token(2), revoke_scope(3)] {
        c.issue(UnixMillis(0), o).unwrap();
    }
    persist_custodian(&mut c, &mut store, 0);
    let ack = |id: u128, status| abhyasa_wire::CustodyAck {
        obligation_id: ObligationId::from_u128(id),
        target: a(),
        status,
        acked_at: UnixMillis(5),
        detail: None,
    };
    c.handle_ack(UnixMillis(5), &a(), ack(1, AckStatus::Applied));
    c.handle_ack(
        UnixMillis(5),
        &a(),
        ack(2, AckStatus::Declined(abhyasa_wire::DeclineReason::Policy)),
    );
    persist_custodian(&mut c, &mut store, 5);
    // Obligation 3 escalates at its deadline.
    c.handle_timeout(UnixMillis(1_000));
    persist_custodian(&mut c, &mut store, 1_000);
    let mut store = events_store(&mut backend, true);
    let out = store.outbox(None, 100).unwrap();
    let kinds: Vec<_> = out.iter().map(|e| (e.seq, e.event.kind())).collect();
    assert_eq!(
        kinds,
        [(0, "obligation.declined"), (1, "obligation.escalated")],
        "{out:?}"
    );
    assert_eq!(
        out[0].key,
        format!("declined-{}", ObligationId::from_u128(2))
    );
    match &out[0].event {
        OperatorEvent::Declined {
            record,
            safe_action,
        } => {
            assert_eq!(record.obligation_id, ObligationId::from_u128(2));
            assert!(
                matches!(safe_action, Some(SafeAction::StopHonouringToken { .. })),
                "{safe_action:?}"
            );
        }
        e => panic!("{e:?}"),
    }
    match &out[1].event {
        OperatorEvent::Escalated(e) => {
            assert_eq!(e.obligation_id, ObligationId::from_u128(3));
            assert!(matches!(e.safe_action, SafeAction::WithholdScope { .. }));
        }
        e => panic!("{e:?}"),
    }
    // The same event again (a refusal that came back, an event re-derived after a crash):
    // one row.
    let again = out[1].event.clone();
    store
        .commit(&[Op::Event {
            event: again,
            at: UnixMillis(2_000),
        }])
        .unwrap();
    assert_eq!(store.outbox_len().unwrap(), 2);
    assert_eq!(store.outbox(Some(0), 100).unwrap().len(), 1);
    // Delivered through 1: empty; a new event takes sequence 2, not 0, across a restart.
    store.commit(&[Op::EventsDelivered { through: 1 }]).unwrap();
    assert_eq!(store.outbox_len().unwrap(), 0);
    let mut store = events_store(&mut backend, true);
    let lease = OperatorEvent::LeaseEnded {
        side: LeaseSide::Principal,
        agent: a(),
        scope: Scope::new("s9").unwrap(),
        ended_at: UnixMillis(3_000),
    };
    store
        .commit(&[Op::Event {
            event: lease.clone(),
            at: UnixMillis(3_000),
        }])
        .unwrap();
    let out = store.outbox(Some(1), 100).unwrap();
    assert_eq!(out.len(), 1);
    assert_eq!((out[0].seq, &out[0].event), (2, &lease));
    assert!(out[0].key.starts_with("lease-ended-") && out[0].key.len() == 44);

    // The same history in a store that keeps no events: none.
    let (mut plain, _) = memory_store();
    let mut c = Custodian::new(p(), CustodianConfig::default(), 1);
    c.issue(UnixMillis(0), revoke_scope(3)).unwrap();
    persist_custodian(&mut c, &mut plain, 0);
    c.handle_timeout(UnixMillis(1_000));
    persist_custodian(&mut c, &mut plain, 1_000);
    assert_eq!(plain.escalations().unwrap().len(), 1);
    assert_eq!(plain.outbox_len().unwrap(), 0);
}

/// A lease that ends is recorded by the first maintenance at or after its end, once, on both
/// sides, and not before it ends; a lease renewed to a new end is a new event.
#[test]
fn an_ended_lease_is_recorded_once_by_maintenance_on_both_sides() {
    let mut backend = FaultyBackend::new(FaultPlan::None);
    let mut store = events_store(&mut backend, false);
    let scope = Scope::new("s1").unwrap();
    // The agent holds s1 from p until 50 s.
    let mut r = store
        .recover_receiver(a(), ReceiverConfig::default())
        .unwrap();
    let mut grant = revoke_scope(1);
    grant.payload = Payload::AnumatiConsent(ConsentPayload {
        decision: Some(ConsentDecision::Grant),
        scope: scope.clone(),
        expires_at: Some(UnixMillis(50_000)),
    });
    r.handle_obligation(UnixMillis(1), &p(), grant.clone());
    persist_receiver(&mut r, &mut store);
    // The principal grants s1 to a until 50 s, confirmed.
    let mut c = Custodian::new(p(), CustodianConfig::default(), 1);
    grant.id = ObligationId::from_u128(7);
    grant.deadline = UnixMillis(40_000);
    c.issue(UnixMillis(1), grant).unwrap();
    persist_custodian(&mut c, &mut store, 1);
    c.handle_ack(
        UnixMillis(2),
        &a(),
        abhyasa_wire::CustodyAck {
            obligation_id: ObligationId::from_u128(7),
            target: a(),
            status: AckStatus::Applied,
            acked_at: UnixMillis(2),
            detail: None,
        },
    );
    persist_custodian(&mut c, &mut store, 2);
    assert_eq!(store.maintain(UnixMillis(49_999)).unwrap().leases_ended, 0);
    assert_eq!(store.outbox_len().unwrap(), 0);
    assert_eq!(store.maintain(UnixMillis(50_000)).unwrap().leases_ended, 2);
    let mut store = events_store(&mut backend, true);
    assert_eq!(store.maintain(UnixMillis(60_000)).unwrap().leases_ended, 0);
    let out = store.outbox(None, 10).unwrap();
    let sides: Vec<_> = out
        .iter()
        .map(|e| match &e.event {
            OperatorEvent::LeaseEnded {
                side,
                agent,
                scope: s,
                ended_at,
            } => {
                assert_eq!((s, *ended_at), (&scope, UnixMillis(50_000)));
                (*side, agent.clone())
            }
            e => panic!("{e:?}"),
        })
        .collect();
    assert_eq!(
        sides,
        [(LeaseSide::Principal, a()), (LeaseSide::Agent, p())]
    );
    assert_ne!(out[0].key, out[1].key);
}

/// Rows per table after a fixed history, read by table name: where each record's rows land is
/// the file's layout (docs/STORE.md), so a row written to the wrong table, or to none, shows
/// here even when the code that reads it back makes the same mistake.
#[test]
fn each_records_rows_land_in_the_tables_the_layout_names() {
    let (mut store, _) = memory_store();
    let mut c = Custodian::new(p(), CustodianConfig::default(), 1);
    let mut r = Receiver::new(a(), ReceiverConfig::default());
    let all = [
        revoke_token(1),
        revoke_scope(2),
        belief(3, -1),
        belief(4, -2),
    ];
    for o in &all {
        c.issue(UnixMillis(0), o.clone()).unwrap();
    }
    persist_custodian(&mut c, &mut store, 0);
    // The agent applies the first three; the fourth never reaches it.
    for o in &all[..3] {
        r.handle_obligation(UnixMillis(1), &p(), o.clone());
    }
    for ack in persist_receiver(&mut r, &mut store) {
        c.handle_ack(UnixMillis(2), &a(), ack.ack);
    }
    persist_custodian(&mut c, &mut store, 2);
    // The fourth escalates at its deadline: its down-weight stands on the principal's side.
    c.handle_timeout(UnixMillis(1_000));
    persist_custodian(&mut c, &mut store, 1_000);

    let txn = store.db.begin_read().unwrap();
    let rows: BTreeMap<String, u64> = txn
        .list_tables()
        .unwrap()
        .map(|handle| {
            let name = redb::TableHandle::name(&handle).to_owned();
            let len = txn.open_untyped_table(handle).unwrap().len().unwrap();
            (name, len)
        })
        .filter(|(_, len)| *len > 0)
        .collect();
    let rows: Vec<(&str, u64)> = rows.iter().map(|(n, l)| (n.as_str(), *l)).collect();
    // Four obligations ended (three applied, one escalated); the principal withholds the
    // scope and stops honouring the token at issue (one governed row each), and holds the
    // escalated down-weight with its lapse; the agent holds three applied ids with their
    // expiry and log rows, one governed row per key (obligation in force, sequence, and the
    // withheld scope's state) and one for the token's record (kept for good), and the weight
    // change.
    assert_eq!(
        rows,
        vec![
            ("custodian.escalations", 1),
            ("custodian.escalations_by_time", 1),
            ("custodian.terminal", 4),
            ("custodian.terminal_by_time", 4),
            ("meta", 1),
            ("principal.adjustment_lapses", 1),
            ("principal.adjustments", 1),
            ("principal.governed", 2),
            ("receiver.applied", 3),
            ("receiver.applied_by_expiry", 3),
            ("receiver.apply_log", 3),
            ("receiver.governed", 4),
            ("receiver.weight_changes", 1),
        ]
    );
}
