//! `ft run`: decode on the real runtime with one strategy and print what happened.
//!
//! Arguments are validated into a plan before any memory is touched: the model (with
//! `--layers` applied), the strategy (hybrid's `auto` resolved by the performance model of
//! `--host`), the cache size, and the memory the run needs on this machine, refused with an
//! error naming the flag to change when it does not fit. Then the engine is built, the link's
//! linear H2D bandwidth measured (for the PCIe bound), the bank read STREAM-style before
//! each round where a CPU share runs (the CPU's same-run ceiling), the warm-up and measured
//! steps run,
//! and the summary printed (a table, or `--json`), with an optional Chrome trace and the
//! numerics comparison. `--probe-overhead` instead measures hybrid's fixed cost per layer.

use anyhow::{bail, Context, Result};
use serde::Serialize;
use std::io::Write;
use std::path::PathBuf;

use ft_kernels::ActivationPath;
use ft_model::cache::{CacheOptions, CachePolicy, CacheSize};
use ft_model::perf::CpuSpeedSource;
use ft_model::profile::CpuCheck;
use ft_model::routing::{self, RoutingSource};
use ft_model::{
    CpuLayers, ExpertFormat, FetchFraction, GpuLayout, GpuPlacement, ModelSpec, Strategy,
    StrategyKind,
};
use ft_runtime::cpu_pool::PoolWait;
use ft_runtime::device::{Device, DeviceInfo, DeviceKind, DeviceSpec, HostDeviceConfig};
use ft_runtime::engine::probe::{probe_hybrid_overhead, OverheadReport};
use ft_runtime::engine::{
    decode, decode_multi, draw_routing, record_routing, CombineMethod, CombineOrder, DecodeOptions,
    Engine, EngineConfig, EngineMemory, EngineSettings, GpuCounts, MultiEngine,
};
use ft_runtime::gather::GatherMethod;
use ft_runtime::instrument::{ChromeTrace, RunSummary, StepRecord};
use ft_runtime::numerics::{compare_numerics, NumericsReport};

/// Repetitions of the CPU ceiling's STREAM read of the bank before each round ([`CpuBound`];
/// the median is the round's reading).
const CPU_CEILING_REPS: usize = 3;
/// Experts of the bank between the starts of two rounds' CPU checks (a prime, so that the
/// rounds read different weights).
const CPU_CHECK_STRIDE: usize = 1009;

/// Share of the available RAM a run may plan to use (the rest is for the OS and the page
/// cache).
const RAM_SHARE: f64 = 0.9;
/// Extra emulated device memory beyond what the engine plans, bytes (allocator rounding).
const HOST_DEVICE_SLACK: u64 = 64 << 20;
/// Largest copy of the linear H2D probe, bytes.
const LINEAR_PROBE_BYTES: usize = 256 << 20;
/// Repetitions of the linear H2D probe (median).
const LINEAR_PROBE_REPS: usize = 5;
/// Bytes per GB (1e9) and per GiB.
const GB: f64 = 1e9;
const GIB: f64 = (1u64 << 30) as f64;

/// Arguments of `ft run`.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// Model: a preset name, a model TOML file, a Hugging Face config.json or a GGUF file.
    #[arg(long, default_value = crate::predict::DEFAULT_MODEL)]
    model: String,
    /// offload, hybrid[:F], resident, cpu, layer-split:N (the experts of the first N layers
    /// on the CPU, the others resident on the GPU: llama.cpp's `--n-cpu-moe N`) or
    /// layer-split-cached:N (the others cached, every miss gathered); N may be auto (the
    /// performance model of --host chooses it under the GPU memory budget).
    #[arg(long, required_unless_present_any = ["probe_overhead", "interleave"], conflicts_with = "interleave")]
    strategy: Option<String>,
    /// Decode several strategies on one engine instead of --strategy, in turn and in rounds
    /// (`--repeat` rounds, each from an empty cache, the order rotated every round), so that
    /// a slow stretch of a shared machine falls on all of them alike and the host bank is
    /// filled once: a comma-separated list of `[LABEL=]STRATEGY[:P]`, e.g.
    /// `offload,hybrid:0.35,rules=hybrid:0.39,cpu,layer-split-cached:4` (P: hybrid's fetch
    /// fraction or auto, layer-split-cached's CPU layers; LABEL names the variant's report,
    /// default the strategy). Not with resident or layer-split (slots of their own).
    #[arg(long, value_delimiter = ',', conflicts_with_all = ["fetch_fraction", "compare_numerics", "trace_out", "stamps_out"])]
    interleave: Vec<String>,
    /// With --interleave: write each variant's report (the --json document of a plain run)
    /// to `PREFIX<LABEL>.json`, atomically.
    #[arg(long, requires = "interleave")]
    report_prefix: Option<String>,
    /// Hybrid's fetch fraction: a number in [0, 1], or auto (the performance model of
    /// --host chooses it).
    #[arg(long)]
    fetch_fraction: Option<String>,
    /// Host whose performance model resolves `--fetch-fraction auto`: a preset, a host TOML
    /// or a profile JSON of `ft probe` (this machine as fitted). With a profile that kept its
    /// CPU checks, a run on one GPU decides the fraction at the CPU check before its first
    /// round (the CPU side's speed now against the probe's, as `ft serve` does at start).
    #[arg(long)]
    host: Option<String>,
    /// With `--fetch-fraction auto` and a profile as `--host`: decide the fraction at the CPU
    /// speed the profile was probed at, not at the CPU check before the first round.
    #[arg(long)]
    no_cpu_check: bool,
    /// Concurrent streams.
    #[arg(long, default_value_t = 1)]
    streams: usize,
    /// Measured decode steps.
    #[arg(long, default_value_t = 32)]
    steps: usize,
    /// Warm-up steps before them (they fill the cache; not measured).
    #[arg(long, default_value_t = 4)]
    warmup: usize,
    /// Expert cache slots (offload, hybrid and cpu).
    #[arg(long, conflicts_with = "cache_gb")]
    cache_slots: Option<usize>,
    /// Expert cache size in GiB (2^30 bytes).
    #[arg(long)]
    cache_gb: Option<f64>,
    /// The cache's policy, topology and admission.
    #[command(flatten)]
    cache_args: crate::cache_args::CacheArgs,
    /// Routing: a preset (uniform, mild, typical, skewed), a process TOML or a trace file.
    #[arg(long, default_value = "typical")]
    routing: String,
    /// Record the routing of every step to this trace file.
    #[arg(long)]
    record: Option<PathBuf>,
    /// Context length of every stream at the first step, tokens (grows by one per step).
    #[arg(long, default_value_t = 1024)]
    context: usize,
    /// CPU pool workers (default: cores - 1 on CUDA, 1 on the host device).
    #[arg(long)]
    threads: Option<usize>,
    /// cuda, host, or auto (CUDA where available, else host).
    #[arg(long, default_value = "auto")]
    device: String,
    /// Run only the first N MoE layers of the model's geometry (to fit a memory budget).
    #[arg(long)]
    layers: Option<usize>,
    /// Seed of the expert weights, the routing process and the inputs.
    #[arg(long, default_value_t = 0)]
    seed: u64,
    /// Write a Chrome trace (chrome://tracing, Perfetto) of every step to this file.
    #[arg(long)]
    trace_out: Option<PathBuf>,
    /// Write the expert kernels' block timelines of the last measured step (of the median
    /// round) to this CSV file, which `gpu_backend --analyze-stamps FILE` reads: when each
    /// block started, got its weights, computed and ended, per launch. Needs `--device
    /// cuda` with the timelines compiled in (`FT_CUDA_STAMPS=1`, which slows the kernels a
    /// little); one GPU, one strategy.
    #[arg(long)]
    stamps_out: Option<PathBuf>,
    /// Print JSON instead of the table.
    #[arg(long)]
    json: bool,
    /// Also run fresh (no warm-up) and as offload, and report the outputs' deviations.
    #[arg(long)]
    compare_numerics: bool,
    /// GPU expert activation path: int8 (W4A8/W8A8) or f32. Default: int8 where the format
    /// has it (the same bits as the CPU's int8 path), else f32.
    #[arg(long)]
    gpu_act: Option<String>,
    /// CPU expert activation path: int8 (W4A8/W8A8) or f32. Default as `--gpu-act`.
    #[arg(long)]
    cpu_act: Option<String>,
    /// Combine order of expert outputs: fixed (placement-independent) or fast.
    #[arg(long, default_value = "fixed")]
    combine: String,
    /// Gather method: copy-engine or zero-copy.
    #[arg(long, default_value = "copy-engine")]
    gather: String,
    /// How the CPU pool waits between layers: spin (the host thread computes as one of
    /// --threads), spin-beside (--threads workers, the host spinning idle beside them) or
    /// park (default: spin on CUDA, park on the host device).
    #[arg(long)]
    pool_wait: Option<String>,
    /// The engine's settings (`--engine-config FILE`, `--fetch-chunks N`), as `ft probe` and
    /// `ft serve` take them.
    #[command(flatten)]
    engine: crate::engine_args::EngineArgs,
    /// Host device only: emulated link bandwidth, GB/s.
    #[arg(long)]
    link_gbps: Option<f64>,
    /// Record no per-operation timing events (only host-side times and counts).
    #[arg(long)]
    no_timeline: bool,
    /// Decode the same steps this many times in this process (the cache emptied before
    /// each) and report the repetition with the median total tok/s, every repetition's
    /// tok/s beside it: one slow stretch of a shared machine then does not make the run.
    #[arg(long, default_value_t = 1)]
    repeat: usize,
    /// Measure hybrid's fixed cost per layer with tiny work instead of decoding.
    #[arg(long)]
    probe_overhead: bool,
    /// GPUs decoding together (CUDA devices 0..N, or N host-emulated devices); the cache
    /// size flags are then per GPU and --threads the CPU workers of all GPUs together.
    #[arg(long, default_value_t = 1)]
    gpus: u32,
    /// How experts are laid out over the GPUs: sharded (each expert on GPU `expert % N`) or
    /// tensor-parallel (each expert split into N slices along its intermediate dimension).
    #[arg(long, default_value = "sharded")]
    placement: String,
}

