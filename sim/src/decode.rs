//! The decode process: B streams in a closed loop of requests, one batched step after
//! another, each step the model's MoE layers in order.
//!
//! Per step every active stream contributes one token (the runtime batches them so);
//! routing comes from the shared [`RoutingSource`], each layer is planned by the shared
//! [`plan_layer`] against the shared [`ExpertCache`] (so the simulator's misses are the
//! runtime's), costed by [`CostModel`] and timed by [`LayerMachine`] on the resources (the layer's schedule, any GPU count).
//! Context grows by one token per stream per step; a stream whose request reached its
//! output length starts a new request (context back to the prompt length). Prompt
//! processing is modelled as a fixed prefill time per new request, spent before the next
//! step and excluded from decode time (decode tok/s counts decode steps only).

use rand::Rng;
use rand_distr::StandardNormal;

use std::sync::Arc;

use ft_model::cache::ExpertCache;
use ft_model::placement::GpuLayout;
use ft_model::plan::{plan_layer_counts, PlanScratch};
use ft_model::routing::{RoutingSource, StepRouting};
use ft_model::traffic::plan_layer_gpus;

use crate::component::{Component, Control};
use crate::costs::CostModel;
use crate::error::{Result, SimError};
use crate::layer::{CriticalSplit, LaneEvent, LayerCosts, LayerEvent, LayerMachine, Resources};
use crate::scheduler::Scheduler;
use crate::time::Nanos;
use ft_model::perf::LayerCounts;
use ft_model::schedule::{LayerSchedule, LayerWork};
use ft_model::strategy::PlacementPolicy;

/// Index of `sync` in a [`CriticalSplit`] (`crate::layer::CRITICAL_NAMES`).
const SYNC_INDEX: usize = 3;

/// Every layer-step's counts of one planned run (warm-up included), step-major.
///
/// Planning does not depend on time or on the host: the same routing, cache and fetch
/// fraction give the same plans whatever the durations. A sweep over hosts (or jitter)
/// therefore plans once and replays the counts ([`Planner::Replay`]); a test checks that a
/// replay times exactly as the live run.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct PlanTrace {
    /// MoE layers per step.
    pub layers: usize,
    /// Streams of every step.
    pub streams: usize,
    /// Plans per layer-step (`GpuLayout::plans`; 1 on one GPU).
    pub plans: usize,
    /// `counts[(step * layers + layer) * plans + plan]`.
    pub counts: Vec<LayerCounts>,
}

impl PlanTrace {
    /// Steps recorded.
    pub fn steps(&self) -> usize {
        self.counts.len() / (self.layers * self.plans).max(1)
    }

    /// Plan `steps` steps of `streams` streams live and record the counts.
    pub fn record(
        routing: &mut dyn RoutingSource,
        cache: &mut ExpertCache,
        policy: &PlacementPolicy,
        streams: usize,
        steps: usize,
    ) -> Result<Self> {
        let layers = routing.geometry().moe_layers;
        let mut counts = Vec::with_capacity(steps * layers);
        let mut routes = StepRouting::default();
        let mut scratch = PlanScratch::default();
        for _ in 0..steps {
            routing.next_step_into(streams, &mut routes)?;
            for (l, r) in routes.layers.iter().enumerate() {
                counts.push(
                    plan_layer_counts(l, r, cache, policy.layer(l), &mut scratch).layer_counts(),
                );
            }
        }
        Ok(PlanTrace {
            layers,
            streams,
            plans: 1,
            counts,
        })
    }
}

impl PlanTrace {
    /// Plan recorded routing steps (no copy of the routes) and record the counts.
    pub fn record_steps(
        steps: &[StepRouting],
        layers: usize,
        cache: &mut ExpertCache,
        policy: &PlacementPolicy,
        streams: usize,
    ) -> Self {
        let mut counts = Vec::with_capacity(steps.len() * layers);
        let mut scratch = PlanScratch::default();
        for step in steps {
            for (l, r) in step.layers.iter().enumerate() {
                counts.push(
                    plan_layer_counts(l, r, cache, policy.layer(l), &mut scratch).layer_counts(),
                );
            }
        }
        PlanTrace {
            layers,
            streams,
            plans: 1,
            counts,
        }
    }

