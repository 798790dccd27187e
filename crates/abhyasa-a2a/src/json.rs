//! The reference implementation's JSON shapes (BINDINGS.md § A2A), converted to and from the
//! wire objects. The issuer is never read from the message: it is the authenticated client.

use abhyasa_wire::{
    AckStatus, AgentId, ClientId, ConsentDecision, ConsentPayload, CustodyAck, DeclineReason, Kind,
    Obligation, ObligationId, Payload, Scope, TokenAction, TokenId, TokenPayload, UnixMillis,
    WeightDelta, WeightKey,
};
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};
use time::format_description::well_known::Rfc3339;
use time::OffsetDateTime;

/// An obligation in the reference's JSON.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct JsonObligation {
    /// The idempotency key (any string; a UUID or 32 hex digits maps to the same 16 bytes).
    pub obligation_id: String,
    /// The kind's wire name.
    pub kind: String,
    /// The agent that must honour it.
    pub target: String,
    /// The kind's payload.
    pub payload: serde_json::Value,
    /// Lifetime from `created_at`, seconds (> 0).
    pub deadline_seconds: u64,
    /// Retry budget.
    pub max_retries: u32,
    /// ISO 8601.
    pub created_at: String,
    /// Issuance sequence on the governed key.
    #[serde(default)]
    pub sequence: Option<u64>,
}

/// A CustodyAck in the reference's JSON (`reason` is ours, on `declined`).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct JsonAck {
    /// The obligation answered, as the issuer spelled it.
    pub obligation_id: String,
    /// Who acks.
    pub target: String,
    /// `applied`, `declined` or `deferred`.
    pub status: String,
    /// ISO 8601.
    pub acked_at: String,
    /// Why, on `declined`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
}

/// Why a JSON object was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum JsonError {
    /// Not the shape.
    #[error("not a {what}: {detail}")]
    Shape {
        /// What was expected.
        what: &'static str,
        /// What serde said.
        detail: String,
    },
    /// A field out of range.
    #[error("{field}: {detail}")]
    Field {
        /// The field.
        field: &'static str,
        /// What is wrong.
        detail: String,
    },
}

fn field(field: &'static str, detail: impl ToString) -> JsonError {
    JsonError::Field {
        field,
        detail: detail.to_string(),
    }
}

/// The 16-byte id of a string id: a UUID (with or without dashes) is its own 16 bytes; any
/// other string maps through SHA-256, so the same string is always the same id.
pub fn obligation_id(s: &str) -> Result<ObligationId, JsonError> {
    if s.is_empty() || s.len() > 256 {
        return Err(field("obligation_id", "must be 1..=256 bytes"));
    }
    let hex_digits: String = s.chars().filter(|c| *c != '-').collect();
    let uuid_shape = hex_digits.len() == 32
        && (s.len() == 32
            || (s.len() == 36 && [8, 13, 18, 23].iter().all(|&i| s.as_bytes()[i] == b'-')));
    if uuid_shape {
        if let Ok(bytes) = hex::decode(&hex_digits) {
            let mut b = [0u8; 16];
            b.copy_from_slice(&bytes);
            return Ok(ObligationId::from_bytes(b));
        }
    }
    let d = Sha256::digest(s.as_bytes());
    let mut b = [0u8; 16];
    b.copy_from_slice(&d[..16]);
    Ok(ObligationId::from_bytes(b))
}

/// ISO 8601 (RFC 3339) to milliseconds since the epoch.
pub fn parse_time(what: &'static str, s: &str) -> Result<UnixMillis, JsonError> {
    let t = OffsetDateTime::parse(s, &Rfc3339).map_err(|e| field(what, e))?;
    let ms = t.unix_timestamp_nanos() / 1_000_000;
    u64::try_from(ms)
        .map(UnixMillis)
        .map_err(|_| field(what, "before 1970"))
}

