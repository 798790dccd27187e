//! One agent's share of the ledger: its credits, its transfers and its operations.

use std::collections::{BTreeMap, BTreeSet, VecDeque};

use abhyasa_wire::ledger::*;
use abhyasa_wire::{AgentId, UnixMillis};
use serde::{Deserialize, Serialize};

use crate::{Keyring, LedgerError, LedgerMutation, PersistToken};

mod checkpoint;

pub(crate) use checkpoint::Snapshot;
pub use checkpoint::{Ended, EndedOp, MAX_CHECKPOINT_BYTES};

/// Branch settings.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BranchConfig {
    /// How often undecided transfers and unsettled dispatches are sent again, in ms.
    pub resend_ms: u64,
    /// Journal steps past which the branch takes no new work: grants, splits, transfers,
    /// reservations and joins are refused with [`LedgerError::JournalFull`], and incoming
    /// transfers are refused (their rights go back to the source). Steps that end work
    /// already started (dispatch, settlement, forfeit, decisions) still go in.
    pub max_journal_steps: u64,
    /// Journal steps after which the branch checkpoints itself ([`Branch::checkpoint`]) the
    /// next time a step is polled; 0: never on its own. A checkpoint rewrites the whole
    /// state, so one is also put off until the journal holds at least half as many steps
    /// as the state has rows: its cost per step stays constant as the state grows.
    pub checkpoint_steps: u64,
    /// How long a permit is valid, in ms from the branch's clock when it is reserved
    /// (`Binding::expires`); 0: permits never expire. A gateway refuses an expired permit,
    /// and may forget a settled operation whose permit expired longer ago than its retention.
    pub permit_ttl_ms: u64,
    /// A deliberately broken rule (simulation only).
    #[doc(hidden)]
    pub mutation: Option<LedgerMutation>,
}

impl Default for BranchConfig {
    fn default() -> Self {
        Self {
            resend_ms: 500,
            max_journal_steps: 1_000_000,
            checkpoint_steps: 10_000,
            permit_ttl_ms: 0,
            mutation: None,
        }
    }
}

/// A credit: exclusive ownership of the atoms in `available`, under one root. Move-only: it
/// is not `Clone`, so no code path can duplicate the rights it holds; atoms leave it only
/// through the transitions (take, union, subtract of its footprint).
///
/// ```compile_fail
/// fn duplicate(c: &abhyasa_ledger::Credit) -> abhyasa_ledger::Credit {
///     c.clone() // Credits cannot be copied.
/// }
/// ```
#[derive(Debug, PartialEq, Eq)]
pub struct Credit {
    /// The credit.
    pub id: CreditId,
    /// Its root.
    pub root: RootId,
    /// What it may be spent on.
    pub label: Label,
    /// One more than its predecessor's when it is a reissue (paper §5.7); 0 for a grant, a
    /// split, an accepted transfer or a join's output.
    pub generation: u32,
    /// The epoch permits are bound to; raised by a confirmed fence.
    pub epoch: u64,
    /// Atoms it owns and may reserve, split or transfer.
    pub available: Footprint,
    /// A gateway confirmed a fence: this generation takes no new work (no reservation, split,
    /// transfer or join); once its last operation ends it closes and its available atoms
    /// move to a fresh generation ([`Step::Reissue`]).
    pub fenced: bool,
    /// Closed: consumed by a join (its atoms moved to the output) or reissued.
    pub closed: bool,
    /// The fresh generation this one was reissued to (written once).
    pub successor: Option<CreditId>,
}

/// Where an operation's reserved atoms are.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum OpState {
    /// Reserved; the permit has never been exposed.
    Reserved,
    /// Dispatched: the gateway may have accepted it. Only evidence moves it on.
    Quarantined,
    /// Settled by a receipt: `charged` is committed, the rest went back to Available.
    Settled {
        /// The committed atoms.
        charged: Footprint,
        /// The receipt.
        receipt: Signed<Receipt>,
    },
    /// A fenced no-effect proof returned every atom to Available.
    NoEffect(Signed<NoEffect>),
    /// Released before it was ever dispatchable: every atom back to Available.
    Released,
    /// Retired: the atoms stay charged forever. A later receipt only annotates.
    Forfeited {
        /// A receipt that arrived after forfeiture (audit only).
        annotation: Option<Signed<Receipt>>,
    },
    /// Returned to Available without evidence — only the `RefundOnTimeout` mutant does this.
    #[doc(hidden)]
    Refunded,
}

impl OpState {
    /// `reserved`, `quarantined`, `settled`, `no_effect`, `released`, `forfeited` (or
    /// `refunded`, only under the mutant).
    pub fn name(&self) -> &'static str {
        match self {
            OpState::Reserved => "reserved",
            OpState::Quarantined => "quarantined",
            OpState::Settled { .. } => "settled",
            OpState::NoEffect(_) => "no_effect",
            OpState::Released => "released",
            OpState::Forfeited { .. } => "forfeited",
            OpState::Refunded => "refunded",
        }
    }
}

/// An operation: reserved atoms bound to one effect at one gateway.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Operation {
    /// The signed permit (its binding names everything).
    pub permit: Signed<Permit>,
    /// The binding (the permit's, as signed).
    pub binding: Binding,
    /// The effect it pays for.
    pub effect: Effect,
    /// The reserved atoms (their size is the maximum charge).
    pub footprint: Footprint,
    /// Where the atoms are.
    pub state: OpState,
    /// Whether the permit was ever made dispatchable.
    pub dispatched: bool,
    /// When it was last sent (for resends).
    pub sent_at: Option<UnixMillis>,
    /// `binding.digest()`, computed once: receipts, proofs and the checkpoint's summary
    /// name the binding by it.
    binding_digest: Digest,
}

impl Operation {
    /// The digest receipts and no-effect proofs must name (`Binding::digest`).
    pub fn binding_digest(&self) -> Digest {
        self.binding_digest
    }
}

/// A transfer this branch sealed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Outgoing {
    /// The signed certificate.
    pub cert: Signed<TransferCert>,
    /// Its body.
    pub body: TransferCert,
    /// What became of it.
    pub state: OutgoingState,
}

/// The source's view of a transfer.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum OutgoingState {
    /// Sealed, in transit: no decision yet. A timeout never decides.
    Sealed,
    /// The destination accepted it (its decision).
    Accepted(Signed<TransferDecision>),
    /// The destination refused it (its signed decision): the atoms came back.
    Cancelled(Signed<TransferDecision>),
    /// This branch reclaimed it before confirming any claim (only a certificate that asks for
    /// confirmation, [`TransferCert::confirm`]): the atoms came back, and the destination
    /// can never take them — its acceptance needs this branch's confirmation.
    Reclaimed(Signed<SourceDecision>),
}

/// A durable ledger step: each transition is one, applied atomically; replaying one that
/// already took effect changes nothing. Stored as deterministic CBOR.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case", deny_unknown_fields)]
pub enum Step {
    /// A root grant to this branch, held by `credit`.
    Grant {
        /// The issuer-signed grant.
        grant: Signed<RootGrant>,
        /// The root credit.
        credit: CreditId,
    },
    /// `amount` of `parent`'s available atoms become the new credit `child`.
    Split {
        /// The parent.
        parent: CreditId,
        /// The new credit.
        child: CreditId,
        /// How much.
        amount: Vector,
        /// The child's label (within the parent's).
        label: Label,
    },
    /// A transfer sealed: Available → InTransit.
    Seal {
        /// The signed certificate.
        cert: Signed<TransferCert>,
    },
    /// As destination: the transfer accepted once, creating `credit`.
    Accept {
        /// The source's certificate.
        cert: Signed<TransferCert>,
        /// The new credit.
        credit: CreditId,
        /// This branch's signed decision.
        decision: Signed<TransferDecision>,
        /// For a certificate that asks for it, the source's confirmation of this claim (the
        /// credit exists only with it).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        confirmation: Option<Signed<SourceDecision>>,
    },
    /// As destination of a certificate that asks for confirmation: this branch claims the
    /// transfer as `credit` (its signed acceptance, sent to the source) and waits for the
    /// source's decision. The atoms are still in transit: the credit is made by the `Accept`
    /// that carries the source's confirmation, or never, if the source reclaimed first.
    Claim {
        /// The source's certificate.
        cert: Signed<TransferCert>,
        /// The credit it would become.
        credit: CreditId,
        /// This branch's signed acceptance (the claim).
        decision: Signed<TransferDecision>,
    },
    /// As destination: the source reclaimed a transfer this branch claimed, before confirming
    /// it. The claim ends; the transfer is never taken.
    Reclaimed {
        /// The source's certificate.
        cert: Signed<TransferCert>,
        /// The source's signed reclaim.
        decision: Signed<SourceDecision>,
    },
    /// As destination: the transfer refused for good.
    Refuse {
        /// The source's certificate.
        cert: Signed<TransferCert>,
        /// This branch's signed decision.
        decision: Signed<TransferDecision>,
    },
    /// As source: the destination's decision arrived. For a certificate that asks for
    /// confirmation, an acceptance here is the source's confirmation of that claim (the
    /// compare-and-set: written once, and only while the transfer is still sealed).
    Decided {
        /// The signed decision.
        decision: Signed<TransferDecision>,
    },
    /// As source: a sealed transfer whose certificate asks for confirmation taken back before
    /// any claim was confirmed: InTransit → Available (paper §5.4: the destination is
    /// excluded, since it can accept only with a confirmation, and this step is the
    /// compare-and-set that decides the transfer).
    Reclaim {
        /// This branch's signed reclaim (a [`SourceDecision`] naming no credit).
        decision: Signed<SourceDecision>,
    },
    /// Available → Reserved, with the signed permit.
    Reserve {
        /// The permit.
        permit: Signed<Permit>,
        /// The effect.
        effect: Effect,
    },
    /// Reserved → Quarantined: the permit may now be exposed.
    Dispatch {
        /// The operation.
        key: OpKey,
    },
    /// Reserved → Available: the permit was never dispatchable.
    ReleaseUnsent {
        /// The operation.
        key: OpKey,
    },
    /// Quarantined → Committed (actual) + Available (remainder).
    Settle {
        /// The operation.
        key: OpKey,
        /// The gateway's receipt.
        receipt: Signed<Receipt>,
    },
    /// Quarantined → Available on a fenced no-effect proof.
    NoEffect {
        /// The operation.
        key: OpKey,
        /// The proof.
        proof: Signed<NoEffect>,
    },
    /// Quarantined → Forfeited.
    Forfeit {
        /// The operation.
        key: OpKey,
    },
    /// A receipt for a forfeited operation, kept for audit.
    Annotate {
        /// The operation.
        key: OpKey,
        /// The receipt.
        receipt: Signed<Receipt>,
    },
    /// Pairwise-disjoint, operation-free credits of one root consumed into `output`.
    Join {
        /// The inputs.
        inputs: Vec<CreditId>,
        /// The output.
        output: CreditId,
    },
    /// A gateway confirmed a fence: the credit's generation takes no new work; it closes
    /// (and is reissued) once its last operation ends.
    Fenced {
        /// The gateway's confirmation.
        fenced: Signed<Fenced>,
    },
    /// Terminal rollover (paper §5.7): `credit`'s generation closes and its available atoms
    /// become `successor`, one generation up, same root, label and epoch. Only a generation
    /// with nothing in progress (every operation ended, nothing in transit) closes; written
    /// once: the same step again is a replay, another successor is refused. With `last`, the
    /// fused terminal transition: the fenced generation's final open operation ends (a
    /// `Settle` or `NoEffect`) in the same commit, its remainder moving with the rest.
    Reissue {
        /// The closing generation.
        credit: CreditId,
        /// The fresh generation.
        successor: CreditId,
        /// The final operation's settlement or no-effect proof, fused into this step.
        last: Option<Box<Step>>,
    },
    /// The branch's whole state, signed by it ([`Branch::checkpoint`]): ended operations
    /// folded to summaries. First in a journal, recovery starts from it; the steps before it
    /// may be deleted.
    Checkpoint(Box<SignedRecord>),
    /// Quarantined → Available with no evidence (the `RefundOnTimeout` mutant only).
    #[doc(hidden)]
    Refund {
        /// The operation.
        key: OpKey,
    },
}

