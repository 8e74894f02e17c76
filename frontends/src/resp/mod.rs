//! The Redis protocol front end (`--resp-listen`): RESP2, and RESP3 after `HELLO 3`, so that any
//! language's Redis client takes numbers from seqsvr.
//!
//! Names map to numbers one way for every command: `u:<decimal uid>` is that uid's sequence,
//! every other name is a named counter ([`crate::calls::who_of_name`]).
//!
//! | command | answer |
//! |---|---|
//! | `INCR name` | the next value, an integer |
//! | `INCRBY name n` | a block of `n` values; the last of them, as Redis answers (the block is `reply-n+1..=reply`) |
//! | `GET name` | the last value handed out as a bulk string, nil when none ever was |
//! | `MGET name...` | `GET` of each (at most [`MAX_MGET_KEYS`]), read together: one batched read per owner |
//! | `NEXTID [count]` | a time-ordered id (integer), or `count` of them (array) |
//! | `IDDECODE id` | the id taken apart: a map (RESP2: a flat array) of `time` (RFC 3339), `unix_ms`, `slot`, `sequence`, `set` (nil when unknown) |
//! | `PING`, `ECHO`, `HELLO`, `AUTH`, `SELECT 0`, `CLIENT SETNAME/GETNAME/SETINFO/ID`, `QUIT` | as Redis |
//! | `INFO`, `COMMAND`, `CONFIG GET` | enough for `redis-cli`, `redis-benchmark` and client libraries to connect |
//! | `CLUSTER SLOTS/SHARDS/NODES/INFO/KEYSLOT/MYID`, `READWRITE`, `ASKING` (`READONLY` refused) | the Redis Cluster protocol (`cluster.rs`); `-MOVED` on a cluster-mode connection |
//! | `MULTI`, `EXEC`, `DISCARD` | a queued pipeline, without isolation (`transaction.rs`) |
//!
//! Every other command is `-ERR unknown command`, as Redis answers it: a counter that only rises
//! cannot `SET`, `DECR` or `DEL`, and a command it does not serve never gets a wrong answer.
//! Errors carry a code a caller can act on: `ERR` bad input, `TRYAGAIN` not ready or unreachable,
//! `OVERLOADED`, `UNKNOWN` (the call may have taken a number: its value is lost),
//! `EXHAUSTED` (the 64-bit space of the uid's section is used up), `TAKEN` (a value above 2^63-1
//! was taken; the message carries it). No message names a node or the RPC library's wording.
//!
//! Pipelined commands run one after another in the order sent (an `INCR` then a `GET` of the same
//! name in one pipeline sees the `INCR`), and their replies go out in one write per read.
//!
//! Requests are read by [`RequestReader`] (ours: an array of bulk strings and nothing else, without
//! recursion, resumably); `redis-protocol` only encodes replies. Bad input — any other type byte,
//! more than [`MAX_ARGS`] arguments, a command over [`MAX_PENDING_BYTES`] or not complete within
//! [`PARTIAL_TIMEOUT`] of its first byte — gets one `-ERR Protocol error` reply, then the
//! connection is closed, as Redis does; the deadlines, caps and memory bounds of a connection are
//! in `connection.rs`'s table. Nothing is taken from any counter for a command refused.
//!
//! With `tls` set, a connection is served only after the TLS handshake and only to a caller whose
//! certificate's role may take numbers; any other gets `-NOPERM` and is closed. `AUTH` is then not
//! needed (and the AllocSvr takes no password with TLS).
//!
//! Deliberately left out: inline commands (`PING\r\n` typed by hand; every client sends arrays),
//! `WATCH` (transactions are not isolated), pub/sub, and ACL users other than `default`.

mod cluster;
mod connection;
mod request;
mod transaction;

use std::sync::Arc;
use std::time::Duration;

use redis_protocol::resp2::types::{OwnedFrame as Frame2, Resp2Frame as _};
use redis_protocol::resp3::types::{OwnedFrame as Frame3, Resp3Frame as _};
use subtle::ConstantTimeEq;
use tracing::warn;

pub use connection::{ADMIT_TIMEOUT, KEEP_BYTES, PARTIAL_TIMEOUT, WRITE_TIMEOUT, connection, serve};
pub use request::{Ranges, RequestReader};
pub use transaction::MAX_QUEUED;

