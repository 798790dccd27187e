//! The custodian: holds custody of admissible obligations until they are applied, declined or
//! escalated.
//!
//! Poll order for a driver, after any `handle_*` call or `issue`:
//!
//! 1. [`Custodian::poll_persist`] until `None`; write every record durably (one group commit
//!    may carry many), then call [`Custodian::handle_persisted`] for each token.
//! 2. [`Custodian::poll_transmit`] until `None`; send.
//! 3. [`Custodian::poll_event`] until `None`; surface.
//! 4. Re-arm one timer at [`Custodian::poll_timeout`]; on expiry call
//!    [`Custodian::handle_timeout`] (a spurious call is a no-op).
//!
//! A transmit of an admissible obligation is only ever queued by `handle_persisted` for the
//! record that makes it durable: persist before exposure.

use std::collections::{BTreeMap, BTreeSet, VecDeque};

use abhyasa_wire::{
    AckStatus, AgentId, CustodyAck, DeclineReason, Detail, Escalation, EscalationCause, Kind,
    LastObserved, Obligation, ObligationId, Outcome, ReconciliationNote, SafeAction,
    TerminalRecord, UnixMillis, WireError, MAX_OBJECT_SIZE, MAX_RETRIES_LIMIT,
};
use rand::Rng;

use crate::kinds::{self, PrincipalUpdate};
use crate::principal::{PrincipalState, WeightBounds};
use crate::{JitterRng, Mutation, Persist, PersistToken};
mod attempts;

/// Custodian settings. Hard limits are enforced here, not left to callers.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct CustodianConfig {
    /// How long each attempt waits for an ack before backing off, in ms.
    pub response_timeout_ms: u64,
    /// Backoff base `b`, in ms: the k-th backoff is drawn from `[0, min(cap, b·2^(k-1))]`.
    pub backoff_base_ms: u64,
    /// Backoff cap, in ms. Each obligation also caps it at a quarter of its own lifetime so
    /// several attempts fall within the deadline.
    pub backoff_cap_ms: u64,
    /// Most obligations under custody at once.
    pub max_pending: usize,
    /// Most obligations under custody for one target at once: a target that stops answering
    /// fills at most this much of the pending set, so issues to the others go on.
    pub max_pending_per_target: usize,
    /// Most principal-side entries (authorizations, keyed adjustments, revoked tokens).
    pub max_principal_entries: usize,
    /// Largest clock difference assumed between agents, in ms.
    pub max_clock_skew_ms: u64,
    /// How many recent escalations are remembered to note late `applied` acks.
    pub escalation_memory: usize,
    /// Bounds of principal-side routing weights.
    pub weight_bounds: WeightBounds,
    /// How the first attempt of an admissible obligation travels. `Stream` (the default) is
    /// reliable at the transport too; `Datagram` sends attempt 1 as a datagram where it fits —
    /// one less stream per obligation, no transport retransmission — and every retry on a
    /// stream. Custody is the same either way: an attempt without an ack is retried.
    pub first_attempt: Channel,
    /// Most attempts awaiting an ack per target at once. Further attempts queue (their
    /// response timer not yet running) until one is answered or times out, so a restart with
    /// a large pending set, or a burst of issues, does not flood the link with copies that
    /// time out before the receiver reaches them. Deadlines run regardless.
    pub max_inflight_per_target: usize,
    /// Kinds whose profile requires the retry budget to span the deadline (the retry rule of
    /// docs/DESIGN.md): an obligation of such a kind whose `max_retries` is below
    /// [`CustodianConfig::retries_spanning`] is refused with the number needed. Other kinds
    /// may carry a shorter budget; they then escalate `retries_exhausted` early, which is
    /// conservative.
    pub require_spanning_budget: BTreeSet<Kind>,
    /// Most ended obligation ids remembered for the duplicate check at issue (each is kept
    /// until its deadline plus twice the clock skew, as long as a receiver may still hold it).
    pub ended_memory: usize,
    /// A deliberately broken rule, for the simulation's mutation tests. Always `None` in use.
    #[doc(hidden)]
    #[cfg(feature = "mutants")]
    pub mutation: Option<Mutation>,
}

impl Default for CustodianConfig {
    fn default() -> Self {
        Self {
            response_timeout_ms: 1_000,
            backoff_base_ms: 250,
            backoff_cap_ms: 30_000,
            max_pending: 100_000,
            max_pending_per_target: 50_000,
            max_principal_entries: 1_000_000,
            max_clock_skew_ms: 5_000,
            escalation_memory: 10_000,
            weight_bounds: WeightBounds::default(),
            first_attempt: Channel::Stream,
            max_inflight_per_target: 1_024,
            require_spanning_budget: BTreeSet::new(),
            ended_memory: 100_000,
            #[cfg(feature = "mutants")]
            mutation: None,
        }
    }
}

