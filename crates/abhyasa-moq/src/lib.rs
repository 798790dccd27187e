//! Abhyasa over QUIC: deployment identities and mutual TLS ([`identity`]), the QUIC endpoint
//! with settings for lossy low-latency links ([`endpoint`]), and a MOQT draft-14 session that
//! carries the custody track layout ([`session`]); other bindings' sessions (MCP-over-MOQT)
//! are set up here and handed to whoever registered their path ([`binding`]).
//!
//! ```text
//!  agent A (namespace abhyasa/v1/A)                      agent B (namespace abhyasa/v1/B)
//!   to/B  ─ SUBGROUP streams (one group per flush) ─────▶ subscribed by B (cert says B)
//!   acks/B ◀──────────────────────────────────────────── acks/A published by B ... and so on
//! ```

#![warn(missing_docs, unreachable_pub)]

pub mod binding;
mod dataplane;
pub mod endpoint;
pub mod identity;
#[cfg(feature = "impair")]
pub mod impaired;
pub mod relay;
#[cfg(feature = "moq-relay-process")]
pub mod relay_process;
pub mod session;
pub(crate) mod setup;
pub mod signed;

pub use binding::{BoundConnection, ControlReader, PortError, Ports, Unrouted};
#[cfg(feature = "impair")]
pub use endpoint::impaired_endpoint;
pub use endpoint::{
    endpoint, peer_agent, relay_client_config, Congestion, EndpointError, RelayTrust,
    TransportSettings,
};
pub use identity::{agent_of, read_certificate, Ca, Identity, IdentityError};
#[cfg(feature = "impair")]
pub use impaired::ImpairmentHandle;
pub use relay::{RelayEvent, RelaySession};
#[cfg(feature = "moq-relay-process")]
pub use relay_process::{moq_relay_binary, MoqRelayProcess};
pub use session::{
    namespace, Accepted, SendError, Session, SessionError, SessionEvent, SessionLimits, Track,
};
pub use signed::{
    certificate_key, certified_keys, CertifiedKeys, Kind as SignedKind, Opened, SignedError,
    Signer, Verifier,
};
