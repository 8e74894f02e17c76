//! `seqctl backup --out FILE`: a consistent backup of the set `--store` names, from its leader.
//!
//! The file is checked (length, version, checksum) before anything is written, then written
//! beside its final name, synced, renamed over it and the directory synced: a crash or a cut
//! stream leaves the old file (or none), never a part of a new one under the final name.
//!
//! One call is one attempt at a whole stream per replica: `--timeout-ms` bounds the call and each
//! attempt, so give a large set more than the default five seconds.
//!
//! Left out: keeping several generations (name the files by date in the calling script).

use std::io::Write;
use std::path::{Path, PathBuf};
use std::time::Duration;

use clap::Args;
use seqsvr_control::{BackupClient, StoreTimeouts};
use seqsvr_proto::backup::{self, Header};
use serde_json::json;

use crate::{Cli, EXIT_FAILED, Failure, store_seeds};

#[derive(Args, Debug)]
pub(crate) struct BackupArgs {
    /// Where to write the backup file; replaced atomically if it exists.
    #[arg(long, value_name = "FILE")]
    out: PathBuf,
}

fn failed(message: String) -> Failure {
    Failure {
        code: EXIT_FAILED,
        message,
    }
}

/// Takes a backup from the leader and writes it to `--out`.
pub(crate) async fn backup(cli: &Cli, args: &BackupArgs) -> Result<String, Failure> {
    let whole = Duration::from_millis(cli.timeout_ms);
    let timeouts = StoreTimeouts {
        attempt: whole,
        overall: whole,
    };
    let client =
        BackupClient::with_dialer(store_seeds(cli)?, timeouts, &crate::dialer(cli)?).map_err(Failure::usage)?;
    let file = client.backup().await?;
    let (header, _) =
        backup::decode(&file).map_err(|e| failed(format!("the leader sent a backup that does not check out: {e}")))?;
    write_atomically(&args.out, &file).map_err(|e| failed(format!("cannot write {}: {e}", args.out.display())))?;
    Ok(render(cli.json, &args.out, &header, file.len()))
}

/// Writes `bytes` to `path` through a synced temp file in the same directory and a rename.
fn write_atomically(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    let dir = path
        .parent()
        .filter(|p| !p.as_os_str().is_empty())
        .unwrap_or(Path::new("."));
    let name = path
        .file_name()
        .ok_or_else(|| std::io::Error::other("--out names no file"))?;
    let tmp = dir.join(format!(".{}.tmp.{}", name.to_string_lossy(), std::process::id()));
    let written = (|| {
        let mut f = std::fs::OpenOptions::new().write(true).create_new(true).open(&tmp)?;
        f.write_all(bytes)?;
        f.sync_all()?;
        std::fs::rename(&tmp, path)?;
        std::fs::File::open(dir)?.sync_all()
    })();
    if written.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    written
}

fn render(as_json: bool, out: &Path, h: &Header, bytes: usize) -> String {
    if as_json {
        return json!({
            "file": out.display().to_string(),
            "bytes": bytes,
            "set_id": h.set_id,
            "log_index": h.log_index,
            "log_term": h.log_term,
            "taken_at_unix_ms": h.taken_at_unix_ms,
            "sections": h.sections,
            "format_version": backup::FORMAT_VERSION,
            "state_format": h.state_format,
        })
        .to_string();
    }
    format!(
        "wrote {} ({bytes} bytes): set {}, {} sections, log index {} (term {}), taken at {} ms since the Unix epoch",
        out.display(),
        h.set_id,
        h.sections,
        h.log_index,
        h.log_term,
        h.taken_at_unix_ms
    )
}
