//! The QUIC endpoint: mutual TLS 1.3 with the deployment CA (rustls, ring provider), ALPN
//! `moq-00`, and transport settings chosen for lossy low-latency agent links.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use abhyasa_wire::moqt::ALPN;
use abhyasa_wire::AgentId;
use quinn::crypto::rustls::{QuicClientConfig, QuicServerConfig};
use rustls::pki_types::CertificateDer;

use crate::identity::{agent_of, Identity};

/// Which congestion controller QUIC runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum Congestion {
    /// CUBIC (RFC 9438): the default; recovers well from isolated losses.
    #[default]
    Cubic,
    /// NewReno (RFC 9002): the conservative baseline.
    NewReno,
    /// BBR (quinn's experimental implementation): rate-based, loss-tolerant.
    Bbr,
}

/// Transport settings. The defaults are for low-latency links that lose packets: a short
/// initial RTT so the first loss is detected fast, keep-alives so a quiet link is noticed, and
/// an idle timeout long enough to ride out short partitions without tearing the session down.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TransportSettings {
    /// Keep-alive interval.
    pub keep_alive: Duration,
    /// Idle timeout: the session is declared dead after this long without a packet.
    pub idle_timeout: Duration,
    /// Initial RTT estimate before the first sample.
    pub initial_rtt: Duration,
    /// Congestion controller.
    pub congestion: Congestion,
    /// Datagram receive buffer, bytes.
    pub datagram_buffer: usize,
    /// A node re-dials a peer it dials when the connection has sent but heard nothing for
    /// this long (or three smoothed RTTs, if longer). After a partition a surviving QUIC
    /// connection sends nothing new until its exponentially backed-off probe timer fires; a
    /// fresh connection does not wait. `None` keeps a connection until it idles out.
    pub stall_redial: Option<Duration>,
}

impl Default for TransportSettings {
    fn default() -> Self {
        Self {
            keep_alive: Duration::from_millis(500),
            idle_timeout: Duration::from_secs(5),
            initial_rtt: Duration::from_millis(10),
            congestion: Congestion::Cubic,
            datagram_buffer: 1 << 20,
            stall_redial: Some(Duration::from_millis(250)),
        }
    }
}

