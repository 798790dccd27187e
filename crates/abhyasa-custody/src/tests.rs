//! Scenario tests of the two machines, driven by hand.

use abhyasa_wire::{
    AckStatus, AgentId, BeliefUpdatePayload, ClientId, ConsentDecision, ConsentPayload, CustodyAck,
    DeclineReason, Detail, EscalationCause, Kind, LastObserved, Obligation, ObligationId, Outcome,
    Payload, Scope, TokenAction, TokenId, TokenPayload, UnixMillis, WeightDelta, WeightKey,
};

use super::*;

fn p() -> AgentId {
    AgentId::new("p").unwrap()
}

fn a() -> AgentId {
    AgentId::new("a").unwrap()
}

fn config() -> CustodianConfig {
    CustodianConfig {
        response_timeout_ms: 100,
        backoff_base_ms: 50,
        backoff_cap_ms: 400,
        ..CustodianConfig::default()
    }
}

fn revoke_token(id: u128, max_retries: u32, deadline: u64) -> Obligation {
    Obligation {
        id: ObligationId::from_u128(id),
        issuer: p(),
        target: a(),
        created_at: UnixMillis(0),
        deadline: UnixMillis(deadline),
        max_retries,
        sequence: None,
        payload: Payload::OauthToken(TokenPayload {
            action: TokenAction::Revoke,
            token_id: TokenId::new(format!("t{id}")).unwrap(),
            client_id: ClientId::new("c").unwrap(),
            expires_at: None,
        }),
    }
}

/// Persists everything outstanding and returns the transmits released.
fn persist_all(c: &mut Custodian, now: u64) -> Vec<Transmit> {
    while let Some(rec) = c.poll_persist() {
        c.handle_persisted(UnixMillis(now), rec.token);
    }
    std::iter::from_fn(|| c.poll_transmit()).collect()
}

fn terminal(c: &mut Custodian) -> Vec<(Outcome, u32)> {
    std::iter::from_fn(|| c.poll_event())
        .filter_map(|e| match e {
            CustodianEvent::Terminal { record, .. } => Some((record.outcome, record.attempts)),
            _ => None,
        })
        .collect()
}

fn ack(id: u128, status: AckStatus) -> CustodyAck {
    CustodyAck {
        obligation_id: ObligationId::from_u128(id),
        target: a(),
        status,
        acked_at: UnixMillis(1),
        detail: None,
    }
}

#[test]
fn no_transmit_before_the_pending_record_is_durable() {
    let mut c = Custodian::new(p(), config(), 1);
    assert_eq!(
        c.issue(UnixMillis(0), revoke_token(1, 3, 10_000)),
        Ok(Admission::Custody)
    );
    assert!(c.poll_transmit().is_none());
    let rec = c.poll_persist().unwrap();
    assert!(matches!(
        &rec.record,
        CustodianRecord::Pending {
            attempts: 1,
            principal: Some(_),
            ..
        }
    ));
    // The revocation is withheld principal-side at issue, not on an ack.
    assert!(c.principal().is_revoked(&TokenId::new("t1").unwrap()));
    assert!(c.poll_transmit().is_none());
    c.handle_persisted(UnixMillis(5), rec.token);
    let t = c.poll_transmit().unwrap();
    assert_eq!((t.attempt, t.channel), (1, Channel::Stream));
    assert_eq!(
        std::iter::from_fn(|| c.poll_event()).collect::<Vec<_>>(),
        vec![CustodianEvent::Accepted {
            id: ObligationId::from_u128(1)
        }]
    );
}

#[test]
fn retries_back_off_and_each_attempt_is_persisted_first() {
    let mut c = Custodian::new(p(), config(), 9);
    c.issue(UnixMillis(0), revoke_token(1, 4, 100_000)).unwrap();
    assert_eq!(persist_all(&mut c, 0).len(), 1);
    let mut sends = vec![0u64];
    let mut now = 0;
    while sends.len() < 5 {
        now = c.poll_timeout().unwrap().0;
        c.handle_timeout(UnixMillis(now));
        // A retry is never released before its attempt record.
        assert!(c.poll_transmit().is_none());
        while let Some(rec) = c.poll_persist() {
            let CustodianRecord::Attempt { attempts, .. } = rec.record else {
                panic!("expected an attempt record, got {:?}", rec.record);
            };
            assert_eq!(attempts as usize, sends.len() + 1);
            c.handle_persisted(UnixMillis(now), rec.token);
        }
        if let Some(t) = c.poll_transmit() {
            assert_eq!(t.attempt as usize, sends.len() + 1);
            sends.push(now);
        }
    }
    // Gap k = response timeout + full jitter in [0, min(cap, base·2^(k-1))].
    for (k, w) in sends.windows(2).enumerate() {
        let gap = w[1] - w[0];
        let ceiling = (50u64 << k).min(400);
        assert!((100..=100 + ceiling).contains(&gap), "gap {k}: {gap}");
    }
    // Budget 1 + 4 spent: one more response timeout, then retries_exhausted.
    now += 100;
    c.handle_timeout(UnixMillis(now));
    persist_all(&mut c, now);
    assert_eq!(
        terminal(&mut c),
        vec![(Outcome::Escalated(EscalationCause::RetriesExhausted), 5)]
    );
}

#[test]
fn deadline_escalates_with_the_safe_action_and_late_applied_is_reconciled() {
    let mut c = Custodian::new(p(), config(), 3);
    let mut o = revoke_token(1, 1000, 1_000);
    o.payload = Payload::PhalaBeliefUpdate(BeliefUpdatePayload {
        weight_key: WeightKey::new("k").unwrap(),
        weight_delta: WeightDelta(-400_000),
        ttl_ms: 60_000,
    });
    c.issue(UnixMillis(0), o).unwrap();
    persist_all(&mut c, 0);
    assert_eq!(
        c.handle_ack(UnixMillis(10), &a(), ack(1, AckStatus::Deferred)),
        AckDisposition::Deferred
    );
    let mut now = 0;
    while c.pending_len() > 0 {
        now = c.poll_timeout().unwrap().0;
        assert!(now <= 1_000, "custody ran past its deadline");
        c.handle_timeout(UnixMillis(now));
        persist_all(&mut c, now);
    }
    assert_eq!(now, 1_000);
    let events: Vec<_> = std::iter::from_fn(|| c.poll_event()).collect();
    let escalation = events
        .iter()
        .find_map(|e| match e {
            CustodianEvent::Terminal { escalation, .. } => escalation.clone(),
            _ => None,
        })
        .expect("an escalation");
    assert_eq!(escalation.cause, EscalationCause::Deadline);
    assert_eq!(escalation.last_observed, LastObserved::Deferred);
    assert!(c.principal().holds(&escalation.safe_action));
    let key = WeightKey::new("k").unwrap();
    assert_eq!(
        c.principal().routing_weight(&a(), &key, UnixMillis(now)),
        600_000
    );
    // A late applied ack is noted; the safe action stays.
    assert_eq!(
        c.handle_ack(UnixMillis(1_100), &a(), ack(1, AckStatus::Applied)),
        AckDisposition::Reconciled
    );
    persist_all(&mut c, 1_100);
    assert!(matches!(
        c.poll_event(),
        Some(CustodianEvent::Reconciled(_))
    ));
    assert_eq!(
        c.principal().routing_weight(&a(), &key, UnixMillis(1_100)),
        600_000
    );
    assert_eq!(
        c.handle_ack(UnixMillis(1_200), &a(), ack(1, AckStatus::Applied)),
        AckDisposition::IgnoredUnknown
    );
    // The update's `ttl_ms` runs from its creation (0): the fail-safe lapses with it, and
    // upkeep then forgets the record.
    assert_eq!(
        c.principal().routing_weight(&a(), &key, UnixMillis(59_999)),
        600_000
    );
    assert_eq!(
        c.principal().routing_weight(&a(), &key, UnixMillis(60_000)),
        1_000_000
    );
    assert!(c.maintain(UnixMillis(60_000)) >= 1);
    assert!(!c.principal().holds(&escalation.safe_action));
}

