//! The cost terms: durations of the pieces of a decode step, as pure functions of
//! [`PerfParams`].
//!
//! These are the only place where a parameter becomes a duration. The analytic step
//! ([`super::step`]) combines them into a critical path; the simulator schedules them as
//! events; the fit ([`super::fit`]) inverts them. Counts (experts, tokens) are `f64` so that a
//! term can be evaluated on means as well as on one layer's integers; a count of zero costs
//! nothing (no launch, no fixed cost).
//!
//! DRAM contention (design mechanism 3): CPU expert kernels and gather DMA both read host
//! DRAM. Each asks for its isolated rate; when the two together ask for more than
//! `dram_gbs`, `dram_gbs` is split in proportion to `weight x demand` (CPU weight 1, DMA
//! weight `dma_dram_weight`), and a side given more than it asks keeps only what it asks
//! (the rest goes to the other). Only the byte-streaming parts of the two sides read DRAM;
//! fixed costs and the per-token compute do not contend.

use serde::{Deserialize, Serialize};

use super::step::LayerCounts;
use super::{PerfParams, ACTIVATION_BYTES_PER_ELEMENT};
use crate::placement::GpuPlacement;
use crate::preset::{DenseSpec, ModelSpec};

/// Bytes per microsecond in one GB/s (1e9 B/s = 1e3 B/us).
pub const BYTES_PER_US_PER_GBS: f64 = 1e3;

/// Multiply-accumulates per microsecond in one GMAC/s.
pub const MACS_PER_US_PER_GMACS: f64 = 1e3;

/// Size of one routed expert: what a gather moves and what a kernel reads and computes.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ExpertShape {
    /// Bytes of the expert's weights.
    pub bytes: f64,
    /// Multiply-accumulates of one token through the expert.
    pub macs: f64,
}

impl ExpertShape {
    /// The routed-expert shape of a model.
    pub fn of(model: &ModelSpec) -> Self {
        ExpertShape {
            bytes: model.expert_bytes() as f64,
            macs: model.geometry.expert_macs_per_token() as f64,
        }
    }
}

/// [`PerfParams::dram_shares`] with the DRAM bandwidth `dram_gbs` (GB/s) and DMA weight
/// `dma_weight` given: the one formula of the module docs, for the simulator's shared DRAM.
pub fn dram_shares_of(
    dram_gbs: f64,
    dma_weight: f64,
    cpu_demand_gbs: f64,
    dma_demand_gbs: f64,
) -> (f64, f64) {
    let (c, g, d) = (cpu_demand_gbs.max(0.0), dma_demand_gbs.max(0.0), dram_gbs);
    if c + g <= d || c == 0.0 || g == 0.0 {
        return (c, g);
    }
    let w = dma_weight;
    let cpu = d * c / (c + w * g);
    let dma = d * w * g / (c + w * g);
    if cpu > c {
        (c, d - c)
    } else if dma > g {
        (d - g, g)
    } else {
        (cpu, dma)
    }
}

/// Relative tolerance at which two byte streams of [`PerfParams::overlapped_gpus`] count as
/// ending together (a rounding error of the fluid's arithmetic).
const FLUID_END_REL: f64 = 1e-12;

/// One GPU's byte streams in a layer of several GPUs (see [`PerfParams::overlapped_gpus`]).
#[derive(Debug, Clone, Copy, PartialEq, Default, Serialize, Deserialize)]
pub struct GpuStreams {
    /// Experts (slices under tensor parallelism) this GPU gathers over its own link.
    pub gather_experts: f64,
    /// Experts (slices) of this GPU's CPU share.
    pub cpu_experts: f64,
    /// (token, expert) pairs of the CPU share.
    pub cpu_tokens: f64,
    /// CPU workers of this GPU's share ([`crate::GpuLayout::cpu_workers`]).
    pub threads: f64,
}

/// A layer's fetched experts on the GPU, in the runtime's chunks
/// ([`PerfParams::fetched_kernels`]).
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct FetchedKernels {
    /// The launches of every chunk but the last, one after another, each launch included,
    /// in us.
    pub early_us: f64,
    /// How many chunks come before the last (0 or more).
    pub early_chunks: usize,
    /// The last chunk's launch, launch included, in us (0 without fetched experts).
    pub last_us: f64,
    /// Of `last_us`, the launch itself (`gpu_launch_us`; 0 without fetched experts): on one
    /// GPU the runtime gates the last chunk on a flag, so this part overlaps the gather
    /// ([`crate::perf::step`], point 3).
    pub last_launch_us: f64,
}

/// The two sides of a hybrid layer run at once (see [`PerfParams::overlapped`]).
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct Overlap {
    /// Duration of the gather, from its start, in us.
    pub gather_us: f64,
    /// Duration of the CPU expert step, from its start, in us.
    pub cpu_us: f64,
    /// Time the gather lost to contention, in us.
    pub gather_lost_us: f64,
    /// Time the CPU lost to contention, in us.
    pub cpu_lost_us: f64,
}

impl PerfParams {
    // ------------------------------------------------------------------ gather

    /// Fixed part of a gather of `experts` experts: one layer cost and one copy cost each, in
    /// us (0 for no expert).
    pub fn gather_fixed_us(&self, experts: f64) -> f64 {
        if experts <= 0.0 {
            return 0.0;
        }
        self.gather_layer_us + experts * self.gather_copy_us
    }

    /// Byte-streaming part of a gather of `experts` experts of `bytes` bytes, alone, in us.
    pub fn gather_stream_us(&self, experts: f64, bytes: f64) -> f64 {
        experts.max(0.0) * bytes / (self.gather_gbs * BYTES_PER_US_PER_GBS)
    }

    /// Time of a gather of `experts` experts of `bytes` bytes each over the link, alone, in
    /// us: `gather_layer_us + n (gather_copy_us + b / gather_gbs)`.
    pub fn gather_us(&self, experts: f64, bytes: f64) -> f64 {
        self.gather_fixed_us(experts) + self.gather_stream_us(experts, bytes)
    }

