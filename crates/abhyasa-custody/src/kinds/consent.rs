//! `anumati.consent`: grant or revoke a consent scope.
//! Its payload, checks and words are `abhyasa-wire`'s `kinds/consent.rs`.

use abhyasa_wire::{ConsentDecision, ConsentPayload, Obligation, SafeAction};

use super::{GovernedKey, KindRules, PrincipalUpdate, ReceiverEffect};

/// `anumati.consent`.
pub struct AnumatiConsent;

impl KindRules for AnumatiConsent {
    type Payload = ConsentPayload;

    fn admissible(_p: &ConsentPayload) -> bool {
        // Every consent decision fails closed: a revocation's withhold stands at issue, and
        // a grant opens nothing until it is confirmed (docs/CUSTODY.md, "Grants").
        true
    }

    fn safe(o: &Obligation, p: &ConsentPayload, _retention: u64) -> Option<SafeAction> {
        Some(SafeAction::WithholdScope {
            target: o.target.clone(),
            scope: p.scope.clone(),
            sequence: o.sequence,
        })
    }

    fn on_issue(o: &Obligation, p: &ConsentPayload) -> Option<PrincipalUpdate> {
        // A revocation is the principal's own decision: it stands at once. A grant is too,
        // but the authority it opens waits for the agent's confirmation.
        Some(if is_grant(p) {
            PrincipalUpdate::AwaitGrant {
                target: o.target.clone(),
                scope: p.scope.clone(),
                sequence: o.sequence,
            }
        } else {
            PrincipalUpdate::Safe(SafeAction::WithholdScope {
                target: o.target.clone(),
                scope: p.scope.clone(),
                sequence: o.sequence,
            })
        })
    }

    fn on_applied(o: &Obligation, p: &ConsentPayload) -> Option<PrincipalUpdate> {
        is_grant(p).then(|| PrincipalUpdate::Grant {
            target: o.target.clone(),
            scope: p.scope.clone(),
            sequence: o.sequence,
            until: p.expires_at,
        })
    }

    fn governed_key(o: &Obligation, p: &ConsentPayload) -> GovernedKey {
        GovernedKey::Scope(o.issuer.clone(), p.scope.clone())
    }

    fn effect(o: &Obligation, p: &ConsentPayload) -> ReceiverEffect {
        if is_grant(p) {
            ReceiverEffect::GrantScope(o.issuer.clone(), p.scope.clone(), p.expires_at)
        } else {
            ReceiverEffect::WithholdScope(o.issuer.clone(), p.scope.clone())
        }
    }
}

/// Whether a consent decision is a grant (a missing or unrecognized decision is restrictive).
fn is_grant(p: &ConsentPayload) -> bool {
    matches!(p.decision, Some(ConsentDecision::Grant))
}
