//! The phase machine: which phase a migration may move to next, and which gate guards each
//! move. Pure: it knows nothing of Postgres, MongoDB or the terminal. `store::migrations` is the
//! only caller that persists a change, and it does so only after [`plan`] has approved it.
//!
//! `paused` and `failed` are statuses layered over the phase rather than phases of their own:
//! routers must keep following the phase (a paused backfill still writes to the target), while
//! workers stop taking work. The phase therefore never changes on pause, resume or failure, but
//! every persisted change still bumps the epoch and lands in the event log.

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

/// Where a migration stands. The order of the variants is the forward order of a migration,
/// followed by the rollback path.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Phase {
    Planned,
    DualRead,
    WriteSwitch,
    NewWrites,
    Backfill,
    Reconcile,
    NewReads,
    Cleanup,
    Completed,
    Reverting,
    RevertSwitch,
    RolledBack,
}

/// Which layout something addresses: the document's location in the source or in the target
/// routing version.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Side {
    Source,
    Target,
}

/// Where a router reads in a phase.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum ReadPath {
    Source,
    TargetThenSource,
    Target,
}

/// Where a router writes in a phase.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum WritePath {
    Source,
    /// The write-switch critical section: new writes wait (bounded), in-flight ones drain.
    Held,
    Target,
    /// Rolling back: the target stays authoritative and every write is mirrored to the source.
    TargetMirroredToSource,
}

/// A named condition that must hold before a move is persisted. The store evaluates each
/// gate inside the transaction that makes the move.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Gate {
    /// Every router with a live lease has acknowledged the current epoch.
    RoutersAcknowledged,
    /// Every backfill partition is done and no dead letter is unresolved.
    BackfillComplete,
    /// A passing reconciliation run finished after the backfill did.
    ReconciliationPassed,
    /// Every cleanup partition is done.
    CleanupComplete,
    /// Every document the application wrote to the target is back in the source.
    RevertComplete,
    /// No write that bypassed the router is unresolved, and every location's change stream
    /// was read to its end lately (`crate::bypass`).
    BypassesResolved,
}

impl Gate {
    pub const ALL: [Gate; 6] = [
        Gate::RoutersAcknowledged,
        Gate::BackfillComplete,
        Gate::ReconciliationPassed,
        Gate::CleanupComplete,
        Gate::RevertComplete,
        Gate::BypassesResolved,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            Gate::RoutersAcknowledged => "routers_acknowledged",
            Gate::BackfillComplete => "backfill_complete",
            Gate::ReconciliationPassed => "reconciliation_passed",
            Gate::CleanupComplete => "cleanup_complete",
            Gate::RevertComplete => "revert_complete",
            Gate::BypassesResolved => "bypasses_resolved",
        }
    }
}

impl fmt::Display for Gate {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl Phase {
    pub const ALL: [Phase; 12] = [
        Phase::Planned,
        Phase::DualRead,
        Phase::WriteSwitch,
        Phase::NewWrites,
        Phase::Backfill,
        Phase::Reconcile,
        Phase::NewReads,
        Phase::Cleanup,
        Phase::Completed,
        Phase::Reverting,
        Phase::RevertSwitch,
        Phase::RolledBack,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            Phase::Planned => "planned",
            Phase::DualRead => "dual_read",
            Phase::WriteSwitch => "write_switch",
            Phase::NewWrites => "new_writes",
            Phase::Backfill => "backfill",
            Phase::Reconcile => "reconcile",
            Phase::NewReads => "new_reads",
            Phase::Cleanup => "cleanup",
            Phase::Completed => "completed",
            Phase::Reverting => "reverting",
            Phase::RevertSwitch => "revert_switch",
            Phase::RolledBack => "rolled_back",
        }
    }

