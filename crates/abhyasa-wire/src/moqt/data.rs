//! Objects on SUBGROUP_HEADER streams and in OBJECT_DATAGRAMs (draft §10), every type
//! variant, with object extension headers.

use super::codec::{put_varint, KeyValue, Reader};
use super::MoqtError;

/// The largest object payload accepted (our limit, not the draft's): 1 MiB.
pub const MAX_OBJECT_PAYLOAD: usize = 1 << 20;

/// Object status (draft §10.2.1.1).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ObjectStatus {
    /// 0x0: a normal (here: empty) object.
    Normal,
    /// 0x1: the object does not exist.
    DoesNotExist,
    /// 0x3: end of group.
    EndOfGroup,
    /// 0x4: end of track.
    EndOfTrack,
}

impl ObjectStatus {
    fn code(self) -> u64 {
        match self {
            ObjectStatus::Normal => 0x0,
            ObjectStatus::DoesNotExist => 0x1,
            ObjectStatus::EndOfGroup => 0x3,
            ObjectStatus::EndOfTrack => 0x4,
        }
    }

    fn from_code(v: u64) -> Result<Self, MoqtError> {
        Ok(match v {
            0x0 => ObjectStatus::Normal,
            0x1 => ObjectStatus::DoesNotExist,
            0x3 => ObjectStatus::EndOfGroup,
            0x4 => ObjectStatus::EndOfTrack,
            _ => return Err(MoqtError::ProtocolViolation("unknown object status")),
        })
    }
}

/// What an object carries: a payload, or a status with no payload.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum ObjectBody {
    /// A non-empty payload.
    Payload(Vec<u8>),
    /// A status (an empty normal object is `Status(Normal)`).
    Status(ObjectStatus),
}

fn put_extensions(out: &mut Vec<u8>, ext: &[KeyValue]) {
    let mut block = Vec::new();
    ext.iter().for_each(|kv| kv.encode(&mut block));
    put_varint(out, block.len() as u64);
    out.extend_from_slice(&block);
}

fn extensions(r: &mut Reader<'_>) -> Result<Vec<KeyValue>, MoqtError> {
    let len = r.varint()?;
    if len > MAX_OBJECT_PAYLOAD as u64 {
        return Err(MoqtError::ProtocolViolation("extension block too long"));
    }
    let block = r.bytes(len as usize)?;
    let mut inner = Reader::new(block);
    let mut out = Vec::new();
    while inner.remaining() > 0 {
        out.push(KeyValue::decode(&mut inner).map_err(|e| match e {
            MoqtError::Truncated => MoqtError::KeyValueFormatting("extension overruns its block"),
            e => e,
        })?);
    }
    Ok(out)
}

/// How a subgroup stream names its subgroup.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum SubgroupId {
    /// Not on the wire; subgroup 0.
    Zero,
    /// Not on the wire; the first object's id.
    FirstObject,
    /// On the wire.
    Explicit(u64),
}

/// The header that opens a subgroup stream (types 0x10–0x15, 0x18–0x1D).
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct SubgroupHeader {
    /// Track alias from SUBSCRIBE_OK.
    pub track_alias: u64,
    /// Group id.
    pub group: u64,
    /// Subgroup id and how it is carried.
    pub subgroup: SubgroupId,
    /// Publisher priority.
    pub priority: u8,
    /// Whether every object on the stream carries an extension block.
    pub extensions: bool,
    /// Whether the last object before FIN ends the group.
    pub end_of_group: bool,
}

impl SubgroupHeader {
    /// The stream type this header encodes as.
    pub fn stream_type(&self) -> u64 {
        let mode = match self.subgroup {
            SubgroupId::Zero => 0,
            SubgroupId::FirstObject => 1,
            SubgroupId::Explicit(_) => 2,
        };
        0x10 | (u64::from(self.end_of_group) << 3) | (mode << 1) | u64::from(self.extensions)
    }

