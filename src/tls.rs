//! TLS on both legs: the client-facing acceptor (`[tls]`) and the upstream connector
//! (`[upstream_tls]`), built with rustls on the `ring` provider, PEM read through
//! `rustls-pki-types`. Config validation builds them, so a bad file is a config error that
//! names the key; sessions only handshake.

use std::fmt;
use std::io;
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::crypto::CryptoProvider;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName, UnixTime};
use rustls::server::WebPkiClientVerifier;
use rustls::{ClientConfig, DigitallySignedStruct, RootCertStore, ServerConfig, SignatureScheme};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpStream;
use tokio_rustls::{TlsAcceptor, TlsConnector};

/// A problem with one TLS setting: `key` is the setting's name inside its table
/// (`cert`, `key`, `client_ca`, `ca`, `server_name`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TlsError {
    pub key: &'static str,
    pub message: String,
}

fn err(key: &'static str, message: impl Into<String>) -> TlsError {
    TlsError {
        key,
        message: message.into(),
    }
}

fn provider() -> Arc<CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

/// Every certificate in a PEM file (at least one).
pub fn load_certs(path: &Path) -> Result<Vec<CertificateDer<'static>>, String> {
    let iter = CertificateDer::pem_file_iter(path).map_err(|e| pem_message(path, e))?;
    let certs = iter
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| pem_message(path, e))?;
    if certs.is_empty() {
        return Err(format!(
            "{}: no PEM certificate (BEGIN CERTIFICATE) found",
            path.display()
        ));
    }
    Ok(certs)
}

/// The first private key (PKCS#8, PKCS#1 or SEC1) of a PEM file.
pub fn load_key(path: &Path) -> Result<PrivateKeyDer<'static>, String> {
    PrivateKeyDer::from_pem_file(path).map_err(|e| match e {
        rustls::pki_types::pem::Error::NoItemsFound => {
            format!("{}: no PEM private key found", path.display())
        }
        e => pem_message(path, e),
    })
}

fn pem_message(path: &Path, e: rustls::pki_types::pem::Error) -> String {
    match e {
        rustls::pki_types::pem::Error::Io(io) => format!("cannot read {}: {io}", path.display()),
        e => format!("{}: invalid PEM: {e}", path.display()),
    }
}

fn roots(path: &Path, key: &'static str) -> Result<RootCertStore, TlsError> {
    let mut store = RootCertStore::empty();
    for cert in load_certs(path).map_err(|m| err(key, m))? {
        store.add(cert).map_err(|e| {
            err(
                key,
                format!("{}: unusable CA certificate: {e}", path.display()),
            )
        })?;
    }
    Ok(store)
}

/// The client-facing TLS settings (`[tls]`): what was configured and the acceptor built
/// from it. Changing `cert`/`key`/`client_ca` applies to new connections on reload.
#[derive(Clone)]
pub struct ServerTls {
    pub cert: PathBuf,
    pub key: PathBuf,
    /// Clients must present a certificate signed by this CA (mutual TLS).
    pub client_ca: Option<PathBuf>,
    pub acceptor: TlsAcceptor,
}

impl fmt::Debug for ServerTls {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ServerTls")
            .field("cert", &self.cert)
            .field("key", &self.key)
            .field("client_ca", &self.client_ca)
            .finish_non_exhaustive()
    }
}

impl ServerTls {
    pub fn new(cert: &Path, key: &Path, client_ca: Option<&Path>) -> Result<ServerTls, TlsError> {
        let chain = load_certs(cert).map_err(|m| err("cert", m))?;
        let private = load_key(key).map_err(|m| err("key", m))?;
        let builder = ServerConfig::builder_with_provider(provider())
            .with_safe_default_protocol_versions()
            .map_err(|e| err("cert", format!("tls setup: {e}")))?;
        let builder = match client_ca {
            Some(ca) => {
                let verifier = WebPkiClientVerifier::builder_with_provider(
                    Arc::new(roots(ca, "client_ca")?),
                    provider(),
                )
                .build()
                .map_err(|e| err("client_ca", format!("{}: {e}", ca.display())))?;
                builder.with_client_cert_verifier(verifier)
            }
            None => builder.with_no_client_auth(),
        };
        let config = builder.with_single_cert(chain, private).map_err(|e| {
            err(
                "key",
                format!(
                    "{} does not fit certificate {}: {e}",
                    key.display(),
                    cert.display()
                ),
            )
        })?;
        Ok(ServerTls {
            cert: cert.to_path_buf(),
            key: key.to_path_buf(),
            client_ca: client_ca.map(Path::to_path_buf),
            acceptor: TlsAcceptor::from(Arc::new(config)),
        })
    }
}

