//! A fourth governance kind, defined in this one file and registered with
//! `abhyasa_custody::register_kind!`: no other file of the project names it.
//!
//! `acme.delegation` tells an agent to stop (or resume) acting for its principal in a domain.
//! Stopping is restrictive and under custody, and its fail-safe withholds the domain's scope on
//! the principal's side at issue; resuming is permissive and travels best-effort. Two real
//! nodes on loopback carry it over QUIC with durable stores; the agent applies it, the
//! principal's enforcement refuses the scope, and both keep it across a restart. Its JSON
//! shape (A2A) and its wording come from the same module.

use std::time::Duration;

use abhyasa::a2a::json::JsonObligation;
use abhyasa::custody::kinds::{KindRules, PrincipalUpdate};
use abhyasa::custody::{GovernedKey, ReceiverEffect};
use abhyasa::moq::Ca;
use abhyasa::node::{Admission, Ask, Node, Verdict};
use abhyasa::wire::{
    self, AgentId, DeclineReason, Kind, Obligation, Outcome, Payload, RegisteredPayload,
    SafeAction, Scope, WireError, WireKind,
};
use abhyasa_testkit::{id, obligation};
use serde::{Deserialize, Serialize};

/// `acme.delegation`.
struct Delegation;

/// Stop (or resume) acting for the issuer in `domain`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
struct DelegationPayload {
    domain: String,
    stop: bool,
}

/// The scope a delegation governs: `delegation.<domain>`.
fn scope(p: &DelegationPayload) -> Scope {
    Scope::new(format!("delegation.{}", p.domain)).expect("checked when read")
}

impl WireKind for Delegation {
    const NAME: &'static str = "acme.delegation";
    type Payload = DelegationPayload;

    fn check(p: &DelegationPayload) -> Result<(), String> {
        if p.domain.is_empty() {
            return Err("an empty domain".into());
        }
        Scope::new(format!("delegation.{}", p.domain))
            .map(|_| ())
            .map_err(|e| e.to_string())
    }

    fn words(p: &DelegationPayload) -> String {
        let verb = if p.stop { "stop" } else { "resume" };
        format!("{verb} acting in {}", p.domain)
    }
}

impl KindRules for Delegation {
    type Payload = DelegationPayload;

    fn admissible(p: &DelegationPayload) -> bool {
        p.stop
    }

    fn safe(o: &Obligation, p: &DelegationPayload, _retention: u64) -> Option<SafeAction> {
        p.stop.then(|| SafeAction::WithholdScope {
            target: o.target.clone(),
            scope: scope(p),
            sequence: o.sequence,
        })
    }

    fn on_issue(o: &Obligation, p: &DelegationPayload) -> Option<PrincipalUpdate> {
        Self::safe(o, p, 0).map(PrincipalUpdate::Safe)
    }

    fn governed_key(o: &Obligation, p: &DelegationPayload) -> GovernedKey {
        GovernedKey::Scope(o.issuer.clone(), scope(p))
    }

    fn effect(o: &Obligation, p: &DelegationPayload) -> ReceiverEffect {
        if p.stop {
            ReceiverEffect::WithholdScope(o.issuer.clone(), scope(p))
        } else {
            ReceiverEffect::GrantScope(o.issuer.clone(), scope(p), None)
        }
    }
}

abhyasa::custody::register_kind!(Delegation);

/// A kind whose name is registered twice: neither registration is taken.
struct Twin;

impl WireKind for Twin {
    const NAME: &'static str = "acme.twin";
    type Payload = DelegationPayload;

    fn check(p: &DelegationPayload) -> Result<(), String> {
        Delegation::check(p)
    }

    fn words(p: &DelegationPayload) -> String {
        Delegation::words(p)
    }
}

impl KindRules for Twin {
    type Payload = DelegationPayload;

    fn admissible(p: &DelegationPayload) -> bool {
        Delegation::admissible(p)
    }

    fn safe(o: &Obligation, p: &DelegationPayload, retention: u64) -> Option<SafeAction> {
        Delegation::safe(o, p, retention)
    }

    fn on_issue(o: &Obligation, p: &DelegationPayload) -> Option<PrincipalUpdate> {
        Delegation::on_issue(o, p)
    }

    fn governed_key(o: &Obligation, p: &DelegationPayload) -> GovernedKey {
        Delegation::governed_key(o, p)
    }

    fn effect(o: &Obligation, p: &DelegationPayload) -> ReceiverEffect {
        Delegation::effect(o, p)
    }
}

abhyasa::custody::register_kind!(Twin);
abhyasa::custody::register_kind!(Twin);

