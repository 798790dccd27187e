//! The end-to-end signature envelope (COSE_Sign1, `abhyasa_moq::signed`) as a receiver opens
//! it, in two modes chosen by the first byte:
//!
//! - raw: the rest is handed to `Verifier::open` as it is — it must refuse or open, never panic;
//! - forged: the rest is `[payload length][payload][(offset u16, xor u8)…]`; the payload is
//!   signed by a real agent of the deployment, the envelope altered at those offsets, then
//!   opened. Whatever the alteration, an envelope that opens must say exactly what was signed
//!   and by whom: no change to the bytes yields another payload, another signer, or the other
//!   kind. Opened in a batch beside a good envelope (`Verifier::open_all`), it must get the
//!   answer it gets alone, and the neighbour must still open.
//!
//! The check itself is `abhyasa_fuzz::bindings::signed`, which `tests/fuzz_corpora.rs` also runs
//! over every committed seed and kept input.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| abhyasa_fuzz::bindings::signed(data));
