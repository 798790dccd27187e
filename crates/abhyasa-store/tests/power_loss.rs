//! Simulated power loss at every sync point of a representative custody history.
//!
//! A custodian and a receiver, each on its own store over a [`FaultyBackend`], exchange 30
//! obligations over a lossy, duplicating channel in virtual time; one target never answers.
//! A clean run counts the syncs each disk performs. Then, for every sync `n` of each disk, the
//! history is replayed with power lost right after sync `n` — and again with sync `n` failing
//! with an I/O error. The node that loses its disk restarts on what survived, recovers its
//! machine from the store, and the history runs to its end. Every run is then checked:
//!
//! - nothing lost: every obligation whose custody was acknowledged ends terminal;
//! - nothing applied twice, and applied ids and effects agree, on the receiver's disk;
//! - every acknowledged commit survived the crash that followed it;
//! - every escalation has its safe action in force, every revocation is withheld.

use std::collections::{BTreeMap, BTreeSet};

use abhyasa_custody::{
    kinds, Custodian, CustodianConfig, CustodianEvent, CustodianRecord, Receiver, ReceiverConfig,
    ReceiverRecord,
};
use abhyasa_store::{Op, Store, StoreConfig};
use abhyasa_testkit::fault::{FaultPlan, FaultyBackend};
use abhyasa_wire::{
    AgentId, BeliefUpdatePayload, ClientId, ConsentDecision, ConsentPayload, CustodyAck,
    Obligation, ObligationId, Outcome, Payload, Scope, TokenAction, TokenId, TokenPayload,
    UnixMillis, WeightDelta, WeightKey,
};

const END: u64 = 1_500;

fn principal() -> AgentId {
    AgentId::new("p").unwrap()
}

fn agent() -> AgentId {
    AgentId::new("a").unwrap()
}

fn custodian_config() -> CustodianConfig {
    CustodianConfig {
        response_timeout_ms: 20,
        backoff_base_ms: 10,
        backoff_cap_ms: 40,
        max_clock_skew_ms: 10_000,
        ..CustodianConfig::default()
    }
}

fn receiver_config() -> ReceiverConfig {
    ReceiverConfig {
        max_clock_skew_ms: 10_000,
        ..ReceiverConfig::default()
    }
}

fn delta(i: u128) -> i64 {
    -1_000 * (i as i64 + 1)
}

fn workload() -> Vec<(u64, Obligation)> {
    (0..30u128)
        .map(|i| {
            let payload = match i % 6 {
                0..=2 => Payload::PhalaBeliefUpdate(BeliefUpdatePayload {
                    weight_key: WeightKey::new(format!("k{i}")).unwrap(),
                    weight_delta: WeightDelta(delta(i) as i32),
                    ttl_ms: 3_600_000,
                }),
                3 => Payload::AnumatiConsent(ConsentPayload {
                    decision: Some(ConsentDecision::Revoke),
                    scope: Scope::new(format!("s{i}")).unwrap(),
                    expires_at: None,
                }),
                4 => Payload::OauthToken(TokenPayload {
                    action: TokenAction::Revoke,
                    token_id: TokenId::new(format!("t{i}")).unwrap(),
                    client_id: ClientId::new("c").unwrap(),
                    expires_at: None,
                }),
                _ => Payload::OauthToken(TokenPayload {
                    action: TokenAction::Issue,
                    token_id: TokenId::new(format!("t{i}")).unwrap(),
                    client_id: ClientId::new("c").unwrap(),
                    expires_at: None,
                }),
            };
            let at = i as u64 * 10;
            let target = if i % 7 == 6 { "z" } else { "a" };
            let o = Obligation {
                id: ObligationId::from_u128(i + 1),
                issuer: principal(),
                target: AgentId::new(target).unwrap(),
                created_at: UnixMillis(at),
                deadline: UnixMillis(at + 500),
                max_retries: 12,
                sequence: None,
                payload,
            };
            (at, o)
        })
        .collect()
}

struct Disk {
    backend: FaultyBackend,
    store: Option<Store>,
    /// Whether a store was ever opened on this disk. Creating a file is not atomic in redb:
    /// `Store::open` on a path creates under a temporary name and renames it into place, so a
    /// crash before the first successful open leaves no file. This in-memory disk has no
    /// names, so the harness starts such a disk afresh, as the rename would.
    initialized: bool,
    violations: Vec<String>,
}