    /// [`PlanTrace::record_steps`] on the GPUs of `layout`, one cache per plan.
    pub fn record_steps_gpus(
        steps: &[StepRouting],
        layers: usize,
        caches: &mut [ExpertCache],
        layout: &GpuLayout,
        policy: &PlacementPolicy,
        streams: usize,
    ) -> Self {
        if caches.len() == 1 {
            return Self::record_steps(steps, layers, &mut caches[0], policy, streams);
        }
        let mut counts = Vec::with_capacity(steps.len() * layers * caches.len());
        for step in steps {
            for (l, r) in step.layers.iter().enumerate() {
                for p in plan_layer_gpus(l, r, caches, layout, policy) {
                    counts.push(LayerCounts::of_plan(&p));
                }
            }
        }
        PlanTrace {
            layers,
            streams,
            plans: caches.len(),
            counts,
        }
    }
}

/// Routing steps drawn once and replayed as a [`RoutingSource`] (a sweep shares them
/// between every strategy and cache size of the same model, routing, seed and streams).
#[derive(Debug, Clone)]
pub struct RecordedRouting {
    geometry: ft_model::MoeGeometry,
    steps: Arc<Vec<StepRouting>>,
    next: usize,
}

impl RecordedRouting {
    /// Draw `steps` steps of `streams` streams from `source`.
    pub fn record(source: &mut dyn RoutingSource, streams: usize, steps: usize) -> Result<Self> {
        let mut v = Vec::with_capacity(steps);
        for _ in 0..steps {
            v.push(source.next_step(streams)?);
        }
        Ok(RecordedRouting {
            geometry: *source.geometry(),
            steps: Arc::new(v),
            next: 0,
        })
    }

    /// The same recording, from its first step.
    pub fn rewound(&self) -> Self {
        RecordedRouting {
            next: 0,
            ..self.clone()
        }
    }

    /// The steps not yet handed out.
    pub fn remaining(&self) -> &[StepRouting] {
        &self.steps[self.next.min(self.steps.len())..]
    }
}

impl RoutingSource for RecordedRouting {
    fn geometry(&self) -> &ft_model::MoeGeometry {
        &self.geometry
    }

    fn next_step(&mut self, streams: usize) -> ft_model::error::Result<StepRouting> {
        let step = self.steps.get(self.next).ok_or_else(|| {
            ft_model::ModelError::invalid(
                "recorded routing",
                format!("only {} steps were recorded", self.steps.len()),
            )
        })?;
        if step.streams() != streams {
            return Err(ft_model::ModelError::invalid(
                "recorded routing",
                format!(
                    "recorded for {} streams, asked for {streams}",
                    step.streams()
                ),
            ));
        }
        self.next += 1;
        Ok(step.clone())
    }
}

/// Where each layer's plan comes from.
pub enum Planner {
    /// What the runtime does: routing from the source, each layer planned by `plan_layer`
    /// against the cache.
    Live {
        /// The routing source.
        routing: Box<dyn RoutingSource>,
        /// The expert cache of each plan (one on one GPU: see `GpuLayout::plans`).
        caches: Vec<ExpertCache>,
        /// The GPUs the plans are for.
        layout: GpuLayout,
        /// Each layer's placement (the share of misses gathered).
        policy: PlacementPolicy,
        /// This step's routes.
        routes: StepRouting,
        /// The planner's buffers (one GPU).
        scratch: PlanScratch,
    },
    /// The counts of a recorded [`PlanTrace`], from its start.
    Replay {
        /// The trace.
        trace: Arc<PlanTrace>,
        /// Next layer-step to hand out.
        next: usize,
    },
}

