//! HTTPS: the rustls server settings (ring provider), a client certificate check
//! stricter than the CA's signature, and the identity of a verified client certificate
//! for the request handlers.

use std::path::Path;
use std::sync::Arc;

use rustls::client::danger::HandshakeSignatureValid;
use rustls::server::WebPkiClientVerifier;
use rustls::server::danger::{ClientCertVerified, ClientCertVerifier};
use rustls::{CertificateError, DigitallySignedStruct, DistinguishedName, SignatureScheme};
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer, UnixTime};

#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    #[error("{what} {path}: {message}")]
    File {
        what: &'static str,
        path: String,
        message: String,
    },
    #[error("TLS settings rejected: {0}")]
    Rustls(String),
}

/// The identity of a client that presented a certificate the CA verified: its subject's
/// common name (or the whole subject when it has none).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct PeerCertificate(pub Option<String>);

/// A certificate or key file: a regular file of bounded size only, so nothing put in its
/// place (a FIFO, a device) can hang or exhaust the agent at start.
fn read_pem(path: &Path) -> Result<Vec<u8>, String> {
    nfsprov_api_types::read_bounded(path, nfsprov_api_types::MAX_PEM_BYTES)
        .map_err(|e| format!("cannot read it: {e}"))
}

fn load_certs(what: &'static str, path: &Path) -> Result<Vec<CertificateDer<'static>>, TlsError> {
    let file_error = |message: String| TlsError::File {
        what,
        path: path.display().to_string(),
        message,
    };
    let pem = read_pem(path).map_err(file_error)?;
    let certs = CertificateDer::pem_slice_iter(&pem)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| file_error(format!("not valid PEM: {e}")))?;
    if certs.is_empty() {
        return Err(file_error("holds no PEM certificate".into()));
    }
    Ok(certs)
}

fn load_key(path: &Path) -> Result<PrivateKeyDer<'static>, TlsError> {
    let file_error = |message: String| TlsError::File {
        what: "tls.key_file",
        path: path.display().to_string(),
        message,
    };
    let pem = read_pem(path).map_err(file_error)?;
    PrivateKeyDer::from_pem_slice(&pem)
        .map_err(|e| file_error(format!("holds no usable private key: {e}")))
}

/// Server settings: our certificate, and client certificates verified against
/// `client_ca` when given (see `ClientPurposeVerifier` for what else they need). When
/// tokens are also accepted, a client may connect without a certificate (it then needs a
/// token); a certificate it does present must still verify.
pub(crate) fn server_config(
    cert_file: &Path,
    key_file: &Path,
    client_ca: Option<&Path>,
    allowed_client_names: &[String],
    certificate_optional: bool,
) -> Result<Arc<rustls::ServerConfig>, TlsError> {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let chain = load_certs("tls.cert_file", cert_file)?;
    let key = load_key(key_file)?;
    let builder = rustls::ServerConfig::builder_with_provider(provider.clone())
        .with_safe_default_protocol_versions()
        .map_err(|e| TlsError::Rustls(e.to_string()))?;
    let builder = match client_ca {
        Some(ca_file) => {
            let mut roots = rustls::RootCertStore::empty();
            for cert in load_certs("tls.client_ca_file", ca_file)? {
                roots.add(cert).map_err(|e| TlsError::File {
                    what: "tls.client_ca_file",
                    path: ca_file.display().to_string(),
                    message: e.to_string(),
                })?;
            }
            let verifier = WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider);
            let verifier = if certificate_optional {
                verifier.allow_unauthenticated()
            } else {
                verifier
            };
            let signature_check = verifier
                .build()
                .map_err(|e| TlsError::Rustls(e.to_string()))?;
            builder.with_client_cert_verifier(Arc::new(ClientPurposeVerifier {
                signature_check,
                allowed_names: allowed_client_names.to_vec(),
            }))
        }
        None => builder.with_no_client_auth(),
    };
    let mut config = builder.with_single_cert(chain, key).map_err(|e| {
        TlsError::Rustls(format!(
            "certificate and key do not match or are unusable: {e}"
        ))
    })?;
    config.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
    Ok(Arc::new(config))
}

/// The CA's signature is not enough for a client certificate: webpki accepts one that
/// has no extended key usage at all, and every certificate the CA ever signed (a
/// server's, another service's) would be a key to the agent. This check also requires
/// the clientAuth extended key usage, and one of the allowed names when a list is set.
#[derive(Debug)]
struct ClientPurposeVerifier {
    signature_check: Arc<dyn ClientCertVerifier>,
    /// Empty: any name.
    allowed_names: Vec<String>,
}

impl ClientPurposeVerifier {
    fn check_purpose_and_name(&self, der: &[u8]) -> Result<(), rustls::Error> {
        let refused = |error: CertificateError| rustls::Error::InvalidCertificate(error);
        let (_, cert) = x509_parser::parse_x509_certificate(der)
            .map_err(|_| refused(CertificateError::BadEncoding))?;
        let client_auth = cert
            .extended_key_usage()
            .ok()
            .flatten()
            .is_some_and(|eku| eku.value.client_auth);
        if !client_auth {
            return Err(refused(CertificateError::InvalidPurpose));
        }
        if self.allowed_names.is_empty() {
            return Ok(());
        }
        let common_names = cert
            .subject()
            .iter_common_name()
            .filter_map(|cn| cn.as_str().ok());
        let dns_names = cert
            .subject_alternative_name()
            .ok()
            .flatten()
            .into_iter()
            .flat_map(|san| san.value.general_names.iter())
            .filter_map(|name| match name {
                x509_parser::extensions::GeneralName::DNSName(dns) => Some(*dns),
                _ => None,
            });
        let mut names = common_names.chain(dns_names);
        if names.any(|name| self.allowed_names.iter().any(|allowed| allowed == name)) {
            Ok(())
        } else {
            Err(refused(CertificateError::ApplicationVerificationFailure))
        }
    }
}

impl ClientCertVerifier for ClientPurposeVerifier {
    fn offer_client_auth(&self) -> bool {
        self.signature_check.offer_client_auth()
    }

    fn client_auth_mandatory(&self) -> bool {
        self.signature_check.client_auth_mandatory()
    }

    fn root_hint_subjects(&self) -> &[DistinguishedName] {
        self.signature_check.root_hint_subjects()
    }

    fn verify_client_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        now: UnixTime,
    ) -> Result<ClientCertVerified, rustls::Error> {
        let verified = self
            .signature_check
            .verify_client_cert(end_entity, intermediates, now)?;
        self.check_purpose_and_name(end_entity.as_ref())?;
        Ok(verified)
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.signature_check
            .verify_tls12_signature(message, cert, dss)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.signature_check
            .verify_tls13_signature(message, cert, dss)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.signature_check.supported_verify_schemes()
    }
}

/// The identity of the verified client certificate a handshake ended with, if any.
pub(crate) fn peer_identity(connection: &rustls::ServerConnection) -> Option<String> {
    connection
        .peer_certificates()
        .and_then(|chain| chain.first())
        .map(|leaf| certificate_name(leaf.as_ref()))
}

/// The subject common name of a DER certificate, or its whole subject.
fn certificate_name(der: &[u8]) -> String {
    match x509_parser::parse_x509_certificate(der) {
        Ok((_, cert)) => {
            let subject = cert.subject();
            subject
                .iter_common_name()
                .next()
                .and_then(|cn| cn.as_str().ok())
                .map(|cn| format!("cn={cn}"))
                .unwrap_or_else(|| subject.to_string())
        }
        Err(_) => "unparsable-certificate".to_owned(),
    }
}
