//! The baseline of `alloc-bench` and `ids-bench`: a bare tonic `AllocService` that answers at once,
//! from nothing.
//!
//! It runs as a child process of the benchmark (`alloc-bench --serve-echo ADDR`, [`start`]) so that the
//! comparison is fair: one server process with tokio's default multi-thread runtime, as the real
//! `allocsvr` binary has, and the same TCP options (`TCP_NODELAY`). Replies have the shape of the
//! real ones (outcome, seq, route version, one `Owner` per distinct section) so that both pay the
//! same encoding and bytes on the wire. The hidden flags that make a benchmark binary the echo are
//! declared here too ([`ChildFlags`]), next to [`start`], which passes them.
//!
//! Deliberately left out: health, reflection and metrics services (they cost nothing per call on
//! the real server either), and any state: the seq is `uid + 1`.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Duration;

use seqsvr_proto::pb;
use seqsvr_proto::pb::alloc_service_server::{AllocService, AllocServiceServer};
use tonic::{Request, Response, Status};

/// Echo answers with the owner fields the real server would send; these are fixed stand-ins.
const NODE_ID: u64 = 1;
const INCARNATION: u64 = 1 << 20;
const EPOCH: u64 = 1 << 10;

/// Most uids per batch, as on the real server.
const MAX_BATCH: usize = 1_000;

/// The trivial `AllocService`.
pub struct Echo {
    /// Uids per section, to name the section in `Owner` as the real server does.
    pub section_size: u64,
}

impl Echo {
    /// A counter reply of the real shape; the value is the key's length + 1 (no hashing: the
    /// echo is the cost of the call alone).
    fn counter(&self, req: pb::CounterRequest) -> pb::CounterReply {
        pb::CounterReply {
            outcome: pb::Outcome::Ok as i32,
            value: req.key.len() as u64 + 1,
            route_version: req.route_version,
            owner: Some(self.owner(0)),
            ..Default::default()
        }
    }

    fn owner(&self, uid: u64) -> pb::Owner {
        pb::Owner {
            section: uid / self.section_size,
            node_id: NODE_ID,
            incarnation: INCARNATION,
            epoch: EPOCH,
            set_id: 0,
        }
    }
}

#[tonic::async_trait]
impl AllocService for Echo {
    async fn fetch_next_seq(
        &self,
        request: Request<pb::FetchNextSeqRequest>,
    ) -> Result<Response<pb::FetchNextSeqReply>, Status> {
        let req = request.into_inner();
        Ok(Response::new(pb::FetchNextSeqReply {
            outcome: pb::Outcome::Ok as i32,
            seq: req.uid + 1,
            route_version: req.route_version,
            routes: None,
            owner: Some(self.owner(req.uid)),
            ..Default::default()
        }))
    }

    async fn reserve(&self, request: Request<pb::ReserveRequest>) -> Result<Response<pb::ReserveReply>, Status> {
        let req = request.into_inner();
        Ok(Response::new(pb::ReserveReply {
            outcome: pb::Outcome::Ok as i32,
            first: req.uid + 1,
            route_version: req.route_version,
            routes: None,
            owner: Some(self.owner(req.uid)),
            ..Default::default()
        }))
    }

    async fn get_cur_seq(
        &self,
        request: Request<pb::GetCurSeqRequest>,
    ) -> Result<Response<pb::GetCurSeqReply>, Status> {
        let req = request.into_inner();
        Ok(Response::new(pb::GetCurSeqReply {
            outcome: pb::Outcome::Ok as i32,
            cur_seq: req.uid,
            route_version: req.route_version,
            routes: None,
            owner: Some(self.owner(req.uid)),
            ..Default::default()
        }))
    }

