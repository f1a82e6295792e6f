//! The write protocol, model-checked (issue 6): every interleaving of two routers, the backfill
//! copier, the cleaner, the revert copier and the driver moving phases, on a few operations over
//! two ids, explored breadth first with state hashing.
//!
//! The actors run the product's own decisions from `reshard::protocol` (the operation machines,
//! `copy_step`, `cleanup_decision`, `revert_copy_step`, `purge_tombstone_step`) against an
//! in-memory store of two layouts whose single-document steps are atomic, as MongoDB makes
//! them. The checks, after every step:
//! - the history of every id is linearizable against a plain key-value specification (every
//!   acknowledged write is what a later read returns; a deleted id reads as absent), tracked as
//!   the set of abstract states some linearization of the history so far can be in;
//! - a read started at this instant, along every read path a router may be using, returns a
//!   value one of those linearizations allows;
//! - no actor but a router writing the source layout removes a source document while the
//!   target holds neither a copy nor a tombstone of it;
//! - an operation machine never rejects an answer or gives up.
//!
//! And in every final state: the migration ended (`completed` or `rolled_back`); after
//! cleanup only target documents remain and no tombstone is left; after a rollback the source
//! holds the data and no tombstone.
//!
//! Deliberately broken variants (the copier overwrites, a delete writes no tombstone, cleanup
//! deletes without looking, the write switch is skipped, the rollback mirror ignores revisions,
//! the revert copier starts before every router mirrors) must each be caught, so that a clean
//! run of the real protocol means something.
//!
//! Always on: one workload of the size (2 routers x 3 operations x 2 ids, 2-document
//! backfill and cleanup, every phase move). With `RESHARD_HEAVY_TESTS=1` (CI sets it) two more
//! workloads run, one of them on three ids. Figures: BENCHMARKS.md, "Protocol model".

use std::collections::hash_map::DefaultHasher;
use std::collections::{BTreeSet, HashSet};
use std::fmt::Write as _;
use std::hash::{Hash, Hasher};
use std::time::{Duration, Instant};

use reshard::phase::{Gate, Phase, WritePath};
use reshard::protocol::{
    cleanup_decision, cleanup_delete_step, cleanup_lookup_step, copy_result, copy_step,
    purge_tombstone_step, revert_copy_step, Answer, CleanupDecision, CopyResult, Found,
    Interrupted, Next, Operation, OperationMachine, Outcome, Payload, Side, Step,
};

/// The most ids a workload may use; states are fixed-size arrays for cheap hashing.
const IDS: usize = 3;
const ROUTERS: usize = 2;

/// A partial update: add to the document's value. Not idempotent, so a lost or doubled
/// update shows in the value.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
struct Add(u8);

type Op = Operation<u8, Add>;
type Machine = OperationMachine<u8, Add>;
type MStep = Step<u8, Add>;

// ---------------------------------------------------------------------------------------------
// The store: two layouts, one slot per id and side.

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
enum Slot {
    Absent,
    Live { v: u8, rev: u8 },
    Tomb { rev: u8 },
}

impl Slot {
    fn rev(self) -> Option<u8> {
        match self {
            Slot::Absent => None,
            Slot::Live { rev, .. } | Slot::Tomb { rev } => Some(rev),
        }
    }

    fn found(self) -> Found<u8> {
        match self {
            Slot::Absent => Found::Absent,
            Slot::Live { v, .. } => Found::Live(v),
            Slot::Tomb { .. } => Found::Tombstone,
        }
    }
}

#[derive(Clone, Debug, PartialEq, Eq, Hash)]
struct Store {
    source: [Slot; IDS],
    target: [Slot; IDS],
    /// Whether this migration's mirror wrote the source document (`_reshard.mig`): mirrors
    /// compare revisions only with what a mirror wrote.
    mirrored: [bool; IDS],
}

impl Store {
    fn slot(&mut self, side: Side, id: usize) -> &mut Slot {
        match side {
            Side::Source => &mut self.source[id],
            Side::Target => &mut self.target[id],
        }
    }
}

/// The document a write leaves behind. Application writes and tombstones take the previous
/// revision + 1 atomically on either side (the product counts source revisions too), and a
/// copy keeps the revision of the source document it copies (`router::copy_document`).
fn written(prev: Slot, payload: &Payload<u8>, source_rev: u8) -> Slot {
    let rev = prev.rev().map_or(1, |r| r + 1);
    match payload {
        Payload::App(v) => Slot::Live { v: *v, rev },
        Payload::Copy(v) => Slot::Live {
            v: *v,
            rev: source_rev,
        },
        Payload::Tombstone => Slot::Tomb { rev },
    }
}

/// Executes one single-document step atomically. `MirrorToSource` is two steps and is run by
/// the actors through [`mirror_read`] and [`mirror_write`].
fn execute(store: &mut Store, id: usize, step: &MStep) -> Answer<u8> {
    let source_rev = store.source[id].rev().unwrap_or(0);
    if let Step::Insert(Side::Source, _)
    | Step::ReplaceLive(Side::Source, _)
    | Step::ReplaceTombstone(Side::Source, _)
    | Step::UpdateLive(Side::Source, _)
    | Step::Delete(Side::Source)
    | Step::DeleteLive(Side::Source)
    | Step::DeleteTombstone(Side::Source) = step
    {
        // A source-path write replaces `_reshard`, so the document is no longer a mirror's.
        store.mirrored[id] = false;
    }
    match step {
        Step::Find(side) => Answer::Found(store.slot(*side, id).found()),
        Step::Insert(side, payload) => {
            let slot = store.slot(*side, id);
            if *slot == Slot::Absent {
                *slot = written(*slot, payload, source_rev);
                Answer::Inserted
            } else {
                Answer::DuplicateKey
            }
        }
        Step::ReplaceLive(side, payload) => {
            let slot = store.slot(*side, id);
            let hit = matches!(slot, Slot::Live { .. });
            if hit {
                *slot = written(*slot, payload, source_rev);
            }
            Answer::Matched(hit)
        }
        Step::ReplaceTombstone(side, payload) => {
            let slot = store.slot(*side, id);
            let hit = matches!(slot, Slot::Tomb { .. });
            if hit {
                *slot = written(*slot, payload, source_rev);
            }
            Answer::Matched(hit)
        }
        Step::UpdateLive(side, Add(k)) => {
            let slot = store.slot(*side, id);
            match *slot {
                Slot::Live { v, rev } => {
                    *slot = Slot::Live {
                        v: v.wrapping_add(*k),
                        rev: rev + 1,
                    };
                    Answer::Matched(true)
                }
                _ => Answer::Matched(false),
            }
        }
        Step::Delete(side) => {
            let slot = store.slot(*side, id);
            let hit = *slot != Slot::Absent;
            *slot = Slot::Absent;
            Answer::Matched(hit)
        }
        Step::DeleteLive(side) => {
            let slot = store.slot(*side, id);
            let hit = matches!(slot, Slot::Live { .. });
            if hit {
                *slot = Slot::Absent;
            }
            Answer::Matched(hit)
        }
        Step::DeleteTombstone(side) => {
            let slot = store.slot(*side, id);
            let hit = matches!(slot, Slot::Tomb { .. });
            if hit {
                *slot = Slot::Absent;
            }
            Answer::Matched(hit)
        }
        Step::ReplaceCopy(..) => unreachable!("no actor repairs yet"),
        Step::MirrorToSource => unreachable!("mirrors run as two steps"),
    }
}

