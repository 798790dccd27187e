//! Deterministic simulation of the budget ledger: a delegation DAG of branches and two
//! gateways on a lossy, duplicating, reordering, partitioning network, with crashes of any
//! component right after any durable step, checked by the independent checker.
//!
//! ```text
//!   issuer ──grant──▶ root ──transfer──▶ a ──transfer──▶ c ◀──transfer── b ◀──transfer── root
//!                      │                  │              │ (joins what a and b sent)      │
//!                      └──── reserve ─ dispatch ─▶ g1 / g2 ◀── permits from every branch ─┘
//! ```
//!
//! Every branch spends concurrently; replies get lost or late; a branch that waits too long
//! for a receipt fences its credit's epoch and asks for a no-effect proof (reclaim), or
//! forfeits. Gateways run effects through an executor that is not idempotent on its own (the
//! gateway's acceptance log is what prevents a second run), and a gateway can crash between
//! running an effect and recording its receipt.
//!
//! Two roots with different labels: `root` holds one for `{tools, travel}`, `b` one for
//! `{travel, food}`. Splits and transfers draw their labels from the parent's purposes (now and
//! then a broader one, which must be refused); effects draw their purpose likewise. `c` joins
//! what `a` and `b` sent it — real diamonds when both came from the same root, refused joins
//! when they did not.
//!
//! Effects ask for what they ask for: now and then more than their maximum (a price that
//! rose); the executor is held to the limit the gateway hands it, and reports what it was
//! asked to charge.
//!
//! A **rogue member** sits in the keyring (its signatures verify) but in no role: it snoops
//! the network and signs and sends every piece of evidence it should not — no-effect proofs
//! and receipts for others' operations (also real receipts replayed with a changed charge),
//! refusals of others' transfers, transfer certificates in another branch's name, fences of
//! others' credits, fenced replies in a gateway's name (up to epoch `u64::MAX`). On the path
//! of a dispatch (as a relay would be) it also re-sends the payer's signed permit with a larger
//! effect attached. Conservation must hold regardless.

use std::collections::BTreeMap;
use std::sync::OnceLock;

use crate::rng::SimRng;
use abhyasa_ledger::check::{audit, audit_gateway, check, EffectInstance, World};
use abhyasa_ledger::{
    signing_key, Branch, BranchConfig, CreditId, Dim, Effect, Gateway, GatewayRecord, Keyring,
    Label, LedgerMessage, LedgerMutation, LedgerSigningKey, OpKey, OpState, OutgoingState,
    PersistToken, RootGrant, RootId, Signed, Step, TransferId, Vector,
};
use abhyasa_machine::{LedgerTarget, NodeMutation};
use abhyasa_wire::ledger::{Fence, Fenced, NoEffect, Receipt, SourceDecision, TransferDecision};
use abhyasa_wire::{AgentId, UnixMillis};
use rand::Rng;
mod actions;
mod checks;
mod crashes;
mod net;
mod random;
mod rogue;
use random::*;

/// Every ledger mutant, by its command-line name.
pub const LEDGER_MUTANTS: [(&str, LedgerMutation); LedgerMutation::ALL.len()] = LedgerMutation::ALL;

/// The ledger mutant with this name.
pub fn ledger_mutant(name: &str) -> Option<LedgerMutation> {
    LEDGER_MUTANTS
        .iter()
        .find(|(n, _)| *n == name)
        .map(|&(_, m)| m)
}

