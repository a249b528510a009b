//! Probes: short measurements of every cost term of the analytic model on the real runtime,
//! and the fitted host profile made from them.
//!
//! Why it exists: the model's parameters ([`ft_model::perf::PerfParams`]) are only as good as
//! the measurements they are fitted to, and the legacy ratio failed exactly because it
//! measured two bandwidths on the wrong expert size, alone (design mechanisms 1 to 7). This
//! module measures, with the same device operations the decode engine issues (one
//! `copy_h2d_regions` per gather, the engine's [`CpuExecutor`], one `launch_experts`, one
//! `launch_dense`), every term the model has, fills [`ProbeSamples`], and hands them to the
//! one fitting implementation ([`ft_model::perf::fit`]). Nothing here fits or predicts.
//!
//! # The probes (sample types and their semantics: `ft_model::perf::fit`)
//! - `gather`: a layer's gather of `n` expert regions of `b` bytes from a host bank into
//!   device memory, `n` in {1, k/2, k, 2k, the bench's 8} (`k` = top-k), three sizes (the
//!   served expert, a quarter of it, and a second expert geometry), isolated, and contended
//!   (while the CPU kernel streams other experts with the serving and half the threads, at
//!   most the hardware threads less two, so that the load's thread and the measuring one
//!   do not take a core from the pool).
//! - `cpu-step`: one layer call of the engine's CPU executor over `n` experts with `t` tokens
//!   each, two expert geometries, `t` in {1, the most streams}, at the serving threads and at
//!   a half and a quarter of them; isolated and contended (while a gather runs throughout).
//! - `gpu-experts`: one `launch_experts` over `n` experts already in device memory.
//! - `dense`: one layer's dense kernel at 1 and the most streams, contexts 1, short, long.
//! - `round-trip`: a hybrid layer's synchronisation without expert work (activations down,
//!   the host waiting on the event, the partial output read back by the device).
//! - `step`: a few dozen decode steps of every strategy through the decode engine
//!   ([`crate::engine`]), instrumented per layer, on **a few layers of the served geometry**
//!   (`layers`: the per-layer costs are what is fitted, and a full bank of a large model does
//!   not fill in seconds); blocks of steps alternate between calibration and validation.
//!
//! # One host bank
//! The served experts live in one bank: the decode engine's ([`Engine::bank`]), filled once;
//! every micro-probe of the served size reads it. The second expert geometry (the bench's
//! tuning geometry `bench-nvfp4` in the served format when the sizes differ by more than
//! [`SIZE_RATIO_DISTINCT`], else the served one with a quarter of its FFN width) has its own
//! small bank of at most [`ALT_BANK_BYTES`]: a CPU kernel needs valid experts of that shape.
//! The `resident` strategy needs its own engine (another cache size, so another bank).
//!
//! # Budget
//! The whole probe has a wall-clock budget ([`ProbeConfig::budget_s`], 20 s by default on
//! the GPU machine). Setup (device, banks, kernels) and the end-to-end runs (a fixed number
//! of steps) come first; what is left is shared among the micro-probes by fixed weights
//! ([`MICRO_WEIGHTS`]) and within a probe equally among its points. A point is repeated
//! until its share is spent, at least [`MIN_REPS`] and at most [`MAX_REPS`] times after one
//! warm-up, and reduced to its median. Banks are rotated through so that repeated points
//! read DRAM, not a cache.
//!
//! How far the budget may be overrun, and why: the setup (opening the device, pinning and
//! filling the banks: about a second per 4 GiB of bank on the GPU machine), the end-to-end
//! runs (a fixed number of steps, `warmup_steps + steps` per strategy, stream count and pool
//! size) and [`MIN_REPS`] repetitions of each micro-probe point are the least a fit needs,
//! so they run whatever the budget; everything else is cut to fit it. A disturbed probe is
//! repeated ([`ProbeConfig::attempts`]) only while the budget has room for another probe
//! as long as the last one, so repeats never take a probe past its budget. Where the
//! minimum alone is longer than the budget, the outcome says so in a note (and a warning):
//! `wall_s` against `budget_s` is reported either way.

pub mod report;

use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use ft_kernels::{ActivationPath, ExpertWork};
use ft_model::cache::CacheOptions;
use ft_model::host::{CpuSpec, EngineSpec, GpuSpec, HostSpec, PcieSpec, GIB};
use ft_model::perf::fit::{
    fit, CpuStepSample, DenseSample, FitConfig, FitReport, GatherSample, GpuExpertSample,
    HostSample, LinkSample, ProbeSamples, RoundTripSample, SampleRole, StepSample,
};
use ft_model::perf::legacy::BenchBw;
use ft_model::perf::{ExpertShape, LayerCounts as PerfCounts, PerfModel, PerfParams, StepShape};
use ft_model::profile::{now_unix_s, CpuCheck, HostFingerprint, Profile, ProfileKey};
use ft_model::routing;
use ft_model::{ExpertFormat, ExpertId, ModelSpec, MoeGeometry, Strategy, StrategyKind};
use serde::{Deserialize, Serialize};

use crate::bank::HostBank;
use crate::cpu_pool::{CpuExecutor, PoolWait};
use crate::dense::DenseBuffers;
use crate::device::{Device, DeviceKind};
use crate::engine::{
    decode, draw_routing, token_input, DecodeOptions, Engine, EngineConfig, EngineSettings,
};
use crate::error::{Result, RuntimeError};
use crate::gather::CopyRegion;
use crate::gpu_experts::{ExpertStep, ExpertTask, TokenWeight};
use crate::instrument::{
    HostCpuTimes, LayerCounts as RunCounts, LayerRecord, RunSummary, StealMeter, StepRecord,
    STEAL_NOTABLE_FRACTION,
};
use crate::slots::{SlotPool, DEFAULT_RESERVE_BYTES};

/// Default wall-clock budget of the whole probe, in s (the issue's limit on the GPU machine).
pub const DEFAULT_BUDGET_S: f64 = 20.0;

/// Fewest timed repetitions of a point (after its warm-up), whatever the budget: a median of
/// three is the least that rejects one outlier.
pub const MIN_REPS: usize = 3;

/// Most timed repetitions of a point: past this the median moves by less than the run noise.
pub const MAX_REPS: usize = 200;

/// Largest host bank the end-to-end probe fills when `layers` is not given, in bytes
/// (4 GiB: about a second to pin and fill on the GPU machine). The layer count is the most
/// that fits, at least 1 and at most [`MAX_AUTO_LAYERS`].
pub const E2E_BANK_BYTES: u64 = 4 << 30;

/// Most layers the end-to-end probe runs when `layers` is not given: per-layer costs are what
/// is fitted, and four layers already show the layer-to-layer pipeline.
pub const MAX_AUTO_LAYERS: usize = 4;

/// Largest bank of the second expert geometry, in bytes (1 GiB: far beyond any last-level
/// cache, so rotating through it reads DRAM).
pub const ALT_BANK_BYTES: u64 = 1 << 30;

/// Two expert sizes closer than this factor cannot separate per-expert costs from bytes.
pub const SIZE_RATIO_DISTINCT: f64 = 1.5;

/// Beyond this factor the bench geometry is too far from the served one to be a useful
/// second size (a toy model against 8 MB experts); the served geometry is rescaled instead.
pub const SIZE_RATIO_FAR: f64 = 16.0;

/// Factor by which the second geometry's FFN width differs from the served one when the
/// bench geometry is not used.
pub const ALT_INTERMEDIATE_FACTOR: usize = 4;

/// Experts per step of the legacy bench (`ft bench bw`, the reference engine's): the top-k of
/// its tuning geometry `bench-nvfp4`.
pub const BENCH_EXPERTS: usize = 8;

/// Name of the reference engine's tuning geometry (the legacy bench's expert size).
pub const BENCH_MODEL: &str = "bench-nvfp4";

/// Bytes of the link probe's single copy (prior of the linear H2D/D2H rates), at most.
pub const LINK_PROBE_BYTES: usize = 64 << 20;

/// Share of the micro-probes' budget each gets, in `MICRO_PROBES` order: the gather and
/// CPU probes have the most points and carry the most parameters.
pub const MICRO_WEIGHTS: [f64; 7] = [0.22, 0.12, 0.26, 0.14, 0.12, 0.08, 0.06];

/// The micro-probes in run order (names as in `ft_model::perf::fit`).
pub const MICRO_PROBES: [&str; 7] = [
    "gather",
    "gather-contended",
    "cpu-step",
    "cpu-step-contended",
    "gpu-experts",
    "dense",
    "round-trip",
];

/// Seed of the probe's expert weights and inputs ("PROBE").
pub const PROBE_SEED: u64 = 0x50_524F_4245;

/// The device memory kept free beside the engine's slots is at most its free memory over
/// this (the engine's 1 GiB default would leave a small host-emulated device nothing).
const RESERVE_SHARE_MAX: u64 = 4;

/// Fraction of the wall budget kept back for the fit and writing the profile.
const FIT_RESERVE: f64 = 0.05;

/// Overrun of the budget, as a share of it, beyond which the probe's notes (and a warning)
/// say that its minimum work took longer than the budget: 10%, the scatter of the setup's
/// timing from run to run.
const BUDGET_NOTE_OVERRUN: f64 = 0.1;

/// How the probe runs. Everything with a unit says so.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ProbeConfig {
    /// Serving threads of the CPU expert pool; 0: the engine's default (cores - 1).
    pub threads: usize,
    /// How the CPU pool waits between layers; `None`: as `ft run` serves, spin on CUDA
    /// (when the pool and the host thread fit the hardware threads), park on the
    /// host-emulated device (whose stream workers need the cores).
    pub pool_wait: Option<PoolWait>,
    /// Stream counts of the end-to-end probe; the largest is also the most tokens per
    /// expert of the CPU and GPU probes and the most streams of the dense probe.
    pub streams: Vec<usize>,
    /// Context of the end-to-end probe and the dense probe's short context, in tokens.
    pub context: usize,
    /// The dense probe's long context, in tokens.
    pub long_context: usize,
    /// Layers of the served geometry the end-to-end probe runs; `None`: as many as fit in
    /// [`E2E_BANK_BYTES`], 1 to [`MAX_AUTO_LAYERS`].
    pub layers: Option<usize>,
    /// Share of the end-to-end model's routed experts the GPU cache holds (0 to 1).
    pub cache_residency: f64,
    /// Hybrid's fetch fractions of the end-to-end probe.
    pub hybrid_fractions: Vec<f64>,
    /// Strategies of the end-to-end probe.
    pub strategies: Vec<StrategyKind>,
    /// Further CPU pool sizes at which the end-to-end probe runs the strategies with a CPU
    /// share again (`cpu`, and `hybrid` at its middle fraction, at every stream count), so
    /// that the fit measures the serving slowdown there too
    /// ([`ft_model::perf::PerfParams::cpu_serving_slowdown_at`]); `None`: a quarter of the
    /// serving threads (the smallest count the `cpu-step` probe measures), where that
    /// differs from them.
    pub slowdown_threads: Option<Vec<usize>>,
    /// Warm-up steps of each end-to-end run (fill the cache; not measured).
    pub warmup_steps: usize,
    /// Measured steps of each end-to-end run.
    pub steps: usize,
    /// Blocks the measured steps are cut into (one [`StepSample`] each); even blocks
    /// calibrate, odd ones validate. Six (of four steps) give each strategy six calibration
    /// blocks over the two stream counts, so that the fit's median per-layer overhead is
    /// not set by one preempted step (with four, the median of two per stream count was
    /// their mean, and one slow block moved it by 300 us; H200, 2026-12-04).
    pub blocks: usize,
    /// Routing of the end-to-end probe: a preset, process TOML or trace.
    pub routing: String,
    /// Seed of the weights, inputs and routing.
    pub seed: u64,
    /// Wall-clock budget of the whole probe, in s.
    pub budget_s: f64,
    /// Largest share of the machine's CPU time the hypervisor may take (steal) during a
    /// probe before it counts as disturbed: a probe of a VM whose vCPUs were stolen fits a
    /// slower host than the one that serves (in the H200 grid of 2026-12-05T04:48Z the
    /// configurations whose runs lost 4 to 17% of the CPU time ran up to 50% slower than
    /// predicted; the grid re-runs those, and the probe now does the same).
    pub max_steal: f64,
    /// Largest change of the bank's read rate (the CPU's ceiling, read at the start and at
    /// the end of the probe) before a probe counts as disturbed, as a share of the first
    /// reading. Steal does not show a neighbour's memory traffic: the 04:48Z grid's probes
    /// saw 0.2 to 1.1% steal and a read rate 35% below the previous grid's, and the rate
    /// moved by as much between two probes 20 s apart.
    pub max_ceiling_drift: f64,
    /// Most probes while they are disturbed (at least 1); the least disturbed is fitted.
    pub attempts: usize,
    /// The engine's settings the end-to-end probe runs with: those of the engine the
    /// profile will predict ([`EngineSettings`], part of the profile key).
    pub engine: EngineSettings,
    /// The cache the end-to-end probe runs with (policy, topology, admission; part of the
    /// profile key).
    pub cache_options: CacheOptions,
}

