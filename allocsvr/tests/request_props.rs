//! The AllocSvr data plane with random requests: FetchNextSeq, GetCurSeq and BatchFetchNextSeq
//! with uids under and over `uid_limit` (0 and `u64::MAX` included), empty, ordinary and
//! oversized batches, repeated uids and any route version, through the real `Service` of a node
//! started in process against the fake store.
//!
//! Each reply is OK with per-uid outcomes or INVALID_ARGUMENT (exactly when the request is
//! malformed), never another error and never a panic; across every call of every case a served
//! uid's seqs strictly increase (P1) and GetCurSeq never reads below a seq already handed out (P5).
//!
//! One node serves all the cases of a run (starting one per case would cost a node start each),
//! so P1 is checked across cases too. Case count: [`CI_CASES`]; `PROPTEST_CASES=N` overrides it
//! (docs/FUZZING.md).
//!
//! Left out: faults (renewal failures, lost bump replies, owner changes): `node.rs` and the
//! simulator cover them.

mod common;

use std::collections::HashMap;
use std::time::Duration;

use common::{FakeStore, client, fetch_ok, start, test_params};
use proptest::prelude::*;
use proptest::test_runner::{Config, TestRunner, contextualize_config};
use seqsvr_proto::limits::MAX_UIDS_PER_BATCH;
use seqsvr_proto::pb;
use seqsvr_proto::pb::alloc_service_client::AllocServiceClient;
use tonic::transport::Channel;

const CI_CASES: u32 = 256;
const SECTIONS: u64 = 10;
const SECTION_SIZE: u64 = 10;
const LIMIT: u64 = SECTIONS * SECTION_SIZE;

#[derive(Clone, Debug)]
enum Call {
    Fetch { uid: u64, route_version: u64 },
    GetCur { uid: u64, route_version: u64 },
    Batch { uids: Vec<u64>, route_version: u64 },
}

/// Mostly a uid the node serves, often one just past the limit, sometimes 0, `u64::MAX` or any.
fn uid() -> impl Strategy<Value = u64> {
    prop_oneof![12 => 0..LIMIT, 2 => LIMIT..LIMIT + 3, 1 => Just(u64::MAX), 1 => any::<u64>()]
}

fn route_version() -> impl Strategy<Value = u64> {
    prop_oneof![Just(0), Just(u64::MAX), any::<u64>()]
}

/// Batches: ordinary (with repeats: uids drawn from a few), empty, or around the size limit.
fn batch() -> impl Strategy<Value = Vec<u64>> {
    let few = prop_oneof![3 => 0..8u64, 1 => uid()];
    prop_oneof![
        8 => prop::collection::vec(few, 1..40),
        1 => Just(Vec::new()),
        1 => prop::collection::vec(0..LIMIT, MAX_UIDS_PER_BATCH - 1..=MAX_UIDS_PER_BATCH + 1),
    ]
}

fn call() -> impl Strategy<Value = Call> {
    prop_oneof![
        (uid(), route_version()).prop_map(|(uid, route_version)| Call::Fetch { uid, route_version }),
        (uid(), route_version()).prop_map(|(uid, route_version)| Call::GetCur { uid, route_version }),
        (batch(), route_version()).prop_map(|(uids, route_version)| Call::Batch { uids, route_version }),
    ]
}

/// What the calls so far handed out: the last seq per uid, and how many were served.
#[derive(Default)]
struct Seen {
    last: HashMap<u64, u64>,
    served: u64,
}

impl Seen {
    /// P1: a served seq is above every seq handed out for the uid before.
    fn served(&mut self, uid: u64, seq: u64) -> Result<(), TestCaseError> {
        if let Some(prev) = self.last.insert(uid, seq) {
            prop_assert!(seq > prev, "P1: uid {} got {} after {}", uid, seq, prev);
        }
        self.served += 1;
        Ok(())
    }
}

