//! Budget-gated tools over MCP: the caller's own ledger branch reserves and signs a dispatch
//! permit, the permit rides the `tools/call`, the MCP server is the ledger's gateway (this
//! node), the tool runs once, and the receipt on the result settles the caller's branch.
//! Expected amounts are written out here, not read back from the code under test.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, OnceLock};

use abhyasa_ledger::{
    Branch, BranchConfig, CreditId, Dim, Keyring, Label, LedgerMessage, LedgerSigningKey, OpKey,
    OpState, Permit, Receipt, RootGrant, RootId, Signed, Vector,
};
use abhyasa_mcp::{
    permit_to_meta, receipt_from_meta, tool_effect, AgentServer, BudgetedCallError, Governance,
    PrincipalClient, ToolBudget, META_PERMIT,
};
use abhyasa_moq::{Ca, Identity, Signer};
use abhyasa_node::{Executor, LedgerCommand, LedgerReply, LedgerSetup, Limits, Node, NodeError};
use abhyasa_testkit::fault::{FaultPlan, FaultyBackend};
use abhyasa_wire::{encode, UnixMillis};
use rmcp::model::{CallToolRequestParams, CallToolResult, RequestMetaObject};
use rmcp::service::RunningService;
use rmcp::RoleClient;
use serde_json::{json, Map, Value};

mod common;
use common::{connect, host_tool, id};

/// One deployment for these tests: a CA and the certificate of everyone who signs ledger
/// messages (a node signs with its certificate's key).
fn ident(name: &str) -> Identity {
    static D: OnceLock<BTreeMap<&'static str, Identity>> = OnceLock::new();
    D.get_or_init(|| {
        let ca = Ca::generate("t").unwrap();
        ["issuer", "principal", "mallory", "agent-1"]
            .into_iter()
            .map(|n| (n, ca.issue(&id(n)).unwrap()))
            .collect()
    })[name]
        .clone()
}

fn key(name: &str) -> LedgerSigningKey {
    Signer::new(&ident(name)).unwrap().key().clone()
}

fn keyring() -> Keyring {
    Keyring::new(
        ["issuer", "principal", "mallory", "agent-1"].map(|n| (id(n), key(n).verifying_key())),
    )
    .with_issuers([id("issuer")])
}

fn cents(n: u64) -> Vector {
    Vector::of(&[("cents", n)]).unwrap()
}

fn budget() -> ToolBudget {
    ToolBudget {
        purpose: Dim::new("travel").unwrap(),
        max_cost: cents(25),
    }
}

/// Effects only a restart would hand the executor (resumed ones); none here.
struct NoResumes(Arc<AtomicU32>);

impl Executor for NoResumes {
    fn execute(&self, run: &abhyasa_ledger::Execute) -> Vector {
        self.0.fetch_add(1, Ordering::SeqCst);
        run.max_charge.clone()
    }
}

/// The wall clock, as the node's gateway reads it.
fn wall_clock() -> UnixMillis {
    let since = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap();
    UnixMillis(since.as_millis() as u64)
}

const CREDIT: CreditId = CreditId::from_u128(1);

/// A branch for `who` holding a root grant of 100 cents for travel.
fn branch(who: &str) -> Branch {
    // Permits that expire in an hour of real time: the gateway forgets settled acceptances,
    // so it takes only permits that expire.
    branch_at(who, wall_clock(), 3_600_000)
}

fn settle_persists(b: &mut Branch) {
    while let Some((t, _)) = b.poll_persist() {
        b.handle_persisted(t);
    }
}

/// Reserves the call of `book` with `args` under `k` and returns the permit it dispatches.
fn permit(b: &mut Branch, args: &Map<String, Value>, k: u128) -> Signed<Permit> {
    let k = OpKey::from_u128(k);
    b.reserve(
        UnixMillis(0), // Counts from the branch's own clock (`branch_at`) when later.
        CREDIT,
        tool_effect("book", args, &budget()),
        &id("agent-1"),
        k,
    )
    .unwrap();
    b.dispatch(UnixMillis(1), k).unwrap();
    settle_persists(b);
    std::iter::from_fn(|| b.poll_transmit())
        .find_map(|(to, m)| match m {
            LedgerMessage::Dispatch { permit, .. } if to == id("agent-1") => Some(permit),
            _ => None,
        })
        .expect("the branch dispatches once its reservation is durable")
}

