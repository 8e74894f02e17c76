//! Ledger counters: the sub-machine a set keeps beside its sections for numbers with no gaps.
//!
//! A ledger is a counter key declared as one ([`LedgerCommand::Create`]). Its numbers are decided
//! here, when a Raft entry applies, never from an AllocSvr's memory: `reserve` hands out `high + 1`
//! as *held* (by whom, until when), and every number `1..=high` is in exactly one state from then
//! on — held, *confirmed* (with the caller's reference) or *voided* (released, expired, voided by
//! an operator, or lost with a restore: who, when, why). What keeps the promises:
//! - G1 (none skipped, none twice): `high` only grows, by one per reserve, and the number handed
//!   out is the one the reserve's own entry made held; a voided or confirmed number never becomes
//!   held again.
//! - G2 (exactly one state): the states are three disjoint records that together cover
//!   `1..=high` ([`Ledger::check`] verifies it, and the tests and the simulator call it after
//!   every command).
//! - G3 (a confirmed number never changes): confirm, release, void and expire act on held numbers
//!   only; a confirm of a confirmed number with its reference answers the same, with another is
//!   refused.
//!
//! Time is the proposing leader's clock carried in each command, never read here: every replica
//! applies the same. Each ledger keeps the highest time it applied and never goes below it, so a
//! leader whose clock stepped back only delays expiries; one that stepped forward voids holds
//! early (numbers are voided, never reused).
//!
//! What is kept per number, and why it is bounded: held numbers one record each (at most
//! [`MAX_HELD`] a ledger); voided numbers one record per run (a reconcile voids its whole tail in
//! one), every one kept, since each is a line of the gap report (at most [`MAX_VOIDED_RECORDS`] a
//! set: archiving the report is then an operator's step, refused loudly rather than lost);
//! confirmed numbers as runs (a run ends only at a held or voided number, so there are fewer runs
//! than those) and the references of the last [`KEEP_REFERENCES`] confirmed numbers. Older
//! references live in the caller's own records (an invoice names its number).
//!
//! A key's section is where its position falls, as for counters: a command on a key whose
//! section the set does not own (frozen for a move, moved away) changes nothing
//! ([`Refusal::NotOwned`]); the ledgers of a range travel with a move ([`LedgerCommand::Install`],
//! before the range's own install on the target, [`Ledgers::drop_span`] with the source's
//! tombstone).
//!
//! Left out: ledgers spanning sets, renumbering, listing a set's ledgers, and the reference of a
//! confirmed number older than the kept ones.

use std::collections::BTreeMap;

use seqsvr_proto::SectionId;
use seqsvr_proto::keys::{KeyPlacement, check_key_str};
use seqsvr_proto::params::SetParams;
use serde::{Deserialize, Serialize};

use super::ranges::RangeTable;
use super::section::Span;

/// Longest holder, request id, reference, note or operator name, in bytes: enough for a UUID, an
/// invoice id or a host name and a pid; a record is kept for every number, so it stays small.
pub const MAX_TEXT_BYTES: usize = 64;
/// Shortest and longest hold: a caller that needs less than a second does not need a hold; one that
/// holds a number for more than a day has forgotten it.
pub const MIN_HOLD_MS: u64 = 1_000;
pub const MAX_HOLD_MS: u64 = 86_400_000;
/// The hold of a ledger created without one.
pub const DEFAULT_HOLD_MS: u64 = 60_000;
/// Most numbers one ledger holds at once: every held number is a record in memory and in every
/// snapshot, and ten thousand callers mid-invoice on one series is far past any real workload.
pub const MAX_HELD: usize = 10_000;
/// How many confirmed numbers of a ledger keep their reference (~100 bytes each).
pub const KEEP_REFERENCES: usize = 1_000;
/// Most ledgers one set keeps: with [`KEEP_REFERENCES`] and [`MAX_HELD`] this bounds the
/// ledgers' memory to about 100 MB of references and 1.5 GB of holds at worst.
pub const MAX_LEDGERS: usize = 1_000;
/// Most void records a set keeps in all its ledgers (~150 bytes each).
pub const MAX_VOIDED_RECORDS: u64 = 1_000_000;

