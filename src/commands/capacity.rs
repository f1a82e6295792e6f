//! The capacity planner's report on the terminal: per-shard tables and write-load bars.

use crate::capacity::Report;
use crate::output;

fn human_bytes(b: u64) -> String {
    const UNITS: [&str; 5] = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut v = b as f64;
    let mut u = 0;
    while v >= 1024.0 && u < UNITS.len() - 1 {
        v /= 1024.0;
        u += 1;
    }
    format!("{v:.1} {}", UNITS[u])
}

/// A bar of `value` out of `max`, 40 cells wide.
fn bar(value: f64, max: f64) -> String {
    let cells = if max > 0.0 {
        ((value / max) * 40.0).round() as usize
    } else {
        0
    };
    "█".repeat(cells.min(40))
}

/// The report; the tenant table shows the hottest [`output::TOP_ROWS`] unless `all`.
pub fn print(r: &Report, all: bool) {
    println!(
        "moves {} documents ({}), {} stay; the copy takes about {:.0}s at {:.0} docs/s",
        r.documents_moving,
        human_bytes(r.bytes_moving),
        r.documents_staying,
        r.copy_seconds,
        r.max_docs_per_sec
    );
    output::table(
        &[
            "shard",
            "docs before",
            "docs after",
            "moving out",
            "moving in",
            "bytes after",
            "writes/s before",
            "writes/s after",
        ],
        r.shards.iter().map(|s| {
            [
                s.shard.clone(),
                s.documents_before.to_string(),
                s.documents_after.to_string(),
                s.moving_out.to_string(),
                s.moving_in.to_string(),
                human_bytes(s.bytes_after),
                format!("{:.0}", s.writes_before),
                format!("{:.0}", s.writes_after),
            ]
        }),
    );
    let max = r
        .shards
        .iter()
        .map(|s| s.writes_before.max(s.writes_after))
        .fold(0.0, f64::max);
    if max > 0.0 {
        println!(
            "\nwrite load per shard (limit {:.0}/s):",
            r.per_shard_write_limit
        );
        for s in &r.shards {
            println!(
                "  {:<10} before {:>7.0} {}",
                s.shard,
                s.writes_before,
                bar(s.writes_before, max)
            );
            println!(
                "  {:<10} after  {:>7.0} {}",
                "",
                s.writes_after,
                bar(s.writes_after, max)
            );
        }
    }
    if !r.tenants.is_empty() {
        println!(
            "\nbuckets per tenant: ceil(peak x (1 + {}) / {:.0})",
            r.headroom, r.per_shard_write_limit
        );
        output::table_top(
            &[
                "tenant",
                "writes/s",
                "from",
                "buckets now",
                "in target",
                "recommended",
            ],
            r.tenants.iter().map(|t| {
                [
                    t.tenant.clone(),
                    format!("{:.0}", t.writes_per_sec),
                    format!("{:?}", t.source).to_lowercase(),
                    t.buckets_now.to_string(),
                    t.buckets_in_target.to_string(),
                    t.recommended_buckets.to_string(),
                ]
            }),
            all,
            "tenants",
        );
    }
    let v = &r.limit;
    if v.within_limit {
        if v.writes_per_sec > 0.0 {
            let hottest = r
                .shards
                .iter()
                .max_by(|a, b| a.writes_after.total_cmp(&b.writes_after));
            if let Some(h) = hottest {
                println!(
                    "\nevery shard stays within {:.0} writes/s after the migration (the hottest, {}, takes {:.0}/s)",
                    r.per_shard_write_limit, h.shard, h.writes_after
                );
            }
        }
    } else {
        let over: Vec<String> = r
            .shards
            .iter()
            .filter(|s| r.over_limit_after.contains(&s.shard))
            .map(|s| format!("{} ({:.0}/s)", s.shard, s.writes_after))
            .collect();
        println!(
            "\nover the per-shard limit of {:.0} writes/s after the migration: {}",
            r.per_shard_write_limit,
            over.join(", ")
        );
        for line in &v.advice {
            println!("  {line}");
        }
    }
}
