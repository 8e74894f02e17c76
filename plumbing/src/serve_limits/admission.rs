//! Who gets a slot of the in-flight limit, in what order, and who waits: the bookkeeping behind
//! [`super::ShedLayer`], apart from tower and HTTP so that it can be tested on its own.
//!
//! A call is **admitted** while fewer than `limit` calls are in flight, or over the limit when its
//! connection is light (fewer than `reserve` in flight and nothing waiting; up to twice the
//! limit). Otherwise it is **parked**: it waits, costing no CPU, until a slot is handed to it.
//! Slots are handed **round-robin over connections**: each connection has its own FIFO of waiting
//! calls, and a ring holds the connections that have any, so a call waits behind at most one grant
//! per other connection, never behind another connection's whole backlog. A call is **refused**
//! (the caller sheds it as overloaded) when `max_parked` calls already wait, or when it has waited
//! `max_wait` without a slot.
//!
//! Why parking rather than refusing at once: a refused call is answered in microseconds and a
//! client that does not back off sends it again at once, so refusals alone keep the server busy
//! with a churn of calls it will not serve. A parked call holds one of its connection's HTTP/2
//! streams (the stream limit is per connection), so a connection whose streams are all parked or
//! in flight cannot send more: the flood slows to the rate the server completes calls.
//!
//! A slot is given back when its [`Slot`] is dropped (the call ended, or its future was dropped at a
//! deadline or a reset stream); a waiting call whose future is dropped leaves its queue
//! ([`Ticket`]'s `Drop`), so no slot is ever handed to a caller that has gone.
//!
//! **No lock while there is room.** A call that finds nobody waiting and a slot free takes it with
//! one atomic addition, and gives it back with one subtraction; only when calls wait are the
//! queues, behind one lock, involved. Every call of a busy server used to take that lock twice, and
//! at 64 callers on two cores the AllocSvr's p99 paid for it (docs/journal/benchmarks-2026-11.md, "p99 at 64
//! callers"). The calls each connection has in flight, which the reserve needs, are counted in a
//! fixed table of atomic counters indexed by a hash of the connection: two connections that share
//! a counter each look as busy as both together, so a collision can only deny a reserve, never
//! grant one beyond the rule.
//!
//! Left out: priorities or weights between connections (every connection with waiting calls gets
//! the same turn), and any order between the calls of one connection other than arrival.

use std::collections::{HashMap, VecDeque};
use std::hash::BuildHasher;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use tokio::sync::oneshot;

/// A connection, told apart by its peer address (`None`: no address known; all such share one).
pub(crate) type Connection = Option<SocketAddr>;

/// The queues of connections with calls waiting (plus at most [`IDLE_KEPT`] idle ones), keyed by
/// peer address with a fast seeded hash rather than SipHash (a profile of `NextIds` showed it on
/// this path when every call looked its connection up).
type Connections = HashMap<Connection, PerConnection, foldhash::fast::RandomState>;

/// Counters of calls in flight by connection hash: enough that the connections of a busy server
/// rarely share one (a shared counter only makes both look busier).
const CONNECTION_COUNTERS: usize = 4_096;

/// A value on cache lines of its own: the in-flight count changes on every call, from every
/// worker, and should not drag the waiting count (read on every call) along with it.
#[repr(align(128))]
#[derive(Default)]
struct Padded(AtomicUsize);

/// Idle connections' entries kept rather than dropped at once: a connection with one call at a
/// time would otherwise remove and re-insert its entry on every call.
const IDLE_KEPT: usize = 64;

/// The bounds of one server's admission (see the module doc for what each does).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Bounds {
    /// Calls in flight at once, all connections, before calls wait.
    pub limit: usize,
    /// Calls a connection may have in flight and still be admitted over `limit` (up to twice it).
    pub reserve: usize,
    /// Calls that may wait at once, all connections; more are refused at once (0: never wait).
    pub max_parked: usize,
    /// Longest a call waits for a slot before it is refused.
    pub max_wait: Duration,
}

