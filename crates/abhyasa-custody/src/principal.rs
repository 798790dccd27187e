//! Principal-side state: what the custodian's own side permits, routes and honours.
//!
//! Every update is idempotent — a set-to-safe, or an adjustment keyed by the obligation id —
//! so applying one twice (for example after a crash between "applied" and "recorded") equals
//! applying it once.

use std::collections::{BTreeMap, BTreeSet};

use abhyasa_wire::{AgentId, ObligationId, SafeAction, Scope, TokenId, UnixMillis, WeightKey};

use crate::kinds::PrincipalUpdate;

/// Bounds of principal-side routing weights, in millionths.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct WeightBounds {
    /// Lowest weight.
    pub min: i64,
    /// Highest weight.
    pub max: i64,
    /// Weight of a route never adjusted.
    pub initial: i64,
}

impl Default for WeightBounds {
    fn default() -> Self {
        Self {
            min: 0,
            max: 1_000_000,
            initial: 1_000_000,
        }
    }
}

/// One (target, scope) authorization.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Authorization {
    /// Whether the principal withholds the scope.
    pub withheld: bool,
    /// The sequence of the decision that set it.
    pub sequence: Option<u64>,
}

/// One keyed down-weight, as a store keeps it.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Adjustment {
    /// The agent routed to less.
    pub target: AgentId,
    /// The route.
    pub weight_key: WeightKey,
    /// By how much, in millionths.
    pub amount: u32,
    /// When it may fold into the base.
    pub fold_after: UnixMillis,
}

#[derive(Clone, Debug, PartialEq, Eq, Hash, Default)]
struct Routing {
    base: i64,
    adjustments: BTreeMap<ObligationId, (u32, UnixMillis)>,
}

/// The principal's authorizations, routing weights and revoked tokens.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Default)]
pub struct PrincipalState {
    bounds: WeightBounds,
    authorizations: BTreeMap<(AgentId, Scope), Authorization>,
    routing: BTreeMap<(AgentId, WeightKey), Routing>,
    revoked_tokens: BTreeSet<TokenId>,
    adjustments: usize,
}

impl PrincipalState {
    /// Empty state with the given weight bounds.
    pub fn new(bounds: WeightBounds) -> Self {
        Self {
            bounds,
            ..Self::default()
        }
    }

    /// Applies an update; returns whether anything changed. Idempotent.
    pub fn apply(&mut self, update: &PrincipalUpdate) -> bool {
        match update {
            PrincipalUpdate::Safe(action) => self.apply_safe(action),
            PrincipalUpdate::Grant {
                target,
                scope,
                sequence,
            } => self.decide(target, scope, false, *sequence),
        }
    }

    /// Applies a safe action; returns whether anything changed. Idempotent.
    pub fn apply_safe(&mut self, action: &SafeAction) -> bool {
        match action {
            SafeAction::WithholdScope {
                target,
                scope,
                sequence,
            } => self.decide(target, scope, true, *sequence),
            SafeAction::DownWeight {
                obligation_id,
                target,
                weight_key,
                amount,
                fold_after,
            } => {
                let initial = self.bounds.initial;
                let routing = self
                    .routing
                    .entry((target.clone(), weight_key.clone()))
                    .or_insert_with(|| Routing {
                        base: initial,
                        adjustments: BTreeMap::new(),
                    });
                let fresh = routing
                    .adjustments
                    .insert(*obligation_id, (*amount, *fold_after))
                    .is_none();
                self.adjustments += usize::from(fresh);
                fresh
            }
            SafeAction::StopHonouringToken { token_id } => {
                self.revoked_tokens.insert(token_id.clone())
            }
        }
    }

    fn decide(
        &mut self,
        target: &AgentId,
        scope: &Scope,
        withheld: bool,
        sequence: Option<u64>,
    ) -> bool {
        let key = (target.clone(), scope.clone());
        let current = self.authorizations.get(&key).copied();
        // A decision never overrides a strictly newer one on the same scope.
        if let Some(Authorization {
            sequence: Some(cur),
            ..
        }) = current
        {
            if sequence.is_some_and(|s| s < cur) {
                return false;
            }
        }
        let next = Authorization { withheld, sequence };
        self.authorizations.insert(key, next);
        current != Some(next)
    }

    /// Folds keyed adjustments whose `fold_after` has passed into the base weight, bounding
    /// memory. Folding never changes an effective weight. Returns the folded obligation ids
    /// with their routes, so a store can rewrite exactly those rows.
    pub fn fold(&mut self, now: UnixMillis) -> Vec<(ObligationId, AgentId, WeightKey)> {
        let min = self.bounds.min;
        let mut folded = Vec::new();
        for ((target, key), routing) in self.routing.iter_mut() {
            routing.adjustments.retain(|id, (amount, fold_after)| {
                if *fold_after > now {
                    return true;
                }
                routing.base = (routing.base - i64::from(*amount)).max(min);
                folded.push((*id, target.clone(), key.clone()));
                false
            });
        }
        self.adjustments -= folded.len();
        folded
    }

