use std::process::ExitCode;

use clap::Parser;

fn main() -> ExitCode {
    let cli = reshard::Cli::parse();
    let runtime = match tokio::runtime::Runtime::new() {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("error: cannot start the async runtime: {e}");
            return ExitCode::from(reshard::error::EXIT_FAILED);
        }
    };
    runtime.block_on(reshard::run(cli))
}