/// What a branch reports.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum LedgerEvent {
    /// An operation settled with this actual charge.
    Settled {
        /// The operation.
        key: OpKey,
        /// The actual charge.
        actual: Vector,
    },
    /// An operation proven to have had no effect.
    NoEffect {
        /// The operation.
        key: OpKey,
    },
    /// A gateway refused a permit (the atoms stay quarantined until a fenced proof).
    Refused {
        /// The operation.
        key: OpKey,
        /// Why.
        reason: Refusal,
    },
    /// A transfer this branch sent was accepted.
    TransferAccepted {
        /// The transfer.
        transfer: TransferId,
    },
    /// A transfer this branch sent was refused; its atoms came back.
    TransferCancelled {
        /// The transfer.
        transfer: TransferId,
    },
    /// A transfer this branch sent was reclaimed before any claim was confirmed; its atoms
    /// came back.
    TransferReclaimed {
        /// The transfer.
        transfer: TransferId,
    },
    /// A transfer to this branch was accepted as a new credit.
    CreditReceived {
        /// The new credit.
        credit: CreditId,
    },
    /// A generation closed and its available atoms moved to a fresh one.
    Reissued {
        /// The closed generation.
        credit: CreditId,
        /// The fresh generation.
        successor: CreditId,
    },
    /// A message that could not be used (bad signature, unknown object, mismatch).
    Rejected(LedgerError),
}

/// What a step not yet durable makes sendable again (see `Branch::in_flight`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
enum Undurable {
    /// A `Dispatch`: the permit.
    Dispatch(OpKey),
    /// A `Seal`: the certificate.
    Seal(TransferId),
    /// An `Accept`, `Refuse` or `Claim`: the destination's decision.
    Decision(RootId, TransferId),
    /// A `Decided` or `Reclaim`: the source's decision, which a claim is answered with.
    Outcome(TransferId),
}

/// One agent's ledger branch. See the crate docs for the buckets and transitions. Not
/// `Clone` (it owns credits); rebuild a copy from its journal with [`Branch::recover`].
#[derive(Debug)]
pub struct Branch {
    me: AgentId,
    key: LedgerSigningKey,
    keys: Keyring,
    config: BranchConfig,
    refusing: bool,
    roots: BTreeMap<RootId, RootGrant>,
    credits: BTreeMap<CreditId, Credit>,
    ops: BTreeMap<OpKey, Operation>,
    outgoing: BTreeMap<TransferId, Outgoing>,
    incoming: BTreeMap<(RootId, TransferId), Step>,
    /// The step that made each credit (grant, split, accept, join): a reused id with
    /// different content is refused, the same step again is a replay.
    origins: BTreeMap<CreditId, Step>,
    /// Operations a checkpoint folded (ended), by key: their keys stay taken until the
    /// gateway's horizon passes their expiry (see `horizons`).
    ended: BTreeMap<OpKey, EndedOp>,
    /// Per gateway, the instant before which it holds nothing of this branch's and takes
    /// nothing more ([`LedgerMessage::Horizon`]): a checkpoint forgets the ended operations
    /// at that gateway whose permits expired before it, and keeps the instants.
    horizons: BTreeMap<AgentId, UnixMillis>,
    /// Atoms committed by folded operations, per root.
    committed: BTreeMap<RootId, Footprint>,
    /// Journal steps folded into the checkpoint the journal starts with.
    folded_steps: u64,
    /// Resends of each sealed transfer (memory only; read by a mutant).
    resends: BTreeMap<TransferId, u32>,
    journal_len: u64,
    next_token: u64,
    persists: VecDeque<(PersistToken, Step)>,
    gated: BTreeMap<PersistToken, Vec<(AgentId, LedgerMessage)>>,
    /// Steps handed out and not yet durable that something may be sent again on: a
    /// dispatch, a seal, a transfer decision. Nothing is resent or repeated from memory
    /// until the step it rests on is durable (a crash could lose it after it went out).
    in_flight: BTreeMap<PersistToken, Undurable>,
    in_flight_by: BTreeMap<Undurable, PersistToken>,
    transmits: VecDeque<(AgentId, LedgerMessage)>,
    events: VecDeque<LedgerEvent>,
    last_resend: UnixMillis,
    /// Something may need sending again: set by every step applied, cleared by a
    /// `handle_timeout` that found nothing undecided. `poll_timeout` is `None` only when clear.
    resend_armed: bool,
    /// The latest time seen (reservations, timeouts, dispatches, messages): what a new
    /// permit's expiry counts from.
    clock: UnixMillis,
}

impl Branch {
    /// A fresh branch for `me`, signing with `key`, trusting `keys`.
    pub fn new(me: AgentId, key: LedgerSigningKey, keys: Keyring, config: BranchConfig) -> Self {
        Self {
            me,
            key,
            keys,
            config,
            refusing: false,
            roots: BTreeMap::new(),
            credits: BTreeMap::new(),
            ops: BTreeMap::new(),
            outgoing: BTreeMap::new(),
            incoming: BTreeMap::new(),
            origins: BTreeMap::new(),
            ended: BTreeMap::new(),
            horizons: BTreeMap::new(),
            committed: BTreeMap::new(),
            folded_steps: 0,
            resends: BTreeMap::new(),
            journal_len: 0,
            next_token: 0,
            persists: VecDeque::new(),
            gated: BTreeMap::new(),
            in_flight: BTreeMap::new(),
            in_flight_by: BTreeMap::new(),
            transmits: VecDeque::new(),
            events: VecDeque::new(),
            last_resend: UnixMillis(0),
            resend_armed: false,
            clock: UnixMillis(0),
        }
    }

    /// Moves the branch's clock to `now` (never back).
    fn observe(&mut self, now: UnixMillis) {
        self.clock = self.clock.max(now);
    }

    /// When [`handle_timeout`](Self::handle_timeout) is next due: the next resend tick while
    /// anything is undecided (a sealed transfer, an unanswered claim, a quarantined
    /// dispatch, a fenced generation not yet closed), `None` when nothing is. A deadline:
    /// nothing but `handle_timeout` moves it.
    pub fn poll_timeout(&self) -> Option<UnixMillis> {
        self.resend_armed
            .then(|| self.last_resend.saturating_add(self.config.resend_ms))
    }

    /// Rebuilds a branch from its durable steps, in order. A step that does not apply (a
    /// damaged or foreign journal) is skipped and returned, never trusted. Sealed transfers
    /// and dispatched permits are sent again at the first `handle_timeout`.
    pub fn recover(
        me: AgentId,
        key: LedgerSigningKey,
        keys: Keyring,
        config: BranchConfig,
        steps: impl IntoIterator<Item = Step>,
    ) -> (Self, Vec<(Step, LedgerError)>) {
        let mut b = Self::new(me, key, keys, config);
        let mut rejected = Vec::new();
        for s in steps {
            match b.apply(&s) {
                Ok(true) => b.journal_len += 1,
                Ok(false) => {}
                Err(e) => rejected.push((s, e)),
            }
        }
        b.resend_armed = true;
        (b, rejected)
    }

    /// Rebuilds a branch from its journal for an audit, with public keys only: the journal is
    /// replayed with every signature it relies on verified, and the branch it yields never
    /// signs anything (it holds an inert key no keyring trusts). Returns the steps that do not
    /// apply.
    pub fn replay(
        me: AgentId,
        keys: Keyring,
        steps: impl IntoIterator<Item = Step>,
    ) -> (Self, Vec<(Step, LedgerError)>) {
        Self::recover(me, inert_key(), keys, BranchConfig::default(), steps)
    }

    /// This branch's agent.
    pub fn agent(&self) -> &AgentId {
        &self.me
    }

    /// The keyring this branch trusts; a clone shares its memory of verified signatures, so
    /// messages verified together through it ([`Keyring::verify_together`]) are not verified
    /// again when handled.
    pub fn keyring(&self) -> &Keyring {
        &self.keys
    }

    /// Refuse (`true`) or accept incoming transfers from now on.
    pub fn set_refusing(&mut self, refusing: bool) {
        self.refusing = refusing;
    }

    // -----------------------------------------------------------------------------------
    // Transitions started here

    /// Takes a root grant: its full atoms become the credit `credit`.
    pub fn grant(&mut self, grant: Signed<RootGrant>, credit: CreditId) -> Result<(), LedgerError> {
        self.room()?;
        self.commit(Step::Grant { grant, credit }, Vec::new())
    }

    /// A root grant this branch may hold: signed by a trusted issuer, held by this branch.
    /// Checked on every apply, so a journal replayed at recovery or by an audit is too.
    fn verified_grant(&self, grant: &Signed<RootGrant>) -> Result<RootGrant, LedgerError> {
        let body = grant.peek()?;
        if !self.keys.is_issuer(&body.issuer) {
            return Err(LedgerError::Signature(SignatureError::UnexpectedSigner(
                body.issuer,
            )));
        }
        let body = self.keys.open(grant, &body.issuer)?;
        if body.holder != self.me {
            return Err(LedgerError::WrongState("grant held by another branch"));
        }
        Ok(body)
    }

    /// Splits `amount` of `parent`'s available atoms into a new credit `child` with `label`.
    pub fn split(
        &mut self,
        parent: CreditId,
        child: CreditId,
        amount: Vector,
        label: Label,
    ) -> Result<(), LedgerError> {
        self.room()?;
        self.commit(
            Step::Split {
                parent,
                child,
                amount,
                label,
            },
            Vec::new(),
        )
    }

