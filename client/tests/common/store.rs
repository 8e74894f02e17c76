//! Fake StoreService + AdminService replicas for `seqctl`'s control-plane commands.
//!
//! Each replica answers Status with a canned view of itself (node id, leader, log indexes, members,
//! AllocSvrs), GetRoutes with a fixed table, and AdminService calls either with `not_leader` pointing
//! at the leader or, on the leader, by recording the change and returning the new membership.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use seqsvr_proto::pb;
use seqsvr_proto::pb::admin_service_server::{AdminService, AdminServiceServer};
use seqsvr_proto::pb::store_service_server::{StoreService, StoreServiceServer};
use tokio::net::TcpListener;
use tokio::task::JoinHandle;
use tokio_stream::wrappers::TcpListenerStream;
use tonic::{Request, Response, Status};

#[derive(Default)]
pub struct ReplicaState {
    pub node_id: u64,
    pub status: Mutex<pb::StatusReply>,
    pub routes: Mutex<Option<pb::RouteTable>>,
    /// Set on followers: where the leader is.
    pub not_leader: Mutex<Option<pb::LeaderHint>>,
    pub voters: Mutex<Vec<u64>>,
    pub admin_calls: AtomicU64,
    /// What GetAudit answers on the leader, and the last request it got.
    pub audit: Mutex<pb::GetAuditReply>,
    pub audit_asked: Mutex<Option<pb::GetAuditRequest>>,
    /// What Backup streams on the leader.
    pub backup: Mutex<Vec<pb::BackupChunk>>,
}

/// A running fake replica; stopped when dropped.
pub struct FakeReplica {
    pub addr: String,
    pub state: Arc<ReplicaState>,
    task: JoinHandle<()>,
}

impl Drop for FakeReplica {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl FakeReplica {
    pub async fn start(node_id: u64) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind loopback");
        let addr = listener.local_addr().unwrap().to_string();
        let state = Arc::new(ReplicaState {
            node_id,
            ..ReplicaState::default()
        });
        let store = StoreServiceServer::new(Store(state.clone()));
        let admin = AdminServiceServer::new(Admin(state.clone()));
        let task = tokio::spawn(async move {
            tonic::transport::Server::builder()
                .add_service(store)
                .add_service(admin)
                .serve_with_incoming(TcpListenerStream::new(listener))
                .await
                .expect("fake store");
        });
        Self { addr, state, task }
    }

    pub fn admin_calls(&self) -> u64 {
        self.state.admin_calls.load(Ordering::SeqCst)
    }
}

struct Store(Arc<ReplicaState>);

fn unimplemented<T>() -> Result<Response<T>, Status> {
    Err(Status::unimplemented("not in the fake"))
}

#[tonic::async_trait]
impl StoreService for Store {
    async fn register(&self, _: Request<pb::RegisterRequest>) -> Result<Response<pb::RegisterReply>, Status> {
        unimplemented()
    }
    async fn renew(&self, _: Request<pb::RenewRequest>) -> Result<Response<pb::RenewReply>, Status> {
        unimplemented()
    }
    async fn release(&self, _: Request<pb::ReleaseRequest>) -> Result<Response<pb::ReleaseReply>, Status> {
        unimplemented()
    }
    async fn bump(&self, _: Request<pb::BumpRequest>) -> Result<Response<pb::BumpReply>, Status> {
        unimplemented()
    }
    async fn load(&self, _: Request<pb::LoadRequest>) -> Result<Response<pb::LoadReply>, Status> {
        unimplemented()
    }
    async fn get_routes(&self, _: Request<pb::GetRoutesRequest>) -> Result<Response<pb::GetRoutesReply>, Status> {
        Ok(Response::new(pb::GetRoutesReply {
            routes: self.0.routes.lock().unwrap().clone(),
        }))
    }
    async fn status(&self, _: Request<pb::StatusRequest>) -> Result<Response<pb::StatusReply>, Status> {
        Ok(Response::new(self.0.status.lock().unwrap().clone()))
    }
    async fn raise_marks(&self, _: Request<pb::RaiseMarksRequest>) -> Result<Response<pb::RaiseMarksReply>, Status> {
        Err(Status::unimplemented("raise_marks"))
    }
}

struct Admin(Arc<ReplicaState>);

