//! A MOQT object datagram (the first attempt of an obligation may travel as one).
//!
//! The check itself is `abhyasa_fuzz::decoders::moqt_datagram`, which `tests/fuzz_corpora.rs` also runs
//! over every committed seed and kept input.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| abhyasa_fuzz::decoders::moqt_datagram(data));
