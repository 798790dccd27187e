//! Everything on a `ledger/<peer>` track: a `LedgerMessage`, and inside it every signed
//! certificate opened for its body (the canonical-CBOR check included) as a branch or a
//! gateway does before it looks at a signature.
#![no_main]

use abhyasa_wire::ledger::LedgerMessage;
use abhyasa_wire::{decode, encode};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(m) = decode::<LedgerMessage>(data) else {
        return;
    };
    assert_eq!(decode::<LedgerMessage>(&encode(&m)).ok().as_ref(), Some(&m));
    match &m {
        LedgerMessage::Transfer(s) => drop(s.decode_checked()),
        LedgerMessage::Decision(s) => drop(s.decode_checked()),
        LedgerMessage::SourceDecision(s) => drop(s.decode_checked()),
        LedgerMessage::Dispatch { permit, .. } => drop(permit.decode_checked()),
        LedgerMessage::Receipt(s) => drop(s.decode_checked()),
        LedgerMessage::NoEffect(s) => drop(s.decode_checked()),
        LedgerMessage::Fence(s) => drop(s.decode_checked()),
        LedgerMessage::Fenced(s) => drop(s.decode_checked()),
        _ => {}
    }
});