#[test]
fn acks_are_checked() {
    let mut c = Custodian::new(p(), config(), 3);
    c.issue(UnixMillis(0), revoke_token(1, 3, 10_000)).unwrap();
    persist_all(&mut c, 0);
    let rogue = AgentId::new("rogue").unwrap();
    // Claims to be the target, but its session says otherwise.
    assert_eq!(
        c.handle_ack(UnixMillis(1), &rogue, ack(1, AckStatus::Applied)),
        AckDisposition::IgnoredNotTarget
    );
    // Honest about itself, but not the target.
    let mut forged = ack(1, AckStatus::Applied);
    forged.target = rogue.clone();
    assert_eq!(
        c.handle_ack(UnixMillis(1), &rogue, forged),
        AckDisposition::IgnoredNotTarget
    );
    assert_eq!(
        c.handle_ack(UnixMillis(1), &a(), ack(9, AckStatus::Applied)),
        AckDisposition::IgnoredUnknown
    );
    assert_eq!(c.stats().acks_not_target, 2);
    assert!(c.is_pending(ObligationId::from_u128(1)));
    // Declined is delivered: terminal, not retried, safe action in force.
    assert_eq!(
        c.handle_ack(
            UnixMillis(2),
            &a(),
            ack(1, AckStatus::Declined(DeclineReason::Superseded))
        ),
        AckDisposition::Discharged
    );
    persist_all(&mut c, 2);
    assert_eq!(
        terminal(&mut c),
        vec![(Outcome::Declined(DeclineReason::Superseded), 1)]
    );
    assert_eq!(c.poll_timeout(), None);
}

#[test]
fn recovery_keeps_the_deadline_and_attempts() {
    let mut c = Custodian::new(p(), config(), 3);
    c.issue(UnixMillis(0), revoke_token(1, 2, 5_000)).unwrap();
    persist_all(&mut c, 0);
    let (o, attempts) = c.pending().next().map(|(o, n)| (o.clone(), n)).unwrap();
    // Recovered well after the deadline: escalates at once, deadline untouched.
    let record = PendingRecord {
        obligation: o.clone(),
        attempts,
        last_observed: LastObserved::NoAck,
    };
    let mut late = Custodian::recover(
        p(),
        config(),
        4,
        PrincipalState::default(),
        [record.clone()],
        [],
        UnixMillis(9_000),
    );
    late.handle_timeout(UnixMillis(9_000));
    persist_all(&mut late, 9_000);
    assert_eq!(
        terminal(&mut late),
        vec![(Outcome::Escalated(EscalationCause::Deadline), 1)]
    );
    // Recovered in time with the budget spent: one response timeout, then retries_exhausted.
    let spent = PendingRecord {
        attempts: 3,
        ..record
    };
    let mut r = Custodian::recover(
        p(),
        config(),
        4,
        PrincipalState::default(),
        [spent],
        [],
        UnixMillis(100),
    );
    r.handle_timeout(UnixMillis(100));
    assert!(persist_all(&mut r, 100).is_empty());
    assert_eq!(r.poll_timeout(), Some(UnixMillis(200)));
    r.handle_timeout(UnixMillis(200));
    persist_all(&mut r, 200);
    assert_eq!(
        terminal(&mut r),
        vec![(Outcome::Escalated(EscalationCause::RetriesExhausted), 3)]
    );
}

#[test]
fn recovery_refuses_records_that_were_never_custody() {
    let mut best_effort = revoke_token(1, 3, 5_000);
    if let Payload::OauthToken(t) = &mut best_effort.payload {
        t.action = TokenAction::Issue;
    }
    let mut foreign = revoke_token(2, 3, 5_000);
    foreign.issuer = a();
    let mut broken = revoke_token(3, 3, 5_000);
    broken.deadline = UnixMillis(0);
    let good = revoke_token(4, 3, 5_000);
    let records = [best_effort, foreign, broken, good].map(|obligation| PendingRecord {
        obligation,
        attempts: 1,
        last_observed: LastObserved::NoAck,
    });
    let c = Custodian::recover(
        p(),
        config(),
        1,
        PrincipalState::default(),
        records,
        [],
        UnixMillis(10),
    );
    assert_eq!(c.pending_len(), 1);
    assert!(c.is_pending(ObligationId::from_u128(4)));
    assert_eq!(c.stats().recovery_rejected, 3);
}

#[test]
fn inadmissible_obligations_go_best_effort_once() {
    let mut c = Custodian::new(p(), config(), 3);
    let mut o = revoke_token(1, 3, 10_000);
    o.payload = Payload::PhalaBeliefUpdate(BeliefUpdatePayload {
        weight_key: WeightKey::new("k").unwrap(),
        weight_delta: WeightDelta(200_000),
        ttl_ms: 1,
    });
    assert_eq!(c.issue(UnixMillis(0), o), Ok(Admission::BestEffort));
    let t = c.poll_transmit().unwrap();
    assert_eq!((t.attempt, t.channel), (0, Channel::Datagram));
    assert!(c.poll_transmit().is_none());
    assert_eq!(c.pending_len(), 0);
    assert_eq!(c.poll_timeout(), None);
    assert_eq!(terminal(&mut c), vec![(Outcome::BestEffort, 0)]);
}

#[test]
fn issue_refuses_bad_obligations_and_changes_nothing() {
    let mut c = Custodian::new(p(), config(), 3);
    let mut other = revoke_token(1, 3, 10_000);
    other.issuer = a();
    assert!(matches!(
        c.issue(UnixMillis(0), other),
        Err(IssueError::NotIssuer { .. })
    ));
    assert!(matches!(
        c.issue(UnixMillis(20_000), revoke_token(1, 3, 10_000)),
        Err(IssueError::PastDeadline { .. })
    ));
    assert!(matches!(
        c.issue(UnixMillis(0), revoke_token(1, 5_000, 10_000)),
        Err(IssueError::Invalid(_))
    ));
    c.issue(UnixMillis(0), revoke_token(1, 3, 10_000)).unwrap();
    assert_eq!(
        c.issue(UnixMillis(0), revoke_token(1, 3, 10_000)),
        Err(IssueError::Duplicate(ObligationId::from_u128(1)))
    );
    let mut small = Custodian::new(
        p(),
        CustodianConfig {
            max_pending: 1,
            ..config()
        },
        3,
    );
    small
        .issue(UnixMillis(0), revoke_token(1, 3, 10_000))
        .unwrap();
    assert!(matches!(
        small.issue(UnixMillis(0), revoke_token(2, 3, 10_000)),
        Err(IssueError::Full { .. })
    ));
    assert_eq!(small.pending_len(), 1);
}

fn receive(r: &mut Receiver, now: u64, o: Obligation) -> (Disposition, Vec<AckStatus>) {
    let d = r.handle_obligation(UnixMillis(now), &p(), o);
    while let Some(rec) = r.poll_persist() {
        r.handle_persisted(rec.token);
    }
    (
        d,
        std::iter::from_fn(|| r.poll_transmit())
            .map(|t| t.ack.status)
            .collect(),
    )
}

#[test]
fn receiver_applies_once_and_acks_only_after_commit() {
    let mut r = Receiver::new(a(), ReceiverConfig::default());
    let mut o = revoke_token(1, 3, 10_000);
    o.payload = Payload::PhalaBeliefUpdate(BeliefUpdatePayload {
        weight_key: WeightKey::new("k").unwrap(),
        weight_delta: WeightDelta(-300_000),
        ttl_ms: 60_000,
    });
    assert_eq!(
        r.handle_obligation(UnixMillis(0), &p(), o.clone()),
        Disposition::Applying
    );
    let rec = r.poll_persist().unwrap();
    assert!(matches!(rec.record, ReceiverRecord::Apply { .. }));
    assert!(r.poll_transmit().is_none(), "ack before the commit");
    // A redelivery while the commit is in flight neither re-applies nor acks early.
    assert_eq!(
        r.handle_obligation(UnixMillis(1), &p(), o.clone()),
        Disposition::Duplicate
    );
    assert!(r.poll_persist().is_none() && r.poll_transmit().is_none());
    r.handle_persisted(rec.token);
    assert_eq!(
        r.poll_transmit().map(|t| t.ack.status),
        Some(AckStatus::Applied)
    );
    // After the commit, a redelivery is re-acked applied without re-applying.
    assert_eq!(
        receive(&mut r, 2, o),
        (Disposition::Duplicate, vec![AckStatus::Applied])
    );
    let key = WeightKey::new("k").unwrap();
    let at = |t| r.state().weight(&p(), &key, UnixMillis(t));
    assert_eq!(at(2), -300_000);
    // The change lapses `ttl_ms` after the obligation's creation, and then counts no more.
    let lapse = 60_000; // created at 0
    assert_eq!((at(lapse - 1), at(lapse)), (-300_000, 0));
}

