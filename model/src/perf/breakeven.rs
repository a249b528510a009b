//! Break-evens: how far each uncertain input of a decision must move for the choice to flip.
//!
//! Why it exists: a decision made from a bench's numbers inherits the bench's view of the
//! engine. The inputs an engine changes most (the CPU side's serving rate against its bench
//! rate, a fixed cost per layer-step of the CPU path, the miss rate, the link's rate, the
//! context) are the ones a prediction is least sure of, so every decision says, for each, the
//! value at which another strategy would take over, with the rest held: "hybrid stays ahead
//! while the CPU side serves at >= 0.62x its bench rate". Where no value in a wide range
//! flips it, it says so.
//!
//! Method. A [`Scenario`] takes the traffic of every feasible strategy of a prediction: the
//! prediction's own counting runs, which it keeps (not serialized), or, for a prediction
//! read back from JSON or another configuration, the same runs counted again (the same
//! routing, seed, cache and planner as [`super::predict`], so the counts are the
//! prediction's). It keeps them as a histogram of distinct layer-step counts
//! (the step time is a sum over layer-steps of a function of their counts, so this is exact
//! and makes an evaluation cheap). Hybrid keeps the counts of every fraction of
//! [`FETCH_GRID`] and of its chosen one, and takes the best of them at each point, so its
//! fraction is re-optimised as an input moves; a layer split keeps its CPU layers. An input
//! is applied to the parameters ([`Knobs::apply`]) or to the counts (the miss rate scales
//! each cached layer-step's misses). The advantage of the choice is
//! `ln(best other step time / choice's step time)`; from the current value outward to each
//! end of the input's range it is scanned on [`SCAN_POINTS`] points (on a log scale for
//! rates and the context) and the first point where the choice is no longer ahead is
//! refined by bisection (not a root finder on the advantage: where hybrid's best fraction
//! becomes 1 it *is* offload, so the advantage reaches zero and stays there, a tie a root
//! finder cannot place). The tests check the result against a brute-force scan of the same
//! advantage ([`Scenario::scan_flip`], the slow reference).
//!
//! What is held: the cache's slots (a longer context does not shrink the cache here), a
//! layer split's CPU layers, every other input.

use serde::{Deserialize, Serialize};
use std::collections::HashMap;
use std::fmt::Write as _;

use super::predict::{
    sample_traffic_gpus, PredictConfig, Prediction, SampleRun, TrafficSamples, FETCH_GRID,
};
use super::step::{LayerCounts, StepShape};
use super::{PerfModel, PerfParams};
use crate::error::{ModelError, Result};
use crate::preset::ModelSpec;
use crate::routing;
use crate::strategy::{
    CpuLayers, FetchFraction, LayerPlacement, PlacementPolicy, Strategy, StrategyKind,
};

/// Points scanned between the current value and each end of an input's range before the
/// first flip is refined: 48 points put neighbours at most 9% apart on the widest log range
/// (a factor of 64), closer than two flips of one input lie in the cases tested.
pub const SCAN_POINTS: usize = 48;

/// The advantage (relative) at or below which the choice counts as flipped: half a percent,
/// far inside any measured run's noise. Where hybrid's best fraction nears 1 it is offload
/// within a fraction of a percent, and the exact sign of so small a difference moves with
/// the sampled routing.
pub const FLIP_MARGIN: f64 = 0.005;

/// Bisection steps refining a flip between two scan points: 40 halvings of a step of at
/// most a factor of 1.2 (or 1/32 of a linear range) place it to about 1e-13 of it.
pub const BISECTION_STEPS: usize = 40;

/// Widest CPU serving rate searched, as a multiple of the model's (16x: a CPU far faster
/// than benched is a bench error, not a serving condition).
pub const CPU_SPEED_MAX: f64 = 16.0;

/// Slowest CPU serving rate searched (1/64 of the model's: published hybrids served at 0.03
/// to 0.05x their bench rate, reference engine issues #436 and #151).
pub const CPU_SPEED_MIN: f64 = 1.0 / 64.0;

/// Range of the link's rate searched, as a multiple of the model's.
pub const LINK_SPEED_RANGE: [f64; 2] = [1.0 / 16.0, 16.0];

/// Largest fixed cost per layer-step with CPU work searched, in us (the issue reports
/// hundreds of microseconds per layer-step in engines; 5 ms is beyond any).
pub const CPU_LAYER_FIXED_MAX_US: f64 = 5000.0;

/// Longest context searched, in tokens.
pub const CONTEXT_MAX: f64 = 262_144.0;

/// What a decision from a fit with 0 residual degrees of freedom says of itself: it is
/// calibrated, but its standard errors are undefined (as many fitted terms as runs).
pub const ZERO_DOF_NOTE: &str = "calibrated with 0 degrees of freedom (as many fitted terms as \
    runs): the fitted terms' standard errors are undefined, the intervals assume the host \
    model's run noise; one more run estimates them.";

/// An uncertain input of a decision.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Input {
    /// The CPU side's serving rate, as a multiple of the rate the model uses (a host spec's:
    /// its bench rate): rates times it, CPU fixed costs divided by it.
    CpuServing,
    /// The fixed cost in series of a layer-step with CPU work (submit, wake, barrier,
    /// merge), in us: the calibrated overhead of a layer with a CPU share.
    CpuLayerFixed,
    /// Offload's miss rate (0 to 1); every cached layer-step's misses scale with it.
    MissRate,
    /// The link's gather rate, as a multiple of the model's.
    LinkRate,
    /// The context of each stream, in tokens.
    Context,
}

impl Input {
    /// Every input, in report order.
    pub const ALL: [Input; 5] = [
        Input::CpuServing,
        Input::CpuLayerFixed,
        Input::MissRate,
        Input::LinkRate,
        Input::Context,
    ];

    /// Its name in reports.
    pub fn name(self) -> &'static str {
        match self {
            Input::CpuServing => "cpu-serving",
            Input::CpuLayerFixed => "cpu-layer-fixed",
            Input::MissRate => "miss-rate",
            Input::LinkRate => "link-rate",
            Input::Context => "context",
        }
    }

    /// Whether it is searched on a log scale (rates and lengths) or a linear one.
    fn log_scale(self) -> bool {
        match self {
            Input::CpuServing | Input::LinkRate | Input::Context => true,
            Input::CpuLayerFixed | Input::MissRate => false,
        }
    }

    /// A plausible size of a move of this input when nothing is measured, in its search
    /// coordinate (log for log inputs): what ranks flips by how likely they are. The CPU
    /// side serves between half and twice its bench rate in most engines, the link within
    /// 20% of its rate, an engine's fixed cost per layer-step is a few hundred us, a miss
    /// rate is known within ten points; the context is the user's, so it never settles.
    fn plausible_move(self) -> f64 {
        match self {
            Input::CpuServing => 2f64.ln(),
            Input::LinkRate => 1.2f64.ln(),
            Input::CpuLayerFixed => 300.0,
            Input::MissRate => 0.10,
            Input::Context => f64::INFINITY,
        }
    }
}

impl std::fmt::Display for Input {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// Where the inputs stand, each in its own unit.
#[derive(Debug, Clone, Copy, PartialEq)]
struct Knobs {
    cpu_speed: f64,
    cpu_layer_fixed_us: f64,
    miss_rate: f64,
    link_speed: f64,
    context: f64,
}

impl Knobs {
    fn get(&self, input: Input) -> f64 {
        match input {
            Input::CpuServing => self.cpu_speed,
            Input::CpuLayerFixed => self.cpu_layer_fixed_us,
            Input::MissRate => self.miss_rate,
            Input::LinkRate => self.link_speed,
            Input::Context => self.context,
        }
    }

