//! The core task and the session plumbing around it.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use abhyasa_machine::{
    IssueRefused, Issued, MachineConfig, MachineEvent, NodeMachine, Record, Route,
    Track as MachineTrack,
};
use abhyasa_moq::{
    Accepted, RelayEvent, RelaySession, Session, SessionEvent, SignedKind, Signer, Track, Verifier,
};

use crate::link::Link;
use abhyasa_store::{GroupCommit, GroupError, Op, Store};
use abhyasa_wire::{decode, AgentId, CustodyAck, UnixMillis};
use tokio::sync::{broadcast, mpsc};
use tracing::{debug, info, info_span, warn};

use crate::ledger::{LedgerPart, LedgerReply};
use crate::{Command, Node, NodeBuilder, NodeError, NodeEvent, Status};
mod clock;
mod commands;
mod full;
mod inflight;
mod sessions;
pub(crate) use clock::Clock;
use full::{free_bytes, out_of_space, refuse_while_full, StoreFull};
pub(crate) use sessions::Checks;
use sessions::{forward, forward_relay, watch_for_stall, SessionsPerPeer};

type Blocked = Arc<Mutex<HashMap<AgentId, Instant>>>;

pub(crate) enum Internal {
    Up(Link),
    Event(AgentId, usize, SessionEvent),
    /// An object from this session peer whose signature did not verify, and why.
    Unverified(AgentId, String),
    /// The executor ran an accepted effect.
    Executed(AgentId, abhyasa_ledger::OpKey, abhyasa_ledger::Vector),
    /// The receiver policy decided on an obligation it was asked about.
    Decided(abhyasa_wire::ObligationId, crate::PolicyDecision),
}

/// QUIC connections at once in their handshake or MOQT setup; past it the oldest is closed for
/// the new one. (QUIC takes no descriptor per connection: this bounds memory and work.)
pub const MAX_SETUPS: usize = 256;
/// How long an accepted QUIC connection has for its handshake and MOQT setup.
pub const SETUP_DEADLINE: Duration = Duration::from_secs(10);

const STORE_FULL_BACKOFF_MIN: Duration = Duration::from_millis(250);
const STORE_FULL_BACKOFF_MAX: Duration = Duration::from_secs(30);

/// The writer thread's answer: awaited in place, or — on a paused test clock — from the
/// blocking pool, which holds the paused clock still while the writer works.
async fn writer_answer<T: Send + 'static>(
    paused_clock: bool,
    rx: tokio::sync::oneshot::Receiver<T>,
) -> Option<T> {
    if paused_clock {
        tokio::task::spawn_blocking(move || rx.blocking_recv().ok())
            .await
            .ok()
            .flatten()
    } else {
        rx.await.ok()
    }
}

fn is_blocked(blocked: &Blocked, peer: &AgentId) -> bool {
    let map = blocked.lock().unwrap_or_else(|e| e.into_inner());
    map.get(peer).is_some_and(|until| Instant::now() < *until)
}