/// The retry rule (docs/DESIGN.md, "On the wire") for a profile's backoff: the smallest `n` with
/// `Σ_{k=1..n} min(cap, base·2^(k−1)) ≥ span` (no lifetime cap: the profile states its own
/// backoff). Not capped at the wire's [`MAX_RETRIES_LIMIT`]: a result above it says that no
/// obligation can satisfy the rule with this backoff (saturates at `u32::MAX`).
pub fn profile_retries(span_ms: u64, base_ms: u64, cap_ms: u64) -> u32 {
    let mut covered = 0u64;
    let mut n = 0u64;
    loop {
        n += 1;
        let shift = (n - 1).min(32);
        let step = base_ms.saturating_mul(1 << shift).min(cap_ms).max(1);
        covered = covered.saturating_add(step);
        if covered >= span_ms {
            return u32::try_from(n).unwrap_or(u32::MAX);
        }
        if step == cap_ms.max(1) || shift == 32 {
            // Every later step is this one: the rest in one division.
            let rest = (span_ms - covered).div_ceil(step);
            return u32::try_from(n.saturating_add(rest)).unwrap_or(u32::MAX);
        }
    }
}

mutation_accessor!(CustodianConfig);

impl CustodianConfig {
    /// The backoff ceiling of retry `k` (1-based) for an obligation living `span_ms`: the
    /// `min(cap, b·2^(k-1))` of AB-2, with the cap also held below a quarter of the lifetime.
    pub fn backoff_ceiling(&self, span_ms: u64, k: u32) -> u64 {
        let cap = self.backoff_cap_ms.min(span_ms / 4).max(1);
        let shift = k.saturating_sub(1).min(32);
        self.backoff_base_ms.saturating_mul(1 << shift).min(cap)
    }

    /// The retry rule (docs/DESIGN.md, "On the wire"): the smallest `n` with
    /// `Σ_{k=1..n} min(cap, b·2^(k-1)) ≥ span` — the least budget whose backoff ceilings span
    /// the deadline. Saturates at [`MAX_RETRIES_LIMIT`].
    pub fn retries_spanning(&self, span_ms: u64) -> u32 {
        self.retries_until(span_ms, |k| self.backoff_ceiling(span_ms, k))
    }

    /// A default budget under which the deadline normally binds: enough retries that the
    /// schedule as it runs (each attempt waits a response timeout, then a backoff drawn with
    /// full jitter — a quarter of its ceiling is assumed, well below the mean of half) spans
    /// the deadline, plus one for a re-offer on a new session. Saturates at [`MAX_RETRIES_LIMIT`].
    pub fn default_retries(&self, span_ms: u64) -> u32 {
        let rt = self.response_timeout_ms;
        let n = self.retries_until(span_ms, |k| {
            rt.saturating_add(self.backoff_ceiling(span_ms, k) / 4)
        });
        n.saturating_add(1).min(MAX_RETRIES_LIMIT)
    }

    fn retries_until(&self, span_ms: u64, gap: impl Fn(u32) -> u64) -> u32 {
        let mut covered = 0u64;
        for n in 1..=MAX_RETRIES_LIMIT {
            covered = covered.saturating_add(gap(n).max(1));
            if covered >= span_ms {
                return n;
            }
        }
        MAX_RETRIES_LIMIT
    }
}

/// A record the driver must make durable before the custodian exposes what depends on it.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum CustodianRecord {
    /// Write-ahead: the obligation enters the pending set, with the principal's own decision
    /// applied in the same commit.
    Pending {
        /// The obligation.
        obligation: Obligation,
        /// Attempts counted so far (the first attempt follows this commit).
        attempts: u32,
        /// Principal-side update to apply atomically with it.
        principal: Option<PrincipalUpdate>,
    },
    /// The attempt count rose; the retransmit follows this commit.
    Attempt {
        /// The obligation.
        id: ObligationId,
        /// Attempts counted so far.
        attempts: u32,
        /// What was last seen from the target.
        last_observed: LastObserved,
    },
    /// Custody ended: remove from the pending set, keep the terminal record (and escalation),
    /// apply the principal-side update — all in one commit.
    Terminal {
        /// The terminal record.
        record: TerminalRecord,
        /// The escalation, when the fail-safe ran.
        escalation: Option<Escalation>,
        /// Principal-side update to apply atomically with it.
        principal: Option<PrincipalUpdate>,
    },
    /// A late `applied` ack noted against an escalation.
    Reconciliation(ReconciliationNote),
}

