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

/// Audits one branch's journal, step by step, with its own bookkeeping (never the branch's
/// `apply`): what the final state cannot show — the order in which things happened.
///
/// - `H1` labels attenuate: a split's label lies within its parent's, a sealed transfer's
///   within its source credit's, a reservation's purpose within its credit's label (a join's
///   output takes the inputs' common lower bound, computed here);
/// - `H2` forfeiture is absorbing: after `Forfeit`, only an `Annotate` of the same key;
/// - `H3` a dispatched reservation is never released, and an operation ends once
///   (settled, no-effect, released or refunded: at most one of them, only after a reserve);
/// - `H4` epochs only rise per credit;
/// - `H5` a transfer is decided once, and cancelled only on its destination's signed
///   refusal bound to the certificate; one whose certificate asks for confirmation is taken
///   only with its source's signed confirmation of that credit, and reclaimed only by its
///   source, with a signed reclaim, before any decision;
/// - `H6` committed atoms lie inside the operation's footprint: a settlement charges at
///   most the binding's maximum;
/// - `H7` a generation closes once, with nothing in progress: a reissue only of a credit
///   whose every operation has ended (the fused one in the same step, and only when the
///   credit was fenced above that operation's epoch) and none of whose transfers is
///   undecided, into a credit that did not exist, with the same label; a closed credit
///   (reissued or joined) takes no work again;
/// - `H8` a fenced generation takes no new work: no split, transfer, reservation or join
///   from it after its `Fenced` step;
/// - `H9` a checkpoint is signed by the branch; first in the journal it is the state the
///   audit starts from; after other steps it must agree with them — every operation in the
///   same state (open, dispatched, forfeited, ended) and the same credits closed; an ended
///   operation may be missing only if its permit expired before the horizon the checkpoint
///   names for its gateway.
pub fn audit(agent: &AgentId, steps: &[Step], keys: &Keyring) -> Vec<Violation> {
    use std::collections::{BTreeMap as Map, BTreeSet};

    #[derive(Clone, Copy, PartialEq, Eq, Debug)]
    enum Op {
        Reserved,
        Dispatched,
        Forfeited,
        Ended,
    }
    let mut v = Vec::new();
    let mut bad = |law: &'static str, detail: String| {
        v.push(Violation {
            law,
            detail: format!("{agent}: {detail}"),
        })
    };
    let mut labels: Map<CreditId, BTreeSet<Dim>> = Map::new();
    let mut ops: Map<OpKey, (Op, Vector)> = Map::new();
    let mut epochs: Map<CreditId, u64> = Map::new();
    let mut sealed: Map<TransferId, TransferCert> = Map::new();
    let mut decided: BTreeSet<TransferId> = BTreeSet::new();
    // Each operation's credit and the epoch its permit is bound to.
    let mut op_credit: Map<OpKey, (CreditId, u64)> = Map::new();
    // Each operation's gateway and its permit's expiry: a checkpoint may forget an ended
    // one only behind that gateway's horizon.
    let mut op_at: Map<OpKey, (AgentId, Option<abhyasa_wire::UnixMillis>)> = Map::new();
    let mut closed: BTreeSet<CreditId> = BTreeSet::new();
    let mut fenced_credits: BTreeSet<CreditId> = BTreeSet::new();
    // A fused reissue ends its last operation first, in the same step.
    let flat = steps.iter().enumerate().flat_map(|(i, s)| {
        let inner = match s {
            Step::Reissue { last: Some(l), .. } => Some((i, &**l)),
            _ => None,
        };
        inner.into_iter().chain(std::iter::once((i, s)))
    });
    for (i, s) in flat {
        // New work names the credits it draws on: none may be closed (H7) or fenced (H8).
        let drawn: Vec<CreditId> = match s {
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
        };
        for c in &drawn {
            if closed.contains(c) {
                bad(
                    "H7",
                    format!("step {i}: new work drawn on closed credit {c}"),
                );
            } else if fenced_credits.contains(c) {
                bad(
                    "H8",
                    format!("step {i}: new work drawn on fenced credit {c}"),
                );
            }
        }
        match s {
            Step::Grant { grant, credit } => {
                if let Ok(g) = grant.peek() {
                    labels.insert(*credit, g.label.0.clone());
                }
            }
            Step::Split {
                parent,
                child,
                label,
                ..
            } => {
                match labels.get(parent) {
                    Some(p) if label.0.is_subset(p) => {}
                    Some(p) => bad(
                        "H1",
                        format!("step {i}: split {child} widens {p:?} to {:?}", label.0),
                    ),
                    None => bad("H1", format!("step {i}: split of unknown credit {parent}")),
                }
                labels.insert(*child, label.0.clone());
            }
            Step::Accept {
                cert,
                credit,
                confirmation,
                ..
            } => {
                if let Ok(c) = cert.peek() {
                    if c.confirm && !confirms(keys, confirmation.as_ref(), &c, Some(*credit)) {
                        bad(
                            "H5",
                            format!(
                                "step {i}: transfer {} taken without its source's confirmation",
                                c.transfer
                            ),
                        );
                    }
                    labels.insert(*credit, c.label.0.clone());
                }
            }
            Step::Claim { .. } | Step::Reclaimed { .. } => {}
            Step::Reclaim { decision } => {
                let Ok(d) = decision.peek() else { continue };
                if !decided.insert(d.transfer) {
                    bad(
                        "H5",
                        format!("step {i}: transfer {} decided twice", d.transfer),
                    );
                }
                let ok = sealed.get(&d.transfer).is_some_and(|c| {
                    c.confirm && &c.source == agent && confirms(keys, Some(decision), c, None)
                });
                if !ok {
                    bad(
                        "H5",
                        format!(
                            "step {i}: transfer {} reclaimed without a reclaim its certificate allows",
                            d.transfer
                        ),
                    );
                }
            }
            Step::Join { inputs, output } => {
                let mut common: Option<BTreeSet<Dim>> = None;
                for c in inputs {
                    let l = labels.get(c).cloned().unwrap_or_default();
                    common = Some(match common {
                        None => l,
                        Some(x) => x.intersection(&l).cloned().collect(),
                    });
                }
                labels.insert(*output, common.unwrap_or_default());
                closed.extend(inputs.iter().copied());
            }
            Step::Seal { cert } => {
                let Ok(c) = cert.peek() else { continue };
                match labels.get(&c.source_credit) {
                    Some(p) if c.label.0.is_subset(p) => {}
                    _ => bad(
                        "H1",
                        format!(
                            "step {i}: transfer {} not within its source's label",
                            c.transfer
                        ),
                    ),
                }
                sealed.insert(c.transfer, c);
            }
            Step::Decided { decision } => {
                let Ok(d) = decision.peek() else { continue };
                if !decided.insert(d.transfer) {
                    bad(
                        "H5",
                        format!("step {i}: transfer {} decided twice", d.transfer),
                    );
                }
                let Some(c) = sealed.get(&d.transfer) else {
                    bad(
                        "H5",
                        format!("step {i}: decision on unsealed transfer {}", d.transfer),
                    );
                    continue;
                };
                let signed_by_destination = keys.open(decision, &c.destination).is_ok();
                let bound = d.cert == c.digest() && d.source == c.source;
                if !(signed_by_destination && bound) {
                    bad(
                        "H5",
                        format!(
                            "step {i}: transfer {} decided without the destination's bound signature",
                            d.transfer
                        ),
                    );
                }
            }
            Step::Reserve { permit, effect } => {
                let Ok(p) = permit.peek() else { continue };
                let allowed = labels
                    .get(&p.binding.credit)
                    .is_some_and(|l| l.contains(&effect.purpose));
                if !allowed {
                    bad(
                        "H1",
                        format!("step {i}: operation {} reserved for a purpose its credit does not allow", p.binding.key),
                    );
                }
                ops.insert(p.binding.key, (Op::Reserved, p.binding.max_charge.clone()));
                op_credit.insert(p.binding.key, (p.binding.credit, p.binding.epoch));
                op_at.insert(
                    p.binding.key,
                    (p.binding.receiver.clone(), p.binding.expires),
                );
            }
            Step::Dispatch { key } => match ops.get_mut(key) {
                Some((st @ Op::Reserved, _)) => *st = Op::Dispatched,
                other => bad(
                    "H3",
                    format!("step {i}: dispatch of {key} in {:?}", other.map(|o| o.0)),
                ),
            },
            Step::ReleaseUnsent { key } => match ops.get_mut(key) {
                Some((st @ Op::Reserved, _)) => *st = Op::Ended,
                other => bad(
                    "H3",
                    format!("step {i}: release of {key} in {:?}", other.map(|o| o.0)),
                ),
            },
            Step::Settle { key, receipt } => {
                let actual = receipt.peek().map(|r| r.actual).ok();
                match ops.get_mut(key) {
                    Some((st @ Op::Dispatched, max)) => {
                        if actual.as_ref().is_none_or(|a| !a.le(max)) {
                            bad("H6", format!("step {i}: {key} settled above its maximum"));
                        }
                        *st = Op::Ended;
                    }
                    Some((Op::Forfeited, _)) => {
                        bad("H2", format!("step {i}: forfeited {key} settled"))
                    }
                    other => bad(
                        "H3",
                        format!("step {i}: settle of {key} in {:?}", other.map(|o| o.0)),
                    ),
                }
            }
            Step::NoEffect { key, .. } | Step::Refund { key } => match ops.get_mut(key) {
                Some((st @ Op::Dispatched, _)) => *st = Op::Ended,
                Some((Op::Forfeited, _)) => {
                    bad("H2", format!("step {i}: forfeited {key} returned"))
                }
                other => bad(
                    "H3",
                    format!("step {i}: return of {key} in {:?}", other.map(|o| o.0)),
                ),
            },
            Step::Forfeit { key } => match ops.get_mut(key) {
                Some((st @ Op::Dispatched, _)) => *st = Op::Forfeited,
                other => bad(
                    "H3",
                    format!("step {i}: forfeit of {key} in {:?}", other.map(|o| o.0)),
                ),
            },
            Step::Annotate { key, .. } => {
                if ops.get(key).map(|o| o.0) != Some(Op::Forfeited) {
                    bad("H2", format!("step {i}: annotation of unforfeited {key}"));
                }
            }
            Step::Fenced { fenced } => {
                let Ok(f) = fenced.peek() else { continue };
                let e = epochs.entry(f.credit).or_insert(0);
                if f.epoch <= *e {
                    bad(
                        "H4",
                        format!(
                            "step {i}: epoch of {} falls or repeats: {} after {e}",
                            f.credit, f.epoch
                        ),
                    );
                }
                *e = (*e).max(f.epoch);
                fenced_credits.insert(f.credit);
            }
            Step::Reissue {
                credit,
                successor,
                last,
            } => {
                if closed.contains(credit) {
                    bad("H7", format!("step {i}: closed credit {credit} reissued"));
                }
                if labels.contains_key(successor) {
                    bad(
                        "H7",
                        format!("step {i}: {credit} reissued into existing credit {successor}"),
                    );
                }
                let open: Vec<&OpKey> = ops
                    .iter()
                    .filter(|(k, (st, _))| {
                        matches!(st, Op::Reserved | Op::Dispatched)
                            && op_credit.get(*k).map(|c| c.0) == Some(*credit)
                    })
                    .map(|(k, _)| k)
                    .collect();
                let in_transit = sealed
                    .values()
                    .any(|c| c.source_credit == *credit && !decided.contains(&c.transfer));
                if !open.is_empty() || in_transit {
                    bad(
                        "H7",
                        format!(
                            "step {i}: {credit} reissued with work in progress ({} operations open, transfer undecided: {in_transit})",
                            open.len()
                        ),
                    );
                }
                if let Some(l) = last {
                    let key = match &**l {
                        Step::Settle { key, .. } | Step::NoEffect { key, .. } => Some(*key),
                        _ => None,
                    };
                    let op = key.and_then(|k| op_credit.get(&k));
                    let fenced_above = op.is_some_and(|(c, e)| {
                        c == credit
                            && fenced_credits.contains(credit)
                            && epochs.get(credit) > Some(e)
                    });
                    if !fenced_above {
                        bad(
                            "H7",
                            format!(
                                "step {i}: fused reissue of {credit} ends an operation that is not its fenced last one"
                            ),
                        );
                    }
                }
                let label = labels.get(credit).cloned().unwrap_or_default();
                labels.insert(*successor, label);
                if let Some(e) = epochs.get(credit).copied() {
                    epochs.insert(*successor, e);
                }
                closed.insert(*credit);
            }
            Step::Refuse { .. } => {}
            Step::Checkpoint(record) => {
                let seed = match crate::branch::Snapshot::open(record, agent, keys) {
                    Ok(s) => s.audit_seed(),
                    Err(e) => {
                        bad("H9", format!("step {i}: checkpoint does not verify: {e}"));
                        continue;
                    }
                };
                let theirs: Map<OpKey, Op> = seed
                    .ops
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
                    .collect();
                if i == 0 {
                    // The journal starts here: the checkpoint is the state before it.
                    for (id, label, epoch, fenced, is_closed) in &seed.credits {
                        labels.insert(*id, label.0.clone());
                        if *epoch > 0 {
                            epochs.insert(*id, *epoch);
                        }
                        if *fenced {
                            fenced_credits.insert(*id);
                        }
                        if *is_closed {
                            closed.insert(*id);
                        }
                    }
                    for (b, _, _) in &seed.ops {
                        op_credit.insert(b.key, (b.credit, b.epoch));
                        op_at.insert(b.key, (b.receiver.clone(), b.expires));
                        ops.insert(b.key, (theirs[&b.key], b.max_charge.clone()));
                    }
                    for (k, receiver, expires) in &seed.ended {
                        op_at.insert(*k, (receiver.clone(), *expires));
                        ops.insert(*k, (Op::Ended, Vector::zero()));
                    }
                    for (c, is_decided) in seed.outgoing {
                        if is_decided {
                            decided.insert(c.transfer);
                        }
                        sealed.insert(c.transfer, c);
                    }
                    continue;
                }
                // Mid-journal (a journal kept whole): the checkpoint must say what the
                // history before it says, operation by operation and credit by credit —
                // except ended operations it forgot, each only behind the horizon of its
                // gateway the checkpoint names (its permit expired before it).
                let forgotten: Vec<OpKey> = ops
                    .iter()
                    .filter(|(k, (st, _))| *st == Op::Ended && !theirs.contains_key(*k))
                    .filter(|(k, _)| {
                        op_at.get(*k).is_some_and(|(g, e)| {
                            let h = seed.horizons.get(g);
                            e.zip(h.copied()).is_some_and(|(e, h)| e < h)
                        })
                    })
                    .map(|(k, _)| *k)
                    .collect();
                for k in &forgotten {
                    ops.remove(k);
                    op_at.remove(k);
                    op_credit.remove(k);
                }
                let mine: Map<OpKey, Op> = ops.iter().map(|(k, (st, _))| (*k, *st)).collect();
                if mine != theirs {
                    let differ = mine
                        .iter()
                        .filter(|(k, st)| theirs.get(*k) != Some(*st))
                        .count()
                        + theirs.keys().filter(|k| !mine.contains_key(*k)).count();
                    bad(
                        "H9",
                        format!("step {i}: checkpoint disagrees with the history before it on {differ} operations"),
                    );
                }
                let their_closed: BTreeSet<CreditId> =
                    seed.credits.iter().filter(|c| c.4).map(|c| c.0).collect();
                if their_closed != closed {
                    bad(
                        "H9",
                        format!("step {i}: checkpoint disagrees with the history before it on closed credits"),
                    );
                }
            }
        }
    }
    v
}

