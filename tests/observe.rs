//! What people see: a node's `/metrics` scraped and parsed by the reference Python parser
//! (`prometheus_client.parser`) and checked against the node's own status, and its console
//! driven in a real browser (Debian's headless Chromium, through chromedriver and Selenium).
//! Both need the Python named by `ABHYASA_OBSERVE_PYTHON` (`.ci/run` installs it); the
//! browser test also Chromium and chromedriver. Each says SKIPPED plainly where they are
//! missing, and `.ci/run` fails on a skip.

mod common;

use std::collections::BTreeMap;
use std::path::Path;
use std::time::Duration;

use common::{free_tcp, free_udp, status, wait_for, NodeProc};

/// A principal with `[observe]` on a free port, peers `agent-1` (its config written, not
/// started) and `agent-2` (never up); returns (principal config, agent config, console URL,
/// principal admin socket, principal state).
fn deployment(
    dir: &Path,
) -> (
    std::path::PathBuf,
    std::path::PathBuf,
    String,
    String,
    std::path::PathBuf,
) {
    let setup = common::Setup::new(dir);
    let agent_addr = free_udp();
    let port = free_tcp();
    let write = |name: &str, text: String| {
        let p = dir.join(name);
        std::fs::write(&p, text).unwrap();
        p
    };
    let agent = write(
        "agent.toml",
        format!(
            "agent = \"agent-1\"\nlisten = \"{agent_addr}\"\ncerts = \"{}\"\nstate = \"{}\"\nadmin = \"{}\"\n",
            setup.certs,
            setup.state.1.display(),
            setup.admin.1
        ),
    );
    let principal = write(
        "principal.toml",
        format!(
            "agent = \"principal\"\nlisten = \"{}\"\ncerts = \"{}\"\nstate = \"{}\"\nadmin = \"{}\"\n\n\
             [observe]\nlisten = \"127.0.0.1:{port}\"\n\n\
             [custody]\nresponse_timeout_ms = 300\nbackoff_base_ms = 100\nbackoff_cap_ms = 400\n\n\
             [[peers]]\nid = \"agent-1\"\naddr = \"{agent_addr}\"\n\n\
             [[peers]]\nid = \"agent-2\"\naddr = \"{}\"\n",
            free_udp(),
            setup.certs,
            setup.state.0.display(),
            setup.admin.0,
            free_udp()
        ),
    );
    (
        principal,
        agent,
        format!("http://127.0.0.1:{port}/"),
        setup.admin.0,
        setup.state.0,
    )
}

fn wait_admin(admin: &str) {
    wait_for("an admin socket", Duration::from_secs(30), || {
        Path::new(admin).exists() && status(admin).is_some()
    });
}

/// One scraped sample: (name, labels) → value.
type Samples = BTreeMap<(String, BTreeMap<String, String>), f64>;

fn sample(s: &Samples, name: &str, labels: &[(&str, &str)]) -> Option<f64> {
    let labels = labels
        .iter()
        .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
        .collect();
    s.get(&(name.to_owned(), labels)).copied()
}

