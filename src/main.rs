//! `ft`: decide, measure and explain how a host-RAM MoE model should decode.
//!
//! A thin binary over the library crates: arguments are parsed and validated into a plan
//! before any work, data goes to stdout, logs (tracing) to stderr. Exit codes: 0 success,
//! 1 ran but a check failed, 2 error.

/// `println!` that returns the write's error instead of panicking: a reader that closes the
/// pipe early (`ft --version | head -1`) ends `ft` quietly (see `main`), where `println!`
/// would abort with a panic.
macro_rules! outln {
    ($($arg:tt)*) => {{
        use std::io::Write as _;
        writeln!(std::io::stdout().lock(), $($arg)*)
    }};
}

mod bench;
mod bench_bw;
mod bench_cpu;
mod cache_args;
mod calibrate;
mod engine_args;
mod experiment;
mod explain;
mod host_cmd;
mod loadgen;
mod model_cmd;
mod plot;
mod predict;
mod probe;
mod progress;
mod routing;
mod run;
mod serve;
mod simulate;
mod tune;
mod validate;
mod version;

use clap::{Parser, Subcommand};
use std::process::ExitCode;

/// Top-level command line.
#[derive(Debug, Parser)]
#[command(name = "ft", about, disable_version_flag = true)]
struct Cli {
    /// More log output on stderr (-v info, -vv debug, -vvv trace); RUST_LOG overrides.
    #[arg(short, long, action = clap::ArgAction::Count, global = true)]
    verbose: u8,
    /// Print the version, git revision, SIMD levels and CUDA driver status.
    #[arg(short = 'V', long)]
    version: bool,
    #[command(subcommand)]
    command: Option<Command>,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Micro-benchmarks: `cpu` (expert kernels against STREAM read), `bw` (the legacy ratio).
    Bench(bench::Args),
    /// List and run the reproducible experiments under experiments/.
    Experiment(experiment::Args),
    /// Simulate decode on a host (discrete events): every strategy, the model beside it.
    Simulate(simulate::Args),
    /// Decode on the real runtime (CUDA or the host-emulated device) with one strategy.
    Run(Box<run::Args>),
    /// Predict decode tok/s per strategy (analytic model), the choice and the legacy ratio.
    Predict(predict::Args),
    /// Fit an engine's terms to its measured runs and write a calibrated profile.
    Calibrate(calibrate::Args),
    /// Explain, in numbers, the model's choice and where the legacy ratio's verdict differs.
    Explain(explain::ExplainArgs),
    /// Plot a CSV as an SVG: scatter, line, histogram or CDF, with marks and a y = x line.
    Plot(plot::Args),
    /// Serve the MoE model over an OpenAI-compatible HTTP API (decides its strategy at start).
    Serve(serve::Args),
    /// Replay the field report's A/B protocol (or a loopback stress test) against a server.
    Loadgen(loadgen::Args),
    /// Probe this host with the real runtime, fit the performance model, cache the profile.
    Probe(probe::Args),
    /// Validate the model against measured runs: the grid's plan, collection and analysis.
    Validate(validate::Args),
    /// Models: list the presets, show one, import a Hugging Face config.json or a GGUF file.
    Model(model_cmd::Args),
    /// Hosts: write one for this machine (`init`), show one's values and sources, list presets.
    Host(host_cmd::Args),
    /// Routing statistics (cache hit rates, hot lists, reuse), process fitting, trace import.
    Routing(routing::Args),
    /// Probe a served engine end to end, strategy by strategy, and decide from the runs.
    Tune(Box<tune::Args>),
}

/// An outcome that is not an error but must change the exit code (a check that failed).
#[derive(Debug)]
pub struct CheckFailed(pub String);

impl std::fmt::Display for CheckFailed {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for CheckFailed {}

fn init_logging(verbose: u8) {
    use tracing_subscriber::EnvFilter;
    let default = match verbose {
        0 => "warn",
        1 => "info",
        2 => "debug",
        _ => "trace",
    };
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new(default));
    // Colour codes only for a terminal: a log redirected to a file stays plain text.
    let ansi = std::io::IsTerminal::is_terminal(&std::io::stderr());
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(ansi)
        .with_target(false)
        .init();
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    init_logging(cli.verbose);
    let result = if cli.version {
        version::print()
    } else {
        match cli.command {
            Some(Command::Bench(args)) => bench::run(args),
            Some(Command::Experiment(args)) => experiment::run(args),
            Some(Command::Simulate(args)) => simulate::run(args),
            Some(Command::Run(args)) => run::run(*args),
            Some(Command::Predict(args)) => predict::run(args),
            Some(Command::Calibrate(args)) => calibrate::run(args),
            Some(Command::Explain(args)) => explain::run(args),
            Some(Command::Plot(args)) => plot::run(args),
            Some(Command::Serve(args)) => serve::run(args),
            Some(Command::Loadgen(args)) => loadgen::run(args),
            Some(Command::Probe(args)) => probe::run(args),
            Some(Command::Validate(args)) => validate::run(args),
            Some(Command::Model(args)) => model_cmd::run(args),
            Some(Command::Host(args)) => host_cmd::run(args),
            Some(Command::Routing(args)) => routing::run(args),
            Some(Command::Tune(args)) => tune::run(*args),
            None => {
                use clap::CommandFactory;
                let _ = Cli::command().print_help();
                Ok(())
            }
        }
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            if let Some(io) = e.downcast_ref::<std::io::Error>() {
                if io.kind() == std::io::ErrorKind::BrokenPipe {
                    return ExitCode::SUCCESS;
                }
            }
            if let Some(check) = e.downcast_ref::<CheckFailed>() {
                eprintln!("ft: check failed: {check}");
                return ExitCode::from(1);
            }
            eprintln!("ft: error: {e:#}");
            ExitCode::from(2)
        }
    }
}
