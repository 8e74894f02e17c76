//! Random bytes through the prost decoders of every message the services of `seqsvr.v1` take
//! or return (AllocService, StoreService, AdminService, RaftService). Issue "Security and
//! hardening", bullet "Fuzzing".
//!
//! Property: `Message::decode` returns `Ok` or `Err`, never panics, and a value that decodes
//! survives an encode/decode round trip unchanged (so a server that decodes a request and logs,
//! forwards or stores it re-encoded does not change it on the way).
//!
//! Inputs are plain random bytes or a random protobuf-shaped stream: keys with field numbers
//! 1..=16 and every wire type (including the deprecated groups and the two invalid ones)
//! followed by varints, fixed values, and length-delimited payloads that are random bytes or
//! further nested streams. Random bytes alone rarely get past the first key; the shaped stream
//! fills fields of the right and the wrong type at every depth. `PROPTEST_CASES` overrides the
//! CI case count.

use proptest::prelude::*;
use prost::Message;
use prost::bytes::BufMut;
use prost::encoding::encode_varint;
use seqsvr_proto::pb;

/// Cases per property in CI (docs/FUZZING.md).
const CI_CASES: u32 = 2000;

fn config() -> ProptestConfig {
    let cases = std::env::var("PROPTEST_CASES").ok().and_then(|v| v.parse().ok());
    ProptestConfig::with_cases(cases.unwrap_or(CI_CASES))
}

/// One field of a protobuf-shaped stream.
#[derive(Debug, Clone)]
enum Field {
    Varint(u32, u64),
    Fixed64(u32, u64),
    Fixed32(u32, u32),
    Bytes(u32, Vec<u8>),
    Nested(u32, Vec<Field>),
    /// A key with any wire type (3, 4: groups; 6, 7: invalid) and nothing checked after it.
    RawKey(u32, u8),
}

fn field() -> impl Strategy<Value = Field> {
    // Mostly low numbers: the messages here have at most a handful of fields each.
    let num = || prop_oneof![3 => 1u32..=6, 1 => 1u32..=16];
    let leaf = prop_oneof![
        4 => (num(), prop_oneof![any::<u64>(), 0u64..300]).prop_map(|(n, v)| Field::Varint(n, v)),
        1 => (num(), any::<u64>()).prop_map(|(n, v)| Field::Fixed64(n, v)),
        1 => (num(), any::<u32>()).prop_map(|(n, v)| Field::Fixed32(n, v)),
        3 => (num(), prop::collection::vec(any::<u8>(), 0..24)).prop_map(|(n, v)| Field::Bytes(n, v)),
        1 => (num(), 0u8..8).prop_map(|(n, w)| Field::RawKey(n, w)),
    ];
    leaf.prop_recursive(3, 48, 6, move |inner| {
        (
            prop_oneof![3 => 1u32..=6, 1 => 1u32..=16],
            prop::collection::vec(inner, 0..6),
        )
            .prop_map(|(n, fs)| Field::Nested(n, fs))
    })
}

fn key(buf: &mut Vec<u8>, num: u32, wire: u8) {
    encode_varint(u64::from(num) << 3 | u64::from(wire), buf);
}

fn encode(fields: &[Field], buf: &mut Vec<u8>) {
    for f in fields {
        match f {
            Field::Varint(n, v) => {
                key(buf, *n, 0);
                encode_varint(*v, buf);
            }
            Field::Fixed64(n, v) => {
                key(buf, *n, 1);
                buf.put_u64_le(*v);
            }
            Field::Fixed32(n, v) => {
                key(buf, *n, 5);
                buf.put_u32_le(*v);
            }
            Field::Bytes(n, v) => {
                key(buf, *n, 2);
                encode_varint(v.len() as u64, buf);
                buf.extend_from_slice(v);
            }
            Field::Nested(n, fs) => {
                let mut inner = Vec::new();
                encode(fs, &mut inner);
                key(buf, *n, 2);
                encode_varint(inner.len() as u64, buf);
                buf.extend_from_slice(&inner);
            }
            Field::RawKey(n, w) => key(buf, *n, *w),
        }
    }
}

