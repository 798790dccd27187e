//! The Merkle tree of RFC 9162 (§2.1) over SHA-256: leaf and node hashes, the root of a group,
//! inclusion proofs and their verification. Leaves and nodes are domain-separated (a 0x00 or
//! 0x01 prefix), so no node hash is ever a leaf hash; a path is folded by the leaf's index and
//! the tree's size, so a proof for one leaf proves no other.

use sha2::{Digest, Sha256};

/// A SHA-256 hash.
pub(crate) type Hash = [u8; 32];

/// The leaf hash of an entry: `SHA-256(0x00 || entry)`.
pub(crate) fn leaf(entry: &[u8]) -> Hash {
    let mut h = Sha256::new();
    h.update([0u8]);
    h.update(entry);
    h.finalize().into()
}

/// An interior node: `SHA-256(0x01 || left || right)`.
fn node(left: &Hash, right: &Hash) -> Hash {
    let mut h = Sha256::new();
    h.update([1u8]);
    h.update(left);
    h.update(right);
    h.finalize().into()
}

/// A whole tree, level by level (leaves first): each level pairs the one below from the left
/// and carries an odd last node up unchanged, which builds exactly RFC 9162's tree (its split
/// at the largest power of two below the size is that left-filled shape). Built once, it gives
/// every leaf's proof without hashing again.
pub(crate) struct Tree {
    levels: Vec<Vec<Hash>>,
}

impl Tree {
    /// The tree over `leaves`; `None` for no leaves.
    pub(crate) fn new(leaves: Vec<Hash>) -> Option<Self> {
        if leaves.is_empty() {
            return None;
        }
        let mut levels = vec![leaves];
        while let Some(below) = levels.last().filter(|l| l.len() > 1) {
            let up = below
                .chunks(2)
                .map(|pair| match pair {
                    [l, r] => node(l, r),
                    [odd] => *odd,
                    _ => unreachable!("chunks of two"),
                })
                .collect();
            levels.push(up);
        }
        Some(Self { levels })
    }

    /// The root (MTH of RFC 9162 §2.1.1).
    pub(crate) fn root(&self) -> Hash {
        self.levels
            .last()
            .and_then(|top| top.first())
            .copied()
            .unwrap_or_else(|| unreachable!("a tree has a root"))
    }

    /// The inclusion proof of leaf `m` (PATH of RFC 9162 §2.1.3.1), nearest sibling first.
    pub(crate) fn path(&self, mut m: usize) -> Vec<Hash> {
        let mut p = Vec::new();
        for level in &self.levels[..self.levels.len() - 1] {
            if let Some(sibling) = level.get(m ^ 1) {
                p.push(*sibling);
            }
            m >>= 1;
        }
        p
    }
}

/// The root that `leaf` at `index` of a tree of `size` leaves proves with `path` (RFC 9162
/// §2.1.3.2); `None` when the proof cannot be one for that place.
pub(crate) fn root_from_path(index: u64, size: u64, leaf: Hash, path: &[Hash]) -> Option<Hash> {
    if index >= size {
        return None;
    }
    let (mut fn_, mut sn) = (index, size - 1);
    let mut r = leaf;
    for p in path {
        if sn == 0 {
            return None;
        }
        if fn_ & 1 == 1 || fn_ == sn {
            r = node(p, &r);
            if fn_ & 1 == 0 {
                while fn_ & 1 == 0 && fn_ != 0 {
                    fn_ >>= 1;
                    sn >>= 1;
                }
            }
        } else {
            r = node(&r, p);
        }
        fn_ >>= 1;
        sn >>= 1;
    }
    (sn == 0).then_some(r)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The largest power of two below `n` (`n` ≥ 2).
    fn split(n: usize) -> usize {
        let mut k = 1;
        while k << 1 < n {
            k <<= 1;
        }
        k
    }

    /// MTH, as RFC 9162 §2.1.1 defines it.
    fn root(leaves: &[Hash]) -> Option<Hash> {
        match leaves {
            [] => None,
            [one] => Some(*one),
            _ => {
                let k = split(leaves.len());
                Some(node(&root(&leaves[..k])?, &root(&leaves[k..])?))
            }
        }
    }

    /// PATH, as RFC 9162 §2.1.3.1 defines it.
    fn path(m: usize, leaves: &[Hash]) -> Vec<Hash> {
        if leaves.len() < 2 || m >= leaves.len() {
            return Vec::new();
        }
        let k = split(leaves.len());
        let (mut p, sibling) = if m < k {
            (path(m, &leaves[..k]), root(&leaves[k..]))
        } else {
            (path(m - k, &leaves[k..]), root(&leaves[..k]))
        };
        p.extend(sibling);
        p
    }

    /// The tree built level by level is RFC 9162's, root and every path, for every size up
    /// to 70 leaves.
    #[test]
    fn the_level_by_level_tree_is_rfc_9162s() {
        assert!(Tree::new(Vec::new()).is_none());
        for n in 1..=70 {
            let ls = leaves(n);
            let tree = Tree::new(ls.clone()).unwrap();
            assert_eq!(Some(tree.root()), root(&ls), "n={n}");
            for m in 0..n {
                assert_eq!(tree.path(m), path(m, &ls), "n={n} m={m}");
            }
        }
    }

    fn leaves(n: usize) -> Vec<Hash> {
        (0..n).map(|i| leaf(&[i as u8; 3])).collect()
    }

    /// Every leaf of every tree up to 33 leaves proves the root with its own place, and with
    /// no other place, a neighbour's leaf or a shortened path. (A claimed tree size is only
    /// the shape the path is folded in: a size under which the same leaf and path still give
    /// the same root proves nothing new, and the envelope's payload is the leaf.)
    #[test]
    fn every_leaf_proves_the_root_at_its_place_only() {
        for n in 1..=33 {
            let ls = leaves(n);
            let r = root(&ls).unwrap();
            for m in 0..n {
                let p = path(m, &ls);
                let (i, s) = (m as u64, n as u64);
                assert_eq!(root_from_path(i, s, ls[m], &p), Some(r), "n={n} m={m}");
                for j in (0..n).filter(|&j| j != m) {
                    assert_ne!(root_from_path(j as u64, s, ls[m], &p), Some(r));
                    assert_ne!(root_from_path(i, s, ls[j], &p), Some(r));
                }
                if let Some((_, shorter)) = p.split_last() {
                    assert_ne!(root_from_path(i, s, ls[m], shorter), Some(r));
                }
            }
        }
    }

    /// The tree of RFC 9162 §2.1.1 for five leaves, written out by hand.
    #[test]
    fn the_root_is_rfc_9162s_for_an_unbalanced_tree() {
        let ls = leaves(5);
        let want = node(&node(&node(&ls[0], &ls[1]), &node(&ls[2], &ls[3])), &ls[4]);
        assert_eq!(root(&ls), Some(want));
        assert_eq!(
            path(4, &ls),
            vec![node(&node(&ls[0], &ls[1]), &node(&ls[2], &ls[3]))]
        );
        assert_eq!(path(2, &ls), vec![ls[3], node(&ls[0], &ls[1]), ls[4]]);
        assert_eq!(root(&[]), None);
        assert_ne!(leaf(b""), node(&[0; 32], &[0; 32]));
    }
}
