//! An in-memory FAKE StoreService for AllocSvr tests: registrations, epochs, fencing, grants,
//! releases and the route table, in one mutex, with no Raft. Tests steer ownership by hand
//! (`assign`, `unassign`) or let it auto-assign every section to the newest registration, and can
//! make the store unreachable or lose bump replies.

#![allow(dead_code)]

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};

use seqsvr_proto::pb;
use seqsvr_proto::pb::store_service_server::{StoreService, StoreServiceServer};
use tonic::{Request, Response, Status};

#[derive(Debug, Clone, Default)]
pub struct FakeSection {
    pub max_seq: u64,
    pub epoch: u64,
    /// 0 = unowned.
    pub owner: u64,
    /// The owner was assigned after a release (or with no previous owner): serve without waiting.
    pub no_wait: bool,
}

#[derive(Debug, Default)]
pub struct State {
    pub params: pb::SetParams,
    pub next_incarnation: u64,
    /// incarnation -> (node_id, addr); superseded incarnations are removed.
    pub nodes: HashMap<u64, (u64, String)>,
    pub sections: Vec<FakeSection>,
    pub route_version: u64,
    /// Give every section to the newest registration (sections of superseded incarnations too).
    pub auto_assign: bool,
    /// Every RPC fails with UNAVAILABLE.
    pub unavailable: bool,
    /// Sections every Renew asks the node to hand over.
    pub handover: Vec<pb::SectionRange>,
    /// Every Bump fails with UNAVAILABLE and changes nothing.
    pub bump_unavailable: bool,
    /// Apply the next N bumps but answer UNAVAILABLE (a lost reply).
    pub lose_bump_replies: u32,
    /// Every bump item received, in order: (section, epoch, new_max).
    pub bump_log: Vec<(u64, u64, u64)>,
    pub bump_rpcs: u64,
    pub releases: u64,
    /// Answer bumps APPLIED with epoch 0 without applying them (a malformed reply).
    pub zero_epoch_bump_replies: bool,
    /// Every Release received, in order.
    pub release_log: Vec<pb::ReleaseRequest>,
    /// The cluster map a renewal gets when its map version is older.
    pub map: Option<pb::ClusterMap>,
}

impl State {
    fn check(&self) -> Result<(), Status> {
        if self.unavailable {
            Err(Status::unavailable("fake store is down"))
        } else {
            Ok(())
        }
    }

    fn bump_route_version(&mut self) {
        self.route_version += 1;
    }

    pub fn assign(&mut self, begin: u64, end: u64, incarnation: u64, no_wait: bool) {
        for s in &mut self.sections[begin as usize..end as usize] {
            s.epoch += 1;
            s.owner = incarnation;
            s.no_wait = no_wait;
        }
        self.bump_route_version();
    }

    pub fn unassign(&mut self, begin: u64, end: u64) {
        for s in &mut self.sections[begin as usize..end as usize] {
            s.epoch += 1;
            s.owner = 0;
            s.no_wait = true;
        }
        self.bump_route_version();
    }

    pub fn routes(&self) -> pb::RouteTable {
        let mut entries: Vec<pb::RouteEntry> = Vec::new();
        for (i, s) in self.sections.iter().enumerate() {
            let i = i as u64;
            match entries.last_mut() {
                Some(e) if e.incarnation == s.owner => e.section_end = i + 1,
                _ => {
                    let (node_id, addr) = self.nodes.get(&s.owner).cloned().unwrap_or_default();
                    entries.push(pb::RouteEntry {
                        set_id: 0,
                        section_begin: i,
                        section_end: i + 1,
                        node_id,
                        incarnation: s.owner,
                        addr,
                    });
                }
            }
        }
        pb::RouteTable {
            set_id: 0,
            version: self.route_version,
            section_size: self.params.section_size,
            uid_limit: self.params.uid_limit,
            entries,
        }
    }

    fn grants(&self, incarnation: u64) -> Vec<pb::Grant> {
        let mut grants: Vec<pb::Grant> = Vec::new();
        for (i, s) in self.sections.iter().enumerate() {
            let i = i as u64;
            if s.owner != incarnation {
                continue;
            }
            match grants.last_mut() {
                Some(g) if g.section_end == i && g.epoch == s.epoch && g.no_wait == s.no_wait => g.section_end = i + 1,
                _ => grants.push(pb::Grant {
                    section_begin: i,
                    section_end: i + 1,
                    epoch: s.epoch,
                    no_wait: s.no_wait,
                    wait_ms: None,
                }),
            }
        }
        grants
    }
}

