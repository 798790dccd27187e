//! The custody envelope in MCP `_meta`: obligations on a request, acks on a result
//! (docs/DESIGN.md, "On the wire"; docs/MCP.md). Pure functions, no I/O.

use base64::engine::general_purpose::STANDARD;
use base64::Engine as _;
use serde_json::{Map, Value};

use abhyasa_wire::{decode, decode_obligation, encode, CustodyAck, Obligation};

/// Request `params._meta` key: an array of base64 CBOR obligations.
pub const META_OBLIGATIONS: &str = "org.abhyasa/obligations";
/// Result `_meta` key: an array of base64 CBOR CustodyAcks.
pub const META_ACKS: &str = "org.abhyasa/acks";
/// Request `params._meta` key: a base64 CBOR signed dispatch permit.
pub const META_PERMIT: &str = "org.abhyasa/permit";
/// Result `_meta` key: a base64 CBOR signed receipt.
pub const META_RECEIPT: &str = "org.abhyasa/receipt";
/// Result `_meta` key a budget-gated host tool sets to report what a call actually charged
/// (`dim=n,…`, at most its price); the server takes it off before answering.
pub const META_CHARGE: &str = "org.abhyasa/charge";

/// A custody envelope that cannot be read: the whole request is refused (JSON-RPC -32602)
/// and nothing in it is applied.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[non_exhaustive]
pub enum EnvelopeError {
    /// The key holds something other than an array of strings.
    #[error("_meta[\"{key}\"] must be an array of base64 strings")]
    NotAnArray {
        /// The `_meta` key.
        key: &'static str,
    },
    /// One entry is not a string or not base64.
    #[error("_meta[\"{key}\"][{index}] is not base64: {why}")]
    NotBase64 {
        /// The `_meta` key.
        key: &'static str,
        /// Which entry.
        index: usize,
        /// What is wrong.
        why: String,
    },
    /// One entry's bytes are not an obligation whose envelope reads (an unknown kind or
    /// an unreadable payload keeps its envelope and is declined by id instead).
    #[error("_meta[\"{key}\"][{index}] is not an obligation: {why}")]
    NotAnObject {
        /// The `_meta` key.
        key: &'static str,
        /// Which entry.
        index: usize,
        /// What is wrong.
        why: String,
    },
}

impl EnvelopeError {
    /// The `_meta` key the error is about.
    pub fn key(&self) -> &'static str {
        match self {
            Self::NotAnArray { key }
            | Self::NotBase64 { key, .. }
            | Self::NotAnObject { key, .. } => key,
        }
    }
}

/// A Unix-millisecond time as RFC 3339 (UTC, milliseconds).
pub fn rfc3339(t: abhyasa_wire::UnixMillis) -> String {
    let at = std::time::UNIX_EPOCH + std::time::Duration::from_millis(t.0);
    humantime::format_rfc3339_millis(at).to_string()
}

/// An ack as JSON, for people and for clients that read `structuredContent` rather than the
/// CBOR in `_meta`: the id as 32 hex digits, the status (`applied`, `declined`, `deferred`),
/// a decline's `reason`, the agent's own words in `detail`, and `acked_at` as RFC 3339 beside
/// the raw Unix milliseconds in `acked_at_ms`.
pub fn ack_json(ack: &CustodyAck) -> Value {
    use abhyasa_wire::AckStatus;
    let (status, reason) = match ack.status {
        AckStatus::Applied => ("applied", None),
        AckStatus::Declined(r) => ("declined", Some(r.as_str())),
        AckStatus::Deferred => ("deferred", None),
    };
    let mut v = serde_json::json!({
        "obligation_id": ack.obligation_id.to_string(),
        "target": ack.target.as_str(),
        "status": status,
        "acked_at": rfc3339(ack.acked_at),
        "acked_at_ms": ack.acked_at.0,
    });
    if let Some(r) = reason {
        v["reason"] = Value::from(r);
    }
    if let Some(d) = &ack.detail {
        v["detail"] = Value::from(d.to_string());
    }
    v
}

/// The base64 strings under `key`, decoded; absent key: none.
fn entries(meta: &Map<String, Value>, key: &'static str) -> Result<Vec<Vec<u8>>, EnvelopeError> {
    let Some(v) = meta.get(key) else {
        return Ok(Vec::new());
    };
    let Value::Array(items) = v else {
        return Err(EnvelopeError::NotAnArray { key });
    };
    items
        .iter()
        .enumerate()
        .map(|(index, item)| {
            let Value::String(s) = item else {
                return Err(EnvelopeError::NotBase64 {
                    key,
                    index,
                    why: "not a string".into(),
                });
            };
            STANDARD.decode(s).map_err(|e| EnvelopeError::NotBase64 {
                key,
                index,
                why: e.to_string(),
            })
        })
        .collect()
}

/// The obligation objects a request carries, each checked to read at least as far as its
/// envelope (id, issuer, target), so that every one of them can be answered by id. Any
/// entry that cannot is an error for the whole envelope: nothing is delivered.
pub fn obligations_from_meta(meta: &Map<String, Value>) -> Result<Vec<Vec<u8>>, EnvelopeError> {
    let objects = entries(meta, META_OBLIGATIONS)?;
    for (index, bytes) in objects.iter().enumerate() {
        if let Err(e) = decode_obligation(bytes) {
            if e.envelope().is_none() || e.decline_reason().is_none() {
                return Err(EnvelopeError::NotAnObject {
                    key: META_OBLIGATIONS,
                    index,
                    why: e.to_string(),
                });
            }
        }
    }
    Ok(objects)
}

