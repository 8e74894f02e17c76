//! The release and commit every binary reports: `--version`, the build-info metric ([`BUILD_INFO_METRIC`]), and
//! the `version` field of the StoreSvr's Status and the AllocSvr's renewals (so `seqctl status`
//! and `seqctl sets` show a half-done upgrade). The commit comes from `build.rs`.
//!
//! Deliberately left out: whether the work tree had uncommitted changes (knowing it would mean
//! rebuilding on every edit).

/// The release: the workspace version (`Cargo.toml`).
pub const RELEASE: &str = env!("CARGO_PKG_VERSION");

/// The commit built from (12 hex digits), or "unknown" outside git without `SEQSVR_COMMIT`.
pub const COMMIT: &str = env!("SEQSVR_COMMIT");

/// What `--version` prints after the program's name, and what Status and renewals carry.
pub const LONG: &str = concat!(env!("CARGO_PKG_VERSION"), " (commit ", env!("SEQSVR_COMMIT"), ")");

/// The name of the build-info metric: one series, value 1, labelled `version` and `commit`.
pub const BUILD_INFO_METRIC: &str = "seqsvr_build_info";

/// Sets `seqsvr_build_info{version, commit} 1` on the installed recorder (a no-op without one),
/// so a scrape tells which release each process runs.
pub fn record_build_info() {
    metrics::gauge!(BUILD_INFO_METRIC, "version" => RELEASE, "commit" => COMMIT).set(1.0);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn long_names_release_and_commit() {
        assert!(LONG.starts_with(RELEASE));
        assert!(LONG.contains(COMMIT));
        assert!(!COMMIT.is_empty());
    }
}