/// The link bound of a run that gathers: how close the measured step is to the time its
/// gathered bytes need at the link's linear bandwidth.
#[derive(Debug, Clone, Serialize)]
pub struct PcieBound {
    /// Linear host-to-device bandwidth measured in this run, GB/s.
    pub linear_h2d_gbs: f64,
    /// Mean bytes gathered per step.
    pub gathered_bytes_per_step: f64,
    /// Those bytes at the linear bandwidth, us.
    pub bound_step_us: f64,
    /// `bound_step_us / mean step time` (1 = at the bound).
    pub share_of_bound: f64,
}

/// The CPU share against what the same threads can merely read of the same bytes: a
/// STREAM-style read (`ft_kernels::stream`) of the host bank with the run's threads, taken
/// before each round of the process (runs with a CPU share). At one token per expert the CPU
/// share is memory-bound, so `share_of_stream` says how close it came; the readings' spread
/// says how much the machine itself moved during the run.
#[derive(Debug, Clone, Serialize)]
pub struct CpuBound {
    /// Threads that read (the run's computing threads).
    pub threads: usize,
    /// Bytes of the bank read per repetition.
    pub bytes: u64,
    /// The median of the readings, GB/s.
    pub stream_read_gbs: f64,
    /// Each round's reading (the median of its repetitions), in run order, GB/s.
    pub stream_read_rounds_gbs: Vec<f64>,
    /// Expert bytes the CPU computed per step (each CPU expert's weights read once).
    pub cpu_bytes_per_step: f64,
    /// Those bytes over the CPU pool's busy time per step, GB/s.
    pub cpu_gbs_while_busy: f64,
    /// `cpu_gbs_while_busy / stream_read_gbs`.
    pub share_of_stream: f64,
    /// The CPU check (`ft_runtime::cpu_check`: one layer of `top_k` experts at one token
    /// with the run's threads) after each round's read: its median over the rounds, the
    /// work it timed and its repetitions summed. Set against the profile's check of the same
    /// work (`Profile::cpu_speed`), it says how fast the CPU side ran here against the probe.
    pub cpu_check: Option<CpuCheck>,
    /// Each round's check time, in run order, us.
    pub cpu_check_rounds_us: Vec<f64>,
}

impl CpuBound {
    /// The bound of a run whose summary is `s`, from the readings of its process.
    fn of(
        s: &RunSummary,
        layers: usize,
        expert_bytes: u64,
        threads: usize,
        ceiling: &BankReads,
    ) -> Option<Self> {
        if s.cpu_per_layer <= 0.0 || ceiling.gbs.is_empty() {
            return None;
        }
        let stream = ft_kernels::stream::median(&ceiling.gbs);
        let check_rounds_us: Vec<f64> = ceiling.checks.iter().map(|c| c.time_us).collect();
        let bytes = s.cpu_per_layer * layers as f64 * expert_bytes as f64;
        let busy = if s.cpu_busy_us > 0.0 {
            bytes / (s.cpu_busy_us * 1e3)
        } else {
            0.0
        };
        Some(CpuBound {
            threads,
            bytes: ceiling.bytes,
            stream_read_gbs: stream,
            stream_read_rounds_gbs: ceiling.gbs.clone(),
            cpu_bytes_per_step: bytes,
            cpu_gbs_while_busy: busy,
            share_of_stream: if stream > 0.0 { busy / stream } else { 0.0 },
            cpu_check: ceiling.checks.first().map(|first| CpuCheck {
                time_us: ft_kernels::stream::median(&check_rounds_us),
                reps: ceiling.checks.iter().map(|c| c.reps).sum(),
                ..*first
            }),
            cpu_check_rounds_us: check_rounds_us,
        })
    }
}

/// The readings behind a [`CpuBound`]: one STREAM read of a window of the bank per round
/// (`ft_kernels::stream::read_window`, the reading `ft probe` takes too), and one CPU check
/// (`Engine::cpu_check`, which `ft probe` takes too).
struct BankReads {
    pool: std::sync::Arc<rayon::ThreadPool>,
    bytes: u64,
    gbs: Vec<f64>,
    checks: Vec<CpuCheck>,
}

impl BankReads {
    fn new(threads: usize) -> Result<Self> {
        let pool = ft_kernels::step::build_pool(threads.max(1))
            .context("starting the STREAM read's threads")?;
        Ok(BankReads {
            pool,
            bytes: 0,
            gbs: Vec::new(),
            checks: Vec::new(),
        })
    }

    /// Read a window of `bank` (a different one each round where the bank is larger).
    fn read(&mut self, bank: &[u8], round: usize) {
        if bank.is_empty() {
            return;
        }
        let r = ft_kernels::stream::read_window(
            &self.pool,
            bank,
            ft_kernels::stream::CEILING_READ_BYTES,
            round,
            CPU_CEILING_REPS,
        );
        self.bytes = r.bytes;
        self.gbs.push(r.median_gbs());
    }
}

/// Everything `ft run` reports (the `--json` document).
#[derive(Debug, Clone, Serialize)]
pub struct RunReport {
    /// The variant's label: the strategy, or the label given in `--interleave`.
    pub label: String,
    /// Model name.
    pub model: String,
    /// Expert format.
    pub format: String,
    /// Bytes of one routed expert.
    pub expert_bytes: u64,
    /// MoE layers run.
    pub layers: usize,
    /// MoE layers of the model.
    pub model_layers: usize,
    /// The strategy as run.
    pub strategy: String,
    /// Fetch fraction the plans used.
    pub fetch_fraction: f64,
    /// Where it came from (for layer split: its CPU layers and where they came from).
    pub fetch_source: String,
    /// Layer split's CPU layers (the first ones); absent for the other strategies.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cpu_layers: Option<usize>,
    /// For an auto fraction decided at the CPU check before the first round (`--host` a
    /// profile with its checks): the CPU side's speed then against the probe's, which the
    /// performance model's CPU side was scaled by.
    pub auto_cpu_speed: Option<f64>,
    /// The device.
    pub device: DeviceInfo,
    /// CPU pool workers.
    pub threads: usize,
    /// How the pool waited.
    pub pool_wait: String,
    /// The engine's settings it ran with (`--engine-config`, `--fetch-chunks`).
    pub engine: EngineSettings,
    /// Whether a layer's last fetched chunk's launch was gated on a flag (where the engine
    /// can: one GPU, copy-engine gathers, stream flag writes).
    pub gate_last_chunk: bool,
    /// GPU / CPU activation paths.
    pub gpu_act: String,
    /// CPU activation path.
    pub cpu_act: String,
    /// Combine order.
    pub combine: String,
    /// Gather method.
    pub gather: String,
    /// Streams.
    pub streams: usize,
    /// Context at the first step, tokens.
    pub context: usize,
    /// Cache slots (and staging slots).
    pub cache_slots: usize,
    /// Staging slots for refused admissions.
    pub staging_slots: usize,
    /// Cache policy.
    pub policy: String,
    /// The cache's options (policy, topology, slots per layer, admission).
    #[serde(default)]
    pub cache_options: CacheOptions,
    /// Routing.
    pub routing: String,
    /// Seed.
    pub seed: u64,
    /// Memory the engine planned.
    pub memory: EngineMemory,
    /// The measured steps summarised.
    pub summary: RunSummary,
    /// The link bound (runs that gather).
    pub pcie: Option<PcieBound>,
    /// The CPU share against a same-run STREAM read (runs with a CPU share).
    pub cpu: Option<CpuBound>,
    /// Numerics (with --compare-numerics).
    pub numerics: Option<NumericsReport>,
    /// Notes (fewer layers, defaults taken).
    pub notes: Vec<String>,
    /// Every step, per layer (of the reported repetition).
    pub step_records: Vec<StepRecord>,
    /// Total decode tok/s of every repetition, in run order (`--repeat`); the summary is of
    /// the one with the median.
    pub repeats: Vec<f64>,
    /// Share of the machine's CPU time the hypervisor stole while this variant decoded (all
    /// its repetitions), 0 to 1 (`/proc/stat`; absent where it cannot be read). A run with
    /// steal stalled wherever a stolen vCPU held a CPU-pool worker.
    pub host_steal_fraction: Option<f64>,
}

/// The index of the median of `v` (the lower middle for an even count); `v` is not empty.
fn median_index(v: &[f64]) -> usize {
    let mut order: Vec<usize> = (0..v.len()).collect();
    order.sort_by(|&a, &b| v[a].total_cmp(&v[b]));
    order[(v.len() - 1) / 2]
}

