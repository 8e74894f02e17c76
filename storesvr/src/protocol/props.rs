//! Every StoreService / AdminService request that builds a command, with random field values,
//! through its sans-IO handler, the state machine and its reply function: each call answers a
//! reply or a clear client error (INVALID_ARGUMENT or FAILED_PRECONDITION with a message), never
//! INTERNAL (a result the handler did not expect) and never a panic; every command a handler lets
//! through keeps the state machine's invariants (`domain::state_props::check_step`).
//!
//! Field values: integers mostly small (sections of the ten-section test set and just past it),
//! often 0 and `u64::MAX`, sometimes any; strings any, or well-formed addresses; vectors empty to
//! a few hundred items (the size limits themselves are tested at their edges below, once: a
//! random vector of 2^16 items per case would cost seconds for nothing).
//!
//! Case counts: [`CI_CASES`]; `PROPTEST_CASES=N` overrides it (docs/FUZZING.md).
//!
//! Left out: the reads that take a leader's clocks (Renew, ExportStatus) and the network (the
//! gRPC layer only moves these values; `grpc` tests cover it).

use std::time::{Duration, Instant};

use proptest::prelude::*;
use seqsvr_proto::{SectionId, pb};

use super::moves::{
    drain_command, drained, map_changed, map_command, publish_command, published, range_command, stepped,
};
use super::*;
use crate::domain::liveness::Liveness;
use crate::domain::state::{Move, NOBODY};
use crate::domain::state_props::check_step;
use crate::domain::testing::{set_with, small_params};

const CI_CASES: u32 = 256;

/// 0, `u64::MAX`, small values around the ten sections, or anything.
fn num() -> impl Strategy<Value = u64> {
    prop_oneof![1 => Just(0), 1 => Just(u64::MAX), 4 => 0..14u64, 2 => any::<u64>()]
}

/// Any string, or a well-formed `host:port`.
fn text() -> impl Strategy<Value = String> {
    prop_oneof![".{0,40}", "[a-z]{1,8}:[0-9]{1,5}", Just(String::new())]
}

fn section_range() -> impl Strategy<Value = pb::SectionRange> {
    (num(), num()).prop_map(|(begin, end)| pb::SectionRange { begin, end })
}

fn released_range() -> impl Strategy<Value = pb::ReleasedRange> {
    (num(), num(), num(), any::<bool>()).prop_map(|(begin, end, epoch, waited)| pb::ReleasedRange {
        begin,
        end,
        epoch,
        waited,
    })
}

/// Set 0 of ten sections, nodes 1 and 2 registered, every section owned by node 1's incarnation.
fn serving() -> SetState {
    let (mut st, incs) = set_with(&[1, 2]);
    let moves = vec![Move {
        begin: SectionId(0),
        end: SectionId(10),
        from: NOBODY,
        to: incs[0],
    }];
    st.apply(&Command::Assign { expire: vec![], moves }, false);
    st
}

/// A client error: INVALID_ARGUMENT or FAILED_PRECONDITION, with a message.
fn client_error(e: RpcError) -> Result<(), TestCaseError> {
    let status = tonic::Status::from(e);
    prop_assert!(
        matches!(
            status.code(),
            tonic::Code::InvalidArgument | tonic::Code::FailedPrecondition | tonic::Code::Unauthenticated
        ),
        "{:?}",
        status
    );
    prop_assert!(!status.message().is_empty(), "{:?}", status);
    Ok(())
}

/// Applies `cmd` to `st` checking the state machine's invariants; its result.
fn apply_checked(st: &mut SetState, cmd: &Command) -> Result<CommandResult, TestCaseError> {
    let before = st.clone();
    let result = st.apply(cmd, false);
    check_step(&before, st, cmd, &result).map_err(TestCaseError::fail)?;
    Ok(result)
}

/// The whole path of a write: the handler's check, the command applied, the reply.
fn write<T>(
    st: &mut SetState,
    command: Result<Command, RpcError>,
    reply: impl FnOnce(&SetState, CommandResult) -> Result<T, RpcError>,
) -> Result<(), TestCaseError> {
    let cmd = match command {
        Ok(cmd) => cmd,
        Err(e) => return client_error(e),
    };
    let result = apply_checked(st, &cmd)?;
    match reply(st, result) {
        Ok(_) => Ok(()),
        Err(e) => client_error(e),
    }
}

