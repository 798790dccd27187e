//! The Abhyasa node: the tokio runtime that drives the custodian and the receiver over MOQT
//! sessions and the redb store.
//!
//! ```text
//!  issue() ─┐            ┌─ dial loops (backoff) ─┐   accept loop
//!           ▼            ▼                        ▼        ▼
//!        core task: Custodian + Receiver ◀── session events (objects, subscriptions)
//!           │ poll_persist → GroupCommit (one Immediate commit per flush) → handle_persisted
//!           │ poll_transmit → Session::send_group (to/<peer> streams, datagrams) / acks/<peer>
//!           │ one timer: min(poll_timeout) of both machines
//!           ▼
//!        events (broadcast): applied, terminal (applied/declined/escalated), reconciled, ...
//! ```
//!
//! Nothing is sent before the commit that makes it safe to send has returned; a commit with an
//! unknown outcome rebuilds both machines from the reopened store. On every (re)subscription of
//! a peer to its obligations track the custodian re-offers what is pending for it at once.

#![warn(missing_docs, unreachable_pub)]

mod core;
pub mod decide;
pub mod ledger;
mod link;
pub mod listen;
pub mod metrics;
mod outbox;
pub mod policy;

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use abhyasa_custody::{CustodianConfig, PrincipalState, ReceiverConfig};
use abhyasa_moq::{Identity, TransportSettings};
use abhyasa_store::{GroupConfig, StoreConfig};
use abhyasa_wire::{
    AgentId, CustodyAck, Escalation, Obligation, ObligationId, ReconciliationNote, TerminalRecord,
    UnixMillis,
};
use tokio::sync::{broadcast, mpsc, oneshot};

pub use abhyasa_custody::Admission;
pub use core::{MAX_SETUPS, SETUP_DEADLINE};
pub use decide::{Ask, Carried, Refusal, Verdict};
pub use ledger::{Executor, GatewayAnswer, LedgerCommand, LedgerReply, LedgerSetup, LedgerStatus};
pub use policy::{Policy, PolicyDecision};

/// What a node reports.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum NodeEvent {
    /// Custody of an issued obligation ended (or a best-effort one was sent).
    Terminal {
        /// The terminal record.
        record: TerminalRecord,
        /// The escalation, when the fail-safe ran (with its safe action).
        escalation: Option<Escalation>,
    },
    /// A late `applied` was noted against an escalation.
    Reconciled(ReconciliationNote),
    /// This node, as receiver, applied an obligation (durably): from now on the application
    /// must honour it — gate its own actions on it the moment this arrives.
    Applied {
        /// The obligation.
        id: ObligationId,
        /// Its issuer.
        issuer: AgentId,
        /// Its kind.
        kind: abhyasa_wire::Kind,
        /// What it says.
        payload: abhyasa_wire::Payload,
    },
    /// A session with a peer is up.
    PeerUp(AgentId),
    /// A session with a peer ended.
    PeerDown(AgentId),
    /// The ledger branch reported something (settled, no effect, transfer decided, …).
    Ledger(abhyasa_ledger::LedgerEvent),
    /// The operator's outbox took rows ([`Node::outbox`]); escalations and declines also
    /// come as [`NodeEvent::Terminal`].
    Outbox,
}