pub(crate) async fn start(b: NodeBuilder, db_path: PathBuf) -> Result<Node, NodeError> {
    let agent = b.identity.agent.clone();
    // End-to-end signatures: everything custody sends is signed with the certificate's key,
    // and nothing custody receives is acted on unless it verifies (`abhyasa_moq::signed`).
    let signer = Arc::new(Signer::new(&b.identity)?);
    let metrics = crate::metrics::NodeMetrics::default();
    let verifier = Arc::new(Checks {
        objects: Verifier::new(b.identity.ca.clone()),
        ledger: b.ledger.as_ref().map(|l| l.keys.clone()),
    });
    let open = {
        let (path, config, backend) = (db_path.clone(), b.store.clone(), b.backend.clone());
        move || match &backend {
            Some(open) => open(config.clone()),
            None => Store::open(&path, config.clone()),
        }
    };
    let store = open()?;
    let clock = Clock::start();
    let t = clock.now();
    let seed = t.0 ^ 0x9e37_79b9_7f4a_7c15;
    let custodian = store.recover_custodian(agent.clone(), b.custodian.clone(), seed, t)?;
    let receiver_config = abhyasa_custody::ReceiverConfig {
        ask_policy: b.receiver.ask_policy || b.policy.is_some(),
        ..b.receiver.clone()
    };
    let receiver = store.recover_receiver(agent.clone(), receiver_config.clone())?;
    let (ledger, ledger_machine) = match b.ledger.clone() {
        Some(setup) => {
            let (part, machine) = LedgerPart::recover(&agent, signer.key().clone(), setup, &store)?;
            (Some(part), Some(machine))
        }
        None => (None, None),
    };
    // `..default()` fills the `mutation` field the `mutants` feature adds (none otherwise).
    #[allow(clippy::needless_update)]
    let machine = NodeMachine::new(
        t,
        MachineConfig {
            requests_per_second_per_peer: b.limits.requests_per_second_per_peer,
            maintenance_ms: u64::try_from(b.maintenance.as_millis()).unwrap_or(u64::MAX),
            batch: b.limits.session.max_objects_per_group.clamp(1, MAX_BATCH),
            ..MachineConfig::default()
        },
        custodian,
        receiver,
        ledger_machine,
    );
    let group = GroupCommit::spawn(store, b.group, open);
    #[cfg(feature = "impair")]
    let (endpoint, impairment) = match b.impairment.clone() {
        None => (
            abhyasa_moq::endpoint(&b.identity, b.listen, &b.transport)?,
            None,
        ),
        Some((spec, seed)) => {
            let (e, h) =
                abhyasa_moq::impaired_endpoint(&b.identity, b.listen, &b.transport, spec, seed)?;
            (e, Some(h))
        }
    };
    #[cfg(not(feature = "impair"))]
    let endpoint = abhyasa_moq::endpoint(&b.identity, b.listen, &b.transport)?;
    let local_addr = endpoint
        .local_addr()
        .map_err(abhyasa_moq::EndpointError::Bind)?;
    let (tx, rx) = mpsc::channel(1_024);
    let (itx, irx) = mpsc::channel(16_384);
    let (events, _) = broadcast::channel(16_384);
    let blocked: Blocked = Arc::default();
    // Bindings' sessions (a CLIENT_SETUP with a PATH) go to whoever registered the path
    // (`Node::port`).
    let ports = abhyasa_moq::Ports::default();

    // Accept loop.
    {
        let (endpoint, itx, me, blocked, ports) = (
            endpoint.clone(),
            itx.clone(),
            agent.clone(),
            blocked.clone(),
            ports.clone(),
        );
        let limits = b.limits;
        let per_peer = SessionsPerPeer::default();
        let verifier = verifier.clone();
        // Connections in their handshake or MOQT setup: capped (the oldest closed for a new
        // one) and each given SETUP_DEADLINE, so connections that never finish their setup
        // (a stranger's stalled handshake, a member that never sends CLIENT_SETUP or never
        // reads SERVER_SETUP) hold nothing for long and crowd out no one.
        let waiting = crate::listen::Waiting::new(MAX_SETUPS);
        let accept_metrics = metrics.clone();
        tokio::spawn(async move {
            while let Some(incoming) = endpoint.accept().await {
                let (itx, me, blocked) = (itx.clone(), me.clone(), blocked.clone());
                let verifier = verifier.clone();
                let (ports, per_peer) = (ports.clone(), per_peer.clone());
                let (setup_id, w) = (waiting.next_id(), waiting.clone());
                let metrics = accept_metrics.clone();
                let remote = incoming.remote_address();
                // The task ends with the setup (a session's forwarding runs on a task of its
                // own), so closing a waiting setup never touches a running session.
                let task = tokio::spawn(async move {
                    let setup = tokio::time::timeout(
                        SETUP_DEADLINE,
                        Session::accept_any_with(incoming, &me, limits.session, &ports),
                    )
                    .await;
                    w.done(setup_id);
                    let Ok(setup) = setup else {
                        debug!(%remote, deadline_ms = SETUP_DEADLINE.as_millis() as u64, "session setup not done by its deadline: closed");
                        metrics.refused("setup_deadline");
                        return;
                    };
                    match setup {
                        Ok(Accepted::Custody(s, rx)) if is_blocked(&blocked, s.peer()) => {
                            drop(rx);
                            s.close("blocked");
                            metrics.refused("blocked");
                        }
                        Ok(Accepted::Custody(s, rx)) => {
                            per_peer.admit(
                                s.peer(),
                                s.connection(),
                                limits.sessions_per_peer,
                                &metrics,
                            );
                            tokio::spawn(forward(s, rx, itx, verifier));
                        }
                        Ok(Accepted::Bound(c)) if is_blocked(&blocked, c.peer()) => {
                            c.close("blocked");
                            metrics.refused("blocked");
                        }
                        Ok(Accepted::Bound(c)) => {
                            per_peer.admit(
                                c.peer(),
                                c.connection(),
                                limits.sessions_per_peer,
                                &metrics,
                            );
                            let path = String::from_utf8_lossy(c.path()).into_owned();
                            match ports.route(c) {
                                Ok(()) => info!(%path, "binding session up"),
                                Err((c, why)) => {
                                    debug!(peer = %c.peer(), %path, reason = why.label(), "binding session refused");
                                    c.close(match why {
                                        abhyasa_moq::Unrouted::NoBinding => {
                                            abhyasa_moq::binding::NO_BINDING
                                        }
                                        abhyasa_moq::Unrouted::Crowded => {
                                            "too many sessions wait for this binding"
                                        }
                                    });
                                    metrics.refused(why.label());
                                }
                            }
                        }
                        Err(e @ abhyasa_moq::SessionError::NoBinding(_)) => {
                            debug!(%e, "binding session refused");
                            metrics.refused(abhyasa_moq::Unrouted::NoBinding.label());
                        }
                        Err(e) => {
                            debug!(%e, "session setup failed");
                            metrics.refused("setup_failed");
                        }
                    }
                });
                let crowded = waiting.admit(setup_id, task.abort_handle());
                for _ in 0..crowded {
                    accept_metrics.refused("setup_crowded");
                }
                if crowded > 0 {
                    debug!(
                        limit = MAX_SETUPS,
                        "connections in setup at the limit: the oldest closed"
                    );
                }
            }
        });
    }
    // Dial loops.
    for (peer, addr) in b.peers.clone() {
        let (endpoint, itx, me, blocked) = (
            endpoint.clone(),
            itx.clone(),
            agent.clone(),
            blocked.clone(),
        );
        let stall = b.transport.stall_redial;
        let session_limits = b.limits.session;
        let verifier = verifier.clone();
        tokio::spawn(async move {
            let mut backoff = Duration::from_millis(50);
            let mut failures = 0u32;
            let dial = async {
                loop {
                    if !is_blocked(&blocked, &peer) {
                        // While a link is down, short attempts: a handshake's own Initial
                        // retransmissions back off too, so a fresh attempt after a partition
                        // gets through sooner than a long one still waiting.
                        let attempt = match (stall, failures) {
                            (Some(_), 0..SHORT_ATTEMPTS) => DIAL_ATTEMPT_SHORT,
                            _ => DIAL_ATTEMPT_LONG,
                        };
                        match tokio::time::timeout(
                            attempt,
                            Session::connect_with(&endpoint, addr, &peer, &me, session_limits),
                        )
                        .await
                        {
                            Ok(Ok((s, rx))) => {
                                backoff = Duration::from_millis(50);
                                failures = 0;
                                let conn = s.connection().clone();
                                tokio::spawn(forward(s, rx, itx.clone(), verifier.clone()));
                                match stall {
                                    Some(min) => {
                                        if watch_for_stall(&conn, min).await {
                                            info!(%peer, "connection stalled: re-dialing");
                                            backoff = Duration::from_millis(10);
                                        }
                                    }
                                    None => {
                                        conn.closed().await;
                                    }
                                }
                            }
                            Ok(Err(e)) => {
                                failures += 1;
                                debug!(%peer, %e, "dial failed");
                            }
                            Err(_) => {
                                failures += 1;
                                debug!(%peer, "dial attempt timed out");
                            }
                        }
                    }
                    tokio::time::sleep(backoff).await;
                    // Right after a stall, retry often; later, settle at one dial a second.
                    let cap = if stall.is_some() && failures < SHORT_ATTEMPTS {
                        Duration::from_millis(200)
                    } else {
                        Duration::from_secs(1)
                    };
                    backoff = (backoff * 2).min(cap);
                }
            };
            // Re-dial with backoff until the node stops.
            tokio::select! {
                () = dial => {}
                () = itx.closed() => {}
            }
        });
    }

    // Relay loops: one session per relay, re-dialed after loss.
    for (name, (addr, trust)) in b.relays.clone() {
        let client = abhyasa_moq::relay_client_config(&b.identity, &b.transport, &trust)
            .map_err(NodeError::from)?;
        let (endpoint, itx, me, verifier) = (
            endpoint.clone(),
            itx.clone(),
            agent.clone(),
            verifier.clone(),
        );
        let interest = b.relay_interest.clone();
        tokio::spawn(async move {
            let mut backoff = Duration::from_millis(50);
            let dial = async {
                loop {
                    match tokio::time::timeout(
                        DIAL_ATTEMPT_LONG,
                        RelaySession::connect_with(
                            &endpoint,
                            addr,
                            &name,
                            &me,
                            interest.clone(),
                            client.clone(),
                        ),
                    )
                    .await
                    {
                        Ok(Ok((r, rx))) => {
                            info!(relay = %name, "relay session up");
                            backoff = Duration::from_millis(50);
                            let conn = r.connection().clone();
                            tokio::spawn(forward_relay(r, rx, itx.clone(), verifier.clone()));
                            conn.closed().await;
                            info!(relay = %name, "relay session down");
                        }
                        Ok(Err(e)) => debug!(relay = %name, %e, "relay dial failed"),
                        Err(_) => debug!(relay = %name, "relay dial attempt timed out"),
                    }
                    tokio::time::sleep(backoff).await;
                    backoff = (backoff * 2).min(Duration::from_secs(1));
                }
            };
            tokio::select! {
                () = dial => {}
                () = itx.closed() => {}
            }
        });
    }

    let core = Core {
        agent: agent.clone(),
        machine,
        group,
        custodian_config: b.custodian.clone(),
        receiver_config,
        policy: b.policy.clone(),
        sessions: HashMap::new(),
        events: events.clone(),
        blocked,
        endpoint,
        awaiting: HashMap::new(),
        ledger,
        ledger_setup: b.ledger.clone(),
        ledger_replies: Vec::new(),
        deliveries: Vec::new(),
        bindings: HashMap::new(),
        outcomes: HashMap::new(),
        itx: itx.clone(),
        paused_clock: b.paused_clock,
        db_path: db_path.clone(),
        store_full: None,
        full_backoff: STORE_FULL_BACKOFF_MIN,
        clock,
        unverified: std::collections::BTreeMap::new(),
        signer,
        sent: crate::Sent::default(),
        outbox: Outgoing {
            on: b.store.events,
            ..Outgoing::default()
        },
        metrics: metrics.clone(),
        issued_at: HashMap::new(),
        put_off: Default::default(),
        took_meanwhile: false,
    };
    tokio::spawn(core.run(rx, irx));
    Ok(Node {
        clock,
        agent,
        local_addr,
        tx,
        events,
        #[cfg(feature = "impair")]
        impairment,
        custodian: b.custodian,
        ports,
        keeps_events: b.store.events,
        answer_within: b.limits.answer_within,
        metrics,
    })
}