use crate::calls::{CallError, Calls, ErrorKind, Who, who_of_name};
use crate::{Front, count_call};

/// Most bytes of a command not yet complete (keys are at most 256 bytes; an `MGET` of
/// [`MAX_MGET_KEYS`] of them fits).
pub const MAX_PENDING_BYTES: usize = 512 * 1024;
/// Most names in one `MGET`.
pub const MAX_MGET_KEYS: usize = 1000;
/// Most arguments of one command, the command's name included.
pub const MAX_ARGS: usize = MAX_MGET_KEYS + 1;

/// How the front end runs.
#[derive(Debug, Clone)]
pub struct RespConfig {
    /// The `default` user's password; every connection must `AUTH` (or `HELLO ... AUTH`) first.
    pub password: Option<String>,
    /// Most connections at once; one more is answered `-ERR max number of clients reached`.
    pub max_connections: usize,
    /// Most connections at once not yet admitted (authenticated, or with a first command sent),
    /// within `max_connections`; one more is answered
    /// `-ERR max number of unauthenticated clients reached`.
    pub max_unauthenticated: usize,
    /// The bytes all connections together may hold for commands over 16 KiB while they arrive;
    /// a command that would pass it is answered `-OVERLOADED` and its connection closed.
    pub large_command_bytes: usize,
    /// An admitted connection that sends nothing for this long is closed (Redis's `timeout`);
    /// `None`, the default, never closes an idle connection.
    pub idle_timeout: Option<Duration>,
    /// Mutual TLS: only callers whose certificate may take numbers (`crate::tls`).
    pub tls: Option<Arc<tokio_rustls::rustls::ServerConfig>>,
    /// Redis Cluster mode: a counter key whose hash slot another node serves is answered
    /// `-MOVED` instead of forwarded (`cluster.rs`).
    pub cluster: bool,
}

impl Default for RespConfig {
    fn default() -> Self {
        Self {
            password: None,
            max_connections: 10_000,
            max_unauthenticated: 1_000,
            large_command_bytes: 64 << 20,
            idle_timeout: None,
            tls: None,
            cluster: false,
        }
    }
}

/// One reply, before it is encoded for the connection's protocol version.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Reply {
    Simple(&'static str),
    Int(i64),
    Bulk(Vec<u8>),
    Null,
    Array(Vec<Reply>),
    /// A map in RESP3, a flat array of keys and values in RESP2.
    Map(Vec<(Reply, Reply)>),
    /// The whole error line: its code, a space, the message.
    Error(String),
    /// A value that was taken but is above 2^63-1, the largest RESP integer: a RESP3 big number,
    /// and in RESP2 a `-TAKEN` error that carries it (there is no other way to).
    Big(u64),
}

impl Reply {
    fn ok() -> Self {
        Reply::Simple("OK")
    }

    fn err(msg: impl std::fmt::Display) -> Self {
        Reply::Error(format!("ERR {msg}"))
    }

    fn bulk(s: impl Into<Vec<u8>>) -> Self {
        Reply::Bulk(s.into())
    }

    /// A number as a RESP integer, which is signed: a value above 2^63-1 is [`Reply::Big`],
    /// never wrapped (`GET` carries any value, as a string).
    fn number(v: u64) -> Self {
        match i64::try_from(v) {
            Ok(i) => Reply::Int(i),
            Err(_) => Reply::Big(v),
        }
    }

    /// The answer for a failed call.
    fn of(e: &CallError) -> Self {
        let code = match e.kind {
            ErrorKind::BadInput | ErrorKind::Internal => "ERR",
            ErrorKind::Unavailable => "TRYAGAIN",
            ErrorKind::Overloaded => "OVERLOADED",
            ErrorKind::Unknown => "UNKNOWN",
            ErrorKind::Exhausted => "EXHAUSTED",
            ErrorKind::NotFound => "NOTFOUND",
            ErrorKind::Conflict => "CONFLICT",
            ErrorKind::Refused => "REFUSED",
            ErrorKind::Forbidden => "NOPERM",
        };
        // A reply line cannot hold a line break.
        Reply::Error(format!("{code} {}", e.message.replace(['\r', '\n'], " ")))
    }

