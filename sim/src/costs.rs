//! Durations of a layer's pieces, from ft-model's perf cost terms, and the resources they
//! run on.
//!
//! The simulator invents no cost: every duration and bandwidth below is one of
//! [`PerfParams`]'s cost terms (`ft_model::perf::cost`), the same the analytic model's
//! critical path ([`PerfParams::layer_time`]) combines, from the same host mapping
//! ([`PerfParams::from_host`]). What the simulator adds is *when* each piece runs. The
//! mapping of terms to simulated pieces:
//!
//! | piece | term |
//! |---|---|
//! | dense part (GPU stream) | `dense_us(dense, streams, context)` |
//! | hit kernel | `gpu_experts_us` = launch + kernel (the launch hides when queued) |
//! | fetched kernels | `fetched_kernels`: the chunks before the last queued behind the hits, one launch each; the last chunk after the gather and them, its launch after both, or on one GPU (gated, the runtime's default) beside the gather |
//! | gather (H2D copy stream) | `gather_layer_us` once, then per expert `gather_copy_us` + bytes (times `link_serving_factor(threads)` beside a CPU share) at `gather_gbs` |
//! | CPU share | `cpu_fixed_us` (less the pool wake-up, paid only when parked), then bytes (times `1 + cpu_serving_slowdown`) at `cpu_rate_gbs(threads)` |
//! | contention | `dram_shares(cpu rate, gather rate)` while both stream bytes |
//! | round trip | activations to the host at `activation_link_gbs`, `sync_us`, the partial output back; the host's own time in the layer (planning, submitting) beyond the dense part (`host_issue_wait_us`) before the CPU share |
//! | combine | `combine_us` (a launch) |
//! | residual | `overhead.of(work)` after the layer: the fixed cost of the schedule's work (`ft_model::schedule::LayerWork`), not of a strategy |
//! | several GPUs | per GPU: `gpu_expert_shape` experts, `gpu_cpu_threads` CPU workers, one link; `peer_combine_us` after all |

use ft_model::host::HostSpec;
use ft_model::perf::LayerCounts;
use ft_model::perf::{ExpertShape, PerfParams, ACTIVATION_BYTES_PER_ELEMENT, BYTES_PER_US_PER_GBS};
use ft_model::placement::GpuLayout;
use ft_model::preset::{DenseSpec, ModelSpec};
use ft_model::schedule::{LayerSchedule, LayerWork};

use crate::error::Result;
use crate::layer::{CpuShare, LayerCosts, Resources, TAG_GATHER, TAG_RESULT};
use crate::resources::{
    CpuPool, CpuPoolParams, Dram, DramParams, GpuStream, Link, LinkParams, TransferJob,
};
use crate::time::NS_PER_US;

/// How long the CPU pool spins after a layer before parking, ns. The reference engine
/// spin-waits its pool between layers (its PR #619) and a decode step's layers follow each
/// other within a few hundred us, so 1 ms keeps the pool awake within a step and parks it
/// only across idle gaps (a prefill, the end of a run).
pub const SPIN_WINDOW_NS: f64 = 1_000_000.0;

/// Expert copies the copy stream keeps in flight. The analytic gather term serialises
/// every copy's fixed cost, and so does the runtime's single copy stream: 1.
pub const COPIES_IN_FLIGHT: usize = 1;

/// Cost parameters of one host running one model, and the mapping to simulated pieces.
#[derive(Debug, Clone, PartialEq)]
pub struct CostModel {
    /// The perf parameters (from a host spec, or fitted).
    pub params: PerfParams,
    /// The routed expert's bytes and MACs per token.
    pub shape: ExpertShape,
    /// Model width, elements.
    pub hidden: f64,
    /// The dense part of each layer.
    pub dense: DenseSpec,
    /// Part of `params.cpu_layer_us` that is the pool's wake-up, us: the simulated pool
    /// pays it only when its threads have parked (the analytic term pays it every layer).
    pub wake_us: f64,
    /// Spin window of the pool, ns.
    pub spin_window_ns: f64,
    /// CPU weight-streaming rate alone, GB/s (`cpu_rate_gbs(cpu_threads)`).
    pub cpu_gbs: f64,
    /// CPU rate while a gather streams, GB/s.
    pub cpu_contended_gbs: f64,
    /// Gather rate while the CPU streams, GB/s.
    pub gather_contended_gbs: f64,
    /// The GPUs and the placement (`params.layout`).
    pub layout: GpuLayout,
    /// One GPU's share of an expert (`params.gpu_expert_shape`; `shape` on one GPU).
    pub lane_shape: ExpertShape,
}

