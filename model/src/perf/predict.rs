//! Prediction: decode tok/s of every strategy, with an interval, the bounding resource, the
//! time split and hybrid's best fetch fraction.
//!
//! Method:
//! 1. **Counts per layer-step.** Each strategy's hits, fetched and CPU experts come from the
//!    shared cache policy and planner ([`crate::cache::build_cache`], [`plan_layer`]) driven
//!    by the routing process, exactly as [`crate::traffic::strategy_traffic`] drives them
//!    (same warm-up, same static-hot handling; a test checks the totals agree), but every
//!    layer-step's counts are kept ([`TrafficSamples`]). Each strategy runs on its own cache
//!    from the same routing (same seed), so hybrid's cache fills only with what it fetched.
//! 2. **Time.** The closed-form layer time ([`PerfParams::layer_time`]) is evaluated on every
//!    sampled layer-step and the step time is the mean over steps of the sum over layers.
//!    This keeps the mean of the per-layer maxima (a layer with many misses is PCIe-bound
//!    while one with few is not), which a time computed from mean counts would miss.
//! 3. **Hybrid's fetch fraction.** The counts depend on `f`, so traffic is sampled on a grid
//!    of [`FETCH_GRID`] points (the same routing each time, so samples align by step and
//!    layer). Between grid points each sample's misses (and their tokens) are interpolated
//!    linearly and split `f : 1 - f` continuously; argmin's Brent minimises that relaxed
//!    step time on the bracket around the best grid point. The optimum is then re-sampled
//!    with the planner's integer split, and the best of it and the grid points is kept. A
//!    fixed `--fetch-fraction` skips the search.
//! 4. **Layer split's CPU layers.** With the other layers resident, the first N layers'
//!    experts run on the CPU, so the other layers' experts must fit the GPU's expert memory
//!    (the cache's slots): N is searched over every count from the fewest that fits to all
//!    layers. A resident or CPU-only layer does no cache work, so two counting runs (every
//!    layer CPU-only, every layer resident) give every count's layers. With the other layers
//!    cached (every miss gathered), N moves the cache's history, so each count of
//!    [`SPLIT_CACHED_GRID`] is one counting run. A given `--cpu-layers` skips the search.
//! 5. **Interval.** The variance of the predicted step time is the sum of three parts: the
//!    parameters' (`g^T C g`, with `g` the central-difference gradient of the step time over
//!    the parameters on the same samples and `C` their covariance from the fit or the host
//!    prior), the sampling's (standard error of the mean over the sampled steps), and the run
//!    noise (`run_noise_rel * T`)^2. The interval is `T +- q sd` with `q` the two-sided
//!    quantile of the t distribution on the fit's residual degrees of freedom (normal for a
//!    host prior), turned into tok/s (`1e6 / T` per stream).
//!
//! **Fixed miss rate** ([`MissMode::FixedOffload`]): the offload miss rate is given instead
//! of simulated. The cache size is calibrated (bisection on slots) until offload's simulated
//! miss rate under the routing process matches it; every strategy, hybrid included, is then
//! sampled on that cache. Hybrid's miss rate therefore follows from the same cache and
//! routing that give offload the requested rate, through its own cache history.

use argmin::core::{CostFunction, Executor, State};
use argmin::solver::brent::BrentOpt;
use serde::{Deserialize, Serialize};
use statrs::distribution::{ContinuousCDF, Normal, StudentsT};
use std::sync::Arc;

use super::legacy::{BenchBw, LegacyRatio, DEFAULT_THRESHOLD};
use super::step::{LayerCounts, Resource, StepShape, TimeSplit};
use super::{ParamId, PerfModel, PerfParams};
use crate::cache::{CacheOptions, CacheSize};
use crate::error::{ModelError, Result};
use crate::placement::GpuLayout;
use crate::plan::plan_layer_placed;
use crate::preset::ModelSpec;
use crate::routing::{self, RoutingSource, StepRouting};
use crate::strategy::{
    CpuLayers, FetchFraction, LayerPlacement, PlacementPolicy, Strategy, StrategyKind,
};
use crate::traffic::{plan_layer_gpus, strategy_cache, strategy_caches, warm_up, warm_up_gpus};

/// Fetch fractions at which hybrid's traffic is sampled before the continuous search.
/// It runs from 0 (every miss on the CPU: the cpu strategy's traffic) to 1 (every miss
/// fetched: offload's), which [`predict`] takes from its ends.
pub const FETCH_GRID: [f64; 21] = [
    0.0, 0.05, 0.1, 0.15, 0.2, 0.25, 0.3, 0.35, 0.4, 0.45, 0.5, 0.55, 0.6, 0.65, 0.7, 0.75, 0.8,
    0.85, 0.9, 0.95, 1.0,
];
const _: () = assert!(FETCH_GRID[0] == 0.0 && FETCH_GRID[FETCH_GRID.len() - 1] == 1.0);

/// Absolute tolerance of the fetch-fraction search (a hundredth of a percent of misses).
pub const FETCH_TOLERANCE: f64 = 1e-4;

/// Iterations allowed to the fetch-fraction search (Brent converges in a few dozen).
pub const FETCH_MAX_ITERS: u64 = 100;

/// Default confidence of the prediction intervals.
pub const DEFAULT_CONFIDENCE: f64 = 0.95;

/// Tolerance on the calibrated offload miss rate in fixed-miss-rate mode (absolute).
pub const MISS_RATE_TOLERANCE: f64 = 0.005;

/// How the miss rates are obtained.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "kebab-case", deny_unknown_fields)]
pub enum MissMode {
    /// Simulate every strategy's cache under the routing process.
    Simulated,
    /// Offload's miss rate is given (0 to 1); the cache is calibrated to it (module docs).
    FixedOffload {
        /// Offload's expert-level miss rate.
        miss_rate: f64,
    },
}

/// What to predict.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PredictConfig {
    /// Concurrent streams.
    pub streams: usize,
    /// Context length of each stream, in tokens.
    pub context: usize,
    /// GPU expert cache size; `None`: what the GPU's memory holds after the dense weights,
    /// the KV cache and the reserve ([`default_cache_slots`]).
    pub cache: Option<CacheSize>,
    /// The cache's policy, topology and admission.
    #[serde(default)]
    pub cache_options: CacheOptions,
    /// Routing: a preset name, a process TOML file or a trace ([`routing::resolve`]).
    pub routing: String,
    /// Seed replacing the routing process's.
    pub seed: Option<u64>,
    /// Warm-up steps before counting.
    pub warmup_steps: usize,
    /// Counted steps.
    pub steps: usize,
    /// Simulated or fixed miss rates.
    pub miss: MissMode,
    /// Hybrid's fetch fraction: searched (`auto`) or fixed.
    pub hybrid_fetch: FetchFraction,
    /// Layer split's CPU layers (both layer splits): searched (`auto`) or fixed; `None`
    /// leaves layer split out of the prediction, as a caller whose engine cannot run it
    /// must (the multi-GPU engine refuses layer split): `ft predict`, `ft explain` and
    /// `ft simulate` ask for it.
    #[serde(default)]
    pub layer_split: Option<CpuLayers>,
    /// Threshold of the legacy rule.
    pub threshold: f64,
    /// Confidence of the intervals (0 to 1).
    pub confidence: f64,
    /// A measured `ft bench bw` pair for the legacy rule; `None`: the host's bench numbers
    /// where it has them, else what the model says the bench would measure.
    pub bench: Option<BenchBw>,
}

impl Default for PredictConfig {
    /// One stream at 1024 tokens of context, the cache the GPU holds, LRU, the `typical`
    /// routing preset, 100 warm-up and 200 counted steps, simulated miss rates, auto fetch
    /// fraction, layer split left out, threshold 2, 95% intervals.
    fn default() -> Self {
        PredictConfig {
            streams: 1,
            context: 1024,
            cache: None,
            cache_options: CacheOptions::default(),
            routing: "typical".to_string(),
            seed: None,
            warmup_steps: 100,
            steps: 200,
            miss: MissMode::Simulated,
            hybrid_fetch: FetchFraction::Auto,
            layer_split: None,
            threshold: DEFAULT_THRESHOLD,
            confidence: DEFAULT_CONFIDENCE,
            bench: None,
        }
    }
}

