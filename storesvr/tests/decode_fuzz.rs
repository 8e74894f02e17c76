//! Random bytes through the postcard decoding of the Raft peer wire (`raft/network.rs`: the
//! server decodes requests, the client decodes `Result` replies) and of the log (`log_store.rs`:
//! entries, vote, log ids). Issue "Security and hardening", bullet "Fuzzing".
//!
//! Property: decoding returns `Ok` or `Err`, never panics (nor allocates without bound), and a
//! value that decodes encodes to bytes that decode again to the same encoding. The second half
//! matters because a follower appends what it decoded from the leader to its log and reads it
//! back from there: a value the wire accepts but the log cannot read back would stop the node.
//!
//! Inputs are either plain random bytes or valid encodings with random mutations (flipped,
//! inserted and deleted bytes, a cut), which reach far deeper into the decoders than random
//! bytes alone (most of those fail on the first enum tag). `PROPTEST_CASES` overrides the CI
//! case count.

use openraft::raft::{
    AppendEntriesRequest, AppendEntriesResponse, InstallSnapshotRequest, InstallSnapshotResponse, VoteRequest,
    VoteResponse,
};
use openraft::{BasicNode, EntryPayload, Membership, SnapshotMeta, StoredMembership};
use proptest::prelude::*;
use seqsvr_proto::{Epoch, Incarnation, NodeId as Nid, SectionId};
use serde::Serialize;
use serde::de::DeserializeOwned;
use std::collections::{BTreeMap, BTreeSet};
use storesvr::domain::state::{BumpItem, Command};
use storesvr::raft::types::{Entry, LogId, NodeId, Request, TypeConfig, Vote};

/// Cases per property in CI (docs/FUZZING.md).
const CI_CASES: u32 = 2000;

fn config() -> ProptestConfig {
    let cases = std::env::var("PROPTEST_CASES").ok().and_then(|v| v.parse().ok());
    ProptestConfig::with_cases(cases.unwrap_or(CI_CASES))
}

type RaftError<E = openraft::error::Infallible> = openraft::error::RaftError<NodeId, E>;
type AppendReply = Result<AppendEntriesResponse<NodeId>, RaftError>;
type VoteReply = Result<VoteResponse<NodeId>, RaftError>;
type SnapshotReply = Result<InstallSnapshotResponse<NodeId>, RaftError<openraft::error::InstallSnapshotError>>;

fn log_id(term: u64, index: u64) -> LogId {
    openraft::LogId::new(openraft::CommittedLeaderId::new(term, 1), index)
}

fn entries() -> Vec<Entry> {
    let cmds = vec![
        Command::Bump {
            incarnation: Incarnation(17),
            items: vec![BumpItem {
                section: SectionId(3),
                epoch: Epoch(2),
                new_max: 300,
            }],
        },
        Command::Register {
            node_id: Nid(4),
            addr: "10.0.0.4:7000".into(),
            nonce: 99,
        },
        Command::Drain { node_id: Nid(4) },
    ];
    let nodes = BTreeMap::from([(1, BasicNode::new("a:1")), (2, BasicNode::new("b:2"))]);
    let membership = Membership::new(vec![BTreeSet::from([1, 2])], nodes);
    vec![
        Entry {
            log_id: log_id(2, 7),
            payload: EntryPayload::Blank,
        },
        Entry {
            log_id: log_id(2, 8),
            payload: EntryPayload::Normal(Request { cmds }),
        },
        Entry {
            log_id: log_id(3, 9),
            payload: EntryPayload::Membership(membership),
        },
    ]
}

/// Valid encodings of every type decoded below, to be mutated.
fn seeds() -> Vec<Vec<u8>> {
    let enc = |v: &dyn erased::Encode| v.encode();
    let vote = Vote::new_committed(3, 1);
    let append = AppendEntriesRequest::<TypeConfig> {
        vote,
        prev_log_id: Some(log_id(2, 6)),
        entries: entries(),
        leader_commit: Some(log_id(2, 6)),
    };
    let meta = SnapshotMeta {
        last_log_id: Some(log_id(3, 9)),
        last_membership: StoredMembership::new(Some(log_id(3, 9)), Membership::new(vec![BTreeSet::from([1])], None)),
        snapshot_id: "3-9-1".into(),
    };
    let snapshot = InstallSnapshotRequest::<TypeConfig> {
        vote,
        meta,
        offset: 0,
        data: vec![1, 2, 3],
        done: true,
    };
    let mut out = vec![
        enc(&append),
        enc(&VoteRequest::new(vote, Some(log_id(2, 8)))),
        enc(&snapshot),
        enc(&AppendReply::Ok(AppendEntriesResponse::Success)),
        enc(&VoteReply::Ok(VoteResponse::new(vote, Some(log_id(2, 8)), true))),
        enc(&SnapshotReply::Ok(InstallSnapshotResponse { vote })),
        enc(&vote),
        enc(&Some(log_id(2, 8))),
    ];
    out.extend(entries().iter().map(|e| enc(e)));
    out
}

