//! A tool call's or result's `_meta` as it lands in the MCP binding: obligations, acks, a
//! permit and a receipt, each base64 CBOR under its `org.abhyasa/…` key.
#![no_main]

use libfuzzer_sys::fuzz_target;
use serde_json::{Map, Value};

fuzz_target!(|data: &[u8]| {
    let Ok(meta) = serde_json::from_slice::<Map<String, Value>>(data) else {
        return;
    };
    if let Ok(objects) = abhyasa_mcp::obligations_from_meta(&meta) {
        // Every object it passes on reads as an obligation (or keeps its envelope).
        for o in objects {
            assert!(
                abhyasa_wire::decode_obligation(&o).is_ok()
                    || abhyasa_wire::decode_obligation(&o).is_err_and(|e| e.envelope().is_some())
            );
        }
    }
    let _ = abhyasa_mcp::acks_from_meta(&meta);
    let _ = abhyasa_mcp::permit_from_meta(&meta);
    let _ = abhyasa_mcp::receipt_from_meta(&meta);
});