    async fn batch_fetch_next_seq(
        &self,
        request: Request<pb::BatchFetchNextSeqRequest>,
    ) -> Result<Response<pb::BatchFetchNextSeqReply>, Status> {
        let req = request.into_inner();
        if req.uids.is_empty() || req.uids.len() > MAX_BATCH {
            return Err(Status::invalid_argument(format!(
                "a batch needs 1..={MAX_BATCH} uids, got {}",
                req.uids.len()
            )));
        }
        let mut owners: Vec<pb::Owner> = Vec::new();
        for uid in &req.uids {
            let section = uid / self.section_size;
            if !owners.iter().any(|o| o.section == section) {
                owners.push(self.owner(*uid));
            }
        }
        Ok(Response::new(pb::BatchFetchNextSeqReply {
            outcomes: vec![pb::Outcome::Ok as i32; req.uids.len()],
            seqs: req.uids.iter().map(|u| u + 1).collect(),
            route_version: req.route_version,
            routes: None,
            owners,
            ..Default::default()
        }))
    }

    async fn counter_next(&self, request: Request<pb::CounterRequest>) -> Result<Response<pb::CounterReply>, Status> {
        Ok(Response::new(self.counter(request.into_inner())))
    }

    async fn counter_reserve(
        &self,
        request: Request<pb::CounterRequest>,
    ) -> Result<Response<pb::CounterReply>, Status> {
        Ok(Response::new(self.counter(request.into_inner())))
    }

    async fn counter_get(&self, request: Request<pb::CounterRequest>) -> Result<Response<pb::CounterReply>, Status> {
        Ok(Response::new(self.counter(request.into_inner())))
    }

    async fn counter_batch(
        &self,
        request: Request<pb::CounterBatchRequest>,
    ) -> Result<Response<pb::CounterBatchReply>, Status> {
        let req = request.into_inner();
        if req.keys.is_empty() || req.keys.len() > MAX_BATCH {
            return Err(Status::invalid_argument(format!(
                "a batch needs 1..={MAX_BATCH} keys, got {}",
                req.keys.len()
            )));
        }
        Ok(Response::new(pb::CounterBatchReply {
            outcomes: vec![pb::Outcome::Ok as i32; req.keys.len()],
            values: req.keys.iter().map(|k| k.len() as u64 + 1).collect(),
            route_version: req.route_version,
            owners: vec![self.owner(0)],
            ..Default::default()
        }))
    }

    /// Reads of the real shape: a uid's value is `uid`, a key's its length (one less than the
    /// echo's next value, as a real last value is).
    async fn batch_get(&self, request: Request<pb::BatchGetRequest>) -> Result<Response<pb::BatchGetReply>, Status> {
        let req = request.into_inner();
        let n = req.uids.len() + req.keys.len();
        if n == 0 || n > MAX_BATCH {
            return Err(Status::invalid_argument(format!(
                "a batch needs 1..={MAX_BATCH} uids and keys, got {n}"
            )));
        }
        let mut owners: Vec<pb::Owner> = Vec::new();
        for &uid in &req.uids {
            let owner = self.owner(uid);
            if !owners.contains(&owner) {
                owners.push(owner);
            }
        }
        if !req.keys.is_empty() && !owners.contains(&self.owner(0)) {
            owners.push(self.owner(0));
        }
        Ok(Response::new(pb::BatchGetReply {
            outcomes: vec![pb::Outcome::Ok as i32; n],
            values: req
                .uids
                .iter()
                .copied()
                .chain(req.keys.iter().map(|k| k.len() as u64))
                .collect(),
            route_version: req.route_version,
            owners,
            ..Default::default()
        }))
    }

    /// Ids of the real shape (one run of `count` from a fixed id, the layout, the set), from
    /// nothing: the baseline of the `NextIds` benchmark.
    async fn next_ids(&self, request: Request<pb::NextIdsRequest>) -> Result<Response<pb::NextIdsReply>, Status> {
        let count = request.into_inner().count;
        if count == 0 || count > seqsvr_proto::limits::MAX_IDS_PER_CALL {
            return Err(Status::invalid_argument(format!(
                "count must be 1 to 4096, got {count}"
            )));
        }
        Ok(Response::new(pb::NextIdsReply {
            runs: vec![pb::IdRun { first: 1 << 40, count }],
            layout: Some(seqsvr_proto::id_layout::IdLayout::twitter(0).to_pb()),
            set_id: 0,
            slot_epoch: 1,
        }))
    }
}

