//! Checkpoints: a branch's state in one record signed by the branch, so the journal before it
//! can go (compaction).
//!
//! A checkpoint *folds* ended operations — settled, proven without effect, released — out of
//! the live state: each leaves an [`EndedOp`] summary (key, binding digest, outcome; no
//! signatures), and the atoms settlements committed join one footprint per root. Everything
//! else is kept whole: credits (closed ones included, for lineage and reused-id refusal),
//! the steps that made them, open and forfeited operations with their permits, transfers in
//! both directions with their signed decisions. A journal then reads `[checkpoint, steps
//! after it …]`; recovery loads the checkpoint (its signature verified with the branch's own
//! key, every footprint re-validated) and replays the rest.
//!
//! Its body is CBOR like a step, but is not a wire object: a credit's footprint may hold
//! more ranges than a wire footprint may, and the record is as large as the state, so it is
//! read with its own size limit ([`MAX_CHECKPOINT_BYTES`]).

use std::collections::BTreeMap;

use abhyasa_wire::ledger::*;
use abhyasa_wire::AgentId;
use serde::{Deserialize, Serialize};

use super::{Branch, Credit, OpState, Operation, Outgoing, OutgoingState, Step};
use crate::LedgerError;

/// The domain tag a checkpoint's signature covers.
const TAG: &str = "checkpoint";

/// The largest checkpoint read back, in bytes (256 MiB).
pub const MAX_CHECKPOINT_BYTES: usize = 256 << 20;

/// What became of an operation a checkpoint folded.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case", deny_unknown_fields)]
pub enum Ended {
    /// Settled by the gateway's receipt for this actual charge.
    Settled {
        /// The committed charge.
        actual: Vector,
    },
    /// Proven without effect by a fenced no-effect proof.
    NoEffect,
    /// Released before it was ever dispatchable.
    Released,
    /// Returned without evidence (the `RefundOnTimeout` mutant only).
    #[doc(hidden)]
    Refunded,
}

/// An ended operation as a checkpoint keeps it: enough to refuse its key again, to match
/// the gateway's acceptance and the effect that ran, and no signature.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct EndedOp {
    /// The operation.
    pub key: OpKey,
    /// Its binding's digest.
    pub binding: Digest,
    /// Its root.
    pub root: RootId,
    /// The credit it drew on.
    pub credit: CreditId,
    /// Its gateway.
    pub receiver: AgentId,
    /// When its permit expired (`Binding::expires`).
    pub expires: Option<abhyasa_wire::UnixMillis>,
    /// Whether its permit was ever made dispatchable.
    pub dispatched: bool,
    /// How it ended.
    pub outcome: Ended,
}

/// Atoms per dimension with no range limit.
type Atoms = Vec<(Dim, Vec<(u64, u64)>)>;

fn atoms(f: &Footprint) -> Atoms {
    f.iter()
        .map(|(d, r)| (d.clone(), r.ranges().to_vec()))
        .collect()
}

