//! The Abhyasa node's decisions as one sans-IO machine, as quinn-proto is to quinn.
//!
//! A node holds a custodian, a receiver and optionally a ledger branch and gateway. Around
//! them sit decisions of its own: which object goes to which machine, what a peer may hand in
//! per second, which obligations a peer's profile refuses, where an outgoing object goes (a
//! session, another binding, nowhere yet), how the records of all machines share one commit,
//! and when every timer fires. Those decisions live here, with time as an argument and one
//! [`NodeMachine::poll_timeout`] that is a deadline: it does not move because something else
//! arrived. The tokio driver in `abhyasa-node` moves bytes, runs commits, signs, and sleeps
//! until that deadline; the simulation in `abhyasa-sim` drives the same machine in virtual
//! time.
//!
//! ```text
//!  handle_object / deliver / issue / session_* ─▶ NodeMachine ─▶ poll_commit ─▶ (store)
//!  handle_timeout(now) ◀── poll_timeout ───────┘      │  ◀── handle_committed(now, token)
//!                                                     └─▶ poll_transmit / poll_event
//! ```

#![warn(missing_docs, unreachable_pub)]

pub mod binding;

use std::collections::{BTreeMap, BTreeSet, HashMap, VecDeque};

use abhyasa_custody::{
    Admission, Channel, Custodian, CustodianEvent, CustodianRecord, IssueError, PolicyDecision,
    Receiver, ReceiverEvent, ReceiverRecord,
};
use abhyasa_ledger::{Branch, Gateway, GatewayRecord, LedgerMessage, PersistToken, Step};
use abhyasa_wire::{
    decode, decode_obligation, encode, AgentId, CustodyAck, Escalation, Kind, Obligation,
    ObligationId, Payload, ReconciliationNote, TerminalRecord, UnixMillis,
};
use tracing::{debug, warn};

/// The node's tracks: what an object is, by where it arrived or where it goes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Track {
    /// Obligations (`to/<peer>`).
    Obligations,
    /// Custody acks (`acks/<peer>`).
    Acks,
    /// Ledger messages (`ledger/<peer>`).
    Ledger,
}

/// Where an outgoing group goes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Route {
    /// The peer's MOQT session.
    Session,
    /// Another binding the peer is reached through (A2A, MCP): each object on its own.
    Binding,
}

/// Objects for one peer, one route, one track and one channel, in the order the machines
/// handed them out: one group (a stream, or datagrams) for the driver to sign and send.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Outgoing {
    /// The peer.
    pub to: AgentId,
    /// Session or binding.
    pub route: Route,
    /// The track.
    pub track: Track,
    /// As datagrams (a best-effort or first attempt on the datagram channel).
    pub datagram: bool,
    /// The encoded objects.
    pub objects: Vec<Vec<u8>>,
    /// For each obligation object, which custody attempt it is (1-based; 0 for best-effort
    /// and for acks): for the driver's traces and the simulation's checkers.
    pub attempts: Vec<u32>,
}

/// One record for the store.
#[derive(Clone, Debug)]
pub enum Record {
    /// A custodian record.
    Custodian(CustodianRecord),
    /// A receiver record.
    Receiver(ReceiverRecord),
    /// A ledger branch step.
    Ledger(Step),
    /// A gateway record.
    Gateway(GatewayRecord),
}

/// What every machine handed out since the last commit: written together, in one commit.
#[derive(Debug)]
pub struct Commit {
    /// What to write, in order.
    pub records: Vec<Record>,
    /// Handed back to [`NodeMachine::handle_committed`] once the records are durable.
    pub token: CommitToken,
}

/// Confirms a [`Commit`].
#[derive(Debug)]
pub struct CommitToken {
    custodian: Vec<PersistToken>,
    receiver: Vec<PersistToken>,
    branch: Vec<PersistToken>,
    gateway: Vec<PersistToken>,
}