impl Default for ProbeConfig {
    fn default() -> Self {
        ProbeConfig {
            threads: 0,
            pool_wait: None,
            streams: vec![1, 4],
            context: 1024,
            long_context: 32768,
            layers: None,
            cache_residency: 0.15,
            hybrid_fractions: vec![0.25, 0.5, 0.75],
            strategies: StrategyKind::ALL.to_vec(),
            slowdown_threads: None,
            warmup_steps: 8,
            steps: 24,
            blocks: 6,
            routing: "typical".to_string(),
            seed: PROBE_SEED,
            budget_s: DEFAULT_BUDGET_S,
            max_steal: STEAL_NOTABLE_FRACTION,
            max_ceiling_drift: 0.15,
            attempts: 2,
            engine: EngineSettings::default(),
            cache_options: CacheOptions::default(),
        }
    }
}

impl ProbeConfig {
    /// Check the configuration; errors name the flag.
    pub fn validate(&self) -> Result<()> {
        if self.streams.is_empty() || self.streams.contains(&0) {
            return Err(RuntimeError::invalid(
                "--streams",
                "give stream counts of at least 1",
            ));
        }
        if self.context == 0 || self.long_context == 0 {
            return Err(RuntimeError::invalid(
                "--context",
                "must be at least 1 token",
            ));
        }
        if self.layers == Some(0) {
            return Err(RuntimeError::invalid("--layers", "must be at least 1"));
        }
        self.engine.check()?;
        if !(self.cache_residency > 0.0 && self.cache_residency < 1.0) {
            return Err(RuntimeError::invalid(
                "--cache-residency",
                format!("{} is outside (0, 1)", self.cache_residency),
            ));
        }
        if let Some(f) = self
            .hybrid_fractions
            .iter()
            .find(|f| !(0.0..=1.0).contains(*f))
        {
            return Err(RuntimeError::invalid(
                "--hybrid-fractions",
                format!("{f} is outside [0, 1]"),
            ));
        }
        if self.steps == 0 || self.blocks == 0 || self.blocks > self.steps {
            return Err(RuntimeError::invalid(
                "--steps",
                format!(
                    "{} measured steps cannot make {} blocks",
                    self.steps, self.blocks
                ),
            ));
        }
        if !(self.budget_s.is_finite() && self.budget_s > 0.0) {
            return Err(RuntimeError::invalid(
                "--budget-s",
                format!("{} is not a positive time", self.budget_s),
            ));
        }
        if !(0.0..=1.0).contains(&self.max_steal) {
            return Err(RuntimeError::invalid(
                "--max-steal",
                format!("{} is not a share of the CPU time (0 to 1)", self.max_steal),
            ));
        }
        if !(self.max_ceiling_drift.is_finite() && self.max_ceiling_drift > 0.0) {
            return Err(RuntimeError::invalid(
                "--max-ceiling-drift",
                format!("{} is not a positive share", self.max_ceiling_drift),
            ));
        }
        if self.attempts == 0 {
            return Err(RuntimeError::invalid("--attempts", "must be at least 1"));
        }
        Ok(())
    }

    fn max_streams(&self) -> usize {
        self.streams.iter().copied().max().unwrap_or(1)
    }
}

/// The host's CPU as the fingerprint and the prior need it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CpuTopology {
    /// CPU model name (`/proc/cpuinfo`).
    pub model: String,
    /// Physical cores (distinct (socket, core) pairs; the hardware threads where unknown).
    pub cores: u32,
    /// Hardware threads online.
    pub threads: u32,
    /// NUMA nodes (`/sys/devices/system/node`; 1 where unknown).
    pub numa_nodes: u32,
}

impl CpuTopology {
    /// Read the topology of this machine (Linux files; sensible fallbacks elsewhere).
    pub fn detect() -> Self {
        let fallback = std::thread::available_parallelism().map_or(1, |n| n.get()) as u32;
        let info = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
        let mut model = String::new();
        let mut threads = 0u32;
        let mut cores = std::collections::BTreeSet::new();
        let (mut phys, mut core) = (String::new(), String::new());
        for line in info.lines() {
            let Some((k, v)) = line.split_once(':') else {
                if !core.is_empty() {
                    cores.insert((phys.clone(), core.clone()));
                }
                phys.clear();
                core.clear();
                continue;
            };
            let (k, v) = (k.trim(), v.trim());
            match k {
                "processor" => threads += 1,
                "model name" if model.is_empty() => model = v.to_string(),
                "physical id" => phys = v.to_string(),
                "core id" => core = v.to_string(),
                _ => {}
            }
        }
        if !core.is_empty() {
            cores.insert((phys, core));
        }
        let threads = if threads == 0 { fallback } else { threads };
        let cores = if cores.is_empty() {
            threads
        } else {
            (cores.len() as u32).min(threads)
        };
        let numa_nodes = std::fs::read_dir("/sys/devices/system/node")
            .map(|d| {
                d.flatten()
                    .filter(|e| {
                        let n = e.file_name().to_string_lossy().into_owned();
                        n.strip_prefix("node")
                            .is_some_and(|r| !r.is_empty() && r.chars().all(|c| c.is_ascii_digit()))
                    })
                    .count() as u32
            })
            .unwrap_or(0)
            .max(1);
        CpuTopology {
            model: if model.is_empty() {
                std::env::consts::ARCH.to_string()
            } else {
                model
            },
            cores: cores.max(1),
            threads: threads.max(1),
            numa_nodes,
        }
    }
}

/// The host fingerprint of a profile measured on `device` (GPU name and driver as the
/// device reports them, the CPU model, hardware threads and NUMA nodes), serving with
/// `gpu_act` on a CUDA device (recorded beside its kernel and copy paths: a profile that
/// timed the f32 GPU path does not predict the int8 one) and with the engine's `settings`
/// on any device (a profile that timed other fetch chunks timed another engine), and with
/// the cache's options where they are not the default (a profile of another admission or
/// topology measured other misses; the default's key is as it was before the options).
pub fn host_fingerprint(
    device: &Device,
    cpu: &CpuTopology,
    gpu_act: ActivationPath,
    settings: &EngineSettings,
    cache: &CacheOptions,
) -> HostFingerprint {
    let info = device.info();
    let cache = if *cache == CacheOptions::default() {
        String::new()
    } else {
        format!("; cache {cache}")
    };
    HostFingerprint {
        gpu_name: info.name.clone(),
        gpu_driver: info
            .driver_version
            .clone()
            .unwrap_or_else(|| format!("none ({} device)", info.kind)),
        cpu_model: cpu.model.clone(),
        threads: cpu.threads,
        numa_nodes: cpu.numa_nodes,
        gpu_paths: match info.cuda_tuning {
            Some(t) => format!("{t}, {gpu_act} activations; engine {settings}{cache}"),
            None => format!("engine {settings}{cache}"),
        },
    }
}

/// The serving threads of the CPU pool: the flag, else cores - 1 (the engine's default).
pub fn serving_threads(config: &ProbeConfig, cpu: &CpuTopology) -> usize {
    if config.threads > 0 {
        config.threads
    } else {
        EngineConfig::default()
            .threads
            .min(cpu.threads as usize)
            .max(1)
    }
}

/// Layers of the served geometry the end-to-end probe runs (see [`ProbeConfig::layers`]).
pub fn e2e_layers(model: &ModelSpec, config: &ProbeConfig) -> usize {
    let g = &model.geometry;
    let layer_bytes = SlotPool::stride_for(model.expert_bytes()) as u64 * g.experts as u64;
    let auto = (E2E_BANK_BYTES / layer_bytes.max(1)).clamp(1, MAX_AUTO_LAYERS as u64) as usize;
    config.layers.unwrap_or(auto).min(g.moe_layers).max(1)
}

/// Which bank a probe point reads.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum ExpertSize {
    /// The served experts (the engine's bank).
    Served,
    /// A quarter of each served expert (gather only: regions of the served bank).
    Quarter,
    /// The second expert geometry (its own bank).
    Alt,
}

/// Wall time of one probe, for the report.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ProbeTiming {
    /// Probe (or setup phase) name.
    pub name: String,
    /// Points measured (0 for a setup phase).
    pub points: usize,
    /// Timed repetitions over all points.
    pub reps: usize,
    /// Wall time, in s.
    pub wall_s: f64,
}

/// One end-to-end run, summarised (its blocks are the `step` samples).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct E2eRun {
    /// The strategy that ran.
    pub strategy: Strategy,
    /// Threads of the CPU pool.
    #[serde(default)]
    pub threads: usize,
    /// Streams.
    pub streams: usize,
    /// Layers of the served geometry run.
    pub layers: usize,
    /// Cache slots (0 for resident, which holds every expert).
    pub cache_slots: usize,
    /// Measured decode rate of each stream, tok/s (of the `layers`-layer model).
    pub tok_s_per_stream: f64,
    /// Mean step wall time, in us.
    pub step_us: f64,
    /// Measured expert-level miss rate.
    pub miss_rate: f64,
}

/// What the probes measured, before the fit.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ProbeOutcome {
    /// The served model (all its layers: what the profile is for).
    pub model: ModelSpec,
    /// Layers of it the end-to-end probe ran.
    pub e2e_layers: usize,
    /// The second expert geometry of the micro-probes, and whether it is the bench's.
    pub alt_geometry: MoeGeometry,
    /// True when the second geometry is the legacy bench's (`bench-nvfp4` in the format).
    pub alt_is_bench: bool,
    /// Serving threads of the CPU pool.
    pub threads: usize,
    /// How the CPU pool waited between layers.
    pub pool_wait: PoolWait,
    /// Every sample.
    pub samples: ProbeSamples,
    /// The legacy bench's four bandwidths at its tuning geometry, measured by the probes
    /// (`None` when neither geometry probed is the bench's).
    pub bench_bw: Option<BenchBw>,
    /// The end-to-end runs.
    pub e2e: Vec<E2eRun>,
    /// Linear host-to-device rate of one large copy, GB/s (the prior's `pcie.h2d_gbs`).
    pub h2d_gbs: f64,
    /// Linear device-to-host rate of one large copy, GB/s.
    pub d2h_gbs: f64,
    /// STREAM-like read rate of the serving threads, GB/s.
    pub stream_read_gbs: f64,
    /// The CPU.
    pub cpu: CpuTopology,
    /// Wall time of every phase.
    pub timings: Vec<ProbeTiming>,
    /// Things the reader should know (skipped strategies, held-back points).
    pub notes: Vec<String>,
    /// Wall time of the probes (setup included), in s.
    pub wall_s: f64,
    /// The same read of the bank at the start of the probe (after setup), GB/s: with
    /// `stream_read_gbs` (the end), how much the CPU's ceiling moved while it ran.
    #[serde(default)]
    pub stream_read_start_gbs: Option<f64>,
    /// Share of the machine's CPU time the hypervisor took during the probe (steal, from
    /// `/proc/stat`); `None` where it cannot be read.
    #[serde(default)]
    pub host_steal_fraction: Option<f64>,
    /// Probes run to get this one (more than 1 when the earlier ones were disturbed,
    /// [`ProbeOutcome::disturbance`]).
    #[serde(default = "one")]
    pub attempts: usize,
    /// The engine's settings the end-to-end probe ran ([`ProbeConfig::engine`]): the
    /// profile's parameters record them ([`PerfParams::engine_settings`]), so that the model
    /// times the step this engine runs (absent in outcomes written before: the defaults).
    #[serde(default)]
    pub engine: EngineSettings,
    /// The CPU check ([`crate::cpu_check`]) at each probed thread count, taken after setup
    /// (empty in outcomes written before 2026-12-06).
    #[serde(default)]
    pub cpu_checks_start: Vec<CpuCheck>,
    /// The same checks at the end of the probe; the profile keeps, per thread count, the
    /// geometric mean of the two ([`probe_cpu_checks`]).
    #[serde(default)]
    pub cpu_checks_end: Vec<CpuCheck>,
}

fn one() -> usize {
    1
}

