//! What every MOQT session of this crate shares below the session itself: the custody
//! tracks' names, the errors, the limits a peer is held to, and the setup exchange
//! (CLIENT_SETUP / SERVER_SETUP) with the control stream's framing. [`crate::session`],
//! [`crate::binding`], [`crate::relay`] and the data plane build on it; it builds on none of
//! them.

use std::time::Duration;

use abhyasa_wire::moqt::{Control, KeyValue, MoqtError, Namespace, DRAFT_14};
use abhyasa_wire::AgentId;

use crate::endpoint::peer_agent;

/// One of the three tracks a side publishes for its peer.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Track {
    /// `to/<peer>`: obligations.
    Obligations,
    /// `acks/<peer>`: custody acks.
    Acks,
    /// `ledger/<peer>`: ledger objects.
    Ledger,
}

impl Track {
    pub(crate) const ALL: [Track; 3] = [Track::Obligations, Track::Acks, Track::Ledger];

    fn prefix(self) -> &'static str {
        match self {
            Track::Obligations => "to/",
            Track::Acks => "acks/",
            Track::Ledger => "ledger/",
        }
    }

    /// The track name addressed to `peer`.
    pub fn name(self, peer: &AgentId) -> Vec<u8> {
        format!("{}{peer}", self.prefix()).into_bytes()
    }

    pub(crate) fn alias(self) -> u64 {
        match self {
            Track::Obligations => 1,
            Track::Acks => 2,
            Track::Ledger => 3,
        }
    }

    pub(crate) fn parse(name: &[u8]) -> Option<(Track, &[u8])> {
        Track::ALL.into_iter().find_map(|t| {
            name.strip_prefix(t.prefix().as_bytes())
                .map(|rest| (t, rest))
        })
    }
}

/// The namespace an agent publishes under.
pub fn namespace(agent: &AgentId) -> Namespace {
    Namespace::from_strs(&["abhyasa", "v1", agent.as_str()])
}

/// What a session delivers to its owner.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum SessionEvent {
    /// An object on one of the peer's tracks addressed to us: its payload (CBOR).
    Object {
        /// Which track.
        track: Track,
        /// The payload.
        payload: Vec<u8>,
    },
    /// The peer subscribed to our track for it: objects on it now reach the peer.
    PeerSubscribed(Track),
    /// The session ended.
    Closed(String),
}

