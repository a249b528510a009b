//! What a run reports: the `--json` documents of `ft run` on one GPU ([`RunReport`], one per
//! variant) and on several ([`MultiRunReport`]), and the same-run ceilings a single-GPU
//! report sets its measurements against ([`PcieBound`], [`CpuBound`]).

use serde::Serialize;

use ft_model::cache::CacheOptions;
use ft_model::profile::CpuCheck;

use super::error::{Context, Result};
use crate::device::DeviceInfo;
use crate::engine::Decoded;
use crate::engine::{EngineMemory, EngineSettings, GpuCounts, GpuMemory};
use crate::instrument::{ns_of_us, ChromeTrace, RunSummary, StepRecord};
use crate::numerics::NumericsReport;

/// Repetitions of the CPU ceiling's STREAM read of the bank before each round ([`CpuBound`];
/// the median is the round's reading).
const CPU_CEILING_REPS: usize = 3;

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
    pub fn of(
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
pub struct BankReads {
    pool: std::sync::Arc<rayon::ThreadPool>,
    bytes: u64,
    gbs: Vec<f64>,
    /// The CPU checks taken, one per round.
    pub checks: Vec<CpuCheck>,
}

impl BankReads {
    /// Readings with `threads` reading threads.
    pub fn new(threads: usize) -> Result<Self> {
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
    pub fn read(&mut self, bank: &[u8], round: usize) {
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
pub fn median_index(v: &[f64]) -> usize {
    let mut order: Vec<usize> = (0..v.len()).collect();
    order.sort_by(|&a, &b| v[a].total_cmp(&v[b]));
    order[(v.len() - 1) / 2]
}

/// Write `decoded`'s spans and steps as a Chrome trace titled `title` to `path`
/// (`--trace-out`; on several GPUs the spans are GPU 0's).
pub fn write_trace(path: &std::path::Path, title: &str, decoded: &Decoded) -> Result<()> {
    let mut trace = ChromeTrace::new(title);
    trace.add_spans(&decoded.spans);
    for r in &decoded.records {
        let start = ns_of_us(r.start_us);
        trace.add_step(r.step, r.warmup, start, start + ns_of_us(r.wall_us));
    }
    trace
        .write(path)
        .with_context(|| format!("--trace-out {}", path.display()))
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
    /// Its device memory as the engine placed it: its slots, the dense part, the KV.
    pub memory: GpuMemory,
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
    /// Total decode tok/s of every repetition, in run order (`--repeat`, each from an
    /// empty cache); the report is of the one with the median.
    pub repeats: Vec<f64>,
    /// Numerics (with --compare-numerics): fresh against warmed, and against offload, on
    /// the same GPUs.
    pub numerics: Option<NumericsReport>,
    /// Memory the engine planned: each GPU's device memory (the same on every GPU; its
    /// parts in [`GpuReport::memory`]) and the host's (the bank, under tensor parallelism
    /// with each GPU's slices).
    pub memory: EngineMemory,
    /// Notes.
    pub notes: Vec<String>,
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