/// Why a number was voided.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum VoidReason {
    Released,
    Expired,
    Operator,
    LostWithRestore,
}

impl VoidReason {
    pub const ALL: [VoidReason; 4] = [
        VoidReason::Released,
        VoidReason::Expired,
        VoidReason::Operator,
        VoidReason::LostWithRestore,
    ];

    /// The metrics' label.
    pub fn name(self) -> &'static str {
        match self {
            VoidReason::Released => "released",
            VoidReason::Expired => "expired",
            VoidReason::Operator => "operator",
            VoidReason::LostWithRestore => "lost_with_restore",
        }
    }

    fn index(self) -> usize {
        self as usize
    }
}

/// A held number.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Hold {
    pub holder: String,
    pub request_id: String,
    pub at_ms: u64,
    pub deadline_ms: u64,
}

/// A run of voided numbers, `first..=through` (one number but for a reconcile).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Void {
    pub through: u64,
    pub reason: VoidReason,
    pub who: String,
    pub note: String,
    pub at_ms: u64,
}

/// A kept reference of a confirmed number.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Reference {
    pub reference: String,
    pub at_ms: u64,
}

/// One ledger's record.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Ledger {
    /// The section the key is placed in (fixed: placement never changes).
    pub section: SectionId,
    pub hold_ms: u64,
    /// The highest number handed out (0: none yet).
    pub high: u64,
    pub held: BTreeMap<u64, Hold>,
    /// Voided runs by their first number.
    pub voided: BTreeMap<u64, Void>,
    /// Confirmed runs, first → last.
    pub confirmed: BTreeMap<u64, u64>,
    /// The references of the last [`KEEP_REFERENCES`] confirmed numbers.
    pub references: BTreeMap<u64, Reference>,
    /// Held numbers by the request id that reserved them (non-empty ids only).
    pub requests: BTreeMap<String, u64>,
    /// How many numbers are confirmed and voided (the runs' lengths).
    pub confirmed_count: u64,
    pub voided_count: u64,
    /// Voided numbers by reason, in [`VoidReason::ALL`] order (for the metrics and the alert on
    /// expiries: summing the records every scrape would read every void of every ledger).
    pub voided_by: [u64; 4],
    /// The highest time any command applied to this ledger carried.
    pub clock_ms: u64,
    /// Restored from a backup: reserves wait for [`LedgerCommand::Reconcile`].
    pub restored: bool,
}

/// What one number is.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum NumberState {
    Held(Hold),
    /// `None`: the reference is no longer kept.
    Confirmed(Option<Reference>),
    Voided {
        first: u64,
        void: Void,
    },
    NotIssued,
}

/// Every ledger of a set, by key. Encoded as the bare map, so that none encodes as one byte.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(transparent)]
pub struct Ledgers {
    pub by_key: BTreeMap<String, Ledger>,
}

/// A command of the ledger sub-machine. `now_ms` is the proposing leader's wall clock.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum LedgerCommand {
    Create {
        key: String,
        hold_ms: u64,
    },
    Reserve {
        key: String,
        holder: String,
        request_id: String,
        now_ms: u64,
    },
    Confirm {
        key: String,
        number: u64,
        reference: String,
        now_ms: u64,
    },
    Release {
        key: String,
        number: u64,
        note: String,
        now_ms: u64,
    },
    Void {
        key: String,
        number: u64,
        who: String,
        note: String,
        now_ms: u64,
    },
    Reconcile {
        key: String,
        next: u64,
        who: String,
        now_ms: u64,
    },
    /// The leader's tick: voids every held number past its deadline.
    Expire {
        now_ms: u64,
    },
    /// A move's target takes the ledgers of `span` from the source, while it imports the range
    /// under `op` (before the range's own install).
    Install {
        op: u64,
        span: Span,
        ledgers: Vec<(String, Ledger)>,
    },
    /// A reserve confirmed in the same entry: hands out `high + 1` as confirmed with `reference`,
    /// never held. (Last, so that the variants before it keep their encoding.)
    Issue {
        key: String,
        reference: String,
        now_ms: u64,
    },
}

