//! `[policy]`: the agent's own judgement on what it is asked to do. Before this node applies
//! an obligation it runs a command of the operator's choosing with the obligation as JSON on
//! standard input; the command's exit status decides:
//!
//! | exit | decision |
//! |---|---|
//! | 0 | apply |
//! | 1 | decline, with the first line of standard output as the agent's own reason |
//! | anything else, a signal, no start, or no answer within `timeout_ms` | defer |
//!
//! A deferral keeps custody with the principal's custodian, which offers the obligation again
//! later (and asks the command again); past its deadline the obligation escalates and the
//! principal's safe action stands. So a command that hangs or fails never applies anything and
//! never loses anything.

use std::path::PathBuf;
use std::process::Stdio;
use std::time::Duration;

use abhyasa_node::{Policy, PolicyDecision as Decision};
use abhyasa_wire::{Obligation, Payload};
use serde::Deserialize;
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use tracing::{info, warn};

/// Exit status of a command that declines.
pub const EXIT_DECLINE: i32 = 1;

/// `[policy]` in a node's configuration.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PolicySection {
    /// The executable (run directly, no shell).
    pub command: PathBuf,
    /// Its arguments.
    #[serde(default)]
    pub args: Vec<String>,
    /// How long it may take before the obligation is deferred, ms.
    #[serde(default = "default_timeout_ms")]
    pub timeout_ms: u64,
}

fn default_timeout_ms() -> u64 {
    5_000
}

/// The JSON a policy command reads: the obligation, ids as text, times in Unix ms.
pub fn obligation_json(o: &Obligation) -> serde_json::Value {
    serde_json::json!({
        "obligation_id": o.id.to_string(),
        "kind": o.kind().as_str(),
        "issuer": o.issuer.as_str(),
        "target": o.target.as_str(),
        "created_at_ms": o.created_at.0,
        "deadline_ms": o.deadline.0,
        "max_retries": o.max_retries,
        "sequence": o.sequence,
        "payload": payload_json(&o.payload),
    })
}

fn payload_json(p: &Payload) -> serde_json::Value {
    serde_json::to_value(p).unwrap_or(serde_json::Value::Null)
}

impl PolicySection {
    /// Checks what can be checked before the node starts: the command exists and is
    /// executable, the timeout is positive.
    pub fn check(&self) -> Result<(), String> {
        use std::os::unix::fs::PermissionsExt as _;
        let meta = std::fs::metadata(&self.command)
            .map_err(|e| format!("[policy] command {}: {e}", self.command.display()))?;
        if !meta.is_file() || meta.permissions().mode() & 0o111 == 0 {
            return Err(format!(
                "[policy] command {} is not an executable file",
                self.command.display()
            ));
        }
        if self.timeout_ms == 0 {
            return Err("[policy] timeout_ms must be > 0".into());
        }
        Ok(())
    }

    /// The node's policy: the command, run once per obligation.
    pub fn policy(&self) -> Policy {
        let hook = CommandHook {
            command: self.command.clone(),
            args: self.args.clone(),
        };
        // The node's own timeout defers; the child is killed when its future is dropped.
        Policy::new(move |o| {
            let hook = hook.clone();
            async move { hook.decide(&o).await }
        })
        .timeout(Duration::from_millis(self.timeout_ms))
    }
}

/// One executable asked about each obligation.
#[derive(Clone, Debug)]
struct CommandHook {
    command: PathBuf,
    args: Vec<String>,
}

impl CommandHook {
    async fn decide(&self, o: &Obligation) -> Decision {
        let mut child = match tokio::process::Command::new(&self.command)
            .args(&self.args)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .kill_on_drop(true)
            .spawn()
        {
            Ok(c) => c,
            Err(e) => {
                warn!(command = %self.command.display(), %e, obligation = %o.id,
                    "the policy command did not start: deferred");
                return Decision::Defer;
            }
        };
        let input = format!("{}\n", obligation_json(o));
        if let Some(mut stdin) = child.stdin.take() {
            // A command that does not read its input still decides by its exit status.
            let _ = stdin.write_all(input.as_bytes()).await;
            let _ = stdin.shutdown().await;
        }
        let mut out = Vec::new();
        if let Some(mut stdout) = child.stdout.take() {
            // At most a little: a reason is one short line.
            let _ = (&mut stdout).take(4_096).read_to_end(&mut out).await;
        }
        let status = match child.wait().await {
            Ok(s) => s,
            Err(e) => {
                warn!(%e, obligation = %o.id, "the policy command could not be waited on: deferred");
                return Decision::Defer;
            }
        };
        let decision = decision_of(status.code(), &out);
        info!(obligation = %o.id, kind = %o.kind().as_str(), code = ?status.code(), ?decision,
            "policy command decided");
        decision
    }
}

/// The decision an exit status (`None`: killed by a signal) and standard output stand for.
pub fn decision_of(code: Option<i32>, stdout: &[u8]) -> Decision {
    match code {
        Some(0) => Decision::Apply,
        Some(EXIT_DECLINE) => {
            let text = String::from_utf8_lossy(stdout);
            let first = text.lines().map(str::trim).find(|l| !l.is_empty());
            Decision::Decline(abhyasa_wire::Detail::lossy(
                first.unwrap_or("declined by the agent's policy"),
            ))
        }
        _ => Decision::Defer,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exit_statuses_decide_and_the_reason_is_the_first_line_cut_to_size() {
        assert_eq!(decision_of(Some(0), b"ignored"), Decision::Apply);
        assert_eq!(
            decision_of(Some(1), b"\n  the user pinned this supplier  \nmore\n"),
            Decision::Decline(abhyasa_wire::Detail::new("the user pinned this supplier").unwrap())
        );
        assert_eq!(
            decision_of(Some(1), b""),
            Decision::Decline(abhyasa_wire::Detail::new("declined by the agent's policy").unwrap())
        );
        let long = "x".repeat(1_000);
        let Decision::Decline(d) = decision_of(Some(1), long.as_bytes()) else {
            panic!("a decline");
        };
        assert_eq!(d.as_str().len(), abhyasa_wire::Detail::MAX_LEN);
        for code in [Some(2), Some(75), Some(-1), None] {
            assert_eq!(decision_of(code, b"apply"), Decision::Defer, "{code:?}");
        }
    }
}
