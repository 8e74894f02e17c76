//! The fuzz of the HTTP front end's connection layer (hyper, axum and our routes together) over
//! [`common::Fake`]: requests built from their parts — methods, paths of arbitrary bytes and
//! percent-escapes, queries, versions, up to a thousand headers and a megabyte of them, bodies
//! to a megabyte with right, wrong or chunked lengths — one to three on a connection, delivered
//! whole, one byte at a time or in random chunks with pauses, on a paused clock.
//!
//! The oracle, for every case: the connection's task never panics; it ends within the front
//! end's deadlines after the last byte sent; what comes back is a sequence of well-formed HTTP
//! responses, each with a `content-length`; every error's body is the documented JSON
//! `{"error":{"code","message","may_have_been_taken"}}` (but for hyper's bodiless 400 or 431 to
//! a head it cannot read, the last reply on its connection); and the numbers taken are exactly
//! those the successful replies hand out (nothing for a refused request).
//!
//! CI runs [`CI_CASES`]; `PROPTEST_CASES=<n>` runs more.

mod common;

use std::sync::Arc;
use std::time::Duration;

use common::Fake;
use proptest::prelude::*;
use seqsvr_frontends::http::{self, BODY_TIMEOUT, HEADER_TIMEOUT, WRITE_TIMEOUT};
use serde_json::Value;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

const CI_CASES: u32 = 96;

fn config() -> ProptestConfig {
    let cases = std::env::var("PROPTEST_CASES").ok().and_then(|v| v.parse().ok());
    ProptestConfig {
        cases: cases.unwrap_or(CI_CASES),
        // A failing case is big (up to megabytes): shrink it, but not for ever.
        max_shrink_iters: 2000,
        ..ProptestConfig::default()
    }
}

/// Bytes from a seed: megabytes without a strategy per byte.
fn filler(seed: u64, len: usize, alphabet: &[u8]) -> Vec<u8> {
    let mut x = seed | 1;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            alphabet[(x % alphabet.len() as u64) as usize]
        })
        .collect()
}

/// Every byte value, escaped or not: what a path segment may be made of.
fn segment() -> impl Strategy<Value = Vec<u8>> {
    prop_oneof![
        "[0-9]{1,25}".prop_map(String::into_bytes),
        "[a-z:_-]{1,20}".prop_map(String::into_bytes),
        // Percent-escapes of any bytes: invalid UTF-8 included (`%FF`, `%C3%28`).
        proptest::collection::vec(any::<u8>(), 0..40)
            .prop_map(|b| b.iter().flat_map(|x| format!("%{x:02X}").into_bytes()).collect()),
        // Broken escapes and raw bytes, which hyper must refuse or route.
        proptest::collection::vec(prop_oneof![Just(b'%'), any::<u8>(), Just(b'/')], 0..30),
        // Long: over the head bound.
        (0usize..40_000).prop_map(|n| vec![b'k'; n]),
    ]
}

fn path() -> impl Strategy<Value = Vec<u8>> {
    let templated = (
        prop_oneof![Just("/v1/seq/"), Just("/v1/counter/")],
        segment(),
        prop_oneof![Just(""), Just("/next"), Just("/reserve"), Just("/other")],
    )
        .prop_map(|(a, s, b)| [a.as_bytes(), &s, b.as_bytes()].concat());
    prop_oneof![
        4 => templated,
        1 => Just(b"/v1/ids".to_vec()),
        2 => Just(b"/v1/seq/batch".to_vec()),
        1 => proptest::collection::vec(any::<u8>(), 0..64).prop_map(|b| [b"/".as_slice(), &b].concat()),
        1 => Just(b"*".to_vec()),
    ]
}

fn query() -> impl Strategy<Value = Vec<u8>> {
    prop_oneof![
        3 => Just(Vec::new()),
        3 => "\\?count=[0-9]{1,12}".prop_map(String::into_bytes),
        1 => "\\?count=[0-9]{1,3}&[a-z]{1,5}=[a-z%0-9]{0,6}".prop_map(String::into_bytes),
        1 => proptest::collection::vec(any::<u8>(), 0..40).prop_map(|b| [b"?".as_slice(), &b].concat()),
    ]
}

fn method() -> impl Strategy<Value = Vec<u8>> {
    prop_oneof![
        6 => Just(b"POST".to_vec()),
        3 => Just(b"GET".to_vec()),
        1 => prop_oneof![Just("PUT"), Just("DELETE"), Just("PATCH"), Just("OPTIONS"), Just("TRACE")]
            .prop_map(|m| m.as_bytes().to_vec()),
        // HEAD and CONNECT are left out: a HEAD reply has a length and no body, and the oracle
        // reads bodies by their length.
        1 => "[A-Z]{1,10}".prop_filter("HEAD and CONNECT", |m| m != "HEAD" && m != "CONNECT")
            .prop_map(String::into_bytes),
        1 => proptest::collection::vec(any::<u8>(), 1..10),
    ]
}

