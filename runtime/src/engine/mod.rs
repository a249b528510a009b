//! The decode engine: one decode step of B concurrent streams, per strategy, on a real device.
//!
//! # A decode step
//! A hidden-size f32 vector per stream (its token's input, [`token_input`]) flows through the
//! MoE layers. For each layer:
//!
//! 1. **Dense part** (compute stream): a memory-bound kernel over the layer's dense weights
//!    and each stream's KV bytes at its context length ([`crate::dense::DenseBuffers`]). It
//!    is split at the router: the attention-and-router share runs first (the routing is only
//!    known after it), the shared experts' share after the routed experts' gathers started.
//! 2. **Plan** (host): [`ft_model::plan::plan_layer_placed`] says, for the layer's
//!    placement under the strategy's policy ([`Strategy::policy`]), which experts hit, which
//!    misses are gathered into which slot (evicting whom) and which are computed on the CPU:
//!    a cached layer by the fetch fraction (offload and resident 1, cpu 0, hybrid `f`), a
//!    resident layer (layer split) from its own slots, a CPU-only layer on the CPU.
//!    Routing comes from a routing source and is known to the host; the engine still orders
//!    each layer's gathers after that layer's router on the device (a stream wait), as an
//!    engine that reads the router's output would.
//! 3. **Gather** (copy stream): one copy-engine transfer per fetched expert, bank to slot,
//!    overlapping the hits' compute.
//! 4. **Experts** (compute stream): one expert step over the hits, then one over the fetched
//!    misses ([`crate::gpu_experts::ExpertStep`]) in chunks (`FetchChunks`), each after
//!    its chunk's copies (at most [`EngineSettings::fetch_chunks`] chunks, halving from the
//!    last): the earlier chunks behind an event wait, the last one, on one GPU with
//!    copy-engine gathers, queued at once and gated on a flag the copy stream sets after its
//!    copies ([`crate::device::FlagGate`], [`Engine::gates_last_chunk`]), so that its launch
//!    overlaps the last copy; where the layer has no CPU share, the combine (6) is folded
//!    into that last launch.
//! 5. **CPU share** (hybrid, cpu): the layer's activations go device-to-host on a third
//!    stream; the host waits for them (the layer's one host round trip; a layer without CPU
//!    work has none), runs the CPU experts on the pool ([`crate::cpu_pool::CpuExecutor`])
//!    from the host bank while the GPU computes the hits, and queues a zero-copy read of the
//!    CPU's output rows into the GPU's. The host is the only thread that talks to the device
//!    and also one of the CPU share's threads, so it queues before the share only what the
//!    share waits for (the dense part up to the router, the activations' copy down right
//!    behind it) and the first chunk of gathers; the other chunks' gathers, the experts' input
//!    rows, the post-router dense part, the experts' kernels and the next layer's plan go in
//!    while the activations travel and, what is left, beside the share while the pool's
//!    workers take its first tiles. Plans still run in layer order.
//! 6. **Combine** (compute stream): the expert outputs are summed per stream in a fixed order
//!    ([`CombineOrder`]) and added to the residual stream.
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
pub mod multi;
pub mod probe;
mod settings;
mod timeline;
mod work;

pub use decode::{
    decode, draw_routing, record_routing, request_tags, token_input, DecodeOptions, Decoded,
    INPUT_SALT_WARMUP,
};
pub use multi::{
    decode_multi, CombineMethod, GpuCounts, MultiDecoded, MultiEngine, MultiStepResult,
};
pub use settings::{EngineSettings, REMOVED_ENGINE_ENVS};
pub use work::CombineOrder;

use ft_kernels::{ActivationPath, ExpertWork};
use ft_model::cache::SlotId;
use ft_model::cache::{CacheOptions, CachePolicy, ExpertCache};
use ft_model::plan::{
    fetch_chunk_bounds_at_most, fetch_fraction, plan_layer_placed, MAX_FETCH_CHUNKS,
};
use ft_model::profile::CpuCheck;
use ft_model::{
    CpuLayers, ExpertId, LayerPlacement, ModelSpec, PlacementPolicy, Strategy, StrategyKind,
};
use serde::{Deserialize, Serialize};

use crate::bank::HostBank;
use crate::cpu_pool::{CpuExecutor, PoolWait};
use crate::dense::{DenseBuffers, DenseRead, DENSE_OUT_BYTES};
use crate::device::{Device, DeviceBuffer, Event, FlagGate, HostBuffer, LayerCombine, Stream};
use crate::error::{Result, RuntimeError};
use crate::gather::{self, GatherMethod};
use crate::gpu_experts::ExpertStep;
use crate::instrument::{ns_of_us, Span, StepRecord, StepTimeline};
use crate::numerics::StepOutputs;
use crate::slots::{SlotPool, DEFAULT_RESERVE_BYTES};

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

