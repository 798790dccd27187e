//! Abhyasa wire objects.
//!
//! Everything that crosses a process boundary in custody — [`Obligation`], [`CustodyAck`],
//! [`Escalation`], [`SafeAction`], [`TerminalRecord`], [`ReconciliationNote`] — as CBOR
//! (RFC 8949) through serde and ciborium.
//!
//! ```text
//!  typed value ──encode──▶ bytes (deterministic: same value, same bytes)
//!  bytes ──decode──▶ size limit ─▶ CBOR ─▶ typed fields ─▶ validation ─▶ value | WireError
//! ```
//!
//! The encoding is deterministic: structs are maps whose keys appear in declaration order,
//! integers take their shortest form, and no field is an unordered map. Decoding is strict:
//! a size limit ([`MAX_OBJECT_SIZE`]), a nesting limit, no trailing bytes, no unknown fields,
//! and validation of the rules typing does not capture; every failure is a [`WireError`].
//! An obligation whose envelope reads but whose kind or payload does not comes back as
//! [`WireError::UnknownKind`] or [`WireError::MalformedPayload`] carrying the [`Envelope`],
//! so a receiver can decline it by id.
//!
//! ```
//! use abhyasa_wire::*;
//!
//! let o = Obligation {
//!     id: ObligationId::from_u128(7),
//!     issuer: AgentId::new("principal").unwrap(),
//!     target: AgentId::new("agent-1").unwrap(),
//!     created_at: UnixMillis(1_000),
//!     deadline: UnixMillis(31_000),
//!     max_retries: 8,
//!     sequence: Some(3),
//!     payload: Payload::AnumatiConsent(ConsentPayload {
//!         decision: Some(ConsentDecision::Revoke),
//!         scope: Scope::new("calendar.read").unwrap(),
//!         expires_at: None,
//!     }),
//! };
//! let bytes = encode(&o);
//! assert_eq!(decode_obligation(&bytes).unwrap(), o);
//! assert_eq!(encode(&o), bytes);
//! ```

#![warn(missing_docs, unreachable_pub)]

mod ack;
mod escalation;
mod ids;
mod kinds;
pub mod ledger;
pub mod moqt;
mod obligation;
mod registered;
pub mod sig;
pub mod words;

use serde::de::DeserializeOwned;
use serde::Serialize;

pub use ack::{AckStatus, CustodyAck, DeclineReason, Detail};
pub use escalation::{
    Escalation, EscalationCause, LastObserved, Outcome, ReconciliationNote, SafeAction,
    TerminalRecord,
};
pub use ids::{
    AgentId, ClientId, NameError, ObligationId, PersistToken, Scope, TokenId, UnixMillis, WeightKey,
};
pub use kinds::{
    BeliefUpdatePayload, ConsentDecision, ConsentPayload, TokenAction, TokenPayload, WeightDelta,
};
pub use ledger::Digest;
pub use obligation::{Envelope, Kind, Obligation, Payload, MAX_RETRIES_LIMIT};
pub use registered::{KindEntry, RegisteredError, RegisteredPayload, WireKind};

/// For `abhyasa_custody::register_kind!`.
#[doc(hidden)]
pub use inventory;

/// The largest encoded object accepted by [`decode`]: 16 KiB.
pub const MAX_OBJECT_SIZE: usize = 16 * 1024;

/// The deepest CBOR nesting accepted by [`decode`].
pub const MAX_NESTING: usize = 16;

/// Why bytes could not be decoded into an object.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum WireError {
    /// The input is over the size limit; nothing was parsed.
    #[error("object is {len} bytes, over the limit of {limit}")]
    TooLarge {
        /// Input length.
        len: usize,
        /// The limit.
        limit: usize,
    },
    /// The bytes are not CBOR of the expected shape.
    #[error("malformed CBOR: {0}")]
    Cbor(String),
    /// Bytes follow the object.
    #[error("{0} trailing bytes after the object")]
    TrailingBytes(usize),
    /// The object parsed but breaks a rule (named).
    #[error("invalid object: {0}")]
    Invalid(&'static str),
    /// An obligation of a kind this build does not know.
    #[error("unknown obligation kind {:?}", .0.kind)]
    UnknownKind(Box<Envelope>),
    /// An obligation whose envelope reads but whose payload does not.
    #[error("malformed payload for obligation {}: {detail}", envelope.id)]
    MalformedPayload {
        /// What could be read.
        envelope: Box<Envelope>,
        /// What was wrong.
        detail: String,
    },
}

