//! Custody through an MOQT relay (draft-14; made against `moq-relay` 0.17 run unmodified).
//!
//! One QUIC session to the relay carries every logical peer. The node:
//!
//! - publishes its namespace `(abhyasa, v1, <self>)` (PUBLISH_NAMESPACE) and subscribes to the
//!   prefix `(abhyasa, v1)` (SUBSCRIBE_NAMESPACE), so the relay tells it of every other node's
//!   namespace (PUBLISH_NAMESPACE from the relay), now and when one comes back — or, given the
//!   peers it serves (`interest`), to each of their namespaces alone, so the relay announces
//!   only those;
//! - for each such namespace `(abhyasa, v1, X)`, subscribes to `to/<self>`, `acks/<self>` and
//!   `ledger/<self>` there: what X addresses to it;
//! - answers the SUBSCRIBEs the relay forwards for its own tracks `to|acks|ledger/<X>`: X is
//!   listening, and custody re-offers what is pending for X.
//!
//! The relay does not authenticate who subscribes or publishes (`moq-relay --auth-public`
//! admits anyone under the prefix): who sent an object is proven only by its end-to-end
//! signature ([`crate::signed`]), which the node checks against the namespace the object came
//! from. Anyone who reaches the relay can *read* what is published under the prefix: run the
//! relay inside the deployment's own network, or behind its authentication.
//!
//! Group ids of each track start at the session's start time in microseconds, so a relay that
//! still holds a track of an earlier session of ours never takes a new group for an old one.
//! A datagram is always object 0 of its own group (the relay forwards datagrams only so).

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::{SystemTime, UNIX_EPOCH};

use abhyasa_wire::moqt::{Control, KeyValue, MoqtError, Namespace};
use abhyasa_wire::AgentId;
use tokio::sync::{mpsc, Mutex};

use crate::dataplane::{self, Grouping, Lookup, Request, RequestFlow, Take};
use crate::setup::{client_setup, namespace, SendError, SessionError, Track};

/// What the relay session tells its owner.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum RelayEvent {
    /// An object on a track `from` addresses to us (its namespace is `from`'s; the object's
    /// own signature must still say so).
    Object {
        /// The namespace the object came from.
        from: AgentId,
        /// Which track.
        track: Track,
        /// The payload.
        payload: Vec<u8>,
    },
    /// `peer` subscribed (through the relay) to our track for it.
    PeerSubscribed {
        /// Who.
        peer: AgentId,
        /// Which track.
        track: Track,
    },
    /// The session with the relay ended.
    Closed(String),
}

/// Subscriptions of ours and of others (through the relay) a session holds at most: a relay
/// that forwards more is refused the rest.
const MAX_SUBSCRIPTIONS: usize = 100_000;
/// The MoQ Solicit setup option (draft-lcurley-moq-solicit-00).
const SOLICIT: u64 = 0x40B5A;
/// The Maximum Request ID granted to the relay, raised by this much when it is blocked.
const REQUEST_WINDOW: u64 = 1 << 16;

struct State {
    /// Our request ids, within the relay's Maximum Request ID.
    flow: RequestFlow<Request>,
    our_max_request: u64,
    /// Our requests awaiting an answer.
    requested: HashMap<u64, Request>,
    /// Our subscriptions, pending or granted.
    subscribed: HashSet<(AgentId, Track)>,
    /// The peers whose namespaces the relay announced to us (and did not withdraw).
    seen: HashSet<AgentId>,
    /// Granted subscriptions of ours: request id → (peer, track).
    granted: HashMap<u64, (AgentId, Track)>,
    /// Aliases the relay granted us.
    inbound: HashMap<u64, (AgentId, Track)>,
    /// Subscriptions the relay forwarded to our tracks: (peer, track) → (request id, alias).
    outbound: HashMap<(AgentId, Track), (u64, u64)>,
    next_alias: u64,
    next_group: u64,
}

struct Inner {
    me: AgentId,
    relay: AgentId,
    /// Whose namespaces to subscribe to; `None`: everyone's the relay announces.
    interest: Option<HashSet<AgentId>>,
    conn: quinn::Connection,
    control: Mutex<quinn::SendStream>,
    state: std::sync::Mutex<State>,
    answered: tokio::sync::Notify,
}

