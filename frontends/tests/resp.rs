//! The Redis front end over an in-memory connection and [`common::Fake`]: the replies byte for
//! byte in RESP2 and RESP3, authentication, pipelining, and bad input — each protocol error
//! answered once and the connection closed, with nothing taken from any counter.

mod common;

use std::sync::atomic::Ordering;

use common::Fake;
use proptest::prelude::*;
use redis_protocol::resp2::types::Resp2Frame as _;
use redis_protocol::resp3::types::Resp3Frame as _;
use seqsvr_frontends::calls::{CallError, ErrorKind};
use seqsvr_frontends::resp::{self, MAX_PENDING_BYTES, RespConfig};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// A command as a client sends it: an array of bulk strings.
fn cmd(args: &[&str]) -> Vec<u8> {
    common::resp_command(args)
}

/// Sends `input`, closes the sending side, and returns everything the server wrote until it
/// closed its side.
async fn exchange(fake: &Fake, cfg: &RespConfig, input: &[u8]) -> String {
    String::from_utf8_lossy(&exchange_bytes(fake, cfg, input).await).into_owned()
}

async fn exchange_bytes(fake: &Fake, cfg: &RespConfig, input: &[u8]) -> Vec<u8> {
    let (mut client, server) = tokio::io::duplex(1 << 20);
    let serve = resp::connection(server, fake, cfg, 7);
    let talk = async {
        client.write_all(input).await.unwrap();
        client.shutdown().await.unwrap();
        let mut out = Vec::new();
        client.read_to_end(&mut out).await.unwrap();
        out
    };
    let (served, out) = tokio::join!(serve, talk);
    served.unwrap();
    out
}

fn cmds(list: &[&[&str]]) -> Vec<u8> {
    list.iter().flat_map(|c| cmd(c)).collect()
}

#[tokio::test]
async fn counters_and_uids_answer_as_redis_would() {
    let fake = Fake::default();
    let out = exchange(
        &fake,
        &RespConfig::default(),
        &cmds(&[
            &["INCR", "orders"],
            &["incr", "orders"],
            &["INCRBY", "orders", "10"],
            &["GET", "orders"],
            &["GET", "never"],
            &["INCR", "u:42"],
            &["MGET", "orders", "never", "u:42"],
            &["NEXTID"],
            &["NEXTID", "2"],
            &["PING"],
            &["ECHO", "hi"],
            &["SELECT", "0"],
            &["SELECT", "1"],
        ]),
    )
    .await;
    assert_eq!(
        out,
        ":1\r\n:2\r\n:12\r\n$2\r\n12\r\n$-1\r\n:1\r\n*3\r\n$2\r\n12\r\n$-1\r\n$1\r\n1\r\n:1\r\n*2\r\n:2\r\n:3\r\n\
         +PONG\r\n$2\r\nhi\r\n+OK\r\n-ERR DB index is out of range\r\n"
    );
    assert_eq!(fake.taken(), 13);
}

#[tokio::test]
async fn iddecode_takes_an_id_apart_under_the_nodes_layout() {
    use seqsvr_proto::id_layout::{DEFAULT_EPOCH_MS, IdLayout, IdParts};
    let fake = Fake::default();
    let layout = IdLayout::javascript(DEFAULT_EPOCH_MS);
    let tick = (1_796_169_600_000 - DEFAULT_EPOCH_MS) / 10; // 2026-12-02T00:00:00Z
    let id = layout.compose(IdParts { tick, slot: 70, seq: 5 }).unwrap().to_string();
    let before = exchange(&fake, &RespConfig::default(), &cmds(&[&["IDDECODE", &id]])).await;
    assert!(
        before.starts_with("-TRYAGAIN") || before.starts_with("-ERR"),
        "{before}"
    );
    *fake.decoding.lock().unwrap() = Some((layout, 0));
    let out = exchange(
        &fake,
        &RespConfig::default(),
        &cmds(&[&["IDDECODE", &id], &["IDDECODE", "x"], &["IDDECODE"]]),
    )
    .await;
    assert_eq!(
        out,
        "*10\r\n$4\r\ntime\r\n$20\r\n2026-12-02T00:00:00Z\r\n$7\r\nunix_ms\r\n:1796169600000\r\n\
         $4\r\nslot\r\n:70\r\n$8\r\nsequence\r\n:5\r\n$3\r\nset\r\n$-1\r\n\
         -ERR id must be a decimal number, got \"x\"\r\n\
         -ERR wrong number of arguments for 'iddecode' command\r\n"
    );
    assert_eq!(fake.taken(), 0);
}

