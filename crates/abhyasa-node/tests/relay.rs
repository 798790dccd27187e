//! Custody through an unmodified `moq-relay` 0.17.10 (scripts/moq-relay.sh builds it): a
//! principal and three agents that know nothing of each other but the relay's address.
//! Obligations of every custody kind are applied; the relay is killed and restarted mid-run
//! (a partition) and what was issued meanwhile is applied after; an agent offline past the
//! deadline ends escalated. Skips, saying so, when the relay binary is absent.

mod common;

use std::net::SocketAddr;
use std::path::Path;
use std::time::Duration;

use abhyasa_moq::{moq_relay_binary, Ca, MoqRelayProcess};
use abhyasa_node::{IssueHandle, Node};
use abhyasa_wire::{
    AgentId, BeliefUpdatePayload, ConsentDecision, ConsentPayload, Obligation, ObligationId,
    Outcome, Payload, Scope, WeightDelta, WeightKey,
};
use common::{custodian, id, revoke};

const WAIT: Duration = Duration::from_secs(30);

/// A node named `who` that meets its peers only at the relay.
async fn node(ca: &Ca, who: &AgentId, dir: &Path, relay: SocketAddr) -> Node {
    Node::builder(ca.issue(who).unwrap())
        .state_dir(dir.join(who.as_str()))
        .relay(id("relay"), relay)
        .custodian(custodian())
        .build()
        .await
        .unwrap()
}

/// An obligation `n` of `kind` (0: consent revocation, 1: corrective welfare signal, 2: token
/// revocation) from the principal to `target`, due in `deadline_ms`.
fn obligation(n: u128, kind: u8, target: &AgentId, deadline_ms: u64) -> Obligation {
    let mut o = revoke(n, target, deadline_ms);
    match kind {
        0 => {
            o.payload = Payload::AnumatiConsent(ConsentPayload {
                decision: Some(ConsentDecision::Revoke),
                scope: Scope::new(format!("calendar.read.{n}")).unwrap(),
                expires_at: None,
            })
        }
        1 => {
            o.payload = Payload::PhalaBeliefUpdate(BeliefUpdatePayload {
                weight_key: WeightKey::new(format!("supplier/{n}")).unwrap(),
                weight_delta: WeightDelta(-500),
                ttl_ms: 60_000,
            })
        }
        _ => {}
    }
    o
}

/// The outcomes of `handles`, in order.
async fn outcomes(handles: Vec<IssueHandle>) -> Vec<Outcome> {
    let mut out = Vec::new();
    for h in handles {
        let (record, _) = tokio::time::timeout(WAIT, h.outcome())
            .await
            .expect("an outcome in time")
            .expect("the node runs");
        out.push(record.outcome);
    }
    out
}