/// Bytes of memory available on this machine (Linux `MemAvailable`), if known.
fn available_ram() -> Option<u64> {
    let text = std::fs::read_to_string("/proc/meminfo").ok()?;
    let line = text.lines().find(|l| l.starts_with("MemAvailable:"))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib * 1024)
}

/// An activation path flag, or the format's preferred path where it is not given.
fn parse_path(flag: &str, s: Option<&str>, format: ExpertFormat) -> Result<ActivationPath> {
    match s {
        Some(s) => s
            .parse::<ActivationPath>()
            .with_context(|| flag.to_string()),
        None => Ok(ActivationPath::preferred(format)),
    }
}

/// Check the run's memory against this machine; errors name the flag to change.
fn check_memory(
    model: &ModelSpec,
    full_layers: usize,
    cfg: &EngineConfig,
    kind: DeviceKind,
    available: u64,
) -> Result<EngineMemory> {
    let mem = EngineMemory::of(model, cfg);
    let budget = (available as f64 * RAM_SHARE) as u64;
    let need = match kind {
        DeviceKind::Host => mem.host_bytes() + mem.device_bytes(),
        DeviceKind::Cuda => mem.host_bytes(),
    };
    if need <= budget {
        return Ok(mem);
    }
    let g = &model.geometry;
    // What one more layer costs on this machine, and what does not depend on layers.
    let one = EngineMemory::of(&model.with_layers(1), cfg);
    let per_layer = match kind {
        DeviceKind::Host => {
            // The emulated device's slots that grow with the layers: resident's, and layer
            // split's resident layers (one layer's experts each).
            let slots_per_layer = match cfg.strategy.kind() {
                StrategyKind::Resident | StrategyKind::LayerSplit => {
                    EngineMemory::of(&model.with_layers(1), &resident_cfg(cfg)).slot_bytes
                }
                StrategyKind::Offload
                | StrategyKind::Hybrid
                | StrategyKind::Cpu
                | StrategyKind::LayerSplitCached => 0,
            };
            one.bank_bytes + one.dense_bytes + slots_per_layer
        }
        DeviceKind::Cuda => one.bank_bytes,
    };
    let fixed = need.saturating_sub(per_layer * g.moe_layers as u64);
    let fit = budget.saturating_sub(fixed) / per_layer.max(1);
    let where_ = match kind {
        DeviceKind::Host => "the host-emulated device keeps the bank and the device memory in RAM",
        DeviceKind::Cuda => "the host bank is pinned host memory",
    };
    bail!(
        "this run needs {:.1} GB of RAM: the host bank alone is {} layers x {} experts x {:.2} MB = {:.1} GB \
         (cache {:.2} GB, dense and KV {:.2} GB); {where_}, and this machine has {:.1} GB available. \
         Run fewer layers of the same geometry with --layers {} (of {full_layers}){}",
        need as f64 / GB,
        g.moe_layers,
        g.experts,
        model.expert_bytes() as f64 / 1e6,
        mem.bank_bytes as f64 / GB,
        mem.slot_bytes as f64 / GB,
        mem.dense_bytes as f64 / GB,
        available as f64 / GB,
        fit.max(1),
        if fit == 0 {
            ", and a smaller --cache-slots, --streams or --context"
        } else {
            ""
        }
    )
}

/// `cfg` with every expert resident: what one layer's resident slots take.
fn resident_cfg(cfg: &EngineConfig) -> EngineConfig {
    EngineConfig {
        strategy: Strategy::Resident,
        ..cfg.clone()
    }
}

/// The performance model that resolves `--fetch-fraction auto` (`--host`), and the probe's
/// CPU checks a check before the first round is set against.
struct AutoHost {
    name: String,
    perf: ft_model::perf::PerfModel,
    cpu_checks: Vec<CpuCheck>,
}

impl AutoHost {
    /// `--host` as given; an error naming the flag where it is missing or unreadable.
    fn of_args(args: &Args) -> Result<AutoHost> {
        let Some(host) = &args.host else {
            bail!(
                "an auto fetch fraction or number of CPU layers needs the performance model's \
                 parameters: give --host HOST (a host preset, a host TOML or a profile JSON), or \
                 a number (--fetch-fraction F, layer-split:N)"
            );
        };
        let h = ft_sim::hosts::resolve_host(host).with_context(|| format!("--host {host}"))?;
        Ok(AutoHost {
            name: h.name,
            perf: h.perf,
            cpu_checks: h.cpu_checks,
        })
    }

    /// Hybrid's best fetch fraction by `perf` (this host's model, or it rescaled) for the run:
    /// its traffic simulation counts the run's own steps after its warm-up, of the routing
    /// the run decodes (as `ft predict --steps --warmup --seed` does).
    fn fraction(
        perf: &ft_model::perf::PerfModel,
        args: &Args,
        model: &ModelSpec,
        slots: usize,
        policy: &CacheOptions,
    ) -> Result<f64> {
        let config = ft_model::perf::PredictConfig {
            streams: args.streams,
            context: args.context,
            cache: Some(CacheSize::Slots(slots.max(1))),
            cache_options: policy.clone(),
            routing: args.routing.clone(),
            seed: Some(args.seed),
            warmup_steps: args.warmup,
            steps: args.steps,
            hybrid_fetch: FetchFraction::Auto,
            ..Default::default()
        };
        let pred = ft_model::perf::predict(model, perf, &config)
            .context("predicting hybrid's best fetch fraction")?;
        Ok(pred.get(StrategyKind::Hybrid).fetch_fraction)
    }

    /// The fraction at the speed the host was probed (or specified) at, and where it came from.
    fn resolve(
        &self,
        args: &Args,
        model: &ModelSpec,
        slots: usize,
        policy: &CacheOptions,
    ) -> Result<(f64, String)> {
        let f = Self::fraction(&self.perf, args, model, slots, policy)?;
        Ok((f, self.source_of(&self.perf)))
    }

    /// Layer split's best number of CPU layers by this host's model for the run (`kind` one of
    /// the layer splits), as `ft predict --strategy KIND:auto` finds it: among the counts
    /// whose resident layers fit the GPU memory budget of the host (`layer-split`), or with
    /// the run's cache of `slots` (`layer-split-cached`).
    fn cpu_layers(
        &self,
        args: &Args,
        model: &ModelSpec,
        kind: StrategyKind,
        slots: usize,
        cache_options: &CacheOptions,
    ) -> Result<(usize, String)> {
        let cache = match kind {
            StrategyKind::LayerSplitCached => Some(CacheSize::Slots(slots.max(1))),
            StrategyKind::LayerSplit
            | StrategyKind::Offload
            | StrategyKind::Hybrid
            | StrategyKind::Resident
            | StrategyKind::Cpu => None,
        };
        let config = ft_model::perf::PredictConfig {
            streams: args.streams,
            context: args.context,
            cache,
            cache_options: cache_options.clone(),
            routing: args.routing.clone(),
            seed: Some(args.seed),
            warmup_steps: args.warmup,
            steps: args.steps,
            layer_split: Some(CpuLayers::Auto),
            ..Default::default()
        };
        let pred = ft_model::perf::predict(model, &self.perf, &config)
            .with_context(|| format!("predicting {kind}'s best number of CPU layers"))?;
        let n = pred
            .try_get(kind)
            .and_then(|p| p.cpu_layers)
            .with_context(|| format!("the performance model has no {kind} prediction"))?;
        Ok((n, self.source_of(&self.perf)))
    }

    /// Where an auto fraction decided by `perf` (this host's model, or it rescaled) came from.
    fn source_of(&self, perf: &ft_model::perf::PerfModel) -> String {
        format!(
            "auto: the performance model of host '{}' ({})",
            self.name, perf.source
        )
    }
}

/// Decide the auto variants' fraction again at the CPU check `now` (taken before the first
/// round), with the host's CPU side scaled by its speed against the probe's check of the same
/// work ([`CpuCheck::speed_against`], `PerfModel::at_cpu_speed`), as `ft serve` does at
/// start. Leaves them as they are where the host holds no check of this work (logged).
fn resolve_auto_at_check(
    host: &AutoHost,
    now: &CpuCheck,
    variants: &mut [Variant],
    args: &Args,
    model: &ModelSpec,
    slots: usize,
    policy: &CacheOptions,
) -> Result<()> {
    let Some((speed, probe)) = CpuCheck::speed_against(&host.cpu_checks, now)
        .context("setting the CPU check before the first round against --host's")?
    else {
        tracing::info!(
            threads = now.threads,
            "--host holds no CPU check of this work: the auto fraction stays at the probed speed"
        );
        return Ok(());
    };
    let why = CpuSpeedSource::Checked {
        when: "before the first round".into(),
        now_us: now.time_us,
        probe_us: probe.time_us,
    };
    let scaled = host
        .perf
        .at_cpu_speed(speed, &why)
        .context("scaling the CPU side by the check before the first round")?;
    let source = host.source_of(&scaled);
    let f = AutoHost::fraction(&scaled, args, model, slots, policy)?;
    tracing::info!("{source}: fetch fraction {f:.3}");
    for v in variants
        .iter_mut()
        .filter(|v| v.auto && v.strategy.kind() == StrategyKind::Hybrid)
    {
        v.fetch = f;
        v.strategy = Strategy::Hybrid {
            fetch: FetchFraction::fixed(v.label.as_str(), f)?,
        };
        v.fetch_source = source.clone();
        v.auto_cpu_speed = Some(speed);
    }
    Ok(())
}

