//! No import circle between the files of one crate. A circle means no file in it can be read,
//! tested or moved without the others: the layers the folders promise are not there.
//!
//! The crate's module tree is followed from its root (`lib.rs`, `main.rs` or a file of `bin/`)
//! through its `mod name;` lines. An arrow goes from a file to the file that defines what it names: every path that starts at `crate`, `self`, `super`, a module the file
//! imported, or a child module (in `use` lines and in code), taken as deep as it names modules,
//! and through `pub use` re-exports to the file that holds the item. Test code is left out: a
//! test reaches wherever it must. So is an arrow up to an ancestor (`super::Thing` in a child of
//! the module that declares `Thing`): a parent module is the room its children live in, and a
//! circle through it is the room's own business; circles between siblings, or across rooms, are
//! what the rule is for.
//!
//! Deliberately left out: `#[path]` modules, macros, and names brought in by glob re-exports
//! (`pub use x::*` points at the module that re-exports, not through it).

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::path::{Path, PathBuf};

use crate::source::{Source, Token, closing};

/// A module of a crate: its path from the crate root and the file that holds it.
#[derive(Clone, Debug)]
struct Module {
    file: usize,
}

/// A file of a crate, read.
struct File {
    /// Relative to the repository's root.
    name: String,
    /// The module path of the file's own module (`[]` for the root).
    path: Vec<String>,
    src: Source,
}

/// One crate's files and modules.
pub struct Crate {
    files: Vec<File>,
    /// Module path → module; inline modules map to the file that holds them.
    modules: BTreeMap<Vec<String>, Module>,
}

/// One arrow: `from` names something that `to` defines.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct Arrow {
    pub from: String,
    pub to: String,
    /// The path as written, and its line.
    pub via: String,
    pub line: usize,
}

impl Crate {
    /// Reads the crate whose root file is `root_file`; `repo` is the repository's root (for the
    /// names in messages).
    pub fn read(repo: &Path, root_file: &Path) -> Crate {
        let mut c = Crate {
            files: Vec::new(),
            modules: BTreeMap::new(),
        };
        c.add_file(repo, root_file.to_path_buf(), Vec::new(), true);
        c
    }

    fn add_file(&mut self, repo: &Path, file: PathBuf, path: Vec<String>, owns_dir: bool) {
        let Ok(text) = std::fs::read_to_string(&file) else {
            return;
        };
        let src = Source::new(&text);
        let index = self.files.len();
        self.modules.insert(path.clone(), Module { file: index });
        // Children live beside the root or a `mod.rs`, and under `name/` for `name.rs`.
        let dir = if owns_dir {
            file.parent().map(Path::to_path_buf).unwrap_or_default()
        } else {
            file.with_extension("")
        };
        let mut children = Vec::new();
        let mut inline = Vec::new();
        module_declarations(&src, &path, &mut children, &mut inline);
        self.files.push(File {
            name: crate::relative(repo, &file),
            path: path.clone(),
            src,
        });
        for inner in inline {
            self.modules.insert(inner, Module { file: index });
        }
        for (name, child_path) in children {
            let flat = dir.join(format!("{name}.rs"));
            let nested = dir.join(&name).join("mod.rs");
            if flat.exists() {
                self.add_file(repo, flat, child_path, false);
            } else if nested.exists() {
                self.add_file(repo, nested, child_path, true);
            }
        }
    }

    /// Every arrow between two different files of the crate.
    pub fn arrows(&self) -> Vec<Arrow> {
        let mut out = BTreeSet::new();
        for (index, file) in self.files.iter().enumerate() {
            for (path, line) in self.paths_of(file) {
                let Some(to) = self.resolve_file(&path, 0) else {
                    continue;
                };
                // An arrow up to an ancestor is not counted: the parent module is the room its
                // children live in, and what it declares is theirs to use.
                let upward = file.path.starts_with(&self.files[to].path);
                if to != index && !upward {
                    out.insert(Arrow {
                        from: file.name.clone(),
                        to: self.files[to].name.clone(),
                        via: path.join("::"),
                        line,
                    });
                }
            }
        }
        out.into_iter().collect()
    }

