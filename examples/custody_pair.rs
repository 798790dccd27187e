//! Drive a custodian and a receiver by hand, with an in-memory "disk" and a lossy channel:
//! the whole custody contract in one screen.
//!
//! `cargo run --example custody_pair`

use abhyasa_custody::{Custodian, CustodianConfig, CustodianEvent, Receiver, ReceiverConfig};
use abhyasa_wire::{
    decode, decode_obligation, encode, AgentId, ConsentDecision, ConsentPayload, CustodyAck,
    Obligation, ObligationId, Payload, Scope, UnixMillis,
};

fn main() {
    let principal = AgentId::new("principal").unwrap();
    let agent = AgentId::new("calendar-agent").unwrap();
    let mut custodian = Custodian::new(principal.clone(), CustodianConfig::default(), 42);
    let mut receiver = Receiver::new(agent.clone(), ReceiverConfig::default());

    let revoke = Obligation {
        id: ObligationId::from_u128(1),
        issuer: principal.clone(),
        target: agent.clone(),
        created_at: UnixMillis(0),
        deadline: UnixMillis(30_000),
        max_retries: 10,
        sequence: Some(1),
        payload: Payload::AnumatiConsent(ConsentPayload {
            decision: Some(ConsentDecision::Revoke),
            scope: Scope::new("calendar.read").unwrap(),
            expires_at: None,
        }),
    };
    let scope = Scope::new("calendar.read").unwrap();
    custodian.issue(UnixMillis(0), revoke).unwrap();
    println!(
        "issued; principal withholds calendar.read at once: {}",
        custodian.principal().is_withheld(&agent, &scope)
    );

    // The channel drops the first two sends.
    let mut now = UnixMillis(0);
    let mut sends = 0;
    while custodian.pending_len() > 0 {
        while let Some(p) = custodian.poll_persist() {
            custodian.handle_persisted(now, p.token); // "disk": durable at once
        }
        while let Some(t) = custodian.poll_transmit() {
            sends += 1;
            if sends <= 2 {
                println!("t={now}: attempt {} lost", t.attempt);
                continue;
            }
            let o = decode_obligation(&encode(&t.obligation)).unwrap();
            receiver.handle_obligation(now, &principal, o);
            while let Some(p) = receiver.poll_persist() {
                receiver.handle_persisted(p.token);
            }
            while let Some(a) = receiver.poll_transmit() {
                let ack: CustodyAck = decode(&encode(&a.ack)).unwrap();
                println!(
                    "t={now}: attempt {} delivered, ack {:?}",
                    t.attempt, ack.status
                );
                custodian.handle_ack(now, &agent, ack);
            }
        }
        while let Some(p) = custodian.poll_persist() {
            custodian.handle_persisted(now, p.token);
        }
        if let Some(wake) = custodian.poll_timeout() {
            now = wake;
            custodian.handle_timeout(now);
        }
    }
    while let Some(e) = custodian.poll_event() {
        if let CustodianEvent::Terminal { record, .. } = e {
            println!(
                "custody ended: {:?} after {} attempts",
                record.outcome, record.attempts
            );
        }
    }
    println!(
        "agent stopped exercising calendar.read: {}",
        receiver.state().is_withheld(&principal, &scope)
    );
}
