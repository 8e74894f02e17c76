//! Mutual TLS with roles, end to end: a whole cluster of real processes started with `--tls-*`,
//! serving through the client library, and every role's certificate tried against every method of
//! every service.
//!
//! - A role that may call a method gets past the check: whatever the service answers (the probes
//!   send empty requests, so mostly INVALID_ARGUMENT), never PERMISSION_DENIED, never a transport
//!   failure. A role that may not gets PERMISSION_DENIED, and the server logs the peer's name.
//! - Certificates the handshake must refuse: expired, signed by a foreign CA, none at all, and a
//!   plaintext client. The same call with a valid certificate succeeds, so the refusals are not
//!   some other failure.
//!
//! Needs `cargo build --workspace --bins` first (see `e2e/mod.rs`).

mod e2e;

use std::sync::Arc;
use std::time::Duration;

use e2e::{Cluster, Role as Proc};
use seqsvr_auth::Role;
use seqsvr_auth::devca::{DevCa, Spec};
use seqsvr_proto::pb;
use seqsvr_proto::pb::admin_service_client::AdminServiceClient;
use seqsvr_proto::pb::alloc_service_client::AllocServiceClient;
use seqsvr_proto::pb::raft_service_client::RaftServiceClient;
use seqsvr_proto::pb::store_service_client::StoreServiceClient;
use tonic::Code;
use tonic::transport::Channel;

/// Every method of the four services (and health), as `Service/Method`.
const METHODS: &[&str] = &[
    "AllocService/FetchNextSeq",
    "AllocService/GetCurSeq",
    "AllocService/BatchFetchNextSeq",
    "StoreService/Register",
    "StoreService/Renew",
    "StoreService/Release",
    "StoreService/Bump",
    "StoreService/Load",
    "StoreService/GetRoutes",
    "StoreService/Status",
    "RaftService/AppendEntries",
    "RaftService/Vote",
    "RaftService/InstallSnapshot",
    "AdminService/AddReplica",
    "AdminService/RemoveReplica",
    "AdminService/GetClusterMap",
    "AdminService/ChangeMap",
    "AdminService/RangeStep",
    "AdminService/ExportStatus",
    "AdminService/DrainAllocSvr",
    "AdminService/PublishMap",
    "AdminService/GetAudit",
    "AdminService/Backup",
    "Health/Check",
];

/// The issue's table, written out here on its own so that a mistake in the server's table shows.
fn may_call(role: Role, method: &str) -> bool {
    let read_only = [
        "StoreService/GetRoutes",
        "StoreService/Status",
        "AdminService/GetClusterMap",
        "AdminService/ExportStatus",
        "Health/Check",
    ];
    if read_only.contains(&method) {
        return true;
    }
    if method == "StoreService/Load" {
        // A read of ceilings and owners: AllocSvrs gaining sections, admins planning a move.
        return matches!(role, Role::AllocSvr | Role::Admin);
    }
    match method.split('/').next().unwrap() {
        // AllocSvrs forward the calls of their HTTP and Redis front ends to the owner.
        "AllocService" => matches!(role, Role::Client | Role::Admin | Role::AllocSvr),
        "StoreService" => role == Role::AllocSvr,
        "RaftService" => role == Role::StoreSvr,
        "AdminService" => role == Role::Admin,
        other => panic!("no rule for {other}"),
    }
}

fn channel(addr: &str, tls: Option<&seqsvr_auth::Tls>) -> Channel {
    seqsvr_auth::endpoint(addr, tls)
        .expect("endpoint")
        .connect_timeout(Duration::from_secs(2))
        .timeout(Duration::from_secs(5))
        .connect_lazy()
}

