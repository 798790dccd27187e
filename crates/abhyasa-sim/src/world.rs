//! The simulated world: a principal's custodian, target agents' receivers, a rogue agent, a
//! seeded network and disks that keep only what was committed.

use std::collections::{BTreeMap, BTreeSet};

use crate::rng::SimRng;
use abhyasa_custody::{
    AppliedRecord, Custodian, CustodianConfig, CustodianRecord, EscalatedRecord, GovernedKey,
    Mutation, PendingRecord, PrincipalState, Receiver, ReceiverConfig, ReceiverRecord,
    ReceiverState,
};
use abhyasa_machine::{
    Commit, IssueRefused, MachineConfig, MachineEvent, NodeMachine, Record, Route, Track,
};
use abhyasa_wire::{
    decode, decode_obligation, encode, AckStatus, AgentId, CustodyAck, DeclineReason, Escalation,
    Kind, LastObserved, Obligation, ObligationId, Outcome, Payload, TerminalRecord, UnixMillis,
};
use rand::Rng;

use crate::oracle::{self, PrincipalOracle, ReceiverOracle};
use crate::scenario::{Scenario, MAX_REPLAY};
mod disk;
mod network;
mod oracles;

/// What crosses the simulated network: encoded bytes, signed by their sender, as on a real
/// link.
#[derive(Clone, Debug)]
enum Message {
    Obligation(Signed),
    Ack(Signed),
}

impl Message {
    fn signed(&self) -> &Signed {
        match self {
            Message::Obligation(s) | Message::Ack(s) => s,
        }
    }

    fn signed_mut(&mut self) -> &mut Signed {
        match self {
            Message::Obligation(s) | Message::Ack(s) => s,
        }
    }
}

/// The simulation's stand-in for the COSE_Sign1 envelope (`abhyasa_moq::signed`): `tag` is a
/// keyed digest of the bytes that only `signer`'s key produces. Before a machine sees a
/// message the world checks the tag and that the signer is the node the message claims to
/// come from — what a node does with the real envelope.
#[derive(Clone, Debug)]
struct Signed {
    signer: usize,
    /// Which of the signer's certificates (they expire and rotate: see
    /// [`crate::NodeParams::cert_ms`]) signed it.
    generation: u64,
    bytes: Vec<u8>,
    tag: u64,
}

impl Signed {
    fn new(signer: usize, bytes: Vec<u8>) -> Self {
        let tag = signature(signer, 0, &bytes);
        Self {
            signer,
            generation: 0,
            bytes,
            tag,
        }
    }

    /// Signed again with certificate `generation` of its signer.
    fn with_generation(mut self, generation: u64) -> Self {
        self.generation = generation;
        self.tag = signature(self.signer, generation, &self.bytes);
        self
    }
}

/// The digest only `signer`'s key of certificate `generation` produces (the model: nobody
/// else ever computes it for them).
fn signature(signer: usize, generation: u64, bytes: &[u8]) -> u64 {
    use std::hash::{Hash, Hasher};
    let mut h = std::collections::hash_map::DefaultHasher::new();
    (0x0061_6268_7961_7361_u64, signer, generation, bytes).hash(&mut h);
    h.finish()
}

/// How many times, beside the ends of leases, the world probes who may exercise a consent
/// scope.
const PROBES: u32 = 24;

/// The relay on the path: a deployment member with its own valid key.
const RELAY: usize = usize::MAX - 1;

#[derive(Clone, Debug)]
enum Event {
    Issue(usize),
    Deliver {
        from: usize,
        to: usize,
        message: Message,
    },
    Commit {
        node: usize,
        incarnation: u32,
        crash_after: bool,
    },
    Crash(usize),
    Restart(usize),
    RogueAck,
    /// The target node's session is (again) subscribed: the custodian re-offers.
    PeerReady(usize),
    /// The target node's session drops and comes back at once.
    Flap(usize),
    /// The target sends the principal a stale ack (steady traffic), and the next one is due.
    Chatter(usize),
    /// Every side that could exercise or permit a consent scope is asked whether it does now.
    Probe,
}

/// The custodian's disk.
#[derive(Default)]
struct CustodianDisk {
    pending: BTreeMap<ObligationId, PendingRecord>,
    terminal: BTreeMap<ObligationId, TerminalRecord>,
    escalations: BTreeMap<ObligationId, Escalation>,
    principal: Option<PrincipalState>,
    notes: BTreeMap<ObligationId, u32>,
}

