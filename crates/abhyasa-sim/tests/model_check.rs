//! Bounded exhaustive model check of the real custodian and receiver (not an abstraction of
//! them) with stateright: a lossy, duplicating, reordering network; a custodian crash and
//! recovery; a receiver crash and recovery; group commits that may lag; virtual time that
//! advances to the next timer.
//!
//! Three models. Two with one obligation each: one with a retry budget of one retry (its
//! escalation is reachable through `retries_exhausted`) and one with a large budget (its
//! escalation is reachable only through the deadline). The third carries several obligations
//! at once: a grant of one governed key (sequence 3, under custody: it fails closed) and two
//! revocations of it (sequences 1 and 2), racing, and a best-effort token issue. Every model
//! has crashes of both ends, loss, duplication, reordering and re-subscriptions
//! (`handle_peer_ready`).
//!
//! Safety properties hold in every reachable state, among them the paper's bounded retries
//! (no obligation is transmitted more than `1 + max_retries` times, re-offers included) and
//! the benign side staying best-effort (an inadmissible obligation is never under custody,
//! is sent once, and ends `best_effort`). The `sometimes` properties prove that both escalation
//! causes, an application, a recovery, a re-offer and a supersession are actually reached, so
//! the safety properties are not vacuous.

use std::collections::{BTreeMap, BTreeSet};

use abhyasa_custody::{
    AppliedRecord, Custodian, CustodianConfig, CustodianRecord, PendingRecord, PersistToken,
    PrincipalState, Receiver, ReceiverConfig, ReceiverRecord, ReceiverState, WeightBounds,
};
use abhyasa_wire::{
    decode, decode_obligation, encode, AgentId, ClientId, ConsentDecision, ConsentPayload,
    CustodyAck, DeclineReason, Escalation, EscalationCause, LastObserved, Obligation, ObligationId,
    Outcome, Payload, SafeAction, Scope, TokenAction, TokenId, TokenPayload, UnixMillis,
};
use stateright::{Checker, Model, Property};

const DEADLINE: u64 = 40;
const MAX_IN_FLIGHT: usize = 2;

#[derive(Clone, Debug, PartialEq, Eq, Hash)]
struct Disk {
    pending: BTreeMap<ObligationId, PendingRecord>,
    terminal: BTreeMap<ObligationId, Outcome>,
    escalations: BTreeMap<ObligationId, Escalation>,
    principal: PrincipalState,
}

#[derive(Clone, Debug, PartialEq, Eq, Hash)]
struct RDisk {
    applied: BTreeMap<ObligationId, (UnixMillis, abhyasa_wire::Digest)>,
    last_sequence: BTreeMap<abhyasa_custody::GovernedKey, u64>,
    governed: std::collections::BTreeSet<abhyasa_custody::GovernedKey>,
    state: ReceiverState,
    apply_count: BTreeMap<ObligationId, u8>,
}

#[derive(Clone, Debug, PartialEq, Eq, Hash)]
struct State {
    now: u64,
    custodian: Option<Custodian>,
    receiver: Option<Receiver>,
    cqueue: Vec<(PersistToken, CustodianRecord)>,
    rqueue: Vec<(PersistToken, ReceiverRecord)>,
    cdisk: Disk,
    rdisk: RDisk,
    /// In-flight messages: (is_ack, encoded bytes) with a count.
    net: BTreeMap<(bool, Vec<u8>), u8>,
    accepted: BTreeSet<ObligationId>,
    crashes_left: u8,
    dups_left: u8,
    reoffers_left: u8,
    recovered: bool,
    reoffered: bool,
    /// Transmissions per obligation by the custodian.
    sent: BTreeMap<ObligationId, u8>,
    /// Ids ever written to the custodian's pending set.
    ever_pending: BTreeSet<ObligationId>,
    violation: Option<&'static str>,
}

#[derive(Clone, Debug, PartialEq, Eq, Hash)]
enum Action {
    Tick,
    CommitCustodian,
    CommitReceiver,
    Deliver(bool, Vec<u8>),
    Drop(bool, Vec<u8>),
    Duplicate(bool, Vec<u8>),
    CrashCustodian,
    RestartCustodian,
    CrashReceiver,
    RestartReceiver,
    /// The agent re-subscribes: the custodian re-offers.
    PeerReady,
}

