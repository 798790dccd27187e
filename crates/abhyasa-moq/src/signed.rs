//! End-to-end signatures: every custody object (obligation, ack) travels as a COSE_Sign1
//! (RFC 9052) signed with Ed25519 by its sender's certificate key, the certificate in the
//! protected header (`x5chain`, RFC 9360). A receiver believes who sent an object from the
//! signature and the certificate chain to the deployment CA — never from the connection it
//! came in on, which through a relay is the relay's.
//!
//! The envelope, exactly:
//!
//! - COSE_Sign1, tagged (18); payload attached: the object's canonical CBOR.
//! - Protected header: `alg` = EdDSA (-8); `content type` = `application/abhyasa-<kind>+cbor`
//!   (`obligation` or `ack`), so an object signed as one kind is never read as another;
//!   `x5chain` (33) = the sender's leaf certificate (DER), which must chain to the deployment
//!   CA, name the sender as its agent id, be valid now, and hold an Ed25519 key.
//! - No external AAD; the unprotected header is ignored, but for a group's inclusion proof.
//!
//! **Objects that leave together are signed together** ([`Signer::sign_group`]): one Ed25519
//! signature over the root of an RFC 9162 Merkle tree (SHA-256) of their payloads, after COSE
//! Receipts (draft-ietf-cose-merkle-tree-proofs). Each object is still a COSE_Sign1 of its own,
//! with its payload attached, that verifies alone (a relay may forward it alone):
//!
//! - the protected header adds `vds` (395) = 1 (RFC9162_SHA256): the signature is over a tree
//!   root, never over this payload directly, so no lone object's signature can pass for a
//!   root's, nor the other way;
//! - the unprotected header holds `vdp` (396) = `{ -1: [ bstr .cbor [tree_size, leaf_index,
//!   [+ bstr]] ] }`, the object's inclusion proof;
//! - the signature is over the `Sig_structure` of the protected header, no external AAD, and
//!   the *root* as the payload: the root the payload's leaf hash (`SHA-256(0x00 || payload)`)
//!   and the proof give. An altered payload, proof, index or size gives another root, and the
//!   signature fails.
//!
//! A lone object is signed as before (no `vds`): nothing waits to be batched. Objects of one
//! group opened together ([`Verifier::open_all`]) cost one verification between them.
//!
//! The envelopes are written, and read back, directly in this one layout (`signed/raw.rs`),
//! byte for byte what `coset` writes; an envelope in any other valid COSE_Sign1 form is read
//! by `coset`, and a test holds the two readers to one answer for every altered envelope. The
//! objects of a group opened together share one decoded protected header.
//!
//! Verified certificates are cached (by their DER) so a steady peer costs one Ed25519
//! verification per object, not a chain validation. Signatures are verified by the project's
//! one rule (`abhyasa_wire::sig`, ZIP 215), under which the objects that arrive together can
//! be verified in one batch ([`Verifier::open_all`]) with exactly the answers verifying each
//! alone gives.
//!
//! The same certificate key signs the agent's ledger messages (`abhyasa_ledger`), whose
//! signed bytes begin with the domain tag `abhyasa/v1/ledger/`; a COSE `Sig_structure`
//! begins with a CBOR array header (0x84) and a TLS 1.3 CertificateVerify with 64 spaces, so
//! no signature made for one use verifies as another. [`certified_keys`] reads the keys a
//! deployment's certificates bind to their agents, for the ledger's keyring.

use std::collections::HashMap;
use std::sync::Mutex;

use abhyasa_wire::AgentId;
use coset::cbor::Value;
use coset::{iana, CoseSign1, HeaderBuilder, Label, TaggedCborSerializable};
use ed25519_dalek::pkcs8::DecodePrivateKey;
use ed25519_dalek::{Signer as _, SigningKey, VerifyingKey};
use rustls::pki_types::{CertificateDer, UnixTime};

use crate::identity::{agent_of, Identity, IdentityError};

mod merkle;
mod raw;

/// The `vds` header parameter (verifiable data structure) of COSE Receipts.
const VDS: i64 = 395;
/// `vds` = RFC9162_SHA256.
const RFC9162_SHA256: i64 = 1;
/// The `vdp` header parameter (verifiable data proofs) of COSE Receipts.
const VDP: i64 = 396;
/// Inclusion proofs, in `vdp`.
const INCLUSION: i64 = -1;
/// The longest inclusion path read: a tree of 2^32 leaves.
const MAX_PATH: usize = 32;

/// What a signed object is; part of what is signed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    /// An obligation, principal → agent.
    Obligation,
    /// A custody ack, agent → principal.
    Ack,
}

impl Kind {
    /// The content type this kind is signed under.
    pub fn content_type(self) -> &'static str {
        match self {
            Kind::Obligation => "application/abhyasa-obligation+cbor",
            Kind::Ack => "application/abhyasa-ack+cbor",
        }
    }
}

