//! The `abhyasa` command.

use std::process::ExitCode;

use abhyasa_sim::{run_scenario, Scenario};
use clap::{Parser, Subcommand};

#[derive(Parser)]
#[command(version, about = "Deliver-or-report custody of governance obligations")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Run the custody demo: a principal and two agents, in one process.
    ///
    /// This build runs the real custodian and receiver machines over the deterministic
    /// simulated network (virtual time, 10% loss, a cut link, a receiver restart, one agent
    /// offline past the deadline). The QUIC transport is not part of this build yet.
    Demo {
        /// Seed for the network's loss and the backoff jitter.
        #[arg(long, default_value_t = 2026)]
        seed: u64,
    },
}

fn main() -> ExitCode {
    let Command::Demo { seed } = Cli::parse().command;
    let scenario = Scenario::demo();
    println!("abhyasa demo: principal -> agent-0 (10% loss, link cut 200-1000ms, receiver restart at 700ms)");
    println!("              principal -> agent-1 (offline past every deadline)");
    println!("transport: deterministic simulated network in virtual time, seed {seed} (QUIC comes in a later build)");
    println!(
        "issuing {} obligations of every kind, both polarities, deadline 3s each...",
        scenario.obligations.len()
    );
    let report = run_scenario(scenario, seed);
    println!(
        "crashes injected: {}; late acks reconciled: {}",
        report.crashes, report.reconciled
    );
    for v in &report.violations {
        println!("VIOLATION: {v}");
    }
    println!(
        "summary: obligations={} applied={} declined={} escalated={} best_effort={} lost={} double_applied={}",
        report.obligations,
        report.applied,
        report.declined,
        report.escalated,
        report.best_effort,
        report.lost,
        report.double_applied
    );
    if report.violations.is_empty() {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    }
}
