//! Control messages on the bidirectional control stream (draft §9):
//! `Message Type (i), Message Length (16), Message Payload (..)`.

use super::codec::{
    params, put_field, put_params, put_reason, put_varint, reason, track_name, KeyValue, Location,
    Namespace, Reader,
};
use super::MoqtError;

/// The message types this implementation reads and writes.
pub mod kind {
    /// CLIENT_SETUP.
    pub const CLIENT_SETUP: u64 = 0x20;
    /// SERVER_SETUP.
    pub const SERVER_SETUP: u64 = 0x21;
    /// GOAWAY.
    pub const GOAWAY: u64 = 0x10;
    /// MAX_REQUEST_ID.
    pub const MAX_REQUEST_ID: u64 = 0x15;
    /// REQUESTS_BLOCKED.
    pub const REQUESTS_BLOCKED: u64 = 0x1A;
    /// SUBSCRIBE.
    pub const SUBSCRIBE: u64 = 0x3;
    /// SUBSCRIBE_OK.
    pub const SUBSCRIBE_OK: u64 = 0x4;
    /// SUBSCRIBE_ERROR.
    pub const SUBSCRIBE_ERROR: u64 = 0x5;
    /// UNSUBSCRIBE.
    pub const UNSUBSCRIBE: u64 = 0xA;
    /// PUBLISH_DONE.
    pub const PUBLISH_DONE: u64 = 0xB;
    /// PUBLISH_NAMESPACE.
    pub const PUBLISH_NAMESPACE: u64 = 0x6;
    /// PUBLISH_NAMESPACE_OK.
    pub const PUBLISH_NAMESPACE_OK: u64 = 0x7;
    /// PUBLISH_NAMESPACE_ERROR.
    pub const PUBLISH_NAMESPACE_ERROR: u64 = 0x8;
    /// PUBLISH_NAMESPACE_DONE.
    pub const PUBLISH_NAMESPACE_DONE: u64 = 0x9;
    /// SUBSCRIBE_NAMESPACE.
    pub const SUBSCRIBE_NAMESPACE: u64 = 0x11;
    /// SUBSCRIBE_NAMESPACE_OK.
    pub const SUBSCRIBE_NAMESPACE_OK: u64 = 0x12;
    /// SUBSCRIBE_NAMESPACE_ERROR.
    pub const SUBSCRIBE_NAMESPACE_ERROR: u64 = 0x13;
    /// UNSUBSCRIBE_NAMESPACE.
    pub const UNSUBSCRIBE_NAMESPACE: u64 = 0x14;

    /// Types the draft defines that this implementation does not serve (FETCH, PUBLISH,
    /// TRACK_STATUS, SUBSCRIBE_UPDATE and their answers, PUBLISH_NAMESPACE_CANCEL): read as
    /// [`super::Control::Unsupported`] so the session can refuse them by name.
    pub const DEFINED_UNSUPPORTED: [u64; 11] =
        [0x2, 0xC, 0xD, 0xE, 0xF, 0x16, 0x17, 0x18, 0x19, 0x1D, 0x1E];
}

/// The draft-14 version number: 0xff000000 + 14.
pub const DRAFT_14: u64 = 0xff00_000e;

/// A SUBSCRIBE filter.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Filter {
    /// 0x1: from the start of the next group.
    NextGroupStart,
    /// 0x2: from the object after the largest.
    LargestObject,
    /// 0x3: from `start`, open ended.
    AbsoluteStart(Location),
    /// 0x4: from `start` to the end of `end_group`.
    AbsoluteRange(Location, u64),
}

