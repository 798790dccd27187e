//! The receiver: applies each obligation at most once and acks only after the applied id and
//! the effect are durable together.
//!
//! Poll order for a driver, after any `handle_*` call:
//!
//! 1. [`Receiver::poll_persist`] until `None`; commit each [`ReceiverRecord::Apply`] as **one**
//!    atomic write (applied id + effect), then call [`Receiver::handle_persisted`].
//! 2. [`Receiver::poll_transmit`] until `None`; send the acks.
//! 3. [`Receiver::poll_event`] until `None`.
//! 4. Re-arm one timer at [`Receiver::poll_timeout`] (applied-id pruning).

use std::collections::{BTreeMap, BTreeSet, VecDeque};

use abhyasa_wire::{
    AckStatus, AgentId, CustodyAck, DeclineReason, Detail, Digest, Envelope, Obligation,
    ObligationId, Payload, Scope, TokenId, UnixMillis, WeightKey,
};

use crate::kinds::{self, GovernedKey, ReceiverEffect, WeightChange};
use crate::{Mutation, Persist, PersistToken};

/// Receiver settings.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct ReceiverConfig {
    /// Largest clock difference assumed between agents, in ms: applied ids are kept until
    /// deadline + this.
    pub max_clock_skew_ms: u64,
    /// Most applied ids retained at once **per issuer**; beyond it that issuer's new
    /// obligations are deferred (no member can fill what another's obligations need).
    pub max_applied: usize,
    /// Most applies waiting for their commit **per issuer**; beyond it that issuer's new
    /// obligations are deferred.
    pub max_inflight: usize,
    /// Most governed keys (scopes, weight keys, tokens) held **per issuer**; an obligation on
    /// a key new to an issuer at the limit is declined `over_limit`. A token's key goes with
    /// its record at the token's own expiry; others stay.
    pub max_governed: usize,
    /// Bounds of preference weights, in millionths.
    pub weight_min: i64,
    /// Upper bound of preference weights, in millionths.
    pub weight_max: i64,
    /// Ask the agent's own policy before applying: an obligation that would be applied is
    /// held (as in flight) and surfaced as [`ReceiverEvent::Decide`], and waits for
    /// [`Receiver::decided`]. Off: every admissible obligation that passes the checks is
    /// applied.
    pub ask_policy: bool,
    /// A deliberately broken rule, for the simulation's mutation tests. Always `None` in use.
    #[doc(hidden)]
    #[cfg(feature = "mutants")]
    pub mutation: Option<Mutation>,
}

impl Default for ReceiverConfig {
    fn default() -> Self {
        Self {
            max_clock_skew_ms: 5_000,
            max_applied: 1_000_000,
            max_inflight: 4_096,
            max_governed: 100_000,
            weight_min: -1_000_000,
            weight_max: 1_000_000,
            ask_policy: false,
            #[cfg(feature = "mutants")]
            mutation: None,
        }
    }
}

mutation_accessor!(ReceiverConfig);

/// The agent's own decision on an obligation it was asked about ([`ReceiverEvent::Decide`]).
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum PolicyDecision {
    /// Apply it (the checks run again first: time has passed).
    Apply,
    /// Decline it, in the agent's own words: the principal's side takes the safe action.
    Decline(Detail),
    /// Not now: acked `deferred`; custody stays with the custodian, which offers it again
    /// (and the agent is asked again) until its deadline.
    Defer,
}

/// A record the driver must commit before the ack that depends on it is released.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum ReceiverRecord {
    /// Apply: the applied id, the sequence on its governed key and the effect, in **one**
    /// atomic write.
    Apply {
        /// The obligation applied.
        id: ObligationId,
        /// Its issuer.
        issuer: AgentId,
        /// The obligation itself and when it was applied: the agent's record of what it now
        /// honours, and what an audit counts (an id applied twice shows as two entries).
        obligation: Box<Obligation>,
        /// When it was applied, by the receiver's clock.
        at: UnixMillis,
        /// When the applied id may be pruned (deadline + maximum clock skew).
        expires: UnixMillis,
        /// The governed key and the sequence now last applied on it.
        sequence: Option<(GovernedKey, u64)>,
        /// The effect.
        effect: ReceiverEffect,
    },
    /// Applied ids that expired before this time may be deleted.
    Prune {
        /// Ids with `expires < before` go.
        before: UnixMillis,
    },
}

/// An ack to send.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct AckTransmit {
    /// The custodian.
    pub to: AgentId,
    /// The ack.
    pub ack: CustodyAck,
}