/// Why a ledger command changed nothing.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum Refusal {
    /// Bad input that the service should have refused before proposing.
    Invalid(String),
    NoLedger,
    /// A create with another hold than the ledger's.
    OtherHold {
        hold_ms: u64,
    },
    TooManyLedgers,
    TooManyHeld,
    TooManyVoided,
    /// The set does not own the key's section (frozen for a move, or moved away): retry.
    NotOwned,
    /// Restored from a backup: reserves wait for a reconcile.
    Restored,
    /// The number was never handed out.
    NotIssued {
        high: u64,
    },
    /// Confirmed with another reference (`None`: its reference is no longer kept).
    ConfirmedOther {
        reference: Option<String>,
    },
    /// Confirmed: it cannot be released or voided.
    Confirmed,
    Voided {
        first: u64,
        void: Void,
    },
    /// A reconcile below the ledger's next number.
    ReconcileBelow {
        next: u64,
    },
}

/// What a ledger command did.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum LedgerResult {
    /// The ledger's summary and the number's record after the command; `repeated` when it
    /// repeated one already applied (the same request id, the same reference, the same create).
    Done {
        summary: Summary,
        number: u64,
        repeated: bool,
    },
    Refused(Refusal),
    /// An expiry tick voided this many numbers; an install took this many ledgers.
    Count(u64),
}

/// A ledger's counts, as the replies carry them.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Summary {
    pub hold_ms: u64,
    pub high: u64,
    pub settled: u64,
    pub held: u64,
    pub confirmed: u64,
    pub voided: u64,
    pub restored: bool,
}

/// The section `key` is placed in.
pub fn section_of(p: &SetParams, placement: KeyPlacement, key: &str) -> SectionId {
    placement.position(key, p.uid_limit).section(p.section_size)
}

/// Checks a text field's length.
pub fn check_text(what: &str, text: &str, required: bool) -> Result<(), String> {
    if text.len() > MAX_TEXT_BYTES {
        return Err(format!(
            "a {what} is at most {MAX_TEXT_BYTES} bytes, got {}",
            text.len()
        ));
    }
    if required && text.is_empty() {
        return Err(format!("a {what} must not be empty"));
    }
    Ok(())
}

/// The hold a create asks for (0: the default), or why it is refused.
pub fn check_hold(hold_ms: u64) -> Result<u64, String> {
    match hold_ms {
        0 => Ok(DEFAULT_HOLD_MS),
        ms if (MIN_HOLD_MS..=MAX_HOLD_MS).contains(&ms) => Ok(ms),
        ms => Err(format!(
            "a hold is {MIN_HOLD_MS} ms to {MAX_HOLD_MS} ms (1 s to 1 day), got {ms} ms"
        )),
    }
}

impl LedgerCommand {
    /// The key the command is about (`None`: an expiry tick or an install).
    pub fn key(&self) -> Option<&str> {
        match self {
            LedgerCommand::Create { key, .. }
            | LedgerCommand::Reserve { key, .. }
            | LedgerCommand::Confirm { key, .. }
            | LedgerCommand::Release { key, .. }
            | LedgerCommand::Void { key, .. }
            | LedgerCommand::Reconcile { key, .. }
            | LedgerCommand::Issue { key, .. } => Some(key),
            LedgerCommand::Expire { .. } | LedgerCommand::Install { .. } => None,
        }
    }

    /// Checks the command's own fields, as the service does before proposing it and the state
    /// machine again when it applies it (an entry is applied by every replica, forever: one that
    /// slipped past the service must not allocate without a bound).
    pub fn validate(&self) -> Result<(), String> {
        if let Some(key) = self.key() {
            check_key_str(key).map_err(|e| e.to_string())?;
        }
        match self {
            LedgerCommand::Create { hold_ms, .. } => check_hold(*hold_ms).map(|_| ()),
            LedgerCommand::Reserve { holder, request_id, .. } => {
                check_text("holder", holder, false)?;
                check_text("request id", request_id, false)
            }
            LedgerCommand::Confirm { number, reference, .. } => {
                check_number(*number)?;
                check_text("reference", reference, true)
            }
            LedgerCommand::Issue { reference, .. } => check_text("reference", reference, true),
            LedgerCommand::Release { number, note, .. } => {
                check_number(*number)?;
                check_text("note", note, false)
            }
            LedgerCommand::Void { number, who, note, .. } => {
                check_number(*number)?;
                check_text("operator name", who, true)?;
                check_text("note", note, false)
            }
            LedgerCommand::Reconcile { next, who, .. } => {
                check_number(*next)?;
                check_text("operator name", who, true)
            }
            LedgerCommand::Expire { .. } => Ok(()),
            LedgerCommand::Install { ledgers, .. } => {
                if ledgers.len() > MAX_LEDGERS {
                    return Err(format!("an install carries at most {MAX_LEDGERS} ledgers"));
                }
                Ok(())
            }
        }
    }
}