/// Why a node operation failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum NodeError {
    /// The store could not be opened or written.
    #[error("store: {0}")]
    Store(#[from] abhyasa_store::StoreError),
    /// The store writer stopped.
    #[error("store writer: {0}")]
    Group(#[from] abhyasa_store::GroupError),
    /// The store's file system is full: new work is refused (nothing accepted is lost; the
    /// node retries its commits with backoff and takes work again once space returns).
    #[error(
        "the store is full: {} has {} free ({cause}); new work is refused until space \
         returns (commits are retried with backoff)",
        path.display(),
        free_bytes.map_or_else(|| "an unknown number of bytes".to_owned(), |b| format!("{b} bytes"))
    )]
    StoreFull {
        /// The store file.
        path: PathBuf,
        /// Bytes free for this user on its file system, when known.
        free_bytes: Option<u64>,
        /// What the failed commit said.
        cause: String,
    },
    /// The QUIC endpoint could not be built.
    #[error("endpoint: {0}")]
    Endpoint(#[from] abhyasa_moq::EndpointError),
    /// The identity cannot sign end to end (its certificate key is not Ed25519).
    #[error("identity: {0}")]
    Identity(#[from] abhyasa_moq::IdentityError),
    /// The custodian refused the obligation.
    #[error("issue: {0}")]
    Issue(#[from] abhyasa_custody::IssueError),
    /// The commit carrying the obligation had an unknown outcome and it is not on disk:
    /// issue it again (issuing is idempotent on the id). `cause` says why the commit failed
    /// (a full disk, a file over its size limit, an I/O error) or that the node stopped.
    #[error("not durable ({cause}); issue it again")]
    IssueAgain {
        /// Why.
        cause: String,
    },
    /// The ledger refused the request.
    #[error("ledger: {0}")]
    Ledger(#[from] abhyasa_ledger::LedgerError),
    /// The node was built without a ledger.
    #[error("this node takes no part in the ledger")]
    NoLedger,
    /// A permit asked for an effect no binding carries.
    #[error("a permit for a binding must be for an effect it carries (one with carried_by)")]
    NotCarried,
    /// The node is no gateway (its ledger has no executor).
    #[error("this node is no ledger gateway")]
    NotAGateway,
    /// An effect reported for an operation this gateway never accepted.
    #[error("operation {0} was never accepted here")]
    NotAccepted(abhyasa_ledger::OpKey),
    /// A step of the ledger journal does not re-apply (damaged, forged or foreign): the node
    /// refuses to start rather than trust a budget it cannot rebuild.
    #[error("ledger journal step does not re-apply ({error}): {step}")]
    LedgerJournal {
        /// The step, as read.
        step: String,
        /// Why it was refused.
        error: abhyasa_ledger::LedgerError,
    },
    /// A binding's session could not be opened or served.
    #[error("binding: {0}")]
    Binding(String),
    /// The target is reached over a binding whose profile (its A2A card) takes no
    /// obligations of this kind.
    #[error("{peer} takes no {kind} obligations (its profile lists none)")]
    KindNotTaken {
        /// The target.
        peer: AgentId,
        /// The kind.
        kind: abhyasa_wire::Kind,
    },
    /// The node has stopped.
    #[error("the node has stopped")]
    Stopped,
    /// An answer that needs the store (a ledger step made durable, a read of durable state)
    /// did not come within [`Limits::answer_within`]: the disk is slow or hung. A ledger step
    /// may still land: ask again with the same key.
    #[error("no answer from the store within {within:?}; ask again (with the same key)")]
    NoAnswer {
        /// The deadline that passed.
        within: Duration,
    },
}

/// Terminal records and escalations a [`Status`] carries at most (the most recent).
pub const STATUS_RECENT: usize = 200;
/// Applies a [`Status`] carries at most (the most recent).
pub const STATUS_APPLIED: usize = 50;

/// A snapshot for `status`.
#[derive(Clone, Debug)]
pub struct Status {
    /// This node.
    pub agent: AgentId,
    /// When the status was taken, by the node's clock: the moment its weights and leases are
    /// read at (a weight change or down-weight that lapsed by then counts no more).
    pub at: UnixMillis,
    /// Obligations under custody with their attempts.
    pub pending: Vec<(Obligation, u32)>,
    /// The most recent terminal records, oldest first (up to [`STATUS_RECENT`]).
    pub recent: Vec<TerminalRecord>,
    /// The most recent escalations, oldest first (up to [`STATUS_RECENT`]).
    pub escalations: Vec<Escalation>,
    /// Principal-side state.
    pub principal: PrincipalState,
    /// What this node, as an agent, honours (its receiver's durable state).
    pub honours: abhyasa_custody::ReceiverState,
    /// What this node's receiver holds in memory (applied ids, token records, last
    /// sequences): bounded by maintenance.
    pub receiver_held: abhyasa_custody::ReceiverHeld,
    /// What this node, as an agent, applied most recently (oldest first, up to
    /// [`STATUS_APPLIED`]), with each obligation as applied.
    pub applied: Vec<abhyasa_store::AppliedEntry>,
    /// Peers with a live session.
    pub peers: Vec<AgentId>,
    /// Objects dropped unread per peer by the rate limit
    /// ([`Limits::requests_per_second_per_peer`]) since the node started.
    pub slowed: BTreeMap<AgentId, u64>,
    /// Obligations and acks dropped unread per session peer because their end-to-end
    /// signature did not verify (unsigned, altered, not chaining to the deployment CA, or
    /// signed by another agent than the session's peer) since the node started.
    pub unverified: BTreeMap<AgentId, u64>,
    /// Custody objects (obligations and acks) handed to sessions since the node started, and
    /// the groups they left in: what is ready at once leaves in groups of up to
    /// `objects_per_group` per peer ([`Limits::session`], at most 64).
    pub sent: Sent,
    /// Set while the store refuses commits for want of space ([`NodeError::StoreFull`]):
    /// new work is refused, commits are retried with backoff.
    pub store_full: Option<String>,
    /// Rows in the operator's outbox not yet taken by every sink ([`Node::outbox`]).
    pub outbox: u64,
    /// The store file's size in bytes, when it could be read.
    pub store_bytes: Option<u64>,
    /// Applies the store keeps a record of (`applied` shows the most recent of them).
    pub applied_total: u64,
    /// The store writer's commits since the node started, and the time they took.
    pub commits: Commits,
}

/// The store writer's durable commits since the node started (see [`Status::commits`]).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Commits {
    /// Commits that landed.
    pub count: u64,
    /// Records (writes of the machines, events, delivery marks) they carried.
    pub ops: u64,
    /// Their time summed, each from its write transaction's start to its durable end (the
    /// disk's sync included). `busy / count` is the mean commit of this node's own writes.
    pub busy: Duration,
}

/// Custody objects sent and the groups they went in (see [`Status::sent`]).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Sent {
    /// Obligations and acks handed to a session (each one signed object).
    pub objects: u64,
    /// The groups (one subgroup stream, or a run of datagrams, each) they went in.
    pub groups: u64,
}

/// Where the core sends an obligation's terminal record, keyed by its id (no broadcast).
pub(crate) type OutcomeTx = oneshot::Sender<(TerminalRecord, Option<Escalation>)>;

pub(crate) enum Command {
    Issue(
        Obligation,
        oneshot::Sender<Result<Admission, NodeError>>,
        OutcomeTx,
    ),
    Status(oneshot::Sender<Status>),
    Honours(oneshot::Sender<Result<abhyasa_custody::ReceiverState, NodeError>>),
    Decide(Ask, oneshot::Sender<Verdict>),
    Deliver(
        AgentId,
        Vec<Vec<u8>>,
        oneshot::Sender<Result<Vec<Option<CustodyAck>>, NodeError>>,
    ),
    Applied(
        Vec<ObligationId>,
        oneshot::Sender<Result<Vec<bool>, NodeError>>,
    ),
    Attach(AgentId, mpsc::UnboundedSender<Vec<u8>>),
    Dial(
        Vec<u8>,
        AgentId,
        SocketAddr,
        oneshot::Sender<Result<abhyasa_moq::BoundConnection, NodeError>>,
    ),
    AcksIn(AgentId, Vec<CustodyAck>),
    Profile(AgentId, Option<PeerProfile>),
    GovernedBy(
        abhyasa_custody::GovernedKey,
        oneshot::Sender<Result<Option<ObligationId>, NodeError>>,
    ),
    Block(AgentId, Duration),
    Ledger(
        ledger::LedgerCommand,
        oneshot::Sender<Result<ledger::LedgerReply, NodeError>>,
    ),
    GatewayDispatch(
        AgentId,
        Box<abhyasa_ledger::Signed<abhyasa_ledger::Permit>>,
        abhyasa_ledger::Effect,
        oneshot::Sender<Result<oneshot::Receiver<ledger::GatewayAnswer>, NodeError>>,
    ),
    CarriedPermit(
        abhyasa_ledger::CreditId,
        abhyasa_ledger::Effect,
        AgentId,
        abhyasa_ledger::OpKey,
        oneshot::Sender<
            Result<oneshot::Receiver<abhyasa_ledger::Signed<abhyasa_ledger::Permit>>, NodeError>,
        >,
    ),
    GatewayExecuted(
        AgentId,
        abhyasa_ledger::OpKey,
        abhyasa_ledger::Vector,
        oneshot::Sender<
            Result<oneshot::Receiver<abhyasa_ledger::Signed<abhyasa_ledger::Receipt>>, NodeError>,
        >,
    ),
    Outbox(
        Option<u64>,
        usize,
        oneshot::Sender<Result<Vec<abhyasa_store::OutboxEntry>, NodeError>>,
    ),
    OutboxDelivered(u64, oneshot::Sender<Result<(), NodeError>>),
    Shutdown(oneshot::Sender<()>),
}

pub use abhyasa_machine::PeerProfile;

/// Limits at the node's boundary with its peers (`docs/LIMITS.md`). The custody machines'
/// own limits — obligations pending in all and per target, applied ids retained — are in
/// [`CustodianConfig`] and [`ReceiverConfig`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Limits {
    /// Sessions (custody and MCP) one peer may hold with this node at once. A session past
    /// it closes that peer's oldest, with a reason naming the limit: a peer re-dialing after
    /// a partition replaces its stale sessions and cannot pile up more than this.
    pub sessions_per_peer: usize,
    /// What each session holds its peer to: requests (so subscriptions) per session, objects
    /// per group.
    pub session: abhyasa_moq::SessionLimits,
    /// Objects one peer may hand in per second — obligations on any binding, and ledger
    /// messages — from one token bucket per peer holding one second's worth. Past it they are
    /// dropped unread and unacked: the peer's custody retries an obligation after its
    /// response timeout, a ledger branch resends on its period. That peer is slowed, the
    /// others are not. 0: no limit.
    pub requests_per_second_per_peer: u32,
    /// How long a caller waits for an answer that needs the store: a ledger step made durable
    /// ([`Node::ledger`], a permit for a binding, a gateway's acceptance or receipt) or a read
    /// of durable state ([`Node::status`], [`Node::honours`], [`Node::applied`],
    /// [`Node::governed_by`]), and an issue's admission ([`Node::issue`]). Past it the call ends [`NodeError::NoAnswer`] — a disk that
    /// stopped answering holds the caller no longer. A ledger step or an issue may still
    /// land: asking again with the same key (the same obligation) answers what it made (a
    /// reservation stays charged until then: nothing is lost).
    pub answer_within: Duration,
}

