//! The ledger over the node runtime: a delegating node, a child node and a gateway node over
//! QUIC on loopback, `ledger/<peer>` tracks, every step in each node's redb file. Root grant →
//! delegation to the child → the child spends through the gateway → settled; then the
//! independent checker over the three files.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use abhyasa_ledger::check::{check, EffectInstance, World};
use abhyasa_ledger::*;
use abhyasa_moq::{Ca, Identity, Signer};
use abhyasa_node::{Executor, LedgerCommand, LedgerReply, LedgerSetup, Node, NodeEvent};
use abhyasa_store::{Store, StoreConfig};
use abhyasa_wire::UnixMillis;

mod common;
use common::id;

/// One deployment for the tests of this file: a CA and the certificates of everyone who
/// signs ledger messages. A node signs with its certificate's key.
fn deployment() -> &'static BTreeMap<&'static str, Identity> {
    static D: OnceLock<BTreeMap<&'static str, Identity>> = OnceLock::new();
    D.get_or_init(|| {
        let ca = Ca::generate("ledger-test").unwrap();
        ["issuer", "root", "child", "gw"]
            .into_iter()
            .map(|n| (n, ca.issue(&id(n)).unwrap()))
            .collect()
    })
}

fn ident(n: &str) -> Identity {
    deployment()[n].clone()
}

/// `n`'s certificate key, with which its ledger messages are signed.
fn sk(n: &str) -> LedgerSigningKey {
    Signer::new(&ident(n)).unwrap().key().clone()
}

fn keys() -> Keyring {
    Keyring::new(["issuer", "root", "child", "gw"].map(|n| (id(n), sk(n).verifying_key())))
        .with_issuers([id("issuer")])
}

/// Runs every effect once, charging 7 cents, and remembers what ran.
#[derive(Default)]
struct Recorder(Mutex<Vec<EffectInstance>>);

impl Executor for Recorder {
    fn execute(&self, run: &abhyasa_ledger::Execute) -> Vector {
        let (payer, key, resume) = (&run.payer, run.key, run.resume);
        let mut ran = self.0.lock().unwrap();
        let found = ran.iter().find(|e| e.key == key && &e.payer == payer);
        if let Some(e) = found.filter(|_| resume) {
            return e.charge.clone();
        }
        let charge = Vector::of(&[("cents", 7)]).unwrap();
        ran.push(EffectInstance {
            gateway: id("gw"),
            payer: payer.clone(),
            key,
            charge: charge.clone(),
            expires: run.expires,
        });
        charge
    }
}

fn setup(executor: Option<Arc<dyn Executor>>) -> LedgerSetup {
    LedgerSetup {
        keys: keys(),
        executor,
        resend_ms: 100,
        max_journal_steps: abhyasa_ledger::BranchConfig::default().max_journal_steps,
        // Small, so the journals compact during the tests (the stores then hold a
        // checkpoint and the steps after it, and every restart starts from one).
        checkpoint_steps: 4,
        permit_ttl_ms: 60_000,
        gateway_retain_ms: Some(60_000),
    }
}

