//! Whether a playbook may run, against what the store holds: a new playbook is checked and
//! its migration created; a known one must name the same migration, and an edit of a step
//! already done is refused with a diff (later steps and settings may change, and are logged).

use crate::driver::Driver;
use crate::error::{Error, Result};
use crate::routing::RoutingVersion;
use crate::spec::playbook::{Playbook, Source};
use crate::store::migrations::Migration;
use crate::store::playbooks::NewPlaybook;
use crate::store::StoreError;

/// A migration that exists must be the playbook's: same collection and versions.
pub(super) async fn check_identity(driver: &Driver, pb: &Playbook, m: &Migration) -> Result<()> {
    let (from, to) = driver.store.migration_versions(m).await?;
    let source_same = match &pb.source {
        Source::Version(v) => *v == m.from_version,
        Source::Spec(spec) => spec.same_layout(&from),
    };
    if m.collection != pb.doc.collection || !source_same || !pb.target.same_layout(&to) {
        return Err(Error::bad_input(format!(
            "playbook {:?} drives migration {} of {} (v{} -> v{}), which this playbook no \
             longer describes: its collection, source or target changed. A migration that has \
             started keeps its versions; give the changed playbook a new name to plan a new \
             migration once this one has ended",
            pb.doc.name, m.id, m.collection, m.from_version, m.to_version
        )));
    }
    Ok(())
}