    fn v2(self) -> Frame2 {
        match self {
            Reply::Simple(s) => Frame2::SimpleString(s.as_bytes().to_vec()),
            Reply::Int(i) => Frame2::Integer(i),
            Reply::Bulk(b) => Frame2::BulkString(b),
            Reply::Null => Frame2::Null,
            Reply::Array(items) => Frame2::Array(items.into_iter().map(Reply::v2).collect()),
            Reply::Map(pairs) => Frame2::Array(pairs.into_iter().flat_map(|(k, v)| [k.v2(), v.v2()]).collect()),
            Reply::Error(e) => Frame2::Error(e),
            Reply::Big(v) => Frame2::Error(format!(
                "TAKEN {v} was taken for you but is above 2^63-1, the largest RESP2 integer \
                 (HELLO 3 answers it as a big number)"
            )),
        }
    }

    fn v3(self) -> Frame3 {
        match self {
            Reply::Simple(s) => Frame3::SimpleString {
                data: s.as_bytes().to_vec(),
                attributes: None,
            },
            Reply::Int(i) => Frame3::Number {
                data: i,
                attributes: None,
            },
            Reply::Bulk(b) => Frame3::BlobString {
                data: b,
                attributes: None,
            },
            Reply::Null => Frame3::Null,
            Reply::Array(items) => Frame3::Array {
                data: items.into_iter().map(Reply::v3).collect(),
                attributes: None,
            },
            Reply::Map(pairs) => Frame3::Map {
                data: pairs.into_iter().map(|(k, v)| (k.v3(), v.v3())).collect(),
                attributes: None,
            },
            Reply::Error(e) => Frame3::SimpleError {
                data: e,
                attributes: None,
            },
            Reply::Big(v) => Frame3::BigNumber {
                data: v.to_string().into_bytes(),
                attributes: None,
            },
        }
    }

    /// Appends the encoded reply to `out`.
    pub fn encode(self, proto: u8, out: &mut Vec<u8>) {
        // Every INCR's answer: `:N` CRLF in RESP2 and RESP3 alike, written directly (through
        // the codec's frames it cost a frame, a length computed with a logarithm, and a resize).
        if let Reply::Int(i) = self {
            out.push(b':');
            out.extend_from_slice(itoa::Buffer::new().format(i).as_bytes());
            out.extend_from_slice(b"\r\n");
            return;
        }
        let start = out.len();
        let written = if proto >= 3 {
            let frame = self.v3();
            out.resize(start + frame.encode_len(false), 0);
            redis_protocol::resp3::encode::complete::encode(&mut out[start..], &frame, false)
        } else {
            let frame = self.v2();
            out.resize(start + frame.encode_len(false), 0);
            redis_protocol::resp2::encode::encode(&mut out[start..], &frame, false)
        };
        if let Err(e) = written {
            // Only a frame this module built is encoded, into room sized for it.
            warn!(error = %e, "cannot encode a reply");
            out.truncate(start);
            out.extend_from_slice(b"-ERR internal: reply not encodable\r\n");
        }
    }
}

/// One connection's state: protocol version, authentication, name.
pub struct Session<'a, C> {
    calls: &'a C,
    cfg: &'a RespConfig,
    id: u64,
    proto: u8,
    authed: bool,
    name: Option<Vec<u8>>,
    /// The commands queued since `MULTI`, while one is open.
    queue: Option<transaction::Queue>,
}

/// Where a pipeline's replies go: onto the wire, or into an `EXEC`'s array.
enum Sink<'o> {
    Wire(&'o mut Vec<u8>),
    Replies(&'o mut Vec<Reply>),
}

impl Sink<'_> {
    fn push(&mut self, reply: Reply, proto: u8) {
        match self {
            Sink::Wire(out) => reply.encode(proto, out),
            Sink::Replies(replies) => replies.push(reply),
        }
    }
}

/// What to do after a reply.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum After {
    Continue,
    Close,
}

impl<'a, C: Calls> Session<'a, C> {
    pub fn new(calls: &'a C, cfg: &'a RespConfig, id: u64) -> Self {
        Self {
            calls,
            cfg,
            id,
            proto: 2,
            authed: cfg.password.is_none(),
            name: None,
            queue: None,
        }
    }

    /// The protocol version replies are encoded in.
    pub fn proto(&self) -> u8 {
        self.proto
    }