/// The slots of a model and config.
pub(crate) fn slot_counts(model: &ModelSpec, config: &EngineConfig) -> SlotCounts {
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
                resident: g.experts * (g.moe_layers - n),
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
    /// What an engine for `model` with `config` allocates.
    pub fn of(model: &ModelSpec, config: &EngineConfig) -> EngineMemory {
        let g = &model.geometry;
        let stride = SlotPool::stride_for(model.expert_bytes()) as u64;
        let slots = slot_counts(model, config);
        let row = (g.hidden * F32_BYTES) as u64;
        let rows = max_rows(model, config) as u64;
        EngineMemory {
            bank_bytes: stride * g.total_experts(),
            slot_bytes: stride * slots.total().max(1) as u64,
            dense_bytes: DenseBuffers::bytes_needed(
                &model.dense(),
                g.moe_layers,
                config.max_streams,
                config.max_context,
            ),
            // act, y_hits, one y_fetched per fetch chunk; y_cpu.
            activation_bytes: (2 + MAX_FETCH_CHUNKS as u64) * rows * row
                + config.max_streams as u64 * row,
            host_staging_bytes: (rows + config.max_streams as u64) * row,
        }
    }
}

/// A layer's fetched experts in chunks ([`fetch_chunk_bounds_at_most`]): the chunked pipeline of
/// both engines (single- and multi-GPU). Chunk `c`'s gathers are followed by an event on the
/// copy stream, and its expert step waits for that event only and writes output rows of its
/// own, so that the GPU computes each chunk as soon as it has landed. A layer with nothing to
/// gather is one empty chunk (its step zeroes the output rows the CPU's rows go into).
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
    /// The chunks of `work`'s fetched experts into and from `slots`, at most `max_chunks`,
    /// halving from the last ([`fetch_chunk_bounds_at_most`]); the last one's launch gated on
    /// `gate` where given and the layer gathers.
    pub fn of(
        work: &'a work::LayerWork,
        slots: &'a SlotPool,
        max_chunks: usize,
        gate: Option<FlagGate<'a>>,
    ) -> Self {
        FetchChunks {
            work,
            slots,
            bounds: fetch_chunk_bounds_at_most(work.moves.len(), max_chunks),
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

    /// Queue every chunk's expert step on `compute`: chunk `c` reads the slots and the
    /// inputs `act`, writes `outs[c]`, and (where the layer gathers) starts after
    /// `landed(c)`.
    pub fn compute<'e>(
        &self,
        compute: &Stream,
        act: &DeviceBuffer,
        outs: &[DeviceBuffer],
        landed: impl Fn(usize) -> &'e Event,
    ) -> Result<()> {
        for (c, out) in outs[..self.len()].iter().enumerate() {
            self.compute_chunk(c, compute, act, out, landed(c), None)?;
        }
        Ok(())
    }

    /// Chunk `c`'s part of the layer's fetched step.
    fn chunk_step(&self, c: usize) -> std::borrow::Cow<'_, ExpertStep> {
        if self.len() == 1 {
            std::borrow::Cow::Borrowed(&self.work.fetched)
        } else {
            std::borrow::Cow::Owned(self.work.fetched.part(self.bounds[c].clone()))
        }
    }

    /// Queue chunk `c`'s expert step on `compute` ([`FetchChunks::compute`] for one chunk):
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
    need_fetched: bool,
    /// The layer's combine, folded into the last fetched chunk's launch here.
    fold: Option<LayerCombine<'a>>,
    /// The next item: 0 the post-router dense part, 1 the hits, 2 + c fetched chunk `c`,
    /// then the fetched event.
    next: usize,
    clock: crate::device::Clock,
    /// When the first item was queued (device clock, us): the GPU cannot start it before.
    first_queued_us: f64,
}

impl LayerRest<'_> {
    /// Queue the next chunk's gathers on the copy stream (which waits for the router
    /// already); false when every chunk is queued.
    fn gather_next(&mut self) -> Result<bool> {
        let chunks = self.fetch.len();
        if self.gathered >= chunks {
            return Ok(false);
        }
        let c = self.gathered;
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
        let fetched_items = if self.need_fetched { chunks } else { 0 };
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
                self.compute.launch_experts(
                    &self.fetch.work.hits,
                    self.slots.buffer(),
                    self.act,
                    self.y_hits,
                )?;
                ev.record_timing(self.compute, &ev.hits)?;
            }
            i if i < 2 + fetched_items => {
                let c = i - 2;
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
    /// Counts and busy times per layer.
    pub record: StepRecord,
    /// The step's spans (for a trace).
    pub spans: Vec<Span>,
    /// The final hidden vector of each stream.
    pub outputs: StepOutputs,
}

