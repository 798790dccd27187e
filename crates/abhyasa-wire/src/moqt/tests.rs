//! Golden vectors written by hand from the draft's field layouts (not produced by this
//! encoder), round trips, and hostile input.

use proptest::prelude::*;

use super::*;

fn h(s: &str) -> Vec<u8> {
    hex::decode(s.replace([' ', '\n'], "")).unwrap()
}

fn control_golden(msg: Control, bytes: &str) {
    let want = h(bytes);
    let mut got = Vec::new();
    msg.encode(&mut got);
    assert_eq!(hex::encode(&got), hex::encode(&want), "encoding of {msg:?}");
    assert_eq!(Control::decode(&want).unwrap(), Some((msg, want.len())));
    crate::tests::fuzz_seed("moqt_control", &want);
    // Every strict prefix is "not yet".
    for cut in 0..want.len() {
        assert_eq!(Control::decode(&want[..cut]).unwrap(), None, "prefix {cut}");
    }
}

fn ns() -> Namespace {
    Namespace::from_strs(&["abhyasa", "v1", "p"])
}

// "abhyasa" = 61 62 68 79 61 73 61; "v1" = 76 31; "p" = 70; "to/a" = 74 6f 2f 61.
const NS: &str = "03 07 61626879617361 02 7631 01 70";

#[test]
fn varints_match_rfc9000_examples() {
    for (v, bytes) in [
        (37u64, "25"),
        (15_293, "7bbd"),
        (494_878_333, "9d7f3e7d"),
        (151_288_809_941_952_652, "c2197c5eff14e88c"),
    ] {
        let mut out = Vec::new();
        put_varint(&mut out, v);
        assert_eq!(hex::encode(&out), bytes);
        assert_eq!(Reader::new(&h(bytes)).varint().unwrap(), v);
    }
    // A non-minimal encoding still reads (RFC 9000 allows it).
    assert_eq!(Reader::new(&h("4025")).varint().unwrap(), 37);
    assert_eq!(Reader::new(&h("c2")).varint(), Err(MoqtError::Truncated));
}

#[test]
fn golden_setup_messages() {
    control_golden(
        Control::ServerSetup {
            version: DRAFT_14,
            params: vec![KeyValue::Int {
                key: 0x02,
                value: 100,
            }],
        },
        "21 000c c0000000ff00000e 01 02 4064",
    );
    control_golden(
        Control::ClientSetup {
            versions: vec![DRAFT_14, 0xff00_000d],
            params: vec![
                KeyValue::Bytes {
                    key: 0x01,
                    value: b"/x".to_vec(),
                },
                KeyValue::Int {
                    key: 0x02,
                    value: 8,
                },
            ],
        },
        "20 0018 02 c0000000ff00000e c0000000ff00000d 02 01 02 2f78 02 08",
    );
}