    /// Whether the connection may run commands (it authenticated, or needs no password).
    pub fn authenticated(&self) -> bool {
        self.authed
    }

    /// Runs one command.
    pub async fn command(&mut self, args: &[&[u8]]) -> (Reply, After) {
        let mut upper = [0u8; 16];
        let name = upper_name(args[0], &mut upper);
        let rest = &args[1..];
        if !self.authed && !matches!(name, "AUTH" | "HELLO" | "QUIT") {
            return (Reply::Error("NOAUTH Authentication required.".into()), After::Continue);
        }
        let reply = match name {
            "INCR" => match rest {
                [key] => self.take(key, 1).await,
                _ => arity(name),
            },
            "INCRBY" => match rest {
                [key, by] => self.incr_by(key, by).await,
                _ => arity(name),
            },
            "GET" => match rest {
                [key] => self.get(key).await,
                _ => arity(name),
            },
            "MGET" => self.mget(rest).await,
            "NEXTID" => self.next_id(rest).await,
            "IDDECODE" => match rest {
                [id] => self.id_decode(id),
                _ => arity(name),
            },
            "PING" => match rest {
                [] => Reply::Simple("PONG"),
                [msg] => echo(msg),
                _ => arity(name),
            },
            "ECHO" => match rest {
                [msg] => echo(msg),
                _ => arity(name),
            },
            "QUIT" => return (Reply::ok(), After::Close),
            // Nothing is watched (`WATCH` is refused), so there is nothing to forget.
            "UNWATCH" => Reply::ok(),
            "AUTH" => match rest {
                [pass] => self.auth(b"default", pass),
                [user, pass] => self.auth(user, pass),
                _ => arity(name),
            },
            "HELLO" => self.hello(rest),
            "SELECT" => match rest {
                [db] if *db == b"0" => Reply::ok(),
                [_] => Reply::err("DB index is out of range"),
                _ => arity(name),
            },
            "CLIENT" => self.client(rest),
            "INFO" => Reply::Bulk(self.info().into_bytes()),
            "COMMAND" => cluster::command(rest),
            "CLUSTER" | "READONLY" | "READWRITE" | "ASKING" => self.cluster_command(name, rest),
            // `redis-benchmark` asks for persistence settings; there are none to give.
            "CONFIG" => match rest.first().map(|s| s.to_ascii_uppercase()) {
                Some(sub) if sub == b"GET" => Reply::Map(Vec::new()),
                _ => Reply::err("CONFIG: only GET is served, and it knows no parameter"),
            },
            _ => unknown(args[0], rest),
        };
        (reply, After::Continue)
    }

    /// Runs pipelined commands in order, answering each into `out`; stops at a `QUIT`.
    ///
    /// `MULTI` ... `EXEC` queues the commands between and runs them at `EXEC`
    /// ([`transaction`]); every other run of commands is a plain pipeline ([`Self::pipeline`]).
    pub async fn run(&mut self, commands: &[Vec<&[u8]>], out: &mut Vec<u8>) -> After {
        let mut i = 0;
        while i < commands.len() {
            if self.queue.is_some() || transaction::is_control(commands[i][0]) {
                let (reply, after) = self.transaction(&commands[i]).await;
                reply.encode(self.proto, out);
                if after == After::Close {
                    return After::Close;
                }
                i += 1;
                continue;
            }
            let end = commands[i..]
                .iter()
                .position(|c| transaction::is_control(c[0]))
                .map_or(commands.len(), |n| i + n);
            if self.pipeline(&commands[i..end], &mut Sink::Wire(out)).await == After::Close {
                return After::Close;
            }
            i = end;
        }
        After::Continue
    }

    /// Runs commands in order, each reply into `sink`; stops at a `QUIT`.
    ///
    /// Consecutive `INCR`s of distinct names run at once (a pipeline of them costs one wait, and
    /// the calls that go to another owner share its batch RPCs); an `INCR` of a name already in
    /// the run starts a new one, so that a name's values still rise in the order sent.
    async fn pipeline(&mut self, commands: &[Vec<&[u8]>], sink: &mut Sink<'_>) -> After {
        let mut i = 0;
        while i < commands.len() {
            let run = self.incr_run(&commands[i..]);
            if run.len() > 1 {
                let (this, n) = (&*self, run.len());
                let replies = futures::future::join_all(run.into_iter().map(|w| this.take_who(w, 1))).await;
                replies.into_iter().for_each(|r| sink.push(r, self.proto));
                i += n;
                continue;
            }
            let (reply, after) = self.command(&commands[i]).await;
            sink.push(reply, self.proto);
            if after == After::Close {
                return After::Close;
            }
            i += 1;
        }
        After::Continue
    }

