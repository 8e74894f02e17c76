//! Who a replica is, on every Raft message: its set, its group and its node id.
//!
//! A Raft group is identified by a random group id minted when it is bootstrapped and again when
//! a set is restored from a backup, kept in the data dir's `GROUP_ID` file beside `NODE_ID`.
//! Every peer request carries the sender's set and group and the node it means to reach; every
//! reply carries the answering node's. A replica refuses, before openraft sees it, a message of
//! another set, of another group, or meant for another node, and logs both sides. Without this,
//! a crossed `--peers` entry or an old replica restarted after a restore onto the same address
//! could take part in the wrong group's elections and overwrite its log with older ceilings (P3,
//! then duplicates).
//!
//! A replica learns its group id in one of three ways: it mints it (bootstrap, restore), or, as a
//! fresh replica with no Raft state yet, it takes the id of the first leader whose entries or
//! snapshot it accepts (`seqctl replica add`), and keeps it from then on.
//!
//! Left out: groups bootstrapped before group ids existed have none (0) until they are restored;
//! their replicas still check the set and the node id, and refuse nothing on the group. The id is
//! an identity, not a secret: authenticating peers is mTLS's job (docs/TLS.md).

use std::io;
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use seqsvr_proto::pb::RaftPayload;

/// The file in the data dir that holds the group id.
pub const GROUP_FILE: &str = "GROUP_ID";

/// At most one refusal line per this interval: a crossed peer retries every heartbeat.
const WARN_EVERY: Duration = Duration::from_secs(10);

/// This replica's identity and what it accepts.
#[derive(Debug)]
pub struct Identity {
    node_id: u64,
    set_id: u64,
    /// 0 until known.
    group: AtomicU64,
    /// A fresh replica (no group id, no Raft state) takes the group id of the first leader.
    adoptable: AtomicBool,
    dir: PathBuf,
    /// When the last refusal was logged.
    warned: Mutex<Option<Instant>>,
    /// Negative control (`--unsafe-skip-group-check`): admit everything.
    skip_check: bool,
}

/// What kind of peer message is being admitted: only a leader's entries or snapshot teach a
/// fresh replica its group (a vote request is from a candidate that may lose).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Carries {
    Entries,
    Vote,
}

impl Identity {
    /// The identity of the replica whose data dir is `dir` (the group id from its `GROUP_ID`
    /// file, if any). Nothing is adoptable until [`Identity::allow_adoption`] says so.
    pub fn load(dir: &Path, node_id: u64, set_id: u64) -> io::Result<Self> {
        Ok(Self {
            node_id,
            set_id,
            group: AtomicU64::new(read_group(dir)?.unwrap_or(0)),
            adoptable: AtomicBool::new(false),
            dir: dir.to_path_buf(),
            warned: Mutex::new(None),
            skip_check: false,
        })
    }

    /// The negative control: every message is admitted, stamped or not.
    pub fn without_check(mut self) -> Self {
        self.skip_check = true;
        self
    }

    /// The group id, 0 while unknown.
    pub fn group(&self) -> u64 {
        self.group.load(Ordering::Acquire)
    }

    /// A replica with no Raft state and no group id yet: it may learn its group from a leader.
    pub fn allow_adoption(&self) {
        if self.group() == 0 {
            self.adoptable.store(true, Ordering::Release);
        }
    }

    /// At bootstrap: a new group id, written (synced) before the first message goes out; an id
    /// already minted by an earlier, interrupted bootstrap is kept.
    pub fn mint(&self) -> io::Result<u64> {
        if self.group() != 0 {
            return Ok(self.group());
        }
        let group = write_new_group(&self.dir)?;
        self.group.store(group, Ordering::Release);
        self.adoptable.store(false, Ordering::Release);
        tracing::info!(group = format!("{group:016x}"), "minted the group id");
        Ok(group)
    }

