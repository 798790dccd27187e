//! Row encodings that are not plain redb types.

use abhyasa_custody::{GovernedKey, PendingRecord};
use abhyasa_wire::{AgentId, LastObserved, Obligation, Scope, TokenId, WeightKey};
use serde::{Deserialize, Serialize};

use crate::StoreError;

/// A pending-set row.
#[derive(Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct PendingRow {
    pub(crate) obligation: Obligation,
    pub(crate) attempts: u32,
    pub(crate) last_observed: LastObserved,
}

impl From<PendingRow> for PendingRecord {
    fn from(row: PendingRow) -> Self {
        PendingRecord {
            obligation: row.obligation,
            attempts: row.attempts,
            last_observed: row.last_observed,
        }
    }
}

/// Decodes a CBOR row, naming the table on failure.
pub(crate) fn decode<T: serde::de::DeserializeOwned>(
    table: &'static str,
    key: u128,
    bytes: &[u8],
) -> Result<T, StoreError> {
    abhyasa_wire::decode(bytes).map_err(|e| StoreError::Corrupt {
        table,
        key: format!("{key:032x}"),
        detail: e.to_string(),
    })
}

/// A governed key as a redb key: (kind, issuer, name).
pub(crate) fn governed_key(key: &GovernedKey) -> (u8, &str, &str) {
    match key {
        GovernedKey::Scope(issuer, scope) => (0, issuer.as_str(), scope.as_str()),
        GovernedKey::Weight(issuer, weight) => (1, issuer.as_str(), weight.as_str()),
        GovernedKey::Token(issuer, token) => (2, issuer.as_str(), token.as_str()),
    }
}

/// Parses a governed key back; `None` for a row no build of this layout writes.
pub(crate) fn parse_governed_key(kind: u8, issuer: &str, name: &str) -> Option<GovernedKey> {
    let issuer = AgentId::new(issuer).ok()?;
    Some(match kind {
        0 => GovernedKey::Scope(issuer, Scope::new(name).ok()?),
        1 => GovernedKey::Weight(issuer, WeightKey::new(name).ok()?),
        2 => GovernedKey::Token(issuer, TokenId::new(name).ok()?),
        _ => return None,
    })
}

/// Parses a name stored as a key, naming the table on failure.
pub(crate) fn name<T, E: std::fmt::Display>(
    table: &'static str,
    raw: &str,
    parse: impl FnOnce(String) -> Result<T, E>,
) -> Result<T, StoreError> {
    parse(raw.to_owned()).map_err(|e| StoreError::Corrupt {
        table,
        key: raw.to_owned(),
        detail: e.to_string(),
    })
}
