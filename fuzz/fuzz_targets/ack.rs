//! A custody ack as it arrives on an `acks/<agent>` track.
//!
//! The check itself is `abhyasa_fuzz::decoders::ack`, which `tests/fuzz_corpora.rs` also runs
//! over every committed seed and kept input.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| abhyasa_fuzz::decoders::ack(data));
