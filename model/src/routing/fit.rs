//! Fitting a [`RoutingProcess`] to published routing statistics or to a trace.
//!
//! Engines publish a handful of numbers about their routing (a cache's hit rate at a few
//! sizes, a hot list's coverage, how the union of experts grows with streams); a trace gives
//! the same numbers measured. The process's knobs are chosen so that [`super::stats`]
//! computed on the process matches them: a least-squares fit (argmin's Nelder-Mead, which
//! needs no derivative: the statistics come from a simulation) over the knobs named in
//! [`FitPoints::fit`], each moved in a space where every value is valid (logit for a
//! probability, log for a positive scale). Every evaluation routes the same seed, so the
//! objective is deterministic (common random numbers) and the residual of each point is
//! reported with the result.

use argmin::core::{CostFunction, Executor, State};
use argmin::solver::neldermead::NelderMead;
use serde::{Deserialize, Serialize};
use std::path::Path;

use super::stats::{hit_rate, hot_coverage, record, stats_of_steps, StatsConfig};
use super::{RoutingProcess, StepRouting, SyntheticRouting};
use crate::cache::{CachePolicy, CacheTopology};
use crate::error::{ModelError, Result};
use crate::geometry::MoeGeometry;

/// Iterations of the Nelder-Mead search before it stops (each costs one evaluation or a
/// few; enough for three or four knobs to settle to a thousandth).
pub const MAX_FIT_ITERS: u64 = 120;

/// Standard deviation of the simplex's costs below which the search stops (squared
/// fractions: residuals of about 0.1 points).
pub const FIT_SD_TOLERANCE: f64 = 1e-7;

/// Initial simplex step in the transformed space (logit or log units): large enough to
/// leave a flat region of the simulated objective.
pub const FIT_INITIAL_STEP: f64 = 0.4;

/// One published (or measured) statistic to match.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "kebab-case", deny_unknown_fields)]
pub enum Target {
    /// The hit rate (0 to 1) of offload with a cache of `slots_per_layer` slots per layer
    /// (a global pool holds that many times the layer count).
    HitRate {
        /// Slot sharing between layers (default: per layer, as llama.cpp counts).
        #[serde(default = "per_layer")]
        topology: CacheTopology,
        /// Slots per layer.
        slots_per_layer: usize,
        /// Replacement policy (default LRU).
        #[serde(default)]
        policy: CachePolicy,
        /// The hit rate to match, 0 to 1.
        value: f64,
    },
    /// The coverage (0 to 1) of a hot list of `k` experts per layer learned on one half of
    /// the steps, scored on the other.
    HotCoverage {
        /// Experts per layer in the list.
        k: usize,
        /// The coverage to match, 0 to 1.
        value: f64,
    },
    /// Mean distinct experts per layer-step with `streams` concurrent streams.
    Union {
        /// Concurrent streams.
        streams: usize,
        /// Distinct experts per layer-step to match.
        value: f64,
    },
}

fn per_layer() -> CacheTopology {
    CacheTopology::PerLayer
}

impl Target {
    /// A short label of the point (`per-layer lru 64`, `hot 32`, `union 8`).
    pub fn label(&self) -> String {
        match self {
            Target::HitRate {
                topology,
                slots_per_layer,
                policy,
                ..
            } => format!("{topology} {} {slots_per_layer}", policy.name()),
            Target::HotCoverage { k, .. } => format!("hot {k}"),
            Target::Union { streams, .. } => format!("union {streams}"),
        }
    }

    /// The value to match.
    pub fn value(&self) -> f64 {
        match self {
            Target::HitRate { value, .. }
            | Target::HotCoverage { value, .. }
            | Target::Union { value, .. } => *value,
        }
    }

    /// The scale a residual is divided by so that every point counts in fractions: 1 for
    /// rates, `streams x top_k` for a union.
    fn scale(&self, g: &MoeGeometry) -> f64 {
        match self {
            Target::Union { streams, .. } => (*streams * g.top_k) as f64,
            _ => 1.0,
        }
    }
}

/// A knob of the process the fit may move.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum FitParam {
    /// `zipf` (and `edge_zipf` in proportion).
    Zipf,
    /// `locality` (and `edge_locality` in proportion).
    Locality,
    /// `locality_tokens`.
    LocalityTokens,
    /// `locality_tail`.
    LocalityTail,
    /// `reuse` (and `edge_reuse` in proportion).
    Reuse,
    /// `layer_correlation`.
    LayerCorrelation,
}

