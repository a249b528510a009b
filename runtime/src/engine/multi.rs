//! The multi-GPU decode engine: G devices decoding one step together, layer by layer.
//!
//! A host with G GPUs has G expert caches and G PCIe links but one host DRAM and one CPU
//! pool. Where experts live is [`ft_model::GpuLayout`] (THE definition, shared with the
//! simulator and the analytic model); this module runs it on real (or host-emulated)
//! devices:
//!
//! - **Per GPU** there is everything the single-GPU [`super::Engine`] has: slots and an
//!   [`ExpertCache`], dense buffers, activation buffers, a compute, a copy and an
//!   activations stream, host staging, and (for a CPU share) a [`CpuExecutor`]. Each layer,
//!   GPU `g` plans with [`plan_layer`] on its own cache and the routes
//!   [`GpuLayout::routes_on`]`(g, ..)`, then runs the single engine's layer pieces
//!   (`build_layer`, the chunked gathers and fetched steps of `FetchChunks`, the hit
//!   step, `run_cpu`) unchanged.
//! - **Banks.** One pinned host bank of whole experts serves every GPU (the devices are
//!   opened as one group, [`Device::open_group`], so any of them may copy from it). Under
//!   [`GpuPlacement::Sharded`] each GPU gathers its own experts from it. Under
//!   [`GpuPlacement::TensorParallel`] each GPU also gets a bank of its slices
//!   ([`HostBank::tensor_parallel_slice`]: rows of gate/up and columns of down, copied once
//!   at build time, no re-encoding), so its gathers stay one copy per expert; the whole bank
//!   stays for hybrid's CPU share, which computes whole experts (host memory: twice the
//!   bank under tensor parallelism).
//! - **CPU share.** GPU `g`'s share runs on its own executor of
//!   [`GpuLayout::cpu_workers`]`(g, threads)` threads, all G at once (one host thread each,
//!   which computes as one of them under [`crate::cpu_pool::PoolWait::Spin`]); the ranges
//!   are disjoint, so no two GPUs' workers are meant for one core (the
//!   pools do not pin threads; [`MultiEngine::cpu_workers`] reports the ranges). Under
//!   tensor parallelism every GPU plans the same CPU experts (identical caches); GPU `g`
//!   computes the ones at positions `g, g + G, ..` of the plan's list, whole, and adds them
//!   to its partial output.
//! - **Combine.** After the experts, the G partial output rows are summed and every GPU
//!   gets the sum (an all-reduce); each GPU then finishes the layer (the fixed-order tree
//!   over top-k positions, the residual add) on identical data, so every GPU's residual
//!   stream stays the same. The reduction covers the expert-output rows *before* the tree
//!   (in fixed order: one row per (stream, top-k position)), so under sharding each row has
//!   exactly one non-zero contribution and the sum is exact: sharded outputs are
//!   bit-identical to the single-GPU engine's wherever the expert kernels are. The combine
//!   runs through NCCL (`ncclAllReduce`, loaded at run time through cudarc) on CUDA when the
//!   library loads, else through the host: each GPU's rows down, a sum in GPU order, the sum
//!   up to every GPU ([`CombineMethod`] says which ran).
//! - **Dense part.** Replicated: every GPU runs the layer's dense kernel over the whole
//!   dense weights and KV (no attention split yet); it does not change any output.
//!
//! With G = 1 nothing is combined and a step is the single engine's step, operation for
//! operation (tested: bit-identical outputs and identical cache statistics).

use std::ops::Range;

use ft_model::cache::ExpertCache;
use ft_model::plan::plan_layer;
use ft_model::routing::TokenRoute;
use ft_model::{GpuLayout, GpuPlacement, ModelSpec};
use serde::{Deserialize, Serialize};

