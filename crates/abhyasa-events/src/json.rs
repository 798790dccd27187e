//! The JSON an event is delivered as (docs/OPERATOR.md, "Events out"): ids as hex strings,
//! times as RFC 3339 beside the raw Unix milliseconds, amounts by dimension, and a sentence
//! saying what happened.

use abhyasa_ledger::Vector;
use abhyasa_store::{OperatorEvent, OutboxEntry};
use abhyasa_wire::{words, AgentId, Outcome, SafeAction, UnixMillis};
use serde_json::{json, Map, Value};

/// A Unix-millisecond time as RFC 3339 (UTC, milliseconds).
pub fn rfc3339(t: UnixMillis) -> String {
    let at = std::time::UNIX_EPOCH + std::time::Duration::from_millis(t.0);
    humantime::format_rfc3339_millis(at).to_string()
}

/// An enum that serializes as a snake_case string, as that string.
fn tag<T: serde::Serialize>(v: &T) -> Value {
    serde_json::to_value(v).unwrap_or(Value::Null)
}

fn vector(v: &Vector) -> Value {
    Value::Object(
        v.iter()
            .map(|(d, n)| (d.as_str().to_owned(), Value::from(n)))
            .collect::<Map<_, _>>(),
    )
}

/// A safe action: its type, its fields and what it did in words. Weights are decimals (a
/// down-weight of 250000 millionths is `0.25`).
pub fn safe_action(a: &SafeAction) -> Value {
    let mut v = match a {
        SafeAction::WithholdScope { target, scope, .. } => json!({
            "type": "withhold_scope",
            "target": target.as_str(),
            "scope": scope.as_str(),
        }),
        SafeAction::DownWeight {
            target,
            weight_key,
            amount,
            lapses_at,
            ..
        } => json!({
            "type": "down_weight",
            "target": target.as_str(),
            "weight_key": weight_key.as_str(),
            "amount": f64::from(*amount) / 1e6,
            "lapses_at": lapses_at.map(rfc3339),
            "lapses_at_ms": lapses_at.map(|t| t.0),
        }),
        SafeAction::StopHonouringToken {
            token_id,
            expires_at,
        } => json!({
            "type": "stop_honouring_token",
            "token_id": token_id.as_str(),
            "expires_at": expires_at.map(rfc3339),
            "expires_at_ms": expires_at.map(|t| t.0),
        }),
        #[allow(unreachable_patterns)]
        _ => json!({}),
    };
    v["words"] = Value::from(words::safe_action(a));
    v
}

/// What the event's `data` holds, and its sentence.
fn data(event: &OperatorEvent) -> (Value, String) {
    match event {
        OperatorEvent::Escalated(e) => {
            let outcome = words::outcome(&Outcome::Escalated(e.cause), e.attempts);
            (
                json!({
                    "obligation_id": e.obligation_id.to_string(),
                    "kind": e.kind.as_str(),
                    "target": e.target.as_str(),
                    "attempts": e.attempts,
                    "cause": tag(&e.cause),
                    "last_observed": tag(&e.last_observed),
                    "safe_action": safe_action(&e.safe_action),
                }),
                format!(
                    "{} obligation {} to {} {outcome}: {}",
                    e.kind.as_str(),
                    e.obligation_id,
                    e.target,
                    words::safe_action(&e.safe_action)
                ),
            )
        }
        OperatorEvent::Declined {
            record,
            safe_action: safe,
        } => {
            let reason = match record.outcome {
                Outcome::Declined(r) => Value::from(r.as_str()),
                _ => Value::Null,
            };
            (
                json!({
                    "obligation_id": record.obligation_id.to_string(),
                    "kind": record.kind.as_str(),
                    "target": record.target.as_str(),
                    "attempts": record.attempts,
                    "reason": reason,
                    "detail": record.detail.as_ref().map(ToString::to_string),
                    "safe_action": safe.as_ref().map(safe_action),
                }),
                format!(
                    "{} obligation {} to {} {}{}",
                    record.kind.as_str(),
                    record.obligation_id,
                    record.target,
                    words::outcome(&record.outcome, record.attempts),
                    safe.as_ref()
                        .map_or(String::new(), |a| format!(": {}", words::safe_action(a)))
                ),
            )
        }
        OperatorEvent::LeaseEnded {
            side,
            agent,
            scope,
            ended_at,
        } => (
            json!({
                "side": side.as_str(),
                "agent": agent.as_str(),
                "scope": scope.as_str(),
                "ended_at": rfc3339(*ended_at),
                "ended_at_ms": ended_at.0,
            }),
            match side {
                abhyasa_store::LeaseSide::Principal => {
                    format!("the lease of {scope} granted to {agent} ended unrenewed: it is no longer permitted")
                }
                abhyasa_store::LeaseSide::Agent => {
                    format!("the lease of {scope} granted by {agent} ended unrenewed: this agent no longer exercises it")
                }
            },
        ),
        OperatorEvent::BudgetQuarantined {
            key,
            gateway,
            credit,
            max_charge,
            refusal,
        } => (
            json!({
                "operation": key.to_string(),
                "gateway": gateway.as_str(),
                "credit": credit.to_string(),
                "max_charge": vector(max_charge),
                "refusal": tag(refusal),
            }),
            format!(
                "gateway {gateway} refused operation {key}: its reserved budget stays quarantined until a fenced no-effect proof or a forfeit"
            ),
        ),
        OperatorEvent::BudgetForfeited {
            key,
            gateway,
            credit,
            max_charge,
        } => (
            json!({
                "operation": key.to_string(),
                "gateway": gateway.as_str(),
                "credit": credit.to_string(),
                "max_charge": vector(max_charge),
            }),
            format!("operation {key} at {gateway} was forfeited: its reserved budget stays charged for good"),
        ),
        #[allow(unreachable_patterns)]
        other => (json!({}), format!("{other:?}")),
    }
}

/// The event as delivered: `id` (the idempotency key, also the `webhook-id` header), `type`,
/// `timestamp` (RFC 3339) and `at_ms` (when the node recorded it), `node`, `seq` (its place in
/// the node's outbox), `summary` (a sentence) and `data`.
pub fn event(node: &AgentId, entry: &OutboxEntry) -> Value {
    let (data, summary) = data(&entry.event);
    json!({
        "id": entry.key,
        "type": entry.event.kind(),
        "timestamp": rfc3339(entry.at),
        "at_ms": entry.at.0,
        "node": node.as_str(),
        "seq": entry.seq,
        "summary": summary,
        "data": data,
    })
}