fn check_number(n: u64) -> Result<(), String> {
    if n == 0 || n == u64::MAX {
        return Err(format!("ledger numbers are 1 to {}, got {n}", u64::MAX - 1));
    }
    Ok(())
}

impl Ledger {
    fn new(section: SectionId, hold_ms: u64) -> Self {
        Ledger {
            section,
            hold_ms,
            high: 0,
            held: BTreeMap::new(),
            voided: BTreeMap::new(),
            confirmed: BTreeMap::new(),
            references: BTreeMap::new(),
            requests: BTreeMap::new(),
            confirmed_count: 0,
            voided_count: 0,
            voided_by: [0; 4],
            clock_ms: 0,
            restored: false,
        }
    }

    /// The ledger's counts.
    pub fn summary(&self) -> Summary {
        Summary {
            hold_ms: self.hold_ms,
            high: self.high,
            settled: self.settled(),
            held: self.held.len() as u64,
            confirmed: self.confirmed_count,
            voided: self.voided_count,
            restored: self.restored,
        }
    }

    /// Every number up to this one is confirmed or voided.
    pub fn settled(&self) -> u64 {
        self.held.keys().next().map_or(self.high, |&n| n - 1)
    }

    /// The state of number `n`.
    pub fn state_of(&self, n: u64) -> NumberState {
        if n == 0 || n > self.high {
            return NumberState::NotIssued;
        }
        if let Some(h) = self.held.get(&n) {
            return NumberState::Held(h.clone());
        }
        if let Some((&first, v)) = self.voided.range(..=n).next_back()
            && v.through >= n
        {
            return NumberState::Voided { first, void: v.clone() };
        }
        NumberState::Confirmed(self.references.get(&n).cloned())
    }

    /// Whether `n` is in a confirmed run.
    fn is_confirmed(&self, n: u64) -> bool {
        self.confirmed
            .range(..=n)
            .next_back()
            .is_some_and(|(_, &last)| last >= n)
    }

    /// G2: the held numbers, the voided runs and the confirmed runs are disjoint and cover
    /// `1..=high` exactly, and the counts and indexes agree with them. `Err` names the first
    /// number that breaks it.
    pub fn check(&self) -> Result<(), String> {
        let mut pieces: Vec<(u64, u64, &str)> = Vec::new();
        pieces.extend(self.held.keys().map(|&n| (n, n, "held")));
        pieces.extend(self.voided.iter().map(|(&f, v)| (f, v.through, "voided")));
        pieces.extend(self.confirmed.iter().map(|(&f, &l)| (f, l, "confirmed")));
        pieces.sort();
        let mut expect = 1;
        for (first, last, what) in pieces {
            if first != expect || last < first {
                return Err(format!(
                    "number {expect} is not in exactly one state (next piece: {what} {first}..={last})"
                ));
            }
            expect = last + 1;
        }
        if expect != self.high + 1 {
            return Err(format!("numbers {expect}..={} are in no state", self.high));
        }
        let voided: u64 = self.voided.iter().map(|(&f, v)| v.through - f + 1).sum();
        let confirmed: u64 = self.confirmed.iter().map(|(&f, &l)| l - f + 1).sum();
        if (voided, confirmed) != (self.voided_count, self.confirmed_count)
            || self.voided_by.iter().sum::<u64>() != voided
        {
            return Err(format!(
                "counts say {} voided and {} confirmed, the records {voided} and {confirmed}",
                self.voided_count, self.confirmed_count
            ));
        }
        if self.references.keys().any(|&n| !self.is_confirmed(n)) || self.references.len() > KEEP_REFERENCES {
            return Err("a kept reference names a number that is not confirmed".into());
        }
        if self.requests.values().any(|n| !self.held.contains_key(n)) {
            return Err("a request id names a number that is not held".into());
        }
        // Holds end in number order: each reserve's time is at or above the ledger's clock, which
        // never goes back, and every hold is as long. Expiry looks at the first holds only.
        if self
            .held
            .values()
            .zip(self.held.values().skip(1))
            .any(|(a, b)| a.deadline_ms > b.deadline_ms)
        {
            return Err("a held number's deadline is before an earlier number's".into());
        }
        Ok(())
    }

