//! A tool call's or result's `_meta` as it lands in the MCP binding: obligations, acks, a
//! permit and a receipt, each base64 CBOR under its `org.abhyasa/…` key.
//!
//! The check itself is `abhyasa_fuzz::bindings::mcp_meta`, which `tests/fuzz_corpora.rs` also runs
//! over every committed seed and kept input.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| abhyasa_fuzz::bindings::mcp_meta(data));
