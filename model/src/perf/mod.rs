//! The analytic performance model: cost terms, the per-layer critical path of each strategy,
//! prediction, fetch-fraction optimisation, fitting to probes, the decision and its
//! explanation.
//!
//! Why it exists: the legacy rule (`cpu_moe_GBs / pcie_gather_GBs > 2 -> hybrid`) sees two
//! bandwidths measured on the wrong expert size, alone. Decode time depends on the miss rate
//! of each strategy, on fixed costs per copy, per expert and per layer, on DRAM contention
//! between CPU kernels and DMA, on the number of streams, on the dense part of the step and
//! on noise (`docs/DESIGN.md`, mechanisms 1 to 7). Each mechanism is a term here with a
//! parameter in [`PerfParams`] and a probe that measures it ([`fit`]).
//!
//! The simulator takes its durations from the same cost terms ([`PerfParams`]'s methods in
//! [`cost`]) and the same host mapping ([`PerfParams::from_host`]), so the simulator and the
//! model differ only in how they combine durations (discrete events against the closed-form
//! critical path of [`step`]), which is what the simulator validates.
//!
//! Units everywhere: times in microseconds (us), bandwidths in GB/s (1e9 bytes per second),
//! compute rates in GMAC/s (1e9 multiply-accumulates per second), sizes in bytes.

pub mod breakeven;
pub mod cost;
pub mod decide;
pub mod fit;
pub mod legacy;
pub(crate) mod linalg;
pub mod predict;
pub mod prefill;
pub mod residuals;
pub mod step;

use serde::{Deserialize, Serialize};
use std::fmt;

use crate::engine_settings::EngineSettings;
use crate::error::{ModelError, Result};
use crate::host::{HostSpec, GIB};
use crate::placement::GpuLayout;
use crate::schedule::LayerWork;

pub use cost::{ExpertShape, BYTES_PER_US_PER_GBS, MACS_PER_US_PER_GMACS};
pub use decide::{decide, explain, Decision, Explanation, Reason};
pub use legacy::{legacy_ratio, LegacyRatio, LegacyVerdict};
pub use predict::{predict, MissMode, PredictConfig, Prediction, StrategyPrediction};
pub use step::{GpuTerms, LayerCounts, LayerTime, Resource, ScheduleTerms, StepShape, TimeSplit};

/// Calibrated fixed cost per layer of each kind of work, in us: what the end-to-end step
/// probe measures beyond the sum of the micro-probe terms (scheduling gaps, host-side
/// bookkeeping). It belongs to the operations a layer's schedule holds
/// ([`crate::schedule::LayerWork`]: a gather, a CPU share, both or neither), not to the
/// strategy that planned it, so equal work costs the same whatever the strategy is called
/// (a hybrid layer whose misses were all gathered pays what an offload layer pays). The
/// field names are those of the strategies whose calibration blocks fit each kind of work
/// ([`fit`]). Zero until an end-to-end probe is fitted, never negative: the fit is
/// constrained (a negative fixed cost would credit a layer for work it does, as a fit of
/// -449 us for hybrid against +1,679 us for offload did on an H100 profile, predicting
/// hybrid with no CPU share at all 39% faster than offload of the same traffic).
#[derive(Debug, Clone, Copy, PartialEq, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct StrategyOverheads {
    /// A layer with a gather and no CPU share, in us per layer.
    pub offload_us: f64,
    /// A layer with a gather and a CPU share, in us per layer.
    pub hybrid_us: f64,
    /// A layer with neither (resident experts only), in us per layer.
    pub resident_us: f64,
    /// A layer with a CPU share and no gather, in us per layer.
    pub cpu_us: f64,
}

impl StrategyOverheads {
    /// The fixed cost of a layer doing `work`, in us per layer.
    pub fn of(&self, work: LayerWork) -> f64 {
        match work {
            LayerWork::Gather => self.offload_us,
            LayerWork::GatherAndCpuShare => self.hybrid_us,
            LayerWork::GpuOnly => self.resident_us,
            LayerWork::CpuShare => self.cpu_us,
        }
    }

    /// Set the fixed cost of a layer doing `work`, in us per layer.
    pub fn set(&mut self, work: LayerWork, us: f64) {
        match work {
            LayerWork::Gather => self.offload_us = us,
            LayerWork::GatherAndCpuShare => self.hybrid_us = us,
            LayerWork::GpuOnly => self.resident_us = us,
            LayerWork::CpuShare => self.cpu_us = us,
        }
    }

    /// The field name of `work`'s cost (`overhead.<name>`).
    pub fn field(work: LayerWork) -> &'static str {
        match work {
            LayerWork::Gather => "offload_us",
            LayerWork::GatherAndCpuShare => "hybrid_us",
            LayerWork::GpuOnly => "resident_us",
            LayerWork::CpuShare => "cpu_us",
        }
    }
}

/// Terms of an engine's step that only its end-to-end runs show, fitted by `ft calibrate`
/// ([`crate::calibrate`]) on top of the host model. The other calibrated engine terms live
/// where the model already has a parameter for them: the CPU side's serving rate in
/// [`PerfParams::cpu_serving_slowdown`] (a rate `r` times the bench's is a slowdown of
/// `1 / r - 1`), the fixed cost per layer-step in [`PerfParams::overhead`] (keyed by the
/// layer's [`LayerWork`]) and the link's effective rate in [`PerfParams::gather_gbs`].
/// The defaults (no extra cost, hybrid missing as offload does) are ft's own runtime, which
/// its probes describe without them.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct EngineTerms {
    /// The rest of the step (attention, sampling, the engine's own per-token work) per
    /// stream, in us per layer: added to the dense part of every layer for each stream.
    pub rest_stream_us: f64,
    /// The rest of the step's growth with context, in us per layer, per stream and per 1,000
    /// tokens of context (attention an engine computes more slowly than its KV bytes stream).
    pub rest_context_us_per_ktok: f64,
    /// Hybrid's miss rate relative to offload's at the same cache, dimensionless (1: the
    /// counting simulation's own hybrid cache; below 1 the engine's hybrid cache keeps the
    /// hot experts longer, above 1 it admits worse). Applied to the misses of every layer
    /// with a CPU share ([`EngineTerms::apply_miss_factor`]).
    pub hybrid_miss_factor: f64,
    /// Prompt tokens the engine prefills per chunk (each chunk runs every layer once, so a
    /// smaller chunk streams the experts more often): a setting of the engine, not fitted,
    /// recorded so that a calibrated profile predicts prefill and time to first token as the
    /// engine runs them. `ft serve` prefills 128 tokens a chunk; llama.cpp's and FreeToken's
    /// default micro-batch is 512.
    pub prefill_chunk_tokens: usize,
}

impl Default for EngineTerms {
    fn default() -> Self {
        EngineTerms {
            rest_stream_us: 0.0,
            rest_context_us_per_ktok: 0.0,
            hybrid_miss_factor: 1.0,
            prefill_chunk_tokens: prefill::DEFAULT_PREFILL_CHUNK_TOKENS,
        }
    }
}

impl EngineTerms {
    /// How this engine prefills.
    pub fn prefill_config(&self) -> prefill::PrefillConfig {
        prefill::PrefillConfig {
            chunk_tokens: self.prefill_chunk_tokens,
        }
    }

    /// The rest of the step's time per layer at `streams` streams of `context` tokens, in us.
    pub fn rest_us(&self, streams: f64, context: f64) -> f64 {
        streams * (self.rest_stream_us + self.rest_context_us_per_ktok * context / 1000.0)
    }

    /// A layer-step's counts with its misses scaled by [`EngineTerms::hybrid_miss_factor`]
    /// where it has a CPU share and a gather (hybrid's work): the experts (and their tokens)
    /// move between the hits and the misses, the misses keep their split between the link and
    /// the CPU, and the union of the layer's experts is unchanged
    /// ([`LayerCounts::with_misses_scaled`]). Other layers are as given. The step time, the
    /// miss rate and the counts a prediction reports all apply it here, as the simulator does.
    pub fn apply_miss_factor(&self, c: &LayerCounts) -> LayerCounts {
        let m = self.hybrid_miss_factor;
        if m == 1.0 || c.cpu <= 0.0 || c.fetched <= 0.0 {
            return *c;
        }
        c.with_misses_scaled(m)
    }