    fn note_clock(&mut self, now_ms: u64) -> u64 {
        self.clock_ms = self.clock_ms.max(now_ms);
        self.clock_ms
    }

    fn take_hold(&mut self, n: u64) -> Option<Hold> {
        let hold = self.held.remove(&n)?;
        if self.requests.get(&hold.request_id) == Some(&n) {
            self.requests.remove(&hold.request_id);
        }
        Some(hold)
    }

    /// Adds `n` to the confirmed runs, joining its neighbours.
    fn add_confirmed(&mut self, n: u64, reference: Reference) {
        let mut first = n;
        if let Some((&f, &l)) = self.confirmed.range(..n).next_back()
            && l + 1 == n
        {
            first = f;
        }
        let mut last = n;
        if let Some(&l) = self.confirmed.get(&(n + 1)) {
            self.confirmed.remove(&(n + 1));
            last = l;
        }
        self.confirmed.insert(first, last);
        self.confirmed_count += 1;
        self.references.insert(n, reference);
        while self.references.len() > KEEP_REFERENCES {
            self.references.pop_first();
        }
    }

    /// Records the run `first..=void.through` as voided (the caller took the numbers out of their
    /// held state first).
    fn add_void(&mut self, first: u64, void: Void) {
        self.voided_count += void.through - first + 1;
        self.voided_by[void.reason.index()] += void.through - first + 1;
        self.voided.insert(first, void);
    }

    /// Voids every held number whose deadline is at or before `now_ms`; how many.
    fn expire(&mut self, now_ms: u64) -> u64 {
        // Deadlines rise with the number (see `check`): the due holds are the first ones.
        let due: Vec<u64> = self
            .held
            .iter()
            .take_while(|(_, h)| h.deadline_ms <= now_ms)
            .map(|(&n, _)| n)
            .collect();
        for &n in &due {
            let hold = self.take_hold(n).expect("a due number is held");
            let void = Void {
                through: n,
                reason: VoidReason::Expired,
                who: hold.holder,
                note: String::new(),
                at_ms: now_ms,
            };
            self.add_void(n, void);
        }
        due.len() as u64
    }
}

/// What a ledger command reads of the rest of the set's state.
pub struct Context<'a> {
    pub params: &'a SetParams,
    pub placement: KeyPlacement,
    pub ranges: &'a RangeTable,
}

impl Ledgers {
    /// Applies one command. A refusal changes nothing, but for one thing: a confirm of a held
    /// number past its deadline expires the ledger's due holds first (and is then refused).
    pub fn apply(&mut self, cx: &Context<'_>, cmd: &LedgerCommand) -> LedgerResult {
        if let Err(why) = cmd.validate() {
            return LedgerResult::Refused(Refusal::Invalid(why));
        }
        match cmd {
            LedgerCommand::Expire { now_ms } => self.expire_all(cx, *now_ms),
            LedgerCommand::Install { op, span, ledgers } => self.install(cx, *op, *span, ledgers),
            LedgerCommand::Create { key, hold_ms } => self.create(cx, key, *hold_ms),
            _ => {
                let key = cmd.key().expect("every other command names a key");
                if !cx.ranges.is_owned(section_of(cx.params, cx.placement, key)) {
                    return LedgerResult::Refused(Refusal::NotOwned);
                }
                let room = MAX_VOIDED_RECORDS.saturating_sub(self.void_records());
                match self.by_key.get_mut(key) {
                    Some(ledger) => apply_one(ledger, cmd, room),
                    None => LedgerResult::Refused(Refusal::NoLedger),
                }
            }
        }
    }

