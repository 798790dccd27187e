//! Process plumbing shared by the tests that run `abhyasa` binaries.
#![allow(dead_code)] // Each test binary uses its own subset.

use std::net::{SocketAddr, UdpSocket};
use std::path::Path;
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

/// Runs `abhyasa` with `args` to completion.
pub fn abhyasa(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_abhyasa"))
        .args(args)
        .output()
        .expect("run abhyasa")
}

/// A free UDP address on loopback.
pub fn free_udp() -> SocketAddr {
    UdpSocket::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
}

/// A free TCP port on loopback.
pub fn free_tcp() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// Polls `f` every 100 ms until it holds; panics after `limit`.
pub fn wait_for(what: &str, limit: Duration, mut f: impl FnMut() -> bool) {
    let until = Instant::now() + limit;
    while Instant::now() < until {
        if f() {
            return;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    panic!("timed out waiting for {what}");
}

/// An `abhyasa node --config <path>` process, SIGKILLed when dropped.
pub struct NodeProc(Child);

impl NodeProc {
    /// Starts a node from its config file.
    pub fn start(config: &Path) -> Self {
        Self(
            Command::new(env!("CARGO_BIN_EXE_abhyasa"))
                .args(["node", "--config"])
                .arg(config)
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .spawn()
                .expect("spawn node"),
        )
    }

    /// SIGTERM: the node lands its commits and closes its store.
    pub fn stop(mut self) {
        let _ = Command::new("kill")
            .args(["-TERM", &self.0.id().to_string()])
            .status();
        let _ = self.0.wait();
    }
}

impl Drop for NodeProc {
    fn drop(&mut self) {
        // `Child::kill` is SIGKILL on Unix: no destructor, no flush, no goodbye.
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}
