//! Two `abhyasa node` processes over loopback QUIC, set up with the CLI exactly as the README
//! describes (certs init / issue, TOML configs), driven with `abhyasa issue` and checked with
//! `abhyasa status --json`. The receiver is SIGKILLed mid-run, which tears its connection down
//! with obligations in flight, and restarted; the principal re-dials and custody completes.

use std::path::Path;
use std::time::Duration;

mod common;
use common::{abhyasa, free_udp, wait_for, NodeProc};

fn free_port() -> u16 {
    free_udp().port()
}

fn start_node(config: &Path) -> NodeProc {
    NodeProc::start(config)
}

fn status(admin: &str) -> Option<serde_json::Value> {
    let out = abhyasa(&["status", "--admin", admin, "--json"]);
    out.status
        .success()
        .then(|| serde_json::from_slice(&out.stdout).ok())
        .flatten()
}

fn issue(admin: &str, args: &[&str]) -> serde_json::Value {
    let mut all = vec!["issue", "--admin", admin];
    all.extend_from_slice(args);
    let out = abhyasa(&all);
    assert!(
        out.status.success(),
        "issue failed: {}",
        String::from_utf8_lossy(&out.stdout)
    );
    serde_json::from_slice(&out.stdout).unwrap()
}

fn outcomes(s: &serde_json::Value) -> Vec<String> {
    s["recent"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["outcome"].as_str().unwrap().to_owned())
        .collect()
}

#[test]
fn two_node_processes_with_a_receiver_killed_and_restarted() {
    let dir = tempfile::tempdir().unwrap();
    let certs = dir.path().join("certs");
    let c = certs.to_str().unwrap();
    assert!(abhyasa(&["certs", "init", "--dir", c]).status.success());
    assert!(abhyasa(&["certs", "issue", "principal", "--dir", c])
        .status
        .success());
    assert!(abhyasa(&["certs", "issue", "agent-1", "--dir", c])
        .status
        .success());
    // A second init refuses to overwrite the CA.
    assert!(!abhyasa(&["certs", "init", "--dir", c]).status.success());

    let (p_port, a_port) = (free_port(), free_port());
    let (p_admin, a_admin) = (
        dir.path().join("p-admin.sock").display().to_string(),
        dir.path().join("a-admin.sock").display().to_string(),
    );
    let p_cfg = dir.path().join("principal.toml");
    std::fs::write(
        &p_cfg,
        format!(
            "agent = \"principal\"\nlisten = \"127.0.0.1:{p_port}\"\ncerts = \"{c}\"\nstate = \"{}\"\nadmin = \"{p_admin}\"\n\n\
             [custody]\nresponse_timeout_ms = 200\nbackoff_base_ms = 50\nbackoff_cap_ms = 400\n\n\
             [[peers]]\nid = \"agent-1\"\naddr = \"127.0.0.1:{a_port}\"\n",
            dir.path().join("state-p").display()
        ),
    )
    .unwrap();
    let a_cfg = dir.path().join("agent.toml");
    std::fs::write(
        &a_cfg,
        format!(
            "agent = \"agent-1\"\nlisten = \"127.0.0.1:{a_port}\"\ncerts = \"{c}\"\nstate = \"{}\"\nadmin = \"{a_admin}\"\n",
            dir.path().join("state-a").display()
        ),
    )
    .unwrap();

    let mut agent = start_node(&a_cfg);
    let _principal = start_node(&p_cfg);
    wait_for(
        "both nodes up and connected",
        Duration::from_secs(15),
        || status(&p_admin).is_some_and(|s| s["peers"].as_array().is_some_and(|p| !p.is_empty())),
    );

    let revoke = |token: &str| {
        issue(
            &p_admin,
            &[
                "--target",
                "agent-1",
                "--kind",
                "oauth.token",
                "--action",
                "revoke",
                "--token",
                token,
            ],
        )
    };
    let r = revoke("t1");
    assert_eq!(r["admission"], "custody");
    let r = issue(
        &p_admin,
        &[
            "--target",
            "agent-1",
            "--kind",
            "anumati.consent",
            "--decision",
            "revoke",
            "--scope",
            "calendar.read",
        ],
    );
    assert_eq!(r["admission"], "custody");
    let r = issue(
        &p_admin,
        &[
            "--target",
            "agent-1",
            "--kind",
            "phala.belief_update",
            "--weight-key",
            "s/acme",
            "--delta",
            "0.1",
        ],
    );
    assert_eq!(r["admission"], "best_effort");
    wait_for("two applied", Duration::from_secs(15), || {
        status(&p_admin)
            .is_some_and(|s| outcomes(&s).iter().filter(|o| *o == "Applied").count() == 2)
    });

    // Kill the receiver with obligations in flight, then bring it back.
    drop(agent);
    for t in ["t2", "t3", "t4"] {
        assert_eq!(revoke(t)["admission"], "custody");
    }
    let s = status(&p_admin).unwrap();
    assert!(
        !s["pending"].as_array().unwrap().is_empty(),
        "nothing was in flight"
    );
    agent = start_node(&a_cfg);
    wait_for(
        "all five applied after the restart",
        Duration::from_secs(20),
        || {
            status(&p_admin).is_some_and(|s| {
                outcomes(&s).iter().filter(|o| *o == "Applied").count() == 5
                    && s["pending"].as_array().unwrap().is_empty()
            })
        },
    );
    let s = status(&p_admin).unwrap();
    let revoked: Vec<&str> = s["revoked_tokens"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_str().unwrap())
        .collect();
    assert_eq!(revoked, ["t1", "t2", "t3", "t4"]);
    assert_eq!(s["withheld"][0][1], "calendar.read");
    // The table view works too.
    let table = abhyasa(&["status", "--admin", &p_admin]);
    let principal_table = String::from_utf8_lossy(&table.stdout).into_owned();
    assert!(
        principal_table.contains("stopped honouring token t4")
            && principal_table.contains("applied after"),
        "{principal_table}"
    );
    assert!(
        principal_table.contains("oauth.token for"),
        "{principal_table}"
    );
    // The agent, asked the same way, says what it honours, per principal: from its own
    // durable state, after the SIGKILL and restart.
    let h = status(&a_admin).unwrap();
    let dropped: Vec<&str> = h["honours"]["dropped_tokens"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_str().unwrap())
        .collect();
    assert_eq!(dropped, ["t1", "t2", "t3", "t4"]);
    assert_eq!(h["honours"]["withheld"][0][0], "principal");
    assert_eq!(h["honours"]["withheld"][0][1], "calendar.read");
    let table = abhyasa(&["status", "--admin", &a_admin]);
    let table = String::from_utf8_lossy(&table.stdout);
    assert!(
        table.contains("does not use calendar.read for principal"),
        "{table}"
    );
    // What it applied, in words, from its apply log (kept across the SIGKILL).
    assert!(
        table.contains("oauth.token revoke t4 for") && table.contains("(from principal)"),
        "{table}"
    );
    let applied: Vec<&str> = h["applied"]
        .as_array()
        .unwrap()
        .iter()
        .map(|a| a["says"].as_str().unwrap())
        .collect();
    assert!(
        applied
            .iter()
            .any(|a| a.starts_with("anumati.consent revoke calendar.read")),
        "{applied:?}"
    );
    drop(agent);
}
