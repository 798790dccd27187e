//! The MOQT control stream: framed messages read one after another from the front of the
//! buffer, as the session reads them. Each decoded message re-encodes to a frame that
//! decodes to the same message.
//!
//! The check itself is `abhyasa_fuzz::decoders::moqt_control`, which `tests/fuzz_corpora.rs` also runs
//! over every committed seed and kept input.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| abhyasa_fuzz::decoders::moqt_control(data));