/// Why a signed object was not believed. Each is a reason to drop it unread: an object
/// whose sender is not proven is never acted on, and custody's retries and deadlines turn the
/// loss into a delay or an escalation.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[non_exhaustive]
pub enum SignedError {
    /// Not a COSE_Sign1.
    #[error("not a COSE_Sign1: {0}")]
    Malformed(String),
    /// Signed with another algorithm than EdDSA (or none named).
    #[error("signature algorithm is not EdDSA")]
    Algorithm,
    /// Signed as another kind of object.
    #[error("signed as {got:?}, expected {expected}")]
    ContentType {
        /// What this receiver reads.
        expected: &'static str,
        /// What the envelope names.
        got: Option<String>,
    },
    /// No payload attached.
    #[error("no payload")]
    NoPayload,
    /// No certificate in the protected header.
    #[error("no sender certificate (x5chain) in the protected header")]
    NoCertificate,
    /// The certificate does not chain to the deployment CA, is not valid now, or names no
    /// agent.
    #[error("sender certificate refused: {0}")]
    Certificate(String),
    /// The certificate's key is not Ed25519.
    #[error("sender certificate key is not Ed25519")]
    KeyType,
    /// The signature does not verify.
    #[error("signature does not verify")]
    Signature,
    /// Signed as part of a group, without a readable inclusion proof for a tree the group
    /// could have.
    #[error("group signature without a valid inclusion proof: {0}")]
    Proof(&'static str),
}

/// Signs objects as one agent, with its certificate's Ed25519 key.
#[derive(Clone)]
pub struct Signer {
    agent: AgentId,
    cert: Vec<u8>,
    key: SigningKey,
}

impl std::fmt::Debug for Signer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Signer")
            .field("agent", &self.agent)
            .finish_non_exhaustive()
    }
}

impl Signer {
    /// The signer for `identity`: its leaf certificate and that certificate's key, which must
    /// be Ed25519 (`Ca::issue` makes such certificates; an older P-256 one must be reissued).
    pub fn new(identity: &Identity) -> Result<Self, IdentityError> {
        let key = SigningKey::from_pkcs8_der(&identity.key).map_err(|_| {
            IdentityError::KeyType(format!(
                "{}: the certificate key is not Ed25519, which end-to-end signing needs; reissue it (`abhyasa certs issue`)",
                identity.agent
            ))
        })?;
        let cert = identity
            .chain
            .first()
            .ok_or_else(|| IdentityError::NoAgentId("empty certificate chain".into()))?;
        let (spki_key, _) = leaf_key(cert).map_err(|e| IdentityError::KeyType(e.to_string()))?;
        if spki_key != key.verifying_key() {
            return Err(IdentityError::KeyType(format!(
                "{}: the key does not match the certificate",
                identity.agent
            )));
        }
        Ok(Self {
            agent: identity.agent.clone(),
            cert: cert.to_vec(),
            key,
        })
    }

    /// The certificate's Ed25519 key: the agent's one signing key, which also signs its
    /// ledger messages (domain-separated; see the module docs).
    pub fn key(&self) -> &SigningKey {
        &self.key
    }

    /// The agent this signer signs as.
    pub fn agent(&self) -> &AgentId {
        &self.agent
    }

    /// The protected header every envelope of `kind` from this signer carries.
    fn header(&self, kind: Kind) -> HeaderBuilder {
        HeaderBuilder::new()
            .algorithm(iana::Algorithm::EdDSA)
            .content_type(kind.content_type().to_owned())
            .value(
                iana::HeaderParameter::X5Chain as i64,
                Value::Bytes(self.cert.clone()),
            )
    }

    /// `payload` (an object's CBOR) as a signed envelope of `kind`.
    pub fn sign(&self, kind: Kind, payload: &[u8]) -> Vec<u8> {
        let protected = protected_bytes(self.header(kind).build());
        let signature = self.key.sign(&raw::sig_structure(&protected, payload));
        raw::envelope(&protected, None, payload, &signature.to_bytes())
    }

    /// `payloads` that leave together, as one envelope each under one signature over their
    /// Merkle root (see the module docs); a lone payload is signed as by [`sign`](Self::sign).
    pub fn sign_group<P: AsRef<[u8]>>(&self, kind: Kind, payloads: &[P]) -> Vec<Vec<u8>> {
        match payloads {
            [] => return Vec::new(),
            [one] => return vec![self.sign(kind, one.as_ref())],
            _ => {}
        }
        let leaves: Vec<merkle::Hash> = payloads.iter().map(|p| merkle::leaf(p.as_ref())).collect();
        let size = leaves.len() as u64;
        let Some(tree) = merkle::Tree::new(leaves) else {
            unreachable!("two or more leaves")
        };
        // The protected header encoded once, its bytes shared by every envelope.
        let protected = protected_bytes(
            self.header(kind)
                .value(VDS, Value::Integer(RFC9162_SHA256.into()))
                .build(),
        );
        let signature = self
            .key
            .sign(&raw::sig_structure(&protected, &tree.root()))
            .to_bytes();
        payloads
            .iter()
            .enumerate()
            .map(|(i, p)| {
                let proof = raw::proof(size, i as u64, &tree.path(i));
                raw::envelope(&protected, Some(&proof), p.as_ref(), &signature)
            })
            .collect()
    }
}

/// A protected header's encoded bytes (what the envelope carries and the signature covers).
fn protected_bytes(header: coset::Header) -> Vec<u8> {
    match (coset::ProtectedHeader {
        original_data: None,
        header,
    })
    .cbor_bstr()
    {
        Ok(Value::Bytes(b)) => b,
        // Encoding a header built from integers, text and byte strings cannot fail.
        other => unreachable!("protected header encoding failed: {other:?}"),
    }
}

/// A header parameter by its integer label.
fn param(rest: &[(Label, Value)], label: i64) -> Option<&Value> {
    rest.iter()
        .find(|(l, _)| *l == Label::Int(label))
        .map(|(_, v)| v)
}