    /// Time of the same gather while a CPU expert kernel of `cpu_threads` threads streams
    /// weights throughout (the `gather` probe, contended), in us.
    pub fn gather_contended_us(&self, experts: f64, bytes: f64, cpu_threads: f64) -> f64 {
        let (_, dma) = self.dram_shares(self.cpu_rate_gbs(cpu_threads), self.gather_gbs);
        self.gather_fixed_us(experts)
            + self.gather_stream_us(experts, bytes) * self.gather_gbs / dma
    }

    /// The host thread's own time in one layer doing `c` at `streams` streams, in us: the
    /// fitted [`HostCost`](crate::perf::HostCost) (`layer_us + expert_us x (hits + fetched) + cpu_expert_us x cpu +
    /// stream_us x streams`), and never less than issuing the layer's gather
    /// ([`PerfParams::gather_fixed_us`]: the `gather` probe's per-layer and per-copy costs,
    /// timed from the first copy's submission), which is all a profile without the fitted
    /// term has.
    pub fn host_layer_us(&self, c: &LayerCounts, streams: f64) -> f64 {
        let h = &self.host;
        let fitted = h.layer_us
            + h.expert_us * (c.hits + c.fetched)
            + h.cpu_expert_us * c.cpu
            + h.stream_us * streams;
        fitted.max(self.gather_fixed_us(c.fetched))
    }

    /// Time the CPU share of a layer waits for the host beyond the layer's dense part, in
    /// us: the runtime's one host thread plans and submits the layer's GPU work (the
    /// gather's copies among it) and, after the CPU share, the merge and the combine
    /// ([`PerfParams::host_layer_us`]), and it is one of the CPU pool's workers, so none of
    /// that overlaps the CPU share. Submitting runs while the GPU computes the dense part,
    /// so the CPU path waits for what the host's time takes beyond it. `dense_us` is the
    /// layer's dense part, in us.
    pub fn host_issue_wait_us(&self, c: &LayerCounts, streams: f64, dense_us: f64) -> f64 {
        (self.host_layer_us(c, streams) - dense_us).max(0.0)
    }

    // ------------------------------------------------------------------ CPU

    /// Weight-streaming rate of the CPU expert kernel at `threads` threads, in GB/s.
    pub fn cpu_rate_gbs(&self, threads: f64) -> f64 {
        let t = (threads / self.cpu_threads as f64).max(0.0);
        self.cpu_gbs * t.powf(self.cpu_thread_exponent)
    }

    /// The CPU share's serving slowdown at `threads` threads, dimensionless: linear in
    /// threads between the measured counts ([`PerfParams::cpu_serving_slowdown_at`] and
    /// `cpu_threads` itself), flat beyond them.
    pub fn serving_slowdown(&self, threads: f64) -> f64 {
        let mut knots: Vec<(f64, f64)> = self
            .cpu_serving_slowdown_at
            .iter()
            .filter(|k| k.threads != self.cpu_threads)
            .map(|k| (k.threads as f64, k.slowdown))
            .collect();
        knots.push((self.cpu_threads as f64, self.cpu_serving_slowdown));
        knots.sort_by(|a, b| a.0.total_cmp(&b.0));
        let (first, last) = (knots[0], knots[knots.len() - 1]);
        if threads <= first.0 {
            return first.1;
        }
        if threads >= last.0 {
            return last.1;
        }
        let i = knots.partition_point(|k| k.0 < threads);
        let (a, b) = (knots[i - 1], knots[i]);
        a.1 + (b.1 - a.1) * (threads - a.0) / (b.0 - a.0)
    }

    /// These parameters re-expressed for a pool of `threads` threads: the streaming rate,
    /// the per-expert cost and the token rate along their thread laws
    /// ([`PerfParams::cpu_rate_gbs`], [`PerfParams::cpu_expert_cost_us`],
    /// [`PerfParams::cpu_token_rate_gmacs`]), the serving slowdown at that count
    /// ([`PerfParams::serving_slowdown`]; the measured counts are kept, so the interpolation
    /// is the same function afterwards), `cpu_threads = threads`; every other parameter as
    /// it is. The profile's version ([`crate::profile::Profile::at_threads`]) also carries
    /// the covariance and prefers a rate measured at that very count.
    pub fn at_threads(&self, threads: u32) -> PerfParams {
        let t = threads as f64;
        let mut q = self.clone();
        q.cpu_gbs = self.cpu_rate_gbs(t);
        q.cpu_token_gmacs = self.cpu_token_rate_gmacs(t);
        q.cpu_expert_us = self.cpu_expert_cost_us(t);
        q.cpu_serving_slowdown = self.serving_slowdown(t);
        if threads != self.cpu_threads && !self.cpu_serving_slowdown_at.is_empty() {
            // The serving count becomes a knot of the table, the new count leaves it.
            q.cpu_serving_slowdown_at.retain(|k| k.threads != threads);
            q.cpu_serving_slowdown_at.push(super::ThreadSlowdown {
                threads: self.cpu_threads,
                slowdown: self.cpu_serving_slowdown,
                se: f64::NAN,
            });
            q.cpu_serving_slowdown_at.sort_by_key(|k| k.threads);
        }
        q.cpu_threads = threads;
        q
    }

    /// These parameters with the CPU side at `speed` times its probed speed: its streaming
    /// and per-token rates (`cpu_gbs`, `cpu_token_gmacs`) times `speed`, its fixed costs per
    /// layer and per expert (`cpu_layer_us`, `cpu_expert_us`) divided by it; the link, the
    /// GPU, the DRAM the CPU shares with DMA and the calibrated overheads as they are. A
    /// what-if: "the machine's CPU side ran at this share of what the probe saw" (for example
    /// a same-run STREAM read over the probe's, `ft predict --cpu-speed`). `speed` must be a
    /// positive number.
    pub fn with_cpu_speed(&self, speed: f64) -> crate::error::Result<PerfParams> {
        if !(speed.is_finite() && speed > 0.0) {
            return Err(crate::ModelError::invalid(
                "CPU speed",
                format!("{speed} is not a positive number"),
            ));
        }
        let mut q = self.clone();
        q.cpu_gbs *= speed;
        q.cpu_token_gmacs *= speed;
        q.cpu_layer_us /= speed;
        q.cpu_expert_us /= speed;
        Ok(q)
    }