/// An error must be INVALID_ARGUMENT with a message, and only for a malformed request.
fn invalid(status: tonic::Status, malformed: bool) -> Result<(), TestCaseError> {
    prop_assert_eq!(status.code(), tonic::Code::InvalidArgument, "{:?}", status);
    prop_assert!(!status.message().is_empty());
    prop_assert!(malformed, "a well-formed request was refused: {:?}", status);
    Ok(())
}

async fn one(c: &mut AllocServiceClient<Channel>, call: Call, seen: &mut Seen) -> Result<(), TestCaseError> {
    match call {
        Call::Fetch { uid, route_version } => {
            match c.fetch_next_seq(pb::FetchNextSeqRequest { uid, route_version }).await {
                Ok(r) if r.get_ref().outcome == pb::Outcome::Ok as i32 => seen.served(uid, r.get_ref().seq)?,
                Ok(_) => prop_assert!(uid < LIMIT, "uid {} past the limit was answered", uid),
                Err(e) => invalid(e, uid >= LIMIT)?,
            }
        }
        Call::GetCur { uid, route_version } => match c.get_cur_seq(pb::GetCurSeqRequest { uid, route_version }).await {
            Ok(r) if r.get_ref().outcome == pb::Outcome::Ok as i32 => {
                let cur = r.get_ref().cur_seq;
                let fetched = seen.last.get(&uid).copied().unwrap_or(0);
                prop_assert!(
                    cur >= fetched,
                    "P5: uid {} reads {} after {} was fetched",
                    uid,
                    cur,
                    fetched
                );
            }
            Ok(_) => prop_assert!(uid < LIMIT),
            Err(e) => invalid(e, uid >= LIMIT)?,
        },
        Call::Batch { uids, route_version } => {
            let malformed = uids.is_empty() || uids.len() > MAX_UIDS_PER_BATCH || uids.iter().any(|u| *u >= LIMIT);
            let req = pb::BatchFetchNextSeqRequest {
                uids: uids.clone(),
                route_version,
            };
            match c.batch_fetch_next_seq(req).await {
                Ok(r) => {
                    let r = r.into_inner();
                    prop_assert!(!malformed, "a malformed batch was answered");
                    prop_assert_eq!((r.outcomes.len(), r.seqs.len()), (uids.len(), uids.len()));
                    for ((uid, outcome), seq) in uids.iter().zip(&r.outcomes).zip(&r.seqs) {
                        if *outcome == pb::Outcome::Ok as i32 {
                            seen.served(*uid, *seq)?;
                        }
                    }
                }
                Err(e) => invalid(e, malformed)?,
            }
        }
    }
    Ok(())
}

/// Random data-plane calls against one node; P1 and P5 across all of them, and most served.
#[test]
fn random_data_plane_requests_answer_cleanly_and_seqs_only_rise() {
    let rt = tokio::runtime::Runtime::new().unwrap();
    let (store, node, c) = rt.block_on(async {
        let store = FakeStore::start(test_params(SECTIONS, SECTION_SIZE, 5), true).await;
        let node = start(1, &store).await;
        let mut c = client(&node).await;
        // Every section served before the cases start, so that OK outcomes dominate.
        for section in 0..SECTIONS {
            fetch_ok(&mut c, section * SECTION_SIZE, Duration::from_secs(5)).await;
        }
        (store, node, c)
    });
    // The runner takes a `Fn`: the shared record of seqs sits behind a RefCell.
    let seen = std::cell::RefCell::new(Seen::default());
    let config = contextualize_config(Config {
        cases: CI_CASES,
        ..Config::default()
    });
    let mut runner = TestRunner::new(config);
    let result = runner.run(&prop::collection::vec(call(), 1..8), |calls| {
        let (mut c, mut seen) = (c.clone(), seen.borrow_mut());
        rt.block_on(async {
            for call in calls {
                one(&mut c, call, &mut seen).await?;
            }
            Ok(())
        })
    });
    rt.block_on(node.shutdown());
    drop(store);
    if let Err(e) = result {
        panic!("{e}");
    }
    assert!(
        seen.borrow().served > 0,
        "no call was ever served: the property checked nothing"
    );
}