/// The one inclusion proof's bytes in an unprotected header, in whatever form the general
/// reader found it.
fn proof_in(unprotected: &coset::Header) -> Option<&[u8]> {
    match param(&unprotected.rest, VDP)? {
        Value::Map(m) => m.iter().find_map(|(k, v)| match (k, v) {
            (Value::Integer(k), Value::Array(a)) if *k == INCLUSION.into() => match &a[..] {
                [Value::Bytes(b)] => Some(b.as_slice()),
                _ => None,
            },
            _ => None,
        }),
        _ => None,
    }
}

/// The root a group envelope's inclusion proof (`proof`) gives for its payload: `Ok(None)` for
/// a lone envelope (no `vds` in its protected header).
fn group_root(
    protected: &coset::Header,
    proof: Option<&[u8]>,
    payload: &[u8],
) -> Result<Option<merkle::Hash>, SignedError> {
    match param(&protected.rest, VDS) {
        None => return Ok(None),
        Some(Value::Integer(i)) if *i == RFC9162_SHA256.into() => {}
        Some(_) => return Err(SignedError::Proof("unknown verifiable data structure")),
    }
    let proof = proof.ok_or(SignedError::Proof("no inclusion proof"))?;
    let (size, index, path) = match raw::read_proof(proof, MAX_PATH) {
        Some(read) => read,
        None => proof_by_value(proof)?,
    };
    if size < 2 {
        return Err(SignedError::Proof("a group of fewer than two"));
    }
    merkle::root_from_path(index, size, merkle::leaf(payload), &path)
        .map(Some)
        .ok_or(SignedError::Proof("inclusion proof does not fit its place"))
}

/// An inclusion proof in a form [`raw::read_proof`] does not read (indefinite lengths, say),
/// read through a CBOR value, or the reason it is refused.
fn proof_by_value(proof: &[u8]) -> Result<(u64, u64, Vec<merkle::Hash>), SignedError> {
    let proof: Value = coset::cbor::de::from_reader(proof)
        .map_err(|_| SignedError::Proof("inclusion proof is not CBOR"))?;
    let Value::Array(fields) = proof else {
        return Err(SignedError::Proof("inclusion proof is not an array"));
    };
    let [Value::Integer(size), Value::Integer(index), Value::Array(path)] = &fields[..] else {
        return Err(SignedError::Proof(
            "inclusion proof is not [size, index, path]",
        ));
    };
    let (Ok(size), Ok(index)) = (u64::try_from(*size), u64::try_from(*index)) else {
        return Err(SignedError::Proof(
            "inclusion proof size or index out of range",
        ));
    };
    if path.len() > MAX_PATH {
        return Err(SignedError::Proof("inclusion path too long"));
    }
    let path = path
        .iter()
        .map(|h| match h {
            Value::Bytes(b) => merkle::Hash::try_from(b.as_slice()).ok(),
            _ => None,
        })
        .collect::<Option<Vec<_>>>()
        .ok_or(SignedError::Proof(
            "inclusion path entry is not a SHA-256 hash",
        ))?;
    Ok((size, index, path))
}

/// The protected header last read by one [`Verifier::open_all`]: the objects of a group share
/// it byte for byte, and it is decoded once for them.
struct SeenHeader {
    bytes: Vec<u8>,
    header: coset::Header,
}

/// One signature as queued in a batch: key, signature and the Sig_structure it signs.
type Queued = ([u8; 32], [u8; 64], Vec<u8>);

/// An envelope checked up to its signature.
struct Prepared {
    key: VerifyingKey,
    tbs: Vec<u8>,
    signature: ed25519_dalek::Signature,
    opened: Opened,
}

/// A verified sender.
#[derive(Clone, Debug)]
struct Known {
    agent: AgentId,
    key: VerifyingKey,
    not_after: i64,
}

/// How many verified certificates a verifier remembers before it starts over.
const MAX_CACHED: usize = 4_096;

/// Opens signed objects from any agent of one deployment (its CA).
pub struct Verifier {
    ca: CertificateDer<'static>,
    known: Mutex<HashMap<Vec<u8>, Known>>,
}

impl std::fmt::Debug for Verifier {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Verifier").finish_non_exhaustive()
    }
}

/// An object whose sender is proven.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Opened {
    /// The agent whose certificate key signed it.
    pub signer: AgentId,
    /// The object's bytes, as signed.
    pub payload: Vec<u8>,
}

impl Verifier {
    /// A verifier trusting certificates issued by `ca`.
    pub fn new(ca: CertificateDer<'static>) -> Self {
        Self {
            ca,
            known: Mutex::new(HashMap::new()),
        }
    }

    /// Verifies `bytes` as a signed object of `kind` strictly: envelope, algorithm, content
    /// type, certificate (chain, validity, agent id, key type) and signature, in that order.
    /// The signature by the project's one rule (`abhyasa_wire::sig`: ZIP 215, no small-order
    /// key), which [`open_all`](Self::open_all) applies in a batch with the same answers.
    pub fn open(&self, kind: Kind, bytes: &[u8]) -> Result<Opened, SignedError> {
        let p = self.prepare(kind, bytes, &mut None)?;
        if !abhyasa_wire::sig::verify(&p.key, &p.tbs, &p.signature) {
            return Err(SignedError::Signature);
        }
        Ok(p.opened)
    }

