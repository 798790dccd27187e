//! A custody ack as it arrives on an `acks/<agent>` track.
#![no_main]

use abhyasa_wire::{decode, encode, CustodyAck};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Ok(ack) = decode::<CustodyAck>(data) {
        assert_eq!(decode::<CustodyAck>(&encode(&ack)).ok(), Some(ack));
    }
});