    fn create(&mut self, cx: &Context<'_>, key: &str, hold_ms: u64) -> LedgerResult {
        let hold_ms = check_hold(hold_ms).expect("validated");
        let section = section_of(cx.params, cx.placement, key);
        if !cx.ranges.is_owned(section) {
            return LedgerResult::Refused(Refusal::NotOwned);
        }
        if let Some(l) = self.by_key.get(key) {
            if l.hold_ms != hold_ms {
                return LedgerResult::Refused(Refusal::OtherHold { hold_ms: l.hold_ms });
            }
            return LedgerResult::Done {
                summary: l.summary(),
                number: 0,
                repeated: true,
            };
        }
        if self.by_key.len() >= MAX_LEDGERS {
            return LedgerResult::Refused(Refusal::TooManyLedgers);
        }
        let l = Ledger::new(section, hold_ms);
        let summary = l.summary();
        self.by_key.insert(key.to_string(), l);
        LedgerResult::Done {
            summary,
            number: 0,
            repeated: false,
        }
    }

    fn expire_all(&mut self, cx: &Context<'_>, now_ms: u64) -> LedgerResult {
        let mut count = 0;
        // Expiry is never refused for room: a number past its hold must not stay held. The
        // bound on void records stops new reserves instead (`apply_one`). A ledger of a range
        // frozen for a move is left as it was exported: the target expires it once it serves it.
        for l in self.by_key.values_mut().filter(|l| cx.ranges.is_owned(l.section)) {
            let now = l.note_clock(now_ms);
            count += l.expire(now);
        }
        LedgerResult::Count(count)
    }

    /// A move's target takes the source's ledgers of `span`: only while it imports that span
    /// under `op`, so never into a range it serves. A ledger it already has (a repeated install)
    /// is replaced: until the range is installed nobody can have changed it here.
    fn install(&mut self, cx: &Context<'_>, op: u64, span: Span, ledgers: &[(String, Ledger)]) -> LedgerResult {
        use super::ranges::RangeState;
        let importing = |s: Option<RangeState>| matches!(s, Some(RangeState::Importing { op: o }) if o == op);
        if !cx.ranges.all(span.begin, span.end, importing) {
            return LedgerResult::Refused(Refusal::NotOwned);
        }
        let mut added = 0;
        for (key, l) in ledgers {
            if !(span.begin..span.end).contains(&l.section)
                || section_of(cx.params, cx.placement, key) != l.section
                || l.check().is_err()
            {
                return LedgerResult::Refused(Refusal::Invalid(format!(
                    "ledger {key:?} does not belong to sections [{}, {}) or its record is inconsistent",
                    span.begin.0, span.end.0
                )));
            }
            added += u64::from(!self.by_key.contains_key(key));
        }
        if self.by_key.len() as u64 + added > MAX_LEDGERS as u64 {
            return LedgerResult::Refused(Refusal::TooManyLedgers);
        }
        for (key, l) in ledgers {
            self.by_key.insert(key.clone(), l.clone());
        }
        LedgerResult::Count(ledgers.len() as u64)
    }

    /// The ledgers placed in `span`, for a move's export.
    pub fn of_span(&self, span: Span) -> Vec<(String, Ledger)> {
        self.by_key
            .iter()
            .filter(|(_, l)| (span.begin..span.end).contains(&l.section))
            .map(|(k, l)| (k.clone(), l.clone()))
            .collect()
    }

    /// Forgets the ledgers placed in `span` (the source's tombstone: the target has them).
    pub fn drop_span(&mut self, span: Span) {
        let gone: Vec<String> = self
            .by_key
            .iter()
            .filter(|(_, l)| (span.begin..span.end).contains(&l.section))
            .map(|(k, _)| k.clone())
            .collect();
        for k in gone {
            self.by_key.remove(&k);
        }
    }

    pub fn is_empty(&self) -> bool {
        self.by_key.is_empty()
    }

