//! What a direct [`Session`](crate::Session) and a [`RelaySession`](crate::RelaySession)
//! share below their control messages: sending one group of objects (as OBJECT_DATAGRAMs or on
//! one subgroup stream), taking objects from incoming subgroup streams and datagrams, waiting
//! for a track alias whose SUBSCRIBE_OK an object overtook, the control stream's read loop and
//! writes, and request-id flow control.

use std::future::Future;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use abhyasa_wire::moqt::{
    Control, MoqtError, ObjectBody, ObjectDatagram, StreamObject, SubgroupHeader, SubgroupId,
};
use abhyasa_wire::AgentId;
use tokio::sync::{mpsc, Notify};

use crate::setup::{close_with, read_control, SendError, MAX_STREAM_BYTES};

/// How long an object of an unknown track alias waits for a pending SUBSCRIBE_OK.
pub(crate) const ALIAS_WAIT: Duration = Duration::from_secs(1);

/// Whether every payload fits one datagram on `conn`'s path (with the object header).
pub(crate) fn fit_datagrams(conn: &quinn::Connection, payloads: &[Vec<u8>]) -> bool {
    let limit = conn.max_datagram_size();
    payloads
        .iter()
        .all(|p| limit.is_some_and(|l| p.len() + 24 <= l))
}

/// How the datagrams of one send are grouped.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Grouping {
    /// One group, object ids 0, 1, …; the last ends the group.
    OneGroup,
    /// A group of its own for each object (group, group + 1, …), as a relay that caches by
    /// group forwards each datagram whole.
    GroupEach,
}

/// Sends `payloads` on track `alias` as OBJECT_DATAGRAMs starting at `group`.
pub(crate) fn send_datagrams(
    conn: &quinn::Connection,
    alias: u64,
    group: u64,
    payloads: &[Vec<u8>],
    grouping: Grouping,
) -> Result<(), SendError> {
    for (i, p) in payloads.iter().enumerate() {
        let (group, object_id, end_of_group) = match grouping {
            Grouping::OneGroup => (group, (i > 0).then_some(i as u64), i + 1 == payloads.len()),
            Grouping::GroupEach => (group + i as u64, None, true),
        };
        let d = ObjectDatagram {
            track_alias: alias,
            group,
            object_id,
            priority: 0,
            extensions: None,
            end_of_group,
            body: ObjectBody::Payload(p.clone()),
        };
        conn.send_datagram(d.encode().into())
            .map_err(|e| SendError::Closed(e.to_string()))?;
    }
    Ok(())
}

/// Sends `payloads` on track `alias` as group `group` on one subgroup stream (subgroup 0, end
/// of group), calling `opened` once the stream is open.
pub(crate) async fn send_subgroup(
    conn: &quinn::Connection,
    alias: u64,
    group: u64,
    payloads: &[Vec<u8>],
    opened: impl FnOnce(),
) -> Result<(), SendError> {
    let mut out = Vec::new();
    SubgroupHeader {
        track_alias: alias,
        group,
        subgroup: SubgroupId::Zero,
        priority: 0,
        extensions: false,
        end_of_group: true,
    }
    .encode(&mut out);
    for p in payloads {
        StreamObject {
            object_id_delta: 0,
            extensions: vec![],
            body: ObjectBody::Payload(p.clone()),
        }
        .encode(false, &mut out);
    }
    let closed = |e: &dyn std::fmt::Display| SendError::Closed(e.to_string());
    let mut stream = conn.open_uni().await.map_err(|e| closed(&e))?;
    opened();
    stream.write_all(&out).await.map_err(|e| closed(&e))?;
    stream.finish().map_err(|e| closed(&e))?;
    Ok(())
}

/// What a track alias names right now.
pub(crate) enum Lookup<T> {
    /// It is granted.
    Known(T),
    /// Not (yet): a subscription of ours awaits its answer, which may grant it.
    Pending,
    /// Not, and nothing pending could make it so.
    Unknown,
}