/// What the node reports.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum MachineEvent {
    /// An issued obligation is durably under custody.
    Accepted(ObligationId),
    /// Custody ended (or a best-effort obligation was sent).
    Terminal {
        /// The record.
        record: TerminalRecord,
        /// The escalation, when the fail-safe ran.
        escalation: Option<Escalation>,
    },
    /// A late `applied` noted against an escalation.
    Reconciled(ReconciliationNote),
    /// This node applied an obligation, durably.
    Applied {
        /// The obligation.
        id: ObligationId,
        /// Its issuer.
        issuer: AgentId,
        /// Its kind.
        kind: Kind,
        /// What it says.
        payload: Payload,
    },
    /// An obligation waits for this agent's own decision (its receiver asks a policy):
    /// answer with [`NodeMachine::decided`].
    Decide(Box<Obligation>),
    /// An ack the receiver released (durable), whichever route it takes: a binding's caller
    /// waiting on [`NodeMachine::deliver`] is answered with it.
    Acked {
        /// The custodian it answers.
        to: AgentId,
        /// The ack.
        ack: CustodyAck,
    },
}

/// What a peer reached over another binding takes, from its own description (an A2A card's
/// profiles): per kind, the backoff its retry budget is measured against. An obligation to
/// that peer of a kind it does not list, or whose `max_retries` does not span its deadline by
/// [`profile_retries`](abhyasa_custody::profile_retries), is refused at issue.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PeerProfile {
    /// Per kind: (backoff base, backoff cap), ms.
    pub kinds: BTreeMap<Kind, (u64, u64)>,
}

impl PeerProfile {
    /// Whether `o` fits the profile: the kind is taken and the budget spans the deadline.
    pub fn admit(&self, o: &Obligation) -> Result<(), IssueRefused> {
        let kind = o.kind();
        let Some(&(base_ms, cap_ms)) = self.kinds.get(&kind) else {
            return Err(IssueRefused::KindNotTaken {
                peer: o.target.clone(),
                kind,
            });
        };
        let span = o.deadline.0.saturating_sub(o.created_at.0);
        let needed = abhyasa_custody::profile_retries(span, base_ms, cap_ms);
        if o.max_retries < needed {
            return Err(IssueRefused::Issue(IssueError::BudgetTooSmall {
                kind,
                given: o.max_retries,
                needed,
            }));
        }
        Ok(())
    }
}

/// Why [`NodeMachine::issue`] refused an obligation. Nothing changed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum IssueRefused {
    /// The target, reached over another binding, does not take this kind.
    KindNotTaken {
        /// The target.
        peer: AgentId,
        /// The kind.
        kind: Kind,
    },
    /// The custodian (or the target's profile) refused it.
    Issue(IssueError),
}

/// How [`NodeMachine::issue`] took an obligation.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Issued {
    /// Already pending under custody: nothing new (issuing is idempotent on the id).
    AlreadyPending,
    /// Taken now; durable (answerable) once [`MachineEvent::Accepted`] (custody) or its
    /// best-effort [`MachineEvent::Terminal`] comes out.
    New(Admission),
}

/// The node's own settings (the machines have theirs).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MachineConfig {
    /// Objects (obligations, ledger messages) one peer may hand in per second; 0: no limit.
    pub requests_per_second_per_peer: u32,
    /// How often maintenance is due, in ms.
    pub maintenance_ms: u64,
    /// Objects per outgoing group.
    pub batch: usize,
    /// A deliberately broken decision, for the simulation's mutants only.
    #[cfg(feature = "mutants")]
    pub mutation: Option<NodeMutation>,
}

impl Default for MachineConfig {
    fn default() -> Self {
        Self {
            requests_per_second_per_peer: 0,
            maintenance_ms: 60_000,
            batch: 64,
            #[cfg(feature = "mutants")]
            mutation: None,
        }
    }
}

impl MachineConfig {
    /// The deliberately broken rule this node runs with: always `None` unless the crate is
    /// built with the `mutants` feature (the simulator's), so a product build compiles every
    /// mutant branch away.
    #[inline]
    pub fn mutation(&self) -> Option<NodeMutation> {
        #[cfg(feature = "mutants")]
        return self.mutation;
        #[cfg(not(feature = "mutants"))]
        None
    }
}

