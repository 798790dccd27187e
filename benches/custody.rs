//! Cost of the pure custody path: wire encode/decode and one full custody cycle through both
//! machines (issue → persist → send → apply → commit → ack → discharge), with no IO. This is
//! the floor under any transport or store; the durable and networked figures come from the
//! store and transport benchmarks.

use std::hint::black_box;

use abhyasa_custody::{Custodian, CustodianConfig, Receiver, ReceiverConfig};
use abhyasa_wire::{
    decode_obligation, encode, AgentId, ClientId, Obligation, ObligationId, Payload, TokenAction,
    TokenId, TokenPayload, UnixMillis,
};
use criterion::{criterion_group, criterion_main, Criterion, Throughput};

fn obligation(id: u128) -> Obligation {
    Obligation {
        id: ObligationId::from_u128(id),
        issuer: AgentId::new("principal").unwrap(),
        target: AgentId::new("agent-1").unwrap(),
        created_at: UnixMillis(1_700_000_000_000),
        deadline: UnixMillis(1_700_000_060_000),
        max_retries: 12,
        sequence: Some(id as u64),
        payload: Payload::OauthToken(TokenPayload {
            action: TokenAction::Revoke,
            token_id: TokenId::new(format!("tok-{id}")).unwrap(),
            client_id: ClientId::new("mail-client").unwrap(),
            expires_at: None,
        }),
    }
}

fn wire(c: &mut Criterion) {
    let o = obligation(7);
    let bytes = encode(&o);
    let mut g = c.benchmark_group("wire");
    g.throughput(Throughput::Elements(1));
    g.bench_function("encode_obligation", |b| b.iter(|| encode(black_box(&o))));
    g.bench_function("decode_obligation", |b| {
        b.iter(|| decode_obligation(black_box(&bytes)).unwrap())
    });
    g.finish();
}

fn cycle(c: &mut Criterion) {
    let principal = AgentId::new("principal").unwrap();
    let agent = AgentId::new("agent-1").unwrap();
    let mut g = c.benchmark_group("custody");
    g.throughput(Throughput::Elements(1));
    g.bench_function("full_cycle_in_memory", |b| {
        let mut custodian = Custodian::new(principal.clone(), CustodianConfig::default(), 1);
        let mut receiver = Receiver::new(agent.clone(), ReceiverConfig::default());
        let mut id = 0u128;
        let now = UnixMillis(1_700_000_000_000);
        b.iter(|| {
            id += 1;
            custodian.issue(now, obligation(id)).unwrap();
            while let Some(p) = custodian.poll_persist() {
                custodian.handle_persisted(now, p.token);
            }
            while let Some(t) = custodian.poll_transmit() {
                let o = decode_obligation(&encode(&t.obligation)).unwrap();
                receiver.handle_obligation(now, &principal, o);
            }
            while let Some(p) = receiver.poll_persist() {
                receiver.handle_persisted(p.token);
            }
            while let Some(a) = receiver.poll_transmit() {
                custodian.handle_ack(now, &agent, a.ack);
            }
            while custodian.poll_event().is_some() {}
            while receiver.poll_event().is_some() {}
            // Pruning keeps the receiver's applied-id ledger bounded as ids accumulate.
            receiver.handle_timeout(UnixMillis(1_700_000_070_000));
            while receiver.poll_persist().is_some() {}
            assert_eq!(custodian.pending_len(), 0);
        })
    });
    g.finish();
}

criterion_group!(benches, wire, cycle);
criterion_main!(benches);