/// Resolves an alias with `lookup`, waiting on `answered` while it is [`Lookup::Pending`], up
/// to [`ALIAS_WAIT`]. Objects may overtake the SUBSCRIBE_OK that grants their alias
/// (draft-14 §10.2, §10.4.2: the receiver "MAY ... buffer it for a brief period").
pub(crate) async fn resolve_alias<T>(
    answered: &tokio::sync::Notify,
    mut lookup: impl FnMut() -> Lookup<T>,
) -> Option<T> {
    let deadline = tokio::time::Instant::now() + ALIAS_WAIT;
    loop {
        let notified = answered.notified();
        tokio::pin!(notified);
        // Registered before the check: an answer between the check and the wait wakes it.
        notified.as_mut().enable();
        match lookup() {
            Lookup::Known(t) => return Some(t),
            Lookup::Unknown => return None,
            Lookup::Pending => {}
        }
        if tokio::time::timeout_at(deadline, notified).await.is_err() {
            return None;
        }
    }
}

/// A session's receiving side, for [`streams_loop`] and [`datagrams_loop`].
pub(crate) trait Inbound: Sync {
    /// What an alias resolves to.
    type Target: Send + Sync;
    /// What the session's owner is told of an object.
    type Event: Send;
    /// The connection.
    fn conn(&self) -> &quinn::Connection;
    /// Who is at the other end (for logs).
    fn remote(&self) -> &AgentId;
    /// Objects taken from one subgroup stream; the rest of the stream is ignored.
    fn max_objects_per_group(&self) -> usize;
    /// What `alias` names, waiting briefly when an answer is pending ([`resolve_alias`]).
    fn resolve(&self, alias: u64) -> impl Future<Output = Option<Self::Target>> + Send;
    /// The event for one object's payload on `target`.
    fn event(&self, target: &Self::Target, payload: Vec<u8>) -> Self::Event;
}

/// How long an incoming subgroup stream may take from its opening to its end. A sender writes
/// a group whole and finishes it at once; a stream still open after this is stopped
/// (STOP_SENDING) and what it held is let go, so a peer that never finishes its streams holds
/// neither memory nor the objects behind them.
pub(crate) const STREAM_DEADLINE: Duration = Duration::from_secs(10);

/// Bytes one session may hold of subgroup streams not yet ended, read off the connection. A
/// stream that needs more when this is full stops the oldest unended stream of the session
/// (an honest sender finishes its streams at once, so the oldest is the one that stalls). With
/// QUIC's connection receive window ([`crate::endpoint::CONNECTION_RECEIVE_WINDOW`]) this
/// bounds what one peer makes us buffer, and a stalled stream delays nothing behind it.
pub(crate) const SESSION_STREAM_BYTES: usize = 8 << 20;

/// Takes every incoming subgroup stream until the connection ends, each read on its own task:
/// a stream that stalls delays no other. A malformed stream closes the session with the
/// draft's error code; a reset one, one past [`STREAM_DEADLINE`], or one stopped for room
/// loses only itself.
pub(crate) async fn streams_loop<I>(inbound: I, events: mpsc::Sender<I::Event>)
where
    I: Inbound + Clone + Send + 'static,
    I::Event: 'static,
{
    let room = Arc::new(Mutex::new(Room::default()));
    let mut next = 0u64;
    while let Ok(recv) = inbound.conn().accept_uni().await {
        let (inbound, events) = (inbound.clone(), events.clone());
        let held = Held::open(&room, next);
        next += 1;
        tokio::spawn(async move {
            let deadline = tokio::time::Instant::now() + STREAM_DEADLINE;
            let Some(bytes) = read_stream(recv, &held, deadline, inbound.remote()).await else {
                return;
            };
            // Ended: its bytes are no longer an unended stream's.
            drop(held);
            if let Err(e) = take_stream(&inbound, &bytes, &events).await {
                close_with(inbound.conn(), &e);
            }
        });
    }
}