impl Default for Limits {
    fn default() -> Self {
        Self {
            sessions_per_peer: 4,
            session: abhyasa_moq::SessionLimits::default(),
            requests_per_second_per_peer: 50_000,
            answer_within: Duration::from_secs(30),
        }
    }
}

/// An issued obligation: how it was taken, and a way to wait for how custody ends.
#[derive(Debug)]
pub struct IssueHandle {
    id: ObligationId,
    admission: Admission,
    outcome: oneshot::Receiver<(TerminalRecord, Option<Escalation>)>,
}

impl IssueHandle {
    /// The obligation's id.
    pub fn id(&self) -> ObligationId {
        self.id
    }

    /// Under custody or best-effort.
    pub fn admission(&self) -> Admission {
        self.admission
    }

    /// Waits for the terminal record (applied, declined, escalated with its escalation, or
    /// best-effort), handed to this handle alone by the node, however many are waiting.
    /// `None` if the node stopped first.
    pub async fn outcome(self) -> Option<(TerminalRecord, Option<Escalation>)> {
        self.outcome.await.ok()
    }
}

/// Opens the store on a caller's backend ([`NodeBuilder::store_backend`]).
type OpenBackend = Arc<
    dyn Fn(StoreConfig) -> Result<abhyasa_store::Store, abhyasa_store::StoreError> + Send + Sync,