#[tokio::test]
async fn hello_3_switches_to_resp3_and_nil_is_resp3_null() {
    let fake = Fake::default();
    let out = exchange(
        &fake,
        &RespConfig::default(),
        &cmds(&[&["HELLO", "3"], &["INCR", "a"], &["GET", "b"], &["HELLO", "4"]]),
    )
    .await;
    assert!(out.starts_with("%7\r\n"), "{out}");
    assert!(out.contains("$5\r\nproto\r\n:3\r\n"), "{out}");
    assert!(
        out.ends_with(":1\r\n_\r\n-NOPROTO unsupported protocol version\r\n"),
        "{out}"
    );
}

#[tokio::test]
async fn with_a_password_nothing_is_served_before_auth() {
    let fake = Fake::default();
    let cfg = RespConfig {
        password: Some("s3cret".into()),
        ..RespConfig::default()
    };
    let out = exchange(
        &fake,
        &cfg,
        &cmds(&[
            &["INCR", "a"],
            &["AUTH", "wrong"],
            &["AUTH", "other", "s3cret"],
            &["INCR", "a"],
            &["AUTH", "s3cret"],
            &["INCR", "a"],
        ]),
    )
    .await;
    let lines: Vec<&str> = out.split("\r\n").collect();
    assert!(lines[0].starts_with("-NOAUTH"), "{out}");
    assert!(lines[1].starts_with("-WRONGPASS"), "{out}");
    assert!(lines[2].starts_with("-WRONGPASS"), "{out}");
    assert!(lines[3].starts_with("-NOAUTH"), "{out}");
    assert_eq!(&lines[4..7], ["+OK", ":1", ""], "{out}");
    assert_eq!(fake.taken(), 1);

    let fake = Fake::default();
    let out = exchange(
        &fake,
        &cfg,
        &cmds(&[&["HELLO", "3", "AUTH", "default", "s3cret"], &["INCR", "a"]]),
    )
    .await;
    assert!(out.starts_with("%7\r\n") && out.ends_with(":1\r\n"), "{out}");
    let out = exchange(&fake, &RespConfig::default(), &cmd(&["AUTH", "x"])).await;
    assert!(
        out.starts_with("-ERR AUTH <password> called without any password configured"),
        "{out}"
    );
}

#[tokio::test]
async fn commands_it_does_not_serve_are_unknown_and_take_nothing() {
    let fake = Fake::default();
    let out = exchange(
        &fake,
        &RespConfig::default(),
        &cmds(&[
            &["SET", "orders", "5"],
            &["DECR", "orders"],
            &["DEL", "orders"],
            &["INCR"],
        ]),
    )
    .await;
    assert_eq!(
        out,
        "-ERR unknown command 'SET', with args beginning with: 'orders' '5' \r\n\
         -ERR unknown command 'DECR', with args beginning with: 'orders' \r\n\
         -ERR unknown command 'DEL', with args beginning with: 'orders' \r\n\
         -ERR wrong number of arguments for 'incr' command\r\n"
    );
    assert_eq!(fake.taken(), 0);
}

#[tokio::test]
async fn bad_names_and_increments_are_refused_before_anything_is_taken() {
    let fake = Fake::default();
    let long = "k".repeat(257);
    let out = exchange(
        &fake,
        &RespConfig::default(),
        &cmds(&[
            &["INCR", "u:x"],
            &["INCR", "u:18446744073709551616"],
            &["INCR", ""],
            &["INCR", &long],
            &["INCRBY", "a", "0"],
            &["INCRBY", "a", "-3"],
            &["INCRBY", "a", "ten"],
            &["INCRBY", "a", "4294967296"],
            &["NEXTID", "many"],
        ]),
    )
    .await;
    assert_eq!(out.matches("\r\n").count(), 9, "{out}");
    assert!(
        out.split("\r\n")
            .filter(|l| !l.is_empty())
            .all(|l| l.starts_with("-ERR ")),
        "{out}"
    );
    assert_eq!(fake.taken(), 0);
}