struct CustodyModel {
    obligations: Vec<Obligation>,
    /// Re-subscriptions the environment may make.
    reoffers: u8,
    /// Duplications the network may make.
    dups: u8,
    /// The obligations' deadline.
    deadline: u64,
    /// A deliberately broken custodian rule (to show a property can fail).
    mutation: Option<abhyasa_custody::Mutation>,
}

impl CustodyModel {
    /// One token revocation with this budget.
    fn single(max_retries: u32) -> Self {
        Self {
            obligations: vec![obligation(1, max_retries)],
            // The large-budget model's state space is dominated by its many attempts; the
            // re-offer's budget accounting is explored where the budget binds.
            reoffers: u8::from(max_retries <= 1),
            dups: 1,
            deadline: DEADLINE,
            mutation: None,
        }
    }

    /// A grant of scope `cal` (sequence 3; under custody, failing closed), two revocations of
    /// it (sequences 1, 2), one attempt each, and a best-effort token issue.
    fn several() -> Self {
        // A shorter life and no duplication keep three obligations' interleavings within
        // memory; loss, reordering, crashes and a re-subscription remain.
        let deadline = 25;
        let consent = |id, decision, seq| Obligation {
            sequence: Some(seq),
            deadline: UnixMillis(deadline),
            payload: Payload::AnumatiConsent(ConsentPayload {
                decision: Some(decision),
                scope: Scope::new("cal").expect("valid"),
                expires_at: None,
            }),
            ..obligation(id, 0)
        };
        Self {
            obligations: vec![
                // The grant leaves first: the network holds two messages at once.
                consent(3, ConsentDecision::Grant, 3),
                consent(1, ConsentDecision::Revoke, 1),
                consent(2, ConsentDecision::Revoke, 2),
                // Best effort: a token issued (benign on loss).
                Obligation {
                    deadline: UnixMillis(deadline),
                    payload: Payload::OauthToken(TokenPayload {
                        action: TokenAction::Issue,
                        token_id: TokenId::new("t4").expect("valid"),
                        client_id: ClientId::new("c").expect("valid"),
                        expires_at: None,
                    }),
                    ..obligation(4, 0)
                },
            ],
            reoffers: 1,
            dups: 0,
            deadline,
            mutation: None,
        }
    }

    fn budget(&self, id: ObligationId) -> u32 {
        self.obligations
            .iter()
            .find(|o| o.id == id)
            .map_or(0, |o| o.max_retries + 1)
    }

    /// AC-1 from the kind table, written out: every consent decision (a grant fails closed,
    /// docs/CUSTODY.md "Grants"), a token revoke, a negative belief update.
    fn admissible(&self, id: ObligationId) -> bool {
        self.obligations.iter().any(|o| {
            o.id == id
                && match &o.payload {
                    Payload::AnumatiConsent(_) => true,
                    Payload::OauthToken(p) => p.action == TokenAction::Revoke,
                    Payload::PhalaBeliefUpdate(p) => p.weight_delta.0 < 0,
                    // The model issues only built-in kinds.
                    Payload::Registered(_) => false,
                }
        })
    }
}

fn principal() -> AgentId {
    AgentId::new("p").expect("valid")
}

fn agent() -> AgentId {
    AgentId::new("a").expect("valid")
}

fn custodian_config() -> CustodianConfig {
    CustodianConfig {
        response_timeout_ms: 10,
        backoff_base_ms: 10,
        backoff_cap_ms: 10,
        max_clock_skew_ms: 5,
        ..CustodianConfig::default()
    }
}

fn receiver_config() -> ReceiverConfig {
    ReceiverConfig {
        max_clock_skew_ms: 5,
        ..ReceiverConfig::default()
    }
}

fn obligation(id: u128, max_retries: u32) -> Obligation {
    Obligation {
        id: ObligationId::from_u128(id),
        issuer: principal(),
        target: agent(),
        created_at: UnixMillis(0),
        deadline: UnixMillis(DEADLINE),
        max_retries,
        sequence: None,
        payload: Payload::OauthToken(TokenPayload {
            action: TokenAction::Revoke,
            token_id: TokenId::new(format!("t{id}")).expect("valid"),
            client_id: ClientId::new("c").expect("valid"),
            expires_at: None,
        }),
    }
}

