//! Budget-ledger wire objects (docs/DESIGN.md, "The ledger: the rules"): resource vectors, range-compressed atom
//! footprints, root grants, transfer certificates and decisions, dispatch permits with their
//! operation binding, gateway receipts and no-effect proofs, epoch fences, status queries.
//!
//! Signed objects travel as [`Signed`]: the exact canonical CBOR bytes of the body, the
//! signer, and an ed25519 signature over a domain-separated message (`abhyasa/v1/ledger/`,
//! the object's tag, a zero byte, the body bytes). [`Signed::open`] verifies by the project's
//! one rule ([`crate::sig`]: ZIP 215, no small-order keys, no non-canonical `s`, the same
//! answer alone or in a batch), decodes strictly, checks
//! the object's own rules, and refuses a body that is not in canonical form, so one value
//! has exactly one signed form.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::marker::PhantomData;

use ed25519_dalek::{Signature, Signer, SigningKey, VerifyingKey};
use serde::de::{self, DeserializeOwned, Visitor};
use serde::{Deserialize, Deserializer, Serialize, Serializer};
use sha2::{Digest as _, Sha256};

use crate::{decode, encode, AgentId, UnixMillis, WireError};

mod atoms;
mod signed;
pub use atoms::{Dim, Footprint, Label, Ranges, Vector};
pub use signed::*;

#[cfg(test)]
mod tests;

macro_rules! id16 {
    ($(#[$m:meta])* $name:ident, $what:literal) => {
        $(#[$m])*
        #[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
        pub struct $name([u8; 16]);

        impl $name {
            /// Builds the id from a 128-bit integer (big-endian bytes).
            pub const fn from_u128(v: u128) -> Self {
                Self(v.to_be_bytes())
            }

            /// The id as an integer.
            pub const fn to_u128(self) -> u128 {
                u128::from_be_bytes(self.0)
            }
        }

        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                write!(f, "{:x}", self.to_u128())
            }
        }

        impl fmt::Debug for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                write!(f, concat!(stringify!($name), "({})"), self)
            }
        }

        impl Serialize for $name {
            fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
                s.serialize_bytes(&self.0)
            }
        }

        impl<'de> Deserialize<'de> for $name {
            fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
                d.deserialize_bytes(FixedBytes::<16>($what)).map(Self)
            }
        }
    };
}

id16!(
    /// A root grant.
    RootId,
    "a 16-byte root id"
);
id16!(
    /// A credit (globally unique: minted by its holder).
    CreditId,
    "a 16-byte credit id"
);
id16!(
    /// A transfer between two branches.
    TransferId,
    "a 16-byte transfer id"
);
id16!(
    /// An operation's canonical idempotency key.
    OpKey,
    "a 16-byte operation key"
);

struct FixedBytes<const N: usize>(&'static str);

impl<const N: usize> Visitor<'_> for FixedBytes<N> {
    type Value = [u8; N];
    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.0)
    }
    fn visit_bytes<E: de::Error>(self, v: &[u8]) -> Result<[u8; N], E> {
        v.try_into().map_err(|_| E::invalid_length(v.len(), &self))
    }
}

/// A SHA-256 digest.
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Digest(pub [u8; 32]);

impl Digest {
    /// SHA-256 of `parts`, each length-prefixed.
    pub fn of(parts: &[&[u8]]) -> Self {
        let mut h = Sha256::new();
        for p in parts {
            h.update((p.len() as u64).to_be_bytes());
            h.update(p);
        }
        Self(h.finalize().into())
    }
}

impl fmt::Debug for Digest {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Digest(")?;
        for b in &self.0[..6] {
            write!(f, "{b:02x}")?;
        }
        write!(f, "…)")
    }
}

impl Serialize for Digest {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_bytes(&self.0)
    }
}

impl<'de> Deserialize<'de> for Digest {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        d.deserialize_bytes(FixedBytes::<32>("a 32-byte digest"))
            .map(Self)
    }
}

/// Most dimensions in one vector or footprint.
pub const MAX_DIMS: usize = 16;

/// Most ranges in one dimension of a footprint.
pub const MAX_RANGES: usize = 256;

