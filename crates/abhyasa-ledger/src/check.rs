//! The conservation checker, L1–L7 of docs/DESIGN.md ("The ledger: the rules").
//!
//! It is written apart from the ledger's transitions: it reads what the branches and
//! gateways hold durably (through their read accessors) and the effects that actually ran,
//! and recomputes everything with its own interval arithmetic on raw atom ranges — never
//! with the ledger's own `take`, `union` or `subtract`, so a bug there cannot hide itself.
//! Signed evidence is verified again with the keyring.

use std::collections::BTreeMap;
use std::fmt;

use abhyasa_wire::ledger::*;
use abhyasa_wire::AgentId;

use crate::{Branch, Ended, Gateway, GatewayRecord, Keyring, OpState, OutgoingState, Step};
mod audit;
pub use audit::{audit, audit_gateway};

/// One effect that really happened at a gateway (the executor's own record).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct EffectInstance {
    /// Where it ran.
    pub gateway: AgentId,
    /// Whose operation it ran for (keys are scoped per payer).
    pub payer: AgentId,
    /// The operation key it ran under.
    pub key: OpKey,
    /// What it charged.
    pub charge: Vector,
    /// When its permit expired, as the gateway told the executor ([`Execute::expires`]);
    /// `None` when it had none or the record does not say. Only an effect whose permit
    /// expired may have every record of it forgotten (its gateway's and its payer's).
    ///
    /// [`Execute::expires`]: crate::Execute::expires
    pub expires: Option<abhyasa_wire::UnixMillis>,
}

/// A broken invariant.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Violation {
    /// Which: `L1` … `L7`.
    pub law: &'static str,
    /// What was found.
    pub detail: String,
}

impl fmt::Display for Violation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.law, self.detail)
    }
}

/// Everything the checker reads.
pub struct World<'a> {
    /// Every branch's durable state.
    pub branches: &'a [&'a Branch],
    /// Every gateway's durable state.
    pub gateways: &'a [&'a Gateway],
    /// Every effect that ran.
    pub effects: &'a [EffectInstance],
    /// Keys of issuers, branches and gateways.
    pub keys: &'a Keyring,
}

type Iv = (u64, u64);

fn size(ivs: &[Iv]) -> u128 {
    ivs.iter()
        .map(|&(s, e)| u128::from(e.saturating_sub(s)))
        .sum()
}

/// Sorted and merged; `Err(atom)` names an atom found twice.
fn normalize(mut ivs: Vec<Iv>) -> Result<Vec<Iv>, u64> {
    ivs.sort_unstable();
    let mut out: Vec<Iv> = Vec::new();
    for (s, e) in ivs {
        if s >= e {
            continue;
        }
        match out.last_mut() {
            Some(last) if s < last.1 => return Err(s),
            Some(last) if s == last.1 => last.1 = e,
            _ => out.push((s, e)),
        }
    }
    Ok(out)
}

/// Whether every atom of `inner` is in `outer` (both normalized).
fn subset(inner: &[Iv], outer: &[Iv]) -> bool {
    inner
        .iter()
        .all(|&(s, e)| outer.iter().any(|&(os, oe)| os <= s && e <= oe))
}

fn vec_get(v: &Vector, d: &Dim) -> u128 {
    u128::from(v.get(d))
}

