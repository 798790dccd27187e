//! Identities: a deployment CA and per-agent certificates (rcgen), mutual TLS, and the peer's
//! agent id read from its verified certificate — never from a message.
//!
//! An agent certificate names the agent in its subject common name and as its one DNS
//! subject-alternative name, and is valid for both TLS server and client authentication.

use std::path::{Path, PathBuf};

use abhyasa_wire::AgentId;
use rcgen::{
    BasicConstraints, CertificateParams, DistinguishedName, DnType, ExtendedKeyUsagePurpose, IsCa,
    Issuer, KeyPair, KeyUsagePurpose,
};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer};

/// Why an identity could not be made, stored or read.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum IdentityError {
    /// Certificate generation failed.
    #[error("certificate generation: {0}")]
    Generate(#[from] rcgen::Error),
    /// A file could not be read or written.
    #[error("{path}: {source}")]
    Io {
        /// The file.
        path: PathBuf,
        /// What went wrong.
        source: std::io::Error,
    },
    /// A PEM file did not hold what it should.
    #[error("{path}: not a PEM {what}")]
    Pem {
        /// The file.
        path: PathBuf,
        /// What was expected.
        what: &'static str,
    },
    /// A file would be overwritten.
    #[error("{0} exists; refusing to overwrite it")]
    Exists(PathBuf),
    /// A key is not of the type this use needs.
    #[error("{0}")]
    KeyType(String),
    /// A certificate names no valid agent id.
    #[error("certificate names no valid agent id: {0}")]
    NoAgentId(String),
    /// Two certificates speak for one agent with different keys.
    #[error("{0}")]
    Ambiguous(String),
    /// A private key that other users of the machine can read: whoever copies it can act as
    /// this agent (or, for `ca.key`, mint any agent).
    #[error(
        "{path} is readable by group or others (mode {mode:o}): anyone on this machine who \
         copies it can act with it; run `chmod 600 {path}` (and keep its directory 0700)"
    )]
    KeyExposed {
        /// The key file.
        path: PathBuf,
        /// Its permission bits.
        mode: u32,
    },
}

/// Private keys are written 0600 and their directory 0700; certificates 0644.
const KEY_MODE: u32 = 0o600;
const CERT_MODE: u32 = 0o644;
const DIR_MODE: u32 = 0o700;

/// Refuses a key file that group or others can read (or write).
fn check_private(path: &Path) -> Result<(), IdentityError> {
    use std::os::unix::fs::PermissionsExt;
    let mode = std::fs::metadata(path)
        .map_err(|source| IdentityError::Io {
            path: path.to_owned(),
            source,
        })?
        .permissions()
        .mode();
    if mode & 0o077 != 0 {
        return Err(IdentityError::KeyExposed {
            path: path.to_owned(),
            mode: mode & 0o777,
        });
    }
    Ok(())
}

/// A deployment CA: the one root every agent certificate chains to.
pub struct Ca {
    cert: CertificateDer<'static>,
    key: KeyPair,
}

/// An agent's certificate and key, and the CA it trusts.
#[derive(Clone, Debug)]
pub struct Identity {
    /// The agent.
    pub agent: AgentId,
    /// Its certificate chain (leaf first).
    pub chain: Vec<CertificateDer<'static>>,
    /// Its private key (PKCS#8 DER).
    pub key: Vec<u8>,
    /// The deployment CA certificate.
    pub ca: CertificateDer<'static>,
}

impl Identity {
    /// The private key for rustls.
    pub fn private_key(&self) -> PrivateKeyDer<'static> {
        PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(self.key.clone()))
    }
}

impl Ca {
    /// A fresh CA named `name`.
    pub fn generate(name: &str) -> Result<Self, IdentityError> {
        let key = KeyPair::generate()?;
        let mut params = CertificateParams::new(Vec::<String>::new())?;
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params.distinguished_name = DistinguishedName::new();
        params.distinguished_name.push(DnType::CommonName, name);
        params.key_usages = vec![
            KeyUsagePurpose::KeyCertSign,
            KeyUsagePurpose::CrlSign,
            KeyUsagePurpose::DigitalSignature,
        ];
        let cert = params.self_signed(&key)?;
        Ok(Self {
            cert: cert.der().clone(),
            key,
        })
    }

    /// Issues a certificate for `agent`.
    pub fn issue(&self, agent: &AgentId) -> Result<Identity, IdentityError> {
        let issuer = Issuer::from_ca_cert_der(&self.cert, &self.key)?;
        // Ed25519: the key that authenticates the agent in TLS also signs what it sends end
        // to end (`signed`).
        let key = KeyPair::generate_for(&rcgen::PKCS_ED25519)?;
        let mut params = CertificateParams::new(vec![agent.as_str().to_owned()])?;
        params.distinguished_name = DistinguishedName::new();
        params
            .distinguished_name
            .push(DnType::CommonName, agent.as_str());
        params.extended_key_usages = vec![
            ExtendedKeyUsagePurpose::ServerAuth,
            ExtendedKeyUsagePurpose::ClientAuth,
        ];
        params.key_usages = vec![KeyUsagePurpose::DigitalSignature];
        let cert = params.signed_by(&key, &issuer)?;
        Ok(Identity {
            agent: agent.clone(),
            chain: vec![cert.der().clone()],
            key: ed25519_pkcs8_v1(&key.serialize_der())?,
            ca: self.cert.clone(),
        })
    }

