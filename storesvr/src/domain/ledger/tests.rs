//! The ledger sub-machine's rules, one behaviour per test, through `SetState::apply` (so the
//! wiring, the ownership check and the encoding are exercised with it).

use super::*;
use crate::domain::state::{Command, CommandResult, SetState};
use crate::domain::testing::set_with;

const KEY: &str = "invoices:2026";

fn run(st: &mut SetState, c: LedgerCommand) -> LedgerResult {
    let r = match st.apply(&Command::Ledger(c), false) {
        CommandResult::Ledger(r) => r,
        other => panic!("not a ledger result: {other:?}"),
    };
    for (k, l) in &st.ledgers.by_key {
        l.check().unwrap_or_else(|e| panic!("ledger {k}: {e}"));
    }
    r
}

fn created(hold_ms: u64) -> SetState {
    let (mut st, _) = set_with(&[]);
    let r = run(
        &mut st,
        LedgerCommand::Create {
            key: KEY.into(),
            hold_ms,
        },
    );
    assert!(matches!(r, LedgerResult::Done { repeated: false, .. }), "{r:?}");
    st
}

fn reserve(st: &mut SetState, request_id: &str, now_ms: u64) -> LedgerResult {
    run(
        st,
        LedgerCommand::Reserve {
            key: KEY.into(),
            holder: "app-1".into(),
            request_id: request_id.into(),
            now_ms,
        },
    )
}

fn number(r: &LedgerResult) -> u64 {
    match r {
        LedgerResult::Done { number, .. } => *number,
        other => panic!("not done: {other:?}"),
    }
}

fn confirm(st: &mut SetState, n: u64, reference: &str, now_ms: u64) -> LedgerResult {
    run(
        st,
        LedgerCommand::Confirm {
            key: KEY.into(),
            number: n,
            reference: reference.into(),
            now_ms,
        },
    )
}

fn ledger(st: &SetState) -> &Ledger {
    &st.ledgers.by_key[KEY]
}

#[test]
fn reserves_hand_out_one_number_after_another() {
    let mut st = created(60_000);
    let got: Vec<u64> = (0..5).map(|i| number(&reserve(&mut st, "", 1_000 + i))).collect();
    assert_eq!(got, [1, 2, 3, 4, 5]);
    assert_eq!(ledger(&st).high, 5);
}

#[test]
fn a_retried_reserve_with_its_request_id_gets_the_same_number() {
    let mut st = created(60_000);
    let first = reserve(&mut st, "req-1", 1_000);
    let again = reserve(&mut st, "req-1", 1_500);
    assert_eq!(number(&first), number(&again));
    assert!(matches!(again, LedgerResult::Done { repeated: true, .. }));
    assert_eq!(ledger(&st).high, 1);
    // Once confirmed, the id is free again: a new reserve.
    confirm(&mut st, 1, "INV-1", 2_000);
    assert_eq!(number(&reserve(&mut st, "req-1", 2_100)), 2);
}

#[test]
fn a_confirm_repeated_with_its_reference_answers_the_same_and_another_is_refused() {
    let mut st = created(60_000);
    let n = number(&reserve(&mut st, "", 1_000));
    assert!(matches!(
        confirm(&mut st, n, "INV-1", 1_100),
        LedgerResult::Done { repeated: false, .. }
    ));
    assert!(matches!(
        confirm(&mut st, n, "INV-1", 1_200),
        LedgerResult::Done { repeated: true, .. }
    ));
    assert_eq!(
        confirm(&mut st, n, "INV-2", 1_300),
        LedgerResult::Refused(Refusal::ConfirmedOther {
            reference: Some("INV-1".into())
        })
    );
    assert!(matches!(ledger(&st).state_of(n), NumberState::Confirmed(Some(r)) if r.reference == "INV-1"));
}

fn issue(st: &mut SetState, reference: &str, now_ms: u64) -> LedgerResult {
    run(
        st,
        LedgerCommand::Issue {
            key: KEY.into(),
            reference: reference.into(),
            now_ms,
        },
    )
}

