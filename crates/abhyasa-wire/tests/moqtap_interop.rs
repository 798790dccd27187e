//! Interoperability with an independent draft-14 implementation (moqtap-codec): what we write,
//! it reads as the same message; what it writes, we read as the same message.

use abhyasa_wire::moqt::{
    Control, Filter, KeyValue, Location, Namespace, ObjectBody, ObjectDatagram, StreamObject,
    SubgroupHeader, SubgroupId, DRAFT_14,
};
use moqtap_codec::draft14::data_stream as theirs_data;
use moqtap_codec::draft14::message::ControlMessage;

fn ours(msg: &Control) -> Vec<u8> {
    let mut out = Vec::new();
    msg.encode(&mut out);
    out
}

fn theirs_read(bytes: &[u8]) -> ControlMessage {
    let mut buf = bytes;
    let m = ControlMessage::decode(&mut buf)
        .unwrap_or_else(|e| panic!("moqtap refused {}: {e:?}", hex(bytes)));
    assert!(buf.is_empty(), "moqtap left bytes");
    m
}

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

fn ns() -> Namespace {
    Namespace::from_strs(&["abhyasa", "v1", "principal"])
}

#[test]
fn moqtap_reads_our_control_messages() {
    let setup = Control::ClientSetup {
        versions: vec![DRAFT_14],
        params: vec![KeyValue::Int {
            key: 2,
            value: 1 << 20,
        }],
    };
    match theirs_read(&ours(&setup)) {
        ControlMessage::ClientSetup(m) => {
            let versions: Vec<u64> = m
                .supported_versions
                .iter()
                .map(|v| v.into_inner())
                .collect();
            assert_eq!(versions, [DRAFT_14]);
            assert_eq!(m.parameters.len(), 1);
        }
        other => panic!("{other:?}"),
    }
    let sub = Control::Subscribe {
        request_id: 2,
        namespace: ns(),
        name: b"to/agent-1".to_vec(),
        priority: 3,
        group_order: 1,
        forward: 1,
        filter: Filter::AbsoluteRange(
            Location {
                group: 4,
                object: 1,
            },
            9,
        ),
        params: vec![],
    };
    match theirs_read(&ours(&sub)) {
        ControlMessage::Subscribe(m) => {
            assert_eq!(m.request_id.into_inner(), 2);
            assert_eq!(m.track_namespace.0, ns().0);
            assert_eq!(m.track_name, b"to/agent-1");
            assert_eq!(m.subscriber_priority, 3);
            let start = m.start_location.expect("absolute range has a start");
            assert_eq!(
                (start.group.into_inner(), start.object.into_inner()),
                (4, 1)
            );
            assert_eq!(m.end_group.map(|g| g.into_inner()), Some(9));
        }
        other => panic!("{other:?}"),
    }
    let ok = Control::SubscribeOk {
        request_id: 2,
        track_alias: 1,
        expires: 0,
        group_order: 1,
        largest: Some(Location {
            group: 7,
            object: 0,
        }),
        params: vec![],
    };
    match theirs_read(&ours(&ok)) {
        ControlMessage::SubscribeOk(m) => {
            assert_eq!(m.track_alias.into_inner(), 1);
            assert_eq!(m.largest_location.map(|l| l.group.into_inner()), Some(7));
        }
        other => panic!("{other:?}"),
    }
    for msg in [
        Control::ServerSetup {
            version: DRAFT_14,
            params: vec![],
        },
        Control::SubscribeError {
            request_id: 0,
            code: 1,
            reason: "not yours".into(),
        },
        Control::Unsubscribe { request_id: 4 },
        Control::PublishDone {
            request_id: 4,
            status: 3,
            stream_count: 2,
            reason: String::new(),
        },
        Control::PublishNamespace {
            request_id: 1,
            namespace: ns(),
            params: vec![],
        },
        Control::PublishNamespaceOk { request_id: 1 },
        Control::PublishNamespaceError {
            request_id: 1,
            code: 1,
            reason: "no".into(),
        },
        Control::SubscribeNamespace {
            request_id: 3,
            prefix: Namespace::from_strs(&["abhyasa"]),
            params: vec![],
        },
        Control::SubscribeNamespaceOk { request_id: 3 },
        Control::Goaway { uri: vec![] },
        Control::MaxRequestId { request_id: 100 },
        Control::RequestsBlocked { max: 100 },
    ] {
        let theirs = theirs_read(&ours(&msg));
        assert_eq!(
            theirs.message_type().id(),
            msg.kind(),
            "{msg:?} read as {theirs:?}"
        );
        // And back: their encoding of what they read is what we wrote, and we read it.
        let mut again = Vec::new();
        theirs.encode(&mut again).unwrap();
        assert_eq!(hex(&again), hex(&ours(&msg)), "{msg:?}");
        assert_eq!(Control::decode(&again).unwrap(), Some((msg, again.len())));
    }
}