fn version() -> impl Strategy<Value = &'static str> {
    prop_oneof![
        12 => Just("HTTP/1.1"),
        1 => Just("HTTP/1.0"),
        1 => Just("HTTP/2.0"),
        1 => Just("HTTP/1.1 x"),
        1 => Just("http/1.1"),
    ]
}

/// Headers: a few shaped ones, random ones, and in some cases hundreds up to a megabyte.
fn headers() -> impl Strategy<Value = Vec<u8>> {
    let one = prop_oneof![
        3 => ("[a-zA-Z-]{1,20}", "[ -~]{0,40}").prop_map(|(n, v)| format!("{n}: {v}\r\n").into_bytes()),
        1 => "[0-9]{0,6}".prop_map(|t| format!("x-seqsvr-timeout-ms: {t}\r\n").into_bytes()),
        1 => Just(b"expect: 100-continue\r\n".to_vec()),
        1 => Just(b"connection: close\r\n".to_vec()),
        1 => (proptest::collection::vec(any::<u8>(), 0..20), proptest::collection::vec(any::<u8>(), 0..40))
            .prop_map(|(n, v)| [n.as_slice(), b": ", &v, b"\r\n"].concat()),
    ];
    let shaped = proptest::collection::vec(one, 0..12).prop_map(|v| v.concat());
    let many = (0usize..1000, 0usize..1000, any::<u64>()).prop_map(|(count, len, seed)| {
        let value = filler(seed, len, b"abcdefghijklmnopqrstuvwxyz0123456789");
        (0..count)
            .flat_map(|i| [format!("x-pad-{i}: ").into_bytes(), value.clone(), b"\r\n".to_vec()].concat())
            .collect()
    });
    prop_oneof![4 => shaped, 1 => many]
}

/// A body and how its length is told.
#[derive(Debug, Clone)]
enum Framing {
    None,
    Exact,
    /// A `content-length` this much off (negative: the body is longer than said).
    Wrong(i64),
    Chunked,
    /// A chunk size that is not hex.
    BrokenChunk,
}

fn body() -> impl Strategy<Value = Vec<u8>> {
    let batch = (
        proptest::collection::vec(
            prop_oneof![
                any::<u64>().prop_map(|u| u.to_string()),
                "\"[0-9]{1,22}\"",
                Just("1.5".to_owned()),
                Just("\"x\"".to_owned()),
                Just("-1".to_owned())
            ],
            0..20,
        ),
        0usize..12_000,
    )
        .prop_map(|(uids, extra)| {
            let mut all: Vec<String> = uids;
            all.extend((0..extra).map(|i| i.to_string()));
            format!("{{\"uids\":[{}]}}", all.join(",")).into_bytes()
        });
    let damaged = (batch.clone(), any::<prop::sample::Index>(), any::<u8>()).prop_map(|(mut b, at, x)| {
        let i = at.index(b.len());
        b[i] = x;
        b.truncate(i + 1 + (x as usize % 8));
        b
    });
    prop_oneof![
        4 => Just(Vec::new()),
        4 => batch,
        2 => damaged,
        1 => (0usize..(1 << 20) + 1, any::<u64>()).prop_map(|(len, seed)| filler(seed, len, b"{}[]\",:0123456789 uids")),
    ]
}

fn framing() -> impl Strategy<Value = Framing> {
    prop_oneof![
        1 => Just(Framing::None),
        6 => Just(Framing::Exact),
        1 => (-20i64..20).prop_map(Framing::Wrong),
        2 => Just(Framing::Chunked),
        1 => Just(Framing::BrokenChunk),
    ]
}

/// One request as bytes, and whether a successful reply to it took numbers (a POST).
#[derive(Debug, Clone)]
struct Request {
    bytes: Vec<u8>,
    post: bool,
}