/// An issuer's grant of a root budget to its first holder.
#[derive(Clone, PartialEq, Eq, Hash, Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RootGrant {
    /// The root.
    pub root: RootId,
    /// Who signs it.
    pub issuer: AgentId,
    /// The branch that holds the root credit.
    pub holder: AgentId,
    /// `B_g`.
    pub budget: Vector,
    /// What the root may be spent on.
    pub label: Label,
    /// When.
    pub issued_at: UnixMillis,
}

/// A sealed transfer of a footprint from one branch to another.
#[derive(Clone, PartialEq, Eq, Hash, Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TransferCert {
    /// The root the atoms belong to.
    pub root: RootId,
    /// Unique per root; acceptance is keyed on (root, transfer).
    pub transfer: TransferId,
    /// The sending branch (the signer).
    pub source: AgentId,
    /// The receiving branch.
    pub destination: AgentId,
    /// The credit the atoms left.
    pub source_credit: CreditId,
    /// The atoms.
    pub footprint: Footprint,
    /// The child's label (within the source credit's).
    pub label: Label,
    /// The destination may take the atoms only once the source confirms its claim (a
    /// [`SourceDecision`] naming the credit), and the source may reclaim the transfer — a
    /// [`SourceDecision`] naming none — as long as it has not confirmed one: the source's
    /// journal is the one compare-and-set both decisions go through (paper §5.4: destination
    /// exclusion plus a competing compare-and-set), so a transfer to a destination that is
    /// lost before it claims can be taken back without any word from it. Absent (`false`):
    /// the destination's own decision is final, and only its refusal gives the atoms back;
    /// an absent field encodes as before, so older certificates keep their digests.
    #[serde(default, skip_serializing_if = "is_false")]
    pub confirm: bool,
}

fn is_false(b: &bool) -> bool {
    !*b
}

impl TransferCert {
    /// The digest a decision binds.
    pub fn digest(&self) -> Digest {
        Digest::of(&[b"abhyasa/v1/transfer", &encode(self)])
    }
}

/// The destination's decision on a transfer: accepted (once, creating `credit`) or refused
/// (durably: it will never accept it). Only a refusal lets the source cancel. It binds the
/// certificate it decides (its digest and source), so it cannot be replayed against another.
#[derive(Clone, PartialEq, Eq, Hash, Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TransferDecision {
    /// The root.
    pub root: RootId,
    /// The transfer.
    pub transfer: TransferId,
    /// The digest of the certificate decided ([`TransferCert::digest`]).
    pub cert: Digest,
    /// The certificate's source.
    pub source: AgentId,
    /// The deciding branch (the signer).
    pub destination: AgentId,
    /// The child credit created, or `None` for a refusal.
    pub credit: Option<CreditId>,
}

/// The source's decision on a transfer whose certificate asks for it
/// ([`TransferCert::confirm`]): the destination's claim confirmed (`credit`: the atoms are
/// the destination's, as that credit), or the transfer reclaimed (`None`: they are the
/// source's again, and the destination will never take them). Written once, in the source's
/// journal, whichever comes first; bound to the certificate's digest and destination.
#[derive(Clone, PartialEq, Eq, Hash, Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SourceDecision {
    /// The root.
    pub root: RootId,
    /// The transfer.
    pub transfer: TransferId,
    /// The digest of the certificate decided ([`TransferCert::digest`]).
    pub cert: Digest,
    /// The certificate's source (the signer).
    pub source: AgentId,
    /// The certificate's destination.
    pub destination: AgentId,
    /// The destination's credit, confirmed; `None`: reclaimed.
    pub credit: Option<CreditId>,
}

