//! Oracles that can disagree with the code they check.
//!
//! Everything here is computed from SPEC.md's kind table and rules and from what the
//! simulation saw — the obligations, the order in which records reached each disk — never by
//! calling the custody code under test (`kinds::safe`, `kinds::admissible`, `holds()`,
//! `PrincipalState::apply`, `ReceiverState::apply`). The machines' durable state is only
//! *read* and compared against these expectations.

use std::collections::{BTreeMap, BTreeSet};

use abhyasa_custody::{PrincipalState, ReceiverState, WeightBounds};
use abhyasa_wire::{
    AgentId, ConsentDecision, Obligation, ObligationId, Payload, SafeAction, Scope, TokenAction,
    TokenId, UnixMillis, WeightKey,
};

/// SPEC AC-1, from the kind table: a consent whose decision is not `grant` (missing or
/// unknown is restrictive), a negative belief update, a token revocation.
pub(crate) fn restrictive(o: &Obligation) -> bool {
    match &o.payload {
        Payload::AnumatiConsent(p) => !matches!(p.decision, Some(ConsentDecision::Grant)),
        Payload::PhalaBeliefUpdate(p) => p.weight_delta.0 < 0,
        Payload::OauthToken(p) => p.action == TokenAction::Revoke,
    }
}

/// `safe(O)` from the kind table: withhold the scope; down-weight by `|delta|`, keyed by the
/// obligation and foldable `retention` after the deadline; stop honouring the token.
pub(crate) fn expected_safe(o: &Obligation, retention: u64) -> Option<SafeAction> {
    if !restrictive(o) {
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
        },
        Payload::OauthToken(p) => SafeAction::StopHonouringToken {
            token_id: p.token_id.clone(),
            expires_at: p.expires_at,
        },
    })
}

/// The thing a `sequence` orders at a receiver (SPEC AB-3), scoped to the issuer.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) enum Governed {
    Scope(AgentId, Scope),
    Weight(AgentId, WeightKey),
    Token(AgentId, TokenId),
}

pub(crate) fn governed(o: &Obligation) -> Governed {
    match &o.payload {
        Payload::AnumatiConsent(p) => Governed::Scope(o.issuer.clone(), p.scope.clone()),
        Payload::PhalaBeliefUpdate(p) => Governed::Weight(o.issuer.clone(), p.weight_key.clone()),
        Payload::OauthToken(p) => Governed::Token(o.issuer.clone(), p.token_id.clone()),
    }
}

/// The principal's expected state, from the decisions the simulation saw reach its disk.
///
/// Decisions: at issue, a consent decision stands at once (grant or withhold) and a token
/// revocation stops honouring the token; when custody ends `declined` or `escalated`, the
/// safe action is (re-)asserted. A consent decision never overrides a strictly newer one on
/// the same scope (SPEC: "a decision never overrides a strictly newer one").
#[derive(Debug, Default)]
pub(crate) struct PrincipalOracle {
    /// (target, scope) → (withheld, sequence of the standing decision).
    scopes: BTreeMap<(AgentId, Scope), (bool, Option<u64>)>,
    /// (target, key) → the sum of keyed down-weights.
    down: BTreeMap<(AgentId, WeightKey), i64>,
    adjusted: BTreeSet<ObligationId>,
    revoked: BTreeSet<TokenId>,
}

impl PrincipalOracle {
    /// `o` was issued (its pending record, or its best-effort record, is durable).
    pub(crate) fn issued(&mut self, o: &Obligation) {
        match &o.payload {
            Payload::AnumatiConsent(p) => {
                self.decide(&o.target, &p.scope, restrictive(o), o.sequence);
            }
            Payload::OauthToken(p) if restrictive(o) => {
                self.revoked.insert(p.token_id.clone());
            }
            _ => {}
        }
    }

