//! The ledger's units: dimensions, vectors of amounts, and footprints (the exact atoms a
//! credit, transfer or operation owns), with the arithmetic the ledger's rules are written in.

use super::*;

/// A resource dimension: `[a-z0-9_]`, 1 to 32 characters (`cents`, `calls`, `tokens`).
///
/// Held inline (no allocation): every footprint and vector operation copies its dimensions,
/// and a heap string per copy was a measurable share of a ledger cycle. Ordered, compared
/// and hashed as its text.
#[derive(Clone)]
pub struct Dim {
    len: u8,
    bytes: [u8; Dim::MAX_LEN],
}

impl Dim {
    /// Longest name, in bytes.
    pub const MAX_LEN: usize = 32;

    /// Validates a dimension name.
    pub fn new(name: impl Into<String>) -> Result<Self, WireError> {
        let name = name.into();
        let ok = !name.is_empty()
            && name.len() <= Self::MAX_LEN
            && name
                .bytes()
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_');
        if !ok {
            return Err(WireError::Invalid("dimension name"));
        }
        let mut bytes = [0; Self::MAX_LEN];
        bytes[..name.len()].copy_from_slice(name.as_bytes());
        Ok(Self {
            len: name.len() as u8,
            bytes,
        })
    }

    /// The name.
    pub fn as_str(&self) -> &str {
        // ASCII by construction, so never the empty fallback.
        std::str::from_utf8(&self.bytes[..usize::from(self.len)]).unwrap_or_default()
    }
}

impl PartialEq for Dim {
    fn eq(&self, other: &Self) -> bool {
        self.as_str() == other.as_str()
    }
}

impl Eq for Dim {}

impl PartialOrd for Dim {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}

impl Ord for Dim {
    fn cmp(&self, other: &Self) -> std::cmp::Ordering {
        self.as_str().cmp(other.as_str())
    }
}

impl std::hash::Hash for Dim {
    fn hash<H: std::hash::Hasher>(&self, h: &mut H) {
        self.as_str().hash(h)
    }
}

impl fmt::Debug for Dim {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_tuple("Dim").field(&self.as_str()).finish()
    }
}

impl Serialize for Dim {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(self.as_str())
    }
}

impl<'de> Deserialize<'de> for Dim {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        Dim::new(String::deserialize(d)?).map_err(de::Error::custom)
    }
}

impl fmt::Display for Dim {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A resource vector: integer quanta per named dimension. Canonical: no zero entries.
#[derive(Clone, PartialEq, Eq, Hash, Default, Serialize)]
pub struct Vector(BTreeMap<Dim, u64>);

impl Vector {
    /// The zero vector.
    pub fn zero() -> Self {
        Self::default()
    }

    /// A vector from `(dimension, amount)` pairs (zero amounts dropped).
    pub fn of(pairs: &[(&str, u64)]) -> Result<Self, WireError> {
        let mut v = BTreeMap::new();
        for &(d, n) in pairs {
            if n > 0 && v.insert(Dim::new(d)?, n).is_some() {
                return Err(WireError::Invalid("dimension repeated in vector"));
            }
        }
        if v.len() > MAX_DIMS {
            return Err(WireError::Invalid("too many dimensions"));
        }
        Ok(Self(v))
    }

    /// The amount in `dim` (0 when absent).
    pub fn get(&self, dim: &Dim) -> u64 {
        self.0.get(dim).copied().unwrap_or(0)
    }

    /// Entries with non-zero amounts.
    pub fn iter(&self) -> impl Iterator<Item = (&Dim, u64)> {
        self.0.iter().map(|(d, &n)| (d, n))
    }

    /// Whether every amount is zero.
    pub fn is_zero(&self) -> bool {
        self.0.is_empty()
    }

    /// `self + other`, or `None` on overflow.
    pub fn checked_add(&self, other: &Vector) -> Option<Vector> {
        let mut out = self.0.clone();
        for (d, n) in other.iter() {
            let e = out.entry(d.clone()).or_insert(0);
            *e = e.checked_add(n)?;
        }
        Some(Vector(out))
    }

