//! Primitive encodings of draft-ietf-moq-transport-14: QUIC varints (RFC 9000 §16), byte
//! fields, tuples, key-value pairs, reason phrases, locations.

use super::MoqtError;

/// The largest value a QUIC varint holds: 2^62 - 1.
pub const VARINT_MAX: u64 = (1 << 62) - 1;

/// Appends `v` as a QUIC varint in its shortest form.
///
/// # Panics
/// If `v` exceeds [`VARINT_MAX`]: a programmer error, never input.
pub fn put_varint(out: &mut Vec<u8>, v: u64) {
    assert!(v <= VARINT_MAX, "varint out of range: {v}");
    if v < 1 << 6 {
        out.push(v as u8);
    } else if v < 1 << 14 {
        out.extend_from_slice(&((v as u16) | 0x4000).to_be_bytes());
    } else if v < 1 << 30 {
        out.extend_from_slice(&((v as u32) | 0x8000_0000).to_be_bytes());
    } else {
        out.extend_from_slice(&(v | 0xc000_0000_0000_0000).to_be_bytes());
    }
}

/// A cursor over received bytes. Every read is bounds-checked; running out is
/// [`MoqtError::Truncated`], so a caller can wait for more bytes.
#[derive(Debug, Clone)]
pub struct Reader<'a> {
    buf: &'a [u8],
    pos: usize,
}

impl<'a> Reader<'a> {
    /// A reader at the start of `buf`.
    pub fn new(buf: &'a [u8]) -> Self {
        Self { buf, pos: 0 }
    }

    /// Bytes consumed so far.
    pub fn position(&self) -> usize {
        self.pos
    }

    /// Bytes left.
    pub fn remaining(&self) -> usize {
        self.buf.len() - self.pos
    }

    /// Everything left, consumed.
    pub fn rest(&mut self) -> &'a [u8] {
        let r = &self.buf[self.pos..];
        self.pos = self.buf.len();
        r
    }

    /// `n` bytes.
    pub fn bytes(&mut self, n: usize) -> Result<&'a [u8], MoqtError> {
        if self.remaining() < n {
            return Err(MoqtError::Truncated);
        }
        let r = &self.buf[self.pos..self.pos + n];
        self.pos += n;
        Ok(r)
    }

    /// One byte.
    pub fn u8(&mut self) -> Result<u8, MoqtError> {
        Ok(self.bytes(1)?[0])
    }

    /// A big-endian 16-bit integer.
    pub fn u16(&mut self) -> Result<u16, MoqtError> {
        let b = self.bytes(2)?;
        Ok(u16::from_be_bytes([b[0], b[1]]))
    }

    /// A QUIC varint.
    pub fn varint(&mut self) -> Result<u64, MoqtError> {
        let first = *self.buf.get(self.pos).ok_or(MoqtError::Truncated)?;
        let len = 1usize << (first >> 6);
        let b = self.bytes(len)?;
        let mut v = u64::from(b[0] & 0x3f);
        for &x in &b[1..] {
            v = (v << 8) | u64::from(x);
        }
        Ok(v)
    }

    /// A varint that must fit `usize` and stay at or below `limit`.
    pub fn length(&mut self, limit: usize, what: &'static str) -> Result<usize, MoqtError> {
        let v = self.varint()?;
        if v > limit as u64 {
            return Err(MoqtError::ProtocolViolation(what));
        }
        Ok(v as usize)
    }

    /// A `(b)` field: a varint length, then that many bytes, at most `limit`.
    pub fn field(&mut self, limit: usize, what: &'static str) -> Result<&'a [u8], MoqtError> {
        let n = self.length(limit, what)?;
        self.bytes(n)
    }
}

/// Appends a `(b)` field.
pub fn put_field(out: &mut Vec<u8>, bytes: &[u8]) {
    put_varint(out, bytes.len() as u64);
    out.extend_from_slice(bytes);
}

/// A key-value pair (draft §1.4.2): even types carry a varint, odd types a byte string of at
/// most 65,535 bytes.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum KeyValue {
    /// Even type: a varint value.
    Int {
        /// The type (even).
        key: u64,
        /// The value.
        value: u64,
    },
    /// Odd type: a byte string.
    Bytes {
        /// The type (odd).
        key: u64,
        /// The value.
        value: Vec<u8>,
    },
}

impl KeyValue {
    /// The type.
    pub fn key(&self) -> u64 {
        match self {
            KeyValue::Int { key, .. } | KeyValue::Bytes { key, .. } => *key,
        }
    }