fn call(args: &Map<String, Value>, permit: Option<Value>) -> CallToolRequestParams {
    let mut p = CallToolRequestParams::new("book").with_arguments(args.clone());
    if let Some(v) = permit {
        let mut meta = RequestMetaObject::new();
        meta.0.insert(META_PERMIT.into(), v);
        p.meta = Some(meta);
    }
    p
}

fn text(r: &CallToolResult) -> String {
    r.content
        .iter()
        .filter_map(|c| c.as_text().map(|t| t.text.clone()))
        .collect()
}

struct Fixture {
    _dir: tempfile::TempDir,
    node: Node,
    client: RunningService<RoleClient, ()>,
    runs: Arc<AtomicU32>,
    executor_runs: Arc<AtomicU32>,
}

async fn fixture() -> Fixture {
    let dir = tempfile::tempdir().unwrap();
    let executor_runs = Arc::new(AtomicU32::new(0));
    let node = Node::builder(ident("agent-1"))
        .state_dir(dir.path().join("agent"))
        .ledger(LedgerSetup {
            keys: keyring(),
            executor: Some(Arc::new(NoResumes(executor_runs.clone()))),
            resend_ms: 500,
            max_journal_steps: abhyasa_ledger::BranchConfig::default().max_journal_steps,
            checkpoint_steps: abhyasa_ledger::BranchConfig::default().checkpoint_steps,
            permit_ttl_ms: 60_000,
            gateway_retain_ms: Some(60_000),
        })
        .build()
        .await
        .unwrap();
    let runs = Arc::new(AtomicU32::new(0));
    let server = AgentServer::new(node.clone(), id("principal")).tool(host_tool(
        "book",
        Governance {
            budget: Some(budget()),
            ..Governance::default()
        },
        runs.clone(),
    ));
    let (client, _server) = connect(server).await;
    Fixture {
        _dir: dir,
        node,
        client,
        runs,
        executor_runs,
    }
}

impl Fixture {
    async fn call(&self, params: CallToolRequestParams) -> CallToolResult {
        self.client.call_tool(params).await.unwrap()
    }
}

fn args(to: &str) -> Map<String, Value> {
    json!({"to": to, "class": "economy"})
        .as_object()
        .cloned()
        .unwrap()
}