/// The upstream-facing TLS settings (`[upstream_tls]`) and the connector built from them.
#[derive(Clone)]
pub struct UpstreamTls {
    pub ca: Option<PathBuf>,
    /// The name checked against mongos's certificate; default: each upstream's host.
    pub server_name: Option<String>,
    /// Client certificate presented to mongos.
    pub cert: Option<PathBuf>,
    pub key: Option<PathBuf>,
    /// Accept any server certificate (labs only).
    pub insecure_skip_verify: bool,
    pub connector: TlsConnector,
}

impl fmt::Debug for UpstreamTls {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("UpstreamTls")
            .field("ca", &self.ca)
            .field("server_name", &self.server_name)
            .field("cert", &self.cert)
            .field("key", &self.key)
            .field("insecure_skip_verify", &self.insecure_skip_verify)
            .finish_non_exhaustive()
    }
}

impl UpstreamTls {
    /// `ca` is required unless `insecure_skip_verify`; `cert` and `key` go together.
    pub fn new(
        ca: Option<&Path>,
        server_name: Option<&str>,
        client_cert: Option<(&Path, &Path)>,
        insecure_skip_verify: bool,
    ) -> Result<UpstreamTls, TlsError> {
        if let Some(name) = server_name {
            ServerName::try_from(name.to_string())
                .map_err(|e| err("server_name", format!("`{name}`: {e}")))?;
        }
        let builder = rustls::ClientConfig::builder_with_provider(provider())
            .with_safe_default_protocol_versions()
            .map_err(|e| err("ca", format!("tls setup: {e}")))?;
        let builder = match (ca, insecure_skip_verify) {
            (_, true) => builder
                .dangerous()
                .with_custom_certificate_verifier(Arc::new(NoVerify(provider()))),
            (Some(ca), false) => builder.with_root_certificates(roots(ca, "ca")?),
            (None, false) => {
                return Err(err(
                    "ca",
                    "missing: the CA file that signed mongos's certificate is required (or insecure_skip_verify = true, labs only)",
                ))
            }
        };
        let config: ClientConfig = match client_cert {
            Some((cert, key)) => {
                let chain = load_certs(cert).map_err(|m| err("cert", m))?;
                let private = load_key(key).map_err(|m| err("key", m))?;
                builder.with_client_auth_cert(chain, private).map_err(|e| {
                    err(
                        "key",
                        format!(
                            "{} does not fit certificate {}: {e}",
                            key.display(),
                            cert.display()
                        ),
                    )
                })?
            }
            None => builder.with_no_client_auth(),
        };
        Ok(UpstreamTls {
            ca: ca.map(Path::to_path_buf),
            server_name: server_name.map(str::to_string),
            cert: client_cert.map(|(c, _)| c.to_path_buf()),
            key: client_cert.map(|(_, k)| k.to_path_buf()),
            insecure_skip_verify,
            connector: TlsConnector::from(Arc::new(config)),
        })
    }

    /// The name to verify for upstream `addr` (`host:port`).
    pub fn server_name_for(&self, addr: &str) -> Result<ServerName<'static>, String> {
        let name = match &self.server_name {
            Some(n) => n.clone(),
            None => host_of(addr).to_string(),
        };
        ServerName::try_from(name.clone()).map_err(|e| format!("server name `{name}`: {e}"))
    }

    /// Connects TLS over an established TCP connection to `addr`.
    pub async fn connect(&self, tcp: TcpStream, addr: &str) -> io::Result<Stream> {
        let name = self
            .server_name_for(addr)
            .map_err(|m| io::Error::new(io::ErrorKind::InvalidInput, m))?;
        let tls = self.connector.connect(name, tcp).await?;
        Ok(Stream::Client(Box::new(tls)))
    }
}

/// The host part of `host:port` or `[v6]:port`.
fn host_of(addr: &str) -> &str {
    let host = addr.rsplit_once(':').map_or(addr, |(h, _)| h);
    host.trim_start_matches('[').trim_end_matches(']')
}

/// `insecure_skip_verify`: accepts any certificate, still checks the handshake signatures.
#[derive(Debug)]
struct NoVerify(Arc<CryptoProvider>);

