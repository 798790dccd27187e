//! A full store is an answer, not a silence: with its store on a disk that fails every write
//! with ENOSPC until told otherwise (`FaultPlan::NoSpace`, no file system needed), a principal
//! refuses new work with `NodeError::StoreFull`, keeps answering `status`, retries its commits
//! with backoff (not in a tight loop), loses nothing it had accepted, and takes work again once
//! space returns. `tests/disk_full.rs` shows the same on a real full tmpfs where it can mount.

mod common;

use std::time::{Duration, Instant};

use abhyasa_custody::Admission;
use abhyasa_moq::Ca;
use abhyasa_node::{Ask, Limits, Node, NodeError, Verdict};
use abhyasa_store::{Store, StoreConfig};
use abhyasa_testkit::fault::{FaultPlan, FaultyBackend};
use abhyasa_wire::{ObligationId, Outcome, TokenId};
use common::{custodian, free_addr, id, revoke};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_store_without_space_refuses_clearly_answers_status_and_recovers() {
    let dir = tempfile::tempdir().unwrap();
    let a = id("agent-1");
    let (_agent, principal, disk) = on_a_faulty_disk(dir.path(), Limits::default()).await;
    let applied = |h: abhyasa_node::IssueHandle| async move {
        let (record, _) = tokio::time::timeout(Duration::from_secs(10), h.outcome())
            .await
            .expect("an outcome in time")
            .expect("the node runs");
        record.outcome
    };
    let h = principal.issue(revoke(1, &a, 20_000)).await.unwrap();
    assert_eq!(applied(h).await, Outcome::Applied);

    // The file system fills: issues go on while the store rewrites pages it already has, until
    // a commit needs new space and fails. Each issue is answered, never left hanging.
    disk.arm(FaultPlan::NoSpace);
    let mut n = 100;
    loop {
        n += 1;
        let answer = tokio::time::timeout(
            Duration::from_secs(5),
            principal.issue(revoke(n, &a, 20_000)),
        )
        .await
        .expect("the issue is answered, not left hanging");
        if answer.is_err() {
            break;
        }
        assert!(n < 2_000, "no commit needed new space in 1,900 issues");
    }
    assert!(disk.refused_for_space() > 0);
    // From now on new work is refused at once, naming the store and why.
    let t = Instant::now();
    match principal.issue(revoke(3, &a, 20_000)).await {
        Err(NodeError::StoreFull { cause, .. }) => {
            assert!(cause.contains("os error 28"), "{cause}")
        }
        other => panic!("expected StoreFull, got {other:?}"),
    }
    assert!(t.elapsed() < Duration::from_secs(2), "refused at once");
    // Status answers, and says the store is full.
    let status = tokio::time::timeout(Duration::from_secs(2), principal.status())
        .await
        .expect("status answered while full")
        .unwrap();
    assert!(status.store_full.is_some(), "{:?}", status.store_full);
    // While full, commits are retried with backoff, not in a loop: over two seconds, a handful
    // of attempts (each refused write counted), never thousands.
    let before = disk.refused_for_space();
    tokio::time::sleep(Duration::from_secs(2)).await;
    let attempts = disk.refused_for_space() - before;
    assert!(
        attempts < 100,
        "{attempts} refused writes in 2 s: a tight loop"
    );

    // Space returns: the node takes work again, and what it applied before is still known.
    disk.arm(FaultPlan::None);
    let back = Instant::now() + Duration::from_secs(40);
    let h = loop {
        match principal.issue(revoke(4, &a, 20_000)).await {
            Ok(h) => break h,
            Err(NodeError::StoreFull { .. }) if Instant::now() < back => {
                tokio::time::sleep(Duration::from_millis(100)).await
            }
            Err(e) => panic!("still refused after space returned: {e}"),
        }
    };
    assert_eq!(applied(h).await, Outcome::Applied);
    let status = principal.status().await.unwrap();
    assert!(status.store_full.is_none(), "{:?}", status.store_full);
    assert!(
        status
            .recent
            .iter()
            .any(|t| t.obligation_id == abhyasa_wire::ObligationId::from_u128(1)),
        "the obligation applied before the disk filled is still recorded"
    );
}

