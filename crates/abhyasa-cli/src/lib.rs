//! The `abhyasa` command: `node`, `demo`, `issue`, `status`, `check`, `card`, `mcp`,
//! `ledger`, `netem`, `certs` and the sweeps. The root package's `abhyasa` binary is
//! [`main`]; embedders link the crates it drives, not this one.

#![warn(missing_docs)]

pub mod admin;
pub mod adversary;
pub mod audit;
mod cli;
pub mod demo;
mod demo_nginx;
pub mod fanout;
pub mod ledger_cli;
mod ledger_cmd;
pub mod mcp_cli;
pub mod operator;
pub mod policy;
pub mod soak;
pub mod sweep;

pub use cli::{check_config_text, main};

/// A free loopback UDP address, for the nodes the demo, the sweeps and the soak start.
pub(crate) fn free_addr() -> std::io::Result<std::net::SocketAddr> {
    std::net::UdpSocket::bind("127.0.0.1:0")?.local_addr()
}