impl Planner {
    /// A live planner.
    pub fn live(
        routing: Box<dyn RoutingSource>,
        cache: ExpertCache,
        policy: PlacementPolicy,
    ) -> Self {
        Self::live_gpus(routing, vec![cache], GpuLayout::single(), policy)
    }

    /// A live planner on the GPUs of `layout`, one cache per plan
    /// (`ft_model::traffic::strategy_caches`), each layer planned by
    /// `ft_model::traffic::plan_layer_gpus` (what the runtime runs on several GPUs).
    pub fn live_gpus(
        routing: Box<dyn RoutingSource>,
        caches: Vec<ExpertCache>,
        layout: GpuLayout,
        policy: PlacementPolicy,
    ) -> Self {
        Planner::Live {
            routing,
            caches,
            layout,
            policy,
            routes: StepRouting::default(),
            scratch: PlanScratch::default(),
        }
    }

    /// A replay of `trace`.
    pub fn replay(trace: Arc<PlanTrace>) -> Self {
        Planner::Replay { trace, next: 0 }
    }

    /// MoE layers per step.
    pub fn layers(&self) -> usize {
        match self {
            Planner::Live { routing, .. } => routing.geometry().moe_layers,
            Planner::Replay { trace, .. } => trace.layers,
        }
    }

    /// Route the next step.
    fn begin_step(&mut self, streams: usize) -> Result<()> {
        match self {
            Planner::Live {
                routing, routes, ..
            } => Ok(routing.next_step_into(streams, routes)?),
            Planner::Replay { trace, next } => {
                if trace.streams != streams
                    || *next + trace.layers * trace.plans.max(1) > trace.counts.len()
                {
                    return Err(SimError::invalid(
                        "plan trace",
                        format!(
                            "{} steps of {} streams recorded; step {} of {streams} streams asked",
                            trace.steps(),
                            trace.streams,
                            *next / (trace.layers * trace.plans).max(1)
                        ),
                    ));
                }
                Ok(())
            }
        }
    }

    /// Plan layer `l` of the current step: one count per plan into `out`.
    fn layer(&mut self, l: usize, out: &mut Vec<LayerCounts>) {
        out.clear();
        match self {
            Planner::Live {
                caches,
                layout,
                policy,
                routes,
                scratch,
                ..
            } => {
                if caches.len() == 1 {
                    out.push(
                        plan_layer_counts(
                            l,
                            &routes.layers[l],
                            &mut caches[0],
                            policy.layer(l),
                            scratch,
                        )
                        .layer_counts(),
                    );
                } else {
                    for p in plan_layer_gpus(l, &routes.layers[l], caches, layout, policy) {
                        out.push(LayerCounts::of_plan(&p));
                    }
                }
            }
            Planner::Replay { trace, next } => {
                let n = trace.plans.max(1);
                out.extend_from_slice(&trace.counts[*next..*next + n]);
                *next += n;
            }
        }
    }
}

/// What a layer's schedule depends on, for up to 16 GPUs, from each GPU's counts
/// ([`LayerSchedule::counts_on`]: under tensor parallelism the one plan with its CPU experts
/// dealt out): whether it has hits, fetched experts, more than one fetched chunk
/// ([`LayerSchedule::several_chunks`] at the engine's `fetch_chunks`) and a CPU share.
/// `None` for more GPUs.
fn structure_key(
    gpus: impl ExactSizeIterator<Item = LayerCounts>,
    fetch_chunks: usize,
) -> Option<u64> {
    if gpus.len() > 16 {
        return None;
    }
    Some(gpus.enumerate().fold(0u64, |k, (i, c)| {
        let bits = u64::from(c.hits > 0.0)
            | u64::from(c.fetched > 0.0) << 1
            | u64::from(LayerSchedule::several_chunks(fetch_chunks, c.fetched)) << 2
            | u64::from(c.cpu > 0.0) << 3;
        k | bits << (4 * i)
    }))
}

