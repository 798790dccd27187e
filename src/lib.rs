//! Abhyasa: deliver-or-report custody of governance obligations for agent networks.
//!
//! This facade re-exports the workspace crates:
//!
//! - [`wire`]: the objects that cross process boundaries, as deterministic CBOR;
//! - [`custody`]: the sans-IO custodian and receiver state machines and the kind registry;
//! - [`ledger`]: the sans-IO budget ledger (branches, gateway) and its independent checker;
//! - [`store`]: durable custody state in redb, with group commit and recovery;
//! - [`sim`]: the deterministic simulation that checks them under faults;
//! - [`crashpeer`]: the process that the SIGKILL crash test kills at named points;
//! - [`ledgerpeer`]: the same for the ledger (branch, child, gateway processes);
//! - [`sweep`]: end-to-end sweeps over QUIC through the emulator (CSV and SVG).

#![warn(missing_docs)]

pub mod admin;
pub mod audit;
pub mod crashpeer;
pub mod demo;
mod killpoint;
pub mod ledger_cli;
pub mod ledgerpeer;
pub mod mcp_cli;
pub mod sweep;
pub mod words;

pub use abhyasa_custody as custody;
pub use abhyasa_ledger as ledger;
pub use abhyasa_moq as moq;
pub use abhyasa_node as node;
pub use abhyasa_sim as sim;
pub use abhyasa_store as store;
pub use abhyasa_wire as wire;
