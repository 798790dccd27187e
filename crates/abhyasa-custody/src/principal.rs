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
    /// The obligation that carried the decision in force (`None` in a store written before
    /// it was kept): what an enforcement point names when it refuses.
    pub by: Option<ObligationId>,
    /// A grant's lease: the scope is open only before this time (`None`: no lease, or
    /// withheld).
    pub until: Option<UnixMillis>,
}

impl Authorization {
    /// Whether this decision lets the scope be exercised at `now`: granted, and its lease (if
    /// any) not yet ended.
    pub fn permits(&self, now: UnixMillis) -> bool {
        !self.withheld && self.until.is_none_or(|end| now < end)
    }
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
    /// When it may fold into the base, if it never lapses.
    pub fold_after: UnixMillis,
    /// When it lapses (`None`: a record from before updates lapsed; it folds instead).
    pub lapses_at: Option<UnixMillis>,
}

impl Adjustment {
    /// Whether the adjustment still applies at `now`.
    pub fn applies(&self, now: UnixMillis) -> bool {
        self.lapses_at.is_none_or(|end| now < end)
    }
}

/// A keyed down-weight as a route holds it: (amount, fold_after, lapses_at).
type Keyed = (u32, UnixMillis, Option<UnixMillis>);

#[derive(Clone, Debug, PartialEq, Eq, Hash, Default)]
struct Routing {
    base: i64,
    adjustments: BTreeMap<ObligationId, Keyed>,
}

/// The principal's authorizations, routing weights and revoked tokens.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Default)]
pub struct PrincipalState {
    bounds: WeightBounds,
    authorizations: BTreeMap<(AgentId, Scope), Authorization>,
    routing: BTreeMap<(AgentId, WeightKey), Routing>,
    /// Token → its own expiry (`None`: kept for good).
    revoked_tokens: BTreeMap<TokenId, Option<UnixMillis>>,
    /// The revoked tokens that expire, by expiry.
    token_expiry: BTreeSet<(UnixMillis, TokenId)>,
    /// The obligation that revoked each token most recently.
    token_revoked_by: BTreeMap<TokenId, ObligationId>,
    adjustments: usize,
}

/// Takes at most `limit` entries whose expiry is at or before `now` off an expiry index, the
/// earliest first, as (token, expiry).
pub(crate) fn pop_expired(
    index: &mut BTreeSet<(UnixMillis, TokenId)>,
    now: UnixMillis,
    limit: usize,
) -> Vec<(TokenId, UnixMillis)> {
    let mut gone = Vec::new();
    while gone.len() < limit && index.first().is_some_and(|(at, _)| *at <= now) {
        if let Some((at, token)) = index.pop_first() {
            gone.push((token, at));
        }
    }
    gone
}

/// The later of two token expiries, where `None` (never) is the latest: what a record of a
/// token revoked (or cached) twice keeps, so neither message shortens the other.
pub fn later_expiry(a: Option<UnixMillis>, b: Option<UnixMillis>) -> Option<UnixMillis> {
    match (a, b) {
        (Some(a), Some(b)) => Some(a.max(b)),
        _ => None,
    }
}

impl PrincipalState {
    /// Empty state with the given weight bounds.
    pub fn new(bounds: WeightBounds) -> Self {
        Self {
            bounds,
            ..Self::default()
        }
    }

    /// Applies an update carried by obligation `by`; returns whether anything changed,
    /// including which obligation a decision in force is named by. Idempotent.
    pub fn apply(&mut self, update: &PrincipalUpdate, by: ObligationId) -> bool {
        match update {
            PrincipalUpdate::Safe(action) => {
                if let SafeAction::WithholdScope {
                    target,
                    scope,
                    sequence,
                } = action
                {
                    return self.decide_named(target, scope, true, *sequence, None, Some(by));
                }
                let changed = self.apply_safe(action);
                let named = match action {
                    SafeAction::StopHonouringToken { token_id, .. } => {
                        self.token_revoked_by.insert(token_id.clone(), by) != Some(by)
                    }
                    // A down-weight is keyed by its obligation already.
                    _ => false,
                };
                changed || named
            }
            PrincipalUpdate::AwaitGrant {
                target,
                scope,
                sequence,
            } => match self.authorization(target, scope) {
                // An open grant runs to its own lease while its renewal is unconfirmed.
                Some(a) if !a.withheld => false,
                _ => self.decide_named(target, scope, true, *sequence, None, Some(by)),
            },
            PrincipalUpdate::Grant {
                target,
                scope,
                sequence,
                until,
            } => self.decide_named(target, scope, false, *sequence, *until, Some(by)),
        }
    }