    /// [`open`](Self::open) for each of `objects`, in order, with the same answer for each;
    /// the signatures are verified together (one batch equation when all hold, which for a
    /// group from one sender costs about a quarter of verifying each alone).
    pub fn open_all<'a>(
        &self,
        objects: impl IntoIterator<Item = (Kind, &'a [u8])>,
    ) -> Vec<Result<Opened, SignedError>> {
        let mut batch = abhyasa_wire::sig::Batch::new();
        // The objects of one group share one signature over one root: it is verified once.
        let mut queued: HashMap<Queued, usize> = HashMap::new();
        let mut seen = None;
        let prepared: Vec<Result<(usize, Opened), SignedError>> = objects
            .into_iter()
            .map(|(kind, bytes)| {
                let p = self.prepare(kind, bytes, &mut seen)?;
                let at = (p.key.to_bytes(), p.signature.to_bytes(), p.tbs);
                let slot = match queued.get(&at) {
                    Some(&slot) => slot,
                    None => {
                        let slot = batch.len();
                        batch.push(&p.key, &at.2, &p.signature);
                        queued.insert(at, slot);
                        slot
                    }
                };
                Ok((slot, p.opened))
            })
            .collect();
        let verdicts = batch.verify_all();
        prepared
            .into_iter()
            .map(|p| {
                let (slot, opened) = p?;
                match verdicts.get(slot) {
                    Some(true) => Ok(opened),
                    _ => Err(SignedError::Signature),
                }
            })
            .collect()
    }

    /// Everything [`open`](Self::open) checks before the signature, and what the signature
    /// is then checked over. `seen` is the protected header last decoded, reused when this
    /// envelope's is the same bytes.
    fn prepare(
        &self,
        kind: Kind,
        bytes: &[u8],
        seen: &mut Option<SeenHeader>,
    ) -> Result<Prepared, SignedError> {
        let Some(parts) = raw::parts(bytes) else {
            return self.prepare_general(kind, bytes);
        };
        if seen.as_ref().is_none_or(|s| s.bytes != parts.protected) {
            let Ok(p) =
                coset::ProtectedHeader::from_cbor_bstr(Value::Bytes(parts.protected.to_vec()))
            else {
                // Not a header: the general reader says why.
                return self.prepare_general(kind, bytes);
            };
            *seen = Some(SeenHeader {
                bytes: parts.protected.to_vec(),
                header: p.header,
            });
        }
        let Some(seen) = seen.as_ref() else {
            unreachable!("set above")
        };
        self.checked(
            kind,
            &seen.header,
            parts.protected,
            parts.proof,
            Some(parts.payload),
            parts.signature,
        )
    }

    /// [`prepare`](Self::prepare) for an envelope in any COSE_Sign1 form, through `coset`.
    fn prepare_general(&self, kind: Kind, bytes: &[u8]) -> Result<Prepared, SignedError> {
        let sign1 = CoseSign1::from_tagged_slice(bytes)
            .map_err(|e| SignedError::Malformed(e.to_string()))?;
        let protected = sign1.protected.original_data.as_deref().unwrap_or_default();
        self.checked(
            kind,
            &sign1.protected.header,
            protected,
            proof_in(&sign1.unprotected),
            sign1.payload.as_deref(),
            &sign1.signature,
        )
    }

    /// The checks of [`open`](Self::open) before the signature, in its order, over an
    /// envelope's parts: the protected header decoded and as its bytes, the inclusion proof's
    /// bytes if any, the payload and the signature.
    fn checked(
        &self,
        kind: Kind,
        header: &coset::Header,
        protected: &[u8],
        proof: Option<&[u8]>,
        payload: Option<&[u8]>,
        signature: &[u8],
    ) -> Result<Prepared, SignedError> {
        if header.alg
            != Some(coset::RegisteredLabelWithPrivate::Assigned(
                iana::Algorithm::EdDSA,
            ))
        {
            return Err(SignedError::Algorithm);
        }
        let content_type = match &header.content_type {
            Some(coset::ContentType::Text(t)) => Some(t.as_str()),
            Some(coset::ContentType::Assigned(_)) => None,
            None => None,
        };
        if content_type != Some(kind.content_type()) {
            return Err(SignedError::ContentType {
                expected: kind.content_type(),
                got: match &header.content_type {
                    Some(coset::ContentType::Text(t)) => Some(t.clone()),
                    Some(coset::ContentType::Assigned(a)) => Some(format!("{a:?}")),
                    None => None,
                },
            });
        }
        let cert = header
            .rest
            .iter()
            .find_map(|(label, value)| match (label, value) {
                (Label::Int(l), Value::Bytes(b)) if *l == iana::HeaderParameter::X5Chain as i64 => {
                    Some(b.as_slice())
                }
                _ => None,
            })
            .ok_or(SignedError::NoCertificate)?;
        let known = self.sender(cert)?;
        let signature =
            ed25519_dalek::Signature::from_slice(signature).map_err(|_| SignedError::Signature)?;
        let Some(payload) = payload else {
            return Err(SignedError::NoPayload);
        };
        let tbs = match group_root(header, proof, payload)? {
            None => raw::sig_structure(protected, payload),
            Some(root) => raw::sig_structure(protected, &root),
        };
        Ok(Prepared {
            key: known.key,
            tbs,
            signature,
            opened: Opened {
                signer: known.agent,
                payload: payload.to_vec(),
            },
        })
    }

    /// The agent and Ed25519 key a certificate binds, after the same checks as [`open`]
    /// makes of a sender's certificate (chain to the deployment CA, client-auth use, valid
    /// now, agent id, key type).
    ///
    /// [`open`]: Verifier::open
    pub fn certified(&self, cert: &[u8]) -> Result<(AgentId, VerifyingKey), SignedError> {
        self.sender(cert).map(|k| (k.agent, k.key))
    }