/// Object-safe encoding, so that `seeds` can list values of different types.
mod erased {
    pub trait Encode {
        fn encode(&self) -> Vec<u8>;
    }
    impl<T: serde::Serialize> Encode for T {
        fn encode(&self) -> Vec<u8> {
            postcard::to_stdvec(self).expect("encoding to a Vec cannot fail")
        }
    }
}

#[derive(Debug, Clone)]
enum Mutation {
    Flip(f64, u8),
    Insert(f64, u8),
    Delete(f64),
    Cut(f64),
}

fn mutate(mut bytes: Vec<u8>, mutations: &[Mutation]) -> Vec<u8> {
    for m in mutations {
        let at = |f: f64, n: usize| ((f * n as f64) as usize).min(n.saturating_sub(1));
        match *m {
            Mutation::Flip(f, x) if !bytes.is_empty() => {
                let i = at(f, bytes.len());
                bytes[i] ^= x;
            }
            Mutation::Insert(f, b) => bytes.insert(at(f, bytes.len() + 1), b),
            Mutation::Delete(f) if !bytes.is_empty() => {
                bytes.remove(at(f, bytes.len()));
            }
            Mutation::Cut(f) => bytes.truncate((f * bytes.len() as f64) as usize),
            _ => {}
        }
    }
    bytes
}

/// Random bytes, or a seed with 1 to 4 mutations.
fn input() -> impl Strategy<Value = Vec<u8>> {
    let mutation = prop_oneof![
        4 => (0.0..1.0f64, 1u8..=255).prop_map(|(f, x)| Mutation::Flip(f, x)),
        2 => (0.0..1.0f64, any::<u8>()).prop_map(|(f, b)| Mutation::Insert(f, b)),
        2 => (0.0..1.0f64).prop_map(Mutation::Delete),
        1 => (0.0..1.0f64).prop_map(Mutation::Cut),
    ];
    let seeds = seeds();
    prop_oneof![
        1 => prop::collection::vec(any::<u8>(), 0..256),
        3 => (0..seeds.len(), prop::collection::vec(mutation, 1..5))
            .prop_map(move |(s, m)| mutate(seeds[s].clone(), &m)),
    ]
}

/// Decodes `bytes` as `T`; what decodes must encode to bytes that decode to the same encoding.
fn decodes_or_errs<T: Serialize + DeserializeOwned>(bytes: &[u8]) -> Result<(), TestCaseError> {
    let Ok(value) = postcard::from_bytes::<T>(bytes) else {
        return Ok(());
    };
    let encoded = postcard::to_stdvec(&value).expect("encoding to a Vec cannot fail");
    let again = postcard::from_bytes::<T>(&encoded).map_err(|e| {
        TestCaseError::fail(format!(
            "{} decoded but its encoding does not: {e}",
            std::any::type_name::<T>()
        ))
    })?;
    prop_assert_eq!(postcard::to_stdvec(&again).unwrap(), encoded);
    Ok(())
}

proptest! {
    #![proptest_config(config())]

    #[test]
    fn random_raft_peer_payloads_decode_or_fail_cleanly(bytes in input()) {
        decodes_or_errs::<AppendEntriesRequest<TypeConfig>>(&bytes)?;
        decodes_or_errs::<VoteRequest<NodeId>>(&bytes)?;
        decodes_or_errs::<InstallSnapshotRequest<TypeConfig>>(&bytes)?;
        decodes_or_errs::<AppendReply>(&bytes)?;
        decodes_or_errs::<VoteReply>(&bytes)?;
        decodes_or_errs::<SnapshotReply>(&bytes)?;
    }

    #[test]
    fn random_log_records_decode_or_fail_cleanly(bytes in input()) {
        decodes_or_errs::<Entry>(&bytes)?;
        decodes_or_errs::<Vote>(&bytes)?;
        decodes_or_errs::<LogId>(&bytes)?;
        decodes_or_errs::<Option<LogId>>(&bytes)?;
    }
}

/// The mutation input is not vacuous: every seed decodes as its own type, so mutations start
/// from bytes that pass the decoders' first checks.
#[test]
fn every_seed_decodes() {
    let seeds = seeds();
    assert!(postcard::from_bytes::<AppendEntriesRequest<TypeConfig>>(&seeds[0]).is_ok());
    assert!(postcard::from_bytes::<VoteRequest<NodeId>>(&seeds[1]).is_ok());
    assert!(postcard::from_bytes::<InstallSnapshotRequest<TypeConfig>>(&seeds[2]).is_ok());
    assert!(postcard::from_bytes::<AppendReply>(&seeds[3]).is_ok());
    assert!(postcard::from_bytes::<VoteReply>(&seeds[4]).is_ok());
    assert!(postcard::from_bytes::<SnapshotReply>(&seeds[5]).is_ok());
    assert!(postcard::from_bytes::<Vote>(&seeds[6]).is_ok());
    assert!(postcard::from_bytes::<Option<LogId>>(&seeds[7]).is_ok());
    assert!(seeds[8..].iter().all(|s| postcard::from_bytes::<Entry>(s).is_ok()));
}