/// The full operation binding a permit authorizes and a gateway recomputes.
#[derive(Clone, PartialEq, Eq, Hash, Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Binding {
    /// The root.
    pub root: RootId,
    /// The paying credit.
    pub credit: CreditId,
    /// Its generation.
    pub generation: u32,
    /// Its epoch (the gateway refuses permits below its fence).
    pub epoch: u64,
    /// Digest of the normalized effect.
    pub effect: Digest,
    /// The gateway that may accept it.
    pub receiver: AgentId,
    /// Most the effect may charge.
    pub max_charge: Vector,
    /// The canonical idempotency key.
    pub key: OpKey,
    /// The branch that pays (the permit's signer).
    pub payer: AgentId,
    /// After this instant (Unix ms, the gateway's clock) the gateway refuses the permit, and
    /// once the acceptance of an expired permit has settled and outlived the gateway's
    /// retention, the gateway may forget it. Absent: never expires (and is never forgotten:
    /// a gateway that forgets refuses such a permit, `Refusal::NoExpiry`);
    /// an absent field encodes as before, so older bindings keep their digests.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub expires: Option<UnixMillis>,
}

impl Binding {
    /// The digest receipts and proofs refer to.
    pub fn digest(&self) -> Digest {
        Digest::of(&[b"abhyasa/v1/binding", &encode(self)])
    }
}

/// A signed dispatch permit: the binding and the reserved atoms that cover it.
#[derive(Clone, PartialEq, Eq, Hash, Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Permit {
    /// What is authorized.
    pub binding: Binding,
    /// The reserved atoms (their size is the maximum charge).
    pub footprint: Footprint,
}

/// A normalized effect: what the gateway runs. Its digest is what a permit binds.
#[derive(Clone, PartialEq, Eq, Hash, Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Effect {
    /// The purpose (must be allowed by the paying credit's label).
    pub purpose: Dim,
    /// The operation, normalized by the caller (e.g. a tool name and canonical arguments).
    pub operation: String,
    /// What the effect would charge at most.
    pub max_charge: Vector,
    /// The binding that carries this effect's permit and receipt itself, by name (`"mcp"`:
    /// the permit rides the tool call and the receipt its result), so its dispatch never
    /// goes on the ledger track; `None`: the ledger track carries them. Part of the digest,
    /// so a permit says how it travels. Absent from the encoding when `None`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub carried_by: Option<String>,
}

impl Effect {
    /// The effect digest.
    pub fn digest(&self) -> Digest {
        Digest::of(&[b"abhyasa/v1/effect", &encode(self)])
    }
}

/// A gateway's receipt: the effect of `key` ran, charging `actual`.
#[derive(Clone, PartialEq, Eq, Hash, Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Receipt {
    /// The operation.
    pub key: OpKey,
    /// Digest of its binding.
    pub binding: Digest,
    /// The gateway (the signer).
    pub gateway: AgentId,
    /// The actual charge (≤ the binding's maximum).
    pub actual: Vector,
}

/// A gateway's proof that `key` was never accepted and, below `fence`, never can be.
#[derive(Clone, PartialEq, Eq, Hash, Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NoEffect {
    /// The operation.
    pub key: OpKey,
    /// Digest of its binding.
    pub binding: Digest,
    /// The gateway (the signer).
    pub gateway: AgentId,
    /// The fence in force: the binding's epoch is below it.
    pub fence: u64,
}

/// A request to raise the epoch fence of a credit at a gateway.
#[derive(Clone, PartialEq, Eq, Hash, Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Fence {
    /// The root.
    pub root: RootId,
    /// The credit.
    pub credit: CreditId,
    /// Permits below this epoch are refused from now on.
    pub epoch: u64,
    /// The credit's holder (the signer).
    pub holder: AgentId,
}

/// A gateway's confirmation that a fence is durable.
#[derive(Clone, PartialEq, Eq, Hash, Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Fenced {
    /// The credit.
    pub credit: CreditId,
    /// The fence now in force (at least the one asked for).
    pub epoch: u64,
    /// The gateway (the signer).
    pub gateway: AgentId,
}

/// Why a gateway refused a permit.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Refusal {
    /// The signature or the signer is wrong.
    BadSignature,
    /// A field of the binding does not match what the gateway recomputed.
    BindingMismatch,
    /// The permit's epoch is below the fence.
    Fenced,
    /// The effect could charge more than the permit's maximum.
    OverMaximum,
    /// The key was accepted before with another binding.
    KeyConflict,
    /// The permit expired (its binding's `expires` is past the gateway's clock).
    Expired,
    /// The binding expired before what the gateway has pruned: it can neither accept it nor
    /// prove it never had an effect (the payer's operation can only be forfeited).
    Forgotten,
    /// The permit carries no expiry and the gateway forgets settled acceptances: it would have
    /// to keep this one for ever, so it takes only permits that expire.
    NoExpiry,
}

