//! A MOQT draft-14 session between two agents, carrying the custody track layout:
//!
//! | namespace | track | carries |
//! |---|---|---|
//! | `abhyasa`, `v1`, `<agent>` | `to/<peer>` | obligations for that peer |
//! | `abhyasa`, `v1`, `<agent>` | `acks/<peer>` | custody acks for that custodian |
//! | `abhyasa`, `v1`, `<agent>` | `ledger/<peer>` | ledger objects |
//!
//! After CLIENT_SETUP / SERVER_SETUP each side announces its namespace (PUBLISH_NAMESPACE) and
//! subscribes to the three tracks the other side addresses to it. A subscription is granted
//! only for tracks addressed to the subscriber's own agent id, which its TLS certificate
//! proved. One flush is one group; objects ride a subgroup stream (or, when asked and when
//! they fit, one OBJECT_DATAGRAM each). Malformed or unknown control messages close the
//! session with the draft's error code; other sessions are untouched.

use std::collections::HashMap;
use std::sync::Arc;

use abhyasa_wire::moqt::{Control, KeyValue, MoqtError, DRAFT_14};
use abhyasa_wire::AgentId;
use tokio::sync::{mpsc, Mutex};

use crate::dataplane::{self, Grouping, Lookup, Request, RequestFlow, Take};
use crate::endpoint::peer_agent;
use crate::setup::{check_setup, client_setup, code, read_control, SETUP_TIMEOUT};
pub use crate::setup::{namespace, SendError, SessionError, SessionEvent, SessionLimits, Track};

struct State {
    /// Tracks the peer subscribed to, with the peer's request id.
    outbound: HashMap<Track, u64>,
    /// Streams opened per outbound track (for PUBLISH_DONE).
    streams: HashMap<Track, u64>,
    /// Next group id per outbound track.
    groups: HashMap<Track, u64>,
    /// Our subscriptions: request id → track.
    requested: HashMap<u64, Track>,
    /// Track aliases the peer granted us → track.
    inbound: HashMap<u64, Track>,
    /// Our request ids, within the peer's Maximum Request ID.
    flow: RequestFlow<Request>,
    /// The peer's next expected request id.
    peer_next_request: u64,
    /// Whether the peer sent GOAWAY.
    goaway: bool,
    /// The Maximum Request ID we granted the peer.
    our_max_request: u64,
}

struct Inner {
    me: AgentId,
    peer: AgentId,
    limits: SessionLimits,
    conn: quinn::Connection,
    control: Mutex<quinn::SendStream>,
    state: std::sync::Mutex<State>,
    /// Woken when the peer answers one of our subscriptions (a track alias may now be known).
    answered: tokio::sync::Notify,
}

/// What an accepted connection turned out to be.
#[derive(Debug)]
pub enum Accepted {
    /// A custody session (the `abhyasa` namespaces and tracks).
    Custody(Session, mpsc::Receiver<SessionEvent>),
    /// A binding's session: the CLIENT_SETUP carried a PATH (see [`crate::binding`]).
    Bound(crate::binding::BoundConnection),
}

/// A live session. Cheap to clone.
#[derive(Clone)]
pub struct Session(Arc<Inner>);

impl std::fmt::Debug for Session {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Session")
            .field("me", &self.0.me)
            .field("peer", &self.0.peer)
            .finish_non_exhaustive()
    }
}

impl Session {
    /// Dials `addr`, requires the server to be `expected`, and sets the session up as client.
    pub async fn connect(
        endpoint: &quinn::Endpoint,
        addr: std::net::SocketAddr,
        expected: &AgentId,
        me: &AgentId,
    ) -> Result<(Session, mpsc::Receiver<SessionEvent>), SessionError> {
        Self::connect_with(endpoint, addr, expected, me, SessionLimits::default()).await
    }

    /// [`Session::connect`], holding the peer to `limits`.
    pub async fn connect_with(
        endpoint: &quinn::Endpoint,
        addr: std::net::SocketAddr,
        expected: &AgentId,
        me: &AgentId,
        limits: SessionLimits,
    ) -> Result<(Session, mpsc::Receiver<SessionEvent>), SessionError> {
        let setup = client_setup(
            endpoint,
            addr,
            expected,
            None,
            limits.max_request_id(),
            None,
            &[],
        )
        .await?;
        Ok(Self::start(
            me.clone(),
            setup.peer,
            setup.conn,
            (setup.send, setup.recv, setup.buf),
            0,
            setup.peer_max,
            limits,
        ))
    }

