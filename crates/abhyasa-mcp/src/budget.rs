//! Budget-gated tools: the dispatch permit rides the tool call, the receipt rides its result
//! (docs/DESIGN.md, "On the wire"; docs/MCP.md). The effect a permit binds is the call itself — the tool's
//! name and its arguments in canonical JSON, its purpose and its price — so the server
//! recomputes it from what is actually asked for and a permit for another call, other
//! arguments or another price does not bind this one. Pure functions, no I/O.

use abhyasa_ledger::{Dim, Effect, Permit, Receipt, Refusal, Signed, Vector};
use abhyasa_wire::{decode, encode};
use base64::engine::general_purpose::STANDARD;
use base64::Engine as _;
use serde_json::{Map, Value};

use crate::envelope::{META_PERMIT, META_RECEIPT};

/// What a budget-gated tool costs: every call is a ledger effect of this purpose charging
/// at most `max_cost`, run only under a permit for it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ToolBudget {
    /// The purpose the paying credit's label must allow.
    pub purpose: Dim,
    /// The most one call charges (and what it charges: the price).
    pub max_cost: Vector,
}

/// A permit in `_meta` that cannot be read.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[non_exhaustive]
pub enum PermitError {
    /// Not a base64 string.
    #[error("_meta[\"{key}\"] is not a base64 string: {why}")]
    NotBase64 {
        /// The `_meta` key.
        key: &'static str,
        /// What is wrong.
        why: String,
    },
    /// Base64, but not the CBOR of what the key holds.
    #[error("_meta[\"{key}\"] does not hold a signed {what}: {why}")]
    NotCbor {
        /// The `_meta` key.
        key: &'static str,
        /// What it should hold.
        what: &'static str,
        /// What is wrong.
        why: String,
    },
}

/// `value` with every object's keys in order, compact: the same arguments give the same
/// text whatever order a client wrote them in.
pub fn canonical_json(value: &Value) -> String {
    fn sorted(v: &Value) -> Value {
        match v {
            Value::Object(m) => {
                let mut keys: Vec<&String> = m.keys().collect();
                keys.sort();
                let mut out = Map::new();
                for k in keys {
                    out.insert(k.clone(), sorted(&m[k]));
                }
                Value::Object(out)
            }
            Value::Array(a) => Value::Array(a.iter().map(sorted).collect()),
            v => v.clone(),
        }
    }
    // Objects are rebuilt in sorted insertion order, so this holds with or without
    // serde_json's `preserve_order`.
    sorted(value).to_string()
}

/// The name this binding carries its effects under ([`Effect::carried_by`]): the permit
/// rides the tool call and the receipt its result.
pub const CARRIER: &str = "mcp";

/// The effect a call of tool `name` with `args` is: what a permit for it must bind.
pub fn tool_effect(name: &str, args: &Map<String, Value>, budget: &ToolBudget) -> Effect {
    Effect {
        purpose: budget.purpose.clone(),
        operation: format!(
            "tools/call {name} {}",
            canonical_json(&Value::Object(args.clone()))
        ),
        max_charge: budget.max_cost.clone(),
        carried_by: Some(CARRIER.to_owned()),
    }
}

fn from_meta<T: serde::de::DeserializeOwned>(
    meta: &Map<String, Value>,
    key: &'static str,
    what: &'static str,
) -> Result<Option<T>, PermitError> {
    let Some(v) = meta.get(key) else {
        return Ok(None);
    };
    let Value::String(s) = v else {
        return Err(PermitError::NotBase64 {
            key,
            why: "not a string".into(),
        });
    };
    let bytes = STANDARD.decode(s).map_err(|e| PermitError::NotBase64 {
        key,
        why: e.to_string(),
    })?;
    decode::<T>(&bytes)
        .map(Some)
        .map_err(|e| PermitError::NotCbor {
            key,
            what,
            why: e.to_string(),
        })
}

/// The dispatch permit a request carries, if any.
pub fn permit_from_meta(meta: &Map<String, Value>) -> Result<Option<Signed<Permit>>, PermitError> {
    from_meta(meta, META_PERMIT, "permit")
}

/// A permit as the `_meta` value a caller puts on a request.
pub fn permit_to_meta(permit: &Signed<Permit>) -> Value {
    Value::String(STANDARD.encode(encode(permit)))
}

/// The receipt a result carries, if any.
pub fn receipt_from_meta(
    meta: &Map<String, Value>,
) -> Result<Option<Signed<Receipt>>, PermitError> {
    from_meta(meta, META_RECEIPT, "receipt")
}

/// A receipt as the `_meta` value a server puts on a result.
pub fn receipt_to_meta(receipt: &Signed<Receipt>) -> Value {
    Value::String(STANDARD.encode(encode(receipt)))
}

