//! Client library of seqsvr-rs (being written).

pub mod store;
