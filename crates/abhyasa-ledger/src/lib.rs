//! Budget conservation in delegation (docs/DESIGN.md, "The ledger: the rules"), sans-IO.
//!
//! A root grant's atoms (`[0, B)` per dimension) are owned by exactly one place at a time:
//!
//! ```text
//!            split / join (local)                 transfer: seal ─▶ accept at destination
//!   Available ◀──────────────▶ Available      Available ──▶ InTransit ──▶ (destination's Available)
//!       │  ▲                                                   └─ signed refusal ─▶ Available
//!       │  └── release unsent (permit never exposed)
//!       ▼  │
//!   Reserved ──dispatch──▶ Quarantined ──receipt──▶ Committed (actual) + Available (remainder)
//!                               │  ├──no-effect proof (fenced)──▶ Available
//!                               │  └──forfeit──▶ Forfeited (absorbing)
//!                               └── a timeout changes nothing
//! ```
//!
//! - [`Branch`]: one agent's credits, transfers and operations. Every transition is a
//!   [`Step`] handed out through `poll_persist`; messages that depend on it are released only
//!   after `handle_persisted` (persist before exposure). Replaying steps rebuilds the state
//!   ([`Branch::recover`]); replaying one twice is a no-op.
//! - [`Gateway`]: mediates effects — verifies the permit, recomputes the binding, enforces the
//!   epoch fence and the maximum charge, records first acceptance durably before the effect
//!   runs, answers a repeated key with the prior decision, signs receipts, answers queries.
//! - [`check`]: the conservation checker, written apart from the ledger: it reads plain
//!   snapshots of durable state (and the gateway's log and the effects that ran) and checks
//!   L1–L7 with its own interval arithmetic.

#![warn(missing_docs, unreachable_pub)]

mod branch;
pub mod check;
mod gateway;

use std::collections::BTreeMap;
use std::sync::Arc;

pub use abhyasa_wire::ledger::*;
use abhyasa_wire::AgentId;
pub use branch::{
    Branch, BranchConfig, Credit, Ended, EndedOp, LedgerEvent, OpState, Operation, Outgoing,
    OutgoingState, Step, MAX_CHECKPOINT_BYTES,
};
pub use gateway::{Acceptance, AcceptanceState, Execute, Gateway, GatewayRecord};

/// Verifying keys of the agents a ledger component trusts, by agent id, and which of them
/// may issue root grants.
///
/// A keyring remembers the signed objects it has verified (by [`Signed::fingerprint`]: tag,
/// signer, body and signature), so replaying a journal — which re-verifies every piece of
/// evidence it relies on — costs one ed25519 verification per object, not one per replay.
/// The keys never change after construction, so a remembered verification stays true.
#[derive(Clone, Debug, Default)]
pub struct Keyring {
    keys: Arc<BTreeMap<AgentId, LedgerVerifyingKey>>,
    issuers: Arc<std::collections::BTreeSet<AgentId>>,
    verified: Arc<std::sync::Mutex<std::collections::HashSet<Digest>>>,
}

/// Most verifications a keyring remembers; past it the memory starts afresh.
const VERIFIED_MEMORY: usize = 1 << 20;

impl Keyring {
    /// A keyring of `(agent, key)` pairs, trusting no root issuer yet.
    pub fn new(keys: impl IntoIterator<Item = (AgentId, LedgerVerifyingKey)>) -> Self {
        Self {
            keys: Arc::new(keys.into_iter().collect()),
            issuers: Arc::default(),
            verified: Arc::default(),
        }
    }

    /// The agents whose signatures on root grants are trusted (a branch or an agent key
    /// alone cannot mint a budget).
    pub fn with_issuers(mut self, issuers: impl IntoIterator<Item = AgentId>) -> Self {
        self.issuers = Arc::new(issuers.into_iter().collect());
        self
    }

    /// Whether `agent` may issue root grants.
    pub fn is_issuer(&self, agent: &AgentId) -> bool {
        self.issuers.contains(agent)
    }