    /// `self - other`, or `None` when some component would go negative.
    pub fn checked_sub(&self, other: &Vector) -> Option<Vector> {
        let mut out = self.0.clone();
        for (d, n) in other.iter() {
            let e = out.get_mut(d)?;
            *e = e.checked_sub(n)?;
            if *e == 0 {
                out.remove(d);
            }
        }
        Some(Vector(out))
    }

    /// Componentwise `self ≤ other`.
    pub fn le(&self, other: &Vector) -> bool {
        self.iter().all(|(d, n)| n <= other.get(d))
    }

    fn insert(&mut self, d: Dim, n: u64) {
        if n > 0 {
            self.0.insert(d, n);
        }
    }
}

impl fmt::Debug for Vector {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("(")?;
        for (i, (d, n)) in self.iter().enumerate() {
            if i > 0 {
                f.write_str(", ")?;
            }
            write!(f, "{n} {d}")?;
        }
        f.write_str(")")
    }
}

impl<'de> Deserialize<'de> for Vector {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let map = BTreeMap::<Dim, u64>::deserialize(d)?;
        if map.len() > MAX_DIMS {
            return Err(de::Error::custom("too many dimensions"));
        }
        if map.values().any(|&n| n == 0) {
            return Err(de::Error::custom("zero entry in a vector"));
        }
        Ok(Vector(map))
    }
}

/// A set of atoms of one dimension as sorted, disjoint, non-adjacent half-open ranges.
#[derive(Clone, PartialEq, Eq, Hash, Default, Serialize)]
pub struct Ranges(Vec<(u64, u64)>);

impl Ranges {
    /// `[0, n)`.
    pub fn upto(n: u64) -> Self {
        if n == 0 {
            Self::default()
        } else {
            Self(vec![(0, n)])
        }
    }

    /// From arbitrary ranges; `None` when two overlap or one is inverted.
    pub fn from_ranges(mut v: Vec<(u64, u64)>) -> Option<Self> {
        v.retain(|&(s, e)| s != e);
        if v.iter().any(|&(s, e)| s > e) {
            return None;
        }
        v.sort_unstable();
        let mut out: Vec<(u64, u64)> = Vec::with_capacity(v.len());
        for (s, e) in v {
            match out.last_mut() {
                Some(last) if s < last.1 => return None,
                Some(last) if s == last.1 => last.1 = e,
                _ => out.push((s, e)),
            }
        }
        Some(Self(out))
    }

    /// The ranges.
    pub fn ranges(&self) -> &[(u64, u64)] {
        &self.0
    }

    /// Number of atoms.
    pub fn len(&self) -> u64 {
        self.0.iter().map(|&(s, e)| e - s).sum()
    }

    /// Whether there is no atom.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// Splits off the lowest `n` atoms: `(taken, rest)`, or `None` when there are fewer.
    pub fn take_lowest(&self, n: u64) -> Option<(Ranges, Ranges)> {
        if n > self.len() {
            return None;
        }
        let (mut taken, mut rest, mut left) = (Vec::new(), Vec::new(), n);
        for &(s, e) in &self.0 {
            if left == 0 {
                rest.push((s, e));
            } else if e - s <= left {
                taken.push((s, e));
                left -= e - s;
            } else {
                taken.push((s, s + left));
                rest.push((s + left, e));
                left = 0;
            }
        }
        Some((Ranges(taken), Ranges(rest)))
    }

    /// Whether no atom is in both.
    pub fn is_disjoint(&self, other: &Ranges) -> bool {
        let (mut i, mut j) = (0, 0);
        while i < self.0.len() && j < other.0.len() {
            let (a, b) = (self.0[i], other.0[j]);
            if a.0 < b.1 && b.0 < a.1 {
                return false;
            }
            if a.1 <= b.1 {
                i += 1;
            } else {
                j += 1;
            }
        }
        true
    }