/// The mirror's first single-document step: read the target document with its revision.
fn mirror_read(store: &Store, id: usize) -> Slot {
    store.target[id]
}

/// The mirror's second step: the conditional upsert into the source. `by_revision: false` is
/// the broken variant that writes whatever it read.
fn mirror_write(store: &mut Store, id: usize, image: Slot, rule: MirrorRule) -> Answer<u8> {
    let Some(rev) = image.rev() else {
        return Answer::Matched(false);
    };
    let newer = match rule {
        // The product's filter: `_reshard.mig` differs (a source document no mirror of this
        // migration wrote is older than any target version) or its revision is lower.
        MirrorRule::Product => {
            !store.mirrored[id] || store.source[id].rev().is_none_or(|r| r < rev)
        }
        // Broken: revisions compared across the sides, as if one counter ran on both.
        MirrorRule::RawRevision => store.source[id].rev().is_none_or(|r| r < rev),
        // Broken: whatever the mirror read wins.
        MirrorRule::Overwrite => true,
    };
    if newer {
        store.source[id] = image;
        store.mirrored[id] = true;
    }
    Answer::Matched(newer)
}

/// How a mirror decides whether its image is newer than the source document.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum MirrorRule {
    Product,
    RawRevision,
    Overwrite,
}

// ---------------------------------------------------------------------------------------------
// The specification: a key-value map, one value per id, and the set of states some
// linearization of the history so far can be in.

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
enum Res {
    Read(Option<u8>),
    Inserted,
    Duplicate,
    Changed(bool),
}

fn res(outcome: &Outcome<u8>) -> Res {
    match outcome {
        Outcome::Read(v) => Res::Read(*v),
        Outcome::Inserted => Res::Inserted,
        Outcome::Duplicate => Res::Duplicate,
        Outcome::Changed(c) => Res::Changed(*c),
        Outcome::Held => unreachable!("held operations are not started"),
    }
}

fn spec(op: &Op, value: Option<u8>) -> (Option<u8>, Res) {
    match (op, value) {
        (Operation::Get, v) => (v, Res::Read(v)),
        (Operation::Insert(d), None) => (Some(*d), Res::Inserted),
        (Operation::Insert(_), v) => (v, Res::Duplicate),
        (Operation::Replace { doc, .. }, Some(_)) => (Some(*doc), Res::Changed(true)),
        (Operation::Replace { doc, upsert }, None) => {
            if *upsert {
                (Some(*doc), Res::Changed(true))
            } else {
                (None, Res::Changed(false))
            }
        }
        (Operation::Update(Add(k)), Some(v)) => (Some(v.wrapping_add(*k)), Res::Changed(true)),
        (Operation::Update(_), None) => (None, Res::Changed(false)),
        (Operation::Delete, Some(_)) => (None, Res::Changed(true)),
        (Operation::Delete, None) => (None, Res::Changed(false)),
    }
}