impl State {
    fn flush(&mut self) {
        let now = UnixMillis(self.now);
        let mut out = Vec::new();
        if let Some(c) = &mut self.custodian {
            while let Some(p) = c.poll_persist() {
                self.cqueue.push((p.token, p.record));
            }
            let transmits: Vec<_> = std::iter::from_fn(|| c.poll_transmit()).collect();
            while c.poll_event().is_some() {}
            for t in transmits {
                let durable = self.cdisk.pending.get(&t.obligation.id).map(|p| p.attempts);
                if t.attempt > 0 && durable.is_none_or(|a| a < t.attempt) {
                    self.violation = Some("transmit before its pending record was durable");
                }
                if now >= t.obligation.deadline {
                    self.violation = Some("transmit at or after the deadline");
                }
                *self.sent.entry(t.obligation.id).or_insert(0) += 1;
                out.push((false, encode(&t.obligation)));
            }
        }
        if let Some(r) = &mut self.receiver {
            while let Some(p) = r.poll_persist() {
                self.rqueue.push((p.token, p.record));
            }
            let acks: Vec<_> = std::iter::from_fn(|| r.poll_transmit()).collect();
            while r.poll_event().is_some() {}
            for a in acks {
                let applied = self.rdisk.apply_count.contains_key(&a.ack.obligation_id);
                if a.ack.status == abhyasa_wire::AckStatus::Applied && !applied {
                    self.violation = Some("applied ack released before the apply was durable");
                }
                out.push((true, encode(&a.ack)));
            }
        }
        for message in out {
            self.put(message);
        }
    }

    fn put(&mut self, message: (bool, Vec<u8>)) {
        let in_flight: usize = self.net.values().map(|&n| usize::from(n)).sum();
        if in_flight < MAX_IN_FLIGHT {
            *self.net.entry(message).or_insert(0) += 1;
        }
    }

    fn take(&mut self, message: &(bool, Vec<u8>)) -> bool {
        match self.net.get_mut(message) {
            Some(n) if *n > 1 => {
                *n -= 1;
                true
            }
            Some(_) => {
                self.net.remove(message);
                true
            }
            None => false,
        }
    }

    fn next_timer(&self) -> Option<u64> {
        let c = self.custodian.as_ref().and_then(|c| c.poll_timeout());
        let r = self.receiver.as_ref().and_then(|r| r.poll_timeout());
        [c, r].into_iter().flatten().map(|t| t.0).min()
    }

    fn all_terminal(&self) -> bool {
        self.accepted
            .iter()
            .all(|id| self.cdisk.terminal.contains_key(id))
    }
}

impl Model for CustodyModel {
    type State = State;
    type Action = Action;

    fn init_states(&self) -> Vec<State> {
        let config = CustodianConfig {
            mutation: self.mutation,
            ..custodian_config()
        };
        let mut c = Custodian::new(principal(), config, 1);
        for o in &self.obligations {
            c.issue(UnixMillis(0), o.clone()).expect("issued");
        }
        let mut s = State {
            now: 0,
            custodian: Some(c),
            receiver: Some(Receiver::new(agent(), receiver_config())),
            cqueue: Vec::new(),
            rqueue: Vec::new(),
            cdisk: Disk {
                pending: BTreeMap::new(),
                terminal: BTreeMap::new(),
                escalations: BTreeMap::new(),
                principal: PrincipalState::new(WeightBounds::default()),
            },
            rdisk: RDisk {
                applied: BTreeMap::new(),
                last_sequence: BTreeMap::new(),
                governed: Default::default(),
                state: ReceiverState::default(),
                apply_count: BTreeMap::new(),
            },
            net: BTreeMap::new(),
            accepted: BTreeSet::new(),
            crashes_left: 1,
            dups_left: self.dups,
            reoffers_left: self.reoffers,
            recovered: false,
            reoffered: false,
            sent: BTreeMap::new(),
            ever_pending: BTreeSet::new(),
            violation: None,
        };
        s.flush();
        vec![s]
    }