    /// The sender `cert` proves, from the cache or by validating it.
    fn sender(&self, cert: &[u8]) -> Result<Known, SignedError> {
        let now = UnixTime::now();
        let secs = i64::try_from(now.as_secs()).unwrap_or(i64::MAX);
        if let Some(k) = self.cache().get(cert) {
            if secs <= k.not_after {
                return Ok(k.clone());
            }
        }
        let der = CertificateDer::from(cert);
        let end_entity = webpki::EndEntityCert::try_from(&der)
            .map_err(|e| SignedError::Certificate(e.to_string()))?;
        let anchor = webpki::anchor_from_trusted_cert(&self.ca)
            .map_err(|e| SignedError::Certificate(format!("deployment CA: {e}")))?;
        let algs = rustls::crypto::ring::default_provider()
            .signature_verification_algorithms
            .all;
        end_entity
            .verify_for_usage(
                algs,
                &[anchor],
                &[],
                now,
                webpki::KeyUsage::client_auth(),
                None,
                None,
            )
            .map_err(|e| SignedError::Certificate(e.to_string()))?;
        let agent = agent_of(&der).map_err(|e| SignedError::Certificate(e.to_string()))?;
        let (key, not_after) = leaf_key(&der)?;
        let known = Known {
            agent,
            key,
            not_after,
        };
        let mut cache = self.cache();
        if cache.len() >= MAX_CACHED {
            cache.clear();
        }
        cache.insert(cert.to_vec(), known.clone());
        Ok(known)
    }