>;

/// Builds a [`Node`].
pub struct NodeBuilder {
    identity: Identity,
    listen: SocketAddr,
    peers: BTreeMap<AgentId, SocketAddr>,
    relays: BTreeMap<AgentId, (SocketAddr, abhyasa_moq::RelayTrust)>,
    relay_interest: Option<std::collections::HashSet<AgentId>>,
    state_dir: Option<PathBuf>,
    transport: TransportSettings,
    custodian: CustodianConfig,
    receiver: ReceiverConfig,
    store: StoreConfig,
    group: GroupConfig,
    #[cfg(feature = "impair")]
    impairment: Option<(abhyasa_netem::Impairment, u64)>,
    backend: Option<OpenBackend>,
    ledger: Option<ledger::LedgerSetup>,
    maintenance: Duration,
    limits: Limits,
    paused_clock: bool,
    policy: Option<Policy>,
}

impl NodeBuilder {
    /// For tests of an embedding application on tokio's paused clock
    /// (`#[tokio::test(start_paused = true)]`): the node then waits for its store's commits
    /// and reads on the blocking pool, which holds the paused clock still while they run.
    /// (Otherwise the runtime looks idle while the writer thread commits, and the paused clock
    /// jumps ahead to the next timer, again and again, for as long as the commit takes.) Costs
    /// a thread hand-off per commit; off by default.
    pub fn paused_clock(mut self, on: bool) -> Self {
        self.paused_clock = on;
        self
    }

    /// Limits at the boundary with peers (default [`Limits::default`]).
    pub fn limits(mut self, limits: Limits) -> Self {
        self.limits = limits;
        self
    }

    /// How often the node runs maintenance (default every minute): principal down-weights
    /// past their `fold_after` fold into base weights, in memory and on disk, and terminal
    /// records, escalations and notes older than the store's retention are pruned, at most
    /// `max_prune_per_call` rows a run. Without it principal-side entries only grow, until
    /// every issue is refused as full.
    pub fn maintenance(mut self, every: Duration) -> Self {
        self.maintenance = every.max(Duration::from_millis(10));
        self
    }

    /// Impairs every datagram this node sends with netem rules (in process; testing and
    /// benchmarks). Impair both nodes to impair both directions. Feature `impair`.
    #[cfg(feature = "impair")]
    pub fn impair(mut self, spec: abhyasa_netem::Impairment, seed: u64) -> Self {
        self.impairment = Some((spec, seed));
        self
    }

    /// Keeps the store on `backend` instead of `<state_dir>/node.redb`: memory, or (in tests) a
    /// disk that fails on cue (`abhyasa_testkit::fault`). The state directory then holds none
    /// of the store. A reopen after a failed commit opens a clone of `backend`, so a backend
    /// whose clones share one disk reopens what that disk kept.
    pub fn store_backend<B>(mut self, backend: B) -> Self
    where
        B: abhyasa_store::StorageBackend + Clone + Sync,
    {
        self.backend = Some(Arc::new(move |config| {
            abhyasa_store::Store::open_backend(backend.clone(), config)
        }));
        self
    }

    /// Takes part in the budget ledger: a branch, and a gateway when the setup has an
    /// executor. Its steps share the custody store and group commit; its messages ride the
    /// `ledger/<peer>` tracks.
    pub fn ledger(mut self, setup: ledger::LedgerSetup) -> Self {
        self.ledger = Some(setup);
        self
    }

    /// Where to listen (default `127.0.0.1:0`).
    pub fn listen(mut self, addr: SocketAddr) -> Self {
        self.listen = addr;
        self
    }

    /// A peer to dial (and re-dial after loss).
    pub fn peer(mut self, agent: AgentId, addr: SocketAddr) -> Self {
        self.peers.insert(agent, addr);
        self
    }

    /// An MOQT relay to meet peers at (draft-14; `moq-relay` 0.17 runs unmodified), dialed
    /// and re-dialed after loss like a peer. Its certificate, from the deployment CA, must
    /// name `name`. Through it the node publishes its namespace, finds every other node's
    /// (SUBSCRIBE_NAMESPACE `abhyasa/v1`), subscribes to what each addresses to it, and
    /// serves custody to whoever subscribes to its tracks; who sent an object is proven by its
    /// end-to-end signature only. A relay restart is a partition: custody retries, and
    /// re-offers when the peer subscribes again.
    pub fn relay(self, name: AgentId, addr: SocketAddr) -> Self {
        self.relay_trusting(name, addr, abhyasa_moq::RelayTrust::Deployment)
    }