/// What one seed did.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct LedgerReport {
    /// Operations reserved.
    pub operations: u64,
    /// Settled on a receipt.
    pub settled: u64,
    /// Forfeited.
    pub forfeited: u64,
    /// Returned on a no-effect proof.
    pub no_effect: u64,
    /// Transfers sealed.
    pub transfers: u64,
    /// Joins done.
    pub joins: u64,
    /// Crashes injected.
    pub crashes: u64,
    /// Effects that ran.
    pub effects: u64,
    /// Pieces of evidence the rogue member forged and sent.
    pub forgeries: u64,
    /// Joins of two credits that reached the joining branch through different parents.
    pub diamonds: u64,
    /// Effects that asked for more than their maximum charge.
    pub overdrawn: u64,
    /// Generations closed into a fresh one (terminal rollover or after a fence).
    pub reissues: u64,
    /// Of those, fused with the fenced generation's last operation (one step).
    pub fused: u64,
    /// Unused rights returned to their source.
    pub returns: u64,
    /// Claims on reclaimable transfers (the destination waiting for the source's
    /// confirmation).
    pub claims: u64,
    /// Reclaimable transfers taken back by their source before it confirmed a claim.
    pub reclaims: u64,
    /// Checkpoints made durable (each dropped the journal before it).
    pub checkpoints: u64,
    /// Settled acceptances gateways forgot (pruned) after their permits expired.
    pub pruned: u64,
    /// Ended operations branches forgot behind their gateways' horizons (reserved, and
    /// neither open nor summarized at the end).
    pub forgotten: u64,
    /// Gateway checkpoints made durable (each dropped the log before it).
    pub gateway_checkpoints: u64,
    /// Broken invariants (the first few).
    pub violations: Vec<String>,
}

const BRANCHES: [&str; 4] = ["root", "a", "b", "c"];
const GATEWAYS: [&str; 2] = ["g1", "g2"];
const ROOT: RootId = RootId::from_u128(1);
const ROOT_CREDIT: CreditId = CreditId::from_u128(1);
/// The second root, held by `b`.
const ROOT2: RootId = RootId::from_u128(2);
const ROOT2_CREDIT: CreditId = CreditId::from_u128(2);
/// Every purpose a label may name.
const PURPOSES: [&str; 3] = ["tools", "travel", "food"];
/// A keyring member in no role of the DAG: it only forges.
const ROGUE: &str = "rogue";

fn agent(s: &str) -> AgentId {
    AgentId::new(s).expect("a valid agent id")
}

/// Signing keys, derived once per process (deriving the public half is a scalar
/// multiplication, and components are rebuilt from their journals at every check).
fn key_of(name: &str) -> LedgerSigningKey {
    static KEYS: OnceLock<BTreeMap<&'static str, LedgerSigningKey>> = OnceLock::new();
    KEYS.get_or_init(|| {
        BRANCHES
            .iter()
            .chain(GATEWAYS.iter())
            .chain(["issuer", ROGUE].iter())
            .map(|&n| {
                let mut seed = [0u8; 32];
                seed[..n.len()].copy_from_slice(n.as_bytes());
                (n, signing_key(seed))
            })
            .collect()
    })
    .get(name)
    .cloned()
    .expect("a simulated agent")
}

/// Who may transfer to whom: the delegation DAG.
fn children(of: &str) -> &'static [&'static str] {
    match of {
        "root" => &["a", "b"],
        "a" | "b" => &["c"],
        _ => &[],
    }
}

struct Node<M, R> {
    machine: Option<M>,
    durable: Vec<R>,
    /// Records being written, in order, each with the millisecond it lands; a crash loses
    /// them.
    writing: std::collections::VecDeque<(u64, PersistToken, R)>,
    up_at: u64,
}

impl<M, R> Node<M, R> {
    /// Records whose write lands by `now` become durable, in order (`land` puts each in the
    /// journal), each confirmed to the machine with `persisted`. A crash may come just before
    /// a record lands (chance `crash.0`) or right after (`crash.1`). Returns (crashed, landed).
    fn land_due(
        &mut self,
        now: u64,
        rng: &mut SimRng,
        crash: (f64, f64),
        mut land: impl FnMut(&mut Vec<R>, R),
        persisted: impl Fn(&mut M, PersistToken),
    ) -> (bool, bool) {
        let mut landed = false;
        let Some(m) = self.machine.as_mut() else {
            return (false, false);
        };
        while self.writing.front().is_some_and(|w| w.0 <= now) {
            if rng.random_bool(crash.0) {
                return (true, landed);
            }
            let (_, token, record) = self.writing.pop_front().expect("checked");
            land(&mut self.durable, record);
            landed = true;
            if rng.random_bool(crash.1) {
                return (true, landed);
            }
            persisted(m, token);
        }
        (false, landed)
    }
}

