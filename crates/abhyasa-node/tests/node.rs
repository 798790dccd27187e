//! Two nodes in one process over loopback QUIC.

mod common;

use std::time::Duration;

use abhyasa_custody::ReceiverConfig;
use abhyasa_moq::Ca;
use abhyasa_node::{Admission, Node, NodeEvent};
use abhyasa_wire::{BeliefUpdatePayload, Outcome, Payload, TokenId, WeightDelta, WeightKey};
use common::{custodian, free_addr, id, revoke};
use tokio::sync::broadcast;

async fn terminal(
    rx: &mut broadcast::Receiver<NodeEvent>,
    n: usize,
    limit: Duration,
) -> Vec<Outcome> {
    let mut out = Vec::new();
    tokio::time::timeout(limit, async {
        while out.len() < n {
            if let Ok(NodeEvent::Terminal { record, .. }) = rx.recv().await {
                out.push(record.outcome);
            }
        }
    })
    .await
    .unwrap_or_else(|_| panic!("only {} of {n} terminal events: {out:?}", out.len()));
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn obligations_are_applied_across_a_receiver_restart() {
    let dir = tempfile::tempdir().unwrap();
    let ca = Ca::generate("t").unwrap();
    let (p, a) = (id("principal"), id("agent-1"));
    let a_addr = free_addr();
    let agent = Node::builder(ca.issue(&a).unwrap())
        .listen(a_addr)
        .state_dir(dir.path().join("a"))
        .receiver(ReceiverConfig::default())
        .build()
        .await
        .unwrap();
    let principal = Node::builder(ca.issue(&p).unwrap())
        .peer(a.clone(), a_addr)
        .state_dir(dir.path().join("p"))
        .custodian(custodian())
        .build()
        .await
        .unwrap();
    let mut events = principal.events();
    for n in 1..=4 {
        let h = principal.issue(revoke(n, &a, 20_000)).await.unwrap();
        assert_eq!(h.admission(), Admission::Custody);
    }
    // A handle waits for its own outcome.
    let h = principal.issue(revoke(5, &a, 20_000)).await.unwrap();
    let (record, escalation) = tokio::time::timeout(Duration::from_secs(10), h.outcome())
        .await
        .unwrap()
        .unwrap();
    assert_eq!((record.outcome, escalation), (Outcome::Applied, None));
    // Best-effort: a reinforcing belief update.
    let mut be = revoke(6, &a, 20_000);
    be.payload = Payload::PhalaBeliefUpdate(BeliefUpdatePayload {
        weight_key: WeightKey::new("k").unwrap(),
        weight_delta: WeightDelta(10),
        ttl_ms: 1,
    });
    assert_eq!(
        principal.issue(be).await.unwrap().admission(),
        Admission::BestEffort
    );
    let outcomes = terminal(&mut events, 6, Duration::from_secs(10)).await;
    assert_eq!(
        outcomes.iter().filter(|o| **o == Outcome::Applied).count(),
        5,
        "{outcomes:?}"
    );
    assert!(outcomes.contains(&Outcome::BestEffort));

    // Restart the receiver on the same state and address; issue more while it is down.
    agent.shutdown().await;
    for n in 7..=9 {
        principal.issue(revoke(n, &a, 20_000)).await.unwrap();
    }
    let agent = Node::builder(ca.issue(&a).unwrap())
        .listen(a_addr)
        .state_dir(dir.path().join("a"))
        .build()
        .await
        .unwrap();
    let outcomes = terminal(&mut events, 3, Duration::from_secs(10)).await;
    assert!(
        outcomes.iter().all(|o| *o == Outcome::Applied),
        "{outcomes:?}"
    );
    let status = principal.status().await.unwrap();
    assert!(status.pending.is_empty());
    assert!(status.principal.is_revoked(&TokenId::new("tok-9").unwrap()));
    principal.shutdown().await;
    agent.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unreachable_agent_escalates_with_the_safe_action() {
    let dir = tempfile::tempdir().unwrap();
    let ca = Ca::generate("t").unwrap();
    let (p, z) = (id("principal"), id("agent-z"));
    let principal = Node::builder(ca.issue(&p).unwrap())
        .peer(z.clone(), free_addr())
        .state_dir(dir.path().join("p"))
        .custodian(custodian())
        .build()
        .await
        .unwrap();
    let mut events = principal.events();
    principal.issue(revoke(1, &z, 1_500)).await.unwrap();
    let escalation = tokio::time::timeout(Duration::from_secs(10), async {
        loop {
            if let Ok(NodeEvent::Terminal {
                escalation: Some(e),
                ..
            }) = events.recv().await
            {
                return e;
            }
        }
    })
    .await
    .unwrap();
    let status = principal.status().await.unwrap();
    assert!(status.principal.holds(&escalation.safe_action));
    assert_eq!(status.escalations.len(), 1);
    principal.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_agent_sees_what_it_must_honour() {
    let dir = tempfile::tempdir().unwrap();
    let ca = Ca::generate("t").unwrap();
    let (p, a) = (id("principal"), id("agent-1"));
    let agent = Node::builder(ca.issue(&a).unwrap())
        .state_dir(dir.path().join("a"))
        .build()
        .await
        .unwrap();
    let mut applied = agent.events();
    let principal = Node::builder(ca.issue(&p).unwrap())
        .peer(a.clone(), agent.local_addr())
        .state_dir(dir.path().join("p"))
        .custodian(custodian())
        .build()
        .await
        .unwrap();
    let scope = abhyasa_wire::Scope::new("calendar.read").unwrap();
    let key = WeightKey::new("supplier/acme").unwrap();
    let mut consent = revoke(1, &a, 20_000);
    consent.payload = Payload::AnumatiConsent(abhyasa_wire::ConsentPayload {
        decision: Some(abhyasa_wire::ConsentDecision::Revoke),
        scope: scope.clone(),
        expires_at: None,
    });
    let mut belief = revoke(2, &a, 20_000);
    belief.payload = Payload::PhalaBeliefUpdate(BeliefUpdatePayload {
        weight_key: key.clone(),
        weight_delta: WeightDelta(-250_000),
        ttl_ms: 60_000,
    });
    let token = revoke(3, &a, 20_000);
    let sent = [consent, belief, token];
    for o in &sent {
        let h = principal.issue(o.clone()).await.unwrap();
        let (record, _) = tokio::time::timeout(Duration::from_secs(10), h.outcome())
            .await
            .unwrap()
            .unwrap();
        assert_eq!(record.outcome, Outcome::Applied);
    }
    // Each Applied event says what the obligation is, as sent.
    let mut seen = Vec::new();
    tokio::time::timeout(Duration::from_secs(5), async {
        while seen.len() < 3 {
            if let Ok(NodeEvent::Applied {
                id,
                issuer,
                kind,
                payload,
            }) = applied.recv().await
            {
                assert_eq!(issuer, p);
                assert_eq!(kind, payload.kind());
                seen.push((id, payload));
            }
        }
    })
    .await
    .unwrap();
    for o in &sent {
        assert!(seen.contains(&(o.id, o.payload.clone())), "{seen:?}");
    }
    // And the agent's durable state answers what it honours, per principal.
    let honours = agent.honours().await.unwrap();
    assert!(honours.is_withheld(&p, &scope));
    assert!(!honours.is_withheld(&id("someone-else"), &scope));
    // The change holds now and lapses `ttl_ms` after the update's creation.
    assert_eq!(honours.weight(&p, &key, agent.now()), -250_000);
    let lapse = sent[1].created_at.saturating_add(60_000);
    assert_eq!(honours.weight(&p, &key, lapse), 0);
    assert!(honours.is_dropped(&TokenId::new("tok-3").unwrap()));
    assert!(!honours.is_dropped(&TokenId::new("tok-4").unwrap()));
    principal.shutdown().await;
    agent.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_handle_gets_its_own_outcome_however_many_wait_and_a_reissue_gets_the_first() {
    let dir = tempfile::tempdir().unwrap();
    let ca = Ca::generate("t").unwrap();
    let (p, a) = (id("principal"), id("agent-1"));
    let a_addr = free_addr();
    let agent = Node::builder(ca.issue(&a).unwrap())
        .listen(a_addr)
        .state_dir(dir.path().join("a"))
        .build()
        .await
        .unwrap();
    let principal = Node::builder(ca.issue(&p).unwrap())
        .peer(a.clone(), a_addr)
        .state_dir(dir.path().join("p"))
        .custodian(custodian())
        .build()
        .await
        .unwrap();
    // 2,000 handles wait at once; each is answered with its own record.
    let mut handles = Vec::new();
    for n in 1..=2_000u128 {
        handles.push(principal.issue(revoke(n, &a, 60_000)).await.unwrap());
    }
    let waits: Vec<_> = handles
        .into_iter()
        .map(|h| {
            let id = h.id();
            tokio::spawn(async move { (id, h.outcome().await) })
        })
        .collect();
    for w in waits {
        let (id, got) = tokio::time::timeout(Duration::from_secs(60), w)
            .await
            .expect("answered")
            .unwrap();
        let (record, _) = got.expect("an outcome");
        assert_eq!(record.obligation_id, id);
        assert_eq!(record.outcome, Outcome::Applied);
    }
    // Issuing an id that already ended answers with that end at once.
    let again = principal.issue(revoke(7, &a, 60_000)).await.unwrap();
    let (record, _) = tokio::time::timeout(Duration::from_secs(5), again.outcome())
        .await
        .expect("answered at once")
        .expect("an outcome");
    assert_eq!(
        record.obligation_id,
        abhyasa_wire::ObligationId::from_u128(7)
    );
    assert_eq!(record.outcome, Outcome::Applied);
    principal.shutdown().await;
    agent.shutdown().await;
}

/// Obligations issued together leave in groups (one stream per peer for what is ready at
/// once), and so do the agent's acks; `objects_per_group = 1` sends one object per group.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn what_is_ready_at_once_leaves_in_groups_up_to_the_limit() {
    for per_group in [64usize, 1] {
        let dir = tempfile::tempdir().unwrap();
        let ca = Ca::generate("t").unwrap();
        let (p, a) = (id("principal"), id("agent-1"));
        let limits = abhyasa_node::Limits {
            session: abhyasa_moq::SessionLimits {
                max_objects_per_group: per_group,
                ..abhyasa_moq::SessionLimits::default()
            },
            ..abhyasa_node::Limits::default()
        };
        let a_addr = free_addr();
        let agent = Node::builder(ca.issue(&a).unwrap())
            .listen(a_addr)
            .state_dir(dir.path().join("a"))
            .limits(limits)
            .build()
            .await
            .unwrap();
        let principal = std::sync::Arc::new(
            Node::builder(ca.issue(&p).unwrap())
                .peer(a.clone(), a_addr)
                .state_dir(dir.path().join("p"))
                .custodian(custodian())
                .limits(limits)
                .build()
                .await
                .unwrap(),
        );
        // One first, so the session is up before the burst.
        let h = principal.issue(revoke(1, &a, 60_000)).await.unwrap();
        assert_eq!(h.outcome().await.unwrap().0.outcome, Outcome::Applied);
        let n = 300u128;
        let tasks: Vec<_> = (2..2 + n)
            .map(|k| {
                let (principal, o) = (principal.clone(), revoke(k, &a, 60_000));
                tokio::spawn(async move {
                    let h = principal.issue(o).await.unwrap();
                    h.outcome().await.unwrap().0.outcome
                })
            })
            .collect();
        for t in tasks {
            let got = tokio::time::timeout(Duration::from_secs(60), t)
                .await
                .expect("answered")
                .unwrap();
            assert_eq!(got, Outcome::Applied);
        }
        let (ps, agent_status) = (
            principal.status().await.unwrap(),
            agent.status().await.unwrap(),
        );
        let (sent, acked) = (ps.sent, agent_status.sent);
        // Every write the custody needed went through a counted, timed commit: the pending
        // and terminal record of each obligation at the principal, its apply at the agent.
        let (pc, ac) = (ps.commits, agent_status.commits);
        assert!(pc.ops >= 2 * (n as u64 + 1), "principal commits: {pc:?}");
        assert!(ac.ops > n as u64, "agent commits: {ac:?}");
        for c in [pc, ac] {
            assert!(c.count >= 1 && c.count <= c.ops, "{c:?}");
            assert!(c.busy > Duration::ZERO, "{c:?}");
        }
        println!("objects_per_group {per_group}: obligations {sent:?}, acks {acked:?}");
        assert!(sent.objects > n as u64, "obligations sent: {sent:?}");
        assert!(acked.objects > n as u64, "acks sent: {acked:?}");
        if per_group == 1 {
            assert_eq!(sent.groups, sent.objects, "one obligation per group");
            assert_eq!(acked.groups, acked.objects, "one ack per group");
        } else {
            assert!(
                sent.groups * 4 <= sent.objects,
                "obligations issued together left one by one: {sent:?}"
            );
            assert!(
                acked.groups * 2 <= acked.objects,
                "acks committed together left one by one: {acked:?}"
            );
        }
        if let Ok(p) = std::sync::Arc::try_unwrap(principal) {
            p.shutdown().await;
        }
        agent.shutdown().await;
    }
}
