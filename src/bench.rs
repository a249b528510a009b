//! `ft bench`: micro-benchmarks (placeholder until the kernels land).
use anyhow::Result;

/// Arguments of `ft bench`.
#[derive(Debug, clap::Args)]
pub struct Args {}

/// Run a benchmark.
pub fn run(_args: Args) -> Result<()> {
    anyhow::bail!("ft bench is not built yet")
}