/// Smallest value a log-transformed knob may reach (keeps `zipf` = 0 reachable in effect).
const LOG_FLOOR: f64 = 1e-4;
/// Largest probability a logit-transformed knob may reach (1 would be an infinite logit).
const PROB_CEIL: f64 = 0.999;

impl FitParam {
    /// The knob's TOML field name.
    pub fn field(self) -> &'static str {
        match self {
            FitParam::Zipf => "zipf",
            FitParam::Locality => "locality",
            FitParam::LocalityTokens => "locality_tokens",
            FitParam::LocalityTail => "locality_tail",
            FitParam::Reuse => "reuse",
            FitParam::LayerCorrelation => "layer_correlation",
        }
    }

    fn is_probability(self) -> bool {
        matches!(
            self,
            FitParam::Locality | FitParam::Reuse | FitParam::LayerCorrelation
        )
    }

    /// The knob's value in a process.
    pub fn get(self, p: &RoutingProcess) -> f64 {
        match self {
            FitParam::Zipf => p.zipf,
            FitParam::Locality => p.locality,
            FitParam::LocalityTokens => p.locality_tokens,
            FitParam::LocalityTail => p.locality_tail,
            FitParam::Reuse => p.reuse,
            FitParam::LayerCorrelation => p.layer_correlation,
        }
    }

    /// Set the knob, keeping the edge layers' value in the start's proportion to it.
    fn set(self, p: &mut RoutingProcess, start: &RoutingProcess, v: f64) {
        let ratio = |edge: f64, interior: f64| {
            if interior > 0.0 {
                edge / interior
            } else {
                1.0
            }
        };
        match self {
            FitParam::Zipf => {
                p.zipf = v;
                p.edge_zipf = v * ratio(start.edge_zipf, start.zipf);
            }
            FitParam::Locality => {
                p.locality = v;
                p.edge_locality = (v * ratio(start.edge_locality, start.locality)).min(1.0);
            }
            FitParam::LocalityTokens => p.locality_tokens = v,
            FitParam::LocalityTail => p.locality_tail = v,
            FitParam::Reuse => {
                p.reuse = v;
                p.edge_reuse = (v * ratio(start.edge_reuse, start.reuse)).min(1.0);
            }
            FitParam::LayerCorrelation => p.layer_correlation = v,
        }
    }

    fn free_of(self, v: f64) -> f64 {
        if self.is_probability() {
            let q = v.clamp(1.0 - PROB_CEIL, PROB_CEIL);
            (q / (1.0 - q)).ln()
        } else {
            v.max(LOG_FLOOR).ln()
        }
    }

    fn value_of(self, x: f64) -> f64 {
        if self.is_probability() {
            (1.0 / (1.0 + (-x).exp())).clamp(0.0, PROB_CEIL)
        } else {
            x.exp().max(LOG_FLOOR)
        }
    }
}

/// The points of a fit and how to simulate them (a TOML file: `ft routing fit --points`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FitPoints {
    /// Where the points come from (free text, printed with the result).
    #[serde(default)]
    pub source: String,
    /// Routed experts per layer of the measured model.
    pub experts: usize,
    /// Experts per token per layer.
    pub top_k: usize,
    /// MoE layers simulated (fewer than the model's is faster; the edge layers count).
    pub moe_layers: usize,
    /// The preset (or `.toml` process) the fit starts from; the knobs not fitted keep its
    /// values.
    #[serde(default = "default_start")]
    pub start: String,
    /// The knobs to fit (default: `zipf`, `locality`, `locality_tokens`).
    #[serde(default = "default_fit")]
    pub fit: Vec<FitParam>,
    /// Warm-up steps of each evaluation.
    #[serde(default = "default_warmup")]
    pub warmup_steps: usize,
    /// Measured steps of each evaluation.
    #[serde(default = "default_steps")]
    pub steps: usize,
    /// The statistics to match.
    #[serde(rename = "point")]
    pub points: Vec<Target>,
}

fn default_start() -> String {
    "typical".into()
}
fn default_fit() -> Vec<FitParam> {
    vec![FitParam::Zipf, FitParam::Locality, FitParam::LocalityTokens]
}
fn default_warmup() -> usize {
    200
}
fn default_steps() -> usize {
    1000
}

impl FitPoints {
    /// Parse a points file; `origin` names it in errors.
    pub fn from_toml_str(text: &str, origin: &str) -> Result<Self> {
        crate::error::parse_toml(text, origin, Self::validate)
    }

