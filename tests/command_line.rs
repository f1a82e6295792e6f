//! The command line describes itself: every argument has help text, every command's help ends
//! with the exit codes, and the shell completion and man page are generated from the same
//! description.

mod support;

use clap::CommandFactory;
use reshard::Cli;

/// Every command, as its path from `reshard`, with clap's description of it.
fn commands() -> Vec<(String, clap::Command)> {
    fn walk(path: String, command: &clap::Command, out: &mut Vec<(String, clap::Command)>) {
        out.push((path.clone(), command.clone()));
        for sub in command.get_subcommands() {
            walk(format!("{path} {}", sub.get_name()), sub, out);
        }
    }
    let mut out = Vec::new();
    let mut root = Cli::command();
    root.build();
    walk("reshard".into(), &root, &mut out);
    out
}

#[test]
fn every_argument_of_every_command_says_what_it_is() {
    let mut bare = Vec::new();
    for (path, command) in commands() {
        for arg in command.get_arguments() {
            let builtin = matches!(arg.get_id().as_str(), "help" | "version");
            if !builtin && arg.get_help().is_none() && arg.get_long_help().is_none() {
                let name = match arg.get_long() {
                    Some(long) => format!("--{long}"),
                    None => format!("<{}>", arg.get_id().as_str().to_uppercase()),
                };
                bare.push(format!("{path} {name}"));
            }
        }
    }
    assert!(
        bare.is_empty(),
        "arguments without help text:\n{}",
        bare.join("\n")
    );
}

#[test]
fn every_command_that_does_something_is_described() {
    let undescribed: Vec<String> = commands()
        .into_iter()
        .filter(|(path, c)| path != "reshard" && c.get_about().is_none() && c.get_name() != "help")
        .map(|(path, _)| path)
        .collect();
    assert!(
        undescribed.is_empty(),
        "commands without a description: {undescribed:?}"
    );
}

fn reshard(args: &[&str]) -> std::process::Output {
    let out = support::bin_without_db().args(args).output().unwrap();
    assert!(
        out.status.success(),
        "reshard {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

#[test]
fn completion_scripts_know_the_commands_and_need_no_state_store() {
    for (shell, marker) in [
        ("bash", "_reshard()"),
        ("zsh", "#compdef reshard"),
        ("fish", "complete -c reshard"),
    ] {
        let script = String::from_utf8(reshard(&["completion", shell]).stdout).unwrap();
        assert!(
            script.contains(marker),
            "{shell}: no {marker:?} in\n{script}"
        );
        for word in ["migration", "playbook", "front", "rollback"] {
            assert!(
                script.contains(word),
                "{shell}: the script does not know {word:?}"
            );
        }
    }
    let out = support::bin_without_db()
        .args(["completion", "tcsh"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("possible values"));
}

#[test]
fn the_man_page_is_roff_with_every_command_and_one_page_per_command_on_request() {
    let page = String::from_utf8(reshard(&["man"]).stdout).unwrap();
    assert!(page.contains(".TH reshard 1"), "{page}");
    for command in ["migration", "playbook", "worker", "front"] {
        assert!(page.contains(command), "the page does not list {command:?}");
    }
    let dir = tempfile::tempdir().unwrap();
    reshard(&["man", "--dir", dir.path().to_str().unwrap()]);
    for file in [
        "reshard.1",
        "reshard-migration.1",
        "reshard-migration-advance.1",
    ] {
        let text = std::fs::read_to_string(dir.path().join(file))
            .unwrap_or_else(|e| panic!("{file}: {e}"));
        assert!(text.contains(".TH"), "{file} is not a man page");
    }
}
