//! Accepted sessions into the core: sessions per peer bounded, each session's objects
//! verified (signatures, in batches) and forwarded in order, and a stalled stream found.

use super::*;

/// Live accepted sessions per peer, oldest first, for `Limits::sessions_per_peer`.
#[derive(Clone, Default)]
pub(super) struct SessionsPerPeer(Arc<Mutex<HashMap<AgentId, Vec<quinn::Connection>>>>);

impl SessionsPerPeer {
    /// Counts a new session of `peer`; at the limit, that peer's oldest sessions are closed
    /// with a reason naming it. The entry goes when the connection closes.
    pub(super) fn admit(
        &self,
        peer: &AgentId,
        conn: &quinn::Connection,
        limit: usize,
        metrics: &crate::metrics::NodeMetrics,
    ) {
        {
            let mut map = self.0.lock().unwrap_or_else(|e| e.into_inner());
            let live = map.entry(peer.clone()).or_default();
            live.retain(|c| c.close_reason().is_none());
            let excess = (live.len() + 1).saturating_sub(limit.max(1));
            for old in live.drain(..excess) {
                info!(%peer, limit, "sessions per peer limit: closing the oldest");
                let reason = format!("sessions per peer limit ({limit}): replaced by a newer one");
                old.close(0u32.into(), reason.as_bytes());
                metrics.refused("sessions_per_peer");
            }
            live.push(conn.clone());
        }
        let (this, peer, conn) = (self.clone(), peer.clone(), conn.clone());
        tokio::spawn(async move {
            conn.closed().await;
            let mut map = this.0.lock().unwrap_or_else(|e| e.into_inner());
            if let Some(live) = map.get_mut(&peer) {
                live.retain(|c| c.stable_id() != conn.stable_id());
                if live.is_empty() {
                    map.remove(&peer);
                }
            }
        });
    }
}

/// Returns when `conn` closes (`false`) or has sent without hearing anything back for `min`
/// (or three smoothed RTTs, if longer) — then it closes it and returns `true`.
pub(super) async fn watch_for_stall(conn: &quinn::Connection, min: Duration) -> bool {
    // Only frames the peer must acknowledge count as "sent": an ACK of the peer's keep-alive
    // expects no answer.
    let eliciting =
        |s: &quinn::ConnectionStats| s.frame_tx.stream + s.frame_tx.ping + s.frame_tx.datagram;
    let first = conn.stats();
    let (mut heard_count, mut sent_mark) = (first.udp_rx.datagrams, eliciting(&first));
    let mut heard_at = Instant::now();
    let tick = (min / 5).max(Duration::from_millis(10));
    loop {
        tokio::select! {
            _ = conn.closed() => return false,
            () = tokio::time::sleep(tick) => {}
        }
        let now_stats = conn.stats();
        if now_stats.udp_rx.datagrams != heard_count {
            heard_count = now_stats.udp_rx.datagrams;
            sent_mark = eliciting(&now_stats);
            heard_at = Instant::now();
            continue;
        }
        let limit = min.max(conn.rtt() * 3);
        if heard_at.elapsed() >= limit && eliciting(&now_stats) > sent_mark {
            conn.close(0u32.into(), b"stalled");
            return true;
        }
    }
}

/// Hands a session to the core and forwards its events, tagged with its connection id.
/// Obligations and acks are verified here, on the session's own task (off the core, across
/// cores): each must be signed end to end by the session's peer; the core sees only the
/// signed object's bytes. What does not verify is dropped and reported. The events that have
/// arrived together (at most [`VERIFY_BATCH`]) are verified together.
pub(super) async fn forward(
    s: Session,
    mut rx: mpsc::Receiver<SessionEvent>,
    itx: mpsc::Sender<Internal>,
    verifier: Arc<Checks>,
) {
    let (peer, id) = (s.peer().clone(), s.connection().stable_id());
    if itx.send(Internal::Up(Link::Direct(s))).await.is_err() {
        return;
    }
    let mut arrived = Vec::with_capacity(VERIFY_BATCH);
    while rx.recv_many(&mut arrived, VERIFY_BATCH).await > 0 {
        let events = arrived.drain(..).map(|e| (peer.clone(), e)).collect();
        for (peer, e) in verified_all(&verifier, events) {
            let closed = matches!(e, Ok(SessionEvent::Closed(_)));
            let msg = match e {
                Ok(e) => Internal::Event(peer, id, e),
                Err(why) => Internal::Unverified(peer, why),
            };
            if itx.send(msg).await.is_err() || closed {
                return;
            }
        }
    }
    let _ = itx
        .send(Internal::Event(
            peer,
            id,
            SessionEvent::Closed("events ended".into()),
        ))
        .await;
}