/// One control message.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Control {
    /// CLIENT_SETUP.
    ClientSetup {
        /// Versions offered.
        versions: Vec<u64>,
        /// Setup parameters.
        params: Vec<KeyValue>,
    },
    /// SERVER_SETUP.
    ServerSetup {
        /// Version selected.
        version: u64,
        /// Setup parameters.
        params: Vec<KeyValue>,
    },
    /// GOAWAY.
    Goaway {
        /// Where to reconnect (empty: the same URI).
        uri: Vec<u8>,
    },
    /// MAX_REQUEST_ID.
    MaxRequestId {
        /// The new maximum request id plus one.
        request_id: u64,
    },
    /// REQUESTS_BLOCKED.
    RequestsBlocked {
        /// The maximum request id that blocked.
        max: u64,
    },
    /// SUBSCRIBE.
    Subscribe {
        /// Request id.
        request_id: u64,
        /// Track namespace.
        namespace: Namespace,
        /// Track name.
        name: Vec<u8>,
        /// Subscriber priority.
        priority: u8,
        /// Group order (0 publisher's, 1 ascending, 2 descending).
        group_order: u8,
        /// Forward objects (1) or not (0).
        forward: u8,
        /// Filter.
        filter: Filter,
        /// Parameters.
        params: Vec<KeyValue>,
    },
    /// SUBSCRIBE_OK.
    SubscribeOk {
        /// Request id answered.
        request_id: u64,
        /// Track alias for data.
        track_alias: u64,
        /// Expiry in ms (0: none).
        expires: u64,
        /// Group order (1 or 2).
        group_order: u8,
        /// Largest location, if content exists.
        largest: Option<Location>,
        /// Parameters.
        params: Vec<KeyValue>,
    },
    /// SUBSCRIBE_ERROR.
    SubscribeError {
        /// Request id answered.
        request_id: u64,
        /// Error code.
        code: u64,
        /// Reason phrase.
        reason: String,
    },
    /// UNSUBSCRIBE.
    Unsubscribe {
        /// The subscription's request id.
        request_id: u64,
    },
    /// PUBLISH_DONE.
    PublishDone {
        /// The subscription's request id.
        request_id: u64,
        /// Status code.
        status: u64,
        /// Data streams opened for the subscription.
        stream_count: u64,
        /// Reason phrase.
        reason: String,
    },
    /// PUBLISH_NAMESPACE.
    PublishNamespace {
        /// Request id.
        request_id: u64,
        /// Namespace.
        namespace: Namespace,
        /// Parameters.
        params: Vec<KeyValue>,
    },
    /// PUBLISH_NAMESPACE_OK.
    PublishNamespaceOk {
        /// Request id answered.
        request_id: u64,
    },
    /// PUBLISH_NAMESPACE_ERROR.
    PublishNamespaceError {
        /// Request id answered.
        request_id: u64,
        /// Error code.
        code: u64,
        /// Reason phrase.
        reason: String,
    },
    /// PUBLISH_NAMESPACE_DONE.
    PublishNamespaceDone {
        /// Namespace.
        namespace: Namespace,
    },
    /// SUBSCRIBE_NAMESPACE.
    SubscribeNamespace {
        /// Request id.
        request_id: u64,
        /// Namespace prefix.
        prefix: Namespace,
        /// Parameters.
        params: Vec<KeyValue>,
    },
    /// SUBSCRIBE_NAMESPACE_OK.
    SubscribeNamespaceOk {
        /// Request id answered.
        request_id: u64,
    },
    /// SUBSCRIBE_NAMESPACE_ERROR.
    SubscribeNamespaceError {
        /// Request id answered.
        request_id: u64,
        /// Error code.
        code: u64,
        /// Reason phrase.
        reason: String,
    },
    /// UNSUBSCRIBE_NAMESPACE.
    UnsubscribeNamespace {
        /// Namespace prefix.
        prefix: Namespace,
    },
    /// A message type the draft defines but this implementation does not serve.
    Unsupported {
        /// Its type.
        kind: u64,
        /// Its payload, unparsed.
        payload: Vec<u8>,
    },
}

