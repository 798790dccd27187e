//! The core's inbox: commands from the `Node` API (issue, ledger, status, dial, …), and the
//! internal messages sessions send (objects, acks, a session up or down).

use super::*;

impl Core {
    /// Handles a batch of commands. Issuing is idempotent on the id: ids the store already
    /// holds (pending or terminal) are answered `Custody` without a new custody, looked up in
    /// one read for the whole batch.
    pub(super) async fn commands(&mut self, batch: Vec<Command>, rx: &mut mpsc::Receiver<Command>) {
        let ids = issued_ids(&batch);
        // Ids the store knows, with the terminal record (and escalation) of those that ended.
        let known: HashMap<abhyasa_wire::ObligationId, abhyasa_store::Known> = if ids.is_empty() {
            Default::default()
        } else {
            // Answered into a oneshot: the core's worker thread is not blocked meanwhile.
            let (tx, known) = tokio::sync::oneshot::channel();
            let asked = self.group.read_then(move |s| {
                let _ = tx.send(s.known(&ids).unwrap_or_default().into_iter().collect());
            });
            match asked {
                Ok(()) => self
                    .serve_while(rx, writer_answer(self.paused_clock, known))
                    .await
                    .unwrap_or_default(),
                Err(_) => Default::default(),
            }
        };
        for cmd in batch {
            match cmd {
                Command::Issue(o, reply, outcome) if known.contains_key(&o.id) => {
                    self.answer_known(o.id, reply, outcome, &known[&o.id]);
                }
                cmd => self.command(cmd).await,
            }
        }
    }

    /// Answers an issue of an id the store knows: `Custody`, and its outcome once it ended
    /// (at once if it has).
    pub(super) fn answer_known(
        &mut self,
        id: abhyasa_wire::ObligationId,
        reply: IssueReply,
        outcome: crate::OutcomeTx,
        known: &abhyasa_store::Known,
    ) {
        let _ = reply.send(Ok(abhyasa_custody::Admission::Custody));
        match known {
            Some(ended) => {
                let _ = outcome.send(ended.clone());
            }
            None => self.outcomes.entry(id).or_default().push(outcome),
        }
    }

    /// Issues `o` into the custodian: answered when its record is durable.
    pub(super) fn issue(
        &mut self,
        o: abhyasa_wire::Obligation,
        reply: IssueReply,
        outcome: crate::OutcomeTx,
    ) {
        let span = info_span!("obligation", id = %o.id, kind = %o.kind(), target = %o.target);
        let id = o.id;
        match self.machine.issue(self.clock.now(), o) {
            Ok(Issued::AlreadyPending) => {
                // Under custody once its first issue's record is durable: an issue of the
                // same id before then is answered with it, never earlier.
                match self.awaiting.get_mut(&id) {
                    Some(first) => first.push(reply),
                    None => {
                        let _ = reply.send(Ok(abhyasa_custody::Admission::Custody));
                    }
                }
                self.outcomes.entry(id).or_default().push(outcome);
            }
            Ok(Issued::New(admission)) => {
                span.in_scope(|| info!(?admission, "issued"));
                self.issued_at.insert(id, self.clock.now());
                // Answered when its record is durable (the Accepted event, or the
                // best-effort terminal record), so many issues share one commit.
                self.awaiting.entry(id).or_default().push(reply);
                self.outcomes.entry(id).or_default().push(outcome);
            }
            Err(e) => {
                let e = match e {
                    IssueRefused::KindNotTaken { peer, kind } => {
                        NodeError::KindNotTaken { peer, kind }
                    }
                    IssueRefused::Issue(e) => NodeError::Issue(e),
                };
                span.in_scope(|| info!(%e, "refused"));
                let _ = reply.send(Err(e));
            }
        }
    }