#[tokio::test]
async fn failures_carry_a_code_a_caller_can_act_on() {
    let fake = Fake::default();
    for (kind, code) in [
        (ErrorKind::Unavailable, "-TRYAGAIN "),
        (ErrorKind::Overloaded, "-OVERLOADED "),
        (ErrorKind::Unknown, "-UNKNOWN "),
        (ErrorKind::Exhausted, "-EXHAUSTED "),
    ] {
        fake.fail_with(Some(CallError::new(kind, "why\r\nsplit")));
        let out = exchange(&fake, &RespConfig::default(), &cmd(&["INCR", "a"])).await;
        assert_eq!(out, format!("{code}why  split\r\n"));
    }
}

#[tokio::test]
async fn a_pipeline_is_answered_in_order() {
    let fake = Fake::default();
    let mut input = Vec::new();
    for _ in 0..1000 {
        input.extend(cmd(&["INCR", "p"]));
    }
    input.extend(cmd(&["GET", "p"]));
    let out = exchange(&fake, &RespConfig::default(), &input).await;
    let expected: String = (1..=1000).map(|i| format!(":{i}\r\n")).collect::<String>() + "$4\r\n1000\r\n";
    assert_eq!(out, expected);
}

#[tokio::test]
async fn quit_answers_ok_and_closes_even_with_more_sent() {
    let fake = Fake::default();
    let out = exchange(&fake, &RespConfig::default(), &cmds(&[&["QUIT"], &["INCR", "a"]])).await;
    assert_eq!(out, "+OK\r\n");
    assert_eq!(fake.taken(), 0);
}

#[tokio::test]
async fn protocol_errors_are_answered_once_and_close_the_connection() {
    let too_big = {
        let mut v = b"*2\r\n$4\r\nINCR\r\n$900000\r\n".to_vec();
        v.extend(std::iter::repeat_n(b'a', MAX_PENDING_BYTES + 10));
        v
    };
    let nested = b"*2\r\n$4\r\nINCR\r\n*1\r\n$1\r\na\r\n".to_vec();
    let not_array = b"$4\r\nINCR\r\n".to_vec();
    let integer_arg = b"*2\r\n$4\r\nINCR\r\n:5\r\n".to_vec();
    let inline = b"INCR a\r\n".to_vec();
    let too_many = {
        let mut v = b"*1002\r\n".to_vec();
        for _ in 0..1002 {
            v.extend_from_slice(b"$1\r\na\r\n");
        }
        v
    };
    for (what, mut input) in [
        ("too big", too_big),
        ("nested", nested),
        ("not an array", not_array),
        ("integer argument", integer_arg),
        ("inline", inline),
        ("too many arguments", too_many),
    ] {
        // Whatever follows the bad frame is never run.
        input.extend(cmd(&["INCR", "after"]));
        let fake = Fake::default();
        let out = exchange(&fake, &RespConfig::default(), &input).await;
        assert!(out.starts_with("-ERR Protocol error"), "{what}: {out}");
        assert_eq!(out.matches("\r\n").count(), 1, "{what}: {out}");
        assert_eq!(fake.taken(), 0, "{what}");
    }
}

#[tokio::test(start_paused = true)]
async fn a_command_that_never_completes_is_cut_off() {
    let fake = Fake::default();
    let cfg = RespConfig::default();
    let (mut client, server) = tokio::io::duplex(1 << 16);
    let serve = resp::connection(server, &fake, &cfg, 1);
    let talk = async {
        // Half a command, and the sender stays open.
        client.write_all(b"*2\r\n$4\r\nINCR\r\n$3\r\nab").await.unwrap();
        let mut out = vec![0u8; 256];
        let n = client.read(&mut out).await.unwrap();
        String::from_utf8_lossy(&out[..n]).into_owned()
    };
    let (served, out) = tokio::join!(serve, talk);
    served.unwrap();
    assert!(
        out.starts_with("-ERR Protocol error: a command not complete within"),
        "{out}"
    );
    assert_eq!(fake.taken.load(Ordering::SeqCst), 0);
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(300))]

    /// Integer replies are written without the codec: byte for byte what it writes, in RESP2
    /// and RESP3, for any value.
    #[test]
    fn integer_replies_are_the_codecs_bytes(i in any::<i64>()) {
        let codec2 = {
            let frame = redis_protocol::resp2::types::OwnedFrame::Integer(i);
            let mut b = vec![0; frame.encode_len(false)];
            redis_protocol::resp2::encode::encode(&mut b, &frame, false).unwrap();
            b
        };
        let codec3 = {
            let frame = redis_protocol::resp3::types::OwnedFrame::Number { data: i, attributes: None };
            let mut b = vec![0; frame.encode_len(false)];
            redis_protocol::resp3::encode::complete::encode(&mut b, &frame, false).unwrap();
            b
        };
        for (proto, codec) in [(2, codec2), (3, codec3)] {
            let mut ours = b"before".to_vec();
            resp::Reply::Int(i).encode(proto, &mut ours);
            prop_assert_eq!(&ours[..6], b"before");
            prop_assert_eq!(&ours[6..], &codec[..], "RESP{} {}", proto, i);
        }
    }
}

