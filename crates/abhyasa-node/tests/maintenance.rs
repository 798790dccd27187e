//! A long-running principal stays bounded: maintenance drops principal down-weights at their
//! lapse, forgets revoked tokens at their expiry and prunes the terminal history on a
//! schedule, so issuing never stops at the entry limit.

mod common;

use std::time::Duration;

use abhyasa_custody::CustodianConfig;
use abhyasa_moq::Ca;
use abhyasa_node::{Node, NodeEvent};
use abhyasa_store::{Store, StoreConfig};
use abhyasa_wire::{
    BeliefUpdatePayload, ClientId, Obligation, ObligationId, Outcome, Payload, TokenAction,
    TokenId, TokenPayload, UnixMillis, WeightDelta, WeightKey,
};
use common::{free_addr, id, now_ms};

/// Obligation `n` from the principal to agent-z, created now (`t`, passed to `payload`).
fn to_agent_z(n: u128, deadline_ms: u64, payload: impl FnOnce(u64) -> Payload) -> Obligation {
    let t = now_ms();
    Obligation {
        id: ObligationId::from_u128(n),
        issuer: id("principal"),
        target: id("agent-z"),
        created_at: UnixMillis(t),
        deadline: UnixMillis(t + deadline_ms),
        max_retries: 3,
        sequence: None,
        payload: payload(t),
    }
}

/// How long each corrective update (and so its fail-safe down-weight) holds.
const TTL_MS: u64 = 600;

fn down_weight(n: u128, deadline_ms: u64) -> Obligation {
    to_agent_z(n, deadline_ms, |_| {
        Payload::PhalaBeliefUpdate(BeliefUpdatePayload {
            weight_key: WeightKey::new(format!("supplier/{}", n % 7)).unwrap(),
            weight_delta: WeightDelta(-1_000),
            ttl_ms: TTL_MS,
        })
    })
}

/// The weight of route `supplier/{k}` at `at`, as the escalated updates `created` (by
/// obligation number) give it: each takes 0.001 off until it lapses.
fn expected_weight(created: &[(u128, u64)], k: u128, at: UnixMillis) -> i64 {
    let holding = created
        .iter()
        .filter(|(n, t)| n % 7 == k && at.0 < t + TTL_MS)
        .count() as i64;
    1_000_000 - 1_000 * holding
}

const WAVES: u128 = 12;
const WAVE: u128 = 50;
const ENTRY_LIMIT: usize = 200;