    /// The absolute module paths (from the crate root) named in a file's non-test code, with the
    /// line each was named on.
    fn paths_of(&self, file: &File) -> Vec<(Vec<String>, usize)> {
        let t = &file.src.tokens;
        let mut out = Vec::new();
        let mut aliases: HashMap<String, Vec<String>> = HashMap::new();
        let scopes = scopes(&file.src, &file.path);
        let mut i = 0;
        while i < t.len() {
            if file.src.in_test[i] {
                i += 1;
                continue;
            }
            let here = &scopes[i];
            if t[i].text == "use" && (i == 0 || t[i - 1].text != "::") {
                let end = (i..t.len()).find(|&k| t[k].text == ";").unwrap_or(t.len() - 1);
                for (written, alias) in use_tree(&t[i + 1..end]) {
                    if let Some(abs) = self.absolute(&written, here, &aliases) {
                        out.push((abs.clone(), t[i].line));
                        if let Some(name) = alias {
                            aliases.insert(name, abs);
                        }
                    }
                }
                i = end + 1;
                continue;
            }
            // A path in code: `a::b::c` not preceded by `::` (which would make it a tail).
            if is_ident(&t[i].text) && t.get(i + 1).is_some_and(|n| n.text == "::") && (i == 0 || t[i - 1].text != "::")
            {
                let mut written = vec![t[i].text.clone()];
                let mut k = i + 1;
                while k + 1 < t.len() && t[k].text == "::" && is_ident(&t[k + 1].text) {
                    written.push(t[k + 1].text.clone());
                    k += 2;
                }
                if let Some(abs) = self.absolute(&written, here, &aliases) {
                    out.push((abs, t[i].line));
                }
                i = k;
                continue;
            }
            i += 1;
        }
        out
    }

    /// `written` as a path from the crate root, when it starts at something of this crate.
    fn absolute(
        &self,
        written: &[String],
        here: &[String],
        aliases: &HashMap<String, Vec<String>>,
    ) -> Option<Vec<String>> {
        let first = written.first()?.as_str();
        let mut base: Vec<String> = match first {
            "crate" => Vec::new(),
            "self" => here.to_vec(),
            "super" => {
                let mut p = here.to_vec();
                p.pop();
                p
            }
            "Self" => return None,
            _ => {
                if let Some(a) = aliases.get(first) {
                    a.clone()
                } else {
                    let mut child = here.to_vec();
                    child.push(first.to_string());
                    if !self.modules.contains_key(&child) {
                        return None;
                    }
                    child
                }
            }
        };
        for seg in &written[1..] {
            if seg == "super" {
                base.pop();
            } else if seg != "self" {
                base.push(seg.clone());
            }
        }
        Some(base)
    }

    /// The file that defines what `path` names: the deepest module on the path, or, through a
    /// `pub use` there, where the name comes from.
    fn resolve_file(&self, path: &[String], depth: usize) -> Option<usize> {
        let mut deepest = None;
        let mut k = 0;
        for n in 0..=path.len() {
            if let Some(m) = self.modules.get(&path[..n]) {
                deepest = Some(m.file);
                k = n;
            } else {
                break;
            }
        }
        let file = deepest?;
        if depth < 8
            && let Some(name) = path.get(k)
            && let Some(source) = self.reexport(file, &path[..k], name)
        {
            return self.resolve_file(&source, depth + 1).or(Some(file));
        }
        Some(file)
    }

    /// Where the module `module` (held in `file`) re-exports `name` from, if it does.
    fn reexport(&self, file: usize, module: &[String], name: &str) -> Option<Vec<String>> {
        let f = &self.files[file];
        let t = &f.src.tokens;
        let empty = HashMap::new();
        for i in 0..t.len() {
            if t[i].text != "use" || f.src.in_test[i] || !is_pub_before(t, i) {
                continue;
            }
            let end = (i..t.len()).find(|&k| t[k].text == ";").unwrap_or(t.len() - 1);
            for (written, alias) in use_tree(&t[i + 1..end]) {
                if alias.as_deref() == Some(name) {
                    return self.absolute(&written, module, &empty);
                }
            }
        }
        None
    }