    /// The phases this one may move to. Exhaustive on purpose: a new phase does not compile
    /// until its moves are decided.
    pub fn next(self) -> &'static [Phase] {
        use Phase::*;
        match self {
            // Nothing was written to the target yet, so abandoning is a plain move.
            Planned => &[DualRead, RolledBack],
            DualRead => &[WriteSwitch, Planned],
            // Back to dual_read is how a write switch that timed out is undone.
            WriteSwitch => &[NewWrites, DualRead],
            NewWrites => &[Backfill, Reverting],
            Backfill => &[Reconcile, Reverting],
            Reconcile => &[NewReads, Reverting],
            // The source is intact until cleanup deletes from it, so rollback is still possible.
            NewReads => &[Cleanup, Reverting],
            // Once cleanup deletes from the source there is no way back.
            Cleanup => &[Completed],
            Completed => &[],
            Reverting => &[RevertSwitch],
            RevertSwitch => &[RolledBack, Reverting],
            RolledBack => &[],
        }
    }

    /// Whether some sequence of allowed moves leads from `self` to `to` (`self` itself
    /// excluded): `cleanup` does not lead to `rolled_back`, `new_reads` does.
    pub fn leads_to(self, to: Phase) -> bool {
        let mut seen = vec![self];
        let mut next: Vec<Phase> = self.next().to_vec();
        while let Some(p) = next.pop() {
            if p == to {
                return true;
            }
            if !seen.contains(&p) {
                seen.push(p);
                next.extend_from_slice(p.next());
            }
        }
        false
    }

    /// Gates that must hold to move from `self` to `to`. Only meaningful for allowed moves.
    pub fn gates_to(self, to: Phase) -> &'static [Gate] {
        use Gate::*;
        use Phase::*;
        match (self, to) {
            // Leaving a phase whose router behaviour had to be acknowledged first.
            (DualRead, WriteSwitch) | (WriteSwitch, NewWrites) | (NewWrites, Backfill) => {
                &[RoutersAcknowledged]
            }
            (Backfill, Reconcile) => &[BackfillComplete],
            // A write that bypassed the router after the write switch is lost to the new
            // reads, and to cleanup: it must be resolved first (before reconciliation, whose
            // findings it may explain).
            (Reconcile, NewReads) => &[BypassesResolved, ReconciliationPassed],
            (NewReads, Cleanup) => &[RoutersAcknowledged, BypassesResolved],
            (Cleanup, Completed) => &[CleanupComplete, BypassesResolved],
            (Reverting, RevertSwitch) => &[RoutersAcknowledged, RevertComplete],
            (RevertSwitch, RolledBack) => &[RoutersAcknowledged, RevertComplete],
            _ => &[],
        }
    }

    pub fn is_terminal(self) -> bool {
        self.next().is_empty()
    }

    /// Whether a migration in `self` has reached `wanted`, for those who wait for a phase:
    /// reached or passed on its path (the forward path up to `completed`, or the rollback
    /// path from `reverting` to `rolled_back`), or never to be reached, once it is on the
    /// other path (rolled back while waiting for `completed`, say). A move back on the same
    /// path (the write switch timing out) can only follow a phase at or before `wanted`, so
    /// "passed" holds for good.
    pub fn reached(self, wanted: Phase) -> Reached {
        use Phase::*;
        let rollback = |p: Phase| matches!(p, Reverting | RevertSwitch | RolledBack);
        match (rollback(self), rollback(wanted)) {
            (false, false) | (true, true) if self >= wanted => Reached::Yes,
            (false, false) | (true, true) => Reached::NotYet,
            // Nothing leads from the rollback path back to the forward one.
            (true, false) => Reached::Never,
            // A completed migration never rolls back; any other may still.
            (false, true) if self == Completed => Reached::Never,
            (false, true) => Reached::NotYet,
        }
    }

    /// Moves that undo progress rather than make it; allowed while a migration has failed.
    pub fn is_rollback_move(self, to: Phase) -> bool {
        matches!(
            (self, to),
            (Phase::Planned, Phase::RolledBack)
                | (Phase::DualRead, Phase::Planned)
                | (Phase::WriteSwitch, Phase::DualRead)
                | (Phase::NewWrites, Phase::Reverting)
                | (Phase::Backfill, Phase::Reverting)
                | (Phase::Reconcile, Phase::Reverting)
                | (Phase::NewReads, Phase::Reverting)
                | (Phase::RevertSwitch, Phase::Reverting)
        )
    }

    pub fn read_path(self) -> ReadPath {
        use Phase::*;
        match self {
            // `revert_switch` reads the source (after carrying the target's image of the id to
            // it): once `reverting` is acknowledged and the revert copy is done, the source
            // holds everything anyone was told (see `protocol`), and a router still in
            // `revert_switch` after the move to `rolled_back` must see the writes that move
            // lets into the source.
            Planned | RolledBack | RevertSwitch => ReadPath::Source,
            DualRead | WriteSwitch | NewWrites | Backfill | Reconcile | Reverting => {
                ReadPath::TargetThenSource
            }
            NewReads | Cleanup | Completed => ReadPath::Target,
        }
    }

    pub fn write_path(self) -> WritePath {
        use Phase::*;
        match self {
            Planned | DualRead | RolledBack => WritePath::Source,
            WriteSwitch | RevertSwitch => WritePath::Held,
            NewWrites | Backfill | Reconcile | NewReads | Cleanup | Completed => WritePath::Target,
            Reverting => WritePath::TargetMirroredToSource,
        }
    }

    /// Whether routers behave differently in `to` than in `self`, so that the driver must
    /// wait for every live router to acknowledge the new epoch before relying on it.
    pub fn changes_router_behaviour(self, to: Phase) -> bool {
        self.read_path() != to.read_path() || self.write_path() != to.write_path()
    }
}