/// A receiver's disk.
#[derive(Default)]
struct ReceiverDisk {
    applied: BTreeMap<ObligationId, (UnixMillis, abhyasa_wire::Digest, AgentId)>,
    last_sequence: BTreeMap<GovernedKey, u64>,
    /// The governed key of every apply (a store's governed-by rows).
    governed: std::collections::BTreeSet<GovernedKey>,
    state: ReceiverState,
    /// Checker-only: every apply ever committed, never pruned.
    apply_count: BTreeMap<ObligationId, u32>,
    /// Checker-only: the committed applies, in commit order.
    apply_log: Vec<ObligationId>,
}

struct Node {
    agent: AgentId,
    /// The whole node machine: a custodian, a receiver and the node's own decisions.
    machine: Option<Box<NodeMachine>>,
    incarnation: u32,
    /// Commits handed out, not yet written.
    queue: Vec<Commit>,
    commit_scheduled: bool,
    /// Offset of this node's clock from true time, in ms.
    skew: i64,
    /// Kinds this node's build does not know.
    unsupported: BTreeSet<Kind>,
}

/// The tallies of one run.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct RunReport {
    /// Obligations issued.
    pub obligations: u64,
    /// Ended applied.
    pub applied: u64,
    /// Ended declined.
    pub declined: u64,
    /// Ended escalated.
    pub escalated: u64,
    /// Sent best-effort.
    pub best_effort: u64,
    /// Late acks noted against escalations.
    pub reconciled: u64,
    /// Crashes injected.
    pub crashes: u64,
    /// Re-subscriptions the custodian was told of (`handle_peer_ready`).
    pub resubscriptions: u64,
    /// Issues refused as `Full` (and issued again later).
    pub full_refusals: u64,
    /// `declined` acks sent, by reason: malformed, refused (misrouted), superseded.
    pub declines_malformed: u64,
    /// See `declines_malformed`.
    pub declines_refused: u64,
    /// See `declines_malformed`.
    pub declines_superseded: u64,
    /// Admissible obligations accepted under custody that ended in no terminal state.
    pub lost: u64,
    /// Obligations applied more than once by a receiver.
    pub double_applied: u64,
    /// Copies the relay altered, relabelled or forged.
    pub tampered: u64,
    /// Messages dropped because their signature did not verify (or did not name the node
    /// they claimed to come from).
    pub unverified: u64,
    /// Messages dropped because the certificate that signed them had expired (or was not yet
    /// valid) when they arrived.
    pub expired_certs: u64,
    /// Probes that found an agent holding a grant whose lease had ended (and that agent
    /// refusing it, or a violation).
    pub lapsed_probes: u64,
    /// Probes that found an agent holding a weight change that had lapsed (and that agent
    /// not counting it).
    pub lapsed_weight_probes: u64,
    /// Invariant violations found, described.
    pub violations: Vec<String>,
}

/// One deterministic run of a scenario.
pub(crate) struct World {
    scenario: Scenario,
    rng: SimRng,
    now: u64,
    seq: u64,
    events: BTreeMap<(u64, u64), Event>,
    nodes: Vec<Node>,
    rogue: AgentId,
    /// How many principals (nodes `0..principals`); targets follow.
    principals: usize,
    /// Each principal's custodian disk.
    cdisks: Vec<CustodianDisk>,
    /// Each target's receiver disk (target node `principals + i`).
    rdisks: Vec<ReceiverDisk>,
    /// The obligations issued so far, by id.
    issued: BTreeMap<ObligationId, Obligation>,
    /// Admissible obligations whose custody was accepted (pending record durable).
    accepted: BTreeSet<ObligationId>,
    /// Index in the scenario of each issued obligation.
    index: BTreeMap<ObligationId, usize>,
    /// Ids ever written to the custodian's pending set.
    ever_pending: BTreeSet<ObligationId>,
    /// (principal, its clock) at which a custodian came back up.
    custodian_restarts: BTreeSet<(usize, UnixMillis)>,
    /// Gilbert–Elliott state per directed link: true = bad.
    burst: BTreeMap<(usize, usize), bool>,
    /// Every obligation of the scenario, by id (the checker's own copy).
    all: BTreeMap<ObligationId, Obligation>,
    /// Transmissions of each obligation under custody by the custodian.
    transmissions: BTreeMap<ObligationId, u32>,
    /// Obligations their own target declined (a `declined` ack it sent).
    declined_by_target: BTreeMap<ObligationId, BTreeSet<DeclineReason>>,
    /// Each principal's expected state, fed in disk commit order.
    principal_oracles: Vec<PrincipalOracle>,
    /// Links (target node) cut until this true time by a flap.
    flapping: BTreeMap<usize, u64>,
    /// (principal node, target node, scope) of every consent decision: what a probe asks.
    probed: Vec<(usize, usize, abhyasa_wire::Scope)>,
    /// (principal node, target node, weight key) of every belief update: what a probe weighs.
    weighed: Vec<(usize, usize, abhyasa_wire::WeightKey)>,
    report: RunReport,
}