/// The most objects a node puts in one group it sends (a relay session takes 64 of a group).
const MAX_BATCH: usize = 64;

/// The first dial attempts after a success are this short (see `stall_redial`): a
/// handshake's own Initial retransmissions back off within an attempt, so while a link is
/// down a fresh attempt every few hundred ms gets through sooner once it is back.
const DIAL_ATTEMPT_SHORT: Duration = Duration::from_millis(400);
/// How many short attempts before the long ones (about 4 s of a dead link).
const SHORT_ATTEMPTS: u32 = 10;
/// Later attempts, and every attempt without `stall_redial`, may take this long.
const DIAL_ATTEMPT_LONG: Duration = Duration::from_secs(5);

/// Most events a session's task verifies in one batch.
const VERIFY_BATCH: usize = 64;

/// The driver: it moves bytes between the sessions (and bindings) and the node machine,
/// runs the machine's commits on the store writer, signs what goes out, answers callers,
/// and sleeps until the machine's deadline. Every decision is the machine's
/// ([`abhyasa_machine::NodeMachine`]).
struct Core {
    agent: AgentId,
    machine: NodeMachine,
    group: GroupCommit,
    custodian_config: abhyasa_custody::CustodianConfig,
    receiver_config: abhyasa_custody::ReceiverConfig,
    /// The agent's own judgement, asked before each apply.
    policy: Option<crate::Policy>,
    sessions: HashMap<AgentId, Link>,
    events: broadcast::Sender<NodeEvent>,
    blocked: Blocked,
    endpoint: quinn::Endpoint,
    /// Issue commands waiting for their record to be durable.
    awaiting: HashMap<abhyasa_wire::ObligationId, Vec<IssueReply>>,
    /// The ledger's callers and executor (the branch and gateway are in the machine).
    ledger: Option<LedgerPart>,
    ledger_setup: Option<crate::LedgerSetup>,
    /// Ledger commands answered after the next commit.
    ledger_replies: Vec<(LedgerReplyTx, Result<LedgerReply, NodeError>)>,
    itx: mpsc::Sender<Internal>,
    /// Obligations handed in by a binding other than MOQT, answered after the next commit.
    deliveries: Vec<Delivery>,
    /// Peers reached through another binding: where their obligation objects go.
    bindings: HashMap<AgentId, mpsc::UnboundedSender<Vec<u8>>>,
    /// Who waits for each obligation's terminal record.
    outcomes: HashMap<abhyasa_wire::ObligationId, Vec<crate::OutcomeTx>>,
    /// The clock every decision of this node reads.
    clock: Clock,
    /// Wait for the writer thread on the blocking pool ([`NodeBuilder::paused_clock`]).
    paused_clock: bool,
    /// The store file (named in a "store full" answer).
    db_path: PathBuf,
    /// Set while commits fail for want of space: new work is refused, and the next commit is
    /// tried at `retry_at`.
    store_full: Option<StoreFull>,
    /// The wait before the next commit after one that failed for space (doubling to
    /// [`STORE_FULL_BACKOFF_MAX`]; back to the minimum after a commit lands).
    full_backoff: Duration,
    /// Objects dropped per peer because their signature did not verify.
    unverified: std::collections::BTreeMap<AgentId, u64>,
    /// Signs what custody sends.
    signer: Arc<Signer>,
    /// Custody objects and groups handed to sessions.
    sent: crate::Sent,
    /// What goes in the next commit besides the machines' records.
    outbox: Outgoing,
    /// The node's counters.
    metrics: crate::metrics::NodeMetrics,
    /// When each obligation this process issued was issued (for its discharge latency);
    /// bounded by the pending set.
    issued_at: HashMap<abhyasa_wire::ObligationId, UnixMillis>,
    /// Commands put off while the core waited on the writer ([`inflight`]).
    put_off: inflight::PutOff,
    /// Set when the core handled a session's message while a commit was under way: its
    /// records (if any) wait for the next commit, which the flush then makes.
    took_meanwhile: bool,
}