/// Hybrid's miss rate relative to offload's at the same cache
/// ([`ft_model::perf::EngineTerms::hybrid_miss_factor`], a calibrated term of an engine's
/// runs), applied to the plans before they are timed, as the analytic model applies it to
/// its samples ([`ft_model::perf::EngineTerms::apply_miss_factor`]): in every layer with a
/// gather and a CPU share, experts move between the hits and the misses and the misses keep
/// their split between the link and the CPU. The simulator moves whole experts (a gather
/// copies whole experts): each plan's fetched and CPU counts are rounded with the fraction
/// carried to its next layer, so their mean over a run is the model's scaled count.
#[derive(Debug, Clone, Default)]
struct MissFactor {
    /// Each plan's carried fraction of (fetched, CPU) experts.
    carry: Vec<(f64, f64)>,
}

/// `x` plus the carried fraction, rounded to a whole number; the rest stays carried.
fn round_carried(x: f64, carry: &mut f64) -> f64 {
    let want = x + *carry;
    let got = want.round().max(0.0);
    *carry = want - got;
    got
}

impl MissFactor {
    /// Scale the misses of `plans` (one per GPU plan) by `engine`'s factor.
    fn apply(&mut self, engine: &ft_model::perf::EngineTerms, plans: &mut [LayerCounts]) {
        if engine.hybrid_miss_factor == 1.0 {
            return;
        }
        if self.carry.len() < plans.len() {
            self.carry.resize(plans.len(), (0.0, 0.0));
        }
        for (c, carry) in plans.iter_mut().zip(self.carry.iter_mut()) {
            if c.cpu <= 0.0 || c.fetched <= 0.0 {
                continue;
            }
            let scaled = engine.apply_miss_factor(c);
            let union = c.unique();
            let fetched = round_carried(scaled.fetched, &mut carry.0).min(union);
            let cpu = round_carried(scaled.cpu, &mut carry.1);
            let cpu_fit = cpu.min(union - fetched);
            carry.1 += cpu - cpu_fit;
            let per = |n: f64, of: f64, tokens: f64| if of > 0.0 { tokens * n / of } else { 0.0 };
            let fetched_tokens = per(fetched, scaled.fetched, scaled.fetched_tokens);
            let cpu_tokens = per(cpu_fit, scaled.cpu, scaled.cpu_tokens);
            let all_tokens = c.hit_tokens + c.fetched_tokens + c.cpu_tokens;
            *c = LayerCounts {
                hits: union - fetched - cpu_fit,
                hit_tokens: (all_tokens - fetched_tokens - cpu_tokens).max(0.0),
                fetched,
                fetched_tokens,
                cpu: cpu_fit,
                cpu_tokens,
            };
        }
    }
}

/// Requests of the closed loop.
#[derive(Debug, Clone, Copy, PartialEq, serde::Serialize, serde::Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Workload {
    /// Prompt length of every request, tokens (the field report: about 1.2K).
    pub prompt_tokens: u64,
    /// Output length of every request, tokens (the field report: 256).
    pub output_tokens: u64,
    /// Fixed prefill time per new request, ns (excluded from decode tok/s).
    pub prefill_ns: Nanos,
}

impl Default for Workload {
    fn default() -> Self {
        Workload {
            prompt_tokens: 1200,
            output_tokens: 256,
            prefill_ns: 0,
        }
    }
}

