//! `ft bench`: micro-benchmarks, one file per benchmark (`bench_cpu.rs`, `bench_bw.rs`).
use anyhow::Result;

/// Arguments of `ft bench`.
#[derive(Debug, clap::Args)]
pub struct Args {
    #[command(subcommand)]
    pub command: BenchCommand,
}

/// The benchmarks.
#[derive(Debug, clap::Subcommand)]
pub enum BenchCommand {
    /// CPU expert kernels: weight bytes per second against STREAM read with the same threads.
    Cpu(crate::bench_cpu::Args),
    /// The legacy ratio's two bandwidths (CPU MoE GB/s, PCIe gather GB/s).
    Bw(crate::bench_bw::Args),
}

/// Run a benchmark.
pub fn run(args: Args) -> Result<()> {
    match args.command {
        BenchCommand::Cpu(a) => crate::bench_cpu::run(a),
        BenchCommand::Bw(a) => crate::bench_bw::run(a),
    }
}
