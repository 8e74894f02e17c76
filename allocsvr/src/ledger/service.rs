//! The `LedgerService` an AllocSvr serves: each call placed ([`super::route`]) and forwarded to the
//! leader of the set that keeps the key, over one leader-following client per set.
//!
//! A call's deadline is its caller's (`grpc-timeout`, at most [`MOST_WAIT`]): the store calls, the
//! map refreshes after "not served by this set now" and the pauses between them all fit in it.
//!
//! Left out: the forwarding loop itself (`forward`), and the key's placement (`route`).

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use seqsvr_auth::{Caller, Role};
use seqsvr_control::{AdminClient, Dialer, LedgerClient, Seed, StoreTimeouts};
use seqsvr_proto::pb;
use tonic::{Request, Response, Status};
use tracing::{debug, info};

use super::forward::{Sets, forward};
use super::route::place;
use crate::state::AllocState;

/// The longest a forwarded call may take when its caller sets no deadline (a StoreService call's
/// overall deadline).
pub const MOST_WAIT: Duration = Duration::from_secs(5);
/// How long a refresh of the cluster map from set 0 may take.
const MAP_READ: Duration = Duration::from_millis(800);

/// The ledger front of one AllocSvr, served with `LedgerServiceServer::from_arc` on the gRPC port
/// and in process to the front ends.
pub struct LedgerFront {
    shared: Arc<AllocState>,
    /// This node's configured StoreSvrs: the way to its own set before a map names its stores.
    own_stores: Vec<Seed>,
    /// Opens store connections with this AllocSvr's certificate when TLS is on.
    dialer: Dialer,
    /// One client per set, with the stores it was built for (rebuilt when the map's list changes).
    sets: Mutex<HashMap<u64, (Vec<String>, LedgerClient)>>,
}

impl LedgerFront {
    /// A front over this node's state, reaching stores through `dialer`.
    pub fn new(shared: Arc<AllocState>, own_stores: Vec<Seed>, dialer: Dialer) -> Self {
        Self {
            shared,
            own_stores,
            dialer,
            sets: Mutex::new(HashMap::new()),
        }
    }

    /// The client of the set that keeps `key` now, by the held map.
    fn client_for(&self, key: &str) -> Result<(u64, LedgerClient), Status> {
        let params = self.shared.params();
        let map = self.shared.map();
        let p = place(
            key,
            self.shared.key_placement().unwrap_or_default(),
            (params.uid_limit, params.section_size),
            map.as_deref(),
            params.set_id,
        );
        let mut sets = self.sets.lock().unwrap_or_else(|e| e.into_inner());
        if let Some((stores, client)) = sets.get(&p.set_id)
            && (p.stores.is_empty() || *stores == p.stores)
        {
            return Ok((p.set_id, client.clone()));
        }
        let seeds = if !p.stores.is_empty() {
            p.stores
                .iter()
                .map(|a| Seed::parse(a))
                .collect::<Result<Vec<_>, _>>()
                .map_err(|e| Status::internal(format!("the cluster map lists a bad store of set {}: {e}", p.set_id)))?
        } else if p.set_id == params.set_id {
            self.own_stores.clone()
        } else {
            return Err(Status::unavailable(format!(
                "the cluster map lists no StoreSvr of set {}, which keeps this key",
                p.set_id
            )));
        };
        let client = LedgerClient::with_dialer(seeds, StoreTimeouts::default(), &self.dialer)
            .map_err(|e| Status::internal(format!("cannot reach set {}: {e}", p.set_id)))?;
        debug!(set = p.set_id, stores = ?p.stores, "ledger client for a set");
        sets.insert(p.set_id, (p.stores, client.clone()));
        Ok((p.set_id, client))
    }

    /// Reads the cluster map from set 0 (which publishes it) and keeps it when newer: after a
    /// move's switch the held map may name the set a section left.
    async fn refresh_map(&self, budget: Duration) {
        let map = self.shared.map();
        let set0: Vec<Seed> = map
            .as_ref()
            .and_then(|m| m.sets.iter().find(|s| s.set_id == 0))
            .map(|s| s.stores.iter().filter_map(|a| Seed::parse(a).ok()).collect())
            .filter(|v: &Vec<Seed>| !v.is_empty())
            .unwrap_or_else(|| self.own_stores.clone());
        let timeouts = StoreTimeouts {
            attempt: budget.min(MAP_READ),
            overall: budget.min(MAP_READ),
        };
        let Ok(admin) = AdminClient::with_dialer(set0, timeouts, &self.dialer) else {
            return;
        };
        match admin.cluster_map().await {
            Ok(m) => {
                let before = self.shared.map_version();
                self.shared.store_map(Some(m));
                if self.shared.map_version() != before {
                    info!(
                        from = before,
                        to = self.shared.map_version(),
                        "ledger call: map refreshed"
                    );
                }
            }
            Err(e) => debug!(error = %e, "ledger call: no map refresh"),
        }
    }
}

impl Sets for LedgerFront {
    fn client_for(&self, key: &str) -> Result<(u64, LedgerClient), Status> {
        LedgerFront::client_for(self, key)
    }

    async fn refresh(&self, budget: Duration) {
        self.refresh_map(budget).await
    }
}

/// The caller's deadline, from `grpc-timeout`, capped at [`MOST_WAIT`].
fn wait_of<T>(req: &Request<T>) -> Duration {
    req.metadata()
        .get("grpc-timeout")
        .and_then(|v| v.to_str().ok())
        .and_then(parse_grpc_timeout)
        .map_or(MOST_WAIT, |d| d.min(MOST_WAIT))
}

