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
pub use atoms::{Dim, Footprint, Label, Ranges, Vector};

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

/// A ledger object that is signed.
pub trait SignedObject: Serialize + DeserializeOwned {
    /// The domain-separation tag.
    const TAG: &'static str;
    /// Rules typing does not capture.
    fn validate(&self) -> Result<(), &'static str> {
        Ok(())
    }
}

impl SignedObject for RootGrant {
    const TAG: &'static str = "root_grant";
    fn validate(&self) -> Result<(), &'static str> {
        if self.budget.is_zero() {
            return Err("a root grant with no budget");
        }
        Ok(())
    }
}
impl SignedObject for TransferCert {
    const TAG: &'static str = "transfer";
    fn validate(&self) -> Result<(), &'static str> {
        if self.footprint.is_empty() {
            return Err("a transfer of nothing");
        }
        if self.source == self.destination {
            return Err("a transfer to itself");
        }
        Ok(())
    }
}
impl SignedObject for TransferDecision {
    const TAG: &'static str = "decision";
}
impl SignedObject for SourceDecision {
    const TAG: &'static str = "source_decision";
}
impl SignedObject for Permit {
    const TAG: &'static str = "permit";
    fn validate(&self) -> Result<(), &'static str> {
        if self.footprint.size() != self.binding.max_charge {
            return Err("permit footprint does not match its maximum charge");
        }
        Ok(())
    }
}
impl SignedObject for Receipt {
    const TAG: &'static str = "receipt";
}
impl SignedObject for NoEffect {
    const TAG: &'static str = "no_effect";
}
impl SignedObject for Fence {
    const TAG: &'static str = "fence";
}
impl SignedObject for Fenced {
    const TAG: &'static str = "fenced";
}

/// Why a signed object was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SignatureError {
    /// The signature does not verify for the claimed signer's key.
    #[error("signature does not verify")]
    BadSignature,
    /// The signer is not the one expected, or unknown.
    #[error("unexpected signer {0}")]
    UnexpectedSigner(AgentId),
    /// The body does not decode.
    #[error(transparent)]
    Body(#[from] WireError),
    /// The body decodes but is not in canonical form.
    #[error("body is not in canonical form")]
    NotCanonical,
    /// The body breaks a rule.
    #[error("invalid object: {0}")]
    Invalid(&'static str),
}

/// A signed object: the exact body bytes, the signer, the signature.
#[derive(Serialize, Deserialize)]
#[serde(bound = "", deny_unknown_fields)]
pub struct Signed<T> {
    /// Who signed.
    pub signer: AgentId,
    body: Bytes,
    signature: Bytes,
    #[serde(skip)]
    _t: PhantomData<fn() -> T>,
}

impl<T> Clone for Signed<T> {
    fn clone(&self) -> Self {
        Self {
            signer: self.signer.clone(),
            body: self.body.clone(),
            signature: self.signature.clone(),
            _t: PhantomData,
        }
    }
}

impl<T> PartialEq for Signed<T> {
    fn eq(&self, o: &Self) -> bool {
        (&self.signer, &self.body, &self.signature) == (&o.signer, &o.body, &o.signature)
    }
}

impl<T> Eq for Signed<T> {}

impl<T> std::hash::Hash for Signed<T> {
    fn hash<H: std::hash::Hasher>(&self, h: &mut H) {
        (&self.signer, &self.body, &self.signature).hash(h)
    }
}

impl<T: SignedObject> fmt::Debug for Signed<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Signed<{}>(by {}, ", T::TAG, self.signer)?;
        match decode::<T>(&self.body.0) {
            Ok(_) => write!(f, "{} bytes)", self.body.0.len()),
            Err(_) => write!(f, "unreadable body)"),
        }
    }
}

#[derive(Clone, PartialEq, Eq, Hash)]
struct Bytes(Vec<u8>);

impl Serialize for Bytes {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_bytes(&self.0)
    }
}

impl<'de> Deserialize<'de> for Bytes {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl Visitor<'_> for V {
            type Value = Bytes;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a byte string")
            }
            fn visit_bytes<E: de::Error>(self, v: &[u8]) -> Result<Bytes, E> {
                Ok(Bytes(v.to_vec()))
            }
            fn visit_byte_buf<E: de::Error>(self, v: Vec<u8>) -> Result<Bytes, E> {
                Ok(Bytes(v))
            }
        }
        d.deserialize_byte_buf(V)
    }
}