/// A deliberately broken node decision, selectable only to prove that the simulation catches
/// it. Each puts back a bug the node once had.
#[doc(hidden)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum NodeMutation {
    /// Timers fire only after [`QUIET_MS`] without input: the event loop that made its sleep
    /// anew on every pass, so that under steady traffic no timer ever fired.
    TimersOnlyWhenQuiet,
    /// A text id's letter case and dashes are dropped before mapping: two spellings, one id.
    FoldIdSpellings,
    /// The gateway judges a dispatch against the clock of its last timeout, not the time it
    /// arrived (a fresh gateway against the epoch).
    StaleGatewayClock,
    /// A fence is routed to the branch, not the gateway: the gateway never records the fence,
    /// so a dispatch it meets afterwards still runs.
    FenceToBranch,
}

/// The quiet period of [`NodeMutation::TimersOnlyWhenQuiet`], in ms.
pub const QUIET_MS: u64 = 500;

/// A token bucket per peer, holding one second's worth.
#[derive(Clone, Debug)]
struct Bucket {
    tokens: f64,
    at: UnixMillis,
}

impl Bucket {
    fn take(&mut self, rate: u32, now: UnixMillis) -> bool {
        let rate = f64::from(rate);
        let elapsed = now.0.saturating_sub(self.at.0) as f64 / 1000.0;
        self.tokens = (self.tokens + elapsed * rate).min(rate);
        self.at = self.at.max(now);
        if self.tokens >= 1.0 {
            self.tokens -= 1.0;
            true
        } else {
            false
        }
    }
}

/// The ledger part of a node: its branch, and its gateway when it runs effects.
pub struct LedgerMachine {
    /// The branch.
    pub branch: Branch,
    /// The gateway, if this node is one.
    pub gateway: Option<Gateway>,
}

/// Which part of a node a ledger message is for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LedgerTarget {
    /// The gateway: a payer's dispatch, query or fence.
    Gateway,
    /// The branch: everything a gateway or another branch answers or offers.
    Branch,
}

/// The node's routing of an arriving ledger message (the ledger simulation routes by it too,
/// and reports a message routed to a node that has no such part).
pub fn ledger_target(m: &LedgerMessage, mutation: Option<NodeMutation>) -> LedgerTarget {
    match m {
        LedgerMessage::Fence(_) if mutation == Some(NodeMutation::FenceToBranch) => {
            LedgerTarget::Branch
        }
        LedgerMessage::Dispatch { .. } | LedgerMessage::Query { .. } | LedgerMessage::Fence(_) => {
            LedgerTarget::Gateway
        }
        _ => LedgerTarget::Branch,
    }
}

/// A message for this node's gateway, from `from`, arriving at `now`: judged against the
/// time it arrived (a permit past its expiry is refused however long ago the gateway's last
/// timeout ran). The ledger simulation delivers to its gateways through this too.
pub fn gateway_in(
    g: &mut Gateway,
    now: UnixMillis,
    from: &AgentId,
    m: LedgerMessage,
    mutation: Option<NodeMutation>,
) {
    match mutation {
        // The mutant judges the permit by the clock of a gateway that never had a timeout.
        Some(NodeMutation::StaleGatewayClock) => g.handle_message(UnixMillis(0), from, m),
        _ => g.handle_message(now, from, m),
    }
}

/// The node's decisions; see the crate documentation.
pub struct NodeMachine {
    agent: AgentId,
    config: MachineConfig,
    custodian: Custodian,
    receiver: Receiver,
    ledger: Option<LedgerMachine>,
    /// Peers with an open session.
    sessions: BTreeSet<AgentId>,
    /// Peers reached through another binding.
    bindings: BTreeSet<AgentId>,
    /// What peers reached through another binding take.
    profiles: HashMap<AgentId, PeerProfile>,
    buckets: HashMap<AgentId, Bucket>,
    /// Objects dropped per peer for the rate limit.
    slowed: BTreeMap<AgentId, u64>,
    /// When maintenance is next due.
    next_maintenance: UnixMillis,
    maintenance_due: bool,
    /// The mutant's quiet period: no timer fires before this.
    quiet_until: UnixMillis,
    outgoing: VecDeque<Outgoing>,
    events: VecDeque<MachineEvent>,
}