    /// Cost of each expert beyond streaming its bytes at `threads` threads, in us: the
    /// measured `cpu_expert_us` scaled by the streaming rate's thread law.
    pub fn cpu_expert_cost_us(&self, threads: f64) -> f64 {
        let t = (threads / self.cpu_threads as f64).max(1e-9);
        self.cpu_expert_us / t.powf(self.cpu_thread_exponent)
    }

    /// Per-token compute rate of the CPU at `threads` threads (linear in threads), in
    /// GMAC/s.
    pub fn cpu_token_rate_gmacs(&self, threads: f64) -> f64 {
        self.cpu_token_gmacs * (threads / self.cpu_threads as f64).max(0.0)
    }

    /// Fixed and compute part of a CPU expert step (not DRAM-bound), in us: the layer cost,
    /// a cost per expert, and the tokens after each expert's first (`tokens` counts every
    /// (token, expert) pair; the first token of each expert is in the streaming rate).
    pub fn cpu_fixed_us(&self, experts: f64, tokens: f64, shape: ExpertShape, threads: f64) -> f64 {
        if experts <= 0.0 {
            return 0.0;
        }
        let extra_tokens = (tokens - experts).max(0.0);
        self.cpu_layer_us
            + experts * self.cpu_expert_cost_us(threads)
            + extra_tokens * shape.macs
                / (self.cpu_token_rate_gmacs(threads) * MACS_PER_US_PER_GMACS)
    }

    /// Weight-streaming part of a CPU expert step, alone, in us.
    pub fn cpu_stream_us(&self, experts: f64, shape: ExpertShape, threads: f64) -> f64 {
        experts.max(0.0) * shape.bytes / (self.cpu_rate_gbs(threads) * BYTES_PER_US_PER_GBS)
    }

    /// Weight-streaming part of the CPU share of a decode layer, alone, in us: the isolated
    /// probe's [`PerfParams::cpu_stream_us`] times `1 + cpu_serving_slowdown` (what the
    /// end-to-end calibration measured beyond the probe's isolated call).
    pub fn cpu_serving_stream_us(&self, experts: f64, shape: ExpertShape, threads: f64) -> f64 {
        self.cpu_stream_us(experts, shape, threads) * (1.0 + self.serving_slowdown(threads))
    }

    /// How much longer a decode layer's gather streams beside a CPU share of `threads`
    /// threads than the contended probe's, as a factor: `1 + link_serving_slowdown x
    /// cpu_rate(threads) / cpu_rate(cpu_threads)` (the slowdown is measured at the serving
    /// threads and follows the pool's DRAM demand elsewhere).
    pub fn link_serving_factor(&self, threads: f64) -> f64 {
        let serving = self.cpu_rate_gbs(self.cpu_threads as f64);
        let demand = if serving > 0.0 {
            self.cpu_rate_gbs(threads) / serving
        } else {
            1.0
        };
        1.0 + self.link_serving_slowdown * demand
    }

    /// Time of the CPU share of a decode layer over `experts` experts serving `tokens`
    /// (token, expert) pairs with `threads` threads, alone, in us: [`PerfParams::cpu_fixed_us`]
    /// plus [`PerfParams::cpu_serving_stream_us`] (the `cpu-step` probe's time with the
    /// serving slowdown on its stream).
    pub fn cpu_share_us(&self, experts: f64, tokens: f64, shape: ExpertShape, threads: f64) -> f64 {
        self.cpu_fixed_us(experts, tokens, shape, threads)
            + self.cpu_serving_stream_us(experts, shape, threads)
    }

    /// Time of a CPU expert step over `experts` experts serving `tokens` (token, expert)
    /// pairs with `threads` threads, alone, in us: memory-bound bytes over bandwidth plus
    /// per-expert and per-token compute plus the per-layer fixed cost.
    pub fn cpu_step_us(&self, experts: f64, tokens: f64, shape: ExpertShape, threads: f64) -> f64 {
        self.cpu_fixed_us(experts, tokens, shape, threads)
            + self.cpu_stream_us(experts, shape, threads)
    }

    /// Time of the same CPU step while a gather streams throughout (the `cpu-step` probe,
    /// contended), in us.
    pub fn cpu_step_contended_us(
        &self,
        experts: f64,
        tokens: f64,
        shape: ExpertShape,
        threads: f64,
    ) -> f64 {
        let demand = self.cpu_rate_gbs(threads);
        let (cpu, _) = self.dram_shares(demand, self.gather_gbs);
        self.cpu_fixed_us(experts, tokens, shape, threads)
            + self.cpu_stream_us(experts, shape, threads) * demand / cpu
    }

    // ------------------------------------------------------------------ contention

    /// The DRAM rates CPU kernels and DMA get when they ask for `cpu_demand_gbs` and
    /// `dma_demand_gbs` at once, in GB/s (see the module docs): `(cpu, dma)`.
    pub fn dram_shares(&self, cpu_demand_gbs: f64, dma_demand_gbs: f64) -> (f64, f64) {
        dram_shares_of(
            self.dram_gbs,
            self.dma_dram_weight,
            cpu_demand_gbs,
            dma_demand_gbs,
        )
    }

    /// A gather of `gather_experts` experts and a CPU step of `cpu_experts` experts
    /// (`cpu_tokens` pairs, `threads` threads) started together, in us.
    ///
    /// Both byte streams are assumed to start at the same time (their fixed costs are added
    /// after, which overstates the overlap slightly and so the contention): while both
    /// stream, each runs at its contended rate ([`PerfParams::dram_shares`]); when one
    /// finishes the other continues alone at its isolated rate. Both streams are the decode
    /// layer's: the CPU's with its serving slowdown ([`PerfParams::cpu_serving_stream_us`]),
    /// the gather's, where a CPU share runs beside it, with the link's
    /// ([`PerfParams::link_serving_factor`]); each is longer at the same DRAM demand.
    pub fn overlapped(
        &self,
        gather_experts: f64,
        cpu_experts: f64,
        cpu_tokens: f64,
        shape: ExpertShape,
        threads: f64,
    ) -> Overlap {
        let sc = self.cpu_serving_stream_us(cpu_experts, shape, threads);
        let sg = self.gather_stream_us(gather_experts, shape.bytes)
            * if sc > 0.0 {
                self.link_serving_factor(threads)
            } else {
                1.0
            };
        let fg = self.gather_fixed_us(gather_experts);
        let fc = self.cpu_fixed_us(cpu_experts, cpu_tokens, shape, threads);
        let (mut end_g, mut end_c) = (sg, sc);
        if sg > 0.0 && sc > 0.0 {
            let demand_c = self.cpu_rate_gbs(threads);
            let (c2, g2) = self.dram_shares(demand_c, self.gather_gbs);
            let slow_c = demand_c / c2;
            let slow_g = self.gather_gbs / g2;
            let (tg, tc) = (sg * slow_g, sc * slow_c);
            if tg <= tc {
                end_g = tg;
                end_c = tg + (sc - tg / slow_c);
            } else {
                end_c = tc;
                end_g = tc + (sg - tc / slow_g);
            }
        }
        Overlap {
            gather_us: fg + end_g,
            cpu_us: fc + end_c,
            gather_lost_us: end_g - sg,
            cpu_lost_us: end_c - sc,
        }
    }

