//! The history auditors: a branch's journal and a gateway's log, each read alone against the
//! rules a history must keep (H1–H9, G1–G7), trusting no state the node kept.

use super::*;

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
