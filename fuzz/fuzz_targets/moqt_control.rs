//! The MOQT control stream: framed messages read one after another from the front of the
//! buffer, as the session reads them. Each decoded message re-encodes to a frame that
//! decodes to the same message.
#![no_main]

use abhyasa_wire::moqt::Control;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let mut rest = data;
    while let Ok(Some((msg, used))) = Control::decode(rest) {
        assert!(used > 0 && used <= rest.len());
        let mut again = Vec::new();
        msg.encode(&mut again);
        assert_eq!(Control::decode(&again).ok(), Some(Some((msg, again.len()))));
        rest = &rest[used..];
    }
});