impl fmt::Display for Phase {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The answer of [`Phase::reached`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Reached {
    Yes,
    NotYet,
    /// The migration is on the other path (or ended): the phase will not come.
    Never,
}

/// A phase name that is not one of [`Phase::ALL`].
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown phase {given:?}; phases are: {}", phase_list(&Phase::ALL))]
pub struct UnknownPhase {
    pub given: String,
}

/// A stored phase: `migrations.phase` (its CHECK allows exactly the names of [`Phase::ALL`]),
/// or a copy of it (`bypasses.phase`, written from the migration's row).
impl TryFrom<String> for Phase {
    type Error = UnknownPhase;

    fn try_from(text: String) -> Result<Phase, UnknownPhase> {
        text.parse()
    }
}

impl FromStr for Phase {
    type Err = UnknownPhase;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Phase::ALL
            .into_iter()
            .find(|p| p.as_str() == s)
            .ok_or_else(|| UnknownPhase {
                given: s.to_owned(),
            })
    }
}

fn phase_list(phases: &[Phase]) -> String {
    if phases.is_empty() {
        return "none (the migration has ended)".to_owned();
    }
    phases
        .iter()
        .map(|p| p.as_str())
        .collect::<Vec<_>>()
        .join(", ")
}

/// What the store knows of a migration's position, as far as the phase machine cares.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MigrationState {
    pub phase: Phase,
    pub epoch: i64,
    pub paused: bool,
    pub failure: Option<String>,
    /// A rolled-back migration whose routers no longer need source tombstones: no router in
    /// `revert_switch` is left to mirror (see [`Action::Seal`]).
    pub sealed: bool,
}

/// Something an operator or a worker asks of a migration.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Action {
    Advance(Phase),
    Pause,
    Resume,
    Fail(String),
    /// Once every router acknowledged `rolled_back`, the driver seals the migration: the
    /// phase stays, the epoch moves on, and routers that acknowledge it delete without source
    /// tombstones, which the driver then purges.
    Seal,
}

impl Action {
    pub fn kind(&self) -> &'static str {
        match self {
            Action::Advance(_) => "advance",
            Action::Pause => "pause",
            Action::Resume => "resume",
            Action::Fail(_) => "fail",
            Action::Seal => "seal",
        }
    }
}

/// An approved change: the state after it and the gates that must hold for it to persist.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Change {
    pub from: MigrationState,
    pub to: MigrationState,
    pub gates: &'static [Gate],
}

