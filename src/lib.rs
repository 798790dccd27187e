//! Abhyasa: deliver-or-report custody of governance obligations for agent networks.
//!
//! This facade re-exports the workspace crates:
//!
//! - [`wire`]: the objects that cross process boundaries, as deterministic CBOR;
//! - [`custody`]: the sans-IO custodian and receiver state machines and the kind registry;
//! - [`sim`]: the deterministic simulation that checks them under faults.

#![warn(missing_docs)]

pub use abhyasa_custody as custody;
pub use abhyasa_sim as sim;
pub use abhyasa_wire as wire;
