//! Certificates from PEM files into tonic's TLS configs, and the `--tls-*` flags every binary takes
//! (their clap derive behind the `cli` feature, so that applications linking the client library
//! do not link clap).
//!
//! A process loads its CA, certificate and key once, at start, and refuses to start when they do
//! not fit: unreadable files, a certificate without exactly one role, a role the process is not
//! (an AllocSvr with a client certificate would be refused by every store call, far from the
//! cause), or a certificate outside its validity period.
//!
//! Servers require a client certificate signed by the CA (rustls's WebPKI verifier: chain, expiry,
//! key usage); clients check the server's certificate against the CA and the host they dialled,
//! so every server certificate must name the addresses clients use (IP or DNS SANs).
//!
//! Deliberately left out: reloading certificates without a restart, and several CAs at once (a
//! CA rotation is done by a restart per process with a bundle in `--tls-ca`, which PEM allows).

use std::path::{Path, PathBuf};
use std::time::Duration;

use tonic::transport::{Certificate, ClientTlsConfig, Endpoint, Identity, ServerTlsConfig};

use crate::Role;
use crate::policy::ROLE_URI_PREFIX;

/// How long a server waits for a TLS handshake before dropping the connection, so that
/// connections that never finish one cannot pile up.
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

/// The `--tls-*` options. Without `--tls-ca` the process speaks plaintext, as before.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
#[cfg_attr(feature = "cli", derive(clap::Args))]
pub struct TlsArgs {
    /// PEM file of the cluster's certificate authority. Turns on mutual TLS: every peer must show a
    /// certificate it signed, and this process shows --tls-cert. Needs --tls-cert and --tls-key.
    #[cfg_attr(feature = "cli", arg(long, value_name = "FILE", requires_all = ["tls_cert", "tls_key"], global = true))]
    pub tls_ca: Option<PathBuf>,

    /// PEM file of this process's certificate, signed by --tls-ca and carrying its role
    /// (`seqctl certs` makes them for a local cluster).
    #[cfg_attr(feature = "cli", arg(long, value_name = "FILE", requires = "tls_ca", global = true))]
    pub tls_cert: Option<PathBuf>,

    /// PEM file of the private key of --tls-cert.
    #[cfg_attr(feature = "cli", arg(long, value_name = "FILE", requires = "tls_ca", global = true))]
    pub tls_key: Option<PathBuf>,
}

/// Why TLS could not be set up; the message names the file and what to fix.
#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    /// A file could not be read.
    #[error("cannot read {what} {path}: {source}")]
    Read {
        what: &'static str,
        path: PathBuf,
        source: std::io::Error,
    },
    /// Only some of the three files were given.
    #[error("--tls-ca, --tls-cert and --tls-key go together: give all three or none")]
    Incomplete,
    /// The certificate does not fit this process.
    #[error("{path}: {why}")]
    Certificate { path: PathBuf, why: String },
    /// tonic refused the configuration.
    #[error("TLS setup: {0}")]
    Setup(String),
}

/// A process's loaded TLS material: what it trusts and who it is.
#[derive(Clone)]
pub struct Tls {
    ca: Vec<u8>,
    cert: Vec<u8>,
    key: Vec<u8>,
    /// The role of this process's own certificate.
    pub role: Role,
    /// Its subject, as peers will see it in their logs and audit trail.
    pub subject: String,
}

impl std::fmt::Debug for Tls {
    // Never the key.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Tls({}, role {})", self.subject, self.role)
    }
}

impl TlsArgs {
    /// Whether mutual TLS is on.
    pub fn enabled(&self) -> bool {
        self.tls_ca.is_some()
    }

