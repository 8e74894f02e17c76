//! The fuzz of the Redis front end's connection layer over [`common::Fake`]: a connection's
//! input built from pieces — well-formed commands (counters, blocks, reads, transactions,
//! unknown ones), arrays nested up to 10,000 deep, wrong type bytes, arguments up to a megabyte,
//! too many arguments, inline text and garbage — delivered whole, one byte at a time or in random
//! chunks with pauses, on a paused clock.
//!
//! The oracle, for every case: the connection's task never panics and ends on its own within the
//! command deadline of the last byte sent; what comes back is a sequence of well-formed RESP
//! replies, one per command run, then exactly one `-ERR Protocol error` when a bad piece was sent
//! (nothing after it is run); and the numbers taken are exactly those an independent model of the
//! commands before the bad piece takes (transactions included: queued commands take only at a
//! clean `EXEC`).
//!
//! CI runs [`CI_CASES`]; `PROPTEST_CASES=<n>` runs more.

mod common;

use std::time::Duration;

use common::Fake;
use proptest::prelude::*;
use seqsvr_frontends::resp::{self, MAX_ARGS, MAX_PENDING_BYTES, RespConfig};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

const CI_CASES: u32 = 64;

fn config() -> ProptestConfig {
    let cases = std::env::var("PROPTEST_CASES").ok().and_then(|v| v.parse().ok());
    ProptestConfig {
        cases: cases.unwrap_or(CI_CASES),
        max_shrink_iters: 2000,
        ..ProptestConfig::default()
    }
}

/// One piece of a connection's input.
#[derive(Debug, Clone)]
enum Piece {
    /// A well-formed command.
    Command(Vec<Vec<u8>>),
    /// `*1\r\n` this many times (at least twice), then maybe a bulk string.
    Nested(usize, bool),
    /// A command whose argument `at` has this type byte instead of `$`.
    WrongType(u8, usize),
    /// `ECHO` of this many bytes, over the bound or not.
    Echo(usize),
    /// An array header announcing this many arguments, and that many one-byte arguments.
    ManyArgs(usize),
    /// Bytes that do not start with `*`.
    Garbage(Vec<u8>),
}

impl Piece {
    fn bytes(&self) -> Vec<u8> {
        match self {
            Piece::Command(args) => encode(args),
            Piece::Nested(depth, tail) => {
                let mut v = b"*1\r\n".repeat(*depth);
                if *tail {
                    v.extend_from_slice(b"$4\r\nPING\r\n");
                }
                v
            }
            Piece::WrongType(ty, at) => {
                let mut v = format!("*{}\r\n", at + 1).into_bytes();
                for _ in 0..*at {
                    v.extend_from_slice(b"$4\r\nPING\r\n");
                }
                v.push(*ty);
                v.extend_from_slice(b"1\r\n");
                v
            }
            Piece::Echo(len) => {
                let mut v = format!("*2\r\n$4\r\nECHO\r\n${len}\r\n").into_bytes();
                v.extend(std::iter::repeat_n(b'e', *len));
                v.extend_from_slice(b"\r\n");
                v
            }
            Piece::ManyArgs(n) => {
                let mut v = format!("*{n}\r\n").into_bytes();
                for _ in 0..*n {
                    v.extend_from_slice(b"$1\r\nk\r\n");
                }
                v
            }
            Piece::Garbage(g) => g.clone(),
        }
    }

    /// Whether the reader must refuse this piece.
    fn is_bad(&self) -> bool {
        match self {
            Piece::Command(_) => false,
            Piece::Nested(..) => true,
            Piece::WrongType(..) | Piece::Garbage(_) => true,
            // The header lines before the bytes count: `*2`, `$4 ECHO`, `$<6 digits>`.
            Piece::Echo(len) => len + 25 > MAX_PENDING_BYTES,
            Piece::ManyArgs(n) => *n > MAX_ARGS,
        }
    }
}

fn encode(args: &[Vec<u8>]) -> Vec<u8> {
    common::resp_command(args)
}

fn command() -> impl Strategy<Value = Vec<Vec<u8>>> {
    let key = prop_oneof!["[a-c]", "u:[0-9]{1,3}"].prop_map(String::into_bytes);
    let b = |s: &str| s.as_bytes().to_vec();
    prop_oneof![
        4 => key.clone().prop_map(move |k| vec![b"INCR".to_vec(), k]),
        2 => (key.clone(), 1u32..50).prop_map(move |(k, n)| vec![b"INCRBY".to_vec(), k, n.to_string().into_bytes()]),
        1 => (key.clone(), "-?[0-9]{1,3}").prop_map(move |(k, n)| vec![b"incrby".to_vec(), k, n.into_bytes()]),
        1 => key.clone().prop_map(move |k| vec![b"GET".to_vec(), k]),
        1 => proptest::collection::vec(key, 1..4).prop_map(move |ks| [vec![b"MGET".to_vec()], ks].concat()),
        1 => Just(vec![b("PING")]),
        1 => Just(vec![b("NEXTID"), b("3")]),
        2 => Just(vec![b("MULTI")]),
        2 => Just(vec![b("EXEC")]),
        1 => Just(vec![b("DISCARD")]),
        1 => Just(vec![b("SET"), b("a"), b("1")]),
    ]
}

