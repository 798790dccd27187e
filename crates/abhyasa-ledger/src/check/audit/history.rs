//! The branch auditor's own bookkeeping of a journal ([`History::advance`]) and one function
//! per rule (H1–H9), each judging one step against the history before it.

use std::collections::{BTreeMap as Map, BTreeSet};

use abhyasa_wire::ledger::*;
use abhyasa_wire::{AgentId, UnixMillis};

use super::super::{confirms, Found};
use crate::branch::AuditSeed;
use crate::{Keyring, LedgerError, Step};

/// Where an operation stands, as far as the journal tells.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub(super) enum Op {
    Reserved,
    Dispatched,
    Forfeited,
    Ended,
}

/// One step as the rules see it.
pub(super) struct At<'a> {
    /// Its place in the journal (a fused reissue's last operation shares its reissue's).
    pub(super) i: usize,
    pub(super) step: &'a Step,
    /// A checkpoint's contents, opened once: `None` for other steps.
    pub(super) seed: Option<&'a Result<AuditSeed, LedgerError>>,
}

/// What the journal before a step says.
pub(super) struct History<'k> {
    agent: &'k AgentId,
    keys: &'k Keyring,
    labels: Map<CreditId, BTreeSet<Dim>>,
    ops: Map<OpKey, (Op, Vector)>,
    epochs: Map<CreditId, u64>,
    sealed: Map<TransferId, TransferCert>,
    decided: BTreeSet<TransferId>,
    /// Each operation's credit and the epoch its permit is bound to.
    op_credit: Map<OpKey, (CreditId, u64)>,
    /// Each operation's gateway and its permit's expiry: a checkpoint may forget an ended
    /// one only behind that gateway's horizon.
    op_at: Map<OpKey, (AgentId, Option<UnixMillis>)>,
    closed: BTreeSet<CreditId>,
    fenced: BTreeSet<CreditId>,
}

/// Every rule, in the order they judge a step.
pub(super) const RULES: [fn(&History<'_>, &At<'_>, &mut Found); 9] = [
    h1_labels_attenuate,
    h2_forfeiture_is_absorbing,
    h3_dispatched_never_released_and_ends_once,
    h4_epochs_rise,
    h5_transfers_decided_once_on_signed_evidence,
    h6_settled_within_maximum,
    h7_generation_closes_once,
    h8_fenced_generation_takes_no_new_work,
    h9_checkpoint_agrees,
];

impl<'k> History<'k> {
    pub(super) fn new(agent: &'k AgentId, keys: &'k Keyring) -> Self {
        Self {
            agent,
            keys,
            labels: Map::new(),
            ops: Map::new(),
            epochs: Map::new(),
            sealed: Map::new(),
            decided: BTreeSet::new(),
            op_credit: Map::new(),
            op_at: Map::new(),
            closed: BTreeSet::new(),
            fenced: BTreeSet::new(),
        }
    }

    fn op(&self, key: &OpKey) -> Option<Op> {
        self.ops.get(key).map(|o| o.0)
    }

    /// Moves the operation on when it stands where the step finds it; otherwise the step
    /// changes nothing (H2/H3 say so).
    fn step_op(&mut self, key: &OpKey, from: Op, to: Op) {
        if let Some((st, _)) = self.ops.get_mut(key) {
            if *st == from {
                *st = to;
            }
        }
    }

    /// Ended operations a checkpoint left out behind the horizon it names for their gateway
    /// (their permit expired before it): the only ones it may forget.
    fn forgotten_by(&self, seed: &AuditSeed, theirs: &Map<OpKey, Op>) -> Vec<OpKey> {
        self.ops
            .iter()
            .filter(|(k, (st, _))| *st == Op::Ended && !theirs.contains_key(*k))
            .filter(|(k, _)| {
                self.op_at.get(*k).is_some_and(|(g, e)| {
                    let h = seed.horizons.get(g);
                    e.zip(h.copied()).is_some_and(|(e, h)| e < h)
                })
            })
            .map(|(k, _)| *k)
            .collect()
    }