    /// The gathers and CPU shares of several GPUs started together, one [`Overlap`] per
    /// entry of `gpus`: gathers of experts of `gather_shape` (one GPU's slice under tensor
    /// parallelism), CPU shares of `cpu_shape` (whole experts: the CPU computes each whole).
    ///
    /// The generalisation of [`PerfParams::overlapped`] to one link per GPU and a CPU pool
    /// split between them: every byte stream starts at 0; while a set of streams runs, the
    /// DRAM shares are [`PerfParams::dram_shares`] of the summed demands (each CPU share
    /// asks for its workers' isolated rate, each link for `gather_gbs`), and each side's
    /// share is split among its streams in proportion to their demands, so every stream of
    /// a side slows by the same factor. When a stream ends the others are re-rated. With one
    /// GPU this is exactly the two-phase [`PerfParams::overlapped`] (a test checks it).
    pub fn overlapped_gpus(
        &self,
        gpus: &[GpuStreams],
        gather_shape: ExpertShape,
        cpu_shape: ExpertShape,
    ) -> Vec<Overlap> {
        // (remaining alone-time in us, demand in GB/s, is_cpu, gpu) of each stream.
        let mut streams: Vec<(f64, f64, bool, usize)> = Vec::with_capacity(2 * gpus.len());
        let mut alone = vec![(0.0f64, 0.0f64); gpus.len()];
        for (i, g) in gpus.iter().enumerate() {
            let sc = self.cpu_serving_stream_us(g.cpu_experts, cpu_shape, g.threads);
            let sg = self.gather_stream_us(g.gather_experts, gather_shape.bytes)
                * if sc > 0.0 {
                    self.link_serving_factor(g.threads)
                } else {
                    1.0
                };
            alone[i] = (sg, sc);
            if sg > 0.0 {
                streams.push((sg, self.gather_gbs, false, i));
            }
            if sc > 0.0 {
                streams.push((sc, self.cpu_rate_gbs(g.threads), true, i));
            }
        }
        let mut end = vec![(0.0f64, 0.0f64); gpus.len()];
        let mut now = 0.0;
        let mut active: Vec<usize> = (0..streams.len()).collect();
        while !active.is_empty() {
            let (c, d): (f64, f64) = active.iter().fold((0.0, 0.0), |(c, d), &k| {
                let s = &streams[k];
                if s.2 {
                    (c + s.1, d)
                } else {
                    (c, d + s.1)
                }
            });
            let (cs, ds) = self.dram_shares(c, d);
            let speed = |is_cpu: bool| {
                if is_cpu {
                    if c > 0.0 {
                        cs / c
                    } else {
                        1.0
                    }
                } else if d > 0.0 {
                    ds / d
                } else {
                    1.0
                }
            };
            let dt = active
                .iter()
                .map(|&k| streams[k].0 / speed(streams[k].2))
                .fold(f64::INFINITY, f64::min);
            now += dt;
            let mut left = Vec::with_capacity(active.len());
            for &k in &active {
                let v = speed(streams[k].2);
                let s = &mut streams[k];
                // The stream that set `dt` ends now (same division, so exactly), and so does
                // any within a rounding error of it.
                if s.0 / v <= dt * (1.0 + FLUID_END_REL) {
                    if s.2 {
                        end[s.3].1 = now;
                    } else {
                        end[s.3].0 = now;
                    }
                } else {
                    s.0 -= dt * v;
                    left.push(k);
                }
            }
            active = left;
        }
        gpus.iter()
            .enumerate()
            .map(|(i, g)| {
                let fg = self.gather_fixed_us(g.gather_experts);
                let fc = self.cpu_fixed_us(g.cpu_experts, g.cpu_tokens, cpu_shape, g.threads);
                Overlap {
                    gather_us: fg + end[i].0,
                    cpu_us: fc + end[i].1,
                    gather_lost_us: end[i].0 - alone[i].0,
                    cpu_lost_us: end[i].1 - alone[i].1,
                }
            })
            .collect()
    }

    /// One GPU's share of an expert of `shape` under the parameters' layout: the whole
    /// expert when sharded, a slice of [`crate::GpuLayout::bytes_per_gpu`] bytes and `1/G`
    /// of the MACs under tensor parallelism.
    pub fn gpu_expert_shape(&self, shape: ExpertShape) -> ExpertShape {
        match self.layout.placement {
            GpuPlacement::Sharded => shape,
            GpuPlacement::TensorParallel if !self.layout.is_multi() => shape,
            GpuPlacement::TensorParallel => ExpertShape {
                bytes: self.layout.bytes_per_gpu(shape.bytes.round() as u64) as f64,
                macs: shape.macs / self.layout.gpus as f64,
            },
        }
    }

    /// CPU workers of GPU `gpu`'s hybrid share: [`crate::GpuLayout::cpu_workers`] of the
    /// pool's `cpu_threads`.
    pub fn gpu_cpu_threads(&self, gpu: u32) -> f64 {
        self.layout
            .cpu_workers(gpu, self.cpu_threads as usize)
            .len() as f64
    }