#[test]
fn receiver_declines_expired_superseded_misaddressed_and_forged() {
    let mut r = Receiver::new(a(), ReceiverConfig::default());
    let expired = revoke_token(1, 3, 100);
    assert_eq!(
        receive(&mut r, 101, expired).1,
        vec![AckStatus::Declined(DeclineReason::Expired)]
    );
    let mut newer = revoke_token(2, 3, 10_000);
    newer.sequence = Some(5);
    let mut older = revoke_token(3, 3, 10_000);
    older.sequence = Some(4);
    if let Payload::OauthToken(t) = &mut older.payload {
        t.token_id = TokenId::new("t2").unwrap();
    }
    assert_eq!(receive(&mut r, 0, newer).1, vec![AckStatus::Applied]);
    assert_eq!(
        receive(&mut r, 0, older).1,
        vec![AckStatus::Declined(DeclineReason::Superseded)]
    );
    let mut elsewhere = revoke_token(4, 3, 10_000);
    elsewhere.target = AgentId::new("b").unwrap();
    assert_eq!(
        receive(&mut r, 0, elsewhere).1,
        vec![AckStatus::Declined(DeclineReason::Refused)]
    );
    let forged = revoke_token(5, 3, 10_000);
    assert_eq!(
        r.handle_obligation(UnixMillis(0), &AgentId::new("rogue").unwrap(), forged),
        Disposition::DroppedForged
    );
    assert!(r.poll_transmit().is_none());
    assert!(r.state().is_dropped(&TokenId::new("t2").unwrap()));
}

/// A token obligation from `p` for token `t1`, which itself expires at 1,000.
fn token_t1(id: u128, action: TokenAction, sequence: u64) -> Obligation {
    let mut o = revoke_token(id, 3, 10_000);
    o.sequence = Some(sequence);
    o.payload = Payload::OauthToken(TokenPayload {
        action,
        token_id: TokenId::new("t1").unwrap(),
        client_id: ClientId::new("c").unwrap(),
        expires_at: Some(UnixMillis(1_000)),
    });
    o
}

#[test]
fn a_tokens_record_and_last_sequence_go_at_the_tokens_expiry_and_not_before() {
    let mut r = Receiver::new(a(), ReceiverConfig::default());
    let t1 = TokenId::new("t1").unwrap();
    let weight = |id, sequence| {
        let mut o = revoke_token(id, 3, 10_000);
        o.sequence = Some(sequence);
        o.payload = Payload::PhalaBeliefUpdate(BeliefUpdatePayload {
            weight_key: WeightKey::new("k").unwrap(),
            weight_delta: WeightDelta(-1),
            ttl_ms: 1,
        });
        o
    };
    assert_eq!(receive(&mut r, 0, weight(9, 7)).1, vec![AckStatus::Applied]);
    let revoke = token_t1(1, TokenAction::Revoke, 5);
    assert_eq!(receive(&mut r, 0, revoke).1, vec![AckStatus::Applied]);
    assert_eq!(r.held().sequences, 2);
    // Before the token's expiry, a stale issue (sequence 4) is superseded.
    let stale = |id| token_t1(id, TokenAction::Issue, 4);
    assert_eq!(
        receive(&mut r, 500, stale(2)).0,
        Disposition::Declined(DeclineReason::Superseded)
    );
    assert_eq!(r.maintain(UnixMillis(999)), 0);
    assert!(r.state().is_dropped(&t1));
    assert_eq!(r.held().sequences, 2);
    // At it, the record and the token's sequence go; the weight's sequence stays.
    assert_eq!(r.maintain(UnixMillis(1_000)), 1);
    assert_eq!(r.state().token_record(&t1), None);
    assert_eq!(r.held().sequences, 1);
    assert_eq!(
        receive(&mut r, 1_001, weight(10, 6)).1,
        vec![AckStatus::Declined(DeclineReason::Superseded)]
    );
    // The expired token guards nothing now: the stale issue applies, and its record (already
    // past the token's expiry) goes at the next upkeep, with its sequence.
    assert_eq!(receive(&mut r, 1_001, stale(3)).0, Disposition::Applying);
    assert_eq!(r.held().sequences, 2);
    assert_eq!(r.maintain(UnixMillis(1_002)), 1);
    assert_eq!(r.held().sequences, 1);

    // A receiver recovered from rows forgets the same at the same time.
    let state = ReceiverState::from_parts([], [], [(t1.clone(), Some(UnixMillis(1_000)))], []);
    let mut r = Receiver::recover(
        a(),
        ReceiverConfig::default(),
        [],
        [(crate::GovernedKey::Token(p(), t1.clone()), 5)],
        [],
        state,
    );
    assert_eq!(r.maintain(UnixMillis(999)), 0);
    assert_eq!(r.held().sequences, 1);
    assert_eq!(r.maintain(UnixMillis(1_000)), 1);
    assert_eq!(r.held().sequences, 0);
}

#[test]
fn receiver_defers_when_full_and_prunes_after_retention() {
    let config = ReceiverConfig {
        max_inflight: 1,
        max_clock_skew_ms: 50,
        ..ReceiverConfig::default()
    };
    let mut r = Receiver::new(a(), config);
    assert_eq!(
        r.handle_obligation(UnixMillis(0), &p(), revoke_token(1, 3, 1_000)),
        Disposition::Applying
    );
    assert_eq!(
        r.handle_obligation(UnixMillis(0), &p(), revoke_token(2, 3, 1_000)),
        Disposition::Deferred
    );
    assert_eq!(
        r.poll_transmit().map(|t| t.ack.status),
        Some(AckStatus::Deferred)
    );
    let rec = r.poll_persist().unwrap();
    r.handle_persisted(rec.token);
    assert_eq!(
        r.poll_transmit().map(|t| t.ack.status),
        Some(AckStatus::Applied)
    );
    assert_eq!(r.poll_timeout(), Some(UnixMillis(1_051)));
    r.handle_timeout(UnixMillis(1_000));
    assert!(r.has_applied(ObligationId::from_u128(1)));
    r.handle_timeout(UnixMillis(1_051));
    assert!(!r.has_applied(ObligationId::from_u128(1)));
    assert!(matches!(
        r.poll_persist().map(|p| p.record),
        Some(ReceiverRecord::Prune { .. })
    ));
    // Past retention a redelivery is expired, never re-applied.
    assert_eq!(
        receive(&mut r, 1_052, revoke_token(1, 3, 1_000)).1,
        vec![AckStatus::Declined(DeclineReason::Expired)]
    );
}

#[test]
fn admissibility_is_per_instance() {
    let mut o = revoke_token(1, 3, 10);
    assert!(kinds::admissible(&o));
    if let Payload::OauthToken(t) = &mut o.payload {
        t.action = TokenAction::Issue;
    }
    assert!(!kinds::admissible(&o) && kinds::safe(&o, 0).is_none());
    for (decision, admissible) in [
        (Some(ConsentDecision::Revoke), true),
        (None, true),
        (Some(ConsentDecision::Unrecognized("pause".into())), true),
        // A grant fails closed: under custody, its safe action withholds.
        (Some(ConsentDecision::Grant), true),
    ] {
        o.payload = Payload::AnumatiConsent(ConsentPayload {
            decision,
            scope: Scope::new("s").unwrap(),
            expires_at: None,
        });
        assert_eq!(kinds::admissible(&o), admissible);
        assert_eq!(kinds::safe(&o, 0).is_some(), admissible);
    }
    for (delta, admissible) in [(-1, true), (0, false), (5, false)] {
        o.payload = Payload::PhalaBeliefUpdate(BeliefUpdatePayload {
            weight_key: WeightKey::new("k").unwrap(),
            weight_delta: WeightDelta(delta),
            ttl_ms: 1,
        });
        assert_eq!(kinds::admissible(&o), admissible);
    }
}

#[test]
fn a_ready_peer_gets_pending_obligations_re_offered_at_once() {
    let mut c = Custodian::new(p(), config(), 3);
    c.issue(UnixMillis(0), revoke_token(1, 5, 100_000)).unwrap();
    c.issue(UnixMillis(0), revoke_token(2, 5, 100_000)).unwrap();
    assert_eq!(persist_all(&mut c, 0).len(), 2);
    // Long before any backoff slot, the subscription comes back: both attempts (sent on the
    // session that died, most likely) are re-offered at once, each a counted attempt that
    // waits for its record.
    c.handle_peer_ready(UnixMillis(10), &a());
    assert!(
        c.poll_transmit().is_none(),
        "a re-offer waits for its attempt record"
    );
    let sent = persist_all(&mut c, 10);
    assert_eq!(sent.len(), 2);
    assert!(sent.iter().all(|t| t.attempt == 2));
    // Re-subscribing again at once re-offers nothing: both already run one attempt ahead.
    c.handle_peer_ready(UnixMillis(11), &a());
    assert!(persist_all(&mut c, 11).is_empty());
    // Another agent's readiness re-offers nothing.
    c.handle_peer_ready(UnixMillis(20), &AgentId::new("b").unwrap());
    assert!(persist_all(&mut c, 20).is_empty());
}