    /// Custody of `o` ended without `applied`: its safe action is in force from here on.
    pub(crate) fn unconfirmed(&mut self, o: &Obligation) {
        if !restrictive(o) {
            return;
        }
        match &o.payload {
            Payload::AnumatiConsent(p) => self.decide(&o.target, &p.scope, true, o.sequence),
            Payload::PhalaBeliefUpdate(p) => {
                if self.adjusted.insert(o.id) {
                    *self
                        .down
                        .entry((o.target.clone(), p.weight_key.clone()))
                        .or_insert(0) += i64::from(p.weight_delta.0.unsigned_abs());
                }
            }
            Payload::OauthToken(p) => {
                self.revoked.insert(p.token_id.clone());
            }
        }
    }

    fn decide(&mut self, target: &AgentId, scope: &Scope, withheld: bool, seq: Option<u64>) {
        let key = (target.clone(), scope.clone());
        if let (Some((_, Some(cur))), Some(s)) = (self.scopes.get(&key), seq) {
            if s < *cur {
                return;
            }
        }
        self.scopes.insert(key, (withheld, seq));
    }

    /// Every way `actual` differs from the expectation.
    pub(crate) fn differences(&self, actual: &PrincipalState, bounds: WeightBounds) -> Vec<String> {
        let mut out = Vec::new();
        for ((target, scope), (withheld, _)) in &self.scopes {
            if actual.is_withheld(target, scope) != *withheld {
                out.push(format!(
                    "principal: {scope} for {target} should be {} but is not",
                    if *withheld { "withheld" } else { "granted" }
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
        routes.extend(actual.routes().map(|(k, _)| k.clone()));
        for (target, key) in routes {
            let sum = self
                .down
                .get(&(target.clone(), key.clone()))
                .copied()
                .unwrap_or(0);
            let expected = (bounds.initial - sum).clamp(bounds.min, bounds.max);
            let got = actual.routing_weight(&target, &key);
            if got != expected {
                out.push(format!(
                    "principal: route {key} to {target} weighs {got}, expected {expected}"
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
/// the kind table's receiver effects (weights clipped to bounds after each delta).
#[derive(Debug, Default)]
pub(crate) struct ReceiverOracle {
    withheld: BTreeSet<(AgentId, Scope)>,
    weights: BTreeMap<(AgentId, WeightKey), i64>,
    dropped: BTreeSet<TokenId>,
    cached: BTreeSet<TokenId>,
}

impl ReceiverOracle {
    pub(crate) fn apply(&mut self, o: &Obligation, min: i64, max: i64) {
        match &o.payload {
            Payload::AnumatiConsent(p) => {
                let key = (o.issuer.clone(), p.scope.clone());
                if restrictive(o) {
                    self.withheld.insert(key);
                } else {
                    self.withheld.remove(&key);
                }
            }
            Payload::PhalaBeliefUpdate(p) => {
                let w = self
                    .weights
                    .entry((o.issuer.clone(), p.weight_key.clone()))
                    .or_insert(0);
                *w = (*w + i64::from(p.weight_delta.0)).clamp(min, max);
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
        }
    }

    pub(crate) fn differences(&self, agent: &AgentId, actual: &ReceiverState) -> Vec<String> {
        let mut out = Vec::new();
        let withheld: BTreeSet<_> = actual.withheld().cloned().collect();
        if withheld != self.withheld {
            out.push(format!(
                "{agent}: withholds {withheld:?}, its applies give {:?}",
                self.withheld
            ));
        }
        let weights: BTreeMap<_, _> = actual
            .weights()
            .filter(|(_, w)| *w != 0)
            .map(|(k, w)| (k.clone(), w))
            .collect();
        let expected: BTreeMap<_, _> = self
            .weights
            .iter()
            .filter(|(_, w)| **w != 0)
            .map(|(k, w)| (k.clone(), *w))
            .collect();
        if weights != expected {
            out.push(format!(
                "{agent}: weights {weights:?}, its applies give {expected:?}"
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
