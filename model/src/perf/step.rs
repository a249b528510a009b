//! The per-layer critical path of a decode step: the closed form of the layer schedule.
//!
//! One MoE layer of a decode step, as the runtime executes it (the graph of
//! [`crate::schedule::LayerSchedule`], whose longest path this module computes in closed
//! form for any number of GPUs, [`PerfParams::schedule_time`]):
//!
//! 1. **dense** on the GPU: attention, router, shared experts. Routing is known only after
//!    it, so nothing of the layer's experts starts before it ends.
//! 2. Then three things start at once:
//!    - the **gather** of the misses chosen to cross the link (copy engine);
//!    - the **hits** on the GPU (SMs), overlapping the gather (the runtime overlaps a
//!      layer's hit compute with its miss copies);
//!    - the **CPU** path of hybrid and cpu: activations to the host, the CPU expert step,
//!      the partial output back (`cpu + sync`), contending with the gather for DRAM. The
//!      CPU step is the decode layer's (`cpu_share_us`: the probe's with the calibrated
//!      serving slowdown on its weight stream), and it waits for the host thread's own
//!      time in the layer: planning it, submitting its GPU work (the gather's copies among
//!      it), launching the merge and combine after the CPU share (`host_issue_wait_us`,
//!      counted in `sync`). The host thread is one of the CPU pool's workers, so that time
//!      is serial with the CPU share; it overlaps the dense part, so only what it takes
//!      beyond the dense part delays the CPU path.
//! 3. The **fetched** experts are computed on the GPU in the runtime's chunks
//!    ([`LayerSchedule::fetch_chunk_bounds`], at most the engine's
//!    [`crate::EngineSettings::fetch_chunks`]; at the default the last is one expert as soon
//!    as there are two): each chunk's launch runs once its copies have landed and the launches before it
//!    are done, so every chunk but the last (`early`) overlaps the gather, and only the last
//!    chunk's launch (`last`) follows the gather's last copy. On one GPU the runtime gates
//!    the last chunk on a flag the copy stream sets (its `gate_last_chunk`, the default):
//!    the launch itself (`launch`, [`FetchedKernels::last_launch_us`]) is paid when the
//!    stream reaches it, beside the gather, and only the rest of `last` follows the last
//!    copy; the multi-GPU engine waits for the copies' event, so there all of `last` does.
//! 4. Where the CPU computed experts, the GPU **combines** the CPU's partial output once both
//!    the GPU side and the CPU path are done.
//!
//! So a layer takes `dense + max(max(gather, hits + early + launch) + last - launch, cpu +
//! sync) + combine` on one GPU (`launch` 0 on several), the terms of work the layer does not
//! have zero, plus the calibrated residual of its work ([`crate::schedule::LayerWork`]: a
//! fixed cost of the operations present, whatever strategy planned them): a layer that
//! gathers every miss is `dense + max(gather, hits + early + launch) + last - launch`, a
//! resident one `dense + hits`, one with every miss on the CPU `dense + max(hits, cpu +
//! sync) + combine`. On G GPUs each runs this graph on its own link, stream and CPU workers,
//! the layer ends when the slowest is done, and the GPUs' partial outputs are combined
//! (`peer`) before the residual. The GPU side takes each chunk's copies to
//! land no later than the launches before it end (a chunk's launch is a few us, the next
//! chunk's copies tens), which is what the runtime's chunk sizes are chosen for. The fetched
//! experts may run while the CPU is still busy, so the CPU path and the GPU side are a max,
//! not a sum. Layers run one after another: a decode step is the sum of its layers.

use serde::{Deserialize, Serialize};
use std::fmt;

use super::cost::{ExpertShape, FetchedKernels, GpuStreams};
use super::PerfParams;
use crate::placement::GpuLayout;
use crate::plan::LayerPlan;
use crate::preset::{DenseSpec, ModelSpec};
use crate::schedule::{LayerSchedule, Op, OpKind};

/// What one MoE layer of one step does, as counts (means allowed).
#[derive(Debug, Clone, Copy, PartialEq, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LayerCounts {
    /// Experts resident in the GPU cache.
    pub hits: f64,
    /// (token, expert) pairs served by the hits.
    pub hit_tokens: f64,
    /// Misses crossing the link (into cache slots or staging) and computed on the GPU.
    pub fetched: f64,
    /// (token, expert) pairs served by the fetched experts.
    pub fetched_tokens: f64,
    /// Misses computed on the CPU.
    pub cpu: f64,
    /// (token, expert) pairs served by the CPU experts.
    pub cpu_tokens: f64,
}

