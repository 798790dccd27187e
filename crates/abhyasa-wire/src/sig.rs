//! The one rule by which every Ed25519 signature in Abhyasa is verified — custody envelopes,
//! ledger objects and stored ledger records alike, one at a time or in a batch.
//!
//! The rule is ZIP 215's (the cofactored equation `[8](sB − R − kA) = 0`, with `s` canonical)
//! plus one refusal of our own: a small-order ("weak") key verifies nothing. ZIP 215 is chosen
//! because under it a batch verification accepts exactly what verifying each signature on its
//! own accepts — whatever the batch's random coefficients — so a signer cannot craft a
//! signature that one verifier takes in a batch and another (recovery, the checker, an
//! auditor) refuses alone. RFC 8032's cofactorless equation (`verify_strict`) does not agree
//! with any batch equation: a small-order component in `R` passes a batch whenever its random
//! coefficient happens to cancel it, and a signer can search for inputs where it does.
//!
//! Every signature a correct signer makes verifies under both rules; only a signer crafting
//! its own signatures can tell them apart, and under this rule it gains nothing by it: what
//! it signed verifies the same way everywhere. No one else can alter a signature (a changed
//! `R` encoding changes the hash `k`; a non-canonical `s` is refused).
//!
//! The implementation is `ed25519-zebra`'s, which implements ZIP 215 for single and batch
//! verification and coalesces the terms of signatures by the same key: a group of objects from
//! one peer costs about a quarter of verifying each alone (docs/BENCHMARKS.md).

use ed25519_dalek::{Signature, VerifyingKey};

/// Whether `signature` is `key`'s over `message` under the rule above.
pub fn verify(key: &VerifyingKey, message: &[u8], signature: &Signature) -> bool {
    if key.is_weak() {
        return false;
    }
    ed25519_zebra::VerificationKey::try_from(key.to_bytes())
        .and_then(|k| k.verify(signature, message))
        .is_ok()
}

/// Signatures to verify together: [`verify_all`](Batch::verify_all) answers for each exactly
/// what [`verify`] answers for it alone.
#[derive(Default)]
pub struct Batch {
    batch: ed25519_zebra::batch::Verifier,
    /// Each signature queued (kept to verify it alone when the batch fails), `None` for a
    /// refused key.
    items: Vec<Option<ed25519_zebra::batch::Item>>,
}

impl std::fmt::Debug for Batch {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Batch")
            .field("items", &self.items.len())
            .finish_non_exhaustive()
    }
}

impl Batch {
    /// An empty batch.
    pub fn new() -> Self {
        Self::default()
    }

    /// How many signatures are queued (refused ones included).
    pub fn len(&self) -> usize {
        self.items.len()
    }

    /// Whether nothing is queued.
    pub fn is_empty(&self) -> bool {
        self.items.is_empty()
    }

    /// Queues `signature` by `key` over `message`; its answer is at this call's position
    /// (counting from 0) in what [`verify_all`](Self::verify_all) returns. The message is
    /// hashed now and not kept.
    pub fn push(&mut self, key: &VerifyingKey, message: &[u8], signature: &Signature) {
        if key.is_weak() {
            self.items.push(None);
            return;
        }
        let item = ed25519_zebra::batch::Item::from((
            ed25519_zebra::VerificationKeyBytes::from(key.to_bytes()),
            *signature,
            message,
        ));
        self.batch.queue(item.clone());
        self.items.push(Some(item));
    }