    /// The import circles: each a sorted list of files, and the arrows inside it.
    pub fn circles(&self) -> Vec<(Vec<String>, Vec<Arrow>)> {
        let arrows = self.arrows();
        let mut graph: BTreeMap<&str, BTreeSet<&str>> = BTreeMap::new();
        for a in &arrows {
            graph.entry(&a.from).or_default().insert(&a.to);
            graph.entry(&a.to).or_default();
        }
        strongly_connected(&graph)
            .into_iter()
            .filter(|c| c.len() > 1)
            .map(|c| {
                let inside: Vec<Arrow> = arrows
                    .iter()
                    .filter(|a| c.contains(&a.from) && c.contains(&a.to))
                    .cloned()
                    .collect();
                (c, inside)
            })
            .collect()
    }
}

fn is_ident(s: &str) -> bool {
    s.chars().next().is_some_and(|c| c.is_alphabetic() || c == '_')
}

/// Whether the `use` at `i` is `pub use` or `pub(…) use`.
fn is_pub_before(t: &[Token], i: usize) -> bool {
    match i.checked_sub(1).map(|k| t[k].text.as_str()) {
        Some("pub") => true,
        Some(")") => (0..i)
            .rev()
            .find(|&k| t[k].text == "(")
            .is_some_and(|k| k > 0 && t[k - 1].text == "pub"),
        _ => false,
    }
}

/// The paths a `use` tree names (its tokens between `use` and `;`), each with the name it binds
/// (`None` for a glob).
fn use_tree(t: &[Token]) -> Vec<(Vec<String>, Option<String>)> {
    let mut out = Vec::new();
    walk_tree(t, &mut Vec::new(), &mut out);
    out
}

fn walk_tree(t: &[Token], prefix: &mut Vec<String>, out: &mut Vec<(Vec<String>, Option<String>)>) {
    let depth = prefix.len();
    let mut i = 0;
    while i < t.len() {
        match t[i].text.as_str() {
            "{" => {
                let close = closing(t, i);
                // Split the group at its top-level commas.
                let mut start = i + 1;
                let mut k = i + 1;
                while k <= close {
                    let at_end = k == close;
                    if at_end || t[k].text == "," {
                        if start < k {
                            walk_tree(&t[start..k], prefix, out);
                        }
                        start = k + 1;
                    } else if t[k].text == "{" {
                        k = closing(t, k);
                    }
                    k += 1;
                }
                prefix.truncate(depth);
                return;
            }
            "*" => {
                out.push((prefix.clone(), None));
                prefix.truncate(depth);
                return;
            }
            "as" => {
                let name = t.get(i + 1).map(|n| n.text.clone()).filter(|n| n != "_");
                out.push((prefix.clone(), name));
                prefix.truncate(depth);
                return;
            }
            "::" => {}
            word if is_ident(word) && word != "pub" => {
                prefix.push(word.to_string());
            }
            _ => {}
        }
        i += 1;
    }
    if prefix.len() > depth {
        let last = prefix.last().cloned();
        let name = if last.as_deref() == Some("self") {
            prefix.pop();
            prefix.last().cloned()
        } else {
            last
        };
        out.push((prefix.clone(), name));
    }
    prefix.truncate(depth);
}

/// The `mod name;` lines of a file (children in files) and its inline `mod name { … }` blocks,
/// test modules left out.
fn module_declarations(
    src: &Source,
    here: &[String],
    children: &mut Vec<(String, Vec<String>)>,
    inline: &mut Vec<Vec<String>>,
) {
    let t = &src.tokens;
    let scopes = scopes(src, here);
    for i in 0..t.len() {
        if t[i].text != "mod" || src.in_test[i] || (i > 0 && t[i - 1].text == "::") {
            continue;
        }
        let Some(name) = t.get(i + 1).filter(|n| is_ident(&n.text)) else {
            continue;
        };
        let mut path = scopes[i].clone();
        path.push(name.text.clone());
        match t.get(i + 2).map(|n| n.text.as_str()) {
            Some(";") => children.push((name.text.clone(), path)),
            Some("{") => inline.push(path),
            _ => {}
        }
    }
}