/// An obligation to send.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Transmit {
    /// The target.
    pub to: AgentId,
    /// The obligation.
    pub obligation: Obligation,
    /// Which attempt this is (1-based; 0 for best-effort).
    pub attempt: u32,
    /// Stream for custody (or datagram for a first attempt, when configured), datagram for
    /// best-effort.
    pub channel: Channel,
}

/// How an object should travel.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Channel {
    /// A reliable stream (admissible obligations, acks).
    Stream,
    /// A datagram where it fits (best-effort obligations).
    Datagram,
}

/// What the custodian surfaces to the principal.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum CustodianEvent {
    /// The obligation is durably under custody: from here on it ends applied, declined or
    /// escalated. Until this event a crash may lose it, and the issuer should issue it again.
    Accepted {
        /// The obligation.
        id: ObligationId,
    },
    /// Custody of an obligation ended (or a best-effort one was sent).
    Terminal {
        /// How it ended.
        record: TerminalRecord,
        /// The escalation, when the fail-safe ran.
        escalation: Option<Escalation>,
    },
    /// The target deferred; custody stays.
    Deferred {
        /// The obligation.
        id: ObligationId,
    },
    /// A late `applied` ack was noted against an escalation.
    Reconciled(ReconciliationNote),
}

/// How an obligation was taken by [`Custodian::issue`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Admission {
    /// Under custody (AC-1 holds).
    Custody,
    /// Inadmissible: sent once, best-effort.
    BestEffort,
}

/// Why [`Custodian::issue`] refused an obligation. Nothing was changed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum IssueError {
    /// The obligation names another issuer.
    #[error("obligation issuer {issuer} is not this custodian ({custodian})")]
    NotIssuer {
        /// The named issuer.
        issuer: AgentId,
        /// This custodian.
        custodian: AgentId,
    },
    /// The obligation breaks a wire rule.
    #[error("invalid obligation: {0}")]
    Invalid(#[from] WireError),
    /// The deadline is not in the future.
    #[error("deadline {deadline} is not after now ({now})")]
    PastDeadline {
        /// The deadline.
        deadline: UnixMillis,
        /// Now.
        now: UnixMillis,
    },
    /// An obligation with this id is under custody, or ended recently enough that a receiver
    /// may still hold it (a reissue would be re-acked without being applied).
    #[error("obligation {0} was already issued")]
    Duplicate(ObligationId),
    /// The kind's profile requires a retry budget that spans the deadline, and this one does
    /// not.
    #[error(
        "{kind} needs max_retries >= {needed} to span its deadline with this backoff (has {given})"
    )]
    BudgetTooSmall {
        /// The kind.
        kind: Kind,
        /// The obligation's `max_retries`.
        given: u32,
        /// The least budget that spans the deadline.
        needed: u32,
    },
    /// The pending set or the principal state is at its limit.
    #[error("custody is full ({limit} {what})")]
    Full {
        /// Which limit.
        what: &'static str,
        /// The limit.
        limit: usize,
    },
}

/// What [`Custodian::handle_ack`] did with an ack.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AckDisposition {
    /// It discharged custody.
    Discharged,
    /// `deferred`: custody stays.
    Deferred,
    /// A late `applied` after escalation: a reconciliation note.
    Reconciled,
    /// Counted and ignored: not from the obligation's target.
    IgnoredNotTarget,
    /// Counted and ignored: no such obligation under custody.
    IgnoredUnknown,
}

/// Counters a driver can export.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct CustodianStats {
    /// Attempts sent (first sends and retries).
    pub attempts: u64,
    /// Acks ignored because they did not come from the target.
    pub acks_not_target: u64,
    /// Acks ignored because nothing matching was pending.
    pub acks_unknown: u64,
    /// Pending records refused at recovery (not this issuer's, invalid, or inadmissible).
    pub recovery_rejected: u64,
}

/// A pending obligation as persisted: what recovery reads back.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct PendingRecord {
    /// The obligation, with its original deadline.
    pub obligation: Obligation,
    /// Attempts counted.
    pub attempts: u32,
    /// What was last seen from the target.
    pub last_observed: LastObserved,
}

/// A remembered escalation, for reconciling late acks after recovery.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct EscalatedRecord {
    /// The obligation.
    pub id: ObligationId,
    /// Its target.
    pub target: AgentId,
    /// A late `applied` was already noted against it (it is noted once, across restarts).
    pub reconciled: bool,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