    /// Applies a safe action; returns whether anything changed. Idempotent.
    pub fn apply_safe(&mut self, action: &SafeAction) -> bool {
        match action {
            SafeAction::WithholdScope {
                target,
                scope,
                sequence,
            } => self.decide_named(target, scope, true, *sequence, None, None),
            SafeAction::DownWeight {
                obligation_id,
                target,
                weight_key,
                amount,
                fold_after,
                lapses_at,
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
                    .insert(*obligation_id, (*amount, *fold_after, *lapses_at))
                    .is_none();
                self.adjustments += usize::from(fresh);
                fresh
            }
            SafeAction::StopHonouringToken {
                token_id,
                expires_at,
            } => {
                let held = self.revoked_tokens.get(token_id).copied();
                let next = held.map_or(*expires_at, |h| later_expiry(h, *expires_at));
                if held == Some(next) {
                    return false;
                }
                if let Some(Some(at)) = held {
                    self.token_expiry.remove(&(at, token_id.clone()));
                }
                if let Some(at) = next {
                    self.token_expiry.insert((at, token_id.clone()));
                }
                self.revoked_tokens.insert(token_id.clone(), next);
                true
            }
        }
    }

    /// Forgets at most `limit` revoked tokens whose own expiry is at or before `now`: no
    /// service honours an expired token, so the record no longer protects anything. Returns
    /// them with their expiries, so a store can delete exactly those rows.
    pub fn expire_tokens(&mut self, now: UnixMillis, limit: usize) -> Vec<(TokenId, UnixMillis)> {
        let gone = pop_expired(&mut self.token_expiry, now, limit);
        for (token, _) in &gone {
            self.revoked_tokens.remove(token);
            self.token_revoked_by.remove(token);
        }
        gone
    }

    /// Takes a decision on (`target`, `scope`) unless a strictly newer one stands; `until` is
    /// a grant's lease; `by`, when given, names the obligation of a decision taken. Returns
    /// whether anything changed.
    fn decide_named(
        &mut self,
        target: &AgentId,
        scope: &Scope,
        withheld: bool,
        sequence: Option<u64>,
        until: Option<UnixMillis>,
        by: Option<ObligationId>,
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
        let next = Authorization {
            withheld,
            sequence,
            by: by.or(current.and_then(|c| c.by)),
            until: if withheld { None } else { until },
        };
        self.authorizations.insert(key, next);
        current != Some(next)
    }