#[tokio::test]
async fn a_pipeline_of_distinct_names_runs_at_once_and_a_repeated_name_keeps_its_order() {
    let fake = Fake::default();
    let out = exchange(
        &fake,
        &RespConfig::default(),
        &cmds(&[
            &["INCR", "a"],
            &["INCR", "b"],
            &["INCR", "a"],
            &["INCR", "u:1"],
            &["INCR", "u:01"],
            &["INCR", "bad:\u{0}"],
            &["INCRBY", "a", "3"],
            &["INCR", "a"],
        ]),
    )
    .await;
    assert_eq!(out, ":1\r\n:1\r\n:2\r\n:1\r\n:2\r\n:1\r\n:5\r\n:6\r\n");
}

#[tokio::test]
async fn commands_before_a_broken_frame_are_answered() {
    let fake = Fake::default();
    let mut input = cmds(&[&["INCR", "a"], &["INCR", "b"]]);
    input.extend_from_slice(b"*1\r\n:1\r\n");
    input.extend(cmd(&["INCR", "c"]));
    let out = exchange(&fake, &RespConfig::default(), &input).await;
    assert!(out.starts_with(":1\r\n:1\r\n-ERR Protocol error"), "{out}");
    assert_eq!(fake.taken(), 2);
}

#[tokio::test(start_paused = true)]
async fn a_pipeline_whose_replies_are_never_read_is_cut_off() {
    let fake = Fake::default();
    let cfg = RespConfig::default();
    // A small pipe: the server's replies fill it and nobody reads them.
    let (mut client, server) = tokio::io::duplex(4096);
    let serve = resp::connection(server, &fake, &cfg, 1);
    let flood = async {
        let one = cmd(&["INCR", "a"]);
        // Writes until the server stops reading (it is stuck writing); bounded either way.
        for _ in 0..100_000 {
            if client.write_all(&one).await.is_err() {
                break;
            }
        }
    };
    let ended = tokio::select! {
        ended = serve => ended,
        () = async { flood.await; std::future::pending::<()>().await } => unreachable!(),
    };
    let e = ended.expect_err("the connection ends with an error");
    assert_eq!(e.kind(), std::io::ErrorKind::TimedOut, "{e}");
    // What it took before it stopped, it took once each: the values were answered in order.
    assert!(fake.taken() > 0 && fake.taken() < 100_000);
}

/// redis-py's default `pipeline()` is MULTI ... EXEC: it must get every value it took.
#[tokio::test]
async fn multi_exec_runs_the_queued_commands_and_answers_every_value() {
    let fake = Fake::default();
    let out = exchange(
        &fake,
        &RespConfig::default(),
        &cmds(&[
            &["MULTI"],
            &["INCR", "a"],
            &["INCR", "a"],
            &["INCRBY", "b", "5"],
            &["GET", "a"],
            &["EXEC"],
            &["INCR", "a"],
        ]),
    )
    .await;
    assert_eq!(
        out,
        "+OK\r\n+QUEUED\r\n+QUEUED\r\n+QUEUED\r\n+QUEUED\r\n*4\r\n:1\r\n:2\r\n:5\r\n$1\r\n2\r\n:3\r\n"
    );
    assert_eq!(fake.taken(), 8);
}