impl LayerCounts {
    /// The counts of a planned layer.
    pub fn of_plan(plan: &LayerPlan) -> Self {
        let (th, tl, tc) = plan.token_counts();
        LayerCounts {
            hits: plan.hits.len() as f64,
            hit_tokens: th as f64,
            fetched: plan.link_experts() as f64,
            fetched_tokens: tl as f64,
            cpu: plan.cpu.len() as f64,
            cpu_tokens: tc as f64,
        }
    }

    /// Experts not resident.
    pub fn misses(&self) -> f64 {
        self.fetched + self.cpu
    }

    /// Distinct experts of the layer.
    pub fn unique(&self) -> f64 {
        self.hits + self.misses()
    }

    /// These counts with the misses (and their tokens) times `k`, at most all of the layer's
    /// distinct experts (tokens): experts move between the hits and the misses, the misses
    /// keep their split between the link and the CPU, and the union is unchanged. What
    /// hybrid's miss factor ([`super::EngineTerms::apply_miss_factor`]) and a break-even's
    /// move of the miss rate do to a layer.
    pub fn with_misses_scaled(&self, k: f64) -> LayerCounts {
        let m = self.misses();
        if m <= 0.0 {
            return *self;
        }
        let union = m + self.hits;
        let mt = self.fetched_tokens + self.cpu_tokens;
        let tokens = mt + self.hit_tokens;
        let target = (m * k).clamp(0.0, union);
        let r = target / m;
        let rt = if mt > 0.0 {
            (mt * r).min(tokens) / mt
        } else {
            r
        };
        LayerCounts {
            hits: union - target,
            hit_tokens: tokens - mt * rt,
            fetched: self.fetched * r,
            fetched_tokens: self.fetched_tokens * rt,
            cpu: self.cpu * r,
            cpu_tokens: self.cpu_tokens * rt,
        }
    }

    /// Every count times `k` (a step's sums to one layer's means with `1 / layers`).
    pub fn scaled(&self, k: f64) -> LayerCounts {
        LayerCounts {
            hits: self.hits * k,
            hit_tokens: self.hit_tokens * k,
            fetched: self.fetched * k,
            fetched_tokens: self.fetched_tokens * k,
            cpu: self.cpu * k,
            cpu_tokens: self.cpu_tokens * k,
        }
    }
}

/// The step-wide inputs of the cost terms: the model's shapes, the streams and the context.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct StepShape {
    /// One routed expert.
    pub expert: ExpertShape,
    /// Model width (activation elements per stream), in elements.
    pub hidden: f64,
    /// The dense part of each layer.
    pub dense: DenseSpec,
    /// Concurrent streams (tokens per step).
    pub streams: f64,
    /// Context length of each stream, in tokens.
    pub context: f64,
}

impl StepShape {
    /// The shape of a model's step at `streams` streams and `context` tokens of context.
    pub fn new(model: &ModelSpec, streams: usize, context: usize) -> Self {
        StepShape {
            expert: ExpertShape::of(model),
            hidden: model.geometry.hidden as f64,
            dense: model.dense(),
            streams: streams as f64,
            context: context as f64,
        }
    }
}

/// A resource on the critical path of a step.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Resource {
    /// The host-to-GPU link (gathers).
    Pcie,
    /// The CPU expert pool.
    Cpu,
    /// GPU expert compute (hits, fetched, combine).
    Gpu,
    /// The hybrid round trip between GPU and CPU, and the host thread's own time in a layer
    /// with a CPU share beyond the dense part (planning, submitting: serial with the CPU).
    Sync,
    /// The dense part of the layers (attention, router, shared experts) on the GPU.
    Dense,
    /// Calibrated per-layer overhead the micro-probes do not see.
    Other,
}

impl Resource {
    /// All resources, in report order.
    pub const ALL: [Resource; 6] = [
        Resource::Pcie,
        Resource::Cpu,
        Resource::Gpu,
        Resource::Sync,
        Resource::Dense,
        Resource::Other,
    ];

