//! One module per noun of the command line. `run` is the one exhaustive match over commands;
//! each arm resolves its input and calls into the library.

mod bypass;
mod capacity;
mod db;
mod deadletter;
mod exporter;
mod front;
mod help;
mod hook;
mod migration;
mod playbook;
mod progress;
mod reconcile;
mod route;
mod routers;
mod shard;
mod status;
mod throttle;
mod version;
mod worker;

use crate::cli::{Cli, Command, OutputFormat};
use crate::error::{Error, Result};
use crate::store::Store;

/// What every command that talks to the state store needs.
pub struct Ctx {
    pub store: Store,
    pub output: OutputFormat,
    pub actor: String,
}

pub async fn run(cli: Cli) -> Result<()> {
    // Reading and checking a playbook, and the shell's and man's pages, need no state store.
    match cli.command {
        Command::Playbook(cmd) => return playbook::run(cli.output, cmd),
        Command::Completion { shell } => return help::completion(shell),
        Command::Man { dir } => return help::man(dir.as_deref()),
        _ => {}
    }
    // The front connects to the state store itself (waiting for it), when it has one.
    let front_url = database_url(&cli).ok();
    if let Command::Front(args) = cli.command {
        return front::run(cli.output, front_url, args).await;
    }
    let url = database_url(&cli)?;
    // An empty `--actor` (`RESHARD_ACTOR=` in a script) names no one: the event log gets the
    // operating system's user instead of an empty actor.
    let actor = cli
        .actor
        .clone()
        .filter(|a| !a.trim().is_empty())
        .unwrap_or_else(crate::identity::default_actor);
    if let Some((old, new)) = cli.command.deprecated_words() {
        warn_deprecated(old, old, new);
    }
    let output = cli.output;
    let dry_run = cli.command.is_dry_run();
    let ctx = |url: String, output: OutputFormat, actor: String| async move {
        let ctx = ctx(url, output, actor).await?;
        Ok::<_, Error>(if dry_run {
            Ctx {
                store: ctx.store.dry_run(),
                ..ctx
            }
        } else {
            ctx
        })
    };
    match cli.command {
        Command::Db(cmd) => db::run(&url, output, cmd).await,
        Command::Shard(cmd) => shard::run(&ctx(url, output, actor).await?, cmd).await,
        Command::Version(cmd) => version::run(&ctx(url, output, actor).await?, cmd).await,
        Command::Migration(cmd) => migration::run(&ctx(url, output, actor).await?, cmd).await,
        Command::Route(cmd) => route::run(&ctx(url, output, actor).await?, cmd).await,
        Command::Router(cmd) | Command::Routers(cmd) => {
            routers::run(&ctx(url, output, actor).await?, cmd).await
        }
        Command::Worker(args) => worker::run(&ctx(url, output, actor).await?, args).await,
        Command::Throttle(cmd) => throttle::run(&ctx(url, output, actor).await?, cmd).await,
        Command::Deadletter(cmd) => deadletter::run(&ctx(url, output, actor).await?, cmd).await,
        Command::Bypass(cmd) => bypass::run(&ctx(url, output, actor).await?, cmd).await,
        Command::Hook(cmd) => hook::run(&ctx(url, output, actor).await?, cmd).await,
        Command::Reconcile(args) => reconcile::run(&ctx(url, output, actor).await?, args).await,
        Command::Playbook(_)
        | Command::Front(_)
        | Command::Completion { .. }
        | Command::Man { .. } => unreachable!("handled above"),
        Command::Run(args) => playbook::run_file(&ctx(url, output, actor).await?, args).await,
        Command::Approve {
            migration,
            step,
            reason,
            dry_run,
        } => {
            playbook::approve(
                &ctx(url, output, actor).await?,
                &migration,
                &step,
                reason,
                dry_run,
            )
            .await
        }
        Command::Plan(args) => playbook::plan(&ctx(url, output, actor).await?, args).await,
        Command::Exporter(args) => exporter::run(&ctx(url, output, actor).await?, args).await,
        Command::Repair { id, run, dry_run } => {
            reconcile::repair(&ctx(url, output, actor).await?, id, run, dry_run).await
        }
    }
}

/// Logs that a command line used the old name `old` (shown as `used`) and what replaces it.
fn warn_deprecated(old: &str, used: &str, new: &str) {
    tracing::warn!(
        deprecated = old,
        use_instead = new,
        "{}",
        crate::vocabulary::deprecation(used, new)
    );
}

async fn ctx(url: String, output: OutputFormat, actor: String) -> Result<Ctx> {
    Ok(Ctx {
        store: Store::connect(&url).await?,
        output,
        actor,
    })
}

fn database_url(cli: &Cli) -> Result<String> {
    cli.database_url
        .clone()
        .or_else(|| std::env::var("DATABASE_URL").ok())
        .filter(|u| !u.is_empty())
        .ok_or_else(|| {
            Error::bad_input(
                "no state store given: pass --database-url or set RESHARD_DATABASE_URL \
                 (or DATABASE_URL)",
            )
        })
}
