//! MCP over QUIC in the MCP-over-MOQT layout (docs/DESIGN.md, "On the wire"; from
//! draft-jennings-mcp-over-moqt-00 §2.2.1): one MOQT session per MCP session over the node's
//! mutually authenticated endpoint (ALPN `moq-00`, draft 14, same certificates, same port).
//!
//! - The client's CLIENT_SETUP carries the PATH parameter (0x01) `/mcp`: the transport sets
//!   the session up and hands it to the binding that registered the path
//!   ([`abhyasa_moq::binding`]), which is this one.
//! - Control namespace `("mcp", <session-id>, "control")`; the client picks the session id
//!   (64 random bits, hex) and announces the namespace with PUBLISH_NAMESPACE.
//! - Tracks `client-to-server` (published by the client) and `server-to-client` (published by
//!   the server); each side SUBSCRIBEs to the other's.
//! - Each JSON-RPC message is one object (UTF-8 JSON) in group 0 of one subgroup stream per
//!   track, so object ids rise per track and order is the stream's. A message sent before the
//!   peer subscribed waits for the subscription.
//! - A lost QUIC connection ends the MCP session; the client starts a fresh one (a new
//!   session id): we chose not to resume by id, since MCP state lives in the peers, not in
//!   the transport.

use std::sync::Arc;

use abhyasa_moq::{BoundConnection, ControlReader, SendError, SessionError};
use abhyasa_wire::moqt::{
    Control, MoqtError, Namespace, ObjectBody, StreamObject, SubgroupHeader, SubgroupId,
};
use abhyasa_wire::AgentId;
use tokio::sync::{mpsc, Mutex};

/// The PATH setup parameter value of an MCP session.
pub const MCP_PATH: &[u8] = b"/mcp";
/// Track the client publishes.
pub const CLIENT_TO_SERVER: &[u8] = b"client-to-server";
/// Track the server publishes.
pub const SERVER_TO_CLIENT: &[u8] = b"server-to-client";

/// Largest JSON-RPC message accepted (one object).
pub const MAX_MESSAGE: usize = 4 << 20;

/// Which end of the MCP session this is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum McpRole {
    /// Calls tools; publishes `client-to-server`.
    Client,
    /// Serves tools; publishes `server-to-client`.
    Server,
}

impl McpRole {
    fn ours(self) -> &'static [u8] {
        match self {
            McpRole::Client => CLIENT_TO_SERVER,
            McpRole::Server => SERVER_TO_CLIENT,
        }
    }

    fn theirs(self) -> &'static [u8] {
        match self {
            McpRole::Client => SERVER_TO_CLIENT,
            McpRole::Server => CLIENT_TO_SERVER,
        }
    }

    fn alias(self) -> u64 {
        match self {
            McpRole::Client => 1,
            McpRole::Server => 2,
        }
    }
}

/// The control namespace of MCP session `id`.
pub fn mcp_namespace(id: &str) -> Namespace {
    Namespace::from_strs(&["mcp", id, "control"])
}

#[derive(Default)]
struct Out {
    /// Granted once the peer subscribed to our track.
    alias: Option<u64>,
    stream: Option<quinn::SendStream>,
    /// Messages written before the peer subscribed.
    queued: Vec<Vec<u8>>,
    closed: Option<String>,
}

struct Shared {
    role: McpRole,
    peer: AgentId,
    conn: quinn::Connection,
    namespace: Mutex<Option<Namespace>>,
    control: Mutex<quinn::SendStream>,
    out: Mutex<Out>,
    /// The alias the peer granted for its track.
    inbound: std::sync::Mutex<Option<u64>>,
}

/// One MCP session over MOQT: send and receive JSON-RPC messages (bytes of UTF-8 JSON).
pub struct McpChannel {
    shared: Arc<Shared>,
    incoming: mpsc::Receiver<Vec<u8>>,
}

/// The sending half of an [`McpChannel`].
#[derive(Clone)]
pub struct McpSender(Arc<Shared>);

impl std::fmt::Debug for McpChannel {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("McpChannel")
            .field("peer", &self.shared.peer)
            .field("role", &self.shared.role)
            .finish_non_exhaustive()
    }
}

fn io<E: std::fmt::Display>(e: E) -> SessionError {
    SessionError::Stream(e.to_string())
}

impl McpChannel {
    /// Opens an MCP session as the client of `bound`, a connection dialled for
    /// [`MCP_PATH`] (`Node::dial`): announces a fresh control namespace and subscribes to the
    /// server's track.
    pub async fn open(bound: BoundConnection) -> Result<McpChannel, SessionError> {
        let id = format!("{:016x}", rand_u64(bound.connection()));
        let ns = mcp_namespace(&id);
        let channel = Self::start(McpRole::Client, bound);
        *channel.shared.namespace.lock().await = Some(ns.clone());
        let shared = channel.shared.clone();
        shared
            .write(Control::PublishNamespace {
                request_id: 0,
                namespace: ns.clone(),
                params: vec![],
            })
            .await?;
        shared.subscribe(2, ns).await?;
        Ok(channel)
    }

