//! Oracles that can disagree with the code they check.
//!
//! Everything here is computed from the kind table and rules of docs/DESIGN.md and from what the
//! simulation saw — the obligations, the order in which records reached each disk — never by
//! calling the custody code under test (`kinds::safe`, `kinds::admissible`, `holds()`,
//! `PrincipalState::apply`, `ReceiverState::apply`). The machines' durable state is only
//! *read* and compared against these expectations.
//!
//! The kind table restated here is the built-in kinds'. A kind registered by another crate
//! (`abhyasa_custody::register_kind!`) is checked by its own tests; scenarios never issue one,
//! and the oracles below give it no custody and no effect.

use std::collections::{BTreeMap, BTreeSet};

use abhyasa_custody::{PrincipalState, ReceiverState, WeightBounds};
use abhyasa_wire::{
    AgentId, ConsentDecision, ConsentPayload, Obligation, ObligationId, Payload, SafeAction, Scope,
    TokenAction, TokenId, UnixMillis, WeightKey,
};

/// Restrictive decisions, from the kind table: a consent whose decision is not `grant`
/// (missing or unknown is restrictive), a negative belief update, a token revocation.
pub(crate) fn restrictive(o: &Obligation) -> bool {
    match &o.payload {
        Payload::AnumatiConsent(p) => !is_grant(p),
        Payload::PhalaBeliefUpdate(p) => p.weight_delta.0 < 0,
        Payload::OauthToken(p) => p.action == TokenAction::Revoke,
        Payload::Registered(_) => false,
    }
}

/// A consent grant.
pub(crate) fn is_grant(p: &ConsentPayload) -> bool {
    matches!(p.decision, Some(ConsentDecision::Grant))
}

/// SPEC AC-1 as docs/CUSTODY.md ("Grants") reads the paper: every restrictive decision, and
/// every consent grant too — a grant fails closed (its safe action withholds the scope).
pub(crate) fn admissible(o: &Obligation) -> bool {
    restrictive(o) || matches!(o.payload, Payload::AnumatiConsent(_))
}

/// `safe(O)` from the kind table: withhold the scope (revocation or grant alike); down-weight
/// by `|delta|`, keyed by the obligation, lapsing with the update `ttl_ms` after its creation
/// (and foldable `retention` after the deadline, which only a record that never lapses
/// uses); stop honouring the token.
pub(crate) fn expected_safe(o: &Obligation, retention: u64) -> Option<SafeAction> {
    if !admissible(o) {
        return None;
    }
    Some(match &o.payload {
        Payload::AnumatiConsent(p) => SafeAction::WithholdScope {
            target: o.target.clone(),
            scope: p.scope.clone(),
            sequence: o.sequence,
        },
        Payload::PhalaBeliefUpdate(p) => SafeAction::DownWeight {
            obligation_id: o.id,
            target: o.target.clone(),
            weight_key: p.weight_key.clone(),
            amount: p.weight_delta.0.unsigned_abs(),
            fold_after: UnixMillis(o.deadline.0 + retention),
            lapses_at: Some(lapse(o.created_at, p.ttl_ms)),
        },
        Payload::OauthToken(p) => SafeAction::StopHonouringToken {
            token_id: p.token_id.clone(),
            expires_at: p.expires_at,
        },
        Payload::Registered(_) => return None,
    })
}

/// When a belief update created at `created` with `ttl_ms` stops counting (docs/CUSTODY.md,
/// "Lapses"): the first moment it no longer applies, on either side.
pub(crate) fn lapse(created: UnixMillis, ttl_ms: u64) -> UnixMillis {
    UnixMillis(created.0.saturating_add(ttl_ms))
}

/// The sum of the weight changes that still apply at `now`.
fn in_force(changes: &BTreeMap<ObligationId, (i64, UnixMillis)>, now: UnixMillis) -> i64 {
    changes
        .values()
        .filter(|(_, end)| now < *end)
        .map(|(d, _)| *d)
        .sum()
}