    /// Check the terms: finite, costs not negative, the miss factor positive; errors name
    /// the field.
    pub fn validate(&self) -> Result<()> {
        for (name, v) in [
            ("rest_stream_us", self.rest_stream_us),
            ("rest_context_us_per_ktok", self.rest_context_us_per_ktok),
        ] {
            if !(v.is_finite() && v >= 0.0) {
                return Err(ModelError::invalid(
                    format!("perf.engine.{name}"),
                    format!("{v} is not a finite number >= 0"),
                ));
            }
        }
        let m = self.hybrid_miss_factor;
        if !(m.is_finite() && m > 0.0 && m <= MAX_HYBRID_MISS_FACTOR) {
            return Err(ModelError::invalid(
                "perf.engine.hybrid_miss_factor",
                format!("{m} is outside (0, {MAX_HYBRID_MISS_FACTOR}]"),
            ));
        }
        let c = self.prefill_chunk_tokens;
        if c == 0 || c > crate::limits::MAX_PREFILL_CHUNK_TOKENS {
            return Err(ModelError::invalid(
                "perf.engine.prefill_chunk_tokens",
                format!(
                    "{c} is outside [1, {}]",
                    crate::limits::MAX_PREFILL_CHUNK_TOKENS
                ),
            ));
        }
        Ok(())
    }
}

/// The largest [`EngineTerms::hybrid_miss_factor`] a profile may hold: a hybrid cache missing
/// 20 times as often as offload's at the same size is a broken cache, not a term.
pub const MAX_HYBRID_MISS_FACTOR: f64 = 20.0;

/// The host thread's own time per layer, in us: planning the layer, submitting its GPU
/// work (the dense launches, the gather's copies, events, the expert launches) and, after a
/// CPU share, launching the merge and the combine. The runtime's one host thread does this
/// between CPU shares (it is one of the pool's workers), so in a layer with a CPU share it
/// is serial with the CPU work ([`PerfParams::host_issue_wait_us`]).
///
/// `layer_us + expert_us x (hits + fetched) + cpu_expert_us x cpu + stream_us x streams`
/// ([`PerfParams::host_layer_us`]). Probe `step`: the host spans the runtime records in
/// each layer of the calibration blocks that have a CPU share ([`fit::HostSample`]). Zero
/// (no such term) in a host spec and in profiles written before it existed: there the
/// host's time is the gather's issue alone ([`PerfParams::gather_fixed_us`]). On the H200
/// (2026-12-05, 02:02Z grid) it was 83 to 336 us per hybrid layer against a 15 to 45 us
/// round trip: a quarter of a 1-stream qwen3.8-flash-next layer.
#[derive(Debug, Clone, Copy, PartialEq, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct HostCost {
    /// Per layer, in us.
    pub layer_us: f64,
    /// Per expert computed on the GPU (hits and fetched), in us.
    pub expert_us: f64,
    /// Per expert computed on the CPU, in us.
    pub cpu_expert_us: f64,
    /// Per stream of the step, in us.
    pub stream_us: f64,
}

/// The CPU share's serving slowdown measured at a thread count other than the profile's
/// serving one ([`PerfParams::cpu_serving_slowdown_at`]).
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ThreadSlowdown {
    /// Threads of the CPU pool the end-to-end blocks ran with.
    pub threads: u32,
    /// The slowdown there, dimensionless (as [`PerfParams::cpu_serving_slowdown`]).
    pub slowdown: f64,
    /// Its standard error, dimensionless (NaN where unknown, which JSON writes as `null`).
    #[serde(deserialize_with = "nan_from_null")]
    pub se: f64,
}

/// An f64 that JSON may hold as `null`: serde_json writes a NaN as `null`, and a profile must
/// read back what it wrote.
fn nan_from_null<'de, D: serde::Deserializer<'de>>(d: D) -> Result<f64, D::Error> {
    Ok(Option::<f64>::deserialize(d)?.unwrap_or(f64::NAN))
}