/// Where a router's current operation stands in one linearization.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
enum Lin {
    Idle,
    Pending,
    Done(Res),
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
struct Config {
    value: Option<u8>,
    ops: [Lin; ROUTERS],
}

/// Adds every configuration reachable by linearizing pending operations. Keeps the set sorted.
fn close(configs: &mut Vec<Config>, pending: &[Option<&Op>; ROUTERS]) {
    let mut set: BTreeSet<Config> = configs.iter().copied().collect();
    let mut work: Vec<Config> = configs.clone();
    while let Some(c) = work.pop() {
        for (r, op) in pending.iter().enumerate() {
            if c.ops[r] == Lin::Pending {
                let op = op.expect("a pending operation");
                let (value, out) = spec(op, c.value);
                let mut n = c;
                n.value = value;
                n.ops[r] = Lin::Done(out);
                if set.insert(n) {
                    work.push(n);
                }
            }
        }
    }
    *configs = set.into_iter().collect();
}

// ---------------------------------------------------------------------------------------------
// Actors.

#[derive(Clone, Debug, PartialEq, Eq, Hash)]
enum Pend {
    Step(MStep),
    /// The mirror read the target; its conditional write to the source is next.
    MirrorWrite(Slot),
}

#[derive(Clone, Debug, PartialEq, Eq, Hash)]
struct Run {
    machine: Machine,
    pend: Pend,
}

#[derive(Clone, Debug, PartialEq, Eq, Hash)]
struct Router {
    /// The phase this router applies: it acknowledged it and drained the older one.
    acked: Phase,
    next_op: u8,
    run: Option<Run>,
    /// Whether its lease is live. Once it ran out (plus the fence margin) the driver counts
    /// the router out, and the product guarantees that no step of it lands any more: the step
    /// it was about to run is never sent, one in flight ended by the deadline. It serves again
    /// only after a renewal followed by a load of the current phase.
    live: bool,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
enum CopierAt {
    Idle,
    /// Read this source document; inserting its copy is next.
    Read(u8),
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
enum CleanerAt {
    Idle,
    /// The target holds the id; deleting the source document is next.
    Checked,
}

#[derive(Clone, Debug, PartialEq, Eq, Hash)]
struct State {
    phase: Phase,
    routers: [Router; ROUTERS],
    copier_pos: u8,
    copier_at: CopierAt,
    /// A copy was lost (the fault some configurations inject); at most one.
    copy_lost: bool,
    cleaner_pos: u8,
    cleaner_at: CleanerAt,
    /// Cleanup found an id missing from the target and failed the migration.
    cleanup_failed: bool,
    purge_pos: u8,
    revert_pos: u8,
    revert_at: Option<Slot>,
    revert_purge_pos: u8,
    /// Lease expiries left to explore in this run.
    expiries_left: u8,
    store: Store,
    lin: [Vec<Config>; IDS],
}

/// A deliberate deviation from the product protocol (or the fault that shows one).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Broken {
    /// The router checks its lease only when an operation starts: a step of an operation in
    /// flight lands after the lease ran out and the driver counted the router out (issue 10).
    LeaseCheckedAtStart,
    /// The copier overwrites whatever the target holds instead of inserting if absent.
    CopierOverwrites,
    /// A delete in the target removes the document (or does nothing when only the source has
    /// it) instead of writing a tombstone.
    DeleteWithoutTombstone,
    /// Cleanup deletes source documents without looking them up in the target. Shown with a
    /// lost copy, the only way the target can miss a document the checks let through.
    CleanupWithoutPresenceCheck,
    /// The driver leaves the write switch before every router acknowledged it.
    SkipWriteSwitch,
    /// The rollback mirror overwrites the source whatever its revision.
    MirrorIgnoresRevision,
    /// The rollback mirror compares its revision with the source document's own, counted by
    /// source writes before the switch (the product's bug until session 8).
    MirrorComparesRawRevisions,
    /// The revert copier starts before every router acknowledged `reverting`.
    EarlyRevertCopy,
}

#[derive(Clone, Debug)]
struct Workload {
    name: &'static str,
    initial: [Option<u8>; IDS],
    ids: usize,
    ops: [Vec<(usize, Op)>; ROUTERS],
}

#[derive(Clone, Debug)]
struct Setup {
    workload: Workload,
    broken: Option<Broken>,
    /// The copier may lose one copy: its insert is acknowledged but not there (an
    /// acknowledged `w:1` write rolled back by a failover, a dead letter skipped by hand).
    /// Reads are then wrong by construction (reconciliation's job); only cleanup's safety and
    /// the final state are checked.
    lose_a_copy: bool,
    /// How many times in a run some router's lease may run out (0: never).
    expiries: u8,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
enum Act {
    Move(Phase),
    Ack(usize),
    /// The router's lease runs out (it could not reach the state store): the driver may count
    /// it out; an operation in flight stops before its next step.
    Expire(usize),
    /// The router reaches the state store again: it renews, loads the current phase, serves.
    Renew(usize),
    Start(usize),
    Step(usize),
    Copier {
        lose: bool,
    },
    Cleaner,
    Reverter,
}

struct Model<'a> {
    cfg: &'a Setup,
}

type Checked<T> = Result<T, String>;

impl Model<'_> {
    fn initial(&self) -> State {
        let w = &self.cfg.workload;
        let mut source = [Slot::Absent; IDS];
        let mut lin: [Vec<Config>; IDS] = Default::default();
        for id in 0..IDS {
            if let Some(v) = w.initial[id] {
                source[id] = Slot::Live { v, rev: 0 };
            }
            lin[id] = vec![Config {
                value: w.initial[id],
                ops: [Lin::Idle; ROUTERS],
            }];
        }
        let router = Router {
            acked: Phase::Planned,
            next_op: 0,
            run: None,
            live: true,
        };
        State {
            phase: Phase::Planned,
            routers: [router.clone(), router],
            copier_pos: 0,
            copier_at: CopierAt::Idle,
            copy_lost: false,
            cleaner_pos: 0,
            cleaner_at: CleanerAt::Idle,
            cleanup_failed: false,
            purge_pos: 0,
            revert_pos: 0,
            revert_at: None,
            revert_purge_pos: 0,
            expiries_left: self.cfg.expiries,
            store: Store {
                source,
                target: [Slot::Absent; IDS],
                mirrored: [false; IDS],
            },
            lin,
        }
    }

    fn ids(&self) -> u8 {
        self.cfg.workload.ids as u8
    }

    fn broken(&self, b: Broken) -> bool {
        self.cfg.broken == Some(b)
    }

    fn mirror_rule(&self) -> MirrorRule {
        if self.broken(Broken::MirrorIgnoresRevision) {
            MirrorRule::Overwrite
        } else if self.broken(Broken::MirrorComparesRawRevisions) {
            MirrorRule::RawRevision
        } else {
            MirrorRule::Product
        }
    }

    fn op(&self, r: usize, i: u8) -> &(usize, Op) {
        &self.cfg.workload.ops[r][i as usize]
    }

    /// Every router the driver still counts (live lease) applies `phase`.
    fn all_acked(&self, s: &State, phase: Phase) -> bool {
        s.routers.iter().all(|r| !r.live || r.acked == phase)
    }

    fn copier_done(&self, s: &State) -> bool {
        s.copier_pos == self.ids()
    }

    fn cleanup_done(&self, s: &State) -> bool {
        s.cleaner_pos == self.ids()
    }

    fn revert_done(&self, s: &State) -> bool {
        s.revert_pos == self.ids()
    }