impl PredictConfig {
    /// Check the configuration; errors name the flag.
    pub fn validate(&self) -> Result<()> {
        if self.streams == 0 {
            return Err(ModelError::invalid("--streams", "must be at least 1"));
        }
        if self.steps == 0 {
            return Err(ModelError::invalid("--steps", "must be at least 1"));
        }
        if !(self.confidence > 0.0 && self.confidence < 1.0) {
            return Err(ModelError::invalid(
                "confidence",
                format!("{} is outside (0, 1)", self.confidence),
            ));
        }
        if !(self.threshold.is_finite() && self.threshold > 0.0) {
            return Err(ModelError::invalid(
                "--threshold",
                format!("{} is not a positive number", self.threshold),
            ));
        }
        if let MissMode::FixedOffload { miss_rate } = self.miss {
            if !(0.0..=1.0).contains(&miss_rate) {
                return Err(ModelError::invalid(
                    "--miss-rate",
                    format!("{miss_rate} is outside [0, 1]"),
                ));
            }
        }
        Ok(())
    }
}

/// Every layer-step's counts of one strategy's run.
#[derive(Debug, Clone, PartialEq)]
pub struct TrafficSamples {
    /// The fetch fraction of the cached layers.
    pub fetch_fraction: f64,
    /// Layers planned on the CPU (the first ones; 0 but for layer split).
    pub cpu_layers: usize,
    /// Slots of the cache (of each GPU's).
    pub cache_slots: usize,
    /// MoE layers per step.
    pub layers: usize,
    /// Plans per layer-step ([`crate::GpuLayout::plans`]: 1 on one GPU and under tensor
    /// parallelism, G when sharded).
    pub plans: usize,
    /// Counts, step-major: `counts[(step * layers + layer) * plans + plan]`.
    pub counts: Vec<LayerCounts>,
}

impl TrafficSamples {
    /// Counted steps.
    pub fn steps(&self) -> usize {
        self.counts.len() / (self.layers * self.plans).max(1)
    }

    /// Counts summed over layers (and over the GPUs' plans when sharded), averaged over
    /// steps (per step).
    pub fn mean_per_step(&self) -> LayerCounts {
        let mut s = LayerCounts::default();
        for c in &self.counts {
            s.hits += c.hits;
            s.hit_tokens += c.hit_tokens;
            s.fetched += c.fetched;
            s.fetched_tokens += c.fetched_tokens;
            s.cpu += c.cpu;
            s.cpu_tokens += c.cpu_tokens;
        }
        s.scaled(1.0 / self.steps().max(1) as f64)
    }

    /// Expert-level miss rate: misses over distinct experts.
    pub fn miss_rate(&self) -> f64 {
        let m = self.mean_per_step();
        if m.unique() == 0.0 {
            0.0
        } else {
            m.misses() / m.unique()
        }
    }
}

/// One counting run: which strategy's cache, placed how, for how long.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct SampleRun<'a> {
    /// Strategy whose cache is built ([`crate::cache::build_cache`]).
    pub kind: StrategyKind,
    /// Each layer's placement (and the fetch fraction the planner splits misses with).
    pub placement: PlacementPolicy,
    /// The cache's policy, topology and admission.
    pub cache: &'a CacheOptions,
    /// Cache slots.
    pub slots: usize,
    /// Steps before counting.
    pub warmup_steps: usize,
    /// Counted steps.
    pub steps: usize,
    /// Concurrent streams.
    pub streams: usize,
}

/// Run a strategy's cache and planner over `warmup_steps + steps` steps of `source` and keep
/// every counted layer-step (the same procedure as [`crate::traffic::strategy_traffic`]).
pub fn sample_traffic(
    source: &mut dyn RoutingSource,
    run: &SampleRun<'_>,
) -> Result<TrafficSamples> {
    let SampleRun {
        kind,
        placement,
        cache,
        slots,
        warmup_steps,
        steps,
        streams,
    } = *run;
    let geometry = *source.geometry();
    let (mut cache, warmup) = strategy_cache(source, kind, cache, slots, warmup_steps, streams)?;
    warm_up(source, &mut cache, &placement, warmup, streams)?;
    let mut step = StepRouting::default();
    let layers = geometry.moe_layers;
    let mut counts = Vec::with_capacity(steps * layers);
    for _ in 0..steps {
        source.next_step_into(streams, &mut step)?;
        for (l, routes) in step.layers.iter().enumerate() {
            let p = plan_layer_placed(l, routes, &mut cache, placement.layer(l));
            counts.push(LayerCounts::of_plan(&p));
        }
    }
    Ok(TrafficSamples {
        fetch_fraction: placement.fetch_fraction(),
        cpu_layers: placement.cpu_layers,
        cache_slots: cache.capacity(),
        layers,
        plans: 1,
        counts,
    })
}

/// [`sample_traffic`] on the GPUs of `layout`: one cache per plan
/// ([`crate::traffic::strategy_caches`], `run.slots` slots each) and every layer planned by
/// [`crate::traffic::plan_layer_gpus`]; one GPU is exactly [`sample_traffic`].
pub fn sample_traffic_gpus(
    source: &mut dyn RoutingSource,
    run: &SampleRun<'_>,
    layout: &GpuLayout,
) -> Result<TrafficSamples> {
    if layout.plans() == 1 && !layout.is_multi() {
        return sample_traffic(source, run);
    }
    let SampleRun {
        kind,
        placement,
        cache,
        slots,
        warmup_steps,
        steps,
        streams,
    } = *run;
    let geometry = *source.geometry();
    let (mut caches, warmup) =
        strategy_caches(source, kind, cache, slots, warmup_steps, streams, layout)?;
    warm_up_gpus(source, &mut caches, layout, &placement, warmup, streams)?;
    let mut step = StepRouting::default();
    let layers = geometry.moe_layers;
    let plans = caches.len();
    let mut counts = Vec::with_capacity(steps * layers * plans);
    for _ in 0..steps {
        source.next_step_into(streams, &mut step)?;
        for (l, routes) in step.layers.iter().enumerate() {
            for p in plan_layer_gpus(l, routes, &mut caches, layout, &placement) {
                counts.push(LayerCounts::of_plan(&p));
            }
        }
    }
    Ok(TrafficSamples {
        fetch_fraction: placement.fetch_fraction(),
        cpu_layers: placement.cpu_layers,
        cache_slots: caches[0].capacity(),
        layers,
        plans,
        counts,
    })
}

/// The expert slots a GPU holds for a model: its memory less the reserve, the dense weights
/// of every layer and the KV cache of `streams` streams at `context` tokens, over the expert
/// size; at least 1 and at most every routed expert.
///
/// On several GPUs ([`PerfParams::layout`]) these are each GPU's slots: every GPU holds the
/// dense weights and KV cache, and its free bytes hold whole experts when sharded
/// ([`GpuLayout::slots_per_gpu`]: slices under tensor parallelism), at most the experts it
/// holds.
pub fn default_cache_slots(
    model: &ModelSpec,
    p: &PerfParams,
    streams: usize,
    context: usize,
) -> usize {
    let free =
        p.gpu_memory_bytes - p.gpu_reserve_bytes - dense_and_kv_bytes(model, streams, context);
    let layout = p.layout;
    if !layout.is_multi() {
        let slots = (free / model.expert_bytes() as f64).floor();
        return (slots.max(1.0) as u64).min(model.geometry.total_experts()) as usize;
    }
    let slots = layout.slots_per_gpu(free.max(0.0) as u64, model.expert_bytes());
    slots.max(1).min(experts_held_per_gpu(model, &layout))
}

/// The most routed experts one GPU holds (a slice of each under tensor parallelism): every
/// expert, or when sharded the largest owner's share (`ceil(E / G)` per layer).
pub fn experts_held_per_gpu(model: &ModelSpec, layout: &GpuLayout) -> usize {
    let g = model.geometry;
    match layout.placement {
        crate::placement::GpuPlacement::TensorParallel => g.total_experts() as usize,
        crate::placement::GpuPlacement::Sharded => {
            g.experts.div_ceil(layout.count().max(1)) * g.moe_layers
        }
    }
}

/// Bytes of every layer's dense weights and KV cache on the GPU.
fn dense_and_kv_bytes(model: &ModelSpec, streams: usize, context: usize) -> f64 {
    let d = model.dense();
    let layers = model.geometry.moe_layers as f64;
    layers
        * (d.weight_bytes_per_layer as f64
            + (streams * context) as f64 * d.kv_bytes_per_token as f64)
}

