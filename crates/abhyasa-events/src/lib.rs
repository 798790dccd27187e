//! Events out: what an operator must hear of leaves the node, at least once, each event with
//! its idempotency key (docs/OPERATOR.md, "Events out").
//!
//! ```text
//!  commit (terminal record, forfeit, refusal, ended lease)
//!     │  the event is written in the same commit: a crash loses none
//!     ▼
//!  outbox (redb, in order) ──▶ webhook: POST, JSON, signed (Standard Webhooks, v1a/Ed25519)
//!     ▲                     └─▶ exec hook: the JSON on standard input
//!     │                           each retried with backoff until taken
//!     └── Node::outbox_delivered(seq) once every sink took it
//! ```
//!
//! A crash between a sink taking an event and the outbox hearing of it delivers the event
//! again after the restart, with the same key: a sink keeps the keys it has seen (the
//! Standard Webhooks `webhook-id`). Events go out in the order they were recorded; one a sink
//! will not take holds back those after it (and says so in the log) rather than skip it.
//!
//! The webhook's signature follows Standard Webhooks' asymmetric scheme: the headers
//! `webhook-id` (the key), `webhook-timestamp` (Unix seconds of the attempt) and
//! `webhook-signature: v1a,<base64 Ed25519 signature>` over `<id>.<timestamp>.<body>`, signed
//! with the node's certificate key — the key its custody objects are signed with, which a
//! receiver holding the node's certificate already has ([`public_key`] gives it in the
//! scheme's `whpk_` form). The signed text starts with the event's key, an ASCII word, where a
//! COSE signature structure starts with a CBOR array and a ledger message with its
//! `abhyasa/v1/ledger/` tag: one key signs all three without one passing for another.

#![warn(missing_docs, unreachable_pub)]

pub mod json;

use std::path::PathBuf;
use std::process::Stdio;
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use abhyasa_node::{Node, NodeError};
use abhyasa_store::OutboxEntry;
use base64::Engine as _;
use ed25519_dalek::{Signer as _, SigningKey, VerifyingKey};
use tokio::io::AsyncWriteExt as _;
use tracing::{debug, info, warn};

/// Outbox rows read at a time.
const BATCH: usize = 64;
/// How long the loop sleeps with nothing to send before it looks again (it wakes at once on
/// the node's events; this bounds the wait when one was missed).
const POLL: Duration = Duration::from_secs(1);

/// Where events go.
#[derive(Clone, Debug, Default)]
pub struct Sinks {
    /// An HTTP(S) endpoint that takes each event as a signed POST.
    pub webhook: Option<Webhook>,
    /// A command that takes each event as JSON on its standard input.
    pub exec: Option<Exec>,
    /// Retry backoff: the first wait, doubled after each failed attempt up to `backoff_max`.
    pub backoff_min: Duration,
    /// The longest wait between attempts.
    pub backoff_max: Duration,
}

impl Sinks {
    /// Whether any sink is set.
    pub fn any(&self) -> bool {
        self.webhook.is_some() || self.exec.is_some()
    }
}

/// A webhook.
#[derive(Clone, Debug)]
pub struct Webhook {
    /// The URL (`http://` or, with `roots`, `https://`).
    pub url: String,
    /// Roots an `https://` URL's certificate must chain to.
    pub roots: Option<rustls::RootCertStore>,
    /// How long one attempt may take.
    pub timeout: Duration,
}

/// An exec hook: the event's JSON on standard input; exit status 0 means taken. The event's
/// key and type are also in `ABHYASA_EVENT_ID` and `ABHYASA_EVENT_TYPE`.
#[derive(Clone, Debug)]
pub struct Exec {
    /// The executable (run directly, no shell).
    pub command: PathBuf,
    /// Its arguments.
    pub args: Vec<String>,
    /// How long one run may take before it is killed and counted as failed.
    pub timeout: Duration,
}