/// What the receiver surfaces.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum ReceiverEvent {
    /// An obligation was applied and its record is durable: from here on the application
    /// must honour it.
    Applied {
        /// The obligation.
        id: ObligationId,
        /// Its issuer.
        issuer: AgentId,
        /// What it says.
        payload: Payload,
    },
    /// An obligation passed every check and waits for the agent's own decision: answer with
    /// [`Receiver::decided`]. Nothing is applied or acked until then; a redelivery meanwhile
    /// is held too. Lost with the process (never durable): the custodian offers it again.
    Decide {
        /// The obligation.
        obligation: Box<Obligation>,
    },
    /// An obligation was declined.
    Declined {
        /// The obligation.
        id: ObligationId,
        /// Why.
        reason: DeclineReason,
    },
}

/// What [`Receiver::handle_obligation`] did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Disposition {
    /// Applied; the ack follows the commit.
    Applying,
    /// Already applied: re-acked (or the ack follows the commit in flight).
    Duplicate,
    /// Declined, with an ack.
    Declined(DeclineReason),
    /// Deferred for lack of room, with an ack.
    Deferred,
    /// Held for the agent's own decision ([`ReceiverEvent::Decide`]); no ack yet.
    Deciding,
    /// Dropped: the session's identity is not the issuer's.
    DroppedForged,
}

/// Counters.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct ReceiverStats {
    /// Obligations applied.
    pub applied: u64,
    /// Redeliveries recognized.
    pub duplicates: u64,
    /// Declines.
    pub declined: u64,
    /// Deferrals.
    pub deferred: u64,
    /// Obligations dropped because the sender was not their issuer.
    pub forged: u64,
}

/// The receiver's effect state: what it stopped exercising, its preferences, its tokens.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct ReceiverState {
    /// Bounds of preference weights, in millionths.
    bounds: (i64, i64),
    withheld: BTreeSet<(AgentId, Scope)>,
    /// Granted scopes that lapse: (issuer, scope) → the end of the grant's lease.
    leases: BTreeMap<(AgentId, Scope), UnixMillis>,
    weights: BTreeMap<(AgentId, WeightKey), Route>,
    /// Every weight change held, by when it lapses.
    weight_lapses: BTreeSet<(UnixMillis, ObligationId, AgentId, WeightKey)>,
    /// Dropped tokens → their own expiry (`None`: kept for good).
    dropped_tokens: BTreeMap<TokenId, Option<UnixMillis>>,
    /// Cached tokens → their own expiry. A token is dropped or cached, never both.
    cached_tokens: BTreeMap<TokenId, Option<UnixMillis>>,
    /// The token records that expire, by expiry.
    token_expiry: BTreeSet<(UnixMillis, TokenId)>,
}

/// One preference weight: a base (a weight kept by a store written before changes lapsed;
/// 0 otherwise) and the changes in force, keyed by their obligations.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Default)]
struct Route {
    base: i64,
    changes: BTreeMap<ObligationId, (i32, UnixMillis)>,
}

impl Default for ReceiverState {
    /// Empty, with the default weight bounds (`[-1, 1]`).
    fn default() -> Self {
        let config = ReceiverConfig::default();
        Self::new(config.weight_min, config.weight_max)
    }
}

impl ReceiverState {
    /// Empty state whose preference weights are clipped to `[min, max]` millionths.
    pub fn new(min: i64, max: i64) -> Self {
        Self {
            bounds: (min, max),
            withheld: BTreeSet::new(),
            leases: BTreeMap::new(),
            weights: BTreeMap::new(),
            weight_lapses: BTreeSet::new(),
            dropped_tokens: BTreeMap::new(),
            cached_tokens: BTreeMap::new(),
            token_expiry: BTreeSet::new(),
        }
    }

    /// The same state with its preference weights clipped to `[min, max]` millionths.
    pub fn with_bounds(mut self, min: i64, max: i64) -> Self {
        self.bounds = (min, max);
        self
    }

    /// Rebuilds state from its rows (as a store keeps them); `bases` are weights a store
    /// written before changes lapsed kept as one number each.
    pub fn from_parts(
        withheld: impl IntoIterator<Item = (AgentId, Scope)>,
        bases: impl IntoIterator<Item = ((AgentId, WeightKey), i64)>,
        dropped_tokens: impl IntoIterator<Item = (TokenId, Option<UnixMillis>)>,
        cached_tokens: impl IntoIterator<Item = (TokenId, Option<UnixMillis>)>,
    ) -> Self {
        let mut this = Self {
            withheld: withheld.into_iter().collect(),
            ..Self::default()
        };
        for (key, base) in bases {
            this.weights.entry(key).or_default().base = base;
        }
        for (token, at) in cached_tokens {
            this.apply(&ReceiverEffect::CacheToken(token, at));
        }
        for (token, at) in dropped_tokens {
            this.apply(&ReceiverEffect::DropToken(token, at));
        }
        this
    }

    /// Adds the weight changes held (as a store keeps them).
    pub fn with_weight_changes(
        mut self,
        changes: impl IntoIterator<Item = (AgentId, WeightKey, WeightChange)>,
    ) -> Self {
        for (issuer, key, change) in changes {
            self.apply(&ReceiverEffect::AdjustWeight(issuer, key, change));
        }
        self
    }