    fn gate_open(&self, s: &State, to: Phase, gate: Gate) -> bool {
        match gate {
            Gate::RoutersAcknowledged => {
                (self.broken(Broken::SkipWriteSwitch)
                    && (s.phase, to) == (Phase::WriteSwitch, Phase::NewWrites))
                    || self.all_acked(s, s.phase)
            }
            Gate::BackfillComplete => self.copier_done(s),
            // Reconciliation is sampled: it passes unless it happens to look at a defect, so
            // the model lets it pass and keeps checking what the routers read.
            Gate::ReconciliationPassed => true,
            Gate::CleanupComplete => self.cleanup_done(s),
            Gate::RevertComplete => self.revert_done(s),
        }
    }

    fn actions(&self, s: &State) -> Vec<Act> {
        let mut acts = Vec::new();
        for &to in s.phase.next() {
            if s.phase
                .gates_to(to)
                .iter()
                .all(|g| self.gate_open(s, to, *g))
            {
                acts.push(Act::Move(to));
            }
        }
        for (r, router) in s.routers.iter().enumerate() {
            let ops_left = (router.next_op as usize) < self.cfg.workload.ops[r].len();
            if router.live && s.expiries_left > 0 && (router.run.is_some() || ops_left) {
                acts.push(Act::Expire(r));
            }
            if !router.live {
                if router.run.is_some() {
                    // Only a router that checks its lease at the start of an operation alone
                    // goes on with its steps once the lease ran out.
                    if self.broken(Broken::LeaseCheckedAtStart) {
                        acts.push(Act::Step(r));
                    }
                } else if ops_left {
                    acts.push(Act::Renew(r));
                }
                continue;
            }
            if router.run.is_some() {
                acts.push(Act::Step(r));
                continue;
            }
            if router.acked != s.phase {
                acts.push(Act::Ack(r));
            }
            // A write started in a phase that holds writes answers `Held` without a step and
            // is retried after the next acknowledgement: starting it changes nothing.
            if let Some((_, op)) = self.cfg.workload.ops[r].get(router.next_op as usize) {
                let held =
                    router.acked.write_path() == WritePath::Held && !matches!(op, Operation::Get);
                if !held {
                    acts.push(Act::Start(r));
                }
            }
        }
        if s.copier_at != CopierAt::Idle {
            acts.push(Act::Copier { lose: false });
            if self.cfg.lose_a_copy && !s.copy_lost {
                acts.push(Act::Copier { lose: true });
            }
        } else if s.phase == Phase::Backfill && !self.copier_done(s) {
            acts.push(Act::Copier { lose: false });
        }
        let purge_may_start = s.phase == Phase::Completed
            && self.all_acked(s, Phase::Completed)
            && s.purge_pos < self.ids();
        if s.cleaner_at != CleanerAt::Idle
            || (s.phase == Phase::Cleanup && !s.cleanup_failed && !self.cleanup_done(s))
            || purge_may_start
        {
            acts.push(Act::Cleaner);
        }
        let revert_may_start = s.phase == Phase::Reverting
            && (self.broken(Broken::EarlyRevertCopy) || self.all_acked(s, Phase::Reverting));
        let revert_purge = s.phase == Phase::RolledBack && s.revert_purge_pos < self.ids();
        if s.revert_at.is_some() || (revert_may_start && !self.revert_done(s)) || revert_purge {
            acts.push(Act::Reverter);
        }
        acts
    }

    /// Applies `act` to `s`, checking the step's own rules. `log` receives a description.
    fn apply(&self, s: &mut State, act: Act, log: &mut String) -> Checked<()> {
        let before = s.store.clone();
        let mut source_writer = false;
        match act {
            Act::Move(to) => {
                let _ = write!(log, "driver: {} -> {}", s.phase, to);
                s.phase = to;
            }
            Act::Ack(r) => {
                let _ = write!(log, "router {r}: acknowledges {}", s.phase);
                s.routers[r].acked = s.phase;
            }
            Act::Expire(r) => {
                let _ = write!(log, "router {r}: its lease runs out; ");
                s.routers[r].live = false;
                s.expiries_left -= 1;
                if !self.broken(Broken::LeaseCheckedAtStart) {
                    if let Some(run) = s.routers[r].run.take() {
                        self.interrupt(s, r, run, log)?;
                    }
                }
            }
            Act::Renew(r) => {
                // Renew, then load: it applies the phase of now.
                let _ = write!(log, "router {r}: renews its lease and loads {}", s.phase);
                s.routers[r].live = true;
                s.routers[r].acked = s.phase;
            }
            Act::Start(r) => {
                let (id, op) = self.op(r, s.routers[r].next_op).clone();
                let phase = s.routers[r].acked;
                let _ = write!(log, "router {r}: starts {op:?} on id {id} in {phase}; ");
                for c in s.lin[id].iter_mut() {
                    c.ops[r] = Lin::Pending;
                }
                let pending = self.pending(s, id, Some((r, &op)));
                close(&mut s.lin[id], &pending);
                let mut machine = Machine::new(phase, op);
                let next = machine.next(None).map_err(|e| e.to_string())?;
                source_writer = phase.write_path() == WritePath::Source;
                self.advance(s, r, id, machine, next, log)?;
            }
            Act::Step(r) => {
                let id = self.op(r, s.routers[r].next_op).0;
                source_writer = s.routers[r].acked.write_path() == WritePath::Source;
                let _ = write!(log, "router {r}: ");
                let run = s.routers[r].run.take().expect("a running operation");
                self.advance_run(s, r, id, run, log)?;
            }
            Act::Copier { lose } => self.copier(s, lose, log)?,
            Act::Cleaner => self.cleaner(s, log)?,
            Act::Reverter => self.reverter(s, log)?,
        }
        if !source_writer {
            for id in 0..IDS {
                let removed = matches!(before.source[id], Slot::Live { .. })
                    && !matches!(s.store.source[id], Slot::Live { .. });
                if removed && s.store.target[id] == Slot::Absent {
                    return Err(format!(
                        "source document {id} removed while the target holds neither a copy \
                         nor a tombstone"
                    ));
                }
            }
        }
        Ok(())
    }

