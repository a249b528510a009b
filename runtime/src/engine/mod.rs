//! The decode engine: one decode step of B concurrent streams, per strategy, on G >= 1 real
//! (or host-emulated) devices.
//!
//! One engine for any GPU count: each GPU owns its part (slots and expert cache, dense
//! buffers, activation buffers, a compute, a copy and an activations stream, host staging,
//! the CPU workers of its share, [`ft_model::GpuLayout::cpu_workers`]); the host bank of
//! whole experts is shared (opened as one group, [`Device::open_group`], so every GPU may
//! copy from it; under tensor parallelism each GPU also gets a bank of its slices,
//! [`HostBank::tensor_parallel_slice`]). One GPU is the G = 1 case of the same step.
//!
//! # A decode step
//! Each layer is issued from its [`LayerSchedule`] (`ft_model::schedule`, the description
//! the analytic model and the simulator share): the host plans every GPU's share of the
//! layer, builds the schedule from their counts, and issues each operation the schedule
//! holds, recording it ([`LayerOps`]); the properties the schedule gives (the gated last
//! chunk and the folded combine on one GPU, the peer combine on several) decide how. A
//! hidden-size f32 vector per stream (its token's input, [`token_input`]) flows through the
//! MoE layers. For each layer, on every GPU:
//!
//! 1. **Dense** (compute stream): a memory-bound kernel over the layer's dense weights
//!    and each stream's KV bytes at its context length ([`crate::dense::DenseBuffers`]). It
//!    is split at the router: the attention-and-router share runs first (the routing is only
//!    known after it), the shared experts' share after the routed experts' gathers started.
//!    Every GPU runs the whole dense part (replicated).
//! 2. **Plan / Issue** (host): [`ft_model::plan::plan_layer_placed`] says, for the layer's
//!    placement under the strategy's policy ([`Strategy::policy`]) and the routes the GPU
//!    holds ([`ft_model::GpuLayout::routes_on`]), which experts hit, which misses are
//!    gathered into which slot (evicting whom) and which are computed on the CPU: a cached
//!    layer by the fetch fraction (offload and resident 1, cpu 0, hybrid `f`), a resident
//!    layer (layer split) from its own slots, a CPU-only layer on the CPU.
//!    Routing comes from a routing source and is known to the host; the engine still orders
//!    each layer's gathers after that layer's router on the device (a stream wait), as an
//!    engine that reads the router's output would.
//! 3. **Gather** (copy stream): one copy-engine transfer per fetched expert, bank to slot,
//!    overlapping the hits' compute.
//! 4. **Hits, FetchedEarly, LastLaunch, LastChunk** (compute stream): one expert step over
//!    the hits, then one over the fetched misses ([`crate::gpu_experts::ExpertStep`]) in
//!    chunks (`FetchChunks`), each after its chunk's copies (the schedule's chunks,
//!    [`LayerSchedule::fetch_chunk_bounds`]: at most [`EngineSettings::fetch_chunks`],
//!    halving from the last; the schedule holds `FetchedEarly` only where there are several):
//!    the earlier chunks
//!    behind an event wait, the last one, where the schedule gates it (one GPU) and the
//!    device can (copy-engine gathers, stream flag writes), queued at once and gated on a
//!    flag the copy stream sets after its copies ([`crate::device::FlagGate`],
//!    [`Engine::gates_last_chunk`]), so that its launch overlaps the last copy; where the
//!    schedule folds the combine (one GPU, no CPU share), the layer's sum and residual add
//!    are folded into that last launch.
//! 5. **CpuShare, RoundTrip** (hybrid, cpu, CPU-only layers): the layer's activations go
//!    device-to-host on the third stream; the host waits for them (the layer's one host round
//!    trip; a layer without CPU work has none), runs the CPU experts on the GPU's pool
//!    ([`crate::cpu_pool::CpuExecutor`]) from the host bank while the GPU computes the hits,
//!    and queues a zero-copy read of the CPU's output rows into the GPU's. On one GPU the
//!    host is the only thread that talks to the device and also one of the CPU share's
//!    threads, so it queues before the share only what the share waits for (the dense part
//!    up to the router, the activations' copy down right behind it) and the first chunk of
//!    gathers; the other chunks' gathers, the experts' input rows, the post-router dense
//!    part, the experts' kernels and the next layer's plan go in while the activations
//!    travel and, what is left, beside the share while the pool's workers take its first
//!    tiles. Plans still run in layer order. On several GPUs every GPU's work is queued
//!    first and the shares run at once, one host thread per GPU with a share, on disjoint
//!    worker ranges.
//! 6. **Combine, PeerCombine** (compute stream): the expert outputs are summed per stream in
//!    a fixed order ([`CombineOrder`]) and added to the residual stream; on several GPUs the
//!    partial output rows are first summed over the GPUs (the peer combine, [`CombineMethod`]:
//!    NCCL or through the host), so every GPU's residual stream stays the same.
//!
//! The routed experts' sum is scaled by [`residual_scale`] (`1/sqrt(layers)`) so that the
//! residual stream stays bounded over any number of layers without a normalisation kernel
//! (the device API has none yet); outputs are real and comparable between strategies.
//!
//! # Strategies
//! - `offload`: every miss gathered into the cache; all experts on the GPU.
//! - `hybrid(f)`: `plan_layer` gathers `fetch_count(f, misses)` of each layer's misses, the
//!   ones serving the most tokens first (then the most recently requested, then the lowest
//!   id); the rest are computed on the CPU and never enter the cache.
//! - `resident`: every expert in device memory (refused, with the layers that would fit,
//!   when it does not).
//! - `cpu`: every miss on the CPU (the cache holds only what a static hot set puts there).
//! - `layer-split:N`: the first N layers' experts on the CPU (CPU-only layers: no cache, no
//!   gathers), every other layer's experts loaded once into slots of their own after the
//!   cache's ([`SlotCounts`]) and computed there, never looked up or evicted; refused, with
//!   the N that would fit, when they do not fit.
//! - `layer-split-cached:N`: the first N layers on the CPU, the others cached as offload.

mod decode;
mod peer;
pub mod probe;
mod timeline;
mod work;

pub use decode::{
    decode, draw_routing, record_routing, request_tags, token_input, DecodeOptions, Decoded,
    INPUT_SALT_WARMUP,
};
pub use ft_model::engine_settings::{EngineSettings, REMOVED_ENGINE_ENVS};
pub use peer::{CombineMethod, GpuCounts, GpuStep};
pub use work::CombineOrder;

use ft_kernels::{ActivationPath, ExpertWork};
use ft_model::cache::SlotId;
use ft_model::cache::{CacheOptions, CachePolicy, ExpertCache};
use ft_model::perf::step::LayerCounts as PlanCounts;
use ft_model::plan::{fetch_fraction, plan_layer_placed, MAX_FETCH_CHUNKS};
use ft_model::profile::CpuCheck;
use ft_model::routing::TokenRoute;
use ft_model::schedule::{LayerSchedule, OpKind};
use ft_model::{
    CpuLayers, ExpertId, GpuLayout, GpuPlacement, LayerPlacement, ModelSpec, PlacementPolicy,
    Strategy, StrategyKind,
};
use serde::{Deserialize, Serialize};

use crate::bank::{slice_geometry, HostBank};
use crate::cpu_pool::{CpuExecutor, PoolWait};
use crate::dense::{DenseBuffers, DenseRead, DENSE_OUT_BYTES};
use crate::device::{
    Device, DeviceBuffer, DeviceKind, Event, FlagGate, HostBuffer, LayerCombine, Stream,
};
use crate::error::{Result, RuntimeError};
use crate::gather::{self, GatherMethod};
use crate::gpu_experts::ExpertStep;
use crate::instrument::{ns_of_us, Span, StepRecord, StepTimeline};
use crate::numerics::StepOutputs;
use crate::slots::{SlotPool, DEFAULT_RESERVE_BYTES};

use peer::Combiner;
use timeline::{LayerEvents, LayerMarks};
use work::{build_layer, replicate_rounds, BuildContext, Rows, F32_BYTES};

/// The scale of every router weight: `1 / sqrt(layers)`. Random experts with unit-scale
/// weights roughly square the norm of their input (SwiGLU is quadratic near 0), so an
/// unscaled residual stream would grow without bound over many layers; with this scale the
/// routed experts add a bounded share (about a fifth of the input's norm over the whole
/// stack) whatever the layer count.
pub fn residual_scale(layers: usize) -> f32 {
    1.0 / (layers.max(1) as f32).sqrt()
}

/// Where an engine's expert weights come from.
#[derive(Debug, Clone, Copy)]
pub enum BankSource<'a> {
    /// Deterministic synthetic weights from this seed.
    Seed(u64),
    /// A safetensors checkpoint's expert tensors.
    Safetensors(&'a std::path::Path),
}

/// How an engine is built. Everything with a unit says so.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct EngineConfig {
    /// The strategy; hybrid's fetch fraction must be a number (resolve `auto` first).
    pub strategy: Strategy,
    /// Slots of the expert cache (ignored by `resident`, which holds every expert).
    pub cache_slots: usize,
    /// The cache's policy, topology and admission (a per-layer cache's slots are
    /// `cache_slots` rounded down to a multiple of the layers, or its slots per layer).
    pub cache_options: CacheOptions,
    /// Most streams a step may have.
    pub max_streams: usize,
    /// Longest context a stream may have, tokens.
    pub max_context: usize,
    /// Threads computing the CPU share; under [`PoolWait::Spin`] the host thread is one of
    /// them ([`crate::cpu_pool`]).
    pub threads: usize,
    /// How the CPU pool waits between layers.
    pub pool_wait: PoolWait,
    /// Activation path of the GPU expert kernels. The default is int8 on both sides, the
    /// same bits wherever an expert runs; a caller building for a format without it
    /// (`bf16`) takes [`ActivationPath::preferred`] for both.
    pub gpu_path: ActivationPath,
    /// Activation path of the CPU expert kernels.
    pub cpu_path: ActivationPath,
    /// How expert outputs are combined.
    pub combine: CombineOrder,
    /// How misses cross the link.
    pub gather: GatherMethod,
    /// Seed of the expert weights (the host bank).
    pub seed: u64,
    /// Record timing events for per-layer GPU and PCIe busy times (costs about 1 us of host
    /// time per event on CUDA; off: only host-side times and counts).
    pub timeline: bool,
    /// Device memory left free beside everything the engine allocates (slots, dense
    /// buffers, activations), bytes: the CUDA context, kernel scratch, other processes.
    pub reserve_bytes: u64,
    /// The settings a user chooses ([`EngineSettings`]: the same for `ft run`, `ft probe`
    /// and `ft serve`).
    pub settings: EngineSettings,
}

impl EngineConfig {
    /// Refuse what no engine can run, naming the flag: no streams, an activation path the
    /// model's format lacks, settings out of range ([`EngineSettings::check`]). Both the
    /// single- and the multi-GPU engine check it first.
    pub fn check(&self, model: &ModelSpec) -> Result<()> {
        if self.max_streams == 0 {
            return Err(RuntimeError::invalid("--streams", "must be at least 1"));
        }
        self.settings.check()?;
        for (flag, p) in [("--gpu-act", self.gpu_path), ("--cpu-act", self.cpu_path)] {
            if !p.supports(model.format) {
                return Err(RuntimeError::invalid(
                    flag,
                    format!(
                        "{} experts have no {p} activation path; use f32",
                        model.format
                    ),
                ));
            }
        }
        Ok(())
    }
}

impl Default for EngineConfig {
    fn default() -> Self {
        EngineConfig {
            strategy: Strategy::Offload,
            cache_slots: 0,
            cache_options: CacheOptions::default(),
            max_streams: 1,
            max_context: 1024,
            threads: std::thread::available_parallelism()
                .map_or(1, |n| n.get().saturating_sub(1).max(1)),
            pool_wait: PoolWait::Spin,
            gpu_path: ActivationPath::Int8,
            cpu_path: ActivationPath::Int8,
            combine: CombineOrder::Fixed,
            gather: GatherMethod::CopyEngine,
            seed: 0,
            timeline: true,
            reserve_bytes: DEFAULT_RESERVE_BYTES,
            settings: EngineSettings::default(),
        }
    }
}