    /// The key of `agent`.
    pub fn get(&self, agent: &AgentId) -> Option<LedgerVerifyingKey> {
        self.keys.get(agent).copied()
    }

    /// Verifies the signatures at the top of `messages` together (one batch equation when
    /// all hold: `abhyasa_wire::sig`, with the answers verifying each alone gives) and
    /// remembers those that hold, so that handling the messages after — by a branch or gateway
    /// sharing this keyring's memory — verifies nothing again. A signature that fails, or whose
    /// signer this keyring does not know, is not remembered: handling its message refuses it
    /// as before. Returns how many were verified and remembered now.
    pub fn verify_together<'a>(
        &self,
        messages: impl IntoIterator<Item = &'a LedgerMessage>,
    ) -> usize {
        let mut batch = abhyasa_wire::sig::Batch::new();
        let mut fingerprints = Vec::new();
        let mut queued = std::collections::HashSet::new();
        {
            let verified = self.verified.lock().unwrap_or_else(|e| e.into_inner());
            for v in messages.into_iter().filter_map(LedgerMessage::to_verify) {
                let (Some(key), Some(signature)) = (self.keys.get(v.signer), v.signature) else {
                    continue;
                };
                if verified.contains(&v.fingerprint) || !queued.insert(v.fingerprint) {
                    continue;
                }
                batch.push(key, &v.message, &signature);
                fingerprints.push(v.fingerprint);
            }
        }
        let good: Vec<Digest> = fingerprints
            .into_iter()
            .zip(batch.verify_all())
            .filter_map(|(f, ok)| ok.then_some(f))
            .collect();
        let mut verified = self.verified.lock().unwrap_or_else(|e| e.into_inner());
        if verified.len() + good.len() > VERIFIED_MEMORY {
            verified.clear();
        }
        let n = good.len();
        verified.extend(good);
        n
    }

    /// Opens `signed`, which must come from `expected`.
    pub fn open<T: SignedObject>(
        &self,
        signed: &Signed<T>,
        expected: &AgentId,
    ) -> Result<T, SignatureError> {
        if &signed.signer != expected {
            return Err(SignatureError::UnexpectedSigner(signed.signer.clone()));
        }
        let fingerprint = signed.fingerprint();
        let known = self
            .verified
            .lock()
            .map(|v| v.contains(&fingerprint))
            .unwrap_or(false);
        if known {
            return signed.decode_checked();
        }
        let value = signed.open_from(expected, &|a: &AgentId| self.get(a))?;
        if let Ok(mut v) = self.verified.lock() {
            if v.len() >= VERIFIED_MEMORY {
                v.clear();
            }
            v.insert(fingerprint);
        }
        Ok(value)
    }
}

