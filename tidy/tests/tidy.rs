//! The house rules, run on this repository (see the crate's docs for each rule). A failure lists
//! every problem with what to do about it; fix them rather than widen a rule.

use std::path::{Path, PathBuf};

use seqsvr_tidy::{functions, manuals, module_docs, modules, relative, rust_files};

/// The exception list of the function-length rule, relative to the repository's root.
const LONG_FUNCTIONS: &str = "tidy/long-functions.txt";

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("tidy/ sits in the repository")
        .into()
}

fn report(rule: &str, problems: Vec<String>) {
    assert!(
        problems.is_empty(),
        "{rule}: {} problem(s)\n  {}\n",
        problems.len(),
        problems.join("\n  ")
    );
}

#[test]
fn no_import_circle_inside_a_crate() {
    let repo = repo();
    let mut problems = Vec::new();
    for root in modules::crate_roots(&repo) {
        for (files, arrows) in modules::Crate::read(&repo, &root).circles() {
            let mut text = format!(
                "a circle of {} files: {}. Each arrow below is a name one file takes from \
                 another; remove one (move the item down into a module both can use, or pass \
                 it in) so the files form layers:",
                files.len(),
                files.join(", ")
            );
            for a in arrows {
                text.push_str(&format!("\n    {}:{} -> {} via {}", a.from, a.line, a.to, a.via));
            }
            problems.push(text);
        }
    }
    report("import circles", problems);
}

/// Files that are tests, whose functions are not measured.
fn is_test_file(name: &str) -> bool {
    name.contains("/tests/") || name.starts_with("tests/")
}

#[test]
fn no_long_function_outside_the_shrinking_list() {
    let repo = repo();
    let mut found = Vec::new();
    let files = rust_files(&repo);
    let test_modules = modules::test_module_files(&repo, &files);
    for file in files {
        let name = relative(&repo, &file);
        if is_test_file(&name) || test_modules.contains(&name) {
            continue;
        }
        let text = std::fs::read_to_string(&file).expect("read a source file");
        found.extend(functions::long_functions(&name, &text));
    }
    let list = std::fs::read_to_string(repo.join(LONG_FUNCTIONS)).expect("read the list");
    let exceptions = functions::parse_exceptions(&list).expect("the list parses");
    report("long functions", functions::judge(&found, &exceptions, LONG_FUNCTIONS));
}

#[test]
fn manuals_are_short_current_and_linked() {
    let repo = repo();
    let mut problems = Vec::new();
    for name in manuals::manuals(&repo) {
        let text = std::fs::read_to_string(repo.join(&name)).expect("read a manual");
        problems.extend(manuals::check(&repo, &name, &text));
    }
    report("manuals", problems);
}

#[test]
fn module_docs_name_what_exists() {
    let repo = repo();
    let files = rust_files(&repo);
    let names = module_docs::Names::read(&repo, &files);
    let mut problems = Vec::new();
    for file in &files {
        let name = relative(&repo, file);
        let text = std::fs::read_to_string(file).expect("read a source file");
        problems.extend(module_docs::check(&repo, file, &name, &text, &names));
    }
    report("module docs", problems);
}
