//! Escalations, terminal records, reconciliation notes and safe actions: what the store and
//! `abhyasa check` read back and what an escalation carries.
//!
//! The check itself is `abhyasa_fuzz::decoders::escalation`, which `tests/fuzz_corpora.rs` also runs
//! over every committed seed and kept input.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| abhyasa_fuzz::decoders::escalation(data));