use super::decode::{token_input, DecodeOptions, INPUT_SALT_WARMUP};
use super::work::{build_layer, replicate_rounds, BuildContext, Rows, F32_BYTES};
use super::{
    max_rows, residual_scale, resolve_fetch, run_cpu, slot_counts, split_dense, CombineOrder,
    CpuSide, EngineConfig, EngineMemory, FetchChunks, StepInput, MAX_FETCH_CHUNKS,
};
use crate::bank::{slice_geometry, HostBank};
use crate::cpu_pool::CpuExecutor;
use crate::dense::{DenseBuffers, DENSE_OUT_BYTES};
use crate::device::{Device, DeviceBuffer, DeviceKind, Event, HostBuffer, Stream};
use crate::error::{Result, RuntimeError};
use crate::gather;
use crate::gpu_experts::ExpertStep;
use crate::instrument::LayerCounts;
use crate::numerics::StepOutputs;
use crate::slots::SlotPool;

/// How the partial outputs of the GPUs were summed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum CombineMethod {
    /// One GPU: nothing to combine.
    None,
    /// Through the host: device-to-host copies, a sum in GPU order on the host,
    /// host-to-device copies (the host-emulated device, and CUDA without NCCL).
    Host,
    /// `ncclAllReduce` (sum, f32) on every GPU's compute stream.
    Nccl,
}

impl CombineMethod {
    /// Name in reports.
    pub fn name(self) -> &'static str {
        match self {
            CombineMethod::None => "none",
            CombineMethod::Host => "host (D2H + sum + H2D)",
            CombineMethod::Nccl => "nccl all-reduce",
        }
    }
}

/// Counts of one GPU summed over layers (and steps).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct GpuCounts {
    /// Distinct experts found in this GPU's cache, summed over layers.
    pub hits: u64,
    /// Distinct experts this GPU computes that were not in its cache (`fetched + cpu`).
    pub misses: u64,
    /// Misses gathered over this GPU's link.
    pub fetched: u64,
    /// Misses computed on this GPU's CPU workers.
    pub cpu: u64,
    /// (token, expert) pairs on this GPU (hits and fetched).
    pub gpu_tokens: u64,
    /// (token, expert) pairs on this GPU's CPU workers.
    pub cpu_tokens: u64,
    /// Bytes gathered over this GPU's link (a slice per expert under tensor parallelism).
    pub gathered_bytes: u64,
    /// Bytes this GPU sent in the combines (the ring all-reduce's share,
    /// [`GpuLayout::combine_bytes_per_gpu`]); 0 on one GPU.
    pub combine_bytes: u64,
}

impl GpuCounts {
    fn add_layer(&mut self, c: &LayerCounts) {
        self.hits += c.hits as u64;
        self.misses += c.misses as u64;
        self.fetched += c.fetched as u64;
        self.cpu += c.cpu as u64;
        self.gpu_tokens += c.gpu_tokens as u64;
        self.cpu_tokens += c.cpu_tokens as u64;
        self.gathered_bytes += c.gathered_bytes;
    }

    /// Add another count.
    pub fn add(&mut self, o: &GpuCounts) {
        self.hits += o.hits;
        self.misses += o.misses;
        self.fetched += o.fetched;
        self.cpu += o.cpu;
        self.gpu_tokens += o.gpu_tokens;
        self.cpu_tokens += o.cpu_tokens;
        self.gathered_bytes += o.gathered_bytes;
        self.combine_bytes += o.combine_bytes;
    }

    /// Misses over distinct experts looked up (0 when nothing was looked up).
    pub fn miss_rate(&self) -> f64 {
        let all = self.hits + self.misses;
        if all == 0 {
            0.0
        } else {
            self.misses as f64 / all as f64
        }
    }
}

/// What one GPU did in one step.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct GpuStep {
    /// Its plan counts, summed over the layers.
    pub counts: GpuCounts,
    /// Host time of this GPU's CPU shares, us (its pool's layer calls, summed over layers).
    pub cpu_us: f64,
}

/// One step of the multi-GPU engine.
#[derive(Debug, Clone)]
pub struct MultiStepResult {
    /// The final hidden vector of each stream (every GPU holds the same).
    pub outputs: StepOutputs,
    /// Per GPU.
    pub gpus: Vec<GpuStep>,
    /// Wall time of the step on the host clock, us.
    pub wall_us: f64,
    /// Time of the combines, summed over layers, us: host-measured for the host method
    /// (the downloads are synchronous, so this includes waiting for the layer's expert work
    /// to finish on every GPU), GPU 0's events around the all-reduce for NCCL (0 when
    /// `timeline` is off).
    pub combine_us: f64,
    /// A warm-up step.
    pub warmup: bool,
}