/// What woke the core loop.
enum Woke {
    /// A command, or `None`: the node's handle was dropped.
    Command(Option<Command>),
    Internal(Internal),
    Timer,
}

/// Outbox writes waiting for the next commit ([`crate::outbox`]).
#[derive(Default)]
struct Outgoing {
    /// Events and delivery marks to write.
    ops: Vec<Op>,
    /// Callers of [`crate::Node::outbox_delivered`], answered when their mark is durable.
    replies: Vec<tokio::sync::oneshot::Sender<Result<(), NodeError>>>,
    /// Whether the store keeps events ([`abhyasa_store::StoreConfig::events`]).
    on: bool,
}

/// Obligations delivered through [`Node::deliver`], waiting for their acks.
struct Delivery {
    from: AgentId,
    ids: Vec<Option<abhyasa_wire::ObligationId>>,
    acks: HashMap<abhyasa_wire::ObligationId, CustodyAck>,
    reply: tokio::sync::oneshot::Sender<Result<Vec<Option<CustodyAck>>, NodeError>>,
}

type LedgerReplyTx = tokio::sync::oneshot::Sender<Result<LedgerReply, NodeError>>;

type IssueReply = tokio::sync::oneshot::Sender<Result<abhyasa_custody::Admission, NodeError>>;