impl NodeMachine {
    /// A node machine over machines recovered (or made fresh), at `now`.
    pub fn new(
        now: UnixMillis,
        config: MachineConfig,
        custodian: Custodian,
        receiver: Receiver,
        ledger: Option<LedgerMachine>,
    ) -> Self {
        Self {
            agent: custodian.agent().clone(),
            config,
            custodian,
            receiver,
            ledger,
            sessions: BTreeSet::new(),
            bindings: BTreeSet::new(),
            profiles: HashMap::new(),
            buckets: HashMap::new(),
            slowed: BTreeMap::new(),
            next_maintenance: UnixMillis(now.0 + config.maintenance_ms),
            maintenance_due: false,
            quiet_until: UnixMillis(0),
            outgoing: VecDeque::new(),
            events: VecDeque::new(),
        }
    }

    /// After a commit of unknown outcome: the machines as the store holds them. Sessions,
    /// bindings, profiles, rates and timers stay; what was queued to go out is dropped (the
    /// machines hand it out again).
    pub fn restore(
        &mut self,
        custodian: Custodian,
        receiver: Receiver,
        ledger: Option<LedgerMachine>,
    ) {
        self.custodian = custodian;
        self.receiver = receiver;
        self.ledger = ledger;
        self.outgoing.clear();
        self.events.clear();
    }

    /// This node.
    pub fn agent(&self) -> &AgentId {
        &self.agent
    }

    /// The custodian.
    pub fn custodian(&self) -> &Custodian {
        &self.custodian
    }

    /// The receiver.
    pub fn receiver(&self) -> &Receiver {
        &self.receiver
    }

    /// The ledger part, if any.
    pub fn ledger(&self) -> Option<&LedgerMachine> {
        self.ledger.as_ref()
    }

    /// The ledger part, for a driver's binding callers (bound dispatches, carried permits).
    pub fn ledger_mut(&mut self) -> Option<&mut LedgerMachine> {
        self.ledger.as_mut()
    }

    /// Objects dropped per peer for the rate limit.
    pub fn slowed(&self) -> &BTreeMap<AgentId, u64> {
        &self.slowed
    }

    /// An input arrived at `now` (the mutant's quiet period starts again).
    fn input(&mut self, now: UnixMillis) {
        if self.config.mutation() == Some(NodeMutation::TimersOnlyWhenQuiet) {
            self.quiet_until = UnixMillis(now.0 + QUIET_MS);
        }
    }

    /// Takes an obligation to issue.
    pub fn issue(&mut self, now: UnixMillis, o: Obligation) -> Result<Issued, IssueRefused> {
        self.input(now);
        if self.custodian.is_pending(o.id) {
            return Ok(Issued::AlreadyPending);
        }
        if let Some(profile) = self.profiles.get(&o.target) {
            profile.admit(&o)?;
        }
        self.custodian
            .issue(now, o)
            .map(Issued::New)
            .map_err(IssueRefused::Issue)
    }

    /// A verified object from `from` on `track`. Returns the obligation's id when it was an
    /// obligation whose envelope read (its ack comes out as [`MachineEvent::Acked`]).
    pub fn handle_object(
        &mut self,
        now: UnixMillis,
        from: &AgentId,
        track: Track,
        payload: &[u8],
    ) -> Option<ObligationId> {
        self.input(now);
        match track {
            Track::Obligations => self.obligation_in(now, from, payload),
            Track::Acks => {
                match decode::<CustodyAck>(payload) {
                    Ok(ack) => {
                        self.custodian.handle_ack(now, from, ack);
                    }
                    Err(err) => warn!(peer = %from, %err, "dropped an unreadable ack"),
                }
                None
            }
            Track::Ledger => {
                if self.within_rate(now, from) {
                    self.ledger_in(now, from, payload);
                }
                None
            }
        }
    }

    /// Obligation objects a binding handed in from `from` (authenticated by it): as on the
    /// obligations track. Each read envelope's id, in order.
    pub fn deliver(
        &mut self,
        now: UnixMillis,
        from: &AgentId,
        objects: &[Vec<u8>],
    ) -> Vec<Option<ObligationId>> {
        self.input(now);
        objects
            .iter()
            .map(|o| self.obligation_in(now, from, o))
            .collect()
    }

