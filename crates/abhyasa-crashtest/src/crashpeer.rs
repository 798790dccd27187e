//! The crash-test peer: a custodian or a receiver as a real process, on a real redb store with
//! group commit, talking over UDP on loopback, that can stop dead at a named crash point so a
//! test can SIGKILL it there (`tests/crash_sigkill.rs`).
//!
//! This is a test harness, not the node runtime: the UDP channel carries no identities (each
//! side takes its one configured peer as the sender) and the workload is fixed.
//!
//! Datagram: one tag byte (`0` obligation, `1` ack) and the object's CBOR.

use std::net::{SocketAddr, UdpSocket};
use std::path::PathBuf;
use std::time::Duration;

use abhyasa_custody::{
    kinds, Custodian, CustodianConfig, CustodianRecord, Receiver, ReceiverConfig, ReceiverRecord,
};
use abhyasa_store::{GroupCommit, GroupError, Op, StoreError};

use crate::killpoint::{now, open_group, Points};
use abhyasa_wire::{
    decode, decode_obligation, encode, AgentId, BeliefUpdatePayload, ClientId, ConsentDecision,
    ConsentPayload, CustodyAck, Obligation, ObligationId, Payload, Scope, TokenAction, TokenId,
    TokenPayload, UnixMillis, WeightDelta, WeightKey,
};

/// Where a peer can be told to stop for its kill.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum KillPoint {
    /// Custodian: a pending record is committed; nothing was sent yet (pauses).
    AfterPendingPersist,
    /// Receiver: an apply is committed; its ack was not released yet (pauses).
    AfterApplyCommit,
    /// Custodian: a commit that removes pending records is under way (announces, keeps going).
    DuringTerminalCommit,
    /// Custodian: a retry's attempt record is committed; the retry was not sent (pauses).
    MidRetry,
    /// Either: the store is open and recovery is under way (announces, keeps going).
    DuringRecovery,
}

impl crate::killpoint::KillPoint for KillPoint {
    fn pauses(self) -> bool {
        !matches!(
            self,
            KillPoint::DuringTerminalCommit | KillPoint::DuringRecovery
        )
    }
}

/// Which machine a peer runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Role {
    /// The principal's custodian (agent `p`).
    Custodian,
    /// The target's receiver (agent `a`).
    Receiver,
}

/// How to run a peer.
#[derive(Clone, Debug, clap::Args)]
pub struct PeerArgs {
    /// Custodian or receiver.
    #[arg(long, value_enum)]
    pub role: Role,
    /// The redb file.
    #[arg(long)]
    pub db: PathBuf,
    /// UDP address to bind.
    #[arg(long)]
    pub listen: SocketAddr,
    /// UDP address of the other peer.
    #[arg(long)]
    pub peer: SocketAddr,
    /// Unix ms at which the workload starts (fixes every deadline across restarts).
    #[arg(long)]
    pub epoch: u64,
    /// Number of obligations in the workload.
    #[arg(long, default_value_t = 60)]
    pub count: u32,
    /// Stop at this point ...
    #[arg(long, value_enum)]
    pub kill_at: Option<KillPoint>,
    /// ... the n-th time it is reached.
    #[arg(long, default_value_t = 1)]
    pub kill_nth: u32,
}

/// The principal's agent id.
pub fn principal() -> AgentId {
    AgentId::new("p").expect("valid")
}

/// The reachable target's agent id.
pub fn agent() -> AgentId {
    AgentId::new("a").expect("valid")
}

/// The weight delta of obligation `i` (phala ones): distinct per obligation, so a double
/// apply shows in the receiver's weight.
pub fn delta(i: u32) -> i64 {
    -100 * (i64::from(i) + 1)
}