fn message(tag: &str, body: &[u8]) -> Vec<u8> {
    let mut m = Vec::with_capacity(24 + tag.len() + body.len());
    m.extend_from_slice(b"abhyasa/v1/ledger/");
    m.extend_from_slice(tag.as_bytes());
    m.push(0);
    m.extend_from_slice(body);
    m
}

impl<T: SignedObject> Signed<T> {
    /// Signs `value` as `signer` with `key`.
    pub fn sign(value: &T, signer: &AgentId, key: &SigningKey) -> Self {
        let body = encode(value);
        let signature = key.sign(&message(T::TAG, &body));
        Self {
            signer: signer.clone(),
            body: Bytes(body),
            signature: Bytes(signature.to_bytes().to_vec()),
            _t: PhantomData,
        }
    }

    /// Verifies the signature with `key` and returns the value.
    pub fn open(&self, key: &VerifyingKey) -> Result<T, SignatureError> {
        let sig: [u8; 64] = self
            .signature
            .0
            .as_slice()
            .try_into()
            .map_err(|_| SignatureError::BadSignature)?;
        if !crate::sig::verify(
            key,
            &message(T::TAG, &self.body.0),
            &Signature::from_bytes(&sig),
        ) {
            return Err(SignatureError::BadSignature);
        }
        self.decode_checked()
    }

    /// Everything [`open`](Self::open) checks except the signature: the body decodes, is
    /// canonical and valid. Only for a caller that has verified these exact bytes (same
    /// [`fingerprint`](Self::fingerprint)) under the same key before.
    pub fn decode_checked(&self) -> Result<T, SignatureError> {
        let value: T = decode(&self.body.0)?;
        if encode(&value) != self.body.0 {
            return Err(SignatureError::NotCanonical);
        }
        value.validate().map_err(SignatureError::Invalid)?;
        Ok(value)
    }

    /// A digest of the whole signed object — tag, signer, body and signature — under which
    /// a successful verification can be remembered.
    pub fn fingerprint(&self) -> Digest {
        Digest::of(&[
            T::TAG.as_bytes(),
            self.signer.as_str().as_bytes(),
            &self.body.0,
            &self.signature.0,
        ])
    }

    /// What verifying this object's signature takes besides the key, to verify it together
    /// with others ([`crate::sig::Batch`]) and remember the answer under its fingerprint.
    pub fn to_verify(&self) -> ToVerify<'_> {
        ToVerify {
            signer: &self.signer,
            fingerprint: self.fingerprint(),
            message: message(T::TAG, &self.body.0),
            signature: <[u8; 64]>::try_from(self.signature.0.as_slice())
                .ok()
                .map(|s| Signature::from_bytes(&s)),
        }
    }

    /// [`open`](Self::open) with the key `keys` holds for the signer, checking the signer
    /// is `expected`.
    pub fn open_from(
        &self,
        expected: &AgentId,
        keys: &impl Fn(&AgentId) -> Option<VerifyingKey>,
    ) -> Result<T, SignatureError> {
        if &self.signer != expected {
            return Err(SignatureError::UnexpectedSigner(self.signer.clone()));
        }
        let key =
            keys(&self.signer).ok_or(SignatureError::UnexpectedSigner(self.signer.clone()))?;
        self.open(key_ref(&key))
    }

    /// The body without checking the signature — for logs and checkers that verify
    /// separately. Never act on it unverified.
    pub fn peek(&self) -> Result<T, WireError> {
        decode(&self.body.0)
    }

    /// A copy whose body byte `at` is flipped (tests of strict verification).
    #[doc(hidden)]
    pub fn tampered(&self, at: usize) -> Self {
        let mut s = self.clone();
        if let Some(b) = s.body.0.get_mut(at) {
            *b ^= 1;
        }
        s
    }
}

/// A signed record that is stored, never sent: its body may be larger than the wire's
/// object limit (a branch checkpoint). The signature covers a domain tag and the exact body
/// bytes, like [`Signed`].
#[derive(Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SignedRecord {
    /// Who signed.
    pub signer: AgentId,
    body: Bytes,
    signature: Bytes,
}

impl SignedRecord {
    /// Signs `body` under the domain `tag` as `signer` with `key`.
    pub fn sign(tag: &str, body: Vec<u8>, signer: &AgentId, key: &SigningKey) -> Self {
        let signature = key.sign(&message(tag, &body));
        Self {
            signer: signer.clone(),
            body: Bytes(body),
            signature: Bytes(signature.to_bytes().to_vec()),
        }
    }