    /// Writes `ca.pem` and `ca.key` into `dir` (never over existing files).
    pub fn save(&self, dir: &Path) -> Result<(), IdentityError> {
        let cert_pem = pem_encode("CERTIFICATE", &self.cert);
        write_new(&dir.join("ca.pem"), cert_pem.as_bytes(), CERT_MODE)?;
        write_new(
            &dir.join("ca.key"),
            self.key.serialize_pem().as_bytes(),
            KEY_MODE,
        )
    }

    /// Reads `ca.pem` and `ca.key` from `dir`.
    pub fn load(dir: &Path) -> Result<Self, IdentityError> {
        let cert = read_certificate(&dir.join("ca.pem"))?;
        let key_path = dir.join("ca.key");
        check_private(&key_path)?;
        let pem = read(&key_path)?;
        let key =
            KeyPair::from_pem(&String::from_utf8_lossy(&pem)).map_err(|_| IdentityError::Pem {
                path: key_path,
                what: "private key",
            })?;
        Ok(Self { cert, key })
    }

    /// The CA certificate.
    pub fn certificate(&self) -> &CertificateDer<'static> {
        &self.cert
    }
}

impl Identity {
    /// Writes `<agent>.pem` and `<agent>.key` into `dir` (never over existing files).
    pub fn save(&self, dir: &Path) -> Result<(), IdentityError> {
        let chain: String = self
            .chain
            .iter()
            .map(|c| pem_encode("CERTIFICATE", c))
            .collect();
        write_new(
            &dir.join(format!("{}.pem", self.agent)),
            chain.as_bytes(),
            CERT_MODE,
        )?;
        write_new(
            &dir.join(format!("{}.key", self.agent)),
            pem_encode("PRIVATE KEY", &self.key).as_bytes(),
            KEY_MODE,
        )
    }

    /// Reads `<agent>.pem`, `<agent>.key` and `ca.pem` from `dir`, and checks the certificate
    /// names `agent`.
    pub fn load(dir: &Path, agent: &AgentId) -> Result<Self, IdentityError> {
        let cert_path = dir.join(format!("{agent}.pem"));
        let chain: Vec<CertificateDer<'static>> =
            CertificateDer::pem_slice_iter(&read(&cert_path)?)
                .collect::<Result<_, _>>()
                .map_err(|_| IdentityError::Pem {
                    path: cert_path.clone(),
                    what: "certificate chain",
                })?;
        let named = chain.first().map(|c| agent_of(c)).transpose()?;
        if named.as_ref() != Some(agent) {
            return Err(IdentityError::NoAgentId(format!(
                "{} does not name {agent}",
                cert_path.display()
            )));
        }
        let key_path = dir.join(format!("{agent}.key"));
        check_private(&key_path)?;
        let key =
            PrivateKeyDer::from_pem_slice(&read(&key_path)?).map_err(|_| IdentityError::Pem {
                path: key_path,
                what: "private key",
            })?;
        Ok(Self {
            agent: agent.clone(),
            chain,
            key: key.secret_der().to_vec(),
            ca: read_certificate(&dir.join("ca.pem"))?,
        })
    }
}

/// The agent id a (verified) certificate names: its DNS subject-alternative name.
pub fn agent_of(cert: &CertificateDer<'_>) -> Result<AgentId, IdentityError> {
    let (_, x509) = x509_parser::parse_x509_certificate(cert)
        .map_err(|e| IdentityError::NoAgentId(format!("unparsable certificate: {e}")))?;
    let san = x509
        .subject_alternative_name()
        .map_err(|e| IdentityError::NoAgentId(e.to_string()))?
        .ok_or_else(|| IdentityError::NoAgentId("no subject alternative name".into()))?;
    let name = san
        .value
        .general_names
        .iter()
        .find_map(|n| match n {
            x509_parser::extensions::GeneralName::DNSName(d) => Some(*d),
            _ => None,
        })
        .ok_or_else(|| IdentityError::NoAgentId("no DNS name".into()))?;
    AgentId::new(name).map_err(|e| IdentityError::NoAgentId(e.to_string()))
}

/// An Ed25519 private key as PKCS#8 v1 (RFC 8410 §7: the algorithm and the 32-byte seed).
/// ring writes v2 (with the public key appended), which OpenSSL's PEM reader — Python's `ssl`,
/// curl, most TLS stacks of other ecosystems — refuses; rustls and ed25519-dalek read both.
fn ed25519_pkcs8_v1(der: &[u8]) -> Result<Vec<u8>, IdentityError> {
    use ed25519_dalek::pkcs8::DecodePrivateKey;
    let key = ed25519_dalek::SigningKey::from_pkcs8_der(der)
        .map_err(|e| IdentityError::KeyType(format!("not an Ed25519 PKCS#8 key: {e}")))?;
    const PREFIX: [u8; 16] = [
        0x30, 0x2e, 0x02, 0x01, 0x00, 0x30, 0x05, 0x06, 0x03, 0x2b, 0x65, 0x70, 0x04, 0x22, 0x04,
        0x20,
    ];
    let mut out = PREFIX.to_vec();
    out.extend_from_slice(key.as_bytes());
    Ok(out)
}