    /// Sets up an accepted connection as server of a custody session; a binding's session
    /// (see [`Session::accept_any`]) is refused.
    pub async fn accept(
        incoming: quinn::Incoming,
        me: &AgentId,
    ) -> Result<(Session, mpsc::Receiver<SessionEvent>), SessionError> {
        match Self::accept_any(incoming, me, &crate::binding::Ports::default()).await? {
            Accepted::Custody(s, rx) => Ok((s, rx)),
            Accepted::Bound(c) => {
                c.close("this endpoint serves no binding");
                Err(SessionError::Identity(format!(
                    "a session for path {:?}, not served here",
                    String::from_utf8_lossy(c.path())
                )))
            }
        }
    }

    /// Sets up an accepted connection as server: a custody session, or a binding's session
    /// when the CLIENT_SETUP carries a PATH parameter (MCP-over-MOQT sends `/mcp`) that a
    /// binding registered in `ports`. A PATH no binding registered is refused before
    /// SERVER_SETUP, the connection closed with a reason that says so.
    pub async fn accept_any(
        incoming: quinn::Incoming,
        me: &AgentId,
        ports: &crate::binding::Ports,
    ) -> Result<Accepted, SessionError> {
        Self::accept_any_with(incoming, me, SessionLimits::default(), ports).await
    }

    /// [`Session::accept_any`], holding the peer to `limits`.
    pub async fn accept_any_with(
        incoming: quinn::Incoming,
        me: &AgentId,
        limits: SessionLimits,
        ports: &crate::binding::Ports,
    ) -> Result<Accepted, SessionError> {
        let conn = incoming.await?;
        let peer = peer_agent(&conn)
            .ok_or_else(|| SessionError::Identity("no agent id in certificate".into()))?;
        let (mut send, mut recv) = tokio::time::timeout(SETUP_TIMEOUT, conn.accept_bi())
            .await
            .map_err(|_| SessionError::Timeout)??;
        let mut buf = Vec::new();
        let first = tokio::time::timeout(SETUP_TIMEOUT, read_control(&mut recv, &mut buf))
            .await
            .map_err(|_| SessionError::Timeout)?;
        let path = match &first {
            Ok(Some(Control::ClientSetup { params, .. })) => params.iter().find_map(|p| match p {
                KeyValue::Bytes { key: 0x01, value } if !value.is_empty() => Some(value.clone()),
                _ => None,
            }),
            _ => None,
        };
        let peer_max = check_setup(&conn, first, true)?;
        if let Some(path) = path.as_deref().filter(|p| !ports.serves(p)) {
            let path = String::from_utf8_lossy(path).into_owned();
            conn.close(0u32.into(), crate::binding::NO_BINDING.as_bytes());
            return Err(SessionError::NoBinding(path));
        }
        let mut out = Vec::new();
        Control::ServerSetup {
            version: DRAFT_14,
            params: vec![KeyValue::Int {
                key: 0x02,
                value: limits.max_request_id(),
            }],
        }
        .encode(&mut out);
        send.write_all(&out)
            .await
            .map_err(|e| SessionError::Stream(e.to_string()))?;
        if let Some(path) = path {
            let c = crate::binding::BoundConnection::new(path, peer, conn, send, recv, buf);
            return Ok(Accepted::Bound(c));
        }
        let (s, rx) = Self::start(
            me.clone(),
            peer,
            conn,
            (send, recv, buf),
            1,
            peer_max,
            limits,
        );
        Ok(Accepted::Custody(s, rx))
    }

