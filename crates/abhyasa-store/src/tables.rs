//! Every table of the store, declared once. The layout is documented in `docs/STORE.md`.
//!
//! Obligation ids are `u128` keys (big-endian meaning, stored little-endian by redb); agent
//! ids, scopes, weight keys and token ids are `&str`; rows that carry wire objects hold their
//! deterministic CBOR.

use redb::TableDefinition;

/// A governed table: (key kind, party, name) → (sequence, obligation in force, kind state).
pub(crate) type Governed<'a> =
    TableDefinition<'a, (u8, &'static str, &'static str), crate::rows::GovernedValue<'static>>;

/// Store metadata: `schema` (the layout version).
pub(crate) const META: TableDefinition<'_, &str, u64> = TableDefinition::new("meta");

// Custodian ------------------------------------------------------------------------------------

/// The write-ahead pending set: id → CBOR [`crate::rows::PendingRow`].
pub(crate) const PENDING: TableDefinition<'_, u128, &[u8]> =
    TableDefinition::new("custodian.pending");
/// Terminal records, for audit: id → CBOR `TerminalRecord`.
pub(crate) const TERMINAL: TableDefinition<'_, u128, &[u8]> =
    TableDefinition::new("custodian.terminal");
/// Terminal records by time, for retention: (at, id) → ().
pub(crate) const TERMINAL_BY_TIME: TableDefinition<'_, (u64, u128), ()> =
    TableDefinition::new("custodian.terminal_by_time");
/// The escalation log: id → CBOR `Escalation`.
pub(crate) const ESCALATIONS: TableDefinition<'_, u128, &[u8]> =
    TableDefinition::new("custodian.escalations");
/// Escalations by time, for recovery of the recent ones and retention: (at, id) → ().
pub(crate) const ESCALATIONS_BY_TIME: TableDefinition<'_, (u64, u128), ()> =
    TableDefinition::new("custodian.escalations_by_time");
/// Reconciliation notes: id → CBOR `ReconciliationNote`.
pub(crate) const NOTES: TableDefinition<'_, u128, &[u8]> = TableDefinition::new("custodian.notes");

// Principal side -------------------------------------------------------------------------------

/// The principal's state per governed key: (key kind, target, name) → (the issuance sequence
/// of the decision in force, the obligation that carried it, the kind's own state as CBOR
/// [`crate::rows::KindState`], empty for none). A consent scope keeps its authorization here:
/// withheld or open, and an open grant's lease. A token's revocation is kept per token, under
/// the empty party: the principal honours it from no one. (Layout 2; layout 1 kept the same in
/// five tables, [`layout1`].)
pub(crate) const PRINCIPAL_GOVERNED: Governed<'_> = TableDefinition::new("principal.governed");
/// Base routing weights (after folding): (target, weight key) → millionths.
pub(crate) const ROUTING_BASE: TableDefinition<'_, (&str, &str), i64> =
    TableDefinition::new("principal.routing_base");
/// Keyed down-weights not yet folded: obligation id → (target, weight key, amount, fold_after).
pub(crate) const ADJUSTMENTS: TableDefinition<'_, u128, (&str, &str, u32, u64)> =
    TableDefinition::new("principal.adjustments");

/// When each keyed down-weight lapses (its belief update's `created_at + ttl_ms`): obligation
/// id → time. An adjustment with no row here never lapses and folds at `fold_after`.
pub(crate) const ADJUSTMENT_LAPSES: TableDefinition<'_, u128, u64> =
    TableDefinition::new("principal.adjustment_lapses");

// Receiver -------------------------------------------------------------------------------------

/// The receiver's state per governed key: (key kind, issuer, name) → (the last applied
/// sequence, the obligation last applied on the key, the kind's own state as CBOR
/// [`crate::rows::KindState`], empty for none). A consent scope keeps here whether it is
/// withheld and the lease of a granted one; a token's record (dropped or cached, its expiry,
/// the issuers that acted on it) is kept per token, under the empty party. An apply writes
/// its key's row (and a token's record) where layout 1 wrote up to four tables ([`layout1`]).
pub(crate) const RECV_GOVERNED: Governed<'_> = TableDefinition::new("receiver.governed");
/// The applied-id ledger: id → expires (deadline + skew, unix ms).
pub(crate) const APPLIED: TableDefinition<'_, u128, u64> = TableDefinition::new("receiver.applied");
/// Applied ids by expiry, for pruning: (expires, id) → ().
pub(crate) const APPLIED_BY_EXPIRY: TableDefinition<'_, (u64, u128), ()> =
    TableDefinition::new("receiver.applied_by_expiry");
