//! Rust source as the rules read it: the code with every comment and every string or character
//! literal blanked to spaces (newlines kept, so a byte's line is still its line), cut into tokens,
//! and the regions that are test code.
//!
//! Deliberately left out: macro expansion, and the fine points of the lexer the rules cannot
//! trip on (a char literal is told from a lifetime by its closing quote, which is enough for code
//! that compiles).

/// One token of blanked code: an identifier or keyword, `::`, or a single punctuation byte.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Token {
    pub text: String,
    /// 1-based line.
    pub line: usize,
}

/// `text` with comments and literals blanked out; newlines are kept.
pub fn blank(text: &str) -> String {
    let b = text.as_bytes();
    let mut out = b.to_vec();
    let mut i = 0;
    let wipe = |out: &mut Vec<u8>, from: usize, to: usize| {
        for byte in &mut out[from..to] {
            if *byte != b'\n' {
                *byte = b' ';
            }
        }
    };
    while i < b.len() {
        let rest = &b[i..];
        if rest.starts_with(b"//") {
            let end = rest.iter().position(|&c| c == b'\n').map_or(b.len(), |p| i + p);
            wipe(&mut out, i, end);
            i = end;
        } else if rest.starts_with(b"/*") {
            let end = block_comment_end(b, i);
            wipe(&mut out, i, end);
            i = end;
        } else if let Some((open_len, hashes)) = raw_string_open(b, i) {
            let end = raw_string_end(b, i + open_len, hashes);
            wipe(&mut out, i, end);
            i = end;
        } else if b[i] == b'"' || (b[i] == b'b' && rest.get(1) == Some(&b'"') && !ident_before(b, i)) {
            let start = if b[i] == b'b' { i + 1 } else { i };
            let end = string_end(b, start + 1);
            wipe(&mut out, i, end);
            i = end;
        } else if b[i] == b'\'' {
            match char_literal_end(b, i) {
                Some(end) => {
                    wipe(&mut out, i, end);
                    i = end;
                }
                None => i += 1,
            }
        } else {
            i += 1;
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

fn ident_before(b: &[u8], i: usize) -> bool {
    i > 0 && (b[i - 1].is_ascii_alphanumeric() || b[i - 1] == b'_')
}

fn block_comment_end(b: &[u8], start: usize) -> usize {
    let mut depth = 0usize;
    let mut i = start;
    while i + 1 < b.len() {
        if b[i] == b'/' && b[i + 1] == b'*' {
            depth += 1;
            i += 2;
        } else if b[i] == b'*' && b[i + 1] == b'/' {
            depth -= 1;
            i += 2;
            if depth == 0 {
                return i;
            }
        } else {
            i += 1;
        }
    }
    b.len()
}

/// `r"`, `r#"`, `br##"`…: the opening's length and its number of `#`.
fn raw_string_open(b: &[u8], i: usize) -> Option<(usize, usize)> {
    if ident_before(b, i) {
        return None;
    }
    let mut j = i;
    if b[j] == b'b' {
        j += 1;
    }
    if b.get(j) != Some(&b'r') {
        return None;
    }
    j += 1;
    let hashes = b[j..].iter().take_while(|&&c| c == b'#').count();
    j += hashes;
    (b.get(j) == Some(&b'"')).then_some((j + 1 - i, hashes))
}

fn raw_string_end(b: &[u8], mut i: usize, hashes: usize) -> usize {
    while i < b.len() {
        if b[i] == b'"' && b[i + 1..].iter().take(hashes).filter(|&&c| c == b'#').count() == hashes {
            return i + 1 + hashes;
        }
        i += 1;
    }
    b.len()
}

fn string_end(b: &[u8], mut i: usize) -> usize {
    while i < b.len() {
        match b[i] {
            b'\\' => i += 2,
            b'"' => return i + 1,
            _ => i += 1,
        }
    }
    b.len()
}

/// The end of the char literal at `i`, or `None` when the quote starts a lifetime or a label.
fn char_literal_end(b: &[u8], i: usize) -> Option<usize> {
    if b.get(i + 1) == Some(&b'\\') {
        let close = b[i + 2..].iter().position(|&c| c == b'\'')?;
        return Some(i + 2 + close + 1);
    }
    // One character, which may take up to four bytes of UTF-8.
    let len = match b.get(i + 1)? {
        c if *c < 0x80 => 1,
        c if *c >= 0xF0 => 4,
        c if *c >= 0xE0 => 3,
        _ => 2,
    };
    (b.get(i + 1 + len) == Some(&b'\'')).then_some(i + 2 + len)
}

/// The tokens of blanked code.
pub fn tokens(code: &str) -> Vec<Token> {
    let b = code.as_bytes();
    let mut out = Vec::new();
    let mut line = 1;
    let mut i = 0;
    while i < b.len() {
        let c = b[i];
        if c == b'\n' {
            line += 1;
            i += 1;
        } else if c.is_ascii_whitespace() {
            i += 1;
        } else if c.is_ascii_alphanumeric() || c == b'_' || c >= 0x80 {
            let start = i;
            while i < b.len() && (b[i].is_ascii_alphanumeric() || b[i] == b'_' || b[i] >= 0x80) {
                i += 1;
            }
            out.push(Token {
                text: code[start..i].to_string(),
                line,
            });
        } else if c == b':' && b.get(i + 1) == Some(&b':') {
            out.push(Token {
                text: "::".into(),
                line,
            });
            i += 2;
        } else {
            out.push(Token {
                text: (c as char).to_string(),
                line,
            });
            i += 1;
        }
    }
    out
}

/// A source file read for the rules.
pub struct Source {
    pub tokens: Vec<Token>,
    /// For each token, whether it is test code: inside an item marked `#[cfg(test)]` or a test
    /// attribute (`#[test]`, `#[tokio::test]`, …).
    pub in_test: Vec<bool>,
}

impl Source {
    pub fn new(text: &str) -> Source {
        let tokens = tokens(&blank(text));
        let in_test = test_regions(&tokens);
        Source { tokens, in_test }
    }
}

/// The index of the token that closes the bracket opened at `open` (`{`, `(` or `[`), or the last
/// index when it never closes.
pub fn closing(tokens: &[Token], open: usize) -> usize {
    let (o, c) = match tokens[open].text.as_str() {
        "(" => ("(", ")"),
        "[" => ("[", "]"),
        _ => ("{", "}"),
    };
    let mut depth = 0usize;
    for (k, t) in tokens.iter().enumerate().skip(open) {
        if t.text == o {
            depth += 1;
        } else if t.text == c {
            depth -= 1;
            if depth == 0 {
                return k;
            }
        }
    }
    tokens.len().saturating_sub(1)
}

/// Marks the tokens of every item whose attributes say it is test code.
fn test_regions(tokens: &[Token]) -> Vec<bool> {
    let mut in_test = vec![false; tokens.len()];
    let mut i = 0;
    while i < tokens.len() {
        if tokens[i].text == "#" && tokens.get(i + 1).is_some_and(|t| t.text == "[") {
            let close = closing(tokens, i + 1);
            if is_test_attribute(&tokens[i + 2..close]) {
                let end = item_end(tokens, close + 1);
                for flag in &mut in_test[i..=end.min(tokens.len() - 1)] {
                    *flag = true;
                }
                i = end + 1;
                continue;
            }
            i = close + 1;
            continue;
        }
        i += 1;
    }
    in_test
}

fn is_test_attribute(inside: &[Token]) -> bool {
    let words: Vec<&str> = inside.iter().map(|t| t.text.as_str()).collect();
    matches!(
        words.as_slice(),
        ["test"] | [_, "::", "test", ..] | ["cfg", "(", "test", ")"]
    )
}

/// The last token of the item that starts at `from` (after its attributes): its closing brace, or
/// the `;` that ends it.
pub fn item_end(tokens: &[Token], from: usize) -> usize {
    let mut i = from;
    while i < tokens.len() {
        match tokens[i].text.as_str() {
            "#" if tokens.get(i + 1).is_some_and(|t| t.text == "[") => {
                i = closing(tokens, i + 1) + 1;
            }
            "(" | "[" => i = closing(tokens, i) + 1,
            "{" => return closing(tokens, i),
            ";" => return i,
            _ => i += 1,
        }
    }
    tokens.len().saturating_sub(1)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn comments_and_literals_are_blanked_and_lines_kept() {
        let code = blank("a // b { \n\"{ \\\" }\" /* { /* } */ */ c\n'{' 'a r#\"}\"# d");
        assert_eq!(code.lines().count(), 3);
        assert!(!code.contains('{') && !code.contains('}'));
        let words: Vec<String> = tokens(&code).into_iter().map(|t| t.text).collect();
        assert_eq!(words, ["a", "c", "'", "a", "d"]);
    }

    #[test]
    fn test_items_are_marked() {
        let s = Source::new("fn a() {}\n#[cfg(test)]\nmod t { fn b() {} }\n#[tokio::test]\nasync fn c() {}\nfn d() {}");
        let marked: Vec<&str> = s
            .tokens
            .iter()
            .zip(&s.in_test)
            .filter(|(t, test)| **test && t.text.len() == 1 && t.text != "{")
            .map(|(t, _)| t.text.as_str())
            .filter(|w| w.chars().all(char::is_alphabetic))
            .collect();
        assert_eq!(marked, ["t", "b", "c"]);
    }
}
