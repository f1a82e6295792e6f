//! `reshard migration status`: where a migration stands and how fast it moves: the phase, the
//! task its workers run (backfill, full reconciliation, cleanup waves, revert) with its
//! progress, rate and ETA, the throttle, routers (acknowledged epoch, lease, p99), and what is
//! open (findings, dead letters, bypasses, shadow-read mismatches); once, or refreshed every
//! second with `--watch`. What it shows is gathered by [`crate::driver::status`]; this module
//! renders it.
//!
//! A partition's size is the planner's estimate (`approx_documents`), which may be missing (a
//! revert's partitions, or an estimate not made yet): a task whose total is not known shows
//! what is done and the rate, and no ETA, until it is.
//!
//! The JSON output's keys are snake_case with units in their names, one name per concept:
//! what MongoDB's `$currentOp` calls `approxDocumentsToCopy`, `documentsCopied` and
//! `remainingOperationTimeEstimatedSecs` are `approx_documents`, `documents_copied` and
//! `eta_secs` here, as in `progress` (`tests/vocabulary.rs`).

use std::collections::BTreeMap;
use std::io::IsTerminal;
use std::time::{Duration, Instant};

use indicatif::{MultiProgress, ProgressBar, ProgressStyle};

use crate::commands::Ctx;
use crate::driver::status::{snapshot, Snapshot, Wave};
use crate::error::{Error, Result};
use crate::estimate::TaskSize;
use crate::output::{self, not_negative};
use crate::store::partitions::Partition;
use crate::store::workers::WorkerRow;

pub async fn run(ctx: &Ctx, id: i64, watch: bool, with_partitions: bool) -> Result<()> {
    if watch {
        return watch_progress(ctx, id).await;
    }
    let (snap, partitions, workers) = snapshot(&ctx.store, id).await?;
    let mut value = snap.value.clone();
    if with_partitions || matches!(ctx.output, crate::cli::OutputFormat::Json) {
        value["partitions"] = serde_json::to_value(&partitions).unwrap_or_default();
    }
    output::emit(ctx.output, &value, || {
        print_text(&snap, &workers);
        if with_partitions {
            print_partitions(&partitions);
        }
    })
}

fn bypass_text(b: &serde_json::Value) -> String {
    let watches = b["watches"].as_array().map(Vec::len).unwrap_or(0);
    if watches == 0 {
        return "not watched (the driver starts watching when it leaves `planned`)".into();
    }
    let oldest = b["watches"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|w| {
            w["caught_up_at"]
                .as_str()
                .and_then(|t| chrono::DateTime::parse_from_rfc3339(t).ok())
        })
        .min();
    let caught_up = match oldest {
        Some(Some(t)) => {
            let ago = (chrono::Utc::now() - t.with_timezone(&chrono::Utc))
                .num_seconds()
                .max(0);
            format!("caught up {ago} s ago")
        }
        _ => "not caught up yet".into(),
    };
    format!(
        "{} open of {} ({watches} locations watched, {caught_up})",
        b["open"], b["total"]
    )
}

fn eta_text(eta: Option<f64>) -> String {
    match eta {
        Some(s) if s <= 0.0 => "done".into(),
        Some(s) => humantime(Duration::from_secs_f64(s)),
        None => "-".into(),
    }
}

/// The ETA of a task of `size` at `rate`, as shown: unknown when its total is.
fn eta_of(size: &TaskSize, rate: f64) -> String {
    match (size.total, size.eta(rate)) {
        (None, None) => "- (total unknown)".into(),
        (_, eta) => eta_text(eta),
    }
}

/// `1234 of ~5000 (24.7%)`, or `1234 (total unknown)`.
fn scanned_text(size: &TaskSize) -> String {
    match size.total {
        Some(total) if total > 0 => format!(
            "{} of ~{total} ({:.1}%)",
            size.scanned,
            100.0 * size.scanned as f64 / total as f64
        ),
        Some(_) => size.scanned.to_string(),
        None => format!("{} (total unknown)", size.scanned),
    }
}

fn humantime(d: Duration) -> String {
    let s = d.as_secs();
    match s {
        0..=59 => format!("{s}s"),
        60..=3599 => format!("{}m{:02}s", s / 60, s % 60),
        _ => format!("{}h{:02}m", s / 3600, (s % 3600) / 60),
    }
}