    /// Time of one layer's combine of the GPUs' partial outputs for `streams` streams of
    /// `hidden` activations, in us: `peer_latency_us` plus each GPU's ring all-reduce bytes
    /// ([`crate::GpuLayout::combine_bytes_per_gpu`]) over `peer_gbs`; 0 on one GPU.
    pub fn peer_combine_us(&self, streams: f64, hidden: f64) -> f64 {
        if !self.layout.is_multi() {
            return 0.0;
        }
        let bytes = self
            .layout
            .combine_bytes_per_gpu(streams.round().max(0.0) as usize, hidden.round() as usize);
        self.peer_latency_us + bytes as f64 / (self.peer_gbs * BYTES_PER_US_PER_GBS)
    }

    // ------------------------------------------------------------------ GPU

    /// Time of one GPU launch over `experts` experts serving `tokens` (token, expert) pairs,
    /// in us: a launch, the experts' bytes over the effective memory bandwidth, and the
    /// tokens' compute (0 for no expert).
    pub fn gpu_experts_us(&self, experts: f64, tokens: f64, shape: ExpertShape) -> f64 {
        if experts <= 0.0 {
            return 0.0;
        }
        self.gpu_launch_us
            + experts * shape.bytes / (self.gpu_hbm_gbs * BYTES_PER_US_PER_GBS)
            + tokens.max(0.0) * shape.macs / (self.gpu_token_gmacs * MACS_PER_US_PER_GMACS)
    }

    /// The GPU time of a layer's `experts` fetched experts computed in `chunks` (the
    /// layer schedule's, [`crate::schedule::LayerSchedule::fetch_chunk_bounds`]: the chunks
    /// of the nearest whole count, as the engine runs them): the launches of every chunk but
    /// the last (each runs as soon as its copies land, beside the gather of the next) and the
    /// last chunk's launch, which follows the gather's last copy. Counts may be means: each
    /// chunk scaled by `experts` over the chunks' whole count; tokens spread evenly over the
    /// experts. Nothing for no expert.
    pub fn fetched_kernels(
        &self,
        chunks: &[std::ops::Range<usize>],
        experts: f64,
        tokens: f64,
        shape: ExpertShape,
    ) -> FetchedKernels {
        let n: usize = chunks.iter().map(|r| r.len()).sum();
        if experts <= 0.0 || n == 0 {
            return FetchedKernels::default();
        }
        let scale = experts / n as f64;
        let per_expert_tokens = tokens.max(0.0) / experts;
        let kernel = |len: usize| {
            let e = len as f64 * scale;
            self.gpu_experts_us(e, e * per_expert_tokens, shape)
        };
        let (last, early) = chunks.split_last().expect("at least one chunk");
        FetchedKernels {
            early_us: early.iter().map(|r| kernel(r.len())).sum(),
            early_chunks: early.len(),
            last_us: kernel(last.len()),
            last_launch_us: self.gpu_launch_us,
        }
    }

    /// The dense part's streaming rate, in GB/s: [`PerfParams::dense_hbm_gbs`], or the
    /// experts' `gpu_hbm_gbs` in a profile written before the dense part had its own.
    pub fn dense_rate_gbs(&self) -> f64 {
        self.dense_hbm_gbs.unwrap_or(self.gpu_hbm_gbs)
    }

    /// Time of one layer's dense part (attention, router, shared experts) for `streams`
    /// streams at `context` tokens of context each, in us: the fixed cost, and the dense
    /// weights (read once for all streams) and each stream's KV bytes over the dense part's
    /// memory bandwidth. At decode batch sizes the dense part is memory-bound: its compute
    /// (two flops per weight and stream) is far below the GPU's rate, and the `dense` probe
    /// shows no cost per stream beyond the KV bytes (18.4 us at 1 and at 4 streams of one
    /// token on the H200, 2026-12-05). An earlier per-stream compute term at the expert
    /// kernels' token rate (a different kernel's cost) put 15 us per stream there. An
    /// engine's own per-stream and per-context costs, where `ft calibrate` fitted them, are
    /// added ([`crate::perf::EngineTerms::rest_us`]; zero for ft's runtime).
    pub fn dense_us(&self, dense: &DenseSpec, streams: f64, context: f64) -> f64 {
        let w = dense.weight_bytes_per_layer as f64;
        let kv = streams * context * dense.kv_bytes_per_token as f64;
        self.dense_layer_us
            + (w + kv) / (self.dense_rate_gbs() * BYTES_PER_US_PER_GBS)
            + self.engine.rest_us(streams, context)
    }

    /// Time of the GPU summing the CPU's partial output into the layer's, in us (one launch).
    pub fn combine_us(&self) -> f64 {
        self.gpu_launch_us
    }

    // ------------------------------------------------------------------ sync

