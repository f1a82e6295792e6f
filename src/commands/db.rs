//! `reshard db`: the state store's schema.

use serde::Serialize;

use crate::cli::{DbCommand, OutputFormat};
use crate::error::Result;
use crate::output;
use crate::store::{Store, MIGRATOR};

#[derive(Serialize)]
struct SchemaMigration {
    version: i64,
    description: String,
    applied: bool,
}

pub async fn run(url: &str, format: OutputFormat, cmd: DbCommand) -> Result<()> {
    let store = Store::connect_unchecked(url).await?;
    match cmd {
        DbCommand::Migrate { dry_run: true } => {
            let applied = store.applied_versions().await?;
            let pending: Vec<SchemaMigration> = MIGRATOR
                .iter()
                .filter(|m| !applied.contains(&m.version))
                .map(|m| SchemaMigration {
                    version: m.version,
                    description: m.description.to_string(),
                    applied: false,
                })
                .collect();
            let value = serde_json::json!({
                "database": store.url().to_string(),
                "would_apply": pending.iter().map(|m| m.version).collect::<Vec<_>>(),
                "dry_run": true,
            });
            output::emit(format, &value, || {
                if pending.is_empty() {
                    println!(
                        "dry run: {}: schema is up to date; nothing to apply",
                        store.url()
                    );
                    return;
                }
                println!(
                    "dry run: would apply {} migration(s) to {}; nothing changed",
                    pending.len(),
                    store.url()
                );
                for m in &pending {
                    println!("  {} {}", m.version, m.description);
                }
            })
        }
        DbCommand::Migrate { dry_run: false } => {
            let applied = store.migrate().await?;
            let value =
                serde_json::json!({ "database": store.url().to_string(), "applied": applied });
            output::emit(format, &value, || {
                if applied.is_empty() {
                    println!("{}: schema is up to date", store.url());
                } else {
                    println!("{}: applied {} migration(s)", store.url(), applied.len());
                }
            })
        }
        DbCommand::Status => {
            let applied = store.applied_versions().await?;
            let rows: Vec<SchemaMigration> = MIGRATOR
                .iter()
                .map(|m| SchemaMigration {
                    version: m.version,
                    description: m.description.to_string(),
                    applied: applied.contains(&m.version),
                })
                .collect();
            output::emit(format, &rows, || {
                output::table(
                    &["version", "description", "applied"],
                    rows.iter().map(|r| {
                        [
                            r.version.to_string(),
                            r.description.clone(),
                            if r.applied { "yes" } else { "no" }.to_owned(),
                        ]
                    }),
                )
            })
        }
    }
}