impl World {
    pub(crate) fn new(scenario: Scenario, rng: SimRng) -> Self {
        let principals = scenario.principals.max(1);
        let mut nodes: Vec<Node> = (0..principals)
            .map(|p| Node::new(crate::scenario::principal_name(p), 0))
            .collect();
        for (i, t) in scenario.targets.iter().enumerate() {
            let mut node = Node::new(AgentId::new(format!("agent-{i}")).expect("valid"), t.skew);
            node.unsupported = t.unsupported.clone();
            nodes.push(node);
        }
        let rdisks = scenario
            .targets
            .iter()
            .map(|_| ReceiverDisk {
                state: ReceiverState::new(
                    scenario.receiver.weight_min,
                    scenario.receiver.weight_max,
                ),
                ..ReceiverDisk::default()
            })
            .collect();
        let mut world = Self {
            scenario,
            rng,
            now: 0,
            seq: 0,
            events: BTreeMap::new(),
            nodes,
            rogue: AgentId::new("rogue").expect("valid"),
            principals,
            cdisks: (0..principals).map(|_| CustodianDisk::default()).collect(),
            rdisks,
            issued: BTreeMap::new(),
            ever_pending: BTreeSet::new(),
            accepted: BTreeSet::new(),
            index: BTreeMap::new(),
            custodian_restarts: BTreeSet::new(),
            burst: BTreeMap::new(),
            all: BTreeMap::new(),
            transmissions: BTreeMap::new(),
            declined_by_target: BTreeMap::new(),
            principal_oracles: (0..principals)
                .map(|_| PrincipalOracle::default())
                .collect(),
            flapping: BTreeMap::new(),
            probed: Vec::new(),
            weighed: Vec::new(),
            report: RunReport::default(),
        };
        world.all = world
            .scenario
            .obligations
            .iter()
            .map(|o| (o.id, o.clone()))
            .collect();
        for i in 0..world.nodes.len() {
            world.boot(i);
        }
        world.schedule_plan();
        world
    }

    fn schedule_plan(&mut self) {
        let issues: Vec<u64> = self
            .scenario
            .obligations
            .iter()
            .map(|o| o.created_at.0 - self.scenario.epoch)
            .collect();
        for (i, at) in issues.into_iter().enumerate() {
            self.push(at, Event::Issue(i));
        }
        for &(node, at, down) in &self.scenario.crashes.clone() {
            self.push(at, Event::Crash(node));
            self.push(at + down, Event::Restart(node));
        }
        for &at in &self.scenario.rogue_acks.clone() {
            self.push(at, Event::RogueAck);
        }
        for &(node, _, end) in &self.scenario.partitions.clone() {
            if end != u64::MAX {
                self.ready_after(node, end);
            }
        }
        if let Some(every) = self.scenario.node.chatter_ms {
            for t in self.principals..self.nodes.len() {
                let first = self.rng.random_range(0..every);
                self.push(first, Event::Chatter(t));
            }
        }
        for &(node, start, count, interval) in &self.scenario.flaps.clone() {
            for k in 0..u64::from(count) {
                self.push(start + k * interval, Event::Flap(node));
            }
        }
        self.probed = self.named_pairs(|p| match p {
            Payload::AnumatiConsent(c) => Some(c.scope.clone()),
            _ => None,
        });
        self.weighed = self.named_pairs(|p| match p {
            Payload::PhalaBeliefUpdate(b) => Some(b.weight_key.clone()),
            _ => None,
        });
        if !self.probed.is_empty() || !self.weighed.is_empty() {
            // Around every lease's end and every belief update's lapse, where an agent's
            // clock (skewed either way) passes it, and at moments drawn across the run.
            let ends: Vec<u64> = self
                .scenario
                .obligations
                .iter()
                .filter_map(|o| match &o.payload {
                    Payload::AnumatiConsent(c) => c.expires_at,
                    Payload::PhalaBeliefUpdate(b) => Some(oracle::lapse(o.created_at, b.ttl_ms)),
                    _ => None,
                })
                .map(|end| end.0.saturating_sub(self.scenario.epoch))
                .filter(|end| *end < self.scenario.end)
                .collect();
            let skew = self.scenario.receiver.max_clock_skew_ms;
            for end in ends {
                for at in [
                    end.saturating_sub(skew),
                    end.saturating_sub(1),
                    end,
                    end + skew,
                ] {
                    self.push(at, Event::Probe);
                }
            }
            for _ in 0..PROBES {
                let at = self.rng.random_range(0..self.scenario.end);
                self.push(at, Event::Probe);
            }
        }
    }