/// The ids `node` has applied.
async fn applied(node: &Node) -> Vec<ObligationId> {
    let mut ids: Vec<_> = node
        .status()
        .await
        .unwrap()
        .applied
        .iter()
        .map(|e| e.obligation.id)
        .collect();
    ids.sort();
    ids
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn custody_through_an_unmodified_moq_relay_survives_its_restart_and_escalates() {
    let Some(bin) = moq_relay_binary() else {
        eprintln!(
            "SKIPPED: no moq-relay binary (scripts/moq-relay.sh builds it; or set ABHYASA_MOQ_RELAY)"
        );
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let ca = Ca::generate("relay-test").unwrap();
    ca.issue(&id("relay")).unwrap().save(dir.path()).unwrap();
    let addr = common::free_addr();
    let mut relay = Some(MoqRelayProcess::spawn(&bin, addr, dir.path()).unwrap());

    let p = id("principal");
    let agents = [id("agent-1"), id("agent-2"), id("agent-3")];
    let principal = node(&ca, &p, dir.path(), addr).await;
    let mut nodes = Vec::new();
    for a in &agents {
        nodes.push(Some(node(&ca, a, dir.path(), addr).await));
    }

    // Every custody kind to every agent, issued before anyone has met anyone: custody holds
    // them until each agent subscribes through the relay, then they are applied.
    let mut handles = Vec::new();
    let mut expected: Vec<Vec<ObligationId>> = vec![Vec::new(); agents.len()];
    for (i, a) in agents.iter().enumerate() {
        for kind in 0..3u8 {
            let n = 100 * i as u128 + u128::from(kind);
            let o = obligation(n, kind, a, 60_000);
            expected[i].push(o.id);
            handles.push(principal.issue(o).await.unwrap());
        }
    }
    let got = outcomes(handles).await;
    assert!(got.iter().all(|o| *o == Outcome::Applied), "{got:?}");
    for (i, n) in nodes.iter().enumerate() {
        let mut want = expected[i].clone();
        want.sort();
        assert_eq!(applied(n.as_ref().unwrap()).await, want, "{}", agents[i]);
    }

    // The relay goes away: a partition. What is issued meanwhile waits in custody and is
    // applied once the relay is back and the agents have subscribed again.
    drop(relay.take());
    tokio::time::sleep(Duration::from_millis(500)).await;
    let mut handles = Vec::new();
    for (i, a) in agents.iter().enumerate().take(2) {
        let o = obligation(1_000 + i as u128, 2, a, 60_000);
        expected[i].push(o.id);
        handles.push(principal.issue(o).await.unwrap());
    }
    tokio::time::sleep(Duration::from_secs(1)).await;
    let pending = principal.status().await.unwrap().pending.len();
    assert_eq!(pending, 2, "both wait in custody while the relay is down");
    relay = Some(MoqRelayProcess::spawn(&bin, addr, dir.path()).unwrap());
    let got = outcomes(handles).await;
    assert!(got.iter().all(|o| *o == Outcome::Applied), "{got:?}");
    for (i, n) in nodes.iter().enumerate().take(2) {
        let mut want = expected[i].clone();
        want.sort();
        assert_eq!(applied(n.as_ref().unwrap()).await, want, "{}", agents[i]);
    }

    // A burst to one agent, issued together, leaves in groups of several objects; the relay
    // carries each group whole.
    let before = principal.status().await.unwrap().sent;
    let burst: Vec<_> = (0..40u128)
        .map(|k| obligation(3_000 + k, 0, &agents[0], 60_000))
        .collect();
    expected[0].extend(burst.iter().map(|o| o.id));
    let handles = futures::future::join_all(burst.into_iter().map(|o| principal.issue(o)))
        .await
        .into_iter()
        .map(|h| h.unwrap())
        .collect();
    let got = outcomes(handles).await;
    assert!(got.iter().all(|o| *o == Outcome::Applied), "{got:?}");
    let mut want = expected[0].clone();
    want.sort();
    assert_eq!(applied(nodes[0].as_ref().unwrap()).await, want);
    let after = principal.status().await.unwrap().sent;
    let (objects, groups) = (after.objects - before.objects, after.groups - before.groups);
    assert!(objects >= 40, "{objects} objects sent for a burst of 40");
    assert!(
        groups * 4 <= objects,
        "the burst left in {groups} groups for {objects} objects"
    );

    // agent-3 goes offline; its obligation's deadline passes: escalated, never lost.
    nodes[2].take().unwrap().shutdown().await;
    let h = principal
        .issue(obligation(2_000, 0, &agents[2], 3_000))
        .await
        .unwrap();
    let got = outcomes(vec![h]).await;
    assert!(matches!(got[0], Outcome::Escalated(_)), "{got:?}");

    // Nothing was dropped for a bad signature on the way.
    assert!(principal.status().await.unwrap().unverified.is_empty());
    for n in nodes.iter().flatten() {
        assert!(n.status().await.unwrap().unverified.is_empty());
    }
    eprintln!(
        "relay custody: 9 obligations of 3 kinds applied at 3 agents, the relay restarted and 2 \
         issued meanwhile applied after, a burst of 40 carried in groups, 1 to an offline agent \
         escalated, through {}",
        bin.display()
    );
    principal.shutdown().await;
    for n in nodes.into_iter().flatten() {
        n.shutdown().await;
    }
    drop(relay);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_relay_with_its_operators_certificate_is_trusted_by_ca_or_fingerprint() {
    use abhyasa_moq::RelayTrust;
    use sha2::Digest;
    let Some(bin) = moq_relay_binary() else {
        eprintln!(
            "SKIPPED: no moq-relay binary (scripts/moq-relay.sh builds it; or set ABHYASA_MOQ_RELAY)"
        );
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    // The relay's certificate comes from its operator's CA, for a DNS name; the deployment CA
    // never saw it.
    let operator = Ca::generate("relay operator").unwrap();
    let cert = operator.issue(&id("relay.example")).unwrap();
    cert.save(dir.path()).unwrap();
    for ext in ["pem", "key"] {
        std::fs::rename(
            dir.path().join(format!("relay.example.{ext}")),
            dir.path().join(format!("relay.{ext}")),
        )
        .unwrap();
    }
    let addr = common::free_addr();
    let _relay = MoqRelayProcess::spawn(&bin, addr, dir.path()).unwrap();

    let ca = Ca::generate("relay-test").unwrap();
    let (p, a) = (id("principal"), id("agent-1"));
    let dial = |who: &AgentId, trust: RelayTrust| {
        Node::builder(ca.issue(who).unwrap())
            .state_dir(dir.path().join(who.as_str()))
            .relay_trusting(id("relay.example"), addr, trust)
            .custodian(custodian())
            .build()
    };
    // The principal trusts the operator's CA; the agent pins the certificate itself.
    let principal = dial(&p, RelayTrust::Ca(operator.certificate().clone()))
        .await
        .unwrap();
    let pin: [u8; 32] = sha2::Sha256::digest(cert.chain[0].as_ref()).into();
    let agent = dial(&a, RelayTrust::Fingerprint(pin)).await.unwrap();

    let o = obligation(1, 0, &a, 60_000);
    let handle = principal.issue(o.clone()).await.unwrap();
    assert_eq!(outcomes(vec![handle]).await, [Outcome::Applied]);
    assert_eq!(applied(&agent).await, [o.id]);
    principal.shutdown().await;
    agent.shutdown().await;
}
