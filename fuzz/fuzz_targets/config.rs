//! A node config (TOML), read and checked as `abhyasa node --config` does before it touches
//! the disk or the network.
//!
//! The check itself is `abhyasa_fuzz::bindings::config`, which `tests/fuzz_corpora.rs` also runs
//! over every committed seed and kept input.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| abhyasa_fuzz::bindings::config(data));