    /// Sessions come back after `node` (a target, or a principal: every target) was cut
    /// off or down: each target re-subscribes a few ms after `at`.
    fn ready_after(&mut self, node: usize, at: u64) {
        let targets: Vec<usize> = if self.is_principal(node) {
            (self.principals..self.nodes.len()).collect()
        } else {
            vec![node]
        };
        for t in targets {
            let delay = self.rng.random_range(1..=20);
            self.push(at + delay, Event::PeerReady(t));
        }
    }

    fn is_principal(&self, node: usize) -> bool {
        node < self.principals
    }

    /// The node of the principal that issued `o`.
    fn issuer_of(&self, o: &Obligation) -> usize {
        (0..self.principals)
            .find(|&p| self.nodes[p].agent == o.issuer)
            .unwrap_or(0)
    }

    /// The receiver disk of target node `node`.
    fn rdisk(&self, node: usize) -> &ReceiverDisk {
        &self.rdisks[node - self.principals]
    }

    fn push(&mut self, at: u64, event: Event) {
        self.seq += 1;
        self.events.insert((at, self.seq), event);
    }

    fn time(&self, node: usize) -> UnixMillis {
        let t = (self.scenario.epoch + self.now) as i64 + self.nodes[node].skew;
        UnixMillis(t.max(0) as u64)
    }

    /// Runs to the end and checks the final state.
    pub(crate) fn run(mut self) -> RunReport {
        let end = self.scenario.end;
        loop {
            let next_event = self.events.first_key_value().map(|(k, _)| k.0);
            let next_timer = self.next_timer();
            let next = match (next_event, next_timer) {
                (Some(e), Some((t, _))) => e.min(t),
                (Some(e), None) => e,
                (None, Some((t, _))) => t,
                (None, None) => break,
            };
            if next > end {
                break;
            }
            self.now = self.now.max(next);
            match next_timer {
                Some((t, node)) if next_event.is_none_or(|e| t < e) => self.fire_timer(node),
                _ => {
                    let (_, event) = self.events.pop_first().expect("an event is due");
                    self.dispatch(event);
                }
            }
        }
        self.now = end;
        // The custodians run once more past every deadline.
        for p in 0..self.principals {
            if self.nodes[p].machine.is_none() {
                self.restart(p);
            }
            self.fire_timer(p);
        }
        // Let the last group commits land (no more faults from here on).
        for node in 0..self.nodes.len() {
            if self.nodes[node].machine.is_some() && !self.nodes[node].queue.is_empty() {
                self.commit(node, false);
            }
        }
        self.check_end();
        self.report.obligations = self.issued.len() as u64;
        self.report
    }

    fn next_timer(&self) -> Option<(u64, usize)> {
        let mut best: Option<(u64, usize)> = None;
        for (i, node) in self.nodes.iter().enumerate() {
            let at = node.machine.as_ref().and_then(|m| m.poll_timeout());
            if let Some(at) = at {
                // Back into true time; a timer in the past is due now. Wide arithmetic: a
                // timer near `u64::MAX` (a deadline a relay altered, under the
                // `accept_unverified` mutant) is far in the future, not wrapped into the past.
                let t =
                    (i128::from(at.0) - i128::from(node.skew) - i128::from(self.scenario.epoch))
                        .max(i128::from(self.now));
                let t = u64::try_from(t).unwrap_or(u64::MAX);
                if best.is_none_or(|(b, _)| t < b) {
                    best = Some((t, i));
                }
            }
        }
        best
    }

    fn fire_timer(&mut self, node: usize) {
        let now = self.time(node);
        match &mut self.nodes[node].machine {
            Some(m) => m.handle_timeout(now),
            None => return,
        }
        self.flush(node);
    }