#[test]
fn golden_subscribe_family() {
    control_golden(
        Control::Subscribe {
            request_id: 0,
            namespace: ns(),
            name: b"to/a".to_vec(),
            priority: 0x80,
            group_order: 1,
            forward: 1,
            filter: Filter::LargestObject,
            params: vec![],
        },
        &format!("03 0019 00 {NS} 04 746f2f61 80 01 01 02 00"),
    );
    control_golden(
        Control::Subscribe {
            request_id: 2,
            namespace: ns(),
            name: b"to/a".to_vec(),
            priority: 0,
            group_order: 0,
            forward: 1,
            filter: Filter::AbsoluteRange(
                Location {
                    group: 5,
                    object: 0,
                },
                9,
            ),
            params: vec![],
        },
        &format!("03 001c 02 {NS} 04 746f2f61 00 00 01 04 05 00 09 00"),
    );
    control_golden(
        Control::Subscribe {
            request_id: 4,
            namespace: ns(),
            name: b"to/a".to_vec(),
            priority: 1,
            group_order: 2,
            forward: 0,
            filter: Filter::AbsoluteStart(Location {
                group: 0,
                object: 3,
            }),
            params: vec![],
        },
        &format!("03 001b 04 {NS} 04 746f2f61 01 02 00 03 00 03 00"),
    );
    control_golden(
        Control::Subscribe {
            request_id: 6,
            namespace: ns(),
            name: b"to/a".to_vec(),
            priority: 1,
            group_order: 1,
            forward: 1,
            filter: Filter::NextGroupStart,
            params: vec![],
        },
        &format!("03 0019 06 {NS} 04 746f2f61 01 01 01 01 00"),
    );
    control_golden(
        Control::SubscribeOk {
            request_id: 0,
            track_alias: 1,
            expires: 0,
            group_order: 1,
            largest: Some(Location {
                group: 7,
                object: 0,
            }),
            params: vec![],
        },
        "04 0008 00 01 00 01 01 07 00 00",
    );
    control_golden(
        Control::SubscribeOk {
            request_id: 0,
            track_alias: 1,
            expires: 1000,
            group_order: 2,
            largest: None,
            params: vec![],
        },
        "04 0007 00 01 43e8 02 00 00",
    );
    control_golden(
        Control::SubscribeError {
            request_id: 0,
            code: 1,
            reason: "no".into(),
        },
        "05 0005 00 01 02 6e6f",
    );
    control_golden(Control::Unsubscribe { request_id: 0 }, "0a 0001 00");
    control_golden(
        Control::PublishDone {
            request_id: 0,
            status: 2,
            stream_count: 3,
            reason: String::new(),
        },
        "0b 0004 00 02 03 00",
    );
}

#[test]
fn golden_namespace_family_and_session_messages() {
    control_golden(
        Control::PublishNamespace {
            request_id: 1,
            namespace: ns(),
            params: vec![],
        },
        &format!("06 0010 01 {NS} 00"),
    );
    control_golden(Control::PublishNamespaceOk { request_id: 1 }, "07 0001 01");
    control_golden(
        Control::PublishNamespaceError {
            request_id: 1,
            code: 1,
            reason: String::new(),
        },
        "08 0003 01 01 00",
    );
    control_golden(
        Control::PublishNamespaceDone { namespace: ns() },
        &format!("09 000e {NS}"),
    );
    control_golden(
        Control::SubscribeNamespace {
            request_id: 2,
            prefix: Namespace::from_strs(&["abhyasa", "v1"]),
            params: vec![],
        },
        "11 000e 02 02 07 61626879617361 02 7631 00",
    );
    control_golden(
        Control::SubscribeNamespaceOk { request_id: 2 },
        "12 0001 02",
    );
    control_golden(
        Control::SubscribeNamespaceError {
            request_id: 2,
            code: 4,
            reason: "x".into(),
        },
        "13 0004 02 04 01 78",
    );
    control_golden(
        Control::UnsubscribeNamespace {
            prefix: Namespace::from_strs(&["abhyasa"]),
        },
        "14 0009 01 07 61626879617361",
    );
    control_golden(Control::Goaway { uri: vec![] }, "10 0001 00");
    control_golden(Control::MaxRequestId { request_id: 10 }, "15 0001 0a");
    control_golden(Control::RequestsBlocked { max: 10 }, "1a 0001 0a");
}

#[test]
fn defined_but_unsupported_messages_are_kept_for_refusal() {
    // FETCH_CANCEL (0x17) with a request id.
    let (msg, _) = Control::decode(&h("17 0001 04")).unwrap().unwrap();
    assert_eq!(
        msg,
        Control::Unsupported {
            kind: 0x17,
            payload: vec![4]
        }
    );
}