/// The thing a `sequence` orders at a receiver (SPEC AB-3), scoped to the issuer.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) enum Governed {
    Scope(AgentId, Scope),
    Weight(AgentId, WeightKey),
    Token(AgentId, TokenId),
    /// A registered kind's obligation, which the oracles do not restate: its own id.
    Registered(ObligationId),
}

pub(crate) fn governed(o: &Obligation) -> Governed {
    match &o.payload {
        Payload::AnumatiConsent(p) => Governed::Scope(o.issuer.clone(), p.scope.clone()),
        Payload::PhalaBeliefUpdate(p) => Governed::Weight(o.issuer.clone(), p.weight_key.clone()),
        Payload::OauthToken(p) => Governed::Token(o.issuer.clone(), p.token_id.clone()),
        Payload::Registered(_) => Governed::Registered(o.id),
    }
}

/// The principal's expected state, from the decisions the simulation saw reach its disk.
///
/// Decisions: at issue, a consent revocation stands at once and a token revocation stops
/// honouring the token; a grant opens nothing at issue (an open grant in force stands, else
/// the scope is withheld) and opens the scope, until its lease, when its `applied` ack is
/// recorded; when custody ends `declined` or `escalated`, the safe action is (re-)asserted. A
/// consent decision never overrides a strictly newer one on the same scope (SPEC: "a
/// decision never overrides a strictly newer one").
#[derive(Debug, Default)]
pub(crate) struct PrincipalOracle {
    /// (target, scope) → the standing decision.
    scopes: BTreeMap<(AgentId, Scope), Standing>,
    /// (target, key) → the keyed down-weights, each with its lapse.
    down: BTreeMap<(AgentId, WeightKey), BTreeMap<ObligationId, (i64, UnixMillis)>>,
    revoked: BTreeSet<TokenId>,
}

/// A decision on a scope as the oracle keeps it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Standing {
    withheld: bool,
    sequence: Option<u64>,
    /// An open grant's lease.
    until: Option<UnixMillis>,
}

impl Standing {
    /// Whether the scope may be exercised at `now`.
    pub(crate) fn permits(&self, now: UnixMillis) -> bool {
        !self.withheld && self.until.is_none_or(|end| now < end)
    }
}

impl PrincipalOracle {
    /// `o` was issued (its pending record, or its best-effort record, is durable).
    pub(crate) fn issued(&mut self, o: &Obligation) {
        match &o.payload {
            Payload::AnumatiConsent(p) => {
                let key = (o.target.clone(), p.scope.clone());
                let open = self.scopes.get(&key).is_some_and(|s| !s.withheld);
                if !(is_grant(p) && open) {
                    self.decide(&o.target, &p.scope, true, o.sequence, None);
                }
            }
            Payload::OauthToken(p) if restrictive(o) => {
                self.revoked.insert(p.token_id.clone());
            }
            _ => {}
        }
    }

    /// Its target confirmed `o` (the `applied` terminal record is durable).
    pub(crate) fn applied(&mut self, o: &Obligation) {
        if let Payload::AnumatiConsent(p) = &o.payload {
            if is_grant(p) {
                self.decide(&o.target, &p.scope, false, o.sequence, p.expires_at);
            }
        }
    }

    /// Custody of `o` ended without `applied`: its safe action is in force from here on.
    pub(crate) fn unconfirmed(&mut self, o: &Obligation) {
        if !admissible(o) {
            return;
        }
        match &o.payload {
            Payload::AnumatiConsent(p) => self.decide(&o.target, &p.scope, true, o.sequence, None),
            Payload::PhalaBeliefUpdate(p) => {
                self.down
                    .entry((o.target.clone(), p.weight_key.clone()))
                    .or_default()
                    .insert(
                        o.id,
                        (
                            i64::from(p.weight_delta.0.unsigned_abs()),
                            lapse(o.created_at, p.ttl_ms),
                        ),
                    );
            }
            Payload::OauthToken(p) => {
                self.revoked.insert(p.token_id.clone());
            }
            Payload::Registered(_) => {}
        }
    }