/// The parameters of the analytic model. Every field names its unit and the probe that
/// measures it (see [`fit`] for the probe sample types and how each is fitted).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PerfParams {
    // ---- PCIe gather (probe: `gather`, isolated) ----
    /// Rate at which a gather streams expert bytes over the link, alone, in GB/s.
    /// Probe `gather` (isolated): slope of time over bytes.
    pub gather_gbs: f64,
    /// Fixed cost of one layer's gather (link latency, launch, completion event), in us.
    /// Probe `gather` (isolated): intercept.
    pub gather_layer_us: f64,
    /// Fixed cost of each expert copy of a gather, in us.
    /// Probe `gather` (isolated): slope of time over experts at fixed bytes.
    pub gather_copy_us: f64,
    /// Link rate for the activations a hybrid layer sends to the CPU and back, in GB/s.
    /// Not fitted (from the host's linear H2D/D2H); it enters the `round-trip` probe.
    pub activation_link_gbs: f64,

    // ---- CPU expert step (probe: `cpu-step`, isolated) ----
    /// Rate at which the CPU expert kernel streams expert weights with `cpu_threads`
    /// threads, alone, in GB/s (the first token of each expert included).
    /// Probe `cpu-step` (isolated): slope of time over bytes.
    pub cpu_gbs: f64,
    /// Threads of the engine's CPU expert pool (configuration, not fitted).
    pub cpu_threads: u32,
    /// Exponent of thread scaling: the streaming rate at `t` threads is
    /// `cpu_gbs * (t / cpu_threads)^exponent`, dimensionless.
    /// Probe `cpu-step` (isolated) at several thread counts.
    pub cpu_thread_exponent: f64,
    /// Fixed CPU cost of one layer's expert step (pool wake-up, submit, barrier, merge,
    /// activation copies), in us. Probe `cpu-step` (isolated): intercept.
    pub cpu_layer_us: f64,
    /// CPU cost of each expert beyond streaming its bytes, with `cpu_threads` threads, in us:
    /// parallel work (the expert's tiles, its activation rows), so it scales inversely with
    /// the streaming rate's thread law (`PerfParams::cpu_expert_cost_us`). Probe `cpu-step`:
    /// slope over experts; at 4 of 15 threads the H200's probe took 39 us per expert against
    /// 15 us at 15 (2026-12-04), which a thread-independent cost put on the rate instead.
    pub cpu_expert_us: f64,
    /// CPU multiply-accumulate rate for the tokens of an expert after its first, with
    /// `cpu_threads` threads (scales linearly with threads), in GMAC/s.
    /// Probe `cpu-step`: slope over tokens per expert.
    pub cpu_token_gmacs: f64,

    // ---- DRAM contention (probes: `gather` and `cpu-step`, contended) ----
    /// Host DRAM read bandwidth CPU kernels and DMA share when both stream at once, in GB/s.
    /// Probes `gather` contended (a CPU kernel runs throughout) and `cpu-step` contended (a
    /// gather runs throughout).
    pub dram_gbs: f64,
    /// Weight of DMA against CPU reads in the share of `dram_gbs` (1 = proportional to the
    /// isolated rates), dimensionless. Same probes as `dram_gbs`.
    pub dma_dram_weight: f64,

    // ---- GPU (probes: `gpu-experts`, `dense`) ----
    /// Effective memory bandwidth of the expert kernels, in GB/s. Probe `gpu-experts`: slope
    /// over bytes.
    pub gpu_hbm_gbs: f64,
    /// Fixed cost of one GPU kernel launch (an expert group, a combine), in us.
    /// Probe `gpu-experts`: intercept.
    pub gpu_launch_us: f64,
    /// GPU multiply-accumulate rate for tokens, in GMAC/s. Probe `gpu-experts`: slope over
    /// tokens per expert.
    pub gpu_token_gmacs: f64,
    /// Fixed GPU cost of one layer's dense part (attention, router, shared experts), in us.
    /// Probe `dense`: intercept.
    pub dense_layer_us: f64,
    /// Effective memory bandwidth of the dense part (its weights and each stream's KV
    /// bytes), in GB/s. Probe `dense`: slope over bytes. The dense kernels stream long
    /// contiguous regions and the one-token expert kernels do not, so one rate cannot serve
    /// both: on the H200 (2026-12-05) the dense probe streamed at about 4.1 TB/s where the
    /// expert launches reached about 1 TB/s, and one shared rate fitted neither (the GPU
    /// stage's residuals 44% rms, the dense part at one stream predicted twice as long as
    /// measured). `None` (profiles written before it): the experts' `gpu_hbm_gbs`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dense_hbm_gbs: Option<f64>,

    // ---- hybrid sync (probe: `round-trip`) ----
    /// One GPU-to-CPU-to-GPU round trip of a hybrid layer without its activation bytes
    /// (event record, host wait, signal back), in us. Probe `round-trip`.
    pub sync_us: f64,
    /// The host thread's own time per layer (planning and submitting), in us ([`HostCost`]).
    /// Probe `step`: the host spans of the calibration blocks.
    #[serde(default)]
    pub host: HostCost,

    // ---- end-to-end calibration (probe: `step`) ----
    /// How much longer the CPU share of a decode layer takes to stream its expert weights
    /// than the isolated `cpu-step` probe of the same experts and threads, as a fraction of
    /// that probe's streaming time (0 = as fast as the probe), dimensionless. Inside a
    /// decode step the CPU share's weight stream takes `cpu_stream_us x (1 + this)`
    /// ([`PerfParams::cpu_serving_stream_us`]): it scales with the expert bytes and with the
    /// threads' streaming rate like the stream it slows. Probe `step` (calibration runs of
    /// the strategies with a CPU share, `cpu` and `hybrid`), fitted jointly with their
    /// overheads ([`fit`]). On the H200 (2026-12-04) the probe's decode layers streamed 13
    /// to 27% slower than its isolated calls, and a constant per layer could not follow it:
    /// with the overhead alone, the `cpu` calibration blocks of qwen3.8-flash-next at 1
    /// stream were predicted 17% slow and those at 4 streams (4 times the CPU experts) 5%
    /// fast.
    #[serde(default)]
    pub cpu_serving_slowdown: f64,
    /// The serving slowdown at other thread counts than `cpu_threads` (probe `step`:
    /// calibration blocks of `cpu` and `hybrid` run with a smaller pool, fitted with the
    /// serving count's overheads), ascending. At `t` threads the slowdown is interpolated
    /// linearly in threads between these and (`cpu_threads`, `cpu_serving_slowdown`), and
    /// held flat beyond the outermost ([`PerfParams::serving_slowdown`]); empty: the same
    /// slowdown at every count. The H200 grid of 2026-12-04 calibrated at 15 threads only
    /// and predicted its 4-thread `cpu` runs 5 to 23% slow: the slowdown (scheduling stalls
    /// of a pool that fills the machine, DRAM shared with the GPU's copies) is not a
    /// property of the bytes alone.
    #[serde(default)]
    pub cpu_serving_slowdown_at: Vec<ThreadSlowdown>,
    /// How much longer a decode layer's gather streams beside its CPU share than the
    /// contended `gather` probe predicts, at the serving threads, as a fraction of the
    /// gather's streaming time (0 = as the probe), dimensionless. It scales with the CPU
    /// pool's DRAM demand at other thread counts ([`PerfParams::link_serving_factor`]).
    /// Probe `step`: the link's busy time in the layers of the hybrid calibration blocks
    /// ([`fit::LinkSample`]). On the H200 (2026-12-05, 02:02Z grid) hybrid's link was busy
    /// 7.6% longer than modelled at 15 threads and 3.5% at 4, while the contended probe (a
    /// CPU kernel of 14 threads streaming throughout) slowed the gather by 2.5% only.
    #[serde(default)]
    pub link_serving_slowdown: f64,
    /// Residual per-layer cost of each strategy, in us. Probe `step` (calibration runs).
    #[serde(default)]
    pub overhead: StrategyOverheads,
    /// Terms of the serving engine that only its end-to-end runs show ([`EngineTerms`]):
    /// `ft calibrate`. Defaults (ft's own runtime) in a host spec and a probed profile.
    #[serde(default)]
    pub engine: EngineTerms,
    /// Relative standard deviation of one measured decode run, dimensionless.
    /// Probe `step`: dispersion of repeated runs (the host spec's value before that).
    pub run_noise_rel: f64,

    // ---- the bench geometry of the legacy rule (not fitted) ----
    /// The expert shape `ft bench bw` measures at (the engine's tuning geometry).
    pub bench_expert: ExpertShape,
    /// Experts per bench step.
    pub bench_experts: u32,

    // ---- capacity (not fitted) ----
    /// Memory of the GPU, in bytes.
    pub gpu_memory_bytes: f64,
    /// GPU memory kept free of expert slots (context, workspace), in bytes.
    pub gpu_reserve_bytes: f64,

    // ---- several GPUs (not fitted; issue #9) ----
    /// The GPUs decoding together and the placement of experts over them (one GPU in a
    /// profile written before several were modelled).
    #[serde(default)]
    pub layout: GpuLayout,
    /// Bandwidth of one GPU's share of the per-layer combine (all-reduce bus bandwidth), in
    /// GB/s (`HostSpec::interconnect`). Unused on one GPU.
    #[serde(default = "default_peer_gbs")]
    pub peer_gbs: f64,
    /// Fixed cost of one per-layer combine, in us (`HostSpec::interconnect`). Unused on one
    /// GPU.
    #[serde(default = "default_peer_latency_us")]
    pub peer_latency_us: f64,

    // ---- the engine's settings (not fitted) ----
    /// The settings of the engine the parameters describe ([`EngineSettings`]: how many
    /// chunks a layer's fetched experts come in): what every layer schedule of a prediction
    /// is built from ([`crate::schedule::LayerSchedule::new`]), so the closed form and the
    /// simulator time the step the engine runs. A probe records its engine's settings here
    /// (they are in its profile key too); a host spec and a profile that records none have
    /// the defaults (omitted from the JSON then).
    #[serde(default, skip_serializing_if = "EngineSettings::is_default")]
    pub engine_settings: EngineSettings,
}

/// The peer bandwidth a profile without one reads as, in GB/s: a PCIe 4.0 x16 combine
/// staged through host memory ([`crate::host::HOST_STAGED_PEER_SHARE`] of about 24 GB/s).
/// Such profiles are single-GPU, where it is unused.
fn default_peer_gbs() -> f64 {
    24.0 * crate::host::HOST_STAGED_PEER_SHARE
}

/// The combine latency a profile without one reads as, in us (see [`default_peer_gbs`]):
/// two 5 us PCIe latencies and [`crate::host::HOST_STAGED_COMBINE_US`].
fn default_peer_latency_us() -> f64 {
    2.0 * 5.0 + crate::host::HOST_STAGED_COMBINE_US
}