impl ProbeOutcome {
    /// How much the bank's read rate moved between the probe's start and end, as a share of
    /// the start's (`None` without a start reading).
    pub fn ceiling_drift(&self) -> Option<f64> {
        let start = self.stream_read_start_gbs.filter(|&g| g > 0.0)?;
        Some((self.stream_read_gbs / start - 1.0).abs())
    }

    /// How disturbed the probe was against `config`'s limits: the larger of steal over
    /// [`ProbeConfig::max_steal`] and ceiling drift over [`ProbeConfig::max_ceiling_drift`]
    /// (unreadable ones count 0); above 1 the probe is repeated.
    pub fn disturbance(&self, config: &ProbeConfig) -> f64 {
        let over = |value: Option<f64>, limit: f64| match value {
            Some(v) if limit > 0.0 => v / limit,
            Some(v) if v > 0.0 => f64::INFINITY,
            _ => 0.0,
        };
        over(self.host_steal_fraction, config.max_steal)
            .max(over(self.ceiling_drift(), config.max_ceiling_drift))
    }

    /// What disturbed the probe, in words (empty when nothing passed its limit).
    fn disturbed_by(&self, config: &ProbeConfig) -> Vec<String> {
        let mut why = Vec::new();
        if let Some(f) = self.host_steal_fraction.filter(|&f| f > config.max_steal) {
            why.push(format!(
                "the hypervisor took {:.1}% of the CPU time (limit {:.1}%)",
                100.0 * f,
                100.0 * config.max_steal
            ));
        }
        if let (Some(d), Some(start)) = (self.ceiling_drift(), self.stream_read_start_gbs) {
            if d > config.max_ceiling_drift {
                why.push(format!(
                    "the bank's read rate moved from {start:.1} to {:.1} GB/s (limit {:.0}%)",
                    self.stream_read_gbs,
                    100.0 * config.max_ceiling_drift
                ));
            }
        }
        why
    }
}

/// Progress of a probe: phase name and share of the budget spent (0 to 1).
pub type Progress<'a> = &'a mut dyn FnMut(&str, f64);

/// Run every probe on `device` for `model` (see the module docs). A disturbed probe (the
/// hypervisor took more than [`ProbeConfig::max_steal`] of the CPU time, or the bank's read
/// rate moved by more than [`ProbeConfig::max_ceiling_drift`] while it ran) is repeated, up
/// to [`ProbeConfig::attempts`] probes; the least disturbed is returned, with a note (and a
/// warning) when even that one is disturbed.
pub fn run(
    device: &Device,
    model: &ModelSpec,
    config: &ProbeConfig,
    progress: Progress<'_>,
) -> Result<ProbeOutcome> {
    config.validate()?;
    model.validate()?;
    let started = Instant::now();
    let budget = Duration::from_secs_f64(config.budget_s);
    // Another attempt only where the budget holds one more as long as the mean so far.
    let room = || {
        let spent = started.elapsed();
        spent < budget && budget - spent >= spent
    };
    let (mut outcome, attempts) = least_disturbed_of(config.attempts, room, |attempt| {
        let start = HostCpuTimes::now();
        let mut outcome = probe_once(device, model, config, progress)?;
        if let (Some(a), Some(b)) = (start, HostCpuTimes::now()) {
            let mut meter = StealMeter::default();
            meter.add(&a, &b);
            outcome.host_steal_fraction = meter.fraction();
        }
        let why = outcome.disturbed_by(config);
        if attempt < config.attempts && !why.is_empty() {
            tracing::warn!(
                attempt,
                "{} during the probe: probing again",
                why.join(" and ")
            );
        }
        let score = outcome.disturbance(config);
        Ok((outcome, score))
    })?;
    outcome.attempts = attempts;
    let wall = started.elapsed().as_secs_f64();
    if wall > config.budget_s * (1.0 + BUDGET_NOTE_OVERRUN) {
        let msg = format!(
            "the probe took {wall:.1} s against a budget of {:.1} s: setup, the end-to-end runs and {MIN_REPS} repetitions per point are the least a fit needs (fewer --steps or --layers make them shorter)",
            config.budget_s
        );
        tracing::warn!("{msg}");
        outcome.notes.push(msg);
    }
    let why = outcome.disturbed_by(config);
    if !why.is_empty() {
        let msg = format!(
            "{} during the probe (the least disturbed of {} probes): its costs describe a busier machine than an undisturbed one",
            why.join(" and "),
            outcome.attempts
        );
        tracing::warn!("{msg}");
        outcome.notes.push(msg);
    } else if outcome.attempts > 1 {
        outcome.notes.push(format!(
            "probed {} times: the earlier probes were disturbed (steal or a moving memory read rate)",
            outcome.attempts
        ));
    }
    Ok(outcome)
}

/// Run `attempt(1)`, `attempt(2)`, ... until one reports a disturbance of at most 1,
/// `attempts` have run or `room()` says there is no time for another; returns the least
/// disturbed (the first of equals) and how many ran.
fn least_disturbed_of<T>(
    attempts: usize,
    mut room: impl FnMut() -> bool,
    mut attempt: impl FnMut(usize) -> Result<(T, f64)>,
) -> Result<(T, usize)> {
    let mut best: Option<(T, f64)> = None;
    let mut ran = 0;
    for i in 1..=attempts.max(1) {
        if i > 1 && !room() {
            break;
        }
        let (value, score) = attempt(i)?;
        ran = i;
        if best.as_ref().is_none_or(|(_, b)| score < *b) {
            best = Some((value, score));
        }
        if score <= 1.0 {
            break;
        }
    }
    let (value, _) = best.expect("at least one attempt runs");
    Ok((value, ran))
}

/// One probe of every kind ([`run`] repeats it while it is disturbed).
fn probe_once(
    device: &Device,
    model: &ModelSpec,
    config: &ProbeConfig,
    progress: Progress<'_>,
) -> Result<ProbeOutcome> {
    let started = Instant::now();
    let budget = Duration::from_secs_f64(config.budget_s);
    let cpu = CpuTopology::detect();
    let threads = serving_threads(config, &cpu);
    let wait = config.pool_wait.unwrap_or(probe_pool_wait(
        device.kind(),
        threads,
        cpu.threads as usize,
    ));
    let layers = e2e_layers(model, config);
    let model_l = model.with_layers(layers);
    let g = model_l.geometry;
    let max_streams = config.max_streams();
    // The paths the engine serves with (`ActivationPath::preferred`), on both sides.
    let act = ActivationPath::preferred(model.format);
    let mut timings = Vec::new();
    let mut notes = vec![format!(
        "the end-to-end probe ran {layers} of the model's {} layers (same geometry; per-layer costs are what is fitted)",
        model.geometry.moe_layers
    )];

    // ---- setup: the engine (and with it the one served bank), the second bank.
    progress("setup", 0.0);
    let t = Instant::now();
    let total = g.experts * g.moe_layers;
    let cache_slots =
        ((config.cache_residency * total as f64).round() as usize).clamp(1, total - 1);
    let engine_config = EngineConfig {
        strategy: Strategy::Offload,
        cache_slots,
        cache_options: config.cache_options.clone(),
        max_streams,
        max_context: config.context + config.warmup_steps + config.steps + 1,
        threads,
        pool_wait: wait,
        gpu_path: act,
        cpu_path: act,
        seed: config.seed,
        timeline: true,
        reserve_bytes: DEFAULT_RESERVE_BYTES.min(device.free_mem_bytes()? / RESERVE_SHARE_MAX),
        settings: config.engine,
        ..EngineConfig::default()
    };
    let mut engine = Engine::new(device, &model_l, &engine_config, None)?;
    let (alt_geometry, alt_is_bench) = alt_geometry(model)?;
    let alt_experts = alt_bank_experts(model.format, &alt_geometry, 2 * g.top_k.max(BENCH_EXPERTS));
    let alt_geometry = MoeGeometry {
        experts: alt_experts,
        top_k: alt_geometry.top_k.min(alt_experts),
        moe_layers: 1,
        ..alt_geometry
    };
    let alt_bank = HostBank::from_seed(device, model.format, &alt_geometry, config.seed ^ 0xA17)?;
    let stream_read_start_gbs = bank_ceiling_gbs(threads, engine.bank())?;
    let extra_threads = slowdown_threads(config, threads);
    let check_threads: Vec<usize> = std::iter::once(threads)
        .chain(extra_threads.iter().copied())
        .collect();
    let cpu_checks_start = cpu_checks_at(&check_threads, wait, engine.bank(), act)?;
    timings.push(ProbeTiming {
        name: "setup (device, banks, kernels)".into(),
        points: 0,
        reps: 0,
        wall_s: t.elapsed().as_secs_f64(),
    });

    // ---- the end-to-end probe.
    progress("step", started.elapsed().as_secs_f64() / config.budget_s);
    let t = Instant::now();
    let mut samples = ProbeSamples::default();
    let mut e2e = Vec::new();
    let mut runs = 0;
    for kind in &config.strategies {
        let strategies: Vec<Strategy> = match kind {
            StrategyKind::Hybrid => config
                .hybrid_fractions
                .iter()
                .map(|&f| Strategy::Hybrid {
                    fetch: ft_model::FetchFraction::Fixed(f),
                })
                .collect(),
            StrategyKind::Resident => continue,
            // Layer split's layers are resident or CPU-only work, whose costs the other
            // strategies calibrate (and its resident slots need an engine of their own).
            StrategyKind::LayerSplit | StrategyKind::LayerSplitCached => continue,
            StrategyKind::Offload | StrategyKind::Cpu => vec![Strategy::from_kind(*kind, None)],
        };
        for strategy in strategies {
            engine.set_strategy(strategy)?;
            for &streams in &config.streams {
                let run = e2e_run(&mut engine, &model_l, config, streams, &mut samples)?;
                e2e.push(run);
                runs += 1;
            }
        }
    }
    // The strategies with a CPU share again at the further pool sizes (the same engine,
    // bank and cache size; a new executor each).
    let middle_fraction = config
        .hybrid_fractions
        .get(config.hybrid_fractions.len() / 2)
        .copied();
    let with_cpu: Vec<Strategy> = config
        .strategies
        .iter()
        .filter_map(|k| match k {
            StrategyKind::Cpu => Some(Strategy::Cpu),
            StrategyKind::Hybrid => middle_fraction.map(|f| Strategy::Hybrid {
                fetch: ft_model::FetchFraction::Fixed(f),
            }),
            StrategyKind::Offload
            | StrategyKind::Resident
            | StrategyKind::LayerSplit
            | StrategyKind::LayerSplitCached => None,
        })
        .collect();
    for &t in &extra_threads {
        engine.set_threads(t)?;
        for strategy in &with_cpu {
            engine.set_strategy(*strategy)?;
            for &streams in &config.streams {
                let run = e2e_run(&mut engine, &model_l, config, streams, &mut samples)?;
                e2e.push(run);
                runs += 1;
            }
        }
    }
    engine.set_threads(threads)?;
    if config.strategies.contains(&StrategyKind::Resident) {
        let resident = EngineConfig {
            strategy: Strategy::Resident,
            ..engine_config.clone()
        };
        match Engine::new(device, &model_l, &resident, None) {
            Ok(mut res) => {
                for &streams in &config.streams {
                    let run = e2e_run(&mut res, &model_l, config, streams, &mut samples)?;
                    e2e.push(run);
                    runs += 1;
                }
            }
            Err(e @ RuntimeError::OutOfMemory { .. }) => {
                notes.push(format!("resident was not probed: {e}"));
            }
            Err(e) => return Err(e),
        }
    }
    timings.push(ProbeTiming {
        name: "step (end to end)".into(),
        points: runs,
        reps: runs * config.steps,
        wall_s: t.elapsed().as_secs_f64(),
    });

    // ---- the micro-probes share what is left of the budget.
    let left = budget
        .saturating_sub(started.elapsed())
        .mul_f64(1.0 - FIT_RESERVE)
        .max(Duration::from_millis(1));
    let sizes = Sizes::new(model, engine.bank(), &alt_geometry, &alt_bank)?;
    let ctx = MicroContext {
        device,
        model: &model_l,
        sizes: &sizes,
        threads,
        wait,
        act,
        max_streams,
        config,
        hw_threads: cpu.threads as usize,
    };
    let mut bench = BenchCollector::default();
    let budget_of = |i: usize| left.mul_f64(MICRO_WEIGHTS[i]);
    for (i, name) in MICRO_PROBES.iter().enumerate() {
        progress(name, started.elapsed().as_secs_f64() / config.budget_s);
        let t = Instant::now();
        let share = budget_of(i);
        let (points, reps) = match i {
            0 => gather_probe(&ctx, share, None, &mut samples, &mut bench)?,
            1 => {
                let mut n = (0, 0);
                let cts = contended_threads(threads, cpu.threads as usize);
                for &ct in &cts {
                    let part = share.div_f64(cts.len() as f64);
                    let r = gather_probe(&ctx, part, Some(ct), &mut samples, &mut bench)?;
                    n = (n.0 + r.0, n.1 + r.1);
                }
                n
            }
            2 => cpu_probe(&ctx, share, false, &mut samples, &mut bench)?,
            3 => cpu_probe(&ctx, share, true, &mut samples, &mut bench)?,
            4 => gpu_probe(&ctx, share, &mut samples)?,
            5 => dense_probe(&ctx, share, &mut samples)?,
            _ => round_trip_probe(&ctx, share, &mut samples)?,
        };
        timings.push(ProbeTiming {
            name: name.to_string(),
            points,
            reps,
            wall_s: t.elapsed().as_secs_f64(),
        });
    }
    let (h2d_gbs, d2h_gbs) = link_probe(device, engine.bank())?;
    let stream_read_gbs = bank_ceiling_gbs(threads, engine.bank())?;
    let cpu_checks_end = cpu_checks_at(&check_threads, wait, engine.bank(), act)?;
    let bench_bw = if alt_is_bench || sizes.served_is_bench {
        bench.finish(if sizes.served_is_bench {
            sizes.served_bytes
        } else {
            sizes.alt_bytes
        })
    } else {
        notes.push(format!(
            "the bench bandwidths ({BENCH_MODEL} geometry) were not measured: neither probed geometry is the bench's"
        ));
        None
    };
    if contended_threads(threads, cpu.threads as usize).len() < 2
        || thread_counts(threads).len() < 2
    {
        notes.push(format!(
            "with {threads} serving thread(s) the thread exponent cannot be measured; it keeps its prior"
        ));
    }
    progress("done", started.elapsed().as_secs_f64() / config.budget_s);
    Ok(ProbeOutcome {
        model: model.clone(),
        e2e_layers: layers,
        alt_geometry,
        alt_is_bench,
        threads,
        pool_wait: wait,
        samples,
        bench_bw,
        e2e,
        h2d_gbs,
        d2h_gbs,
        stream_read_gbs,
        cpu,
        timings,
        notes,
        wall_s: started.elapsed().as_secs_f64(),
        stream_read_start_gbs: Some(stream_read_start_gbs),
        host_steal_fraction: None,
        attempts: 1,
        engine: config.engine,
        cpu_checks_start,
        cpu_checks_end,
    })
}

