//! What a unary call costs through each plaintext transport of the client library: tonic's
//! `Channel` against `H2Conn` (a request in one write; `seqsvr-rpc`'s h2conn.rs), both calling the
//! bare tonic echo (`seqsvr_bench::echo`, a child process). Per caller count and transport: calls/s,
//! p50, and the CPU per call of the server and of this process (`/proc`). The transports alternate,
//! `--rounds` times, so that drift on a shared machine hits both alike. Nothing is judged; the
//! numbers are for docs/benchmarks/examples.md.
//!
//! ```text
//! cargo build --release -p seqsvr-bench --example transport_cost
//! target/release/examples/transport_cost --rounds 3
//! ```
//!
//! Deliberately left out: TLS (`alloc-bench --tls` measures what TLS costs a call) and the
//! AllocSvr itself (alloc-bench measures it against the same echo).
use std::process::ExitCode;
use std::time::{Duration, Instant};

use clap::Parser;
use seqsvr_bench::procfs::cpu_seconds;
use seqsvr_client::transport::{Conn, H2Conn};
use seqsvr_proto::pb;
use seqsvr_proto::pb::alloc_service_client::AllocServiceClient;

#[derive(Parser)]
struct Args {
    /// Rounds of every point (each round runs both transports).
    #[arg(long, default_value_t = 3)]
    rounds: u32,
    /// Callers, comma-separated.
    #[arg(long, value_delimiter = ',', default_value = "1,16,64")]
    callers: Vec<usize>,
    /// Calls per point (split among the callers).
    #[arg(long, default_value_t = 20_000)]
    calls: usize,
    /// Internal: serve the echo on ADDR until killed.
    #[arg(long, hide = true)]
    serve_echo: Option<std::net::SocketAddr>,
}

fn main() -> ExitCode {
    let args = Args::parse();
    if let Some(addr) = args.serve_echo {
        return seqsvr_bench::echo::serve(addr, 100_000, None);
    }
    let runtime = tokio::runtime::Runtime::new().expect("runtime");
    runtime.block_on(run(args))
}

async fn run(args: Args) -> ExitCode {
    let logs = std::env::temp_dir().join("transport_cost");
    let mut procs = match seqsvr_harness::Supervisor::new(&logs) {
        Ok(p) => p,
        Err(e) => {
            eprintln!("transport_cost: {}: {e}", logs.display());
            return ExitCode::from(3);
        }
    };
    let exe = std::env::current_exe().expect("own path");
    let (addr, pid) = match seqsvr_bench::echo::start(&mut procs, &exe).await {
        Ok(started) => started,
        Err(e) => {
            eprintln!("transport_cost: {e}");
            return ExitCode::from(3);
        }
    };
    let channel = tonic::transport::Endpoint::from_shared(format!("http://{addr}"))
        .expect("address")
        .tcp_nodelay(true)
        .connect_lazy();
    let h2 = H2Conn::lazy(&addr, Duration::from_secs(1)).expect("address");
    println!("transport   callers   calls/s   p50 µs   server µs/call   client µs/call");
    for round in 0..args.rounds {
        for &callers in &args.callers {
            // Alternate which goes first from round to round.
            let mut both = [
                ("channel", Conn::Tonic(channel.clone())),
                ("h2conn", Conn::H2(h2.clone())),
            ];
            if round % 2 == 1 {
                both.reverse();
            }
            for (name, conn) in both {
                let calls = (args.calls / callers).max(1);
                let (rate, p50, server, client) = point(conn, callers, calls, pid).await;
                println!("{name:10} {callers:8} {rate:9.0} {p50:8} {server:16.1} {client:16.1}");
            }
        }
    }
    drop(procs);
    ExitCode::SUCCESS
}

/// `callers` closed-loop callers making `calls` calls each; returns calls/s, p50 µs, and the
/// server's and this process's CPU µs per call.
async fn point(conn: Conn, callers: usize, calls: usize, server: u32) -> (f64, u64, f64, f64) {
    let own = std::process::id();
    let (s0, c0) = (cpu_seconds(server).unwrap_or(0.0), cpu_seconds(own).unwrap_or(0.0));
    let started = Instant::now();
    let tasks: Vec<_> = (0..callers)
        .map(|k| {
            let mut client = AllocServiceClient::new(conn.clone());
            tokio::spawn(async move {
                let mut lat = Vec::with_capacity(calls);
                for i in 0..calls {
                    let t = Instant::now();
                    let uid = (i * callers + k) as u64;
                    let r = client
                        .fetch_next_seq(pb::FetchNextSeqRequest {
                            uid,
                            ..Default::default()
                        })
                        .await;
                    r.expect("echo call");
                    lat.push(t.elapsed().as_micros() as u64);
                }
                lat
            })
        })
        .collect();
    let mut lat = Vec::new();
    for t in tasks {
        lat.extend(t.await.expect("caller"));
    }
    let elapsed = started.elapsed().as_secs_f64();
    let (s1, c1) = (cpu_seconds(server).unwrap_or(0.0), cpu_seconds(own).unwrap_or(0.0));
    lat.sort_unstable();
    let n = lat.len() as f64;
    (
        n / elapsed,
        lat[lat.len() / 2],
        (s1 - s0) * 1e6 / n,
        (c1 - c0) * 1e6 / n,
    )
}