/// Issues WAVES waves of WAVE obligations to an agent that never answers, waiting for each
/// wave to escalate and for maintenance to run; returns the most principal entries seen.
async fn issue_in_waves(principal: &Node, obligation: impl Fn(u128) -> Obligation) -> usize {
    let mut events = principal.events();
    let mut most_entries = 0;
    for wave in 0..WAVES {
        for i in 0..WAVE {
            let n = wave * WAVE + i;
            principal
                .issue(obligation(n))
                .await
                .unwrap_or_else(|e| panic!("issue {n} refused: {e}"));
        }
        let mut escalated = 0;
        tokio::time::timeout(Duration::from_secs(10), async {
            while escalated < WAVE {
                if let Ok(NodeEvent::Terminal { record, .. }) = events.recv().await {
                    assert!(matches!(record.outcome, Outcome::Escalated(_)));
                    escalated += 1;
                }
            }
        })
        .await
        .expect("every obligation escalates");
        tokio::time::sleep(Duration::from_millis(250)).await;
        let status = principal.status().await.unwrap();
        most_entries = most_entries.max(status.principal.entries());
    }
    most_entries
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn maintenance_keeps_principal_entries_and_history_bounded() {
    let dir = tempfile::tempdir().unwrap();
    let ca = Ca::generate("t").unwrap();
    let store = StoreConfig {
        retention_ms: 300,
        ..StoreConfig::default()
    };
    let principal = Node::builder(ca.issue(&id("principal")).unwrap())
        .peer(id("agent-z"), free_addr()) // never answers: every down-weight escalates
        .state_dir(dir.path())
        .custodian(CustodianConfig {
            response_timeout_ms: 40,
            backoff_base_ms: 10,
            backoff_cap_ms: 40,
            max_clock_skew_ms: 50,
            max_principal_entries: ENTRY_LIMIT,
            ..CustodianConfig::default()
        })
        .store(store.clone())
        .maintenance(Duration::from_millis(100))
        .build()
        .await
        .unwrap();
    let created = std::sync::Mutex::new(Vec::new());
    let most_entries = issue_in_waves(&principal, |n| {
        let o = down_weight(n, 150);
        created.lock().unwrap().push((n, o.created_at.0));
        o
    })
    .await;
    let created = created.into_inner().unwrap();
    // Held for good, WAVES × WAVE = 600 adjustments would have been refused from the 201st
    // on; dropped at their lapse, the held entries stay within a few waves.
    assert!(
        most_entries <= 3 * WAVE as usize,
        "principal entries reached {most_entries}"
    );
    // The effective weights are what the escalations that have not lapsed take off, whether
    // or not maintenance has dropped the lapsed ones yet.
    let status = principal.status().await.unwrap();
    let last = created.iter().map(|(_, t)| *t).max().unwrap();
    for at in [
        status.at,
        UnixMillis(last + TTL_MS - 1),
        UnixMillis(last + TTL_MS),
    ] {
        for k in 0..7u128 {
            let key = WeightKey::new(format!("supplier/{k}")).unwrap();
            assert_eq!(
                status.principal.routing_weight(&id("agent-z"), &key, at),
                expected_weight(&created, k, at),
                "route supplier/{k} at {at}"
            );
        }
    }
    principal.shutdown().await;
    // On disk too: the history older than the retention is gone, the lapsed down-weights
    // with it, and what is left lapses on time.
    let store = Store::open(dir.path().join("node.redb"), store).unwrap();
    let kept = store.terminal_len().unwrap();
    assert!(kept < 3 * WAVE as u64, "{kept} terminal records kept");
    assert!(store.principal().entries() <= 3 * WAVE as usize);
    let key = WeightKey::new("supplier/0").unwrap();
    for at in [status.at, UnixMillis(last + TTL_MS)] {
        assert_eq!(
            store.principal().routing_weight(&id("agent-z"), &key, at),
            expected_weight(&created, 0, at)
        );
    }
}

/// A revocation of token `tok-{n}`, which itself expires `expires_in_ms` after issue.
fn revoke_token(n: u128, deadline_ms: u64, expires_in_ms: u64) -> Obligation {
    to_agent_z(n, deadline_ms, |t| {
        Payload::OauthToken(TokenPayload {
            action: TokenAction::Revoke,
            token_id: TokenId::new(format!("tok-{n}")).unwrap(),
            client_id: ClientId::new("c").unwrap(),
            expires_at: Some(UnixMillis(t + expires_in_ms)),
        })
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn revoked_tokens_are_forgotten_after_their_expiry_so_issuing_never_fills_up() {
    let dir = tempfile::tempdir().unwrap();
    let ca = Ca::generate("t").unwrap();
    let principal = Node::builder(ca.issue(&id("principal")).unwrap())
        .peer(id("agent-z"), free_addr()) // never answers: every revocation escalates
        .state_dir(dir.path())
        .custodian(CustodianConfig {
            response_timeout_ms: 40,
            backoff_base_ms: 10,
            backoff_cap_ms: 40,
            max_principal_entries: ENTRY_LIMIT,
            ..CustodianConfig::default()
        })
        .maintenance(Duration::from_millis(100))
        .build()
        .await
        .unwrap();
    let most_entries = issue_in_waves(&principal, |n| revoke_token(n, 150, 200)).await;
    // Kept for good, WAVES × WAVE = 600 revoked tokens would have been refused from the
    // 201st on; forgotten at their expiry, the held entries stay within a few waves.
    assert!(
        most_entries <= 3 * WAVE as usize,
        "principal entries reached {most_entries}"
    );
    // On disk too: the first wave is long forgotten.
    principal.shutdown().await;
    let store = Store::open(dir.path().join("node.redb"), StoreConfig::default()).unwrap();
    let held = store.principal().revoked_tokens().count();
    assert!(held <= 3 * WAVE as usize, "{held} revoked tokens on disk");
    assert!(!store
        .principal()
        .is_revoked(&TokenId::new("tok-0").unwrap()));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_agent_forgets_token_records_and_their_sequences_after_the_tokens_expiry() {
    const TOKENS: u128 = 300;
    const EXPIRES_IN_MS: u64 = 4_000;
    let dir = tempfile::tempdir().unwrap();
    let ca = Ca::generate("t").unwrap();
    let agent = Node::builder(ca.issue(&id("agent-z")).unwrap())
        .listen("127.0.0.1:0".parse().unwrap())
        .state_dir(dir.path().join("a"))
        .maintenance(Duration::from_millis(100))
        .build()
        .await
        .unwrap();
    let principal = Node::builder(ca.issue(&id("principal")).unwrap())
        .peer(id("agent-z"), agent.local_addr())
        .state_dir(dir.path().join("p"))
        .custodian(common::custodian())
        .build()
        .await
        .unwrap();
    let start = now_ms();
    let mut handles = Vec::new();
    for n in 0..TOKENS {
        let mut o = revoke_token(n, 20_000, EXPIRES_IN_MS);
        o.sequence = Some(n as u64 + 1);
        handles.push(principal.issue(o).await.unwrap());
    }
    for h in handles {
        let (record, _) = tokio::time::timeout(Duration::from_secs(20), h.outcome())
            .await
            .expect("an outcome")
            .expect("an outcome");
        assert_eq!(record.outcome, Outcome::Applied);
    }
    let held = agent.status().await.unwrap().receiver_held;
    let expired = now_ms() >= start + EXPIRES_IN_MS;
    if !expired {
        // Every revocation is held (its record and its sequence) until the token expires.
        assert_eq!(held.token_records, TOKENS as usize, "{held:?}");
        assert_eq!(held.sequences, TOKENS as usize, "{held:?}");
    }
    // Past the tokens' expiry, maintenance forgets them in memory and on disk.
    let left = tokio::time::timeout(Duration::from_secs(20), async {
        loop {
            let held = agent.status().await.unwrap().receiver_held;
            if held.token_records == 0 && held.sequences == 0 {
                return held;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    })
    .await;
    let now_held = agent.status().await.unwrap().receiver_held;
    assert!(
        left.is_ok(),
        "token records still held in memory 20 s past expiry: {now_held:?}"
    );
    assert_eq!(agent.honours().await.unwrap().dropped_tokens().count(), 0);
    principal.shutdown().await;
    agent.shutdown().await;
    let store = Store::open(
        dir.path().join("a").join("node.redb"),
        StoreConfig::default(),
    )
    .unwrap();
    assert_eq!(store.receiver_state().dropped_tokens().count(), 0);
    let recovered = store
        .recover_receiver(id("agent-z"), abhyasa_custody::ReceiverConfig::default())
        .unwrap();
    assert_eq!(recovered.held().sequences, 0);
}