    pub(super) async fn command(&mut self, cmd: Command) {
        let cmd = match self.refuse_new_work() {
            None => cmd,
            Some(e) => match refuse_while_full(cmd, e) {
                Some(cmd) => cmd,
                None => return,
            },
        };
        let Some(cmd) = self.answer_now(cmd) else {
            return;
        };
        match cmd {
            Command::Issue(o, reply, outcome) => self.issue(o, reply, outcome),
            Command::OutboxDelivered(through, reply) => {
                self.outbox.ops.push(Op::EventsDelivered { through });
                self.outbox.replies.push(reply);
            }
            Command::Dial(path, peer, addr, reply) => {
                // Dialed off the core task; the endpoint lives in the core, so a stopped
                // node releases its socket.
                let endpoint = self.endpoint.clone();
                tokio::spawn(async move {
                    let c = abhyasa_moq::binding::dial(&endpoint, addr, &peer, &path)
                        .await
                        .map_err(|e| NodeError::Binding(e.to_string()));
                    let _ = reply.send(c);
                });
            }
            Command::Attach(peer, tx) => {
                info!(%peer, "reached through another binding");
                self.bindings.insert(peer.clone(), tx);
                // As on a (re)subscription: what is pending for the peer goes now.
                self.machine.attach(self.clock.now(), &peer);
            }
            Command::Profile(peer, profile) => self.machine.set_profile(peer, profile),
            Command::AcksIn(peer, acks) => self.machine.acks_in(self.clock.now(), &peer, acks),
            Command::Block(peer, duration) => {
                self.blocked
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .insert(peer.clone(), Instant::now() + duration);
                if let Some(s) = self.sessions.remove(&peer) {
                    self.machine.session_down(&peer);
                    s.close("link cut");
                    let _ = self.events.send(NodeEvent::PeerDown(peer));
                }
            }
            Command::Ledger(cmd, reply) => {
                let now = self.clock.now();
                let result = match (&mut self.ledger, self.machine.ledger_mut()) {
                    (Some(l), Some(m)) => l.command(m, now, cmd).map_err(NodeError::Ledger),
                    _ => Err(NodeError::NoLedger),
                };
                match result {
                    // A status needs no commit.
                    Ok(LedgerReply::Status(s)) => {
                        let _ = reply.send(Ok(LedgerReply::Status(s)));
                    }
                    // Answered once the step is durable.
                    r => self.ledger_replies.push((reply, r)),
                }
            }
            Command::GatewayDispatch(from, permit, effect, reply) => {
                let (tx, rx) = tokio::sync::oneshot::channel();
                let now = self.clock.now();
                let r = match (&mut self.ledger, self.machine.ledger_mut()) {
                    (Some(l), Some(m)) => l.bound_dispatch(m, now, &from, *permit, effect, tx),
                    _ => Err(NodeError::NoLedger),
                };
                let _ = reply.send(r.map(|()| rx));
            }
            Command::CarriedPermit(credit, effect, gateway, key, reply) => {
                let (tx, rx) = tokio::sync::oneshot::channel();
                let now = self.clock.now();
                let r = match (&mut self.ledger, self.machine.ledger_mut()) {
                    (Some(l), Some(m)) => {
                        l.carried_permit(m, now, credit, effect, &gateway, key, tx)
                    }
                    _ => Err(NodeError::NoLedger),
                };
                let _ = reply.send(r.map(|()| rx));
            }
            Command::GatewayExecuted(payer, key, charge, reply) => {
                let (tx, rx) = tokio::sync::oneshot::channel();
                let r = match (&mut self.ledger, self.machine.ledger_mut()) {
                    (Some(l), Some(m)) => l.bound_executed(m, &payer, key, charge, tx),
                    _ => Err(NodeError::NoLedger),
                };
                let _ = reply.send(r.map(|()| rx));
            }
            Command::Deliver(from, objects, reply) => {
                let ids = self.machine.deliver(self.clock.now(), &from, &objects);
                // Answered after the commit that makes the applies durable, with the acks the
                // receiver releases then (see `release`).
                self.deliveries.push(Delivery {
                    from,
                    ids,
                    acks: HashMap::new(),
                    reply,
                });
            }
            Command::Shutdown(_) => unreachable!("handled in run"),
            Command::Status(_)
            | Command::Outbox(..)
            | Command::Decide(..)
            | Command::Honours(_)
            | Command::Applied(..)
            | Command::GovernedBy(..) => unreachable!("answered by answer_now"),
        }
    }