    /// An operation stopped by its router's lease before its pending step: that step never
    /// lands. The application is told what the machine says may have happened; the history
    /// must agree (nothing applied: no linearization may have applied it).
    fn interrupt(&self, s: &mut State, r: usize, run: Run, log: &mut String) -> Checked<()> {
        let id = self.op(r, s.routers[r].next_op).0;
        let interrupted = run.machine.interrupted();
        let _ = write!(log, "its operation stops: {interrupted:?}");
        if interrupted == Interrupted::NothingApplied {
            s.lin[id].retain(|c| c.ops[r] == Lin::Pending);
            if s.lin[id].is_empty() {
                return Err(format!(
                    "router {r}'s {:?} on id {id} stopped saying nothing was applied, but \
                     every linearization applied it",
                    self.op(r, s.routers[r].next_op).1
                ));
            }
        }
        for c in s.lin[id].iter_mut() {
            c.ops[r] = Lin::Idle;
        }
        s.lin[id].sort();
        s.lin[id].dedup();
        s.routers[r].next_op += 1;
        Ok(())
    }

    /// The operations pending on `id`, for the linearizability closure.
    fn pending<'b>(
        &'b self,
        s: &State,
        id: usize,
        starting: Option<(usize, &'b Op)>,
    ) -> [Option<&'b Op>; ROUTERS] {
        let mut out = [None; ROUTERS];
        for (r, router) in s.routers.iter().enumerate() {
            if router.run.is_some() {
                let (op_id, op) = self.op(r, router.next_op);
                if *op_id == id {
                    out[r] = Some(op);
                }
            }
        }
        if let Some((r, op)) = starting {
            out[r] = Some(op);
        }
        out
    }

    /// Runs the router's pending step and feeds the answer to its machine.
    fn advance_run(
        &self,
        s: &mut State,
        r: usize,
        id: usize,
        run: Run,
        log: &mut String,
    ) -> Checked<()> {
        let Run { mut machine, pend } = run;
        let answer = match pend {
            Pend::MirrorWrite(image) => {
                let a = mirror_write(&mut s.store, id, image, self.mirror_rule());
                let _ = write!(log, "mirror writes {image:?} to the source -> {a:?}; ");
                a
            }
            Pend::Step(Step::MirrorToSource) => {
                let image = mirror_read(&s.store, id);
                let _ = write!(log, "mirror reads {image:?} from the target");
                s.routers[r].run = Some(Run {
                    machine,
                    pend: Pend::MirrorWrite(image),
                });
                return Ok(());
            }
            Pend::Step(step) => {
                let (a, how) = self.router_execute(&mut s.store, id, &step);
                let _ = write!(log, "{step:?}{how} -> {a:?}; ");
                a
            }
        };
        let next = machine.next(Some(answer)).map_err(|e| e.to_string())?;
        self.advance(s, r, id, machine, next, log)
    }

    /// The router's executor, with the broken delete when asked for.
    fn router_execute(
        &self,
        store: &mut Store,
        id: usize,
        step: &MStep,
    ) -> (Answer<u8>, &'static str) {
        if self.broken(Broken::DeleteWithoutTombstone) {
            match step {
                Step::ReplaceLive(Side::Target, Payload::Tombstone) => {
                    let a = execute(store, id, &Step::DeleteLive(Side::Target));
                    return (a, " (broken: deletes instead)");
                }
                Step::Insert(Side::Target, Payload::Tombstone) => {
                    return (Answer::Inserted, " (broken: does nothing)")
                }
                _ => {}
            }
        }
        (execute(store, id, step), "")
    }

    /// Records the machine's next move: a pending step, or the operation's response.
    fn advance(
        &self,
        s: &mut State,
        r: usize,
        id: usize,
        machine: Machine,
        next: Next<u8, Add>,
        log: &mut String,
    ) -> Checked<()> {
        match next {
            Next::Do(step) => {
                s.routers[r].run = Some(Run {
                    machine,
                    pend: Pend::Step(step),
                });
                // Steps run as their own actions, so the start only invokes.
                Ok(())
            }
            Next::Done(outcome) => {
                let _ = write!(log, "responds {outcome:?}");
                let want = Lin::Done(res(&outcome));
                // With a lost copy answers are wrong by construction; only cleanup is judged.
                if !self.cfg.lose_a_copy {
                    s.lin[id].retain(|c| c.ops[r] == want);
                }
                if s.lin[id].is_empty() {
                    return Err(format!(
                        "router {r}'s {:?} on id {id} answered {outcome:?}, which no \
                         linearization of the history allows",
                        self.op(r, s.routers[r].next_op).1
                    ));
                }
                for c in s.lin[id].iter_mut() {
                    c.ops[r] = Lin::Idle;
                }
                s.lin[id].sort();
                s.lin[id].dedup();
                s.routers[r].run = None;
                s.routers[r].next_op += 1;
                Ok(())
            }
        }
    }

    fn copier(&self, s: &mut State, lose: bool, log: &mut String) -> Checked<()> {
        let id = s.copier_pos as usize;
        match s.copier_at {
            CopierAt::Idle => {
                let found = execute(&mut s.store, id, &Step::Find(Side::Source));
                let _ = write!(log, "copier: reads source id {id}: {found:?}");
                match found {
                    Answer::Found(Found::Live(v)) => s.copier_at = CopierAt::Read(v),
                    _ => s.copier_pos += 1,
                }
            }
            CopierAt::Read(v) => {
                let step: MStep = copy_step(v);
                let answer = if lose {
                    s.copy_lost = true;
                    Answer::Inserted
                } else if self.broken(Broken::CopierOverwrites) {
                    s.store.target[id] = written(
                        s.store.target[id],
                        &Payload::Copy(v),
                        s.store.source[id].rev().unwrap_or(0),
                    );
                    Answer::Inserted
                } else {
                    execute(&mut s.store, id, &step)
                };
                let result = copy_result(&answer).ok_or("the copy got a foreign answer")?;
                let lost = if lose {
                    " (lost)"
                } else if self.broken(Broken::CopierOverwrites) {
                    " (broken: overwrites)"
                } else {
                    ""
                };
                let _ = write!(log, "copier: {step:?} on id {id} -> {result:?}{lost}");
                debug_assert!(matches!(
                    result,
                    CopyResult::Inserted | CopyResult::AlreadyPresent
                ));
                s.copier_at = CopierAt::Idle;
                s.copier_pos += 1;
            }
        }
        Ok(())
    }