/// One strategy of a run as given: `--strategy` with `--fetch-fraction`, or one item of
/// `--interleave`.
#[derive(Debug, Clone, PartialEq)]
struct VariantSpec {
    /// Names the variant's report.
    label: String,
    kind: StrategyKind,
    /// Hybrid's fetch fraction as given (a number or auto).
    fetch: Option<String>,
    /// Layer split's CPU layers as given (a number or auto).
    cpu_layers: Option<String>,
    /// The flag it came from, for errors.
    flag: &'static str,
}

/// A strategy ready to decode.
#[derive(Debug, Clone)]
struct Variant {
    label: String,
    strategy: Strategy,
    /// Fetch fraction the plans use.
    fetch: f64,
    /// Where it came from (given, auto with its host, the strategy's own).
    fetch_source: String,
    /// Hybrid's fraction given as auto (decided by `--host`'s performance model).
    auto: bool,
    /// Layer split's CPU layers (`None` for the other strategies).
    cpu_layers: Option<usize>,
    /// Whether some layer gathers misses over the link.
    gathers: bool,
    /// Whether some layer computes experts on the CPU.
    uses_cpu: bool,
    /// The CPU speed against the probe's that an auto fraction was decided at (the check
    /// before the first round), if it was.
    auto_cpu_speed: Option<f64>,
}

/// Parse one `--interleave` item: `[LABEL=]STRATEGY[:F]`.
fn parse_variant_spec(item: &str) -> Result<VariantSpec> {
    let item = item.trim();
    let (label, rest) = match item.split_once('=') {
        Some((l, r)) => (Some(l.trim()), r.trim()),
        None => (None, item),
    };
    let (kind, param) = match rest.split_once(':') {
        Some((k, f)) => (k.trim(), Some(f.trim().to_string())),
        None => (rest, None),
    };
    let kind: StrategyKind = kind
        .parse()
        .with_context(|| format!("--interleave '{item}'"))?;
    let (fetch, cpu_layers) = match (kind, param) {
        (StrategyKind::Resident, _) => bail!(
            "--interleave '{item}': resident needs an engine of its own (every expert cached); \
             run it with --strategy resident"
        ),
        (StrategyKind::LayerSplit, _) => bail!(
            "--interleave '{item}': layer-split needs an engine of its own (its resident layers' \
             slots); run it with --strategy layer-split:N"
        ),
        (StrategyKind::Hybrid, None) => bail!(
            "--interleave '{item}': hybrid needs its fetch fraction, e.g. hybrid:0.4 or hybrid:auto"
        ),
        (StrategyKind::Hybrid, Some(f)) => (Some(f), None),
        (StrategyKind::LayerSplitCached, None) => bail!(
            "--interleave '{item}': layer-split-cached needs its CPU layers, e.g. \
             layer-split-cached:4"
        ),
        (StrategyKind::LayerSplitCached, Some(n)) => (None, Some(n)),
        (StrategyKind::Offload | StrategyKind::Cpu, Some(_)) => bail!(
            "--interleave '{item}': only hybrid takes a fetch fraction (STRATEGY:F), and \
             layer-split-cached its CPU layers (STRATEGY:N)"
        ),
        (StrategyKind::Offload | StrategyKind::Cpu, None) => (None, None),
    };
    let label = label.map_or_else(|| kind.to_string(), str::to_string);
    if label.is_empty()
        || !label
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || "-_.".contains(c))
    {
        bail!("--interleave '{item}': a label is letters, digits, '-', '_' or '.'");
    }
    Ok(VariantSpec {
        label,
        kind,
        fetch,
        cpu_layers,
        flag: "--interleave",
    })
}

/// The run's strategies as given: one from `--strategy`, or the `--interleave` list (labels
/// distinct).
fn variant_specs(args: &Args) -> Result<Vec<VariantSpec>> {
    if args.interleave.is_empty() {
        let given = args.strategy.as_deref().unwrap_or_default();
        let (name, param) = match given.split_once(':') {
            Some((k, p)) => (k, Some(p.to_string())),
            None => (given, None),
        };
        let kind: StrategyKind = name.parse().context("--strategy")?;
        let (fetch, cpu_layers, flag) = match (kind, param) {
            (StrategyKind::Hybrid, Some(_)) if args.fetch_fraction.is_some() => bail!(
                "--strategy {given}: give hybrid's fetch fraction once (hybrid:F or \
                 --fetch-fraction F)"
            ),
            (StrategyKind::Hybrid, Some(f)) => (Some(f), None, "--strategy"),
            (StrategyKind::LayerSplit | StrategyKind::LayerSplitCached, n) => (
                args.fetch_fraction.clone(),
                Some(n.unwrap_or_else(|| "auto".into())),
                "--strategy",
            ),
            (StrategyKind::Offload | StrategyKind::Resident | StrategyKind::Cpu, Some(p)) => {
                bail!("--strategy {given}: {kind} takes no parameter (got '{p}')")
            }
            (
                StrategyKind::Hybrid
                | StrategyKind::Offload
                | StrategyKind::Resident
                | StrategyKind::Cpu,
                None,
            ) => (args.fetch_fraction.clone(), None, "--fetch-fraction"),
        };
        return Ok(vec![VariantSpec {
            label: kind.to_string(),
            kind,
            fetch,
            cpu_layers,
            flag,
        }]);
    }
    let specs = args
        .interleave
        .iter()
        .map(|i| parse_variant_spec(i))
        .collect::<Result<Vec<_>>>()?;
    for (i, a) in specs.iter().enumerate() {
        if specs[..i].iter().any(|b| b.label == a.label) {
            bail!(
                "--interleave: two variants are labelled '{}'; label them (LABEL=STRATEGY)",
                a.label
            );
        }
    }
    Ok(specs)
}

/// Resolve a variant's fetch fraction and CPU layers (`auto` by the performance model of
/// `--host`, read into `auto_host` at the first variant that needs it).
fn resolve_variant(
    args: &Args,
    spec: &VariantSpec,
    model: &ModelSpec,
    cache_slots: usize,
    policy: &CacheOptions,
    auto_host: &mut Option<AutoHost>,
    notes: &mut Vec<String>,
) -> Result<Variant> {
    let host = |slot: &mut Option<AutoHost>| -> Result<()> {
        if slot.is_none() {
            *slot = Some(AutoHost::of_args(args)?);
        }
        Ok(())
    };
    let (strategy, fetch_source, auto) = match spec.kind {
        StrategyKind::Hybrid => match spec.fetch.as_deref() {
            None => bail!("hybrid needs --fetch-fraction F (0 to 1) or auto"),
            Some(s) => match FetchFraction::parse(spec.flag, s)? {
                FetchFraction::Fixed(f) => (
                    Strategy::Hybrid {
                        fetch: FetchFraction::Fixed(f),
                    },
                    "given".to_string(),
                    false,
                ),
                FetchFraction::Auto => {
                    host(auto_host)?;
                    let h = auto_host.as_ref().expect("read above");
                    let (f, source) = h.resolve(args, model, cache_slots, policy)?;
                    (
                        Strategy::Hybrid {
                            fetch: FetchFraction::fixed(spec.flag, f)?,
                        },
                        source,
                        true,
                    )
                }
            },
        },
        StrategyKind::LayerSplit | StrategyKind::LayerSplitCached => {
            let given = spec.cpu_layers.as_deref().unwrap_or("auto");
            let field = format!("{} {}'s CPU layers", spec.flag, spec.kind);
            let (n, source) = match CpuLayers::parse(&field, given)? {
                CpuLayers::Fixed(n) => (n, "given".to_string()),
                CpuLayers::Auto => {
                    host(auto_host)?;
                    let h = auto_host.as_ref().expect("read above");
                    h.cpu_layers(args, model, spec.kind, cache_slots, policy)?
                }
            };
            if n > model.geometry.moe_layers {
                bail!(
                    "{field}: {n} is more than the run's {} MoE layers",
                    model.geometry.moe_layers
                );
            }
            if spec.fetch.is_some() {
                notes.push(format!(
                    "--fetch-fraction ignored: {}'s cached layers gather every miss",
                    spec.kind
                ));
            }
            (
                Strategy::from_parts(spec.kind, None, Some(CpuLayers::Fixed(n))),
                format!("{n} CPU layers: {source}"),
                false,
            )
        }
        StrategyKind::Offload | StrategyKind::Resident | StrategyKind::Cpu => {
            if spec.fetch.is_some() {
                notes.push(format!(
                    "--fetch-fraction ignored: {} has a fixed fraction",
                    spec.kind
                ));
            }
            (
                Strategy::from_kind(spec.kind, None),
                "strategy".into(),
                false,
            )
        }
    };
    let layers = model.geometry.moe_layers;
    let placement = strategy
        .policy(layers)
        .with_context(|| format!("{} {}", spec.flag, spec.label))?;
    let fetch = placement.fetch_fraction();
    let cached = placement.cpu_layers < layers;
    let (gathers, cached_cpu) = match placement.rest {
        ft_model::LayerPlacement::Cached { fetch_fraction } => (
            cached && fetch_fraction > 0.0,
            cached && fetch_fraction < 1.0,
        ),
        ft_model::LayerPlacement::Resident | ft_model::LayerPlacement::CpuOnly => (false, false),
    };
    Ok(Variant {
        label: spec.label.clone(),
        strategy,
        fetch,
        fetch_source,
        auto,
        auto_cpu_speed: None,
        cpu_layers: strategy.cpu_layers().map(|_| placement.cpu_layers),
        // Resident runs on a cache that holds every expert: nothing to gather.
        gathers: gathers && spec.kind != StrategyKind::Resident,
        uses_cpu: cached_cpu || placement.cpu_layers > 0,
    })
}

