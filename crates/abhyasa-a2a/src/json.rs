//! The reference implementation's JSON shapes (docs/A2A.md), converted to and from the
//! wire objects. The issuer is never read from the message: it is the authenticated client.

use abhyasa_wire::{
    AckStatus, AgentId, ClientId, ConsentDecision, ConsentPayload, CustodyAck, DeclineReason, Kind,
    Obligation, ObligationId, Payload, RegisteredPayload, Scope, TokenAction, TokenId,
    TokenPayload, UnixMillis, WeightDelta, WeightKey,
};
use serde::{Deserialize, Serialize};
use time::format_description::well_known::Rfc3339;
use time::OffsetDateTime;

/// An obligation in the reference's JSON. Fields it does not know are ignored (the reference
/// ignores extras, and adds fields over time); [`unknown_fields`] names them for a log.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct JsonObligation {
    /// The idempotency key: any string, each spelling its own id ([`obligation_id`]).
    pub obligation_id: String,
    /// The kind's wire name.
    pub kind: String,
    /// The agent that must honour it.
    pub target: String,
    /// The kind's payload.
    pub payload: serde_json::Value,
    /// Lifetime from `created_at`, seconds (> 0).
    #[serde(deserialize_with = "whole::u64")]
    pub deadline_seconds: u64,
    /// Retry budget.
    #[serde(deserialize_with = "whole::u32")]
    pub max_retries: u32,
    /// ISO 8601.
    pub created_at: String,
    /// Issuance sequence on the governed key.
    #[serde(default, deserialize_with = "whole::opt_u64")]
    pub sequence: Option<u64>,
}

/// Whole numbers written as JSON integers or as floats with no fraction (`15.0`): A2A
/// clients carry a `data` part as a protobuf `Value`, whose numbers are doubles, so the
/// official SDK sends `3600.0` for `3600`. A fraction, a negative or an out-of-range number is
/// still refused.
mod whole {
    use serde::de::{Deserialize, Deserializer, Error};

    fn number<'de, D: Deserializer<'de>>(v: serde_json::Number) -> Result<u64, D::Error> {
        if let Some(n) = v.as_u64() {
            return Ok(n);
        }
        match v.as_f64() {
            Some(f) if f >= 0.0 && f.fract() == 0.0 && f < 18_446_744_073_709_551_616.0 => {
                Ok(f as u64)
            }
            _ => Err(D::Error::custom(format!(
                "{v} is not a whole number from 0 to 2^64 - 1"
            ))),
        }
    }

    pub(super) fn u64<'de, D: Deserializer<'de>>(d: D) -> Result<u64, D::Error> {
        number::<D>(serde_json::Number::deserialize(d)?)
    }

    pub(super) fn u32<'de, D: Deserializer<'de>>(d: D) -> Result<u32, D::Error> {
        let n = number::<D>(serde_json::Number::deserialize(d)?)?;
        u32::try_from(n).map_err(|_| D::Error::custom(format!("{n} is over {}", u32::MAX)))
    }

    pub(super) fn opt_u64<'de, D: Deserializer<'de>>(d: D) -> Result<Option<u64>, D::Error> {
        Option::<serde_json::Number>::deserialize(d)?
            .map(number::<D>)
            .transpose()
    }
}

/// A CustodyAck in the reference's JSON (`reason` and `detail` are ours, on `declined`).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
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
    /// The reason in words, for a person (e.g. "not addressed to this agent: …").
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub detail: Option<String>,
}

/// The fields of [`JsonObligation`].
const OBLIGATION_FIELDS: [&str; 8] = [
    "obligation_id",
    "kind",
    "target",
    "payload",
    "deadline_seconds",
    "max_retries",
    "created_at",
    "sequence",
];