/// `in 9m58s` for a lease that runs, `expired 3s ago` for one that ran out.
fn lease_text(left_secs: f64) -> String {
    if left_secs >= 0.0 {
        format!("in {}", humantime(Duration::from_secs_f64(left_secs)))
    } else {
        format!(
            "expired {} ago",
            humantime(Duration::from_secs_f64(-left_secs))
        )
    }
}

/// `2 live (1 behind epoch 7, heartbeats within 1.2s), 1 lease expired`: the routers and
/// their leases in a phrase.
fn routers_text(v: &serde_json::Value) -> String {
    let routers = v["routers"].as_array().cloned().unwrap_or_default();
    let live: Vec<&serde_json::Value> = routers.iter().filter(|r| r["live"] == true).collect();
    let behind = live.iter().filter(|r| r["behind"] == true).count();
    let expired = routers.len() - live.len();
    let oldest = live
        .iter()
        .filter_map(|r| r["lease_age_secs"].as_f64())
        .fold(None, |m: Option<f64>, x| Some(m.map_or(x, |m| m.max(x))));
    let mut text = format!("{} live", live.len());
    if !live.is_empty() {
        text.push_str(&format!(
            " ({behind} behind epoch {}, heartbeats within {:.1}s)",
            v["epoch"],
            oldest.unwrap_or(0.0)
        ));
    }
    if expired > 0 {
        text.push_str(&format!(", {expired} with an expired lease"));
    }
    text
}

/// The worst p99 the live routers reported.
fn worst_p99(v: &serde_json::Value) -> Option<f64> {
    v["routers"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|r| r["live"] == true)
        .filter_map(|r| r["p99_ms"].as_f64())
        .fold(None, |m: Option<f64>, x| Some(m.map_or(x, |m| m.max(x))))
}