    fn decide(
        &mut self,
        target: &AgentId,
        scope: &Scope,
        withheld: bool,
        sequence: Option<u64>,
        until: Option<UnixMillis>,
    ) {
        let key = (target.clone(), scope.clone());
        if let (
            Some(Standing {
                sequence: Some(cur),
                ..
            }),
            Some(s),
        ) = (self.scopes.get(&key), sequence)
        {
            if s < *cur {
                return;
            }
        }
        let until = if withheld { None } else { until };
        self.scopes.insert(
            key,
            Standing {
                withheld,
                sequence,
                until,
            },
        );
    }

    /// The standing decision on (`target`, `scope`), if any.
    pub(crate) fn standing(&self, target: &AgentId, scope: &Scope) -> Option<Standing> {
        self.scopes.get(&(target.clone(), scope.clone())).copied()
    }

    /// The routing weight to `target` on `key` at `now` these decisions give.
    pub(crate) fn routing_weight(
        &self,
        target: &AgentId,
        key: &WeightKey,
        now: UnixMillis,
        bounds: WeightBounds,
    ) -> i64 {
        let down = self
            .down
            .get(&(target.clone(), key.clone()))
            .map_or(0, |d| in_force(d, now));
        (bounds.initial - down).clamp(bounds.min, bounds.max)
    }

    /// Every way `actual` differs from the expectation, at `now`.
    pub(crate) fn differences(
        &self,
        actual: &PrincipalState,
        bounds: WeightBounds,
        now: UnixMillis,
    ) -> Vec<String> {
        let mut out = Vec::new();
        for ((target, scope), standing) in &self.scopes {
            let got = actual.authorization(target, scope);
            if got.map(|a| (a.withheld, a.until)) != Some((standing.withheld, standing.until)) {
                out.push(format!(
                    "principal: {scope} for {target} should be {} but is {got:?}",
                    match (standing.withheld, standing.until) {
                        (true, _) => "withheld".to_owned(),
                        (false, None) => "granted".to_owned(),
                        (false, Some(end)) => format!("granted until {end}"),
                    }
                ));
            }
        }
        for ((target, scope), a) in actual.authorizations() {
            if a.withheld && !self.scopes.contains_key(&(target.clone(), scope.clone())) {
                out.push(format!(
                    "principal: {scope} withheld for {target} by no decision"
                ));
            }
        }
        let mut routes: BTreeSet<(AgentId, WeightKey)> = self.down.keys().cloned().collect();
        routes.extend(actual.routes(now).map(|(k, _)| k.clone()));
        for (target, key) in routes {
            let expected = self.routing_weight(&target, &key, now, bounds);
            let got = actual.routing_weight(&target, &key, now);
            if got != expected {
                out.push(format!(
                    "principal: route {key} to {target} weighs {got} at {now}, expected {expected}"
                ));
            }
        }
        let got: BTreeSet<TokenId> = actual.revoked_tokens().cloned().collect();
        if got != self.revoked {
            out.push(format!(
                "principal: revoked tokens {got:?}, expected {:?}",
                self.revoked
            ));
        }
        out
    }
}

/// A receiver's expected effect state: its applied obligations replayed in commit order with
/// the kind table's receiver effects (a weight is the sum of the changes that have not
/// lapsed, clipped to bounds).
#[derive(Debug, Default)]
pub(crate) struct ReceiverOracle {
    withheld: BTreeSet<(AgentId, Scope)>,
    /// Granted scopes that lapse, with the end of their lease.
    leases: BTreeMap<(AgentId, Scope), UnixMillis>,
    weights: BTreeMap<(AgentId, WeightKey), BTreeMap<ObligationId, (i64, UnixMillis)>>,
    bounds: (i64, i64),
    dropped: BTreeSet<TokenId>,
    cached: BTreeSet<TokenId>,
}

impl ReceiverOracle {
    /// An agent whose weights are clipped to `[min, max]`.
    pub(crate) fn new(min: i64, max: i64) -> Self {
        Self {
            bounds: (min, max),
            ..Self::default()
        }
    }