/// Why a change is refused. Each message names what would be allowed instead.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum MoveError {
    #[error("cannot move from {from} to {to}; allowed from {from}: {}", phase_list(.from.next()))]
    NotAllowed { from: Phase, to: Phase },
    #[error("the migration is already in {0}")]
    AlreadyThere(Phase),
    #[error("the migration is paused; resume it before advancing")]
    Paused,
    #[error("the migration failed ({reason}); resume it after fixing the cause, or roll back ({})", phase_list(&rollback_moves(*.phase)))]
    Failed { phase: Phase, reason: String },
    #[error("the migration has ended in {0}; nothing can change it")]
    Ended(Phase),
    #[error("the migration is not paused")]
    NotPaused,
    #[error("the migration is already paused")]
    AlreadyPaused,
    #[error("only a migration that rolled back is sealed, once; this one is in {0}")]
    NotSealable(Phase),
}

fn rollback_moves(from: Phase) -> Vec<Phase> {
    from.next()
        .iter()
        .copied()
        .filter(|to| from.is_rollback_move(*to))
        .collect()
}

/// Why a rollback cannot start from a phase.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum RollbackRefused {
    #[error("it is in {0}: cleanup has deleted moved documents from the source, so a rollback would lose them")]
    CleanupStarted(Phase),
    #[error("it is already rolling back ({0}); continue with `advance --to {next}`", next = .0.next().first().map_or("-", |p| p.as_str()))]
    AlreadyRollingBack(Phase),
}

/// The moves a rollback makes from `phase`, in order: before any target write it only goes
/// back (to `planned`, or ends in `rolled_back` from `planned`); from `new_writes` to
/// `new_reads` it enters `reverting`, where the application's target writes are copied back
/// before `revert_switch` ends it. Exhaustive: a new phase does not compile until decided.
pub fn rollback_path(phase: Phase) -> Result<&'static [Phase], RollbackRefused> {
    match phase {
        Phase::Planned => Ok(&[Phase::RolledBack]),
        Phase::DualRead => Ok(&[Phase::Planned]),
        Phase::WriteSwitch => Ok(&[Phase::DualRead, Phase::Planned]),
        Phase::NewWrites | Phase::Backfill | Phase::Reconcile | Phase::NewReads => {
            Ok(&[Phase::Reverting])
        }
        Phase::Cleanup | Phase::Completed => Err(RollbackRefused::CleanupStarted(phase)),
        Phase::Reverting | Phase::RevertSwitch | Phase::RolledBack => {
            Err(RollbackRefused::AlreadyRollingBack(phase))
        }
    }
}

