//! A short `abhyasa soak` (the long one is in docs/SOAK.md): three agent processes behind
//! relays, obligations of every kind at 20/s, a partition or a SIGKILL every 1.5 s. At the end
//! every acked issue must be terminal (nothing lost, nothing left pending), no id applied twice,
//! the audit clean; and the run must really have killed, partitioned and applied.

mod common;

#[test]
fn a_short_soak_loses_nothing_and_keeps_its_samples() {
    let out = tempfile::tempdir().unwrap();
    let work = tempfile::tempdir().unwrap();
    let run = common::abhyasa(&[
        "soak",
        "--duration",
        "20s",
        "--agents",
        "3",
        "--rate",
        "20",
        "--fault-every-ms",
        "1500",
        "--deadline-ms",
        "8000",
        "--out",
        out.path().to_str().unwrap(),
        "--dir",
        work.path().to_str().unwrap(),
    ]);
    let text = common::output_text(&run);
    println!("{text}");
    assert!(run.status.success(), "{text}");
    let last = text
        .lines()
        .rev()
        .find(|l| l.starts_with("soak: "))
        .expect("a summary line");
    let field = |name: &str| -> u64 {
        last.split_whitespace()
            .find_map(|w| w.strip_prefix(&format!("{name}=")))
            .and_then(|v| v.parse().ok())
            .unwrap_or_else(|| panic!("{name} in {last}"))
    };
    assert!(field("acked") >= 200, "{last}");
    assert!(field("kills") + field("partitions") >= 8, "{last}");
    assert!(field("kills") > 0 && field("partitions") > 0, "{last}");
    for zero in ["still_pending", "lost", "double_applied", "violations"] {
        assert_eq!(field(zero), 0, "{zero}: {last}");
    }
    assert!(last.contains("\"Applied\""), "{last}");
    // Every agent killed or cut off came back: the principal has a session with all three.
    assert!(last.contains(" peers_up=3/3 "), "{last}");
    // One sample a second, each with the principal's memory and open files.
    let csv = std::fs::read_to_string(out.path().join("soak.csv")).unwrap();
    let rows: Vec<Vec<u64>> = csv
        .lines()
        .skip(1)
        .map(|l| l.split(',').skip(1).map(|v| v.parse().unwrap()).collect())
        .collect();
    assert!(rows.len() >= 18, "{} samples", rows.len());
    assert!(rows.iter().all(|r| r[0] > 1024 && r[1] > 3), "{csv}");
    // And agent-0's, whose one process lives the whole run (partitioned, never killed).
    assert!(rows.iter().all(|r| r[4] > 1024 && r[5] > 3), "{csv}");
    assert!(out.path().join("soak.svg").exists());
    let latency = std::fs::read_to_string(out.path().join("soak-latency.csv")).unwrap();
    assert!(latency.lines().count() >= 2, "{latency}");
}