    /// Adds the leases of granted scopes (as a store keeps them); a scope withheld has none.
    pub fn with_leases(
        mut self,
        leases: impl IntoIterator<Item = ((AgentId, Scope), UnixMillis)>,
    ) -> Self {
        for (key, end) in leases {
            if !self.withheld.contains(&key) {
                self.leases.insert(key, end);
            }
        }
        self
    }

    /// Every granted scope with a lease, with the lease's end.
    pub fn leases(&self) -> impl Iterator<Item = (&(AgentId, Scope), UnixMillis)> {
        self.leases.iter().map(|(k, v)| (k, *v))
    }

    /// The end of the lease of `scope` granted by `issuer`, if it has one.
    pub fn lease(&self, issuer: &AgentId, scope: &Scope) -> Option<UnixMillis> {
        self.leases.get(&(issuer.clone(), scope.clone())).copied()
    }

    /// Whether the agent may exercise `scope` granted by `issuer` at `now`: not withheld,
    /// and its lease (if any) not ended. A scope never decided on is not governed here.
    pub fn permits(&self, issuer: &AgentId, scope: &Scope, now: UnixMillis) -> bool {
        !self.is_withheld(issuer, scope) && self.lease(issuer, scope).is_none_or(|end| now < end)
    }

    /// Whether the agent may use `token` at `now`: not dropped, and not past the expiry
    /// recorded for it (a cached token is honoured only until its own `exp`, even before
    /// upkeep forgets its record).
    pub fn token_in_force(&self, token: &TokenId, now: UnixMillis) -> bool {
        match self.token_record(token) {
            Some((true, _)) => false,
            Some((false, until)) => until.is_none_or(|end| now < end),
            None => true,
        }
    }

    /// Every (issuer, scope) withheld.
    pub fn withheld(&self) -> impl Iterator<Item = &(AgentId, Scope)> {
        self.withheld.iter()
    }