/// Reads `dim=n,…` (the CLI's notation; `0` or nothing is the zero vector).
pub fn parse_vector(s: &str) -> Result<Vector, String> {
    let mut pairs = Vec::new();
    for part in s
        .split(',')
        .map(str::trim)
        .filter(|p| !p.is_empty() && *p != "0")
    {
        let (d, n) = part
            .split_once('=')
            .ok_or_else(|| format!("{part:?}: expected dimension=amount"))?;
        let n = n
            .trim()
            .parse::<u64>()
            .map_err(|e| format!("{part:?}: {e}"))?;
        pairs.push((d.trim().to_owned(), n));
    }
    let refs: Vec<(&str, u64)> = pairs.iter().map(|(d, n)| (d.as_str(), *n)).collect();
    Vector::of(&refs).map_err(|e| e.to_string())
}

/// What a budget-gated tool says it actually charged, taken off its result: the value of
/// `_meta["org.abhyasa/charge"]` (`dim=n,…`), removed from the result the caller sees (the
/// receipt says it, signed). Absent or unreadable: the whole `max` (an unreadable one is
/// logged). The gateway clamps what it is told to the permit's maximum.
pub fn take_charge(meta: Option<&mut Map<String, Value>>, max: &Vector) -> Vector {
    let Some(v) = meta.and_then(|m| m.remove(crate::envelope::META_CHARGE)) else {
        return max.clone();
    };
    match v.as_str().map(parse_vector) {
        Some(Ok(charge)) => charge,
        other => {
            tracing::warn!(
                ?v,
                ?other,
                "a tool's reported charge does not read: charged the maximum"
            );
            max.clone()
        }
    }
}

/// `dim=n,…` (the CLI's notation).
pub fn show_vector(v: &Vector) -> String {
    let parts: Vec<String> = v.iter().map(|(d, n)| format!("{d}={n}")).collect();
    parts.join(",")
}

/// Why a gateway refused a permit, in the caller's words.
pub fn refusal_words(r: Refusal) -> &'static str {
    match r {
        Refusal::BadSignature => "it is not signed by you",
        Refusal::BindingMismatch => {
            "it does not bind this call (tool, arguments, purpose, price, gateway or payer differ)"
        }
        Refusal::Fenced => "its credit was fenced (reclaimed) after it was issued",
        Refusal::OverMaximum => "the call could charge more than it allows",
        Refusal::KeyConflict => "its operation key was already used for another call",
        Refusal::Expired => "it expired before the gateway received it",
        Refusal::Forgotten => {
            "it expired so long ago that the gateway no longer knows whether it ran"
        }
        Refusal::NoExpiry => {
            "it never expires, and this gateway takes only permits that do (set permit_ttl_ms)"
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn arguments_in_any_order_are_the_same_effect_and_other_arguments_are_not() {
        let budget = ToolBudget {
            purpose: Dim::new("travel").unwrap(),
            max_cost: Vector::of(&[("cents", 25)]).unwrap(),
        };
        let a: Map<String, Value> =
            serde_json::from_str(r#"{"to":"LHR","opts":{"z":1,"a":[{"y":2,"b":3}]}}"#).unwrap();
        let b: Map<String, Value> =
            serde_json::from_str(r#"{"opts":{"a":[{"b":3,"y":2}],"z":1},"to":"LHR"}"#).unwrap();
        let e = tool_effect("book", &a, &budget);
        assert_eq!(
            e.operation,
            r#"tools/call book {"opts":{"a":[{"b":3,"y":2}],"z":1},"to":"LHR"}"#
        );
        assert_eq!(e.digest(), tool_effect("book", &b, &budget).digest());
        let mut c = a.clone();
        c.insert("to".into(), json!("CDG"));
        assert_ne!(e.digest(), tool_effect("book", &c, &budget).digest());
        assert_ne!(e.digest(), tool_effect("bookx", &a, &budget).digest());
    }

    #[test]
    fn a_permit_that_is_not_base64_or_not_a_permit_is_named() {
        let mut m = Map::new();
        assert_eq!(permit_from_meta(&m), Ok(None));
        m.insert(META_PERMIT.into(), json!(7));
        assert!(matches!(
            permit_from_meta(&m),
            Err(PermitError::NotBase64 {
                key: META_PERMIT,
                ..
            })
        ));
        m.insert(META_PERMIT.into(), json!("%%%"));
        assert!(matches!(
            permit_from_meta(&m),
            Err(PermitError::NotBase64 { .. })
        ));
        m.insert(META_PERMIT.into(), json!(STANDARD.encode(b"\x01\x02")));
        assert!(matches!(
            permit_from_meta(&m),
            Err(PermitError::NotCbor { what: "permit", .. })
        ));
    }
}