enum Phase {
    /// Waiting for the record that allows the next attempt to be persisted.
    AwaitingPersist,
    /// Sent; waiting for an ack until `since + response_timeout`.
    InFlight { since: UnixMillis },
    /// Waiting out a backoff; the next attempt starts at the wake time.
    Backoff,
    /// Persisted and ready, waiting for room in the target's in-flight window.
    Queued { attempt: u32 },
}

#[derive(Clone, Debug, PartialEq, Eq, Hash)]
struct Pending {
    obligation: Obligation,
    attempts: u32,
    last_observed: LastObserved,
    phase: Phase,
    wake: UnixMillis,
    /// How far (ms) the attempts run ahead of the backoff schedule because a re-offer on a
    /// new session pulled one forward; the next backoff waits it out. At most one attempt is
    /// ever ahead: a re-offer happens only while this is zero and no debt is being repaid.
    ahead: u64,
    /// The current backoff includes time skipped by a re-offer; until its slot comes the
    /// attempts are still ahead of the schedule.
    repaying: bool,
}

impl Pending {
    fn budget(&self) -> u32 {
        self.obligation.max_retries.saturating_add(1)
    }
}

#[derive(Clone, Debug, PartialEq, Eq, Hash)]
enum Gate {
    Send { id: ObligationId, attempt: u32 },
    Event(Box<CustodianEvent>),
}

/// The custodian state machine. See the module docs for the poll order.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Custodian {
    agent: AgentId,
    config: CustodianConfig,
    rng: JitterRng,
    principal: PrincipalState,
    pending: BTreeMap<ObligationId, Pending>,
    timers: BTreeSet<(UnixMillis, ObligationId)>,
    escalated: BTreeMap<ObligationId, AgentId>,
    escalated_order: VecDeque<ObligationId>,
    next_token: u64,
    persists: VecDeque<Persist<CustodianRecord>>,
    gated: BTreeMap<PersistToken, Vec<Gate>>,
    transmits: VecDeque<Transmit>,
    events: VecDeque<CustodianEvent>,
    stats: CustodianStats,
    /// Obligations in `Phase::InFlight` per target.
    inflight: BTreeMap<AgentId, usize>,
    /// Obligations under custody per target (entries at zero are removed).
    pending_per_target: BTreeMap<AgentId, usize>,
    /// Obligations waiting for room per target, oldest first (stale entries are skipped).
    queued: BTreeMap<AgentId, VecDeque<ObligationId>>,
    /// Ended obligations, until a receiver may forget them: id → forget time.
    ended: BTreeMap<ObligationId, UnixMillis>,
    ended_order: BTreeSet<(UnixMillis, ObligationId)>,
}

impl Custodian {
    /// A fresh custodian for `agent`; `seed` feeds all of its randomness (backoff jitter).
    pub fn new(agent: AgentId, config: CustodianConfig, seed: u64) -> Self {
        let principal = PrincipalState::new(config.weight_bounds);
        Self {
            agent,
            config,
            rng: JitterRng::new(seed),
            principal,
            pending: BTreeMap::new(),
            timers: BTreeSet::new(),
            escalated: BTreeMap::new(),
            escalated_order: VecDeque::new(),
            next_token: 0,
            persists: VecDeque::new(),
            gated: BTreeMap::new(),
            transmits: VecDeque::new(),
            events: VecDeque::new(),
            stats: CustodianStats::default(),
            inflight: BTreeMap::new(),
            pending_per_target: BTreeMap::new(),
            queued: BTreeMap::new(),
            ended: BTreeMap::new(),
            ended_order: BTreeSet::new(),
        }
    }