/// Counters of the measured steps.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct DecodeCounters {
    /// Measured decode steps.
    pub steps: u64,
    /// Tokens generated in them (sum over streams).
    pub tokens: u64,
    /// Decode time of the measured steps, ns (prefill excluded).
    pub decode_ns: Nanos,
    /// Layer-steps counted.
    pub layer_steps: u64,
    /// Distinct experts over layer-steps.
    pub unique: u64,
    /// Misses over layer-steps.
    pub misses: u64,
    /// Experts crossing the link.
    pub link_experts: u64,
    /// Experts computed on the CPU.
    pub cpu_experts: u64,
    /// Layers whose CPU result arrived after the GPU side was done (CPU-side critical).
    pub cpu_critical_layers: u64,
    /// Time gathers and CPU weight reads overlapped, ns.
    pub contended_ns: Nanos,
    /// GPU stream busy time, ns.
    pub gpu_busy_ns: Nanos,
    /// H2D link busy time, ns.
    pub h2d_busy_ns: Nanos,
    /// CPU pool busy time, ns.
    pub cpu_busy_ns: Nanos,
    /// Critical-path time per resource, ns ([`crate::layer::CRITICAL_NAMES`] order).
    pub critical: CriticalSplit,
}

/// The decode process (a [`Component`] of [`LayerEvent`]s).
pub struct DecodeProcess<'a> {
    costs: &'a CostModel,
    dense_ns: f64,
    planner: Planner,
    layers: usize,
    streams: usize,
    workload: Workload,
    jitter: f64,
    warmup_steps: u64,
    measured_steps: u64,
    lanes: LayerMachine,
    /// This layer's counts of each plan (reused).
    plan_counts: Vec<LayerCounts>,
    /// Hybrid's calibrated miss factor on each plan's counts.
    miss_factor: MissFactor,
    /// The schedules met so far, by [`structure_key`] (a run meets a handful).
    schedules: Vec<(u64, Arc<LayerSchedule>)>,
    /// This layer's costs of each GPU (reused).
    lane_costs: Vec<LayerCosts>,
    /// Tokens generated so far by each stream's current request.
    generated: Vec<u64>,
    cur_layer: usize,
    step: u64,
    step_start: Nanos,
    context: u64,
    measuring: bool,
    snapshot: (Nanos, Nanos, Nanos),
    counters: DecodeCounters,
    error: Option<SimError>,
}

