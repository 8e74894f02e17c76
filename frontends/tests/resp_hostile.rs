//! The Redis front end against callers that mean harm or are broken: deep nesting, commands
//! trickled a byte at a time or larger than the bound, sockets that never speak. Each must cost
//! the server a bounded amount and end in one protocol error or a close — never a crash, and
//! never a number taken.

mod common;

use std::time::Duration;

use common::Fake;
use seqsvr_frontends::resp::{self, MAX_PENDING_BYTES, RespConfig};
use tokio::io::{AsyncReadExt, AsyncWriteExt, DuplexStream};

fn cmd(args: &[&[u8]]) -> Vec<u8> {
    common::resp_command(args)
}

/// Reads what the server writes until it closes its side; when `limit` passes first, closes
/// the client's side (so that the server's loop ends too) and returns `None`.
async fn read_until_closed(client: &mut DuplexStream, limit: Duration) -> Option<String> {
    let mut out = Vec::new();
    match tokio::time::timeout(limit, client.read_to_end(&mut out)).await {
        Ok(_) => Some(String::from_utf8_lossy(&out).into_owned()),
        Err(_) => {
            let _ = client.shutdown().await;
            None
        }
    }
}

/// `*1\r\n` ten thousand times: an array in an array in an array. A request is an array of bulk
/// strings and nothing else, so the first nested type byte is refused.
#[tokio::test]
async fn deep_nesting_is_refused_at_the_first_nested_array() {
    for password in [None, Some("secret".to_string())] {
        for complete in [false, true] {
            let fake = Fake::default();
            let cfg = RespConfig {
                password: password.clone(),
                ..RespConfig::default()
            };
            let mut input = b"*1\r\n".repeat(10_000);
            if complete {
                input.extend_from_slice(b"$4\r\nPING\r\n");
            }
            let (mut client, server) = tokio::io::duplex(1 << 20);
            client.write_all(&input).await.unwrap();
            let (served, out) = tokio::join!(
                resp::connection(server, &fake, &cfg, 1),
                read_until_closed(&mut client, Duration::from_secs(30))
            );
            served.unwrap();
            let out = out.expect("the connection is closed");
            assert!(out.starts_with("-ERR Protocol error"), "{out}");
            assert_eq!(out.matches("\r\n").count(), 1, "{out}");
            assert_eq!(fake.taken(), 0);
        }
    }
}

/// A command trickled one byte a read costs work in proportion to its bytes: the reader keeps
/// its place between reads instead of decoding the pending bytes from their start each time.
#[test]
fn a_trickled_command_is_read_in_linear_work() {
    // 1,000 arguments of 480 bytes: ~490 KB, under the size bound.
    let arg = vec![b'a'; 480];
    let mut args: Vec<&[u8]> = vec![b"ECHO"];
    args.extend(std::iter::repeat_n(arg.as_slice(), 999));
    let input = cmd(&args);
    assert!(input.len() < MAX_PENDING_BYTES);
    let mut reader = resp::RequestReader::default();
    let mut buf = Vec::new();
    let mut complete = 0;
    for &b in &input {
        buf.push(b);
        while let Some(command) = reader.next(&buf).unwrap() {
            assert_eq!(command.len(), 1000);
            complete += 1;
        }
    }
    assert_eq!(complete, 1);
    // Each byte examined about once (a line's digits may be looked at again when its end
    // arrives later), not once per read.
    assert!(
        reader.examined() < 3 * input.len() as u64,
        "{} bytes examined for {} bytes of input",
        reader.examined(),
        input.len()
    );
}

/// "Within 10 s of its first byte": a command that keeps arriving, a byte every few seconds,
/// is cut off at its deadline, not kept alive by each byte.
#[tokio::test(start_paused = true)]
async fn a_command_has_a_deadline_from_its_first_byte() {
    let fake = Fake::default();
    let cfg = RespConfig::default();
    let (mut client, server) = tokio::io::duplex(1 << 16);
    let (mut rx, mut tx) = tokio::io::split(&mut client);
    let started = tokio::time::Instant::now();
    let trickle = async {
        tx.write_all(b"*2\r\n$4\r\nECHO\r\n$100\r\n").await.unwrap();
        for _ in 0..100 {
            tokio::time::sleep(Duration::from_secs(3)).await;
            if tx.write_all(b"a").await.is_err() {
                break;
            }
        }
    };
    let read = async {
        let mut out = Vec::new();
        let _ = rx.read_to_end(&mut out).await;
        (String::from_utf8_lossy(&out).into_owned(), started.elapsed())
    };
    let serve = resp::connection(server, &fake, &cfg, 1);
    let (served, (out, after), ()) = tokio::join!(serve, read, trickle);
    served.unwrap();
    assert!(
        out.starts_with("-ERR Protocol error: a command not complete within"),
        "{out}"
    );
    assert!(
        after <= resp::PARTIAL_TIMEOUT + Duration::from_secs(1),
        "closed after {after:?}"
    );
}

