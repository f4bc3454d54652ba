//! HTTPS: the rustls server settings (ring provider) and an acceptor that hands the
//! verified client certificate's identity to the request handlers.

use std::io;
use std::path::Path;
use std::sync::Arc;

use crate::connections::{ConnectionLimits, Limited};
use axum::Extension;
use axum::middleware::AddExtension;
use axum_server::accept::Accept;
use axum_server::tls_rustls::{RustlsAcceptor, RustlsConfig};
use futures::future::BoxFuture;
use rustls::server::WebPkiClientVerifier;
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer};
use tokio::io::{AsyncRead, AsyncWrite};
use tokio_rustls::server::TlsStream;
use tower::Layer;

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
pub struct PeerCertificate(pub Option<String>);

fn load_certs(what: &'static str, path: &Path) -> Result<Vec<CertificateDer<'static>>, TlsError> {
    let file_error = |message: String| TlsError::File {
        what,
        path: path.display().to_string(),
        message,
    };
    let pem = std::fs::read(path).map_err(|e| file_error(format!("cannot read it: {e}")))?;
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
    let pem = std::fs::read(path).map_err(|e| file_error(format!("cannot read it: {e}")))?;
    PrivateKeyDer::from_pem_slice(&pem)
        .map_err(|e| file_error(format!("holds no usable private key: {e}")))
}

/// Server settings: our certificate, and client certificates verified against
/// `client_ca` when given. When tokens are also accepted, a client may connect without a
/// certificate (it then needs a token); a certificate it does present must still verify.
pub fn server_config(
    cert_file: &Path,
    key_file: &Path,
    client_ca: Option<&Path>,
    certificate_optional: bool,
) -> Result<RustlsConfig, TlsError> {
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
            builder.with_client_cert_verifier(
                verifier
                    .build()
                    .map_err(|e| TlsError::Rustls(e.to_string()))?,
            )
        }
        None => builder.with_no_client_auth(),
    };
    let mut config = builder.with_single_cert(chain, key).map_err(|e| {
        TlsError::Rustls(format!(
            "certificate and key do not match or are unusable: {e}"
        ))
    })?;
    config.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
    Ok(RustlsConfig::from_config(Arc::new(config)))
}

/// Wraps the rustls acceptor to attach the peer certificate's identity to every request
/// of the connection.
#[derive(Debug, Clone)]
pub struct IdentityAcceptor {
    inner: RustlsAcceptor,
    limits: ConnectionLimits,
}

impl IdentityAcceptor {
    pub fn new(config: RustlsConfig, limits: ConnectionLimits) -> Self {
        Self {
            inner: RustlsAcceptor::new(config),
            limits,
        }
    }
}

impl<I, S> Accept<I, S> for IdentityAcceptor
where
    I: AsyncRead + AsyncWrite + Unpin + Send + 'static,
    S: Send + 'static,
{
    type Stream = TlsStream<Limited<I>>;
    type Service = AddExtension<S, PeerCertificate>;
    type Future = BoxFuture<'static, io::Result<(Self::Stream, Self::Service)>>;

    fn accept(&self, stream: I, service: S) -> Self::Future {
        let acceptor = self.inner.clone();
        // Counted from the first byte: a connection over the cap is dropped before its
        // handshake costs anything.
        let admitted = self.limits.admit(stream);
        Box::pin(async move {
            let (stream, service) = acceptor.accept(admitted?, service).await?;
            let identity = stream
                .get_ref()
                .1
                .peer_certificates()
                .and_then(|chain| chain.first())
                .map(|leaf| certificate_name(leaf.as_ref()));
            Ok((stream, Extension(PeerCertificate(identity)).layer(service)))
        })
    }
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