/// Why an endpoint could not be built.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum EndpointError {
    /// TLS configuration was refused.
    #[error("TLS: {0}")]
    Tls(#[from] rustls::Error),
    /// The client-certificate verifier could not be built.
    #[error("client verifier: {0}")]
    Verifier(#[from] rustls::server::VerifierBuilderError),
    /// The TLS configuration does not suit QUIC.
    #[error("QUIC crypto: {0}")]
    Crypto(String),
    /// A transport setting is out of range.
    #[error("transport setting: {0}")]
    Setting(String),
    /// The socket could not be bound.
    #[error("bind: {0}")]
    Bind(#[from] std::io::Error),
}

/// Unidirectional streams a peer may have open at once on one connection (QUIC's own limit;
/// one per group in flight).
pub const MAX_OPEN_STREAMS: u32 = 100;

/// Bytes a peer may have in flight to us on one connection, across its streams, before we read
/// them (QUIC connection flow control). Beside the session's own bound on what it has read
/// of unended streams, this caps what one connection can make a node buffer.
pub const CONNECTION_RECEIVE_WINDOW: u32 = 8 << 20;

/// Bytes a peer may have in flight on one stream before we read them.
pub const STREAM_RECEIVE_WINDOW: u32 = 1 << 20;

fn transport(settings: &TransportSettings) -> Result<Arc<quinn::TransportConfig>, EndpointError> {
    let mut t = quinn::TransportConfig::default();
    t.max_concurrent_uni_streams(MAX_OPEN_STREAMS.into());
    t.receive_window(CONNECTION_RECEIVE_WINDOW.into());
    t.stream_receive_window(STREAM_RECEIVE_WINDOW.into());
    t.keep_alive_interval(Some(settings.keep_alive));
    t.max_idle_timeout(Some(
        quinn::IdleTimeout::try_from(settings.idle_timeout)
            .map_err(|e| EndpointError::Setting(e.to_string()))?,
    ));
    t.initial_rtt(settings.initial_rtt);
    t.datagram_receive_buffer_size(Some(settings.datagram_buffer));
    match settings.congestion {
        Congestion::Cubic => {
            t.congestion_controller_factory(Arc::new(quinn::congestion::CubicConfig::default()))
        }
        Congestion::NewReno => {
            t.congestion_controller_factory(Arc::new(quinn::congestion::NewRenoConfig::default()))
        }
        Congestion::Bbr => {
            t.congestion_controller_factory(Arc::new(quinn::congestion::BbrConfig::default()))
        }
    };
    Ok(Arc::new(t))
}

/// Builds an endpoint bound to `bind` that serves and dials with `identity`, trusting only
/// certificates from its deployment CA, in both directions.
pub fn endpoint(
    identity: &Identity,
    bind: SocketAddr,
    settings: &TransportSettings,
) -> Result<quinn::Endpoint, EndpointError> {
    let (server, client) = configs(identity, settings)?;
    let mut endpoint = quinn::Endpoint::server(server, bind)?;
    endpoint.set_default_client_config(client);
    Ok(endpoint)
}

fn configs(
    identity: &Identity,
    settings: &TransportSettings,
) -> Result<(quinn::ServerConfig, quinn::ClientConfig), EndpointError> {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut roots = rustls::RootCertStore::empty();
    roots.add(identity.ca.clone())?;
    let roots = Arc::new(roots);
    let transport = transport(settings)?;

    let verifier = rustls::server::WebPkiClientVerifier::builder_with_provider(
        roots.clone(),
        provider.clone(),
    )
    .build()?;
    let mut server = rustls::ServerConfig::builder_with_provider(provider.clone())
        .with_protocol_versions(&[&rustls::version::TLS13])?
        .with_client_cert_verifier(verifier)
        .with_single_cert(identity.chain.clone(), identity.private_key())?;
    server.alpn_protocols = vec![ALPN.to_vec()];
    let server =
        QuicServerConfig::try_from(server).map_err(|e| EndpointError::Crypto(e.to_string()))?;
    let mut server = quinn::ServerConfig::with_crypto(Arc::new(server));
    server.transport_config(transport.clone());

    let mut client = rustls::ClientConfig::builder_with_provider(provider)
        .with_protocol_versions(&[&rustls::version::TLS13])?
        .with_root_certificates(roots)
        .with_client_auth_cert(identity.chain.clone(), identity.private_key())?;
    client.alpn_protocols = vec![ALPN.to_vec()];
    let client =
        QuicClientConfig::try_from(client).map_err(|e| EndpointError::Crypto(e.to_string()))?;
    let mut client = quinn::ClientConfig::new(Arc::new(client));
    client.transport_config(transport);
    Ok((server, client))
}

/// How a node trusts an MOQT relay's certificate. Whichever it is, the node presents its own
/// deployment certificate as the client, and what crosses the relay is believed only from its
/// end-to-end signature (`signed`): the relay's identity decides where the node connects,
/// never who sent an object.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub enum RelayTrust {
    /// Issued by the deployment CA and naming the relay as its agent id (the default).
    #[default]
    Deployment,
    /// Issued by this CA (the relay operator's) and valid for the relay's name as a DNS name.
    Ca(CertificateDer<'static>),
    /// Exactly the certificate whose DER has this SHA-256 (a relay with a self-signed or
    /// privately issued certificate); its name and issuer are not looked at.
    Fingerprint([u8; 32]),
}

/// The client configuration that dials a relay trusted as `trust`, presenting `identity`;
/// `None` for [`RelayTrust::Deployment`] (the endpoint's own client configuration, with the
/// relay's agent id checked after the handshake).
pub fn relay_client_config(
    identity: &Identity,
    settings: &TransportSettings,
    trust: &RelayTrust,
) -> Result<Option<quinn::ClientConfig>, EndpointError> {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let builder = rustls::ClientConfig::builder_with_provider(provider.clone())
        .with_protocol_versions(&[&rustls::version::TLS13])?;
    let builder =
        match trust {
            RelayTrust::Deployment => return Ok(None),
            RelayTrust::Ca(ca) => {
                let mut roots = rustls::RootCertStore::empty();
                roots.add(ca.clone())?;
                builder.with_root_certificates(roots)
            }
            RelayTrust::Fingerprint(sha256) => builder
                .dangerous()
                .with_custom_certificate_verifier(Arc::new(Pinned {
                    sha256: *sha256,
                    provider,
                })),
        };
    let mut client =
        builder.with_client_auth_cert(identity.chain.clone(), identity.private_key())?;
    client.alpn_protocols = vec![ALPN.to_vec()];
    let client =
        QuicClientConfig::try_from(client).map_err(|e| EndpointError::Crypto(e.to_string()))?;
    let mut client = quinn::ClientConfig::new(Arc::new(client));
    client.transport_config(transport(settings)?);
    Ok(Some(client))
}

/// Trusts one certificate, by the SHA-256 of its DER; the handshake signature is still
/// verified against that certificate's key.
#[derive(Debug)]
struct Pinned {
    sha256: [u8; 32],
    provider: Arc<rustls::crypto::CryptoProvider>,
}

impl rustls::client::danger::ServerCertVerifier for Pinned {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        _intermediates: &[CertificateDer<'_>],
        _server_name: &rustls::pki_types::ServerName<'_>,
        _ocsp_response: &[u8],
        _now: rustls::pki_types::UnixTime,
    ) -> Result<rustls::client::danger::ServerCertVerified, rustls::Error> {
        use sha2::Digest;
        let got: [u8; 32] = sha2::Sha256::digest(end_entity.as_ref()).into();
        if got == self.sha256 {
            Ok(rustls::client::danger::ServerCertVerified::assertion())
        } else {
            Err(rustls::Error::InvalidCertificate(
                rustls::CertificateError::ApplicationVerificationFailure,
            ))
        }
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &rustls::DigitallySignedStruct,
    ) -> Result<rustls::client::danger::HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(
            message,
            cert,
            dss,
            &self.provider.signature_verification_algorithms,
        )
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &rustls::DigitallySignedStruct,
    ) -> Result<rustls::client::danger::HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(
            message,
            cert,
            dss,
            &self.provider.signature_verification_algorithms,
        )
    }

    fn supported_verify_schemes(&self) -> Vec<rustls::SignatureScheme> {
        self.provider
            .signature_verification_algorithms
            .supported_schemes()
    }
}