    /// An obligation a text binding named `text_id`: its id is the binding's mapping of that
    /// text ([`binding::text_obligation_id`]). `None`: the text names no id.
    pub fn deliver_text(
        &mut self,
        now: UnixMillis,
        from: &AgentId,
        text_id: &str,
        mut o: Obligation,
    ) -> Option<ObligationId> {
        let id = match self.config.mutation() {
            Some(NodeMutation::FoldIdSpellings) => {
                binding::text_obligation_id(&binding::folded(text_id))
            }
            _ => binding::text_obligation_id(text_id),
        }?;
        o.id = id;
        self.input(now);
        self.obligation_in(now, from, &encode(&o))
    }

    /// Acks a binding handed in for obligations this node issued.
    pub fn acks_in(&mut self, now: UnixMillis, from: &AgentId, acks: Vec<CustodyAck>) {
        self.input(now);
        for ack in acks {
            self.custodian.handle_ack(now, from, ack);
        }
    }

    fn obligation_in(
        &mut self,
        now: UnixMillis,
        from: &AgentId,
        payload: &[u8],
    ) -> Option<ObligationId> {
        if !self.within_rate(now, from) {
            return None;
        }
        match decode_obligation(payload) {
            Ok(o) => {
                let id = o.id;
                self.receiver.handle_obligation(now, from, o);
                Some(id)
            }
            Err(err) => match (err.envelope(), err.decline_reason()) {
                (Some(env), Some(reason)) => {
                    let id = env.id;
                    self.receiver.handle_unreadable(now, from, env, reason);
                    Some(id)
                }
                _ => {
                    warn!(peer = %from, %err, "dropped an unreadable obligation");
                    None
                }
            },
        }
    }

    fn ledger_in(&mut self, now: UnixMillis, from: &AgentId, payload: &[u8]) {
        let Some(l) = &mut self.ledger else {
            debug!(peer = %from, "a ledger object, but this node takes no part in the ledger");
            return;
        };
        let m = match decode::<LedgerMessage>(payload) {
            Ok(m) => m,
            Err(e) => {
                warn!(peer = %from, %e, "dropped an unreadable ledger object");
                return;
            }
        };
        match ledger_target(&m, self.config.mutation()) {
            LedgerTarget::Gateway => match &mut l.gateway {
                Some(g) => gateway_in(g, now, from, m, self.config.mutation()),
                None => debug!(peer = %from, "a gateway message, but this node is no gateway"),
            },
            LedgerTarget::Branch => l.branch.handle_message(now, from, m),
        }
    }

    /// A ledger message this node sends itself (it is its own gateway), delivered in place.
    pub fn ledger_local(&mut self, now: UnixMillis, m: LedgerMessage) {
        let me = self.agent.clone();
        self.ledger_in(now, &me, &encode(&m));
    }

    /// Whether `peer` may hand in one more object now. Past the limit the object is dropped
    /// unread and counted: the peer's custody (or the ledger's resend) sends it again later.
    fn within_rate(&mut self, now: UnixMillis, peer: &AgentId) -> bool {
        let rate = self.config.requests_per_second_per_peer;
        if rate == 0 {
            return true;
        }
        let bucket = self.buckets.entry(peer.clone()).or_insert(Bucket {
            tokens: f64::from(rate),
            at: now,
        });
        if bucket.take(rate, now) {
            return true;
        }
        let n = self.slowed.entry(peer.clone()).or_default();
        *n += 1;
        if *n == 1 || n.is_power_of_two() {
            warn!(%peer, limit = rate, dropped = *n, "requests per second per peer limit: dropped unread, to be sent again");
        }
        false
    }

    /// A session with `peer` is up.
    pub fn session_up(&mut self, peer: &AgentId) {
        self.sessions.insert(peer.clone());
    }

    /// The session with `peer` ended.
    pub fn session_down(&mut self, peer: &AgentId) {
        self.sessions.remove(peer);
    }

    /// The agent's own decision on an obligation it was asked about
    /// ([`MachineEvent::Decide`]); `false` if none waits under `id`.
    pub fn decided(&mut self, now: UnixMillis, id: ObligationId, decision: PolicyDecision) -> bool {
        self.input(now);
        self.receiver.decided(now, id, decision).is_some()
    }

    /// `peer` subscribed to its obligations track: what is pending for it is offered now.
    pub fn peer_ready(&mut self, now: UnixMillis, peer: &AgentId) {
        self.input(now);
        self.custodian.handle_peer_ready(now, peer);
    }