    /// Name in tables.
    pub fn name(self) -> &'static str {
        match self {
            Resource::Pcie => "pcie",
            Resource::Cpu => "cpu",
            Resource::Gpu => "gpu",
            Resource::Sync => "sync",
            Resource::Dense => "dense",
            Resource::Other => "other",
        }
    }
}

impl fmt::Display for Resource {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// Time per resource, in us.
#[derive(Debug, Clone, Copy, PartialEq, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TimeSplit {
    /// Link (gather), in us.
    pub pcie_us: f64,
    /// CPU expert pool, in us.
    pub cpu_us: f64,
    /// GPU expert compute, in us.
    pub gpu_us: f64,
    /// Hybrid round trips and the host's time before the CPU share, in us.
    pub sync_us: f64,
    /// Dense part, in us.
    pub dense_us: f64,
    /// Calibrated overhead, in us.
    pub other_us: f64,
}

impl TimeSplit {
    /// The time of one resource, in us.
    pub fn get(&self, r: Resource) -> f64 {
        match r {
            Resource::Pcie => self.pcie_us,
            Resource::Cpu => self.cpu_us,
            Resource::Gpu => self.gpu_us,
            Resource::Sync => self.sync_us,
            Resource::Dense => self.dense_us,
            Resource::Other => self.other_us,
        }
    }

    fn slot(&mut self, r: Resource) -> &mut f64 {
        match r {
            Resource::Pcie => &mut self.pcie_us,
            Resource::Cpu => &mut self.cpu_us,
            Resource::Gpu => &mut self.gpu_us,
            Resource::Sync => &mut self.sync_us,
            Resource::Dense => &mut self.dense_us,
            Resource::Other => &mut self.other_us,
        }
    }

    /// Add `us` to one resource.
    pub fn add_to(&mut self, r: Resource, us: f64) {
        *self.slot(r) += us;
    }

    /// Sum over resources, in us.
    pub fn total(&self) -> f64 {
        Resource::ALL.iter().map(|r| self.get(*r)).sum()
    }

    /// Element-wise sum.
    pub fn plus(&self, o: &TimeSplit) -> TimeSplit {
        let mut s = *self;
        for r in Resource::ALL {
            s.add_to(r, o.get(r));
        }
        s
    }

    /// Every element times `k`.
    pub fn scaled(&self, k: f64) -> TimeSplit {
        let mut s = TimeSplit::default();
        for r in Resource::ALL {
            s.add_to(r, self.get(r) * k);
        }
        s
    }

    /// The resource holding the most time (the first in report order on a tie).
    pub fn bound(&self) -> Resource {
        let mut best = Resource::Pcie;
        for r in Resource::ALL {
            if self.get(r) > self.get(best) {
                best = r;
            }
        }
        best
    }
}

/// The time of one layer and where it goes.
#[derive(Debug, Clone, Copy, PartialEq, Default, Serialize, Deserialize)]
pub struct LayerTime {
    /// The layer's duration, in us.
    pub total_us: f64,
    /// The duration attributed to the resources on the critical path; sums to `total_us`.
    pub critical: TimeSplit,
    /// How long each resource is busy during the layer (overlapping), in us.
    pub busy: TimeSplit,
    /// Time the gather and the CPU lost to DRAM contention, in us (summed over both).
    pub contention_us: f64,
}

/// The durations of one GPU's operations in a [`LayerSchedule`], in us (0 where the
/// operation is not in the schedule).
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct GpuTerms {
    /// The hit experts' kernel, launch included.
    pub hits_us: f64,
    /// The fetched chunks' kernels ([`PerfParams::fetched_kernels`] in the schedule's
    /// chunks, [`LayerSchedule::fetch_chunk_bounds`]).
    pub fetched: FetchedKernels,
    /// The gather, beside the CPU share where there is one (DRAM contention).
    pub gather_us: f64,
    /// The CPU share, beside the gather where there is one.
    pub cpu_us: f64,
    /// The host thread's time in the layer (`Issue`; only with a CPU share).
    pub issue_us: f64,
    /// The round trip of the activations and the partial output (only with a CPU share).
    pub round_trip_us: f64,
    /// The GPU's sum of the CPU's partial output (only with a CPU share).
    pub combine_us: f64,
    /// Time the gather and the CPU share lost to DRAM contention, summed.
    pub contention_us: f64,
}

