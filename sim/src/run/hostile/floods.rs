//! The floods of a hostile run: what a careless or malicious caller sends a front end, each kind a
//! few connections (or a few thousand) from the simulator to every AllocSvr's front-end port on
//! loopback, in rounds of [`ROUND`] that end by themselves.
//!
//! Each connection is counted: opened, refused (no connection: the process is down, or its backlog
//! is full), or cut by the server before its round ended (what a fixed server does to a caller it
//! will not wait for). The counts are printed; what fails a run is what the floods do to the
//! processes (death, memory) and to a well-behaved caller beside them (`super::caller`), not how a
//! server chooses to refuse them.
//!
//! Deliberately left out: TLS (hostile runs are plaintext, as `--front` is), RESP3 and AUTH (the
//! floods arrive before any AUTH, where a server knows least about its caller), floods of the gRPC
//! port, and more than one round at a time.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use bytes::Bytes;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpSocket, TcpStream};
use tokio::task::JoinSet;
use tokio::time::{Instant, sleep, sleep_until, timeout_at};

use crate::front_workload::Front;
use crate::history::RunClock;

/// Longest a round of floods lasts; every connection of a round is closed by its end.
pub(super) const ROUND: Duration = Duration::from_secs(20);
/// The pause between rounds, as long as a round: the servers' memory and connection counts
/// fall back in it, and the well-behaved caller's calls in it are the reference its calls in
/// the rounds are held to (the same faults around both, and the same load of the machine).
const ROUND_GAP: Duration = ROUND;
/// A round shorter than this is not started (the trickles and partial commands need the server's
/// 10 s command deadline to show what it does with them).
const MIN_ROUND: Duration = Duration::from_secs(12);
const CONNECT_TIMEOUT: Duration = Duration::from_secs(2);
/// How long the answer to a nesting packet is waited for (a server that is still alive answers an
/// error or closes at once).
const NESTING_ANSWER: Duration = Duration::from_secs(3);

/// Idle connections of a round, spread over the front ends.
pub(super) const IDLE_PER_ROUND: usize = 2_000;
/// Held partial commands of ~500 KB per front end and round: 256 MB if the server keeps them all,
/// the default memory bound on their own (each within every per-command bound: only a bound on
/// what all of them hold together keeps a server under it).
const PARTIALS_PER_FRONT: usize = 512;
/// Partial commands of 1 MB (past the server's hard size bound) per front end and round.
const OVERSIZED_PER_FRONT: usize = 16;
/// HTTP requests whose ~400 KB of headers never end, per front end and round: 300 MB if the
/// server keeps them all, past the default memory bound (at 256 of them today's front end stayed
/// at 130 MiB and passed).
const HEADER_FLOODS_PER_FRONT: usize = 768;
/// Depth of the nesting packets: `*1\r\n` this many times is 40 KB, well within every size bound,
/// and deep enough to overflow a thread's stack in a recursive decoder.
const NESTING_DEPTH: usize = 10_000;
/// Requests an unread-replies client pipelines.
const UNREAD_REQUESTS: usize = 100_000;
/// The receive buffer of an unread-replies client: small, so that the server's writes block soon
/// instead of filling the loopback's megabytes of buffer.
const UNREAD_RCVBUF: u32 = 4 * 1024;
/// The name the unread-replies clients count up: a named counter no workload client records, so
/// that the values it takes are nobody's gap.
const UNREAD_KEY: &str = "hostile-unread";
/// The trickled command: 490 KB of RESP, or 390 KB of HTTP headers (under hyper's 400 KB bound on
/// a head, which a server would refuse at once).
const TRICKLE_RESP: usize = 490_000;
const TRICKLE_HTTP: usize = 390_000;
/// A trickle's last bytes, sent one byte a millisecond; the rest goes at once (a byte a
/// millisecond reaches 480 KB after 8 minutes; a round has 20 s).
const TRICKLE_TAIL: usize = 10_000;
/// The longest a trickle goes on: past the fixed server's 10 s command deadline.
const TRICKLE_FOR: Duration = Duration::from_secs(15);
/// Trickles per front end and round. One moved today's RESP front end's p50 from 5 to 40 ms but
/// its p99 only 2.4x: a server that re-reads a partial command whole on every byte spends
/// milliseconds a byte, and a few of them take its cores.
const TRICKLES_PER_FRONT: usize = 4;