impl<'a> DecodeProcess<'a> {
    /// A process that decodes `warmup_steps` unmeasured then `measured_steps` measured
    /// steps of `streams` streams.
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        costs: &'a CostModel,
        planner: Planner,
        streams: usize,
        workload: Workload,
        jitter: f64,
        warmup_steps: u64,
        measured_steps: u64,
    ) -> Self {
        DecodeProcess {
            lanes: LayerMachine::new(costs.lane_resources(), costs.combine_ns(streams)),
            plan_counts: Vec::new(),
            miss_factor: MissFactor::default(),
            schedules: Vec::new(),
            lane_costs: Vec::new(),
            costs,
            dense_ns: 0.0,
            layers: planner.layers(),
            planner,
            streams,
            workload,
            jitter,
            warmup_steps,
            measured_steps,
            generated: vec![0; streams],
            cur_layer: 0,
            step: 0,
            step_start: 0,
            context: 0,
            measuring: false,
            snapshot: (0, 0, 0),
            counters: DecodeCounters::default(),
            error: None,
        }
    }

    /// Counters of the measured steps.
    pub fn counters(&self) -> &DecodeCounters {
        &self.counters
    }

    /// The planner (after the run: its cache for a live one).
    pub fn planner(&self) -> &Planner {
        &self.planner
    }

    /// The resources of the first GPU (the only one on one GPU), after the run.
    pub fn resources(&self) -> &Resources {
        &self.lanes.res[0]
    }

    /// The layer machine of every GPU (after the run).
    pub fn lanes(&self) -> &LayerMachine {
        &self.lanes
    }

    /// An error raised inside the run (a routing source failing), if any.
    pub fn take_error(&mut self) -> Option<SimError> {
        self.error.take()
    }

    /// Schedule the first step at time 0.
    pub fn start(&mut self, s: &mut Scheduler<LaneEvent>) {
        s.schedule_at(0, LaneEvent::from(LayerEvent::StepStart));
    }

    fn jittered(&self, x: f64, s: &mut Scheduler<LaneEvent>) -> f64 {
        if self.jitter <= 0.0 || x <= 0.0 {
            return x;
        }
        let z: f64 = s.rng().sample(StandardNormal);
        x * (self.jitter * z - 0.5 * self.jitter * self.jitter).exp()
    }

    fn jitter_costs(&self, mut c: LayerCosts, s: &mut Scheduler<LaneEvent>) -> LayerCosts {
        if self.jitter <= 0.0 {
            return c;
        }
        c.dense_ns = self.jittered(c.dense_ns, s);
        c.hit_kernel_ns = self.jittered(c.hit_kernel_ns, s);
        c.fetched_early_ns = self.jittered(c.fetched_early_ns, s);
        c.fetched_kernel_ns = self.jittered(c.fetched_kernel_ns, s);
        if let Some(g) = c.gather.as_mut() {
            g.bytes_each = self.jittered(g.bytes_each, s);
        }
        if let Some(mut cpu) = c.cpu {
            cpu.fixed_ns = self.jittered(cpu.fixed_ns, s);
            cpu.bytes = self.jittered(cpu.bytes, s);
            cpu.sync_ns = self.jittered(cpu.sync_ns, s);
            c.cpu = Some(cpu);
        }
        c
    }

    fn start_layer(&mut self, now: Nanos, s: &mut Scheduler<LaneEvent>) {
        let l = self.cur_layer;
        let mut plans = std::mem::take(&mut self.plan_counts);
        self.planner.layer(l, &mut plans);
        self.miss_factor
            .apply(&self.costs.params.engine, &mut plans);
        if self.measuring {
            let c = &mut self.counters;
            c.layer_steps += 1;
            for counts in &plans {
                c.unique += counts.unique() as u64;
                c.misses += counts.misses() as u64;
                c.link_experts += counts.fetched as u64;
                c.cpu_experts += counts.cpu as u64;
            }
        }
        let schedule = self.schedule_for(&plans);
        let work = LayerWork::of(&plans);
        let mut costs = std::mem::take(&mut self.lane_costs);
        costs.clear();
        for g in 0..self.lanes.gpus() as u32 {
            // Its counts as the schedule deals them (under tensor parallelism its share of
            // the CPU experts); the shared schedule's own counts are another layer's.
            let counts = LayerSchedule::counts_on(&self.costs.layout, &plans, g);
            let c = self
                .costs
                .costs_of(&counts, &schedule, work, self.streams, self.dense_ns, g);
            costs.push(self.jitter_costs(c, s));
        }
        self.plan_counts = plans;
        self.lanes.start(now, schedule, &costs, s);
        self.lane_costs = costs;
    }

    /// The schedule of a layer whose GPUs plan `plans`: its operations depend only on which
    /// work each plan holds ([`structure_key`]), so one schedule per structure is built and
    /// shared (a debug build checks it against a fresh one).
    fn schedule_for(&mut self, plans: &[LayerCounts]) -> Arc<LayerSchedule> {
        let layout = self.costs.layout;
        let gpus = (0..layout.count() as u32).map(|g| LayerSchedule::counts_on(&layout, plans, g));
        let settings = self.costs.params.engine_settings;
        let Some(key) = structure_key(gpus, settings.fetch_chunks) else {
            return Arc::new(LayerSchedule::new(&self.costs.layout, &settings, plans));
        };
        let schedule = match self.schedules.iter().find(|(k, _)| *k == key) {
            Some((_, s)) => Arc::clone(s),
            None => {
                let s = Arc::new(LayerSchedule::new(&self.costs.layout, &settings, plans));
                self.schedules.push((key, Arc::clone(&s)));
                s
            }
        };
        debug_assert_eq!(
            schedule.ops,
            LayerSchedule::new(&self.costs.layout, &settings, plans).ops,
            "one structure, one schedule"
        );
        schedule
    }

    /// Busy time of (GPU stream, H2D link, CPU share) summed over the GPUs, ns.
    fn busy(&self) -> (Nanos, Nanos, Nanos) {
        self.lanes.res.iter().fold((0, 0, 0), |(g, h, c), r| {
            (
                g + r.gpu.busy_ns(),
                h + r.h2d.busy_ns(),
                c + r.cpu.busy_ns(),
            )
        })
    }

    /// Begin a step at `now`: routing for every stream, then layer 0.
    fn begin_step(&mut self, now: Nanos, s: &mut Scheduler<LaneEvent>) -> Control {
        if self.step == self.warmup_steps {
            self.measuring = true;
            self.snapshot = self.busy();
        }
        if let Err(e) = self.planner.begin_step(self.streams) {
            self.error = Some(e);
            return Control::Stop;
        }
        self.context = self
            .generated
            .iter()
            .map(|g| self.workload.prompt_tokens + g)
            .sum();
        self.dense_ns = self.costs.dense_ns(self.streams, self.context);
        self.step_start = now;
        self.cur_layer = 0;
        self.start_layer(now, s);
        Control::Continue
    }

    fn end_step(&mut self, now: Nanos, s: &mut Scheduler<LaneEvent>) -> Control {
        if self.measuring {
            self.counters.steps += 1;
            self.counters.tokens += self.streams as u64;
            self.counters.decode_ns += now - self.step_start;
        }
        self.step += 1;
        let mut new_requests = 0;
        for g in self.generated.iter_mut() {
            *g += 1;
            if *g >= self.workload.output_tokens {
                *g = 0;
                new_requests += 1;
            }
        }
        if self.step >= self.warmup_steps + self.measured_steps {
            let (g, h, c) = self.busy();
            let c0 = &mut self.counters;
            c0.gpu_busy_ns = g - self.snapshot.0;
            c0.h2d_busy_ns = h - self.snapshot.1;
            c0.cpu_busy_ns = c - self.snapshot.2;
            return Control::Stop;
        }
        let prefill = self.workload.prefill_ns * new_requests;
        if prefill > 0 {
            s.schedule_at(now + prefill, LaneEvent::from(LayerEvent::StepStart));
            Control::Continue
        } else {
            self.begin_step(now, s)
        }
    }
}