    pub(crate) fn encode(&self, out: &mut Vec<u8>) {
        match self {
            KeyValue::Int { key, value } => {
                debug_assert!(key % 2 == 0, "an int parameter has an even type");
                put_varint(out, *key);
                put_varint(out, *value);
            }
            KeyValue::Bytes { key, value } => {
                debug_assert!(key % 2 == 1, "a bytes parameter has an odd type");
                put_varint(out, *key);
                put_field(out, value);
            }
        }
    }

    pub(crate) fn decode(r: &mut Reader<'_>) -> Result<Self, MoqtError> {
        let key = r.varint()?;
        if key % 2 == 0 {
            return Ok(KeyValue::Int {
                key,
                value: r.varint()?,
            });
        }
        let n = r.varint()?;
        if n > u64::from(u16::MAX) {
            return Err(MoqtError::ProtocolViolation("key-value length over 65535"));
        }
        Ok(KeyValue::Bytes {
            key,
            value: r.bytes(n as usize)?.to_vec(),
        })
    }
}

/// Appends `Number of Parameters (i), Parameters (..) ...`.
pub(crate) fn put_params(out: &mut Vec<u8>, params: &[KeyValue]) {
    put_varint(out, params.len() as u64);
    for p in params {
        p.encode(out);
    }
}

/// Reads `Number of Parameters (i), Parameters (..) ...`.
pub(crate) fn params(r: &mut Reader<'_>) -> Result<Vec<KeyValue>, MoqtError> {
    // Each parameter takes at least two bytes: a count beyond that is a lie.
    let n = r.length(r.remaining() / 2, "parameter count beyond the message")?;
    (0..n).map(|_| KeyValue::decode(r)).collect()
}

/// A track namespace: 1 to 32 byte fields.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Namespace(pub Vec<Vec<u8>>);

impl Namespace {
    /// A namespace from text fields.
    pub fn from_strs(fields: &[&str]) -> Self {
        Self(fields.iter().map(|f| f.as_bytes().to_vec()).collect())
    }

    /// Whether `prefix` is a prefix of this namespace (field by field).
    pub fn starts_with(&self, prefix: &Namespace) -> bool {
        self.0.starts_with(&prefix.0)
    }

    fn len_bytes(&self) -> usize {
        self.0.iter().map(Vec::len).sum()
    }

    pub(crate) fn encode(&self, out: &mut Vec<u8>) {
        put_varint(out, self.0.len() as u64);
        for f in &self.0 {
            put_field(out, f);
        }
    }

    pub(crate) fn decode(r: &mut Reader<'_>) -> Result<Self, MoqtError> {
        let n = r.varint()?;
        if n == 0 || n > 32 {
            return Err(MoqtError::ProtocolViolation(
                "namespace must have 1 to 32 fields",
            ));
        }
        let mut fields = Vec::with_capacity(n as usize);
        for _ in 0..n {
            fields.push(r.field(4096, "namespace field over 4096 bytes")?.to_vec());
        }
        let ns = Namespace(fields);
        if ns.len_bytes() > 4096 {
            return Err(MoqtError::ProtocolViolation(
                "full track name over 4096 bytes",
            ));
        }
        Ok(ns)
    }
}

/// Reads a track name after its namespace, enforcing the 4,096-byte full-name limit.
pub(crate) fn track_name(r: &mut Reader<'_>, ns: &Namespace) -> Result<Vec<u8>, MoqtError> {
    let limit = 4096 - ns.len_bytes();
    Ok(r.field(limit, "full track name over 4096 bytes")?.to_vec())
}

/// Appends a reason phrase.
pub(crate) fn put_reason(out: &mut Vec<u8>, reason: &str) {
    put_field(out, reason.as_bytes());
}

/// Reads a reason phrase: at most 1,024 bytes of UTF-8.
pub(crate) fn reason(r: &mut Reader<'_>) -> Result<String, MoqtError> {
    let b = r.field(1024, "reason phrase over 1024 bytes")?;
    String::from_utf8(b.to_vec())
        .map_err(|_| MoqtError::ProtocolViolation("reason phrase is not UTF-8"))
}

/// A (group, object) location.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct Location {
    /// Group id.
    pub group: u64,
    /// Object id.
    pub object: u64,
}

impl Location {
    pub(crate) fn encode(&self, out: &mut Vec<u8>) {
        put_varint(out, self.group);
        put_varint(out, self.object);
    }

    pub(crate) fn decode(r: &mut Reader<'_>) -> Result<Self, MoqtError> {
        Ok(Self {
            group: r.varint()?,
            object: r.varint()?,
        })
    }
}
