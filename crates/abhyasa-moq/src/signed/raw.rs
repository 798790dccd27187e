//! The envelope's bytes written and read directly, in the one layout [`super::Signer`] writes,
//! without building a CBOR value tree for each object (which cost more CPU than the
//! signatures did once a group shares one).
//!
//! What is written here is byte for byte what `coset` writes for the same envelope (the tests
//! compare the two). What is read here is only that layout: an envelope in any other valid
//! COSE_Sign1 form (another unprotected header, a nil payload, long-form heads where the
//! writer uses short ones, …) is left to the general reader, which decides it as before.

use super::merkle::Hash;

/// CBOR major types used here.
const UINT: u8 = 0;
const BYTES: u8 = 2;
const ARRAY: u8 = 4;

/// The tagged COSE_Sign1 start: tag 18, then an array of four.
const SIGN1_START: [u8; 2] = [0xd2, 0x84];
/// An empty unprotected header.
const NO_HEADER: u8 = 0xa0;
/// An unprotected header of one entry, `vdp` (396): a map of one entry, `-1` (inclusion
/// proofs): an array of one byte string, which follows.
const VDP_ONE_PROOF: [u8; 7] = [0xa1, 0x19, 0x01, 0x8c, 0xa1, 0x20, 0x81];
/// `Sig_structure` start: an array of four, the text "Signature1".
const SIG1_CONTEXT: [u8; 12] = [
    0x84, 0x6a, b'S', b'i', b'g', b'n', b'a', b't', b'u', b'r', b'e', b'1',
];

/// Appends a CBOR head of `major` with argument `arg`, in the shortest form.
fn head(out: &mut Vec<u8>, major: u8, arg: u64) {
    let m = major << 5;
    match arg {
        0..=23 => out.push(m | arg as u8),
        24..=0xff => out.extend_from_slice(&[m | 24, arg as u8]),
        0x100..=0xffff => {
            out.push(m | 25);
            out.extend_from_slice(&(arg as u16).to_be_bytes());
        }
        0x1_0000..=0xffff_ffff => {
            out.push(m | 26);
            out.extend_from_slice(&(arg as u32).to_be_bytes());
        }
        _ => {
            out.push(m | 27);
            out.extend_from_slice(&arg.to_be_bytes());
        }
    }
}

fn bstr(out: &mut Vec<u8>, b: &[u8]) {
    head(out, BYTES, b.len() as u64);
    out.extend_from_slice(b);
}

/// A tagged COSE_Sign1: `protected` (the protected header's encoded bytes), an unprotected
/// header holding `proof` as its one inclusion proof (or empty without one), `payload`
/// attached, and `signature`.
pub(super) fn envelope(
    protected: &[u8],
    proof: Option<&[u8]>,
    payload: &[u8],
    signature: &[u8],
) -> Vec<u8> {
    let mut out = Vec::with_capacity(
        protected.len() + proof.map_or(0, <[u8]>::len) + payload.len() + signature.len() + 32,
    );
    out.extend_from_slice(&SIGN1_START);
    bstr(&mut out, protected);
    match proof {
        None => out.push(NO_HEADER),
        Some(p) => {
            out.extend_from_slice(&VDP_ONE_PROOF);
            bstr(&mut out, p);
        }
    }
    bstr(&mut out, payload);
    bstr(&mut out, signature);
    out
}

/// An inclusion proof's bytes: `[tree_size, leaf_index, [+ bstr]]`.
pub(super) fn proof(size: u64, index: u64, path: &[Hash]) -> Vec<u8> {
    let mut out = Vec::with_capacity(20 + path.len() * 34);
    head(&mut out, ARRAY, 3);
    head(&mut out, UINT, size);
    head(&mut out, UINT, index);
    head(&mut out, ARRAY, path.len() as u64);
    for h in path {
        bstr(&mut out, h);
    }
    out
}