/// The decode engine (see the module docs).
pub struct Engine {
    device: Device,
    model: ModelSpec,
    config: EngineConfig,
    /// Each layer's placement ([`Strategy::policy`]).
    placement: PlacementPolicy,
    /// The cached layers' fetch fraction ([`PlacementPolicy::fetch_fraction`]).
    fetch: f64,
    alpha: f32,
    popularity: Option<Vec<f64>>,
    bank: HostBank,
    slots: SlotPool,
    cache_slots: usize,
    staging_slots: usize,
    /// Slots of layer split's resident layers, after the cache's and the staging slots.
    resident_slots: usize,
    cache: ExpertCache,
    dense: DenseBuffers,
    /// Where the dense kernel folds what it reads ([`DENSE_OUT_BYTES`]).
    dense_out: DeviceBuffer,
    /// The flag the last fetched chunk's launch is gated on, one u32, where it is
    /// ([`Engine::gates_last_chunk`]), and the value the last gated layer waited for (each
    /// gated layer the next).
    gate_flag: Option<DeviceBuffer>,
    gate_value: u32,
    /// Bytes of each layer's dense weights read after the router (the shared experts).
    dense_post_bytes: usize,
    compute: Stream,
    copy: Stream,
    act_stream: Stream,
    /// Expert inputs `[rows][hidden]`; block 0 (the first `streams` rows) is the residual
    /// stream itself.
    act: DeviceBuffer,
    /// Hits' outputs, `[rows][hidden]`.
    y_hits: DeviceBuffer,
    /// Fetched misses' outputs, `[rows][hidden]` each, one buffer per chunk of the layer's
    /// fetched experts ([`fetch_chunk_bounds_at_most`]); in fixed order the CPU's rows go to the first.
    y_fetched: Vec<DeviceBuffer>,
    /// The CPU's outputs in fast order, `[streams][hidden]`.
    y_cpu: DeviceBuffer,
    /// The layer's activations, downloaded for the CPU, `[streams][hidden]`.
    x_host: HostBuffer,
    /// The CPU's output rows, read by the device, `[rows][hidden]`.
    y_host: HostBuffer,
    /// The CPU's input rows in fixed order (one per pair).
    cpu_x: Vec<f32>,
    exec: Option<CpuExecutor>,
    events: Vec<LayerEvents>,
    /// Recorded on the idle compute stream at each step's start, with timing: it places the
    /// step's device events on the host's clock ([`Event::timeline_us_from`]).
    anchor: Event,
    /// The copies that replicate the first block of rows into the experts' input rows
    /// (`replicate_rounds` of top-k; none for the fast combine order), the same every layer.
    input_copies: Vec<(usize, usize, usize)>,
    template: ExpertStep,
    steps_run: u64,
}

impl std::fmt::Debug for Engine {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Engine")
            .field("model", &self.model.name)
            .field("strategy", &self.config.strategy)
            .field("device", &self.device.info().name)
            .field("cache_slots", &self.cache_slots)
            .field("staging_slots", &self.staging_slots)
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
/// contexts within the KV it holds); the streams of the step. Shared by [`Engine`] and
/// [`multi::MultiEngine`].
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

impl Engine {
    /// Build an engine for `model` on `device`: fill the host bank from `config.seed`,
    /// allocate the cache slots, dense buffers and activations, and load what the strategy
    /// keeps resident (every expert for `resident`, the hot set for a static-hot cache, which
    /// needs `popularity` when the policy names no hot set).
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
        model.validate()?;
        let g = model.geometry;
        config.check(model)?;
        let placement = resolve_policy(&config.strategy, g.moe_layers)?;
        let counts = slot_counts(model, config);
        let (cache_slots, staging_slots) = (counts.cache, counts.staging);
        let expert_bytes = model.expert_bytes();
        let kind = config.strategy.kind();