/// A hung disk is a deadline, not a silence: with its store's syncs stalled
/// (`FaultPlan::Stall`), a principal answers `status`, `honours` and `issue` with
/// `NodeError::NoAnswer` once `answer_within` has passed, instead of never. Another node on
/// the same runtime goes on answering, and dropping the stalled node returns. Once the disk
/// answers, the same obligation issued again is taken and applied, once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hung_disk_is_answered_at_the_deadline_and_holds_no_one_else() {
    let dir = tempfile::tempdir().unwrap();
    let a = id("agent-1");
    let within = Duration::from_millis(300);
    let limits = Limits {
        answer_within: within,
        ..Limits::default()
    };
    let (agent, principal, disk) = on_a_faulty_disk(dir.path(), limits).await;
    // Each call must end by itself; a call past 10 s is a hang.
    let ends = Duration::from_secs(10);

    disk.arm(FaultPlan::Stall);
    let asked = Instant::now();
    let issued = tokio::time::timeout(ends, principal.issue(revoke(1, &a, 30_000)))
        .await
        .expect("issue ends by itself");
    assert!(no_answer(&issued, within), "{:?}", issued.map(|h| h.id()));
    assert!(asked.elapsed() >= within, "ended before its deadline");
    let status = tokio::time::timeout(ends, principal.status())
        .await
        .expect("status ends by itself");
    assert!(no_answer(&status, within), "{:?}", status.map(|s| s.at));
    let honours = tokio::time::timeout(ends, principal.honours())
        .await
        .expect("honours ends by itself");
    assert!(no_answer(&honours, within), "{honours:?}");
    // Decisions need no commit: the core answers them while the commit hangs. The
    // revocation taken into memory before the disk hung is already in force (its fail-safe
    // refuses; the caller of `issue` was told "no answer", and issues it again below).
    let unrelated = tokio::time::timeout(
        ends,
        principal.decide(Ask::Token(TokenId::new("tok-unrelated").unwrap())),
    )
    .await
    .expect("decide is answered while the disk hangs")
    .unwrap();
    assert_eq!(unrelated, Verdict::NotGoverned);
    let revoked = tokio::time::timeout(
        ends,
        principal.decide(Ask::Token(TokenId::new("tok-1").unwrap())),
    )
    .await
    .expect("decide is answered while the disk hangs")
    .unwrap();
    assert!(matches!(revoked, Verdict::Refuse(_)), "{revoked:?}");
    // Nothing else on this runtime waits on that disk: the agent answers at once.
    let other = tokio::time::timeout(ends, agent.status())
        .await
        .expect("the other node answers")
        .unwrap();
    assert_eq!(other.agent, a);

    // The disk answers: the same obligation issued again is taken (or found taken), and
    // applied once.
    disk.arm(FaultPlan::None);
    let h = tokio::time::timeout(ends, principal.issue(revoke(1, &a, 30_000)))
        .await
        .expect("issue ends by itself")
        .expect("taken once the disk answers");
    let (record, _) = tokio::time::timeout(ends, h.outcome())
        .await
        .expect("an outcome in time")
        .expect("the node runs");
    assert_eq!(record.outcome, Outcome::Applied);
    assert!(principal.status().await.unwrap().pending.is_empty());

    // Dropping a node whose disk hangs returns (its writer is left to finish on its own).
    disk.arm(FaultPlan::Stall);
    let stalled = tokio::time::timeout(ends, principal.issue(revoke(2, &a, 30_000))).await;
    assert!(matches!(stalled, Ok(Err(NodeError::NoAnswer { .. }))));
    let dropped = tokio::task::spawn_blocking(move || drop(principal));
    tokio::time::timeout(Duration::from_secs(30), dropped)
        .await
        .expect("dropping the stalled node returns")
        .unwrap();
    disk.arm(FaultPlan::None);
}

fn no_answer<T>(r: &Result<T, NodeError>, within: Duration) -> bool {
    matches!(r, Err(NodeError::NoAnswer { within: w }) if *w == within)
}

/// An agent on its own files, and a principal peered with it whose store is on a disk that
/// fails on cue (no fault armed yet).
async fn on_a_faulty_disk(dir: &std::path::Path, limits: Limits) -> (Node, Node, FaultyBackend) {
    pair(dir, Faulty::Principal, custodian(), limits).await
}

/// Which node's store is on the faulty disk.
#[derive(PartialEq)]
enum Faulty {
    Principal,
    Agent,
}

/// An agent and a principal peered with it (custody by `custodian`), each on its own files
/// but for the `faulty` one, whose store is on a disk that fails on cue (no fault armed yet).
async fn pair(
    dir: &std::path::Path,
    faulty: Faulty,
    custodian: abhyasa_custody::CustodianConfig,
    limits: Limits,
) -> (Node, Node, FaultyBackend) {
    let ca = Ca::generate("t").unwrap();
    let (p, a) = (id("principal"), id("agent-1"));
    let a_addr = free_addr();
    let disk = FaultyBackend::new(FaultPlan::None);
    let on = |b: abhyasa_node::NodeBuilder, side| match side == faulty {
        true => b.store_backend(disk.clone()),
        false => b,
    };
    let agent = on(Node::builder(ca.issue(&a).unwrap()), Faulty::Agent)
        .listen(a_addr)
        .state_dir(dir.join("a"))
        .build()
        .await
        .unwrap();
    let principal = on(Node::builder(ca.issue(&p).unwrap()), Faulty::Principal)
        .peer(a, a_addr)
        .state_dir(dir.join("p"))
        .custodian(custodian)
        .limits(limits)
        .build()
        .await
        .unwrap();
    (agent, principal, disk)
}