#[test]
fn moqtap_reads_our_subgroup_streams_and_datagrams() {
    for (subgroup, extensions, end_of_group) in [
        (SubgroupId::Zero, false, true),
        (SubgroupId::Zero, true, false),
        (SubgroupId::FirstObject, false, false),
        (SubgroupId::Explicit(5), true, true),
    ] {
        let header = SubgroupHeader {
            track_alias: 1,
            group: 9,
            subgroup,
            priority: 0,
            extensions,
            end_of_group,
        };
        let mut bytes = Vec::new();
        header.encode(&mut bytes);
        for (i, p) in [b"first".to_vec(), b"second".to_vec()]
            .into_iter()
            .enumerate()
        {
            let ext = if extensions && i == 0 {
                vec![KeyValue::Int { key: 2, value: 7 }]
            } else {
                vec![]
            };
            StreamObject {
                object_id_delta: 0,
                extensions: ext,
                body: ObjectBody::Payload(p),
            }
            .encode(extensions, &mut bytes);
        }
        let mut buf = &bytes[..];
        let h = theirs_data::SubgroupHeader::decode(&mut buf).unwrap();
        assert_eq!(
            (h.track_alias.into_inner(), h.group_id.into_inner()),
            (1, 9)
        );
        let mut reader = theirs_data::SubgroupObjectReader::new(&h);
        let a = reader.read_object(&mut buf).unwrap();
        let b = reader.read_object(&mut buf).unwrap();
        assert!(buf.is_empty());
        assert_eq!(
            (a.object_id.into_inner(), a.payload.as_slice()),
            (0, &b"first"[..])
        );
        assert_eq!(
            (b.object_id.into_inner(), b.payload.as_slice()),
            (1, &b"second"[..])
        );
    }
    for d in [
        ObjectDatagram {
            track_alias: 1,
            group: 3,
            object_id: None,
            priority: 0,
            extensions: None,
            end_of_group: false,
            body: ObjectBody::Payload(b"best effort".to_vec()),
        },
        ObjectDatagram {
            track_alias: 1,
            group: 3,
            object_id: Some(2),
            priority: 0,
            extensions: Some(vec![KeyValue::Bytes {
                key: 3,
                value: b"x".to_vec(),
            }]),
            end_of_group: true,
            body: ObjectBody::Payload(b"with ext".to_vec()),
        },
    ] {
        let bytes = d.encode();
        let t = theirs_data::DatagramObject::decode(&mut &bytes[..]).unwrap();
        assert_eq!(t.group_id.into_inner(), 3);
        assert_eq!(t.object_id.into_inner(), d.object());
        let ObjectBody::Payload(p) = &d.body else {
            unreachable!("payload datagrams only")
        };
        assert_eq!(&t.payload, p);
        // And back.
        let mut again = Vec::new();
        t.encode(&mut again);
        assert_eq!(ObjectDatagram::decode(&again).unwrap(), d);
    }
}
