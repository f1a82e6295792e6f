//! `reshard shard`: registered MongoDB locations.

use crate::cli::ShardCommand;
use crate::commands::Ctx;
use crate::error::{Error, Result};
use crate::{output, shards as mongo};

pub async fn run(ctx: &Ctx, cmd: ShardCommand) -> Result<()> {
    match cmd {
        ShardCommand::Add {
            name,
            uri,
            uri_file,
            allow_inline_password,
            database,
            no_check,
            dry_run,
        } => {
            let uri = match (uri, uri_file) {
                (Some(uri), _) => uri,
                (None, Some(path)) => {
                    let path = std::path::absolute(&path).map_err(|e| {
                        Error::bad_input(format!("--uri-file {}: {e}", path.display()))
                    })?;
                    if !path.is_file() {
                        return Err(Error::bad_input(format!(
                            "--uri-file {}: no such file",
                            path.display()
                        )));
                    }
                    format!("${{file:{}}}", path.display())
                }
                (None, None) => return Err(Error::bad_input("give --uri or --uri-file")),
            };
            if crate::redact::has_inline_password(&uri) && !allow_inline_password {
                return Err(Error::bad_input(format!(
                    "--uri {} holds a password in plain text, which would be stored in the state \
                     store as written: put it in an environment variable (mongodb://user:\
                     ${{MONGO_PASSWORD}}@host) or a file (--uri-file PATH, or ${{file:PATH}}), \
                     resolved by each process when it connects; or pass --allow-inline-password",
                    crate::redact::redact_uri(&uri)
                )));
            }
            if !name
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '.'))
                || name.is_empty()
                || name.len() > 64
            {
                return Err(Error::bad_input(format!(
                    "shard name {name:?} is not allowed: use 1 to 64 letters, digits, '_', '-' or '.'"
                )));
            }
            if let Err(rule) = crate::names::database(&database) {
                return Err(Error::bad_input(format!("--database: {rule}")));
            }
            if let Err(why) = crate::names::uri_options(&uri) {
                return Err(Error::bad_input(format!(
                    "--uri {}: {why}",
                    crate::redact::redact_uri(&uri)
                )));
            }
            if no_check {
                mongo::client(&uri)
                    .await
                    .map_err(|e| Error::bad_input(e.to_string()))?;
            } else {
                mongo::ping(&uri, &database)
                    .await
                    .map_err(|e| Error::bad_input(format!("shard {name}: {e}")))?;
            }
            let shard = ctx.store.add_shard(&name, &uri, &database).await?;
            output::emit_change(
                ctx.output,
                dry_run,
                &shard,
                || {
                    println!(
                        "shard {} registered: {} database {}",
                        shard.name, shard.uri, shard.database
                    )
                },
                || {
                    format!(
                        "register shard {}: {} database {}",
                        shard.name, shard.uri, shard.database
                    )
                },
            )
        }
        ShardCommand::List => {
            let shards = ctx.store.shards().await?;
            output::emit(ctx.output, &shards, || {
                output::table(
                    &["name", "uri", "database", "registered"],
                    shards.iter().map(|s| {
                        [
                            s.name.clone(),
                            s.uri.to_string(),
                            s.database.clone(),
                            s.created_at.to_rfc3339(),
                        ]
                    }),
                )
            })
        }
        ShardCommand::Remove { name, dry_run } => {
            ctx.store.remove_shard(&name).await?;
            output::emit_change(
                ctx.output,
                dry_run,
                &serde_json::json!({ "removed": name }),
                || println!("shard {name} removed"),
                || format!("remove shard {name}"),
            )
        }
    }
}
