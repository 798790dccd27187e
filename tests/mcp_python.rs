//! The Python MCP SDK (`mcp` 2.x) drives `abhyasa mcp --stdio` and `abhyasa mcp --http`
//! (streamable HTTP): `tests/mcp/client.py` makes every check over each transport (tools
//! listed, acks on results, a revocation riding a call refusing it, a revoked token, a
//! malformed envelope refused with nothing applied, no double apply, and a budget-gated tool:
//! refused without a permit, run once with one, a replay answered with the same receipt).
//!
//! The permits come from a real ledger branch here, signed with the principal's certificate key
//! from the same certificates directory, over a root grant signed by the issuer's; the
//! receipts the Python client got back settle that branch, and the amounts are checked
//! against figures written out here.
//!
//! It needs a Python with the SDK: `ABHYASA_MCP_PYTHON=/path/to/venv/bin/python` (`.ci/run`
//! creates one with a pinned `mcp`). Without it the test says plainly that it skipped.

use std::path::Path;

use abhyasa::ledger::{
    Branch, BranchConfig, CreditId, Dim, Keyring, Label, LedgerMessage, LedgerSigningKey, OpKey,
    OpState, Permit, RootGrant, RootId, Signed, Vector,
};
use abhyasa::mcp::{permit_to_meta, receipt_from_meta, tool_effect, ToolBudget, META_RECEIPT};
use abhyasa::moq::{Identity, Signer};
use abhyasa::wire::{AgentId, UnixMillis};
use serde_json::{json, Map, Value};

mod common;

fn id(s: &str) -> AgentId {
    AgentId::new(s).unwrap()
}

fn cents(n: u64) -> Vector {
    Vector::of(&[("cents", n)]).unwrap()
}

/// `name`'s ledger signing key: its certificate's key, `<certs>/<name>.key`.
fn key_file(certs: &Path, name: &str) -> LedgerSigningKey {
    let identity = Identity::load(certs, &id(name)).unwrap();
    Signer::new(&identity).unwrap().key().clone()
}

fn settle_persists(b: &mut Branch) {
    while let Some((t, _)) = b.poll_persist() {
        b.handle_persisted(t);
    }
}

const ROOT: RootId = RootId::from_u128(9);
/// The wall clock, as the node's gateway reads it.
fn wall_clock() -> UnixMillis {
    let since = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap();
    UnixMillis(since.as_millis() as u64)
}

const CREDIT: CreditId = CreditId::from_u128(1);

/// The tool `book` of the script's config: 25 cents for travel.
fn budget() -> ToolBudget {
    ToolBudget {
        purpose: Dim::new("travel").unwrap(),
        max_cost: cents(25),
    }
}

#[test]
fn the_python_mcp_sdk_drives_the_stdio_server() {
    let dir = tempfile::tempdir().unwrap();
    let certs = dir.path().join("certs");
    let certs_s = certs.to_str().unwrap();
    assert!(common::abhyasa(&["certs", "init", "--dir", certs_s])
        .status
        .success());
    for a in ["principal", "agent-1"] {
        assert!(common::abhyasa(&["certs", "issue", a, "--dir", certs_s])
            .status
            .success());
    }
    // The principal's branch: a root grant of 100 cents for travel, then one reservation per
    // transport (each transport's server has its own state, so its own first run).
    let keys = Keyring::new(
        ["issuer", "principal", "agent-1"].map(|n| (id(n), key_file(&certs, n).verifying_key())),
    )
    .with_issuers([id("issuer")]);
    // Permits that expire in an hour of real time: the node's gateway forgets settled
    // acceptances (`gateway_retain_ms`), so it takes only permits that expire.
    let mut b = Branch::new(
        id("principal"),
        key_file(&certs, "principal"),
        keys,
        BranchConfig {
            permit_ttl_ms: 3_600_000,
            ..BranchConfig::default()
        },
    );
    let grant = RootGrant {
        root: ROOT,
        issuer: id("issuer"),
        holder: id("principal"),
        budget: cents(100),
        label: Label::of(&["travel"]).unwrap(),
        issued_at: UnixMillis(0),
    };
    b.grant(
        Signed::sign(&grant, &grant.issuer, &key_file(&certs, "issuer")),
        CREDIT,
    )
    .unwrap();
    let args: Map<String, Value> = json!({"to": "LHR"}).as_object().cloned().unwrap();
    let mut permits: Vec<String> = Vec::new();
    for k in [1u128, 2] {
        let k = OpKey::from_u128(k);
        b.reserve(
            wall_clock(),
            CREDIT,
            tool_effect("book", &args, &budget()),
            &id("agent-1"),
            k,
        )
        .unwrap();
        b.dispatch(UnixMillis(1), k).unwrap();
        settle_persists(&mut b);
        let p: Signed<Permit> = std::iter::from_fn(|| b.poll_transmit())
            .find_map(|(_, m)| match m {
                LedgerMessage::Dispatch { permit, .. } => Some(permit),
                _ => None,
            })
            .unwrap();
        permits.push(permit_to_meta(&p).as_str().unwrap().to_owned());
    }
    // Dispatched and not yet evidenced: quarantined (charged until a receipt settles them).
    assert_eq!(b.buckets(ROOT)[3], cents(50), "two calls in quarantine");

    let Some(stdout) = common::python_client_with(
        "ABHYASA_MCP_PYTHON",
        "mcp 2.x",
        "mcp/client.py",
        &[certs_s, &permits[0], &permits[1]],
    ) else {
        return;
    };
    assert!(stdout.contains("mcp python client: all checks passed"));
    // Every check the script makes, each printed as it passed.
    for via in ["stdio", "http"] {
        let n = stdout
            .lines()
            .filter(|l| l.starts_with(&format!("ok: [{via}] ")))
            .count();
        assert!(n >= 31, "{n} checks over {via}");
    }
    // The receipts the SDK got back settle the branch: 50 committed, 50 available.
    let gw = id("agent-1");
    for (via, k) in [("stdio", 1u128), ("http", 2)] {
        let line = stdout
            .lines()
            .find_map(|l| l.strip_prefix(&format!("receipt [{via}]: ")))
            .unwrap_or_else(|| panic!("no receipt over {via}"));
        let mut meta = Map::new();
        meta.insert(META_RECEIPT.into(), Value::String(line.trim().to_owned()));
        let r = receipt_from_meta(&meta).unwrap().unwrap();
        b.handle_message(UnixMillis(2), &gw, LedgerMessage::Receipt(r));
        settle_persists(&mut b);
        let op = b.operation(OpKey::from_u128(k)).unwrap();
        assert!(
            matches!(op.state, OpState::Settled { .. }),
            "{via}: {:?}",
            op.state
        );
    }
    let buckets = b.buckets(ROOT);
    assert_eq!(buckets[0], cents(50), "available");
    assert_eq!(buckets[2], Vector::default(), "reserved");
    assert_eq!(buckets[3], Vector::default(), "quarantined");
    assert_eq!(buckets[4], cents(50), "committed");
}
