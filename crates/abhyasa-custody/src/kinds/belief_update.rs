//! `phala.belief_update`: move a preference weight.
//! Its payload, checks and words are `abhyasa-wire`'s `kinds/belief_update.rs`.

use abhyasa_wire::{BeliefUpdatePayload, Obligation, SafeAction};

use super::{GovernedKey, KindRules, PrincipalUpdate, ReceiverEffect, WeightChange};

/// `phala.belief_update`.
pub struct PhalaBeliefUpdate;

impl KindRules for PhalaBeliefUpdate {
    type Payload = BeliefUpdatePayload;

    fn admissible(p: &BeliefUpdatePayload) -> bool {
        p.weight_delta.0 < 0
    }

    fn safe(o: &Obligation, p: &BeliefUpdatePayload, retention: u64) -> Option<SafeAction> {
        Self::admissible(p).then(|| SafeAction::DownWeight {
            obligation_id: o.id,
            target: o.target.clone(),
            weight_key: p.weight_key.clone(),
            amount: p.weight_delta.0.unsigned_abs(),
            fold_after: o.deadline.saturating_add(retention),
            lapses_at: Some(p.lapses_at(o.created_at)),
        })
    }

    fn on_issue(_o: &Obligation, _p: &BeliefUpdatePayload) -> Option<PrincipalUpdate> {
        None
    }

    fn governed_key(o: &Obligation, p: &BeliefUpdatePayload) -> GovernedKey {
        GovernedKey::Weight(o.issuer.clone(), p.weight_key.clone())
    }

    fn effect(o: &Obligation, p: &BeliefUpdatePayload) -> ReceiverEffect {
        ReceiverEffect::AdjustWeight(
            o.issuer.clone(),
            p.weight_key.clone(),
            WeightChange {
                by: o.id,
                delta: p.weight_delta.0,
                lapses_at: p.lapses_at(o.created_at),
            },
        )
    }
}
