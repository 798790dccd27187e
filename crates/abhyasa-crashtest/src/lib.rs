//! The processes the SIGKILL crash tests kill, at named points: custody peers
//! ([`crashpeer`]) and ledger branches and gateway ([`ledgerpeer`]) on real redb stores over
//! UDP on loopback. Not part of what embedders link; the tests live in `tests/`.

#![warn(missing_docs)]

pub mod crashpeer;
mod killpoint;
pub mod ledgerpeer;
