//! How the node reaches a peer: a direct session, or its namespace at a relay.

use abhyasa_moq::{RelaySession, SendError, Session, Track};
use abhyasa_wire::AgentId;

/// The way to one peer.
#[derive(Clone, Debug)]
pub(crate) enum Link {
    /// A direct QUIC session, the peer authenticated by TLS.
    Direct(Session),
    /// Through a relay session: the peer subscribed there to our tracks for it.
    Relayed(RelaySession, AgentId),
}

impl Link {
    /// The peer at the other end.
    pub(crate) fn peer(&self) -> &AgentId {
        match self {
            Link::Direct(s) => s.peer(),
            Link::Relayed(_, p) => p,
        }
    }

    /// The QUIC connection's id (the relay's, for a relayed peer).
    pub(crate) fn stable_id(&self) -> usize {
        match self {
            Link::Direct(s) => s.connection().stable_id(),
            Link::Relayed(r, _) => r.connection().stable_id(),
        }
    }

    /// Whether the connection is still open.
    pub(crate) fn is_open(&self) -> bool {
        match self {
            Link::Direct(s) => s.connection().close_reason().is_none(),
            Link::Relayed(r, _) => r.connection().close_reason().is_none(),
        }
    }

    /// Closes a direct session; a relayed peer's link is only forgotten (the relay session
    /// carries other peers).
    pub(crate) fn close(&self, reason: &str) {
        if let Link::Direct(s) = self {
            s.close(reason);
        }
    }

    /// Sends one group on our `track` for this peer.
    pub(crate) async fn send_group(
        &self,
        track: Track,
        payloads: &[Vec<u8>],
        datagram: bool,
    ) -> Result<(), SendError> {
        match self {
            Link::Direct(s) => s.send_group(track, payloads, datagram).await,
            Link::Relayed(r, p) => r.send_group(p, track, payloads, datagram).await,
        }
    }
}