#[test]
fn malformed_control_messages_are_typed_errors() {
    let err = |s: &str| Control::decode(&h(s)).unwrap_err();
    assert_eq!(err("3f 0000"), MoqtError::UnknownMessage(0x3f));
    // Length longer than the fields: PROTOCOL_VIOLATION.
    assert!(matches!(
        err("0a 0002 00 00"),
        MoqtError::ProtocolViolation(_)
    ));
    // Length shorter than the fields.
    assert!(matches!(err("15 0000"), MoqtError::ProtocolViolation(_)));
    // Namespace of zero fields, or 33.
    assert!(matches!(
        err("06 0002 01 00"),
        MoqtError::ProtocolViolation(_)
    ));
    let mut many = String::from("06 0045 01 21");
    many.push_str(&" 01 61".repeat(33));
    many.push_str(" 00");
    assert!(matches!(err(&many), MoqtError::ProtocolViolation(_)));
    // Unknown filter type; forward of 2; group order of 3.
    assert!(matches!(
        err(&format!("03 0019 00 {NS} 04 746f2f61 80 01 01 07 00")),
        MoqtError::ProtocolViolation(_)
    ));
    assert!(matches!(
        err(&format!("03 0019 00 {NS} 04 746f2f61 80 01 02 02 00")),
        MoqtError::ProtocolViolation(_)
    ));
    assert!(matches!(
        err(&format!("03 0019 00 {NS} 04 746f2f61 80 03 01 02 00")),
        MoqtError::ProtocolViolation(_)
    ));
    // A reason phrase over 1024 bytes.
    let long = format!("05 0405 00 01 4401 {}", "61".repeat(1025));
    assert!(matches!(err(&long), MoqtError::ProtocolViolation(_)));
    assert_eq!(MoqtError::UnknownMessage(0x50).to_code(), 0x3);
    assert_eq!(MoqtError::KeyValueFormatting("x").to_code(), 0x6);
    assert_eq!(MoqtError::VersionNegotiationFailed.to_code(), 0x15);
}

#[test]
fn golden_subgroup_headers_every_type() {
    let base = |subgroup, extensions, end_of_group| SubgroupHeader {
        track_alias: 1,
        group: 7,
        subgroup,
        priority: 0x80,
        extensions,
        end_of_group,
    };
    let cases = [
        (base(SubgroupId::Zero, false, false), "10 01 07 80"),
        (base(SubgroupId::Zero, true, false), "11 01 07 80"),
        (base(SubgroupId::FirstObject, false, false), "12 01 07 80"),
        (base(SubgroupId::FirstObject, true, false), "13 01 07 80"),
        (
            base(SubgroupId::Explicit(3), false, false),
            "14 01 07 03 80",
        ),
        (base(SubgroupId::Explicit(3), true, false), "15 01 07 03 80"),
        (base(SubgroupId::Zero, false, true), "18 01 07 80"),
        (base(SubgroupId::Zero, true, true), "19 01 07 80"),
        (base(SubgroupId::FirstObject, false, true), "1a 01 07 80"),
        (base(SubgroupId::FirstObject, true, true), "1b 01 07 80"),
        (base(SubgroupId::Explicit(3), false, true), "1c 01 07 03 80"),
        (base(SubgroupId::Explicit(3), true, true), "1d 01 07 03 80"),
    ];
    for (header, bytes) in cases {
        let want = h(bytes);
        let mut got = Vec::new();
        header.encode(&mut got);
        assert_eq!(hex::encode(&got), hex::encode(&want));
        assert_eq!(
            SubgroupHeader::decode(&want).unwrap(),
            Some((header, want.len()))
        );
        assert_eq!(
            SubgroupHeader::decode(&want[..want.len() - 1]).unwrap(),
            None
        );
    }
    for t in ["16", "17", "1e", "1f", "0f", "05"] {
        assert!(matches!(
            SubgroupHeader::decode(&h(&format!("{t} 01 07 80"))),
            Err(MoqtError::UnknownStreamType(_))
        ));
    }
}