    /// Load a points file.
    pub fn from_toml_file(path: &Path) -> Result<Self> {
        let text = crate::error::read_text(path)?;
        Self::from_toml_str(&text, &path.display().to_string())
    }

    /// The geometry simulated (hidden and intermediate do not matter to routing).
    pub fn geometry(&self) -> MoeGeometry {
        MoeGeometry {
            hidden: 64,
            intermediate: 64,
            experts: self.experts,
            top_k: self.top_k,
            moe_layers: self.moe_layers,
            shared_experts: 0,
        }
    }

    /// Check sizes and values; errors name the field.
    pub fn validate(&self) -> Result<()> {
        if self.experts == 0 || self.top_k == 0 || self.top_k > self.experts {
            return Err(ModelError::invalid(
                "points.top_k",
                format!(
                    "top_k = {} with {} experts: need 1 <= top_k <= experts",
                    self.top_k, self.experts
                ),
            ));
        }
        if self.moe_layers == 0 {
            return Err(ModelError::invalid(
                "points.moe_layers",
                "must be at least 1",
            ));
        }
        if self.points.is_empty() {
            return Err(ModelError::invalid("points.point", "no point to fit"));
        }
        if self.fit.is_empty() {
            return Err(ModelError::invalid("points.fit", "no knob to fit"));
        }
        for (i, p) in self.points.iter().enumerate() {
            let at = format!("points.point[{i}]");
            let v = p.value();
            let bad_rate = !(0.0..=1.0).contains(&v);
            match p {
                Target::HitRate {
                    slots_per_layer, ..
                } if *slots_per_layer == 0 || *slots_per_layer > self.experts => {
                    return Err(ModelError::invalid(
                        at,
                        format!(
                            "slots_per_layer = {slots_per_layer} is outside 1..={}",
                            self.experts
                        ),
                    ));
                }
                Target::HotCoverage { k, .. } if *k == 0 || *k > self.experts => {
                    return Err(ModelError::invalid(
                        at,
                        format!("k = {k} is outside 1..={}", self.experts),
                    ));
                }
                Target::Union { streams, value } => {
                    if *streams == 0 || *streams > MAX_FIT_STREAMS {
                        return Err(ModelError::invalid(
                            at,
                            format!("streams = {streams} is outside 1..={MAX_FIT_STREAMS}"),
                        ));
                    }
                    let most = (*streams * self.top_k).min(self.experts) as f64;
                    if !(value.is_finite() && *value >= 1.0 && *value <= most) {
                        return Err(ModelError::invalid(
                            at,
                            format!("union value {value} is outside 1..={most}"),
                        ));
                    }
                }
                _ if bad_rate || v.is_nan() => {
                    return Err(ModelError::invalid(
                        at,
                        format!("value {v} is outside [0, 1]"),
                    ));
                }
                _ => {}
            }
        }
        self.stats_config().validate(&self.geometry())
    }

    /// The statistics configuration an evaluation runs (only what the points need).
    fn stats_config(&self) -> StatsConfig {
        let union_streams = self
            .points
            .iter()
            .filter_map(|p| match p {
                Target::Union { streams, .. } => Some(*streams),
                _ => None,
            })
            .max()
            .unwrap_or(1);
        StatsConfig {
            warmup_steps: self.warmup_steps,
            steps: self.steps,
            streams: 1,
            union_streams,
            per_layer_slots: Vec::new(),
            global_slots: Vec::new(),
            policies: Vec::new(),
            hot_k: Vec::new(),
            detail: false,
        }
    }
}

/// Most streams a union point may name (each evaluation routes that many streams).
pub const MAX_FIT_STREAMS: usize = 64;

/// One point's outcome.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PointFit {
    /// The point.
    pub label: String,
    /// Value to match.
    pub target: f64,
    /// The start process's value.
    pub start: f64,
    /// The fitted process's value.
    pub fitted: f64,
    /// `fitted - target` (in the point's unit: a fraction, or experts for a union).
    pub residual: f64,
}

/// The result of a fit.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FitReport {
    /// Where the points came from.
    pub source: String,
    /// The geometry simulated.
    pub geometry: MoeGeometry,
    /// The process the fit started from.
    pub start: RoutingProcess,
    /// The fitted process.
    pub fitted: RoutingProcess,
    /// The knobs moved.
    pub fit: Vec<FitParam>,
    /// Every point, with its residual.
    pub points: Vec<PointFit>,
    /// Root mean square of the scaled residuals (fractions).
    pub rms: f64,
    /// Nelder-Mead iterations.
    pub iterations: u64,
    /// Why the search stopped.
    pub termination: String,
}