/// How the probe's CPU pool waits between layers unless `--pool-wait` says otherwise:
/// spinning on a CUDA host with a hardware thread to spare for the rest, else parked. A later
/// CPU check set against the probe's (`ft predict --cpu-check`) times with the same rule.
pub fn probe_pool_wait(kind: DeviceKind, threads: usize, hw_threads: usize) -> PoolWait {
    if kind == DeviceKind::Cuda && threads < hw_threads {
        PoolWait::Spin
    } else {
        PoolWait::Park
    }
}

/// The CPU check ([`crate::cpu_check::measure_on`]) at each of `threads`, from the bank.
fn cpu_checks_at(
    threads: &[usize],
    wait: PoolWait,
    bank: &HostBank,
    act: ActivationPath,
) -> Result<Vec<CpuCheck>> {
    threads
        .iter()
        .map(|&t| {
            crate::cpu_check::measure_on(t, wait, bank, act, crate::cpu_check::CHECK_BUDGET, 0)
        })
        .collect()
}

/// The probe's own CPU checks for the profile: per piece of work timed at the start and the
/// end, one check at the geometric mean of the two times (the fitted CPU costs come from
/// the whole probe, between the two), their repetitions summed; a check with no partner
/// is kept as it is.
pub fn probe_cpu_checks(outcome: &ProbeOutcome) -> Vec<CpuCheck> {
    let mut out: Vec<CpuCheck> = Vec::new();
    for c in outcome
        .cpu_checks_start
        .iter()
        .chain(&outcome.cpu_checks_end)
    {
        match out.iter_mut().find(|o| o.same_work(c)) {
            Some(o) => {
                o.time_us = (o.time_us * c.time_us).sqrt();
                o.reps += c.reps;
            }
            None => out.push(*c),
        }
    }
    out
}

/// The CPU's ceiling as `ft run` reads it before each round (`read_window` of the served
/// bank with the serving threads), so that a run's reading compares with the probe's, GB/s.
fn bank_ceiling_gbs(threads: usize, bank: &HostBank) -> Result<f64> {
    let pool =
        ft_kernels::step::build_pool(threads).map_err(|e| RuntimeError::Kernel(e.to_string()))?;
    let bytes = bank.buffer().as_slice();
    Ok(
        ft_kernels::stream::read_window(&pool, bytes, ft_kernels::stream::CEILING_READ_BYTES, 0, 3)
            .median_gbs(),
    )
}

/// The second expert geometry: the bench's in the served format when the sizes are distinct
/// but not too far apart, else the served one with its FFN width scaled by
/// [`ALT_INTERMEDIATE_FACTOR`] (down for the bench geometry itself or larger experts, up for
/// toy ones). Returns the geometry and whether it is the bench's.
pub fn alt_geometry(model: &ModelSpec) -> Result<(MoeGeometry, bool)> {
    let bench = ModelSpec::preset(BENCH_MODEL)?;
    let served = model.expert_bytes() as f64;
    let bench_g = bench.geometry;
    if bench_g.validate(model.format).is_ok() {
        let b = bench_g.expert_bytes(model.format) as f64;
        let r = (b / served).max(served / b);
        if (SIZE_RATIO_DISTINCT..=SIZE_RATIO_FAR).contains(&r) {
            return Ok((bench_g, true));
        }
    }
    let g = model.geometry;
    let block = model.format.block_len().max(2);
    let bench_bytes = bench_g.expert_bytes(model.format) as f64;
    let scaled = if served * SIZE_RATIO_FAR < bench_bytes {
        g.intermediate * ALT_INTERMEDIATE_FACTOR
    } else {
        (g.intermediate / ALT_INTERMEDIATE_FACTOR / block).max(1) * block
    };
    let alt = MoeGeometry {
        intermediate: scaled,
        ..g
    };
    alt.validate(model.format)?;
    Ok((alt, false))
}

/// Experts of the second bank: as many as [`ALT_BANK_BYTES`] hold, at least `min` (so a
/// gather of the most experts probed finds distinct ones) and at most 4x that.
fn alt_bank_experts(format: ExpertFormat, g: &MoeGeometry, min: usize) -> usize {
    let stride = SlotPool::stride_for(g.expert_bytes(format)) as u64;
    ((ALT_BANK_BYTES / stride.max(1)) as usize).clamp(min, 4 * min)
}

/// Thread counts of the isolated CPU probe: the serving count, a half and a quarter of it.
/// The further pool sizes of the end-to-end probe ([`ProbeConfig::slowdown_threads`]):
/// as configured, or the smallest count of [`thread_counts`] where it differs from the
/// serving one; never the serving count itself, never 0, each once.
fn slowdown_threads(config: &ProbeConfig, threads: usize) -> Vec<usize> {
    let mut v = match &config.slowdown_threads {
        Some(v) => v.clone(),
        None => thread_counts(threads).last().copied().into_iter().collect(),
    };
    v.retain(|&t| t >= 1 && t != threads);
    v.sort_unstable();
    v.dedup();
    v
}

fn thread_counts(threads: usize) -> Vec<usize> {
    let mut v = vec![threads, threads.div_ceil(2), threads.div_ceil(4)];
    v.dedup();
    v.retain(|&t| t >= 1);
    v.sort_unstable_by(|a, b| b.cmp(a));
    v.dedup();
    v
}

/// CPU threads of the contended probes: the serving count and half of it, at most the
/// hardware threads less two (the load's own thread and the measuring thread must not take a
/// core from the pool: a spinning pool with one worker sharing a core runs at the straggler's
/// pace, which is not contention for DRAM). The samples record the count used.
fn contended_threads(threads: usize, hw_threads: usize) -> Vec<usize> {
    let t = threads.min(hw_threads.saturating_sub(2)).max(1);
    let mut v = vec![t, t.div_ceil(2)];
    v.dedup();
    v
}

/// Sorted distinct counts, each at least 1 and at most `cap`.
fn counts(v: &[usize], cap: usize) -> Vec<usize> {
    let mut out: Vec<usize> = v.iter().map(|&n| n.clamp(1, cap.max(1))).collect();
    out.sort_unstable();
    out.dedup();
    out
}

/// One end-to-end run of the engine's current strategy at `streams` streams: warm-up, then
/// the measured steps cut into blocks, each a [`StepSample`].
fn e2e_run(
    engine: &mut Engine,
    model_l: &ModelSpec,
    config: &ProbeConfig,
    streams: usize,
    samples: &mut ProbeSamples,
) -> Result<E2eRun> {
    engine.reset_cache()?;
    let mut source = routing::resolve(&config.routing, &model_l.geometry, Some(config.seed))?;
    let warm = draw_routing(source.as_mut(), streams, config.warmup_steps)?;
    let measured = draw_routing(source.as_mut(), streams, config.steps)?;
    let options = DecodeOptions {
        context: config.context,
        input_seed: config.seed,
        keep_spans: false,
        keep_outputs: false,
        block_stamps: false,
    };
    let decoded = decode(engine, &warm, &measured, &options, &mut |_, _| {})?;
    let records: Vec<&StepRecord> = decoded.records.iter().filter(|r| !r.warmup).collect();
    let kind = engine.strategy().kind();
    let per = records.len() / config.blocks;
    for (b, block) in records.chunks(per.max(1)).take(config.blocks).enumerate() {
        let first = config.warmup_steps + b * per;
        let context = config.context as f64 + first as f64 + (block.len() as f64 - 1.0) / 2.0;
        let mut shape = StepShape::new(model_l, streams, config.context);
        shape.context = context;
        samples.step.push(StepSample {
            strategy: kind,
            role: if b % 2 == 0 {
                SampleRole::Calibration
            } else {
                SampleRole::Validation
            },
            shape,
            layers: block
                .iter()
                .flat_map(|r| r.layers.iter().map(|l| perf_counts(&l.counts)))
                .collect(),
            time_us: block.iter().map(|r| r.wall_us).sum(),
            threads: Some(engine.threads() as u32),
        });
        if b % 2 == 0 {
            if let Some(h) = host_sample(kind, streams, block) {
                samples.host.push(h);
            }
            if let Some(l) = link_sample(model_l, streams, engine.threads(), block) {
                samples.link.push(l);
            }
        }
    }
    let s: &RunSummary = &decoded.summary;
    Ok(E2eRun {
        strategy: engine.strategy(),
        threads: engine.threads(),
        streams,
        layers: model_l.geometry.moe_layers,
        cache_slots: if kind == StrategyKind::Resident {
            0
        } else {
            engine.cache_slots()
        },
        tok_s_per_stream: s.tok_s_per_stream,
        step_us: s.step_us.mean,
        miss_rate: s.miss_rate,
    })
}

/// The `host` sample of a calibration block whose layers have a CPU share (the host's
/// planning and submitting spans per layer, and the mean counts); `None` without one.
fn host_sample(kind: StrategyKind, streams: usize, block: &[&StepRecord]) -> Option<HostSample> {
    let layers: Vec<&LayerRecord> = block
        .iter()
        .flat_map(|r| r.layers.iter())
        .filter(|l| l.counts.cpu > 0)
        .collect();
    let (counts, time_us) = mean_counts(&layers, |l| l.host_submit_us)?;
    Some(HostSample {
        strategy: kind,
        streams: streams as u32,
        counts,
        time_us,
    })
}

/// The `link` sample of a calibration block whose layers both gathered and computed on the
/// CPU (a hybrid block: the link's busy time per layer, the mean counts, the pool's
/// threads); `None` without such layers or without timed copies.
fn link_sample(
    model: &ModelSpec,
    streams: usize,
    threads: usize,
    block: &[&StepRecord],
) -> Option<LinkSample> {
    let layers: Vec<&LayerRecord> = block
        .iter()
        .flat_map(|r| r.layers.iter())
        .filter(|l| l.counts.cpu > 0 && l.counts.fetched > 0)
        .collect();
    let (counts, time_us) = mean_counts(&layers, |l| l.pcie_busy_us)?;
    Some(LinkSample {
        streams: streams as u32,
        threads: Some(threads as u32),
        expert: ExpertShape::of(model),
        counts,
        time_us,
    })
}

