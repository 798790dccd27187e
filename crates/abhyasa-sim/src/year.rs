//! A long run in virtual time: one payer spending through one gateway, day after day, over a
//! lossy link, with the checker and the history auditors run every day.
//!
//! It answers one question: does the state both sides keep stay flat? The payer's checkpoint
//! folds every ended operation to a summary; the gateway forgets settled acceptances its
//! retention has passed and tells the payer the instant before which it holds nothing of it
//! ([`LedgerMessage::Horizon`]); the payer's next checkpoint forgets the summaries behind it.
//! Without that, the summaries grow by one per operation for ever. Each day's sample is the
//! size of what a store would hold: the journal (a checkpoint and the steps after it), the
//! checkpoint's bytes, the gateway's log and its checkpoint's bytes.

use std::collections::VecDeque;

use abhyasa_ledger::check::{audit, audit_gateway, check, EffectInstance, World};
use abhyasa_ledger::{
    signing_key, Branch, BranchConfig, CreditId, Dim, Effect, Gateway, GatewayRecord, Keyring,
    Label, LedgerMessage, OpKey, OpState, RootGrant, RootId, Signed, Step, Vector,
};
use abhyasa_wire::{encode, AgentId, UnixMillis};
use rand::Rng;

use crate::rng::SimRng;

const DAY_MS: u64 = 86_400_000;

/// What the run does.
#[derive(Clone, Debug)]
pub struct YearParams {
    /// Days of virtual time.
    pub days: u64,
    /// Operations the payer starts each day, evenly spaced.
    pub ops_per_day: u64,
    /// Chance that any one message is lost (the payer resends; the gateway answers again).
    pub loss: f64,
    /// How long a permit is valid, in ms.
    pub permit_ttl_ms: u64,
    /// How long the gateway keeps a settled acceptance after its permit expired, in ms;
    /// `None`: for ever (nothing is forgotten on either side).
    pub retain_ms: Option<u64>,
    /// Journal steps (and gateway records) between checkpoints.
    pub checkpoint_steps: u64,
    /// The seed of every choice (charges, losses).
    pub seed: u64,
}

impl Default for YearParams {
    fn default() -> Self {
        Self {
            days: 365,
            ops_per_day: 720,
            loss: 0.05,
            permit_ttl_ms: 60_000,
            retain_ms: Some(3_600_000),
            checkpoint_steps: 1_000,
            seed: 0,
        }
    }
}

/// The state at the end of one day.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct DaySample {
    /// Days run.
    pub day: u64,
    /// Operations settled so far.
    pub settled: u64,
    /// Operations open at the payer (reserved, quarantined or forfeited).
    pub open: u64,
    /// Ended operations the payer keeps as summaries.
    pub ended: u64,
    /// Credits the payer holds (closed ones included).
    pub credits: u64,
    /// Ranges of atoms the payer's folded settlements committed.
    pub committed_ranges: u64,
    /// Steps in the payer's durable journal (its checkpoint and the steps after it).
    pub journal_steps: u64,
    /// Bytes of the payer's latest checkpoint.
    pub checkpoint_bytes: u64,
    /// Acceptances the gateway keeps.
    pub acceptances: u64,
    /// Records in the gateway's durable log.
    pub gateway_records: u64,
    /// Bytes of the gateway's latest checkpoint.
    pub gateway_checkpoint_bytes: u64,
}

/// What a run found.
#[derive(Clone, Debug, Default)]
pub struct YearReport {
    /// One sample per day.
    pub samples: Vec<DaySample>,
    /// Effects that ran.
    pub effects: u64,
    /// Messages lost.
    pub lost: u64,
    /// Broken invariants (checker, auditors), with the day they were found.
    pub violations: Vec<String>,
}

impl YearReport {
    /// The samples as CSV, one header line and a line per day.
    pub fn csv(&self) -> String {
        let mut out = String::from(
            "day,settled,open,ended,credits,committed_ranges,journal_steps,checkpoint_bytes,\
             acceptances,gateway_records,gateway_checkpoint_bytes\n",
        );
        for s in &self.samples {
            out.push_str(&format!(
                "{},{},{},{},{},{},{},{},{},{},{}\n",
                s.day,
                s.settled,
                s.open,
                s.ended,
                s.credits,
                s.committed_ranges,
                s.journal_steps,
                s.checkpoint_bytes,
                s.acceptances,
                s.gateway_records,
                s.gateway_checkpoint_bytes
            ));
        }
        out
    }

