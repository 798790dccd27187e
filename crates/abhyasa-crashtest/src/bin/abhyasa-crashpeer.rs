//! `abhyasa-crashpeer`: one custodian or receiver process for the SIGKILL crash test.
//! See `abhyasa_crashtest::crashpeer`.

use std::process::ExitCode;

use abhyasa_crashtest::crashpeer::{run, PeerArgs};
use clap::Parser;

#[derive(Parser)]
#[command(about = "A custody peer for crash tests: real store, UDP on loopback, named kill points")]
struct Cli {
    #[command(flatten)]
    peer: PeerArgs,
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    match run(&cli.peer) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("abhyasa-crashpeer: {e}");
            ExitCode::FAILURE
        }
    }
}
