//! A Redis client as much as the black-box tests need: commands out, RESP2 replies in.

use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// A command as a Redis client sends it.
pub fn command(args: &[&str]) -> Vec<u8> {
    let mut out = format!("*{}\r\n", args.len()).into_bytes();
    for a in args {
        out.extend_from_slice(format!("${}\r\n{a}\r\n", a.len()).as_bytes());
    }
    out
}

/// One RESP2 reply, as much of it as this test reads: integers, bulk strings, nils, errors and
/// arrays of them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Reply {
    Int(u64),
    Bulk(String),
    Nil,
    Error(String),
    Array(Vec<Reply>),
}

/// Parses one reply from the start of `buf`: the reply and its length, `None` if incomplete.
pub fn parse(buf: &[u8]) -> Option<(Reply, usize)> {
    let end = buf.windows(2).position(|w| w == b"\r\n")?;
    let line = std::str::from_utf8(&buf[1..end]).expect("RESP lines are UTF-8");
    let after = end + 2;
    match buf.first()? {
        b':' => Some((Reply::Int(line.parse().unwrap()), after)),
        b'-' => Some((Reply::Error(line.to_string()), after)),
        b'$' if line == "-1" => Some((Reply::Nil, after)),
        b'$' => {
            let n: usize = line.parse().unwrap();
            let body = buf.get(after..after + n)?;
            buf.get(after + n..after + n + 2)?;
            Some((Reply::Bulk(String::from_utf8(body.to_vec()).unwrap()), after + n + 2))
        }
        b'*' => {
            let n: usize = line.parse().unwrap();
            let (mut items, mut at) = (Vec::with_capacity(n), after);
            for _ in 0..n {
                let (item, len) = parse(&buf[at..])?;
                items.push(item);
                at += len;
            }
            Some((Reply::Array(items), at))
        }
        other => panic!("unexpected RESP type byte {other}"),
    }
}

/// Sends `args` and reads the one reply, within a deadline.
pub async fn call(conn: &mut TcpStream, args: &[&str]) -> Reply {
    conn.write_all(&command(args)).await.unwrap();
    let mut buf = Vec::new();
    tokio::time::timeout(Duration::from_secs(10), async {
        loop {
            if let Some((reply, len)) = parse(&buf) {
                assert_eq!(len, buf.len(), "one reply, nothing after it");
                return reply;
            }
            let mut chunk = [0u8; 16 * 1024];
            let n = conn.read(&mut chunk).await.unwrap();
            assert!(n > 0, "the front end closed the connection");
            buf.extend_from_slice(&chunk[..n]);
        }
    })
    .await
    .expect("a reply within 10 s")
}
