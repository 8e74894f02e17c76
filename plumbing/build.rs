//! Stamps every binary with the commit it was built from (`version.rs`): `SEQSVR_COMMIT` from the
//! environment when set (a build outside git, e.g. from a source tarball), else `git rev-parse`,
//! else "unknown". Reruns only when HEAD or the branch it points at moves, not on every build.

use std::path::{Path, PathBuf};
use std::process::Command;

fn git(dir: &Path, args: &[&str]) -> Option<String> {
    let out = Command::new("git").arg("-C").arg(dir).args(args).output().ok()?;
    let s = String::from_utf8(out.stdout).ok()?.trim().to_owned();
    (out.status.success() && !s.is_empty()).then_some(s)
}

fn main() {
    println!("cargo:rerun-if-env-changed=SEQSVR_COMMIT");
    let commit = match std::env::var("SEQSVR_COMMIT") {
        Ok(c) if !c.trim().is_empty() => c.trim().to_owned(),
        _ => from_git().unwrap_or_else(|| "unknown".into()),
    };
    println!("cargo:rustc-env=SEQSVR_COMMIT={commit}");
}

/// The short commit of HEAD, and the files whose change means another commit: HEAD itself (a
/// checkout), the branch's ref file and packed-refs (a commit on the branch). A worktree has its
/// own HEAD under `--git-dir` and shares the refs under `--git-common-dir`.
fn from_git() -> Option<String> {
    let here = PathBuf::from(std::env::var_os("CARGO_MANIFEST_DIR")?);
    let commit = git(&here, &["rev-parse", "--short=12", "HEAD"])?;
    let abs = |p: String| {
        if Path::new(&p).is_absolute() {
            PathBuf::from(p)
        } else {
            here.join(p)
        }
    };
    let git_dir = abs(git(&here, &["rev-parse", "--git-dir"])?);
    let common = git(&here, &["rev-parse", "--git-common-dir"]).map_or_else(|| git_dir.clone(), abs);
    let head = git_dir.join("HEAD");
    watch(&head);
    if let Ok(text) = std::fs::read_to_string(&head)
        && let Some(branch) = text.trim().strip_prefix("ref: ")
    {
        watch(&common.join(branch));
        watch(&common.join("packed-refs"));
    }
    Some(commit)
}

/// Reruns this script when `path` changes. Only an existing file: cargo takes a missing one as
/// changed on every build, and would rebuild every crate that depends on this one each time.
fn watch(path: &Path) {
    if path.exists() {
        println!("cargo:rerun-if-changed={}", path.display());
    }
}
