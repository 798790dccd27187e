//! A generic draft-14 client that is not ours (moqtap-client) sets up a session with an
//! Abhyasa agent, subscribes to the track addressed to it, and reads the obligations we
//! publish; a subscription to another agent's track is refused. The QUIC connection carries
//! the client's certificate (mutual TLS is not optional here); everything above QUIC is
//! moqtap's.

use std::net::SocketAddr;
use std::time::Duration;

use abhyasa_moq::{endpoint, namespace, Ca, Session, SessionEvent, Track, TransportSettings};
use abhyasa_wire::AgentId;
use moqtap_client::draft14::connection::{ClientConfig, Connection, TransportType};
use moqtap_client::transport::quic::QuicTransport;
use moqtap_client::transport::Transport;
use moqtap_codec::draft14::message::ControlMessage;
use moqtap_codec::types::{FilterType, GroupOrder, TrackNamespace};
use moqtap_codec::version::DraftVersion;

fn id(s: &str) -> AgentId {
    AgentId::new(s).unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_generic_draft14_client_subscribes_and_reads_our_objects() {
    let ca = Ca::generate("t").unwrap();
    let (a, b) = (id("agent-a"), id("agent-b"));
    let loopback: SocketAddr = "127.0.0.1:0".parse().unwrap();
    let ea = endpoint(
        &ca.issue(&a).unwrap(),
        loopback,
        &TransportSettings::default(),
    )
    .unwrap();
    let addr = ea.local_addr().unwrap();
    let server = tokio::spawn({
        let (ea, a) = (ea.clone(), a.clone());
        async move {
            Session::accept(ea.accept().await.unwrap(), &a)
                .await
                .unwrap()
        }
    });

    // QUIC with B's certificate; the MOQT session on top is moqtap's.
    let eb = endpoint(
        &ca.issue(&b).unwrap(),
        loopback,
        &TransportSettings::default(),
    )
    .unwrap();
    let conn = eb.connect(addr, a.as_str()).unwrap().await.unwrap();
    let config = ClientConfig {
        draft: DraftVersion::Draft14,
        additional_versions: vec![],
        transport: TransportType::Quic,
        skip_cert_verification: false,
        ca_certs: vec![],
        setup_parameters: vec![],
    };
    let mut client = Connection::adopt(Transport::Quic(QuicTransport::new(conn)), config)
        .await
        .expect("moqtap completes CLIENT_SETUP / SERVER_SETUP with us");
    let (session, mut events) = server.await.unwrap();
    assert_eq!(session.peer(), &b);

    let ns = TrackNamespace(namespace(&a).0);
    let refused = client
        .subscribe(
            ns.clone(),
            b"to/agent-c".to_vec(),
            0,
            GroupOrder::Ascending,
            FilterType::LargestObject,
            vec![],
        )
        .await
        .unwrap();
    let granted = client
        .subscribe(
            ns,
            b"to/agent-b".to_vec(),
            0,
            GroupOrder::Ascending,
            FilterType::LargestObject,
            vec![],
        )
        .await
        .unwrap();
    let (mut got_error, mut got_ok) = (false, false);
    while !(got_error && got_ok) {
        let msg = tokio::time::timeout(Duration::from_secs(5), client.recv_and_dispatch())
            .await
            .expect("an answer in time")
            .expect("a well-formed control message");
        match msg {
            ControlMessage::SubscribeError(e) if e.request_id == refused => {
                assert_eq!(e.error_code.into_inner(), 0x1, "UNAUTHORIZED");
                got_error = true;
            }
            ControlMessage::SubscribeOk(ok) if ok.request_id == granted => got_ok = true,
            _ => {} // our PUBLISH_NAMESPACE and SUBSCRIBEs to the client
        }
    }
    // Our side sees the subscription and publishes a group of two obligations on it.
    tokio::time::timeout(Duration::from_secs(5), async {
        while events.recv().await != Some(SessionEvent::PeerSubscribed(Track::Obligations)) {}
    })
    .await
    .unwrap();
    session
        .send_group(
            Track::Obligations,
            &[b"obligation-1".to_vec(), b"obligation-2".to_vec()],
            false,
        )
        .await
        .unwrap();
    let (_header, mut stream) =
        tokio::time::timeout(Duration::from_secs(5), client.accept_subgroup_stream())
            .await
            .unwrap()
            .expect("moqtap reads our SUBGROUP_HEADER");
    for want in [&b"obligation-1"[..], &b"obligation-2"[..]] {
        let object = stream
            .read_subgroup_object()
            .await
            .expect("moqtap reads our object");
        assert_eq!(object.payload, want);
    }
}