    fn cleaner(&self, s: &mut State, log: &mut String) -> Checked<()> {
        if s.cleaner_pos == self.ids() {
            let id = s.purge_pos as usize;
            let step: MStep = purge_tombstone_step(Side::Target);
            let a = execute(&mut s.store, id, &step);
            let _ = write!(log, "cleaner: {step:?} on id {id} -> {a:?}");
            s.purge_pos += 1;
            return Ok(());
        }
        let id = s.cleaner_pos as usize;
        let delete: MStep = cleanup_delete_step();
        match s.cleaner_at {
            // The scan of the source and the lookup in the target: nothing writes the source
            // during cleanup, so taking them as one step loses no interleaving.
            CleanerAt::Idle if s.store.source[id] == Slot::Absent => {
                let _ = write!(log, "cleaner: id {id} is not in the source");
                s.cleaner_pos += 1;
            }
            CleanerAt::Idle if self.broken(Broken::CleanupWithoutPresenceCheck) => {
                let a = execute(&mut s.store, id, &delete);
                let _ = write!(log, "cleaner: {delete:?} on id {id} unchecked -> {a:?}");
                s.cleaner_pos += 1;
            }
            CleanerAt::Idle => {
                let step: MStep = cleanup_lookup_step();
                let Answer::Found(found) = execute(&mut s.store, id, &step) else {
                    unreachable!("a find answers found")
                };
                let decision = cleanup_decision(&found);
                let _ = write!(log, "cleaner: target id {id}: {found:?} -> {decision:?}");
                match decision {
                    CleanupDecision::DeleteSource => s.cleaner_at = CleanerAt::Checked,
                    CleanupDecision::Missing => s.cleanup_failed = true,
                }
            }
            CleanerAt::Checked => {
                let a = execute(&mut s.store, id, &delete);
                let _ = write!(log, "cleaner: {delete:?} on id {id} -> {a:?}");
                s.cleaner_at = CleanerAt::Idle;
                s.cleaner_pos += 1;
            }
        }
        Ok(())
    }

    fn reverter(&self, s: &mut State, log: &mut String) -> Checked<()> {
        if s.phase == Phase::RolledBack && s.revert_at.is_none() {
            let id = s.revert_purge_pos as usize;
            let step: MStep = purge_tombstone_step(Side::Source);
            let a = execute(&mut s.store, id, &step);
            let _ = write!(log, "revert copier: {step:?} on id {id} -> {a:?}");
            s.revert_purge_pos += 1;
            return Ok(());
        }
        let id = s.revert_pos as usize;
        let step: MStep = revert_copy_step();
        assert_eq!(step, Step::MirrorToSource);
        match s.revert_at {
            None => {
                let image = mirror_read(&s.store, id);
                let _ = write!(log, "revert copier: reads target id {id}: {image:?}");
                s.revert_at = Some(image);
            }
            Some(image) => {
                let a = mirror_write(&mut s.store, id, image, self.mirror_rule());
                let _ = write!(
                    log,
                    "revert copier: writes {image:?} to source id {id} -> {a:?}"
                );
                s.revert_at = None;
                s.revert_pos += 1;
            }
        }
        Ok(())
    }

    /// What a read started now returns, along every read path a router may be using, must be
    /// a value some linearization allows.
    fn check_reads(&self, s: &State) -> Checked<()> {
        if self.cfg.lose_a_copy {
            return Ok(());
        }
        // A router whose lease ran out serves nothing until it loads the current phase.
        let mut phases: Vec<Phase> = s
            .routers
            .iter()
            .filter(|r| r.live)
            .map(|r| r.acked)
            .collect();
        phases.push(s.phase);
        phases.sort();
        phases.dedup();
        for phase in phases {
            for id in 0..self.cfg.workload.ids {
                let value = read(&s.store, id, phase)?;
                if !s.lin[id].iter().any(|c| c.value == value) {
                    let allowed: BTreeSet<_> = s.lin[id].iter().map(|c| c.value).collect();
                    return Err(format!(
                        "a read of id {id} in {phase} returns {value:?}; the history allows \
                         only {allowed:?}"
                    ));
                }
            }
        }
        Ok(())
    }