/// Every input-derived size against its documented limit (`ft_model::limits`), before a
/// device, a bank or a thread is made.
fn check_limits(args: &Args) -> Result<()> {
    use ft_model::limits;
    if let Some(t) = args.threads {
        limits::check_threads("--threads", t as u64)?;
    }
    limits::check_streams("--streams", args.streams as u64)?;
    limits::check_steps("--steps", args.steps as u64)?;
    limits::check_steps("--warmup", args.warmup as u64)?;
    limits::check_context("--context", args.context as u64)?;
    limits::check(
        &format!("--repeat {}", args.repeat),
        args.repeat,
        limits::MAX_REPEATS,
        "ft_model::limits::MAX_REPEATS",
    )?;
    if let Some(l) = args.layers {
        limits::check(
            &format!("--layers {l}"),
            l,
            limits::MAX_MOE_LAYERS,
            "ft_model::limits::MAX_MOE_LAYERS",
        )?;
    }
    if let Some(n) = args.cache_slots {
        limits::check(
            &format!("--cache-slots {n}"),
            n as u64,
            limits::MAX_TOTAL_EXPERTS,
            "ft_model::limits::MAX_TOTAL_EXPERTS: more slots than any model has experts",
        )?;
    }
    Ok(())
}

/// Run `ft run`.
pub fn run(args: Args) -> Result<()> {
    if args.repeat == 0 {
        bail!("--repeat must be at least 1");
    }
    check_limits(&args)?;
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    let kind = match args.device.to_ascii_lowercase().as_str() {
        "auto" => {
            if ft_runtime::cuda_available() {
                DeviceKind::Cuda
            } else {
                tracing::info!("no CUDA device here: using the host-emulated device");
                DeviceKind::Host
            }
        }
        other => other.parse::<DeviceKind>().context("--device")?,
    };
    let threads = args.threads.unwrap_or(match kind {
        DeviceKind::Cuda => cores.saturating_sub(1).max(1),
        DeviceKind::Host => 1,
    });
    let pool_wait = match &args.pool_wait {
        Some(s) => s.parse::<PoolWait>()?,
        None => match kind {
            DeviceKind::Cuda => PoolWait::Spin,
            DeviceKind::Host => PoolWait::Park,
        },
    };
    if args.probe_overhead {
        return run_probe(&args, kind, threads, pool_wait, cores);
    }
    let placement: GpuPlacement = args.placement.parse().context("--placement")?;
    let layout = GpuLayout::new(args.gpus, placement).context("--gpus")?;
    if args.streams == 0 {
        bail!("--streams: must be at least 1");
    }
    if args.steps == 0 {
        bail!("--steps: must be at least 1");
    }
    let name = args.model.as_str();
    let full = ModelSpec::resolve(name).with_context(|| format!("--model {name}"))?;
    if !full.format.has_kernel() {
        bail!(
            "--model {name}: ft has no kernel for {}: predict and simulate it (ft predict, ft \
             simulate), or run it in a format ft has (--model with format = nvfp4, q4_0, ...)",
            full.format
        );
    }
    let mut notes = Vec::new();
    let model = match args.layers {
        Some(n) if n < full.geometry.moe_layers => {
            notes.push(format!(
                "ran {n} of the model's {} MoE layers (--layers): the same geometry, fewer layers; \
                 per-layer numbers are the model's, per-step numbers scale with the layer count",
                full.geometry.moe_layers
            ));
            full.first_layers(n)?
        }
        Some(n) => full.first_layers(n)?,
        None => full.clone(),
    };
    let g = model.geometry;
    let size_flag = [(args.cache_slots.is_some(), "--cache-slots")]
        .into_iter()
        .chain([(args.cache_gb.is_some(), "--cache-gb")])
        .find_map(|(given, flag)| given.then_some(flag));
    let policy = args.cache_args.options(size_flag)?;
    let specs = variant_specs(&args)?;
    // The kind that sizes the cache: the first that needs one (cpu keeps a cache only when
    // given one), so a missing size is reported against it.
    let sk = specs
        .iter()
        .map(|v| v.kind)
        .find(|&k| k != StrategyKind::Cpu)
        .unwrap_or(StrategyKind::Cpu);
    let cache_slots = match sk {
        StrategyKind::Resident | StrategyKind::LayerSplit => {
            if args.cache_slots.is_some() || args.cache_gb.is_some() {
                notes.push(format!(
                    "{sk} holds its GPU layers' experts resident: the cache size flags were ignored"
                ));
            }
            0
        }
        StrategyKind::Offload
        | StrategyKind::Hybrid
        | StrategyKind::Cpu
        | StrategyKind::LayerSplitCached => match (args.cache_slots, args.cache_gb) {
            (None, None) if policy.slots_per_layer.is_some() => {
                policy.fit_slots(0, g.moe_layers)?
            }
            (Some(n), _) => CacheSize::Slots(n).slots(model.expert_bytes(), g.total_experts())?,
            // Under tensor parallelism a GPU's budget holds slices (GpuLayout::slots_per_gpu).
            (None, Some(x)) if layout.is_multi() => {
                if !(x.is_finite() && x >= 0.0) {
                    bail!("--cache-gb {x}: must be a non-negative number of GiB");
                }
                layout
                    .slots_per_gpu((x * GIB) as u64, model.expert_bytes())
                    .min(g.total_experts() as usize)
            }
            (None, Some(x)) => CacheSize::GiB(x).slots(model.expert_bytes(), g.total_experts())?,
            (None, None) if sk == StrategyKind::Cpu => 0,
            (None, None) => {
                bail!("{sk} needs a cache size: give --cache-slots N or --cache-gb X")
            }
        },
    };
    let mut auto_host = None;
    let mut variants = specs
        .iter()
        .map(|spec| {
            resolve_variant(
                &args,
                spec,
                &model,
                cache_slots,
                &policy,
                &mut auto_host,
                &mut notes,
            )
        })
        .collect::<Result<Vec<_>>>()?;
    // A profile's CPU checks, for deciding the auto fractions again at the check before the
    // first round (single-GPU runs; a multi-GPU run keeps the probed speed).
    let auto_host = auto_host.filter(|h| !args.no_cpu_check && !h.cpu_checks.is_empty());
    if variants.len() > 1 && layout.is_multi() {
        bail!(
            "--interleave: only a run on one GPU interleaves (--gpus {})",
            layout.gpus
        );
    }
    // The engine is built for the first variant that gathers (its staging slots serve every
    // variant), else the first.
    let primary = variants.iter().find(|v| v.gathers).unwrap_or(&variants[0]);
    let (strategy, fetch) = (primary.strategy, primary.fetch);
    let cfg = EngineConfig {
        strategy,
        cache_slots,
        cache_options: policy.clone(),
        max_streams: args.streams,
        max_context: args.context + args.warmup + args.steps,
        threads,
        pool_wait,
        gpu_path: parse_path("--gpu-act", args.gpu_act.as_deref(), model.format)?,
        cpu_path: parse_path("--cpu-act", args.cpu_act.as_deref(), model.format)?,
        combine: args.combine.parse::<CombineOrder>()?,
        gather: match args.gather.as_str() {
            "copy-engine" => GatherMethod::CopyEngine,
            "zero-copy" => GatherMethod::ZeroCopy,
            other => bail!("--gather: '{other}' is neither copy-engine nor zero-copy"),
        },
        seed: args.seed,
        settings: args.engine.settings()?,
        timeline: !args.no_timeline,
        // The emulated device is sized to the plan below; a GPU keeps the default reserve.
        reserve_bytes: match kind {
            DeviceKind::Host => 0,
            DeviceKind::Cuda => ft_runtime::slots::DEFAULT_RESERVE_BYTES,
        },
    };
    let spinning = match pool_wait {
        PoolWait::Spin => threads,
        PoolWait::SpinBeside => threads + 1,
        PoolWait::Park => 0,
    };
    if kind == DeviceKind::Host && spinning > cores {
        notes.push(format!(
            "{spinning} spinning threads (CPU workers and the host thread) exceed this \
             machine's {cores} cores: expect contention (use --pool-wait park)"
        ));
    }
    let available = available_ram().unwrap_or(u64::MAX);
    let memory = check_memory(&model, full.geometry.moe_layers, &cfg, kind, available)?;

    // The routing of the whole run, drawn up front (and recorded, with its requests, if asked).
    let mut source = routing::resolve(&args.routing, &g, Some(args.seed))
        .with_context(|| format!("--routing {}", args.routing))?;
    let routing = draw_routing(source.as_mut(), args.streams, args.warmup + args.steps)?;
    if let Some(path) = &args.record {
        record_routing(path, &g, &routing, args.warmup)
            .with_context(|| format!("--record {}", path.display()))?;
    }
    let (warm, measured) = routing.split_at(args.warmup);
    let popularity = if matches!(&policy.policy, CachePolicy::StaticHot { hot } if hot.is_empty())
        && sk != StrategyKind::Resident
    {
        let mut src: Box<dyn RoutingSource> = routing::resolve(&args.routing, &g, Some(args.seed))?;
        Some(ft_model::traffic::measure_popularity(
            src.as_mut(),
            args.warmup.max(1),
            args.streams,
        )?)
    } else {
        None
    };

    if layout.is_multi() {
        if args.repeat > 1 {
            bail!(
                "--repeat {}: only a run on one GPU repeats (--gpus {})",
                args.repeat,
                layout.gpus
            );
        }
        if args.stamps_out.is_some() {
            bail!(
                "--stamps-out: only a run on one GPU keeps block timelines (--gpus {})",
                layout.gpus
            );
        }
        return run_multi(MultiRun {
            args: &args,
            kind,
            layout,
            model: &model,
            cfg: &cfg,
            memory,
            warm,
            measured,
            fetch,
            notes,
            cores,
        });
    }
    let device = match kind {
        DeviceKind::Host => Device::host(HostDeviceConfig {
            memory_bytes: memory.device_bytes() + HOST_DEVICE_SLACK,
            link_gbps: args.link_gbps,
            kernel_threads: cores.saturating_sub(threads + 1).max(1),
        })?,
        DeviceKind::Cuda => {
            if args.link_gbps.is_some() {
                bail!("--link-gbps: only the host device emulates a link bandwidth");
            }
            Device::cuda(0)?
        }
    };
    if args.stamps_out.is_some() {
        match device.cuda_tuning() {
            None => bail!(
                "--stamps-out: the host-emulated device runs no CUDA kernels to time; use --device cuda"
            ),
            Some(t) if !t.block_stamps => bail!(
                "--stamps-out: the expert kernels were built without block timelines; set {}=1",
                ft_runtime::device::tuning::CUDA_STAMPS_ENV
            ),
            Some(_) => {}
        }
    }
    tracing::info!(device = %device.info().name, model = %model.name, %strategy, "building the engine");
    let mut engine =
        Engine::new(&device, &model, &cfg, popularity).context("building the engine")?;
    let linear = if variants.iter().any(|v| v.gathers) {
        Some(engine.measure_linear_h2d_gbs(LINEAR_PROBE_BYTES, LINEAR_PROBE_REPS)?)
    } else {
        None
    };

    let options = DecodeOptions {
        context: args.context,
        input_seed: args.seed,
        keep_spans: args.trace_out.is_some(),
        keep_outputs: args.compare_numerics,
        block_stamps: args.stamps_out.is_some(),
    };
    let per_rep = (args.warmup + args.steps) as u64;
    let n = variants.len();
    let bar = crate::progress::bar(per_rep * (args.repeat * n) as u64, "steps");
    // Round r decodes every variant once, starting at variant r mod n; each decode starts
    // from an empty cache (a fresh engine's state).
    let mut runs: Vec<Vec<ft_runtime::engine::Decoded>> =
        (0..n).map(|_| Vec::with_capacity(args.repeat)).collect();
    let mut steal = vec![ft_runtime::instrument::StealMeter::default(); n];
    // The CPU's same-run ceiling, read before each round (runs with a CPU share).
    let with_cpu = auto_host.is_some() || variants.iter().any(|v| v.uses_cpu);
    let mut bank_reads = if with_cpu {
        Some(BankReads::new(threads)?)
    } else {
        None
    };
    let mut done_runs = 0u64;
    for rep in 0..args.repeat {
        if let Some(b) = bank_reads.as_mut() {
            b.read(engine.bank().buffer().as_slice(), rep);
            let start = rep * CPU_CHECK_STRIDE;
            let check = engine
                .cpu_check(ft_runtime::cpu_check::CHECK_BUDGET, start)
                .context("the CPU check before a round")?;
            b.checks.push(check);
            if let (0, Some(host)) = (rep, &auto_host) {
                resolve_auto_at_check(
                    host,
                    &check,
                    &mut variants,
                    &args,
                    &model,
                    cache_slots,
                    &policy,
                )?;
                if n == 1 {
                    engine
                        .set_strategy(variants[0].strategy)
                        .context("the fraction decided at the CPU check")?;
                }
            }
        }
        for k in 0..n {
            let i = (rep + k) % n;
            let v = &variants[i];
            if n > 1 {
                engine
                    .set_strategy(v.strategy)
                    .with_context(|| format!("--interleave {}", v.label))?;
                bar.set_message(v.label.clone());
            } else if rep > 0 {
                engine.reset_cache()?;
            }
            let done_before = per_rep * done_runs;
            let cpu_start = ft_runtime::instrument::HostCpuTimes::now();
            runs[i].push(decode(
                &mut engine,
                warm,
                measured,
                &options,
                &mut |done, _| bar.set_position(done_before + done as u64),
            )?);
            if let (Some(a), Some(b)) = (cpu_start, ft_runtime::instrument::HostCpuTimes::now()) {
                steal[i].add(&a, &b);
            }
            done_runs += 1;
        }
    }
    bar.finish_and_clear();

    let mut reports = Vec::with_capacity(n);
    for ((v, mut runs), steal) in variants.iter().zip(runs).zip(&steal) {
        let repeats: Vec<f64> = runs.iter().map(|d| d.summary.tok_s_total).collect();
        let decoded = runs.swap_remove(median_index(&repeats));
        if let Some(path) = &args.trace_out {
            let mut trace = ChromeTrace::new(&format!("ft run {} {}", model.name, v.strategy));
            trace.add_spans(&decoded.spans);
            for r in &decoded.records {
                let start = ft_runtime::instrument::ns_of_us(r.start_us);
                trace.add_step(
                    r.step,
                    r.warmup,
                    start,
                    start + ft_runtime::instrument::ns_of_us(r.wall_us),
                );
            }
            trace
                .write(path)
                .with_context(|| format!("--trace-out {}", path.display()))?;
        }
        if let (Some(path), Some(stamps)) = (&args.stamps_out, &decoded.stamps) {
            ft_runtime::block_stamps::write_csv(path, &stamps.records)
                .with_context(|| format!("--stamps-out {}", path.display()))?;
            tracing::info!(
                records = stamps.records.len(),
                dropped = stamps.dropped,
                path = %path.display(),
                "block timelines of the last measured step written"
            );
            if stamps.dropped > 0 {
                tracing::warn!(
                    dropped = stamps.dropped,
                    "blocks past the timeline buffer were not kept: fewer --layers keep them all"
                );
            }
        }
        let numerics = if args.compare_numerics {
            Some(compare_numerics(
                &mut engine,
                warm,
                measured,
                &options,
                &decoded.outputs,
            )?)
        } else {
            None
        };
        let summary = decoded.summary.clone();
        let pcie = linear.filter(|_| v.gathers).map(|gbs| {
            let bound = summary.gathered_bytes_per_step / (gbs * 1e3);
            PcieBound {
                linear_h2d_gbs: gbs,
                gathered_bytes_per_step: summary.gathered_bytes_per_step,
                bound_step_us: bound,
                share_of_bound: if summary.step_us.mean > 0.0 {
                    bound / summary.step_us.mean
                } else {
                    0.0
                },
            }
        });
        let cpu = bank_reads
            .as_ref()
            .and_then(|b| CpuBound::of(&summary, g.moe_layers, model.expert_bytes(), threads, b));
        let mut notes = notes.clone();
        if n > 1 {
            let others: Vec<&str> = variants
                .iter()
                .filter(|o| o.label != v.label)
                .map(|o| o.label.as_str())
                .collect();
            notes.push(format!(
                "decoded in turn with {} on one engine, {} round(s) from an empty cache each (--interleave)",
                others.join(", "),
                args.repeat
            ));
        }
        if let Some(f) = steal.fraction() {
            if f > ft_runtime::instrument::STEAL_NOTABLE_FRACTION {
                notes.push(format!(
                    "the hypervisor took {:.1}% of the machine's CPU time while this ran (steal): \
                     its timing is not this machine's own",
                    100.0 * f
                ));
            }
        }
        reports.push(RunReport {
            label: v.label.clone(),
            model: model.name.clone(),
            format: model.format.name().into(),
            expert_bytes: model.expert_bytes(),
            layers: g.moe_layers,
            model_layers: full.geometry.moe_layers,
            strategy: v.strategy.to_string(),
            fetch_fraction: v.fetch,
            fetch_source: v.fetch_source.clone(),
            cpu_layers: v.cpu_layers,
            auto_cpu_speed: v.auto_cpu_speed,
            device: device.info(),
            threads,
            pool_wait: pool_wait.name().into(),
            engine: cfg.settings,
            gate_last_chunk: engine.gates_last_chunk(),
            gpu_act: cfg.gpu_path.name().into(),
            cpu_act: cfg.cpu_path.name().into(),
            combine: cfg.combine.name().into(),
            gather: cfg.gather.name().into(),
            streams: args.streams,
            context: args.context,
            cache_slots: engine.cache_slots(),
            staging_slots: engine.staging_slots(),
            policy: policy.policy.to_string(),
            cache_options: policy.clone(),
            routing: args.routing.clone(),
            seed: args.seed,
            memory,
            summary,
            pcie,
            cpu,
            numerics,
            notes,
            step_records: decoded.records,
            repeats,
            host_steal_fraction: steal.fraction(),
        });
    }
    if let Some(prefix) = &args.report_prefix {
        for r in &reports {
            let path = PathBuf::from(format!("{prefix}{}.json", r.label));
            crate::probe::write_atomic(&path, &serde_json::to_vec_pretty(r)?)
                .with_context(|| format!("--report-prefix: writing {}", path.display()))?;
        }
    }
    let stdout = std::io::stdout();
    let mut out = stdout.lock();
    match (args.json, reports.len()) {
        (true, 1) => writeln!(out, "{}", serde_json::to_string_pretty(&reports[0])?)?,
        (true, _) => writeln!(out, "{}", serde_json::to_string_pretty(&reports)?)?,
        (false, _) => {
            for (i, r) in reports.iter().enumerate() {
                if i > 0 {
                    writeln!(out)?;
                }
                print_table(&mut out, r)?;
            }
        }
    }
    for r in &reports {
        if let Some(n) = &r.numerics {
            if !n.passed() {
                return Err(crate::CheckFailed(format!(
                    "{}: fresh and warmed outputs differ (first at step {:?}) although placement cannot change them here",
                    n.strategy, n.fresh_vs_warmed.first_differing_step
                ))
                .into());
            }
        }
    }
    Ok(())
}