/// Edits against the pinned content: refused for steps already done (with a diff), accepted
/// and logged for the rest.
pub(super) async fn check_edits(
    driver: &Driver,
    pb: &Playbook,
    row: &crate::store::playbooks::PlaybookRow,
    content: &serde_json::Value,
    dry_run: bool,
) -> Result<()> {
    // Content pinned before a step option was renamed reads with today's names: the same
    // file is not an edit.
    let pinned_content = crate::spec::playbook::with_current_names(&row.content);
    if &pinned_content == content {
        return Ok(());
    }
    let steps = driver.store.playbook_steps(&pb.doc.name).await?;
    let pinned: Vec<serde_json::Value> = pinned_content["steps"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    let now: Vec<serde_json::Value> = content["steps"].as_array().cloned().unwrap_or_default();
    for s in steps.iter().filter(|s| s.finished_at.is_some()) {
        let i = s.position as usize;
        if pinned.get(i) != now.get(i) {
            return Err(Error::bad_input(format!(
                "playbook {:?}: step {} ({:?}) is done, and this playbook changes it; a step \
                 that ran cannot be edited (revert the edit, or start a new playbook):\n{}",
                pb.doc.name,
                i + 1,
                s.name,
                diff(&pretty(pinned.get(i)), &pretty(now.get(i)))
            )));
        }
    }
    let described = diff(&pretty(Some(&pinned_content)), &pretty(Some(content)));
    if !dry_run {
        driver
            .store
            .update_playbook(&pb.doc.name, content, &described, &driver.actor)
            .await?;
        driver
            .store
            .update_settings(
                row.migration_id,
                |s| *s = pb.settings,
                &driver.actor,
                Some("playbook edited"),
            )
            .await?;
    }
    driver
        .progress()
        .note(&format!("playbook edited since the last run:\n{described}"));
    Ok(())
}

pub(super) fn pretty(value: Option<&serde_json::Value>) -> String {
    match value {
        Some(v) => serde_json::to_string_pretty(v).unwrap_or_default(),
        None => "(none)".into(),
    }
}

/// A line diff: `-` for lines only in `a`, `+` for lines only in `b`, two lines of context.
pub fn diff(a: &str, b: &str) -> String {
    let a: Vec<&str> = a.lines().collect();
    let b: Vec<&str> = b.lines().collect();
    // Longest common subsequence, small inputs.
    let mut lcs = vec![vec![0usize; b.len() + 1]; a.len() + 1];
    for i in (0..a.len()).rev() {
        for j in (0..b.len()).rev() {
            lcs[i][j] = if a[i] == b[j] {
                lcs[i + 1][j + 1] + 1
            } else {
                lcs[i + 1][j].max(lcs[i][j + 1])
            };
        }
    }
    let mut lines: Vec<(char, &str)> = Vec::new();
    let (mut i, mut j) = (0, 0);
    while i < a.len() || j < b.len() {
        if i < a.len() && j < b.len() && a[i] == b[j] {
            lines.push((' ', a[i]));
            i += 1;
            j += 1;
        } else if j < b.len() && (i == a.len() || lcs[i][j + 1] > lcs[i + 1][j]) {
            lines.push(('+', b[j]));
            j += 1;
        } else {
            lines.push(('-', a[i]));
            i += 1;
        }
    }
    let changed: Vec<usize> = lines
        .iter()
        .enumerate()
        .filter(|(_, (k, _))| *k != ' ')
        .map(|(n, _)| n)
        .collect();
    let near = |n: usize| changed.iter().any(|c| c.abs_diff(n) <= 2);
    let mut out = String::new();
    let mut skipped = false;
    for (n, (kind, line)) in lines.iter().enumerate() {
        if near(n) {
            out.push_str(&format!("{kind} {line}\n"));
            skipped = false;
        } else if !skipped {
            out.push_str("  ...\n");
            skipped = true;
        }
    }
    out
}

/// Before a new playbook creates anything: its shards must not clash with registered ones,
/// and its versions must be valid against the shards there will be. Nothing is written.
pub(super) async fn check_new(driver: &Driver, pb: &Playbook) -> Result<()> {
    let registered = driver.store.shards().await?;
    let mut names: std::collections::BTreeSet<String> =
        registered.iter().map(|s| s.name.clone()).collect();
    for s in &pb.doc.shards {
        if let Some(r) = registered.iter().find(|r| r.name == s.name) {
            if r.uri.expose() != s.uri || r.database != s.database {
                return Err(Error::bad_input(format!(
                    "shard {:?} is registered as {} (database {:?}); the playbook says {} \
                     (database {:?}); use another name or change the playbook",
                    s.name,
                    r.uri,
                    r.database,
                    crate::redact::Redacted::new(&s.uri),
                    s.database
                )));
            }
        } else {
            crate::shards::resolve_uri(&s.uri).map_err(|e| Error::bad_input(e.to_string()))?;
        }
        names.insert(s.name.clone());
    }
    let ctx = driver.store.version_context(&pb.doc.collection).await?;
    let check = |v: &RoutingVersion, what: &str| -> Result<()> {
        let context = crate::routing::ValidationContext {
            registered_shards: &names,
            previous_virtual_buckets: ctx.previous_virtual_buckets,
        };
        v.validate(&context).map_err(|errors| {
            Error::bad_input(
                errors
                    .iter()
                    .map(|e| {
                        format!(
                            "playbook {:?}: {what}.{}: {}",
                            pb.doc.name, e.path, e.message
                        )
                    })
                    .collect::<Vec<_>>()
                    .join("\n"),
            )
        })
    };
    if let Source::Spec(v) = &pb.source {
        check(v, "source.spec")?;
    } else if let Source::Version(n) = &pb.source {
        driver.store.version(&pb.doc.collection, Some(*n)).await?;
    }
    check(&pb.target, "target")
}

/// Registers what the playbook declares and the store lacks, then creates its migration.
pub(super) async fn create(
    driver: &Driver,
    pb: &Playbook,
    content: &serde_json::Value,
) -> Result<Migration> {
    for s in &pb.doc.shards {
        match driver.store.add_shard(&s.name, &s.uri, &s.database).await {
            Ok(_) => {}
            // Registered since the check (or by an earlier, killed run): the same one.
            Err(StoreError::Conflict(_)) => {}
            Err(e) => return Err(e.into()),
        }
    }
    let from = match &pb.source {
        Source::Version(n) => *n,
        Source::Spec(v) => {
            let spec = pb
                .doc
                .source
                .spec
                .as_ref()
                .expect("a spec source has its spec");
            version_number(driver, v, &crate::spec::spec_text(spec)).await?
        }
    };
    let to = version_number(driver, &pb.target, &crate::spec::spec_text(&pb.doc.target)).await?;
    let m = driver
        .store
        .create_playbook_migration(
            &NewPlaybook {
                name: &pb.doc.name,
                collection: &pb.doc.collection,
                from_version: from,
                to_version: to,
                content,
                settings: &pb.settings,
            },
            &driver.actor,
        )
        .await?;
    driver.progress().note(&format!(
        "playbook {:?} planned migration {} of {}: v{from} -> v{to}",
        pb.doc.name, m.id, m.collection
    ));
    Ok(m)
}

/// The number of the collection's version with this layout, registered if none has it.
pub(super) async fn version_number(driver: &Driver, v: &RoutingVersion, text: &str) -> Result<i32> {
    for stored in driver.store.versions(Some(&v.collection)).await? {
        if stored.version.same_layout(v) {
            return Ok(stored.version.version);
        }
    }
    Ok(driver
        .store
        .insert_version(v, text, &driver.actor)
        .await?
        .version
        .version)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn diffs_show_what_changed_with_context() {
        let d = diff("a\nb\nc\nd\ne\nf\ng", "a\nb\nc\nX\ne\nf\ng");
        assert!(d.contains("- d\n+ X\n"), "{d}");
        assert!(d.contains("  c\n"), "{d}");
        assert_eq!(diff("same", "same"), "  ...\n");
    }
}
