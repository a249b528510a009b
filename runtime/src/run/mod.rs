//! `ft run` as a library: decode on the real runtime with one strategy (or several in turn)
//! and report what happened, so that a program can run what the CLI runs.
//!
//! A [`RunRequest`] (the command's inputs, as given) is validated into a [`plan::RunPlan`]
//! before any memory is touched: the model (with `--layers` applied), the strategies
//! ([`variant`]: `auto` resolved by the performance model of `--host`), the cache size, and
//! the memory the run needs on this machine ([`memory`]), refused with an error naming the
//! flag to change when it does not fit. [`execute`] then builds the engine, measures the
//! link's linear H2D bandwidth (for the PCIe bound), reads the bank STREAM-style and takes
//! the CPU check before each round where a CPU share runs (the CPU's same-run ceiling, and
//! where `--host` is a profile, the speed an auto fraction is decided at), decodes the
//! warm-up and measured steps, and returns the reports ([`report`]) with any Chrome trace or
//! block timelines written. Printing them is the binary's.

/// Return a [`RunError::Input`] built like `format!`.
macro_rules! bail {
    ($($arg:tt)*) => {
        return Err($crate::run::RunError::input(format!($($arg)*)))
    };
}

mod error;
pub mod memory;
mod multi;
pub mod plan;
pub mod report;
mod single;
pub mod variant;

use std::path::PathBuf;

use ft_model::cache::CacheOptions;

pub use error::{BoxError, Context, Result, RunError};
pub use report::{CpuBound, GpuReport, MultiRunReport, PcieBound, RunReport};

use crate::cpu_pool::PoolWait;
use crate::device::{Device, DeviceKind, HostDeviceConfig};
use crate::engine::probe::{probe_hybrid_overhead, OverheadReport};
use crate::engine::EngineSettings;

/// The inputs of a run as the command line gives them (strings where the flag's own parsing
/// names it in its error); [`plan::RunPlan::new`] validates them.
#[derive(Debug, Clone)]
pub struct RunRequest {
    /// Model: a preset name, a model TOML file, a Hugging Face config.json or a GGUF file.
    pub model: String,
    /// `--strategy` as given (`hybrid:0.4`, `layer-split:auto`, ...).
    pub strategy: Option<String>,
    /// `--interleave`'s items (`[LABEL=]STRATEGY[:P]`).
    pub interleave: Vec<String>,
    /// Hybrid's fetch fraction as given (a number or auto).
    pub fetch_fraction: Option<String>,
    /// Host whose performance model resolves `auto` (a preset, a host TOML, a profile JSON).
    pub host: Option<String>,
    /// Decide an auto fraction at the profile's probed CPU speed, not at the check before
    /// the first round.
    pub no_cpu_check: bool,
    /// Concurrent streams.
    pub streams: usize,
    /// Measured decode steps.
    pub steps: usize,
    /// Warm-up steps before them.
    pub warmup: usize,
    /// Expert cache slots.
    pub cache_slots: Option<usize>,
    /// Expert cache size in GiB (2^30 bytes).
    pub cache_gb: Option<f64>,
    /// The cache's policy, topology, slots per layer and admission.
    pub cache_options: CacheOptions,
    /// Routing: a preset, a process TOML or a trace file.
    pub routing: String,
    /// Record the routing of every step to this trace file.
    pub record: Option<PathBuf>,
    /// Context length of every stream at the first step, tokens.
    pub context: usize,
    /// CPU pool workers (default: cores - 1 on CUDA, 1 on the host device).
    pub threads: Option<usize>,
    /// cuda, host, or auto.
    pub device: String,
    /// Run only the first N MoE layers of the model's geometry.
    pub layers: Option<usize>,
    /// Seed of the expert weights, the routing process and the inputs.
    pub seed: u64,
    /// Write a Chrome trace of every step to this file.
    pub trace_out: Option<PathBuf>,
    /// Write the expert kernels' block timelines of the last measured step to this CSV.
    pub stamps_out: Option<PathBuf>,
    /// Also run fresh and as offload, and report the outputs' deviations.
    pub compare_numerics: bool,
    /// GPU expert activation path (int8 or f32; default the format's preferred).
    pub gpu_act: Option<String>,
    /// CPU expert activation path.
    pub cpu_act: Option<String>,
    /// Combine order of expert outputs: fixed or fast.
    pub combine: String,
    /// Gather method: copy-engine or zero-copy.
    pub gather: String,
    /// How the CPU pool waits between layers (spin, spin-beside, park).
    pub pool_wait: Option<String>,
    /// The engine's settings.
    pub engine: EngineSettings,
    /// Host device only: emulated link bandwidth, GB/s.
    pub link_gbps: Option<f64>,
    /// Record no per-operation timing events.
    pub no_timeline: bool,
    /// Decode the same steps this many times and report the median repetition.
    pub repeat: usize,
    /// Measure hybrid's fixed cost per layer with tiny work instead of decoding.
    pub probe_overhead: bool,
    /// GPUs decoding together.
    pub gpus: u32,
    /// How experts are laid out over the GPUs: sharded or tensor-parallel.
    pub placement: String,
}

