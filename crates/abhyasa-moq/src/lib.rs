//! Abhyasa over QUIC.
#![warn(missing_docs, unreachable_pub)]

pub mod identity;