impl Core {
    async fn run(mut self, mut rx: mpsc::Receiver<Command>, mut irx: mpsc::Receiver<Internal>) {
        let done = self.run_loop(&mut rx, &mut irx).await;
        // Close the internal channel so dial loops and forwarders let go of the endpoint;
        // dropping the core joins the store writer, which closes the file. Only then is the
        // shutdown reported, so the same state can be reopened at once.
        irx.close();
        drop(irx);
        drop(self);
        if let Some(done) = done {
            let _ = done.send(());
        }
    }

    async fn run_loop(
        &mut self,
        rx: &mut mpsc::Receiver<Command>,
        irx: &mut mpsc::Receiver<Internal>,
    ) -> Option<tokio::sync::oneshot::Sender<()>> {
        loop {
            // One deadline, recomputed on every pass from what is due; whichever branch
            // wakes the loop, the timers that are due fire below. (A sleep made anew on every
            // pass and raced against steady traffic never completes: the timeouts must not
            // depend on winning that race.)
            let deadline = self.next_deadline();
            // Commands put off while a commit was in flight come first, in their order.
            let woke = match self.put_off.next() {
                Some(cmd) => Woke::Command(cmd),
                None => tokio::select! {
                    cmd = rx.recv() => Woke::Command(cmd),
                    Some(msg) = irx.recv() => Woke::Internal(msg),
                    () = tokio::time::sleep_until(deadline) => Woke::Timer,
                },
            };
            match woke {
                Woke::Command(Some(Command::Shutdown(done))) => {
                    self.flush(rx, irx).await;
                    self.stop().await;
                    return Some(done);
                }
                Woke::Command(Some(cmd)) => {
                    // Take what else is queued before committing: one flush, one commit,
                    // and one store look-up for all the issues among them.
                    let mut batch = vec![cmd];
                    let mut shutdown = None;
                    while batch.len() < 1_024 {
                        let Some(next) =
                            self.put_off.next().or_else(|| rx.try_recv().ok().map(Some))
                        else {
                            break;
                        };
                        match next {
                            Some(Command::Shutdown(done)) => {
                                shutdown = Some(done);
                                break;
                            }
                            Some(cmd) => batch.push(cmd),
                            None => break,
                        }
                    }
                    self.commands(batch, rx).await;
                    if let Some(done) = shutdown {
                        self.flush(rx, irx).await;
                        self.stop().await;
                        return Some(done);
                    }
                }
                Woke::Command(None) => {
                    self.flush(rx, irx).await;
                    self.stop().await;
                    return None;
                }
                // Everything that has arrived meanwhile shares the next commit.
                Woke::Internal(msg) => self.internal_and_queued(msg, irx, 4_096),
                Woke::Timer => {}
            }
            self.fire_due_timers();
            if !self.flush(rx, irx).await {
                self.stop().await;
                return None;
            }
            if self.store_full.is_none()
                && self.machine.take_maintenance()
                && !self.maintain(rx).await
            {
                self.stop().await;
                return None;
            }
        }
    }

    /// The machine's deadline (every timer's: custody, ledger resends, maintenance), or
    /// while the store is full, the next commit's retry.
    fn next_deadline(&self) -> tokio::time::Instant {
        if let Some(full) = &self.store_full {
            // Nothing is committed before the retry: the machine's timers wait for it.
            return full.retry_at;
        }
        match self.machine.poll_timeout() {
            Some(t) => self.clock.instant(t),
            None => tokio::time::Instant::now() + Duration::from_secs(3_600),
        }
    }

    /// Fires every timer whose deadline has passed, at the clock's `now`: called on every
    /// pass of the loop, not only when the sleep wins.
    fn fire_due_timers(&mut self) {
        if let Some(full) = &self.store_full {
            if tokio::time::Instant::now() < full.retry_at {
                return;
            }
            // Time to try the store again: the timers fire, and the commit that follows
            // tells whether space has returned.
            self.store_full = None;
        }
        self.machine.handle_timeout(self.clock.now());
    }

    /// Maintenance, right after a flush (so every record handed out is on its way to the
    /// writer, ahead of the maintenance request): the custodian folds its principal state and
    /// the receiver forgets expired tokens in memory, and the store folds and prunes on disk at
    /// the same `now`. `false`: the store is gone.
    async fn maintain(&mut self, rx: &mut mpsc::Receiver<Command>) -> bool {
        self.clock.resync();
        let t = self.clock.now();
        let folded = self.machine.maintain(t);
        let ticket = self.group.maintain(t);
        let outcome = self
            .serve_while(rx, tokio::task::spawn_blocking(move || ticket.wait()))
            .await
            .unwrap_or(Err(GroupError::Stopped));
        match outcome {
            Ok(report) => {
                debug!(folded, ?report, "maintenance");
                if report.leases_ended > 0 {
                    let _ = self.events.send(NodeEvent::Outbox);
                }
                true
            }
            Err(GroupError::Unknown(e)) if out_of_space(&e) => self.store_is_full(e, rx).await,
            Err(GroupError::Unknown(e)) => {
                warn!(%e, "maintenance outcome unknown: recovering from the store");
                self.recover(&e.to_string(), rx).await
            }
            Err(_) => false,
        }
    }

