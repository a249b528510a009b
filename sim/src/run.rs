//! One simulated configuration, end to end: build the cache and routing, run the decode
//! process, and summarise the measured steps.

use rand::Rng;
use serde::{Deserialize, Serialize};

use ft_model::cache::CacheOptions;
use ft_model::placement::GpuLayout;
use ft_model::preset::ModelSpec;
use ft_model::routing::{self, RoutingSource};
use ft_model::strategy::{PlacementPolicy, Strategy, StrategyKind};
use ft_model::traffic::strategy_caches;

use crate::costs::CostModel;
use std::sync::Arc;

use crate::decode::{check_run, DecodeProcess, PlanTrace, Planner, RecordedRouting, Workload};
use crate::error::{Result, SimError};
use crate::layer::{LaneEvent, CRITICAL_NAMES};
use crate::scheduler::Scheduler;
use crate::time::ns_to_s;

/// What to simulate besides the host and model.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SimConfig {
    /// Concurrent streams (tokens per step).
    pub streams: usize,
    /// The strategy; hybrid's fetch fraction must be fixed (resolve `auto` first).
    pub strategy: Strategy,
    /// Expert cache slots, of each GPU's cache on several (ignored by `resident`, which
    /// holds every expert).
    pub cache_slots: usize,
    /// The cache's policy, topology and admission.
    #[serde(default)]
    pub cache_options: CacheOptions,
    /// Routing: a preset name, a process TOML or a trace file.
    pub routing: String,
    /// Unmeasured steps first (they fill the cache).
    pub warmup_steps: u64,
    /// Measured decode steps.
    pub steps: u64,
    /// Seed of the run's random generator (jitter and the routing seed).
    pub seed: u64,
    /// Relative standard deviation of the multiplicative jitter on durations (0: none).
    pub jitter: f64,
    /// The closed loop of requests.
    pub workload: Workload,
    /// The GPUs decoding together (the host's `gpu_layout`; one GPU when absent). It must
    /// be the cost model's (`CostModel::layout`); `cache_slots` are then each GPU's.
    #[serde(default)]
    pub layout: GpuLayout,
}

/// Share of measured decode time each resource was busy.
#[derive(Debug, Clone, Copy, PartialEq, Default, Serialize, Deserialize)]
pub struct Busy {
    /// GPU compute stream.
    pub gpu: f64,
    /// Host-to-device link (gathers and result copies).
    pub pcie: f64,
    /// CPU expert pool.
    pub cpu: f64,
}

/// Summary of one simulated configuration's measured steps.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SimResult {
    /// The strategy (hybrid with its fetch fraction).
    pub strategy: Strategy,
    /// Its kind.
    pub kind: StrategyKind,
    /// Share of each cached layer's misses gathered over the link.
    pub fetch_fraction: f64,
    /// Layers whose experts ran on the CPU (layer split; 0 for the other strategies).
    #[serde(default)]
    pub cpu_layers: usize,
    /// Concurrent streams.
    pub streams: usize,
    /// GPUs decoding together.
    pub gpus: u32,
    /// How experts are laid out over them (`sharded`, `tensor-parallel`).
    pub placement: String,
    /// Cache slots (of each GPU's cache).
    pub cache_slots: usize,
    /// Measured steps.
    pub steps: u64,
    /// MoE layers per step.
    pub layers: usize,
    /// Decode tok/s over all streams.
    pub tok_s_total: f64,
    /// Decode tok/s of one stream.
    pub tok_s_per_stream: f64,
    /// Mean decode step time, ms.
    pub step_ms: f64,
    /// Misses over distinct experts (this strategy's own cache history).
    pub miss_rate: f64,
    /// Distinct experts per layer-step.
    pub unique_per_layer: f64,
    /// Experts crossing the link per layer-step.
    pub link_per_layer: f64,
    /// Experts computed on the CPU per layer-step.
    pub cpu_per_layer: f64,
    /// Busy shares of the resources (averaged over the GPUs' streams, links and CPU shares).
    pub busy: Busy,
    /// Share of decode time in which a gather and CPU weight reads overlapped.
    pub contended: f64,
    /// Share of layers whose CPU side finished after the GPU side.
    pub cpu_critical: f64,
    /// Critical-path share of each resource, summing to 1 (the analytic model's
    /// attribution applied to the simulated timeline; names as in `ft_model::perf::Resource`).
    pub critical: std::collections::BTreeMap<String, f64>,
    /// The resource holding the largest share of the critical path.
    pub bound: String,
    /// Events handled by the engine.
    pub events: u64,
}

/// The routing seed of a run: the run's seed itself, as `ft run`, `ft probe` and `ft predict
/// --seed` route with it, so that one seed draws the same routes in the simulator, the model's
/// traffic and the engine (their miss-rate trajectories then compare step by step). The
/// simulator's jitter takes its own stream from the same seed (the scheduler's generator).
pub fn routing_seed(seed: u64) -> u64 {
    seed
}

