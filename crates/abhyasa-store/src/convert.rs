//! Converting a file of layout 1 to layout 2, inside the transaction that opens it.
//!
//! Layout 2 keeps each governed key's state in one row per side (`principal.governed`,
//! `receiver.governed`), and a token's state in one row per token, where layout 1 spread them
//! over twelve tables. The conversion reads those tables, writes the rows, and deletes the
//! tables; the caller sets `meta.schema` in the same transaction, so a crash leaves the file either as it was or converted. Tables added
//! after layout 1 was first written may be missing: absent reads as empty, as it did.

use std::collections::BTreeMap;

use redb::{ReadableTable, TableDefinition, TableHandle, WriteTransaction};

use crate::rows::{GovernedRow, KindState, NO_PARTY, SCOPE, TOKEN};
use crate::tables::{layout1, Governed, PRINCIPAL_GOVERNED, RECV_GOVERNED};
use crate::StoreError;

/// A governed key as owned strings: (kind, party, name).
type Key = (u8, String, String);

/// Converts the layout-1 tables in `txn` to the layout-2 rows and deletes them.
pub(crate) fn layout1_to_2(txn: &WriteTransaction) -> Result<(), StoreError> {
    let mut principal: BTreeMap<Key, GovernedRow> = BTreeMap::new();
    let scope = |(target, scope): (&str, &str)| (SCOPE, target.to_owned(), scope.to_owned());
    let leases: BTreeMap<Key, u64> = read(txn, layout1::AUTHORIZATION_UNTIL, |k, v| (scope(k), v))?
        .into_iter()
        .collect();
    for (key, (withheld, sequence)) in read(txn, layout1::AUTHORIZATIONS, |k, v| (scope(k), v))? {
        let until = (!withheld).then(|| leases.get(&key).copied()).flatten();
        let row = principal.entry(key).or_default();
        row.state = Some(KindState::Scope { withheld, until });
        row.sequence = sequence;
    }
    for (key, by) in read(txn, layout1::AUTHORIZATION_BY, |k, v| (scope(k), v))? {
        principal.entry(key).or_default().by = Some(by);
    }

    let mut receiver: BTreeMap<Key, GovernedRow> = BTreeMap::new();
    let governed =
        |(kind, issuer, name): (u8, &str, &str)| (kind, issuer.to_owned(), name.to_owned());
    for (key, seq) in read(txn, layout1::LAST_SEQUENCE, |k, v| (governed(k), v))? {
        receiver.entry(key).or_default().sequence = Some(seq);
    }
    for (key, by) in read(txn, layout1::GOVERNED_BY, |k, v| (governed(k), v))? {
        receiver.entry(key).or_default().by = Some(by);
    }
    let withheld: BTreeMap<Key, ()> = read(txn, layout1::RECV_WITHHELD, |k, v| (scope(k), v))?
        .into_iter()
        .collect();
    let held: BTreeMap<Key, u64> = read(txn, layout1::RECV_LEASES, |k, v| (scope(k), v))?
        .into_iter()
        .collect();
    let scopes: Vec<Key> = withheld.keys().chain(held.keys()).cloned().collect();
    for key in scopes {
        let state = KindState::Scope {
            withheld: withheld.contains_key(&key),
            until: held.get(&key).copied(),
        };
        receiver.entry(key).or_default().state = Some(state);
    }

    // A token's state is kept per token, under no party.
    let token = |name: &str| (TOKEN, NO_PARTY.to_owned(), name.to_owned());
    let expiries: BTreeMap<Key, u64> =
        read(txn, layout1::REVOKED_TOKENS_BY_EXPIRY, |(at, t), ()| {
            (token(t), at)
        })?
        .into_iter()
        .collect();
    let revoked_by: BTreeMap<Key, u128> =
        read(txn, layout1::TOKEN_REVOKED_BY, |t, by| (token(t), by))?
            .into_iter()
            .collect();
    for (key, ()) in read(txn, layout1::REVOKED_TOKENS, |t, ()| (token(t), ()))? {
        let row = principal.entry(key.clone()).or_default();
        row.by = revoked_by.get(&key).copied();
        row.state = Some(KindState::RevokedToken {
            until: expiries.get(&key).copied(),
        });
    }
    // The agent's expiry index named, per token, its expiry (a row at `u64::MAX`: kept for
    // good) and the issuers that acted on it.
    let mut index: BTreeMap<Key, (Option<u64>, Vec<String>)> = BTreeMap::new();
    let rows = read(
        txn,
        layout1::RECV_TOKENS_BY_EXPIRY,
        |(at, t, issuer), ()| (token(t), (at, issuer.to_owned())),
    )?;
    for (key, (at, issuer)) in rows {
        let (until, issuers) = index.entry(key).or_default();
        if at != u64::MAX {
            *until = Some(until.map_or(at, |u| u.max(at)));
        }
        if !issuers.contains(&issuer) {
            issuers.push(issuer);
        }
    }
    for (key, dropped) in read(txn, layout1::RECV_TOKENS, |t, d| (token(t), d))? {
        let (until, issuers) = index.remove(&key).unwrap_or_default();
        receiver.entry(key).or_default().state = Some(KindState::Token {
            dropped,
            until,
            issuers,
        });
    }

    write(txn, PRINCIPAL_GOVERNED, &principal)?;
    write(txn, RECV_GOVERNED, &receiver)?;
    let names = layout1::names();
    let old: Vec<_> = txn
        .list_tables()?
        .filter(|t| names.contains(&t.name()))
        .collect();
    for table in old {
        txn.delete_table(table)?;
    }
    Ok(())
}

/// Every row of a layout-1 table in key order, mapped to an owned key and value; none when
/// the table is absent (it was added after some files were written).
fn read<K, V, T>(
    txn: &WriteTransaction,
    def: TableDefinition<'_, K, V>,
    map: impl Fn(K::SelfType<'_>, V::SelfType<'_>) -> (Key, T),
) -> Result<Vec<(Key, T)>, StoreError>
where
    K: redb::Key + 'static,
    V: redb::Value + 'static,
{
    let exists = txn.list_tables()?.any(|t| t.name() == def.name());
    let mut out = Vec::new();
    if !exists {
        return Ok(out);
    }
    let table = txn.open_table(def)?;
    for row in table.iter()? {
        let (k, v) = row?;
        out.push(map(k.value(), v.value()));
    }
    Ok(out)
}

fn write(
    txn: &WriteTransaction,
    def: Governed<'_>,
    rows: &BTreeMap<Key, GovernedRow>,
) -> Result<(), StoreError> {
    let mut table = txn.open_table(def)?;
    for ((kind, party, name), row) in rows {
        row.write(&mut table, (*kind, party.as_str(), name.as_str()))?;
    }
    Ok(())
}