    fn actions(&self, s: &State, actions: &mut Vec<Action>) {
        if s.violation.is_some() {
            return;
        }
        if s.next_timer().is_some_and(|t| t <= self.deadline + 20) {
            actions.push(Action::Tick);
        }
        if s.custodian.is_some() && !s.cqueue.is_empty() {
            actions.push(Action::CommitCustodian);
        }
        if s.receiver.is_some() && !s.rqueue.is_empty() {
            actions.push(Action::CommitReceiver);
        }
        for (is_ack, bytes) in s.net.keys() {
            actions.push(Action::Deliver(*is_ack, bytes.clone()));
            actions.push(Action::Drop(*is_ack, bytes.clone()));
            if s.dups_left > 0 {
                actions.push(Action::Duplicate(*is_ack, bytes.clone()));
            }
        }
        match (&s.custodian, s.crashes_left) {
            (Some(_), 1..) => actions.push(Action::CrashCustodian),
            (None, _) => actions.push(Action::RestartCustodian),
            _ => {}
        }
        match (&s.receiver, s.crashes_left) {
            (Some(_), 1..) => actions.push(Action::CrashReceiver),
            (None, _) => actions.push(Action::RestartReceiver),
            _ => {}
        }
        if s.custodian.is_some() && s.receiver.is_some() && s.reoffers_left > 0 {
            actions.push(Action::PeerReady);
        }
    }

    fn next_state(&self, last: &State, action: Action) -> Option<State> {
        let mut s = last.clone();
        match action {
            Action::Tick => {
                let t = s.next_timer()?;
                s.now = s.now.max(t);
                let now = UnixMillis(s.now);
                if let Some(c) = &mut s.custodian {
                    c.handle_timeout(now);
                }
                if let Some(r) = &mut s.receiver {
                    r.handle_timeout(now);
                }
            }
            Action::CommitCustodian => {
                let now = UnixMillis(s.now);
                for (token, record) in std::mem::take(&mut s.cqueue) {
                    apply_custodian(&mut s, record);
                    s.custodian.as_mut()?.handle_persisted(now, token);
                }
            }
            Action::CommitReceiver => {
                for (token, record) in std::mem::take(&mut s.rqueue) {
                    apply_receiver(&mut s, record);
                    s.receiver.as_mut()?.handle_persisted(token);
                }
            }
            Action::Deliver(is_ack, bytes) => {
                s.take(&(is_ack, bytes.clone()));
                let now = UnixMillis(s.now);
                if is_ack {
                    let ack: CustodyAck = decode(&bytes).ok()?;
                    if let Some(c) = &mut s.custodian {
                        c.handle_ack(now, &agent(), ack);
                    }
                } else {
                    let o = decode_obligation(&bytes).ok()?;
                    if let Some(r) = &mut s.receiver {
                        r.handle_obligation(now, &principal(), o);
                    }
                }
            }
            Action::Drop(is_ack, bytes) => {
                s.take(&(is_ack, bytes));
            }
            Action::Duplicate(is_ack, bytes) => {
                s.dups_left -= 1;
                s.put((is_ack, bytes));
            }
            Action::CrashCustodian => {
                s.crashes_left -= 1;
                s.custodian = None;
                s.cqueue.clear();
            }
            Action::RestartCustodian => {
                let now = UnixMillis(s.now);
                let mut c = Custodian::recover(
                    principal(),
                    CustodianConfig {
                        mutation: self.mutation,
                        ..custodian_config()
                    },
                    2,
                    s.cdisk.principal.clone(),
                    s.cdisk.pending.values().cloned().collect::<Vec<_>>(),
                    Vec::new(),
                    now,
                );
                c.handle_timeout(now);
                s.custodian = Some(c);
                s.recovered = true;
            }
            Action::CrashReceiver => {
                s.crashes_left -= 1;
                s.receiver = None;
                s.rqueue.clear();
            }
            Action::RestartReceiver => {
                let applied =
                    s.rdisk
                        .applied
                        .iter()
                        .map(|(&id, &(expires, digest))| AppliedRecord {
                            id,
                            expires,
                            digest: Some(digest),
                            issuer: Some(principal()),
                        });
                s.receiver = Some(Receiver::recover(
                    agent(),
                    receiver_config(),
                    applied.collect::<Vec<_>>(),
                    s.rdisk.last_sequence.clone(),
                    s.rdisk.governed.clone(),
                    s.rdisk.state.clone(),
                ));
                s.recovered = true;
            }
            Action::PeerReady => {
                s.reoffers_left -= 1;
                s.reoffered = true;
                let now = UnixMillis(s.now);
                s.custodian.as_mut()?.handle_peer_ready(now, &agent());
            }
        }
        s.flush();
        Some(s)
    }