/// The `Sig_structure` a COSE_Sign1 signs: context "Signature1", the protected header's
/// bytes, no external AAD, and `payload` (the object, or a group's root).
pub(super) fn sig_structure(protected: &[u8], payload: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(SIG1_CONTEXT.len() + protected.len() + payload.len() + 20);
    out.extend_from_slice(&SIG1_CONTEXT);
    bstr(&mut out, protected);
    bstr(&mut out, &[]);
    bstr(&mut out, payload);
    out
}

/// Reads CBOR heads and byte strings from a slice, definite lengths only.
struct Reader<'a> {
    rest: &'a [u8],
}

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize) -> Option<&'a [u8]> {
        if n > self.rest.len() {
            return None;
        }
        let (taken, rest) = self.rest.split_at(n);
        self.rest = rest;
        Some(taken)
    }

    fn expect(&mut self, bytes: &[u8]) -> Option<()> {
        (self.take(bytes.len())? == bytes).then_some(())
    }

    /// A head of `major`: its argument. Any definite form is read, as a general CBOR reader
    /// reads it; an indefinite length is not.
    fn head(&mut self, major: u8) -> Option<u64> {
        let first = *self.take(1)?.first()?;
        if first >> 5 != major {
            return None;
        }
        let arg = match first & 0x1f {
            n @ 0..=23 => u64::from(n),
            24 => u64::from(self.take(1)?[0]),
            25 => u64::from(u16::from_be_bytes(self.take(2)?.try_into().ok()?)),
            26 => u64::from(u32::from_be_bytes(self.take(4)?.try_into().ok()?)),
            27 => u64::from_be_bytes(self.take(8)?.try_into().ok()?),
            _ => return None,
        };
        Some(arg)
    }

    fn bstr(&mut self) -> Option<&'a [u8]> {
        let len = usize::try_from(self.head(BYTES)?).ok()?;
        self.take(len)
    }
}

/// A COSE_Sign1 in this module's own layout, borrowed from its bytes.
#[derive(Debug, PartialEq, Eq)]
pub(super) struct Parts<'a> {
    /// The protected header's encoded bytes.
    pub(super) protected: &'a [u8],
    /// The one inclusion proof's bytes, when the unprotected header holds one.
    pub(super) proof: Option<&'a [u8]>,
    /// The attached payload.
    pub(super) payload: &'a [u8],
    /// The signature.
    pub(super) signature: &'a [u8],
}

/// `bytes` read as an envelope in the layout [`envelope`] writes (any definite head forms);
/// `None` for anything else, which the general reader then decides.
pub(super) fn parts(bytes: &[u8]) -> Option<Parts<'_>> {
    let mut r = Reader { rest: bytes };
    r.expect(&SIGN1_START)?;
    let protected = r.bstr()?;
    let proof = match r.rest.first()? {
        &NO_HEADER => {
            r.take(1)?;
            None
        }
        _ => {
            r.expect(&VDP_ONE_PROOF)?;
            Some(r.bstr()?)
        }
    };
    let payload = r.bstr()?;
    let signature = r.bstr()?;
    r.rest.is_empty().then_some(Parts {
        protected,
        proof,
        payload,
        signature,
    })
}

/// An inclusion proof read as `[size, index, [+ bstr]]` (any definite head forms, each path
/// entry a 32-byte hash); `None` for anything else, which the general reader then decides.
pub(super) fn read_proof(bytes: &[u8], max_path: usize) -> Option<(u64, u64, Vec<Hash>)> {
    let mut r = Reader { rest: bytes };
    (r.head(ARRAY)? == 3).then_some(())?;
    let size = r.head(UINT)?;
    let index = r.head(UINT)?;
    let len = usize::try_from(r.head(ARRAY)?).ok()?;
    if len > max_path {
        return None;
    }
    let mut path = Vec::with_capacity(len);
    for _ in 0..len {
        path.push(Hash::try_from(r.bstr()?).ok()?);
    }
    r.rest.is_empty().then_some((size, index, path))
}

#[cfg(test)]
mod tests {
    use super::*;
    use coset::cbor::Value;