    /// Seals a transfer of `amount` from `credit` to `destination`: Available → InTransit,
    /// durable before the certificate is sent. The destination's decision is final: the atoms
    /// come back only on its signed refusal.
    pub fn transfer(
        &mut self,
        credit: CreditId,
        transfer: TransferId,
        amount: &Vector,
        destination: &AgentId,
        label: Label,
    ) -> Result<(), LedgerError> {
        self.seal(credit, transfer, amount, destination, label, false)
    }

    /// Seals a transfer the way [`Branch::transfer`] does, with a certificate that asks for
    /// this branch's confirmation ([`TransferCert::confirm`]): the destination claims it, and
    /// only the confirmation that answers its claim makes the atoms its. Until this branch
    /// has confirmed a claim it may take the transfer back with
    /// [`Branch::reclaim_transfer`] — for a destination that is lost, without a word from
    /// it. The price is one more message before the destination can spend.
    pub fn transfer_reclaimable(
        &mut self,
        credit: CreditId,
        transfer: TransferId,
        amount: &Vector,
        destination: &AgentId,
        label: Label,
    ) -> Result<(), LedgerError> {
        self.seal(credit, transfer, amount, destination, label, true)
    }

    fn seal(
        &mut self,
        credit: CreditId,
        transfer: TransferId,
        amount: &Vector,
        destination: &AgentId,
        label: Label,
        confirm: bool,
    ) -> Result<(), LedgerError> {
        if let Some(out) = self.outgoing.get(&transfer) {
            let same = out.body.source_credit == credit
                && &out.body.destination == destination
                && out.body.label == label
                && out.body.confirm == confirm
                && &out.body.footprint.size() == amount;
            return if same {
                Ok(())
            } else {
                Err(LedgerError::IdInUse("transfer"))
            };
        }
        self.room()?;
        let c = self.working_credit(credit)?;
        if !label.within(&c.label) {
            return Err(LedgerError::LabelNotAttenuated);
        }
        let (taken, _) = take(c, amount)?;
        let body = TransferCert {
            root: c.root,
            transfer,
            source: self.me.clone(),
            destination: destination.clone(),
            source_credit: credit,
            footprint: taken,
            label,
            confirm,
        };
        body.validate_as_cert()?;
        let cert = Signed::sign(&body, &self.me, &self.key);
        self.commit(
            Step::Seal { cert: cert.clone() },
            vec![(destination.clone(), LedgerMessage::Transfer(cert))],
        )
    }

    /// Takes back a transfer sealed with [`Branch::transfer_reclaimable`] whose destination
    /// has not had a claim confirmed — typically one that is lost: InTransit → Available in
    /// one durable step, after which the destination's claim, if it ever comes, is answered
    /// with this reclaim and never confirmed. Asking again is answered as done. Refused for a
    /// transfer whose claim was confirmed (the atoms are the destination's: only a return,
    /// §6.9, brings them back) and for one whose certificate does not ask for confirmation
    /// (its destination decides alone, so only its refusal gives the atoms back).
    pub fn reclaim_transfer(&mut self, transfer: TransferId) -> Result<(), LedgerError> {
        let out = self
            .outgoing
            .get(&transfer)
            .ok_or(LedgerError::UnknownTransfer(transfer))?;
        if !out.body.confirm {
            return Err(LedgerError::WrongState(
                "the transfer's destination decides alone: only its refusal gives the atoms back",
            ));
        }
        match &out.state {
            OutgoingState::Sealed => {}
            OutgoingState::Reclaimed(_) | OutgoingState::Cancelled(_) => return Ok(()),
            OutgoingState::Accepted(_)
                if self.config.mutation == Some(LedgerMutation::ReclaimAfterConfirm) => {}
            OutgoingState::Accepted(_) => {
                return Err(LedgerError::WrongState(
                    "the destination's claim was confirmed: the atoms are its",
                ))
            }
        }
        let decision = self.source_decision(&out.body, None);
        let (to, credit) = (out.body.destination.clone(), out.body.source_credit);
        self.commit(
            Step::Reclaim {
                decision: decision.clone(),
            },
            vec![(to, LedgerMessage::SourceDecision(decision))],
        )?;
        self.roll_if_done(credit)
    }

    /// This branch's signed decision on a transfer it sealed (deterministic: the same
    /// decision signs to the same bytes, so answering a repeated claim needs no record).
    fn source_decision(
        &self,
        cert: &TransferCert,
        credit: Option<CreditId>,
    ) -> Signed<SourceDecision> {
        let d = SourceDecision {
            root: cert.root,
            transfer: cert.transfer,
            cert: cert.digest(),
            source: cert.source.clone(),
            destination: cert.destination.clone(),
            credit,
        };
        Signed::sign(&d, &self.me, &self.key)
    }

    /// Reserves `effect`'s maximum charge from `credit` for gateway `receiver` at `now`:
    /// Available → Reserved, with the signed permit in the same step (it expires
    /// `permit_ttl_ms` after `now`, or after the latest time the branch has seen if that is
    /// later). Nothing is sent.
    pub fn reserve(
        &mut self,
        now: UnixMillis,
        credit: CreditId,
        effect: Effect,
        receiver: &AgentId,
        key: OpKey,
    ) -> Result<(), LedgerError> {
        if let Some(op) = self.ops.get(&key) {
            // The same request again is answered as done; another under the same key is
            // refused (the permit it would sign differs, so it could never be a replay).
            let same = op.effect == effect
                && op.binding.credit == credit
                && &op.binding.receiver == receiver;
            return if same {
                Ok(())
            } else {
                Err(LedgerError::IdInUse("operation key"))
            };
        }
        self.room()?;
        self.observe(now);
        let c = self.working_credit(credit)?;
        if !c.label.allows(&effect.purpose) {
            return Err(LedgerError::PurposeNotAllowed);
        }
        let escrow = if self.config.mutation == Some(LedgerMutation::ReserveBelowMaximum) {
            one_short(&effect.max_charge)
        } else {
            effect.max_charge.clone()
        };
        let (footprint, _) = take(c, &escrow)?;
        let binding = Binding {
            root: c.root,
            credit,
            generation: c.generation,
            epoch: c.epoch,
            effect: effect.digest(),
            receiver: receiver.clone(),
            max_charge: effect.max_charge.clone(),
            key,
            payer: self.me.clone(),
            expires: (self.config.permit_ttl_ms > 0)
                .then(|| UnixMillis(self.clock.0.saturating_add(self.config.permit_ttl_ms))),
        };
        let body = Permit { binding, footprint };
        let permit = Signed::sign(&body, &self.me, &self.key);
        // The permit was built here from `effect`: apply need not decode it again, nor
        // recompute the effect's digest it was built from.
        self.commit_known(Step::Reserve { permit, effect }, Vec::new(), Some(body))
    }

    /// Reserved → Quarantined, durable before the permit goes to the gateway.
    pub fn dispatch(&mut self, now: UnixMillis, key: OpKey) -> Result<(), LedgerError> {
        self.observe(now);
        let op = self
            .ops
            .get(&key)
            .ok_or(LedgerError::UnknownOperation(key))?;
        let msg = (
            op.binding.receiver.clone(),
            LedgerMessage::Dispatch {
                permit: op.permit.clone(),
                effect: op.effect.clone(),
            },
        );
        self.commit(Step::Dispatch { key }, vec![msg])?;
        if let Some(op) = self.ops.get_mut(&key) {
            op.sent_at = Some(now);
        }
        Ok(())
    }

    /// Reserved → Available: allowed only while the permit was never dispatchable.
    pub fn release_unsent(&mut self, key: OpKey) -> Result<(), LedgerError> {
        self.commit(Step::ReleaseUnsent { key }, Vec::new())?;
        self.roll_if_done_for(key)
    }

    /// Quarantined → Forfeited: the atoms stay charged for good.
    pub fn forfeit(&mut self, key: OpKey) -> Result<(), LedgerError> {
        self.commit(Step::Forfeit { key }, Vec::new())?;
        self.roll_if_done_for(key)
    }

    /// Terminal rollover (paper §5.7): closes `credit`'s generation and moves its available
    /// atoms into a fresh generation — a new credit, one generation up, same root, label and
    /// epoch — in one durable step. Only a generation with nothing in progress rolls over:
    /// every operation ended (settled, no effect, released or forfeited: committed and
    /// forfeited atoms stay where they are) and no transfer of it undecided. The decision is
    /// written once: asking again returns the same successor. A fenced generation (after
    /// [`Branch::request_fence`]) rolls over by itself once its last operation ends.
    pub fn reissue(&mut self, credit: CreditId) -> Result<CreditId, LedgerError> {
        let c = self
            .credits
            .get(&credit)
            .ok_or(LedgerError::UnknownCredit(credit))?;
        if let Some(successor) = c.successor {
            return Ok(successor);
        }
        let successor = derive_successor(&self.me, credit, c.generation);
        self.commit(
            Step::Reissue {
                credit,
                successor,
                last: None,
            },
            Vec::new(),
        )?;
        Ok(successor)
    }

    /// Returns `credit`'s unused rights to the agent they came from (paper §6.9): a sealed
    /// transfer of everything available in `credit` to the source of the transfer that
    /// created its lineage (followed back through reissues), labelled with `credit`'s own
    /// label — never broader than what was received. `transfer` is the stable return id: the
    /// same return asked again is answered as done and sends nothing new (the certificate is
    /// resent until the source decides, like any transfer). Operations still in progress stay
    /// charged where they are; their remainders can be returned later under another id.
    pub fn return_rights(
        &mut self,
        credit: CreditId,
        transfer: TransferId,
    ) -> Result<(), LedgerError> {
        let source = self.lineage_source(credit)?;
        if let Some(out) = self.outgoing.get(&transfer) {
            return if out.body.source_credit == credit && out.body.destination == source {
                Ok(())
            } else {
                Err(LedgerError::IdInUse("transfer"))
            };
        }
        let c = self.working_credit(credit)?;
        if c.available.is_empty() {
            return Err(LedgerError::WrongState("nothing available to return"));
        }
        let (amount, label) = (c.available.size(), c.label.clone());
        self.transfer(credit, transfer, &amount, &source, label)
    }

    /// The agent whose transfer started `credit`'s lineage (through reissues).
    fn lineage_source(&self, credit: CreditId) -> Result<AgentId, LedgerError> {
        let mut id = credit;
        for _ in 0..=self.origins.len() {
            match self.origins.get(&id) {
                Some(Step::Accept { cert, .. }) => return Ok(cert.peek()?.source),
                Some(Step::Reissue { credit, .. }) => id = *credit,
                Some(_) => break,
                None => return Err(LedgerError::UnknownCredit(credit)),
            }
        }
        Err(LedgerError::WrongState(
            "only rights received by transfer return to their source",
        ))
    }

