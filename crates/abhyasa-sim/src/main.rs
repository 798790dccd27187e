//! `abhyasa-sim`: run the deterministic simulation from the command line.

use std::process::ExitCode;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::Instant;

use abhyasa_sim::{
    ledger_mutant, mutant, run_custody, run_ledger, LedgerReport, RunReport, LEDGER_MUTANTS,
    MUTANTS,
};
use clap::{Parser, Subcommand};

#[derive(Parser)]
#[command(about = "Deterministic simulation of the Abhyasa machines")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Custody: custodian, receivers, a rogue agent, a faulty network, crashes.
    Custody {
        /// How many seeds to run, starting at --seed.
        #[arg(long, default_value_t = 1)]
        seeds: u64,
        /// The first seed.
        #[arg(long, default_value_t = 0)]
        seed: u64,
        /// Break one rule on purpose (see --list-mutants); the run must then fail.
        #[arg(long)]
        mutant: Option<String>,
        /// Print the mutant names and exit.
        #[arg(long)]
        list_mutants: bool,
        /// Worker threads (default: available parallelism).
        #[arg(long)]
        threads: Option<usize>,
    },
    /// Budget ledger: a delegation DAG, gateways, a faulty network, crashes, reclaim.
    Ledger {
        /// How many seeds to run, starting at --seed.
        #[arg(long, default_value_t = 1)]
        seeds: u64,
        /// The first seed.
        #[arg(long, default_value_t = 0)]
        seed: u64,
        /// Break one rule on purpose (see --list-mutants); the run must then fail.
        #[arg(long)]
        mutant: Option<String>,
        /// Print the mutant names and exit.
        #[arg(long)]
        list_mutants: bool,
        /// Worker threads (default: available parallelism).
        #[arg(long)]
        threads: Option<usize>,
    },
}

fn main() -> ExitCode {
    let command = Cli::parse().command;
    let (seeds, seed, mutant_name, list_mutants, threads) = match command {
        Command::Ledger {
            seeds,
            seed,
            mutant,
            list_mutants,
            threads,
        } => return ledger(seeds, seed, mutant, list_mutants, threads),
        Command::Custody {
            seeds,
            seed,
            mutant,
            list_mutants,
            threads,
        } => (seeds, seed, mutant, list_mutants, threads),
    };
    if list_mutants {
        for (name, _) in MUTANTS {
            println!("{name}");
        }
        return ExitCode::SUCCESS;
    }
    let mutation = match mutant_name.as_deref().map(|n| (n, mutant(n))) {
        None => None,
        Some((_, Some(m))) => Some(m),
        Some((n, None)) => {
            eprintln!("unknown mutant {n:?}; --list-mutants prints the names");
            return ExitCode::from(2);
        }
    };
    let threads = threads
        .unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get()))
        .max(1);
    let started = Instant::now();
    let next = AtomicU64::new(seed);
    let end = seed.saturating_add(seeds);
    let total = Mutex::new((RunReport::default(), 0u64, Vec::<(u64, String)>::new()));
    std::thread::scope(|scope| {
        for _ in 0..threads {
            scope.spawn(|| loop {
                let s = next.fetch_add(1, Ordering::Relaxed);
                if s >= end {
                    break;
                }
                let r = run_custody(s, mutation);
                let mut t = total
                    .lock()
                    .expect("no worker panics while holding the lock");
                t.0.obligations += r.obligations;
                t.0.applied += r.applied;
                t.0.declined += r.declined;
                t.0.escalated += r.escalated;
                t.0.best_effort += r.best_effort;
                t.0.crashes += r.crashes;
                t.0.reconciled += r.reconciled;
                t.1 += r.violations.len() as u64;
                if let Some(first) = r.violations.first() {
                    t.2.push((s, first.clone()));
                }
            });
        }
    });
    let (report, violations, mut failing) = total.into_inner().expect("workers joined");
    failing.sort();
    for (s, v) in failing.iter().take(10) {
        println!("seed {s}: {v}");
    }
    if let Some((s, _)) = failing.first() {
        println!(
            "replay: cargo run --release -p abhyasa-sim -- custody --seed {s} --seeds 1{}",
            mutant_name
                .as_deref()
                .map(|m| format!(" --mutant {m}"))
                .unwrap_or_default()
        );
    }
    eprintln!(
        "ran {seeds} seeds from {seed} in {:.2}s on {threads} threads: crashes={} reconciled={} failing_seeds={}",
        started.elapsed().as_secs_f64(),
        report.crashes,
        report.reconciled,
        failing.len()
    );
    println!(
        "custody: seeds={seeds} obligations={} applied={} declined={} escalated={} best_effort={} violations={violations}",
        report.obligations, report.applied, report.declined, report.escalated, report.best_effort
    );
    if violations == 0 {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    }
}

fn ledger(
    seeds: u64,
    seed: u64,
    mutant_name: Option<String>,
    list_mutants: bool,
    threads: Option<usize>,
) -> ExitCode {
    if list_mutants {
        for (name, _) in LEDGER_MUTANTS {
            println!("{name}");
        }
        return ExitCode::SUCCESS;
    }
    let mutation = match mutant_name.as_deref().map(|n| (n, ledger_mutant(n))) {
        None => None,
        Some((_, Some(m))) => Some(m),
        Some((n, None)) => {
            eprintln!("unknown mutant {n:?}; --list-mutants prints the names");
            return ExitCode::from(2);
        }
    };
    let threads = threads
        .unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get()))
        .max(1);
    let started = Instant::now();
    let next = AtomicU64::new(seed);
    let end = seed.saturating_add(seeds);
    let total = Mutex::new((LedgerReport::default(), 0u64, Vec::<(u64, String)>::new()));
    std::thread::scope(|scope| {
        for _ in 0..threads {
            scope.spawn(|| loop {
                let s = next.fetch_add(1, Ordering::Relaxed);
                if s >= end {
                    break;
                }
                let r = run_ledger(s, mutation);
                let mut t = total
                    .lock()
                    .expect("no worker panics while holding the lock");
                t.0.operations += r.operations;
                t.0.settled += r.settled;
                t.0.forfeited += r.forfeited;
                t.0.no_effect += r.no_effect;
                t.0.transfers += r.transfers;
                t.0.joins += r.joins;
                t.0.crashes += r.crashes;
                t.0.effects += r.effects;
                t.1 += r.violations.len() as u64;
                if let Some(first) = r.violations.first() {
                    t.2.push((s, first.clone()));
                }
            });
        }
    });
    let (report, violations, mut failing) = total.into_inner().expect("workers joined");
    failing.sort();
    for (s, v) in failing.iter().take(10) {
        println!("seed {s}: {v}");
    }
    if let Some((s, _)) = failing.first() {
        println!(
            "replay: cargo run --release -p abhyasa-sim -- ledger --seed {s} --seeds 1{}",
            mutant_name
                .as_deref()
                .map(|m| format!(" --mutant {m}"))
                .unwrap_or_default()
        );
    }
    eprintln!(
        "ran {seeds} seeds from {seed} in {:.2}s on {threads} threads: transfers={} joins={} effects={} crashes={} failing_seeds={}",
        started.elapsed().as_secs_f64(),
        report.transfers,
        report.joins,
        report.effects,
        report.crashes,
        failing.len()
    );
    println!(
        "ledger: seeds={seeds} operations={} settled={} forfeited={} no_effect={} violations={violations}",
        report.operations, report.settled, report.forfeited, report.no_effect
    );
    if violations == 0 {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    }
}