/// The fixed workload: obligation `i` is issued at `epoch + 100·i` ms with an 8 s deadline.
/// Most are corrective belief updates on their own weight key; every 5th is a consent revoke,
/// every 7th a token revoke; every 9th targets `z`, which never answers.
pub fn workload(epoch: u64, count: u32) -> Vec<Obligation> {
    (0..count)
        .map(|i| {
            let payload = if i % 5 == 4 {
                Payload::AnumatiConsent(ConsentPayload {
                    decision: Some(ConsentDecision::Revoke),
                    scope: Scope::new(format!("scope-{i}")).expect("valid"),
                    expires_at: None,
                })
            } else if i % 7 == 6 {
                Payload::OauthToken(TokenPayload {
                    action: TokenAction::Revoke,
                    token_id: TokenId::new(format!("tok-{i}")).expect("valid"),
                    client_id: ClientId::new("c").expect("valid"),
                    expires_at: None,
                })
            } else {
                Payload::PhalaBeliefUpdate(BeliefUpdatePayload {
                    weight_key: WeightKey::new(format!("k{i}")).expect("valid"),
                    weight_delta: WeightDelta(delta(i) as i32),
                    ttl_ms: 24 * 3_600_000,
                })
            };
            let at = epoch + 100 * u64::from(i);
            Obligation {
                id: ObligationId::from_u128(u128::from(i) + 1),
                issuer: principal(),
                target: AgentId::new(if i % 9 == 8 { "z" } else { "a" }).expect("valid"),
                created_at: UnixMillis(at),
                deadline: UnixMillis(at + 8_000),
                max_retries: 40,
                sequence: None,
                payload,
            }
        })
        .collect()
}

/// Custodian timing used by the peer.
pub fn custodian_config() -> CustodianConfig {
    CustodianConfig {
        response_timeout_ms: 100,
        backoff_base_ms: 50,
        backoff_cap_ms: 400,
        max_clock_skew_ms: 60_000,
        ..CustodianConfig::default()
    }
}

/// Receiver settings used by the peer.
pub fn receiver_config() -> ReceiverConfig {
    ReceiverConfig {
        max_clock_skew_ms: 60_000,
        ..ReceiverConfig::default()
    }
}