fn piece() -> impl Strategy<Value = Piece> {
    prop_oneof![
        12 => command().prop_map(Piece::Command),
        1 => (prop_oneof![Just(2usize), 3usize..100, 9_000usize..10_001], any::<bool>()).prop_map(|(d, t)| Piece::Nested(d, t)),
        1 => (prop::sample::select(b":+-_,#(!=%~>|*".to_vec()), 0usize..3).prop_map(|(t, at)| Piece::WrongType(t, at)),
        1 => prop_oneof![0usize..4096, (MAX_PENDING_BYTES - 64)..(MAX_PENDING_BYTES + 64), 900_000usize..1_000_001].prop_map(Piece::Echo),
        1 => prop_oneof![1usize..5, (MAX_ARGS - 1)..(MAX_ARGS + 3)].prop_map(Piece::ManyArgs),
        1 => (prop::sample::select(b"$:+INCRinc \r\n\0\xff".to_vec()), proptest::collection::vec(any::<u8>(), 0..64))
            .prop_map(|(first, rest)| Piece::Garbage([vec![first], rest].concat())),
    ]
}

/// How the input reaches the server.
#[derive(Debug, Clone)]
enum Delivery {
    Whole,
    ByteByByte,
    /// Chunks of these sizes (cycled), each after a pause of this many ms.
    Chunks(Vec<usize>, u64),
}

fn delivery() -> impl Strategy<Value = Delivery> {
    prop_oneof![
        Just(Delivery::Whole),
        Just(Delivery::ByteByByte),
        (proptest::collection::vec(1usize..70_000, 1..6), 0u64..40).prop_map(|(c, p)| Delivery::Chunks(c, p)),
    ]
}

/// What the commands before the first bad piece take, how many replies they get, and whether
/// a bad piece follows: an independent model of the front end's rules for counters and
/// transactions (a transaction's queue is refused past its bounds or at a command it cannot
/// queue, and then takes nothing).
fn model(pieces: &[Piece]) -> (u64, usize, bool) {
    #[derive(Default)]
    struct Queue {
        takes: u64,
        bytes: usize,
        commands: usize,
        refused: bool,
    }
    let (mut taken, mut replies) = (0u64, 0usize);
    let mut queue: Option<Queue> = None;
    for p in pieces {
        if p.is_bad() {
            return (taken, replies, true);
        }
        replies += 1;
        let args: Vec<Vec<u8>> = match p {
            Piece::Command(args) => args.clone(),
            Piece::Echo(len) => vec![b"ECHO".to_vec(), vec![b'e'; *len]],
            Piece::ManyArgs(n) => vec![b"k".to_vec(); *n],
            _ => unreachable!("only commands are good pieces"),
        };
        let name = String::from_utf8_lossy(&args[0]).to_ascii_uppercase();
        let takes = match name.as_str() {
            "INCR" => 1,
            "INCRBY" => std::str::from_utf8(&args[2])
                .ok()
                .and_then(|s| s.parse::<i64>().ok())
                .filter(|&n| n > 0)
                .map_or(0, |n| n as u64),
            _ => 0,
        };
        match (name.as_str(), queue.as_mut()) {
            ("MULTI", None) => queue = Some(Queue::default()),
            ("MULTI", Some(_)) | ("EXEC" | "DISCARD", None) => {}
            ("EXEC", Some(q)) => {
                if !q.refused {
                    taken += q.takes;
                }
                queue = None;
            }
            ("DISCARD", Some(_)) => queue = None,
            ("SET" | "K", Some(q)) => q.refused = true,
            (_, Some(q)) => {
                let bytes: usize = args.iter().map(|a| a.len() + 32).sum();
                if q.commands >= resp::MAX_QUEUED || q.bytes + bytes > MAX_PENDING_BYTES {
                    q.refused = true;
                } else {
                    q.takes += takes;
                    q.bytes += bytes;
                    q.commands += 1;
                }
            }
            (_, None) => taken += takes,
        }
    }
    (taken, replies, false)
}

/// The number of complete RESP2 replies in `out`, or why it is not a sequence of them.
fn count_replies(out: &[u8]) -> Result<(usize, &[u8]), String> {
    let mut rest = out;
    let mut n = 0;
    let mut last = out;
    while !rest.is_empty() {
        match redis_protocol::resp2::decode::decode(rest) {
            Ok(Some((_, used))) => {
                last = &rest[..used];
                rest = &rest[used..];
                n += 1;
            }
            other => {
                return Err(format!(
                    "not a reply: {other:?} at {:?}",
                    String::from_utf8_lossy(&rest[..rest.len().min(200)])
                ));
            }
        }
    }
    Ok((n, last))
}

