//! `abhyasa-sim`: run the deterministic simulations from the command line.

use std::process::ExitCode;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::Instant;

use abhyasa_sim::{
    census, run_custody, run_ledger, run_node, LedgerReport, RunReport, LEDGER_MUTANTS, MUTANTS,
    NODE_MUTANTS,
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
    Custody(RunArgs),
    /// Budget ledger: a delegation DAG, gateways, a faulty network, crashes, reclaim.
    Ledger(RunArgs),
    /// Both through the node machine with its own mutants (a broken timer, id mapping or
    /// gateway clock): the custody world, then the ledger world, per seed.
    Node(RunArgs),
    /// How often each fault class and rare schedule is drawn, over --seeds seeds.
    Census(RunArgs),
    /// A payer spending through a gateway for --days days of virtual time over a lossy link,
    /// checked every day: fails unless the state both keep stays flat.
    Year(YearArgs),
}

#[derive(clap::Args)]
struct YearArgs {
    /// Days of virtual time.
    #[arg(long, default_value_t = 365)]
    days: u64,
    /// Operations started per day.
    #[arg(long, default_value_t = 720)]
    ops_per_day: u64,
    /// Chance that a message is lost.
    #[arg(long, default_value_t = 0.05)]
    loss: f64,
    /// The gateway's retention of settled acceptances after expiry, in ms (0: for ever).
    #[arg(long, default_value_t = 3_600_000)]
    retain_ms: u64,
    /// The seed.
    #[arg(long, default_value_t = 0)]
    seed: u64,
    /// Writes one CSV line per day here.
    #[arg(long)]
    csv: Option<std::path::PathBuf>,
    /// Draws what each side keeps, day by day, as an SVG here.
    #[arg(long)]
    svg: Option<std::path::PathBuf>,
}

