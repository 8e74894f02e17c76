//! Reads Redis requests out of a connection's bytes as they arrive.
//!
//! Every Redis client sends a command as an array of bulk strings (`*2\r\n$4\r\nINCR\r\n$1\r\na\r\n`),
//! so that is all [`RequestReader`] reads: a `*` header, then that many `$` arguments. Any other
//! type byte where one of these is due is refused at once, before the rest of the frame arrives —
//! a nested array, an integer, an inline command. Nothing here recurses, whatever the input.
//!
//! The reader keeps its place between reads: a command trickled one byte at a time is read in
//! work proportional to its length (a general RESP decoder run from the start of the pending bytes
//! on every read costs the square of it). The size of a command is bounded by what its headers
//! announce, checked as each header is read, so a command over [`MAX_PENDING_BYTES`] is refused
//! before its bytes are waited for and a connection never holds more than the bound of one
//! unfinished command.
//!
//! Deliberately left out: inline commands (`PING\r\n` typed by hand into a terminal; every client
//! library and `redis-cli` send arrays) and the null bulk string `$-1` as an argument (no client
//! sends one; Redis refuses it too).

use std::ops::Range;

use super::{MAX_ARGS, MAX_PENDING_BYTES};

/// Longest header line (`*` or `$`, a length, CRLF): the largest length allowed has 6 digits.
const MAX_LINE: usize = 24;

/// A command's arguments, as ranges of the buffer passed to [`RequestReader::next`].
pub type Ranges = Vec<Range<usize>>;

/// Where the reading of one connection's requests stands. Offsets are into the caller's buffer,
/// which keeps every byte from [`RequestReader::consumed`] on.
#[derive(Debug, Default)]
pub struct RequestReader {
    /// Where the command being read starts.
    start: usize,
    /// How far it has been read.
    pos: usize,
    /// How many arguments its header announced; `None` before the header is read.
    announced: Option<usize>,
    /// The length the current argument's header announced; `None` before that header.
    bulk: Option<usize>,
    /// The arguments read so far.
    args: Ranges,
    /// Bytes looked at, over the reader's life (for tests of the work it does).
    examined: u64,
}

impl RequestReader {
    /// The next complete command in `buf`, `None` when it has not arrived in full yet, or the
    /// protocol error that ends the connection. `buf` must be the same bytes as at the previous
    /// call, with more appended (less [`Self::discard`]'s prefix).
    pub fn next(&mut self, buf: &[u8]) -> Result<Option<Ranges>, String> {
        loop {
            let Some(announced) = self.announced else {
                let Some(n) = self.line(buf, b'*')? else {
                    return Ok(None);
                };
                match n {
                    // An empty command: nothing to run (Redis skips it too).
                    -1 | 0 => self.start = self.pos,
                    n if n < 0 => return Err("Protocol error: invalid multibulk length".into()),
                    n if n as usize > MAX_ARGS => {
                        return Err(format!("Protocol error: {n} arguments, at most {MAX_ARGS}"));
                    }
                    n => {
                        self.announced = Some(n as usize);
                        self.args = Vec::with_capacity((n as usize).min(16));
                    }
                }
                continue;
            };
            if self.args.len() == announced {
                self.announced = None;
                self.start = self.pos;
                return Ok(Some(std::mem::take(&mut self.args)));
            }
            match self.bulk {
                None => {
                    let Some(len) = self.line(buf, b'$')? else {
                        return Ok(None);
                    };
                    if len < 0 {
                        return Err("Protocol error: invalid bulk length".into());
                    }
                    let len = len as usize;
                    if self.pos - self.start + len + 2 > MAX_PENDING_BYTES {
                        return Err(too_big());
                    }
                    self.bulk = Some(len);
                }
                Some(len) => {
                    let end = self.pos + len;
                    if buf.len() < end + 2 {
                        return Ok(None);
                    }
                    self.examined += 2;
                    if &buf[end..end + 2] != b"\r\n" {
                        return Err("Protocol error: a bulk string not followed by CRLF".into());
                    }
                    self.args.push(self.pos..end);
                    self.pos = end + 2;
                    self.bulk = None;
                }
            }
        }
    }

    /// Reads a header line of type `ty` at the current position: its number, or `None` when
    /// the line is not complete yet.
    fn line(&mut self, buf: &[u8], ty: u8) -> Result<Option<i64>, String> {
        let Some(&first) = buf.get(self.pos) else {
            return Ok(None);
        };
        if first != ty {
            return Err(format!(
                "Protocol error: expected '{}', got '{}'",
                ty as char,
                first.escape_ascii()
            ));
        }
        let window = &buf[self.pos + 1..buf.len().min(self.pos + MAX_LINE)];
        let invalid = || match ty {
            b'*' => "Protocol error: invalid multibulk length".to_string(),
            _ => "Protocol error: invalid bulk length".to_string(),
        };
        // Digits up to the CR; anything else is refused as soon as it is seen.
        let Some(cr) = window.iter().position(|&b| !(b.is_ascii_digit() || b == b'-')) else {
            self.examined += window.len() as u64;
            if window.len() + 1 >= MAX_LINE {
                return Err("Protocol error: a header line too long".into());
            }
            return Ok(None);
        };
        self.examined += cr as u64 + 1;
        if window[cr] != b'\r' {
            return Err(invalid());
        }
        let Some(&lf) = window.get(cr + 1) else {
            return Ok(None);
        };
        if lf != b'\n' {
            return Err("Protocol error: a header line not ended by CRLF".into());
        }
        let n = std::str::from_utf8(&window[..cr])
            .ok()
            .filter(|s| !s.is_empty() && !s[1..].contains('-'))
            .and_then(|s| s.parse::<i64>().ok())
            .ok_or_else(invalid)?;
        self.pos += 1 + cr + 2;
        // The header line itself counts against the bound: a million `*0` lines are no command
        // but still bytes held.
        if self.pos - self.start > MAX_PENDING_BYTES {
            return Err(too_big());
        }
        Ok(Some(n))
    }