/// Audits one gateway's log, record by record, with its own bookkeeping (never the gateway's
/// `apply`): the order the final state cannot show.
///
/// - `G1` fences only rise: each fence of a credit is above every earlier one;
/// - `G2` a fence precedes every acceptance it governs: no permit is accepted below a fence
///   of its credit already in the log;
/// - `G3` a key is accepted once per payer, with a permit its payer signed for exactly the
///   binding recorded;
/// - `G4` a receipt follows the acceptance it settles, once, signed by this gateway, bound to
///   the accepted binding and charging no more than its maximum;
/// - `G5` only settled acceptances are forgotten, each once, and only after its permit
///   expired before the record's horizon; horizons only rise;
/// - `G6` nothing is accepted that expired before a horizon already in the log (it may be a
///   forgotten one, replayed); a forgotten key is never accepted again (G3);
/// - `G7` a checkpoint is signed by the gateway; first in the log it is the state the audit
///   starts from; after other records it holds exactly the acceptances they leave live (same
///   bindings, same receipted), the same fences and horizon.
pub fn audit_gateway(
    gateway: &AgentId,
    records: &[GatewayRecord],
    keys: &Keyring,
) -> Vec<Violation> {
    use std::collections::BTreeSet;
    let mut v = Vec::new();
    let mut bad = |law: &'static str, detail: String| {
        v.push(Violation {
            law,
            detail: format!("{gateway}: {detail}"),
        })
    };
    let mut fences: BTreeMap<CreditId, u64> = BTreeMap::new();
    // (payer, key) → the accepted binding.
    let mut accepted: BTreeMap<(AgentId, OpKey), Binding> = BTreeMap::new();
    let mut receipted: BTreeSet<(AgentId, OpKey)> = BTreeSet::new();
    let mut forgotten: BTreeSet<(AgentId, OpKey)> = BTreeSet::new();
    let mut horizon = abhyasa_wire::UnixMillis(0);
    for (i, r) in records.iter().enumerate() {
        match r {
            GatewayRecord::Checkpoint(record) => {
                let seed = match crate::gateway::checkpoint::GatewaySnapshot::open(
                    record, gateway, keys,
                ) {
                    Ok(s) => s.seed(),
                    Err(e) => {
                        bad("G7", format!("record {i}: checkpoint does not verify: {e}"));
                        continue;
                    }
                };
                // Every row's evidence, verified again: the payer's permit for exactly the
                // row's binding, this gateway's receipt for it.
                for (((payer, key), b, _), (permit, receipt)) in seed.log.iter().zip(&seed.evidence)
                {
                    let permit_ok = keys
                        .open(permit, payer)
                        .is_ok_and(|p| p.binding == *b && b.payer == *payer && b.key == *key);
                    let receipt_ok = receipt.as_ref().is_none_or(|r| {
                        keys.open(r, gateway).is_ok_and(|r| {
                            r.key == *key && r.binding == b.digest() && r.actual.le(&b.max_charge)
                        })
                    });
                    if !permit_ok || !receipt_ok {
                        bad(
                            "G7",
                            format!("record {i}: checkpoint row {key} of {payer} without its payer's permit or this gateway's receipt"),
                        );
                    }
                }
                if i == 0 {
                    // The log starts here: the checkpoint is the state before it.
                    horizon = seed.horizon;
                    fences.extend(seed.fences);
                    for (k, b, done) in seed.log {
                        if done {
                            receipted.insert(k.clone());
                        }
                        accepted.insert(k, b);
                    }
                    continue;
                }
                // Mid-log: it must hold exactly what the records before it leave live.
                let live: BTreeMap<(AgentId, OpKey), (Binding, bool)> = accepted
                    .iter()
                    .filter(|(k, _)| !forgotten.contains(*k))
                    .map(|(k, b)| (k.clone(), (b.clone(), receipted.contains(k))))
                    .collect();
                let theirs: BTreeMap<(AgentId, OpKey), (Binding, bool)> = seed
                    .log
                    .into_iter()
                    .map(|(k, b, done)| (k, (b, done)))
                    .collect();
                let their_fences: BTreeMap<CreditId, u64> = seed.fences.into_iter().collect();
                if live != theirs || their_fences != fences || seed.horizon != horizon {
                    bad(
                        "G7",
                        format!("record {i}: checkpoint disagrees with the log before it"),
                    );
                }
            }
            GatewayRecord::Pruned { horizon: h, keys } => {
                if *h < horizon {
                    bad(
                        "G5",
                        format!("record {i}: horizon falls from {horizon:?} to {h:?}"),
                    );
                }
                horizon = horizon.max(*h);
                for k in keys {
                    let expired = accepted
                        .get(k)
                        .is_some_and(|b| b.expires.is_some_and(|e| e < *h));
                    if !receipted.contains(k) || !expired || !forgotten.insert(k.clone()) {
                        bad(
                            "G5",
                            format!(
                                "record {i}: {} of {} forgotten unsettled, unexpired or twice",
                                k.1, k.0
                            ),
                        );
                    }
                }
            }
            GatewayRecord::Fence { credit, epoch } => {
                let prior = fences.get(credit).copied();
                if prior.is_some_and(|p| *epoch <= p) {
                    bad(
                        "G1",
                        format!("record {i}: fence of {credit} at {epoch} after {prior:?}"),
                    );
                }
                let f = fences.entry(*credit).or_insert(0);
                *f = (*f).max(*epoch);
            }
            GatewayRecord::Accepted {
                binding, permit, ..
            } => {
                if binding.expires.is_some_and(|e| e < horizon) {
                    bad(
                        "G6",
                        format!(
                            "record {i}: {} accepted though it expired before the horizon {horizon:?}",
                            binding.key
                        ),
                    );
                }
                let fence = fences.get(&binding.credit).copied().unwrap_or(0);
                if binding.epoch < fence {
                    bad(
                        "G2",
                        format!(
                            "record {i}: {} accepted at epoch {} below the fence at {fence} of {}",
                            binding.key, binding.epoch, binding.credit
                        ),
                    );
                }
                let signed = keys
                    .open(permit, &binding.payer)
                    .is_ok_and(|p| p.binding == **binding);
                if !signed {
                    bad(
                        "G3",
                        format!(
                            "record {i}: {} accepted without its payer's permit for that binding",
                            binding.key
                        ),
                    );
                }
                let id = (binding.payer.clone(), binding.key);
                if accepted.insert(id, (**binding).clone()).is_some() {
                    bad(
                        "G3",
                        format!(
                            "record {i}: {} of {} accepted again",
                            binding.key, binding.payer
                        ),
                    );
                }
            }
            GatewayRecord::Receipt { receipt, payer } => {
                let Ok(body) = keys.open(receipt, gateway) else {
                    bad(
                        "G4",
                        format!("record {i}: a receipt this gateway did not sign"),
                    );
                    continue;
                };
                // Older records carry no payer: the acceptance is found by the binding.
                let found = accepted.iter().find(|((p, k), b)| {
                    *k == body.key
                        && payer.as_ref().is_none_or(|x| x == p)
                        && b.digest() == body.binding
                });
                let Some(((p, k), b)) = found else {
                    bad(
                        "G4",
                        format!(
                            "record {i}: receipt for {} before or without its acceptance",
                            body.key
                        ),
                    );
                    continue;
                };
                if !body.actual.le(&b.max_charge) {
                    bad(
                        "G4",
                        format!("record {i}: receipt for {k} above its binding's maximum"),
                    );
                }
                if !receipted.insert((p.clone(), *k)) {
                    bad("G4", format!("record {i}: {k} of {p} receipted twice"));
                }
            }
        }
    }
    v
}