    /// Resumes from durable state: every pending obligation keeps its original deadline and
    /// attempt count, and is due at once (escalated at once if already past its deadline).
    pub fn recover(
        agent: AgentId,
        config: CustodianConfig,
        seed: u64,
        principal: PrincipalState,
        pending: impl IntoIterator<Item = PendingRecord>,
        escalated: impl IntoIterator<Item = EscalatedRecord>,
        now: UnixMillis,
    ) -> Self {
        let mut this = Self::new(agent, config, seed);
        this.principal = principal;
        for e in escalated {
            // A late `applied` is noted once: one already noted is not waited for again.
            if !e.reconciled || this.config.mutation() == Some(Mutation::RenoteAfterRestart) {
                this.remember_escalation(e.id, e.target);
            }
        }
        if this.config.mutation() == Some(Mutation::ForgetPendingOnRecovery) {
            return this;
        }
        for record in pending {
            // Disk is input too: a record that could never have been under custody (another
            // issuer, inadmissible, broken) is counted and left out, never trusted.
            let o = &record.obligation;
            if o.issuer != this.agent || o.validate().is_err() || !kinds::admissible(o) {
                this.stats.recovery_rejected += 1;
                continue;
            }
            let mut obligation = record.obligation;
            if this.config.mutation() == Some(Mutation::DeadlineResetOnRecovery) {
                let span = obligation.deadline.saturating_since(obligation.created_at);
                obligation.deadline = now.saturating_add(span);
            }
            let id = obligation.id;
            *this
                .pending_per_target
                .entry(obligation.target.clone())
                .or_default() += 1;
            this.pending.insert(
                id,
                Pending {
                    obligation,
                    attempts: record.attempts,
                    last_observed: record.last_observed,
                    phase: Phase::Backoff,
                    wake: now,
                    ahead: 0,
                    repaying: false,
                },
            );
            this.timers.insert((now, id));
        }
        this
    }

    /// Takes an obligation: under custody if admissible (AC-1), else sent once best-effort.
    pub fn issue(
        &mut self,
        now: UnixMillis,
        obligation: Obligation,
    ) -> Result<Admission, IssueError> {
        if obligation.issuer != self.agent {
            return Err(IssueError::NotIssuer {
                issuer: obligation.issuer,
                custodian: self.agent.clone(),
            });
        }
        obligation.validate()?;
        let size = abhyasa_wire::encode(&obligation).len();
        if size > MAX_OBJECT_SIZE {
            return Err(WireError::TooLarge {
                len: size,
                limit: MAX_OBJECT_SIZE,
            }
            .into());
        }
        if obligation.deadline <= now {
            return Err(IssueError::PastDeadline {
                deadline: obligation.deadline,
                now,
            });
        }
        let id = obligation.id;
        if self.config.mutation() == Some(Mutation::RefusedIssueChangesState) {
            // The bug this mutant restores: the principal's decision taken before the checks.
            if let Some(update) = kinds::on_issue(&obligation) {
                self.principal.apply(&update, obligation.id);
            }
        }
        self.forget_ended(now);
        if self.pending.contains_key(&id)
            || self.escalated.contains_key(&id)
            || self.ended.contains_key(&id)
        {
            return Err(IssueError::Duplicate(id));
        }
        if self.principal.entries() + self.pending.len() >= self.config.max_principal_entries {
            return Err(IssueError::Full {
                what: "principal entries",
                limit: self.config.max_principal_entries,
            });
        }
        let admissible = kinds::admissible(&obligation);
        if admissible {
            if self.pending.len() >= self.config.max_pending {
                return Err(IssueError::Full {
                    what: "pending obligations",
                    limit: self.config.max_pending,
                });
            }
            let for_target = self.pending_for(&obligation.target);
            if for_target >= self.config.max_pending_per_target {
                return Err(IssueError::Full {
                    what: "pending obligations for one target",
                    limit: self.config.max_pending_per_target,
                });
            }
            let kind = obligation.kind();
            if self.config.require_spanning_budget.contains(&kind) {
                let span = obligation.deadline.saturating_since(obligation.created_at);
                let needed = self.config.retries_spanning(span);
                if obligation.max_retries < needed {
                    return Err(IssueError::BudgetTooSmall {
                        kind,
                        given: obligation.max_retries,
                        needed,
                    });
                }
            }
        }
        // Every check has passed: from here on the issue changes state.
        let mut principal = kinds::on_issue(&obligation);
        if self.config.mutation() == Some(Mutation::GrantOpensAtIssue) {
            // The bug this mutant restores: a grant opens the scope before it is confirmed.
            if let Some(PrincipalUpdate::AwaitGrant { .. }) = principal {
                principal = kinds::on_applied(&obligation);
            }
        }
        if let Some(update) = &principal {
            self.principal.apply(update, id);
        }
        if !admissible {
            self.issue_best_effort(now, obligation, principal);
            return Ok(Admission::BestEffort);
        }
        let token = self.persist(CustodianRecord::Pending {
            obligation: obligation.clone(),
            attempts: 1,
            principal,
        });
        let deadline = obligation.deadline;
        *self
            .pending_per_target
            .entry(obligation.target.clone())
            .or_default() += 1;
        self.pending.insert(
            id,
            Pending {
                obligation,
                attempts: 1,
                last_observed: LastObserved::NoAck,
                phase: Phase::AwaitingPersist,
                wake: deadline,
                ahead: 0,
                repaying: false,
            },
        );
        self.timers.insert((deadline, id));
        if self.config.mutation() == Some(Mutation::SendBeforePersist) {
            self.send(now, id, 1);
        } else {
            self.gate(token, Gate::Send { id, attempt: 1 });
        }
        self.gate(
            token,
            Gate::Event(Box::new(CustodianEvent::Accepted { id })),
        );
        Ok(Admission::Custody)
    }