/// Memory an engine needs, bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct EngineMemory {
    /// The host bank (every expert of every layer), host memory.
    pub bank_bytes: u64,
    /// Expert slots (the cache, staging slots, layer split's resident layers), device
    /// memory.
    pub slot_bytes: u64,
    /// Dense weights and KV regions, device memory.
    pub dense_bytes: u64,
    /// Activation and output buffers, device memory.
    pub activation_bytes: u64,
    /// Pinned host staging for activations and CPU outputs.
    pub host_staging_bytes: u64,
}

impl EngineMemory {
    /// Device memory in all.
    pub fn device_bytes(&self) -> u64 {
        self.slot_bytes + self.dense_bytes + self.activation_bytes
    }

    /// Host memory in all (on the host-emulated device add [`EngineMemory::device_bytes`]).
    pub fn host_bytes(&self) -> u64 {
        self.bank_bytes + self.host_staging_bytes
    }
}

/// The slots of an engine's slot pool, in this order: the cache proper, staging slots for
/// experts the cache refuses, and layer split's resident layers (every expert of each GPU
/// layer in a slot of its own, loaded once; never looked up in the cache).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct SlotCounts {
    pub cache: usize,
    pub staging: usize,
    pub resident: usize,
}

impl SlotCounts {
    /// Every slot.
    pub fn total(&self) -> usize {
        self.cache + self.staging + self.resident
    }
}

/// Experts of one of layer split's resident layers that one GPU of `layout` holds in slots
/// of its own: its share under sharding (expert `e` on GPU `e % G`), every expert (a slice
/// each) under tensor parallelism and on one GPU.
fn resident_per_layer(layout: &GpuLayout, experts: usize) -> usize {
    match layout.placement {
        GpuPlacement::Sharded => experts.div_ceil(layout.count().max(1)),
        GpuPlacement::TensorParallel => experts,
    }
}

/// The place of expert `expert` among the [`resident_per_layer`] experts of a layer on the
/// GPU that holds it.
fn resident_index(layout: &GpuLayout, expert: usize) -> usize {
    match layout.placement {
        GpuPlacement::Sharded => expert / layout.count().max(1),
        GpuPlacement::TensorParallel => expert,
    }
}

/// The slots of each GPU of `layout` for a model and config.
pub(crate) fn slot_counts(
    model: &ModelSpec,
    config: &EngineConfig,
    layout: &GpuLayout,
) -> SlotCounts {
    let g = &model.geometry;
    let total = g.experts * g.moe_layers;
    let (cache, staging) = match config.strategy {
        Strategy::Resident => (total, 0),
        Strategy::LayerSplit { cpu_layers } => {
            // `auto` sizes as the most GPU layers (the engine refuses it unresolved).
            let n = match cpu_layers {
                CpuLayers::Fixed(n) => n.min(g.moe_layers),
                CpuLayers::Auto => 0,
            };
            return SlotCounts {
                cache: 0,
                staging: 0,
                resident: resident_per_layer(layout, g.experts) * (g.moe_layers - n),
            };
        }
        Strategy::Offload
        | Strategy::Hybrid { .. }
        | Strategy::Cpu
        | Strategy::LayerSplitCached { .. } => cache_and_staging(model, config),
    };
    SlotCounts {
        cache,
        staging,
        resident: 0,
    }
}

/// Slots of the cache proper and staging slots of a cached strategy.
fn cache_and_staging(model: &ModelSpec, config: &EngineConfig) -> (usize, usize) {
    let g = &model.geometry;
    // Experts one layer can route to at once: the most the plan may stage uncached.
    let union_max = g.experts.min(g.top_k * config.max_streams.max(1));
    let uses_link = config
        .strategy
        .fixed_fetch_fraction()
        .is_none_or(|f| f > 0.0);
    // A size the options cannot fit is refused when the cache is built.
    let slots = config
        .cache_options
        .fit_slots(config.cache_slots, g.moe_layers)
        .unwrap_or(config.cache_slots);
    let staging = if uses_link
        && (matches!(config.cache_options.policy, CachePolicy::StaticHot { .. })
            || slots
                / config
                    .cache_options
                    .topology
                    .partitions(g.moe_layers)
                    .max(1)
                < union_max)
    {
        union_max
    } else {
        0
    };
    (slots, staging)
}

/// Rows of the expert steps' inputs and outputs at `streams` streams.
fn max_rows(model: &ModelSpec, config: &EngineConfig) -> usize {
    match config.combine {
        CombineOrder::Fixed => model.geometry.top_k * config.max_streams,
        CombineOrder::Fast => config.max_streams,
    }
}

impl EngineMemory {
    /// What an engine for `model` with `config` allocates on one GPU.
    pub fn of(model: &ModelSpec, config: &EngineConfig) -> EngineMemory {
        EngineMemory::per_gpu(model, config, &GpuLayout::single())
    }

    /// What an engine for `model` with `config` allocates on each GPU of `layout`
    /// ([`GpuMemory::of`]: the same on every GPU), and in host memory: the bank of whole
    /// experts, under tensor parallelism on several GPUs each GPU's bank of slices too.
    pub fn per_gpu(model: &ModelSpec, config: &EngineConfig, layout: &GpuLayout) -> EngineMemory {
        let g = &model.geometry;
        let gpu = GpuMemory::of(model, config, layout);
        let whole = SlotPool::stride_for(model.expert_bytes()) as u64 * g.total_experts();
        let slices = if layout.is_multi() && layout.placement == GpuPlacement::TensorParallel {
            layout.count() as u64
                * SlotPool::stride_for(gpu.expert_bytes) as u64
                * g.total_experts()
        } else {
            0
        };
        let row = (g.hidden * F32_BYTES) as u64;
        let rows = max_rows(model, config) as u64;
        EngineMemory {
            bank_bytes: whole + slices,
            slot_bytes: gpu.slot_bytes,
            dense_bytes: gpu.dense_weight_bytes + gpu.kv_bytes + DENSE_OUT_BYTES as u64,
            activation_bytes: expert_activation_bytes(model, config),
            host_staging_bytes: (rows + config.max_streams as u64) * row,
        }
    }
}

/// Bytes of the expert steps' inputs and outputs on one GPU: act, y_hits, one y_fetched
/// per fetch chunk, y_cpu.
fn expert_activation_bytes(model: &ModelSpec, config: &EngineConfig) -> u64 {
    let row = (model.geometry.hidden * F32_BYTES) as u64;
    let rows = max_rows(model, config) as u64;
    (2 + MAX_FETCH_CHUNKS as u64) * rows * row + config.max_streams as u64 * row
}

/// One GPU's device memory as the engine places it on a [`GpuLayout`], bytes: its expert
/// slots (sharded, its share of layer split's resident layers; under tensor parallelism a
/// slice of every expert), the dense part (every GPU holds all of it) and the KV of every
/// stream, and the activation buffers. What `ft run --gpus N` reports for each GPU.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct GpuMemory {
    /// Slots of the expert cache proper.
    pub cache_slots: usize,
    /// Staging slots for misses the cache refuses.
    pub staging_slots: usize,
    /// Slots of layer split's resident layers held on this GPU.
    pub resident_slots: usize,
    /// Bytes of one expert as this GPU stores it (a slice under tensor parallelism).
    pub expert_bytes: u64,
    /// Every slot, bytes (each at the slot stride).
    pub slot_bytes: u64,
    /// The dense weights of every layer, bytes.
    pub dense_weight_bytes: u64,
    /// The KV regions of every stream at the longest context, bytes.
    pub kv_bytes: u64,
    /// Expert inputs and outputs, the CPU's rows and the dense kernels' output, bytes.
    pub activation_bytes: u64,
}

impl GpuMemory {
    /// What an engine for `model` with `config` allocates on each GPU of `layout`.
    pub fn of(model: &ModelSpec, config: &EngineConfig, layout: &GpuLayout) -> GpuMemory {
        let g = &model.geometry;
        let tp = layout.is_multi() && layout.placement == GpuPlacement::TensorParallel;
        // A split the geometry cannot take is refused when the engine is built; whole
        // experts bound its slices.
        let expert_bytes = match slice_geometry(model.format, g, layout.count()) {
            Ok(part) if tp => part.expert_bytes(model.format),
            _ => model.expert_bytes(),
        };
        let stride = SlotPool::stride_for(expert_bytes) as u64;
        let slots = slot_counts(model, config, layout);
        let dense = model.dense();
        let layers = g.moe_layers as u64;
        GpuMemory {
            cache_slots: slots.cache,
            staging_slots: slots.staging,
            resident_slots: slots.resident,
            expert_bytes,
            slot_bytes: stride * slots.total().max(1) as u64,
            dense_weight_bytes: layers * dense.weight_bytes_per_layer,
            kv_bytes: layers
                * config.max_streams as u64
                * config.max_context as u64
                * dense.kv_bytes_per_token,
            // The dense kernels' two outputs (the dense buffers' and the split part's).
            activation_bytes: expert_activation_bytes(model, config) + 2 * DENSE_OUT_BYTES as u64,
        }
    }

    /// Device memory in all.
    pub fn device_bytes(&self) -> u64 {
        self.slot_bytes + self.dense_weight_bytes + self.kv_bytes + self.activation_bytes
    }
}

/// A layer's fetched experts in chunks ([`LayerSchedule::fetch_chunk_bounds`]): the chunked pipeline of
/// the engine on every GPU. Chunk `c`'s gathers are followed by an event on the
/// copy stream, and its expert step waits for that event only and writes output rows of its
/// own, so that the GPU computes each chunk as soon as it has landed. A layer with nothing to
/// gather has no chunk to gather or compute.
pub(crate) struct FetchChunks<'a> {
    work: &'a work::LayerWork,
    /// The cache's slots the chunks are gathered into and computed from.
    slots: &'a SlotPool,
    bounds: Vec<std::ops::Range<usize>>,
    /// The last chunk's launch gated on this flag, set by the copy stream after the last
    /// chunk's copies, instead of waiting for its event ([`Engine::gates_last_chunk`]);
    /// none where the layer gathers nothing.
    gate: Option<FlagGate<'a>>,
}

impl<'a> FetchChunks<'a> {
    /// The chunks of `work`'s fetched experts into and from `slots`, the layer's
    /// `schedule`'s ([`LayerSchedule::fetch_chunk_bounds`]: at most the engine's
    /// `fetch_chunks`, halving from the last); the last one's launch gated on `gate` where
    /// given and the layer gathers.
    pub fn of(
        work: &'a work::LayerWork,
        slots: &'a SlotPool,
        schedule: &LayerSchedule,
        gate: Option<FlagGate<'a>>,
    ) -> Self {
        FetchChunks {
            work,
            slots,
            bounds: schedule.fetch_chunk_bounds(work.moves.len() as f64),
            gate: gate.filter(|_| !work.moves.is_empty()),
        }
    }

    /// The gate of chunk `c`'s launch: the last chunk's, where the layer has one.
    fn gate_of(&self, c: usize) -> Option<&FlagGate<'a>> {
        self.gate.as_ref().filter(|_| c + 1 == self.len())
    }

    /// How many chunks (at least 1, at most [`MAX_FETCH_CHUNKS`]).
    pub fn len(&self) -> usize {
        self.bounds.len()
    }

    /// Queue chunk `c`'s gathers on `copy`, then (the last chunk, gated) set its flag, then
    /// record `landed` after them.
    pub fn gather(
        &self,
        c: usize,
        copy: &Stream,
        bank: &HostBank,
        method: GatherMethod,
        landed: &Event,
    ) -> Result<()> {
        let moves = &self.work.moves[self.bounds[c].clone()];
        gather::gather(copy, bank, self.slots, moves, method)?;
        if let Some(gate) = self.gate_of(c) {
            copy.write_flag(gate)?;
        }
        copy.record(landed)
    }

    /// Chunk `c`'s part of the layer's fetched step.
    fn chunk_step(&self, c: usize) -> std::borrow::Cow<'_, ExpertStep> {
        if self.len() == 1 {
            std::borrow::Cow::Borrowed(&self.work.fetched)
        } else {
            std::borrow::Cow::Owned(self.work.fetched.part(self.bounds[c].clone()))
        }
    }

    /// Queue chunk `c`'s expert step on `compute`:
    /// it writes `out` and, where the layer gathers, starts after `landed` (the last chunk,
    /// gated: its work waits for the flag on the device instead); with `combine`, the
    /// layer's combine follows it in the same launch.
    pub fn compute_chunk(
        &self,
        c: usize,
        compute: &Stream,
        act: &DeviceBuffer,
        out: &DeviceBuffer,
        landed: &Event,
        combine: Option<&LayerCombine<'_>>,
    ) -> Result<()> {
        let (step, slots) = (self.chunk_step(c), self.slots.buffer());
        if let Some(gate) = self.gate_of(c) {
            return compute.launch_experts_gated(&step, slots, act, out, combine, gate);
        }
        if !self.work.moves.is_empty() {
            compute.wait(landed)?;
        }
        match combine {
            Some(cb) => compute.launch_experts_then_combine(&step, slots, act, out, cb),
            None => compute.launch_experts(&step, slots, act, out),
        }
    }
}

