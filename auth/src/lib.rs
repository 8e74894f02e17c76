//! Who may call what: mutual TLS on every link of seqsvr-rs, and a role in every certificate.
//!
//! - [`Role`]: `client`, `allocsvr`, `storesvr`, `admin`, carried in a certificate as the URI
//!   subject-alternative name `urn:seqsvr:role:<role>`.
//! - [`policy`]: the one table of which role may call which gRPC method.
//! - [`Caller`]: who sent a request (certificate subject and role, or anonymous without TLS),
//!   put into every request's extensions by the server's check so handlers can record it.
//! - [`tls`]: loading PEM files into tonic's server and client TLS configs; the `--tls-*` flags.
//! - [`layer`]: the tower layer every server runs first: no role that may call the method,
//!   PERMISSION_DENIED and a log line naming the peer.
//! - `devca` (feature `dev-ca`): a development CA and one certificate per role for a local
//!   cluster (rcgen); `seqctl certs` and the tests use it, servers do not link it.
//!
//! Deliberately left out: certificate revocation (CRLs, OCSP) and rotation without a restart; a
//! compromised key is handled by replacing the CA. Without `--tls-*` flags every link is plaintext
//! and every caller is anonymous and may call everything, as before this crate existed.

#[cfg(feature = "dev-ca")]
pub mod devca;
mod identity;
pub mod layer;
pub mod policy;
pub mod tls;

use std::fmt;
use std::sync::Arc;

pub use layer::AuthLayer;
pub use policy::{Role, allowed};
pub use tls::{Layered, Tls, TlsArgs, TlsError, endpoint, server};

/// Who sent a request, as the server's role check saw it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Caller {
    /// The certificate subject (its common name when it has one), or `anonymous` without TLS.
    pub subject: Arc<str>,
    /// The role the certificate carries; `None` without TLS.
    pub role: Option<Role>,
}

impl Caller {
    /// The caller of a plaintext link.
    pub fn anonymous() -> Self {
        Self {
            subject: Arc::from("anonymous"),
            role: None,
        }
    }

    /// The caller the server's check recorded on `request`; anonymous when no check ran (no TLS,
    /// or a test calling a handler directly).
    pub fn of<T>(request: &tonic::Request<T>) -> Self {
        request
            .extensions()
            .get::<Caller>()
            .cloned()
            .unwrap_or_else(Self::anonymous)
    }
}

impl fmt::Display for Caller {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.role {
            Some(role) => write!(f, "{} ({role})", self.subject),
            None => f.write_str(&self.subject),
        }
    }
}
