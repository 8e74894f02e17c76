//! The house rules of this repository, checked from the text of the tree the way TigerBeetle's
//! `tidy.zig` checks its own: a rule that lives only in a review is a rule that slips.
//!
//! - [`source`]: Rust text with comments and literals blanked out, and the items found in it.
//! - [`modules`]: no import circle between the files of one crate.
//! - [`functions`]: no non-test function over [`functions::MAX_LINES`] lines, except the ones on
//!   the exception list, which can only shrink.
//! - [`manuals`]: every manual under its line cap, without commit hashes, dated headings or
//!   machine paths, and every relative link resolving.
//! - [`module_docs`]: `//!` docs that name only files and crates that exist.
//!
//! `tests/tidy.rs` runs every rule on the workspace; each failure says what to do about it.
//!
//! Deliberately left out: a Rust parser (the rules read tokens, not a syntax tree, so macros that
//! generate functions or modules are not seen), tests and examples in the circle rule (each is a
//! crate of one file or two), and any rule that rustfmt or clippy already enforce.

pub mod functions;
pub mod manuals;
pub mod module_docs;
pub mod modules;
pub mod source;

use std::path::{Path, PathBuf};

/// Every `.rs` file under `root`, skipping build output and hidden folders, sorted.
pub fn rust_files(root: &Path) -> Vec<PathBuf> {
    files_with(root, "rs")
}

/// Every file under `root` whose extension is `ext`, skipping build output and hidden folders.
pub fn files_with(root: &Path, ext: &str) -> Vec<PathBuf> {
    let mut out = Vec::new();
    let mut stack = vec![root.to_path_buf()];
    while let Some(dir) = stack.pop() {
        let Ok(entries) = std::fs::read_dir(&dir) else {
            continue;
        };
        for entry in entries.flatten() {
            let path = entry.path();
            let name = entry.file_name().to_string_lossy().into_owned();
            if path.is_dir() {
                if !(name.starts_with('.') || name == "target" || name == "data") {
                    stack.push(path);
                }
            } else if path.extension().is_some_and(|e| e == ext) {
                out.push(path);
            }
        }
    }
    out.sort();
    out
}

/// `path` relative to `root`, with `/` separators, for messages and the exception list.
pub fn relative(root: &Path, path: &Path) -> String {
    let rel = path.strip_prefix(root).unwrap_or(path);
    rel.components()
        .map(|c| c.as_os_str().to_string_lossy())
        .collect::<Vec<_>>()
        .join("/")
}