/// The part of a layer's GPU submission that its CPU share does not wait for: the fetched
/// chunks' gathers not yet queued (copy stream), the experts' input rows, the dense part
/// after the router, the hits' kernel and the fetched experts' kernels (a chunk each), with
/// their timing events, queued in that order one item at a time
/// ([`LayerRest::submit_next`]). In a layer with a CPU share the host queues them while it
/// waits for the activations and then beside the CPU share, instead of before the wait, so
/// that the share starts as soon as the activations are down.
struct LayerRest<'a> {
    compute: &'a Stream,
    copy: &'a Stream,
    bank: &'a HostBank,
    gather: GatherMethod,
    slots: &'a SlotPool,
    act: &'a DeviceBuffer,
    y_hits: &'a DeviceBuffer,
    y_fetched: &'a [DeviceBuffer],
    dense_out: &'a DeviceBuffer,
    ev: &'a LayerEvents,
    /// The layer's fetched chunks, and through them its work (the hits' step).
    fetch: &'a FetchChunks<'a>,
    /// Chunks whose gathers are queued (the first ones, in order).
    gathered: usize,
    /// The copies that replicate the first block of rows into the experts' input rows
    /// (`replicate_rounds`; none for the fast combine order), then the input event.
    replicate: &'a [(usize, usize, usize)],
    /// f32 per block of rows.
    block: usize,
    inputs_queued: bool,
    post: &'a [DenseRead<'a>],
    /// The rows the CPU's rows are read into, zeroed where no expert step of the layer
    /// writes them (a layer of this GPU without hits or a gather, fixed combine order): the
    /// round trip's destination, zeroed where a fetched chunk's step would have run.
    zero_cpu_rows: Option<&'a DeviceBuffer>,
    /// The layer's combine, folded into the last fetched chunk's launch here.
    fold: Option<LayerCombine<'a>>,
    /// The next item: 0 the post-router dense part, 1 the hits, 2 + c fetched chunk `c` (or
    /// the CPU rows' zeroing), then the fetched event.
    next: usize,
    clock: crate::device::Clock,
    /// When the first item was queued (device clock, us): the GPU cannot start it before.
    first_queued_us: f64,
    /// The GPU it is for and the layer's record of issued operations ([`LayerOps`]).
    gpu: u32,
    issued: &'a std::cell::RefCell<Vec<(OpKind, u32)>>,
}

impl LayerRest<'_> {
    /// Record that operation `kind` of this GPU was issued.
    fn issued(&self, kind: OpKind) {
        self.issued.borrow_mut().push((kind, self.gpu));
    }

    /// Whether the layer gathers (the schedule's `Gather` and fetched chunks).
    fn links(&self) -> bool {
        !self.fetch.work.moves.is_empty()
    }

    /// Queue the next chunk's gathers on the copy stream (which waits for the router
    /// already); false when every chunk is queued or the layer gathers nothing.
    fn gather_next(&mut self) -> Result<bool> {
        let chunks = self.fetch.len();
        if self.gathered >= chunks || !self.links() {
            return Ok(false);
        }
        let c = self.gathered;
        if c == 0 {
            self.issued(OpKind::Gather);
        }
        self.fetch.gather(
            c,
            self.copy,
            self.bank,
            self.gather,
            self.ev.chunk_gathered(c, chunks),
        )?;
        self.gathered += 1;
        Ok(true)
    }

    /// Queue the experts' input rows (the first block replicated, for the fixed combine
    /// order) and their event, once.
    fn queue_inputs(&mut self) -> Result<()> {
        if self.inputs_queued {
            return Ok(());
        }
        for &(src, dst, n) in self.replicate {
            self.compute.copy_d2d(
                self.act,
                src * self.block * F32_BYTES,
                self.act,
                dst * self.block * F32_BYTES,
                n * self.block * F32_BYTES,
            )?;
        }
        self.compute.record(&self.ev.input)?;
        self.inputs_queued = true;
        Ok(())
    }

    /// Queue the next item (the gathers left, the input rows, then the GPU work); false
    /// when everything is queued.
    fn submit_next(&mut self) -> Result<bool> {
        if self.gather_next()? {
            return Ok(true);
        }
        if !self.inputs_queued {
            self.queue_inputs()?;
            return Ok(true);
        }
        let chunks = self.fetch.len();
        let fetched_items = match (self.links(), self.zero_cpu_rows) {
            (true, _) => chunks,
            (false, Some(_)) => 1,
            (false, None) => 0,
        };
        let ev = self.ev;
        match self.next {
            0 => {
                self.first_queued_us = self.clock.now_us();
                if !self.post.is_empty() {
                    self.compute.launch_dense(self.post, self.dense_out)?;
                }
                ev.record_timing(self.compute, &ev.post)?;
            }
            1 => {
                // The schedule's `Hits`: a layer without hits launches nothing (the combine
                // sums the output rows that were written).
                if !self.fetch.work.hits.experts.is_empty() {
                    self.issued(OpKind::Hits);
                    self.compute.launch_experts(
                        &self.fetch.work.hits,
                        self.slots.buffer(),
                        self.act,
                        self.y_hits,
                    )?;
                }
                ev.record_timing(self.compute, &ev.hits)?;
            }
            i if i < 2 + fetched_items && !self.links() => {
                if let Some(rows) = self.zero_cpu_rows {
                    self.compute.memset_zero(
                        rows,
                        0,
                        self.fetch.work.fetched.tokens * self.fetch.work.fetched.hidden * F32_BYTES,
                    )?;
                }
            }
            i if i < 2 + fetched_items => {
                let c = i - 2;
                if c + 1 < chunks {
                    if c == 0 {
                        self.issued(OpKind::FetchedEarly);
                    }
                } else {
                    if self.fetch.gate.is_some() {
                        self.issued(OpKind::LastLaunch);
                    }
                    self.issued(OpKind::LastChunk);
                }
                self.fetch.compute_chunk(
                    c,
                    self.compute,
                    self.act,
                    &self.y_fetched[c],
                    ev.chunk_gathered(c, chunks),
                    self.fold.as_ref().filter(|_| c + 1 == chunks),
                )?;
            }
            i if i == 2 + fetched_items => ev.record_timing(self.compute, &ev.fetched)?,
            _ => return Ok(false),
        }
        self.next += 1;
        Ok(true)
    }

    /// Queue everything left.
    fn submit_all(&mut self) -> Result<()> {
        while self.submit_next()? {}
        Ok(())
    }
}

/// One step's inputs.
#[derive(Debug, Clone, Copy)]
pub struct StepInput<'a> {
    /// Routing of every layer, `[layer][stream]`.
    pub routing: &'a ft_model::routing::StepRouting,
    /// Context length of each stream, tokens.
    pub contexts: &'a [usize],
    /// Input vector of each stream (`hidden` f32 each).
    pub inputs: &'a [Vec<f32>],
    /// A warm-up step (left out of summaries).
    pub warmup: bool,
}

/// What a step produced.
#[derive(Debug, Clone)]
pub struct StepResult {
    /// Counts and busy times per layer (counts summed over the GPUs; the times and spans
    /// are GPU 0's).
    pub record: StepRecord,
    /// The step's spans (for a trace).
    pub spans: Vec<Span>,
    /// The final hidden vector of each stream (every GPU holds the same).
    pub outputs: StepOutputs,
    /// What each GPU did.
    pub gpus: Vec<GpuStep>,
    /// Time of the peer combines, summed over layers, us (0 on one GPU): host-measured for
    /// the host method (its downloads wait for the layer's expert work on every GPU), GPU
    /// 0's events around the all-reduce for NCCL (0 when `timeline` is off).
    pub combine_us: f64,
    /// Each layer's schedule and the operations issued for it.
    pub ops: Vec<LayerOps>,
}

/// One layer's schedule and the operations the engine issued for it, in the order it
/// issued them (each the call that performs it: see the module docs).
#[derive(Debug, Clone, PartialEq)]
pub struct LayerOps {
    /// The layer's schedule, built from every GPU's plan.
    pub schedule: LayerSchedule,
    /// (operation, GPU), in issue order.
    pub issued: Vec<(OpKind, u32)>,
}

impl LayerOps {
    /// Check that the engine issued exactly the schedule's operations (the same (kind,
    /// GPU) pairs, each once) in an order that respects every dependency; the error says
    /// what differs.
    pub fn check(&self) -> std::result::Result<(), String> {
        let ops = &self.schedule.ops;
        let mut at = vec![None; ops.len()];
        for (i, &(kind, gpu)) in self.issued.iter().enumerate() {
            let j = ops
                .iter()
                .enumerate()
                .position(|(j, o)| o.kind == kind && o.gpu == gpu && at[j].is_none())
                .ok_or_else(|| {
                    format!(
                        "issued {kind:?} on GPU {gpu}, which the schedule does not hold (again)"
                    )
                })?;
            at[j] = Some(i);
        }
        for (j, op) in ops.iter().enumerate() {
            let Some(i) = at[j] else {
                return Err(format!("{:?} on GPU {} was never issued", op.kind, op.gpu));
            };
            if let Some(&d) = op.after.iter().find(|&&d| at[d].is_none_or(|id| id > i)) {
                return Err(format!(
                    "{:?} on GPU {} was issued before {:?} on GPU {}, which it waits for",
                    op.kind, op.gpu, ops[d].kind, ops[d].gpu
                ));
            }
        }
        Ok(())
    }
}

/// Everything one GPU owns: the device-side state of its share of every layer.
struct GpuPart {
    device: Device,
    /// The bank this GPU gathers from (`None`: the shared whole bank; its slices under
    /// tensor parallelism on several GPUs).
    slice_bank: Option<HostBank>,
    slots: SlotPool,
    dense: DenseBuffers,
    /// Where the dense kernel folds what it reads ([`DENSE_OUT_BYTES`]).
    dense_out: DeviceBuffer,
    /// The flag the last fetched chunk's launch is gated on, one u32, where the schedule
    /// gates it (one GPU) and the device can ([`Engine::gates_last_chunk`]).
    gate_flag: Option<DeviceBuffer>,
    compute: Stream,
    copy: Stream,
    act_stream: Stream,
    /// Expert inputs `[rows][hidden]`; block 0 (the first `streams` rows) is the residual
    /// stream itself.
    act: DeviceBuffer,
    /// Hits' outputs, `[rows][hidden]`.
    y_hits: DeviceBuffer,
    /// Fetched misses' outputs, `[rows][hidden]` each, one buffer per chunk of the layer's
    /// fetched experts ([`LayerSchedule::fetch_chunk_bounds`]); in fixed order the CPU's rows go
    /// to the first.
    y_fetched: Vec<DeviceBuffer>,
    /// The CPU's outputs in fast order, `[streams][hidden]`.
    y_cpu: DeviceBuffer,
    /// The layer events (timing events on GPU 0 with a timeline).
    events: Vec<LayerEvents>,
    /// Template of the expert steps (a slice's shape under tensor parallelism).
    template: ExpertStep,
    /// Events around each layer's all-reduce (GPU 0, NCCL, timeline on).
    combine_ev: Vec<(Event, Event)>,
}

/// The host side of one GPU's CPU share: its pool and staging (apart from [`GpuPart`] so
/// that the shares of several GPUs run on their own threads while the device parts stay
/// with the host thread).
struct CpuPart {
    exec: Option<CpuExecutor>,
    /// Its workers among all ([`GpuLayout::cpu_workers`]).
    workers: std::ops::Range<usize>,
    /// The layer's activations, downloaded for the CPU, `[streams][hidden]`.
    x_host: HostBuffer,
    /// The CPU's output rows, read by the device, `[rows][hidden]`.
    y_host: HostBuffer,
    /// The CPU's input rows in fixed order (one per pair).
    cpu_x: Vec<f32>,
}

