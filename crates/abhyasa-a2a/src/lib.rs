//! The A2A binding of Abhyasa custody (custody paper §5; shapes in docs/A2A.md).
//!
//! - [`card`]: the AgentCard with the one Abhyasa extension (`capabilities.extensions[]`), its
//!   per-kind profiles and the retry rule they must satisfy.
//! - [`server`]: the node's HTTPS face, mutually authenticated with the deployment CA: the card
//!   at `/.well-known/agent-card.json`, one obligation endpoint per kind (CBOR or the
//!   reference's JSON, into the node's receiver; `200` and the CustodyAck once the apply is
//!   durable, `503` when it could not be made durable in time, `202` only for a best-effort
//!   kind, which is never acked — where the reference's `202` means "the ack comes later":
//!   docs/A2A.md) and the custody-ack endpoint (asynchronous acks, into
//!   the node's custodian). The issuer of an obligation and the sender of an ack are the
//!   authenticated client, never a field.
//! - [`client`]: a custodian reaching a peer over this binding: it fetches and validates the
//!   peer's card, then POSTs every object custody sends the peer (first attempts, retries and
//!   re-offers alike) to the endpoint of its kind; acks go back into custody. What fails to
//!   arrive is retried by custody and escalated at its deadline, exactly as on MOQT.
//! - [`json`]: the reference's JSON obligation and ack.

#![warn(missing_docs)]

pub mod card;
pub mod client;
pub mod json;
pub mod server;
mod tls;

pub use card::{AgentCard, CardError, CardSettings, KindProfile, EXTENSION_URI};
pub use client::{spawn_peer, A2aPeer};
pub use server::{serve, A2aServer};

/// Why the binding could not start or carry on.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum A2aError {
    /// TLS configuration was refused.
    #[error("TLS: {0}")]
    Tls(#[from] rustls::Error),
    /// The client-certificate verifier could not be built.
    #[error("client verifier: {0}")]
    Verifier(#[from] rustls::server::VerifierBuilderError),
    /// A socket error.
    #[error("{0}")]
    Io(#[from] std::io::Error),
    /// An HTTP client error.
    #[error("HTTP: {0}")]
    Http(#[from] reqwest::Error),
    /// The peer's card is not usable.
    #[error("card: {0}")]
    Card(#[from] CardError),
    /// The node stopped.
    #[error("node: {0}")]
    Node(#[from] abhyasa_node::NodeError),
}
