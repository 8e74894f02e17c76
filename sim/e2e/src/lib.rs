//! End-to-end tests of seqsvr-rs (not published): in `tests/`, each runs real `storesvr` and
//! `allocsvr` processes together on loopback under `seqsvr-harness`'s supervisor and drives them
//! through the client library and `seqctl`. This library is empty.
//!
//! Deliberately left out: faults injected on the network (the simulator's job) and timing
//! assertions (the benchmarks' job).