/// The floods as `--hostile-skip` names them.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum FloodGroup {
    /// Nested RESP arrays (open and complete), nested JSON arrays.
    Nesting,
    /// A 490 KB command (390 KB of HTTP headers), its end a byte a millisecond.
    Trickle,
    /// Connections that send nothing.
    Idle,
    /// RESP commands of ~500 KB that never end, and of 1 MB.
    Partial,
    /// HTTP requests whose ~400 KB of headers never end.
    Headers,
    /// Pipelined takes whose replies are never read.
    Unread,
}

/// One kind of flood connection.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub(super) enum Flood {
    /// RESP: `*1\r\n` x 10,000 and nothing else, before AUTH.
    NestingOpen,
    /// RESP: the same, closed by an integer: a complete command.
    NestingComplete,
    /// HTTP: a batch body of 10,000 nested JSON arrays.
    JsonNesting,
    /// A 490 KB command (RESP: an array of 70,000 one-byte strings; HTTP: headers), its last
    /// 10 KB a byte a millisecond.
    Trickle,
    /// A connection that sends nothing.
    Idle,
    /// RESP: a ~500 KB command that never ends (within the 512 KiB bound).
    Partial,
    /// RESP: a 1 MB command (past the bound).
    Oversized,
    /// HTTP: a request whose ~400 KB of headers never end.
    Headers,
    /// 100,000 pipelined takes (RESP `INCR`, HTTP `POST …/next`) whose replies are never read.
    Unread,
}

impl Flood {
    pub(super) fn name(self) -> &'static str {
        match self {
            Flood::NestingOpen => "nesting (open)",
            Flood::NestingComplete => "nesting (complete)",
            Flood::JsonNesting => "json nesting",
            Flood::Trickle => "trickle",
            Flood::Idle => "idle",
            Flood::Partial => "partial 500 KB",
            Flood::Oversized => "partial 1 MB",
            Flood::Headers => "header flood 400 KB",
            Flood::Unread => "unread replies",
        }
    }

    fn is_nesting(self) -> bool {
        self.group() == FloodGroup::Nesting
    }

    fn group(self) -> FloodGroup {
        match self {
            Flood::NestingOpen | Flood::NestingComplete | Flood::JsonNesting => FloodGroup::Nesting,
            Flood::Trickle => FloodGroup::Trickle,
            Flood::Idle => FloodGroup::Idle,
            Flood::Partial | Flood::Oversized => FloodGroup::Partial,
            Flood::Headers => FloodGroup::Headers,
            Flood::Unread => FloodGroup::Unread,
        }
    }

    /// The kinds a front end gets, but those of the `skip` groups.
    fn of_but(front: Front, skip: &[FloodGroup]) -> Vec<Flood> {
        Self::of(front)
            .iter()
            .copied()
            .filter(|k| !skip.contains(&k.group()))
            .collect()
    }

    /// The kinds a front end gets.
    fn of(front: Front) -> &'static [Flood] {
        match front {
            Front::Resp | Front::RespCluster => &[
                Flood::NestingOpen,
                Flood::NestingComplete,
                Flood::Trickle,
                Flood::Idle,
                Flood::Partial,
                Flood::Oversized,
                Flood::Unread,
            ],
            Front::Http => &[
                Flood::JsonNesting,
                Flood::Trickle,
                Flood::Idle,
                Flood::Headers,
                Flood::Unread,
            ],
            Front::Grpc => &[],
        }
    }

    /// Connections of this kind per front end and round, with `fronts` front ends.
    fn per_front(self, fronts: usize) -> usize {
        match self {
            Flood::Idle => IDLE_PER_ROUND.div_ceil(fronts.max(1)),
            Flood::Partial => PARTIALS_PER_FRONT,
            Flood::Oversized => OVERSIZED_PER_FRONT,
            Flood::Headers => HEADER_FLOODS_PER_FRONT,
            Flood::Trickle => TRICKLES_PER_FRONT,
            _ => 1,
        }
    }
}

/// The most connections one round holds at once from this process, for the descriptor check.
pub(super) fn connections_per_round(front: Front, fronts: usize) -> usize {
    Flood::of(front).iter().map(|k| k.per_front(fronts) * fronts).sum()
}

/// What happened to the connections of one kind.
#[derive(Default)]
pub(super) struct Tally {
    pub opened: AtomicU64,
    /// No connection could be made.
    pub refused: AtomicU64,
    /// The server closed it (or reset it) before its round ended.
    pub cut: AtomicU64,
}

/// Every kind's tally, and the rounds run.
#[derive(Default)]
pub(super) struct Tallies {
    pub kinds: BTreeMap<Flood, Tally>,
    pub rounds: AtomicU64,
    /// Each round's first and last instant, on the run's clock.
    pub windows: std::sync::Mutex<Vec<(u64, u64)>>,
}