#[tokio::test]
async fn a_priced_tool_runs_once_per_permit_and_its_receipt_settles_the_callers_branch() {
    let f = fixture().await;
    let lhr = args("LHR");

    // No permit: refused, nothing runs.
    let r = f.client.call_tool(call(&lhr, None)).await.unwrap();
    assert_eq!(r.is_error, Some(true));
    assert!(text(&r).contains("dispatch permit"), "{}", text(&r));
    assert_eq!(f.runs.load(Ordering::SeqCst), 0);

    // The caller's branch reserves the call's maximum before it sends.
    let mut b = branch("principal");
    let p = permit(&mut b, &lhr, 1);
    let before = b.buckets(RootId::from_u128(7));
    assert_eq!(before[0], cents(75), "available after reserve");
    assert_eq!(
        before[3],
        cents(25),
        "dispatched: quarantined until evidence"
    );

    let r = f.call(call(&lhr, Some(permit_to_meta(&p)))).await;
    assert_ne!(r.is_error, Some(true), "{}", text(&r));
    assert_eq!(text(&r), "book ran");
    assert_eq!(f.runs.load(Ordering::SeqCst), 1);
    let meta = r.meta.as_ref().expect("a result _meta");
    let receipt = receipt_from_meta(&meta.0).unwrap().expect("a receipt");
    let body: Receipt = keyring().open(&receipt, &id("agent-1")).unwrap();
    assert_eq!(body.key, OpKey::from_u128(1));
    assert_eq!(body.actual, cents(25));

    // The receipt settles the branch: 25 committed, 75 available, nothing reserved.
    b.handle_message(
        UnixMillis(2),
        &id("agent-1"),
        LedgerMessage::Receipt(receipt.clone()),
    );
    settle_persists(&mut b);
    let op = b.operation(OpKey::from_u128(1)).unwrap();
    assert!(
        matches!(op.state, OpState::Settled { .. }),
        "{:?}",
        op.state
    );
    let buckets = b.buckets(RootId::from_u128(7));
    assert_eq!(buckets[0], cents(75));
    assert_eq!(buckets[2], Vector::default(), "reserved");
    assert_eq!(buckets[3], Vector::default(), "quarantined");
    assert_eq!(buckets[4], cents(25), "committed");

    // A replay (a new JSON-RPC request, the same permit) gets the first receipt and runs
    // nothing.
    let r = f.call(call(&lhr, Some(permit_to_meta(&p)))).await;
    assert_ne!(r.is_error, Some(true), "{}", text(&r));
    assert!(text(&r).contains("does not run again"), "{}", text(&r));
    let again = receipt_from_meta(&r.meta.as_ref().unwrap().0)
        .unwrap()
        .unwrap();
    assert_eq!(encode(&again), encode(&receipt));
    assert_eq!(f.runs.load(Ordering::SeqCst), 1);

    // The same permit for other arguments does not bind that call.
    let r = f.call(call(&args("CDG"), Some(permit_to_meta(&p)))).await;
    assert_eq!(r.is_error, Some(true));
    assert!(text(&r).contains("does not bind this call"), "{}", text(&r));

    // A permit signed by another member, presented in the principal's session.
    let mut m = branch("mallory");
    let foreign = permit(&mut m, &lhr, 2);
    let r = f.call(call(&lhr, Some(permit_to_meta(&foreign)))).await;
    assert_eq!(r.is_error, Some(true));
    assert!(text(&r).contains("not signed by you"), "{}", text(&r));

    // Not a permit at all.
    let r = f.call(call(&lhr, Some(json!("AAEC")))).await;
    assert_eq!(r.is_error, Some(true));
    assert!(text(&r).contains(META_PERMIT), "{}", text(&r));

    assert_eq!(
        f.runs.load(Ordering::SeqCst),
        1,
        "only the permitted call ran"
    );
    assert_eq!(
        f.executor_runs.load(Ordering::SeqCst),
        0,
        "the tool ran it, not the executor"
    );
    let Ok(LedgerReply::Status(s)) = f.node.ledger(LedgerCommand::Status).await else {
        panic!("status");
    };
    assert_eq!(s.accepted, vec![(OpKey::from_u128(1), true)]);
}

#[tokio::test]
async fn a_second_permit_is_a_second_run_and_a_reused_key_for_another_call_is_refused() {
    let f = fixture().await;
    let mut b = branch("principal");
    let first = permit(&mut b, &args("LHR"), 1);
    let second = permit(&mut b, &args("LHR"), 2);
    for p in [&first, &second] {
        let r = f
            .client
            .call_tool(call(&args("LHR"), Some(permit_to_meta(p))))
            .await
            .unwrap();
        assert_eq!(text(&r), "book ran");
    }
    assert_eq!(f.runs.load(Ordering::SeqCst), 2);
    // Another branch of the same payer state cannot reuse key 1 for another call: a fresh
    // branch signs a permit for CDG under key 1.
    let mut other = branch("principal");
    let conflicting = permit(&mut other, &args("CDG"), 1);
    let r = f
        .call(call(&args("CDG"), Some(permit_to_meta(&conflicting))))
        .await;
    assert_eq!(r.is_error, Some(true));
    assert!(
        text(&r).contains("already used for another call"),
        "{}",
        text(&r)
    );
    assert_eq!(f.runs.load(Ordering::SeqCst), 2);
}