#[test]
fn an_issue_hands_out_the_next_number_confirmed_and_a_retry_answers_the_same() {
    let mut st = created(60_000);
    let held = number(&reserve(&mut st, "r1", 1_000));
    let first = issue(&mut st, "INV-7", 1_100);
    assert_eq!(number(&first), held + 1);
    assert!(matches!(first, LedgerResult::Done { repeated: false, .. }));
    assert!(matches!(ledger(&st).state_of(2), NumberState::Confirmed(Some(r)) if r.reference == "INV-7"));
    // Its reply lost, the caller sends it again: the same number, nothing new handed out.
    let again = issue(&mut st, "INV-7", 1_200);
    assert_eq!((number(&again), ledger(&st).high), (2, 2));
    assert!(matches!(again, LedgerResult::Done { repeated: true, .. }));
    // Issued numbers join the confirmed runs around the held one.
    confirm(&mut st, held, "INV-6", 1_300);
    assert_eq!(number(&issue(&mut st, "INV-8", 1_400)), 3);
    assert_eq!(ledger(&st).confirmed.len(), 1, "{:?}", ledger(&st).confirmed);
    // An empty reference is a reserve's business, not an issue's.
    assert!(matches!(
        issue(&mut st, "", 1_500),
        LedgerResult::Refused(Refusal::Invalid(_))
    ));
}

#[test]
fn an_issue_waits_for_the_reconcile_of_a_restored_ledger_like_a_reserve() {
    let mut st = created(60_000);
    issue(&mut st, "INV-1", 1_000);
    st.ledgers.mark_restored();
    assert_eq!(issue(&mut st, "INV-2", 1_100), LedgerResult::Refused(Refusal::Restored));
    // The number the backup knows is still its reference's.
    assert_eq!(number(&issue(&mut st, "INV-1", 1_200)), 1);
}

#[test]
fn a_confirmed_number_is_never_released_or_voided() {
    let mut st = created(60_000);
    let n = number(&reserve(&mut st, "", 1_000));
    confirm(&mut st, n, "INV-1", 1_100);
    let release = LedgerCommand::Release {
        key: KEY.into(),
        number: n,
        note: String::new(),
        now_ms: 1_200,
    };
    assert_eq!(run(&mut st, release), LedgerResult::Refused(Refusal::Confirmed));
    let void = LedgerCommand::Void {
        key: KEY.into(),
        number: n,
        who: "ops".into(),
        note: "typo".into(),
        now_ms: 1_300,
    };
    assert_eq!(run(&mut st, void), LedgerResult::Refused(Refusal::Confirmed));
    // A hold long past: expiry leaves a confirmed number alone.
    run(&mut st, LedgerCommand::Expire { now_ms: 10_000_000 });
    assert!(matches!(ledger(&st).state_of(n), NumberState::Confirmed(_)));
}

#[test]
fn a_hold_past_its_deadline_is_voided_as_expired_and_never_handed_out_again() {
    let mut st = created(1_000);
    let n = number(&reserve(&mut st, "req", 10_000));
    assert_eq!(
        run(&mut st, LedgerCommand::Expire { now_ms: 10_999 }),
        LedgerResult::Count(0)
    );
    assert_eq!(
        run(&mut st, LedgerCommand::Expire { now_ms: 11_000 }),
        LedgerResult::Count(1)
    );
    assert!(matches!(
        ledger(&st).state_of(n),
        NumberState::Voided { void, .. } if void.reason == VoidReason::Expired && void.who == "app-1"
    ));
    // The request id no longer names it, a confirm is refused, and the next reserve is n + 1.
    assert!(matches!(
        confirm(&mut st, n, "late", 11_100),
        LedgerResult::Refused(Refusal::Voided { .. })
    ));
    assert_eq!(number(&reserve(&mut st, "req", 11_200)), n + 1);
}

#[test]
fn a_confirm_after_the_deadline_expires_the_number_before_any_tick() {
    let mut st = created(1_000);
    let n = number(&reserve(&mut st, "", 10_000));
    assert!(matches!(
        confirm(&mut st, n, "late", 11_000),
        LedgerResult::Refused(Refusal::Voided { .. })
    ));
    assert_eq!(ledger(&st).voided_count, 1);
}

#[test]
fn a_clock_that_steps_back_never_takes_a_ledger_back() {
    let mut st = created(1_000);
    let n = number(&reserve(&mut st, "", 50_000));
    // A later leader whose clock is behind: the ledger keeps its own highest time.
    let m = number(&reserve(&mut st, "", 1_000));
    assert_eq!(ledger(&st).held[&m].deadline_ms, 51_000);
    run(&mut st, LedgerCommand::Expire { now_ms: 2_000 });
    assert!(matches!(ledger(&st).state_of(n), NumberState::Held(_)));
}