fn us(x: f64) -> f64 {
    x * NS_PER_US
}

impl CostModel {
    /// Costs of `model` on `host` through [`PerfParams::from_host`].
    pub fn from_host(host: &HostSpec, model: &ModelSpec) -> Result<Self> {
        let params = PerfParams::from_host(host)?;
        Self::new(params, model, host.engine.cpu_wake_us)
    }

    /// Costs of `model` on a resolved host (a spec or a profile).
    pub fn from_sim_host(host: &crate::hosts::SimHost, model: &ModelSpec) -> Result<Self> {
        Self::new(host.perf.params.clone(), model, host.wake_us)
    }

    /// Costs of `model` with given (e.g. fitted) parameters; `wake_us` of
    /// `params.cpu_layer_us` is the pool's wake-up (clamped to it).
    pub fn new(params: PerfParams, model: &ModelSpec, wake_us: f64) -> Result<Self> {
        params.validate()?;
        model.validate()?;
        params.layout.check_model(model)?;
        let shape = ExpertShape::of(model);
        let cpu_gbs = params.cpu_rate_gbs(params.cpu_threads as f64);
        let (cpu_contended_gbs, gather_contended_gbs) =
            params.dram_shares(cpu_gbs, params.gather_gbs);
        Ok(CostModel {
            wake_us: wake_us.clamp(0.0, params.cpu_layer_us),
            shape,
            hidden: model.geometry.hidden as f64,
            dense: model.dense(),
            spin_window_ns: SPIN_WINDOW_NS,
            cpu_gbs,
            cpu_contended_gbs,
            gather_contended_gbs,
            layout: params.layout,
            lane_shape: params.gpu_expert_shape(shape),
            params,
        })
    }

    /// The per-layer combine of `streams` streams on several GPUs, ns (0 on one GPU).
    pub fn combine_ns(&self, streams: usize) -> f64 {
        us(self.params.peer_combine_us(streams as f64, self.hidden))
    }

    /// CPU workers of GPU `gpu`'s share (the whole pool on one GPU).
    fn lane_threads(&self, gpu: u32) -> f64 {
        if self.layout.is_multi() {
            self.params.gpu_cpu_threads(gpu)
        } else {
            self.params.cpu_threads as f64
        }
    }

    /// Fresh resources of every GPU's lane for a run: [`CostModel::resources`] on one GPU;
    /// on several, each lane with its own link and stream, its CPU workers, and a view of
    /// the shared DRAM (`Dram::shared`).
    pub fn lane_resources(&self) -> Vec<Resources> {
        if !self.layout.is_multi() {
            return vec![self.resources()];
        }
        let p = &self.params;
        (0..self.layout.gpus)
            .map(|g| {
                let threads = self.lane_threads(g);
                let cpu_gbs = p.cpu_rate_gbs(threads);
                let (cpu_c, dma_c) = p.dram_shares(cpu_gbs, p.gather_gbs);
                let mut r = self.resources();
                r.dram = Dram::shared(
                    DramParams {
                        dma_isolated_gbs: p.gather_gbs,
                        dma_contended_gbs: dma_c,
                        cpu_isolated_gbs: cpu_gbs,
                        cpu_contended_gbs: cpu_c,
                    },
                    p.dram_gbs,
                    p.dma_dram_weight,
                );
                r.cpu = CpuPool::new(CpuPoolParams {
                    threads: threads as usize,
                    wake_ns: us(self.wake_us),
                    spin_window_ns: self.spin_window_ns,
                });
                r
            })
            .collect()
    }

    /// Bytes of the activations one way for `streams` streams.
    pub fn activation_bytes(&self, streams: usize) -> f64 {
        streams as f64 * self.hidden * ACTIVATION_BYTES_PER_ELEMENT
    }

    /// Fresh resources for a run.
    pub fn resources(&self) -> Resources {
        let p = &self.params;
        Resources {
            gpu: GpuStream::new(),
            h2d: Link::new(LinkParams {
                isolated_gbs: p.gather_gbs,
                max_in_flight: COPIES_IN_FLIGHT,
            }),
            d2h: Link::new(LinkParams {
                isolated_gbs: p.activation_link_gbs,
                max_in_flight: 1,
            }),
            dram: Dram::new(DramParams {
                dma_isolated_gbs: p.gather_gbs,
                dma_contended_gbs: self.gather_contended_gbs,
                cpu_isolated_gbs: self.cpu_gbs,
                cpu_contended_gbs: self.cpu_contended_gbs,
            }),
            cpu: CpuPool::new(CpuPoolParams {
                threads: p.cpu_threads as usize,
                wake_ns: us(self.wake_us),
                spin_window_ns: self.spin_window_ns,
            }),
        }
    }