struct Msg {
    from: AgentId,
    to: AgentId,
    msg: LedgerMessage,
}

struct Params {
    loss: f64,
    duplicate: f64,
    delay: (u64, u64),
    crash_after_step: f64,
    crash_after_effect: f64,
    downtime: (u64, u64),
    partitions: Vec<(u64, u64, usize)>,
    reclaim_after: u64,
    forfeit_after: u64,
    resend_ms: u64,
    spend_rate: f64,
    duration: u64,
    /// Chance per millisecond that the rogue member forges something.
    rogue_rate: f64,
    /// Chance per branch step that the branch crashes while the step is being written (the
    /// step is lost; whatever the branch had already queued to send is on the wire).
    crash_before_durable: f64,
    /// Chance per act that the application asks to release a dispatched operation (which
    /// the ledger must refuse).
    misuse: f64,
    /// Chance per effect that it asks for more than its maximum charge.
    overdraw: f64,
    /// Longest time a gateway record takes to become durable, in ms (0: at once). Messages
    /// keep arriving meanwhile, so what a gateway says before its record lands can be lost
    /// with it in a crash.
    gateway_commit_ms: u64,
    /// Chance that a gateway crashes just before a record lands.
    gateway_crash_writing: f64,
    /// Longest time a branch's journal step takes to become durable, in ms (0: at once). The
    /// branch goes on handling messages and requests meanwhile; what depends on a step is
    /// released only once it lands, and a crash loses what has not.
    branch_commit_ms: u64,
    /// Chance that a branch crashes just before a step lands.
    branch_crash_writing: f64,
    /// Journal steps after which a branch checkpoints (0: never).
    checkpoint_steps: u64,
    /// How long permits stay valid (0: for ever).
    permit_ttl_ms: u64,
    /// How long gateways keep a settled acceptance after its permit expired (`None`: for
    /// ever).
    retain_ms: Option<u64>,
    /// Chance per act that a branch with a reclaimable transfer in transit takes it back.
    reclaim_transfer: f64,
    /// How often gateways get their timeout, ms (the node's ledger resend period).
    gateway_tick_ms: u64,
}

struct Sim {
    rng: SimRng,
    p: Params,
    keys: Keyring,
    mutation: Option<LedgerMutation>,
    /// A broken node decision (the gateway's clock), for the node mutants.
    node_mutation: Option<NodeMutation>,
    now: u64,
    branches: BTreeMap<String, Node<Branch, Step>>,
    /// Every step each branch made durable, checkpoints included, with nothing dropped: the
    /// history auditor reads it besides the compacted journal (a checkpoint in the middle
    /// must agree with everything before it).
    archives: BTreeMap<String, Vec<Step>>,
    /// The same for each gateway's log.
    gateway_archives: BTreeMap<String, Vec<GatewayRecord>>,
    gateways: BTreeMap<String, Node<Gateway, GatewayRecord>>,
    net: BTreeMap<(u64, u64), Msg>,
    seq: u64,
    effects: Vec<EffectInstance>,
    quarantined_since: BTreeMap<OpKey, u64>,
    report: LedgerReport,
    next_id: u128,
    /// Dispatches the rogue saw on the path, to replay later (payer, gateway, message).
    snooped: Vec<(AgentId, AgentId, LedgerMessage)>,
    /// Credits the rogue saw fenced: their dispatches are the ones worth replaying.
    fenced_seen: std::collections::BTreeSet<CreditId>,
}

