//! The in-process transport of the client library and of the operator's tools in `sim dst`:
//! [`SimConnect`] hands an encoded gRPC request to the generated server of whoever the address
//! names — an AllocSvr's production `Service`, or a modelled StoreSvr replica's `AdminService` and
//! `StoreService` (`super::services`) — after it crosses the simulated network.
//!
//! Deliberately left out: the AllocSvr's own store client, which `super::world::SimStore` models
//! (it follows leaders the way the real one does, rather than speaking gRPC).

use std::sync::Arc;

use seqsvr_client::transport::{BoxError, CallFuture, Connect};
use tonic::codegen::Service as _;

use super::addrs::parse_store_addr;
use super::services::ReplicaService;
use super::world::{Ep, World};

/// The client library's transport in the simulation.
pub struct SimConnect {
    pub world: Arc<World>,
}

impl Connect for SimConnect {
    fn call(&self, addr: &str, req: tonic::codegen::http::Request<tonic::body::Body>) -> CallFuture {
        if let Some((set, r)) = parse_store_addr(addr) {
            return store_call(self.world.clone(), set, r, req);
        }
        let world = self.world.clone();
        let slot = world.lock().allocs.iter().position(|s| s.addr == addr);
        let addr = addr.to_owned();
        Box::pin(async move {
            let Some(i) = slot else {
                return Err(BoxError::from(format!("unknown address {addr}")));
            };
            world.cross(Ep::Clients, Ep::Alloc(i)).await;
            let (proc, server) = {
                let st = world.lock();
                (st.allocs[i].proc.clone(), st.allocs[i].server.clone())
            };
            let Some(mut server) = server else {
                return Err(BoxError::from("connection refused"));
            };
            proc.gate().await;
            let Ok(resp) = server.call(req).await;
            // A pause or a kill can strike between the answer and its sending.
            proc.gate().await;
            world.cross(Ep::Alloc(i), Ep::Clients).await;
            Ok(resp)
        })
    }
}

/// A control-plane request to replica `r` of `set`: the generated server of the service its path
/// names, over the modelled replica.
fn store_call(
    world: Arc<World>,
    set: u64,
    r: usize,
    req: tonic::codegen::http::Request<tonic::body::Body>,
) -> CallFuture {
    use seqsvr_proto::pb::admin_service_server::AdminServiceServer;
    use seqsvr_proto::pb::store_service_server::StoreServiceServer;
    let replica = ReplicaService { world, set, r };
    Box::pin(async move {
        let exists = (set as usize) < replica.world.lock().groups.len();
        if !exists {
            return Err(BoxError::from(format!("no set {set}")));
        }
        let path = req.uri().path().to_owned();
        let Ok(resp) = if path.starts_with("/seqsvr.v1.AdminService/") {
            AdminServiceServer::new(replica).call(req).await
        } else {
            StoreServiceServer::new(replica).call(req).await
        };
        Ok(resp)
    })
}