/// Draws the year's samples: what the payer and the gateway keep, per day.
fn plot_year(
    path: &std::path::Path,
    r: &abhyasa_sim::YearReport,
) -> Result<(), Box<dyn std::error::Error>> {
    use plotters::prelude::*;
    type Measure = (&'static str, fn(&abhyasa_sim::DaySample) -> f64);
    let series: [Measure; 4] = [
        ("payer: ended summaries kept", |s| s.ended as f64),
        ("payer: checkpoint (KB)", |s| {
            s.checkpoint_bytes as f64 / 1e3
        }),
        ("gateway: acceptances kept", |s| s.acceptances as f64),
        ("gateway: checkpoint (KB)", |s| {
            s.gateway_checkpoint_bytes as f64 / 1e3
        }),
    ];
    let days = r.samples.len().max(2) as f64;
    let top = r
        .samples
        .iter()
        .flat_map(|s| series.iter().map(move |(_, f)| f(s)))
        .fold(1.0f64, f64::max)
        * 1.2;
    let root = SVGBackend::new(path, (800, 480)).into_drawing_area();
    root.fill(&WHITE)?;
    let mut chart = ChartBuilder::on(&root)
        .caption(
            format!(
                "A year of spending: {} operations settled, state per day",
                r.samples.last().map_or(0, |s| s.settled)
            ),
            ("sans-serif", 20),
        )
        .margin(15)
        .x_label_area_size(45)
        .y_label_area_size(60)
        .build_cartesian_2d(1f64..days, 0f64..top)?;
    chart
        .configure_mesh()
        .x_desc("day")
        .y_desc("rows kept / KB")
        .draw()?;
    let colors = [BLUE, RED, GREEN, MAGENTA];
    for (i, (label, f)) in series.iter().enumerate() {
        let color = colors[i];
        chart
            .draw_series(LineSeries::new(
                r.samples.iter().map(|s| (s.day as f64, f(s))),
                color.stroke_width(2),
            ))?
            .label(*label)
            .legend(move |(x, y)| {
                PathElement::new(vec![(x, y), (x + 20, y)], color.stroke_width(2))
            });
    }
    chart
        .configure_series_labels()
        .background_style(WHITE.mix(0.8))
        .border_style(BLACK)
        .draw()?;
    root.present()?;
    Ok(())
}

#[derive(clap::Args)]
struct RunArgs {
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
}

/// What every simulation's seeds add up to.
trait Totals: Default + Send {
    /// One seed's report folded in; returns its first violation.
    fn add(&mut self, seed_report: Self) -> (usize, Option<String>);
}

impl Totals for RunReport {
    fn add(&mut self, r: Self) -> (usize, Option<String>) {
        self.obligations += r.obligations;
        self.applied += r.applied;
        self.declined += r.declined;
        self.escalated += r.escalated;
        self.best_effort += r.best_effort;
        self.crashes += r.crashes;
        self.reconciled += r.reconciled;
        self.resubscriptions += r.resubscriptions;
        self.full_refusals += r.full_refusals;
        self.declines_malformed += r.declines_malformed;
        self.declines_refused += r.declines_refused;
        self.declines_superseded += r.declines_superseded;
        self.tampered += r.tampered;
        self.expired_certs += r.expired_certs;
        self.lapsed_probes += r.lapsed_probes;
        self.lapsed_weight_probes += r.lapsed_weight_probes;
        self.unverified += r.unverified;
        (r.violations.len(), r.violations.into_iter().next())
    }
}

impl Totals for LedgerReport {
    fn add(&mut self, r: Self) -> (usize, Option<String>) {
        self.operations += r.operations;
        self.settled += r.settled;
        self.forfeited += r.forfeited;
        self.no_effect += r.no_effect;
        self.transfers += r.transfers;
        self.joins += r.joins;
        self.crashes += r.crashes;
        self.effects += r.effects;
        self.forgeries += r.forgeries;
        self.diamonds += r.diamonds;
        self.overdrawn += r.overdrawn;
        self.reissues += r.reissues;
        self.fused += r.fused;
        self.checkpoints += r.checkpoints;
        self.pruned += r.pruned;
        self.forgotten += r.forgotten;
        self.gateway_checkpoints += r.gateway_checkpoints;
        self.returns += r.returns;
        self.reclaims += r.reclaims;
        self.claims += r.claims;
        (r.violations.len(), r.violations.into_iter().next())
    }
}

/// Runs the seeds on worker threads; prints failing seeds and the replay command. Returns
/// the totals, the violation count and the number of failing seeds.
fn run_seeds<M: Copy + Sync, T: Totals>(
    name: &str,
    args: &RunArgs,
    mutants: &[(&str, M)],
    run: impl Fn(u64, Option<M>) -> T + Sync,
) -> Result<(T, u64, usize), ExitCode> {
    if args.list_mutants {
        for (n, _) in mutants {
            println!("{n}");
        }
        return Err(ExitCode::SUCCESS);
    }
    let mutation = match args.mutant.as_deref() {
        None => None,
        Some(n) => match mutants.iter().find(|(m, _)| *m == n) {
            Some(&(_, m)) => Some(m),
            None => {
                eprintln!("unknown mutant {n:?}; --list-mutants prints the names");
                return Err(ExitCode::from(2));
            }
        },
    };
    let threads = args
        .threads
        .unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get()))
        .max(1);
    let started = Instant::now();
    let next = AtomicU64::new(args.seed);
    let end = args.seed.saturating_add(args.seeds);
    let total = Mutex::new((T::default(), 0u64, Vec::<(u64, String)>::new()));
    std::thread::scope(|scope| {
        for _ in 0..threads {
            scope.spawn(|| loop {
                let s = next.fetch_add(1, Ordering::Relaxed);
                if s >= end {
                    break;
                }
                let r = run(s, mutation);
                let mut t = total
                    .lock()
                    .expect("no worker panics while holding the lock");
                let (n, first) = t.0.add(r);
                t.1 += n as u64;
                if let Some(first) = first {
                    t.2.push((s, first));
                }
            });
        }
    });
    let (totals, violations, mut failing) = total.into_inner().expect("workers joined");
    failing.sort();
    for (s, v) in failing.iter().take(10) {
        println!("seed {s}: {v}");
    }
    if let Some((s, _)) = failing.first() {
        println!(
            "replay: cargo run --release -p abhyasa-sim -- {name} --seed {s} --seeds 1{}",
            args.mutant
                .as_deref()
                .map(|m| format!(" --mutant {m}"))
                .unwrap_or_default()
        );
    }
    eprint!(
        "ran {} seeds from {} in {:.2}s on {threads} threads: ",
        args.seeds,
        args.seed,
        started.elapsed().as_secs_f64()
    );
    Ok((totals, violations, failing.len()))
}

fn exit(violations: u64) -> ExitCode {
    if violations == 0 {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    }
}