impl Sim {
    fn new(
        mut rng: SimRng,
        mutation: Option<LedgerMutation>,
        node_mutation: Option<NodeMutation>,
    ) -> Self {
        let duration = rng.random_range(2_000..6_000);
        let partitions = (0..rng.random_range(0..=2))
            .map(|_| {
                let start = rng.random_range(0..duration);
                (
                    start,
                    start + rng.random_range(100..2_000),
                    rng.random_range(0..6),
                )
            })
            .collect();
        let p = Params {
            loss: if rng.random_bool(0.2) {
                0.0
            } else {
                rng.random_range(0.0..0.3)
            },
            duplicate: rng.random_range(0.0..0.2),
            delay: (1, rng.random_range(2..120)),
            crash_after_step: if rng.random_bool(0.5) {
                rng.random_range(0.0..0.03)
            } else {
                0.0
            },
            crash_after_effect: rng.random_range(0.0..0.2),
            downtime: (10, rng.random_range(20..1_500)),
            partitions,
            reclaim_after: rng.random_range(100..1_500),
            forfeit_after: rng.random_range(300..4_000),
            resend_ms: rng.random_range(20..300),
            spend_rate: rng.random_range(0.1..0.6),
            duration,
            rogue_rate: if rng.random_bool(0.7) {
                rng.random_range(0.002..0.03)
            } else {
                0.0
            },
            crash_before_durable: 0.0,
            misuse: 0.0,
            overdraw: 0.0,
            gateway_commit_ms: 0,
            gateway_crash_writing: 0.0,
            branch_commit_ms: 0,
            branch_crash_writing: 0.0,
            checkpoint_steps: 0,
            permit_ttl_ms: 0,
            retain_ms: None,
            reclaim_transfer: 0.0,
            gateway_tick_ms: 10,
        };
        // Drawn last, so the schedules above stay those of earlier versions.
        let mut p = p;
        p.crash_before_durable = if rng.random_bool(0.5) {
            rng.random_range(0.0..0.03)
        } else {
            0.0
        };
        p.misuse = rng.random_range(0.0..0.1);
        p.overdraw = rng.random_range(0.0..0.3);
        p.gateway_commit_ms = if rng.random_bool(0.5) {
            rng.random_range(1..40)
        } else {
            0
        };
        p.gateway_crash_writing = if rng.random_bool(0.5) {
            rng.random_range(0.0..0.3)
        } else {
            0.0
        };
        p.branch_commit_ms = if rng.random_bool(0.5) {
            rng.random_range(1..30)
        } else {
            0
        };
        p.branch_crash_writing = if rng.random_bool(0.5) {
            rng.random_range(0.0..0.05)
        } else {
            0.0
        };
        p.checkpoint_steps = if rng.random_bool(0.7) {
            rng.random_range(3..40)
        } else {
            0
        };
        p.permit_ttl_ms = if rng.random_bool(0.5) {
            rng.random_range(100..3_000)
        } else {
            0
        };
        p.retain_ms = rng.random_bool(0.7).then(|| rng.random_range(0..1_000));
        // A gateway that forgets refuses permits without expiry (`Refusal::NoExpiry`): keep
        // a few such seeds for that path (no extra draw, so other seeds are unchanged) and
        // let the rest spend.
        if p.permit_ttl_ms == 0 {
            p.retain_ms = p.retain_ms.filter(|ms| *ms < 150);
        }
        p.reclaim_transfer = rng.random_range(0.0..0.1);
        p.gateway_tick_ms = [10, 100, 500][rng.random_range(0..3)];
        let mut all: Vec<(AgentId, _)> = BRANCHES
            .iter()
            .chain(GATEWAYS.iter())
            .chain(["issuer", ROGUE].iter())
            .map(|n| (agent(n), key_of(n).verifying_key()))
            .collect();
        all.sort_by(|a, b| a.0.cmp(&b.0));
        let keys = Keyring::new(all).with_issuers([agent("issuer")]);
        let config = branch_config(&p, mutation);
        let branches = BRANCHES
            .iter()
            .map(|n| {
                let b = Branch::new(agent(n), key_of(n), keys.clone(), config.clone());
                (
                    n.to_string(),
                    Node {
                        machine: Some(b),
                        durable: Vec::new(),
                        writing: Default::default(),
                        up_at: 0,
                    },
                )
            })
            .collect();
        let gateways = GATEWAYS
            .iter()
            .map(|n| {
                let g = gateway_setup(
                    Gateway::new(agent(n), key_of(n), keys.clone()).with_mutation(mutation),
                    &p,
                );
                (
                    n.to_string(),
                    Node {
                        machine: Some(g),
                        durable: Vec::new(),
                        writing: Default::default(),
                        up_at: 0,
                    },
                )
            })
            .collect();
        let mut sim = Self {
            rng,
            p,
            keys,
            mutation,
            node_mutation,
            now: 0,
            archives: BRANCHES
                .iter()
                .map(|n| (n.to_string(), Vec::new()))
                .collect(),
            gateway_archives: GATEWAYS
                .iter()
                .map(|n| (n.to_string(), Vec::new()))
                .collect(),
            branches,
            gateways,
            net: BTreeMap::new(),
            seq: 0,
            effects: Vec::new(),
            quarantined_since: BTreeMap::new(),
            report: LedgerReport::default(),
            next_id: 100,
            snooped: Vec::new(),
            fenced_seen: Default::default(),
        };
        // The root grant: 2 to 400 cents, and calls in half the runs.
        let cents = sim.rng.random_range(2..400);
        let mut budget = vec![("cents", cents)];
        if sim.rng.random_bool(0.5) {
            budget.push(("calls", sim.rng.random_range(1..20)));
        }
        let grant = RootGrant {
            root: ROOT,
            issuer: agent("issuer"),
            holder: agent("root"),
            budget: Vector::of(&budget).expect("valid dimensions"),
            label: Label::of(&["tools", "travel"]).expect("valid purposes"),
            issued_at: UnixMillis(0),
        };
        let signed = Signed::sign(&grant, &agent("issuer"), &key_of("issuer"));
        sim.with_branch("root", |b, _| b.grant(signed, ROOT_CREDIT).map(|_| ()));
        // The second root, held by `b`, for other purposes.
        let grant = RootGrant {
            root: ROOT2,
            issuer: agent("issuer"),
            holder: agent("b"),
            budget: Vector::of(&[("cents", sim.rng.random_range(2..200))])
                .expect("valid dimensions"),
            label: Label::of(&["travel", "food"]).expect("valid purposes"),
            issued_at: UnixMillis(0),
        };
        let signed = Signed::sign(&grant, &agent("issuer"), &key_of("issuer"));
        sim.with_branch("b", |b, _| b.grant(signed, ROOT2_CREDIT).map(|_| ()));
        sim
    }