    fn issue_best_effort(
        &mut self,
        now: UnixMillis,
        obligation: Obligation,
        principal: Option<PrincipalUpdate>,
    ) {
        self.remember_ended(obligation.id, obligation.deadline);
        let record = TerminalRecord {
            obligation_id: obligation.id,
            kind: obligation.kind(),
            target: obligation.target.clone(),
            outcome: Outcome::BestEffort,
            attempts: 0,
            at: now,
            detail: None,
        };
        self.persist(CustodianRecord::Terminal {
            record: record.clone(),
            escalation: None,
            principal,
        });
        // Best-effort is not under custody: nothing waits on its record.
        self.transmits.push_back(Transmit {
            to: obligation.target.clone(),
            obligation,
            attempt: 0,
            channel: Channel::Datagram,
        });
        self.events.push_back(CustodianEvent::Terminal {
            record,
            escalation: None,
        });
    }

    /// An ack arrived over a session authenticated as `from`.
    pub fn handle_ack(
        &mut self,
        now: UnixMillis,
        from: &AgentId,
        ack: CustodyAck,
    ) -> AckDisposition {
        let check_sender = self.config.mutation() != Some(Mutation::AcceptAckFromNonTarget);
        if check_sender && &ack.target != from {
            self.stats.acks_not_target += 1;
            return AckDisposition::IgnoredNotTarget;
        }
        let id = ack.obligation_id;
        let retention = self.retention();
        let Some(pending) = self.pending.get_mut(&id) else {
            return self.handle_late_ack(now, from, ack);
        };
        let check_target =
            check_sender && self.config.mutation() != Some(Mutation::AcceptAckLabelledAsSender);
        if check_target && &pending.obligation.target != from {
            self.stats.acks_not_target += 1;
            return AckDisposition::IgnoredNotTarget;
        }
        match ack.status {
            AckStatus::Applied => {
                // What only a confirmation opens (a grant) opens now.
                let opens = kinds::on_applied(&pending.obligation);
                self.terminate(now, id, Outcome::Applied, opens)
            }
            AckStatus::Declined(reason) => {
                // A delivered outcome; the principal side still takes the conservative action.
                let safe = safe_action(self.config.mutation(), &pending.obligation, retention);
                // The agent's own words are kept only with a decline of its own judgement.
                let detail = ack.detail.filter(|_| reason == DeclineReason::Policy);
                self.terminate_with(
                    now,
                    id,
                    Outcome::Declined(reason),
                    safe.map(PrincipalUpdate::Safe),
                    None,
                    detail,
                );
            }
            AckStatus::Deferred => {
                // Custody stays; neither the deadline nor the retry budget moves.
                pending.last_observed = LastObserved::Deferred;
                self.events.push_back(CustodianEvent::Deferred { id });
                return AckDisposition::Deferred;
            }
        }
        AckDisposition::Discharged
    }

    fn handle_late_ack(
        &mut self,
        now: UnixMillis,
        from: &AgentId,
        ack: CustodyAck,
    ) -> AckDisposition {
        let escalated_to = self.escalated.get(&ack.obligation_id);
        if ack.status != AckStatus::Applied || escalated_to.is_none() {
            self.stats.acks_unknown += 1;
            return AckDisposition::IgnoredUnknown;
        }
        if escalated_to != Some(from) {
            self.stats.acks_not_target += 1;
            return AckDisposition::IgnoredNotTarget;
        }
        // Noted once; the safe action stays.
        self.escalated.remove(&ack.obligation_id);
        let note = ReconciliationNote {
            obligation_id: ack.obligation_id,
            target: from.clone(),
            acked_at: ack.acked_at,
            noted_at: now,
        };
        let token = self.persist(CustodianRecord::Reconciliation(note.clone()));
        self.gate(
            token,
            Gate::Event(Box::new(CustodianEvent::Reconciled(note))),
        );
        AckDisposition::Reconciled
    }

