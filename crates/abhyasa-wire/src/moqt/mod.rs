//! The MOQT (draft-ietf-moq-transport-14) wire format, byte for byte as the draft lays it
//! out: QUIC varints, control messages on the control stream, subgroup streams and object
//! datagrams. Pure encoding and decoding; the session logic lives in `abhyasa-moq`.
//!
//! ```
//! use abhyasa_wire::moqt::*;
//!
//! let setup = Control::ClientSetup { versions: vec![DRAFT_14], params: vec![] };
//! let mut bytes = Vec::new();
//! setup.encode(&mut bytes);
//! assert_eq!(bytes, [0x20, 0x00, 0x0a, 0x01, 0xc0, 0, 0, 0, 0xff, 0, 0, 0x0e, 0x00]);
//! assert_eq!(Control::decode(&bytes).unwrap(), Some((setup, bytes.len())));
//! assert_eq!(Control::decode(&bytes[..5]).unwrap(), None); // not all there yet
//! ```

mod codec;
mod control;
mod data;

pub use codec::{put_field, put_varint, KeyValue, Location, Namespace, Reader, VARINT_MAX};
pub use control::{kind, Control, Filter, DRAFT_14};
pub use data::{
    ObjectBody, ObjectDatagram, ObjectStatus, StreamObject, SubgroupHeader, SubgroupId,
    MAX_OBJECT_PAYLOAD,
};

/// The ALPN of MOQT over native QUIC.
pub const ALPN: &[u8] = b"moq-00";

/// Why MOQT bytes were refused. [`MoqtError::to_code`] gives the session-termination code.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum MoqtError {
    /// The bytes end before the field does (on a stream: wait for more).
    #[error("truncated")]
    Truncated,
    /// The peer broke a rule of the draft (named).
    #[error("protocol violation: {0}")]
    ProtocolViolation(&'static str),
    /// A key-value pair does not parse.
    #[error("key-value formatting error: {0}")]
    KeyValueFormatting(&'static str),
    /// A control message type the draft does not define.
    #[error("unknown control message type {0:#x}")]
    UnknownMessage(u64),
    /// A stream type the draft does not define.
    #[error("unknown stream type {0:#x}")]
    UnknownStreamType(u64),
    /// A datagram type the draft does not define.
    #[error("unknown datagram type {0:#x}")]
    UnknownDatagramType(u64),
    /// No version in common.
    #[error("version negotiation failed")]
    VersionNegotiationFailed,
    /// An object over this implementation's size limit.
    #[error("object over {MAX_OBJECT_PAYLOAD} bytes")]
    TooLarge,
    /// A request at or past the Maximum Request ID granted: the session's request limit.
    #[error("too many requests: the limit is {limit} per session")]
    TooManyRequests {
        /// Requests allowed on the session.
        limit: u64,
    },
}

impl MoqtError {
    /// The draft's session-termination error code for this error.
    pub fn to_code(&self) -> u64 {
        match self {
            MoqtError::KeyValueFormatting(_) => 0x6,
            MoqtError::TooManyRequests { .. } => 0x7,
            MoqtError::VersionNegotiationFailed => 0x15,
            MoqtError::Truncated
            | MoqtError::ProtocolViolation(_)
            | MoqtError::UnknownMessage(_)
            | MoqtError::UnknownStreamType(_)
            | MoqtError::UnknownDatagramType(_)
            | MoqtError::TooLarge => 0x3,
        }
    }
}

#[cfg(test)]
mod tests;
