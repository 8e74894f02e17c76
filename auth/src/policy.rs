//! The one table of which role may call which gRPC method.
//!
//! | role | may call |
//! |---|---|
//! | `client` | the data plane (`AllocService`), read-only store calls (`GetRoutes`, `Status`, `GetClusterMap`, `ExportStatus`), health, reflection |
//! | `allocsvr` | the read-only calls, the ownership calls `Register`, `Renew`, `Release`, `Bump`, `RaiseMarks`, `Load`, and the data plane (an AllocSvr forwards its front ends' calls to the owner) |
//! | `storesvr` | the read-only calls, and the Raft peer service |
//! | ledgers | `LedgerService`'s data calls as the data plane; `Void` and `Reconcile` for `admin` and the `allocsvr` that forwards an admin's |
//! | `admin` | the data plane, the read-only calls, every `AdminService` change (membership, map, moves, drains) and the audit trail (`GetAudit`) |
//!
//! An operator's `seqctl` carries `admin` and so may also fetch, to check a cluster by hand, and
//! `Load`, which changes nothing but reads every ceiling and owner of a range: a move's dry run
//! (`seqctl move --dry-run`) shows them. A
//! method this table does not know (a typo, a service this port does not serve) is let through to
//! tonic, which answers UNIMPLEMENTED: refusing it would only hide that answer.

use std::fmt;
use std::str::FromStr;

/// What a certificate's holder is for.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Role {
    /// An application calling the data plane.
    Client,
    /// An AllocSvr: owns sections through the store.
    AllocSvr,
    /// A StoreSvr replica: a Raft peer of its set.
    StoreSvr,
    /// An operator: membership, moves, drains.
    Admin,
}

impl Role {
    /// Every role, in the order the docs list them.
    pub const ALL: [Role; 4] = [Role::Client, Role::AllocSvr, Role::StoreSvr, Role::Admin];

    /// The name used in certificates and flags.
    pub fn name(self) -> &'static str {
        match self {
            Role::Client => "client",
            Role::AllocSvr => "allocsvr",
            Role::StoreSvr => "storesvr",
            Role::Admin => "admin",
        }
    }

    /// The URI subject-alternative name that carries this role in a certificate.
    pub fn uri(self) -> String {
        format!("{ROLE_URI_PREFIX}{}", self.name())
    }
}

/// Prefix of the URI SAN that names a certificate's role.
pub const ROLE_URI_PREFIX: &str = "urn:seqsvr:role:";

impl fmt::Display for Role {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for Role {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Role::ALL
            .into_iter()
            .find(|r| r.name() == s)
            .ok_or_else(|| format!("unknown role {s:?} (expected client, allocsvr, storesvr or admin)"))
    }
}

/// What a method does, for the table above.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    /// `AllocService`: fetch and read sequences.
    DataPlane,
    /// Reads that change nothing and reveal no sequence: routes, status, maps, health, reflection.
    ReadOnly,
    /// An AllocSvr's dealings with its set: Register, Renew, Release, Bump, RaiseMarks.
    Ownership,
    /// Load: the ceilings and owners of a range, read linearizably. AllocSvrs (a gained section's
    /// state) and admins (a move's dry run).
    Ceilings,
    /// A ledger's operator calls (void a number, reconcile after a restore): admins, and the
    /// AllocSvr forwarding an admin's call.
    LedgerAdmin,
    /// Raft messages between replicas of one set.
    Peer,
    /// Operator changes: membership, the cluster map, move steps, drains.
    Admin,
    /// Not a method of seqsvr-rs; tonic answers UNIMPLEMENTED.
    Unknown,
}

/// The kind of the gRPC method at `path` (`/package.Service/Method`).
pub fn kind(path: &str) -> Kind {
    let mut parts = path.trim_start_matches('/').splitn(2, '/');
    let (service, method) = (parts.next().unwrap_or(""), parts.next().unwrap_or(""));
    match service {
        "seqsvr.v1.AllocService" => Kind::DataPlane,
        // Served by AllocSvrs (forwarded) and StoreSvrs (decided). An operator's void and
        // reconcile: admins, and the AllocSvr that forwards one (it checked its caller's role).
        "seqsvr.v1.LedgerService" => match method {
            "CreateLedger" | "Reserve" | "Confirm" | "Release" | "Show" | "Gaps" => Kind::DataPlane,
            "Void" | "Reconcile" => Kind::LedgerAdmin,
            _ => Kind::Unknown,
        },
        // Where an AllocSvr's Redis Cluster port is, for its peers: a port, nothing more.
        "seqsvr.v1.FrontInfo" => Kind::ReadOnly,
        "seqsvr.v1.RaftService" => Kind::Peer,
        "seqsvr.v1.StoreService" => match method {
            "GetRoutes" | "Status" => Kind::ReadOnly,
            "Register" | "Renew" | "Release" | "Bump" | "RaiseMarks" => Kind::Ownership,
            "Load" => Kind::Ceilings,
            _ => Kind::Unknown,
        },
        "seqsvr.v1.AdminService" => match method {
            "GetClusterMap" | "ExportStatus" => Kind::ReadOnly,
            // Backup changes nothing, but its file is the whole set's state: admins only.
            "Backup" => Kind::Admin,
            // GetAudit reads, but the trail names people: admins only.
            "AddReplica" | "RemoveReplica" | "ChangeMap" | "RangeStep" | "DrainAllocSvr" | "PublishMap"
            | "GetAudit" => Kind::Admin,
            _ => Kind::Unknown,
        },
        "grpc.health.v1.Health"
        | "grpc.reflection.v1.ServerReflection"
        | "grpc.reflection.v1alpha.ServerReflection" => Kind::ReadOnly,
        _ => Kind::Unknown,
    }
}

/// Whether `role` may call the method at `path`.
pub fn allowed(role: Role, path: &str) -> bool {
    allowed_kind(role, kind(path))
}

/// Whether `role` may call methods of `kind`.
pub fn allowed_kind(role: Role, kind: Kind) -> bool {
    match kind {
        Kind::ReadOnly | Kind::Unknown => true,
        // An AllocSvr forwards the calls its HTTP and Redis front ends cannot answer to the
        // owner; its caller's role was checked there.
        Kind::DataPlane => matches!(role, Role::Client | Role::Admin | Role::AllocSvr),
        Kind::Ownership => role == Role::AllocSvr,
        Kind::Ceilings => matches!(role, Role::AllocSvr | Role::Admin),
        Kind::Peer => role == Role::StoreSvr,
        Kind::Admin => role == Role::Admin,
        Kind::LedgerAdmin => matches!(role, Role::Admin | Role::AllocSvr),
    }
}
