//! The direct hop's framing: length-prefixed binary frames on one TCP connection per pair of
//! AllocSvrs, many calls in flight at once, answered in any order by their ids.
//!
//! A connection opens with [`PREFACE`] from the forwarding side. Then every frame is
//! `len: u32 LE` (the bytes after it), `id: u64 LE`, `tag: u8`, and the tag's payload:
//!
//! | tag | direction | payload |
//! |---|---|---|
//! | 1 `TAKE_UID` | request | `uid: u64 LE` |
//! | 2 `TAKE_KEY` | request | the counter key's bytes (UTF-8, checked by the owner) |
//! | 16 `SERVED` | reply | `value: u64 LE`, then the owner: section, node id, incarnation, epoch, set id (`u64 LE` each) |
//! | 17 `LONG_WAY` | reply | none: the owner cannot answer at once from memory; send the call the long way |
//! | 18 `BAD_INPUT`, 19 `EXHAUSTED` | reply | the reason (UTF-8) |
//!
//! A frame longer than [`MAX_FRAME`], an unknown tag or a payload of the wrong size ends the
//! connection: only a peer speaks this, and a peer that speaks it wrong is not one to guess for.

use seqsvr_proto::pb;

/// What a forwarding AllocSvr sends first on a new connection: the framing and its version.
pub const PREFACE: &[u8; 8] = b"SEQHOP1\n";
/// The longest frame either side accepts (a counter key is at most a few hundred bytes).
pub const MAX_FRAME: usize = 4096;

const TAKE_UID: u8 = 1;
const TAKE_KEY: u8 = 2;
const SERVED: u8 = 16;
const LONG_WAY: u8 = 17;
const BAD_INPUT: u8 = 18;
const EXHAUSTED: u8 = 19;

/// Bytes of a frame before its payload: length, id, tag.
const HEAD: usize = 4 + 8 + 1;
const OWNER_BYTES: usize = 5 * 8;

/// What is taken: one seq of a uid, or one value of a counter key.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Subject<'a> {
    Uid(u64),
    Key(&'a [u8]),
}

/// An owner's answer to one take.
#[derive(Debug, Clone, PartialEq)]
pub enum Answer {
    Served { value: u64, owner: pb::Owner },
    LongWay,
    BadInput(String),
    Exhausted(String),
}

/// Why a byte stream is not frames of this protocol.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WireError(pub String);

impl std::fmt::Display for WireError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

fn begin(out: &mut Vec<u8>, id: u64, tag: u8, payload: usize) {
    // Never over MAX_FRAME for what callers pass (keys are checked long before), so never over u32.
    let len = (8 + 1 + payload) as u32;
    out.extend_from_slice(&len.to_le_bytes());
    out.extend_from_slice(&id.to_le_bytes());
    out.push(tag);
}

/// Appends the request frame of call `id` taking `subject`.
pub fn put_request(out: &mut Vec<u8>, id: u64, subject: Subject<'_>) {
    match subject {
        Subject::Uid(uid) => {
            begin(out, id, TAKE_UID, 8);
            out.extend_from_slice(&uid.to_le_bytes());
        }
        Subject::Key(key) => {
            begin(out, id, TAKE_KEY, key.len());
            out.extend_from_slice(key);
        }
    }
}

/// Appends the reply frame of call `id`.
pub fn put_answer(out: &mut Vec<u8>, id: u64, answer: &Answer) {
    match answer {
        Answer::Served { value, owner } => {
            begin(out, id, SERVED, 8 + OWNER_BYTES);
            for v in [
                *value,
                owner.section,
                owner.node_id,
                owner.incarnation,
                owner.epoch,
                owner.set_id,
            ] {
                out.extend_from_slice(&v.to_le_bytes());
            }
        }
        Answer::LongWay => begin(out, id, LONG_WAY, 0),
        Answer::BadInput(why) | Answer::Exhausted(why) => {
            let tag = if matches!(answer, Answer::BadInput(_)) {
                BAD_INPUT
            } else {
                EXHAUSTED
            };
            // A reason is a sentence; cut on a character boundary to fit a frame whatever it is.
            let mut end = why.len().min(MAX_FRAME - HEAD);
            while !why.is_char_boundary(end) {
                end -= 1;
            }
            begin(out, id, tag, end);
            out.extend_from_slice(&why.as_bytes()[..end]);
        }
    }
}

/// A whole frame: its id, tag, payload and length in bytes.
type Frame<'a> = (u64, u8, &'a [u8], usize);

/// The first whole frame at the start of `buf`; `None` while it is incomplete.
fn frame(buf: &[u8]) -> Result<Option<Frame<'_>>, WireError> {
    let Some(len) = buf.get(..4) else { return Ok(None) };
    let len = u32::from_le_bytes(len.try_into().expect("four bytes")) as usize;
    if !(9..=MAX_FRAME - 4).contains(&len) {
        return Err(WireError(format!(
            "a frame of {len} bytes (9 to {} allowed)",
            MAX_FRAME - 4
        )));
    }
    let Some(body) = buf.get(4..4 + len) else {
        return Ok(None);
    };
    let id = u64::from_le_bytes(body[..8].try_into().expect("eight bytes"));
    Ok(Some((id, body[8], &body[9..], 4 + len)))
}

fn u64_at(p: &[u8], i: usize) -> u64 {
    u64::from_le_bytes(p[i * 8..i * 8 + 8].try_into().expect("eight bytes"))
}

