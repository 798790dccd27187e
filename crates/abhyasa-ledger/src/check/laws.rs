//! One function per law, each over the gathered [`Facts`] and, where a law must verify
//! signed evidence again, the durable states themselves.

use std::collections::{BTreeMap, BTreeSet};

use abhyasa_wire::ledger::*;
use abhyasa_wire::{AgentId, UnixMillis};

use super::atoms::{normalize, normalize_loose, size, subset, vec_get, Iv};
use super::{Facts, Found, World};
use crate::{Ended, OpState, OutgoingState, Step};

/// L1: the atoms of each root are partitioned exactly among the branches' buckets — none
/// owned twice, none lost, none outside a granted budget, none stranded in a closed credit,
/// and no transfer both taken back at its source and accepted at its destination.
pub(super) fn l1_exact_partition(w: &World<'_>, f: &Facts<'_>, out: &mut Found) {
    let mut granted: BTreeSet<(RootId, Dim)> = BTreeSet::new();
    for (root, budget) in &f.budgets {
        for (d, n) in budget.iter() {
            granted.insert((*root, d.clone()));
            let all = f
                .held
                .get(&(*root, d.clone()))
                .map_or_else(Vec::new, |h| h.all.clone());
            let total = size(&all);
            match normalize(all) {
                Err(atom) => out.bad("L1", format!("root {root} {d}: atom {atom} is owned twice")),
                Ok(ivs) => {
                    if ivs != [(0, n)] {
                        out.bad("L1", format!("root {root} {d}: atoms owned {ivs:?} (total {total}) are not exactly [0, {n})"));
                    }
                }
            }
        }
    }
    for ((root, d), h) in &f.held {
        if !granted.contains(&(*root, d.clone())) && !h.all.is_empty() {
            out.bad(
                "L1",
                format!("root {root} {d}: atoms held outside any granted budget"),
            );
        }
    }
    for b in w.branches {
        let me = b.agent();
        for c in b.credits() {
            if c.closed && !c.available.is_empty() {
                out.bad(
                    "L1",
                    format!(
                        "{me}: closed credit {} holds atoms, in no bucket: {:?}",
                        c.id,
                        c.available.size()
                    ),
                );
            }
        }
        for o in b.outgoing() {
            let undone = match o.state {
                OutgoingState::Reclaimed(_) => "reclaimed",
                OutgoingState::Cancelled(_) => "cancelled",
                _ => continue,
            };
            if f.accepted_at.contains_key(&(o.body.root, o.body.transfer)) {
                out.bad(
                    "L1",
                    format!(
                        "{me}: transfer {} {undone} at the source but accepted at the destination",
                        o.body.transfer
                    ),
                );
            }
        }
    }
}

/// L2: one settlement per key, on the receipt its gateway holds.
pub(super) fn l2_one_settlement(w: &World<'_>, f: &Facts<'_>, out: &mut Found) {
    for ((_, key), n) in &f.settled_keys {
        if *n > 1 {
            out.bad("L2", format!("operation {key} settled {n} times"));
        }
    }
    for b in w.branches {
        for o in b.operations() {
            if let OpState::Settled { receipt, .. } = &o.state {
                let k = (o.binding.payer.clone(), o.binding.key);
                if f.receipts.get(&k).is_some_and(|r| *r != receipt) {
                    out.bad(
                        "L2",
                        format!(
                            "operation {} settled on a receipt other than the gateway's",
                            o.binding.key
                        ),
                    );
                }
            }
        }
    }
}