/// Per-round readings for the table: `values` with `decimals` decimals, comma-separated.
fn rounds_text(values: &[f64], decimals: usize) -> String {
    values
        .iter()
        .map(|v| format!("{v:.decimals$}"))
        .collect::<Vec<_>>()
        .join(", ")
}

fn print_table(out: &mut impl Write, r: &RunReport) -> Result<()> {
    let s = &r.summary;
    writeln!(
        out,
        "ft run: {} ({}, {} B experts), {} of {} layers, {} (fetch fraction {:.3}, {})",
        r.model,
        r.format,
        r.expert_bytes,
        r.layers,
        r.model_layers,
        r.strategy,
        r.fetch_fraction,
        r.fetch_source
    )?;
    writeln!(
        out,
        "device {}, {} CPU workers ({}), act gpu {} / cpu {}, combine {}, gather {} (engine {}{})",
        r.device.label(),
        r.threads,
        r.pool_wait,
        r.gpu_act,
        r.cpu_act,
        r.combine,
        r.gather,
        r.engine,
        if r.gate_last_chunk {
            ", last chunk gated"
        } else {
            ""
        }
    )?;
    writeln!(
        out,
        "{} stream(s) at context {}, {} steps after {} warm-up, cache {} slots ({:.2} GiB, {}) + {} staging, routing {}",
        r.streams,
        r.context,
        s.steps,
        s.warmup_steps,
        r.cache_slots,
        r.cache_slots as f64 * r.expert_bytes as f64 / GIB,
        r.cache_options,
        r.staging_slots,
        r.routing
    )?;
    for n in &r.notes {
        writeln!(out, "note: {n}")?;
    }
    let mut rows: Vec<(&str, String)> = vec![
        (
            "decode tok/s per stream",
            format!("{:.2}", s.tok_s_per_stream),
        ),
        ("decode tok/s total", format!("{:.2}", s.tok_s_total)),
        (
            "step time, us (p50 / mean / p90)",
            format!(
                "{:.0} / {:.0} / {:.0}",
                s.step_us.p50, s.step_us.mean, s.step_us.p90
            ),
        ),
        ("miss rate", format!("{:.1}%", 100.0 * s.miss_rate)),
        (
            "per layer: hits / misses / fetched / cpu",
            format!(
                "{:.2} / {:.2} / {:.2} / {:.2}",
                s.hits_per_layer, s.misses_per_layer, s.fetched_per_layer, s.cpu_per_layer
            ),
        ),
        (
            "gathered per step, MB",
            format!("{:.2}", s.gathered_bytes_per_step / 1e6),
        ),
        (
            "busy per step, us (gpu / pcie / cpu / host wait)",
            format!(
                "{:.0} / {:.0} / {:.0} / {:.0}",
                s.gpu_busy_us, s.pcie_busy_us, s.cpu_busy_us, s.host_wait_us
            ),
        ),
        (
            "utilisation (gpu / pcie / cpu / host wait)",
            format!(
                "{:.0}% / {:.0}% / {:.0}% / {:.0}%",
                100.0 * s.utilisation.gpu,
                100.0 * s.utilisation.pcie,
                100.0 * s.utilisation.cpu,
                100.0 * s.utilisation.host_wait
            ),
        ),
    ];
    if let Some(idle) = &s.link_idle_per_layer {
        // What the link waits on: the part of a PCIe-bound layer no overlap can hide.
        let parts: Vec<String> = idle
            .causes()
            .into_iter()
            .filter(|(_, us)| *us >= 0.05)
            .map(|(name, us)| format!("{name} {us:.1}"))
            .collect();
        rows.push((
            "link idle per layer, us (while)",
            format!("{:.1} ({})", idle.total_us, parts.join(", ")),
        ));
    }
    let width = rows.iter().map(|(k, _)| k.len()).max().unwrap_or(0);
    for (k, v) in &rows {
        writeln!(out, "  {k:<width$}  {v}")?;
    }
    if let Some(p) = &r.pcie {
        writeln!(
            out,
            "  {:<width$}  {:.2} GB/s linear H2D; bound {:.0} us/step; at {:.0}% of the bound",
            "PCIe bound",
            p.linear_h2d_gbs,
            p.bound_step_us,
            100.0 * p.share_of_bound
        )?;
    }
    if let Some(c) = &r.cpu {
        writeln!(
            out,
            "  {:<width$}  {:.1} GB/s while busy; STREAM read of the bank {:.1} GB/s ({} threads; rounds {}); at {:.0}% of it",
            "CPU share",
            c.cpu_gbs_while_busy,
            c.stream_read_gbs,
            c.threads,
            rounds_text(&c.stream_read_rounds_gbs, 1),
            100.0 * c.share_of_stream
        )?;
        if let Some(check) = &c.cpu_check {
            writeln!(
                out,
                "  {:<width$}  {:.0} us for {} experts at 1 token ({} threads; rounds {})",
                "CPU check",
                check.time_us,
                check.experts,
                check.threads,
                rounds_text(&c.cpu_check_rounds_us, 0),
            )?;
        }
    }
    if let Some(n) = &r.numerics {
        if let Some(d) = &n.vs_offload {
            writeln!(
                out,
                "  {:<width$}  max rel. L2 {:.2e}, mean {:.2e}, bit-identical {}",
                "numerics vs offload", d.max_rel_l2, d.mean_rel_l2, d.bit_identical
            )?;
        }
        let d = &n.fresh_vs_warmed;
        writeln!(
            out,
            "  {:<width$}  max rel. L2 {:.2e}, bit-identical {} (expected {})",
            "numerics fresh vs warmed", d.max_rel_l2, d.bit_identical, n.expect_bit_identical
        )?;
    }
    Ok(())
}