    /// Bounds memory: drops keyed adjustments that lapsed at or before `now` (they no longer
    /// apply), and folds those that never lapse (records from before updates lapsed) into the
    /// base weight once their `fold_after` has passed. Neither changes an effective weight at
    /// `now`. Returns the obligation ids gone with their routes, so a store can rewrite
    /// exactly those rows.
    pub fn fold(&mut self, now: UnixMillis) -> Vec<(ObligationId, AgentId, WeightKey)> {
        let min = self.bounds.min;
        let mut folded = Vec::new();
        for ((target, key), routing) in self.routing.iter_mut() {
            routing
                .adjustments
                .retain(|id, (amount, fold_after, lapses_at)| {
                    match lapses_at {
                        Some(end) if *end <= now => {}
                        Some(_) => return true,
                        None if *fold_after > now => return true,
                        None => routing.base = (routing.base - i64::from(*amount)).max(min),
                    }
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
        revoked_tokens: impl IntoIterator<Item = (TokenId, Option<UnixMillis>)>,
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
                .insert(id, (adj.amount, adj.fold_after, adj.lapses_at))
                .is_none()
            {
                this.adjustments += 1;
            }
        }
        for (token, expires_at) in revoked_tokens {
            this.apply_safe(&SafeAction::StopHonouringToken {
                token_id: token,
                expires_at,
            });
        }
        this
    }

    /// Names the obligation that revoked each token (as a store keeps them); a token with no
    /// revocation record is skipped.
    pub fn with_token_revocations(
        mut self,
        by: impl IntoIterator<Item = (TokenId, ObligationId)>,
    ) -> Self {
        for (token, id) in by {
            if self.revoked_tokens.contains_key(&token) {
                self.token_revoked_by.insert(token, id);
            }
        }
        self
    }

    /// The obligation that revoked `token` most recently, if its record is held and names one.
    pub fn token_revoked_by(&self, token: &TokenId) -> Option<ObligationId> {
        self.token_revoked_by.get(token).copied()
    }

    /// Every revoked token with the obligation that revoked it, in order.
    pub fn token_revocations(&self) -> impl Iterator<Item = (&TokenId, ObligationId)> {
        self.token_revoked_by.iter().map(|(t, id)| (t, *id))
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
            r.adjustments
                .iter()
                .map(|(id, (amount, fold_after, lapses_at))| {
                    (
                        *id,
                        Adjustment {
                            target: target.clone(),
                            weight_key: key.clone(),
                            amount: *amount,
                            fold_after: *fold_after,
                            lapses_at: *lapses_at,
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

    /// Whether the principal lets `target` exercise `scope` at `now`: `None` if it never
    /// decided on it, else whether a confirmed grant stands and its lease has not ended.
    pub fn permits(&self, target: &AgentId, scope: &Scope, now: UnixMillis) -> Option<bool> {
        self.authorization(target, scope).map(|a| a.permits(now))
    }

    /// The authorization of (`target`, `scope`), if any decision was made.
    pub fn authorization(&self, target: &AgentId, scope: &Scope) -> Option<Authorization> {
        self.authorizations
            .get(&(target.clone(), scope.clone()))
            .copied()
    }

    /// The effective routing weight to `target` on `key` at `now`, clipped to the bounds:
    /// the base less every keyed down-weight that has not lapsed by `now` (whether or not
    /// upkeep has dropped the lapsed ones yet).
    pub fn routing_weight(&self, target: &AgentId, key: &WeightKey, now: UnixMillis) -> i64 {
        let Some(routing) = self.routing.get(&(target.clone(), key.clone())) else {
            return self.bounds.initial;
        };
        let down: i64 = routing
            .adjustments
            .values()
            .filter(|(_, _, lapses)| lapses.is_none_or(|end| now < end))
            .map(|(a, _, _)| i64::from(*a))
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

    /// Whether the principal holds a record of not honouring `token` (a token forgotten
    /// after its own expiry has none: an auditor treats it as not honoured by its expiry).
    pub fn is_revoked(&self, token: &TokenId) -> bool {
        self.revoked_tokens.contains_key(token)
    }

    /// The revocation record of `token`: `None` if there is none, `Some(None)` if it is kept
    /// for good, `Some(Some(t))` if it is forgotten at the token's expiry `t`.
    pub fn revoked_until(&self, token: &TokenId) -> Option<Option<UnixMillis>> {
        self.revoked_tokens.get(token).copied()
    }

    /// Whether `action` is recorded in force: the check an auditor makes after an escalation
    /// (a down-weight that lapsed is no longer held: its auditor allows for the lapse).
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
            SafeAction::StopHonouringToken { token_id, .. } => self.is_revoked(token_id),
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
        self.revoked_tokens.keys()
    }

    /// All revoked tokens with their expiries (`None`: kept for good), in order.
    pub fn revoked_tokens_until(&self) -> impl Iterator<Item = (&TokenId, Option<UnixMillis>)> {
        self.revoked_tokens.iter().map(|(t, e)| (t, *e))
    }

    /// All routes with an adjustment, with their effective weights at `now`.
    pub fn routes(
        &self,
        now: UnixMillis,
    ) -> impl Iterator<Item = (&(AgentId, WeightKey), i64)> + '_ {
        self.routing
            .keys()
            .map(move |k| (k, self.routing_weight(&k.0, &k.1, now)))
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

    /// A down-weight that never lapses (a record from before updates lapsed).
    fn down(id: u128, amount: u32, fold_after: u64) -> SafeAction {
        SafeAction::DownWeight {
            obligation_id: ObligationId::from_u128(id),
            target: a(),
            weight_key: WeightKey::new("k").unwrap(),
            amount,
            fold_after: UnixMillis(fold_after),
            lapses_at: None,
        }
    }

    /// A down-weight that lapses at `lapses_at`.
    fn lapsing(id: u128, amount: u32, lapses_at: u64) -> SafeAction {
        let mut action = down(id, amount, 5);
        if let SafeAction::DownWeight { lapses_at: l, .. } = &mut action {
            *l = Some(UnixMillis(lapses_at));
        }
        action
    }

    #[test]
    fn a_down_weight_lapses_at_its_ttl_and_only_then() {
        let mut s = PrincipalState::new(WeightBounds::default());
        let k = WeightKey::new("k").unwrap();
        let w = |s: &PrincipalState, t| s.routing_weight(&a(), &k, UnixMillis(t));
        s.apply_safe(&lapsing(1, 300_000, 100));
        s.apply_safe(&lapsing(2, 900_000, 200));
        // Together they clip at the floor; each lapses at its own end, folded or not.
        assert_eq!(w(&s, 99), 0);
        assert_eq!(w(&s, 100), 100_000);
        assert_eq!(w(&s, 199), 100_000);
        assert_eq!(w(&s, 200), 1_000_000);
        // Upkeep past `fold_after` (5) but before a lapse keeps both records; at a lapse the
        // record goes and nothing folds into the base.
        assert_eq!(s.fold(UnixMillis(99)), vec![]);
        assert_eq!(s.entries(), 2);
        assert_eq!(
            s.fold(UnixMillis(150)),
            vec![(ObligationId::from_u128(1), a(), k.clone())]
        );
        assert!(!s.holds(&lapsing(1, 300_000, 100)));
        assert!(s.holds(&lapsing(2, 900_000, 200)));
        assert_eq!(s.routing_base(&a(), &k), Some(1_000_000));
        assert_eq!(w(&s, 150), 100_000);
        assert_eq!(s.fold(UnixMillis(200)).len(), 1);
        assert_eq!((s.entries(), w(&s, 200)), (0, 1_000_000));
    }

    #[test]
    fn safe_actions_are_idempotent() {
        let mut s = PrincipalState::new(WeightBounds::default());
        for action in [
            withhold(Some(1)),
            down(1, 300_000, 10),
            SafeAction::StopHonouringToken {
                token_id: TokenId::new("t").unwrap(),
                expires_at: None,
            },
            SafeAction::StopHonouringToken {
                token_id: TokenId::new("u").unwrap(),
                expires_at: Some(UnixMillis(50)),
            },
        ] {
            assert!(s.apply_safe(&action));
            let once = s.clone();
            assert!(!s.apply_safe(&action), "{action:?} changed state twice");
            assert_eq!(s, once);
            assert!(s.holds(&action));
        }
        let k = WeightKey::new("k").unwrap();
        assert_eq!(s.routing_weight(&a(), &k, UnixMillis(0)), 700_000);
    }

    #[test]
    fn down_weights_are_keyed_and_clipped() {
        let mut s = PrincipalState::new(WeightBounds::default());
        let k = WeightKey::new("k").unwrap();
        s.apply_safe(&down(1, 600_000, 10));
        s.apply_safe(&down(2, 600_000, 20));
        s.apply_safe(&down(2, 600_000, 20));
        assert_eq!(s.routing_weight(&a(), &k, UnixMillis(0)), 0);
        assert_eq!(s.entries(), 2);
        // Folding keeps the effective weight and frees the keyed entries.
        assert_eq!(
            s.fold(UnixMillis(15)),
            vec![(ObligationId::from_u128(1), a(), k.clone())]
        );
        assert_eq!(s.routing_weight(&a(), &k, UnixMillis(0)), 0);
        assert_eq!(s.fold(UnixMillis(25)).len(), 1);
        assert_eq!(s.entries(), 0);
        assert_eq!(s.routing_weight(&a(), &k, UnixMillis(0)), 0);
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
            expires_at: None,
        });
        s.apply_safe(&stop("u", Some(40)));
        let k = WeightKey::new("k").unwrap();
        let bases = s.routing_base(&a(), &k).map(|b| ((a(), k.clone()), b));
        let rebuilt = PrincipalState::from_parts(
            s.bounds(),
            s.authorizations().map(|(k, v)| (k.clone(), *v)),
            bases,
            s.adjustments(),
            s.revoked_tokens_until().map(|(t, e)| (t.clone(), e)),
        );
        assert_eq!(rebuilt, s);
    }

    fn stop(token: &str, expires_at: Option<u64>) -> SafeAction {
        SafeAction::StopHonouringToken {
            token_id: TokenId::new(token).unwrap(),
            expires_at: expires_at.map(UnixMillis),
        }
    }

    #[test]
    fn revoked_tokens_are_forgotten_at_their_own_expiry_and_not_before() {
        let mut s = PrincipalState::new(WeightBounds::default());
        let t = |n: &str| TokenId::new(n).unwrap();
        s.apply_safe(&stop("early", Some(10)));
        s.apply_safe(&stop("late", Some(30)));
        s.apply_safe(&stop("forever", None));
        // Revoked again with a later expiry: the later one is kept; with an earlier one,
        // nothing changes; without one, the record is kept for good.
        assert!(s.apply_safe(&stop("late", Some(40))));
        assert!(!s.apply_safe(&stop("late", Some(20))));
        s.apply_safe(&stop("both", Some(10)));
        assert!(s.apply_safe(&stop("both", None)));
        assert_eq!(s.revoked_until(&t("late")), Some(Some(UnixMillis(40))));
        assert_eq!(s.revoked_until(&t("both")), Some(None));
        assert_eq!(s.entries(), 4);

        assert_eq!(s.expire_tokens(UnixMillis(9), usize::MAX), vec![]);
        assert_eq!(
            s.expire_tokens(UnixMillis(10), usize::MAX),
            vec![(t("early"), UnixMillis(10))]
        );
        assert!(!s.is_revoked(&t("early")));
        // The earlier expiry "late" was first revoked with is gone with its record.
        assert_eq!(s.expire_tokens(UnixMillis(39), usize::MAX), vec![]);
        assert_eq!(s.expire_tokens(UnixMillis(1_000), 0), vec![]);
        assert_eq!(
            s.expire_tokens(UnixMillis(1_000), usize::MAX),
            vec![(t("late"), UnixMillis(40))]
        );
        assert_eq!(
            s.revoked_tokens().cloned().collect::<Vec<_>>(),
            vec![t("both"), t("forever")]
        );
        assert_eq!(s.entries(), 2);
    }

    #[test]
    fn an_older_withhold_does_not_override_a_newer_grant() {
        let mut s = PrincipalState::new(WeightBounds::default());
        let scope = Scope::new("cal").unwrap();
        s.apply(
            &PrincipalUpdate::Grant {
                target: a(),
                scope: scope.clone(),
                sequence: Some(5),
                until: None,
            },
            ObligationId::from_u128(5),
        );
        assert!(!s.apply_safe(&withhold(Some(4))));
        assert!(!s.is_withheld(&a(), &scope));
        // The superseded withhold still counts as honoured: a newer decision stands.
        assert!(s.holds(&withhold(Some(4))));
        assert!(s.apply_safe(&withhold(Some(6))));
        assert!(s.is_withheld(&a(), &scope));
        assert!(!s.holds(&down(9, 1, 1)));
    }

    #[test]
    fn a_decision_in_force_names_the_obligation_that_carried_it() {
        let mut s = PrincipalState::new(WeightBounds::default());
        let scope = Scope::new("cal").unwrap();
        let id = ObligationId::from_u128;
        let by = |s: &PrincipalState| s.authorization(&a(), &scope).and_then(|x| x.by);
        assert!(s.apply(&PrincipalUpdate::Safe(withhold(Some(3))), id(1)));
        assert_eq!(by(&s), Some(id(1)));
        // Re-asserted by the same obligation (its escalation): nothing changes.
        assert!(!s.apply(&PrincipalUpdate::Safe(withhold(Some(3))), id(1)));
        // An older decision neither overrides nor renames the one in force.
        assert!(!s.apply(
            &PrincipalUpdate::Grant {
                target: a(),
                scope: scope.clone(),
                sequence: Some(2),
                until: None,
            },
            id(2)
        ));
        assert_eq!(by(&s), Some(id(1)));
        assert!(s.is_withheld(&a(), &scope));
        // A newer one does both.
        assert!(s.apply(
            &PrincipalUpdate::Grant {
                target: a(),
                scope: scope.clone(),
                sequence: Some(4),
                until: None,
            },
            id(3)
        ));
        assert_eq!(by(&s), Some(id(3)));
        // A safe action applied without an obligation keeps the name it had.
        assert!(s.apply_safe(&withhold(Some(5))));
        assert_eq!(by(&s), Some(id(3)));

        let t = TokenId::new("t").unwrap();
        assert!(s.apply(&PrincipalUpdate::Safe(stop("t", Some(10))), id(7)));
        assert!(s.apply(&PrincipalUpdate::Safe(stop("t", Some(10))), id(8)));
        assert_eq!(s.token_revoked_by(&t), Some(id(8)));
        // Rebuilt from a store's rows, the name is kept only for a token still recorded.
        let rebuilt = PrincipalState::from_parts(
            s.bounds(),
            s.authorizations().map(|(k, v)| (k.clone(), *v)),
            None,
            s.adjustments(),
            s.revoked_tokens_until().map(|(t, e)| (t.clone(), e)),
        )
        .with_token_revocations([(t.clone(), id(8)), (TokenId::new("u").unwrap(), id(9))]);
        assert_eq!(rebuilt, s);
        s.expire_tokens(UnixMillis(10), usize::MAX);
        assert_eq!(s.token_revoked_by(&t), None);
    }
}
