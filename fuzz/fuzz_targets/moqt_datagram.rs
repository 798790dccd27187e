//! A MOQT object datagram (the first attempt of an obligation may travel as one).
#![no_main]

use abhyasa_wire::moqt::ObjectDatagram;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Ok(d) = ObjectDatagram::decode(data) {
        assert_eq!(ObjectDatagram::decode(&d.encode()).ok(), Some(d));
    }
});