    /// Bytes at the front of the buffer that belong to commands already returned: the caller
    /// may drop them, then calls [`Self::discard`] with their number.
    pub fn consumed(&self) -> usize {
        self.start
    }

    /// The buffer's first `n` bytes (at most [`Self::consumed`]) were dropped.
    pub fn discard(&mut self, n: usize) {
        debug_assert!(n <= self.start);
        self.start -= n;
        self.pos -= n;
        for r in &mut self.args {
            *r = r.start - n..r.end - n;
        }
    }

    /// The fewest bytes the command being read will occupy from its first byte, as far as its
    /// headers have told (0 when none is being read): what a connection must hold for it.
    pub fn announced(&self) -> usize {
        self.pos - self.start + self.bulk.map_or(0, |len| len + 2)
    }

    /// Bytes looked at so far, over the reader's life.
    pub fn examined(&self) -> u64 {
        self.examined
    }
}

fn too_big() -> String {
    format!("Protocol error: a command of more than {MAX_PENDING_BYTES} bytes")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn read_all(input: &[u8]) -> Result<Vec<Vec<Vec<u8>>>, String> {
        let mut r = RequestReader::default();
        let mut out = Vec::new();
        while let Some(c) = r.next(input)? {
            out.push(c.into_iter().map(|x| input[x].to_vec()).collect());
        }
        Ok(out)
    }

    #[test]
    fn commands_are_read_whole_and_in_order() {
        let got = read_all(b"*2\r\n$4\r\nINCR\r\n$1\r\na\r\n*0\r\n*-1\r\n*1\r\n$0\r\n\r\n*1\r\n$2\r\nGE").unwrap();
        assert_eq!(got, vec![vec![b"INCR".to_vec(), b"a".to_vec()], vec![Vec::new()]]);
    }

    #[test]
    fn any_split_of_the_input_reads_the_same_commands() {
        let input = b"*2\r\n$4\r\nINCR\r\n$1\r\na\r\n*3\r\n$4\r\nMGET\r\n$2\r\nab\r\n$12\r\n0123456789\r\n\r\n";
        let whole = read_all(input).unwrap();
        assert_eq!(whole.len(), 2);
        for split in 0..input.len() {
            let mut r = RequestReader::default();
            let mut got = Vec::new();
            let mut buf = input[..split].to_vec();
            while let Some(c) = r.next(&buf).unwrap() {
                got.push(c.into_iter().map(|x| buf[x].to_vec()).collect::<Vec<_>>());
            }
            // Drop what was read, as a connection does, then give it the rest.
            let n = r.consumed();
            buf.drain(..n);
            r.discard(n);
            buf.extend_from_slice(&input[split..]);
            while let Some(c) = r.next(&buf).unwrap() {
                got.push(c.into_iter().map(|x| buf[x].to_vec()).collect());
            }
            assert_eq!(got, whole, "split at {split}");
        }
    }

    #[test]
    fn anything_but_an_array_of_bulk_strings_is_refused_at_its_first_byte() {
        for (input, why) in [
            (&b"*1\r\n*1\r\n"[..], "expected '$', got '*'"),
            (b"*2\r\n$4\r\nINCR\r\n:5\r\n", "expected '$', got ':'"),
            (b"$4\r\nINCR\r\n", "expected '*', got '$'"),
            (b"INCR a\r\n", "expected '*', got 'I'"),
            (b"*", ""),
            (b"*1\r\n$-1\r\n", "invalid bulk length"),
            (b"*-2\r\n", "invalid multibulk length"),
            (b"*x\r\n", "invalid multibulk length"),
            (b"*1\n", "invalid multibulk length"),
            (b"*1\r\n$1\r\nab\r\n", "not followed by CRLF"),
            (b"*1\r\n$1\rx", "not ended by CRLF"),
            (b"*1002\r\n", "1002 arguments"),
            (b"*100000000000000000000000000", "too long"),
            (b"*1\r\n$600000\r\n", "more than"),
        ] {
            let got = read_all(input);
            if why.is_empty() {
                assert_eq!(got, Ok(Vec::new()), "{input:?}");
            } else {
                let e = got.unwrap_err();
                assert!(e.starts_with("Protocol error: ") && e.contains(why), "{input:?}: {e}");
            }
        }
    }

    #[test]
    fn empty_commands_are_dropped_as_they_are_read() {
        let input = b"*0\r\n".repeat(MAX_PENDING_BYTES / 4 + 1);
        let mut r = RequestReader::default();
        // No command comes out of them, and they are dropped as they are read.
        assert_eq!(r.next(&input), Ok(None));
        assert_eq!(r.consumed(), input.len());
    }
}