    /// Loads the files, or `None` without `--tls-ca`. `expect` is the role this process must
    /// hold; `None` accepts any (seqctl runs as whichever role its certificate gives).
    pub fn load(&self, expect: Option<Role>) -> Result<Option<Tls>, TlsError> {
        let (ca, cert, key) = match (&self.tls_ca, &self.tls_cert, &self.tls_key) {
            (None, None, None) => return Ok(None),
            (Some(ca), Some(cert), Some(key)) => (ca, cert, key),
            _ => return Err(TlsError::Incomplete),
        };
        let ca_pem = read("CA certificate (--tls-ca)", ca)?;
        let cert_pem = read("certificate (--tls-cert)", cert)?;
        let key_pem = read("private key (--tls-key)", key)?;
        let bad = |why: String| TlsError::Certificate {
            path: cert.clone(),
            why,
        };
        let who = crate::identity::from_pem(&cert_pem).map_err(bad)?;
        let role = who.role.map_err(bad)?;
        if let Some(expect) = expect.filter(|e| *e != role) {
            return Err(bad(format!(
                "carries role {role}, but this process needs a {expect} certificate (URI SAN {ROLE_URI_PREFIX}{expect})"
            )));
        }
        if !who.valid_now {
            return Err(bad("is outside its validity period (expired or not yet valid)".into()));
        }
        Ok(Some(Tls {
            ca: ca_pem,
            cert: cert_pem,
            key: key_pem,
            role,
            subject: who.subject,
        }))
    }
}

fn read(what: &'static str, path: &Path) -> Result<Vec<u8>, TlsError> {
    std::fs::read(path).map_err(|source| TlsError::Read {
        what,
        path: path.to_owned(),
        source,
    })
}

impl Tls {
    /// From PEM bytes already in memory (tests, the simulator).
    pub fn from_pem(ca: &[u8], cert: &[u8], key: &[u8]) -> Result<Self, String> {
        let who = crate::identity::from_pem(cert)?;
        Ok(Self {
            ca: ca.to_vec(),
            cert: cert.to_vec(),
            key: key.to_vec(),
            role: who.role?,
            subject: who.subject,
        })
    }

    /// The server side: this certificate, and a client certificate signed by the CA required.
    pub fn server(&self) -> ServerTlsConfig {
        ServerTlsConfig::new()
            .identity(Identity::from_pem(&self.cert, &self.key))
            .client_ca_root(Certificate::from_pem(&self.ca))
            .timeout(HANDSHAKE_TIMEOUT)
    }

    /// The client side: trust only the CA, show this certificate.
    pub fn client(&self) -> ClientTlsConfig {
        ClientTlsConfig::new()
            .ca_certificate(Certificate::from_pem(&self.ca))
            .identity(Identity::from_pem(&self.cert, &self.key))
    }
}

impl Tls {
    /// The server side for a server that is not tonic's (the AllocSvr's HTTP and Redis front
    /// ends): this certificate, and a client certificate signed by the CA required, as
    /// [`Tls::server`] does; the caller's role is then read with [`peer_caller`].
    pub fn rustls_server(&self) -> Result<std::sync::Arc<rustls::ServerConfig>, TlsError> {
        let setup = |e: &dyn std::fmt::Display| TlsError::Setup(e.to_string());
        let (provider, roots, chain, key) = self.rustls_parts()?;
        let verifier = rustls::server::WebPkiClientVerifier::builder_with_provider(roots.into(), provider.clone())
            .build()
            .map_err(|e| setup(&e))?;
        let config = rustls::ServerConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .map_err(|e| setup(&e))?
            .with_client_cert_verifier(verifier)
            .with_single_cert(chain, key)
            .map_err(|e| setup(&e))?;
        Ok(std::sync::Arc::new(config))
    }