/// Where a run reports its progress (a progress bar; [`NoProgress`] for none).
pub trait Progress {
    /// The run has `total` steps to decode in all.
    fn start(&mut self, total: u64);
    /// `done` of them are decoded.
    fn position(&mut self, done: u64);
    /// What is decoding now (a variant's label).
    fn message(&mut self, message: &str);
    /// The decoding is over.
    fn finish(&mut self);
}

/// No progress reporting.
pub struct NoProgress;

impl Progress for NoProgress {
    fn start(&mut self, _total: u64) {}
    fn position(&mut self, _done: u64) {}
    fn message(&mut self, _message: &str) {}
    fn finish(&mut self) {}
}

/// What a run produced.
#[derive(Debug, Clone)]
pub enum RunOutcome {
    /// A run on one GPU: one report per variant, in the order given.
    Single(Vec<RunReport>),
    /// A run on several GPUs.
    Multi(Box<MultiRunReport>),
    /// `--probe-overhead`: hybrid's fixed cost per layer.
    Overhead(OverheadReport),
}

/// Plan and execute `req` ([`plan::RunPlan::new`], then [`execute`]).
pub fn run(req: &RunRequest, progress: &mut dyn Progress) -> Result<RunOutcome> {
    let setup = plan::Setup::new(req)?;
    if req.probe_overhead {
        return probe_overhead(req, &setup).map(RunOutcome::Overhead);
    }
    let plan = plan::RunPlan::new(req, setup)?;
    execute(req, plan, progress)
}

/// Execute a validated plan: the multi-GPU engine for `--gpus` over 1, else one engine that
/// decodes every variant in turn.
pub fn execute(
    req: &RunRequest,
    plan: plan::RunPlan,
    progress: &mut dyn Progress,
) -> Result<RunOutcome> {
    if plan.layout.is_multi() {
        multi::run(req, plan, progress).map(|r| RunOutcome::Multi(Box::new(r)))
    } else {
        single::run(req, plan, progress).map(RunOutcome::Single)
    }
}

/// `--probe-overhead`: hybrid's fixed cost per layer, measured with tiny work.
fn probe_overhead(req: &RunRequest, setup: &plan::Setup) -> Result<OverheadReport> {
    let device = match setup.kind {
        DeviceKind::Host => Device::host(HostDeviceConfig {
            memory_bytes: 256 << 20,
            link_gbps: req.link_gbps,
            kernel_threads: setup.cores.saturating_sub(setup.threads + 1).max(1),
        })?,
        DeviceKind::Cuda => Device::cuda(0)?,
    };
    let wait: PoolWait = setup.pool_wait;
    Ok(probe_hybrid_overhead(&device, setup.threads, wait)?)
}