/// Why events out could not start.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum EventsError {
    /// The webhook client could not be built.
    #[error("webhook client: {0}")]
    Client(#[from] reqwest::Error),
    /// The webhook client's TLS could not be set up.
    #[error("webhook TLS: {0}")]
    Tls(#[from] rustls::Error),
    /// An `https://` webhook with no roots to check its certificate against.
    #[error("webhook {0}: an https:// URL needs the roots (ca) its certificate chains to")]
    NoRoots(String),
    /// The node keeps no outbox.
    #[error("the node keeps no events (its store's `events` is off)")]
    NoOutbox,
}

/// The node's key as Standard Webhooks writes a public key: `whpk_<base64>`.
pub fn public_key(key: &VerifyingKey) -> String {
    format!(
        "whpk_{}",
        base64::engine::general_purpose::STANDARD.encode(key.as_bytes())
    )
}

/// The `webhook-signature` header for `body` sent as event `id` at `timestamp` (Unix s).
pub fn signature(key: &SigningKey, id: &str, timestamp: u64, body: &[u8]) -> String {
    let mut signed = Vec::with_capacity(id.len() + body.len() + 24);
    signed.extend_from_slice(id.as_bytes());
    signed.push(b'.');
    signed.extend_from_slice(timestamp.to_string().as_bytes());
    signed.push(b'.');
    signed.extend_from_slice(body);
    let sig = key.sign(&signed);
    format!(
        "v1a,{}",
        base64::engine::general_purpose::STANDARD.encode(sig.to_bytes())
    )
}

/// Counts of what events out has done since it started.
#[derive(Debug, Default)]
pub struct Counters {
    /// Events every sink took.
    pub delivered: std::sync::atomic::AtomicU64,
    /// Attempts a sink refused or that failed (each retried).
    pub failed_attempts: std::sync::atomic::AtomicU64,
}

/// Events out, running; dropping it stops the delivery (what was not yet taken stays in the
/// outbox for the next start).
#[derive(Debug)]
pub struct Delivery {
    task: tokio::task::JoinHandle<()>,
    counters: Arc<Counters>,
}

impl Delivery {
    /// What it has done so far.
    pub fn counters(&self) -> &Counters {
        &self.counters
    }
}

impl Drop for Delivery {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// Starts delivering `node`'s outbox to `sinks`, signing webhooks with `key` (the node's
/// certificate key). Checks that the node keeps an outbox and that the sinks can be reached
/// as configured.
pub async fn start(node: Node, key: SigningKey, sinks: Sinks) -> Result<Delivery, EventsError> {
    if !node.keeps_events() {
        return Err(EventsError::NoOutbox);
    }
    let client = match &sinks.webhook {
        None => None,
        Some(w) => {
            if w.url.starts_with("https://") && w.roots.is_none() {
                return Err(EventsError::NoRoots(w.url.clone()));
            }
            let roots = w.roots.clone().unwrap_or_else(rustls::RootCertStore::empty);
            let provider = Arc::new(rustls::crypto::ring::default_provider());
            let tls = rustls::ClientConfig::builder_with_provider(provider)
                .with_safe_default_protocol_versions()?
                .with_root_certificates(roots)
                .with_no_client_auth();
            Some(
                reqwest::Client::builder()
                    .timeout(w.timeout)
                    .redirect(reqwest::redirect::Policy::none())
                    .user_agent(concat!("abhyasa/", env!("CARGO_PKG_VERSION")))
                    .use_preconfigured_tls(tls)
                    .build()?,
            )
        }
    };
    let counters = Arc::new(Counters::default());
    let out = Out {
        node,
        key,
        sinks,
        client,
        counters: counters.clone(),
    };
    Ok(Delivery {
        task: tokio::spawn(out.run()),
        counters,
    })
}

struct Out {
    node: Node,
    key: SigningKey,
    sinks: Sinks,
    client: Option<reqwest::Client>,
    counters: Arc<Counters>,
}

/// Why one attempt failed.
#[derive(Debug, thiserror::Error)]
enum Attempt {
    #[error("{0}")]
    Http(#[from] reqwest::Error),
    #[error("answered {0}")]
    Status(reqwest::StatusCode),
    #[error("{0}")]
    Io(#[from] std::io::Error),
    #[error("exited with {0}")]
    Exit(std::process::ExitStatus),
    #[error("no exit within {0:?}: killed")]
    Timeout(Duration),
}

impl Out {
    async fn run(self) {
        let mut events = self.node.events();
        let mut after: Option<u64> = None;
        loop {
            let rows = match self.node.outbox(after, BATCH).await {
                Ok(rows) => rows,
                Err(NodeError::Stopped) => return,
                Err(e) => {
                    warn!(%e, "events out: the outbox could not be read; trying again");
                    tokio::time::sleep(POLL).await;
                    continue;
                }
            };
            if rows.is_empty() {
                tokio::select! {
                    r = events.recv() => {
                        if matches!(r, Err(tokio::sync::broadcast::error::RecvError::Closed)) {
                            return;
                        }
                    }
                    () = tokio::time::sleep(POLL) => {}
                }
                continue;
            }
            for row in rows {
                let body =
                    serde_json::to_vec(&json::event(self.node.agent(), &row)).unwrap_or_default();
                if let Some(client) = &self.client {
                    self.until_taken(&row, "webhook", || self.post(client, &row, &body))
                        .await;
                }
                if let Some(exec) = &self.sinks.exec {
                    self.until_taken(&row, "exec", || run(exec, &row, &body))
                        .await;
                }
                // Durable before it counts; a failure here delivers the row again later.
                if let Err(e) = self.node.outbox_delivered(row.seq).await {
                    if matches!(e, NodeError::Stopped) {
                        return;
                    }
                    warn!(%e, seq = row.seq, "events out: not marked delivered; it will be sent again");
                }
                self.counters
                    .delivered
                    .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                after = Some(row.seq);
            }
        }
    }

    /// Tries `attempt` until it succeeds, waiting a doubling backoff between tries.
    async fn until_taken<F, Fut>(&self, row: &OutboxEntry, sink: &str, attempt: F)
    where
        F: Fn() -> Fut,
        Fut: std::future::Future<Output = Result<(), Attempt>>,
    {
        let mut wait = self.sinks.backoff_min.max(Duration::from_millis(1));
        let mut tries = 0u32;
        loop {
            tries += 1;
            match attempt().await {
                Ok(()) => {
                    debug!(key = %row.key, sink, tries, "event delivered");
                    return;
                }
                Err(e) => {
                    self.counters
                        .failed_attempts
                        .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                    let log = tries == 1 || tries.is_power_of_two();
                    if log {
                        warn!(key = %row.key, sink, tries, %e, retry_in_ms = wait.as_millis() as u64,
                            "event not taken; the events after it wait");
                    }
                    tokio::time::sleep(wait).await;
                    wait = (wait * 2).min(self.sinks.backoff_max.max(wait));
                }
            }
        }
    }

    async fn post(
        &self,
        client: &reqwest::Client,
        row: &OutboxEntry,
        body: &[u8],
    ) -> Result<(), Attempt> {
        let Some(w) = &self.sinks.webhook else {
            return Ok(());
        };
        let now = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap_or_default()
            .as_secs();
        let response = client
            .post(&w.url)
            .header(reqwest::header::CONTENT_TYPE, "application/json")
            .header("webhook-id", &row.key)
            .header("webhook-timestamp", now.to_string())
            .header(
                "webhook-signature",
                signature(&self.key, &row.key, now, body),
            )
            .body(body.to_vec())
            .send()
            .await?;
        if response.status().is_success() {
            Ok(())
        } else {
            Err(Attempt::Status(response.status()))
        }
    }
}

/// Runs the exec hook once for `row`.
async fn run(exec: &Exec, row: &OutboxEntry, body: &[u8]) -> Result<(), Attempt> {
    let mut child = tokio::process::Command::new(&exec.command)
        .args(&exec.args)
        .env("ABHYASA_EVENT_ID", &row.key)
        .env("ABHYASA_EVENT_TYPE", row.event.kind())
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .stderr(Stdio::inherit())
        .kill_on_drop(true)
        .spawn()?;
    let mut stdin = child.stdin.take();
    let outcome = tokio::time::timeout(exec.timeout, async {
        if let Some(stdin) = &mut stdin {
            // A hook that exits without reading is judged by its exit status alone.
            let _ = stdin.write_all(body).await;
            let _ = stdin.shutdown().await;
        }
        drop(stdin);
        child.wait().await
    })
    .await;
    match outcome {
        Ok(Ok(status)) if status.success() => Ok(()),
        Ok(Ok(status)) => Err(Attempt::Exit(status)),
        Ok(Err(e)) => Err(Attempt::Io(e)),
        Err(_) => {
            info!(key = %row.key, "exec hook killed after its timeout");
            Err(Attempt::Timeout(exec.timeout))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use abhyasa_store::{OperatorEvent, OutboxEntry};
    use abhyasa_wire::{
        AgentId, Escalation, EscalationCause, Kind, LastObserved, ObligationId, SafeAction,
        UnixMillis, WeightKey,
    };
    use ed25519_dalek::{Signature, Verifier as _};

    fn entry() -> OutboxEntry {
        let event = OperatorEvent::Escalated(Escalation {
            obligation_id: ObligationId::from_u128(0xab),
            kind: Kind::PhalaBeliefUpdate,
            target: AgentId::new("agent-1").unwrap(),
            attempts: 3,
            cause: EscalationCause::RetriesExhausted,
            last_observed: LastObserved::NoAck,
            safe_action: SafeAction::DownWeight {
                obligation_id: ObligationId::from_u128(0xab),
                target: AgentId::new("agent-1").unwrap(),
                weight_key: WeightKey::new("supplier.acme").unwrap(),
                amount: 250_000,
                fold_after: UnixMillis(9_000),
                lapses_at: Some(UnixMillis(1_796_438_467_512)),
            },
            at: UnixMillis(1_796_438_400_001),
        });
        OutboxEntry {
            seq: 4,
            key: event.key(),
            at: UnixMillis(1_796_438_400_001),
            event,
        }
    }

    /// The signature is Ed25519 over `<id>.<timestamp>.<body>`, and only that.
    #[test]
    fn a_webhook_signature_verifies_over_id_timestamp_and_body_alone() {
        let key = SigningKey::from_bytes(&[7; 32]);
        let body = br#"{"id":"escalated-ab"}"#;
        let header = signature(&key, "escalated-ab", 1_796_438_400, body);
        let sig = header.strip_prefix("v1a,").unwrap();
        let sig = base64::engine::general_purpose::STANDARD
            .decode(sig)
            .unwrap();
        let sig = Signature::from_slice(&sig).unwrap();
        let vk = key.verifying_key();
        let signed = br#"escalated-ab.1796438400.{"id":"escalated-ab"}"#;
        assert!(vk.verify(signed, &sig).is_ok());
        let other = br#"escalated-ab.1796438401.{"id":"escalated-ab"}"#;
        assert!(vk.verify(other, &sig).is_err());
        assert_eq!(
            public_key(&vk),
            format!(
                "whpk_{}",
                base64::engine::general_purpose::STANDARD.encode(vk.as_bytes())
            )
        );
    }

    /// Ids as hex strings, times as RFC 3339 beside the Unix ms, a down-weight as a decimal,
    /// the cause as its snake-case word.
    #[test]
    fn an_escalation_reads_as_words_people_use() {
        let v = json::event(&AgentId::new("principal").unwrap(), &entry());
        assert_eq!(
            v["id"],
            format!("escalated-{}", ObligationId::from_u128(0xab))
        );
        assert_eq!(v["type"], "obligation.escalated");
        assert_eq!(v["timestamp"], "2026-12-05T02:40:00.001Z");
        assert_eq!(v["at_ms"], 1_796_438_400_001u64);
        assert_eq!(v["seq"], 4);
        let d = &v["data"];
        assert_eq!(
            d["obligation_id"],
            ObligationId::from_u128(0xab).to_string()
        );
        assert_eq!(d["cause"], "retries_exhausted");
        assert_eq!(d["last_observed"], "no_ack");
        assert_eq!(d["safe_action"]["type"], "down_weight");
        assert_eq!(d["safe_action"]["amount"], 0.25);
        assert_eq!(d["safe_action"]["lapses_at"], "2026-12-05T02:41:07.512Z");
        assert!(
            v["summary"]
                .as_str()
                .unwrap()
                .contains("escalated, retries exhausted after 3 attempts"),
            "{v}"
        );
    }
}