    /// The body, once its signature under `tag` verifies with `key`.
    pub fn open(&self, tag: &str, key: &VerifyingKey) -> Result<&[u8], SignatureError> {
        let sig: [u8; 64] = self
            .signature
            .0
            .as_slice()
            .try_into()
            .map_err(|_| SignatureError::BadSignature)?;
        if !crate::sig::verify(
            key,
            &message(tag, &self.body.0),
            &Signature::from_bytes(&sig),
        ) {
            return Err(SignatureError::BadSignature);
        }
        Ok(&self.body.0)
    }

    /// The body's length in bytes.
    pub fn len(&self) -> usize {
        self.body.0.len()
    }

    /// Whether the body is empty.
    pub fn is_empty(&self) -> bool {
        self.body.0.is_empty()
    }

    /// A copy whose body byte `at` is flipped (tests of strict verification).
    #[doc(hidden)]
    pub fn tampered(&self, at: usize) -> Self {
        let mut s = self.clone();
        if let Some(b) = s.body.0.get_mut(at) {
            *b ^= 1;
        }
        s
    }
}

impl fmt::Debug for SignedRecord {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "SignedRecord(by {}, {} bytes)",
            self.signer,
            self.body.0.len()
        )
    }
}

fn key_ref(k: &VerifyingKey) -> &VerifyingKey {
    k
}

/// A deterministic signing key from 32 seed bytes (tests, simulation, key files).
pub fn signing_key(seed: [u8; 32]) -> SigningKey {
    SigningKey::from_bytes(&seed)
}

pub use ed25519_dalek::{SigningKey as LedgerSigningKey, VerifyingKey as LedgerVerifyingKey};

#[cfg(test)]
mod tests {
    use std::collections::BTreeSet;

    use proptest::prelude::*;

    use super::*;

    fn set(r: &Ranges) -> BTreeSet<u64> {
        r.ranges().iter().flat_map(|&(s, e)| s..e).collect()
    }

    fn dim() -> Dim {
        Dim::new("cents").unwrap()
    }

    fn one_dim(r: &Ranges) -> Footprint {
        Footprint::from_dims([(dim(), r.clone())]).unwrap()
    }

    fn ranges() -> impl Strategy<Value = Ranges> {
        proptest::collection::vec((0u64..200, 1u64..20), 0..8).prop_map(|v| {
            let mut seen = BTreeSet::new();
            let atoms: Vec<(u64, u64)> = v
                .into_iter()
                .filter(|&(s, l)| (s..s + l).all(|a| seen.insert(a)))
                .map(|(s, l)| (s, s + l))
                .collect();
            Ranges::from_ranges(atoms).expect("disjoint by construction")
        })
    }

    proptest! {
        #[test]
        fn range_algebra_matches_a_set_of_atoms(a in ranges(), b in ranges(), c in ranges(), n in 0u64..300) {
            let (sa, sb) = (set(&a), set(&b));
            prop_assert_eq!(a.len(), sa.len() as u64);
            prop_assert_eq!(a.is_disjoint(&b), sa.is_disjoint(&sb));
            match a.union(&b) {
                Some(u) => {
                    prop_assert_eq!(set(&u), &sa | &sb);
                    // Canonical: sorted, disjoint, non-adjacent, no empty range.
                    let r = u.ranges();
                    prop_assert!(r.iter().all(|&(s, e)| s < e));
                    prop_assert!(r.windows(2).all(|w| w[0].1 < w[1].0), "{:?}", u);
                }
                None => prop_assert!(!sa.is_disjoint(&sb)),
            }
            match a.take_lowest(n) {
                Some((t, r)) => {
                    prop_assert_eq!(t.len(), n);
                    prop_assert_eq!(&set(&t) | &set(&r), sa.clone());
                    prop_assert!(set(&t).is_disjoint(&set(&r)));
                    // The lowest atoms, exactly.
                    let lowest: BTreeSet<u64> = sa.iter().copied().take(n as usize).collect();
                    prop_assert_eq!(set(&t), lowest);
                    prop_assert_eq!(a.subtract(&t).map(|x| set(&x)), Some(set(&r)));
                }
                None => prop_assert!(n > sa.len() as u64),
            }
            if !sb.is_subset(&sa) {
                prop_assert!(a.subtract(&b).is_none());
            }
            // Many at once: defined exactly when pairwise disjoint, the union of their atoms.
            let (fa, fb) = (one_dim(&a), one_dim(&b));
            let parts = [fa.clone(), fb.clone(), one_dim(&c)];
            let sc = set(&c);
            let disjoint = sa.is_disjoint(&sb) && sa.is_disjoint(&sc) && sb.is_disjoint(&sc);
            match Footprint::union_all(&parts) {
                Some(u) => {
                    prop_assert!(disjoint);
                    let all = u.dim(&dim()).cloned().unwrap_or_default();
                    prop_assert_eq!(set(&all), &(&sa | &sb) | &sc);
                    let r = all.ranges();
                    prop_assert!(r.iter().all(|&(s, e)| s < e));
                    prop_assert!(r.windows(2).all(|w| w[0].1 < w[1].0), "{:?}", all);
                }
                None => prop_assert!(!disjoint),
            }
            // Canonical form survives the wire, and only it decodes.
            let back: Ranges = decode(&encode(&a)).unwrap();
            prop_assert_eq!(back, a);
        }
    }