    /// Whether each queued signature verifies, in the order queued: one batch equation when
    /// all do, each on its own when one does not (to name which).
    pub fn verify_all(self) -> Vec<bool> {
        let Self { batch, items } = self;
        let queued = items.iter().filter(|q| q.is_some()).count();
        let whole = queued > 0 && batch.verify(rand_core::OsRng).is_ok();
        items
            .into_iter()
            .map(|q| match q {
                None => false,
                Some(_) if whole => true,
                Some(item) => item.verify_single().is_ok(),
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use ed25519_dalek::{Signer, SigningKey};

    fn key(n: u8) -> SigningKey {
        SigningKey::from_bytes(&[n; 32])
    }

    #[test]
    fn a_batch_answers_for_each_signature_what_verifying_it_alone_answers() {
        let (a, b) = (key(1), key(2));
        let messages: Vec<Vec<u8>> = (0..12u8).map(|i| vec![i; 40 + usize::from(i)]).collect();
        let mut signed: Vec<(VerifyingKey, Vec<u8>, Signature)> = messages
            .iter()
            .enumerate()
            .map(|(i, m)| {
                let k = if i % 3 == 0 { &b } else { &a };
                (k.verifying_key(), m.clone(), k.sign(m))
            })
            .collect();
        // Break three: a message changed after signing, a signature by the other key, and
        // a non-canonical s (s + the group order l).
        signed[2].1[0] ^= 1;
        signed[5].2 = b.sign(&signed[5].1);
        let mut s = signed[7].2.to_bytes();
        let l: [u8; 32] = [
            0xed, 0xd3, 0xf5, 0x5c, 0x1a, 0x63, 0x12, 0x58, 0xd6, 0x9c, 0xf7, 0xa2, 0xde, 0xf9,
            0xde, 0x14, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0x10,
        ];
        let mut carry = 0u16;
        for i in 0..32 {
            let v = u16::from(s[32 + i]) + u16::from(l[i]) + carry;
            s[32 + i] = v as u8;
            carry = v >> 8;
        }
        signed[7].2 = Signature::from_bytes(&s);

        let expected: Vec<bool> = (0..signed.len()).map(|i| ![2, 5, 7].contains(&i)).collect();
        let alone: Vec<bool> = signed.iter().map(|(k, m, s)| verify(k, m, s)).collect();
        assert_eq!(alone, expected, "verifying alone");
        let mut batch = Batch::new();
        for (k, m, s) in &signed {
            batch.push(k, m, s);
        }
        assert_eq!(batch.len(), signed.len());
        assert_eq!(batch.verify_all(), expected, "verifying in a batch");

        // All good: one batch equation says so.
        let mut batch = Batch::new();
        for (i, (k, m, s)) in signed.iter().enumerate() {
            if expected[i] {
                batch.push(k, m, s);
            }
        }
        assert!(batch.verify_all().iter().all(|&ok| ok));
    }

    #[test]
    fn a_small_order_key_verifies_nothing() {
        // The identity point: with s = 0 and R = identity, the equation holds for every
        // message, so only the key's refusal stops it.
        let mut identity = [0u8; 32];
        identity[0] = 1;
        let weak = VerifyingKey::from_bytes(&identity).expect("the identity decodes");
        let mut sig = [0u8; 64];
        sig[0] = 1;
        let sig = Signature::from_bytes(&sig);
        assert!(!verify(&weak, b"anything", &sig));
        let mut batch = Batch::new();
        batch.push(&weak, b"anything", &sig);
        assert_eq!(batch.verify_all(), vec![false]);
        // Without the refusal the equation would hold:
        assert!(ed25519_zebra::VerificationKey::try_from(identity)
            .and_then(|k| k.verify(&sig, b"anything"))
            .is_ok());
    }

    /// The case the rule exists for: a signer crafts a signature whose `R` has a small-order
    /// component. RFC 8032's cofactorless check (`verify_strict`) refuses it; a batch under that
    /// check would accept it whenever its random coefficient cancels the component. Under
    /// ZIP 215 it is accepted alone and in every batch — one answer everywhere.
    #[test]
    fn a_crafted_mixed_order_signature_gets_one_answer_alone_and_in_any_batch() {
        use curve25519_dalek::{constants, EdwardsPoint, Scalar};
        use sha2::{Digest as _, Sha512};
        let signer = key(7);
        let a = signer.to_scalar();
        let public = signer.verifying_key();
        let message = b"a receipt the signer means to disown later";
        for (i, torsion) in constants::EIGHT_TORSION.iter().enumerate().skip(1) {
            let r = Scalar::from(1_000_003u64 + i as u64);
            let big_r: EdwardsPoint = constants::ED25519_BASEPOINT_POINT * r + torsion;
            let r_bytes = big_r.compress().to_bytes();
            let k = Scalar::from_hash(
                Sha512::new()
                    .chain_update(r_bytes)
                    .chain_update(public.as_bytes())
                    .chain_update(message),
            );
            let s = r + k * a;
            let mut bytes = [0u8; 64];
            bytes[..32].copy_from_slice(&r_bytes);
            bytes[32..].copy_from_slice(s.as_bytes());
            let crafted = Signature::from_bytes(&bytes);

            assert!(
                public.verify_strict(message, &crafted).is_err(),
                "torsion point {i}: the cofactorless check refuses it"
            );
            assert!(
                verify(&public, message, &crafted),
                "torsion point {i}: alone"
            );
            for neighbours in 0..6u8 {
                let mut batch = Batch::new();
                let others: Vec<Vec<u8>> = (0..neighbours).map(|n| vec![n; 9]).collect();
                for m in &others {
                    batch.push(&public, m, &signer.sign(m));
                }
                batch.push(&public, message, &crafted);
                assert!(
                    batch.verify_all().into_iter().all(|ok| ok),
                    "torsion point {i}, {neighbours} neighbours: in a batch"
                );
            }
        }
    }

    #[test]
    fn an_empty_batch_is_empty() {
        assert!(Batch::new().verify_all().is_empty());
    }
}
