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
//! Left out: priorities or weights between connections (every connection with waiting calls gets
//! the same turn), and any order between the calls of one connection other than arrival.

use std::collections::{HashMap, VecDeque};
use std::net::SocketAddr;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use tokio::sync::oneshot;

/// A connection, told apart by its peer address (`None`: no address known; all such share one).
pub(crate) type Connection = Option<SocketAddr>;

/// Every call looks its connection up twice (enter, release): a fast seeded hash rather than
/// SipHash, which a profile of `NextIds` showed on this path. The keys are peer addresses, and
/// the map holds only connections with calls (plus at most [`IDLE_KEPT`] idle ones).
type Connections = HashMap<Connection, PerConnection, foldhash::fast::RandomState>;

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
pub(crate) struct Admission {
    bounds: Bounds,
    state: Mutex<State>,
}

#[derive(Default)]
struct State {
    in_flight: usize,
    parked: usize,
    next_ticket: u64,
    /// Connections with a call in flight or waiting, or a turn in `ring`, and up to [`IDLE_KEPT`]
    /// idle ones (an idle entry is the default one); the rest have no entry.
    connections: Connections,
    /// Connections in the order they get their next grant. A connection is in it at most once
    /// (`in_ring`); one whose waiting calls all left is skipped when its turn comes.
    ring: VecDeque<Connection>,
}

#[derive(Default)]
struct PerConnection {
    in_flight: usize,
    waiting: VecDeque<Waiter>,
    in_ring: bool,
}

struct Waiter {
    ticket: u64,
    grant: oneshot::Sender<()>,
}

impl PerConnection {
    fn is_idle(&self) -> bool {
        self.in_flight == 0 && self.waiting.is_empty() && !self.in_ring
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
            state: Mutex::new(State::default()),
        }
    }

    pub(crate) fn bounds(&self) -> &Bounds {
        &self.bounds
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        // Plain counts and queues, each update finished before the lock is let go: a panic
        // elsewhere cannot leave them half-updated.
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Calls holding a slot now.
    pub(crate) fn in_flight(&self) -> usize {
        self.lock().in_flight
    }

    /// Calls waiting for a slot now.
    pub(crate) fn parked(&self) -> usize {
        self.lock().parked
    }

    /// Connections with an entry that is not idle (a call in flight or waiting, or a turn
    /// coming).
    #[cfg(test)]
    pub(crate) fn connections(&self) -> usize {
        self.lock().connections.values().filter(|c| !c.is_idle()).count()
    }

    /// Entries held, idle ones included.
    #[cfg(test)]
    pub(crate) fn entries(&self) -> usize {
        self.lock().connections.len()
    }

    /// Admits, parks or refuses a call that arrived on `connection`.
    pub(crate) fn enter(self: &Arc<Self>, connection: Connection) -> Entry {
        let b = self.bounds;
        let mut guard = self.lock();
        let st = &mut *guard;
        let conn = st.connections.entry(connection).or_default();
        let light = conn.in_flight < b.reserve && conn.waiting.is_empty();
        // Below the limit nothing waits (release grants until it is reached), so no queue is
        // jumped here.
        if st.in_flight < b.limit || (light && st.in_flight < 2 * b.limit) {
            conn.in_flight += 1;
            st.in_flight += 1;
            return Entry::Admitted(Slot {
                admission: self.clone(),
                connection,
            });
        }
        if st.parked >= b.max_parked {
            tidy(&mut st.connections, connection);
            return Entry::Refused;
        }
        let ticket = st.next_ticket;
        st.next_ticket += 1;
        let (grant, granted) = oneshot::channel();
        conn.waiting.push_back(Waiter { ticket, grant });
        if !conn.in_ring {
            conn.in_ring = true;
            st.ring.push_back(connection);
        }
        st.parked += 1;
        Entry::Parked(Ticket {
            admission: self.clone(),
            connection,
            ticket,
            granted,
            settled: false,
        })
    }

    /// Gives back a slot of `connection`, and hands the freed capacity to waiting calls.
    fn release(&self, connection: Connection) {
        let mut guard = self.lock();
        let st = &mut *guard;
        st.in_flight = st.in_flight.saturating_sub(1);
        if let Some(conn) = st.connections.get_mut(&connection) {
            conn.in_flight = conn.in_flight.saturating_sub(1);
            tidy(&mut st.connections, connection);
        }
        while st.in_flight < self.bounds.limit && st.parked > 0 {
            if !grant_next(st) {
                break;
            }
        }
    }

    /// Takes the call `ticket` of `connection` out of its queue: `true` if it was still waiting,
    /// `false` if a slot had already been handed to it.
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
        st.parked -= 1;
        tidy(&mut st.connections, connection);
        if st.parked == 0 {
            // Every turn left in the ring is of a connection whose calls all left: drop them
            // now, or connections that come and go would pile up in it until the next grant.
            for stale in std::mem::take(&mut st.ring) {
                if let Some(conn) = st.connections.get_mut(&stale) {
                    conn.in_ring = false;
                }
                tidy(&mut st.connections, stale);
            }
        }
        true
    }
}

