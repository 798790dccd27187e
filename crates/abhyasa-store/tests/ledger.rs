//! The ledger journal and the gateway log survive reopening, replay to the same state, and a
//! damaged record is a typed error, not a panic or a silent skip.

use abhyasa_ledger::check::{check, EffectInstance, World};
use abhyasa_ledger::*;
use abhyasa_store::{Op, Store, StoreConfig, StoreError};
use abhyasa_wire::{AgentId, UnixMillis};

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

#[test]
fn a_settled_cycle_replays_from_disk() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("node.redb");
    let mut store = Store::open(&path, StoreConfig::default()).unwrap();
    let mut r = Branch::new(
        id("r"),
        signing_key([2; 32]),
        keys(),
        BranchConfig::default(),
    );
    let mut g = Gateway::new(id("g"), signing_key([3; 32]), keys());
    let grant = RootGrant {
        root: RootId::from_u128(1),
        issuer: id("issuer"),
        holder: id("r"),
        budget: Vector::of(&[("cents", 1_000), ("calls", 3)]).unwrap(),
        label: Label::of(&["tools"]).unwrap(),
        issued_at: UnixMillis(0),
    };
    let credit = CreditId::from_u128(1);
    r.grant(
        Signed::sign(&grant, &id("issuer"), &signing_key([1; 32])),
        credit,
    )
    .unwrap();
    let effect = Effect {
        purpose: Dim::new("tools").unwrap(),
        operation: "search".into(),
        max_charge: Vector::of(&[("cents", 1_000), ("calls", 3)]).unwrap(),
        carried_by: None,
    };
    let key = OpKey::from_u128(9);
    r.reserve(UnixMillis(0), credit, effect, &id("g"), key)
        .unwrap();
    r.dispatch(UnixMillis(0), key).unwrap();
    let persist_branch = |r: &mut Branch, store: &mut Store| {
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
    };
    persist_branch(&mut r, &mut store);
    let (_, permit) = r.poll_transmit().unwrap();
    g.handle_message(UnixMillis(0), &id("r"), permit);
    let persist_gateway = |g: &mut Gateway, store: &mut Store| {
        while let Some((t, rec)) = g.poll_persist() {
            store.commit(&[Op::Gateway(rec)]).unwrap();
            g.handle_persisted(t);
        }
    };
    persist_gateway(&mut g, &mut store);
    let exec = g.poll_execute().unwrap();
    let charge = Vector::of(&[("cents", 730), ("calls", 1)]).unwrap();
    g.handle_executed(&exec.payer, exec.key, charge.clone());
    persist_gateway(&mut g, &mut store);
    let (_, receipt) = g.poll_transmit().unwrap();
    r.handle_message(UnixMillis(1), &id("g"), receipt);
    persist_branch(&mut r, &mut store);
    drop(store);

    let store = Store::open(&path, StoreConfig::default()).unwrap();
    let journal = store.ledger_journal().unwrap();
    assert_eq!(journal.len() as u64, r.journal_len());
    let (back, rejected) = Branch::recover(
        id("r"),
        signing_key([2; 32]),
        keys(),
        BranchConfig::default(),
        journal,
    );
    assert!(rejected.is_empty());
    let root = RootId::from_u128(1);
    assert_eq!(back.buckets(root), r.buckets(root));
    assert_eq!(
        back.buckets(root)[4],
        Vector::of(&[("cents", 730), ("calls", 1)]).unwrap()
    );
    let gback = Gateway::recover(
        id("g"),
        signing_key([3; 32]),
        keys(),
        store.gateway_log().unwrap(),
    );
    let effects = [EffectInstance {
        gateway: id("g"),
        payer: exec.payer.clone(),
        key,
        charge,
        expires: exec.expires,
    }];
    let k = keys();
    let found = check(&World {
        branches: &[&back],
        gateways: &[&gback],
        effects: &effects,
        keys: &k,
    });
    assert_eq!(found, vec![]);
}

