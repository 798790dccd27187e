//! A MOQT subgroup stream: a header, then objects until the bytes run out, as the session
//! reads an incoming unidirectional stream.
#![no_main]

use abhyasa_wire::moqt::{StreamObject, SubgroupHeader};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(Some((header, used))) = SubgroupHeader::decode(data) else {
        return;
    };
    let mut again = Vec::new();
    header.encode(&mut again);
    assert_eq!(
        SubgroupHeader::decode(&again).ok(),
        Some(Some((header.clone(), again.len())))
    );
    let mut rest = &data[used..];
    while let Ok(Some((object, used))) = StreamObject::decode(rest, header.extensions) {
        assert!(used > 0 && used <= rest.len());
        let mut again = Vec::new();
        object.encode(header.extensions, &mut again);
        assert_eq!(
            StreamObject::decode(&again, header.extensions).ok(),
            Some(Some((object, again.len())))
        );
        rest = &rest[used..];
    }
});