#[test]
fn release_is_idempotent_and_keeps_the_number_in_the_gap_report() {
    let mut st = created(60_000);
    let n = number(&reserve(&mut st, "", 1_000));
    let release = LedgerCommand::Release {
        key: KEY.into(),
        number: n,
        note: "customer cancelled".into(),
        now_ms: 1_100,
    };
    assert!(matches!(
        run(&mut st, release.clone()),
        LedgerResult::Done { repeated: false, .. }
    ));
    assert!(matches!(
        run(&mut st, release),
        LedgerResult::Done { repeated: true, .. }
    ));
    match ledger(&st).state_of(n) {
        NumberState::Voided { void, .. } => {
            assert_eq!(
                (void.reason, void.note.as_str()),
                (VoidReason::Released, "customer cancelled")
            )
        }
        other => panic!("{other:?}"),
    }
}

#[test]
fn numbers_never_handed_out_are_refused() {
    let mut st = created(60_000);
    assert_eq!(
        confirm(&mut st, 1, "x", 1_000),
        LedgerResult::Refused(Refusal::NotIssued { high: 0 })
    );
    let none = run(
        &mut st,
        LedgerCommand::Reserve {
            key: "nobody".into(),
            holder: String::new(),
            request_id: String::new(),
            now_ms: 0,
        },
    );
    assert_eq!(none, LedgerResult::Refused(Refusal::NoLedger));
}

#[test]
fn a_create_repeated_answers_the_same_and_another_hold_is_refused() {
    let mut st = created(60_000);
    let again = run(
        &mut st,
        LedgerCommand::Create {
            key: KEY.into(),
            hold_ms: 60_000,
        },
    );
    assert!(matches!(again, LedgerResult::Done { repeated: true, .. }));
    let other = run(
        &mut st,
        LedgerCommand::Create {
            key: KEY.into(),
            hold_ms: 5_000,
        },
    );
    assert_eq!(other, LedgerResult::Refused(Refusal::OtherHold { hold_ms: 60_000 }));
    let bad = run(
        &mut st,
        LedgerCommand::Create {
            key: "k".into(),
            hold_ms: 10,
        },
    );
    assert!(matches!(bad, LedgerResult::Refused(Refusal::Invalid(_))));
}

#[test]
fn held_numbers_are_bounded() {
    let mut st = created(60_000);
    for _ in 0..MAX_HELD {
        reserve(&mut st, "", 1_000);
    }
    assert_eq!(reserve(&mut st, "", 1_000), LedgerResult::Refused(Refusal::TooManyHeld));
    assert_eq!(ledger(&st).high, MAX_HELD as u64);
}

#[test]
fn confirmed_runs_stay_few_and_references_are_bounded() {
    let mut st = created(60_000);
    let total = KEEP_REFERENCES as u64 + 500;
    for i in 1..=total {
        let n = number(&reserve(&mut st, "", 1_000));
        confirm(&mut st, n, &format!("INV-{i}"), 1_000);
    }
    let l = ledger(&st);
    assert_eq!((l.confirmed.len(), l.references.len()), (1, KEEP_REFERENCES));
    assert_eq!(l.settled(), total);
    // The oldest reference went; its number is still confirmed, and a confirm with any
    // reference is refused rather than guessed.
    assert_eq!(l.state_of(1), NumberState::Confirmed(None));
    assert_eq!(
        confirm(&mut st, 1, "INV-1", 2_000),
        LedgerResult::Refused(Refusal::ConfirmedOther { reference: None })
    );
}