    fn with(mut self, input: Input, x: f64) -> Self {
        match input {
            Input::CpuServing => self.cpu_speed = x,
            Input::CpuLayerFixed => self.cpu_layer_fixed_us = x,
            Input::MissRate => self.miss_rate = x,
            Input::LinkRate => self.link_speed = x,
            Input::Context => self.context = x,
        }
        self
    }
}

/// One layer-step's counts (one per plan), as a histogram key.
#[derive(Debug, Clone)]
struct Entry {
    counts: Vec<LayerCounts>,
    /// Layer-steps with these counts.
    weight: f64,
    /// Whether its misses move with the miss rate (a cached layer that admits).
    scalable: bool,
}

/// One counting run, compressed.
#[derive(Debug, Clone)]
struct Run {
    entries: Vec<Entry>,
    steps: f64,
}

impl Run {
    fn of(s: &TrafficSamples) -> Run {
        let plans = s.plans.max(1);
        let layers = s.layers.max(1);
        let admits = s.fetch_fraction > 0.0;
        let mut index: HashMap<(Vec<[u64; 6]>, bool), usize> = HashMap::new();
        let mut entries: Vec<Entry> = Vec::new();
        for (i, c) in s.counts.chunks(plans).enumerate() {
            let layer = i % layers;
            let scalable = admits && layer >= s.cpu_layers;
            let key: Vec<[u64; 6]> = c
                .iter()
                .map(|c| {
                    [
                        c.hits.to_bits(),
                        c.hit_tokens.to_bits(),
                        c.fetched.to_bits(),
                        c.fetched_tokens.to_bits(),
                        c.cpu.to_bits(),
                        c.cpu_tokens.to_bits(),
                    ]
                })
                .collect();
            match index.get(&(key.clone(), scalable)) {
                Some(&k) => entries[k].weight += 1.0,
                None => {
                    index.insert((key, scalable), entries.len());
                    entries.push(Entry {
                        counts: c.to_vec(),
                        weight: 1.0,
                        scalable,
                    });
                }
            }
        }
        Run {
            entries,
            steps: s.steps().max(1) as f64,
        }
    }

    /// Mean step time, in us.
    fn step_us(&self, p: &PerfParams, shape: &StepShape, miss_scale: f64) -> f64 {
        let dense = p.dense_us(&shape.dense, shape.streams, shape.context);
        let mut total = 0.0;
        let mut scaled = Vec::new();
        for e in &self.entries {
            let t = if e.scalable && miss_scale != 1.0 {
                scaled.clear();
                scaled.extend(e.counts.iter().map(|c| scale_misses(c, miss_scale)));
                p.layer_time_gpus(shape, &scaled, dense).total_us
            } else {
                p.layer_time_gpus(shape, &e.counts, dense).total_us
            };
            total += e.weight * t;
        }
        total / self.steps
    }
}

/// A layer-step's counts with its misses (and their tokens) times `k`, at most all of its
/// distinct experts (tokens), split between the link and the CPU as they were.
fn scale_misses(c: &LayerCounts, k: f64) -> LayerCounts {
    let unique = c.hits + c.fetched + c.cpu;
    let tokens = c.hit_tokens + c.fetched_tokens + c.cpu_tokens;
    let m = c.fetched + c.cpu;
    let mt = c.fetched_tokens + c.cpu_tokens;
    if m <= 0.0 {
        return *c;
    }
    let r = (k * m).min(unique) / m;
    let rt = if mt > 0.0 {
        (mt * r).min(tokens) / mt
    } else {
        0.0
    };
    LayerCounts {
        hits: unique - m * r,
        hit_tokens: tokens - mt * rt,
        fetched: c.fetched * r,
        fetched_tokens: c.fetched_tokens * rt,
        cpu: c.cpu * r,
        cpu_tokens: c.cpu_tokens * rt,
    }
}

/// A strategy of the decision with its counts (several for hybrid: the best is taken).
#[derive(Debug, Clone)]
struct Contender {
    strategy: Strategy,
    runs: Vec<Run>,
}

impl Contender {
    fn kind(&self) -> StrategyKind {
        self.strategy.kind()
    }
}

/// A prediction's strategies, re-evaluable at other values of its uncertain inputs.
#[derive(Debug, Clone)]
pub struct Scenario {
    params: PerfParams,
    shape: StepShape,
    base: Knobs,
    choice: StrategyKind,
    contenders: Vec<Contender>,
    /// Residual degrees of freedom of the fit the parameters came from: `None` where the
    /// CPU side's rate is a bench's (a host spec, no run fitted); `Some(0)` where a fit to
    /// runs left its standard errors undefined.
    dof: Option<usize>,
}

/// Whether a strategy of a prediction takes part in the decision (as [`super::decide`]
/// ranks them).
pub fn ranked(s: &super::StrategyPrediction) -> bool {
    s.feasible && !(s.kind.takes_cpu_layers() && s.cpu_layers == Some(0))
}

impl Scenario {
    /// Re-sample the traffic of `pred`'s ranked strategies (made for `model` with `perf`
    /// under `config`), for the choice `choice`.
    pub fn new(
        model: &ModelSpec,
        perf: &PerfModel,
        config: &PredictConfig,
        pred: &Prediction,
        choice: StrategyKind,
    ) -> Result<Scenario> {
        let p = &perf.params;
        let sample = |kind: StrategyKind, placement: PlacementPolicy| -> Result<Run> {
            let mut src = routing::resolve(&config.routing, &model.geometry, config.seed)?;
            let s = sample_traffic_gpus(
                src.as_mut(),
                &SampleRun {
                    kind,
                    placement,
                    cache: &config.cache_options,
                    slots: pred.cache_slots,
                    warmup_steps: config.warmup_steps,
                    steps: config.steps,
                    streams: config.streams,
                },
                &p.layout,
            )?;
            Ok(Run::of(&s))
        };
        // The prediction's own runs where it kept them and they are of this configuration
        // (the same runs: the same counting, done once).
        let kept = pred
            .traffic
            .get()
            .filter(|_| pred.config == *config && pred.layout == p.layout);
        let or_sample = |kept: Option<&TrafficSamples>, kind, placement| match kept {
            Some(s) => Ok(Run::of(s)),
            None => sample(kind, placement),
        };
        let mut contenders = Vec::new();
        for s in pred.strategies.iter().filter(|s| ranked(s)) {
            let n = s.cpu_layers.unwrap_or(0);
            let runs = match s.kind {
                StrategyKind::Offload => vec![or_sample(
                    kept.map(|t| &t.offload),
                    s.kind,
                    PlacementPolicy::cached(1.0),
                )?],
                StrategyKind::Cpu => vec![or_sample(
                    kept.map(|t| &t.cpu),
                    s.kind,
                    PlacementPolicy::cached(0.0),
                )?],
                StrategyKind::Resident => vec![or_sample(
                    kept.map(|t| &t.resident),
                    s.kind,
                    PlacementPolicy::cached(1.0),
                )?],
                StrategyKind::Hybrid => match kept {
                    Some(t) => std::iter::once(&t.hybrid)
                        .chain(&t.grid)
                        .map(Run::of)
                        .collect(),
                    None => {
                        let mut fs = vec![s.fetch_fraction];
                        if config.hybrid_fetch == FetchFraction::Auto {
                            fs.extend(FETCH_GRID);
                        }
                        fs.into_iter()
                            .map(|f| sample(s.kind, PlacementPolicy::cached(f)))
                            .collect::<Result<Vec<_>>>()?
                    }
                },
                StrategyKind::LayerSplit => vec![sample(
                    s.kind,
                    PlacementPolicy {
                        cpu_layers: n,
                        rest: LayerPlacement::Resident,
                    },
                )?],
                StrategyKind::LayerSplitCached => vec![or_sample(
                    kept.and_then(|t| t.split_cached.as_ref()),
                    s.kind,
                    PlacementPolicy {
                        cpu_layers: n,
                        rest: LayerPlacement::Cached {
                            fetch_fraction: 1.0,
                        },
                    },
                )?],
            };
            let strategy = match s.strategy {
                Strategy::LayerSplit { .. } => Strategy::LayerSplit {
                    cpu_layers: CpuLayers::Fixed(n),
                },
                Strategy::LayerSplitCached { .. } => Strategy::LayerSplitCached {
                    cpu_layers: CpuLayers::Fixed(n),
                },
                other => other,
            };
            contenders.push(Contender { strategy, runs });
        }
        if !contenders.iter().any(|c| c.kind() == choice) {
            return Err(ModelError::invalid(
                "break-even",
                format!("the choice {choice} is not among the prediction's ranked strategies"),
            ));
        }
        Ok(Scenario {
            params: p.clone(),
            shape: StepShape::new(model, config.streams, config.context),
            base: Knobs {
                cpu_speed: 1.0,
                cpu_layer_fixed_us: p.overhead.hybrid_us,
                miss_rate: pred.offload_miss_rate,
                link_speed: 1.0,
                context: config.context as f64,
            },
            choice,
            contenders,
            dof: perf.dof,
        })
    }