/// The routing source of a run.
pub fn routing_source(model: &ModelSpec, name: &str, seed: u64) -> Result<Box<dyn RoutingSource>> {
    Ok(routing::resolve(
        name,
        &model.geometry,
        Some(routing_seed(seed)),
    )?)
}

/// A configuration's planner inputs: the routing source, the strategy's cache, the
/// fetch fraction and the effective warm-up (a static-hot cache chosen from the warm-up's
/// popularity takes those steps, as ft-model's traffic does).
pub struct Prepared {
    /// The routing source, positioned after any popularity measurement.
    pub routing: Box<dyn RoutingSource>,
    /// The strategy's starting cache (the first GPU's on several).
    pub cache: ft_model::cache::ExpertCache,
    /// Every plan's starting cache (`GpuLayout::plans`; `[cache]` on one GPU). `cache` is a
    /// copy of the first.
    pub caches: Vec<ft_model::cache::ExpertCache>,
    /// Each layer's placement (the share of misses gathered).
    pub policy: PlacementPolicy,
    /// Unmeasured steps still to run.
    pub warmup_steps: u64,
}

/// Check `cfg` and build its routing source and cache.
pub fn prepare(model: &ModelSpec, cfg: &SimConfig) -> Result<Prepared> {
    let source = routing_source(model, &cfg.routing, cfg.seed)?;
    prepare_with(model, cfg, source)
}

/// [`prepare`] with the routing source given (it must be `cfg`'s routing and seed).
pub fn prepare_with(
    model: &ModelSpec,
    cfg: &SimConfig,
    mut source: Box<dyn RoutingSource>,
) -> Result<Prepared> {
    check_run(cfg.streams, cfg.steps)?;
    if !(cfg.jitter.is_finite() && cfg.jitter >= 0.0) {
        return Err(SimError::invalid(
            "--jitter",
            format!("{} is not >= 0", cfg.jitter),
        ));
    }
    let policy = cfg.strategy.policy(model.geometry.moe_layers)?;
    // ft-model's caches, one per GPU plan: a static hot set without experts is the warm-up's
    // most requested experts (of each GPU's own experts), and those steps were the warm-up.
    let (caches, left) = strategy_caches(
        source.as_mut(),
        cfg.strategy.kind(),
        &cfg.cache_options,
        cfg.cache_slots,
        cfg.warmup_steps as usize,
        cfg.streams,
        &cfg.layout,
    )?;
    Ok(Prepared {
        routing: source,
        cache: caches[0].clone(),
        caches,
        policy,
        warmup_steps: left as u64,
    })
}

/// The plans of `cfg` (warm-up and measured steps) recorded once, for replay by
/// [`simulate_replay`] on any host; returns the trace, the effective warm-up and the slots.
pub fn plan_trace(model: &ModelSpec, cfg: &SimConfig) -> Result<(PlanTrace, u64, usize)> {
    let mut p = prepare(model, cfg)?;
    let steps = (p.warmup_steps + cfg.steps) as usize;
    let slots = p.cache.capacity();
    let trace = if p.caches.len() == 1 {
        PlanTrace::record(
            p.routing.as_mut(),
            &mut p.cache,
            &p.policy,
            cfg.streams,
            steps,
        )?
    } else {
        let recorded = RecordedRouting::record(p.routing.as_mut(), cfg.streams, steps)?;
        PlanTrace::record_steps_gpus(
            recorded.remaining(),
            model.geometry.moe_layers,
            &mut p.caches,
            &cfg.layout,
            &p.policy,
            cfg.streams,
        )
    };
    Ok((trace, p.warmup_steps, slots))
}

/// [`plan_trace`] from routing recorded once ([`RecordedRouting::record`] of `cfg`'s
/// routing source, at least warm-up plus measured steps long).
pub fn plan_trace_recorded(
    model: &ModelSpec,
    cfg: &SimConfig,
    routing: &RecordedRouting,
) -> Result<(PlanTrace, u64, usize)> {
    let mut p = prepare_with(model, cfg, Box::new(routing.rewound()))?;
    let slots = p.cache.capacity();
    // Steps the preparation consumed (a static-hot popularity) are not planned again.
    let used = (cfg.warmup_steps - p.warmup_steps) as usize;
    let n = (p.warmup_steps + cfg.steps) as usize;
    let all = routing.rewound();
    let steps = all.remaining();
    if steps.len() < used + n {
        return Err(SimError::invalid(
            "recorded routing",
            format!("{} steps recorded, {} needed", steps.len(), used + n),
        ));
    }
    let trace = PlanTrace::record_steps_gpus(
        &steps[used..used + n],
        model.geometry.moe_layers,
        &mut p.caches,
        &cfg.layout,
        &p.policy,
        cfg.streams,
    );
    Ok((trace, p.warmup_steps, slots))
}