/// The statistics the points name, for one process.
pub fn evaluate(process: &RoutingProcess, points: &FitPoints) -> Result<Vec<f64>> {
    let g = points.geometry();
    let cfg = points.stats_config();
    let mut src = SyntheticRouting::new(process, g)?;
    let steps = record(&mut src, &cfg)?;
    evaluate_steps(&g, &steps, &cfg, &points.points)
}

fn evaluate_steps(
    g: &MoeGeometry,
    steps: &[StepRouting],
    cfg: &StatsConfig,
    targets: &[Target],
) -> Result<Vec<f64>> {
    let measured = &steps[cfg.warmup_steps..cfg.warmup_steps + cfg.steps];
    targets
        .iter()
        .map(|t| match t {
            Target::HitRate {
                topology,
                slots_per_layer,
                policy,
                ..
            } => hit_rate(g, steps, cfg, policy, *topology, *slots_per_layer),
            Target::HotCoverage { k, .. } => Ok(hot_coverage(g, measured, cfg.streams, *k)),
            Target::Union { streams, .. } => {
                let one = StatsConfig {
                    union_streams: *streams,
                    per_layer_slots: Vec::new(),
                    global_slots: Vec::new(),
                    hot_k: Vec::new(),
                    detail: false,
                    ..cfg.clone()
                };
                let st = stats_of_steps(g, steps, &one)?;
                Ok(st
                    .union
                    .iter()
                    .find(|u| u.streams == *streams)
                    .map_or(0.0, |u| u.unique))
            }
        })
        .collect()
}

/// The least-squares problem handed to argmin.
struct Problem<'a> {
    points: &'a FitPoints,
    start: &'a RoutingProcess,
}

impl Problem<'_> {
    fn process(&self, x: &[f64]) -> RoutingProcess {
        let mut p = self.start.clone();
        for (param, &v) in self.points.fit.iter().zip(x) {
            param.set(&mut p, self.start, param.value_of(v));
        }
        p
    }

    fn residuals(&self, p: &RoutingProcess) -> Result<Vec<f64>> {
        let g = self.points.geometry();
        let got = evaluate(p, self.points)?;
        Ok(self
            .points
            .points
            .iter()
            .zip(got)
            .map(|(t, v)| (v - t.value()) / t.scale(&g))
            .collect())
    }
}

impl CostFunction for Problem<'_> {
    type Param = Vec<f64>;
    type Output = f64;

    fn cost(&self, x: &Vec<f64>) -> std::result::Result<f64, argmin::core::Error> {
        let r = self.residuals(&self.process(x))?;
        Ok(r.iter().map(|v| v * v).sum())
    }
}

/// Fit the knobs `points.fit` of `start` to the points.
pub fn fit(points: &FitPoints, start: &RoutingProcess) -> Result<FitReport> {
    points.validate()?;
    start.validate()?;
    let problem = Problem { points, start };
    let x0: Vec<f64> = points.fit.iter().map(|p| p.free_of(p.get(start))).collect();
    let mut simplex = vec![x0.clone()];
    for j in 0..x0.len() {
        let mut v = x0.clone();
        v[j] += FIT_INITIAL_STEP;
        simplex.push(v);
    }
    let err = |e: argmin::core::Error| ModelError::invalid("routing fit", e.to_string());
    let solver = NelderMead::new(simplex)
        .with_sd_tolerance(FIT_SD_TOLERANCE)
        .map_err(err)?;
    let res = Executor::new(Problem { points, start }, solver)
        .configure(|s| s.max_iters(MAX_FIT_ITERS))
        .run()
        .map_err(err)?;
    let state = res.state();
    let best = state.get_best_param().cloned().unwrap_or(x0);
    let fitted = problem.process(&best);
    let g = points.geometry();
    let before = evaluate(start, points)?;
    let after = evaluate(&fitted, points)?;
    let point_fits: Vec<PointFit> = points
        .points
        .iter()
        .zip(before.iter().zip(&after))
        .map(|(t, (&b, &a))| PointFit {
            label: t.label(),
            target: t.value(),
            start: b,
            fitted: a,
            residual: a - t.value(),
        })
        .collect();
    let rms = (points
        .points
        .iter()
        .zip(&point_fits)
        .map(|(t, p)| (p.residual / t.scale(&g)).powi(2))
        .sum::<f64>()
        / point_fits.len() as f64)
        .sqrt();
    Ok(FitReport {
        source: points.source.clone(),
        geometry: g,
        start: start.clone(),
        fitted,
        fit: points.fit.clone(),
        points: point_fits,
        rms,
        iterations: state.get_iter(),
        termination: state.get_termination_status().to_string(),
    })
}

