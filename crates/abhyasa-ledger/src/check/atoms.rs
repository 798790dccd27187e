//! The checker's own interval arithmetic on raw atom ranges: never the ledger's `take`,
//! `union` or `subtract`, so a bug there cannot hide itself.

use abhyasa_wire::ledger::{Dim, Vector};

/// A half-open range of atoms.
pub(super) type Iv = (u64, u64);

/// How many atoms, counted with overlaps.
pub(super) fn size(ivs: &[Iv]) -> u128 {
    ivs.iter()
        .map(|&(s, e)| u128::from(e.saturating_sub(s)))
        .sum()
}

/// Sorted and merged; `Err(atom)` names an atom found twice.
pub(super) fn normalize(mut ivs: Vec<Iv>) -> Result<Vec<Iv>, u64> {
    ivs.sort_unstable();
    let mut out: Vec<Iv> = Vec::new();
    for (s, e) in ivs {
        if s >= e {
            continue;
        }
        match out.last_mut() {
            Some(last) if s < last.1 => return Err(s),
            Some(last) if s == last.1 => last.1 = e,
            _ => out.push((s, e)),
        }
    }
    Ok(out)
}

/// Whether every atom of `inner` is in `outer` (both normalized).
pub(super) fn subset(inner: &[Iv], outer: &[Iv]) -> bool {
    inner
        .iter()
        .all(|&(s, e)| outer.iter().any(|&(os, oe)| os <= s && e <= oe))
}

/// One dimension of a vector, widened.
pub(super) fn vec_get(v: &Vector, d: &Dim) -> u128 {
    u128::from(v.get(d))
}

/// Sorted and merged, overlaps allowed (ingress may repeat an atom that left and came back).
pub(super) fn normalize_loose(mut v: Vec<Iv>) -> Vec<Iv> {
    v.sort_unstable();
    let mut m: Vec<Iv> = Vec::new();
    for (s, e) in v {
        match m.last_mut() {
            Some(l) if s <= l.1 => l.1 = l.1.max(e),
            _ => m.push((s, e)),
        }
    }
    m
}
