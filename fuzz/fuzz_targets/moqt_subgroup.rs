//! A MOQT subgroup stream: a header, then objects until the bytes run out, as the session
//! reads an incoming unidirectional stream.
//!
//! The check itself is `abhyasa_fuzz::decoders::moqt_subgroup`, which `tests/fuzz_corpora.rs` also runs
//! over every committed seed and kept input.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| abhyasa_fuzz::decoders::moqt_subgroup(data));
