//! The direct forwarding hop: a front end's single take (`next`, `INCR`) for a uid or key another
//! AllocSvr owns, sent to that owner in a small binary frame on a connection kept open between
//! the two ([`wire`]), and answered by the owner from memory by the same code as its own front
//! ends' calls.
//!
//! Why not the gRPC hop for these: a forwarded call over gRPC passes the client library, a batch
//! RPC, `h2`, tonic's codec and the owner's authentication, admission and metrics layers, and
//! costs the two nodes several times what a direct call costs its owner
//! (docs/benchmarks/front-bench.md). The direct hop is only a faster way to the same answer, never
//! the only one: whatever it cannot settle at once goes the long way, through the client library
//! over gRPC, which waits for bumps, follows moves and failovers, and retries — the owner has no
//! section in memory, a bump is due, its map does not let it answer, the connection is not open
//! yet or was lost, or no answer came within the wait. Nothing is answered that the long way
//! would refuse:
//!
//! - the owner serves from memory exactly as a call from its own front end (`Service::take_now`):
//!   under its lease, and only when its cluster map lets its set answer the section;
//! - the forwarding node then checks the answering set against its own map, as the client
//!   library checks every reply, and sends the call the long way when the map says otherwise;
//! - a take the owner served whose answer never arrived (a lost connection, the wait ran out) is
//!   a lost number, as any RPC's lost reply: the call goes the long way and gets a newer one.
//!
//! Where the owner's hop port is: its answer to `FrontInfo` ([`crate::peers`]); an AllocSvr that
//! does not run the hop (or predates it) is forwarded to over gRPC.
//!
//! Deliberately left out: the hop under mutual TLS (with `--tls-*` it does not run, and calls
//! are forwarded over gRPC, which carries the certificate); blocks (`INCRBY`, `count` > 1), reads,
//! batches, ids and ledgers, which keep the gRPC hop (they are not the calls a balancer in front
//! of many AllocSvrs sends most).

pub mod client;
pub mod server;
pub mod wire;

use std::sync::Arc;
use std::time::Duration;

use seqsvr_client::Client;
use seqsvr_frontends::calls::{CallError, ErrorKind, Owner, Taken, Who};
use seqsvr_proto::Uid;

use crate::peers::Peers;
use crate::state::AllocState;
use wire::{Answer, Subject};

/// The forwarding node's side: where each owner's hop port is, and the connections to them.
pub struct Hop {
    shared: Arc<AllocState>,
    client: Client,
    peers: Arc<Peers>,
    links: Arc<client::Links>,
    /// Longest a call waits for the owner's answer before it goes the long way.
    wait: Duration,
    forwarded: metrics::Counter,
    served: metrics::Counter,
    long_way: metrics::Counter,
    no_answer: metrics::Counter,
    refused: metrics::Counter,
    time: metrics::Histogram,
}

fn hop_counter(answer: &'static str) -> metrics::Counter {
    metrics::counter!("allocsvr_front_hop_total", "answer" => answer)
}

impl Hop {
    /// The hop of a node whose front ends route with `client` and wait `deadline` at most a call.
    pub fn new(shared: Arc<AllocState>, client: Client, peers: Arc<Peers>, deadline: Duration) -> Self {
        Self {
            shared,
            client,
            peers,
            links: Arc::default(),
            wait: (deadline / 4).min(Duration::from_secs(1)),
            forwarded: metrics::counter!("allocsvr_front_rpcs_total", "to" => "forwarded"),
            served: hop_counter("served"),
            long_way: hop_counter("long_way"),
            no_answer: hop_counter("no_answer"),
            refused: hop_counter("refused"),
            time: metrics::histogram!("allocsvr_front_forward_seconds"),
        }
    }

    /// One take of `who` at its owner over the hop. `None`: this call goes the long way (the
    /// owner is this node or unknown, has no hop port, or did not settle it; see the module doc).
    pub async fn take(&self, who: Who<'_>) -> Option<Result<Taken, CallError>> {
        let p = self.shared.params();
        let (pos, subject) = match who {
            Who::Uid(uid) if uid < p.uid_limit => (Uid(uid), Subject::Uid(uid)),
            Who::Key(key) if seqsvr_proto::keys::check_key_str(key).is_ok() => {
                // Until the map says how keys are placed, no owner can be named for one.
                let placement = self.shared.key_placement()?;
                (placement.position(key, p.uid_limit), Subject::Key(key.as_bytes()))
            }
            // Bad input: the long way says what is wrong with it.
            _ => return None,
        };
        // The owner's hop port, looked up under the routes (no copy of its address per call).
        let me = self.shared.advertise();
        let hop_addr = self.client.with_routes(|routes| {
            let (addr, inc) = crate::cluster::owner_of(routes, pos, p.section_size)?;
            (addr != me).then(|| self.peers.ports(addr, inc).hop)?
        })?;
        self.forwarded.increment(1);
        let started = std::time::Instant::now();
        let answer = self.links.take(&hop_addr, subject, self.wait).await;
        self.time.record(started.elapsed().as_secs_f64());
        match answer {
            Some(Answer::Served { value, owner }) => {
                let section = pos.section(p.section_size);
                let allowed = self
                    .client
                    .with_routes(|r| r.map().is_none_or(|m| m.may_answer(section, owner.set_id)));
                if !allowed {
                    self.refused.increment(1);
                    return None;
                }
                self.served.increment(1);
                Some(Ok(Taken {
                    value,
                    owner: Some(Owner::from(&owner)),
                }))
            }
            Some(Answer::BadInput(m)) => {
                self.served.increment(1);
                Some(Err(CallError::bad_input(m)))
            }
            Some(Answer::Exhausted(m)) => {
                self.served.increment(1);
                Some(Err(CallError::new(ErrorKind::Exhausted, m)))
            }
            Some(Answer::LongWay) => {
                self.long_way.increment(1);
                None
            }
            None => {
                self.no_answer.increment(1);
                None
            }
        }
    }
}