/// Calls `method` with an empty request; the status code it ends with (`Ok` on success).
async fn probe(store: Channel, alloc: Channel, method: &str) -> Code {
    let mut a = AllocServiceClient::new(alloc);
    let mut s = StoreServiceClient::new(store.clone());
    let mut r = RaftServiceClient::new(store.clone());
    let mut ad = AdminServiceClient::new(store.clone());
    let raft = || pb::RaftPayload::default();
    let result = match method {
        "AllocService/FetchNextSeq" => a.fetch_next_seq(pb::FetchNextSeqRequest::default()).await.map(drop),
        "AllocService/GetCurSeq" => a.get_cur_seq(pb::GetCurSeqRequest::default()).await.map(drop),
        "AllocService/BatchFetchNextSeq" => a
            .batch_fetch_next_seq(pb::BatchFetchNextSeqRequest::default())
            .await
            .map(drop),
        "StoreService/Register" => s.register(pb::RegisterRequest::default()).await.map(drop),
        "StoreService/Renew" => s.renew(pb::RenewRequest::default()).await.map(drop),
        "StoreService/Release" => s.release(pb::ReleaseRequest::default()).await.map(drop),
        "StoreService/Bump" => s.bump(pb::BumpRequest::default()).await.map(drop),
        "StoreService/Load" => s.load(pb::LoadRequest::default()).await.map(drop),
        "StoreService/GetRoutes" => s.get_routes(pb::GetRoutesRequest::default()).await.map(drop),
        "StoreService/Status" => s.status(pb::StatusRequest::default()).await.map(drop),
        "RaftService/AppendEntries" => r.append_entries(raft()).await.map(drop),
        "RaftService/Vote" => r.vote(raft()).await.map(drop),
        "RaftService/InstallSnapshot" => r.install_snapshot(raft()).await.map(drop),
        "AdminService/AddReplica" => ad.add_replica(pb::AddReplicaRequest::default()).await.map(drop),
        "AdminService/RemoveReplica" => ad.remove_replica(pb::RemoveReplicaRequest::default()).await.map(drop),
        "AdminService/GetClusterMap" => ad.get_cluster_map(pb::GetClusterMapRequest::default()).await.map(drop),
        "AdminService/ChangeMap" => ad.change_map(pb::ChangeMapRequest::default()).await.map(drop),
        "AdminService/RangeStep" => ad.range_step(pb::RangeStepRequest::default()).await.map(drop),
        "AdminService/ExportStatus" => ad.export_status(pb::ExportStatusRequest::default()).await.map(drop),
        "AdminService/DrainAllocSvr" => ad.drain_alloc_svr(pb::DrainAllocSvrRequest::default()).await.map(drop),
        "AdminService/PublishMap" => ad.publish_map(pb::PublishMapRequest::default()).await.map(drop),
        "AdminService/GetAudit" => ad.get_audit(pb::GetAuditRequest::default()).await.map(drop),
        "AdminService/Backup" => match ad.backup(pb::BackupRequest::default()).await {
            // The refusal may come as the stream's first item rather than its headers.
            Ok(mut stream) => stream.get_mut().message().await.map(drop),
            Err(e) => Err(e),
        },
        "Health/Check" => {
            let mut h = tonic_health::pb::health_client::HealthClient::new(store);
            h.check(tonic_health::pb::HealthCheckRequest::default()).await.map(drop)
        }
        other => panic!("no probe for {other}"),
    };
    match result {
        Ok(()) => Code::Ok,
        Err(status) => status.code(),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_role_against_every_method_of_a_tls_cluster() {
    let c = Cluster::start_tls();
    c.wait_serving(Duration::from_secs(60)).await;
    // The cluster works over TLS end to end: the client library with a client certificate.
    let client = c.client().await;
    let first = client
        .fetch_next_seq(seqsvr_proto::Uid(7))
        .await
        .expect("fetch over TLS");
    assert!(first.seq > 0);

    let (store, alloc) = (c.store_addrs[&1].clone(), c.alloc_addrs[&1].clone());
    let mut wrong = Vec::new();
    for role in Role::ALL {
        let tls = c.tls(role).expect("TLS on");
        for method in METHODS {
            let code = probe(channel(&store, Some(&tls)), channel(&alloc, Some(&tls)), method).await;
            let ok = if may_call(role, method) {
                !matches!(code, Code::PermissionDenied | Code::Unavailable | Code::Unknown)
            } else {
                code == Code::PermissionDenied
            };
            if !ok {
                wrong.push(format!("{role} → {method}: {code:?}"));
            }
        }
    }
    assert!(wrong.is_empty(), "wrong answers:\n{}", wrong.join("\n"));
    // The refusal names the peer in the server's log.
    let log = c.log(Proc::Store, 1);
    assert!(
        log.lines()
            .any(|l| l.contains("refused") && l.contains("client.seqsvr.local")),
        "no refusal naming the client in storesvr 1's log"
    );
    seqctl_runs_as_its_certificates_role(&c);
}

/// `seqctl` with an `admin` certificate operates the cluster; with a `client` one it fetches but
/// is refused an operator's command, with the reason and exit code 1 (certainly not done).
fn seqctl_runs_as_its_certificates_role(c: &Cluster) {
    let at = e2e::seqctl::Seqctl::new(["--store", &c.store_seeds_flag(), "--alloc", &c.alloc_seeds_flag()]);
    let seqctl_with = |tls: Vec<String>, args: &[&str]| {
        let out = at.with(tls).output_blocking(args);
        let text = format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        (out.status.code(), text)
    };
    let seqctl = |role: Role, args: &[&str]| seqctl_with(c.tls_flags(role), args);
    let (code, out) = seqctl(Role::Admin, &["status"]);
    assert_eq!(code, Some(0), "admin status: {out}");
    let (code, out) = seqctl(Role::Client, &["fetch", "42"]);
    assert_eq!(code, Some(0), "client fetch: {out}");
    let (code, out) = seqctl(Role::Client, &["alloc", "drain", "1"]);
    assert_eq!(code, Some(1), "client drain must be refused: {out}");
    assert!(out.contains("role client may not call"), "{out}");
    // The audit trail names the certificate that asked for an admin action (a drain that is
    // carried out: refusals before anything is proposed leave no record).
    let (_, out) = seqctl(Role::Admin, &["alloc", "drain", "2"]);
    let (code, audit) = seqctl(Role::Admin, &["--json", "audit"]);
    assert_eq!(code, Some(0), "audit: {audit} (after the drain: {out})");
    let trail: serde_json::Value = serde_json::from_str(audit.trim()).expect("audit --json");
    let records = trail["records"].as_array().expect("records");
    let last = records.last().expect("at least the drain's record");
    assert!(last["what"].as_str().unwrap_or("").contains("drain"), "{last}");
    assert_eq!(last["who"], "admin.seqsvr.local", "{last}");
    // An unreadable CA file is a usage error that names the file.
    let mut flags = c.tls_flags(Role::Admin);
    flags[0] = "--tls-ca=/nonexistent/ca.pem".into();
    let (code, out) = seqctl_with(flags, &["status"]);
    assert_eq!(code, Some(2), "{out}");
    assert!(out.contains("/nonexistent/ca.pem"), "{out}");
}

/// A `client` certificate from `ca` with the given validity, as loaded TLS that trusts `trust`.
fn client_tls(ca: &DevCa, trust: &str, days_from: i64, days_to: i64) -> seqsvr_auth::Tls {
    let now = time::OffsetDateTime::now_utc();
    let spec = Spec {
        not_before: now + time::Duration::days(days_from),
        not_after: now + time::Duration::days(days_to),
        ..Spec::new("odd-client", Role::Client, &[], 1)
    };
    let issued = ca.issue(&spec).expect("issue");
    seqsvr_auth::Tls::from_pem(trust.as_bytes(), issued.cert_pem.as_bytes(), issued.key_pem.as_bytes()).expect("load")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn expired_foreign_missing_and_plaintext_clients_are_refused() {
    let c = Cluster::start_tls();
    c.wait_serving(Duration::from_secs(60)).await;
    let ca = c.ca.as_ref().expect("TLS on");
    let alloc = c.alloc_addrs[&1].clone();
    let fetch = |ch: Channel| async move {
        let mut a = AllocServiceClient::new(ch);
        a.fetch_next_seq(pb::FetchNextSeqRequest {
            uid: 7,
            route_version: 0,
        })
        .await
    };
    // Control: a valid certificate of the same CA, made the same way, is served.
    let valid = client_tls(ca, &ca.cert_pem, -1, 1);
    fetch(channel(&alloc, Some(&valid)))
        .await
        .expect("a valid certificate is served");

    let expired = client_tls(ca, &ca.cert_pem, -10, -1);
    let foreign_ca = DevCa::new("someone else's CA", 1).expect("CA");
    let foreign = client_tls(&foreign_ca, &ca.cert_pem, -1, 1);
    let no_cert = {
        let tls = tonic::transport::ClientTlsConfig::new()
            .ca_certificate(tonic::transport::Certificate::from_pem(&ca.cert_pem));
        tonic::transport::Endpoint::from_shared(format!("https://{alloc}"))
            .unwrap()
            .tls_config(tls)
            .unwrap()
            .connect_lazy()
    };
    let plaintext = channel(&alloc, None);
    let cases: Vec<(&str, Channel)> = vec![
        ("expired", channel(&alloc, Some(&expired))),
        ("foreign CA", channel(&alloc, Some(&foreign))),
        ("no certificate", no_cert),
        ("plaintext", plaintext),
    ];
    for (what, ch) in cases {
        let got = fetch(ch).await;
        assert!(got.is_err(), "{what}: served {got:?}");
    }
    // The refused connections did not disturb the server.
    fetch(channel(
        &alloc,
        Some(&Arc::unwrap_or_clone(c.tls(Role::Client).unwrap())),
    ))
    .await
    .expect("still serving");
}