fn print_text(snap: &Snapshot, workers: &[WorkerRow]) {
    let v = &snap.value;
    let b = &v["backfill"];
    let t = &v["throttle"];
    let mut fields = vec![
        (
            "migration",
            format!(
                "{} ({} v{} -> v{})",
                v["migration_id"],
                v["collection"].as_str().unwrap_or(""),
                v["from_version"],
                v["to_version"]
            ),
        ),
        ("state", v["state"].as_str().unwrap_or("").to_owned()),
        ("epoch", v["epoch"].to_string()),
    ];
    if let Some((task, size)) = &snap.active {
        fields.push((
            "task",
            format!(
                "{task}: {} documents, {}/{} partitions",
                scanned_text(size),
                size.done,
                size.partitions
            ),
        ));
        fields.push(("docs/s", format!("{:.0}", snap.docs_per_sec)));
        fields.push(("eta", eta_of(size, snap.docs_per_sec)));
    }
    fields.extend([
        (
            "partitions",
            if b["planned"].as_bool() == Some(true) {
                format!(
                    "{} done, {} leased, of {}",
                    snap.totals.done, snap.totals.leased, snap.totals.partitions
                )
            } else {
                match v["phase"].as_str().unwrap_or("") {
                    "planned" | "dual_read" | "write_switch" | "new_writes" | "backfill" => {
                        "not planned yet (a worker plans when the migration is in backfill)".into()
                    }
                    _ => "none (no backfill was planned in this migration)".into(),
                }
            },
        ),
        ("scanned", scanned_text(&snap.backfill)),
        (
            "copied / present / stamped / dead",
            format!(
                "{} / {} / {} / {}",
                snap.totals.inserted,
                snap.totals.already_present,
                snap.totals.stamped,
                snap.totals.dead_lettered
            ),
        ),
        (
            "open findings / dead letters / bypasses",
            format!(
                "{} / {} / {}",
                v["findings_open"], b["dead_letters_open"], v["bypasses"]["open"]
            ),
        ),
        (
            "rate (applied / configured)",
            format!(
                "{:.0} / {:.0} docs/s",
                not_negative(t["applied_docs_per_sec"].as_f64().unwrap_or(0.0)),
                t["max_docs_per_sec"].as_f64().unwrap_or(0.0)
            ),
        ),
        (
            "overloads / retries / rate cuts",
            format!("{} / {} / {}", t["overloads"], t["retries"], t["rate_cuts"]),
        ),
        ("capacity signals", t["capacity_signals"].to_string()),
        ("bypasses", bypass_text(&v["bypasses"])),
        (
            "routers",
            format!(
                "{}{}",
                routers_text(v),
                worst_p99(v).map_or(String::new(), |p| format!(", worst p99 {p:.1} ms"))
            ),
        ),
    ]);
    for p in v["stalled_partitions"].as_array().into_iter().flatten() {
        fields.push((
            "stalled",
            format!(
                "partition {} ({} at {}): {} attempts in a row recorded nothing ({} timed out, \
                 batches of at most {}); last: {}",
                p["partition"],
                p["task"].as_str().unwrap_or(""),
                p["location"].as_str().unwrap_or(""),
                p["stalls"],
                p["timeouts"],
                p["batch_limit"]
                    .as_i64()
                    .map_or("the configured size".to_owned(), |l| l.to_string()),
                p["last_failure"]
                    .as_str()
                    .unwrap_or("its holder's lease ran out"),
            ),
        ));
    }
    output::fields(&fields);
    let sh = &v["shadow_reads"];
    let compared = sh["reads_compared"].as_i64().unwrap_or(0);
    let percent = sh["shadow_read_percent"].as_f64().unwrap_or(0.0);
    if percent > 0.0 || compared > 0 || sh["open_mismatches"].as_i64().unwrap_or(0) > 0 {
        output::fields(&[(
            "shadow reads",
            format!(
                "{percent}% of reads; {compared} compared, {} mismatches ({} documents open, {} \
                 resolved)",
                sh["mismatches"], sh["open_mismatches"], sh["resolved_mismatches"]
            ),
        )]);
    }
    if let Some(open) = sh["open"].as_array().filter(|o| !o.is_empty()) {
        output::table(
            &[
                "shadow mismatch _id",
                "source",
                "target",
                "fields",
                "reads",
                "last seen",
            ],
            open.iter().map(|m| {
                [
                    m["_id"].as_str().unwrap_or("").to_owned(),
                    m["source_location"].as_str().unwrap_or("").to_owned(),
                    m["target_location"].as_str().unwrap_or("").to_owned(),
                    m["fields"]
                        .as_array()
                        .map(|f| {
                            f.iter()
                                .filter_map(|x| x.as_str())
                                .collect::<Vec<_>>()
                                .join(", ")
                        })
                        .unwrap_or_default(),
                    m["reports"].to_string(),
                    m["last_seen_at"].as_str().unwrap_or("").to_owned(),
                ]
            }),
        );
    }
    let c = &v["cleanup"];
    if c["partitions"].as_i64().unwrap_or(0) > 0 {
        let wave = c["wave"]
            .as_object()
            .map(|w| {
                let wave = Wave {
                    number: w["number"].as_u64().unwrap_or(0) as usize,
                    of: w["of"].as_u64().unwrap_or(0) as usize,
                    percent: w["percent"].as_f64().unwrap_or(0.0),
                    done: w["done"] == true,
                };
                format!("{}: ", wave.text())
            })
            .unwrap_or_default();
        output::fields(&[(
            "cleanup",
            format!(
                "{wave}{}/{} partitions, {} deleted, {} kept (never moved)",
                c["partitions_done"], c["partitions"], c["documents_deleted"], c["documents_kept"]
            ),
        )]);
    }
    let r = &v["revert"];
    if r["partitions"].as_i64().unwrap_or(0) > 0 {
        output::fields(&[(
            "revert copy",
            format!(
                "{}/{} partitions, {} written back, {} already in the source",
                r["partitions_done"],
                r["partitions"],
                r["documents_written_back"],
                r["documents_already_in_source"]
            ),
        )]);
    }
    if !snap.shards.is_empty() {
        output::table(
            &[
                "source",
                "scan",
                "partitions",
                "scanned",
                "~total",
                "copied",
                "present",
                "stamped",
                "dead",
            ],
            snap.shards.iter().map(|s| {
                [
                    format!("{}/{}", s.source_shard, s.source_collection),
                    s.scan.clone(),
                    format!("{}/{}", s.partitions_done, s.partitions),
                    s.documents_scanned.to_string(),
                    output::or_dash(s.approx_documents),
                    s.documents_copied.to_string(),
                    s.documents_already_present.to_string(),
                    s.documents_stamped.to_string(),
                    s.documents_dead_lettered.to_string(),
                ]
            }),
        );
    }
    if let Some(routers) = v["routers"].as_array().filter(|r| !r.is_empty()) {
        output::table(
            &[
                "router", "host", "pid", "epoch", "lease", "p99 ms", "errors",
            ],
            routers.iter().map(|r| {
                [
                    r["name"].as_str().unwrap_or("").to_owned(),
                    r["host"].as_str().unwrap_or("").to_owned(),
                    r["pid"].to_string(),
                    match r["acknowledged_epoch"].as_i64() {
                        Some(e) if r["behind"] == false => format!("{e} (current)"),
                        Some(e) => format!("{e} (behind {})", v["epoch"]),
                        None => format!("- (behind {})", v["epoch"]),
                    },
                    lease_text(r["lease_left_secs"].as_f64().unwrap_or(0.0)),
                    r["p99_ms"]
                        .as_f64()
                        .map_or_else(|| "-".to_owned(), |p| format!("{p:.1}")),
                    r["errors"]
                        .as_u64()
                        .map_or_else(|| "-".to_owned(), |e| e.to_string()),
                ]
            }),
        );
    }
    let live: Vec<_> = workers.iter().filter(|w| w.live).collect();
    if !live.is_empty() {
        output::table(
            &[
                "worker",
                "host",
                "pid",
                "docs/s",
                "applied docs/s",
                "overloads",
                "retries",
            ],
            live.iter().map(|w| {
                [
                    w.name.clone(),
                    w.host.clone(),
                    w.pid.to_string(),
                    format!("{:.0}", not_negative(w.docs_per_sec)),
                    format!("{:.0}", not_negative(w.applied_docs_per_sec)),
                    w.overloads.to_string(),
                    w.retries.to_string(),
                ]
            }),
        );
    }
}

