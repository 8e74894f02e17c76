//! `seqctl id next [N]` (time-ordered ids through the client library, from any AllocSvr) and
//! `seqctl id decode ID` (time, slot, sequence and the set that leases the slot).
//!
//! `decode` reads the layout from the set's StoreSvrs when `--store` is given (the layout set 0
//! fixed, as every set has it), else from `--layout` and `--epoch-ms`.
//!
//! Left out: anything that changes the cluster.

use clap::{Args, Subcommand};
use seqsvr_proto::id_layout::{DEFAULT_EPOCH_MS, IdLayout, LayoutShape};
use serde_json::json;

use crate::audit::rfc3339;
use crate::data::alloc_client;
use crate::{Cli, EXIT_FAILED, Failure, store_client, store_seeds, table};

#[derive(Subcommand, Debug)]
pub(crate) enum IdCmd {
    /// N (default 1, at most 4096) time-ordered ids, unique in the whole cluster (needs --alloc).
    /// A layout with few sequence bits and long ticks allows fewer in one call (8 for 2 bits and
    /// 1 s ticks); more is refused as bad input (exit code 2), naming the limit.
    Next {
        #[arg(default_value_t = 1)]
        count: u32,
    },
    /// The parts of an id: its time (RFC 3339, UTC), slot, sequence and the set leasing the slot.
    Decode(DecodeArgs),
}

#[derive(Args, Debug)]
pub(crate) struct DecodeArgs {
    /// The id, in decimal.
    id: u64,
    /// Without --store: the layout, `twitter`, `sonyflake` or SLOT_BITS/SEQ_BITS/TICK_MS.
    #[arg(long, default_value = "twitter")]
    layout: LayoutShape,
    /// Without --store: the layout's epoch, Unix milliseconds.
    #[arg(long, default_value_t = DEFAULT_EPOCH_MS)]
    epoch_ms: u64,
    /// Without --store: slots each set leases (to name the set); unknown when not given.
    #[arg(long)]
    slots_per_set: Option<u64>,
}

pub(crate) async fn id(cli: &Cli, cmd: &IdCmd) -> Result<String, Failure> {
    match cmd {
        IdCmd::Next { count } => next(cli, *count).await,
        IdCmd::Decode(args) => decode(cli, args).await,
    }
}

async fn next(cli: &Cli, count: u32) -> Result<String, Failure> {
    let got = alloc_client(cli)?.next_ids(count).await?;
    if cli.json {
        // Strings as well as numbers: a JavaScript reader rounds integers above 2^53.
        return Ok(json!({
            "ids": got.ids,
            "ids_text": got.ids.iter().map(u64::to_string).collect::<Vec<_>>(),
            "set_id": got.set_id,
            "allocsvr": got.addr,
        })
        .to_string());
    }
    Ok(got.ids.iter().map(u64::to_string).collect::<Vec<_>>().join("\n"))
}

async fn decode(cli: &Cli, args: &DecodeArgs) -> Result<String, Failure> {
    let (layout, per_set) = match cli.store {
        Some(_) => layout_of_cluster(cli).await?,
        None => (args.layout.with_epoch(args.epoch_ms), args.slots_per_set),
    };
    let parts = layout
        .decompose(args.id)
        .ok_or_else(|| Failure::usage(format!("{} has its top bit set: no layout issues such an id", args.id)))?;
    let at_ms = layout.ms_of(parts.tick);
    let set = per_set.filter(|&n| n > 0).map(|n| parts.slot / n);
    if cli.json {
        return Ok(json!({
            "id": args.id, "time": rfc3339(at_ms), "unix_ms": at_ms, "tick": parts.tick,
            "slot": parts.slot, "sequence": parts.seq, "set_id": set, "layout": layout.to_string(),
        })
        .to_string());
    }
    let set = set.map_or("unknown (pass --store or --slots-per-set)".into(), |s| s.to_string());
    Ok(table(
        &["ID", "TIME", "SLOT", "SEQUENCE", "SET"],
        vec![vec![
            args.id.to_string(),
            rfc3339(at_ms),
            parts.slot.to_string(),
            parts.seq.to_string(),
            set,
        ]],
    ))
}

/// The layout and slots per set as the StoreSvrs of `--store` have them.
async fn layout_of_cluster(cli: &Cli) -> Result<(IdLayout, Option<u64>), Failure> {
    let status = store_client(cli, &store_seeds(cli)?)?.status().await?;
    let no_ids = || Failure {
        code: EXIT_FAILED,
        message: format!("set {} has no time-ordered ids set up yet", status.set_id),
    };
    let setup = status.ids.as_ref().ok_or_else(no_ids)?;
    let layout = IdLayout::from_pb(setup.layout.as_ref().ok_or_else(no_ids)?).map_err(|e| Failure {
        code: EXIT_FAILED,
        message: e.to_string(),
    })?;
    Ok((layout, Some(setup.slots_per_set)))
}
