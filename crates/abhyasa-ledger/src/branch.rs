//! One agent's share of the ledger: its credits, its transfers and its operations.

use std::collections::{BTreeMap, BTreeSet, VecDeque};

use abhyasa_wire::ledger::*;
use abhyasa_wire::{AgentId, UnixMillis};
use serde::{Deserialize, Serialize};

use crate::{Keyring, LedgerError, LedgerMutation, PersistToken};

mod apply;
mod checkpoint;
mod messages;
mod step;
mod timers;
pub use step::{LedgerEvent, Step};

pub(crate) use checkpoint::{AuditSeed, Snapshot};
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
    #[cfg(feature = "mutants")]
    pub mutation: Option<LedgerMutation>,
}

impl Default for BranchConfig {
    fn default() -> Self {
        Self {
            resend_ms: 500,
            max_journal_steps: 1_000_000,
            checkpoint_steps: 10_000,
            permit_ttl_ms: 0,
            #[cfg(feature = "mutants")]
            mutation: None,
        }
    }
}

impl BranchConfig {
    /// The deliberately broken rule this branch runs with: always `None` unless the crate is
    /// built with the `mutants` feature (the simulator's), so a product build compiles every
    /// mutant branch away.
    #[inline]
    pub fn mutation(&self) -> Option<LedgerMutation> {
        #[cfg(feature = "mutants")]
        return self.mutation;
        #[cfg(not(feature = "mutants"))]
        None
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
                if self.config.mutation() == Some(LedgerMutation::ReclaimAfterConfirm) => {}
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
        let escrow = if self.config.mutation() == Some(LedgerMutation::ReserveBelowMaximum) {
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
        if self.config.mutation() == Some(LedgerMutation::AcceptWithoutConfirmation) {
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