fn print_partitions(partitions: &[Partition]) {
    output::table(
        &[
            "id", "source", "_id type", "state", "owner", "scanned", "copied", "present",
            "stamped", "dead", "attempts",
        ],
        partitions.iter().map(|p| {
            [
                p.id.to_string(),
                format!("{}/{}", p.source_shard, p.source_collection),
                p.id_type.clone(),
                format!("{:?}", p.state).to_lowercase(),
                output::or_dash(p.lease_owner.clone()),
                p.scanned.to_string(),
                p.inserted.to_string(),
                p.already_present.to_string(),
                p.stamped.to_string(),
                p.dead_lettered.to_string(),
                p.attempts.to_string(),
            ]
        }),
    );
}

/// What the watch follows from one refresh to the next: the task shown and its rate.
#[derive(Default)]
struct Follow {
    task: Option<String>,
    last: Option<(Instant, i64)>,
}

/// One refresh of the watch: the task the phase runs (or the last one shown), its size and
/// its rate.
struct Refresh {
    task: String,
    /// Whether the task changed since the last refresh (new bars).
    new_task: bool,
    size: TaskSize,
    rate: f64,
}

impl Follow {
    fn refresh(&mut self, snap: &Snapshot) -> Refresh {
        let v = &snap.value;
        let task = v["active_task"]
            .as_str()
            .map(str::to_owned)
            .or_else(|| self.task.clone())
            .unwrap_or_else(|| "backfill".to_owned());
        let new_task = self.task.as_deref() != Some(task.as_str());
        if new_task {
            self.task = Some(task.clone());
            self.last = None;
        }
        let t = &v["tasks"][task.as_str()];
        let size = TaskSize {
            partitions: t["partitions"].as_i64().unwrap_or(0),
            done: t["partitions_done"].as_i64().unwrap_or(0),
            scanned: t["documents_scanned"].as_i64().unwrap_or(0),
            total: t["approx_documents"].as_i64(),
        };
        // docs/s from what the task checkpointed since the last refresh (every task), or the
        // workers' reports for the backfill.
        let now = Instant::now();
        let rate = match self.last {
            Some((at, before)) if task != "backfill" => {
                (size.scanned - before).max(0) as f64
                    / now.duration_since(at).as_secs_f64().max(0.1)
            }
            _ => snap.docs_per_sec,
        };
        self.last = Some((now, size.scanned));
        Refresh {
            task,
            new_task,
            size,
            rate,
        }
    }
}