/// Preference weights: (issuer, weight key) → millionths.
pub(crate) const RECV_WEIGHTS: TableDefinition<'_, (&str, &str), i64> =
    TableDefinition::new("receiver.weights");

/// Belief updates' weight changes the agent holds: obligation id → (issuer, weight key, delta
/// in millionths, when it lapses). A change counts until it lapses; maintenance deletes it
/// after. (`receiver.weights` holds only weights a store kept before changes lapsed.)
pub(crate) const RECV_WEIGHT_CHANGES: TableDefinition<'_, u128, (&str, &str, i32, u64)> =
    TableDefinition::new("receiver.weight_changes");
/// The apply log: (id, n) → (applied at, CBOR obligation), one row per apply: `n` counts
/// earlier applies of the same id, so a second apply (a bug) shows as n = 1. Pruned with
/// the applied id. (Added after layout 1 was first written: absent reads as empty.)
pub(crate) const RECV_APPLY_LOG: TableDefinition<'_, (u128, u32), (u64, &[u8])> =
    TableDefinition::new("receiver.apply_log");

// Ledger ---------------------------------------------------------------------------------------

/// The branch's ledger journal: sequence → CBOR `abhyasa_ledger::Step`. Append-only; the
/// branch state (credits, transfers and their outbox, operations and their evidence) is the
/// replay of it.
pub(crate) const LEDGER_JOURNAL: TableDefinition<'_, u64, &[u8]> =
    TableDefinition::new("ledger.journal");
/// The branch's latest checkpoint: key 0 → CBOR `SignedRecord` (the body of an
/// `abhyasa_ledger::Step::Checkpoint`). Writing one deletes the journal rows before it in the
/// same commit; the journal is then `[checkpoint, rows …]`. (Added after layout 1 was first
/// written: absent reads as no checkpoint.)
pub(crate) const LEDGER_CHECKPOINT: TableDefinition<'_, u64, &[u8]> =
    TableDefinition::new("ledger.checkpoint");
/// The gateway's latest checkpoint: key 0 → CBOR `SignedRecord` (the body of an
/// `abhyasa_ledger::GatewayRecord::Checkpoint`). Writing one deletes the log rows before it
/// in the same commit. (Added after layout 1 was first written: absent reads as none.)
pub(crate) const GATEWAY_CHECKPOINT: TableDefinition<'_, u64, &[u8]> =
    TableDefinition::new("gateway.checkpoint");
/// The gateway's acceptance log: sequence → CBOR `abhyasa_ledger::GatewayRecord`
/// (first acceptances, receipts, fences). Append-only.
pub(crate) const GATEWAY_LOG: TableDefinition<'_, u64, &[u8]> = TableDefinition::new("gateway.log");

// Operator events ------------------------------------------------------------------------------

/// The operator's outbox: sequence → CBOR `events::OutboxRow` (key, time, event). Rows leave
/// when every sink took them. (Added after layout 1 was first written: absent reads as
/// empty.)
pub(crate) const EVENTS_OUTBOX: TableDefinition<'_, u64, &[u8]> =
    TableDefinition::new("events.outbox");
/// The key of every event recorded within the retention: key → recorded at. An event whose
/// key is here is not recorded again.
pub(crate) const EVENT_KEYS: TableDefinition<'_, &str, u64> = TableDefinition::new("events.keys");
/// The same keys by time, for retention: (recorded at, key) → ().
pub(crate) const EVENT_KEYS_BY_TIME: TableDefinition<'_, (u64, &str), ()> =
    TableDefinition::new("events.keys_by_time");
/// `meta` row holding the outbox's next sequence (never reused, even when the outbox
/// empties).
pub(crate) const EVENTS_NEXT_SEQ: &str = "events.next_seq";

/// The layout version written in `meta.schema`. A file of layout 1 is converted when opened
/// ([`layout1`]).
pub(crate) const SCHEMA_VERSION: u64 = 2;

/// The tables of layout 1 that layout 2 folded into `principal.governed` and
/// `receiver.governed`: read once, when a layout-1 file is opened, and deleted in the same
/// transaction.
pub(crate) mod layout1 {
    use redb::{TableDefinition, TableHandle};