impl Tallies {
    pub(super) fn new(front: Front, skip: &[FloodGroup]) -> Self {
        Self {
            kinds: Flood::of_but(front, skip)
                .into_iter()
                .map(|k| (k, Tally::default()))
                .collect(),
            rounds: AtomicU64::new(0),
            windows: std::sync::Mutex::new(Vec::new()),
        }
    }

    fn add(&self, kind: Flood, end: End) {
        let Some(t) = self.kinds.get(&kind) else { return };
        let counter = match end {
            End::Refused => &t.refused,
            End::Held => &t.opened,
            End::Cut => {
                t.opened.fetch_add(1, Ordering::Relaxed);
                &t.cut
            }
        };
        counter.fetch_add(1, Ordering::Relaxed);
    }
}

/// How one flood connection ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum End {
    Refused,
    /// Open until the round (or the flood's own bound) ended it.
    Held,
    /// Closed by the server first.
    Cut,
}

/// The bytes the floods send, made once and shared by every connection.
struct Payloads {
    nesting_open: Bytes,
    nesting_complete: Bytes,
    json_nesting: Bytes,
    trickle: Bytes,
    partial: Bytes,
    oversized: Bytes,
    header_flood: Bytes,
    unread: Bytes,
}

impl Payloads {
    fn new(front: Front) -> Self {
        let nesting_open = b"*1\r\n".repeat(NESTING_DEPTH);
        let mut nesting_complete = nesting_open.clone();
        nesting_complete.extend_from_slice(b":1\r\n");
        let depth = NESTING_DEPTH;
        let body = format!("{{\"uids\":{}{}}}", "[".repeat(depth), "]".repeat(depth));
        let json_nesting = format!(
            "POST /v1/seq/batch HTTP/1.1\r\nhost: sim\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n{body}",
            body.len()
        );
        let trickle = match front {
            // An array of one-byte strings: every re-read of a partial array decodes all of them.
            Front::Resp | Front::RespCluster => {
                let n = (TRICKLE_RESP - 16) / 7;
                let mut t = format!("*{n}\r\n").into_bytes();
                t.extend_from_slice(&b"$1\r\nx\r\n".repeat(n));
                t
            }
            // Headers of 100 bytes each: every re-read of a partial head parses all of them.
            _ => http_head("GET /v1/seq/1 HTTP/1.1", TRICKLE_HTTP, 100),
        };
        let incr = |size: usize| {
            let mut c = format!("*2\r\n$4\r\nINCR\r\n${size}\r\n").into_bytes();
            c.resize(c.len() + size - 12_000, b'x');
            c
        };
        let unread = match front {
            Front::Resp | Front::RespCluster => {
                format!("*2\r\n$4\r\nINCR\r\n${}\r\n{UNREAD_KEY}\r\n", UNREAD_KEY.len())
            }
            _ => format!("POST /v1/counter/{UNREAD_KEY}/next HTTP/1.1\r\nhost: sim\r\ncontent-length: 0\r\n\r\n"),
        }
        .repeat(UNREAD_REQUESTS);
        Self {
            nesting_open: nesting_open.into(),
            nesting_complete: nesting_complete.into(),
            json_nesting: json_nesting.into_bytes().into(),
            trickle: trickle.into(),
            partial: incr(512_000).into(),
            oversized: incr(1_048_576).into(),
            header_flood: http_head("GET /v1/seq/1 HTTP/1.1", 400_000, 1_000).into(),
            unread: unread.into_bytes().into(),
        }
    }
}

/// A request line and `total` bytes of headers of `each` bytes, without the blank line that would
/// end them.
fn http_head(line: &str, total: usize, each: usize) -> Vec<u8> {
    let mut h = format!("{line}\r\nhost: sim\r\n").into_bytes();
    let mut i = 0;
    while h.len() + each <= total {
        let name = format!("x-flood-{i}: ");
        h.extend_from_slice(name.as_bytes());
        h.resize(h.len() + each - name.len() - 2, b'a');
        h.extend_from_slice(b"\r\n");
        i += 1;
    }
    h
}

