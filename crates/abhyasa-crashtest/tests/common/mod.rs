//! Process plumbing for the crash tests: free ports, and processes whose stdout lines (the
//! kill points they report) can be awaited.
#![allow(dead_code)] // Each test binary uses its own subset.

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc::{self, Receiver};
use std::time::Instant;

#[allow(unused_imports)] // Each test binary uses its own subset.
pub use abhyasa_testkit::free_udp;

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
    pub fn wait_for(&self, prefix: &str, limit: std::time::Duration) -> bool {
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

    /// The exit status if the process has ended (it is then not running), `None` while it runs.
    pub fn exited(&mut self) -> Option<std::process::ExitStatus> {
        let (child, _) = self.child.as_mut()?;
        child.try_wait().ok().flatten()
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