/// Hands the peers met at a relay to the core and forwards their events, tagged with the
/// relay connection's id. A peer is up (again) each time it subscribes to our tracks for it;
/// objects are verified as on a direct session, the signer held to the namespace they came
/// from. When the relay session ends, every peer met there is down.
pub(super) async fn forward_relay(
    r: RelaySession,
    mut rx: mpsc::Receiver<RelayEvent>,
    itx: mpsc::Sender<Internal>,
    verifier: Arc<Checks>,
) {
    /// What goes to the core, in the order it arrived.
    enum Slot {
        Send(Internal),
        /// The next of the objects verified together.
        Object,
        Closed(String),
    }
    let id = r.connection().stable_id();
    let mut met = std::collections::BTreeSet::new();
    let mut arrived = Vec::with_capacity(VERIFY_BATCH);
    while rx.recv_many(&mut arrived, VERIFY_BATCH).await > 0 {
        let mut msgs = Vec::with_capacity(arrived.len());
        let mut objects = Vec::new();
        for e in arrived.drain(..) {
            match e {
                RelayEvent::PeerSubscribed { peer, track } => {
                    met.insert(peer.clone());
                    msgs.push(Slot::Send(Internal::Up(Link::Relayed(
                        r.clone(),
                        peer.clone(),
                    ))));
                    msgs.push(Slot::Send(Internal::Event(
                        peer,
                        id,
                        SessionEvent::PeerSubscribed(track),
                    )));
                }
                RelayEvent::Object {
                    from,
                    track,
                    payload,
                } => {
                    // Verified below, all together; its place kept.
                    objects.push((from, SessionEvent::Object { track, payload }));
                    msgs.push(Slot::Object);
                }
                RelayEvent::Closed(reason) => {
                    msgs.push(Slot::Closed(reason));
                    break;
                }
            }
        }
        let mut opened = verified_all(&verifier, objects).into_iter();
        for m in msgs {
            let m = match m {
                Slot::Closed(reason) => {
                    for peer in std::mem::take(&mut met) {
                        let closed = SessionEvent::Closed(reason.clone());
                        let _ = itx.send(Internal::Event(peer, id, closed)).await;
                    }
                    return;
                }
                Slot::Send(m) => m,
                Slot::Object => match opened.next() {
                    Some((from, Ok(e))) => Internal::Event(from, id, e),
                    Some((from, Err(why))) => Internal::Unverified(from, why),
                    None => continue,
                },
            };
            if itx.send(m).await.is_err() {
                return;
            }
        }
    }
    for peer in met {
        let closed = SessionEvent::Closed("relay events ended".into());
        let _ = itx.send(Internal::Event(peer, id, closed)).await;
    }
}

/// What a session's task checks before the core sees an object.
pub(crate) struct Checks {
    /// Custody objects' signed envelopes.
    pub(crate) objects: Verifier,
    /// The ledger's keyring, whose memory of verified signatures the node's branch and
    /// gateway share: the ledger signatures verified here, together, are not verified again
    /// on the core.
    pub(crate) ledger: Option<abhyasa_ledger::Keyring>,
}

