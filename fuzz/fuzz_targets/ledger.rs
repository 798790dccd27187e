//! Everything on a `ledger/<peer>` track: a `LedgerMessage`, and inside it every signed
//! certificate opened for its body (the canonical-CBOR check included) as a branch or a
//! gateway does before it looks at a signature.
//!
//! The check itself is `abhyasa_fuzz::decoders::ledger`, which `tests/fuzz_corpora.rs` also runs
//! over every committed seed and kept input.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| abhyasa_fuzz::decoders::ledger(data));