    /// Whether the parameters are a host spec's (no run fitted).
    fn uncalibrated(&self) -> bool {
        self.dof.is_none()
    }

    /// The strategies taking part, with the choice first.
    pub fn strategies(&self) -> Vec<Strategy> {
        let mut v: Vec<Strategy> = self.contenders.iter().map(|c| c.strategy).collect();
        v.sort_by_key(|s| s.kind() != self.choice);
        v
    }

    /// The current value of `input`, in its unit.
    pub fn current(&self, input: Input) -> f64 {
        self.base.get(input)
    }

    /// The range `input` is searched over, in its unit.
    pub fn range(&self, input: Input) -> [f64; 2] {
        match input {
            Input::CpuServing => [CPU_SPEED_MIN, CPU_SPEED_MAX],
            Input::CpuLayerFixed => [
                0.0,
                CPU_LAYER_FIXED_MAX_US.max(10.0 * self.base.cpu_layer_fixed_us),
            ],
            Input::MissRate => [0.0, 1.0],
            Input::LinkRate => LINK_SPEED_RANGE,
            Input::Context => [1.0, CONTEXT_MAX.max(self.base.context)],
        }
    }

    fn params_at(&self, k: &Knobs) -> PerfParams {
        let mut p = self
            .params
            .with_cpu_speed(k.cpu_speed)
            .unwrap_or_else(|_| self.params.clone());
        p.gather_gbs *= k.link_speed;
        let extra = k.cpu_layer_fixed_us - self.base.cpu_layer_fixed_us;
        p.overhead.hybrid_us = k.cpu_layer_fixed_us.max(0.0);
        p.overhead.cpu_us = (p.overhead.cpu_us + extra).max(0.0);
        p
    }

    fn miss_scale(&self, k: &Knobs) -> f64 {
        if self.base.miss_rate > 0.0 {
            k.miss_rate / self.base.miss_rate
        } else {
            1.0
        }
    }

    /// Step time of every strategy (in [`Scenario::strategies`]' order of the contenders)
    /// with the inputs at `k`, in us.
    fn step_times(&self, k: &Knobs) -> Vec<(StrategyKind, f64)> {
        let p = self.params_at(k);
        let shape = StepShape {
            context: k.context,
            ..self.shape
        };
        let scale = self.miss_scale(k);
        self.contenders
            .iter()
            .map(|c| {
                let t = c
                    .runs
                    .iter()
                    .map(|r| r.step_us(&p, &shape, scale))
                    .fold(f64::INFINITY, f64::min);
                (c.kind(), t)
            })
            .collect()
    }

    /// Step time of `kind` with `input` at `x` (the rest as they are), in us.
    pub fn step_us_at(&self, kind: StrategyKind, input: Input, x: f64) -> Option<f64> {
        self.step_times(&self.base.with(input, x))
            .into_iter()
            .find(|(k, _)| *k == kind)
            .map(|(_, t)| t)
    }

    /// Step time of `kind` as predicted (every input at its current value), in us.
    pub fn step_us(&self, kind: StrategyKind) -> Option<f64> {
        self.step_times(&self.base)
            .into_iter()
            .find(|(k, _)| *k == kind)
            .map(|(_, t)| t)
    }

    /// `ln(best other's step time / the choice's)` with `input` at `x` (positive: the
    /// choice is ahead), and the best other strategy.
    pub fn advantage(&self, input: Input, x: f64) -> (f64, Option<StrategyKind>) {
        let times = self.step_times(&self.base.with(input, x));
        let mine = times
            .iter()
            .find(|(k, _)| *k == self.choice)
            .map(|(_, t)| *t)
            .unwrap_or(f64::INFINITY);
        let other = times
            .iter()
            .filter(|(k, _)| *k != self.choice)
            .min_by(|a, b| a.1.total_cmp(&b.1));
        match other {
            Some((k, t)) => ((t / mine).ln(), Some(*k)),
            None => (f64::INFINITY, None),
        }
    }

    /// The first flip of `input` from its current value towards `end`: scan, then Brent.
    pub fn find_flip(&self, input: Input, end: f64) -> Result<Option<Flip>> {
        let x0 = self.current(input);
        let (u0, u1) = (coord(input, x0), coord(input, end));
        if (u1 - u0).abs() < 1e-12 {
            return Ok(None);
        }
        let ahead = |u: f64| self.ahead(input, uncoord(input, u));
        if !ahead(u0) {
            return Ok(None);
        }
        let mut prev = u0;
        for i in 1..=SCAN_POINTS {
            let u = u0 + (u1 - u0) * i as f64 / SCAN_POINTS as f64;
            if !ahead(u) {
                let root = refine(&ahead, prev, u);
                return Ok(Some(self.flip_at(input, root, u)));
            }
            prev = u;
        }
        Ok(None)
    }

    /// The slow reference of [`Scenario::find_flip`]: the first of `points` evenly spaced
    /// points from the current value to `end` (in the search coordinate) where the choice is
    /// no longer ahead.
    pub fn scan_flip(&self, input: Input, end: f64, points: usize) -> Option<f64> {
        let x0 = self.current(input);
        let (u0, u1) = (coord(input, x0), coord(input, end));
        (1..=points)
            .map(|i| uncoord(input, u0 + (u1 - u0) * i as f64 / points as f64))
            .find(|&x| !self.ahead(input, x))
    }