#[test]
fn a_restored_ledger_refuses_reserves_until_reconciled_and_voids_the_tail() {
    let mut st = created(60_000);
    let n = number(&reserve(&mut st, "", 1_000));
    st.ledgers.mark_restored();
    assert_eq!(reserve(&mut st, "", 1_100), LedgerResult::Refused(Refusal::Restored));
    // Numbers the backup has are served at once.
    assert!(matches!(confirm(&mut st, n, "INV-1", 1_200), LedgerResult::Done { .. }));
    let below = LedgerCommand::Reconcile {
        key: KEY.into(),
        next: 1,
        who: "ops".into(),
        now_ms: 1_300,
    };
    assert_eq!(
        run(&mut st, below),
        LedgerResult::Refused(Refusal::ReconcileBelow { next: 2 })
    );
    let reconcile = LedgerCommand::Reconcile {
        key: KEY.into(),
        next: 1_000_001,
        who: "ops".into(),
        now_ms: 1_400,
    };
    assert!(matches!(run(&mut st, reconcile), LedgerResult::Done { .. }));
    let l = ledger(&st);
    assert_eq!((l.voided.len(), l.voided_count), (1, 999_999));
    assert_eq!(number(&reserve(&mut st, "", 1_500)), 1_000_001);
}

#[test]
fn a_section_the_set_does_not_own_refuses_every_ledger_call() {
    let mut st = created(60_000);
    let section = ledger(&st).section;
    st.ranges.set(section, SectionId(section.0 + 1), None);
    assert_eq!(reserve(&mut st, "", 1_000), LedgerResult::Refused(Refusal::NotOwned));
}

#[test]
fn a_state_without_ledgers_encodes_as_before_and_one_with_them_round_trips() {
    let (plain, _) = set_with(&[1]);
    // Without ledgers: the bytes of the derived encoding of the same fields (no trailing field).
    let bytes = postcard::to_allocvec(&plain).unwrap();
    let mut with_one = plain.clone();
    run(
        &mut with_one,
        LedgerCommand::Create {
            key: KEY.into(),
            hold_ms: 0,
        },
    );
    let longer = postcard::to_allocvec(&with_one).unwrap();
    assert!(longer.len() > bytes.len() && longer.starts_with(&bytes[..bytes.len() - 1]));
    let back: SetState = crate::storage::sm_store::decode_padded(&longer).unwrap();
    assert_eq!(back, with_one);
    let back: SetState = crate::storage::sm_store::decode_padded(&bytes).unwrap();
    assert_eq!(back, plain);
}

/// An initialized set 1 that owns nothing yet: a move's target.
fn empty_set_1() -> SetState {
    let mut p = crate::domain::testing::small_params();
    (p.set_id, p.section_begin, p.section_end) = (1, 0, 0);
    let mut st = SetState::default();
    st.apply(&Command::Init(p), false);
    st
}

/// A move of the ledger's range from set 0 to an empty set 1, with every step a driver sends.
#[test]
fn a_ledger_travels_with_its_range_and_goes_on_where_it_stopped() {
    use crate::domain::moves::RangeCommand;
    let mut source = created(60_000);
    let a = number(&reserve(&mut source, "", 1_000));
    confirm(&mut source, a, "INV-1", 1_000);
    let held = number(&reserve(&mut source, "", 1_000));
    let section = ledger(&source).section;
    let span = Span {
        begin: section,
        end: SectionId(section.0 + 1),
    };
    let mut target = empty_set_1();
    let op = 7;
    let range = |st: &mut SetState, c: RangeCommand| st.apply(&Command::Range(c), false);
    range(&mut target, RangeCommand::Import { op, span, from_set: 0 });
    range(&mut source, RangeCommand::Freeze { op, span, to_set: 1 });
    // Frozen: the source takes no ledger call, and its expiry leaves the ledger as exported.
    assert_eq!(
        reserve(&mut source, "", 1_100),
        LedgerResult::Refused(Refusal::NotOwned)
    );
    run(&mut source, LedgerCommand::Expire { now_ms: 10_000_000 });
    let exported = source.ledgers.of_span(span);
    assert_eq!(exported.len(), 1);
    // A target that does not import the range refuses the ledgers.
    let wrong_op = LedgerCommand::Install {
        op: op + 1,
        span,
        ledgers: exported.clone(),
    };
    assert_eq!(run(&mut target, wrong_op), LedgerResult::Refused(Refusal::NotOwned));
    let install = LedgerCommand::Install {
        op,
        span,
        ledgers: exported,
    };
    assert_eq!(run(&mut target, install.clone()), LedgerResult::Count(1));
    // Repeated by a driver that died after sending it: the same ledgers again.
    assert_eq!(run(&mut target, install), LedgerResult::Count(1));
    range(&mut source, RangeCommand::Seal { op, span });
    let ceilings = vec![0; 1];
    range(&mut target, RangeCommand::Install { op, span, ceilings });
    range(
        &mut source,
        RangeCommand::Tombstone {
            op,
            span,
            to_set: 1,
            map_version: 2,
        },
    );
    assert!(source.ledgers.is_empty(), "the source forgets what the target has");
    // A driver that died after the range's install sends the ledgers again: taken as done, and
    // what the target changed since stays.
    let n = number(&reserve(&mut target, "", 1_900));
    let again = LedgerCommand::Install {
        op,
        span,
        ledgers: Vec::new(),
    };
    assert_eq!(run(&mut target, again), LedgerResult::Count(0));
    assert_eq!(ledger(&target).high, n);
    assert!(matches!(ledger(&target).state_of(held), NumberState::Held(_)));
    assert_eq!(number(&reserve(&mut target, "", 2_000)), held + 2);
    assert!(matches!(
        confirm(&mut target, held, "INV-2", 2_000),
        LedgerResult::Done { .. }
    ));
}