    /// The history after the step: the auditor's own bookkeeping, never the branch's `apply`.
    pub(super) fn advance(&mut self, at: &At<'_>) {
        match at.step {
            Step::Grant { grant, credit } => {
                if let Ok(g) = grant.peek() {
                    self.labels.insert(*credit, g.label.0.clone());
                }
            }
            Step::Split { child, label, .. } => {
                self.labels.insert(*child, label.0.clone());
            }
            Step::Accept { cert, credit, .. } => {
                if let Ok(c) = cert.peek() {
                    self.labels.insert(*credit, c.label.0.clone());
                }
            }
            Step::Claim { .. } | Step::Reclaimed { .. } | Step::Refuse { .. } => {}
            Step::Reclaim { decision } => {
                if let Ok(d) = decision.peek() {
                    self.decided.insert(d.transfer);
                }
            }
            Step::Decided { decision } => {
                if let Ok(d) = decision.peek() {
                    self.decided.insert(d.transfer);
                }
            }
            Step::Join { inputs, output } => {
                // The output takes the inputs' common lower bound.
                let mut common: Option<BTreeSet<Dim>> = None;
                for c in inputs {
                    let l = self.labels.get(c).cloned().unwrap_or_default();
                    common = Some(match common {
                        None => l,
                        Some(x) => x.intersection(&l).cloned().collect(),
                    });
                }
                self.labels.insert(*output, common.unwrap_or_default());
                self.closed.extend(inputs.iter().copied());
            }
            Step::Seal { cert } => {
                if let Ok(c) = cert.peek() {
                    self.sealed.insert(c.transfer, c);
                }
            }
            Step::Reserve { permit, .. } => {
                if let Ok(p) = permit.peek() {
                    let b = &p.binding;
                    self.ops.insert(b.key, (Op::Reserved, b.max_charge.clone()));
                    self.op_credit.insert(b.key, (b.credit, b.epoch));
                    self.op_at.insert(b.key, (b.receiver.clone(), b.expires));
                }
            }
            Step::Dispatch { key } => self.step_op(key, Op::Reserved, Op::Dispatched),
            Step::ReleaseUnsent { key } => self.step_op(key, Op::Reserved, Op::Ended),
            Step::Settle { key, .. } | Step::NoEffect { key, .. } | Step::Refund { key } => {
                self.step_op(key, Op::Dispatched, Op::Ended)
            }
            Step::Forfeit { key } => self.step_op(key, Op::Dispatched, Op::Forfeited),
            Step::Annotate { .. } => {}
            Step::Fenced { fenced } => {
                if let Ok(f) = fenced.peek() {
                    let e = self.epochs.entry(f.credit).or_insert(0);
                    *e = (*e).max(f.epoch);
                    self.fenced.insert(f.credit);
                }
            }
            Step::Reissue {
                credit, successor, ..
            } => {
                let label = self.labels.get(credit).cloned().unwrap_or_default();
                self.labels.insert(*successor, label);
                if let Some(e) = self.epochs.get(credit).copied() {
                    self.epochs.insert(*successor, e);
                }
                self.closed.insert(*credit);
            }
            Step::Checkpoint(_) => {
                let Some(Ok(seed)) = at.seed else { return };
                if at.i == 0 {
                    self.start_from(seed);
                } else {
                    for k in self.forgotten_by(seed, &their_ops(seed)) {
                        self.ops.remove(&k);
                        self.op_at.remove(&k);
                        self.op_credit.remove(&k);
                    }
                }
            }
        }
    }

    /// A journal that starts with a checkpoint: the checkpoint is the state before it.
    fn start_from(&mut self, seed: &AuditSeed) {
        let theirs = their_ops(seed);
        for (id, label, epoch, fenced, is_closed) in &seed.credits {
            self.labels.insert(*id, label.0.clone());
            if *epoch > 0 {
                self.epochs.insert(*id, *epoch);
            }
            if *fenced {
                self.fenced.insert(*id);
            }
            if *is_closed {
                self.closed.insert(*id);
            }
        }
        for (b, _, _) in &seed.ops {
            self.op_credit.insert(b.key, (b.credit, b.epoch));
            self.op_at.insert(b.key, (b.receiver.clone(), b.expires));
            self.ops
                .insert(b.key, (theirs[&b.key], b.max_charge.clone()));
        }
        for (k, receiver, expires) in &seed.ended {
            self.op_at.insert(*k, (receiver.clone(), *expires));
            self.ops.insert(*k, (Op::Ended, Vector::zero()));
        }
        for (c, is_decided) in &seed.outgoing {
            if *is_decided {
                self.decided.insert(c.transfer);
            }
            self.sealed.insert(c.transfer, c.clone());
        }
    }
}

