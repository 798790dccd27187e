//! Events out, none lost: a node whose obligations escalate delivers each escalation to a
//! webhook (signed with its certificate key, Standard Webhooks v1a) and an exec hook. The
//! webhook refuses some first attempts (the node retries with backoff), and holds one delivery
//! unanswered while the test SIGKILLs the node; after the restart every escalation arrives at
//! least once at both sinks, each under its own key, and a repeat carries the same key.

mod common;

use std::collections::{BTreeMap, BTreeSet};
use std::io::{Read as _, Write as _};
use std::net::{TcpListener, TcpStream};
use std::os::unix::fs::PermissionsExt as _;
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use base64::Engine as _;
use common::{status, wait_for, NodeProc};

/// Obligations issued (each escalates: its target never answers).
const N: usize = 12;
/// The delivery held unanswered while the node is killed (the n-th distinct event).
const HOLD_AT: usize = 5;

/// One request the webhook received.
#[derive(Clone, Debug)]
struct Received {
    id: String,
    timestamp: String,
    signature: String,
    body: Vec<u8>,
}

#[derive(Default)]
struct Hook {
    received: Vec<Received>,
    refused: usize,
    /// Set once the held delivery came in (its connection is kept, never answered).
    held: Option<TcpStream>,
}

/// Reads one HTTP/1.1 request: its headers (lower-cased names) and body.
fn read_request(stream: &mut TcpStream) -> Option<(BTreeMap<String, String>, Vec<u8>)> {
    let mut buf = Vec::new();
    let mut chunk = [0u8; 4096];
    let header_end = loop {
        if let Some(i) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
            break i + 4;
        }
        let n = stream.read(&mut chunk).ok()?;
        if n == 0 {
            return None;
        }
        buf.extend_from_slice(&chunk[..n]);
    };
    let head = String::from_utf8_lossy(&buf[..header_end]).to_string();
    let headers: BTreeMap<String, String> = head
        .lines()
        .skip(1)
        .filter_map(|l| l.split_once(':'))
        .map(|(k, v)| (k.trim().to_ascii_lowercase(), v.trim().to_owned()))
        .collect();
    let len: usize = headers.get("content-length")?.parse().ok()?;
    let mut body = buf[header_end..].to_vec();
    while body.len() < len {
        let n = stream.read(&mut chunk).ok()?;
        if n == 0 {
            return None;
        }
        body.extend_from_slice(&chunk[..n]);
    }
    Some((headers, body))
}

/// The webhook: refuses the first attempt of every third new event with 503, holds the
/// delivery of the `HOLD_AT`-th new event unanswered, takes the rest with 204.
fn serve(listener: TcpListener, hook: Arc<Mutex<Hook>>) {
    for stream in listener.incoming() {
        let Ok(mut stream) = stream else { continue };
        let Some((headers, body)) = read_request(&mut stream) else {
            continue;
        };
        let got = Received {
            id: headers.get("webhook-id").cloned().unwrap_or_default(),
            timestamp: headers
                .get("webhook-timestamp")
                .cloned()
                .unwrap_or_default(),
            signature: headers
                .get("webhook-signature")
                .cloned()
                .unwrap_or_default(),
            body,
        };
        let mut h = hook.lock().unwrap();
        let distinct: BTreeSet<&str> = h.received.iter().map(|r| r.id.as_str()).collect();
        let new = !distinct.contains(got.id.as_str());
        let nth = distinct.len() + usize::from(new);
        h.received.push(got);
        if new && nth == HOLD_AT && h.held.is_none() {
            h.held = Some(stream);
            continue;
        }
        let answer: &[u8] = if new && nth % 3 == 0 {
            h.refused += 1;
            b"HTTP/1.1 503 Service Unavailable\r\ncontent-length: 0\r\nconnection: close\r\n\r\n"
        } else {
            b"HTTP/1.1 204 No Content\r\nconnection: close\r\n\r\n"
        };
        let _ = stream.write_all(answer);
    }
}