    fn fresh(&mut self) -> u128 {
        self.next_id += 1;
        self.next_id
    }

    fn run(mut self) -> LedgerReport {
        let end = self.p.duration;
        let quiet_until = end + 20_000;
        while self.now < quiet_until && self.report.violations.is_empty() {
            self.now += 1;
            let acting = self.now < end;
            if !acting {
                // Heal: no more partitions, loss or crashes; let everything settle.
                self.p.partitions.clear();
                self.p.loss = 0.0;
                self.p.crash_after_step = 0.0;
                self.p.crash_before_durable = 0.0;
                self.p.gateway_crash_writing = 0.0;
                self.p.branch_crash_writing = 0.0;
                self.p.crash_after_effect = 0.0;
            }
            self.restart_due();
            self.gateway_commits_due();
            self.branch_commits_due();
            while let Some(entry) = self.net.first_entry() {
                if entry.key().0 > self.now {
                    break;
                }
                let m = entry.remove();
                self.deliver(m);
            }
            if acting && self.now % 7 == 0 {
                let who = BRANCHES[self.rng.random_range(0..BRANCHES.len())];
                self.act(who);
            }
            if !acting && self.now % 50 == 0 {
                // Settling: reclaim whatever is still quarantined, everywhere.
                for who in BRANCHES {
                    self.act_settle(who);
                }
            }
            if self.rng.random_bool(self.p.rogue_rate) {
                self.rogue();
            }
            // Timers fire at the machines' own deadlines (`poll_timeout`): a branch whose
            // deadline is wrong never resends, and the run does not settle.
            let now = UnixMillis(self.now);
            for who in BRANCHES {
                let due = self.branches[who]
                    .machine
                    .as_ref()
                    .and_then(Branch::poll_timeout)
                    .is_some_and(|t| t <= now);
                if due {
                    self.with_branch(who, |b, _| {
                        b.handle_timeout(now);
                        Ok(())
                    });
                }
            }
            // Gateways are driven lazily: their deadlines are looked at every
            // `gateway_tick_ms` only (permits are judged at arrival all the same).
            let names: Vec<String> = match self.now % self.p.gateway_tick_ms {
                0 => self.gateways.keys().cloned().collect(),
                _ => Vec::new(),
            };
            for name in names {
                let node = self.gateways.get_mut(&name).expect("known gateway");
                if let Some(g) = node.machine.as_mut() {
                    if g.poll_timeout().is_some_and(|t| t <= now) {
                        g.handle_timeout(now);
                        self.drain_gateway(&name);
                    }
                }
            }
            if self.now % 1_000 == 0 {
                self.check_now();
            }
            if !acting && self.net.is_empty() && self.settled() {
                break;
            }
        }
        self.check_now();
        if self.report.violations.is_empty() && !self.settled() {
            self.report.violations.push(format!(
                "t={}ms did not settle: an operation reserved or quarantined, a transfer sealed or \
                 a claim unanswered after {} s of quiet (a timer that never fired?)",
                self.now,
                (quiet_until - end) / 1_000
            ));
        }
        for (name, archive) in &self.archives {
            let Some(b) = self.branches.get(name).and_then(|n| n.machine.as_ref()) else {
                continue;
            };
            let reserved: std::collections::BTreeSet<OpKey> = archive
                .iter()
                .filter_map(|s| match s {
                    Step::Reserve { permit, .. } => permit.peek().ok().map(|p| p.binding.key),
                    _ => None,
                })
                .collect();
            let kept: std::collections::BTreeSet<OpKey> = b
                .operations()
                .map(|o| o.binding.key)
                .chain(b.ended().map(|e| e.key))
                .collect();
            self.report.forgotten += reserved.difference(&kept).count() as u64;
        }
        for r in self.gateway_archives.values().flatten() {
            match r {
                GatewayRecord::Pruned { keys, .. } => self.report.pruned += keys.len() as u64,
                GatewayRecord::Checkpoint(_) => self.report.gateway_checkpoints += 1,
                _ => {}
            }
        }
        // Count outcomes from durable state.
        for b in self.branches_for_check() {
            for o in b.operations() {
                match o.state {
                    OpState::Settled { .. } => self.report.settled += 1,
                    OpState::NoEffect(_) => self.report.no_effect += 1,
                    OpState::Forfeited { .. } => self.report.forfeited += 1,
                    _ => {}
                }
            }
            for e in b.ended() {
                match e.outcome {
                    abhyasa_ledger::Ended::Settled { .. } => self.report.settled += 1,
                    abhyasa_ledger::Ended::NoEffect => self.report.no_effect += 1,
                    _ => {}
                }
            }
        }
        self.report
    }

