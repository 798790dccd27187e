//! The ledger's whole surface for operators, driven from outside: a caller in Python (the
//! official MCP SDK, `ABHYASA_MCP_PYTHON`) spends its own node's budget at another node's
//! priced tool — split, join, reserve, release, a permit from its own node, the call at the
//! gateway, the receipt back — and the tool reports an actual charge below its price, which
//! settles without an `Executor`. Then the same node from the CLI: `abhyasa ledger split`,
//! `reserve`, `release`, `status`.

mod common;

use std::path::Path;

use common::{abhyasa, free_udp};

fn ok(args: &[&str]) -> String {
    let out = abhyasa(args);
    assert!(
        out.status.success(),
        "{args:?}: {}",
        common::output_text(&out)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

#[test]
fn a_python_caller_gets_a_permit_from_its_own_node_and_settles_a_partial_charge() {
    let dir = tempfile::tempdir().unwrap();
    let setup = common::Setup::new(dir.path());
    let certs = &setup.certs;
    // The gateway's priced tool: it charges 20 of its 50 cents, written where it is told.
    let gateway_cfg = dir.path().join("gateway.toml");
    std::fs::write(
        &gateway_cfg,
        format!(
            "agent = \"agent-1\"\nlisten = \"{}\"\ncerts = \"{certs}\"\nstate = \"{}\"\nadmin = \"{}\"\n\n\
             [ledger]\ngateway = true\n\n\
             [mcp]\nprincipal = \"principal\"\n\n\
             [[mcp.tools]]\nname = \"book\"\ndescription = \"Books a trip.\"\ncost = \"cents=50\"\npurpose = \"travel\"\n\
             command = [\"sh\", \"-c\", \"cat > /dev/null; echo cents=20 > \\\"$ABHYASA_CHARGE_FILE\\\"; echo booked\"]\n",
            free_udp(),
            setup.state.1.display(),
            setup.admin.1
        ),
    )
    .unwrap();
    let payer_cfg = dir.path().join("payer.toml");
    std::fs::write(
        &payer_cfg,
        format!(
            "agent = \"principal\"\nlisten = \"{}\"\ncerts = \"{certs}\"\nstate = \"{}\"\nadmin = \"{}\"\n\n\
             [ledger]\n\n[mcp]\nprincipal = \"principal\"\nnode_tools = [\"ledger\"]\n",
            free_udp(),
            setup.state.0.display(),
            setup.admin.0
        ),
    )
    .unwrap();
    let Some(out) = common::python_client_with(
        "ABHYASA_MCP_PYTHON",
        "the mcp SDK",
        "mcp/permit.py",
        &[
            payer_cfg.to_str().unwrap(),
            gateway_cfg.to_str().unwrap(),
            &setup.admin.0,
            certs,
        ],
    ) else {
        return;
    };
    assert!(out.contains("ledger surface: "), "{out}");
    assert!(!out.contains("FAILED"), "{out}");

    // The same node's budget from the command line (as a node now).
    let _payer = common::NodeProc::start(&payer_cfg);
    let admin = &setup.admin.0;
    common::wait_for(
        "the payer's admin socket",
        std::time::Duration::from_secs(30),
        || Path::new(admin).exists() && common::status(admin).is_some(),
    );
    let status = || -> serde_json::Value {
        serde_json::from_str(&ok(&["ledger", "status", "--admin", admin, "--json"])).unwrap()
    };
    let split = ok(&[
        "ledger",
        "split",
        "--admin",
        admin,
        "--credit",
        "3",
        "--amount",
        "cents=100",
        "--label",
        "travel",
        "--child",
        "c4",
    ]);
    assert!(split.contains("credit c4"), "{split}");
    ok(&[
        "ledger",
        "reserve",
        "--admin",
        admin,
        "--credit",
        "c4",
        "--gateway",
        "agent-1",
        "--max",
        "cents=60",
        "--operation",
        "held",
        "--purpose",
        "travel",
        "--key",
        "d1",
    ]);
    let s = status();
    let c4 = s["credits"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["id"] == "c4")
        .unwrap();
    assert_eq!(c4["available"], "cents=40", "{s}");
    assert_eq!(s["roots"][0]["reserved"], "cents=60", "{s}");
    ok(&["ledger", "release", "--admin", admin, "--key", "d1"]);
    let s = status();
    assert_eq!(s["roots"][0]["reserved"], "0", "{s}");
    assert_eq!(s["roots"][0]["available"], "cents=980", "{s}");
    assert_eq!(s["roots"][0]["committed"], "cents=20", "{s}");
    // A reservation dispatched cannot be released: refused by name, nothing changes.
    let out = abhyasa(&["ledger", "release", "--admin", admin, "--key", "b1"]);
    assert!(!out.status.success(), "{}", common::output_text(&out));
    println!("ledger cli: split, reserve, release; a settled operation's release refused");
}