impl ServerCertVerifier for NoVerify {
    fn verify_server_cert(
        &self,
        _end_entity: &CertificateDer<'_>,
        _intermediates: &[CertificateDer<'_>],
        _server_name: &ServerName<'_>,
        _ocsp_response: &[u8],
        _now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        Ok(ServerCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(
            message,
            cert,
            dss,
            &self.0.signature_verification_algorithms,
        )
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(
            message,
            cert,
            dss,
            &self.0.signature_verification_algorithms,
        )
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.0.signature_verification_algorithms.supported_schemes()
    }
}

/// A connection on either leg, with or without TLS.
pub enum Stream {
    Plain(TcpStream),
    /// Client-facing TLS (we are the server).
    Server(Box<tokio_rustls::server::TlsStream<TcpStream>>),
    /// Upstream-facing TLS (we are the client).
    Client(Box<tokio_rustls::client::TlsStream<TcpStream>>),
    /// Plain TCP on the session thread's io_uring (`layout = "uring"`).
    #[cfg(target_os = "linux")]
    Ring(staleguard_ring::RingStream),
}

impl fmt::Debug for Stream {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let (kind, tcp) = match self {
            Stream::Plain(s) => ("plain", s),
            Stream::Server(s) => ("tls-server", s.get_ref().0),
            Stream::Client(s) => ("tls-client", s.get_ref().0),
            #[cfg(target_os = "linux")]
            Stream::Ring(_) => return f.debug_struct("Stream").field("kind", &"ring").finish(),
        };
        f.debug_struct("Stream")
            .field("kind", &kind)
            .field("peer", &tcp.peer_addr().ok())
            .finish()
    }
}

impl Stream {
    pub fn is_tls(&self) -> bool {
        matches!(self, Stream::Server(_) | Stream::Client(_))
    }

    /// A plain TCP stream moved onto this session thread's io_uring (`layout = "uring"`);
    /// TLS streams stay as they are.
    pub fn onto_ring(self) -> io::Result<Stream> {
        match self {
            Stream::Plain(s) => Stream::on_ring(s.into_std()?),
            other => Ok(other),
        }
    }

    /// `socket` on this session thread's io_uring (`layout = "uring"`; Linux only).
    pub fn on_ring(socket: std::net::TcpStream) -> io::Result<Stream> {
        #[cfg(target_os = "linux")]
        return Ok(Stream::Ring(staleguard_ring::RingStream::new(socket)?));
        #[cfg(not(target_os = "linux"))]
        {
            drop(socket);
            Err(io::ErrorKind::Unsupported.into())
        }
    }
}

impl AsyncRead for Stream {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Stream::Plain(s) => Pin::new(s).poll_read(cx, buf),
            Stream::Server(s) => Pin::new(s.as_mut()).poll_read(cx, buf),
            Stream::Client(s) => Pin::new(s.as_mut()).poll_read(cx, buf),
            #[cfg(target_os = "linux")]
            Stream::Ring(s) => Pin::new(s).poll_read(cx, buf),
        }
    }
}

impl AsyncWrite for Stream {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        match self.get_mut() {
            Stream::Plain(s) => Pin::new(s).poll_write(cx, buf),
            Stream::Server(s) => Pin::new(s.as_mut()).poll_write(cx, buf),
            Stream::Client(s) => Pin::new(s.as_mut()).poll_write(cx, buf),
            #[cfg(target_os = "linux")]
            Stream::Ring(s) => Pin::new(s).poll_write(cx, buf),
        }
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Stream::Plain(s) => Pin::new(s).poll_flush(cx),
            Stream::Server(s) => Pin::new(s.as_mut()).poll_flush(cx),
            Stream::Client(s) => Pin::new(s.as_mut()).poll_flush(cx),
            #[cfg(target_os = "linux")]
            Stream::Ring(s) => Pin::new(s).poll_flush(cx),
        }
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Stream::Plain(s) => Pin::new(s).poll_shutdown(cx),
            Stream::Server(s) => Pin::new(s.as_mut()).poll_shutdown(cx),
            Stream::Client(s) => Pin::new(s.as_mut()).poll_shutdown(cx),
            #[cfg(target_os = "linux")]
            Stream::Ring(s) => Pin::new(s).poll_shutdown(cx),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::host_of;

    #[test]
    fn hosts() {
        assert_eq!(host_of("db1.example:27017"), "db1.example");
        assert_eq!(host_of("127.0.0.1:27017"), "127.0.0.1");
        assert_eq!(host_of("[::1]:27017"), "::1");
    }
}