/// The parameters that can be fitted and carry an uncertainty, named for covariance rows,
/// gradients and reports.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum ParamId {
    /// [`PerfParams::gather_gbs`].
    GatherGbs,
    /// [`PerfParams::gather_layer_us`].
    GatherLayerUs,
    /// [`PerfParams::gather_copy_us`].
    GatherCopyUs,
    /// [`PerfParams::cpu_gbs`].
    CpuGbs,
    /// [`PerfParams::cpu_thread_exponent`].
    CpuThreadExponent,
    /// [`PerfParams::cpu_layer_us`].
    CpuLayerUs,
    /// [`PerfParams::cpu_expert_us`].
    CpuExpertUs,
    /// [`PerfParams::cpu_token_gmacs`].
    CpuTokenGmacs,
    /// [`PerfParams::dram_gbs`].
    DramGbs,
    /// [`PerfParams::dma_dram_weight`].
    DmaDramWeight,
    /// [`PerfParams::gpu_hbm_gbs`].
    GpuHbmGbs,
    /// [`PerfParams::gpu_launch_us`].
    GpuLaunchUs,
    /// [`PerfParams::gpu_token_gmacs`].
    GpuTokenGmacs,
    /// [`PerfParams::dense_layer_us`].
    DenseLayerUs,
    /// [`PerfParams::dense_hbm_gbs`].
    DenseHbmGbs,
    /// [`PerfParams::sync_us`].
    SyncUs,
    /// [`PerfParams::cpu_serving_slowdown`].
    CpuServingSlowdown,
    /// [`PerfParams::link_serving_slowdown`].
    LinkServingSlowdown,
    /// [`HostCost::layer_us`].
    HostLayerUs,
    /// [`HostCost::expert_us`].
    HostExpertUs,
    /// [`HostCost::cpu_expert_us`].
    HostCpuExpertUs,
    /// [`HostCost::stream_us`].
    HostStreamUs,
    /// [`StrategyOverheads::offload_us`].
    OverheadOffloadUs,
    /// [`StrategyOverheads::hybrid_us`].
    OverheadHybridUs,
    /// [`StrategyOverheads::resident_us`].
    OverheadResidentUs,
    /// [`StrategyOverheads::cpu_us`].
    OverheadCpuUs,
}

impl ParamId {
    /// Every parameter, in report order.
    pub const ALL: [ParamId; 26] = [
        ParamId::GatherGbs,
        ParamId::GatherLayerUs,
        ParamId::GatherCopyUs,
        ParamId::CpuGbs,
        ParamId::CpuThreadExponent,
        ParamId::CpuLayerUs,
        ParamId::CpuExpertUs,
        ParamId::CpuTokenGmacs,
        ParamId::DramGbs,
        ParamId::DmaDramWeight,
        ParamId::GpuHbmGbs,
        ParamId::GpuLaunchUs,
        ParamId::GpuTokenGmacs,
        ParamId::DenseLayerUs,
        ParamId::DenseHbmGbs,
        ParamId::SyncUs,
        ParamId::LinkServingSlowdown,
        ParamId::HostLayerUs,
        ParamId::HostExpertUs,
        ParamId::HostCpuExpertUs,
        ParamId::HostStreamUs,
        ParamId::CpuServingSlowdown,
        ParamId::OverheadOffloadUs,
        ParamId::OverheadHybridUs,
        ParamId::OverheadResidentUs,
        ParamId::OverheadCpuUs,
    ];

    /// The field name in [`PerfParams`] (for reports).
    pub fn name(self) -> &'static str {
        match self {
            ParamId::GatherGbs => "gather_gbs",
            ParamId::GatherLayerUs => "gather_layer_us",
            ParamId::GatherCopyUs => "gather_copy_us",
            ParamId::CpuGbs => "cpu_gbs",
            ParamId::CpuThreadExponent => "cpu_thread_exponent",
            ParamId::CpuLayerUs => "cpu_layer_us",
            ParamId::CpuExpertUs => "cpu_expert_us",
            ParamId::CpuTokenGmacs => "cpu_token_gmacs",
            ParamId::DramGbs => "dram_gbs",
            ParamId::DmaDramWeight => "dma_dram_weight",
            ParamId::GpuHbmGbs => "gpu_hbm_gbs",
            ParamId::GpuLaunchUs => "gpu_launch_us",
            ParamId::GpuTokenGmacs => "gpu_token_gmacs",
            ParamId::DenseLayerUs => "dense_layer_us",
            ParamId::DenseHbmGbs => "dense_hbm_gbs",
            ParamId::SyncUs => "sync_us",
            ParamId::LinkServingSlowdown => "link_serving_slowdown",
            ParamId::HostLayerUs => "host.layer_us",
            ParamId::HostExpertUs => "host.expert_us",
            ParamId::HostCpuExpertUs => "host.cpu_expert_us",
            ParamId::HostStreamUs => "host.stream_us",
            ParamId::CpuServingSlowdown => "cpu_serving_slowdown",
            ParamId::OverheadOffloadUs => "overhead.offload_us",
            ParamId::OverheadHybridUs => "overhead.hybrid_us",
            ParamId::OverheadResidentUs => "overhead.resident_us",
            ParamId::OverheadCpuUs => "overhead.cpu_us",
        }
    }

    /// True for parameters that must stay positive (fitted in log space); the calibrated
    /// fixed costs (which may be zero) and the CPU share's serving slowdown (any sign) are
    /// fitted in their own units.
    pub fn positive(self) -> bool {
        !matches!(
            self,
            ParamId::CpuServingSlowdown
                | ParamId::OverheadOffloadUs
                | ParamId::OverheadHybridUs
                | ParamId::OverheadResidentUs
                | ParamId::OverheadCpuUs
        )
    }
}

impl fmt::Display for ParamId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// Relative standard error given to parameters taken from measured numbers of a host spec
/// (bench bandwidths, linear link and memory bandwidths, the measured round trip): the two
/// `ft bench bw` runs of the field report differ by 3% (46.12 against 47.62 GB/s).
pub const PRIOR_REL_SE_MEASURED: f64 = 0.03;

/// Relative standard error given to engine costs that a host spec only estimates: fixed
/// costs are known to within a factor of about 1.5 before a probe fits them.
pub const PRIOR_REL_SE_ESTIMATED: f64 = 0.25;

/// Absolute standard error of an uncalibrated per-layer overhead, in us (the size of a
/// scheduling gap the micro-probes do not see).
pub const PRIOR_SE_OVERHEAD_US: f64 = 2.0;

/// Standard error of an uncalibrated [`PerfParams::cpu_serving_slowdown`] (dimensionless):
/// a host spec has no end-to-end CPU layer, and the H200's probes fitted 0.13 to 0.26.
pub const PRIOR_SE_SERVING_SLOWDOWN: f64 = 0.25;

/// The smallest valid [`PerfParams::cpu_serving_slowdown`] (excluded), dimensionless: at -1
/// the CPU share's weight stream would take no time at all.
pub const MIN_SERVING_SLOWDOWN: f64 = -1.0;

/// Relative step of the finite differences of the host prior.
const PRIOR_DIFF_STEP: f64 = 1e-6;

/// The inputs of a host spec the prior puts an uncertainty on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum HostInput {
    H2d,
    D2h,
    Latency,
    GatherBench,
    StreamRead,
    MoeBench,
    Hbm,
    GatherEfficiency,
    GatherCopy,
    GatherLayer,
    CpuKernelEfficiency,
    CpuLayer,
    CpuWake,
    CpuExpert,
    CpuTokenGmacs,
    CpuThreadExponent,
    Dram,
    DmaWeight,
    RoundTrip,
    GpuLaunch,
    GpuHbmEfficiency,
    GpuTokenGmacs,
    DenseLayer,
}

impl HostInput {
    const ALL: [HostInput; 23] = [
        HostInput::H2d,
        HostInput::D2h,
        HostInput::Latency,
        HostInput::GatherBench,
        HostInput::StreamRead,
        HostInput::MoeBench,
        HostInput::Hbm,
        HostInput::GatherEfficiency,
        HostInput::GatherCopy,
        HostInput::GatherLayer,
        HostInput::CpuKernelEfficiency,
        HostInput::CpuLayer,
        HostInput::CpuWake,
        HostInput::CpuExpert,
        HostInput::CpuTokenGmacs,
        HostInput::CpuThreadExponent,
        HostInput::Dram,
        HostInput::DmaWeight,
        HostInput::RoundTrip,
        HostInput::GpuLaunch,
        HostInput::GpuHbmEfficiency,
        HostInput::GpuTokenGmacs,
        HostInput::DenseLayer,
    ];