    /// Handles `first`, then up to `most` more of what is already queued on `irx`.
    pub(super) fn internal_and_queued(
        &mut self,
        first: Internal,
        irx: &mut mpsc::Receiver<Internal>,
        most: usize,
    ) {
        self.internal(first);
        for _ in 0..most {
            match irx.try_recv() {
                Ok(msg) => self.internal(msg),
                Err(_) => break,
            }
        }
    }

    pub(super) fn internal(&mut self, msg: Internal) {
        let t = self.clock.now();
        match msg {
            Internal::Up(link) => {
                let peer = link.peer().clone();
                if is_blocked(&self.blocked, &peer) {
                    link.close("blocked");
                    return;
                }
                // A peer met at a relay does not displace an open direct session with it.
                let direct_open = |l: &Link| matches!(l, Link::Direct(_)) && l.is_open();
                if matches!(link, Link::Relayed(..))
                    && self.sessions.get(&peer).is_some_and(direct_open)
                {
                    return;
                }
                let same = self
                    .sessions
                    .get(&peer)
                    .is_some_and(|l| l.stable_id() == link.stable_id());
                self.sessions.insert(peer.clone(), link);
                self.machine.session_up(&peer);
                if !same {
                    info!(%peer, "session up");
                    let _ = self.events.send(NodeEvent::PeerUp(peer));
                }
            }
            Internal::Unverified(peer, why) => {
                let n = self.unverified.entry(peer.clone()).or_default();
                *n += 1;
                if *n == 1 || n.is_power_of_two() {
                    warn!(%peer, reason = why, dropped = *n, "dropped an object whose signature does not verify");
                }
            }
            Internal::Decided(id, decision) => {
                if !self.machine.decided(t, id, decision) {
                    debug!(obligation = %id, "a policy decision for nothing waiting (a restart?)");
                }
            }
            Internal::Executed(payer, key, charge) => {
                if let Some(m) = self.machine.ledger_mut() {
                    LedgerPart::executed(m, &payer, key, charge);
                }
            }
            Internal::Event(peer, conn, e) => match e {
                SessionEvent::Object { track, payload } => {
                    let track = match track {
                        Track::Obligations => MachineTrack::Obligations,
                        Track::Acks => MachineTrack::Acks,
                        Track::Ledger => MachineTrack::Ledger,
                    };
                    self.machine.handle_object(t, &peer, track, &payload);
                }
                SessionEvent::PeerSubscribed(Track::Obligations) => {
                    // Re-offer pending obligations for this peer now, not at the next slot.
                    self.machine.peer_ready(t, &peer);
                }
                SessionEvent::PeerSubscribed(_) => {}
                SessionEvent::Closed(reason) => {
                    if self
                        .sessions
                        .get(&peer)
                        .is_some_and(|s| s.stable_id() == conn)
                    {
                        self.sessions.remove(&peer);
                        self.machine.session_down(&peer);
                        info!(%peer, reason, "session down");
                        let _ = self.events.send(NodeEvent::PeerDown(peer));
                    }
                }
            },
        }
    }

    /// The status as memory holds it; the stored part (recent records, escalations, what is
    /// honoured, the outbox) left empty for the writer to fill.
    fn status_in_memory(&self) -> Status {
        Status {
            agent: self.agent.clone(),
            at: self.clock.now(),
            pending: self
                .machine
                .custodian()
                .pending()
                .map(|(o, n)| (o.clone(), n))
                .collect(),
            recent: Vec::new(),
            escalations: Vec::new(),
            principal: self.machine.custodian().principal().clone(),
            honours: Default::default(),
            receiver_held: self.machine.receiver().held(),
            applied: Vec::new(),
            peers: self.sessions.keys().cloned().collect(),
            slowed: self.machine.slowed().clone(),
            unverified: self.unverified.clone(),
            sent: self.sent,
            store_full: self.refuse_new_work().map(|e| e.to_string()),
            outbox: 0,
            store_bytes: std::fs::metadata(&self.db_path).ok().map(|m| m.len()),
            applied_total: 0,
            commits: {
                let s = self.group.stats();
                crate::Commits {
                    count: s.commits.load(std::sync::atomic::Ordering::Relaxed),
                    ops: s.ops.load(std::sync::atomic::Ordering::Relaxed),
                    busy: Duration::from_nanos(
                        s.busy_nanos.load(std::sync::atomic::Ordering::Relaxed),
                    ),
                }
            },
        }
    }

