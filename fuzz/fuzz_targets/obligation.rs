//! An obligation as it arrives on a `to/<agent>` track: decoded strictly, or a typed error
//! (keeping the envelope when only the kind or payload was unreadable). What decodes
//! re-encodes to bytes that decode to the same value, and validates or not without
//! panicking.
//!
//! The check itself is `abhyasa_fuzz::decoders::obligation`, which `tests/fuzz_corpora.rs`
//! also runs over every committed seed and kept input.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| abhyasa_fuzz::decoders::obligation(data));