    /// The record named by `token` is durable: release what waited on it.
    pub fn handle_persisted(&mut self, now: UnixMillis, token: PersistToken) {
        for gate in self.gated.remove(&token).unwrap_or_default() {
            match gate {
                Gate::Send { id, attempt } => self.send(now, id, attempt),
                Gate::Event(event) => self.events.push_back(*event),
            }
        }
    }

    /// The transport to `target` is (again) ready to carry obligations — a fresh
    /// subscription: what is pending for it is re-offered now — what waits out a backoff, and
    /// what is in flight (most likely on the session that died) — instead of at its next slot.
    /// Each re-offer is a counted attempt, persisted before it is sent, and it spends the
    /// budget no faster than the backoff schedule: the time the schedule would still have
    /// waited is carried over and waited out after the re-offered attempt, and an obligation
    /// that already runs ahead of its schedule is not re-offered, so none is ever more than
    /// one attempt ahead however often the link flaps (AB-2: a flapping link is not a dead
    /// one). Deadlines are unchanged.
    pub fn handle_peer_ready(&mut self, now: UnixMillis, target: &AgentId) {
        let due: Vec<ObligationId> = self
            .pending
            .values()
            .filter(|p| {
                let waiting = match p.phase {
                    Phase::Backoff => p.wake > now,
                    // Sent before the subscription came back — or in the same millisecond, which
                    // cannot be told apart from before: it may have left on the dead session.
                    Phase::InFlight { since } => since <= now,
                    Phase::AwaitingPersist | Phase::Queued { .. } => false,
                };
                &p.obligation.target == target
                    && waiting
                    && p.ahead == 0
                    && !p.repaying
                    && p.attempts < p.budget()
            })
            .map(|p| p.obligation.id)
            .collect();
        let uncounted = self.config.mutation() == Some(Mutation::UncountedReoffer);
        let rt = self.config.response_timeout_ms;
        for id in due {
            if uncounted {
                // The mutant: a re-offer that is a transmission outside the attempt count.
                let attempts = self.pending[&id].attempts;
                self.transmit(now, id, attempts);
                continue;
            }
            // What the schedule would still wait before the next attempt: the rest of the
            // backoff, or the rest of the response timeout plus a backoff drawn now.
            let skipped = match self.pending[&id].phase {
                Phase::InFlight { since } => since
                    .saturating_add(rt)
                    .saturating_since(now)
                    .saturating_add(self.backoff(id)),
                _ => self.pending[&id].wake.saturating_since(now),
            };
            self.set_phase(now, id, Phase::Backoff);
            let p = self.pending.get_mut(&id).expect("listed above");
            p.ahead = skipped.max(1);
            self.rearm(id, now);
        }
        self.handle_timeout(now);
    }

    fn remember_escalation(&mut self, id: ObligationId, target: AgentId) {
        self.escalated.insert(id, target);
        self.escalated_order.push_back(id);
        while self.escalated_order.len() > self.config.escalation_memory {
            if let Some(old) = self.escalated_order.pop_front() {
                self.escalated.remove(&old);
            }
        }
    }

    /// Keeps an ended id for the duplicate check until its deadline plus the retention, the
    /// longest a receiver keeps it (bounded by `ended_memory`: the soonest forgotten go first).
    fn remember_ended(&mut self, id: ObligationId, deadline: UnixMillis) {
        let forget = deadline.saturating_add(self.retention());
        if let Some(old) = self.ended.insert(id, forget) {
            self.ended_order.remove(&(old, id));
        }
        self.ended_order.insert((forget, id));
        while self.ended_order.len() > self.config.ended_memory {
            if let Some((_, old)) = self.ended_order.pop_first() {
                self.ended.remove(&old);
            }
        }
    }

    fn forget_ended(&mut self, now: UnixMillis) {
        while let Some(&(forget, id)) = self.ended_order.first() {
            if forget > now {
                break;
            }
            self.ended_order.pop_first();
            self.ended.remove(&id);
        }
    }

    /// Changes the phase of `id`, keeping the per-target in-flight count; a freed place
    /// goes to the oldest queued attempt for the same target.
    fn set_phase(&mut self, now: UnixMillis, id: ObligationId, phase: Phase) {
        let Some(p) = self.pending.get_mut(&id) else {
            return;
        };
        let (was, is) = (
            matches!(p.phase, Phase::InFlight { .. }),
            matches!(phase, Phase::InFlight { .. }),
        );
        p.phase = phase;
        if was == is {
            return;
        }
        let target = p.obligation.target.clone();
        let count = self.inflight.entry(target.clone()).or_insert(0);
        if is {
            *count += 1;
            return;
        }
        *count = count.saturating_sub(1);
        if *count == 0 {
            self.inflight.remove(&target);
        }
        self.release_queued(now, &target);
    }

