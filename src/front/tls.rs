//! TLS for the front: a certificate chain and its private key, in PEM, made once into a rustls
//! server configuration ([`Tls::from_pem`]); with one, every connection begins with a TLS
//! handshake (as a `mongod` with `net.tls.mode: requireTLS`), and a client that does not
//! speak TLS is closed after its first bytes. Clients are not asked for a certificate
//! (no X.509 authentication). The protocol versions and cipher suites are rustls's defaults
//! (TLS 1.2 and 1.3), with the `ring` provider the mongodb driver already brings.

use std::fmt;
use std::io;
use std::sync::Arc;

use tokio::io::{AsyncRead, AsyncWrite};
use tokio_rustls::rustls::pki_types::pem::PemObject;
use tokio_rustls::rustls::pki_types::{CertificateDer, PrivateKeyDer};
use tokio_rustls::rustls::{self, ServerConfig};
use tokio_rustls::server::TlsStream;
use tokio_rustls::TlsAcceptor;

/// What the front's TLS handshakes use.
#[derive(Clone)]
pub struct Tls {
    acceptor: TlsAcceptor,
    /// The certificates of the chain, for [`fmt::Debug`].
    chain_len: usize,
}

impl fmt::Debug for Tls {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Tls")
            .field("chain_len", &self.chain_len)
            .finish_non_exhaustive()
    }
}

/// Why a certificate and key cannot serve.
#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    #[error("the certificate file holds no PEM certificate (-----BEGIN CERTIFICATE-----)")]
    NoCertificate,
    #[error("the certificate file is not PEM: {0}")]
    BadCertificate(String),
    #[error(
        "the key file holds no PEM private key (PKCS#8 -----BEGIN PRIVATE KEY-----, PKCS#1 \
         RSA or SEC1 EC): {0}"
    )]
    NoKey(String),
    #[error("the certificate and the key cannot serve together: {0}")]
    Refused(#[from] rustls::Error),
}

impl Tls {
    /// The configuration of a certificate chain (the server's certificate first, then any
    /// intermediates) and its private key.
    pub fn from_pem(certificate_pem: &[u8], key_pem: &[u8]) -> Result<Tls, TlsError> {
        let chain = CertificateDer::pem_slice_iter(certificate_pem)
            .collect::<Result<Vec<_>, _>>()
            .map_err(|e| TlsError::BadCertificate(e.to_string()))?;
        if chain.is_empty() {
            return Err(TlsError::NoCertificate);
        }
        let key =
            PrivateKeyDer::from_pem_slice(key_pem).map_err(|e| TlsError::NoKey(e.to_string()))?;
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let chain_len = chain.len();
        let config = ServerConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()?
            .with_no_client_auth()
            .with_single_cert(chain, key)?;
        Ok(Tls {
            acceptor: TlsAcceptor::from(Arc::new(config)),
            chain_len,
        })
    }

    /// The server's side of a TLS handshake on `stream`.
    pub async fn accept<S>(&self, stream: S) -> io::Result<TlsStream<S>>
    where
        S: AsyncRead + AsyncWrite + Unpin,
    {
        self.acceptor.accept(stream).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn what_is_not_a_certificate_and_key_is_refused_saying_which() {
        assert!(matches!(
            Tls::from_pem(b"", b""),
            Err(TlsError::NoCertificate)
        ));
        assert!(matches!(
            Tls::from_pem(b"not pem at all", b""),
            Err(TlsError::NoCertificate)
        ));
        let certificate = b"-----BEGIN CERTIFICATE-----\nAAAA\n-----END CERTIFICATE-----\n";
        let error = Tls::from_pem(certificate, b"nothing").unwrap_err();
        assert!(matches!(error, TlsError::NoKey(_)), "{error}");
    }
}