    /// Rebuilds state from its rows (as a store keeps them).
    pub fn from_parts(
        bounds: WeightBounds,
        authorizations: impl IntoIterator<Item = ((AgentId, Scope), Authorization)>,
        bases: impl IntoIterator<Item = ((AgentId, WeightKey), i64)>,
        adjustments: impl IntoIterator<Item = (ObligationId, Adjustment)>,
        revoked_tokens: impl IntoIterator<Item = TokenId>,
    ) -> Self {
        let mut this = Self::new(bounds);
        this.authorizations = authorizations.into_iter().collect();
        for (route, base) in bases {
            this.routing.entry(route).or_default().base = base;
        }
        for (id, adj) in adjustments {
            let routing = this
                .routing
                .entry((adj.target, adj.weight_key))
                .or_insert_with(|| Routing {
                    base: bounds.initial,
                    adjustments: BTreeMap::new(),
                });
            if routing
                .adjustments
                .insert(id, (adj.amount, adj.fold_after))
                .is_none()
            {
                this.adjustments += 1;
            }
        }
        this.revoked_tokens = revoked_tokens.into_iter().collect();
        this
    }

    /// The weight bounds.
    pub fn bounds(&self) -> WeightBounds {
        self.bounds
    }

    /// The base weight of a route (before unfolded adjustments), if the route exists.
    pub fn routing_base(&self, target: &AgentId, key: &WeightKey) -> Option<i64> {
        self.routing
            .get(&(target.clone(), key.clone()))
            .map(|r| r.base)
    }