/// The step time of a strategy on samples, with its split.
#[derive(Debug, Clone, Copy, PartialEq, Default, Serialize, Deserialize)]
pub struct StepEval {
    /// Mean step time, in us.
    pub step_us: f64,
    /// Standard error of that mean over the sampled steps, in us.
    pub sampling_se_us: f64,
    /// Mean critical-path split per step, in us (sums to `step_us`).
    pub critical: TimeSplit,
    /// Mean busy time per resource per step, in us.
    pub busy: TimeSplit,
    /// Mean time lost to DRAM contention per step, in us.
    pub contention_us: f64,
}

/// Evaluate the step time with parameters `p` on `samples` (each layer-step's schedule in
/// closed form: its cost follows from its work, whatever strategy planned it).
pub fn evaluate(p: &PerfParams, shape: &StepShape, samples: &TrafficSamples) -> StepEval {
    let dense = p.dense_us(&shape.dense, shape.streams, shape.context);
    let plans = samples.plans.max(1);
    let layers = samples.layers.max(1);
    let steps = samples.steps().max(1);
    let mut totals = Vec::with_capacity(steps);
    let mut critical = TimeSplit::default();
    let mut busy = TimeSplit::default();
    let mut contention = 0.0;
    for chunk in samples.counts.chunks(layers * plans) {
        let mut t = 0.0;
        for c in chunk.chunks(plans) {
            let lt = if p.engine.hybrid_miss_factor == 1.0 {
                p.layer_time_gpus(shape, c, dense)
            } else {
                let scaled: Vec<LayerCounts> =
                    c.iter().map(|x| p.engine.apply_miss_factor(x)).collect();
                p.layer_time_gpus(shape, &scaled, dense)
            };
            t += lt.total_us;
            critical = critical.plus(&lt.critical);
            busy = busy.plus(&lt.busy);
            contention += lt.contention_us;
        }
        totals.push(t);
    }
    let (mean, se) = mean_and_se(&totals);
    let k = 1.0 / steps as f64;
    StepEval {
        step_us: mean,
        sampling_se_us: se,
        critical: critical.scaled(k),
        busy: busy.scaled(k),
        contention_us: contention * k,
    }
}

fn mean_and_se(v: &[f64]) -> (f64, f64) {
    if v.is_empty() {
        return (0.0, 0.0);
    }
    let n = v.len() as f64;
    let mean = v.iter().sum::<f64>() / n;
    if v.len() < 2 {
        return (mean, 0.0);
    }
    let var = v.iter().map(|x| (x - mean) * (x - mean)).sum::<f64>() / (n - 1.0);
    (mean, (var / n).sqrt())
}

/// Hybrid's step time at any `f`, from traffic sampled on a grid (module docs, step 3).
struct RelaxedHybrid<'a> {
    p: &'a PerfParams,
    shape: &'a StepShape,
    grid: &'a [TrafficSamples],
}

impl RelaxedHybrid<'_> {
    fn step_us(&self, f: f64) -> f64 {
        let f = f.clamp(0.0, 1.0);
        let g = self.grid;
        let i = g
            .windows(2)
            .position(|w| f <= w[1].fetch_fraction)
            .unwrap_or(g.len() - 2);
        let (a, b) = (&g[i], &g[i + 1]);
        let span = b.fetch_fraction - a.fetch_fraction;
        let alpha = if span > 0.0 {
            (f - a.fetch_fraction) / span
        } else {
            0.0
        };
        let dense = self
            .p
            .dense_us(&self.shape.dense, self.shape.streams, self.shape.context);
        let plans = a.plans.max(1);
        let mut total = 0.0;
        let mut layer = Vec::with_capacity(plans);
        for (x, y) in a.counts.iter().zip(&b.counts) {
            let unique = x.unique();
            let tokens = x.hit_tokens + x.fetched_tokens + x.cpu_tokens;
            let m = (1.0 - alpha) * x.misses() + alpha * y.misses();
            let mt = (1.0 - alpha) * (x.fetched_tokens + x.cpu_tokens)
                + alpha * (y.fetched_tokens + y.cpu_tokens);
            let c = LayerCounts {
                hits: unique - m,
                hit_tokens: tokens - mt,
                fetched: f * m,
                fetched_tokens: f * mt,
                cpu: (1.0 - f) * m,
                cpu_tokens: (1.0 - f) * mt,
            };
            layer.push(c);
            if layer.len() == plans {
                total += self.p.layer_time_gpus(self.shape, &layer, dense).total_us;
                layer.clear();
            }
        }
        total / a.steps().max(1) as f64
    }
}

impl CostFunction for RelaxedHybrid<'_> {
    type Param = f64;
    type Output = f64;

    fn cost(&self, f: &f64) -> std::result::Result<f64, argmin::core::Error> {
        Ok(self.step_us(*f))
    }
}

/// One point of hybrid's step time over the fetch fraction.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct FetchPoint {
    /// Fetch fraction.
    pub fetch_fraction: f64,
    /// Predicted step time, in us.
    pub step_us: f64,
    /// Hybrid's expert-level miss rate at this fraction.
    pub miss_rate: f64,
}

/// How hybrid's fetch fraction was chosen.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct FetchSearch {
    /// The step time at each grid fraction (planner's integer split).
    pub grid: Vec<FetchPoint>,
    /// The bracket Brent searched (the best grid point's neighbours).
    pub bracket: [f64; 2],
    /// The relaxed optimum Brent found, before re-sampling.
    pub relaxed_optimum: f64,
    /// Brent's iterations.
    pub iterations: u64,
    /// Brent's termination reason.
    pub termination: String,
    /// The fraction chosen.
    pub chosen: f64,
    /// True when the fraction was given, not searched.
    pub fixed: bool,
}

/// Standard deviation parts of a predicted step time, in us.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
pub struct Uncertainty {
    /// From the parameters' covariance.
    pub params_us: f64,
    /// From sampling the routing (standard error of the mean step).
    pub sampling_us: f64,
    /// From run-to-run noise of a measured run.
    pub run_noise_us: f64,
    /// All three combined (root sum of squares).
    pub total_us: f64,
    /// The parameters contributing most to `params_us` (their own variance only, largest
    /// first, at most [`TOP_CONTRIBUTORS`]), as (parameter, standard deviation in us).
    pub top_params: Vec<(ParamId, f64)>,
}

/// Parameters listed in [`Uncertainty::top_params`].
pub const TOP_CONTRIBUTORS: usize = 3;

/// The prediction for one strategy.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct StrategyPrediction {
    /// The strategy (hybrid with its chosen fraction).
    pub strategy: Strategy,
    /// The strategy's kind.
    pub kind: StrategyKind,
    /// Layer split's CPU layers (`None` for the other kinds).
    #[serde(default)]
    pub cpu_layers: Option<usize>,
    /// False when it cannot run (resident without the memory); it is still predicted.
    pub feasible: bool,
    /// Why it is not feasible.
    pub note: Option<String>,
    /// Hybrid's fetch fraction (1 offload and resident, 0 cpu).
    pub fetch_fraction: f64,
    /// Predicted step time, in us (each stream decodes one token per step).
    pub step_us: f64,
    /// Its interval, in us.
    pub step_interval_us: [f64; 2],
    /// Standard deviation parts.
    pub uncertainty: Uncertainty,
    /// Decode tok/s of each stream.
    pub tok_s_per_stream: f64,
    /// Its interval.
    pub tok_s_per_stream_interval: [f64; 2],
    /// Decode tok/s of all streams together.
    pub tok_s_total: f64,
    /// Its interval.
    pub tok_s_total_interval: [f64; 2],
    /// The resource holding the largest share of the critical path.
    pub bound: Resource,
    /// Critical-path split of a step (= of one token of each stream), in us.
    pub critical: TimeSplit,
    /// Busy time of each resource in a step, in us.
    pub busy: TimeSplit,
    /// Time lost to DRAM contention in a step, in us.
    pub contention_us: f64,
    /// Counts per step (summed over layers).
    pub counts: LayerCounts,
    /// Expert-level miss rate.
    pub miss_rate: f64,
    /// Bytes crossing the link per step.
    pub link_bytes_per_step: f64,
}