    fn properties(&self) -> Vec<Property<Self>> {
        vec![
            Property::always("no rule broken at a release point", |_, s: &State| {
                s.violation.is_none()
            }),
            Property::always("applied at most once", |_, s: &State| {
                s.rdisk.apply_count.values().all(|&n| n <= 1)
            }),
            Property::always(
                "applied outcome only for applied obligations",
                |_, s: &State| {
                    s.cdisk.terminal.iter().all(|(id, o)| {
                        *o != Outcome::Applied || s.rdisk.apply_count.contains_key(id)
                    })
                },
            ),
            Property::always(
                "every escalation has its safe action in force",
                |_, s: &State| {
                    // Read from the raw state, not through `holds()`: the scope withheld, or
                    // a strictly newer decision standing on it; the token not honoured.
                    s.cdisk.escalations.values().all(|e| {
                        match &e.safe_action {
                        SafeAction::WithholdScope {
                            target,
                            scope,
                            sequence,
                        } => s.cdisk.principal.authorization(target, scope).is_some_and(|a| {
                            a.withheld
                                || matches!((a.sequence, sequence), (Some(c), Some(q)) if c > *q)
                        }),
                        SafeAction::StopHonouringToken { token_id, .. } => {
                            s.cdisk.principal.is_revoked(token_id)
                        }
                        SafeAction::DownWeight { .. } => false, // no such kind in these models
                    }
                    })
                },
            ),
            Property::always(
                "a grant opens the scope only once its target confirmed it",
                |m: &CustodyModel, s: &State| {
                    // Read from the raw state: open on the principal's side ⇒ some grant of
                    // that scope to that target ended `applied` on the custodian's disk.
                    m.obligations.iter().all(|o| {
                        let Payload::AnumatiConsent(p) = &o.payload else {
                            return true;
                        };
                        let open = s
                            .cdisk
                            .principal
                            .authorization(&o.target, &p.scope)
                            .is_some_and(|a| !a.withheld);
                        !open
                            || m.obligations.iter().any(|g| {
                                matches!(&g.payload, Payload::AnumatiConsent(q)
                                    if q.scope == p.scope
                                        && q.decision == Some(ConsentDecision::Grant))
                                    && s.cdisk.terminal.get(&g.id) == Some(&Outcome::Applied)
                            })
                    })
                },
            ),
            Property::always(
                "bounded retries: at most 1 + max_retries transmissions",
                |m: &CustodyModel, s: &State| {
                    s.sent
                        .iter()
                        .all(|(id, &n)| !m.admissible(*id) || u32::from(n) <= m.budget(*id))
                },
            ),
            Property::always(
                "the benign side stays best-effort",
                |m: &CustodyModel, s: &State| {
                    m.obligations
                        .iter()
                        .filter(|o| !m.admissible(o.id))
                        .all(|o| {
                            !s.ever_pending.contains(&o.id)
                                && s.sent.get(&o.id).copied().unwrap_or(0) <= 1
                                && s.cdisk
                                    .terminal
                                    .get(&o.id)
                                    .is_none_or(|t| *t == Outcome::BestEffort)
                        })
                },
            ),
            Property::always(
                "deliver-or-report once the custodian has run past the deadline",
                |m: &CustodyModel, s: &State| {
                    let settled = s.custodian.as_ref().is_some_and(|c| {
                        s.cqueue.is_empty() && c.poll_timeout().is_none_or(|t| t.0 > s.now)
                    });
                    !(settled && s.now >= m.deadline) || s.all_terminal()
                },
            ),
            Property::sometimes("escalated", |m: &CustodyModel, s: &State| {
                // A budget of one retry runs out before the deadline; a large one never does.
                let cause = if m.obligations.iter().all(|o| o.max_retries <= 1) {
                    EscalationCause::RetriesExhausted
                } else {
                    EscalationCause::Deadline
                };
                escalated(s, cause)
            }),
            Property::sometimes(
                "a racing revocation declined superseded (several obligations)",
                |m: &CustodyModel, s: &State| {
                    m.obligations.len() == 1
                        || s.cdisk
                            .terminal
                            .values()
                            .any(|o| *o == Outcome::Declined(DeclineReason::Superseded))
                },
            ),
            Property::sometimes("applied after a re-offer", |m: &CustodyModel, s: &State| {
                m.reoffers == 0
                    || (s.reoffered && s.cdisk.terminal.values().any(|o| *o == Outcome::Applied))
            }),
            Property::sometimes(
                "a confirmed grant opens its scope (several obligations)",
                |m: &CustodyModel, s: &State| {
                    m.obligations.len() == 1
                        || s.cdisk
                            .principal
                            .authorization(&agent(), &Scope::new("cal").expect("valid"))
                            .is_some_and(|a| !a.withheld)
                },
            ),
            Property::sometimes("applied", |_, s: &State| {
                s.cdisk.terminal.values().any(|o| *o == Outcome::Applied)
            }),
            Property::sometimes("applied after a crash and recovery", |_, s: &State| {
                s.recovered && s.cdisk.terminal.values().any(|o| *o == Outcome::Applied)
            }),
        ]
    }
}