/// Obligations as the `_meta` value a custodian puts on a request.
pub fn obligations_to_meta(obligations: &[Obligation]) -> Value {
    Value::Array(
        obligations
            .iter()
            .map(|o| Value::String(STANDARD.encode(encode(o))))
            .collect(),
    )
}

/// Acks as the `_meta` value a server puts on a result.
pub fn acks_to_meta(acks: &[CustodyAck]) -> Value {
    Value::Array(
        acks.iter()
            .map(|a| Value::String(STANDARD.encode(encode(a))))
            .collect(),
    )
}

/// The acks a result carries (what a custodian reads back).
pub fn acks_from_meta(meta: &Map<String, Value>) -> Result<Vec<CustodyAck>, EnvelopeError> {
    entries(meta, META_ACKS)?
        .iter()
        .enumerate()
        .map(|(index, bytes)| {
            decode::<CustodyAck>(bytes).map_err(|e| EnvelopeError::NotAnObject {
                key: META_ACKS,
                index,
                why: e.to_string(),
            })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use abhyasa_wire::{
        AckStatus, AgentId, ClientId, ObligationId, Payload, TokenAction, TokenId, TokenPayload,
        UnixMillis,
    };
    use serde_json::json;

    fn obligation(n: u128) -> Obligation {
        Obligation {
            id: ObligationId::from_u128(n),
            issuer: AgentId::new("principal").unwrap(),
            target: AgentId::new("agent-1").unwrap(),
            created_at: UnixMillis(1_000),
            deadline: UnixMillis(60_000),
            max_retries: 3,
            sequence: None,
            payload: Payload::OauthToken(TokenPayload {
                action: TokenAction::Revoke,
                token_id: TokenId::new("t").unwrap(),
                client_id: ClientId::new("c").unwrap(),
                expires_at: None,
            }),
        }
    }

    fn meta(v: Value) -> Map<String, Value> {
        let mut m = Map::new();
        m.insert(META_OBLIGATIONS.into(), v);
        m
    }

    #[test]
    fn obligations_round_trip_through_meta() {
        let os = [obligation(1), obligation(2)];
        let got = obligations_from_meta(&meta(obligations_to_meta(&os))).unwrap();
        assert_eq!(got, vec![encode(&os[0]), encode(&os[1])]);
        assert_eq!(
            obligations_from_meta(&Map::new()).unwrap(),
            Vec::<Vec<u8>>::new()
        );
    }

    #[test]
    fn a_malformed_envelope_names_the_key_and_the_entry() {
        let good = STANDARD.encode(encode(&obligation(1)));
        assert_eq!(
            obligations_from_meta(&meta(json!("x"))),
            Err(EnvelopeError::NotAnArray {
                key: META_OBLIGATIONS
            })
        );
        assert!(matches!(
            obligations_from_meta(&meta(json!([good, 7]))),
            Err(EnvelopeError::NotBase64 { index: 1, .. })
        ));
        assert!(matches!(
            obligations_from_meta(&meta(json!([good, "%%%"]))),
            Err(EnvelopeError::NotBase64 { index: 1, .. })
        ));
        // Valid base64 of bytes that are no obligation at all.
        let junk = STANDARD.encode([0xa1u8, 0x00, 0x00]);
        let e = obligations_from_meta(&meta(json!([good, junk]))).unwrap_err();
        assert!(
            matches!(e, EnvelopeError::NotAnObject { index: 1, .. }),
            "{e:?}"
        );
        assert_eq!(e.key(), META_OBLIGATIONS);
    }

    #[test]
    fn acks_round_trip_through_meta() {
        let ack = CustodyAck {
            obligation_id: ObligationId::from_u128(9),
            target: AgentId::new("agent-1").unwrap(),
            status: AckStatus::Applied,
            acked_at: UnixMillis(5),
            detail: None,
        };
        let mut m = Map::new();
        m.insert(META_ACKS.into(), acks_to_meta(std::slice::from_ref(&ack)));
        assert_eq!(acks_from_meta(&m).unwrap(), vec![ack]);
    }

    /// An ack as JSON: the id as 32 hex digits, a decline's reason and words, the time as
    /// RFC 3339 beside the raw milliseconds.
    #[test]
    fn an_ack_reads_as_json_with_its_time_twice() {
        let ack = CustodyAck {
            obligation_id: ObligationId::from_u128(0xab),
            target: AgentId::new("agent-1").unwrap(),
            status: AckStatus::Declined(abhyasa_wire::DeclineReason::Policy),
            acked_at: UnixMillis(1_796_438_400_123),
            detail: Some(abhyasa_wire::Detail::new("the user keeps it").unwrap()),
        };
        assert_eq!(
            ack_json(&ack),
            json!({
                "obligation_id": "000000000000000000000000000000ab",
                "target": "agent-1",
                "status": "declined",
                "reason": "policy",
                "detail": "the user keeps it",
                "acked_at": "2026-12-05T02:40:00.123Z",
                "acked_at_ms": 1_796_438_400_123u64,
            })
        );
    }
}