    /// `payload` stamped as sent by this replica to node `to` (0 on replies: this node answers).
    pub fn stamp(&self, mut payload: RaftPayload, to: u64) -> RaftPayload {
        payload.stamped = true;
        payload.set_id = self.set_id;
        payload.group_id = self.group();
        payload.node_id = if to == 0 { self.node_id } else { to };
        payload
    }

    /// Whether a request stamped `msg` may reach openraft here; a fresh replica learns its group
    /// from the first leader's entries. The error says why not, naming both sides.
    pub fn admit(&self, msg: &RaftPayload, carries: Carries) -> Result<(), String> {
        let why = self.mismatch(msg, msg.node_id != self.node_id);
        if let Some(why) = why {
            self.warn(&why);
            return Err(why);
        }
        if self.group() == 0
            && msg.group_id != 0
            && carries == Carries::Entries
            && self.adoptable.load(Ordering::Acquire)
        {
            if let Err(e) = write_group(&self.dir, msg.group_id) {
                return Err(format!("cannot keep the group id this replica is joining: {e}"));
            }
            self.group.store(msg.group_id, Ordering::Release);
            self.adoptable.store(false, Ordering::Release);
            tracing::info!(
                group = format!("{:016x}", msg.group_id),
                "joined the group of the leader that reached this new replica"
            );
        }
        Ok(())
    }

    /// Whether a reply stamped `msg` comes from the group this replica belongs to. A reply
    /// without a group id is from a new replica that has not learned it yet (it answers a vote
    /// request before the first leader's entries reach it), so it is not refused for that.
    pub fn check_reply(&self, msg: &RaftPayload, from: u64) -> Result<(), String> {
        let unlearned = RaftPayload {
            group_id: self.group(),
            data: Vec::new(),
            ..msg.clone()
        };
        let msg = if msg.stamped && msg.group_id == 0 {
            &unlearned
        } else {
            msg
        };
        let why = self.mismatch(msg, msg.node_id != from);
        if let Some(why) = &why {
            self.warn(why);
        }
        why.map_or(Ok(()), Err)
    }

    fn mismatch(&self, msg: &RaftPayload, wrong_node: bool) -> Option<String> {
        if self.skip_check {
            return None;
        }
        let mine = self.group();
        let theirs = if msg.stamped {
            format!("set {}, group {:016x}, node {}", msg.set_id, msg.group_id, msg.node_id)
        } else {
            "an unstamped peer (an older build)".to_string()
        };
        let refused = if !msg.stamped {
            mine != 0
        } else {
            msg.set_id != self.set_id || wrong_node || (mine != 0 && msg.group_id != mine)
        };
        refused.then(|| {
            format!(
                "raft message of {theirs} refused by set {}, group {mine:016x}, node {}",
                self.set_id, self.node_id
            )
        })
    }

    fn warn(&self, why: &str) {
        let mut warned = self.warned.lock().expect("warn lock poisoned");
        if warned.is_none_or(|t| t.elapsed() >= WARN_EVERY) {
            *warned = Some(Instant::now());
            tracing::warn!("{why} (a crossed --peers entry, or a replica of an older copy of the group)");
        }
    }
}

/// The group id in `dir`, if one was minted or learned there.
pub fn read_group(dir: &Path) -> io::Result<Option<u64>> {
    match std::fs::read_to_string(dir.join(GROUP_FILE)) {
        Ok(text) => u64::from_str_radix(text.trim(), 16)
            .ok()
            .filter(|g| *g != 0)
            .map(Some)
            .ok_or_else(|| io::Error::other(format!("{GROUP_FILE} holds {:?}, not a group id", text.trim()))),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(e),
    }
}

/// Mints a new random group id into `dir` (bootstrap, restore).
pub fn write_new_group(dir: &Path) -> io::Result<u64> {
    let group = loop {
        let g: u64 = rand::random();
        if g != 0 {
            break g;
        }
    };
    write_group(dir, group)?;
    Ok(group)
}

