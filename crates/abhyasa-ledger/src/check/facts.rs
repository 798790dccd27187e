//! What the laws read, gathered once from the durable states alone. Nothing here judges:
//! a certificate that does not open is left out of the delegation facts, and the laws say why.

use std::collections::BTreeMap;

use abhyasa_wire::ledger::*;
use abhyasa_wire::{AgentId, UnixMillis};

use super::atoms::{size, vec_get, Iv};
use super::World;
use crate::{Acceptance, EndedOp, OpState, Operation, OutgoingState, Step};

/// What one branch holds of one root in one dimension, summed over branches.
#[derive(Default)]
pub(super) struct Held {
    /// Every atom held, in any bucket (overlaps kept: the partition law finds them).
    pub(super) all: Vec<Iv>,
    /// Committed by settlements (and folded by checkpoints).
    pub(super) committed: u128,
    /// The most the open, quarantined and forfeited operations may still charge.
    pub(super) at_risk: u128,
}

/// An accepted transfer: an edge of the delegation DAG.
pub(super) struct Edge {
    pub(super) source: AgentId,
    pub(super) destination: AgentId,
    pub(super) root: RootId,
    pub(super) footprint: Footprint,
}

/// Which bucket atoms are in, for what they put at risk.
#[derive(Clone, Copy)]
enum Bucket<'a> {
    /// Available, or in transit: nothing at risk.
    Free,
    /// Committed: all of it counts.
    Committed,
    /// Escrowed for an operation: its maximum charge counts.
    Escrow(&'a Vector),
}

/// Everything the laws read.
pub(super) struct Facts<'w> {
    /// Each root's budget, from the grant its holder keeps.
    pub(super) budgets: BTreeMap<RootId, Vector>,
    /// Where each transfer was accepted, keyed by (root, transfer).
    pub(super) accepted_at: BTreeMap<(RootId, TransferId), Vec<AgentId>>,
    /// Atoms that entered each branch per root and dimension: its grants and the transfers it
    /// accepted.
    pub(super) ingress: BTreeMap<(AgentId, RootId, Dim), Vec<Iv>>,
    /// Accepted transfers.
    pub(super) edges: Vec<Edge>,
    /// What all branches hold, per root and dimension.
    pub(super) held: BTreeMap<(RootId, Dim), Held>,
    /// What each branch holds, per root and dimension.
    pub(super) held_by: BTreeMap<(AgentId, RootId, Dim), Vec<Iv>>,
    /// Committed plus the most at risk, per branch, root and dimension.
    pub(super) risk_by: BTreeMap<(AgentId, RootId, Dim), u128>,
    /// How many times each (payer, key) is settled, live or folded.
    pub(super) settled_keys: BTreeMap<(AgentId, OpKey), u32>,
    /// Operations by (payer, key): keys are scoped per payer.
    pub(super) ops: BTreeMap<(AgentId, OpKey), (&'w AgentId, &'w Operation)>,
    /// Operations checkpoints folded, by (payer, key).
    pub(super) ended: BTreeMap<(AgentId, OpKey), &'w EndedOp>,
    /// Each gateway's acceptances, by (gateway, payer, key).
    pub(super) acceptances: BTreeMap<(AgentId, AgentId, OpKey), &'w Acceptance>,
    /// Each gateway's horizon.
    pub(super) horizons: BTreeMap<AgentId, UnixMillis>,
    /// The horizons gateways told each payer, by (payer, gateway).
    pub(super) told: BTreeMap<(AgentId, AgentId), UnixMillis>,
    /// The receipt each gateway holds, by (payer, key).
    pub(super) receipts: BTreeMap<(AgentId, OpKey), &'w Signed<Receipt>>,
}

impl<'w> Facts<'w> {
    pub(super) fn gather(w: &World<'w>) -> Self {
        let mut f = Facts {
            budgets: BTreeMap::new(),
            accepted_at: BTreeMap::new(),
            ingress: BTreeMap::new(),
            edges: Vec::new(),
            held: BTreeMap::new(),
            held_by: BTreeMap::new(),
            risk_by: BTreeMap::new(),
            settled_keys: BTreeMap::new(),
            ops: BTreeMap::new(),
            ended: BTreeMap::new(),
            acceptances: BTreeMap::new(),
            horizons: BTreeMap::new(),
            told: BTreeMap::new(),
            receipts: BTreeMap::new(),
        };
        f.delegation(w);
        for b in w.branches {
            f.holdings(b);
        }
        f.histories(w);
        f
    }

