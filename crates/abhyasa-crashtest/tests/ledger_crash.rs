//! The ledger with real processes, real redb files, SIGKILL at the paper's named crash cuts.
//!
//! A delegating branch (`root`), a child branch and a gateway run as separate
//! `abhyasa-ledgerpeer` processes over UDP on loopback. One of them at a time is restarted
//! armed with a kill point — after reserve before send; after gateway acceptance before the
//! receipt; during settlement; during transfer acceptance; during recovery itself; or a plain
//! random moment — killed with SIGKILL when it reports reaching it, and started again, while
//! the others keep running. After at least 100 kills all three run undisturbed until both
//! branches have ended every operation; then the independent checker reads the three files
//! and the executor's own record of effects, and must find no violation of L1–L7.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::Command;
use std::time::Duration;

use abhyasa_crashtest::ledgerpeer::{
    agent, keyring, load_branch, load_gateway, op_keys, read_effects, workload_done, LedgerRole,
};
use abhyasa_ledger::check::{audit, audit_gateway, check, Violation, World};
use abhyasa_ledger::{OpState, RootId};

mod common;
use common::{free_udp, Watched};

const KILLS: u32 = 110;

struct Peer {
    role: &'static str,
    db: PathBuf,
    addrs: [SocketAddr; 3],
    proc: Watched,
    mutant: Option<&'static str>,
}

impl Peer {
    fn start(&mut self, kill_at: Option<(&str, u32)>) {
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_abhyasa-ledgerpeer"));
        cmd.args(["--role", self.role])
            .arg("--db")
            .arg(&self.db)
            .args(["--root", &self.addrs[0].to_string()])
            .args(["--child", &self.addrs[1].to_string()])
            .args(["--gw", &self.addrs[2].to_string()]);
        if let Some((point, nth)) = kill_at {
            cmd.args(["--kill-at", point, "--kill-nth", &nth.to_string()]);
        }
        if let Some(m) = self.mutant {
            cmd.args(["--mutant", m]);
        }
        self.proc.spawn(cmd);
    }

    fn wait_for(&self, prefix: &str, limit: Duration) -> bool {
        self.proc.wait_for(prefix, limit)
    }

    fn sigkill(&mut self) {
        self.proc.sigkill();
    }
}

/// The history auditor over the three files: each journal step by step, the gateway's log
/// record by record.
fn history(
    root: &std::path::Path,
    child: &std::path::Path,
    gw: &std::path::Path,
) -> Vec<Violation> {
    use abhyasa_store::{Store, StoreConfig};
    let keys = keyring();
    let mut found = Vec::new();
    for (role, db) in [(LedgerRole::Root, root), (LedgerRole::Child, child)] {
        let store = Store::open(db, StoreConfig::default()).unwrap();
        found.extend(audit(&agent(role), &store.ledger_journal().unwrap(), &keys));
    }
    let store = Store::open(gw, StoreConfig::default()).unwrap();
    found.extend(audit_gateway(
        &agent(LedgerRole::Gw),
        &store.gateway_log().unwrap(),
        &keys,
    ));
    found
}