    /// Hardware sections are measurements, the engine's costs estimates.
    fn rel_se(self) -> f64 {
        match self {
            HostInput::H2d
            | HostInput::D2h
            | HostInput::Latency
            | HostInput::GatherBench
            | HostInput::StreamRead
            | HostInput::MoeBench
            | HostInput::Hbm => PRIOR_REL_SE_MEASURED,
            _ => PRIOR_REL_SE_ESTIMATED,
        }
    }

    fn is_fraction(self) -> bool {
        matches!(
            self,
            HostInput::GatherEfficiency
                | HostInput::CpuKernelEfficiency
                | HostInput::CpuThreadExponent
                | HostInput::GpuHbmEfficiency
        )
    }

    fn get(self, h: &HostSpec) -> Option<f64> {
        let e = &h.engine;
        Some(match self {
            HostInput::H2d => h.pcie.h2d_gbs,
            HostInput::D2h => h.pcie.d2h_gbs,
            HostInput::Latency => h.pcie.latency_us,
            HostInput::GatherBench => h.pcie.gather_gbs?,
            HostInput::StreamRead => h.cpu.stream_read_gbs,
            HostInput::MoeBench => h.cpu.moe_gbs?,
            HostInput::Hbm => h.gpu.hbm_gbs,
            HostInput::GatherEfficiency => e.gather_efficiency,
            HostInput::GatherCopy => e.gather_copy_us,
            HostInput::GatherLayer => e.gather_layer_us,
            HostInput::CpuKernelEfficiency => e.cpu_kernel_efficiency,
            HostInput::CpuLayer => e.cpu_layer_us,
            HostInput::CpuWake => e.cpu_wake_us,
            HostInput::CpuExpert => e.cpu_expert_us,
            HostInput::CpuTokenGmacs => e.cpu_token_gmacs,
            HostInput::CpuThreadExponent => e.cpu_thread_exponent,
            HostInput::Dram => h.dram_gbs(),
            HostInput::DmaWeight => e.dma_dram_weight,
            HostInput::RoundTrip => e.hybrid_round_trip_us,
            HostInput::GpuLaunch => e.gpu_launch_us,
            HostInput::GpuHbmEfficiency => e.gpu_hbm_efficiency,
            HostInput::GpuTokenGmacs => e.gpu_token_gmacs,
            HostInput::DenseLayer => e.dense_layer_us,
        })
    }

    fn set(self, h: &mut HostSpec, v: f64) {
        let e = &mut h.engine;
        match self {
            HostInput::H2d => h.pcie.h2d_gbs = v,
            HostInput::D2h => h.pcie.d2h_gbs = v,
            HostInput::Latency => h.pcie.latency_us = v,
            HostInput::GatherBench => h.pcie.gather_gbs = Some(v),
            HostInput::StreamRead => h.cpu.stream_read_gbs = v,
            HostInput::MoeBench => h.cpu.moe_gbs = Some(v),
            HostInput::Hbm => h.gpu.hbm_gbs = v,
            HostInput::GatherEfficiency => e.gather_efficiency = v,
            HostInput::GatherCopy => e.gather_copy_us = v,
            HostInput::GatherLayer => e.gather_layer_us = v,
            HostInput::CpuKernelEfficiency => e.cpu_kernel_efficiency = v,
            HostInput::CpuLayer => e.cpu_layer_us = v,
            HostInput::CpuWake => e.cpu_wake_us = v,
            HostInput::CpuExpert => e.cpu_expert_us = v,
            HostInput::CpuTokenGmacs => e.cpu_token_gmacs = v,
            HostInput::CpuThreadExponent => e.cpu_thread_exponent = v,
            HostInput::Dram => e.dram_gbs = Some(v),
            HostInput::DmaWeight => e.dma_dram_weight = v,
            HostInput::RoundTrip => e.hybrid_round_trip_us = v,
            HostInput::GpuLaunch => e.gpu_launch_us = v,
            HostInput::GpuHbmEfficiency => e.gpu_hbm_efficiency = v,
            HostInput::GpuTokenGmacs => e.gpu_token_gmacs = v,
            HostInput::DenseLayer => e.dense_layer_us = v,
        }
    }
}

/// Bytes of each activation element a hybrid layer sends to the CPU and back (f32).
pub const ACTIVATION_BYTES_PER_ELEMENT: f64 = 4.0;

impl PerfParams {
    /// The parameters a host spec implies: THE mapping from a host to costs, shared with the
    /// simulator.
    ///
    /// - Gather: `gather_layer_us = pcie.latency_us + engine.gather_layer_us`,
    ///   `gather_copy_us = engine.gather_copy_us`. The streaming rate comes from the bench's
    ///   `pcie.gather_gbs` with the engine's fixed costs at the tuning geometry removed
    ///   (`b / gather_gbs_bench = b / rate + copy + layer / n` per expert, `n` tuning
    ///   experts), else `pcie.h2d_gbs * engine.gather_efficiency`.
    /// - CPU: `cpu_layer_us = engine.cpu_layer_us + engine.cpu_wake_us`. The streaming rate
    ///   comes from the bench's `cpu.moe_gbs` the same way (the bench step at the tuning
    ///   geometry: `n` experts of one token each), else `cpu.stream_read_gbs *
    ///   engine.cpu_kernel_efficiency` scaled to the pool's threads.
    /// - DRAM: `dram_gbs` from the host (`HostSpec::dram_gbs`), `dma_dram_weight` from the
    ///   engine.
    /// - GPU: `gpu_hbm_gbs = dense_hbm_gbs = gpu.hbm_gbs * engine.gpu_hbm_efficiency`;
    ///   launch, token rate and dense fixed cost from the engine.
    /// - Sync: `engine.hybrid_round_trip_us`; activations over `min(h2d, d2h)`.
    ///
    /// Errors when the bench bandwidths are slower than the engine's fixed costs alone can
    /// explain (a negative streaming time), naming the keys.
    pub fn from_host(host: &HostSpec) -> Result<Self> {
        host.validate()?;
        let p = Self::map_host(host)?;
        p.validate()?;
        Ok(p)
    }

