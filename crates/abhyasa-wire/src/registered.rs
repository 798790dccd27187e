//! Kinds this crate does not name: a kind defined in another crate (or in a test) registers
//! its wire name and its payload reader at link time, and its payloads travel as
//! [`Payload::Registered`](crate::Payload::Registered).
//!
//! A registration is made by `abhyasa_custody::register_kind!`, which pairs the
//! [`KindEntry`] read here with the kind's custody rules. A kind read without rules (an entry
//! submitted alone, as the fuzz target's is) is declined `unknown_kind` by a receiver and sent
//! best-effort by a custodian: nothing applies it. A name registered twice is treated as not
//! registered at all (an `unknown_kind` decline), never as whichever registration came first.

use std::any::Any;
use std::fmt;
use std::hash::{Hash, Hasher};
use std::sync::Arc;

use serde::{de::DeserializeOwned, Serialize, Serializer};

use crate::WireError;

/// How a registered kind's payload is read and said. Submitted with [`inventory`]; see the
/// module documentation.
pub struct KindEntry {
    name: &'static str,
    read: fn(&ciborium::Value) -> Result<Typed, String>,
    words: fn(&RegisteredPayload) -> String,
}

inventory::collect!(KindEntry);

/// A kind's payload, its rules of reading and its wording: what a registered kind gives the
/// wire.
pub trait WireKind: 'static {
    /// The wire name, `"<namespace>.<kind>"`; never one of [`Kind::ALL`](crate::Kind::ALL).
    const NAME: &'static str;
    /// The typed payload, its CBOR and JSON shape given by its serde derive.
    type Payload: Serialize + DeserializeOwned + Send + Sync + 'static;
    /// The rules typing alone does not capture; `Err` is the detail of the malformed-payload
    /// decline.
    fn check(p: &Self::Payload) -> Result<(), String>;
    /// What the payload says, without the kind's name (`share calendar.read`).
    fn words(p: &Self::Payload) -> String;
}

impl KindEntry {
    /// The entry of `K`. Only `abhyasa_custody::register_kind!` should submit one.
    #[doc(hidden)]
    pub const fn of<K: WireKind>() -> Self {
        Self {
            name: K::NAME,
            read: read::<K>,
            words: words::<K>,
        }
    }

    /// The wire name.
    pub fn name(&self) -> &'static str {
        self.name
    }

    /// The one entry named `name`: `None` when there is none, or more than one.
    pub fn find(name: &str) -> Option<&'static KindEntry> {
        let mut found = inventory::iter::<KindEntry>
            .into_iter()
            .filter(|e| e.name == name);
        let first = found.next()?;
        found.next().is_none().then_some(first)
    }

    /// Every registered name that [`find`](Self::find) resolves, sorted.
    pub fn names() -> Vec<&'static str> {
        let mut names: Vec<&'static str> = inventory::iter::<KindEntry>
            .into_iter()
            .map(|e| e.name)
            .filter(|n| Self::find(n).is_some())
            .collect();
        names.sort_unstable();
        names.dedup();
        names
    }
}

/// A payload as read: the typed value, and its CBOR as the typed value writes it.
type Typed = (Box<dyn Any + Send + Sync>, ciborium::Value);

/// Reads a payload of `K`, its CBOR written again from the typed value (so that one payload
/// has one encoding however a sender ordered its map, or a binding spelled it).
fn read<K: WireKind>(v: &ciborium::Value) -> Result<Typed, String> {
    let p: K::Payload = v.deserialized().map_err(|e| e.to_string())?;
    K::check(&p)?;
    let canonical = ciborium::Value::serialized(&p).map_err(|e| e.to_string())?;
    Ok((Box::new(p), canonical))
}

fn words<K: WireKind>(p: &RegisteredPayload) -> String {
    match p.typed::<K::Payload>() {
        Some(p) => K::words(p),
        None => format!("({} bytes)", p.read.cbor.len()),
    }
}

/// The payload of a registered kind: its CBOR as read, and the typed value its entry read.
///
/// Two payloads are equal when their kinds and CBOR are; the obligation's digest covers the
/// CBOR exactly as it travels. Shared, so that it adds a pointer to [`Payload`](crate::Payload)
/// and its clones copy nothing.
#[derive(Clone)]
pub struct RegisteredPayload {
    kind: &'static str,
    read: Arc<Read>,
}

/// A payload as its kind's entry read it.
struct Read {
    value: ciborium::Value,
    cbor: Box<[u8]>,
    typed: Box<dyn Any + Send + Sync>,
}

impl RegisteredPayload {
    /// The payload `p` of the registered kind `K`, checked as a receiver would check it.
    pub fn new<K: WireKind>(p: &K::Payload) -> Result<Self, WireError> {
        let value = ciborium::Value::serialized(p)
            .map_err(|_| WireError::Invalid("the payload does not encode"))?;
        Self::read(K::NAME, value).map_err(|e| match e {
            RegisteredError::NotRegistered => WireError::Invalid("the kind is not registered"),
            RegisteredError::Malformed(_) => {
                WireError::Invalid("the payload breaks its kind's rules")
            }
        })
    }

    /// Reads `value` as a payload of the registered kind `name`, as a receiver reads it. The
    /// payload keeps the CBOR its typed value writes, not `value`'s own spelling.
    pub fn read(name: &str, value: ciborium::Value) -> Result<Self, RegisteredError> {
        let entry = KindEntry::find(name).ok_or(RegisteredError::NotRegistered)?;
        let (typed, value) = (entry.read)(&value).map_err(RegisteredError::Malformed)?;
        let mut cbor = Vec::new();
        ciborium::into_writer(&value, &mut cbor)
            .map_err(|e| RegisteredError::Malformed(e.to_string()))?;
        Ok(Self {
            kind: entry.name,
            read: Arc::new(Read {
                value,
                cbor: cbor.into(),
                typed,
            }),
        })
    }

    /// The kind's wire name.
    pub fn kind(&self) -> &'static str {
        self.kind
    }

    /// The payload as its kind reads it; `None` for another type than the kind's.
    pub fn typed<T: 'static>(&self) -> Option<&T> {
        self.read.typed.downcast_ref()
    }

    /// The payload's CBOR value, for a binding that converts it (to JSON, say).
    pub fn value(&self) -> &ciborium::Value {
        &self.read.value
    }

    /// What the payload says, in its kind's words.
    pub fn words(&self) -> String {
        match KindEntry::find(self.kind) {
            Some(entry) => (entry.words)(self),
            None => format!("({} bytes)", self.read.cbor.len()),
        }
    }
}

/// Why a registered kind's payload did not read.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum RegisteredError {
    /// No kind is registered once under the name.
    #[error("no kind is registered under this name")]
    NotRegistered,
    /// The payload does not read as the kind's, or breaks its rules.
    #[error("{0}")]
    Malformed(String),
}

impl PartialEq for RegisteredPayload {
    fn eq(&self, other: &Self) -> bool {
        self.kind == other.kind && self.read.cbor == other.read.cbor
    }
}

impl Eq for RegisteredPayload {}

impl Hash for RegisteredPayload {
    fn hash<H: Hasher>(&self, state: &mut H) {
        self.kind.hash(state);
        self.read.cbor.hash(state);
    }
}

impl fmt::Debug for RegisteredPayload {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RegisteredPayload")
            .field("kind", &self.kind)
            .field("value", &self.read.value)
            .finish()
    }
}

impl Serialize for RegisteredPayload {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        self.read.value.serialize(serializer)
    }
}