    /// The union of two disjoint sets; `None` when they share an atom.
    ///
    /// One merge of the two sorted lists, linear in their lengths: a branch unions a
    /// remainder into a credit's available atoms at every settle, and with many operations
    /// in flight those atoms are in as many pieces.
    pub fn union(&self, other: &Ranges) -> Option<Ranges> {
        let (a, b) = (&self.0, &other.0);
        let mut out: Vec<(u64, u64)> = Vec::with_capacity(a.len() + b.len());
        let (mut i, mut j) = (0, 0);
        while i < a.len() || j < b.len() {
            let next = match (a.get(i), b.get(j)) {
                (Some(&x), Some(&y)) if x.0 <= y.0 => {
                    i += 1;
                    x
                }
                (_, Some(&y)) => {
                    j += 1;
                    y
                }
                (Some(&x), None) => {
                    i += 1;
                    x
                }
                (None, None) => break,
            };
            match out.last_mut() {
                Some(last) if next.0 < last.1 => return None,
                Some(last) if next.0 == last.1 => last.1 = next.1,
                _ => out.push(next),
            }
        }
        Some(Ranges(out))
    }

    /// `self` without `other`; `None` unless `other ⊆ self`.
    pub fn subtract(&self, other: &Ranges) -> Option<Ranges> {
        let mut out = Vec::new();
        let mut j = 0;
        let mut covered = 0u64;
        for &(s, e) in &self.0 {
            let mut cur = s;
            while j < other.0.len() && other.0[j].0 < e {
                let (os, oe) = other.0[j];
                if os < cur || oe > e {
                    return None;
                }
                if os > cur {
                    out.push((cur, os));
                }
                covered += oe - os;
                cur = oe;
                j += 1;
            }
            if cur < e {
                out.push((cur, e));
            }
        }
        (j == other.0.len() && covered == other.len()).then_some(Ranges(out))
    }
}

impl fmt::Debug for Ranges {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_list()
            .entries(self.0.iter().map(|(s, e)| s..e))
            .finish()
    }
}

impl<'de> Deserialize<'de> for Ranges {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let v = Vec::<(u64, u64)>::deserialize(d)?;
        if v.len() > MAX_RANGES {
            return Err(de::Error::custom("too many ranges"));
        }
        let canonical = v.windows(2).all(|w| w[0].1 < w[1].0) && v.iter().all(|&(s, e)| s < e);
        if !canonical {
            return Err(de::Error::custom(
                "ranges must be non-empty, sorted, disjoint and non-adjacent",
            ));
        }
        Ok(Ranges(v))
    }
}

/// Atoms per dimension: the exact rights a credit, transfer or operation owns.
#[derive(Clone, PartialEq, Eq, Hash, Default, Serialize)]
pub struct Footprint(BTreeMap<Dim, Ranges>);

impl Footprint {
    /// All atoms of a root with budget `b`: `[0, b[d])` per dimension.
    pub fn full(b: &Vector) -> Self {
        Self(
            b.iter()
                .map(|(d, n)| (d.clone(), Ranges::upto(n)))
                .collect(),
        )
    }

    /// From per-dimension ranges, without the wire's range limit (a stored checkpoint's
    /// credit may hold more than [`MAX_RANGES`] ranges). Empty dimensions are dropped;
    /// `None` when a dimension appears twice.
    pub fn from_dims(dims: impl IntoIterator<Item = (Dim, Ranges)>) -> Option<Self> {
        let mut map = BTreeMap::new();
        for (d, r) in dims {
            if r.is_empty() {
                continue;
            }
            if map.insert(d, r).is_some() {
                return None;
            }
        }
        Some(Self(map))
    }

    /// The atoms of one dimension.
    pub fn dim(&self, d: &Dim) -> Option<&Ranges> {
        self.0.get(d)
    }

    /// Dimensions with atoms.
    pub fn iter(&self) -> impl Iterator<Item = (&Dim, &Ranges)> {
        self.0.iter()
    }

    /// The size of each dimension.
    pub fn size(&self) -> Vector {
        let mut v = Vector::zero();
        for (d, r) in &self.0 {
            v.insert(d.clone(), r.len());
        }
        v
    }

    /// Whether there is no atom.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// Splits off the lowest `amount` atoms of each dimension: `(taken, rest)`.
    pub fn take(&self, amount: &Vector) -> Option<(Footprint, Footprint)> {
        let (mut taken, mut rest) = (BTreeMap::new(), self.0.clone());
        for (d, n) in amount.iter() {
            let (t, r) = self.0.get(d)?.take_lowest(n)?;
            taken.insert(d.clone(), t);
            if r.is_empty() {
                rest.remove(d);
            } else {
                rest.insert(d.clone(), r);
            }
        }
        Some((Footprint(taken), Footprint(rest)))
    }