    async fn stop(&mut self) {
        for s in self.sessions.values() {
            s.close("shutting down");
        }
        self.sessions.clear();
        self.endpoint.close(0u32.into(), b"shutting down");
        // The socket is released once every connection has drained.
        self.endpoint.wait_idle().await;
    }

    /// Persists what both machines hand out in one group commit, then releases what
    /// depended on it. `false`: the store is gone and the node must stop.
    async fn flush(
        &mut self,
        rx: &mut mpsc::Receiver<Command>,
        irx: &mut mpsc::Receiver<Internal>,
    ) -> bool {
        if self.store_full.is_some() {
            // Nothing is committed before the retry (see `fire_due_timers`).
            return true;
        }
        loop {
            let commit = self.machine.poll_commit();
            if commit.is_some() || !self.outbox.ops.is_empty() {
                let (records, token) = match commit {
                    Some(c) => (c.records, Some(c.token)),
                    None => (Vec::new(), None),
                };
                let (now, on) = (self.clock.now(), self.outbox.on);
                let branch = self.machine.ledger().map(|l| &l.branch);
                let mut ops = Vec::with_capacity(records.len() + self.outbox.ops.len());
                for r in records {
                    let event = match &r {
                        Record::Ledger(s) if on => {
                            branch.and_then(|b| crate::outbox::of_step(s, b, now))
                        }
                        _ => None,
                    };
                    ops.push(match r {
                        Record::Custodian(r) => Op::Custodian(r),
                        Record::Receiver(r) => Op::Receiver(r),
                        Record::Ledger(s) => Op::Ledger(s),
                        Record::Gateway(r) => Op::Gateway(r),
                    });
                    ops.extend(event);
                }
                // The outbox's own writes: events kept for a retry if the commit fails (they
                // are recorded once under their keys), delivery marks answered either way.
                let events: Vec<Op> = self
                    .outbox
                    .ops
                    .iter()
                    .filter(|o| matches!(o, Op::Event { .. }))
                    .cloned()
                    .collect();
                let noted =
                    on && ops.iter().any(|o| matches!(o, Op::Event { .. })) || !events.is_empty();
                ops.append(&mut self.outbox.ops);
                let replies = std::mem::take(&mut self.outbox.replies);
                // The writer thread answers into a oneshot: no thread blocks on the commit.
                let (done, outcome) = tokio::sync::oneshot::channel();
                self.group.submit_then(ops, move |r| {
                    let _ = done.send(r);
                });
                // Meanwhile the core goes on answering what needs no commit: decisions above
                // all, which enforcement points ask and a slow or hung disk must not hold.
                // And it takes what the sessions bring, for the next commit.
                let outcome = self
                    .serve_and_take_while(
                        rx,
                        Some(&mut *irx),
                        writer_answer(self.paused_clock, outcome),
                    )
                    .await
                    .unwrap_or(Err(GroupError::Stopped));
                if outcome.is_err() {
                    self.outbox.ops = events;
                }
                for reply in replies {
                    let _ = reply.send(match &outcome {
                        Ok(()) => Ok(()),
                        Err(e) => Err(NodeError::IssueAgain {
                            cause: e.to_string(),
                        }),
                    });
                }
                match outcome {
                    Ok(()) => {
                        if self.full_backoff != STORE_FULL_BACKOFF_MIN {
                            info!(path = %self.db_path.display(), "the store takes commits again");
                            self.full_backoff = STORE_FULL_BACKOFF_MIN;
                        }
                        if let Some(token) = token {
                            self.machine.handle_committed(self.clock.now(), token);
                        }
                        if noted {
                            let _ = self.events.send(NodeEvent::Outbox);
                        }
                    }
                    Err(GroupError::Unknown(e)) if out_of_space(&e) => {
                        // Not a loop of commit, fail, recover, retry: the node answers
                        // (status, refusals) and tries again after a backoff.
                        return self.store_is_full(e, rx).await;
                    }
                    Err(GroupError::Unknown(e)) => {
                        warn!(%e, "commit outcome unknown: recovering from the store");
                        if !self.recover(&e.to_string(), rx).await {
                            return false;
                        }
                        continue;
                    }
                    Err(_) => return false,
                }
            }
            self.release();
            // Every delivery of this round is durable or answered now.
            for mut d in self.deliveries.drain(..) {
                let acks = d
                    .ids
                    .iter()
                    .map(|id| id.and_then(|id| d.acks.remove(&id)))
                    .collect();
                let _ = d.reply.send(Ok(acks));
            }
            let local = self.release_ledger();
            for (reply, result) in self.ledger_replies.drain(..) {
                let _ = reply.send(result);
            }
            // Releasing (an escalation's timer, a re-offer, a message to itself) may hand out
            // more records.
            let more = self.machine.custody_due(self.clock.now());
            if local {
                continue;
            }
            // What the machines handled during the commit has records for the next one.
            if !more && !std::mem::take(&mut self.took_meanwhile) {
                return true;
            }
            self.machine.handle_timeout(self.clock.now());
        }
    }