#[test]
fn a_damaged_journal_record_is_a_typed_error() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("node.redb");
    let store = Store::open(&path, StoreConfig::default()).unwrap();
    drop(store);
    {
        let db = redb::Database::open(&path).unwrap();
        let txn = db.begin_write().unwrap();
        {
            let def: redb::TableDefinition<'_, u64, &[u8]> =
                redb::TableDefinition::new("ledger.journal");
            let mut t = txn.open_table(def).unwrap();
            t.insert(0, [0xa1u8, 0x63, b'b', b'a', b'd', 0x01].as_slice())
                .unwrap();
        }
        txn.commit().unwrap();
    }
    let store = Store::open(&path, StoreConfig::default()).unwrap();
    match store.ledger_journal() {
        Err(StoreError::Corrupt { table, .. }) => assert_eq!(table, "ledger.journal"),
        other => panic!("{other:?}"),
    }
}

/// A root grant of 1,000 cents to `r` in credit 1.
fn granted() -> Branch {
    let mut r = Branch::new(
        id("r"),
        signing_key([2; 32]),
        keys(),
        BranchConfig::default(),
    );
    let grant = RootGrant {
        root: RootId::from_u128(1),
        issuer: id("issuer"),
        holder: id("r"),
        budget: Vector::of(&[("cents", 1_000)]).unwrap(),
        label: Label::of(&["tools"]).unwrap(),
        issued_at: UnixMillis(0),
    };
    r.grant(
        Signed::sign(&grant, &id("issuer"), &signing_key([1; 32])),
        CreditId::from_u128(1),
    )
    .unwrap();
    r
}

/// One reserve → dispatch → accept → execute (charging `charge` of 10) → settle cycle;
/// the branch's steps are left queued, the gateway's records written.
fn cycle(r: &mut Branch, g: &mut Gateway, store: &mut Store, k: u128, charge: u64) {
    let effect = Effect {
        purpose: Dim::new("tools").unwrap(),
        operation: format!("op-{k}"),
        max_charge: Vector::of(&[("cents", 10)]).unwrap(),
        carried_by: None,
    };
    let key = OpKey::from_u128(k);
    r.reserve(UnixMillis(0), CreditId::from_u128(1), effect, &id("g"), key)
        .unwrap();
    r.dispatch(UnixMillis(0), key).unwrap();
    // Messages wait for durability: write what is queued so far.
    let flush = |r: &mut Branch, store: &mut Store| {
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
    };
    flush(r, store);
    let (_, permit) = r.poll_transmit().unwrap();
    g.handle_message(UnixMillis(0), &id("r"), permit);
    let persist_gateway = |g: &mut Gateway, store: &mut Store| {
        while let Some((t, rec)) = g.poll_persist() {
            store.commit(&[Op::Gateway(rec)]).unwrap();
            g.handle_persisted(t);
        }
    };
    persist_gateway(g, store);
    let exec = g.poll_execute().unwrap();
    g.handle_executed(
        &exec.payer,
        exec.key,
        Vector::of(&[("cents", charge)]).unwrap(),
    );
    persist_gateway(g, store);
    let (_, receipt) = g.poll_transmit().unwrap();
    r.handle_message(UnixMillis(1), &id("g"), receipt);
}