        // The slots come first; keep room for the engine's other device buffers too.
        let planned = EngineMemory::of(model, config);
        let reserve = config.reserve_bytes + planned.dense_bytes + planned.activation_bytes;
        let slots = match SlotPool::new(device, expert_bytes, counts.total().max(1), reserve) {
            Ok(s) => s,
            Err(RuntimeError::OutOfMemory { available, .. })
                if kind == StrategyKind::LayerSplit =>
            {
                let per_layer = SlotPool::stride_for(expert_bytes) as u64 * g.experts as u64;
                let fit = ((available / per_layer.max(1)) as usize).min(g.moe_layers);
                return Err(RuntimeError::OutOfMemory {
                    what: format!(
                        "{} ({} resident layers x {} experts of {expert_bytes} bytes)",
                        config.strategy,
                        g.moe_layers - placement.cpu_layers,
                        g.experts
                    ),
                    requested: per_layer * (g.moe_layers - placement.cpu_layers) as u64,
                    available,
                    hint: format!(
                        "; {fit} of the {} layers' experts fit: put the others on the CPU with \
                         --strategy layer-split:{}",
                        g.moe_layers,
                        g.moe_layers - fit
                    ),
                });
            }
            Err(RuntimeError::OutOfMemory { available, .. }) if kind == StrategyKind::Resident => {
                let per_layer = SlotPool::stride_for(expert_bytes) as u64 * g.experts as u64;
                let fit = available / per_layer.max(1);
                return Err(RuntimeError::OutOfMemory {
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
                });
            }
            Err(e) => return Err(e),
        };
        let bank = match source {
            BankSource::Seed(seed) => HostBank::from_seed(device, model.format, &g, seed)?,
            BankSource::Safetensors(path) => {
                HostBank::from_safetensors(device, model.format, &g, path)?
            }
        };
        let dense = DenseBuffers::new(
            device,
            &model.dense(),
            g.moe_layers,
            config.max_streams,
            config.max_context,
        )?;
        let dense_post_bytes = (2 * g.shared_experts as u64 * g.expert_params())
            .min(model.dense().weight_bytes_per_layer) as usize;
        let dense_out = device.alloc(DENSE_OUT_BYTES, "dense output")?;
        let gates = config.gather == GatherMethod::CopyEngine && device.supports_flag_gates();
        if !gates {
            tracing::debug!(
                gather = %config.gather,
                flag_writes = device.supports_flag_gates(),
                "the last fetched chunk waits for its copies' event (no gate: zero-copy gathers or no stream flag writes)"
            );
        }
        let gate_flag = gates.then(|| device.alloc(4, "gate flag")).transpose()?;
        let row = g.hidden * F32_BYTES;
        let rows = max_rows(model, config);
        let act = device.alloc(rows * row, "expert inputs")?;
        let y_hits = device.alloc(rows * row, "hit experts' outputs")?;
        let y_fetched = (0..MAX_FETCH_CHUNKS)
            .map(|_| device.alloc(rows * row, "fetched experts' outputs"))
            .collect::<Result<Vec<_>>>()?;
        let y_cpu = device.alloc(config.max_streams * row, "CPU experts' outputs")?;
        let x_host = device.alloc_host(config.max_streams * row, "activations for the CPU")?;
        let y_host = device.alloc_host(rows * row, "CPU experts' output rows")?;
        let compute = device.new_stream("compute")?;
        let copy = device.new_stream("copy")?;
        let act_stream = device.new_stream("activations")?;
        let events = (0..g.moe_layers)
            .map(|_| LayerEvents::new(device, config.timeline, MAX_FETCH_CHUNKS - 1))
            .collect::<Result<Vec<_>>>()?;
        let anchor = device.new_event(config.timeline)?;
        // The gate's flag starts below every value a layer waits for (the first is 1), before
        // any launch on another stream reads it.
        if let Some(flag) = &gate_flag {
            compute.memset_zero(flag, 0, 4)?;
            compute.synchronize()?;
        }
        let template = ExpertStep::new(model.format, &g, config.gpu_path, 0);
        device.warm_up_kernels(&[&template])?;
        let cache = config
            .cache_options
            .build(kind, &g, cache_slots, popularity.as_deref())?;
        let mut engine = Engine {
            device: device.clone(),
            model: model.clone(),
            config: config.clone(),
            placement,
            fetch: placement.fetch_fraction(),
            alpha: residual_scale(g.moe_layers),
            popularity,
            bank,
            slots,
            cache_slots,
            staging_slots,
            resident_slots: counts.resident,
            cache,
            dense,
            dense_out,
            gate_flag,
            gate_value: 0,
            dense_post_bytes,
            compute,
            copy,
            act_stream,
            act,
            y_hits,
            y_fetched,
            y_cpu,
            x_host,
            y_host,
            cpu_x: Vec::new(),
            exec: None,
            events,
            anchor,
            input_copies: if config.combine == CombineOrder::Fixed {
                replicate_rounds(g.top_k)
            } else {
                Vec::new()
            },
            template,
            steps_run: 0,
        };
        engine.ensure_executor()?;
        engine.load_resident()?;
        Ok(engine)
    }