impl WireError {
    /// The envelope, when the error kept one: the obligation can be declined by id.
    pub fn envelope(&self) -> Option<&Envelope> {
        match self {
            WireError::UnknownKind(envelope) => Some(envelope),
            WireError::MalformedPayload { envelope, .. } => Some(envelope),
            _ => None,
        }
    }

    /// The decline reason a receiver answers with, when the error kept an envelope.
    pub fn decline_reason(&self) -> Option<DeclineReason> {
        match self {
            WireError::UnknownKind(_) => Some(DeclineReason::UnknownKind),
            WireError::MalformedPayload { .. } => Some(DeclineReason::Malformed),
            _ => None,
        }
    }
}

/// Encodes a value as deterministic CBOR.
pub fn encode<T: Serialize>(value: &T) -> Vec<u8> {
    // An obligation is 140-170 bytes: one allocation holds it.
    let mut out = Vec::with_capacity(256);
    // Writing into a Vec cannot fail, and every wire type serializes to plain CBOR data.
    ciborium::into_writer(value, &mut out).expect("CBOR encoding into a Vec is infallible");
    out
}

/// Decodes one object, strictly: size limit, nesting limit, no trailing bytes.
///
/// For obligations prefer [`decode_obligation`], which keeps the envelope of one whose kind
/// or payload cannot be read.
pub fn decode<T: DeserializeOwned>(bytes: &[u8]) -> Result<T, WireError> {
    check_size(bytes)?;
    let mut reader = bytes;
    let value = ciborium::de::from_reader_with_recursion_limit(&mut reader, MAX_NESTING)
        .map_err(|e| WireError::Cbor(cbor_error(e)))?;
    if !reader.is_empty() {
        return Err(WireError::TrailingBytes(reader.len()));
    }
    Ok(value)
}

/// [`decode`] with another size limit: for stored records larger than a wire object (a
/// branch checkpoint). The nesting limit and the no-trailing-bytes rule still hold.
pub fn decode_with_limit<T: DeserializeOwned>(bytes: &[u8], limit: usize) -> Result<T, WireError> {
    if bytes.len() > limit {
        return Err(WireError::TooLarge {
            len: bytes.len(),
            limit,
        });
    }
    let mut reader = bytes;
    let value = ciborium::de::from_reader_with_recursion_limit(&mut reader, MAX_NESTING)
        .map_err(|e| WireError::Cbor(cbor_error(e)))?;
    if !reader.is_empty() {
        return Err(WireError::TrailingBytes(reader.len()));
    }
    Ok(value)
}

/// Decodes an obligation; an unknown kind or unreadable payload keeps its [`Envelope`].
pub fn decode_obligation(bytes: &[u8]) -> Result<Obligation, WireError> {
    decode::<obligation::RawObligation>(bytes)?.resolve()
}

fn check_size(bytes: &[u8]) -> Result<(), WireError> {
    if bytes.len() > MAX_OBJECT_SIZE {
        return Err(WireError::TooLarge {
            len: bytes.len(),
            limit: MAX_OBJECT_SIZE,
        });
    }
    Ok(())
}

fn cbor_error<E: std::fmt::Debug>(e: ciborium::de::Error<E>) -> String {
    match e {
        ciborium::de::Error::Io(e) => format!("truncated input ({e:?})"),
        ciborium::de::Error::Syntax(at) => format!("syntax error at byte {at}"),
        ciborium::de::Error::Semantic(at, msg) => match at {
            Some(at) => format!("{msg} (at byte {at})"),
            None => msg,
        },
        ciborium::de::Error::RecursionLimitExceeded => "nesting over the limit".to_owned(),
    }
}

#[cfg(test)]
mod tests;