/// Each operation a checkpoint holds, and where it stands.
fn their_ops(seed: &AuditSeed) -> Map<OpKey, Op> {
    seed.ops
        .iter()
        .map(|(b, dispatched, forfeited)| {
            let st = match (dispatched, forfeited) {
                (_, true) => Op::Forfeited,
                (true, false) => Op::Dispatched,
                (false, false) => Op::Reserved,
            };
            (b.key, st)
        })
        .chain(seed.ended.iter().map(|(k, _, _)| (*k, Op::Ended)))
        .collect()
}

/// The credits new work draws on.
fn drawn(step: &Step) -> Vec<CreditId> {
    match step {
        Step::Split { parent, .. } => vec![*parent],
        Step::Seal { cert } => cert
            .peek()
            .map(|c| vec![c.source_credit])
            .unwrap_or_default(),
        Step::Reserve { permit, .. } => permit
            .peek()
            .map(|p| vec![p.binding.credit])
            .unwrap_or_default(),
        Step::Join { inputs, .. } => inputs.clone(),
        _ => Vec::new(),
    }
}

/// H1: a split's label lies within its parent's, a sealed transfer's within its source
/// credit's, a reservation's purpose within its credit's label.
fn h1_labels_attenuate(h: &History<'_>, at: &At<'_>, out: &mut Found) {
    let i = at.i;
    match at.step {
        Step::Split {
            parent,
            child,
            label,
            ..
        } => match h.labels.get(parent) {
            Some(p) if label.0.is_subset(p) => {}
            Some(p) => out.bad(
                "H1",
                format!("step {i}: split {child} widens {p:?} to {:?}", label.0),
            ),
            None => out.bad("H1", format!("step {i}: split of unknown credit {parent}")),
        },
        Step::Seal { cert } => {
            let Ok(c) = cert.peek() else { return };
            match h.labels.get(&c.source_credit) {
                Some(p) if c.label.0.is_subset(p) => {}
                _ => out.bad(
                    "H1",
                    format!(
                        "step {i}: transfer {} not within its source's label",
                        c.transfer
                    ),
                ),
            }
        }
        Step::Reserve { permit, effect } => {
            let Ok(p) = permit.peek() else { return };
            let allowed = h
                .labels
                .get(&p.binding.credit)
                .is_some_and(|l| l.contains(&effect.purpose));
            if !allowed {
                out.bad(
                    "H1",
                    format!(
                        "step {i}: operation {} reserved for a purpose its credit does not allow",
                        p.binding.key
                    ),
                );
            }
        }
        _ => {}
    }
}

/// H2: after `Forfeit`, only an `Annotate` of the same key.
fn h2_forfeiture_is_absorbing(h: &History<'_>, at: &At<'_>, out: &mut Found) {
    let i = at.i;
    match at.step {
        Step::Settle { key, .. } if h.op(key) == Some(Op::Forfeited) => {
            out.bad("H2", format!("step {i}: forfeited {key} settled"))
        }
        Step::NoEffect { key, .. } | Step::Refund { key } if h.op(key) == Some(Op::Forfeited) => {
            out.bad("H2", format!("step {i}: forfeited {key} returned"))
        }
        Step::Annotate { key, .. } if h.op(key) != Some(Op::Forfeited) => {
            out.bad("H2", format!("step {i}: annotation of unforfeited {key}"))
        }
        _ => {}
    }
}