    /// The names of the `INCR`s of distinct, well-formed names that `commands` starts with, each
    /// checked once here for the run to use.
    fn incr_run<'b>(&self, commands: &[Vec<&'b [u8]>]) -> Vec<Who<'b>> {
        if !self.authed {
            return Vec::new();
        }
        // At most MAX_DECODED names, so even keys made to collide cost a bounded probe; the
        // default SipHash was a visible share of a pipelined INCR's CPU.
        let mut seen = std::collections::HashSet::with_hasher(foldhash::fast::RandomState::default());
        commands
            .iter()
            .map_while(|c| {
                if c.len() != 2 || !c[0].eq_ignore_ascii_case(b"INCR") {
                    return None;
                }
                let w = who(c[1]).ok()?;
                seen.insert(w).then_some(w)
            })
            .collect()
    }

    async fn take(&self, name: &[u8], count: u32) -> Reply {
        match who(name) {
            Ok(w) => self.take_who(w, count).await,
            Err(e) => Reply::of(&e),
        }
    }

    async fn take_who(&self, who: Who<'_>, count: u32) -> Reply {
        if let Some(moved) = self.redirect(who) {
            return moved;
        }
        let r = self.calls.take(who, count).await;
        count_call(Front::Resp, &r);
        match r {
            // The last value of the block, as Redis's INCRBY answers the new value.
            Ok(first) => Reply::number(first.value + u64::from(count) - 1),
            Err(e) => Reply::of(&e),
        }
    }

    async fn incr_by(&self, name: &[u8], by: &[u8]) -> Reply {
        let Ok(by) = std::str::from_utf8(by).unwrap_or_default().parse::<i64>() else {
            return Reply::err("value is not an integer or out of range");
        };
        if by <= 0 {
            return Reply::err(format!(
                "INCRBY {by}: seqsvr counters only rise; the increment must be at least 1"
            ));
        }
        let Ok(count) = u32::try_from(by) else {
            return Reply::err(format!("INCRBY {by}: a block is at most {} values", u32::MAX));
        };
        self.take(name, count).await
    }

    async fn get(&self, name: &[u8]) -> Reply {
        let who = match who(name) {
            Ok(w) => w,
            Err(e) => return Reply::of(&e),
        };
        if let Some(moved) = self.redirect(who) {
            return moved;
        }
        let r = self.calls.current(who).await;
        count_call(Front::Resp, &r);
        match r {
            Ok(t) if t.value == 0 => Reply::Null,
            Ok(t) => Reply::bulk(t.value.to_string()),
            Err(e) => Reply::of(&e),
        }
    }

    async fn mget(&self, names: &[&[u8]]) -> Reply {
        if names.is_empty() {
            return arity("MGET");
        }
        if names.len() > MAX_MGET_KEYS {
            return Reply::err(format!("MGET of {} names; at most {MAX_MGET_KEYS}", names.len()));
        }
        if let Some(moved) = self.redirect_many(names) {
            return moved;
        }
        let mut whos = Vec::with_capacity(names.len());
        for name in names {
            match who(name) {
                Ok(w) => whos.push(w),
                Err(e) => return Reply::of(&e),
            }
        }
        // One call for every name: the backend reads them together (one batched read per owner
        // through the client library), and the answers keep the request's order.
        let results = self.calls.current_many(&whos).await.and_then(|results| {
            if results.len() == whos.len() {
                return Ok(results);
            }
            let why = format!("{} answers for an MGET of {} names", results.len(), whos.len());
            Err(CallError::new(ErrorKind::Internal, why))
        });
        let results = match results {
            Ok(results) => results,
            Err(e) => {
                // Counted once: no name was answered.
                count_call::<()>(Front::Resp, &Err(e.clone()));
                return Reply::of(&e);
            }
        };
        let mut values = Vec::with_capacity(results.len());
        for r in results {
            count_call(Front::Resp, &r);
            match r {
                Ok(t) if t.value == 0 => values.push(Reply::Null),
                Ok(t) => values.push(Reply::bulk(t.value.to_string())),
                // One failed read fails the command: a nil would say "never used", which is wrong.
                Err(e) => return Reply::of(&e),
            }
        }
        Reply::Array(values)
    }

    async fn next_id(&self, rest: &[&[u8]]) -> Reply {
        let count = match rest {
            [] => None,
            [n] => match std::str::from_utf8(n)
                .map_err(|_| ())
                .and_then(|s| s.parse::<u32>().map_err(|_| ()))
            {
                Ok(n) => Some(n),
                Err(()) => return Reply::err("NEXTID count must be a positive integer"),
            },
            _ => return arity("NEXTID"),
        };
        let r = self.calls.ids(count.unwrap_or(1)).await;
        count_call(Front::Resp, &r);
        match (r, count) {
            (Ok(ids), None) if ids.len() == 1 => Reply::number(ids[0]),
            (Ok(ids), Some(_)) => Reply::Array(ids.into_iter().map(Reply::number).collect()),
            (Ok(ids), None) => Reply::err(format!("internal: {} ids for a call of one", ids.len())),
            (Err(e), _) => Reply::of(&e),
        }
    }

    fn id_decode(&self, id: &[u8]) -> Reply {
        let decoded = std::str::from_utf8(id)
            .map_err(|_| CallError::bad_input("IDDECODE id must be a decimal number"))
            .and_then(|s| crate::calls::parse_u64(s, "id"))
            .and_then(|id| crate::calls::decode_id(id, self.calls.id_decoding()));
        match decoded {
            Ok(d) => {
                let field = |k: &str| Reply::Bulk(k.as_bytes().to_vec());
                Reply::Map(vec![
                    (field("time"), Reply::Bulk(d.time.into_bytes())),
                    (field("unix_ms"), Reply::number(d.unix_ms)),
                    (field("slot"), Reply::number(d.slot)),
                    (field("sequence"), Reply::number(d.sequence)),
                    (field("set"), d.set_id.map_or(Reply::Null, Reply::number)),
                ])
            }
            Err(e) => Reply::of(&e),
        }
    }

    fn auth(&mut self, user: &[u8], pass: &[u8]) -> Reply {
        let Some(password) = &self.cfg.password else {
            return Reply::err(
                "AUTH <password> called without any password configured for the default user. \
                 Are you sure your configuration is correct?",
            );
        };
        // Compared in constant time: the time of a refusal says nothing of the password.
        let matches = user == b"default" && bool::from(password.as_bytes().ct_eq(pass));
        if !matches {
            return Reply::Error("WRONGPASS invalid username-password pair or user is disabled.".into());
        }
        self.authed = true;
        Reply::ok()
    }

    /// `HELLO [protover [AUTH user pass] [SETNAME name]]`.
    fn hello(&mut self, rest: &[&[u8]]) -> Reply {
        let mut proto = self.proto;
        if let Some(v) = rest.first() {
            match *v {
                b"2" => proto = 2,
                b"3" => proto = 3,
                _ => return Reply::Error("NOPROTO unsupported protocol version".into()),
            }
        }
        let mut i = 1;
        let mut setname = None;
        while i < rest.len() {
            match rest[i].to_ascii_uppercase().as_slice() {
                b"AUTH" if i + 2 < rest.len() => {
                    let reply = self.auth(rest[i + 1], rest[i + 2]);
                    if matches!(reply, Reply::Error(_)) {
                        return reply;
                    }
                    i += 3;
                }
                b"SETNAME" if i + 1 < rest.len() => {
                    setname = Some(rest[i + 1].to_vec());
                    i += 2;
                }
                _ => {
                    return Reply::err(format!(
                        "syntax error in HELLO option '{}'",
                        String::from_utf8_lossy(rest[i])
                    ));
                }
            }
        }
        if !self.authed {
            return Reply::Error(
                "NOAUTH HELLO must be called with the client already authenticated, otherwise the \
                 HELLO <proto> AUTH <user> <pass> option can be used to authenticate the client and \
                 select the RESP protocol version at the same time"
                    .into(),
            );
        }
        if setname.is_some() {
            self.name = setname;
        }
        self.proto = proto;
        let s = |k: &'static str| Reply::bulk(k);
        Reply::Map(vec![
            (s("server"), s("seqsvr")),
            (s("version"), s(env!("CARGO_PKG_VERSION"))),
            (s("proto"), Reply::Int(i64::from(proto))),
            (s("id"), Reply::Int(self.id as i64)),
            (s("mode"), s(if self.cfg.cluster { "cluster" } else { "standalone" })),
            (s("role"), s("master")),
            (s("modules"), Reply::Array(Vec::new())),
        ])
    }

    fn client(&mut self, rest: &[&[u8]]) -> Reply {
        let sub = rest.first().map(|s| s.to_ascii_uppercase()).unwrap_or_default();
        match (sub.as_slice(), &rest[rest.len().min(1)..]) {
            (b"SETNAME", [name]) => {
                if name.iter().any(|&b| b <= b' ' || b > b'~') {
                    return Reply::err("Client names cannot contain spaces, newlines or special characters.");
                }
                self.name = (!name.is_empty()).then(|| name.to_vec());
                Reply::ok()
            }
            (b"GETNAME", []) => self.name.clone().map_or(Reply::Null, Reply::Bulk),
            (b"ID", []) => Reply::Int(self.id as i64),
            // Client libraries announce their name and version; nothing to keep.
            (b"SETINFO", [_, _]) => Reply::ok(),
            (b"SETNAME" | b"GETNAME" | b"ID" | b"SETINFO", _) => arity("CLIENT"),
            _ => Reply::err(format!(
                "unknown subcommand '{}'. Try CLIENT HELP.",
                String::from_utf8_lossy(&sub)
            )),
        }
    }

    fn info(&self) -> String {
        // The Redis version is the protocol level served, which some client libraries read.
        format!(
            "# Server\r\nredis_version:7.0.0\r\nseqsvr_version:{}\r\nredis_mode:{}\r\n\
             # Clients\r\nproto:{}\r\n# Cluster\r\ncluster_enabled:{}\r\n",
            env!("CARGO_PKG_VERSION"),
            if self.cfg.cluster { "cluster" } else { "standalone" },
            self.proto,
            u8::from(self.cfg.cluster)
        )
    }
}