/// One request of any kind that the store's handlers turn into a command.
#[derive(Clone, Debug)]
enum Request {
    Register(pb::RegisterRequest),
    Release(pb::ReleaseRequest),
    Bump(pb::BumpRequest),
    Load(pb::LoadRequest),
    RangeStep(pb::RangeStepRequest),
    ChangeMap(pb::ChangeMapRequest),
    PublishMap(pb::PublishMapRequest),
    Drain(u64),
}

fn phase() -> impl Strategy<Value = i32> {
    prop_oneof![4 => 0..10i32, 1 => any::<i32>()]
}

fn ceilings() -> impl Strategy<Value = Vec<u64>> {
    prop::collection::vec(num(), 0..12)
}

fn change_map() -> impl Strategy<Value = pb::ChangeMapRequest> {
    use pb::change_map_request::Change;
    let change = prop_oneof![
        (num(), num(), prop::collection::vec(text(), 0..4)).prop_map(
            |(expect_version, set_id, stores)| Change::AddSet(pb::AddSet {
                expect_version,
                set_id,
                stores
            })
        ),
        (num(), num(), num(), num(), prop::option::of(section_range()), num()).prop_map(
            |(expect_version, op, from_set, to_set, sections, driver)| Change::BeginMove(pb::BeginMove {
                expect_version,
                op,
                from_set,
                to_set,
                sections,
                driver
            })
        ),
        (num(), num()).prop_map(|(op, driver)| Change::ClaimMove(pb::ClaimMove { op, driver })),
        (num(), num(), phase(), ceilings()).prop_map(|(op, driver, phase, ceilings)| Change::AdvanceMove(
            pb::AdvanceMove {
                op,
                driver,
                phase,
                ceilings
            }
        )),
    ];
    prop::option::of(change).prop_map(|change| pb::ChangeMapRequest { change })
}

/// A map to publish: mostly of this cluster (section size 10, uid limit 100), any version.
fn published_map() -> impl Strategy<Value = pb::ClusterMap> {
    let set = (
        num(),
        prop::collection::vec(text(), 0..3),
        prop::collection::vec(text(), 0..3),
    )
        .prop_map(|(set_id, stores, allocsvrs)| pb::SetInfo {
            set_id,
            stores,
            allocsvrs,
        });
    let shape = prop_oneof![4 => Just((10, 100)), 1 => (num(), num())];
    (num(), prop::collection::vec(set, 0..4), shape).prop_map(|(version, sets, (section_size, uid_limit))| {
        pb::ClusterMap {
            version,
            sets,
            section_size,
            uid_limit,
            ..Default::default()
        }
    })
}

/// A registration's secret: none (an older AllocSvr), one of two that registrations share (so that
/// later calls sometimes carry the right one), or any bytes (too short, too long, wrong).
fn secret() -> impl Strategy<Value = Vec<u8>> {
    prop_oneof![
        Just(Vec::new()),
        Just(b"the first secret".to_vec()),
        Just(b"the other secret".to_vec()),
        prop::collection::vec(any::<u8>(), 0..80),
    ]
}

fn request() -> impl Strategy<Value = Request> {
    let bump_item = (num(), num(), num()).prop_map(|(section, epoch, new_max)| pb::BumpItem {
        section,
        epoch,
        new_max,
    });
    prop_oneof![
        (num(), text(), num(), secret()).prop_map(|(node_id, addr, nonce, secret)| Request::Register(
            pb::RegisterRequest {
                node_id,
                addr,
                nonce,
                secret,
            }
        )),
        (
            num(),
            any::<bool>(),
            prop::collection::vec(released_range(), 0..6),
            secret()
        )
            .prop_map(|(incarnation, leaving, sections, secret)| {
                Request::Release(pb::ReleaseRequest {
                    incarnation,
                    leaving,
                    sections,
                    secret,
                })
            }),
        (num(), prop::collection::vec(bump_item, 0..300), secret()).prop_map(|(incarnation, items, secret)| {
            Request::Bump(pb::BumpRequest {
                incarnation,
                items,
                secret,
            })
        }),
        prop::collection::vec(section_range(), 0..6).prop_map(|sections| Request::Load(pb::LoadRequest { sections })),
        (
            num(),
            phase(),
            prop::option::of(section_range()),
            num(),
            ceilings(),
            num(),
            // 0: the set's own section size and uid limit (filled in when the step is sent).
            prop_oneof![3 => Just(0), 1 => num()],
        )
            .prop_map(|(op, step, sections, other_set, ceilings, map_version, section_size)| {
                Request::RangeStep(pb::RangeStepRequest {
                    op,
                    step,
                    sections,
                    other_set,
                    ceilings,
                    map_version,
                    section_size,
                    uid_limit: section_size,
                    ledgers: Vec::new(),
                })
            }),
        change_map().prop_map(Request::ChangeMap),
        (prop::option::of(published_map()), prop::option::of(0..3u64))
            .prop_map(|(map, for_set)| Request::PublishMap(pb::PublishMapRequest { map, for_set })),
        num().prop_map(Request::Drain),
    ]
}