#[test]
fn an_attempt_sent_in_the_same_millisecond_as_the_re_subscription_is_re_offered() {
    // It may have left on the session that just died: it cannot be told apart from one
    // sent before.
    let mut c = Custodian::new(p(), config(), 3);
    c.issue(UnixMillis(5), revoke_token(1, 5, 100_000)).unwrap();
    assert_eq!(persist_all(&mut c, 5).len(), 1);
    c.handle_peer_ready(UnixMillis(5), &a());
    let sent = persist_all(&mut c, 5);
    assert_eq!(sent.iter().map(|t| t.attempt).collect::<Vec<_>>(), [2]);
}

#[test]
fn a_re_offer_pulls_a_waiting_attempt_forward_once() {
    // Drawn backoffs are at least 1 ms here, so each attempt waits out a real slot.
    let cfg = CustodianConfig {
        backoff_base_ms: 5_000,
        backoff_cap_ms: 20_000,
        ..config()
    };
    let mut c = Custodian::new(p(), cfg, 11);
    c.issue(UnixMillis(0), revoke_token(1, 10, 100_000))
        .unwrap();
    assert_eq!(persist_all(&mut c, 0).len(), 1);
    c.handle_timeout(UnixMillis(100)); // attempt 1 timed out: a backoff is drawn
    assert!(persist_all(&mut c, 100).is_empty());
    let slot = c.poll_timeout().unwrap();
    assert!(slot > UnixMillis(101), "a backoff slot ahead ({slot})");
    // The peer re-subscribes during the backoff: attempt 2 goes at once, counted.
    c.handle_peer_ready(UnixMillis(101), &a());
    let sent = persist_all(&mut c, 101);
    assert_eq!(sent.iter().map(|t| t.attempt).collect::<Vec<_>>(), [2]);
    // Attempt 3 waits out the skipped slot as well as its own backoff: not before the time
    // the schedule would have sent attempt 2, plus a response timeout.
    c.handle_timeout(UnixMillis(201));
    assert!(persist_all(&mut c, 201).is_empty());
    // A second re-subscription while one attempt is already ahead pulls nothing forward.
    c.handle_peer_ready(UnixMillis(202), &a());
    assert!(persist_all(&mut c, 202).is_empty());
    let next = c.poll_timeout().unwrap();
    assert!(
        next.0 >= slot.0 + 100,
        "attempt 3 at {next}, before the schedule's attempt 2 ({slot}) plus a timeout"
    );
}

/// Drives one obligation to its end against a target that never answers, with the peer
/// re-subscribing every `flap_ms` (0: never). Returns the terminal outcome and the attempts
/// transmitted.
fn dead_link(
    cfg: &CustodianConfig,
    seed: u64,
    span: u64,
    retries: u32,
    flap_ms: u64,
) -> (Outcome, u32) {
    let mut c = Custodian::new(p(), cfg.clone(), seed);
    c.issue(UnixMillis(0), revoke_token(1, retries, span))
        .unwrap();
    let mut sent = persist_all(&mut c, 0).len() as u32;
    let mut now = 0;
    let mut next_flap = flap_ms;
    loop {
        let timer = c.poll_timeout();
        let at = match (timer, flap_ms) {
            (None, _) => break,
            (Some(t), 0) => t.0,
            (Some(t), _) => t.0.min(next_flap),
        };
        now = now.max(at);
        if flap_ms > 0 && now >= next_flap {
            c.handle_peer_ready(UnixMillis(now), &a());
            next_flap += flap_ms;
        }
        c.handle_timeout(UnixMillis(now));
        sent += persist_all(&mut c, now).len() as u32;
        if c.pending_len() == 0 {
            break;
        }
    }
    let outcome = terminal(&mut c).pop().expect("a terminal outcome").0;
    (outcome, sent)
}

#[test]
fn a_flapping_link_does_not_spend_the_budget_before_the_deadline() {
    // The node's defaults and a 60 s deadline; the subscription comes back four times in
    // every 200 ms, and the target never acks.
    let cfg = CustodianConfig::default();
    let span = 60_000;
    let retries = cfg.default_retries(span);
    for seed in 0..20 {
        let (outcome, sent) = dead_link(&cfg, seed, span, retries, 50);
        assert_eq!(
            outcome,
            Outcome::Escalated(EscalationCause::Deadline),
            "seed {seed}: a flapping link exhausted {retries} retries ({sent} sent) before the deadline"
        );
        assert!(sent <= retries + 1, "seed {seed}: {sent} transmissions");
    }
}

#[test]
fn the_default_budget_lets_the_deadline_bind() {
    for (cfg, span) in [
        (CustodianConfig::default(), 60_000),
        (CustodianConfig::default(), 5_000),
        (config(), 3_000),
        (
            CustodianConfig {
                response_timeout_ms: 20,
                backoff_base_ms: 10,
                backoff_cap_ms: 200,
                ..CustodianConfig::default()
            },
            10_000,
        ),
    ] {
        let retries = cfg.default_retries(span);
        let early = (0..200)
            .filter(|&seed| {
                dead_link(&cfg, seed, span, retries, 0).0
                    != Outcome::Escalated(EscalationCause::Deadline)
            })
            .count();
        assert!(
            early <= 2,
            "{early}/200 runs exhausted {retries} retries before a {span} ms deadline"
        );
        // The check can fail: a third of that budget runs out before the deadline.
        let short = (0..200)
            .filter(|&seed| {
                dead_link(&cfg, seed, span, retries / 3, 0).0
                    == Outcome::Escalated(EscalationCause::RetriesExhausted)
            })
            .count();
        assert!(short > 150, "only {short}/200 short budgets ran out early");
    }
}

#[test]
fn the_retry_rule_matches_the_bindings_examples() {
    // The retry rule (docs/DESIGN.md): 24 h with cap 3600 s needs 35; 1 h with cap 600 s needs 15 (base 1 s).
    let cfg = |cap_s: u64| CustodianConfig {
        backoff_base_ms: 1_000,
        backoff_cap_ms: cap_s * 1_000,
        ..CustodianConfig::default()
    };
    assert_eq!(cfg(3_600).retries_spanning(86_400_000), 35);
    assert_eq!(cfg(600).retries_spanning(3_600_000), 15);
    // Checked by hand: 1+2+4+…+512 = 1023 s, then 10 × 600 s ... 14 terms give 3423 s < 3600 s.
    assert!((1..=14u32).map(|k| (1u64 << (k - 1)).min(600)).sum::<u64>() < 3_600);
}

#[test]
fn a_budget_that_cannot_span_the_deadline_is_refused_when_the_profile_says_so() {
    let cfg = CustodianConfig {
        require_spanning_budget: [Kind::OauthToken].into_iter().collect(),
        ..config()
    };
    let needed = cfg.retries_spanning(10_000);
    let mut c = Custodian::new(p(), cfg, 3);
    let before = c.clone();
    assert_eq!(
        c.issue(UnixMillis(0), revoke_token(1, needed - 1, 10_000)),
        Err(IssueError::BudgetTooSmall {
            kind: Kind::OauthToken,
            given: needed - 1,
            needed,
        })
    );
    assert_eq!(c, before, "a refused issue changed the custodian");
    assert_eq!(
        c.issue(UnixMillis(0), revoke_token(1, needed, 10_000)),
        Ok(Admission::Custody)
    );
    // Kinds without the requirement keep their short budgets.
    let mut consent = revoke_token(2, 0, 10_000);
    consent.payload = Payload::AnumatiConsent(ConsentPayload {
        decision: Some(ConsentDecision::Revoke),
        scope: Scope::new("cal").unwrap(),
        expires_at: None,
    });
    assert_eq!(c.issue(UnixMillis(0), consent), Ok(Admission::Custody));
}

#[test]
fn a_refused_issue_changes_no_principal_state() {
    let mut c = Custodian::new(
        p(),
        CustodianConfig {
            max_pending: 1,
            ..config()
        },
        3,
    );
    c.issue(UnixMillis(0), revoke_token(1, 3, 10_000)).unwrap();
    persist_all(&mut c, 0);
    let before = c.principal().clone();
    let mut consent = revoke_token(2, 3, 10_000);
    consent.payload = Payload::AnumatiConsent(ConsentPayload {
        decision: Some(ConsentDecision::Revoke),
        scope: Scope::new("cal").unwrap(),
        expires_at: None,
    });
    assert!(matches!(
        c.issue(UnixMillis(0), consent),
        Err(IssueError::Full { .. })
    ));
    assert!(!c.principal().is_withheld(&a(), &Scope::new("cal").unwrap()));
    assert_eq!(c.principal(), &before);
    assert!(c.poll_persist().is_none(), "a refused issue wrote a record");
}