/// Simulate one configuration (live planning, as the runtime plans).
pub fn simulate(costs: &CostModel, model: &ModelSpec, cfg: &SimConfig) -> Result<SimResult> {
    check_layout(costs, cfg)?;
    let p = prepare(model, cfg)?;
    let slots = p.cache.capacity();
    let warmup = p.warmup_steps;
    let planner = if p.caches.len() == 1 {
        Planner::live(p.routing, p.cache, p.policy)
    } else {
        Planner::live_gpus(p.routing, p.caches, cfg.layout, p.policy)
    };
    run_planner(costs, cfg, planner, warmup, slots)
}

/// The run's layout must be the cost model's (the host's GPUs).
fn check_layout(costs: &CostModel, cfg: &SimConfig) -> Result<()> {
    if costs.layout != cfg.layout {
        return Err(SimError::invalid(
            "layout",
            format!(
                "the run plans for {} GPU(s) ({}) but the host has {} ({})",
                cfg.layout.gpus,
                cfg.layout.placement.name(),
                costs.layout.gpus,
                costs.layout.placement.name()
            ),
        ));
    }
    Ok(())
}

/// Simulate one configuration from a recorded [`plan_trace`] of it.
pub fn simulate_replay(
    costs: &CostModel,
    cfg: &SimConfig,
    trace: Arc<PlanTrace>,
    warmup_steps: u64,
    slots: usize,
) -> Result<SimResult> {
    check_run(cfg.streams, cfg.steps)?;
    check_layout(costs, cfg)?;
    run_planner(costs, cfg, Planner::replay(trace), warmup_steps, slots)
}

fn run_planner(
    costs: &CostModel,
    cfg: &SimConfig,
    planner: Planner,
    warmup: u64,
    slots: usize,
) -> Result<SimResult> {
    let policy = cfg.strategy.policy(planner.layers())?;
    let mut sched: Scheduler<LaneEvent> = Scheduler::new(cfg.seed);
    // The jitter's stream starts after one draw, as it always has (a seed's jitter is unchanged).
    let _: u64 = sched.rng().random();
    let mut proc = DecodeProcess::new(
        costs,
        planner,
        cfg.streams,
        cfg.workload,
        cfg.jitter,
        warmup,
        cfg.steps,
    );
    proc.start(&mut sched);
    sched.run(&mut proc, None);
    if let Some(e) = proc.take_error() {
        return Err(e);
    }
    let c = *proc.counters();
    let t = ns_to_s(c.decode_ns);
    let ratio = |a: f64, b: f64| if b > 0.0 { a / b } else { 0.0 };
    let dn = c.decode_ns as f64;
    // Busy times and contended time are summed over the GPUs: shares of one GPU's.
    let lanes = cfg.layout.gpus.max(1) as f64;
    let busy = Busy {
        gpu: ratio(c.gpu_busy_ns as f64 / lanes, dn),
        pcie: ratio(c.h2d_busy_ns as f64 / lanes, dn),
        cpu: ratio(c.cpu_busy_ns as f64 / lanes, dn),
    };
    let total_critical: f64 = c.critical.iter().sum();
    let critical = CRITICAL_NAMES
        .iter()
        .zip(c.critical)
        .map(|(n, v)| (n.to_string(), ratio(v, total_critical)))
        .collect();
    // The first in report order on a tie, as `TimeSplit::bound` does.
    let mut b = 0;
    for i in 1..CRITICAL_NAMES.len() {
        if c.critical[i] > c.critical[b] {
            b = i;
        }
    }
    let bound = CRITICAL_NAMES[b];
    let ls = c.layer_steps as f64;
    let tok_s_total = ratio(c.tokens as f64, t);
    Ok(SimResult {
        strategy: cfg.strategy,
        kind: cfg.strategy.kind(),
        fetch_fraction: policy.fetch_fraction(),
        cpu_layers: policy.cpu_layers,
        streams: cfg.streams,
        gpus: cfg.layout.gpus,
        placement: cfg.layout.placement.name().to_string(),
        cache_slots: slots,
        steps: c.steps,
        layers: c.layer_steps.checked_div(c.steps).unwrap_or(0) as usize,
        tok_s_total,
        tok_s_per_stream: tok_s_total / cfg.streams as f64,
        step_ms: ratio(dn / 1e6, c.steps as f64),
        miss_rate: ratio(c.misses as f64, c.unique as f64),
        unique_per_layer: ratio(c.unique as f64, ls),
        link_per_layer: ratio(c.link_experts as f64, ls),
        cpu_per_layer: ratio(c.cpu_experts as f64, ls),
        busy,
        contended: ratio(c.contended_ns as f64 / lanes, dn),
        cpu_critical: ratio(c.cpu_critical_layers as f64, ls),
        critical,
        bound: bound.to_string(),
        events: sched.handled(),
    })
}
