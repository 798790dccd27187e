//! Abhyasa custody: the sans-IO state machines of deliver-or-report (docs/DESIGN.md, "Custody: the rules").
//!
//! ```text
//!   principal ──issue──▶ Custodian ──persist Pending──▶ store ──handle_persisted──▶ transmit
//!                          ▲   │ timeouts: retry with backoff, escalate at deadline/budget
//!                          │   ▼
//!                 handle_ack   Transmit ─ ─ network ─ ─▶ Receiver ──persist Apply──▶ store
//!                          ▲                                  │ handle_persisted
//!                          └ ─ ─ ─ ─ ─ ─ network ─ ─ ─ ─ ─ AckTransmit
//! ```
//!
//! Neither machine reads a clock, touches a socket or a file, or spawns: time comes in as
//! `now`, randomness from a seed, and output goes out through `poll_*` queues. Each machine
//! hands out records to persist and releases what depends on a record (a transmit, an ack, an
//! event) only after the driver confirms it durable with `handle_persisted`.
//!
//! ```
//! use abhyasa_custody::*;
//! use abhyasa_wire::*;
//!
//! let p = AgentId::new("principal").unwrap();
//! let a = AgentId::new("agent").unwrap();
//! let mut custodian = Custodian::new(p.clone(), CustodianConfig::default(), 7);
//! let mut receiver = Receiver::new(a.clone(), ReceiverConfig::default());
//! let o = Obligation {
//!     id: ObligationId::from_u128(1),
//!     issuer: p.clone(),
//!     target: a.clone(),
//!     created_at: UnixMillis(0),
//!     deadline: UnixMillis(60_000),
//!     max_retries: 8,
//!     sequence: None,
//!     payload: Payload::OauthToken(TokenPayload {
//!         action: TokenAction::Revoke,
//!         token_id: TokenId::new("tok").unwrap(),
//!         client_id: ClientId::new("cli").unwrap(),
//!         expires_at: None,
//!     }),
//! };
//! let now = UnixMillis(0);
//! assert_eq!(custodian.issue(now, o).unwrap(), Admission::Custody);
//! assert!(custodian.poll_transmit().is_none()); // not before the pending record is durable
//! let persist = custodian.poll_persist().unwrap();
//! custodian.handle_persisted(now, persist.token);
//! let t = custodian.poll_transmit().unwrap();
//!
//! receiver.handle_obligation(now, &p, t.obligation);
//! let apply = receiver.poll_persist().unwrap(); // applied id + effect: one atomic commit
//! assert!(receiver.poll_transmit().is_none());
//! receiver.handle_persisted(apply.token);
//! let ack = receiver.poll_transmit().unwrap();
//!
//! assert_eq!(custodian.handle_ack(now, &a, ack.ack), AckDisposition::Discharged);
//! assert_eq!(custodian.pending_len(), 0);
//! ```

#![warn(missing_docs, unreachable_pub)]

/// `pub fn mutation(&self) -> Option<Mutation>` for a config with a `mutation` field under the
/// `mutants` feature: the deliberately broken rule it runs with, always `None` in a product
/// build, so every mutant branch compiles away.
macro_rules! mutation_accessor {
    ($config:ty) => {
        impl $config {
            /// The deliberately broken rule this runs with: always `None` unless the crate is
            /// built with the `mutants` feature (the simulator's).
            #[inline]
            pub fn mutation(&self) -> Option<Mutation> {
                #[cfg(feature = "mutants")]
                return self.mutation;
                #[cfg(not(feature = "mutants"))]
                None
            }
        }
    };
}

mod custodian;
pub mod kinds;
mod principal;
mod receiver;

use std::hash::{Hash, Hasher};

use rand::SeedableRng;
use rand_chacha::ChaCha8Rng;

pub use custodian::{
    profile_retries, AckDisposition, Admission, Channel, Custodian, CustodianConfig,
    CustodianEvent, CustodianRecord, CustodianStats, EscalatedRecord, IssueError, PendingRecord,
    Transmit,
};
pub use kinds::{GovernedKey, PrincipalUpdate, ReceiverEffect, RegisteredKind, WeightChange};

