//! No non-test function over [`MAX_LINES`] lines. A long function is where a reader loses the
//! thread and where the next change lands beside, not inside, the logic it belongs to.
//!
//! The functions that were already long when the rule came are listed in
//! `tidy/long-functions.txt` with their length then. The list can only shrink: an entry whose
//! function grew past its length, got short, or is gone fails the check, so a function on the
//! list is shortened or split, never lengthened, and its entry is deleted when it no longer needs
//! one.
//!
//! A function's length is its lines from `fn` to its closing brace. Test functions (a test
//! attribute, or inside a `#[cfg(test)]` item) and files under `tests/` are not measured.
//!
//! Deliberately left out: closures and functions made by macros.

use crate::source::{Source, closing};

/// The longest a function may be.
pub const MAX_LINES: usize = 70;

/// A function that is too long.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LongFunction {
    /// The file, relative to the repository's root.
    pub file: String,
    pub name: String,
    pub line: usize,
    pub lines: usize,
}

/// The non-test functions of `text` longer than [`MAX_LINES`].
pub fn long_functions(file: &str, text: &str) -> Vec<LongFunction> {
    let src = Source::new(text);
    let t = &src.tokens;
    let mut out = Vec::new();
    for i in 0..t.len() {
        if t[i].text != "fn" || src.in_test[i] {
            continue;
        }
        let Some(name) = t.get(i + 1).filter(|n| is_ident(&n.text)) else {
            continue;
        };
        let Some(open) = body_open(&src, i + 2) else {
            continue;
        };
        let close = closing(t, open);
        let lines = t[close].line - t[i].line + 1;
        if lines > MAX_LINES {
            out.push(LongFunction {
                file: file.to_string(),
                name: name.text.clone(),
                line: t[i].line,
                lines,
            });
        }
    }
    out
}

fn is_ident(s: &str) -> bool {
    s.chars().next().is_some_and(|c| c.is_alphabetic() || c == '_')
}

/// The `{` that opens the body of the function whose signature starts at `from`, or `None` for a
/// declaration without a body (in a trait or an `extern` block).
fn body_open(src: &Source, from: usize) -> Option<usize> {
    let t = &src.tokens;
    let mut i = from;
    while i < t.len() {
        match t[i].text.as_str() {
            "(" | "[" => i = closing(t, i) + 1,
            "{" => return Some(i),
            ";" => return None,
            _ => i += 1,
        }
    }
    None
}

/// One line of the exception list: `file name lines`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Exception {
    pub file: String,
    pub name: String,
    pub lines: usize,
}

/// Reads the exception list; blank lines and `#` comments are skipped.
pub fn parse_exceptions(text: &str) -> Result<Vec<Exception>, String> {
    let mut out = Vec::new();
    for (n, line) in text.lines().enumerate() {
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let parts: Vec<&str> = line.split_whitespace().collect();
        let [file, name, lines] = parts.as_slice() else {
            return Err(format!("line {}: expected `file name lines`, got `{line}`", n + 1));
        };
        let lines = lines
            .parse()
            .map_err(|_| format!("line {}: `{lines}` is not a number of lines", n + 1))?;
        out.push(Exception {
            file: file.to_string(),
            name: name.to_string(),
            lines,
        });
    }
    Ok(out)
}

/// What is wrong, given every long function found and the exception list: a message per problem,
/// each saying what to do.
pub fn judge(found: &[LongFunction], exceptions: &[Exception], list: &str) -> Vec<String> {
    let mut problems = Vec::new();
    let mut used = vec![false; exceptions.len()];
    for f in found {
        let entry = exceptions
            .iter()
            .enumerate()
            .find(|(k, e)| !used[*k] && e.file == f.file && e.name == f.name);
        match entry {
            Some((k, e)) if f.lines <= e.lines => used[k] = true,
            Some((k, e)) => {
                used[k] = true;
                problems.push(format!(
                    "{}:{}: fn {} grew to {} lines; its entry in {list} allows {}. The list only \
                     shrinks: split the function (move a step into a named helper) until it is \
                     back under {} lines",
                    f.file, f.line, f.name, f.lines, e.lines, e.lines
                ));
            }
            None => problems.push(format!(
                "{}:{}: fn {} is {} lines, over the limit of {MAX_LINES}. Split it: give each \
                 step a named function (the list in {list} is for functions that were long \
                 before the rule, and only shrinks)",
                f.file, f.line, f.name, f.lines
            )),
        }
    }
    for (e, used) in exceptions.iter().zip(used) {
        if !used {
            problems.push(format!(
                "{list}: `{} {} {}` is no longer needed (the function is now at most {MAX_LINES} \
                 lines, or gone): delete the entry",
                e.file, e.name, e.lines
            ));
        }
    }
    problems
}

#[cfg(test)]
mod tests {
    use super::*;

    fn body(n: usize) -> String {
        "    x();\n".repeat(n)
    }

    #[test]
    fn a_long_function_is_found_and_a_test_is_not() {
        let text = format!(
            "fn short() {{\n{}}}\nfn long(a: [u8; 2]) -> u8 where u8: Copy {{\n{}}}\n\
             #[test]\nfn long_test() {{\n{}}}\ntrait T {{ fn decl(&self); }}\n",
            body(68),
            body(69),
            body(200)
        );
        let found = long_functions("a.rs", &text);
        assert_eq!(
            found,
            [LongFunction {
                file: "a.rs".into(),
                name: "long".into(),
                line: 71,
                lines: 71
            }]
        );
    }

    #[test]
    fn the_list_can_only_shrink() {
        let found = |lines| LongFunction {
            file: "a.rs".into(),
            name: "f".into(),
            line: 1,
            lines,
        };
        let list = parse_exceptions("# why\na.rs f 80\n").unwrap();
        assert!(judge(&[found(80)], &list, "L").is_empty());
        assert!(judge(&[found(79)], &list, "L").is_empty());
        assert!(judge(&[found(81)], &list, "L")[0].contains("grew to 81"));
        assert!(judge(&[], &list, "L")[0].contains("no longer needed"));
        assert!(judge(&[found(75)], &[], "L")[0].contains("over the limit"));
        assert!(parse_exceptions("a.rs f").is_err());
    }
}