/// What [`Admission::enter`] decided for one call.
pub(crate) enum Entry {
    Admitted(Slot),
    Parked(Ticket),
    Refused,
}

/// The shared state of one server's admission.
///
/// Ordering: `in_flight` and `parked` are changed and read with `SeqCst`, so that a call that
/// parks (counts itself in `parked`, then reads `in_flight`) and a call that gives a slot back
/// (lowers `in_flight`, then reads `parked`) cannot both miss each other: one of them sees the
/// other and hands the slot over under the lock.
pub(crate) struct Admission {
    bounds: Bounds,
    /// Calls holding a slot, all connections.
    in_flight: Padded,
    /// Calls waiting; changed only under the lock.
    parked: Padded,
    /// Calls holding a slot, by [`Admission::counter`] of their connection.
    by_connection: Box<[AtomicUsize]>,
    hasher: foldhash::fast::RandomState,
    state: Mutex<State>,
}

#[derive(Default)]
struct State {
    next_ticket: u64,
    /// Connections with a call waiting or a turn in `ring`, and up to [`IDLE_KEPT`] idle ones (an
    /// idle entry is the default one); the rest have no entry.
    connections: Connections,
    /// Connections in the order they get their next grant. A connection is in it at most once
    /// (`in_ring`); one whose waiting calls all left is skipped when its turn comes.
    ring: VecDeque<Connection>,
}

#[derive(Default)]
struct PerConnection {
    waiting: VecDeque<Waiter>,
    in_ring: bool,
}

struct Waiter {
    ticket: u64,
    grant: oneshot::Sender<()>,
}

impl PerConnection {
    fn is_idle(&self) -> bool {
        self.waiting.is_empty() && !self.in_ring
    }
}

/// Drops the entry of `connection` if nothing refers to it any more and more than [`IDLE_KEPT`]
/// entries are held: an idle entry is the default one that `entry` would make, so keeping it
/// changes no decision, and the map stays bounded (at most `IDLE_KEPT` idle entries beside the
/// busy ones, since past that every connection going idle is dropped).
fn tidy(connections: &mut Connections, connection: Connection) {
    if connections.len() > IDLE_KEPT && connections.get(&connection).is_some_and(PerConnection::is_idle) {
        connections.remove(&connection);
    }
}

impl Admission {
    pub(crate) fn new(bounds: Bounds) -> Self {
        Self {
            bounds,
            in_flight: Padded::default(),
            parked: Padded::default(),
            by_connection: (0..CONNECTION_COUNTERS).map(|_| AtomicUsize::new(0)).collect(),
            hasher: foldhash::fast::RandomState::default(),
            state: Mutex::new(State::default()),
        }
    }