/// The decode engine for G >= 1 GPUs (see the module docs).
pub struct Engine {
    model: ModelSpec,
    config: EngineConfig,
    layout: GpuLayout,
    /// Each layer's placement ([`Strategy::policy`]).
    placement: PlacementPolicy,
    /// The cached layers' fetch fraction ([`PlacementPolicy::fetch_fraction`]).
    fetch: f64,
    alpha: f32,
    popularity: Option<Vec<f64>>,
    /// Whole experts: the gathers' source (one GPU, sharded) and the CPU kernels'.
    bank: HostBank,
    /// Slots of each GPU (the same for every GPU).
    slot_counts: SlotCounts,
    gpus: Vec<GpuPart>,
    cpus: Vec<CpuPart>,
    /// Each GPU's expert cache.
    caches: Vec<ExpertCache>,
    /// The value the last gated layer of each GPU waited for (each gated layer the next).
    gate_values: Vec<u32>,
    combiner: Combiner,
    /// Host scratch of the host combine (the running sum), f32.
    sum: Vec<f32>,
    /// Bytes of each layer's dense weights read after the router (the shared experts).
    dense_post_bytes: usize,
    /// Recorded on GPU 0's idle compute stream at each step's start, with timing: it places
    /// the step's device events on the host's clock ([`Event::timeline_us_from`]).
    anchor: Event,
    /// The copies that replicate the first block of rows into the experts' input rows
    /// (`replicate_rounds` of top-k; none for the fast combine order), the same every layer.
    input_copies: Vec<(usize, usize, usize)>,
    steps_run: u64,
}

impl std::fmt::Debug for Engine {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Engine")
            .field("model", &self.model.name)
            .field("strategy", &self.config.strategy)
            .field("gpus", &self.layout.gpus)
            .field("placement", &self.layout.placement)
            .field("device", &self.gpus[0].device.info().name)
            .field("cache_slots", &self.slot_counts.cache)
            .field("staging_slots", &self.slot_counts.staging)
            .field("combine", &self.combiner.method())
            .finish()
    }
}

/// View the first `n` f32 values of a host buffer (page-aligned, so f32-aligned).
fn host_f32(buf: &HostBuffer, n: usize) -> Result<&[f32]> {
    let bytes = buf.as_slice().get(..n * F32_BYTES).ok_or_else(|| {
        RuntimeError::invalid(
            "host staging",
            format!("{n} f32 do not fit {} bytes", buf.len()),
        )
    })?;
    // SAFETY: any bit pattern is a valid f32; alignment is checked through the prefix.
    let (pre, vals, _) = unsafe { bytes.align_to::<f32>() };
    if !pre.is_empty() {
        return Err(RuntimeError::invalid("host staging", "not 4-byte aligned"));
    }
    Ok(vals)
}

/// Mutable twin of [`host_f32`].
fn host_f32_mut(buf: &mut HostBuffer, n: usize) -> Result<&mut [f32]> {
    let len = buf.len();
    let bytes = buf.as_mut_slice().get_mut(..n * F32_BYTES).ok_or_else(|| {
        RuntimeError::invalid("host staging", format!("{n} f32 do not fit {len} bytes"))
    })?;
    // SAFETY: as in `host_f32`.
    let (pre, vals, _) = unsafe { bytes.align_to_mut::<f32>() };
    if !pre.is_empty() {
        return Err(RuntimeError::invalid("host staging", "not 4-byte aligned"));
    }
    Ok(vals)
}

/// Split a layer's dense reads at the router: (before, after). The dense weights' last
/// `post_bytes` (the shared experts) are read after; everything else (attention, router,
/// KV) before.
fn split_dense<'a>(
    reads: Vec<DenseRead<'a>>,
    post_bytes: usize,
) -> (Vec<DenseRead<'a>>, Vec<DenseRead<'a>>) {
    let mut pre = reads;
    let mut post = Vec::new();
    if post_bytes > 0 && !pre.is_empty() {
        let w = pre[0];
        let cut = post_bytes.min(w.bytes);
        pre[0].bytes = w.bytes - cut;
        post.push(DenseRead {
            buffer: w.buffer,
            offset: w.offset + w.bytes - cut,
            bytes: cut,
        });
        if pre[0].bytes == 0 {
            pre.remove(0);
        }
    }
    (pre, post)
}

/// Check a step's input against the engine it is for (the streams it was built for, the
/// routing against the geometry, one context and one input of `hidden` values per stream,
/// contexts within the KV it holds); the streams of the step.
pub(crate) fn check_step_input(
    model: &ModelSpec,
    config: &EngineConfig,
    input: &StepInput<'_>,
) -> Result<usize> {
    let g = &model.geometry;
    let b = input.routing.streams();
    if b == 0 || b > config.max_streams {
        return Err(RuntimeError::invalid(
            "step streams",
            format!(
                "{b} streams; the engine was built for 1 to {}",
                config.max_streams
            ),
        ));
    }
    input
        .routing
        .validate(g, &format!("step {} routing", input.routing.step))?;
    if input.contexts.len() != b || input.inputs.len() != b {
        return Err(RuntimeError::invalid(
            "step input",
            format!(
                "{b} streams of routing, {} context lengths, {} input vectors",
                input.contexts.len(),
                input.inputs.len()
            ),
        ));
    }
    for (s, v) in input.inputs.iter().enumerate() {
        if v.len() != g.hidden {
            return Err(RuntimeError::invalid(
                "step input",
                format!(
                    "stream {s}'s input has {} values, hidden is {}",
                    v.len(),
                    g.hidden
                ),
            ));
        }
    }
    if let Some((s, &c)) = input
        .contexts
        .iter()
        .enumerate()
        .find(|(_, &c)| c > config.max_context)
    {
        return Err(RuntimeError::invalid(
            "--context",
            format!(
                "stream {s} is at {c} tokens; the engine holds KV for {}",
                config.max_context
            ),
        ));
    }
    Ok(b)
}

/// The out-of-memory error of a strategy whose experts are held in slots of their own
/// (resident, layer split), with the layers that would fit; `None` for the others.
fn resident_oom(
    model: &ModelSpec,
    config: &EngineConfig,
    placement: &PlacementPolicy,
    per_layer_experts: usize,
    available: u64,
) -> Option<RuntimeError> {
    let g = model.geometry;
    let expert_bytes = model.expert_bytes();
    let per_layer = SlotPool::stride_for(expert_bytes) as u64 * per_layer_experts as u64;
    match config.strategy.kind() {
        StrategyKind::LayerSplit => {
            let fit = ((available / per_layer.max(1)) as usize).min(g.moe_layers);
            Some(RuntimeError::OutOfMemory {
                what: format!(
                    "{} ({} resident layers x {per_layer_experts} experts of {expert_bytes} \
                     bytes)",
                    config.strategy,
                    g.moe_layers - placement.cpu_layers,
                ),
                requested: per_layer * (g.moe_layers - placement.cpu_layers) as u64,
                available,
                hint: format!(
                    "; {fit} of the {} layers' experts fit: put the others on the CPU with \
                     --strategy layer-split:{}",
                    g.moe_layers,
                    g.moe_layers - fit
                ),
            })
        }
        StrategyKind::Resident => {
            let fit = available / per_layer.max(1);
            Some(RuntimeError::OutOfMemory {
                what: format!(
                    "the resident strategy ({} layers x {} experts of {expert_bytes} bytes)",
                    g.moe_layers, g.experts
                ),
                requested: per_layer * g.moe_layers as u64,
                available,
                hint: format!(
                    "; {} of the {} layers would fit: run fewer layers of the same geometry \
                     with --layers {}",
                    fit,
                    g.moe_layers,
                    fit.max(1)
                ),
            })
        }
        StrategyKind::Offload
        | StrategyKind::Hybrid
        | StrategyKind::Cpu
        | StrategyKind::LayerSplitCached => None,
    }
}

/// Whether a placement computes experts on the CPU: a CPU-only layer, or cached layers
/// that gather less than every miss.
fn uses_cpu(placement: &PlacementPolicy, layers: usize) -> bool {
    let cached_cpu = placement.cpu_layers < layers
        && match placement.rest {
            LayerPlacement::Cached { fetch_fraction } => fetch_fraction < 1.0,
            LayerPlacement::Resident | LayerPlacement::CpuOnly => false,
        };
    placement.cpu_layers > 0 || cached_cpu
}

impl Engine {
    /// Build an engine for `model` on one `device`: fill the host bank from `config.seed`,
    /// allocate the cache slots, dense buffers and activations, and load what the strategy
    /// keeps resident (every expert for `resident`, the hot set for a static-hot cache, which
    /// needs `popularity` when the policy names no hot set, layer split's GPU layers).
    pub fn new(
        device: &Device,
        model: &ModelSpec,
        config: &EngineConfig,
        popularity: Option<Vec<f64>>,
    ) -> Result<Engine> {
        Engine::with_bank_source(
            device,
            model,
            config,
            popularity,
            BankSource::Seed(config.seed),
        )
    }

    /// [`Engine::new`] with the expert weights taken from `source`: synthetic from a seed,
    /// or a safetensors checkpoint (its accepted tensor names are in [`crate::bank`]'s docs;
    /// `model` gives the geometry and format the file must hold). The bank is filled after
    /// the device memory is reserved, so a cache the device cannot hold fails fast.
    pub fn with_bank_source(
        device: &Device,
        model: &ModelSpec,
        config: &EngineConfig,
        popularity: Option<Vec<f64>>,
        source: BankSource<'_>,
    ) -> Result<Engine> {
        Engine::on_gpus(
            std::slice::from_ref(device),
            GpuLayout::single(),
            model,
            config,
            popularity,
            source,
        )
    }