/// What one GPU of a multi-GPU run did (per measured step where it says so).
#[derive(Debug, Clone, Serialize)]
pub struct GpuReport {
    /// GPU index (rank).
    pub gpu: usize,
    /// Its device.
    pub device: DeviceInfo,
    /// Its CPU workers: `start..end` of the pool's worker indices.
    pub cpu_workers: (usize, usize),
    /// Miss rate of its cache (misses over the distinct experts it looks up).
    pub miss_rate: f64,
    /// Bytes of one expert as it stores and gathers it (a slice under tensor parallelism).
    pub expert_bytes: u64,
    /// Bytes gathered over its link per step.
    pub gathered_bytes_per_step: f64,
    /// Bytes it sends in the combines per step (the ring all-reduce's share).
    pub combine_bytes_per_step: f64,
    /// Host time of its CPU shares per step, us.
    pub cpu_us_per_step: f64,
    /// Combine time per step, us (a collective: the same for every GPU).
    pub combine_us_per_step: f64,
    /// The measured steps' counts summed.
    pub counts: GpuCounts,
}

/// Everything a multi-GPU `ft run` reports (the `--json` document).
#[derive(Debug, Clone, Serialize)]
pub struct MultiRunReport {
    /// Model name.
    pub model: String,
    /// Expert format.
    pub format: String,
    /// MoE layers run.
    pub layers: usize,
    /// The strategy as run.
    pub strategy: String,
    /// Fetch fraction the plans used.
    pub fetch_fraction: f64,
    /// GPUs.
    pub gpus: u32,
    /// sharded or tensor-parallel.
    pub placement: String,
    /// How partial outputs were combined (NCCL, or through the host).
    pub combine_method: String,
    /// The engine's settings it ran with (`--engine-config`, `--fetch-chunks`).
    pub engine: EngineSettings,
    /// CPU workers of all GPUs together.
    pub threads: usize,
    /// Streams.
    pub streams: usize,
    /// Measured steps.
    pub steps: usize,
    /// Cache slots per GPU.
    pub cache_slots_per_gpu: usize,
    /// Decode tokens per second over all streams (measured steps).
    pub tok_s_total: f64,
    /// Mean step time, us.
    pub step_us_mean: f64,
    /// Mean combine time per step, us.
    pub combine_us_per_step: f64,
    /// Per GPU.
    pub per_gpu: Vec<GpuReport>,
    /// All GPUs' counts summed.
    pub totals: GpuCounts,
    /// Miss rate over all GPUs.
    pub miss_rate: f64,
    /// Bytes gathered over all links per step.
    pub gathered_bytes_per_step: f64,
    /// Memory a single-GPU engine of this config plans (each GPU holds at most about this
    /// much device memory).
    pub memory_single_gpu: EngineMemory,
    /// Notes.
    pub notes: Vec<String>,
}