#[test]
fn ids_that_already_ended_are_duplicates() {
    let mut c = Custodian::new(p(), config(), 3);
    c.issue(UnixMillis(0), revoke_token(1, 3, 10_000)).unwrap();
    persist_all(&mut c, 0);
    assert_eq!(
        c.handle_ack(UnixMillis(5), &a(), ack(1, AckStatus::Applied)),
        AckDisposition::Discharged
    );
    persist_all(&mut c, 5);
    assert_eq!(
        c.issue(UnixMillis(6), revoke_token(1, 3, 10_000)),
        Err(IssueError::Duplicate(ObligationId::from_u128(1)))
    );
    // A best-effort one too.
    let mut grant = revoke_token(2, 3, 10_000);
    grant.payload = Payload::OauthToken(TokenPayload {
        action: TokenAction::Issue,
        token_id: TokenId::new("t").unwrap(),
        client_id: ClientId::new("c").unwrap(),
        expires_at: None,
    });
    assert_eq!(
        c.issue(UnixMillis(7), grant.clone()),
        Ok(Admission::BestEffort)
    );
    assert_eq!(
        c.issue(UnixMillis(8), grant),
        Err(IssueError::Duplicate(ObligationId::from_u128(2)))
    );
    // Once no receiver may hold it any more (deadline + twice the skew), the id is free.
    let later = 10_000 + 2 * config().max_clock_skew_ms + 1;
    let mut again = revoke_token(1, 3, later + 10_000);
    again.created_at = UnixMillis(later);
    assert_eq!(c.issue(UnixMillis(later), again), Ok(Admission::Custody));
}

#[test]
fn a_reconciled_escalation_is_not_noted_again_after_recovery() {
    let escalated = |reconciled| EscalatedRecord {
        id: ObligationId::from_u128(1),
        target: a(),
        reconciled,
    };
    for (reconciled, expect) in [
        (false, AckDisposition::Reconciled),
        (true, AckDisposition::IgnoredUnknown),
    ] {
        let mut c = Custodian::recover(
            p(),
            config(),
            4,
            PrincipalState::default(),
            [],
            [escalated(reconciled)],
            UnixMillis(2_000),
        );
        assert_eq!(
            c.handle_ack(UnixMillis(2_000), &a(), ack(1, AckStatus::Applied)),
            expect
        );
        assert_eq!(c.poll_persist().is_some(), !reconciled);
    }
}

#[test]
fn a_datagram_first_attempt_is_retried_on_a_stream() {
    let mut c = Custodian::new(
        p(),
        CustodianConfig {
            first_attempt: Channel::Datagram,
            ..config()
        },
        3,
    );
    c.issue(UnixMillis(0), revoke_token(1, 4, 100_000)).unwrap();
    let first = persist_all(&mut c, 0);
    assert_eq!(
        first
            .iter()
            .map(|t| (t.attempt, t.channel))
            .collect::<Vec<_>>(),
        vec![(1, Channel::Datagram)]
    );
    // No ack: the response timeout, then the backoff, then attempt 2 on a stream.
    let mut retries = Vec::new();
    while retries.is_empty() {
        let now = c.poll_timeout().unwrap().0;
        c.handle_timeout(UnixMillis(now));
        retries = persist_all(&mut c, now);
    }
    assert_eq!(
        retries
            .iter()
            .map(|t| (t.attempt, t.channel))
            .collect::<Vec<_>>(),
        vec![(2, Channel::Stream)]
    );
    // The ack of a datagram attempt discharges like any other.
    c.handle_ack(UnixMillis(400), &a(), ack(1, AckStatus::Applied));
    persist_all(&mut c, 400);
    assert_eq!(terminal(&mut c), vec![(Outcome::Applied, 2)]);
}

#[test]
fn attempts_beyond_the_window_wait_for_room_and_deadlines_still_run() {
    let mut c = Custodian::new(
        p(),
        CustodianConfig {
            max_inflight_per_target: 2,
            ..config()
        },
        5,
    );
    for id in 1..=5 {
        c.issue(UnixMillis(0), revoke_token(id, 50, 10_000))
            .unwrap();
    }
    let sent = persist_all(&mut c, 0);
    let ids = |ts: &[Transmit]| {
        ts.iter()
            .map(|t| t.obligation.id.to_u128())
            .collect::<Vec<_>>()
    };
    assert_eq!(ids(&sent), vec![1, 2], "two in flight, three queued");
    // An answer frees a place: the oldest queued attempt goes out.
    c.handle_ack(UnixMillis(10), &a(), ack(1, AckStatus::Applied));
    assert_eq!(ids(&persist_all(&mut c, 10)), vec![3]);
    // A response timeout frees a place too (the timed-out one backs off).
    c.handle_timeout(UnixMillis(100));
    assert_eq!(ids(&persist_all(&mut c, 100)), vec![4]);
    // The receiver answers whatever reaches it; the rest drains through the window.
    let mut now = 100;
    let mut sent_later = Vec::new();
    while c.pending_len() > 0 {
        for t in persist_all(&mut c, now) {
            sent_later.push(t.obligation.id.to_u128());
            c.handle_ack(
                UnixMillis(now),
                &a(),
                ack(t.obligation.id.to_u128(), AckStatus::Applied),
            );
        }
        if now == 100 {
            for id in [2, 3, 4] {
                c.handle_ack(UnixMillis(now), &a(), ack(id, AckStatus::Applied));
            }
        }
        now = c.poll_timeout().map_or(now + 10, |t| t.0.max(now + 1));
        c.handle_timeout(UnixMillis(now));
        assert!(now < 10_000, "drained before the deadline");
    }
    persist_all(&mut c, now);
    assert!(
        sent_later.contains(&5),
        "the last queued one went out: {sent_later:?}"
    );
    let outcomes = terminal(&mut c);
    assert_eq!(outcomes.len(), 5);
    assert!(outcomes.iter().all(|(o, _)| *o == Outcome::Applied));

    // With no answers at all, queued obligations still escalate at their deadline.
    let mut c = Custodian::new(
        p(),
        CustodianConfig {
            max_inflight_per_target: 1,
            ..config()
        },
        6,
    );
    for id in 10..13 {
        c.issue(UnixMillis(0), revoke_token(id, 50, 1_000)).unwrap();
    }
    persist_all(&mut c, 0);
    let mut now = 0;
    while c.pending_len() > 0 {
        now = c.poll_timeout().unwrap().0;
        c.handle_timeout(UnixMillis(now));
        persist_all(&mut c, now);
    }
    assert_eq!(now, 1_000);
    let outcomes = terminal(&mut c);
    assert_eq!(outcomes.len(), 3);
    assert!(outcomes
        .iter()
        .all(|(o, _)| *o == Outcome::Escalated(EscalationCause::Deadline)));
}

/// `max_pending_per_target`: at the limit every issue is taken; one past it is refused with
/// the limit named, and nothing changes; other targets go on; an ended obligation frees its
/// place; a recovered pending set counts.
#[test]
fn pending_per_target_is_bounded_and_other_targets_go_on() {
    const LIMIT: usize = 3;
    let limited = CustodianConfig {
        max_pending_per_target: LIMIT,
        ..config()
    };
    let mut c = Custodian::new(p(), limited.clone(), 9);
    for id in 1..=LIMIT as u128 {
        assert_eq!(
            c.issue(UnixMillis(0), revoke_token(id, 3, 10_000)),
            Ok(Admission::Custody),
            "issue {id} of {LIMIT} is within the limit"
        );
    }
    let past = c.clone();
    assert_eq!(
        c.issue(UnixMillis(0), revoke_token(10, 3, 10_000)),
        Err(IssueError::Full {
            what: "pending obligations for one target",
            limit: LIMIT,
        })
    );
    assert_eq!(c, past, "a refused issue changes nothing");
    // Another target is not affected by a's share.
    let mut to_b = revoke_token(11, 3, 10_000);
    to_b.target = AgentId::new("b").unwrap();
    assert_eq!(c.issue(UnixMillis(0), to_b), Ok(Admission::Custody));
    assert_eq!(c.pending_for(&a()), LIMIT);
    assert_eq!(c.pending_for(&AgentId::new("b").unwrap()), 1);
    // One of a's ends (applied): its place is free again.
    persist_all(&mut c, 0);
    c.handle_ack(UnixMillis(5), &a(), ack(1, AckStatus::Applied));
    persist_all(&mut c, 5);
    assert_eq!(c.pending_for(&a()), LIMIT - 1);
    assert_eq!(
        c.issue(UnixMillis(5), revoke_token(12, 3, 10_000)),
        Ok(Admission::Custody)
    );
    // A recovered pending set counts against the limit too.
    let records: Vec<_> = (20..20 + LIMIT as u128)
        .map(|id| PendingRecord {
            obligation: revoke_token(id, 3, 10_000),
            attempts: 1,
            last_observed: LastObserved::NoAck,
        })
        .collect();
    let mut r = Custodian::recover(
        p(),
        limited,
        9,
        PrincipalState::default(),
        records,
        [],
        UnixMillis(10),
    );
    assert!(matches!(
        r.issue(UnixMillis(10), revoke_token(30, 3, 10_000)),
        Err(IssueError::Full { limit: LIMIT, .. })
    ));
}

