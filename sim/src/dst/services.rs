//! The StoreSvr's gRPC services as the move driver (and any control-plane client) reaches them in
//! `sim dst`: the generated `AdminService` and `StoreService` servers over the modelled groups, so
//! the production `Mover`, `AdminClient` and `StoreClient` run unchanged over the in-process
//! transport — every request and reply encoded as on the wire, every message crossing the
//! simulated network between the operator and the replica.
//!
//! A replica answers as the real one does: writes and linearizable reads through the group model
//! (`Group::receive`, committed by `World::deliver`), a not-leader hint naming the leader's
//! address, an error status from the production `RpcError`, and silence (the caller's attempt
//! times out) when it is down or cut off. Status is answered from the replica's view of the state.
//!
//! Deliberately left out: the AllocSvr-facing StoreService calls (AllocSvrs use `SimStore`, which
//! models their store client), membership changes and reading the audit trail (not modelled;
//! `Unimplemented`: the move driver calls neither).

use std::sync::Arc;

use seqsvr_proto::pb;
use seqsvr_proto::pb::admin_service_server::AdminService;
use seqsvr_proto::pb::store_service_server::StoreService;
use storesvr::protocol::CallReply;
use tonic::{Request, Response, Status};

use super::addrs::store_addr;
use super::group::{Rep, Req};
use super::world::{Ep, World};

/// Replica `r` of `set` as the operator and the AllocSvrs reach it: its gRPC services over the
/// simulated network (the replica itself, its state and memory, is [`super::group::Replica`]).
#[derive(Clone)]
pub struct ReplicaService {
    pub world: Arc<World>,
    pub set: u64,
    pub r: usize,
}

impl ReplicaService {
    /// Sends `req` to this replica over the operator's link; its reply, or an error status.
    async fn ask<T: CallReply>(&self, req: Req) -> Result<Response<T>, Status> {
        let to = Ep::Store(self.set, self.r);
        self.world.cross(Ep::Operator, to).await;
        let Some(rep) = self.world.deliver(self.set, self.r, &req).await else {
            return std::future::pending().await;
        };
        self.world.cross(to, Ep::Operator).await;
        match rep {
            Rep::NotLeader(leader) => Ok(Response::new(T::not_leader(pb::LeaderHint {
                leader_id: leader.map_or(0, |l| l as u64 + 1),
                leader_addr: leader.map(|l| store_addr(self.set, l)).unwrap_or_default(),
            }))),
            Rep::Error(e) => Err(e.into()),
            Rep::Reply(reply) => {
                let shown = format!("{reply:?}");
                T::take(reply)
                    .map(Response::new)
                    .ok_or_else(|| Status::internal(format!("reply of another kind: {shown}")))
            }
        }
    }
}

fn not_modelled<T>(what: &str) -> Result<Response<T>, Status> {
    Err(Status::unimplemented(format!("{what} is not modelled in sim dst")))
}

#[tonic::async_trait]
impl AdminService for ReplicaService {
    async fn add_replica(&self, _: Request<pb::AddReplicaRequest>) -> Result<Response<pb::MembershipReply>, Status> {
        not_modelled("AddReplica")
    }

    async fn remove_replica(
        &self,
        _: Request<pb::RemoveReplicaRequest>,
    ) -> Result<Response<pb::MembershipReply>, Status> {
        not_modelled("RemoveReplica")
    }

    async fn get_cluster_map(
        &self,
        _: Request<pb::GetClusterMapRequest>,
    ) -> Result<Response<pb::ClusterMapReply>, Status> {
        self.ask(Req::GetClusterMap).await
    }

    async fn change_map(&self, req: Request<pb::ChangeMapRequest>) -> Result<Response<pb::ChangeMapReply>, Status> {
        self.ask(Req::ChangeMap(req.into_inner())).await
    }

    async fn range_step(&self, req: Request<pb::RangeStepRequest>) -> Result<Response<pb::RangeStepReply>, Status> {
        self.ask(Req::RangeStep(req.into_inner())).await
    }

    async fn export_status(
        &self,
        req: Request<pb::ExportStatusRequest>,
    ) -> Result<Response<pb::ExportStatusReply>, Status> {
        self.ask(Req::ExportStatus(req.into_inner())).await
    }

    async fn drain_alloc_svr(
        &self,
        _: Request<pb::DrainAllocSvrRequest>,
    ) -> Result<Response<pb::DrainAllocSvrReply>, Status> {
        not_modelled("DrainAllocSvr")
    }

    async fn publish_map(&self, req: Request<pb::PublishMapRequest>) -> Result<Response<pb::PublishMapReply>, Status> {
        self.ask(Req::PublishMap(req.into_inner())).await
    }

    async fn get_audit(&self, _: Request<pb::GetAuditRequest>) -> Result<Response<pb::GetAuditReply>, Status> {
        not_modelled("GetAudit")
    }
    type BackupStream = tonic::codegen::BoxStream<pb::BackupChunk>;

    async fn backup(&self, _: Request<pb::BackupRequest>) -> Result<Response<Self::BackupStream>, Status> {
        not_modelled("Backup")
    }
}

#[tonic::async_trait]
impl StoreService for ReplicaService {
    async fn register(&self, _: Request<pb::RegisterRequest>) -> Result<Response<pb::RegisterReply>, Status> {
        not_modelled("Register over gRPC")
    }

    async fn renew(&self, _: Request<pb::RenewRequest>) -> Result<Response<pb::RenewReply>, Status> {
        not_modelled("Renew over gRPC")
    }

    async fn release(&self, _: Request<pb::ReleaseRequest>) -> Result<Response<pb::ReleaseReply>, Status> {
        not_modelled("Release over gRPC")
    }