    /// Whether the choice is ahead of every other strategy by more than [`FLIP_MARGIN`]
    /// with `input` at `x`.
    pub fn ahead(&self, input: Input, x: f64) -> bool {
        self.advantage(input, x).0 > FLIP_MARGIN.ln_1p()
    }

    fn flip_at(&self, input: Input, root: f64, beyond: f64) -> Flip {
        let at = uncoord(input, root);
        let (_, to) = self.advantage(input, uncoord(input, beyond));
        let to = to.unwrap_or(self.choice);
        let strategy = self
            .contenders
            .iter()
            .find(|c| c.kind() == to)
            .map(|c| c.strategy)
            .unwrap_or(Strategy::Offload);
        Flip { at, to: strategy }
    }

    /// The break-even of `input`: its first flip below and above the current value.
    pub fn break_even(&self, input: Input) -> Result<BreakEven> {
        let [lo, hi] = self.range(input);
        let applicable = !(input == Input::MissRate && self.base.miss_rate <= 0.0);
        let (below, above) = if applicable {
            (self.find_flip(input, lo)?, self.find_flip(input, hi)?)
        } else {
            (None, None)
        };
        let current = self.current(input);
        let text = self.describe(input, current, [lo, hi], below.as_ref(), above.as_ref());
        Ok(BreakEven {
            input,
            current,
            range: [lo, hi],
            below,
            above,
            text: if applicable {
                text
            } else {
                format!("{input}: offload misses nothing here, so no miss rate moves it")
            },
        })
    }

    /// `x` in `input`'s unit, short ("0.62x", "412 us", "14.4%", "1024 tokens").
    fn num(input: Input, x: f64) -> String {
        match input {
            Input::CpuServing | Input::LinkRate => format!("{}x", sig(x)),
            Input::CpuLayerFixed => format!("{x:.0} us"),
            Input::MissRate => format!("{:.1}%", 100.0 * x),
            Input::Context => format!("{x:.0} tokens"),
        }
    }

    /// What a multiple is of ("" for absolute units).
    fn of(&self, input: Input) -> String {
        match input {
            Input::CpuServing => format!(
                " its {} rate",
                if self.uncalibrated() {
                    "bench"
                } else {
                    "modelled"
                }
            ),
            Input::LinkRate => format!(" its modelled {:.1} GB/s", self.params.gather_gbs),
            Input::CpuLayerFixed | Input::MissRate | Input::Context => String::new(),
        }
    }

    fn value(&self, input: Input, x: f64) -> String {
        format!("{}{}", Self::num(input, x), self.of(input))
    }

    fn subject(input: Input) -> &'static str {
        match input {
            Input::CpuServing => "the CPU side serves at",
            Input::CpuLayerFixed => "a layer-step with CPU work has a fixed cost in series of",
            Input::MissRate => "offload's miss rate is",
            Input::LinkRate => "the link gathers at",
            Input::Context => "the context is",
        }
    }

    fn describe(
        &self,
        input: Input,
        current: f64,
        range: [f64; 2],
        below: Option<&Flip>,
        above: Option<&Flip>,
    ) -> String {
        let choice = self
            .contenders
            .iter()
            .find(|c| c.kind() == self.choice)
            .map(|c| c.strategy.to_string())
            .unwrap_or_default();
        let now = format!("now {}", Self::num(input, current));
        let subject = Self::subject(input);
        match (below, above) {
            (None, None) => format!(
                "{input}: never flips within [{}, {}]{} ({now})",
                Self::num(input, range[0]),
                Self::num(input, range[1]),
                self.of(input)
            ),
            (Some(b), None) => format!(
                "{input}: {choice} stays ahead while {subject} >= {} ({} below; {now})",
                self.value(input, b.at),
                b.to
            ),
            (None, Some(a)) => format!(
                "{input}: {choice} stays ahead while {subject} <= {} ({} above; {now})",
                self.value(input, a.at),
                a.to
            ),
            (Some(b), Some(a)) => format!(
                "{input}: {choice} stays ahead while {subject} {} to {}{} ({} below, {} above; {now})",
                Self::num(input, b.at),
                Self::num(input, a.at),
                self.of(input),
                b.to,
                a.to
            ),
        }
    }

    /// Every input's break-even, and, where the decision is made from host inputs alone,
    /// the run that would settle it.
    pub fn report(&self, streams: usize, context: usize) -> Result<BreakEvens> {
        let inputs = Input::ALL
            .iter()
            .map(|&i| self.break_even(i))
            .collect::<Result<Vec<_>>>()?;
        let settling = if self.uncalibrated() {
            self.settling_run(&inputs, streams, context)
        } else {
            None
        };
        let mut text = String::new();
        for b in &inputs {
            let _ = writeln!(text, "- {}", b.text);
        }
        if self.dof == Some(0) {
            let _ = writeln!(text, "{ZERO_DOF_NOTE}");
        }
        if self.uncalibrated() {
            let _ = writeln!(
                text,
                "uncalibrated: made from host inputs alone (no run of the engine fitted). {}",
                settling
                    .as_ref()
                    .map(|s| s.text.as_str())
                    .unwrap_or("No input moves the choice within its range: a run would confirm it, not settle it.")
            );
        }
        Ok(BreakEvens {
            calibrated: !self.uncalibrated(),
            dof: self.dof,
            inputs,
            settling_run: settling,
            text,
        })
    }

    /// The run whose measurement best separates the choice from what takes over at the
    /// nearest flip (nearest in plausible moves of its input, [`Input::plausible_move`]):
    /// of the two, the one whose predicted tok/s moves most between now and the flip.
    fn settling_run(
        &self,
        inputs: &[BreakEven],
        streams: usize,
        context: usize,
    ) -> Option<SettlingRun> {
        let mut nearest: Option<(f64, Input, &Flip)> = None;
        for b in inputs {
            for f in b.below.iter().chain(b.above.iter()) {
                let d = (coord(b.input, f.at) - coord(b.input, b.current)).abs()
                    / b.input.plausible_move();
                if nearest.as_ref().is_none_or(|(n, _, _)| d < *n) {
                    nearest = Some((d, b.input, f));
                }
            }
        }
        let (moves, input, flip) = nearest?;
        if !moves.is_finite() {
            return None;
        }
        let per_stream = |t: f64| 1e6 / t;
        let candidates = [self.choice, flip.to.kind()];
        let (kind, now, then) = candidates
            .iter()
            .filter_map(|&k| {
                let now = self.step_us(k)?;
                let then = self.step_us_at(k, input, flip.at)?;
                Some((k, per_stream(now), per_stream(then)))
            })
            .max_by(|a, b| ((a.2 / a.1).ln().abs()).total_cmp(&(b.2 / b.1).ln().abs()))?;
        let strategy = self
            .contenders
            .iter()
            .find(|c| c.kind() == kind)
            .map(|c| c.strategy)?;
        let choice = self
            .contenders
            .iter()
            .find(|c| c.kind() == self.choice)
            .map(|c| c.strategy)?;
        let (keep, lose) = if then < now { (">=", "<") } else { ("<=", ">") };
        let text = format!(
            "The run that settles it: {strategy} at {streams} stream(s), context {context} (predicted {now:.1} tok/s per stream). At {keep} {then:.1} tok/s per stream {choice} stays the choice; at {lose} {then:.1}, {input} is past its break-even ({}) and {} takes over.",
            self.value(input, flip.at),
            flip.to
        );
        Some(SettlingRun {
            strategy,
            streams,
            context,
            input,
            predicted_tok_s: now,
            threshold_tok_s: then,
            text,
        })
    }
}