impl Admin {
    fn membership(&self, change: impl FnOnce(&mut Vec<u64>)) -> Result<Response<pb::MembershipReply>, Status> {
        let s = &self.0;
        s.admin_calls.fetch_add(1, Ordering::SeqCst);
        if let Some(hint) = s.not_leader.lock().unwrap().clone() {
            return Ok(Response::new(pb::MembershipReply {
                not_leader: Some(hint),
                ..Default::default()
            }));
        }
        let mut voters = s.voters.lock().unwrap();
        change(&mut voters);
        Ok(Response::new(pb::MembershipReply {
            not_leader: None,
            voters: voters.clone(),
            learners: vec![],
            log_index: 42,
        }))
    }
}

#[tonic::async_trait]
impl AdminService for Admin {
    async fn add_replica(&self, req: Request<pb::AddReplicaRequest>) -> Result<Response<pb::MembershipReply>, Status> {
        let id = req.into_inner().node_id;
        if self.0.voters.lock().unwrap().contains(&id) {
            return Err(Status::invalid_argument(format!("node id {id} is already a member")));
        }
        self.membership(|v| v.push(id))
    }
    async fn remove_replica(
        &self,
        req: Request<pb::RemoveReplicaRequest>,
    ) -> Result<Response<pb::MembershipReply>, Status> {
        let id = req.into_inner().node_id;
        self.membership(|v| v.retain(|&x| x != id))
    }
    // The move RPCs are not faked: seqctl's tests of moves run against real StoreSvrs.
    async fn get_cluster_map(
        &self,
        _req: Request<pb::GetClusterMapRequest>,
    ) -> Result<Response<pb::ClusterMapReply>, Status> {
        Err(Status::unimplemented("not faked"))
    }
    async fn change_map(&self, _req: Request<pb::ChangeMapRequest>) -> Result<Response<pb::ChangeMapReply>, Status> {
        Err(Status::unimplemented("not faked"))
    }
    async fn range_step(&self, _req: Request<pb::RangeStepRequest>) -> Result<Response<pb::RangeStepReply>, Status> {
        Err(Status::unimplemented("not faked"))
    }
    async fn drain_alloc_svr(
        &self,
        _req: Request<pb::DrainAllocSvrRequest>,
    ) -> Result<Response<pb::DrainAllocSvrReply>, Status> {
        Err(Status::unimplemented("not faked"))
    }
    async fn publish_map(&self, _req: Request<pb::PublishMapRequest>) -> Result<Response<pb::PublishMapReply>, Status> {
        Err(Status::unimplemented("not faked"))
    }
    async fn export_status(
        &self,
        _req: Request<pb::ExportStatusRequest>,
    ) -> Result<Response<pb::ExportStatusReply>, Status> {
        Err(Status::unimplemented("not faked"))
    }
    /// The canned trail, whatever was asked (the request is kept for the test to check).
    async fn get_audit(&self, req: Request<pb::GetAuditRequest>) -> Result<Response<pb::GetAuditReply>, Status> {
        let s = &self.0;
        s.admin_calls.fetch_add(1, Ordering::SeqCst);
        if let Some(hint) = s.not_leader.lock().unwrap().clone() {
            return Ok(Response::new(pb::GetAuditReply {
                not_leader: Some(hint),
                ..Default::default()
            }));
        }
        *s.audit_asked.lock().unwrap() = Some(req.into_inner());
        Ok(Response::new(s.audit.lock().unwrap().clone()))
    }
    type BackupStream = tonic::codegen::BoxStream<pb::BackupChunk>;
    /// The canned chunks (a test plants a whole, cut or oversized stream), or a hint.
    async fn backup(&self, _req: Request<pb::BackupRequest>) -> Result<Response<Self::BackupStream>, Status> {
        let s = &self.0;
        s.admin_calls.fetch_add(1, Ordering::SeqCst);
        let chunks = match s.not_leader.lock().unwrap().clone() {
            Some(hint) => vec![pb::BackupChunk {
                not_leader: Some(hint),
                ..Default::default()
            }],
            None => s.backup.lock().unwrap().clone(),
        };
        Ok(Response::new(Box::pin(futures::stream::iter(
            chunks.into_iter().map(Ok),
        ))))
    }
}