/// Writes `group` to `dir/GROUP_ID` atomically and durably (temp file, sync, rename, sync dir).
fn write_group(dir: &Path, group: u64) -> io::Result<()> {
    let tmp = dir.join(format!("{GROUP_FILE}.tmp"));
    std::fs::write(&tmp, format!("{group:016x}\n"))?;
    std::fs::File::open(&tmp)?.sync_all()?;
    std::fs::rename(&tmp, dir.join(GROUP_FILE))?;
    std::fs::File::open(dir)?.sync_all()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn msg(set_id: u64, group_id: u64, node_id: u64) -> RaftPayload {
        RaftPayload {
            data: vec![],
            stamped: true,
            set_id,
            group_id,
            node_id,
        }
    }

    #[test]
    fn another_set_group_or_node_is_refused_and_the_own_group_admitted() {
        let dir = tempfile::tempdir().unwrap();
        let me = Identity::load(dir.path(), 2, 1).unwrap();
        let g = me.mint().unwrap();
        assert_eq!(me.mint().unwrap(), g, "minted once");
        assert!(me.admit(&msg(1, g, 2), Carries::Entries).is_ok());
        for (bad, what) in [
            (msg(0, g, 2), "set 0"),
            (msg(1, g ^ 1, 2), "group"),
            (msg(1, g, 3), "node 3"),
        ] {
            let why = me.admit(&bad, Carries::Vote).unwrap_err();
            assert!(why.contains(what) && why.contains("refused by set 1"), "{why}");
        }
        let unstamped = RaftPayload::default();
        assert!(
            me.admit(&unstamped, Carries::Entries).is_err(),
            "an older build's message, in a group with an id"
        );
        let again = Identity::load(dir.path(), 2, 1).unwrap();
        assert_eq!(again.group(), g, "kept across restarts");
    }

    #[test]
    fn a_fresh_replica_learns_its_group_from_a_leaders_entries_only() {
        let dir = tempfile::tempdir().unwrap();
        let me = Identity::load(dir.path(), 3, 0).unwrap();
        assert!(me.admit(&msg(0, 77, 3), Carries::Entries).is_ok());
        assert_eq!(me.group(), 0, "nothing learned before adoption is allowed");
        me.allow_adoption();
        assert!(me.admit(&msg(0, 55, 3), Carries::Vote).is_ok());
        assert_eq!(me.group(), 0, "a candidate's vote request teaches nothing");
        assert!(me.admit(&msg(0, 77, 3), Carries::Entries).is_ok());
        assert_eq!(me.group(), 77);
        assert!(me.admit(&msg(0, 55, 3), Carries::Entries).is_err(), "then held to it");
        assert_eq!(read_group(dir.path()).unwrap(), Some(77));
    }

    #[test]
    fn a_group_without_an_id_checks_set_and_node_only() {
        let dir = tempfile::tempdir().unwrap();
        let me = Identity::load(dir.path(), 1, 0).unwrap();
        assert!(
            me.admit(&RaftPayload::default(), Carries::Entries).is_ok(),
            "older builds"
        );
        assert!(me.admit(&msg(0, 9, 1), Carries::Entries).is_ok());
        assert!(me.admit(&msg(1, 9, 1), Carries::Entries).is_err());
        assert!(me.check_reply(&msg(0, 0, 2), 2).is_ok());
        assert!(me.check_reply(&msg(0, 0, 3), 2).is_err(), "answered by another node");
        me.allow_adoption();
        me.admit(&msg(0, 9, 1), Carries::Entries).unwrap();
        assert!(
            me.check_reply(&msg(0, 0, 2), 2).is_ok(),
            "a new replica's reply, before it learned the group"
        );
        assert!(me.check_reply(&msg(0, 8, 2), 2).is_err());
        std::fs::write(dir.path().join(GROUP_FILE), "zz\n").unwrap();
        assert!(
            Identity::load(dir.path(), 1, 0).is_err(),
            "a damaged file is an error, not a new group"
        );
    }
}