    /// The live generation of `credit`'s lineage: `credit` itself, or the generation it was
    /// reissued to (followed to the end). `None` for an unknown credit or one joined away.
    pub fn current(&self, credit: CreditId) -> Option<CreditId> {
        let mut id = credit;
        // Each step moves to a credit made after it, so the chain ends; bounded anyway.
        for _ in 0..=self.credits.len() {
            let c = self.credits.get(&id)?;
            match c.successor {
                Some(next) => id = next,
                None => return (!c.closed).then_some(id),
            }
        }
        None
    }

    /// Joins pairwise-disjoint, operation-free credits of one root into `output`.
    pub fn join(&mut self, inputs: Vec<CreditId>, output: CreditId) -> Result<(), LedgerError> {
        self.room()?;
        self.commit(Step::Join { inputs, output }, Vec::new())
    }

    /// Asks every gateway that holds a dispatch of `credit` that is still quarantined to
    /// fence the credit's current epoch. Once confirmed, permits at older epochs are refused
    /// and queries about never-accepted ones come back as no-effect proofs.
    pub fn request_fence(&mut self, credit: CreditId) -> Result<(), LedgerError> {
        let c = self.live_credit(credit)?;
        let fence = Fence {
            root: c.root,
            credit,
            epoch: c.epoch.checked_add(1).ok_or(LedgerError::Overflow)?,
            holder: self.me.clone(),
        };
        let gateways: BTreeSet<AgentId> = self
            .ops
            .values()
            .filter(|o| o.binding.credit == credit && o.state == OpState::Quarantined)
            .map(|o| o.binding.receiver.clone())
            .collect();
        let signed = Signed::sign(&fence, &self.me, &self.key);
        for g in gateways {
            self.transmits
                .push_back((g, LedgerMessage::Fence(signed.clone())));
        }
        Ok(())
    }

    // -----------------------------------------------------------------------------------
    // Input

    /// Handles a message from `from`. Bad messages are reported as events, never applied.
    pub fn handle_message(&mut self, now: UnixMillis, from: &AgentId, msg: LedgerMessage) {
        self.observe(now);
        if let Err(e) = self.on_message(now, from, msg) {
            self.events.push_back(LedgerEvent::Rejected(e));
        }
    }

    fn on_message(
        &mut self,
        _now: UnixMillis,
        from: &AgentId,
        msg: LedgerMessage,
    ) -> Result<(), LedgerError> {
        // The session proves who sent a message; evidence must also be signed by the party it
        // is about (SPEC: evidence binds its signer). The signature itself is verified where
        // the step is applied, which is also where a journal replays it at recovery.
        match msg {
            LedgerMessage::Transfer(cert) => self.on_transfer(from, cert),
            LedgerMessage::Decision(decision) => {
                let d = decision.peek()?;
                let Some(out) = self.outgoing.get(&d.transfer) else {
                    return Err(LedgerError::UnknownTransfer(d.transfer));
                };
                self.party("a transfer decision", from, &out.body.destination)?;
                if out.body.confirm {
                    return self.on_claim(from, decision, d);
                }
                if out.state != OutgoingState::Sealed {
                    return Ok(()); // Already decided: a repeat.
                }
                let credit = out.body.source_credit;
                self.commit(Step::Decided { decision }, Vec::new())?;
                self.roll_if_done(credit)
            }
            LedgerMessage::SourceDecision(decision) => self.on_source_decision(from, decision),
            LedgerMessage::Receipt(receipt) => {
                let r = receipt.peek()?;
                if self.ended.contains_key(&r.key) {
                    return Ok(()); // Ended and folded: a repeat.
                }
                let op = self
                    .ops
                    .get(&r.key)
                    .ok_or(LedgerError::UnknownOperation(r.key))?;
                self.party("a receipt", from, &op.binding.receiver)?;
                match op.state {
                    OpState::Quarantined => self.end_operation(
                        r.key,
                        Step::Settle {
                            key: r.key,
                            receipt,
                        },
                    ),
                    OpState::Forfeited { annotation: None }
                        if self.config.mutation
                            == Some(LedgerMutation::UnforfeitOnLateEvidence) =>
                    {
                        self.commit(
                            Step::Settle {
                                key: r.key,
                                receipt,
                            },
                            Vec::new(),
                        )
                    }
                    OpState::Forfeited { annotation: None } => self.commit(
                        Step::Annotate {
                            key: r.key,
                            receipt,
                        },
                        Vec::new(),
                    ),
                    _ => Ok(()), // A repeat, or evidence that came too late to matter.
                }
            }
            LedgerMessage::NoEffect(proof) => {
                let p = proof.peek()?;
                if self.ended.contains_key(&p.key) {
                    return Ok(()); // Ended and folded: a repeat.
                }
                let op = self
                    .ops
                    .get(&p.key)
                    .ok_or(LedgerError::UnknownOperation(p.key))?;
                self.party("a no-effect proof", from, &op.binding.receiver)?;
                if op.state != OpState::Quarantined {
                    return Ok(());
                }
                self.end_operation(p.key, Step::NoEffect { key: p.key, proof })
            }
            LedgerMessage::Refused { key, reason } => {
                // Only an event: a refusal is unsigned and names a key, not the dispatch it
                // answers — a copy of the permit with another effect attached (on the path)
                // is refused under the same key — so it never stops the resends.
                self.events.push_back(LedgerEvent::Refused { key, reason });
                Ok(())
            }
            LedgerMessage::Pending { .. } => Ok(()),
            LedgerMessage::Horizon { horizon } => {
                // Only a gateway this branch pays through speaks for its own log; the next
                // checkpoint forgets what the instant covers.
                let pays_there = self.ended.values().any(|e| &e.receiver == from)
                    || self.ops.values().any(|o| &o.binding.receiver == from);
                if !pays_there {
                    return Err(LedgerError::WrongState(
                        "a horizon from an agent this branch never paid through",
                    ));
                }
                self.raise_horizon(from, horizon);
                Ok(())
            }
            LedgerMessage::Fenced(fenced) => {
                let f = fenced.peek()?;
                self.party("a fenced reply", from, &f.gateway)?;
                let c = self
                    .credits
                    .get(&f.credit)
                    .ok_or(LedgerError::UnknownCredit(f.credit))?;
                if f.epoch <= c.epoch {
                    return Ok(());
                }
                // Ask right away about every quarantined dispatch below the new fence.
                let queries: Vec<_> = self
                    .ops
                    .values()
                    .filter(|o| {
                        o.state == OpState::Quarantined
                            && o.binding.credit == f.credit
                            && &o.binding.receiver == from
                    })
                    .map(|o| {
                        (
                            from.clone(),
                            LedgerMessage::Query {
                                key: o.binding.key,
                                binding: Box::new(o.binding.clone()),
                            },
                        )
                    })
                    .collect();
                let credit = f.credit;
                self.commit(Step::Fenced { fenced }, queries)?;
                self.roll_if_done(credit)
            }
            LedgerMessage::Dispatch { .. }
            | LedgerMessage::Query { .. }
            | LedgerMessage::Fence(_) => Err(LedgerError::WrongState(
                "a gateway message sent to a branch",
            )),
        }
    }

    /// `from` must be `expected`: the party a piece of evidence is about.
    fn party(
        &self,
        what: &'static str,
        from: &AgentId,
        expected: &AgentId,
    ) -> Result<(), LedgerError> {
        if from == expected || self.config.mutation == Some(LedgerMutation::EvidenceFromAnyMember) {
            return Ok(());
        }
        Err(LedgerError::WrongParty {
            what,
            expected: expected.clone(),
            signer: from.clone(),
        })
    }

    /// Opens evidence that must be signed by `expected`: the signature verified with the
    /// keyring, the signer checked (at every apply, so also when a journal is replayed).
    fn evidence<T: SignedObject>(
        &self,
        what: &'static str,
        signed: &Signed<T>,
        expected: &AgentId,
    ) -> Result<T, LedgerError> {
        let lax = match self.config.mutation {
            Some(LedgerMutation::EvidenceFromAnyMember) => true,
            Some(LedgerMutation::CancelTransferOnTimeout) => what == "a transfer decision",
            _ => false,
        };
        let signer = if lax { &signed.signer } else { expected };
        if &signed.signer != signer {
            return Err(LedgerError::WrongParty {
                what,
                expected: expected.clone(),
                signer: signed.signer.clone(),
            });
        }
        Ok(self.keys.open(signed, signer)?)
    }

    /// As source of a certificate that asks for confirmation: the destination's decision is
    /// a claim (or a refusal). A claim on a sealed transfer is confirmed — the compare-and-set
    /// — and answered; a repeated one gets the same answer; a claim on a reclaimed transfer
    /// gets the reclaim.
    fn on_claim(
        &mut self,
        from: &AgentId,
        decision: Signed<TransferDecision>,
        d: TransferDecision,
    ) -> Result<(), LedgerError> {
        let out = &self.outgoing[&d.transfer];
        let answer = match &out.state {
            OutgoingState::Sealed => {
                let credit = out.body.source_credit;
                let reply = match d.credit {
                    Some(c) => vec![(
                        from.clone(),
                        LedgerMessage::SourceDecision(self.source_decision(&out.body, Some(c))),
                    )],
                    None => Vec::new(), // A refusal: the atoms come back, nothing to answer.
                };
                self.commit(Step::Decided { decision }, reply)?;
                return self.roll_if_done(credit);
            }
            OutgoingState::Accepted(prior) => {
                let confirmed = prior.peek()?.credit;
                if confirmed != d.credit {
                    return Err(LedgerError::Mismatch(
                        "a claim other than the one confirmed",
                    ));
                }
                self.source_decision(&out.body, confirmed)
            }
            OutgoingState::Reclaimed(r) => r.clone(),
            OutgoingState::Cancelled(_) => return Ok(()),
        };
        let reply = (from.clone(), LedgerMessage::SourceDecision(answer));
        // Not before the decision it repeats is durable.
        match self.in_flight_by.get(&Undurable::Outcome(d.transfer)) {
            Some(t) => self.gated.entry(*t).or_default().push(reply),
            None => self.transmits.push_back(reply),
        }
        Ok(())
    }

    /// As destination: the source's answer to this branch's claim — its confirmation (the
    /// credit is made) or its reclaim (the claim ends, nothing is taken).
    fn on_source_decision(
        &mut self,
        from: &AgentId,
        decision: Signed<SourceDecision>,
    ) -> Result<(), LedgerError> {
        let d = decision.peek()?;
        self.party("a source decision", from, &d.source)?;
        let Some(Step::Claim {
            cert,
            credit,
            decision: claim,
        }) = self.incoming.get(&(d.root, d.transfer))
        else {
            return Ok(()); // Not claimed, or already settled: nothing waits for it.
        };
        let (cert, credit, claim) = (cert.clone(), *credit, claim.clone());
        if d.credit.is_some() {
            self.commit(
                Step::Accept {
                    cert,
                    credit,
                    decision: claim,
                    confirmation: Some(decision),
                },
                Vec::new(),
            )?;
            self.events
                .push_back(LedgerEvent::CreditReceived { credit });
            Ok(())
        } else {
            self.commit(Step::Reclaimed { cert, decision }, Vec::new())
        }
    }

