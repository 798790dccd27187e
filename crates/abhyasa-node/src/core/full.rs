//! A full disk: how the node finds it (statvfs, the store's own error), what it refuses while
//! full, and how it gives space back.

use super::*;

impl Core {
    /// The error new work gets while the store is full.
    pub(super) fn full_error(&self, cause: &str) -> NodeError {
        NodeError::StoreFull {
            path: self.db_path.clone(),
            free_bytes: free_bytes(&self.db_path),
            cause: cause.to_owned(),
        }
    }

    pub(super) fn refuse_new_work(&self) -> Option<NodeError> {
        self.store_full.as_ref().map(|f| self.full_error(&f.cause))
    }

    /// A commit failed for want of space: the machines go back to what the store holds
    /// (what waited on the commit is answered "store full", or "custody" for an issue the
    /// store already holds), new work is refused, and the next commit waits a backoff.
    /// `false`: the store could not be read back and the node must stop.
    pub(super) async fn store_is_full(
        &mut self,
        cause: String,
        rx: &mut mpsc::Receiver<Command>,
    ) -> bool {
        let backoff = self.full_backoff;
        self.full_backoff = (backoff * 2).min(STORE_FULL_BACKOFF_MAX);
        self.store_full = Some(StoreFull {
            retry_at: tokio::time::Instant::now() + backoff,
            cause: cause.clone(),
        });
        warn!(
            path = %self.db_path.display(),
            free_bytes = ?free_bytes(&self.db_path),
            retry_in_ms = backoff.as_millis() as u64,
            %cause,
            "the store is full: new work is refused until a commit lands"
        );
        self.recover(&cause, rx).await
    }
}

/// The store refused a commit for want of space.
pub(super) struct StoreFull {
    pub(super) retry_at: tokio::time::Instant,
    pub(super) cause: String,
}

/// Whether a failed commit failed for want of space (ENOSPC, or EDQUOT: a quota). The
/// writer reports a failed commit as its error's text, which for an I/O error ends with the
/// OS error number.
pub(super) fn out_of_space(e: &str) -> bool {
    e.contains("(os error 28)") || e.contains("(os error 122)")
}

/// Bytes free for an unprivileged user on the file system holding `path`.
pub(super) fn free_bytes(path: &std::path::Path) -> Option<u64> {
    let dir = path.parent().filter(|d| !d.as_os_str().is_empty())?;
    let s = rustix::fs::statvfs(dir).ok()?;
    Some(s.f_bavail.saturating_mul(s.f_frsize))
}

/// While the store is full, work that needs a commit is refused with `e` (and `None`
/// returned); reads and everything else go on (`Some`).
pub(super) fn refuse_while_full(cmd: Command, e: NodeError) -> Option<Command> {
    match cmd {
        Command::Issue(_, reply, _) => {
            let _ = reply.send(Err(e));
        }
        Command::Deliver(_, _, reply) => {
            let _ = reply.send(Err(e));
        }
        Command::Ledger(c, reply) if !matches!(c, crate::LedgerCommand::Status) => {
            let _ = reply.send(Err(e));
        }
        Command::GatewayDispatch(_, _, _, reply) => {
            let _ = reply.send(Err(e));
        }
        Command::CarriedPermit(_, _, _, _, reply) => {
            let _ = reply.send(Err(e));
        }
        Command::GatewayExecuted(_, _, _, reply) => {
            let _ = reply.send(Err(e));
        }
        Command::OutboxDelivered(_, reply) => {
            let _ = reply.send(Err(e));
        }
        cmd => return Some(cmd),
    }
    None
}
