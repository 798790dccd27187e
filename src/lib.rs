//! Abhyasa: deliver-or-report custody of governance obligations and budget conservation for
//! agent networks.
//!
//! This facade re-exports what an embedder links:
//!
//! - [`wire`]: the objects that cross process boundaries, as deterministic CBOR, and how to
//!   say them in words;
//! - [`custody`]: the sans-IO custodian and receiver state machines and the kind registry;
//! - [`ledger`]: the sans-IO budget ledger (branches, gateway) and its independent checker;
//! - [`store`]: durable custody and ledger state in redb, with group commit and recovery;
//! - [`moq`]: certificates, the QUIC endpoint and the MOQT session;
//! - [`machine`]: the node's own decisions around those machines, sans-IO;
//! - [`node`]: the runtime that drives them — the `Node` an application embeds;
//! - `netem` (feature `impair`, on with the default `cli`): packet impairment in userspace,
//!   for tests and benchmarks under loss;
//! - [`mcp`], [`a2a`]: the MCP and A2A bindings;
//! - [`enforce`]: the enforcement points (RFC 7662 introspection, RFC 7009 revocation, the
//!   nginx `auth_request` / Envoy `ext_authz` check) answered from the principal's decisions.
//!
//! The `abhyasa` command lives in `abhyasa-cli`, the simulation in `abhyasa-sim`, and the
//! processes the crash tests kill in `abhyasa-crashtest`.

#![warn(missing_docs)]

pub use abhyasa_a2a as a2a;
pub use abhyasa_custody as custody;
pub use abhyasa_enforce as enforce;
pub use abhyasa_ledger as ledger;
pub use abhyasa_machine as machine;
pub use abhyasa_mcp as mcp;
pub use abhyasa_moq as moq;
#[cfg(feature = "impair")]
pub use abhyasa_netem as netem;
pub use abhyasa_node as node;
pub use abhyasa_store as store;
pub use abhyasa_wire as wire;