/// The mean counts of `layers` and the mean of `time` over them, in us; `None` without
/// layers or where that mean is not positive (the spans were not timed).
fn mean_counts(
    layers: &[&LayerRecord],
    time: impl Fn(&LayerRecord) -> f64,
) -> Option<(PerfCounts, f64)> {
    if layers.is_empty() {
        return None;
    }
    let n = layers.len() as f64;
    let mut counts = PerfCounts::default();
    let mut time_us = 0.0;
    for l in layers {
        let c = perf_counts(&l.counts);
        counts.hits += c.hits / n;
        counts.hit_tokens += c.hit_tokens / n;
        counts.fetched += c.fetched / n;
        counts.fetched_tokens += c.fetched_tokens / n;
        counts.cpu += c.cpu / n;
        counts.cpu_tokens += c.cpu_tokens / n;
        time_us += time(l) / n;
    }
    (time_us > 0.0).then_some((counts, time_us))
}

/// The model's counts of a layer from the engine's record. The record carries the GPU's
/// (token, expert) pairs of hits and fetched experts together; they are split in proportion
/// to the experts (exact when every expert serves as many tokens; the GPU's per-token cost is
/// small beside its per-expert bytes, so the split barely moves a prediction).
pub fn perf_counts(c: &RunCounts) -> PerfCounts {
    let gpu = (c.hits + c.fetched) as f64;
    let share = if gpu > 0.0 { c.hits as f64 / gpu } else { 0.0 };
    let gpu_tokens = c.gpu_tokens as f64;
    PerfCounts {
        hits: c.hits as f64,
        hit_tokens: gpu_tokens * share,
        fetched: c.fetched as f64,
        fetched_tokens: gpu_tokens * (1.0 - share),
        cpu: c.cpu as f64,
        cpu_tokens: c.cpu_tokens as f64,
    }
}

/// The banks and byte sizes the micro-probes read.
struct Sizes<'a> {
    served: &'a HostBank,
    alt: &'a HostBank,
    served_geometry: MoeGeometry,
    alt_geometry: MoeGeometry,
    served_bytes: usize,
    alt_bytes: usize,
    /// True when the served model is the bench geometry itself.
    served_is_bench: bool,
}

impl<'a> Sizes<'a> {
    fn new(
        model: &ModelSpec,
        served: &'a HostBank,
        alt_geometry: &MoeGeometry,
        alt: &'a HostBank,
    ) -> Result<Self> {
        let bench = ModelSpec::preset(BENCH_MODEL)?;
        let served_is_bench = bench.geometry.hidden == model.geometry.hidden
            && bench.geometry.intermediate == model.geometry.intermediate;
        Ok(Sizes {
            served,
            alt,
            served_geometry: served.layout().geometry,
            alt_geometry: *alt_geometry,
            served_bytes: served.layout().expert_bytes,
            alt_bytes: alt.layout().expert_bytes,
            served_is_bench,
        })
    }

    /// (bank, region bytes, the bank's geometry) of a size.
    fn of(&self, size: ExpertSize) -> (&'a HostBank, usize, MoeGeometry) {
        match size {
            ExpertSize::Served => (self.served, self.served_bytes, self.served_geometry),
            ExpertSize::Quarter => (
                self.served,
                (self.served_bytes / 4 / 16).max(1) * 16,
                self.served_geometry,
            ),
            ExpertSize::Alt => (self.alt, self.alt_bytes, self.alt_geometry),
        }
    }

    /// True when `size` has the bench's expert size.
    fn is_bench(&self, size: ExpertSize, alt_is_bench: bool) -> bool {
        match size {
            ExpertSize::Served => self.served_is_bench,
            ExpertSize::Alt => alt_is_bench,
            ExpertSize::Quarter => false,
        }
    }
}

/// What every micro-probe shares.
struct MicroContext<'a> {
    device: &'a Device,
    model: &'a ModelSpec,
    sizes: &'a Sizes<'a>,
    threads: usize,
    wait: PoolWait,
    /// The activation path of the served engine, on the GPU and the CPU alike.
    act: ActivationPath,
    max_streams: usize,
    config: &'a ProbeConfig,
    /// Hardware threads of the host.
    hw_threads: usize,
}

impl MicroContext<'_> {
    /// The CPU threads of the contended bench points (the most the contended probes use).
    fn contended_top(&self) -> usize {
        contended_threads(self.threads, self.hw_threads)[0]
    }

    fn alt_is_bench(&self) -> bool {
        let Ok(bench) = ModelSpec::preset(BENCH_MODEL) else {
            return false;
        };
        self.sizes.alt_geometry.hidden == bench.geometry.hidden
            && self.sizes.alt_geometry.intermediate == bench.geometry.intermediate
    }
}

/// The legacy bench's measurements, collected from the points at its geometry with
/// [`BENCH_EXPERTS`] experts, one token, the serving threads.
#[derive(Debug, Default)]
struct BenchCollector {
    gather_us: Option<f64>,
    gather_contended_us: Option<f64>,
    cpu_us: Option<f64>,
    cpu_contended_us: Option<f64>,
}

impl BenchCollector {
    fn finish(&self, expert_bytes: usize) -> Option<BenchBw> {
        let gbs = |us: f64| (BENCH_EXPERTS * expert_bytes) as f64 / (us * 1e3);
        Some(BenchBw {
            expert_bytes: expert_bytes as u64,
            experts: BENCH_EXPERTS as u32,
            cpu_moe_gbs: gbs(self.cpu_us?),
            pcie_gather_gbs: gbs(self.gather_us?),
            cpu_moe_overlap_gbs: self.cpu_contended_us.map(gbs),
            pcie_gather_overlap_gbs: self.gather_contended_us.map(gbs),
        })
    }
}

/// Repeat `f` (one timed repetition in us, given its index) after one warm-up until the
/// point's share is spent, at least [`MIN_REPS`], at most [`MAX_REPS`] times; the median.
fn repeat(share: Duration, mut f: impl FnMut(usize) -> Result<f64>) -> Result<(f64, usize)> {
    f(0)?;
    let t0 = Instant::now();
    let mut v = Vec::new();
    while v.len() < MIN_REPS || (v.len() < MAX_REPS && t0.elapsed() < share) {
        v.push(f(v.len() + 1)?);
    }
    Ok((ft_kernels::stream::median(&v), v.len()))
}

/// Regions of `n` experts of `bytes` each from `bank`, starting at flat expert `start`
/// (wrapping), into consecutive `stride`-spaced destinations.
fn regions(
    bank: &HostBank,
    n: usize,
    bytes: usize,
    start: usize,
    dst_stride: usize,
) -> Vec<CopyRegion> {
    let l = bank.layout();
    let total = l.geometry.experts * l.geometry.moe_layers;
    (0..n)
        .map(|i| CopyRegion {
            src_offset: (((start + i) % total) * l.stride) as u64,
            dst_offset: (i * dst_stride) as u64,
            bytes: bytes as u64,
        })
        .collect()
}

/// Experts of a bank.
fn bank_experts(bank: &HostBank) -> usize {
    let g = bank.layout().geometry;
    g.experts * g.moe_layers
}

/// The expert of flat index `flat` (wrapping) of a bank.
fn expert_at(bank: &HostBank, flat: usize) -> Result<&[u8]> {
    let g = bank.layout().geometry;
    let f = flat % bank_experts(bank);
    bank.expert(ExpertId::new(f / g.experts, f % g.experts))
}

/// Longest a probe waits for its background load to start before measuring anyway.
const LOAD_START_TIMEOUT: Duration = Duration::from_secs(5);

/// Wait until a background load has done its first unit of work (or has failed).
fn wait_started(started: &AtomicBool) {
    let t0 = Instant::now();
    while !started.load(Ordering::Acquire) && t0.elapsed() < LOAD_START_TIMEOUT {
        std::thread::yield_now();
    }
}

/// The `gather` probe, isolated (`contended: None`) or while a CPU kernel of that many
/// threads streams other experts throughout. Returns (points, reps).
fn gather_probe(
    ctx: &MicroContext<'_>,
    share: Duration,
    contended: Option<usize>,
    samples: &mut ProbeSamples,
    bench: &mut BenchCollector,
) -> Result<(usize, usize)> {
    let k = ctx.model.geometry.top_k;
    let alt_is_bench = ctx.alt_is_bench();
    let mut points: Vec<(ExpertSize, usize)> = Vec::new();
    let sizes = match contended {
        None => vec![ExpertSize::Served, ExpertSize::Quarter, ExpertSize::Alt],
        Some(_) => vec![ExpertSize::Served, ExpertSize::Alt],
    };
    for size in sizes {
        let (bank, _, _) = ctx.sizes.of(size);
        let cap = bank_experts(bank) / 2;
        let ns = match contended {
            None => counts(&[1, k / 2, k, 2 * k, BENCH_EXPERTS], cap),
            Some(_) => counts(&[k, BENCH_EXPERTS], cap),
        };
        points.extend(ns.into_iter().map(|n| (size, n)));
    }
    let max_stride = ctx
        .sizes
        .served
        .layout()
        .stride
        .max(ctx.sizes.alt.layout().stride);
    let max_n = points.iter().map(|p| p.1).max().unwrap_or(1);
    let dst = ctx
        .device
        .alloc(max_n * max_stride, "gather probe destination")?;
    let stream = ctx.device.new_stream("probe copy")?;
    let (e0, e1) = (ctx.device.new_event(true)?, ctx.device.new_event(true)?);
    let per_point = share.div_f64(points.len().max(1) as f64);
    let mut reps_total = 0;
    let stop = AtomicBool::new(false);
    let started = AtomicBool::new(false);
    std::thread::scope(|scope| -> Result<()> {
        let load = contended.map(|threads| {
            let (stop, started) = (&stop, &started);
            let sizes = ctx.sizes;
            let (format, path, wait, k) = (ctx.model.format, ctx.act, ctx.wait, k);
            scope.spawn(move || cpu_load(sizes, format, path, threads, wait, k, stop, started))
        });
        if load.is_some() {
            wait_started(&started);
        }
        let result = (|| -> Result<()> {
            for &(size, n) in &points {
                let (bank, bytes, _) = ctx.sizes.of(size);
                let total = bank_experts(bank);
                let mut start = 0usize;
                let (us, reps) = repeat(per_point, |_| {
                    start = (start + n) % total;
                    let r = regions(bank, n, bytes, start, max_stride);
                    stream.time_us(&e0, &e1, || {
                        stream.copy_h2d_regions(bank.buffer(), &dst, &r)
                    })
                })?;
                reps_total += reps;
                samples.gather.push(GatherSample {
                    experts: n as u32,
                    expert_bytes: bytes as f64,
                    contended_cpu_threads: contended.map(|t| t as u32),
                    time_us: us,
                });
                if n == BENCH_EXPERTS && ctx.sizes.is_bench(size, alt_is_bench) {
                    match contended {
                        None => bench.gather_us = Some(us),
                        Some(t) if t == ctx.contended_top() => bench.gather_contended_us = Some(us),
                        Some(_) => {}
                    }
                }
            }
            Ok(())
        })();
        stop.store(true, Ordering::Release);
        if let Some(h) = load {
            h.join().map_err(|_| {
                RuntimeError::Kernel("the probe's CPU load thread panicked".into())
            })??;
        }
        result
    })?;
    Ok((points.len(), reps_total))
}

/// The CPU load of the contended gather probe: layer calls over `k` experts of the served
/// bank, rotating through it, on a pool of `threads`, until `stop`.
#[allow(clippy::too_many_arguments)]
fn cpu_load(
    sizes: &Sizes<'_>,
    format: ExpertFormat,
    path: ActivationPath,
    threads: usize,
    wait: PoolWait,
    k: usize,
    stop: &AtomicBool,
    started: &AtomicBool,
) -> Result<()> {
    let mut exec = CpuExecutor::new(threads, wait)?;
    let g = sizes.served_geometry;
    let tokens = [(0u32, 1.0f32)];
    let x = token_input(PROBE_SEED, 0, 0, g.hidden);
    let mut y = vec![0f32; g.hidden];
    let total = bank_experts(sizes.served);
    // Start half-way through the bank: the gathers read its first experts.
    let mut flat = total / 2;
    exec.begin_step();
    let mut result = Ok(());
    while !stop.load(Ordering::Acquire) {
        let experts = (0..k)
            .map(|i| {
                Ok(ExpertWork {
                    weights: expert_at(sizes.served, flat + i)?,
                    tokens: &tokens,
                })
            })
            .collect::<Result<Vec<_>>>();
        flat = (flat + k) % total;
        let r = experts.and_then(|e| exec.run_layer(format, &g, path, &e, &x, &mut y));
        started.store(true, Ordering::Release);
        if let Err(e) = r {
            result = Err(e);
            break;
        }
    }
    exec.end_step();
    started.store(true, Ordering::Release);
    result
}