    fn on_transfer(
        &mut self,
        from: &AgentId,
        cert: Signed<TransferCert>,
    ) -> Result<(), LedgerError> {
        let body = cert.peek()?;
        self.party("a transfer certificate", from, &body.source)?;
        let body = self.evidence("a transfer certificate", &cert, &body.source)?;
        if body.destination != self.me {
            return Err(LedgerError::Mismatch(
                "transfer addressed to another branch",
            ));
        }
        let replay = self.config.mutation == Some(LedgerMutation::AcceptReplayedTransfer);
        if let Some(prior) = self.incoming.get(&(body.root, body.transfer)) {
            if !replay {
                // Decided before: answer with the same decision.
                let decision = match prior {
                    Step::Accept { decision, .. }
                    | Step::Refuse { decision, .. }
                    | Step::Claim { decision, .. } => decision.clone(),
                    _ => return Ok(()), // Reclaimed: the source decided already.
                };
                let reply = (from.clone(), LedgerMessage::Decision(decision));
                // Not before the decision is durable: a crash could lose it after the source
                // acted on it.
                match self
                    .in_flight_by
                    .get(&Undurable::Decision(body.root, body.transfer))
                {
                    Some(t) => self.gated.entry(*t).or_default().push(reply),
                    None => self.transmits.push_back(reply),
                }
                return Ok(());
            }
        }
        let credit = derive_credit_id(&self.me, body.root, body.transfer, self.journal_len);
        let refuse = self.refusing || self.room().is_err();
        let d = TransferDecision {
            root: body.root,
            transfer: body.transfer,
            cert: body.digest(),
            source: body.source.clone(),
            destination: self.me.clone(),
            credit: (!refuse).then_some(credit),
        };
        let decision = Signed::sign(&d, &self.me, &self.key);
        let reply = vec![(from.clone(), LedgerMessage::Decision(decision.clone()))];
        let wait = self.config.mutation != Some(LedgerMutation::AcceptWithoutConfirmation);
        if refuse {
            self.commit(Step::Refuse { cert, decision }, reply)
        } else if body.confirm && wait {
            // A claim: the credit is made only when the source confirms it.
            self.commit(
                Step::Claim {
                    cert,
                    credit,
                    decision,
                },
                reply,
            )
        } else {
            self.commit(
                Step::Accept {
                    cert,
                    credit,
                    decision,
                    confirmation: None,
                },
                reply,
            )?;
            self.events
                .push_back(LedgerEvent::CreditReceived { credit });
            Ok(())
        }
    }

    /// Sends again what is still undecided: sealed transfers and quarantined dispatches
    /// (the gateway answers a repeated key with its prior decision). Never refunds.
    pub fn handle_timeout(&mut self, now: UnixMillis) {
        self.observe(now);
        if now.0 < self.last_resend.0.saturating_add(self.config.resend_ms) {
            return;
        }
        self.last_resend = now;
        self.resend(now);
        self.resend_armed =
            self.undecided() && self.config.mutation != Some(LedgerMutation::TimerNotRearmed);
    }

    /// Whether anything [`resend`](Self::resend) looks at is still undecided.
    fn undecided(&self) -> bool {
        self.credits.values().any(|c| c.fenced && !c.closed)
            || self
                .outgoing
                .values()
                .any(|o| o.state == OutgoingState::Sealed)
            || self
                .incoming
                .values()
                .any(|s| matches!(s, Step::Claim { .. }))
            || self.ops.values().any(|o| o.state == OpState::Quarantined)
    }

    fn resend(&mut self, now: UnixMillis) {
        // A fenced generation whose last operation ended before a crash (the reissue not yet
        // written) closes now.
        let fenced: Vec<CreditId> = self
            .credits
            .values()
            .filter(|c| c.fenced && !c.closed)
            .map(|c| c.id)
            .collect();
        for credit in fenced {
            let _ = self.roll_if_done(credit);
        }
        let mut give_up = Vec::new();
        for out in self.outgoing.values() {
            if out.state == OutgoingState::Sealed
                && !self
                    .in_flight_by
                    .contains_key(&Undurable::Seal(out.body.transfer))
            {
                self.transmits.push_back((
                    out.body.destination.clone(),
                    LedgerMessage::Transfer(out.cert.clone()),
                ));
                let n = self.resends.entry(out.body.transfer).or_insert(0);
                *n += 1;
                if self.config.mutation == Some(LedgerMutation::CancelTransferOnTimeout) && *n > 2 {
                    give_up.push(TransferDecision {
                        root: out.body.root,
                        transfer: out.body.transfer,
                        cert: out.body.digest(),
                        source: out.body.source.clone(),
                        destination: out.body.destination.clone(),
                        credit: None,
                    });
                }
            }
        }
        for d in give_up {
            let decision = Signed::sign(&d, &self.me, &self.key);
            let _ = self.commit(Step::Decided { decision }, Vec::new());
        }
        // Claims the source has not answered (its answer may have been lost).
        for ((root, transfer), step) in &self.incoming {
            if let Step::Claim { cert, decision, .. } = step {
                if self
                    .in_flight_by
                    .contains_key(&Undurable::Decision(*root, *transfer))
                {
                    continue;
                }
                if let Ok(c) = cert.peek() {
                    self.transmits
                        .push_back((c.source, LedgerMessage::Decision(decision.clone())));
                }
            }
        }
        let mut refunds = Vec::new();
        for (key, op) in &mut self.ops {
            if op.state != OpState::Quarantined
                || self.in_flight_by.contains_key(&Undurable::Dispatch(*key))
            {
                continue;
            }
            let stale = op
                .sent_at
                .is_some_and(|t| now.0 >= t.0.saturating_add(self.config.resend_ms));
            if self.config.mutation == Some(LedgerMutation::RefundOnTimeout) && stale {
                refunds.push(*key);
                continue;
            }
            if op.sent_at.is_some() && !stale {
                continue; // Sent less than a resend period ago.
            }
            op.sent_at = Some(now);
            let fenced = self
                .credits
                .get(&op.binding.credit)
                .is_some_and(|c| c.epoch > op.binding.epoch);
            let msg = if fenced {
                // The gateway refuses this permit now; ask what became of it instead.
                LedgerMessage::Query {
                    key: *key,
                    binding: Box::new(op.binding.clone()),
                }
            } else {
                LedgerMessage::Dispatch {
                    permit: op.permit.clone(),
                    effect: op.effect.clone(),
                }
            };
            self.transmits.push_back((op.binding.receiver.clone(), msg));
        }
        for key in refunds {
            let _ = self.commit(Step::Refund { key }, Vec::new());
        }
    }

    /// Queries the gateway about a quarantined operation (reconciliation).
    pub fn query(&mut self, key: OpKey) -> Result<(), LedgerError> {
        let op = self
            .ops
            .get(&key)
            .ok_or(LedgerError::UnknownOperation(key))?;
        self.transmits.push_back((
            op.binding.receiver.clone(),
            LedgerMessage::Query {
                key,
                binding: Box::new(op.binding.clone()),
            },
        ));
        Ok(())
    }

    // -----------------------------------------------------------------------------------
    // Output

    /// The next step to make durable.
    pub fn poll_persist(&mut self) -> Option<(PersistToken, Step)> {
        if self.checkpoint_due() {
            // Folding cannot fail on a consistent state; if it did, the journal simply
            // stays long and the next poll tries again.
            let _ = self.checkpoint();
        }
        self.persists.pop_front()
    }

    /// Whether the journal has grown enough for a checkpoint (`checkpoint_steps`).
    fn checkpoint_due(&self) -> bool {
        let every = self.config.checkpoint_steps;
        let rows = self.ops.len()
            + self.ended.len()
            + self.credits.len()
            + self.outgoing.len()
            + self.incoming.len();
        every > 0 && self.journal_len >= every.max(rows as u64 / 2)
    }

    /// `token`'s step is durable: release what waited for it.
    pub fn handle_persisted(&mut self, token: PersistToken) {
        if let Some(msgs) = self.gated.remove(&token) {
            self.transmits.extend(msgs);
        }
        if let Some(k) = self.in_flight.remove(&token) {
            if self.in_flight_by.get(&k) == Some(&token) {
                self.in_flight_by.remove(&k);
            }
        }
    }

    /// The next message to send.
    pub fn poll_transmit(&mut self) -> Option<(AgentId, LedgerMessage)> {
        self.transmits.pop_front()
    }

    /// The next event.
    pub fn poll_event(&mut self) -> Option<LedgerEvent> {
        self.events.pop_front()
    }

    // -----------------------------------------------------------------------------------
    // State

    /// Credits (closed ones included).
    pub fn credits(&self) -> impl Iterator<Item = &Credit> {
        self.credits.values()
    }

    /// One credit.
    pub fn credit(&self, id: CreditId) -> Option<&Credit> {
        self.credits.get(&id)
    }

    /// Operations.
    pub fn operations(&self) -> impl Iterator<Item = &Operation> {
        self.ops.values()
    }

    /// One operation.
    pub fn operation(&self, key: OpKey) -> Option<&Operation> {
        self.ops.get(&key)
    }

    /// Transfers this branch sealed.
    pub fn outgoing(&self) -> impl Iterator<Item = &Outgoing> {
        self.outgoing.values()
    }

    /// Decisions on transfers to this branch: the step that decided each.
    pub fn incoming(&self) -> impl Iterator<Item = &Step> {
        self.incoming.values()
    }

    /// Root grants held here.
    pub fn roots(&self) -> impl Iterator<Item = &RootGrant> {
        self.roots.values()
    }

    /// Steps applied so far (replays excluded).
    pub fn journal_len(&self) -> u64 {
        self.journal_len
    }

    /// The six buckets' sizes for `root` as seen from this branch: (available, in transit,
    /// reserved, quarantined, committed, forfeited).
    pub fn buckets(&self, root: RootId) -> [Vector; 6] {
        let mut b: [Vector; 6] = Default::default();
        let mut add = |i: usize, f: &Footprint| {
            b[i] = b[i].checked_add(&f.size()).unwrap_or_else(|| b[i].clone());
        };
        for c in self
            .credits
            .values()
            .filter(|c| c.root == root && !c.closed)
        {
            add(0, &c.available);
        }
        for o in self.outgoing.values().filter(|o| o.body.root == root) {
            if o.state == OutgoingState::Sealed {
                add(1, &o.body.footprint);
            }
        }
        for o in self.ops.values().filter(|o| o.binding.root == root) {
            match &o.state {
                OpState::Reserved => add(2, &o.footprint),
                OpState::Quarantined => add(3, &o.footprint),
                OpState::Settled { charged, .. } => add(4, charged),
                OpState::Forfeited { .. } => add(5, &o.footprint),
                _ => {}
            }
        }
        if let Some(f) = self.committed.get(&root) {
            add(4, f);
        }
        b
    }

