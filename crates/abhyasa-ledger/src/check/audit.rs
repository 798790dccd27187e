//! The history auditors: a branch's journal and a gateway's log, each read alone against the
//! rules a history must keep (H1–H9, G1–G7), trusting no state the node kept.

use super::*;

mod history;
use history::{At, History, RULES};

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
    let mut history = History::new(agent, keys);
    let mut found = Found::default();
    // A fused reissue ends its last operation first, in the same step.
    let flat = steps.iter().enumerate().flat_map(|(i, s)| {
        let inner = match s {
            Step::Reissue { last: Some(l), .. } => Some((i, &**l)),
            _ => None,
        };
        inner.into_iter().chain(std::iter::once((i, s)))
    });
    for (i, step) in flat {
        let seed = match step {
            Step::Checkpoint(record) => {
                Some(crate::branch::Snapshot::open(record, agent, keys).map(|s| s.audit_seed()))
            }
            _ => None,
        };
        let at = At {
            i,
            step,
            seed: seed.as_ref(),
        };
        for rule in RULES {
            rule(&history, &at, &mut found);
        }
        history.advance(&at);
    }
    found
        .0
        .into_iter()
        .map(|v| Violation {
            detail: format!("{agent}: {}", v.detail),
            ..v
        })
        .collect()
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
