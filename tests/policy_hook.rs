//! The agent decides: an `abhyasa node` agent with `[policy] command = …` runs the operator's
//! executable with each obligation as JSON before applying it. Exit 0 applies, exit 1
//! declines in the agent's own words (the principal records `declined (policy)` with them and
//! keeps its safe action), and a command that does not answer in time defers — custody stays
//! with the principal until the deadline, when it escalates and the safe action stands.

mod common;

use std::os::unix::fs::PermissionsExt as _;
use std::path::Path;
use std::time::Duration;

use common::{abhyasa, free_udp, status, wait_for, NodeProc};

/// The recent outcome of `id` in the principal's status, once there is one.
fn outcome(admin: &str, id: &str) -> serde_json::Value {
    let mut found = None;
    wait_for(
        &format!("the outcome of {id}"),
        Duration::from_secs(40),
        || {
            found = status(admin).and_then(|s| {
                s["recent"]
                    .as_array()
                    .and_then(|r| r.iter().find(|o| o["id"] == id).cloned())
            });
            found.is_some()
        },
    );
    found.unwrap()
}

fn issue(admin: &str, args: &[&str]) -> String {
    let mut all = vec!["issue", "--admin", admin, "--target", "agent-1"];
    all.extend_from_slice(args);
    let out = abhyasa(&all);
    let reply: serde_json::Value = serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|_| panic!("{}", common::output_text(&out)));
    assert_eq!(reply["ok"], true, "{reply}");
    reply["id"].as_str().unwrap().to_owned()
}

#[test]
fn a_policy_command_applies_declines_in_its_own_words_and_defers() {
    let dir = tempfile::tempdir().unwrap();
    let certs = common::Setup::new(dir.path()).certs;
    let seen = dir.path().join("seen.jsonl");
    // The operator's policy: it keeps every obligation it is shown; it will not give up
    // calendar.write; it never answers about files.read.
    let hook = dir.path().join("policy.sh");
    std::fs::write(
        &hook,
        format!(
            "#!/bin/sh\nread -r o\nprintf '%s\\n' \"$o\" >> '{}'\n\
             case \"$o\" in\n\
             *'\"scope\":\"calendar.write\"'*) echo 'the user keeps calendar.write for themselves'; exit 1 ;;\n\
             *'\"scope\":\"files.read\"'*) exec sleep 30 ;;\n\
             esac\nexit 0\n",
            seen.display()
        ),
    )
    .unwrap();
    std::fs::set_permissions(&hook, std::fs::Permissions::from_mode(0o755)).unwrap();

    let agent_addr = free_udp();
    let (p_admin, a_admin) = (
        dir.path().join("p.sock").display().to_string(),
        dir.path().join("a.sock").display().to_string(),
    );
    let write = |name: &str, text: String| {
        let p = dir.path().join(name);
        std::fs::write(&p, text).unwrap();
        p
    };
    let agent_cfg = write(
        "agent.toml",
        format!(
            "agent = \"agent-1\"\nlisten = \"{agent_addr}\"\ncerts = \"{certs}\"\nstate = \"{}\"\nadmin = \"{a_admin}\"\n\n\
             [policy]\ncommand = \"{}\"\ntimeout_ms = 400\n",
            dir.path().join("state-a").display(),
            hook.display()
        ),
    );
    let principal_cfg = write(
        "principal.toml",
        format!(
            "agent = \"principal\"\nlisten = \"{}\"\ncerts = \"{certs}\"\nstate = \"{}\"\nadmin = \"{p_admin}\"\n\n\
             [custody]\nresponse_timeout_ms = 300\nbackoff_base_ms = 100\nbackoff_cap_ms = 400\n\n\
             [[peers]]\nid = \"agent-1\"\naddr = \"{agent_addr}\"\n",
            free_udp(),
            dir.path().join("state-p").display()
        ),
    );
    let _agent = NodeProc::start(&agent_cfg);
    let _principal = NodeProc::start(&principal_cfg);
    for admin in [&p_admin, &a_admin] {
        wait_for("an admin socket", Duration::from_secs(30), || {
            Path::new(admin).exists() && status(admin).is_some()
        });
    }

    // Exit 0: applied.
    let revoke = issue(
        &p_admin,
        &[
            "--kind",
            "anumati.consent",
            "--decision",
            "revoke",
            "--scope",
            "calendar.read",
        ],
    );
    let o = outcome(&p_admin, &revoke);
    assert_eq!(o["outcome"], "Applied", "{o}");

    // Exit 1: declined, in the agent's own words; the grant never opens the scope on the
    // principal's side (its safe action withholds it).
    let grant = issue(
        &p_admin,
        &[
            "--kind",
            "anumati.consent",
            "--decision",
            "grant",
            "--scope",
            "calendar.write",
            "--lease-ms",
            "600000",
        ],
    );
    let o = outcome(&p_admin, &grant);
    assert_eq!(o["outcome"], "Declined(Policy)", "{o}");
    assert_eq!(
        o["detail"], "the user keeps calendar.write for themselves",
        "{o}"
    );
    let o_grant_detail = o["detail"].as_str().unwrap().to_owned();
    let s = status(&p_admin).unwrap();
    let withheld = s["withheld"].as_array().unwrap();
    assert!(
        withheld
            .iter()
            .any(|w| w[0] == "agent-1" && w[1] == "calendar.write"),
        "{withheld:?}"
    );
    // The agent applied neither.
    let a = status(&a_admin).unwrap();
    let applied: Vec<&str> = a["applied"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|x| x["id"].as_str())
        .collect();
    assert!(
        applied.contains(&revoke.as_str()) && !applied.contains(&grant.as_str()),
        "{applied:?}"
    );

    // No answer within the timeout: deferred, offered again (and the command asked again),
    // until the deadline, when custody escalates and the withhold stands.
    let stuck = issue(
        &p_admin,
        &[
            "--kind",
            "anumati.consent",
            "--decision",
            "revoke",
            "--scope",
            "files.read",
            "--deadline-ms",
            "2500",
        ],
    );
    let o = outcome(&p_admin, &stuck);
    assert!(
        o["outcome"].as_str().unwrap().starts_with("Escalated"),
        "{o}"
    );
    let asked = std::fs::read_to_string(&seen).unwrap();
    let about_files = asked.lines().filter(|l| l.contains("files.read")).count();
    assert!(about_files >= 2, "asked {about_files} times:\n{asked}");
    // What the command read is the obligation, as JSON, named by its id.
    let first: serde_json::Value = serde_json::from_str(asked.lines().next().unwrap()).unwrap();
    assert_eq!(first["obligation_id"], revoke.as_str());
    assert_eq!(first["kind"], "anumati.consent");
    assert_eq!(first["payload"]["scope"], "calendar.read");
    println!(
        "policy hook: applied, declined ({}), escalated after {about_files} deferrals",
        o_grant_detail
    );
}