    fn start(
        me: AgentId,
        peer: AgentId,
        conn: quinn::Connection,
        control: (quinn::SendStream, quinn::RecvStream, Vec<u8>),
        parity: u64,
        peer_max: u64,
        limits: SessionLimits,
    ) -> (Session, mpsc::Receiver<SessionEvent>) {
        let (send, recv, buf) = control;
        let state = State {
            outbound: HashMap::new(),
            streams: HashMap::new(),
            groups: HashMap::new(),
            requested: HashMap::new(),
            inbound: HashMap::new(),
            flow: RequestFlow::new(parity, peer_max),
            peer_next_request: 1 - parity,
            goaway: false,
            our_max_request: limits.max_request_id(),
        };
        let session = Session(Arc::new(Inner {
            me,
            peer,
            limits,
            conn,
            control: Mutex::new(send),
            state: std::sync::Mutex::new(state),
            answered: tokio::sync::Notify::new(),
        }));
        let (tx, rx) = mpsc::channel(4_096);
        let s = session.clone();
        let events = tx.clone();
        tokio::spawn(async move {
            if let Err(e) = s.announce_and_subscribe().await {
                let _ = events.send(SessionEvent::Closed(e)).await;
                return;
            }
            let reason = s.control_loop(recv, buf, &events).await;
            let _ = events.send(SessionEvent::Closed(reason)).await;
        });
        let s = session.clone();
        let events = tx.clone();
        tokio::spawn(dataplane::streams_loop(s, events));
        let s = session.clone();
        tokio::spawn(async move { dataplane::datagrams_loop(&s, &tx).await });
        (session, rx)
    }

    /// The peer's agent id, from its certificate.
    pub fn peer(&self) -> &AgentId {
        &self.0.peer
    }

    /// The underlying QUIC connection.
    pub fn connection(&self) -> &quinn::Connection {
        &self.0.conn
    }

    /// Whether the peer subscribed to `track`.
    pub fn is_subscribed(&self, track: Track) -> bool {
        self.state().outbound.contains_key(&track)
    }

    /// Closes the session with NO_ERROR.
    pub fn close(&self, reason: &str) {
        self.0.conn.close(code::NO_ERROR.into(), reason.as_bytes());
    }

    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        self.0.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Sends `req` now if the peer's Maximum Request ID allows, else queues it and reports
    /// REQUESTS_BLOCKED once.
    async fn request(&self, req: Request) -> Result<(), String> {
        let taken = {
            let mut st = self.state();
            let taken = st.flow.take(req.clone());
            if let (Take::Send(id), Request::Subscribe(_, track)) = (&taken, &req) {
                st.requested.insert(*id, *track);
            }
            taken
        };
        dataplane::send_request(&self.0.control, &self.0.me, taken, &req).await
    }

    async fn write_control(&self, msg: Control) -> Result<(), String> {
        dataplane::write_control(&self.0.control, msg).await
    }

    async fn announce_and_subscribe(&self) -> Result<(), String> {
        self.request(Request::PublishNamespace).await?;
        for track in Track::ALL {
            self.request(Request::Subscribe(self.0.peer.clone(), track))
                .await?;
        }
        Ok(())
    }

    /// Sends one group of objects on `track`. `datagram`: each object as an OBJECT_DATAGRAM
    /// when it fits the path, else the group rides a subgroup stream.
    pub async fn send_group(
        &self,
        track: Track,
        payloads: &[Vec<u8>],
        datagram: bool,
    ) -> Result<(), SendError> {
        let group = {
            let mut st = self.state();
            if !st.outbound.contains_key(&track) {
                return Err(SendError::NotSubscribed(track));
            }
            let g = st.groups.entry(track).or_insert(0);
            *g += 1;
            *g - 1
        };
        let conn = &self.0.conn;
        if datagram && dataplane::fit_datagrams(conn, payloads) {
            return dataplane::send_datagrams(
                conn,
                track.alias(),
                group,
                payloads,
                Grouping::OneGroup,
            );
        }
        dataplane::send_subgroup(conn, track.alias(), group, payloads, || {
            *self.state().streams.entry(track).or_insert(0) += 1;
        })
        .await
    }

    async fn control_loop(
        &self,
        recv: quinn::RecvStream,
        buf: Vec<u8>,
        events: &mpsc::Sender<SessionEvent>,
    ) -> String {
        dataplane::control_loop(&self.0.conn, recv, buf, |msg| {
            self.handle_control(msg, events)
        })
        .await
    }

    fn check_request_id(&self, id: u64) -> Result<(), MoqtError> {
        let mut st = self.state();
        if id >= st.our_max_request {
            return Err(MoqtError::TooManyRequests {
                limit: self.0.limits.max_requests,
            });
        }
        if id != st.peer_next_request {
            return Err(MoqtError::ProtocolViolation("unexpected request id"));
        }
        st.peer_next_request += 2;
        Ok(())
    }