/// `max_applied`: at the limit every obligation applies; one past it is deferred (acked
/// `deferred`, nothing applied), so its custodian retries; once applied ids expire (deadline +
/// skew) the same obligation applies.
#[test]
fn applied_ids_retained_are_bounded_and_past_the_limit_obligations_wait() {
    const LIMIT: usize = 2;
    let config = ReceiverConfig {
        max_applied: LIMIT,
        max_clock_skew_ms: 100,
        ..ReceiverConfig::default()
    };
    let mut r = Receiver::new(a(), config);
    for id in 1..=LIMIT as u128 {
        assert_eq!(
            receive(&mut r, 0, revoke_token(id, 3, 1_000)),
            (Disposition::Applying, vec![AckStatus::Applied]),
            "obligation {id} of {LIMIT} is within the limit"
        );
    }
    let late = revoke_token(3, 3, 10_000);
    assert_eq!(
        receive(&mut r, 10, late.clone()),
        (Disposition::Deferred, vec![AckStatus::Deferred])
    );
    assert_eq!(r.stats().deferred, 1);
    // Not applied: asked again it is deferred again, never a duplicate.
    assert_eq!(
        receive(&mut r, 20, late.clone()),
        (Disposition::Deferred, vec![AckStatus::Deferred])
    );
    // The first two expire at 1,000 + 100; after that there is room.
    r.handle_timeout(UnixMillis(1_101));
    assert_eq!(
        receive(&mut r, 1_101, late),
        (Disposition::Applying, vec![AckStatus::Applied])
    );
}

/// A deployment member revoking a token in its own name (id `id`, token `token`, expiring at
/// `expires`).
fn member_revokes(id: u128, token: &str, expires: Option<u64>) -> Obligation {
    let mut o = revoke_token(id, 3, 10_000);
    o.issuer = AgentId::new("member").unwrap();
    o.payload = Payload::OauthToken(TokenPayload {
        action: TokenAction::Revoke,
        token_id: TokenId::new(token).unwrap(),
        client_id: ClientId::new("c").unwrap(),
        expires_at: expires.map(UnixMillis),
    });
    o
}

/// Hands `o` to `r` from its own issuer, commits, and returns what was acked.
fn receive_own(r: &mut Receiver, now: u64, o: Obligation) -> (Disposition, Vec<AckStatus>) {
    let issuer = o.issuer.clone();
    let d = r.handle_obligation(UnixMillis(now), &issuer, o);
    while let Some(rec) = r.poll_persist() {
        r.handle_persisted(rec.token);
    }
    let acks = std::iter::from_fn(|| r.poll_transmit())
        .map(|t| t.ack.status)
        .collect();
    (d, acks)
}

/// Applied ids and applies in flight are counted per issuer: a member that fills its share
/// defers only its own obligations, and the principal's still apply at once (they waited
/// behind the member's when the limits were the receiver's as a whole).
#[test]
fn a_member_filling_its_share_does_not_crowd_out_the_principal() {
    let config = ReceiverConfig {
        max_applied: 2,
        max_inflight: 1,
        ..ReceiverConfig::default()
    };
    let mut r = Receiver::new(a(), config.clone());
    for id in 1..=2 {
        let token = format!("m{id}");
        assert_eq!(
            receive_own(&mut r, 0, member_revokes(id, &token, None)).0,
            Disposition::Applying
        );
    }
    assert_eq!(
        receive_own(&mut r, 0, member_revokes(3, "m3", None)),
        (Disposition::Deferred, vec![AckStatus::Deferred]),
        "past its own share, the member waits"
    );
    assert_eq!(
        receive_own(&mut r, 0, revoke_token(10, 3, 10_000)),
        (Disposition::Applying, vec![AckStatus::Applied]),
        "the principal's share is its own"
    );
    // In flight: the member's uncommitted apply holds only the member's slot.
    let mut r = Receiver::new(a(), config.clone());
    let member = AgentId::new("member").unwrap();
    assert_eq!(
        r.handle_obligation(UnixMillis(0), &member, member_revokes(1, "m1", None)),
        Disposition::Applying
    );
    assert_eq!(
        r.handle_obligation(UnixMillis(0), &member, member_revokes(2, "m2", None)),
        Disposition::Deferred
    );
    assert_eq!(
        r.handle_obligation(UnixMillis(0), &p(), revoke_token(10, 3, 10_000)),
        Disposition::Applying
    );
    // Recovered from what a store keeps (each applied id with its issuer): the same.
    let applied = [1u128, 2].map(|id| AppliedRecord {
        id: ObligationId::from_u128(id),
        expires: UnixMillis(20_000),
        digest: None,
        issuer: Some(member.clone()),
    });
    let mut r = Receiver::recover(a(), config, applied, [], [], ReceiverState::default());
    assert_eq!(
        receive_own(&mut r, 0, member_revokes(3, "m3", None)).0,
        Disposition::Deferred
    );
    assert_eq!(
        receive_own(&mut r, 0, revoke_token(10, 3, 10_000)).0,
        Disposition::Applying
    );
}

/// Governed keys (here token revocations without an expiry, which would otherwise be kept for
/// good) are capped per issuer: past its cap a member's revocation of a new token is declined
/// `over_limit`; one on a token it already governs, and the principal's, still apply; a token
/// record that expires frees its key. A recovered receiver counts the same keys.
#[test]
fn governed_keys_are_capped_per_issuer_and_refused_clearly_past_it() {
    let config = ReceiverConfig {
        max_governed: 2,
        ..ReceiverConfig::default()
    };
    let mut r = Receiver::new(a(), config.clone());
    assert_eq!(
        receive_own(&mut r, 0, member_revokes(1, "m1", None)).0,
        Disposition::Applying
    );
    assert_eq!(
        receive_own(&mut r, 0, member_revokes(2, "m2", Some(500))).0,
        Disposition::Applying
    );
    let over = AckStatus::Declined(DeclineReason::OverLimit);
    assert_eq!(
        receive_own(&mut r, 0, member_revokes(3, "m3", None)),
        (Disposition::Declined(DeclineReason::OverLimit), vec![over])
    );
    assert!(!r.state().is_dropped(&TokenId::new("m3").unwrap()));
    assert_eq!(
        receive_own(&mut r, 0, member_revokes(4, "m1", None)).0,
        Disposition::Applying,
        "a key the member already governs adds nothing"
    );
    assert_eq!(
        receive_own(&mut r, 0, revoke_token(10, 3, 10_000)).0,
        Disposition::Applying,
        "the principal's keys are its own"
    );
    assert_eq!(r.held().governed, 3);
    // m2's record expires at 500: its key goes with it, and the member has room again.
    assert_eq!(r.maintain(UnixMillis(500)), 1);
    assert_eq!(r.held().governed, 2);
    assert_eq!(
        receive_own(&mut r, 600, member_revokes(5, "m3", None)).0,
        Disposition::Applying
    );
    // Recovered from the governed-by rows a store keeps: the cap holds as before.
    let member = AgentId::new("member").unwrap();
    let keys = ["m1", "m3"].map(|t| GovernedKey::Token(member.clone(), TokenId::new(t).unwrap()));
    let mut r = Receiver::recover(a(), config, [], [], keys, ReceiverState::default());
    assert_eq!(
        receive_own(&mut r, 0, member_revokes(6, "m9", None)),
        (Disposition::Declined(DeclineReason::OverLimit), vec![over])
    );
}