/// L3: every receipt a gateway holds is its own and within the binding; a gateway accepts a
/// key once; every effect that ran is covered by exactly one operation whose atoms are still
/// reserved, quarantined or forfeited, or committed by its receipt — or was forgotten only as
/// the horizons allow.
pub(super) fn l3_effects_covered(w: &World<'_>, f: &Facts<'_>, out: &mut Found) {
    for g in w.gateways {
        for (k, a) in g.log() {
            if a.accepted > 1 {
                out.bad(
                    "L3",
                    format!("{} accepted {} {} times", g.agent(), k.1, a.accepted),
                );
            }
            let crate::AcceptanceState::Done(r) = &a.state else {
                continue;
            };
            match w.keys.open(r, g.agent()) {
                Ok(body)
                    if body
                        .actual
                        .iter()
                        .all(|(d, n)| u128::from(n) <= vec_get(&a.binding.max_charge, d)) => {}
                Ok(_) => out.bad(
                    "L3",
                    format!(
                        "{} signed a receipt for {} above the binding's maximum",
                        g.agent(),
                        k.1
                    ),
                ),
                Err(_) => out.bad(
                    "L3",
                    format!("{} holds a receipt for {} it did not sign", g.agent(), k.1),
                ),
            }
        }
    }
    let mut instances: BTreeMap<(AgentId, AgentId, OpKey), u32> = BTreeMap::new();
    for e in w.effects {
        let at = (e.gateway.clone(), e.payer.clone(), e.key);
        let n = instances.entry(at.clone()).or_default();
        *n += 1;
        if *n == 2 {
            out.bad(
                "L3",
                format!(
                    "operation {} covers two effect instances at {}",
                    e.key, e.gateway
                ),
            );
        }
        match f.acceptances.get(&at) {
            None => forgotten_effect(f, e, out),
            Some(a) => accepted_effect(f, e, a, out),
        }
    }
}

/// An effect its gateway no longer has an acceptance for (pruned): only one whose permit
/// expired before the gateway's horizon may be gone, and the payer's operation must still
/// cover it — settled at its charge, or its escrow still held.
fn forgotten_effect(f: &Facts<'_>, e: &super::EffectInstance, out: &mut Found) {
    let horizon = f.horizons.get(&e.gateway).copied().unwrap_or(UnixMillis(0));
    let before = |x: Option<UnixMillis>| x.is_some_and(|x| x < horizon);
    let payer_key = (e.payer.clone(), e.key);
    let forgotten = match (f.ended.get(&payer_key), f.ops.get(&payer_key)) {
        (Some(s), _) => {
            before(s.expires)
                && s.receiver == e.gateway
                && matches!(&s.outcome, Ended::Settled { actual } if *actual == e.charge)
        }
        (None, Some((_, op))) => {
            before(op.binding.expires)
                && op.binding.receiver == e.gateway
                && match &op.state {
                    OpState::Settled { charged, .. } => charged.size() == e.charge,
                    // Its receipt never reached the payer: the escrow still holds the whole
                    // maximum (a query now gets `Forgotten`, never a proof).
                    OpState::Reserved | OpState::Quarantined | OpState::Forfeited { .. } => {
                        e.charge.le(&op.binding.max_charge)
                    }
                    OpState::NoEffect(_) | OpState::Released | OpState::Refunded => false,
                }
        }
        // Forgotten by both: the payer's checkpoint too, behind the horizon the gateway told
        // it — which must not pass what the gateway itself forgot.
        (None, None) => {
            let told = f
                .told
                .get(&(e.payer.clone(), e.gateway.clone()))
                .copied()
                .unwrap_or(UnixMillis(0));
            e.expires.is_some_and(|x| x < horizon && x < told)
        }
    };
    if forgotten {
        return;
    }
    let payer_has = match (f.ended.get(&payer_key), f.ops.get(&payer_key)) {
        (Some(s), _) => format!("folded, {:?}, expiring {:?}", s.outcome, s.expires),
        (None, Some((_, op))) => format!("{}, expiring {:?}", op.state.name(), op.binding.expires),
        (None, None) => "nothing".into(),
    };
    out.bad(
        "L3",
        format!(
            "effect {} at {} ran with no acceptance (horizon {horizon:?}; the payer has {payer_has})",
            e.key, e.gateway
        ),
    );
}