    fn settled(&self) -> bool {
        self.branches.values().all(|n| {
            n.writing.is_empty()
                && n.machine.as_ref().is_some_and(|b| {
                    b.operations()
                        .all(|o| !matches!(o.state, OpState::Reserved | OpState::Quarantined))
                        && b.outgoing()
                            .all(|o| o.state != abhyasa_ledger::OutgoingState::Sealed)
                        && !b.incoming().any(|s| matches!(s, Step::Claim { .. }))
                })
        })
    }
}

/// `g` as the seed configures gateways: forgetting settled acceptances `retain_ms` after
/// their permits expired (if set), checkpointing as often as branches do.
/// Every branch's settings: at start, on restart, and when recovery is replayed for the check.
fn branch_config(p: &Params, mutation: Option<LedgerMutation>) -> BranchConfig {
    BranchConfig {
        resend_ms: p.resend_ms,
        checkpoint_steps: p.checkpoint_steps,
        permit_ttl_ms: p.permit_ttl_ms,
        mutation,
        ..BranchConfig::default()
    }
}

fn gateway_setup(g: Gateway, p: &Params) -> Gateway {
    let g = g.checkpointing(p.checkpoint_steps);
    match p.retain_ms {
        Some(ms) => g.retaining(ms),
        None => g,
    }
}