    /// Reloads the machines from the store after a commit of unknown outcome; everything
    /// that waited on that commit is answered "issue again", with `cause`.
    async fn recover(&mut self, cause: &str, rx: &mut mpsc::Receiver<Command>) -> bool {
        let full = self.refuse_new_work().map(|e| e.to_string());
        let (path, free) = (self.db_path.clone(), free_bytes(&self.db_path));
        let again = || match &full {
            Some(_) => NodeError::StoreFull {
                path: path.clone(),
                free_bytes: free,
                cause: cause.to_owned(),
            },
            None => NodeError::IssueAgain {
                cause: cause.to_owned(),
            },
        };
        let (agent, cc, rc, t) = (
            self.agent.clone(),
            self.custodian_config.clone(),
            self.receiver_config.clone(),
            self.clock.now(),
        );
        let (a2, a3, setup) = (agent.clone(), agent.clone(), self.ledger_setup.clone());
        let key = self.signer.key().clone();
        // Issues waiting on the commit of unknown outcome: the store decides, in the same read.
        let awaiting: Vec<_> = self.awaiting.keys().copied().collect();
        // Read on the writer, answered into a oneshot: the core keeps answering decisions
        // meanwhile, and no runtime thread blocks on the disk.
        let (done, read) = tokio::sync::oneshot::channel();
        let asked = self.group.read_then(move |s| {
            let recovered = (|| {
                let c = s.recover_custodian(agent, cc, t.0, t)?;
                let r = s.recover_receiver(a2, rc)?;
                let l = match setup {
                    Some(setup) => Some(LedgerPart::recover(&a3, key, setup, s)?),
                    None => None,
                };
                let known: HashMap<_, bool> = awaiting
                    .into_iter()
                    .map(|id| (id, s.knows(id).unwrap_or(false)))
                    .collect();
                Ok::<_, NodeError>((c, r, l, known))
            })();
            let _ = done.send(recovered);
        });
        let recovered = match asked {
            Ok(()) => {
                self.serve_while(rx, writer_answer(self.paused_clock, read))
                    .await
            }
            Err(_) => None,
        };
        match recovered {
            Some(Ok((c, r, l, known))) => {
                let (part, machine) = match l {
                    Some((p, m)) => (Some(p), Some(m)),
                    None => (None, None),
                };
                self.machine.restore(c, r, machine);
                self.ledger = part;
                // Ledger commands waiting on that commit: unknown, ask again (each is
                // idempotent on its id).
                for (reply, _) in self.ledger_replies.drain(..) {
                    let _ = reply.send(Err(again()));
                }
                // Deliveries whose applies may not be durable: deliver again (idempotent on
                // the obligation id; an applied one is acked as a duplicate).
                for d in self.deliveries.drain(..) {
                    let _ = d.reply.send(Err(again()));
                }
                // Issues waiting on a commit of unknown outcome: the store decides.
                for (id, replies) in std::mem::take(&mut self.awaiting) {
                    for reply in replies {
                        let answer = match known.get(&id) {
                            Some(true) => Ok(abhyasa_custody::Admission::Custody),
                            _ => Err(again()),
                        };
                        let _ = reply.send(answer);
                    }
                }
                true
            }
            _ => false,
        }
    }

    /// The refusal for new work now, if the store is full.
    /// Answers an enforcement point from the decisions in force ([`crate::decide`]). Where
    /// the obligation that carried a refusal is no longer pending, its outcome is read on the
    /// writer thread, which sends the answer itself: the core never waits on a read.
    fn decide(&self, ask: &crate::Ask, reply: tokio::sync::oneshot::Sender<crate::Verdict>) {
        use crate::{Carried, Refusal, Verdict};
        let principal = self.machine.custodian().principal();
        let now = self.clock.now();
        let (obligation, until, lease_ended) = match ask {
            crate::Ask::Scope { agent, scope } => match principal.authorization(agent, scope) {
                None => {
                    let _ = reply.send(Verdict::NotGoverned);
                    return;
                }
                Some(a) if a.permits(now) => {
                    let _ = reply.send(Verdict::Allow {
                        obligation: a.by,
                        until: a.until,
                    });
                    return;
                }
                // Granted, but its lease has ended (every timer is a deadline: the answer
                // reads the clock, it does not wait for a sweep).
                Some(a) if !a.withheld => (a.by, None, a.until),
                Some(a) => (a.by, None, None),
            },
            crate::Ask::Token(token) => match principal.revoked_until(token) {
                None => {
                    let _ = reply.send(Verdict::NotGoverned);
                    return;
                }
                Some(until) => (principal.token_revoked_by(token), until, None),
            },
        };
        let refusal = move |carried| {
            Verdict::Refuse(Refusal {
                obligation,
                carried,
                until,
                lease_ended,
            })
        };
        let Some(id) = obligation else {
            let _ = reply.send(refusal(Carried::Unknown));
            return;
        };
        if let Some(attempts) = self.machine.custodian().attempts(id) {
            let _ = reply.send(refusal(Carried::Pending { attempts }));
            return;
        }
        let read = self.group.read_then(move |store| {
            let carried = match store.terminal(id) {
                Ok(Some(record)) => Carried::Ended(record.outcome),
                _ => Carried::Unknown,
            };
            let _ = reply.send(refusal(carried));
        });
        if read.is_err() {
            // The writer has stopped: the node is going down; the caller sees it stopped.
            debug!("decide: the store's writer has stopped");
        }
    }