#[tokio::test]
async fn nothing_is_taken_before_exec_and_a_refused_command_aborts_it() {
    let fake = Fake::default();
    let out = exchange(
        &fake,
        &RespConfig::default(),
        &cmds(&[
            &["MULTI"],
            &["INCR", "a"],
            &["DISCARD"],
            &["GET", "a"],
            &["multi"],
            &["SET", "a", "1"],
            &["INCR", "a"],
            &["MULTI"],
            &["exec"],
            &["EXEC"],
            &["DISCARD"],
            &["WATCH", "a"],
            &["UNWATCH"],
        ]),
    )
    .await;
    let lines: Vec<&str> = out.split_terminator("\r\n").collect();
    assert_eq!(lines[..4], ["+OK", "+QUEUED", "+OK", "$-1"], "{out}");
    assert_eq!(lines[4], "+OK");
    assert!(lines[5].starts_with("-ERR unknown command 'SET'"), "{out}");
    assert_eq!(lines[6], "+QUEUED");
    assert_eq!(lines[7], "-ERR MULTI calls can not be nested");
    assert_eq!(lines[8], "-EXECABORT Transaction discarded because of previous errors.");
    assert_eq!(lines[9], "-ERR EXEC without MULTI");
    assert_eq!(lines[10], "-ERR DISCARD without MULTI");
    assert!(lines[11].starts_with("-ERR WATCH is not served"), "{out}");
    assert_eq!(lines[12], "+OK");
    assert_eq!(fake.taken(), 0);
}

#[tokio::test]
async fn a_transaction_needs_authentication_and_is_bounded() {
    let fake = Fake::default();
    let cfg = RespConfig {
        password: Some("pw".into()),
        ..RespConfig::default()
    };
    let out = exchange(&fake, &cfg, &cmds(&[&["MULTI"], &["INCR", "a"], &["EXEC"]])).await;
    assert_eq!(out.matches("-NOAUTH").count(), 3, "{out}");
    let mut input = cmd(&["MULTI"]);
    for _ in 0..=resp::MAX_QUEUED {
        input.extend(cmd(&["INCR", "a"]));
    }
    input.extend(cmd(&["EXEC"]));
    let out = exchange(&fake, &RespConfig::default(), &input).await;
    assert!(
        out.ends_with("-EXECABORT Transaction discarded because of previous errors.\r\n"),
        "{}",
        &out[out.len() - 200..]
    );
    assert!(out.contains("-ERR a transaction of more than"));
    assert_eq!(fake.taken(), 0);
}

/// A value above 2^63-1 was taken: the caller is told so, with the value, never "nothing taken".
#[tokio::test]
async fn a_value_above_the_largest_integer_is_answered_as_taken() {
    let fake = Fake::default();
    fake.set("key big", i64::MAX as u64);
    let out = exchange(&fake, &RespConfig::default(), &cmd(&["INCR", "big"])).await;
    assert!(out.starts_with("-TAKEN 9223372036854775808 was taken"), "{out}");
    let out = exchange(
        &fake,
        &RespConfig::default(),
        &cmds(&[&["HELLO", "3"], &["INCR", "big"]]),
    )
    .await;
    assert!(out.ends_with("(9223372036854775809\r\n"), "{out}");
    assert_eq!(fake.taken(), 2);
}

/// An MGET is one call of the backend for all its names (which the client library sends as one
/// batched read per owner), not one call per name; the answers keep the names' order.
#[tokio::test]
async fn an_mget_of_1000_names_is_one_call_of_the_backend() {
    let fake = Fake::default();
    let names: Vec<String> = (0..1_000)
        .map(|i| {
            if i % 2 == 0 {
                format!("u:{i}")
            } else {
                format!("key-{i}")
            }
        })
        .collect();
    for (i, name) in names.iter().enumerate().step_by(3) {
        let fake_name = match name.strip_prefix("u:") {
            Some(uid) => format!("uid {uid}"),
            None => format!("key {name}"),
        };
        fake.set(&fake_name, i as u64 + 1);
    }
    let mut args = vec!["MGET"];
    args.extend(names.iter().map(String::as_str));
    let out = exchange(&fake, &RespConfig::default(), &cmd(&args)).await;
    let mut want = String::from("*1000\r\n");
    for i in 0..names.len() {
        if i % 3 == 0 {
            let v = (i + 1).to_string();
            want.push_str(&format!("${}\r\n{v}\r\n", v.len()));
        } else {
            want.push_str("$-1\r\n");
        }
    }
    assert_eq!(out, want);
    assert_eq!(
        (
            fake.current_calls.load(Ordering::SeqCst),
            fake.many_calls.load(Ordering::SeqCst),
            fake.many_names.load(Ordering::SeqCst)
        ),
        (0, 1, 1_000),
        "(single reads, batched reads, names in them)"
    );
    // One name the backend cannot read fails the command: a nil would say "never used".
    fake.fail_with(Some(CallError::new(ErrorKind::Unavailable, "not now")));
    let out = exchange(&fake, &RespConfig::default(), &cmd(&["MGET", "a", "b"])).await;
    assert_eq!(out, "-TRYAGAIN not now\r\n");
}
