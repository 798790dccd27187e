//! `abhyasa-ledgerpeer`: one branch or gateway process for the ledger SIGKILL crash test.
//! See `abhyasa_crashtest::ledgerpeer`.

use std::process::ExitCode;

use abhyasa_crashtest::ledgerpeer::{run, LedgerPeerArgs};
use clap::Parser;

#[derive(Parser)]
#[command(about = "A ledger peer for crash tests: real store, UDP on loopback, named kill points")]
struct Cli {
    #[command(flatten)]
    peer: LedgerPeerArgs,
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    match run(&cli.peer) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("abhyasa-ledgerpeer: {e}");
            ExitCode::FAILURE
        }
    }
}