    /// Answers `reply` with `f` read on the store's writer, between commits, without waiting
    /// here: a disk that hangs holds that answer (the caller's deadline ends it), never this
    /// loop. If the writer has stopped, `reply` is dropped: the caller hears the node stopped.
    /// Answers at once a command that changes nothing and needs no commit (a decision, a
    /// status, a read of durable state, which runs on the writer between commits); hands back
    /// any other. Also called while a commit is in flight ([`Core::serve_while`]).
    pub(super) fn answer_now(&self, cmd: Command) -> Option<Command> {
        match cmd {
            Command::Status(reply) => {
                // The in-memory part now; the stored part on the writer, between commits (a
                // disk that hangs holds the answer, never this loop). Bounded reads: a status
                // costs the same with a million records kept.
                let mut status = AnswerOnDrop(Some((self.status_in_memory(), reply)));
                let read = self.group.read_then(move |s| {
                    if let Some((status, _)) = status.0.as_mut() {
                        status.recent = s.recent_terminal(crate::STATUS_RECENT).unwrap_or_default();
                        status.escalations = s
                            .recent_escalations(crate::STATUS_RECENT)
                            .unwrap_or_default();
                        status.honours = s.receiver_state().clone();
                        status.applied =
                            s.recent_applied(crate::STATUS_APPLIED).unwrap_or_default();
                        status.outbox = s.outbox_len().unwrap_or_default();
                        status.applied_total = s.apply_log_len().unwrap_or_default();
                    }
                });
                if let Err(e) = read {
                    // Answered from memory alone (the guard, dropped unrun).
                    debug!(%e, "status: the store's writer has stopped");
                }
            }
            Command::Outbox(after, limit, reply) => {
                let read = self.group.read_then(move |s| {
                    let _ = reply.send(s.outbox(after, limit).map_err(NodeError::from));
                });
                if read.is_err() {
                    debug!("outbox: the store's writer has stopped");
                }
            }
            Command::Decide(ask, reply) => self.decide(&ask, reply),
            Command::Honours(reply) => self.read_durable(reply, |s| Ok(s.receiver_state().clone())),
            Command::Applied(ids, reply) => self.read_durable(reply, move |s| {
                ids.into_iter().map(|id| s.is_applied(id)).collect()
            }),
            Command::GovernedBy(key, reply) => {
                self.read_durable(reply, move |s| s.governed_by(&key))
            }
            cmd => return Some(cmd),
        }
        None
    }

    fn read_durable<T: Send + 'static>(
        &self,
        reply: tokio::sync::oneshot::Sender<Result<T, NodeError>>,
        f: impl FnOnce(&Store) -> Result<T, abhyasa_store::StoreError> + Send + 'static,
    ) {
        let read = self.group.read_then(move |s| {
            let _ = reply.send(f(s).map_err(NodeError::from));
        });
        if let Err(e) = read {
            debug!(%e, "read: the store's writer has stopped");
        }
    }
}

/// An answer sent when dropped: filled in on the writer thread if it runs, sent as it stands
/// if the writer has stopped and drops it unrun.
struct AnswerOnDrop<T>(Option<(T, tokio::sync::oneshot::Sender<T>)>);

impl<T> Drop for AnswerOnDrop<T> {
    fn drop(&mut self) {
        if let Some((answer, reply)) = self.0.take() {
            let _ = reply.send(answer);
        }
    }
}

/// The ids a batch of commands issues.
pub(super) fn issued_ids(batch: &[Command]) -> Vec<abhyasa_wire::ObligationId> {
    batch
        .iter()
        .filter_map(|c| match c {
            Command::Issue(o, _, _) => Some(o.id),
            _ => None,
        })
        .collect()
}