    /// [`PerfParams::from_host`] without validating the host or the result (the prior's
    /// finite differences perturb a valid host slightly past its bounds).
    fn map_host(host: &HostSpec) -> Result<Self> {
        let e = &host.engine;
        let tuning = host.tuning_model()?;
        let tb = tuning.expert_bytes() as f64;
        let tn = host.tuning_experts()? as f64;
        let threads = host.cpu_threads();

        let gather_layer_us = host.pcie.latency_us + e.gather_layer_us;
        let gather_copy_us = e.gather_copy_us;
        let gather_gbs = match host.pcie.gather_gbs {
            Some(bench) => {
                let per_expert_us = tb / (bench * BYTES_PER_US_PER_GBS);
                let stream_us = per_expert_us - gather_copy_us - gather_layer_us / tn;
                if stream_us <= 0.0 {
                    return Err(ModelError::invalid(
                        "pcie.gather_gbs",
                        format!(
                            "{bench} GB/s at {tb} B experts leaves no time to stream once \
                             engine.gather_copy_us and the gather's fixed cost are taken"
                        ),
                    ));
                }
                tb / (stream_us * BYTES_PER_US_PER_GBS)
            }
            None => host.pcie.h2d_gbs * e.gather_efficiency,
        };

        let cpu_layer_us = e.cpu_layer_us + e.cpu_wake_us;
        let cpu_gbs = match host.cpu.moe_gbs {
            Some(bench) => {
                let per_expert_us = tb / (bench * BYTES_PER_US_PER_GBS);
                // The bench's first token is in the streaming rate, so no token term here.
                let stream_us = per_expert_us - e.cpu_expert_us - cpu_layer_us / tn;
                if stream_us <= 0.0 {
                    return Err(ModelError::invalid(
                        "cpu.moe_gbs",
                        format!(
                            "{bench} GB/s at {tb} B experts leaves no time to stream once \
                             engine.cpu_expert_us and the layer's fixed cost are taken"
                        ),
                    ));
                }
                tb / (stream_us * BYTES_PER_US_PER_GBS)
            }
            None => {
                let share = (threads as f64 / host.cpu.cores as f64).min(1.0);
                host.cpu.stream_read_gbs
                    * e.cpu_kernel_efficiency
                    * share.powf(e.cpu_thread_exponent)
            }
        };

        let p = PerfParams {
            gather_gbs,
            gather_layer_us,
            gather_copy_us,
            activation_link_gbs: host.pcie.h2d_gbs.min(host.pcie.d2h_gbs),
            cpu_gbs,
            cpu_threads: threads,
            cpu_thread_exponent: e.cpu_thread_exponent,
            cpu_layer_us,
            cpu_expert_us: e.cpu_expert_us,
            cpu_token_gmacs: e.cpu_token_gmacs,
            dram_gbs: host.dram_gbs(),
            dma_dram_weight: e.dma_dram_weight,
            gpu_hbm_gbs: host.gpu.hbm_gbs * e.gpu_hbm_efficiency,
            gpu_launch_us: e.gpu_launch_us,
            gpu_token_gmacs: e.gpu_token_gmacs,
            dense_layer_us: e.dense_layer_us,
            dense_hbm_gbs: Some(host.gpu.hbm_gbs * e.gpu_hbm_efficiency),
            sync_us: e.hybrid_round_trip_us,
            host: HostCost::default(),
            link_serving_slowdown: 0.0,
            cpu_serving_slowdown: 0.0,
            cpu_serving_slowdown_at: Vec::new(),
            overhead: StrategyOverheads::default(),
            engine: EngineTerms::default(),
            run_noise_rel: e.run_noise_rel,
            bench_expert: ExpertShape::of(&tuning),
            bench_experts: host.tuning_experts()?,
            gpu_memory_bytes: host.gpu_memory_bytes(),
            gpu_reserve_bytes: e.gpu_reserve_gib * GIB,
            layout: host.gpu_layout(),
            peer_gbs: host.interconnect().peer_gbs,
            peer_latency_us: host.interconnect().latency_us,
            engine_settings: EngineSettings::default(),
        };
        Ok(p)
    }

    /// The prior uncertainty of parameters taken from a host spec (no probe fitted).
    ///
    /// The uncertainty is put on the host spec's inputs and propagated through
    /// [`PerfParams::from_host`]: the hardware sections (`[gpu]`, `[pcie]`, `[cpu]`) are
    /// measurements with relative standard error [`PRIOR_REL_SE_MEASURED`], the `[engine]`
    /// costs estimates with [`PRIOR_REL_SE_ESTIMATED`]. With `J` the finite-difference
    /// Jacobian of the parameters over the inputs and `S` the inputs' diagonal covariance,
    /// the parameters' covariance is `J S J^T`; this keeps the correlations the mapping
    /// creates (a bench bandwidth fixes the sum of streaming and fixed costs at the tuning
    /// geometry, so a larger fixed cost means a faster stream). The calibrated overheads get
    /// [`PRIOR_SE_OVERHEAD_US`] each, the serving slowdown [`PRIOR_SE_SERVING_SLOWDOWN`].
    pub fn host_prior(&self, host: &HostSpec) -> ParamCovariance {
        let ids: Vec<ParamId> = ParamId::ALL.to_vec();
        let base: Vec<f64> = ids.iter().map(|&id| self.get(id)).collect();
        let n = ids.len();
        let mut cov = vec![vec![0.0; n]; n];
        for input in HostInput::ALL {
            let Some(v) = input.get(host) else { continue };
            let se = input.rel_se() * v.abs();
            if se == 0.0 {
                continue;
            }
            // Step inside the input's domain (fractions at 1 step down).
            let h = PRIOR_DIFF_STEP * v.abs();
            let step = if input.is_fraction() && v + h > 1.0 {
                -h
            } else {
                h
            };
            let mut moved = host.clone();
            input.set(&mut moved, v + step);
            let Ok(q) = Self::map_host(&moved) else {
                continue;
            };
            let d: Vec<f64> = ids
                .iter()
                .zip(&base)
                .map(|(&id, b)| (q.get(id) - b) / step * se)
                .collect();
            for a in 0..n {
                for b in 0..n {
                    cov[a][b] += d[a] * d[b];
                }
            }
        }
        for (i, id) in ids.iter().enumerate() {
            if *id == ParamId::CpuServingSlowdown {
                cov[i][i] += PRIOR_SE_SERVING_SLOWDOWN * PRIOR_SE_SERVING_SLOWDOWN;
            } else if !id.positive() {
                cov[i][i] += PRIOR_SE_OVERHEAD_US * PRIOR_SE_OVERHEAD_US;
            }
        }
        ParamCovariance {
            params: ids,
            matrix: cov,
        }
    }

    /// Read one parameter.
    pub fn get(&self, id: ParamId) -> f64 {
        match id {
            ParamId::GatherGbs => self.gather_gbs,
            ParamId::GatherLayerUs => self.gather_layer_us,
            ParamId::GatherCopyUs => self.gather_copy_us,
            ParamId::CpuGbs => self.cpu_gbs,
            ParamId::CpuThreadExponent => self.cpu_thread_exponent,
            ParamId::CpuLayerUs => self.cpu_layer_us,
            ParamId::CpuExpertUs => self.cpu_expert_us,
            ParamId::CpuTokenGmacs => self.cpu_token_gmacs,
            ParamId::DramGbs => self.dram_gbs,
            ParamId::DmaDramWeight => self.dma_dram_weight,
            ParamId::GpuHbmGbs => self.gpu_hbm_gbs,
            ParamId::GpuLaunchUs => self.gpu_launch_us,
            ParamId::GpuTokenGmacs => self.gpu_token_gmacs,
            ParamId::DenseLayerUs => self.dense_layer_us,
            ParamId::DenseHbmGbs => self.dense_rate_gbs(),
            ParamId::SyncUs => self.sync_us,
            ParamId::LinkServingSlowdown => self.link_serving_slowdown,
            ParamId::HostLayerUs => self.host.layer_us,
            ParamId::HostExpertUs => self.host.expert_us,
            ParamId::HostCpuExpertUs => self.host.cpu_expert_us,
            ParamId::HostStreamUs => self.host.stream_us,
            ParamId::CpuServingSlowdown => self.cpu_serving_slowdown,
            ParamId::OverheadOffloadUs => self.overhead.offload_us,
            ParamId::OverheadHybridUs => self.overhead.hybrid_us,
            ParamId::OverheadResidentUs => self.overhead.resident_us,
            ParamId::OverheadCpuUs => self.overhead.cpu_us,
        }
    }

    /// Write one parameter (no validation; call [`PerfParams::validate`] after).
    pub fn set(&mut self, id: ParamId, v: f64) {
        match id {
            ParamId::GatherGbs => self.gather_gbs = v,
            ParamId::GatherLayerUs => self.gather_layer_us = v,
            ParamId::GatherCopyUs => self.gather_copy_us = v,
            ParamId::CpuGbs => self.cpu_gbs = v,
            ParamId::CpuThreadExponent => self.cpu_thread_exponent = v,
            ParamId::CpuLayerUs => self.cpu_layer_us = v,
            ParamId::CpuExpertUs => self.cpu_expert_us = v,
            ParamId::CpuTokenGmacs => self.cpu_token_gmacs = v,
            ParamId::DramGbs => self.dram_gbs = v,
            ParamId::DmaDramWeight => self.dma_dram_weight = v,
            ParamId::GpuHbmGbs => self.gpu_hbm_gbs = v,
            ParamId::GpuLaunchUs => self.gpu_launch_us = v,
            ParamId::GpuTokenGmacs => self.gpu_token_gmacs = v,
            ParamId::DenseLayerUs => self.dense_layer_us = v,
            ParamId::DenseHbmGbs => self.dense_hbm_gbs = Some(v),
            ParamId::SyncUs => self.sync_us = v,
            ParamId::LinkServingSlowdown => self.link_serving_slowdown = v,
            ParamId::HostLayerUs => self.host.layer_us = v,
            ParamId::HostExpertUs => self.host.expert_us = v,
            ParamId::HostCpuExpertUs => self.host.cpu_expert_us = v,
            ParamId::HostStreamUs => self.host.stream_us = v,
            ParamId::CpuServingSlowdown => self.cpu_serving_slowdown = v,
            ParamId::OverheadOffloadUs => self.overhead.offload_us = v,
            ParamId::OverheadHybridUs => self.overhead.hybrid_us = v,
            ParamId::OverheadResidentUs => self.overhead.resident_us = v,
            ParamId::OverheadCpuUs => self.overhead.cpu_us = v,
        }
    }