/// Predictions for every strategy, and the legacy rule beside them.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Prediction {
    /// Model name.
    pub model: String,
    /// Bytes of one routed expert.
    pub expert_bytes: u64,
    /// MoE layers.
    pub layers: usize,
    /// Where the parameters came from.
    pub source: String,
    /// The configuration.
    pub config: PredictConfig,
    /// Cache slots used (given, derived from GPU memory, or calibrated); each GPU's on
    /// several GPUs.
    pub cache_slots: usize,
    /// The GPUs the prediction is for ([`PerfParams::layout`]).
    #[serde(default)]
    pub layout: GpuLayout,
    /// Offload's simulated miss rate (equal to the requested one, within
    /// [`MISS_RATE_TOLERANCE`], in fixed-miss-rate mode when reachable).
    pub offload_miss_rate: f64,
    /// One entry per strategy, in [`StrategyKind::ALL`] order (without layer split where the
    /// configuration leaves it out).
    pub strategies: Vec<StrategyPrediction>,
    /// How hybrid's fraction was chosen.
    pub fetch_search: FetchSearch,
    /// How layer split's CPU layers were chosen (`None` where it was left out).
    #[serde(default)]
    pub layer_split: Option<LayerSplitSearch>,
    /// The legacy rule.
    pub legacy: LegacyRatio,
    /// The legacy rule's fetch fraction evaluated by the model (hybrid at that fraction), for
    /// comparison with the chosen one.
    pub legacy_fraction_step_us: Option<f64>,
    /// The counting runs the prediction was made from, for its break-evens; not serialized.
    #[serde(skip)]
    pub(crate) traffic: KeptTraffic,
}

/// The counting runs a prediction was made from, kept with it (never serialized) so that its
/// break-evens ([`super::breakeven::Scenario::new`]) evaluate the same traffic instead of
/// counting it again. A prediction read back from JSON has none: its break-evens count.
#[derive(Debug, Clone, Default)]
pub(crate) struct KeptTraffic(Option<Arc<StrategyTraffic>>);

impl KeptTraffic {
    /// The runs, where kept.
    pub(crate) fn get(&self) -> Option<&StrategyTraffic> {
        self.0.as_deref()
    }
}

impl PartialEq for KeptTraffic {
    /// Always equal: the runs are a cache of what the prediction's inputs give, not part of
    /// its value (a prediction read back from JSON equals the one written).
    fn eq(&self, _: &Self) -> bool {
        true
    }
}

/// The counting runs of a prediction that [`super::breakeven::Scenario::new`] would make
/// again, each as it would make it (kind, placement, cache, routing and seed).
#[derive(Debug)]
pub(crate) struct StrategyTraffic {
    /// Offload's (hybrid's grid at f = 1).
    pub offload: TrafficSamples,
    /// Cpu's (the grid at f = 0).
    pub cpu: TrafficSamples,
    /// Resident's.
    pub resident: TrafficSamples,
    /// Hybrid's at its chosen fraction.
    pub hybrid: TrafficSamples,
    /// Hybrid's at every fraction of [`FETCH_GRID`] where the fraction was searched; empty
    /// where it was fixed.
    pub grid: Vec<TrafficSamples>,
    /// Layer split cached's at its CPU layers (a counting run of its own; layer split's
    /// resident rest is composed from two runs, so it is counted again).
    pub split_cached: Option<TrafficSamples>,
}

impl Prediction {
    /// The prediction of one strategy (every strategy is predicted but layer split where
    /// the configuration leaves it out, [`PredictConfig::layer_split`]).
    pub fn get(&self, kind: StrategyKind) -> &StrategyPrediction {
        self.try_get(kind)
            .expect("every strategy is predicted (layer split unless left out)")
    }

    /// The prediction of one strategy, `None` where it was left out.
    pub fn try_get(&self, kind: StrategyKind) -> Option<&StrategyPrediction> {
        self.strategies.iter().find(|s| s.kind == kind)
    }
}

/// The two-sided quantile of the intervals: Student's t at a fit's residual degrees of
/// freedom; the normal where there are none to estimate the scatter from, a host spec's
/// prior (`None`) or a calibration with as many terms as runs (`Some(0)`), whose errors
/// then assume a known run noise.
fn quantile(confidence: f64, dof: Option<usize>) -> f64 {
    let p = 0.5 + confidence / 2.0;
    match dof {
        Some(d) if d >= 1 => StudentsT::new(0.0, 1.0, d as f64)
            .map(|t| t.inverse_cdf(p))
            .unwrap_or(1.96),
        _ => Normal::new(0.0, 1.0)
            .map(|n| n.inverse_cdf(p))
            .unwrap_or(1.96),
    }
}

/// Gradient of the step time over the covariance's parameters (central differences on the
/// same samples), in us per unit of each parameter.
fn gradient(model: &PerfModel, shape: &StepShape, samples: &TrafficSamples) -> Vec<f64> {
    model
        .covariance
        .params
        .iter()
        .map(|&id| {
            let v = model.params.get(id);
            let h = if v.abs() > 1e-9 { 1e-4 * v.abs() } else { 1e-4 };
            let (lo, hi) = if id.positive() && v - h < 0.0 {
                (v, v + h)
            } else {
                (v - h, v + h)
            };
            let at = |x: f64| {
                let mut p = model.params.clone();
                p.set(id, x);
                evaluate(&p, shape, samples).step_us
            };
            (at(hi) - at(lo)) / (hi - lo)
        })
        .collect()
}

/// Open the routing for a run (a fresh source each time: same seed, same routing).
fn open_routing(model: &ModelSpec, config: &PredictConfig) -> Result<Box<dyn RoutingSource>> {
    routing::resolve(&config.routing, &model.geometry, config.seed)
}

fn sample_on(
    model: &ModelSpec,
    config: &PredictConfig,
    kind: StrategyKind,
    placement: PlacementPolicy,
    slots: usize,
    layout: &GpuLayout,
) -> Result<TrafficSamples> {
    let mut src = open_routing(model, config)?;
    sample_traffic_gpus(
        src.as_mut(),
        &SampleRun {
            kind,
            placement,
            cache: &config.cache_options,
            slots,
            warmup_steps: config.warmup_steps,
            steps: config.steps,
            streams: config.streams,
        },
        layout,
    )
}

/// Slots at which offload's simulated miss rate is `target` (bisection; the miss rate falls
/// as slots grow). Returns the slots and the miss rate reached.
pub fn calibrate_cache_slots(
    model: &ModelSpec,
    config: &PredictConfig,
    target: f64,
) -> Result<(usize, f64)> {
    calibrate_cache_slots_on(model, config, target, &GpuLayout::single())
}

/// [`calibrate_cache_slots`] on the GPUs of `layout`: the slots of each GPU's cache at
/// which offload's miss rate over all GPUs is `target`.
pub fn calibrate_cache_slots_on(
    model: &ModelSpec,
    config: &PredictConfig,
    target: f64,
    layout: &GpuLayout,
) -> Result<(usize, f64)> {
    let total = experts_held_per_gpu(model, layout);
    let rate = |slots: usize| -> Result<f64> {
        Ok(sample_on(
            model,
            config,
            StrategyKind::Offload,
            PlacementPolicy::cached(1.0),
            slots,
            layout,
        )?
        .miss_rate())
    };
    let (mut lo, mut hi) = (1usize, total);
    let (mut r_lo, mut r_hi) = (rate(lo)?, rate(hi)?);
    if target >= r_lo {
        return Ok((lo, r_lo));
    }
    if target <= r_hi {
        return Ok((hi, r_hi));
    }
    while hi - lo > 1 {
        let mid = lo + (hi - lo) / 2;
        let r = rate(mid)?;
        if (r - target).abs() <= MISS_RATE_TOLERANCE / 4.0 {
            return Ok((mid, r));
        }
        if r > target {
            lo = mid;
            r_lo = r;
        } else {
            hi = mid;
            r_hi = r;
        }
    }
    Ok(if (r_lo - target).abs() <= (r_hi - target).abs() {
        (lo, r_lo)
    } else {
        (hi, r_hi)
    })
}