    /// Whether the state stayed flat: after the first week, no day's ended summaries,
    /// acceptances or checkpoint bytes (either side) exceed 1.5 times the largest seen in
    /// that first week. `Err` names the first measure that grew, and how far.
    pub fn flat(&self) -> Result<(), String> {
        const WEEK: usize = 7;
        if self.samples.len() <= WEEK {
            return Err(format!(
                "{} days is too short to tell (more than {WEEK} needed)",
                self.samples.len()
            ));
        }
        let (first, rest) = self.samples.split_at(WEEK);
        type Measure = (&'static str, fn(&DaySample) -> u64);
        let measures: [Measure; 4] = [
            ("ended summaries", |s| s.ended),
            ("checkpoint bytes", |s| s.checkpoint_bytes),
            ("gateway acceptances", |s| s.acceptances),
            ("gateway checkpoint bytes", |s| s.gateway_checkpoint_bytes),
        ];
        for (name, m) in measures {
            let bound = first.iter().map(m).max().unwrap_or(0).max(1);
            if let Some(s) = rest.iter().find(|s| m(s) * 2 > bound * 3) {
                return Err(format!(
                    "{name} grew: {} on day {}, against at most {bound} in the first week",
                    m(s),
                    s.day
                ));
            }
        }
        Ok(())
    }
}

fn agent(s: &str) -> AgentId {
    AgentId::new(s).expect("valid agent id")
}

/// A message on its way: delivered one millisecond after it was sent.
struct InFlight {
    at: u64,
    from: AgentId,
    to: AgentId,
    msg: LedgerMessage,
}

/// Runs `p`; see the module documentation.
pub fn run_year(p: &YearParams) -> YearReport {
    let (payer, gw, issuer) = (agent("payer"), agent("gateway"), agent("issuer"));
    let (issuer_key, payer_key, gw_key) = (
        signing_key([1; 32]),
        signing_key([2; 32]),
        signing_key([3; 32]),
    );
    let keys = Keyring::new([
        (issuer.clone(), issuer_key.verifying_key()),
        (payer.clone(), payer_key.verifying_key()),
        (gw.clone(), gw_key.verifying_key()),
    ])
    .with_issuers([issuer.clone()]);
    let config = BranchConfig {
        resend_ms: 1_000,
        checkpoint_steps: p.checkpoint_steps,
        permit_ttl_ms: p.permit_ttl_ms,
        max_journal_steps: u64::MAX,
        mutation: None,
    };
    let mut b = Branch::new(payer.clone(), payer_key, keys.clone(), config);
    let g = Gateway::new(gw.clone(), gw_key, keys.clone()).checkpointing(p.checkpoint_steps);
    let mut g = match p.retain_ms {
        Some(ms) => g.retaining(ms),
        None => g,
    };
    let mut rng = SimRng::seeded(p.seed);
    let mut report = YearReport::default();
    let mut effects: Vec<EffectInstance> = Vec::new();
    // What each effect charged, for an executor asked again after a restart (none here: the
    // gateway never crashes in this run, but the executor answers as a real one must).
    let mut ran: std::collections::HashMap<OpKey, Vector> = std::collections::HashMap::new();
    let mut journal: Vec<Step> = Vec::new();
    let mut log: Vec<GatewayRecord> = Vec::new();
    let mut net: VecDeque<InFlight> = VecDeque::new();

    let credit = CreditId::from_u128(1);
    let cents = Dim::new("cents").expect("valid dimension");
    let budget = p.days * p.ops_per_day * 10 + 1_000;
    let grant = RootGrant {
        root: RootId::from_u128(1),
        issuer: issuer.clone(),
        holder: payer.clone(),
        budget: Vector::of(&[("cents", budget)]).expect("valid budget"),
        label: Label::of(&["tools"]).expect("valid label"),
        issued_at: UnixMillis(0),
    };
    if let Err(e) = b.grant(Signed::sign(&grant, &issuer, &issuer_key), credit) {
        report
            .violations
            .push(format!("the grant was refused: {e}"));
        return report;
    }

    let interval = (DAY_MS / p.ops_per_day.max(1)).max(1);
    let mut now = 0u64;
    let mut next_op = 0u64;
    let mut next_key = 1u128;
    let mut next_day = DAY_MS;
    let mut settled = 0u64;
    while (report.samples.len() as u64) < p.days {
        // Move every machine forward: what is durable is released, effects run, messages go.
        loop {
            let mut moved = false;
            while let Some((t, s)) = b.poll_persist() {
                if matches!(s, Step::Checkpoint(_)) {
                    journal.clear();
                }
                if matches!(s, Step::Settle { .. }) {
                    settled += 1;
                }
                journal.push(s);
                b.handle_persisted(t);
                moved = true;
            }
            while let Some((t, r)) = g.poll_persist() {
                if matches!(r, GatewayRecord::Checkpoint(_)) {
                    log.clear();
                }
                log.push(r);
                g.handle_persisted(t);
                moved = true;
            }
            while let Some(e) = g.poll_execute() {
                let prior = ran.get(&e.key).filter(|_| e.resume).cloned();
                let charge = match prior {
                    Some(c) => c,
                    None => {
                        let max = e.max_charge.get(&cents);
                        let c = Vector::of(&[("cents", rng.random_range(0..=max))])
                            .expect("valid charge");
                        effects.push(EffectInstance {
                            gateway: gw.clone(),
                            payer: e.payer.clone(),
                            key: e.key,
                            charge: c.clone(),
                            expires: e.expires,
                        });
                        ran.insert(e.key, c.clone());
                        c
                    }
                };
                g.handle_executed(&e.payer, e.key, charge);
                moved = true;
            }
            let sent = std::iter::from_fn(|| b.poll_transmit())
                .map(|(to, m)| (payer.clone(), to, m))
                .chain(std::iter::from_fn(|| g.poll_transmit()).map(|(to, m)| (gw.clone(), to, m)))
                .collect::<Vec<_>>();
            for (from, to, msg) in sent {
                moved = true;
                if rng.random_bool(p.loss) {
                    report.lost += 1;
                    continue;
                }
                net.push_back(InFlight {
                    at: now + 1,
                    from,
                    to,
                    msg,
                });
            }
            while b.poll_event().is_some() {}
            if !moved {
                break;
            }
        }
        if now >= next_day {
            let day = next_day / DAY_MS;
            report
                .samples
                .push(sample(day, settled, &b, &g, &journal, &log));
            let mut found: Vec<String> = check(&World {
                branches: &[&b],
                gateways: &[&g],
                effects: &effects,
                keys: &keys,
            })
            .into_iter()
            .chain(audit(&payer, &journal, &keys))
            .chain(audit_gateway(&gw, &log, &keys))
            .map(|v| format!("day {day}: {v}"))
            .collect();
            report.violations.append(&mut found);
            if !report.violations.is_empty() || day >= p.days {
                break;
            }
            next_day += DAY_MS;
            continue;
        }
        // The next thing due: a message, a timer, an operation or the day's end.
        let due = [
            net.front().map(|m| m.at),
            b.poll_timeout().map(|t| t.0),
            g.poll_timeout().map(|t| t.0),
            Some(next_op),
            Some(next_day),
        ]
        .into_iter()
        .flatten()
        .min()
        .unwrap_or(next_day);
        now = now.max(due);
        let clock = UnixMillis(now);
        while net.front().is_some_and(|m| m.at <= now) {
            let Some(m) = net.pop_front() else { break };
            if m.to == gw {
                g.handle_message(clock, &m.from, m.msg);
            } else {
                b.handle_message(clock, &m.from, m.msg);
            }
        }
        if b.poll_timeout().is_some_and(|t| t.0 <= now) {
            b.handle_timeout(clock);
        }
        if g.poll_timeout().is_some_and(|t| t.0 <= now) {
            g.handle_timeout(clock);
        }
        if next_op <= now {
            next_op += interval;
            let key = OpKey::from_u128(next_key);
            next_key += 1;
            let max = rng.random_range(1..=10u64);
            let effect = Effect {
                purpose: Dim::new("tools").expect("valid purpose"),
                operation: "call".into(),
                max_charge: Vector::of(&[("cents", max)]).expect("valid maximum"),
                carried_by: None,
            };
            let reserved = b
                .reserve(clock, credit, effect, &gw, key)
                .and_then(|()| b.dispatch(clock, key));
            if let Err(e) = reserved {
                report
                    .violations
                    .push(format!("t={now}ms operation {key} not dispatched: {e}"));
                break;
            }
        }
    }
    report.effects = effects.len() as u64;
    report
}

fn sample(
    day: u64,
    settled: u64,
    b: &Branch,
    g: &Gateway,
    journal: &[Step],
    log: &[GatewayRecord],
) -> DaySample {
    let bytes_of_step = |s: Option<&Step>| match s {
        Some(s @ Step::Checkpoint(_)) => encode(s).len() as u64,
        _ => 0,
    };
    let gateway_bytes = match log.first() {
        Some(r @ GatewayRecord::Checkpoint(_)) => encode(r).len() as u64,
        _ => 0,
    };
    DaySample {
        day,
        settled,
        open: b
            .operations()
            .filter(|o| {
                matches!(
                    o.state,
                    OpState::Reserved | OpState::Quarantined | OpState::Forfeited { .. }
                )
            })
            .count() as u64,
        ended: b.ended().count() as u64,
        credits: b.credits().count() as u64,
        committed_ranges: b
            .committed()
            .flat_map(|(_, f)| f.iter().map(|(_, r)| r.ranges().len() as u64))
            .sum(),
        journal_steps: journal.len() as u64,
        checkpoint_bytes: bytes_of_step(journal.first()),
        acceptances: g.log().count() as u64,
        gateway_records: log.len() as u64,
        gateway_checkpoint_bytes: gateway_bytes,
    }
}