/// The first whole request in `buf`: its id, subject and length; `None` while incomplete.
pub fn take_request(buf: &[u8]) -> Result<Option<(u64, Subject<'_>, usize)>, WireError> {
    let Some((id, tag, payload, used)) = frame(buf)? else {
        return Ok(None);
    };
    let subject = match tag {
        TAKE_UID if payload.len() == 8 => Subject::Uid(u64_at(payload, 0)),
        TAKE_KEY => Subject::Key(payload),
        _ => {
            return Err(WireError(format!(
                "request tag {tag} with {} payload bytes",
                payload.len()
            )));
        }
    };
    Ok(Some((id, subject, used)))
}

/// The first whole reply in `buf`: its id, answer and length; `None` while incomplete.
pub fn take_answer(buf: &[u8]) -> Result<Option<(u64, Answer, usize)>, WireError> {
    let Some((id, tag, payload, used)) = frame(buf)? else {
        return Ok(None);
    };
    let text = || String::from_utf8_lossy(payload).into_owned();
    let answer = match tag {
        SERVED if payload.len() == 8 + OWNER_BYTES => Answer::Served {
            value: u64_at(payload, 0),
            owner: pb::Owner {
                section: u64_at(payload, 1),
                node_id: u64_at(payload, 2),
                incarnation: u64_at(payload, 3),
                epoch: u64_at(payload, 4),
                set_id: u64_at(payload, 5),
            },
        },
        LONG_WAY if payload.is_empty() => Answer::LongWay,
        BAD_INPUT => Answer::BadInput(text()),
        EXHAUSTED => Answer::Exhausted(text()),
        _ => {
            return Err(WireError(format!(
                "reply tag {tag} with {} payload bytes",
                payload.len()
            )));
        }
    };
    Ok(Some((id, answer, used)))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn owner() -> pb::Owner {
        pb::Owner {
            section: 7,
            node_id: 2,
            incarnation: u64::MAX,
            epoch: 9,
            set_id: 1,
        }
    }

    #[test]
    fn requests_and_answers_read_back_as_written_one_after_another() {
        let mut out = Vec::new();
        put_request(&mut out, 1, Subject::Uid(42));
        put_request(&mut out, u64::MAX, Subject::Key(b"orders:eu"));
        let (id, s, used) = take_request(&out).unwrap().unwrap();
        assert_eq!((id, s), (1, Subject::Uid(42)));
        let (id, s, rest) = take_request(&out[used..]).unwrap().unwrap();
        assert_eq!((id, s), (u64::MAX, Subject::Key(b"orders:eu".as_slice())));
        assert_eq!(used + rest, out.len());

        let answers = [
            Answer::Served {
                value: 1 << 63,
                owner: owner(),
            },
            Answer::LongWay,
            Answer::BadInput("uid 5000 is not below the uid limit 1000".into()),
            Answer::Exhausted("section 3 has used up its numbers".into()),
        ];
        let mut out = Vec::new();
        for (i, a) in answers.iter().enumerate() {
            put_answer(&mut out, i as u64, a);
        }
        let mut at = 0;
        for (i, a) in answers.iter().enumerate() {
            let (id, got, used) = take_answer(&out[at..]).unwrap().unwrap();
            assert_eq!((id, &got), (i as u64, a));
            at += used;
        }
        assert_eq!(at, out.len());
    }

    #[test]
    fn a_frame_cut_anywhere_is_incomplete_not_wrong() {
        let mut out = Vec::new();
        put_answer(
            &mut out,
            3,
            &Answer::Served {
                value: 5,
                owner: owner(),
            },
        );
        for cut in 0..out.len() {
            assert_eq!(take_answer(&out[..cut]), Ok(None), "cut at {cut}");
        }
        let mut out = Vec::new();
        put_request(&mut out, 3, Subject::Key(b"k"));
        for cut in 0..out.len() {
            assert_eq!(take_request(&out[..cut]), Ok(None), "cut at {cut}");
        }
    }

    #[test]
    fn wrong_lengths_and_tags_are_errors() {
        // Too long, too short (no room for id and tag), an unknown tag, a uid of 7 bytes, an
        // answer tag where a request belongs, a served answer without its owner.
        let huge = [&(MAX_FRAME as u32).to_le_bytes()[..], &[0; 16]].concat();
        assert!(take_request(&huge).is_err());
        assert!(take_request(&[3, 0, 0, 0, 1, 2, 3]).is_err());
        let frame = |tag: u8, payload: &[u8]| {
            let mut f = ((9 + payload.len()) as u32).to_le_bytes().to_vec();
            f.extend_from_slice(&1u64.to_le_bytes());
            f.push(tag);
            f.extend_from_slice(payload);
            f
        };
        assert!(take_request(&frame(9, &[])).is_err());
        assert!(take_request(&frame(TAKE_UID, &[0; 7])).is_err());
        assert!(take_request(&frame(SERVED, &[0; 48])).is_err());
        assert!(take_answer(&frame(SERVED, &[0; 8])).is_err());
        assert!(take_answer(&frame(LONG_WAY, &[0])).is_err());
        assert!(take_answer(&frame(TAKE_KEY, b"k")).is_err());
    }

    #[test]
    fn a_long_reason_is_cut_to_fit_on_a_character_boundary() {
        let why = "é".repeat(MAX_FRAME);
        let mut out = Vec::new();
        put_answer(&mut out, 1, &Answer::BadInput(why.clone()));
        let (_, got, used) = take_answer(&out).unwrap().unwrap();
        assert_eq!(used, out.len());
        let Answer::BadInput(got) = got else { panic!("{got:?}") };
        assert!(
            got.len() <= MAX_FRAME - HEAD && why.starts_with(&got),
            "{} bytes",
            got.len()
        );
    }
}