impl Component<LaneEvent> for DecodeProcess<'_> {
    fn handle(&mut self, now: Nanos, ev: LaneEvent, s: &mut Scheduler<LaneEvent>) -> Control {
        if ev.event == LayerEvent::StepStart {
            return self.begin_step(now, s);
        }
        let Some(end) = self.lanes.handle(now, ev, s) else {
            return Control::Continue;
        };
        if self.measuring {
            let slow = self.lanes.slowest();
            let t = *self.lanes.times(slow);
            for g in 0..self.lanes.gpus() {
                self.counters.contended_ns += self.lanes.times(g).contended_ns;
            }
            if t.cpu_side_end > t.gpu_side_end {
                self.counters.cpu_critical_layers += 1;
            }
            let mut split = t.critical(self.lanes.costs(slow).overhead_ns);
            if self.lanes.gpus() > 1 {
                // The combine after the slowest GPU: traffic between devices (sync), as the
                // analytic model charges it.
                split[SYNC_INDEX] += end.saturating_sub(t.end) as f64;
            }
            for (a, b) in self.counters.critical.iter_mut().zip(split) {
                *a += b;
            }
        }
        self.cur_layer += 1;
        if self.cur_layer < self.layers {
            self.start_layer(end, s);
            Control::Continue
        } else {
            self.end_step(end, s)
        }
    }
}

/// Check a run's shape before it starts.
pub fn check_run(streams: usize, steps: u64) -> Result<()> {
    if streams == 0 {
        return Err(SimError::invalid("--streams", "must be at least 1"));
    }
    if steps == 0 {
        return Err(SimError::invalid("--steps", "must be at least 1"));
    }
    Ok(())
}