/// Handle to a running fake store.
#[derive(Clone)]
pub struct FakeStore {
    pub state: Arc<Mutex<State>>,
    pub addr: SocketAddr,
}

/// Short timings so tests run in about a second: lease 600 ms, renew every 100 ms.
pub fn test_params(sections: u64, section_size: u64, step: u64) -> pb::SetParams {
    pb::SetParams {
        set_id: 0,
        section_size,
        uid_limit: sections * section_size,
        step,
        lease_ms: 600,
        renew_interval_ms: 100,
        drift_ppm: 10_000,
        margin_ms: 50,
        sections: Some(pb::SectionRange {
            begin: 0,
            end: sections,
        }),
    }
}

impl FakeStore {
    pub async fn start(params: pb::SetParams, auto_assign: bool) -> FakeStore {
        let count = params.sections.as_ref().unwrap().end as usize;
        let state = Arc::new(Mutex::new(State {
            params,
            next_incarnation: 100,
            sections: vec![FakeSection::default(); count],
            route_version: 1,
            auto_assign,
            ..Default::default()
        }));
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let svc = Svc { state: state.clone() };
        tokio::spawn(
            tonic::transport::Server::builder()
                .add_service(StoreServiceServer::new(svc))
                .serve_with_incoming(tonic::transport::server::TcpIncoming::from(listener)),
        );
        FakeStore { state, addr }
    }

    pub fn with<R>(&self, f: impl FnOnce(&mut State) -> R) -> R {
        f(&mut self.state.lock().unwrap())
    }

    /// The committed ceiling of a section.
    pub fn max_seq(&self, section: u64) -> u64 {
        self.with(|s| s.sections[section as usize].max_seq)
    }

    /// The newest incarnation handed out.
    pub fn last_incarnation(&self) -> u64 {
        self.with(|s| s.next_incarnation - 1)
    }
}

struct Svc {
    state: Arc<Mutex<State>>,
}

#[tonic::async_trait]
impl StoreService for Svc {
    async fn register(&self, req: Request<pb::RegisterRequest>) -> Result<Response<pb::RegisterReply>, Status> {
        let req = req.into_inner();
        let mut st = self.state.lock().unwrap();
        st.check()?;
        let inc = st.next_incarnation;
        st.next_incarnation += 1;
        let superseded: Vec<u64> = st
            .nodes
            .iter()
            .filter(|(_, (node, _))| *node == req.node_id)
            .map(|(i, _)| *i)
            .collect();
        for i in &superseded {
            st.nodes.remove(i);
        }
        st.nodes.insert(inc, (req.node_id, req.addr));
        if st.auto_assign {
            let n = st.sections.len();
            for i in 0..n {
                let s = &mut st.sections[i];
                if s.owner == 0 || superseded.contains(&s.owner) {
                    let released = s.owner == 0;
                    s.epoch += 1;
                    s.owner = inc;
                    s.no_wait = released;
                }
            }
            st.bump_route_version();
        }
        Ok(Response::new(pb::RegisterReply {
            not_leader: None,
            incarnation: inc,
            params: Some(st.params),
        }))
    }

    async fn renew(&self, req: Request<pb::RenewRequest>) -> Result<Response<pb::RenewReply>, Status> {
        let req = req.into_inner();
        let st = self.state.lock().unwrap();
        st.check()?;
        if !st.nodes.contains_key(&req.incarnation) {
            return Ok(Response::new(pb::RenewReply {
                status: pb::RenewStatus::UnknownIncarnation as i32,
                ..Default::default()
            }));
        }
        Ok(Response::new(pb::RenewReply {
            not_leader: None,
            status: pb::RenewStatus::Ok as i32,
            grants: st.grants(req.incarnation),
            handover: st.handover.clone(),
            route_version: st.route_version,
            routes: (req.route_version < st.route_version).then(|| st.routes()),
            map_version: st.map.as_ref().map_or(0, |m| m.version),
            map: st.map.clone().filter(|m| req.map_version < m.version),
            renew_soon: false,
            // This fake sets up no time-ordered ids: the node holds no slot.
            ..Default::default()
        }))
    }