    /// `peer` is reached through another binding from now on: what is pending for it goes
    /// now.
    pub fn attach(&mut self, now: UnixMillis, peer: &AgentId) {
        self.bindings.insert(peer.clone());
        self.peer_ready(now, peer);
    }

    /// The binding to `peer` let go: custody retries, over a session if one comes up.
    pub fn detach(&mut self, peer: &AgentId) {
        self.bindings.remove(peer);
    }

    /// Sets (or clears) what `peer` takes.
    pub fn set_profile(&mut self, peer: AgentId, profile: Option<PeerProfile>) {
        match profile {
            Some(p) => self.profiles.insert(peer, p),
            None => self.profiles.remove(&peer),
        };
    }

    /// The earliest deadline of every timer: the custody machines', the ledger branch's and
    /// gateway's, maintenance. A deadline, not a period: nothing that arrives meanwhile moves
    /// it.
    pub fn poll_timeout(&self) -> Option<UnixMillis> {
        let (branch, gateway) = match &self.ledger {
            Some(l) => (
                l.branch.poll_timeout(),
                l.gateway.as_ref().and_then(Gateway::poll_timeout),
            ),
            None => (None, None),
        };
        let earliest = [
            self.custodian.poll_timeout(),
            self.receiver.poll_timeout(),
            branch,
            gateway,
            Some(self.next_maintenance),
        ]
        .into_iter()
        .flatten()
        .min();
        match self.config.mutation() {
            Some(NodeMutation::TimersOnlyWhenQuiet) => earliest.map(|t| t.max(self.quiet_until)),
            _ => earliest,
        }
    }

    /// Fires every timer whose deadline is at or before `now`, whatever woke the driver.
    pub fn handle_timeout(&mut self, now: UnixMillis) {
        if self.config.mutation() == Some(NodeMutation::TimersOnlyWhenQuiet)
            && now < self.quiet_until
        {
            return;
        }
        let custody_due = [self.custodian.poll_timeout(), self.receiver.poll_timeout()]
            .into_iter()
            .flatten()
            .any(|w| w <= now);
        if custody_due {
            self.custodian.handle_timeout(now);
            self.receiver.handle_timeout(now);
        }
        if let Some(l) = &mut self.ledger {
            if l.branch.poll_timeout().is_some_and(|t| t <= now) {
                l.branch.handle_timeout(now);
            }
            if let Some(g) = &mut l.gateway {
                if g.poll_timeout().is_some_and(|t| t <= now) {
                    g.handle_timeout(now);
                }
            }
        }
        if now >= self.next_maintenance {
            self.maintenance_due = true;
            self.next_maintenance = UnixMillis(now.0 + self.config.maintenance_ms);
        }
    }

    /// Whether maintenance is due (once per period): the driver commits what is queued,
    /// then calls [`Self::maintain`] and folds the store at the same `now`.
    pub fn take_maintenance(&mut self) -> bool {
        std::mem::take(&mut self.maintenance_due)
    }

    /// Maintenance of the machines' memory at `now`: the custodian folds its principal
    /// state, the receiver forgets expired tokens. Returns how much was folded.
    pub fn maintain(&mut self, now: UnixMillis) -> usize {
        self.custodian.maintain(now) + self.receiver.maintain(now)
    }

    /// Everything every machine handed out since the last call, for one commit; `None` when
    /// there is nothing to write.
    pub fn poll_commit(&mut self) -> Option<Commit> {
        let mut records = Vec::new();
        let mut token = CommitToken {
            custodian: Vec::new(),
            receiver: Vec::new(),
            branch: Vec::new(),
            gateway: Vec::new(),
        };
        while let Some(p) = self.custodian.poll_persist() {
            records.push(Record::Custodian(p.record));
            token.custodian.push(p.token);
        }
        while let Some(p) = self.receiver.poll_persist() {
            records.push(Record::Receiver(p.record));
            token.receiver.push(p.token);
        }
        if let Some(l) = &mut self.ledger {
            while let Some((t, s)) = l.branch.poll_persist() {
                records.push(Record::Ledger(s));
                token.branch.push(t);
            }
            if let Some(g) = &mut l.gateway {
                while let Some((t, r)) = g.poll_persist() {
                    records.push(Record::Gateway(r));
                    token.gateway.push(t);
                }
            }
        }
        (!records.is_empty()).then_some(Commit { records, token })
    }