    /// Every preference weight held, as it stands at `now`.
    pub fn weights(
        &self,
        now: UnixMillis,
    ) -> impl Iterator<Item = (&(AgentId, WeightKey), i64)> + '_ {
        self.weights
            .iter()
            .map(move |(k, route)| (k, self.route_weight(route, now)))
    }

    /// Every weight change held (in force, or lapsed and not yet forgotten).
    pub fn weight_changes(&self) -> impl Iterator<Item = (&AgentId, &WeightKey, WeightChange)> {
        self.weights.iter().flat_map(|((issuer, key), route)| {
            route.changes.iter().map(move |(by, (delta, lapses_at))| {
                (
                    issuer,
                    key,
                    WeightChange {
                        by: *by,
                        delta: *delta,
                        lapses_at: *lapses_at,
                    },
                )
            })
        })
    }

    /// Forgets at most `limit` weight changes that lapsed at or before `now` (they no longer
    /// count). Returns them with their keys, so a store can delete exactly those rows.
    pub fn lapse_weights(
        &mut self,
        now: UnixMillis,
        limit: usize,
    ) -> Vec<(AgentId, WeightKey, ObligationId)> {
        let mut gone = Vec::new();
        while gone.len() < limit && self.weight_lapses.first().is_some_and(|e| e.0 <= now) {
            let Some((_, by, issuer, key)) = self.weight_lapses.pop_first() else {
                break;
            };
            let route_key = (issuer, key);
            if let Some(route) = self.weights.get_mut(&route_key) {
                route.changes.remove(&by);
                if route.changes.is_empty() && route.base == 0 {
                    self.weights.remove(&route_key);
                }
            }
            gone.push((route_key.0, route_key.1, by));
        }
        gone
    }

    fn route_weight(&self, route: &Route, now: UnixMillis) -> i64 {
        let sum: i64 = route
            .changes
            .values()
            .filter(|(_, lapses_at)| now < *lapses_at)
            .map(|(delta, _)| i64::from(*delta))
            .sum();
        (route.base + sum).clamp(self.bounds.0, self.bounds.1)
    }

    /// Every dropped token.
    pub fn dropped_tokens(&self) -> impl Iterator<Item = &TokenId> {
        self.dropped_tokens.keys()
    }

    /// Every cached token.
    pub fn cached_tokens(&self) -> impl Iterator<Item = &TokenId> {
        self.cached_tokens.keys()
    }

    /// Every dropped token with its expiry (`None`: kept for good).
    pub fn dropped_tokens_until(&self) -> impl Iterator<Item = (&TokenId, Option<UnixMillis>)> {
        self.dropped_tokens.iter().map(|(t, e)| (t, *e))
    }

    /// Every cached token with its expiry (`None`: kept for good).
    pub fn cached_tokens_until(&self) -> impl Iterator<Item = (&TokenId, Option<UnixMillis>)> {
        self.cached_tokens.iter().map(|(t, e)| (t, *e))
    }

    /// Whether `token` is cached.
    pub fn is_cached(&self, token: &TokenId) -> bool {
        self.cached_tokens.contains_key(token)
    }

    /// The record of `token`: whether it is dropped (else cached) and until when (`None`:
    /// for good); `None` if there is no record.
    pub fn token_record(&self, token: &TokenId) -> Option<(bool, Option<UnixMillis>)> {
        self.dropped_tokens
            .get(token)
            .map(|e| (true, *e))
            .or_else(|| self.cached_tokens.get(token).map(|e| (false, *e)))
    }

    /// Forgets at most `limit` token records whose token expired at or before `now`.
    /// Returns them with their expiries, so a store can delete exactly those rows.
    pub fn expire_tokens(&mut self, now: UnixMillis, limit: usize) -> Vec<(TokenId, UnixMillis)> {
        let gone = crate::principal::pop_expired(&mut self.token_expiry, now, limit);
        for (token, _) in &gone {
            self.dropped_tokens.remove(token);
            self.cached_tokens.remove(token);
        }
        gone
    }

    /// Sets `token`'s record to dropped or cached with the later of its held and `at`
    /// expiries, keeping the expiry index in step.
    fn record_token(&mut self, token: &TokenId, dropped: bool, at: Option<UnixMillis>) {
        let held = self.token_record(token);
        let next = match held {
            Some((was_dropped, e)) if was_dropped == dropped => crate::later_expiry(e, at),
            _ => at,
        };
        if let Some((_, Some(e))) = held {
            self.token_expiry.remove(&(e, token.clone()));
        }
        if let Some(e) = next {
            self.token_expiry.insert((e, token.clone()));
        }
        self.cached_tokens.remove(token);
        self.dropped_tokens.remove(token);
        if dropped {
            self.dropped_tokens.insert(token.clone(), next);
        } else {
            self.cached_tokens.insert(token.clone(), next);
        }
    }

    /// Applies an effect. A weight change is keyed by its obligation (applying it twice
    /// holds it once) and counts until it lapses.
    pub fn apply(&mut self, effect: &ReceiverEffect) {
        match effect {
            ReceiverEffect::WithholdScope(issuer, scope) => {
                let key = (issuer.clone(), scope.clone());
                self.leases.remove(&key);
                self.withheld.insert(key);
            }
            ReceiverEffect::GrantScope(issuer, scope, until) => {
                let key = (issuer.clone(), scope.clone());
                self.withheld.remove(&key);
                match until {
                    Some(end) => self.leases.insert(key, *end),
                    None => self.leases.remove(&key),
                };
            }
            ReceiverEffect::AdjustWeight(issuer, key, change) => {
                let route = self
                    .weights
                    .entry((issuer.clone(), key.clone()))
                    .or_default();
                if let Some((_, was)) = route
                    .changes
                    .insert(change.by, (change.delta, change.lapses_at))
                {
                    self.weight_lapses
                        .remove(&(was, change.by, issuer.clone(), key.clone()));
                }
                self.weight_lapses.insert((
                    change.lapses_at,
                    change.by,
                    issuer.clone(),
                    key.clone(),
                ));
            }
            ReceiverEffect::DropToken(token, at) => self.record_token(token, true, *at),
            ReceiverEffect::CacheToken(token, at) => {
                if !self.dropped_tokens.contains_key(token) {
                    self.record_token(token, false, *at);
                }
            }
        }
    }

    /// Whether the receiver stopped exercising `scope` granted by `issuer`.
    pub fn is_withheld(&self, issuer: &AgentId, scope: &Scope) -> bool {
        self.withheld.contains(&(issuer.clone(), scope.clone()))
    }

    /// The preference weight on `key` as set by `issuer`, at `now`: the changes that have
    /// not lapsed by then, summed and clipped to the bounds (0 with none).
    pub fn weight(&self, issuer: &AgentId, key: &WeightKey, now: UnixMillis) -> i64 {
        self.weights
            .get(&(issuer.clone(), key.clone()))
            .map_or(0, |route| self.route_weight(route, now))
    }

    /// Whether `token` was dropped.
    pub fn is_dropped(&self, token: &TokenId) -> bool {
        self.dropped_tokens.contains_key(token)
    }
}

/// What a [`Receiver`] holds in memory, by kind of entry: what its upkeep bounds.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ReceiverHeld {
    /// Applied ids remembered (until their deadline plus the clock-skew allowance).
    pub applied: usize,
    /// Token records, dropped or cached (until the token's own expiry, or for good).
    pub token_records: usize,
    /// Last sequences, one per governed key (a token's go with its record).
    pub sequences: usize,
    /// Governed keys some applied obligation named, each counted against its issuer's
    /// `max_governed` (a token's go with its record).
    pub governed: usize,
    /// Weight changes held (until maintenance after their lapse).
    pub weight_changes: usize,
}