fn cents(n: u64) -> Vector {
    Vector::of(&[("cents", n)]).unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn grant_delegate_spend_settle_across_three_nodes() {
    let dir = tempfile::tempdir().unwrap();
    let recorder = Arc::new(Recorder::default());
    let gw = Node::builder(ident("gw"))
        .state_dir(dir.path().join("gw"))
        .ledger(setup(Some(recorder.clone())))
        .build()
        .await
        .unwrap();
    let child = Node::builder(ident("child"))
        .state_dir(dir.path().join("child"))
        .peer(id("gw"), gw.local_addr())
        .ledger(setup(None))
        .build()
        .await
        .unwrap();
    let root = Node::builder(ident("root"))
        .state_dir(dir.path().join("root"))
        .peer(id("child"), child.local_addr())
        .ledger(setup(None))
        .build()
        .await
        .unwrap();
    let mut child_events = child.events();

    let grant = RootGrant {
        root: RootId::from_u128(1),
        issuer: id("issuer"),
        holder: id("root"),
        budget: cents(1_000),
        label: Label::of(&["tools"]).unwrap(),
        issued_at: UnixMillis(0),
    };
    let root_credit = CreditId::from_u128(1);
    let done = root
        .ledger(LedgerCommand::Grant {
            grant: Signed::sign(&grant, &id("issuer"), &sk("issuer")),
            credit: root_credit,
        })
        .await
        .unwrap();
    assert_eq!(done, LedgerReply::Done);
    // A grant signed by someone else is refused.
    let forged = Signed::sign(&grant, &id("issuer"), &sk("root"));
    assert!(root
        .ledger(LedgerCommand::Grant {
            grant: forged,
            credit: CreditId::from_u128(2)
        })
        .await
        .is_err());

    root.ledger(LedgerCommand::Delegate {
        credit: root_credit,
        transfer: TransferId::from_u128(1),
        amount: cents(300),
        to: id("child"),
        label: Label::of(&["tools"]).unwrap(),
        // The child claims it and takes it once the root confirms (one more message).
        reclaimable: true,
    })
    .await
    .unwrap();
    // The child's credit appears once its claim is confirmed.
    let child_credit = tokio::time::timeout(Duration::from_secs(10), async {
        loop {
            match child_events.recv().await {
                Ok(NodeEvent::Ledger(LedgerEvent::CreditReceived { credit })) => break credit,
                Ok(_) => {}
                Err(e) => panic!("{e}"),
            }
        }
    })
    .await
    .expect("the transfer reached the child");

    for k in 0..5u128 {
        child
            .ledger(LedgerCommand::Spend {
                credit: child_credit,
                effect: Effect {
                    purpose: Dim::new("tools").unwrap(),
                    operation: format!("search {k}"),
                    max_charge: cents(10),
                    carried_by: None,
                },
                gateway: id("gw"),
                key: OpKey::from_u128(100 + k),
            })
            .await
            .unwrap();
    }
    let mut settled = 0;
    tokio::time::timeout(Duration::from_secs(10), async {
        while settled < 5 {
            if let Ok(NodeEvent::Ledger(LedgerEvent::Settled { actual, .. })) =
                child_events.recv().await
            {
                assert_eq!(actual, cents(7));
                settled += 1;
            }
        }
    })
    .await
    .expect("every spend settled");

    let LedgerReply::Status(s) = child.ledger(LedgerCommand::Status).await.unwrap() else {
        panic!("status")
    };
    let [a, t, r, q, c, f] = s.roots[0].1.clone();
    assert_eq!((a, c), (cents(300 - 35), cents(35)));
    assert!(t.is_zero() && r.is_zero() && q.is_zero() && f.is_zero());
    // Five spends of three steps each after the acceptance, a checkpoint every 4 steps:
    // the status counts what was folded (the buckets above read through it).
    assert!(s.folded_steps > 0 && s.ended_operations > 0, "{s:?}");
    assert!(s.journal_steps < 8, "{}", s.journal_steps);
    assert_eq!(s.gateway, None, "the child is no gateway");
    // The child took the root's transfer once its claim was confirmed.
    assert_eq!(
        s.incoming,
        vec![(TransferId::from_u128(1), id("root"), cents(300), "accepted")]
    );
    let LedgerReply::Status(rs) = root.ledger(LedgerCommand::Status).await.unwrap() else {
        panic!("status")
    };
    assert_eq!(rs.transfers[0].3, "accepted");
    assert_eq!(rs.roots[0].1[0], cents(700));
    // Confirmed: the atoms are the child's, the root cannot take them back.
    assert!(root
        .ledger(LedgerCommand::ReclaimTransfer {
            transfer: TransferId::from_u128(1),
        })
        .await
        .is_err());
    // A reclaimable transfer to a child that is lost (no node answers for it): in transit
    // until the root takes it back, without a word from the child.
    root.ledger(LedgerCommand::Delegate {
        credit: root_credit,
        transfer: TransferId::from_u128(2),
        amount: cents(100),
        to: id("lost"),
        label: Label::of(&["tools"]).unwrap(),
        reclaimable: true,
    })
    .await
    .unwrap();
    let LedgerReply::Status(rs) = root.ledger(LedgerCommand::Status).await.unwrap() else {
        panic!("status")
    };
    assert_eq!(
        (rs.roots[0].1[0].clone(), rs.roots[0].1[1].clone()),
        (cents(600), cents(100))
    );
    for _ in 0..2 {
        // Asking again is answered as done.
        root.ledger(LedgerCommand::ReclaimTransfer {
            transfer: TransferId::from_u128(2),
        })
        .await
        .unwrap();
    }
    let LedgerReply::Status(rs) = root.ledger(LedgerCommand::Status).await.unwrap() else {
        panic!("status")
    };
    assert_eq!(
        (rs.roots[0].1[0].clone(), rs.roots[0].1[1].clone()),
        (cents(700), Vector::zero())
    );
    assert_eq!(rs.transfers[1].3, "reclaimed");

    // A dispatch to a gateway that never answers stays quarantined — no timeout returns it —
    // until it is forfeited: then its atoms stay charged for good.
    let stuck = OpKey::from_u128(999);
    child
        .ledger(LedgerCommand::Spend {
            credit: child_credit,
            effect: Effect {
                purpose: Dim::new("tools").unwrap(),
                operation: "never answered".into(),
                max_charge: cents(10),
                carried_by: None,
            },
            gateway: id("nowhere"),
            key: stuck,
        })
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_millis(400)).await; // Several resend periods.
    let LedgerReply::Status(s) = child.ledger(LedgerCommand::Status).await.unwrap() else {
        panic!("status")
    };
    assert_eq!(s.roots[0].1[3], cents(10), "still quarantined");
    child
        .ledger(LedgerCommand::Forfeit { key: stuck })
        .await
        .unwrap();
    let LedgerReply::Status(s) = child.ledger(LedgerCommand::Status).await.unwrap() else {
        panic!("status")
    };
    assert_eq!(
        (s.roots[0].1[3].clone(), s.roots[0].1[5].clone()),
        (Vector::zero(), cents(10))
    );

    // Every operation of the child's credit has ended: its generation rolls over into a
    // fresh credit holding exactly what was available (300 - 5 × 7 - 10 = 255), and the
    // successor spends.
    let LedgerReply::Credit { credit: next } = child
        .ledger(LedgerCommand::Reissue {
            credit: child_credit,
        })
        .await
        .unwrap()
    else {
        panic!("reissue answers with the successor")
    };
    let again = child
        .ledger(LedgerCommand::Reissue {
            credit: child_credit,
        })
        .await
        .unwrap();
    assert_eq!(again, LedgerReply::Credit { credit: next });
    let LedgerReply::Status(s) = child.ledger(LedgerCommand::Status).await.unwrap() else {
        panic!("status")
    };
    let old = s.credits.iter().find(|c| c.id == child_credit).unwrap();
    assert!(old.closed && old.available.is_zero());
    assert_eq!(old.successor, Some(next));
    let new = s.credits.iter().find(|c| c.id == next).unwrap();
    assert_eq!((new.generation, new.available.clone()), (1, cents(255)));
    assert!(child
        .ledger(LedgerCommand::Spend {
            credit: child_credit,
            effect: Effect {
                purpose: Dim::new("tools").unwrap(),
                operation: "from the closed generation".into(),
                max_charge: cents(10),
                carried_by: None,
            },
            gateway: id("gw"),
            key: OpKey::from_u128(200),
        })
        .await
        .is_err());
    child
        .ledger(LedgerCommand::Spend {
            credit: next,
            effect: Effect {
                purpose: Dim::new("tools").unwrap(),
                operation: "from the successor".into(),
                max_charge: cents(10),
                carried_by: None,
            },
            gateway: id("gw"),
            key: OpKey::from_u128(201),
        })
        .await
        .unwrap();
    tokio::time::timeout(Duration::from_secs(10), async {
        loop {
            if let Ok(NodeEvent::Ledger(LedgerEvent::Settled { key, actual })) =
                child_events.recv().await
            {
                if key == OpKey::from_u128(201) {
                    assert_eq!(actual, cents(7));
                    break;
                }
            }
        }
    })
    .await
    .expect("the successor's spend settled");

    // The child returns what it did not use: everything available in the successor goes
    // back to the root as a sealed transfer the root accepts; asked again, answered as done.
    let back = TransferId::from_u128(900);
    for _ in 0..2 {
        child
            .ledger(LedgerCommand::ReturnRights {
                credit: next,
                transfer: back,
            })
            .await
            .unwrap();
    }
    tokio::time::timeout(Duration::from_secs(10), async {
        loop {
            let LedgerReply::Status(s) = root.ledger(LedgerCommand::Status).await.unwrap() else {
                panic!("status")
            };
            if s.incoming.iter().any(|(t, from, v, st)| {
                *t == back && *from == id("child") && *v == cents(248) && *st == "accepted"
            }) {
                break;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    })
    .await
    .expect("the root accepted the return of 248 unused cents");

    root.shutdown().await;
    child.shutdown().await;
    gw.shutdown().await;

    // The checker over the three files and what the executor ran.
    let load = |n: &str| {
        let store =
            Store::open(dir.path().join(n).join("node.redb"), StoreConfig::default()).unwrap();
        Branch::recover(
            id(n),
            sk(n),
            keys(),
            BranchConfig::default(),
            store.ledger_journal().unwrap(),
        )
        .0
    };
    let (rb, cb) = (load("root"), load("child"));
    let gstore = Store::open(
        dir.path().join("gw").join("node.redb"),
        StoreConfig::default(),
    )
    .unwrap();
    let g = Gateway::recover(id("gw"), sk("gw"), keys(), gstore.gateway_log().unwrap());
    let effects = recorder.0.lock().unwrap().clone();
    assert_eq!(effects.len(), 6, "five spends and the successor's");
    // The child (the spender) compacted: its file starts with a checkpoint that folded
    // settled operations (the checker below reads them through it).
    assert!(cb.folded_steps() > 0, "the child never checkpointed");
    assert!(cb.ended().count() > 0);
    // The root's two transfers recovered as they ended: confirmed, and reclaimed.
    let states: Vec<&str> = rb
        .outgoing()
        .map(|o| match o.state {
            OutgoingState::Accepted(_) => "accepted",
            OutgoingState::Reclaimed(_) => "reclaimed",
            _ => "other",
        })
        .collect();
    assert_eq!(states, ["accepted", "reclaimed"]);
    // The child's journal recovered: the closed generation and its successor as they were.
    assert!(cb.credit(child_credit).unwrap().closed);
    assert_eq!(cb.current(child_credit), Some(next));
    // Everything the successor had left went back to the root.
    assert!(cb.credit(next).unwrap().available.size().is_zero());
    let k = keys();
    assert_eq!(
        check(&World {
            branches: &[&rb, &cb],
            gateways: &[&g],
            effects: &effects,
            keys: &k,
        }),
        vec![]
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_journal_that_does_not_replay_stops_the_node() {
    let dir = tempfile::tempdir().unwrap();
    // A root grant in the journal signed by "root" itself, not by a trusted issuer: a budget
    // minted by a member.
    let grant = RootGrant {
        root: RootId::from_u128(3),
        issuer: id("root"),
        holder: id("root"),
        budget: cents(1_000_000),
        label: Label::of(&["tools"]).unwrap(),
        issued_at: UnixMillis(0),
    };
    let step = Step::Grant {
        grant: Signed::sign(&grant, &id("root"), &sk("root")),
        credit: CreditId::from_u128(3),
    };
    {
        std::fs::create_dir_all(dir.path()).unwrap();
        let mut store = Store::open(dir.path().join("node.redb"), StoreConfig::default()).unwrap();
        store
            .commit(&[abhyasa_store::Op::Ledger(step.clone())])
            .unwrap();
    }
    let built = Node::builder(ident("root"))
        .state_dir(dir.path())
        .ledger(setup(None))
        .build()
        .await;
    match built {
        Err(abhyasa_node::NodeError::LedgerJournal { error, .. }) => {
            assert!(matches!(error, LedgerError::Signature(_)), "{error}");
        }
        Err(e) => panic!("refused for another reason: {e}"),
        Ok(_) => panic!("a node started on a journal that does not replay"),
    }
    // The audit replays with public keys only and names the same step.
    let store = Store::open(dir.path().join("node.redb"), StoreConfig::default()).unwrap();
    let (_, rejected) = Branch::replay(id("root"), keys(), store.ledger_journal().unwrap());
    assert_eq!(rejected.len(), 1);
    assert_eq!(rejected[0].0, step);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_keyring_that_holds_another_key_for_the_node_itself_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    // The keyring says "root" signs with the child's key: every peer sharing it would refuse
    // what root signs with its certificate's key, so the node does not start.
    let mut wrong = setup(None);
    wrong.keys = Keyring::new(
        [("issuer", "issuer"), ("root", "child"), ("child", "child")]
            .map(|(n, k)| (id(n), sk(k).verifying_key())),
    )
    .with_issuers([id("issuer")]);
    let built = Node::builder(ident("root"))
        .state_dir(dir.path().join("wrong"))
        .ledger(wrong)
        .build()
        .await;
    assert!(
        matches!(built, Err(abhyasa_node::NodeError::Identity(_))),
        "{:?}",
        built.err()
    );
    let node = Node::builder(ident("root"))
        .state_dir(dir.path().join("right"))
        .ledger(setup(None))
        .build()
        .await
        .unwrap();
    node.shutdown().await;
}

/// The operator's outbox of a paying node: a gateway's refusal leaves the operation's budget
/// quarantined — one event, though the dispatch is resent and refused again and again — and
/// a forfeit charges it for good — a second; both name the operation, its gateway and what
/// stays charged; they outlast a restart until delivered, and a node that keeps no events
/// records none.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_dispatch_and_a_forfeit_reach_the_operators_outbox_once_each() {
    let dir = tempfile::tempdir().unwrap();
    let gw = Node::builder(ident("gw"))
        .state_dir(dir.path().join("gw"))
        .ledger(setup(Some(Arc::new(Recorder::default()))))
        .build()
        .await
        .unwrap();
    // Permits that never expire: a gateway that forgets settled acceptances refuses them.
    let payer = |events: bool, state: &str| {
        Node::builder(ident("root"))
            .state_dir(dir.path().join(state))
            .peer(id("gw"), gw.local_addr())
            .store(StoreConfig {
                events,
                ..StoreConfig::default()
            })
            .ledger(LedgerSetup {
                permit_ttl_ms: 0,
                ..setup(None)
            })
            .build()
    };
    let spend_refused = |node: Node, key: OpKey| async move {
        node.ledger(LedgerCommand::Grant {
            grant: Signed::sign(
                &RootGrant {
                    root: RootId::from_u128(9),
                    issuer: id("issuer"),
                    holder: id("root"),
                    budget: cents(100),
                    label: Label::of(&["tools"]).unwrap(),
                    issued_at: UnixMillis(0),
                },
                &id("issuer"),
                &sk("issuer"),
            ),
            credit: CreditId::from_u128(9),
        })
        .await
        .unwrap();
        let mut events = node.events();
        node.ledger(LedgerCommand::Spend {
            credit: CreditId::from_u128(9),
            effect: Effect {
                purpose: Dim::new("tools").unwrap(),
                operation: "refused for want of an expiry".into(),
                max_charge: cents(30),
                carried_by: None,
            },
            gateway: id("gw"),
            key,
        })
        .await
        .unwrap();
        tokio::time::timeout(Duration::from_secs(20), async {
            loop {
                if let Ok(NodeEvent::Ledger(LedgerEvent::Refused { key: k, reason })) =
                    events.recv().await
                {
                    assert_eq!((k, reason), (key, Refusal::NoExpiry));
                    return;
                }
            }
        })
        .await
        .expect("the gateway's refusal");
        // Several resends, each refused again.
        tokio::time::sleep(Duration::from_millis(500)).await;
        node
    };
    let key = OpKey::from_u128(77);
    let root = spend_refused(payer(true, "root").await.unwrap(), key).await;
    let out = root.outbox(None, 10).await.unwrap();
    assert_eq!(out.len(), 1, "{out:?}");
    assert_eq!(out[0].key, format!("quarantined-{key}"));
    assert_eq!(
        out[0].event,
        abhyasa_store::OperatorEvent::BudgetQuarantined {
            key,
            gateway: id("gw"),
            credit: CreditId::from_u128(9),
            max_charge: cents(30),
            refusal: Refusal::NoExpiry,
        }
    );
    root.ledger(LedgerCommand::Forfeit { key }).await.unwrap();
    let out = root.outbox(Some(out[0].seq), 10).await.unwrap();
    assert_eq!(out.len(), 1, "{out:?}");
    assert_eq!(out[0].key, format!("forfeited-{key}"));
    assert!(matches!(
        &out[0].event,
        abhyasa_store::OperatorEvent::BudgetForfeited { gateway, max_charge, .. }
            if *gateway == id("gw") && *max_charge == cents(30)
    ));
    // Delivered through the first: the second waits, across a restart.
    let first = out[0].seq - 1;
    root.outbox_delivered(first).await.unwrap();
    root.shutdown().await;
    let root = payer(true, "root").await.unwrap();
    let left = root.outbox(None, 10).await.unwrap();
    assert_eq!(
        left.iter().map(|e| e.key.as_str()).collect::<Vec<_>>(),
        [format!("forfeited-{key}")]
    );
    assert_eq!(root.status().await.unwrap().outbox, 1);
    root.shutdown().await;

    // The same history on a node that keeps no events: nothing recorded.
    let quiet = spend_refused(payer(false, "quiet").await.unwrap(), key).await;
    assert!(!quiet.keeps_events());
    quiet.ledger(LedgerCommand::Forfeit { key }).await.unwrap();
    assert!(quiet.outbox(None, 10).await.unwrap().is_empty());
    quiet.shutdown().await;
    gw.shutdown().await;
}