/// Runs rounds of every flood against every front end from now until `until` (or `stop`); each
/// round ends by itself, so this returns by `until` plus a connect timeout.
pub(super) async fn drive(
    front: Front,
    addrs: Vec<SocketAddr>,
    until: Instant,
    stop: Arc<AtomicBool>,
    tallies: Arc<Tallies>,
    clock: RunClock,
) {
    let payloads = Arc::new(Payloads::new(front));
    let kinds: Vec<Flood> = tallies.kinds.keys().copied().collect();
    while !stop.load(Ordering::Relaxed) && Instant::now() + MIN_ROUND <= until {
        let round_start = Instant::now();
        let round_start_ns = clock.now_ns();
        let round_end = (round_start + ROUND).min(until);
        // The nesting packets come halfway through: a server they crash has met every other flood
        // first, and its memory and its callers' latency under them are seen too.
        let halfway = round_start + (round_end - round_start) / 2;
        let mut round = JoinSet::new();
        for &kind in &kinds {
            let from = if kind.is_nesting() { halfway } else { round_start };
            for &addr in &addrs {
                for _ in 0..kind.per_front(addrs.len()) {
                    let (p, t) = (payloads.clone(), tallies.clone());
                    round.spawn(async move {
                        sleep_until(from).await;
                        t.add(kind, one(kind, addr, round_end, &p).await)
                    });
                }
                // Let the connections of one kind open before the next kind's: thousands of
                // simultaneous connects would overflow the listen backlogs, which floods nothing.
                tokio::task::yield_now().await;
            }
        }
        while round.join_next().await.is_some() {}
        tallies.rounds.fetch_add(1, Ordering::Relaxed);
        let window = (round_start_ns, clock.now_ns());
        tallies.windows.lock().unwrap_or_else(|e| e.into_inner()).push(window);
        sleep(ROUND_GAP).await;
    }
}

/// One flood connection, from connect to close; never past `round_end` (and a connect timeout).
async fn one(kind: Flood, addr: SocketAddr, round_end: Instant, p: &Payloads) -> End {
    let rcvbuf = (kind == Flood::Unread).then_some(UNREAD_RCVBUF);
    let Some(mut s) = connect(addr, rcvbuf).await else {
        return End::Refused;
    };
    match kind {
        Flood::NestingOpen | Flood::NestingComplete | Flood::JsonNesting => {
            let bytes = match kind {
                Flood::NestingOpen => &p.nesting_open,
                Flood::NestingComplete => &p.nesting_complete,
                _ => &p.json_nesting,
            };
            let deadline = (Instant::now() + NESTING_ANSWER).min(round_end);
            if send(&mut s, bytes, deadline).await.is_err() {
                return End::Cut;
            }
            // An incomplete nesting packet is a command not yet complete: the answer is the
            // server's command deadline, or nothing before the round's end.
            if kind == Flood::NestingOpen {
                return hold(s, round_end).await;
            }
            match timeout_at(deadline, s.read(&mut [0u8; 256])).await {
                Ok(Ok(0)) | Ok(Err(_)) => End::Cut,
                _ => End::Held,
            }
        }
        Flood::Trickle => {
            let end = (Instant::now() + TRICKLE_FOR).min(round_end);
            let burst = p.trickle.len() - TRICKLE_TAIL;
            if send(&mut s, &p.trickle[..burst], end).await.is_err() {
                return End::Cut;
            }
            let mut tick = tokio::time::interval(Duration::from_millis(1));
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            for i in burst..p.trickle.len() {
                tokio::select! {
                    _ = sleep_until(end) => return End::Held,
                    _ = tick.tick() => {}
                }
                if send(&mut s, &p.trickle[i..=i], end).await.is_err() {
                    return End::Cut;
                }
            }
            hold(s, end).await
        }
        Flood::Idle => hold(s, round_end).await,
        Flood::Partial | Flood::Oversized | Flood::Headers => {
            let bytes = match kind {
                Flood::Partial => &p.partial,
                Flood::Oversized => &p.oversized,
                _ => &p.header_flood,
            };
            if send(&mut s, bytes, round_end).await.is_err() {
                return End::Cut;
            }
            hold(s, round_end).await
        }
        Flood::Unread => {
            // Writes until the server stops reading (it blocks on its replies), then waits: the
            // replies are never read. A cut shows as a failed write; a later one is not seen.
            if matches!(timeout_at(round_end, s.write_all(&p.unread)).await, Ok(Err(_))) {
                return End::Cut;
            }
            sleep_until(round_end).await;
            End::Held
        }
    }
}