#[test]
fn golden_stream_objects() {
    // Payload "hi", no extensions.
    let o = StreamObject {
        object_id_delta: 0,
        extensions: vec![],
        body: ObjectBody::Payload(b"hi".to_vec()),
    };
    let mut got = Vec::new();
    o.encode(false, &mut got);
    assert_eq!(hex::encode(&got), "00026869");
    assert_eq!(StreamObject::decode(&got, false).unwrap(), Some((o, 4)));
    // The subgroup target reads a whole stream: a header, then objects.
    crate::tests::fuzz_seed("moqt_subgroup", &[h("10 01 07 80"), got.clone()].concat());
    // With one even extension (type 2 = 5) and one odd (type 3 = "z"): block is 02 05 03 01 7a.
    let o = StreamObject {
        object_id_delta: 1,
        extensions: vec![
            KeyValue::Int { key: 2, value: 5 },
            KeyValue::Bytes {
                key: 3,
                value: b"z".to_vec(),
            },
        ],
        body: ObjectBody::Payload(b"hi".to_vec()),
    };
    let want = h("01 05 0205 03017a 02 6869");
    let mut got = Vec::new();
    o.encode(true, &mut got);
    assert_eq!(hex::encode(&got), hex::encode(&want));
    assert_eq!(
        StreamObject::decode(&want, true).unwrap(),
        Some((o, want.len()))
    );
    crate::tests::fuzz_seed("moqt_subgroup", &[h("11 01 07 80"), want.clone()].concat());
    // End of group as a status; unknown extensions on a stream with extensions but none here.
    let o = StreamObject {
        object_id_delta: 0,
        extensions: vec![],
        body: ObjectBody::Status(ObjectStatus::EndOfGroup),
    };
    let want = h("00 00 00 03");
    let mut got = Vec::new();
    o.encode(true, &mut got);
    assert_eq!(hex::encode(&got), hex::encode(&want));
    assert_eq!(StreamObject::decode(&want, true).unwrap(), Some((o, 4)));
    // Partial objects wait for more bytes.
    assert_eq!(StreamObject::decode(&h("00 05 6869"), false).unwrap(), None);
    // A status the draft does not define.
    assert!(StreamObject::decode(&h("00 00 02"), false).is_err());
    // Extensions on a non-existent object.
    assert!(StreamObject::decode(&h("00 02 0205 00 01"), true).is_err());
}

#[test]
fn golden_datagrams_every_type() {
    let ext = Some(vec![KeyValue::Int { key: 2, value: 5 }]);
    let d = |object_id, extensions: Option<Vec<KeyValue>>, end_of_group, body| ObjectDatagram {
        track_alias: 2,
        group: 9,
        object_id,
        priority: 0x40,
        extensions,
        end_of_group,
        body,
    };
    let p = || ObjectBody::Payload(b"ok".to_vec());
    let cases = [
        (d(Some(1), None, false, p()), "00 02 09 01 40 6f6b"),
        (
            d(Some(1), ext.clone(), false, p()),
            "01 02 09 01 40 02 0205 6f6b",
        ),
        (d(Some(1), None, true, p()), "02 02 09 01 40 6f6b"),
        (
            d(Some(1), ext.clone(), true, p()),
            "03 02 09 01 40 02 0205 6f6b",
        ),
        (d(None, None, false, p()), "04 02 09 40 6f6b"),
        (d(None, ext.clone(), false, p()), "05 02 09 40 02 0205 6f6b"),
        (d(None, None, true, p()), "06 02 09 40 6f6b"),
        (d(None, ext.clone(), true, p()), "07 02 09 40 02 0205 6f6b"),
        (
            d(
                Some(1),
                None,
                false,
                ObjectBody::Status(ObjectStatus::EndOfTrack),
            ),
            "20 02 09 01 40 04",
        ),
        (
            d(
                Some(1),
                ext.clone(),
                false,
                ObjectBody::Status(ObjectStatus::EndOfGroup),
            ),
            "21 02 09 01 40 02 0205 03",
        ),
    ];
    for (dg, bytes) in cases {
        let want = h(bytes);
        assert_eq!(hex::encode(dg.encode()), hex::encode(&want));
        assert_eq!(ObjectDatagram::decode(&want).unwrap(), dg);
        crate::tests::fuzz_seed("moqt_datagram", &want);
    }
    assert!(matches!(
        ObjectDatagram::decode(&h("08 02 09 40")),
        Err(MoqtError::UnknownDatagramType(8))
    ));
    // Extensions present with a zero-length block.
    assert!(matches!(
        ObjectDatagram::decode(&h("01 02 09 01 40 00 6f6b")),
        Err(MoqtError::ProtocolViolation(_))
    ));
    // Truncated header.
    assert!(matches!(
        ObjectDatagram::decode(&h("00 02 09")),
        Err(MoqtError::ProtocolViolation(_))
    ));
    // A key-value overrunning its block.
    assert!(matches!(
        ObjectDatagram::decode(&h("01 02 09 01 40 02 03 6f6b")),
        Err(MoqtError::KeyValueFormatting(_))
    ));
}