fn request() -> impl Strategy<Value = Request> {
    (method(), path(), query(), version(), headers(), body(), framing()).prop_map(
        |(method, path, query, version, headers, body, framing)| {
            let mut b = [
                method.as_slice(),
                b" ",
                &path,
                &query,
                b" ",
                version.as_bytes(),
                b"\r\n",
            ]
            .concat();
            b.extend_from_slice(b"host: x\r\n");
            b.extend_from_slice(&headers);
            match framing {
                Framing::None => {}
                Framing::Exact => b.extend_from_slice(format!("content-length: {}\r\n", body.len()).as_bytes()),
                Framing::Wrong(d) => {
                    let n = (body.len() as i64 + d).max(0);
                    b.extend_from_slice(format!("content-length: {n}\r\n").as_bytes());
                }
                Framing::Chunked | Framing::BrokenChunk => b.extend_from_slice(b"transfer-encoding: chunked\r\n"),
            }
            b.extend_from_slice(b"\r\n");
            match framing {
                Framing::Chunked => {
                    for c in body.chunks(4096) {
                        b.extend_from_slice(format!("{:x}\r\n", c.len()).as_bytes());
                        b.extend_from_slice(c);
                        b.extend_from_slice(b"\r\n");
                    }
                    b.extend_from_slice(b"0\r\n\r\n");
                }
                Framing::BrokenChunk => {
                    b.extend_from_slice(b"zz\r\n");
                    b.extend_from_slice(&body);
                }
                _ => b.extend_from_slice(&body),
            }
            Request {
                bytes: b,
                post: method == b"POST",
            }
        },
    )
}

/// How the bytes go out.
#[derive(Debug, Clone)]
enum Delivery {
    Whole,
    /// One byte per write (only for inputs up to 8 KiB, to stay fast).
    ByteAtATime,
    /// Writes of these sizes in turn, with a pause of this many ms after each of the first 20.
    Chunks(Vec<usize>, u64),
}

fn delivery() -> impl Strategy<Value = Delivery> {
    prop_oneof![
        2 => Just(Delivery::Whole),
        1 => Just(Delivery::ByteAtATime),
        3 => (proptest::collection::vec(1usize..8192, 1..20), prop_oneof![Just(0u64), 0u64..3000])
            .prop_map(|(sizes, pause)| Delivery::Chunks(sizes, pause)),
    ]
}

/// A response as read off the connection.
#[derive(Debug)]
struct Response {
    status: u16,
    json: bool,
    body: Vec<u8>,
}

/// Every response in `out`, or why `out` is not a sequence of well-formed responses.
fn responses(mut out: &[u8]) -> Result<Vec<Response>, String> {
    let mut all = Vec::new();
    while !out.is_empty() {
        let mut headers = [httparse::EMPTY_HEADER; 32];
        let mut r = httparse::Response::new(&mut headers);
        let n = match r.parse(out) {
            Ok(httparse::Status::Complete(n)) => n,
            other => {
                return Err(format!(
                    "not a response head: {other:?} in {:?}",
                    String::from_utf8_lossy(out)
                ));
            }
        };
        let status = r.code.ok_or("no status")?;
        let header = |name: &str| {
            r.headers
                .iter()
                .find(|h| h.name.eq_ignore_ascii_case(name))
                .map(|h| String::from_utf8_lossy(h.value).into_owned())
        };
        if status == 100 {
            out = &out[n..];
            continue;
        }
        let len: usize = header("content-length")
            .ok_or_else(|| format!("a {status} without content-length"))?
            .parse()
            .map_err(|e| format!("content-length: {e}"))?;
        let json = header("content-type").is_some_and(|t| t.starts_with("application/json"));
        if out.len() < n + len {
            return Err(format!("a {status} cut short: {} of {len} bytes", out.len() - n));
        }
        all.push(Response {
            status,
            json,
            body: out[n..n + len].to_vec(),
        });
        out = &out[n + len..];
    }
    Ok(all)
}

/// Numbers a successful reply to a POST handed out (ids are not counted by the fake).
fn numbers_taken(v: &Value) -> u64 {
    if let Some(results) = v.get("results").and_then(Value::as_array) {
        results.iter().filter(|r| r.get("seq").is_some()).count() as u64
    } else if v.get("ids").is_some() {
        0
    } else {
        v.get("count").and_then(Value::as_u64).unwrap_or(1)
    }
}

fn check_error_body(r: &Response) -> Result<(), String> {
    let v: Value = serde_json::from_slice(&r.body).map_err(|e| {
        format!(
            "a {} whose body is not JSON ({e}): {:?}",
            r.status,
            String::from_utf8_lossy(&r.body)
        )
    })?;
    let e = &v["error"];
    let ok = r.json
        && e["code"].is_string()
        && e["message"].is_string()
        && e["may_have_been_taken"].is_boolean()
        && v.as_object().is_some_and(|o| o.len() == 1);
    if !ok {
        return Err(format!("a {} whose body is not the documented error: {v}", r.status));
    }
    Ok(())
}

