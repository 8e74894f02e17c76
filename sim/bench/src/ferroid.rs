//! The Snowflake peer of `ids-bench`: ferroid-tonic-server 2.0.0 (crates.io, MIT OR Apache-2.0),
//! a tonic server that others wrote, driven through the same closed-loop driver ([`crate::load`])
//! as the AllocSvr's `NextIds`, so that ids/s, latency, server CPU per call and foreign load mean
//! the same thing for both.
//!
//! Its API is server-streaming: `ferroid.IdGenerator/StreamIds{count}` answers a stream of
//! `IdChunk{packed_ids}`, each a run of little-endian 8-byte ids. One call here is one StreamIds of
//! `count` ids, consumed to its end; it counts when exactly `count` ids came back. The client is
//! generated from `proto/ferroid.proto`, a copy of ferroid's own (its header says where from).
//!
//! The server runs as shipped, with its flags and defaults but two: `--server-addr` on 127.0.0.1
//! (its default is every address), and `--num-workers` (default 1 there and here: one Snowflake
//! generator, as an AllocSvr holds one slot). Its other knobs are passed at their defaults so that
//! the environment (it reads `MAX_ALLOWED_IDS`, `IDS_PER_CHUNK`, … and a `.env` file in its working
//! directory) cannot change them: it starts in an empty directory of its own.
//!
//! As shipped, its accepted connections keep Nagle's algorithm (it does not set `TCP_NODELAY`), and
//! each StreamIds then waits ~40 ms for the client's delayed ACK. So it is started twice: as shipped,
//! and with `ferroid-nodelay.so` preloaded (`sim/bench/ferroid-nodelay.c`, built beside it by the
//! install script), which sets `TCP_NODELAY` on every accepted socket and changes nothing else.
//!
//! Deliberately left out: installing it (`sim/bench/install-ferroid.sh`; found by `--ferroid-bin`,
//! on `PATH`, or where that script puts it), compression (this client does not ask for it, so
//! ferroid sends its ids plain), checking the ids for uniqueness, and ferroid's Unix-socket mode.

use std::path::{Path, PathBuf};
use std::time::Duration;

use seqsvr_harness::{ProcSpec, Supervisor};
use tonic::transport::Channel;

use crate::load::{Answer, Pids, Sample, Window, drive};
use crate::peers::{on_path, plain_channel, version};

/// Client half of ferroid's `IdGenerator`.
pub mod pb {
    #![allow(clippy::all, missing_docs)]
    tonic::include_proto!("ferroid");
}

use pb::id_generator_client::IdGeneratorClient;

/// The server's binary name.
pub const BINARY: &str = "ferroid-tonic-server";
/// The version `install-ferroid.sh` installs and these figures are for.
pub const VERSION: &str = "2.0.0";
/// Bytes per id in `packed_ids` (ferroid's default id type is a u64 Snowflake).
const ID_BYTES: usize = 8;
/// Longest wait for the server to start and answer.
const START_LIMIT: Duration = Duration::from_secs(20);

/// The shim's file name, in `lib/` beside the binary's `bin/`.
pub const SHIM: &str = "ferroid-nodelay.so";

/// A running ferroid-tonic-server.
pub struct Server {
    /// Process name: `ferroid`, or `ferroid-nodelay` with the shim.
    pub name: &'static str,
    /// `127.0.0.1:PORT`.
    pub addr: String,
    pub pid: u32,
    /// First line of `--version`.
    pub version: String,
    /// Its `--num-workers`: Snowflake generators (machine ids).
    pub workers: usize,
}

/// Where the binary is: `explicit` if given, else on `PATH`, else where `install-ferroid.sh` puts
/// it by default (`<target dir>/peers/ferroid/bin`, the target dir being two levels above this
/// executable, `target/release/ids-bench`).
pub fn find(explicit: Option<&Path>) -> Option<PathBuf> {
    if let Some(p) = explicit {
        return p.is_file().then(|| p.to_path_buf());
    }
    on_path(BINARY).or_else(|| {
        let exe = std::env::current_exe().ok()?;
        let target = exe.parent()?.parent()?;
        let p = target.join("peers/ferroid/bin").join(BINARY);
        p.is_file().then_some(p)
    })
}