    fn dispatch(&mut self, event: Event) {
        match event {
            Event::Issue(i) => self.issue(i),
            Event::Deliver { from, to, message } => self.deliver(from, to, message),
            Event::Commit {
                node,
                incarnation,
                crash_after,
            } => {
                if self.nodes[node].incarnation == incarnation && self.nodes[node].machine.is_some()
                {
                    self.commit(node, crash_after);
                }
            }
            Event::Crash(node) => self.crash(node),
            Event::Restart(node) => {
                if self.nodes[node].machine.is_none() {
                    self.restart(node);
                }
            }
            Event::RogueAck => self.rogue_ack(),
            Event::PeerReady(target) => self.peer_ready(target),
            Event::Flap(target) => {
                // The session drops (what is in flight on it is lost) and the target
                // re-subscribes a moment later.
                let back = self.now + self.rng.random_range(1..=10);
                self.flapping.insert(target, back);
                self.push(back, Event::PeerReady(target));
            }
            Event::Chatter(target) => self.chatter(target),
            Event::Probe => self.probe(),
        }
    }

    /// Agent node `t`'s view as its applies on disk give it, replayed in commit order.
    fn replayed(&self, t: usize) -> ReceiverOracle {
        let cfg = &self.scenario.receiver;
        let mut view = ReceiverOracle::new(cfg.weight_min, cfg.weight_max);
        for o in self
            .rdisk(t)
            .apply_log
            .iter()
            .filter_map(|id| self.all.get(id))
        {
            view.apply(o);
        }
        view
    }

    /// Every distinct (principal node, target node, name) that `name` picks out of the
    /// scenario's obligations, in order: what a probe asks about.
    fn named_pairs<T: Ord>(&self, name: impl Fn(&Payload) -> Option<T>) -> Vec<(usize, usize, T)> {
        let pairs: BTreeSet<(usize, usize, T)> = self
            .scenario
            .obligations
            .iter()
            .filter_map(|o| {
                let n = name(&o.payload)?;
                let p = (0..self.principals).find(|&p| self.nodes[p].agent == o.issuer)?;
                let t = (self.principals..self.nodes.len())
                    .find(|&t| self.nodes[t].agent == o.target)?;
                Some((p, t, n))
            })
            .collect();
        pairs.into_iter().collect()
    }

    /// Asks each principal's enforcement answer ([`PrincipalState::permits`], what
    /// `Node::decide` answers) and each agent's view ([`ReceiverState::permits`], what a
    /// governed tool checks) whether a consent scope may be exercised now, on what is
    /// durable, and holds the answer against the oracles: no authority past its lease, none
    /// withheld, none unconfirmed — even when every renewal is lost. Then weighs every route
    /// a belief update touched, on the principal's side (`PrincipalState::routing_weight`) and
    /// the agent's (`ReceiverState::weight`): no change counted past its lapse, none dropped
    /// before it.
    fn probe(&mut self) {
        let mut found = Vec::new();
        let mut lapsed = 0;
        // Each agent's view from its applies, replayed once per probe.
        let mut views: BTreeMap<usize, ReceiverOracle> = BTreeMap::new();
        for (p, t, scope) in &self.probed {
            let (p, t) = (*p, *t);
            let (issuer, target) = (&self.nodes[p].agent, &self.nodes[t].agent);
            let now = self.time(p);
            let got = self.cdisks[p]
                .principal
                .as_ref()
                .and_then(|s| s.permits(target, scope, now))
                .unwrap_or(true);
            let expected = self.principal_oracles[p]
                .standing(target, scope)
                .is_none_or(|s| s.permits(now));
            if got != expected {
                found.push(format!(
                    "{issuer} {} {scope} to {target} at {now}; its decisions {} it",
                    if got { "permits" } else { "refuses" },
                    if expected { "permit" } else { "refuse" },
                ));
            }
            let now = self.time(t);
            let disk = self.rdisk(t);
            let view = views.entry(t).or_insert_with(|| self.replayed(t));
            let got = disk.state.permits(issuer, scope, now);
            let expected = view.permits(issuer, scope, now);
            let ended = view.lapsed(issuer, scope, now);
            lapsed += u64::from(ended);
            if got != expected {
                found.push(format!(
                    "{target} {} {scope} of {issuer} at {now}; {}",
                    if got { "exercises" } else { "withholds" },
                    match (expected, ended) {
                        (true, _) => "its applies permit it",
                        (false, true) => "authority used past its lease",
                        (false, false) => "authority used while its applies withhold it",
                    }
                ));
            }
        }
        let bounds = self.scenario.custodian.weight_bounds;
        let mut lapsed_changes = 0;
        for (p, t, key) in &self.weighed {
            let (p, t) = (*p, *t);
            let (issuer, target) = (&self.nodes[p].agent, &self.nodes[t].agent);
            let now = self.time(p);
            let got = self.cdisks[p]
                .principal
                .as_ref()
                .map_or(bounds.initial, |s| s.routing_weight(target, key, now));
            let expected = self.principal_oracles[p].routing_weight(target, key, now, bounds);
            if got != expected {
                found.push(format!(
                    "{issuer} routes {key} to {target} at weight {got} at {now}; the \
                     down-weights in force give {expected}"
                ));
            }
            let now = self.time(t);
            let disk = self.rdisk(t);
            let view = views.entry(t).or_insert_with(|| self.replayed(t));
            let got = disk.state.weight(issuer, key, now);
            let expected = view.weight(issuer, key, now);
            lapsed_changes += u64::from(view.has_lapsed(issuer, key, now));
            if got != expected {
                found.push(format!(
                    "{target} weighs {key} of {issuer} at {got} at {now}; the changes it \
                     applied that have not lapsed give {expected}"
                ));
            }
        }
        self.report.lapsed_probes += lapsed;
        self.report.lapsed_weight_probes += lapsed_changes;
        for f in found {
            self.violation(f);
        }
    }