/// Pause between polls of the gather load's completion, us: the load's thread sleeps while
/// its copies run, so that it takes no core from the CPU pool being measured (a batch lasts
/// milliseconds; the gap this leaves in the link's use is a few percent at most).
const LOAD_POLL: Duration = Duration::from_micros(50);

/// Gathers the load queues per batch (so that one poll gap is small beside a batch).
const LOAD_BATCH: usize = 4;

/// The gather load of the contended CPU probe: batches of gathers of `2k` served experts on
/// their own stream, back to back, until `stop`; the thread sleeps while a batch runs.
fn gather_load(
    device: &Device,
    bank: &HostBank,
    k: usize,
    stop: &AtomicBool,
    started: &AtomicBool,
) -> Result<()> {
    let n = (2 * k).min(bank_experts(bank) / 2).max(1);
    let stride = bank.layout().stride;
    let dst = device.alloc(n * stride, "probe gather load")?;
    let stream = device.new_stream("probe load")?;
    let done = device.new_event(false)?;
    let total = bank_experts(bank);
    let mut start = 0;
    let mut result = Ok(());
    while !stop.load(Ordering::Acquire) {
        let mut step = Ok(());
        for _ in 0..LOAD_BATCH {
            let r = regions(bank, n, bank.layout().expert_bytes, start, stride);
            start = (start + n) % total;
            step = step.and_then(|_| stream.copy_h2d_regions(bank.buffer(), &dst, &r));
        }
        let step = step.and_then(|_| stream.record(&done)).and_then(|_| loop {
            match done.is_complete() {
                Ok(true) => break Ok(()),
                Ok(false) => std::thread::sleep(LOAD_POLL),
                Err(e) => break Err(e),
            }
        });
        started.store(true, Ordering::Release);
        if let Err(e) = step {
            result = Err(e);
            break;
        }
    }
    started.store(true, Ordering::Release);
    let _ = stream.synchronize();
    result
}

/// The `cpu-step` probe, isolated or while a gather runs throughout. Returns (points, reps).
fn cpu_probe(
    ctx: &MicroContext<'_>,
    share: Duration,
    contended: bool,
    samples: &mut ProbeSamples,
    bench: &mut BenchCollector,
) -> Result<(usize, usize)> {
    let k = ctx.model.geometry.top_k;
    let s = ctx.max_streams;
    let alt_is_bench = ctx.alt_is_bench();
    // (size, experts, tokens per expert, threads)
    let mut points: Vec<(ExpertSize, usize, usize, usize)> = Vec::new();
    for size in [ExpertSize::Served, ExpertSize::Alt] {
        let (bank, _, _) = ctx.sizes.of(size);
        let cap = bank_experts(bank) / 2;
        if contended {
            for t in contended_threads(ctx.threads, ctx.hw_threads) {
                for n in counts(&[k, BENCH_EXPERTS], cap) {
                    points.push((size, n, 1, t));
                }
            }
        } else {
            for n in counts(&[1, 2, k / 2, k, 2 * k, BENCH_EXPERTS], cap) {
                for tokens in counts(&[1, s], usize::MAX) {
                    points.push((size, n, tokens, ctx.threads));
                }
            }
            for &t in thread_counts(ctx.threads).iter().skip(1) {
                for n in counts(&[k, BENCH_EXPERTS], cap) {
                    points.push((size, n, 1, t));
                }
            }
        }
    }
    let per_point = share.div_f64(points.len().max(1) as f64);
    let mut reps_total = 0;
    let stop = AtomicBool::new(false);
    let started = AtomicBool::new(false);
    let mut execs: Vec<(usize, CpuExecutor)> = Vec::new();
    for t in points.iter().map(|p| p.3) {
        if !execs.iter().any(|e| e.0 == t) {
            execs.push((t, CpuExecutor::new(t, ctx.wait)?));
        }
    }
    std::thread::scope(|scope| -> Result<()> {
        let load = contended.then(|| {
            let (stop, started) = (&stop, &started);
            let (device, bank) = (ctx.device, ctx.sizes.served);
            scope.spawn(move || gather_load(device, bank, k, stop, started))
        });
        if load.is_some() {
            wait_started(&started);
        }
        let result = (|| -> Result<()> {
            for &(size, n, tokens, threads) in &points {
                let (bank, bytes, geometry) = ctx.sizes.of(size);
                let exec = &mut execs
                    .iter_mut()
                    .find(|e| e.0 == threads)
                    .expect("made above")
                    .1;
                let h = geometry.hidden;
                let x: Vec<f32> = (0..tokens)
                    .flat_map(|t| token_input(PROBE_SEED, t, 1, h))
                    .collect();
                let mut y = vec![0f32; x.len()];
                let routed: Vec<(u32, f32)> =
                    (0..tokens as u32).map(|t| (t, 1.0 / n as f32)).collect();
                let total = bank_experts(bank);
                let mut flat = 0usize;
                exec.begin_step();
                let r = repeat(per_point, |_| {
                    let experts = (0..n)
                        .map(|i| {
                            Ok(ExpertWork {
                                weights: expert_at(bank, flat + i)?,
                                tokens: &routed,
                            })
                        })
                        .collect::<Result<Vec<_>>>()?;
                    flat = (flat + n) % total;
                    let t0 = Instant::now();
                    exec.run_layer(ctx.model.format, &geometry, ctx.act, &experts, &x, &mut y)?;
                    Ok(t0.elapsed().as_secs_f64() * 1e6)
                });
                exec.end_step();
                let (us, reps) = r?;
                reps_total += reps;
                samples.cpu_step.push(CpuStepSample {
                    experts: n as u32,
                    tokens_per_expert: tokens as u32,
                    expert_bytes: bytes as f64,
                    expert_macs: geometry.expert_macs_per_token() as f64,
                    threads: threads as u32,
                    contended,
                    time_us: us,
                });
                let bench_threads = if contended {
                    ctx.contended_top()
                } else {
                    ctx.threads
                };
                if n == BENCH_EXPERTS
                    && tokens == 1
                    && threads == bench_threads
                    && ctx.sizes.is_bench(size, alt_is_bench)
                {
                    if contended {
                        bench.cpu_contended_us = Some(us);
                    } else {
                        bench.cpu_us = Some(us);
                    }
                }
            }
            Ok(())
        })();
        stop.store(true, Ordering::Release);
        if let Some(h) = load {
            h.join().map_err(|_| {
                RuntimeError::Kernel("the probe's gather load thread panicked".into())
            })??;
        }
        result
    })?;
    Ok((points.len(), reps_total))
}

/// The `gpu-experts` probe: one launch over `n` experts in device memory with `t` tokens
/// each, rotating through a device copy of many experts. Returns (points, reps).
fn gpu_probe(
    ctx: &MicroContext<'_>,
    share: Duration,
    samples: &mut ProbeSamples,
) -> Result<(usize, usize)> {
    let k = ctx.model.geometry.top_k;
    let s = ctx.max_streams;
    let mut points = Vec::new();
    for size in [ExpertSize::Served, ExpertSize::Alt] {
        let (bank, _, _) = ctx.sizes.of(size);
        let cap = bank_experts(bank) / 2;
        for n in counts(&[1, k, 2 * k], cap) {
            for t in counts(&[1, s, 4 * s], usize::MAX) {
                points.push((size, n, t));
            }
        }
    }
    let per_point = share.div_f64(points.len().max(1) as f64);
    let stream = ctx.device.new_stream("probe compute")?;
    let (e0, e1) = (ctx.device.new_event(true)?, ctx.device.new_event(true)?);
    let act = ctx.act;
    let mut reps_total = 0;
    for size in [ExpertSize::Served, ExpertSize::Alt] {
        let (bank, bytes, geometry) = ctx.sizes.of(size);
        let stride = bank.layout().stride;
        let mine: Vec<_> = points.iter().filter(|p| p.0 == size).collect();
        let Some(max_n) = mine.iter().map(|p| p.1).max() else {
            continue;
        };
        let max_t = mine.iter().map(|p| p.2).max().unwrap_or(1);
        // Four windows of the most experts, so repeats do not hit in the GPU's L2.
        let resident = (4 * max_n).min(bank_experts(bank));
        let weights = ctx
            .device
            .alloc(resident * stride, "gpu-experts probe weights")?;
        stream.copy_h2d_regions(
            bank.buffer(),
            &weights,
            &regions(bank, resident, bytes, 0, stride),
        )?;
        let h = geometry.hidden;
        let x_host: Vec<f32> = (0..max_t)
            .flat_map(|t| token_input(PROBE_SEED, t, 2, h))
            .collect();
        let x = ctx.device.alloc(x_host.len() * 4, "gpu-experts probe x")?;
        let y = ctx.device.alloc(x_host.len() * 4, "gpu-experts probe y")?;
        stream.upload_f32(&x_host, &x, 0)?;
        stream.synchronize()?;
        for &&(_, n, t) in &mine {
            let mut window = 0usize;
            let (us, reps) = repeat(per_point, |_| {
                let mut step = ExpertStep::new(ctx.model.format, &geometry, act, t);
                let first = (window * n) % resident.saturating_sub(n).max(1);
                window += 1;
                step.experts = (0..n)
                    .map(|i| ExpertTask {
                        weights_offset: ((first + i) % resident) * stride,
                        tokens: (0..t as u32)
                            .map(|token| TokenWeight {
                                token,
                                weight: 1.0 / n as f32,
                            })
                            .collect(),
                    })
                    .collect();
                stream.time_us(&e0, &e1, || stream.launch_experts(&step, &weights, &x, &y))
            })?;
            reps_total += reps;
            samples.gpu_experts.push(GpuExpertSample {
                experts: n as u32,
                tokens_per_expert: t as u32,
                expert_bytes: bytes as f64,
                expert_macs: geometry.expert_macs_per_token() as f64,
                time_us: us,
            });
        }
    }
    Ok((points.len(), reps_total))
}

/// Layers of dense buffers the dense probe alternates between (distinct bytes, so repeats
/// read HBM and not L2).
const DENSE_PROBE_LAYERS: usize = 2;

/// The `dense` probe: one layer's dense kernel at 1 and the most streams, at contexts 1,
/// short and long. Returns (points, reps).
fn dense_probe(
    ctx: &MicroContext<'_>,
    share: Duration,
    samples: &mut ProbeSamples,
) -> Result<(usize, usize)> {
    let spec = ctx.model.dense();
    let streams = counts(&[1, ctx.max_streams], usize::MAX);
    let contexts = counts(
        &[1, ctx.config.context, ctx.config.long_context],
        usize::MAX,
    );
    let max_s = *streams.last().unwrap_or(&1);
    let max_c = *contexts.last().unwrap_or(&1);
    let buffers = DenseBuffers::new(ctx.device, &spec, DENSE_PROBE_LAYERS, max_s, max_c)?;
    let stream = ctx.device.new_stream("probe dense")?;
    let (e0, e1) = (ctx.device.new_event(true)?, ctx.device.new_event(true)?);
    let points: Vec<(usize, usize)> = streams
        .iter()
        .flat_map(|&s| contexts.iter().map(move |&c| (s, c)))
        .collect();
    let per_point = share.div_f64(points.len().max(1) as f64);
    let mut reps_total = 0;
    for &(s, c) in &points {
        let ctxs = vec![c; s];
        let (us, reps) = repeat(per_point, |rep| {
            stream.time_us(&e0, &e1, || {
                buffers.launch(&stream, rep % DENSE_PROBE_LAYERS, &ctxs)
            })
        })?;
        reps_total += reps;
        samples.dense.push(DenseSample {
            streams: s as u32,
            context: c as u32,
            dense: spec,
            time_us: us,
        });
    }
    Ok((points.len(), reps_total))
}