    // -----------------------------------------------------------------------------------
    // Applying steps

    /// A credit-making step whose credit exists: a replay if the same step made it, else a
    /// reused id (paper §5.7: a reused id with different content is refused).
    fn replayed(
        &self,
        credit: &CreditId,
        step: &Step,
        what: &'static str,
    ) -> Result<bool, LedgerError> {
        if self.origins.get(credit) == Some(step) {
            Ok(false)
        } else {
            Err(LedgerError::IdInUse(what))
        }
    }

    /// Whether the journal has room for new work (`BranchConfig::max_journal_steps`).
    fn room(&self) -> Result<(), LedgerError> {
        let limit = self.config.max_journal_steps;
        if self.journal_len >= limit {
            return Err(LedgerError::JournalFull { limit });
        }
        Ok(())
    }

    fn live_credit(&self, id: CreditId) -> Result<&Credit, LedgerError> {
        self.credits
            .get(&id)
            .filter(|c| !c.closed)
            .ok_or(LedgerError::UnknownCredit(id))
    }

    /// A live credit that may take new work: not fenced (a fenced generation only ends).
    fn working_credit(&self, id: CreditId) -> Result<&Credit, LedgerError> {
        let c = self.live_credit(id)?;
        if c.fenced {
            return Err(LedgerError::Fenced(id));
        }
        Ok(c)
    }

    /// Keys of `credit`'s operations still in progress (reserved or quarantined), and
    /// whether a transfer of it is undecided.
    fn in_progress(&self, credit: CreditId) -> (Vec<OpKey>, bool) {
        let open = self
            .ops
            .values()
            .filter(|o| {
                o.binding.credit == credit
                    && matches!(o.state, OpState::Reserved | OpState::Quarantined)
            })
            .map(|o| o.binding.key)
            .collect();
        let sealed = self
            .outgoing
            .values()
            .any(|o| o.body.source_credit == credit && o.state == OutgoingState::Sealed);
        (open, sealed)
    }

    /// Ends operation `key` with `step` (a settlement or a no-effect proof). When it is the
    /// final open operation of a fenced generation, the fused terminal transition: the step
    /// and the generation's reissue are one commit.
    fn end_operation(&mut self, key: OpKey, step: Step) -> Result<(), LedgerError> {
        let Some(op) = self.ops.get(&key) else {
            return self.commit(step, Vec::new());
        };
        let credit = op.binding.credit;
        let fused = self.credits.get(&credit).is_some_and(|c| {
            c.fenced && !c.closed && c.epoch > op.binding.epoch && {
                let (open, sealed) = self.in_progress(credit);
                !sealed && open == [key]
            }
        });
        if !fused {
            return self.commit(step, Vec::new());
        }
        let generation = self.credits[&credit].generation;
        let successor = derive_successor(&self.me, credit, generation);
        self.commit(
            Step::Reissue {
                credit,
                successor,
                last: Some(Box::new(step)),
            },
            Vec::new(),
        )
    }

    fn roll_if_done_for(&mut self, key: OpKey) -> Result<(), LedgerError> {
        match self.ops.get(&key) {
            Some(op) => self.roll_if_done(op.binding.credit),
            None => Ok(()),
        }
    }

    /// Reissues `credit` if it is a fenced, live generation with nothing left in progress.
    fn roll_if_done(&mut self, credit: CreditId) -> Result<(), LedgerError> {
        let Some(c) = self.credits.get(&credit) else {
            return Ok(());
        };
        if !c.fenced || c.closed {
            return Ok(());
        }
        let (open, sealed) = self.in_progress(credit);
        if open.is_empty() && !sealed {
            self.reissue(credit)?;
        }
        Ok(())
    }

    /// Applies `step` and hands it out for persistence, with `msgs` released after it.
    fn commit(
        &mut self,
        step: Step,
        msgs: Vec<(AgentId, LedgerMessage)>,
    ) -> Result<(), LedgerError> {
        self.commit_known(step, msgs, None)
    }

    /// [`commit`](Self::commit) of a reservation whose permit this branch has just built
    /// from its effect (`known`: the permit's body, as signed).
    fn commit_known(
        &mut self,
        step: Step,
        msgs: Vec<(AgentId, LedgerMessage)>,
        known: Option<Permit>,
    ) -> Result<(), LedgerError> {
        if !self.apply_known(&step, known)? {
            return Ok(()); // A replay: nothing to write.
        }
        self.journal_len += 1;
        let token = PersistToken(self.next_token);
        self.next_token += 1;
        let resendable = match &step {
            Step::Dispatch { key } => Some(Undurable::Dispatch(*key)),
            Step::Seal { cert } => cert.peek().ok().map(|c| Undurable::Seal(c.transfer)),
            Step::Accept { cert, .. } | Step::Refuse { cert, .. } | Step::Claim { cert, .. } => {
                cert.peek()
                    .ok()
                    .map(|c| Undurable::Decision(c.root, c.transfer))
            }
            Step::Decided { decision } => {
                decision.peek().ok().map(|d| Undurable::Outcome(d.transfer))
            }
            Step::Reclaim { decision } => {
                decision.peek().ok().map(|d| Undurable::Outcome(d.transfer))
            }
            _ => None,
        };
        if let Some(k) = resendable {
            self.in_flight.insert(token, k);
            self.in_flight_by.insert(k, token);
        }
        self.persists.push_back((token, step));
        if self.config.mutation == Some(LedgerMutation::SendBeforePersist) {
            self.transmits.extend(msgs);
        } else if !msgs.is_empty() {
            self.gated.insert(token, msgs);
        }
        Ok(())
    }

    /// Applies one step. `Ok(false)`: it had already taken effect (a replay).
    fn apply(&mut self, step: &Step) -> Result<bool, LedgerError> {
        self.apply_known(step, None)
    }

