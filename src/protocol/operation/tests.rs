use super::*;
use Side::{Source as S, Target as T};

type Script<'a> = &'a [(Step<&'static str, &'static str>, Answer<&'static str>)];

/// Runs `op` in `phase`, checking that it asks for each scripted step in turn and feeding
/// it the scripted answer; returns the outcome.
fn run(
    phase: Phase,
    op: Operation<&'static str, &'static str>,
    script: Script,
) -> Outcome<&'static str> {
    let mut machine = OperationMachine::new(phase, op);
    let mut next = machine.next(None).unwrap();
    for (i, (step, answer)) in script.iter().enumerate() {
        match next {
            Next::Do(asked) => assert_eq!(&asked, step, "step {i} in {phase}"),
            Next::Done(outcome) => panic!("done with {outcome:?} before step {i}"),
        }
        next = machine.next(Some(answer.clone())).unwrap();
    }
    match next {
        Next::Done(outcome) => outcome,
        Next::Do(step) => panic!("asked for {step:?} after the script"),
    }
}

#[test]
fn reverting_mirrors_before_reporting_whatever_the_answer() {
    let cases: &[(Operation<_, _>, Script, Outcome<_>)] = &[
        (
            Operation::Update("u"),
            &[
                (Step::UpdateLive(T, "u"), Answer::Matched(true)),
                (Step::MirrorToSource, Answer::Matched(false)),
            ],
            Outcome::Changed(true),
        ),
        (
            Operation::Get,
            &[
                (Step::Find(T), Answer::Found(Found::Live("d"))),
                (Step::MirrorToSource, Answer::Matched(true)),
            ],
            Outcome::Read(Some("d")),
        ),
        (
            Operation::Insert("d"),
            &[
                (Step::Find(T), Answer::Found(Found::Live("e"))),
                (Step::MirrorToSource, Answer::Matched(true)),
            ],
            Outcome::Duplicate,
        ),
        (
            Operation::Delete,
            &[
                (Step::Find(T), Answer::Found(Found::Live("e"))),
                (
                    Step::ReplaceLive(T, Payload::Tombstone),
                    Answer::Matched(true),
                ),
                (Step::MirrorToSource, Answer::Matched(true)),
            ],
            Outcome::Changed(true),
        ),
    ];
    for (op, script, outcome) in cases {
        assert_eq!(
            run(Phase::Reverting, op.clone(), script),
            *outcome,
            "{op:?}"
        );
    }
}

#[test]
fn after_a_rollback_source_tombstones_count_as_absent() {
    let cases: &[(Phase, Operation<_, _>, Script, Outcome<_>)] = &[
        (
            Phase::RolledBack,
            Operation::Insert("d"),
            &[
                (Step::Insert(S, Payload::App("d")), Answer::DuplicateKey),
                (Step::Find(S), Answer::Found(Found::Tombstone)),
                (
                    Step::ReplaceTombstone(S, Payload::App("d")),
                    Answer::Matched(true),
                ),
            ],
            Outcome::Inserted,
        ),
        (
            Phase::RolledBack,
            Operation::Insert("d"),
            &[
                (Step::Insert(S, Payload::App("d")), Answer::DuplicateKey),
                (Step::Find(S), Answer::Found(Found::Live("e"))),
            ],
            Outcome::Duplicate,
        ),
        (
            Phase::RolledBack,
            Operation::Replace {
                doc: "d",
                upsert: true,
            },
            &[
                (
                    Step::ReplaceLive(S, Payload::App("d")),
                    Answer::Matched(false),
                ),
                (Step::Find(S), Answer::Found(Found::Tombstone)),
                (
                    Step::ReplaceTombstone(S, Payload::App("d")),
                    Answer::Matched(true),
                ),
            ],
            // The document is created again: an upsert's insert.
            Outcome::Inserted,
        ),
        // A delete after a rollback leaves a source tombstone: a late mirror of an older
        // target image must not bring the document back before the purge.
        (
            Phase::RolledBack,
            Operation::Delete,
            &[(
                Step::ReplaceLive(S, Payload::Tombstone),
                Answer::Matched(false),
            )],
            Outcome::Changed(false),
        ),
        // In the revert switch a read carries the target's image to the source first.
        (
            Phase::RevertSwitch,
            Operation::Get,
            &[
                (Step::MirrorToSource, Answer::Matched(false)),
                (Step::Find(S), Answer::Found(Found::Tombstone)),
            ],
            Outcome::Read(None),
        ),
    ];
    for (phase, op, script, outcome) in cases {
        assert_eq!(run(*phase, op.clone(), script), *outcome, "{phase} {op:?}");
    }
}

#[test]
fn a_completed_migration_deletes_without_a_tombstone() {
    let script: Script = &[(Step::DeleteLive(T), Answer::Matched(true))];
    assert_eq!(
        run(Phase::Completed, Operation::Delete, script),
        Outcome::Changed(true)
    );
    let script: Script = &[
        (Step::Find(T), Answer::Found(Found::Live("d"))),
        (
            Step::ReplaceLive(T, Payload::Tombstone),
            Answer::Matched(true),
        ),
    ];
    assert_eq!(
        run(Phase::Cleanup, Operation::Delete, script),
        Outcome::Changed(true)
    );
}

#[test]
fn an_interrupted_operation_knows_whether_it_wrote() {
    let mut m: OperationMachine<&str, &str> =
        OperationMachine::new(Phase::Backfill, Operation::Delete);
    assert_eq!(m.interrupted(), Interrupted::NothingApplied);
    assert_eq!(m.next(None).unwrap(), Next::Do(Step::Find(T)));
    assert_eq!(m.interrupted(), Interrupted::NothingApplied);
    let tombstone = m.next(Some(Answer::Found(Found::Live("d")))).unwrap();
    assert_eq!(
        tombstone,
        Next::Do(Step::ReplaceLive(T, Payload::Tombstone))
    );
    // Asked for but not sent: nothing happened. Sent without an answer: it may have.
    assert_eq!(m.interrupted(), Interrupted::NothingApplied);
    assert_eq!(m.interrupted_in_flight(), Interrupted::MayHaveApplied);
    // Answered: it happened, whatever comes next.
    let mut m2 = m.clone();
    assert!(m2.next(Some(Answer::Matched(false))).is_ok());
    assert_eq!(m2.interrupted(), Interrupted::MayHaveApplied);
}

#[test]
fn a_condition_that_fails_on_the_document_holding_the_id_changes_nothing() {
    let upsert = |u| Operation::Upsert {
        update: u,
        insert: "new",
    };
    let cases: &[(Phase, Operation<_, _>, Script, Outcome<_>)] = &[
        // The target's document does not match: the source's stale match must not be
        // tombstoned or read.
        (
            Phase::Backfill,
            Operation::Delete,
            &[(Step::Find(T), Answer::Found(Found::Unmatched))],
            Outcome::Changed(false),
        ),
        (
            Phase::Backfill,
            Operation::Delete,
            &[
                (Step::Find(T), Answer::Found(Found::Absent)),
                (Step::Find(S), Answer::Found(Found::Unmatched)),
            ],
            Outcome::Changed(false),
        ),
        (
            Phase::Backfill,
            Operation::Get,
            &[(Step::Find(T), Answer::Found(Found::Unmatched))],
            Outcome::Read(None),
        ),
        // A conditional tombstone that lost a race with a write that made the document
        // stop matching: looked at again, then nothing.
        (
            Phase::NewWrites,
            Operation::Delete,
            &[
                (Step::Find(T), Answer::Found(Found::Live("d"))),
                (
                    Step::ReplaceLive(T, Payload::Tombstone),
                    Answer::Matched(false),
                ),
                (Step::Find(T), Answer::Found(Found::Unmatched)),
            ],
            Outcome::Changed(false),
        ),
        // A replace with upsert whose condition fails on the id's document would insert
        // a second document of the id: a duplicate, as MongoDB answers it.
        (
            Phase::Backfill,
            Operation::Replace {
                doc: "d",
                upsert: true,
            },
            &[
                (
                    Step::ReplaceLive(T, Payload::App("d")),
                    Answer::Matched(false),
                ),
                (Step::Find(T), Answer::Found(Found::Unmatched)),
            ],
            Outcome::Duplicate,
        ),
        (
            Phase::DualRead,
            Operation::Replace {
                doc: "d",
                upsert: false,
            },
            &[(
                Step::ReplaceLive(S, Payload::App("d")),
                Answer::Matched(false),
            )],
            Outcome::Changed(false),
        ),
        // An upsert whose update matches nothing where a live document holds the id:
        // tried once more, then a duplicate.
        (
            Phase::NewReads,
            upsert("u"),
            &[
                (Step::UpdateLive(T, "u"), Answer::Matched(false)),
                (Step::Find(T), Answer::Found(Found::Unmatched)),
                (Step::UpdateLive(T, "u"), Answer::Matched(false)),
                (Step::Find(T), Answer::Found(Found::Unmatched)),
            ],
            Outcome::Duplicate,
        ),
    ];
    for (phase, op, script, outcome) in cases {
        assert_eq!(run(*phase, op.clone(), script), *outcome, "{phase} {op:?}");
    }
}

#[test]
fn an_upsert_updates_what_matches_and_inserts_only_where_nothing_holds_the_id() {
    let upsert = Operation::Upsert {
        update: "u",
        insert: "new",
    };
    let cases: &[(Phase, Script, Outcome<_>)] = &[
        // Only in the source: copied, then updated in the target.
        (
            Phase::Backfill,
            &[
                (Step::UpdateLive(T, "u"), Answer::Matched(false)),
                (Step::Find(S), Answer::Found(Found::Live("old"))),
                (Step::Insert(T, Payload::Copy("old")), Answer::Inserted),
                (Step::UpdateLive(T, "u"), Answer::Matched(true)),
            ],
            Outcome::Changed(true),
        ),
        // Held nowhere: inserted along the insert's path, which looks in both sides.
        (
            Phase::Backfill,
            &[
                (Step::UpdateLive(T, "u"), Answer::Matched(false)),
                (Step::Find(S), Answer::Found(Found::Absent)),
                (Step::Find(T), Answer::Found(Found::Absent)),
                (Step::Find(S), Answer::Found(Found::Absent)),
                (Step::Insert(T, Payload::App("new")), Answer::Inserted),
            ],
            Outcome::Inserted,
        ),
        // Deleted: the new document replaces the tombstone.
        (
            Phase::Cleanup,
            &[
                (Step::UpdateLive(T, "u"), Answer::Matched(false)),
                (Step::Find(T), Answer::Found(Found::Tombstone)),
                (
                    Step::ReplaceTombstone(T, Payload::App("new")),
                    Answer::Matched(true),
                ),
            ],
            Outcome::Inserted,
        ),
        // A concurrent upsert inserted the id between the update and the insert: the
        // update is tried again and now matches.
        (
            Phase::Completed,
            &[
                (Step::UpdateLive(T, "u"), Answer::Matched(false)),
                (Step::Find(T), Answer::Found(Found::Absent)),
                (Step::Insert(T, Payload::App("new")), Answer::DuplicateKey),
                (Step::UpdateLive(T, "u"), Answer::Matched(true)),
            ],
            Outcome::Changed(true),
        ),
        // Before the switch: in the source, plainly.
        (
            Phase::DualRead,
            &[
                (Step::UpdateLive(S, "u"), Answer::Matched(false)),
                (Step::Insert(S, Payload::App("new")), Answer::Inserted),
            ],
            Outcome::Inserted,
        ),
        (
            Phase::Planned,
            &[(Step::UpdateLive(S, "u"), Answer::Matched(true))],
            Outcome::Changed(true),
        ),
        // Rolling back: mirrored before it reports, like every write.
        (
            Phase::Reverting,
            &[
                (Step::UpdateLive(T, "u"), Answer::Matched(true)),
                (Step::MirrorToSource, Answer::Matched(true)),
            ],
            Outcome::Changed(true),
        ),
    ];
    for (phase, script, outcome) in cases {
        assert_eq!(run(*phase, upsert.clone(), script), *outcome, "{phase}");
    }
    assert_eq!(run(Phase::WriteSwitch, upsert, &[]), Outcome::Held);
}

#[test]
fn writes_are_held_in_both_switches() {
    for phase in [Phase::WriteSwitch, Phase::RevertSwitch] {
        assert_eq!(run(phase, Operation::Delete, &[]), Outcome::Held, "{phase}");
    }
}