    async fn release(&self, req: Request<pb::ReleaseRequest>) -> Result<Response<pb::ReleaseReply>, Status> {
        let req = req.into_inner();
        let mut st = self.state.lock().unwrap();
        st.check()?;
        st.release_log.push(req.clone());
        let mut released = 0;
        for r in &req.sections {
            for i in r.begin..r.end.min(st.sections.len() as u64) {
                let s = &mut st.sections[i as usize];
                if s.owner == req.incarnation && s.owner != 0 && s.epoch == r.epoch {
                    s.owner = 0;
                    s.epoch += 1;
                    s.no_wait = true;
                    released += 1;
                }
            }
        }
        st.releases += 1;
        if released > 0 {
            st.bump_route_version();
        }
        Ok(Response::new(pb::ReleaseReply {
            not_leader: None,
            released,
        }))
    }

    async fn bump(&self, req: Request<pb::BumpRequest>) -> Result<Response<pb::BumpReply>, Status> {
        let req = req.into_inner();
        let mut st = self.state.lock().unwrap();
        st.check()?;
        if st.bump_unavailable {
            return Err(Status::unavailable("fake store refuses bumps"));
        }
        if !st.nodes.contains_key(&req.incarnation) {
            return Err(Status::failed_precondition("unknown incarnation"));
        }
        if req.items.is_empty() || req.items.len() > 10_000 {
            return Err(Status::invalid_argument("bad bump size"));
        }
        if req.items.iter().any(|i| i.section >= st.sections.len() as u64) {
            return Err(Status::invalid_argument("unknown section"));
        }
        st.bump_rpcs += 1;
        if st.zero_epoch_bump_replies {
            let results = req
                .items
                .iter()
                .map(|i| pb::BumpResult {
                    section: i.section,
                    outcome: pb::BumpOutcome::Applied as i32,
                    max_seq: i.new_max,
                    epoch: 0,
                })
                .collect();
            return Ok(Response::new(pb::BumpReply {
                not_leader: None,
                results,
            }));
        }
        let mut results = Vec::with_capacity(req.items.len());
        for item in &req.items {
            st.bump_log.push((item.section, item.epoch, item.new_max));
            let s = &mut st.sections[item.section as usize];
            let outcome = if s.epoch != item.epoch {
                pb::BumpOutcome::StaleEpoch
            } else if item.new_max <= s.max_seq {
                pb::BumpOutcome::NoOp
            } else {
                s.max_seq = item.new_max;
                pb::BumpOutcome::Applied
            };
            results.push(pb::BumpResult {
                section: item.section,
                outcome: outcome as i32,
                max_seq: s.max_seq,
                epoch: s.epoch,
            });
        }
        if st.lose_bump_replies > 0 {
            st.lose_bump_replies -= 1;
            return Err(Status::unavailable("bump reply lost (fake)"));
        }
        Ok(Response::new(pb::BumpReply {
            not_leader: None,
            results,
        }))
    }

    async fn load(&self, req: Request<pb::LoadRequest>) -> Result<Response<pb::LoadReply>, Status> {
        let req = req.into_inner();
        let st = self.state.lock().unwrap();
        st.check()?;
        let mut sections = Vec::new();
        for r in &req.sections {
            for i in r.begin..r.end.min(st.sections.len() as u64) {
                let s = &st.sections[i as usize];
                sections.push(pb::SectionState {
                    section: i,
                    max_seq: s.max_seq,
                    epoch: s.epoch,
                    owner_incarnation: s.owner,
                });
            }
        }
        Ok(Response::new(pb::LoadReply {
            not_leader: None,
            sections,
        }))
    }

    async fn get_routes(&self, _: Request<pb::GetRoutesRequest>) -> Result<Response<pb::GetRoutesReply>, Status> {
        let st = self.state.lock().unwrap();
        st.check()?;
        Ok(Response::new(pb::GetRoutesReply {
            routes: Some(st.routes()),
        }))
    }

    async fn raise_marks(&self, _: Request<pb::RaiseMarksRequest>) -> Result<Response<pb::RaiseMarksReply>, Status> {
        Err(Status::failed_precondition(
            "this fake store sets up no time-ordered ids",
        ))
    }

    async fn status(&self, _: Request<pb::StatusRequest>) -> Result<Response<pb::StatusReply>, Status> {
        let st = self.state.lock().unwrap();
        st.check()?;
        Ok(Response::new(pb::StatusReply {
            route_version: st.route_version,
            params: Some(st.params),
            ..Default::default()
        }))
    }
}
