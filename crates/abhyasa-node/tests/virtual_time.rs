//! The driver under virtual time: a node on tokio's paused clock runs through thousands of
//! virtual seconds of steady traffic (a request every 100 ms, faster than any of its
//! periods), and every timer still fires on time — custody deadlines and retries, the
//! ledger's periodic timeout (here: the gateway forgetting settled acceptances), permit
//! expiry, maintenance.
//!
//! A loop that made its sleep anew on every pass and raced it against the traffic never
//! reached the ledger's timeout (its 500 ms period never elapsed between two requests): the
//! gateway's clock stood still, and a permit that had expired was accepted. This file fails
//! against that loop.

mod common;

use std::time::Duration;

use abhyasa_ledger::{
    Branch, BranchConfig, CreditId, Dim, Effect, Keyring, Label, LedgerMessage, LedgerSigningKey,
    OpKey, Permit, Refusal, RootGrant, RootId, Signed, Vector,
};
use abhyasa_moq::{Ca, Identity, Signer};
use abhyasa_node::ledger::GatewayAnswer;
use abhyasa_node::{LedgerCommand, LedgerReply, LedgerSetup, Node};
use abhyasa_wire::{EscalationCause, Obligation, Outcome, UnixMillis};
use common::{free_addr, id};

const TICK: Duration = Duration::from_millis(100);
const PERMIT_TTL_MS: u64 = 10_000;
const RETAIN_MS: u64 = 60_000;
const RESEND_MS: u64 = 500;

struct Deployment {
    node: Identity,
    payer: Identity,
    issuer: Identity,
}

fn deployment() -> Deployment {
    let ca = Ca::generate("virtual-time").unwrap();
    Deployment {
        node: ca.issue(&id("node")).unwrap(),
        payer: ca.issue(&id("payer")).unwrap(),
        issuer: ca.issue(&id("issuer")).unwrap(),
    }
}

fn key(who: &Identity) -> LedgerSigningKey {
    Signer::new(who).unwrap().key().clone()
}

fn keyring(d: &Deployment) -> Keyring {
    Keyring::new([
        (id("node"), key(&d.node).verifying_key()),
        (id("payer"), key(&d.payer).verifying_key()),
        (id("issuer"), key(&d.issuer).verifying_key()),
    ])
    .with_issuers([id("issuer")])
}

const CREDIT: CreditId = CreditId::from_u128(1);

fn cents(n: u64) -> Vector {
    Vector::of(&[("cents", n)]).unwrap()
}

/// The payer's branch (pure, in the test), holding 1,000 cents, signing permits that expire
/// `PERMIT_TTL_MS` after its clock.
fn payer_branch(d: &Deployment, now: UnixMillis) -> Branch {
    let config = BranchConfig {
        permit_ttl_ms: PERMIT_TTL_MS,
        ..BranchConfig::default()
    };
    let mut b = Branch::new(id("payer"), key(&d.payer), keyring(d), config);
    b.handle_timeout(now); // The branch's clock reads `now`.
    let grant = RootGrant {
        root: RootId::from_u128(7),
        issuer: id("issuer"),
        holder: id("payer"),
        budget: cents(1_000),
        label: Label::of(&["travel"]).unwrap(),
        issued_at: UnixMillis(0),
    };
    b.grant(Signed::sign(&grant, &grant.issuer, &key(&d.issuer)), CREDIT)
        .unwrap();
    settle(&mut b);
    b
}

fn settle(b: &mut Branch) {
    while let Some((t, _)) = b.poll_persist() {
        b.handle_persisted(t);
    }
}

fn effect(n: u64) -> Effect {
    Effect {
        purpose: Dim::new("travel").unwrap(),
        operation: format!("book flight {n}"),
        max_charge: cents(5),
        carried_by: None,
    }
}