/// The `TCP_NODELAY` shim: `explicit` if given, else `../lib/ferroid-nodelay.so` from `bin`'s
/// directory (where `install-ferroid.sh` builds it).
pub fn shim(bin: &Path, explicit: Option<&Path>) -> Option<PathBuf> {
    let p = match explicit {
        Some(p) => p.to_path_buf(),
        None => bin.parent()?.parent()?.join("lib").join(SHIM),
    };
    p.is_file().then_some(p)
}

/// Starts `bin` under `procs` on a free 127.0.0.1 port with `workers` generators, with `preload`
/// as `LD_PRELOAD` if given, in an empty directory of its own under `dir`, and waits until a
/// StreamIds of one id answers.
pub async fn start(
    procs: &mut Supervisor,
    dir: &Path,
    bin: &Path,
    workers: usize,
    preload: Option<&Path>,
) -> Result<Server, String> {
    let name = if preload.is_some() {
        "ferroid-nodelay"
    } else {
        "ferroid"
    };
    let cwd = dir.join(name);
    std::fs::create_dir_all(&cwd).map_err(|e| format!("cannot create {}: {e}", cwd.display()))?;
    let addr = seqsvr_harness::free_addr();
    let args = vec![
        format!("--server-addr={addr}"),
        format!("--num-workers={workers}"),
        // Its defaults, explicit: flags win over the environment variables it also reads.
        "--ids-per-chunk=4096".to_string(),
        "--stream-buffer-size=8".to_string(),
        "--shard-offset=0".to_string(),
    ];
    let env = preload.map(|p| ("LD_PRELOAD".to_string(), p.display().to_string()));
    let spec = ProcSpec {
        cwd: Some(cwd),
        env: env.into_iter().collect(),
        ..ProcSpec::new(name, bin, args)
    };
    let pid = procs
        .spawn(spec)
        .map_err(|e| format!("cannot start {}: {e}", bin.display()))?;
    let up = seqsvr_harness::poll_until(START_LIMIT, || async {
        let mut c = clients(&addr, 1).await.ok()?.pop()?;
        stream_ids(&mut c, 1).await.ok()
    })
    .await;
    if up != Some(1) {
        let _ = procs.kill(name);
        return Err(format!(
            "no StreamIds answer of one id at {addr} within {START_LIMIT:?}"
        ));
    }
    Ok(Server {
        name,
        addr,
        pid,
        version: version(bin),
        workers,
    })
}

/// `n` clients of the server at `addr`, each over its own connection.
pub async fn clients(addr: &str, n: usize) -> Result<Vec<IdGeneratorClient<Channel>>, String> {
    let mut out = Vec::with_capacity(n);
    for _ in 0..n {
        out.push(IdGeneratorClient::new(plain_channel(addr).await?));
    }
    Ok(out)
}

/// One StreamIds of `count` ids, read to its end: how many ids came back.
pub async fn stream_ids(client: &mut IdGeneratorClient<Channel>, count: u64) -> Result<u64, String> {
    let mut stream = client
        .stream_ids(pb::StreamIdsRequest { count })
        .await
        .map_err(|e| format!("StreamIds: {}", e.message()))?
        .into_inner();
    let mut ids = 0;
    while let Some(chunk) = stream
        .message()
        .await
        .map_err(|e| format!("StreamIds stream: {}", e.message()))?
    {
        let bytes = chunk.packed_ids.len();
        if bytes % ID_BYTES != 0 {
            return Err(format!("a chunk of {bytes} bytes is not whole 8-byte ids"));
        }
        ids += (bytes / ID_BYTES) as u64;
    }
    Ok(ids)
}

/// StreamIds of `count` ids by `concurrency` callers over `clients` (task `t` uses
/// `clients[t % len]`); a call that returned another number of ids counts as not OK.
pub async fn load(
    clients: &[IdGeneratorClient<Channel>],
    concurrency: usize,
    count: u32,
    window: Window,
    pids: Pids<'_>,
) -> Sample {
    let clients = std::sync::Arc::new(clients.to_vec());
    drive(concurrency, window, pids, move |t, _| {
        let mut client = clients[t % clients.len()].clone();
        async move {
            match stream_ids(&mut client, u64::from(count)).await {
                Ok(n) if n == u64::from(count) => Answer::Served { ok: n, not_ok: 0 },
                Ok(_) => Answer::Served { ok: 0, not_ok: 1 },
                Err(_) => Answer::Failed,
            }
        }
    })
    .await
}
