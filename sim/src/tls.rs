//! Mutual TLS for `sim run --tls`: a development CA and one certificate per role in the run's
//! data dir, the `--tls-*` flags for every process it starts and for `seqctl`, and the loaded
//! certificates for its own clients (the workload: `client`; observers and moves: `admin`; the
//! replica poller, which reads ceilings with Load: `allocsvr`).
//!
//! Kept process-wide, set once before the first connection: one run per process, and every
//! place that dials (workload, observers, moves, seqctl) then finds it without threading it
//! through each call. Without `--tls` nothing is set and every link stays plaintext.
//!
//! The simulator's proxies relay TCP, so TLS passes through them end to end; every address is
//! on 127.0.0.1, the one host the certificates name.

use std::path::{Path, PathBuf};
use std::sync::{Arc, OnceLock};

use seqsvr_auth::{Role, Tls, TlsArgs};

struct Certs {
    dir: PathBuf,
    client: Arc<Tls>,
    admin: Arc<Tls>,
    allocsvr: Arc<Tls>,
}

static CERTS: OnceLock<Certs> = OnceLock::new();

/// Writes the CA and certificates into `dir` and turns TLS on for this process's clients.
pub fn setup(dir: &Path) -> anyhow::Result<()> {
    seqsvr_auth::devca::write_local(dir, &["127.0.0.1".into()], 2).map_err(anyhow::Error::msg)?;
    let load = |role: Role| -> anyhow::Result<Arc<Tls>> {
        let loaded = args(dir, role).load(Some(role))?;
        Ok(Arc::new(loaded.expect("all three files given")))
    };
    let certs = Certs {
        dir: dir.to_owned(),
        client: load(Role::Client)?,
        admin: load(Role::Admin)?,
        allocsvr: load(Role::AllocSvr)?,
    };
    CERTS
        .set(certs)
        .map_err(|_| anyhow::anyhow!("TLS set up twice in one process"))
}

fn args(dir: &Path, role: Role) -> TlsArgs {
    let (cert, key) = seqsvr_auth::devca::paths(dir, role);
    TlsArgs {
        tls_ca: Some(dir.join("ca.pem")),
        tls_cert: Some(cert),
        tls_key: Some(key),
    }
}

/// The `--tls-*` flags of a process holding `role`'s certificate; none without TLS.
pub fn flags(role: Role) -> Vec<String> {
    let Some(c) = CERTS.get() else {
        return Vec::new();
    };
    let a = args(&c.dir, role);
    let path = |p: Option<PathBuf>| p.expect("set").display().to_string();
    vec![
        format!("--tls-ca={}", path(a.tls_ca)),
        format!("--tls-cert={}", path(a.tls_cert)),
        format!("--tls-key={}", path(a.tls_key)),
    ]
}

/// The workload's certificate.
pub fn client() -> Option<Arc<Tls>> {
    CERTS.get().map(|c| c.client.clone())
}

/// The certificate of the observer that reads every section's ceiling at the end (`Load`, which
/// only AllocSvrs may call).
pub fn allocsvr() -> Option<Arc<Tls>> {
    CERTS.get().map(|c| c.allocsvr.clone())
}

/// The observers' and the move driver's certificate.
pub fn admin() -> Option<Arc<Tls>> {
    CERTS.get().map(|c| c.admin.clone())
}