/// What [`run_multi`] needs from [`run`].
struct MultiRun<'a> {
    args: &'a Args,
    kind: DeviceKind,
    layout: GpuLayout,
    model: &'a ModelSpec,
    cfg: &'a EngineConfig,
    memory: EngineMemory,
    warm: &'a [ft_model::routing::StepRouting],
    measured: &'a [ft_model::routing::StepRouting],
    fetch: f64,
    notes: Vec<String>,
    cores: usize,
}

/// `ft run --gpus N` with N > 1: the multi-GPU engine.
fn run_multi(r: MultiRun<'_>) -> Result<()> {
    let MultiRun {
        args,
        kind,
        layout,
        model,
        cfg,
        memory,
        warm,
        measured,
        fetch,
        mut notes,
        cores,
    } = r;
    if args.compare_numerics || args.trace_out.is_some() {
        bail!("--compare-numerics and --trace-out are single-GPU only for now (drop --gpus)");
    }
    let n = layout.count();
    let spec = match kind {
        DeviceKind::Host => DeviceSpec::Host(HostDeviceConfig {
            memory_bytes: memory.device_bytes() + HOST_DEVICE_SLACK,
            link_gbps: args.link_gbps,
            kernel_threads: (cores.saturating_sub(cfg.threads + 1) / n).max(1),
        }),
        DeviceKind::Cuda => {
            if args.link_gbps.is_some() {
                bail!("--link-gbps: only the host device emulates a link bandwidth");
            }
            DeviceSpec::Cuda { ordinal: 0 }
        }
    };
    let devices = Device::open_group(&spec, n).context("--gpus")?;
    tracing::info!(
        gpus = n,
        placement = layout.placement.name(),
        model = %model.name,
        "building the multi-GPU engine"
    );
    let mut engine =
        MultiEngine::new(&devices, layout, model, cfg).context("building the multi-GPU engine")?;
    let options = DecodeOptions {
        context: args.context,
        input_seed: args.seed,
        keep_spans: false,
        keep_outputs: false,
        block_stamps: false,
    };
    let bar = crate::progress::bar((warm.len() + measured.len()) as u64, "steps");
    let decoded = decode_multi(&mut engine, warm, measured, &options, &mut |done, _| {
        bar.set_position(done as u64)
    })?;
    bar.finish_and_clear();
    let steps: Vec<_> = decoded.steps.iter().filter(|s| !s.warmup).collect();
    let ns = steps.len().max(1) as f64;
    let wall_us: f64 = steps.iter().map(|s| s.wall_us).sum();
    let combine_us_per_step = steps.iter().map(|s| s.combine_us).sum::<f64>() / ns;
    let counts = decoded.counts();
    let mut totals = GpuCounts::default();
    counts.iter().for_each(|c| totals.add(c));
    let workers = engine.cpu_workers();
    let per_gpu = counts
        .iter()
        .enumerate()
        .map(|(i, c)| GpuReport {
            gpu: i,
            device: devices[i].info(),
            cpu_workers: (workers[i].start, workers[i].end),
            miss_rate: c.miss_rate(),
            expert_bytes: engine.expert_bytes_per_gpu() as u64,
            gathered_bytes_per_step: c.gathered_bytes as f64 / ns,
            combine_bytes_per_step: c.combine_bytes as f64 / ns,
            cpu_us_per_step: steps.iter().map(|s| s.gpus[i].cpu_us).sum::<f64>() / ns,
            combine_us_per_step,
            counts: *c,
        })
        .collect();
    if engine.combine_method() == CombineMethod::Host && kind == DeviceKind::Cuda {
        notes.push(
            "NCCL could not be used: the combine ran through the host (D2H + sum + H2D)".into(),
        );
    }
    let report = MultiRunReport {
        model: model.name.clone(),
        format: model.format.name().into(),
        layers: model.geometry.moe_layers,
        strategy: cfg.strategy.to_string(),
        fetch_fraction: fetch,
        gpus: layout.gpus,
        placement: layout.placement.name().into(),
        combine_method: engine.combine_method().name().into(),
        engine: cfg.settings,
        threads: cfg.threads,
        streams: args.streams,
        steps: steps.len(),
        cache_slots_per_gpu: cfg.cache_slots,
        tok_s_total: if wall_us > 0.0 {
            (steps.len() * args.streams) as f64 / (wall_us * 1e-6)
        } else {
            0.0
        },
        step_us_mean: wall_us / ns,
        combine_us_per_step,
        per_gpu,
        miss_rate: totals.miss_rate(),
        gathered_bytes_per_step: totals.gathered_bytes as f64 / ns,
        totals,
        memory_single_gpu: memory,
        notes,
    };
    let stdout = std::io::stdout();
    let mut out = stdout.lock();
    if args.json {
        writeln!(out, "{}", serde_json::to_string_pretty(&report)?)?;
    } else {
        print_multi_table(&mut out, &report)?;
    }
    Ok(())
}

fn print_multi_table(out: &mut impl Write, r: &MultiRunReport) -> Result<()> {
    writeln!(
        out,
        "ft run: {} ({}), {} layers, {} (fetch fraction {:.3}) on {} GPUs, {}, combine {}",
        r.model,
        r.format,
        r.layers,
        r.strategy,
        r.fetch_fraction,
        r.gpus,
        r.placement,
        r.combine_method
    )?;
    writeln!(
        out,
        "{} stream(s), {} steps, {} cache slots per GPU, {} CPU workers in all",
        r.streams, r.steps, r.cache_slots_per_gpu, r.threads
    )?;
    for n in &r.notes {
        writeln!(out, "note: {n}")?;
    }
    writeln!(
        out,
        "  {:>4}  {:<28} {:>9} {:>10} {:>12} {:>11} {:>10} {:>11}",
        "gpu",
        "device",
        "workers",
        "miss rate",
        "gathered MB",
        "combine MB",
        "cpu us",
        "combine us"
    )?;
    for g in &r.per_gpu {
        writeln!(
            out,
            "  {:>4}  {:<28} {:>9} {:>9.1}% {:>12.2} {:>11.3} {:>10.0} {:>11.0}",
            g.gpu,
            g.device.name,
            format!("{}..{}", g.cpu_workers.0, g.cpu_workers.1),
            100.0 * g.miss_rate,
            g.gathered_bytes_per_step / 1e6,
            g.combine_bytes_per_step / 1e6,
            g.cpu_us_per_step,
            g.combine_us_per_step
        )?;
    }
    writeln!(
        out,
        "  {:>4}  {:<28} {:>9} {:>9.1}% {:>12.2} {:>11.3} {:>10} {:>11.0}",
        "all",
        "",
        "",
        100.0 * r.miss_rate,
        r.gathered_bytes_per_step / 1e6,
        r.totals.combine_bytes as f64 / r.steps.max(1) as f64 / 1e6,
        "",
        r.combine_us_per_step
    )?;
    writeln!(
        out,
        "  decode tok/s total {:.2}, step {:.0} us (mean)",
        r.tok_s_total, r.step_us_mean
    )?;
    Ok(())
}

/// `ft run --probe-overhead`.
fn run_probe(
    args: &Args,
    kind: DeviceKind,
    threads: usize,
    wait: PoolWait,
    cores: usize,
) -> Result<()> {
    let device = match kind {
        DeviceKind::Host => Device::host(HostDeviceConfig {
            memory_bytes: 256 << 20,
            link_gbps: args.link_gbps,
            kernel_threads: cores.saturating_sub(threads + 1).max(1),
        })?,
        DeviceKind::Cuda => Device::cuda(0)?,
    };
    let r: OverheadReport = probe_hybrid_overhead(&device, threads, wait)?;
    let stdout = std::io::stdout();
    let mut out = stdout.lock();
    if args.json {
        writeln!(out, "{}", serde_json::to_string_pretty(&r)?)?;
    } else {
        writeln!(
            out,
            "hybrid fixed cost per layer on {} ({} CPU threads, {}), {} layers of tiny experts",
            r.device,
            r.threads,
            r.pool_wait.name(),
            r.layers
        )?;
        for (k, v) in [
            ("resident layer, us", r.resident_layer_us),
            ("cpu layer (one round trip), us", r.cpu_layer_us),
            ("CPU busy per layer, us", r.cpu_busy_layer_us),
            ("host wait per layer, us", r.host_wait_layer_us),
            ("overhead beyond the work, us", r.overhead_layer_us),
            ("target, us", r.target_us),
            (
                "pool job alone, spinning, host computing, us",
                r.pool_job_spin_us,
            ),
            (
                "pool job alone, spinning, host idle beside, us",
                r.pool_job_spin_beside_us,
            ),
            ("pool job alone, parked, us", r.pool_job_park_us),
        ] {
            writeln!(out, "  {k:<46} {v:>8.1}")?;
        }
        writeln!(out, "  {:<46} {:>8}", "meets the target", r.meets_target())?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::median_index;

    #[test]
    fn the_median_repetition_is_the_middle_one_by_value() {
        assert_eq!(median_index(&[5.0]), 0);
        assert_eq!(median_index(&[9.0, 1.0, 5.0]), 2);
        // Even counts take the lower middle: the slower of the two middle repetitions.
        assert_eq!(median_index(&[4.0, 8.0, 1.0, 6.0]), 0);
        // A naive reference: the element with as many below as it can have.
        let v = [3.0, 7.0, 2.0, 9.0, 4.0];
        let i = median_index(&v);
        assert_eq!(v.iter().filter(|&&x| x < v[i]).count(), 2);
    }
}
