//! Newtype identifiers, bounded strings and absolute times.

use std::fmt;
use std::sync::Arc;

use serde::de::{self, Visitor};
use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// A 128-bit obligation id, unique per issuer; the idempotency key everywhere.
///
/// Encoded as a 16-byte CBOR byte string.
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct ObligationId([u8; 16]);

impl ObligationId {
    /// Builds an id from its 16 bytes.
    pub const fn from_bytes(bytes: [u8; 16]) -> Self {
        Self(bytes)
    }

    /// Builds an id from a 128-bit integer (big-endian bytes).
    pub const fn from_u128(value: u128) -> Self {
        Self(value.to_be_bytes())
    }

    /// The id's 16 bytes.
    pub const fn as_bytes(&self) -> &[u8; 16] {
        &self.0
    }

    /// The id as a 128-bit integer.
    pub const fn to_u128(self) -> u128 {
        u128::from_be_bytes(self.0)
    }
}

impl fmt::Display for ObligationId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:032x}", self.to_u128())
    }
}

impl fmt::Debug for ObligationId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "ObligationId({self})")
    }
}

impl Serialize for ObligationId {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_bytes(&self.0)
    }
}

impl<'de> Deserialize<'de> for ObligationId {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct IdVisitor;
        impl Visitor<'_> for IdVisitor {
            type Value = ObligationId;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a 16-byte obligation id")
            }
            fn visit_bytes<E: de::Error>(self, v: &[u8]) -> Result<ObligationId, E> {
                let bytes: [u8; 16] = v
                    .try_into()
                    .map_err(|_| E::invalid_length(v.len(), &self))?;
                Ok(ObligationId(bytes))
            }
        }
        deserializer.deserialize_bytes(IdVisitor)
    }
}

/// Names one record a state machine handed out to be made durable (custodian, receiver,
/// branch, gateway: one type for all); hand it back to that machine's `handle_persisted` once
/// the record is durable. Tokens are issued in order per machine.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct PersistToken(pub u64);

/// An absolute time: milliseconds since the unix epoch.
///
/// Custody never uses relative times on the wire: a deadline fixed at issue means the same
/// instant after any number of restarts.
#[derive(
    Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Debug, Default, Serialize, Deserialize,
)]
#[serde(transparent)]
pub struct UnixMillis(pub u64);

impl UnixMillis {
    /// `self + ms`, saturating at the far future.
    pub const fn saturating_add(self, ms: u64) -> Self {
        Self(self.0.saturating_add(ms))
    }

    /// `self - earlier` in milliseconds, zero when `earlier` is later.
    pub const fn saturating_since(self, earlier: UnixMillis) -> u64 {
        self.0.saturating_sub(earlier.0)
    }
}

impl fmt::Display for UnixMillis {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}ms", self.0)
    }
}

/// Why a bounded string was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum NameError {
    /// The string is empty.
    #[error("{what} is empty")]
    Empty {
        /// Which kind of name.
        what: &'static str,
    },
    /// The string is longer than its limit.
    #[error("{what} is {len} bytes, over the limit of {limit}")]
    TooLong {
        /// Which kind of name.
        what: &'static str,
        /// Its length in bytes.
        len: usize,
        /// The limit in bytes.
        limit: usize,
    },
    /// The string holds a character its kind does not allow.
    #[error("{what} holds a character outside {allowed}")]
    BadChar {
        /// Which kind of name.
        what: &'static str,
        /// The characters allowed.
        allowed: &'static str,
    },
}