/// An effect its gateway accepted: the payer's operation (live or folded) must carry the
/// same binding and cover the charge.
fn accepted_effect(
    f: &Facts<'_>,
    e: &super::EffectInstance,
    a: &crate::Acceptance,
    out: &mut Found,
) {
    if let Some(ended) = f.ended.get(&(e.payer.clone(), e.key)) {
        // Folded by a checkpoint: the summary's binding digest and charge.
        let covered = ended.binding == a.binding.digest()
            && a.binding.payer == e.payer
            && matches!(&ended.outcome, Ended::Settled { actual } if *actual == e.charge);
        if !covered {
            out.bad(
                "L3",
                format!(
                    "effect {} (charge {:?}) is not covered: folded operation ended {:?}",
                    e.key, e.charge, ended.outcome
                ),
            );
        }
        return;
    }
    let Some((payer, op)) = f.ops.get(&(e.payer.clone(), e.key)) else {
        out.bad(
            "L3",
            format!(
                "effect {} at {} has no operation at any branch",
                e.key, e.gateway
            ),
        );
        return;
    };
    if op.binding != a.binding || *payer != &a.binding.payer {
        out.bad(
            "L3",
            format!(
                "effect {} ran under a binding its operation does not have",
                e.key
            ),
        );
    }
    let covered = match &op.state {
        OpState::Reserved | OpState::Quarantined | OpState::Forfeited { .. } => {
            e.charge.le(&op.binding.max_charge)
        }
        OpState::Settled { charged, .. } => charged.size() == e.charge,
        OpState::NoEffect(_) | OpState::Released | OpState::Refunded => false,
    };
    if !covered {
        out.bad(
            "L3",
            format!(
                "effect {} (charge {:?}) is not covered: operation is {:?}",
                e.key,
                e.charge,
                op.state.name()
            ),
        );
    }
}

/// L4: an operation's escrow is its whole maximum charge, in every dimension and no more;
/// per root, what is committed plus what is at risk stays within the budget.
pub(super) fn l4_escrow_and_budget(w: &World<'_>, f: &Facts<'_>, out: &mut Found) {
    for b in w.branches {
        let me = b.agent();
        for o in b.operations() {
            let dims: BTreeSet<&Dim> = o
                .footprint
                .iter()
                .map(|(d, _)| d)
                .chain(o.binding.max_charge.iter().map(|(d, _)| d))
                .collect();
            for d in dims {
                let escrow = o.footprint.dim(d).map_or(0, |r| size(r.ranges()));
                if escrow != vec_get(&o.binding.max_charge, d) {
                    out.bad(
                        "L4",
                        format!(
                            "{me}: operation {} holds {escrow} {d} in escrow for a maximum of {}",
                            o.binding.key,
                            o.binding.max_charge.get(d)
                        ),
                    );
                }
            }
        }
    }
    for (root, budget) in &f.budgets {
        for (d, n) in budget.iter() {
            let (committed, at_risk) = f
                .held
                .get(&(*root, d.clone()))
                .map_or((0, 0), |h| (h.committed, h.at_risk));
            if committed + at_risk > u128::from(n) {
                out.bad(
                    "L4",
                    format!("root {root} {d}: committed {committed} + at risk {at_risk} > {n}"),
                );
            }
        }
    }
}

/// L5: a transfer is taken only on a certificate that verifies (and on its source's signed
/// confirmation when it asks for one); no branch holds an atom that did not enter it; and
/// no sub-DAG holds or spends more than entered it from outside.
pub(super) fn l5_no_amplification(w: &World<'_>, f: &Facts<'_>, out: &mut Found) {
    for b in w.branches {
        for s in b.incoming() {
            let Step::Accept {
                cert,
                credit,
                confirmation,
                ..
            } = s
            else {
                continue;
            };
            let Ok(c) = cert.peek() else {
                out.bad(
                    "L5",
                    format!("{}: unreadable accepted certificate", b.agent()),
                );
                continue;
            };
            if w.keys.open(cert, &c.source).is_err() {
                out.bad(
                    "L5",
                    format!("{}: accepted a certificate that does not verify", b.agent()),
                );
            }
            // A certificate that asks for confirmation is taken only on the source's signed
            // confirmation of exactly this credit.
            if c.confirm && !confirms(w.keys, confirmation.as_ref(), &c, Some(*credit)) {
                out.bad(
                    "L5",
                    format!(
                        "{}: took transfer {} without its source's confirmation",
                        b.agent(),
                        c.transfer
                    ),
                );
            }
        }
    }
    for ((agent, root, d), ivs) in &f.held_by {
        let Ok(inner) = normalize(ivs.clone()) else {
            continue; // Reported as L1.
        };
        let outer = normalize_loose(
            f.ingress
                .get(&(agent.clone(), *root, d.clone()))
                .cloned()
                .unwrap_or_default(),
        );
        if !subset(&inner, &outer) {
            out.bad(
                "L5",
                format!("{agent} holds atoms of root {root} {d} beyond what was transferred to it"),
            );
        }
    }
    for b in w.branches {
        sub_dag_within_ingress(w, f, b.agent(), out);
    }
}