/// What a session's unended streams hold.
#[derive(Default)]
struct Room {
    /// Bytes held, at most [`SESSION_STREAM_BYTES`].
    used: usize,
    /// Unended streams by arrival: bytes held, and how to stop it.
    open: std::collections::BTreeMap<u64, (usize, Arc<Notify>)>,
}

/// One unended stream's place in its session's [`Room`]; leaving it (dropped) lets its bytes go.
struct Held {
    room: Arc<Mutex<Room>>,
    seq: u64,
    stop: Arc<Notify>,
}

impl Held {
    fn open(room: &Arc<Mutex<Room>>, seq: u64) -> Self {
        let stop = Arc::new(Notify::new());
        lock(room).open.insert(seq, (0, stop.clone()));
        Self {
            room: room.clone(),
            seq,
            stop,
        }
    }

    /// Counts `n` more bytes for this stream, stopping the oldest other unended streams until
    /// they fit; `false` if this stream was itself stopped for room.
    fn take(&self, n: usize) -> bool {
        let mut room = lock(&self.room);
        if !room.open.contains_key(&self.seq) {
            return false;
        }
        while room.used + n > SESSION_STREAM_BYTES {
            let Some(oldest) = room.open.keys().copied().find(|&s| s != self.seq) else {
                break;
            };
            if let Some((bytes, stop)) = room.open.remove(&oldest) {
                room.used -= bytes;
                stop.notify_one();
            }
        }
        room.used += n;
        if let Some((bytes, _)) = room.open.get_mut(&self.seq) {
            *bytes += n;
        }
        true
    }
}

impl Drop for Held {
    fn drop(&mut self) {
        let mut room = lock(&self.room);
        if let Some((bytes, _)) = room.open.remove(&self.seq) {
            room.used -= bytes;
        }
    }
}

fn lock(room: &Mutex<Room>) -> std::sync::MutexGuard<'_, Room> {
    room.lock().unwrap_or_else(|e| e.into_inner())
}

/// Reads one stream to its end within `deadline`, counting what it reads in its session's
/// room; `None` (the stream stopped) if it is reset, runs past [`MAX_STREAM_BYTES`] or the
/// deadline, or is stopped for room.
async fn read_stream(
    mut recv: quinn::RecvStream,
    held: &Held,
    deadline: tokio::time::Instant,
    peer: &AgentId,
) -> Option<Vec<u8>> {
    let mut bytes = Vec::new();
    let read = async {
        loop {
            let chunk = tokio::select! {
                c = recv.read_chunk(64 << 10, true) => c,
                () = held.stop.notified() => return Some(Err("the oldest unended when the session's room ran out")),
            };
            let Some(chunk) = chunk.ok()? else {
                return Some(Ok(()));
            };
            if bytes.len() + chunk.bytes.len() > MAX_STREAM_BYTES {
                return Some(Err("longer than the stream limit"));
            }
            if !held.take(chunk.bytes.len()) {
                return Some(Err("the oldest unended when the session's room ran out"));
            }
            bytes.extend_from_slice(&chunk.bytes);
        }
    };
    let why = match tokio::time::timeout_at(deadline, read).await {
        Ok(Some(Ok(()))) => return Some(bytes),
        Ok(None) => return None,
        Ok(Some(Err(why))) => why,
        Err(_) => "not ended by its deadline",
    };
    tracing::warn!(
        %peer,
        read = bytes.len(),
        stream_limit = MAX_STREAM_BYTES,
        session_room = SESSION_STREAM_BYTES,
        deadline_ms = STREAM_DEADLINE.as_millis() as u64,
        "subgroup stream stopped: {why}"
    );
    let _ = recv.stop(STOP_CODE.into());
    None
}

/// The STOP_SENDING code for a stream stopped here (0: nothing asked of the sender but to
/// stop; the draft defines no stream-level error for it).
const STOP_CODE: u32 = 0;