    /// Build an engine over `devices`, one per GPU of `layout` (opened with
    /// [`Device::open_group`]; one device and [`GpuLayout::single`] is [`Engine::new`]).
    /// `config.cache_slots` is the slots of each GPU's cache (a slice each under tensor
    /// parallelism: [`GpuLayout::slots_per_gpu`] turns a byte budget into it) and
    /// `config.threads` the CPU workers of all GPUs together; `popularity` (a static hot
    /// set's) is over every expert, each GPU taking the ones it holds. Errors: a device
    /// count other than `layout.gpus`, a tensor-parallel split the geometry cannot take,
    /// fewer CPU workers than GPUs for a strategy with a CPU share, memory a GPU cannot
    /// hold (naming the layers that fit for resident and layer split), and a config no
    /// engine runs ([`EngineConfig::check`]).
    pub fn on_gpus(
        devices: &[Device],
        layout: GpuLayout,
        model: &ModelSpec,
        config: &EngineConfig,
        popularity: Option<Vec<f64>>,
        source: BankSource<'_>,
    ) -> Result<Engine> {
        model.validate()?;
        let g = model.geometry;
        let n = layout.count();
        if n == 0 || devices.len() != n {
            return Err(RuntimeError::invalid(
                "--gpus",
                format!(
                    "the layout has {n} GPUs, {} devices were opened",
                    devices.len()
                ),
            ));
        }
        config.check(model)?;
        let placement = resolve_policy(&config.strategy, g.moe_layers)?;
        let kind = config.strategy.kind();
        let multi = layout.is_multi();
        let tp = multi && layout.placement == GpuPlacement::TensorParallel;
        let part_geometry = if tp {
            let pg = slice_geometry(model.format, &g, n)?;
            if devices[0].kind() == DeviceKind::Cuda && !pg.intermediate.is_multiple_of(32) {
                return Err(RuntimeError::invalid(
                    "--placement tensor-parallel",
                    format!(
                        "a slice of {} intermediate columns over {n} GPUs is {}, not a multiple \
                         of 32 (the CUDA expert kernel's tile)",
                        g.intermediate, pg.intermediate
                    ),
                ));
            }
            pg
        } else {
            g
        };
        if multi && uses_cpu(&placement, g.moe_layers) {
            if let Some(gpu) =
                (0..n as u32).find(|&i| layout.cpu_workers(i, config.threads).is_empty())
            {
                return Err(RuntimeError::invalid(
                    "--threads",
                    format!(
                        "{} CPU workers cannot serve {n} GPUs' CPU shares (GPU {gpu} would get \
                         none); give at least {n}",
                        config.threads
                    ),
                ));
            }
        }
        let counts = slot_counts(model, config, &layout);
        let expert_bytes = part_geometry.expert_bytes(model.format);

        // The slots come first (a cache the devices cannot hold fails before the bank is
        // filled); keep room for the engine's other device buffers too.
        let planned = EngineMemory::per_gpu(model, config, &layout);
        let reserve = config.reserve_bytes + planned.dense_bytes + planned.activation_bytes;
        let mut slot_pools = Vec::with_capacity(n);
        for device in devices {
            match SlotPool::new(device, expert_bytes, counts.total().max(1), reserve) {
                Ok(s) => slot_pools.push(s),
                Err(RuntimeError::OutOfMemory {
                    what,
                    requested,
                    available,
                    hint,
                }) => {
                    let per_layer = match kind {
                        StrategyKind::LayerSplit => resident_per_layer(&layout, g.experts),
                        _ => g.experts,
                    };
                    return Err(
                        resident_oom(model, config, &placement, per_layer, available).unwrap_or(
                            RuntimeError::OutOfMemory {
                                what,
                                requested,
                                available,
                                hint,
                            },
                        ),
                    );
                }
                Err(e) => return Err(e),
            }
        }
        let bank = match source {
            BankSource::Seed(seed) => HostBank::from_seed(&devices[0], model.format, &g, seed)?,
            BankSource::Safetensors(path) => {
                HostBank::from_safetensors(&devices[0], model.format, &g, path)?
            }
        };
        let dense_post_bytes = (2 * g.shared_experts as u64 * g.expert_params())
            .min(model.dense().weight_bytes_per_layer) as usize;
        let row = g.hidden * F32_BYTES;
        let rows = max_rows(model, config);
        let mut gpus = Vec::with_capacity(n);
        let mut cpus = Vec::with_capacity(n);
        let mut caches = Vec::with_capacity(n);
        for (i, (device, slots)) in devices.iter().zip(slot_pools).enumerate() {
            let slice_bank = if tp {
                Some(bank.tensor_parallel_slice(device, n, i)?)
            } else {
                None
            };
            // The gate is the schedule's on one GPU (`LayerSchedule::gated_last_chunk`),
            // where the device can: copy-engine gathers (a zero-copy gather's kernel needs
            // the multiprocessors the waiting blocks hold) and stream flag writes.
            let gates =
                !multi && config.gather == GatherMethod::CopyEngine && device.supports_flag_gates();
            if !multi && !gates {
                tracing::debug!(
                    gather = %config.gather,
                    flag_writes = device.supports_flag_gates(),
                    "the last fetched chunk waits for its copies' event (no gate: zero-copy gathers or no stream flag writes)"
                );
            }
            let gate_flag = gates.then(|| device.alloc(4, "gate flag")).transpose()?;
            let compute = device.new_stream("compute")?;
            // The gate's flag starts below every value a layer waits for (the first is 1),
            // before any launch on another stream reads it.
            if let Some(flag) = &gate_flag {
                compute.memset_zero(flag, 0, 4)?;
                compute.synchronize()?;
            }
            // Timing events on GPU 0 only: its layers give the step's timeline.
            let timing = config.timeline && i == 0;
            let events = (0..g.moe_layers)
                .map(|_| LayerEvents::new(device, timing, MAX_FETCH_CHUNKS - 1))
                .collect::<Result<Vec<_>>>()?;
            let combine_ev = if multi && timing {
                (0..g.moe_layers)
                    .map(|_| Ok((device.new_event(true)?, device.new_event(true)?)))
                    .collect::<Result<Vec<_>>>()?
            } else {
                Vec::new()
            };
            let template = ExpertStep::new(model.format, &part_geometry, config.gpu_path, 0);
            device.warm_up_kernels(&[&template])?;
            let pop = match (&popularity, multi) {
                (Some(p), true) => Some(layout.popularity_on(i as u32, p, g.experts)),
                (p, _) => p.clone(),
            };
            caches.push(
                config
                    .cache_options
                    .build(kind, &g, counts.cache, pop.as_deref())?,
            );
            gpus.push(GpuPart {
                device: device.clone(),
                slice_bank,
                slots,
                dense: DenseBuffers::new(
                    device,
                    &model.dense(),
                    g.moe_layers,
                    config.max_streams,
                    config.max_context,
                )?,
                dense_out: device.alloc(DENSE_OUT_BYTES, "dense output")?,
                gate_flag,
                compute,
                copy: device.new_stream("copy")?,
                act_stream: device.new_stream("activations")?,
                act: device.alloc(rows * row, "expert inputs")?,
                y_hits: device.alloc(rows * row, "hit experts' outputs")?,
                y_fetched: (0..MAX_FETCH_CHUNKS)
                    .map(|_| device.alloc(rows * row, "fetched experts' outputs"))
                    .collect::<Result<Vec<_>>>()?,
                y_cpu: device.alloc(config.max_streams * row, "CPU experts' outputs")?,
                events,
                template,
                combine_ev,
            });
            cpus.push(CpuPart {
                exec: None,
                workers: layout.cpu_workers(i as u32, config.threads),
                x_host: device.alloc_host(config.max_streams * row, "activations for the CPU")?,
                y_host: device.alloc_host(rows * row, "CPU experts' output rows")?,
                cpu_x: Vec::new(),
            });
        }
        let anchor = devices[0].new_event(config.timeline)?;
        let mut engine = Engine {
            model: model.clone(),
            config: config.clone(),
            layout,
            placement,
            fetch: placement.fetch_fraction(),
            alpha: residual_scale(g.moe_layers),
            popularity,
            bank,
            slot_counts: counts,
            gpus,
            cpus,
            caches,
            gate_values: vec![0; n],
            combiner: Combiner::open(devices, layout),
            sum: Vec::new(),
            dense_post_bytes,
            anchor,
            input_copies: if config.combine == CombineOrder::Fixed {
                replicate_rounds(g.top_k)
            } else {
                Vec::new()
            },
            steps_run: 0,
        };
        engine.ensure_executors()?;
        engine.load_resident()?;
        Ok(engine)
    }

    /// Create each GPU's CPU executor (its workers) if the strategy computes anything on
    /// the CPU.
    fn ensure_executors(&mut self) -> Result<()> {
        if !uses_cpu(&self.placement, self.model.geometry.moe_layers) {
            return Ok(());
        }
        for c in &mut self.cpus {
            if c.exec.is_none() {
                c.exec = Some(CpuExecutor::new(
                    c.workers.len().max(1),
                    self.config.pool_wait,
                )?);
            }
        }
        Ok(())
    }

    /// Copy every expert each cache holds (resident, a static hot set) and every expert of
    /// layer split's resident layers a GPU holds into its slot.
    fn load_resident(&mut self) -> Result<()> {
        let g = self.model.geometry;
        let layout = self.layout;
        let base = self.slot_counts.cache + self.slot_counts.staging;
        let per_layer = resident_per_layer(&layout, g.experts);
        for (gpu, (p, cache)) in self.gpus.iter().zip(&self.caches).enumerate() {
            let bank = p.slice_bank.as_ref().unwrap_or(&self.bank);
            let mut moves: Vec<_> = cache.resident().map(|(slot, id)| (id, slot)).collect();
            if self.slot_counts.resident > 0 {
                for l in self.placement.cpu_layers..g.moe_layers {
                    let first = base + (l - self.placement.cpu_layers) * per_layer;
                    moves.extend(
                        (0..g.experts)
                            .filter(|&e| layout.holds(gpu as u32, e as u32))
                            .map(|e| {
                                let slot = first + resident_index(&layout, e);
                                (ExpertId::new(l, e), SlotId(slot as u32))
                            }),
                    );
                }
            }
            let regions = gather::regions(bank, &p.slots, &moves)?;
            if !regions.is_empty() {
                p.copy
                    .copy_h2d_regions(bank.buffer(), p.slots.buffer(), &regions)?;
                p.copy.synchronize()?;
            }
        }
        Ok(())
    }

    /// Forget the caches' history: empty caches (or the resident / hot sets again), as a
    /// freshly started engine has, without refilling the bank.
    pub fn reset_cache(&mut self) -> Result<()> {
        let g = self.model.geometry;
        for (i, p) in self.gpus.iter().enumerate() {
            p.device.synchronize()?;
            let pop = match (&self.popularity, self.layout.is_multi()) {
                (Some(pop), true) => Some(self.layout.popularity_on(i as u32, pop, g.experts)),
                (pop, _) => pop.clone(),
            };
            self.caches[i] = self.config.cache_options.build(
                self.config.strategy.kind(),
                &g,
                self.slot_counts.cache,
                pop.as_deref(),
            )?;
        }
        self.load_resident()
    }

    /// Switch to another strategy with the same slots, starting from an empty cache.
    /// Switching to or from `resident` (another cache size) or between layer splits of
    /// different resident layers is refused.
    pub fn set_strategy(&mut self, strategy: Strategy) -> Result<()> {
        let (old, new) = (self.config.strategy.kind(), strategy.kind());
        let new_config = EngineConfig {
            strategy,
            ..self.config.clone()
        };
        let resident = slot_counts(&self.model, &new_config, &self.layout).resident;
        if (old == StrategyKind::Resident) != (new == StrategyKind::Resident)
            || resident != self.slot_counts.resident
        {
            return Err(RuntimeError::invalid(
                "strategy",
                format!("cannot switch an engine from {} to {strategy}: the resident slots differ; build a new engine", self.config.strategy),
            ));
        }
        let layers = self.model.geometry.moe_layers;
        let placement = resolve_policy(&strategy, layers)?;
        let gathers = placement.cpu_layers < layers
            && match placement.rest {
                LayerPlacement::Cached { fetch_fraction } => fetch_fraction > 0.0,
                LayerPlacement::Resident | LayerPlacement::CpuOnly => false,
            };
        if gathers && self.slot_counts.staging == 0 && self.slot_counts.cache < self.union_max() {
            return Err(RuntimeError::invalid(
                "strategy",
                format!(
                    "{strategy} needs staging slots this engine (built for {}) lacks",
                    self.config.strategy
                ),
            ));
        }
        if self.layout.is_multi() && uses_cpu(&placement, layers) {
            let n = self.layout.count();
            if self.cpus.iter().any(|c| c.workers.is_empty()) {
                return Err(RuntimeError::invalid(
                    "--threads",
                    format!(
                        "{} CPU workers cannot serve {n} GPUs' CPU shares; give at least {n}",
                        self.config.threads
                    ),
                ));
            }
        }
        self.config.strategy = strategy;
        self.placement = placement;
        self.fetch = placement.fetch_fraction();
        self.ensure_executors()?;
        self.reset_cache()
    }

    /// Compute the CPU share on `threads` threads from now on, split over the GPUs as at
    /// build time (new executors; the caches and everything else stay). The probe
    /// calibrates the serving slowdown at a second count this way without filling a second
    /// bank.
    pub fn set_threads(&mut self, threads: usize) -> Result<()> {
        if threads < self.layout.count() {
            return Err(RuntimeError::invalid(
                "--threads",
                format!(
                    "the CPU pools of {} GPU(s) need at least {} thread(s)",
                    self.layout.count(),
                    self.layout.count()
                ),
            ));
        }
        if threads != self.config.threads {
            self.config.threads = threads;
            for (i, c) in self.cpus.iter_mut().enumerate() {
                c.exec = None;
                c.workers = self.layout.cpu_workers(i as u32, threads);
            }
            self.ensure_executors()?;
        }
        Ok(())
    }

    /// Threads computing the CPU share (of all GPUs together).
    pub fn threads(&self) -> usize {
        self.config.threads
    }

    fn union_max(&self) -> usize {
        let g = &self.model.geometry;
        g.experts.min(g.top_k * self.config.max_streams)
    }

    /// Measure GPU 0's link's linear host-to-device bandwidth in this engine's conditions:
    /// the median over `reps` of one contiguous copy of up to `max_bytes` from the bank into
    /// the slot memory, GB/s (1e9 B/s). The slots' contents are lost, so the caches are
    /// reset (and their resident sets reloaded) afterwards.
    pub fn measure_linear_h2d_gbs(&mut self, max_bytes: usize, reps: usize) -> Result<f64> {
        let p = &self.gpus[0];
        let bytes = max_bytes
            .min(self.bank.buffer().len())
            .min(p.slots.buffer().len());
        if bytes == 0 || reps == 0 {
            return Err(RuntimeError::invalid("linear H2D probe", "nothing to copy"));
        }
        let (e0, e1) = (p.device.new_event(true)?, p.device.new_event(true)?);
        let mut us = Vec::with_capacity(reps);
        // One copy first (page faults, first-touch).
        p.copy
            .copy_h2d(self.bank.buffer(), 0, p.slots.buffer(), 0, bytes)?;
        p.copy.synchronize()?;
        for _ in 0..reps {
            p.copy.record(&e0)?;
            p.copy
                .copy_h2d(self.bank.buffer(), 0, p.slots.buffer(), 0, bytes)?;
            p.copy.record(&e1)?;
            e1.synchronize()?;
            us.push(e0.elapsed_us(&e1)?);
        }
        us.sort_by(f64::total_cmp);
        let median = us[us.len() / 2];
        self.reset_cache()?;
        Ok(bytes as f64 / (median * 1e3))
    }

