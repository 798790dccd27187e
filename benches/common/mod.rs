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

/// Both nodes' store writers at one moment (from their status): a run's commits are the
/// difference of two.
#[allow(dead_code)] // The floor and throughput benches use it; not every bench sharing this.
pub struct Writers {
    principal: abhyasa::node::Commits,
    agent: abhyasa::node::Commits,
    at: std::time::Instant,
}

#[allow(dead_code)]
impl Writers {
    /// Reads both writers' counts now.
    pub async fn read(principal: &abhyasa::node::Node, agent: &abhyasa::node::Node) -> Self {
        Self {
            principal: principal.status().await.unwrap().commits,
            agent: agent.status().await.unwrap().commits,
            at: std::time::Instant::now(),
        }
    }

    /// Prints what the writers did from `self` to `after` for `obligations` discharged:
    /// commits per obligation on each side, records per commit, the mean commit, and the
    /// share of the wall time each writer spent inside commits (near 100%: the writer bounds
    /// the rate).
    pub fn report(&self, after: &Writers, name: &str, obligations: u64) {
        let wall = after.at - self.at;
        if obligations == 0 || wall.is_zero() {
            return;
        }
        let side = |before: &abhyasa::node::Commits, after: &abhyasa::node::Commits| {
            let (count, ops) = (after.count - before.count, after.ops - before.ops);
            let busy = after.busy - before.busy;
            format!(
                "{:.3} commits per obligation, {:.1} records per commit, mean commit {:.1} µs, \
                 busy {:.0}% of the run",
                count as f64 / obligations as f64,
                ops as f64 / count.max(1) as f64,
                busy.as_secs_f64() * 1e6 / count.max(1) as f64,
                busy.as_secs_f64() * 100.0 / wall.as_secs_f64()
            )
        };
        println!(
            "{name}: {obligations} obligations; principal's writer {}; agent's writer {}",
            side(&self.principal, &after.principal),
            side(&self.agent, &after.agent)
        );
    }
}