/// The `round-trip` probe: a hybrid layer's synchronisation with no expert work, as the
/// engine does it (activations down on their own stream after an event of the compute
/// stream, the host spinning on their arrival, the partial output written to pinned memory
/// and read back by the device), timed on the host. Returns (points, reps).
fn round_trip_probe(
    ctx: &MicroContext<'_>,
    share: Duration,
    samples: &mut ProbeSamples,
) -> Result<(usize, usize)> {
    let h = ctx.model.geometry.hidden;
    let streams = counts(&[1, ctx.max_streams], usize::MAX);
    let max_s = *streams.last().unwrap_or(&1);
    let row = h * 4;
    let act = ctx.device.alloc(max_s * row, "round-trip activations")?;
    let out = ctx.device.alloc(max_s * row, "round-trip partial output")?;
    let x_host = ctx
        .device
        .alloc_host(max_s * row, "round-trip host activations")?;
    let mut y_host = ctx
        .device
        .alloc_host(max_s * row, "round-trip host partial")?;
    let compute = ctx.device.new_stream("probe compute")?;
    let down_stream = ctx.device.new_stream("probe activations")?;
    let ready = ctx.device.new_event(false)?;
    let down = ctx.device.new_event(false)?;
    let merged = ctx.device.new_event(false)?;
    let per_point = share.div_f64(streams.len() as f64);
    let clock = ctx.device.clock();
    let mut reps_total = 0;
    for &s in &streams {
        let regions: Vec<CopyRegion> = (0..s)
            .map(|i| CopyRegion {
                src_offset: (i * row) as u64,
                dst_offset: (i * row) as u64,
                bytes: row as u64,
            })
            .collect();
        let (us, reps) = repeat(per_point, |rep| {
            let t0 = clock.now_us();
            compute.record(&ready)?;
            down_stream.wait(&ready)?;
            down_stream.copy_d2h(&act, 0, &x_host, 0, s * row)?;
            down_stream.record(&down)?;
            while !down.is_complete()? {
                std::hint::spin_loop();
            }
            // The CPU's partial output (its content does not matter; its bytes must change).
            let v = y_host.as_mut_slice();
            v[0] = v[0].wrapping_add(1 + (rep % 7) as u8);
            compute.gather_zero_copy(&y_host, &out, &regions)?;
            compute.record(&merged)?;
            merged.synchronize()?;
            Ok(clock.now_us() - t0)
        })?;
        reps_total += reps;
        samples.round_trip.push(RoundTripSample {
            streams: s as u32,
            hidden: h as u32,
            time_us: us,
        });
    }
    Ok((streams.len(), reps_total))
}

/// Linear host-to-device and device-to-host rates of one large copy from the served bank
/// (the prior's `pcie.h2d_gbs`, `pcie.d2h_gbs`), GB/s.
fn link_probe(device: &Device, bank: &HostBank) -> Result<(f64, f64)> {
    let bytes = bank.buffer().len().min(LINK_PROBE_BYTES);
    let dst = device.alloc(bytes, "link probe")?;
    let back = device.alloc_host(bytes, "link probe host")?;
    let stream = device.new_stream("probe link")?;
    let (e0, e1) = (device.new_event(true)?, device.new_event(true)?);
    let time = |op: &dyn Fn() -> Result<()>| -> Result<f64> {
        let mut v = Vec::new();
        op()?;
        stream.synchronize()?;
        for _ in 0..MIN_REPS {
            v.push(stream.time_us(&e0, &e1, op)?);
        }
        Ok(ft_kernels::stream::median(&v))
    };
    let h2d = time(&|| stream.copy_h2d(bank.buffer(), 0, &dst, 0, bytes))?;
    let d2h = time(&|| stream.copy_d2h(&dst, 0, &back, 0, bytes))?;
    let gbs = |us: f64| bytes as f64 / (us.max(1e-3) * 1e3);
    Ok((gbs(h2d), gbs(d2h)))
}

/// A host spec describing this machine from what the probes measured, for the fit's prior:
/// the device's name and memory, the CPU topology, the measured linear link rates and STREAM
/// read, the GPU's effective memory bandwidth from the largest dense sample, and the runtime
/// engine's default costs ([`EngineSpec::default`]) at the serving threads.
pub fn prior_host(device: &Device, outcome: &ProbeOutcome) -> Result<HostSpec> {
    let info = device.info();
    let engine = EngineSpec {
        name: format!("ft runtime on {}", info.name),
        cpu_threads: Some((outcome.threads as u32).min(outcome.cpu.threads)),
        ..EngineSpec::default()
    };
    let memory_gib = (info.total_mem_bytes as f64 / GIB).max(engine.gpu_reserve_gib * 2.0);
    let dense = outcome
        .samples
        .dense
        .iter()
        .max_by(|a, b| a.time_us.total_cmp(&b.time_us))
        .map(|d| {
            let bytes = d.dense.weight_bytes_per_layer as f64
                + d.streams as f64 * d.context as f64 * d.dense.kv_bytes_per_token as f64;
            bytes / (d.time_us.max(1e-3) * 1e3)
        })
        .unwrap_or(1000.0);
    let host = HostSpec {
        name: format!("{} + {}", info.name, outcome.cpu.model),
        description: "prior of ft probe: measured link, STREAM read and dense rate, the runtime's default engine costs".into(),
        gpu: GpuSpec {
            name: info.name.clone(),
            count: 1,
            memory_gib,
            hbm_gbs: dense / engine.gpu_hbm_efficiency,
        },
        pcie: PcieSpec {
            h2d_gbs: outcome.h2d_gbs,
            d2h_gbs: outcome.d2h_gbs,
            latency_us: 2.0,
            gather_gbs: None,
        },
        cpu: CpuSpec {
            name: outcome.cpu.model.clone(),
            cores: outcome.cpu.cores,
            threads: outcome.cpu.threads,
            numa_nodes: outcome.cpu.numa_nodes,
            stream_read_gbs: outcome.stream_read_gbs,
            moe_gbs: None,
        },
        engine,
    };
    host.validate()?;
    Ok(host)
}