    /// The model (its `moe_layers` is the number of layers run).
    pub fn model(&self) -> &ModelSpec {
        &self.model
    }

    /// Whether a layer's last fetched chunk is gated on a flag: where the schedule gates it
    /// (one GPU) and the device can (copy-engine gathers, stream flag writes).
    pub fn gates_last_chunk(&self) -> bool {
        self.gpus[0].gate_flag.is_some()
    }

    /// The configuration it runs.
    pub fn config(&self) -> &EngineConfig {
        &self.config
    }

    /// The GPUs and the placement of experts over them.
    pub fn layout(&self) -> GpuLayout {
        self.layout
    }

    /// The strategy.
    pub fn strategy(&self) -> Strategy {
        self.config.strategy
    }

    /// The fetch fraction the cached layers' plans use.
    pub fn fetch_fraction(&self) -> f64 {
        self.fetch
    }

    /// Each layer's placement.
    pub fn placement(&self) -> PlacementPolicy {
        self.placement
    }

    /// Slots of each GPU holding layer split's resident layers.
    pub fn resident_slots(&self) -> usize {
        self.slot_counts.resident
    }

    /// GPU 0's device.
    pub fn device(&self) -> &Device {
        &self.gpus[0].device
    }

    /// GPU `gpu`'s device.
    pub fn device_of(&self, gpu: usize) -> Option<&Device> {
        self.gpus.get(gpu).map(|p| &p.device)
    }

    /// GPU 0's expert cache (its counters and contents).
    pub fn cache(&self) -> &ExpertCache {
        &self.caches[0]
    }

    /// GPU `gpu`'s expert cache.
    pub fn cache_of(&self, gpu: usize) -> Option<&ExpertCache> {
        self.caches.get(gpu)
    }

    /// The host bank of whole experts.
    pub fn bank(&self) -> &HostBank {
        &self.bank
    }

    /// Slots of each GPU's cache proper.
    pub fn cache_slots(&self) -> usize {
        self.slot_counts.cache
    }

    /// Staging slots of each GPU for experts the cache refuses.
    pub fn staging_slots(&self) -> usize {
        self.slot_counts.staging
    }

    /// Bytes of one expert as each GPU stores and gathers it (a slice under tensor
    /// parallelism).
    pub fn expert_bytes_per_gpu(&self) -> usize {
        self.gpus[0].slots.expert_bytes()
    }

    /// The CPU worker range of each GPU's pool ([`GpuLayout::cpu_workers`]); the ranges of
    /// a strategy without a CPU share are still reported.
    pub fn cpu_workers(&self) -> Vec<std::ops::Range<usize>> {
        self.cpus.iter().map(|c| c.workers.clone()).collect()
    }

    /// Threads of each GPU's CPU pool (0: no pool).
    pub fn pool_threads(&self) -> Vec<usize> {
        self.cpus
            .iter()
            .map(|c| c.exec.as_ref().map_or(0, |e| e.threads()))
            .collect()
    }

    /// How the GPUs' partial outputs are combined.
    pub fn combine_method(&self) -> CombineMethod {
        self.combiner.method()
    }

    /// Time the CPU check ([`crate::cpu_check::measure`]) on this engine's bank with GPU 0's
    /// serving threads: on its executor where it has one, else on a pool of the same
    /// threads and wait policy built for the check; `start` picks where in the bank it
    /// starts (a different place each call reads different weights).
    pub fn cpu_check(&mut self, budget: std::time::Duration, start: usize) -> Result<CpuCheck> {
        let path = self.config.cpu_path;
        let c = &mut self.cpus[0];
        match c.exec.as_mut() {
            Some(exec) => crate::cpu_check::measure(exec, &self.bank, path, budget, start),
            None => crate::cpu_check::measure_on(
                c.workers.len().max(1),
                self.config.pool_wait,
                &self.bank,
                path,
                budget,
                start,
            ),
        }
    }

    /// GPU 0's CPU executor, if the strategy uses the CPU.
    pub fn cpu_executor(&mut self) -> Option<&mut CpuExecutor> {
        self.cpus[0].exec.as_mut()
    }

    /// Steps run since the engine was built.
    pub fn steps_run(&self) -> u64 {
        self.steps_run
    }

    /// The router-weight scale ([`residual_scale`]).
    pub fn weight_scale(&self) -> f32 {
        self.alpha
    }

    fn check_input(&self, input: &StepInput<'_>) -> Result<usize> {
        check_step_input(&self.model, &self.config, input)
    }

