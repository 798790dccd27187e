//! The kind registry: per kind, admissibility (AC-1), `safe(O)`, the governed key, the
//! principal-side update at issue and the receiver effect.
//!
//! A built-in kind implements [`KindRules`] over its payload type and has its payload variant
//! in the dispatch below. A kind defined in another crate implements [`RegisteredKind`] in
//! one module and registers with [`register_kind!`](crate::register_kind). No custody field is
//! kind-specific.

use abhyasa_wire::{
    AgentId, Obligation, ObligationId, Payload, RegisteredPayload, SafeAction, Scope, TokenId,
    UnixMillis, WeightKey, WireKind,
};

mod belief_update;
mod consent;
mod token;

pub use belief_update::PhalaBeliefUpdate;
pub use consent::AnumatiConsent;
pub use token::OauthToken;

/// What a kind declares, over its own typed payload. `O` is the whole obligation (issuer,
/// target, deadline, sequence); `p` its payload.
pub trait KindRules {
    /// The payload type of this kind.
    type Payload;
    /// AC-1: does this instance declare a fail-safe polarity?
    fn admissible(p: &Self::Payload) -> bool;
    /// `safe(O)`: the principal-side action when delivery is not confirmed; `Some` exactly when
    /// the instance is admissible. `retention` is how long after the deadline a keyed
    /// adjustment must stay distinguishable.
    fn safe(o: &Obligation, p: &Self::Payload, retention: u64) -> Option<SafeAction>;
    /// The principal's own decision, applied at issue and never gated on an ack.
    fn on_issue(o: &Obligation, p: &Self::Payload) -> Option<PrincipalUpdate>;
    /// What the principal opens only once the target confirmed it (`applied`): authority
    /// an unconfirmed obligation must not open (fail-closed). `None` for most kinds.
    fn on_applied(_o: &Obligation, _p: &Self::Payload) -> Option<PrincipalUpdate> {
        None
    }
    /// The key whose `sequence` orders obligations (supersession).
    fn governed_key(o: &Obligation, p: &Self::Payload) -> GovernedKey;
    /// What the receiver does when it applies the obligation.
    fn effect(o: &Obligation, p: &Self::Payload) -> ReceiverEffect;
}

/// Dispatches one of the [`KindRules`] methods on an obligation's payload: a built-in kind by
/// its type, a registered kind through its [`Registration`] (`$unknown` when its rules are not
/// registered once).
macro_rules! dispatch {
    ($o:expr, |$p:ident, $rules:ident| $body:expr, |$reg:ident, $rp:ident| $registered:expr, $unknown:expr) => {
        match &$o.payload {
            Payload::AnumatiConsent($p) => {
                type $rules = AnumatiConsent;
                $body
            }
            Payload::PhalaBeliefUpdate($p) => {
                type $rules = PhalaBeliefUpdate;
                $body
            }
            Payload::OauthToken($p) => {
                type $rules = OauthToken;
                $body
            }
            Payload::Registered($rp) => match Registration::find($rp.kind()) {
                Some($reg) => $registered,
                None => $unknown,
            },
        }
    };
}

/// Whether this build has rules for `o`'s kind: always for a built-in kind; for a registered
/// kind, when its rules are registered once and read its payload. A receiver declines an
/// obligation without rules as `unknown_kind`.
pub fn known(o: &Obligation) -> bool {
    match &o.payload {
        Payload::Registered(p) => {
            Registration::find(p.kind()).is_some_and(|r| (r.admissible)(p).is_some())
        }
        _ => true,
    }
}

/// AC-1 for one obligation (`false` without rules: it is never taken into custody).
pub fn admissible(o: &Obligation) -> bool {
    dispatch!(
        o,
        |p, R| R::admissible(p),
        |r, p| (r.admissible)(p).unwrap_or(false),
        false
    )
}

/// `safe(O)` for one obligation; `None` when it is inadmissible.
pub fn safe(o: &Obligation, retention: u64) -> Option<SafeAction> {
    dispatch!(
        o,
        |p, R| R::safe(o, p, retention),
        |r, p| (r.safe)(o, p, retention),
        None
    )
}