/// Runs every check; returns what is broken (empty when all hold).
pub fn check(w: &World<'_>) -> Vec<Violation> {
    let mut v = Vec::new();
    let mut bad = |law: &'static str, detail: String| v.push(Violation { law, detail });

    // Root budgets, from the grants their holders keep (issuer signature verified again).
    let mut budgets: BTreeMap<RootId, (AgentId, Vector)> = BTreeMap::new();
    for b in w.branches {
        for g in b.roots() {
            budgets.insert(g.root, (b.agent().clone(), g.budget.clone()));
        }
    }
    // Destination decisions, keyed by (root, transfer).
    let mut accepted_at: BTreeMap<(RootId, TransferId), Vec<AgentId>> = BTreeMap::new();
    // Ingress per branch and root: atoms that entered it (grant or accepted transfers).
    let mut ingress: BTreeMap<(AgentId, RootId, Dim), Vec<Iv>> = BTreeMap::new();
    // Accepted transfers as edges of the delegation DAG: (source, destination, root, atoms).
    let mut edges: Vec<(AgentId, AgentId, RootId, Footprint)> = Vec::new();
    for b in w.branches {
        for g in b.roots() {
            for (d, n) in g.budget.iter() {
                ingress
                    .entry((b.agent().clone(), g.root, d.clone()))
                    .or_default()
                    .push((0, n));
            }
        }
        for s in b.incoming() {
            if let Step::Accept {
                cert,
                credit,
                confirmation,
                ..
            } = s
            {
                let Ok(c) = cert.peek() else {
                    bad(
                        "L5",
                        format!("{}: unreadable accepted certificate", b.agent()),
                    );
                    continue;
                };
                if w.keys.open(cert, &c.source).is_err() {
                    bad(
                        "L5",
                        format!("{}: accepted a certificate that does not verify", b.agent()),
                    );
                }
                // A certificate that asks for confirmation is taken only on the source's
                // signed confirmation of exactly this credit.
                if c.confirm && !confirms(w.keys, confirmation.as_ref(), &c, Some(*credit)) {
                    bad(
                        "L5",
                        format!(
                            "{}: took transfer {} without its source's confirmation",
                            b.agent(),
                            c.transfer
                        ),
                    );
                }
                accepted_at
                    .entry((c.root, c.transfer))
                    .or_default()
                    .push(b.agent().clone());
                edges.push((
                    c.source.clone(),
                    b.agent().clone(),
                    c.root,
                    c.footprint.clone(),
                ));
                for (d, r) in c.footprint.iter() {
                    ingress
                        .entry((b.agent().clone(), c.root, d.clone()))
                        .or_default()
                        .extend_from_slice(r.ranges());
                }
            }
        }
    }

    // Everything each branch holds, per root and dimension, by bucket.
    #[derive(Default)]
    struct Held {
        all: Vec<Iv>,
        committed: u128,
        at_risk: u128,
    }
    let mut held: BTreeMap<(RootId, Dim), Held> = BTreeMap::new();
    let mut held_by: BTreeMap<(AgentId, RootId, Dim), Vec<Iv>> = BTreeMap::new();
    // Committed plus maximum at risk, per branch.
    let mut risk_by: BTreeMap<(AgentId, RootId, Dim), u128> = BTreeMap::new();
    let mut settled_keys: BTreeMap<(AgentId, OpKey), u32> = BTreeMap::new();
    for b in w.branches {
        let me = b.agent().clone();
        let mut put = |root: RootId, f: &Footprint, kind: u8, max: Option<&Vector>| {
            for (d, r) in f.iter() {
                let h = held.entry((root, d.clone())).or_default();
                h.all.extend_from_slice(r.ranges());
                let risk = match kind {
                    1 => size(r.ranges()),
                    2 => max.map_or(size(r.ranges()), |m| vec_get(m, d)),
                    _ => 0,
                };
                match kind {
                    1 => h.committed += risk,
                    2 => h.at_risk += risk,
                    _ => {}
                }
                *risk_by.entry((me.clone(), root, d.clone())).or_default() += risk;
                held_by
                    .entry((me.clone(), root, d.clone()))
                    .or_default()
                    .extend_from_slice(r.ranges());
            }
        };
        for c in b.credits() {
            put(c.root, &c.available, 0, None);
            // A closed credit (joined or reissued) is in no bucket: atoms there are stranded.
            if c.closed && !c.available.is_empty() {
                bad(
                    "L1",
                    format!(
                        "{me}: closed credit {} holds atoms, in no bucket: {:?}",
                        c.id,
                        c.available.size()
                    ),
                );
            }
        }
        // Folded by a checkpoint: committed atoms per root, and what each ended op was.
        for (root, f) in b.committed() {
            put(*root, f, 1, None);
        }
        for e in b.ended() {
            match e.outcome {
                Ended::Settled { .. } => {
                    *settled_keys.entry((me.clone(), e.key)).or_default() += 1;
                }
                Ended::Released if e.dispatched => bad(
                    "L6",
                    format!("{me}: operation {} released after dispatch", e.key),
                ),
                Ended::Refunded => bad(
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
            // In transit: sealed, or confirmed and not yet taken by the destination (the
            // confirmation is on its way).
            let moving = match o.state {
                OutgoingState::Sealed => true,
                OutgoingState::Accepted(_) => o.body.confirm,
                _ => false,
            };
            if moving && !accepted_at.contains_key(&(o.body.root, o.body.transfer)) {
                put(o.body.root, &o.body.footprint, 0, None);
            }
            if let OutgoingState::Reclaimed(r) = &o.state {
                if !o.body.confirm || !confirms(w.keys, Some(r), &o.body, None) {
                    bad(
                        "L6",
                        format!(
                            "{me}: transfer {} taken back without a reclaim its certificate allows",
                            o.body.transfer
                        ),
                    );
                }
                if accepted_at.contains_key(&(o.body.root, o.body.transfer)) {
                    bad("L1", format!("{me}: transfer {} reclaimed at the source but accepted at the destination", o.body.transfer));
                }
            }
            if let OutgoingState::Cancelled(d) = &o.state {
                match w.keys.open(d, &o.body.destination) {
                    Ok(d) if d.credit.is_none() => {}
                    _ => bad(
                        "L6",
                        format!(
                            "{me}: transfer {} cancelled without the destination's signed refusal",
                            o.body.transfer
                        ),
                    ),
                }
                if accepted_at.contains_key(&(o.body.root, o.body.transfer)) {
                    bad("L1", format!("{me}: transfer {} cancelled at the source but accepted at the destination", o.body.transfer));
                }
            }
        }
        for o in b.operations() {
            let root = o.binding.root;
            // L4: the escrow is the whole maximum charge, in every dimension and no more.
            let dims: std::collections::BTreeSet<&Dim> = o
                .footprint
                .iter()
                .map(|(d, _)| d)
                .chain(o.binding.max_charge.iter().map(|(d, _)| d))
                .collect();
            for d in dims {
                let escrow = o.footprint.dim(d).map_or(0, |r| size(r.ranges()));
                if escrow != vec_get(&o.binding.max_charge, d) {
                    bad(
                        "L4",
                        format!(
                            "{me}: operation {} holds {escrow} {d} in escrow for a maximum of {}",
                            o.binding.key,
                            o.binding.max_charge.get(d)
                        ),
                    );
                }
            }
            match &o.state {
                OpState::Reserved | OpState::Quarantined => {
                    put(root, &o.footprint, 2, Some(&o.binding.max_charge))
                }
                OpState::Forfeited { .. } => {
                    put(root, &o.footprint, 2, Some(&o.binding.max_charge))
                }
                OpState::Settled { charged, receipt } => {
                    put(root, charged, 1, None);
                    *settled_keys
                        .entry((o.binding.payer.clone(), o.binding.key))
                        .or_default() += 1;
                    match w.keys.open(receipt, &o.binding.receiver) {
                        Ok(r)
                            if r.key == o.binding.key
                                && r.binding == o.binding.digest()
                                && r.actual == charged.size()
                                && r.actual.le(&o.binding.max_charge) => {}
                        _ => bad(
                            "L6",
                            format!(
                                "{me}: operation {} settled on a receipt that does not match",
                                o.binding.key
                            ),
                        ),
                    }
                }
                OpState::NoEffect(proof) => match w.keys.open(proof, &o.binding.receiver) {
                    Ok(p)
                        if p.key == o.binding.key
                            && p.binding == o.binding.digest()
                            && p.fence > o.binding.epoch => {}
                    _ => bad(
                        "L6",
                        format!(
                            "{me}: operation {} returned on a proof that does not hold",
                            o.binding.key
                        ),
                    ),
                },
                OpState::Released => {
                    if o.dispatched {
                        bad(
                            "L6",
                            format!("{me}: operation {} released after dispatch", o.binding.key),
                        );
                    }
                }
                OpState::Refunded => bad(
                    "L6",
                    format!(
                        "{me}: operation {} left quarantine for available without evidence",
                        o.binding.key
                    ),
                ),
            }
        }
    }

    // L1: exact partition of each root's atoms; L4: committed + at risk ≤ B.
    for (root, (_, budget)) in &budgets {
        for (d, n) in budget.iter() {
            let h = held.remove(&(*root, d.clone())).unwrap_or_default();
            let total = size(&h.all);
            match normalize(h.all) {
                Err(atom) => bad("L1", format!("root {root} {d}: atom {atom} is owned twice")),
                Ok(ivs) => {
                    if ivs != [(0, n)] {
                        bad("L1", format!("root {root} {d}: atoms owned {ivs:?} (total {total}) are not exactly [0, {n})"));
                    }
                }
            }
            if h.committed + h.at_risk > u128::from(n) {
                bad(
                    "L4",
                    format!(
                        "root {root} {d}: committed {} + at risk {} > {n}",
                        h.committed, h.at_risk
                    ),
                );
            }
        }
    }
    for ((root, d), h) in held {
        if !h.all.is_empty() {
            bad(
                "L1",
                format!("root {root} {d}: atoms held outside any granted budget"),
            );
        }
    }

    // L2: one settlement per key, agreeing with the gateway's receipt.
    for ((_, key), n) in &settled_keys {
        if *n > 1 {
            bad("L2", format!("operation {key} settled {n} times"));
        }
    }
    let mut receipts: BTreeMap<(AgentId, OpKey), Signed<Receipt>> = BTreeMap::new();
    for g in w.gateways {
        for (k, a) in g.log() {
            if let crate::AcceptanceState::Done(r) = &a.state {
                // A gateway's receipt never charges more than the binding it accepted.
                match w.keys.open(r, g.agent()) {
                    Ok(body)
                        if body
                            .actual
                            .iter()
                            .all(|(d, n)| u128::from(n) <= vec_get(&a.binding.max_charge, d)) => {}
                    Ok(_) => bad(
                        "L3",
                        format!(
                            "{} signed a receipt for {} above the binding's maximum",
                            g.agent(),
                            k.1
                        ),
                    ),
                    Err(_) => bad(
                        "L3",
                        format!("{} holds a receipt for {} it did not sign", g.agent(), k.1),
                    ),
                }
                receipts.insert(k.clone(), r.clone());
            }
        }
    }
    for b in w.branches {
        for o in b.operations() {
            if let OpState::Settled { receipt, .. } = &o.state {
                let k = (o.binding.payer.clone(), o.binding.key);
                if receipts.get(&k).is_some_and(|r| r != receipt) {
                    bad(
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

    // L3: every effect that ran is covered by exactly one operation whose atoms are still
    // reserved, quarantined or forfeited, or committed by its receipt; one instance per key.
    let mut instances: BTreeMap<(AgentId, AgentId, OpKey), u32> = BTreeMap::new();
    // Operations by (payer, key): keys are scoped per payer.
    let ops: BTreeMap<(AgentId, OpKey), (&AgentId, &crate::Operation)> = w
        .branches
        .iter()
        .flat_map(|b| {
            b.operations()
                .map(move |o| ((b.agent().clone(), o.binding.key), (b.agent(), o)))
        })
        .collect();
    let horizons: BTreeMap<AgentId, abhyasa_wire::UnixMillis> = w
        .gateways
        .iter()
        .map(|g| (g.agent().clone(), g.horizon()))
        .collect();
    // The horizons gateways told each payer, by (payer, gateway).
    let told: BTreeMap<(AgentId, AgentId), abhyasa_wire::UnixMillis> = w
        .branches
        .iter()
        .flat_map(|b| {
            b.horizons()
                .map(move |(g, h)| ((b.agent().clone(), g.clone()), *h))
        })
        .collect();
    // Operations checkpoints folded, by (payer, key).
    let ended: BTreeMap<(AgentId, OpKey), &crate::EndedOp> = w
        .branches
        .iter()
        .flat_map(|b| b.ended().map(move |e| ((b.agent().clone(), e.key), e)))
        .collect();
    let acceptances: BTreeMap<(AgentId, AgentId, OpKey), &crate::Acceptance> = w
        .gateways
        .iter()
        .flat_map(|g| {
            g.log()
                .map(move |((p, k), a)| ((g.agent().clone(), p.clone(), *k), a))
        })
        .collect();
    for e in w.effects {
        let at = (e.gateway.clone(), e.payer.clone(), e.key);
        let n = instances.entry(at.clone()).or_default();
        *n += 1;
        if *n == 2 {
            bad(
                "L3",
                format!(
                    "operation {} covers two effect instances at {}",
                    e.key, e.gateway
                ),
            );
        }
        let Some(a) = acceptances.get(&at) else {
            // Forgotten by the gateway (pruned): only an acceptance whose permit expired
            // before the gateway's horizon may be gone, and the payer's operation must still
            // cover the instance — settled at its charge, or its escrow still held.
            let horizon = horizons
                .get(&e.gateway)
                .copied()
                .unwrap_or(abhyasa_wire::UnixMillis(0));
            let before = |x: Option<abhyasa_wire::UnixMillis>| x.is_some_and(|x| x < horizon);
            let payer_key = (e.payer.clone(), e.key);
            let forgotten = match (ended.get(&payer_key), ops.get(&payer_key)) {
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
                            // Its receipt never reached the payer: the escrow still holds
                            // the whole maximum (a query now gets `Forgotten`, never a proof).
                            OpState::Reserved
                            | OpState::Quarantined
                            | OpState::Forfeited { .. } => e.charge.le(&op.binding.max_charge),
                            OpState::NoEffect(_) | OpState::Released | OpState::Refunded => false,
                        }
                }
                // Forgotten by both: the payer's checkpoint too, behind the horizon the
                // gateway told it — which must not pass what the gateway itself forgot.
                (None, None) => {
                    let told = told
                        .get(&(e.payer.clone(), e.gateway.clone()))
                        .copied()
                        .unwrap_or(abhyasa_wire::UnixMillis(0));
                    e.expires.is_some_and(|x| x < horizon && x < told)
                }
            };
            if !forgotten {
                let payer_has = match (ended.get(&payer_key), ops.get(&payer_key)) {
                    (Some(s), _) => format!("folded, {:?}, expiring {:?}", s.outcome, s.expires),
                    (None, Some((_, op))) => {
                        format!("{}, expiring {:?}", op.state.name(), op.binding.expires)
                    }
                    (None, None) => "nothing".into(),
                };
                bad(
                    "L3",
                    format!(
                        "effect {} at {} ran with no acceptance (horizon {horizon:?}; the payer has {payer_has})",
                        e.key, e.gateway
                    ),
                );
            }
            continue;
        };
        if let Some(ended) = ended.get(&(e.payer.clone(), e.key)) {
            // Folded by a checkpoint: the summary's binding digest and charge.
            let covered = ended.binding == a.binding.digest()
                && a.binding.payer == e.payer
                && matches!(&ended.outcome, Ended::Settled { actual } if *actual == e.charge);
            if !covered {
                bad(
                    "L3",
                    format!(
                        "effect {} (charge {:?}) is not covered: folded operation ended {:?}",
                        e.key, e.charge, ended.outcome
                    ),
                );
            }
            continue;
        }
        let Some((payer, op)) = ops.get(&(e.payer.clone(), e.key)) else {
            bad(
                "L3",
                format!(
                    "effect {} at {} has no operation at any branch",
                    e.key, e.gateway
                ),
            );
            continue;
        };
        if op.binding != a.binding || *payer != &a.binding.payer {
            bad(
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
            bad(
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

    // L5: no branch holds an atom that did not enter it.
    for ((agent, root, d), ivs) in &held_by {
        let Ok(inner) = normalize(ivs.clone()) else {
            continue; // Reported as L1.
        };
        let outer = normalize_loose(
            ingress
                .get(&(agent.clone(), *root, d.clone()))
                .cloned()
                .unwrap_or_default(),
        );
        if !subset(&inner, &outer) {
            bad(
                "L5",
                format!("{agent} holds atoms of root {root} {d} beyond what was transferred to it"),
            );
        }
    }

    // L5 per sub-DAG (the paper's descendant non-amplification): for each branch and every
    // branch its accepted transfers reach, together S, what S holds lies within what entered
    // S from outside it (grants held in S, transfers into S from branches outside S), and
    // what S committed or has at risk is no more than that.
    let agents: Vec<AgentId> = w.branches.iter().map(|b| b.agent().clone()).collect();
    for top in &agents {
        let mut sub: std::collections::BTreeSet<&AgentId> = [top].into();
        let mut frontier = vec![top];
        while let Some(a) = frontier.pop() {
            for (src, dst, _, _) in &edges {
                if src == a && sub.insert(dst) {
                    frontier.push(dst);
                }
            }
        }
        if sub.len() < 2 {
            continue; // A single branch: the per-branch check above.
        }
        let mut entered: BTreeMap<(RootId, Dim), Vec<Iv>> = BTreeMap::new();
        for b in w.branches.iter().filter(|b| sub.contains(b.agent())) {
            for g in b.roots() {
                for (d, n) in g.budget.iter() {
                    entered.entry((g.root, d.clone())).or_default().push((0, n));
                }
            }
        }
        for (src, dst, root, fp) in &edges {
            if sub.contains(dst) && !sub.contains(src) {
                for (d, r) in fp.iter() {
                    entered
                        .entry((*root, d.clone()))
                        .or_default()
                        .extend_from_slice(r.ranges());
                }
            }
        }
        let mut inside: BTreeMap<(RootId, Dim), (Vec<Iv>, u128)> = BTreeMap::new();
        for ((a, root, d), ivs) in &held_by {
            if sub.contains(a) {
                let e = inside.entry((*root, d.clone())).or_default();
                e.0.extend_from_slice(ivs);
                e.1 += risk_by
                    .get(&(a.clone(), *root, d.clone()))
                    .copied()
                    .unwrap_or(0);
            }
        }
        for ((root, d), (ivs, risk)) in inside {
            let outer =
                normalize_loose(entered.get(&(root, d.clone())).cloned().unwrap_or_default());
            let within = normalize(ivs).is_ok_and(|inner| subset(&inner, &outer));
            if !within || risk > size(&outer) {
                bad(
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

    // L7: every acceptance is paid from the payer's own escrow.
    for g in w.gateways {
        for (pk, a) in g.log() {
            let k = pk.1;
            if let Some(e) = ended.get(pk) {
                // Folded: the atoms it was paid with are not kept; the binding must match.
                if e.binding != a.binding.digest() || e.receiver != *g.agent() {
                    bad(
                        "L7",
                        format!(
                            "{} accepted {k} under a binding its payer's folded operation does not have",
                            g.agent()
                        ),
                    );
                }
            } else {
                match ops.get(pk) {
                    Some((payer, op)) if *payer == &a.binding.payer && op.binding == a.binding => {
                        for (d, r) in op.footprint.iter() {
                            let entered = ingress
                                .get(&((*payer).clone(), op.binding.root, d.clone()))
                                .cloned()
                                .unwrap_or_default();
                            let entered = normalize_loose(entered);
                            if !subset(r.ranges(), &entered) {
                                bad(
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
                    _ => bad(
                        "L7",
                        format!(
                            "{} accepted {k} with no matching operation at its payer",
                            g.agent()
                        ),
                    ),
                }
            }
            if a.accepted > 1 {
                bad(
                    "L3",
                    format!("{} accepted {k} {} times", g.agent(), a.accepted),
                );
            }
        }
    }
    v
}

/// Whether `d` is `cert`'s source's signed decision on exactly that certificate, naming
/// `credit` (a confirmation) or none (a reclaim).
fn confirms(
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

/// Sorted and merged, overlaps allowed (ingress may repeat an atom that left and came back).
fn normalize_loose(mut v: Vec<Iv>) -> Vec<Iv> {
    v.sort_unstable();
    let mut m: Vec<Iv> = Vec::new();
    for (s, e) in v {
        match m.last_mut() {
            Some(l) if s <= l.1 => l.1 = l.1.max(e),
            _ => m.push((s, e)),
        }
    }
    m
}
