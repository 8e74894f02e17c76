//! Directories that survive a power loss: creating one syncs the directory that holds it.
//!
//! A new directory's name is an entry in its parent, and like a new file's name it is durable only
//! once the parent is synced. Without that, a power loss right after start-up could take
//! `data_dir/log` (or `meta`, or the data dir itself) away with every segment synced inside it:
//! the files' own `fdatasync`s do not make the names that lead to them durable.
//!
//! Left out: removing directories (nothing here removes one on a path that must survive), and a
//! test of the power loss itself, which a test in a running system cannot produce; the tests check
//! what can be seen from here (every level created, errors returned, not panicked).

use std::fs::File;
use std::io;
use std::path::Path;

/// Syncs a directory, so that the names created, renamed or removed in it are durable.
pub fn sync_dir(dir: &Path) -> io::Result<()> {
    File::open(dir)?.sync_all()
}

/// The directory that holds `path`: its parent, or the current directory for a relative name
/// with no parent part.
fn parent_of(path: &Path) -> &Path {
    match path.parent() {
        Some(p) if !p.as_os_str().is_empty() => p,
        _ => Path::new("."),
    }
}

/// Creates `dir` and any missing directories above it, syncing each new one's parent after it is
/// made, so that every level exists after a power loss. An existing directory is left as it is
/// (nothing is synced); an existing non-directory on the path is an error.
pub fn create_dir_synced(dir: &Path) -> io::Result<()> {
    // The missing levels, deepest first. Bounded by the number of components in `dir`.
    let mut missing = Vec::new();
    let mut at = dir;
    loop {
        match std::fs::metadata(at) {
            Ok(m) if m.is_dir() => break,
            Ok(_) => {
                return Err(io::Error::new(
                    io::ErrorKind::AlreadyExists,
                    format!("{} exists and is not a directory", at.display()),
                ));
            }
            Err(e) if e.kind() == io::ErrorKind::NotFound => {
                missing.push(at);
                match at.parent() {
                    Some(p) if !p.as_os_str().is_empty() => at = p,
                    _ => break,
                }
            }
            Err(e) => return Err(e),
        }
    }
    for level in missing.into_iter().rev() {
        match std::fs::create_dir(level) {
            Ok(()) => {}
            // Made by someone else meanwhile: still sync its name below.
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists && level.is_dir() => {}
            Err(e) => return Err(e),
        }
        sync_dir(parent_of(level))?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nested_missing_levels_are_all_created_and_an_existing_dir_is_accepted() {
        let tmp = tempfile::tempdir().unwrap();
        let deep = tmp.path().join("a").join("b").join("c");
        create_dir_synced(&deep).unwrap();
        assert!(deep.is_dir());
        create_dir_synced(&deep).unwrap();
        create_dir_synced(tmp.path()).unwrap();
    }

    #[test]
    fn a_file_in_the_way_is_an_error_not_a_panic() {
        let tmp = tempfile::tempdir().unwrap();
        let file = tmp.path().join("f");
        std::fs::write(&file, b"x").unwrap();
        let err = create_dir_synced(&file).expect_err("a file where the dir goes");
        assert_eq!(err.kind(), io::ErrorKind::AlreadyExists, "{err}");
        assert!(err.to_string().contains("not a directory"), "{err}");
        let below = create_dir_synced(&file.join("sub")).expect_err("a file above the dir");
        assert!(below.to_string().to_lowercase().contains("not a directory"), "{below}");
    }

    #[test]
    fn a_name_the_file_system_refuses_returns_its_error() {
        let tmp = tempfile::tempdir().unwrap();
        let too_long = tmp.path().join("n".repeat(300)).join("x");
        let err = create_dir_synced(&too_long).expect_err("a 300-byte name");
        assert!(err.raw_os_error().is_some(), "the OS error comes back as it is: {err}");
        assert!(!tmp.path().join("n".repeat(300)).exists());
    }
}