async fn connect(addr: SocketAddr, rcvbuf: Option<u32>) -> Option<TcpStream> {
    let socket = TcpSocket::new_v4().ok()?;
    if let Some(size) = rcvbuf {
        socket.set_recv_buffer_size(size).ok()?;
    }
    let s = tokio::time::timeout(CONNECT_TIMEOUT, socket.connect(addr))
        .await
        .ok()?
        .ok()?;
    // Every byte of a trickle goes out on its own: with Nagle's algorithm the kernel would gather
    // a delayed ACK's worth (40 ms) of them, and the server would read 25 times a second, not 1,000.
    s.set_nodelay(true).ok()?;
    Some(s)
}

/// Writes `bytes` by `deadline`. Not finishing in time is no error (a server that stops reading
/// is allowed to); a failed write is: the server cut the connection.
async fn send(s: &mut TcpStream, bytes: &[u8], deadline: Instant) -> Result<(), ()> {
    match timeout_at(deadline, s.write_all(bytes)).await {
        Ok(Err(_)) => Err(()),
        _ => Ok(()),
    }
}

/// Keeps the connection open until `until`, reading (and dropping) whatever the server says;
/// `Cut` when the server closes it first.
async fn hold(mut s: TcpStream, until: Instant) -> End {
    let mut buf = [0u8; 512];
    loop {
        match timeout_at(until, s.read(&mut buf)).await {
            Err(_) => return End::Held,
            Ok(Ok(0)) | Ok(Err(_)) => return End::Cut,
            Ok(Ok(_)) => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn payloads_have_the_sizes_their_names_say() {
        let resp = Payloads::new(Front::Resp);
        assert_eq!(resp.nesting_open.len(), 40_000);
        assert!(resp.nesting_complete.ends_with(b"*1\r\n:1\r\n"));
        // Within the RESP front end's 512 KiB bound, still incomplete; and past it.
        assert!(
            (490_000..524_288).contains(&resp.partial.len()),
            "{}",
            resp.partial.len()
        );
        assert!(resp.oversized.len() > 1_000_000);
        assert!((TRICKLE_RESP - 16..=TRICKLE_RESP).contains(&resp.trickle.len()));
        assert!(resp.trickle.starts_with(b"*69997\r\n$1\r\nx\r\n"));
        assert_eq!(resp.unread.len(), UNREAD_REQUESTS * 35);
        let http = Payloads::new(Front::Http);
        assert!((399_000..=400_000).contains(&http.header_flood.len()));
        assert!(
            !http.header_flood.windows(4).any(|w| w == b"\r\n\r\n"),
            "the head never ends"
        );
        assert!(!http.trickle.windows(4).any(|w| w == b"\r\n\r\n"));
        assert!((TRICKLE_HTTP - 100..=TRICKLE_HTTP).contains(&http.trickle.len()));
        let body_at = http.json_nesting.windows(4).position(|w| w == b"\r\n\r\n").unwrap() + 4;
        let body = &http.json_nesting[body_at..];
        assert!(
            serde_json::from_slice::<serde_json::Value>(body).is_err(),
            "deeper than serde's limit"
        );
        assert_eq!(body.iter().filter(|&&b| b == b'[').count(), NESTING_DEPTH);
    }

    #[test]
    fn a_round_stays_within_its_connection_budget() {
        assert_eq!(connections_per_round(Front::Resp, 3), 3 * (2 + 4 + 667 + 512 + 16 + 1));
        assert_eq!(connections_per_round(Front::Http, 6), 6 * (1 + 4 + 334 + 768 + 1));
        assert!(Flood::of(Front::Grpc).is_empty());
        let skip = [FloodGroup::Nesting, FloodGroup::Partial];
        assert_eq!(
            Flood::of_but(Front::Resp, &skip),
            [Flood::Trickle, Flood::Idle, Flood::Unread]
        );
        assert_eq!(Tallies::new(Front::Http, &skip).kinds.len(), 4);
    }

    #[tokio::test]
    async fn a_connection_the_server_closes_is_counted_as_cut() {
        let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = l.local_addr().unwrap();
        let server = tokio::spawn(async move {
            let (s, _) = l.accept().await.unwrap();
            drop(s);
            l
        });
        let p = Payloads::new(Front::Resp);
        let end = Instant::now() + Duration::from_secs(5);
        assert_eq!(one(Flood::Idle, addr, end, &p).await, End::Cut);
        let l = server.await.unwrap();
        // A server that keeps the connection: held until the round's end.
        let keep = tokio::spawn(async move { l.accept().await.unwrap() });
        let end = Instant::now() + Duration::from_millis(300);
        assert_eq!(one(Flood::Idle, addr, end, &p).await, End::Held);
        drop(keep);
    }
}
