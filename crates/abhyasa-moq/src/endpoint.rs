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

fn transport(settings: &TransportSettings) -> Result<Arc<quinn::TransportConfig>, EndpointError> {
    let mut t = quinn::TransportConfig::default();
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

/// Like [`endpoint`], with every datagram it sends impaired by `spec` (netem rules, in
/// process). Returns a handle to the impairment's counters.
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