/// The caller's node: a ledger branch (no gateway) holding the root grant of 100 cents for
/// travel, and the MCP client to agent-1 over `f`'s session.
async fn principal_node(
    f: &Fixture,
    builder: abhyasa_node::NodeBuilder,
) -> (Node, PrincipalClient) {
    let principal = builder
        .ledger(LedgerSetup {
            keys: keyring(),
            executor: None,
            resend_ms: 50,
            max_journal_steps: abhyasa_ledger::BranchConfig::default().max_journal_steps,
            checkpoint_steps: abhyasa_ledger::BranchConfig::default().checkpoint_steps,
            permit_ttl_ms: 60_000,
            gateway_retain_ms: Some(60_000),
        })
        .build()
        .await
        .unwrap();
    let grant = RootGrant {
        root: RootId::from_u128(7),
        issuer: id("issuer"),
        holder: id("principal"),
        budget: cents(100),
        label: Label::of(&["travel"]).unwrap(),
        issued_at: UnixMillis(0),
    };
    principal
        .ledger(LedgerCommand::Grant {
            grant: Signed::sign(&grant, &grant.issuer, &key("issuer")),
            credit: CREDIT,
        })
        .await
        .unwrap();
    let mcp = PrincipalClient::attach(
        principal.clone(),
        id("agent-1"),
        f.client.peer().clone(),
        std::time::Duration::from_millis(500),
    )
    .await
    .unwrap();
    (principal, mcp)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_callers_node_reserves_carries_the_permit_and_settles_from_the_receipt() {
    let f = fixture().await;
    let dir = tempfile::tempdir().unwrap();
    let builder = Node::builder(ident("principal")).state_dir(dir.path().join("principal"));
    let (principal, mcp) = principal_node(&f, builder).await;
    let book = |to: &str| CallToolRequestParams::new("book").with_arguments(args(to));

    let first = mcp
        .call_budgeted(book("LHR"), CREDIT, OpKey::from_u128(1), &budget())
        .await
        .unwrap();
    assert_eq!(text(&first.result), "book ran");
    assert_eq!(first.state, "settled");
    // Retried under the same key (say the answer was lost): the same permit, the first
    // receipt, no second run.
    let again = mcp
        .call_budgeted(book("LHR"), CREDIT, OpKey::from_u128(1), &budget())
        .await
        .unwrap();
    assert_eq!(
        again.receipt.as_ref().map(encode),
        first.receipt.as_ref().map(encode)
    );
    assert_eq!(f.runs.load(Ordering::SeqCst), 1);

    // 100 cents buy four calls at 25; the fifth is refused by the caller's own branch and
    // never reaches the tool.
    for k in 2..=4u128 {
        let c = mcp
            .call_budgeted(book("CDG"), CREDIT, OpKey::from_u128(k), &budget())
            .await
            .unwrap();
        assert_eq!(c.state, "settled", "call {k}");
    }
    let fifth = mcp
        .call_budgeted(book("CDG"), CREDIT, OpKey::from_u128(5), &budget())
        .await;
    assert!(
        matches!(fifth, Err(BudgetedCallError::Ledger(_))),
        "{fifth:?}"
    );
    assert_eq!(f.runs.load(Ordering::SeqCst), 4);
    let Ok(LedgerReply::Status(s)) = principal.ledger(LedgerCommand::Status).await else {
        panic!("status");
    };
    let (_, buckets) = &s.roots[0];
    assert_eq!(buckets[0], Vector::default(), "available");
    assert_eq!(buckets[3], Vector::default(), "quarantined");
    assert_eq!(buckets[4], cents(100), "committed");
    assert_eq!(
        s.operations.iter().filter(|o| o.state == "settled").count(),
        4
    );
}

/// The caller's disk stops answering: the permit never becomes durable, and the budgeted call
/// ends with a typed error at the node's deadline instead of waiting for ever (it used to wait
/// with no deadline). The tool never ran. Once the disk answers, the same key gets its permit
/// and the call runs once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_permit_that_never_becomes_durable_ends_no_answer_at_the_deadline() {
    let f = fixture().await;
    let dir = tempfile::tempdir().unwrap();
    let disk = FaultyBackend::new(FaultPlan::None);
    let within = std::time::Duration::from_millis(300);
    let builder = Node::builder(ident("principal"))
        .state_dir(dir.path().join("principal"))
        .store_backend(disk.clone())
        .limits(Limits {
            answer_within: within,
            ..Limits::default()
        });
    let (_principal, mcp) = principal_node(&f, builder).await;
    let book = CallToolRequestParams::new("book").with_arguments(args("LHR"));

    disk.arm(FaultPlan::Stall);
    let asked = std::time::Instant::now();
    let stalled = tokio::time::timeout(
        std::time::Duration::from_secs(10),
        mcp.call_budgeted(book.clone(), CREDIT, OpKey::from_u128(1), &budget()),
    )
    .await
    .expect("the call ends by itself, at its deadline");
    assert!(
        matches!(
            stalled,
            Err(BudgetedCallError::Ledger(NodeError::NoAnswer { within: w })) if w == within
        ),
        "{stalled:?}"
    );
    assert!(asked.elapsed() >= within, "ended before its deadline");
    assert_eq!(f.runs.load(Ordering::SeqCst), 0, "no permit, no run");

    disk.arm(FaultPlan::None);
    let until = std::time::Instant::now() + std::time::Duration::from_secs(10);
    let answered = loop {
        match mcp
            .call_budgeted(book.clone(), CREDIT, OpKey::from_u128(1), &budget())
            .await
        {
            // The stalled dispatch is still being made: ask again.
            Err(BudgetedCallError::Ledger(NodeError::IssueAgain { .. }))
                if std::time::Instant::now() < until =>
            {
                tokio::time::sleep(std::time::Duration::from_millis(50)).await
            }
            other => break other.expect("the same key is answered once the disk answers"),
        }
    };
    assert_eq!(text(&answered.result), "book ran");
    assert_eq!(answered.state, "settled");
    assert_eq!(f.runs.load(Ordering::SeqCst), 1);
}