/// Why a ledger transition was refused. Nothing changes when one is returned.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum LedgerError {
    /// A signature, signer or signed body is wrong.
    #[error(transparent)]
    Signature(#[from] SignatureError),
    /// A body that does not decode (a damaged journal record).
    #[error(transparent)]
    Wire(#[from] abhyasa_wire::WireError),
    /// No such credit here (or it is closed).
    #[error("unknown or closed credit {0}")]
    UnknownCredit(CreditId),
    /// The credit's generation is fenced: it takes no new work, and closes into a fresh
    /// generation once its last operation ends ([`Branch::current`] names it).
    #[error("credit {0} is fenced: its generation only ends (spend from its reissue)")]
    Fenced(CreditId),
    /// No such operation here.
    #[error("unknown operation {0}")]
    UnknownOperation(OpKey),
    /// No such transfer here.
    #[error("unknown transfer {0}")]
    UnknownTransfer(TransferId),
    /// The credit's available atoms do not cover the amount.
    #[error("insufficient available balance: need {need:?}, have {have:?}")]
    Insufficient {
        /// What was asked for.
        need: Vector,
        /// What is available.
        have: Vector,
    },
    /// The atoms an amount would take lie in more ranges than a footprint may carry on the
    /// wire ([`MAX_RANGES`](abhyasa_wire::ledger::MAX_RANGES)): a permit or certificate made
    /// of them could never be read by its receiver. Refused before anything is signed.
    #[error("too fragmented: the amount would span {ranges} ranges in {dim} (at most {limit})")]
    Fragmented {
        /// The dimension.
        dim: String,
        /// The ranges it would span.
        ranges: usize,
        /// The most a footprint may carry.
        limit: usize,
    },
    /// A label that is not within its parent's.
    #[error("label is not an attenuation of the credit's label")]
    LabelNotAttenuated,
    /// The effect's purpose is not allowed by the credit's label.
    #[error("purpose not allowed by the credit's label")]
    PurposeNotAllowed,
    /// An id that is already in use for something else.
    #[error("id already used: {0}")]
    IdInUse(&'static str),
    /// The journal is at its limit (`BranchConfig::max_journal_steps`): no new work.
    #[error("the ledger journal is full ({limit} steps): no new work until it is compacted")]
    JournalFull {
        /// The limit.
        limit: u64,
    },
    /// The transition does not apply in the current state.
    #[error("not allowed in this state: {0}")]
    WrongState(&'static str),
    /// Join inputs that are not pairwise disjoint, of different roots, repeated, or busy.
    #[error("join refused: {0}")]
    Join(&'static str),
    /// Evidence that does not match the operation's binding.
    #[error("evidence does not match the binding: {0}")]
    Mismatch(&'static str),
    /// Arithmetic overflow.
    #[error("arithmetic overflow")]
    Overflow,
    /// Evidence signed by a keyring member that is not the party it is about.
    #[error("{what} must be signed by {expected}, not {signer}")]
    WrongParty {
        /// What the evidence is.
        what: &'static str,
        /// Who must sign it.
        expected: AgentId,
        /// Who did.
        signer: AgentId,
    },
}

/// Opens a stored checkpoint: signed under `tag` by `owner` itself (with its key in
/// `keys`), its body read with the checkpoint size limit.
pub(crate) fn open_checkpoint<T: serde::de::DeserializeOwned>(
    record: &SignedRecord,
    owner: &AgentId,
    keys: &Keyring,
    tag: &str,
    what: &'static str,
) -> Result<T, LedgerError> {
    if &record.signer != owner {
        return Err(LedgerError::WrongParty {
            what,
            expected: owner.clone(),
            signer: record.signer.clone(),
        });
    }
    let key = keys
        .get(owner)
        .ok_or(SignatureError::UnexpectedSigner(owner.clone()))?;
    let body = record.open(tag, &key)?;
    Ok(abhyasa_wire::decode_with_limit(body, MAX_CHECKPOINT_BYTES)?)
}

/// A token that confirms a persisted record (the same type the custody machines use).
pub use abhyasa_wire::PersistToken;

/// A deliberately broken rule, selectable only to prove that the checkers catch it.
#[doc(hidden)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum LedgerMutation {
    /// The branch returns quarantined atoms to Available when a query goes unanswered.
    RefundOnTimeout,
    /// The destination accepts a transfer certificate it has already decided.
    AcceptReplayedTransfer,
    /// Join does not check that its inputs are distinct and disjoint.
    JoinWithoutDisjointness,
    /// The gateway ignores the epoch fence when accepting a permit.
    GatewayWithoutFence,
    /// The gateway accepts (and runs) a key it has already accepted.
    GatewayAcceptsKeyTwice,
    /// Branch and gateway take evidence signed by any keyring member, not only by the party
    /// it is about.
    EvidenceFromAnyMember,
    /// The source cancels a sealed transfer by itself when the destination's decision is slow
    /// to come, instead of waiting for a signed refusal.
    CancelTransferOnTimeout,
    /// The branch releases a reservation it has already dispatched (Quarantined → Available).
    ReleaseAfterDispatch,
    /// The branch sends a step's messages before the step is durable.
    SendBeforePersist,
    /// A receipt that arrives after a forfeit settles the operation and returns its remainder,
    /// undoing the forfeit.
    UnforfeitOnLateEvidence,
    /// The branch reserves less than the effect's maximum charge (one atom short), so an
    /// effect may be charged atoms its escrow does not cover.
    ReserveBelowMaximum,
    /// The gateway passes no limit to the executor and signs whatever charge it reports, even
    /// above the binding's maximum.
    GatewayWithoutClamp,
    /// The gateway runs the effect as it arrives without recomputing the binding from it (the
    /// effect's digest, maximum charge, receiver, payer and footprint).
    GatewayTrustsBinding,
    /// The gateway proves no-effect from a fence that is applied but not yet durable (a crash
    /// can lose the fence and let the permit in after the proof went out).
    NoEffectBeforeDurableFence,
    /// The branch reissues a generation that still has operations in progress (their
    /// remainders come back later to a closed credit).
    ReissueWithWorkInProgress,
    /// A checkpoint folds forfeited operations as if they had ended without effect: their
    /// atoms, charged for ever, vanish from every bucket.
    CheckpointDropsForfeited,
    /// The gateway forgets a settled acceptance at once, before its permit expired: a replay
    /// of the permit is accepted and run again.
    PruneBeforeExpiry,
    /// The gateway accepts a permit past its expiry.
    GatewayAcceptsExpired,
    /// The destination of a transfer that asks for confirmation takes the credit at once,
    /// without waiting for the source to confirm its claim.
    AcceptWithoutConfirmation,
    /// The source reclaims a transfer even after it confirmed the destination's claim.
    ReclaimAfterConfirm,
    /// The branch's timer is not armed again after its first resend: `poll_timeout` says
    /// nothing is due while transfers and dispatches are still undecided.
    TimerNotRearmed,
    /// A checkpoint forgets every ended operation at a gateway that sent a horizon, not
    /// only those whose permits expired before it.
    ForgetBeforeHorizon,
}

impl LedgerMutation {
    /// Every mutant, with its command-line name.
    pub const ALL: [(&'static str, LedgerMutation); 22] = [
        ("refund_on_timeout", LedgerMutation::RefundOnTimeout),
        (
            "accept_replayed_transfer",
            LedgerMutation::AcceptReplayedTransfer,
        ),
        (
            "join_without_disjointness",
            LedgerMutation::JoinWithoutDisjointness,
        ),
        ("gateway_without_fence", LedgerMutation::GatewayWithoutFence),
        (
            "gateway_accepts_key_twice",
            LedgerMutation::GatewayAcceptsKeyTwice,
        ),
        (
            "evidence_from_any_member",
            LedgerMutation::EvidenceFromAnyMember,
        ),
        (
            "cancel_transfer_on_timeout",
            LedgerMutation::CancelTransferOnTimeout,
        ),
        (
            "release_after_dispatch",
            LedgerMutation::ReleaseAfterDispatch,
        ),
        ("send_before_persist", LedgerMutation::SendBeforePersist),
        (
            "unforfeit_on_late_evidence",
            LedgerMutation::UnforfeitOnLateEvidence,
        ),
        ("reserve_below_maximum", LedgerMutation::ReserveBelowMaximum),
        ("gateway_without_clamp", LedgerMutation::GatewayWithoutClamp),
        (
            "gateway_trusts_binding",
            LedgerMutation::GatewayTrustsBinding,
        ),
        (
            "no_effect_before_durable_fence",
            LedgerMutation::NoEffectBeforeDurableFence,
        ),
        (
            "reissue_with_work_in_progress",
            LedgerMutation::ReissueWithWorkInProgress,
        ),
        (
            "checkpoint_drops_forfeited",
            LedgerMutation::CheckpointDropsForfeited,
        ),
        ("prune_before_expiry", LedgerMutation::PruneBeforeExpiry),
        (
            "gateway_accepts_expired",
            LedgerMutation::GatewayAcceptsExpired,
        ),
        (
            "accept_without_confirmation",
            LedgerMutation::AcceptWithoutConfirmation,
        ),
        ("reclaim_after_confirm", LedgerMutation::ReclaimAfterConfirm),
        ("timer_not_rearmed", LedgerMutation::TimerNotRearmed),
        ("forget_before_horizon", LedgerMutation::ForgetBeforeHorizon),
    ];
}

#[cfg(test)]
mod tests;