    proptest! {
        /// A dimension held inline behaves as the text it holds: ordered, compared and
        /// encoded as that string (so vectors keep their canonical order on the wire).
        #[test]
        fn a_dimension_is_its_text(a in "[a-z0-9_]{1,32}", b in "[a-z0-9_]{1,32}") {
            let (da, db) = (Dim::new(a.clone()).unwrap(), Dim::new(b.clone()).unwrap());
            prop_assert_eq!(da.as_str(), a.as_str());
            prop_assert_eq!(da.cmp(&db), a.cmp(&b));
            prop_assert_eq!(da == db, a == b);
            prop_assert_eq!(encode(&da), encode(&a));
            prop_assert_eq!(decode::<Dim>(&encode(&a)).unwrap(), da.clone());
            prop_assert_eq!(format!("{da}"), a.clone());
            prop_assert_eq!(format!("{da:?}"), format!("Dim({a:?})"));
        }
    }

    #[test]
    fn dimension_names_over_32_bytes_or_outside_the_alphabet_are_refused() {
        assert!(Dim::new("a".repeat(32)).is_ok());
        for bad in [
            "a".repeat(33),
            String::new(),
            "Cents".into(),
            "c-d".into(),
            "é".into(),
        ] {
            assert!(Dim::new(bad.clone()).is_err(), "{bad:?}");
            assert!(decode::<Dim>(&encode(&bad)).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn non_canonical_ranges_vectors_and_footprints_do_not_decode() {
        for bad in [
            vec![(5u64, 3u64)],
            vec![(0, 0)],
            vec![(0, 5), (5, 8)],
            vec![(0, 5), (3, 8)],
            vec![(6, 8), (0, 5)],
        ] {
            assert!(decode::<Ranges>(&encode(&bad)).is_err(), "{bad:?}");
        }
        let zero: BTreeMap<&str, u64> = [("cents", 0)].into();
        assert!(decode::<Vector>(&encode(&zero)).is_err());
        let bad_dim: BTreeMap<&str, u64> = [("Cents!", 3)].into();
        assert!(decode::<Vector>(&encode(&bad_dim)).is_err());
        let empty: BTreeMap<&str, Vec<(u64, u64)>> = [("cents", vec![])].into();
        assert!(decode::<Footprint>(&encode(&empty)).is_err());
    }

    fn fenced() -> Fenced {
        Fenced {
            credit: CreditId::from_u128(9),
            epoch: 5,
            gateway: AgentId::new("g").unwrap(),
        }
    }

    #[test]
    fn signatures_verify_over_the_exact_canonical_bytes() {
        let (k, other) = (signing_key([1; 32]), signing_key([2; 32]));
        let g = AgentId::new("g").unwrap();
        let s = Signed::sign(&fenced(), &g, &k);
        assert_eq!(s.open(&k.verifying_key()).unwrap(), fenced());
        crate::tests::fuzz_seed("ledger", &encode(&LedgerMessage::Fenced(s.clone())));
        // Through the wire and back.
        let back: Signed<Fenced> = decode(&encode(&s)).unwrap();
        assert_eq!(back.open(&k.verifying_key()).unwrap(), fenced());
        // Another key, a flipped body byte, a truncated signature.
        assert_eq!(
            s.open(&other.verifying_key()),
            Err(SignatureError::BadSignature)
        );
        for at in 0..encode(&fenced()).len() {
            assert!(
                s.tampered(at).open(&k.verifying_key()).is_err(),
                "byte {at}"
            );
        }
        let mut short = s.clone();
        short.signature.0.pop();
        assert_eq!(
            short.open(&k.verifying_key()),
            Err(SignatureError::BadSignature)
        );
        // The same tag must not verify as another object type.
        let as_receipt: Signed<Receipt> = Signed {
            signer: s.signer.clone(),
            body: s.body.clone(),
            signature: s.signature.clone(),
            _t: PhantomData,
        };
        assert!(as_receipt.open(&k.verifying_key()).is_err());
        // Expected signer.
        let keys = |a: &AgentId| (a.as_str() == "g").then(|| k.verifying_key());
        assert!(s.open_from(&g, &keys).is_ok());
        assert!(matches!(
            s.open_from(&AgentId::new("h").unwrap(), &keys),
            Err(SignatureError::UnexpectedSigner(_))
        ));
    }

    #[test]
    fn a_validly_signed_non_canonical_body_is_refused() {
        let k = signing_key([1; 32]);
        let mut body = encode(&fenced());
        // `epoch: 5` is the byte 0x05 after the key "epoch"; re-encode it as 0x18 0x05.
        let key = encode(&"epoch");
        let at = body
            .windows(key.len())
            .position(|w| w == key.as_slice())
            .unwrap()
            + key.len();
        assert_eq!(body[at], 0x05);
        body.splice(at..=at, [0x18, 0x05]);
        assert_eq!(
            decode::<Fenced>(&body).unwrap(),
            fenced(),
            "decodes to the same value"
        );
        let sig = k.sign(&message(Fenced::TAG, &body));
        let s: Signed<Fenced> = Signed {
            signer: AgentId::new("g").unwrap(),
            body: Bytes(body),
            signature: Bytes(sig.to_bytes().to_vec()),
            _t: PhantomData,
        };
        assert_eq!(
            s.open(&k.verifying_key()),
            Err(SignatureError::NotCanonical)
        );
    }

    #[test]
    fn footprints_split_exactly_and_join_only_when_disjoint() {
        let b = Vector::of(&[("cents", 1_000), ("calls", 3)]).unwrap();
        let full = Footprint::full(&b);
        let (taken, rest) = full
            .take(&Vector::of(&[("cents", 730), ("calls", 1)]).unwrap())
            .unwrap();
        assert_eq!(
            taken.size(),
            Vector::of(&[("cents", 730), ("calls", 1)]).unwrap()
        );
        assert_eq!(
            rest.size(),
            Vector::of(&[("cents", 270), ("calls", 2)]).unwrap()
        );
        assert!(taken.is_disjoint(&rest));
        assert_eq!(taken.union(&rest).unwrap(), full);
        assert!(taken.union(&taken).is_none());
        assert!(full
            .take(&Vector::of(&[("cents", 1_001)]).unwrap())
            .is_none());
        assert!(full.take(&Vector::of(&[("tokens", 1)]).unwrap()).is_none());
        assert_eq!(full.subtract(&taken).unwrap(), rest);
        assert!(rest.subtract(&taken).is_none());
    }

    #[test]
    fn a_certificate_that_asks_for_nothing_encodes_as_before_and_confirmation_is_signed_in() {
        let a = AgentId::new("a").unwrap();
        let b = AgentId::new("b").unwrap();
        let cert = TransferCert {
            root: RootId::from_u128(1),
            transfer: TransferId::from_u128(2),
            source: a.clone(),
            destination: b.clone(),
            source_credit: CreditId::from_u128(3),
            footprint: Footprint::full(&Vector::of(&[("cents", 40)]).unwrap()),
            label: Label::of(&["tools"]).unwrap(),
            confirm: false,
        };
        // Without the field, the bytes (and so the digest a decision binds) are those of a
        // certificate written before the field existed: a map of seven entries.
        let plain = encode(&cert);
        assert_eq!(plain[0], 0xa7, "{plain:02x?}");
        assert!(!plain.windows(7).any(|w| w == b"confirm"));
        let asks = TransferCert {
            confirm: true,
            ..cert.clone()
        };
        assert_eq!(decode::<TransferCert>(&encode(&asks)).unwrap(), asks);
        assert_ne!(asks.digest(), cert.digest(), "the flag is signed in");
        // The source's decision on it, signed, as it travels.
        let k = signing_key([7; 32]);
        let d = SourceDecision {
            root: asks.root,
            transfer: asks.transfer,
            cert: asks.digest(),
            source: a.clone(),
            destination: b,
            credit: None,
        };
        let s = Signed::sign(&d, &a, &k);
        let m = LedgerMessage::SourceDecision(s.clone());
        assert_eq!(decode::<LedgerMessage>(&encode(&m)).unwrap(), m);
        assert_eq!(s.open(&k.verifying_key()).unwrap(), d);
        crate::tests::fuzz_seed("ledger", &encode(&m));
        crate::tests::fuzz_seed(
            "ledger",
            &encode(&LedgerMessage::Transfer(Signed::sign(&asks, &a, &k))),
        );
    }
}