/// H3: a dispatched reservation is never released, and an operation ends once (settled,
/// no-effect, released or refunded: at most one of them, only after a reserve).
fn h3_dispatched_never_released_and_ends_once(h: &History<'_>, at: &At<'_>, out: &mut Found) {
    let (what, key, from) = match at.step {
        Step::Dispatch { key } => ("dispatch", key, Op::Reserved),
        Step::ReleaseUnsent { key } => ("release", key, Op::Reserved),
        Step::Settle { key, .. } => ("settle", key, Op::Dispatched),
        Step::NoEffect { key, .. } | Step::Refund { key } => ("return", key, Op::Dispatched),
        Step::Forfeit { key } => ("forfeit", key, Op::Dispatched),
        _ => return,
    };
    let now = h.op(key);
    // A settle or return of a forfeited operation is H2's.
    let h2s = now == Some(Op::Forfeited) && matches!(what, "settle" | "return");
    if now != Some(from) && !h2s {
        out.bad("H3", format!("step {}: {what} of {key} in {now:?}", at.i));
    }
}

/// H4: epochs only rise per credit.
fn h4_epochs_rise(h: &History<'_>, at: &At<'_>, out: &mut Found) {
    let Step::Fenced { fenced } = at.step else {
        return;
    };
    let Ok(f) = fenced.peek() else { return };
    let e = h.epochs.get(&f.credit).copied().unwrap_or(0);
    if f.epoch <= e {
        out.bad(
            "H4",
            format!(
                "step {}: epoch of {} falls or repeats: {} after {e}",
                at.i, f.credit, f.epoch
            ),
        );
    }
}

/// H5: a transfer is decided once, and cancelled only on its destination's signed refusal
/// bound to the certificate; one whose certificate asks for confirmation is taken only with
/// its source's signed confirmation of that credit, and reclaimed only by its source, with a
/// signed reclaim, before any decision.
fn h5_transfers_decided_once_on_signed_evidence(h: &History<'_>, at: &At<'_>, out: &mut Found) {
    let i = at.i;
    let decided = match at.step {
        Step::Reclaim { decision } => decision.peek().ok().map(|d| d.transfer),
        Step::Decided { decision } => decision.peek().ok().map(|d| d.transfer),
        _ => None,
    };
    if let Some(t) = decided.filter(|t| h.decided.contains(t)) {
        out.bad("H5", format!("step {i}: transfer {t} decided twice"));
    }
    match at.step {
        Step::Accept {
            cert,
            credit,
            confirmation,
            ..
        } => {
            let Ok(c) = cert.peek() else { return };
            if c.confirm && !confirms(h.keys, confirmation.as_ref(), &c, Some(*credit)) {
                out.bad(
                    "H5",
                    format!(
                        "step {i}: transfer {} taken without its source's confirmation",
                        c.transfer
                    ),
                );
            }
        }
        Step::Reclaim { decision } => {
            let Ok(d) = decision.peek() else { return };
            let ok = h.sealed.get(&d.transfer).is_some_and(|c| {
                c.confirm && &c.source == h.agent && confirms(h.keys, Some(decision), c, None)
            });
            if !ok {
                out.bad(
                    "H5",
                    format!(
                        "step {i}: transfer {} reclaimed without a reclaim its certificate allows",
                        d.transfer
                    ),
                );
            }
        }
        Step::Decided { decision } => {
            let Ok(d) = decision.peek() else { return };
            let Some(c) = h.sealed.get(&d.transfer) else {
                out.bad(
                    "H5",
                    format!("step {i}: decision on unsealed transfer {}", d.transfer),
                );
                return;
            };
            let signed_by_destination = h.keys.open(decision, &c.destination).is_ok();
            let bound = d.cert == c.digest() && d.source == c.source;
            if !(signed_by_destination && bound) {
                out.bad(
                    "H5",
                    format!(
                        "step {i}: transfer {} decided without the destination's bound signature",
                        d.transfer
                    ),
                );
            }
        }
        _ => {}
    }
}

/// H6: committed atoms lie inside the operation's footprint: a settlement charges at most
/// the binding's maximum.
fn h6_settled_within_maximum(h: &History<'_>, at: &At<'_>, out: &mut Found) {
    let Step::Settle { key, receipt } = at.step else {
        return;
    };
    let Some((Op::Dispatched, max)) = h.ops.get(key) else {
        return;
    };
    let actual = receipt.peek().map(|r| r.actual).ok();
    if actual.as_ref().is_none_or(|a| !a.le(max)) {
        out.bad(
            "H6",
            format!("step {}: {key} settled above its maximum", at.i),
        );
    }
}

