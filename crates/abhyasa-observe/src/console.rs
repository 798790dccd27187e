//! The console: one server-rendered page of what the node holds now, and the same live part
//! re-rendered and pushed over server-sent events whenever something changes. No build step:
//! the page's script is a few lines that swap the pushed HTML in.

use abhyasa_node::ledger::LedgerStatus;
use abhyasa_node::Status;
use abhyasa_wire::{words, Outcome, UnixMillis};
use maud::{html, Markup, PreEscaped, DOCTYPE};

use crate::metrics::BUCKETS;

/// Recent outcomes the console lists (newest first).
const RECENT: usize = 30;

const STYLE: &str = r#"
:root { color-scheme: light dark; --muted: #777; --bad: #c0392b; --good: #1e8449; --warn: #b9770e; }
body { font: 15px/1.4 system-ui, sans-serif; margin: 0 auto; max-width: 1100px; padding: 0 12px 40px; }
header { position: sticky; top: 0; background: Canvas; padding: 8px 0; border-bottom: 1px solid #8884; }
h1 { font-size: 1.2em; margin: 0; } h2 { font-size: 1.05em; margin: 22px 0 6px; }
.muted { color: var(--muted); } .bad { color: var(--bad); } .good { color: var(--good); } .warn { color: var(--warn); }
.chip { display: inline-block; border: 1px solid #8886; border-radius: 10px; padding: 0 8px; margin: 2px; font-size: .9em; }
.scroll { overflow-x: auto; }
table { border-collapse: collapse; width: 100%; font-size: .92em; }
th, td { text-align: left; padding: 4px 6px; border-bottom: 1px solid #8883; vertical-align: top; }
th { font-weight: 600; white-space: nowrap; }
code { font-size: .9em; word-break: break-all; }
.banner { background: var(--bad); color: white; padding: 6px 10px; border-radius: 4px; }
"#;

const SCRIPT: &str = r#"
const conn = document.getElementById('conn');
const es = new EventSource('events');
es.addEventListener('view', (e) => {
  document.getElementById('live').innerHTML = e.data;
  conn.textContent = 'live';
  conn.className = 'good';
});
es.onerror = () => { conn.textContent = 'reconnecting…'; conn.className = 'warn'; };
"#;

/// A Unix-millisecond time as RFC 3339, to the second.
fn when(t: UnixMillis) -> String {
    let at = std::time::UNIX_EPOCH + std::time::Duration::from_millis(t.0);
    humantime::format_rfc3339_seconds(at).to_string()
}

/// `t` relative to `now`: `in 12.3 s`, `4.0 s ago`.
fn relative(t: UnixMillis, now: UnixMillis) -> String {
    if t.0 >= now.0 {
        format!("in {:.1} s", (t.0 - now.0) as f64 / 1_000.0)
    } else {
        format!("{:.1} s ago", (now.0 - t.0) as f64 / 1_000.0)
    }
}

/// Millionths as a decimal.
fn decimal(millionths: i64) -> String {
    format!("{:.6}", millionths as f64 / 1e6)
        .trim_end_matches('0')
        .trim_end_matches('.')
        .to_owned()
}

fn vector(v: &abhyasa_ledger::Vector) -> String {
    let parts: Vec<String> = v.iter().map(|(d, n)| format!("{n} {d}")).collect();
    if parts.is_empty() {
        "0".into()
    } else {
        parts.join(", ")
    }
}

/// The whole page, with the live part rendered in place.
pub fn page(status: &Status, ledger: Option<&LedgerStatus>) -> Markup {
    html! {
        (DOCTYPE)
        html lang="en" {
            head {
                meta charset="utf-8";
                meta name="viewport" content="width=device-width, initial-scale=1";
                title { "abhyasa · " (status.agent) }
                style { (PreEscaped(STYLE)) }
            }
            body {
                header {
                    h1 { "abhyasa node " code { (status.agent) } }
                    span id="conn" class="muted" { "loading…" }
                }
                main id="live" { (live(status, ledger)) }
                script { (PreEscaped(SCRIPT)) }
            }
        }
    }
}

/// What is pushed on every change.
pub fn live(status: &Status, ledger: Option<&LedgerStatus>) -> Markup {
    let now = status.at;
    let recent: Vec<_> = status.recent.iter().rev().take(RECENT).collect();
    let escalations: Vec<_> = status.escalations.iter().rev().take(RECENT).collect();
    html! {
        p class="muted" {
            "as of " time datetime=(when(now)) { (when(now)) }
            " · peers: "
            @if status.peers.is_empty() { span class="warn" { "none" } }
            @for p in &status.peers { span class="chip" data-peer=(p) { (p) } }
            " · events waiting: " span data-outbox=(status.outbox) { (status.outbox) }
        }
        @if let Some(full) = &status.store_full {
            p class="banner" { "The store is full: new work is refused. " (full) }
        }

        section id="pending" {
            h2 { "Pending " span class="muted" { "(" (status.pending.len()) ")" } }
            @if status.pending.is_empty() {
                p class="muted" { "Nothing under custody." }
            } @else {
                div class="scroll" { table {
                    tr { th { "obligation" } th { "what" } th { "attempts" } th { "deadline" } }
                    @for (o, n) in &status.pending {
                        tr data-id=(o.id) data-state="pending" {
                            td { code { (o.id) } br; span class="muted" { (o.kind()) } }
                            td { (words::obligation(o)) }
                            td data-attempts=(n) { (n) }
                            td { (relative(o.deadline, now)) }
                        }
                    }
                } }
            }
        }

        section id="escalations" {
            h2 { "Escalations " span class="muted" { "(safe action applied)" } }
            @if escalations.is_empty() {
                p class="muted" { "None." }
            } @else {
                div class="scroll" { table {
                    tr { th { "obligation" } th { "target" } th { "how" } th { "safe action" } th { "when" } }
                    @for e in escalations {
                        tr data-id=(e.obligation_id) data-state="escalated" {
                            td { code { (e.obligation_id) } br; span class="muted" { (e.kind) } }
                            td { (e.target) }
                            td class="bad" { (words::outcome(&Outcome::Escalated(e.cause), e.attempts)) }
                            td class="safe-action" { (words::safe_action(&e.safe_action)) }
                            td { (relative(e.at, now)) }
                        }
                    }
                } }
            }
        }

        section id="recent" {
            h2 { "Recent outcomes" }
            @if recent.is_empty() {
                p class="muted" { "None yet." }
            } @else {
                div class="scroll" { table {
                    tr { th { "obligation" } th { "target" } th { "outcome" } th { "when" } }
                    @for r in recent {
                        @let class = match r.outcome {
                            Outcome::Applied => "good",
                            Outcome::Declined(_) | Outcome::Escalated(_) => "bad",
                            Outcome::BestEffort => "muted",
                        };
                        tr data-id=(r.obligation_id) data-state=(outcome_word(&r.outcome)) {
                            td { code { (r.obligation_id) } br; span class="muted" { (r.kind) } }
                            td { (r.target) }
                            td class=(class) {
                                (words::outcome(&r.outcome, r.attempts))
                                @if let Some(d) = &r.detail { br; span class="muted" { "“" (d) "”" } }
                            }
                            td { (relative(r.at, now)) }
                        }
                    }
                } }
            }
        }

        section id="decisions" {
            h2 { "Decisions in force " span class="muted" { "(as principal)" } }
            @let auths: Vec<_> = status.principal.authorizations().collect();
            @let tokens: Vec<_> = status.principal.revoked_tokens().collect();
            @let routes: Vec<_> = status.principal.routes(now).collect();
            @if auths.is_empty() && tokens.is_empty() && routes.is_empty() {
                p class="muted" { "None." }
            }
            @if !auths.is_empty() {
                div class="scroll" { table {
                    tr { th { "agent" } th { "scope" } th { "now" } th { "by" } }
                    @for ((agent, scope), a) in auths {
                        tr data-agent=(agent) data-scope=(scope) {
                            td { (agent) }
                            td { code { (scope) } }
                            td {
                                @if a.withheld { span class="bad" { "withheld" } }
                                @else if a.permits(now) {
                                    span class="good" { "granted" }
                                    @if let Some(end) = a.until { " · lease ends " (relative(end, now)) }
                                }
                                @else { span class="bad" { "lease ended " (a.until.map(|e| relative(e, now)).unwrap_or_default()) } }
                            }
                            td { @if let Some(by) = a.by { code { (by) } } }
                        }
                    }
                } }
            }
            @if !tokens.is_empty() {
                p { "Tokens no longer honoured: " @for t in tokens { span class="chip" { code { (t) } } } }
            }
            @if !routes.is_empty() {
                div class="scroll" { table {
                    tr { th { "agent" } th { "route" } th { "weight" } }
                    @for ((t, k), w) in routes {
                        tr { td { (t) } td { code { (k) } } td { (decimal(w)) } }
                    }
                } }
            }
        }

        section id="honours" {
            h2 { "What this node honours " span class="muted" { "(as agent)" } }
            @let withheld: Vec<_> = status.honours.withheld().collect();
            @let leases: Vec<_> = status.honours.leases().collect();
            @let weights: Vec<_> = status.honours.weights(now).collect();
            @let dropped: Vec<_> = status.honours.dropped_tokens().collect();
            @if withheld.is_empty() && leases.is_empty() && weights.is_empty() && dropped.is_empty() {
                p class="muted" { "Nothing governed." }
            }
            @if !withheld.is_empty() {
                p { "Scopes not exercised: " @for (p, s) in withheld { span class="chip" { (s) " (from " (p) ")" } } }
            }
            @if !leases.is_empty() {
                div class="scroll" { table {
                    tr { th { "principal" } th { "scope" } th { "lease" } }
                    @for ((p, s), end) in leases {
                        tr { td { (p) } td { code { (s) } }
                            td { @if end > now { "ends " (relative(end, now)) } @else { span class="bad" { "ended " (relative(end, now)) } } } }
                    }
                } }
            }
            @if !weights.is_empty() {
                div class="scroll" { table {
                    tr { th { "principal" } th { "preference" } th { "weight" } }
                    @for ((p, k), w) in weights { tr { td { (p) } td { code { (k) } } td { (decimal(w)) } } }
                } }
            }
            @if !dropped.is_empty() {
                p { "Tokens dropped: " @for t in dropped { span class="chip" { code { (t) } } } }
            }
        }

        @if let Some(l) = ledger {
            section id="budget" {
                h2 { "Budget" }
                @if l.roots.is_empty() { p class="muted" { "No budget held." } }
                @else {
                    div class="scroll" { table {
                        tr { th { "root" } @for b in BUCKETS { th { (b.replace('_', " ")) } } }
                        @for (root, buckets) in &l.roots {
                            tr data-root=(root) {
                                td { code { (root) } }
                                @for (b, v) in BUCKETS.iter().zip(buckets) {
                                    td data-bucket=(b) class=(if *b == "quarantined" && !v.is_zero() { "warn" } else if *b == "forfeited" && !v.is_zero() { "bad" } else { "" }) { (vector(v)) }
                                }
                            }
                        }
                    } }
                }
                @if !l.transfers.is_empty() {
                    h2 { "By child" }
                    div class="scroll" { table {
                        tr { th { "child" } th { "amount" } th { "transfer" } }
                        @for (id, to, amount, state) in &l.transfers {
                            tr data-child=(to) { td { (to) } td { (vector(amount)) } td { (state) " " span class="muted" { code { (id) } } } }
                        }
                    } }
                }
                @let open: Vec<_> = l.operations.iter().filter(|o| o.state == "quarantined" || o.state == "reserved").collect();
                @if !open.is_empty() {
                    h2 { "Operations in flight" }
                    div class="scroll" { table {
                        tr { th { "operation" } th { "gateway" } th { "reserved" } th { "state" } }
                        @for o in open {
                            tr { td { code { (o.key) } } td { (o.gateway) } td { (vector(&o.max_charge)) } td class="warn" { (o.state) } }
                        }
                    } }
                }
            }
        }
    }
}

fn outcome_word(o: &Outcome) -> &'static str {
    match o {
        Outcome::Applied => "applied",
        Outcome::Declined(_) => "declined",
        Outcome::Escalated(_) => "escalated",
        Outcome::BestEffort => "best_effort",
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use abhyasa_custody::PrincipalUpdate;
    use abhyasa_wire::{AgentId, ObligationId, SafeAction, Scope};

    /// What the node was told is shown as text, never as markup: a scope (printable, so it may
    /// hold `<`) cannot put an element or a script in the operator's page.
    #[test]
    fn names_from_the_network_are_escaped() {
        let mut s = crate::metrics::tests::status();
        let scope = Scope::new("<img src=x onerror=alert(1)>").unwrap();
        s.principal.apply(
            &PrincipalUpdate::Safe(SafeAction::WithholdScope {
                target: AgentId::new("a").unwrap(),
                scope,
                sequence: None,
            }),
            ObligationId::from_u128(5),
        );
        let html = page(&s, None).into_string();
        assert!(!html.contains("<img"), "{html}");
        assert!(
            html.contains("&lt;img src=x onerror=alert(1)&gt;"),
            "{html}"
        );
        assert!(html.contains("withheld"), "{html}");
        // And the live part pushed over server-sent events the same.
        assert!(!live(&s, None).into_string().contains("<img"));
    }
}