async fn run_case(pieces: &[Piece], delivery: &Delivery) -> Result<(), String> {
    let fake = Fake::default();
    let cfg = RespConfig::default();
    let input: Vec<u8> = pieces.iter().flat_map(Piece::bytes).collect();
    let (expected_taken, expected_replies, bad) = model(pieces);
    let (client, server) = tokio::io::duplex(1 << 16);
    let (mut rx, mut tx) = tokio::io::split(client);
    let send = async {
        let chunks: Vec<&[u8]> = match delivery {
            Delivery::Whole => vec![&input[..]],
            // One byte at a time only for what is small enough to stay quick.
            Delivery::ByteByByte if input.len() <= 20_000 => input.chunks(1).collect(),
            Delivery::ByteByByte => input.chunks(997).collect(),
            Delivery::Chunks(sizes, _) => {
                // At most ~200 chunks, so that the pauses add up to less than a deadline.
                let least = input.len().div_ceil(200);
                let mut out = Vec::new();
                let mut at = 0;
                for &s in sizes.iter().cycle() {
                    let s = s.max(least);
                    if at >= input.len() {
                        break;
                    }
                    let end = (at + s).min(input.len());
                    out.push(&input[at..end]);
                    at = end;
                }
                out
            }
        };
        let pause = match delivery {
            Delivery::Chunks(_, ms) => Duration::from_millis(*ms),
            _ => Duration::ZERO,
        };
        for c in chunks {
            if !pause.is_zero() {
                tokio::time::sleep(pause).await;
            }
            if tx.write_all(c).await.is_err() {
                break;
            }
        }
        // With a bad piece the sender stays open: the server must close by itself.
        if !bad {
            let _ = tx.shutdown().await;
        }
        tokio::time::Instant::now()
    };
    let read = async {
        let mut out = Vec::new();
        let _ = rx.read_to_end(&mut out).await;
        (out, tokio::time::Instant::now())
    };
    let serve = resp::connection(server, &fake, &cfg, 1);
    let limit = Duration::from_secs(3600);
    let Ok((served, last_sent, (out, closed))) =
        tokio::time::timeout(limit, async { tokio::join!(serve, send, read) }).await
    else {
        return Err("the connection did not end".into());
    };
    drop(served);
    if closed.saturating_duration_since(last_sent) > resp::PARTIAL_TIMEOUT + Duration::from_secs(1) {
        return Err(format!("closed {:?} after the last byte", closed - last_sent));
    }
    let (n, last) = count_replies(&out)?;
    if bad {
        if n != expected_replies + 1 || !last.starts_with(b"-ERR Protocol error") {
            return Err(format!(
                "{n} replies for {expected_replies} commands and a bad piece; last {:?}",
                String::from_utf8_lossy(&last[..last.len().min(200)])
            ));
        }
    } else if n != expected_replies {
        return Err(format!("{n} replies for {expected_replies} commands"));
    }
    if fake.taken() != expected_taken {
        return Err(format!("took {}, the model {expected_taken}", fake.taken()));
    }
    Ok(())
}

proptest! {
    #![proptest_config(config())]

    #[test]
    fn any_input_gets_one_reply_a_command_and_one_protocol_error(
        pieces in proptest::collection::vec(piece(), 1..12),
        delivery in delivery(),
    ) {
        let rt = tokio::runtime::Builder::new_current_thread().enable_all().start_paused(true).build().unwrap();
        rt.block_on(run_case(&pieces, &delivery)).map_err(TestCaseError::fail)?;
    }
}

/// The generator is not vacuous: its model and the server agree on a known case of each kind.
#[test]
fn known_cases_pass_the_oracle() {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .start_paused(true)
        .build()
        .unwrap();
    let cmd = |a: &[&str]| Piece::Command(a.iter().map(|s| s.as_bytes().to_vec()).collect());
    let cases = [
        vec![
            cmd(&["INCR", "a"]),
            cmd(&["MULTI"]),
            cmd(&["INCRBY", "a", "5"]),
            cmd(&["EXEC"]),
        ],
        vec![
            cmd(&["MULTI"]),
            cmd(&["INCR", "a"]),
            cmd(&["SET", "a", "1"]),
            cmd(&["EXEC"]),
        ],
        vec![cmd(&["INCR", "a"]), Piece::Nested(10_000, false), cmd(&["INCR", "a"])],
        vec![Piece::Echo(1_000_000)],
        vec![cmd(&["INCR", "b"]), Piece::ManyArgs(MAX_ARGS + 1)],
    ];
    for (i, pieces) in cases.iter().enumerate() {
        for d in [
            Delivery::Whole,
            Delivery::ByteByByte,
            Delivery::Chunks(vec![3, 5000], 30),
        ] {
            rt.block_on(run_case(pieces, &d))
                .unwrap_or_else(|e| panic!("case {i} {d:?}: {e}"));
        }
    }
    assert_eq!(model(&cases[0]).0, 6);
    assert_eq!(model(&cases[1]).0, 0);
}