    /// The rules for a state with nothing left to do.
    fn check_end(&self, s: &State) -> Checked<()> {
        let ids = self.cfg.workload.ids;
        match s.phase {
            Phase::Completed => {
                for id in 0..ids {
                    if s.store.source[id] != Slot::Absent {
                        return Err(format!("cleanup ended with id {id} still in the source"));
                    }
                    if let Slot::Tomb { .. } = s.store.target[id] {
                        return Err(format!("cleanup ended with a tombstone of id {id}"));
                    }
                }
            }
            Phase::RolledBack => {
                for id in 0..ids {
                    if let Slot::Tomb { .. } = s.store.source[id] {
                        return Err(format!("the rollback ended with a tombstone of id {id}"));
                    }
                }
            }
            Phase::Cleanup if self.cfg.lose_a_copy && s.cleanup_failed => {}
            phase => return Err(format!("the migration is stuck in {phase}")),
        }
        if self.cfg.lose_a_copy {
            return Ok(());
        }
        self.check_reads(s)
    }
}

/// A `get` run to completion at one instant, along `phase`'s read path, on a scratch copy of
/// the store: the probe observes, its mirror (while rolling back) changes nothing that counts.
fn read(store: &Store, id: usize, phase: Phase) -> Checked<Option<u8>> {
    let mut store = store.clone();
    let mut machine = Machine::new(phase, Operation::Get);
    let mut next = machine.next(None).map_err(|e| e.to_string())?;
    loop {
        match next {
            Next::Do(Step::MirrorToSource) => {
                let image = mirror_read(&store, id);
                let answer = mirror_write(&mut store, id, image, MirrorRule::Product);
                next = machine.next(Some(answer)).map_err(|e| e.to_string())?;
            }
            Next::Do(step) => {
                let answer = execute(&mut store, id, &step);
                next = machine.next(Some(answer)).map_err(|e| e.to_string())?;
            }
            Next::Done(Outcome::Read(v)) => return Ok(v),
            Next::Done(other) => return Err(format!("a get answered {other:?}")),
        }
    }
}

// ---------------------------------------------------------------------------------------------
// The explorer.

struct Report {
    states: usize,
    transitions: usize,
    depth: usize,
    elapsed: Duration,
    moves: BTreeSet<(Phase, Phase)>,
    ends: BTreeSet<Phase>,
    violation: Option<String>,
}

/// 64 bits: with a few million states the chance that two share a fingerprint (and one goes
/// unexplored) is below one in a million.
fn fingerprint(s: &State) -> u64 {
    let mut h = DefaultHasher::new();
    s.hash(&mut h);
    h.finish()
}

/// Breadth first over every interleaving, so the first violation found has a shortest trace.
fn explore(cfg: &Setup) -> Report {
    let model = Model { cfg };
    let started = Instant::now();
    let init = model.initial();
    let mut seen: HashSet<u64> = HashSet::new();
    seen.insert(fingerprint(&init));
    // Parent index and action of every state, to print a trace.
    let mut parents: Vec<(u32, Act)> = vec![(u32::MAX, Act::Cleaner)];
    let mut frontier: Vec<(State, u32)> = vec![(init.clone(), 0)];
    let mut report = Report {
        states: 1,
        transitions: 0,
        depth: 0,
        elapsed: Duration::ZERO,
        moves: BTreeSet::new(),
        ends: BTreeSet::new(),
        violation: None,
    };
    let fail = |parents: &Vec<(u32, Act)>, at: u32, last: Option<Act>, why: String| {
        let mut acts: Vec<Act> = last.into_iter().collect();
        let mut i = at;
        while parents[i as usize].0 != u32::MAX {
            acts.push(parents[i as usize].1);
            i = parents[i as usize].0;
        }
        acts.reverse();
        format!("{why}\n{}", trace(&model, &acts))
    };
    if let Err(why) = model.check_reads(&init) {
        report.violation = Some(fail(&parents, 0, None, why));
    }
    while !frontier.is_empty() && report.violation.is_none() {
        report.depth += 1;
        let mut next_frontier = Vec::new();
        'states: for (s, idx) in frontier {
            let acts = model.actions(&s);
            if acts.is_empty() {
                report.ends.insert(s.phase);
                if let Err(why) = model.check_end(&s) {
                    report.violation = Some(fail(&parents, idx, None, why));
                    break 'states;
                }
            }
            for act in acts {
                report.transitions += 1;
                let mut n = s.clone();
                let mut log = String::new();
                let checked = model.apply(&mut n, act, &mut log);
                if let Act::Move(to) = act {
                    report.moves.insert((s.phase, to));
                }
                let print = fingerprint(&n);
                let checked = checked.and_then(|()| {
                    if seen.contains(&print) {
                        Ok(false)
                    } else {
                        model.check_reads(&n).map(|()| true)
                    }
                });
                match checked {
                    Err(why) => {
                        report.violation = Some(fail(&parents, idx, Some(act), why));
                        break 'states;
                    }
                    Ok(false) => {}
                    Ok(true) => {
                        seen.insert(print);
                        parents.push((idx, act));
                        next_frontier.push((n, (parents.len() - 1) as u32));
                    }
                }
            }
        }
        frontier = next_frontier;
    }
    report.states = seen.len();
    report.elapsed = started.elapsed();
    report
}

/// Replays `acts` from the initial state, one line per step.
fn trace(model: &Model<'_>, acts: &[Act]) -> String {
    let mut s = model.initial();
    let mut out = String::new();
    for (i, act) in acts.iter().enumerate() {
        let mut log = String::new();
        let result = model.apply(&mut s, *act, &mut log);
        let _ = writeln!(
            out,
            "  {:>3}. [{}] {log}\n       source {:?}\n       target {:?}",
            i + 1,
            s.phase,
            &s.store.source[..model.cfg.workload.ids],
            &s.store.target[..model.cfg.workload.ids],
        );
        if let Err(why) = result {
            let _ = writeln!(out, "       !! {why}");
        }
    }
    out
}

// ---------------------------------------------------------------------------------------------
// Workloads and tests.

fn replace(doc: u8, upsert: bool) -> Op {
    Operation::Replace { doc, upsert }
}

/// Two routers, three operations each, on two ids that both start in the source: concurrent
/// copy-on-write updates of one id, an update racing a delete, a re-insert after a delete, an
/// upsert.
fn updates_and_deletes() -> Workload {
    Workload {
        name: "updates_and_deletes",
        initial: [Some(1), Some(2), None],
        ids: 2,
        ops: [
            vec![
                (0, Operation::Update(Add(10))),
                (1, Operation::Delete),
                (1, Operation::Insert(7)),
            ],
            vec![
                (0, Operation::Update(Add(20))),
                (1, replace(9, true)),
                (0, Operation::Delete),
            ],
        ],
    }
}

/// The same size, other races: deletes first, then re-creations and updates of deleted ids,
/// a plain replace racing a delete, a read.
fn deletes_and_recreations() -> Workload {
    Workload {
        name: "deletes_and_recreations",
        initial: [Some(1), Some(2), None],
        ids: 2,
        ops: [
            vec![
                (0, Operation::Delete),
                (1, Operation::Update(Add(10))),
                (0, Operation::Insert(5)),
            ],
            vec![
                (0, replace(8, false)),
                (1, Operation::Delete),
                (0, Operation::Get),
            ],
        ],
    }
}

/// Writes straight to the process's stderr, past the test harness's capture, so that the
/// figures show in every run.
fn report_line(line: &str) {
    use std::io::Write as _;
    let _ = writeln!(std::io::stderr(), "{line}");
}

