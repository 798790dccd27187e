//! `abhyasa soak --adversary`: the attacks of docs/SECURITY.md run together against one agent
//! (`agent-0`, the process the soak watches) beside the honest principal:
//!
//! - **idle connections**: 2,000 TCP connections to the agent's admin TCP port that never send
//!   a request (re-opened as the node closes them);
//! - **stalled setups**: QUIC connections of a deployment member (`eve`) that finish their
//!   handshake and never start their MOQT session, 300 held at once (past the node's cap);
//! - **a stream flood**: four sessions of `eve`, each keeping 100 streams open that carry
//!   1.2 MB and never end;
//! - **a crowding member**: `mallory`, an `abhyasa node` of its own, issuing token revocations
//!   in its own name to the agent as fast as its admin interface takes them, to fill the
//!   agent's applied ids.
//!
//! What it counts is reported beside the soak's own figures; the soak's samples give the
//! agent's resident memory and descriptors, and its audit the honest obligations' outcomes.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use abhyasa_moq::{Identity, Session, TransportSettings};
use abhyasa_wire::AgentId;
use tokio::task::JoinHandle;

use crate::admin::{self, AdminAddr, AdminTarget, IssueSpec, Request};

/// Idle TCP connections held against the admin port.
pub const IDLE_CONNECTIONS: usize = 2_000;
/// QUIC connections held in a setup that never starts.
pub const STALLED_SETUPS: usize = 300;
/// Sessions of the stream flood, and the unended streams each keeps open.
pub const FLOOD_SESSIONS: usize = 4;
/// Bytes each flood stream carries (it never ends).
pub const FLOOD_STREAM_BYTES: usize = 1_200_000;
/// Deadline of the crowding member's obligations, ms: its applied ids are kept this long.
pub const MEMBER_DEADLINE_MS: u64 = 60_000;

/// What the attacks did, counted as they run.
#[derive(Debug, Default)]
pub struct AdversaryStats {
    /// Idle connections opened, and the most held at once.
    pub idle_opened: AtomicU64,
    /// Idle connections the node closed.
    pub idle_closed: AtomicU64,
    /// Idle connections held now.
    pub idle_held: AtomicU64,
    /// Stalled setups opened.
    pub setups_opened: AtomicU64,
    /// Stalled setups the node closed.
    pub setups_closed: AtomicU64,
    /// Flood streams opened.
    pub streams_opened: AtomicU64,
    /// Flood streams the node stopped.
    pub streams_stopped: AtomicU64,
    /// Obligations the crowding member issued (under custody at its own node).
    pub member_issued: AtomicU64,
    /// Its issues its own node refused.
    pub member_refused: AtomicU64,
}

impl AdversaryStats {
    /// One line: `adversary: idle_opened=… …`.
    pub fn summary(&self) -> String {
        let g = |a: &AtomicU64| a.load(Ordering::Relaxed);
        format!(
            "adversary: idle_opened={} idle_closed={} setups_opened={} setups_closed={} streams_opened={} streams_stopped={} member_issued={} member_refused={}",
            g(&self.idle_opened),
            g(&self.idle_closed),
            g(&self.setups_opened),
            g(&self.setups_closed),
            g(&self.streams_opened),
            g(&self.streams_stopped),
            g(&self.member_issued),
            g(&self.member_refused),
        )
    }
}

/// Where the attacks aim.
pub struct Target {
    /// The agent attacked.
    pub agent: AgentId,
    /// Its QUIC address (direct, not through the soak's relay).
    pub quic: SocketAddr,
    /// Its admin TCP port.
    pub admin_tcp: SocketAddr,
    /// `eve`'s identity (a deployment member).
    pub eve: Identity,
    /// The state directory of `mallory`'s node (its admin socket is there).
    pub mallory_state: PathBuf,
}

/// The running attacks; dropping it (or [`Attacks::stop`]) ends them.
pub struct Attacks {
    tasks: Vec<JoinHandle<()>>,
    /// What they did so far.
    pub stats: Arc<AdversaryStats>,
}

impl Attacks {
    /// Ends every attack.
    pub fn stop(mut self) {
        for t in self.tasks.drain(..) {
            t.abort();
        }
    }
}

impl Drop for Attacks {
    fn drop(&mut self) {
        for t in &self.tasks {
            t.abort();
        }
    }
}

/// Starts every attack against `target`.
pub fn start(target: Target) -> Result<Attacks, Box<dyn std::error::Error>> {
    let stats = Arc::new(AdversaryStats::default());
    let endpoint = abhyasa_moq::endpoint(
        &target.eve,
        "127.0.0.1:0".parse()?,
        &TransportSettings::default(),
    )?;
    let mut tasks = vec![
        tokio::spawn(idle_flood(target.admin_tcp, stats.clone())),
        tokio::spawn(setup_flood(
            endpoint.clone(),
            target.quic,
            target.agent.clone(),
            stats.clone(),
        )),
        tokio::spawn(crowd(
            target.mallory_state.clone(),
            target.agent.clone(),
            stats.clone(),
        )),
    ];
    for _ in 0..FLOOD_SESSIONS {
        tasks.push(tokio::spawn(stream_flood(
            endpoint.clone(),
            target.quic,
            target.agent.clone(),
            target.eve.agent.clone(),
            stats.clone(),
        )));
    }
    Ok(Attacks { tasks, stats })
}