    /// Sends what the ledger released; `true` when it sent this node (its own gateway)
    /// something, delivered in place, which may have handed out more records.
    fn release_ledger(&mut self) -> bool {
        let (Some(l), Some(m)) = (&mut self.ledger, self.machine.ledger_mut()) else {
            return false;
        };
        let itx = self.itx.clone();
        let mut events = Vec::new();
        let local = l.release(
            m,
            &self.sessions,
            |e, executor| {
                let itx = itx.clone();
                tokio::spawn(async move {
                    let (payer, key) = (e.payer.clone(), e.key);
                    let charge = tokio::task::spawn_blocking(move || executor.execute(&e)).await;
                    if let Ok(charge) = charge {
                        let _ = itx.send(Internal::Executed(payer, key, charge)).await;
                    }
                });
            },
            &mut events,
        );
        let now = self.clock.now();
        for e in events {
            if self.outbox.on {
                if let Some(op) = crate::outbox::of_ledger_event(&e, &m.branch, now) {
                    self.outbox.ops.push(op);
                }
            }
            let _ = self.events.send(NodeEvent::Ledger(e));
        }
        let more = !local.is_empty() || !self.outbox.ops.is_empty();
        for m in local {
            self.machine.ledger_local(now, m);
        }
        more
    }

    /// Sends what the machine released (signed, one stream or set of datagrams per group;
    /// each object to a binding on its own) and answers whoever waited on its events.
    fn release(&mut self) {
        while let Some(out) = self.machine.poll_transmit() {
            if out.route == Route::Binding {
                let sent = self
                    .bindings
                    .get(&out.to)
                    .is_some_and(|b| out.objects.into_iter().all(|o| b.send(o).is_ok()));
                if !sent {
                    // The binding let go: custody retries, over a session if one comes up.
                    self.bindings.remove(&out.to);
                    self.machine.detach(&out.to);
                }
                continue;
            }
            let Some(s) = self.sessions.get(&out.to).cloned() else {
                continue; // Gone meanwhile: custody retries.
            };
            let (kind, track) = match out.track {
                MachineTrack::Obligations => (SignedKind::Obligation, Track::Obligations),
                MachineTrack::Acks => (SignedKind::Ack, Track::Acks),
                MachineTrack::Ledger => continue,
            };
            self.sent.groups += 1;
            self.sent.objects += out.objects.len() as u64;
            let (signer, datagram, objects) = (self.signer.clone(), out.datagram, out.objects);
            tokio::spawn(async move {
                // One signature over the group (each object carries its inclusion proof).
                let signed: Vec<Vec<u8>> = signer.sign_group(kind, &objects);
                if let Err(e) = s.send_group(track, &signed, datagram).await {
                    debug!(%e, ?track, objects = signed.len(), "group not sent");
                }
            });
        }
        while let Some(e) = self.machine.poll_event() {
            let event = match e {
                MachineEvent::Accepted(id) => {
                    for reply in self.awaiting.remove(&id).unwrap_or_default() {
                        let _ = reply.send(Ok(abhyasa_custody::Admission::Custody));
                    }
                    continue;
                }
                MachineEvent::Acked { to, ack } => {
                    for d in &mut self.deliveries {
                        if d.from == to && d.ids.contains(&Some(ack.obligation_id)) {
                            d.acks.insert(ack.obligation_id, ack.clone());
                        }
                    }
                    continue;
                }
                MachineEvent::Terminal { record, escalation } => {
                    if record.outcome == abhyasa_wire::Outcome::BestEffort {
                        for reply in self
                            .awaiting
                            .remove(&record.obligation_id)
                            .unwrap_or_default()
                        {
                            let _ = reply.send(Ok(abhyasa_custody::Admission::BestEffort));
                        }
                    }
                    info_span!("obligation", id = %record.obligation_id)
                        .in_scope(|| info!(outcome = ?record.outcome, attempts = record.attempts, "custody ended"));
                    self.metrics
                        .terminal(&record, self.issued_at.remove(&record.obligation_id));
                    for w in self
                        .outcomes
                        .remove(&record.obligation_id)
                        .unwrap_or_default()
                    {
                        let _ = w.send((record.clone(), escalation.clone()));
                    }
                    NodeEvent::Terminal { record, escalation }
                }
                MachineEvent::Reconciled(note) => NodeEvent::Reconciled(note),
                MachineEvent::Decide(o) => {
                    let (id, itx) = (o.id, self.itx.clone());
                    match self.policy.clone() {
                        Some(policy) => {
                            tokio::spawn(async move {
                                let decision = policy.ask(*o).await;
                                let _ = itx.send(Internal::Decided(id, decision)).await;
                            });
                        }
                        // Asked with no policy (a receiver configured to ask): apply.
                        None => {
                            let _ = self.machine.decided(
                                self.clock.now(),
                                id,
                                crate::PolicyDecision::Apply,
                            );
                        }
                    }
                    continue;
                }
                MachineEvent::Applied {
                    id,
                    issuer,
                    kind,
                    payload,
                } => NodeEvent::Applied {
                    id,
                    issuer,
                    kind,
                    payload,
                },
            };
            let _ = self.events.send(event);
        }
    }
}
