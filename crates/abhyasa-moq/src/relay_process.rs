//! Runs an unmodified `moq-relay` (the reference relay, an outside process) for the tests and
//! the CLI's fan-out sweep. Feature `moq-relay-process`: an application that embeds the node
//! never spawns one.

/// The `moq-relay` binary the tests and the fan-out sweep run: `$ABHYASA_MOQ_RELAY`, or where
/// `scripts/moq-relay.sh` installs it (`$ABHYASA_CACHE`, default `~/.cache/abhyasa`).
pub fn moq_relay_binary() -> Option<std::path::PathBuf> {
    use std::path::PathBuf;
    if let Some(p) = std::env::var_os("ABHYASA_MOQ_RELAY") {
        return Some(p.into());
    }
    let cache = std::env::var_os("ABHYASA_CACHE")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache/abhyasa")))?;
    let bin = cache.join("moq-relay-0.17.10/bin/moq-relay");
    bin.exists().then_some(bin)
}

/// A `moq-relay` process serving draft-14 on `addr` with `dir`'s `relay.pem` / `relay.key`,
/// letting anyone publish and subscribe under `abhyasa/` (`--auth-public`: the relay reads
/// no client certificate; end-to-end signatures say who sent what). Killed when dropped.
#[derive(Debug)]
pub struct MoqRelayProcess(std::process::Child);

impl MoqRelayProcess {
    /// Starts `bin`.
    pub fn spawn(
        bin: &std::path::Path,
        addr: std::net::SocketAddr,
        dir: &std::path::Path,
    ) -> std::io::Result<Self> {
        use std::process::{Command, Stdio};
        Command::new(bin)
            .arg("--listen")
            .arg(addr.to_string())
            .arg("--listen-tls-cert")
            .arg(dir.join("relay.pem"))
            .arg("--listen-tls-key")
            .arg(dir.join("relay.key"))
            .args(["--listen-version", "moq-transport-14"])
            .args(["--auth-public", "abhyasa/**"])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .map(Self)
    }
}

impl Drop for MoqRelayProcess {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}