/// Like [`endpoint`], with every datagram it sends impaired by `spec` (netem rules, in
/// process). Returns a handle to the impairment's counters.
#[cfg(feature = "impair")]
pub fn impaired_endpoint(
    identity: &Identity,
    bind: SocketAddr,
    settings: &TransportSettings,
    spec: abhyasa_netem::Impairment,
    seed: u64,
) -> Result<(quinn::Endpoint, crate::impaired::ImpairmentHandle), EndpointError> {
    let (server, client) = configs(identity, settings)?;
    let runtime = quinn::default_runtime()
        .ok_or_else(|| EndpointError::Setting("no async runtime".into()))?;
    let socket = std::net::UdpSocket::bind(bind)?;
    let inner = runtime.wrap_udp_socket(socket)?;
    let (impaired, handle) = crate::impaired::ImpairedSocket::new(inner, spec, seed);
    let mut endpoint = quinn::Endpoint::new_with_abstract_socket(
        quinn::EndpointConfig::default(),
        Some(server),
        impaired,
        runtime,
    )?;
    endpoint.set_default_client_config(client);
    Ok((endpoint, handle))
}

/// The agent id proved by the peer's verified certificate.
pub fn peer_agent(conn: &quinn::Connection) -> Option<AgentId> {
    let identity = conn.peer_identity()?;
    let chain = identity.downcast::<Vec<CertificateDer<'static>>>().ok()?;
    agent_of(chain.first()?).ok()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::identity::Ca;

    fn id(s: &str) -> AgentId {
        AgentId::new(s).unwrap()
    }

    /// A relay whose certificate (for `relay.example`) comes from its operator's CA, not the
    /// deployment's; it asks for a client certificate of the deployment CA, and reports the
    /// agent each handshake proved.
    fn relay_server(operator: &Ca, deployment: &Ca) -> (quinn::Endpoint, CertificateDer<'static>) {
        let relay = operator.issue(&id("relay.example")).unwrap();
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let mut roots = rustls::RootCertStore::empty();
        roots.add(deployment.certificate().clone()).unwrap();
        let clients = rustls::server::WebPkiClientVerifier::builder_with_provider(
            Arc::new(roots),
            provider.clone(),
        )
        .build()
        .unwrap();
        let mut tls = rustls::ServerConfig::builder_with_provider(provider)
            .with_protocol_versions(&[&rustls::version::TLS13])
            .unwrap()
            .with_client_cert_verifier(clients)
            .with_single_cert(relay.chain.clone(), relay.private_key())
            .unwrap();
        tls.alpn_protocols = vec![ALPN.to_vec()];
        let server =
            quinn::ServerConfig::with_crypto(Arc::new(QuicServerConfig::try_from(tls).unwrap()));
        let ep = quinn::Endpoint::server(server, "127.0.0.1:0".parse().unwrap()).unwrap();
        (ep, relay.chain[0].clone())
    }

    #[tokio::test]
    async fn a_relay_is_trusted_by_its_operators_ca_or_its_fingerprint_and_nothing_else() {
        use sha2::Digest;
        let (operator, deployment) = (
            Ca::generate("operator").unwrap(),
            Ca::generate("d").unwrap(),
        );
        let (server, relay_cert) = relay_server(&operator, &deployment);
        let addr = server.local_addr().unwrap();
        // The relay accepts every handshake and records whom it authenticated.
        let (seen_tx, mut seen) = tokio::sync::mpsc::unbounded_channel();
        tokio::spawn(async move {
            while let Some(incoming) = server.accept().await {
                let tx = seen_tx.clone();
                tokio::spawn(async move {
                    if let Ok(conn) = incoming.await {
                        let _ = tx.send(peer_agent(&conn));
                        conn.closed().await;
                    }
                });
            }
        });
        let me = deployment.issue(&id("principal")).unwrap();
        let settings = TransportSettings::default();
        let client = endpoint(&me, "127.0.0.1:0".parse().unwrap(), &settings).unwrap();
        let dial = |trust: RelayTrust, name: &'static str| {
            let client = client.clone();
            let config = relay_client_config(&me, &settings, &trust).unwrap();
            async move {
                let connecting = match config {
                    Some(c) => client.connect_with(c, addr, name).unwrap(),
                    None => client.connect(addr, name).unwrap(),
                };
                connecting.await.map(|c| c.close(0u32.into(), b"done"))
            }
        };
        let pin: [u8; 32] = sha2::Sha256::digest(relay_cert.as_ref()).into();
        let mut wrong_pin = pin;
        wrong_pin[31] ^= 1;
        let operator_ca = RelayTrust::Ca(operator.certificate().clone());

        assert!(dial(operator_ca.clone(), "relay.example").await.is_ok());
        assert!(dial(RelayTrust::Fingerprint(pin), "any-name").await.is_ok());
        // Both handshakes presented our deployment certificate.
        for _ in 0..2 {
            assert_eq!(seen.recv().await.unwrap(), Some(id("principal")));
        }
        // Refused: another name under the operator's CA, the deployment CA for a relay it
        // never certified (the default), another CA, a fingerprint one bit off.
        assert!(dial(operator_ca, "other.example").await.is_err());
        assert!(dial(RelayTrust::Deployment, "relay.example").await.is_err());
        let stranger = RelayTrust::Ca(Ca::generate("x").unwrap().certificate().clone());
        assert!(dial(stranger, "relay.example").await.is_err());
        assert!(dial(RelayTrust::Fingerprint(wrong_pin), "relay.example")
            .await
            .is_err());
    }
}