/// `x` in `input`'s search coordinate (its log for log inputs).
fn coord(input: Input, x: f64) -> f64 {
    if input.log_scale() {
        x.max(f64::MIN_POSITIVE).ln()
    } else {
        x
    }
}

/// The value of `input` at search coordinate `u`.
fn uncoord(input: Input, u: f64) -> f64 {
    if input.log_scale() {
        u.exp()
    } else {
        u
    }
}

/// Three significant digits, without trailing noise.
fn sig(x: f64) -> String {
    if x >= 10.0 {
        format!("{x:.1}")
    } else if x >= 0.1 {
        format!("{x:.2}")
    } else {
        format!("{x:.3}")
    }
}

/// The boundary between `a` (where `ahead` holds) and `b` (where it does not), by
/// bisection.
fn refine(ahead: &dyn Fn(f64) -> bool, mut a: f64, mut b: f64) -> f64 {
    for _ in 0..BISECTION_STEPS {
        let m = 0.5 * (a + b);
        if ahead(m) {
            a = m;
        } else {
            b = m;
        }
    }
    b
}

/// Where the choice flips, and to what.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Flip {
    /// The input's value at the flip, in its unit.
    pub at: f64,
    /// The strategy that takes over beyond it.
    pub to: Strategy,
}

/// One input's break-even.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct BreakEven {
    /// The input.
    pub input: Input,
    /// Its current value: a multiple for rates (1 = as modelled), us for the fixed cost,
    /// a share for the miss rate, tokens for the context.
    pub current: f64,
    /// The range searched, in the same unit.
    pub range: [f64; 2],
    /// The first flip below the current value, if any within the range.
    pub below: Option<Flip>,
    /// The first flip above it, if any within the range.
    pub above: Option<Flip>,
    /// The sentence.
    pub text: String,
}

/// The one run that would settle an uncalibrated decision.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SettlingRun {
    /// The strategy to run.
    pub strategy: Strategy,
    /// At these streams.
    pub streams: usize,
    /// At this context, in tokens.
    pub context: usize,
    /// The input its measurement pins down.
    pub input: Input,
    /// Its predicted decode tok/s per stream now.
    pub predicted_tok_s: f64,
    /// Its decode tok/s per stream at the input's break-even: a measurement on the other
    /// side of it flips the choice.
    pub threshold_tok_s: f64,
    /// The sentence.
    pub text: String,
}

/// Every break-even of a decision.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct BreakEvens {
    /// False where the parameters are a host spec's (no run fitted).
    pub calibrated: bool,
    /// Residual degrees of freedom of the fit (`None` from host inputs alone; 0: fitted to
    /// runs, but with as many terms as runs, so its standard errors are undefined).
    #[serde(default)]
    pub dof: Option<usize>,
    /// One per input, in [`Input::ALL`] order.
    pub inputs: Vec<BreakEven>,
    /// Where uncalibrated, the run that would settle the choice (none where no input flips
    /// it).
    pub settling_run: Option<SettlingRun>,
    /// Everything as text, one line each.
    pub text: String,
}

impl BreakEvens {
    /// Everything on one line (a server's start log).
    pub fn one_line(&self) -> String {
        let mut parts: Vec<String> = self.inputs.iter().map(|b| b.text.clone()).collect();
        if self.dof == Some(0) {
            parts.push(ZERO_DOF_NOTE.to_string());
        }
        if !self.calibrated {
            parts.push(format!(
                "uncalibrated (host inputs alone){}",
                self.settling_run
                    .as_ref()
                    .map(|s| format!(": {}", s.text))
                    .unwrap_or_default()
            ));
        }
        parts.join("; ")
    }
}

/// The break-evens of `pred`'s decision `choice` (its prediction made for `model` with
/// `perf` under `config`).
pub fn break_evens(
    model: &ModelSpec,
    perf: &PerfModel,
    config: &PredictConfig,
    pred: &Prediction,
    choice: StrategyKind,
) -> Result<BreakEvens> {
    Scenario::new(model, perf, config, pred, choice)?.report(config.streams, config.context)
}

// ---- Reconciling measured runs (`ft explain --observations`) ----

/// What one input must be for the prediction of a measured run to equal the measurement.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct InputFit {
    /// The input.
    pub input: Input,
    /// The value that reconciles the run, in the input's unit; `None` where no value in
    /// its range does.
    pub value: Option<f64>,
    /// How far that is from the current value, in plausible moves of the input
    /// (`|change| / plausible move`: 1 is an ordinary error of a bench-only input, 5 is not
    /// a bench's error but a mechanism of its own); infinite where none reconciles.
    pub moves: f64,
}

/// One measured run set against its bench-only prediction.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Reconciliation {
    /// The observation's row in its file.
    pub row: usize,
    /// Its label, if any.
    pub label: Option<String>,
    /// The strategy it ran.
    pub strategy: Strategy,
    /// Its streams.
    pub streams: usize,
    /// Its mean decode context, in tokens.
    pub context: usize,
    /// Measured tok/s per stream.
    pub measured_tok_s: f64,
    /// Predicted decode tok/s per stream.
    pub predicted_tok_s: f64,
    /// `measured / predicted - 1`.
    pub gap: f64,
    /// True where the gap is inside the run-to-run noise (nothing to reconcile).
    pub within_noise: bool,
    /// One per reconciling input (the context is the run's own and is not one).
    pub fits: Vec<InputFit>,
    /// The most plausible input that reconciles it.
    pub best: Option<Input>,
    /// The sentence.
    pub text: String,
}

/// The mechanism that separates a case's measurements from its bench-only predictions.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CaseExplanation {
    /// One per run.
    pub runs: Vec<Reconciliation>,
    /// The inputs ranked over the runs that need reconciling, first the one accounting for
    /// most of their gaps (log of measured over predicted, summed over the runs it
    /// reconciles), ties by plausibility: (input, runs it reconciles, median moves).
    pub ranking: Vec<(Input, usize, f64)>,
    /// The verdict.
    pub verdict: String,
    /// Everything as text.
    pub text: String,
}

/// The inputs a run can be reconciled by (the context is the run's own).
const RECONCILING: [Input; 4] = [
    Input::CpuServing,
    Input::CpuLayerFixed,
    Input::MissRate,
    Input::LinkRate,
];

fn observed_strategy(o: &crate::observe::ObservedStrategy) -> (Strategy, PlacementPolicy) {
    use crate::observe::ObservedStrategy as O;
    match *o {
        O::Offload => (Strategy::Offload, PlacementPolicy::cached(1.0)),
        O::Hybrid { fetch_fraction } => (
            Strategy::Hybrid {
                fetch: FetchFraction::Fixed(fetch_fraction),
            },
            PlacementPolicy::cached(fetch_fraction),
        ),
        O::Cpu => (Strategy::Cpu, PlacementPolicy::cached(0.0)),
        O::Resident => (Strategy::Resident, PlacementPolicy::cached(1.0)),
        O::LayerSplit { cpu_layers } => (
            Strategy::LayerSplit {
                cpu_layers: CpuLayers::Fixed(cpu_layers),
            },
            PlacementPolicy {
                cpu_layers,
                rest: LayerPlacement::Resident,
            },
        ),
        O::LayerSplitCached { cpu_layers } => (
            Strategy::LayerSplitCached {
                cpu_layers: CpuLayers::Fixed(cpu_layers),
            },
            PlacementPolicy {
                cpu_layers,
                rest: LayerPlacement::Cached {
                    fetch_fraction: 1.0,
                },
            },
        ),
    }
}