    /// Run one decode step on every GPU (see the module docs) and return its record, spans,
    /// outputs, each GPU's counts and each layer's issued operations.
    pub fn step(&mut self, input: &StepInput<'_>) -> Result<StepResult> {
        let b = self.check_input(input)?;
        let geo = self.model.geometry;
        let (h, k, layers) = (geo.hidden, geo.top_k, geo.moe_layers);
        let n = self.layout.count();
        let rows = Rows {
            order: self.config.combine,
            streams: b,
            top_k: k,
        };
        let block = b * h; // f32 per block of rows
        let n_rows = rows.count();
        let row_bytes = h * F32_BYTES;
        let clock = self.gpus[0].device.clock();
        let step_index = self.steps_run;
        self.steps_run += 1;

        for c in &mut self.cpus {
            if let Some(e) = c.exec.as_mut() {
                e.begin_step();
            }
        }
        let t0 = clock.now_us();
        // The previous step ended with its output's download, so every stream is idle: the
        // anchor completes a few microseconds after `t0`.
        if self.config.timeline {
            self.gpus[0].compute.record(&self.anchor)?;
        }
        let mut tl = StepTimeline::new(step_index, input.warmup, b, layers, ns_of_us(t0));
        let mut marks = vec![LayerMarks::default(); layers];
        let mut stats = vec![GpuStep::default(); n];
        let mut layer_ops = Vec::with_capacity(layers);
        let mut combine_us = 0.0;
        let combine_bytes = self.layout.combine_bytes_per_gpu(n_rows, h);
        let flat: Vec<f32> = input.inputs.concat();
        for p in &self.gpus {
            p.compute.upload_f32(&flat, &p.act, 0)?;
        }

        // A layer planned ahead, while the host waited for the previous layer's activations
        // (one GPU).
        let mut ahead: Option<Planned> = None;
        // The planner borrows the caches for the whole step; the layers in flight borrow
        // the other fields.
        let mut planner = Planner {
            caches: &mut self.caches,
            layout: self.layout,
            settings: self.config.settings,
            placement: self.placement,
            resident_base: self.slot_counts.cache + self.slot_counts.staging,
            experts: geo.experts,
            cx: self
                .gpus
                .iter()
                .map(|p| BuildContext {
                    rows,
                    slots: &p.slots,
                    cache_slots: self.slot_counts.cache,
                    staging_slots: self.slot_counts.staging,
                    weight_scale: self.alpha,
                    template: &p.template,
                    hidden: h,
                })
                .collect(),
        };
        for (l, m) in marks.iter_mut().enumerate() {
            m.submit_start = clock.now_us();
            let issued = std::cell::RefCell::new(Vec::with_capacity(16));
            let record = |kind: OpKind, gpu: usize| issued.borrow_mut().push((kind, gpu as u32));
            // Dense, up to the router, queued before the layer is planned: it needs no plan,
            // and where the GPU has caught up with the host (a step's first layer) the
            // planning then runs beside it instead of before it.
            let mut posts = Vec::with_capacity(n);
            for (g, p) in self.gpus.iter().enumerate() {
                let reads = p.dense.reads(l, input.contexts)?;
                let (pre, post) = split_dense(reads, self.dense_post_bytes);
                if g == 0 {
                    m.post = !post.is_empty();
                    m.dense_submit = clock.now_us();
                }
                if !pre.is_empty() {
                    p.compute.launch_dense(&pre, &p.dense_out)?;
                }
                record(OpKind::Dense, g);
                p.compute.record(&p.events[l].router)?;
                posts.push(post);
            }
            // Issue: the plan of every GPU's share and the layer's schedule.
            let Planned { works, schedule } = match ahead.take() {
                Some(w) => w,
                None => planner.plan(l, input)?,
            };
            let has = |g: usize, kind: OpKind| {
                schedule
                    .ops
                    .iter()
                    .any(|o| o.kind == kind && o.gpu as usize == g)
            };
            let link: Vec<bool> = (0..n).map(|g| has(g, OpKind::Gather)).collect();
            let cpu: Vec<bool> = (0..n).map(|g| has(g, OpKind::CpuShare)).collect();
            let peer = has(0, OpKind::PeerCombine);
            for (g, &c) in cpu.iter().enumerate() {
                if c {
                    record(OpKind::Issue, g);
                }
            }
            let mut total = works[0].counts;
            for (g, w) in works.iter().enumerate() {
                stats[g].counts.add_layer(&w.counts);
                stats[g].counts.combine_bytes += combine_bytes;
                if g > 0 {
                    add_counts(&mut total, &w.counts);
                }
            }
            tl.set_counts(l, total);
            let w0 = &works[0];
            m.link = link[0];
            m.cpu = cpu[0];
            m.hit_experts = w0.hits.experts.len() as u32;
            m.link_experts = w0.fetched.experts.len() as u32;
            m.cpu_experts = w0.cpu.experts.len() as u32;
            m.gather_bytes = w0.counts.gathered_bytes;
            m.cpu_rows_bytes = (w0.cpu.rows() * row_bytes) as u64;
            m.down_bytes = (b * row_bytes) as u64;

            // Gather, in chunks of experts: each chunk's copies are followed by an event, so
            // that the GPU computes a chunk as soon as it has landed and only the last
            // chunk's kernel follows the last copy; where the schedule gates the last chunk
            // (one GPU), its launch waits for a flag the copy stream sets instead.
            let mut fetches = Vec::with_capacity(n);
            for (g, (p, work)) in self.gpus.iter().zip(&works).enumerate() {
                let gate = p
                    .gate_flag
                    .as_ref()
                    .filter(|_| schedule.gated_last_chunk && link[g])
                    .map(|flag| {
                        self.gate_values[g] = self.gate_values[g].wrapping_add(1);
                        FlagGate {
                            flag,
                            offset: 0,
                            value: self.gate_values[g],
                        }
                    });
                fetches.push(FetchChunks::of(work, &p.slots, &schedule, gate));
            }
            // The rest of the dense part and the experts: queued now, or on one GPU with a
            // CPU share while the host waits for the activations and beside the CPU share
            // (the CPU share does not wait for them).
            // The output rows each GPU's experts write this layer, summed by the combine in
            // this order: the hits', each fetched chunk's, then the CPU's (fast order; in
            // fixed order the CPU's rows go into rows of the first fetched chunk's, else of
            // the hits', else of the first chunk's buffer zeroed for them).
            let hits: Vec<bool> = works.iter().map(|w| !w.hits.experts.is_empty()).collect();
            let zero_cpu_rows: Vec<bool> = (0..n)
                .map(|g| cpu[g] && rows.order == CombineOrder::Fixed && !link[g] && !hits[g])
                .collect();
            let parts: Vec<Vec<&DeviceBuffer>> = self
                .gpus
                .iter()
                .zip(&fetches)
                .enumerate()
                .map(|(g, (p, f))| {
                    let mut v = Vec::with_capacity(MAX_FETCH_CHUNKS + 2);
                    if hits[g] {
                        v.push(&p.y_hits);
                    }
                    if link[g] {
                        v.extend(&p.y_fetched[..f.len()]);
                    }
                    if zero_cpu_rows[g] {
                        v.push(&p.y_fetched[0]);
                    }
                    if cpu[g] && rows.order == CombineOrder::Fast {
                        v.push(&p.y_cpu);
                    }
                    v
                })
                .collect();
            // Combine (folded where the schedule folds it: one GPU, a fetched chunk, no CPU
            // share): the layer's sum follows the last fetched chunk's kernel inside its
            // launch ([`Stream::launch_experts_then_combine`]).
            let fold = (schedule.folded_combine && rows.order == CombineOrder::Fixed).then(|| {
                LayerCombine {
                    act: &self.gpus[0].act,
                    parts: parts[0][0],
                    more: &parts[0][1..],
                    block,
                    k,
                }
            });
            let mut rests: Vec<LayerRest<'_>> = Vec::with_capacity(n);
            for (g, p) in self.gpus.iter().enumerate() {
                rests.push(LayerRest {
                    compute: &p.compute,
                    copy: &p.copy,
                    bank: p.slice_bank.as_ref().unwrap_or(&self.bank),
                    gather: self.config.gather,
                    slots: &p.slots,
                    act: &p.act,
                    y_hits: &p.y_hits,
                    y_fetched: &p.y_fetched,
                    dense_out: &p.dense_out,
                    ev: &p.events[l],
                    fetch: &fetches[g],
                    gathered: 0,
                    replicate: &self.input_copies,
                    block,
                    inputs_queued: false,
                    post: &posts[g],
                    zero_cpu_rows: zero_cpu_rows[g].then_some(&p.y_fetched[0]),
                    fold: if g == 0 { fold } else { None },
                    next: 0,
                    clock,
                    first_queued_us: 0.0,
                    gpu: g as u32,
                    issued: &issued,
                });
            }
            // The activations' copy down for the CPU share (their own stream: not behind
            // the gathers), queued first, behind the router alone (the share reads the first
            // block of rows, which the experts' input rows only copy from); the gathers
            // after the first chunk and the input rows wait in the rest. So the share starts
            // about as soon as the router has run instead of a dozen host calls later
            // (experiments/runtime-grid, "The copy down queued first in a hybrid layer").
            m.down_after_router = cpu[0];
            for (g, rest) in rests.iter_mut().enumerate() {
                let p = &self.gpus[g];
                let ev = &p.events[l];
                if cpu[g] {
                    p.act_stream.wait(&ev.router)?;
                    p.act_stream
                        .copy_d2h(&p.act, 0, &self.cpus[g].x_host, 0, block * F32_BYTES)?;
                    p.act_stream.record(&ev.down)?;
                }
                if link[g] {
                    p.copy.wait(&ev.router)?;
                    rest.gather_next()?;
                }
                if !cpu[g] || peer {
                    // Nothing on this GPU waits for the host (or, on several GPUs, every
                    // GPU's work goes in before the shares): the input rows, the remaining
                    // chunks' gathers before any other call, so that the link never waits
                    // for the host, then the rest.
                    rest.queue_inputs()?;
                    while rest.gather_next()? {}
                    rest.submit_all()?;
                }
            }
            m.submit_end = clock.now_us();

            // CpuShare and RoundTrip: the layer's host round trips.
            if !peer && cpu[0] {
                // One GPU: plan the next layer while the activations come down (host work
                // off the critical path; the plans run in layer order all the same).
                let plan_next = l + 1 < layers;
                let rest = &mut rests[0];
                let ev = &self.gpus[0].events[l];
                m.wait_start = clock.now_us();
                // Whatever is not queued or planned yet while the activations come down, the
                // rest beside the CPU share.
                while !ev.down.is_complete()? {
                    if rest.submit_next()? {
                        continue;
                    }
                    if plan_next && ahead.is_none() {
                        ahead = Some(planner.plan(l + 1, input)?);
                        continue;
                    }
                    std::hint::spin_loop();
                }
                m.wait_end = clock.now_us();
                let mut beside_result: Result<()> = Ok(());
                let mut beside = || {
                    beside_result = rest.submit_all().and_then(|()| {
                        if plan_next && ahead.is_none() {
                            ahead = Some(planner.plan(l + 1, input)?);
                        }
                        Ok(())
                    });
                };
                record(OpKind::CpuShare, 0);
                let c = &mut self.cpus[0];
                run_cpu(
                    CpuSide {
                        exec: c.exec.as_mut(),
                        bank: &self.bank,
                        model: &self.model,
                        path: self.config.cpu_path,
                        x_host: &c.x_host,
                        y_host: &mut c.y_host,
                        cpu_x: &mut c.cpu_x,
                    },
                    &works[0],
                    rows,
                    &mut beside,
                )?;
                beside_result?;
                m.cpu_end = clock.now_us();
                stats[0].cpu_us += m.cpu_end - m.wait_end;
            } else if cpu.iter().any(|&c| c) {
                // Several GPUs: every GPU's share at once, each on its own pool.
                m.wait_start = clock.now_us();
                for (g, p) in self.gpus.iter().enumerate() {
                    if cpu[g] {
                        while !p.events[l].down.is_complete()? {
                            std::hint::spin_loop();
                        }
                    }
                }
                m.wait_end = clock.now_us();
                for (g, &c) in cpu.iter().enumerate() {
                    if c {
                        record(OpKind::CpuShare, g);
                    }
                }
                let times = run_cpu_shares(
                    &mut self.cpus,
                    &works,
                    &cpu,
                    CpuShared {
                        bank: &self.bank,
                        model: &self.model,
                        path: self.config.cpu_path,
                        clock,
                    },
                    rows,
                )?;
                for (s, t) in stats.iter_mut().zip(times) {
                    s.cpu_us += t;
                }
                m.cpu_end = clock.now_us();
            }
            // The CPU's rows read into the GPU's (the end of the round trip).
            for (g, p) in self.gpus.iter().enumerate() {
                if cpu[g] {
                    let dst = match rows.order {
                        CombineOrder::Fixed if hits[g] && !link[g] => &p.y_hits,
                        CombineOrder::Fixed => &p.y_fetched[0],
                        CombineOrder::Fast => &p.y_cpu,
                    };
                    p.compute
                        .gather_zero_copy(&self.cpus[g].y_host, dst, &works[g].cpu.scatter)?;
                    record(OpKind::RoundTrip, g);
                    if g == 0 {
                        let ev = &p.events[l];
                        ev.record_timing(&p.compute, &ev.merged)?;
                        m.merge_end = clock.now_us();
                    }
                }
            }
            m.rest_submit = rests[0].first_queued_us;
            drop(rests);

            // Combine: in a fixed order, added to the residual stream (done already where
            // folded into the last chunk's launch); on several GPUs each GPU's rows summed
            // first, then over the GPUs (PeerCombine), then the tree on identical rows.
            // Every GPU's written rows are summed onto its first (`parts`).
            if !peer {
                let p = &self.gpus[0];
                match (rows.order, parts[0].split_first()) {
                    _ if fold.is_some() => {}
                    // No routed expert on this GPU: nothing to add.
                    (_, None) => {}
                    // One launch: the other rows onto the first's, the tree, the residual
                    // add.
                    (CombineOrder::Fixed, Some((first, more))) => {
                        p.compute.combine_fixed(&p.act, first, more, block, k)?
                    }
                    (CombineOrder::Fast, Some((first, more))) => {
                        for part in more {
                            p.compute.add_f32(first, 0, part, 0, block)?;
                        }
                        p.compute.add_f32(&p.act, 0, first, 0, block)?;
                    }
                }
                if cpu[0] {
                    record(OpKind::Combine, 0);
                }
            } else {
                let mut sums: Vec<(&Stream, &DeviceBuffer)> = Vec::with_capacity(n);
                for (g, p) in self.gpus.iter().enumerate() {
                    match parts[g].split_first() {
                        Some((first, more)) => {
                            for part in more {
                                p.compute.add_f32(first, 0, part, 0, n_rows * h)?;
                            }
                            sums.push((&p.compute, first));
                        }
                        // A GPU with no routed expert this layer adds zeros to the peer
                        // combine.
                        None => {
                            p.compute
                                .memset_zero(&p.y_hits, 0, n_rows * h * F32_BYTES)?;
                            sums.push((&p.compute, &p.y_hits));
                        }
                    }
                    if cpu[g] {
                        record(OpKind::Combine, g);
                    }
                }
                combine_us += self.combiner.combine(
                    &sums,
                    n_rows * h,
                    &mut self.sum,
                    self.gpus[0].combine_ev.get(l),
                    clock,
                )?;
                record(OpKind::PeerCombine, 0);
                for (p, &(stream, sum)) in self.gpus.iter().zip(&sums) {
                    match rows.order {
                        CombineOrder::Fixed => stream.combine_fixed(&p.act, sum, &[], block, k)?,
                        CombineOrder::Fast => stream.add_f32(&p.act, 0, sum, 0, block)?,
                    }
                }
            }
            let p0 = &self.gpus[0];
            p0.events[l].record_timing(&p0.compute, &p0.events[l].done)?;
            record(OpKind::Residual, 0);
            m.layer_end_submit = clock.now_us();
            layer_ops.push(LayerOps {
                schedule,
                issued: issued.into_inner(),
            });
        }

        let out_wait = clock.now_us();
        let p0 = &self.gpus[0];
        let flat = p0.compute.download_f32(&p0.act, 0, block)?;
        for p in &self.gpus[1..] {
            p.compute.synchronize()?;
        }
        let t_end = clock.now_us();
        for c in &mut self.cpus {
            if let Some(e) = c.exec.as_mut() {
                e.end_step();
            }
        }
        if self.combiner.method() == CombineMethod::Nccl {
            for (a, z) in &self.gpus[0].combine_ev {
                combine_us += a.elapsed_us(z)?;
            }
        }
        let outputs: StepOutputs = flat.chunks_exact(h).map(|c| c.to_vec()).collect();
        timeline::add_spans(
            &mut tl,
            &marks,
            &self.gpus[0].events,
            self.config.timeline.then_some(&self.anchor),
            t0,
            (out_wait, t_end),
        )?;
        let (record, spans) = tl.finish(ns_of_us(t_end));
        Ok(StepResult {
            record,
            spans,
            outputs,
            gpus: stats,
            combine_us,
            ops: layer_ops,
        })
    }
}

/// Add one GPU's layer counts to another's.
fn add_counts(total: &mut crate::instrument::LayerCounts, c: &crate::instrument::LayerCounts) {
    total.hits += c.hits;
    total.misses += c.misses;
    total.fetched += c.fetched;
    total.cpu += c.cpu;
    total.gpu_tokens += c.gpu_tokens;
    total.cpu_tokens += c.cpu_tokens;
    total.gathered_bytes += c.gathered_bytes;
}

/// A layer's plan on every GPU and its schedule.
struct Planned {
    works: Vec<work::LayerWork>,
    schedule: LayerSchedule,
}

/// What planning a layer borrows from the engine (the caches, mutably; the slots and the
/// kernel templates): split from the engine so that the host can plan the next layer while
/// other fields are borrowed by the layer in flight.
struct Planner<'a> {
    caches: &'a mut [ExpertCache],
    layout: GpuLayout,
    /// The engine's settings, an input of every layer's schedule.
    settings: EngineSettings,
    placement: PlacementPolicy,
    /// The first slot of layer split's resident layers ([`SlotCounts`]).
    resident_base: usize,
    /// Experts per layer.
    experts: usize,
    /// Each GPU's.
    cx: Vec<BuildContext<'a>>,
}

impl Planner<'_> {
    /// Plan layer `l` on every GPU as its placement says (updating each GPU's cache where
    /// it is cached, with the routes the GPU holds, [`GpuLayout::routes_on`]) and turn the
    /// plans into device work; a resident layer's experts are in their own slots. The
    /// output rows keep each expert's top-k position in the layer's full routes, so that
    /// every GPU writes the rows one GPU would and the fixed-order tree sums them in the
    /// same order. The schedule is built from the GPUs' plans as the model builds it
    /// (under tensor parallelism the one plan, its CPU experts dealt out by
    /// [`GpuLayout::computes_cpu_expert`], as each GPU's work here is).
    fn plan(&mut self, l: usize, input: &StepInput<'_>) -> Result<Planned> {
        let routes = &input.routing.layers[l];
        let placement = self.placement.layer(l);
        let n = self.layout.count();
        let multi = self.layout.is_multi();
        let tp = multi && self.layout.placement == GpuPlacement::TensorParallel;
        let per_layer = resident_per_layer(&self.layout, self.experts);
        let mut works = Vec::with_capacity(n);
        let mut counts = Vec::with_capacity(n);
        for (g, cache) in self.caches.iter_mut().enumerate() {
            let mine: Vec<TokenRoute>;
            let on_gpu: &[TokenRoute] = if multi && !tp {
                mine = self.layout.routes_on(g as u32, routes);
                &mine
            } else {
                routes
            };
            let mut plan = plan_layer_placed(l, on_gpu, cache, placement);
            let misses = plan.misses() as u32;
            match placement {
                LayerPlacement::Resident => {
                    let first = self.resident_base + (l - self.placement.cpu_layers) * per_layer;
                    for h in &mut plan.hits {
                        let e = resident_index(&self.layout, h.id.expert as usize);
                        h.slot = Some(SlotId((first + e) as u32));
                    }
                }
                LayerPlacement::Cached { .. } | LayerPlacement::CpuOnly => {}
            }
            // The schedule's counts are of the plan; under tensor parallelism it deals the
            // CPU experts out as this GPU computes them.
            counts.push(PlanCounts::of_plan(&plan));
            if tp {
                // Every GPU planned the same CPU experts; this GPU computes its dealt share.
                plan.cpu = std::mem::take(&mut plan.cpu)
                    .into_iter()
                    .enumerate()
                    .filter(|(i, _)| self.layout.computes_cpu_expert(g as u32, *i))
                    .map(|(_, w)| w)
                    .collect();
            }
            let mut work = build_layer(&plan, routes, &self.cx[g])?;
            // The cache's misses, whoever computes them (tensor parallelism deals CPU
            // experts out).
            work.counts.misses = misses;
            works.push(work);
        }
        Ok(Planned {
            schedule: LayerSchedule::new(&self.layout, &self.settings, &counts),
            works,
        })
    }
}

