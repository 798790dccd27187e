//! The A2A binding's JSON bodies as they land: an obligation (turned into the wire object the
//! custody machine takes), an ack, and a peer's agent card with its Abhyasa parameters.
//!
//! The check itself is `abhyasa_fuzz::bindings::a2a_json`, which `tests/fuzz_corpora.rs` also runs
//! over every committed seed and kept input.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| abhyasa_fuzz::bindings::a2a_json(data));
