//! The manuals say what is true now, in pages a reader can finish. Every `.md` under `docs/`
//! except the journal and the decision records (which are history on purpose), and the README:
//!
//! - at most [`MAX_LINES`] lines ([`MAX_BENCHMARK_LINES`] for a benchmark's page);
//! - no commit hash, except as provenance: on a benchmark table's one line that starts with
//!   `Measured:`, or in the rows of a table with a `commit` column (a "last verified" table);
//! - no heading with a date in it (a dated heading is a journal entry in the wrong place);
//! - no path of one machine (`/work/…`, `/home/…`): output pasted into a manual is cleaned first;
//! - every relative link leads to a file that exists.
//!
//! Deliberately left out: anchors inside a page (their spelling is the renderer's), links to the
//! web, and prose style.

use std::path::Path;

/// The longest a manual may be.
pub const MAX_LINES: usize = 500;
/// The longest a page of `docs/benchmarks/` may be: what it measures, its command, one table.
pub const MAX_BENCHMARK_LINES: usize = 160;

const MONTHS: [&str; 12] = [
    "January",
    "February",
    "March",
    "April",
    "May",
    "June",
    "July",
    "August",
    "September",
    "October",
    "November",
    "December",
];

/// Folders of `docs/` that are history, not manuals.
const HISTORY: [&str; 2] = ["docs/journal/", "docs/decisions/"];

/// The manuals under `repo`, relative to it.
pub fn manuals(repo: &Path) -> Vec<String> {
    let mut out: Vec<String> = crate::files_with(&repo.join("docs"), "md")
        .iter()
        .map(|p| crate::relative(repo, p))
        .filter(|p| !HISTORY.iter().any(|h| p.starts_with(h)))
        .collect();
    out.push("README.md".into());
    out
}

/// What is wrong with the manual `name` (relative to `repo`) whose text is `text`.
pub fn check(repo: &Path, name: &str, text: &str) -> Vec<String> {
    let mut problems = Vec::new();
    let cap = if name.starts_with("docs/benchmarks/") {
        MAX_BENCHMARK_LINES
    } else {
        MAX_LINES
    };
    let lines = text.lines().count();
    if lines > cap {
        problems.push(format!(
            "{name}: {lines} lines, over the cap of {cap}. Split it by topic into pages the \
             main one links, or move history (old runs, what changed when) to docs/journal/"
        ));
    }
    let mut in_code = false;
    // Whether the table being read has a `commit` column: its rows are provenance.
    let mut commit_table = false;
    let mut previous = "";
    for (n, line) in text.lines().enumerate() {
        let at = format!("{name}:{}", n + 1);
        if line.trim_start().starts_with("```") {
            in_code = !in_code;
        }
        let row = line.trim_start().starts_with('|');
        if row && !previous.trim_start().starts_with('|') {
            commit_table = line.split('|').any(|cell| cell.trim().eq_ignore_ascii_case("commit"));
        }
        commit_table &= row;
        previous = line;
        if !line.starts_with("Measured:")
            && !commit_table
            && let Some(hash) = commit_hash(line)
        {
            problems.push(format!(
                "{at}: `{hash}` looks like a commit hash. A manual says what is true now: move \
                 the dated result to docs/journal/, or, for a benchmark's current table, give its \
                 commit on the one line that starts with `Measured:`"
            ));
        }
        if !in_code && line.starts_with('#') && has_date(line) {
            problems.push(format!(
                "{at}: a heading with a date is a journal entry: move the section to \
                 docs/journal/ and keep only what is true now here"
            ));
        }
        for machine in ["/work/", "/home/", "/Users/", "/root/"] {
            if line.contains(machine) {
                problems.push(format!(
                    "{at}: `{machine}` is a path of one machine: write the command anyone runs \
                     from the repository's root, with relative paths"
                ));
            }
        }
        for target in relative_links(line) {
            let file = target.split('#').next().unwrap_or_default();
            if file.is_empty() {
                continue;
            }
            let base = Path::new(name).parent().unwrap_or(Path::new(""));
            if !repo.join(base).join(file).exists() {
                problems.push(format!(
                    "{at}: the link `{target}` leads nowhere: point it at the page that holds \
                     the text now"
                ));
            }
        }
    }
    problems
}

/// A word of 7 to 40 lowercase hex digits with both digits and letters in it.
fn commit_hash(line: &str) -> Option<&str> {
    line.split(|c: char| !c.is_ascii_alphanumeric())
        .filter(|w| (7..=40).contains(&w.len()))
        .find(|w| {
            w.bytes().all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
                && w.bytes().any(|b| b.is_ascii_digit())
                && w.bytes().any(|b| b.is_ascii_alphabetic())
        })
        .filter(|w| {
            // `0x1f…` is a number, not a commit.
            let at = line.find(*w).unwrap_or(0);
            !line[..at].ends_with("0x")
        })
}

fn has_date(line: &str) -> bool {
    let b = line.as_bytes();
    let iso = b.windows(10).any(|w| {
        w[..4].iter().all(u8::is_ascii_digit)
            && w[4] == b'-'
            && w[5..7].iter().all(u8::is_ascii_digit)
            && w[7] == b'-'
            && w[8..].iter().all(u8::is_ascii_digit)
    });
    let month_year = MONTHS.iter().any(|m| {
        line.match_indices(m).any(|(at, _)| {
            line[at + m.len()..]
                .trim_start_matches([' ', ','])
                .split(|c: char| !c.is_ascii_digit())
                .next()
                .is_some_and(|y| y.len() == 4)
        })
    });
    iso || month_year
}

/// The targets of the markdown links on `line` that are neither web addresses nor anchors.
fn relative_links(line: &str) -> Vec<&str> {
    let mut out = Vec::new();
    let mut rest = line;
    while let Some(at) = rest.find("](") {
        let after = &rest[at + 2..];
        let Some(end) = after.find(')') else {
            break;
        };
        let target = after[..end].trim();
        let is_web = target.contains("://") || target.starts_with("mailto:");
        if !is_web && !target.starts_with('#') && !target.is_empty() && !target.contains(' ') {
            out.push(target);
        }
        rest = &after[end..];
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn history_in_a_manual_is_found() {
        let text = "# Page\n## Results, 2026-11-29\n## Results (March 2025)\n\
                    ran on `9040b6c` at 0x1f2e3d4c\nMeasured: commit 9040b6c\n\
                    cd /work/main && run\n```\n# 2026-11-29 a comment in code\n```\n\
                    | run | commit |\n|---|---|\n| dst | 9040b6c |\n\n| run |\n| 9040b6c |\n";
        let problems = check(Path::new("."), "docs/X.md", text);
        let lines: Vec<&str> = problems.iter().map(|p| p.split(' ').next().unwrap()).collect();
        assert_eq!(
            lines,
            [
                "docs/X.md:2:",
                "docs/X.md:3:",
                "docs/X.md:4:",
                "docs/X.md:6:",
                "docs/X.md:15:"
            ]
        );
    }

    #[test]
    fn a_long_page_and_a_broken_link_are_found() {
        let text = "[ok](https://x.y) [a](#b) [c](nowhere.md#d)\n".repeat(161);
        let problems = check(Path::new("."), "docs/benchmarks/x.md", &text);
        assert!(problems[0].contains("161 lines, over the cap of 160"));
        assert!(problems[1].contains("`nowhere.md#d` leads nowhere"));
        assert_eq!(problems.len(), 162);
    }
}
