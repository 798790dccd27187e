//! End-to-end signatures at the node's boundary: an obligation or ack is acted on only when
//! signed by the certificate key of the agent that sent it (here: the session's peer).
//! Unsigned, altered, or signed-by-another-member objects are dropped unread and counted, and
//! nothing is applied or discharged by them.

mod common;

use std::time::Duration;

use abhyasa_moq::{Ca, SessionEvent, SignedKind, Signer, Track, Verifier};
use abhyasa_node::Node;
use abhyasa_wire::{decode, encode, AckStatus, AgentId, CustodyAck, Obligation, Outcome};
use common::{custodian, id, revoke, session};
use tokio::sync::mpsc;

/// Waits until `node` counts `n` unverified objects from `peer`.
async fn unverified(node: &Node, peer: &AgentId, n: u64) {
    let got = tokio::time::timeout(Duration::from_secs(10), async {
        loop {
            let s = node.status().await.unwrap();
            let got = s.unverified.get(peer).copied().unwrap_or(0);
            if got >= n {
                return got;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await
    .unwrap_or_else(|_| panic!("{n} unverified objects from {peer}"));
    assert_eq!(got, n);
}

/// The next object on `track`, within five seconds.
async fn next_object(rx: &mut mpsc::Receiver<SessionEvent>, want: Track) -> Vec<u8> {
    tokio::time::timeout(Duration::from_secs(5), async {
        loop {
            match rx.recv().await.expect("session events") {
                SessionEvent::Object { track, payload } if track == want => return payload,
                _ => {}
            }
        }
    })
    .await
    .expect("an object in time")
}

/// An agent node receives obligations from a principal's raw session: unsigned, signed by
/// another member, and altered after signing are each dropped and counted; only the one
/// its principal signed is applied, and the ack for it is signed by the agent.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_agent_applies_only_what_its_principal_signed() {
    let dir = tempfile::tempdir().unwrap();
    let ca = Ca::generate("t").unwrap();
    let (a, p) = (id("agent-a"), id("principal"));
    let agent = Node::builder(ca.issue(&a).unwrap())
        .state_dir(dir.path())
        .build()
        .await
        .unwrap();
    let (s, mut rx, _ep) = session(&ca, &p, &agent).await;
    let principal = Signer::new(&ca.issue(&p).unwrap()).unwrap();
    let mallory = Signer::new(&ca.issue(&id("mallory")).unwrap()).unwrap();
    let send = |bytes: Vec<u8>| {
        let s = s.clone();
        async move {
            s.send_group(Track::Obligations, &[bytes], false)
                .await
                .unwrap()
        }
    };

    // Unsigned: the plain CBOR an unsigning sender would put on the track.
    send(encode(&revoke(1, &a, 30_000))).await;
    unverified(&agent, &p, 1).await;
    // Signed by another member of the deployment, sent on the principal's session.
    send(mallory.sign(SignedKind::Obligation, &encode(&revoke(2, &a, 30_000)))).await;
    unverified(&agent, &p, 2).await;
    // Signed by the principal, then altered (the last byte of the payload's token id).
    let mut altered = principal.sign(SignedKind::Obligation, &encode(&revoke(3, &a, 30_000)));
    let at = altered
        .windows(5)
        .rposition(|w| w == b"tok-3")
        .expect("the token id in the envelope")
        + 4;
    altered[at] = b'4';
    send(altered).await;
    unverified(&agent, &p, 3).await;
    // Signed as an ack: not an obligation.
    send(principal.sign(SignedKind::Ack, &encode(&revoke(5, &a, 30_000)))).await;
    unverified(&agent, &p, 4).await;
    // The real one.
    send(principal.sign(SignedKind::Obligation, &encode(&revoke(6, &a, 30_000)))).await;

    // Its ack comes back signed by the agent, and says applied.
    let verifier = Verifier::new(ca.certificate().clone());
    let opened = verifier
        .open(SignedKind::Ack, &next_object(&mut rx, Track::Acks).await)
        .expect("the ack verifies");
    assert_eq!(opened.signer, a);
    let ack: CustodyAck = decode(&opened.payload).unwrap();
    assert_eq!(
        (ack.obligation_id, ack.status),
        (revoke(6, &a, 0).id, AckStatus::Applied)
    );
    let status = agent.status().await.unwrap();
    let applied: Vec<_> = status.applied.iter().map(|e| e.obligation.id).collect();
    assert_eq!(applied, vec![revoke(6, &a, 0).id]);
    assert_eq!(status.unverified.get(&p), Some(&4));
    agent.shutdown().await;
}

/// A principal node keeps custody of an obligation while its target's session carries acks
/// that are unsigned or signed by another member; the target's own signed ack discharges it.
/// What the principal sent was signed by the principal.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn only_the_targets_signed_ack_discharges() {
    let dir = tempfile::tempdir().unwrap();
    let ca = Ca::generate("t").unwrap();
    let (p, t) = (id("principal"), id("agent-t"));
    let principal = Node::builder(ca.issue(&p).unwrap())
        .state_dir(dir.path())
        .custodian(custodian())
        .build()
        .await
        .unwrap();
    let (s, mut rx, _ep) = session(&ca, &t, &principal).await;
    let handle = principal.issue(revoke(7, &t, 60_000)).await.unwrap();

    let verifier = Verifier::new(ca.certificate().clone());
    let opened = verifier
        .open(
            SignedKind::Obligation,
            &next_object(&mut rx, Track::Obligations).await,
        )
        .expect("the obligation verifies");
    assert_eq!(opened.signer, p);
    let o: Obligation = decode(&opened.payload).unwrap();
    assert_eq!(o.id, revoke(7, &t, 0).id);

    let ack = encode(&CustodyAck {
        obligation_id: o.id,
        target: t.clone(),
        status: AckStatus::Applied,
        acked_at: o.created_at,
        detail: None,
    });
    let send = |bytes: Vec<u8>| {
        let s = s.clone();
        async move { s.send_group(Track::Acks, &[bytes], false).await.unwrap() }
    };
    let mallory = Signer::new(&ca.issue(&id("mallory")).unwrap()).unwrap();
    send(ack.clone()).await;
    send(mallory.sign(SignedKind::Ack, &ack)).await;
    unverified(&principal, &t, 2).await;
    // Still in custody after both.
    let pending: Vec<_> = principal
        .status()
        .await
        .unwrap()
        .pending
        .iter()
        .map(|(o, _)| o.id)
        .collect();
    assert_eq!(pending, vec![o.id]);

    let target = Signer::new(&ca.issue(&t).unwrap()).unwrap();
    send(target.sign(SignedKind::Ack, &ack)).await;
    let (record, _) = tokio::time::timeout(Duration::from_secs(10), handle.outcome())
        .await
        .expect("an outcome in time")
        .expect("the node runs");
    assert_eq!(record.outcome, Outcome::Applied);
    principal.shutdown().await;
}