/// L5 per sub-DAG (the paper's descendant non-amplification): for `top` and every branch its
/// accepted transfers reach, together S, what S holds lies within what entered S from outside
/// it (grants held in S, transfers into S from branches outside S), and what S committed or
/// has at risk is no more than that.
fn sub_dag_within_ingress(w: &World<'_>, f: &Facts<'_>, top: &AgentId, out: &mut Found) {
    let mut sub: BTreeSet<&AgentId> = [top].into();
    let mut frontier = vec![top];
    while let Some(a) = frontier.pop() {
        for e in &f.edges {
            if &e.source == a && sub.insert(&e.destination) {
                frontier.push(&e.destination);
            }
        }
    }
    if sub.len() < 2 {
        return; // A single branch: the per-branch check.
    }
    let mut entered: BTreeMap<(RootId, Dim), Vec<Iv>> = BTreeMap::new();
    for b in w.branches.iter().filter(|b| sub.contains(b.agent())) {
        for g in b.roots() {
            for (d, n) in g.budget.iter() {
                entered.entry((g.root, d.clone())).or_default().push((0, n));
            }
        }
    }
    for e in &f.edges {
        if sub.contains(&e.destination) && !sub.contains(&e.source) {
            for (d, r) in e.footprint.iter() {
                entered
                    .entry((e.root, d.clone()))
                    .or_default()
                    .extend_from_slice(r.ranges());
            }
        }
    }
    let mut inside: BTreeMap<(RootId, Dim), (Vec<Iv>, u128)> = BTreeMap::new();
    for ((a, root, d), ivs) in &f.held_by {
        if sub.contains(a) {
            let e = inside.entry((*root, d.clone())).or_default();
            e.0.extend_from_slice(ivs);
            e.1 += f
                .risk_by
                .get(&(a.clone(), *root, d.clone()))
                .copied()
                .unwrap_or(0);
        }
    }
    for ((root, d), (ivs, risk)) in inside {
        let outer = normalize_loose(entered.get(&(root, d.clone())).cloned().unwrap_or_default());
        let within = normalize(ivs).is_ok_and(|inner| subset(&inner, &outer));
        if !within || risk > size(&outer) {
            out.bad(
                "L5",
                format!(
                    "the sub-DAG under {top} ({} branches) holds or spends atoms of root {root} {d} beyond what entered it (at risk or committed {risk}, entered {})",
                    sub.len(),
                    size(&outer)
                ),
            );
        }
    }
}