/// A permit for effect `n`, signed at `now` by the payer's branch.
fn permit(b: &mut Branch, now: UnixMillis, n: u64) -> (Signed<Permit>, Effect) {
    let k = OpKey::from_u128(u128::from(n));
    b.reserve(now, CREDIT, effect(n), &id("node"), k).unwrap();
    b.dispatch(now, k).unwrap();
    settle(b);
    let p = std::iter::from_fn(|| b.poll_transmit())
        .find_map(|(_, m)| match m {
            LedgerMessage::Dispatch { permit, .. } => Some(permit),
            _ => None,
        })
        .expect("a durable reservation is dispatched");
    (p, effect(n))
}

/// A revocation to `agent-z` (nothing listens at its address), due in `deadline_ms` by the
/// node's clock, with a budget large enough that the deadline binds.
fn revoke(node: &Node, n: u128, deadline_ms: u64) -> Obligation {
    let t = node.now();
    let payload = abhyasa_testkit::token_revocation(&format!("tok-{n}"));
    Obligation {
        created_at: t,
        deadline: t.saturating_add(deadline_ms),
        ..abhyasa_testkit::obligation(n, &id("node"), &id("agent-z"), deadline_ms, 1_000, payload)
    }
}

/// The executor of effects nobody runs in person (none here: every accepted dispatch is run
/// by the test and reported with `gateway_executed`).
struct ChargesItsMaximum;

impl abhyasa_node::Executor for ChargesItsMaximum {
    fn execute(&self, run: &abhyasa_ledger::Execute) -> Vector {
        run.max_charge.clone()
    }
}

async fn gateway_status(node: &Node) -> abhyasa_node::LedgerStatus {
    match node.ledger(LedgerCommand::Status).await.unwrap() {
        LedgerReply::Status(s) => *s,
        r => panic!("{r:?}"),
    }
}

/// Steady traffic for `span`: a status request every `TICK` of virtual time.
async fn steady_traffic(node: &Node, span: Duration) {
    let end = tokio::time::Instant::now() + span;
    while tokio::time::Instant::now() < end {
        node.status().await.unwrap();
        tokio::time::sleep(TICK).await;
    }
}