/// An applied id as persisted: what recovery reads back.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct AppliedRecord {
    /// The obligation.
    pub id: ObligationId,
    /// When it may be pruned.
    pub expires: UnixMillis,
    /// The digest of the obligation applied ([`Obligation::digest`]); `None` where a store
    /// written before digests were kept has none (such an id is re-acked on its id alone).
    pub digest: Option<Digest>,
    /// Its issuer, whose count of applied ids it is in; `None` where the store kept no record
    /// of the obligation (the id is then counted against no issuer).
    pub issuer: Option<AgentId>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
struct Applied {
    expires: UnixMillis,
    durable: bool,
    digest: Option<Digest>,
    /// Its issuer's index in [`Issuers`] (`None`: counted against no issuer).
    issuer: Option<u32>,
}

/// What each issuer holds of a receiver's bounded state, so one issuer's limits are its own.
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash)]
struct Issuers {
    index: BTreeMap<AgentId, u32>,
    /// By index: applied ids retained, applies in flight, governed keys held.
    held: Vec<IssuerHeld>,
}

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
struct IssuerHeld {
    applied: usize,
    inflight: usize,
    governed: usize,
}

impl Issuers {
    fn ix(&mut self, issuer: &AgentId) -> u32 {
        if let Some(&ix) = self.index.get(issuer) {
            return ix;
        }
        let ix = self.held.len() as u32;
        self.index.insert(issuer.clone(), ix);
        self.held.push(IssuerHeld::default());
        ix
    }

    fn get(&self, issuer: &AgentId) -> IssuerHeld {
        self.index
            .get(issuer)
            .map_or_else(IssuerHeld::default, |&ix| self.held[ix as usize])
    }

    fn at(&mut self, ix: u32) -> &mut IssuerHeld {
        &mut self.held[ix as usize]
    }

    fn of(&mut self, issuer: &AgentId) -> &mut IssuerHeld {
        let ix = self.ix(issuer);
        self.at(ix)
    }
}

/// An apply whose record is being written: what its commit releases.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
struct Applying {
    id: ObligationId,
    issuer: AgentId,
    issuer_ix: u32,
    payload: Payload,
    ack: Option<AckTransmit>,
}

/// The receiver state machine. See the module docs for the poll order.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Receiver {
    agent: AgentId,
    config: ReceiverConfig,
    applied: BTreeMap<ObligationId, Applied>,
    expiry: BTreeSet<(UnixMillis, ObligationId)>,
    last_sequence: BTreeMap<GovernedKey, u64>,
    /// The issuers with a governed key (and perhaps a last sequence) on each token, so both
    /// go with the token's record at its expiry.
    token_issuers: BTreeMap<TokenId, BTreeSet<AgentId>>,
    /// Every governed key some applied obligation named (what a store keeps as governed-by
    /// rows), each counted against its issuer.
    governed: BTreeSet<GovernedKey>,
    issuers: Issuers,
    state: ReceiverState,
    next_token: u64,
    persists: VecDeque<Persist<ReceiverRecord>>,
    gated: BTreeMap<PersistToken, Applying>,
    /// Obligations waiting for the agent's own decision, each counted in flight.
    deciding: BTreeMap<ObligationId, Obligation>,
    transmits: VecDeque<AckTransmit>,
    events: VecDeque<ReceiverEvent>,
    stats: ReceiverStats,
}

impl Receiver {
    /// A fresh receiver for `agent`.
    pub fn new(agent: AgentId, config: ReceiverConfig) -> Self {
        let state = ReceiverState::new(config.weight_min, config.weight_max);
        Self {
            agent,
            config,
            applied: BTreeMap::new(),
            expiry: BTreeSet::new(),
            last_sequence: BTreeMap::new(),
            token_issuers: BTreeMap::new(),
            governed: BTreeSet::new(),
            issuers: Issuers::default(),
            state,
            next_token: 0,
            persists: VecDeque::new(),
            gated: BTreeMap::new(),
            deciding: BTreeMap::new(),
            transmits: VecDeque::new(),
            events: VecDeque::new(),
            stats: ReceiverStats::default(),
        }
    }

    /// Resumes from durable state: the applied ids, the last sequence per governed key, the
    /// governed keys applied obligations named, and the effect state, all as one commit left
    /// them.
    pub fn recover(
        agent: AgentId,
        config: ReceiverConfig,
        applied: impl IntoIterator<Item = AppliedRecord>,
        last_sequence: impl IntoIterator<Item = (GovernedKey, u64)>,
        governed: impl IntoIterator<Item = GovernedKey>,
        state: ReceiverState,
    ) -> Self {
        let mut this = Self::new(agent, config);
        for AppliedRecord {
            id,
            expires,
            digest,
            issuer,
        } in applied
        {
            let issuer = issuer.map(|i| this.issuers.ix(&i));
            if let Some(ix) = issuer {
                this.issuers.at(ix).applied += 1;
            }
            this.applied.insert(
                id,
                Applied {
                    expires,
                    durable: true,
                    digest,
                    issuer,
                },
            );
            this.expiry.insert((expires, id));
        }
        for key in governed {
            this.note_governed(key);
        }
        for (key, seq) in last_sequence {
            this.note_governed(key.clone());
            this.last_sequence.insert(key, seq);
        }
        this.state = state.with_bounds(this.config.weight_min, this.config.weight_max);
        this
    }

