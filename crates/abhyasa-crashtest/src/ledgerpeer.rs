//! The ledger crash-test peer: a delegating branch (`root`), a child branch (`child`) or a
//! gateway (`gw`) as a real process, on a real redb store with group commit, talking over UDP
//! on loopback, that stops dead at the paper's named crash cuts so a test can SIGKILL it there
//! (`tests/ledger_crash.rs`).
//!
//! This is a test harness, not the node runtime: the UDP channel carries no identities (the
//! first byte names the sender; signatures are still checked on every object), the keys are
//! derived from the agent names, and the workload is fixed: `root` holds a grant of 14,000
//! cents, seals five transfers of 1,500 cents to `child` spread over its run, and both spend
//! in operations of at most 10 cents at `gw` (600 each, one every 25 ms at most); a dispatch
//! unanswered for two seconds is reclaimed by an epoch fence.
//!
//! The gateway's executor keeps its own append-only, fsynced record of every effect that
//! ran (`<db>.effects`: one `key charge` line each) — the ground truth the checker holds the
//! ledger to.

use std::collections::BTreeMap;
use std::fs::{File, OpenOptions};
use std::io::Write;
use std::net::{SocketAddr, UdpSocket};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use abhyasa_ledger::check::EffectInstance;
use abhyasa_ledger::{
    signing_key, Branch, BranchConfig, CreditId, Dim, Effect, Gateway, Keyring, Label,
    LedgerMessage, LedgerMutation, LedgerSigningKey, OpKey, OpState, OutgoingState, RootGrant,
    RootId, Signed, Step, TransferId, Vector,
};
use abhyasa_store::{GroupCommit, GroupError, Op, Store, StoreConfig, StoreError};

use crate::killpoint::{now, open_group, Points};
use abhyasa_wire::{decode, encode, AgentId, UnixMillis};

/// Where a peer can be told to stop for its kill.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum LedgerKillPoint {
    /// Branch: a reserve and its dispatch are committed; the permit was not sent (pauses).
    AfterReserveBeforeSend,
    /// Gateway: the acceptance is committed and the effect ran; no receipt yet (pauses).
    AfterAcceptanceBeforeReceipt,
    /// Branch: a commit that settles operations is under way (announces, keeps going).
    DuringSettlement,
    /// Child: a transfer's acceptance is committed; the decision was not sent (pauses).
    DuringTransferAcceptance,
    /// Any: the store is open and recovery is under way (announces, keeps going).
    DuringRecovery,
}

impl crate::killpoint::KillPoint for LedgerKillPoint {
    fn pauses(self) -> bool {
        !matches!(
            self,
            LedgerKillPoint::DuringSettlement | LedgerKillPoint::DuringRecovery
        )
    }
}

/// Which component a peer runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum LedgerRole {
    /// The delegating branch holding the root grant.
    Root,
    /// The child branch.
    Child,
    /// The gateway.
    Gw,
}

impl LedgerRole {
    /// The agent name.
    pub fn name(self) -> &'static str {
        match self {
            LedgerRole::Root => "root",
            LedgerRole::Child => "child",
            LedgerRole::Gw => "gw",
        }
    }

    fn tag(self) -> u8 {
        self as u8
    }

    fn from_tag(t: u8) -> Option<Self> {
        [LedgerRole::Root, LedgerRole::Child, LedgerRole::Gw]
            .into_iter()
            .find(|r| r.tag() == t)
    }
}

/// How to run a peer.
#[derive(Clone, Debug, clap::Args)]
pub struct LedgerPeerArgs {
    /// Root, child or gateway.
    #[arg(long, value_enum)]
    pub role: LedgerRole,
    /// The redb file.
    #[arg(long)]
    pub db: PathBuf,
    /// UDP address of the root branch.
    #[arg(long)]
    pub root: SocketAddr,
    /// UDP address of the child branch.
    #[arg(long)]
    pub child: SocketAddr,
    /// UDP address of the gateway.
    #[arg(long)]
    pub gw: SocketAddr,
    /// Stop at this point ...
    #[arg(long, value_enum)]
    pub kill_at: Option<LedgerKillPoint>,
    /// ... the n-th time it is reached.
    #[arg(long, default_value_t = 1)]
    pub kill_nth: u32,
    /// Run the branch as one of the ledger's mutants (`abhyasa-sim ledger --list-mutants`),
    /// to show the checker catching it across processes.
    #[arg(long, value_parser = parse_mutant)]
    pub mutant: Option<LedgerMutation>,
}