/// Predict every strategy for `model` with `perf` under `config`.
pub fn predict(model: &ModelSpec, perf: &PerfModel, config: &PredictConfig) -> Result<Prediction> {
    config.validate()?;
    model.validate()?;
    perf.params.validate()?;
    let p = &perf.params;
    p.layout.check_model(model)?;
    let shape = StepShape::new(model, config.streams, config.context);
    let total = model.geometry.total_experts();
    // On several GPUs a cache size is each GPU's (in slots of its expert slices).
    let slot_bytes = p.layout.bytes_per_gpu(model.expert_bytes());
    let slots = match config.miss {
        MissMode::FixedOffload { miss_rate } => {
            calibrate_cache_slots_on(model, config, miss_rate, &p.layout)?.0
        }
        MissMode::Simulated => match config.cache {
            Some(size) => size.slots(slot_bytes, total)?,
            None => default_cache_slots(model, p, config.streams, config.context),
        },
    };
    let slots = config
        .cache_options
        .fit_slots(slots, model.geometry.moe_layers)?;

    // Hybrid's grid doubles as cpu (f = 0, its first point) and offload (f = 1, its last):
    // the three kinds build the same cold cache, and the warm-up and planner see only the
    // placement, so from the same routing the counts are the same (tested:
    // `the_grid_ends_are_offload_and_cpu`). Its inner points are sampled only where the
    // fraction is searched.
    let hybrid_at = |f: f64| {
        sample_on(
            model,
            config,
            StrategyKind::Hybrid,
            PlacementPolicy::cached(f),
            slots,
            &p.layout,
        )
    };
    let grid: Vec<TrafficSamples> = match config.hybrid_fetch {
        FetchFraction::Auto => FETCH_GRID
            .iter()
            .map(|&f| hybrid_at(f))
            .collect::<Result<_>>()?,
        FetchFraction::Fixed(_) => vec![hybrid_at(0.0)?, hybrid_at(1.0)?],
    };
    let cpu = grid[0].clone();
    let offload = grid[grid.len() - 1].clone();
    let resident = sample_on(
        model,
        config,
        StrategyKind::Resident,
        PlacementPolicy::cached(1.0),
        slots,
        &p.layout,
    )?;

    let (hybrid, search) = match config.hybrid_fetch {
        FetchFraction::Fixed(f) => {
            let s = hybrid_at(f)?;
            let t = evaluate(p, &shape, &s).step_us;
            let search = FetchSearch {
                grid: vec![FetchPoint {
                    fetch_fraction: f,
                    step_us: t,
                    miss_rate: s.miss_rate(),
                }],
                bracket: [f, f],
                relaxed_optimum: f,
                iterations: 0,
                termination: "fixed by the caller".to_string(),
                chosen: f,
                fixed: true,
            };
            (s, search)
        }
        FetchFraction::Auto => search_fetch(model, config, p, &shape, &grid, slots)?,
    };

    let legacy = legacy_for(p, config);
    let legacy_fraction_step_us = match legacy.fetch_fraction {
        Some(f) => {
            let s = hybrid_at(f)?;
            Some(evaluate(p, &shape, &s).step_us)
        }
        None => None,
    };

    let q = quantile(config.confidence, perf.dof);
    // What one GPU must hold for resident: its experts (slices) and the dense part.
    let held = experts_held_per_gpu(model, &p.layout);
    let resident_bytes =
        held as f64 * slot_bytes as f64 + dense_and_kv_bytes(model, config.streams, config.context);
    // Bytes over all links per counted expert: each plan's experts cross their GPU's link
    // once when sharded; under tensor parallelism a slice of each crosses every link.
    let link_bytes_per_expert =
        slot_bytes as f64 * (p.layout.count() / samples_plans(&p.layout)) as f64;
    let resident_room = p.gpu_memory_bytes - p.gpu_reserve_bytes;
    let split = match config.layer_split {
        Some(n) => Some(search_layer_split(
            model, config, n, p, &shape, slots, held,
        )?),
        None => None,
    };
    let fixed = |n: usize| CpuLayers::Fixed(n);
    let mut strategies = Vec::new();
    for kind in StrategyKind::ALL {
        let (samples, strategy, f) = match kind {
            StrategyKind::Offload => (&offload, Strategy::Offload, 1.0),
            StrategyKind::Hybrid => (
                &hybrid,
                Strategy::Hybrid {
                    fetch: FetchFraction::Fixed(search.chosen),
                },
                search.chosen,
            ),
            StrategyKind::Resident => (&resident, Strategy::Resident, 1.0),
            StrategyKind::Cpu => (&cpu, Strategy::Cpu, 0.0),
            StrategyKind::LayerSplit => match &split {
                Some((_, resident_rest, _)) => (
                    resident_rest,
                    Strategy::LayerSplit {
                        cpu_layers: fixed(resident_rest.cpu_layers),
                    },
                    1.0,
                ),
                None => continue,
            },
            StrategyKind::LayerSplitCached => match &split {
                Some((_, _, cached)) => (
                    cached,
                    Strategy::LayerSplitCached {
                        cpu_layers: fixed(cached.cpu_layers),
                    },
                    1.0,
                ),
                None => continue,
            },
        };
        let ev = evaluate(p, &shape, samples);
        let g = gradient(perf, &shape, samples);
        let params_var = perf.covariance.quadratic_form(&g).max(0.0);
        let mut top_params: Vec<(ParamId, f64)> = perf
            .covariance
            .params
            .iter()
            .enumerate()
            .map(|(i, &id)| {
                (
                    id,
                    (g[i] * g[i] * perf.covariance.matrix[i][i]).max(0.0).sqrt(),
                )
            })
            .filter(|(_, sd)| *sd > 0.0)
            .collect();
        top_params.sort_by(|a, b| b.1.total_cmp(&a.1));
        top_params.truncate(TOP_CONTRIBUTORS);
        let noise = p.run_noise_rel * ev.step_us;
        let sd = (params_var + ev.sampling_se_us.powi(2) + noise * noise).sqrt();
        let lo = (ev.step_us - q * sd).max(ev.step_us * 1e-3);
        let hi = ev.step_us + q * sd;
        let b = shape.streams;
        let (feasible, note) = if kind == StrategyKind::Resident && resident_bytes > resident_room {
            (
                false,
                Some(format!(
                    "needs {:.1} GiB of GPU memory for all experts, dense weights and KV; {:.1} GiB are free of the reserve",
                    resident_bytes / crate::host::GIB,
                    resident_room / crate::host::GIB
                )),
            )
        } else if kind == StrategyKind::Resident && config.cache.is_some() && slots < held {
            // A cache size the caller gave is the experts' memory budget: resident would
            // exceed it even where the GPU has the room.
            (
                false,
                Some(format!(
                    "needs {held} expert slots ({:.1} GiB) for all experts; the given cache holds {slots} ({:.1} GiB)",
                    held as f64 * slot_bytes as f64 / crate::host::GIB,
                    slots as f64 * slot_bytes as f64 / crate::host::GIB
                )),
            )
        } else if let Some((search, _, _)) = split.as_ref().filter(|(s, _, _)| {
            kind == StrategyKind::LayerSplit && samples.cpu_layers < s.min_cpu_layers
        }) {
            (
                false,
                Some(format!(
                    "{} resident layers need {} expert slots; the GPU's expert memory holds {slots}: at least {} layers must be on the CPU",
                    model.geometry.moe_layers - samples.cpu_layers,
                    (model.geometry.moe_layers - samples.cpu_layers) * search.slots_per_layer,
                    search.min_cpu_layers
                )),
            )
        } else {
            (true, None)
        };
        let counts = samples.mean_per_step();
        strategies.push(StrategyPrediction {
            strategy,
            kind,
            cpu_layers: strategy.cpu_layers().map(|_| samples.cpu_layers),
            feasible,
            note,
            fetch_fraction: f,
            step_us: ev.step_us,
            step_interval_us: [lo, hi],
            uncertainty: Uncertainty {
                params_us: params_var.sqrt(),
                sampling_us: ev.sampling_se_us,
                run_noise_us: noise,
                total_us: sd,
                top_params,
            },
            tok_s_per_stream: 1e6 / ev.step_us,
            tok_s_per_stream_interval: [1e6 / hi, 1e6 / lo],
            tok_s_total: b * 1e6 / ev.step_us,
            tok_s_total_interval: [b * 1e6 / hi, b * 1e6 / lo],
            bound: ev.critical.bound(),
            critical: ev.critical,
            busy: ev.busy,
            contention_us: ev.contention_us,
            counts,
            miss_rate: samples.miss_rate(),
            link_bytes_per_step: if p.layout.is_multi() {
                counts.fetched * link_bytes_per_expert
            } else {
                counts.fetched * shape.expert.bytes
            },
        });
    }
    Ok(Prediction {
        model: model.name.clone(),
        expert_bytes: model.expert_bytes(),
        layers: model.geometry.moe_layers,
        source: perf.source.clone(),
        config: config.clone(),
        cache_slots: slots,
        layout: p.layout,
        offload_miss_rate: offload.miss_rate(),
        strategies,
        fetch_search: search,
        legacy,
        legacy_fraction_step_us,
        traffic: KeptTraffic(Some(Arc::new(StrategyTraffic {
            split_cached: split.as_ref().map(|(_, _, cached)| cached.clone()),
            offload,
            cpu,
            resident,
            hybrid,
            grid: match config.hybrid_fetch {
                FetchFraction::Auto => grid,
                FetchFraction::Fixed(_) => Vec::new(),
            },
        }))),
        layer_split: split.map(|(s, _, _)| s),
    })
}