/// The hidden flags [`start`] gives the benchmark's own binary. Every binary that starts the echo
/// flattens them into its `Args` and calls [`ChildFlags::serve`] before anything else.
#[derive(clap::Args, Debug, Clone)]
#[command(about = None, long_about = None)] // as `crate::args`'s groups: never a binary's description
pub struct ChildFlags {
    /// Internal: serve the echo baseline on ADDR until killed.
    #[arg(long, hide = true)]
    pub serve_echo: Option<SocketAddr>,
    /// Internal: the echo's certificates (an `allocsvr` one, as the AllocSvr has), in this dir.
    #[arg(long, hide = true)]
    pub serve_echo_tls: Option<PathBuf>,
}

impl ChildFlags {
    /// When this process was started as the echo: serves until killed, then its exit code.
    pub fn serve(&self, section_size: u64) -> Option<ExitCode> {
        let addr = self.serve_echo?;
        Some(serve(addr, section_size, self.serve_echo_tls.as_deref()))
    }
}

/// Starts the echo as a child of `procs`: `exe` (the running benchmark, which must take the hidden
/// [`ChildFlags`] and call [`ChildFlags::serve`]) on a free 127.0.0.1
/// port, over TLS when the run is (`crate::tls`); returns its address and pid once it listens.
pub async fn start(procs: &mut seqsvr_harness::Supervisor, exe: &Path) -> Result<(String, u32), String> {
    let addr = seqsvr_harness::free_addr();
    let mut args = vec![format!("--serve-echo={addr}")];
    if let Some(dir) = crate::tls::dir() {
        args.push(format!("--serve-echo-tls={}", dir.display()));
    }
    let pid = procs
        .spawn(seqsvr_harness::ProcSpec::new("echo", exe, args))
        .map_err(|e| format!("cannot start echo: {e}"))?;
    if !seqsvr_harness::wait_listening(&addr, Duration::from_secs(10)).await {
        return Err("echo server did not listen within 10 s".into());
    }
    Ok((addr, pid))
}

/// Runs the echo server on `addr` until the process is killed (the benchmark kills it). With
/// `tls_dir`, over mutual TLS with that directory's `allocsvr` certificate. Either way behind the
/// same role-check layer as the AllocSvr, so the two differ only in what the service does.
pub fn serve(addr: SocketAddr, section_size: u64, tls_dir: Option<&std::path::Path>) -> ExitCode {
    let tls = match tls_dir
        .map(|dir| seqsvr_auth::devca::LocalCerts { dir: dir.to_owned() }.load(seqsvr_auth::Role::AllocSvr))
    {
        None => None,
        Some(Ok(t)) => Some(t),
        Some(Err(e)) => {
            eprintln!("alloc-bench echo: {e}");
            return ExitCode::FAILURE;
        }
    };
    let server = match seqsvr_auth::server(tls.as_deref()) {
        Ok(s) => s,
        Err(e) => {
            eprintln!("alloc-bench echo: {e}");
            return ExitCode::FAILURE;
        }
    };
    let runtime = match tokio::runtime::Runtime::new() {
        Ok(r) => r,
        Err(e) => {
            eprintln!("alloc-bench echo: cannot start the runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    runtime.block_on(async move {
        let listener = match tokio::net::TcpListener::bind(addr).await {
            Ok(l) => l,
            Err(e) => {
                eprintln!("alloc-bench echo: cannot bind {addr}: {e}");
                return ExitCode::FAILURE;
            }
        };
        let incoming = tonic::transport::server::TcpIncoming::from(listener).with_nodelay(Some(true));
        let mut server = server;
        let served = server
            .add_service(
                AllocServiceServer::new(Echo { section_size })
                    .max_decoding_message_size(seqsvr_proto::limits::DATA_PLANE_MESSAGE_BYTES)
                    .max_encoding_message_size(seqsvr_proto::limits::DATA_PLANE_MESSAGE_BYTES),
            )
            .serve_with_incoming(incoming)
            .await;
        match served {
            Ok(()) => ExitCode::SUCCESS,
            Err(e) => {
                eprintln!("alloc-bench echo: {e}");
                ExitCode::FAILURE
            }
        }
    })
}
