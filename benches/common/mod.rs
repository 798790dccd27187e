//! Shared by the network benchmarks.

use std::time::{SystemTime, UNIX_EPOCH};

use abhyasa::wire::{AgentId, Obligation, ObligationId, UnixMillis};

/// A token revocation from `principal` to `target`, unique per `n` and per run.
pub fn obligation(n: u128, target: &AgentId, deadline_ms: u64) -> Obligation {
    let t = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_millis() as u64;
    Obligation {
        id: ObligationId::from_u128((u128::from(t) << 40) | n),
        issuer: AgentId::new("principal").unwrap(),
        target: target.clone(),
        created_at: UnixMillis(t),
        deadline: UnixMillis(t + deadline_ms),
        max_retries: 200,
        sequence: None,
        payload: abhyasa_testkit::token_revocation(&format!("tok-{n}")),
    }
}