/// The principal-side update applied when `o` is issued.
pub fn on_issue(o: &Obligation) -> Option<PrincipalUpdate> {
    dispatch!(o, |p, R| R::on_issue(o, p), |r, p| (r.on_issue)(o, p), None)
}

/// The principal-side update applied when the target acks `o` `applied`.
pub fn on_applied(o: &Obligation) -> Option<PrincipalUpdate> {
    dispatch!(
        o,
        |p, R| R::on_applied(o, p),
        |r, p| (r.on_applied)(o, p),
        None
    )
}

/// The mutant's key ([`crate::Mutation::SupersedeAcrossIssuers`]): the name without its
/// issuer.
pub(crate) fn without_issuer(key: GovernedKey) -> GovernedKey {
    let nobody = || AgentId::new("any-issuer").expect("a valid agent id");
    match key {
        GovernedKey::Scope(_, s) => GovernedKey::Scope(nobody(), s),
        GovernedKey::Weight(_, w) => GovernedKey::Weight(nobody(), w),
        GovernedKey::Token(_, t) => GovernedKey::Token(nobody(), t),
    }
}

/// The governed key of `o`; `None` without rules for its kind ([`known`]).
pub fn governed_key(o: &Obligation) -> Option<GovernedKey> {
    dispatch!(
        o,
        |p, R| Some(R::governed_key(o, p)),
        |r, p| (r.governed_key)(o, p),
        None
    )
}

/// The receiver effect of `o`; `None` without rules for its kind ([`known`]).
pub fn effect(o: &Obligation) -> Option<ReceiverEffect> {
    dispatch!(
        o,
        |p, R| Some(R::effect(o, p)),
        |r, p| (r.effect)(o, p),
        None
    )
}

/// A kind defined outside this crate, in one module: its payload and wording
/// ([`WireKind`]) and its rules ([`KindRules`]) over the same payload type. Registered with
/// [`register_kind!`](crate::register_kind); its obligations then travel, are taken into
/// custody, applied, enforced and recovered as a built-in kind's are.
///
/// A registered kind states its safe action and its effect in the governed state the
/// principal and the agent already keep (a scope withheld or granted, a weight moved, a token
/// dropped or cached), so the store, enforcement and the audit need nothing of their own.
pub trait RegisteredKind: WireKind + KindRules<Payload = <Self as WireKind>::Payload> {}

impl<K: WireKind + KindRules<Payload = <K as WireKind>::Payload>> RegisteredKind for K {}

/// A registered kind's rules, type-erased: each is `None` when the payload is not the kind's
/// type (a name registered by two kinds is not found at all, so this does not happen).
pub struct Registration {
    name: &'static str,
    admissible: fn(&RegisteredPayload) -> Option<bool>,
    safe: fn(&Obligation, &RegisteredPayload, u64) -> Option<SafeAction>,
    on_issue: fn(&Obligation, &RegisteredPayload) -> Option<PrincipalUpdate>,
    on_applied: fn(&Obligation, &RegisteredPayload) -> Option<PrincipalUpdate>,
    governed_key: fn(&Obligation, &RegisteredPayload) -> Option<GovernedKey>,
    effect: fn(&Obligation, &RegisteredPayload) -> Option<ReceiverEffect>,
}

abhyasa_wire::inventory::collect!(Registration);

impl Registration {
    /// The rules of `K`. Only [`register_kind!`](crate::register_kind) should submit one.
    #[doc(hidden)]
    pub const fn of<K: RegisteredKind>() -> Self {
        Self {
            name: <K as WireKind>::NAME,
            admissible: |p| typed::<K>(p).map(K::admissible),
            safe: |o, p, retention| K::safe(o, typed::<K>(p)?, retention),
            on_issue: |o, p| K::on_issue(o, typed::<K>(p)?),
            on_applied: |o, p| K::on_applied(o, typed::<K>(p)?),
            governed_key: |o, p| Some(K::governed_key(o, typed::<K>(p)?)),
            effect: |o, p| Some(K::effect(o, typed::<K>(p)?)),
        }
    }

    /// The one registration named `name`: `None` when there is none, or more than one.
    fn find(name: &str) -> Option<&'static Registration> {
        let mut found = abhyasa_wire::inventory::iter::<Registration>
            .into_iter()
            .filter(|r| r.name == name);
        let first = found.next()?;
        found.next().is_none().then_some(first)
    }
}

