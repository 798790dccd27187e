//! While the core waits on the store's writer (a commit, maintenance, the batch's look-up of
//! known ids), it goes on answering the commands that need no commit: decisions, which nginx,
//! an authorization server or an operator ask and a slow or hung disk must not hold; status;
//! reads of durable state (queued on the writer behind the commit). Every other command is put
//! off, in its order, until the wait ends.
//!
//! During a commit it also takes what the sessions bring (objects, sessions up and down, policy
//! answers): the machines handle them and hand out their records, which the next commit
//! carries — the core's work overlaps the disk's instead of following it. The machines allow
//! it: nothing they release waits on a record before its commit is reported (the simulation
//! drives them the same way, with commits queued behind a disk's latency). If the commit's
//! outcome is unknown, the machines are reloaded from the store and what they handled
//! meanwhile is lost as a lost message is: custody re-sends what was not acknowledged.

use std::collections::VecDeque;
use std::future::Future;

use super::*;

/// Most commands put off during one wait. Past it the command channel is left to fill and its
/// senders wait, each with its own deadline ([`crate::Limits::answer_within`]).
const PUT_OFF_MAX: usize = 4_096;

/// Commands put off while the core waited on the writer, and whether the command channel
/// closed meanwhile.
#[derive(Default)]
pub(super) struct PutOff {
    queue: VecDeque<Command>,
    closed: bool,
}

impl PutOff {
    /// The next command put off; `Some(None)` once they are all taken and the channel has
    /// closed (the node's handle was dropped).
    pub(super) fn next(&mut self) -> Option<Option<Command>> {
        match self.queue.pop_front() {
            Some(cmd) => Some(Some(cmd)),
            None if self.closed => Some(None),
            None => None,
        }
    }
}

impl Core {
    /// Awaits `work` (the writer's answer) while answering the commands that need no commit
    /// and putting off the others.
    pub(super) async fn serve_while<F: Future>(
        &mut self,
        rx: &mut mpsc::Receiver<Command>,
        work: F,
    ) -> F::Output {
        self.serve_and_take_while(rx, None, work).await
    }

    /// [`Self::serve_while`] over a commit: the sessions' messages on `irx` are handled too
    /// (see the module's note), their records left for the next commit.
    pub(super) async fn serve_and_take_while<F: Future>(
        &mut self,
        rx: &mut mpsc::Receiver<Command>,
        mut irx: Option<&mut mpsc::Receiver<Internal>>,
        work: F,
    ) -> F::Output {
        tokio::pin!(work);
        loop {
            let take = !self.put_off.closed && self.put_off.queue.len() < PUT_OFF_MAX;
            tokio::select! {
                biased;
                out = &mut work => return out,
                cmd = rx.recv(), if take => match cmd {
                    Some(cmd) => {
                        if let Some(cmd) = self.answer_now(cmd) {
                            self.put_off.queue.push_back(cmd);
                        }
                    }
                    None => self.put_off.closed = true,
                },
                Some(msg) = recv_some(&mut irx) => {
                    self.took_meanwhile = true;
                    if let Some(irx) = irx.as_deref_mut() {
                        self.internal_and_queued(msg, irx, 1_024);
                    }
                }
            }
        }
    }
}

/// The next message on `irx`; `None` at once (the branch off) when there is none to take
/// from.
async fn recv_some(irx: &mut Option<&mut mpsc::Receiver<Internal>>) -> Option<Internal> {
    match irx {
        Some(irx) => irx.recv().await,
        None => None,
    }
}
