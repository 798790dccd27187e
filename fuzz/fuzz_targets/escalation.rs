//! Escalations, terminal records, reconciliation notes and safe actions: what the store and
//! `abhyasa check` read back and what an escalation carries.
#![no_main]

use abhyasa_wire::{decode, encode, Escalation, ReconciliationNote, SafeAction, TerminalRecord};
use libfuzzer_sys::fuzz_target;

fn round_trip<T>(data: &[u8])
where
    T: serde::Serialize + serde::de::DeserializeOwned + PartialEq + std::fmt::Debug,
{
    if let Ok(v) = decode::<T>(data) {
        assert_eq!(decode::<T>(&encode(&v)).ok(), Some(v));
    }
}

fuzz_target!(|data: &[u8]| {
    round_trip::<Escalation>(data);
    round_trip::<TerminalRecord>(data);
    round_trip::<ReconciliationNote>(data);
    round_trip::<SafeAction>(data);
});