    async fn handle_control(
        &self,
        msg: Control,
        events: &mpsc::Sender<SessionEvent>,
    ) -> Result<(), MoqtError> {
        let io = |_| MoqtError::ProtocolViolation("control stream write failed");
        match msg {
            Control::Subscribe {
                request_id,
                namespace: ns,
                name,
                ..
            } => {
                match self.check_request_id(request_id) {
                    Ok(()) => {}
                    Err(e @ MoqtError::TooManyRequests { .. }) => return Err(e),
                    Err(_) => {
                        self.0
                            .conn
                            .close(code::INVALID_REQUEST_ID.into(), b"unexpected request id");
                        return Err(MoqtError::ProtocolViolation("unexpected request id"));
                    }
                }
                let ours = ns == namespace(&self.0.me);
                let grant = match Track::parse(&name) {
                    Some((track, addressed))
                        if ours && addressed == self.0.peer.as_str().as_bytes() =>
                    {
                        Ok(track)
                    }
                    // A track of ours addressed to someone else: not for this subscriber.
                    Some(_) if ours => Err((0x1, "track not addressed to the subscriber")),
                    _ => Err((0x4, "no such track")),
                };
                match grant {
                    Ok(track) => {
                        self.state().outbound.insert(track, request_id);
                        let largest =
                            self.state()
                                .groups
                                .get(&track)
                                .map(|g| abhyasa_wire::moqt::Location {
                                    group: g.saturating_sub(1),
                                    object: 0,
                                });
                        self.write_control(Control::SubscribeOk {
                            request_id,
                            track_alias: track.alias(),
                            expires: 0,
                            group_order: 1,
                            largest,
                            params: vec![],
                        })
                        .await
                        .map_err(io)?;
                        // Every (re)subscription is news: the owner re-offers what is pending.
                        let _ = events.send(SessionEvent::PeerSubscribed(track)).await;
                    }
                    Err((code, reason)) => {
                        tracing::warn!(peer = %self.0.peer, reason, "refused a subscription");
                        self.write_control(Control::SubscribeError {
                            request_id,
                            code,
                            reason: reason.into(),
                        })
                        .await
                        .map_err(io)?;
                    }
                }
            }
            Control::SubscribeOk {
                request_id,
                track_alias,
                ..
            } => {
                let mut st = self.state();
                let Some(track) = st.requested.remove(&request_id) else {
                    return Err(MoqtError::ProtocolViolation(
                        "SUBSCRIBE_OK for no subscription",
                    ));
                };
                if st.inbound.insert(track_alias, track).is_some() {
                    return Err(MoqtError::ProtocolViolation("duplicate track alias"));
                }
                drop(st);
                self.0.answered.notify_waiters();
            }
            Control::SubscribeError {
                request_id, reason, ..
            } => {
                let track = self.state().requested.remove(&request_id);
                self.0.answered.notify_waiters();
                tracing::warn!(peer = %self.0.peer, ?track, reason, "subscription refused by the peer");
            }
            Control::Unsubscribe { request_id } => {
                let ended = {
                    let mut st = self.state();
                    let track = st
                        .outbound
                        .iter()
                        .find(|(_, id)| **id == request_id)
                        .map(|(t, _)| *t);
                    track.map(|t| {
                        st.outbound.remove(&t);
                        st.streams.get(&t).copied().unwrap_or(0)
                    })
                };
                if let Some(stream_count) = ended {
                    self.write_control(Control::PublishDone {
                        request_id,
                        status: 0x3,
                        stream_count,
                        reason: String::new(),
                    })
                    .await
                    .map_err(io)?;
                }
            }
            Control::PublishNamespace {
                request_id,
                namespace: ns,
                ..
            } => {
                self.check_request_id(request_id)?;
                let reply = if ns == namespace(&self.0.peer) {
                    Control::PublishNamespaceOk { request_id }
                } else {
                    Control::PublishNamespaceError {
                        request_id,
                        code: 0x1,
                        reason: "namespace is not the peer's own".into(),
                    }
                };
                self.write_control(reply).await.map_err(io)?;
            }
            Control::SubscribeNamespace {
                request_id, prefix, ..
            } => {
                self.check_request_id(request_id)?;
                let ours = namespace(&self.0.me);
                if ours.starts_with(&prefix) {
                    self.write_control(Control::SubscribeNamespaceOk { request_id })
                        .await
                        .map_err(io)?;
                    self.request(Request::PublishNamespace).await.map_err(io)?;
                } else {
                    self.write_control(Control::SubscribeNamespaceError {
                        request_id,
                        code: 0x4,
                        reason: "no namespace under that prefix".into(),
                    })
                    .await
                    .map_err(io)?;
                }
            }
            Control::Goaway { uri } => {
                let mut st = self.state();
                if st.goaway {
                    return Err(MoqtError::ProtocolViolation("second GOAWAY"));
                }
                st.goaway = true;
                drop(st);
                tracing::info!(peer = %self.0.peer, uri = %String::from_utf8_lossy(&uri), "peer is going away");
                self.0.conn.close(code::NO_ERROR.into(), b"goaway");
            }
            Control::RequestsBlocked { .. } => {
                // The grant is the session's limit (`SessionLimits::max_requests`): it is not
                // raised. A peer that needs more opens a new session.
                tracing::info!(peer = %self.0.peer, limit = self.0.limits.max_requests, "peer is blocked on the request limit");
            }
            Control::ClientSetup { .. } | Control::ServerSetup { .. } => {
                return Err(MoqtError::ProtocolViolation("setup after setup"));
            }
            Control::Unsupported { kind: k, payload } => {
                // Requests we do not serve get their error answer; the rest are ignored.
                let answer = match k {
                    0x16 => Some(0x19), // FETCH -> FETCH_ERROR
                    0x1D => Some(0x1F), // PUBLISH -> PUBLISH_ERROR
                    0xD => Some(0xF),   // TRACK_STATUS -> TRACK_STATUS_ERROR
                    _ => None,
                };
                if let Some(answer) = answer {
                    let request_id = abhyasa_wire::moqt::Reader::new(&payload).varint()?;
                    self.check_request_id(request_id)?;
                    let mut p = Vec::new();
                    abhyasa_wire::moqt::put_varint(&mut p, request_id);
                    abhyasa_wire::moqt::put_varint(&mut p, 0x3);
                    abhyasa_wire::moqt::put_field(&mut p, b"not supported");
                    self.write_control(Control::Unsupported {
                        kind: answer,
                        payload: p,
                    })
                    .await
                    .map_err(io)?;
                }
            }
            Control::MaxRequestId { request_id: max } => {
                let waiting = self.state().flow.raise(max)?;
                for req in waiting {
                    self.request(req).await.map_err(io)?;
                }
            }
            Control::PublishDone { .. }
            | Control::PublishNamespaceOk { .. }
            | Control::PublishNamespaceError { .. }
            | Control::PublishNamespaceDone { .. }
            | Control::SubscribeNamespaceOk { .. }
            | Control::SubscribeNamespaceError { .. }
            | Control::UnsubscribeNamespace { .. } => {}
            _ => {}
        }
        Ok(())
    }

