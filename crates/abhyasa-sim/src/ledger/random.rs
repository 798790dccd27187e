//! The seed's choices of amounts, purposes and labels.

use super::*;

/// A random non-zero part of `avail` (at least one dimension, each at most what is there).
pub(super) fn random_part(rng: &mut SimRng, avail: &Vector) -> Vector {
    let pairs: Vec<(String, u64)> = avail
        .iter()
        .map(|(d, n)| {
            let take = if rng.random_bool(0.2) {
                n
            } else {
                rng.random_range(0..=n.min(60))
            };
            (d.as_str().to_owned(), take)
        })
        .collect();
    let mut v: Vec<(&str, u64)> = pairs.iter().map(|(d, n)| (d.as_str(), *n)).collect();
    if v.iter().all(|(_, n)| *n == 0) {
        v[0].1 = 1;
    }
    Vector::of(&v).expect("dimensions from a valid vector")
}

/// An effect that asks for more than its maximum: every dimension above it.
pub(super) fn overdrawn(rng: &mut SimRng, max: &Vector) -> Vector {
    let mut pairs: Vec<(String, u64)> = max
        .iter()
        .map(|(d, n)| (d.as_str().to_owned(), n + rng.random_range(1..=n.max(1))))
        .collect();
    // Half the time also a charge on a dimension the maximum does not name (a tool that
    // bills in a unit nobody budgeted): held to zero there, as every unnamed dimension.
    if rng.random_bool(0.5) {
        let unnamed = ["gpu_seconds", "egress_bytes"][rng.random_range(0..2)];
        if max.get(&abhyasa_wire::ledger::Dim::new(unnamed).expect("valid")) == 0 {
            pairs.push((unnamed.to_owned(), rng.random_range(1..=1_000)));
        }
    }
    let v: Vec<(&str, u64)> = pairs.iter().map(|(d, n)| (d.as_str(), *n)).collect();
    Vector::of(&v).expect("dimensions from a valid vector")
}

/// `asked`, held to `limit` in every dimension (what the executor can actually charge).
pub(super) fn capped(asked: &Vector, limit: &Vector) -> Vector {
    let pairs: Vec<(String, u64)> = asked
        .iter()
        .map(|(d, n)| (d.as_str().to_owned(), n.min(limit.get(d))))
        .collect();
    let v: Vec<(&str, u64)> = pairs.iter().map(|(d, n)| (d.as_str(), *n)).collect();
    Vector::of(&v).expect("dimensions from a valid vector")
}

/// Twice `v` in every dimension.
pub(super) fn doubled(v: &Vector) -> Vector {
    let pairs: Vec<(String, u64)> = v
        .iter()
        .map(|(d, n)| (d.as_str().to_owned(), n.saturating_mul(2)))
        .collect();
    let v: Vec<(&str, u64)> = pairs.iter().map(|(d, n)| (d.as_str(), *n)).collect();
    Vector::of(&v).expect("dimensions from a valid vector")
}

/// A purpose from `label` most of the time; now and then any purpose (which the ledger
/// refuses when the label does not allow it).
pub(super) fn random_purpose(rng: &mut SimRng, label: &Label) -> Dim {
    let inside: Vec<&Dim> = label.0.iter().collect();
    if inside.is_empty() || rng.random_bool(0.1) {
        Dim::new(PURPOSES[rng.random_range(0..PURPOSES.len())]).expect("valid purpose")
    } else {
        inside[rng.random_range(0..inside.len())].clone()
    }
}

/// A label for a split or transfer from a credit labelled `parent`: a non-empty subset of its
/// purposes most of the time; now and then one with a purpose added (which must be refused
/// when it broadens the parent's).
pub(super) fn random_label(rng: &mut SimRng, parent: &Label) -> Label {
    let mut out: std::collections::BTreeSet<Dim> = parent
        .0
        .iter()
        .filter(|_| rng.random_bool(0.6))
        .cloned()
        .collect();
    if out.is_empty() {
        if let Some(d) = parent.0.iter().next() {
            out.insert(d.clone());
        }
    }
    if rng.random_bool(0.1) {
        out.insert(Dim::new(PURPOSES[rng.random_range(0..PURPOSES.len())]).expect("valid purpose"));
    }
    Label(out)
}

/// What an effect charges: anywhere from nothing to its maximum.
pub(super) fn random_charge(rng: &mut SimRng, max: &Vector) -> Vector {
    let pairs: Vec<(String, u64)> = max
        .iter()
        .map(|(d, n)| {
            let c = match rng.random_range(0..4) {
                0 => n,
                1 => 0,
                _ => rng.random_range(0..=n),
            };
            (d.as_str().to_owned(), c)
        })
        .collect();
    let v: Vec<(&str, u64)> = pairs.iter().map(|(d, n)| (d.as_str(), *n)).collect();
    Vector::of(&v).expect("dimensions from a valid vector")
}