fn parse_mutant(s: &str) -> Result<LedgerMutation, String> {
    LedgerMutation::ALL
        .iter()
        .find(|(name, _)| *name == s)
        .map(|(_, m)| *m)
        .ok_or_else(|| format!("no ledger mutant named {s}"))
}

/// Operations each branch performs.
pub const OPS_PER_BRANCH: u128 = 600;
/// The root grant, in cents.
pub const BUDGET: u64 = 14_000;
/// Transfers root → child: one every `TRANSFER_EVERY` of the root's operations, so that one
/// arrives within a second or so of any moment of the run (the test kills the child while it
/// accepts one, many times over).
pub const TRANSFERS: u128 = 25;
/// Root operations between two transfers.
pub const TRANSFER_EVERY: u128 = 24;
/// Cents per transfer (25 × 300 = 7,500: the child's 600 operations reserve 10 each and
/// commit 5 on average).
pub const TRANSFER_CENTS: u64 = 300;
/// At most one new operation per this many ms per branch (keeps the run long enough to be
/// killed at every cut many times).
pub const PACE_MS: u64 = 25;
const ROOT: RootId = RootId::from_u128(1);
const ROOT_CREDIT: CreditId = CreditId::from_u128(1);

/// The agent id of a role.
pub fn agent(role: LedgerRole) -> AgentId {
    AgentId::new(role.name()).expect("a valid agent id")
}

/// A role's signing key (derived from its name: a test harness).
pub fn key(name: &str) -> LedgerSigningKey {
    let mut seed = [0u8; 32];
    seed[..name.len()].copy_from_slice(name.as_bytes());
    signing_key(seed)
}

/// Keys of the issuer and every role.
pub fn keyring() -> Keyring {
    Keyring::new(
        ["issuer", "root", "child", "gw"]
            .map(|n| (AgentId::new(n).expect("valid"), key(n).verifying_key())),
    )
    .with_issuers([AgentId::new("issuer").expect("valid")])
}

/// The operation keys of a branch.
pub fn op_keys(role: LedgerRole) -> impl Iterator<Item = OpKey> {
    let base = match role {
        LedgerRole::Root => 1_000,
        _ => 2_000,
    };
    (0..OPS_PER_BRANCH).map(move |i| OpKey::from_u128(base + i))
}

/// The charge the executor applies for `key` (deterministic, at most 10).
pub fn charge_of(key: OpKey) -> Vector {
    let c = [10, 7, 0, 3][(key.to_u128() % 4) as usize];
    Vector::of(&[("cents", c)]).expect("valid")
}