    /// Appends the header.
    pub fn encode(&self, out: &mut Vec<u8>) {
        put_varint(out, self.stream_type());
        put_varint(out, self.track_alias);
        put_varint(out, self.group);
        if let SubgroupId::Explicit(id) = self.subgroup {
            put_varint(out, id);
        }
        out.push(self.priority);
    }

    /// Reads a header from the front of a stream. `Ok(None)`: more bytes needed.
    pub fn decode(buf: &[u8]) -> Result<Option<(Self, usize)>, MoqtError> {
        let mut r = Reader::new(buf);
        match Self::read(&mut r) {
            Ok(h) => Ok(Some((h, r.position()))),
            Err(MoqtError::Truncated) => Ok(None),
            Err(e) => Err(e),
        }
    }

    fn read(r: &mut Reader<'_>) -> Result<Self, MoqtError> {
        let t = r.varint()?;
        if !(0x10..=0x1D).contains(&t) || matches!(t & 0x7, 0x6 | 0x7) {
            return Err(MoqtError::UnknownStreamType(t));
        }
        let track_alias = r.varint()?;
        let group = r.varint()?;
        let subgroup = match (t >> 1) & 0x3 {
            0 => SubgroupId::Zero,
            1 => SubgroupId::FirstObject,
            _ => SubgroupId::Explicit(r.varint()?),
        };
        Ok(Self {
            track_alias,
            group,
            subgroup,
            priority: r.u8()?,
            extensions: t & 0x1 == 1,
            end_of_group: t & 0x8 != 0,
        })
    }
}

/// One object on a subgroup stream.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct StreamObject {
    /// Object id delta (first object: the object id itself).
    pub object_id_delta: u64,
    /// Extension headers (only on streams whose header says so).
    pub extensions: Vec<KeyValue>,
    /// Payload or status.
    pub body: ObjectBody,
}

impl StreamObject {
    /// Appends the object; `extensions` is the stream header's flag.
    pub fn encode(&self, extensions: bool, out: &mut Vec<u8>) {
        put_varint(out, self.object_id_delta);
        if extensions {
            put_extensions(out, &self.extensions);
        }
        match &self.body {
            ObjectBody::Payload(p) => {
                put_varint(out, p.len() as u64);
                out.extend_from_slice(p);
            }
            ObjectBody::Status(s) => {
                put_varint(out, 0);
                put_varint(out, s.code());
            }
        }
    }

    /// Reads one object. `Ok(None)`: more bytes needed.
    pub fn decode(buf: &[u8], extensions: bool) -> Result<Option<(Self, usize)>, MoqtError> {
        let mut r = Reader::new(buf);
        let read = |r: &mut Reader<'_>| -> Result<Self, MoqtError> {
            let object_id_delta = r.varint()?;
            let ext = if extensions {
                self::extensions(r)?
            } else {
                Vec::new()
            };
            let len = r.varint()?;
            if len > MAX_OBJECT_PAYLOAD as u64 {
                return Err(MoqtError::TooLarge);
            }
            let body = if len == 0 {
                let s = ObjectStatus::from_code(r.varint()?)?;
                if s == ObjectStatus::DoesNotExist && !ext.is_empty() {
                    return Err(MoqtError::ProtocolViolation(
                        "extensions on a non-existent object",
                    ));
                }
                ObjectBody::Status(s)
            } else {
                ObjectBody::Payload(r.bytes(len as usize)?.to_vec())
            };
            Ok(Self {
                object_id_delta,
                extensions: ext,
                body,
            })
        };
        match read(&mut r) {
            Ok(o) => Ok(Some((o, r.position()))),
            Err(MoqtError::Truncated) => Ok(None),
            Err(e) => Err(e),
        }
    }
}