/// Everything on a `ledger/<peer>` track.
#[derive(Clone, PartialEq, Eq, Debug, Serialize, Deserialize)]
#[serde(rename_all = "snake_case", deny_unknown_fields)]
pub enum LedgerMessage {
    /// A sealed transfer, source → destination.
    Transfer(Signed<TransferCert>),
    /// Its decision, destination → source (for a certificate that asks for confirmation,
    /// an acceptance is a claim the source confirms or answers with its reclaim).
    Decision(Signed<TransferDecision>),
    /// The source's confirmation of a claim, or its reclaim, source → destination.
    SourceDecision(Signed<SourceDecision>),
    /// A permit and its effect, payer → gateway.
    Dispatch {
        /// The permit.
        permit: Signed<Permit>,
        /// The effect it pays for.
        effect: Effect,
    },
    /// A receipt, gateway → payer.
    Receipt(Signed<Receipt>),
    /// A no-effect proof, gateway → payer.
    NoEffect(Signed<NoEffect>),
    /// A refused permit, gateway → payer (the atoms stay quarantined: a refusal is evidence
    /// only once the fence proves it final, through a [`NoEffect`]).
    Refused {
        /// The operation.
        key: OpKey,
        /// Why.
        reason: Refusal,
    },
    /// A reconciliation query for an operation, payer → gateway.
    Query {
        /// The operation.
        key: OpKey,
        /// Its binding, so the gateway can prove no-effect for exactly it.
        binding: Box<Binding>,
    },
    /// The answer when the gateway can prove nothing yet (accepted and running, or not
    /// accepted and not fenced).
    Pending {
        /// The operation.
        key: OpKey,
    },
    /// Gateway → payer, once the record of a prune is durable: every acceptance of this
    /// payer whose permit expires before `horizon` is forgotten, and no permit expiring before
    /// it will be accepted again. The payer may then forget its own summaries of those
    /// operations. Unsigned like [`Pending`](Self::Pending): it names no operation and proves
    /// nothing to a third party; a payer takes it only from the gateway itself.
    Horizon {
        /// Bindings of this payer at this gateway expiring before this instant are gone.
        horizon: UnixMillis,
    },
    /// A fence request, holder → gateway.
    Fence(Signed<Fence>),
    /// Its confirmation, gateway → holder.
    Fenced(Signed<Fenced>),
}

/// A signed object's signature, what it signs and who claims it ([`Signed::to_verify`]).
#[derive(Debug)]
pub struct ToVerify<'a> {
    /// The agent that claims the signature.
    pub signer: &'a AgentId,
    /// [`Signed::fingerprint`].
    pub fingerprint: Digest,
    /// The exact bytes signed (domain tag and body).
    pub message: Vec<u8>,
    /// The signature, if it has a signature's length.
    pub signature: Option<Signature>,
}

impl LedgerMessage {
    /// The signed object this message carries at its top, if any (what its receiver verifies
    /// first).
    pub fn to_verify(&self) -> Option<ToVerify<'_>> {
        match self {
            LedgerMessage::Transfer(s) => Some(s.to_verify()),
            LedgerMessage::Decision(s) => Some(s.to_verify()),
            LedgerMessage::SourceDecision(s) => Some(s.to_verify()),
            LedgerMessage::Dispatch { permit, .. } => Some(permit.to_verify()),
            LedgerMessage::Receipt(s) => Some(s.to_verify()),
            LedgerMessage::NoEffect(s) => Some(s.to_verify()),
            LedgerMessage::Fence(s) => Some(s.to_verify()),
            LedgerMessage::Fenced(s) => Some(s.to_verify()),
            LedgerMessage::Refused { .. }
            | LedgerMessage::Query { .. }
            | LedgerMessage::Pending { .. }
            | LedgerMessage::Horizon { .. } => None,
        }
    }
}