/// What every GPU's CPU share reads.
#[derive(Clone, Copy)]
struct CpuShared<'a> {
    bank: &'a HostBank,
    model: &'a ModelSpec,
    path: ActivationPath,
    clock: crate::device::Clock,
}

/// Run the CPU shares of the GPUs marked in `cpu` (their activations are down), each on its
/// own pool, from one host thread per GPU with a share (the calling thread when only one
/// has any); each GPU's host time of its share, us.
fn run_cpu_shares(
    cpus: &mut [CpuPart],
    works: &[work::LayerWork],
    cpu: &[bool],
    shared: CpuShared<'_>,
    rows: Rows,
) -> Result<Vec<f64>> {
    let one = |c: &mut CpuPart, work: &work::LayerWork| -> Result<f64> {
        let t = shared.clock.now_us();
        run_cpu(
            CpuSide {
                exec: c.exec.as_mut(),
                bank: shared.bank,
                model: shared.model,
                path: shared.path,
                x_host: &c.x_host,
                y_host: &mut c.y_host,
                cpu_x: &mut c.cpu_x,
            },
            work,
            rows,
            // Every GPU's work is queued before any CPU share starts.
            &mut || {},
        )?;
        Ok(shared.clock.now_us() - t)
    };
    let mut times = vec![0.0; works.len()];
    let with: Vec<usize> = (0..works.len()).filter(|&g| cpu[g]).collect();
    if with.len() == 1 {
        let g = with[0];
        times[g] = one(&mut cpus[g], &works[g])?;
        return Ok(times);
    }
    let results: Vec<(usize, Result<f64>)> = std::thread::scope(|s| {
        let handles: Vec<_> = cpus
            .iter_mut()
            .enumerate()
            .filter(|(g, _)| cpu[*g])
            .map(|(g, c)| {
                let (work, one) = (&works[g], &one);
                (g, s.spawn(move || one(c, work)))
            })
            .collect();
        handles
            .into_iter()
            .map(|(g, h)| {
                let r = h.join().unwrap_or_else(|_| {
                    Err(RuntimeError::invalid(
                        "CPU share",
                        format!("GPU {g}'s CPU thread panicked"),
                    ))
                });
                (g, r)
            })
            .collect()
    });
    for (g, r) in results {
        times[g] = r?;
    }
    Ok(times)
}

/// What the CPU share of a layer borrows from the engine.
struct CpuSide<'a> {
    exec: Option<&'a mut CpuExecutor>,
    bank: &'a HostBank,
    model: &'a ModelSpec,
    path: ActivationPath,
    x_host: &'a HostBuffer,
    y_host: &'a mut HostBuffer,
    cpu_x: &'a mut Vec<f32>,
}

/// Compute a layer's CPU share into the host output rows, running `beside` on the host
/// thread while the pool computes ([`CpuExecutor::run_layer_beside`]). A share that fails
/// before it reaches the pool fails the step without running `beside`.
fn run_cpu(
    side: CpuSide<'_>,
    work: &work::LayerWork,
    rows: Rows,
    beside: &mut dyn FnMut(),
) -> Result<()> {
    let h = side.model.geometry.hidden;
    let cpu_rows = work.cpu.rows();
    let x_all = host_f32(side.x_host, rows.streams * h)?;
    let x: &[f32] = match rows.order {
        CombineOrder::Fast => x_all,
        CombineOrder::Fixed => {
            side.cpu_x.clear();
            side.cpu_x.reserve(cpu_rows * h);
            for &s in &work.cpu.x_streams {
                let s = s as usize;
                side.cpu_x.extend_from_slice(&x_all[s * h..(s + 1) * h]);
            }
            side.cpu_x
        }
    };
    let y = host_f32_mut(side.y_host, cpu_rows * h)?;
    y.fill(0.0);
    let experts = work
        .cpu
        .experts
        .iter()
        .zip(&work.cpu.tokens)
        .map(|(&id, tokens)| {
            Ok(ExpertWork {
                weights: side.bank.expert(id)?,
                tokens,
            })
        })
        .collect::<Result<Vec<_>>>()?;
    let exec = side.exec.ok_or_else(|| {
        RuntimeError::invalid(
            "engine",
            "a CPU share was planned but no CPU executor exists",
        )
    })?;
    exec.run_layer_beside(
        side.model.format,
        &side.model.geometry,
        side.path,
        &experts,
        x,
        y,
        beside,
    )?;
    Ok(())
}

/// Each layer's placement under `strategy` for a model of `layers` MoE layers; an `auto`
/// (hybrid's fraction, layer split's N) is an error naming its flag until the performance
/// model resolves it.
pub fn resolve_policy(strategy: &Strategy, layers: usize) -> Result<PlacementPolicy> {
    match strategy {
        Strategy::Hybrid { .. } => {
            resolve_fetch(strategy)?;
        }
        Strategy::LayerSplit { cpu_layers } | Strategy::LayerSplitCached { cpu_layers } => {
            match cpu_layers {
                CpuLayers::Auto => {
                    return Err(RuntimeError::invalid(
                        "--strategy",
                        format!(
                            "{}'s 'auto' number of CPU layers must be resolved before the engine \
                             plans; give {}:N",
                            strategy.kind(),
                            strategy.kind()
                        ),
                    ))
                }
                CpuLayers::Fixed(n) if *n > layers => {
                    return Err(RuntimeError::invalid(
                        "--strategy",
                        format!("{strategy}: {n} CPU layers asked of a run of {layers} MoE layers"),
                    ))
                }
                CpuLayers::Fixed(_) => {}
            }
        }
        Strategy::Offload | Strategy::Resident | Strategy::Cpu => {}
    }
    strategy
        .policy(layers)
        .map_err(|e| RuntimeError::invalid("--strategy", e.to_string()))
}

/// The fetch fraction a strategy plans with; `auto` is an error until the performance model
/// can resolve it.
pub fn resolve_fetch(strategy: &Strategy) -> Result<f64> {
    fetch_fraction(strategy).map_err(|_| {
        RuntimeError::invalid(
            "--fetch-fraction",
            "'auto' must be resolved to a number before the engine plans (ft run does it with \
             the performance model of --host); give a number between 0 and 1",
        )
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_bad_step_input_is_refused_naming_what_is_wrong() {
        let model = ModelSpec::preset("qwen3.8-flash-next")
            .unwrap()
            .with_layers(2);
        let config = EngineConfig {
            max_streams: 2,
            max_context: 64,
            ..EngineConfig::default()
        };
        let mut src = ft_model::routing::resolve("typical", &model.geometry, Some(1)).unwrap();
        let routing = decode::draw_routing(src.as_mut(), 2, 1).unwrap().remove(0);
        let h = model.geometry.hidden;
        let inputs = vec![vec![0.0f32; h]; 2];
        let check = |contexts: &[usize], inputs: &[Vec<f32>]| {
            check_step_input(
                &model,
                &config,
                &StepInput {
                    routing: &routing,
                    contexts,
                    inputs,
                    warmup: false,
                },
            )
        };
        assert_eq!(check(&[8, 8], &inputs).unwrap(), 2);
        let err = |r: Result<usize>| r.unwrap_err().to_string();
        assert!(err(check(&[8], &inputs)).contains("1 context lengths"));
        let short = vec![vec![0.0f32; h], vec![0.0f32; h - 1]];
        assert!(err(check(&[8, 8], &short)).contains("stream 1's input"));
        assert!(err(check(&[8, 65], &inputs)).contains("--context"));
        let small = EngineConfig {
            max_streams: 1,
            ..config.clone()
        };
        let e = check_step_input(
            &model,
            &small,
            &StepInput {
                routing: &routing,
                contexts: &[8, 8],
                inputs: &inputs,
                warmup: false,
            },
        );
        assert!(err(e).contains("built for 1 to 1"));
    }

    /// The check refuses an issued operation the schedule does not hold (an empty hits
    /// launch is one: a layer without hits has no `Hits`), one issued twice, one never
    /// issued, and one issued before an operation it waits for.
    #[test]
    fn the_ops_check_refuses_whatever_the_schedule_does_not_say() {
        use OpKind::*;
        let counts = PlanCounts {
            hits: 0.0,
            hit_tokens: 0.0,
            fetched: 1.0,
            fetched_tokens: 1.0,
            cpu: 0.0,
            cpu_tokens: 0.0,
        };
        let schedule =
            LayerSchedule::new(&GpuLayout::single(), &EngineSettings::default(), &[counts]);
        let ops = |issued: &[OpKind]| LayerOps {
            schedule: schedule.clone(),
            issued: issued.iter().map(|&k| (k, 0)).collect(),
        };
        let exact = [Dense, Gather, LastLaunch, LastChunk, Residual];
        assert_eq!(ops(&exact).check(), Ok(()));
        let err = |issued: &[OpKind]| ops(issued).check().unwrap_err();
        let empty_hits = [Dense, Hits, Gather, LastLaunch, LastChunk, Residual];
        assert!(err(&empty_hits).contains("Hits"), "{}", err(&empty_hits));
        let twice = [Dense, Gather, Gather, LastLaunch, LastChunk, Residual];
        assert!(err(&twice).contains("again"), "{}", err(&twice));
        assert!(err(&exact[..4]).contains("never issued"));
        let early = [Dense, LastLaunch, LastChunk, Gather, Residual];
        assert!(err(&early).contains("waits for"), "{}", err(&early));
        // Another GPU's operation is not this one's.
        let mut other = ops(&exact);
        other.issued[1].1 = 1;
        assert!(other.check().is_err());
    }

    #[test]
    fn residual_scale_bounds_the_stack() {
        assert_eq!(residual_scale(1), 1.0);
        assert!((residual_scale(48) - 1.0 / 48f32.sqrt()).abs() < 1e-7);
        assert_eq!(residual_scale(0), 1.0);
    }

    #[test]
    fn auto_is_refused_until_the_model_resolves_it() {
        let s = Strategy::Hybrid {
            fetch: ft_model::FetchFraction::Auto,
        };
        let e = resolve_fetch(&s).unwrap_err().to_string();
        assert!(e.contains("--fetch-fraction") && e.contains("auto"), "{e}");
        assert_eq!(resolve_fetch(&Strategy::Cpu).unwrap(), 0.0);
    }

    #[test]
    fn dense_reads_split_at_the_router() {
        let d = Device::host(Default::default()).unwrap();
        let buf = d.alloc(1000, "w").unwrap();
        let reads = vec![
            DenseRead {
                buffer: &buf,
                offset: 100,
                bytes: 600,
            },
            DenseRead {
                buffer: &buf,
                offset: 800,
                bytes: 50,
            },
        ];
        let (pre, post) = split_dense(reads.clone(), 200);
        assert_eq!((pre[0].offset, pre[0].bytes, pre[1].bytes), (100, 400, 50));
        assert_eq!((post[0].offset, post[0].bytes), (500, 200));
        let (pre, post) = split_dense(reads.clone(), 0);
        assert_eq!((pre.len(), post.len()), (2, 0));
        let (pre, post) = split_dense(reads, 10_000);
        assert_eq!((pre.len(), post[0].bytes), (1, 600));
    }
}
