//! `reshard completion SHELL` and `reshard man`: the command line's own description, as a
//! shell completion script (clap_complete) and as man pages (clap_mangen).

use std::io::Write;
use std::path::Path;

use clap::CommandFactory;

use crate::cli::Cli;
use crate::error::{Error, Result};

pub fn completion(shell: clap_complete::Shell) -> Result<()> {
    let mut command = Cli::command();
    clap_complete::generate(shell, &mut command, "reshard", &mut std::io::stdout());
    Ok(())
}

pub fn man(dir: Option<&Path>) -> Result<()> {
    let command = Cli::command();
    match dir {
        None => {
            let mut out = Vec::new();
            clap_mangen::Man::new(command)
                .render(&mut out)
                .map_err(|e| Error::failed(format!("rendering the man page failed: {e}")))?;
            std::io::stdout()
                .write_all(&out)
                .map_err(|e| Error::failed(format!("writing the man page failed: {e}")))?;
        }
        Some(dir) => {
            if !dir.is_dir() {
                return Err(Error::bad_input(format!(
                    "--dir {}: not a directory",
                    dir.display()
                )));
            }
            clap_mangen::generate_to(command, dir).map_err(|e| {
                Error::failed(format!(
                    "writing the man pages into {} failed: {e}",
                    dir.display()
                ))
            })?;
            eprintln!("man pages written to {}", dir.display());
        }
    }
    Ok(())
}