/// Why a peer stopped.
#[derive(Debug, thiserror::Error)]
pub enum PeerError {
    /// The store failed.
    #[error("store: {0}")]
    Store(#[from] StoreError),
    /// The writer stopped.
    #[error("store writer: {0}")]
    Group(#[from] GroupError),
    /// The socket failed.
    #[error("socket: {0}")]
    Io(#[from] std::io::Error),
}

/// Runs a peer until it is done (custodian) or killed (receiver).
pub fn run(args: &PeerArgs) -> Result<(), PeerError> {
    let socket = crate::bind_fixed(args.listen)?;
    let mut points = Points::new(args.kill_at, args.kill_nth);
    let group = open_group(&args.db)?;
    points.reach(KillPoint::DuringRecovery);
    match args.role {
        Role::Custodian => run_custodian(args, &socket, &group, &mut points),
        Role::Receiver => run_receiver(args, &socket, &group, &mut points),
    }
}

fn recover_custodian(group: &GroupCommit) -> Result<Custodian, PeerError> {
    let seed = now().0;
    Ok(
        group
            .read(move |s| s.recover_custodian(principal(), custodian_config(), seed, now()))??,
    )
}

fn run_custodian(
    args: &PeerArgs,
    socket: &UdpSocket,
    group: &GroupCommit,
    points: &mut Points<KillPoint>,
) -> Result<(), PeerError> {
    let mut c = recover_custodian(group)?;
    let work = workload(args.epoch, args.count);
    let mut next = 0;
    let mut buf = vec![0u8; 65_536];
    loop {
        let t = now();
        // Issue what is due; issuing is idempotent on the id.
        while next < work.len() && work[next].created_at <= t {
            let o = work[next].clone();
            next += 1;
            let id = o.id;
            let known = group.read(move |s| s.knows(id))??;
            if !known && o.deadline > t && !c.is_pending(id) {
                // A refusal here would be a harness bug; the check at the end would show it.
                let _ = c.issue(t, o);
            }
        }
        c.handle_timeout(now());
        if !flush_custodian(&mut c, socket, args.peer, group, points)? {
            c = recover_custodian(group)?;
            next = 0;
            continue;
        }
        if next == work.len() && c.pending_len() == 0 {
            println!("DONE");
            return Ok(());
        }
        let wait = c
            .poll_timeout()
            .map_or(20, |w| w.0.saturating_sub(now().0))
            .clamp(1, 20);
        socket.set_read_timeout(Some(Duration::from_millis(wait)))?;
        if let Ok((n, _)) = socket.recv_from(&mut buf) {
            if buf[..n].first() == Some(&1) {
                if let Ok(ack) = decode::<CustodyAck>(&buf[1..n]) {
                    c.handle_ack(now(), &agent(), ack);
                }
            }
        }
    }
}

/// Commits what the custodian hands out and sends what that releases. `false`: the commit's
/// outcome is unknown and the machine must be recovered from the store.
fn flush_custodian(
    c: &mut Custodian,
    socket: &UdpSocket,
    peer: SocketAddr,
    group: &GroupCommit,
    points: &mut Points<KillPoint>,
) -> Result<bool, PeerError> {
    let records: Vec<_> = std::iter::from_fn(|| c.poll_persist()).collect();
    if !records.is_empty() {
        let has = |f: fn(&CustodianRecord) -> bool| records.iter().any(|p| f(&p.record));
        if has(|r| matches!(r, CustodianRecord::Terminal { .. })) {
            points.reach(KillPoint::DuringTerminalCommit);
        }
        let ops = records
            .iter()
            .map(|p| Op::Custodian(p.record.clone()))
            .collect();
        match group.submit(ops).wait() {
            Ok(()) => {}
            Err(GroupError::Unknown(_)) => return Ok(false),
            Err(e) => return Err(e.into()),
        }
        if has(|r| matches!(r, CustodianRecord::Pending { .. })) {
            points.reach(KillPoint::AfterPendingPersist);
        }
        if has(|r| matches!(r, CustodianRecord::Attempt { .. })) {
            points.reach(KillPoint::MidRetry);
        }
        for p in records {
            c.handle_persisted(now(), p.token);
        }
    }
    while c.poll_event().is_some() {}
    while let Some(t) = c.poll_transmit() {
        if t.to == agent() {
            let mut datagram = vec![0u8];
            datagram.extend(encode(&t.obligation));
            let _ = socket.send_to(&datagram, peer);
        }
    }
    Ok(true)
}

fn run_receiver(
    args: &PeerArgs,
    socket: &UdpSocket,
    group: &GroupCommit,
    points: &mut Points<KillPoint>,
) -> Result<(), PeerError> {
    let recover = || -> Result<Receiver, PeerError> {
        Ok(group.read(|s| s.recover_receiver(agent(), receiver_config()))??)
    };
    let mut r = recover()?;
    let mut buf = vec![0u8; 65_536];
    socket.set_read_timeout(Some(Duration::from_millis(20)))?;
    loop {
        if let Ok((n, _)) = socket.recv_from(&mut buf) {
            if buf[..n].first() == Some(&0) {
                match decode_obligation(&buf[1..n]) {
                    Ok(o) => {
                        r.handle_obligation(now(), &principal(), o);
                    }
                    Err(e) => {
                        if let (Some(env), Some(reason)) = (e.envelope(), e.decline_reason()) {
                            r.handle_unreadable(now(), &principal(), env, reason);
                        }
                    }
                }
            }
        }
        r.handle_timeout(now());
        let records: Vec<_> = std::iter::from_fn(|| r.poll_persist()).collect();
        if !records.is_empty() {
            let applies = records
                .iter()
                .any(|p| matches!(p.record, ReceiverRecord::Apply { .. }));
            let ops = records
                .iter()
                .map(|p| Op::Receiver(p.record.clone()))
                .collect();
            match group.submit(ops).wait() {
                Ok(()) => {}
                Err(GroupError::Unknown(_)) => {
                    r = recover()?;
                    continue;
                }
                Err(e) => return Err(e.into()),
            }
            if applies {
                points.reach(KillPoint::AfterApplyCommit);
            }
            for p in records {
                r.handle_persisted(p.token);
            }
        }
        while r.poll_event().is_some() {}
        while let Some(a) = r.poll_transmit() {
            let mut datagram = vec![1u8];
            datagram.extend(encode(&a.ack));
            let _ = socket.send_to(&datagram, args.peer);
        }
    }
}

/// Whether `o` is carried under custody (for checkers).
pub fn admissible(o: &Obligation) -> bool {
    kinds::admissible(o)
}