    /// Whether some layer computes experts on the CPU: a CPU-only layer, or cached layers
    /// that gather less than every miss.
    fn uses_cpu(&self) -> bool {
        let layers = self.model.geometry.moe_layers;
        let cached_cpu = self.placement.cpu_layers < layers
            && match self.placement.rest {
                LayerPlacement::Cached { fetch_fraction } => fetch_fraction < 1.0,
                LayerPlacement::Resident | LayerPlacement::CpuOnly => false,
            };
        self.placement.cpu_layers > 0 || cached_cpu
    }

    /// Create the CPU executor if the strategy computes anything on the CPU.
    fn ensure_executor(&mut self) -> Result<()> {
        if self.exec.is_none() && self.uses_cpu() {
            self.exec = Some(CpuExecutor::new(
                self.config.threads,
                self.config.pool_wait,
            )?);
        }
        Ok(())
    }

    /// Copy every expert the cache holds (resident, a static hot set) and every expert of
    /// layer split's resident layers into its slot.
    fn load_resident(&mut self) -> Result<()> {
        let g = self.model.geometry;
        let mut moves: Vec<_> = self.cache.resident().map(|(slot, id)| (id, slot)).collect();
        if self.resident_slots > 0 {
            let base = self.cache_slots + self.staging_slots;
            moves.extend(
                (self.placement.cpu_layers..g.moe_layers)
                    .flat_map(|l| (0..g.experts).map(move |e| ExpertId::new(l, e)))
                    .enumerate()
                    .map(|(i, id)| (id, SlotId((base + i) as u32))),
            );
        }
        let regions = gather::regions(&self.bank, &self.slots, &moves)?;
        if !regions.is_empty() {
            self.copy
                .copy_h2d_regions(self.bank.buffer(), self.slots.buffer(), &regions)?;
            self.copy.synchronize()?;
        }
        Ok(())
    }

    /// Forget the cache's history: an empty cache (or the resident / hot set again), as a
    /// freshly started engine has, without refilling the bank.
    pub fn reset_cache(&mut self) -> Result<()> {
        self.device.synchronize()?;
        self.cache = self.config.cache_options.build(
            self.config.strategy.kind(),
            &self.model.geometry,
            self.cache_slots,
            self.popularity.as_deref(),
        )?;
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
        let resident = slot_counts(&self.model, &new_config).resident;
        if (old == StrategyKind::Resident) != (new == StrategyKind::Resident)
            || resident != self.resident_slots
        {
            return Err(RuntimeError::invalid(
                "strategy",
                format!("cannot switch an engine from {} to {strategy}: the resident slots differ; build a new engine", self.config.strategy),
            ));
        }
        let layers = self.model.geometry.moe_layers;
        let placement = resolve_policy(&strategy, layers)?;
        let fetch = placement.fetch_fraction();
        let gathers = placement.cpu_layers < layers
            && match placement.rest {
                LayerPlacement::Cached { fetch_fraction } => fetch_fraction > 0.0,
                LayerPlacement::Resident | LayerPlacement::CpuOnly => false,
            };
        if gathers && self.staging_slots == 0 && self.cache_slots < self.union_max() {
            return Err(RuntimeError::invalid(
                "strategy",
                format!(
                    "{strategy} needs staging slots this engine (built for {}) lacks",
                    self.config.strategy
                ),
            ));
        }
        self.config.strategy = strategy;
        self.placement = placement;
        self.fetch = fetch;
        self.ensure_executor()?;
        self.reset_cache()
    }

    /// Compute the CPU share on `threads` threads from now on (a new executor; the cache and
    /// everything else stay). The probe calibrates the serving slowdown at a second count
    /// this way without filling a second bank.
    pub fn set_threads(&mut self, threads: usize) -> Result<()> {
        if threads == 0 {
            return Err(RuntimeError::invalid(
                "--threads",
                "the CPU pool needs at least 1 thread",
            ));
        }
        if threads != self.config.threads {
            self.exec = None;
            self.config.threads = threads;
            self.ensure_executor()?;
        }
        Ok(())
    }

    /// Threads computing the CPU share.
    pub fn threads(&self) -> usize {
        self.config.threads
    }

    fn union_max(&self) -> usize {
        let g = &self.model.geometry;
        g.experts.min(g.top_k * self.config.max_streams)
    }