async fn take_stream<I: Inbound>(
    inbound: &I,
    bytes: &[u8],
    events: &mpsc::Sender<I::Event>,
) -> Result<(), MoqtError> {
    let Some((header, mut at)) = SubgroupHeader::decode(bytes)? else {
        return Err(MoqtError::ProtocolViolation(
            "stream ended inside its header",
        ));
    };
    let target = inbound.resolve(header.track_alias).await;
    let limit = inbound.max_objects_per_group();
    let mut taken = 0usize;
    while at < bytes.len() {
        if taken == limit {
            tracing::warn!(
                peer = %inbound.remote(),
                limit,
                ignored_bytes = bytes.len() - at,
                "objects per group limit: the rest of the group is ignored"
            );
            break;
        }
        taken += 1;
        let Some((object, used)) = StreamObject::decode(&bytes[at..], header.extensions)? else {
            return Err(MoqtError::ProtocolViolation(
                "stream ended inside an object",
            ));
        };
        at += used;
        if let (Some(target), ObjectBody::Payload(payload)) = (&target, object.body) {
            let _ = events.send(inbound.event(target, payload)).await;
        }
    }
    Ok(())
}

/// Takes every incoming datagram until the connection ends; a malformed one closes the
/// session with the draft's error code.
pub(crate) async fn datagrams_loop<I: Inbound>(inbound: &I, events: &mpsc::Sender<I::Event>) {
    while let Ok(d) = inbound.conn().read_datagram().await {
        match ObjectDatagram::decode(&d) {
            Ok(d) => {
                let target = inbound.resolve(d.track_alias).await;
                if let (Some(target), ObjectBody::Payload(payload)) = (target, d.body) {
                    let _ = events.send(inbound.event(&target, payload)).await;
                }
            }
            Err(e) => {
                close_with(inbound.conn(), &e);
                return;
            }
        }
    }
}

/// Writes one control message on the session's control stream.
pub(crate) async fn write_control(
    control: &tokio::sync::Mutex<quinn::SendStream>,
    msg: Control,
) -> Result<(), String> {
    let mut out = Vec::new();
    msg.encode(&mut out);
    control
        .lock()
        .await
        .write_all(&out)
        .await
        .map_err(|e| e.to_string())
}

/// Reads control messages until the stream or the session ends, handing each to `handle`;
/// returns why it ended. A message that does not parse, or that `handle` refuses, closes the
/// session with the draft's error code; a stream that ends closes it with NO_ERROR, unless the
/// connection already closed (by the peer, or by a limit here), whose reason is kept.
pub(crate) async fn control_loop<F, Fut>(
    conn: &quinn::Connection,
    mut recv: quinn::RecvStream,
    mut buf: Vec<u8>,
    mut handle: F,
) -> String
where
    F: FnMut(Control) -> Fut,
    Fut: Future<Output = Result<(), MoqtError>>,
{
    loop {
        let msg = match read_control(&mut recv, &mut buf).await {
            Ok(Some(m)) => m,
            Ok(None) => {
                if let Some(reason) = conn.close_reason() {
                    return format!("closed: {reason}");
                }
                conn.close(0u32.into(), b"control stream ended");
                return "control stream ended".into();
            }
            Err(e) => {
                close_with(conn, &e);
                return format!("closed: {e}");
            }
        };
        if let Err(e) = handle(msg).await {
            close_with(conn, &e);
            return format!("closed: {e}");
        }
    }
}

/// Our side of request-id flow control (draft-14 §9.1): ids step by two from our parity and
/// must stay below the peer's Maximum Request ID; a request past it waits, and
/// REQUESTS_BLOCKED is reported once per maximum.
#[derive(Debug)]
pub(crate) struct RequestFlow<R> {
    next: u64,
    peer_max: u64,
    blocked: Vec<R>,
    reported: bool,
}

/// A request either side makes of the other: its own namespace published, a namespace prefix
/// subscribed (of a relay), a track of a peer's subscribed.
#[derive(Clone, Debug)]
pub(crate) enum Request {
    PublishNamespace,
    /// SUBSCRIBE_NAMESPACE of this prefix.
    SubscribeNamespace(abhyasa_wire::moqt::Namespace),
    /// SUBSCRIBE to this peer's track (named for us: its custody track toward `me`).
    Subscribe(AgentId, crate::Track),
}