/// For [`register_kind!`].
#[doc(hidden)]
pub use abhyasa_wire as __wire;
pub use principal::{later_expiry, Adjustment, Authorization, PrincipalState, WeightBounds};
pub use receiver::{
    AckTransmit, AppliedRecord, Disposition, PolicyDecision, Receiver, ReceiverConfig,
    ReceiverEvent, ReceiverHeld, ReceiverRecord, ReceiverState, ReceiverStats,
};

/// Names one record handed out by a `poll_persist` (the same type the ledger's machines use).
pub use abhyasa_wire::PersistToken;

/// A record to make durable, with the token that confirms it.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Persist<R> {
    /// Confirms this record in `handle_persisted`.
    pub token: PersistToken,
    /// What to write.
    pub record: R,
}

/// A deliberately broken rule, selectable only to prove that the simulation catches it.
#[doc(hidden)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Mutation {
    /// Receiver: no check of the applied-id ledger (redeliveries re-apply).
    NoIdempotencyCheck,
    /// Receiver: the `applied` ack leaves before the apply is committed.
    AckBeforePersist,
    /// Receiver: obligations past their deadline are applied.
    ApplyAfterDeadline,
    /// Custodian: the first send leaves before the pending record is durable.
    SendBeforePersist,
    /// Custodian: recovery restarts each deadline from the time of recovery.
    DeadlineResetOnRecovery,
    /// Custodian: recovery loses the pending set.
    ForgetPendingOnRecovery,
    /// Custodian: an ack is accepted from an agent that is not the target.
    AcceptAckFromNonTarget,
    /// Custodian: escalation records the escalation without applying the safe action.
    EscalateWithoutSafeAction,
    /// Custodian: a refused issue has already applied the principal's decision in memory.
    RefusedIssueChangesState,
    /// Custodian: recovery waits again for late acks of escalations already reconciled.
    RenoteAfterRestart,
    /// Custodian: a re-offer on a new session is sent outside the attempt count.
    UncountedReoffer,
    /// Custodian: an ack is accepted from whoever it names as its sender, target or not.
    AcceptAckLabelledAsSender,
    /// Receiver: the supersession check runs before the idempotency check, so a redelivery
    /// of an applied sequenced obligation is declined `superseded`.
    SupersededBeforeDuplicate,
    /// Receiver: no supersession check (an older decision overrides a newer one).
    NoSupersessionCheck,
    /// Receiver: supersession keyed by the governed name alone, not its issuer, so one
    /// principal's newer sequence on a scope declines another principal's decision on a scope
    /// of the same name.
    SupersedeAcrossIssuers,
    /// Node (modelled by the simulation's network): an obligation or ack is handed to the
    /// machine without checking its end-to-end signature, so what a relay altered or forged
    /// is acted on.
    AcceptUnverified,
    /// Receiver: a grant is applied as if it had no lease, so the agent goes on exercising
    /// the scope after the lease ends when every renewal is lost.
    LeaseIgnored,
    /// Custodian: a grant opens the scope on the principal's side at issue, before the agent
    /// confirmed it (fail-open).
    GrantOpensAtIssue,
    /// Receiver: a belief update's weight change is applied as if it never lapsed, so a
    /// correction outlives its `ttl_ms`.
    WeightLapseIgnored,
    /// Custodian: the principal's fail-safe down-weight is recorded without its lapse, so
    /// routing stays down after the update's `ttl_ms`.
    DownWeightNeverLapses,
}

/// The custodian's seeded RNG. Comparable and hashable by its exact stream position, so a
/// whole machine can be a model-checker state.
#[derive(Clone, Debug, PartialEq, Eq)]
struct JitterRng(ChaCha8Rng);

impl JitterRng {
    fn new(seed: u64) -> Self {
        Self(ChaCha8Rng::seed_from_u64(seed))
    }
}

impl Hash for JitterRng {
    fn hash<H: Hasher>(&self, state: &mut H) {
        self.0.get_seed().hash(state);
        self.0.get_stream().hash(state);
        self.0.get_word_pos().hash(state);
    }
}

#[cfg(test)]
mod tests;