    /// A stale ack from `target` to the principal (an id nobody issued: it changes nothing),
    /// and the next one scheduled.
    fn chatter(&mut self, target: usize) {
        if let Some(every) = self.scenario.node.chatter_ms {
            self.push(self.now + every, Event::Chatter(target));
        }
        if self.nodes[target].machine.is_none() {
            return;
        }
        let ack = CustodyAck {
            obligation_id: ObligationId::from_u128(u128::MAX - self.now as u128),
            target: self.nodes[target].agent.clone(),
            status: AckStatus::Applied,
            acked_at: self.time(target),
            detail: None,
        };
        for p in 0..self.principals {
            self.send(target, p, Message::Ack(Signed::new(target, encode(&ack))));
        }
    }

    fn peer_ready(&mut self, target: usize) {
        if self.nodes[target].machine.is_none() {
            return;
        }
        let agent = self.nodes[target].agent.clone();
        for p in 0..self.principals {
            if self.cut_off(p, target) {
                continue; // No session can come up.
            }
            let now = self.time(p);
            if let Some(m) = &mut self.nodes[p].machine {
                m.peer_ready(now, &agent);
                self.report.resubscriptions += 1;
                self.flush(p);
            }
        }
    }

    fn cut_off(&self, from: usize, to: usize) -> bool {
        let partitioned = self.scenario.partitions.iter().any(|&(node, start, end)| {
            (node == from || node == to) && (start..end).contains(&self.now)
        });
        let flapping = [from, to]
            .iter()
            .any(|n| self.flapping.get(n).is_some_and(|&until| self.now < until));
        partitioned || flapping
    }

    fn issue(&mut self, i: usize) {
        let o = self.scenario.obligations[i].clone();
        let p = self.issuer_of(&o);
        if self.nodes[p].machine.is_none() {
            // The principal is down: the application issues again once it is back.
            let at = self.now + 10;
            self.push(at, Event::Issue(i));
            return;
        }
        let now = self.time(p);
        if o.deadline <= now {
            return; // Too late to issue at all; it never existed.
        }
        // Issuing is idempotent on the id: one the disk already holds is already accepted
        // (a re-issue after a crash that hid the acceptance).
        let disk = &self.cdisks[p];
        if disk.pending.contains_key(&o.id) || disk.terminal.contains_key(&o.id) {
            self.accepted.insert(o.id);
            self.index.insert(o.id, i);
            self.issued.insert(o.id, o);
            return;
        }
        let Some(m) = &mut self.nodes[p].machine else {
            return;
        };
        match m.issue(now, o.clone()) {
            Ok(_) => {
                self.index.insert(o.id, i);
                self.issued.insert(o.id, o);
            }
            Err(IssueRefused::Issue(abhyasa_custody::IssueError::Full { .. })) => {
                self.report.full_refusals += 1;
                // Custody is full: the application tries again a little later.
                let at = self.now + 20;
                self.push(at, Event::Issue(i));
            }
            Err(e) => self.violation(format!("issue of {} refused: {e:?}", o.id)),
        }
        self.flush(p);
    }

