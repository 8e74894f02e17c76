//! The HTTP/JSON and Redis-protocol front ends as `seqctl verify` calls them (docs/FRONTENDS.md):
//! one kept connection per caller and AllocSvr, one call at a time, every call under a deadline.
//!
//! How an answer maps to an outcome: a value is `Ok`; a refusal the server says took nothing (an
//! HTTP error without `may_have_been_taken`, a RESP error other than `-UNKNOWN`) or a connection
//! that could not be made is `Failed`; everything else (a deadline, a connection lost after the
//! request went out, `-UNKNOWN`, a 504 that may have taken) is `Unknown`, and the connection is
//! dropped.
//!
//! Deliberately left out: pipelining and TLS (verify judges values, not throughput; a deployment
//! whose front ends need client certificates is verified through gRPC).

use std::collections::HashMap;
use std::time::Duration;

use http_body_util::{BodyExt, Empty};
use hyper::body::Bytes;
use hyper::client::conn::http1::SendRequest;
use hyper_util::rt::TokioIo;
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::TcpStream;

use super::history::Outcome;

/// Why a call has no values: its outcome (`Failed` or `Unknown`) and what was said.
pub(crate) type NoValue = (Outcome, String);

fn failed(why: String) -> NoValue {
    (Outcome::Failed, why)
}

fn unknown(why: String) -> NoValue {
    (Outcome::Unknown, why)
}

async fn connect(addr: &str, within: Duration) -> Result<TcpStream, NoValue> {
    match tokio::time::timeout(within, TcpStream::connect(addr)).await {
        Ok(Ok(s)) => {
            // One small request at a time: Nagle's delay would only slow the run down.
            let _ = s.set_nodelay(true);
            Ok(s)
        }
        Ok(Err(e)) => Err(failed(format!("{addr}: {e}"))),
        Err(_) => Err(failed(format!("{addr}: connect timed out"))),
    }
}

/// One caller's HTTP connections.
pub(crate) struct Http {
    conns: HashMap<String, SendRequest<Empty<Bytes>>>,
    deadline: Duration,
}

impl Http {
    pub(crate) fn new(deadline: Duration) -> Self {
        Self {
            conns: HashMap::new(),
            deadline,
        }
    }

    /// The kept connection to `addr` (taken out for one call, put back after a good answer), or
    /// a new one.
    async fn conn(&mut self, addr: &str) -> Result<SendRequest<Empty<Bytes>>, NoValue> {
        if let Some(c) = self.conns.remove(addr)
            && !c.is_closed()
        {
            return Ok(c);
        }
        let stream = connect(addr, self.deadline).await?;
        let (send, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
            .await
            .map_err(|e| failed(format!("{addr}: {e}")))?;
        // Ends when the connection closes or `send` is dropped.
        tokio::spawn(conn);
        Ok(send)
    }

    /// `POST path` at `addr`: the JSON body of a 2xx answer.
    pub(crate) async fn post(&mut self, addr: &str, path: &str) -> Result<serde_json::Value, NoValue> {
        let mut send = self.conn(addr).await?;
        let req = hyper::Request::post(path)
            .header(hyper::header::HOST, addr)
            .body(Empty::new())
            .map_err(|e| failed(format!("{addr}{path}: {e}")))?;
        let answer = tokio::time::timeout(self.deadline, async {
            let resp = send.send_request(req).await?;
            let status = resp.status();
            Ok::<_, hyper::Error>((status, resp.into_body().collect().await?.to_bytes()))
        })
        .await;
        let (status, body) = match answer {
            Ok(Ok(a)) => a,
            Ok(Err(e)) => return Err(unknown(format!("{addr}{path}: {e}"))),
            Err(_) => return Err(unknown(format!("{addr}{path}: no answer in {:?}", self.deadline))),
        };
        self.conns.insert(addr.to_owned(), send);
        let v: serde_json::Value =
            serde_json::from_slice(&body).map_err(|e| unknown(format!("{addr}{path}: {status}, not JSON: {e}")))?;
        if status.is_success() {
            return Ok(v);
        }
        let why = format!("{addr}{path}: {status} {}", v["error"]["message"]);
        Err(if v["error"]["may_have_been_taken"] == true {
            unknown(why)
        } else {
            failed(why)
        })
    }
}

/// A RESP reply `seqctl verify` expects: an integer, or an array of integers (`NEXTID n`).
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum RespReply {
    Int(i64),
    Ints(Vec<i64>),
}

/// One caller's Redis-protocol connections.
pub(crate) struct Resp {
    conns: HashMap<String, BufReader<TcpStream>>,
    deadline: Duration,
}

impl Resp {
    pub(crate) fn new(deadline: Duration) -> Self {
        Self {
            conns: HashMap::new(),
            deadline,
        }
    }