/// Milliseconds since the epoch to RFC 3339.
pub fn format_time(t: UnixMillis) -> String {
    OffsetDateTime::from_unix_timestamp_nanos(i128::from(t.0) * 1_000_000)
        .ok()
        .and_then(|t| t.format(&Rfc3339).ok())
        .unwrap_or_else(|| "1970-01-01T00:00:00Z".into())
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct JsonConsent {
    #[serde(default)]
    decision: Option<String>,
    scope: String,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct JsonBelief {
    weight_delta: f64,
    weight_key: String,
    /// Ours: how long the update stays meaningful; the deadline's span when absent.
    #[serde(default)]
    ttl_seconds: Option<u64>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct JsonToken {
    action: String,
    token_id: String,
    client_id: String,
    /// The token's own expiry (RFC 3339), after which its records are forgotten.
    #[serde(default)]
    expires_at: Option<String>,
}

fn payload_of<T: serde::de::DeserializeOwned>(v: &serde_json::Value) -> Result<T, JsonError> {
    serde_json::from_value(v.clone()).map_err(|e| field("payload", e))
}

impl JsonObligation {
    /// The wire obligation, issued by `issuer` (the authenticated client).
    pub fn to_wire(&self, issuer: &AgentId) -> Result<Obligation, JsonError> {
        let id = obligation_id(&self.obligation_id)?;
        let target = AgentId::new(self.target.clone()).map_err(|e| field("target", e))?;
        let created_at = parse_time("created_at", &self.created_at)?;
        if self.deadline_seconds == 0 {
            return Err(field("deadline_seconds", "must be > 0"));
        }
        let span = self
            .deadline_seconds
            .checked_mul(1_000)
            .ok_or_else(|| field("deadline_seconds", "too large"))?;
        let deadline = UnixMillis(
            created_at
                .0
                .checked_add(span)
                .ok_or_else(|| field("deadline_seconds", "too large"))?,
        );
        let kind = Kind::from_name(&self.kind)
            .ok_or_else(|| field("kind", format!("unknown kind {:?}", self.kind)))?;
        let payload = match kind {
            Kind::AnumatiConsent => {
                let p: JsonConsent = payload_of(&self.payload)?;
                Payload::AnumatiConsent(ConsentPayload {
                    decision: p.decision.map(|d| match d.as_str() {
                        "grant" => ConsentDecision::Grant,
                        "revoke" => ConsentDecision::Revoke,
                        _ => ConsentDecision::Unrecognized(d),
                    }),
                    scope: Scope::new(p.scope).map_err(|e| field("payload.scope", e))?,
                })
            }
            Kind::PhalaBeliefUpdate => {
                let p: JsonBelief = payload_of(&self.payload)?;
                if !(p.weight_delta.is_finite() && (-1.0..=1.0).contains(&p.weight_delta)) {
                    return Err(field("payload.weight_delta", "must lie in [-1, 1]"));
                }
                Payload::PhalaBeliefUpdate(abhyasa_wire::BeliefUpdatePayload {
                    weight_key: WeightKey::new(p.weight_key)
                        .map_err(|e| field("payload.weight_key", e))?,
                    weight_delta: WeightDelta(
                        (p.weight_delta * f64::from(WeightDelta::ONE)).round() as i32,
                    ),
                    ttl_ms: p
                        .ttl_seconds
                        .map_or(Some(span), |s| s.checked_mul(1_000))
                        .ok_or_else(|| field("payload.ttl_seconds", "too large"))?,
                })
            }
            Kind::OauthToken => {
                let p: JsonToken = payload_of(&self.payload)?;
                Payload::OauthToken(TokenPayload {
                    action: match p.action.as_str() {
                        "revoke" => TokenAction::Revoke,
                        "issue" => TokenAction::Issue,
                        other => {
                            return Err(field(
                                "payload.action",
                                format!("{other:?} is not \"revoke\" or \"issue\""),
                            ))
                        }
                    },
                    token_id: TokenId::new(p.token_id).map_err(|e| field("payload.token_id", e))?,
                    client_id: ClientId::new(p.client_id)
                        .map_err(|e| field("payload.client_id", e))?,
                    expires_at: p
                        .expires_at
                        .map(|t| parse_time("payload.expires_at", &t))
                        .transpose()?,
                })
            }
        };
        let o = Obligation {
            id,
            issuer: issuer.clone(),
            target,
            created_at,
            deadline,
            max_retries: self.max_retries,
            sequence: self.sequence,
            payload,
        };
        o.validate().map_err(|e| field("obligation", e))?;
        Ok(o)
    }
}

impl JsonAck {
    /// The JSON of `ack`, answering the obligation the issuer called `obligation_id`.
    pub fn of(ack: &CustodyAck, obligation_id: &str) -> Self {
        let (status, reason) = match ack.status {
            AckStatus::Applied => ("applied", None),
            AckStatus::Deferred => ("deferred", None),
            AckStatus::Declined(r) => ("declined", Some(r.as_str().to_owned())),
        };
        Self {
            obligation_id: obligation_id.to_owned(),
            target: ack.target.as_str().to_owned(),
            status: status.into(),
            acked_at: format_time(ack.acked_at),
            reason,
        }
    }

    /// The wire ack.
    pub fn to_wire(&self) -> Result<CustodyAck, JsonError> {
        let status = match (self.status.as_str(), self.reason.as_deref()) {
            ("applied", _) => AckStatus::Applied,
            ("deferred", _) => AckStatus::Deferred,
            ("declined", reason) => AckStatus::Declined(match reason {
                Some("expired") => DeclineReason::Expired,
                Some("superseded") => DeclineReason::Superseded,
                Some("malformed") => DeclineReason::Malformed,
                Some("unknown_kind") => DeclineReason::UnknownKind,
                // The reference sends no reason: a refusal.
                _ => DeclineReason::Refused,
            }),
            (other, _) => {
                return Err(field(
                    "status",
                    format!("{other:?} is not applied, declined or deferred"),
                ))
            }
        };
        Ok(CustodyAck {
            obligation_id: obligation_id(&self.obligation_id)?,
            target: AgentId::new(self.target.clone()).map_err(|e| field("target", e))?,
            status,
            acked_at: parse_time("acked_at", &self.acked_at)?,
        })
    }
}

/// Parses JSON of type `T`, naming `what` on failure.
pub fn from_json<T: serde::de::DeserializeOwned>(
    what: &'static str,
    bytes: &[u8],
) -> Result<T, JsonError> {
    serde_json::from_slice(bytes).map_err(|e| JsonError::Shape {
        what,
        detail: e.to_string(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn consent() -> JsonObligation {
        JsonObligation {
            obligation_id: "0f8fad5b-d9cb-469f-a165-70867728950e".into(),
            kind: "anumati.consent".into(),
            target: "agent-1".into(),
            payload: serde_json::json!({"decision": "revoke", "scope": "calendar.read"}),
            deadline_seconds: 3_600,
            max_retries: 15,
            created_at: "2026-11-30T12:00:00Z".into(),
            sequence: Some(3),
        }
    }

    #[test]
    fn the_reference_shape_maps_field_by_field() {
        let issuer = AgentId::new("principal").unwrap();
        let o = consent().to_wire(&issuer).unwrap();
        assert_eq!(
            o.id,
            ObligationId::from_u128(0x0f8fad5b_d9cb_469f_a165_70867728950e)
        );
        assert_eq!(o.issuer, issuer, "the issuer is who authenticated");
        // 2026-11-30T12:00:00Z, computed apart: 20,787 days after 1970-01-01, plus 12 h.
        assert_eq!(o.created_at, UnixMillis((20_787 * 86_400 + 43_200) * 1_000));
        assert_eq!(o.deadline.0 - o.created_at.0, 3_600_000);
        assert_eq!(o.sequence, Some(3));
        assert_eq!(
            o.payload,
            Payload::AnumatiConsent(ConsentPayload {
                decision: Some(ConsentDecision::Revoke),
                scope: Scope::new("calendar.read").unwrap()
            })
        );
        let mut belief = consent();
        belief.kind = "phala.belief_update".into();
        belief.payload = serde_json::json!({"weight_delta": -0.25, "weight_key": "supplier/acme"});
        match belief.to_wire(&issuer).unwrap().payload {
            Payload::PhalaBeliefUpdate(p) => {
                assert_eq!(p.weight_delta, WeightDelta(-250_000));
                assert_eq!(p.ttl_ms, 3_600_000);
            }
            p => panic!("{p:?}"),
        }
        let mut token = consent();
        token.kind = "oauth.token".into();
        token.payload = serde_json::json!({"action": "revoke", "token_id": "tok-1",
            "client_id": "mail", "expires_at": "2026-11-30T13:00:00Z"});
        match token.to_wire(&issuer).unwrap().payload {
            Payload::OauthToken(p) => {
                assert_eq!(p.action, TokenAction::Revoke);
                // An hour after created_at, computed apart.
                assert_eq!(
                    p.expires_at,
                    Some(UnixMillis((20_787 * 86_400 + 46_800) * 1_000))
                );
            }
            p => panic!("{p:?}"),
        }
        token.payload["expires_at"] = serde_json::json!("soon");
        match token.to_wire(&issuer) {
            Err(JsonError::Field { field, .. }) => assert_eq!(field, "payload.expires_at"),
            r => panic!("{r:?}"),
        }
        // A non-UUID id maps to the same id every time, and differs from another string's.
        assert_eq!(
            obligation_id("rev-1").unwrap(),
            obligation_id("rev-1").unwrap()
        );
        assert_ne!(
            obligation_id("rev-1").unwrap(),
            obligation_id("rev-2").unwrap()
        );
    }

    /// Found by the `a2a_json` fuzz target: a 36-byte id with multi-byte characters where a
    /// UUID has its dashes made the shape check slice inside a character (a panic on a peer's
    /// input). Now it is an ordinary non-UUID id, hashed.
    #[test]
    fn a_36_byte_id_with_multibyte_characters_is_an_id_not_a_panic() {
        let s = "0f8fa-5b-d9cb-46\u{1d9}\u{4a2}165-70867728)50e";
        assert_eq!(s.len(), 36);
        assert!(
            !s.is_char_boundary(19),
            "a UUID's third dash would be cut at 18..=18"
        );
        assert_eq!(obligation_id(s).unwrap(), obligation_id(s).unwrap());
        let body = std::fs::read(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../../fuzz/seeds/a2a_json/crash-3e3c46bdb1b0dffe5392975da7203cca9ad9b340"
        ))
        .unwrap();
        let ack: JsonAck = from_json("ack", &body).unwrap();
        assert!(ack.to_wire().is_err(), "its acked_at is not a time");
        // A real UUID still reads as its 16 bytes.
        let uuid = "0f8fa5bd-9cb4-4611-a570-86772850e000";
        assert_eq!(
            obligation_id(uuid).unwrap(),
            ObligationId::from_bytes(
                hex::decode(uuid.replace('-', ""))
                    .unwrap()
                    .try_into()
                    .unwrap()
            )
        );
    }

    #[test]
    fn bad_fields_are_named() {
        let issuer = AgentId::new("principal").unwrap();
        type Break = fn(&mut JsonObligation);
        let cases: [(&str, Break); 6] = [
            ("deadline_seconds", |o| o.deadline_seconds = 0),
            ("kind", |o| o.kind = "x.y".into()),
            ("created_at", |o| o.created_at = "yesterday".into()),
            ("target", |o| o.target = "Not An Agent".into()),
            ("payload", |o| o.payload = serde_json::json!({"scope": 7})),
            ("obligation_id", |o| o.obligation_id = String::new()),
        ];
        for (name, f) in cases {
            let mut o = consent();
            f(&mut o);
            match o.to_wire(&issuer) {
                Err(JsonError::Field { field, .. }) => assert_eq!(field, name),
                r => panic!("{name}: {r:?}"),
            }
        }
        assert!(matches!(
            from_json::<JsonObligation>("obligation", b"{\"obligation_id\": 1}"),
            Err(JsonError::Shape { .. })
        ));
    }

    #[test]
    fn an_ack_round_trips_and_a_decline_keeps_its_reason() {
        let ack = CustodyAck {
            obligation_id: obligation_id("rev-1").unwrap(),
            target: AgentId::new("agent-1").unwrap(),
            status: AckStatus::Declined(DeclineReason::Superseded),
            acked_at: UnixMillis(1_764_504_000_123),
        };
        let j = JsonAck::of(&ack, "rev-1");
        assert_eq!(j.status, "declined");
        assert_eq!(j.reason.as_deref(), Some("superseded"));
        assert_eq!(j.acked_at, "2025-11-30T12:00:00.123Z");
        assert_eq!(j.to_wire().unwrap(), ack);
    }
}
