//! `MULTI` / `EXEC` / `DISCARD` as a queued pipeline, so that the default pipeline of the most
//! used Redis clients (redis-py's `r.pipeline()` is `MULTI` ... `EXEC`) takes its numbers and
//! gets every value back.
//!
//! After `MULTI` each command is answered `+QUEUED` and kept; `EXEC` runs them in order, exactly
//! as a pipeline of them would run, and answers their replies as one array; `DISCARD` drops them.
//! Nothing is taken before `EXEC`. A command that cannot be queued (unknown, or one that changes
//! the connection: `AUTH`, `HELLO`, `SELECT`, `MULTI`) is answered with an error and makes the
//! `EXEC` fail with `-EXECABORT`, as Redis does; so does a queue over [`MAX_QUEUED`] commands or
//! [`MAX_PENDING_BYTES`] bytes.
//!
//! Deliberately left out: isolation. Other connections' calls may take values of the same names
//! between the queued commands (each name's values still rise, in the order sent), and `WATCH` is
//! refused, because a counter that only rises has no compare-and-set to offer: a client that
//! `WATCH`es to build one gets a clear error rather than a transaction that does not hold.

use super::{After, MAX_PENDING_BYTES, Reply, Session, Sink, arity};
use crate::calls::Calls;

/// Most commands one transaction may queue.
pub const MAX_QUEUED: usize = 10_000;

/// Bytes counted per queued argument beside its own (its vector's header and allocation).
const ARG_OVERHEAD: usize = 32;

/// The commands queued since `MULTI`.
#[derive(Debug, Default)]
pub struct Queue {
    commands: Vec<Vec<Vec<u8>>>,
    bytes: usize,
    /// A command was refused while queueing: `EXEC` fails.
    refused: bool,
}

/// Whether `name` is a command that opens, closes or concerns a transaction: these run at once
/// even while one is open.
pub fn is_control(name: &[u8]) -> bool {
    ["MULTI", "EXEC", "DISCARD", "WATCH", "QUIT"]
        .iter()
        .any(|c| name.eq_ignore_ascii_case(c.as_bytes()))
}

/// Commands that may be queued: the ones that read or take values and the harmless ones.
const QUEUEABLE: [&str; 12] = [
    "INCR", "INCRBY", "GET", "MGET", "NEXTID", "PING", "ECHO", "CLIENT", "INFO", "COMMAND", "CONFIG", "UNWATCH",
];

impl<C: Calls> Session<'_, C> {
    /// Runs one command while a transaction is open, or a transaction's control command.
    pub(super) async fn transaction(&mut self, args: &[&[u8]]) -> (Reply, After) {
        if !self.authed {
            // NOAUTH for all but AUTH, HELLO and QUIT: the command's own rule.
            return self.command(args).await;
        }
        let name = String::from_utf8_lossy(args[0]).to_ascii_uppercase();
        let reply = match (name.as_str(), self.queue.is_some()) {
            ("QUIT", _) => return (Reply::ok(), After::Close),
            ("MULTI", _) if args.len() != 1 => arity("MULTI"),
            ("MULTI", false) => {
                self.queue = Some(Queue::default());
                Reply::ok()
            }
            // Redis answers this without ending the open transaction.
            ("MULTI", true) => Reply::err("MULTI calls can not be nested"),
            ("EXEC", false) => Reply::err("EXEC without MULTI"),
            ("DISCARD", false) => Reply::err("DISCARD without MULTI"),
            ("DISCARD", true) => {
                self.queue = None;
                Reply::ok()
            }
            ("EXEC", true) => return self.exec().await,
            ("WATCH", _) => Reply::err(
                "WATCH is not served: MULTI/EXEC run as a queued pipeline without isolation, \
                 and a counter that only rises has no compare-and-set",
            ),
            (_, true) => self.enqueue(&name, args),
            // Only control commands and open transactions come here.
            (_, false) => Reply::err("internal: not a transaction command"),
        };
        (reply, After::Continue)
    }

    fn enqueue(&mut self, name: &str, args: &[&[u8]]) -> Reply {
        let Some(queue) = self.queue.as_mut() else {
            return Reply::err("internal: no transaction open");
        };
        if !QUEUEABLE.contains(&name) {
            queue.refused = true;
            return if matches!(name, "AUTH" | "HELLO" | "SELECT") {
                Reply::err(format!("{name} is not allowed inside a transaction"))
            } else {
                super::unknown(args[0], &args[1..])
            };
        }
        let bytes: usize = args.iter().map(|a| a.len() + ARG_OVERHEAD).sum();
        if queue.commands.len() >= MAX_QUEUED || queue.bytes + bytes > MAX_PENDING_BYTES {
            queue.refused = true;
            return Reply::err(format!(
                "a transaction of more than {MAX_QUEUED} commands or {MAX_PENDING_BYTES} bytes; it will be discarded"
            ));
        }
        queue.bytes += bytes;
        queue.commands.push(args.iter().map(|a| a.to_vec()).collect());
        Reply::Simple("QUEUED")
    }

    async fn exec(&mut self) -> (Reply, After) {
        let Some(queue) = self.queue.take() else {
            return (Reply::err("EXEC without MULTI"), After::Continue);
        };
        if queue.refused {
            return (
                Reply::Error("EXECABORT Transaction discarded because of previous errors.".into()),
                After::Continue,
            );
        }
        let commands: Vec<Vec<&[u8]>> = queue
            .commands
            .iter()
            .map(|c| c.iter().map(Vec::as_slice).collect())
            .collect();
        let mut replies = Vec::with_capacity(commands.len());
        let after = self.pipeline(&commands, &mut Sink::Replies(&mut replies)).await;
        (Reply::Array(replies), after)
    }
}