    /// [`NodeBuilder::relay`] for a relay whose certificate is trusted as `trust` says: the
    /// relay operator's CA (for `name` as a DNS name) or the certificate's SHA-256
    /// fingerprint, instead of the deployment CA. The node still presents its own
    /// certificate, and still believes only end-to-end signatures.
    pub fn relay_trusting(
        mut self,
        name: AgentId,
        addr: SocketAddr,
        trust: abhyasa_moq::RelayTrust,
    ) -> Self {
        self.relays.insert(name, (addr, trust));
        self
    }

    /// At relays, subscribe only to these peers' namespaces (default: every node's the relay
    /// announces). An agent that serves a few principals names them: without it, N nodes at
    /// one relay hold 3·N·(N−1) subscriptions there (docs/SCALE.md).
    pub fn relay_peers(mut self, peers: impl IntoIterator<Item = AgentId>) -> Self {
        self.relay_interest = Some(peers.into_iter().collect());
        self
    }

    /// The directory of the node's database file (required).
    pub fn state_dir(mut self, dir: impl Into<PathBuf>) -> Self {
        self.state_dir = Some(dir.into());
        self
    }

    /// QUIC transport settings.
    pub fn transport(mut self, t: TransportSettings) -> Self {
        self.transport = t;
        self
    }

    /// Custodian settings.
    pub fn custodian(mut self, c: CustodianConfig) -> Self {
        self.custodian = c;
        self
    }

    /// The agent's own judgement ([`Policy`]): asked before each obligation this node
    /// would apply; it applies, declines in its own words, or defers. Without one, every
    /// obligation that passes the receiver's checks is applied.
    pub fn policy(mut self, policy: Policy) -> Self {
        self.policy = Some(policy);
        self
    }

    /// Receiver settings.
    pub fn receiver(mut self, r: ReceiverConfig) -> Self {
        self.receiver = r;
        self
    }

    /// Store settings.
    pub fn store(mut self, s: StoreConfig) -> Self {
        self.store = s;
        self
    }

    /// Group-commit bounds.
    pub fn group(mut self, g: GroupConfig) -> Self {
        self.group = g;
        self
    }

    /// Opens the store, recovers both machines, binds the endpoint and starts the node.
    pub async fn build(self) -> Result<Node, NodeError> {
        let state_dir = self.state_dir.clone().unwrap_or_else(|| PathBuf::from("."));
        // The state directory is private (0700) when the node creates it.
        {
            use std::os::unix::fs::DirBuilderExt;
            std::fs::DirBuilder::new()
                .recursive(true)
                .mode(0o700)
                .create(&state_dir)
                .map_err(abhyasa_store::StoreError::from)?;
        }
        core::start(self, state_dir.join("node.redb")).await
    }
}

/// A running node. Clones share it (a binding and the host can hold one each); it stops on
/// [`Node::shutdown`] or when the last clone is dropped.
#[derive(Clone)]
pub struct Node {
    clock: core::Clock,
    agent: AgentId,
    local_addr: SocketAddr,
    tx: mpsc::Sender<Command>,
    events: broadcast::Sender<NodeEvent>,
    #[cfg(feature = "impair")]
    impairment: Option<abhyasa_moq::ImpairmentHandle>,
    custodian: CustodianConfig,
    ports: abhyasa_moq::Ports,
    keeps_events: bool,
    metrics: metrics::NodeMetrics,
    answer_within: Duration,
}

impl Node {
    /// The node's clock, in Unix milliseconds: what its deadlines, retries, lease and permit
    /// expiries are measured against. It reads tokio's clock (monotonic, paused in a test on
    /// a paused runtime) from an anchor taken at start, resynchronised forward to the wall
    /// clock at each maintenance. Obligations an embedder builds take their `created_at` from
    /// here.
    pub fn now(&self) -> UnixMillis {
        self.clock.now()
    }

    /// The retry budget under which an obligation living `span_ms` normally ends by its
    /// deadline with this node's backoff ([`CustodianConfig::default_retries`]).
    pub fn default_retries(&self, span_ms: u64) -> u32 {
        self.custodian.default_retries(span_ms)
    }

    /// A builder for `identity`.
    pub fn builder(identity: Identity) -> NodeBuilder {
        NodeBuilder {
            identity,
            listen: SocketAddr::from(([127, 0, 0, 1], 0)),
            peers: BTreeMap::new(),
            relays: BTreeMap::new(),
            relay_interest: None,
            state_dir: None,
            transport: TransportSettings::default(),
            custodian: CustodianConfig::default(),
            receiver: ReceiverConfig::default(),
            store: StoreConfig::default(),
            group: GroupConfig::default(),
            #[cfg(feature = "impair")]
            impairment: None,
            backend: None,
            ledger: None,
            maintenance: Duration::from_secs(60),
            paused_clock: false,
            limits: Limits::default(),
            policy: None,
        }
    }