/// Runs one connection of `requests` delivered by `how`, and checks the oracle.
fn exchange(requests: &[Request], how: &Delivery, close: bool) -> Result<(), String> {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .start_paused(true)
        .build()
        .unwrap();
    rt.block_on(async {
        let fake = Arc::new(Fake::default());
        let (client, server) = tokio::io::duplex(64 * 1024);
        let served = tokio::spawn(http::connection(server, http::router(fake.clone())));
        let (mut rd, mut wr) = tokio::io::split(client);
        let input: Vec<u8> = requests.iter().flat_map(|r| r.bytes.clone()).collect();
        let mut pauses = Duration::ZERO;
        let writes: Vec<(&[u8], Duration)> = match how {
            Delivery::ByteAtATime if input.len() <= 8192 => input.chunks(1).map(|c| (c, Duration::ZERO)).collect(),
            Delivery::Whole | Delivery::ByteAtATime => vec![(&input[..], Duration::ZERO)],
            Delivery::Chunks(sizes, pause_ms) => {
                let mut v = Vec::new();
                let mut rest = &input[..];
                let mut i = 0;
                while !rest.is_empty() {
                    let (c, r) = rest.split_at(sizes[i % sizes.len()].min(rest.len()));
                    let pause = if i < 20 {
                        Duration::from_millis(*pause_ms)
                    } else {
                        Duration::ZERO
                    };
                    pauses += pause;
                    v.push((c, pause));
                    rest = r;
                    i += 1;
                }
                v
            }
        };
        let write = async {
            for (c, pause) in writes {
                if wr.write_all(c).await.is_err() {
                    // The server closed: the rest is not sent.
                    break;
                }
                if !pause.is_zero() {
                    tokio::time::sleep(pause).await;
                }
            }
            if close {
                let _ = wr.shutdown().await;
            }
            // Held open otherwise: the server must close an idle connection itself.
            std::future::pending::<()>().await;
        };
        let mut out = Vec::new();
        let read = rd.read_to_end(&mut out);
        let per_request = HEADER_TIMEOUT + BODY_TIMEOUT;
        let deadline =
            pauses + per_request * requests.len() as u32 + HEADER_TIMEOUT + WRITE_TIMEOUT + Duration::from_secs(1);
        let ended = tokio::time::timeout(deadline, async {
            tokio::select! {
                r = read => r,
                () = write => unreachable!(),
            }
        })
        .await;
        match ended {
            Err(_) => return Err(format!("the connection was still open after {deadline:?}")),
            Ok(Err(e)) => return Err(format!("reading the replies failed: {e}")),
            Ok(Ok(_)) => {}
        }
        match served.await {
            Err(e) if e.is_panic() => return Err("the connection's task panicked".into()),
            _ => {}
        }
        let replies = responses(&out)?;
        // More replies than requests when a wrong length cut a body short: its rest was read as
        // a request (and refused).
        let mut taken = 0;
        for (i, r) in replies.iter().enumerate() {
            // Hyper's own answer to a head it cannot parse or that is over the bound: no body,
            // and the last thing on the connection (module doc of `http`).
            let automatic = matches!(r.status, 400 | 431) && r.body.is_empty() && !r.json && i + 1 == replies.len();
            if r.status >= 400 {
                if !automatic {
                    check_error_body(r)?;
                }
            } else if (200..300).contains(&r.status) {
                let req = requests.get(i).ok_or("a success past the requests sent")?;
                let v: Value = serde_json::from_slice(&r.body).map_err(|e| format!("a {} not JSON: {e}", r.status))?;
                if req.post {
                    taken += numbers_taken(&v);
                }
            } else {
                return Err(format!("an unexpected status {}", r.status));
            }
        }
        if fake.taken() != taken {
            return Err(format!("{} numbers taken, {taken} handed out", fake.taken()));
        }
        Ok(())
    })
}

proptest! {
    #![proptest_config(config())]

    #[test]
    fn any_request_gets_well_formed_replies_json_errors_and_a_close_in_time(
        requests in proptest::collection::vec(request(), 1..4),
        how in delivery(),
        close in any::<bool>(),
    ) {
        exchange(&requests, &how, close).map_err(TestCaseError::fail)?;
    }
}

/// The generator is not vacuous: well-formed requests are answered 200 and take numbers.
#[test]
fn a_well_formed_pipeline_is_answered_and_takes_its_numbers() {
    let post = |p: &str| Request {
        bytes: format!("POST {p} HTTP/1.1\r\nhost: x\r\ncontent-length: 0\r\n\r\n").into_bytes(),
        post: true,
    };
    let requests = [post("/v1/seq/1/next"), post("/v1/counter/a/reserve?count=5")];
    exchange(&requests, &Delivery::ByteAtATime, false).unwrap();
    exchange(&requests, &Delivery::Chunks(vec![3, 7], 500), true).unwrap();
}