/// The durations of every operation of a [`LayerSchedule`] under one set of parameters.
#[derive(Debug, Clone, PartialEq)]
pub struct ScheduleTerms {
    /// The dense part (each GPU's), in us.
    pub dense_us: f64,
    /// Each GPU's operations.
    pub gpus: Vec<GpuTerms>,
    /// The combine of the GPUs' partial outputs (0 on one GPU), in us.
    pub peer_us: f64,
    /// The calibrated fixed cost of the layer's work, in us.
    pub residual_us: f64,
    /// Whether the last fetched chunk's launch overlaps the gather.
    pub gated: bool,
}

impl ScheduleTerms {
    /// The duration of `op`, in us: what [`LayerSchedule::longest_path`] takes.
    pub fn op_us(&self, op: &Op) -> f64 {
        let g = &self.gpus[op.gpu as usize];
        let launch = if self.gated {
            g.fetched.last_launch_us.min(g.fetched.last_us)
        } else {
            0.0
        };
        match op.kind {
            OpKind::Issue => g.issue_us,
            OpKind::Dense => self.dense_us,
            OpKind::Hits => g.hits_us,
            OpKind::FetchedEarly => g.fetched.early_us,
            OpKind::LastLaunch => launch,
            OpKind::Gather => g.gather_us,
            OpKind::LastChunk => g.fetched.last_us - launch,
            OpKind::CpuShare => g.cpu_us,
            OpKind::RoundTrip => g.round_trip_us,
            OpKind::Combine => g.combine_us,
            OpKind::PeerCombine => self.peer_us,
            OpKind::Residual => self.residual_us,
        }
    }
}

impl PerfParams {
    /// The duration of one layer doing `counts` on one GPU, in us ([`PerfParams::schedule_time`]
    /// of its [`LayerSchedule`]).
    pub fn layer_time(&self, shape: &StepShape, counts: &LayerCounts) -> LayerTime {
        let dense = self.dense_us(&shape.dense, shape.streams, shape.context);
        self.layer_time_with_dense(shape, counts, dense)
    }

    /// [`PerfParams::layer_time`] with the dense time given (it is the same for every layer
    /// of a step, so callers evaluating many layers compute it once).
    pub fn layer_time_with_dense(
        &self,
        shape: &StepShape,
        c: &LayerCounts,
        dense: f64,
    ) -> LayerTime {
        let schedule = LayerSchedule::new(
            &GpuLayout::single(),
            &self.engine_settings,
            std::slice::from_ref(c),
        );
        self.schedule_time(&schedule, shape, dense)
    }

    /// The duration of one layer on the parameters' GPUs ([`PerfParams::layout`]), in us:
    /// `counts[p]` is plan `p`'s counts ([`crate::GpuLayout::plan_of`] says which plan each
    /// GPU runs: its own when sharded, the one shared plan under tensor parallelism, whose
    /// counts are of expert slices). On one GPU this is [`PerfParams::layer_time_with_dense`].
    pub fn layer_time_gpus(
        &self,
        shape: &StepShape,
        counts: &[LayerCounts],
        dense: f64,
    ) -> LayerTime {
        let schedule = LayerSchedule::new(&self.layout, &self.engine_settings, counts);
        self.schedule_time(&schedule, shape, dense)
    }