#[test]
fn sigkill_at_the_named_crash_cuts_breaks_no_ledger_invariant() {
    let dir = tempfile::tempdir().unwrap();
    let addrs = [free_udp(), free_udp(), free_udp()];
    let mut peers = ["root", "child", "gw"].map(|role| Peer {
        role,
        db: dir.path().join(format!("{role}.redb")),
        addrs,
        proc: Watched::none(),
        mutant: None,
    });
    for p in &mut peers {
        p.start(None);
    }
    // (peer index, kill point): every named cut, plus random moments.
    let plan: [(usize, Option<&str>); 9] = [
        (0, Some("after-reserve-before-send")),
        (2, Some("after-acceptance-before-receipt")),
        (1, Some("during-transfer-acceptance")),
        (0, Some("during-settlement")),
        (1, Some("after-reserve-before-send")),
        (1, Some("during-settlement")),
        (2, Some("during-recovery")),
        (0, None),
        (2, None),
    ];
    let mut kills = 0u32;
    let mut reached: BTreeMap<String, u32> = BTreeMap::new();
    let mut step = 0usize;
    while kills < KILLS {
        let (i, point) = plan[step % plan.len()];
        let nth = match point {
            Some("during-recovery") | Some("during-transfer-acceptance") => 1,
            _ => 1 + (step / plan.len()) as u32 % 2,
        };
        step += 1;
        let peer = &mut peers[i];
        peer.sigkill();
        kills += 1;
        peer.start(point.map(|p| (p, nth)));
        let hit = match point {
            Some(_) => peer.wait_for("AT", Duration::from_millis(1_500)),
            None => {
                std::thread::sleep(Duration::from_millis(5 + (step as u64 * 7) % 60));
                true
            }
        };
        let name = if hit {
            format!("{}:{}", peer.role, point.unwrap_or("random-moment"))
        } else {
            format!("{}:{}-not-reached", peer.role, point.unwrap_or("?"))
        };
        *reached.entry(name).or_default() += 1;
        peer.sigkill();
        kills += 1;
        peer.start(None);
    }
    println!("ledger-sigkill: kills={kills} by point: {reached:?}");

    // Undisturbed to the end: both branches end every operation.
    assert!(
        peers[0].wait_for("DONE", Duration::from_secs(90)),
        "the root branch never finished"
    );
    assert!(
        peers[1].wait_for("DONE", Duration::from_secs(60)),
        "the child branch never finished"
    );
    for p in &mut peers {
        p.sigkill();
    }

    let root = load_branch(LedgerRole::Root, &peers[0].db).unwrap();
    let child = load_branch(LedgerRole::Child, &peers[1].db).unwrap();
    let gw = load_gateway(&peers[2].db).unwrap();
    let effects = read_effects(&peers[2].db).unwrap();
    let keys = keyring();
    let mut violations = check(&World {
        branches: &[&root, &child],
        gateways: &[&gw],
        effects: &effects,
        keys: &keys,
    });
    violations.extend(history(&peers[0].db, &peers[1].db, &peers[2].db));
    let mut outcomes: BTreeMap<&str, u32> = BTreeMap::new();
    for (role, b) in [(LedgerRole::Root, &root), (LedgerRole::Child, &child)] {
        assert!(workload_done(role, b), "{role:?} left work undone");
        for k in op_keys(role) {
            let o = b.operation(k).unwrap();
            *outcomes
                .entry(match o.state {
                    OpState::Settled { .. } => "settled",
                    OpState::NoEffect(_) => "no_effect",
                    _ => "other",
                })
                .or_default() += 1;
        }
    }
    let buckets = root.buckets(RootId::from_u128(1));
    println!(
        "ledger-sigkill: outcomes {outcomes:?} effects={} root buckets (A,T,R,Q,C,F)={buckets:?} violations={}",
        effects.len(),
        violations.len()
    );
    assert_eq!(violations, vec![], "the checker found violations");
    assert!(kills >= 100);
    let named: u32 = reached
        .iter()
        .filter(|(k, _)| !k.ends_with("not-reached") && !k.ends_with("random-moment"))
        .map(|(_, v)| v)
        .sum();
    assert!(named >= 30, "only {named} kills at named cuts: {reached:?}");
    for cut in [
        "after-reserve-before-send",
        "after-acceptance-before-receipt",
        "during-settlement",
        "during-transfer-acceptance",
    ] {
        assert!(
            reached.keys().any(|k| k.ends_with(&format!(":{cut}"))),
            "never killed at {cut}: {reached:?}"
        );
    }
    assert!(outcomes.get("settled").copied().unwrap_or(0) > 0);
}

/// The same processes, with the root branch built as the `refund_on_timeout` mutant: the
/// gateway is killed after it accepted (the effect ran) and before its receipt, and stays
/// down past the branch's resend timeout. The mutant refunds the quarantined atoms; the
/// checker, reading the three files, must say so.
#[test]
fn the_checker_catches_a_refunding_branch_across_processes() {
    let dir = tempfile::tempdir().unwrap();
    let addrs = [free_udp(), free_udp(), free_udp()];
    let mut peers = ["root", "child", "gw"].map(|role| Peer {
        role,
        db: dir.path().join(format!("{role}.redb")),
        addrs,
        proc: Watched::none(),
        mutant: (role == "root").then_some("refund_on_timeout"),
    });
    for p in &mut peers {
        p.start(None);
    }
    let mut caught = 0;
    for round in 0..4u32 {
        let gw = &mut peers[2];
        gw.sigkill();
        gw.start(Some(("after-acceptance-before-receipt", 1 + round % 2)));
        let hit = gw.wait_for("AT", Duration::from_millis(3_000));
        gw.sigkill();
        // Down for several resend periods (200 ms each).
        std::thread::sleep(Duration::from_millis(900));
        gw.start(None);
        caught += u32::from(hit);
    }
    let root_exit = peers[0].proc.exited();
    assert!(
        caught > 0,
        "the gateway never reached the cut (the root branch, which drives the work: {})",
        root_exit.map_or("still running".to_string(), |s| format!("ended, {s}"))
    );
    // Let the branches finish (refunds end operations too), then read the files.
    // (The mutant may never finish: the checker reads whatever is durable.)
    let _ = peers[0].wait_for("DONE", Duration::from_secs(15));
    let _ = peers[1].wait_for("DONE", Duration::from_secs(5));
    for p in &mut peers {
        p.sigkill();
    }
    let root = load_branch(LedgerRole::Root, &peers[0].db).unwrap();
    let child = load_branch(LedgerRole::Child, &peers[1].db).unwrap();
    let gw = load_gateway(&peers[2].db).unwrap();
    let effects = read_effects(&peers[2].db).unwrap();
    let keys = keyring();
    let violations = check(&World {
        branches: &[&root, &child],
        gateways: &[&gw],
        effects: &effects,
        keys: &keys,
    });
    println!(
        "ledger-sigkill mutant refund_on_timeout: {} violations, first {:?}",
        violations.len(),
        violations.iter().take(2).collect::<Vec<_>>()
    );
    assert!(
        violations.iter().any(|v| v.law == "L6" || v.law == "L3"),
        "the checker missed the refunding branch: {violations:?}"
    );
}