/// For each token, the module path it is in (the file's, or an inline module's inside it).
fn scopes(src: &Source, here: &[String]) -> Vec<Vec<String>> {
    let t = &src.tokens;
    let mut out = Vec::with_capacity(t.len());
    // (module path, the index of the brace that closes it)
    let mut stack: Vec<(Vec<String>, usize)> = vec![(here.to_vec(), usize::MAX)];
    for i in 0..t.len() {
        while stack.last().is_some_and(|(_, close)| *close < i) {
            stack.pop();
        }
        out.push(stack.last().map(|(p, _)| p.clone()).unwrap_or_default());
        if t[i].text == "mod"
            && let Some(name) = t.get(i + 1)
            && t.get(i + 2).is_some_and(|b| b.text == "{")
        {
            let mut path = stack.last().map(|(p, _)| p.clone()).unwrap_or_default();
            path.push(name.text.clone());
            stack.push((path, closing(t, i + 2)));
        }
    }
    out
}

/// Tarjan's strongly connected components, each sorted.
fn strongly_connected(graph: &BTreeMap<&str, BTreeSet<&str>>) -> Vec<Vec<String>> {
    struct State<'a> {
        index: HashMap<&'a str, usize>,
        low: HashMap<&'a str, usize>,
        on_stack: BTreeSet<&'a str>,
        stack: Vec<&'a str>,
        next: usize,
        out: Vec<Vec<String>>,
    }
    fn visit<'a>(v: &'a str, g: &BTreeMap<&'a str, BTreeSet<&'a str>>, s: &mut State<'a>) {
        s.index.insert(v, s.next);
        s.low.insert(v, s.next);
        s.next += 1;
        s.stack.push(v);
        s.on_stack.insert(v);
        for &w in &g[v] {
            if !s.index.contains_key(w) {
                visit(w, g, s);
                let low = s.low[v].min(s.low[w]);
                s.low.insert(v, low);
            } else if s.on_stack.contains(w) {
                let low = s.low[v].min(s.index[w]);
                s.low.insert(v, low);
            }
        }
        if s.low[v] == s.index[v] {
            let mut component = Vec::new();
            while let Some(w) = s.stack.pop() {
                s.on_stack.remove(w);
                component.push(w.to_string());
                if w == v {
                    break;
                }
            }
            component.sort();
            s.out.push(component);
        }
    }
    let mut s = State {
        index: HashMap::new(),
        low: HashMap::new(),
        on_stack: BTreeSet::new(),
        stack: Vec::new(),
        next: 0,
        out: Vec::new(),
    };
    for &v in graph.keys() {
        if !s.index.contains_key(v) {
            visit(v, graph, &mut s);
        }
    }
    s.out
}

/// The files that are test modules (`#[cfg(test)] mod name;` in the file that declares them), and
/// the files they declare in turn, relative to `repo`.
pub fn test_module_files(repo: &Path, rust_files: &[PathBuf]) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    for file in rust_files {
        let Ok(text) = std::fs::read_to_string(file) else {
            continue;
        };
        let src = Source::new(&text);
        let t = &src.tokens;
        let owns_dir = file
            .file_name()
            .is_some_and(|n| n == "mod.rs" || n == "lib.rs" || n == "main.rs");
        let dir = if owns_dir {
            file.parent().map(Path::to_path_buf).unwrap_or_default()
        } else {
            file.with_extension("")
        };
        for i in 0..t.len() {
            let declared = t[i].text == "mod" && src.in_test[i] && t.get(i + 2).is_some_and(|n| n.text == ";");
            if !declared {
                continue;
            }
            let name = &t[i + 1].text;
            for child in [dir.join(format!("{name}.rs")), dir.join(name).join("mod.rs")] {
                if child.exists() {
                    let rel = crate::relative(repo, &child);
                    out.insert(rel.clone());
                    // What a test module declares is test code too.
                    let below = child.with_extension("");
                    let folder = if child.ends_with("mod.rs") {
                        child.parent().map(Path::to_path_buf)
                    } else {
                        Some(below)
                    };
                    if let Some(folder) = folder {
                        for f in rust_files.iter().filter(|f| f.starts_with(&folder)) {
                            out.insert(crate::relative(repo, f));
                        }
                    }
                }
            }
        }
    }
    out
}

