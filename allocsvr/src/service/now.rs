//! The front ends' takes and reads (`crate::front`), answered from memory when this node can at
//! once, by the gRPC calls' own code (one attempt of `take`, the peek of `reads`), after the front
//! end's cluster map says this node's set may answer. Otherwise the answer is `None`, which sends
//! the call the long way, through the client library, as any caller's.
//!
//! Left out: waiting for a bump, forwarding, refusing with a reason, and checking the input in
//! full: the long way does all of that.

use seqsvr_proto::{SectionId, pb};

use super::Service;
use super::check::Who;
use super::take::Step;
use crate::error::Error;

impl Service {
    /// A front end's take of `n` numbers of `uid` or `key`, answered from memory when this node
    /// can at once: the section is held, ready and below its ceiling, and `may_answer` (the
    /// front end's cluster map) lets this node's set answer for it. `None` sends the call the
    /// long way, through the client library, which waits for a bump, forwards, or refuses with
    /// the reason, as for any caller; so does input this path does not check in full.
    pub(crate) fn take_now(
        &self,
        uid: u64,
        key: Option<&str>,
        n: u32,
        may_answer: impl FnOnce(SectionId) -> bool,
    ) -> Option<Result<(u64, pb::Owner), Error>> {
        let who = self.front_who(uid, key)?;
        let n = self.check_block(n).ok()?;
        if !may_answer(who.pos.section(self.shared.params().section_size)) {
            return None;
        }
        match self.fetch_once(who, n) {
            Step::Served { seq, owner } => {
                let m = self.shared.metrics();
                m.fetch_ok.increment(1);
                if key.is_some() {
                    m.key_seqs.increment(n);
                }
                if n > 1 {
                    m.block_seqs.increment(n);
                }
                Some(Ok((seq, owner)))
            }
            Step::Exhausted(section, max_seq) => Some(Err(Step::exhausted(who, section, max_seq))),
            Step::NotOwner | Step::NotReady | Step::Wait(_) => None,
        }
    }

    /// A front end's read of `uid` or `key` from memory, on the terms of [`Self::take_now`].
    pub(crate) fn current_now(
        &self,
        uid: u64,
        key: Option<&str>,
        may_answer: impl FnOnce(SectionId) -> bool,
    ) -> Option<(u64, pb::Owner)> {
        let who = self.front_who(uid, key)?;
        if !may_answer(who.pos.section(self.shared.params().section_size)) {
            return None;
        }
        match self.peek(who) {
            (pb::Outcome::Ok, value, Some(owner)) => Some((value, owner)),
            _ => None,
        }
    }

    fn front_who<'k>(&self, uid: u64, key: Option<&'k str>) -> Option<Who<'k>> {
        match key {
            Some(k) => self.check_key_str(k).ok(),
            None => self.check_uid(uid).ok().map(Who::uid),
        }
    }
}