    /// The names of the tables below: what the conversion deletes.
    pub(crate) fn names() -> [&'static str; 12] {
        [
            AUTHORIZATIONS.name(),
            AUTHORIZATION_BY.name(),
            AUTHORIZATION_UNTIL.name(),
            LAST_SEQUENCE.name(),
            RECV_WITHHELD.name(),
            RECV_LEASES.name(),
            GOVERNED_BY.name(),
            REVOKED_TOKENS.name(),
            REVOKED_TOKENS_BY_EXPIRY.name(),
            TOKEN_REVOKED_BY.name(),
            RECV_TOKENS.name(),
            RECV_TOKENS_BY_EXPIRY.name(),
        ]
    }

    /// Authorizations: (target, scope) → (withheld, sequence).
    pub(crate) const AUTHORIZATIONS: TableDefinition<'_, (&str, &str), (bool, Option<u64>)> =
        TableDefinition::new("principal.authorizations");
    /// The obligation that carried the authorization in force: (target, scope) → obligation id.
    /// (Added after layout 1 was first written: absent reads as "not named".)
    pub(crate) const AUTHORIZATION_BY: TableDefinition<'_, (&str, &str), u128> =
        TableDefinition::new("principal.authorization_by");
    /// The lease of each open grant: (target, scope) → the unix ms at which it ends. A grant
    /// without a row has no lease. (Added after layout 1 was first written: absent reads as
    /// "no leases".)
    pub(crate) const AUTHORIZATION_UNTIL: TableDefinition<'_, (&str, &str), u64> =
        TableDefinition::new("principal.authorization_until");
    /// Last applied sequence per governed key: (key kind, issuer, name) → sequence.
    pub(crate) const LAST_SEQUENCE: TableDefinition<'_, (u8, &str, &str), u64> =
        TableDefinition::new("receiver.last_sequence");
    /// Scopes the receiver stopped exercising: (issuer, scope) → ().
    pub(crate) const RECV_WITHHELD: TableDefinition<'_, (&str, &str), ()> =
        TableDefinition::new("receiver.withheld");
    /// The lease of each granted scope that lapses: (issuer, scope) → the unix ms at which it
    /// ends. (Added after layout 1 was first written: absent reads as "no leases".)
    pub(crate) const RECV_LEASES: TableDefinition<'_, (&str, &str), u64> =
        TableDefinition::new("receiver.leases");
    /// The obligation last applied on each governed key: (key kind, issuer, name) → id. What a
    /// governed tool names when it refuses a call. (Added after layout 1 was first written: a
    /// file without it reads as "none recorded".)
    pub(crate) const GOVERNED_BY: TableDefinition<'_, (u8, &str, &str), u128> =
        TableDefinition::new("receiver.governed_by");
    /// Tokens the principal no longer honours: token id → ().
    pub(crate) const REVOKED_TOKENS: TableDefinition<'_, &str, ()> =
        TableDefinition::new("principal.revoked_tokens");
    /// The revoked tokens that expire, by their own expiry: (expires, token id) → (). A token
    /// without a row is kept for good. (Added after layout 1 was first written: absent reads as
    /// "none expire".)
    pub(crate) const REVOKED_TOKENS_BY_EXPIRY: TableDefinition<'_, (u64, &str), ()> =
        TableDefinition::new("principal.revoked_tokens_by_expiry");
    /// The obligation that revoked each token most recently: token id → obligation id. (Added
    /// after layout 1 was first written: absent reads as "not named".)
    pub(crate) const TOKEN_REVOKED_BY: TableDefinition<'_, &str, u128> =
        TableDefinition::new("principal.token_revoked_by");
    /// Tokens: token id → dropped (`true`) or cached (`false`).
    pub(crate) const RECV_TOKENS: TableDefinition<'_, &str, bool> =
        TableDefinition::new("receiver.tokens");
    /// The token records that expire, by the token's own expiry: (expires, token id, issuer) →
    /// (); the issuer names the governed-by row forgotten with the record. A token without a row
    /// is kept for good. (Added after layout 1 was first written: absent reads as "none expire".)
    pub(crate) const RECV_TOKENS_BY_EXPIRY: TableDefinition<'_, (u64, &str, &str), ()> =
        TableDefinition::new("receiver.tokens_by_expiry");
}
