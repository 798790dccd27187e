//! `abhyasa check --state NAME=DIR …` over stopped nodes: clean after a real run, and each
//! kind of damage an audit must see — a safe action not in force, an id applied twice, an
//! apply its principal never issued — found and reported with a non-zero exit.

use std::path::Path;
use std::time::Duration;

use abhyasa::custody::{CustodianConfig, ReceiverEffect, ReceiverRecord};
use abhyasa::moq::Ca;
use abhyasa::node::Node;
use abhyasa::store::{Op, Store, StoreConfig};
use abhyasa::wire::{Obligation, Outcome, Payload, UnixMillis};

mod common;
use abhyasa_testkit::{id, now_ms, obligation, token_revocation};
use common::{abhyasa, free_udp};

fn token(n: u128, target: &str, deadline_ms: u64) -> Obligation {
    let payload = token_revocation(&format!("tok-{n}"));
    obligation(n, &id("principal"), &id(target), deadline_ms, 30, payload)
}

/// A principal, an agent that applies three revocations, and one to an agent that never
/// comes up (escalated at its deadline): both stopped.
async fn run(dir: &Path) {
    let ca = Ca::generate("t").unwrap();
    let agent = Node::builder(ca.issue(&id("agent-1")).unwrap())
        .state_dir(dir.join("agent-1"))
        .build()
        .await
        .unwrap();
    let principal = Node::builder(ca.issue(&id("principal")).unwrap())
        .peer(id("agent-1"), agent.local_addr())
        .peer(id("agent-2"), free_udp())
        .state_dir(dir.join("principal"))
        .custodian(CustodianConfig {
            response_timeout_ms: 150,
            backoff_base_ms: 50,
            backoff_cap_ms: 300,
            ..CustodianConfig::default()
        })
        .build()
        .await
        .unwrap();
    let mut handles = Vec::new();
    for n in 1..=3 {
        handles.push(principal.issue(token(n, "agent-1", 20_000)).await.unwrap());
    }
    handles.push(principal.issue(token(4, "agent-2", 800)).await.unwrap());
    let mut outcomes = Vec::new();
    for h in handles {
        let (r, _) = tokio::time::timeout(Duration::from_secs(10), h.outcome())
            .await
            .unwrap()
            .unwrap();
        outcomes.push(r.outcome);
    }
    assert_eq!(&outcomes[..3], &[Outcome::Applied; 3]);
    assert!(matches!(outcomes[3], Outcome::Escalated(_)));
    principal.shutdown().await;
    agent.shutdown().await;
}

fn check(dir: &Path) -> (bool, String) {
    let p = format!("principal={}", dir.join("principal").display());
    let a = format!("agent-1={}", dir.join("agent-1").display());
    let out = abhyasa(&["check", "--state", &p, "--state", &a]);
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
    )
}

fn open(dir: &Path, node: &str) -> Store {
    Store::open(dir.join(node).join("node.redb"), StoreConfig::default()).unwrap()
}

fn apply_record(o: &Obligation, at: u64) -> Op {
    let Payload::OauthToken(t) = &o.payload else {
        unreachable!()
    };
    Op::Receiver(ReceiverRecord::Apply {
        id: o.id,
        issuer: o.issuer.clone(),
        obligation: Box::new(o.clone()),
        at: UnixMillis(at),
        expires: UnixMillis(o.deadline.0 + 60_000),
        sequence: None,
        effect: ReceiverEffect::DropToken(t.token_id.clone(), t.expires_at),
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_clean_run_passes_and_each_damage_is_found() {
    let dir = tempfile::tempdir().unwrap();
    run(dir.path()).await;
    let (ok, out) = check(dir.path());
    assert!(ok, "{out}");
    assert!(
        out.contains("applied=3 declined=0 escalated=1") && out.contains("applies=3"),
        "{out}"
    );
    assert!(out.contains("double_applied=0 violations=0"), "{out}");

    // C4: the agent's log shows obligation 2 applied a second time.
    {
        let mut s = open(dir.path(), "agent-1");
        s.commit(&[apply_record(&token(2, "agent-1", 20_000), now_ms())])
            .unwrap();
    }
    let (ok, out) = check(dir.path());
    assert!(!ok, "{out}");
    assert!(out.contains("violation: C4 agent-1:"), "{out}");
    assert!(out.contains("double_applied=1"), "{out}");

    // C5: an apply of an obligation the principal never issued.
    {
        let mut s = open(dir.path(), "agent-1");
        s.commit(&[apply_record(&token(99, "agent-1", 20_000), now_ms())])
            .unwrap();
    }
    let (_, out) = check(dir.path());
    assert!(out.contains("violation: C5 agent-1: applied"), "{out}");

    // C3: the escalation's safe action (stop honouring tok-4) removed from the principal.
    {
        let db = redb::Database::open(dir.path().join("principal").join("node.redb")).unwrap();
        let txn = db.begin_write().unwrap();
        {
            // The principal's revocation of a token: its governed row under no party.
            type Row = (Option<u64>, Option<u128>, &'static [u8]);
            let def: redb::TableDefinition<'_, (u8, &str, &str), Row> =
                redb::TableDefinition::new("principal.governed");
            let mut t = txn.open_table(def).unwrap();
            assert!(
                t.remove((2, "", "tok-4")).unwrap().is_some(),
                "the safe action was on disk"
            );
        }
        txn.commit().unwrap();
    }
    let (ok, out) = check(dir.path());
    assert!(!ok);
    assert!(
        out.contains("violation: C3 principal:") && out.contains("stopped honouring token tok-4"),
        "{out}"
    );
}
