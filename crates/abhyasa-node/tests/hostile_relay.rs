//! A hostile MOQT relay between real nodes: our own in-process draft-14 forwarder that holds a
//! valid deployment certificate (`relay`) and does everything a relay can do to objects — alter
//! them, replay them, send them to the wrong agent, forge its own, and impersonate an agent that
//! never connected. End-to-end signatures must leave it only delay: no wrongful apply, no
//! wrongful discharge, nothing applied twice.

mod common;

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use abhyasa_moq::{Ca, SignedKind, Signer, Verifier};
use abhyasa_node::{IssueHandle, Node};
use abhyasa_wire::moqt::{
    Control, KeyValue, Namespace, ObjectBody, StreamObject, SubgroupHeader, SubgroupId, DRAFT_14,
};
use abhyasa_wire::{decode_obligation, encode, AckStatus, AgentId, CustodyAck, Outcome};
use common::{custodian, id, revoke};
use tokio::sync::mpsc;

/// What the relay does to each object it forwards.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Mode {
    /// Flips one byte of every object: nothing it forwards verifies.
    Tamper,
    /// Forwards every object, then replays it, and sends a copy of every obligation to every
    /// other agent subscribed to the same publisher.
    Hostile,
}

/// One client session at the relay.
struct Client {
    conn: quinn::Connection,
    control: mpsc::UnboundedSender<Control>,
    /// The agent whose namespace it published.
    owner: Option<AgentId>,
    /// Whether it asked for namespaces (SUBSCRIBE_NAMESPACE).
    wants_namespaces: bool,
    next_request: u64,
}

/// A subscription the relay forwarded to a publisher: who subscribed downstream.
struct Upstream {
    publisher: usize,
    name: Vec<u8>,
    /// The publisher's alias, once it answered.
    alias: Option<u64>,
    /// (subscriber client, its request id, the alias we gave it).
    subscribers: Vec<(usize, u64, u64)>,
}

#[derive(Default)]
struct RelayState {
    clients: Vec<Client>,
    upstreams: Vec<Upstream>,
    /// (publisher client, our request id) → upstream index.
    requests: HashMap<(usize, u64), usize>,
    next_alias: u64,
    /// The ghost's tracks the principal subscribed to: (client, track name) → alias.
    ghost_tracks: HashMap<(usize, Vec<u8>), u64>,
    /// Obligations the ghost received, by id (for the test to see the attack happened).
    ghost_obligations: u64,
    /// Genuine acks seen on the way (replayed as if the ghost's).
    genuine_acks: Vec<Vec<u8>>,
}

/// The hostile relay.
#[derive(Clone)]
struct HostileRelay {
    state: Arc<Mutex<RelayState>>,
    mode: Arc<Mutex<Mode>>,
    ghost: AgentId,
    forger: Arc<Signer>,
    verifier: Arc<Verifier>,
}