    fn release_queued(&mut self, now: UnixMillis, target: &AgentId) {
        let window = self.config.max_inflight_per_target.max(1);
        while self.inflight.get(target).copied().unwrap_or(0) < window {
            let Some(id) = self.queued.get_mut(target).and_then(VecDeque::pop_front) else {
                self.queued.remove(target);
                return;
            };
            let Some(p) = self.pending.get(&id) else {
                continue; // Ended while queued.
            };
            let Phase::Queued { attempt } = p.phase else {
                continue; // Stale entry: the phase moved on.
            };
            if now >= p.obligation.deadline {
                continue; // Its deadline timer escalates it.
            }
            self.transmit(now, id, attempt);
        }
    }

    fn rearm(&mut self, id: ObligationId, wake: UnixMillis) {
        if let Some(p) = self.pending.get_mut(&id) {
            self.timers.remove(&(p.wake, id));
            p.wake = wake;
            self.timers.insert((wake, id));
        }
    }

    fn persist(&mut self, record: CustodianRecord) -> PersistToken {
        let token = PersistToken(self.next_token);
        self.next_token += 1;
        self.persists.push_back(Persist { token, record });
        token
    }

    fn gate(&mut self, token: PersistToken, gate: Gate) {
        self.gated.entry(token).or_default().push(gate);
    }

    fn retention(&self) -> u64 {
        self.config.max_clock_skew_ms.saturating_mul(2)
    }

    /// Periodic upkeep of memory (the node runs it with the store's own maintenance, at the
    /// same `now`): folds principal-side down-weights whose `fold_after` has passed into their
    /// base weights — effective weights do not change —, forgets revoked tokens past their
    /// own expiry (as the store does at the same `now`) and ended ids that no receiver may
    /// still hold. Returns the number of adjustments folded and tokens forgotten.
    pub fn maintain(&mut self, now: UnixMillis) -> usize {
        self.forget_ended(now);
        self.principal.fold(now).len() + self.principal.expire_tokens(now, usize::MAX).len()
    }

    /// The next record to make durable.
    pub fn poll_persist(&mut self) -> Option<Persist<CustodianRecord>> {
        self.persists.pop_front()
    }

    /// The next obligation to send.
    pub fn poll_transmit(&mut self) -> Option<Transmit> {
        self.transmits.pop_front()
    }

    /// The next event to surface.
    pub fn poll_event(&mut self) -> Option<CustodianEvent> {
        self.events.pop_front()
    }

    /// When [`Custodian::handle_timeout`] should next run.
    pub fn poll_timeout(&self) -> Option<UnixMillis> {
        self.timers.first().map(|&(at, _)| at)
    }

    /// This custodian's agent id.
    pub fn agent(&self) -> &AgentId {
        &self.agent
    }

    /// Number of obligations under custody.
    pub fn pending_len(&self) -> usize {
        self.pending.len()
    }

    /// Number of obligations under custody for `target`.
    pub fn pending_for(&self, target: &AgentId) -> usize {
        self.pending_per_target.get(target).copied().unwrap_or(0)
    }

    /// The obligations under custody with their attempt counts, in id order.
    pub fn pending(&self) -> impl Iterator<Item = (&Obligation, u32)> {
        self.pending.values().map(|p| (&p.obligation, p.attempts))
    }

    /// Whether `id` is under custody.
    pub fn is_pending(&self, id: ObligationId) -> bool {
        self.pending.contains_key(&id)
    }

    /// The attempts made so far on `id`, if it is under custody.
    pub fn attempts(&self, id: ObligationId) -> Option<u32> {
        self.pending.get(&id).map(|p| p.attempts)
    }

    /// Principal-side state as this custodian last set it.
    pub fn principal(&self) -> &PrincipalState {
        &self.principal
    }

    /// Counters.
    pub fn stats(&self) -> CustodianStats {
        self.stats
    }
}

/// `safe(O)` as this custodian takes it ([`kinds::safe`], unless a mutant breaks it).
fn safe_action(
    mutation: Option<Mutation>,
    o: &abhyasa_wire::Obligation,
    retention: u64,
) -> Option<SafeAction> {
    let mut safe = kinds::safe(o, retention);
    if mutation == Some(Mutation::DownWeightNeverLapses) {
        // The bug this mutant restores: a fail-safe down-weight with no end.
        if let Some(SafeAction::DownWeight { lapses_at, .. }) = &mut safe {
            *lapses_at = None;
        }
    }
    safe
}