#[test]
fn every_escalation_reaches_the_webhook_and_the_exec_hook_across_a_sigkill() {
    let dir = tempfile::tempdir().unwrap();
    let certs = common::certs(dir.path());
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let url = format!("http://{}/hook", listener.local_addr().unwrap());
    let hook = Arc::new(Mutex::new(Hook::default()));
    std::thread::spawn({
        let hook = hook.clone();
        move || serve(listener, hook)
    });
    let exec_log = dir.path().join("exec.jsonl");
    let script = dir.path().join("hook.sh");
    std::fs::write(
        &script,
        format!(
            "#!/bin/sh\n{{ printf '%s ' \"$ABHYASA_EVENT_ID\"; cat; echo; }} >> '{}'\n",
            exec_log.display()
        ),
    )
    .unwrap();
    std::fs::set_permissions(&script, std::fs::Permissions::from_mode(0o755)).unwrap();
    let admin = dir.path().join("admin.sock").display().to_string();
    let (cfg, _) = common::config(
        dir.path(),
        &certs,
        &format!(
            "admin = \"{admin}\"\n\n[events]\nbackoff_min_ms = 50\nbackoff_max_ms = 400\n\n\
             [events.webhook]\nurl = \"{url}\"\ntimeout_ms = 60000\n\n\
             [events.exec]\ncommand = \"{}\"\n",
            script.display()
        ),
    );
    let node = NodeProc::start(&cfg);
    wait_for("the admin socket", Duration::from_secs(30), || {
        Path::new(&admin).exists() && status(&admin).is_some()
    });
    let ids: Vec<String> = (0..N)
        .map(|i| common::issue_revoke(&admin, "agent-2", &format!("scope.{i}"), 1_500))
        .collect();

    // Mid-delivery: the held request came in, unanswered; the node dies with it in flight.
    wait_for("the held delivery", Duration::from_secs(60), || {
        hook.lock().unwrap().held.is_some()
    });
    drop(node);
    let before_restart = hook.lock().unwrap().received.len();
    let _node = NodeProc::start(&cfg);

    let keys: BTreeSet<String> = ids.iter().map(|id| format!("escalated-{id}")).collect();
    wait_for(
        "every escalation at the webhook and the exec hook",
        Duration::from_secs(90),
        || {
            let at_hook: BTreeSet<String> = hook
                .lock()
                .unwrap()
                .received
                .iter()
                .map(|r| r.id.clone())
                .collect();
            let execd: BTreeSet<String> = std::fs::read_to_string(&exec_log)
                .unwrap_or_default()
                .lines()
                .filter_map(|l| l.split_once(' ').map(|(k, _)| k.to_owned()))
                .collect();
            keys.is_subset(&at_hook) && keys.is_subset(&execd)
        },
    );
    // Every delivery is signed with the node's certificate key over id.timestamp.body, and
    // says what escalated, with the safe action that stands.
    let identity = abhyasa_moq::Identity::load(
        Path::new(&certs),
        &abhyasa_wire::AgentId::new("agent-1").unwrap(),
    )
    .unwrap();
    let key = abhyasa_moq::certificate_key(&identity).unwrap();
    let h = hook.lock().unwrap();
    let mut bodies: BTreeMap<&str, Vec<serde_json::Value>> = BTreeMap::new();
    for r in &h.received {
        let sig = r.signature.strip_prefix("v1a,").expect("a v1a signature");
        let sig = base64::engine::general_purpose::STANDARD
            .decode(sig)
            .unwrap();
        let sig = ed25519_dalek::Signature::from_slice(&sig).unwrap();
        let signed = [r.id.as_bytes(), b".", r.timestamp.as_bytes(), b".", &r.body].concat();
        key.verify_strict(&signed, &sig)
            .unwrap_or_else(|e| panic!("{}: {e}", r.id));
        let body: serde_json::Value = serde_json::from_slice(&r.body).unwrap();
        assert_eq!(body["id"], r.id.as_str(), "{body}");
        bodies.entry(r.id.as_str()).or_default().push(body);
    }
    // A signature over other bytes does not verify (the check above can fail).
    let r = &h.received[0];
    let sig = base64::engine::general_purpose::STANDARD
        .decode(r.signature.strip_prefix("v1a,").unwrap())
        .unwrap();
    let forged = [r.id.as_bytes(), b".0.", &r.body].concat();
    assert!(key
        .verify_strict(
            &forged,
            &ed25519_dalek::Signature::from_slice(&sig).unwrap()
        )
        .is_err());
    for (i, id) in ids.iter().enumerate() {
        let seen = &bodies[format!("escalated-{id}").as_str()];
        for b in seen {
            assert_eq!(b["type"], "obligation.escalated", "{b}");
            assert_eq!(b["node"], "agent-1", "{b}");
            assert_eq!(b["data"]["obligation_id"], id.as_str(), "{b}");
            assert_eq!(b["data"]["target"], "agent-2", "{b}");
            assert_eq!(b["data"]["safe_action"]["type"], "withhold_scope", "{b}");
            assert_eq!(
                b["data"]["safe_action"]["scope"],
                format!("scope.{i}"),
                "{b}"
            );
            // A repeat is the same event: same body but for nothing.
            assert_eq!(b, &seen[0]);
        }
    }
    // Nothing but these events came (no event without its obligation).
    let distinct: BTreeSet<&str> = bodies.keys().copied().collect();
    assert_eq!(distinct.len(), N, "{distinct:?}");
    let repeats = h.received.len() - N;
    assert!(
        h.refused >= 1 && repeats > h.refused,
        "{repeats} repeats, {} refused",
        h.refused
    );
    // The held event was delivered again after the restart, under its key.
    let held_id = {
        let mut seen = BTreeSet::new();
        h.received
            .iter()
            .map(|r| r.id.clone())
            .find(|id| seen.insert(id.clone()) && seen.len() == HOLD_AT)
            .unwrap()
    };
    assert!(
        h.received[before_restart..].iter().any(|r| r.id == held_id),
        "the held event {held_id} was not delivered again"
    );
    drop(h);
    // Once every sink took every event, the outbox is empty.
    wait_for("an empty outbox", Duration::from_secs(30), || {
        status(&admin).is_some_and(|s| s["outbox"] == 0)
    });
    let total = hook.lock().unwrap().received.len();
    println!(
        "events out: {N} escalations, {total} webhook deliveries ({repeats} repeats: {} refused \
         and retried, the rest redelivered after the SIGKILL), every signature verified, \
         every key at the exec hook",
        hook.lock().unwrap().refused
    );
}