    /// Void records in all ledgers (at most [`MAX_LEDGERS`] sums: cheaper than keeping a count
    /// that every path must keep right).
    pub fn void_records(&self) -> u64 {
        self.by_key.values().map(|l| l.voided.len() as u64).sum()
    }

    /// Marks every ledger restored from a backup; how many. The backup cannot know the numbers
    /// handed out after it: reserves wait until an operator reconciles each ledger's tail with
    /// their own records (docs/BACKUP.md).
    pub fn mark_restored(&mut self) -> u64 {
        for l in self.by_key.values_mut() {
            l.restored = true;
        }
        self.by_key.len() as u64
    }
}

/// Applies a command on one existing ledger; `room` is how many void records the set may still add.
fn apply_one(l: &mut Ledger, cmd: &LedgerCommand, room: u64) -> LedgerResult {
    match cmd {
        LedgerCommand::Reserve {
            holder,
            request_id,
            now_ms,
            ..
        } => {
            let now = l.note_clock(*now_ms);
            l.reserve(holder, request_id, now, room)
        }
        LedgerCommand::Confirm {
            number,
            reference,
            now_ms,
            ..
        } => {
            let now = l.note_clock(*now_ms);
            l.confirm(*number, reference, now, room)
        }
        LedgerCommand::Release {
            number, note, now_ms, ..
        } => {
            let now = l.note_clock(*now_ms);
            l.void(*number, VoidReason::Released, None, note, now, room)
        }
        LedgerCommand::Void {
            number,
            who,
            note,
            now_ms,
            ..
        } => {
            let now = l.note_clock(*now_ms);
            l.void(*number, VoidReason::Operator, Some(who), note, now, room)
        }
        LedgerCommand::Reconcile { next, who, now_ms, .. } => {
            let now = l.note_clock(*now_ms);
            l.reconcile(*next, who, now, room)
        }
        LedgerCommand::Issue { reference, now_ms, .. } => {
            let now = l.note_clock(*now_ms);
            l.issue(reference, now)
        }
        LedgerCommand::Create { .. } | LedgerCommand::Expire { .. } | LedgerCommand::Install { .. } => {
            LedgerResult::Refused(Refusal::Invalid("not a command on one ledger".into()))
        }
    }
}

impl Ledger {
    fn done(&self, number: u64, repeated: bool) -> LedgerResult {
        LedgerResult::Done {
            summary: self.summary(),
            number,
            repeated,
        }
    }

    /// Hands out `high + 1`, or the number a retry's request id still holds.
    fn reserve(&mut self, holder: &str, request_id: &str, now: u64, room: u64) -> LedgerResult {
        if !request_id.is_empty()
            && let Some(&n) = self.requests.get(request_id)
            && self.held.get(&n).is_some_and(|h| h.deadline_ms > now)
        {
            return self.done(n, true);
        }
        let refusal = match () {
            _ if self.restored => Some(Refusal::Restored),
            _ if room == 0 => Some(Refusal::TooManyVoided),
            _ if self.held.len() >= MAX_HELD => Some(Refusal::TooManyHeld),
            _ => None,
        };
        if let Some(r) = refusal {
            return LedgerResult::Refused(r);
        }
        let n = self.high + 1;
        self.high = n;
        if !request_id.is_empty() {
            self.requests.insert(request_id.to_string(), n);
        }
        let hold = Hold {
            holder: holder.to_string(),
            request_id: request_id.to_string(),
            at_ms: now,
            deadline_ms: now.saturating_add(self.hold_ms),
        };
        self.held.insert(n, hold);
        self.done(n, false)
    }

    /// Hands out `high + 1` confirmed with `reference`, or the kept number `reference` already
    /// confirms (a retry whose reply was lost; a reference names one document, which gets one
    /// number). Past the kept references a repeat gets a new number: the caller's record of
    /// the first is then the only link, as for any compacted reference.
    fn issue(&mut self, reference: &str, now: u64) -> LedgerResult {
        // Newest first: a retry comes soon after its first try.
        if let Some((&n, _)) = self.references.iter().rev().find(|(_, r)| r.reference == reference) {
            return self.done(n, true);
        }
        if self.restored {
            return LedgerResult::Refused(Refusal::Restored);
        }
        let n = self.high + 1;
        self.high = n;
        let kept = Reference {
            reference: reference.to_string(),
            at_ms: now,
        };
        self.add_confirmed(n, kept);
        self.done(n, false)
    }