    /// The durations of `schedule`'s operations, with `dense` us of dense part.
    ///
    /// On one GPU the experts are of the model's shape and the CPU share has the whole pool;
    /// the gather and the CPU share, where both exist, contend for DRAM
    /// ([`PerfParams::overlapped`]). On G GPUs each GPU's experts are of
    /// [`PerfParams::gpu_expert_shape`] and its CPU share (its counts in the schedule: under
    /// tensor parallelism its dealt share of the CPU experts, each computed whole) has its
    /// [`PerfParams::gpu_cpu_threads`] workers; every gather and CPU share reads the one host
    /// DRAM at once ([`PerfParams::overlapped_gpus`]: the contention sees the summed demand).
    pub fn schedule_terms(
        &self,
        schedule: &LayerSchedule,
        shape: &StepShape,
        dense: f64,
    ) -> ScheduleTerms {
        let multi = schedule.gpus > 1;
        let s = if multi {
            self.gpu_expert_shape(shape.expert)
        } else {
            shape.expert
        };
        let threads = |g: u32| {
            if multi {
                self.gpu_cpu_threads(g)
            } else {
                self.cpu_threads as f64
            }
        };
        let over = if multi {
            let streams: Vec<GpuStreams> = schedule
                .counts
                .iter()
                .enumerate()
                .map(|(g, c)| GpuStreams {
                    gather_experts: c.fetched,
                    cpu_experts: c.cpu,
                    cpu_tokens: c.cpu_tokens,
                    threads: threads(g as u32),
                })
                .collect();
            Some(self.overlapped_gpus(&streams, s, shape.expert))
        } else {
            None
        };
        let round_trip = self.sync_round_trip_us(shape.streams, shape.hidden);
        let gpus = schedule
            .counts
            .iter()
            .enumerate()
            .map(|(g, c)| {
                let t = threads(g as u32);
                let has_cpu = c.cpu > 0.0;
                let (gather, cpu, contention) = match &over {
                    Some(o) => {
                        let o = o[g];
                        (o.gather_us, o.cpu_us, o.gather_lost_us + o.cpu_lost_us)
                    }
                    None if has_cpu && c.fetched > 0.0 => {
                        let o = self.overlapped(c.fetched, c.cpu, c.cpu_tokens, s, t);
                        (o.gather_us, o.cpu_us, o.gather_lost_us + o.cpu_lost_us)
                    }
                    None => (
                        self.gather_us(c.fetched, s.bytes),
                        self.cpu_share_us(c.cpu, c.cpu_tokens, s, t),
                        0.0,
                    ),
                };
                let cpu_only = |x: f64| if has_cpu { x } else { 0.0 };
                GpuTerms {
                    hits_us: self.gpu_experts_us(c.hits, c.hit_tokens, s),
                    fetched: self.fetched_kernels(
                        &schedule.fetch_chunk_bounds(c.fetched),
                        c.fetched,
                        c.fetched_tokens,
                        s,
                    ),
                    gather_us: gather,
                    cpu_us: cpu,
                    issue_us: cpu_only(self.host_layer_us(c, shape.streams)),
                    round_trip_us: cpu_only(round_trip),
                    combine_us: cpu_only(self.combine_us()),
                    contention_us: contention,
                }
            })
            .collect();
        ScheduleTerms {
            dense_us: dense,
            gpus,
            peer_us: if multi {
                self.peer_combine_us(shape.streams, shape.hidden)
            } else {
                0.0
            },
            residual_us: self.overhead.of(schedule.work()),
            gated: schedule.gated_last_chunk,
        }
    }

    /// The duration of one layer's [`LayerSchedule`] and where it goes, in closed form (the
    /// longest path of its graph, module docs and [`crate::schedule`]):
    /// `dense + max_g(max(max(gather, hits + early + launch) + last - launch, cpu + sync) +
    /// combine) + peer + residual`, with `launch` the gated last chunk's launch (0 where not
    /// gated) and `sync` the round trip plus the host's time beyond the dense part. The
    /// critical split is the slowest GPU's, the peer combine charged to `sync` (traffic
    /// between devices, like the round trip); `busy` is the busiest GPU's per resource;
    /// `contention_us` sums over all GPUs.
    pub fn schedule_time(
        &self,
        schedule: &LayerSchedule,
        shape: &StepShape,
        dense: f64,
    ) -> LayerTime {
        let terms = self.schedule_terms(schedule, shape, dense);
        let mut slowest: Option<(f64, TimeSplit)> = None;
        let mut busy = TimeSplit::default();
        let mut contention = 0.0;
        for (c, g) in schedule.counts.iter().zip(&terms.gpus) {
            let has_cpu = c.cpu > 0.0;
            let sync = g.round_trip_us + (g.issue_us - dense).max(0.0);
            let (side, mut crit) = longer_side(
                g.gather_us,
                g.hits_us,
                &g.fetched,
                c.fetched > 0.0,
                terms.gated,
                has_cpu.then_some((g.cpu_us, sync)),
            );
            let body = side + g.combine_us;
            crit.gpu_us += g.combine_us;
            if slowest.is_none_or(|(b, _)| body > b) {
                slowest = Some((body, crit));
            }
            busy.pcie_us = busy.pcie_us.max(g.gather_us);
            busy.cpu_us = busy.cpu_us.max(g.cpu_us);
            busy.gpu_us = busy
                .gpu_us
                .max(g.hits_us + g.fetched.early_us + g.fetched.last_us + g.combine_us);
            busy.sync_us = busy.sync_us.max(if has_cpu { sync } else { 0.0 });
            contention += g.contention_us;
        }
        let (body, mut critical) = slowest.unwrap_or_default();
        critical.dense_us = dense;
        critical.other_us = terms.residual_us;
        critical.sync_us += terms.peer_us;
        busy.sync_us += terms.peer_us;
        busy.dense_us = dense;
        busy.other_us = terms.residual_us;
        LayerTime {
            total_us: dense + body + terms.peer_us + terms.residual_us,
            critical,
            busy,
            contention_us: contention,
        }
    }
}

