//! `reshard hook add|list|remove|deliver`: commands a migration runs on its events.

use crate::cli::{HookCommand, HookOnList};
use crate::commands::Ctx;
use crate::driver::hooks::{self, Wait, Which};
use crate::error::{Error, Result};
use crate::hooks::NewHook;
use crate::output;
use crate::redact::redact_uri;
use crate::store::hooks::Hook;

pub async fn run(ctx: &Ctx, cmd: HookCommand) -> Result<()> {
    match cmd {
        HookCommand::Add {
            id,
            name,
            on: HookOnList(on),
            command,
            blocking,
            timeout,
            dry_run,
        } => {
            let hook = NewHook {
                name,
                on,
                command,
                blocking,
                timeout,
            };
            let added = ctx.store.add_hook(id, &hook, &ctx.actor).await?;
            let shown = shown(&added);
            let what = || {
                format!(
                    "hook {:?} on migration {id}: on {}, {}, timeout {}",
                    added.name,
                    added.on_events.join(", "),
                    if added.blocking {
                        "blocking (a failure pauses the migration)"
                    } else {
                        "not blocking (a failure is logged)"
                    },
                    humantime::format_duration(added.timeout())
                )
            };
            output::emit_change(
                ctx.output,
                dry_run,
                &shown,
                || println!("added {}", what()),
                || format!("add {}", what()),
            )
        }
        HookCommand::List { id } => {
            let rows: Vec<serde_json::Value> =
                ctx.store.hooks(id).await?.iter().map(shown).collect();
            output::emit(ctx.output, &rows, || {
                if rows.is_empty() {
                    println!("migration {id} has no hooks (`reshard hook add {id} ...`)");
                    return;
                }
                output::table(
                    &[
                        "hook",
                        "on",
                        "command",
                        "blocking",
                        "timeout",
                        "delivered",
                        "failed",
                        "last error",
                    ],
                    rows.iter().map(|h| {
                        let text = |k: &str| h[k].as_str().unwrap_or("").to_owned();
                        [
                            text("name"),
                            h["on"]
                                .as_array()
                                .map(|a| {
                                    a.iter()
                                        .filter_map(|v| v.as_str())
                                        .collect::<Vec<_>>()
                                        .join(", ")
                                })
                                .unwrap_or_default(),
                            text("command"),
                            if h["blocking"] == true { "yes" } else { "no" }.into(),
                            h["timeout_ms"]
                                .as_u64()
                                .map(|ms| {
                                    humantime::format_duration(std::time::Duration::from_millis(ms))
                                        .to_string()
                                })
                                .unwrap_or_default(),
                            h["deliveries"].to_string(),
                            h["failures"].to_string(),
                            match h["last_error"].as_str() {
                                Some(e) if h["held_at_event"].is_i64() => {
                                    format!("HELD at event {}: {e}", h["held_at_event"])
                                }
                                Some(e) => e.to_owned(),
                                None => "-".into(),
                            },
                        ]
                    }),
                )
            })
        }
        HookCommand::Remove { id, name, dry_run } => {
            ctx.store.remove_hook(id, &name, &ctx.actor).await?;
            output::emit_change(
                ctx.output,
                dry_run,
                &serde_json::json!({ "removed": name }),
                || println!("hook {name:?} removed from migration {id}"),
                || format!("remove hook {name:?} from migration {id}"),
            )
        }
        HookCommand::Deliver { id, dry_run } => {
            ctx.store.migration(id).await?;
            if dry_run {
                // Each hook's events after the last one it was given, that it is on.
                let events = ctx.store.events(id).await?;
                let pending: Vec<serde_json::Value> = ctx
                    .store
                    .hooks(id)
                    .await?
                    .iter()
                    .map(|h| {
                        let on = h.on();
                        let due: Vec<i64> = events
                            .iter()
                            .filter(|e| e.id > h.delivered_through)
                            .filter(|e| on.iter().any(|o| o.matches(e.kind)))
                            .map(|e| e.id)
                            .collect();
                        serde_json::json!({ "hook": h.name, "events": due })
                    })
                    .collect();
                let count: usize = pending
                    .iter()
                    .map(|p| p["events"].as_array().map_or(0, Vec::len))
                    .sum();
                return output::emit_change(
                    ctx.output,
                    true,
                    &pending,
                    || {},
                    || format!("deliver {count} event(s) to {} hook(s)", pending.len()),
                );
            }
            let done = hooks::deliver(
                &ctx.store,
                Some(id),
                Which::Every,
                Wait::ForOthers,
                &ctx.actor,
            )
            .await?;
            output::emit(ctx.output, &done, || {
                println!(
                    "{} delivered, {} failed{}",
                    done.delivered,
                    done.failed,
                    if done.held.is_empty() {
                        String::new()
                    } else {
                        format!(
                            "; blocking hook(s) {} failed: migration {id} is paused",
                            done.held.join(", ")
                        )
                    }
                )
            })?;
            if done.held.is_empty() {
                Ok(())
            } else {
                Err(Error::failed(format!(
                    "blocking hook(s) {} failed (`reshard hook list {id}`)",
                    done.held.join(", ")
                )))
            }
        }
    }
}

/// A hook as `list` and `--output json` show it: the command with URI passwords hidden.
fn shown(h: &Hook) -> serde_json::Value {
    serde_json::json!({
        "name": h.name,
        "on": h.on_events,
        "command": redact_uri(&h.command),
        "blocking": h.blocking,
        "timeout_ms": h.timeout_ms,
        "origin": h.origin,
        "delivered_through": h.delivered_through,
        "deliveries": h.deliveries,
        "failures": h.failures,
        "last_error": h.last_error,
        "last_failed_at": h.last_failed_at,
        "held_at_event": h.held_at_event,
    })
}
