//! Two `abhyasa node` processes over MCP carried on their QUIC endpoints (the MCP-over-MOQT
//! layout), set up with the CLI: the agent serves `[mcp]`, the principal reaches it with
//! `transport = "mcp"` (obligations ride `abhyasa_deliver` calls, acks return on the results).
//! The MCP server process is SIGKILLed with obligations in flight and restarted; custody
//! completes; both are stopped and `abhyasa check` audits their redb files.

use std::time::Duration;

mod common;
use common::{abhyasa, free_tcp, free_udp, wait_for, NodeProc};

fn status(admin: &str) -> Option<serde_json::Value> {
    let out = abhyasa(&["status", "--admin", admin, "--json"]);
    out.status
        .success()
        .then(|| serde_json::from_slice(&out.stdout).ok())
        .flatten()
}

fn revoke(admin: &str, token: &str) -> serde_json::Value {
    let out = abhyasa(&[
        "issue",
        "--admin",
        admin,
        "--target",
        "agent-1",
        "--kind",
        "oauth.token",
        "--action",
        "revoke",
        "--token",
        token,
    ]);
    assert!(
        out.status.success(),
        "issue failed: {}",
        String::from_utf8_lossy(&out.stdout)
    );
    serde_json::from_slice(&out.stdout).unwrap()
}

fn applied(s: &serde_json::Value) -> usize {
    s["recent"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|r| r["outcome"] == "Applied")
        .count()
}

#[test]
fn custody_over_mcp_over_quic_between_two_processes_survives_a_sigkill_of_the_mcp_server() {
    let dir = tempfile::tempdir().unwrap();
    let certs = dir.path().join("certs");
    let c = certs.to_str().unwrap();
    assert!(abhyasa(&["certs", "init", "--dir", c]).status.success());
    for a in ["principal", "agent-1"] {
        assert!(abhyasa(&["certs", "issue", a, "--dir", c]).status.success());
    }
    let a_port = free_udp();
    let (p_admin, a_admin) = (
        format!("127.0.0.1:{}", free_tcp()),
        format!("127.0.0.1:{}", free_tcp()),
    );
    let (p_state, a_state) = (dir.path().join("state-p"), dir.path().join("state-a"));
    let p_cfg = dir.path().join("principal.toml");
    std::fs::write(
        &p_cfg,
        format!(
            "agent = \"principal\"\nlisten = \"{}\"\ncerts = \"{c}\"\nstate = \"{}\"\nadmin = \"{p_admin}\"\n\n\
             [custody]\nresponse_timeout_ms = 300\nbackoff_base_ms = 50\nbackoff_cap_ms = 400\n\n\
             [[peers]]\nid = \"agent-1\"\naddr = \"{a_port}\"\ntransport = \"mcp\"\n",
            free_udp(),
            p_state.display()
        ),
    )
    .unwrap();
    let a_cfg = dir.path().join("agent.toml");
    std::fs::write(
        &a_cfg,
        format!(
            "agent = \"agent-1\"\nlisten = \"{a_port}\"\ncerts = \"{c}\"\nstate = \"{}\"\nadmin = \"{a_admin}\"\n\n[mcp]\n",
            a_state.display()
        ),
    )
    .unwrap();

    let mut agent = NodeProc::start(&a_cfg);
    let principal = NodeProc::start(&p_cfg);
    wait_for("both nodes up", Duration::from_secs(15), || {
        status(&p_admin).is_some() && status(&a_admin).is_some()
    });
    for t in ["t1", "t2"] {
        assert_eq!(revoke(&p_admin, t)["admission"], "custody");
    }
    wait_for("two applied over MCP", Duration::from_secs(15), || {
        status(&p_admin).is_some_and(|s| applied(&s) == 2)
    });

    // SIGKILL the agent with obligations in flight, then bring it back.
    drop(agent);
    for t in ["t3", "t4", "t5", "t6"] {
        assert_eq!(revoke(&p_admin, t)["admission"], "custody");
    }
    let s = status(&p_admin).unwrap();
    assert!(
        !s["pending"].as_array().unwrap().is_empty(),
        "nothing in flight"
    );
    std::thread::sleep(Duration::from_millis(500));
    agent = NodeProc::start(&a_cfg);
    wait_for(
        "all six applied after the restart",
        Duration::from_secs(20),
        || {
            status(&p_admin)
                .is_some_and(|s| applied(&s) == 6 && s["pending"].as_array().unwrap().is_empty())
        },
    );
    let h = status(&a_admin).unwrap();
    let dropped: Vec<&str> = h["honours"]["dropped_tokens"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_str().unwrap())
        .collect();
    assert_eq!(dropped, ["t1", "t2", "t3", "t4", "t5", "t6"]);

    // Stopped, both are audited from their files alone.
    principal.stop();
    agent.stop();
    let out = abhyasa(&[
        "check",
        "--state",
        &format!("principal={}", p_state.display()),
        "--state",
        &format!("agent-1={}", a_state.display()),
    ]);
    let text = String::from_utf8_lossy(&out.stdout);
    println!("{text}");
    assert!(out.status.success(), "{text}");
    assert!(
        text.contains("lost=0 double_applied=0") && !text.contains("violation:"),
        "{text}"
    );
}
