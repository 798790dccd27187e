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
    let mut g = Gateway::new(id("g"), signing_key([3; 32]), keys(), None);
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
    };
    let key = OpKey::from_u128(9);
    r.reserve(credit, effect, &id("g"), key).unwrap();
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
    g.handle_message(&id("r"), permit);
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
        None,
        store.gateway_log().unwrap(),
    );
    let effects = [EffectInstance {
        gateway: id("g"),
        payer: exec.payer.clone(),
        key,
        charge,
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