/// Each event with a custody object's signed envelope opened, if it is signed by the peer it
/// is paired with (the one TLS authenticated on a direct session, the owner of the namespace
/// it came from through a relay); other events as they are. The signatures of all the
/// objects are verified together, with the answers verifying each alone would give; so are
/// the signatures of the ledger messages among them, which are left for the ledger to open.
pub(super) fn verified_all(
    checks: &Checks,
    events: Vec<(AgentId, SessionEvent)>,
) -> Vec<(AgentId, Result<SessionEvent, String>)> {
    if let Some(keys) = &checks.ledger {
        let ledger: Vec<abhyasa_ledger::LedgerMessage> = events
            .iter()
            .filter_map(|(_, e)| match e {
                SessionEvent::Object {
                    track: Track::Ledger,
                    payload,
                } => decode(payload).ok(),
                _ => None,
            })
            .collect();
        if !ledger.is_empty() {
            keys.verify_together(&ledger);
        }
    }
    let kind = |e: &SessionEvent| match e {
        SessionEvent::Object {
            track: Track::Obligations,
            ..
        } => Some(SignedKind::Obligation),
        SessionEvent::Object {
            track: Track::Acks, ..
        } => Some(SignedKind::Ack),
        // Ledger messages carry their own signatures, checked by the ledger.
        _ => None,
    };
    let mut opened = checks
        .objects
        .open_all(events.iter().filter_map(|(_, e)| match (kind(e), e) {
            (Some(k), SessionEvent::Object { payload, .. }) => Some((k, payload.as_slice())),
            _ => None,
        }))
        .into_iter();
    events
        .into_iter()
        .map(|(peer, e)| {
            if kind(&e).is_none() {
                return (peer, Ok(e));
            }
            let SessionEvent::Object { track, .. } = e else {
                return (peer, Ok(e));
            };
            let result = match opened.next() {
                Some(Ok(o)) if o.signer == peer => Ok(SessionEvent::Object {
                    track,
                    payload: o.payload,
                }),
                Some(Ok(o)) => Err(format!("signed by {}, not the session's peer", o.signer)),
                Some(Err(e)) => Err(e.to_string()),
                None => Err("not verified".into()),
            };
            (peer, result)
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::verified_all;
    use abhyasa_moq::{Ca, SessionEvent, SignedKind, Signer, Track, Verifier};
    use abhyasa_wire::AgentId;

    /// Events that arrived together keep their order, and each object gets the answer its own
    /// signature and signer give: one bad object drops alone, not its batch.
    #[test]
    fn events_verified_together_keep_their_order_and_their_own_answers() {
        let id = |s: &str| AgentId::new(s).unwrap();
        let ca = Ca::generate("t").unwrap();
        let (p, q) = (id("principal"), id("other"));
        let principal = Signer::new(&ca.issue(&p).unwrap()).unwrap();
        let other = Signer::new(&ca.issue(&q).unwrap()).unwrap();
        let verifier = super::Checks {
            objects: Verifier::new(ca.certificate().clone()),
            ledger: None,
        };
        let object = |track, payload: Vec<u8>| SessionEvent::Object { track, payload };
        let mut tampered = principal.sign(SignedKind::Obligation, b"o-2");
        let last = tampered.len() - 1;
        tampered[last] ^= 1;
        let events = vec![
            (p.clone(), SessionEvent::PeerSubscribed(Track::Acks)),
            (
                p.clone(),
                object(
                    Track::Obligations,
                    principal.sign(SignedKind::Obligation, b"o-1"),
                ),
            ),
            (
                p.clone(),
                object(Track::Ledger, b"ledger bytes, not opened here".to_vec()),
            ),
            (p.clone(), object(Track::Obligations, tampered)),
            // Signed by another member of the deployment, on the principal's session.
            (
                p.clone(),
                object(
                    Track::Obligations,
                    other.sign(SignedKind::Obligation, b"o-3"),
                ),
            ),
            // An ack signed as an obligation.
            (
                p.clone(),
                object(Track::Acks, principal.sign(SignedKind::Obligation, b"a-1")),
            ),
            (
                q.clone(),
                object(Track::Acks, other.sign(SignedKind::Ack, b"a-2")),
            ),
            (p.clone(), SessionEvent::Closed("bye".into())),
        ];
        let out = verified_all(&verifier, events);
        let peers: Vec<&AgentId> = out.iter().map(|(peer, _)| peer).collect();
        assert_eq!(peers, [&p, &p, &p, &p, &p, &p, &q, &p]);
        let results: Vec<Result<&SessionEvent, ()>> = out
            .iter()
            .map(|(_, r)| r.as_ref().map_err(|_| ()))
            .collect();
        assert_eq!(
            results,
            [
                Ok(&SessionEvent::PeerSubscribed(Track::Acks)),
                Ok(&object(Track::Obligations, b"o-1".to_vec())),
                Ok(&object(
                    Track::Ledger,
                    b"ledger bytes, not opened here".to_vec()
                )),
                Err(()),
                Err(()),
                Err(()),
                Ok(&object(Track::Acks, b"a-2".to_vec())),
                Ok(&SessionEvent::Closed("bye".into())),
            ]
        );
        assert!(matches!(&out[4].1, Err(why) if why.contains("not the session's peer")));
    }
}