impl HostileRelay {
    fn st(&self) -> std::sync::MutexGuard<'_, RelayState> {
        self.state.lock().unwrap()
    }

    fn send(&self, client: usize, msg: Control) {
        let _ = self.st().clients[client].control.send(msg);
    }

    fn next_request(&self, client: usize) -> u64 {
        let mut st = self.st();
        let c = &mut st.clients[client];
        let id = c.next_request;
        c.next_request += 2;
        id
    }

    /// Starts serving on `ep`.
    fn serve(self, ep: quinn::Endpoint) {
        tokio::spawn(async move {
            while let Some(incoming) = ep.accept().await {
                let relay = self.clone();
                tokio::spawn(async move {
                    if let Ok(conn) = incoming.await {
                        relay.client(conn).await;
                    }
                });
            }
        });
    }

    async fn client(&self, conn: quinn::Connection) {
        let Ok((mut send, mut recv)) = conn.accept_bi().await else {
            return;
        };
        let (tx, mut rx) = mpsc::unbounded_channel::<Control>();
        tokio::spawn(async move {
            while let Some(m) = rx.recv().await {
                let mut out = Vec::new();
                m.encode(&mut out);
                if send.write_all(&out).await.is_err() {
                    return;
                }
            }
        });
        let me = {
            let mut st = self.st();
            st.clients.push(Client {
                conn: conn.clone(),
                control: tx,
                owner: None,
                wants_namespaces: false,
                next_request: 1,
            });
            st.clients.len() - 1
        };
        let relay = self.clone();
        let data_conn = conn.clone();
        tokio::spawn(async move {
            while let Ok(mut s) = data_conn.accept_uni().await {
                if let Ok(bytes) = s.read_to_end(1 << 20).await {
                    relay.data(me, &bytes).await;
                }
            }
        });
        let mut buf = Vec::new();
        loop {
            let msg = loop {
                if let Ok(Some((m, used))) = Control::decode(&buf) {
                    buf.drain(..used);
                    break Some(m);
                }
                let mut chunk = [0u8; 4096];
                match recv.read(&mut chunk).await {
                    Ok(Some(n)) => buf.extend_from_slice(&chunk[..n]),
                    _ => break None,
                }
            };
            let Some(msg) = msg else { return };
            self.control(me, msg);
        }
    }

    fn announce_to(&self, client: usize, ns: Namespace) {
        let request_id = self.next_request(client);
        self.send(
            client,
            Control::PublishNamespace {
                request_id,
                namespace: ns,
                params: vec![],
            },
        );
    }

    fn control(&self, me: usize, msg: Control) {
        match msg {
            Control::ClientSetup { .. } => self.send(
                me,
                Control::ServerSetup {
                    version: DRAFT_14,
                    params: vec![KeyValue::Int {
                        key: 0x02,
                        value: 1 << 20,
                    }],
                },
            ),
            Control::PublishNamespace {
                request_id,
                namespace,
                ..
            } => {
                self.send(me, Control::PublishNamespaceOk { request_id });
                let owner = owner_of(&namespace);
                let others: Vec<usize> = {
                    let mut st = self.st();
                    st.clients[me].owner = owner.clone();
                    (0..st.clients.len())
                        .filter(|c| *c != me && st.clients[*c].wants_namespaces)
                        .collect()
                };
                for c in others {
                    self.announce_to(c, namespace.clone());
                }
                // The ghost wants what this node addresses to it.
                if owner.is_some() {
                    let request_id = self.next_request(me);
                    self.send(
                        me,
                        Control::Subscribe {
                            request_id,
                            namespace,
                            name: format!("to/{}", self.ghost).into_bytes(),
                            priority: 0,
                            group_order: 1,
                            forward: 1,
                            filter: abhyasa_wire::moqt::Filter::LargestObject,
                            params: vec![],
                        },
                    );
                }
            }
            Control::SubscribeNamespace { request_id, .. } => {
                self.send(me, Control::SubscribeNamespaceOk { request_id });
                let known: Vec<Namespace> = {
                    let mut st = self.st();
                    st.clients[me].wants_namespaces = true;
                    let mine = st.clients[me].owner.clone();
                    st.clients
                        .iter()
                        .filter_map(|c| c.owner.clone())
                        .filter(|o| Some(o) != mine.as_ref())
                        .map(|o| abhyasa_moq::namespace(&o))
                        .collect()
                };
                for ns in known {
                    self.announce_to(me, ns);
                }
                // An agent that never connected, played by the relay.
                self.announce_to(me, abhyasa_moq::namespace(&self.ghost));
            }
            Control::Subscribe {
                request_id,
                namespace,
                name,
                ..
            } => {
                let Some(owner) = owner_of(&namespace) else {
                    return;
                };
                if owner == self.ghost {
                    let alias = {
                        let mut st = self.st();
                        st.next_alias += 1;
                        let a = st.next_alias;
                        st.ghost_tracks.insert((me, name), a);
                        a
                    };
                    self.send(me, ok(request_id, alias));
                    return;
                }
                let publisher = {
                    let st = self.st();
                    st.clients
                        .iter()
                        .position(|c| c.owner.as_ref() == Some(&owner))
                };
                let Some(publisher) = publisher else {
                    self.send(
                        me,
                        Control::SubscribeError {
                            request_id,
                            code: 0x4,
                            reason: "no such publisher".into(),
                        },
                    );
                    return;
                };
                let upstream_request = self.next_request(publisher);
                let mut st = self.st();
                st.next_alias += 1;
                let alias = st.next_alias;
                st.upstreams.push(Upstream {
                    publisher,
                    name: name.clone(),
                    alias: None,
                    subscribers: vec![(me, request_id, alias)],
                });
                let u = st.upstreams.len() - 1;
                st.requests.insert((publisher, upstream_request), u);
                drop(st);
                self.send(
                    publisher,
                    Control::Subscribe {
                        request_id: upstream_request,
                        namespace,
                        name,
                        priority: 0,
                        group_order: 1,
                        forward: 1,
                        filter: abhyasa_wire::moqt::Filter::LargestObject,
                        params: vec![],
                    },
                );
            }
            Control::SubscribeOk {
                request_id,
                track_alias,
                ..
            } => {
                let answers = {
                    let mut st = self.st();
                    match st.requests.get(&(me, request_id)).copied() {
                        Some(u) => {
                            st.upstreams[u].alias = Some(track_alias);
                            st.upstreams[u].subscribers.clone()
                        }
                        // Our own subscription as the ghost.
                        None => Vec::new(),
                    }
                };
                for (c, rid, alias) in answers {
                    self.send(c, ok(rid, alias));
                }
            }
            _ => {}
        }
    }

    /// A subgroup stream from client `from`.
    async fn data(&self, from: usize, bytes: &[u8]) {
        let Ok(Some((header, at))) = SubgroupHeader::decode(bytes) else {
            return;
        };
        let Ok(Some((object, _))) = StreamObject::decode(&bytes[at..], header.extensions) else {
            return;
        };
        let ObjectBody::Payload(payload) = object.body else {
            return;
        };
        // Which upstream track is it?
        let found = {
            let st = self.st();
            st.upstreams
                .iter()
                .find(|u| u.publisher == from && u.alias == Some(header.track_alias))
                .map(|u| (u.name.clone(), u.subscribers.clone()))
        };
        let Some((name, subscribers)) = found else {
            // Not a forwarded track: our ghost subscription to `to/ghost`.
            self.ghost_obligation(from, &payload).await;
            return;
        };
        if name.starts_with(b"acks/") {
            self.st().genuine_acks.push(payload.clone());
        }
        let mode = *self.mode.lock().unwrap();
        let mut sends: Vec<(usize, u64, Vec<u8>)> = Vec::new();
        match mode {
            Mode::Tamper => {
                let mut bad = payload.clone();
                let last = bad.len() - 1;
                bad[last] ^= 0x40;
                for (c, _, alias) in &subscribers {
                    sends.push((*c, *alias, bad.clone()));
                }
            }
            Mode::Hostile => {
                for (c, _, alias) in &subscribers {
                    sends.push((*c, *alias, payload.clone()));
                    sends.push((*c, *alias, payload.clone())); // replayed
                }
                // Redirected: every obligation also to every other agent subscribed to this
                // publisher's `to/...` tracks.
                if name.starts_with(b"to/") {
                    let st = self.st();
                    for u in st
                        .upstreams
                        .iter()
                        .filter(|u| u.publisher == from && u.name != name)
                        .filter(|u| u.name.starts_with(b"to/"))
                    {
                        for (c, _, alias) in &u.subscribers {
                            sends.push((*c, *alias, payload.clone()));
                        }
                    }
                }
            }
        }
        for (c, alias, p) in sends {
            self.write(c, alias, &p).await;
        }
    }

    /// The ghost got an obligation: answer it with acks it has no key for.
    async fn ghost_obligation(&self, from: usize, payload: &[u8]) {
        let Ok(opened) = self.verifier.open(SignedKind::Obligation, payload) else {
            return;
        };
        let Ok(o) = decode_obligation(&opened.payload) else {
            return;
        };
        let ack = encode(&CustodyAck {
            obligation_id: o.id,
            target: self.ghost.clone(),
            status: AckStatus::Applied,
            acked_at: o.created_at,
            detail: None,
        });
        let (alias, replayed) = {
            let mut st = self.st();
            st.ghost_obligations += 1;
            let alias = st
                .ghost_tracks
                .get(&(from, format!("acks/{}", o.issuer).into_bytes()))
                .copied();
            (alias, st.genuine_acks.last().cloned())
        };
        let Some(alias) = alias else { return };
        // Unsigned; signed by the relay's own (valid) certificate; another agent's genuine
        // signed ack, as if the ghost's.
        let mut forged = vec![ack.clone(), self.forger.sign(SignedKind::Ack, &ack)];
        forged.extend(replayed);
        for p in forged {
            self.write(from, alias, &p).await;
        }
    }

    async fn write(&self, client: usize, alias: u64, payload: &[u8]) {
        let conn = self.st().clients[client].conn.clone();
        let mut out = Vec::new();
        SubgroupHeader {
            track_alias: alias,
            group: rand_group(),
            subgroup: SubgroupId::Zero,
            priority: 0,
            extensions: false,
            end_of_group: true,
        }
        .encode(&mut out);
        StreamObject {
            object_id_delta: 0,
            extensions: vec![],
            body: ObjectBody::Payload(payload.to_vec()),
        }
        .encode(false, &mut out);
        if let Ok(mut s) = conn.open_uni().await {
            let _ = s.write_all(&out).await;
            let _ = s.finish();
        }
    }
}