    /// Measure the link's linear host-to-device bandwidth in this engine's conditions: the
    /// median over `reps` of one contiguous copy of up to `max_bytes` from the bank into the
    /// slot memory, GB/s (1e9 B/s). The slots' contents are lost, so the cache is reset (and
    /// its resident set reloaded) afterwards.
    pub fn measure_linear_h2d_gbs(&mut self, max_bytes: usize, reps: usize) -> Result<f64> {
        let bytes = max_bytes
            .min(self.bank.buffer().len())
            .min(self.slots.buffer().len());
        if bytes == 0 || reps == 0 {
            return Err(RuntimeError::invalid("linear H2D probe", "nothing to copy"));
        }
        let (e0, e1) = (self.device.new_event(true)?, self.device.new_event(true)?);
        let mut us = Vec::with_capacity(reps);
        // One copy first (page faults, first-touch).
        self.copy
            .copy_h2d(self.bank.buffer(), 0, self.slots.buffer(), 0, bytes)?;
        self.copy.synchronize()?;
        for _ in 0..reps {
            self.copy.record(&e0)?;
            self.copy
                .copy_h2d(self.bank.buffer(), 0, self.slots.buffer(), 0, bytes)?;
            self.copy.record(&e1)?;
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

    /// Whether a layer's last fetched chunk is gated on a flag: where it can be, copy-engine
    /// gathers (a zero-copy gather's kernel needs the multiprocessors the waiting blocks
    /// hold) on a device with stream flag writes.
    pub fn gates_last_chunk(&self) -> bool {
        self.gate_flag.is_some()
    }

    /// The configuration it runs.
    pub fn config(&self) -> &EngineConfig {
        &self.config
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

    /// Slots holding layer split's resident layers.
    pub fn resident_slots(&self) -> usize {
        self.resident_slots
    }

    /// The device.
    pub fn device(&self) -> &Device {
        &self.device
    }

    /// The expert cache (its counters and contents).
    pub fn cache(&self) -> &ExpertCache {
        &self.cache
    }

    /// The host bank.
    pub fn bank(&self) -> &HostBank {
        &self.bank
    }

    /// Slots of the cache proper.
    pub fn cache_slots(&self) -> usize {
        self.cache_slots
    }

    /// Staging slots for experts the cache refuses.
    pub fn staging_slots(&self) -> usize {
        self.staging_slots
    }

    /// Time the CPU check ([`crate::cpu_check::measure`]) on this engine's bank with its
    /// serving threads: on the strategy's own executor where it has one, else on a pool of
    /// the same threads and wait policy built for the check; `start` picks where in the bank
    /// it starts (a different place each call reads different weights).
    pub fn cpu_check(&mut self, budget: std::time::Duration, start: usize) -> Result<CpuCheck> {
        let path = self.config.cpu_path;
        match self.exec.as_mut() {
            Some(exec) => crate::cpu_check::measure(exec, &self.bank, path, budget, start),
            None => crate::cpu_check::measure_on(
                self.config.threads,
                self.config.pool_wait,
                &self.bank,
                path,
                budget,
                start,
            ),
        }
    }

    /// The CPU executor, if the strategy uses the CPU.
    pub fn cpu_executor(&mut self) -> Option<&mut CpuExecutor> {
        self.exec.as_mut()
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

    /// Run one decode step (see the module docs) and return its record, spans and outputs.
    pub fn step(&mut self, input: &StepInput<'_>) -> Result<StepResult> {
        let b = self.check_input(input)?;
        let g = self.model.geometry;
        let (h, k, layers) = (g.hidden, g.top_k, g.moe_layers);
        let rows = Rows {
            order: self.config.combine,
            streams: b,
            top_k: k,
        };
        let block = b * h; // f32 per block of rows
        let row_bytes = h * F32_BYTES;
        let clock = self.device.clock();
        let step_index = self.steps_run;
        self.steps_run += 1;

        if let Some(e) = self.exec.as_mut() {
            e.begin_step();
        }
        let t0 = clock.now_us();
        // The previous step ended with its output's download, so every stream is idle: the
        // anchor completes a few microseconds after `t0`.
        if self.config.timeline {
            self.compute.record(&self.anchor)?;
        }
        let mut tl = StepTimeline::new(step_index, input.warmup, b, layers, ns_of_us(t0));
        let mut marks = vec![LayerMarks::default(); layers];
        let flat: Vec<f32> = input.inputs.concat();
        self.compute.upload_f32(&flat, &self.act, 0)?;

        // A layer planned ahead, while the host waited for the previous layer's activations.
        let mut ahead: Option<work::LayerWork> = None;
        // The planner borrows the cache for the whole step; the layers in flight borrow
        // the other fields.
        let mut planner = Planner {
            cache: &mut self.cache,
            placement: self.placement,
            resident_base: self.cache_slots + self.staging_slots,
            experts: self.model.geometry.experts,
            cx: BuildContext {
                rows,
                slots: &self.slots,
                cache_slots: self.cache_slots,
                staging_slots: self.staging_slots,
                weight_scale: self.alpha,
                template: &self.template,
                hidden: self.model.geometry.hidden,
            },
        };
        for (l, m) in marks.iter_mut().enumerate() {
            m.submit_start = clock.now_us();
            let ev = &self.events[l];
            // 1. Dense part up to the router, queued before the layer is planned: it needs no
            // plan, and where the GPU has caught up with the host (a step's first layer) the
            // planning then runs beside it instead of before it.
            let reads = self.dense.reads(l, input.contexts)?;
            let (pre, post) = split_dense(reads, self.dense_post_bytes);
            m.post = !post.is_empty();
            m.dense_submit = clock.now_us();
            if !pre.is_empty() {
                self.compute.launch_dense(&pre, &self.dense_out)?;
            }
            self.compute.record(&ev.router)?;
            let work = match ahead.take() {
                Some(w) => w,
                None => planner.plan(l, input)?,
            };
            tl.set_counts(l, work.counts);
            m.link = !work.moves.is_empty();
            m.cpu = !work.cpu.is_empty();
            m.hit_experts = work.hits.experts.len() as u32;
            m.link_experts = work.fetched.experts.len() as u32;
            m.cpu_experts = work.cpu.experts.len() as u32;
            m.gather_bytes = work.counts.gathered_bytes;
            m.cpu_rows_bytes = (work.cpu.rows() * row_bytes) as u64;
            m.down_bytes = (b * row_bytes) as u64;

            // 3a. Gathers, after the router, in chunks of experts: each chunk's copies are
            // followed by an event, so that the GPU computes a chunk as soon as it has landed
            // and only the last chunk's kernel follows the last copy. The first chunk is
            // issued before the experts' input rows, so that the link starts as soon as the
            // router has run: in a hybrid step the host reaches this point only after the
            // previous layer's CPU share, and every call it makes before the first copy is
            // time the link waits.
            let gate = self
                .gate_flag
                .as_ref()
                .filter(|_| !work.moves.is_empty())
                .map(|flag| {
                    self.gate_value = self.gate_value.wrapping_add(1);
                    FlagGate {
                        flag,
                        offset: 0,
                        value: self.gate_value,
                    }
                });
            let fetch =
                FetchChunks::of(&work, &self.slots, self.config.settings.fetch_chunks, gate);
            let chunks = fetch.len();
            // 1b. The rest of the dense part, 4. the experts: queued now, or with a CPU share
            // while the host waits for the activations and beside the CPU share (the CPU
            // share does not wait for them).
            let need_fetched = m.link || (m.cpu && rows.order == CombineOrder::Fixed);
            let fetched_parts: Vec<&DeviceBuffer> = if need_fetched {
                self.y_fetched[..chunks].iter().collect()
            } else {
                Vec::new()
            };
            // 6 (folded). Without a CPU share the combine can follow the last fetched
            // chunk's kernel inside its launch ([`Stream::launch_experts_then_combine`]).
            let fold =
                (m.link && !m.cpu && rows.order == CombineOrder::Fixed).then_some(LayerCombine {
                    act: &self.act,
                    parts: &self.y_hits,
                    more: &fetched_parts,
                    block,
                    k,
                });
            let mut rest = LayerRest {
                compute: &self.compute,
                copy: &self.copy,
                bank: &self.bank,
                gather: self.config.gather,
                slots: &self.slots,
                act: &self.act,
                y_hits: &self.y_hits,
                y_fetched: &self.y_fetched,
                dense_out: &self.dense_out,
                ev,
                fetch: &fetch,
                gathered: 0,
                replicate: &self.input_copies,
                block,
                inputs_queued: false,
                post: &post,
                need_fetched,
                fold,
                next: 0,
                clock,
                first_queued_us: 0.0,
            };
            // 5a. The activations' copy down for the CPU share (their own stream: not behind
            // the gathers), queued first, behind the router alone (the share reads the first
            // block of rows, which the experts' input rows only copy from); the gathers
            // after the first chunk and the input rows wait in `rest`. So the share starts
            // about as soon as the router has run instead of a dozen host calls later
            // (experiments/runtime-grid, "The copy down queued first in a hybrid layer").
            m.down_after_router = m.cpu;
            if m.cpu {
                self.act_stream.wait(&ev.router)?;
                self.act_stream
                    .copy_d2h(&self.act, 0, &self.x_host, 0, block * F32_BYTES)?;
                self.act_stream.record(&ev.down)?;
            }
            if m.link {
                self.copy.wait(&ev.router)?;
                rest.gather_next()?;
            }
            if !m.cpu {
                // No CPU share, so nothing waits for the host: the input rows, 3b. the
                // remaining chunks' gathers (3a issued the first) before any other call, so
                // that the link never waits for the host, then the rest.
                rest.queue_inputs()?;
                while rest.gather_next()? {}
                rest.submit_all()?;
            }
            m.submit_end = clock.now_us();

            // 5b. The CPU share: the layer's one host round trip.
            if m.cpu {
                // Plan the next layer while the activations come down (host work off the
                // critical path; the plans run in layer order all the same).
                let plan_next = l + 1 < layers;
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
                run_cpu(
                    CpuSide {
                        exec: self.exec.as_mut(),
                        bank: &self.bank,
                        model: &self.model,
                        path: self.config.cpu_path,
                        x_host: &self.x_host,
                        y_host: &mut self.y_host,
                        cpu_x: &mut self.cpu_x,
                    },
                    &work,
                    rows,
                    &mut beside,
                )?;
                beside_result?;
                m.cpu_end = clock.now_us();
                let dst = match rows.order {
                    CombineOrder::Fixed => &self.y_fetched[0],
                    CombineOrder::Fast => &self.y_cpu,
                };
                self.compute
                    .gather_zero_copy(&self.y_host, dst, &work.cpu.scatter)?;
                ev.record_timing(&self.compute, &ev.merged)?;
                m.merge_end = clock.now_us();
            }
            m.rest_submit = rest.first_queued_us;
            let ev = &self.events[l];

            // 6. Combine in a fixed order, add to the residual stream (done already where
            // folded into the last chunk's launch).
            let n_rows = rows.count();
            match rows.order {
                _ if fold.is_some() => {}
                // One launch: the fetched (and CPU) rows onto the hits', the tree, the
                // residual add.
                CombineOrder::Fixed => {
                    self.compute
                        .combine_fixed(&self.act, &self.y_hits, &fetched_parts, block, k)?
                }
                CombineOrder::Fast => {
                    for part in &fetched_parts {
                        self.compute.add_f32(&self.y_hits, 0, part, 0, n_rows * h)?;
                    }
                    if m.cpu {
                        self.compute
                            .add_f32(&self.y_hits, 0, &self.y_cpu, 0, block)?;
                    }
                    self.compute.add_f32(&self.act, 0, &self.y_hits, 0, block)?;
                }
            }
            ev.record_timing(&self.compute, &ev.done)?;
            m.layer_end_submit = clock.now_us();
        }

        let out_wait = clock.now_us();
        let flat = self.compute.download_f32(&self.act, 0, block)?;
        let t_end = clock.now_us();
        if let Some(e) = self.exec.as_mut() {
            e.end_step();
        }
        let outputs: StepOutputs = flat.chunks_exact(h).map(|c| c.to_vec()).collect();
        timeline::add_spans(
            &mut tl,
            &marks,
            &self.events,
            self.config.timeline.then_some(&self.anchor),
            t0,
            (out_wait, t_end),
        )?;
        let (record, spans) = tl.finish(ns_of_us(t_end));
        Ok(StepResult {
            record,
            spans,
            outputs,
        })
    }
}

/// What planning a layer borrows from the engine (the cache, mutably; the slots and the
/// kernel template): split from the engine so that the host can plan the next layer while
/// other fields are borrowed by the layer in flight.
struct Planner<'a> {
    cache: &'a mut ExpertCache,
    placement: PlacementPolicy,
    /// The first slot of layer split's resident layers ([`SlotCounts`]).
    resident_base: usize,
    /// Experts per layer.
    experts: usize,
    cx: BuildContext<'a>,
}

impl Planner<'_> {
    /// Plan layer `l` as its placement says (updating the cache where it is cached) and
    /// turn the plan into device work; a resident layer's experts are in their own slots.
    fn plan(&mut self, l: usize, input: &StepInput<'_>) -> Result<work::LayerWork> {
        let routes = &input.routing.layers[l];
        let placement = self.placement.layer(l);
        let mut plan = plan_layer_placed(l, routes, self.cache, placement);
        match placement {
            LayerPlacement::Resident => {
                let first = (l - self.placement.cpu_layers) * self.experts;
                for h in &mut plan.hits {
                    h.slot = Some(SlotId(
                        (self.resident_base + first + h.id.expert as usize) as u32,
                    ));
                }
            }
            LayerPlacement::Cached { .. } | LayerPlacement::CpuOnly => {}
        }
        build_layer(&plan, routes, &self.cx)
    }
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
