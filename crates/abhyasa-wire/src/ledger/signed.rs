//! Signed ledger objects: the envelope, its one verification rule, and the signed record.

use super::*;

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
impl SignedObject for Permit {
    const TAG: &'static str = "permit";
    fn validate(&self) -> Result<(), &'static str> {
        if self.footprint.size() != self.binding.max_charge {
            return Err("permit footprint does not match its maximum charge");
        }
        Ok(())
    }
}

/// Signed objects with no rule beyond their typing: each with its domain-separation tag.
macro_rules! signed_objects {
    ($($object:ty => $tag:literal),* $(,)?) => {
        $(impl SignedObject for $object {
            const TAG: &'static str = $tag;
        })*
    };
}
signed_objects! {
    TransferDecision => "decision",
    SourceDecision => "source_decision",
    Receipt => "receipt",
    NoEffect => "no_effect",
    Fence => "fence",
    Fenced => "fenced",
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
    pub(super) body: Bytes,
    pub(super) signature: Bytes,
    #[serde(skip)]
    pub(super) _t: PhantomData<fn() -> T>,
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
pub(super) struct Bytes(pub(super) Vec<u8>);

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

pub(super) fn message(tag: &str, body: &[u8]) -> Vec<u8> {
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
    pub(super) body: Bytes,
    pub(super) signature: Bytes,
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