fn pem_encode(label: &str, der: &[u8]) -> String {
    pem::encode(&pem::Pem::new(label, der.to_vec()))
}

pub(crate) fn read(path: &Path) -> Result<Vec<u8>, IdentityError> {
    std::fs::read(path).map_err(|source| IdentityError::Io {
        path: path.to_owned(),
        source,
    })
}

/// The (first) certificate of the PEM file `path`.
pub fn read_certificate(path: &Path) -> Result<CertificateDer<'static>, IdentityError> {
    CertificateDer::from_pem_slice(&read(path)?).map_err(|_| IdentityError::Pem {
        path: path.to_owned(),
        what: "certificate",
    })
}

/// Writes a new file with `mode` (never over an existing one), creating its directory 0700
/// if it is missing.
fn write_new(path: &Path, bytes: &[u8], mode: u32) -> Result<(), IdentityError> {
    use std::io::Write;
    use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
    let io = |source| IdentityError::Io {
        path: path.to_owned(),
        source,
    };
    if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(DIR_MODE)
            .create(dir)
            .map_err(io)?;
    }
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(mode)
        .open(path)
        .map_err(|e| match e.kind() {
            std::io::ErrorKind::AlreadyExists => IdentityError::Exists(path.to_owned()),
            _ => io(e),
        })?;
    f.write_all(bytes).map_err(io)?;
    f.sync_all().map_err(io)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn issued_certificates_name_their_agent_and_round_trip_through_files() {
        let dir = tempfile::tempdir().unwrap();
        let ca = Ca::generate("test deployment").unwrap();
        ca.save(dir.path()).unwrap();
        assert!(matches!(ca.save(dir.path()), Err(IdentityError::Exists(_))));
        let ca = Ca::load(dir.path()).unwrap();
        let agent = AgentId::new("agent-1").unwrap();
        let id = ca.issue(&agent).unwrap();
        assert_eq!(agent_of(&id.chain[0]).unwrap(), agent);
        // PKCS#8 v1 Ed25519 (48 bytes: RFC 8410's form, which OpenSSL reads).
        assert_eq!(id.key.len(), 48);
        assert_eq!(
            &id.key[..16],
            b"\x30\x2e\x02\x01\x00\x30\x05\x06\x03\x2b\x65\x70\x04\x22\x04\x20"
        );
        id.save(dir.path()).unwrap();
        let loaded = Identity::load(dir.path(), &agent).unwrap();
        assert_eq!(loaded.chain, id.chain);
        assert_eq!(loaded.key, id.key);
        assert_eq!(&loaded.ca, ca.certificate());
        // A file that names another agent is refused.
        std::fs::copy(
            dir.path().join("agent-1.pem"),
            dir.path().join("agent-2.pem"),
        )
        .unwrap();
        std::fs::copy(
            dir.path().join("agent-1.key"),
            dir.path().join("agent-2.key"),
        )
        .unwrap();
        assert!(matches!(
            Identity::load(dir.path(), &AgentId::new("agent-2").unwrap()),
            Err(IdentityError::NoAgentId(_))
        ));
    }

    /// Reproduced: keys were written 0644 and a second local user copied `principal.key`
    /// and ran a node as the principal. Keys are 0600 in a 0700 directory, and a key that
    /// others can read is refused at load, naming the `chmod` that fixes it.
    #[test]
    fn keys_are_private_and_a_readable_key_is_refused() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        let certs = dir.path().join("certs");
        let ca = Ca::generate("t").unwrap();
        ca.save(&certs).unwrap();
        let agent = AgentId::new("principal").unwrap();
        ca.issue(&agent).unwrap().save(&certs).unwrap();
        let mode = |p: &Path| std::fs::metadata(p).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode(&certs), 0o700);
        assert_eq!(mode(&certs.join("ca.key")), 0o600);
        assert_eq!(mode(&certs.join("principal.key")), 0o600);
        assert_eq!(mode(&certs.join("principal.pem")), 0o644);
        assert!(Identity::load(&certs, &agent).is_ok());
        assert!(Ca::load(&certs).is_ok());
        for (key, load) in [
            (
                "principal.key",
                Box::new(|| Identity::load(&certs, &agent).map(drop))
                    as Box<dyn Fn() -> Result<(), IdentityError>>,
            ),
            ("ca.key", Box::new(|| Ca::load(&certs).map(drop))),
        ] {
            let path = certs.join(key);
            std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o640)).unwrap();
            match load() {
                Err(e @ IdentityError::KeyExposed { .. }) => {
                    let words = e.to_string();
                    assert!(
                        words.contains(&format!("chmod 600 {}", path.display())),
                        "{words}"
                    );
                }
                r => panic!("{key} readable by its group: {r:?}"),
            }
            std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600)).unwrap();
        }
    }
}