    /// An obligation arrived over a session authenticated as `from`.
    pub fn handle_obligation(
        &mut self,
        now: UnixMillis,
        from: &AgentId,
        o: Obligation,
    ) -> Disposition {
        if from != &o.issuer {
            self.stats.forged += 1;
            return Disposition::DroppedForged;
        }
        self.admit(now, o, true)
    }

    /// The agent decided on an obligation it was asked about; `None` if none waits under
    /// `id` (answered already, or lost in a restart: the custodian offers it again).
    pub fn decided(
        &mut self,
        now: UnixMillis,
        id: ObligationId,
        decision: PolicyDecision,
    ) -> Option<Disposition> {
        let o = self.deciding.remove(&id)?;
        let held = self.issuers.of(&o.issuer);
        held.inflight = held.inflight.saturating_sub(1);
        Some(match decision {
            PolicyDecision::Apply => self.admit(now, o, false),
            PolicyDecision::Decline(detail) => {
                self.decline_with(now, &o.envelope(), DeclineReason::Policy, Some(detail))
            }
            PolicyDecision::Defer => {
                self.stats.deferred += 1;
                if kinds::admissible(&o) {
                    self.ack(&o.issuer, o.id, now, AckStatus::Deferred);
                }
                Disposition::Deferred
            }
        })
    }

    /// How many obligations wait for the agent's own decision.
    pub fn deciding_len(&self) -> usize {
        self.deciding.len()
    }

    /// The checks, then the apply (or, when `ask` and the agent has a policy, the question).
    fn admit(&mut self, now: UnixMillis, o: Obligation, ask: bool) -> Disposition {
        let under_custody = kinds::admissible(&o);
        if o.target != self.agent {
            return self.decline(now, &o.envelope(), DeclineReason::Refused);
        }
        // Without rules for its kind (a registered kind's rules missing), nothing applies it.
        let Some(key) = kinds::governed_key(&o) else {
            return self.decline(now, &o.envelope(), DeclineReason::UnknownKind);
        };
        let key = match self.config.mutation() {
            Some(Mutation::SupersedeAcrossIssuers) => kinds::without_issuer(key),
            _ => key,
        };
        if self.config.mutation() == Some(Mutation::SupersededBeforeDuplicate) {
            if let (Some(seq), Some(last)) = (o.sequence, self.last_sequence.get(&key)) {
                if seq <= *last {
                    return self.decline(now, &o.envelope(), DeclineReason::Superseded);
                }
            }
        }
        if self.config.mutation() != Some(Mutation::NoIdempotencyCheck) {
            if let Some(applied) = self.applied.get(&o.id) {
                // The same id with other content is another obligation: acking it `applied`
                // would discharge what nobody applied. Declined, with a reason of its own.
                if applied.digest.is_some_and(|d| d != o.digest()) {
                    return self.decline(now, &o.envelope(), DeclineReason::IdConflict);
                }
                self.stats.duplicates += 1;
                if applied.durable && under_custody {
                    self.ack(&o.issuer, o.id, now, AckStatus::Applied);
                }
                return Disposition::Duplicate;
            }
        }
        if let Some(waiting) = self.deciding.get(&o.id) {
            if waiting.digest() != o.digest() {
                return self.decline(now, &o.envelope(), DeclineReason::IdConflict);
            }
            self.stats.duplicates += 1;
            return Disposition::Deciding;
        }
        if now > o.deadline && self.config.mutation() != Some(Mutation::ApplyAfterDeadline) {
            return self.decline(now, &o.envelope(), DeclineReason::Expired);
        }
        let check_sequence = self.config.mutation() != Some(Mutation::NoSupersessionCheck);
        if let (true, Some(seq), Some(last)) =
            (check_sequence, o.sequence, self.last_sequence.get(&key))
        {
            if seq <= *last {
                return self.decline(now, &o.envelope(), DeclineReason::Superseded);
            }
        }
        // The effect is built once, for an obligation past the checks (a redelivery builds
        // none); its rules are the governed key's, so it is there when the key was.
        let Some(effect) = kinds::effect(&o) else {
            return self.decline(now, &o.envelope(), DeclineReason::UnknownKind);
        };
        // Each issuer's limits are its own: a member filling its share defers only its own.
        let held = self.issuers.get(&o.issuer);
        if held.applied >= self.config.max_applied || held.inflight >= self.config.max_inflight {
            self.stats.deferred += 1;
            if under_custody {
                self.ack(&o.issuer, o.id, now, AckStatus::Deferred);
            }
            return Disposition::Deferred;
        }
        if held.governed >= self.config.max_governed
            && !self.governed.contains(&effect.governed_key(&o.issuer))
        {
            return self.decline(now, &o.envelope(), DeclineReason::OverLimit);
        }
        if ask && self.config.ask_policy {
            self.issuers.of(&o.issuer).inflight += 1;
            self.deciding.insert(o.id, o.clone());
            self.events.push_back(ReceiverEvent::Decide {
                obligation: Box::new(o),
            });
            return Disposition::Deciding;
        }
        self.apply(now, o, key, effect, under_custody);
        Disposition::Applying
    }