/// The size bound is hard: a command that says it is larger is refused as soon as it says so,
/// and one that arrives whole in one write is refused all the same, never run.
#[tokio::test(start_paused = true)]
async fn a_command_over_the_bound_is_refused_however_it_arrives() {
    let big = vec![b'a'; 1 << 20];
    let whole = cmd(&[b"ECHO", &big]);
    let announced = format!("*2\r\n$4\r\nECHO\r\n${}\r\n", 1 << 20).into_bytes();
    for (what, input) in [("whole", whole), ("announced", announced)] {
        let fake = Fake::default();
        let cfg = RespConfig::default();
        let (mut client, server) = tokio::io::duplex(4 << 20);
        client.write_all(&input).await.unwrap();
        // The sender stays open: the refusal must not wait for more bytes or for a deadline.
        let (served, out) = tokio::join!(
            resp::connection(server, &fake, &cfg, 1),
            read_until_closed(&mut client, Duration::from_secs(1))
        );
        served.unwrap();
        let out = out.unwrap_or_else(|| panic!("{what}: not refused at once"));
        assert!(
            out.starts_with("-ERR Protocol error: a command of more than"),
            "{what}: {out}"
        );
        assert_eq!(out.matches("\r\n").count(), 1, "{what}: {out}");
    }
}

/// With a password, a connection that has not authenticated within the deadline is closed.
#[tokio::test(start_paused = true)]
async fn a_connection_that_never_authenticates_is_closed() {
    let fake = Fake::default();
    let cfg = RespConfig {
        password: Some("secret".into()),
        ..RespConfig::default()
    };
    let (mut client, server) = tokio::io::duplex(1 << 16);
    // PINGs keep it talking, but only AUTH admits it.
    let talk = async {
        for _ in 0..20 {
            if client.write_all(&cmd(&[b"PING"])).await.is_err() {
                break;
            }
            tokio::time::sleep(Duration::from_secs(1)).await;
        }
        read_until_closed(&mut client, Duration::from_secs(60)).await
    };
    let (served, out) = tokio::join!(resp::connection(server, &fake, &cfg, 1), talk);
    served.unwrap();
    let out = out.expect("closed");
    assert!(
        out.ends_with("-NOAUTH authentication not completed within 10s; closing\r\n"),
        "{out}"
    );
}

/// Without a password, a connection must still send its first command within the deadline:
/// silent sockets do not hold slots.
#[tokio::test(start_paused = true)]
async fn a_silent_connection_is_closed() {
    let fake = Fake::default();
    let cfg = RespConfig::default();
    let (mut client, server) = tokio::io::duplex(1 << 16);
    let (served, out) = tokio::join!(
        resp::connection(server, &fake, &cfg, 1),
        read_until_closed(&mut client, Duration::from_secs(60))
    );
    served.unwrap();
    assert!(out.expect("closed").starts_with("-ERR no command within"));
}

/// An admitted connection may stay idle forever by default (as Redis's `timeout 0`), and is
/// closed after the idle timeout when one is set.
#[tokio::test(start_paused = true)]
async fn the_idle_timeout_closes_a_quiet_connection() {
    for idle in [None, Some(Duration::from_secs(300))] {
        let fake = Fake::default();
        let cfg = RespConfig {
            idle_timeout: idle,
            ..RespConfig::default()
        };
        let (mut client, server) = tokio::io::duplex(1 << 16);
        client.write_all(&cmd(&[b"INCR", b"a"])).await.unwrap();
        let mut first = [0u8; 4];
        let serve = resp::connection(server, &fake, &cfg, 1);
        let talk = async {
            client.read_exact(&mut first).await.unwrap();
            read_until_closed(&mut client, Duration::from_secs(3600)).await
        };
        let (served, out) = tokio::join!(serve, talk);
        match idle {
            None => assert!(out.is_none(), "closed without an idle timeout"),
            Some(_) => {
                served.unwrap();
                assert_eq!(out.as_deref(), Some(""), "closed quietly");
            }
        }
        assert_eq!(&first, b":1\r\n");
    }
}