fn delegation(n: u128, target: &AgentId, domain: &str, stop: bool) -> Obligation {
    let payload = DelegationPayload {
        domain: domain.into(),
        stop,
    };
    let payload = Payload::Registered(RegisteredPayload::new::<Delegation>(&payload).unwrap());
    Obligation {
        sequence: Some(n as u64),
        ..obligation(n, &id("principal"), target, 20_000, 30, payload)
    }
}

#[test]
fn the_kind_reads_checks_and_speaks_as_its_module_says() {
    let a = id("agent-1");
    let o = delegation(1, &a, "payments", true);
    assert_eq!(o.kind(), Kind::Registered("acme.delegation"));
    assert!(Kind::known().contains(&o.kind()));
    assert_eq!(Kind::from_name("acme.delegation"), Some(o.kind()));

    // CBOR both ways, the typed payload read again.
    let back = wire::decode_obligation(&wire::encode(&o)).unwrap();
    assert_eq!(back, o);
    let Payload::Registered(p) = &back.payload else {
        panic!("read as {:?}", back.payload)
    };
    assert_eq!(
        p.typed::<DelegationPayload>(),
        Some(&DelegationPayload {
            domain: "payments".into(),
            stop: true
        })
    );

    // A sender that orders the payload's map otherwise sends the same payload, written back
    // in one encoding: the same obligation, the same bytes, the same digest.
    let mut reordered = ciborium::Value::serialized(&o).unwrap();
    payload_of(&mut reordered).reverse();
    let read = wire::decode_obligation(&cbor(&reordered)).unwrap();
    assert_ne!(cbor(&reordered), wire::encode(&o));
    assert_eq!(read, o);
    assert_eq!(wire::encode(&read), wire::encode(&o));
    assert_eq!(read.digest(), o.digest());

    // The kind's own rule refuses an empty domain, when built and when read off the wire.
    assert!(RegisteredPayload::new::<Delegation>(&DelegationPayload {
        domain: String::new(),
        stop: true,
    })
    .is_err());
    let mut bad: ciborium::Value = ciborium::Value::serialized(&o).unwrap();
    set_payload(&mut bad, "domain", ciborium::Value::Text(String::new()));
    match wire::decode_obligation(&cbor(&bad)) {
        Err(e @ WireError::MalformedPayload { .. }) => {
            assert_eq!(e.decline_reason(), Some(DeclineReason::Malformed));
            assert!(e.to_string().contains("empty domain"), "{e}");
        }
        other => panic!("read as {other:?}"),
    }

    // A name nobody registered is an unknown kind, declinable by its envelope.
    let e = read_as(&o, "acme.other");
    assert_eq!(e.decline_reason(), Some(DeclineReason::UnknownKind));
    assert_eq!(e.envelope().map(|e| e.id), Some(o.id));

    // A name registered twice is not taken from either registration.
    assert_eq!(Kind::from_name("acme.twin"), None);
    assert!(!Kind::known().iter().any(|k| k.as_str() == "acme.twin"));
    let payload = DelegationPayload {
        domain: "payments".into(),
        stop: true,
    };
    assert!(RegisteredPayload::new::<Twin>(&payload).is_err());
    let e = read_as(&o, "acme.twin");
    assert_eq!(e.decline_reason(), Some(DeclineReason::UnknownKind));

    // Rules: stopping is under custody with the scope withheld; resuming is best-effort.
    use abhyasa::custody::kinds;
    assert!(kinds::known(&o) && kinds::admissible(&o));
    assert_eq!(
        kinds::safe(&o, 0),
        Some(SafeAction::WithholdScope {
            target: a.clone(),
            scope: Scope::new("delegation.payments").unwrap(),
            sequence: Some(1),
        })
    );
    let resume = delegation(2, &a, "payments", false);
    assert!(!kinds::admissible(&resume) && kinds::safe(&resume, 0).is_none());
    assert_eq!(
        kinds::effect(&resume),
        Some(ReceiverEffect::GrantScope(
            id("principal"),
            Scope::new("delegation.payments").unwrap(),
            None
        ))
    );

    // Its words, and its JSON shape (the payload's serde shape) both ways.
    assert_eq!(
        wire::words::obligation(&o),
        "acme.delegation stop acting in payments for agent-1"
    );
    let json = JsonObligation::of(&o).unwrap();
    assert_eq!(
        serde_json::to_value(&json).unwrap()["payload"],
        serde_json::json!({"domain": "payments", "stop": true})
    );
    assert_eq!(json.to_wire(&id("principal")).unwrap(), o);
}