/// A session with an MOQT relay carrying custody for every peer that meets us there.
#[derive(Clone)]
pub struct RelaySession(Arc<Inner>);

impl std::fmt::Debug for RelaySession {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RelaySession")
            .field("me", &self.0.me)
            .field("relay", &self.0.relay)
            .finish_non_exhaustive()
    }
}

impl RelaySession {
    /// Dials the relay at `addr`, whose certificate (from the deployment CA) must name
    /// `relay`, and starts: our namespace published, every other node's subscribed to.
    pub async fn connect(
        endpoint: &quinn::Endpoint,
        addr: std::net::SocketAddr,
        relay: &AgentId,
        me: &AgentId,
    ) -> Result<(RelaySession, mpsc::Receiver<RelayEvent>), SessionError> {
        Self::connect_with(endpoint, addr, relay, me, None, None).await
    }

    /// [`RelaySession::connect`], subscribing only to the namespaces of `interest` when it is
    /// given (an agent that serves one principal needs only that principal's tracks; without
    /// it every node subscribes to every other: three subscriptions per pair at the relay).
    /// Anyone may still subscribe to *our* tracks for them. With `client` (from
    /// [`relay_client_config`](crate::relay_client_config)) the relay is trusted by its own
    /// CA, for the name `relay`, or by its certificate's fingerprint instead.
    pub async fn connect_with(
        endpoint: &quinn::Endpoint,
        addr: std::net::SocketAddr,
        relay: &AgentId,
        me: &AgentId,
        interest: Option<HashSet<AgentId>>,
        client: Option<quinn::ClientConfig>,
    ) -> Result<(RelaySession, mpsc::Receiver<RelayEvent>), SessionError> {
        // SOLICIT = 1 (draft-lcurley-moq-solicit-00, a setup option other peers ignore):
        // announce to us only the namespaces we ask for with SUBSCRIBE_NAMESPACE. Without it
        // `moq-relay` tells every draft-14 client of every namespace it holds — with N nodes
        // at one relay, N² announcements, whatever each asked for.
        let solicit = [KeyValue::Int {
            key: SOLICIT,
            value: 1,
        }];
        let setup = client_setup(
            endpoint,
            addr,
            relay,
            None,
            REQUEST_WINDOW,
            client,
            &solicit,
        )
        .await?;
        let first_group = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| d.as_micros() as u64)
            .unwrap_or(0);
        let state = State {
            flow: RequestFlow::new(0, setup.peer_max),
            our_max_request: REQUEST_WINDOW,
            requested: HashMap::new(),
            subscribed: HashSet::new(),
            seen: HashSet::new(),
            granted: HashMap::new(),
            inbound: HashMap::new(),
            outbound: HashMap::new(),
            next_alias: 1,
            next_group: first_group,
        };
        let session = RelaySession(Arc::new(Inner {
            me: me.clone(),
            relay: relay.clone(),
            interest,
            conn: setup.conn,
            control: Mutex::new(setup.send),
            state: std::sync::Mutex::new(state),
            answered: tokio::sync::Notify::new(),
        }));
        let (tx, rx) = mpsc::channel(4_096);
        let (s, events) = (session.clone(), tx.clone());
        let (recv, buf) = (setup.recv, setup.buf);
        tokio::spawn(async move {
            let start = async {
                s.request(Request::PublishNamespace).await?;
                // With an interest, only those namespaces: the relay then announces N of
                // them, not every node's (with everyone at one relay, announcements to all
                // would be N² messages).
                let prefixes: Vec<Namespace> = match &s.0.interest {
                    Some(only) => {
                        let mut peers: Vec<&AgentId> = only.iter().collect();
                        peers.sort();
                        peers.into_iter().map(namespace).collect()
                    }
                    None => vec![Namespace::from_strs(&["abhyasa", "v1"])],
                };
                for prefix in prefixes {
                    s.request(Request::SubscribeNamespace(prefix)).await?;
                }
                Ok::<(), String>(())
            };
            if let Err(e) = start.await {
                let _ = events.send(RelayEvent::Closed(e)).await;
                return;
            }
            let reason = s.control_loop(recv, buf, &events).await;
            let _ = events.send(RelayEvent::Closed(reason)).await;
        });
        let (s, events) = (session.clone(), tx.clone());
        tokio::spawn(dataplane::streams_loop(s, events));
        let s = session.clone();
        tokio::spawn(async move { dataplane::datagrams_loop(&s, &tx).await });
        Ok((session, rx))
    }

    /// The relay's name.
    pub fn relay(&self) -> &AgentId {
        &self.0.relay
    }

    /// The peers whose namespaces the relay has announced to us, sorted: everyone's there,
    /// or with an interest only those peers'.
    pub fn peers_seen(&self) -> Vec<AgentId> {
        let mut seen: Vec<AgentId> = self.state().seen.iter().cloned().collect();
        seen.sort();
        seen
    }

    /// The QUIC connection to the relay.
    pub fn connection(&self) -> &quinn::Connection {
        &self.0.conn
    }

    /// Whether `peer` subscribed (through the relay) to our `track` for it.
    pub fn is_subscribed(&self, peer: &AgentId, track: Track) -> bool {
        self.state().outbound.contains_key(&(peer.clone(), track))
    }

    /// Closes the session with the relay.
    pub fn close(&self, reason: &str) {
        self.0.conn.close(0u32.into(), reason.as_bytes());
    }

    /// Sends one group of objects on our `track` for `peer`. `datagram`: each object as an
    /// OBJECT_DATAGRAM of its own group when it fits the path, else one subgroup stream.
    pub async fn send_group(
        &self,
        peer: &AgentId,
        track: Track,
        payloads: &[Vec<u8>],
        datagram: bool,
    ) -> Result<(), SendError> {
        let conn = &self.0.conn;
        let as_datagrams = datagram && dataplane::fit_datagrams(conn, payloads);
        let (alias, group) = {
            let mut st = self.state();
            let Some(&(_, alias)) = st.outbound.get(&(peer.clone(), track)) else {
                return Err(SendError::NotSubscribed(track));
            };
            let group = st.next_group;
            st.next_group += if as_datagrams {
                payloads.len() as u64
            } else {
                1
            };
            (alias, group)
        };
        if as_datagrams {
            // A group per datagram: a relay forwards each whole.
            return dataplane::send_datagrams(conn, alias, group, payloads, Grouping::GroupEach);
        }
        dataplane::send_subgroup(conn, alias, group, payloads, || {}).await
    }

    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        self.0.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    async fn write_control(&self, msg: Control) -> Result<(), String> {
        dataplane::write_control(&self.0.control, msg).await
    }

    /// Sends `req` now if the relay's Maximum Request ID allows, else queues it and reports
    /// REQUESTS_BLOCKED once.
    async fn request(&self, req: Request) -> Result<(), String> {
        let taken = {
            let mut st = self.state();
            let taken = st.flow.take(req.clone());
            if let Take::Send(id) = taken {
                st.requested.insert(id, req.clone());
            }
            taken
        };
        dataplane::send_request(&self.0.control, &self.0.me, taken, &req).await
    }

    async fn control_loop(
        &self,
        recv: quinn::RecvStream,
        buf: Vec<u8>,
        events: &mpsc::Sender<RelayEvent>,
    ) -> String {
        dataplane::control_loop(&self.0.conn, recv, buf, |msg| {
            self.handle_control(msg, events)
        })
        .await
    }

    /// A request id of the relay's: below our grant, or the session ends.
    fn check_request_id(&self, id: u64) -> Result<(), MoqtError> {
        if id >= self.state().our_max_request {
            return Err(MoqtError::TooManyRequests {
                limit: self.state().our_max_request,
            });
        }
        Ok(())
    }

    /// The peer whose namespace `ns` is, if it is another Abhyasa node's.
    fn peer_of(&self, ns: &Namespace) -> Option<AgentId> {
        match ns.0.as_slice() {
            [a, v, id] if a == b"abhyasa" && v == b"v1" => std::str::from_utf8(id)
                .ok()
                .and_then(|s| AgentId::new(s).ok())
                .filter(|p| *p != self.0.me),
            _ => None,
        }
    }

    async fn handle_control(
        &self,
        msg: Control,
        events: &mpsc::Sender<RelayEvent>,
    ) -> Result<(), MoqtError> {
        let io = |_| MoqtError::ProtocolViolation("control stream write failed");
        match msg {
            Control::SubscribeNamespace { request_id, .. } => {
                // The relay asks which namespaces we publish: ours, announced already.
                self.check_request_id(request_id)?;
                self.write_control(Control::SubscribeNamespaceOk { request_id })
                    .await
                    .map_err(io)?;
            }
            Control::PublishNamespace {
                request_id,
                namespace: ns,
                ..
            } => {
                self.check_request_id(request_id)?;
                self.write_control(Control::PublishNamespaceOk { request_id })
                    .await
                    .map_err(io)?;
                let announced = self.peer_of(&ns);
                if let Some(p) = &announced {
                    let mut st = self.state();
                    if st.seen.len() < MAX_SUBSCRIPTIONS {
                        st.seen.insert(p.clone());
                    }
                }
                let wanted = announced
                    .filter(|p| self.0.interest.as_ref().is_none_or(|only| only.contains(p)));
                if let Some(peer) = wanted {
                    let new: Vec<Track> = {
                        let mut st = self.state();
                        Track::ALL
                            .into_iter()
                            .filter(|t| {
                                st.subscribed.len() < MAX_SUBSCRIPTIONS
                                    && st.subscribed.insert((peer.clone(), *t))
                            })
                            .collect()
                    };
                    for t in new {
                        self.request(Request::Subscribe(peer.clone(), t))
                            .await
                            .map_err(io)?;
                    }
                }
            }
            Control::PublishNamespaceDone { namespace: ns } => {
                if let Some(peer) = self.peer_of(&ns) {
                    let mut st = self.state();
                    st.seen.remove(&peer);
                    st.subscribed.retain(|(p, _)| *p != peer);
                    st.inbound.retain(|_, (p, _)| *p != peer);
                    st.granted.retain(|_, (p, _)| *p != peer);
                }
            }
            Control::Subscribe {
                request_id,
                namespace: ns,
                name,
                ..
            } => {
                self.check_request_id(request_id)?;
                let wanted = (ns == namespace(&self.0.me))
                    .then(|| Track::parse(&name))
                    .flatten()
                    .and_then(|(t, rest)| {
                        let peer = AgentId::new(std::str::from_utf8(rest).ok()?).ok()?;
                        Some((peer, t))
                    });
                let granted = wanted.and_then(|(peer, track)| {
                    let mut st = self.state();
                    let key = (peer.clone(), track);
                    if st.outbound.len() >= MAX_SUBSCRIPTIONS && !st.outbound.contains_key(&key) {
                        return None;
                    }
                    let alias = st.next_alias;
                    st.next_alias += 1;
                    st.outbound.insert(key, (request_id, alias));
                    Some((peer, track, alias))
                });
                match granted {
                    Some((peer, track, alias)) => {
                        self.write_control(Control::SubscribeOk {
                            request_id,
                            track_alias: alias,
                            expires: 0,
                            group_order: 1,
                            largest: None,
                            params: vec![],
                        })
                        .await
                        .map_err(io)?;
                        let _ = events
                            .send(RelayEvent::PeerSubscribed { peer, track })
                            .await;
                    }
                    None => {
                        self.write_control(Control::SubscribeError {
                            request_id,
                            code: 0x4,
                            reason: "no such track here".into(),
                        })
                        .await
                        .map_err(io)?;
                    }
                }
            }
            Control::Unsubscribe { request_id } => {
                let ended = {
                    let mut st = self.state();
                    let key = st
                        .outbound
                        .iter()
                        .find(|(_, (id, _))| *id == request_id)
                        .map(|(k, _)| k.clone());
                    key.map(|k| st.outbound.remove(&k))
                };
                if ended.is_some() {
                    self.write_control(Control::PublishDone {
                        request_id,
                        status: 0x3,
                        stream_count: 0,
                        reason: String::new(),
                    })
                    .await
                    .map_err(io)?;
                }
            }
            Control::SubscribeOk {
                request_id,
                track_alias,
                ..
            } => {
                let mut st = self.state();
                match st.requested.remove(&request_id) {
                    Some(Request::Subscribe(peer, track)) => {
                        st.inbound.insert(track_alias, (peer.clone(), track));
                        st.granted.insert(request_id, (peer, track));
                    }
                    _ => {
                        return Err(MoqtError::ProtocolViolation(
                            "SUBSCRIBE_OK for no subscription",
                        ))
                    }
                }
                drop(st);
                self.0.answered.notify_waiters();
            }
            Control::SubscribeError {
                request_id, reason, ..
            } => {
                let req = self.state().requested.remove(&request_id);
                if let Some(Request::Subscribe(peer, track)) = req {
                    // Asked again when the relay next announces that namespace.
                    self.state().subscribed.remove(&(peer.clone(), track));
                    tracing::debug!(%peer, ?track, reason, "relay refused a subscription");
                }
                self.0.answered.notify_waiters();
            }
            Control::PublishDone { request_id, .. } => {
                let mut st = self.state();
                if let Some(key) = st.granted.remove(&request_id) {
                    st.inbound.retain(|_, v| *v != key);
                    st.subscribed.remove(&key);
                }
            }
            Control::PublishNamespaceError { reason, .. } => {
                // Without our namespace nobody can subscribe to us: nothing to do here.
                tracing::warn!(relay = %self.0.relay, reason, "the relay refused our namespace");
                self.close(&format!("the relay refused our namespace: {reason}"));
            }
            Control::SubscribeNamespaceError { reason, .. } => {
                tracing::warn!(relay = %self.0.relay, reason, "the relay refused the namespace prefix");
                self.close(&format!("the relay refused the namespace prefix: {reason}"));
            }
            Control::MaxRequestId { request_id: max } => {
                let waiting = self.state().flow.raise(max)?;
                for req in waiting {
                    self.request(req).await.map_err(io)?;
                }
            }
            Control::RequestsBlocked { .. } => {
                let max = {
                    let mut st = self.state();
                    st.our_max_request += REQUEST_WINDOW;
                    st.our_max_request
                };
                self.write_control(Control::MaxRequestId { request_id: max })
                    .await
                    .map_err(io)?;
            }
            Control::Goaway { .. } => {
                tracing::info!(relay = %self.0.relay, "relay is going away");
                self.close("goaway");
            }
            Control::ClientSetup { .. } | Control::ServerSetup { .. } => {
                return Err(MoqtError::ProtocolViolation("setup after setup"));
            }
            _ => {}
        }
        Ok(())
    }

    /// The (peer, track) `alias` names, waiting briefly while a subscription of ours awaits
    /// its answer (objects may overtake their SUBSCRIBE_OK; `dataplane::resolve_alias`).
    async fn inbound(&self, alias: u64) -> Option<(AgentId, Track)> {
        dataplane::resolve_alias(&self.0.answered, || {
            let st = self.state();
            match st.inbound.get(&alias) {
                Some(v) => Lookup::Known(v.clone()),
                None if st
                    .requested
                    .values()
                    .any(|r| matches!(r, Request::Subscribe(..))) =>
                {
                    Lookup::Pending
                }
                None => Lookup::Unknown,
            }
        })
        .await
    }
}

impl dataplane::Inbound for RelaySession {
    type Target = (AgentId, Track);
    type Event = RelayEvent;

    fn conn(&self) -> &quinn::Connection {
        &self.0.conn
    }

    fn remote(&self) -> &AgentId {
        &self.0.relay
    }

    /// One object per group is what a node sends; more are ignored (custody re-offers).
    fn max_objects_per_group(&self) -> usize {
        MAX_OBJECTS_PER_GROUP
    }

    fn resolve(
        &self,
        alias: u64,
    ) -> impl std::future::Future<Output = Option<(AgentId, Track)>> + Send {
        self.inbound(alias)
    }

    fn event(&self, (from, track): &(AgentId, Track), payload: Vec<u8>) -> RelayEvent {
        RelayEvent::Object {
            from: from.clone(),
            track: *track,
            payload,
        }
    }
}

/// Objects taken from one subgroup stream.
const MAX_OBJECTS_PER_GROUP: usize = 64;
