//! A module's `//!` doc is the first thing a newcomer reads, so it must not name what is gone:
//!
//! - a file path (a word with a `/` and an extension such as `.rs`) must exist, from the
//!   repository's root, the crate's folder, its `src/` or the file's own folder;
//! - a crate name (`seqsvr-proto`, `seqsvr_proto`) must be a package of the workspace, or a name
//!   the code itself uses in a string (a header such as `seqsvr-map-version`), and a path into a
//!   package (`seqsvr_proto::limits`) must start at one of its modules or root items;
//! - a `crate::name` path must start at a module or an item of the crate's root.
//!
//! Deliberately left out: what rustdoc checks itself (the targets of intra-doc links), and prose
//! that describes what is gone without naming it.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// Names a `//!` doc may use besides the workspace's packages.
const KNOWN_NAMES: [&str; 1] = ["seqsvr-rs"];

/// What the module docs of a repository may name.
pub struct Names {
    /// Package names, `-` spelled as in the manifest, and their folders.
    packages: BTreeMap<String, PathBuf>,
    /// `seqsvr-…` words found in string literals of the code.
    in_strings: BTreeSet<String>,
}

impl Names {
    pub fn read(repo: &Path, rust_files: &[PathBuf]) -> Names {
        let mut packages = BTreeMap::new();
        for manifest in crate::files_with(repo, "toml") {
            if manifest.file_name().is_some_and(|n| n == "Cargo.toml")
                && let Ok(text) = std::fs::read_to_string(&manifest)
                && let Some(name) = package_name(&text)
            {
                packages.insert(name, manifest.parent().map(Path::to_path_buf).unwrap_or_default());
            }
        }
        let mut in_strings = BTreeSet::new();
        for file in rust_files {
            let Ok(text) = std::fs::read_to_string(file) else {
                continue;
            };
            for (at, _) in text.match_indices("\"seqsvr-") {
                in_strings.insert(word_at(&text[at + 1..]).to_string());
            }
        }
        Names { packages, in_strings }
    }

    fn knows(&self, word: &str) -> bool {
        let dashed = word.replace('_', "-");
        self.packages.contains_key(&dashed) || self.in_strings.contains(word) || KNOWN_NAMES.contains(&word)
    }
}

fn package_name(manifest: &str) -> Option<String> {
    let package = manifest.split("[package]").nth(1)?;
    let line = package.lines().find(|l| l.trim_start().starts_with("name"))?;
    Some(line.split('"').nth(1)?.to_string())
}

/// The crate name, file path or module path that starts `text`.
fn word_at(text: &str) -> &str {
    let end = text
        .find(|c: char| !(c.is_ascii_alphanumeric() || "_-./:".contains(c)))
        .unwrap_or(text.len());
    text[..end].trim_end_matches(['.', ':', '-'])
}

/// What is wrong with the `//!` docs of `file` (relative name `name`) whose text is `text`.
pub fn check(repo: &Path, file: &Path, name: &str, text: &str, names: &Names) -> Vec<String> {
    let mut problems = Vec::new();
    let crate_dir = crate_dir(file);
    // A module's doc is the `//!` lines at the top of its file, before any item.
    let head = text.lines().enumerate().take_while(|(_, l)| {
        let l = l.trim_start();
        l.is_empty() || l.starts_with("//") || l.starts_with("#![")
    });
    for (n, line) in head {
        let Some(doc) = line.trim_start().strip_prefix("//!") else {
            continue;
        };
        let at = format!("{name}:{}", n + 1);
        for (pos, _) in doc.match_indices("seqsvr") {
            if doc[..pos].ends_with(|c: char| c.is_ascii_alphanumeric() || "/-_".contains(c)) {
                continue;
            }
            let path = word_at(&doc[pos..]);
            let mut segments = path.split("::");
            let word = segments.next().unwrap_or(path);
            if !(word.starts_with("seqsvr-") || word.starts_with("seqsvr_")) {
                continue;
            }
            if !names.knows(word) {
                problems.push(format!(
                    "{at}: `{word}` is not a package of this workspace: name the crate as its \
                     Cargo.toml does today"
                ));
            } else if let (Some(dir), Some(module)) = (names.packages.get(&word.replace('_', "-")), segments.next())
                && !module.is_empty()
                && !crate_has(dir, module)
            {
                problems.push(format!(
                    "{at}: `{word}::{module}` names no module or root item of that crate: name \
                     where it lives now"
                ));
            }
        }
        for path in file_paths(doc) {
            let candidates = [
                repo.join(path),
                crate_dir.join(path),
                crate_dir.join("src").join(path),
                file.parent().unwrap_or(repo).join(path),
            ];
            if !candidates.iter().any(|c| c.exists()) {
                problems.push(format!(
                    "{at}: `{path}` does not exist: name the file that holds it now"
                ));
            }
        }
        for (pos, _) in doc.match_indices("crate::") {
            let first = word_at(&doc[pos + 7..]).split("::").next().unwrap_or("");
            if !first.is_empty() && !crate_has(&crate_dir, first) {
                problems.push(format!(
                    "{at}: `crate::{first}` is neither a module nor an item of the crate's root: \
                     name what exists now"
                ));
            }
        }
    }
    problems
}

