//! Playbooks: `playbook validate|schema`, `run` and `plan`.

use std::path::PathBuf;

use clap::{Args, Subcommand};

#[derive(Debug, Subcommand)]
pub enum PlaybookCommand {
    /// Check a playbook: every problem at once, each with file:line:column; exit 2 on any.
    Validate {
        /// The playbook (YAML).
        file: PathBuf,
    },
    /// Print the JSON Schema of playbooks (for editors).
    Schema,
}

#[derive(Debug, Args)]
pub struct RunArgs {
    /// The playbook (YAML).
    pub file: PathBuf,
    /// Print the steps that would run from the current state; change nothing.
    #[arg(long)]
    pub dry_run: bool,
    /// Workers a step runs in this process when the playbook does not say (0: workers run
    /// elsewhere, with `reshard worker`).
    #[arg(long, default_value_t = 2, value_parser = clap::value_parser!(u16).range(0..=64))]
    pub workers: u16,
    #[command(flatten)]
    pub metrics: super::work::MetricsArg,
}

#[derive(Debug, Args)]
pub struct PlanArgs {
    /// The playbook (YAML) whose source and target to compare.
    pub file: PathBuf,
    /// Print every tenant, not the hottest 20 (JSON output always has every one).
    #[arg(long)]
    pub all: bool,
}