/// Different content under a known id is another obligation: declined `id_conflict`, never
/// acked `applied` — in flight, after its commit, and after a recovery from the applied-id
/// records (with their digests). The obligation applied under the id is re-acked as before.
#[test]
fn a_known_id_with_other_content_is_declined_never_acked_applied() {
    let mut r = Receiver::new(a(), ReceiverConfig::default());
    let first = revoke_token(1, 3, 10_000);
    let mut other = first.clone();
    other.payload = Payload::AnumatiConsent(ConsentPayload {
        decision: Some(ConsentDecision::Revoke),
        scope: Scope::new("calendar.read").unwrap(),
        expires_at: None,
    });
    assert_eq!(
        r.handle_obligation(UnixMillis(0), &p(), first.clone()),
        Disposition::Applying
    );
    // In flight: the other content is declined at once, the first still commits.
    assert_eq!(
        r.handle_obligation(UnixMillis(1), &p(), other.clone()),
        Disposition::Declined(DeclineReason::IdConflict)
    );
    while let Some(rec) = r.poll_persist() {
        r.handle_persisted(rec.token);
    }
    let acks: Vec<AckStatus> = std::iter::from_fn(|| r.poll_transmit())
        .map(|t| t.ack.status)
        .collect();
    assert_eq!(
        acks,
        vec![
            AckStatus::Declined(DeclineReason::IdConflict),
            AckStatus::Applied
        ]
    );
    assert_eq!(
        receive(&mut r, 2, other.clone()),
        (
            Disposition::Declined(DeclineReason::IdConflict),
            vec![AckStatus::Declined(DeclineReason::IdConflict)]
        )
    );
    assert!(!r
        .state()
        .is_withheld(&p(), &Scope::new("calendar.read").unwrap()));
    // Recovered from what a store keeps: the same answers.
    let mut r = Receiver::recover(
        a(),
        ReceiverConfig::default(),
        [AppliedRecord {
            id: first.id,
            expires: UnixMillis(20_000),
            digest: Some(first.digest()),
            issuer: Some(p()),
        }],
        [],
        [],
        ReceiverState::default(),
    );
    assert_eq!(
        receive(&mut r, 3, other),
        (
            Disposition::Declined(DeclineReason::IdConflict),
            vec![AckStatus::Declined(DeclineReason::IdConflict)]
        )
    );
    assert_eq!(
        receive(&mut r, 4, first),
        (Disposition::Duplicate, vec![AckStatus::Applied])
    );
}

mod known_ids {
    use super::*;
    use proptest::prelude::*;

    fn obligation() -> impl Strategy<Value = Obligation> {
        (
            0u128..4,
            0u8..3,
            "[a-z]{1,3}",
            0u64..3,
            prop::option::of(0u64..3),
        )
            .prop_map(|(id, kind, name, deadline, sequence)| {
                let payload = match kind {
                    0 => Payload::AnumatiConsent(ConsentPayload {
                        decision: Some(ConsentDecision::Revoke),
                        scope: Scope::new(name).unwrap(),
                        expires_at: None,
                    }),
                    1 => Payload::PhalaBeliefUpdate(BeliefUpdatePayload {
                        weight_key: WeightKey::new(name).unwrap(),
                        weight_delta: WeightDelta(-1_000),
                        ttl_ms: 1_000,
                    }),
                    _ => Payload::OauthToken(TokenPayload {
                        action: TokenAction::Revoke,
                        token_id: TokenId::new(name).unwrap(),
                        client_id: ClientId::new("c").unwrap(),
                        expires_at: None,
                    }),
                };
                Obligation {
                    id: ObligationId::from_u128(id),
                    issuer: p(),
                    target: a(),
                    created_at: UnixMillis(0),
                    deadline: UnixMillis(10_000 + deadline),
                    max_retries: 3,
                    sequence,
                    payload,
                }
            })
    }

    proptest! {
        /// Whatever arrives, in whatever order, with commits landing whenever: each id is
        /// applied once, any other content under it is declined `id_conflict` on arrival,
        /// and `applied` is acked only for ids applied.
        #[test]
        fn an_applied_ack_always_answers_the_content_applied(
            arrivals in prop::collection::vec((obligation(), any::<bool>()), 1..40)
        ) {
            let mut r = Receiver::new(a(), ReceiverConfig::default());
            let mut applied: std::collections::BTreeMap<ObligationId, Obligation> =
                Default::default();
            let mut in_flight = Vec::new();
            for (t, (o, commit)) in arrivals.into_iter().enumerate() {
                let d = r.handle_obligation(UnixMillis(t as u64), &p(), o.clone());
                if d == Disposition::Applying {
                    prop_assert!(applied.insert(o.id, o.clone()).is_none(), "applied twice");
                }
                if let Some(first) = applied.get(&o.id) {
                    if first != &o {
                        prop_assert_eq!(d, Disposition::Declined(DeclineReason::IdConflict));
                    }
                }
                while let Some(rec) = r.poll_persist() {
                    in_flight.push(rec.token);
                }
                if commit {
                    for token in in_flight.drain(..) {
                        r.handle_persisted(token);
                    }
                }
                while let Some(tx) = r.poll_transmit() {
                    if tx.ack.status == AckStatus::Applied {
                        prop_assert!(applied.contains_key(&tx.ack.obligation_id));
                    }
                }
            }
        }
    }
}

fn grant(id: u128, sequence: u64, deadline: u64, lease: Option<u64>) -> Obligation {
    let mut o = revoke_token(id, 3, deadline);
    o.sequence = Some(sequence);
    o.payload = Payload::AnumatiConsent(ConsentPayload {
        decision: Some(ConsentDecision::Grant),
        scope: Scope::new("cal").unwrap(),
        expires_at: lease.map(UnixMillis),
    });
    o
}

#[test]
fn a_grant_opens_the_scope_only_when_confirmed_and_only_for_its_lease() {
    let cal = Scope::new("cal").unwrap();
    let mut c = Custodian::new(p(), config(), 5);
    assert_eq!(
        c.issue(UnixMillis(0), grant(1, 1, 1_000, Some(5_000))),
        Ok(Admission::Custody)
    );
    // Unconfirmed: withheld, named by the grant.
    let a1 = c.principal().authorization(&a(), &cal).unwrap();
    assert!(a1.withheld && a1.by == Some(ObligationId::from_u128(1)));
    assert_eq!(
        c.principal().permits(&a(), &cal, UnixMillis(1)),
        Some(false)
    );
    persist_all(&mut c, 0);
    assert_eq!(
        c.handle_ack(UnixMillis(20), &a(), ack(1, AckStatus::Applied)),
        AckDisposition::Discharged
    );
    // Confirmed: open until the lease ends, and not a millisecond after.
    assert_eq!(
        c.principal().permits(&a(), &cal, UnixMillis(4_999)),
        Some(true)
    );
    assert_eq!(
        c.principal().permits(&a(), &cal, UnixMillis(5_000)),
        Some(false)
    );
    // The terminal record carries the opening, so a store that replays it opens too.
    let rec = std::iter::from_fn(|| c.poll_persist())
        .find(|r| matches!(r.record, CustodianRecord::Terminal { .. }))
        .unwrap();
    let CustodianRecord::Terminal { principal, .. } = rec.record else {
        unreachable!()
    };
    assert!(matches!(
        principal,
        Some(PrincipalUpdate::Grant {
            until: Some(UnixMillis(5_000)),
            ..
        })
    ));
    // A renewal, unconfirmed, leaves the running lease alone ...
    c.issue(UnixMillis(100), grant(2, 2, 1_100, Some(9_000)))
        .unwrap();
    assert_eq!(
        c.principal().permits(&a(), &cal, UnixMillis(200)),
        Some(true)
    );
    // ... and when it cannot be confirmed, its fail-safe closes the scope at once.
    persist_all(&mut c, 100);
    let mut now = 100;
    while c.is_pending(ObligationId::from_u128(2)) {
        now = c.poll_timeout().unwrap().0;
        c.handle_timeout(UnixMillis(now));
        persist_all(&mut c, now);
    }
    assert!(now <= 1_100 + 50);
    assert_eq!(
        c.principal().permits(&a(), &cal, UnixMillis(now)),
        Some(false)
    );
    // A declined grant leaves the scope withheld as well.
    c.issue(UnixMillis(now), grant(3, 3, now + 1_000, None))
        .unwrap();
    persist_all(&mut c, now);
    c.handle_ack(
        UnixMillis(now + 1),
        &a(),
        ack(3, AckStatus::Declined(DeclineReason::Refused)),
    );
    assert_eq!(
        c.principal().permits(&a(), &cal, UnixMillis(now + 2)),
        Some(false)
    );
}

