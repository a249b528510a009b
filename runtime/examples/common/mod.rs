//! What the device micro-benches of `runtime/examples` share: their command line.

use ft_runtime::device::DeviceKind;

/// The arguments every bench takes (flattened into its own).
#[derive(clap::Args)]
pub struct BenchArgs {
    /// cuda or host.
    #[arg(long, default_value = "cuda")]
    pub device: DeviceKind,
    /// Folder the bench writes its results into.
    #[arg(long, default_value = ".")]
    pub out: std::path::PathBuf,
    /// Repetitions of each timing (the median is kept).
    #[arg(long, default_value_t = 20)]
    pub reps: usize,
}