    /// The track `alias` names, or `None` for an alias the peer never granted. While a
    /// subscription of ours awaits its answer, an unknown alias waits for that answer (up to
    /// [`dataplane::ALIAS_WAIT`]: objects may overtake their SUBSCRIBE_OK) instead of being
    /// dropped at once.
    async fn inbound_track(&self, alias: u64) -> Option<Track> {
        dataplane::resolve_alias(&self.0.answered, || {
            let st = self.state();
            match st.inbound.get(&alias) {
                Some(track) => Lookup::Known(*track),
                None if st.requested.is_empty() => Lookup::Unknown,
                None => Lookup::Pending,
            }
        })
        .await
    }
}

impl dataplane::Inbound for Session {
    type Target = Track;
    type Event = SessionEvent;

    fn conn(&self) -> &quinn::Connection {
        &self.0.conn
    }

    fn remote(&self) -> &AgentId {
        &self.0.peer
    }

    fn max_objects_per_group(&self) -> usize {
        self.0.limits.max_objects_per_group
    }

    fn resolve(&self, alias: u64) -> impl std::future::Future<Output = Option<Track>> + Send {
        self.inbound_track(alias)
    }

    fn event(&self, track: &Track, payload: Vec<u8>) -> SessionEvent {
        SessionEvent::Object {
            track: *track,
            payload,
        }
    }
}
