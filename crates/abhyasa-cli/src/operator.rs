//! What the operator configures to see a node (docs/OPERATOR.md): `[events]`, where its events
//! go — escalations, declines, ended leases, quarantined and forfeited budget — and
//! `[observe]`, where its metrics and console are served.
//!
//! ```toml
//! [observe]
//! listen = "127.0.0.1:9464"     # loopback only; the admin token (<state>/admin.token) is the key
//!
//! [events]
//! backoff_min_ms = 250          # first wait after a failed attempt, doubled each time
//! backoff_max_ms = 60000        # longest wait
//!
//! [events.webhook]
//! url = "https://hooks.example/abhyasa"
//! ca = "certs/hooks-ca.pem"     # roots for an https:// URL
//! timeout_ms = 10000
//!
//! [events.exec]
//! command = "/usr/local/bin/page-oncall"
//! args = ["--team", "agents"]
//! timeout_ms = 10000
//! ```
//!
//! The section's presence makes the node keep its outbox; a sink configured later still gets
//! every event recorded since.

use std::path::{Path, PathBuf};
use std::time::Duration;

use abhyasa_node::Node;
use serde::Deserialize;

type Error = Box<dyn std::error::Error>;

/// `[events]`.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct EventsSection {
    /// First wait after a failed attempt, ms (doubled after each).
    #[serde(default = "default_backoff_min_ms")]
    pub backoff_min_ms: u64,
    /// Longest wait between attempts, ms.
    #[serde(default = "default_backoff_max_ms")]
    pub backoff_max_ms: u64,
    /// `[events.webhook]`.
    #[serde(default)]
    pub webhook: Option<WebhookSection>,
    /// `[events.exec]`.
    #[serde(default)]
    pub exec: Option<ExecSection>,
}

/// `[events.webhook]`.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct WebhookSection {
    /// The URL events are POSTed to.
    pub url: String,
    /// PEM roots for an `https://` URL.
    #[serde(default)]
    pub ca: Option<PathBuf>,
    /// How long one attempt may take, ms.
    #[serde(default = "default_timeout_ms")]
    pub timeout_ms: u64,
}

/// `[events.exec]`.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ExecSection {
    /// The executable (run directly, no shell).
    pub command: PathBuf,
    /// Its arguments.
    #[serde(default)]
    pub args: Vec<String>,
    /// How long one run may take, ms, before it is killed and tried again.
    #[serde(default = "default_timeout_ms")]
    pub timeout_ms: u64,
}

fn default_backoff_min_ms() -> u64 {
    250
}

fn default_backoff_max_ms() -> u64 {
    60_000
}

fn default_timeout_ms() -> u64 {
    10_000
}

impl EventsSection {
    /// Checks the section without starting anything.
    pub fn check(&self) -> Result<(), Error> {
        if self.webhook.is_none() && self.exec.is_none() {
            return Err(
                "[events] names no sink: add [events.webhook] url = …, [events.exec] command = …, or both"
                    .into(),
            );
        }
        if self.backoff_min_ms == 0 || self.backoff_max_ms < self.backoff_min_ms {
            return Err("[events]: backoff_min_ms must be > 0 and at most backoff_max_ms".into());
        }
        if let Some(w) = &self.webhook {
            if !(w.url.starts_with("http://") || w.url.starts_with("https://")) {
                return Err(
                    format!("[events.webhook] url {:?}: not http:// or https://", w.url).into(),
                );
            }
            if w.url.starts_with("https://") && w.ca.is_none() {
                return Err(format!(
                    "[events.webhook] url {:?}: an https:// URL needs `ca`, the roots its certificate chains to",
                    w.url
                )
                .into());
            }
            if w.timeout_ms == 0 {
                return Err("[events.webhook] timeout_ms must be > 0".into());
            }
        }
        if self.exec.as_ref().is_some_and(|e| e.timeout_ms == 0) {
            return Err("[events.exec] timeout_ms must be > 0".into());
        }
        Ok(())
    }

    /// The sinks this section names.
    pub fn sinks(&self) -> Result<abhyasa_events::Sinks, Error> {
        self.check()?;
        let webhook = match &self.webhook {
            None => None,
            Some(w) => Some(abhyasa_events::Webhook {
                url: w.url.clone(),
                roots: w.ca.as_deref().map(read_roots).transpose()?,
                timeout: Duration::from_millis(w.timeout_ms),
            }),
        };
        Ok(abhyasa_events::Sinks {
            webhook,
            exec: self.exec.as_ref().map(|e| abhyasa_events::Exec {
                command: e.command.clone(),
                args: e.args.clone(),
                timeout: Duration::from_millis(e.timeout_ms),
            }),
            backoff_min: Duration::from_millis(self.backoff_min_ms),
            backoff_max: Duration::from_millis(self.backoff_max_ms),
        })
    }

    /// Starts delivering `node`'s outbox, signed with `identity`'s certificate key.
    pub async fn start(
        &self,
        node: &Node,
        identity: &abhyasa_moq::Identity,
    ) -> Result<abhyasa_events::Delivery, Error> {
        let key = abhyasa_moq::Signer::new(identity)?.key().clone();
        tracing::info!(
            public_key = %abhyasa_events::public_key(&key.verifying_key()),
            "events out: webhooks are signed with this key (Standard Webhooks v1a)"
        );
        Ok(abhyasa_events::start(node.clone(), key, self.sinks()?).await?)
    }
}

/// `[observe]`.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ObserveSection {
    /// Where to serve `/metrics`, the console and its events: a loopback address.
    pub listen: std::net::SocketAddr,
}

impl ObserveSection {
    /// Checks the section without starting anything.
    pub fn check(&self) -> Result<(), Error> {
        if !self.listen.ip().is_loopback() {
            return Err(format!(
                "[observe] listen {}: not a loopback address (the console holds the node's authority to read everything it governs)",
                self.listen
            )
            .into());
        }
        Ok(())
    }

    /// Serves `node`'s metrics and console behind the admin token in `state`.
    pub async fn start(&self, node: &Node, state: &Path) -> Result<abhyasa_observe::Server, Error> {
        self.check()?;
        let token = crate::admin::load_or_create_token(&state.join(crate::admin::TOKEN_FILE))?;
        let server = abhyasa_observe::serve(
            node.clone(),
            abhyasa_observe::ObserveConfig {
                listen: self.listen,
                key: Some(hex::encode(token)),
            },
        )
        .await?;
        tracing::info!(addr = %server.local_addr(), "metrics at /metrics, the console at /");
        Ok(server)
    }
}

/// PEM certificates at `path` as TLS roots.
pub fn read_roots(path: &Path) -> Result<rustls::RootCertStore, Error> {
    use rustls::pki_types::pem::PemObject as _;
    let pem = std::fs::read(path).map_err(|err| format!("{}: {err}", path.display()))?;
    let mut roots = rustls::RootCertStore::empty();
    for cert in rustls::pki_types::CertificateDer::pem_slice_iter(&pem) {
        let cert = cert.map_err(|err| format!("{}: {err}", path.display()))?;
        roots
            .add(cert)
            .map_err(|err| format!("{}: {err}", path.display()))?;
    }
    Ok(roots)
}