/// A `grpc-timeout` header value: up to 8 digits and a unit (H, M, S, m, u, n).
fn parse_grpc_timeout(v: &str) -> Option<Duration> {
    if v.len() < 2 || v.len() > 9 {
        return None;
    }
    let (digits, unit) = v.split_at(v.len() - 1);
    let n: u64 = digits.parse().ok()?;
    Some(match unit {
        "H" => Duration::from_secs(n.checked_mul(3600)?),
        "M" => Duration::from_secs(n.checked_mul(60)?),
        "S" => Duration::from_secs(n),
        "m" => Duration::from_millis(n),
        "u" => Duration::from_micros(n),
        "n" => Duration::from_nanos(n),
        _ => return None,
    })
}

/// Void and Reconcile change the record an auditor reads: an operator's calls. The store admits
/// this node's certificate for them, so the check of the caller's own is made here.
fn admin_only<T>(req: &Request<T>, what: &str) -> Result<(), Status> {
    let who = Caller::of(req);
    match who.role {
        None | Some(Role::Admin) => Ok(()),
        Some(_) => Err(Status::permission_denied(format!(
            "{what} is an operator's call: {who} has no admin certificate"
        ))),
    }
}

/// Counts one call in `allocsvr_ledger_calls_total{call, code}` (`code` is `Ok` or the status's
/// code: the set of labels is bounded) and wraps its reply.
fn counted<T>(call: &'static str, r: Result<T, Status>) -> Result<Response<T>, Status> {
    let code = match &r {
        Ok(_) => tonic::Code::Ok,
        Err(s) => s.code(),
    };
    metrics::counter!("allocsvr_ledger_calls_total", "call" => call, "code" => format!("{code:?}")).increment(1);
    r.map(Response::new)
}

#[tonic::async_trait]
impl pb::ledger_service_server::LedgerService for LedgerFront {
    async fn create_ledger(&self, req: Request<pb::CreateLedgerRequest>) -> Result<Response<pb::LedgerReply>, Status> {
        let wait = wait_of(&req);
        counted("create", forward(self, req.into_inner(), wait).await)
    }

    async fn reserve(&self, req: Request<pb::LedgerReserveRequest>) -> Result<Response<pb::LedgerReply>, Status> {
        let wait = wait_of(&req);
        counted("reserve", forward(self, req.into_inner(), wait).await)
    }

    async fn confirm(&self, req: Request<pb::LedgerConfirmRequest>) -> Result<Response<pb::LedgerReply>, Status> {
        let wait = wait_of(&req);
        counted("confirm", forward(self, req.into_inner(), wait).await)
    }

    async fn release(&self, req: Request<pb::LedgerReleaseRequest>) -> Result<Response<pb::LedgerReply>, Status> {
        let wait = wait_of(&req);
        counted("release", forward(self, req.into_inner(), wait).await)
    }

    async fn void(&self, req: Request<pb::LedgerVoidRequest>) -> Result<Response<pb::LedgerReply>, Status> {
        let allowed = admin_only(&req, "Void");
        let wait = wait_of(&req);
        let r = match allowed {
            Ok(()) => forward(self, req.into_inner(), wait).await,
            Err(e) => Err(e),
        };
        counted("void", r)
    }

    async fn reconcile(&self, req: Request<pb::LedgerReconcileRequest>) -> Result<Response<pb::LedgerReply>, Status> {
        let allowed = admin_only(&req, "Reconcile");
        let wait = wait_of(&req);
        let r = match allowed {
            Ok(()) => forward(self, req.into_inner(), wait).await,
            Err(e) => Err(e),
        };
        counted("reconcile", r)
    }

    async fn show(&self, req: Request<pb::LedgerShowRequest>) -> Result<Response<pb::LedgerShowReply>, Status> {
        let wait = wait_of(&req);
        counted("show", forward(self, req.into_inner(), wait).await)
    }

    async fn gaps(&self, req: Request<pb::LedgerGapsRequest>) -> Result<Response<pb::LedgerGapsReply>, Status> {
        let wait = wait_of(&req);
        counted("gaps", forward(self, req.into_inner(), wait).await)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn grpc_timeouts_parse_in_every_unit_and_bad_ones_do_not() {
        let ok = [
            ("1H", Duration::from_secs(3600)),
            ("2M", Duration::from_secs(120)),
            ("5S", Duration::from_secs(5)),
            ("250m", Duration::from_millis(250)),
            ("99999999u", Duration::from_micros(99_999_999)),
            ("7n", Duration::from_nanos(7)),
        ];
        for (v, d) in ok {
            assert_eq!(parse_grpc_timeout(v), Some(d), "{v}");
        }
        for bad in ["", "S", "5", "5s", "-5S", "123456789S", "5 S"] {
            assert_eq!(parse_grpc_timeout(bad), None, "{bad:?}");
        }
    }

    #[test]
    fn only_an_admin_or_a_plaintext_caller_may_void() {
        let with = |role: Option<Role>| {
            let mut req = Request::new(());
            req.extensions_mut().insert(Caller {
                subject: Arc::from("x"),
                role,
            });
            admin_only(&req, "Void")
        };
        assert!(with(None).is_ok());
        assert!(with(Some(Role::Admin)).is_ok());
        for role in [Role::Client, Role::AllocSvr, Role::StoreSvr] {
            let e = with(Some(role)).unwrap_err();
            assert_eq!(e.code(), tonic::Code::PermissionDenied, "{role}");
        }
    }
}