/// H7: a generation closes once, with nothing in progress: a reissue only of a credit whose
/// every operation has ended (the fused one in the same step, and only when the credit was
/// fenced above that operation's epoch) and none of whose transfers is undecided, into a
/// credit that did not exist, with the same label; a closed credit takes no work again.
fn h7_generation_closes_once(h: &History<'_>, at: &At<'_>, out: &mut Found) {
    let i = at.i;
    for c in drawn(at.step) {
        if h.closed.contains(&c) {
            out.bad(
                "H7",
                format!("step {i}: new work drawn on closed credit {c}"),
            );
        }
    }
    let Step::Reissue {
        credit,
        successor,
        last,
    } = at.step
    else {
        return;
    };
    if h.closed.contains(credit) {
        out.bad("H7", format!("step {i}: closed credit {credit} reissued"));
    }
    if h.labels.contains_key(successor) {
        out.bad(
            "H7",
            format!("step {i}: {credit} reissued into existing credit {successor}"),
        );
    }
    let open = h
        .ops
        .iter()
        .filter(|(k, (st, _))| {
            matches!(st, Op::Reserved | Op::Dispatched)
                && h.op_credit.get(*k).map(|c| c.0) == Some(*credit)
        })
        .count();
    let in_transit = h
        .sealed
        .values()
        .any(|c| c.source_credit == *credit && !h.decided.contains(&c.transfer));
    if open > 0 || in_transit {
        out.bad(
            "H7",
            format!(
                "step {i}: {credit} reissued with work in progress ({open} operations open, transfer undecided: {in_transit})"
            ),
        );
    }
    if let Some(l) = last {
        let key = match &**l {
            Step::Settle { key, .. } | Step::NoEffect { key, .. } => Some(*key),
            _ => None,
        };
        let op = key.and_then(|k| h.op_credit.get(&k));
        let fenced_above = op.is_some_and(|(c, e)| {
            c == credit && h.fenced.contains(credit) && h.epochs.get(credit) > Some(e)
        });
        if !fenced_above {
            out.bad(
                "H7",
                format!(
                    "step {i}: fused reissue of {credit} ends an operation that is not its fenced last one"
                ),
            );
        }
    }
}

/// H8: a fenced generation takes no new work: no split, transfer, reservation or join from it
/// after its `Fenced` step (a closed one is H7's).
fn h8_fenced_generation_takes_no_new_work(h: &History<'_>, at: &At<'_>, out: &mut Found) {
    for c in drawn(at.step) {
        if h.fenced.contains(&c) && !h.closed.contains(&c) {
            out.bad(
                "H8",
                format!("step {}: new work drawn on fenced credit {c}", at.i),
            );
        }
    }
}

/// H9: a checkpoint is signed by the branch; first in the journal it is the state the audit
/// starts from; after other steps it must agree with them — every operation in the same state
/// and the same credits closed; an ended operation may be missing only if its permit expired
/// before the horizon the checkpoint names for its gateway.
fn h9_checkpoint_agrees(h: &History<'_>, at: &At<'_>, out: &mut Found) {
    let i = at.i;
    let Some(seed) = at.seed else { return };
    let seed = match seed {
        Ok(seed) => seed,
        Err(e) => {
            out.bad("H9", format!("step {i}: checkpoint does not verify: {e}"));
            return;
        }
    };
    if i == 0 {
        return;
    }
    let theirs = their_ops(seed);
    let forgotten = h.forgotten_by(seed, &theirs);
    let mine: Map<OpKey, Op> = h
        .ops
        .iter()
        .filter(|(k, _)| !forgotten.contains(k))
        .map(|(k, (st, _))| (*k, *st))
        .collect();
    if mine != theirs {
        let differ = mine
            .iter()
            .filter(|(k, st)| theirs.get(*k) != Some(*st))
            .count()
            + theirs.keys().filter(|k| !mine.contains_key(*k)).count();
        out.bad(
            "H9",
            format!(
                "step {i}: checkpoint disagrees with the history before it on {differ} operations"
            ),
        );
    }
    let their_closed: BTreeSet<CreditId> =
        seed.credits.iter().filter(|c| c.4).map(|c| c.0).collect();
    if their_closed != h.closed {
        out.bad(
            "H9",
            format!("step {i}: checkpoint disagrees with the history before it on closed credits"),
        );
    }
}
