//! Real processes, real redb files, SIGKILL at named crash points, many times in one run.
//!
//! A custodian and a receiver run as separate `abhyasa-crashpeer` processes over UDP on
//! loopback. One of them at a time is restarted with a kill point (after persisting pending
//! but before sending; after the receiver's commit but before its ack; during the commit that
//! removes pending records; mid-retry; during recovery itself — or a plain random moment),
//! killed with SIGKILL when it reports reaching it, and started again, while the other keeps
//! running. After at least 200 kills both run undisturbed until the custodian has nothing left
//! under custody; then both files are checked: every obligation terminal, none applied twice
//! (each belief update's weight is its own delta or nothing), applied ids and effects agree,
//! every escalation and revocation with its safe action in force.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::Path;
use std::process::Command;
use std::time::Duration;

use abhyasa_crashtest::crashpeer::{admissible, agent, delta, principal, workload};
use abhyasa_custody::kinds;
use abhyasa_store::{Store, StoreConfig};
use abhyasa_wire::{Outcome, Payload};

mod common;
use abhyasa_testkit::now_ms;
use common::{free_udp as free_port, Watched};

const KILLS: u32 = 210;
const COUNT: u32 = 60;

struct Peer {
    role: &'static str,
    db: std::path::PathBuf,
    listen: SocketAddr,
    peer: SocketAddr,
    epoch: u64,
    proc: Watched,
}

impl Peer {
    fn start(&mut self, kill_at: Option<(&str, u32)>) {
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_abhyasa-crashpeer"));
        cmd.args(["--role", self.role])
            .arg("--db")
            .arg(&self.db)
            .args(["--listen", &self.listen.to_string()])
            .args(["--peer", &self.peer.to_string()])
            .args(["--epoch", &self.epoch.to_string()])
            .args(["--count", &COUNT.to_string()]);
        if let Some((point, nth)) = kill_at {
            cmd.args(["--kill-at", point, "--kill-nth", &nth.to_string()]);
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

#[test]
fn sigkill_at_named_points_loses_nothing_and_applies_nothing_twice() {
    let dir = tempfile::tempdir().unwrap();
    let (caddr, raddr) = (free_port(), free_port());
    let epoch = now_ms() + 300;
    let mut custodian = Peer {
        role: "custodian",
        db: dir.path().join("custodian.redb"),
        listen: caddr,
        peer: raddr,
        epoch,
        proc: Watched::none(),
    };
    let mut receiver = Peer {
        role: "receiver",
        db: dir.path().join("receiver.redb"),
        listen: raddr,
        peer: caddr,
        epoch,
        proc: Watched::none(),
    };
    custodian.start(None);
    receiver.start(None);

    let plan: [(bool, Option<&str>); 8] = [
        (true, Some("after-pending-persist")),
        (false, Some("after-apply-commit")),
        (true, Some("during-terminal-commit")),
        (true, Some("mid-retry")),
        (true, Some("during-recovery")),
        (false, Some("during-recovery")),
        (true, None),
        (false, None),
    ];
    let mut kills = 0u32;
    let mut reached: BTreeMap<String, u32> = BTreeMap::new();
    let mut step = 0usize;
    while kills < KILLS {
        let (is_custodian, point) = plan[step % plan.len()];
        // The n-th time the point is reached (recovery happens once per start).
        let nth = match point {
            Some("during-recovery") => 1,
            _ => 1 + (step / plan.len()) as u32 % 2,
        };
        step += 1;
        let peer = if is_custodian {
            &mut custodian
        } else {
            &mut receiver
        };
        // Restart the peer armed with this kill point, wait for it, kill it there.
        peer.sigkill();
        kills += 1;
        peer.start(point.map(|p| (p, nth)));
        let hit = match point {
            Some(_) => peer.wait_for("AT", Duration::from_millis(1_000)),
            None => {
                std::thread::sleep(Duration::from_millis(5 + (step as u64 * 7) % 40));
                true
            }
        };
        let name = if hit {
            point.unwrap_or("random-moment").to_owned()
        } else {
            format!("{}-not-reached", point.unwrap_or("?"))
        };
        *reached.entry(name).or_default() += 1;
        peer.sigkill();
        kills += 1;
        peer.start(None);
    }
    println!("sigkill: kills={kills} by point: {reached:?}");

    // Undisturbed to the end: the custodian exits when nothing is left under custody.
    let last_deadline = workload(epoch, COUNT)
        .iter()
        .map(|o| o.deadline.0)
        .max()
        .unwrap();
    let budget = Duration::from_millis(last_deadline.saturating_sub(now_ms()) + 30_000);
    assert!(
        custodian.wait_for("DONE", budget),
        "the custodian never finished"
    );
    custodian.sigkill();
    receiver.sigkill();

    check(&custodian.db, &receiver.db, epoch);
    let named: u32 = reached
        .iter()
        .filter(|(k, _)| !k.ends_with("not-reached") && k.as_str() != "random-moment")
        .map(|(_, v)| v)
        .sum();
    assert!(kills >= 200);
    assert!(
        named >= 60,
        "too few kills landed on named points: {reached:?}"
    );
}

fn check(cdb: &Path, rdb: &Path, epoch: u64) {
    let cstore = Store::open(cdb, StoreConfig::default()).unwrap();
    let rstore = Store::open(rdb, StoreConfig::default()).unwrap();
    let mut violations = Vec::new();
    let mut outcomes: BTreeMap<String, u32> = BTreeMap::new();
    assert!(cstore.pending().unwrap().is_empty(), "pending left");
    for (i, o) in workload(epoch, COUNT).into_iter().enumerate() {
        let id = o.id;
        let Some(t) = cstore.terminal(id).unwrap() else {
            violations.push(format!("{id} never reached a terminal state"));
            continue;
        };
        *outcomes.entry(format!("{:?}", t.outcome)).or_default() += 1;
        let applied = rstore.applied(id).unwrap().is_some();
        if t.outcome == Outcome::Applied && !applied {
            violations.push(format!(
                "{id} applied per the custodian, not on the receiver's disk"
            ));
        }
        if o.target != agent() && applied {
            violations.push(format!("{id} applied by an agent that never ran"));
        }
        if let Payload::PhalaBeliefUpdate(p) = &o.payload {
            let w = rstore
                .receiver_state()
                .weight(&principal(), &p.weight_key, o.created_at);
            if w != 0 && w != delta(i as u32) {
                violations.push(format!("{id} applied more than once (weight {w})"));
            }
            if applied != (w != 0) {
                violations.push(format!("{id}: applied id {applied}, weight {w}"));
            }
        }
        if admissible(&o) {
            let safe = kinds::safe(&o, 120_000).unwrap();
            let revocation = !matches!(o.payload, Payload::PhalaBeliefUpdate(_));
            let fail_safe = matches!(t.outcome, Outcome::Escalated(_) | Outcome::Declined(_));
            if (revocation || fail_safe) && !cstore.principal().holds(&safe) {
                violations.push(format!(
                    "{id}: safe action not in force after {:?}",
                    t.outcome
                ));
            }
        }
    }
    for e in cstore.escalations().unwrap() {
        if !cstore.principal().holds(&e.safe_action) {
            violations.push(format!(
                "escalation of {} without its safe action",
                e.obligation_id
            ));
        }
    }
    println!(
        "sigkill: outcomes {outcomes:?} violations={}",
        violations.len()
    );
    assert!(violations.is_empty(), "{violations:#?}");
    assert!(outcomes.contains_key("Applied"), "{outcomes:?}");
    assert!(
        outcomes.keys().any(|k| k.starts_with("Escalated")),
        "{outcomes:?}"
    );
}