    /// Serves an MCP session the transport set up and routed here: the client's
    /// CLIENT_SETUP had PATH [`MCP_PATH`] and SERVER_SETUP was sent.
    pub fn serve(bound: BoundConnection) -> McpChannel {
        Self::start(McpRole::Server, bound)
    }

    fn start(role: McpRole, bound: BoundConnection) -> McpChannel {
        let (peer, conn, send, control) = bound.into_parts();
        let shared = Arc::new(Shared {
            role,
            peer,
            conn,
            namespace: Mutex::new(None),
            control: Mutex::new(send),
            out: Mutex::new(Out::default()),
            inbound: std::sync::Mutex::new(None),
        });
        let (tx, incoming) = mpsc::channel(1_024);
        let s = shared.clone();
        tokio::spawn(async move {
            let reason = match s.control_loop(control).await {
                Ok(()) => "control stream ended".to_owned(),
                Err(e) => {
                    let code = u32::try_from(e.to_code()).unwrap_or(0x1);
                    s.conn.close(code.into(), e.to_string().as_bytes());
                    e.to_string()
                }
            };
            s.out.lock().await.closed = Some(reason);
        });
        let s = shared.clone();
        tokio::spawn(async move { s.data_loop(tx).await });
        McpChannel { shared, incoming }
    }

    /// The authenticated peer.
    pub fn peer(&self) -> &AgentId {
        &self.shared.peer
    }

    /// The QUIC connection the session rides.
    pub fn connection(&self) -> &quinn::Connection {
        &self.shared.conn
    }

    /// This end's role.
    pub fn role(&self) -> McpRole {
        self.shared.role
    }

    /// A handle that sends on this session.
    pub fn sender(&self) -> McpSender {
        McpSender(self.shared.clone())
    }

    /// Sends one JSON-RPC message.
    pub async fn send(&self, message: &[u8]) -> Result<(), SendError> {
        self.shared.send(message).await
    }

    /// The next JSON-RPC message from the peer; `None` once the session ended.
    pub async fn recv(&mut self) -> Option<Vec<u8>> {
        self.incoming.recv().await
    }

    /// Ends the session.
    pub fn close(&self, reason: &str) {
        self.shared.conn.close(0u32.into(), reason.as_bytes());
    }

    /// Splits into a sender and the receiving channel.
    pub fn split(self) -> (McpSender, mpsc::Receiver<Vec<u8>>) {
        (McpSender(self.shared), self.incoming)
    }
}

impl McpSender {
    /// Sends one JSON-RPC message.
    pub async fn send(&self, message: &[u8]) -> Result<(), SendError> {
        self.0.send(message).await
    }

    /// Ends the session.
    pub fn close(&self, reason: &str) {
        self.0.conn.close(0u32.into(), reason.as_bytes());
    }
}