    /// Check every parameter: rates positive, fixed costs finite and not negative, the
    /// thread exponent in [0, 1]; errors name the field.
    pub fn validate(&self) -> Result<()> {
        for (name, v) in [
            ("gather_gbs", self.gather_gbs),
            ("activation_link_gbs", self.activation_link_gbs),
            ("cpu_gbs", self.cpu_gbs),
            ("cpu_token_gmacs", self.cpu_token_gmacs),
            ("dram_gbs", self.dram_gbs),
            ("dma_dram_weight", self.dma_dram_weight),
            ("gpu_hbm_gbs", self.gpu_hbm_gbs),
            ("dense_hbm_gbs", self.dense_rate_gbs()),
            ("gpu_token_gmacs", self.gpu_token_gmacs),
            ("gpu_memory_bytes", self.gpu_memory_bytes),
            ("peer_gbs", self.peer_gbs),
        ] {
            if !(v.is_finite() && v > 0.0) {
                return Err(ModelError::invalid(
                    format!("perf.{name}"),
                    format!("{v} is not a positive number"),
                ));
            }
        }
        for (name, v) in [
            ("gather_layer_us", self.gather_layer_us),
            ("gather_copy_us", self.gather_copy_us),
            ("cpu_layer_us", self.cpu_layer_us),
            ("cpu_expert_us", self.cpu_expert_us),
            ("gpu_launch_us", self.gpu_launch_us),
            ("dense_layer_us", self.dense_layer_us),
            ("sync_us", self.sync_us),
            ("link_serving_slowdown", self.link_serving_slowdown),
            ("host.layer_us", self.host.layer_us),
            ("host.expert_us", self.host.expert_us),
            ("host.cpu_expert_us", self.host.cpu_expert_us),
            ("host.stream_us", self.host.stream_us),
            ("run_noise_rel", self.run_noise_rel),
            ("gpu_reserve_bytes", self.gpu_reserve_bytes),
            ("peer_latency_us", self.peer_latency_us),
        ] {
            if !(v.is_finite() && v >= 0.0) {
                return Err(ModelError::invalid(
                    format!("perf.{name}"),
                    format!("{v} is not a finite number >= 0"),
                ));
            }
        }
        if !(self.cpu_serving_slowdown.is_finite()
            && self.cpu_serving_slowdown > MIN_SERVING_SLOWDOWN)
        {
            return Err(ModelError::invalid(
                "perf.cpu_serving_slowdown",
                format!(
                    "{} is not a finite number above {MIN_SERVING_SLOWDOWN} (the CPU share's \
                     weight stream would take no time)",
                    self.cpu_serving_slowdown
                ),
            ));
        }
        for k in &self.cpu_serving_slowdown_at {
            if k.threads == 0
                || !(k.slowdown.is_finite() && k.slowdown > MIN_SERVING_SLOWDOWN)
                || !(k.se.is_nan() || k.se >= 0.0)
            {
                return Err(ModelError::invalid(
                    "perf.cpu_serving_slowdown_at",
                    format!(
                        "{} threads: slowdown {} (se {}) needs at least 1 thread, a finite \
                         slowdown above {MIN_SERVING_SLOWDOWN} and a standard error >= 0",
                        k.threads, k.slowdown, k.se
                    ),
                ));
            }
        }
        for work in LayerWork::ALL {
            let v = self.overhead.of(work);
            if !(v.is_finite() && v >= 0.0) {
                return Err(ModelError::invalid(
                    format!("perf.overhead.{}", StrategyOverheads::field(work)),
                    format!(
                        "{v} is not a finite number >= 0 (a fixed cost of the {} work; \
                         fit the profile again: fixed costs are fitted non-negative)",
                        work.name()
                    ),
                ));
            }
        }
        self.engine.validate()?;
        self.engine_settings.check().map_err(|e| match e {
            ModelError::Invalid { reason, .. } => {
                ModelError::invalid("perf.engine_settings.fetch-chunks", reason)
            }
            e => e,
        })?;
        if !(0.0..=1.0).contains(&self.cpu_thread_exponent) {
            return Err(ModelError::invalid(
                "perf.cpu_thread_exponent",
                format!("{} is outside [0, 1]", self.cpu_thread_exponent),
            ));
        }
        if self.cpu_threads == 0 {
            return Err(ModelError::invalid(
                "perf.cpu_threads",
                "must be at least 1",
            ));
        }
        if self.layout.gpus == 0 {
            return Err(ModelError::invalid(
                "perf.layout.gpus",
                "must be at least 1",
            ));
        }
        if self.layout.gpus > self.cpu_threads {
            return Err(ModelError::invalid(
                "engine.cpu_threads",
                format!(
                    "{} CPU workers cannot be split between {} GPUs (each GPU's hybrid share \
                     needs at least one)",
                    self.cpu_threads, self.layout.gpus
                ),
            ));
        }
        Ok(())
    }
}

/// A covariance matrix over some parameters, in their absolute units (us^2, (GB/s)^2, ...).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ParamCovariance {
    /// The parameters of the rows and columns, in order.
    pub params: Vec<ParamId>,
    /// Row-major `params.len() x params.len()` covariance.
    pub matrix: Vec<Vec<f64>>,
}

impl ParamCovariance {
    /// A diagonal covariance from standard errors.
    pub fn diagonal(params: Vec<ParamId>, se: &[f64]) -> Self {
        let n = params.len();
        let mut matrix = vec![vec![0.0; n]; n];
        for (i, s) in se.iter().enumerate().take(n) {
            matrix[i][i] = s * s;
        }
        ParamCovariance { params, matrix }
    }

    /// No uncertainty at all.
    pub fn none() -> Self {
        ParamCovariance {
            params: Vec::new(),
            matrix: Vec::new(),
        }
    }

    /// Standard error of one parameter (0 when it is not in the matrix).
    pub fn se(&self, id: ParamId) -> f64 {
        self.params
            .iter()
            .position(|p| *p == id)
            .and_then(|i| self.matrix.get(i)?.get(i))
            .map(|v| v.max(0.0).sqrt())
            .unwrap_or(0.0)
    }

    /// The variance `g^T C g` of a linear function with gradient `g` (indexed like
    /// `params`). Entries a malformed matrix or a short gradient lacks count as 0 (a read
    /// profile's covariance is checked by `Profile::validate`; this never indexes past it).
    pub fn quadratic_form(&self, g: &[f64]) -> f64 {
        let mut v = 0.0;
        for (gi, row) in g.iter().zip(&self.matrix).take(self.params.len()) {
            for (gj, c) in g.iter().zip(row).take(self.params.len()) {
                v += gi * c * gj;
            }
        }
        v
    }