/// Why `o` does not read when its kind is named `kind`.
fn read_as(o: &Obligation, kind: &str) -> WireError {
    let mut value = ciborium::Value::serialized(o).unwrap();
    set_field(&mut value, "kind", ciborium::Value::Text(kind.into()));
    wire::decode_obligation(&cbor(&value)).unwrap_err()
}

/// `value` as CBOR bytes.
fn cbor(value: &ciborium::Value) -> Vec<u8> {
    let mut bytes = Vec::new();
    ciborium::into_writer(value, &mut bytes).unwrap();
    bytes
}

/// `value`'s field `name` (an obligation as a CBOR map) set to `to`.
fn set_field(value: &mut ciborium::Value, name: &str, to: ciborium::Value) {
    let ciborium::Value::Map(entries) = value else {
        panic!("not a map")
    };
    for (k, v) in entries.iter_mut() {
        if k.as_text() == Some(name) {
            *v = to;
            return;
        }
    }
    panic!("no field {name}")
}

/// The obligation's payload field `name` set to `to`.
fn set_payload(value: &mut ciborium::Value, name: &str, to: ciborium::Value) {
    let payload = payload_of(value);
    let (_, v) = payload
        .iter_mut()
        .find(|(k, _)| k.as_text() == Some(name))
        .expect("the field");
    *v = to;
}

/// The entries of the obligation's payload map.
fn payload_of(value: &mut ciborium::Value) -> &mut Vec<(ciborium::Value, ciborium::Value)> {
    let ciborium::Value::Map(entries) = value else {
        panic!("not a map")
    };
    let payload = entries
        .iter_mut()
        .find(|(k, _)| k.as_text() == Some("payload"))
        .map(|(_, v)| v)
        .expect("a payload");
    let ciborium::Value::Map(fields) = payload else {
        panic!("the payload is not a map")
    };
    fields
}