    /// held → confirmed with `reference`; the same reference again answers the same.
    fn confirm(&mut self, n: u64, reference: &str, now: u64, room: u64) -> LedgerResult {
        let refused = LedgerResult::Refused;
        match self.state_of(n) {
            NumberState::NotIssued => refused(Refusal::NotIssued { high: self.high }),
            NumberState::Confirmed(Some(r)) if r.reference == reference => self.done(n, true),
            NumberState::Confirmed(r) => refused(Refusal::ConfirmedOther {
                reference: r.map(|r| r.reference),
            }),
            NumberState::Voided { first, void } => refused(Refusal::Voided { first, void }),
            NumberState::Held(h) if h.deadline_ms <= now => {
                // Past its deadline: it expires now rather than at the next tick, so a hold ends
                // when it says, whatever the tick's pace.
                if room == 0 {
                    return refused(Refusal::TooManyVoided);
                }
                self.expire(now);
                match self.state_of(n) {
                    NumberState::Voided { first, void } => refused(Refusal::Voided { first, void }),
                    other => refused(Refusal::Invalid(format!("number {n} did not expire: {other:?}"))),
                }
            }
            NumberState::Held(_) => {
                self.take_hold(n);
                let kept = Reference {
                    reference: reference.to_string(),
                    at_ms: now,
                };
                self.add_confirmed(n, kept);
                self.done(n, false)
            }
        }
    }

    /// held → voided for `reason` (by `who`, else its holder). A repeat of a void for the same
    /// reason (a retry whose reply was lost) answers the same.
    fn void(&mut self, n: u64, reason: VoidReason, who: Option<&str>, note: &str, now: u64, room: u64) -> LedgerResult {
        if let NumberState::Voided { void, .. } = self.state_of(n)
            && void.reason == reason
        {
            return self.done(n, true);
        }
        end_hold(self, n, room, |h| Void {
            through: n,
            reason,
            who: who.unwrap_or(&h.holder).to_string(),
            note: note.to_string(),
            at_ms: now,
        })
    }

    /// After a restore: voids `high + 1 .. next` as lost with it, and lets reserves resume at `next`.
    fn reconcile(&mut self, next: u64, who: &str, now: u64, room: u64) -> LedgerResult {
        if next <= self.high {
            return LedgerResult::Refused(Refusal::ReconcileBelow { next: self.high + 1 });
        }
        if next > self.high + 1 {
            if room == 0 {
                return LedgerResult::Refused(Refusal::TooManyVoided);
            }
            let first = self.high + 1;
            self.high = next - 1;
            let lost = Void {
                through: next - 1,
                reason: VoidReason::LostWithRestore,
                who: who.to_string(),
                note: String::new(),
                at_ms: now,
            };
            self.add_void(first, lost);
        }
        self.restored = false;
        self.done(self.high, false)
    }
}

/// Voids held number `n` with the record `void` makes of its hold; refused when `n` is not held.
/// A hold past its deadline is voided all the same (by the caller's word rather than the tick's:
/// the number is voided either way).
fn end_hold(l: &mut Ledger, n: u64, room: u64, void: impl FnOnce(&Hold) -> Void) -> LedgerResult {
    match l.state_of(n) {
        NumberState::NotIssued => LedgerResult::Refused(Refusal::NotIssued { high: l.high }),
        NumberState::Confirmed(_) => LedgerResult::Refused(Refusal::Confirmed),
        NumberState::Voided { first, void } => LedgerResult::Refused(Refusal::Voided { first, void }),
        NumberState::Held(_) if room == 0 => LedgerResult::Refused(Refusal::TooManyVoided),
        NumberState::Held(_) => {
            let hold = l.take_hold(n).expect("held");
            let v = void(&hold);
            l.add_void(n, v);
            LedgerResult::Done {
                summary: l.summary(),
                number: n,
                repeated: false,
            }
        }
    }
}

#[cfg(test)]
mod tests;