    /// [`apply`](Self::apply); `known`: a reservation's permit body, built by this branch
    /// from the step's own effect (so neither is read back nor compared again).
    fn apply_known(&mut self, step: &Step, known: Option<Permit>) -> Result<bool, LedgerError> {
        self.resend_armed |= self.config.mutation != Some(LedgerMutation::TimerNotRearmed)
            || self.last_resend == UnixMillis(0);
        match step {
            Step::Grant { grant, credit } => {
                let g = self.verified_grant(grant)?;
                if self.roots.contains_key(&g.root) {
                    return self.replayed(credit, step, "root grant");
                }
                if self.credits.contains_key(credit) {
                    return Err(LedgerError::IdInUse("credit"));
                }
                self.origins.insert(*credit, step.clone());
                self.credits.insert(
                    *credit,
                    Credit {
                        id: *credit,
                        root: g.root,
                        label: g.label.clone(),
                        generation: 0,
                        epoch: 0,
                        available: Footprint::full(&g.budget),
                        fenced: false,
                        closed: false,
                        successor: None,
                    },
                );
                self.roots.insert(g.root, g);
            }
            Step::Split {
                parent,
                child,
                amount,
                label,
            } => {
                if self.credits.contains_key(child) {
                    return self.replayed(child, step, "credit");
                }
                let p = self.working_credit(*parent)?;
                if !label.within(&p.label) {
                    return Err(LedgerError::LabelNotAttenuated);
                }
                let (taken, rest) = take(p, amount)?;
                let c = Credit {
                    id: *child,
                    root: p.root,
                    label: label.clone(),
                    generation: 0,
                    epoch: 0,
                    available: taken,
                    fenced: false,
                    closed: false,
                    successor: None,
                };
                self.credits.get_mut(parent).expect("checked").available = rest;
                self.credits.insert(*child, c);
                self.origins.insert(*child, step.clone());
            }
            Step::Seal { cert } => {
                let body = cert.peek()?;
                if let Some(out) = self.outgoing.get(&body.transfer) {
                    return if out.cert == *cert {
                        Ok(false)
                    } else {
                        Err(LedgerError::IdInUse("transfer"))
                    };
                }
                let c = self.working_credit(body.source_credit)?;
                let rest =
                    c.available
                        .subtract(&body.footprint)
                        .ok_or(LedgerError::Insufficient {
                            need: body.footprint.size(),
                            have: c.available.size(),
                        })?;
                self.credits
                    .get_mut(&body.source_credit)
                    .expect("checked")
                    .available = rest;
                self.outgoing.insert(
                    body.transfer,
                    Outgoing {
                        cert: cert.clone(),
                        body,
                        state: OutgoingState::Sealed,
                    },
                );
            }
            Step::Accept {
                cert,
                credit,
                decision: _,
                confirmation,
            } => {
                let body = self.addressed_here(cert)?;
                if body.confirm {
                    self.confirmed(&body, *credit, confirmation.as_ref())?;
                }
                let replay = self.config.mutation == Some(LedgerMutation::AcceptReplayedTransfer);
                match self.incoming.get(&(body.root, body.transfer)) {
                    // The claim this confirmation answers: it becomes the credit now.
                    Some(Step::Claim { credit: c, .. }) if c == credit => {}
                    Some(Step::Claim { .. }) => {
                        return Err(LedgerError::Mismatch("a credit other than the one claimed"))
                    }
                    Some(_) if !replay => return Ok(false),
                    _ => {}
                }
                if self.credits.contains_key(credit) {
                    return self.replayed(credit, step, "credit");
                }
                self.origins.insert(*credit, step.clone());
                self.credits.insert(
                    *credit,
                    Credit {
                        id: *credit,
                        root: body.root,
                        label: body.label.clone(),
                        generation: 0,
                        epoch: 0,
                        available: body.footprint.clone(),
                        fenced: false,
                        closed: false,
                        successor: None,
                    },
                );
                self.incoming
                    .insert((body.root, body.transfer), step.clone());
            }
            Step::Refuse { cert, .. } => {
                let body = cert.peek()?;
                if self.incoming.contains_key(&(body.root, body.transfer)) {
                    return Ok(false);
                }
                self.incoming
                    .insert((body.root, body.transfer), step.clone());
            }
            Step::Claim { cert, credit, .. } => {
                let body = self.addressed_here(cert)?;
                if !body.confirm {
                    return Err(LedgerError::Mismatch(
                        "a claim on a transfer that does not ask for confirmation",
                    ));
                }
                if self.incoming.contains_key(&(body.root, body.transfer)) {
                    return Ok(false);
                }
                if self.credits.contains_key(credit) {
                    return Err(LedgerError::IdInUse("credit"));
                }
                self.incoming
                    .insert((body.root, body.transfer), step.clone());
            }
            Step::Reclaimed { cert, decision } => {
                let body = self.addressed_here(cert)?;
                let d = self.evidence("a source decision", decision, &body.source)?;
                if !bound_to(&d, &body) || d.credit.is_some() {
                    return Err(LedgerError::Mismatch("a reclaim of another transfer"));
                }
                match self.incoming.get(&(body.root, body.transfer)) {
                    Some(Step::Claim { .. }) => {}
                    Some(Step::Reclaimed { .. }) => return Ok(false),
                    _ => {
                        return Err(LedgerError::WrongState(
                            "a reclaim of a transfer not claimed",
                        ))
                    }
                }
                self.incoming
                    .insert((body.root, body.transfer), step.clone());
            }
            Step::Reclaim { decision } => {
                let transfer = decision.peek()?.transfer;
                let out = self
                    .outgoing
                    .get(&transfer)
                    .ok_or(LedgerError::UnknownTransfer(transfer))?;
                let d = self.evidence("a source decision", decision, &out.body.source)?;
                if !bound_to(&d, &out.body) || d.credit.is_some() {
                    return Err(LedgerError::Mismatch("a reclaim of another transfer"));
                }
                if !out.body.confirm {
                    return Err(LedgerError::WrongState(
                        "a reclaim of a transfer whose destination decides alone",
                    ));
                }
                let after_confirm = self.config.mutation
                    == Some(LedgerMutation::ReclaimAfterConfirm)
                    && matches!(out.state, OutgoingState::Accepted(_));
                match &out.state {
                    OutgoingState::Sealed => {}
                    _ if after_confirm => {}
                    OutgoingState::Reclaimed(r) if r == decision => return Ok(false),
                    _ => return Err(LedgerError::WrongState("a reclaim of a decided transfer")),
                }
                let out = self.outgoing.get_mut(&transfer).expect("checked");
                out.state = OutgoingState::Reclaimed(decision.clone());
                let (credit, fp) = (out.body.source_credit, out.body.footprint.clone());
                self.give_back(credit, &fp)?;
                self.events
                    .push_back(LedgerEvent::TransferReclaimed { transfer });
            }
            Step::Decided { decision } => {
                let transfer = decision.peek()?.transfer;
                let out = self
                    .outgoing
                    .get(&transfer)
                    .ok_or(LedgerError::UnknownTransfer(transfer))?;
                let d = self.evidence("a transfer decision", decision, &out.body.destination)?;
                // Bound to this very certificate: its digest, source, root and destination.
                let bound = d.cert == out.body.digest()
                    && d.source == out.body.source
                    && d.root == out.body.root
                    && d.destination == out.body.destination;
                let any = self.config.mutation == Some(LedgerMutation::EvidenceFromAnyMember);
                if !bound && !any {
                    return Err(LedgerError::Mismatch("decision on another certificate"));
                }
                let out = self.outgoing.get_mut(&transfer).expect("checked");
                if out.state != OutgoingState::Sealed {
                    return Ok(false);
                }
                if d.credit.is_some() {
                    out.state = OutgoingState::Accepted(decision.clone());
                    self.events.push_back(LedgerEvent::TransferAccepted {
                        transfer: d.transfer,
                    });
                } else {
                    out.state = OutgoingState::Cancelled(decision.clone());
                    let (credit, fp) = (out.body.source_credit, out.body.footprint.clone());
                    self.give_back(credit, &fp)?;
                    self.events.push_back(LedgerEvent::TransferCancelled {
                        transfer: d.transfer,
                    });
                }
            }
            Step::Reserve { permit, effect } => {
                let built_here = known.is_some();
                let p = match known {
                    Some(p) => p,
                    None => permit.peek()?,
                };
                if self.ended.contains_key(&p.binding.key) {
                    return Err(LedgerError::IdInUse("operation key"));
                }
                if let Some(op) = self.ops.get(&p.binding.key) {
                    return if op.permit == *permit && op.effect == *effect {
                        Ok(false)
                    } else {
                        Err(LedgerError::IdInUse("operation key"))
                    };
                }
                // The escrow covers the maximum exactly, for the effect the binding names.
                let short = self.config.mutation == Some(LedgerMutation::ReserveBelowMaximum);
                if p.footprint.size() != p.binding.max_charge && !short {
                    return Err(LedgerError::Mismatch(
                        "reservation other than the maximum charge",
                    ));
                }
                if !built_here
                    && (effect.digest() != p.binding.effect
                        || effect.max_charge != p.binding.max_charge)
                {
                    return Err(LedgerError::Mismatch("permit for another effect"));
                }
                let c = self.working_credit(p.binding.credit)?;
                if p.binding.generation != c.generation || p.binding.epoch != c.epoch {
                    return Err(LedgerError::Mismatch(
                        "permit for another generation or epoch of its credit",
                    ));
                }
                let rest = c
                    .available
                    .subtract(&p.footprint)
                    .ok_or(LedgerError::Insufficient {
                        need: p.footprint.size(),
                        have: c.available.size(),
                    })?;
                self.credits
                    .get_mut(&p.binding.credit)
                    .expect("checked")
                    .available = rest;
                self.ops.insert(
                    p.binding.key,
                    Operation {
                        permit: permit.clone(),
                        binding_digest: p.binding.digest(),
                        binding: p.binding,
                        effect: effect.clone(),
                        footprint: p.footprint,
                        state: OpState::Reserved,
                        dispatched: false,
                        sent_at: None,
                    },
                );
            }
            Step::Dispatch { key } => {
                let op = self.op_mut(*key)?;
                match op.state {
                    OpState::Reserved => {
                        op.state = OpState::Quarantined;
                        op.dispatched = true;
                    }
                    OpState::Released => {
                        return Err(LedgerError::WrongState("dispatch after release"))
                    }
                    _ => return Ok(false),
                }
            }
            Step::ReleaseUnsent { key } => {
                let late = self.config.mutation == Some(LedgerMutation::ReleaseAfterDispatch);
                let op = self.op_mut(*key)?;
                match op.state {
                    OpState::Reserved if !op.dispatched => {
                        op.state = OpState::Released;
                        let (credit, fp) = (op.binding.credit, op.footprint.clone());
                        self.give_back(credit, &fp)?;
                    }
                    OpState::Quarantined if late => {
                        op.state = OpState::Released;
                        let (credit, fp) = (op.binding.credit, op.footprint.clone());
                        self.give_back(credit, &fp)?;
                    }
                    OpState::Released => return Ok(false),
                    _ => return Err(LedgerError::WrongState("release of a dispatched operation")),
                }
            }
            Step::Settle { key, receipt } => {
                let gateway = self.op_mut(*key)?.binding.receiver.clone();
                let r = self.evidence("a receipt", receipt, &gateway)?;
                let unforfeit =
                    self.config.mutation == Some(LedgerMutation::UnforfeitOnLateEvidence);
                let op = self.op_mut(*key)?;
                match op.state {
                    OpState::Quarantined => {}
                    OpState::Forfeited { .. } if unforfeit => {}
                    OpState::Settled { .. } => return Ok(false),
                    _ => {
                        return Err(LedgerError::WrongState(
                            "settle of an unquarantined operation",
                        ))
                    }
                }
                if r.key != *key || r.binding != op.binding_digest {
                    return Err(LedgerError::Mismatch("receipt for another binding"));
                }
                if !r.actual.le(&op.binding.max_charge) {
                    // A conflicting receipt: the atoms stay quarantined.
                    return Err(LedgerError::Mismatch("receipt above the maximum charge"));
                }
                let (charged, remainder) = op
                    .footprint
                    .take(&r.actual)
                    .ok_or(LedgerError::Mismatch("receipt not within the reservation"))?;
                op.state = OpState::Settled {
                    charged,
                    receipt: receipt.clone(),
                };
                let credit = op.binding.credit;
                self.give_back(credit, &remainder)?;
                self.events.push_back(LedgerEvent::Settled {
                    key: *key,
                    actual: r.actual,
                });
            }
            Step::NoEffect { key, proof } => {
                let gateway = self.op_mut(*key)?.binding.receiver.clone();
                let p = self.evidence("a no-effect proof", proof, &gateway)?;
                let op = self.op_mut(*key)?;
                match op.state {
                    OpState::Quarantined => {}
                    OpState::NoEffect(_) => return Ok(false),
                    _ => {
                        return Err(LedgerError::WrongState(
                            "no-effect for an unquarantined operation",
                        ))
                    }
                }
                if p.key != *key
                    || p.binding != op.binding_digest
                    || p.gateway != op.binding.receiver
                    || p.fence <= op.binding.epoch
                {
                    return Err(LedgerError::Mismatch(
                        "no-effect proof for another binding or unfenced",
                    ));
                }
                op.state = OpState::NoEffect(proof.clone());
                let (credit, fp) = (op.binding.credit, op.footprint.clone());
                self.give_back(credit, &fp)?;
                self.events.push_back(LedgerEvent::NoEffect { key: *key });
            }
            Step::Forfeit { key } => {
                let op = self.op_mut(*key)?;
                match op.state {
                    OpState::Quarantined => op.state = OpState::Forfeited { annotation: None },
                    OpState::Forfeited { .. } => return Ok(false),
                    _ => {
                        return Err(LedgerError::WrongState(
                            "forfeit of an unquarantined operation",
                        ))
                    }
                }
            }
            Step::Annotate { key, receipt } => {
                let gateway = self.op_mut(*key)?.binding.receiver.clone();
                self.evidence("a receipt", receipt, &gateway)?;
                let op = self.op_mut(*key)?;
                match &op.state {
                    OpState::Forfeited { annotation: None } => {
                        op.state = OpState::Forfeited {
                            annotation: Some(receipt.clone()),
                        }
                    }
                    OpState::Forfeited { .. } => return Ok(false),
                    _ => {
                        return Err(LedgerError::WrongState(
                            "annotation of an unforfeited operation",
                        ))
                    }
                }
            }
            Step::Join { inputs, output } => {
                if self.credits.contains_key(output) {
                    return self.replayed(output, step, "join output");
                }
                let checked = self.config.mutation != Some(LedgerMutation::JoinWithoutDisjointness);
                let footprint = self.join_footprint(inputs, *output, checked)?;
                let first = &self.credits[&inputs[0]];
                let (root, label) = (first.root, first.label.clone());
                // The output's label is the inputs' common lower bound.
                let label = inputs.iter().fold(label, |l, i| {
                    Label(
                        l.0.intersection(&self.credits[i].label.0)
                            .cloned()
                            .collect(),
                    )
                });
                for i in inputs {
                    let c = self.credits.get_mut(i).expect("checked");
                    c.closed = true;
                    c.available = Footprint::default();
                }
                self.origins.insert(*output, step.clone());
                self.credits.insert(
                    *output,
                    Credit {
                        id: *output,
                        root,
                        label,
                        generation: 0,
                        epoch: 0,
                        available: footprint,
                        fenced: false,
                        closed: false,
                        successor: None,
                    },
                );
            }
            Step::Fenced { fenced } => {
                let gateway = fenced.peek()?.gateway;
                let f = self.evidence("a fenced reply", fenced, &gateway)?;
                // Only a gateway this credit dispatched to can fence it.
                let dispatched_there = self
                    .ops
                    .values()
                    .any(|o| o.binding.credit == f.credit && o.binding.receiver == gateway);
                let any = self.config.mutation == Some(LedgerMutation::EvidenceFromAnyMember);
                if !dispatched_there && !any {
                    return Err(LedgerError::Mismatch(
                        "fenced by a gateway the credit never used",
                    ));
                }
                let c = self
                    .credits
                    .get_mut(&f.credit)
                    .ok_or(LedgerError::UnknownCredit(f.credit))?;
                if f.epoch <= c.epoch {
                    return Ok(false);
                }
                // The generation is fenced, not bumped in place: it takes no new work, and
                // closes into a fresh one (`Reissue`) once its last operation ends.
                c.epoch = f.epoch;
                c.fenced = true;
            }
            Step::Reissue {
                credit,
                successor,
                last,
            } => {
                if self.credits.contains_key(successor) {
                    return self.replayed(successor, step, "reissue target");
                }
                let c = self
                    .credits
                    .get(credit)
                    .ok_or(LedgerError::UnknownCredit(*credit))?;
                if c.successor.is_some() {
                    return Err(LedgerError::IdInUse(
                        "a generation already reissued to another credit",
                    ));
                }
                if c.closed {
                    return Err(LedgerError::UnknownCredit(*credit));
                }
                let fused = match last.as_deref() {
                    None => None,
                    Some(Step::Settle { key, .. } | Step::NoEffect { key, .. }) => Some(*key),
                    Some(_) => {
                        return Err(LedgerError::WrongState(
                            "a reissue fuses only a settlement or a no-effect proof",
                        ))
                    }
                };
                if let Some(key) = fused {
                    // Only the fenced generation's own final operation, fenced above its epoch.
                    let op = self
                        .ops
                        .get(&key)
                        .ok_or(LedgerError::UnknownOperation(key))?;
                    if op.binding.credit != *credit
                        || op.state != OpState::Quarantined
                        || !c.fenced
                        || c.epoch <= op.binding.epoch
                    {
                        return Err(LedgerError::WrongState(
                            "a fused reissue ends the fenced generation's own last operation",
                        ));
                    }
                }
                let (open, sealed) = self.in_progress(*credit);
                let lax = self.config.mutation == Some(LedgerMutation::ReissueWithWorkInProgress);
                if (sealed || open.iter().any(|k| Some(*k) != fused)) && !lax {
                    return Err(LedgerError::WrongState(
                        "reissue of a generation with work in progress",
                    ));
                }
                let generation = c.generation.checked_add(1).ok_or(LedgerError::Overflow)?;
                if let Some(last) = last {
                    if !self.apply(last)? {
                        return Err(LedgerError::WrongState("the fused step had already ended"));
                    }
                }
                let c = self.credits.get_mut(credit).expect("checked");
                let available = std::mem::take(&mut c.available);
                c.closed = true;
                c.successor = Some(*successor);
                let (root, label, epoch) = (c.root, c.label.clone(), c.epoch);
                self.credits.insert(
                    *successor,
                    Credit {
                        id: *successor,
                        root,
                        label,
                        generation,
                        epoch,
                        available,
                        fenced: false,
                        closed: false,
                        successor: None,
                    },
                );
                self.origins.insert(*successor, step.clone());
                self.events.push_back(LedgerEvent::Reissued {
                    credit: *credit,
                    successor: *successor,
                });
            }
            Step::Checkpoint(record) => return self.apply_checkpoint(record),
            Step::Refund { key } => {
                let op = self.op_mut(*key)?;
                if op.state != OpState::Quarantined {
                    return Ok(false);
                }
                op.state = OpState::Refunded;
                let (credit, fp) = (op.binding.credit, op.footprint.clone());
                self.give_back(credit, &fp)?;
            }
        }
        Ok(true)
    }