    /// Whether no atom is in both.
    pub fn is_disjoint(&self, other: &Footprint) -> bool {
        self.0
            .iter()
            .all(|(d, r)| other.0.get(d).is_none_or(|o| r.is_disjoint(o)))
    }

    /// The union of two disjoint footprints; `None` when they share an atom.
    pub fn union(&self, other: &Footprint) -> Option<Footprint> {
        let mut out = self.0.clone();
        for (d, r) in &other.0 {
            let merged = match out.get(d) {
                Some(mine) => mine.union(r)?,
                None => r.clone(),
            };
            out.insert(d.clone(), merged);
        }
        Some(Footprint(out))
    }

    /// The union of many pairwise disjoint footprints in one merge per dimension (a sort of
    /// all their ranges), where folding [`union`](Self::union) over them would copy the
    /// growing result once per part; `None` when two share an atom.
    pub fn union_all<'a>(parts: impl IntoIterator<Item = &'a Footprint>) -> Option<Footprint> {
        let mut dims: BTreeMap<Dim, Vec<(u64, u64)>> = BTreeMap::new();
        for part in parts {
            for (d, r) in &part.0 {
                dims.entry(d.clone()).or_default().extend_from_slice(&r.0);
            }
        }
        let mut out = BTreeMap::new();
        for (d, v) in dims {
            let r = Ranges::from_ranges(v)?;
            if !r.is_empty() {
                out.insert(d, r);
            }
        }
        Some(Footprint(out))
    }

    /// Appends `other`'s ranges without checking disjointness or merging — atoms in both
    /// are then counted twice. Only the `JoinWithoutDisjointness` simulation mutant uses it.
    #[doc(hidden)]
    pub fn concat_unchecked(&self, other: &Footprint) -> Footprint {
        let mut out = self.0.clone();
        for (d, r) in &other.0 {
            let e = out.entry(d.clone()).or_default();
            e.0.extend_from_slice(&r.0);
            e.0.sort_unstable();
        }
        Footprint(out)
    }

    /// `self` without `other`; `None` unless `other ⊆ self`.
    pub fn subtract(&self, other: &Footprint) -> Option<Footprint> {
        let mut out = self.0.clone();
        for (d, r) in &other.0 {
            let left = out.get(d)?.subtract(r)?;
            if left.is_empty() {
                out.remove(d);
            } else {
                out.insert(d.clone(), left);
            }
        }
        Some(Footprint(out))
    }
}

impl fmt::Debug for Footprint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_map().entries(self.0.iter()).finish()
    }
}

impl<'de> Deserialize<'de> for Footprint {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let map = BTreeMap::<Dim, Ranges>::deserialize(d)?;
        if map.len() > MAX_DIMS {
            return Err(de::Error::custom("too many dimensions"));
        }
        if map.values().any(Ranges::is_empty) {
            return Err(de::Error::custom("empty dimension in a footprint"));
        }
        Ok(Footprint(map))
    }
}

/// What a credit may be spent on: a set of purposes. Delegation attenuates: a child's label
/// is a subset of its parent's. The empty label allows nothing.
#[derive(Clone, PartialEq, Eq, Hash, Default, Debug, Serialize, Deserialize)]
pub struct Label(pub BTreeSet<Dim>);

impl Label {
    /// A label of purposes.
    pub fn of(purposes: &[&str]) -> Result<Self, WireError> {
        purposes
            .iter()
            .map(|p| Dim::new(*p))
            .collect::<Result<_, _>>()
            .map(Label)
    }

    /// Whether `self` is an attenuation of `parent` (a subset).
    pub fn within(&self, parent: &Label) -> bool {
        self.0.is_subset(&parent.0)
    }

    /// Whether `purpose` is allowed.
    pub fn allows(&self, purpose: &Dim) -> bool {
        self.0.contains(purpose)
    }
}