macro_rules! bounded_name {
    ($(#[$meta:meta])* $name:ident, $what:literal, $limit:expr, $check:expr, $allowed:literal) => {
        $(#[$meta])*
        ///
        /// Held as shared text: a clone is a reference count, not a copy (names are cloned into
        /// every record, key and event that mentions them).
        #[derive(Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
        pub struct $name(Arc<str>);

        // Written as the text it holds.
        impl Serialize for $name {
            fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
                s.serialize_str(&self.0)
            }
        }

        // Read from text, checked as [`Self::new`] checks it, with one copy of it.
        impl<'de> Deserialize<'de> for $name {
            fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
                struct NameVisitor;
                impl Visitor<'_> for NameVisitor {
                    type Value = $name;
                    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                        f.write_str($what)
                    }
                    fn visit_str<E: de::Error>(self, v: &str) -> Result<$name, E> {
                        $name::checked(v).map_err(E::custom)
                    }
                }
                deserializer.deserialize_str(NameVisitor)
            }
        }

        impl $name {
            /// Largest length in bytes.
            pub const MAX_LEN: usize = $limit;

            /// Parses a name, refusing empty, over-long or ill-formed ones.
            pub fn new(value: impl AsRef<str>) -> Result<Self, NameError> {
                Self::checked(value.as_ref())
            }

            fn checked(value: &str) -> Result<Self, NameError> {
                if value.is_empty() {
                    return Err(NameError::Empty { what: $what });
                }
                if value.len() > Self::MAX_LEN {
                    return Err(NameError::TooLong { what: $what, len: value.len(), limit: Self::MAX_LEN });
                }
                let check: fn(char) -> bool = $check;
                if !value.chars().all(check) {
                    return Err(NameError::BadChar { what: $what, allowed: $allowed });
                }
                Ok(Self(Arc::from(value)))
            }

            /// The name as text.
            pub fn as_str(&self) -> &str {
                &self.0
            }
        }

        impl TryFrom<String> for $name {
            type Error = NameError;
            fn try_from(value: String) -> Result<Self, NameError> {
                Self::new(value)
            }
        }

        impl From<$name> for String {
            fn from(value: $name) -> String {
                value.0.as_ref().to_owned()
            }
        }

        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str(&self.0)
            }
        }

        impl fmt::Debug for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                write!(f, "{}({:?})", stringify!($name), &*self.0)
            }
        }
    };
}

fn agent_char(c: char) -> bool {
    c.is_ascii_lowercase() || c.is_ascii_digit() || matches!(c, '-' | '_' | '.')
}

fn printable(c: char) -> bool {
    !c.is_control()
}

bounded_name!(
    /// An agent's identity: 1..=64 bytes of `[a-z0-9._-]`. It is also the name in the agent's
    /// certificate and a component of MOQT track names, hence the narrow alphabet.
    AgentId, "agent id", 64, agent_char, "[a-z0-9._-]"
);
bounded_name!(
    /// A consent scope (Anumati), e.g. `calendar.read`: 1..=256 bytes, no control characters.
    Scope, "scope", 256, printable, "printable characters"
);
bounded_name!(
    /// A preference-weight key (Phala), e.g. `supplier/acme`: 1..=256 bytes, no control characters.
    WeightKey, "weight key", 256, printable, "printable characters"
);
bounded_name!(
    /// An OAuth token id: 1..=256 bytes, no control characters.
    TokenId, "token id", 256, printable, "printable characters"
);
bounded_name!(
    /// An OAuth client id: 1..=256 bytes, no control characters.
    ClientId, "client id", 256, printable, "printable characters"
);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn agent_id_rejects_bad_names() {
        assert!(AgentId::new("agent-1.eu_west").is_ok());
        assert_eq!(AgentId::new(""), Err(NameError::Empty { what: "agent id" }));
        assert!(matches!(
            AgentId::new("Agent"),
            Err(NameError::BadChar { .. })
        ));
        assert!(matches!(
            AgentId::new("a/b"),
            Err(NameError::BadChar { .. })
        ));
        assert!(matches!(
            AgentId::new("a".repeat(65)),
            Err(NameError::TooLong {
                len: 65,
                limit: 64,
                ..
            })
        ));
        assert!(AgentId::new("a".repeat(64)).is_ok());
    }

    #[test]
    fn scope_rejects_control_characters() {
        assert!(Scope::new("calendar.read").is_ok());
        assert!(matches!(Scope::new("a\nb"), Err(NameError::BadChar { .. })));
    }

    #[test]
    fn obligation_id_displays_as_hex() {
        let id = ObligationId::from_u128(0xabc);
        assert_eq!(id.to_string(), format!("{:032x}", 0xabc));
        assert_eq!(ObligationId::from_bytes(*id.as_bytes()), id);
        assert_eq!(id.to_u128(), 0xabc);
    }
}