/// Keeps [`IDLE_CONNECTIONS`] TCP connections open to `addr`, sending nothing; counts those
/// the node closes and opens new ones in their place.
async fn idle_flood(addr: SocketAddr, stats: Arc<AdversaryStats>) {
    let mut held: Vec<tokio::net::TcpStream> = Vec::new();
    loop {
        while held.len() < IDLE_CONNECTIONS {
            match tokio::net::TcpStream::connect(addr).await {
                Ok(s) => {
                    held.push(s);
                    stats.idle_opened.fetch_add(1, Ordering::Relaxed);
                }
                Err(_) => break,
            }
        }
        let before = held.len();
        // Still open: nothing to read yet. Closed: end of stream or an error.
        held.retain(|s| {
            let mut b = [0u8; 1];
            match s.try_read(&mut b) {
                Err(e) => e.kind() == std::io::ErrorKind::WouldBlock,
                Ok(n) => n > 0,
            }
        });
        stats
            .idle_closed
            .fetch_add((before - held.len()) as u64, Ordering::Relaxed);
        stats.idle_held.store(held.len() as u64, Ordering::Relaxed);
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

/// Keeps [`STALLED_SETUPS`] QUIC connections to the agent that finish their handshake and
/// never open their control stream; at most 50 new ones a second.
async fn setup_flood(
    endpoint: quinn::Endpoint,
    addr: SocketAddr,
    agent: AgentId,
    stats: Arc<AdversaryStats>,
) {
    let mut held = Vec::new();
    loop {
        let before = held.len();
        held.retain(|c: &quinn::Connection| c.close_reason().is_none());
        stats
            .setups_closed
            .fetch_add((before - held.len()) as u64, Ordering::Relaxed);
        for _ in 0..50 {
            if held.len() >= STALLED_SETUPS {
                break;
            }
            let Ok(connecting) = endpoint.connect(addr, agent.as_str()) else {
                break;
            };
            match tokio::time::timeout(Duration::from_secs(5), connecting).await {
                Ok(Ok(conn)) => {
                    held.push(conn);
                    stats.setups_opened.fetch_add(1, Ordering::Relaxed);
                }
                _ => break,
            }
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
}

/// One session of `eve` that keeps 100 streams open (QUIC's limit), each carrying
/// [`FLOOD_STREAM_BYTES`] and never ending; a stream the node stops is replaced, and a session
/// the node closes is dialed again.
async fn stream_flood(
    endpoint: quinn::Endpoint,
    addr: SocketAddr,
    agent: AgentId,
    me: AgentId,
    stats: Arc<AdversaryStats>,
) {
    loop {
        let Ok(Ok((session, mut events))) = tokio::time::timeout(
            Duration::from_secs(5),
            Session::connect(&endpoint, addr, &agent, &me),
        )
        .await
        else {
            tokio::time::sleep(Duration::from_secs(1)).await;
            continue;
        };
        tokio::spawn(async move { while events.recv().await.is_some() {} });
        let conn = session.connection().clone();
        // `open_uni` waits while 100 are open: a stopped stream makes room for the next.
        while let Ok(mut stream) = conn.open_uni().await {
            stats.streams_opened.fetch_add(1, Ordering::Relaxed);
            let stats = stats.clone();
            tokio::spawn(async move {
                let chunk = vec![0u8; 64 << 10];
                let mut sent = 0;
                while sent < FLOOD_STREAM_BYTES {
                    let n = chunk.len().min(FLOOD_STREAM_BYTES - sent);
                    if stream.write_all(&chunk[..n]).await.is_err() {
                        stats.streams_stopped.fetch_add(1, Ordering::Relaxed);
                        return;
                    }
                    sent += n;
                }
                // Never finished: held until the node stops it.
                if stream.stopped().await.is_ok() {
                    stats.streams_stopped.fetch_add(1, Ordering::Relaxed);
                }
            });
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
}

/// `mallory` issues token revocations in its own name to `agent` through its own node, one
/// after another as fast as its admin interface answers.
async fn crowd(state: PathBuf, agent: AgentId, stats: Arc<AdversaryStats>) {
    let target = AdminTarget {
        admin: AdminAddr::Unix(state.join(admin::SOCKET_FILE)),
        admin_token: None,
    };
    let mut n = 0u64;
    loop {
        n += 1;
        let spec = IssueSpec {
            target: agent.as_str().to_owned(),
            kind: "oauth.token".into(),
            payload: None,
            decision: None,
            scope: None,
            weight_key: None,
            delta: None,
            action: Some("revoke".into()),
            token: Some(format!("mallory-{n}")),
            client: "client".into(),
            token_expires_in_ms: Some(MEMBER_DEADLINE_MS + 60_000),
            deadline_ms: MEMBER_DEADLINE_MS,
            max_retries: None,
            sequence: None,
            lease_ms: None,
            ttl_ms: 3_600_000,
        };
        // The error is not `Send`: only what it means is kept past the await.
        let answer = admin::request(&target, Request::Issue(Box::new(spec)))
            .await
            .ok()
            .map(|reply| reply["ok"] == true);
        match answer {
            Some(true) => {
                stats.member_issued.fetch_add(1, Ordering::Relaxed);
            }
            Some(false) => {
                stats.member_refused.fetch_add(1, Ordering::Relaxed);
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            // Its node not up yet.
            None => tokio::time::sleep(Duration::from_millis(200)).await,
        }
    }
}