impl Disk {
    fn new(plan: FaultPlan) -> Self {
        let mut d = Self {
            backend: FaultyBackend::new(plan),
            store: None,
            initialized: false,
            violations: Vec::new(),
        };
        d.open();
        d
    }

    /// Opens on what the disk holds; a fault during open is a crash too.
    fn open(&mut self) {
        for _ in 0..3 {
            match Store::open_backend(self.backend.clone(), StoreConfig::default()) {
                Ok(s) => {
                    self.store = Some(s);
                    self.initialized = true;
                    return;
                }
                Err(_) if !self.initialized => self.backend = FaultyBackend::new(FaultPlan::None),
                Err(e) => {
                    self.violations
                        .push(format!("reopen after a crash failed: {e}"));
                    self.backend = self.backend.power_cycle(FaultPlan::None);
                }
            }
        }
        panic!(
            "the store cannot be opened after a crash: {:?}",
            self.violations
        );
    }

    fn crash_and_reopen(&mut self) {
        self.store = None;
        self.backend = self.backend.power_cycle(FaultPlan::None);
        self.open();
    }

    fn store(&mut self) -> &mut Store {
        self.store.as_mut().expect("open")
    }
}

enum Msg {
    Obligation(Vec<u8>),
    Ack(Vec<u8>),
}

struct Run {
    now: u64,
    c: Custodian,
    r: Receiver,
    cdisk: Disk,
    rdisk: Disk,
    net: BTreeMap<(u64, u64), Msg>,
    seq: u64,
    accepted: BTreeSet<ObligationId>,
    acked_terminal: BTreeSet<ObligationId>,
    acked_applied: BTreeSet<ObligationId>,
    crashes: u32,
    /// Syncs of each original disk over the run (before the final check's reopen).
    syncs: (u64, u64),
    violations: Vec<String>,
}

impl Run {
    fn new(cplan: FaultPlan, rplan: FaultPlan) -> Self {
        Self {
            now: 0,
            c: Custodian::new(principal(), custodian_config(), 1),
            r: Receiver::new(agent(), receiver_config()),
            cdisk: Disk::new(cplan),
            rdisk: Disk::new(rplan),
            net: BTreeMap::new(),
            seq: 0,
            accepted: BTreeSet::new(),
            acked_terminal: BTreeSet::new(),
            acked_applied: BTreeSet::new(),
            crashes: 0,
            syncs: (0, 0),
            violations: Vec::new(),
        }
    }

    fn send(&mut self, msg: Msg) {
        self.seq += 1;
        // Deterministic impairment: every 4th message lost, every 7th duplicated.
        if self.seq % 4 == 0 {
            return;
        }
        let at = self.now + 3 + self.seq % 5;
        if self.seq % 7 == 0 {
            let copy = match &msg {
                Msg::Obligation(b) => Msg::Obligation(b.clone()),
                Msg::Ack(b) => Msg::Ack(b.clone()),
            };
            self.net.insert((at + 2, self.seq + 1_000_000), copy);
        }
        self.net.insert((at, self.seq), msg);
    }

    fn flush_custodian(&mut self) {
        let mut records = Vec::new();
        while let Some(p) = self.c.poll_persist() {
            records.push(p);
        }
        if !records.is_empty() {
            let ops: Vec<Op> = records
                .iter()
                .map(|p| Op::Custodian(p.record.clone()))
                .collect();
            if self.cdisk.store().commit(&ops).is_err() {
                return self.crash_custodian();
            }
            for p in &records {
                if let CustodianRecord::Terminal { record, .. } = &p.record {
                    if record.outcome != Outcome::BestEffort {
                        self.acked_terminal.insert(record.obligation_id);
                    }
                }
                self.c.handle_persisted(UnixMillis(self.now), p.token);
            }
        }
        while let Some(e) = self.c.poll_event() {
            if let CustodianEvent::Accepted { id } = e {
                self.accepted.insert(id);
            }
        }
        while let Some(t) = self.c.poll_transmit() {
            if t.to == agent() {
                self.send(Msg::Obligation(abhyasa_wire::encode(&t.obligation)));
            }
        }
    }