/// The one status screen, refreshed every second until the migration ends (or Ctrl-C): bars
/// for the task the phase runs (backfill, full reconciliation, cleanup waves, revert) per
/// source location and overall, with docs/s and ETA; below them the throttle, routers, dead
/// letters, findings and bypasses. Without a terminal, a plain line per refresh. With
/// `--output json`: one JSON object per refresh, one per line (NDJSON), the same object
/// `status --output json` prints.
async fn watch_progress(ctx: &Ctx, id: i64) -> Result<()> {
    if matches!(ctx.output, crate::cli::OutputFormat::Json) {
        return watch_lines(ctx, id, |snap, _| output::json_line(&snap.value)).await;
    }
    if !std::io::stdout().is_terminal() {
        // Bars need a terminal; a log or a pipe gets what they would show, a line at a time.
        return watch_lines(ctx, id, |snap, r| Ok(plain_line(snap, r))).await;
    }
    let multi = MultiProgress::new();
    let style = ProgressStyle::with_template("{prefix:>28} [{bar:36}] {pos}/{len} {msg}")
        .map_err(|e| Error::failed(e.to_string()))?
        .progress_chars("=> ");
    // Without a total there is no bar to fill: the documents done and the rest of the line.
    let no_total = ProgressStyle::with_template("{prefix:>28} {pos} documents {msg}")
        .map_err(|e| Error::failed(e.to_string()))?;
    let overall = multi.add(ProgressBar::new(0).with_style(style.clone()));
    let facts = multi.add(ProgressBar::new_spinner());
    let mut bars: BTreeMap<String, ProgressBar> = BTreeMap::new();
    let mut follow = Follow::default();
    loop {
        let (snap, _, _) = snapshot(&ctx.store, id).await?;
        let v = &snap.value;
        let r = follow.refresh(&snap);
        if r.new_task {
            for bar in std::mem::take(&mut bars).into_values() {
                bar.finish_and_clear();
                multi.remove(&bar);
            }
            overall.reset();
        }
        let t = &v["tasks"][r.task.as_str()];
        let shape = |bar: &ProgressBar, size: &TaskSize| match size.total {
            Some(total) => {
                bar.set_style(style.clone());
                bar.set_length(total.max(size.scanned) as u64);
            }
            None => bar.set_style(no_total.clone()),
        };
        overall.set_prefix(format!("{} (all)", r.task));
        shape(&overall, &r.size);
        overall.set_position(r.size.scanned as u64);
        overall.set_message(format!(
            "{:.0} docs/s, eta {}, {}/{} partitions, {}",
            r.rate,
            eta_of(&r.size, r.rate),
            r.size.done,
            r.size.partitions,
            v["state"].as_str().unwrap_or("")
        ));
        for shard in t["shards"].as_array().into_iter().flatten() {
            let key = shard["location"].as_str().unwrap_or("").to_owned();
            let bar = bars.entry(key.clone()).or_insert_with(|| {
                multi.insert_before(
                    &facts,
                    ProgressBar::new(0)
                        .with_style(style.clone())
                        .with_prefix(key),
                )
            });
            let size = TaskSize {
                partitions: shard["partitions"].as_i64().unwrap_or(0),
                done: shard["partitions_done"].as_i64().unwrap_or(0),
                scanned: shard["documents_scanned"].as_i64().unwrap_or(0),
                total: shard["approx_documents"].as_i64(),
            };
            shape(bar, &size);
            bar.set_position(size.scanned as u64);
            bar.set_message(format!(
                "{}/{} partitions, {}",
                size.done,
                size.partitions,
                size.left()
                    .map_or("total unknown".to_owned(), |left| format!("{left} left"))
            ));
        }
        facts.set_message(facts_line(v));
        facts.tick();
        if snap.phase.is_terminal() {
            overall.finish();
            for bar in bars.values() {
                bar.finish();
            }
            facts.finish();
            return Ok(());
        }
        tokio::select! {
            _ = tokio::time::sleep(Duration::from_secs(1)) => {}
            _ = tokio::signal::ctrl_c() => return Ok(()),
        }
    }
}