    /// Every unfolded keyed adjustment.
    pub fn adjustments(&self) -> impl Iterator<Item = (ObligationId, Adjustment)> + '_ {
        self.routing.iter().flat_map(|((target, key), r)| {
            r.adjustments.iter().map(|(id, (amount, fold_after))| {
                (
                    *id,
                    Adjustment {
                        target: target.clone(),
                        weight_key: key.clone(),
                        amount: *amount,
                        fold_after: *fold_after,
                    },
                )
            })
        })
    }

    /// Whether `scope` is withheld from `target`.
    pub fn is_withheld(&self, target: &AgentId, scope: &Scope) -> bool {
        self.authorization(target, scope)
            .is_some_and(|a| a.withheld)
    }

    /// The authorization of (`target`, `scope`), if any decision was made.
    pub fn authorization(&self, target: &AgentId, scope: &Scope) -> Option<Authorization> {
        self.authorizations
            .get(&(target.clone(), scope.clone()))
            .copied()
    }

    /// The effective routing weight to `target` on `key`, clipped to the bounds.
    pub fn routing_weight(&self, target: &AgentId, key: &WeightKey) -> i64 {
        let Some(routing) = self.routing.get(&(target.clone(), key.clone())) else {
            return self.bounds.initial;
        };
        let down: i64 = routing
            .adjustments
            .values()
            .map(|(a, _)| i64::from(*a))
            .sum();
        (routing.base - down).clamp(self.bounds.min, self.bounds.max)
    }

    /// Whether the keyed down-weight of `obligation` is recorded (and not yet folded).
    pub fn has_adjustment(
        &self,
        target: &AgentId,
        key: &WeightKey,
        obligation: ObligationId,
    ) -> bool {
        self.routing
            .get(&(target.clone(), key.clone()))
            .is_some_and(|r| r.adjustments.contains_key(&obligation))
    }

    /// Whether the principal stopped honouring `token`.
    pub fn is_revoked(&self, token: &TokenId) -> bool {
        self.revoked_tokens.contains(token)
    }

    /// Whether `action` is in force: the check an auditor makes after an escalation.
    pub fn holds(&self, action: &SafeAction) -> bool {
        match action {
            SafeAction::WithholdScope {
                target,
                scope,
                sequence,
            } => self.authorization(target, scope).is_some_and(|a| {
                a.withheld || matches!((a.sequence, sequence), (Some(cur), Some(s)) if cur > *s)
            }),
            SafeAction::DownWeight {
                obligation_id,
                target,
                weight_key,
                ..
            } => self.has_adjustment(target, weight_key, *obligation_id),
            SafeAction::StopHonouringToken { token_id } => self.is_revoked(token_id),
        }
    }

    /// Number of entries held (authorizations, unfolded adjustments, revoked tokens).
    pub fn entries(&self) -> usize {
        self.authorizations.len() + self.adjustments + self.revoked_tokens.len()
    }

    /// All authorizations, in key order.
    pub fn authorizations(&self) -> impl Iterator<Item = (&(AgentId, Scope), &Authorization)> {
        self.authorizations.iter()
    }

    /// All revoked tokens, in order.
    pub fn revoked_tokens(&self) -> impl Iterator<Item = &TokenId> {
        self.revoked_tokens.iter()
    }

    /// All routes with an adjustment, with their effective weights.
    pub fn routes(&self) -> impl Iterator<Item = (&(AgentId, WeightKey), i64)> + '_ {
        self.routing
            .keys()
            .map(|k| (k, self.routing_weight(&k.0, &k.1)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn a() -> AgentId {
        AgentId::new("a").unwrap()
    }

    fn withhold(seq: Option<u64>) -> SafeAction {
        SafeAction::WithholdScope {
            target: a(),
            scope: Scope::new("cal").unwrap(),
            sequence: seq,
        }
    }

    fn down(id: u128, amount: u32, fold_after: u64) -> SafeAction {
        SafeAction::DownWeight {
            obligation_id: ObligationId::from_u128(id),
            target: a(),
            weight_key: WeightKey::new("k").unwrap(),
            amount,
            fold_after: UnixMillis(fold_after),
        }
    }

    #[test]
    fn safe_actions_are_idempotent() {
        let mut s = PrincipalState::new(WeightBounds::default());
        for action in [
            withhold(Some(1)),
            down(1, 300_000, 10),
            SafeAction::StopHonouringToken {
                token_id: TokenId::new("t").unwrap(),
            },
        ] {
            assert!(s.apply_safe(&action));
            let once = s.clone();
            assert!(!s.apply_safe(&action), "{action:?} changed state twice");
            assert_eq!(s, once);
            assert!(s.holds(&action));
        }
        let k = WeightKey::new("k").unwrap();
        assert_eq!(s.routing_weight(&a(), &k), 700_000);
    }

    #[test]
    fn down_weights_are_keyed_and_clipped() {
        let mut s = PrincipalState::new(WeightBounds::default());
        let k = WeightKey::new("k").unwrap();
        s.apply_safe(&down(1, 600_000, 10));
        s.apply_safe(&down(2, 600_000, 20));
        s.apply_safe(&down(2, 600_000, 20));
        assert_eq!(s.routing_weight(&a(), &k), 0);
        assert_eq!(s.entries(), 2);
        // Folding keeps the effective weight and frees the keyed entries.
        assert_eq!(
            s.fold(UnixMillis(15)),
            vec![(ObligationId::from_u128(1), a(), k.clone())]
        );
        assert_eq!(s.routing_weight(&a(), &k), 0);
        assert_eq!(s.fold(UnixMillis(25)).len(), 1);
        assert_eq!(s.entries(), 0);
        assert_eq!(s.routing_weight(&a(), &k), 0);
    }

    #[test]
    fn state_round_trips_through_its_parts() {
        let mut s = PrincipalState::new(WeightBounds::default());
        s.apply_safe(&withhold(Some(2)));
        s.apply_safe(&down(1, 100_000, 10));
        s.apply_safe(&down(2, 200_000, 20));
        s.fold(UnixMillis(10));
        s.apply_safe(&SafeAction::StopHonouringToken {
            token_id: TokenId::new("t").unwrap(),
        });
        let k = WeightKey::new("k").unwrap();
        let bases = s.routing_base(&a(), &k).map(|b| ((a(), k.clone()), b));
        let rebuilt = PrincipalState::from_parts(
            s.bounds(),
            s.authorizations().map(|(k, v)| (k.clone(), *v)),
            bases,
            s.adjustments(),
            s.revoked_tokens().cloned(),
        );
        assert_eq!(rebuilt, s);
    }

    #[test]
    fn an_older_withhold_does_not_override_a_newer_grant() {
        let mut s = PrincipalState::new(WeightBounds::default());
        let scope = Scope::new("cal").unwrap();
        s.apply(&PrincipalUpdate::Grant {
            target: a(),
            scope: scope.clone(),
            sequence: Some(5),
        });
        assert!(!s.apply_safe(&withhold(Some(4))));
        assert!(!s.is_withheld(&a(), &scope));
        // The superseded withhold still counts as honoured: a newer decision stands.
        assert!(s.holds(&withhold(Some(4))));
        assert!(s.apply_safe(&withhold(Some(6))));
        assert!(s.is_withheld(&a(), &scope));
        assert!(!s.holds(&down(9, 1, 1)));
    }
}
