//! Obligations handed to a node by another binding (`Node::deliver`): the same receiver, the
//! same store, acks returned to the caller instead of sent on a track.

use std::time::Duration;

use abhyasa_custody::GovernedKey;
use abhyasa_moq::Ca;
use abhyasa_node::Node;
use abhyasa_wire::{encode, AckStatus, ConsentDecision, ConsentPayload, Payload, Scope, TokenId};

mod common;
use common::{id, revoke};

fn consent_revoke(n: u128, scope: &str) -> abhyasa_wire::Obligation {
    let mut o = revoke(n, &id("agent-1"), 20_000);
    o.payload = Payload::AnumatiConsent(ConsentPayload {
        decision: Some(ConsentDecision::Revoke),
        scope: Scope::new(scope).unwrap(),
        expires_at: None,
    });
    o
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn delivered_obligations_are_applied_once_and_acked_to_the_caller() {
    let dir = tempfile::tempdir().unwrap();
    let ca = Ca::generate("t").unwrap();
    let (p, a) = (id("principal"), id("agent-1"));
    let agent = Node::builder(ca.issue(&a).unwrap())
        .state_dir(dir.path().join("a"))
        .build()
        .await
        .unwrap();
    let consent = consent_revoke(1, "calendar.read");
    let token = revoke(2, &a, 20_000);
    let objects = vec![encode(&consent), encode(&token)];
    let acks = agent.deliver(p.clone(), objects.clone()).await.unwrap();
    assert_eq!(acks.len(), 2);
    for (ack, o) in acks.iter().zip([&consent, &token]) {
        let ack = ack.as_ref().expect("an ack for each applied obligation");
        assert_eq!(ack.obligation_id, o.id);
        assert_eq!(ack.status, AckStatus::Applied);
    }
    let honours = agent.honours().await.unwrap();
    assert!(honours.is_withheld(&p, &Scope::new("calendar.read").unwrap()));
    assert!(honours.is_dropped(&TokenId::new("tok-2").unwrap()));

    // The same objects again (a client re-issuing the request under a new JSON-RPC id):
    // acked again from the applied-id ledger, not applied twice.
    let mut events = agent.events();
    let again = agent.deliver(p.clone(), objects).await.unwrap();
    assert!(again
        .iter()
        .all(|a| a.as_ref().is_some_and(|a| a.status == AckStatus::Applied)));
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert!(
        events.try_recv().is_err(),
        "a duplicate must not be applied (no Applied event)"
    );

    // The obligation that withheld the scope is on record, and survives a restart.
    let scope_key = GovernedKey::Scope(p.clone(), Scope::new("calendar.read").unwrap());
    assert_eq!(
        agent.governed_by(scope_key.clone()).await.unwrap(),
        Some(consent.id)
    );
    let token_key = GovernedKey::Token(p.clone(), TokenId::new("tok-2").unwrap());
    assert_eq!(agent.governed_by(token_key).await.unwrap(), Some(token.id));
    assert_eq!(
        agent
            .governed_by(GovernedKey::Scope(
                p.clone(),
                Scope::new("mail.read").unwrap()
            ))
            .await
            .unwrap(),
        None
    );
    agent.shutdown().await;
    let agent = Node::builder(ca.issue(&a).unwrap())
        .state_dir(dir.path().join("a"))
        .build()
        .await
        .unwrap();
    assert_eq!(
        agent.governed_by(scope_key).await.unwrap(),
        Some(consent.id)
    );
    agent.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_delivery_in_another_principals_name_or_unreadable_is_not_applied() {
    let dir = tempfile::tempdir().unwrap();
    let ca = Ca::generate("t").unwrap();
    let a = id("agent-1");
    let agent = Node::builder(ca.issue(&a).unwrap())
        .state_dir(dir.path().join("a"))
        .build()
        .await
        .unwrap();
    // The issuer field says "principal"; the binding authenticated "mallory".
    let forged = consent_revoke(1, "calendar.read");
    let junk = vec![0xa1, 0x00];
    let acks = agent
        .deliver(id("mallory"), vec![encode(&forged), junk])
        .await
        .unwrap();
    assert_eq!(acks, vec![None, None]);
    let honours = agent.honours().await.unwrap();
    assert_eq!(honours.withheld().count(), 0);
    // Addressed to another agent: declined (refused), with an ack that says so.
    let mut elsewhere = consent_revoke(3, "calendar.read");
    elsewhere.target = id("agent-2");
    let acks = agent
        .deliver(id("principal"), vec![encode(&elsewhere)])
        .await
        .unwrap();
    let ack = acks[0].as_ref().expect("a decline is acked");
    assert!(
        matches!(ack.status, AckStatus::Declined(_)),
        "{:?}",
        ack.status
    );
    assert_eq!(agent.honours().await.unwrap().withheld().count(), 0);
    agent.shutdown().await;
}
