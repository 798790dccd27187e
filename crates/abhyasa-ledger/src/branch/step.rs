//! What a branch journals ([`Step`]: every durable change, replayed on recovery) and what it
//! reports ([`LedgerEvent`]).

use super::*;

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