impl Request {
    /// The control message that makes this request under `request_id`, from `me`.
    fn message(&self, me: &AgentId, request_id: u64) -> Control {
        match self {
            Request::PublishNamespace => Control::PublishNamespace {
                request_id,
                namespace: crate::namespace(me),
                params: vec![],
            },
            Request::SubscribeNamespace(prefix) => Control::SubscribeNamespace {
                request_id,
                prefix: prefix.clone(),
                params: vec![],
            },
            Request::Subscribe(peer, track) => Control::Subscribe {
                request_id,
                namespace: crate::namespace(peer),
                name: track.name(me),
                priority: 0,
                group_order: 1,
                forward: 1,
                filter: abhyasa_wire::moqt::Filter::LargestObject,
                params: vec![],
            },
        }
    }
}

/// Sends `req` as [`RequestFlow::take`] decided: under its request id, or — the first time a
/// request waits on the peer's Maximum Request ID — as REQUESTS_BLOCKED.
pub(crate) async fn send_request(
    control: &tokio::sync::Mutex<quinn::SendStream>,
    me: &AgentId,
    taken: Take,
    req: &Request,
) -> Result<(), String> {
    let msg = match taken {
        Take::Send(id) => req.message(me, id),
        Take::Blocked(None) => return Ok(()),
        Take::Blocked(Some(max)) => Control::RequestsBlocked { max },
    };
    write_control(control, msg).await
}

/// What to do with one request.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Take {
    /// Send it now with this request id.
    Send(u64),
    /// It waits; send REQUESTS_BLOCKED with this maximum (the first to wait on it).
    Blocked(Option<u64>),
}

impl<R> RequestFlow<R> {
    /// Ids from `first` (our parity), below the peer's `peer_max`.
    pub(crate) fn new(first: u64, peer_max: u64) -> Self {
        Self {
            next: first,
            peer_max,
            blocked: Vec::new(),
            reported: false,
        }
    }

    /// An id for `req` if the peer's maximum allows, else queues it.
    pub(crate) fn take(&mut self, req: R) -> Take {
        if self.next < self.peer_max {
            let id = self.next;
            self.next += 2;
            Take::Send(id)
        } else {
            self.blocked.push(req);
            let first = !self.reported;
            self.reported = true;
            Take::Blocked(first.then_some(self.peer_max))
        }
    }

    /// The peer raised its maximum to `max` (MAX_REQUEST_ID): the requests that waited, to
    /// take again. A maximum that does not increase is a protocol violation.
    pub(crate) fn raise(&mut self, max: u64) -> Result<Vec<R>, MoqtError> {
        if max <= self.peer_max {
            return Err(MoqtError::ProtocolViolation(
                "MAX_REQUEST_ID did not increase",
            ));
        }
        self.peer_max = max;
        self.reported = false;
        Ok(std::mem::take(&mut self.blocked))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn requests_wait_past_the_peers_maximum_and_go_when_it_rises() {
        // A client (even ids) allowed ids below 4: two requests go, the third and fourth wait,
        // and REQUESTS_BLOCKED is reported once for that maximum.
        let mut flow = RequestFlow::new(0, 4);
        assert_eq!(flow.take("a"), Take::Send(0));
        assert_eq!(flow.take("b"), Take::Send(2));
        assert_eq!(flow.take("c"), Take::Blocked(Some(4)));
        assert_eq!(flow.take("d"), Take::Blocked(None));
        assert!(flow.raise(4).is_err(), "a maximum that does not rise");
        assert_eq!(flow.raise(6).unwrap(), ["c", "d"]);
        assert_eq!(flow.take("c"), Take::Send(4));
        assert_eq!(flow.take("d"), Take::Blocked(Some(6)));
        // A server's ids are odd.
        let mut flow = RequestFlow::new(1, 2);
        assert_eq!(flow.take(()), Take::Send(1));
        assert_eq!(flow.take(()), Take::Blocked(Some(2)));
    }
}