/// Everything one GPU owns (the single engine's per-device state).
struct GpuPart {
    device: Device,
    /// The bank this GPU gathers from (`None`: the shared whole bank).
    slice_bank: Option<HostBank>,
    slots: SlotPool,
    cache_slots: usize,
    staging_slots: usize,
    cache: ExpertCache,
    dense: DenseBuffers,
    dense_out: DeviceBuffer,
    compute: Stream,
    copy: Stream,
    act_stream: Stream,
    act: DeviceBuffer,
    y_hits: DeviceBuffer,
    /// Fetched misses' outputs, one buffer per chunk ([`FetchChunks`]); in fixed order the
    /// CPU's rows go to the first.
    y_fetched: Vec<DeviceBuffer>,
    y_cpu: DeviceBuffer,
    x_host: HostBuffer,
    y_host: HostBuffer,
    cpu_x: Vec<f32>,
    exec: Option<CpuExecutor>,
    workers: Range<usize>,
    template: ExpertStep,
    /// Events of one layer: router done, inputs ready, activations down.
    ev: [Event; 3],
    /// Copy stream, after each chunk of a layer's gathers (its fetched step waits for it).
    landed: Vec<Event>,
    /// Combine timing events (GPU 0, NCCL), one pair per layer.
    combine_ev: Vec<(Event, Event)>,
}

/// The combine's implementation.
enum Combiner {
    None,
    Host,
    #[cfg(feature = "cuda")]
    Nccl(crate::device::cuda::NcclComms),
}

/// The multi-GPU decode engine (see the module docs).
pub struct MultiEngine {
    layout: GpuLayout,
    model: ModelSpec,
    config: EngineConfig,
    fetch: f64,
    alpha: f32,
    dense_post_bytes: usize,
    /// Whole experts: the sharded gathers' source and the CPU kernels'.
    bank: HostBank,
    gpus: Vec<GpuPart>,
    combiner: Combiner,
    /// Host scratch of the host combine (the running sum), f32.
    sum: Vec<f32>,
    steps_run: u64,
}

impl std::fmt::Debug for MultiEngine {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MultiEngine")
            .field("model", &self.model.name)
            .field("gpus", &self.layout.gpus)
            .field("placement", &self.layout.placement)
            .field("strategy", &self.config.strategy)
            .field("combine", &self.combine_method())
            .finish()
    }
}