fn footprint(a: Atoms) -> Result<Footprint, LedgerError> {
    let corrupt = || LedgerError::WrongState("checkpoint holds an invalid footprint");
    let mut dims = Vec::with_capacity(a.len());
    for (d, ranges) in a {
        if ranges.iter().any(|&(s, e)| s >= e) {
            return Err(corrupt());
        }
        let n = ranges.len();
        let r = Ranges::from_ranges(ranges).ok_or_else(corrupt)?;
        // Canonical: sorted, disjoint, non-adjacent as written.
        if r.ranges().len() != n {
            return Err(corrupt());
        }
        dims.push((d, r));
    }
    Footprint::from_dims(dims).ok_or_else(corrupt)
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct CreditRow {
    id: CreditId,
    root: RootId,
    label: Label,
    generation: u32,
    epoch: u64,
    available: Atoms,
    fenced: bool,
    closed: bool,
    successor: Option<CreditId>,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case", deny_unknown_fields)]
enum OpRowState {
    Reserved,
    Quarantined,
    Forfeited { annotation: Option<Signed<Receipt>> },
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct OpRow {
    permit: Signed<Permit>,
    effect: Effect,
    state: OpRowState,
    dispatched: bool,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case", deny_unknown_fields)]
enum OutRowState {
    Sealed,
    Accepted(Signed<TransferDecision>),
    Cancelled(Signed<TransferDecision>),
    Reclaimed(Signed<SourceDecision>),
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct OutRow {
    cert: Signed<TransferCert>,
    state: OutRowState,
}

/// A branch's state as a checkpoint carries it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct Snapshot {
    agent: AgentId,
    /// Journal steps folded into this checkpoint, over every compaction so far.
    folded_steps: u64,
    credits: Vec<CreditRow>,
    origins: Vec<(CreditId, Step)>,
    ops: Vec<OpRow>,
    ended: Vec<EndedOp>,
    /// Per gateway, the instant its ended operations were forgotten before (absent in
    /// checkpoints written before forgetting).
    #[serde(default)]
    horizons: Vec<(AgentId, abhyasa_wire::UnixMillis)>,
    committed: Vec<(RootId, Atoms)>,
    outgoing: Vec<OutRow>,
    incoming: Vec<Step>,
}

/// [`Snapshot`] borrowed from the branch, for writing: it encodes exactly as the `Snapshot`
/// it describes (same fields, names and order) without copying the state first — a
/// checkpoint is as large as the state, and every operation ever ended is in it.
#[derive(Serialize)]
struct SnapshotRef<'a> {
    agent: &'a AgentId,
    folded_steps: u64,
    credits: Vec<CreditRow>,
    origins: Vec<(CreditId, &'a Step)>,
    ops: Vec<OpRowRef<'a>>,
    ended: Vec<&'a EndedOp>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    horizons: Vec<(&'a AgentId, abhyasa_wire::UnixMillis)>,
    committed: Vec<(RootId, Atoms)>,
    outgoing: Vec<OutRowRef<'a>>,
    incoming: Vec<&'a Step>,
}

#[derive(Serialize)]
#[serde(rename_all = "snake_case")]
enum OpRowStateRef<'a> {
    Reserved,
    Quarantined,
    Forfeited {
        annotation: Option<&'a Signed<Receipt>>,
    },
}

#[derive(Serialize)]
struct OpRowRef<'a> {
    permit: &'a Signed<Permit>,
    effect: &'a Effect,
    state: OpRowStateRef<'a>,
    dispatched: bool,
}

#[derive(Serialize)]
#[serde(rename_all = "snake_case")]
enum OutRowStateRef<'a> {
    Sealed,
    Accepted(&'a Signed<TransferDecision>),
    Cancelled(&'a Signed<TransferDecision>),
    Reclaimed(&'a Signed<SourceDecision>),
}

#[derive(Serialize)]
struct OutRowRef<'a> {
    cert: &'a Signed<TransferCert>,
    state: OutRowStateRef<'a>,
}

/// What the history auditor reads from a checkpoint (everything it tracks per step).
pub(crate) struct AuditSeed {
    /// Each credit's label, epoch, and whether it is fenced or closed.
    pub(crate) credits: Vec<(CreditId, Label, u64, bool, bool)>,
    /// Open and forfeited operations: binding, and whether dispatched / forfeited.
    pub(crate) ops: Vec<(Binding, bool, bool)>,
    /// Ended operations: key, gateway and expiry (credit and epoch are not kept).
    pub(crate) ended: Vec<(OpKey, AgentId, Option<abhyasa_wire::UnixMillis>)>,
    /// Per gateway, the instant ended operations expiring before it were forgotten.
    pub(crate) horizons: BTreeMap<AgentId, abhyasa_wire::UnixMillis>,
    /// Sealed transfers and whether each is decided.
    pub(crate) outgoing: Vec<(TransferCert, bool)>,
}

impl Snapshot {
    pub(crate) fn open(
        record: &SignedRecord,
        agent: &AgentId,
        keys: &crate::Keyring,
    ) -> Result<Self, LedgerError> {
        let s: Snapshot = crate::open_checkpoint(record, agent, keys, TAG, "a checkpoint")?;
        if &s.agent != agent {
            return Err(LedgerError::WrongState("checkpoint of another branch"));
        }
        Ok(s)
    }

    pub(crate) fn audit_seed(&self) -> AuditSeed {
        AuditSeed {
            credits: self
                .credits
                .iter()
                .map(|c| (c.id, c.label.clone(), c.epoch, c.fenced, c.closed))
                .collect(),
            ops: self
                .ops
                .iter()
                .filter_map(|o| {
                    let p = o.permit.peek().ok()?;
                    Some((
                        p.binding,
                        o.state != OpRowState::Reserved,
                        matches!(o.state, OpRowState::Forfeited { .. }),
                    ))
                })
                .collect(),
            ended: self
                .ended
                .iter()
                .map(|e| (e.key, e.receiver.clone(), e.expires))
                .collect(),
            horizons: self.horizons.iter().cloned().collect(),
            outgoing: self
                .outgoing
                .iter()
                .filter_map(|o| Some((o.cert.peek().ok()?, o.state != OutRowState::Sealed)))
                .collect(),
        }
    }
}

impl Branch {
    /// Compacts the journal: folds ended operations out of the live state (see the module
    /// docs) and queues a checkpoint of what remains, signed by this branch. Once the
    /// checkpoint is durable the journal before it may be deleted — a store does so in the
    /// same commit — and recovery starts from it. Returns the journal steps it folds.
    ///
    /// The checkpoint goes through [`poll_persist`](Self::poll_persist) behind every step
    /// queued before it, so it is never durable before the steps it summarizes.
    pub fn checkpoint(&mut self) -> Result<u64, LedgerError> {
        self.fold()?;
        let folded = self.journal_len;
        let body = abhyasa_wire::encode(&self.snapshot(self.folded_steps + folded));
        let record = SignedRecord::sign(TAG, body, &self.me, &self.key);
        self.folded_steps += folded;
        self.journal_len = 1;
        let token = crate::PersistToken(self.next_token);
        self.next_token += 1;
        self.persists
            .push_back((token, Step::Checkpoint(Box::new(record))));
        Ok(folded)
    }

    /// Journal steps folded into the checkpoint the journal starts with (0 without one).
    pub fn folded_steps(&self) -> u64 {
        self.folded_steps
    }

    /// Operations a checkpoint folded, by key.
    pub fn ended(&self) -> impl Iterator<Item = &EndedOp> {
        self.ended.values()
    }

    /// Atoms committed by operations a checkpoint folded, per root.
    pub fn committed(&self) -> impl Iterator<Item = (&RootId, &Footprint)> {
        self.committed.iter()
    }

    /// Moves every ended operation out of `ops` into `ended`, its committed atoms into
    /// `committed`. Forfeited operations stay (their atoms are charged for ever and a late
    /// receipt still annotates them).
    fn fold(&mut self) -> Result<(), LedgerError> {
        let drop_forfeited =
            self.config.mutation() == Some(crate::LedgerMutation::CheckpointDropsForfeited);
        let done: Vec<OpKey> = self
            .ops
            .iter()
            .filter(|(_, o)| match o.state {
                OpState::Settled { .. }
                | OpState::NoEffect(_)
                | OpState::Released
                | OpState::Refunded => true,
                OpState::Forfeited { .. } => drop_forfeited,
                OpState::Reserved | OpState::Quarantined => false,
            })
            .map(|(k, _)| *k)
            .collect();
        // All or nothing: the committed footprints are computed before anything moves. One
        // merge per root: the committed atoms are in about as many pieces as operations ever
        // settled, so joining each settlement in turn would be quadratic in the history.
        let mut parts: BTreeMap<RootId, Vec<&Footprint>> = BTreeMap::new();
        for (root, c) in &self.committed {
            parts.entry(*root).or_default().push(c);
        }
        for key in &done {
            if let Some(op) = self.ops.get(key) {
                if let OpState::Settled { charged, .. } = &op.state {
                    parts.entry(op.binding.root).or_default().push(charged);
                }
            }
        }
        let mut committed = BTreeMap::new();
        for (root, fps) in parts {
            let joined = Footprint::union_all(fps)
                .ok_or(LedgerError::WrongState("committed atoms owned twice"))?;
            committed.insert(root, joined);
        }
        self.committed = committed;
        for key in done {
            let Some(op) = self.ops.remove(&key) else {
                continue;
            };
            let outcome = match op.state {
                OpState::Settled { charged, .. } => Ended::Settled {
                    actual: charged.size(),
                },
                // Forfeited only under the mutant.
                OpState::NoEffect(_) | OpState::Forfeited { .. } => Ended::NoEffect,
                OpState::Released => Ended::Released,
                OpState::Refunded | OpState::Reserved | OpState::Quarantined => Ended::Refunded,
            };
            self.ended.insert(
                key,
                EndedOp {
                    key,
                    binding: op.binding_digest,
                    root: op.binding.root,
                    credit: op.binding.credit,
                    receiver: op.binding.receiver.clone(),
                    expires: op.binding.expires,
                    dispatched: op.dispatched,
                    outcome,
                },
            );
        }
        self.forget_behind_horizons();
        Ok(())
    }

    /// Forgets the ended operations each gateway's horizon covers: their permits expired
    /// before it, so the gateway holds no acceptance of them and will take none (it refuses
    /// a permit expiring before its horizon), and their keys may be used again. What a
    /// forgotten settlement committed stays in `committed`.
    fn forget_behind_horizons(&mut self) {
        if self.horizons.is_empty() {
            return;
        }
        let early = self.config.mutation() == Some(crate::LedgerMutation::ForgetBeforeHorizon);
        let horizons = &self.horizons;
        self.ended.retain(|_, e| match horizons.get(&e.receiver) {
            Some(_) if early => false,
            Some(h) => e.expires.is_none_or(|x| x >= *h),
            None => true,
        });
    }

    /// Moves `gateway`'s horizon up to `horizon` (never down).
    pub(super) fn raise_horizon(&mut self, gateway: &AgentId, horizon: abhyasa_wire::UnixMillis) {
        let h = self.horizons.entry(gateway.clone()).or_insert(horizon);
        *h = (*h).max(horizon);
    }

    /// Per gateway, the instant before which this branch forgets (or has forgotten) its
    /// ended operations there ([`LedgerMessage::Horizon`](abhyasa_wire::ledger::LedgerMessage)).
    pub fn horizons(&self) -> impl Iterator<Item = (&AgentId, &abhyasa_wire::UnixMillis)> {
        self.horizons.iter()
    }

    fn snapshot(&self, folded_steps: u64) -> SnapshotRef<'_> {
        SnapshotRef {
            agent: &self.me,
            folded_steps,
            credits: self
                .credits
                .values()
                .map(|c| CreditRow {
                    id: c.id,
                    root: c.root,
                    label: c.label.clone(),
                    generation: c.generation,
                    epoch: c.epoch,
                    available: atoms(&c.available),
                    fenced: c.fenced,
                    closed: c.closed,
                    successor: c.successor,
                })
                .collect(),
            origins: self.origins.iter().map(|(k, s)| (*k, s)).collect(),
            ops: self
                .ops
                .values()
                .map(|o| OpRowRef {
                    permit: &o.permit,
                    effect: &o.effect,
                    state: match &o.state {
                        OpState::Reserved => OpRowStateRef::Reserved,
                        OpState::Forfeited { annotation } => OpRowStateRef::Forfeited {
                            annotation: annotation.as_ref(),
                        },
                        // Folded before a snapshot is taken: only open ones remain.
                        _ => OpRowStateRef::Quarantined,
                    },
                    dispatched: o.dispatched,
                })
                .collect(),
            ended: self.ended.values().collect(),
            horizons: self.horizons.iter().map(|(g, h)| (g, *h)).collect(),
            committed: self.committed.iter().map(|(r, f)| (*r, atoms(f))).collect(),
            outgoing: self
                .outgoing
                .values()
                .map(|o| OutRowRef {
                    cert: &o.cert,
                    state: match &o.state {
                        OutgoingState::Sealed => OutRowStateRef::Sealed,
                        OutgoingState::Accepted(d) => OutRowStateRef::Accepted(d),
                        OutgoingState::Cancelled(d) => OutRowStateRef::Cancelled(d),
                        OutgoingState::Reclaimed(d) => OutRowStateRef::Reclaimed(d),
                    },
                })
                .collect(),
            incoming: self.incoming.values().collect(),
        }
    }

    /// The state as a checkpoint of it would read back.
    fn snapshot_read_back(&self, folded_steps: u64) -> Result<Snapshot, LedgerError> {
        let body = abhyasa_wire::encode(&self.snapshot(folded_steps));
        Ok(abhyasa_wire::decode_with_limit(
            &body,
            MAX_CHECKPOINT_BYTES,
        )?)
    }

    /// Applies a checkpoint step. First in a journal: the branch becomes the checkpoint's
    /// state. After other steps (a journal kept whole): the state replayed so far, folded,
    /// must be exactly the checkpoint's, or the journal is refused.
    pub(super) fn apply_checkpoint(&mut self, record: &SignedRecord) -> Result<bool, LedgerError> {
        let snap = Snapshot::open(record, &self.me, &self.keys)?;
        if self.journal_len > 0 || self.folded_steps > 0 {
            // What it forgot was told by gateways, not written as steps: the replay forgets
            // by the checkpoint's own horizons (never lowering one already applied).
            for (g, h) in &snap.horizons {
                self.raise_horizon(g, *h);
            }
            self.fold()?;
            let total = self.folded_steps + self.journal_len;
            if self.snapshot_read_back(total)? != snap {
                return Err(LedgerError::WrongState(
                    "checkpoint does not match the journal before it",
                ));
            }
            self.folded_steps = total;
            self.journal_len = 0; // The caller counts the checkpoint itself.
            return Ok(true);
        }
        self.load(snap)?;
        Ok(true)
    }

    fn load(&mut self, s: Snapshot) -> Result<(), LedgerError> {
        let corrupt = |what: &'static str| LedgerError::WrongState(what);
        let mut credits = BTreeMap::new();
        for c in s.credits {
            let credit = Credit {
                id: c.id,
                root: c.root,
                label: c.label,
                generation: c.generation,
                epoch: c.epoch,
                available: footprint(c.available)?,
                fenced: c.fenced,
                closed: c.closed,
                successor: c.successor,
            };
            if credits.insert(c.id, credit).is_some() {
                return Err(corrupt("checkpoint names a credit twice"));
            }
        }
        let mut roots = BTreeMap::new();
        let mut origins = BTreeMap::new();
        for (id, step) in s.origins {
            if let Step::Grant { grant, .. } = &step {
                // Root budgets are what the checker measures everything against: verified
                // again, as replaying the grant step would.
                let g = self.verified_grant(grant)?;
                roots.insert(g.root, g);
            }
            if !credits.contains_key(&id) || origins.insert(id, step).is_some() {
                return Err(corrupt("checkpoint origin of no credit, or twice"));
            }
        }
        let mut ops = BTreeMap::new();
        for o in s.ops {
            let p = o.permit.peek()?;
            let state = match o.state {
                OpRowState::Reserved => OpState::Reserved,
                OpRowState::Quarantined => OpState::Quarantined,
                OpRowState::Forfeited { annotation } => OpState::Forfeited { annotation },
            };
            let op = Operation {
                permit: o.permit,
                binding_digest: p.binding.digest(),
                binding: p.binding,
                effect: o.effect,
                footprint: p.footprint,
                state,
                dispatched: o.dispatched,
                sent_at: None,
            };
            if ops.insert(op.binding.key, op).is_some() {
                return Err(corrupt("checkpoint names an operation twice"));
            }
        }
        let mut ended = BTreeMap::new();
        for e in s.ended {
            if ops.contains_key(&e.key) || ended.insert(e.key, e).is_some() {
                return Err(corrupt("checkpoint names an operation twice"));
            }
        }
        let mut horizons = BTreeMap::new();
        for (g, h) in s.horizons {
            if horizons.insert(g, h).is_some() {
                return Err(corrupt("checkpoint names a gateway's horizon twice"));
            }
        }
        let mut committed = BTreeMap::new();
        for (root, a) in s.committed {
            if committed.insert(root, footprint(a)?).is_some() {
                return Err(corrupt("checkpoint names a root twice"));
            }
        }
        let mut outgoing = BTreeMap::new();
        for o in s.outgoing {
            let body = o.cert.peek()?;
            let state = match o.state {
                OutRowState::Sealed => OutgoingState::Sealed,
                OutRowState::Accepted(d) => OutgoingState::Accepted(d),
                OutRowState::Cancelled(d) => OutgoingState::Cancelled(d),
                OutRowState::Reclaimed(d) => OutgoingState::Reclaimed(d),
            };
            let t = body.transfer;
            let out = Outgoing {
                cert: o.cert,
                body,
                state,
            };
            if outgoing.insert(t, out).is_some() {
                return Err(corrupt("checkpoint names a transfer twice"));
            }
        }
        let mut incoming = BTreeMap::new();
        for step in s.incoming {
            let cert = match &step {
                Step::Accept { cert, .. }
                | Step::Refuse { cert, .. }
                | Step::Claim { cert, .. }
                | Step::Reclaimed { cert, .. } => cert.peek()?,
                _ => {
                    return Err(corrupt(
                        "checkpoint holds an incoming entry of another kind",
                    ))
                }
            };
            if incoming.insert((cert.root, cert.transfer), step).is_some() {
                return Err(corrupt("checkpoint names a transfer twice"));
            }
        }
        self.credits = credits;
        self.roots = roots;
        self.origins = origins;
        self.ops = ops;
        self.ended = ended;
        self.horizons = horizons;
        self.committed = committed;
        self.outgoing = outgoing;
        self.incoming = incoming;
        self.folded_steps = s.folded_steps;
        Ok(())
    }
}
