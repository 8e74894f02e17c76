//! `seqctl counter next KEY`, `counter reserve KEY N`, `counter get KEY`: named counters through
//! the client library, as an application would use them.
//!
//! A key is checked here first (1 to 256 bytes of UTF-8, exit 2 naming the rule) so that a typo
//! costs no round trip; the AllocSvr checks it again, as it must for any caller.
//!
//! Left out: batches of keys (the library has them through `CounterBatch`; a shell loop is the
//! operator's batch).

use clap::Subcommand;
use serde_json::json;

use crate::data::{alloc_client, owner_cells, owner_json};
use crate::{Cli, Failure, table};

#[derive(Subcommand, Debug)]
pub(crate) enum CounterCmd {
    /// The next value of the counter KEY: above every value it was given before (needs --alloc).
    Next { key: String },
    /// A block of COUNT consecutive values of KEY, all above its earlier ones (needs --alloc).
    /// COUNT is 1 to the smaller of the set's step and 1,000,000.
    Reserve {
        key: String,
        #[arg(value_parser = clap::value_parser!(u32).range(1..))]
        count: u32,
    },
    /// The last value of KEY handed out (or its section's ceiling after an owner change).
    Get { key: String },
}

pub(crate) async fn counter(cli: &Cli, cmd: &CounterCmd) -> Result<String, Failure> {
    let key = match cmd {
        CounterCmd::Next { key } | CounterCmd::Reserve { key, .. } | CounterCmd::Get { key } => key,
    };
    seqsvr_proto::keys::check_key_str(key).map_err(|e| Failure::usage(e.to_string()))?;
    let client = alloc_client(cli)?;
    let (value, last, count, owner) = match cmd {
        CounterCmd::Next { .. } => {
            let c = client.counter_next(key).await?;
            (c.value, None, None, c.owner)
        }
        CounterCmd::Get { .. } => {
            let c = client.counter_get(key).await?;
            (c.value, None, None, c.owner)
        }
        CounterCmd::Reserve { count, .. } => {
            let b = client.counter_reserve(key, *count).await?;
            (b.first, Some(b.values().end - 1), Some(b.count), b.owner)
        }
    };
    if cli.json {
        let mut v = match (last, count) {
            (Some(last), Some(count)) => json!({"key": key, "first": value, "last": last, "count": count}),
            _ => json!({"key": key, "value": value}),
        };
        v["owner"] = owner_json(&owner);
        return Ok(v.to_string());
    }
    let [s, n, i, e] = owner_cells(&owner);
    Ok(match (last, count) {
        (Some(last), Some(count)) => table(
            &[
                "KEY",
                "FIRST",
                "LAST",
                "COUNT",
                "SECTION",
                "NODE",
                "INCARNATION",
                "EPOCH",
            ],
            vec![vec![
                key.clone(),
                value.to_string(),
                last.to_string(),
                count.to_string(),
                s,
                n,
                i,
                e,
            ]],
        ),
        _ => table(
            &["KEY", "VALUE", "SECTION", "NODE", "INCARNATION", "EPOCH"],
            vec![vec![key.clone(), value.to_string(), s, n, i, e]],
        ),
    })
}