/// The words of `doc` that are relative file paths: a `/` and a known extension.
fn file_paths(doc: &str) -> Vec<&str> {
    let mut out = Vec::new();
    for (pos, c) in doc.char_indices() {
        let starts = pos == 0 || !doc[..pos].ends_with(|p: char| p.is_ascii_alphanumeric() || "_-./".contains(p));
        if !starts || !(c.is_ascii_alphanumeric() || c == '.' || c == '_') {
            continue;
        }
        let word = word_at(&doc[pos..]);
        let word = word.split("::").next().unwrap_or(word);
        let has_ext = [".rs", ".md", ".proto", ".toml", ".sh", ".py", ".json", ".yml"]
            .iter()
            .any(|e| word.ends_with(e));
        if has_ext && word.contains('/') && !word.contains("//") {
            out.push(word);
        }
    }
    out
}

/// The folder of the package that holds `file`: the nearest with a `Cargo.toml`.
fn crate_dir(file: &Path) -> PathBuf {
    let mut dir = file.parent();
    while let Some(d) = dir {
        if d.join("Cargo.toml").exists() {
            return d.to_path_buf();
        }
        dir = d.parent();
    }
    PathBuf::new()
}

/// Whether the crate in `dir` has a module `name` under `src/` or names it in its root file.
fn crate_has(dir: &Path, name: &str) -> bool {
    let src = dir.join("src");
    if src.join(format!("{name}.rs")).exists() || src.join(name).is_dir() {
        return true;
    }
    ["lib.rs", "main.rs"].iter().any(|root| {
        std::fs::read_to_string(src.join(root)).is_ok_and(|text| {
            crate::source::tokens(&crate::source::blank(&text))
                .iter()
                .any(|t| t.text == name)
        })
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stale_names_are_found() {
        let repo = std::env::temp_dir().join(format!("tidy-docs-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&repo);
        std::fs::create_dir_all(repo.join("a/src/b")).unwrap();
        std::fs::write(repo.join("a/Cargo.toml"), "[package]\nname = \"seqsvr-a\"\n").unwrap();
        std::fs::write(repo.join("a/src/lib.rs"), "mod b;\npub struct Root;\n").unwrap();
        std::fs::write(repo.join("a/src/b/c.rs"), "").unwrap();
        let file = repo.join("a/src/b.rs");
        let text = "//! Uses `seqsvr-a` (`seqsvr_a::Root`, `seqsvr_a::b`) and `seqsvr-gone`, the `seqsvr-x-hdr` header; `seqsvr-a::serving`.\n\
                    //! See a/src/b/c.rs, src/b/c.rs, b/c.rs and a/src/old.rs (in seqsvr-rs).\n\
                    //! `crate::b`, `crate::Root`, `crate::old::f`.\n";
        std::fs::write(&file, text).unwrap();
        std::fs::write(repo.join("a/src/h.rs"), "const H: &str = \"seqsvr-x-hdr\";").unwrap();
        let names = Names::read(&repo, &crate::rust_files(&repo));
        let problems = check(&repo, &file, "a/src/b.rs", text, &names);
        assert_eq!(problems.len(), 4, "{problems:#?}");
        assert!(problems[0].contains("`seqsvr-gone` is not a package"));
        assert!(problems[1].contains("`seqsvr-a::serving` names no module"));
        assert!(problems[2].contains("`a/src/old.rs` does not exist"));
        assert!(problems[3].contains("`crate::old`"));
        std::fs::remove_dir_all(repo).unwrap();
    }
}