/// Why a peer stopped.
#[derive(Debug, thiserror::Error)]
pub enum LedgerPeerError {
    /// The store failed.
    #[error("store: {0}")]
    Store(#[from] StoreError),
    /// The writer stopped.
    #[error("store writer: {0}")]
    Group(#[from] GroupError),
    /// The socket or the effects file failed.
    #[error("io: {0}")]
    Io(#[from] std::io::Error),
    /// Recovery refused journal steps.
    #[error("journal: {0}")]
    Journal(String),
}

struct Net {
    socket: UdpSocket,
    me: LedgerRole,
    addrs: BTreeMap<&'static str, SocketAddr>,
}

impl Net {
    fn send(&self, to: &AgentId, m: &LedgerMessage) {
        if let Some(addr) = self.addrs.get(to.as_str()) {
            let mut d = vec![self.me.tag()];
            d.extend(encode(m));
            let _ = self.socket.send_to(&d, addr);
        }
    }

    fn recv(&self, buf: &mut [u8]) -> Option<(AgentId, LedgerMessage)> {
        let (n, _) = self.socket.recv_from(buf).ok()?;
        let from = LedgerRole::from_tag(*buf.first()?)?;
        let m = decode::<LedgerMessage>(&buf[1..n]).ok()?;
        Some((agent(from), m))
    }
}

/// Runs a peer until it is killed.
pub fn run(args: &LedgerPeerArgs) -> Result<(), LedgerPeerError> {
    let addrs: BTreeMap<&'static str, SocketAddr> =
        [("root", args.root), ("child", args.child), ("gw", args.gw)].into();
    let socket = crate::bind_fixed(addrs[args.role.name()])?;
    socket.set_read_timeout(Some(Duration::from_millis(5)))?;
    let net = Net {
        socket,
        me: args.role,
        addrs,
    };
    let mut points = Points::new(args.kill_at, args.kill_nth);
    let group = open_group(&args.db)?;
    points.reach(LedgerKillPoint::DuringRecovery);
    match args.role {
        LedgerRole::Gw => run_gateway(args, &net, &group, &mut points),
        role => run_branch(role, &net, &group, &mut points, args.mutant),
    }
}

fn recover_branch(
    role: LedgerRole,
    group: &GroupCommit,
    mutation: Option<LedgerMutation>,
) -> Result<Branch, LedgerPeerError> {
    let journal = group.read(|s| s.ledger_journal())??;
    let config = BranchConfig {
        resend_ms: 200,
        mutation,
        ..BranchConfig::default()
    };
    let (b, rejected) = Branch::recover(agent(role), key(role.name()), keyring(), config, journal);
    if !rejected.is_empty() {
        return Err(LedgerPeerError::Journal(format!("{rejected:?}")));
    }
    Ok(b)
}

fn effect(k: OpKey) -> Effect {
    Effect {
        purpose: Dim::new("tools").expect("valid"),
        operation: format!("call {k}"),
        max_charge: Vector::of(&[("cents", 10)]).expect("valid"),
        carried_by: None,
    }
}

fn cents(n: u64) -> Vector {
    Vector::of(&[("cents", n)]).expect("valid")
}

fn run_branch(
    role: LedgerRole,
    net: &Net,
    group: &GroupCommit,
    points: &mut Points<LedgerKillPoint>,
    mutation: Option<LedgerMutation>,
) -> Result<(), LedgerPeerError> {
    let mut b = recover_branch(role, group, mutation)?;
    let gw = agent(LedgerRole::Gw);
    let started = Instant::now();
    let mut quarantined_at: BTreeMap<OpKey, Instant> = BTreeMap::new();
    let mut last_fence = Instant::now();
    let mut last_reserve = Instant::now();
    let mut done = false;
    let mut buf = vec![0u8; 65_536];
    loop {
        // The workload, resumed from whatever the journal says was done.
        if role == LedgerRole::Root && b.credit(ROOT_CREDIT).is_none() {
            let grant = RootGrant {
                root: ROOT,
                issuer: AgentId::new("issuer").expect("valid"),
                holder: agent(role),
                budget: cents(BUDGET),
                label: Label::of(&["tools"]).expect("valid"),
                issued_at: UnixMillis(0),
            };
            let signed = Signed::sign(&grant, &grant.issuer, &key("issuer"));
            let _ = b.grant(signed, ROOT_CREDIT);
        }
        if role == LedgerRole::Root {
            let spent = b.operations().count() as u128;
            for t in 0..TRANSFERS {
                let id = TransferId::from_u128(500 + t);
                if spent < t * TRANSFER_EVERY {
                    break; // Spread over the run.
                }
                // From the root credit's live generation (a fence closes one and reissues it).
                let source = b.current(ROOT_CREDIT).unwrap_or(ROOT_CREDIT);
                if !b.outgoing().any(|o| o.body.transfer == id) {
                    let _ = b.transfer(
                        source,
                        id,
                        &cents(TRANSFER_CENTS),
                        &agent(LedgerRole::Child),
                        Label::of(&["tools"]).expect("valid"),
                    );
                    break; // One per round.
                }
            }
        }
        let in_flight = b
            .operations()
            .filter(|o| matches!(o.state, OpState::Reserved | OpState::Quarantined))
            .count();
        if in_flight < 4 && last_reserve.elapsed() >= Duration::from_millis(PACE_MS) {
            last_reserve = Instant::now();
            let credit = b
                .credits()
                .filter(|c| {
                    !c.closed
                        && !c.fenced
                        && c.available.size().get(&Dim::new("cents").expect("valid")) >= 10
                })
                .map(|c| c.id)
                .next();
            if let (Some(credit), Some(k)) =
                (credit, op_keys(role).find(|k| b.operation(*k).is_none()))
            {
                let _ = b.reserve(now(), credit, effect(k), &gw, k);
            }
        }
        let reserved: Vec<OpKey> = b
            .operations()
            .filter(|o| o.state == OpState::Reserved)
            .map(|o| o.binding.key)
            .collect();
        for k in reserved {
            let _ = b.dispatch(now(), k);
        }
        // Reclaim what waits too long: fence, then the gateway proves no effect or answers
        // with the receipt it has.
        let stuck: Vec<(OpKey, CreditId)> = b
            .operations()
            .filter(|o| o.state == OpState::Quarantined)
            .map(|o| (o.binding.key, o.binding.credit))
            .collect();
        quarantined_at.retain(|k, _| stuck.iter().any(|(s, _)| s == k));
        for (k, credit) in &stuck {
            let since = *quarantined_at.entry(*k).or_insert_with(Instant::now);
            if since.elapsed() > Duration::from_secs(2)
                && last_fence.elapsed() > Duration::from_secs(1)
            {
                last_fence = Instant::now();
                let _ = b.request_fence(*credit);
            }
        }
        b.handle_timeout(now());
        if !flush_branch(&mut b, net, group, points)? {
            b = recover_branch(role, group, mutation)?;
            continue;
        }
        if !done && workload_done(role, &b) {
            done = true;
            println!("DONE after {:?}", started.elapsed());
        }
        if let Some((from, m)) = net.recv(&mut buf) {
            b.handle_message(now(), &from, m);
            while b.poll_event().is_some() {}
            if !flush_branch(&mut b, net, group, points)? {
                b = recover_branch(role, group, mutation)?;
            }
        }
    }
}

/// Whether every operation of the branch is reserved-and-ended, and (root) every transfer
/// decided.
pub fn workload_done(role: LedgerRole, b: &Branch) -> bool {
    let ops_done = op_keys(role).all(|k| {
        b.operation(k)
            .is_some_and(|o| matches!(o.state, OpState::Settled { .. } | OpState::NoEffect(_)))
    });
    let transfers_done = role != LedgerRole::Root
        || (b.outgoing().count() as u128 == TRANSFERS
            && b.outgoing().all(|o| o.state != OutgoingState::Sealed));
    ops_done && transfers_done
}

/// Commits what the branch handed out and sends what that released. `false`: the commit's
/// outcome is unknown; recover from the store.
fn flush_branch(
    b: &mut Branch,
    net: &Net,
    group: &GroupCommit,
    points: &mut Points<LedgerKillPoint>,
) -> Result<bool, LedgerPeerError> {
    let steps: Vec<_> = std::iter::from_fn(|| b.poll_persist()).collect();
    if !steps.is_empty() {
        let has = |f: fn(&Step) -> bool| steps.iter().any(|(_, s)| f(s));
        if has(|s| matches!(s, Step::Settle { .. })) {
            points.reach(LedgerKillPoint::DuringSettlement);
        }
        let ops = steps.iter().map(|(_, s)| Op::Ledger(s.clone())).collect();
        match group.submit(ops).wait() {
            Ok(()) => {}
            Err(GroupError::Unknown(_)) => return Ok(false),
            Err(e) => return Err(e.into()),
        }
        if has(|s| matches!(s, Step::Dispatch { .. })) {
            points.reach(LedgerKillPoint::AfterReserveBeforeSend);
        }
        if has(|s| matches!(s, Step::Accept { .. })) {
            points.reach(LedgerKillPoint::DuringTransferAcceptance);
        }
        for (t, _) in steps {
            b.handle_persisted(t);
        }
    }
    while let Some((to, m)) = b.poll_transmit() {
        net.send(&to, &m);
    }
    Ok(true)
}

/// The executor's own record of effects that ran.
pub fn effects_path(db: &Path) -> PathBuf {
    let mut p = db.as_os_str().to_owned();
    p.push(".effects");
    PathBuf::from(p)
}

/// Reads the executor's record: complete lines only (a torn last line never ran).
pub fn read_effects(db: &Path) -> Result<Vec<EffectInstance>, std::io::Error> {
    let path = effects_path(db);
    let bytes = match std::fs::read(&path) {
        Ok(b) => b,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(e),
    };
    let mut out = Vec::new();
    for line in bytes.split_inclusive(|&c| c == b'\n') {
        if line.last() != Some(&b'\n') {
            break;
        }
        // Every complete line must be a whole record: the executor cuts a torn tail before it
        // appends, so anything else is a broken harness, never an effect to skip or invent.
        let malformed = || {
            std::io::Error::new(
                std::io::ErrorKind::InvalidData,
                format!(
                    "malformed effect record {:?}",
                    String::from_utf8_lossy(line)
                ),
            )
        };
        let text = std::str::from_utf8(line).map_err(|_| malformed())?;
        let parts: Vec<&str> = text.split_whitespace().collect();
        let [k, c, p] = parts[..] else {
            return Err(malformed());
        };
        let (Ok(k), Ok(c), Ok(payer)) = (
            u128::from_str_radix(k, 16),
            c.parse::<u64>(),
            AgentId::new(p),
        ) else {
            return Err(malformed());
        };
        out.push(EffectInstance {
            gateway: agent(LedgerRole::Gw),
            payer,
            key: OpKey::from_u128(k),
            charge: cents(c),
            // Its gateway keeps every acceptance: nothing is forgotten, so the expiry is
            // never needed.
            expires: None,
        });
    }
    Ok(out)
}

/// Opens the executor's record for appending, first cutting a torn last line (a kill in the
/// middle of a write): appending after it would glue two records into one.
fn open_effects(db: &Path) -> Result<File, std::io::Error> {
    let path = effects_path(db);
    let file = OpenOptions::new()
        .create(true)
        .read(true)
        .append(true)
        .open(&path)?;
    let bytes = std::fs::read(&path)?;
    let whole = bytes.iter().rposition(|&c| c == b'\n').map_or(0, |i| i + 1);
    if whole < bytes.len() {
        file.set_len(whole as u64)?;
        file.sync_data()?;
    }
    Ok(file)
}

fn run_gateway(
    args: &LedgerPeerArgs,
    net: &Net,
    group: &GroupCommit,
    points: &mut Points<LedgerKillPoint>,
) -> Result<(), LedgerPeerError> {
    let recover = |group: &GroupCommit| -> Result<Gateway, LedgerPeerError> {
        let log = group.read(|s| s.gateway_log())??;
        Ok(Gateway::recover(
            agent(LedgerRole::Gw),
            key("gw"),
            keyring(),
            log,
        ))
    };
    let mut g = recover(group)?;
    let mut ran: BTreeMap<(AgentId, OpKey), Vector> = read_effects(&args.db)?
        .into_iter()
        .map(|e| ((e.payer, e.key), e.charge))
        .collect();
    let mut effects = open_effects(&args.db)?;
    let mut buf = vec![0u8; 65_536];
    loop {
        if let Some((from, m)) = net.recv(&mut buf) {
            g.handle_message(now(), &from, m);
        }
        loop {
            let records: Vec<_> = std::iter::from_fn(|| g.poll_persist()).collect();
            let mut progressed = !records.is_empty();
            if !records.is_empty() {
                let ops = records
                    .iter()
                    .map(|(_, r)| Op::Gateway(r.clone()))
                    .collect();
                match group.submit(ops).wait() {
                    Ok(()) => {}
                    Err(GroupError::Unknown(_)) => {
                        g = recover(group)?;
                        break;
                    }
                    Err(e) => return Err(e.into()),
                }
                for (t, _) in records {
                    g.handle_persisted(t);
                }
            }
            while let Some(e) = g.poll_execute() {
                progressed = true;
                let id = (e.payer.clone(), e.key);
                let charge = match (e.resume, ran.get(&id)) {
                    (true, Some(c)) => c.clone(),
                    _ => {
                        // Run the effect: its record is durable before anyone hears of it.
                        let c = charge_of(e.key);
                        let n = c.get(&Dim::new("cents").expect("valid"));
                        // One write of the whole line: a kill leaves at most a torn tail,
                        // which the next start cuts (that effect never ran).
                        let line = format!("{:x} {n} {}\n", e.key.to_u128(), e.payer);
                        effects.write_all(line.as_bytes())?;
                        effects.sync_data()?;
                        ran.insert(id, c.clone());
                        c
                    }
                };
                points.reach(LedgerKillPoint::AfterAcceptanceBeforeReceipt);
                g.handle_executed(&e.payer, e.key, charge);
            }
            if !progressed {
                break;
            }
        }
        while let Some((to, m)) = g.poll_transmit() {
            net.send(&to, &m);
        }
    }
}

/// Reads one peer's durable state for the checker.
pub fn load_branch(role: LedgerRole, db: &Path) -> Result<Branch, LedgerPeerError> {
    let store = Store::open(db, StoreConfig::default())?;
    let (b, rejected) = Branch::recover(
        agent(role),
        key(role.name()),
        keyring(),
        BranchConfig::default(),
        store.ledger_journal()?,
    );
    if !rejected.is_empty() {
        return Err(LedgerPeerError::Journal(format!("{rejected:?}")));
    }
    Ok(b)
}

/// Reads the gateway's durable log for the checker.
pub fn load_gateway(db: &Path) -> Result<Gateway, LedgerPeerError> {
    let store = Store::open(db, StoreConfig::default())?;
    Ok(Gateway::recover(
        agent(LedgerRole::Gw),
        key("gw"),
        keyring(),
        store.gateway_log()?,
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_torn_record_is_cut_before_the_next_append_and_never_glued_to_it() {
        let dir = tempfile::tempdir().unwrap();
        let db = dir.path().join("gw.redb");
        // One whole record, then a kill in the middle of the payer of the next one.
        std::fs::write(effects_path(&db), "a1 100 root\nb2 100 ro").unwrap();
        assert_eq!(read_effects(&db).unwrap().len(), 1, "a torn tail never ran");
        let mut f = open_effects(&db).unwrap();
        f.write_all(b"c3 250 child\n").unwrap();
        let got: Vec<(u128, AgentId)> = read_effects(&db)
            .unwrap()
            .into_iter()
            .map(|e| (e.key.to_u128(), e.payer))
            .collect();
        assert_eq!(
            got,
            vec![
                (0xa1, AgentId::new("root").unwrap()),
                (0xc3, AgentId::new("child").unwrap()),
            ]
        );
    }

    #[test]
    fn a_glued_record_is_an_error_not_an_effect() {
        let dir = tempfile::tempdir().unwrap();
        let db = dir.path().join("gw.redb");
        std::fs::write(effects_path(&db), "a1 100 rob2 100 child\n").unwrap();
        assert_eq!(
            read_effects(&db).unwrap_err().kind(),
            std::io::ErrorKind::InvalidData
        );
    }
}