/// Per layer of `s`, summed over its steps: the layer time (us), the misses and the distinct
/// experts.
fn layer_sums(p: &PerfParams, shape: &StepShape, s: &TrafficSamples) -> Vec<(f64, f64, f64)> {
    let dense = p.dense_us(&shape.dense, shape.streams, shape.context);
    let layers = s.layers.max(1);
    let mut sums = vec![(0.0, 0.0, 0.0); layers];
    for (i, c) in s.counts.chunks(s.plans.max(1)).enumerate() {
        let x = &mut sums[i % layers];
        x.0 += p.layer_time_gpus(shape, c, dense).total_us;
        x.1 += c.iter().map(|c| c.misses()).sum::<f64>();
        x.2 += c.iter().map(|c| c.unique()).sum::<f64>();
    }
    sums
}

/// One point of layer split's step time over its CPU layers.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct SplitPoint {
    /// Layers (the first ones) whose experts run on the CPU.
    pub cpu_layers: usize,
    /// Predicted step time, in us.
    pub step_us: f64,
    /// Expert-level miss rate (the CPU layers' experts count as misses).
    pub miss_rate: f64,
}

/// How layer split's CPU layers were chosen (for both layer splits).
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
pub struct LayerSplitSearch {
    /// Expert slots one resident layer takes on a GPU.
    pub slots_per_layer: usize,
    /// The fewest CPU layers with which the other layers' experts fit in the GPU's expert
    /// memory (the cache's slots).
    pub min_cpu_layers: usize,
    /// Layer split with the other layers resident: every feasible count (from
    /// `min_cpu_layers` to all layers), or the one given.
    pub resident: Vec<SplitPoint>,
    /// Layer split with the other layers cached: the counts sampled
    /// ([`SPLIT_CACHED_GRID`] of the layers, or the one given).
    pub cached: Vec<SplitPoint>,
    /// True when the count was given, not searched.
    pub fixed: bool,
}

/// Shares of the layers at which layer split with a cache is sampled (each point is one
/// counting run of the cache, as a point of hybrid's grid): the CPU layers free cache slots
/// for the others, so the best count can lie anywhere between offload (none) and every
/// layer on the CPU.
pub const SPLIT_CACHED_GRID: [f64; 5] = [0.0, 0.25, 0.5, 0.75, 1.0];

/// Layer split's CPU layers, searched as hybrid's fraction is (module docs): with the other
/// layers resident, every count from the fewest that fits `slots` expert slots to all layers
/// (two counting runs, every layer on the CPU and every layer resident, combined per count:
/// a resident or CPU-only layer's work does not depend on the others); with the other layers
/// cached, the counts of [`SPLIT_CACHED_GRID`] (one counting run each). A count given
/// (`cpu_layers`) is used as given. Returns the search and the chosen samples of each.
fn search_layer_split(
    model: &ModelSpec,
    config: &PredictConfig,
    cpu_layers: CpuLayers,
    p: &PerfParams,
    shape: &StepShape,
    slots: usize,
    held: usize,
) -> Result<(LayerSplitSearch, TrafficSamples, TrafficSamples)> {
    let layers = model.geometry.moe_layers;
    let slots_per_layer = held.div_ceil(layers.max(1)).max(1);
    let min_cpu_layers = layers - (slots / slots_per_layer).min(layers);
    let given = match cpu_layers {
        CpuLayers::Fixed(n) if n > layers => {
            return Err(ModelError::invalid(
                "--cpu-layers",
                format!("{n} is more than the model's {layers} MoE layers"),
            ))
        }
        CpuLayers::Fixed(n) => Some(n),
        CpuLayers::Auto => None,
    };
    let policy = |cpu_layers: usize, rest: LayerPlacement| PlacementPolicy { cpu_layers, rest };
    let run = |kind: StrategyKind, placement: PlacementPolicy| {
        sample_on(model, config, kind, placement, slots, &p.layout)
    };
    let point = |s: &TrafficSamples| SplitPoint {
        cpu_layers: s.cpu_layers,
        step_us: evaluate(p, shape, s).step_us,
        miss_rate: s.miss_rate(),
    };
    let best = |points: &[SplitPoint]| {
        points
            .iter()
            .enumerate()
            .min_by(|a, b| a.1.step_us.total_cmp(&b.1.step_us))
            .map(|(i, _)| i)
            .unwrap_or(0)
    };

    // The other layers resident.
    let on_cpu = run(
        StrategyKind::LayerSplit,
        policy(layers, LayerPlacement::Resident),
    )?;
    let on_gpu = run(
        StrategyKind::LayerSplit,
        policy(0, LayerPlacement::Resident),
    )?;
    let combined = |n: usize| {
        let per_step = layers * on_cpu.plans.max(1);
        let mut s = on_gpu.clone();
        for (i, c) in s.counts.iter_mut().enumerate() {
            if (i % per_step) / on_cpu.plans.max(1) < n {
                *c = on_cpu.counts[i];
            }
        }
        s.cpu_layers = n;
        s
    };
    let counts: Vec<usize> = match given {
        Some(n) => vec![n],
        None => (min_cpu_layers..=layers).collect(),
    };
    // Per layer, summed over steps: time, misses and distinct experts of each run; a count's
    // step is the CPU run's first layers and the resident run's others.
    let (a, b) = (layer_sums(p, shape, &on_cpu), layer_sums(p, shape, &on_gpu));
    let steps = on_gpu.steps().max(1) as f64;
    let resident: Vec<SplitPoint> = counts
        .iter()
        .map(|&n| {
            let pick = |l: usize| if l < n { &a[l] } else { &b[l] };
            let (mut t, mut misses, mut unique) = (0.0, 0.0, 0.0);
            for l in 0..layers {
                let x = pick(l);
                t += x.0;
                misses += x.1;
                unique += x.2;
            }
            SplitPoint {
                cpu_layers: n,
                step_us: t / steps,
                miss_rate: if unique > 0.0 { misses / unique } else { 0.0 },
            }
        })
        .collect();
    let chosen_resident = combined(resident[best(&resident)].cpu_layers);

    // The other layers cached, every miss gathered.
    let cached_counts: Vec<usize> = match given {
        Some(n) => vec![n],
        None => {
            let mut c: Vec<usize> = SPLIT_CACHED_GRID
                .iter()
                .map(|x| (x * layers as f64).round() as usize)
                .collect();
            c.dedup();
            c
        }
    };
    let cached_samples = cached_counts
        .iter()
        .map(|&n| {
            run(
                StrategyKind::LayerSplitCached,
                policy(
                    n,
                    LayerPlacement::Cached {
                        fetch_fraction: 1.0,
                    },
                ),
            )
        })
        .collect::<Result<Vec<_>>>()?;
    let cached: Vec<SplitPoint> = cached_samples.iter().map(point).collect();
    let chosen_cached = cached_samples[best(&cached)].clone();
    Ok((
        LayerSplitSearch {
            slots_per_layer,
            min_cpu_layers,
            resident,
            cached,
            fixed: given.is_some(),
        },
        chosen_resident,
        chosen_cached,
    ))
}

/// Plans per layer-step of `layout` (at least 1).
fn samples_plans(layout: &GpuLayout) -> usize {
    layout.plans().max(1)
}

/// The legacy rule for this prediction: the configured bench measurement, else the model's
/// bench at the tuning geometry ([`BenchBw::modelled`]; its standalone pair equals a host
/// spec's bench numbers by construction of [`PerfParams::from_host`]). A measurement without
/// the contended pair takes the model's.
fn legacy_for(p: &PerfParams, config: &PredictConfig) -> LegacyRatio {
    let modelled = BenchBw::modelled(p);
    let bench = match config.bench {
        Some(b) if b.cpu_moe_overlap_gbs.is_some() && b.pcie_gather_overlap_gbs.is_some() => b,
        Some(b) => BenchBw {
            cpu_moe_overlap_gbs: modelled.cpu_moe_overlap_gbs,
            pcie_gather_overlap_gbs: modelled.pcie_gather_overlap_gbs,
            ..b
        },
        None => modelled,
    };
    LegacyRatio::from_bench(&bench, config.threshold)
}