impl Scenario {
    /// A scenario of one measured run: its strategy alone, on its cache, streams and
    /// context, the routing and counting steps of `config`.
    pub fn of_observation(
        model: &ModelSpec,
        perf: &PerfModel,
        config: &PredictConfig,
        o: &crate::observe::Observation,
    ) -> Result<Scenario> {
        use crate::observe::ObservedCache;
        let p = &perf.params;
        let (strategy, placement) = observed_strategy(&o.strategy);
        if let crate::strategy::Strategy::LayerSplit {
            cpu_layers: CpuLayers::Fixed(n),
        }
        | crate::strategy::Strategy::LayerSplitCached {
            cpu_layers: CpuLayers::Fixed(n),
        } = strategy
        {
            if n > model.geometry.moe_layers {
                return Err(ModelError::invalid(
                    format!("row {}: cpu_layers", o.row),
                    format!(
                        "{n} is more than the model's {} MoE layers",
                        model.geometry.moe_layers
                    ),
                ));
            }
        }
        let total = model.geometry.total_experts();
        let slot_bytes = p.layout.bytes_per_gpu(model.expert_bytes());
        let slots = match o.cache {
            Some(ObservedCache::Slots(n)) => {
                crate::cache::CacheSize::Slots(n).slots(slot_bytes, total)?
            }
            Some(ObservedCache::Gib(g)) => {
                crate::cache::CacheSize::GiB(g).slots(slot_bytes, total)?
            }
            Some(ObservedCache::Residency(r)) => {
                ((r * total as f64).round() as usize).clamp(1, total as usize)
            }
            None => super::predict::default_cache_slots(model, p, o.streams, o.context),
        };
        let slots = config
            .cache_options
            .fit_slots(slots, model.geometry.moe_layers)?;
        let mut src = routing::resolve(&config.routing, &model.geometry, config.seed)?;
        let samples = sample_traffic_gpus(
            src.as_mut(),
            &SampleRun {
                kind: strategy.kind(),
                placement,
                cache: &config.cache_options,
                slots,
                warmup_steps: config.warmup_steps,
                steps: config.steps,
                streams: o.streams,
            },
            &p.layout,
        )?;
        Ok(Scenario {
            params: p.clone(),
            shape: StepShape::new(model, o.streams, o.context),
            base: Knobs {
                cpu_speed: 1.0,
                cpu_layer_fixed_us: p.overhead.hybrid_us,
                miss_rate: samples.miss_rate(),
                link_speed: 1.0,
                context: o.context as f64,
            },
            choice: strategy.kind(),
            contenders: vec![Contender {
                strategy,
                runs: vec![Run::of(&samples)],
            }],
            dof: perf.dof,
        })
    }

    /// The value of `input` at which the choice's predicted tok/s per stream is `target`:
    /// the crossing nearest the current value (in plausible moves) within the range.
    pub fn solve_for(&self, input: Input, target_tok_s: f64) -> Option<f64> {
        let x0 = self.current(input);
        let [lo, hi] = self.range(input);
        if input == Input::MissRate && self.base.miss_rate <= 0.0 {
            return None;
        }
        let g = |u: f64| {
            let x = uncoord(input, u);
            self.step_us_at(self.choice, input, x)
                .map(|t| (1e6 / t / target_tok_s).ln())
                .unwrap_or(f64::NAN)
        };
        let u0 = coord(input, x0);
        let g0 = g(u0);
        if g0 == 0.0 {
            return Some(x0);
        }
        let mut best: Option<f64> = None;
        for end in [lo, hi] {
            let u1 = coord(input, end);
            if (u1 - u0).abs() < 1e-12 {
                continue;
            }
            let mut prev = u0;
            for i in 1..=SCAN_POINTS {
                let u = u0 + (u1 - u0) * i as f64 / SCAN_POINTS as f64;
                let gu = g(u);
                if gu.is_finite() && gu.signum() != g0.signum() {
                    let root = refine(&|v| g(v).signum() == g0.signum(), prev, u);
                    let x = uncoord(input, root);
                    let closer =
                        best.is_none_or(|b| (root - u0).abs() < (coord(input, b) - u0).abs());
                    if closer {
                        best = Some(x);
                    }
                    break;
                }
                prev = u;
            }
        }
        best
    }

    fn moves(&self, input: Input, x: f64) -> f64 {
        (coord(input, x) - coord(input, self.current(input))).abs() / input.plausible_move()
    }
}