    /// GPU time of the dense part for `streams` streams with `context_total` tokens of
    /// context summed over them, ns.
    pub fn dense_ns(&self, streams: usize, context_total: u64) -> f64 {
        let b = streams.max(1) as f64;
        us(self
            .params
            .dense_us(&self.dense, b, context_total as f64 / b))
    }

    /// Costs of one layer doing `c` on one GPU, with `dense_ns` of dense part and `streams`
    /// streams (the layer's [`LayerSchedule`] on one GPU, [`CostModel::layer_on`]).
    pub fn layer(&self, c: &LayerCounts, streams: usize, dense_ns: f64) -> LayerCosts {
        let schedule = LayerSchedule::new(
            &GpuLayout::single(),
            &self.params.engine_settings,
            std::slice::from_ref(c),
        );
        self.layer_on(&schedule, streams, dense_ns, 0)
    }

    /// The costs of GPU `gpu`'s operations in `schedule` (its counts, its share of each
    /// expert, `lane_shape`, and its CPU workers), with `dense_ns` of dense part and
    /// `streams` streams: the schedule's operations as the layer machine's pieces, its
    /// gated last chunk and its residual (the fixed cost of the layer's work) included.
    pub fn layer_on(
        &self,
        schedule: &LayerSchedule,
        streams: usize,
        dense_ns: f64,
        gpu: u32,
    ) -> LayerCosts {
        self.costs_of(
            &schedule.counts[gpu as usize],
            schedule,
            schedule.work(),
            streams,
            dense_ns,
            gpu,
        )
    }

