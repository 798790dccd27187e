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

/// The key kind of a consent scope in a governed key.
pub(crate) const SCOPE: u8 = 0;
/// The key kind of a preference weight.
pub(crate) const WEIGHT: u8 = 1;
/// The key kind of a token.
pub(crate) const TOKEN: u8 = 2;

/// A governed key as a redb key: (kind, issuer, name).
pub(crate) fn governed_key(key: &GovernedKey) -> (u8, &str, &str) {
    match key {
        GovernedKey::Scope(issuer, scope) => (SCOPE, issuer.as_str(), scope.as_str()),
        GovernedKey::Weight(issuer, weight) => (WEIGHT, issuer.as_str(), weight.as_str()),
        GovernedKey::Token(issuer, token) => (TOKEN, issuer.as_str(), token.as_str()),
    }
}

/// Parses a governed key back; `None` for a row no build of this layout writes.
pub(crate) fn parse_governed_key(kind: u8, issuer: &str, name: &str) -> Option<GovernedKey> {
    let issuer = AgentId::new(issuer).ok()?;
    Some(match kind {
        SCOPE => GovernedKey::Scope(issuer, Scope::new(name).ok()?),
        WEIGHT => GovernedKey::Weight(issuer, WeightKey::new(name).ok()?),
        TOKEN => GovernedKey::Token(issuer, TokenId::new(name).ok()?),
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

/// The kind's own state in a `principal.governed` or `receiver.governed` row: what the key's
/// kind keeps beside the sequence and the obligation in force. A kind that keeps nothing there
/// writes no bytes. State a kind keeps per name rather than per party (a token is revoked or
/// dropped for everyone) sits in the row whose party is empty ([`NO_PARTY`]).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "snake_case")]
pub(crate) enum KindState {
    /// A consent scope: withheld or not, and when the grant in force ends.
    Scope {
        /// The scope is withheld (the principal does not permit it; the agent stopped
        /// exercising it).
        withheld: bool,
        /// The lease of the grant in force (unix ms), if it has one.
        until: Option<u64>,
    },
    /// The principal's revocation of a token (party empty): it honours the token from no one
    /// until `until` (unix ms; for good when `None`), after which maintenance deletes the row.
    RevokedToken {
        /// The token's own expiry, if the revocation named one.
        until: Option<u64>,
    },
    /// The agent's record of a token (party empty): dropped or cached, until when, and every
    /// issuer that acted on it, whose governed rows go with the record at its expiry.
    Token {
        /// Dropped (`true`) or cached.
        dropped: bool,
        /// The token's expiry (for good when `None`).
        until: Option<u64>,
        /// The issuers whose `(token kind, issuer, token)` rows are deleted with the record.
        issuers: Vec<String>,
    },
}

/// The party of a governed row that holds what a kind keeps per name, not per party.
pub(crate) const NO_PARTY: &str = "";

/// One governed row, decoded: (sequence, obligation in force, the kind's state).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct GovernedRow {
    pub(crate) sequence: Option<u64>,
    pub(crate) by: Option<u128>,
    pub(crate) state: Option<KindState>,
}

/// The value type of a governed table.
pub(crate) type GovernedValue<'a> = (Option<u64>, Option<u128>, &'a [u8]);

impl GovernedRow {
    /// Decodes a row's value; `table` and `key` name it on failure.
    pub(crate) fn decode(
        table: &'static str,
        key: (u8, &str, &str),
        (sequence, by, state): GovernedValue<'_>,
    ) -> Result<Self, StoreError> {
        let state = match state {
            [] => None,
            bytes => Some(
                abhyasa_wire::decode(bytes).map_err(|e| StoreError::Corrupt {
                    table,
                    key: format!("{}/{}/{}", key.0, key.1, key.2),
                    detail: e.to_string(),
                })?,
            ),
        };
        Ok(Self {
            sequence,
            by,
            state,
        })
    }

    /// The kind state's bytes (empty for none).
    pub(crate) fn state_bytes(&self) -> Vec<u8> {
        self.state
            .as_ref()
            .map(abhyasa_wire::encode)
            .unwrap_or_default()
    }

    /// Reads the row at `key` in `table` (the default when there is none).
    pub(crate) fn read<T>(
        table: &T,
        name: &'static str,
        key: (u8, &str, &str),
    ) -> Result<Self, StoreError>
    where
        T: redb::ReadableTable<(u8, &'static str, &'static str), GovernedValue<'static>>,
    {
        match table.get(key)? {
            Some(v) => Self::decode(name, key, v.value()),
            None => Ok(Self::default()),
        }
    }

    /// Writes the row at `key` in `table`.
    pub(crate) fn write(
        &self,
        table: &mut redb::Table<'_, (u8, &'static str, &'static str), GovernedValue<'static>>,
        key: (u8, &str, &str),
    ) -> Result<(), StoreError> {
        table.insert(key, (self.sequence, self.by, self.state_bytes().as_slice()))?;
        Ok(())
    }
}