    /// This node's agent id.
    pub fn agent(&self) -> &AgentId {
        &self.agent
    }

    /// The impaired socket's handle, when the node was built with
    /// [`impair`](NodeBuilder::impair): its counters, and its rules changed on the live link.
    #[cfg(feature = "impair")]
    pub fn impairment(&self) -> Option<&abhyasa_moq::ImpairmentHandle> {
        self.impairment.as_ref()
    }

    /// A ledger request: answered once its step is durable (status at once).
    pub async fn ledger(
        &self,
        cmd: ledger::LedgerCommand,
    ) -> Result<ledger::LedgerReply, NodeError> {
        let (tx, rx) = oneshot::channel();
        self.tx
            .send(Command::Ledger(cmd, tx))
            .await
            .map_err(|_| NodeError::Stopped)?;
        self.within_deadline(async { rx.await.map_err(|_| NodeError::Stopped)? })
            .await
    }

    /// `answer`, or [`NodeError::NoAnswer`] past [`Limits::answer_within`].
    async fn within_deadline<T>(
        &self,
        answer: impl std::future::Future<Output = Result<T, NodeError>>,
    ) -> Result<T, NodeError> {
        tokio::time::timeout(self.answer_within, answer)
            .await
            .unwrap_or(Err(NodeError::NoAnswer {
                within: self.answer_within,
            }))
    }

    /// The second half of a two-step answer (taken at once, answered once durable).
    async fn durable<T>(&self, answer: oneshot::Receiver<T>) -> Result<T, NodeError> {
        answer.await.map_err(|_| NodeError::IssueAgain {
            cause: "the node stopped before answering".into(),
        })
    }

    /// Hands this node's gateway a dispatch that arrived on a binding (MCP: the permit rides
    /// the tool call, and `effect` is the call as the server normalized it). `from` is the
    /// binding's authenticated caller: the permit must be signed by it. A
    /// [`GatewayAnswer::Run`] means the first acceptance is durable: run the effect once and
    /// report it with [`Node::gateway_executed`].
    pub async fn gateway_dispatch(
        &self,
        from: AgentId,
        permit: abhyasa_ledger::Signed<abhyasa_ledger::Permit>,
        effect: abhyasa_ledger::Effect,
    ) -> Result<ledger::GatewayAnswer, NodeError> {
        let (tx, rx) = oneshot::channel();
        self.tx
            .send(Command::GatewayDispatch(from, Box::new(permit), effect, tx))
            .await
            .map_err(|_| NodeError::Stopped)?;
        self.within_deadline(async {
            let answer = rx.await.map_err(|_| NodeError::Stopped)??;
            // Dropped only when a commit of unknown outcome made the node rebuild its ledger.
            self.durable(answer).await
        })
        .await
    }

    /// The caller's side of a budget-gated call a binding carries: reserves `effect`'s
    /// maximum from `credit` for `gateway` under `key`, dispatches it, and answers the signed
    /// permit once the dispatch is durable, for the caller to put on the call. Settle from
    /// the receipt on the result with [`LedgerCommand::Receipt`]. Asking again for the same
    /// key and effect answers the same permit (a retried call).
    pub async fn carried_permit(
        &self,
        credit: abhyasa_ledger::CreditId,
        effect: abhyasa_ledger::Effect,
        gateway: AgentId,
        key: abhyasa_ledger::OpKey,
    ) -> Result<abhyasa_ledger::Signed<abhyasa_ledger::Permit>, NodeError> {
        let (tx, rx) = oneshot::channel();
        self.tx
            .send(Command::CarriedPermit(credit, effect, gateway, key, tx))
            .await
            .map_err(|_| NodeError::Stopped)?;
        self.within_deadline(async {
            let permit = rx.await.map_err(|_| NodeError::Stopped)??;
            self.durable(permit).await
        })
        .await
    }

    /// The effect of a [`GatewayAnswer::Run`] ran and charged `charge` (clamped to the
    /// binding's maximum): the signed receipt, once its record is durable.
    pub async fn gateway_executed(
        &self,
        payer: AgentId,
        key: abhyasa_ledger::OpKey,
        charge: abhyasa_ledger::Vector,
    ) -> Result<abhyasa_ledger::Signed<abhyasa_ledger::Receipt>, NodeError> {
        let (tx, rx) = oneshot::channel();
        self.tx
            .send(Command::GatewayExecuted(payer, key, charge, tx))
            .await
            .map_err(|_| NodeError::Stopped)?;
        self.within_deadline(async {
            let receipt = rx.await.map_err(|_| NodeError::Stopped)??;
            self.durable(receipt).await
        })
        .await
    }

    /// The address the node listens on.
    pub fn local_addr(&self) -> SocketAddr {
        self.local_addr
    }

