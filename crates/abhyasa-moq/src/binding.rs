//! The port bindings plug into: a MOQT session whose CLIENT_SETUP carries the PATH setup
//! parameter (0x01) is not a custody session but a binding's (MCP-over-MOQT uses `/mcp`).
//! The transport does the setup — TLS with the deployment's certificates, CLIENT_SETUP and
//! SERVER_SETUP — and hands the connection and its control stream, as a [`BoundConnection`],
//! to whichever binding registered that path with [`Ports`]. A connection for a path no one
//! registered is refused. A new binding is one crate that registers one path; this crate
//! knows none of them.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use abhyasa_wire::moqt::{Control, MoqtError};
use abhyasa_wire::AgentId;
use tokio::sync::mpsc;

use crate::setup::{client_setup, read_control, SessionError, SessionLimits};

/// The reason a connection for a path no binding serves is closed with.
pub const NO_BINDING: &str = "no binding serves this path here";

/// How many set-up connections of one path may wait for their binding to take them.
pub const PORT_QUEUE: usize = 64;

/// A connection set up for a binding: the peer authenticated by its certificate, the MOQT
/// setup exchanged, and the control stream (with any bytes read past the setup) handed over.
pub struct BoundConnection {
    path: Vec<u8>,
    peer: AgentId,
    conn: quinn::Connection,
    send: quinn::SendStream,
    control: ControlReader,
}

impl std::fmt::Debug for BoundConnection {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("BoundConnection")
            .field("path", &String::from_utf8_lossy(&self.path))
            .field("peer", &self.peer)
            .finish_non_exhaustive()
    }
}

/// The reading half of a bound connection's control stream: MOQT control messages, one at
/// a time.
pub struct ControlReader {
    recv: quinn::RecvStream,
    buf: Vec<u8>,
}

impl ControlReader {
    /// The next control message; `None` once the peer finished the stream.
    pub async fn next(&mut self) -> Result<Option<Control>, MoqtError> {
        read_control(&mut self.recv, &mut self.buf).await
    }
}

impl BoundConnection {
    pub(crate) fn new(
        path: Vec<u8>,
        peer: AgentId,
        conn: quinn::Connection,
        send: quinn::SendStream,
        recv: quinn::RecvStream,
        buf: Vec<u8>,
    ) -> Self {
        BoundConnection {
            path,
            peer,
            conn,
            send,
            control: ControlReader { recv, buf },
        }
    }

    /// The PATH the client set up with.
    pub fn path(&self) -> &[u8] {
        &self.path
    }

    /// The authenticated peer.
    pub fn peer(&self) -> &AgentId {
        &self.peer
    }

    /// The QUIC connection.
    pub fn connection(&self) -> &quinn::Connection {
        &self.conn
    }

    /// Closes the connection with `reason` (application code 0).
    pub fn close(&self, reason: &str) {
        self.conn.close(0u32.into(), reason.as_bytes());
    }

    /// The parts a binding drives: the peer, the connection, the control stream's sending
    /// half and its reader.
    pub fn into_parts(self) -> (AgentId, quinn::Connection, quinn::SendStream, ControlReader) {
        (self.peer, self.conn, self.send, self.control)
    }
}

/// Dials `addr`, requires the server's certificate to name `expected`, and sets up a
/// session for the binding at `path` as its client.
pub async fn dial(
    endpoint: &quinn::Endpoint,
    addr: std::net::SocketAddr,
    expected: &AgentId,
    path: &[u8],
) -> Result<BoundConnection, SessionError> {
    let grant = SessionLimits::default().max_requests.saturating_mul(2);
    let s = client_setup(endpoint, addr, expected, Some(path), grant, None, &[]).await?;
    Ok(BoundConnection::new(
        path.to_vec(),
        s.peer,
        s.conn,
        s.send,
        s.recv,
        s.buf,
    ))
}

/// Why a path could not be registered.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[non_exhaustive]
pub enum PortError {
    /// Another binding holds the path (its receiver is still open).
    #[error("a binding already serves path {0:?}")]
    Taken(String),
    /// An empty path: a connection without PATH is a custody session.
    #[error("a binding's path must not be empty")]
    Empty,
}

/// Why a bound connection was not handed to a binding.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Unrouted {
    /// No binding registered the path.
    NoBinding,
    /// The binding has [`PORT_QUEUE`] connections waiting already.
    Crowded,
}

impl Unrouted {
    /// The reason's metric label.
    pub fn label(self) -> &'static str {
        match self {
            Unrouted::NoBinding => "no_binding",
            Unrouted::Crowded => "binding_crowded",
        }
    }
}

/// The registry of bindings by path. Cheap to clone; clones share it.
#[derive(Clone, Default)]
pub struct Ports(Arc<Mutex<HashMap<Vec<u8>, mpsc::Sender<BoundConnection>>>>);

impl std::fmt::Debug for Ports {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let map = self.0.lock().unwrap_or_else(|e| e.into_inner());
        f.debug_set()
            .entries(map.keys().map(|k| String::from_utf8_lossy(k).into_owned()))
            .finish()
    }
}

impl Ports {
    /// Registers `path`: connections set up with it arrive on the receiver, in order, up to
    /// [`PORT_QUEUE`] waiting. Dropping the receiver gives the path back.
    pub fn register(&self, path: &[u8]) -> Result<mpsc::Receiver<BoundConnection>, PortError> {
        if path.is_empty() {
            return Err(PortError::Empty);
        }
        let mut map = self.0.lock().unwrap_or_else(|e| e.into_inner());
        if map.get(path).is_some_and(|tx| !tx.is_closed()) {
            return Err(PortError::Taken(String::from_utf8_lossy(path).into_owned()));
        }
        let (tx, rx) = mpsc::channel(PORT_QUEUE);
        map.insert(path.to_vec(), tx);
        Ok(rx)
    }

    /// Whether a binding holds `path` now.
    pub fn serves(&self, path: &[u8]) -> bool {
        let map = self.0.lock().unwrap_or_else(|e| e.into_inner());
        map.get(path).is_some_and(|tx| !tx.is_closed())
    }

    /// Hands `c` to the binding of its path; the connection comes back when none takes it.
    pub fn route(&self, c: BoundConnection) -> Result<(), (Box<BoundConnection>, Unrouted)> {
        let tx = {
            let map = self.0.lock().unwrap_or_else(|e| e.into_inner());
            map.get(c.path()).cloned()
        };
        let Some(tx) = tx else {
            return Err((Box::new(c), Unrouted::NoBinding));
        };
        tx.try_send(c).map_err(|e| match e {
            mpsc::error::TrySendError::Full(c) => (Box::new(c), Unrouted::Crowded),
            mpsc::error::TrySendError::Closed(c) => (Box::new(c), Unrouted::NoBinding),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_path_has_one_binding_until_it_lets_go() {
        let ports = Ports::default();
        assert_eq!(ports.register(b"").unwrap_err(), PortError::Empty);
        let rx = ports.register(b"/mcp").unwrap();
        assert_eq!(
            ports.register(b"/mcp").unwrap_err(),
            PortError::Taken("/mcp".into())
        );
        // Another path is another binding.
        let _other = ports.register(b"/wt").unwrap();
        assert!(ports.serves(b"/mcp") && !ports.serves(b"/other"));
        drop(rx);
        assert!(!ports.serves(b"/mcp"));
        assert!(ports.register(b"/mcp").is_ok());
    }
}