    pub(crate) fn apply(&mut self, o: &Obligation) {
        match &o.payload {
            Payload::AnumatiConsent(p) => {
                let key = (o.issuer.clone(), p.scope.clone());
                self.leases.remove(&key);
                if !is_grant(p) {
                    self.withheld.insert(key);
                } else {
                    if let Some(end) = p.expires_at {
                        self.leases.insert(key.clone(), end);
                    }
                    self.withheld.remove(&key);
                }
            }
            Payload::PhalaBeliefUpdate(p) => {
                self.weights
                    .entry((o.issuer.clone(), p.weight_key.clone()))
                    .or_default()
                    .insert(
                        o.id,
                        (i64::from(p.weight_delta.0), lapse(o.created_at, p.ttl_ms)),
                    );
            }
            Payload::OauthToken(p) => match p.action {
                TokenAction::Revoke => {
                    self.cached.remove(&p.token_id);
                    self.dropped.insert(p.token_id.clone());
                }
                TokenAction::Issue => {
                    if !self.dropped.contains(&p.token_id) {
                        self.cached.insert(p.token_id.clone());
                    }
                }
            },
            Payload::Registered(_) => {}
        }
    }

    /// Whether the agent's applies let it exercise `scope` of `issuer` at `now` (`true` for
    /// a scope never decided on: not governed).
    pub(crate) fn permits(&self, issuer: &AgentId, scope: &Scope, now: UnixMillis) -> bool {
        let key = (issuer.clone(), scope.clone());
        !self.withheld.contains(&key) && self.leases.get(&key).is_none_or(|end| now < *end)
    }

    /// Whether a grant of `scope` by `issuer` stands and its lease ended at or before `now`.
    pub(crate) fn lapsed(&self, issuer: &AgentId, scope: &Scope, now: UnixMillis) -> bool {
        let key = (issuer.clone(), scope.clone());
        !self.withheld.contains(&key) && self.leases.get(&key).is_some_and(|end| *end <= now)
    }

    /// The weight `issuer` set on `key`, at `now`.
    pub(crate) fn weight(&self, issuer: &AgentId, key: &WeightKey, now: UnixMillis) -> i64 {
        self.weights
            .get(&(issuer.clone(), key.clone()))
            .map_or(0, |c| in_force(c, now).clamp(self.bounds.0, self.bounds.1))
    }

    /// Whether some change `issuer` made to `key` had lapsed by `now`.
    pub(crate) fn has_lapsed(&self, issuer: &AgentId, key: &WeightKey, now: UnixMillis) -> bool {
        self.weights
            .get(&(issuer.clone(), key.clone()))
            .is_some_and(|c| c.values().any(|(_, end)| *end <= now))
    }

    /// Every way `actual` differs from these applies, at `now`.
    pub(crate) fn differences(
        &self,
        agent: &AgentId,
        actual: &ReceiverState,
        now: UnixMillis,
    ) -> Vec<String> {
        let mut out = Vec::new();
        let leases: BTreeMap<_, _> = actual.leases().map(|(k, v)| (k.clone(), v)).collect();
        if leases != self.leases {
            out.push(format!(
                "{agent}: holds leases {leases:?}, its applies give {:?}",
                self.leases
            ));
        }
        let withheld: BTreeSet<_> = actual.withheld().cloned().collect();
        if withheld != self.withheld {
            out.push(format!(
                "{agent}: withholds {withheld:?}, its applies give {:?}",
                self.withheld
            ));
        }
        let weights: BTreeMap<_, _> = actual
            .weights(now)
            .filter(|(_, w)| *w != 0)
            .map(|(k, w)| (k.clone(), w))
            .collect();
        let expected: BTreeMap<_, _> = self
            .weights
            .keys()
            .map(|(i, k)| ((i.clone(), k.clone()), self.weight(i, k, now)))
            .filter(|(_, w)| *w != 0)
            .collect();
        if weights != expected {
            out.push(format!(
                "{agent}: weights {weights:?} at {now}, its applies give {expected:?}"
            ));
        }
        let dropped: BTreeSet<_> = actual.dropped_tokens().cloned().collect();
        let cached: BTreeSet<_> = actual.cached_tokens().cloned().collect();
        if dropped != self.dropped || cached != self.cached {
            out.push(format!(
                "{agent}: tokens dropped {dropped:?} cached {cached:?}, its applies give {:?} {:?}",
                self.dropped, self.cached
            ));
        }
        out
    }
}