/// Hands one slot to the first waiting call of the connection whose turn it is; `false` when no
/// connection has one (the ring is empty).
fn grant_next(st: &mut State) -> bool {
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
        conn.in_flight += 1;
        st.in_flight += 1;
        st.parked -= 1;
        // Cannot fail: a ticket leaves its queue (`withdraw`, under this lock) before its
        // receiver is dropped, so a waiter still queued has a live receiver.
        let _ = waiter.grant.send(());
        return true;
    }
    false
}

/// A slot of the in-flight limit, given back when dropped.
pub(crate) struct Slot {
    admission: Arc<Admission>,
    connection: Connection,
}

impl Drop for Slot {
    fn drop(&mut self) {
        self.admission.release(self.connection);
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
            return Some(Slot {
                admission: self.admission.clone(),
                connection: self.connection,
            });
        }
        None
    }
}

impl Drop for Ticket {
    fn drop(&mut self) {
        if !self.settled && !self.admission.withdraw(self.connection, self.ticket) {
            self.admission.release(self.connection);
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
    fn idle_connections_keep_at_most_a_bounded_number_of_entries() {
        let a = admission(4, 2, 8, HOUR);
        // One call at a time on one connection: its entry stays between calls.
        for _ in 0..3 {
            drop(admitted(a.enter(conn(1))));
        }
        assert_eq!((a.connections(), a.entries()), (0, 1));
        // Many connections, one call each, then all idle: no more than IDLE_KEPT entries remain.
        for port in 2..(2 + 3 * IDLE_KEPT as u16) {
            drop(admitted(a.enter(conn(port))));
        }
        assert_eq!(a.connections(), 0);
        assert_eq!(
            a.entries(),
            IDLE_KEPT,
            "past the bound, each connection going idle is dropped"
        );
        // A busy connection is never dropped, however many idle ones there are.
        let busy = admitted(a.enter(conn(1)));
        for port in 1_000..(1_000 + 2 * IDLE_KEPT as u16) {
            drop(admitted(a.enter(conn(port))));
        }
        assert_eq!(a.connections(), 1);
        drop(busy);
        assert_eq!((a.in_flight(), a.connections()), (0, 0));
    }

    /// Whether a slot has been handed to `ticket`: it has left its queue.
    fn is_granted(ticket: &Ticket) -> bool {
        let st = ticket.admission.lock();
        let queued = st.connections.get(&ticket.connection);
        !queued.is_some_and(|c| c.waiting.iter().any(|w| w.ticket == ticket.ticket))
    }

    fn is_clean(a: &Admission) -> bool {
        let st = a.lock();
        st.in_flight == 0 && st.parked == 0 && st.connections.values().all(PerConnection::is_idle) && st.ring.is_empty()
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