    fn flush_receiver(&mut self) {
        let mut records = Vec::new();
        while let Some(p) = self.r.poll_persist() {
            records.push(p);
        }
        if !records.is_empty() {
            let ops: Vec<Op> = records
                .iter()
                .map(|p| Op::Receiver(p.record.clone()))
                .collect();
            if self.rdisk.store().commit(&ops).is_err() {
                return self.crash_receiver();
            }
            for p in &records {
                if let ReceiverRecord::Apply { id, .. } = &p.record {
                    self.acked_applied.insert(*id);
                }
                self.r.handle_persisted(p.token);
            }
        }
        while self.r.poll_event().is_some() {}
        while let Some(a) = self.r.poll_transmit() {
            self.send(Msg::Ack(abhyasa_wire::encode(&a.ack)));
        }
    }

    fn check_acknowledged_survived(&mut self) {
        let cstore = self.cdisk.store.as_ref().expect("open");
        for id in &self.acked_terminal {
            if cstore.terminal(*id).ok().flatten().is_none() {
                self.violations
                    .push(format!("acknowledged terminal record of {id} lost"));
            }
        }
        let rstore = self.rdisk.store.as_ref().expect("open");
        for id in &self.acked_applied {
            if rstore.applied(*id).ok().flatten().is_none() {
                self.violations
                    .push(format!("acknowledged apply of {id} lost"));
            }
        }
    }

    fn crash_custodian(&mut self) {
        self.crashes += 1;
        self.cdisk.crash_and_reopen();
        self.check_acknowledged_survived();
        let now = UnixMillis(self.now);
        self.c = self
            .cdisk
            .store()
            .recover_custodian(principal(), custodian_config(), 7, now)
            .expect("recovery reads the store");
        // The application re-issues what it never saw accepted; issuing is idempotent.
        let known: Vec<ObligationId> = self.accepted.iter().copied().collect();
        for id in known {
            if !self.cdisk.store().knows(id).unwrap() {
                self.violations
                    .push(format!("accepted {id} vanished from the custodian's disk"));
            }
        }
        self.c.handle_timeout(now);
        self.flush_custodian();
    }

    fn crash_receiver(&mut self) {
        self.crashes += 1;
        self.rdisk.crash_and_reopen();
        self.check_acknowledged_survived();
        self.r = self
            .rdisk
            .store()
            .recover_receiver(agent(), receiver_config())
            .expect("recovery reads the store");
        self.flush_receiver();
    }

    fn issue(&mut self, o: &Obligation) {
        if self.cdisk.store().knows(o.id).unwrap() {
            return;
        }
        if self.c.issue(UnixMillis(self.now), o.clone()).is_ok() {
            self.flush_custodian();
        }
    }

    fn run(mut self) -> Self {
        let work = workload();
        let mut next_issue = 0;
        loop {
            let t_issue = work.get(next_issue).map(|(t, _)| *t);
            let t_net = self.net.first_key_value().map(|(k, _)| k.0);
            let t_c = self.c.poll_timeout().map(|t| t.0);
            let t_r = self.r.poll_timeout().map(|t| t.0);
            let Some(t) = [t_issue, t_net, t_c, t_r].into_iter().flatten().min() else {
                break;
            };
            if t > END {
                break;
            }
            self.now = self.now.max(t);
            if t_issue == Some(t) {
                let o = work[next_issue].1.clone();
                next_issue += 1;
                self.issue(&o);
                // Anything issued but not accepted before a crash is issued again.
                let pending: Vec<_> = work[..next_issue].iter().map(|(_, o)| o.clone()).collect();
                for o in pending {
                    if kinds::admissible(&o)
                        && !self.accepted.contains(&o.id)
                        && o.deadline.0 > self.now
                    {
                        self.issue(&o);
                    }
                }
            } else if t_net == Some(t) {
                let (_, msg) = self.net.pop_first().expect("due");
                let now = UnixMillis(self.now);
                match msg {
                    Msg::Obligation(b) => {
                        let o = abhyasa_wire::decode_obligation(&b).expect("own encoding");
                        self.r.handle_obligation(now, &principal(), o);
                        self.flush_receiver();
                    }
                    Msg::Ack(b) => {
                        let ack: CustodyAck = abhyasa_wire::decode(&b).expect("own encoding");
                        self.c.handle_ack(now, &agent(), ack);
                        self.flush_custodian();
                    }
                }
            } else if t_c == Some(t) {
                self.c.handle_timeout(UnixMillis(self.now));
                self.flush_custodian();
            } else {
                self.r.handle_timeout(UnixMillis(self.now));
                self.flush_receiver();
            }
        }
        self.now = END;
        self.c.handle_timeout(UnixMillis(END));
        self.flush_custodian();
        self.syncs = (self.cdisk.backend.syncs(), self.rdisk.backend.syncs());
        self.check_end();
        self
    }