    /// One hybrid round trip for `streams` streams of `hidden` activations, in us: the event
    /// round trip plus the activations to the CPU and its partial output back.
    pub fn sync_round_trip_us(&self, streams: f64, hidden: f64) -> f64 {
        let bytes = 2.0 * streams * hidden * ACTIVATION_BYTES_PER_ELEMENT;
        self.sync_us + bytes / (self.activation_link_gbs * BYTES_PER_US_PER_GBS)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::host::HostSpec;

    fn params() -> PerfParams {
        PerfParams::from_host(&HostSpec::field_report()).unwrap()
    }

    fn shape() -> ExpertShape {
        ExpertShape::of(&ModelSpec::preset("qwen3.8-flash-next").unwrap())
    }

    /// At `speed` the CPU share of a layer takes `1 / speed` of its time, at every thread
    /// count, and nothing outside the CPU changes.
    #[test]
    fn a_cpu_speed_scales_the_cpu_share_and_nothing_else() {
        let p = params();
        for speed in [0.5, 0.8, 1.0, 1.7] {
            let q = p.with_cpu_speed(speed).unwrap();
            q.validate().unwrap();
            for threads in [1.0, 4.0, p.cpu_threads as f64] {
                for (experts, tokens) in [(1.0, 1.0), (8.0, 8.0), (20.0, 64.0)] {
                    let a = p.cpu_share_us(experts, tokens, shape(), threads);
                    let b = q.cpu_share_us(experts, tokens, shape(), threads);
                    assert!(
                        (b * speed - a).abs() < 1e-9 * a,
                        "{speed} {threads} {experts}"
                    );
                }
            }
            assert_eq!(q.gather_gbs, p.gather_gbs);
            assert_eq!(q.dram_gbs, p.dram_gbs);
            assert_eq!(q.gpu_hbm_gbs, p.gpu_hbm_gbs);
            assert_eq!(q.overhead.cpu_us, p.overhead.cpu_us);
        }
        for bad in [0.0, -1.0, f64::NAN, f64::INFINITY] {
            let e = p.with_cpu_speed(bad).unwrap_err().to_string();
            assert!(e.contains("CPU speed"), "{e}");
        }
    }

    #[test]
    fn the_serving_slowdown_is_linear_in_threads_between_measured_counts_and_flat_beyond() {
        let mut p = params();
        p.cpu_threads = 15;
        p.cpu_serving_slowdown = 0.3;
        // No other count measured: the same everywhere.
        assert_eq!(p.serving_slowdown(4.0), 0.3);
        assert_eq!(p.serving_slowdown(64.0), 0.3);
        p.cpu_serving_slowdown_at = vec![super::super::ThreadSlowdown {
            threads: 4,
            slowdown: 0.08,
            se: 0.01,
        }];
        let near = |a: f64, b: f64| (a - b).abs() < 1e-12;
        assert!(near(p.serving_slowdown(4.0), 0.08));
        assert!(near(p.serving_slowdown(15.0), 0.3));
        assert!(near(p.serving_slowdown(9.5), 0.19));
        assert!(near(p.serving_slowdown(1.0), 0.08));
        assert!(near(p.serving_slowdown(32.0), 0.3));
        // Re-expressed at another count, the function is the same and the stream uses it.
        for t in [4u32, 8, 15, 20] {
            let q = p.at_threads(t);
            assert_eq!(q.cpu_threads, t);
            q.validate().unwrap();
            // Its JSON reads back (the serving count's knot has no standard error: null).
            let back: PerfParams = serde_json::from_str(&serde_json::to_string(&q).unwrap())
                .unwrap_or_else(|e| panic!("at {t}: {e}"));
            assert_eq!(
                back.cpu_serving_slowdown_at.len(),
                q.cpu_serving_slowdown_at.len()
            );
            let q = back;
            for x in [1.0, 4.0, 6.0, 9.5, 15.0, 30.0] {
                assert!(
                    near(q.serving_slowdown(x), p.serving_slowdown(x)),
                    "at {t}: {x} threads"
                );
            }
            let shape = ExpertShape {
                bytes: 2.77e6,
                macs: 1e6,
            };
            let s = q.cpu_serving_stream_us(10.0, shape, t as f64);
            let want =
                q.cpu_stream_us(10.0, shape, t as f64) * (1.0 + p.serving_slowdown(t as f64));
            assert!((s - want).abs() < 1e-9 * want, "{s} vs {want}");
        }
        // A table entry that makes no sense is refused, naming the field.
        p.cpu_serving_slowdown_at[0].slowdown = -1.5;
        let e = p.validate().unwrap_err().to_string();
        assert!(e.contains("cpu_serving_slowdown_at"), "{e}");
    }

    #[test]
    fn the_per_expert_cost_scales_with_the_streaming_rates_thread_law() {
        let mut p = params();
        p.cpu_threads = 16;
        p.cpu_expert_us = 10.0;
        p.cpu_thread_exponent = 0.8;
        let s = shape();
        assert_eq!(p.cpu_expert_cost_us(16.0), 10.0);
        for t in [1.0, 4.0, 8.0, 32.0] {
            // Cost times rate is thread-independent: both follow (t / cpu_threads)^0.8.
            let a = p.cpu_expert_cost_us(t) * p.cpu_rate_gbs(t);
            let b = p.cpu_expert_cost_us(16.0) * p.cpu_rate_gbs(16.0);
            assert!((a - b).abs() < 1e-9 * b, "{t} threads: {a} vs {b}");
        }
        // In the step: one more expert at 4 threads costs the per-expert part at 4 threads.
        let d = p.cpu_fixed_us(3.0, 3.0, s, 4.0) - p.cpu_fixed_us(2.0, 2.0, s, 4.0);
        assert!((d - 10.0 * 4f64.powf(0.8)).abs() < 1e-9, "{d}");
    }

    #[test]
    fn nothing_costs_nothing() {
        let p = params();
        let s = shape();
        assert_eq!(p.gather_us(0.0, s.bytes), 0.0);
        assert_eq!(p.cpu_step_us(0.0, 0.0, s, 24.0), 0.0);
        assert_eq!(p.gpu_experts_us(0.0, 0.0, s), 0.0);
        let o = p.overlapped(0.0, 0.0, 0.0, s, 24.0);
        assert_eq!((o.gather_us, o.cpu_us), (0.0, 0.0));
    }

    #[test]
    fn gather_is_affine_in_experts_and_bytes() {
        let p = params();
        let b = 2_772_480.0;
        let one = p.gather_us(1.0, b);
        let ten = p.gather_us(10.0, b);
        let per = (ten - one) / 9.0;
        assert!((per - (p.gather_copy_us + b / (p.gather_gbs * 1e3))).abs() < 1e-9);
        assert!((one - p.gather_layer_us - per).abs() < 1e-9);
    }

    /// The DRAM shares against a slow reference: water-filling by weight in small steps.
    #[test]
    fn dram_shares_match_a_water_filling_reference() {
        let mut p = params();
        for (d, w) in [(60.0, 0.7286), (30.3, 0.88), (100.0, 1.0), (50.0, 3.0)] {
            p.dram_gbs = d;
            p.dma_dram_weight = w;
            for (c, g) in [
                (46.0, 24.0),
                (29.97, 13.09),
                (80.0, 5.0),
                (5.0, 80.0),
                (10.0, 10.0),
            ] {
                // Reference: pour bandwidth in 1e-4 GB/s drops, each drop to the unsatisfied
                // side with the smaller allocation per weight-demand.
                let (mut rc, mut rg) = (0.0f64, 0.0f64);
                let drop: f64 = 1e-4;
                let mut left = d;
                while left > 0.0 && (rc < c || rg < g) {
                    let want_c = rc < c;
                    let want_g = rg < g;
                    // Fill levels: allocation over weight x demand (CPU weight 1).
                    let give_c = want_c && (!want_g || rc / c <= rg / (w * g));
                    let amt = drop.min(left);
                    if give_c {
                        rc = (rc + amt).min(c);
                    } else {
                        rg = (rg + amt).min(g);
                    }
                    left -= amt;
                }
                let (fc, fg) = p.dram_shares(c, g);
                assert!(
                    (fc - rc).abs() < 1e-2 && (fg - rg).abs() < 1e-2,
                    "d={d} w={w} c={c} g={g}: {fc},{fg} vs {rc},{rg}"
                );
                assert!(fc <= c + 1e-12 && fg <= g + 1e-12);
                let satisfied = fc == c && fg == g;
                assert!(
                    satisfied || (fc + fg - d).abs() < 1e-9,
                    "{fc} + {fg} != {d}"
                );
            }
        }
    }

    #[test]
    fn the_epyc_pair_is_reproduced_by_a_weighted_share() {
        // Field numbers quoted in the issue: 29.97 / 13.09 GB/s alone, 21.89 / 8.41 together.
        let mut p = params();
        p.dram_gbs = 21.89 + 8.41;
        p.dma_dram_weight = (8.41 / 13.09) / (21.89 / 29.97);
        let (c, g) = p.dram_shares(29.97, 13.09);
        assert!(
            (c - 21.89).abs() < 1e-9 && (g - 8.41).abs() < 1e-9,
            "{c} {g}"
        );
    }

    /// The two-phase overlap against a slow reference: step both streams in small time
    /// increments at the rates the shares give for who is still streaming. With a serving
    /// slowdown the CPU streams `1 + slowdown` times the bytes at the same demand.
    #[test]
    fn overlap_matches_a_time_stepped_reference() {
        let mut p = params();
        let s = shape();
        for (d, w, slow) in [
            (60.0, 0.7286, 0.0),
            (40.0, 1.0, 0.0),
            (500.0, 1.0, 0.0),
            (60.0, 0.7286, 0.3),
            (40.0, 1.0, -0.2),
        ] {
            p.dram_gbs = d;
            p.dma_dram_weight = w;
            p.cpu_serving_slowdown = slow;
            for (ng, nc) in [(3.0, 7.0), (10.0, 1.0), (1.0, 12.0), (5.0, 5.0)] {
                let o = p.overlapped(ng, nc, nc * 1.2, s, 24.0);
                let (mut bg, mut bc) = (ng * s.bytes, nc * s.bytes * (1.0 + slow));
                let (mut t, mut end_g, mut end_c) = (0.0, 0.0, 0.0);
                let dt = 0.01; // us
                let demand_c = p.cpu_rate_gbs(24.0);
                while bg > 0.0 || bc > 0.0 {
                    let (rc, rg) = match (bc > 0.0, bg > 0.0) {
                        (true, true) => p.dram_shares(demand_c, p.gather_gbs),
                        (true, false) => (demand_c, 0.0),
                        _ => (0.0, p.gather_gbs),
                    };
                    t += dt;
                    if bg > 0.0 {
                        bg -= rg * 1e3 * dt;
                        if bg <= 0.0 {
                            end_g = t;
                        }
                    }
                    if bc > 0.0 {
                        bc -= rc * 1e3 * dt;
                        if bc <= 0.0 {
                            end_c = t;
                        }
                    }
                }
                let fg = p.gather_fixed_us(ng);
                let fc = p.cpu_fixed_us(nc, nc * 1.2, s, 24.0);
                assert!(
                    (o.gather_us - fg - end_g).abs() < 0.05,
                    "{ng},{nc}: {} vs {}",
                    o.gather_us - fg,
                    end_g
                );
                assert!(
                    (o.cpu_us - fc - end_c).abs() < 0.05,
                    "{ng},{nc}: {} vs {}",
                    o.cpu_us - fc,
                    end_c
                );
            }
        }
    }

    #[test]
    fn the_serving_slowdown_lengthens_only_the_decode_layers_stream() {
        let mut p = params();
        let s = shape();
        let probe = p.cpu_step_us(6.0, 7.0, s, 24.0);
        assert_eq!(p.cpu_share_us(6.0, 7.0, s, 24.0), probe);
        p.cpu_serving_slowdown = 0.25;
        // The probe's own forms are the probe's; the decode layer's stream is 25% longer.
        assert_eq!(p.cpu_step_us(6.0, 7.0, s, 24.0), probe);
        let extra = p.cpu_share_us(6.0, 7.0, s, 24.0) - probe;
        let stream = 6.0 * s.bytes / (p.cpu_rate_gbs(24.0) * 1e3);
        assert!(
            (extra - 0.25 * stream).abs() < 1e-9 * stream,
            "{extra} {stream}"
        );
        // Alone in a hybrid layer (no gather), the same.
        let o = p.overlapped(0.0, 6.0, 7.0, s, 24.0);
        assert!((o.cpu_us - probe - extra).abs() < 1e-9);
    }

    #[test]
    fn the_links_serving_slowdown_follows_the_pools_demand_and_needs_a_cpu_share() {
        let mut p = params();
        let s = shape();
        let serving = p.cpu_threads as f64;
        let alone = p.overlapped(6.0, 0.0, 0.0, s, serving);
        let beside = p.overlapped(6.0, 4.0, 4.0, s, serving);
        assert_eq!(p.link_serving_factor(serving), 1.0);
        p.link_serving_slowdown = 0.1;
        assert!((p.link_serving_factor(serving) - 1.1).abs() < 1e-12);
        // Fewer threads ask less of DRAM: the slowdown shrinks with their rate.
        let few = serving / 4.0;
        let want = 1.0 + 0.1 * p.cpu_rate_gbs(few) / p.cpu_rate_gbs(serving);
        assert!((p.link_serving_factor(few) - want).abs() < 1e-12);
        // A gather alone is the probe's; beside a CPU share its stream is 10% longer.
        assert_eq!(p.overlapped(6.0, 0.0, 0.0, s, serving), alone);
        let slowed = p.overlapped(6.0, 4.0, 4.0, s, serving);
        assert!(slowed.gather_us > beside.gather_us, "{slowed:?} {beside:?}");
        let stream = p.gather_stream_us(6.0, s.bytes);
        assert!(slowed.gather_us - beside.gather_us >= 0.1 * stream - 1e-9);
    }

    #[test]
    fn the_host_issue_delays_the_cpu_share_only_beyond_the_dense_part() {
        let mut p = params();
        p.gather_layer_us = 3.0;
        p.gather_copy_us = 4.0;
        let layer = |hits: f64, fetched: f64, cpu: f64| LayerCounts {
            hits,
            hit_tokens: hits,
            fetched,
            fetched_tokens: fetched,
            cpu,
            cpu_tokens: cpu,
        };
        // Without the fitted term, the gather's issue: 10 copies, 3 + 10 x 4 = 43 us.
        assert_eq!(
            p.host_issue_wait_us(&layer(0.0, 10.0, 5.0), 2.0, 20.0),
            23.0
        );
        assert_eq!(p.host_issue_wait_us(&layer(0.0, 10.0, 5.0), 2.0, 50.0), 0.0);
        assert_eq!(p.host_issue_wait_us(&layer(0.0, 0.0, 5.0), 1.0, 0.0), 0.0);
        // The fitted host time, where it is longer: 60 + 2 x (3 + 10) + 1.5 x 5 + 4 x 2.
        p.host = super::super::HostCost {
            layer_us: 60.0,
            expert_us: 2.0,
            cpu_expert_us: 1.5,
            stream_us: 4.0,
        };
        let c = layer(3.0, 10.0, 5.0);
        assert_eq!(p.host_layer_us(&c, 2.0), 101.5);
        assert_eq!(p.host_issue_wait_us(&c, 2.0, 20.0), 81.5);
        // A fitted time shorter than the gather's issue is floored at it.
        p.host.layer_us = 0.0;
        assert_eq!(p.host_layer_us(&layer(0.0, 10.0, 0.0), 0.0), 43.0);
    }

    #[test]
    fn contended_probe_forms_are_slower_only_when_dram_is_short() {
        let mut p = params();
        let s = shape();
        p.dram_gbs = 1000.0;
        assert_eq!(
            p.gather_contended_us(8.0, s.bytes, 24.0),
            p.gather_us(8.0, s.bytes)
        );
        assert_eq!(
            p.cpu_step_contended_us(8.0, 8.0, s, 24.0),
            p.cpu_step_us(8.0, 8.0, s, 24.0)
        );
        p.dram_gbs = 40.0;
        assert!(p.gather_contended_us(8.0, s.bytes, 24.0) > p.gather_us(8.0, s.bytes));
        assert!(p.cpu_step_contended_us(8.0, 8.0, s, 24.0) > p.cpu_step_us(8.0, 8.0, s, 24.0));
    }

    #[test]
    fn threads_scale_the_stream_rate_by_the_exponent() {
        let p = params();
        let full = p.cpu_rate_gbs(p.cpu_threads as f64);
        assert_eq!(full, p.cpu_gbs);
        let half = p.cpu_rate_gbs(p.cpu_threads as f64 / 2.0);
        assert!((half / full - 0.5f64.powf(p.cpu_thread_exponent)).abs() < 1e-12);
    }

    #[test]
    fn fetched_experts_run_in_the_runtimes_chunks() {
        let p = params();
        let s = ExpertShape {
            bytes: 2.77e6,
            macs: 4.9e6,
        };
        let chunks = |n: f64, most: usize| crate::schedule::LayerSchedule::chunk_bounds(most, n);
        let fk = |n: f64, tokens: f64| {
            p.fetched_kernels(&chunks(n, crate::plan::MAX_FETCH_CHUNKS), n, tokens, s)
        };
        assert_eq!(fk(0.0, 0.0), FetchedKernels::default());
        // One expert: one chunk, nothing before it.
        let one = fk(1.0, 2.0);
        assert_eq!(one.early_chunks, 0);
        assert!((one.last_us - p.gpu_experts_us(1.0, 2.0, s)).abs() < 1e-12);
        // Six: chunks of 3, 2 and 1, each its own launch; tokens spread evenly.
        let six = fk(6.0, 12.0);
        assert_eq!(six.early_chunks, 2);
        let k = |n: f64| p.gpu_experts_us(n, 2.0 * n, s);
        assert!((six.early_us - (k(3.0) + k(2.0))).abs() < 1e-9);
        assert!((six.last_us - k(1.0)).abs() < 1e-12);
        // A mean count takes the chunks of the nearest whole count, scaled to it: the
        // kernels' experts still add up to the mean.
        let mean = fk(5.6, 5.6);
        let whole = fk(6.0, 6.0);
        assert_eq!(mean.early_chunks, whole.early_chunks);
        assert!(mean.last_us < whole.last_us && mean.early_us < whole.early_us);
        // In one chunk (`--fetch-chunks 1`): nothing before the last, which is all six.
        let single = p.fetched_kernels(&chunks(6.0, 1), 6.0, 12.0, s);
        assert_eq!(single.early_chunks, 0);
        assert_eq!(single.early_us, 0.0);
        assert!((single.last_us - k(6.0)).abs() < 1e-9);
    }

    #[test]
    fn dense_grows_with_context_and_streams() {
        let p = params();
        let d = ModelSpec::preset("qwen3.8-flash-next").unwrap().dense();
        let short = p.dense_us(&d, 1.0, 1000.0);
        let long = p.dense_us(&d, 1.0, 100_000.0);
        let two = p.dense_us(&d, 2.0, 100_000.0);
        assert!(short < long && long < two);
        let slope = (long - short) / 99_000.0;
        assert!((slope - d.kv_bytes_per_token as f64 / (p.dense_rate_gbs() * 1e3)).abs() < 1e-12);
        // Its own rate where it has one; the experts' where a profile predates it.
        let mut own = p.clone();
        own.dense_hbm_gbs = Some(2.0 * p.gpu_hbm_gbs);
        own.gpu_hbm_gbs *= 10.0;
        let kv = 1000.0 * d.kv_bytes_per_token as f64;
        let bytes = d.weight_bytes_per_layer as f64 + kv;
        let want = own.dense_layer_us + bytes / (2.0 * p.gpu_hbm_gbs * 1e3);
        assert!((own.dense_us(&d, 1.0, 1000.0) - want).abs() < 1e-9 * want);
        own.dense_hbm_gbs = None;
        let want = own.dense_layer_us + bytes / (own.gpu_hbm_gbs * 1e3);
        assert!((own.dense_us(&d, 1.0, 1000.0) - want).abs() < 1e-9 * want);
    }
}
