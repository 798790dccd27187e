//! How bindings that name obligations in text (A2A JSON, MCP tool arguments) turn a text id
//! into an [`ObligationId`] and back. The mapping is injective: two spellings are two ids.
//! Only the canonical UUID spelling (36 bytes, lowercase, dashed) is read as the id's bytes,
//! so an id a CBOR peer made reads back as itself; every other spelling is hashed as spelled.
//! (Folding "ABC…" into "abc…", or a 32-hex form into its dashed form, made two obligations
//! one: the second was acked `applied` and never applied.)

use abhyasa_wire::ObligationId;
use sha2::{Digest as _, Sha256};

/// The longest text id a binding takes, in bytes.
pub const MAX_TEXT_ID: usize = 256;

/// The id named by `text`; `None` when it is empty or longer than [`MAX_TEXT_ID`].
pub fn text_obligation_id(text: &str) -> Option<ObligationId> {
    if text.is_empty() || text.len() > MAX_TEXT_ID {
        return None;
    }
    if let Some(bytes) = canonical_uuid(text) {
        return Some(ObligationId::from_bytes(bytes));
    }
    let d = Sha256::new()
        .chain_update(b"abhyasa/v1/a2a-obligation-id\0")
        .chain_update(text.as_bytes())
        .finalize();
    let mut b = [0u8; 16];
    b.copy_from_slice(&d[..16]);
    Some(ObligationId::from_bytes(b))
}

/// The canonical text of an id: the UUID spelling that [`text_obligation_id`] reads back as
/// the same id.
pub fn id_text(id: ObligationId) -> String {
    let h = format!("{:032x}", id.to_u128());
    format!(
        "{}-{}-{}-{}-{}",
        &h[..8],
        &h[8..12],
        &h[12..16],
        &h[16..20],
        &h[20..]
    )
}

/// The bytes of `s` if it is a UUID in canonical form: 36 bytes, lowercase hex digits, dashes
/// at 8, 13, 18 and 23.
pub fn canonical_uuid(s: &str) -> Option<[u8; 16]> {
    let b = s.as_bytes();
    if b.len() != 36 {
        return None;
    }
    let mut out = [0u8; 16];
    let mut digits = b
        .iter()
        .enumerate()
        .filter(|(i, _)| ![8, 13, 18, 23].contains(i));
    for byte in &mut out {
        let (_, hi) = digits.next()?;
        let (_, lo) = digits.next()?;
        *byte = (lower_hex(*hi)? << 4) | lower_hex(*lo)?;
    }
    [8, 13, 18, 23].iter().all(|&i| b[i] == b'-').then_some(out)
}

fn lower_hex(c: u8) -> Option<u8> {
    match c {
        b'0'..=b'9' => Some(c - b'0'),
        b'a'..=b'f' => Some(c - b'a' + 10),
        _ => None,
    }
}

/// The mutant's mapping ([`crate::NodeMutation::FoldIdSpellings`]): letter case and dashes
/// dropped before mapping, as the binding once did.
pub(crate) fn folded(text: &str) -> String {
    text.chars()
        .filter(|c| *c != '-')
        .map(|c| c.to_ascii_lowercase())
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn spellings_of_the_same_digits_are_different_ids() {
        let canonical = "0190f3c4-8e2a-7b1c-9d4e-5f6a7b8c9d0e";
        let ids: Vec<_> = [
            canonical,
            "0190F3C4-8E2A-7B1C-9D4E-5F6A7B8C9D0E",
            "0190f3c48e2a7b1c9d4e5f6a7b8c9d0e",
            "{0190f3c4-8e2a-7b1c-9d4e-5f6a7b8c9d0e}",
        ]
        .iter()
        .map(|s| text_obligation_id(s).expect("valid"))
        .collect();
        for (i, a) in ids.iter().enumerate() {
            for b in &ids[i + 1..] {
                assert_ne!(a, b);
            }
        }
        assert_eq!(id_text(ids[0]), canonical);
        assert_eq!(text_obligation_id(""), None);
        assert_eq!(text_obligation_id(&"a".repeat(MAX_TEXT_ID + 1)), None);
    }

    proptest! {
        /// Injective on what it takes: two different texts never name one id (the hash
        /// domain and the canonical domain do not meet on the texts drawn here, and within
        /// each the map is one-to-one).
        #[test]
        fn different_texts_are_different_ids(a in "[0-9a-fA-F-]{1,40}|\\PC{1,40}", b in "[0-9a-fA-F-]{1,40}|\\PC{1,40}") {
            prop_assume!(a != b);
            prop_assert_ne!(text_obligation_id(&a), text_obligation_id(&b));
        }

        /// Every id reads back from its canonical text.
        #[test]
        fn canonical_text_round_trips(n in any::<u128>()) {
            let id = ObligationId::from_u128(n);
            prop_assert_eq!(text_obligation_id(&id_text(id)), Some(id));
        }
    }
}
