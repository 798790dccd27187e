//! The `abhyasa demo` binary, run as a separate process: real nodes on loopback QUIC. It must
//! end with the summary line, with nothing lost or applied twice, and applied, escalated and
//! best-effort outcomes all present.

use std::process::Command;

fn field(line: &str, name: &str) -> u64 {
    line.split_whitespace()
        .find_map(|kv| kv.strip_prefix(&format!("{name}=")))
        .unwrap_or_else(|| panic!("no {name}= in {line:?}"))
        .parse()
        .unwrap()
}

#[test]
fn demo_ends_with_a_clean_summary() {
    let out = Command::new(env!("CARGO_BIN_EXE_abhyasa"))
        .arg("demo")
        .output()
        .expect("the demo runs");
    let stdout = String::from_utf8(out.stdout).unwrap();
    assert!(out.status.success(), "demo failed:\n{stdout}");
    let last = stdout.lines().last().unwrap();
    assert!(last.starts_with("summary: "), "{last}");
    assert_eq!(field(last, "lost"), 0);
    assert_eq!(field(last, "double_applied"), 0);
    assert!(field(last, "applied") > 0);
    assert!(field(last, "escalated") > 0);
    assert!(field(last, "best_effort") > 0);
    let total = field(last, "applied")
        + field(last, "declined")
        + field(last, "escalated")
        + field(last, "best_effort");
    assert_eq!(total, field(last, "obligations"));
    // Where nginx is installed the demo ends with it refusing a call after the revocation;
    // where it is not, the demo says so.
    if abhyasa::enforce::nginx::find_nginx().is_some() {
        let lines: Vec<&str> = stdout.lines().collect();
        let first = lines
            .iter()
            .position(|l| l.ends_with("GET /files/q3 as agent-0 -> 200"));
        let refused = lines
            .iter()
            .position(|l| l.contains("revoke files.read for agent-0 issued; GET /files/q3 as agent-0 -> 403 (scope files.read is withheld from agent-0 by obligation"));
        assert!(
            matches!((first, refused), (Some(a), Some(b)) if a < b),
            "no nginx refusal after the revocation:\n{stdout}"
        );
    } else {
        assert!(stdout.contains("nginx: not installed"), "{stdout}");
    }
}

#[test]
fn demo_through_the_netem_relay_reports_latency_and_attempts() {
    let out = Command::new(env!("CARGO_BIN_EXE_abhyasa"))
        .args(["demo", "--loss", "10%", "--delay", "20ms"])
        .output()
        .expect("the demo runs");
    let stdout = String::from_utf8(out.stdout).unwrap();
    assert!(out.status.success(), "demo failed:\n{stdout}");
    assert!(
        stdout.contains("impaired both ways: loss 10% delay 20000us"),
        "{stdout}"
    );
    let relay = stdout
        .lines()
        .find(|l| l.starts_with("relay: up"))
        .expect("relay counters");
    assert!(!relay.starts_with("relay: up 0 offered"), "{relay}");
    assert!(stdout
        .lines()
        .any(|l| l.starts_with("latency issue -> applied (ms): p50=")));
    assert!(stdout
        .lines()
        .any(|l| l.starts_with("attempts per obligation under custody: mean=")));
    let last = stdout.lines().last().unwrap();
    assert_eq!(field(last, "lost"), 0);
    assert_eq!(field(last, "double_applied"), 0);
    assert!(field(last, "applied") > 0 && field(last, "escalated") > 0);
}