#[test]
fn a_cancelled_import_forgets_the_ledgers_it_took() {
    use crate::domain::moves::RangeCommand;
    let source = created(60_000);
    let section = ledger(&source).section;
    let span = Span {
        begin: section,
        end: SectionId(section.0 + 1),
    };
    let mut target = empty_set_1();
    target.apply(
        &Command::Range(RangeCommand::Import {
            op: 3,
            span,
            from_set: 0,
        }),
        false,
    );
    let install = LedgerCommand::Install {
        op: 3,
        span,
        ledgers: source.ledgers.of_span(span),
    };
    assert_eq!(run(&mut target, install), LedgerResult::Count(1));
    target.apply(&Command::Range(RangeCommand::Cancel { op: 3, span }), false);
    assert!(target.ledgers.is_empty());
}

/// The commands a ledger writes to the log, and a ledger's snapshot record, as the code of
/// 2026-12-02 encodes them: an entry in a log (or a snapshot) must read the same forever, so a
/// change of these types fails here (a new variant or field goes last, see `command.rs`).
#[test]
fn ledger_entries_and_records_encode_as_first_written() {
    let hex = |c: &Command| {
        postcard::to_stdvec(c)
            .unwrap()
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect::<String>()
    };
    let key = || "k".to_string();
    let pins = [
        (
            LedgerCommand::Create {
                key: key(),
                hold_ms: 1_000,
            },
            "0d00016be807",
        ),
        (
            LedgerCommand::Reserve {
                key: key(),
                holder: "h".into(),
                request_id: "r".into(),
                now_ms: 5,
            },
            "0d01016b0168017205",
        ),
        (
            LedgerCommand::Confirm {
                key: key(),
                number: 3,
                reference: "x".into(),
                now_ms: 6,
            },
            "0d02016b03017806",
        ),
        (
            LedgerCommand::Release {
                key: key(),
                number: 3,
                note: String::new(),
                now_ms: 7,
            },
            "0d03016b030007",
        ),
        (
            LedgerCommand::Void {
                key: key(),
                number: 3,
                who: "o".into(),
                note: String::new(),
                now_ms: 8,
            },
            "0d04016b03016f0008",
        ),
        (
            LedgerCommand::Reconcile {
                key: key(),
                next: 9,
                who: "o".into(),
                now_ms: 9,
            },
            "0d05016b09016f09",
        ),
        (LedgerCommand::Expire { now_ms: 10 }, "0d060a"),
        (
            LedgerCommand::Issue {
                key: key(),
                reference: "x".into(),
                now_ms: 11,
            },
            "0d08016b01780b",
        ),
    ];
    for (cmd, bytes) in pins {
        assert_eq!(hex(&Command::Ledger(cmd.clone())), bytes, "{cmd:?}");
    }
    let mut st = created(1_000);
    let n = number(&reserve(&mut st, "r", 5));
    confirm(&mut st, n, "x", 6);
    reserve(&mut st, "", 7);
    run(&mut st, LedgerCommand::Expire { now_ms: 2_000 });
    let record = postcard::to_stdvec(ledger(&st)).unwrap();
    let record: String = record.iter().map(|b| format!("{b:02x}")).collect();
    assert_eq!(
        record,
        "08e807020001020201056170702d3100d00f010101010101780600010100010000d00f00"
    );
}