#[test]
fn a_checkpoint_compacts_the_journal_in_the_commit_that_writes_it() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("node.redb");
    let mut store = Store::open(&path, StoreConfig::default()).unwrap();
    let mut r = granted();
    let mut g = Gateway::new(id("g"), signing_key([3; 32]), keys());
    for k in 1..=20 {
        cycle(&mut r, &mut g, &mut store, k, 3);
    }
    // The last settlement, the checkpoint and one more reservation go in one commit, in
    // that order: the checkpoint must stand for the settlement, not drop it.
    r.checkpoint().unwrap();
    let effect = Effect {
        purpose: Dim::new("tools").unwrap(),
        operation: "after".into(),
        max_charge: Vector::of(&[("cents", 10)]).unwrap(),
        carried_by: None,
    };
    r.reserve(
        UnixMillis(0),
        CreditId::from_u128(1),
        effect,
        &id("g"),
        OpKey::from_u128(99),
    )
    .unwrap();
    let mut ops = Vec::new();
    while let Some((_, s)) = r.poll_persist() {
        ops.push(Op::Ledger(s));
    }
    assert_eq!(ops.len(), 3, "settle, checkpoint, reserve");
    store.commit(&ops).unwrap();
    drop(store);

    let store = Store::open(&path, StoreConfig::default()).unwrap();
    let journal = store.ledger_journal().unwrap();
    assert_eq!(journal.len(), 2, "the checkpoint and the step after it");
    assert!(matches!(journal[0], Step::Checkpoint(_)));
    assert!(matches!(journal[1], Step::Reserve { .. }));
    let (back, rejected) = Branch::recover(
        id("r"),
        signing_key([2; 32]),
        keys(),
        BranchConfig::default(),
        journal,
    );
    assert!(rejected.is_empty(), "{rejected:?}");
    // 20 cycles charged 3 each: 60 committed; 10 reserved; 930 available.
    let root = RootId::from_u128(1);
    let b = back.buckets(root);
    assert_eq!(b[0], Vector::of(&[("cents", 930)]).unwrap());
    assert_eq!(b[2], Vector::of(&[("cents", 10)]).unwrap());
    assert_eq!(b[4], Vector::of(&[("cents", 60)]).unwrap());
    assert_eq!(back.ended().count(), 20);
    // One grant, 20 × (reserve, dispatch, settle) folded.
    assert_eq!(back.folded_steps(), 61);
    let gback = Gateway::recover(
        id("g"),
        signing_key([3; 32]),
        keys(),
        store.gateway_log().unwrap(),
    );
    let effects: Vec<EffectInstance> = (1..=20)
        .map(|k| EffectInstance {
            gateway: id("g"),
            payer: id("r"),
            key: OpKey::from_u128(k),
            charge: Vector::of(&[("cents", 3)]).unwrap(),
            expires: None,
        })
        .collect();
    let k = keys();
    let found = check(&World {
        branches: &[&back],
        gateways: &[&gback],
        effects: &effects,
        keys: &k,
    });
    assert_eq!(found, vec![]);
}

#[test]
fn a_damaged_checkpoint_is_a_typed_error() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("node.redb");
    let mut store = Store::open(&path, StoreConfig::default()).unwrap();
    let mut r = granted();
    r.checkpoint().unwrap();
    let ops: Vec<Op> =
        std::iter::from_fn(|| r.poll_persist().map(|(_, s)| Op::Ledger(s))).collect();
    store.commit(&ops).unwrap();
    drop(store);
    {
        let db = redb::Database::open(&path).unwrap();
        let txn = db.begin_write().unwrap();
        {
            let def: redb::TableDefinition<'_, u64, &[u8]> =
                redb::TableDefinition::new("ledger.checkpoint");
            let mut t = txn.open_table(def).unwrap();
            let mut row = redb::ReadableTable::get(&t, 0)
                .unwrap()
                .unwrap()
                .value()
                .to_vec();
            row.truncate(row.len() / 2);
            t.insert(0, row.as_slice()).unwrap();
        }
        txn.commit().unwrap();
    }
    let store = Store::open(&path, StoreConfig::default()).unwrap();
    match store.ledger_journal() {
        Err(StoreError::Corrupt { table, .. }) => assert_eq!(table, "ledger.checkpoint"),
        other => panic!("{other:?}"),
    }
}

#[test]
fn a_gateway_checkpoint_compacts_the_log() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("node.redb");
    let mut store = Store::open(&path, StoreConfig::default()).unwrap();
    let mut r = granted();
    let mut g = Gateway::new(id("g"), signing_key([3; 32]), keys());
    for k in 1..=20 {
        cycle(&mut r, &mut g, &mut store, k, 3);
    }
    assert_eq!(
        store.gateway_log().unwrap().len(),
        40,
        "20 acceptances, 20 receipts"
    );
    assert_eq!(g.checkpoint(), 40);
    let ops: Vec<Op> =
        std::iter::from_fn(|| g.poll_persist().map(|(_, rec)| Op::Gateway(rec))).collect();
    store.commit(&ops).unwrap();
    drop(store);
    let store = Store::open(&path, StoreConfig::default()).unwrap();
    let log = store.gateway_log().unwrap();
    assert!(matches!(log.as_slice(), [GatewayRecord::Checkpoint(_)]));
    let back = Gateway::recover_checked(id("g"), signing_key([3; 32]), keys(), log).unwrap();
    assert_eq!(back.folded_records(), 40);
    let done = back
        .log()
        .filter(|(_, a)| matches!(a.state, AcceptanceState::Done(_)))
        .count();
    assert_eq!(done, 20);
}
