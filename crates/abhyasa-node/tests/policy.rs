//! The agent decides (`NodeBuilder::policy`): a policy given each obligation the agent would
//! apply. Apply, decline in its own words (the principal records it and its safe action
//! stands), defer (custody stays; asked again), and a policy too slow to answer defers.

mod common;

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;
use std::time::Duration;

use abhyasa_moq::Ca;
use abhyasa_node::{Node, Policy, PolicyDecision};
use abhyasa_wire::{DeclineReason, Detail, Outcome, Payload, TokenId};
use common::{custodian, free_addr, id, revoke};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_agents_policy_applies_declines_and_defers() {
    let dir = tempfile::tempdir().unwrap();
    let ca = Ca::generate("t").unwrap();
    let (p, a) = (id("principal"), id("agent-1"));
    let a_addr = free_addr();
    let asked = Arc::new(AtomicU32::new(0));
    let deferred_once = Arc::new(AtomicU32::new(0));
    let (asked2, deferred2) = (asked.clone(), deferred_once.clone());
    // tok-1: apply; tok-2: decline; tok-3: defer once, then apply; tok-4: never answers.
    let policy = Policy::new(move |o| {
        let (asked, deferred) = (asked2.clone(), deferred2.clone());
        async move {
            asked.fetch_add(1, Ordering::SeqCst);
            let Payload::OauthToken(t) = &o.payload else {
                return PolicyDecision::Apply;
            };
            match t.token_id.as_str() {
                "tok-2" => {
                    PolicyDecision::Decline(Detail::new("this token funds a live job").unwrap())
                }
                "tok-3" if deferred.fetch_add(1, Ordering::SeqCst) == 0 => PolicyDecision::Defer,
                "tok-4" => {
                    tokio::time::sleep(Duration::from_secs(60)).await;
                    PolicyDecision::Apply
                }
                _ => PolicyDecision::Apply,
            }
        }
    })
    .timeout(Duration::from_millis(200));
    let agent = Node::builder(ca.issue(&a).unwrap())
        .listen(a_addr)
        .state_dir(dir.path().join("a"))
        .policy(policy)
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
    let mut handles = Vec::new();
    for (n, deadline) in [(1, 20_000), (2, 20_000), (3, 20_000), (4, 1_500)] {
        handles.push(principal.issue(revoke(n, &a, deadline)).await.unwrap());
    }
    let mut outcomes = Vec::new();
    for h in handles {
        let (record, _) = tokio::time::timeout(Duration::from_secs(20), h.outcome())
            .await
            .unwrap()
            .unwrap();
        outcomes.push((record.outcome, record.detail.map(|d| d.to_string())));
    }
    assert_eq!(outcomes[0], (Outcome::Applied, None));
    assert_eq!(
        outcomes[1],
        (
            Outcome::Declined(DeclineReason::Policy),
            Some("this token funds a live job".into())
        )
    );
    assert_eq!(
        outcomes[2],
        (Outcome::Applied, None),
        "deferred once, then applied"
    );
    assert!(
        matches!(outcomes[3].0, Outcome::Escalated(_)),
        "a policy that never answers defers until the deadline: {:?}",
        outcomes[3]
    );
    // The principal's side: the declined and the escalated revocations stand as its own.
    let status = principal.status().await.unwrap();
    for n in [1, 2, 3, 4] {
        assert!(
            status
                .principal
                .is_revoked(&TokenId::new(format!("tok-{n}")).unwrap()),
            "tok-{n}"
        );
    }
    // The agent applied exactly what its policy let through.
    let honours = agent.honours().await.unwrap();
    let dropped: Vec<&str> = honours.dropped_tokens().map(|t| t.as_str()).collect();
    assert_eq!(dropped, ["tok-1", "tok-3"]);
    assert!(
        deferred_once.load(Ordering::SeqCst) >= 2,
        "tok-3 was asked again"
    );
    assert!(asked.load(Ordering::SeqCst) >= 6);
    principal.shutdown().await;
    agent.shutdown().await;
}