    /// Budgets, ingress and the edges of the delegation DAG.
    fn delegation(&mut self, w: &World<'w>) {
        for b in w.branches {
            for g in b.roots() {
                self.budgets.insert(g.root, g.budget.clone());
                for (d, n) in g.budget.iter() {
                    self.ingress
                        .entry((b.agent().clone(), g.root, d.clone()))
                        .or_default()
                        .push((0, n));
                }
            }
            for s in b.incoming() {
                let Step::Accept { cert, .. } = s else {
                    continue;
                };
                let Ok(c) = cert.peek() else {
                    continue; // L5 says it is unreadable.
                };
                self.accepted_at
                    .entry((c.root, c.transfer))
                    .or_default()
                    .push(b.agent().clone());
                for (d, r) in c.footprint.iter() {
                    self.ingress
                        .entry((b.agent().clone(), c.root, d.clone()))
                        .or_default()
                        .extend_from_slice(r.ranges());
                }
                self.edges.push(Edge {
                    source: c.source,
                    destination: b.agent().clone(),
                    root: c.root,
                    footprint: c.footprint,
                });
            }
        }
    }

    /// What one branch holds, bucket by bucket, and which keys it settled.
    fn holdings(&mut self, b: &'w crate::Branch) {
        let me = b.agent();
        for c in b.credits() {
            self.put(me, c.root, &c.available, Bucket::Free);
        }
        // Folded by a checkpoint: committed atoms per root, and what each ended op was.
        for (root, fp) in b.committed() {
            self.put(me, *root, fp, Bucket::Committed);
        }
        for e in b.ended() {
            if matches!(e.outcome, crate::Ended::Settled { .. }) {
                *self.settled_keys.entry((me.clone(), e.key)).or_default() += 1;
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
            if moving
                && !self
                    .accepted_at
                    .contains_key(&(o.body.root, o.body.transfer))
            {
                self.put(me, o.body.root, &o.body.footprint, Bucket::Free);
            }
        }
        for o in b.operations() {
            let root = o.binding.root;
            match &o.state {
                OpState::Reserved | OpState::Quarantined | OpState::Forfeited { .. } => self.put(
                    me,
                    root,
                    &o.footprint,
                    Bucket::Escrow(&o.binding.max_charge),
                ),
                OpState::Settled { charged, .. } => {
                    self.put(me, root, charged, Bucket::Committed);
                    *self
                        .settled_keys
                        .entry((o.binding.payer.clone(), o.binding.key))
                        .or_default() += 1;
                }
                OpState::NoEffect(_) | OpState::Released | OpState::Refunded => {}
            }
        }
    }

    fn put(&mut self, me: &AgentId, root: RootId, f: &Footprint, bucket: Bucket<'_>) {
        for (d, r) in f.iter() {
            let h = self.held.entry((root, d.clone())).or_default();
            h.all.extend_from_slice(r.ranges());
            let risk = match bucket {
                Bucket::Free => 0,
                Bucket::Committed => {
                    let n = size(r.ranges());
                    h.committed += n;
                    n
                }
                Bucket::Escrow(max) => {
                    let n = vec_get(max, d);
                    h.at_risk += n;
                    n
                }
            };
            *self
                .risk_by
                .entry((me.clone(), root, d.clone()))
                .or_default() += risk;
            self.held_by
                .entry((me.clone(), root, d.clone()))
                .or_default()
                .extend_from_slice(r.ranges());
        }
    }

    /// Operations, folded operations, acceptances, horizons and receipts by key.
    fn histories(&mut self, w: &World<'w>) {
        for b in w.branches {
            let me = b.agent();
            for o in b.operations() {
                self.ops.insert((me.clone(), o.binding.key), (me, o));
            }
            for e in b.ended() {
                self.ended.insert((me.clone(), e.key), e);
            }
            for (g, h) in b.horizons() {
                self.told.insert((me.clone(), g.clone()), *h);
            }
        }
        for g in w.gateways {
            self.horizons.insert(g.agent().clone(), g.horizon());
            for ((p, k), a) in g.log() {
                self.acceptances
                    .insert((g.agent().clone(), p.clone(), *k), a);
                if let crate::AcceptanceState::Done(r) = &a.state {
                    self.receipts.insert((p.clone(), *k), r);
                }
            }
        }
    }
}