    fn check_end(&mut self) {
        // Read both disks as a restart would.
        self.cdisk.crash_and_reopen();
        self.rdisk.crash_and_reopen();
        self.violations.append(&mut self.cdisk.violations);
        self.violations.append(&mut self.rdisk.violations);
        self.check_acknowledged_survived();
        let cstore = self.cdisk.store.as_ref().expect("open");
        let rstore = self.rdisk.store.as_ref().expect("open");
        if !cstore.pending().unwrap().is_empty() {
            self.violations
                .push("pending obligations left after every deadline".into());
        }
        let recv = rstore.receiver_state();
        for (_, o) in workload() {
            let id = o.id;
            let admissible = kinds::admissible(&o);
            let terminal = cstore.terminal(id).unwrap();
            if admissible && self.accepted.contains(&id) && terminal.is_none() {
                self.violations
                    .push(format!("{id} accepted but not terminal: lost"));
            }
            let applied = rstore.applied(id).unwrap().is_some();
            if let Payload::PhalaBeliefUpdate(p) = &o.payload {
                let w = recv.weight(&principal(), &p.weight_key, o.created_at);
                let i = id.to_u128() - 1;
                if w != 0 && w != delta(i) {
                    self.violations
                        .push(format!("{id} applied more than once (weight {w})"));
                }
                if applied != (w != 0) {
                    self.violations
                        .push(format!("{id}: applied id {applied} but weight {w}"));
                }
            }
            if let Some(t) = &terminal {
                if t.outcome == Outcome::Applied && !applied {
                    self.violations.push(format!(
                        "{id} terminal applied but not on the receiver's disk"
                    ));
                }
            }
            if admissible && terminal.is_some() {
                let safe = kinds::safe(&o, 20_000).expect("admissible");
                let revocation = !matches!(o.payload, Payload::PhalaBeliefUpdate(_));
                let escalated = matches!(terminal.map(|t| t.outcome), Some(Outcome::Escalated(_)));
                if (revocation || escalated) && !cstore.principal().holds(&safe) {
                    self.violations
                        .push(format!("{id}: safe action not in force"));
                }
            }
        }
    }
}

#[test]
fn power_loss_at_every_sync_point() {
    let clean = Run::new(FaultPlan::None, FaultPlan::None).run();
    assert!(clean.violations.is_empty(), "{:?}", clean.violations);
    let (c_syncs, r_syncs) = clean.syncs;
    assert!(
        clean.acked_terminal.len() >= 14,
        "the history ends too little custody"
    );
    assert!(!clean.acked_applied.is_empty());

    let mut points = 0u64;
    let mut crashes = 0u64;
    let mut violations = Vec::new();
    for n in 1..=c_syncs + 2 {
        for (cplan, rplan) in [
            (FaultPlan::PowerLossAfterSync(n), FaultPlan::None),
            (FaultPlan::FailSync(n), FaultPlan::None),
        ] {
            let run = Run::new(cplan, rplan).run();
            points += 1;
            crashes += u64::from(run.crashes);
            violations.extend(
                run.violations
                    .iter()
                    .map(|v| format!("custodian {cplan:?}: {v}")),
            );
        }
    }
    for n in 1..=r_syncs + 2 {
        for rplan in [FaultPlan::PowerLossAfterSync(n), FaultPlan::FailSync(n)] {
            let run = Run::new(FaultPlan::None, rplan).run();
            points += 1;
            crashes += u64::from(run.crashes);
            violations.extend(
                run.violations
                    .iter()
                    .map(|v| format!("receiver {rplan:?}: {v}")),
            );
        }
    }
    println!(
        "power-loss: crash points enumerated={points} (custodian syncs={c_syncs}, receiver syncs={r_syncs}) crashes={crashes} violations={}",
        violations.len()
    );
    assert!(points >= 200, "only {points} crash points");
    assert!(violations.is_empty(), "{violations:#?}");
}