impl MultiEngine {
    /// Build an engine over `devices` (one per GPU of `layout`, opened with
    /// [`Device::open_group`]) for `model` with `config`. `config.cache_slots` is the
    /// slots of each GPU's cache (a slice each under tensor parallelism:
    /// [`GpuLayout::slots_per_gpu`] turns a byte budget into it) and `config.threads` the
    /// CPU workers of all GPUs together. Errors: a device count other than `layout.gpus`,
    /// a tensor-parallel split the geometry cannot take, fewer CPU workers than GPUs for a
    /// strategy with a CPU share, and everything [`super::Engine::new`] refuses.
    pub fn new(
        devices: &[Device],
        layout: GpuLayout,
        model: &ModelSpec,
        config: &EngineConfig,
    ) -> Result<MultiEngine> {
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
        if config.strategy.kind().takes_cpu_layers() {
            return Err(RuntimeError::invalid(
                "--gpus",
                format!(
                    "{} runs on one GPU for now (its resident layers are not yet placed on \
                     several)",
                    config.strategy
                ),
            ));
        }
        // The folded combine and the gated last chunk are the single-GPU engine's pipeline
        // and do not apply here: each GPU's combine follows the peers' partial rows, not its
        // last chunk, and each chunk's kernel waits for its copies' event.
        let fetch = resolve_fetch(&config.strategy)?;
        let kind = config.strategy.kind();
        let tp = layout.placement == GpuPlacement::TensorParallel && n > 1;
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
        if fetch < 1.0 {
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
        let bank = HostBank::from_seed(&devices[0], model.format, &g, config.seed)?;
        let counts = slot_counts(model, config);
        let (cache_slots, staging_slots) = (counts.cache, counts.staging);
        let planned = EngineMemory::of(model, config);
        let reserve = config.reserve_bytes + planned.dense_bytes + planned.activation_bytes;
        let dense_post_bytes = (2 * g.shared_experts as u64 * g.expert_params())
            .min(model.dense().weight_bytes_per_layer) as usize;
        let row = g.hidden * F32_BYTES;
        let rows = max_rows(model, config);
        let mut gpus = Vec::with_capacity(n);
        for (i, device) in devices.iter().enumerate() {
            let slice_bank = if tp {
                Some(bank.tensor_parallel_slice(device, n, i)?)
            } else {
                None
            };
            let expert_bytes = part_geometry.expert_bytes(model.format);
            let slots = SlotPool::new(
                device,
                expert_bytes,
                (cache_slots + staging_slots).max(1),
                reserve,
            )?;
            let dense = DenseBuffers::new(
                device,
                &model.dense(),
                g.moe_layers,
                config.max_streams,
                config.max_context,
            )?;
            let workers = layout.cpu_workers(i as u32, config.threads);
            let exec = if fetch < 1.0 {
                Some(CpuExecutor::new(workers.len(), config.pool_wait)?)
            } else {
                None
            };
            let ev = [
                device.new_event(false)?,
                device.new_event(false)?,
                device.new_event(false)?,
            ];
            let landed = (0..MAX_FETCH_CHUNKS)
                .map(|_| device.new_event(false))
                .collect::<Result<Vec<_>>>()?;
            let combine_ev = if i == 0 && config.timeline {
                (0..g.moe_layers)
                    .map(|_| Ok((device.new_event(true)?, device.new_event(true)?)))
                    .collect::<Result<Vec<_>>>()?
            } else {
                Vec::new()
            };
            let template = ExpertStep::new(model.format, &part_geometry, config.gpu_path, 0);
            device.warm_up_kernels(&[&template])?;
            gpus.push(GpuPart {
                device: device.clone(),
                slice_bank,
                cache: config.cache_options.build(kind, &g, cache_slots, None)?,
                slots,
                cache_slots,
                staging_slots,
                dense,
                dense_out: device.alloc(DENSE_OUT_BYTES, "dense output")?,
                compute: device.new_stream("compute")?,
                copy: device.new_stream("copy")?,
                act_stream: device.new_stream("activations")?,
                act: device.alloc(rows * row, "expert inputs")?,
                y_hits: device.alloc(rows * row, "hit experts' outputs")?,
                y_fetched: (0..MAX_FETCH_CHUNKS)
                    .map(|_| device.alloc(rows * row, "fetched experts' outputs"))
                    .collect::<Result<Vec<_>>>()?,
                y_cpu: device.alloc(config.max_streams * row, "CPU experts' outputs")?,
                x_host: device.alloc_host(config.max_streams * row, "activations for the CPU")?,
                y_host: device.alloc_host(rows * row, "CPU experts' output rows")?,
                cpu_x: Vec::new(),
                exec,
                workers,
                template,
                ev,
                landed,
                combine_ev,
            });
        }
        let combiner = if n == 1 {
            Combiner::None
        } else {
            open_combiner(devices)
        };
        let mut engine = MultiEngine {
            layout,
            model: model.clone(),
            config: config.clone(),
            fetch,
            alpha: residual_scale(g.moe_layers),
            dense_post_bytes,
            bank,
            gpus,
            combiner,
            sum: Vec::new(),
            steps_run: 0,
        };
        engine.load_resident()?;
        Ok(engine)
    }

    /// Copy every expert each cache holds from the start (resident, a static hot set).
    fn load_resident(&mut self) -> Result<()> {
        for p in &self.gpus {
            let bank = p.slice_bank.as_ref().unwrap_or(&self.bank);
            let moves: Vec<_> = p.cache.resident().map(|(slot, id)| (id, slot)).collect();
            let regions = gather::regions(bank, &p.slots, &moves)?;
            if !regions.is_empty() {
                p.copy
                    .copy_h2d_regions(bank.buffer(), p.slots.buffer(), &regions)?;
                p.copy.synchronize()?;
            }
        }
        Ok(())
    }

    /// The layout.
    pub fn layout(&self) -> GpuLayout {
        self.layout
    }

    /// The model.
    pub fn model(&self) -> &ModelSpec {
        &self.model
    }

    /// The configuration.
    pub fn config(&self) -> &EngineConfig {
        &self.config
    }

    /// GPU `gpu`'s expert cache (its counters and contents).
    pub fn cache(&self, gpu: usize) -> Option<&ExpertCache> {
        self.gpus.get(gpu).map(|p| &p.cache)
    }

    /// GPU `gpu`'s device.
    pub fn device(&self, gpu: usize) -> Option<&Device> {
        self.gpus.get(gpu).map(|p| &p.device)
    }

    /// The shared bank of whole experts.
    pub fn bank(&self) -> &HostBank {
        &self.bank
    }

    /// Bytes of one expert as GPU `gpu` stores and gathers it (a slice under tensor
    /// parallelism).
    pub fn expert_bytes_per_gpu(&self) -> usize {
        self.gpus[0].slots.expert_bytes()
    }

    /// The CPU worker range of each GPU's pool ([`GpuLayout::cpu_workers`]); empty ranges
    /// for a strategy without a CPU share are still reported.
    pub fn cpu_workers(&self) -> Vec<Range<usize>> {
        self.gpus.iter().map(|p| p.workers.clone()).collect()
    }

    /// Threads of each GPU's CPU pool (0: no pool).
    pub fn pool_threads(&self) -> Vec<usize> {
        self.gpus
            .iter()
            .map(|p| p.exec.as_ref().map_or(0, |e| e.threads()))
            .collect()
    }

    /// How the partial outputs are combined.
    pub fn combine_method(&self) -> CombineMethod {
        match self.combiner {
            Combiner::None => CombineMethod::None,
            Combiner::Host => CombineMethod::Host,
            #[cfg(feature = "cuda")]
            Combiner::Nccl(_) => CombineMethod::Nccl,
        }
    }

    /// Steps run since the engine was built.
    pub fn steps_run(&self) -> u64 {
        self.steps_run
    }

    fn check_input(&self, input: &StepInput<'_>) -> Result<usize> {
        super::check_step_input(&self.model, &self.config, input)
    }

    /// Plan layer `l` on GPU `gpu` (updating its cache) with the routes it holds
    /// ([`GpuLayout::routes_on`]) and turn the plan into its work. The output rows keep
    /// each expert's top-k position in the layer's full `routes`, so that every GPU writes
    /// the rows the single engine would and the fixed-order tree sums them in the same order.
    fn plan_gpu(
        &mut self,
        gpu: usize,
        l: usize,
        routes: &[TokenRoute],
        rows: Rows,
    ) -> Result<super::work::LayerWork> {
        let n = self.layout.count();
        let p = &mut self.gpus[gpu];
        let mine = self.layout.routes_on(gpu as u32, routes);
        let mut plan = plan_layer(l, &mine, &mut p.cache, self.fetch);
        let misses = plan.misses() as u32;
        if self.layout.placement == GpuPlacement::TensorParallel && n > 1 {
            // Every GPU planned the same CPU experts; this GPU computes every n-th.
            plan.cpu = plan
                .cpu
                .into_iter()
                .enumerate()
                .filter(|(i, _)| i % n == gpu)
                .map(|(_, w)| w)
                .collect();
        }
        let cx = BuildContext {
            rows,
            slots: &p.slots,
            cache_slots: p.cache_slots,
            staging_slots: p.staging_slots,
            weight_scale: self.alpha,
            template: &p.template,
            hidden: self.model.geometry.hidden,
        };
        let mut work = build_layer(&plan, routes, &cx)?;
        // The cache's misses, whoever computes them (tensor parallelism deals CPU experts out).
        work.counts.misses = misses;
        Ok(work)
    }

    /// Run one decode step on every GPU in lockstep (see the module docs).
    pub fn step(&mut self, input: &StepInput<'_>) -> Result<MultiStepResult> {
        let b = self.check_input(input)?;
        let geo = self.model.geometry;
        let (h, k, layers) = (geo.hidden, geo.top_k, geo.moe_layers);
        let n = self.layout.count();
        let rows = Rows {
            order: self.config.combine,
            streams: b,
            top_k: k,
        };
        let block = b * h;
        let n_rows = rows.count();
        let clock = self.gpus[0].device.clock();
        self.steps_run += 1;
        let t0 = clock.now_us();
        let mut stats = vec![GpuStep::default(); n];
        let mut combine_us = 0.0;
        let combine_bytes = self.layout.combine_bytes_per_gpu(n_rows, h);
        let flat: Vec<f32> = input.inputs.concat();
        for p in &mut self.gpus {
            if let Some(e) = p.exec.as_mut() {
                e.begin_step();
            }
            p.compute.upload_f32(&flat, &p.act, 0)?;
        }

        for l in 0..layers {
            let routes = &input.routing.layers[l];
            let mut works = Vec::with_capacity(n);
            for (gpu, st) in stats.iter_mut().enumerate() {
                let w = self.plan_gpu(gpu, l, routes, rows)?;
                st.counts.add_layer(&w.counts);
                st.counts.combine_bytes += combine_bytes;
                works.push(w);
            }
            // 1-4 on every GPU: dense part, expert inputs, activations down, gathers, experts.
            let mut fetched_chunks = vec![0; n];
            for (gpu, work) in works.iter().enumerate() {
                let p = &self.gpus[gpu];
                let bank = p.slice_bank.as_ref().unwrap_or(&self.bank);
                let [router, inputs, down] = &p.ev;
                let reads = p.dense.reads(l, input.contexts)?;
                let (pre, post) = split_dense(reads, self.dense_post_bytes);
                if !pre.is_empty() {
                    p.compute.launch_dense(&pre, &p.dense_out)?;
                }
                p.compute.record(router)?;
                // The first chunk's gathers right after the router, before the input rows
                // and the activations for the CPU, the rest after them (as the single-GPU
                // engine issues them): the link starts as soon as the router has run.
                let fetch =
                    FetchChunks::of(work, &p.slots, self.config.settings.fetch_chunks, None);
                let link = !work.moves.is_empty();
                let method = self.config.gather;
                if link {
                    p.copy.wait(router)?;
                    fetch.gather(0, &p.copy, bank, method, &p.landed[0])?;
                }
                if rows.order == CombineOrder::Fixed {
                    for (src, dst, nb) in replicate_rounds(k) {
                        p.compute.copy_d2d(
                            &p.act,
                            src * block * F32_BYTES,
                            &p.act,
                            dst * block * F32_BYTES,
                            nb * block * F32_BYTES,
                        )?;
                    }
                }
                p.compute.record(inputs)?;
                let cpu = !work.cpu.is_empty();
                if cpu {
                    p.act_stream.wait(inputs)?;
                    p.act_stream
                        .copy_d2h(&p.act, 0, &p.x_host, 0, block * F32_BYTES)?;
                    p.act_stream.record(down)?;
                }
                if link {
                    for c in 1..fetch.len() {
                        fetch.gather(c, &p.copy, bank, method, &p.landed[c])?;
                    }
                }
                if !post.is_empty() {
                    p.compute.launch_dense(&post, &p.dense_out)?;
                }
                p.compute
                    .launch_experts(&work.hits, p.slots.buffer(), &p.act, &p.y_hits)?;
                if link || (cpu && rows.order == CombineOrder::Fixed) {
                    fetch.compute(&p.compute, &p.act, &p.y_fetched, |c| &p.landed[c])?;
                    fetched_chunks[gpu] = fetch.len();
                }
            }
            // 5. The CPU shares: every GPU's on its own pool, at the same time.
            self.run_cpu_shares(&works, rows, &mut stats)?;
            // 6a. Each GPU's partial rows into y_hits.
            for (gpu, work) in works.iter().enumerate() {
                let p = &self.gpus[gpu];
                for part in &p.y_fetched[..fetched_chunks[gpu]] {
                    p.compute.add_f32(&p.y_hits, 0, part, 0, n_rows * h)?;
                }
                if !work.cpu.is_empty() && rows.order == CombineOrder::Fast {
                    p.compute.add_f32(&p.y_hits, 0, &p.y_cpu, 0, block)?;
                }
            }
            // 6b. The combine.
            combine_us += self.combine(l, n_rows * h)?;
            // 6c. The tree and the residual add, on identical rows on every GPU.
            for p in &self.gpus {
                match rows.order {
                    CombineOrder::Fixed => {
                        p.compute.combine_fixed(&p.act, &p.y_hits, &[], block, k)?
                    }
                    CombineOrder::Fast => p.compute.add_f32(&p.act, 0, &p.y_hits, 0, block)?,
                }
            }
        }
        let flat = self.gpus[0]
            .compute
            .download_f32(&self.gpus[0].act, 0, block)?;
        for p in &mut self.gpus {
            p.compute.synchronize()?;
            if let Some(e) = p.exec.as_mut() {
                e.end_step();
            }
        }
        if matches!(self.combine_method(), CombineMethod::Nccl) {
            for (a, z) in &self.gpus[0].combine_ev {
                combine_us += a.elapsed_us(z)?;
            }
        }
        Ok(MultiStepResult {
            outputs: flat.chunks_exact(h).map(|c| c.to_vec()).collect(),
            gpus: stats,
            wall_us: clock.now_us() - t0,
            combine_us,
            warmup: input.warmup,
        })
    }

    /// Run every GPU's CPU share of a layer, each on its own pool, from one host thread
    /// per GPU with work (the calling thread when only one has any).
    fn run_cpu_shares(
        &mut self,
        works: &[super::work::LayerWork],
        rows: Rows,
        stats: &mut [GpuStep],
    ) -> Result<()> {
        let with_cpu: Vec<usize> = (0..works.len())
            .filter(|&g| !works[g].cpu.is_empty())
            .collect();
        if with_cpu.is_empty() {
            return Ok(());
        }
        let (bank, model, path) = (&self.bank, &self.model, self.config.cpu_path);
        let clock = self.gpus[0].device.clock();
        let one = |p: &mut GpuPart, work: &super::work::LayerWork| -> Result<f64> {
            while !p.ev[2].is_complete()? {
                std::hint::spin_loop();
            }
            let t = clock.now_us();
            run_cpu(
                CpuSide {
                    exec: p.exec.as_mut(),
                    bank,
                    model,
                    path,
                    x_host: &p.x_host,
                    y_host: &mut p.y_host,
                    cpu_x: &mut p.cpu_x,
                },
                work,
                rows,
                // Every GPU's work is queued before any CPU share starts (see the module docs).
                &mut || {},
            )?;
            let us = clock.now_us() - t;
            let dst = match rows.order {
                CombineOrder::Fixed => &p.y_fetched[0],
                CombineOrder::Fast => &p.y_cpu,
            };
            p.compute
                .gather_zero_copy(&p.y_host, dst, &work.cpu.scatter)?;
            Ok(us)
        };
        let mut times = vec![0.0; works.len()];
        if with_cpu.len() == 1 {
            let g = with_cpu[0];
            times[g] = one(&mut self.gpus[g], &works[g])?;
        } else {
            let results: Vec<(usize, Result<f64>)> = std::thread::scope(|s| {
                let handles: Vec<_> = self
                    .gpus
                    .iter_mut()
                    .enumerate()
                    .filter(|(g, _)| !works[*g].cpu.is_empty())
                    .map(|(g, p)| {
                        let work = &works[g];
                        let one = &one;
                        (g, s.spawn(move || one(p, work)))
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
        }
        for (s, t) in stats.iter_mut().zip(times) {
            s.cpu_us += t;
        }
        Ok(())
    }

    /// Sum the GPUs' first `n` f32 of `y_hits` and give every GPU the sum; returns the
    /// host-measured time of a host combine, us (0 for NCCL, timed by events).
    fn combine(&mut self, layer: usize, n: usize) -> Result<f64> {
        #[cfg(not(feature = "cuda"))]
        let _ = layer;
        match &self.combiner {
            Combiner::None => Ok(0.0),
            Combiner::Host => {
                let clock = self.gpus[0].device.clock();
                let t = clock.now_us();
                self.sum.clear();
                self.sum.resize(n, 0.0);
                // In GPU order, so the rounding is fixed: ((y0 + y1) + y2) + ...
                for (i, p) in self.gpus.iter().enumerate() {
                    let part = p.compute.download_f32(&p.y_hits, 0, n)?;
                    if i == 0 {
                        self.sum.copy_from_slice(&part);
                    } else {
                        self.sum.iter_mut().zip(&part).for_each(|(a, b)| *a += b);
                    }
                }
                for p in &self.gpus {
                    p.compute.upload_f32(&self.sum, &p.y_hits, 0)?;
                }
                Ok(clock.now_us() - t)
            }
            #[cfg(feature = "cuda")]
            Combiner::Nccl(comms) => {
                let timed = self.gpus[0].combine_ev.get(layer);
                if let Some((a, _)) = timed {
                    self.gpus[0].compute.record(a)?;
                }
                let parts: Vec<(&Stream, &DeviceBuffer)> =
                    self.gpus.iter().map(|p| (&p.compute, &p.y_hits)).collect();
                comms.all_reduce_sum_f32(&parts, n)?;
                if let Some((_, z)) = timed {
                    self.gpus[0].compute.record(z)?;
                }
                Ok(0.0)
            }
        }
    }
}

/// The combine for `devices`: NCCL on CUDA when the library loads (its absence is logged
/// and the host combine used), the host combine otherwise.
fn open_combiner(devices: &[Device]) -> Combiner {
    #[cfg(feature = "cuda")]
    if devices[0].kind() == DeviceKind::Cuda {
        let ordinals: Vec<usize> = devices.iter().map(|d| d.info().ordinal).collect();
        match crate::device::cuda::NcclComms::new(&ordinals) {
            Ok(c) => {
                tracing::info!(gpus = ordinals.len(), "combine: NCCL all-reduce");
                return Combiner::Nccl(c);
            }
            Err(reason) => {
                tracing::warn!(
                    "combine through the host (D2H + sum + H2D): NCCL unavailable: {reason}"
                );
            }
        }
    }
    let _ = devices;
    Combiner::Host
}

/// What a multi-GPU decode run produced.
#[derive(Debug, Clone)]
pub struct MultiDecoded {
    /// Every step, warm-up first.
    pub steps: Vec<MultiStepResult>,
}

impl MultiDecoded {
    /// The measured steps' outputs.
    pub fn outputs(&self) -> Vec<StepOutputs> {
        self.steps
            .iter()
            .filter(|s| !s.warmup)
            .map(|s| s.outputs.clone())
            .collect()
    }

    /// Per GPU, the measured steps' counts summed.
    pub fn counts(&self) -> Vec<GpuCounts> {
        let n = self.steps.first().map_or(0, |s| s.gpus.len());
        let mut out = vec![GpuCounts::default(); n];
        for s in self.steps.iter().filter(|s| !s.warmup) {
            for (o, g) in out.iter_mut().zip(&s.gpus) {
                o.add(&g.counts);
            }
        }
        out
    }
}

/// Run `warmup` then `measured` steps on a multi-GPU engine, with the inputs and contexts
/// [`super::decode`] gives a single engine (so the outputs are comparable step by step).
/// `progress` is called after each step with (steps done, steps in all).
pub fn decode_multi(
    engine: &mut MultiEngine,
    warmup: &[ft_model::routing::StepRouting],
    measured: &[ft_model::routing::StepRouting],
    options: &DecodeOptions,
    progress: &mut dyn FnMut(usize, usize),
) -> Result<MultiDecoded> {
    let hidden = engine.model().geometry.hidden;
    let total = warmup.len() + measured.len();
    let mut steps = Vec::with_capacity(total);
    let phases = [
        (warmup, true, options.input_seed ^ INPUT_SALT_WARMUP),
        (measured, false, options.input_seed),
    ];
    for (list, is_warmup, seed) in phases {
        for (i, routing) in list.iter().enumerate() {
            let b = routing.streams();
            let contexts = vec![options.context + steps.len(); b];
            let inputs: Vec<Vec<f32>> = (0..b)
                .map(|s| token_input(seed, s, i as u64, hidden))
                .collect();
            steps.push(engine.step(&StepInput {
                routing,
                contexts: &contexts,
                inputs: &inputs,
                warmup: is_warmup,
            })?);
            progress(steps.len(), total);
        }
    }
    Ok(MultiDecoded { steps })
}
