//! `alloc-bench --tls` (and the other benchmarks through [`crate::cluster`]): every process and
//! every connection of the run over mutual TLS with roles, so that what TLS costs shows up in the
//! same numbers, on both sides of each ratio (the echo serves TLS too).
//!
//! Process-wide and set once before the first connection, like the simulator's: one run per
//! process. Without `--tls` nothing is set and every link is plaintext.

use std::path::Path;
use std::sync::{Arc, OnceLock};

use seqsvr_auth::devca::LocalCerts;
use seqsvr_auth::{Role, Tls};

struct Certs {
    files: LocalCerts,
    client: Arc<Tls>,
}

static CERTS: OnceLock<Certs> = OnceLock::new();

/// Writes a development CA and one certificate per role into `dir`; TLS is on from here.
pub fn setup(dir: &Path) -> Result<(), String> {
    let (files, _) = LocalCerts::create(dir, &["127.0.0.1".into()], 2)?;
    let client = files.load(Role::Client)?;
    CERTS
        .set(Certs { files, client })
        .map_err(|_| "TLS set up twice in one process".to_string())
}

/// Where the certificates are, to hand to a child process; `None` without TLS.
pub fn dir() -> Option<&'static Path> {
    CERTS.get().map(|c| c.files.dir.as_path())
}

/// The `--tls-*` flags of a process holding `role`'s certificate; none without TLS.
pub fn flags(role: Role) -> Vec<String> {
    CERTS.get().map(|c| c.files.flags(role)).unwrap_or_default()
}

/// The benchmark's own certificate (`client`: fetches, status, routes).
pub fn client() -> Option<Arc<Tls>> {
    CERTS.get().map(|c| c.client.clone())
}