    /// Issues an obligation. Returns once it is durably under custody (or sent best-effort),
    /// with a handle that can wait for its outcome. Issuing an id the node already knows is a
    /// no-op that answers `Custody`.
    pub async fn issue(&self, obligation: Obligation) -> Result<IssueHandle, NodeError> {
        let id = obligation.id;
        let (tx, rx) = oneshot::channel();
        // Registered with the issue itself, so the outcome cannot slip past the handle.
        let (outcome_tx, outcome) = oneshot::channel();
        self.tx
            .send(Command::Issue(obligation, tx, outcome_tx))
            .await
            .map_err(|_| NodeError::Stopped)?;
        let admission = self
            .within_deadline(async { rx.await.map_err(|_| NodeError::Stopped)? })
            .await?;
        Ok(IssueHandle {
            id,
            admission,
            outcome,
        })
    }

    /// The node's events from now on.
    pub fn events(&self) -> broadcast::Receiver<NodeEvent> {
        self.events.subscribe()
    }

    /// The pending set, terminal history, escalations, principal state and live peers.
    pub async fn status(&self) -> Result<Status, NodeError> {
        let (tx, rx) = oneshot::channel();
        self.tx
            .send(Command::Status(tx))
            .await
            .map_err(|_| NodeError::Stopped)?;
        self.within_deadline(async { rx.await.map_err(|_| NodeError::Stopped) })
            .await
    }

    /// What this node, as an agent, must honour — answered from the receiver's durable state
    /// (what its last commit left, not what is still being written): the scopes it withholds
    /// per principal ([`ReceiverState::is_withheld`](abhyasa_custody::ReceiverState::is_withheld)),
    /// its preference weights ([`weight`](abhyasa_custody::ReceiverState::weight)), the tokens it
    /// dropped ([`is_dropped`](abhyasa_custody::ReceiverState::is_dropped)).
    pub async fn honours(&self) -> Result<abhyasa_custody::ReceiverState, NodeError> {
        let (tx, rx) = oneshot::channel();
        self.tx
            .send(Command::Honours(tx))
            .await
            .map_err(|_| NodeError::Stopped)?;
        self.within_deadline(async { rx.await.map_err(|_| NodeError::Stopped)? })
            .await
    }

    /// Asks this node, as principal, whether an agent may exercise a scope or a token is
    /// still honoured ([`decide`]): answered from the decisions in force in memory, so a
    /// revocation refuses from the moment it is issued, not when the agent acks it.
    pub async fn decide(&self, ask: Ask) -> Result<Verdict, NodeError> {
        let (tx, rx) = oneshot::channel();
        self.tx
            .send(Command::Decide(ask, tx))
            .await
            .map_err(|_| NodeError::Stopped)?;
        rx.await.map_err(|_| NodeError::Stopped)
    }

    /// Hands the receiver obligation objects (CBOR, as on the `to/<agent>` track) that
    /// arrived from `from` over another binding (MCP, A2A), which authenticated `from`.
    /// They are processed exactly as on MOQT; the answer comes once their applies are
    /// durable: for each object, in order, the CustodyAck the receiver released for it now,
    /// or `None` (an object whose envelope did not read, a forged issuer, a best-effort kind,
    /// or a duplicate of an apply not yet durable: the custodian redelivers and is acked then).
    /// `NodeError::IssueAgain`: a commit had an unknown outcome; deliver them again (the
    /// receiver is idempotent on the obligation id).
    pub async fn deliver(
        &self,
        from: AgentId,
        objects: Vec<Vec<u8>>,
    ) -> Result<Vec<Option<CustodyAck>>, NodeError> {
        let (tx, rx) = oneshot::channel();
        self.tx
            .send(Command::Deliver(from, objects, tx))
            .await
            .map_err(|_| NodeError::Stopped)?;
        rx.await.map_err(|_| NodeError::Stopped)?
    }

    /// The port of the binding at `path` (MCP-over-MOQT registers `/mcp`): the sessions peers
    /// open to this node's QUIC endpoint with that PATH, set up and authenticated by their
    /// certificates, arrive here in order (up to [`abhyasa_moq::binding::PORT_QUEUE`] wait;
    /// more are closed). A path has one binding at a time; dropping the receiver frees it.
    /// A session for a path no binding registered is refused.
    pub fn port(
        &self,
        path: &[u8],
    ) -> Result<mpsc::Receiver<abhyasa_moq::BoundConnection>, NodeError> {
        self.ports
            .register(path)
            .map_err(|e| NodeError::Binding(e.to_string()))
    }

    /// Dials `peer` at `addr` over this node's endpoint and certificate and sets up a session
    /// for the binding at `path`, as its client.
    pub async fn dial(
        &self,
        path: &[u8],
        peer: &AgentId,
        addr: SocketAddr,
    ) -> Result<abhyasa_moq::BoundConnection, NodeError> {
        let (tx, rx) = oneshot::channel();
        self.tx
            .send(Command::Dial(path.to_vec(), peer.clone(), addr, tx))
            .await
            .map_err(|_| NodeError::Stopped)?;
        rx.await.map_err(|_| NodeError::Stopped)?
    }

