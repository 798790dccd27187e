//! Obligations and safe actions in the user's words, for the demo, status, tools and logs —
//! never a `Debug` dump.

use crate::{EscalationCause, Obligation, Outcome, Payload, SafeAction, WeightDelta};

/// A delta in millionths as a signed decimal (`-0.25`, `+0.003`).
pub(crate) fn delta(millionths: i64) -> String {
    let v = millionths as f64 / f64::from(WeightDelta::ONE);
    let s = format!("{v:+.6}");
    let s = s.trim_end_matches('0');
    s.trim_end_matches('.').to_owned()
}

/// What an obligation says: `anumati.consent revoke calendar.read for agent-1`.
pub fn obligation(o: &Obligation) -> String {
    let what = match &o.payload {
        Payload::AnumatiConsent(p) => p.words(),
        Payload::PhalaBeliefUpdate(p) => p.words(),
        Payload::OauthToken(p) => p.words(),
        Payload::Registered(p) => p.words(),
    };
    format!("{} {what} for {}", o.kind(), o.target)
}

/// How custody ended, with its attempts: `applied after 2 attempts`, `escalated at the
/// deadline after 9 attempts`, `sent best-effort` (never "after 0 attempts").
pub fn outcome(o: &Outcome, attempts: u32) -> String {
    let tries = |n: u32| {
        if n == 1 {
            "after 1 attempt".to_owned()
        } else {
            format!("after {n} attempts")
        }
    };
    match o {
        Outcome::Applied => format!("applied {}", tries(attempts)),
        Outcome::Declined(r) => format!("declined ({}) {}", r.as_str(), tries(attempts)),
        Outcome::Escalated(EscalationCause::Deadline) => {
            format!("escalated at the deadline {}", tries(attempts))
        }
        Outcome::Escalated(EscalationCause::RetriesExhausted) => {
            format!("escalated, retries exhausted {}", tries(attempts))
        }
        Outcome::BestEffort => "sent best-effort (not under custody)".to_owned(),
    }
}

/// What a safe action did: `withheld calendar.read for agent-1`.
pub fn safe_action(a: &SafeAction) -> String {
    match a {
        SafeAction::WithholdScope { target, scope, .. } => format!("withheld {scope} for {target}"),
        SafeAction::DownWeight {
            target,
            weight_key,
            amount,
            lapses_at,
            ..
        } => format!(
            "down-weighted {weight_key} for {target} by {}{}",
            delta(i64::from(*amount)).trim_start_matches('+'),
            lapses_at.map_or(String::new(), |end| format!(
                " until unix time {}.{:03} s",
                end.0 / 1_000,
                end.0 % 1_000
            ))
        ),
        SafeAction::StopHonouringToken { token_id, .. } => {
            format!("stopped honouring token {token_id}")
        }
        #[allow(unreachable_patterns)]
        other => format!("{other:?}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{
        AgentId, BeliefUpdatePayload, ConsentDecision, ConsentPayload, ObligationId, Scope,
        UnixMillis, WeightKey,
    };

    fn o(payload: Payload) -> Obligation {
        Obligation {
            id: ObligationId::from_u128(1),
            issuer: AgentId::new("p").unwrap(),
            target: AgentId::new("agent-1").unwrap(),
            created_at: UnixMillis(0),
            deadline: UnixMillis(1),
            max_retries: 0,
            sequence: None,
            payload,
        }
    }

    #[test]
    fn obligations_read_as_sentences() {
        let c = o(Payload::AnumatiConsent(ConsentPayload {
            decision: Some(ConsentDecision::Revoke),
            scope: Scope::new("calendar.read").unwrap(),
            expires_at: None,
        }));
        assert_eq!(
            obligation(&c),
            "anumati.consent revoke calendar.read for agent-1"
        );
        let b = o(Payload::PhalaBeliefUpdate(BeliefUpdatePayload {
            weight_key: WeightKey::new("supplier/acme").unwrap(),
            weight_delta: WeightDelta(-250_000),
            ttl_ms: 1,
        }));
        assert_eq!(
            obligation(&b),
            "phala.belief_update supplier/acme -0.25 for agent-1"
        );
        let w = SafeAction::DownWeight {
            obligation_id: ObligationId::from_u128(1),
            target: AgentId::new("agent-1").unwrap(),
            weight_key: WeightKey::new("supplier/2").unwrap(),
            amount: 3_000,
            fold_after: UnixMillis(0),
            lapses_at: None,
        };
        assert_eq!(
            safe_action(&w),
            "down-weighted supplier/2 for agent-1 by 0.003"
        );
        let SafeAction::DownWeight {
            obligation_id,
            target,
            weight_key,
            amount,
            fold_after,
            ..
        } = w
        else {
            unreachable!()
        };
        let lapsing = SafeAction::DownWeight {
            obligation_id,
            target,
            weight_key,
            amount,
            fold_after,
            lapses_at: Some(UnixMillis(1_764_504_000_250)),
        };
        assert_eq!(
            safe_action(&lapsing),
            "down-weighted supplier/2 for agent-1 by 0.003 until unix time 1764504000.250 s"
        );
        let s = SafeAction::WithholdScope {
            target: AgentId::new("agent-1").unwrap(),
            scope: Scope::new("calendar.read").unwrap(),
            sequence: None,
        };
        assert_eq!(safe_action(&s), "withheld calendar.read for agent-1");
        assert_eq!(outcome(&Outcome::Applied, 1), "applied after 1 attempt");
        assert_eq!(
            outcome(&Outcome::Escalated(EscalationCause::Deadline), 9),
            "escalated at the deadline after 9 attempts"
        );
        assert_eq!(
            outcome(&Outcome::BestEffort, 0),
            "sent best-effort (not under custody)"
        );
    }
}
