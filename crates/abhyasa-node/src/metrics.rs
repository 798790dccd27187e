//! What the node counts as it runs, for an exporter to show (Prometheus text, the console):
//! custody outcomes by kind, attempts, discharge latency, escalations, and connections
//! refused at the boundary. Levels — pending, sessions, budget, store size — are read from
//! [`crate::Status`] when shown, not counted here.

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::histogram::{exponential_buckets, Histogram};
use prometheus_client::registry::{Registry, Unit};

/// A kind of obligation.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct KindLabel {
    /// `anumati.consent`, `phala.belief_update`, `oauth.token`.
    pub kind: String,
}

/// A kind and how custody of it ended.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct OutcomeLabels {
    /// The kind.
    pub kind: String,
    /// `applied`, `declined`, `escalated` or `best_effort`.
    pub outcome: String,
}

/// A kind and why it escalated.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct EscalationLabels {
    /// The kind.
    pub kind: String,
    /// `deadline` or `retries_exhausted`.
    pub cause: String,
}

/// Why a connection was refused or closed before it carried anything.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ReasonLabel {
    /// `setup_failed` (handshake, authentication or MOQT setup), `setup_deadline`,
    /// `setup_crowded` (closed for a newer one at the cap of connections in setup),
    /// `blocked`, `sessions_per_peer` (an older session replaced), `no_binding`
    /// (a session for a path no binding serves), `binding_crowded`.
    pub reason: String,
}

fn discharge_histogram() -> Histogram {
    // 0.5 ms to about 65 s, doubling.
    Histogram::new(exponential_buckets(0.000_5, 2.0, 18))
}

/// The node's counters. Clones share them.
#[derive(Clone, Debug)]
pub struct NodeMetrics {
    outcomes: Family<OutcomeLabels, Counter>,
    attempts: Family<KindLabel, Counter>,
    discharge: Family<KindLabel, Histogram, fn() -> Histogram>,
    escalations: Family<EscalationLabels, Counter>,
    refused: Family<ReasonLabel, Counter>,
}

impl Default for NodeMetrics {
    fn default() -> Self {
        Self {
            outcomes: Family::default(),
            attempts: Family::default(),
            discharge: Family::new_with_constructor(discharge_histogram),
            escalations: Family::default(),
            refused: Family::default(),
        }
    }
}

/// The snake-case word of an outcome.
fn outcome_word(o: &abhyasa_wire::Outcome) -> &'static str {
    match o {
        abhyasa_wire::Outcome::Applied => "applied",
        abhyasa_wire::Outcome::Declined(_) => "declined",
        abhyasa_wire::Outcome::Escalated(_) => "escalated",
        abhyasa_wire::Outcome::BestEffort => "best_effort",
    }
}

impl NodeMetrics {
    /// Registers every counter (names prefixed `abhyasa_`) with `registry`.
    pub fn register(&self, registry: &mut Registry) {
        registry.register(
            "abhyasa_custody_outcomes",
            "Obligations whose custody ended, by kind and outcome, since the node started",
            self.outcomes.clone(),
        );
        registry.register(
            "abhyasa_custody_attempts",
            "Attempts made for obligations whose custody ended, by kind, since the node started",
            self.attempts.clone(),
        );
        registry.register_with_unit(
            "abhyasa_custody_discharge",
            "From issue to the end of custody, by kind, for obligations issued since the node started",
            Unit::Seconds,
            self.discharge.clone(),
        );
        registry.register(
            "abhyasa_custody_escalations",
            "Escalations (the fail-safe ran), by kind and cause, since the node started",
            self.escalations.clone(),
        );
        registry.register(
            "abhyasa_connections_refused",
            "Connections refused or closed before carrying anything, by reason, since the node started",
            self.refused.clone(),
        );
    }

    /// Counts the end of custody `record`; `issued_at` (the node's clock at issue, when
    /// this process issued it) gives its discharge latency.
    pub(crate) fn terminal(
        &self,
        record: &abhyasa_wire::TerminalRecord,
        issued_at: Option<abhyasa_wire::UnixMillis>,
    ) {
        let kind = record.kind.as_str().to_owned();
        self.outcomes
            .get_or_create(&OutcomeLabels {
                kind: kind.clone(),
                outcome: outcome_word(&record.outcome).to_owned(),
            })
            .inc();
        if record.outcome == abhyasa_wire::Outcome::BestEffort {
            return;
        }
        let label = KindLabel { kind };
        self.attempts
            .get_or_create(&label)
            .inc_by(u64::from(record.attempts));
        if let abhyasa_wire::Outcome::Escalated(cause) = record.outcome {
            self.escalations
                .get_or_create(&EscalationLabels {
                    kind: label.kind.clone(),
                    cause: match cause {
                        abhyasa_wire::EscalationCause::Deadline => "deadline",
                        abhyasa_wire::EscalationCause::RetriesExhausted => "retries_exhausted",
                    }
                    .to_owned(),
                })
                .inc();
        }
        if let Some(at) = issued_at {
            let seconds = record.at.0.saturating_sub(at.0) as f64 / 1_000.0;
            self.discharge.get_or_create(&label).observe(seconds);
        }
    }

    /// Counts a connection refused for `reason`.
    pub(crate) fn refused(&self, reason: &'static str) {
        self.refused
            .get_or_create(&ReasonLabel {
                reason: reason.to_owned(),
            })
            .inc();
    }

    /// Outcomes counted so far, by (kind, outcome).
    pub fn outcomes(&self) -> Vec<(String, String, u64)> {
        let mut v = Vec::new();
        for kind in abhyasa_wire::Kind::known() {
            for outcome in ["applied", "declined", "escalated", "best_effort"] {
                let l = OutcomeLabels {
                    kind: kind.as_str().to_owned(),
                    outcome: outcome.to_owned(),
                };
                if let Some(c) = self.outcomes.get(&l) {
                    v.push((l.kind, l.outcome, c.get()));
                }
            }
        }
        v
    }
}