fn main() -> ExitCode {
    match Cli::parse().command {
        Command::Custody(args) => {
            let (r, violations, failing) = match run_seeds("custody", &args, &MUTANTS, run_custody)
            {
                Ok(x) => x,
                Err(code) => return code,
            };
            eprintln!(
                "crashes={} reconciled={} resubscriptions={} full_refusals={} declines: malformed={} refused={} superseded={} relay: tampered={} unverified={} expired_certs={} lapsed_probes={} lapsed_weight_probes={} failing_seeds={failing}",
                r.crashes, r.reconciled, r.resubscriptions, r.full_refusals,
                r.declines_malformed, r.declines_refused, r.declines_superseded,
                r.tampered, r.unverified, r.expired_certs, r.lapsed_probes,
                r.lapsed_weight_probes
            );
            println!(
                "custody: seeds={} obligations={} applied={} declined={} escalated={} best_effort={} violations={violations}",
                args.seeds, r.obligations, r.applied, r.declined, r.escalated, r.best_effort
            );
            exit(violations)
        }
        Command::Year(args) => {
            let p = abhyasa_sim::YearParams {
                days: args.days,
                ops_per_day: args.ops_per_day,
                loss: args.loss,
                retain_ms: (args.retain_ms > 0).then_some(args.retain_ms),
                seed: args.seed,
                ..abhyasa_sim::YearParams::default()
            };
            let started = Instant::now();
            let r = abhyasa_sim::run_year(&p);
            if let Some(path) = &args.csv {
                if let Err(e) = std::fs::write(path, r.csv()) {
                    eprintln!("cannot write {}: {e}", path.display());
                    return ExitCode::from(2);
                }
            }
            if let Some(path) = &args.svg {
                if let Err(e) = plot_year(path, &r) {
                    eprintln!("cannot draw {}: {e}", path.display());
                    return ExitCode::from(2);
                }
            }
            for v in r.violations.iter().take(5) {
                eprintln!("{v}");
            }
            let last = r.samples.last().cloned().unwrap_or_default();
            let peak =
                |f: fn(&abhyasa_sim::DaySample) -> u64| r.samples.iter().map(f).max().unwrap_or(0);
            let flat = r.flat();
            println!(
                "year: days={} settled={} effects={} lost={} ended_last={} ended_peak={} checkpoint_bytes_last={} checkpoint_bytes_peak={} acceptances_peak={} gateway_checkpoint_bytes_peak={} committed_ranges_last={} credits_last={} violations={} flat={} in {:.1}s",
                r.samples.len(),
                last.settled,
                r.effects,
                r.lost,
                last.ended,
                peak(|s| s.ended),
                last.checkpoint_bytes,
                peak(|s| s.checkpoint_bytes),
                peak(|s| s.acceptances),
                peak(|s| s.gateway_checkpoint_bytes),
                last.committed_ranges,
                last.credits,
                r.violations.len(),
                flat.as_ref().map_or_else(|e| format!("no ({e})"), |()| "yes".into()),
                started.elapsed().as_secs_f64()
            );
            if r.violations.is_empty() && flat.is_ok() {
                ExitCode::SUCCESS
            } else {
                ExitCode::FAILURE
            }
        }
        Command::Census(args) => {
            println!("| drawn in | fault class or schedule |\n|---:|---|");
            for (name, n) in census(args.seed, args.seeds) {
                let share = 100.0 * n as f64 / args.seeds.max(1) as f64;
                println!("| {share:.1}% | {name} |");
            }
            ExitCode::SUCCESS
        }
        Command::Node(args) => {
            let (r, violations, failing) = match run_seeds("node", &args, &NODE_MUTANTS, run_node) {
                Ok(x) => x,
                Err(code) => return code,
            };
            eprintln!("failing_seeds={failing}");
            println!(
                "node: seeds={} obligations={} applied={} declined={} escalated={} violations={violations}",
                args.seeds, r.obligations, r.applied, r.declined, r.escalated
            );
            exit(violations)
        }
        Command::Ledger(args) => {
            let (r, violations, failing) =
                match run_seeds("ledger", &args, &LEDGER_MUTANTS, run_ledger) {
                    Ok(x) => x,
                    Err(code) => return code,
                };
            eprintln!(
                "transfers={} claims={} reclaims={} returns={} joins={} reissues={} fused={} checkpoints={} gateway_checkpoints={} pruned={} forgotten={} effects={} overdrawn={} crashes={} forgeries={} failing_seeds={failing}",
                r.transfers, r.claims, r.reclaims, r.returns, r.joins, r.reissues, r.fused, r.checkpoints, r.gateway_checkpoints, r.pruned, r.forgotten, r.effects, r.overdrawn, r.crashes, r.forgeries
            );
            println!(
                "ledger: seeds={} operations={} settled={} forfeited={} no_effect={} diamonds={} violations={violations}",
                args.seeds, r.operations, r.settled, r.forfeited, r.no_effect, r.diamonds
            );
            exit(violations)
        }
    }
}