/// Connections that have not authenticated have a small cap of their own: silent sockets fill
/// it, and authenticated clients still get in.
#[tokio::test]
async fn unauthenticated_connections_have_their_own_cap() {
    let fake = std::sync::Arc::new(Fake::default());
    let cfg = std::sync::Arc::new(RespConfig {
        password: Some("secret".into()),
        max_unauthenticated: 3,
        ..RespConfig::default()
    });
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let (stop_tx, stop) = tokio::sync::watch::channel(false);
    let server = tokio::spawn(resp::serve(listener, fake.clone(), cfg, stop));
    let mut silent = Vec::new();
    for _ in 0..3 {
        silent.push(tokio::net::TcpStream::connect(addr).await.unwrap());
    }
    // The fourth that has not authenticated is refused...
    let mut refused = tokio::net::TcpStream::connect(addr).await.unwrap();
    let mut out = String::new();
    tokio::time::timeout(Duration::from_secs(10), refused.read_to_string(&mut out))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(out, "-ERR max number of unauthenticated clients reached\r\n");
    // ...and once one of the silent ones authenticates, its place is free for another.
    silent[0].write_all(&cmd(&[b"AUTH", b"secret"])).await.unwrap();
    let mut ok = [0u8; 5];
    silent[0].read_exact(&mut ok).await.unwrap();
    assert_eq!(&ok, b"+OK\r\n");
    let mut next = tokio::net::TcpStream::connect(addr).await.unwrap();
    next.write_all(&cmd(&[b"AUTH", b"secret"])).await.unwrap();
    next.write_all(&cmd(&[b"INCR", b"a"])).await.unwrap();
    let mut reply = [0u8; 9];
    tokio::time::timeout(Duration::from_secs(10), next.read_exact(&mut reply))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(&reply, b"+OK\r\n:1\r\n");
    stop_tx.send(true).unwrap();
    server.await.unwrap();
}

/// Large commands share one budget: past it, one more is refused with `-OVERLOADED` as soon as
/// its header announces it, and a place is free again once one of them completes.
#[tokio::test]
async fn large_commands_arriving_at_once_share_a_budget() {
    let fake = std::sync::Arc::new(Fake::default());
    let cfg = std::sync::Arc::new(RespConfig {
        large_command_bytes: 1 << 20,
        ..RespConfig::default()
    });
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let (stop_tx, stop) = tokio::sync::watch::channel(false);
    let server = tokio::spawn(resp::serve(listener, fake, cfg, stop));
    // 400 KB announced, 100 bytes sent: each holds ~384 KiB of the 1 MiB budget.
    let header = b"*2\r\n$4\r\nMGET\r\n$400000\r\n".to_vec();
    let mut held = Vec::new();
    for _ in 0..2 {
        let mut c = tokio::net::TcpStream::connect(addr).await.unwrap();
        c.write_all(&header).await.unwrap();
        c.write_all(&[b'k'; 100]).await.unwrap();
        held.push(c);
    }
    // The two take their room when the server reads their headers: a third is refused once it
    // has, and a third not refused yet gives its own room back when it is dropped.
    let mut out = String::new();
    for _ in 0..50 {
        let mut third = tokio::net::TcpStream::connect(addr).await.unwrap();
        third.write_all(&header).await.unwrap();
        out.clear();
        let read = tokio::time::timeout(Duration::from_millis(200), third.read_to_string(&mut out)).await;
        if read.is_ok() {
            break;
        }
    }
    assert!(out.starts_with("-OVERLOADED too many large commands"), "{out}");
    // The first completes (a bad key, but complete): its room is given back.
    held[0].write_all(&vec![b'k'; 400_000 - 100]).await.unwrap();
    held[0].write_all(b"\r\n").await.unwrap();
    let mut reply = [0u8; 4];
    held[0].read_exact(&mut reply).await.unwrap();
    assert_eq!(&reply, b"-ERR");
    let mut fourth = tokio::net::TcpStream::connect(addr).await.unwrap();
    fourth.write_all(&header).await.unwrap();
    fourth.write_all(&vec![b'k'; 400_000]).await.unwrap();
    fourth.write_all(b"\r\n").await.unwrap();
    let mut reply = [0u8; 4];
    tokio::time::timeout(Duration::from_secs(10), fourth.read_exact(&mut reply))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(&reply, b"-ERR", "the fourth was served, not refused");
    stop_tx.send(true).unwrap();
    server.await.unwrap();
}