    /// An obligation whose envelope read but whose kind or payload did not.
    pub fn handle_unreadable(
        &mut self,
        now: UnixMillis,
        from: &AgentId,
        envelope: &Envelope,
        reason: DeclineReason,
    ) -> Disposition {
        if from != &envelope.issuer {
            self.stats.forged += 1;
            return Disposition::DroppedForged;
        }
        let reason = if envelope.target == self.agent {
            reason
        } else {
            DeclineReason::Refused
        };
        self.decline(now, envelope, reason)
    }

    fn apply(
        &mut self,
        now: UnixMillis,
        o: Obligation,
        key: GovernedKey,
        mut effect: ReceiverEffect,
        under_custody: bool,
    ) {
        if self.config.mutation() == Some(Mutation::LeaseIgnored) {
            // The bug this mutant restores: a grant applied as if it had no lease.
            if let ReceiverEffect::GrantScope(_, _, until) = &mut effect {
                *until = None;
            }
        }
        if self.config.mutation() == Some(Mutation::WeightLapseIgnored) {
            // The bug this mutant restores: a weight change that never lapses.
            if let ReceiverEffect::AdjustWeight(_, _, change) = &mut effect {
                change.lapses_at = UnixMillis(u64::MAX);
            }
        }
        self.state.apply(&effect);
        self.note_governed(effect.governed_key(&o.issuer));
        let sequence = o.sequence.map(|seq| {
            self.note_governed(key.clone());
            self.last_sequence.insert(key.clone(), seq);
            (key, seq)
        });
        let expires = o.deadline.saturating_add(self.config.max_clock_skew_ms);
        let issuer_ix = self.issuers.ix(&o.issuer);
        let held = self.issuers.at(issuer_ix);
        held.applied += 1;
        held.inflight += 1;
        self.applied.insert(
            o.id,
            Applied {
                expires,
                durable: false,
                digest: Some(o.digest()),
                issuer: Some(issuer_ix),
            },
        );
        self.expiry.insert((expires, o.id));
        self.stats.applied += 1;
        let token = PersistToken(self.next_token);
        self.next_token += 1;
        self.persists.push_back(Persist {
            token,
            record: ReceiverRecord::Apply {
                id: o.id,
                issuer: o.issuer.clone(),
                obligation: Box::new(o.clone()),
                at: now,
                expires,
                sequence,
                effect,
            },
        });
        let ack = under_custody.then(|| AckTransmit {
            to: o.issuer.clone(),
            ack: CustodyAck {
                obligation_id: o.id,
                target: self.agent.clone(),
                status: AckStatus::Applied,
                acked_at: now,
                detail: None,
            },
        });
        let ack = if self.config.mutation() == Some(Mutation::AckBeforePersist) {
            self.transmits.extend(ack);
            None
        } else {
            ack
        };
        self.gated.insert(
            token,
            Applying {
                id: o.id,
                issuer: o.issuer,
                issuer_ix,
                payload: o.payload,
                ack,
            },
        );
    }

    fn decline(
        &mut self,
        now: UnixMillis,
        envelope: &Envelope,
        reason: DeclineReason,
    ) -> Disposition {
        self.decline_with(now, envelope, reason, None)
    }

    fn decline_with(
        &mut self,
        now: UnixMillis,
        envelope: &Envelope,
        reason: DeclineReason,
        detail: Option<Detail>,
    ) -> Disposition {
        self.stats.declined += 1;
        self.transmits.push_back(AckTransmit {
            to: envelope.issuer.clone(),
            ack: CustodyAck {
                obligation_id: envelope.id,
                target: self.agent.clone(),
                status: AckStatus::Declined(reason),
                acked_at: now,
                detail,
            },
        });
        self.events.push_back(ReceiverEvent::Declined {
            id: envelope.id,
            reason,
        });
        Disposition::Declined(reason)
    }

    fn ack(&mut self, to: &AgentId, id: ObligationId, now: UnixMillis, status: AckStatus) {
        self.transmits.push_back(AckTransmit {
            to: to.clone(),
            ack: CustodyAck {
                obligation_id: id,
                target: self.agent.clone(),
                status,
                acked_at: now,
                detail: None,
            },
        });
    }