    /// What both rustls sides are made of: the crypto provider, the CA as the only root, this
    /// certificate's chain and its key.
    #[allow(clippy::type_complexity)]
    fn rustls_parts(
        &self,
    ) -> Result<
        (
            std::sync::Arc<rustls::crypto::CryptoProvider>,
            rustls::RootCertStore,
            Vec<rustls::pki_types::CertificateDer<'static>>,
            rustls::pki_types::PrivateKeyDer<'static>,
        ),
        TlsError,
    > {
        use rustls::pki_types::pem::PemObject;
        use rustls::pki_types::{CertificateDer, PrivateKeyDer};
        let setup = |e: &dyn std::fmt::Display| TlsError::Setup(e.to_string());
        let provider = std::sync::Arc::new(rustls::crypto::ring::default_provider());
        let mut roots = rustls::RootCertStore::empty();
        for ca in CertificateDer::pem_slice_iter(&self.ca) {
            roots.add(ca.map_err(|e| setup(&e))?).map_err(|e| setup(&e))?;
        }
        let chain = CertificateDer::pem_slice_iter(&self.cert)
            .collect::<Result<Vec<_>, _>>()
            .map_err(|e| setup(&e))?;
        let key = PrivateKeyDer::from_pem_slice(&self.key).map_err(|e| setup(&e))?;
        Ok((provider, roots, chain, key))
    }

    /// The client side for a connection that is not tonic's (the client library's `H2Conn`):
    /// trust only the CA, show this certificate, offer HTTP/2 by ALPN — as [`Tls::client`] does.
    pub fn rustls_client(&self) -> Result<std::sync::Arc<rustls::ClientConfig>, TlsError> {
        let setup = |e: &dyn std::fmt::Display| TlsError::Setup(e.to_string());
        let (provider, roots, chain, key) = self.rustls_parts()?;
        let mut config = rustls::ClientConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .map_err(|e| setup(&e))?
            .with_root_certificates(roots)
            .with_client_auth_cert(chain, key)
            .map_err(|e| setup(&e))?;
        config.alpn_protocols = vec![b"h2".to_vec()];
        Ok(std::sync::Arc::new(config))
    }
}

/// How long a server that is not tonic's should wait for a TLS handshake.
pub const HANDSHAKE_LIMIT: Duration = HANDSHAKE_TIMEOUT;

/// Who is calling on a TLS connection whose handshake verified `certs` (leaf first), if its role
/// may take numbers (the data plane's rule in [`crate::policy`]); otherwise why not, for the
/// caller and the log.
pub fn peer_caller(certs: Option<&[rustls::pki_types::CertificateDer<'_>]>) -> Result<crate::Caller, String> {
    let Some(leaf) = certs.and_then(|c| c.first()) else {
        return Err("no client certificate".into());
    };
    let who = crate::identity::from_der(leaf.as_ref())?;
    let role = who.role.map_err(|why| format!("{}: {why}", who.subject))?;
    if !crate::policy::allowed_kind(role, crate::policy::Kind::DataPlane) {
        return Err(format!("{}: role {role} may not take numbers", who.subject));
    }
    Ok(crate::Caller {
        subject: who.subject.into(),
        role: Some(role),
    })
}

/// A tonic endpoint for `addr` (`host:port`): `https` with this TLS, `http` without.
pub fn endpoint(addr: &str, tls: Option<&Tls>) -> Result<Endpoint, String> {
    let scheme = if tls.is_some() { "https" } else { "http" };
    let endpoint =
        Endpoint::from_shared(format!("{scheme}://{addr}")).map_err(|e| format!("bad address {addr:?}: {e}"))?;
    match tls {
        Some(t) => endpoint
            .tls_config(t.client())
            .map_err(|e| format!("TLS for {addr}: {e}")),
        None => Ok(endpoint),
    }
}

/// The layers of [`server`]'s builder.
pub type Layered = tower::layer::util::Stack<crate::AuthLayer, tower::layer::util::Identity>;

/// The gRPC server every process builds its services on: mutual TLS with `tls` (plaintext without),
/// and the role check in front of every service.
pub fn server(tls: Option<&Tls>) -> Result<tonic::transport::Server<Layered>, TlsError> {
    let mut builder = tonic::transport::Server::builder();
    if let Some(t) = tls {
        builder = builder
            .tls_config(t.server())
            .map_err(|e| TlsError::Setup(e.to_string()))?;
    }
    Ok(builder.layer(crate::AuthLayer::default()))
}