    /// Replace the rows and columns of `other`'s parameters by `other`'s (cross terms with
    /// the parameters `other` does not hold are dropped), keeping the rest.
    pub fn overlay(&self, other: &ParamCovariance) -> ParamCovariance {
        let mut params: Vec<ParamId> = self
            .params
            .iter()
            .copied()
            .filter(|p| !other.params.contains(p))
            .collect();
        let kept = params.len();
        params.extend(other.params.iter().copied());
        let n = params.len();
        let mut matrix = vec![vec![0.0; n]; n];
        for i in 0..kept {
            for j in 0..kept {
                let a = self.params.iter().position(|p| *p == params[i]).unwrap();
                let b = self.params.iter().position(|p| *p == params[j]).unwrap();
                matrix[i][j] = self.matrix[a][b];
            }
        }
        for i in 0..other.params.len() {
            for j in 0..other.params.len() {
                matrix[kept + i][kept + j] = other.matrix[i][j];
            }
        }
        ParamCovariance { params, matrix }
    }
}

/// Parameters with their uncertainty and where they came from: what prediction consumes.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PerfModel {
    /// The parameters.
    pub params: PerfParams,
    /// Their covariance.
    pub covariance: ParamCovariance,
    /// Residual degrees of freedom of the fit they came from (`None` for a host spec's
    /// prior: intervals then use the normal quantile).
    pub dof: Option<usize>,
    /// Where the parameters came from (a host spec's name, a profile's path).
    pub source: String,
}

/// Where the CPU speed that rescales a model ([`PerfModel::at_cpu_speed`]) came from.
#[derive(Debug, Clone, PartialEq)]
pub enum CpuSpeedSource {
    /// A CPU check of the served work taken `when` (e.g. "at start"): `now_us` against the
    /// probe's check of the same work, `probe_us`.
    Checked {
        /// When the check was taken, in words ("at start", "before the first round").
        when: String,
        /// The check's time now, in us.
        now_us: f64,
        /// The probe's check of the same work, in us.
        probe_us: f64,
    },
    /// Given by the user with `flag` (a what-if, or a speed measured elsewhere).
    Given {
        /// The option that gave it, e.g. `--cpu-speed`.
        flag: String,
    },
}

impl std::fmt::Display for CpuSpeedSource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            CpuSpeedSource::Checked {
                when,
                now_us,
                probe_us,
            } => write!(
                f,
                "the CPU check {when}: {now_us:.0} us, the probe's {probe_us:.0} us"
            ),
            CpuSpeedSource::Given { flag } => write!(f, "given with {flag}"),
        }
    }
}

impl PerfModel {
    /// This model with its CPU side at `speed` times the probe's
    /// ([`PerfParams::with_cpu_speed`]; the covariance and degrees of freedom as they are),
    /// its source extended by where that speed came from (`why`), in one wording: the one
    /// way `ft predict --cpu-speed` and `--cpu-check`, `ft serve`'s check at start and `ft
    /// run`'s auto fraction rescale a model, e.g. `profile P; CPU side at 0.930x the probe's
    /// (the CPU check at start: 812 us, the probe's 755 us)`.
    pub fn at_cpu_speed(&self, speed: f64, why: &CpuSpeedSource) -> Result<PerfModel> {
        Ok(PerfModel {
            params: self.params.with_cpu_speed(speed)?,
            source: format!(
                "{}; CPU side at {speed:.3}x the probe's ({why})",
                self.source
            ),
            ..self.clone()
        })
    }

    /// The model of an unprobed host: [`PerfParams::from_host`] with
    /// [`PerfParams::host_prior`].
    pub fn from_host(host: &HostSpec) -> Result<Self> {
        let params = PerfParams::from_host(host)?;
        let covariance = params.host_prior(host);
        Ok(PerfModel {
            params,
            covariance,
            dof: None,
            source: format!("host spec '{}'", host.name),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_rescaled_model_says_where_its_cpu_speed_came_from() {
        let host = HostSpec::field_report();
        let m = PerfModel::from_host(&host).unwrap();
        let checked = CpuSpeedSource::Checked {
            when: "at start".into(),
            now_us: 812.4,
            probe_us: 755.0,
        };
        let q = m.at_cpu_speed(0.93, &checked).unwrap();
        assert_eq!(q.params, m.params.with_cpu_speed(0.93).unwrap());
        assert_eq!(
            q.source,
            format!(
                "{}; CPU side at 0.930x the probe's (the CPU check at start: 812 us, the probe's 755 us)",
                m.source
            )
        );
        let given = CpuSpeedSource::Given {
            flag: "--cpu-speed".into(),
        };
        let g = m.at_cpu_speed(2.0, &given).unwrap();
        assert!(g
            .source
            .ends_with("CPU side at 2.000x the probe's (given with --cpu-speed)"));
        assert!(m.at_cpu_speed(0.0, &given).is_err());
    }

    #[test]
    fn every_param_reads_back_what_was_written() {
        let mut p = PerfParams::from_host(&HostSpec::field_report()).unwrap();
        for (i, id) in ParamId::ALL.into_iter().enumerate() {
            p.set(id, 1.0 + i as f64);
        }
        for (i, id) in ParamId::ALL.into_iter().enumerate() {
            assert_eq!(p.get(id), 1.0 + i as f64, "{id}");
        }
        let names: std::collections::BTreeSet<_> = ParamId::ALL.iter().map(|p| p.name()).collect();
        assert_eq!(names.len(), ParamId::ALL.len());
    }

    #[test]
    fn from_host_removes_fixed_costs_from_the_bench_bandwidths() {
        let host = HostSpec::field_report();
        let p = PerfParams::from_host(&host).unwrap();
        let tuning = host.tuning_model().unwrap();
        let shape = ExpertShape::of(&tuning);
        let n = host.tuning_experts().unwrap() as f64;
        // What the bench measured is what the model says the bench step takes.
        let gather = p.gather_us(n, shape.bytes);
        let bench_gather = n * shape.bytes / (24.25 * BYTES_PER_US_PER_GBS);
        assert!(
            (gather - bench_gather).abs() < 1e-6 * bench_gather,
            "{gather} {bench_gather}"
        );
        let cpu = p.cpu_step_us(n, n, shape, p.cpu_threads as f64);
        let bench_cpu = n * shape.bytes / (46.12 * BYTES_PER_US_PER_GBS);
        assert!(
            (cpu - bench_cpu).abs() < 1e-6 * bench_cpu,
            "{cpu} {bench_cpu}"
        );
        // The streaming rates are above the bench's: the bench paid fixed costs.
        assert!(p.cpu_gbs > 46.12 && p.gather_gbs > 24.25);
        assert_eq!(p.cpu_layer_us, 14.0);
    }

    #[test]
    fn a_bench_slower_than_its_fixed_costs_is_refused_by_name() {
        let mut host = HostSpec::field_report();
        host.engine.cpu_expert_us = 1000.0;
        let e = PerfParams::from_host(&host).unwrap_err().to_string();
        assert!(e.contains("cpu.moe_gbs"), "{e}");
        let mut host = HostSpec::field_report();
        host.engine.gather_copy_us = 1000.0;
        let e = PerfParams::from_host(&host).unwrap_err().to_string();
        assert!(e.contains("pcie.gather_gbs"), "{e}");
    }

    #[test]
    fn covariance_overlay_and_quadratic_form() {
        let a = ParamCovariance::diagonal(vec![ParamId::GatherGbs, ParamId::CpuGbs], &[1.0, 2.0]);
        let b = ParamCovariance {
            params: vec![ParamId::CpuGbs, ParamId::SyncUs],
            matrix: vec![vec![9.0, 1.0], vec![1.0, 4.0]],
        };
        let c = a.overlay(&b);
        assert_eq!(c.se(ParamId::GatherGbs), 1.0);
        assert_eq!(c.se(ParamId::CpuGbs), 3.0);
        assert_eq!(c.se(ParamId::SyncUs), 2.0);
        assert_eq!(c.se(ParamId::DramGbs), 0.0);
        // g = (1, 1, 1) over (gather, cpu, sync): 1 + 9 + 4 + 2*1.
        assert_eq!(c.quadratic_form(&[1.0, 1.0, 1.0]), 16.0);
    }
}