    fn join_footprint(
        &self,
        inputs: &[CreditId],
        output: CreditId,
        checked: bool,
    ) -> Result<Footprint, LedgerError> {
        if inputs.len() < 2 {
            return Err(LedgerError::Join("fewer than two inputs"));
        }
        if self.credits.contains_key(&output) {
            return Err(LedgerError::IdInUse("join output"));
        }
        let mut seen = BTreeSet::new();
        let mut root = None;
        let mut out = Footprint::default();
        for i in inputs {
            let c = self.working_credit(*i)?;
            if checked && !seen.insert(*i) {
                return Err(LedgerError::Join("an input appears twice"));
            }
            if *root.get_or_insert(c.root) != c.root {
                return Err(LedgerError::Join("inputs of different roots"));
            }
            let busy = self.ops.values().any(|o| {
                o.binding.credit == *i
                    && matches!(o.state, OpState::Reserved | OpState::Quarantined)
            });
            let sealed = self
                .outgoing
                .values()
                .any(|o| o.body.source_credit == *i && o.state == OutgoingState::Sealed);
            if busy || sealed {
                return Err(LedgerError::Join(
                    "an input has an operation or a transfer in progress",
                ));
            }
            out = if checked {
                out.union(&c.available)
                    .ok_or(LedgerError::Join("inputs are not disjoint"))?
            } else {
                out.concat_unchecked(&c.available)
            };
        }
        Ok(out)
    }

    fn op_mut(&mut self, key: OpKey) -> Result<&mut Operation, LedgerError> {
        self.ops
            .get_mut(&key)
            .ok_or(LedgerError::UnknownOperation(key))
    }

    /// Returns atoms to `credit`'s available set (or, if it was joined away, to the output
    /// that holds its lineage — never silently dropped).
    /// A certificate signed by its source and addressed to this branch.
    fn addressed_here(&self, cert: &Signed<TransferCert>) -> Result<TransferCert, LedgerError> {
        let source = cert.peek()?.source;
        let body = self.evidence("a transfer certificate", cert, &source)?;
        if body.destination != self.me {
            return Err(LedgerError::Mismatch(
                "transfer addressed to another branch",
            ));
        }
        Ok(body)
    }

    /// The source's confirmation that `credit` is what `cert`'s destination takes: signed by
    /// the source, bound to the certificate, naming that credit.
    fn confirmed(
        &self,
        cert: &TransferCert,
        credit: CreditId,
        confirmation: Option<&Signed<SourceDecision>>,
    ) -> Result<(), LedgerError> {
        if self.config.mutation == Some(LedgerMutation::AcceptWithoutConfirmation) {
            return Ok(());
        }
        let c = confirmation.ok_or(LedgerError::Mismatch(
            "a transfer that asks for confirmation accepted without the source's",
        ))?;
        let d = self.evidence("a source decision", c, &cert.source)?;
        if !bound_to(&d, cert) || d.credit != Some(credit) {
            return Err(LedgerError::Mismatch("a confirmation of another claim"));
        }
        Ok(())
    }

    fn give_back(&mut self, credit: CreditId, fp: &Footprint) -> Result<(), LedgerError> {
        if fp.is_empty() {
            return Ok(());
        }
        let c = self
            .credits
            .get_mut(&credit)
            .ok_or(LedgerError::UnknownCredit(credit))?;
        c.available = c
            .available
            .union(fp)
            .ok_or(LedgerError::WrongState("returned atoms already available"))?;
        Ok(())
    }
}

/// `v` with one atom less in its first non-zero dimension (the `ReserveBelowMaximum` mutant),
/// or `v` itself when that would leave nothing.
fn one_short(v: &Vector) -> Vector {
    let mut pairs: Vec<(&str, u64)> = v.iter().map(|(d, n)| (d.as_str(), n)).collect();
    if let Some(p) = pairs.iter_mut().find(|p| p.1 > 0) {
        p.1 -= 1;
    }
    match Vector::of(&pairs) {
        Ok(short) if !short.is_zero() => short,
        _ => v.clone(),
    }
}

fn take(c: &Credit, amount: &Vector) -> Result<(Footprint, Footprint), LedgerError> {
    if amount.is_zero() {
        return Err(LedgerError::WrongState("an empty amount"));
    }
    let (taken, rest) = c
        .available
        .take(amount)
        .ok_or_else(|| LedgerError::Insufficient {
            need: amount.clone(),
            have: c.available.size(),
        })?;
    // Bounded where ranges are produced: what is taken goes on the wire (a permit, a
    // certificate) or becomes a credit whose atoms will.
    for (d, r) in taken.iter() {
        if r.ranges().len() > MAX_RANGES {
            return Err(LedgerError::Fragmented {
                dim: d.as_str().to_owned(),
                ranges: r.ranges().len(),
                limit: MAX_RANGES,
            });
        }
    }
    Ok((taken, rest))
}

/// Whether a source decision is about exactly this certificate.
fn bound_to(d: &SourceDecision, cert: &TransferCert) -> bool {
    d.root == cert.root
        && d.transfer == cert.transfer
        && d.cert == cert.digest()
        && d.source == cert.source
        && d.destination == cert.destination
}

/// The successor of `credit`'s generation `generation`: a function of the two, so a repeated
/// reissue request names the same credit (and a replayed step the same one).
fn derive_successor(me: &AgentId, credit: CreditId, generation: u32) -> CreditId {
    let d = Digest::of(&[
        b"abhyasa/v1/successor",
        me.as_str().as_bytes(),
        &credit.to_u128().to_be_bytes(),
        &generation.to_be_bytes(),
    ]);
    let mut b = [0u8; 16];
    b.copy_from_slice(&d.0[..16]);
    CreditId::from_u128(u128::from_be_bytes(b))
}

/// The destination's credit id for an accepted transfer: a function of who accepted what,
/// so replaying the acceptance step yields the same credit.
fn derive_credit_id(me: &AgentId, root: RootId, transfer: TransferId, salt: u64) -> CreditId {
    let d = Digest::of(&[
        b"abhyasa/v1/credit",
        me.as_str().as_bytes(),
        &root.to_u128().to_be_bytes(),
        &transfer.to_u128().to_be_bytes(),
        &salt.to_be_bytes(),
    ]);
    let mut b = [0u8; 16];
    b.copy_from_slice(&d.0[..16]);
    CreditId::from_u128(u128::from_be_bytes(b))
}

trait CertRules {
    fn validate_as_cert(&self) -> Result<(), LedgerError>;
}

impl CertRules for TransferCert {
    fn validate_as_cert(&self) -> Result<(), LedgerError> {
        self.validate()
            .map_err(|e| LedgerError::Signature(SignatureError::Invalid(e)))
    }
}

/// A signing key for replays that must not sign: derived from a fixed seed no deployment
/// uses, and never put in a keyring.
pub(crate) fn inert_key() -> LedgerSigningKey {
    crate::signing_key(*b"abhyasa/v1/inert-audit-replay-k!")
}