/// Fit the probes ([`ft_model::perf::fit::fit`], from the prior of [`prior_host`]) and make
/// the profile for `fingerprint` and the served model.
pub fn fit_profile(
    device: &Device,
    outcome: &ProbeOutcome,
    fingerprint: HostFingerprint,
    fit_config: &FitConfig,
) -> Result<(Profile, FitReport, HostSpec)> {
    let host = prior_host(device, outcome)?;
    let prior: PerfModel = PerfModel::from_host(&host)?;
    let mut start: PerfParams = prior.params.clone();
    // The engine the end-to-end blocks ran: the fit and every later prediction of the
    // profile time its schedule.
    start.engine_settings = outcome.engine;
    // The bench geometry of the legacy rule is the host's tuning model (not fitted).
    start.bench_expert =
        ExpertShape::of(&ModelSpec::preset(BENCH_MODEL)?.with_format(outcome.model.format));
    let report = fit(&outcome.samples, &start, fit_config)?;
    let model = report.model(
        &prior.covariance,
        &format!("ft probe on {}", device.info().name),
    );
    let mut profile = Profile {
        key: ProfileKey::new(fingerprint, &outcome.model),
        created_unix_s: now_unix_s(),
        params: model.params,
        covariance: model.covariance,
        dof: model.dof,
        fit: Some(report.clone()),
        samples: outcome.samples.clone(),
        bench_bw: outcome.bench_bw,
        probe_steal_fraction: outcome.host_steal_fraction,
        cpu_checks: probe_cpu_checks(outcome),
        untrusted: None,
        calibration: None,
    };
    // What every reader checks (`Profile::validate`), checked before it is stored: a fit
    // that a reader would refuse is an error here, not a cache entry re-probed forever.
    profile.validate()?;
    profile.untrusted = profile.assess_fit();
    if let Some(why) = &profile.untrusted {
        tracing::warn!("the probe's fit is UNTRUSTED: {why}");
    }
    Ok((profile, report, host))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::device::HostDeviceConfig;

    #[test]
    fn a_disturbed_probe_is_repeated_and_the_least_disturbed_is_kept() {
        // Scripted disturbance per attempt: (attempts allowed, scores) -> (kept, ran).
        let cases: [(usize, &[f64], usize, usize); 5] = [
            (2, &[0.1], 1, 1),           // quiet: one probe
            (2, &[3.0, 0.5], 2, 2),      // disturbed, then quiet: the second
            (2, &[2.5, 6.0], 1, 2),      // both disturbed: the lesser
            (3, &[4.0, 2.5, 3.0], 2, 3), // all three disturbed
            (1, &[25.0], 1, 1),          // one attempt allowed
        ];
        for (attempts, scores, kept, ran) in cases {
            let mut calls = 0;
            let (value, n) = least_disturbed_of(
                attempts,
                || true,
                |i| {
                    calls += 1;
                    Ok((i, scores[i - 1]))
                },
            )
            .unwrap();
            assert_eq!((value, n, calls), (kept, ran, ran), "{scores:?}");
        }
        // No room left in the budget: a disturbed probe is not repeated.
        let mut calls = 0;
        let (value, n) = least_disturbed_of(
            3,
            || false,
            |i| {
                calls += 1;
                Ok((i, 9.0))
            },
        )
        .unwrap();
        assert_eq!((value, n, calls), (1, 1, 1));
        // Room for one repeat only: two probes, the lesser kept.
        let mut rooms = 1;
        let (value, n) = least_disturbed_of(
            3,
            || {
                rooms -= 1;
                rooms >= 0
            },
            |i| Ok((i, [9.0, 4.0, 1.0][i - 1])),
        )
        .unwrap();
        assert_eq!((value, n), (2, 2));
        // An error ends the attempts.
        let r: Result<(usize, usize)> = least_disturbed_of(
            3,
            || true,
            |i| {
                if i == 2 {
                    Err(RuntimeError::invalid("probe", "broken"))
                } else {
                    Ok((i, 5.0))
                }
            },
        );
        assert!(r.unwrap_err().to_string().contains("broken"));
    }

    #[test]
    fn steal_and_a_moving_ceiling_each_disturb_a_probe() {
        let d = host_device();
        let out = run(&d, &tiny(), &quick(), &mut |_, _| {}).unwrap();
        let config = ProbeConfig::default();
        let with = |steal: Option<f64>, start: Option<f64>, end: f64| ProbeOutcome {
            host_steal_fraction: steal,
            stream_read_start_gbs: start,
            stream_read_gbs: end,
            ..out.clone()
        };
        // Quiet: little steal, the ceiling where it was.
        let quiet = with(Some(0.01), Some(100.0), 95.0);
        assert!(quiet.disturbance(&config) <= 1.0);
        assert!(quiet.disturbed_by(&config).is_empty());
        // Steal over its limit, or the ceiling moving by more than its limit either way.
        for (o, what) in [
            (with(Some(0.05), Some(100.0), 100.0), "hypervisor"),
            (with(Some(0.0), Some(100.0), 70.0), "read rate"),
            (with(Some(0.0), Some(70.0), 100.0), "read rate"),
        ] {
            assert!(o.disturbance(&config) > 1.0, "{what}");
            let why = o.disturbed_by(&config).join("; ");
            assert!(why.contains(what), "{why}");
        }
        // Nothing readable: not disturbed.
        assert_eq!(with(None, None, 80.0).disturbance(&config), 0.0);
    }

    #[test]
    fn the_probe_checks_the_cpu_at_start_and_end_and_the_profile_keeps_their_mean() {
        let d = host_device();
        let config = ProbeConfig {
            slowdown_threads: Some(vec![2]),
            ..quick()
        };
        let out = run(&d, &tiny(), &config, &mut |_, _| {}).unwrap();
        // One check per probed thread count (the serving 1 and the slowdown's 2), each of
        // top_k experts at one token of the served geometry.
        for checks in [&out.cpu_checks_start, &out.cpu_checks_end] {
            let threads: Vec<u32> = checks.iter().map(|c| c.threads).collect();
            assert_eq!(threads, vec![1, 2]);
            for c in checks.iter() {
                assert_eq!((c.experts, c.tokens_per_expert), (2, 1));
                assert!(c.time_us > 0.0 && c.reps > 0);
            }
        }
        let (profile, _, _) = fit_on(&d, &out);
        assert_eq!(profile.cpu_checks, probe_cpu_checks(&out));
        for (i, c) in profile.cpu_checks.iter().enumerate() {
            let (a, b) = (out.cpu_checks_start[i], out.cpu_checks_end[i]);
            let want = (a.time_us * b.time_us).sqrt();
            assert!((c.time_us - want).abs() <= 1e-9 * want, "{c:?}");
            assert_eq!(c.reps, a.reps + b.reps);
        }
        // A check with no partner (an outcome from before the end check) is kept as it is.
        let lone = ProbeOutcome {
            cpu_checks_end: Vec::new(),
            ..out.clone()
        };
        assert_eq!(probe_cpu_checks(&lone), out.cpu_checks_start);
    }

    #[test]
    fn steal_limits_outside_their_range_are_refused_naming_the_flag() {
        for (c, flag) in [
            (
                ProbeConfig {
                    max_steal: 1.5,
                    ..ProbeConfig::default()
                },
                "--max-steal",
            ),
            (
                ProbeConfig {
                    attempts: 0,
                    ..ProbeConfig::default()
                },
                "--attempts",
            ),
            (
                ProbeConfig {
                    max_ceiling_drift: 0.0,
                    ..ProbeConfig::default()
                },
                "--max-ceiling-drift",
            ),
        ] {
            let e = c.validate().unwrap_err().to_string();
            assert!(e.contains(flag), "{e}");
        }
    }

    /// The profile of a probe outcome on `d`, keyed as `ft probe` keys it.
    fn fit_on(d: &Device, out: &ProbeOutcome) -> (Profile, FitReport, HostSpec) {
        let cpu = CpuTopology::detect();
        let act = ActivationPath::preferred(out.model.format);
        fit_profile(
            d,
            out,
            host_fingerprint(
                d,
                &cpu,
                act,
                &EngineSettings::default(),
                &CacheOptions::default(),
            ),
            &FitConfig::default(),
        )
        .unwrap()
    }

    fn tiny() -> ModelSpec {
        ModelSpec {
            name: "tiny".into(),
            format: ExpertFormat::Nvfp4,
            geometry: MoeGeometry {
                hidden: 64,
                intermediate: 32,
                experts: 16,
                top_k: 2,
                moe_layers: 2,
                shared_experts: 0,
            },
            dense: None,
        }
    }

    /// A host-emulated device large enough for the tiny model's probe.
    fn host_device() -> Device {
        Device::host(HostDeviceConfig {
            memory_bytes: 256 << 20,
            ..Default::default()
        })
        .unwrap()
    }

    fn quick() -> ProbeConfig {
        ProbeConfig {
            threads: 1,
            streams: vec![1, 2],
            long_context: 256,
            context: 16,
            hybrid_fractions: vec![0.5],
            warmup_steps: 2,
            steps: 4,
            blocks: 2,
            budget_s: 1.0,
            ..ProbeConfig::default()
        }
    }

    #[test]
    fn the_second_geometry_is_the_benchs_where_sizes_differ_and_scaled_otherwise() {
        let qwen = ModelSpec::preset("qwen3.8-flash-next").unwrap();
        let (g, bench) = alt_geometry(&qwen).unwrap();
        assert!(bench);
        assert_eq!((g.hidden, g.intermediate), (3072, 1536));
        let b = ModelSpec::preset(BENCH_MODEL).unwrap();
        let (g, bench) = alt_geometry(&b).unwrap();
        assert!(!bench);
        assert_eq!(g.intermediate, 1536 / ALT_INTERMEDIATE_FACTOR);
        let (g, bench) = alt_geometry(&tiny()).unwrap();
        assert!(!bench);
        assert_eq!(g.intermediate, 32 * ALT_INTERMEDIATE_FACTOR);
        let ds = ModelSpec::preset("deepseek-v4-flash").unwrap();
        assert!(alt_geometry(&ds).unwrap().1);
    }

    #[test]
    fn layers_and_thread_counts() {
        let qwen = ModelSpec::preset("qwen3.8-flash-next").unwrap();
        let c = ProbeConfig::default();
        // 512 x 2.77 MB = 1.42 GB a layer: three fit in 4 GiB.
        assert_eq!(e2e_layers(&qwen, &c), 3);
        assert_eq!(
            e2e_layers(&ModelSpec::preset("deepseek-v4-flash").unwrap(), &c),
            1
        );
        assert_eq!(e2e_layers(&tiny(), &c), 2);
        assert_eq!(
            e2e_layers(
                &qwen,
                &ProbeConfig {
                    layers: Some(100),
                    ..c
                }
            ),
            48
        );
        assert_eq!(thread_counts(15), vec![15, 8, 4]);
        // The end-to-end probe's second pool: a quarter of the serving threads by default,
        // never the serving count itself.
        let with = |v: Option<Vec<usize>>| ProbeConfig {
            slowdown_threads: v,
            ..ProbeConfig::default()
        };
        assert_eq!(slowdown_threads(&with(None), 15), vec![4]);
        assert_eq!(slowdown_threads(&with(None), 1), Vec::<usize>::new());
        assert_eq!(
            slowdown_threads(&with(Some(vec![0])), 15),
            Vec::<usize>::new()
        );
        assert_eq!(
            slowdown_threads(&with(Some(vec![15, 8, 4, 8])), 15),
            vec![4, 8]
        );
        assert_eq!(thread_counts(1), vec![1]);
        assert_eq!(contended_threads(15, 32), vec![15, 8]);
        // 16 hardware threads: the load and the measuring thread keep two.
        assert_eq!(contended_threads(15, 16), vec![14, 7]);
        assert_eq!(contended_threads(1, 2), vec![1]);
        assert_eq!(counts(&[1, 5, 10, 20, 8], 12), vec![1, 5, 8, 10, 12]);
    }

    #[test]
    fn bad_configurations_name_the_flag() {
        for (c, flag) in [
            (
                ProbeConfig {
                    streams: vec![],
                    ..quick()
                },
                "--streams",
            ),
            (
                ProbeConfig {
                    cache_residency: 1.5,
                    ..quick()
                },
                "--cache-residency",
            ),
            (
                ProbeConfig {
                    hybrid_fractions: vec![2.0],
                    ..quick()
                },
                "--hybrid-fractions",
            ),
            (
                ProbeConfig {
                    steps: 2,
                    blocks: 3,
                    ..quick()
                },
                "--steps",
            ),
            (
                ProbeConfig {
                    budget_s: 0.0,
                    ..quick()
                },
                "--budget-s",
            ),
            (
                ProbeConfig {
                    layers: Some(0),
                    ..quick()
                },
                "--layers",
            ),
        ] {
            let e = c.validate().unwrap_err().to_string();
            assert!(e.contains(flag), "{e}");
        }
    }

    #[test]
    fn counts_of_a_record_keep_every_expert_and_token() {
        let c = RunCounts {
            hits: 3,
            misses: 5,
            fetched: 2,
            cpu: 3,
            gpu_tokens: 10,
            cpu_tokens: 4,
            gathered_bytes: 0,
        };
        let p = perf_counts(&c);
        assert_eq!((p.hits, p.fetched, p.cpu), (3.0, 2.0, 3.0));
        assert!((p.hit_tokens + p.fetched_tokens - 10.0).abs() < 1e-12);
        assert!((p.hit_tokens - 6.0).abs() < 1e-12);
        assert_eq!(p.cpu_tokens, 4.0);
        let none = perf_counts(&RunCounts::default());
        assert_eq!(none, PerfCounts::default());
    }

    /// The whole probe on the host-emulated device with a tiny model: every probe yields
    /// samples with positive times, the end-to-end runs yield calibration and validation
    /// blocks with the layers' counts, and the fit of them produces a valid profile.
    #[test]
    fn the_probe_runs_and_fits_on_the_host_device() {
        let d = host_device();
        let model = tiny();
        let mut phases = Vec::new();
        let out = run(&d, &model, &quick(), &mut |p, _| phases.push(p.to_string())).unwrap();
        assert_eq!(phases.first().map(String::as_str), Some("setup"));
        assert_eq!(phases.last().map(String::as_str), Some("done"));
        let s = &out.samples;
        assert!(s.gather.iter().any(|g| g.contended_cpu_threads.is_none()));
        assert!(s.gather.iter().any(|g| g.contended_cpu_threads.is_some()));
        assert!(s.cpu_step.iter().any(|c| c.contended) && s.cpu_step.iter().any(|c| !c.contended));
        for t in s
            .gather
            .iter()
            .map(|g| g.time_us)
            .chain(s.cpu_step.iter().map(|c| c.time_us))
        {
            assert!(t > 0.0 && t.is_finite(), "{t}");
        }
        assert!(!s.gpu_experts.is_empty() && !s.dense.is_empty() && !s.round_trip.is_empty());
        // Three byte sizes of the gather, two of the CPU step.
        let mut bytes: Vec<u64> = s.gather.iter().map(|g| g.expert_bytes as u64).collect();
        bytes.sort_unstable();
        bytes.dedup();
        assert_eq!(bytes.len(), 3, "{bytes:?}");
        // Every strategy ran at both stream counts; each run made two blocks.
        assert_eq!(out.e2e.len(), 4 * 2, "{:?}", out.e2e);
        assert_eq!(s.step.len(), 4 * 2 * 2);
        for st in &s.step {
            assert_eq!(st.layers.len(), 2 * 2, "two steps of two layers");
            assert!(st.time_us > 0.0);
        }
        assert!(s.step.iter().any(|st| st.role == SampleRole::Validation));
        let cpu_run = out
            .e2e
            .iter()
            .find(|r| r.strategy.kind() == StrategyKind::Cpu)
            .unwrap();
        assert!(cpu_run.tok_s_per_stream > 0.0);
        let offload = s
            .step
            .iter()
            .find(|st| st.strategy == StrategyKind::Offload)
            .unwrap();
        assert!(offload.layers.iter().all(|c| c.cpu == 0.0));
        // The host's own time per layer from every calibration block with a CPU share (cpu
        // and hybrid at both stream counts), none from the others.
        assert_eq!(s.host.len(), 2 * 2, "{:?}", s.host);
        for h in &s.host {
            assert!(matches!(
                h.strategy,
                StrategyKind::Cpu | StrategyKind::Hybrid
            ));
            assert!(h.counts.cpu > 0.0 && h.time_us > 0.0, "{h:?}");
        }
        // The hypervisor's share of the CPU time during the probe, where Linux reports it.
        if cfg!(target_os = "linux") {
            let f = out.host_steal_fraction.expect("steal read from /proc/stat");
            assert!((0.0..=1.0).contains(&f), "{f}");
        }
        assert!((1..=ProbeConfig::default().attempts).contains(&out.attempts));
        assert!(out.stream_read_start_gbs.is_some_and(|g| g > 0.0));
        assert!(out.ceiling_drift().is_some());
        // The link's busy time beside a CPU share, from the hybrid blocks alone.
        assert!(!s.link.is_empty());
        for l in &s.link {
            assert!(l.counts.fetched > 0.0 && l.counts.cpu > 0.0, "{l:?}");
            assert!(l.time_us > 0.0 && l.threads.is_some(), "{l:?}");
        }
        assert!(
            out.bench_bw.is_none(),
            "the tiny model's geometries are not the bench's"
        );

        let (profile, report, host) = fit_on(&d, &out);
        profile.params.validate().unwrap();
        assert_eq!(host.gpu.name, d.info().name);
        assert_eq!(
            profile.key.model.geometry, model.geometry,
            "keyed by the served geometry"
        );
        assert!(report.stages.iter().any(|st| st.name == "gather"));
        assert!(!report.validation.is_empty());
        assert!(report.residuals.iter().all(|r| r.rel.is_finite()));
    }

    /// With a second pool size, the end-to-end probe runs `cpu` and hybrid (its middle
    /// fraction) again there, tags those blocks with it, and the fit measures the serving
    /// slowdown at that count; the engine serves at the serving count afterwards.
    #[test]
    fn the_probe_calibrates_the_slowdown_at_a_second_thread_count() {
        let d = host_device();
        let config = ProbeConfig {
            threads: 2,
            slowdown_threads: Some(vec![1]),
            ..quick()
        };
        let out = run(&d, &tiny(), &config, &mut |_, _| {}).unwrap();
        let at_one: Vec<&E2eRun> = out.e2e.iter().filter(|r| r.threads == 1).collect();
        let mut kinds: Vec<StrategyKind> = at_one.iter().map(|r| r.strategy.kind()).collect();
        kinds.sort_by_key(|k| k.name());
        assert_eq!(
            kinds,
            vec![
                StrategyKind::Cpu,
                StrategyKind::Cpu,
                StrategyKind::Hybrid,
                StrategyKind::Hybrid
            ]
        );
        assert!(out
            .e2e
            .iter()
            .filter(|r| r.threads != 1)
            .all(|r| r.threads == 2));
        let tagged: Vec<&StepSample> = out
            .samples
            .step
            .iter()
            .filter(|s| s.threads == Some(1))
            .collect();
        assert_eq!(tagged.len(), 4 * 2, "four runs of two blocks");
        assert!(tagged.iter().all(|s| s.layers.iter().any(|c| c.cpu > 0.0)));
        let (profile, _, _) = fit_on(&d, &out);
        let k = &profile.params.cpu_serving_slowdown_at;
        assert_eq!(k.len(), 1, "{k:?}");
        assert_eq!(k[0].threads, 1);
        assert!(k[0].slowdown.is_finite() && k[0].se.is_finite(), "{k:?}");
        assert_eq!(profile.params.cpu_threads, 2);
    }

    #[test]
    fn the_topology_is_sane() {
        let t = CpuTopology::detect();
        assert!(t.threads >= t.cores && t.cores >= 1 && t.numa_nodes >= 1);
        assert!(!t.model.is_empty());
    }
}