/// Handles `req` the way the gRPC layer does, minus Raft and the network.
fn handle(st: &mut SetState, req: Request) -> Result<(), TestCaseError> {
    let p = small_params();
    match req {
        Request::Register(r) => write(st, register_command(&r), |_, res| match res {
            CommandResult::Registered { .. } => Ok(()),
            other => Err(unexpected(other)),
        }),
        Request::Release(r) => {
            let cmd = release_command(st, &r, false);
            write(st, cmd, |_, res| released(&r, res))
        }
        Request::Bump(r) => {
            let cmd = bump_command(st, &r, false, false);
            write(st, cmd, |_, res| bumped(&r, res))
        }
        Request::Load(r) => match load_ranges(&p, &r).and_then(|spans| load_reply(st, &p, &spans)) {
            Ok(reply) => {
                prop_assert!(reply.sections.len() as u64 <= MAX_LOAD_SECTIONS);
                Ok(())
            }
            Err(e) => client_error(e),
        },
        Request::RangeStep(mut r) => {
            if r.section_size == 0 {
                (r.section_size, r.uid_limit) = (p.section_size, p.uid_limit);
            }
            write(st, range_command(&p, r), |_, res| stepped(res))
        }
        Request::ChangeMap(r) => write(st, map_command(&p, r), |_, res| map_changed(res)),
        Request::PublishMap(r) => write(st, publish_command(&p, r), |_, res| published(res)),
        Request::Drain(node) => {
            // Both incarnations renew, so a drain of either passes the "someone else takes over"
            // check; an unknown node is answered FAILED_PRECONDITION by `drained`.
            let now = Instant::now();
            let mut live = Liveness::default();
            live.become_leader(now);
            for inc in st.allocsvrs.keys() {
                live.record(*inc, now);
            }
            let cmd = drain_command(st, &live, now, Duration::from_secs(2), node);
            write(st, cmd, |st, res| drained(st, node, res))
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: CI_CASES, ..ProptestConfig::default() })]

    /// Random requests of every kind, one after another on one set: each answers a reply or a
    /// client error, never INTERNAL or a panic, and what they write keeps every invariant.
    #[test]
    fn every_store_request_with_random_fields_answers_or_fails_cleanly(
        reqs in prop::collection::vec(request(), 1..20)
    ) {
        let mut st = serving();
        for req in reqs {
            handle(&mut st, req)?;
        }
    }
}

/// The size limits at their edges, once (random vectors of 2^16 items would be slow).
#[test]
fn requests_at_and_past_the_size_limits_answer_cleanly() {
    let mut st = serving();
    let inc = *st.allocsvrs.keys().next().unwrap();
    let items = |n: usize| {
        (0..n)
            .map(|i| pb::BumpItem {
                section: i as u64 % 10,
                epoch: 1,
                new_max: 1,
            })
            .collect::<Vec<_>>()
    };
    for n in [0, MAX_BUMP_ITEMS, MAX_BUMP_ITEMS + 1] {
        let r = pb::BumpRequest {
            secret: Vec::new(),
            incarnation: inc.0,
            items: items(n),
        };
        let cmd = bump_command(&st, &r, false, false);
        let outcome = write(&mut st, cmd, |_, res| bumped(&r, res));
        assert!(outcome.is_ok(), "{n} items: {outcome:?}");
    }
    let whole = pb::SectionRange { begin: 0, end: 10 };
    let load = pb::LoadRequest {
        sections: vec![whole; (MAX_LOAD_SECTIONS / 10 + 1) as usize],
    };
    let e = load_ranges(&small_params(), &load).expect_err("more than MAX_LOAD_SECTIONS sections");
    assert!(matches!(e, RpcError::InvalidArgument(_)), "{e:?}");
}
