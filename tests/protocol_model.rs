//! The write protocol, model-checked (issues 6 and 10, the workers' batches, the rollback's end
//! after a lapse, and issue 13's silent, crashed and forgotten routers): every interleaving of
//! two routers, the backfill copier, the cleaner, the revert copier, a repairer, the driver
//! moving phases and sealing a rollback, and an operator forgetting a router, on a few
//! operations over two or three ids, some of them shared by both layouts, or over one or two
//! ids of a fanout source, some operations conditional (the application's filter beside the
//! id), upserts among them, and many-document reads, explored breadth first with state
//! hashing.
//!
//! The actors run the product's own decisions from `reshard::protocol` (the operation machines;
//! the workers' `disposition::of`, `backfill_action`, `cleanup_action`, `cleanup_decision` and
//! `revert_action`, and their checkpoints' `BatchWindow`; the repair's `repair_action`, `repair_copy_step`,
//! `repair_next` and `repair_replace_step`; the copier's `copy_result`; `purge_tombstone_step`
//! (which the product turns into its purge's filter, `copy::steps::purge_filter`); the mirrors' `mirror_writes` and `mirror_location`; where a step on
//! a fanout source goes, `listed_location`; a many-document read's plan and per-id answer,
//! `query_plan` and `query_answer`) against an in-memory store of two layouts whose
//! single-document steps are atomic, as MongoDB makes them. The model only executes steps and
//! decisions; it deviates, for the broken variants, only in its own executor and actors. A
//! stored document knows whether it is a pristine copy (`_reshard.src = "copy"`, written by a
//! copier and by no one since), which `revert_action` and `Step::ReplaceCopy` depend on. The
//! workers classify what they scan with the product's `disposition::of`, asked of the stored
//! document a slot stands for (`Model::document`: its keys and its `_reshard` envelope as the
//! product writes them) under real routing versions (`versions`): the source version places a
//! moving id on one shard, the target version on another, and both place a shared id in one
//! collection.
//!
//! What is modelled:
//! - routers: every step of an operation is an action of its own. A router serves on the phase
//!   it loaded last without reaching the state store; its lease is its self-fence deadline.
//!   The driver waits for every router that is registered and whose lease (plus the fence
//!   margin) has not run out (`Model::counted`);
//! - a silent router (cut off from the state store): while its lease is live it serves its
//!   old phase and acknowledges nothing, and the driver waits for it (every router action is
//!   optional, so every run holds such stretches). Its lease may run out mid-operation
//!   (`Setup::expiries`, `Act::Expire`, a lapse): nothing of the operation lands afterwards
//!   (the step it was about to run is never sent, one in flight ended by the deadline), the
//!   application is told what the machine says may have happened, the driver counts the
//!   router out, and it serves again only after renewing and loading the current phase;
//! - a crashed router (`Setup::crashes`, `Act::Crash`): it stops for good, possibly
//!   mid-operation, some steps done and the rest never. Until its lease runs out it is a
//!   silent router that does nothing, which the interleavings already hold (a statement it
//!   had in flight lands by the lease's deadline, so it may as well have landed before the
//!   crash); the crash itself is its lease running out, handled as a lapse, with no renewal
//!   ever after and its remaining operations never run. Its pending step never lands, unlike a
//!   killed worker's orphans: a router's commands end by its lease's deadline, before the
//!   driver counts it out. The migration must end without it;
//! - a forgotten router (`Setup::forgets`, `Act::Forget`, `reshard router remove`): an
//!   operator removes its registration, allowed only once its lease (plus the margin) ran out,
//!   when the driver counts it out anyway, and never in `reverting` or `revert_switch`. A
//!   silent (not crashed) router that comes back finds its registration gone and registers
//!   again, which is a lapse: it loads the current phase before it serves;
//! - workers work in batches, as the product's do: a worker's partition covers the workload's
//!   ids, cut into `Setup::batches` batches in id order (one batch unless a run says
//!   otherwise; the batch runs cut it into one id each). Its scan reads one id per step (each
//!   read atomic, a batch as a whole not), in id order and ahead of the writes (the product's
//!   reader task reads the next batch while the worker prepares and writes the last); the
//!   worker decides per document, and once a batch is read (and, in cleanup, its moved ids
//!   looked up) sends it as one unordered bulk write whose statements land in any order, each
//!   an action of its own, interleaved with everything else, the next batch's reads and
//!   statements included: up to two batches (`max_in_flight_per_shard`'s default, as
//!   `BatchWindow::in_flight` counts them) in flight at once. The checkpoint follows the
//!   writes through the product's own `BatchWindow` (in the worker's state): a batch is
//!   recorded once it and every batch before it settled well (the checkpoint statement is
//!   atomic then, for one batch or several), a batch that did not settle well ends the
//!   execution (nothing from it on is recorded, what is in flight settles), and an execution
//!   starts from the checkpoint: after a checkpoint of batch 1, a re-execution repeats batch
//!   2 alone, read again and decided again. An execution once started goes on if the phase
//!   moves meanwhile, until the worker notices, late and between batches (`Act::Release`): it
//!   sends no more and releases the partition once what is in flight settled;
//! - partial failure and re-execution: a statement may fail transiently
//!   (`Setup::transients`): not applied, its batch settles not well once its other statements
//!   landed, and once every batch in flight settled the partition is executed again from the
//!   checkpoint (read again, decided again, written again): from batch 2 when batch 2 failed
//!   after batch 1 was recorded, from batch 1 when batch 1 failed, batch 2 settled well or not;
//! - kills and orphans: a worker may be killed with statements in flight, of one batch or of
//!   both (`Setup::kills`); each becomes an orphan that lands or is dropped at any later
//!   moment, and a new worker takes the partition over (executing it again from the last
//!   checkpoint) only once every orphan settled, which the product guarantees by giving every
//!   bulk command a deadline that ends before the partition lease and by taking a partition
//!   over only a margin after its lease expired. With `Setup::replans`:
//!   another worker process's re-plan of an outdated revert copy (`Act::Replan`), which voids
//!   the holder's lease: its statements in flight become orphans, and the partition is taken
//!   over only once they settled (the reset keeps the lease until it and its margin ran out;
//!   the product's rule until session 12 made it pending at once, `ReplanWithoutWaiting`);
//! - the copier inserts copies if absent and dead-letters what cannot be routed; cleanup reads
//!   the source, looks every moved id up in the target, fails the whole batch if one is
//!   missing and otherwise deletes in any order, keeping what cannot be routed; the revert
//!   copier reads target images and carries back, by revision, all but pristine copies; the
//!   tombstones are purged on each side once nothing can copy or mirror an older version;
//! - the rollback's end. In `reverting` every router operation mirrors the target document
//!   it touched to the source before it reports; a read in `revert_switch` carries the
//!   target's image to the source before it reads there (`OperationMachine::new`). A lapse
//!   outdates the revert copy: a router counted out in `reverting` or `revert_switch` after
//!   the revert copier's pass started may have left a target write behind the pass, never
//!   mirrored (`State::revert_outdated`); the copy counts as complete (`Gate::RevertComplete`,
//!   which guards both `reverting -> revert_switch` and `revert_switch -> rolled_back`) only
//!   after a pass that started later, and the revert copier starts one, in `reverting` or in
//!   `revert_switch`, once every live router acknowledged the phase. In `rolled_back` a router
//!   stamps the source documents it writes as this migration's, revision counted on, so that
//!   a late mirror by a router still in `revert_switch` never overwrites them, and a delete
//!   leaves a source tombstone (`ReplaceLive(Source, Tombstone)`) until the rollback is
//!   sealed: a driver move, once every live router acknowledged `rolled_back`, that keeps the
//!   phase and bumps the epoch. Routers acknowledge the sealed epoch like any other (and a
//!   router renewing after a lapse loads it), build their machines `.sealed(true)` from then
//!   on, and the source's tombstone purge runs only once every live router acknowledged the
//!   seal. A `revert_switch -> reverting` retreat is allowed whenever `Phase::next` allows it,
//!   outdated copy or not: the model finds no need to forbid it;
//! - a lost copy and its repair (`Setup::lose_a_copy`): one copy may be acknowledged but not
//!   there; in `reconcile` and `new_reads` a repairer re-copies, for each id reconciliation
//!   finds missing from the target or held there as a stale pristine copy, the source
//!   document with insert-if-absent and then a replace of a pristine copy only, never over
//!   the application's write or a tombstone. Reconciliation is sampled, so the driver may
//!   move on before the repair covered every id: the migration then completes or stops in
//!   cleanup, whichever the interleaving gives;
//! - documents that cannot be routed (`Workload::unroutable`): no router can address them, the
//!   copier dead-letters them (an operator skips the dead letter), cleanup keeps them, and
//!   they stay in the source however the migration ends;
//! - shared ids (`Workload::shared`): ids that both versions place in one collection both
//!   layouts share, so their source and target document are one (`Store::shared`: every step,
//!   on either side, reaches the same slot). The backfill finds such a document in place
//!   (`Disposition::Stays`), cleanup keeps it, reconciliation finds it right (a staying
//!   document is judged by its routing field) so the repair leaves it, the removal of the
//!   target layout after a rollback leaves it, and each tombstone purge acts on the one
//!   document. In `reverting` no mirror writes it: the router's executor asks `mirror_writes`
//!   whether the image was found where the source version places the id, and if so is done
//!   without a write (`router::exec::mirror_to_source`); the revert copier hands
//!   `revert_action` the location it scanned. Its stamp (`_reshard.mig`) follows the
//!   product's writes: a replace, a tombstone or an insert drops it, an update keeps it, a
//!   `rolled_back` source write sets it. The revert copier's scan reads a document no one
//!   wrote through reshard (revision 0) as the other layout's, as `disposition::of` does;
//! - a fanout source (`Workload::fanout`, the fanout world): the source version is a layout
//!   reshard did not make, listing two locations for every id (s1, then s3), and an id's
//!   document starts on one of them, the second for the interesting ids (`Store::source_slots`
//!   holds a document per listed location). A router's step on the source is two actions, as
//!   the product's executor runs it: a probe of every listed location, then the step sent
//!   where `listed_location` says (a find is answered by the probe; an insert is a duplicate
//!   key when any listed location holds the id, else goes to the first; any other write goes
//!   where the document is, and matches nothing when none holds it: both answered unsent); a
//!   router's mirror is three: the target read, the probe, the conditional write where
//!   `mirror_location` says. The revert copier places each mirror of its batch by a lookup
//!   of the listed locations when it reads the batch (`place_mirrors`, in the product just
//!   before the batch is sent), so the write lands later; cleanup deletes a document where
//!   its scan read it; the source's purge runs at every listed location.
//! - conditional operations (`Call::Op` with a condition, `Below(k)`: the document's value is
//!   below `k`; the workloads' updates `Add(10)` make a document stop matching `Below(10)`, a
//!   replace or an insert of a small value makes it match again): the router's executor
//!   answers a conditional find in one atomic read, `Found::Unmatched` for a live document
//!   the condition does not match, and puts the condition in the filter of the writes that
//!   act on a live document (`ReplaceLive`, the delete's tombstone among them, `UpdateLive`,
//!   `DeleteLive`: `execute_if`), never in the others (the inserts of copies, tombstones and
//!   new documents, `ReplaceTombstone`, `ReplaceCopy`, `Delete`, the purges, the mirrors);
//!   the machines decide the rest. The product's executor was first described as finding in
//!   two reads (by id, then `{_id, $and: [condition]}`), which the model catches
//!   (`Broken::FindInTwoReads`): the model's find is the atomic one the machines assume;
//! - upserts (`Operation::Upsert`), with and without a condition: the machine's update
//!   (copied on write from the source), its insert along the insert's path where nothing
//!   matched, and its retry-once rule (`Event::UpsertRetried`) when that insert meets a
//!   document holding the id;
//! - many-document reads (`Call::Query`, the front's `find` on the tenant with a filter): a
//!   router's operation over every routable id, planned by `query_plan` in the phase the
//!   router applies (not started while the plan is `Held`, in `revert_switch`, as a write is
//!   not); each of the plan's reads (`QueryRead`: the source's matches, the presence check of
//!   the ids that read returned, the target's matches) reads the ids in id order, each
//!   document atomically and one action each among everything else, the read done before the
//!   next starts (`QueryRun`, in the runs' table: the state keeps its number); then
//!   `query_answer` answers each id from what the reads found of it. `query_answer` refuses
//!   every read in `reverting`, where the `Get` machine asks for its mirror before it reports:
//!   the front fails such a read, and the model takes it for one that told nothing
//!   (`Event::QueryRefused`); the experiment `Setup::unmirrored_query_answers` answers them by
//!   the `Get` machine's outcome, the mirror answered unsent.
//!
//! The checks, after every step:
//! - the history of every id is linearizable against a plain key-value specification (every
//!   acknowledged write is what a later read returns; a deleted id reads as absent), tracked as
//!   the set of abstract states some linearization of the history so far can be in. With
//!   conditions (`spec`): a conditional update, delete or replace applies only to a live
//!   document the condition matches, a conditional read returns only such a document, and
//!   where a live document holds the id but does not match, an upsert (and a replace with
//!   upsert) reports a duplicate, as MongoDB's unique index makes it. A many-document read is
//!   a conditional read of every id it covers, pending from its start to its answer;
//! - a read started at this instant, along every read path a router may be using, returns a
//!   value one of those linearizations allows;
//! - no actor but a router writing the source layout (or, for a shared id's one document, any
//!   router: the application's delete) removes a source document while the target holds
//!   neither a copy nor a tombstone of it;
//! - a repair never overwrites the application's write or a tombstone;
//! - a fanout source holds one document per id (live or tombstone) among the locations it
//!   lists, as one collection would: a second is a second version of the id;
//! - an operation machine never rejects an answer or gives up, and a worker decision never
//!   dead-letters a routable document.
//!
//! And in every final state: the migration ended (`completed` or `rolled_back`, or, with a lost
//! copy, stopped by cleanup); after cleanup only target documents remain (a shared id's
//! document is one, and the documents that cannot be routed stay in the source) and no
//! tombstone is left; after a rollback it is sealed, the source's purge ran, and the source
//! holds the data and no tombstone (in a shared id's document neither). With a lost copy the
//! reads are wrong by construction until a repair, so only cleanup's safety, the repair's
//! writes and the final state are checked there.
//!
//! Deliberately broken variants (`Broken`: the copier overwrites, first or only when it
//! executes a batch again; a delete writes no tombstone; cleanup deletes without looking, or
//! deletes what cannot be routed; the write switch is skipped; the rollback mirror ignores or
//! misreads revisions; the revert copier starts before every router mirrors, or overwrites
//! when it executes a batch again; a router checks its lease only when an operation starts; a
//! takeover does not wait for the orphans; the revert copy counts as complete despite a lapse
//! during its pass; a read in `revert_switch` looks at the source alone; source writes in
//! `rolled_back` are not stamped; deletes in `rolled_back` remove the source document before
//! the seal; the source's purge runs before every router acknowledged the seal; an operator
//! forgets a router whose lease is live, which serves on while the driver moves past it; the
//! checkpoint passes a batch that did not settle well, recording the batch after it; the
//! checkpoint records a batch that settled well before the batches sent before it settled; a
//! router's mirror, or the revert copier's, writes into a shared id's one document; with a
//! fanout source, a router's mirror, or the revert copier's, goes to the first listed
//! location whatever holds the id, an insert goes there without looking at the others, or a
//! replace, an update or a delete goes there without looking where the document is; a
//! conditional operation's condition left out of the filter of its writes, or out of its
//! delete's tombstone in the target alone; the find checking the condition in a second read,
//! answering the first read's document or the second's; `Unmatched` in the target taken for
//! `Absent`; an upsert sent to the target as MongoDB's own, or reporting the duplicate without
//! trying its update again; a many-document read that reads the target's matches before the
//! presence check, or makes none) must each be caught, so that a clean run of the real
//! protocol means something.
//!
//! Not modelled: the routing field a staying document is stamped with (the model's layouts
//! have none: `Disposition::Stays { stamp: None }`); misplaced documents and their repair; a
//! fanout layout listing more than two locations, or as the target, or listing the
//! collection the target places an id in (a shared id: the fanout world has none, nor
//! documents that cannot be routed); the probes of the listed locations as several reads
//! (the product sends them at once; the model takes them at one instant, and the write that
//! follows as a step of its own: nothing creates a document of an id held nowhere but at the
//! first listed location, where the unique index refuses a second); the workers' scans of
//! each listed location apart (the model's scan reads the id's one document where it is);
//! more than one partition per worker, and more than three batches per partition (the
//! model's scan reads ahead without a bound, a superset of the product's reader, at most two
//! batches ahead);
//! the checkpoint statement's own delay or failure, and what it carries besides the position
//! (counters, dead letters): it lands, atomically, when the batch that allows it settles (a
//! later one is a later last acknowledgement, a kill before it lands the same as a kill
//! before that acknowledgement whose orphan then lands; after a failed one the product
//! records the batches that settled meanwhile in its next statement, past the failed one's
//! batches, harmless to the documents, which all settled well, though the failed statement's
//! counters and dead letters are never recorded); a worker released between batches for
//! another reason than a phase move (a pause, a shutdown: with one id per batch, the same as
//! the next batch failing on its one statement); permanent refusals of a statement (a
//! routable document dead-lettered); reconciliation itself (its gate passes; the
//! repairer acts on what it would find); the state store beyond the phase, the checkpoints and
//! the leases (the seal is one flag; the product's rule that a lapse outdates the revert
//! copy compares the count-out's time with the pass's start, the model orders the actions).
//! The model keeps that lapse in its own state, not in the router's row, so a forget in
//! `reverting` or `revert_switch` could not lose it here: the rule that refuses it there is
//! enforced, not tested by a broken variant. A router shutting down (draining, then
//! deregistering) is not modelled apart: to the protocol it is a router that stopped serving.
//! Conditions and many-document reads in the fanout world (its probes would carry the
//! condition); conditions other than one threshold on the value (the condition is the
//! server's business: only whether it matches counts), and an upsert's document built from
//! the filter's equalities (the workload gives it); a many-document read's other forms
//! (`count`, `distinct`, `aggregate`: the same plan and answers), another order of its
//! documents within a read than the ids', its batches and cursors (`getMore`, and a cursor
//! going on across a phase move, `cursor_continues`), and how long it waits in
//! `revert_switch`.
//!
//! Always on: the issue's workload (2 routers x 3 operations x 2 ids) with every phase move, by
//! itself and with one lease expiry, one transient failure, one worker kill, a lost copy, a
//! third, unroutable document, one crash and one forget, and one lease expiry and one forget;
//! and, on its first two operations per router, with the partitions in two batches of one id
//! each, with one transient failure and with one kill; and with one id shared (either): on
//! the first two operations per router, by itself and with one lease expiry, and on the full
//! `updates_and_deletes` and `deletes_and_recreations`. With `RESHARD_HEAVY_TESTS=1` (CI sets
//! it) two more workloads (one on three ids) and combinations of the faults run; for the
//! batches: the full workloads with a transient failure or a kill, a transient failure with a
//! lease expiry or with a kill, a lost copy with a kill, and three batches of one id each (two
//! in flight at most); for shared ids: batches with a transient failure, a kill, a lost copy,
//! both ids shared, a shared id created during the migration, an unroutable document, and a
//! lease expiry on the full workload. In the fanout world: on the first two operations per
//! router with one id on the second listed location, and on inserts of one id there, each by
//! itself and with one lease expiry; heavy: batches with a transient failure, a kill, and the
//! full `updates_and_deletes` and `deletes_and_recreations` with both ids on the second
//! listed location. Conditions: `conditional` by itself and with one lease expiry, and
//! `conditional_upserts`; upserts: `upserts` by itself and with one lease expiry; many-document
//! reads: `queries` by itself, with one lease expiry and with one worker kill. Heavy:
//! `conditional` with a transient failure, with a kill, and with either id shared;
//! `conditional_upserts` with a lease expiry; `conditional_short` in two batches with a
//! transient failure; `upserts` with a kill, with a transient failure, and with either id
//! shared; `queries` in two batches with a transient failure, with either id shared, and the
//! experiment `Setup::unmirrored_query_answers` with a lease expiry. Figures: BENCHMARKS.md,
//! "Protocol model" (the batch, shared-id and fanout runs: the test output).

use std::cell::RefCell;
use std::collections::{BTreeSet, HashMap};
use std::fmt::Write as _;
use std::hash::{BuildHasherDefault, Hash, Hasher};
use std::sync::LazyLock;
use std::time::{Duration, Instant};

use mongodb::bson::{doc, Bson, Document};
use reshard::disposition::{self, Disposition};
use reshard::envelope;
use reshard::phase::{Gate, Phase, WritePath};
use reshard::protocol::{
    backfill_action, cleanup_action, cleanup_decision, cleanup_delete_step, cleanup_lookup_step,
    copy_result, listed_location, mirror_is_newer, mirror_location, mirror_writes,
    purge_tombstone_step, query_answer, query_plan, repair_action, repair_copy_step, repair_next,
    repair_replace_step, revert_action, Answer, BackfillAction, BatchWindow, CleanupAction,
    CleanupDecision, Found, Interrupted, Listed, MirrorSource, Next, Operation, OperationMachine,
    Outcome, Payload, QueryPlan, RepairAction, RepairNext, RevertAction, Side, Step,
};
use reshard::routing::{KeyValue, Layout, Location, RoutingVersion, TenantShard};

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

/// The application's condition beside the id (`updateOne({_id, v: {$lt: k}}, ...)`, a queue's
/// `findOneAndUpdate`, a query's filter): the document's value is below `k`. With the
/// workloads' values (1, 2) and updates (`Add(10)`, `Add(20)`) a document matches `Below(10)`
/// until an update makes it stop matching, and a replace or an insert of a small value makes
/// it match again.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
struct Below(u8);

/// Whether a live document of value `v` matches `cond` (no condition: every live document).
fn matches(cond: Option<Below>, v: u8) -> bool {
    cond.is_none_or(|Below(k)| v < k)
}

/// The `Get` every id of a many-document read stands for in the specification.
const GET: Op = Operation::Get;

// ---------------------------------------------------------------------------------------------
// The store: two layouts, one slot per id and side.

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
enum Slot {
    Absent,
    /// `copy`: a pristine copy (`_reshard.src = "copy"`): written by a copier (the backfill, a
    /// router's copy-on-write, a repair) and by no one since; application writes, updates and
    /// tombstones clear it. `revert_action` and `Step::ReplaceCopy` depend on it in the
    /// target; in the source nothing reads it (see `mirror_write`).
    Live {
        v: u8,
        rev: u8,
        copy: bool,
    },
    Tomb {
        rev: u8,
    },
}

impl Slot {
    fn rev(self) -> Option<u8> {
        match self {
            Slot::Absent => None,
            Slot::Live { rev, .. } | Slot::Tomb { rev } => Some(rev),
        }
    }