/// Waits until a commit is held on `disk`; fails with `never` after 10 s.
async fn until_stalled(disk: &FaultyBackend, never: &str) {
    let stalled = Instant::now();
    while disk.stalled() == 0 {
        assert!(stalled.elapsed() < Duration::from_secs(10), "{never}");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

/// Issues obligation 1 to `a` and waits until it is applied: the session is up.
async fn first_applied(principal: &Node, a: &abhyasa_wire::AgentId) {
    let first = principal.issue(revoke(1, a, 60_000)).await.unwrap();
    let (record, _) = tokio::time::timeout(Duration::from_secs(10), first.outcome())
        .await
        .expect("the session comes up")
        .unwrap();
    assert_eq!(record.outcome, Outcome::Applied);
}

/// While its commit waits on the disk, a node goes on taking what its sessions bring, and the
/// records of what it took are committed as soon as that commit ends — not when something
/// else happens to wake the node. The agent's disk stalls in the commit of obligation 2;
/// obligation 3 arrives meanwhile. Once the disk answers, both are applied at once (the
/// principal re-sends nothing for 20 s, so only the agent's own next commit can apply 3).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn what_arrives_during_a_commit_is_committed_right_after_it() {
    let dir = tempfile::tempdir().unwrap();
    let a = id("agent-1");
    let custody = abhyasa_custody::CustodianConfig {
        response_timeout_ms: 20_000,
        ..custodian()
    };
    let (agent, principal, disk) =
        pair(dir.path(), Faulty::Agent, custody, Limits::default()).await;
    first_applied(&principal, &a).await;

    disk.arm(FaultPlan::Stall);
    let second = principal.issue(revoke(2, &a, 60_000)).await.unwrap();
    until_stalled(&disk, "the agent never committed obligation 2").await;
    let third = principal.issue(revoke(3, &a, 60_000)).await.unwrap();
    while principal.status().await.unwrap().sent.objects < 3 {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    // On loopback it is at the agent well within this.
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(disk.stalled(), 1, "the agent's commit is still held");

    disk.arm(FaultPlan::None);
    let answered = Instant::now();
    for (n, h) in [(2, second), (3, third)] {
        let (record, _) = tokio::time::timeout(Duration::from_secs(5), h.outcome())
            .await
            .unwrap_or_else(|_| panic!("obligation {n} not applied 5 s after the disk answered"))
            .unwrap();
        assert_eq!(record.outcome, Outcome::Applied, "obligation {n}");
        assert_eq!(record.attempts, 1, "obligation {n} was not re-sent");
    }
    println!(
        "both applied {:?} after the disk answered",
        answered.elapsed()
    );
    principal.shutdown().await;
    agent.shutdown().await;
}

/// An issue of an id whose first issue still waits for its commit is answered with the first,
/// never `Custody` before the record is durable. Both issues of obligation 2 are put off behind
/// a held commit and taken in one batch; their own commit then fails (the disk dies at its
/// sync). A caller told `Custody` must find obligation 2 on what the disk kept; before the
/// second issue waited with the first, it was told `Custody` at once and the disk had nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_second_issue_of_an_id_is_answered_with_the_first() {
    let dir = tempfile::tempdir().unwrap();
    let a = id("agent-1");
    let (agent, principal, disk) = pair(
        dir.path(),
        Faulty::Principal,
        custodian(),
        Limits::default(),
    )
    .await;
    first_applied(&principal, &a).await;

    disk.arm(FaultPlan::Stall);
    let issue = |n: u128| {
        let (principal, a) = (principal.clone(), a.clone());
        tokio::spawn(async move { principal.issue(revoke(n, &a, 60_000)).await })
    };
    let held = issue(5);
    until_stalled(&disk, "the principal never committed obligation 5").await;
    let (twice, again) = (issue(2), issue(2));
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(!twice.is_finished() && !again.is_finished(), "put off");
    // The held sync (obligation 5's commit) lands; the next one, obligation 2's, fails.
    disk.arm(FaultPlan::FailSync(2));
    assert_eq!(held.await.unwrap().unwrap().admission(), Admission::Custody);
    let answers = [twice.await.unwrap(), again.await.unwrap()];
    drop((principal, agent));
    let kept = Store::open_backend(disk.power_cycle(FaultPlan::None), StoreConfig::default())
        .unwrap()
        .knows(ObligationId::from_u128(2))
        .unwrap();
    for h in answers.iter().flatten() {
        assert!(
            kept,
            "told {:?} for obligation 2, which the disk does not hold",
            h.admission()
        );
    }
    assert!(!kept, "the commit of obligation 2 failed: {answers:?}");
}
