//! `seqctl certs`: a development CA and one certificate per role, for a local cluster.
//!
//! Left out: anything for production (a real deployment brings its own CA; see docs/TLS.md).

use serde_json::json;

use crate::{EXIT_FAILED, Failure};

/// `seqctl certs`: a development CA and one certificate per role.
pub(crate) fn certs(json: bool, out: &std::path::Path, hosts: &[String], days: i64) -> Result<String, Failure> {
    if !(1..=3650).contains(&days) {
        return Err(Failure::usage("--days must be in 1..=3650"));
    }
    let (_, written) = seqsvr_auth::devca::write_local(out, hosts, days).map_err(|e| Failure {
        code: EXIT_FAILED,
        message: e,
    })?;
    let files: Vec<String> = written.iter().map(|p| p.display().to_string()).collect();
    if json {
        return Ok(json!({ "files": files, "hosts": hosts, "days": days }).to_string());
    }
    Ok(format!(
        "wrote a development CA and certificates for {} (valid {days} days):\n  {}",
        hosts.join(", "),
        files.join("\n  ")
    ))
}