/// Set each measured run against its bench-only prediction and solve, for each input
/// alone, the value that reconciles them; rank the inputs by how plausible those values are
/// over all runs.
pub fn reconcile(
    model: &ModelSpec,
    perf: &PerfModel,
    config: &PredictConfig,
    observations: &[crate::observe::Observation],
) -> Result<CaseExplanation> {
    let mut runs = Vec::new();
    for o in observations {
        let s = Scenario::of_observation(model, perf, config, o)?;
        let step = s.step_us(s.choice).unwrap_or(f64::INFINITY);
        let predicted = 1e6 / step;
        let gap = o.tok_s_per_stream / predicted - 1.0;
        let noise = 2.0 * perf.params.run_noise_rel;
        let within_noise = gap.abs() <= noise;
        let fits: Vec<InputFit> = RECONCILING
            .iter()
            .map(|&input| {
                let value = if within_noise {
                    Some(s.current(input))
                } else {
                    s.solve_for(input, o.tok_s_per_stream)
                };
                InputFit {
                    input,
                    value,
                    moves: value.map(|x| s.moves(input, x)).unwrap_or(f64::INFINITY),
                }
            })
            .collect();
        let best = fits
            .iter()
            .filter(|f| f.value.is_some())
            .min_by(|a, b| a.moves.total_cmp(&b.moves))
            .map(|f| f.input);
        let strategy = s.contenders[0].strategy;
        let mut text = format!(
            "row {}{}: {strategy} at {} stream(s), context {}: measured {:.1} tok/s per stream, predicted {:.1} ({:+.0}%)",
            o.row,
            o.label.as_ref().map(|l| format!(" ({l})")).unwrap_or_default(),
            o.streams,
            o.context,
            o.tok_s_per_stream,
            predicted,
            100.0 * gap
        );
        if o.measure != crate::observe::Measure::Decode {
            text.push_str(" [measured with prefill; the prediction is decode only]");
        }
        if within_noise {
            let _ = write!(
                text,
                ": within the run-to-run noise ({:.0}%)",
                100.0 * noise
            );
        } else {
            let parts: Vec<String> = fits
                .iter()
                .map(|f| match f.value {
                    Some(x) => format!(
                        "{} {}{} ({:.1} moves)",
                        f.input,
                        Scenario::num(f.input, x),
                        s.of(f.input),
                        f.moves
                    ),
                    None => format!("{} cannot", f.input),
                })
                .collect();
            let _ = write!(text, ". Reconciled alone by: {}", parts.join("; "));
        }
        runs.push(Reconciliation {
            row: o.row,
            label: o.label.clone(),
            strategy,
            streams: o.streams,
            context: o.context,
            measured_tok_s: o.tok_s_per_stream,
            predicted_tok_s: predicted,
            gap,
            within_noise,
            fits,
            best,
            text,
        });
    }
    let off: Vec<&Reconciliation> = runs.iter().filter(|r| !r.within_noise).collect();
    // An input ranks by how much of the runs' gaps it accounts for (the sum of
    // |ln(measured / predicted)| over the runs it reconciles: one run 30 times off weighs
    // more than several a few percent off), then by the median plausible moves it needs.
    let mut weighted: Vec<(Input, usize, f64, f64)> = RECONCILING
        .iter()
        .map(|&input| {
            let fits: Vec<(f64, f64)> = off
                .iter()
                .filter_map(|r| {
                    r.fits
                        .iter()
                        .find(|f| f.input == input && f.value.is_some())
                        .map(|f| (f.moves, (1.0 + r.gap).ln().abs()))
                })
                .collect();
            let mut m: Vec<f64> = fits.iter().map(|f| f.0).collect();
            m.sort_by(f64::total_cmp);
            let median = if m.is_empty() {
                f64::INFINITY
            } else {
                m[m.len() / 2]
            };
            let explained: f64 = fits.iter().map(|f| f.1).sum();
            (input, m.len(), median, explained)
        })
        .collect();
    weighted.sort_by(|a, b| b.3.total_cmp(&a.3).then(a.2.total_cmp(&b.2)));
    let ranking: Vec<(Input, usize, f64)> =
        weighted.iter().map(|&(i, n, m, _)| (i, n, m)).collect();
    let verdict = match (off.is_empty(), ranking.first()) {
        (true, _) => "Every run agrees with its bench-only prediction within the noise: the bench's view of the engine holds here.".to_string(),
        (false, Some(&(input, n, median))) if n > 0 => {
            let worst = off
                .iter()
                .filter_map(|r| {
                    r.fits
                        .iter()
                        .find(|f| f.input == input)
                        .and_then(|f| f.value.map(|v| (r, v, f.moves)))
                })
                .max_by(|a, b| a.2.total_cmp(&b.2));
            let example = worst
                .map(|(r, v, _)| {
                    format!(
                        "the measured {} at {} stream(s) needs {} {}",
                        r.strategy,
                        r.streams,
                        match input {
                            Input::CpuServing => "the CPU side at",
                            Input::CpuLayerFixed => "a fixed cost per layer-step with CPU work of",
                            Input::MissRate => "offload's miss rate at",
                            Input::LinkRate => "the link at",
                            Input::Context => "a context of",
                        },
                        format_args!("{}{}", Scenario::num(input, v), match input {
                            Input::CpuServing => " its bench rate",
                            Input::LinkRate => " its modelled rate",
                            _ => "",
                        })
                    )
                })
                .unwrap_or_default();
            let mechanism = match input {
                Input::CpuServing => "serving capacity of the CPU side, not bandwidth, decides here",
                Input::CpuLayerFixed => "fixed costs per layer-step, not bandwidth, decide here",
                Input::MissRate => "the cache's miss rate, not the bandwidths, decides here",
                Input::LinkRate => "the link's effective rate decides here",
                Input::Context => "the context decides here",
            };
            format!(
                "{example}: {mechanism} ({input} reconciles {n} of {} runs off their prediction, median {median:.1} plausible moves; a move is what a bench's input is ordinarily off by).",
                off.len()
            )
        }
        _ => "No single input reconciles the runs off their prediction within its range: more than one mechanism is at work.".to_string(),
    };
    let mut text = String::new();
    for r in &runs {
        let _ = writeln!(text, "- {}", r.text);
    }
    let _ = writeln!(text, "Ranking (runs reconciled, median plausible moves):");
    for (i, (input, n, m)) in ranking.iter().enumerate() {
        let _ = writeln!(
            text,
            "  {}. {input}: {n} of {} runs, {m:.1} moves",
            i + 1,
            off.len()
        );
    }
    let _ = writeln!(text, "{verdict}");
    Ok(CaseExplanation {
        runs,
        ranking,
        verdict,
        text,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::host::HostSpec;
    use crate::perf::decide;
    use crate::perf::predict::evaluate;
    use crate::perf::predict::predict;

    fn quick(streams: usize) -> PredictConfig {
        PredictConfig {
            streams,
            warmup_steps: 30,
            steps: 40,
            ..PredictConfig::default()
        }
    }

    fn field(config: &PredictConfig) -> (ModelSpec, PerfModel, Prediction, Scenario) {
        let model = ModelSpec::preset("qwen3.8-flash-next").unwrap();
        let perf = PerfModel::from_host(&HostSpec::field_report()).unwrap();
        let pred = predict(&model, &perf, config).unwrap();
        let d = decide(&pred);
        let s = Scenario::new(&model, &perf, config, &pred, d.kind).unwrap();
        (model, perf, pred, s)
    }

    #[test]
    fn the_scenario_reproduces_the_prediction() {
        let config = PredictConfig {
            layer_split: Some(CpuLayers::Auto),
            ..quick(2)
        };
        let (_, _, pred, s) = field(&config);
        for sp in pred.strategies.iter().filter(|s| ranked(s)) {
            let t = s.step_us(sp.kind).unwrap();
            assert!(
                (t - sp.step_us).abs() <= 1e-9 * sp.step_us,
                "{}: {t} against {}",
                sp.kind,
                sp.step_us
            );
        }
    }

    /// The prediction's own counting runs give the break-evens that counting them again
    /// gives (the slow reference: a prediction read back from JSON keeps no runs), with
    /// the fraction searched and fixed, layer split in.
    #[test]
    fn break_evens_from_the_predictions_runs_equal_counting_again() {
        let model = ModelSpec::preset("qwen3.8-flash-next").unwrap();
        let perf = PerfModel::from_host(&HostSpec::field_report()).unwrap();
        for hybrid_fetch in [FetchFraction::Auto, FetchFraction::Fixed(0.4)] {
            let config = PredictConfig {
                layer_split: Some(CpuLayers::Auto),
                hybrid_fetch,
                ..quick(2)
            };
            let pred = predict(&model, &perf, &config).unwrap();
            assert!(pred.traffic.get().is_some());
            let cold: Prediction =
                serde_json::from_value(serde_json::to_value(&pred).unwrap()).unwrap();
            assert!(cold.traffic.get().is_none());
            let d = decide(&pred);
            let kept = break_evens(&model, &perf, &config, &pred, d.kind).unwrap();
            let again = break_evens(&model, &perf, &config, &cold, d.kind).unwrap();
            assert_eq!(kept, again, "{hybrid_fetch:?}");
            // Another configuration than the prediction's counts for itself.
            let other = PredictConfig {
                seed: Some(7),
                ..config.clone()
            };
            let s = Scenario::new(&model, &perf, &other, &pred, d.kind).unwrap();
            let c = Scenario::new(&model, &perf, &other, &cold, d.kind).unwrap();
            assert_eq!(s.report(2, 1024).unwrap(), c.report(2, 1024).unwrap());
        }
    }

    #[test]
    fn the_histogram_is_the_samples_evaluated_one_by_one() {
        let model = ModelSpec::preset("qwen3.8-flash-next").unwrap();
        let perf = PerfModel::from_host(&HostSpec::field_report()).unwrap();
        let config = quick(3);
        let mut src = routing::resolve(&config.routing, &model.geometry, None).unwrap();
        let samples = sample_traffic_gpus(
            src.as_mut(),
            &SampleRun {
                kind: StrategyKind::Hybrid,
                placement: PlacementPolicy::cached(0.4),
                cache: &config.cache_options,
                slots: 2000,
                warmup_steps: 20,
                steps: 30,
                streams: 3,
            },
            &perf.params.layout,
        )
        .unwrap();
        let run = Run::of(&samples);
        assert!(run.entries.len() < samples.counts.len());
        let shape = StepShape::new(&model, 3, 1024);
        let slow = evaluate(&perf.params, &shape, &samples).step_us;
        let fast = run.step_us(&perf.params, &shape, 1.0);
        assert!((fast - slow).abs() <= 1e-9 * slow, "{fast} against {slow}");
        // Scaling misses by 1 is the identity; by 0 every expert hits.
        let c = samples.counts[0];
        assert_eq!(scale_misses(&c, 1.0), c);
        let none = scale_misses(&c, 0.0);
        assert_eq!(none.fetched + none.cpu, 0.0);
        assert_eq!(none.hits, c.hits + c.fetched + c.cpu);
        let all = scale_misses(&c, 1e9);
        assert_eq!(all.hits, 0.0);
        assert!((all.fetched / all.cpu - c.fetched / c.cpu).abs() < 1e-9);
    }

    /// The fast search against a brute-force scan of the same advantage: the flip found lies
    /// within one step of the scan's first point past it, and the advantage changes sign
    /// there.
    #[test]
    fn break_evens_agree_with_a_brute_force_scan() {
        let (_, _, _, s) = field(&quick(1));
        let points = 400;
        let mut flips = 0;
        for input in Input::ALL {
            let [lo, hi] = s.range(input);
            for end in [lo, hi] {
                let fast = s.find_flip(input, end).unwrap();
                let slow = s.scan_flip(input, end, points);
                let u0 = coord(input, s.current(input));
                let step = (coord(input, end) - u0).abs() / points as f64;
                match (&fast, slow) {
                    (None, None) => {}
                    (Some(f), Some(x)) => {
                        flips += 1;
                        let (uf, ux) = (coord(input, f.at), coord(input, x));
                        assert!(
                            (uf - ux).abs() <= step * 1.0001,
                            "{input} towards {end}: search {} against scan {x}",
                            f.at
                        );
                        let eps = 1e-6 * (1.0 + uf.abs());
                        let before = uncoord(input, uf - eps * (ux - u0).signum());
                        assert!(s.ahead(input, before), "{input}");
                        assert!(!s.ahead(input, f.at), "{input}");
                    }
                    _ => panic!("{input} towards {end}: search {fast:?}, scan {slow:?}"),
                }
            }
        }
        assert!(
            flips >= 2,
            "the field report's choice flips on several inputs"
        );
    }

    #[test]
    fn hybrid_on_the_field_report_flips_to_offload_on_a_slow_cpu() {
        let (_, _, pred, s) = field(&quick(1));
        assert_eq!(decide(&pred).kind, StrategyKind::Hybrid);
        let b = s.break_even(Input::CpuServing).unwrap();
        let below = b.below.expect("a slow enough CPU side loses to offload");
        assert!(below.at > CPU_SPEED_MIN && below.at < 1.0, "{}", below.at);
        assert_eq!(below.to.kind(), StrategyKind::Offload);
        assert!(
            b.text.contains("stays ahead while the CPU side serves at"),
            "{}",
            b.text
        );
        assert!(b.text.contains("its bench rate"), "{}", b.text);
        // A fixed cost in series on every layer with CPU work only hurts hybrid.
        let f = s.break_even(Input::CpuLayerFixed).unwrap();
        assert!(f.above.is_some() && f.below.is_none(), "{}", f.text);
        // Fewer misses favour offload, which pays the link only on misses.
        let m = s.break_even(Input::MissRate).unwrap();
        assert!(m.below.is_some(), "{}", m.text);
        assert!(m.below.unwrap().at < pred.offload_miss_rate);
    }

    #[test]
    fn a_host_spec_decision_is_uncalibrated_and_names_its_settling_run() {
        let config = quick(1);
        let (_, _, _, s) = field(&config);
        let r = s.report(1, 1024).unwrap();
        assert!(!r.calibrated);
        assert_eq!(r.inputs.len(), Input::ALL.len());
        let run = r.settling_run.as_ref().expect("a flip exists");
        assert!(
            matches!(
                run.strategy.kind(),
                StrategyKind::Hybrid | StrategyKind::Offload
            ),
            "{}",
            run.text
        );
        assert!(run.threshold_tok_s > 0.0 && run.threshold_tok_s != run.predicted_tok_s);
        assert!(r.text.contains("uncalibrated"), "{}", r.text);
    }

    #[test]
    fn a_choice_with_no_rival_never_flips() {
        let model = ModelSpec::preset("qwen3.8-flash-next").unwrap();
        let perf = PerfModel::from_host(&HostSpec::field_report()).unwrap();
        let config = PredictConfig {
            hybrid_fetch: FetchFraction::Fixed(0.3),
            ..quick(1)
        };
        let mut pred = predict(&model, &perf, &config).unwrap();
        for s in &mut pred.strategies {
            s.feasible = s.kind == StrategyKind::Hybrid;
        }
        let s = Scenario::new(&model, &perf, &config, &pred, StrategyKind::Hybrid).unwrap();
        let b = s.break_even(Input::CpuServing).unwrap();
        assert!(b.below.is_none() && b.above.is_none());
        assert!(b.text.contains("never flips within"), "{}", b.text);
        assert!(Scenario::new(&model, &perf, &config, &pred, StrategyKind::Offload).is_err());
    }

    #[test]
    fn a_slow_serving_cpu_is_found_by_reconciling_its_runs() {
        // Runs made with the CPU side at 0.1x its bench rate: what the model would predict
        // there is what they measure. Reconciling them against the bench-only prediction
        // must name the CPU side and recover its speed.
        let model = ModelSpec::preset("qwen3.8-flash-next").unwrap();
        let perf = PerfModel::from_host(&HostSpec::field_report()).unwrap();
        let slow = perf
            .at_cpu_speed(
                0.1,
                &crate::perf::CpuSpeedSource::Given {
                    flag: "test".into(),
                },
            )
            .unwrap();
        let config = quick(1);
        let csv = "strategy,fetch_fraction,streams,output_tokens,context,cache_slots,tok_s\nhybrid,0.3,1,256,1024,7000,1\noffload,,1,256,1024,7000,1\n";
        let mut obs = crate::observe::parse_observations(csv, "test.csv").unwrap();
        for o in &mut obs {
            let s = Scenario::of_observation(&model, &slow, &config, o).unwrap();
            o.tok_s_per_stream = 1e6 / s.step_us(s.choice).unwrap();
        }
        let case = reconcile(&model, &perf, &config, &obs).unwrap();
        let hybrid = &case.runs[0];
        assert!(hybrid.gap < -0.2, "{}", hybrid.text);
        let cpu = hybrid
            .fits
            .iter()
            .find(|f| f.input == Input::CpuServing)
            .unwrap();
        let v = cpu.value.expect("the CPU speed reconciles hybrid");
        assert!((v - 0.1).abs() < 0.005, "{v}");
        // Offload does not use the CPU side: its run agrees with the bench.
        assert!(case.runs[1].within_noise, "{}", case.runs[1].text);
        assert_eq!(case.ranking[0].0, Input::CpuServing, "{}", case.text);
        assert!(
            case.verdict.contains("serving capacity"),
            "{}",
            case.verdict
        );
    }
}