/// The points a trace's own statistics give: per-layer LRU hit rates at 2, 4, 8 and 16
/// tokens' worth of slots (those below the experts per layer), the coverage of a hot list of
/// a sixteenth of the experts, and with several streams the union at the most streams.
/// `warmup_steps` and `steps` must fit in the trace.
pub fn points_from_steps(
    g: &MoeGeometry,
    steps: &[StepRouting],
    warmup_steps: usize,
    measured_steps: usize,
    source: &str,
) -> Result<FitPoints> {
    let streams = steps.iter().map(StepRouting::streams).min().unwrap_or(0);
    if streams == 0 {
        return Err(ModelError::invalid(source, "the trace holds no steps"));
    }
    let sizes: Vec<usize> = [2, 4, 8, 16]
        .iter()
        .map(|t| t * g.top_k)
        .filter(|&n| n < g.experts)
        .collect();
    let hot = (g.experts / 16).max(1);
    let union_streams = streams.min(MAX_FIT_STREAMS);
    let cfg = StatsConfig {
        warmup_steps,
        steps: measured_steps,
        streams: 1,
        union_streams,
        per_layer_slots: sizes.clone(),
        global_slots: Vec::new(),
        policies: vec![CachePolicy::Lru],
        hot_k: vec![hot],
        detail: false,
    };
    let st = stats_of_steps(g, steps, &cfg)?;
    let mut points: Vec<Target> = sizes
        .iter()
        .filter_map(|&n| {
            st.hit_rate("lru", CacheTopology::PerLayer, n)
                .map(|value| Target::HitRate {
                    topology: CacheTopology::PerLayer,
                    slots_per_layer: n,
                    policy: CachePolicy::Lru,
                    value,
                })
        })
        .collect();
    points.push(Target::HotCoverage {
        k: hot,
        value: st.coverage(hot).unwrap_or(0.0),
    });
    if union_streams > 1 {
        if let Some(u) = st.union.iter().find(|u| u.streams == union_streams) {
            points.push(Target::Union {
                streams: union_streams,
                value: u.unique,
            });
        }
    }
    Ok(FitPoints {
        source: source.to_string(),
        experts: g.experts,
        top_k: g.top_k,
        moe_layers: g.moe_layers,
        start: default_start(),
        fit: default_fit(),
        warmup_steps,
        steps: measured_steps,
        points,
    })
}