/// L6: atoms leave escrow or a transfer only on signed evidence that holds — a settlement on
/// its gateway's matching receipt, a return on a fence proof, a cancel on the destination's
/// refusal, a reclaim its certificate allows — and a dispatched operation is never released.
pub(super) fn l6_evidence(w: &World<'_>, out: &mut Found) {
    for b in w.branches {
        let me = b.agent();
        for e in b.ended() {
            match e.outcome {
                Ended::Released if e.dispatched => out.bad(
                    "L6",
                    format!("{me}: operation {} released after dispatch", e.key),
                ),
                Ended::Refunded => out.bad(
                    "L6",
                    format!(
                        "{me}: operation {} left quarantine for available without evidence",
                        e.key
                    ),
                ),
                _ => {}
            }
        }
        for o in b.outgoing() {
            let holds = match &o.state {
                OutgoingState::Reclaimed(r) => {
                    o.body.confirm && confirms(w.keys, Some(r), &o.body, None)
                }
                OutgoingState::Cancelled(d) => {
                    matches!(w.keys.open(d, &o.body.destination), Ok(d) if d.credit.is_none())
                }
                _ => continue,
            };
            if !holds {
                let why = match o.state {
                    OutgoingState::Reclaimed(_) => {
                        "taken back without a reclaim its certificate allows"
                    }
                    _ => "cancelled without the destination's signed refusal",
                };
                out.bad("L6", format!("{me}: transfer {} {why}", o.body.transfer));
            }
        }
        for o in b.operations() {
            let key = o.binding.key;
            let broken = match &o.state {
                OpState::Reserved | OpState::Quarantined | OpState::Forfeited { .. } => None,
                OpState::Settled { charged, receipt } => {
                    let holds = matches!(
                        w.keys.open(receipt, &o.binding.receiver),
                        Ok(r) if r.key == key
                            && r.binding == o.binding.digest()
                            && r.actual == charged.size()
                            && r.actual.le(&o.binding.max_charge)
                    );
                    (!holds).then_some("settled on a receipt that does not match")
                }
                OpState::NoEffect(proof) => {
                    let holds = matches!(
                        w.keys.open(proof, &o.binding.receiver),
                        Ok(p) if p.key == key
                            && p.binding == o.binding.digest()
                            && p.fence > o.binding.epoch
                    );
                    (!holds).then_some("returned on a proof that does not hold")
                }
                OpState::Released => o.dispatched.then_some("released after dispatch"),
                OpState::Refunded => Some("left quarantine for available without evidence"),
            };
            if let Some(why) = broken {
                out.bad("L6", format!("{me}: operation {key} {why}"));
            }
        }
    }
}

/// L7: every acceptance is paid from its payer's own escrow: a live operation with the same
/// binding whose atoms entered the payer, or a folded one with the same binding digest.
pub(super) fn l7_paid_from_own_escrow(w: &World<'_>, f: &Facts<'_>, out: &mut Found) {
    for g in w.gateways {
        for (pk, a) in g.log() {
            let k = pk.1;
            if let Some(e) = f.ended.get(pk) {
                // Folded: the atoms it was paid with are not kept; the binding must match.
                if e.binding != a.binding.digest() || e.receiver != *g.agent() {
                    out.bad(
                        "L7",
                        format!(
                            "{} accepted {k} under a binding its payer's folded operation does not have",
                            g.agent()
                        ),
                    );
                }
                continue;
            }
            match f.ops.get(pk) {
                Some((payer, op)) if *payer == &a.binding.payer && op.binding == a.binding => {
                    for (d, r) in op.footprint.iter() {
                        let entered = f
                            .ingress
                            .get(&((*payer).clone(), op.binding.root, d.clone()))
                            .cloned()
                            .unwrap_or_default();
                        if !subset(r.ranges(), &normalize_loose(entered)) {
                            out.bad(
                                "L7",
                                format!(
                                    "{} accepted {k} paid with atoms {} never held",
                                    g.agent(),
                                    payer
                                ),
                            );
                        }
                    }
                }
                _ => out.bad(
                    "L7",
                    format!(
                        "{} accepted {k} with no matching operation at its payer",
                        g.agent()
                    ),
                ),
            }
        }
    }
}

/// Whether `d` is `cert`'s source's signed decision on exactly that certificate, naming
/// `credit` (a confirmation) or none (a reclaim).
pub(super) fn confirms(
    keys: &crate::Keyring,
    d: Option<&Signed<crate::SourceDecision>>,
    cert: &crate::TransferCert,
    credit: Option<CreditId>,
) -> bool {
    let Some(Ok(d)) = d.map(|d| keys.open(d, &cert.source)) else {
        return false;
    };
    d.root == cert.root
        && d.transfer == cert.transfer
        && d.cert == cert.digest()
        && d.source == cert.source
        && d.destination == cert.destination
        && d.credit == credit
}