    /// [`CostModel::layer_on`] with GPU `gpu`'s counts `c` and the layer's work (what its
    /// residual is keyed by) given, and of `schedule` only the properties its structure
    /// holds: whether its last chunk is gated and the chunks its fetched experts come in
    /// ([`LayerSchedule::fetch_chunk_bounds`]). A schedule of the same structure as the
    /// layer's serves (the simulator shares one per structure).
    pub fn costs_of(
        &self,
        c: &LayerCounts,
        schedule: &LayerSchedule,
        work: LayerWork,
        streams: usize,
        dense_ns: f64,
        gpu: u32,
    ) -> LayerCosts {
        let gated_last_chunk = schedule.gated_last_chunk;
        let p = &self.params;
        let s = self.lane_shape;
        // The CPU computes whole experts (under tensor parallelism too).
        let whole = self.shape;
        let threads = self.lane_threads(gpu);
        let launch = us(p.gpu_launch_us);
        let kernel = |n: f64, t: f64| (us(p.gpu_experts_us(n, t, s)) - launch).max(0.0);
        // Beside a CPU share the gather streams longer than its probe
        // (`PerfParams::link_serving_factor`): as bytes at the same rate, like the CPU's.
        let link_factor = if c.cpu > 0.0 {
            p.link_serving_factor(threads)
        } else {
            1.0
        };
        let gather = (c.fetched > 0.0).then(|| TransferJob {
            tag: TAG_GATHER,
            count: c.fetched as u32,
            bytes_each: s.bytes * link_factor,
            setup_ns: us(p.gather_layer_us),
            per_transfer_ns: us(p.gather_copy_us),
        });
        let act = self.activation_bytes(streams);
        let act_ns = us(act / (p.activation_link_gbs * BYTES_PER_US_PER_GBS));
        let cpu = (c.cpu > 0.0).then(|| CpuShare {
            d2h: TransferJob {
                tag: 0,
                count: 1,
                bytes_each: act,
                setup_ns: 0.0,
                per_transfer_ns: 0.0,
            },
            sync_ns: us(p.sync_us),
            // The host plans and submits the layer before it runs the CPU share
            // (`PerfParams::host_issue_wait_us`, beyond the dense part).
            fixed_ns: (us(p.cpu_fixed_us(c.cpu, c.cpu_tokens, whole, threads)) - us(self.wake_us))
                .max(0.0)
                + us(p.host_issue_wait_us(c, streams as f64, dense_ns / NS_PER_US)),
            // The decode layer's stream: the serving slowdown as bytes streamed at the same
            // demand (`PerfParams::cpu_serving_stream_us`).
            bytes: c.cpu * whole.bytes * (1.0 + p.serving_slowdown(threads)),
            // The partial output's copy takes its bytes over the activation link; as a
            // fixed-time job it keeps its place in the copy stream's FIFO.
            result: TransferJob {
                tag: TAG_RESULT,
                count: 0,
                bytes_each: 0.0,
                setup_ns: act_ns,
                per_transfer_ns: 0.0,
            },
            sum_ns: (us(p.combine_us()) - launch).max(0.0),
        });
        let fetched = p.fetched_kernels(
            &schedule.fetch_chunk_bounds(c.fetched),
            c.fetched,
            c.fetched_tokens,
            s,
        );
        LayerCosts {
            dense_ns,
            launch_ns: launch,
            hit_kernel_ns: kernel(c.hits, c.hit_tokens),
            has_hits: c.hits > 0.0,
            fetched_early_ns: (us(fetched.early_us) - fetched.early_chunks as f64 * launch)
                .max(0.0),
            fetched_early_launches: fetched.early_chunks as u32,
            fetched_kernel_ns: (us(fetched.last_us) - launch).max(0.0),
            fetched_gated: gated_last_chunk,
            overhead_ns: us(p.overhead.of(work)),
            gather,
            cpu,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::layer::LayerRunner;
    use ft_model::perf::StepShape;

    fn setup(host: &str) -> (CostModel, ModelSpec) {
        let h = crate::hosts::preset(host).unwrap();
        let m = ModelSpec::preset("qwen3.8-flash-next").unwrap();
        (CostModel::from_host(&h, &m).unwrap(), m)
    }

    /// One isolated layer of each kind: the event engine's duration is the analytic
    /// layer time up to the documented differences (the pool's wake-up, which the engine
    /// skips while the pool spins; here it starts parked and pays it; the activations'
    /// copies, which the analytic term counts in the round trip, are the same bytes), at
    /// every fetch-chunk count of the engine (`PerfParams::engine_settings`): the simulator
    /// takes its fetched chunks from the layer's schedule, as the closed form does.
    #[test]
    fn isolated_layers_match_the_analytic_layer_time() {
        let hosts = crate::hosts::preset_names();
        let chunk_counts = 1..=ft_model::plan::MAX_FETCH_CHUNKS;
        for (host, fetch_chunks) in hosts
            .iter()
            .flat_map(|h| chunk_counts.clone().map(move |k| (h, k)))
        {
            let (mut cm, model) = setup(host);
            cm.params.engine_settings = ft_model::EngineSettings { fetch_chunks };
            if cm.layout.is_multi() {
                // One lane's runner against the one-GPU closed form: see the GPU-lanes tests.
                continue;
            }
            let shape = StepShape::new(&model, 2, 1200);
            for (kind, hits, fetched, cpu) in [
                ("offload", 12.0, 8.0, 0.0),
                ("resident", 19.0, 0.0, 0.0),
                ("cpu", 12.0, 0.0, 7.0),
                ("hybrid", 11.0, 2.0, 6.0),
                ("hybrid", 2.0, 12.0, 3.0),
                ("layer split's CPU layer", 0.0, 0.0, 9.0),
            ] {
                let c = LayerCounts {
                    hits,
                    hit_tokens: hits * 1.1,
                    fetched,
                    fetched_tokens: fetched,
                    cpu,
                    cpu_tokens: cpu * 1.2,
                };
                let analytic = cm.params.layer_time(&shape, &c);
                let dense = cm.dense_ns(2, 2400);
                let costs = cm.layer(&c, 2, dense);
                let chunks = LayerSchedule::chunk_bounds(fetch_chunks, fetched).len();
                assert_eq!(costs.fetched_early_launches as usize, chunks - 1);
                let (ends, _) = LayerRunner::new(cm.resources(), vec![costs]).run(0);
                let sim_us = ends[0] as f64 / 1e3;
                let rel = (sim_us - analytic.total_us) / analytic.total_us;
                let what = format!(
                    "{host} {fetch_chunks} chunk(s) {kind} {hits}/{fetched}/{cpu}: sim \
                     {sim_us:.2} us, analytic {:.2} us",
                    analytic.total_us
                );
                let contends = cpu > 0.0
                    && fetched > 0.0
                    && (cm.cpu_contended_gbs < cm.cpu_gbs
                        || cm.gather_contended_gbs < cm.params.gather_gbs);
                if contends {
                    // The analytic term starts both byte streams together, which overstates
                    // their overlap; the timeline starts the CPU's later (after the copy,
                    // the round trip and its fixed costs), so it contends less.
                    assert!(rel <= 1e-4 && rel > -0.05, "{what}");
                } else {
                    // Otherwise the two are the same sum of the same terms.
                    assert!(rel.abs() < 1e-4, "{what}");
                }
            }
        }
    }
}