    /// Sends `args` as one command to `addr` and reads its reply.
    pub(crate) async fn command(&mut self, addr: &str, args: &[String]) -> Result<RespReply, NoValue> {
        let mut conn = match self.conns.remove(addr) {
            Some(c) => c,
            None => BufReader::new(connect(addr, self.deadline).await?),
        };
        let mut frame = format!("*{}\r\n", args.len()).into_bytes();
        for a in args {
            frame.extend_from_slice(format!("${}\r\n{a}\r\n", a.len()).as_bytes());
        }
        let answer = tokio::time::timeout(self.deadline, async {
            conn.get_mut().write_all(&frame).await?;
            read_reply(&mut conn).await
        })
        .await;
        match answer {
            Ok(Ok(Ok(reply))) => {
                self.conns.insert(addr.to_owned(), conn);
                Ok(reply)
            }
            Ok(Ok(Err(server_error))) => {
                // An error reply leaves the connection in step.
                self.conns.insert(addr.to_owned(), conn);
                let why = format!("{addr} {}: {server_error}", args[0]);
                Err(if server_error.starts_with("UNKNOWN") {
                    unknown(why)
                } else {
                    failed(why)
                })
            }
            Ok(Err(e)) => Err(unknown(format!("{addr} {}: {e}", args[0]))),
            Err(_) => Err(unknown(format!("{addr} {}: no answer in {:?}", args[0], self.deadline))),
        }
    }
}

/// Longest reply line read: integers and short error texts only.
const MAX_LINE: u64 = 4096;

async fn read_line(conn: &mut BufReader<TcpStream>) -> std::io::Result<String> {
    let mut line = String::new();
    (&mut *conn).take(MAX_LINE).read_line(&mut line).await?;
    if !line.ends_with("\r\n") {
        return Err(std::io::Error::other(format!(
            "a torn or overlong reply line: {line:?}"
        )));
    }
    line.truncate(line.len() - 2);
    Ok(line)
}

fn int_of(line: &str) -> std::io::Result<i64> {
    line.strip_prefix(':')
        .and_then(|n| n.parse().ok())
        .ok_or_else(|| std::io::Error::other(format!("not an integer reply: {line:?}")))
}

/// The next reply: a value, a server's error text (`Err` inside), or an IO or protocol error.
async fn read_reply(conn: &mut BufReader<TcpStream>) -> std::io::Result<Result<RespReply, String>> {
    let line = read_line(conn).await?;
    if let Some(e) = line.strip_prefix('-') {
        return Ok(Err(e.to_owned()));
    }
    if let Some(n) = line.strip_prefix('*') {
        let n: usize = n
            .parse()
            .map_err(|_| std::io::Error::other(format!("a bad array header: {line:?}")))?;
        if n > seqsvr_proto::limits::MAX_IDS_PER_CALL as usize {
            return Err(std::io::Error::other(format!("an array of {n} replies")));
        }
        let mut ints = Vec::with_capacity(n);
        for _ in 0..n {
            ints.push(int_of(&read_line(conn).await?)?);
        }
        return Ok(Ok(RespReply::Ints(ints)));
    }
    Ok(Ok(RespReply::Int(int_of(&line)?)))
}