/// Some randomness for the session id, without another dependency: the connection's
/// stable id and the clock, mixed.
fn rand_u64(conn: &quinn::Connection) -> u64 {
    let t = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos() as u64)
        .unwrap_or(0);
    let mut x = t ^ (conn.stable_id() as u64).rotate_left(32);
    // splitmix64
    x = x.wrapping_add(0x9e37_79b9_7f4a_7c15);
    x = (x ^ (x >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    x ^ (x >> 31)
}

impl Shared {
    async fn write(&self, msg: Control) -> Result<(), SessionError> {
        let mut out = Vec::new();
        msg.encode(&mut out);
        self.control.lock().await.write_all(&out).await.map_err(io)
    }

    async fn subscribe(&self, request_id: u64, ns: Namespace) -> Result<(), SessionError> {
        self.write(Control::Subscribe {
            request_id,
            namespace: ns,
            name: self.role.theirs().to_vec(),
            priority: 0,
            group_order: 1,
            forward: 1,
            filter: abhyasa_wire::moqt::Filter::LargestObject,
            params: vec![],
        })
        .await
    }

    async fn send(&self, message: &[u8]) -> Result<(), SendError> {
        let mut out = self.out.lock().await;
        if let Some(reason) = &out.closed {
            return Err(SendError::Closed(reason.clone()));
        }
        if out.alias.is_none() {
            out.queued.push(message.to_vec());
            return Ok(());
        }
        self.write_object(&mut out, message).await
    }

    /// Writes one object on our track's stream (opening it with its header first).
    async fn write_object(&self, out: &mut Out, message: &[u8]) -> Result<(), SendError> {
        let closed = |e: String| SendError::Closed(e);
        let mut bytes = Vec::new();
        if out.stream.is_none() {
            let stream = self
                .conn
                .open_uni()
                .await
                .map_err(|e| closed(e.to_string()))?;
            SubgroupHeader {
                track_alias: out.alias.unwrap_or(self.role.alias()),
                group: 0,
                subgroup: SubgroupId::Zero,
                priority: 0,
                extensions: false,
                end_of_group: false,
            }
            .encode(&mut bytes);
            out.stream = Some(stream);
        }
        StreamObject {
            object_id_delta: 0,
            extensions: vec![],
            body: ObjectBody::Payload(message.to_vec()),
        }
        .encode(false, &mut bytes);
        let stream = out
            .stream
            .as_mut()
            .ok_or_else(|| closed("no stream".into()))?;
        stream
            .write_all(&bytes)
            .await
            .map_err(|e| closed(e.to_string()))
    }

    async fn control_loop(&self, mut control: ControlReader) -> Result<(), MoqtError> {
        let fail = |_| MoqtError::ProtocolViolation("control stream write failed");
        loop {
            let Some(msg) = control.next().await? else {
                return Ok(());
            };
            match msg {
                Control::PublishNamespace {
                    request_id,
                    namespace,
                    ..
                } if self.role == McpRole::Server => {
                    let valid = namespace.0.len() == 3
                        && namespace.0[0] == b"mcp"
                        && namespace.0[2] == b"control"
                        && self.namespace.lock().await.is_none();
                    if !valid {
                        self.write(Control::PublishNamespaceError {
                            request_id,
                            code: 0x1,
                            reason: "not an MCP control namespace".into(),
                        })
                        .await
                        .map_err(fail)?;
                        continue;
                    }
                    *self.namespace.lock().await = Some(namespace.clone());
                    self.write(Control::PublishNamespaceOk { request_id })
                        .await
                        .map_err(fail)?;
                    self.subscribe(1, namespace).await.map_err(fail)?;
                }
                Control::Subscribe {
                    request_id,
                    namespace,
                    name,
                    ..
                } => {
                    let ours = self.namespace.lock().await.as_ref() == Some(&namespace)
                        && name == self.role.ours();
                    if !ours {
                        self.write(Control::SubscribeError {
                            request_id,
                            code: 0x4,
                            reason: "no such track".into(),
                        })
                        .await
                        .map_err(fail)?;
                        continue;
                    }
                    self.write(Control::SubscribeOk {
                        request_id,
                        track_alias: self.role.alias(),
                        expires: 0,
                        group_order: 1,
                        largest: None,
                        params: vec![],
                    })
                    .await
                    .map_err(fail)?;
                    let mut out = self.out.lock().await;
                    if out.alias.is_none() {
                        out.alias = Some(self.role.alias());
                        for m in std::mem::take(&mut out.queued) {
                            if self.write_object(&mut out, &m).await.is_err() {
                                return Err(MoqtError::ProtocolViolation("data stream failed"));
                            }
                        }
                    }
                }
                Control::SubscribeOk { track_alias, .. } => {
                    *self.inbound.lock().unwrap_or_else(|e| e.into_inner()) = Some(track_alias);
                }
                Control::SubscribeError { reason, .. } => {
                    tracing::warn!(peer = %self.peer, reason, "MCP track refused by the peer");
                    return Err(MoqtError::ProtocolViolation("MCP track refused"));
                }
                Control::Goaway { .. } => {
                    self.conn.close(0u32.into(), b"goaway");
                    return Ok(());
                }
                Control::ClientSetup { .. } | Control::ServerSetup { .. } => {
                    return Err(MoqtError::ProtocolViolation("setup after setup"));
                }
                // Acknowledgements and requests an MCP session does not use.
                _ => {}
            }
        }
    }

    async fn data_loop(&self, tx: mpsc::Sender<Vec<u8>>) {
        while let Ok(mut recv) = self.conn.accept_uni().await {
            let mut buf: Vec<u8> = Vec::new();
            let mut header: Option<SubgroupHeader> = None;
            let mut chunk = vec![0u8; 16 * 1024];
            loop {
                // Take every complete piece in the buffer.
                loop {
                    let decoded = match &header {
                        None => {
                            SubgroupHeader::decode(&buf).map(|h| h.map(|(h, n)| (Some(h), None, n)))
                        }
                        Some(h) => StreamObject::decode(&buf, h.extensions)
                            .map(|o| o.map(|(o, n)| (None, Some(o), n))),
                    };
                    match decoded {
                        Ok(Some((h, o, used))) => {
                            buf.drain(..used);
                            if let Some(h) = h {
                                let expected =
                                    *self.inbound.lock().unwrap_or_else(|e| e.into_inner());
                                if expected.is_some_and(|a| a != h.track_alias) {
                                    self.conn.close(0x3u32.into(), b"unknown track alias");
                                    return;
                                }
                                header = Some(h);
                            }
                            if let Some(StreamObject {
                                body: ObjectBody::Payload(p),
                                ..
                            }) = o
                            {
                                if tx.send(p).await.is_err() {
                                    return;
                                }
                            }
                        }
                        Ok(None) => break,
                        Err(e) => {
                            let code = u32::try_from(e.to_code()).unwrap_or(0x1);
                            self.conn.close(code.into(), e.to_string().as_bytes());
                            return;
                        }
                    }
                }
                if buf.len() > MAX_MESSAGE {
                    self.conn.close(0x3u32.into(), b"MCP message too large");
                    return;
                }
                match recv.read(&mut chunk).await {
                    Ok(Some(n)) => buf.extend_from_slice(&chunk[..n]),
                    _ => break,
                }
            }
        }
    }
}