/// The watch as lines on stdout, one per refresh (`line` makes it), until the migration ends,
/// Ctrl-C, or the reader goes away.
async fn watch_lines(
    ctx: &Ctx,
    id: i64,
    line: impl Fn(&Snapshot, &Refresh) -> Result<String>,
) -> Result<()> {
    let mut follow = Follow::default();
    loop {
        let (snap, _, _) = snapshot(&ctx.store, id).await?;
        let refresh = follow.refresh(&snap);
        let text = line(&snap, &refresh)?;
        {
            use std::io::Write;
            let mut out = std::io::stdout().lock();
            if writeln!(out, "{text}").and_then(|_| out.flush()).is_err() {
                // The reader went away (a closed pipe): nothing more to say.
                return Ok(());
            }
        }
        if snap.phase.is_terminal() {
            return Ok(());
        }
        tokio::select! {
            _ = tokio::time::sleep(Duration::from_secs(1)) => {}
            _ = tokio::signal::ctrl_c() => return Ok(()),
        }
    }
}

/// `12:00:01 backfill: 1234 of ~5000 (24.7%) documents, 300 docs/s, eta 12s, 2/8 partitions,
/// backfill | rate ...`: what the bars show, as one line.
fn plain_line(snap: &Snapshot, r: &Refresh) -> String {
    let v = &snap.value;
    format!(
        "{} {}: {} documents, {:.0} docs/s, eta {}, {}/{} partitions, {} | {}",
        chrono::Utc::now().format("%H:%M:%S"),
        r.task,
        scanned_text(&r.size),
        r.rate,
        eta_of(&r.size, r.rate),
        r.size.done,
        r.size.partitions,
        v["state"].as_str().unwrap_or(""),
        facts_line(v)
    )
}

/// The line under the bars: throttle, routers and their leases, dead letters, findings,
/// bypasses.
fn facts_line(v: &serde_json::Value) -> String {
    let t = &v["throttle"];
    format!(
        "rate {:.0}/{:.0} docs/s | routers {}, p99 {} | dead letters {} | findings {} | bypasses {}",
        not_negative(t["applied_docs_per_sec"].as_f64().unwrap_or(0.0)),
        t["max_docs_per_sec"].as_f64().unwrap_or(0.0),
        routers_text(v),
        worst_p99(v).map_or("-".to_owned(), |p| format!("{p:.1} ms")),
        v["backfill"]["dead_letters_open"],
        v["findings_open"],
        v["bypasses"]["open"],
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::estimate::PartitionSize;
    use serde_json::json;

    fn part(done: bool, scanned: i64, approx: Option<i64>) -> PartitionSize {
        PartitionSize {
            done,
            scanned,
            approx,
        }
    }

    #[test]
    fn a_task_without_a_total_says_so_rather_than_done() {
        let size = TaskSize::of([part(true, 40, None), part(false, 25, None)]);
        assert_eq!(eta_of(&size, 100.0), "- (total unknown)");
        assert_eq!(scanned_text(&size), "65 (total unknown)");
        let size = TaskSize::of([part(true, 40, Some(60)), part(false, 25, Some(100))]);
        assert_eq!(scanned_text(&size), "65 of ~140 (46.4%)");
        assert_eq!(eta_of(&size, 25.0), "3s");
        assert_eq!(eta_of(&TaskSize::of([part(true, 2, None)]), 0.0), "done");
    }

    #[test]
    fn leases_read_as_time_left_or_since() {
        assert_eq!(lease_text(598.0), "in 9m58s");
        assert_eq!(lease_text(-3.2), "expired 3s ago");
    }

    #[test]
    fn the_routers_phrase_counts_lease_states() {
        let v = json!({
            "epoch": 7,
            "routers": [
                {"live": true, "behind": false, "lease_age_secs": 0.4, "p99_ms": 2.0},
                {"live": true, "behind": true, "lease_age_secs": 1.2, "p99_ms": 9.5},
                {"live": false, "behind": true, "lease_age_secs": 900.0, "p99_ms": 50.0},
            ],
        });
        assert_eq!(
            routers_text(&v),
            "2 live (1 behind epoch 7, heartbeats within 1.2s), 1 with an expired lease"
        );
        assert_eq!(worst_p99(&v), Some(9.5));
        assert_eq!(routers_text(&json!({"epoch": 1, "routers": []})), "0 live");
    }
}