#[tokio::test(start_paused = true)]
async fn every_timer_fires_on_time_under_steady_traffic() {
    let d = deployment();
    let dir = tempfile::tempdir().unwrap();
    let node = Node::builder(d.node.clone())
        .state_dir(dir.path().join("node"))
        .peer(id("agent-z"), free_addr())
        .custodian(common::custodian())
        .maintenance(Duration::from_secs(30))
        .paused_clock(true)
        .ledger(LedgerSetup {
            keys: keyring(&d),
            executor: Some(std::sync::Arc::new(ChargesItsMaximum)),
            resend_ms: RESEND_MS,
            max_journal_steps: BranchConfig::default().max_journal_steps,
            checkpoint_steps: BranchConfig::default().checkpoint_steps,
            permit_ttl_ms: PERMIT_TTL_MS,
            gateway_retain_ms: Some(RETAIN_MS),
        })
        .build()
        .await
        .unwrap();
    let start = node.now();
    let mut payer = payer_branch(&d, start);

    // 1. A permit that expired before this gateway ever had a timeout is refused: the
    //    gateway judges it against the time it arrives.
    let an_hour_ago = UnixMillis(start.0 - 3_600_000);
    let (stale, stale_effect) = permit(&mut payer_branch(&d, an_hour_ago), an_hour_ago, 1);
    match node
        .gateway_dispatch(id("payer"), stale, stale_effect)
        .await
        .unwrap()
    {
        GatewayAnswer::Refused(Refusal::Expired) => {}
        a => panic!("a permit an hour past its expiry: {a:?}"),
    }

    // 2. A fresh permit runs and settles.
    let (p, e) = permit(&mut payer, node.now(), 2);
    let GatewayAnswer::Run(x) = node.gateway_dispatch(id("payer"), p, e).await.unwrap() else {
        panic!("a fresh permit is accepted");
    };
    node.gateway_executed(x.payer, x.key, cents(5))
        .await
        .unwrap();
    let settled_at = node.now();

    // 3. Custody: obligations to an agent that never answers, each escalating at its
    //    deadline while the traffic goes on.
    let mut handles = Vec::new();
    for n in 0..5u128 {
        let o = revoke(&node, 100 + n, 3_000 + 1_000 * n as u64);
        let deadline = o.deadline;
        handles.push((deadline, node.issue(o).await.unwrap()));
    }

    // 4. A permit signed now, held back past its expiry, under steady traffic.
    let (late, late_effect) = permit(&mut payer, node.now(), 3);
    steady_traffic(&node, Duration::from_millis(PERMIT_TTL_MS + 2_000)).await;
    match node
        .gateway_dispatch(id("payer"), late, late_effect)
        .await
        .unwrap()
    {
        GatewayAnswer::Refused(Refusal::Expired) => {}
        a => panic!("a permit 2 s past its expiry under steady traffic: {a:?}"),
    }

    for (deadline, h) in handles {
        let (record, escalation) = h.outcome().await.expect("node running");
        assert_eq!(
            record.outcome,
            Outcome::Escalated(EscalationCause::Deadline),
            "{record:?}"
        );
        assert!(
            record.at >= deadline && record.at.0 <= deadline.0 + 250,
            "escalated at {} for a deadline of {}: late by {} ms",
            record.at.0,
            deadline.0,
            record.at.0.saturating_sub(deadline.0)
        );
        // Retries went on while the traffic did: response timeout 150 ms, backoff up to
        // 300 ms — over 3 s, at least six attempts.
        assert!(record.attempts >= 6, "{record:?}");
        assert!(escalation.is_some());
    }

    // 5. The ledger's timeout ran on its period under steady traffic: the settled acceptance
    //    is forgotten once its permit has been expired for the retention.
    let before = gateway_status(&node).await;
    assert_eq!(
        before.accepted,
        vec![(OpKey::from_u128(2), true)],
        "kept within the retention"
    );
    steady_traffic(
        &node,
        Duration::from_millis(PERMIT_TTL_MS + RETAIN_MS + 5_000),
    )
    .await;
    let after = gateway_status(&node).await;
    assert!(
        after.accepted.is_empty(),
        "a settled acceptance {} s past its permit's expiry is still kept: the gateway's \
         timeout did not run under steady traffic",
        (node.now().0 - settled_at.0 - PERMIT_TTL_MS) / 1_000
    );
    let (horizon, _) = after.gateway.expect("a gateway");
    // Forgotten as soon as due: the horizon passed the permit's expiry within a resend
    // period or so of the retention running out, and is never ahead of the clock.
    let expiry = settled_at.0 + PERMIT_TTL_MS;
    assert!(
        horizon.0 > expiry.saturating_sub(1_000) && horizon.0 + RETAIN_MS <= node.now().0,
        "horizon {} for a permit expiring at {expiry}, clock {}",
        horizon.0,
        node.now().0
    );

    // 6. A long run: a thousand virtual seconds more of traffic, obligations still end on
    //    time, and maintenance keeps running (the node answers throughout).
    for round in 0..10u128 {
        let o = revoke(&node, 1_000 + round, 2_000);
        let deadline = o.deadline;
        let h = node.issue(o).await.unwrap();
        steady_traffic(&node, Duration::from_secs(100)).await;
        let (record, _) = h.outcome().await.expect("node running");
        assert_eq!(
            record.outcome,
            Outcome::Escalated(EscalationCause::Deadline)
        );
        assert!(
            record.at >= deadline && record.at.0 <= deadline.0 + 250,
            "round {round}: escalated {} ms after its deadline",
            record.at.0.saturating_sub(deadline.0)
        );
    }
    assert!(node.now().0 - start.0 >= 1_000_000, "virtual time ran");
    node.shutdown().await;
}