fn typed<K: RegisteredKind>(p: &RegisteredPayload) -> Option<&<K as WireKind>::Payload> {
    p.typed()
}

/// Registers a kind defined in this crate: `register_kind!(MyKind)`, where `MyKind`
/// implements [`WireKind`](abhyasa_wire::WireKind) and [`KindRules`](crate::kinds::KindRules)
/// over one payload type. Its obligations then read and apply in every node of this build.
#[macro_export]
macro_rules! register_kind {
    ($kind:ty) => {
        $crate::__wire::inventory::submit! { $crate::__wire::KindEntry::of::<$kind>() }
        $crate::__wire::inventory::submit! { $crate::kinds::Registration::of::<$kind>() }
    };
}

/// The thing a `sequence` orders, scoped to the issuer whose sequence it is.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum GovernedKey {
    /// A consent scope.
    Scope(AgentId, Scope),
    /// A preference weight.
    Weight(AgentId, WeightKey),
    /// A token.
    Token(AgentId, TokenId),
}

/// A change to principal-side state. Every variant is idempotent.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum PrincipalUpdate {
    /// A safe action (at issue for revocations, at escalation or decline otherwise).
    Safe(SafeAction),
    /// A grant of `scope` to `target` was issued and is not confirmed: the authority it opens
    /// stays closed (fail-closed). An open grant in force stands (a renewal does not close
    /// the lease it extends); anything else becomes a withhold named by the grant.
    AwaitGrant {
        /// The agent to be granted.
        target: AgentId,
        /// The scope.
        scope: Scope,
        /// The grant's sequence.
        sequence: Option<u64>,
    },
    /// The target confirmed a grant of `scope` (its `applied` ack): the scope opens, until
    /// the grant's lease, if it has one.
    Grant {
        /// The agent granted.
        target: AgentId,
        /// The scope.
        scope: Scope,
        /// The decision's sequence.
        sequence: Option<u64>,
        /// The lease: the authority lapses at this time (`None`: no lease).
        until: Option<UnixMillis>,
    },
}

/// A receiver-side effect. Not idempotent by itself (a weight delta adds): at-most-once comes
/// from the applied-id ledger committed with it.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum ReceiverEffect {
    /// Stop exercising a scope granted by `issuer`.
    WithholdScope(AgentId, Scope),
    /// Resume exercising a scope granted by `issuer`, until its lease, if it has one.
    GrantScope(AgentId, Scope, Option<UnixMillis>),
    /// Move the preference weight by a change keyed by its obligation, until the change
    /// lapses; the weight is the sum of the changes in force, clipped to bounds.
    AdjustWeight(AgentId, WeightKey, WeightChange),
    /// Drop the cached token; the record is kept until the token's own expiry, if given.
    DropToken(TokenId, Option<UnixMillis>),
    /// Cache a newly issued token, until its own expiry, if given.
    CacheToken(TokenId, Option<UnixMillis>),
}

impl ReceiverEffect {
    /// The governed key this effect changes, for an obligation from `issuer` (tokens are
    /// scoped to their issuer as their sequences are).
    pub fn governed_key(&self, issuer: &AgentId) -> GovernedKey {
        match self {
            Self::WithholdScope(i, s) | Self::GrantScope(i, s, _) => {
                GovernedKey::Scope(i.clone(), s.clone())
            }
            Self::AdjustWeight(i, k, _) => GovernedKey::Weight(i.clone(), k.clone()),
            Self::DropToken(t, _) | Self::CacheToken(t, _) => {
                GovernedKey::Token(issuer.clone(), t.clone())
            }
        }
    }
}

/// One belief update's change to a preference weight, as the agent holds it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct WeightChange {
    /// The obligation that carried it: the change's key, so it lands once.
    pub by: ObligationId,
    /// The change, in millionths.
    pub delta: i32,
    /// When it lapses (`created_at + ttl_ms`).
    pub lapses_at: UnixMillis,
}

impl WeightChange {
    /// Whether the change still applies at `now`.
    pub fn applies(&self, now: UnixMillis) -> bool {
        now < self.lapses_at
    }
}