    /// The record named by `token` is durable: release its ack.
    pub fn handle_persisted(&mut self, token: PersistToken) {
        let Some(Applying {
            id,
            issuer,
            issuer_ix,
            payload,
            ack,
        }) = self.gated.remove(&token)
        else {
            return;
        };
        let held = self.issuers.at(issuer_ix);
        held.inflight = held.inflight.saturating_sub(1);
        if let Some(applied) = self.applied.get_mut(&id) {
            applied.durable = true;
        }
        self.transmits.extend(ack);
        self.events.push_back(ReceiverEvent::Applied {
            id,
            issuer,
            payload,
        });
    }

    /// Counts `key` against its issuer, once.
    fn note_governed(&mut self, key: GovernedKey) {
        if self.governed.contains(&key) {
            return;
        }
        let issuer = match &key {
            GovernedKey::Scope(i, _) | GovernedKey::Weight(i, _) => i,
            GovernedKey::Token(i, token) => {
                self.token_issuers
                    .entry(token.clone())
                    .or_default()
                    .insert(i.clone());
                i
            }
        };
        self.issuers.of(issuer).governed += 1;
        self.governed.insert(key);
    }

    /// Periodic upkeep of memory (the node runs it with the store's own maintenance, at the
    /// same `now`): forgets the records of tokens whose own expiry has passed, and with each
    /// the last sequence every issuer gave that token (the store deletes the same rows).
    /// Past its expiry a token is refused by its own terms, so neither record guards anything.
    /// Returns the number of token records forgotten.
    pub fn maintain(&mut self, now: UnixMillis) -> usize {
        // Lapsed weight changes no longer count; their records go too (the store's own
        // maintenance deletes the same rows).
        self.state.lapse_weights(now, usize::MAX);
        let gone = self.state.expire_tokens(now, usize::MAX);
        for (token, _) in &gone {
            for issuer in self.token_issuers.remove(token).unwrap_or_default() {
                let key = GovernedKey::Token(issuer.clone(), token.clone());
                self.last_sequence.remove(&key);
                if self.governed.remove(&key) {
                    let held = self.issuers.of(&issuer);
                    held.governed = held.governed.saturating_sub(1);
                }
            }
        }
        gone.len()
    }

    /// What the receiver holds in memory, by kind of entry.
    pub fn held(&self) -> ReceiverHeld {
        ReceiverHeld {
            applied: self.applied.len(),
            token_records: self.state.dropped_tokens.len() + self.state.cached_tokens.len(),
            sequences: self.last_sequence.len(),
            governed: self.governed.len(),
            weight_changes: self.state.weight_lapses.len(),
        }
    }

    /// Prunes applied ids whose retention ended. A spurious call is a no-op.
    pub fn handle_timeout(&mut self, now: UnixMillis) {
        let mut pruned = false;
        while let Some(&(expires, id)) = self.expiry.first() {
            if expires >= now {
                break;
            }
            // Safe even for an apply whose commit is in flight: past deadline + skew, any
            // redelivery is declined `expired`, and the prune record commits after the apply.
            self.expiry.pop_first();
            if let Some(Applied {
                issuer: Some(ix), ..
            }) = self.applied.remove(&id)
            {
                let held = self.issuers.at(ix);
                held.applied = held.applied.saturating_sub(1);
            }
            pruned = true;
        }
        if pruned {
            let token = PersistToken(self.next_token);
            self.next_token += 1;
            self.persists.push_back(Persist {
                token,
                record: ReceiverRecord::Prune { before: now },
            });
        }
    }

    /// The next record to commit.
    pub fn poll_persist(&mut self) -> Option<Persist<ReceiverRecord>> {
        self.persists.pop_front()
    }

    /// The next ack to send.
    pub fn poll_transmit(&mut self) -> Option<AckTransmit> {
        self.transmits.pop_front()
    }

    /// The next event to surface.
    pub fn poll_event(&mut self) -> Option<ReceiverEvent> {
        self.events.pop_front()
    }

    /// When [`Receiver::handle_timeout`] should next run: just after the earliest expiry.
    pub fn poll_timeout(&self) -> Option<UnixMillis> {
        self.expiry.first().map(|&(at, _)| at.saturating_add(1))
    }

    /// This receiver's agent id.
    pub fn agent(&self) -> &AgentId {
        &self.agent
    }

    /// Whether `id` is recorded as applied (durably or with its commit in flight).
    pub fn has_applied(&self, id: ObligationId) -> bool {
        self.applied.contains_key(&id)
    }

    /// Number of applied ids retained.
    pub fn applied_len(&self) -> usize {
        self.applied.len()
    }

    /// The effect state.
    pub fn state(&self) -> &ReceiverState {
        &self.state
    }

    /// Counters.
    pub fn stats(&self) -> ReceiverStats {
        self.stats
    }
}

#[cfg(test)]
mod tests;