/// A gateway record becomes durable: into the log (a checkpoint replaces everything before
/// it, as the store does) and into the archive.
fn land_record(log: &mut Vec<GatewayRecord>, archive: &mut Vec<GatewayRecord>, r: GatewayRecord) {
    if matches!(r, GatewayRecord::Checkpoint(_)) {
        log.clear();
    }
    archive.push(r.clone());
    log.push(r);
}

/// A branch step becomes durable: into the journal — a checkpoint replaces everything
/// before it, as the store does in the commit that writes it — and into the archive.
fn land(report: &mut LedgerReport, journal: &mut Vec<Step>, archive: &mut Vec<Step>, step: Step) {
    count_step(report, &step);
    if matches!(step, Step::Checkpoint(_)) {
        journal.clear();
    }
    archive.push(step.clone());
    journal.push(step);
}

/// Counts a branch step as it becomes durable.
fn count_step(r: &mut LedgerReport, step: &Step) {
    match step {
        Step::Reserve { .. } => r.operations += 1,
        Step::Seal { .. } => r.transfers += 1,
        Step::Claim { .. } => r.claims += 1,
        Step::Reclaim { .. } => r.reclaims += 1,
        Step::Join { .. } => r.joins += 1,
        Step::Reissue { last, .. } => {
            r.reissues += 1;
            r.fused += u64::from(last.is_some());
        }
        Step::Checkpoint(_) => r.checkpoints += 1,
        _ => {}
    }
}

/// A branch's reserved operations, and its quarantined ones with their credits.
fn open_ops(b: &Branch) -> (Vec<OpKey>, Vec<(OpKey, CreditId)>) {
    let reserved = b
        .operations()
        .filter(|o| o.state == OpState::Reserved)
        .map(|o| o.binding.key)
        .collect();
    let stuck = b
        .operations()
        .filter(|o| o.state == OpState::Quarantined)
        .map(|o| (o.binding.key, o.binding.credit))
        .collect();
    (reserved, stuck)
}

/// Runs one seed of the ledger simulation.
pub fn run_ledger(seed: u64, mutation: Option<LedgerMutation>) -> LedgerReport {
    Sim::new(SimRng::seeded(seed), mutation, None).run()
}

/// Runs one seed of the ledger simulation with a broken node decision.
pub fn run_ledger_node(seed: u64, mutation: Option<NodeMutation>) -> LedgerReport {
    Sim::new(SimRng::seeded(seed), None, mutation).run()
}

/// One run of the ledger simulation whose every choice is read from `bytes` first (the
/// structure-aware fuzz target; see [`SimRng::from_bytes`]).
pub fn run_ledger_bytes(bytes: &[u8], mutation: Option<LedgerMutation>) -> LedgerReport {
    Sim::new(SimRng::from_bytes(bytes), mutation, None).run()
}