/// A name as the number it denotes, or bad input.
fn who(name: &[u8]) -> Result<Who<'_>, CallError> {
    let name = std::str::from_utf8(name).map_err(|_| CallError::bad_input("a name must be UTF-8"))?;
    let who = who_of_name(name)?;
    if let Who::Key(key) = who {
        seqsvr_proto::keys::check_key_str(key).map_err(|e| CallError::bad_input(e.to_string()))?;
    }
    Ok(who)
}

/// Most bytes `ECHO` and `PING` send back: a reply the caller does not read is held for
/// [`WRITE_TIMEOUT`], and nothing this service answers is larger than this but what a caller
/// asks to be echoed.
pub const MAX_ECHO_BYTES: usize = 4096;

fn echo(msg: &[u8]) -> Reply {
    if msg.len() > MAX_ECHO_BYTES {
        return Reply::err(format!(
            "a message of {} bytes; at most {MAX_ECHO_BYTES} are echoed",
            msg.len()
        ));
    }
    Reply::bulk(msg)
}

fn arity(name: &str) -> Reply {
    Reply::err(format!(
        "wrong number of arguments for '{}' command",
        name.to_ascii_lowercase()
    ))
}

/// Redis's own words for a command it does not know.
fn unknown(name: &[u8], rest: &[&[u8]]) -> Reply {
    let clip = |b: &[u8]| String::from_utf8_lossy(&b[..b.len().min(128)]).replace(['\r', '\n'], " ");
    let args: String = rest.iter().take(3).map(|a| format!("'{}' ", clip(a))).collect();
    Reply::err(format!(
        "unknown command '{}', with args beginning with: {args}",
        clip(name)
    ))
}

/// A command's name in upper case, in `buf` on the stack (a `String` per command showed in profiles
/// of pipelined INCRs); a name longer than any served, or not UTF-8, is no command's: "".
fn upper_name<'b>(raw: &[u8], buf: &'b mut [u8; 16]) -> &'b str {
    let Some(upper) = buf.get_mut(..raw.len()) else {
        return "";
    };
    upper.copy_from_slice(raw);
    upper.make_ascii_uppercase();
    std::str::from_utf8(upper).unwrap_or_default()
}