    fn cache(&self) -> std::sync::MutexGuard<'_, HashMap<Vec<u8>, Known>> {
        self.known.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// The Ed25519 key of `identity`'s certificate (which must be its private key's).
pub fn certificate_key(identity: &Identity) -> Result<VerifyingKey, IdentityError> {
    Signer::new(identity).map(|s| s.key.verifying_key())
}

/// The keys a deployment's certificates bind to their agents.
#[derive(Debug, Default)]
pub struct CertifiedKeys {
    /// Each agent's certificate key.
    pub keys: std::collections::BTreeMap<AgentId, VerifyingKey>,
    /// Certificate files that were not trusted, and why (another CA, expired, no agent id,
    /// not Ed25519, not a certificate).
    pub refused: Vec<(std::path::PathBuf, String)>,
}

/// Every agent certificate in `dir` (`*.pem` but `ca.pem`) that verifies against the
/// deployment CA `dir/ca.pem`, as agent → key. Only public files are read. A file that does
/// not verify is listed in `refused`, not trusted; two certificates naming one agent with
/// different keys are an error (which one speaks for the agent would be a guess).
pub fn certified_keys(dir: &std::path::Path) -> Result<CertifiedKeys, IdentityError> {
    use rustls::pki_types::pem::PemObject;
    let io = |path: &std::path::Path| {
        let path = path.to_owned();
        move |source| IdentityError::Io { path, source }
    };
    let ca_path = dir.join("ca.pem");
    let verifier = Verifier::new(crate::identity::read_certificate(&ca_path)?);
    let mut out = CertifiedKeys::default();
    let mut paths: Vec<std::path::PathBuf> = std::fs::read_dir(dir)
        .map_err(io(dir))?
        .map(|e| e.map(|e| e.path()).map_err(io(dir)))
        .collect::<Result<_, _>>()?;
    paths.sort();
    for path in paths {
        if path.extension().and_then(|e| e.to_str()) != Some("pem") || path == ca_path {
            continue;
        }
        let bytes = crate::identity::read(&path)?;
        let leaf = match CertificateDer::pem_slice_iter(&bytes).next() {
            Some(Ok(c)) => c,
            _ => {
                out.refused.push((path, "not a PEM certificate".into()));
                continue;
            }
        };
        match verifier.certified(&leaf) {
            Ok((agent, key)) => match out.keys.get(&agent) {
                Some(k) if *k != key => {
                    return Err(IdentityError::Ambiguous(format!(
                        "two certificates in {} name {agent} with different keys (one is {})",
                        dir.display(),
                        path.display()
                    )))
                }
                _ => {
                    out.keys.insert(agent, key);
                }
            },
            Err(e) => out.refused.push((path, e.to_string())),
        }
    }
    Ok(out)
}

/// The Ed25519 key a certificate holds, and its notAfter (Unix seconds).
fn leaf_key(cert: &[u8]) -> Result<(VerifyingKey, i64), SignedError> {
    let (_, x509) = x509_parser::parse_x509_certificate(cert)
        .map_err(|e| SignedError::Certificate(format!("unparsable: {e}")))?;
    let spki = x509.public_key();
    // id-Ed25519, RFC 8410.
    if spki.algorithm.algorithm.to_id_string() != "1.3.101.112" {
        return Err(SignedError::KeyType);
    }
    let bytes: [u8; 32] = spki
        .subject_public_key
        .data
        .as_ref()
        .try_into()
        .map_err(|_| SignedError::KeyType)?;
    let key = VerifyingKey::from_bytes(&bytes).map_err(|_| SignedError::KeyType)?;
    Ok((key, x509.validity().not_after.timestamp()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::identity::Ca;

    fn id(s: &str) -> AgentId {
        AgentId::new(s).unwrap()
    }

    /// A COSE_Sign1 encoded by `coset`: the reference the direct writer is held to.
    fn tagged(sign1: CoseSign1) -> Vec<u8> {
        sign1.to_tagged_vec().unwrap()
    }

    /// The envelopes as `coset` builds them (the construction this module used before it wrote
    /// the bytes itself): a lone one, and a group's.
    fn coset_envelopes(signer: &Signer, kind: Kind, payloads: &[&[u8]]) -> Vec<Vec<u8>> {
        if let [one] = payloads {
            return vec![tagged(
                coset::CoseSign1Builder::new()
                    .protected(signer.header(kind).build())
                    .payload(one.to_vec())
                    .create_signature(&[], |tbs| signer.key.sign(tbs).to_bytes().to_vec())
                    .build(),
            )];
        }
        let tree = merkle::Tree::new(payloads.iter().map(|p| merkle::leaf(p)).collect()).unwrap();
        let protected = coset::ProtectedHeader {
            original_data: None,
            header: signer
                .header(kind)
                .value(VDS, Value::Integer(RFC9162_SHA256.into()))
                .build(),
        };
        let tbs = coset::sig_structure_data(
            coset::SignatureContext::CoseSign1,
            protected.clone(),
            None,
            &[],
            &tree.root(),
        );
        let signature = signer.key.sign(&tbs).to_bytes().to_vec();
        (0..payloads.len())
            .map(|i| {
                let path = tree
                    .path(i)
                    .iter()
                    .map(|h| Value::Bytes(h.to_vec()))
                    .collect();
                let proof = Value::Array(vec![
                    Value::Integer((payloads.len() as u64).into()),
                    Value::Integer((i as u64).into()),
                    Value::Array(path),
                ]);
                let mut proof_bytes = Vec::new();
                coset::cbor::ser::into_writer(&proof, &mut proof_bytes).unwrap();
                let vdp = Value::Map(vec![(
                    Value::Integer(INCLUSION.into()),
                    Value::Array(vec![Value::Bytes(proof_bytes)]),
                )]);
                tagged(CoseSign1 {
                    protected: protected.clone(),
                    unprotected: HeaderBuilder::new().value(VDP, vdp).build(),
                    payload: Some(payloads[i].to_vec()),
                    signature: signature.clone(),
                })
            })
            .collect()
    }

    #[test]
    fn envelopes_are_the_bytes_coset_writes() {
        let (_, _, signer, _) = setup();
        for kind in [Kind::Obligation, Kind::Ack] {
            for n in [1usize, 2, 3, 5, 64, 300] {
                let payloads: Vec<Vec<u8>> = (0..n).map(|i| vec![i as u8; 20 + i % 200]).collect();
                let refs: Vec<&[u8]> = payloads.iter().map(|p| &p[..]).collect();
                assert_eq!(
                    signer.sign_group(kind, &refs),
                    coset_envelopes(&signer, kind, &refs),
                    "{kind:?}, {n} payloads"
                );
            }
        }
    }

    /// The direct reader and `coset`'s decide every envelope alike: valid ones of each shape,
    /// and every one-byte change, truncation and extension of them (each read alone and in a
    /// batch, so the header decoded once for a group is also exercised against its changes).
    #[test]
    fn the_direct_reader_and_cosets_give_the_same_answer_for_every_altered_envelope() {
        let (_, _, signer, verifier) = setup();
        let lone = signer.sign(Kind::Obligation, b"a lone payload");
        let group = signer.sign_group(Kind::Obligation, &[&b"a"[..], b"bb", b"ccc"]);
        let compare = |bytes: &[u8], what: &str| {
            let general = verifier.prepare_general(Kind::Obligation, bytes);
            let direct = verifier.prepare(Kind::Obligation, bytes, &mut None);
            let mut seen = None;
            // A header already seen (the group's), as in a batch.
            let _ = verifier.prepare(Kind::Obligation, &group[0], &mut seen);
            let batched = verifier.prepare(Kind::Obligation, bytes, &mut seen);
            let summary = |r: &Result<Prepared, SignedError>| match r {
                Ok(p) => Ok((p.key, p.tbs.clone(), p.signature, p.opened.clone())),
                Err(e) => Err(format!("{e:?}")),
            };
            assert_eq!(summary(&direct), summary(&general), "{what}");
            assert_eq!(summary(&batched), summary(&general), "{what} (batched)");
            general.is_ok()
        };
        for (name, e) in [("lone", &lone), ("group[1]", &group[1])] {
            assert!(compare(e, name), "{name} opens");
            for i in 0..e.len() {
                for bit in [0x01u8, 0x20, 0x80] {
                    let mut bad = e.clone();
                    bad[i] ^= bit;
                    compare(&bad, &format!("{name}: byte {i} ^ {bit:#x}"));
                }
                compare(&e[..i], &format!("{name}: cut at {i}"));
            }
            let mut longer = e.clone();
            longer.push(0);
            compare(&longer, &format!("{name}: a trailing byte"));
        }
    }

    /// Two deployments, and a signer and verifier in the first.
    fn setup() -> (Ca, Ca, Signer, Verifier) {
        let (ca, other) = (Ca::generate("t").unwrap(), Ca::generate("u").unwrap());
        let signer = Signer::new(&ca.issue(&id("principal")).unwrap()).unwrap();
        let verifier = Verifier::new(ca.certificate().clone());
        (ca, other, signer, verifier)
    }

    #[test]
    fn a_signed_object_opens_to_its_signer_and_bytes() {
        let (_, _, signer, verifier) = setup();
        let signed = signer.sign(Kind::Obligation, b"payload");
        let opened = verifier.open(Kind::Obligation, &signed).unwrap();
        assert_eq!(
            opened,
            Opened {
                signer: id("principal"),
                payload: b"payload".to_vec()
            }
        );
        // Twice: the second from the cache, the same answer.
        assert_eq!(verifier.open(Kind::Obligation, &signed).unwrap(), opened);
    }

    #[test]
    fn every_altered_byte_is_refused() {
        let (_, _, signer, verifier) = setup();
        let signed = signer.sign(Kind::Ack, b"an ack's cbor");
        let mut refused = 0;
        for i in 0..signed.len() {
            let mut bad = signed.clone();
            bad[i] ^= 0x01;
            if verifier.open(Kind::Ack, &bad).is_err() {
                refused += 1;
            } else {
                // Only a change that decodes to the same signed content could pass; there is
                // none in this encoding (no unprotected header, no slack).
                panic!("byte {i} altered and still believed");
            }
        }
        assert_eq!(refused, signed.len());
    }

    #[test]
    fn objects_opened_together_get_the_answers_each_gets_alone() {
        let (ca, other, signer, verifier) = setup();
        let agent = Signer::new(&ca.issue(&id("agent")).unwrap()).unwrap();
        let stranger = Signer::new(&other.issue(&id("principal")).unwrap()).unwrap();
        let forged = Signer {
            agent: signer.agent.clone(),
            cert: signer.cert.clone(),
            key: agent.key.clone(),
        };
        let mut objects: Vec<(Kind, Vec<u8>)> = (0..20u8)
            .map(|i| (Kind::Obligation, signer.sign(Kind::Obligation, &[i; 30])))
            .collect();
        objects.push((Kind::Ack, agent.sign(Kind::Ack, b"another sender")));
        // The bad ones, among good ones: a flipped signature byte, another kind, another
        // deployment, a borrowed certificate, garbage.
        let last = objects[3].1.len() - 1;
        objects[3].1[last] ^= 1;
        objects[7].0 = Kind::Ack;
        objects[11].1 = stranger.sign(Kind::Obligation, b"x");
        objects[13].1 = forged.sign(Kind::Obligation, b"y");
        objects[17].1 = b"\xd2\x84".to_vec();
        let bad = [3usize, 7, 11, 13, 17];

        let alone: Vec<_> = objects.iter().map(|(k, b)| verifier.open(*k, b)).collect();
        let together = verifier.open_all(objects.iter().map(|(k, b)| (*k, b.as_slice())));
        assert_eq!(together, alone);
        for (i, r) in together.iter().enumerate() {
            assert_eq!(r.is_err(), bad.contains(&i), "object {i}: {r:?}");
        }
        assert_eq!(together[3], Err(SignedError::Signature));
        assert_eq!(together[13], Err(SignedError::Signature));
        assert_eq!(together[20].as_ref().unwrap().signer, id("agent"));
        assert_eq!(together[0].as_ref().unwrap().payload, vec![0u8; 30]);
    }

    /// One signature for a group: every envelope carries the same signature, opens alone to
    /// its own payload, and a group of one is a lone envelope.
    #[test]
    fn a_group_signed_once_opens_object_by_object() {
        let (_, _, signer, verifier) = setup();
        for n in [2usize, 3, 5, 8, 33] {
            let payloads: Vec<Vec<u8>> = (0..n).map(|i| vec![i as u8; 10 + i]).collect();
            let group = signer.sign_group(Kind::Obligation, &payloads);
            assert_eq!(group.len(), n);
            let signatures: std::collections::HashSet<Vec<u8>> = group
                .iter()
                .map(|e| CoseSign1::from_tagged_slice(e).unwrap().signature)
                .collect();
            assert_eq!(signatures.len(), 1, "one signature for {n} objects");
            for (e, p) in group.iter().zip(&payloads) {
                let opened = verifier.open(Kind::Obligation, e).unwrap();
                assert_eq!((&opened.signer, &opened.payload), (&id("principal"), p));
                assert!(verifier.open(Kind::Ack, e).is_err());
            }
            let together = verifier.open_all(group.iter().map(|e| (Kind::Obligation, &e[..])));
            let payloads_back: Vec<Vec<u8>> =
                together.into_iter().map(|r| r.unwrap().payload).collect();
            assert_eq!(payloads_back, payloads);
        }
        let lone = signer.sign_group(Kind::Ack, &[b"alone"]);
        assert_eq!(lone, vec![signer.sign(Kind::Ack, b"alone")]);
        assert!(signer.sign_group::<&[u8]>(Kind::Ack, &[]).is_empty());
    }

    /// Whatever is altered in a group envelope — payload, proof, index, size, headers,
    /// signature — it is refused, alone and beside its untouched siblings (who still open).
    #[test]
    fn every_altered_byte_of_a_group_envelope_is_refused() {
        let (_, _, signer, verifier) = setup();
        let payloads: Vec<&[u8]> = vec![b"first", b"second", b"third", b"fourth", b"fifth"];
        let group = signer.sign_group(Kind::Ack, &payloads);
        let target = &group[2];
        for i in 0..target.len() {
            let mut bad = target.clone();
            bad[i] ^= 0x01;
            if let Ok(o) = verifier.open(Kind::Ack, &bad) {
                panic!("byte {i} altered and still believed: {o:?}");
            }
            let mut batch: Vec<&[u8]> = group.iter().map(|e| &e[..]).collect();
            batch[2] = &bad;
            let together = verifier.open_all(batch.iter().map(|e| (Kind::Ack, *e)));
            for (j, r) in together.iter().enumerate() {
                assert_eq!(r.is_ok(), j != 2, "byte {i}: object {j}: {r:?}");
            }
        }
    }

    /// An envelope's proof moved to a sibling, or a sibling's payload put under it, proves
    /// another root: refused.
    #[test]
    fn proofs_and_payloads_do_not_move_between_a_groups_envelopes() {
        let (_, _, signer, verifier) = setup();
        let group = signer.sign_group(Kind::Obligation, &[b"a", b"b", b"c"]);
        let parse = |e: &[u8]| CoseSign1::from_tagged_slice(e).unwrap();
        let mut swapped = parse(&group[0]);
        swapped.unprotected = parse(&group[1]).unprotected;
        let mut moved = parse(&group[0]);
        moved.payload = parse(&group[1]).payload;
        let mut stripped = parse(&group[0]);
        stripped.unprotected = coset::Header::default();
        for (what, e) in [
            ("swapped", swapped),
            ("moved", moved),
            ("stripped", stripped),
        ] {
            let r = verifier.open(Kind::Obligation, &tagged(e));
            assert!(r.is_err(), "{what}: {r:?}");
        }
        assert!(matches!(
            verifier.open(
                Kind::Obligation,
                &tagged({
                    let mut e = parse(&group[0]);
                    e.unprotected = coset::Header::default();
                    e
                })
            ),
            Err(SignedError::Proof("no inclusion proof"))
        ));
    }

    #[test]
    fn an_object_signed_as_one_kind_is_not_read_as_another() {
        let (_, _, signer, verifier) = setup();
        let signed = signer.sign(Kind::Ack, b"x");
        assert!(matches!(
            verifier.open(Kind::Obligation, &signed),
            Err(SignedError::ContentType { .. })
        ));
    }

    #[test]
    fn a_certificate_from_another_deployment_is_refused() {
        let (_, other, _, verifier) = setup();
        let stranger = Signer::new(&other.issue(&id("principal")).unwrap()).unwrap();
        let signed = stranger.sign(Kind::Obligation, b"x");
        assert!(matches!(
            verifier.open(Kind::Obligation, &signed),
            Err(SignedError::Certificate(_))
        ));
    }

    #[test]
    fn a_signature_under_a_borrowed_certificate_is_refused() {
        // A member that puts another agent's certificate in its own envelope: the chain is
        // good and names the victim, but the key that signed is not that certificate's.
        let (ca, _, victim, verifier) = setup();
        let rogue = Signer::new(&ca.issue(&id("rogue")).unwrap()).unwrap();
        let forged = Signer {
            agent: victim.agent.clone(),
            cert: victim.cert.clone(),
            key: rogue.key.clone(),
        };
        let signed = forged.sign(Kind::Ack, b"applied");
        assert_eq!(
            verifier.open(Kind::Ack, &signed),
            Err(SignedError::Signature)
        );
    }

    #[test]
    fn unsigned_and_garbage_bytes_are_refused_without_panicking() {
        let (_, _, _, verifier) = setup();
        for bytes in [&b""[..], b"\xd2", b"\xd2\x84", b"\xa0", b"plain cbor? no"] {
            assert!(matches!(
                verifier.open(Kind::Obligation, bytes),
                Err(SignedError::Malformed(_))
            ));
        }
    }

    #[test]
    fn a_p256_identity_cannot_sign() {
        let ca = Ca::generate("t").unwrap();
        let mut identity = ca.issue(&id("old")).unwrap();
        identity.key = rcgen::KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256)
            .unwrap()
            .serialize_der();
        assert!(matches!(
            Signer::new(&identity),
            Err(IdentityError::KeyType(_))
        ));
    }

    #[test]
    fn certified_keys_are_read_from_certificates_of_the_deployment_only() {
        let dir = tempfile::tempdir().unwrap();
        let (ca, other) = (Ca::generate("t").unwrap(), Ca::generate("u").unwrap());
        ca.save(dir.path()).unwrap();
        let (alice, bob) = (
            ca.issue(&id("alice")).unwrap(),
            ca.issue(&id("bob")).unwrap(),
        );
        alice.save(dir.path()).unwrap();
        bob.save(dir.path()).unwrap();
        // Another deployment's certificate for a third agent, and a file that is no
        // certificate: neither is trusted, both are reported.
        let foreign = other.issue(&id("mallory")).unwrap();
        foreign.save(dir.path()).unwrap();
        std::fs::write(dir.path().join("notes.pem"), "not a certificate").unwrap();

        let found = certified_keys(dir.path()).unwrap();
        let expected: Vec<(AgentId, VerifyingKey)> = [&alice, &bob]
            .map(|i| {
                let key = SigningKey::from_pkcs8_der(&i.key).unwrap().verifying_key();
                (i.agent.clone(), key)
            })
            .into();
        assert_eq!(found.keys.into_iter().collect::<Vec<_>>(), expected);
        let refused: Vec<String> = found
            .refused
            .iter()
            .map(|(p, _)| p.file_name().unwrap().to_string_lossy().into_owned())
            .collect();
        assert_eq!(refused, ["mallory.pem", "notes.pem"]);
        assert_eq!(certificate_key(&alice).unwrap(), expected[0].1);

        // A second certificate for alice with another key: which one speaks for her is a
        // guess, so the whole directory is refused.
        let again = ca.issue(&id("alice")).unwrap();
        let chain = pem::encode(&pem::Pem::new("CERTIFICATE", again.chain[0].to_vec()));
        std::fs::write(dir.path().join("alice-reissued.pem"), chain).unwrap();
        assert!(matches!(
            certified_keys(dir.path()),
            Err(IdentityError::Ambiguous(_))
        ));
    }
}