/// The two paths of a layer after its dense part (module docs): the GPU side, `max(gather,
/// hits + early + launch) + last - launch` (the hits, then each fetched chunk as its copies
/// land, the last after the gather and the kernels before it; `launch`, the last chunk's
/// launch, beside the gather where the last chunk is `gated`, else 0), and, with a CPU
/// share, the CPU path `cpu + sync` (`cpu_path`: the share's time and its sync). Returns the
/// longer one's duration and how it splits by resource (the CPU path where it is strictly
/// longer).
fn longer_side(
    gather: f64,
    hits: f64,
    fetched: &FetchedKernels,
    has_fetched: bool,
    gated: bool,
    cpu_path: Option<(f64, f64)>,
) -> (f64, TimeSplit) {
    let launch = if gated {
        fetched.last_launch_us.min(fetched.last_us)
    } else {
        0.0
    };
    let (early, last) = (fetched.early_us + launch, fetched.last_us - launch);
    let gpu_side = gather.max(hits + early) + last;
    let (cpu, sync) = cpu_path.unwrap_or((0.0, 0.0));
    let cpu_side = if cpu_path.is_some() { cpu + sync } else { 0.0 };
    let mut split = TimeSplit::default();
    if cpu_side > gpu_side {
        split.cpu_us += cpu;
        split.sync_us += sync;
        return (cpu_side, split);
    }
    if gather >= hits + early && has_fetched {
        split.pcie_us += gather;
    } else {
        split.gpu_us += hits + early;
    }
    split.gpu_us += last;
    (gpu_side, split)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::host::HostSpec;

    fn setup() -> (PerfParams, StepShape) {
        let mut p = PerfParams::from_host(&HostSpec::field_report()).unwrap();
        // A slowed CPU share and a gather issue longer than the dense part, so that both
        // enter the CPU path.
        p.cpu_serving_slowdown = 0.25;
        p.gather_copy_us = 12.0;
        let m = ModelSpec::preset("qwen3.8-flash-next").unwrap();
        (p, StepShape::new(&m, 2, 1200))
    }

    /// The closed form against a slow reference: a list scheduler over the layer's task
    /// graph (each task starts when all its predecessors have ended).
    #[test]
    fn the_closed_form_is_the_longest_path_of_the_task_graph() {
        let (p, shape) = setup();
        let s = shape.expert;
        let t = p.cpu_threads as f64;
        for (hits, fetched, cpu) in [
            (12.0, 8.0, 0.0),
            (0.0, 20.0, 0.0),
            (20.0, 0.0, 0.0),
            (12.0, 2.0, 6.0),
            (5.0, 0.0, 15.0),
            (19.0, 0.0, 1.0),
            (2.0, 12.0, 1.0),
        ] {
            let c = LayerCounts {
                hits,
                hit_tokens: hits,
                fetched,
                fetched_tokens: fetched * 1.1,
                cpu,
                cpu_tokens: cpu,
            };
            let got = p.layer_time(&shape, &c);
            // Task durations.
            let dense = p.dense_us(&shape.dense, shape.streams, shape.context);
            let (gather, cpu_t) = if cpu > 0.0 && fetched > 0.0 {
                let o = p.overlapped(fetched, cpu, cpu, s, t);
                (o.gather_us, o.cpu_us)
            } else {
                (
                    p.gather_us(fetched, s.bytes),
                    p.cpu_share_us(cpu, cpu, s, t),
                )
            };
            let sync = if cpu > 0.0 {
                p.sync_round_trip_us(2.0, shape.hidden)
            } else {
                0.0
            };
            // The host issues the gather from the layer's start, beside the dense part.
            let issue = if cpu > 0.0 {
                p.gather_fixed_us(fetched)
            } else {
                0.0
            };
            let combine = if cpu > 0.0 { p.combine_us() } else { 0.0 };
            // (name, duration, predecessors)
            let mut tasks: Vec<(&str, f64, Vec<usize>)> = vec![
                ("dense", dense, vec![]),
                ("gather", gather, vec![0]),
                ("hits", p.gpu_experts_us(hits, hits, s), vec![0]),
                ("cpu", cpu_t, vec![0, 6]),
                ("sync", sync, vec![3]),
                ("combine", combine, vec![]), // after the last chunk and the sync, below
                ("issue", issue, vec![]),
            ];
            // The fetched chunks, one launch each on the GPU stream after the hits: every
            // chunk but the last after the launch before it (its copies land beside the
            // gather), the last also after the whole gather.
            let chunks = crate::plan::fetch_chunk_bounds(fetched as usize);
            // The last one gated (one GPU): its launch after the chunk before it, its work
            // after that launch and the whole gather.
            let mut before = 2;
            for (k, r) in chunks.iter().enumerate() {
                let n = r.len() as f64;
                let kernel = p.gpu_experts_us(n, n * 1.1, s);
                if k + 1 == chunks.len() {
                    let launch = if n > 0.0 { p.gpu_launch_us } else { 0.0 };
                    tasks.push(("last launch", launch, vec![before]));
                    let launched = tasks.len() - 1;
                    tasks.push(("last chunk", kernel - launch, vec![launched, 1]));
                } else {
                    tasks.push(("chunk", kernel, vec![before]));
                }
                before = tasks.len() - 1;
            }
            tasks[5].2 = vec![before, 4];
            // List scheduling until nothing moves (the issue task comes last in the list
            // but precedes the CPU step).
            let mut end = vec![0.0f64; tasks.len()];
            for _ in 0..tasks.len() {
                for (i, (_, d, pred)) in tasks.iter().enumerate() {
                    let start = pred.iter().map(|&j| end[j]).fold(0.0, f64::max);
                    end[i] = start + d;
                }
            }
            let reference = end.iter().copied().fold(0.0, f64::max);
            assert!(
                (got.total_us - reference).abs() < 1e-9,
                "{hits},{fetched},{cpu}: {} vs {reference}",
                got.total_us
            );
            assert!((got.critical.total() - got.total_us).abs() < 1e-9);
        }
    }

    #[test]
    fn offload_with_many_misses_is_pcie_bound_and_resident_is_gpu_bound() {
        let (p, shape) = setup();
        let off = LayerCounts {
            hits: 12.0,
            hit_tokens: 12.0,
            fetched: 8.0,
            fetched_tokens: 8.0,
            ..Default::default()
        };
        let t = p.layer_time(&shape, &off);
        assert!(t.critical.pcie_us > t.critical.gpu_us);
        assert_eq!(t.critical.cpu_us, 0.0);
        let res = LayerCounts {
            hits: 20.0,
            hit_tokens: 20.0,
            ..Default::default()
        };
        let t = p.layer_time(&shape, &res);
        assert_eq!(t.critical.pcie_us, 0.0);
        assert!(t.critical.gpu_us > 0.0);
    }

    /// The residual is the fixed cost of the layer's work, whatever planned it: a layer
    /// with a gather and no CPU share pays the gather's, with a CPU share too the
    /// gather-and-CPU one, and a resident layer neither.
    #[test]
    fn the_residual_of_the_work_is_added() {
        let (mut p, shape) = setup();
        let c = LayerCounts {
            hits: 10.0,
            hit_tokens: 10.0,
            fetched: 3.0,
            fetched_tokens: 3.0,
            ..Default::default()
        };
        let before = p.layer_time(&shape, &c).total_us;
        p.overhead.offload_us = 7.0;
        p.overhead.hybrid_us = 50.0;
        assert!((p.layer_time(&shape, &c).total_us - before - 7.0).abs() < 1e-12);
        let resident = LayerCounts {
            fetched: 0.0,
            fetched_tokens: 0.0,
            ..c
        };
        let r0 = p.layer_time(&shape, &resident).total_us;
        p.overhead.resident_us = 3.0;
        assert!((p.layer_time(&shape, &resident).total_us - r0 - 3.0).abs() < 1e-12);
    }

    /// The closed form of any schedule (one GPU and several, sharded and tensor parallel,
    /// with and without each kind of work) is the longest path of its operations' graph
    /// with the same durations.
    #[test]
    fn the_closed_form_is_the_longest_path_of_the_schedule_on_any_gpu_count() {
        use crate::placement::GpuPlacement;
        let (mut p, shape) = setup();
        p.overhead.hybrid_us = 4.0;
        p.overhead.cpu_us = 2.0;
        p.host.layer_us = 80.0;
        let dense = p.dense_us(&shape.dense, shape.streams, shape.context);
        let layouts = [
            GpuLayout::single(),
            GpuLayout::new(2, GpuPlacement::Sharded).unwrap(),
            GpuLayout::new(2, GpuPlacement::TensorParallel).unwrap(),
        ];
        let c = |hits: f64, fetched: f64, cpu: f64| LayerCounts {
            hits,
            hit_tokens: hits * 1.2,
            fetched,
            fetched_tokens: fetched,
            cpu,
            cpu_tokens: cpu * 1.5,
        };
        let plans = [
            vec![c(12.0, 8.0, 0.0), c(3.0, 0.0, 9.0)],
            vec![c(0.0, 20.0, 0.0), c(0.0, 1.0, 0.0)],
            vec![c(20.0, 0.0, 0.0), c(7.0, 0.0, 0.0)],
            vec![c(12.0, 2.0, 6.0), c(2.0, 12.0, 1.0)],
            vec![c(5.0, 0.0, 15.0), c(0.0, 0.0, 2.0)],
        ];
        // At every chunk count the engine takes (`--fetch-chunks`), the schedule's.
        for (layout, fetch_chunks) in layouts
            .into_iter()
            .flat_map(|l| (1..=crate::plan::MAX_FETCH_CHUNKS).map(move |k| (l, k)))
        {
            let mut q = p.clone();
            q.layout = layout;
            q.engine_settings = crate::EngineSettings { fetch_chunks };
            for counts in &plans {
                let schedule =
                    LayerSchedule::new(&layout, &q.engine_settings, &counts[..layout.plans()]);
                let got = q.schedule_time(&schedule, &shape, dense);
                let terms = q.schedule_terms(&schedule, &shape, dense);
                let reference = schedule.longest_path(|op| terms.op_us(op));
                assert!(
                    (got.total_us - reference).abs() < 1e-9 * reference,
                    "{layout:?} {fetch_chunks} {counts:?}: {} vs {reference}",
                    got.total_us
                );
                assert!((got.critical.total() - got.total_us).abs() < 1e-9 * got.total_us);
                assert_eq!(
                    got,
                    q.layer_time_gpus(&shape, &counts[..layout.plans()], dense)
                );
                // The early chunks the terms time are the schedule's.
                for (g, c) in schedule.counts.iter().enumerate() {
                    let early = schedule.fetch_chunk_bounds(c.fetched).len() - 1;
                    assert_eq!(terms.gpus[g].fetched.early_chunks, early, "{fetch_chunks}");
                }
            }
        }
    }

    /// One chunk against the default: a layer that fetches two or more experts computes
    /// them in one kernel after the whole gather, so its GPU side moves; a layer that
    /// fetches nothing (resident, CPU-only) or one expert takes the same time.
    #[test]
    fn one_fetch_chunk_moves_only_layers_that_fetch_several_experts() {
        let (p, shape) = setup();
        let one = PerfParams {
            engine_settings: crate::EngineSettings { fetch_chunks: 1 },
            ..p.clone()
        };
        let c = |hits: f64, fetched: f64, cpu: f64| LayerCounts {
            hits,
            hit_tokens: hits,
            fetched,
            fetched_tokens: fetched,
            cpu,
            cpu_tokens: cpu,
        };
        for same in [c(20.0, 0.0, 0.0), c(5.0, 0.0, 15.0), c(10.0, 1.0, 0.0)] {
            assert_eq!(p.layer_time(&shape, &same), one.layer_time(&shape, &same));
        }
        for moved in [c(12.0, 8.0, 0.0), c(0.0, 20.0, 0.0), c(2.0, 2.0, 0.0)] {
            let (d, o) = (p.layer_time(&shape, &moved), one.layer_time(&shape, &moved));
            assert_ne!(d.total_us, o.total_us, "{moved:?}");
        }
    }
}
