//! The node machine driven by hand.

use abhyasa_custody::{CustodianConfig, ReceiverConfig};
use abhyasa_wire::{
    AckStatus, ClientId, Outcome, Payload, TokenAction, TokenId, TokenPayload, UnixMillis,
};

use super::*;

fn p() -> AgentId {
    AgentId::new("p").unwrap()
}

fn a() -> AgentId {
    AgentId::new("a").unwrap()
}

fn node(agent: AgentId, mutation: Option<NodeMutation>, rate: u32) -> NodeMachine {
    let cc = CustodianConfig {
        response_timeout_ms: 100,
        backoff_base_ms: 50,
        backoff_cap_ms: 400,
        ..CustodianConfig::default()
    };
    NodeMachine::new(
        UnixMillis(0),
        MachineConfig {
            requests_per_second_per_peer: rate,
            mutation,
            ..MachineConfig::default()
        },
        Custodian::new(agent.clone(), cc, 7),
        Receiver::new(agent, ReceiverConfig::default()),
        None,
    )
}

fn revoke(id: u128, deadline: u64) -> Obligation {
    Obligation {
        id: ObligationId::from_u128(id),
        issuer: p(),
        target: a(),
        created_at: UnixMillis(0),
        deadline: UnixMillis(deadline),
        max_retries: 40,
        sequence: None,
        payload: Payload::OauthToken(TokenPayload {
            action: TokenAction::Revoke,
            token_id: TokenId::new(format!("t{id}")).unwrap(),
            client_id: ClientId::new("c").unwrap(),
            expires_at: None,
        }),
    }
}

/// Commits everything outstanding at `now`.
fn commit(m: &mut NodeMachine, now: u64) {
    while let Some(c) = m.poll_commit() {
        m.handle_committed(UnixMillis(now), c.token);
    }
}

/// Drives `m` as the driver does: inputs every `every` ms (an ack for an unknown id: traffic
/// that changes nothing) and the timers at their deadline, until `end`; returns when the
/// obligation ended, if it did.
fn drive_under_traffic(m: &mut NodeMachine, every: u64, end: u64) -> Option<(u64, Outcome)> {
    let mut next_input = every;
    let mut now = 0;
    while now < end {
        let deadline = m.poll_timeout().map_or(u64::MAX, |t| t.0);
        now = deadline.min(next_input);
        if now == next_input {
            let noise = CustodyAck {
                obligation_id: ObligationId::from_u128(u128::MAX),
                target: a(),
                status: AckStatus::Applied,
                acked_at: UnixMillis(now),
                detail: None,
            };
            m.handle_object(UnixMillis(now), &a(), Track::Acks, &encode(&noise));
            next_input += every;
        }
        // Whatever woke the driver, the due timers fire.
        m.handle_timeout(UnixMillis(now));
        commit(m, now);
        while let Some(e) = m.poll_event() {
            if let MachineEvent::Terminal { record, .. } = e {
                return Some((now, record.outcome));
            }
        }
        while m.poll_transmit().is_some() {}
    }
    None
}

#[test]
fn a_deadline_is_kept_under_steady_traffic_and_the_old_loop_is_caught() {
    for (mutation, expect_on_time) in [
        (None, true),
        (Some(NodeMutation::TimersOnlyWhenQuiet), false),
    ] {
        let mut m = node(p(), mutation, 0);
        m.session_up(&a());
        assert_eq!(
            m.issue(UnixMillis(0), revoke(1, 2_000)),
            Ok(Issued::New(Admission::Custody))
        );
        let ended = drive_under_traffic(&mut m, 100, 10_000);
        match expect_on_time {
            // Nobody acks: escalated at its deadline, not a moment later than the next pass.
            true => {
                let (at, outcome) = ended.expect("ended");
                assert!(matches!(outcome, Outcome::Escalated(_)), "{outcome:?}");
                assert!((2_000..=2_100).contains(&at), "escalated at {at}");
            }
            false => assert_eq!(ended, None, "the mutant's timers fire under traffic"),
        }
    }
}

#[test]
fn transmits_go_to_the_binding_then_the_session_and_nowhere_without_either() {
    let mut m = node(p(), None, 0);
    m.issue(UnixMillis(0), revoke(1, 60_000)).unwrap();
    commit(&mut m, 0);
    assert_eq!(m.poll_transmit(), None, "no route yet");
    m.session_up(&a());
    m.peer_ready(UnixMillis(1), &a());
    commit(&mut m, 1);
    let g = m.poll_transmit().expect("offered on the session");
    assert_eq!(
        (g.route, g.track, g.objects.len()),
        (Route::Session, Track::Obligations, 1)
    );
    // The next attempt (a retry at its own time) takes the binding once there is one, and
    // the session again once the binding let go.
    m.attach(UnixMillis(2), &a());
    assert_eq!(next_route(&mut m), Some(Route::Binding));
    m.detach(&a());
    assert_eq!(next_route(&mut m), Some(Route::Session));
}

/// Fires the timers at their deadlines until something goes out; its route.
fn next_route(m: &mut NodeMachine) -> Option<Route> {
    for _ in 0..100 {
        commit(m, 0);
        if let Some(g) = m.poll_transmit() {
            return Some(g.route);
        }
        let t = m.poll_timeout()?;
        m.handle_timeout(t);
        commit(m, t.0);
        if let Some(g) = m.poll_transmit() {
            return Some(g.route);
        }
    }
    None
}

#[test]
fn a_peer_past_its_rate_is_dropped_unread_and_counted() {
    let mut m = node(a(), None, 5);
    let objects: Vec<Vec<u8>> = (0..8).map(|i| encode(&revoke(i, 60_000))).collect();
    let ids = m.deliver(UnixMillis(0), &p(), &objects);
    assert_eq!(ids.iter().filter(|i| i.is_some()).count(), 5);
    assert_eq!(m.slowed().get(&p()), Some(&3));
    // A second later the bucket is full again.
    let ids = m.deliver(UnixMillis(1_000), &p(), &objects[5..]);
    assert!(ids.iter().all(Option::is_some));
}

#[test]
fn two_spellings_are_two_obligations_and_the_folding_mutant_makes_them_one() {
    for (mutation, applied) in [(None, 2), (Some(NodeMutation::FoldIdSpellings), 1)] {
        let mut m = node(a(), mutation, 0);
        m.deliver_text(
            UnixMillis(0),
            &p(),
            "0190f3c4-8e2a-7b1c-9d4e-5f6a7b8c9d0e",
            revoke(0, 60_000),
        );
        m.deliver_text(
            UnixMillis(0),
            &p(),
            "0190F3C48E2A7B1C9D4E5F6A7B8C9D0E",
            revoke(1, 60_000),
        );
        commit(&mut m, 0);
        let mut statuses = Vec::new();
        while let Some(e) = m.poll_event() {
            if let MachineEvent::Acked { ack, .. } = e {
                statuses.push(ack.status);
            }
        }
        let n = statuses
            .iter()
            .filter(|s| matches!(s, AckStatus::Applied))
            .count();
        assert_eq!(n, applied, "{statuses:?}");
    }
}