    /// Drains a node machine's queues after an input: its commit to the commit queue,
    /// transmits to the network (checked against the disk first), events to the tallies.
    fn flush(&mut self, node: usize) {
        let now_true = self.now;
        let now = self.time(node);
        let Some(m) = self.nodes[node].machine.as_mut() else {
            return;
        };
        let commit = m.poll_commit();
        let outgoing: Vec<_> = std::iter::from_fn(|| m.poll_transmit()).collect();
        let events: Vec<_> = std::iter::from_fn(|| m.poll_event()).collect();
        if let Some(c) = commit {
            for r in &c.records {
                if let Record::Receiver(ReceiverRecord::Apply { id, .. }) = r {
                    let deadline = self.issued.get(id).map(|o| o.deadline);
                    if deadline.is_some_and(|d| now > d) {
                        self.violation(format!("{id} applied after its deadline"));
                    }
                }
            }
            self.nodes[node].queue.push(c);
        }
        for e in events {
            match e {
                MachineEvent::Reconciled(_) => self.report.reconciled += 1,
                MachineEvent::Accepted(id) => {
                    self.accepted.insert(id);
                }
                _ => {}
            }
        }
        let mut sends: Vec<(usize, Message)> = Vec::new();
        for out in outgoing {
            let Some(to) = self.nodes.iter().position(|n| n.agent == out.to) else {
                continue;
            };
            let text_target = self.scenario.node.text_targets.contains(&to);
            if out.track == Track::Obligations
                && (out.route == Route::Binding) != (self.is_principal(node) && text_target)
            {
                self.violation(format!(
                    "obligations to {} sent on the {:?} route",
                    out.to, out.route
                ));
            }
            for (bytes, attempt) in out.objects.into_iter().zip(out.attempts) {
                match out.track {
                    Track::Obligations => {
                        let Ok(o) = decode_obligation(&bytes) else {
                            self.violation("an obligation sent that does not decode".into());
                            continue;
                        };
                        if let Some(bytes) = self.custody_transmit(node, now, &o, attempt) {
                            if self.scenario.lost.contains(&o.id) {
                                continue; // Every copy of a lost renewal is lost.
                            }
                            sends.push((to, Message::Obligation(Signed::new(node, bytes))));
                        }
                    }
                    Track::Acks => {
                        let Ok(ack) = decode::<CustodyAck>(&bytes) else {
                            self.violation("an ack sent that does not decode".into());
                            continue;
                        };
                        self.ack_transmit(node, &ack);
                        sends.push((to, Message::Ack(Signed::new(node, bytes))));
                    }
                    Track::Ledger => {}
                }
            }
        }
        for (to, message) in sends {
            self.send(node, to, message);
        }
        let n = &mut self.nodes[node];
        if !n.queue.is_empty() && !n.commit_scheduled {
            n.commit_scheduled = true;
            let incarnation = n.incarnation;
            let latency = self.rng.random_range(0..=self.scenario.commit_latency);
            let crash_after = self.rng.random_bool(self.scenario.crash_after_commit);
            self.push(
                now_true + latency,
                Event::Commit {
                    node,
                    incarnation,
                    crash_after,
                },
            );
        }
    }

    /// Checks an obligation `node` sends (attempt `attempt`; 0: best-effort) against the
    /// disk; the bytes that go on the wire (unreadable to the target for a malformed one).
    fn custody_transmit(
        &mut self,
        node: usize,
        now: UnixMillis,
        o: &Obligation,
        attempt: u32,
    ) -> Option<Vec<u8>> {
        if !self.is_principal(node) || o.issuer != self.nodes[node].agent {
            self.violation(format!(
                "{} sent an obligation nobody issued",
                self.nodes[node].agent
            ));
            return None;
        }
        let id = o.id;
        if attempt > 0 {
            let durable = self.cdisks[node].pending.get(&id).map(|p| p.attempts);
            if durable.is_none_or(|a| a < attempt) {
                self.violation(format!(
                    "transmit of {id} attempt {attempt} before its pending record was durable"
                ));
            }
            let deadline = self.issued.get(&id).map(|o| o.deadline);
            if deadline.is_some_and(|d| now >= d) {
                self.violation(format!("transmit of {id} at or after its deadline"));
            }
            *self.transmissions.entry(id).or_insert(0) += 1;
        }
        Some(match self.index_of(id) {
            Some(i) if self.scenario.malformed.contains(&i) => unreadable_payload(o),
            _ => encode(o),
        })
    }