/// The fields of an obligation JSON object (top level, and `payload.` for its kind's payload)
/// that this binding does not know: they are ignored, and worth a log line. Not an object:
/// none.
pub fn unknown_fields(bytes: &[u8]) -> Vec<String> {
    let Ok(serde_json::Value::Object(top)) = serde_json::from_slice::<serde_json::Value>(bytes)
    else {
        return Vec::new();
    };
    let mut out: Vec<String> = top
        .keys()
        .filter(|k| !OBLIGATION_FIELDS.contains(&k.as_str()))
        .cloned()
        .collect();
    let payload_fields: &[&str] = match top.get("kind").and_then(|k| k.as_str()) {
        Some("anumati.consent") => &["decision", "scope"],
        Some("phala.belief_update") => &["weight_delta", "weight_key", "ttl_seconds"],
        Some("oauth.token") => &["action", "token_id", "client_id", "expires_at"],
        _ => return out,
    };
    if let Some(serde_json::Value::Object(p)) = top.get("payload") {
        out.extend(
            p.keys()
                .filter(|k| !payload_fields.contains(&k.as_str()))
                .map(|k| format!("payload.{k}")),
        );
    }
    out
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

/// The 16-byte id of a string id, one-to-one on spellings: a UUID in its canonical form
/// (lowercase, dashed: [`id_string`] of an id) is its own 16 bytes; every other string —
/// another letter case, the same digits without dashes, any name — maps through SHA-256 of
/// the string as spelled. Two spellings are two ids, as the reference implementation treats
/// them: mapping them to one would ack a second obligation `applied` on the strength of the
/// first. (The hash's 128 bits make a collision between any two spellings as unlikely as a
/// collision of random ids.)
pub fn obligation_id(s: &str) -> Result<ObligationId, JsonError> {
    abhyasa_machine::binding::text_obligation_id(s).ok_or_else(|| {
        field(
            "obligation_id",
            format!(
                "must be 1 to {} bytes, got {}",
                abhyasa_machine::binding::MAX_TEXT_ID,
                s.len()
            ),
        )
    })
}

/// The canonical text of an id (the node machine's mapping,
/// [`abhyasa_machine::binding::id_text`]).
pub fn id_string(id: ObligationId) -> String {
    abhyasa_machine::binding::id_text(id)
}

/// ISO 8601 (RFC 3339) to milliseconds since the epoch.
pub fn parse_time(what: &'static str, s: &str) -> Result<UnixMillis, JsonError> {
    let t = OffsetDateTime::parse(s, &Rfc3339).map_err(|e| {
        field(
            what,
            format!(
                "{s:?} is not an RFC 3339 time with an offset, e.g. 2026-11-30T12:00:00Z or \
                 2026-11-30T13:00:00+01:00 ({e})"
            ),
        )
    })?;
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
struct JsonConsent {
    #[serde(default)]
    decision: Option<String>,
    scope: String,
    /// Ours: a grant's lease (RFC 3339); the authority lapses then unless renewed.
    #[serde(default)]
    expires_at: Option<String>,
}

#[derive(Deserialize)]
struct JsonBelief {
    weight_delta: f64,
    weight_key: String,
    /// Ours: how long the update stays meaningful; the deadline's span when absent.
    #[serde(default, deserialize_with = "whole::opt_u64")]
    ttl_seconds: Option<u64>,
}

#[derive(Deserialize)]
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
        let kind = Kind::from_name(&self.kind).ok_or_else(|| {
            let known: Vec<&str> = Kind::known().iter().map(|k| k.as_str()).collect();
            field(
                "kind",
                format!("unknown kind {:?}; known: {}", self.kind, known.join(", ")),
            )
        })?;
        if self.max_retries > abhyasa_wire::MAX_RETRIES_LIMIT {
            return Err(field(
                "max_retries",
                format!(
                    "{} is over the limit of {}",
                    self.max_retries,
                    abhyasa_wire::MAX_RETRIES_LIMIT
                ),
            ));
        }
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
                    expires_at: p
                        .expires_at
                        .map(|t| parse_time("payload.expires_at", &t))
                        .transpose()?,
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
            // A registered kind's JSON shape is its payload's serde shape.
            Kind::Registered(name) => {
                let value =
                    ciborium::Value::serialized(&self.payload).map_err(|e| field("payload", e))?;
                Payload::Registered(
                    RegisteredPayload::read(name, value).map_err(|e| field("payload", e))?,
                )
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

impl JsonObligation {
    /// The JSON of a wire obligation, its id spelled canonically ([`id_string`]); `None` when
    /// the JSON cannot say it exactly (a lifetime or a `ttl_ms` that is not whole seconds).
    /// [`to_wire`](Self::to_wire) with the same issuer gives `o` back.
    pub fn of(o: &Obligation) -> Option<Self> {
        let span = o.deadline.0.checked_sub(o.created_at.0)?;
        if span % 1_000 != 0 {
            return None;
        }
        let payload = match &o.payload {
            Payload::AnumatiConsent(p) => {
                let mut m = serde_json::Map::new();
                if let Some(d) = &p.decision {
                    let word = match d {
                        ConsentDecision::Grant => "grant",
                        ConsentDecision::Revoke => "revoke",
                        ConsentDecision::Unrecognized(w) => w.as_str(),
                    };
                    m.insert("decision".into(), word.into());
                }
                m.insert("scope".into(), p.scope.as_str().into());
                if let Some(t) = p.expires_at {
                    m.insert("expires_at".into(), format_time(t).into());
                }
                serde_json::Value::Object(m)
            }
            Payload::PhalaBeliefUpdate(p) => {
                if p.ttl_ms % 1_000 != 0 {
                    return None;
                }
                serde_json::json!({
                    "weight_delta": f64::from(p.weight_delta.0) / f64::from(WeightDelta::ONE),
                    "weight_key": p.weight_key.as_str(),
                    "ttl_seconds": p.ttl_ms / 1_000,
                })
            }
            Payload::OauthToken(p) => {
                let mut m = serde_json::Map::new();
                let action = match p.action {
                    TokenAction::Revoke => "revoke",
                    TokenAction::Issue => "issue",
                };
                m.insert("action".into(), action.into());
                m.insert("token_id".into(), p.token_id.as_str().into());
                m.insert("client_id".into(), p.client_id.as_str().into());
                if let Some(t) = p.expires_at {
                    m.insert("expires_at".into(), format_time(t).into());
                }
                serde_json::Value::Object(m)
            }
            Payload::Registered(p) => p.value().deserialized().ok()?,
        };
        Some(Self {
            obligation_id: id_string(o.id),
            kind: o.kind().as_str().to_owned(),
            target: o.target.as_str().to_owned(),
            payload,
            deadline_seconds: span / 1_000,
            max_retries: o.max_retries,
            created_at: format_time(o.created_at),
            sequence: o.sequence,
        })
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
            detail: ack.detail.as_ref().map(|d| d.as_str().to_owned()),
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
                Some("id_conflict") => DeclineReason::IdConflict,
                Some("over_limit") => DeclineReason::OverLimit,
                Some("policy") => DeclineReason::Policy,
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
            // The agent's own words are kept (cut to size) where it declined on its policy.
            detail: match (status, &self.detail) {
                (AckStatus::Declined(DeclineReason::Policy), Some(d)) => {
                    Some(abhyasa_wire::Detail::lossy(d))
                }
                _ => None,
            },
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
                scope: Scope::new("calendar.read").unwrap(),
                expires_at: None,
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
            detail: None,
        };
        let j = JsonAck::of(&ack, "rev-1");
        assert_eq!(j.status, "declined");
        assert_eq!(j.reason.as_deref(), Some("superseded"));
        assert_eq!(j.acked_at, "2025-11-30T12:00:00.123Z");
        assert_eq!(j.to_wire().unwrap(), ack);
    }

    /// Reproduced from outside: the dashed UUID, its 32 hex digits and its upper case were
    /// one id. Each spelling is its own id; only the canonical spelling is the UUID's bytes.
    #[test]
    fn each_spelling_of_a_uuid_is_its_own_id() {
        let spellings = [
            "0f8fad5b-d9cb-469f-a165-70867728950e",
            "0f8fad5bd9cb469fa16570867728950e",
            "0F8FAD5B-D9CB-469F-A165-70867728950E",
            "0F8FAD5BD9CB469FA16570867728950E",
            "0f8fad5b-d9cb-469f-a165-70867728950E",
            "{0f8fad5b-d9cb-469f-a165-70867728950e}",
        ];
        let ids: std::collections::BTreeSet<ObligationId> = spellings
            .iter()
            .map(|s| obligation_id(s).unwrap())
            .collect();
        assert_eq!(ids.len(), spellings.len(), "one id per spelling");
        assert_eq!(
            obligation_id(spellings[0]).unwrap(),
            ObligationId::from_u128(0x0f8fad5b_d9cb_469f_a165_70867728950e)
        );
        assert_eq!(
            id_string(ObligationId::from_u128(
                0x0f8fad5b_d9cb_469f_a165_70867728950e
            )),
            spellings[0]
        );
    }

    /// Found with the official SDK: a `data` part is a protobuf `Value`, so its numbers
    /// arrive as `3600.0`. Whole floats read; fractions and negatives are refused.
    #[test]
    fn whole_numbers_written_as_floats_read_and_fractions_do_not() {
        let issuer = AgentId::new("principal").unwrap();
        let mut v = serde_json::to_value(consent()).unwrap();
        v["deadline_seconds"] = serde_json::json!(3600.0);
        v["max_retries"] = serde_json::json!(15.0);
        v["sequence"] = serde_json::json!(3.0);
        let j: JsonObligation = serde_json::from_value(v.clone()).unwrap();
        assert_eq!(
            j.to_wire(&issuer).unwrap(),
            consent().to_wire(&issuer).unwrap()
        );
        for (field, bad) in [
            ("deadline_seconds", serde_json::json!(3600.5)),
            ("max_retries", serde_json::json!(-1.0)),
            ("max_retries", serde_json::json!(5e9)),
            ("sequence", serde_json::json!(0.25)),
        ] {
            let mut w = v.clone();
            w[field] = bad.clone();
            assert!(
                serde_json::from_value::<JsonObligation>(w).is_err(),
                "{field} = {bad}"
            );
        }
    }

    #[test]
    fn unknown_fields_are_ignored_and_named_and_bad_values_still_refused() {
        let issuer = AgentId::new("principal").unwrap();
        let mut v = serde_json::to_value(consent()).unwrap();
        v["trace_id"] = "t-1".into();
        v["payload"]["reason"] = "user asked".into();
        let bytes = serde_json::to_vec(&v).unwrap();
        let j: JsonObligation = from_json("obligation", &bytes).unwrap();
        assert_eq!(
            j.to_wire(&issuer).unwrap(),
            consent().to_wire(&issuer).unwrap()
        );
        assert_eq!(unknown_fields(&bytes), vec!["trace_id", "payload.reason"]);
        // Known fields with bad values are refused, naming what to fix.
        let mut o = consent();
        o.max_retries = 5_000;
        match o.to_wire(&issuer) {
            Err(JsonError::Field { field, detail }) => {
                assert_eq!(field, "max_retries");
                assert!(detail.contains("limit of 1000"), "{detail}");
            }
            r => panic!("{r:?}"),
        }
        let mut o = consent();
        o.created_at = "2026-11-30T12:00:00".into();
        match o.to_wire(&issuer) {
            Err(JsonError::Field { field, detail }) => {
                assert_eq!(field, "created_at");
                assert!(detail.contains("RFC 3339 time with an offset"), "{detail}");
            }
            r => panic!("{r:?}"),
        }
    }

    mod properties {
        use super::*;
        use proptest::prelude::*;

        /// Spelling `n`: dashed or not; lower, upper or mixed case.
        fn spell(n: u128, dashed: bool, case: u8) -> String {
            let s = if dashed {
                id_string(ObligationId::from_u128(n))
            } else {
                format!("{n:032x}")
            };
            match case {
                0 => s,
                1 => s.to_uppercase(),
                _ => s
                    .chars()
                    .enumerate()
                    .map(|(i, c)| {
                        if i % 2 == 0 {
                            c.to_ascii_uppercase()
                        } else {
                            c
                        }
                    })
                    .collect(),
            }
        }

        fn spelling() -> impl Strategy<Value = String> {
            (any::<u128>(), any::<bool>(), 0u8..3).prop_map(|(n, d, c)| spell(n, d, c))
        }

        fn id_strategy() -> impl Strategy<Value = String> {
            prop_oneof![spelling(), "[ -~]{1,40}", "\\PC{1,20}"]
        }

        fn wire_obligation() -> impl Strategy<Value = Obligation> {
            let payload = prop_oneof![
                (
                    prop_oneof![
                        Just(None),
                        Just(Some(ConsentDecision::Grant)),
                        Just(Some(ConsentDecision::Revoke)),
                        "[a-z]{3,8}"
                            .prop_filter("not a known word", |w| w != "grant" && w != "revoke")
                            .prop_map(|w| Some(ConsentDecision::Unrecognized(w))),
                    ],
                    "[a-z][a-z.]{0,20}",
                    proptest::option::of(0u64..=253_402_300_799_000),
                )
                    .prop_map(|(decision, scope, lease)| {
                        // Only a grant carries a lease.
                        let grant = decision == Some(ConsentDecision::Grant);
                        Payload::AnumatiConsent(ConsentPayload {
                            decision,
                            scope: Scope::new(scope).unwrap(),
                            expires_at: lease.filter(|_| grant).map(UnixMillis),
                        })
                    }),
                (
                    -1_000_000i32..=1_000_000,
                    "[a-z][a-z/]{0,20}",
                    1u64..100_000
                )
                    .prop_map(|(d, key, ttl)| Payload::PhalaBeliefUpdate(
                        abhyasa_wire::BeliefUpdatePayload {
                            weight_key: WeightKey::new(key).unwrap(),
                            weight_delta: WeightDelta(d),
                            ttl_ms: ttl * 1_000,
                        }
                    )),
                (
                    any::<bool>(),
                    "[a-z0-9-]{1,20}",
                    "[a-z]{1,10}",
                    prop::option::of(0u64..4_000_000_000_000)
                )
                    .prop_map(|(revoke, token, client, expires)| {
                        Payload::OauthToken(TokenPayload {
                            action: if revoke {
                                TokenAction::Revoke
                            } else {
                                TokenAction::Issue
                            },
                            token_id: TokenId::new(token).unwrap(),
                            client_id: ClientId::new(client).unwrap(),
                            expires_at: expires.map(UnixMillis),
                        })
                    }),
            ];
            (
                any::<u128>(),
                0u64..4_000_000_000_000,
                1u64..1_000_000,
                0u32..=1_000,
                prop::option::of(any::<u64>()),
                payload,
            )
                .prop_map(|(id, created, span, retries, sequence, payload)| {
                    Obligation {
                        id: ObligationId::from_u128(id),
                        issuer: AgentId::new("principal").unwrap(),
                        target: AgentId::new("agent-1").unwrap(),
                        created_at: UnixMillis(created),
                        deadline: UnixMillis(created + span * 1_000),
                        max_retries: retries,
                        sequence,
                        payload,
                    }
                })
        }

        proptest! {
            /// The mapping is injective on spellings: two different strings are two ids.
            #[test]
            fn the_id_mapping_is_injective(a in id_strategy(), b in id_strategy()) {
                prop_assume!(a != b && !a.is_empty() && !b.is_empty());
                prop_assume!(a.len() <= 256 && b.len() <= 256);
                prop_assert_ne!(obligation_id(&a).unwrap(), obligation_id(&b).unwrap());
            }

            /// Two spellings of one value are two ids (the bug: they were one).
            #[test]
            fn two_spellings_of_one_value_are_two_ids(
                n in any::<u128>(),
                a in (any::<bool>(), 0u8..3),
                b in (any::<bool>(), 0u8..3),
            ) {
                let (a, b) = (spell(n, a.0, a.1), spell(n, b.0, b.1));
                prop_assume!(a != b);
                prop_assert_ne!(obligation_id(&a).unwrap(), obligation_id(&b).unwrap());
            }

            /// Every id has a spelling that maps back to it.
            #[test]
            fn the_canonical_spelling_maps_back(n in any::<u128>()) {
                let id = ObligationId::from_u128(n);
                prop_assert_eq!(obligation_id(&id_string(id)).unwrap(), id);
            }

            /// wire → JSON → wire is the identity, and so JSON → wire → JSON on what the
            /// JSON can say.
            #[test]
            fn json_and_wire_round_trip(o in wire_obligation()) {
                let j = JsonObligation::of(&o).expect("whole seconds");
                let back = j.to_wire(&o.issuer).unwrap();
                prop_assert_eq!(&back, &o);
                let text = serde_json::to_vec(&j).unwrap();
                let again: JsonObligation = from_json("obligation", &text).unwrap();
                prop_assert_eq!(JsonObligation::of(&again.to_wire(&o.issuer).unwrap()), Some(j));
            }
        }
    }
}