#[test]
fn an_older_grant_confirmed_late_does_not_reopen_a_newer_revocation() {
    let cal = Scope::new("cal").unwrap();
    let mut c = Custodian::new(p(), config(), 5);
    c.issue(UnixMillis(0), grant(1, 1, 5_000, None)).unwrap();
    let mut revoke = grant(2, 2, 5_000, None);
    revoke.payload = Payload::AnumatiConsent(ConsentPayload {
        decision: Some(ConsentDecision::Revoke),
        scope: cal.clone(),
        expires_at: None,
    });
    c.issue(UnixMillis(1), revoke).unwrap();
    persist_all(&mut c, 1);
    c.handle_ack(UnixMillis(20), &a(), ack(1, AckStatus::Applied));
    let now = c.principal().authorization(&a(), &cal).unwrap();
    assert!(now.withheld && now.sequence == Some(2), "{now:?}");
}

#[test]
fn the_agents_view_ends_a_lease_and_an_expired_token() {
    let cal = Scope::new("cal").unwrap();
    let mut r = Receiver::new(a(), ReceiverConfig::default());
    assert_eq!(
        receive(&mut r, 0, grant(1, 1, 1_000, Some(5_000))),
        (Disposition::Applying, vec![AckStatus::Applied])
    );
    assert!(r.state().permits(&p(), &cal, UnixMillis(4_999)));
    assert!(!r.state().permits(&p(), &cal, UnixMillis(5_000)));
    // A renewal extends it; a grant without a lease ends the lease.
    receive(&mut r, 10, grant(2, 2, 1_000, Some(8_000)));
    assert!(r.state().permits(&p(), &cal, UnixMillis(7_999)));
    assert!(!r.state().permits(&p(), &cal, UnixMillis(8_000)));
    receive(&mut r, 20, grant(3, 3, 1_000, None));
    assert!(r.state().permits(&p(), &cal, UnixMillis(u64::MAX)));
    assert_eq!(r.state().leases().count(), 0);
    // A scope never decided on is not governed here.
    assert!(r
        .state()
        .permits(&p(), &Scope::new("other").unwrap(), UnixMillis(0)));
    // A cached token is in force until its own expiry, before upkeep forgets it.
    let mut issue = token_t1(4, TokenAction::Issue, 1);
    if let Payload::OauthToken(t) = &mut issue.payload {
        t.expires_at = Some(UnixMillis(3_000));
    }
    receive(&mut r, 30, issue);
    let t1 = TokenId::new("t1").unwrap();
    assert!(r.state().is_cached(&t1));
    assert!(r.state().token_in_force(&t1, UnixMillis(2_999)));
    assert!(!r.state().token_in_force(&t1, UnixMillis(3_000)));
}

#[test]
fn the_lease_mutant_applies_a_grant_for_good() {
    let cal = Scope::new("cal").unwrap();
    let config = ReceiverConfig {
        mutation: Some(Mutation::LeaseIgnored),
        ..ReceiverConfig::default()
    };
    let mut r = Receiver::new(a(), config);
    receive(&mut r, 0, grant(1, 1, 1_000, Some(5_000)));
    assert!(r.state().permits(&p(), &cal, UnixMillis(6_000)));
}

#[test]
fn an_agent_with_a_policy_is_asked_once_per_obligation_and_its_decision_stands() {
    let config = ReceiverConfig {
        ask_policy: true,
        ..ReceiverConfig::default()
    };
    let mut r = Receiver::new(a(), config);
    let o = revoke_token(1, 3, 10_000);
    assert_eq!(
        receive(&mut r, 0, o.clone()),
        (Disposition::Deciding, vec![])
    );
    let asked: Vec<_> = std::iter::from_fn(|| r.poll_event()).collect();
    assert!(matches!(&asked[..], [ReceiverEvent::Decide { obligation }] if obligation.id == o.id));
    // A redelivery while the agent decides is held: not asked again, not acked.
    assert_eq!(
        receive(&mut r, 1, o.clone()),
        (Disposition::Deciding, vec![])
    );
    assert!(r.poll_event().is_none());
    // Another obligation under the same id while deciding is a conflict, declined.
    let mut other = o.clone();
    other.max_retries = 9;
    assert_eq!(
        receive(&mut r, 2, other).0,
        Disposition::Declined(DeclineReason::IdConflict)
    );
    // Deferred: acked so, nothing applied, and the next delivery asks again.
    assert_eq!(
        r.decided(UnixMillis(3), o.id, PolicyDecision::Defer),
        Some(Disposition::Deferred)
    );
    assert_eq!(
        std::iter::from_fn(|| r.poll_transmit())
            .map(|t| t.ack.status)
            .collect::<Vec<_>>(),
        vec![AckStatus::Deferred]
    );
    assert!(!r.has_applied(o.id));
    assert_eq!(r.decided(UnixMillis(3), o.id, PolicyDecision::Apply), None);
    receive(&mut r, 4, o.clone());
    // Applied: the checks and the apply run, and the ack follows the commit.
    assert_eq!(
        r.decided(UnixMillis(5), o.id, PolicyDecision::Apply),
        Some(Disposition::Applying)
    );
    while let Some(rec) = r.poll_persist() {
        r.handle_persisted(rec.token);
    }
    assert!(r.has_applied(o.id));
    assert_eq!(r.deciding_len(), 0);
    // Declined in the agent's words: the ack carries them.
    let o2 = revoke_token(2, 3, 10_000);
    receive(&mut r, 6, o2.clone());
    std::iter::from_fn(|| r.poll_transmit()).for_each(drop);
    let words = Detail::new("a live job holds it").unwrap();
    r.decided(UnixMillis(7), o2.id, PolicyDecision::Decline(words.clone()));
    let ack = r.poll_transmit().unwrap().ack;
    assert_eq!(ack.status, AckStatus::Declined(DeclineReason::Policy));
    assert_eq!(ack.detail, Some(words));
    assert!(!r.has_applied(o2.id));
}

#[test]
fn a_policy_decline_reaches_the_principals_terminal_record_with_its_words() {
    let mut c = Custodian::new(p(), config(), 5);
    c.issue(UnixMillis(0), revoke_token(1, 3, 10_000)).unwrap();
    persist_all(&mut c, 0);
    let words = Detail::new("a live job holds it").unwrap();
    c.handle_ack(
        UnixMillis(10),
        &a(),
        CustodyAck {
            detail: Some(words.clone()),
            ..ack(1, AckStatus::Declined(DeclineReason::Policy))
        },
    );
    let records: Vec<_> = std::iter::from_fn(|| c.poll_persist()).collect();
    let Some(CustodianRecord::Terminal { record, .. }) = records.last().map(|r| &r.record) else {
        panic!("a terminal record: {records:?}");
    };
    assert_eq!(record.outcome, Outcome::Declined(DeclineReason::Policy));
    assert_eq!(record.detail, Some(words));
    // The safe action stands, as for every decline.
    assert!(c.principal().is_revoked(&TokenId::new("t1").unwrap()));
}

/// A kind read on the wire with no rules registered (its `KindEntry` alone, submitted by
/// hand as the fuzz target's is, not through `register_kind!`).
struct Unruled;

impl abhyasa_wire::WireKind for Unruled {
    const NAME: &'static str = "test.unruled";
    type Payload = String;

    fn check(_p: &String) -> Result<(), String> {
        Ok(())
    }

    fn words(p: &String) -> String {
        p.clone()
    }
}

abhyasa_wire::inventory::submit! { abhyasa_wire::KindEntry::of::<Unruled>() }

#[test]
fn a_kind_read_without_rules_is_declined_unknown_and_never_taken_into_custody() {
    let mut o = revoke_token(1, 3, 10_000);
    let payload = abhyasa_wire::RegisteredPayload::new::<Unruled>(&"stop".to_owned()).unwrap();
    o.payload = Payload::Registered(payload);
    assert_eq!(o.kind(), Kind::Registered("test.unruled"));
    assert!(!kinds::known(&o) && !kinds::admissible(&o));
    assert_eq!((kinds::safe(&o, 0), kinds::on_issue(&o)), (None, None));
    assert_eq!((kinds::governed_key(&o), kinds::effect(&o)), (None, None));

    // The receiver applies nothing and says why.
    let mut r = Receiver::new(a(), ReceiverConfig::default());
    assert_eq!(
        receive(&mut r, 0, o.clone()),
        (
            Disposition::Declined(DeclineReason::UnknownKind),
            vec![AckStatus::Declined(DeclineReason::UnknownKind)]
        )
    );
    assert_eq!(r.stats().applied, 0);
    assert!(r.poll_persist().is_none());

    // The custodian has no fail-safe to hold it by: it is sent once, best-effort.
    let mut c = Custodian::new(p(), config(), 1);
    assert_eq!(c.issue(UnixMillis(0), o), Ok(Admission::BestEffort));
    assert_eq!(c.pending_len(), 0);
}