fn arb_ns() -> impl Strategy<Value = Namespace> {
    proptest::collection::vec(proptest::collection::vec(any::<u8>(), 0..12), 1..6)
        .prop_map(Namespace)
}

fn arb_params() -> impl Strategy<Value = Vec<KeyValue>> {
    proptest::collection::vec(
        prop_oneof![
            (0u64..1000, any::<u32>()).prop_map(|(k, v)| KeyValue::Int {
                key: k * 2,
                value: u64::from(v)
            }),
            (0u64..1000, proptest::collection::vec(any::<u8>(), 0..20)).prop_map(|(k, v)| {
                KeyValue::Bytes {
                    key: k * 2 + 1,
                    value: v,
                }
            }),
        ],
        0..4,
    )
}

fn arb_control() -> impl Strategy<Value = Control> {
    prop_oneof![
        (
            proptest::collection::vec(0u64..VARINT_MAX, 0..4),
            arb_params()
        )
            .prop_map(|(versions, params)| Control::ClientSetup { versions, params }),
        (
            any::<u32>(),
            arb_ns(),
            proptest::collection::vec(any::<u8>(), 0..20),
            any::<u8>(),
            0u8..3,
            0u8..2,
            arb_params()
        )
            .prop_map(
                |(id, namespace, name, priority, group_order, forward, params)| {
                    Control::Subscribe {
                        request_id: u64::from(id),
                        namespace,
                        name,
                        priority,
                        group_order,
                        forward,
                        filter: Filter::AbsoluteStart(Location {
                            group: 1,
                            object: 2,
                        }),
                        params,
                    }
                }
            ),
        (any::<u32>(), any::<u32>(), "\\PC{0,40}").prop_map(|(id, code, reason)| {
            Control::PublishNamespaceError {
                request_id: u64::from(id),
                code: u64::from(code),
                reason,
            }
        }),
        (any::<u32>(), arb_ns(), arb_params()).prop_map(|(id, prefix, params)| {
            Control::SubscribeNamespace {
                request_id: u64::from(id),
                prefix,
                params,
            }
        }),
    ]
}

proptest! {
    #[test]
    fn control_round_trips(msg in arb_control()) {
        let mut bytes = Vec::new();
        msg.encode(&mut bytes);
        prop_assert_eq!(Control::decode(&bytes).unwrap(), Some((msg, bytes.len())));
    }

    #[test]
    fn arbitrary_bytes_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..256)) {
        let _ = Control::decode(&bytes);
        let _ = SubgroupHeader::decode(&bytes);
        let _ = StreamObject::decode(&bytes, true);
        let _ = StreamObject::decode(&bytes, false);
        let _ = ObjectDatagram::decode(&bytes);
    }
}

/// The object payload limit, at it and one past it: the length field alone decides.
#[test]
fn an_object_payload_at_the_limit_reads_and_one_past_it_is_too_large() {
    let at = StreamObject {
        object_id_delta: 0,
        extensions: vec![],
        body: ObjectBody::Payload(vec![7; MAX_OBJECT_PAYLOAD]),
    };
    let mut bytes = Vec::new();
    at.encode(false, &mut bytes);
    let used = bytes.len();
    assert_eq!(
        StreamObject::decode(&bytes, false).unwrap(),
        Some((at, used))
    );
    // One byte more: the declared length is refused before any payload is read.
    let mut past = Vec::new();
    put_varint(&mut past, 0);
    put_varint(&mut past, MAX_OBJECT_PAYLOAD as u64 + 1);
    assert_eq!(StreamObject::decode(&past, false), Err(MoqtError::TooLarge));
}
