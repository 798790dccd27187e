//! Process plumbing shared by the tests that run `abhyasa` binaries.
#![allow(dead_code)] // Each test binary uses its own subset.

use std::io::{BufRead, BufReader};
use std::net::{SocketAddr, UdpSocket};
use std::path::Path;
use std::process::{Child, Command, Output, Stdio};
use std::sync::mpsc::{self, Receiver};
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

/// A process whose stdout lines can be awaited (the crash-test peers report kill points).
pub struct Watched {
    child: Option<(Child, Receiver<String>)>,
}

impl Watched {
    /// Nothing running yet.
    pub fn none() -> Self {
        Self { child: None }
    }

    /// Starts `cmd` with its stdout piped into a line channel.
    pub fn spawn(&mut self, mut cmd: Command) {
        cmd.stdout(Stdio::piped()).stderr(Stdio::inherit());
        let mut child = cmd.spawn().expect("spawn the peer");
        let stdout = child.stdout.take().expect("piped");
        let (tx, rx) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        self.child = Some((child, rx));
    }

    /// Waits up to `limit` for a line starting with `prefix`.
    pub fn wait_for(&self, prefix: &str, limit: Duration) -> bool {
        let Some((_, rx)) = &self.child else {
            return false;
        };
        let until = Instant::now() + limit;
        while let Some(left) = until.checked_duration_since(Instant::now()) {
            match rx.recv_timeout(left) {
                Ok(line) if line.starts_with(prefix) => return true,
                Ok(_) => {}
                Err(_) => return false,
            }
        }
        false
    }

    /// SIGKILL, and reap.
    pub fn sigkill(&mut self) {
        if let Some((mut child, _)) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

impl Drop for Watched {
    fn drop(&mut self) {
        self.sigkill();
    }
}