/// A branch for `who` whose clock reads `at`: its permits expire `ttl_ms` after that.
fn branch_at(who: &str, at: UnixMillis, ttl_ms: u64) -> Branch {
    let config = BranchConfig {
        permit_ttl_ms: ttl_ms,
        ..BranchConfig::default()
    };
    let mut b = Branch::new(id(who), key(who), keyring(), config);
    b.handle_timeout(at); // The branch's clock now reads `at`.
    let grant = RootGrant {
        root: RootId::from_u128(7),
        issuer: id("issuer"),
        holder: id(who),
        budget: cents(100),
        label: Label::of(&["travel"]).unwrap(),
        issued_at: UnixMillis(0),
    };
    b.grant(Signed::sign(&grant, &grant.issuer, &key("issuer")), CREDIT)
        .unwrap();
    settle_persists(&mut b);
    b
}

/// Reproduced from outside: a freshly started server ran a priced tool under a permit that
/// had expired an hour before, and kept running tools under expired permits while calls came
/// at least every half second (its gateway's clock moved only on a timer that steady
/// traffic starved). Both are refused now, naming the expiry.
#[tokio::test]
async fn an_expired_permit_runs_nothing_on_a_fresh_server_or_under_steady_calls() {
    let f = fixture().await;
    let an_hour_ago = UnixMillis(wall_clock().0 - 3_600_000);
    let mut old = branch_at("principal", an_hour_ago, 60_000);
    let stale = permit(&mut old, &args("LHR"), 1);
    let r = f
        .call(call(&args("LHR"), Some(permit_to_meta(&stale))))
        .await;
    assert_eq!(r.is_error, Some(true), "{}", text(&r));
    assert!(text(&r).contains("expired"), "{}", text(&r));
    assert_eq!(f.runs.load(Ordering::SeqCst), 0);

    // A permit valid for 1.5 s, presented after 2 s during which calls arrive every 0.4 s.
    let mut b = branch_at("principal", wall_clock(), 1_500);
    let short = permit(&mut b, &args("CDG"), 2);
    for _ in 0..5 {
        let r = f.call(call(&args("NRT"), None)).await;
        assert_eq!(r.is_error, Some(true), "no permit: refused");
        tokio::time::sleep(std::time::Duration::from_millis(400)).await;
    }
    let r = f
        .call(call(&args("CDG"), Some(permit_to_meta(&short))))
        .await;
    assert_eq!(r.is_error, Some(true), "{}", text(&r));
    assert!(text(&r).contains("expired"), "{}", text(&r));
    assert_eq!(f.runs.load(Ordering::SeqCst), 0, "nothing ran");
}
