//! TLS for HTTPS: the same deployment CA and certificates as the QUIC endpoint, mutual
//! authentication both ways (rustls, ring provider).

use std::sync::Arc;

use abhyasa_moq::Identity;

use crate::A2aError;

fn roots(identity: &Identity) -> Result<Arc<rustls::RootCertStore>, A2aError> {
    let mut roots = rustls::RootCertStore::empty();
    roots.add(identity.ca.clone())?;
    Ok(Arc::new(roots))
}

/// A server that requires a client certificate from the deployment CA.
pub(crate) fn server(identity: &Identity) -> Result<rustls::ServerConfig, A2aError> {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let verifier = rustls::server::WebPkiClientVerifier::builder_with_provider(
        roots(identity)?,
        provider.clone(),
    )
    .build()?;
    let mut config = rustls::ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()?
        .with_client_cert_verifier(verifier)
        .with_single_cert(identity.chain.clone(), identity.private_key())?;
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(config)
}

/// A client that trusts only the deployment CA and presents its own certificate.
pub(crate) fn client(identity: &Identity) -> Result<rustls::ClientConfig, A2aError> {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut config = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()?
        .with_root_certificates(roots(identity)?)
        .with_client_auth_cert(identity.chain.clone(), identity.private_key())?;
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(config)
}