/// Why a session could not be set up.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum SessionError {
    /// The QUIC connection failed.
    #[error("connection: {0}")]
    Connection(#[from] quinn::ConnectionError),
    /// Dialing failed.
    #[error("connect: {0}")]
    Connect(#[from] quinn::ConnectError),
    /// The peer's certificate names no agent, or not the one dialed.
    #[error("peer identity: {0}")]
    Identity(String),
    /// The peer broke the protocol during setup.
    #[error("protocol: {0}")]
    Protocol(#[from] MoqtError),
    /// Setup took too long.
    #[error("setup timed out")]
    Timeout,
    /// A stream failed.
    #[error("stream: {0}")]
    Stream(String),
    /// The CLIENT_SETUP named a PATH no binding serves here (see [`crate::binding`]).
    #[error("no binding serves path {0:?} here")]
    NoBinding(String),
}

/// Why an object could not be sent.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[non_exhaustive]
pub enum SendError {
    /// The peer has not subscribed to this track (yet): nothing would read it.
    #[error("the peer is not subscribed to {0:?}")]
    NotSubscribed(Track),
    /// The session is closed or the stream failed.
    #[error("session: {0}")]
    Closed(String),
}

/// Session-termination codes of the draft used here.
pub(crate) mod code {
    pub(crate) const NO_ERROR: u32 = 0x0;
    pub(crate) const INTERNAL_ERROR: u32 = 0x1;
    pub(crate) const INVALID_REQUEST_ID: u32 = 0x4;
}

pub(crate) const SETUP_TIMEOUT: Duration = Duration::from_secs(5);
pub(crate) const MAX_CONTROL_BUFFER: usize = 1 << 17;
pub(crate) const MAX_STREAM_BYTES: usize = 2 << 20;

/// The MAX_REQUEST_ID setup parameter (0x02); 0 when absent, so no requests may be sent.
pub(crate) fn max_request_id(params: &[KeyValue]) -> u64 {
    params
        .iter()
        .find_map(|p| match p {
            KeyValue::Int { key: 0x02, value } => Some(*value),
            _ => None,
        })
        .unwrap_or(0)
}

/// What a session holds its peer to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SessionLimits {
    /// Requests (SUBSCRIBE, PUBLISH_NAMESPACE, SUBSCRIBE_NAMESPACE, ...) the peer may make on
    /// one session, which bounds its subscriptions: the Maximum Request ID granted in the
    /// setup, never raised. A request past it closes the session with `TOO_MANY_REQUESTS`
    /// (0x7). An Abhyasa peer makes four per session.
    pub max_requests: u64,
    /// Objects taken from one subgroup stream (one group); the rest of the stream is ignored
    /// (custody re-offers what it carried). An Abhyasa node sends one object per group.
    pub max_objects_per_group: usize,
}

impl Default for SessionLimits {
    fn default() -> Self {
        Self {
            max_requests: 64,
            max_objects_per_group: 64,
        }
    }
}

impl SessionLimits {
    /// The MAX_REQUEST_ID value that lets the peer make `max_requests` requests: ids step by
    /// two from its parity (0 for a client, 1 for a server), and each must be below it.
    pub(crate) fn max_request_id(&self) -> u64 {
        self.max_requests.saturating_mul(2)
    }
}

/// A connection whose MOQT setup is done, as client.
pub(crate) struct ClientSetup {
    pub(crate) conn: quinn::Connection,
    pub(crate) peer: AgentId,
    pub(crate) send: quinn::SendStream,
    pub(crate) recv: quinn::RecvStream,
    pub(crate) buf: Vec<u8>,
    pub(crate) peer_max: u64,
}

/// Dials `addr`, requires the server's certificate to name `expected`, and exchanges
/// CLIENT_SETUP (with the PATH parameter when given) and SERVER_SETUP.
pub(crate) async fn client_setup(
    endpoint: &quinn::Endpoint,
    addr: std::net::SocketAddr,
    expected: &AgentId,
    path: Option<&[u8]>,
    max_request_id: u64,
    client: Option<quinn::ClientConfig>,
    extra: &[KeyValue],
) -> Result<ClientSetup, SessionError> {
    let (conn, peer) = match client {
        // A relay trusted by its own CA or fingerprint: the handshake checked it, and it is
        // known by the name it was dialed as.
        Some(client) => (
            endpoint
                .connect_with(client, addr, expected.as_str())?
                .await?,
            expected.clone(),
        ),
        None => {
            let conn = endpoint.connect(addr, expected.as_str())?.await?;
            let peer = peer_agent(&conn)
                .ok_or_else(|| SessionError::Identity("no agent id in certificate".into()))?;
            if &peer != expected {
                conn.close(code::INTERNAL_ERROR.into(), b"unexpected peer");
                return Err(SessionError::Identity(format!(
                    "dialed {expected}, reached {peer}"
                )));
            }
            (conn, peer)
        }
    };
    let (mut send, mut recv) = conn.open_bi().await?;
    let mut params = Vec::new();
    if let Some(path) = path {
        params.push(KeyValue::Bytes {
            key: 0x01,
            value: path.to_vec(),
        });
    }
    params.push(KeyValue::Int {
        key: 0x02,
        value: max_request_id,
    });
    params.extend_from_slice(extra);
    let mut out = Vec::new();
    Control::ClientSetup {
        versions: vec![DRAFT_14],
        params,
    }
    .encode(&mut out);
    send.write_all(&out)
        .await
        .map_err(|e| SessionError::Stream(e.to_string()))?;
    let mut buf = Vec::new();
    let reply = tokio::time::timeout(SETUP_TIMEOUT, read_control(&mut recv, &mut buf))
        .await
        .map_err(|_| SessionError::Timeout)?;
    if !matches!(reply, Ok(Some(Control::ServerSetup { .. }))) {
        // A server that refused the setup closed the connection saying why.
        if let Some(reason) = conn.close_reason() {
            return Err(SessionError::Connection(reason));
        }
    }
    let peer_max = check_setup(&conn, reply, false)?;
    Ok(ClientSetup {
        conn,
        peer,
        send,
        recv,
        buf,
        peer_max,
    })
}

/// Checks the peer's setup message (CLIENT_SETUP from a client, SERVER_SETUP from a server)
/// and returns its Maximum Request ID; anything else closes the session with the draft's code.
pub(crate) fn check_setup(
    conn: &quinn::Connection,
    setup: Result<Option<Control>, MoqtError>,
    from_client: bool,
) -> Result<u64, SessionError> {
    let checked = match setup {
        Ok(Some(Control::ClientSetup { versions, params })) if from_client => {
            if versions.contains(&DRAFT_14) {
                Ok(max_request_id(&params))
            } else {
                Err(MoqtError::VersionNegotiationFailed)
            }
        }
        Ok(Some(Control::ServerSetup { version, params })) if !from_client => {
            if version == DRAFT_14 {
                Ok(max_request_id(&params))
            } else {
                Err(MoqtError::VersionNegotiationFailed)
            }
        }
        Ok(_) if from_client => Err(MoqtError::ProtocolViolation("expected CLIENT_SETUP")),
        Ok(_) => Err(MoqtError::ProtocolViolation("expected SERVER_SETUP")),
        Err(e) => Err(e),
    };
    checked.map_err(|e| {
        close_with(conn, &e);
        e.into()
    })
}

/// Reads one control message, buffering partial input in `buf`. `Ok(None)`: the stream ended.
pub(crate) async fn read_control(
    recv: &mut quinn::RecvStream,
    buf: &mut Vec<u8>,
) -> Result<Option<Control>, MoqtError> {
    loop {
        if let Some((msg, used)) = Control::decode(buf)? {
            buf.drain(..used);
            return Ok(Some(msg));
        }
        if buf.len() > MAX_CONTROL_BUFFER {
            return Err(MoqtError::ProtocolViolation("control message too large"));
        }
        let mut chunk = [0u8; 4096];
        match recv.read(&mut chunk).await {
            Ok(Some(n)) => buf.extend_from_slice(&chunk[..n]),
            Ok(None) => {
                return if buf.is_empty() {
                    Ok(None)
                } else {
                    Err(MoqtError::ProtocolViolation(
                        "control stream ended inside a message",
                    ))
                }
            }
            Err(_) => return Ok(None),
        }
    }
}

pub(crate) fn close_with(conn: &quinn::Connection, e: &MoqtError) {
    let code = u32::try_from(e.to_code()).unwrap_or(code::INTERNAL_ERROR);
    conn.close(code.into(), e.to_string().as_bytes());
}