#[test]
fn a_scrape_parsed_by_prometheus_client_agrees_with_the_nodes_status() {
    if std::env::var("ABHYASA_OBSERVE_PYTHON").is_err() {
        println!("SKIPPED: ABHYASA_OBSERVE_PYTHON is not set (a python with prometheus_client; .ci/run sets it)");
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let (principal, agent, url, admin, state) = deployment(dir.path());
    let _agent = NodeProc::start(&agent);
    let _principal = NodeProc::start(&principal);
    wait_admin(&admin);
    // Three applied by agent-1, two escalated at agent-2, two pending at agent-2.
    for i in 0..3 {
        common::issue_revoke(&admin, "agent-1", &format!("applied.{i}"), 60_000);
    }
    for i in 0..2 {
        common::issue_revoke(&admin, "agent-2", &format!("escalates.{i}"), 1_500);
    }
    for i in 0..2 {
        common::issue_revoke(&admin, "agent-2", &format!("pending.{i}"), 600_000);
    }
    wait_for("3 applied and 2 escalated", Duration::from_secs(60), || {
        status(&admin).is_some_and(|s| {
            let outcomes: Vec<&str> = s["recent"]
                .as_array()
                .unwrap()
                .iter()
                .filter_map(|o| o["outcome"].as_str())
                .collect();
            outcomes.iter().filter(|o| **o == "Applied").count() == 3
                && outcomes
                    .iter()
                    .filter(|o| o.starts_with("Escalated"))
                    .count()
                    == 2
        })
    });
    let token_file = state.join("admin.token");
    let out = common::python_client_with(
        "ABHYASA_OBSERVE_PYTHON",
        "prometheus_client",
        "observe/scrape.py",
        &[&format!("{url}metrics"), token_file.to_str().unwrap()],
    )
    .expect("the python is set");
    let s = status(&admin).unwrap();
    let json = out
        .lines()
        .find_map(|l| l.strip_prefix("SAMPLES "))
        .expect("the samples");
    let parsed: Vec<serde_json::Value> = serde_json::from_str(json).unwrap();
    let samples: Samples = parsed
        .iter()
        .map(|v| {
            let labels = v["labels"]
                .as_object()
                .unwrap()
                .iter()
                .map(|(k, v)| (k.clone(), v.as_str().unwrap().to_owned()))
                .collect();
            (
                (v["name"].as_str().unwrap().to_owned(), labels),
                v["value"].as_f64().unwrap(),
            )
        })
        .collect();
    let kind = "anumati.consent";
    // Pending by peer, as the status lists them.
    let pending = s["pending"].as_array().unwrap();
    let pending_at = |peer: &str| pending.iter().filter(|p| p["target"] == peer).count() as f64;
    assert_eq!(pending_at("agent-2"), 2.0);
    assert_eq!(
        sample(&samples, "abhyasa_custody_pending", &[("peer", "agent-2")]),
        Some(2.0)
    );
    assert_eq!(
        sample(&samples, "abhyasa_custody_pending", &[("peer", "agent-1")]),
        None
    );
    // Outcomes by kind, as the status's recent records say.
    let recent = s["recent"].as_array().unwrap();
    let count = |p: &dyn Fn(&str) -> bool| {
        recent
            .iter()
            .filter(|o| p(o["outcome"].as_str().unwrap()))
            .count() as f64
    };
    let applied = count(&|o| o == "Applied");
    let escalated = count(&|o| o.starts_with("Escalated"));
    assert_eq!(
        sample(
            &samples,
            "abhyasa_custody_outcomes_total",
            &[("kind", kind), ("outcome", "applied")]
        ),
        Some(applied)
    );
    assert_eq!(
        sample(
            &samples,
            "abhyasa_custody_outcomes_total",
            &[("kind", kind), ("outcome", "escalated")]
        ),
        Some(escalated)
    );
    assert_eq!(
        sample(
            &samples,
            "abhyasa_custody_escalations_total",
            &[("kind", kind), ("cause", "deadline")]
        ),
        Some(s["escalations"].as_array().unwrap().len() as f64)
    );
    // Attempts: the sum over the ended records.
    let attempts: f64 = recent.iter().map(|o| o["attempts"].as_f64().unwrap()).sum();
    assert_eq!(
        sample(
            &samples,
            "abhyasa_custody_attempts_total",
            &[("kind", kind)]
        ),
        Some(attempts)
    );
    // Discharge latency: one observation per ended custody, all of them under a minute, the
    // escalations at least their 1.5 s deadline.
    assert_eq!(
        sample(
            &samples,
            "abhyasa_custody_discharge_seconds_count",
            &[("kind", kind)]
        ),
        Some(applied + escalated)
    );
    let sum = sample(
        &samples,
        "abhyasa_custody_discharge_seconds_sum",
        &[("kind", kind)],
    )
    .unwrap();
    assert!(
        sum >= 2.0 * 1.5 && sum < 60.0 * (applied + escalated),
        "{sum}"
    );
    assert_eq!(
        sample(
            &samples,
            "abhyasa_custody_discharge_seconds_bucket",
            &[("kind", kind), ("le", "+Inf")]
        ),
        Some(applied + escalated)
    );
    // Sessions, withheld scopes (each escalation withholds one), the outbox, the store.
    assert_eq!(
        sample(&samples, "abhyasa_sessions", &[]),
        Some(s["peers"].as_array().unwrap().len() as f64)
    );
    assert_eq!(
        sample(&samples, "abhyasa_peer_up", &[("peer", "agent-1")]),
        Some(1.0)
    );
    assert_eq!(
        sample(&samples, "abhyasa_principal_withheld_scopes", &[]),
        Some(s["withheld"].as_array().unwrap().len() as f64)
    );
    assert_eq!(sample(&samples, "abhyasa_store_full", &[]), Some(0.0));
    let store = sample(&samples, "abhyasa_store_bytes", &[]).unwrap();
    let file = std::fs::metadata(state.join("node.redb")).unwrap().len() as f64;
    assert!(store > 0.0 && store <= file * 2.0, "{store} vs {file}");
    println!(
        "metrics scrape: {} samples parsed by prometheus_client; pending 2, applied {applied}, \
         escalated {escalated}, attempts {attempts}, discharge sum {sum:.3} s — each equal to \
         the node's status",
        samples.len()
    );
}

#[test]
fn the_console_shows_pending_then_applied_and_an_escalation_live_in_chromium() {
    let Ok(python) = std::env::var("ABHYASA_OBSERVE_PYTHON") else {
        println!(
            "SKIPPED: ABHYASA_OBSERVE_PYTHON is not set (a python with selenium; .ci/run sets it)"
        );
        return;
    };
    let chromium = std::env::var("ABHYASA_CHROMIUM").unwrap_or_else(|_| "/usr/bin/chromium".into());
    let driver =
        std::env::var("ABHYASA_CHROMEDRIVER").unwrap_or_else(|_| "/usr/bin/chromedriver".into());
    if !Path::new(&chromium).exists() || !Path::new(&driver).exists() {
        println!("SKIPPED: no Chromium at {chromium} or chromedriver at {driver} (Debian's chromium and chromium-driver; .ci/run installs them)");
        return;
    }
    let _ = python;
    let dir = tempfile::tempdir().unwrap();
    let (principal, agent, url, admin, state) = deployment(dir.path());
    let _principal = NodeProc::start(&principal);
    wait_admin(&admin);
    // Screenshots go to docs/ when asked (ABHYASA_WRITE_SCREENSHOTS=1), else to the
    // temporary directory: a test run does not change the tree.
    let shots = if std::env::var("ABHYASA_WRITE_SCREENSHOTS").is_ok() {
        Path::new(env!("CARGO_MANIFEST_DIR")).join("docs/console")
    } else {
        dir.path().join("shots")
    };
    std::fs::create_dir_all(&shots).unwrap();
    let out = common::python_client_with(
        "ABHYASA_OBSERVE_PYTHON",
        "selenium",
        "observe/console.py",
        &[
            &url,
            state.join("admin.token").to_str().unwrap(),
            &admin,
            agent.to_str().unwrap(),
            shots.to_str().unwrap(),
            &chromium,
            &driver,
        ],
    )
    .expect("the python is set");
    assert!(out.contains("console: pending"), "{out}");
    for name in [
        "console-pending",
        "console-applied",
        "console-escalated",
        "console-phone",
    ] {
        let png = std::fs::read(shots.join(format!("{name}.png"))).unwrap();
        assert!(
            png.starts_with(b"\x89PNG") && png.len() > 5_000,
            "{name}: {} bytes",
            png.len()
        );
    }
}