    /// Reaches `peer` through another binding (MCP, A2A) instead of a MOQT session: from now
    /// on the obligation objects the custodian sends `peer` (CBOR, first attempts, retries
    /// and re-offers alike) arrive on the returned channel, for the binding to carry; what
    /// `peer` acks goes back through [`Node::acks_in`]. Attaching re-offers what is pending
    /// for `peer` at once (as a MOQT re-subscription does); attaching again replaces the
    /// channel; dropping the receiver detaches. Nothing is lost when a binding fails to
    /// carry an object: custody retries until the deadline and then escalates.
    pub async fn attach(
        &self,
        peer: AgentId,
    ) -> Result<mpsc::UnboundedReceiver<Vec<u8>>, NodeError> {
        let (tx, rx) = mpsc::unbounded_channel();
        self.tx
            .send(Command::Attach(peer, tx))
            .await
            .map_err(|_| NodeError::Stopped)?;
        Ok(rx)
    }

    /// Sets (or, with `None`, clears) what `peer` takes, as its binding describes it: from now
    /// on obligations to `peer` are checked against it at issue.
    pub async fn set_profile(
        &self,
        peer: AgentId,
        profile: Option<PeerProfile>,
    ) -> Result<(), NodeError> {
        self.tx
            .send(Command::Profile(peer, profile))
            .await
            .map_err(|_| NodeError::Stopped)
    }

    /// Acks `peer` returned over another binding, which authenticated `peer`. Each is
    /// checked by the custodian as on MOQT (an ack from anyone but the target is ignored).
    pub async fn acks_in(&self, peer: AgentId, acks: Vec<CustodyAck>) -> Result<(), NodeError> {
        if acks.is_empty() {
            return Ok(());
        }
        self.tx
            .send(Command::AcksIn(peer, acks))
            .await
            .map_err(|_| NodeError::Stopped)
    }

    /// For each id, whether this node (as receiver) has applied it, from its durable
    /// applied-id ledger: how a binding answers a custodian asking after deferred acks.
    pub async fn applied(&self, ids: Vec<ObligationId>) -> Result<Vec<bool>, NodeError> {
        let (tx, rx) = oneshot::channel();
        self.tx
            .send(Command::Applied(ids, tx))
            .await
            .map_err(|_| NodeError::Stopped)?;
        self.within_deadline(async { rx.await.map_err(|_| NodeError::Stopped)? })
            .await
    }

    /// The obligation last applied on a governed key (a scope, a weight, a token), from the
    /// receiver's durable state: what to name when a tool is refused because of it.
    pub async fn governed_by(
        &self,
        key: abhyasa_custody::GovernedKey,
    ) -> Result<Option<ObligationId>, NodeError> {
        let (tx, rx) = oneshot::channel();
        self.tx
            .send(Command::GovernedBy(key, tx))
            .await
            .map_err(|_| NodeError::Stopped)?;
        self.within_deadline(async { rx.await.map_err(|_| NodeError::Stopped)? })
            .await
    }

    /// Cuts every session with `peer` and refuses it for `duration` (an outage on demand).
    pub async fn block_peer(&self, peer: AgentId, duration: Duration) -> Result<(), NodeError> {
        self.tx
            .send(Command::Block(peer, duration))
            .await
            .map_err(|_| NodeError::Stopped)
    }

    /// What the node counts as it runs (outcomes, attempts, discharge latency, escalations,
    /// refused connections), for an exporter to register ([`metrics::NodeMetrics::register`]).
    pub fn metrics(&self) -> &metrics::NodeMetrics {
        &self.metrics
    }

    /// Whether the node keeps the operator's outbox ([`StoreConfig::events`]).
    pub fn keeps_events(&self) -> bool {
        self.keeps_events
    }

    /// Up to `limit` rows of the operator's outbox after the row `after` (from the first with
    /// `None`), oldest first: escalations, declines, ended leases, quarantined and forfeited
    /// budget, each recorded in the commit that made it true. Kept only when the node's
    /// [`StoreConfig::events`] is on.
    pub async fn outbox(
        &self,
        after: Option<u64>,
        limit: usize,
    ) -> Result<Vec<abhyasa_store::OutboxEntry>, NodeError> {
        let (tx, rx) = oneshot::channel();
        self.tx
            .send(Command::Outbox(after, limit, tx))
            .await
            .map_err(|_| NodeError::Stopped)?;
        rx.await.map_err(|_| NodeError::Stopped)?
    }

    /// Every sink took the outbox's rows up to and including `through`: they leave it. When
    /// this returns `Ok` that is durable; a crash before leaves them to be delivered again
    /// (under the same keys).
    pub async fn outbox_delivered(&self, through: u64) -> Result<(), NodeError> {
        let (tx, rx) = oneshot::channel();
        self.tx
            .send(Command::OutboxDelivered(through, tx))
            .await
            .map_err(|_| NodeError::Stopped)?;
        rx.await.map_err(|_| NodeError::Stopped)?
    }

    /// Stops the node gracefully: queued commits land, sessions close, the store is closed.
    pub async fn shutdown(self) {
        let (tx, rx) = oneshot::channel();
        if self.tx.send(Command::Shutdown(tx)).await.is_ok() {
            let _ = rx.await;
        }
    }
}
