//! Mutual TLS for `sim run --tls`: a development CA and one certificate per role in the run's
//! data dir, the `--tls-*` flags for every process it starts and for `seqctl`, and the loaded
//! certificates for its own clients (the workload: `client`; the move driver and `seqctl`:
//! `admin`; the observers, which read ceilings with Load: `allocsvr`).
//!
//! Kept process-wide, set once before the first connection: one run per process, and every
//! place that dials (workload, observers, moves, seqctl) then finds it without threading it
//! through each call. Without `--tls` nothing is set and every link stays plaintext.
//!
//! The simulator's proxies relay TCP, so TLS passes through them end to end; every address is
//! on 127.0.0.1, the one host the certificates name.

use std::path::Path;
use std::sync::{Arc, OnceLock};

use seqsvr_auth::devca::LocalCerts;
use seqsvr_auth::{Role, Tls};

struct Certs {
    files: LocalCerts,
    client: Arc<Tls>,
    admin: Arc<Tls>,
    allocsvr: Arc<Tls>,
}

static CERTS: OnceLock<Certs> = OnceLock::new();

/// Writes the CA and certificates into `dir` and turns TLS on for this process's clients.
pub fn setup(dir: &Path) -> anyhow::Result<()> {
    let (files, _) = LocalCerts::create(dir, &["127.0.0.1".into()], 2).map_err(anyhow::Error::msg)?;
    let load = |role| files.load(role).map_err(anyhow::Error::msg);
    let certs = Certs {
        client: load(Role::Client)?,
        admin: load(Role::Admin)?,
        allocsvr: load(Role::AllocSvr)?,
        files,
    };
    CERTS
        .set(certs)
        .map_err(|_| anyhow::anyhow!("TLS set up twice in one process"))
}

/// The `--tls-*` flags of a process holding `role`'s certificate; none without TLS.
pub fn flags(role: Role) -> Vec<String> {
    CERTS.get().map(|c| c.files.flags(role)).unwrap_or_default()
}

/// The workload's certificate.
pub fn client() -> Option<Arc<Tls>> {
    CERTS.get().map(|c| c.client.clone())
}

/// The certificate of the observers that read every section's ceiling (`Load`, an AllocSvr's
/// call) besides status and routes.
pub fn allocsvr() -> Option<Arc<Tls>> {
    CERTS.get().map(|c| c.allocsvr.clone())
}

/// The move driver's certificate.
pub fn admin() -> Option<Arc<Tls>> {
    CERTS.get().map(|c| c.admin.clone())
}