impl Control {
    /// The message type.
    pub fn kind(&self) -> u64 {
        use kind::*;
        match self {
            Control::ClientSetup { .. } => CLIENT_SETUP,
            Control::ServerSetup { .. } => SERVER_SETUP,
            Control::Goaway { .. } => GOAWAY,
            Control::MaxRequestId { .. } => MAX_REQUEST_ID,
            Control::RequestsBlocked { .. } => REQUESTS_BLOCKED,
            Control::Subscribe { .. } => SUBSCRIBE,
            Control::SubscribeOk { .. } => SUBSCRIBE_OK,
            Control::SubscribeError { .. } => SUBSCRIBE_ERROR,
            Control::Unsubscribe { .. } => UNSUBSCRIBE,
            Control::PublishDone { .. } => PUBLISH_DONE,
            Control::PublishNamespace { .. } => PUBLISH_NAMESPACE,
            Control::PublishNamespaceOk { .. } => PUBLISH_NAMESPACE_OK,
            Control::PublishNamespaceError { .. } => PUBLISH_NAMESPACE_ERROR,
            Control::PublishNamespaceDone { .. } => PUBLISH_NAMESPACE_DONE,
            Control::SubscribeNamespace { .. } => SUBSCRIBE_NAMESPACE,
            Control::SubscribeNamespaceOk { .. } => SUBSCRIBE_NAMESPACE_OK,
            Control::SubscribeNamespaceError { .. } => SUBSCRIBE_NAMESPACE_ERROR,
            Control::UnsubscribeNamespace { .. } => UNSUBSCRIBE_NAMESPACE,
            Control::Unsupported { kind, .. } => *kind,
        }
    }

    /// Appends the framed message: type, 16-bit length, payload.
    ///
    /// # Panics
    /// If the payload exceeds 65,535 bytes: the caller built an oversized message.
    pub fn encode(&self, out: &mut Vec<u8>) {
        let mut p = Vec::new();
        self.encode_payload(&mut p);
        let len = u16::try_from(p.len()).expect("control message payload over 65535 bytes");
        put_varint(out, self.kind());
        out.extend_from_slice(&len.to_be_bytes());
        out.extend_from_slice(&p);
    }

    fn encode_payload(&self, p: &mut Vec<u8>) {
        match self {
            Control::ClientSetup { versions, params } => {
                put_varint(p, versions.len() as u64);
                versions.iter().for_each(|v| put_varint(p, *v));
                put_params(p, params);
            }
            Control::ServerSetup { version, params } => {
                put_varint(p, *version);
                put_params(p, params);
            }
            Control::Goaway { uri } => put_field(p, uri),
            Control::MaxRequestId { request_id } => put_varint(p, *request_id),
            Control::RequestsBlocked { max } => put_varint(p, *max),
            Control::Subscribe {
                request_id,
                namespace,
                name,
                priority,
                group_order,
                forward,
                filter,
                params,
            } => {
                put_varint(p, *request_id);
                namespace.encode(p);
                put_field(p, name);
                p.extend_from_slice(&[*priority, *group_order, *forward]);
                match filter {
                    Filter::NextGroupStart => put_varint(p, 0x1),
                    Filter::LargestObject => put_varint(p, 0x2),
                    Filter::AbsoluteStart(start) => {
                        put_varint(p, 0x3);
                        start.encode(p);
                    }
                    Filter::AbsoluteRange(start, end) => {
                        put_varint(p, 0x4);
                        start.encode(p);
                        put_varint(p, *end);
                    }
                }
                put_params(p, params);
            }
            Control::SubscribeOk {
                request_id,
                track_alias,
                expires,
                group_order,
                largest,
                params,
            } => {
                put_varint(p, *request_id);
                put_varint(p, *track_alias);
                put_varint(p, *expires);
                p.push(*group_order);
                match largest {
                    Some(l) => {
                        p.push(1);
                        l.encode(p);
                    }
                    None => p.push(0),
                }
                put_params(p, params);
            }
            Control::SubscribeError {
                request_id,
                code,
                reason,
            }
            | Control::PublishNamespaceError {
                request_id,
                code,
                reason,
            }
            | Control::SubscribeNamespaceError {
                request_id,
                code,
                reason,
            } => {
                put_varint(p, *request_id);
                put_varint(p, *code);
                put_reason(p, reason);
            }
            Control::Unsubscribe { request_id }
            | Control::PublishNamespaceOk { request_id }
            | Control::SubscribeNamespaceOk { request_id } => put_varint(p, *request_id),
            Control::PublishDone {
                request_id,
                status,
                stream_count,
                reason,
            } => {
                put_varint(p, *request_id);
                put_varint(p, *status);
                put_varint(p, *stream_count);
                put_reason(p, reason);
            }
            Control::PublishNamespace {
                request_id,
                namespace,
                params,
            }
            | Control::SubscribeNamespace {
                request_id,
                prefix: namespace,
                params,
            } => {
                put_varint(p, *request_id);
                namespace.encode(p);
                put_params(p, params);
            }
            Control::PublishNamespaceDone { namespace }
            | Control::UnsubscribeNamespace { prefix: namespace } => namespace.encode(p),
            Control::Unsupported { payload, .. } => p.extend_from_slice(payload),
        }
    }