fn escalated(s: &State, cause: EscalationCause) -> bool {
    s.cdisk
        .terminal
        .values()
        .any(|o| *o == Outcome::Escalated(cause))
}

fn apply_custodian(s: &mut State, record: CustodianRecord) {
    match record {
        CustodianRecord::Pending {
            obligation,
            attempts,
            principal,
        } => {
            if let Some(u) = &principal {
                s.cdisk.principal.apply(u, obligation.id);
            }
            s.accepted.insert(obligation.id);
            s.ever_pending.insert(obligation.id);
            s.cdisk.pending.insert(
                obligation.id,
                PendingRecord {
                    obligation,
                    attempts,
                    last_observed: LastObserved::NoAck,
                },
            );
        }
        CustodianRecord::Attempt { id, attempts, .. } => {
            if let Some(p) = s.cdisk.pending.get_mut(&id) {
                p.attempts = attempts;
            }
        }
        CustodianRecord::Terminal {
            record,
            escalation,
            principal,
        } => {
            if let Some(u) = &principal {
                s.cdisk.principal.apply(u, record.obligation_id);
            }
            s.cdisk.pending.remove(&record.obligation_id);
            if let Some(e) = escalation {
                s.cdisk.escalations.insert(record.obligation_id, e);
            }
            s.cdisk
                .terminal
                .insert(record.obligation_id, record.outcome);
        }
        CustodianRecord::Reconciliation(_) => {}
    }
}

fn apply_receiver(s: &mut State, record: ReceiverRecord) {
    match record {
        ReceiverRecord::Apply {
            id,
            obligation,
            expires,
            effect,
            sequence,
            ..
        } => {
            s.rdisk.applied.insert(id, (expires, obligation.digest()));
            if let Some((key, seq)) = sequence {
                s.rdisk.last_sequence.insert(key, seq);
            }
            s.rdisk
                .governed
                .insert(effect.governed_key(&obligation.issuer));
            s.rdisk.state.apply(&effect);
            *s.rdisk.apply_count.entry(id).or_insert(0) += 1;
        }
        ReceiverRecord::Prune { before } => s.rdisk.applied.retain(|_, (e, _)| *e >= before),
    }
}

fn check(name: &str, model: CustodyModel) -> usize {
    let checker = model.checker().threads(2).spawn_bfs().join();
    let states = checker.unique_state_count();
    println!("model check ({name}): unique_states={states}");
    checker.assert_properties();
    assert!(states > 1_000, "the model explored only {states} states");
    states
}

#[test]
fn model_check_retry_exhaustion() {
    check("max_retries=1", CustodyModel::single(1));
}

#[test]
fn model_check_deadline() {
    check("max_retries=50", CustodyModel::single(50));
}

#[test]
fn model_check_several_obligations_on_one_key() {
    check(
        "two revocations and a grant of one scope, a best-effort issue",
        CustodyModel::several(),
    );
}

#[test]
fn model_check_finds_a_grant_that_opens_before_it_is_confirmed() {
    let model = CustodyModel {
        mutation: Some(abhyasa_custody::Mutation::GrantOpensAtIssue),
        ..CustodyModel::several()
    };
    let checker = model.checker().threads(2).spawn_bfs().join();
    let found = checker.discovery("a grant opens the scope only once its target confirmed it");
    assert!(found.is_some(), "the mutant's early opening was not found");
}

#[test]
fn model_check_finds_a_re_offer_outside_the_budget() {
    let model = CustodyModel {
        mutation: Some(abhyasa_custody::Mutation::UncountedReoffer),
        ..CustodyModel::single(1)
    };
    let checker = model.checker().threads(2).spawn_bfs().join();
    let found = checker.discovery("bounded retries: at most 1 + max_retries transmissions");
    assert!(
        found.is_some(),
        "the mutant's extra transmission was not found"
    );
    println!(
        "model check (uncounted re-offer mutant): counterexample of {} steps",
        found.map_or(0, |p| p.into_actions().len())
    );
}