    /// A `superseded` decline of `id` by `node` stands only on a decision of the same issuer
    /// on the same name with a sequence at least as high, applied there (durably, or in a
    /// commit on its way): another principal's sequences on a name it shares are not newer.
    fn check_superseded(&mut self, node: usize, id: ObligationId) {
        let Some(o) = self.all.get(&id) else {
            return;
        };
        let (Some(seq), key) = (o.sequence, oracle::governed(o)) else {
            self.violation(format!("{id} declined superseded without a sequence"));
            return;
        };
        let queued: BTreeSet<ObligationId> = self.nodes[node]
            .queue
            .iter()
            .flat_map(|c| &c.records)
            .filter_map(|r| match r {
                Record::Receiver(ReceiverRecord::Apply { id, .. }) => Some(*id),
                _ => None,
            })
            .collect();
        let disk = self.rdisk(node);
        let newer = self.all.values().any(|other| {
            other.id != id
                && oracle::governed(other) == key
                && other.sequence.is_some_and(|s| s >= seq)
                && (disk.apply_count.contains_key(&other.id) || queued.contains(&other.id))
        });
        if !newer {
            self.violation(format!(
                "{} declined {id} (sequence {seq} on {key:?}) as superseded, but applied no \
                 decision of its issuer on that name as new",
                self.nodes[node].agent
            ));
        }
    }

    /// Tallies and checks an ack `node` sends.
    fn ack_transmit(&mut self, node: usize, ack: &CustodyAck) {
        let id = ack.obligation_id;
        if self.is_principal(node) {
            self.violation(format!(
                "{} acked {id}, which nobody sent it",
                self.nodes[node].agent
            ));
            return;
        }
        if let AckStatus::Declined(reason) = ack.status {
            match reason {
                DeclineReason::Malformed => self.report.declines_malformed += 1,
                DeclineReason::Refused => self.report.declines_refused += 1,
                DeclineReason::Superseded => {
                    self.report.declines_superseded += 1;
                    self.check_superseded(node, id);
                }
                DeclineReason::OverLimit => self.violation(format!(
                    "{} declined {id} over_limit: no issuer here holds a tenth of the governed \
                     keys a receiver keeps per issuer",
                    self.nodes[node].agent
                )),
                DeclineReason::IdConflict => self.violation(format!(
                    "{} declined {id} as another obligation's id with other content: no issuer \
                     ever reused an id",
                    self.nodes[node].agent
                )),
                _ => {}
            }
            let own = self
                .all
                .get(&id)
                .is_some_and(|o| o.target == self.nodes[node].agent);
            if own {
                self.declined_by_target
                    .entry(id)
                    .or_default()
                    .insert(reason);
            }
        }
        if ack.status == AckStatus::Applied && !self.rdisk(node).apply_count.contains_key(&id) {
            self.violation(format!(
                "applied ack for {id} released before its apply was durable"
            ));
        }
    }
}

/// The obligation as its target's build cannot read it: the envelope intact, the payload not.
fn unreadable_payload(o: &Obligation) -> Vec<u8> {
    rewritten(o, "payload", "garbled")
}

/// The obligation's encoding with one top-level field's value replaced by `text`.
fn rewritten(o: &Obligation, field: &str, text: &str) -> Vec<u8> {
    use ciborium::Value;
    let bytes = encode(o);
    let Ok(mut value) = ciborium::from_reader::<Value, _>(&bytes[..]) else {
        return bytes;
    };
    if let Value::Map(entries) = &mut value {
        for (k, v) in entries.iter_mut() {
            if k.as_text() == Some(field) {
                *v = Value::Text(text.into());
            }
        }
    }
    let mut out = Vec::new();
    match ciborium::into_writer(&value, &mut out) {
        Ok(()) => out,
        Err(_) => bytes,
    }
}

impl Node {
    fn new(agent: AgentId, skew: i64) -> Self {
        Self {
            agent,
            machine: None,
            incarnation: 0,
            queue: Vec::new(),
            commit_scheduled: false,
            skew,
            unsupported: BTreeSet::new(),
        }
    }
}

/// Applies `mutation` to both machines' configurations.
pub(crate) fn mutate(
    custodian: &mut CustodianConfig,
    receiver: &mut ReceiverConfig,
    mutation: Option<Mutation>,
) {
    custodian.mutation = mutation;
    receiver.mutation = mutation;
}