/// The points of a trace file's own statistics ([`points_from_steps`]): reads the
/// `warmup_steps + measured_steps` steps they need from the trace at `path` (its header gives
/// the geometry), refusing a trace that holds fewer.
pub fn points_from_trace(
    path: &Path,
    warmup_steps: usize,
    measured_steps: usize,
) -> Result<FitPoints> {
    let origin = path.display().to_string();
    let g = super::trace_geometry(path)?;
    let mut reader = super::TraceReader::open(path, &g)?;
    let need = warmup_steps.saturating_add(measured_steps);
    let mut steps = Vec::new();
    while steps.len() < need {
        match reader.read_step()? {
            Some(s) => steps.push(s),
            None => {
                return Err(ModelError::invalid(
                    origin,
                    format!(
                        "{} steps; --warmup {warmup_steps} + --steps {measured_steps} need {need}",
                        steps.len()
                    ),
                ))
            }
        }
    }
    points_from_steps(&g, &steps, warmup_steps, measured_steps, &origin)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::routing::RoutingSource;

    fn small_points(points: Vec<Target>) -> FitPoints {
        FitPoints {
            source: "test".into(),
            experts: 64,
            top_k: 4,
            moe_layers: 4,
            start: "typical".into(),
            fit: vec![FitParam::Locality, FitParam::LocalityTokens],
            warmup_steps: 50,
            steps: 300,
            points,
        }
    }

    #[test]
    fn fit_recovers_a_known_process() {
        // Points measured on a process with other knobs; the fit from `typical` must land
        // where the points are reproduced (the knobs themselves are not identifiable
        // exactly from three points, the statistics are).
        let truth = RoutingProcess {
            locality: 0.6,
            locality_tokens: 6.0,
            ..RoutingProcess::preset("typical").unwrap()
        };
        let template = small_points(vec![
            Target::HitRate {
                topology: CacheTopology::PerLayer,
                slots_per_layer: 8,
                policy: CachePolicy::Lru,
                value: 0.0,
            },
            Target::HitRate {
                topology: CacheTopology::PerLayer,
                slots_per_layer: 16,
                policy: CachePolicy::Lru,
                value: 0.0,
            },
            Target::HotCoverage { k: 4, value: 0.0 },
        ]);
        let measured = evaluate(&truth, &template).unwrap();
        let mut points = template.clone();
        for (p, v) in points.points.iter_mut().zip(&measured) {
            match p {
                Target::HitRate { value, .. } | Target::HotCoverage { value, .. } => *value = *v,
                Target::Union { value, .. } => *value = *v,
            }
        }
        let start = RoutingProcess::preset("typical").unwrap();
        let r = fit(&points, &start).unwrap();
        let start_err: f64 = r.points.iter().map(|p| (p.start - p.target).abs()).sum();
        assert!(start_err > 0.05, "the start already fits: {start_err}");
        for p in &r.points {
            assert!(
                p.residual.abs() < 0.02,
                "{}: fitted {} vs {} ({r:?})",
                p.label,
                p.fitted,
                p.target
            );
        }
        assert!(r.rms < 0.02 && r.iterations > 0);
        // Knobs not fitted keep the start's values; the edge locality keeps its proportion.
        assert_eq!(r.fitted.zipf, start.zipf);
        let ratio = start.edge_locality / start.locality;
        assert!((r.fitted.edge_locality / r.fitted.locality - ratio).abs() < 1e-9);
    }

    #[test]
    fn points_files_parse_and_refuse_bad_values() {
        let text = r#"
source = "x"
experts = 512
top_k = 10
moe_layers = 8
[[point]]
kind = "hit-rate"
slots_per_layer = 64
value = 0.67
[[point]]
kind = "hit-rate"
topology = "global"
slots_per_layer = 64
policy = { kind = "lfu" }
value = 0.5
[[point]]
kind = "hot-coverage"
k = 32
value = 0.10
[[point]]
kind = "union"
streams = 4
value = 30.0
"#;
        let p = FitPoints::from_toml_str(text, "p.toml").unwrap();
        assert_eq!(p.points.len(), 4);
        assert_eq!(p.fit, default_fit());
        assert_eq!(p.points[0].label(), "per-layer lru 64");
        assert_eq!(p.points[1].label(), "global lfu 64");
        for (bad, want) in [
            (text.replace("0.67", "1.5"), "point[0]"),
            (
                text.replace(
                    "slots_per_layer = 64\nvalue = 0.67",
                    "slots_per_layer = 600\nvalue = 0.6",
                ),
                "slots_per_layer",
            ),
            (text.replace("value = 30.0", "value = 300.0"), "union value"),
            (text.replace("k = 32", "k = 0"), "k = 0"),
            (text.replace("top_k = 10", "top_k = 600"), "top_k"),
            (
                text.replace("kind = \"union\"", "kind = \"unions\""),
                "p.toml",
            ),
            (text.replace("source = \"x\"", "sauce = \"x\""), "sauce"),
        ] {
            let e = FitPoints::from_toml_str(&bad, "p.toml")
                .unwrap_err()
                .to_string();
            assert!(e.contains(want), "{want}: {e}");
        }
    }

    #[test]
    fn a_trace_gives_its_own_points() {
        let g = MoeGeometry::routing_test(64, 4, 3);
        let p = RoutingProcess::preset("typical").unwrap();
        let mut src = SyntheticRouting::new(&p, g).unwrap();
        let steps: Vec<StepRouting> = (0..200).map(|_| src.next_step(2).unwrap()).collect();
        let pts = points_from_steps(&g, &steps, 50, 150, "t.jsonl").unwrap();
        // 2, 4, 8 tokens' worth (8, 16, 32 slots; 64 is all experts), a hot list, a union.
        assert_eq!(pts.points.len(), 5);
        assert!(matches!(pts.points[4], Target::Union { streams: 2, .. }));
        let v: Vec<f64> = pts.points.iter().map(Target::value).collect();
        assert!(
            v[0] < v[1] && v[1] < v[2],
            "hit rates grow with the cache: {v:?}"
        );
        pts.validate().unwrap();
        assert!(points_from_steps(&g, &[], 0, 0, "t").is_err());
    }
}
