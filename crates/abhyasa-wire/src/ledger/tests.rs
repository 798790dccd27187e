use std::collections::BTreeSet;

use proptest::prelude::*;

use super::signed::{message, Bytes};
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