/// One OBJECT_DATAGRAM (types 0x00–0x07, 0x20–0x21).
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct ObjectDatagram {
    /// Track alias.
    pub track_alias: u64,
    /// Group id.
    pub group: u64,
    /// Object id; `None` when absent on the wire (object 0). Status datagrams always carry it.
    pub object_id: Option<u64>,
    /// Publisher priority.
    pub priority: u8,
    /// Extension headers; `Some` means present, and then non-empty.
    pub extensions: Option<Vec<KeyValue>>,
    /// Whether this object ends its group (payload types only).
    pub end_of_group: bool,
    /// Payload or status.
    pub body: ObjectBody,
}

impl ObjectDatagram {
    /// The datagram type.
    pub fn datagram_type(&self) -> u64 {
        let ext = u64::from(self.extensions.is_some());
        match self.body {
            ObjectBody::Status(_) => 0x20 | ext,
            ObjectBody::Payload(_) => {
                (u64::from(self.object_id.is_none()) << 2)
                    | (u64::from(self.end_of_group) << 1)
                    | ext
            }
        }
    }

    /// The object id (absent means 0).
    pub fn object(&self) -> u64 {
        self.object_id.unwrap_or(0)
    }

    /// Encodes the datagram.
    ///
    /// # Panics
    /// On a combination the draft has no type for (a status with end-of-group, a status
    /// without an object id, an empty extension list): a programmer error.
    pub fn encode(&self) -> Vec<u8> {
        let mut out = Vec::new();
        if let ObjectBody::Status(_) = self.body {
            assert!(
                !self.end_of_group && self.object_id.is_some(),
                "no datagram type for this status object"
            );
        }
        assert!(
            self.extensions.as_ref().is_none_or(|e| !e.is_empty()),
            "present extensions must be non-empty"
        );
        put_varint(&mut out, self.datagram_type());
        put_varint(&mut out, self.track_alias);
        put_varint(&mut out, self.group);
        if let Some(id) = self.object_id {
            put_varint(&mut out, id);
        }
        out.push(self.priority);
        if let Some(ext) = &self.extensions {
            put_extensions(&mut out, ext);
        }
        match &self.body {
            ObjectBody::Status(s) => put_varint(&mut out, s.code()),
            ObjectBody::Payload(p) => out.extend_from_slice(p),
        }
        out
    }

    /// Decodes a whole datagram.
    pub fn decode(buf: &[u8]) -> Result<Self, MoqtError> {
        let mut r = Reader::new(buf);
        let t = r.varint()?;
        let (status, ext, eog, id_present) = match t {
            0x00..=0x07 => (false, t & 0x1 == 1, t & 0x2 != 0, t & 0x4 == 0),
            0x20 | 0x21 => (true, t & 0x1 == 1, false, true),
            _ => return Err(MoqtError::UnknownDatagramType(t)),
        };
        let body = (|| -> Result<Self, MoqtError> {
            let track_alias = r.varint()?;
            let group = r.varint()?;
            let object_id = if id_present { Some(r.varint()?) } else { None };
            let priority = r.u8()?;
            let extensions = if ext {
                let e = extensions(&mut r)?;
                if e.is_empty() {
                    return Err(MoqtError::ProtocolViolation("extensions present but empty"));
                }
                Some(e)
            } else {
                None
            };
            let body = if status {
                let s = ObjectStatus::from_code(r.varint()?)?;
                if s == ObjectStatus::DoesNotExist && extensions.is_some() {
                    return Err(MoqtError::ProtocolViolation(
                        "extensions on a non-existent object",
                    ));
                }
                if r.remaining() != 0 {
                    return Err(MoqtError::ProtocolViolation("bytes after a status"));
                }
                ObjectBody::Status(s)
            } else {
                ObjectBody::Payload(r.rest().to_vec())
            };
            Ok(Self {
                track_alias,
                group,
                object_id,
                priority,
                extensions,
                end_of_group: eog,
                body,
            })
        })();
        body.map_err(|e| match e {
            MoqtError::Truncated => {
                MoqtError::ProtocolViolation("datagram shorter than its fields")
            }
            e => e,
        })
    }
}
