//! `GET /metrics`: the node's counters and, read at the scrape, its levels, in the Prometheus
//! text format (0.0.4).

use std::collections::BTreeMap;

use abhyasa_ledger::Vector;
use abhyasa_node::ledger::LedgerStatus;
use abhyasa_node::Status;
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::{Registry, Unit};

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct Peer {
    peer: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct Bucket {
    root: String,
    bucket: String,
    dim: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct Child {
    child: String,
    state: String,
    dim: String,
}

pub use abhyasa_node::ledger::BUCKETS;

fn by_dim(v: &Vector) -> impl Iterator<Item = (String, i64)> + '_ {
    v.iter()
        .map(|(d, n)| (d.as_str().to_owned(), i64::try_from(n).unwrap_or(i64::MAX)))
}

fn gauge(registry: &mut Registry, name: &str, help: &str, value: i64) {
    let g: Gauge = Gauge::default();
    g.set(value);
    registry.register(name, help, g);
}

/// The text a scrape reads: `node`'s counters, and its levels from `status` and `ledger`.
pub fn render(
    counters: &abhyasa_node::metrics::NodeMetrics,
    status: &Status,
    ledger: Option<&LedgerStatus>,
) -> String {
    let mut registry = Registry::default();
    counters.register(&mut registry);

    let pending: Family<Peer, Gauge> = Family::default();
    for (o, _) in &status.pending {
        pending
            .get_or_create(&Peer {
                peer: o.target.to_string(),
            })
            .inc();
    }
    registry.register(
        "abhyasa_custody_pending",
        "Obligations under custody now, by target",
        pending,
    );
    let attempts: Family<Peer, Gauge> = Family::default();
    for (o, n) in &status.pending {
        attempts
            .get_or_create(&Peer {
                peer: o.target.to_string(),
            })
            .inc_by(i64::from(*n));
    }
    registry.register(
        "abhyasa_custody_pending_attempts",
        "Attempts made so far for the obligations under custody now, by target",
        attempts,
    );
    let up: Family<Peer, Gauge> = Family::default();
    for p in &status.peers {
        up.get_or_create(&Peer {
            peer: p.to_string(),
        })
        .set(1);
    }
    registry.register("abhyasa_peer_up", "1 for each peer with a live session", up);
    gauge(
        &mut registry,
        "abhyasa_sessions",
        "Peers with a live session",
        status.peers.len() as i64,
    );
    for (name, help, per_peer) in [
        (
            "abhyasa_objects_slowed",
            "Objects dropped unread by the per-peer rate limit since the node started",
            &status.slowed,
        ),
        (
            "abhyasa_objects_unverified",
            "Obligations and acks dropped because their end-to-end signature did not verify, since the node started",
            &status.unverified,
        ),
    ] {
        let f: Family<Peer, Counter> = Family::default();
        for (p, n) in per_peer {
            f.get_or_create(&Peer {
                peer: p.to_string(),
            })
            .inc_by(*n);
        }
        registry.register(name, help, f);
    }
    gauge(
        &mut registry,
        "abhyasa_principal_withheld_scopes",
        "(agent, scope) pairs this node, as principal, withholds now",
        status
            .principal
            .authorizations()
            .filter(|(_, a)| !a.permits(status.at))
            .count() as i64,
    );
    gauge(
        &mut registry,
        "abhyasa_principal_revoked_tokens",
        "Tokens this node, as principal, no longer honours",
        status.principal.revoked_tokens().count() as i64,
    );
    gauge(
        &mut registry,
        "abhyasa_events_outbox",
        "Events recorded and not yet taken by every sink",
        status.outbox as i64,
    );
    gauge(
        &mut registry,
        "abhyasa_store_full",
        "1 while the store refuses commits for want of space",
        i64::from(status.store_full.is_some()),
    );
    let commits: Counter = Counter::default();
    commits.inc_by(status.commits.count);
    registry.register(
        "abhyasa_store_commits",
        "Durable commits of the store writer since the node started",
        commits,
    );
    let busy: Counter<f64, std::sync::atomic::AtomicU64> = Counter::default();
    busy.inc_by(status.commits.busy.as_secs_f64());
    registry.register_with_unit(
        "abhyasa_store_commit",
        "Time those commits took, the disk's sync included (over abhyasa_store_commits_total: the mean commit)",
        Unit::Seconds,
        busy,
    );
    if let Some(bytes) = status.store_bytes {
        let g: Gauge = Gauge::default();
        g.set(i64::try_from(bytes).unwrap_or(i64::MAX));
        registry.register_with_unit("abhyasa_store", "The store file's size", Unit::Bytes, g);
    }
    if let Some(l) = ledger {
        let budget: Family<Bucket, Gauge> = Family::default();
        for (root, buckets) in &l.roots {
            for (bucket, v) in BUCKETS.iter().zip(buckets) {
                for (dim, n) in by_dim(v) {
                    budget
                        .get_or_create(&Bucket {
                            root: root.to_string(),
                            bucket: (*bucket).to_owned(),
                            dim,
                        })
                        .set(n);
                }
            }
        }
        registry.register(
            "abhyasa_ledger_budget",
            "Atoms of each root this node holds, by bucket and dimension",
            budget,
        );
        let children: Family<Child, Gauge> = Family::default();
        let mut sums: BTreeMap<Child, i64> = BTreeMap::new();
        for (_, to, amount, state) in &l.transfers {
            for (dim, n) in by_dim(amount) {
                *sums
                    .entry(Child {
                        child: to.to_string(),
                        state: (*state).to_owned(),
                        dim,
                    })
                    .or_default() += n;
            }
        }
        for (k, n) in sums {
            children.get_or_create(&k).set(n);
        }
        registry.register(
            "abhyasa_ledger_delegated",
            "Atoms this node delegated, by child, transfer state and dimension",
            children,
        );
    }
    let mut text = String::new();
    // Writing into a String does not fail.
    let _ = prometheus_client::encoding::prometheus_text::encode(&mut text, &registry);
    text
}

impl PartialOrd for Child {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}

impl Ord for Child {
    fn cmp(&self, other: &Self) -> std::cmp::Ordering {
        (&self.child, &self.state, &self.dim).cmp(&(&other.child, &other.state, &other.dim))
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use abhyasa_ledger::{RootId, TransferId};
    use abhyasa_wire::{AgentId, UnixMillis};

    pub(crate) fn status() -> Status {
        Status {
            agent: AgentId::new("p").unwrap(),
            at: UnixMillis(0),
            pending: Vec::new(),
            recent: Vec::new(),
            escalations: Vec::new(),
            principal: abhyasa_custody::PrincipalState::new(Default::default()),
            honours: abhyasa_custody::ReceiverState::new(-1_000_000, 1_000_000),
            receiver_held: Default::default(),
            applied: Vec::new(),
            peers: vec![AgentId::new("a").unwrap()],
            slowed: Default::default(),
            unverified: [(AgentId::new("a").unwrap(), 3)].into_iter().collect(),
            sent: Default::default(),
            store_full: None,
            outbox: 4,
            store_bytes: Some(8_192),
            applied_total: 0,
            commits: abhyasa_node::Commits {
                count: 40,
                ops: 90,
                busy: std::time::Duration::from_millis(10),
            },
        }
    }

    fn v(n: u64) -> Vector {
        Vector::of(&[("cents", n)]).unwrap()
    }

    /// Budget by bucket (every bucket, each dimension) and by child (summed over a child's
    /// transfers in each state), in the exposition format.
    #[test]
    fn the_ledger_reads_by_bucket_and_by_child() {
        let root = RootId::from_u128(0x1f);
        let ledger = LedgerStatus {
            roots: vec![(root, [v(50), v(20), v(0), v(7), v(13), v(10)])],
            transfers: vec![
                (
                    TransferId::from_u128(1),
                    AgentId::new("c1").unwrap(),
                    v(15),
                    "accepted",
                ),
                (
                    TransferId::from_u128(2),
                    AgentId::new("c1").unwrap(),
                    v(5),
                    "accepted",
                ),
                (
                    TransferId::from_u128(3),
                    AgentId::new("c2").unwrap(),
                    v(20),
                    "sealed",
                ),
            ],
            ..LedgerStatus::default()
        };
        let text = render(
            &abhyasa_node::metrics::NodeMetrics::default(),
            &status(),
            Some(&ledger),
        );
        for line in [
            "abhyasa_ledger_budget{root=\"1f\",bucket=\"available\",dim=\"cents\"} 50",
            "abhyasa_ledger_budget{root=\"1f\",bucket=\"in_transit\",dim=\"cents\"} 20",
            "abhyasa_ledger_budget{root=\"1f\",bucket=\"quarantined\",dim=\"cents\"} 7",
            "abhyasa_ledger_budget{root=\"1f\",bucket=\"committed\",dim=\"cents\"} 13",
            "abhyasa_ledger_budget{root=\"1f\",bucket=\"forfeited\",dim=\"cents\"} 10",
            "abhyasa_ledger_delegated{child=\"c1\",state=\"accepted\",dim=\"cents\"} 20",
            "abhyasa_ledger_delegated{child=\"c2\",state=\"sealed\",dim=\"cents\"} 20",
            "abhyasa_objects_unverified_total{peer=\"a\"} 3",
            "abhyasa_events_outbox 4",
            "abhyasa_store_bytes 8192",
            "abhyasa_store_commits_total 40",
            "abhyasa_store_commit_seconds_total 0.01",
            "abhyasa_sessions 1",
        ] {
            assert!(text.lines().any(|l| l == line), "{line} not in\n{text}");
        }
        // A zero bucket has no dimension to show.
        assert!(!text.contains("bucket=\"reserved\""), "{text}");
        // No ledger, no budget families.
        let none = render(
            &abhyasa_node::metrics::NodeMetrics::default(),
            &status(),
            None,
        );
        assert!(!none.contains("abhyasa_ledger_budget"), "{none}");
    }
}
