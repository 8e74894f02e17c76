//! CPU and bytes to encode + decode one AppendEntries carrying 29 bump commands (the entry
//! size `store-bench` sees at c=64), serde_json against postcard: why the peer wire uses postcard.
//! `cargo run --release -p storesvr --example wire_cost`
use openraft::raft::AppendEntriesRequest;
use openraft::{CommittedLeaderId, EntryPayload, LogId, Vote};
use seqsvr_proto::{Epoch, Incarnation, SectionId};
use std::time::Instant;
use storesvr::domain::state::{BumpItem, Command};
use storesvr::raft::types::{Entry, Request, TypeConfig};

fn main() {
    let cmds: Vec<Command> = (0..29)
        .map(|i| Command::Bump {
            incarnation: Incarnation(17),
            items: vec![BumpItem {
                section: SectionId(i),
                epoch: Epoch(3),
                new_max: 1_234_567 + i * 10_000,
            }],
        })
        .collect();
    let entry = Entry {
        log_id: LogId::new(CommittedLeaderId::new(5, 1), 123_456),
        payload: EntryPayload::Normal(Request { cmds }),
    };
    let req: AppendEntriesRequest<TypeConfig> = AppendEntriesRequest {
        vote: Vote::new_committed(5, 1),
        prev_log_id: Some(LogId::new(CommittedLeaderId::new(5, 1), 123_455)),
        leader_commit: Some(LogId::new(CommittedLeaderId::new(5, 1), 123_455)),
        entries: vec![entry],
    };
    type Req = AppendEntriesRequest<TypeConfig>;
    for round in 0..3 {
        let (json, bytes) = per_round_trip(
            || serde_json::to_vec(&req).unwrap(),
            |b| serde_json::from_slice::<Req>(b).unwrap(),
        );
        let (pc, pbytes) = per_round_trip(
            || postcard::to_stdvec(&req).unwrap(),
            |b| postcard::from_bytes::<Req>(b).unwrap(),
        );
        println!("round {round}: json {json:.1} us ({bytes} B), postcard {pc:.1} us ({pbytes} B) per encode+decode");
    }
}

/// Mean µs of one encode + decode over 20,000 rounds, and the encoded size.
fn per_round_trip<T>(encode: impl Fn() -> Vec<u8>, decode: impl Fn(&[u8]) -> T) -> (f64, usize) {
    let n = 20_000;
    let t = Instant::now();
    let mut bytes = 0;
    for _ in 0..n {
        let b = encode();
        bytes = b.len();
        std::hint::black_box(decode(&b));
    }
    (t.elapsed().as_nanos() as f64 / n as f64 / 1000.0, bytes)
}