    /// The slot in 19 bits, losslessly.
    fn bits(self) -> u64 {
        match self {
            Slot::Absent => 0,
            Slot::Live { v, rev, copy } => {
                1 | u64::from(copy) << 2 | u64::from(v) << 3 | u64::from(rev) << 11
            }
            Slot::Tomb { rev } => 2 | u64::from(rev) << 11,
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

/// The model's collection, on two shards. The source version places a moving id on s1 and
/// the target version on s2; both place a shared id on s2, in the collection both layouts
/// share, where it is one document (`Store::shared`). In the fanout world
/// (`Workload::fanout`) the source version is a `fanout` layout listing s1 and s3 for every id
/// (`FANOUT`), and an id's source document sits on one of them.
static ON_S1: LazyLock<Location> = LazyLock::new(|| Location::new("s1", "orders"));
static ON_S2: LazyLock<Location> = LazyLock::new(|| Location::new("s2", "orders"));
static FANOUT: LazyLock<[Location; LISTED]> =
    LazyLock::new(|| [ON_S1.clone(), Location::new("s3", "orders")]);

/// The most locations a source version of the model lists for an id: the fanout world's two.
const LISTED: usize = 2;

/// A location no routing version of the model places anything at: what the broken
/// `RevertCopyIntoSharedDocument` hands `revert_action` as the location it scanned.
static ELSEWHERE: LazyLock<Location> = LazyLock::new(|| Location::new("s9", "elsewhere"));

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Store {
    /// Per id, the documents at the locations the source version lists for it, in its order
    /// (`Store::listed`: one but in the fanout world), and the document where the target
    /// version places it. A shared id has one document for both, kept at its one source
    /// location (its `target_slots` entry stays absent). Read and written through
    /// [`Store::get`], [`Store::slot`] and [`Store::slot_at`] only; the fingerprint and the
    /// probe reads' memo take them raw.
    source_slots: [[Slot; LISTED]; IDS],
    target_slots: [Slot; IDS],
    /// Whether each source document is stamped as this migration's (`_reshard.mig`): written
    /// by a mirror, or by a router applying `rolled_back`. Mirrors compare revisions only
    /// with such documents; any other source document is older than every target version.
    mirrored: [[bool; LISTED]; IDS],
    /// The workload's shared ids (`Workload::shared`): ids that both routing versions place in
    /// one collection both layouts share, so that their source and their target document are
    /// one. Constant through an exploration, so the fingerprint leaves it out.
    shared: [bool; IDS],
    /// The fanout world (`Workload::fanout`): the source version lists `FANOUT` for every id.
    /// Constant through an exploration, so the fingerprint leaves it out.
    fanout: bool,
}

impl Store {
    /// The document `side`'s version places for `id` at its first listed location: for a
    /// shared id, one document whatever the side.
    fn slot(&mut self, side: Side, id: usize) -> &mut Slot {
        self.slot_at(side, id, 0)
    }

    /// The document at the source's listed location `at` (0 on the target side).
    fn slot_at(&mut self, side: Side, id: usize, at: usize) -> &mut Slot {
        match side {
            Side::Target if !self.shared[id] => &mut self.target_slots[id],
            Side::Source | Side::Target => &mut self.source_slots[id][at],
        }
    }

    /// The id's document on `side`: on the source, the one at the first listed location
    /// holding the id (there is at most one, `Model::apply` checks).
    fn get(&self, side: Side, id: usize) -> Slot {
        match side {
            Side::Target if !self.shared[id] => self.target_slots[id],
            Side::Source | Side::Target => self.source_slots[id][self.found_at(id)],
        }
    }

    /// The listed location of the id's source document; the first when none holds it.
    fn found_at(&self, id: usize) -> usize {
        if !self.fanout {
            return 0;
        }
        (0..LISTED)
            .find(|&at| self.source_slots[id][at] != Slot::Absent)
            .unwrap_or(0)
    }

    /// The locations the source version lists for `id`, in its order: `FANOUT` in the fanout
    /// world, else the one location it places the id at.
    fn listed(&self, id: usize) -> &'static [Location] {
        if self.fanout {
            &FANOUT[..]
        } else if self.shared[id] {
            std::slice::from_ref(&*ON_S2)
        } else {
            std::slice::from_ref(&*ON_S1)
        }
    }

    /// Which of the listed locations hold a document with `id`, live or tombstone, as the
    /// executors' probes of each find it (those past the listed ones hold nothing).
    fn holds(&self, id: usize) -> [bool; LISTED] {
        self.source_slots[id].map(|slot| slot != Slot::Absent)
    }

    /// The position of `location` among the locations listed for `id`.
    fn position(&self, id: usize, location: &Location) -> usize {
        self.listed(id)
            .iter()
            .position(|l| l == location)
            .expect("a listed location")
    }

    /// Where `side`'s version places `id`: for a shared id, one location whatever the side;
    /// on the source, the listed location of its document (where a scan finds it).
    fn location(&self, side: Side, id: usize) -> &'static Location {
        match side {
            Side::Source => &self.listed(id)[self.found_at(id)],
            Side::Target => &ON_S2,
        }
    }
}

/// The document a write leaves behind. Application writes and tombstones take the previous
/// revision + 1 atomically on either side (the product counts source revisions too), and a
/// copy keeps the revision of the source document it copies (`router::copy_document`).
fn written(prev: Slot, payload: &Payload<u8>, source_rev: u8) -> Slot {
    let rev = prev.rev().map_or(1, |r| r + 1);
    match payload {
        Payload::App(v) => Slot::Live {
            v: *v,
            rev,
            copy: false,
        },
        Payload::Copy(v) => Slot::Live {
            v: *v,
            rev: source_rev,
            copy: true,
        },
        Payload::Tombstone => Slot::Tomb { rev },
    }
}

/// Executes one single-document step atomically, on the source at its first listed location.
/// `MirrorToSource` is two steps and is run by the actors through [`mirror_read`] and
/// [`mirror_write`].
fn execute(store: &mut Store, id: usize, step: &MStep) -> Answer<u8> {
    execute_at(store, id, 0, step)
}

/// Executes one single-document step atomically, on the source at its listed location `at`.
fn execute_at(store: &mut Store, id: usize, at: usize, step: &MStep) -> Answer<u8> {
    execute_if(store, id, at, step, None)
}

/// Executes one single-document step atomically, on the source at its listed location `at`,
/// with the operation's condition in the filter of the writes that act on a live document
/// (`ReplaceLive`, the delete's `ReplaceLive(side, Tombstone)` among them, `UpdateLive`,
/// `DeleteLive`), as the product's executor sends them; every other step ignores it (copies,
/// tombstones and new documents are inserted, a tombstone is replaced, whatever the
/// condition). A find ignores it too: the router's executor answers a conditional find itself
/// (`Model::advance_run`).
fn execute_if(
    store: &mut Store,
    id: usize,
    at: usize,
    step: &MStep,
    cond: Option<Below>,
) -> Answer<u8> {
    let before = store.source_slots[id][at];
    let answer = execute_step(store, id, at, step, cond);
    // A write that matched nothing leaves the source document, and its stamp, as they were.
    // One that changed it: a replace, a tombstone or an insert builds the document afresh,
    // without `_reshard.mig`; an update (`$set`, `$inc`) keeps it. A moving id's source
    // document loses the stamp on any change all the same: once a mirror may have stamped
    // it, the only router that writes it applies `rolled_back` and stamps it again
    // (`Model::router_execute`), and workers only delete, so whether an update keeps it never
    // shows. A shared id's document is written through the target path too, by routers in
    // `reverting` among the mirrors, and there the model keeps the product's distinction.
    let keeps_stamp = store.shared[id] && matches!(step, Step::UpdateLive(..));
    if store.source_slots[id][at] != before && !keeps_stamp {
        store.mirrored[id][at] = false;
    }
    answer
}

fn execute_step(
    store: &mut Store,
    id: usize,
    at: usize,
    step: &MStep,
    cond: Option<Below>,
) -> Answer<u8> {
    let source_rev = store.get(Side::Source, id).rev().unwrap_or(0);
    // A live document the condition (if any) matches: what the live-acting writes' filter
    // selects.
    let live = |slot: &Slot| matches!(*slot, Slot::Live { v, .. } if matches(cond, v));
    match step {
        Step::Find(side) => Answer::Found(store.slot_at(*side, id, at).found()),
        Step::Insert(side, payload) => {
            let slot = store.slot_at(*side, id, at);
            if *slot == Slot::Absent {
                *slot = written(*slot, payload, source_rev);
                Answer::Inserted
            } else {
                Answer::DuplicateKey
            }
        }
        Step::ReplaceLive(side, payload) => {
            let slot = store.slot_at(*side, id, at);
            let hit = live(slot);
            if hit {
                *slot = written(*slot, payload, source_rev);
            }
            Answer::Matched(hit)
        }
        Step::ReplaceTombstone(side, payload) => {
            let slot = store.slot_at(*side, id, at);
            let hit = matches!(slot, Slot::Tomb { .. });
            if hit {
                *slot = written(*slot, payload, source_rev);
            }
            Answer::Matched(hit)
        }
        Step::UpdateLive(side, Add(k)) => {
            let slot = store.slot_at(*side, id, at);
            match *slot {
                // The update stamps `_reshard.src = "app"`: no longer a pristine copy.
                Slot::Live { v, rev, .. } if matches(cond, v) => {
                    *slot = Slot::Live {
                        v: v.wrapping_add(*k),
                        rev: rev + 1,
                        copy: false,
                    };
                    Answer::Matched(true)
                }
                _ => Answer::Matched(false),
            }
        }
        Step::Delete(side) => {
            let slot = store.slot_at(*side, id, at);
            let hit = *slot != Slot::Absent;
            *slot = Slot::Absent;
            Answer::Matched(hit)
        }
        Step::DeleteLive(side) => {
            let slot = store.slot_at(*side, id, at);
            let hit = live(slot);
            if hit {
                *slot = Slot::Absent;
            }
            Answer::Matched(hit)
        }
        Step::DeleteTombstone(side) => {
            let slot = store.slot_at(*side, id, at);
            let hit = matches!(slot, Slot::Tomb { .. });
            if hit {
                *slot = Slot::Absent;
            }
            Answer::Matched(hit)
        }
        // Every document of the model carries the envelope (no writer bypasses the routers):
        // a delete of a plain one finds none.
        Step::DeleteUnmarked(_) => Answer::Matched(false),
        Step::ReplaceCopy(side, payload) => {
            let slot = store.slot_at(*side, id, at);
            let hit = matches!(slot, Slot::Live { copy: true, .. });
            if hit {
                *slot = written(*slot, payload, source_rev);
            }
            Answer::Matched(hit)
        }
        Step::MirrorToSource => unreachable!("mirrors run as two steps"),
    }
}

/// Whether a router's step is one on the fanout world's source, which its executor places
/// among the listed locations after probing every one of them ([`probe_listed`]).
fn on_listed_source(store: &Store, id: usize, step: &MStep) -> bool {
    let source = match step {
        Step::Find(side)
        | Step::Insert(side, _)
        | Step::ReplaceLive(side, _)
        | Step::ReplaceTombstone(side, _)
        | Step::ReplaceCopy(side, _)
        | Step::UpdateLive(side, _)
        | Step::Delete(side)
        | Step::DeleteLive(side)
        | Step::DeleteTombstone(side)
        | Step::DeleteUnmarked(side) => *side == Side::Source,
        Step::MirrorToSource => false,
    };
    store.fanout && source && store.listed(id).len() > 1
}

/// What a probe of the listed locations made of a router's step on the fanout source.
enum Probed {
    /// Send it to this listed location next.
    At(usize),
    /// Its answer, unsent.
    Answered(Answer<u8>),
}

/// What the router's executor makes of a step on the fanout source once its probe of every
/// listed location answered (the probes are reads, taken at one instant here):
/// `listed_location` says where the step goes, or answers it unsent; a find is answered by
/// the probe itself.
fn probe_listed(store: &Store, id: usize, step: &MStep) -> Probed {
    let listed = store.listed(id);
    match listed_location(step, listed, &store.holds(id)[..listed.len()]) {
        Listed::At(location) => {
            let at = store.position(id, location);
            match step {
                Step::Find(_) => {
                    Probed::Answered(Answer::Found(store.source_slots[id][at].found()))
                }
                _ => Probed::At(at),
            }
        }
        Listed::Answered(answer) => Probed::Answered(answer),
    }
}

/// The mirror's first single-document step: read the target document with its revision.
fn mirror_read(store: &Store, id: usize) -> Slot {
    store.get(Side::Target, id)
}

/// Whether a router's mirror, having read `image`, is done without its second step, as
/// `router::exec::mirror_to_source` is when `mirror_writes` says the image was found where the
/// source version places the id (a shared id: the image is the source's document). An
/// absent image is answered by the second step, as before. `ignored`: the broken
/// `MirrorIntoSharedDocument`, which writes whatever `mirror_writes` says.
fn mirror_in_place(store: &Store, id: usize, image: Slot, ignored: bool) -> bool {
    image != Slot::Absent
        && !ignored
        && !mirror_writes(store.location(Side::Target, id), store.listed(id))
}

/// Where a mirror of `id` writes among the locations the source lists for it, as the
/// router's executor and the revert copier's `place_mirrors` decide once a probe of each
/// answered (`mirror_location`): where the source document is, else the first listed. With
/// one listed location, there, unprobed. `unlooked`: the broken `MirrorToFirstListed` and
/// `RevertCopyToFirstListed`, which go to the first listed location whatever holds the id.
fn mirror_at(store: &Store, id: usize, unlooked: bool) -> usize {
    let listed = store.listed(id);
    if unlooked || listed.len() == 1 {
        return 0;
    }
    let holds = store.holds(id);
    let location = mirror_location(listed, &holds[..listed.len()]).expect("a listed location");
    store.position(id, location)
}

/// What a mirror into the source document of `id` at its listed location `at` finds there,
/// as `protocol::mirror_is_newer` takes it.
fn mirror_source(store: &Store, id: usize, at: usize) -> MirrorSource {
    match store.source_slots[id][at] {
        Slot::Absent => MirrorSource::Absent,
        _ if !store.mirrored[id][at] => MirrorSource::Unmirrored,
        slot => MirrorSource::Mirrored(slot.rev().map(i64::from)),
    }
}

/// The mirror's second step: the conditional upsert of the image into the source document at
/// its listed location `at`. `rule` other than `MirrorRule::Product` is a broken variant.
fn mirror_write(
    store: &mut Store,
    id: usize,
    at: usize,
    image: Slot,
    rule: MirrorRule,
) -> Answer<u8> {
    let Some(rev) = image.rev() else {
        return Answer::Matched(false);
    };
    let source = store.source_slots[id][at];
    let newer = match rule {
        // The product's filter: `_reshard.mig` differs (a source document no mirror of this
        // migration wrote is older than any target version) or its revision is lower.
        MirrorRule::Product => mirror_is_newer(mirror_source(store, id, at), i64::from(rev)),
        // Broken: revisions compared across the sides, as if one counter ran on both.
        MirrorRule::RawRevision => source.rev().is_none_or(|r| r < rev),
        // Broken: whatever the mirror read wins.
        MirrorRule::Overwrite => true,
    };
    if newer {
        // The product stores the image with its writer (`_reshard.src`), a mirrored pristine
        // copy as one; but nothing reads the writer of a source document (a source scan's
        // disposition, the repair, reconciliation's content check look at the source's
        // fields and the target's writer), so the model keeps the flag to the target, where
        // it counts, and spares the states that differ only by it.
        store.source_slots[id][at] = match image {
            Slot::Live { v, rev, .. } => Slot::Live {
                v,
                rev,
                copy: false,
            },
            other => other,
        };
        store.mirrored[id][at] = true;
    }
    Answer::Matched(newer)
}

/// How a mirror decides whether its image is newer than the source document.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
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

/// The operation `op`, with the application's condition `cond` beside the id, applied
/// atomically to `value`: the new value and what it reports. A conditional update, delete or
/// replace applies only to a live document the condition matches, a conditional read returns
/// only such a document; where a document holds the id but does not match, an upsert (and a
/// replace with upsert) would insert a second document of the id, which MongoDB refuses with
/// a duplicate key. An insert has no condition.
fn spec(op: &Op, cond: Option<Below>, value: Option<u8>) -> (Option<u8>, Res) {
    let matched = value.filter(|&v| matches(cond, v));
    match op {
        Operation::Get => (value, Res::Read(matched)),
        Operation::Insert(d) => match value {
            None => (Some(*d), Res::Inserted),
            Some(_) => (value, Res::Duplicate),
        },
        Operation::Replace { doc, upsert } => match (value, matched) {
            (_, Some(_)) => (Some(*doc), Res::Changed(true)),
            (Some(_), None) if *upsert => (value, Res::Duplicate),
            (None, None) if *upsert => (Some(*doc), Res::Inserted),
            _ => (value, Res::Changed(false)),
        },
        Operation::Update(Add(k)) => match matched {
            Some(v) => (Some(v.wrapping_add(*k)), Res::Changed(true)),
            None => (value, Res::Changed(false)),
        },
        Operation::Delete => match matched {
            Some(_) => (None, Res::Changed(true)),
            None => (value, Res::Changed(false)),
        },
        Operation::Upsert {
            update: Add(k),
            insert,
        } => match (value, matched) {
            (_, Some(v)) => (Some(v.wrapping_add(*k)), Res::Changed(true)),
            (Some(_), None) => (value, Res::Duplicate),
            (None, None) => (Some(*insert), Res::Inserted),
        },
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

/// An operation pending on an id, with its condition: a router's, or a many-document read's
/// conditional `Get` of each id.
type PendingOp<'a> = Option<(&'a Op, Option<Below>)>;

/// Adds every configuration reachable by linearizing pending operations. Keeps the set sorted.
fn close(configs: &mut Vec<Config>, pending: &[PendingOp<'_>; ROUTERS]) {
    let mut set: BTreeSet<Config> = configs.iter().copied().collect();
    let mut work: Vec<Config> = configs.clone();
    while let Some(c) = work.pop() {
        for (r, op) in pending.iter().enumerate() {
            if c.ops[r] == Lin::Pending {
                let (op, cond) = op.expect("a pending operation");
                let (value, out) = spec(op, cond, c.value);
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
    /// A step on the fanout source whose probe placed it at this listed location: sending it
    /// there is next.
    At(MStep, usize),
    /// The mirror read the target; its conditional write to the source is next, at this
    /// listed location (`None`: not placed yet, the fanout source's probe is next).
    MirrorWrite(Slot, Option<usize>),
    /// The broken `FindInTwoReads` and `FindInTwoReadsAnsweringTheSecond`: a conditional
    /// operation's find of this side read a live document of this value by its id; the
    /// executor's second read, of the id with the condition (`{_id, $and: [condition]}`), is
    /// next: a document, and the find answers `Live`, else `Unmatched`. Two reads, each
    /// atomic, the pair not: the document may change between them.
    Matching(Side, u8),
    /// The broken `UpsertNative`: the application's upsert sent to the target as MongoDB's
    /// own (an update with `upsert: true`, filtered by the id and the condition), one atomic
    /// step instead of the machine's.
    NativeUpsert,
}

/// A router's operation in flight: a machine and its pending step, or a many-document read.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
enum Run {
    Op { machine: Machine, pend: Pend },
    Query(QueryRun),
}

/// One of the reads of a many-document read (`protocol::QueryPlan`), each a whole read of the
/// workload's ids done before the next starts: each document read atomically, one action
/// each, in id order, the read as a whole not.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
enum QueryRead {
    /// The source's documents matching the filter (tombstones never do).
    Source,
    /// Which of the ids the source read returned the target holds, live or tombstone.
    Presence,
    /// The target's live documents matching the filter.
    Target,
}

/// What a many-document read found of one id so far.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
struct Gathered {
    /// The source read returned the id's document, of this value.
    source: Option<u8>,
    /// The presence check found the id in the target.
    held: bool,
    /// The target read returned the id's document, of this value.
    target: Option<u8>,
}

/// A many-document read in flight (the front's `find` on the tenant, with `filter`), planned in
/// the phase its router applies: the next read is `reads[step]` of id `id`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
struct QueryRun {
    filter: Below,
    step: u8,
    id: u8,
    found: [Gathered; IDS],
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Router {
    /// The phase this router applies: it acknowledged it and drained the older one.
    acked: Phase,
    /// Whether the epoch it acknowledged is the sealed `rolled_back` (`State::sealed`): its
    /// machines are built `.sealed(true)`, and its deletes leave no source tombstone.
    acked_sealed: bool,
    next_op: u8,
    /// The operation in flight, numbered in `Model::runs`.
    run: Option<u32>,
    /// Whether its lease is live. Once it ran out (plus the fence margin) the driver counts
    /// the router out, and the product guarantees that no step of it lands any more: the step
    /// it was about to run is never sent, one in flight ended by the deadline. It serves again
    /// only after a renewal followed by a load of the current phase.
    live: bool,
    /// Whether its registration exists. The driver waits for a router only while it is
    /// registered and its lease is live (`Model::counted`). An operator's `routers forget`
    /// removes the registration (`Act::Forget`); a router that comes back then finds it gone
    /// and registers again, which is a lapse: it loads the phase before it serves.
    registered: bool,
}

/// A worker: the backfill copier, the cleaner (cleanup, then the target's tombstone purge) or
/// the revert copier (then the source's tombstone purge).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
enum W {
    Copier,
    Cleaner,
    Reverter,
}

impl W {
    const ALL: [W; 3] = [W::Copier, W::Cleaner, W::Reverter];

    fn name(self) -> &'static str {
        match self {
            W::Copier => "copier",
            W::Cleaner => "cleaner",
            W::Reverter => "revert copier",
        }
    }
}

/// One statement of a worker's unordered bulk write, decided when the batch was read and sent
/// as it is: a statement in flight (or orphaned) lands as what was sent, whatever the worker
/// does afterwards.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
enum Stmt {
    /// A protocol step, numbered in `Model::steps`, and the source's listed location it goes
    /// to (0 on the target side): the copier's insert-if-absent of a copy, cleanup's delete
    /// of the source document where its scan read it.
    Step(u32, usize),
    /// Broken: the copier's copy sent as an overwrite (a replace with upsert) of whatever the
    /// target holds, instead of an insert-if-absent.
    Overwrite(u8),
    /// The second half of the revert copier's `MirrorToSource`: the conditional write to the
    /// source of the target image its first half (the batch's read) saw, by `MirrorRule`, at
    /// the listed location its lookup placed it (`mirror_at`).
    Mirror(Slot, MirrorRule, usize),
}

/// Where a worker's execution of its partition stands. The partition covers the workload's
/// ids, cut into `Setup::batches` batches in id order; its checkpoint counts the batches
/// recorded, and an execution starts there.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
enum Stage {
    /// Not started; or due to be executed again from the checkpoint, because a batch did not
    /// settle well or the worker noticed that the phase moved (`Ending::Release`). Starts when
    /// the phase lets the worker run.
    Waiting,
    /// An execution is under way: the scan reads the ids from the checkpoint on, one per step
    /// and ahead of the writes; each batch, once read (and, in cleanup, its moved ids looked
    /// up), is sent as one unordered bulk write whose statements land in any order, one
    /// action each, while the next batch is read and written (up to `DEPTH` batches in flight,
    /// as `BatchWindow::in_flight` counts them). Checkpoints follow through the product's
    /// `BatchWindow`.
    Running,
    /// Killed while statements were in flight. Another worker takes the partition over, from
    /// the checkpoint, once the phase lets it run and every orphan landed or was dropped.
    Killed,
    /// Every batch checkpointed: the worker's work is done.
    Done,
    /// Cleanup found a moved id missing from the target and failed the migration, once the
    /// batches before it settled; nothing of that batch was deleted.
    Failed,
}

/// Why a running execution sends no more batches. What is in flight settles (and is recorded
/// when `BatchWindow` lets it), then the execution ends.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
enum Ending {
    /// It goes on.
    No,
    /// A batch did not settle well (a statement failed transiently), or the worker noticed
    /// that the phase no longer lets it run: the partition is released, to be executed again
    /// from its checkpoint.
    Release,
    /// Cleanup found a moved id missing from the target: the migration fails.
    Fail,
}

/// The product's default `max_in_flight_per_shard`: batches of one partition in flight at
/// once (sent and not yet recorded).
const DEPTH: usize = 2;

/// The checkpoints' window of an execution, numbered in `Model::windows`. A batch brings the
/// checkpoint the number of batches it completes (the partition's position after it).
type Window = BatchWindow<u8>;

/// A worker's partition, with the execution under way.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Partition {
    stage: Stage,
    /// Batches the checkpoint recorded: where the next execution starts. Kept across
    /// executions, a takeover's too; forgotten once done.
    checkpoint: u8,
    /// Running: the batch this execution started from (its window numbers batches from it).
    start: u8,
    /// Running: the next id the scan reads.
    read: u8,
    /// Running: the next batch to send (batches are numbered in the partition, from 0).
    sent: u8,
    /// Running: bit k: batch k is sent and has statements in flight.
    unsettled: u8,
    /// Running: bit k: a statement of batch k failed transiently.
    failed: u8,
    ending: Ending,
    /// Running: the checkpoints' `BatchWindow`, numbered in `Model::windows`.
    window: u32,
    /// Per id: the statement this execution decided, until it lands (or fails). In flight
    /// once its batch is sent (`Model::sent_id`).
    stmts: [Option<Stmt>; IDS],
    /// Cleanup: the ids to look up in the target before anything of their batch is deleted.
    lookups: [bool; IDS],
    /// This execution repeats batches (after a transient failure or a takeover): what an
    /// earlier execution wrote may be there already, and the application may have written
    /// since. Kept only where a broken variant acts on it (`Model::remembers_again`): the
    /// product's workers do the same either way, and states that differ only by it are one.
    again: bool,
    /// Statements of a killed execution, still in flight: each lands or is dropped.
    orphans: [Option<Stmt>; IDS],
}

impl Partition {
    fn new() -> Self {
        Partition {
            stage: Stage::Waiting,
            checkpoint: 0,
            start: 0,
            read: 0,
            sent: 0,
            unsettled: 0,
            failed: 0,
            ending: Ending::No,
            window: 0,
            stmts: Default::default(),
            lookups: [false; IDS],
            again: false,
            orphans: Default::default(),
        }
    }

    fn orphaned(&self) -> bool {
        self.orphans.iter().any(Option::is_some)
    }

    /// Ends the stage at `stage`, forgetting what only the execution needed (and, once done,
    /// the checkpoint), so that states that differ only there are one. The window goes back
    /// to a fresh one (numbered 0).
    fn end(&mut self, stage: Stage) {
        let orphans = self.orphans;
        let checkpoint = if stage == Stage::Done {
            0
        } else {
            self.checkpoint
        };
        *self = Partition {
            stage,
            checkpoint,
            orphans,
            ..Partition::new()
        };
    }
}

/// How a statement in flight ends.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
enum Landing {
    Applied,
    /// Not applied; its batch settles not well, and the partition is executed again from its
    /// checkpoint (bounded by `Setup::transients`).
    Transient,
    /// The copier's insert is acknowledged but not there (`Setup::lose_a_copy`).
    Lost,
}

/// Where the repairer stands on id `State::repair_pos`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
enum RepairAt {
    /// Looking for reconciliation's finding on the id is next.
    Idle,
    /// Reconciliation found the id missing from the target or held there as a stale pristine
    /// copy: reading the source document is next.
    Found,
    /// Read this source document: the repair's insert-if-absent of its copy is next.
    Read(u8),
    /// The insert met a duplicate: replacing a pristine copy is next.
    Duplicate(u8),
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct State {
    phase: Phase,
    routers: [Router; ROUTERS],
    /// The copier, the cleaner and the revert copier, indexed by `W`.
    workers: [Partition; 3],
    /// A copy was lost (the fault some configurations inject); at most one.
    copy_lost: bool,
    purge_pos: u8,
    revert_purge_pos: u8,
    repair_pos: u8,
    repair_at: RepairAt,
    /// A repair wrote the target (to tell the runs it completed from those the routers'
    /// own writes happened to mend).
    repaired: bool,
    /// A router's lease ran out while the revert copier's pass was under way: an operation it
    /// had in flight may have written the target without mirroring it, behind the pass. The
    /// revert copy is complete only after a pass that started later (`revert_outdated` in
    /// the product's gate).
    revert_outdated: bool,
    /// `rolled_back` is sealed: the driver's move, once every live router acknowledged
    /// `rolled_back`, that keeps the phase and bumps the epoch. No router mirrors any more
    /// then; routers acknowledge the sealed epoch, and once every live one did, the source's
    /// tombstones are purged.
    sealed: bool,
    /// Lease expiries, transient statement failures and worker kills left to explore.
    expiries_left: u8,
    transients_left: u8,
    kills_left: u8,
    /// Router crashes and operators' forgets left to explore.
    crashes_left: u8,
    forgets_left: u8,
    store: Store,
    /// Per id, the set of configurations some linearization of its history can be in,
    /// interned (`Model::lins`): the state then holds no heap data, and is cheap to copy and
    /// to hash.
    lin: [u32; IDS],
}

impl State {
    fn worker(&mut self, w: W) -> &mut Partition {
        &mut self.workers[w as usize]
    }
}

/// A deliberate deviation from the product protocol (or the fault that shows one).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Broken {
    /// The router checks its lease only when an operation starts: a step of an operation in
    /// flight lands after the lease ran out and the driver counted the router out (issue 10).
    LeaseCheckedAtStart,
    /// The revert copy counts as complete although a router's lease ran out during its pass:
    /// a target write of that router's interrupted operation, never mirrored, is behind the
    /// pass (found by the model with batches and lease expiries).
    RevertIgnoresLapses,
    /// The copier overwrites whatever the target holds instead of inserting if absent.
    CopierOverwrites,
    /// Only a re-executed copier batch overwrites (a replace with upsert instead of an
    /// insert-if-absent): it overwrites what the application wrote after the first execution
    /// copied the document.
    CopierOverwritesOnReexecution,
    /// A delete in the target removes the document (or does nothing when only the source has
    /// it) instead of writing a tombstone.
    DeleteWithoutTombstone,
    /// Cleanup deletes source documents without looking them up in the target. Shown with a
    /// lost copy, the only way the target can miss a document the checks let through.
    CleanupWithoutPresenceCheck,
    /// Cleanup deletes a document the backfill dead-lettered as unroutable instead of keeping
    /// it: the source document goes while the target never had a copy.
    CleanupDeletesUnroutable,
    /// The driver leaves the write switch before every router acknowledged it.
    SkipWriteSwitch,
    /// The rollback mirror overwrites the source whatever its revision.
    MirrorIgnoresRevision,
    /// The rollback mirror compares its revision with the source document's own, counted by
    /// source writes before the switch (the product's bug until session 8).
    MirrorComparesRawRevisions,
    /// The revert copier starts before every router acknowledged `reverting`.
    EarlyRevertCopy,
    /// A re-executed revert batch writes its mirrors unconditionally, ignoring the revision
    /// rule: its image, read before a router's newer write and mirror, overwrites that mirror.
    RevertReexecutionOverwrites,
    /// A killed worker's batch is taken over without waiting for its orphans: an orphaned
    /// statement may land after the new worker finished and the migration moved on.
    OrphanAfterTakeover,
    /// A re-plan of an outdated revert copy makes the leased partition pending at once (the
    /// product's rule until session 12): a new pass runs while the old holder's mirrors are
    /// still in flight, and a late one brings back a document deleted after the seal.
    ReplanWithoutWaiting,
    /// A read in `revert_switch` looks at the source alone (as before the lapse fix): the
    /// executor answers its `MirrorToSource` as if nothing changed, without writing. A target
    /// write whose router was cut off before mirroring it is then seen by readers of
    /// `reverting` and not by those of `revert_switch`.
    RevertSwitchReadsSourceOnly,
    /// Source writes in `rolled_back` are not stamped as this migration's (they clear
    /// `Store::mirrored`, as before the lapse fix): a late mirror of an older target image by a
    /// router still in `revert_switch` takes them for older than itself and overwrites them.
    RolledBackWritesUnstamped,
    /// A delete in `rolled_back` before the seal removes the source document instead of
    /// leaving a tombstone: a late mirror of the target's image brings it back.
    RolledBackDeletesWithoutTombstone,
    /// The source tombstone purge runs in `rolled_back` without waiting for every router to
    /// acknowledge the seal (as before the lapse fix): a late mirror by a router still in
    /// `revert_switch` brings a purged delete back, or a router not yet sealed leaves a
    /// tombstone behind the purge.
    PurgeBeforeSeal,
    /// `routers forget` removes a registration while the router's lease (plus the fence
    /// margin) is still live: the router may only be cut off from the state store and go on
    /// serving the phase it loaded, while the driver no longer waits for it and moves on (the
    /// product's `Store::forget_router` refuses until the lease and the margin ran out).
    ForgetBeforeDeadline,
    /// The checkpoint passes a batch that did not settle well once the batches before it
    /// settled, recording those after it (a checkpoint is a position: recording a later batch
    /// moves it past the failed one). A re-execution then skips the failed batch.
    CheckpointPastAFailure,
    /// A batch that settled well is recorded at once, before the batches sent before it
    /// settled: a re-execution (after one of them failed, or a kill and takeover) skips
    /// those that never landed.
    CheckpointAheadOfEarlierBatches,
    /// A router's mirror writes into the document a shared id has for both sides, ignoring
    /// `mirror_writes` (the product's bug before it): the image, read a moment earlier,
    /// overwrites that very document, where another router's write may have landed meanwhile
    /// (a replace or a tombstone drops `_reshard.mig`, and a document no mirror stamped yet
    /// has none): a lost update, or a delete brought back.
    MirrorIntoSharedDocument,
    /// The same bug in the revert copier: it decides as if it had scanned another location
    /// than the source's (`revert_action` did not ask before), and carries the image its scan
    /// read over the shared document, where a router's write may have landed since.
    RevertCopyIntoSharedDocument,
    /// The revert copier leaves out a mirror when the source document's revision is not lower
    /// than the image's, whoever wrote it (not only this migration's mirrors, as
    /// `protocol::mirror_is_newer` asks): a source document's own revision, counted before the
    /// switch, hides a newer target write, which the rollback then loses.
    RevertSkipsByRawRevision,
    /// With a fanout source, a router's mirror goes to the first listed location whatever
    /// holds the id (the product's rule before `mirror_location`): its upsert puts a second
    /// document of the id beside the source document on another listed location.
    MirrorToFirstListed,
    /// The same bug in the revert copier: its batch's mirrors go to the first listed location
    /// without its lookup (`place_mirrors`).
    RevertCopyToFirstListed,
    /// With a fanout source, a router's insert goes to the first listed location without
    /// looking at the others (the product's rule before `listed_location`): an id whose
    /// document sits on another listed location is inserted again beside it.
    InsertWithoutLooking,
    /// With a fanout source, a router's other writes to the source (a replace, an update, a
    /// delete) go to the first listed location without looking where the document is (the
    /// product's rule before `listed_location` for every write no find preceded): they match
    /// nothing there, and the application is told that no document was changed.
    SourceWriteToFirstListed,
    /// The router's executor leaves a conditional operation's condition out of the filter of
    /// the writes that act on a live document (`ReplaceLive`, the delete's tombstone,
    /// `UpdateLive`, `DeleteLive`): a write that made the document stop matching lands
    /// between the find and the write, or the update is sent without a find, and the
    /// conditional write applies anyway.
    ConditionLeftOutOfWrites,
    /// The same for the delete's tombstone in the target alone (`ReplaceLive(Target,
    /// Tombstone)`, which always follows the delete's find), as if the find had settled the
    /// condition: an update that makes the document stop matching lands between the delete's
    /// find and its tombstone, and the document is deleted all the same.
    ConditionLeftOutOfTheTombstone,
    /// The executor finds in two reads, as first designed: the document by its id, then, if
    /// live, whether it matches with a read of the id and the condition (`{_id, $and:
    /// [condition]}`), answering the first read's document, or `Unmatched` when the second
    /// found none. The pair is not atomic: a conditional read returns a document that does
    /// not match (a write made it match between the reads), and a document deleted between
    /// them is taken for one that does not match (a replace with upsert then reports a
    /// duplicate where nothing holds the id).
    FindInTwoReads,
    /// The same, answering the document the second read returned (which matched when it was
    /// read): a document deleted between the reads is still taken for one that does not
    /// match.
    FindInTwoReadsAnsweringTheSecond,
    /// The executor answers a conditional find of the target with `Absent` where a live
    /// document does not match (as if the machines took `Unmatched` in the target for
    /// `Absent`): the machine goes on to the source, whose stale image may match, and reads,
    /// tombstones or copies it, though the target's document supersedes it.
    UnmatchedTargetAsAbsent,
    /// The application's upsert sent to the target as MongoDB's own (an update with `upsert:
    /// true`, filtered by the id and the condition) instead of along the machine's paths: where
    /// only the source holds the id, it inserts a second document of the id in the target,
    /// which supersedes the source's, instead of copying and updating it.
    UpsertNative,
    /// An upsert whose insert met a document holding the id reports the duplicate at once,
    /// without trying its update once more (the retry-once rule): two upserts of a new id
    /// race, and the one that loses reports a duplicate where MongoDB updates.
    UpsertNeverRetries,
    /// A many-document read reads the target's matching documents before the presence check
    /// (the plan's second and third reads swapped): a document copied to the target between
    /// them is taken for superseded by the presence check and was not in the target's read.
    QueryTargetBeforePresence,
    /// A many-document read without the presence check: a source document matching the
    /// filter is returned although the target holds a newer image of it that does not match.
    QueryWithoutPresenceCheck,
}

/// One of a router's calls in a workload.
#[derive(Clone, Debug)]
enum Call {
    /// An operation of the router's API on id `id`, with the application's condition beside
    /// the id, if any: the router's executor answers a find of a live document the condition
    /// does not match with `Found::Unmatched`, and puts it in the filter of every write that
    /// acts on a live document (`execute_if`).
    Op {
        id: usize,
        op: Op,
        cond: Option<Below>,
    },
    /// A many-document read of the tenant with this filter (the front's `find`): the reads of
    /// `protocol::query_plan`'s plan, one document at a time, then each id answered by
    /// `protocol::query_answer`.
    Query(Below),
}

/// Unconditional operations, as the workloads before conditions wrote them.
fn calls(ops: Vec<(usize, Op)>) -> Vec<Call> {
    ops.into_iter()
        .map(|(id, op)| Call::Op { id, op, cond: None })
        .collect()
}

/// An operation on `id` with the condition `Below(k)` beside the id.
fn when(id: usize, op: Op, k: u8) -> Call {
    Call::Op {
        id,
        op,
        cond: Some(Below(k)),
    }
}

#[derive(Clone, Debug)]
struct Workload {
    name: String,
    initial: [Option<u8>; IDS],
    ids: usize,
    ops: [Vec<Call>; ROUTERS],
    /// An id present in the source whose document cannot be routed (its tenant key is missing
    /// or of a type reshard does not route): no router can address it, the backfill
    /// dead-letters it (and an operator skips the dead letter), cleanup keeps it.
    unroutable: Option<usize>,
    /// Ids that both routing versions place in one collection both layouts share (v1 places
    /// the tenant on s2/orders, and v2 some of its ids there too): each has one document for
    /// both sides (`Store::shared`). The backfill leaves it where it is, cleanup keeps it,
    /// neither the repair nor the removal of the target layout after a rollback touches it,
    /// and no mirror writes it (`mirror_writes`).
    shared: [bool; IDS],
    /// The fanout world: the source version is a `fanout` layout listing two locations for
    /// every id (`FANOUT`), and id k's document starts on the listed location `at[k]`. Every
    /// router's step on the source then probes the listed locations and goes where
    /// `listed_location` says, and every mirror where `mirror_location` says.
    fanout: Option<[usize; IDS]>,
}

#[derive(Clone, Debug)]
struct Setup {
    workload: Workload,
    broken: Option<Broken>,
    /// The copier may lose one copy: its insert is acknowledged but not there (an
    /// acknowledged `w:1` write rolled back by a failover). Reads are then wrong by
    /// construction until a repair (reconciliation's job); only cleanup's safety, the
    /// repairer's writes and the final state are checked. A repairer runs.
    lose_a_copy: bool,
    /// How many times in a run some router's lease may run out (0: never).
    expiries: u8,
    /// How many statements of workers' batches may fail transiently in a run.
    transients: u8,
    /// How many times in a run a worker may be killed with statements in flight.
    kills: u8,
    /// How many routers may crash in a run: stop for good, possibly mid-operation, never
    /// renew; the driver counts them out once their lease ran out.
    crashes: u8,
    /// How many times in a run an operator may forget a router (`reshard router remove`).
    forgets: u8,
    /// How many batches each worker's partition is cut into, in id order (1 to the
    /// workload's ids): batch k covers the ids from `k * ids / batches` on.
    batches: u8,
    /// Another worker process re-plans an outdated revert copy (`Act::Replan`) while the
    /// revert copier's pass is under way, as the product's `planned()` does.
    replans: bool,
    /// An experiment on a fix the product does not have: a many-document read in `reverting`
    /// is answered by the `Get` machine's outcome without the mirror it asks for before it
    /// reports (`query_answer` refuses the mirror, so the front fails every such read).
    unmirrored_query_answers: bool,
}

impl Setup {
    fn new(workload: Workload) -> Self {
        Setup {
            workload,
            broken: None,
            lose_a_copy: false,
            expiries: 0,
            transients: 0,
            kills: 0,
            crashes: 0,
            forgets: 0,
            batches: 1,
            replans: false,
            unmirrored_query_answers: false,
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
enum Act {
    Move(Phase),
    /// The driver seals `rolled_back` (a new epoch, the same phase).
    Seal,
    Ack(usize),
    /// A silent router's lease runs out (it could not reach the state store; until now it
    /// served its old phase and the driver waited for it): the driver may count it out; an
    /// operation in flight stops before its next step.
    Expire(usize),
    /// The router reaches the state store again: it renews, loads the current phase, serves.
    /// A router whose registration was forgotten registers again instead, which is a lapse
    /// too: it loads the current phase before it serves.
    Renew(usize),
    /// The router crashes for good, possibly mid-operation: the steps it had not run never
    /// happen, it never renews, and the driver counts it out once its lease ran out (the
    /// crash's effect on the protocol is its lease running out with no renewal ever after).
    Crash(usize),
    /// An operator removes the router's registration (`reshard router remove`).
    Forget(usize),
    Start(usize),
    Step(usize),
    /// The worker's scan reads its next id; or the start, re-execution or takeover of its
    /// partition from the checkpoint, with the first read.
    Work(W),
    /// Cleanup looks up in the target the next moved id of the batch it prepares.
    LookUp(W),
    /// The worker notices that the phase no longer lets it run: it sends no more batches and
    /// releases the partition once what is in flight settled (recorded as the window allows).
    Release(W),
    /// Another worker process finds the revert copy outdated and plans it again
    /// (`Store::replan_revert_if_outdated`): the revert partition is pending again at once,
    /// its checkpoint gone, while the statements its holder has in flight still land.
    Replan,
    /// One statement of the worker's bulk write lands, fails transiently or is lost.
    Land {
        w: W,
        id: u8,
        how: Landing,
    },
    /// The worker is killed with statements in flight.
    Kill(W),
    /// An orphaned statement of a killed worker lands, or is dropped.
    Orphan {
        w: W,
        id: u8,
        lands: bool,
    },
    /// One step of a tombstone purge: the target's after cleanup, the source's after a
    /// rollback, once every live router acknowledged the seal.
    Purge(Side),
    /// The repairer's next step.
    Repair,
}

struct Model<'a> {
    cfg: &'a Setup,
    /// What a probe read returns, by phase and the id's slots: the operation machine's answer
    /// depends on nothing else, and probing every new state is the exploration's main work.
    reads: RefCell<HashMap<u128, Checked<Option<u8>>, BuildHasherDefault<Mix>>>,
    /// The sets of linearization configurations, the routers' operations in flight and the
    /// workers' statements met so far, numbered (see `Table`).
    lins: Table<Vec<Config>>,
    runs: Table<Run>,
    steps: Table<MStep>,
    /// The workers' checkpoint windows met so far; a fresh one is 0.
    windows: Table<Window>,
    /// The workers' events the exploration went through (`Event`), noted by `apply`.
    events: RefCell<BTreeSet<Event>>,
    /// The source and target routing versions the store's locations follow, for the
    /// product's `disposition::of`.
    versions: (RoutingVersion, RoutingVersion),
    /// What `disposition::of` answered, by side, id, slot and listed location (`classify`).
    dispositions: RefCell<HashMap<Scanned, Option<Disposition>>>,
}

/// What a worker's scan met, as `Model::classify` keys it: the side, the id, its slot, and the
/// position of its location among those the source version lists (0 on the target).
type Scanned = (Side, usize, Slot, usize);

/// The tenant key of the model's documents: id `id`'s tenant is `t{id}`.
const TENANT_KEY: &str = "customerId";

/// The routing versions `Store::listed` and `Store::location` describe, as the product reads
/// them: the source version is a tenant table placing every id's tenant (`t{id}`) on s1,
/// a shared id's on s2, or in the fanout world a `fanout` layout listing s1 and s3; the target
/// version places every tenant on s2. Neither has a routing field, so nothing is stamped.
fn versions(w: &Workload) -> (RoutingVersion, RoutingVersion) {
    let table = |tenants: Vec<TenantShard>, default: &str| Layout::TenantTable {
        tenants,
        default_shard: Some(default.to_owned()),
    };
    let source = if w.fanout.is_some() {
        Layout::Fanout {
            shards: FANOUT.iter().map(|l| l.shard.clone()).collect(),
        }
    } else {
        let shared = (0..IDS).filter(|&id| w.shared[id]).map(|id| TenantShard {
            tenant: KeyValue::String(format!("t{id}")),
            shard: ON_S2.shard.clone(),
        });
        table(shared.collect(), &ON_S1.shard)
    };
    let target = table(Vec::new(), &ON_S2.shard);
    (
        RoutingVersion::new("orders", TENANT_KEY, source),
        RoutingVersion::new("orders", TENANT_KEY, target),
    )
}

/// Values numbered as the exploration meets them, so that a state holds small numbers instead
/// of them: it is `Copy` then, and cheap to clone and to hash. One table per exploration.
struct Table<T> {
    values: RefCell<Vec<T>>,
    index: RefCell<HashMap<T, u32, BuildHasherDefault<TableHasher>>>,
}

impl<T: Clone + Eq + Hash> Table<T> {
    fn new() -> Self {
        Table {
            values: RefCell::default(),
            index: RefCell::default(),
        }
    }

    fn number(&self, value: T) -> u32 {
        if let Some(&n) = self.index.borrow().get(&value) {
            return n;
        }
        let mut values = self.values.borrow_mut();
        let n = values.len() as u32;
        // The fingerprint packs a number in 30 bits.
        assert!(n < 1 << 30, "a table outgrew the fingerprint");
        values.push(value.clone());
        self.index.borrow_mut().insert(value, n);
        n
    }

    fn get(&self, n: u32) -> T {
        self.values.borrow()[n as usize].clone()
    }

    fn with<R>(&self, n: u32, f: impl FnOnce(&T) -> R) -> R {
        f(&self.values.borrow()[n as usize])
    }
}

type Checked<T> = Result<T, String>;

/// What an action did, in words. Written only when a trace is printed: formatting every
/// transition of a few million would cost more than exploring them.
struct Log {
    on: bool,
    text: String,
}

impl Log {
    fn on() -> Self {
        Log {
            on: true,
            text: String::new(),
        }
    }

    fn off() -> Self {
        Log {
            on: false,
            text: String::new(),
        }
    }
}

macro_rules! say {
    ($log:expr, $($arg:tt)*) => {
        if $log.on {
            let _ = write!($log.text, $($arg)*);
        }
    };
}

impl<'a> Model<'a> {
    fn new(cfg: &'a Setup) -> Self {
        assert!(
            (1..=cfg.workload.ids).contains(&usize::from(cfg.batches)),
            "between one batch and one per id"
        );
        assert!(
            cfg.workload.fanout.is_none()
                || (cfg.workload.shared == [false; IDS] && cfg.workload.unroutable.is_none()),
            "the fanout world has no shared id and no unroutable document"
        );
        let plain = |call: &Call| matches!(call, Call::Op { cond: None, .. });
        assert!(
            cfg.workload.fanout.is_none() || cfg.workload.ops.iter().flatten().all(plain),
            "the fanout world has no conditional operation and no many-document read"
        );
        Model {
            cfg,
            reads: RefCell::default(),
            lins: Table::new(),
            runs: Table::new(),
            steps: Table::new(),
            windows: {
                let windows = Table::new();
                assert_eq!(windows.number(Window::default()), 0);
                windows
            },
            events: RefCell::default(),
            versions: versions(&cfg.workload),
            dispositions: RefCell::default(),
        }
    }

    fn note(&self, event: Event) {
        self.events.borrow_mut().insert(event);
    }

    fn batches(&self) -> u8 {
        self.cfg.batches
    }

    /// The first id of batch `k` (the workload's ids for `k` = `batches`).
    fn first_id(&self, k: u8) -> u8 {
        (usize::from(k) * self.cfg.workload.ids / usize::from(self.batches())) as u8
    }

    /// The batch that holds `id`.
    fn batch_of(&self, id: usize) -> u8 {
        (0..self.batches())
            .rev()
            .find(|&k| usize::from(self.first_id(k)) <= id)
            .expect("batch 0 starts at id 0")
    }

    /// The ids of batch `k`.
    fn batch_ids(&self, k: u8) -> std::ops::Range<usize> {
        usize::from(self.first_id(k))..usize::from(self.first_id(k + 1))
    }

    /// Whether `id`'s batch is sent: a statement decided for it is in flight.
    fn sent_id(&self, p: &Partition, id: usize) -> bool {
        self.batch_of(id) < p.sent
    }

    fn in_flight(&self, p: &Partition) -> bool {
        (0..IDS).any(|id| p.stmts[id].is_some() && self.sent_id(p, id))
    }

    /// Whether the phase is the one the worker's task belongs to (`runnable` in the product's
    /// worker, which notices a move between batches). The revert copier's includes
    /// `revert_switch` (see `may_run`).
    fn task_phase(s: &State, w: W) -> bool {
        match w {
            W::Copier => s.phase == Phase::Backfill,
            W::Cleaner => s.phase == Phase::Cleanup,
            W::Reverter => matches!(s.phase, Phase::Reverting | Phase::RevertSwitch),
        }
    }

    /// The configurations some linearization of `id`'s history can be in.
    fn lins(&self, s: &State, id: usize) -> Vec<Config> {
        self.lins.get(s.lin[id])
    }

    /// A statement, for a trace.
    fn show(&self, stmt: &Stmt) -> String {
        match stmt {
            Stmt::Step(n, at) if *at > 0 => format!("{:?} at {}", self.steps.get(*n), FANOUT[*at]),
            Stmt::Step(n, _) => format!("{:?}", self.steps.get(*n)),
            other => format!("{other:?}"),
        }
    }

    /// A probe read (see [`read`]), remembered.
    fn read(&self, store: &Store, id: usize, phase: Phase) -> Checked<Option<u8>> {
        let [first, second] = store.source_slots[id];
        let [first_mirrored, second_mirrored] = store.mirrored[id];
        let key = phase as u128
            | u128::from(first_mirrored) << 4
            | u128::from(second_mirrored) << 5
            | u128::from(first.bits()) << 6
            | u128::from(second.bits()) << 25
            | u128::from(store.target_slots[id].bits()) << 44
            | u128::from(store.shared[id]) << 63
            | u128::from(store.fanout) << 64;
        if let Some(value) = self.reads.borrow().get(&key) {
            return value.clone();
        }
        let value = read(store, id, phase, self.cfg.broken);
        self.reads.borrow_mut().insert(key, value.clone());
        value
    }

    fn initial(&self) -> State {
        let w = &self.cfg.workload;
        let mut source = [[Slot::Absent; LISTED]; IDS];
        let mut lin = [0; IDS];
        for id in 0..IDS {
            if let Some(v) = w.initial[id] {
                let at = w.fanout.map_or(0, |at| at[id]);
                source[id][at] = Slot::Live {
                    v,
                    rev: 0,
                    copy: false,
                };
            }
            lin[id] = self.lins.number(vec![Config {
                value: w.initial[id],
                ops: [Lin::Idle; ROUTERS],
            }]);
        }
        let router = Router {
            acked: Phase::Planned,
            acked_sealed: false,
            next_op: 0,
            run: None,
            live: true,
            registered: true,
        };
        State {
            phase: Phase::Planned,
            routers: [router; ROUTERS],
            workers: [Partition::new(), Partition::new(), Partition::new()],
            copy_lost: false,
            purge_pos: 0,
            revert_purge_pos: 0,
            repair_pos: 0,
            repair_at: RepairAt::Idle,
            repaired: false,
            revert_outdated: false,
            sealed: false,
            expiries_left: self.cfg.expiries,
            transients_left: self.cfg.transients,
            kills_left: self.cfg.kills,
            crashes_left: self.cfg.crashes,
            forgets_left: self.cfg.forgets,
            store: Store {
                source_slots: source,
                target_slots: [Slot::Absent; IDS],
                mirrored: [[false; LISTED]; IDS],
                shared: w.shared,
                fanout: w.fanout.is_some(),
            },
            lin,
        }
    }

    fn ids(&self) -> u8 {
        self.cfg.workload.ids as u8
    }

    fn unroutable(&self, id: usize) -> bool {
        self.cfg.workload.unroutable == Some(id)
    }

    fn shared(&self, id: usize) -> bool {
        self.cfg.workload.shared[id]
    }

    fn broken(&self, b: Broken) -> bool {
        self.cfg.broken == Some(b)
    }

    /// Whether the router's executor checks a conditional find's condition with a read of
    /// its own, after the find by id (the broken `FindInTwoReads` and
    /// `FindInTwoReadsAnsweringTheSecond`); the product's find is one atomic read of the
    /// document and whether it matches.
    fn find_in_two_reads(&self) -> bool {
        self.broken(Broken::FindInTwoReads) || self.broken(Broken::FindInTwoReadsAnsweringTheSecond)
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

    fn call(&self, r: usize, i: u8) -> &Call {
        &self.cfg.workload.ops[r][i as usize]
    }

    /// The id and the condition of router `r`'s operation `i` (not a many-document read).
    fn op(&self, r: usize, i: u8) -> (usize, &Op, Option<Below>) {
        match self.call(r, i) {
            Call::Op { id, op, cond } => (*id, op, *cond),
            Call::Query(_) => unreachable!("a many-document read has no one id"),
        }
    }

    /// Router `r`'s operation `i`, for a message.
    fn describe(&self, r: usize, i: u8) -> String {
        match self.call(r, i) {
            Call::Op { op, cond: None, .. } => format!("{op:?}"),
            Call::Op {
                op,
                cond: Some(Below(k)),
                ..
            } => format!("{op:?} if below {k}"),
            Call::Query(Below(k)) => format!("query of the documents below {k}"),
        }
    }

    /// The ids a many-document read of the tenant covers: every routable one.
    fn query_ids(&self) -> impl Iterator<Item = usize> + '_ {
        (0..self.cfg.workload.ids).filter(|&id| !self.unroutable(id))
    }

    /// Whether the driver still counts the router: registered, and its lease (plus the fence
    /// margin) not run out. A silent router whose lease is live is counted: the driver waits
    /// for it while it serves the phase it loaded last.
    fn counted(r: &Router) -> bool {
        r.live && r.registered
    }

    /// Every router the driver still counts applies `phase`.
    fn all_acked(&self, s: &State, phase: Phase) -> bool {
        s.routers
            .iter()
            .all(|r| !Self::counted(r) || r.acked == phase)
    }

    fn done(&self, s: &State, w: W) -> bool {
        s.workers[w as usize].stage == Stage::Done
    }

    /// Whether the phase lets `w` start (or re-execute, or take over) its partition. An
    /// execution once started goes on whatever the phase does meanwhile, until the worker
    /// notices (`Act::Release`, between batches, and late: the product's worker learns of a
    /// move on its next refresh).
    fn may_run(&self, s: &State, w: W) -> bool {
        match w {
            W::Copier => s.phase == Phase::Backfill,
            W::Cleaner => s.phase == Phase::Cleanup,
            // In `reverting` only once every live router mirrors its own writes
            // (`revert_copy_step`); in `revert_switch` (a pass outdated by a lapse) once every
            // live router holds its writes.
            W::Reverter => {
                matches!(s.phase, Phase::Reverting | Phase::RevertSwitch)
                    && (self.broken(Broken::EarlyRevertCopy) || self.all_acked(s, s.phase))
            }
        }
    }

    fn gate_open(&self, s: &State, to: Phase, gate: Gate) -> bool {
        match gate {
            Gate::RoutersAcknowledged => {
                (self.broken(Broken::SkipWriteSwitch)
                    && (s.phase, to) == (Phase::WriteSwitch, Phase::NewWrites))
                    || self.all_acked(s, s.phase)
            }
            // The unroutable document's dead letter is skipped by an operator at once, so no
            // dead letter is left open.
            Gate::BackfillComplete => self.done(s, W::Copier),
            // Reconciliation is sampled: it passes unless it happens to look at a defect, so
            // the model lets it pass (with or without the repair of what it would find) and
            // keeps checking what the routers read.
            Gate::ReconciliationPassed => true,
            Gate::CleanupComplete => self.done(s, W::Cleaner),
            // Every writer of the model is a router or a worker: no write bypasses the
            // router, so none is ever recorded (the watch's judgement is `bypass::classify`,
            // tested by value).
            Gate::BypassesResolved => true,
            Gate::RevertComplete => {
                self.done(s, W::Reverter)
                    && (!s.revert_outdated || self.broken(Broken::RevertIgnoresLapses))
            }
        }
    }

    fn actions(&self, s: &State) -> Vec<Act> {
        let mut acts = Vec::with_capacity(16);
        // The operator runs `reshard repair` to its end before moving the migration past
        // `new_reads` (it may move from `reconcile` to `new_reads` meanwhile: repair runs in
        // both).
        let repairing = s.repair_at != RepairAt::Idle;
        for &to in s.phase.next() {
            if repairing && to != Phase::NewReads {
                continue;
            }
            if s.phase
                .gates_to(to)
                .iter()
                .all(|g| self.gate_open(s, to, *g))
            {
                acts.push(Act::Move(to));
            }
        }
        if s.phase == Phase::RolledBack && !s.sealed && self.all_acked(s, Phase::RolledBack) {
            acts.push(Act::Seal);
        }
        for (r, router) in s.routers.iter().enumerate() {
            let ops_left = (router.next_op as usize) < self.cfg.workload.ops[r].len();
            if router.live && s.expiries_left > 0 && (router.run.is_some() || ops_left) {
                acts.push(Act::Expire(r));
            }
            if router.live && s.crashes_left > 0 && (router.run.is_some() || ops_left) {
                acts.push(Act::Crash(r));
            }
            // `routers forget`: only once the lease and the fence margin ran out (the driver
            // counts the router out then anyway), and never while rolling back (the router's
            // row records the lapses that decide whether the copy back must run again).
            if router.registered
                && s.forgets_left > 0
                && !matches!(s.phase, Phase::Reverting | Phase::RevertSwitch)
                && (!router.live || self.broken(Broken::ForgetBeforeDeadline))
            {
                acts.push(Act::Forget(r));
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
            if !router.registered {
                // Broken: forgotten with its lease live, it serves on. Its next heartbeat
                // finds the registration gone and registers again (a lapse: it loads the
                // phase); it acknowledges nothing before that.
                acts.push(Act::Renew(r));
            } else if (router.acked, router.acked_sealed) != (s.phase, s.sealed) {
                acts.push(Act::Ack(r));
            }
            // A write started in a phase that holds writes answers `Held` without a step and
            // is retried after the next acknowledgement: starting it changes nothing.
            // So does a many-document read in `revert_switch` (`QueryPlan::Held`).
            if let Some(call) = self.cfg.workload.ops[r].get(router.next_op as usize) {
                let held = match call {
                    Call::Op { op, .. } => {
                        router.acked.write_path() == WritePath::Held
                            && !matches!(op, Operation::Get)
                    }
                    Call::Query(_) => query_plan(router.acked) == QueryPlan::Held,
                };
                if !held {
                    acts.push(Act::Start(r));
                }
            }
        }
        for w in W::ALL {
            let b = &s.workers[w as usize];
            let open = b.stage == Stage::Running && b.ending == Ending::No;
            let work = match b.stage {
                // The scan reads ahead of the writes; nothing read after the execution stopped
                // sending is ever written, so it is not read.
                Stage::Running => open && b.read < self.ids(),
                Stage::Waiting => self.may_run(s, w),
                // The product guarantees the wait: every bulk command's deadline ends before
                // the partition lease, and a takeover comes a margin after the lease expired.
                Stage::Killed => {
                    self.may_run(s, w)
                        && (!b.orphaned() || self.broken(Broken::OrphanAfterTakeover))
                }
                // A pass outdated by a router's lapse runs again from the start.
                Stage::Done => {
                    w == W::Reverter
                        && s.revert_outdated
                        && self.may_run(s, w)
                        && !self.broken(Broken::RevertIgnoresLapses)
                }
                Stage::Failed => false,
            };
            if work {
                acts.push(Act::Work(w));
            }
            // Cleanup prepares the next batch to send once it is read and the window has room:
            // its moved ids are looked up, one by one.
            if open
                && b.sent < self.batches()
                && b.read >= self.first_id(b.sent + 1)
                && self.batch_ids(b.sent).any(|id| b.lookups[id])
                && self.windows.with(b.window, Window::in_flight) < DEPTH
            {
                acts.push(Act::LookUp(w));
            }
            // Between batches: once one was sent (before, releasing is not starting) and while
            // one is left to send.
            if open && b.start < b.sent && b.sent < self.batches() && !Self::task_phase(s, w) {
                acts.push(Act::Release(w));
            }
            if b.stage == Stage::Running {
                for id in 0..self.ids() {
                    if b.stmts[id as usize].is_some() && self.sent_id(b, id as usize) {
                        acts.push(Act::Land {
                            w,
                            id,
                            how: Landing::Applied,
                        });
                        if s.transients_left > 0 {
                            acts.push(Act::Land {
                                w,
                                id,
                                how: Landing::Transient,
                            });
                        }
                        if w == W::Copier && self.cfg.lose_a_copy && !s.copy_lost {
                            acts.push(Act::Land {
                                w,
                                id,
                                how: Landing::Lost,
                            });
                        }
                    }
                }
                // One orphan per id at a time keeps the model's bookkeeping simple; the runs
                // allow one kill anyway.
                if s.kills_left > 0 && !b.orphaned() && self.in_flight(b) {
                    acts.push(Act::Kill(w));
                }
            }
            for id in 0..self.ids() {
                if b.orphans[id as usize].is_some() {
                    for lands in [true, false] {
                        acts.push(Act::Orphan { w, id, lands });
                    }
                }
            }
        }
        if self.cfg.replans
            && s.phase == Phase::Reverting
            && s.revert_outdated
            && s.workers[W::Reverter as usize].stage != Stage::Done
        {
            acts.push(Act::Replan);
        }
        if s.phase == Phase::Completed
            && self.done(s, W::Cleaner)
            && self.all_acked(s, Phase::Completed)
            && s.purge_pos < self.ids()
        {
            acts.push(Act::Purge(Side::Target));
        }
        // The source's purge: once every live router acknowledged the seal, no router
        // mirrors and none leaves a source tombstone any more.
        if s.phase == Phase::RolledBack
            && ((s.sealed
                && s.routers
                    .iter()
                    .all(|r| !Self::counted(r) || r.acked_sealed))
                || self.broken(Broken::PurgeBeforeSeal))
            && matches!(
                s.workers[W::Reverter as usize].stage,
                Stage::Waiting | Stage::Done
            )
            && s.revert_purge_pos < self.ids()
        {
            acts.push(Act::Purge(Side::Source));
        }
        if self.cfg.lose_a_copy
            && matches!(s.phase, Phase::Reconcile | Phase::NewReads)
            && s.repair_pos < self.ids()
        {
            acts.push(Act::Repair);
        }
        acts
    }

    /// Applies `act` to `s`, checking the step's own rules. `log` receives a description.
    fn apply(&self, s: &mut State, act: Act, log: &mut Log) -> Checked<()> {
        let before = s.store;
        let mut source_writer = false;
        match act {
            Act::Move(to) => {
                say!(log, "driver: {} -> {}", s.phase, to);
                s.phase = to;
            }
            Act::Seal => {
                say!(log, "driver: seals {}", s.phase);
                s.sealed = true;
            }
            Act::Ack(r) => {
                let sealed = if s.sealed { " (sealed)" } else { "" };
                say!(log, "router {r}: acknowledges {}{sealed}", s.phase);
                s.routers[r].acked = s.phase;
                s.routers[r].acked_sealed = s.sealed;
            }
            Act::Expire(r) => {
                say!(log, "router {r}: its lease runs out; ");
                s.expiries_left -= 1;
                self.lapse(s, r, !self.broken(Broken::LeaseCheckedAtStart), log)?;
            }
            Act::Crash(r) => {
                say!(log, "router {r}: crashes for good, its lease runs out; ");
                s.crashes_left -= 1;
                // Its process is gone: no step of it is sent any more, one in flight ended by
                // the lease's deadline, as at a lapse, and it never comes back.
                self.lapse(s, r, true, log)?;
                s.routers[r].next_op = self.cfg.workload.ops[r].len() as u8;
            }
            Act::Forget(r) => {
                let how = if s.routers[r].live {
                    "while its lease is live (broken)"
                } else {
                    "its lease ran out"
                };
                say!(log, "operator: forgets router {r} ({how})");
                s.forgets_left -= 1;
                s.routers[r].registered = false;
            }
            Act::Renew(r) => {
                // Renew, then load: it applies the phase of now. A forgotten router registers
                // again, a lapse too.
                let sealed = if s.sealed { " (sealed)" } else { "" };
                if s.routers[r].registered {
                    say!(
                        log,
                        "router {r}: renews its lease and loads {}{sealed}",
                        s.phase
                    );
                } else {
                    say!(
                        log,
                        "router {r}: finds its registration gone, registers again (a lapse) and \
                         loads {}{sealed}",
                        s.phase
                    );
                }
                s.routers[r].live = true;
                s.routers[r].registered = true;
                s.routers[r].acked = s.phase;
                s.routers[r].acked_sealed = s.sealed;
            }
            Act::Start(r) => {
                let phase = s.routers[r].acked;
                let what = self.describe(r, s.routers[r].next_op);
                let (id, op, cond) = match self.call(r, s.routers[r].next_op) {
                    Call::Op { id, op, cond } => (*id, op.clone(), *cond),
                    Call::Query(filter) => {
                        say!(log, "router {r}: starts a {what} in {phase}; ");
                        return self.start_query(s, r, *filter, log);
                    }
                };
                say!(log, "router {r}: starts {what} on id {id} in {phase}; ");
                let mut lins = self.lins(s, id);
                for c in lins.iter_mut() {
                    c.ops[r] = Lin::Pending;
                }
                let pending = self.pending(s, id, Some((r, (&op, cond))));
                close(&mut lins, &pending);
                s.lin[id] = self.lins.number(lins);
                // Broken: deletes before the seal run as after it, without a source tombstone.
                let sealed = s.routers[r].acked_sealed
                    || self.broken(Broken::RolledBackDeletesWithoutTombstone);
                let native = self.broken(Broken::UpsertNative)
                    && matches!(op, Operation::Upsert { .. })
                    && matches!(
                        phase.write_path(),
                        WritePath::Target | WritePath::TargetMirroredToSource
                    );
                let mut machine = Machine::new(phase, op).sealed(sealed);
                let next = machine.next(None).map_err(|e| e.to_string())?;
                source_writer = phase.write_path() == WritePath::Source;
                if native {
                    s.routers[r].run = Some(self.runs.number(Run::Op {
                        machine,
                        pend: Pend::NativeUpsert,
                    }));
                } else {
                    self.advance(s, r, id, machine, next, log)?;
                }
            }
            Act::Step(r) => {
                source_writer = s.routers[r].acked.write_path() == WritePath::Source;
                say!(log, "router {r}: ");
                let run = s.routers[r].run.take().expect("a running operation");
                match self.runs.get(run) {
                    Run::Op { machine, pend } => self.advance_run(s, r, machine, pend, log)?,
                    Run::Query(query) => self.query_step(s, r, query, log)?,
                }
            }
            Act::Work(w) => self.work(s, w, log)?,
            Act::LookUp(w) => self.cleaner_look_up(s, w, log),
            Act::Release(w) => {
                say!(
                    log,
                    "{}: notices the phase, sends no more batches and releases the partition \
                     once what is in flight settled",
                    w.name()
                );
                self.note(Event::NoticedThePhase);
                s.worker(w).ending = Ending::Release;
                self.progress(s, w, log);
            }
            Act::Replan => {
                say!(
                    log,
                    "another worker: the revert copy is outdated, plans it again; its holder's \
                     lease is void, what it has in flight still lands, and the partition is taken \
                     over only once that settled"
                );
                s.revert_outdated = false;
                let b = *s.worker(W::Reverter);
                let mut orphans = b.orphans;
                if b.stage == Stage::Running {
                    for (id, orphan) in orphans.iter_mut().enumerate() {
                        if b.stmts[id].is_some() && self.sent_id(&b, id) {
                            assert!(orphan.is_none(), "one orphan per id");
                            *orphan = b.stmts[id];
                        }
                    }
                }
                let orphaned = orphans.iter().any(Option::is_some);
                let waits = orphaned && !self.broken(Broken::ReplanWithoutWaiting);
                let b = s.worker(W::Reverter);
                b.orphans = orphans;
                // The reset keeps a leased partition's lease (with a token nobody holds): the
                // claim takes it over a margin after it ran out, when its commands have ended,
                // as after a kill.
                b.end(if waits { Stage::Killed } else { Stage::Waiting });
                b.checkpoint = 0;
            }
            Act::Land { w, id, how } => self.land(s, w, id as usize, how, log)?,
            Act::Kill(w) => self.kill(s, w, log),
            Act::Orphan { w, id, lands } => self.orphan(s, w, id as usize, lands, log)?,
            Act::Purge(side) => self.purge(s, side, log),
            Act::Repair => self.repair(s, log)?,
        }
        self.forget_the_dead_target(s);
        // A router writing the source layout removes a source document when the application
        // deletes it; so does any router a shared id's, whose one document is the source's
        // whichever path writes it. Anyone else (a worker) must leave a copy or a tombstone.
        let router = matches!(act, Act::Start(_) | Act::Step(_));
        for id in 0..IDS {
            if source_writer || (router && self.shared(id)) {
                continue;
            }
            let removed = matches!(before.get(Side::Source, id), Slot::Live { .. })
                && !matches!(s.store.get(Side::Source, id), Slot::Live { .. });
            if removed && s.store.get(Side::Target, id) == Slot::Absent {
                return Err(format!(
                    "source document {id} removed while the target holds neither a copy nor \
                     a tombstone"
                ));
            }
            // The locations a fanout source lists behave as one collection: one document per
            // id, live or tombstone. A second one is a second version of the id, which a read
            // sees or not depending on the order of the listed locations, and which a purge
            // of the first one's tombstone brings back.
            if s.store.fanout && s.store.holds(id).iter().filter(|&&held| held).count() > 1 {
                let [first, second] = s.store.source_slots[id];
                return Err(format!(
                    "id {id} has two documents at the locations its fanout source lists, \
                     {first:?} on {} and {second:?} on {}: two versions of it",
                    FANOUT[0], FANOUT[1]
                ));
            }
        }
        Ok(())
    }

    /// Once rolled back and every router that serves (or has a step to run) applies
    /// `rolled_back`, no one reads the target any more (a router in `revert_switch` still
    /// does, through its reads' mirrors) and no mirror can land in the source: the model
    /// empties the dead target and forgets which source documents a mirror or a stamp wrote,
    /// and ends a copier batch that outlived the rollback (dropping its orphans), sparing the
    /// states that differ only there. A router counted out renews into `rolled_back`. A shared
    /// id's document stays: it belongs to both layouts, and the product's removal of the
    /// target layout (`finish::remove_target_layout`) deletes from a shared collection only
    /// what the target version alone places there.
    fn forget_the_dead_target(&self, s: &mut State) {
        let dead = s.phase == Phase::RolledBack
            && !s.workers[W::Reverter as usize].orphaned()
            && s.routers
                .iter()
                .all(|r| r.acked == Phase::RolledBack || (!r.live && r.run.is_none()));
        if !dead {
            return;
        }
        let shared = s.store.shared;
        for id in (0..IDS).filter(|&id| !shared[id]) {
            *s.store.slot(Side::Target, id) = Slot::Absent;
        }
        s.store.mirrored = [[false; LISTED]; IDS];
        let copier = s.worker(W::Copier);
        if copier.stage != Stage::Done || copier.orphaned() {
            copier.orphans = Default::default();
            copier.end(Stage::Done);
        }
    }

    /// The router's lease ran out (a silent router, or a crashed one): the driver may count it
    /// out from now on. `fenced`: the operation in flight stops before its next step (only
    /// the broken `LeaseCheckedAtStart` goes on with it).
    fn lapse(&self, s: &mut State, r: usize, fenced: bool, log: &mut Log) -> Checked<()> {
        s.routers[r].live = false;
        // A lapse outdates the revert copy: a router counted out in `reverting` or
        // `revert_switch` after the revert copier's pass started may have left a target write
        // behind the pass, never mirrored. (A pass due to be executed again from its start,
        // after a transient failure before any checkpoint, reads every id again, after the
        // lapse; one with a checkpoint does not read again what the checkpoint passed.)
        let reverter = &s.workers[W::Reverter as usize];
        if matches!(s.phase, Phase::Reverting | Phase::RevertSwitch)
            && (reverter.stage != Stage::Waiting || reverter.checkpoint > 0)
        {
            s.revert_outdated = true;
        }
        if fenced {
            if let Some(run) = s.routers[r].run.take() {
                self.interrupt(s, r, self.runs.get(run), log)?;
            }
            // What it applied no longer counts: it serves again only after loading the current
            // phase. Forgotten, so that states differing only there are one.
            s.routers[r].acked = Phase::Planned;
            s.routers[r].acked_sealed = false;
        }
        Ok(())
    }

    /// An operation stopped by its router's lease before its pending step: that step never
    /// lands. The application is told what the machine says may have happened; the history
    /// must agree (nothing applied: no linearization may have applied it).
    fn interrupt(&self, s: &mut State, r: usize, run: Run, log: &mut Log) -> Checked<()> {
        // A many-document read sends no write: it stops having read, and told, nothing.
        let (ids, interrupted): (Vec<usize>, _) = match run {
            Run::Op { machine, .. } => {
                let (id, _, _) = self.op(r, s.routers[r].next_op);
                (vec![id], machine.interrupted())
            }
            Run::Query(_) => (self.query_ids().collect(), Interrupted::NothingApplied),
        };
        say!(log, "its operation stops: {interrupted:?}");
        for id in ids {
            let mut lins = self.lins(s, id);
            if interrupted == Interrupted::NothingApplied {
                lins.retain(|c| c.ops[r] == Lin::Pending);
                if lins.is_empty() {
                    return Err(format!(
                        "router {r}'s {} on id {id} stopped saying nothing was applied, but \
                         every linearization applied it",
                        self.describe(r, s.routers[r].next_op)
                    ));
                }
            }
            for c in lins.iter_mut() {
                c.ops[r] = Lin::Idle;
            }
            lins.sort();
            lins.dedup();
            s.lin[id] = self.lins.number(lins);
        }
        s.routers[r].next_op += 1;
        Ok(())
    }

    /// The operations pending on `id`, for the linearizability closure.
    fn pending<'b>(
        &'b self,
        s: &State,
        id: usize,
        starting: Option<(usize, (&'b Op, Option<Below>))>,
    ) -> [PendingOp<'b>; ROUTERS] {
        let mut out = [None; ROUTERS];
        for (r, router) in s.routers.iter().enumerate() {
            if router.run.is_some() {
                match self.call(r, router.next_op) {
                    Call::Op {
                        id: op_id,
                        op,
                        cond,
                    } if *op_id == id => out[r] = Some((op, *cond)),
                    // A many-document read is a conditional `Get` of each id it covers.
                    Call::Query(filter) if !self.unroutable(id) => {
                        out[r] = Some((&GET, Some(*filter)));
                    }
                    Call::Op { .. } | Call::Query(_) => {}
                }
            }
        }
        if let Some((r, op)) = starting {
            out[r] = Some(op);
        }
        out
    }

    /// Runs the router's pending step and feeds the answer to its machine. A conditional
    /// operation's find is one atomic read of the document and whether the condition matches
    /// it (`Found::Unmatched` for a live document it does not match; one aggregation would
    /// give that, `$match` on the id then a `$facet` of the document and of a branch that
    /// `$match`es the condition, or two finds in one snapshot), and its live-acting writes
    /// carry the condition in their filter (`execute_if`). The broken `FindInTwoReads*` find
    /// in two actions (`Pend::Matching`).
    fn advance_run(
        &self,
        s: &mut State,
        r: usize,
        mut machine: Machine,
        pend: Pend,
        log: &mut Log,
    ) -> Checked<()> {
        let (id, op, cond) = self.op(r, s.routers[r].next_op);
        // Broken: the writes' filter leaves the condition out.
        let write_cond = if self.broken(Broken::ConditionLeftOutOfWrites) {
            None
        } else {
            cond
        };
        let phase = s.routers[r].acked;
        let wait = |s: &mut State, pend: Pend| {
            s.routers[r].run = Some(self.runs.number(Run::Op {
                machine: machine.clone(),
                pend,
            }));
        };
        let asked_find = matches!(pend, Pend::Step(Step::Find(_)) | Pend::Matching(..));
        let answer = match pend {
            // A conditional find: one atomic read of the document and whether it matches.
            Pend::Step(Step::Find(side)) if cond.is_some() && !self.find_in_two_reads() => {
                let found = match s.store.get(side, id) {
                    Slot::Live { v, .. } if !matches(cond, v) => {
                        if side == Side::Target && self.broken(Broken::UnmatchedTargetAsAbsent) {
                            say!(log, "(broken: unmatched taken for absent) ");
                            Found::Absent
                        } else {
                            self.note(Event::Unmatched(side));
                            Found::Unmatched
                        }
                    }
                    slot => slot.found(),
                };
                say!(log, "Find({side:?}) with the condition -> {found:?}; ");
                Answer::Found(found)
            }
            // Broken: the find by id, then the condition checked by a read of its own.
            Pend::Step(Step::Find(side)) if cond.is_some() => {
                let found = s.store.get(side, id).found();
                say!(log, "Find({side:?}) by id -> {found:?}");
                if let Found::Live(v) = found {
                    say!(log, ", the read with the condition is next (broken)");
                    wait(s, Pend::Matching(side, v));
                    return Ok(());
                }
                say!(log, "; ");
                Answer::Found(found)
            }
            Pend::Matching(side, v) => {
                let now = s.store.get(side, id);
                let found = match now {
                    Slot::Live { v: now, .. } if matches(cond, now) => {
                        if self.broken(Broken::FindInTwoReads) {
                            Found::Live(v)
                        } else {
                            Found::Live(now)
                        }
                    }
                    _ => Found::Unmatched,
                };
                if !matches!(now, Slot::Live { v: now, .. } if now == v) {
                    self.note(Event::ChangedBetweenTheFindsReads);
                }
                say!(
                    log,
                    "Find({side:?}) with the condition reads {now:?} -> {found:?}; "
                );
                Answer::Found(found)
            }
            Pend::NativeUpsert => {
                let Operation::Upsert { update, insert } = op else {
                    unreachable!("only an upsert is sent as MongoDB's own")
                };
                let update = Step::UpdateLive(Side::Target, *update);
                let outcome = match execute_if(&mut s.store, id, 0, &update, write_cond) {
                    Answer::Matched(true) => Outcome::Changed(true),
                    _ => {
                        let insert = Step::Insert(Side::Target, Payload::App(*insert));
                        match execute_if(&mut s.store, id, 0, &insert, None) {
                            Answer::Inserted => Outcome::Inserted,
                            _ => Outcome::Duplicate,
                        }
                    }
                };
                say!(
                    log,
                    "sends the upsert to the target as MongoDB's own (broken) -> {outcome:?}; "
                );
                return self.advance(s, r, id, machine, Next::Done(outcome), log);
            }
            Pend::Step(Step::MirrorToSource)
                if phase == Phase::RevertSwitch
                    && self.broken(Broken::RevertSwitchReadsSourceOnly) =>
            {
                say!(log, "skips the mirror (broken); ");
                Answer::Matched(false)
            }
            Pend::MirrorWrite(image, None) => {
                let at = mirror_at(&s.store, id, false);
                say!(
                    log,
                    "mirror's probe of the listed locations places it on {}",
                    s.store.listed(id)[at]
                );
                if at > 0 {
                    self.note(Event::RouterMirroredToALaterListedLocation);
                }
                wait(s, Pend::MirrorWrite(image, Some(at)));
                return Ok(());
            }
            Pend::MirrorWrite(image, Some(at)) => {
                let a = mirror_write(&mut s.store, id, at, image, self.mirror_rule());
                let on = &s.store.listed(id)[at];
                say!(
                    log,
                    "mirror writes {image:?} to the source on {on} -> {a:?}; "
                );
                a
            }
            Pend::Step(Step::MirrorToSource) => {
                let image = mirror_read(&s.store, id);
                say!(log, "mirror reads {image:?} from the target");
                let ignored = self.broken(Broken::MirrorIntoSharedDocument);
                if mirror_in_place(&s.store, id, image, ignored) {
                    say!(log, ", where the source keeps it: done without a write; ");
                    self.note(Event::MirroredInPlace);
                    Answer::Matched(true)
                } else {
                    // A fanout source's listed locations are probed next, a command of its
                    // own, unless there is nothing to write (the image is absent) or the
                    // broken `MirrorToFirstListed` sends it to the first one unlooked.
                    let unlooked = self.broken(Broken::MirrorToFirstListed);
                    let placed = (image == Slot::Absent || s.store.listed(id).len() == 1)
                        .then_some(0)
                        .or(unlooked.then_some(0));
                    if unlooked && s.store.fanout {
                        say!(log, ", sent to {} unlooked (broken)", FANOUT[0]);
                    }
                    wait(s, Pend::MirrorWrite(image, placed));
                    return Ok(());
                }
            }
            Pend::Step(step) if on_listed_source(&s.store, id, &step) => {
                let unlooked = match step {
                    Step::Find(_) => false,
                    Step::Insert(..) => self.broken(Broken::InsertWithoutLooking),
                    _ => self.broken(Broken::SourceWriteToFirstListed),
                };
                if unlooked {
                    let (a, how) =
                        self.router_execute(&mut s.store, id, 0, &step, phase, write_cond);
                    say!(
                        log,
                        "{step:?} on {} unlooked (broken){how} -> {a:?}; ",
                        FANOUT[0]
                    );
                    a
                } else {
                    match probe_listed(&s.store, id, &step) {
                        Probed::Answered(a) => {
                            say!(
                                log,
                                "{step:?}: the probe of the listed locations answers {a:?}; "
                            );
                            if matches!(step, Step::Insert(..)) && a == Answer::DuplicateKey {
                                self.note(Event::InsertRefusedByTheProbe);
                            }
                            a
                        }
                        Probed::At(at) => {
                            say!(
                                log,
                                "{step:?}: the probe of the listed locations places it on {}",
                                FANOUT[at]
                            );
                            wait(s, Pend::At(step, at));
                            return Ok(());
                        }
                    }
                }
            }
            Pend::At(step, at) => {
                let (a, how) = self.router_execute(&mut s.store, id, at, &step, phase, write_cond);
                say!(log, "{step:?} on {}{how} -> {a:?}; ", FANOUT[at]);
                if at > 0
                    && matches!(step, Step::ReplaceTombstone(..))
                    && a == Answer::Matched(true)
                {
                    self.note(Event::TombstoneReplacedWhereItIs);
                }
                a
            }
            Pend::Step(step) => {
                // Broken: the delete's tombstone in the target sent without the condition, as if
                // the find before it had settled it.
                let tombstone = matches!(step, Step::ReplaceLive(Side::Target, Payload::Tombstone));
                let write_cond = if tombstone && self.broken(Broken::ConditionLeftOutOfTheTombstone)
                {
                    None
                } else {
                    write_cond
                };
                let (a, how) = self.router_execute(&mut s.store, id, 0, &step, phase, write_cond);
                say!(log, "{step:?}{how} -> {a:?}; ");
                // A conditional write that met a live document its condition no longer
                // matches (another write landed since the find).
                let acts_on_live = match &step {
                    Step::ReplaceLive(side, _) | Step::UpdateLive(side, _) => Some(*side),
                    Step::DeleteLive(side) => Some(*side),
                    _ => None,
                };
                if let Some(side) = acts_on_live {
                    let live = matches!(s.store.get(side, id), Slot::Live { .. });
                    if cond.is_some() && live && a == Answer::Matched(false) {
                        self.note(Event::ConditionFailedOnAWrite);
                    }
                }
                a
            }
        };
        let held = matches!(answer, Answer::Found(Found::Live(_) | Found::Unmatched));
        let mut next = machine.next(Some(answer)).map_err(|e| e.to_string())?;
        // An upsert whose insert met a document holding the id tries its update once more
        // (`OperationMachine`'s retry-once rule): a find that found the id, then the update.
        let retried = asked_find
            && held
            && matches!(op, Operation::Upsert { .. })
            && matches!(next, Next::Do(Step::UpdateLive(..)));
        if retried {
            self.note(Event::UpsertRetried);
            if self.broken(Broken::UpsertNeverRetries) {
                say!(log, "reports the duplicate without trying again (broken); ");
                next = Next::Done(Outcome::Duplicate);
            }
        }
        self.advance(s, r, id, machine, next, log)
    }

    /// The router's executor, on the source at its listed location `at`, with the broken
    /// delete when asked for. A router applying `rolled_back` stamps the source document it
    /// writes as this migration's (`_reshard.mig`, its revision counted on from the previous
    /// one), so that a late mirror compares revisions with it.
    fn router_execute(
        &self,
        store: &mut Store,
        id: usize,
        at: usize,
        step: &MStep,
        phase: Phase,
        cond: Option<Below>,
    ) -> (Answer<u8>, &'static str) {
        if phase == Phase::RolledBack && !self.broken(Broken::RolledBackWritesUnstamped) {
            let before = store.source_slots[id][at];
            let a = execute_if(store, id, at, step, cond);
            if store.source_slots[id][at] != before {
                store.mirrored[id][at] = true;
            }
            return (a, "");
        }
        if self.broken(Broken::DeleteWithoutTombstone) {
            match step {
                Step::ReplaceLive(Side::Target, Payload::Tombstone) => {
                    let a = execute_if(store, id, 0, &Step::DeleteLive(Side::Target), cond);
                    return (a, " (broken: deletes instead)");
                }
                Step::Insert(Side::Target, Payload::Tombstone) => {
                    return (Answer::Inserted, " (broken: does nothing)")
                }
                _ => {}
            }
        }
        (execute_if(store, id, at, step, cond), "")
    }

    /// Records the machine's next move: a pending step, or the operation's response.
    fn advance(
        &self,
        s: &mut State,
        r: usize,
        id: usize,
        machine: Machine,
        next: Next<u8, Add>,
        log: &mut Log,
    ) -> Checked<()> {
        match next {
            Next::Do(step) => {
                s.routers[r].run = Some(self.runs.number(Run::Op {
                    machine,
                    pend: Pend::Step(step),
                }));
                // Steps run as their own actions, so the start only invokes.
                Ok(())
            }
            Next::Done(outcome) => {
                say!(log, "responds {outcome:?}");
                let want = Lin::Done(res(&outcome));
                // With a lost copy answers are wrong by construction; only cleanup is judged.
                let mut lins = self.lins(s, id);
                if !self.cfg.lose_a_copy {
                    lins.retain(|c| c.ops[r] == want);
                }
                if lins.is_empty() {
                    return Err(format!(
                        "router {r}'s {} on id {id} answered {outcome:?}, which no \
                         linearization of the history allows",
                        self.describe(r, s.routers[r].next_op)
                    ));
                }
                for c in lins.iter_mut() {
                    c.ops[r] = Lin::Idle;
                }
                lins.sort();
                lins.dedup();
                s.lin[id] = self.lins.number(lins);
                s.routers[r].run = None;
                s.routers[r].next_op += 1;
                Ok(())
            }
        }
    }

    /// The reads of a many-document read planned in `phase`, in order (`query_plan`).
    /// Broken: the target's read before the presence check (`QueryTargetBeforePresence`), or
    /// no presence check (`QueryWithoutPresenceCheck`).
    fn query_reads(&self, phase: Phase) -> &'static [QueryRead] {
        use QueryRead::{Presence, Source, Target};
        match query_plan(phase) {
            QueryPlan::One(Side::Source) => &[Source],
            QueryPlan::One(Side::Target) => &[Target],
            QueryPlan::TargetThenSource if self.broken(Broken::QueryTargetBeforePresence) => {
                &[Source, Target, Presence]
            }
            QueryPlan::TargetThenSource if self.broken(Broken::QueryWithoutPresenceCheck) => {
                &[Source, Target]
            }
            QueryPlan::TargetThenSource => &[Source, Presence, Target],
            QueryPlan::Held => unreachable!("a many-document read waits while the phase holds it"),
        }
    }

    /// The next document a many-document read reads, from where `query` stands on: each read
    /// covers the ids in order, the presence check only those the source read returned.
    /// `None`: every read is done.
    fn query_seek(&self, mut query: QueryRun, phase: Phase) -> Option<QueryRun> {
        let reads = self.query_reads(phase);
        while usize::from(query.step) < reads.len() {
            let id = usize::from(query.id);
            if id >= self.cfg.workload.ids {
                query.step += 1;
                query.id = 0;
                continue;
            }
            let wanted = !self.unroutable(id)
                && (reads[usize::from(query.step)] != QueryRead::Presence
                    || query.found[id].source.is_some());
            if wanted {
                return Some(query);
            }
            query.id += 1;
        }
        None
    }

    /// A router starts a many-document read: a conditional `Get` of every id it covers is
    /// pending from now until it answers.
    fn start_query(&self, s: &mut State, r: usize, filter: Below, log: &mut Log) -> Checked<()> {
        let phase = s.routers[r].acked;
        say!(log, "{:?}", self.query_reads(phase));
        for id in self.query_ids() {
            let mut lins = self.lins(s, id);
            for c in lins.iter_mut() {
                c.ops[r] = Lin::Pending;
            }
            let pending = self.pending(s, id, Some((r, (&GET, Some(filter)))));
            close(&mut lins, &pending);
            s.lin[id] = self.lins.number(lins);
        }
        let query = QueryRun {
            filter,
            step: 0,
            id: 0,
            found: [Gathered::default(); IDS],
        };
        match self.query_seek(query, phase) {
            Some(query) => {
                s.routers[r].run = Some(self.runs.number(Run::Query(query)));
                Ok(())
            }
            None => self.answer_query(s, r, query, log),
        }
    }

    /// The many-document read's next document read, atomic; after the last, its answer.
    fn query_step(&self, s: &mut State, r: usize, query: QueryRun, log: &mut Log) -> Checked<()> {
        let phase = s.routers[r].acked;
        let (id, read) = (
            usize::from(query.id),
            self.query_reads(phase)[usize::from(query.step)],
        );
        let mut query = query;
        let filter = Some(query.filter);
        let matching = |slot: Slot| match slot {
            Slot::Live { v, .. } if matches(filter, v) => Some(v),
            _ => None,
        };
        let found = &mut query.found[id];
        match read {
            QueryRead::Source => found.source = matching(s.store.get(Side::Source, id)),
            QueryRead::Presence => found.held = s.store.get(Side::Target, id) != Slot::Absent,
            QueryRead::Target => found.target = matching(s.store.get(Side::Target, id)),
        }
        say!(
            log,
            "the query's {read:?} read of id {id}: {:?}; ",
            query.found[id]
        );
        query.id += 1;
        match self.query_seek(query, phase) {
            Some(query) => {
                s.routers[r].run = Some(self.runs.number(Run::Query(query)));
                Ok(())
            }
            None => self.answer_query(s, r, query, log),
        }
    }

    /// Every read done: each id is answered by the product's `query_answer` from what the
    /// reads found of it, and must be what a conditional `Get` of the id returns at some
    /// instant since the query started.
    fn answer_query(&self, s: &mut State, r: usize, query: QueryRun, log: &mut Log) -> Checked<()> {
        let phase = s.routers[r].acked;
        let mut answers = [None; IDS];
        for id in self.query_ids() {
            let found = query.found[id];
            let target = || match found.target {
                Some(v) => Found::Live(v),
                None if found.held => Found::Unmatched,
                None => Found::Absent,
            };
            let source = || found.source.map_or(Found::Absent, Found::Live);
            let answer = if self.cfg.unmirrored_query_answers && phase == Phase::Reverting {
                unmirrored_query_answer(phase, target(), source())?
            } else {
                match query_answer(phase, target, source) {
                    Ok(answer) => answer,
                    // The front fails the read with the error: the application is told
                    // nothing, as after a lapse.
                    Err(e) => {
                        say!(log, "query_answer refuses id {id}: {e}; the read fails");
                        self.note(Event::QueryRefused(phase));
                        let run = Run::Query(query);
                        return self
                            .interrupt(s, r, run, log)
                            .map(|()| s.routers[r].run = None);
                    }
                }
            };
            answers[id] = answer;
        }
        for id in self.query_ids() {
            let (found, answer) = (query.found[id], answers[id]);
            say!(log, "id {id}: {answer:?}; ");
            if found.source.is_some() && answer.is_none() {
                self.note(Event::QueryLeftOutASupersededSourceMatch);
            }
            if found.source.is_some() && !found.held && found.target.is_some() {
                self.note(Event::QueryFoundATargetDocumentAfterThePresenceCheck);
            }
            let want = Lin::Done(Res::Read(answer));
            let mut lins = self.lins(s, id);
            if !self.cfg.lose_a_copy {
                lins.retain(|c| c.ops[r] == want);
            }
            if lins.is_empty() {
                return Err(format!(
                    "router {r}'s {} answered {answer:?} for id {id}, which no linearization \
                     of the history allows",
                    self.describe(r, s.routers[r].next_op)
                ));
            }
            for c in lins.iter_mut() {
                c.ops[r] = Lin::Idle;
            }
            lins.sort();
            lins.dedup();
            s.lin[id] = self.lins.number(lins);
        }
        s.routers[r].run = None;
        s.routers[r].next_op += 1;
        Ok(())
    }

    /// What a source document read at `id` is to the migration, for the protocol's worker
    /// decisions, with its value (a tombstone carries none; every decision skips it): the
    /// product's own `disposition::of`, asked of the document as the scan read it, at the
    /// location it read it, under the model's routing versions (`Model::versions`).
    fn source_disposition(
        &self,
        store: &Store,
        id: usize,
        found: &Found<u8>,
    ) -> Option<(Disposition, u8)> {
        let (slot, v) = match *found {
            Found::Absent => return None,
            // The source side's classification reads the keys and the tombstone mark only,
            // never who wrote a live document, so what the scan returned is all it needs.
            Found::Live(v) => (
                Slot::Live {
                    v,
                    rev: 0,
                    copy: false,
                },
                v,
            ),
            Found::Tombstone => (Slot::Tomb { rev: 1 }, 0),
            Found::Unmatched => unreachable!("a worker's scan reads with no condition"),
        };
        Some((self.classify(store, Side::Source, id, slot)?, v))
    }

    /// `disposition::of` of the document `slot` stands for, scanned on `side` where the store
    /// holds it. Its answer depends on nothing else, so it is remembered (`Model::dispositions`):
    /// building the document and locating it under both versions at every scan step cost the
    /// exploration a quarter of its time.
    fn classify(&self, store: &Store, side: Side, id: usize, slot: Slot) -> Option<Disposition> {
        let at = match side {
            Side::Source => store.found_at(id),
            Side::Target => 0,
        };
        let key = (side, id, slot, at);
        if let Some(known) = self.dispositions.borrow().get(&key) {
            return known.clone();
        }
        let classified = self.document(side, id, slot).map(|doc| {
            let (from, to) = &self.versions;
            disposition::of(side, from, to, store.location(side, id), &doc)
        });
        self.dispositions
            .borrow_mut()
            .insert(key, classified.clone());
        classified
    }

    /// The stored document a slot stands for, as the product writes it (`envelope`): the
    /// application's key fields (`customerId: "t{id}"`, none for the unroutable id), the value,
    /// and `_reshard` as its last writer left it: none for a document no one wrote through
    /// reshard, a copy's (`src: "copy"`), an application write's (`src: "app"`), a
    /// tombstone's (`deleted: true`). On the target, a live document no one wrote through
    /// reshard (revision 0 and not a copy: a shared id's document as the source layout left
    /// it; a moving id's target never holds one) has no envelope, which `disposition::of`
    /// reads as a document of the other layout.
    fn document(&self, side: Side, id: usize, slot: Slot) -> Option<Document> {
        let (from, to) = &self.versions;
        let version = match side {
            Side::Source => from,
            Side::Target => to,
        };
        let key = Bson::String(format!("o{id}"));
        let tenant = Bson::String(format!("t{id}"));
        let mut doc = match slot {
            Slot::Absent => return None,
            Slot::Tomb { rev } => envelope::tombstone(&key, &tenant, version, 0, 1, i64::from(rev)),
            Slot::Live { v, rev, copy } => {
                let mut doc = doc! { "_id": key, TENANT_KEY: tenant, "v": i32::from(v) };
                if copy {
                    doc.insert(envelope::META, doc! { "rev": i64::from(rev) });
                    envelope::copy(doc, version, 0, 1)
                } else if rev > 0 {
                    envelope::app_write(doc, version, 0, 1, i64::from(rev))
                } else {
                    doc
                }
            }
        };
        if self.unroutable(id) {
            doc.remove(TENANT_KEY);
        }
        Some(doc)
    }

    /// The worker's scan reads its next id; first, when no execution is under way, the start
    /// of one from the checkpoint: the partition's, a re-execution, or the takeover of a
    /// killed worker's.
    fn work(&self, s: &mut State, w: W, log: &mut Log) -> Checked<()> {
        say!(log, "{}: ", w.name());
        if w == W::Reverter && s.workers[w as usize].stage == Stage::Done {
            say!(
                log,
                "a router's lease ran out during the pass: copying everything back again; "
            );
            s.revert_outdated = false;
            s.worker(w).end(Stage::Waiting);
        }
        let b = s.worker(w);
        if matches!(b.stage, Stage::Waiting | Stage::Killed) {
            // Nothing of an earlier execution is kept but its checkpoint and its orphans: what
            // follows the checkpoint is read again, with a fresh window.
            let what = if b.stage == Stage::Killed {
                "takes the killed worker's partition over from the checkpoint"
            } else {
                "reads its partition from the checkpoint"
            };
            let again = self.remembers_again() && (b.again || b.stage == Stage::Killed);
            let from = b.checkpoint;
            b.end(Stage::Running);
            b.again = again;
            b.start = from;
            b.sent = from;
            b.read = self.first_id(from);
            if self.batches() > 1 {
                say!(log, "{what} (batch {from}); ");
            } else {
                say!(log, "{what}; ");
            }
            if from > 0 {
                self.note(Event::ResumedPastACheckpoint);
            }
        }
        let b = &s.workers[w as usize];
        if b.read < self.ids() {
            let id = b.read as usize;
            match w {
                W::Copier => self.copier_read(s, id, log)?,
                W::Cleaner => self.cleaner_read(s, id, log),
                W::Reverter => self.reverter_read(s, id, log),
            }
            s.worker(w).read += 1;
        } else {
            say!(log, "nothing left to read");
        }
        self.progress(s, w, log);
        Ok(())
    }

    /// Sends, in order, the batches that are read and prepared (cleanup's lookups done) while
    /// the window has room; a batch with nothing to write settles at once. Then ends the
    /// execution if it stopped and nothing is in flight any more, or if every batch settled.
    fn progress(&self, s: &mut State, w: W, log: &mut Log) {
        loop {
            let b = &s.workers[w as usize];
            if b.stage != Stage::Running {
                return;
            }
            let k = b.sent;
            let ready = b.ending == Ending::No
                && k < self.batches()
                && b.read >= self.first_id(k + 1)
                && !self.batch_ids(k).any(|id| b.lookups[id]);
            if !ready {
                break;
            }
            let mut window = self.windows.get(b.window);
            if window.in_flight() >= DEPTH {
                break;
            }
            let n = window.send();
            debug_assert_eq!(n, u64::from(k - b.start));
            let writes = self.batch_ids(k).any(|id| b.stmts[id].is_some());
            let b = s.worker(w);
            b.window = self.windows.number(window);
            b.sent += 1;
            if writes {
                b.unsettled |= 1 << k;
                if self.batches() > 1 {
                    say!(log, "; sends batch {k}");
                }
            } else {
                self.settle(s, w, k, log);
            }
        }
        let again = self.remembers_again();
        let batches = self.batches();
        let b = s.worker(w);
        if b.unsettled != 0 {
            return;
        }
        match b.ending {
            Ending::Release => {
                say!(
                    log,
                    "; the partition is released (checkpoint: {} batches)",
                    b.checkpoint
                );
                b.end(Stage::Waiting);
                b.again = again;
            }
            Ending::Fail => {
                say!(log, "; cleanup fails, nothing of the batch is deleted");
                b.end(Stage::Failed);
            }
            Ending::No if b.sent == batches => b.end(Stage::Done),
            Ending::No => {}
        }
    }

    /// Batch `k` settled: well, or not if a statement of it failed transiently. The window
    /// says what the checkpoint may record now; a batch that did not settle well ends the
    /// execution (`Ending::Release`). The checkpoint statement is atomic here: one recorded
    /// later is one whose batches' last statements landed later.
    fn settle(&self, s: &mut State, w: W, k: u8, log: &mut Log) {
        let b = s.worker(w);
        let bit = 1_u8 << k;
        let well = b.failed & bit == 0;
        b.unsettled &= !bit;
        // Which batches of this execution settled, and how, for the events.
        let settled =
            |b: &Partition, j: u8| j >= b.start && j < b.sent && b.unsettled & 1 << j == 0;
        let behind_a_failure = (b.start..k).any(|j| settled(b, j) && b.failed & 1 << j != 0);
        let ahead_of_a_success = (k + 1..b.sent).any(|j| settled(b, j) && b.failed & 1 << j == 0);
        if (well && behind_a_failure) || (!well && ahead_of_a_success) {
            self.note(Event::FailedAheadOfASettledBatch);
        }
        let ledger = if well {
            Some(k + 1)
        } else if self.broken(Broken::CheckpointPastAFailure) {
            // Broken: recorded as if it settled, without passing it: it no longer holds back
            // the batches after it.
            Some(k)
        } else {
            None
        };
        let mut window = self.windows.get(b.window);
        window.settle(u64::from(k - b.start), ledger);
        let recorded = window.recordable();
        b.window = self.windows.number(window);
        let before = b.checkpoint;
        if let Some(&last) = recorded.last() {
            b.checkpoint = b.checkpoint.max(last);
        }
        if well && self.broken(Broken::CheckpointAheadOfEarlierBatches) {
            b.checkpoint = b.checkpoint.max(k + 1);
        }
        if !well && b.ending == Ending::No {
            b.ending = Ending::Release;
        }
        if self.batches() > 1 {
            let how = if well { "well" } else { "not well" };
            say!(log, "; batch {k} settles {how}");
            if b.checkpoint != before {
                say!(log, "; the checkpoint records {} batches", b.checkpoint);
            }
        }
    }

    /// Whether a broken variant acts differently on a re-executed batch, so that the model
    /// must remember which execution a batch is in.
    fn remembers_again(&self) -> bool {
        self.broken(Broken::CopierOverwritesOnReexecution)
            || self.broken(Broken::RevertReexecutionOverwrites)
    }

    /// A worker's read of the source document of `id`: the product scans every location the
    /// source version lists, and the one holding the id yields it (at most one does).
    fn scan_source(&self, s: &State, id: usize, log: &mut Log) -> Found<u8> {
        let found = s.store.get(Side::Source, id).found();
        say!(log, "reads source id {id}: {found:?}");
        if s.store.fanout {
            say!(log, " on {}", s.store.location(Side::Source, id));
        }
        found
    }

    fn copier_read(&self, s: &mut State, id: usize, log: &mut Log) -> Checked<()> {
        let found = self.scan_source(s, id, log);
        let Some((disposition, doc)) = self.source_disposition(&s.store, id, &found) else {
            return Ok(());
        };
        let stamp = |_: &str, _: i32| -> Add { unreachable!("the model has no routing field") };
        let b = s.worker(W::Copier);
        match backfill_action(&disposition, doc, stamp) {
            BackfillAction::Write(step) => {
                let overwrite = self.broken(Broken::CopierOverwrites)
                    || (self.broken(Broken::CopierOverwritesOnReexecution) && b.again);
                let stmt = if overwrite {
                    Stmt::Overwrite(doc)
                } else {
                    Stmt::Step(self.steps.number(step), 0)
                };
                say!(log, " -> {}", self.show(&stmt));
                b.stmts[id] = Some(stmt);
            }
            BackfillAction::DeadLetter(reason) => {
                if !self.unroutable(id) {
                    return Err(format!(
                        "the copier dead-lettered routable id {id}: {reason}"
                    ));
                }
                say!(log, " -> dead letter ({reason}); an operator skips it");
            }
            BackfillAction::InPlace => say!(log, " -> in place: nothing to write"),
            BackfillAction::Skip => say!(log, " -> nothing to write"),
        }
        Ok(())
    }

    fn cleaner_read(&self, s: &mut State, id: usize, log: &mut Log) {
        let found = self.scan_source(s, id, log);
        let Some((disposition, _)) = self.source_disposition(&s.store, id, &found) else {
            return;
        };
        // Every unroutable id's dead letter was skipped by an operator: never copied. A shared
        // id stays: kept (were it looked up, the lookup would find its one document, and the
        // delete would remove it, which `apply` reports).
        let action = cleanup_action(&disposition, self.unroutable(id));
        say!(log, " -> {action:?}");
        // The delete goes where the scan read the document.
        let scanned = s.store.found_at(id);
        let delete = Some(Stmt::Step(
            self.steps.number(cleanup_delete_step()),
            scanned,
        ));
        let b = s.worker(W::Cleaner);
        match action {
            CleanupAction::LookUp if self.broken(Broken::CleanupWithoutPresenceCheck) => {
                say!(log, " (broken: deletes it unchecked)");
                b.stmts[id] = delete;
            }
            CleanupAction::LookUp => b.lookups[id] = true,
            CleanupAction::Keep
                if self.broken(Broken::CleanupDeletesUnroutable) && self.unroutable(id) =>
            {
                say!(log, " (broken: deletes it)");
                b.stmts[id] = delete;
            }
            CleanupAction::Keep | CleanupAction::Skip => {}
        }
    }

    /// Cleanup's lookup of the next moved id of the batch it prepares: every one must be in
    /// the target (a copy or a tombstone) before any delete of the batch is sent.
    fn cleaner_look_up(&self, s: &mut State, w: W, log: &mut Log) {
        let k = s.workers[w as usize].sent;
        let id = self
            .batch_ids(k)
            .find(|&id| s.workers[w as usize].lookups[id])
            .expect("a lookup to do");
        let step: MStep = cleanup_lookup_step();
        let Answer::Found(found) = execute(&mut s.store, id, &step) else {
            unreachable!("a find answers found")
        };
        let decision = cleanup_decision(&found);
        say!(
            log,
            "{}: looks up target id {id}: {found:?} -> {decision:?}",
            w.name()
        );
        // The delete goes where the scan read the document: nothing but cleanup writes the
        // source in `cleanup`, so a look finds it there still.
        let scanned = s.store.found_at(id);
        let b = s.worker(w);
        b.lookups[id] = false;
        match decision {
            CleanupDecision::DeleteSource => {
                let delete = self.steps.number(cleanup_delete_step());
                b.stmts[id] = Some(Stmt::Step(delete, scanned));
            }
            CleanupDecision::Missing => b.ending = Ending::Fail,
        }
        self.progress(s, w, log);
    }

    /// The revert copier's read of a target image: the first half of `MirrorToSource`.
    fn reverter_read(&self, s: &mut State, id: usize, log: &mut Log) {
        let image = mirror_read(&s.store, id);
        say!(log, "reads target id {id}: {image:?}");
        let Some(disposition) = self.classify(&s.store, Side::Target, id, image) else {
            return;
        };
        // The copier scanned the id's target location. Broken: a location no version places
        // anything at, which has `revert_action` decide as it did before it asked (it compares
        // the scanned location with the id's source location, through `mirror_writes`).
        let scanned: &Location = if self.broken(Broken::RevertCopyIntoSharedDocument) {
            &ELSEWHERE
        } else {
            s.store.location(Side::Target, id)
        };
        let shared = s.store.shared[id];
        // The batch's mirrors are placed by a lookup of the listed locations before it is
        // sent (`place_mirrors`), taken here with the read.
        let at = mirror_at(&s.store, id, self.broken(Broken::RevertCopyToFirstListed));
        let placed = &s.store.listed(id)[at];
        let fanout = s.store.fanout;
        let b = s.worker(W::Reverter);
        match revert_action::<u8, Add>(&disposition, scanned) {
            RevertAction::Write(step) => {
                assert_eq!(step, Step::MirrorToSource, "the revert copier only mirrors");
                let rule = if self.broken(Broken::RevertReexecutionOverwrites) && b.again {
                    MirrorRule::Overwrite
                } else {
                    self.mirror_rule()
                };
                if at > 0 {
                    self.note(Event::RevertCopiedToALaterListedLocation);
                }
                if fanout {
                    say!(log, " -> placed on {placed}");
                }
                // The batch's source documents are read with the placement lookup
                // (`skip_mirrored`): a mirror a router already made of this revision or a
                // newer one is left out. Broken: the revisions compared raw, whoever wrote the
                // source document.
                let rev = image.rev().map_or(0, i64::from);
                let source = mirror_source(&s.store, id, at);
                let source = if self.broken(Broken::RevertSkipsByRawRevision) {
                    match s.store.source_slots[id][at].rev() {
                        Some(r) => MirrorSource::Mirrored(Some(i64::from(r))),
                        None => source,
                    }
                } else {
                    source
                };
                if image.rev().is_some() && !mirror_is_newer(source, rev) {
                    self.note(Event::RevertSkippedAMirroredWrite);
                    say!(log, " -> already mirrored ({source:?}): left out");
                    return;
                }
                let b = s.worker(W::Reverter);
                let stmt = Stmt::Mirror(image, rule, at);
                say!(log, " -> {}", self.show(&stmt));
                b.stmts[id] = Some(stmt);
            }
            action @ (RevertAction::InPlace | RevertAction::Skip) => {
                if shared && action == RevertAction::InPlace {
                    self.note(Event::RevertedInPlace);
                }
                say!(log, " -> {action:?}");
            }
        }
    }

    /// One statement of a worker's bulk write ends; the last one of its batch settles it.
    fn land(&self, s: &mut State, w: W, id: usize, how: Landing, log: &mut Log) -> Checked<()> {
        say!(log, "{}: ", w.name());
        let stmt = s.worker(w).stmts[id].take().expect("a statement in flight");
        let k = self.batch_of(id);
        match how {
            Landing::Applied => self.land_stmt(s, w, id, &stmt, log)?,
            Landing::Transient => {
                say!(
                    log,
                    "{} on id {id} fails transiently: not applied",
                    self.show(&stmt)
                );
                s.transients_left -= 1;
                s.worker(w).failed |= 1 << k;
            }
            Landing::Lost => {
                // Acknowledged: the worker takes it for a copy.
                say!(
                    log,
                    "{} on id {id} is acknowledged but lost",
                    self.show(&stmt)
                );
                s.copy_lost = true;
            }
        }
        if !self
            .batch_ids(k)
            .any(|i| s.workers[w as usize].stmts[i].is_some())
        {
            self.settle(s, w, k, log);
            self.progress(s, w, log);
        }
        Ok(())
    }

    /// Applies a statement to the store, as sent.
    fn land_stmt(&self, s: &mut State, w: W, id: usize, stmt: &Stmt, log: &mut Log) -> Checked<()> {
        match stmt {
            Stmt::Step(step, at) => {
                let step = self.steps.get(*step);
                let a = execute_at(&mut s.store, id, *at, &step);
                if w == W::Copier {
                    let result = copy_result(&a).ok_or("the copy got a foreign answer")?;
                    say!(log, "{step:?} on id {id} -> {result:?}");
                } else {
                    say!(log, "{step:?} on id {id} -> {a:?}");
                }
            }
            Stmt::Overwrite(v) => {
                let source_rev = s.store.get(Side::Source, id).rev().unwrap_or(0);
                let slot = s.store.slot(Side::Target, id);
                *slot = written(*slot, &Payload::Copy(*v), source_rev);
                say!(log, "overwrites target id {id} with a copy of {v} (broken)");
            }
            Stmt::Mirror(image, rule, at) => {
                let a = mirror_write(&mut s.store, id, *at, *image, *rule);
                let broken = if *rule == MirrorRule::Product {
                    ""
                } else {
                    " (broken)"
                };
                let on = s.store.listed(id)[*at].clone();
                say!(
                    log,
                    "writes {image:?} to source id {id} on {on}{broken} -> {a:?}"
                );
            }
        }
        Ok(())
    }

    /// The worker dies with statements in flight: they become orphans, each of which may
    /// still land, or never will. What it read or decided and had not sent is gone.
    fn kill(&self, s: &mut State, w: W, log: &mut Log) {
        say!(
            log,
            "{}: killed with statements in flight (orphans now)",
            w.name()
        );
        s.kills_left -= 1;
        let b = *s.worker(w);
        let mut batches = 0_u8;
        let mut orphans: [Option<Stmt>; IDS] = Default::default();
        for (id, orphan) in orphans.iter_mut().enumerate() {
            if b.stmts[id].is_some() && self.sent_id(&b, id) {
                *orphan = b.stmts[id];
                batches |= 1 << self.batch_of(id);
            }
        }
        if batches.count_ones() > 1 {
            self.note(Event::KilledWithTwoBatchesInFlight);
        }
        let b = s.worker(w);
        b.orphans = orphans;
        b.end(Stage::Killed);
    }

    fn orphan(&self, s: &mut State, w: W, id: usize, lands: bool, log: &mut Log) -> Checked<()> {
        say!(log, "{}'s orphan: ", w.name());
        let stmt = s.worker(w).orphans[id].take().expect("an orphan");
        // Once every orphan settled, a killed worker's partition is one waiting for its next
        // execution like any other.
        let again = self.remembers_again();
        let b = s.worker(w);
        if b.stage == Stage::Killed && !b.orphaned() {
            b.end(Stage::Waiting);
            b.again = again;
        }
        if lands {
            self.land_stmt(s, w, id, &stmt, log)
        } else {
            say!(log, "{} on id {id} is dropped", self.show(&stmt));
            Ok(())
        }
    }

    fn purge(&self, s: &mut State, side: Side, log: &mut Log) {
        let (who, pos) = match side {
            Side::Target => ("cleaner", &mut s.purge_pos),
            Side::Source => ("revert copier", &mut s.revert_purge_pos),
        };
        let id = *pos as usize;
        *pos += 1;
        let step: MStep = purge_tombstone_step(side);
        // The source's purge runs at every location the source version lists.
        let listed = match side {
            Side::Source => s.store.listed(id).len(),
            Side::Target => 1,
        };
        for at in 0..listed {
            let a = execute_at(&mut s.store, id, at, &step);
            say!(log, "{who}: {step:?} on id {id} -> {a:?}; ");
        }
    }

    /// The repairer: for each id reconciliation finds missing from the target or held there as
    /// a stale pristine copy, it reads the source document and writes the repair's steps.
    fn repair(&self, s: &mut State, log: &mut Log) -> Checked<()> {
        let id = s.repair_pos as usize;
        let next_id = |s: &mut State| {
            s.repair_at = RepairAt::Idle;
            s.repair_pos += 1;
        };
        match s.repair_at {
            RepairAt::Idle => {
                // Reconciliation's finding (its sampling aside): compares both sides at once,
                // which is harmless, for the repair reads the source again and its writes are
                // conditional. It judges a document that moves against its target image; dead
                // letters are outside its scope, and a document that stays (a shared id) is
                // judged by its routing field, which the model does not have: found right.
                let source = s.store.get(Side::Source, id);
                let moves = matches!(
                    self.source_disposition(&s.store, id, &source.found()),
                    Some((Disposition::Moves { .. }, _))
                );
                let stale = match (source, s.store.get(Side::Target, id)) {
                    (Slot::Live { .. }, Slot::Absent) => true,
                    (
                        Slot::Live { v, .. },
                        Slot::Live {
                            v: t, copy: true, ..
                        },
                    ) => v != t,
                    _ => false,
                };
                if stale && moves {
                    say!(log, "repairer: reconciliation finds target id {id} wrong");
                    s.repair_at = RepairAt::Found;
                } else {
                    say!(log, "repairer: reconciliation finds id {id} right");
                    next_id(s);
                }
            }
            RepairAt::Found => {
                say!(log, "repairer: ");
                let found = self.scan_source(s, id, log);
                // As `reconcile::repair_from_source`: the protocol's repair decision on what
                // the source holds now.
                let Some((disposition, v)) = self.source_disposition(&s.store, id, &found) else {
                    next_id(s);
                    return Ok(());
                };
                let stamp =
                    |_: &str, _: i32| -> Add { unreachable!("the model has no routing field") };
                match repair_action::<u8, Add>(&disposition, v, stamp) {
                    RepairAction::Copy { step, .. } if step == repair_copy_step(v) => {
                        s.repair_at = RepairAt::Read(v)
                    }
                    RepairAction::Copy { step, .. } => {
                        return Err(format!("the repair would start with {step:?}"))
                    }
                    RepairAction::Stamp(step) => {
                        return Err(format!(
                            "the repair stamps {step:?} without a routing field"
                        ))
                    }
                    RepairAction::Leave => next_id(s),
                }
            }
            RepairAt::Read(v) => {
                // The state holds the step `repair_action` chose as its value: the copy's
                // insert-if-absent.
                let step: MStep = repair_copy_step(v);
                let a = self.repair_write(s, id, step.clone(), log)?;
                if !matches!(a, Answer::Inserted | Answer::DuplicateKey) {
                    return Err(format!("the repair's insert answered {a:?}"));
                }
                match repair_next(&step, &a, v) {
                    RepairNext::Write(next) if next == repair_replace_step(v) => {
                        s.repair_at = RepairAt::Duplicate(v)
                    }
                    RepairNext::Write(next) => {
                        return Err(format!("the repair would go on with {next:?}"))
                    }
                    RepairNext::Done(_) => next_id(s),
                }
            }
            RepairAt::Duplicate(v) => {
                let step: MStep = repair_replace_step(v);
                let a = self.repair_write(s, id, step.clone(), log)?;
                match repair_next(&step, &a, v) {
                    RepairNext::Done(_) => next_id(s),
                    RepairNext::Write(next) => {
                        return Err(format!("the repair goes on after replacing: {next:?}"))
                    }
                }
            }
        }
        Ok(())
    }

    /// Runs one of the repair's writes; it must never overwrite the application's write or a
    /// tombstone.
    fn repair_write(
        &self,
        s: &mut State,
        id: usize,
        step: MStep,
        log: &mut Log,
    ) -> Checked<Answer<u8>> {
        let before = s.store.get(Side::Target, id);
        let a = execute(&mut s.store, id, &step);
        say!(log, "repairer: {step:?} on id {id} -> {a:?}");
        let after = s.store.get(Side::Target, id);
        s.repaired |= after != before;
        let owned = matches!(before, Slot::Tomb { .. } | Slot::Live { copy: false, .. });
        if owned && after != before {
            return Err(format!(
                "the repair overwrote target id {id}: {before:?} became {after:?}"
            ));
        }
        Ok(a)
    }

    /// Whether `check_reads` finds the same in both states: it depends on the store, the
    /// histories and the phases the driver and the live routers apply, and nothing else.
    fn reads_alike(&self, a: &State, b: &State) -> bool {
        a.store == b.store
            && a.lin == b.lin
            && a.phase == b.phase
            && a.routers
                .iter()
                .zip(&b.routers)
                .all(|(x, y)| (x.live, x.acked) == (y.live, y.acked))
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
            // No router can address a document that cannot be routed.
            for id in (0..self.cfg.workload.ids).filter(|&id| !self.unroutable(id)) {
                let value = self.read(&s.store, id, phase)?;
                let allowed = self.lins.with(s.lin[id], |lins| {
                    let ok = lins.iter().any(|c| c.value == value);
                    (!ok).then(|| lins.iter().map(|c| c.value).collect::<BTreeSet<_>>())
                });
                if let Some(allowed) = allowed {
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
                // A shared id's one document is a target document too: cleanup keeps it, and
                // the tombstone rule holds for it as for any.
                for id in 0..ids {
                    let moved = !self.unroutable(id) && !self.shared(id);
                    if moved && s.store.get(Side::Source, id) != Slot::Absent {
                        return Err(format!("cleanup ended with id {id} still in the source"));
                    }
                    if let Slot::Tomb { .. } = s.store.get(Side::Target, id) {
                        return Err(format!("cleanup ended with a tombstone of id {id}"));
                    }
                }
            }
            Phase::RolledBack => {
                if !s.sealed || (s.revert_purge_pos as usize) < ids {
                    return Err(format!(
                        "the rollback ended unsealed or before the source's purge (sealed: {}, \
                         purged up to id {})",
                        s.sealed, s.revert_purge_pos
                    ));
                }
                for id in 0..ids {
                    if let Slot::Tomb { .. } = s.store.get(Side::Source, id) {
                        return Err(format!("the rollback ended with a tombstone of id {id}"));
                    }
                }
            }
            Phase::Cleanup
                if self.cfg.lose_a_copy
                    && s.workers[W::Cleaner as usize].stage == Stage::Failed => {}
            phase => return Err(format!("the migration is stuck in {phase}")),
        }
        // Whichever way the migration ended, the document that cannot be routed is where it
        // was, as it was: in the source.
        let initial = self.initial();
        for id in (0..ids).filter(|&id| self.unroutable(id)) {
            let now = s.store.get(Side::Source, id);
            if now != initial.store.get(Side::Source, id) {
                return Err(format!(
                    "the unroutable document {id} did not stay in the source: {now:?}"
                ));
            }
        }
        if self.cfg.lose_a_copy {
            return Ok(());
        }
        self.check_reads(s)
    }
}

/// The experiment `Setup::unmirrored_query_answers`: `query_answer` as it would be if it
/// answered the `Get` machine's outcome in `reverting` without the mirror it asks for before
/// reporting (a many-document read sends no write).
fn unmirrored_query_answer(
    phase: Phase,
    target: Found<u8>,
    source: Found<u8>,
) -> Checked<Option<u8>> {
    let mut get: OperationMachine<u8, ()> = OperationMachine::new(phase, Operation::Get);
    let mut answer = None;
    loop {
        answer = Some(match get.next(answer.take()).map_err(|e| e.to_string())? {
            Next::Done(Outcome::Read(doc)) => return Ok(doc),
            Next::Do(Step::Find(Side::Target)) => Answer::Found(target.clone()),
            Next::Do(Step::Find(Side::Source)) => Answer::Found(source.clone()),
            Next::Do(Step::MirrorToSource) => Answer::Matched(false),
            other => return Err(format!("a read asked for {other:?}")),
        });
    }
}

/// A `get` run to completion at one instant, along `phase`'s read path, on a scratch copy of
/// the store: the probe observes, its mirror (while rolling back, and in the revert switch)
/// changes nothing that counts. Its steps run as the router's executor runs them: a find on
/// the fanout source where `listed_location` reads, the mirror without a write where
/// `mirror_writes` says so, else where `mirror_at` places it. `broken`: the broken
/// `revert_switch` read (`RevertSwitchReadsSourceOnly`), whose mirror the executor skips,
/// and the broken mirrors (`MirrorIntoSharedDocument`, `MirrorToFirstListed`).
fn read(store: &Store, id: usize, phase: Phase, broken: Option<Broken>) -> Checked<Option<u8>> {
    let mut store = *store;
    let mut machine = Machine::new(phase, Operation::Get);
    let mut next = machine.next(None).map_err(|e| e.to_string())?;
    loop {
        let answer = match next {
            Next::Do(Step::MirrorToSource)
                if broken == Some(Broken::RevertSwitchReadsSourceOnly)
                    && phase == Phase::RevertSwitch =>
            {
                Answer::Matched(false)
            }
            Next::Do(Step::MirrorToSource) => {
                let image = mirror_read(&store, id);
                let ignored = broken == Some(Broken::MirrorIntoSharedDocument);
                if mirror_in_place(&store, id, image, ignored) {
                    Answer::Matched(true)
                } else {
                    let unlooked = broken == Some(Broken::MirrorToFirstListed);
                    let at = mirror_at(&store, id, unlooked);
                    mirror_write(&mut store, id, at, image, MirrorRule::Product)
                }
            }
            Next::Do(step) if on_listed_source(&store, id, &step) => {
                match probe_listed(&store, id, &step) {
                    Probed::Answered(answer) => answer,
                    Probed::At(at) => execute_at(&mut store, id, at, &step),
                }
            }
            Next::Do(step) => execute(&mut store, id, &step),
            Next::Done(Outcome::Read(v)) => return Ok(v),
            Next::Done(other) => return Err(format!("a get answered {other:?}")),
        };
        next = machine.next(Some(answer)).map_err(|e| e.to_string())?;
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
    /// The final phases of the runs in which a copy was lost, and whether a repair wrote.
    lost_ends: BTreeSet<(Phase, bool)>,
    /// The router faults the exploration went through (`Event`).
    events: BTreeSet<Event>,
    violation: Option<String>,
}

/// A router fault or a worker's event an exploration went through, for the runs to check that
/// they covered it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
enum Event {
    /// A router crashed with an operation in flight.
    CrashMidOperation,
    /// A migration ended in this phase after a router crashed.
    EndedAfterACrash(Phase),
    /// An operator forgot a router whose lease had run out.
    Forget,
    /// An operator forgot a router whose lease was live (broken).
    ForgetLive,
    /// A forgotten router came back and registered again.
    Reregistration,
    /// A worker's execution started from a checkpoint past its partition's first batch: it
    /// repeats only the batches after it.
    ResumedPastACheckpoint,
    /// A batch did not settle well while a later batch of the same execution settled well:
    /// the checkpoint records neither.
    FailedAheadOfASettledBatch,
    /// A worker was killed with statements of two batches in flight.
    KilledWithTwoBatchesInFlight,
    /// A worker noticed mid-partition that the phase moved, and released the partition.
    NoticedThePhase,
    /// A router's mirror of a shared id was done without a write (`mirror_writes`).
    MirroredInPlace,
    /// The revert copier found a shared id's document in place (`revert_action`).
    RevertedInPlace,
    /// The revert copier left out a mirror a router had already made (`skip_mirrored`).
    RevertSkippedAMirroredWrite,
    /// A router's mirror, or the revert copier's, went to a fanout source's second listed
    /// location, where the source document was (`mirror_location`).
    RouterMirroredToALaterListedLocation,
    RevertCopiedToALaterListedLocation,
    /// A router's insert into a fanout source was a duplicate key by its probe of the listed
    /// locations (`listed_location`).
    InsertRefusedByTheProbe,
    /// A router re-created an id over its source tombstone on a fanout source's second listed
    /// location.
    TombstoneReplacedWhereItIs,
    /// `query_answer` refused a many-document read in this phase: the front fails it.
    QueryRefused(Phase),
    /// A conditional find answered `Unmatched` on this side.
    Unmatched(Side),
    /// A conditional find's second read (with the condition) found the document other than
    /// its first read (by id) did.
    ChangedBetweenTheFindsReads,
    /// A conditional write met a live document its condition does not match, and changed
    /// nothing.
    ConditionFailedOnAWrite,
    /// An upsert's insert met a document holding the id, and its update was tried again.
    UpsertRetried,
    /// A many-document read left out an id whose source document matched, the target
    /// holding it.
    QueryLeftOutASupersededSourceMatch,
    /// A many-document read returned the target's document of an id the presence check had
    /// not found there (copied or written in between).
    QueryFoundATargetDocumentAfterThePresenceCheck,
}

/// 64 bits: the chance that two of n states share a fingerprint (and one goes unexplored) is
/// about n²/2^65, three in a million at ten million states.
///
/// The state is packed losslessly into a few words, which are then mixed one after the other
/// by MurmurHash3's 64-bit finalizer, a bijection: two states differing in one word never
/// collide, and otherwise as seldom as random values do. (The derived `Hash` fed a hasher
/// field by field and cost a quarter of the exploration.) Every struct is destructured in
/// full, so that a field added to the state does not compile until it is fingerprinted too.
fn fingerprint(s: &State) -> u64 {
    let State {
        phase,
        routers,
        workers,
        copy_lost,
        purge_pos,
        revert_purge_pos,
        repair_pos,
        repair_at,
        repaired,
        revert_outdated,
        sealed,
        expiries_left,
        transients_left,
        kills_left,
        crashes_left,
        forgets_left,
        store,
        lin,
    } = s;
    // The shared ids and the fanout world are the workload's, the same in every state of an
    // exploration: only the words the fanout world uses are mixed in.
    let Store {
        source_slots,
        target_slots,
        mirrored,
        shared: _,
        fanout,
    } = store;
    let mut words = [0_u64; 20];
    let repair = match *repair_at {
        RepairAt::Idle => 0,
        RepairAt::Found => 1,
        RepairAt::Read(v) => 2 | u64::from(v) << 2,
        RepairAt::Duplicate(v) => 3 | u64::from(v) << 2,
    };
    words[0] = *phase as u64
        | u64::from(*copy_lost) << 4
        | u64::from(*purge_pos) << 5
        | u64::from(*revert_purge_pos) << 13
        | u64::from(*repair_pos) << 21
        | repair << 29
        | u64::from(*repaired) << 39
        | u64::from(*expiries_left) << 40
        | u64::from(*transients_left) << 48
        | u64::from(*kills_left) << 56;
    for id in 0..IDS {
        let ([first, second], [first_mirrored, second_mirrored]) = (source_slots[id], mirrored[id]);
        words[1] |= first.bits() << (19 * id) | u64::from(first_mirrored) << (57 + id);
        words[2] |= target_slots[id].bits() << (19 * id);
        words[19] |= second.bits() << (19 * id) | u64::from(second_mirrored) << (57 + id);
    }
    words[3] = u64::from(lin[0]) | u64::from(lin[1]) << 32;
    words[4] = u64::from(lin[2])
        | u64::from(*revert_outdated) << 32
        | u64::from(*sealed) << 33
        | u64::from(*crashes_left) << 34
        | u64::from(*forgets_left) << 42;
    for (r, router) in routers.iter().enumerate() {
        let Router {
            acked,
            acked_sealed,
            next_op,
            run,
            live,
            registered,
        } = *router;
        words[5 + r] = acked as u64
            | u64::from(next_op) << 4
            | u64::from(live) << 12
            | run.map_or(0, |n| u64::from(n) + 1) << 13
            | u64::from(acked_sealed) << 44
            | u64::from(registered) << 45;
    }
    // 32 bits each: a step's number is below 2^29 (few steps are ever numbered), a listed
    // location below 2.
    let stmt = |stmt: Option<Stmt>| -> u64 {
        match stmt {
            None => 0,
            Some(Stmt::Step(n, at)) => {
                debug_assert!(n < 1 << 29);
                1 | (at as u64) << 2 | u64::from(n) << 3
            }
            Some(Stmt::Overwrite(v)) => 2 | u64::from(v) << 2,
            Some(Stmt::Mirror(slot, rule, at)) => {
                3 | (rule as u64) << 2 | (at as u64) << 4 | slot.bits() << 5
            }
        }
    };
    for (w, partition) in workers.iter().enumerate() {
        let Partition {
            stage,
            checkpoint,
            start,
            read,
            sent,
            unsettled,
            failed,
            ending,
            window,
            stmts,
            lookups,
            again,
            orphans,
        } = *partition;
        let stage = match stage {
            Stage::Waiting => 0,
            Stage::Running => 1,
            Stage::Killed => 2,
            Stage::Done => 3,
            Stage::Failed => 4,
        };
        let ending = match ending {
            Ending::No => 0,
            Ending::Release => 1,
            Ending::Fail => 2,
        };
        // Batch numbers and positions are at most `IDS` (2 bits), the masks `IDS` bits.
        let at = 7 + 4 * w;
        words[at] = stage
            | u64::from(checkpoint) << 3
            | u64::from(start) << 5
            | u64::from(read) << 7
            | u64::from(sent) << 9
            | u64::from(unsettled) << 11
            | u64::from(failed) << 14
            | ending << 17
            | u64::from(again) << 19
            // A window's number is below 2^30 (`Table::number`).
            | u64::from(window) << 32;
        for id in 0..IDS {
            words[at] |= u64::from(lookups[id]) << (20 + id);
            words[at + 1 + id] = stmt(stmts[id]) | stmt(orphans[id]) << 32;
        }
    }
    // The fanout world's second listed location is the last word: outside it, always 0.
    let words = if *fanout { &words[..] } else { &words[..19] };
    words.iter().fold(0x2545_f491_4f6c_dd1d, |h, &w| {
        let mut k = h ^ w;
        k ^= k >> 33;
        k = k.wrapping_mul(0xff51_afd7_ed55_8ccd);
        k ^= k >> 33;
        k = k.wrapping_mul(0xc4ce_b9fe_1a85_ec53);
        k ^ k >> 33
    })
}

/// The tables' hasher: collects the bytes a `Hash` implementation feeds it and hashes them in
/// one go with xxh64, cheaper than SipHash over many one-byte writes. Lengths and
/// discriminants go in as LEB128, which keeps the encoding lossless.
#[derive(Default)]
struct TableHasher(Vec<u8>);

impl Hasher for TableHasher {
    fn write(&mut self, bytes: &[u8]) {
        self.0.extend_from_slice(bytes);
    }

    fn write_u8(&mut self, i: u8) {
        self.0.push(i);
    }

    fn write_usize(&mut self, mut i: usize) {
        while i >= 0x80 {
            self.0.push((i & 0x7f) as u8 | 0x80);
            i >>= 7;
        }
        self.0.push(i as u8);
    }

    fn write_isize(&mut self, i: isize) {
        self.write_usize(i as usize);
    }

    fn finish(&self) -> u64 {
        xxhash_rust::xxh64::xxh64(&self.0, 0)
    }
}

/// The probe reads' memo: its keys are small numbers, mixed by splitmix64's finalizer.
#[derive(Default)]
struct Mix(u64);

impl Hasher for Mix {
    fn write(&mut self, _: &[u8]) {
        unreachable!("only numbers are hashed")
    }

    fn write_u128(&mut self, i: u128) {
        self.write_u64(i as u64 ^ ((i >> 64) as u64).rotate_left(29));
    }

    fn write_u64(&mut self, i: u64) {
        let mut z = i.wrapping_add(0x9e37_79b9_7f4a_7c15);
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        self.0 = z ^ (z >> 31);
    }

    fn finish(&self) -> u64 {
        self.0
    }
}

/// The fingerprints seen: open addressing with linear probing over plain words, at most half
/// full. At millions of states nearly every lookup misses the cache; here it touches one
/// line, where a general hash table touches two (its control bytes and its bucket), and that
/// was a third of the exploration.
struct Seen {
    slots: Vec<u64>,
    len: usize,
}

impl Seen {
    fn new() -> Self {
        Seen {
            slots: vec![0; 1 << 16],
            len: 0,
        }
    }

    /// Adds a fingerprint; whether it was new. 0 marks an empty slot, so a fingerprint 0 is
    /// kept as 1 (one more chance of a collision in 2^64).
    fn insert(&mut self, print: u64) -> bool {
        if 2 * (self.len + 1) > self.slots.len() {
            let size = 2 * self.slots.len();
            let old = std::mem::replace(&mut self.slots, vec![0; size]);
            self.len = 0;
            for print in old.into_iter().filter(|&p| p != 0) {
                self.insert(print);
            }
        }
        let print = print.max(1);
        let mask = self.slots.len() - 1;
        // The fingerprints are uniform: their low bits are as good an index as any.
        let mut i = print as usize & mask;
        loop {
            match self.slots[i] {
                0 => {
                    self.slots[i] = print;
                    self.len += 1;
                    return true;
                }
                p if p == print => return false,
                _ => i = (i + 1) & mask,
            }
        }
    }
}

/// Breadth first over every interleaving, so the first violation found has a shortest trace.
fn explore(cfg: &Setup) -> Report {
    let model = Model::new(cfg);
    let started = Instant::now();
    let init = model.initial();
    let mut seen = Seen::new();
    seen.insert(fingerprint(&init));
    // Parent index and action of every state, to print a trace.
    let mut parents: Vec<(u32, Act)> = vec![(u32::MAX, Act::Repair)];
    let mut frontier: Vec<(State, u32)> = vec![(init, 0)];
    let mut report = Report {
        states: 1,
        transitions: 0,
        depth: 0,
        elapsed: Duration::ZERO,
        moves: BTreeSet::new(),
        ends: BTreeSet::new(),
        lost_ends: BTreeSet::new(),
        events: BTreeSet::new(),
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
                if s.copy_lost {
                    report.lost_ends.insert((s.phase, s.repaired));
                }
                if s.crashes_left < cfg.crashes {
                    report.events.insert(Event::EndedAfterACrash(s.phase));
                }
                if let Err(why) = model.check_end(&s) {
                    report.violation = Some(fail(&parents, idx, None, why));
                    break 'states;
                }
            }
            for act in acts {
                report.transitions += 1;
                let mut n = s;
                let checked = model.apply(&mut n, act, &mut Log::off());
                match act {
                    Act::Move(to) => {
                        report.moves.insert((s.phase, to));
                    }
                    Act::Crash(r) if s.routers[r].run.is_some() => {
                        report.events.insert(Event::CrashMidOperation);
                    }
                    Act::Forget(r) if s.routers[r].live => {
                        report.events.insert(Event::ForgetLive);
                    }
                    Act::Forget(_) => {
                        report.events.insert(Event::Forget);
                    }
                    Act::Renew(r) if !s.routers[r].registered => {
                        report.events.insert(Event::Reregistration);
                    }
                    _ => {}
                }
                let print = fingerprint(&n);
                // A state that fails a check ends the exploration, so it may as well count as
                // seen.
                let checked = checked.and_then(|()| {
                    if !seen.insert(print) {
                        Ok(false)
                    } else if model.reads_alike(&s, &n) {
                        // The parent passed the same probes.
                        Ok(true)
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
                        parents.push((idx, act));
                        next_frontier.push((n, (parents.len() - 1) as u32));
                    }
                }
            }
        }
        frontier = next_frontier;
    }
    report.states = seen.len;
    report.elapsed = started.elapsed();
    report.events.extend(model.events.borrow().iter().copied());
    report
}

/// Replays `acts` from the initial state, one line per step.
fn trace(model: &Model<'_>, acts: &[Act]) -> String {
    let mut s = model.initial();
    let ids = model.cfg.workload.ids;
    let mut out = String::new();
    let shared: Vec<usize> = (0..ids).filter(|&id| model.shared(id)).collect();
    if !shared.is_empty() {
        let _ = writeln!(
            out,
            "  (ids {shared:?} are shared: one document for both sides, shown on both lines)"
        );
    }
    for (i, act) in acts.iter().enumerate() {
        let mut log = Log::on();
        let result = model.apply(&mut s, *act, &mut log);
        let side = |side: Side| -> Vec<Slot> { (0..ids).map(|id| s.store.get(side, id)).collect() };
        let at = |at: usize| -> (Vec<Slot>, Vec<bool>) {
            (0..ids)
                .map(|id| (s.store.source_slots[id][at], s.store.mirrored[id][at]))
                .unzip()
        };
        // The fanout source: a line per listed location.
        let source = if s.store.fanout {
            let ((first, first_mirrored), (second, second_mirrored)) = (at(0), at(1));
            format!(
                "source {} {first:?} mirrored {first_mirrored:?}\n       \
                 source {} {second:?} mirrored {second_mirrored:?}",
                FANOUT[0], FANOUT[1]
            )
        } else {
            let (first, mirrored) = at(0);
            format!("source {first:?} mirrored {mirrored:?}")
        };
        let _ = writeln!(
            out,
            "  {:>3}. [{}] {}\n       {source}\n       target {:?}",
            i + 1,
            s.phase,
            log.text,
            side(Side::Target),
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
        name: "updates_and_deletes".to_owned(),
        initial: [Some(1), Some(2), None],
        ids: 2,
        ops: [
            calls(vec![
                (0, Operation::Update(Add(10))),
                (1, Operation::Delete),
                (1, Operation::Insert(7)),
            ]),
            calls(vec![
                (0, Operation::Update(Add(20))),
                (1, replace(9, true)),
                (0, Operation::Delete),
            ]),
        ],
        unroutable: None,
        shared: [false; IDS],
        fanout: None,
    }
}

/// The same size, other races: deletes first, then re-creations and updates of deleted ids,
/// a plain replace racing a delete, a read.
fn deletes_and_recreations() -> Workload {
    Workload {
        name: "deletes_and_recreations".to_owned(),
        initial: [Some(1), Some(2), None],
        ids: 2,
        ops: [
            calls(vec![
                (0, Operation::Delete),
                (1, Operation::Update(Add(10))),
                (0, Operation::Insert(5)),
            ]),
            calls(vec![
                (0, replace(8, false)),
                (1, Operation::Delete),
                (0, Operation::Get),
            ]),
        ],
        unroutable: None,
        shared: [false; IDS],
        fanout: None,
    }
}

/// Three ids, the third created by the application during the migration (outside the source
/// at the start, inside the purges'; in the backfill's scan if it was created in the source
/// before the write switch), racing an update of it.
fn a_created_id() -> Workload {
    Workload {
        name: "a_created_id".to_owned(),
        initial: [Some(1), Some(2), None],
        ids: 3,
        ops: [
            calls(vec![
                (2, Operation::Insert(5)),
                (0, Operation::Update(Add(10))),
                (1, Operation::Delete),
            ]),
            calls(vec![
                (2, Operation::Update(Add(20))),
                (0, Operation::Delete),
                (1, replace(9, true)),
            ]),
        ],
        unroutable: None,
        shared: [false; IDS],
        fanout: None,
    }
}

/// The first two operations of each router of `updates_and_deletes`: concurrent copy-on-write
/// updates of id 0, a delete racing an upsert of id 1. A partition in two batches holds one id
/// each, so each batch sees one of the races; the always-on batch runs use it, at a fifth of
/// the full workload's states.
fn updates_and_deletes_short() -> Workload {
    let mut workload = updates_and_deletes();
    workload.name = "updates_and_deletes_short".to_owned();
    for ops in workload.ops.iter_mut() {
        ops.truncate(2);
    }
    workload
}

fn upsert(update: u8, insert: u8) -> Op {
    Operation::Upsert {
        update: Add(update),
        insert,
    }
}

/// Conditional operations (`Below(10)`: the workloads' documents match until an update adds
/// 10) racing unconditional ones, on two ids that start in the source: two conditional
/// updates of id 0 (a queue's claim: one matches, the other finds the document no longer
/// matching), then a conditional read of it racing a replace that makes it match again; a
/// conditional delete of id 1 racing an update that makes it stop matching between the
/// delete's find and its tombstone.
fn conditional() -> Workload {
    Workload {
        name: "conditional".to_owned(),
        initial: [Some(1), Some(2), None],
        ids: 2,
        ops: [
            vec![
                when(0, Operation::Update(Add(10)), 10),
                when(1, Operation::Delete, 10),
                when(0, Operation::Get, 10),
            ],
            vec![
                when(0, Operation::Update(Add(10)), 10),
                Call::Op {
                    id: 1,
                    op: Operation::Update(Add(10)),
                    cond: None,
                },
                Call::Op {
                    id: 0,
                    op: replace(3, false),
                    cond: None,
                },
            ],
        ],
        unroutable: None,
        shared: [false; IDS],
        fanout: None,
    }
}

/// The first two operations of each router of `conditional`: the two conditional updates of
/// id 0, the conditional delete of id 1 racing the update that makes it stop matching.
fn conditional_short() -> Workload {
    let mut workload = conditional();
    workload.name = "conditional_short".to_owned();
    for ops in workload.ops.iter_mut() {
        ops.truncate(2);
    }
    workload
}

/// Upserts, unconditional and conditional: two upserts of an id no one holds race (one
/// inserts, the other's insert meets it and its update is tried again); a conditional
/// upsert of id 0 races an update that makes it stop matching (a duplicate then) and a
/// delete (an insert over the tombstone then).
fn upserts() -> Workload {
    Workload {
        name: "upserts".to_owned(),
        initial: [Some(1), None, None],
        ids: 2,
        ops: [
            vec![
                Call::Op {
                    id: 1,
                    op: upsert(10, 5),
                    cond: None,
                },
                when(0, upsert(10, 4), 10),
            ],
            vec![
                Call::Op {
                    id: 1,
                    op: upsert(20, 7),
                    cond: None,
                },
                Call::Op {
                    id: 0,
                    op: Operation::Update(Add(10)),
                    cond: None,
                },
            ],
        ],
        unroutable: None,
        shared: [false; IDS],
        fanout: None,
    }
}

/// A conditional replace with upsert of an id no one holds, racing its insert and delete by
/// the other router; a conditional upsert of id 0 racing a delete of it.
fn conditional_upserts() -> Workload {
    Workload {
        name: "conditional_upserts".to_owned(),
        initial: [Some(1), None, None],
        ids: 2,
        ops: [
            vec![when(1, replace(3, true), 10), when(0, upsert(10, 4), 10)],
            calls(vec![
                (1, Operation::Insert(5)),
                (1, Operation::Delete),
                (0, Operation::Delete),
            ]),
        ],
        unroutable: None,
        shared: [false; IDS],
        fanout: None,
    }
}

/// A many-document read of the documents below 10 (both, at the start) racing an update that
/// makes id 0 stop matching in the target while its source image still matches, a delete of
/// id 1, and the copier.
fn queries() -> Workload {
    Workload {
        name: "queries".to_owned(),
        initial: [Some(1), Some(2), None],
        ids: 2,
        ops: [
            calls(vec![
                (0, Operation::Update(Add(10))),
                (1, Operation::Delete),
            ]),
            vec![Call::Query(Below(10))],
        ],
        unroutable: None,
        shared: [false; IDS],
        fanout: None,
    }
}

/// `workload` with one more id: a document in the source that cannot be routed. No router
/// addresses it, every worker scans it.
fn with_unroutable(mut workload: Workload, name: &'static str) -> Workload {
    let id = workload.ids;
    workload.initial[id] = Some(3);
    workload.ids += 1;
    workload.unroutable = Some(id);
    workload.name = name.to_owned();
    workload
}

/// `workload` with id `id` shared: both routing versions place it in one collection both
/// layouts share, where it is one document for both sides.
fn with_shared(mut workload: Workload, id: usize) -> Workload {
    assert!(id < workload.ids && workload.unroutable != Some(id));
    workload.shared[id] = true;
    workload.name = format!("{}+shared {id}", workload.name);
    workload
}

/// `workload` in the fanout world: the source version lists s1 and s3 for every id, and id
/// k's document starts on the listed location `at[k]`.
fn on_fanout(mut workload: Workload, at: [usize; IDS]) -> Workload {
    assert!(workload.unroutable.is_none() && workload.shared == [false; IDS]);
    workload.fanout = Some(at);
    workload.name = format!("{}+fanout {:?}", workload.name, &at[..workload.ids]);
    workload
}

/// `updates_and_deletes_short` in the fanout world, id 0 on the second listed location and
/// id 1 on the first: id 0 is updated by both routers at once (copied on write before the
/// switch or not, mirrored where it is while rolling back, carried back there by the revert
/// copier), id 1 deleted by one and upserted by the other.
fn fanout_updates() -> Workload {
    on_fanout(updates_and_deletes_short(), [1, 0, 0])
}

/// One id, on the second listed location of the fanout world: one router inserts it (a
/// duplicate while it exists, in every phase), then deletes it; the other deletes it, then
/// re-creates it (after a rollback, over its source tombstone where it is). The two inserts
/// and the two deletes race.
fn fanout_inserts() -> Workload {
    on_fanout(
        Workload {
            name: "inserts".to_owned(),
            initial: [Some(1), None, None],
            ids: 1,
            ops: [
                calls(vec![(0, Operation::Insert(5)), (0, Operation::Delete)]),
                calls(vec![(0, Operation::Delete), (0, Operation::Insert(7))]),
            ],
            unroutable: None,
            shared: [false; IDS],
            fanout: None,
        },
        [1, 0, 0],
    )
}

/// Writes straight to the process's stderr, past the test harness's capture, so that the
/// figures show in every run.
fn report_line(line: &str) {
    use std::io::Write as _;
    let _ = writeln!(std::io::stderr(), "{line}");
}

/// The same rule as `tests/support`: set to anything but empty or `0`.
fn heavy() -> bool {
    matches!(std::env::var("RESHARD_HEAVY_TESTS"), Ok(v) if !v.is_empty() && v != "0")
}

fn summary(label: &str, cfg: &Setup, r: &Report) -> String {
    format!(
        "protocol model [{label}] workload={} routers={} ops/router={} ids={} batches={} lease \
         expiries={} crashes={} forgets={} transient failures={} kills={} lost copy={}: {} \
         states, {} transitions, depth {}, {:.1?}, phase moves covered {}, final phases {:?}",
        cfg.workload.name,
        ROUTERS,
        cfg.workload.ops[0].len(),
        cfg.workload.ids,
        cfg.batches,
        cfg.expiries,
        cfg.crashes,
        cfg.forgets,
        cfg.transients,
        cfg.kills,
        cfg.lose_a_copy,
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

/// The real protocol under `cfg`'s faults: no check fails, every phase move is explored and
/// the migration can both complete and roll back.
fn assert_protocol_holds(cfg: Setup) -> Report {
    assert!(cfg.broken.is_none());
    let report = explore(&cfg);
    report_line(&summary("real protocol", &cfg, &report));
    if let Some(v) = &report.violation {
        panic!("the protocol lost something:\n{v}");
    }
    assert_eq!(report.moves, all_moves(), "every phase move is explored");
    assert!(
        report.ends.contains(&Phase::Completed) && report.ends.contains(&Phase::RolledBack),
        "{:?}",
        report.ends
    );
    report
}

fn assert_caught(broken: Broken, lose_a_copy: bool, workload: Workload, expect: &str) {
    assert_caught_with(
        Setup {
            broken: Some(broken),
            lose_a_copy,
            ..Setup::new(workload)
        },
        expect,
    )
}

fn assert_caught_with(cfg: Setup, expect: &str) {
    let broken = cfg.broken.expect("a broken variant");
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
    assert_protocol_holds(Setup::new(updates_and_deletes()));
    if heavy() {
        assert_protocol_holds(Setup::new(deletes_and_recreations()));
        assert_protocol_holds(Setup::new(a_created_id()));
    }
}

/// Issue 10: a router's lease may run out at any moment, with an operation in flight; the
/// driver then counts it out and moves on. Nothing of the operation lands afterwards, and the
/// router serves again only after loading the current phase.
#[test]
fn a_router_whose_lease_runs_out_mid_operation_loses_nothing() {
    assert_protocol_holds(Setup {
        expiries: 1,
        ..Setup::new(updates_and_deletes())
    });
    if heavy() {
        assert_protocol_holds(Setup {
            expiries: 1,
            ..Setup::new(deletes_and_recreations())
        });
    }
}

/// Issue 13: a router crashes for good, possibly mid-operation: the steps it had not run never
/// happen, it never renews, the driver counts it out once its lease ran out and the migration
/// ends without it, either way. An operator may then forget it (`routers forget`). And a router
/// that was only silent, its lease run out, is forgotten and comes back: it finds its
/// registration gone and registers again, a lapse, so it loads the phase before it serves.
/// (Forgetting is refused before the lease and the fence margin ran out, and while rolling
/// back.)
#[test]
fn a_crashed_or_forgotten_router_loses_nothing() {
    let crashed = assert_protocol_holds(Setup {
        crashes: 1,
        forgets: 1,
        ..Setup::new(updates_and_deletes())
    });
    for event in [
        Event::CrashMidOperation,
        Event::EndedAfterACrash(Phase::Completed),
        Event::EndedAfterACrash(Phase::RolledBack),
        Event::Forget,
    ] {
        assert!(crashed.events.contains(&event), "{:?}", crashed.events);
    }
    let silent = assert_protocol_holds(Setup {
        expiries: 1,
        forgets: 1,
        ..Setup::new(updates_and_deletes())
    });
    for event in [Event::Forget, Event::Reregistration] {
        assert!(silent.events.contains(&event), "{:?}", silent.events);
    }
    assert!(!silent.events.contains(&Event::ForgetLive));
}

/// A statement of a worker's bulk write fails transiently: the batch is not checkpointed and
/// is executed again from its checkpoint (read again, decided again, written again) while the
/// routers go on writing: the copier's insert-if-absent, cleanup's presence check and the
/// revert copier's revisions make the second execution harmless.
#[test]
fn a_batch_executed_again_after_a_transient_failure_loses_nothing() {
    assert_protocol_holds(Setup {
        transients: 1,
        ..Setup::new(updates_and_deletes())
    });
    if heavy() {
        assert_protocol_holds(Setup {
            transients: 1,
            ..Setup::new(deletes_and_recreations())
        });
        // A batch may also fail and then be killed, or be taken over and then fail.
        assert_protocol_holds(Setup {
            transients: 1,
            kills: 1,
            ..Setup::new(updates_and_deletes())
        });
    }
}

/// A worker killed with statements in flight: they land or not, in any interleaving, until a
/// new worker takes the batch over and executes it again from the checkpoint.
#[test]
fn a_worker_killed_with_statements_in_flight_loses_nothing() {
    assert_protocol_holds(Setup {
        kills: 1,
        ..Setup::new(updates_and_deletes())
    });
    if heavy() {
        assert_protocol_holds(Setup {
            kills: 1,
            ..Setup::new(deletes_and_recreations())
        });
        assert_protocol_holds(Setup {
            kills: 1,
            ..Setup::new(a_created_id())
        });
    }
}

/// A document that cannot be routed: the backfill dead-letters it (an operator skips the dead
/// letter), cleanup keeps it, and it is in the source, unchanged, however the migration ends.
#[test]
fn a_document_that_cannot_be_routed_stays_in_the_source() {
    let workload = with_unroutable(updates_and_deletes(), "updates_and_deletes+unroutable");
    assert_protocol_holds(Setup::new(workload.clone()));
    if heavy() {
        assert_protocol_holds(Setup {
            kills: 1,
            ..Setup::new(workload)
        });
    }
}

/// A copy acknowledged but lost (a `w:1` write rolled back by a failover): reconciliation may
/// find it and the repair put it back, and the migration completes; or it does not, and
/// cleanup stops instead of deleting the only copy.
#[test]
fn a_lost_copy_is_repaired_or_stops_cleanup() {
    assert_lost_copy_handled(Setup {
        lose_a_copy: true,
        ..Setup::new(updates_and_deletes())
    });
    if heavy() {
        // The repair racing a re-executed batch.
        assert_lost_copy_handled(Setup {
            lose_a_copy: true,
            kills: 1,
            ..Setup::new(updates_and_deletes())
        });
    }
}

fn assert_lost_copy_handled(cfg: Setup) {
    let report = explore(&cfg);
    report_line(&summary("real protocol", &cfg, &report));
    if let Some(v) = &report.violation {
        panic!("a lost copy lost the document:\n{v}");
    }
    // Completed thanks to the repair; stopped in cleanup without it; rolled back.
    for end in [
        (Phase::Completed, true),
        (Phase::Cleanup, false),
        (Phase::RolledBack, false),
    ] {
        assert!(report.lost_ends.contains(&end), "{:?}", report.lost_ends);
    }
}

/// The revert copier reads the source documents of its batch's mirrors and leaves out those a
/// router already mirrored at the image's revision or a newer one (`skip_mirrored`): nothing
/// is lost, in the plain model and with a router cut off between its write and its mirror
/// (the pass is outdated and runs again).
#[test]
fn the_revert_copier_leaves_out_what_routers_mirrored_and_loses_nothing() {
    let report = assert_protocol_holds(Setup::new(updates_and_deletes()));
    assert!(
        report.events.contains(&Event::RevertSkippedAMirroredWrite),
        "{:?}",
        report.events
    );
    assert_protocol_holds(Setup {
        expiries: 1,
        ..Setup::new(updates_and_deletes_short())
    });
}

/// A partition in two batches (one id each, in id order), in flight at once: the second
/// batch's reads run while the first one's statements land, statements of both land in any
/// order among everything else, and the checkpoint follows the product's `BatchWindow`. With
/// one transient failure: of batch 2 once batch 1 was recorded (the re-execution repeats batch
/// 2 alone, read and decided again), or of batch 1 while batch 2 settled well (neither is
/// recorded, both are executed again). A worker also notices mid-partition that the phase
/// moved (a rollback during the backfill) and releases its partition.
#[test]
fn batches_in_flight_together_lose_nothing() {
    let report = assert_protocol_holds(Setup {
        batches: 2,
        transients: 1,
        ..Setup::new(updates_and_deletes_short())
    });
    for event in [
        Event::ResumedPastACheckpoint,
        Event::FailedAheadOfASettledBatch,
        Event::NoticedThePhase,
    ] {
        assert!(report.events.contains(&event), "{:?}", report.events);
    }
    if heavy() {
        for workload in [updates_and_deletes(), deletes_and_recreations()] {
            assert_protocol_holds(Setup {
                batches: 2,
                transients: 1,
                ..Setup::new(workload)
            });
        }
        // A router's lapse while the revert copy is under way, resumes from a checkpoint, or
        // is due to.
        assert_protocol_holds(Setup {
            batches: 2,
            transients: 1,
            expiries: 1,
            ..Setup::new(updates_and_deletes_short())
        });
        // Three batches of one id each, two in flight at most: the third is sent only once
        // the first one is recorded.
        assert_protocol_holds(Setup {
            batches: 3,
            ..Setup::new(a_created_id())
        });
    }
}

/// A worker killed with statements of both batches in flight: orphans of both land or not, in
/// any interleaving, and the takeover waits for every one of them, then executes the partition
/// again from the last checkpoint (batch 2 alone once batch 1 was recorded).
#[test]
fn a_worker_killed_with_two_batches_in_flight_loses_nothing() {
    let report = assert_protocol_holds(Setup {
        batches: 2,
        kills: 1,
        ..Setup::new(updates_and_deletes_short())
    });
    for event in [
        Event::KilledWithTwoBatchesInFlight,
        Event::ResumedPastACheckpoint,
    ] {
        assert!(report.events.contains(&event), "{:?}", report.events);
    }
    if heavy() {
        assert_protocol_holds(Setup {
            batches: 2,
            kills: 1,
            ..Setup::new(updates_and_deletes())
        });
        // A batch fails and the worker is then killed, or the takeover's batch fails.
        assert_protocol_holds(Setup {
            batches: 2,
            transients: 1,
            kills: 1,
            ..Setup::new(updates_and_deletes_short())
        });
        // Cleanup finds the lost copy missing in batch 1 or 2 while the other one's deletes
        // are in flight, or orphaned.
        assert_lost_copy_handled(Setup {
            batches: 2,
            lose_a_copy: true,
            kills: 1,
            ..Setup::new(updates_and_deletes_short())
        });
    }
}

/// Another worker process re-plans an outdated revert copy while the revert copier's pass is
/// under way (`Store::replan_revert_if_outdated`, run by every worker's `planned()`): the
/// reset voids the holder's lease but keeps the partition leased until its lease and margin
/// ran out, so the new pass starts only once the old holder's mirrors settled.
#[test]
fn a_revert_replan_during_a_pass_loses_nothing() {
    assert_protocol_holds(Setup {
        expiries: 1,
        replans: true,
        ..Setup::new(updates_and_deletes_short())
    });
}

/// The product's rule before session 12, found by the model: the reset made a leased revert
/// partition pending at once, a new pass ran and the rollback completed while the old
/// holder's mirrors were still in flight, and a late mirror brought back a document deleted
/// after the seal (the shortest trace: 35 steps).
#[test]
fn a_revert_replan_that_does_not_wait_for_the_holder_is_caught() {
    assert_caught_with(
        Setup {
            broken: Some(Broken::ReplanWithoutWaiting),
            expiries: 1,
            replans: true,
            ..Setup::new(updates_and_deletes_short())
        },
        "",
    );
}

/// `updates_and_deletes_short` with id `id` shared: the source version places it where the
/// target version does, in the collection both layouts share, so it has one document for both
/// sides. Id 0 is updated by both routers at once, id 1 deleted by one and upserted by the
/// other; the other id moves (copied on write, or tombstoned).
fn a_shared_id(id: usize) -> Workload {
    with_shared(updates_and_deletes_short(), id)
}

/// An id both routing versions place in one collection both layouts share: one document for
/// both sides. The backfill leaves it in place, cleanup keeps it, the removal of the target
/// layout after a rollback leaves it, and in `reverting` no mirror writes it, neither a
/// router's (`mirror_writes`) nor the revert copier's (`revert_action` on the location it
/// scanned): the source already holds it, and an image read a moment earlier would overwrite
/// a newer write.
#[test]
fn an_id_both_layouts_place_in_one_collection_loses_nothing() {
    for id in [0, 1] {
        let report = assert_protocol_holds(Setup::new(a_shared_id(id)));
        for event in [Event::MirroredInPlace, Event::RevertedInPlace] {
            assert!(report.events.contains(&event), "{:?}", report.events);
        }
        // A router cut off between its write and its mirror.
        assert_protocol_holds(Setup {
            expiries: 1,
            ..Setup::new(a_shared_id(id))
        });
        assert_protocol_holds(Setup::new(with_shared(updates_and_deletes(), id)));
        assert_protocol_holds(Setup::new(with_shared(deletes_and_recreations(), id)));
    }
    if heavy() {
        for id in [0, 1] {
            // A batch executed again; a worker killed with its statements in flight; a lost
            // copy of the other id, repaired or stopping cleanup.
            assert_protocol_holds(Setup {
                batches: 2,
                transients: 1,
                ..Setup::new(a_shared_id(id))
            });
            assert_protocol_holds(Setup {
                kills: 1,
                ..Setup::new(a_shared_id(id))
            });
            assert_lost_copy_handled(Setup {
                lose_a_copy: true,
                ..Setup::new(a_shared_id(id))
            });
        }
        let both = with_shared(with_shared(updates_and_deletes(), 0), 1);
        assert_protocol_holds(Setup::new(both));
        // An id the application creates in the shared collection during the migration.
        assert_protocol_holds(Setup::new(with_shared(a_created_id(), 2)));
        let unroutable = with_unroutable(updates_and_deletes(), "updates_and_deletes+unroutable");
        assert_protocol_holds(Setup::new(with_shared(unroutable, 1)));
        assert_protocol_holds(Setup {
            expiries: 1,
            ..Setup::new(with_shared(updates_and_deletes(), 1))
        });
    }
}

/// The product's bug before `mirror_writes`, found by the rollback test with the example
/// application (reads in `reverting` one version behind): a router's mirror of a shared id
/// reads the target image, another router's write lands on that very document, and the
/// mirror's conditional replace, its filter met (no mirror stamped the document yet, and a
/// replace or a tombstone drops the stamp), writes the older image over it.
#[test]
fn a_router_mirror_into_a_shared_document_is_caught() {
    assert_caught_with(
        Setup {
            broken: Some(Broken::MirrorIntoSharedDocument),
            ..Setup::new(a_shared_id(0))
        },
        "allows",
    );
}

/// The same bug in the revert copier (a deleted order back, in the example application): its
/// scan reads the image of a shared id, a router's delete tombstones that very document, and
/// the copier's mirror writes the image back over the tombstone.
#[test]
fn a_revert_copy_into_a_shared_document_is_caught() {
    assert_caught_with(
        Setup {
            broken: Some(Broken::RevertCopyIntoSharedDocument),
            ..Setup::new(a_shared_id(1))
        },
        "allows",
    );
}

/// A fanout source (a layout reshard did not make: it lists s1 and s3 for every id, and the
/// id's document sits on one of them): every router step on the source probes the listed
/// locations and goes where `listed_location` says (a write where the document is, an
/// insert only where none is, a duplicate key otherwise), every mirror, a router's or the
/// revert copier's, where `mirror_location` says, and the source holds one document per id
/// throughout (`Model::apply` checks it after every step).
#[test]
fn a_fanout_source_keeps_one_document_per_id() {
    let updates = assert_protocol_holds(Setup::new(fanout_updates()));
    for event in [
        Event::RouterMirroredToALaterListedLocation,
        Event::RevertCopiedToALaterListedLocation,
    ] {
        assert!(updates.events.contains(&event), "{:?}", updates.events);
    }
    let inserts = assert_protocol_holds(Setup::new(fanout_inserts()));
    for event in [
        Event::InsertRefusedByTheProbe,
        Event::TombstoneReplacedWhereItIs,
    ] {
        assert!(inserts.events.contains(&event), "{:?}", inserts.events);
    }
    // A router cut off between its write and its mirror: the revert copy runs again.
    for workload in [fanout_updates(), fanout_inserts()] {
        assert_protocol_holds(Setup {
            expiries: 1,
            ..Setup::new(workload)
        });
    }
    if heavy() {
        // A batch executed again; a revert copier killed with its mirrors in flight, placed
        // before it died; the full workloads, with both ids on the second listed location.
        assert_protocol_holds(Setup {
            batches: 2,
            transients: 1,
            ..Setup::new(fanout_updates())
        });
        assert_protocol_holds(Setup {
            kills: 1,
            ..Setup::new(fanout_updates())
        });
        assert_protocol_holds(Setup::new(on_fanout(updates_and_deletes(), [1, 1, 0])));
        assert_protocol_holds(Setup::new(on_fanout(deletes_and_recreations(), [1, 1, 0])));
    }
}

/// A router's mirror sent to the first listed location of a fanout source (the product's
/// rule before `mirror_location`): an update or a delete of a document on the second listed
/// location, mirrored while rolling back, is upserted beside it.
#[test]
fn a_router_mirror_to_the_first_listed_location_is_caught() {
    assert_caught_with(
        Setup {
            broken: Some(Broken::MirrorToFirstListed),
            ..Setup::new(fanout_updates())
        },
        "two versions of it",
    );
}

/// The same in the revert copier: its mirror of a write made before the rollback goes to the
/// first listed location, beside the source document on the second.
#[test]
fn a_revert_copy_to_the_first_listed_location_is_caught() {
    assert_caught_with(
        Setup {
            broken: Some(Broken::RevertCopyToFirstListed),
            ..Setup::new(fanout_updates())
        },
        "two versions of it",
    );
}

/// An insert into a fanout source sent to the first listed location without looking at the
/// others (the router's rule before `listed_location`): the id, on the second listed
/// location, is inserted again, and the application is told so.
#[test]
fn an_insert_into_a_fanout_source_without_looking_is_caught() {
    assert_caught_with(
        Setup {
            broken: Some(Broken::InsertWithoutLooking),
            ..Setup::new(fanout_inserts())
        },
        "answered Inserted, which no linearization of the history allows",
    );
}

/// A write to a fanout source's document sent to the first listed location without looking
/// where the document is (the router's rule before `listed_location` for every write no find
/// preceded): an update of a document on the second listed location matches nothing.
#[test]
fn a_source_write_to_the_first_listed_location_is_caught() {
    assert_caught_with(
        Setup {
            broken: Some(Broken::SourceWriteToFirstListed),
            ..Setup::new(fanout_updates())
        },
        "answered Changed(false), which no linearization of the history allows",
    );
}

/// The checkpoint passes a batch that failed once the batches before it settled, recording
/// the well-settled batch after it: the re-execution starts past the failed one, whose
/// statements never landed.
#[test]
fn a_checkpoint_past_a_failed_batch_is_caught() {
    assert_caught_with(
        Setup {
            broken: Some(Broken::CheckpointPastAFailure),
            batches: 2,
            transients: 1,
            ..Setup::new(updates_and_deletes())
        },
        "allows",
    );
}

/// The checkpoint records a batch that settled well before the batch sent before it settled:
/// a worker killed then has the earlier batch's statements orphaned, one is dropped, and the
/// takeover starts past it.
#[test]
fn a_checkpoint_ahead_of_an_earlier_batch_is_caught() {
    assert_caught_with(
        Setup {
            broken: Some(Broken::CheckpointAheadOfEarlierBatches),
            batches: 2,
            kills: 1,
            ..Setup::new(updates_and_deletes())
        },
        "allows",
    );
}

#[test]
fn a_lease_checked_only_when_an_operation_starts_is_caught() {
    assert_caught_with(
        Setup {
            broken: Some(Broken::LeaseCheckedAtStart),
            expiries: 1,
            ..Setup::new(updates_and_deletes())
        },
        "allows",
    );
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
fn a_copier_that_overwrites_when_it_executes_a_batch_again_is_caught() {
    assert_caught_with(
        Setup {
            broken: Some(Broken::CopierOverwritesOnReexecution),
            transients: 1,
            ..Setup::new(updates_and_deletes())
        },
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
fn a_cleanup_that_deletes_an_unroutable_document_is_caught() {
    assert_caught(
        Broken::CleanupDeletesUnroutable,
        false,
        with_unroutable(updates_and_deletes(), "updates_and_deletes+unroutable"),
        "source document 2 removed while the target holds neither",
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

#[test]
fn a_revert_copier_that_skips_mirrors_by_raw_revision_is_caught() {
    assert_caught(
        Broken::RevertSkipsByRawRevision,
        false,
        updates_and_deletes(),
        "allows",
    );
}

#[test]
fn a_revert_copier_that_overwrites_when_it_executes_a_batch_again_is_caught() {
    assert_caught_with(
        Setup {
            broken: Some(Broken::RevertReexecutionOverwrites),
            transients: 1,
            ..Setup::new(updates_and_deletes())
        },
        "allows",
    );
}

#[test]
fn a_takeover_that_does_not_wait_for_orphans_is_caught() {
    assert_caught_with(
        Setup {
            broken: Some(Broken::OrphanAfterTakeover),
            kills: 1,
            ..Setup::new(updates_and_deletes())
        },
        "allows",
    );
}

/// The hole the model with lease expiries found in `reverting`: a router's write lands in the
/// target, its lease runs out before the mirror, and the revert copier had already passed the
/// id. Counting the pass complete anyway leaves the write in the target alone: readers of
/// `rolled_back` (the source) and of `revert_switch` (which carry the target's image over
/// first) disagree, or the source lacks a write a reader of `reverting` saw.
#[test]
fn a_revert_copy_that_ignores_a_lapse_during_its_pass_is_caught() {
    assert_caught_with(
        Setup {
            broken: Some(Broken::RevertIgnoresLapses),
            expiries: 1,
            ..Setup::new(deletes_and_recreations())
        },
        "allows",
    );
}

/// The `revert_switch` read before the lapse fix: the source alone. A router in `reverting`
/// writes the target and is cut off before its mirror, the revert copier having passed the id;
/// a reader of `revert_switch` then misses the write that readers of `reverting` see. The
/// shortest trace goes through a `revert_switch -> reverting` retreat, but forbidding the
/// retreat once the copy is outdated does not help: the lapse can come after the retreat,
/// while a router has not acknowledged it yet.
#[test]
fn a_revert_switch_read_of_the_source_alone_is_caught() {
    assert_caught_with(
        Setup {
            broken: Some(Broken::RevertSwitchReadsSourceOnly),
            expiries: 1,
            ..Setup::new(deletes_and_recreations())
        },
        "allows",
    );
}

/// A source write in `rolled_back` that is not stamped as this migration's: a router still in
/// `revert_switch` carries the target's older image over it.
#[test]
fn an_unstamped_source_write_after_a_rollback_is_caught() {
    assert_caught(
        Broken::RolledBackWritesUnstamped,
        false,
        updates_and_deletes(),
        "allows",
    );
}

/// A delete in `rolled_back` that removes the source document before the seal: a router still
/// in `revert_switch` carries the target's image back over the gap.
#[test]
fn a_delete_without_a_source_tombstone_before_the_seal_is_caught() {
    assert_caught(
        Broken::RolledBackDeletesWithoutTombstone,
        false,
        updates_and_deletes(),
        "allows",
    );
}

/// The source's tombstone purge run before every router acknowledged the seal. The shortest
/// trace: a router not yet sealed deletes behind the purge, and its tombstone stays for good.
/// Past it (with the end check's tombstone rule lifted) the exploration also finds the loss the
/// seal prevents: a delete's source tombstone purged while a router is still in
/// `revert_switch`, whose read carries the target's image back over the gap.
#[test]
fn a_source_purge_before_the_seal_is_caught() {
    assert_caught(
        Broken::PurgeBeforeSeal,
        false,
        updates_and_deletes(),
        "the rollback ended with a tombstone",
    );
}

/// `routers forget` while the router's lease is live: it may only be cut off from the state
/// store and serves on the phase it loaded, while the driver, no longer waiting for it, moves
/// on past it.
#[test]
fn a_forget_before_the_lease_ran_out_is_caught() {
    assert_caught_with(
        Setup {
            broken: Some(Broken::ForgetBeforeDeadline),
            forgets: 1,
            ..Setup::new(updates_and_deletes())
        },
        "allows",
    );
}

/// Conditional operations (the application's filter beside the id) racing unconditional
/// writes, the copier, the cleaner and the revert copier in every phase: a conditional
/// update, delete or replace applies only while the document matches, a conditional read
/// returns it only then. The executor's find answers `Unmatched` for a live document the
/// condition does not match, in one atomic read, and the writes that act on a live document
/// carry the condition in their filter, so a write that made the document stop matching
/// between the find and the write wins.
#[test]
fn conditional_operations_apply_only_while_the_document_matches() {
    let report = assert_protocol_holds(Setup::new(conditional()));
    for event in [
        Event::Unmatched(Side::Target),
        Event::Unmatched(Side::Source),
        Event::ConditionFailedOnAWrite,
    ] {
        assert!(report.events.contains(&event), "{:?}", report.events);
    }
    assert_protocol_holds(Setup::new(conditional_upserts()));
    // A router cut off between a conditional write and its mirror, or mid-operation.
    assert_protocol_holds(Setup {
        expiries: 1,
        ..Setup::new(conditional())
    });
    if heavy() {
        assert_protocol_holds(Setup {
            transients: 1,
            ..Setup::new(conditional())
        });
        assert_protocol_holds(Setup {
            kills: 1,
            ..Setup::new(conditional())
        });
        assert_protocol_holds(Setup {
            expiries: 1,
            ..Setup::new(conditional_upserts())
        });
        for id in [0, 1] {
            assert_protocol_holds(Setup::new(with_shared(conditional(), id)));
        }
        assert_protocol_holds(Setup {
            batches: 2,
            transients: 1,
            ..Setup::new(conditional_short())
        });
    }
}

/// Upserts, with and without a condition: the update applies to the live document (copied
/// on write from the source), and only where no document holds the id is the insert made,
/// along the insert's path (over a tombstone, a duplicate where a document holds the id);
/// an insert that meets a document another upsert inserted tries the update once more.
#[test]
fn an_upsert_updates_or_inserts_once() {
    let report = assert_protocol_holds(Setup::new(upserts()));
    for event in [Event::UpsertRetried, Event::Unmatched(Side::Target)] {
        assert!(report.events.contains(&event), "{:?}", report.events);
    }
    assert_protocol_holds(Setup {
        expiries: 1,
        ..Setup::new(upserts())
    });
    if heavy() {
        assert_protocol_holds(Setup {
            kills: 1,
            ..Setup::new(upserts())
        });
        assert_protocol_holds(Setup {
            transients: 1,
            ..Setup::new(upserts())
        });
        for id in [0, 1] {
            assert_protocol_holds(Setup::new(with_shared(upserts(), id)));
        }
    }
}

/// A many-document read (the front's `find` with a filter) reads the phase's plan, each
/// document atomically, each read whole before the next, among everything else; every id is
/// answered by `query_answer` and is what a conditional read of the id returns at some instant
/// of the query: a source image a target document supersedes never appears, matching or
/// not, and a document copied meanwhile is never dropped.
///
/// `query_answer` refuses every read in `reverting` (its `Get` machine asks for the mirror
/// it sends before reporting there): the front fails them, and the model takes them for reads
/// that told nothing. Heavy: with the experiment `Setup::unmirrored_query_answers` (those
/// reads answered by the `Get` machine's outcome without the mirror), which the model finds
/// harmless.
#[test]
fn a_query_answers_each_id_as_a_read_of_it_would() {
    let report = assert_protocol_holds(Setup::new(queries()));
    for event in [
        Event::QueryLeftOutASupersededSourceMatch,
        Event::QueryFoundATargetDocumentAfterThePresenceCheck,
    ] {
        assert!(report.events.contains(&event), "{:?}", report.events);
    }
    let refused: Vec<Phase> = report
        .events
        .iter()
        .filter_map(|e| match e {
            Event::QueryRefused(phase) => Some(*phase),
            _ => None,
        })
        .collect();
    assert!(
        refused.iter().all(|&phase| phase == Phase::Reverting),
        "{refused:?}"
    );
    if !refused.is_empty() {
        report_line(&format!(
            "protocol model: query_answer refuses the many-document reads of {refused:?} (a \
             Get there mirrors before it reports): the front fails them"
        ));
    }
    assert_protocol_holds(Setup {
        expiries: 1,
        ..Setup::new(queries())
    });
    // The copier killed with its copies in flight, taken over, copying again under the query.
    assert_protocol_holds(Setup {
        kills: 1,
        ..Setup::new(queries())
    });
    if heavy() {
        // The copier's batches, one id each, in flight together under the query, one failing.
        assert_protocol_holds(Setup {
            batches: 2,
            transients: 1,
            ..Setup::new(queries())
        });
        for id in [0, 1] {
            assert_protocol_holds(Setup::new(with_shared(queries(), id)));
        }
        let unmirrored = assert_protocol_holds(Setup {
            expiries: 1,
            unmirrored_query_answers: true,
            ..Setup::new(queries())
        });
        assert!(!unmirrored
            .events
            .iter()
            .any(|e| matches!(e, Event::QueryRefused(_))));
    }
}

/// The executor leaves the condition out of the writes' filter: a conditional update of a
/// document that no longer matches applies anyway.
#[test]
fn a_condition_left_out_of_the_writes_is_caught() {
    assert_caught_with(
        Setup {
            broken: Some(Broken::ConditionLeftOutOfWrites),
            ..Setup::new(conditional())
        },
        "answered Changed(true), which no linearization of the history allows",
    );
}

/// The delete's tombstone sent without the condition: the delete's find sees the target's
/// copy match, an update makes it stop matching, and the tombstone replaces it anyway.
#[test]
fn a_condition_left_out_of_the_tombstone_is_caught() {
    assert_caught_with(
        Setup {
            broken: Some(Broken::ConditionLeftOutOfTheTombstone),
            ..Setup::new(conditional())
        },
        "allows",
    );
}

/// `Unmatched` in the target taken for `Absent`: a conditional read of a document the target
/// updated past the condition goes on to the source and returns its superseded image.
#[test]
fn an_unmatched_target_document_taken_for_absent_is_caught() {
    assert_caught_with(
        Setup {
            broken: Some(Broken::UnmatchedTargetAsAbsent),
            ..Setup::new(conditional())
        },
        "which no linearization of the history allows",
    );
}

/// The find as first designed, the condition checked by a second read: a write that makes
/// the document match lands between the reads, and the read returns the first read's
/// document, which does not match (before any migration, in `planned`).
#[test]
fn a_find_that_checks_the_condition_in_a_second_read_is_caught() {
    assert_caught_with(
        Setup {
            broken: Some(Broken::FindInTwoReads),
            ..Setup::new(conditional())
        },
        "answered Read(Some(11)), which no linearization of the history allows",
    );
}

/// The same, answering the second read's document: the conditional reads are right, but a
/// document deleted between the reads is taken for one that does not match, and a
/// conditional replace with upsert of an id nothing holds reports a duplicate.
#[test]
fn a_find_that_takes_a_deletion_between_its_reads_for_a_mismatch_is_caught() {
    let reads_right = Setup {
        broken: Some(Broken::FindInTwoReadsAnsweringTheSecond),
        ..Setup::new(conditional())
    };
    let report = explore(&reads_right);
    report_line(&summary(
        "FindInTwoReadsAnsweringTheSecond, reads only",
        &reads_right,
        &report,
    ));
    assert!(report.violation.is_none(), "{:?}", report.violation);
    assert_caught_with(
        Setup {
            broken: Some(Broken::FindInTwoReadsAnsweringTheSecond),
            ..Setup::new(conditional_upserts())
        },
        "answered Duplicate, which no linearization of the history allows",
    );
}

/// An upsert sent to the target as MongoDB's own: where the source alone holds the id, it
/// inserts a second document of the id, which supersedes the source's.
#[test]
fn an_upsert_without_the_insert_path_is_caught() {
    assert_caught_with(
        Setup {
            broken: Some(Broken::UpsertNative),
            ..Setup::new(upserts())
        },
        "answered Inserted, which no linearization of the history allows",
    );
}

/// An upsert that reports the duplicate without trying its update again: of two upserts of a
/// new id, the one whose insert meets the other's reports a duplicate.
#[test]
fn an_upsert_that_never_tries_again_is_caught() {
    assert_caught_with(
        Setup {
            broken: Some(Broken::UpsertNeverRetries),
            ..Setup::new(upserts())
        },
        "answered Duplicate, which no linearization of the history allows",
    );
}

/// A many-document read that reads the target's matches before the presence check: a
/// document copied to the target in between (here by an update's copy-on-write, not applied
/// yet) is in neither answer. The query's `None` for it is allowed only if the update
/// applied first, which the next read of the id, still the old value, contradicts.
#[test]
fn a_query_that_reads_the_target_before_the_presence_check_is_caught() {
    assert_caught_with(
        Setup {
            broken: Some(Broken::QueryTargetBeforePresence),
            ..Setup::new(queries())
        },
        "allows",
    );
}

/// A many-document read without the presence check: the source's image of a document the
/// target updated past the filter appears.
#[test]
fn a_query_without_the_presence_check_is_caught() {
    assert_caught_with(
        Setup {
            broken: Some(Broken::QueryWithoutPresenceCheck),
            ..Setup::new(queries())
        },
        "answered Some(1) for id 0",
    );
}