/// The root files of every crate under `repo`: each package's `src/lib.rs`, `src/main.rs` and
/// `src/bin/*.rs`.
pub fn crate_roots(repo: &Path) -> Vec<PathBuf> {
    let mut roots = Vec::new();
    for manifest in crate::files_with(repo, "toml") {
        if manifest.file_name().is_none_or(|n| n != "Cargo.toml") {
            continue;
        }
        let src = manifest.with_file_name("src");
        for root in ["lib.rs", "main.rs"] {
            if src.join(root).exists() {
                roots.push(src.join(root));
            }
        }
        if let Ok(bins) = std::fs::read_dir(src.join("bin")) {
            let mut bins: Vec<PathBuf> = bins.flatten().map(|e| e.path()).collect();
            bins.sort();
            roots.extend(bins.into_iter().filter(|p| p.extension().is_some_and(|e| e == "rs")));
        }
    }
    roots
}

#[cfg(test)]
mod tests {
    use super::*;

    fn write(dir: &Path, files: &[(&str, &str)]) {
        for (name, text) in files {
            let path = dir.join(name);
            std::fs::create_dir_all(path.parent().unwrap()).unwrap();
            std::fs::write(path, text).unwrap();
        }
    }

    fn scratch(name: &str) -> PathBuf {
        let dir = std::env::temp_dir().join(format!("tidy-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        dir
    }

    #[test]
    fn an_upward_path_in_code_closes_a_circle() {
        let dir = scratch("circle");
        write(
            &dir,
            &[
                ("src/lib.rs", "mod config;\nmod node;\npub use node::Node;\n"),
                (
                    "src/config.rs",
                    "pub struct C { x: u32 }\nfn d() -> u32 { crate::node::EVENT }\n",
                ),
                (
                    "src/node.rs",
                    "use crate::config::C;\npub const EVENT: u32 = 1;\npub struct Node;\n",
                ),
            ],
        );
        let c = Crate::read(&dir, &dir.join("src/lib.rs"));
        let circles = c.circles();
        assert_eq!(circles.len(), 1, "{circles:?}");
        assert_eq!(circles[0].0, ["src/config.rs", "src/node.rs"]);
        assert!(circles[0].1.iter().any(|a| a.via == "node::EVENT" && a.line == 2));
        std::fs::remove_dir_all(dir).unwrap();
    }

    #[test]
    fn reexports_tests_and_downward_arrows_make_no_circle() {
        let dir = scratch("none");
        write(
            &dir,
            &[
                ("src/lib.rs", "pub mod a;\nmod b;\npub use b::Thing;\n"),
                ("src/a/mod.rs", "mod inner;\nuse crate::Thing;\npub use inner::f;\n"),
                (
                    "src/a/inner.rs",
                    "use super::super::b::{self, Thing as T};\npub fn f() {}\n#[cfg(test)]\nmod tests { use crate::a::f; }\n",
                ),
                (
                    "src/b.rs",
                    "pub struct Thing;\n#[cfg(test)]\nmod tests { use crate::a::inner::f; }\n",
                ),
            ],
        );
        let c = Crate::read(&dir, &dir.join("src/lib.rs"));
        assert!(c.circles().is_empty(), "{:?}", c.circles());
        let arrows: Vec<(String, String)> = c.arrows().into_iter().map(|a| (a.from, a.to)).collect();
        assert!(
            arrows.contains(&("src/a/mod.rs".into(), "src/b.rs".into())),
            "{arrows:?}"
        );
        assert!(
            arrows.contains(&("src/a/inner.rs".into(), "src/b.rs".into())),
            "{arrows:?}"
        );
        std::fs::remove_dir_all(dir).unwrap();
    }

    #[test]
    fn use_trees_are_expanded() {
        let t = crate::source::tokens("a::{b, c::{d as e, self}, f::*}");
        let paths: Vec<(String, Option<String>)> = use_tree(&t).into_iter().map(|(p, n)| (p.join("::"), n)).collect();
        assert_eq!(
            paths,
            [
                ("a::b".into(), Some("b".into())),
                ("a::c::d".into(), Some("e".into())),
                ("a::c".into(), Some("c".into())),
                ("a::f".into(), None),
            ]
        );
    }
}