/// Three ids, the third created by the application during the migration (outside the
/// backfill's scope, inside the purges'), racing an update of it.
fn a_created_id() -> Workload {
    Workload {
        name: "a_created_id",
        initial: [Some(1), Some(2), None],
        ids: 3,
        ops: [
            vec![
                (2, Operation::Insert(5)),
                (0, Operation::Update(Add(10))),
                (1, Operation::Delete),
            ],
            vec![
                (2, Operation::Update(Add(20))),
                (0, Operation::Delete),
                (1, replace(9, true)),
            ],
        ],
    }
}

/// The same rule as `tests/support`: set to anything but empty or `0`.
fn heavy() -> bool {
    matches!(std::env::var("RESHARD_HEAVY_TESTS"), Ok(v) if !v.is_empty() && v != "0")
}

fn summary(label: &str, cfg: &Setup, r: &Report) -> String {
    format!(
        "protocol model [{label}] workload={} routers={} ops/router={} ids={}: {} states, {} \
         transitions, depth {}, {:.1?}, phase moves covered {}, final phases {:?}",
        cfg.workload.name,
        ROUTERS,
        cfg.workload.ops[0].len(),
        cfg.workload.ids,
        r.states,
        r.transitions,
        r.depth,
        r.elapsed,
        r.moves.len(),
        r.ends,
    )
}

/// Every allowed phase move, including the rollback ones and the switches' retreats.
fn all_moves() -> BTreeSet<(Phase, Phase)> {
    Phase::ALL
        .into_iter()
        .flat_map(|from| from.next().iter().map(move |to| (from, *to)))
        .collect()
}

fn assert_protocol_holds(workload: Workload) {
    assert_protocol_holds_with(workload, 0);
}

/// The real protocol with `expiries` lease expiries somewhere in each run.
fn assert_protocol_holds_with(workload: Workload, expiries: u8) {
    let cfg = Setup {
        workload,
        broken: None,
        lose_a_copy: false,
        expiries,
    };
    let report = explore(&cfg);
    let label = if expiries == 0 {
        "real protocol".to_owned()
    } else {
        format!("real protocol, {expiries} lease expiry")
    };
    report_line(&summary(&label, &cfg, &report));
    if let Some(v) = &report.violation {
        panic!("the protocol lost something:\n{v}");
    }
    assert_eq!(report.moves, all_moves(), "every phase move is explored");
    assert!(
        report.ends.contains(&Phase::Completed) && report.ends.contains(&Phase::RolledBack),
        "{:?}",
        report.ends
    );
}

fn assert_caught(broken: Broken, lose_a_copy: bool, workload: Workload, expect: &str) {
    assert_caught_with(broken, lose_a_copy, 0, workload, expect)
}

fn assert_caught_with(
    broken: Broken,
    lose_a_copy: bool,
    expiries: u8,
    workload: Workload,
    expect: &str,
) {
    let cfg = Setup {
        workload,
        broken: Some(broken),
        lose_a_copy,
        expiries,
    };
    let report = explore(&cfg);
    report_line(&summary(&format!("{broken:?}"), &cfg, &report));
    let Some(v) = report.violation else {
        panic!("{broken:?} went unnoticed");
    };
    eprintln!("{broken:?} caught:\n{v}");
    assert!(
        v.contains(expect),
        "{broken:?}: expected {expect:?} in\n{v}"
    );
}

#[test]
fn the_write_protocol_loses_nothing_in_any_interleaving() {
    assert_protocol_holds(updates_and_deletes());
    if heavy() {
        assert_protocol_holds(deletes_and_recreations());
        assert_protocol_holds(a_created_id());
    }
}

/// Issue 10: a router's lease may run out at any moment, with an operation in flight; the
/// driver then counts it out and moves on. Nothing of the operation lands afterwards, and the
/// router serves again only after loading the current phase.
#[test]
fn a_router_whose_lease_runs_out_mid_operation_loses_nothing() {
    assert_protocol_holds_with(updates_and_deletes(), 1);
    if heavy() {
        assert_protocol_holds_with(deletes_and_recreations(), 1);
    }
}

#[test]
fn a_lease_checked_only_when_an_operation_starts_is_caught() {
    assert_caught_with(
        Broken::LeaseCheckedAtStart,
        false,
        1,
        updates_and_deletes(),
        "allows",
    );
}

#[test]
fn a_lost_copy_stops_cleanup_instead_of_losing_the_document() {
    let cfg = Setup {
        workload: updates_and_deletes(),
        broken: None,
        lose_a_copy: true,
        expiries: 0,
    };
    let report = explore(&cfg);
    report_line(&summary("lost copy, real cleanup", &cfg, &report));
    if let Some(v) = &report.violation {
        panic!("cleanup deleted a document the target lacked:\n{v}");
    }
    assert!(report.ends.contains(&Phase::Cleanup), "{:?}", report.ends);
}

#[test]
fn a_copier_that_overwrites_is_caught() {
    assert_caught(
        Broken::CopierOverwrites,
        false,
        updates_and_deletes(),
        "the history allows only",
    );
}

#[test]
fn a_delete_without_tombstone_is_caught() {
    assert_caught(
        Broken::DeleteWithoutTombstone,
        false,
        updates_and_deletes(),
        "the history allows only",
    );
}

#[test]
fn a_cleanup_without_presence_check_is_caught() {
    assert_caught(
        Broken::CleanupWithoutPresenceCheck,
        true,
        updates_and_deletes(),
        "removed while the target holds neither",
    );
}

#[test]
fn skipping_the_write_switch_is_caught() {
    assert_caught(
        Broken::SkipWriteSwitch,
        false,
        updates_and_deletes(),
        "allows",
    );
}

#[test]
fn a_mirror_that_ignores_revisions_is_caught() {
    assert_caught(
        Broken::MirrorIgnoresRevision,
        false,
        updates_and_deletes(),
        "allows",
    );
}

#[test]
fn a_mirror_that_compares_revisions_across_the_sides_is_caught() {
    assert_caught(
        Broken::MirrorComparesRawRevisions,
        false,
        updates_and_deletes(),
        "allows",
    );
}

#[test]
fn a_revert_copy_before_every_router_mirrors_is_caught() {
    assert_caught(
        Broken::EarlyRevertCopy,
        false,
        updates_and_deletes(),
        "allows",
    );
}