    pub(crate) fn bounds(&self) -> &Bounds {
        &self.bounds
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        // Queues and ring, each update finished before the lock is let go (the counts are atomics
        // outside it): a panic elsewhere cannot leave them half-updated.
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Calls holding a slot now.
    pub(crate) fn in_flight(&self) -> usize {
        self.in_flight.0.load(Ordering::SeqCst)
    }

    /// Calls waiting for a slot now.
    pub(crate) fn parked(&self) -> usize {
        self.parked.0.load(Ordering::SeqCst)
    }

    /// Connections with calls waiting or a turn in the ring (tests).
    #[cfg(test)]
    pub(crate) fn connections(&self) -> usize {
        self.lock().connections.values().filter(|c| !c.is_idle()).count()
    }

    /// Entries in the connection map, idle ones included (tests).
    #[cfg(test)]
    pub(crate) fn entries(&self) -> usize {
        self.lock().connections.len()
    }

    /// The in-flight counter `connection` counts in.
    fn counter(&self, connection: Connection) -> usize {
        (self.hasher.hash_one(connection) as usize) % CONNECTION_COUNTERS
    }

    /// A slot just counted in `in_flight`, now also under its connection's `counter`.
    fn take(self: &Arc<Self>, counter: usize) -> Slot {
        self.by_connection[counter].fetch_add(1, Ordering::Relaxed);
        Slot {
            admission: self.clone(),
            counter,
        }
    }

    /// Decides for a new call from `connection`: admitted, parked or refused.
    pub(crate) fn enter(self: &Arc<Self>, connection: Connection) -> Entry {
        let counter = self.counter(connection);
        // Nobody waiting and a slot free: take it without the lock. Over the limit, the addition
        // is taken back (handing the slot on if someone parked meanwhile) and the call is decided
        // under the lock.
        if self.parked() == 0 {
            if self.in_flight.0.fetch_add(1, Ordering::SeqCst) < self.bounds.limit {
                return Entry::Admitted(self.take(counter));
            }
            self.give_back();
        }
        let b = self.bounds;
        let mut guard = self.lock();
        let st = &mut *guard;
        let waiting_here = st.connections.get(&connection).is_some_and(|c| !c.waiting.is_empty());
        let light = self.by_connection[counter].load(Ordering::Relaxed) < b.reserve && !waiting_here;
        // A free slot goes to a waiting call first; a light connection's call takes the reserve.
        if (self.parked() == 0 && self.try_slot(b.limit)) || (light && self.try_slot(2 * b.limit)) {
            return Entry::Admitted(self.take(counter));
        }
        if self.parked() >= b.max_parked {
            tidy(&mut st.connections, connection);
            return Entry::Refused;
        }
        let ticket = st.next_ticket;
        st.next_ticket += 1;
        let (grant, granted) = oneshot::channel();
        let conn = st.connections.entry(connection).or_default();
        conn.waiting.push_back(Waiter { ticket, grant });
        if !conn.in_ring {
            conn.in_ring = true;
            st.ring.push_back(connection);
        }
        self.parked.0.fetch_add(1, Ordering::SeqCst);
        // A slot given back since `in_flight` was read, by a call that saw nobody parked, is
        // handed on here (to the first in turn, which may be this call).
        self.grant_while_room(st);
        Entry::Parked(Ticket {
            admission: self.clone(),
            connection,
            ticket,
            granted,
            settled: false,
        })
    }

    /// Counts one more call in flight if fewer than `bound` are: one atomic addition, taken back
    /// when it went over. The check and the addition are one step, as the lock-free path's are,
    /// so that two deciders never both take the last slot.
    fn try_slot(&self, bound: usize) -> bool {
        if self.in_flight.0.fetch_add(1, Ordering::SeqCst) < bound {
            return true;
        }
        self.in_flight.0.fetch_sub(1, Ordering::SeqCst);
        false
    }

    /// Gives back the slot of a call counted under `counter`.
    fn release(&self, counter: usize) {
        self.by_connection[counter].fetch_sub(1, Ordering::Relaxed);
        self.give_back();
    }

    /// Lowers the in-flight count by one and, if calls wait, hands slots on.
    fn give_back(&self) {
        self.in_flight.0.fetch_sub(1, Ordering::SeqCst);
        if self.parked() > 0 {
            let mut st = self.lock();
            self.grant_while_room(&mut st);
        }
    }

    /// Under the lock: grants slots in turn while there is room and someone waits. A slot taken
    /// here and found no taker is given back; a call of the lock-free path that found the count
    /// raised by it meanwhile gives its own addition back through [`Self::give_back`], which
    /// looks for waiting calls again once this lock is free.
    fn grant_while_room(&self, st: &mut State) {
        while self.parked() > 0 && self.try_slot(self.bounds.limit) {
            if !self.grant_next(st) {
                self.in_flight.0.fetch_sub(1, Ordering::SeqCst);
                break;
            }
        }
    }

    /// Removes a waiting call that is leaving (gave up, or waited too long); false if it was
    /// granted a slot in the meantime (the caller then holds it).
    fn withdraw(&self, connection: Connection, ticket: u64) -> bool {
        let mut guard = self.lock();
        let st = &mut *guard;
        let Some(conn) = st.connections.get_mut(&connection) else {
            return false;
        };
        let Some(i) = conn.waiting.iter().position(|w| w.ticket == ticket) else {
            return false;
        };
        conn.waiting.remove(i);
        self.parked.0.fetch_sub(1, Ordering::SeqCst);
        tidy(&mut st.connections, connection);
        if self.parked() == 0 {
            // Nobody waits: the connections still in the ring have no turn to take.
            for stale in std::mem::take(&mut st.ring) {
                if let Some(conn) = st.connections.get_mut(&stale) {
                    conn.in_ring = false;
                }
                tidy(&mut st.connections, stale);
            }
        }
        true
    }

    /// Hands one slot, already counted in `in_flight`, to the first waiting call of the next
    /// connection in the ring; false if none waits.
    fn grant_next(&self, st: &mut State) -> bool {
        while let Some(next) = st.ring.pop_front() {
            let Some(conn) = st.connections.get_mut(&next) else {
                continue;
            };
            conn.in_ring = false;
            let Some(waiter) = conn.waiting.pop_front() else {
                tidy(&mut st.connections, next);
                continue;
            };
            if !conn.waiting.is_empty() {
                conn.in_ring = true;
                st.ring.push_back(next);
            }
            self.by_connection[self.counter(next)].fetch_add(1, Ordering::Relaxed);
            self.parked.0.fetch_sub(1, Ordering::SeqCst);
            tidy(&mut st.connections, next);
            // A receiver already gone belongs to a Ticket being dropped: its `withdraw` finds
            // the call granted and gives the slot back.
            let _ = waiter.grant.send(());
            return true;
        }
        false
    }
}

/// A slot of the in-flight limit, given back when dropped.
pub(crate) struct Slot {
    admission: Arc<Admission>,
    /// The in-flight counter of the call's connection.
    counter: usize,
}

impl Drop for Slot {
    fn drop(&mut self) {
        self.admission.release(self.counter);
    }
}

/// A parked call's place in its connection's queue. Dropped before it settles (the caller gave
/// up), it leaves the queue, or gives back the slot that was handed to it in the meantime.
pub(crate) struct Ticket {
    admission: Arc<Admission>,
    connection: Connection,
    ticket: u64,
    granted: oneshot::Receiver<()>,
    settled: bool,
}

impl Ticket {
    /// Waits for a slot, at most `max_wait`; `None`: the call is to be refused.
    pub(crate) async fn wait(mut self) -> Option<Slot> {
        let max_wait = self.admission.bounds.max_wait;
        let granted = tokio::time::timeout(max_wait, &mut self.granted).await;
        self.settled = true;
        // A slot may be handed over just as the wait runs out: `withdraw` tells.
        if matches!(granted, Ok(Ok(()))) || !self.admission.withdraw(self.connection, self.ticket) {
            // The grant counted the slot under this connection's counter already.
            return Some(Slot {
                admission: self.admission.clone(),
                counter: self.admission.counter(self.connection),
            });
        }
        None
    }
}

impl Drop for Ticket {
    fn drop(&mut self) {
        if !self.settled && !self.admission.withdraw(self.connection, self.ticket) {
            self.admission.release(self.admission.counter(self.connection));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const HOUR: Duration = Duration::from_secs(3_600);

    fn admission(limit: usize, reserve: usize, max_parked: usize, max_wait: Duration) -> Arc<Admission> {
        Arc::new(Admission::new(Bounds {
            limit,
            reserve,
            max_parked,
            max_wait,
        }))
    }

    fn conn(port: u16) -> Connection {
        Some(SocketAddr::from(([127, 0, 0, 1], port)))
    }

    fn admitted(e: Entry) -> Slot {
        match e {
            Entry::Admitted(slot) => slot,
            Entry::Parked(_) => panic!("parked, expected admitted"),
            Entry::Refused => panic!("refused, expected admitted"),
        }
    }

    fn parked(e: Entry) -> Ticket {
        match e {
            Entry::Parked(ticket) => ticket,
            Entry::Admitted(_) => panic!("admitted, expected parked"),
            Entry::Refused => panic!("refused, expected parked"),
        }
    }

    #[test]
    fn calls_under_the_limit_make_no_entry_and_idle_entries_stay_bounded() {
        let a = admission(1, 0, 1_000, HOUR);
        // Under the limit nothing but the counts is touched.
        for port in 1..100 {
            drop(admitted(a.enter(conn(port))));
        }
        assert_eq!((a.in_flight(), a.entries()), (0, 0));
        // Many connections wait once each, then all are served: no more than IDLE_KEPT entries
        // remain.
        let held = admitted(a.enter(conn(1)));
        let waiting: Vec<Ticket> = (2..(2 + 3 * IDLE_KEPT as u16))
            .map(|p| parked(a.enter(conn(p))))
            .collect();
        assert_eq!(a.connections(), 3 * IDLE_KEPT);
        drop(held);
        drop(waiting);
        assert_eq!(a.connections(), 0);
        assert!(
            a.entries() <= IDLE_KEPT,
            "past the bound, each connection going idle is dropped: {}",
            a.entries()
        );
        assert!(is_clean(&a));
    }

    /// Threads that enter and leave at once, over a small limit: the count never passes the limit
    /// (no reserve), nothing is lost or left waiting, and every call is served in the end.
    #[test]
    fn concurrent_calls_never_pass_the_limit_and_none_is_stranded() {
        let limit = 3;
        let a = admission(limit, 0, 1_000_000, HOUR);
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(4)
            .enable_all()
            .build()
            .unwrap();
        let (held, peak, parks) = (
            Arc::new(AtomicUsize::new(0)),
            Arc::new(AtomicUsize::new(0)),
            Arc::new(AtomicUsize::new(0)),
        );
        runtime.block_on(async {
            let tasks: Vec<_> = (0..8u16)
                .map(|t| {
                    let (a, held, peak, parks) = (a.clone(), held.clone(), peak.clone(), parks.clone());
                    tokio::spawn(async move {
                        for i in 0..2_000u32 {
                            let slot = match a.enter(conn(t % 3)) {
                                Entry::Admitted(slot) => slot,
                                Entry::Parked(ticket) => {
                                    parks.fetch_add(1, Ordering::Relaxed);
                                    ticket.wait().await.expect("granted within an hour")
                                }
                                Entry::Refused => panic!("refused with room to park"),
                            };
                            peak.fetch_max(held.fetch_add(1, Ordering::SeqCst) + 1, Ordering::SeqCst);
                            if i % 7 == 0 {
                                tokio::task::yield_now().await;
                            }
                            held.fetch_sub(1, Ordering::SeqCst);
                            drop(slot);
                        }
                    })
                })
                .collect();
            for t in tasks {
                tokio::time::timeout(Duration::from_secs(60), t)
                    .await
                    .expect("no call stranded")
                    .unwrap();
            }
        });
        assert_eq!(
            peak.load(Ordering::SeqCst),
            limit,
            "slots held at once never pass the limit"
        );
        assert!(parks.load(Ordering::Relaxed) > 0, "the test exercised the waiting path");
        assert!(is_clean(&a));
    }

    /// Whether a slot has been handed to `ticket`: it has left its queue.
    fn is_granted(ticket: &Ticket) -> bool {
        let st = ticket.admission.lock();
        let queued = st.connections.get(&ticket.connection);
        !queued.is_some_and(|c| c.waiting.iter().any(|w| w.ticket == ticket.ticket))
    }

    fn is_clean(a: &Admission) -> bool {
        let (in_flight, parked) = (a.in_flight(), a.parked());
        let st = a.lock();
        in_flight == 0
            && parked == 0
            && st.connections.values().all(PerConnection::is_idle)
            && st.ring.is_empty()
            && a.by_connection.iter().all(|c| c.load(Ordering::SeqCst) == 0)
    }

    #[tokio::test]
    async fn a_light_connection_is_granted_before_a_heavy_connections_backlog() {
        let a = admission(2, 1, 100, HOUR);
        let held = [admitted(a.enter(conn(1))), admitted(a.enter(conn(1)))];
        let mut heavy: Vec<Ticket> = (0..5).map(|_| parked(a.enter(conn(1)))).collect();
        // The light connection's first call takes its reserve (over the limit), its second waits
        // behind the heavy connection's five.
        let light_first = admitted(a.enter(conn(2)));
        let light = parked(a.enter(conn(2)));
        assert_eq!((a.in_flight(), a.parked()), (3, 6));
        drop(held);
        // Back under the limit: one grant, to the connection that waited first.
        assert!(is_granted(&heavy[0]));
        assert!(!is_granted(&light));
        let heavy_slot = heavy.remove(0).wait().await.expect("granted");
        drop(heavy_slot);
        // The next turn is the light connection's, not the heavy one's second call.
        assert!(is_granted(&light), "the light connection waited behind one grant only");
        assert!(heavy.iter().all(|t| !is_granted(t)));
        let light_slot = light.wait().await.expect("granted");
        drop((light_first, light_slot));
        // The heavy backlog is served in its own order, then nothing is left.
        for t in heavy {
            assert!(is_granted(&t));
            drop(t.wait().await.expect("granted"));
        }
        assert!(is_clean(&a));
    }

    #[tokio::test]
    async fn over_the_parking_cap_calls_are_refused_at_once() {
        let a = admission(1, 0, 2, HOUR);
        let held = admitted(a.enter(conn(1)));
        let waiting = [parked(a.enter(conn(1))), parked(a.enter(conn(2)))];
        assert!(matches!(a.enter(conn(3)), Entry::Refused));
        assert_eq!((a.in_flight(), a.parked()), (1, 2), "a refusal holds nothing");
        drop(waiting);
        drop(held);
        assert!(is_clean(&a));
    }

    #[tokio::test(start_paused = true)]
    async fn a_call_that_waits_too_long_is_refused_and_gets_no_slot_later() {
        let a = admission(1, 0, 10, Duration::from_millis(200));
        let held = admitted(a.enter(conn(1)));
        let ticket = parked(a.enter(conn(2)));
        let started = tokio::time::Instant::now();
        assert!(ticket.wait().await.is_none(), "refused");
        assert_eq!(started.elapsed(), Duration::from_millis(200));
        assert_eq!((a.in_flight(), a.parked()), (1, 0));
        drop(held);
        assert!(is_clean(&a), "the freed slot went to nobody");
    }

    #[tokio::test]
    async fn a_waiting_call_whose_caller_gave_up_leaves_the_queue() {
        let a = admission(1, 0, 10, HOUR);
        let held = admitted(a.enter(conn(1)));
        let gone = parked(a.enter(conn(2)));
        let next = parked(a.enter(conn(3)));
        // What tonic does at the caller's deadline or a reset stream: the call's future is dropped.
        drop(gone);
        assert_eq!(a.parked(), 1);
        drop(held);
        assert!(is_granted(&next), "the slot skips the call that left");
        assert_eq!(a.in_flight(), 1);
        drop(next.wait().await.expect("granted"));
        assert!(is_clean(&a));
    }

    #[tokio::test]
    async fn a_slot_handed_to_a_caller_that_gave_up_is_given_back() {
        let a = admission(1, 0, 10, HOUR);
        let held = admitted(a.enter(conn(1)));
        let granted_then_gone = parked(a.enter(conn(2)));
        let next = parked(a.enter(conn(3)));
        drop(held);
        assert_eq!((a.in_flight(), a.parked()), (1, 1));
        // Its future is dropped after the grant and before it ran: the slot passes on.
        drop(granted_then_gone);
        assert!(is_granted(&next));
        drop(next.wait().await.expect("granted"));
        assert!(is_clean(&a));
    }

    #[test]
    fn a_connection_with_calls_waiting_does_not_use_its_reserve() {
        let a = admission(1, 1, 10, HOUR);
        let held = admitted(a.enter(conn(1)));
        let light = admitted(a.enter(conn(2)));
        let second = parked(a.enter(conn(2)));
        drop(light);
        // Connection 2 has nothing in flight but a call waiting: a new call waits behind it.
        let third = parked(a.enter(conn(2)));
        assert_eq!((a.in_flight(), a.parked()), (1, 2));
        drop((second, third, held));
        assert!(is_clean(&a));
    }
}