    /// Reads one framed message from the front of `buf`. `Ok(None)`: not all of it has
    /// arrived yet. `Ok(Some((message, used)))`: `used` bytes were consumed.
    pub fn decode(buf: &[u8]) -> Result<Option<(Control, usize)>, MoqtError> {
        let mut r = Reader::new(buf);
        let header = (|| Ok::<_, MoqtError>((r.varint()?, r.u16()?)))();
        let (kind, len) = match header {
            Ok(h) => h,
            Err(MoqtError::Truncated) => return Ok(None),
            Err(e) => return Err(e),
        };
        let payload = match r.bytes(usize::from(len)) {
            Ok(p) => p,
            Err(MoqtError::Truncated) => return Ok(None),
            Err(e) => return Err(e),
        };
        let used = r.position();
        let msg = Self::decode_payload(kind, payload)?;
        Ok(Some((msg, used)))
    }

    fn decode_payload(k: u64, payload: &[u8]) -> Result<Control, MoqtError> {
        use kind::*;
        let mut r = Reader::new(payload);
        let r = &mut r;
        // Inside a complete payload, running out of bytes means the length lied.
        let body = (|| -> Result<Control, MoqtError> {
            Ok(match k {
                CLIENT_SETUP => {
                    let n = r.length(r.remaining(), "version count beyond the message")?;
                    let versions = (0..n).map(|_| r.varint()).collect::<Result<_, _>>()?;
                    Control::ClientSetup {
                        versions,
                        params: params(r)?,
                    }
                }
                SERVER_SETUP => Control::ServerSetup {
                    version: r.varint()?,
                    params: params(r)?,
                },
                GOAWAY => Control::Goaway {
                    uri: r.field(8192, "GOAWAY URI over 8192 bytes")?.to_vec(),
                },
                MAX_REQUEST_ID => Control::MaxRequestId {
                    request_id: r.varint()?,
                },
                REQUESTS_BLOCKED => Control::RequestsBlocked { max: r.varint()? },
                SUBSCRIBE => {
                    let request_id = r.varint()?;
                    let namespace = Namespace::decode(r)?;
                    let name = track_name(r, &namespace)?;
                    let (priority, group_order, forward) = (r.u8()?, r.u8()?, r.u8()?);
                    if group_order > 2 {
                        return Err(MoqtError::ProtocolViolation("group order above 2"));
                    }
                    if forward > 1 {
                        return Err(MoqtError::ProtocolViolation("forward is neither 0 nor 1"));
                    }
                    let filter = match r.varint()? {
                        0x1 => Filter::NextGroupStart,
                        0x2 => Filter::LargestObject,
                        0x3 => Filter::AbsoluteStart(Location::decode(r)?),
                        0x4 => {
                            let start = Location::decode(r)?;
                            let end = r.varint()?;
                            if end < start.group {
                                return Err(MoqtError::ProtocolViolation("end group before start"));
                            }
                            Filter::AbsoluteRange(start, end)
                        }
                        _ => return Err(MoqtError::ProtocolViolation("unknown filter type")),
                    };
                    Control::Subscribe {
                        request_id,
                        namespace,
                        name,
                        priority,
                        group_order,
                        forward,
                        filter,
                        params: params(r)?,
                    }
                }
                SUBSCRIBE_OK => {
                    let request_id = r.varint()?;
                    let track_alias = r.varint()?;
                    let expires = r.varint()?;
                    let group_order = r.u8()?;
                    if !(1..=2).contains(&group_order) {
                        return Err(MoqtError::ProtocolViolation(
                            "SUBSCRIBE_OK group order not 1 or 2",
                        ));
                    }
                    let largest = match r.u8()? {
                        0 => None,
                        1 => Some(Location::decode(r)?),
                        _ => {
                            return Err(MoqtError::ProtocolViolation(
                                "content exists is neither 0 nor 1",
                            ))
                        }
                    };
                    Control::SubscribeOk {
                        request_id,
                        track_alias,
                        expires,
                        group_order,
                        largest,
                        params: params(r)?,
                    }
                }
                SUBSCRIBE_ERROR | PUBLISH_NAMESPACE_ERROR | SUBSCRIBE_NAMESPACE_ERROR => {
                    let (request_id, code, reason) = (r.varint()?, r.varint()?, reason(r)?);
                    match k {
                        SUBSCRIBE_ERROR => Control::SubscribeError {
                            request_id,
                            code,
                            reason,
                        },
                        PUBLISH_NAMESPACE_ERROR => Control::PublishNamespaceError {
                            request_id,
                            code,
                            reason,
                        },
                        _ => Control::SubscribeNamespaceError {
                            request_id,
                            code,
                            reason,
                        },
                    }
                }
                UNSUBSCRIBE => Control::Unsubscribe {
                    request_id: r.varint()?,
                },
                PUBLISH_NAMESPACE_OK => Control::PublishNamespaceOk {
                    request_id: r.varint()?,
                },
                SUBSCRIBE_NAMESPACE_OK => Control::SubscribeNamespaceOk {
                    request_id: r.varint()?,
                },
                PUBLISH_DONE => Control::PublishDone {
                    request_id: r.varint()?,
                    status: r.varint()?,
                    stream_count: r.varint()?,
                    reason: reason(r)?,
                },
                PUBLISH_NAMESPACE => Control::PublishNamespace {
                    request_id: r.varint()?,
                    namespace: Namespace::decode(r)?,
                    params: params(r)?,
                },
                SUBSCRIBE_NAMESPACE => Control::SubscribeNamespace {
                    request_id: r.varint()?,
                    prefix: Namespace::decode(r)?,
                    params: params(r)?,
                },
                PUBLISH_NAMESPACE_DONE => Control::PublishNamespaceDone {
                    namespace: Namespace::decode(r)?,
                },
                UNSUBSCRIBE_NAMESPACE => Control::UnsubscribeNamespace {
                    prefix: Namespace::decode(r)?,
                },
                k if DEFINED_UNSUPPORTED.contains(&k) => Control::Unsupported {
                    kind: k,
                    payload: r.rest().to_vec(),
                },
                k => return Err(MoqtError::UnknownMessage(k)),
            })
        })()
        .map_err(|e| match e {
            MoqtError::Truncated => MoqtError::ProtocolViolation("message shorter than its fields"),
            e => e,
        })?;
        if r.remaining() != 0 {
            return Err(MoqtError::ProtocolViolation(
                "message longer than its fields",
            ));
        }
        Ok(body)
    }
}