    async fn bump(&self, _: Request<pb::BumpRequest>) -> Result<Response<pb::BumpReply>, Status> {
        not_modelled("Bump over gRPC")
    }

    async fn raise_marks(&self, _: Request<pb::RaiseMarksRequest>) -> Result<Response<pb::RaiseMarksReply>, Status> {
        not_modelled("RaiseMarks")
    }

    async fn load(&self, req: Request<pb::LoadRequest>) -> Result<Response<pb::LoadReply>, Status> {
        self.ask(Req::Load(req.into_inner())).await
    }

    async fn get_routes(&self, _: Request<pb::GetRoutesRequest>) -> Result<Response<pb::GetRoutesReply>, Status> {
        not_modelled("GetRoutes")
    }

    /// From this replica's own view, as the real one answers (any replica, no read index).
    async fn status(&self, _: Request<pb::StatusRequest>) -> Result<Response<pb::StatusReply>, Status> {
        let to = Ep::Store(self.set, self.r);
        self.world.cross(Ep::Operator, to).await;
        let reply = {
            let st = self.world.lock();
            let g = &st.groups[self.set as usize];
            if !g.replicas[self.r].up {
                None
            } else {
                let leader = g.leader();
                Some(pb::StatusReply {
                    node_id: self.r as u64 + 1,
                    set_id: self.set,
                    leader_id: leader.map_or(0, |l| l as u64 + 1),
                    leader_addr: leader.map(|l| store_addr(self.set, l)).unwrap_or_default(),
                    term: g.replicas[self.r].term,
                    allocsvrs: g
                        .set
                        .allocsvrs
                        .values()
                        .map(|a| pb::AllocSvrInfo {
                            node_id: a.node_id.0,
                            incarnation: a.incarnation.0,
                            addr: a.addr.clone(),
                            ..Default::default()
                        })
                        .collect(),
                    route_version: g.set.route_version,
                    params: g.set.params.as_ref().map(|p| p.to_pb()),
                    ..Default::default()
                })
            }
        };
        let Some(reply) = reply else {
            return std::future::pending().await;
        };
        self.world.cross(to, Ep::Operator).await;
        Ok(Response::new(reply))
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use seqsvr_control::leader::Seed;
    use seqsvr_control::{Dialer, Mover, StoreTimeouts};

    use super::*;
    use crate::dst::addrs::REPLICAS;
    use crate::dst::group::Group;
    use crate::dst::group::tests::params;
    use crate::dst::transport::SimConnect;
    use crate::dst::world::{State, rng};

    fn seeds(set: u64) -> Vec<Seed> {
        (0..REPLICAS)
            .map(|r| Seed::parse(&store_addr(set, r)).unwrap())
            .collect()
    }

    /// The production move driver, over the in-process transport, against two modelled sets:
    /// add the set, plan, record and drive the move to done; the map then gives the range to
    /// set 1 and set 1's state owns it.
    #[tokio::test(start_paused = true)]
    async fn the_production_mover_drives_a_move_over_two_modelled_sets() {
        let groups = (0..2)
            .map(|set| {
                Group::new(
                    params(set),
                    Duration::from_secs(1),
                    storesvr::domain::state::UnsafeRules::default(),
                )
            })
            .collect();
        let state = State {
            rng: rng(5),
            net: Default::default(),
            groups,
            allocs: Vec::new(),
            forger: None,
            forged: Default::default(),
            skip_restore_check: false,
            restores: Default::default(),
        };
        let world = World::new(state, allocsvr::UnsafeRules::default());
        crate::dst::spawn_store(&world);
        // Both sets elect a leader and initialize (bounded: the election timeout is 300–600 ms).
        for _ in 0..100 {
            let ready = world
                .lock()
                .groups
                .iter()
                .all(|g| g.leader().is_some() && g.set.params.is_some());
            if ready {
                break;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        let dialer = Dialer::in_process(Arc::new(SimConnect { world: world.clone() }), 9);
        let timeouts = StoreTimeouts {
            attempt: Duration::from_millis(500),
            overall: Duration::from_secs(5),
        };
        let mover = Mover::with_dialer(seeds(0), timeouts, 1, dialer).unwrap();
        let stores: Vec<String> = (0..REPLICAS).map(|r| store_addr(1, r)).collect();
        mover.add_set(1, stores).await.unwrap();
        let plan = mover.plan(0, 1, 2, 4).await.unwrap();
        assert_eq!(plan.sections.len(), 2);
        mover.begin(77, &plan).await.unwrap();
        let mut phases = Vec::new();
        let done = mover
            .drive(77, |p| {
                if let seqsvr_control::mover::Progress::Step { phase, .. } = p {
                    phases.push(phase);
                }
            })
            .await
            .unwrap();
        assert_eq!(done.phase, pb::MovePhase::Done as i32);
        assert_eq!(phases.last(), Some(&pb::MovePhase::Done), "{phases:?}");
        let map = mover.map().await.unwrap();
        let set_of = |s: u64| {
            map.ranges
                .iter()
                .find(|r| r.section_begin <= s && s < r.section_end)
                .map(|r| r.set_id)
        };
        assert_eq!(
            (set_of(1), set_of(2), set_of(3), set_of(4)),
            (Some(0), Some(1), Some(1), Some(0))
        );
        let st = world.lock();
        assert!(st.groups[1].set.ranges.is_owned(seqsvr_proto::SectionId(3)));
        assert!(!st.groups[0].set.ranges.is_owned(seqsvr_proto::SectionId(3)));
        assert!(
            st.groups[1]
                .set
                .cached_map
                .as_ref()
                .is_some_and(|c| c.version == map.version),
            "the driver published the final map to set 1"
        );
    }
}
