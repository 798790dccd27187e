//! The agent's own judgement: a receiver policy consulted before this node applies an
//! obligation. It may apply it, decline it in its own words, or defer it.
//!
//! The paper's `declined` then means what it says: not only "malformed" or "expired", but
//! "this agent will not" — and the principal's side takes the safe action, as for every
//! decline. A policy that does not answer within its timeout defers: custody stays with the
//! principal's custodian, which offers the obligation again (and the policy is asked again)
//! until its deadline, after which it escalates. So a slow, broken or absent policy never
//! applies anything by default and never loses anything.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

pub use abhyasa_custody::PolicyDecision;
use abhyasa_wire::Obligation;

type Decide =
    dyn Fn(Obligation) -> Pin<Box<dyn Future<Output = PolicyDecision> + Send>> + Send + Sync;

/// A receiver policy ([`NodeBuilder::policy`](crate::NodeBuilder::policy)).
#[derive(Clone)]
pub struct Policy {
    decide: Arc<Decide>,
    timeout: Duration,
}

impl std::fmt::Debug for Policy {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Policy")
            .field("timeout", &self.timeout)
            .finish_non_exhaustive()
    }
}

impl Policy {
    /// The default time a policy has to answer before the obligation is deferred.
    pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(5);

    /// A policy deciding with `f`, which is given each obligation that passed every check
    /// (addressed here, from its issuer, not expired, not superseded, not applied before).
    pub fn new<F, Fut>(f: F) -> Self
    where
        F: Fn(Obligation) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = PolicyDecision> + Send + 'static,
    {
        Self {
            decide: Arc::new(move |o| Box::pin(f(o))),
            timeout: Self::DEFAULT_TIMEOUT,
        }
    }

    /// How long the policy may take; past it the obligation is deferred.
    pub fn timeout(mut self, timeout: Duration) -> Self {
        self.timeout = timeout;
        self
    }

    /// The policy's answer on `o`, or [`PolicyDecision::Defer`] past the timeout.
    pub(crate) async fn ask(&self, o: Obligation) -> PolicyDecision {
        let id = o.id;
        match tokio::time::timeout(self.timeout, (self.decide)(o)).await {
            Ok(d) => d,
            Err(_) => {
                tracing::warn!(obligation = %id, timeout_ms = self.timeout.as_millis() as u64,
                    "the receiver policy did not answer in time: deferred");
                PolicyDecision::Defer
            }
        }
    }
}