fn input() -> impl Strategy<Value = Vec<u8>> {
    prop_oneof![
        1 => prop::collection::vec(any::<u8>(), 0..128),
        3 => prop::collection::vec(field(), 0..8).prop_map(|fs| {
            let mut buf = Vec::new();
            encode(&fs, &mut buf);
            buf
        }),
    ]
}

/// Decodes `bytes` as `T`; what decodes must round-trip unchanged. Returns whether it decoded.
fn decodes_or_errs<T: Message + Default + PartialEq>(bytes: &[u8]) -> Result<bool, TestCaseError> {
    let Ok(value) = T::decode(bytes) else { return Ok(false) };
    let again = T::decode(value.encode_to_vec().as_slice()).map_err(|e| {
        TestCaseError::fail(format!(
            "{} decoded but its encoding does not: {e}",
            std::any::type_name::<T>()
        ))
    })?;
    prop_assert!(again == value, "{} changed in a round trip", std::any::type_name::<T>());
    Ok(true)
}

/// Runs `decodes_or_errs` for each listed type; evaluates to how many decoded.
macro_rules! each {
    ($bytes:expr; $($t:ty),+ $(,)?) => {{
        let mut decoded = 0usize;
        $( decoded += usize::from(decodes_or_errs::<$t>($bytes)?); )+
        decoded
    }};
}

proptest! {
    #![proptest_config(config())]

    #[test]
    fn random_alloc_and_raft_messages_decode_or_fail_cleanly(bytes in input()) {
        each!(&bytes;
            pb::FetchNextSeqRequest, pb::FetchNextSeqReply, pb::GetCurSeqRequest, pb::GetCurSeqReply,
            pb::BatchFetchNextSeqRequest, pb::BatchFetchNextSeqReply, pb::RaftPayload,
        );
    }

    #[test]
    fn random_store_messages_decode_or_fail_cleanly(bytes in input()) {
        each!(&bytes;
            pb::RegisterRequest, pb::RegisterReply, pb::RenewRequest, pb::RenewReply,
            pb::ReleaseRequest, pb::ReleaseReply, pb::BumpRequest, pb::BumpReply,
            pb::LoadRequest, pb::LoadReply, pb::GetRoutesRequest, pb::GetRoutesReply,
            pb::StatusRequest, pb::StatusReply,
        );
    }

    #[test]
    fn random_admin_messages_decode_or_fail_cleanly(bytes in input()) {
        each!(&bytes;
            pb::AddReplicaRequest, pb::RemoveReplicaRequest, pb::MembershipReply,
            pb::GetClusterMapRequest, pb::ClusterMapReply, pb::ChangeMapRequest, pb::ChangeMapReply,
            pb::RangeStepRequest, pb::RangeStepReply, pb::ExportStatusRequest, pb::ExportStatusReply,
            pb::DrainAllocSvrRequest, pb::DrainAllocSvrReply, pb::PublishMapRequest, pb::PublishMapReply,
        );
    }
}

/// The shaped input is not vacuous: over a fixed run, a good share of it decodes into messages
/// with a nested message set, and some into route tables with entries (two levels down); a
/// generator whose output never decoded would test nothing.
#[test]
fn shaped_input_decodes_into_nested_messages() {
    use proptest::strategy::ValueTree;
    let mut runner = proptest::test_runner::TestRunner::deterministic();
    let strategy = prop::collection::vec(field(), 1..8);
    let (mut nested, mut deep) = (0, 0);
    for _ in 0..1000 {
        let fields = strategy.new_tree(&mut runner).unwrap().current();
        let mut buf = Vec::new();
        encode(&fields, &mut buf);
        let routes = pb::GetRoutesReply::decode(buf.as_slice()).ok().and_then(|r| r.routes);
        nested += usize::from(routes.is_some());
        deep += usize::from(routes.is_some_and(|t| !t.entries.is_empty()));
    }
    assert!(
        nested > 50 && deep > 0,
        "of 1000 shaped inputs {nested} decoded with routes, {deep} with entries"
    );
}