/// The node `who`, durable under `dir/<who>`, with `peer` as its peer if given.
async fn node(ca: &Ca, who: &AgentId, dir: &std::path::Path, peer: Option<&Node>) -> Node {
    let mut builder = Node::builder(ca.issue(who).unwrap()).state_dir(dir.join(who.as_str()));
    if let Some(peer) = peer {
        builder = builder.peer(peer.agent().clone(), peer.local_addr());
    }
    builder.build().await.unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_nodes_carry_apply_enforce_and_recover_the_kind() {
    let dir = tempfile::tempdir().unwrap();
    let ca = Ca::generate("deployment").unwrap();
    let (p, a) = (id("principal"), id("agent-1"));
    let payments = Scope::new("delegation.payments").unwrap();
    let agent = node(&ca, &a, dir.path(), None).await;
    let principal = node(&ca, &p, dir.path(), Some(&agent)).await;

    let stop = delegation(1, &a, "payments", true);
    let handle = principal.issue(stop.clone()).await.unwrap();
    assert_eq!(handle.admission(), Admission::Custody);
    // The fail-safe stands on the principal's side from the issue.
    let ask = Ask::Scope {
        agent: a.clone(),
        scope: payments.clone(),
    };
    assert!(
        matches!(
            principal.decide(ask.clone()).await.unwrap(),
            Verdict::Refuse(_)
        ),
        "the principal does not refuse a stopped delegation"
    );
    let (record, escalation) = tokio::time::timeout(Duration::from_secs(10), handle.outcome())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(record.outcome, Outcome::Applied);
    assert_eq!(record.kind, Kind::Registered("acme.delegation"));
    assert!(escalation.is_none());
    assert!(agent.honours().await.unwrap().is_withheld(&p, &payments));

    // A resume is best-effort: sent once, not held in custody.
    let resume = delegation(2, &a, "travel", false);
    let handle = principal.issue(resume).await.unwrap();
    assert_eq!(handle.admission(), Admission::BestEffort);

    principal.shutdown().await;
    agent.shutdown().await;

    // Both stores read the kind back: the agent still withholds, the principal still refuses
    // and knows the obligation's outcome.
    let agent = node(&ca, &a, dir.path(), None).await;
    assert!(agent.honours().await.unwrap().is_withheld(&p, &payments));
    let principal = node(&ca, &p, dir.path(), Some(&agent)).await;
    assert!(matches!(
        principal.decide(ask).await.unwrap(),
        Verdict::Refuse(_)
    ));
    let status = principal.status().await.unwrap();
    assert!(
        status
            .recent
            .iter()
            .any(|r| r.obligation_id == stop.id && r.outcome == Outcome::Applied),
        "the principal lost the outcome: {:?}",
        status.recent
    );
    principal.shutdown().await;
    agent.shutdown().await;
}

#[test]
fn the_admin_issues_the_kind_from_its_json_payload() {
    use abhyasa_cli::admin::IssueSpec;
    let spec = |payload: Option<serde_json::Value>| -> IssueSpec {
        let mut v = serde_json::json!({"target": "agent-1", "kind": "acme.delegation"});
        if let Some(p) = payload {
            v["payload"] = p;
        }
        serde_json::from_value(v).unwrap()
    };
    let o = spec(Some(
        serde_json::json!({"domain": "payments", "stop": true}),
    ))
    .build(&id("principal"), |_| 7)
    .unwrap();
    assert_eq!(
        o.payload,
        delegation(1, &id("agent-1"), "payments", true).payload
    );
    assert_eq!((o.target.as_str(), o.max_retries), ("agent-1", 7));

    let missing = spec(None).build(&id("principal"), |_| 7).unwrap_err();
    assert!(missing.contains("--payload is required"), "{missing}");
    let empty = spec(Some(serde_json::json!({"domain": "", "stop": true})))
        .build(&id("principal"), |_| 7)
        .unwrap_err();
    assert!(empty.contains("empty domain"), "{empty}");
    let unknown = IssueSpec {
        kind: "acme.other".into(),
        ..spec(None)
    }
    .build(&id("principal"), |_| 7)
    .unwrap_err();
    assert!(unknown.contains("unknown kind"), "{unknown}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_a2a_agent_lists_the_kind_and_applies_it_posted_as_json() {
    use abhyasa::a2a::json::JsonAck;
    use abhyasa::a2a::{client, serve, A2aPeer, CardSettings};
    let dir = tempfile::tempdir().unwrap();
    let ca = Ca::generate("deployment").unwrap();
    let (p, a) = (id("principal"), id("agent-1"));
    let agent = node(&ca, &a, dir.path(), None).await;
    let https = std::net::SocketAddr::from(([127, 0, 0, 1], abhyasa_testkit::free_tcp()));
    let card = CardSettings::new(a.clone(), format!("https://agent-1:{}", https.port())).card();
    let _server = serve(agent.clone(), &ca.issue(&a).unwrap(), https, &card)
        .await
        .unwrap();
    let peer = A2aPeer {
        agent: a.clone(),
        card_url: format!(
            "https://agent-1:{}/.well-known/agent-card.json",
            https.port()
        ),
        addr: Some(https),
    };
    let http = client::http_client(&ca.issue(&p).unwrap(), &peer).unwrap();

    // The card offers the kind, with its own endpoint.
    let profiles = client::fetch_profiles(&http, &peer).await.unwrap();
    let profile = profiles
        .get(&Kind::Registered("acme.delegation"))
        .expect("the card lists acme.delegation");
    assert!(profile
        .obligation_endpoint
        .ends_with("/obligations/acme.delegation"));

    let post = |body: serde_json::Value| {
        let http = http.clone();
        let url = profile.obligation_endpoint.clone();
        async move {
            http.post(url)
                .header("content-type", "application/json")
                .body(body.to_string())
                .send()
                .await
                .unwrap()
        }
    };
    let obligation = |payload: serde_json::Value| {
        serde_json::json!({
            "obligation_id": "deleg-1",
            "kind": "acme.delegation",
            "target": "agent-1",
            "payload": payload,
            "deadline_seconds": 3600,
            "max_retries": 15,
            "created_at": abhyasa::a2a::json::format_time(wire::UnixMillis(abhyasa_testkit::now_ms())),
        })
    };
    // A payload breaking the kind's rule is refused with the kind's words; nothing applies.
    let r = post(obligation(serde_json::json!({"domain": "", "stop": true}))).await;
    assert_eq!(r.status(), 400);
    let text = String::from_utf8_lossy(&r.bytes().await.unwrap()).into_owned();
    assert!(text.contains("empty domain"), "{text}");
    assert!(agent.status().await.unwrap().applied.is_empty());

    let r = post(obligation(
        serde_json::json!({"domain": "payments", "stop": true}),
    ))
    .await;
    assert_eq!(r.status(), 200);
    let ack: JsonAck = serde_json::from_slice(&r.bytes().await.unwrap()).unwrap();
    assert_eq!(
        (ack.obligation_id.as_str(), ack.status.as_str()),
        ("deleg-1", "applied")
    );
    let payments = Scope::new("delegation.payments").unwrap();
    assert!(agent.honours().await.unwrap().is_withheld(&p, &payments));
    agent.shutdown().await;
}