    /// The records of a [`Commit`] are durable: what depended on them is released.
    pub fn handle_committed(&mut self, now: UnixMillis, token: CommitToken) {
        for t in token.custodian {
            self.custodian.handle_persisted(now, t);
        }
        for t in token.receiver {
            self.receiver.handle_persisted(t);
        }
        if let Some(l) = &mut self.ledger {
            for t in token.branch {
                l.branch.handle_persisted(t);
            }
            if let Some(g) = &mut l.gateway {
                for t in token.gateway {
                    g.handle_persisted(t);
                }
            }
        }
    }

    /// Whether a custody timer is due at `now` (releasing a commit can make one due: an
    /// escalation's timer, a re-offer).
    pub fn custody_due(&self, now: UnixMillis) -> bool {
        self.custodian.poll_timeout().is_some_and(|w| w <= now)
    }

    /// The next group to send. Custody's transmits go to the peer's binding if it has one,
    /// else its session, else nowhere yet (custody retries, and re-offers when the peer
    /// subscribes again); acks go on the session.
    pub fn poll_transmit(&mut self) -> Option<Outgoing> {
        self.gather();
        self.outgoing.pop_front()
    }

    /// The next event.
    pub fn poll_event(&mut self) -> Option<MachineEvent> {
        self.gather();
        self.events.pop_front()
    }

    /// What the custody machines released, grouped (at most `batch` objects a group, one
    /// group per peer, route, track and channel, in the order handed out).
    fn gather(&mut self) {
        let mut groups: Vec<Outgoing> = Vec::new();
        let mut open: HashMap<(AgentId, Route, Track, bool), usize> = HashMap::new();
        let batch = self.config.batch.max(1);
        let mut add = |to: &AgentId, route: Route, track: Track, datagram: bool, bytes, attempt| {
            let key = (to.clone(), route, track, datagram);
            if let Some(&i) = open.get(&key) {
                let g = &mut groups[i];
                if g.objects.len() < batch && route == Route::Session {
                    g.objects.push(bytes);
                    g.attempts.push(attempt);
                    return;
                }
            }
            open.insert(key, groups.len());
            groups.push(Outgoing {
                to: to.clone(),
                route,
                track,
                datagram,
                objects: vec![bytes],
                attempts: vec![attempt],
            });
        };
        while let Some(t) = self.custodian.poll_transmit() {
            let route = if self.bindings.contains(&t.to) {
                Route::Binding
            } else if self.sessions.contains(&t.to) {
                Route::Session
            } else {
                continue;
            };
            let datagram = route == Route::Session && t.channel == Channel::Datagram;
            add(
                &t.to,
                route,
                Track::Obligations,
                datagram,
                encode(&t.obligation),
                t.attempt,
            );
        }
        while let Some(a) = self.receiver.poll_transmit() {
            self.events.push_back(MachineEvent::Acked {
                to: a.to.clone(),
                ack: a.ack.clone(),
            });
            if self.sessions.contains(&a.to) {
                add(&a.to, Route::Session, Track::Acks, false, encode(&a.ack), 0);
            }
        }
        self.outgoing.extend(groups);
        while let Some(e) = self.custodian.poll_event() {
            self.events.push_back(match e {
                CustodianEvent::Accepted { id } => MachineEvent::Accepted(id),
                CustodianEvent::Terminal { record, escalation } => {
                    MachineEvent::Terminal { record, escalation }
                }
                CustodianEvent::Reconciled(note) => MachineEvent::Reconciled(note),
                _ => continue,
            });
        }
        while let Some(e) = self.receiver.poll_event() {
            match e {
                ReceiverEvent::Applied {
                    id,
                    issuer,
                    payload,
                } => self.events.push_back(MachineEvent::Applied {
                    id,
                    issuer,
                    kind: payload.kind(),
                    payload,
                }),
                ReceiverEvent::Decide { obligation } => {
                    self.events.push_back(MachineEvent::Decide(obligation));
                }
                ReceiverEvent::Declined { .. } => {}
            }
        }
    }
}

#[cfg(test)]
mod tests;