fn rand_group() -> u64 {
    use std::sync::atomic::{AtomicU64, Ordering};
    static NEXT: AtomicU64 = AtomicU64::new(1);
    NEXT.fetch_add(1, Ordering::Relaxed)
}

fn ok(request_id: u64, track_alias: u64) -> Control {
    Control::SubscribeOk {
        request_id,
        track_alias,
        expires: 0,
        group_order: 1,
        largest: None,
        params: vec![],
    }
}

fn owner_of(ns: &Namespace) -> Option<AgentId> {
    match ns.0.as_slice() {
        [a, v, who] if a == b"abhyasa" && v == b"v1" => {
            AgentId::new(std::str::from_utf8(who).ok()?).ok()
        }
        _ => None,
    }
}

async fn outcome(h: IssueHandle) -> Outcome {
    tokio::time::timeout(Duration::from_secs(30), h.outcome())
        .await
        .expect("an outcome in time")
        .expect("the node runs")
        .0
        .outcome
}

/// Each applied id at `node`, with how many times it was applied.
async fn applied(node: &Node) -> Vec<(abhyasa_wire::ObligationId, u32)> {
    let mut v: Vec<_> = node
        .status()
        .await
        .unwrap()
        .applied
        .iter()
        .map(|e| (e.obligation.id, e.earlier + 1))
        .collect();
    v.sort();
    v
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hostile_relay_causes_no_wrongful_apply_or_discharge() {
    let dir = tempfile::tempdir().unwrap();
    let ca = Ca::generate("t").unwrap();
    let relay_id = ca.issue(&id("relay")).unwrap();
    let ep = abhyasa_moq::endpoint(
        &relay_id,
        "127.0.0.1:0".parse().unwrap(),
        &abhyasa_moq::TransportSettings::default(),
    )
    .unwrap();
    let addr: SocketAddr = ep.local_addr().unwrap();
    let relay = HostileRelay {
        state: Arc::default(),
        mode: Arc::new(Mutex::new(Mode::Tamper)),
        ghost: id("agent-ghost"),
        forger: Arc::new(Signer::new(&relay_id).unwrap()),
        verifier: Arc::new(Verifier::new(ca.certificate().clone())),
    };
    relay.clone().serve(ep);

    let start = |who: &str| {
        Node::builder(ca.issue(&id(who)).unwrap())
            .state_dir(dir.path().join(who))
            .relay(id("relay"), addr)
            .custodian(custodian())
            .build()
    };
    let principal = start("principal").await.unwrap();
    let a1 = start("agent-1").await.unwrap();
    let a2 = start("agent-2").await.unwrap();
    let (x1, x2) = (id("agent-1"), id("agent-2"));

    // Tampering: everything the relay forwards is altered. Nothing is applied; the principal
    // keeps custody and the agents count what did not verify.
    let h1 = principal.issue(revoke(1, &x1, 30_000)).await.unwrap();
    let h2 = principal.issue(revoke(2, &x2, 30_000)).await.unwrap();
    tokio::time::timeout(Duration::from_secs(10), async {
        loop {
            let s1 = a1.status().await.unwrap().unverified;
            let s2 = a2.status().await.unwrap().unverified;
            if s1.contains_key(&id("principal")) && s2.contains_key(&id("principal")) {
                return;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await
    .expect("the agents dropped the altered obligations");
    assert!(applied(&a1).await.is_empty());
    assert!(applied(&a2).await.is_empty());
    assert_eq!(principal.status().await.unwrap().pending.len(), 2);

    // Hostile: forwarded, replayed, and redirected to the other agent; the ghost (played by
    // the relay) answers its own obligation with forged acks.
    *relay.mode.lock().unwrap() = Mode::Hostile;
    assert_eq!(outcome(h1).await, Outcome::Applied);
    assert_eq!(outcome(h2).await, Outcome::Applied);
    let ghost = principal
        .issue(revoke(3, &id("agent-ghost"), 4_000))
        .await
        .unwrap();
    let ghost_outcome = outcome(ghost).await;
    // Each agent applied its own obligation once, and nothing addressed to the other.
    assert_eq!(applied(&a1).await, vec![(revoke(1, &x1, 0).id, 1)]);
    assert_eq!(applied(&a2).await, vec![(revoke(2, &x2, 0).id, 1)]);
    // The ghost's obligation reached the relay and was "acked" by forgeries: still it ends
    // escalated, never applied.
    assert!(relay.st().ghost_obligations > 0, "the attack never ran");
    assert!(
        matches!(ghost_outcome, Outcome::Escalated(_)),
        "{ghost_outcome:?}"
    );
    let dropped = principal
        .status()
        .await
        .unwrap()
        .unverified
        .get(&id("agent-ghost"))
        .copied()
        .unwrap_or(0);
    assert!(dropped >= 2, "forged acks dropped: {dropped}");
    eprintln!(
        "hostile relay: altered objects dropped (agent-1 {:?}, agent-2 {:?}), replays and \
         redirects applied nothing twice or elsewhere, {} forged acks for the ghost dropped, its \
         obligation {ghost_outcome:?}",
        a1.status().await.unwrap().unverified.get(&id("principal")),
        a2.status().await.unwrap().unverified.get(&id("principal")),
        dropped
    );
    for n in [principal, a1, a2] {
        n.shutdown().await;
    }
}
