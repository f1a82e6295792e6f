use std::process::ExitCode;

fn main() -> ExitCode {
    let cli = match reshard::parse_args(std::env::args_os()) {
        Ok(cli) => cli,
        Err(code) => return code,
    };
    let runtime = match tokio::runtime::Runtime::new() {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("error: cannot start the async runtime: {e}");
            return ExitCode::from(reshard::error::EXIT_FAILED);
        }
    };
    runtime.block_on(reshard::run(cli))
}