fn search_fetch(
    model: &ModelSpec,
    config: &PredictConfig,
    p: &PerfParams,
    shape: &StepShape,
    grid: &[TrafficSamples],
    slots: usize,
) -> Result<(TrafficSamples, FetchSearch)> {
    let points: Vec<FetchPoint> = grid
        .iter()
        .map(|s| FetchPoint {
            fetch_fraction: s.fetch_fraction,
            step_us: evaluate(p, shape, s).step_us,
            miss_rate: s.miss_rate(),
        })
        .collect();
    let best = points
        .iter()
        .enumerate()
        .min_by(|a, b| a.1.step_us.total_cmp(&b.1.step_us))
        .map(|(i, _)| i)
        .unwrap_or(0);
    let lo = points[best.saturating_sub(1)].fetch_fraction;
    let hi = points[(best + 1).min(points.len() - 1)].fetch_fraction;
    let relaxed = RelaxedHybrid { p, shape, grid };
    let solver = BrentOpt::new(lo, hi).set_tolerance(1e-8, FETCH_TOLERANCE);
    let res = Executor::new(relaxed, solver)
        .configure(|s| s.param((lo + hi) / 2.0).max_iters(FETCH_MAX_ITERS))
        .run()
        .map_err(|e| ModelError::invalid("fetch fraction search", e.to_string()))?;
    let state = res.state();
    let relaxed_optimum = state
        .get_best_param()
        .copied()
        .unwrap_or(points[best].fetch_fraction);
    let iterations = state.get_iter();
    let termination = state.get_termination_status().to_string();
    let at_opt = sample_on(
        model,
        config,
        StrategyKind::Hybrid,
        PlacementPolicy::cached(relaxed_optimum),
        slots,
        &p.layout,
    )?;
    let t_opt = evaluate(p, shape, &at_opt).step_us;
    let (chosen, samples) = if t_opt < points[best].step_us {
        (relaxed_optimum, at_opt)
    } else {
        (points[best].fetch_fraction, grid[best].clone())
    };
    Ok((
        samples,
        FetchSearch {
            grid: points,
            bracket: [lo, hi],
            relaxed_optimum,
            iterations,
            termination,
            chosen,
            fixed: false,
        },
    ))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::host::HostSpec;
    use crate::perf::decide::decide;

    fn quick(streams: usize) -> PredictConfig {
        PredictConfig {
            streams,
            warmup_steps: 40,
            steps: 60,
            ..PredictConfig::default()
        }
    }

    fn field() -> (ModelSpec, PerfModel) {
        (
            ModelSpec::preset("qwen3.8-flash-next").unwrap(),
            PerfModel::from_host(&HostSpec::field_report()).unwrap(),
        )
    }

    /// A host with room for every expert of the model: a GPU of 141 GiB.
    fn big_gpu() -> HostSpec {
        let mut h = HostSpec::field_report();
        h.gpu.memory_gib = 141.0;
        h.gpu.hbm_gbs = 4800.0;
        h
    }

    /// What lets [`predict`] take offload's and cpu's traffic from hybrid's grid ends: the
    /// same counts, layer-step for layer-step, as their own counting runs (the slow
    /// reference), for every cache policy (a static hot set chosen from the warm-up's
    /// popularity included), per-layer slots, another admission, and several GPUs.
    #[test]
    fn the_grid_ends_are_offload_and_cpu() {
        use crate::cache::{CachePolicy, CacheTopology};
        use crate::placement::GpuPlacement;
        use crate::plan::{AdmissionOrder, AdmissionPolicy};
        let (m, _) = field();
        let options = [
            CacheOptions::default(),
            CachePolicy::Lfu { decay_every: 16 }.into(),
            CachePolicy::StaticHot { hot: Vec::new() }.into(),
            CacheOptions {
                topology: CacheTopology::PerLayer,
                admission: AdmissionPolicy {
                    order: AdmissionOrder::Recent,
                    cpu_history: false,
                },
                ..CacheOptions::default()
            },
        ];
        let layouts = [
            GpuLayout::single(),
            GpuLayout::new(2, GpuPlacement::Sharded).unwrap(),
            GpuLayout::new(2, GpuPlacement::TensorParallel).unwrap(),
        ];
        for cache_options in options {
            for layout in &layouts {
                let config = PredictConfig {
                    streams: 3,
                    warmup_steps: 10,
                    steps: 12,
                    cache_options: cache_options.clone(),
                    ..PredictConfig::default()
                };
                let slots = 20 * m.geometry.moe_layers;
                let run = |kind, f| {
                    sample_on(&m, &config, kind, PlacementPolicy::cached(f), slots, layout).unwrap()
                };
                for (kind, f) in [(StrategyKind::Offload, 1.0), (StrategyKind::Cpu, 0.0)] {
                    let own = run(kind, f);
                    assert!(own.mean_per_step().unique() > 0.0);
                    assert_eq!(
                        run(StrategyKind::Hybrid, f),
                        own,
                        "{kind} with {cache_options} on {layout:?}"
                    );
                }
            }
        }
    }

    #[test]
    fn the_chosen_fraction_is_no_worse_than_any_grid_point() {
        let (m, perf) = field();
        let p = predict(&m, &perf, &quick(2)).unwrap();
        let hy = p.get(StrategyKind::Hybrid);
        let best_grid = p
            .fetch_search
            .grid
            .iter()
            .map(|g| g.step_us)
            .fold(f64::INFINITY, f64::min);
        assert!(
            hy.step_us <= best_grid + 1e-9,
            "{} > {best_grid}",
            hy.step_us
        );
        assert_eq!(p.fetch_search.grid.len(), FETCH_GRID.len());
        let [lo, hi] = p.fetch_search.bracket;
        assert!(lo <= p.fetch_search.relaxed_optimum && p.fetch_search.relaxed_optimum <= hi);
        // The grid's ends are offload's and cpu's planner: the same counts.
        let f1 = p.fetch_search.grid.last().unwrap();
        assert!((f1.step_us - p.get(StrategyKind::Offload).step_us).abs() < 1e-6 * f1.step_us);
        assert!((f1.miss_rate - p.offload_miss_rate).abs() < 1e-12);
    }

    #[test]
    fn intervals_bracket_the_prediction_and_tok_s_follow_the_step() {
        let (m, perf) = field();
        let p = predict(&m, &perf, &quick(2)).unwrap();
        for s in &p.strategies {
            assert!(
                s.step_interval_us[0] < s.step_us && s.step_us < s.step_interval_us[1],
                "{}",
                s.kind
            );
            assert!(
                s.tok_s_per_stream_interval[0] < s.tok_s_per_stream
                    && s.tok_s_per_stream < s.tok_s_per_stream_interval[1]
            );
            assert!((s.tok_s_total - 2.0 * s.tok_s_per_stream).abs() < 1e-9);
            assert!(
                (s.critical.total() - s.step_us).abs() < 1e-6 * s.step_us,
                "{}",
                s.kind
            );
            let u = &s.uncertainty;
            let rss = (u.params_us.powi(2) + u.sampling_us.powi(2) + u.run_noise_us.powi(2)).sqrt();
            assert!((u.total_us - rss).abs() < 1e-9 * rss);
        }
        // No uncertainty, no noise: the interval is the sampling's alone.
        let exact = PerfModel {
            covariance: crate::perf::ParamCovariance::none(),
            params: PerfParams {
                run_noise_rel: 0.0,
                ..perf.params.clone()
            },
            ..perf
        };
        let q = predict(&m, &exact, &quick(2)).unwrap();
        let off = q.get(StrategyKind::Offload);
        assert_eq!(off.uncertainty.params_us, 0.0);
        assert!((off.uncertainty.total_us - off.uncertainty.sampling_us).abs() < 1e-12);
    }

    #[test]
    fn long_context_brings_the_strategies_together() {
        let (m, perf) = field();
        // The cache held fixed (the default at a short context), so that only the rest of the
        // step grows with context; the default cache shrinks as the KV cache grows, which
        // raises offload's miss rate and is another effect.
        let slots = default_cache_slots(&m, &perf.params, 1, 1024);
        let ratio = |context: usize| {
            let p = predict(
                &m,
                &perf,
                &PredictConfig {
                    context,
                    cache: Some(CacheSize::Slots(slots)),
                    ..quick(1)
                },
            )
            .unwrap();
            let d =
                p.get(StrategyKind::Hybrid).critical.dense_us / p.get(StrategyKind::Hybrid).step_us;
            (
                p.get(StrategyKind::Hybrid).tok_s_per_stream
                    / p.get(StrategyKind::Offload).tok_s_per_stream,
                d,
            )
        };
        let (short, d_short) = ratio(1024);
        let (long, d_long) = ratio(2_000_000);
        assert!(d_long > d_short);
        assert!(
            (long - 1.0).abs() < (short - 1.0).abs(),
            "{short} -> {long}"
        );
    }

    #[test]
    fn a_given_cache_smaller_than_the_experts_rules_resident_out() {
        // The GPU holds every expert, but the caller capped the expert cache at half of them.
        let mut m = ModelSpec::preset("qwen3.8-flash-next").unwrap();
        m.geometry.moe_layers = 4;
        let perf = PerfModel::from_host(&big_gpu()).unwrap();
        let half = (m.geometry.total_experts() / 2) as usize;
        let mut c = quick(1);
        c.cache = Some(CacheSize::Slots(half));
        let p = predict(&m, &perf, &c).unwrap();
        let r = p.get(StrategyKind::Resident);
        assert!(!r.feasible);
        assert!(
            r.note.as_deref().unwrap_or("").contains("given cache"),
            "{:?}",
            r.note
        );
        assert_ne!(decide(&p).choice.kind(), StrategyKind::Resident);
        // Without the cap the same GPU runs it.
        let p = predict(&m, &perf, &quick(1)).unwrap();
        assert!(p.get(StrategyKind::Resident).feasible);
    }

    #[test]
    fn a_cache_holding_everything_is_a_near_tie_of_offload_and_resident() {
        // Few experts, so that the warm-up touches every one and offload stops missing.
        let mut m = ModelSpec::preset("qwen3.8-flash-next").unwrap();
        m.geometry.experts = 32;
        m.geometry.top_k = 4;
        m.geometry.moe_layers = 8;
        let perf = PerfModel::from_host(&big_gpu()).unwrap();
        let slots = default_cache_slots(&m, &perf.params, 1, 1024);
        assert_eq!(slots as u64, m.geometry.total_experts());
        // Uniform routing: the warm-up touches every expert within its steps, whatever the
        // default process's locality keeps re-using.
        let c = PredictConfig {
            routing: "uniform".into(),
            ..quick(1)
        };
        let p = predict(&m, &perf, &c).unwrap();
        assert!(p.get(StrategyKind::Resident).feasible);
        assert!(p.offload_miss_rate < 0.01, "{}", p.offload_miss_rate);
        let d = decide(&p);
        assert!(d.near_tie, "{}", d.log_line);
        assert!(matches!(
            d.kind,
            StrategyKind::Resident | StrategyKind::Offload | StrategyKind::Hybrid
        ));
        assert!(d.log_line.contains("near tie"));
    }

    #[test]
    fn default_cache_slots_follow_the_gpu_memory() {
        let (m, perf) = field();
        let p = &perf.params;
        let slots = default_cache_slots(&m, p, 2, 4096);
        let d = m.dense();
        let layers = m.geometry.moe_layers as f64;
        let free = p.gpu_memory_bytes
            - p.gpu_reserve_bytes
            - layers
                * (d.weight_bytes_per_layer as f64 + 2.0 * 4096.0 * d.kv_bytes_per_token as f64);
        assert_eq!(slots, (free / m.expert_bytes() as f64).floor() as usize);
        // More context, fewer slots.
        assert!(default_cache_slots(&m, p, 2, 1_000_000) < slots);
    }

    #[test]
    fn a_fixed_fraction_is_used_as_given_and_bad_configs_are_named() {
        let (m, perf) = field();
        let c = PredictConfig {
            hybrid_fetch: FetchFraction::Fixed(0.5),
            ..quick(1)
        };
        let p = predict(&m, &perf, &c).unwrap();
        assert_eq!(p.get(StrategyKind::Hybrid).fetch_fraction, 0.5);
        assert!(p.fetch_search.fixed);
        for (bad, flag) in [
            (
                PredictConfig {
                    streams: 0,
                    ..quick(1)
                },
                "--streams",
            ),
            (
                PredictConfig {
                    threshold: -1.0,
                    ..quick(1)
                },
                "--threshold",
            ),
            (
                PredictConfig {
                    miss: MissMode::FixedOffload { miss_rate: 1.5 },
                    ..quick(1)
                },
                "--miss-rate",
            ),
            (
                PredictConfig {
                    routing: "nonesuch".into(),
                    ..quick(1)
                },
                "nonesuch",
            ),
        ] {
            let e = predict(&m, &perf, &bad).unwrap_err().to_string();
            assert!(e.contains(flag), "{e}");
        }
    }

    #[test]
    fn more_streams_share_experts_sublinearly() {
        // Streams share experts through static popularity, which the default process has
        // little of (real routing's skew is weak): the property is stated on the process with
        // the old preset's Zipf popularity.
        let (m, perf) = field();
        let skewed = |streams| PredictConfig {
            routing: "legacy-typical".into(),
            ..quick(streams)
        };
        let one = predict(&m, &perf, &skewed(1)).unwrap();
        let four = predict(&m, &perf, &skewed(4)).unwrap();
        let (o1, o4) = (
            one.get(StrategyKind::Offload),
            four.get(StrategyKind::Offload),
        );
        // Total throughput grows, per stream falls.
        assert!(o4.tok_s_total > o1.tok_s_total && o4.tok_s_per_stream < o1.tok_s_per_stream);
        let unique = |s: &StrategyPrediction| s.counts.unique();
        assert!(unique(o4) <= 4.0 * unique(o1) + 1e-9);
    }

    /// Layer split on a GPU that holds half the experts: resident layers fit only from the
    /// count that frees enough slots, the search picks the fastest feasible count, a given
    /// count below it is predicted but infeasible, and N is in the row.
    #[test]
    fn layer_split_searches_n_under_the_gpu_memory() {
        let mut m = ModelSpec::preset("qwen3.8-flash-next").unwrap();
        m.geometry.moe_layers = 8;
        let perf = PerfModel::from_host(&big_gpu()).unwrap();
        let per_layer = m.geometry.experts;
        let mut c = quick(1);
        c.layer_split = Some(CpuLayers::Auto);
        c.cache = Some(CacheSize::Slots(per_layer * 5 + per_layer / 2));
        let p = predict(&m, &perf, &c).unwrap();
        let ls = p.layer_split.clone().unwrap();
        assert_eq!(ls.slots_per_layer, per_layer);
        assert_eq!(ls.min_cpu_layers, 3, "5.5 layers fit: 3 on the CPU");
        assert_eq!(ls.resident.len(), 8 - 3 + 1);
        let split = p.get(StrategyKind::LayerSplit);
        assert!(split.feasible);
        let n = split.cpu_layers.unwrap();
        let best = ls
            .resident
            .iter()
            .min_by(|a, b| a.step_us.total_cmp(&b.step_us))
            .unwrap();
        assert_eq!(n, best.cpu_layers);
        assert!((split.step_us - best.step_us).abs() < 1e-9 * best.step_us);
        assert_eq!(split.strategy.cpu_layers(), Some(CpuLayers::Fixed(n)));
        // The CPU layers' experts are CPU work, the others hits.
        assert!(split.counts.cpu > 0.0 && split.counts.fetched == 0.0);
        let cached = p.get(StrategyKind::LayerSplitCached);
        assert!(cached.feasible && ls.cached.len() == SPLIT_CACHED_GRID.len());
        // A given count below the least that fits: predicted, not feasible, said why.
        c.layer_split = Some(CpuLayers::Fixed(1));
        let q = predict(&m, &perf, &c).unwrap();
        let s = q.get(StrategyKind::LayerSplit);
        assert!(!s.feasible && s.cpu_layers == Some(1));
        assert!(
            s.note.as_deref().unwrap_or("").contains("at least 3"),
            "{:?}",
            s.note
        );
        assert_ne!(decide(&q).kind, StrategyKind::LayerSplit);
        c.layer_split = Some(CpuLayers::Fixed(9));
        let e = predict(&m, &perf, &c).unwrap_err().to_string();
        assert!(e.contains("--cpu-layers"), "{e}");
        // Left out: no rows, no search.
        c.layer_split = None;
        let r = predict(&m, &perf, &c).unwrap();
        assert!(r.layer_split.is_none() && r.try_get(StrategyKind::LayerSplit).is_none());
    }
}
