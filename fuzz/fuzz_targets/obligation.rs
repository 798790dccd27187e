//! An obligation as it arrives on a `to/<agent>` track: decoded strictly, or a typed error
//! (keeping the envelope when only the kind or payload was unreadable). What decodes
//! re-encodes to the same bytes (the wire is deterministic CBOR) and validates or not
//! without panicking.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    match abhyasa_wire::decode_obligation(data) {
        Ok(o) => {
            let _ = o.validate();
            let again = abhyasa_wire::encode(&o);
            assert_eq!(abhyasa_wire::decode_obligation(&again).ok(), Some(o));
        }
        Err(e) => {
            // An error that kept the envelope names a decline reason, and only then.
            assert_eq!(e.envelope().is_some(), e.decline_reason().is_some());
        }
    }
});