    fn coset_bytes(v: &Value) -> Vec<u8> {
        let mut out = Vec::new();
        coset::cbor::ser::into_writer(v, &mut out).unwrap();
        out
    }

    #[test]
    fn heads_are_the_shortest_form_coset_writes_at_every_boundary() {
        for n in [
            0u64,
            23,
            24,
            255,
            256,
            65_535,
            65_536,
            u64::from(u32::MAX),
            u64::from(u32::MAX) + 1,
            u64::MAX,
        ] {
            let mut ours = Vec::new();
            head(&mut ours, UINT, n);
            assert_eq!(ours, coset_bytes(&Value::Integer(n.into())), "uint {n}");
            let mut r = Reader { rest: &ours };
            assert_eq!(r.head(UINT), Some(n));
            assert!(r.rest.is_empty());
        }
        for len in [0usize, 23, 24, 255, 256, 70_000] {
            let b = vec![7u8; len];
            let mut ours = Vec::new();
            bstr(&mut ours, &b);
            assert_eq!(ours, coset_bytes(&Value::Bytes(b.clone())), "bstr of {len}");
            assert_eq!(Reader { rest: &ours }.bstr(), Some(&b[..]));
        }
    }

    #[test]
    fn sig_structures_are_cosets_byte_for_byte() {
        for (plen, len) in [
            (0usize, 0usize),
            (5, 32),
            (300, 32),
            (23, 24),
            (400, 70_000),
        ] {
            let protected = vec![0xa3u8; plen];
            let payload = vec![0x11u8; len];
            let theirs = coset::sig_structure_data(
                coset::SignatureContext::CoseSign1,
                coset::ProtectedHeader {
                    original_data: Some(protected.clone()),
                    header: coset::Header::default(),
                },
                None,
                &[],
                &payload,
            );
            assert_eq!(sig_structure(&protected, &payload), theirs, "{plen} {len}");
        }
    }

    #[test]
    fn a_proof_reads_back_and_nothing_else_does() {
        let path = [[1u8; 32], [2u8; 32], [3u8; 32]];
        let p = proof(1_000, 999, &path);
        assert_eq!(read_proof(&p, 32), Some((1_000, 999, path.to_vec())));
        assert_eq!(read_proof(&p, 2), None, "longer than the limit");
        assert_eq!(read_proof(&p[..p.len() - 1], 32), None, "truncated");
        let mut trailing = p.clone();
        trailing.push(0);
        assert_eq!(read_proof(&trailing, 32), None, "trailing byte");
        let short_hash = proof(2, 0, &[]);
        assert_eq!(read_proof(&short_hash, 32), Some((2, 0, vec![])));
        // A path entry of 31 bytes is not a hash.
        let mut odd = Vec::new();
        head(&mut odd, ARRAY, 3);
        head(&mut odd, UINT, 2);
        head(&mut odd, UINT, 1);
        head(&mut odd, ARRAY, 1);
        bstr(&mut odd, &[0u8; 31]);
        assert_eq!(read_proof(&odd, 32), None);
    }

    #[test]
    fn an_envelope_reads_back_into_its_parts_and_a_changed_layout_does_not() {
        let e = envelope(b"prot", Some(b"proof"), b"payload", &[9u8; 64]);
        assert_eq!(
            parts(&e),
            Some(Parts {
                protected: b"prot",
                proof: Some(b"proof"),
                payload: b"payload",
                signature: &[9u8; 64],
            })
        );
        let lone = envelope(b"prot", None, b"payload", &[9u8; 64]);
        assert_eq!(parts(&lone).map(|p| p.proof), Some(None));
        for cut in 0..lone.len() {
            assert_eq!(parts(&lone[..cut]), None, "cut at {cut}");
        }
        let mut trailing = lone.clone();
        trailing.push(0);
        assert_eq!(parts(&trailing), None);
        let mut untagged = lone.clone();
        untagged.remove(0);
        assert_eq!(parts(&untagged), None);
    }
}