/// Decides whether `action` may happen in `state`, and what the state becomes. Every persisted
/// change bumps the epoch by one, whatever it is.
pub fn plan(state: &MigrationState, action: &Action) -> Result<Change, MoveError> {
    if let Action::Seal = action {
        if state.phase != Phase::RolledBack || state.sealed {
            return Err(MoveError::NotSealable(state.phase));
        }
        let to = MigrationState {
            epoch: state.epoch + 1,
            sealed: true,
            ..state.clone()
        };
        return Ok(Change {
            from: state.clone(),
            to,
            gates: &[Gate::RoutersAcknowledged],
        });
    }
    if state.phase.is_terminal() {
        return Err(MoveError::Ended(state.phase));
    }
    let mut to = MigrationState {
        epoch: state.epoch + 1,
        ..state.clone()
    };
    let mut gates: &'static [Gate] = &[];
    match action {
        Action::Advance(target) => {
            if *target == state.phase {
                return Err(MoveError::AlreadyThere(state.phase));
            }
            if !state.phase.next().contains(target) {
                return Err(MoveError::NotAllowed {
                    from: state.phase,
                    to: *target,
                });
            }
            let rollback = state.phase.is_rollback_move(*target);
            if let Some(reason) = &state.failure {
                if !rollback {
                    return Err(MoveError::Failed {
                        phase: state.phase,
                        reason: reason.clone(),
                    });
                }
            }
            if state.paused && !rollback {
                return Err(MoveError::Paused);
            }
            to.phase = *target;
            // A rollback clears the failure it answers; the pause stays until resumed.
            if rollback {
                to.failure = None;
            }
            gates = state.phase.gates_to(*target);
        }
        Action::Pause => {
            if state.paused {
                return Err(MoveError::AlreadyPaused);
            }
            to.paused = true;
        }
        Action::Resume => {
            if !state.paused && state.failure.is_none() {
                return Err(MoveError::NotPaused);
            }
            to.paused = false;
            to.failure = None;
        }
        Action::Fail(reason) => {
            to.failure = Some(reason.clone());
        }
        Action::Seal => unreachable!("handled above"),
    }
    Ok(Change {
        from: state.clone(),
        to,
        gates,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rollback_is_reachable_until_cleanup_and_from_the_rollback_path_itself() {
        use Phase::*;
        let can: Vec<Phase> = Phase::ALL
            .iter()
            .copied()
            .filter(|p| p.leads_to(RolledBack))
            .collect();
        assert_eq!(
            can,
            [
                Planned,
                DualRead,
                WriteSwitch,
                NewWrites,
                Backfill,
                Reconcile,
                NewReads,
                Reverting,
                RevertSwitch
            ]
        );
        assert!(!Cleanup.leads_to(RolledBack));
        assert!(Cleanup.leads_to(Completed));
        assert!(
            !Completed.leads_to(Completed),
            "a phase leads nowhere by itself"
        );
        assert!(
            DualRead.leads_to(DualRead),
            "dual_read -> write_switch -> dual_read"
        );
    }

    fn running(phase: Phase) -> MigrationState {
        MigrationState {
            phase,
            epoch: 7,
            paused: false,
            failure: None,
            sealed: false,
        }
    }

    #[test]
    fn waiting_for_a_phase_counts_reached_or_passed_on_its_path_and_gives_up_off_it() {
        use Phase::*;
        use Reached::*;
        let cases = [
            (DualRead, Backfill, NotYet),
            (Backfill, Backfill, Yes),
            (Cleanup, Backfill, Yes),
            (Completed, Completed, Yes),
            (Planned, Completed, NotYet),
            // Rolled back, or rolling back, while waiting for the forward path.
            (Reverting, Completed, Never),
            (RolledBack, Backfill, Never),
            // Waiting for the rollback path.
            (NewReads, RolledBack, NotYet),
            (Reverting, RolledBack, NotYet),
            (RevertSwitch, Reverting, Yes),
            (RolledBack, RolledBack, Yes),
            (Completed, RolledBack, Never),
        ];
        for (now, wanted, expected) in cases {
            assert_eq!(now.reached(wanted), expected, "{now} waiting for {wanted}");
        }
    }

    #[test]
    fn only_a_rolled_back_migration_is_sealed_once_every_router_acknowledged() {
        let change = plan(&running(Phase::RolledBack), &Action::Seal).unwrap();
        assert!(change.to.sealed);
        assert_eq!(change.to.phase, Phase::RolledBack);
        assert_eq!(change.to.epoch, 8);
        assert_eq!(change.gates, &[Gate::RoutersAcknowledged]);
        let sealed = change.to;
        assert!(matches!(
            plan(&sealed, &Action::Seal),
            Err(MoveError::NotSealable(Phase::RolledBack))
        ));
        for phase in [Phase::RevertSwitch, Phase::Completed, Phase::Planned] {
            assert!(matches!(
                plan(&running(phase), &Action::Seal),
                Err(MoveError::NotSealable(p)) if p == phase
            ));
        }
        // Sealed, it is still ended: nothing else moves it.
        assert!(plan(&sealed, &Action::Advance(Phase::Reverting)).is_err());
    }

    /// The whole table of allowed moves, written out independently of `Phase::next`, so that
    /// a change to either is caught here.
    const ALLOWED: &[(Phase, Phase)] = &[
        (Phase::Planned, Phase::DualRead),
        (Phase::Planned, Phase::RolledBack),
        (Phase::DualRead, Phase::WriteSwitch),
        (Phase::DualRead, Phase::Planned),
        (Phase::WriteSwitch, Phase::NewWrites),
        (Phase::WriteSwitch, Phase::DualRead),
        (Phase::NewWrites, Phase::Backfill),
        (Phase::NewWrites, Phase::Reverting),
        (Phase::Backfill, Phase::Reconcile),
        (Phase::Backfill, Phase::Reverting),
        (Phase::Reconcile, Phase::NewReads),
        (Phase::Reconcile, Phase::Reverting),
        (Phase::NewReads, Phase::Cleanup),
        (Phase::NewReads, Phase::Reverting),
        (Phase::Cleanup, Phase::Completed),
        (Phase::Reverting, Phase::RevertSwitch),
        (Phase::RevertSwitch, Phase::RolledBack),
        (Phase::RevertSwitch, Phase::Reverting),
    ];

    #[test]
    fn every_pair_of_phases_is_allowed_exactly_when_the_table_says() {
        for from in Phase::ALL {
            for to in Phase::ALL {
                let result = plan(&running(from), &Action::Advance(to));
                let expected = ALLOWED.contains(&(from, to));
                match (expected, &result) {
                    (true, Ok(change)) => {
                        assert_eq!(change.to.phase, to);
                        assert_eq!(change.to.epoch, 8, "{from} -> {to} must bump the epoch");
                    }
                    (false, Err(err)) => {
                        if from.is_terminal() {
                            assert_eq!(*err, MoveError::Ended(from));
                        } else if from == to {
                            assert_eq!(*err, MoveError::AlreadyThere(from));
                        } else {
                            assert_eq!(*err, MoveError::NotAllowed { from, to });
                        }
                    }
                    _ => panic!("{from} -> {to}: expected allowed={expected}, got {result:?}"),
                }
            }
        }
    }

    #[test]
    fn a_refused_move_names_the_allowed_ones() {
        let err = plan(&running(Phase::Backfill), &Action::Advance(Phase::Cleanup)).unwrap_err();
        assert_eq!(
            err.to_string(),
            "cannot move from backfill to cleanup; allowed from backfill: reconcile, reverting"
        );
        let err = plan(&running(Phase::Completed), &Action::Pause).unwrap_err();
        assert_eq!(
            err.to_string(),
            "the migration has ended in completed; nothing can change it"
        );
    }

    #[test]
    fn gates_guard_the_moves_that_need_them() {
        let cases: &[(Phase, Phase, &[Gate])] = &[
            (Phase::Planned, Phase::DualRead, &[]),
            (
                Phase::DualRead,
                Phase::WriteSwitch,
                &[Gate::RoutersAcknowledged],
            ),
            (
                Phase::WriteSwitch,
                Phase::NewWrites,
                &[Gate::RoutersAcknowledged],
            ),
            (Phase::WriteSwitch, Phase::DualRead, &[]),
            (
                Phase::NewWrites,
                Phase::Backfill,
                &[Gate::RoutersAcknowledged],
            ),
            (Phase::Backfill, Phase::Reconcile, &[Gate::BackfillComplete]),
            (
                Phase::Reconcile,
                Phase::NewReads,
                &[Gate::BypassesResolved, Gate::ReconciliationPassed],
            ),
            (
                Phase::NewReads,
                Phase::Cleanup,
                &[Gate::RoutersAcknowledged, Gate::BypassesResolved],
            ),
            (
                Phase::Cleanup,
                Phase::Completed,
                &[Gate::CleanupComplete, Gate::BypassesResolved],
            ),
            (Phase::Backfill, Phase::Reverting, &[]),
            (
                Phase::Reverting,
                Phase::RevertSwitch,
                &[Gate::RoutersAcknowledged, Gate::RevertComplete],
            ),
            // A lapse seen only in the revert switch outdates the copy back there too.
            (
                Phase::RevertSwitch,
                Phase::RolledBack,
                &[Gate::RoutersAcknowledged, Gate::RevertComplete],
            ),
            (Phase::RevertSwitch, Phase::Reverting, &[]),
        ];
        for (from, to, gates) in cases {
            let change = plan(&running(*from), &Action::Advance(*to)).unwrap();
            assert_eq!(change.gates, *gates, "{from} -> {to}");
        }
    }

    #[test]
    fn pause_and_resume_keep_the_phase_and_bump_the_epoch() {
        let paused = plan(&running(Phase::Backfill), &Action::Pause).unwrap().to;
        assert_eq!(paused.phase, Phase::Backfill);
        assert!(paused.paused);
        assert_eq!(paused.epoch, 8);
        assert_eq!(plan(&paused, &Action::Pause), Err(MoveError::AlreadyPaused));
        assert_eq!(
            plan(&paused, &Action::Advance(Phase::Reconcile)),
            Err(MoveError::Paused)
        );
        let resumed = plan(&paused, &Action::Resume).unwrap().to;
        assert!(!resumed.paused);
        assert_eq!(resumed.epoch, 9);
        assert_eq!(
            plan(&running(Phase::Backfill), &Action::Resume),
            Err(MoveError::NotPaused)
        );
    }

    #[test]
    fn a_failed_migration_only_resumes_or_rolls_back() {
        let failed = plan(
            &running(Phase::Cleanup),
            &Action::Fail("id 42 missing from target".into()),
        )
        .unwrap()
        .to;
        assert_eq!(failed.failure.as_deref(), Some("id 42 missing from target"));
        let err = plan(&failed, &Action::Advance(Phase::Completed)).unwrap_err();
        assert!(
            err.to_string().contains("id 42 missing from target"),
            "{err}"
        );

        let failed_backfill = MigrationState {
            failure: Some("dead letters".into()),
            ..running(Phase::Backfill)
        };
        let rolled = plan(&failed_backfill, &Action::Advance(Phase::Reverting))
            .unwrap()
            .to;
        assert_eq!(rolled.phase, Phase::Reverting);
        assert_eq!(rolled.failure, None);
        let resumed = plan(&failed_backfill, &Action::Resume).unwrap().to;
        assert_eq!(resumed.failure, None);
    }

    #[test]
    fn paths_follow_the_design_table() {
        use ReadPath as R;
        use WritePath as W;
        let table = [
            (Phase::Planned, R::Source, W::Source),
            (Phase::DualRead, R::TargetThenSource, W::Source),
            (Phase::WriteSwitch, R::TargetThenSource, W::Held),
            (Phase::NewWrites, R::TargetThenSource, W::Target),
            (Phase::Backfill, R::TargetThenSource, W::Target),
            (Phase::Reconcile, R::TargetThenSource, W::Target),
            (Phase::NewReads, R::Target, W::Target),
            (Phase::Cleanup, R::Target, W::Target),
            (Phase::Completed, R::Target, W::Target),
            (
                Phase::Reverting,
                R::TargetThenSource,
                W::TargetMirroredToSource,
            ),
            (Phase::RevertSwitch, R::Source, W::Held),
            (Phase::RolledBack, R::Source, W::Source),
        ];
        for (phase, read, write) in table {
            assert_eq!(
                (phase.read_path(), phase.write_path()),
                (read, write),
                "{phase}"
            );
        }
    }

    #[test]
    fn every_rollback_path_is_made_of_allowed_moves() {
        for phase in Phase::ALL {
            match rollback_path(phase) {
                Ok(path) => {
                    let mut at = phase;
                    for to in path {
                        assert!(at.next().contains(to), "{at} -> {to}");
                        assert!(
                            at.is_rollback_move(*to),
                            "{at} -> {to} is not a rollback move"
                        );
                        at = *to;
                    }
                }
                Err(RollbackRefused::CleanupStarted(p)) => {
                    assert!(matches!(p, Phase::Cleanup | Phase::Completed))
                }
                Err(RollbackRefused::AlreadyRollingBack(p)) => assert!(matches!(
                    p,
                    Phase::Reverting | Phase::RevertSwitch | Phase::RolledBack
                )),
            }
        }
    }

    #[test]
    fn writes_never_change_sides_without_the_switch() {
        // The write side may only change through a phase that holds writes.
        for from in Phase::ALL {
            for to in from.next() {
                let (a, b) = (from.write_path(), to.write_path());
                let direct = matches!(
                    (a, b),
                    (WritePath::Source, WritePath::Target)
                        | (WritePath::Target, WritePath::Source)
                        | (WritePath::TargetMirroredToSource, WritePath::Source)
                );
                assert!(!direct, "{from} -> {to} changes the write side directly");
            }
        }
    }

    #[test]
    fn phase_names_round_trip_and_unknown_names_list_the_phases() {
        for phase in Phase::ALL {
            assert_eq!(phase.as_str().parse::<Phase>(), Ok(phase));
        }
        let err = "backfil".parse::<Phase>().unwrap_err();
        assert!(err.to_string().contains("planned, dual_read"), "{err}");
    }
}
