//! The sweeps run end to end on small sizes and write their CSV and SVG files.

use abhyasa_cli::sweep::{self, LossSweep, MemorySweep, PartitionSweep, RecoverySweep};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn partition_sweep_separates_reachable_from_unreachable() {
    let out = tempfile::tempdir().unwrap();
    let points = sweep::partition_to(
        &PartitionSweep {
            deadline_ms: 800,
            obligations: 10,
            fractions: vec![0.0, 1.25],
            caps_ms: vec![50],
            response_timeout_ms: 100,
        },
        out.path(),
    )
    .await
    .unwrap();
    assert_eq!(points.len(), 2);
    // No partition: every obligation applied, none escalated.
    let (open, cut) = (&points[0], &points[1]);
    assert_eq!((open.applied, open.escalated, open.reachable), (10, 0, 10));
    // A partition longer than the deadline (scheduled on the live sockets): every one
    // escalates, and none of those escalations counts as spurious.
    assert_eq!(
        (cut.partition_ms, cut.applied, cut.escalated),
        (1_000, 0, 10)
    );
    assert_eq!((cut.reachable, cut.spurious), (0, 0));
    let csv = std::fs::read_to_string(out.path().join("partition.csv")).unwrap();
    assert_eq!(csv.lines().count(), 3);
    assert!(csv
        .lines()
        .nth(2)
        .unwrap()
        .starts_with("50,1000,1.25,10,0,10,0,0,"));
    let svg = std::fs::read_to_string(out.path().join("partition.svg")).unwrap();
    assert!(svg.starts_with("<svg") && svg.contains("backoff cap 50 ms"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn loss_and_recovery_sweeps_measure_real_discharges() {
    let out = tempfile::tempdir().unwrap();
    let points = sweep::loss_to(
        &LossSweep {
            loss_percent: vec![0.0],
            obligations: 3,
        },
        out.path(),
    )
    .await
    .unwrap();
    assert_eq!(points.len(), 2, "a stream point and a datagram point");
    for p in &points {
        // 20 ms RTT emulated: nothing is discharged faster than one round trip.
        assert!(p.p50_ms >= 20.0, "{p:?}");
        assert_eq!(p.mean_attempts, 1.0, "{p:?}");
    }
    let runs = sweep::recovery_to(
        &RecoverySweep {
            pending: vec![300],
            runs: 1,
        },
        out.path(),
    )
    .await
    .unwrap();
    let r = &runs[0];
    assert_eq!(r.pending, 300);
    assert!(r.node_up_ms <= r.first_discharge_ms && r.first_discharge_ms <= r.all_discharged_ms);
    for f in [
        "loss.csv",
        "loss.svg",
        "recovery.csv",
        "recovery.svg",
        "recovery-drain.svg",
    ] {
        assert!(out.path().join(f).exists(), "{f}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn memory_sweep_holds_obligations_pending_then_passes_them_through() {
    let out = tempfile::tempdir().unwrap();
    // The sweep itself fails unless all 3,000 are still pending at the end of the first
    // phase and every one of the second is applied.
    let points = sweep::memory_to(
        &MemorySweep {
            pending: 3_000,
            through: 3_000,
            sample_every: 1_000,
            window: 1_024,
            cache_bytes: 4 << 20,
        },
        out.path(),
    )
    .await
    .unwrap();
    let at = |phase: &str| -> Vec<u64> {
        points
            .iter()
            .filter(|p| p.phase == phase)
            .map(|p| p.obligations)
            .collect()
    };
    assert_eq!(at("pending"), [1_024, 2_024, 3_000]);
    assert_eq!(at("through"), [0, 1_024, 2_048, 3_000]);
    assert!(points.iter().all(|p| p.rss_kib > 1_024), "{points:?}");
    let csv = std::fs::read_to_string(out.path().join("memory.csv")).unwrap();
    assert_eq!(csv.lines().count(), 8);
    assert!(csv.lines().nth(3).unwrap().starts_with("pending,3000,"));
    let svg = std::fs::read_to_string(out.path().join("memory.svg")).unwrap();
    assert!(svg.starts_with("<svg") && svg.contains("pending (agent unreachable)"));
}

/// One fanout sweep into a fresh directory: its points, the directory, and whether the relay
/// points ran (they are SKIPPED, said plainly, without a moq-relay binary).
async fn fanout(
    agents: Vec<usize>,
    obligations: u64,
    processes: Option<std::path::PathBuf>,
) -> (
    Vec<abhyasa_cli::fanout::FanoutPoint>,
    tempfile::TempDir,
    bool,
) {
    use abhyasa_cli::fanout::{fanout_to, relay_binary, FanoutSweep};
    let out = tempfile::tempdir().unwrap();
    let relay = relay_binary();
    if relay.is_none() {
        eprintln!("fanout: relay points SKIPPED: no moq-relay binary (scripts/moq-relay.sh)");
    }
    let ran_relay = relay.is_some();
    let sweep = FanoutSweep {
        agents,
        obligations,
        window: 8,
        direct: true,
        relay,
        processes,
    };
    let points = fanout_to(&sweep, out.path()).await.unwrap();
    (points, out, ran_relay)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fanout_sweep_applies_everything_at_every_agent_count() {
    let (points, out, relay) = fanout(vec![1, 4], 40, None).await;
    let modes = if relay { 2 } else { 1 };
    assert_eq!(points.len(), 2 * modes);
    for p in &points {
        assert_eq!((p.obligations, p.not_applied), (40, 0), "{p:?}");
        assert!(
            p.per_s > 0.0 && p.p50_ms > 0.0 && p.p99_ms >= p.p50_ms,
            "{p:?}"
        );
        // Every agent acked what it applied: at least one ack per group sent.
        assert!(p.acks_per_group >= 1.0, "{p:?}");
    }
    assert_eq!(
        points
            .iter()
            .map(|p| (p.mode, p.agents))
            .collect::<Vec<_>>()[..2],
        [("direct", 1), ("direct", 4)]
    );
    let csv = std::fs::read_to_string(out.path().join("fanout.csv")).unwrap();
    assert_eq!(csv.lines().count(), 1 + points.len());
    assert!(
        csv.lines().nth(2).unwrap().starts_with("direct,4,40,0,"),
        "{csv}"
    );
    for svg in ["fanout.svg", "fanout-latency.svg"] {
        let text = std::fs::read_to_string(out.path().join(svg)).unwrap();
        assert!(text.starts_with("<svg"), "{svg}");
    }
}

/// The agents as `abhyasa node` processes: every obligation applied through each process, met
/// directly and at the relay, and each point says so in the CSV.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fanout_sweep_with_agents_as_processes_applies_everything() {
    let (points, out, relay) =
        fanout(vec![3], 30, Some(env!("CARGO_BIN_EXE_abhyasa").into())).await;
    assert_eq!(points.len(), if relay { 2 } else { 1 });
    for p in &points {
        assert!(p.processes, "{p:?}");
        assert_eq!(
            (p.agents, p.obligations, p.not_applied),
            (3, 30, 0),
            "{p:?}"
        );
        assert!(p.per_s > 0.0 && p.p99_ms >= p.p50_ms, "{p:?}");
        // Three agent processes' resident memory is counted: each holds its own runtime,
        // TLS and store, several MiB.
        assert!(p.kib_per_node > 2_048.0, "{p:?}");
        // Read from each process's admin socket: 30 acks went in at least one group.
        assert!((1.0..=30.0).contains(&p.acks_per_group), "{p:?}");
    }
    let csv = std::fs::read_to_string(out.path().join("fanout.csv")).unwrap();
    assert!(csv.lines().next().unwrap().ends_with(",agents_as"), "{csv}");
    let direct = csv.lines().nth(1).unwrap();
    assert!(
        direct.starts_with("direct,3,30,0,") && direct.ends_with(",processes"),
        "{csv}"
    );
}
