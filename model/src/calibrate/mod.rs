//! `ft calibrate`: fit the engine terms that end-to-end runs identify, on top of the host
//! model.
//!
//! Why it exists: ft's model is fitted to ft's own runtime by its micro-probes. The engines
//! people run have costs that runtime does not (CPU kernels serving far below their bench
//! rate, fixed costs of hundreds of microseconds per layer-step, attention that grows with
//! context, caches that admit differently in hybrid: mechanism 5 of the design brief), so a
//! prediction from a bench's numbers alone inherits ft's efficiency and overstates whichever
//! strategy leans on the missing costs. A few measured runs of the engine itself
//! ([`crate::observe`]) identify those costs; this module fits them.
//!
//! **Terms** ([`Term`]): the CPU side's serving rate as a multiple of its bench rate, the
//! link's effective rate as a multiple of the host model's, a fixed cost per layer-step for
//! each kind of layer work ([`crate::schedule::LayerWork`]: equal work costs the same whatever
//! the strategy is called), the per-stream and per-context cost of the rest of the step, and
//! hybrid's miss rate relative to offload's at the same cache. Each is applied through
//! [`PerfParams`] ([`Term::apply`]), so `predict`, `explain`, `simulate` and `serve` use them
//! with no code of their own.
//!
//! **Method.**
//! 1. Each run's traffic is sampled once ([`RunModel`]); its predicted tok/s in its own
//!    measure (decode, server-gen, client-e2e with its prompt: [`crate::perf::prefill`]) is
//!    then a closed form of the parameters.
//! 2. Residuals are log-ratios `ln(predicted / measured)`: a run at 5 tok/s weighs as much as
//!    one at 80.
//! 3. **Identification.** The Jacobian of the residuals over the terms (each in units of its
//!    [`Term::scale`]) is taken at the host model. Terms are admitted in [`Term::ALL`]'s order
//!    while the admitted columns' condition number stays below
//!    [`CalibrateConfig::max_condition`] and their smallest singular value above
//!    [`CalibrateConfig::min_sensitivity`], and while there are fewer admitted terms than
//!    runs (at most `n - 1` of `n`: one degree of freedom is kept, so that the runs' scatter
//!    estimates the standard errors). A term left out is reported with why (no run moves it, or it moves the runs as
//!    the named admitted terms do), held at its neutral value, and the one candidate run
//!    (strategy, streams, context) whose row would admit most of the left-out terms is named.
//! 4. **Fit.** argmin's Nelder-Mead on the sum of squared residuals, factors in log space and
//!    fixed costs as `scale |x|` (never negative), in rounds of at most
//!    [`CalibrateConfig::max_iters`] iterations, each restarted from the best point so far
//!    with a fresh simplex, until a restart lowers the sum of squares by less than a
//!    millionth of it (converged) or [`CalibrateConfig::max_rounds`] rounds have run (not
//!    converged, and reported so). The objective is flat along several terms (fixed costs at
//!    their bound of 0, fixed costs against the rest of the step): a single simplex shrinks
//!    and creeps along such a valley long after the objective has settled, so one round is
//!    rarely enough, and a fresh simplex from the best point is what tells a settled fit from
//!    a stalled one.
//! 5. **Uncertainty.** `C = s^2 (J^T J)^-1` from the Jacobian at the optimum, `s^2 = RSS /
//!    (n - k)`, `n - k >= 1` by step 3. A calibration record with `n = k` (0 degrees of
//!    freedom, written before step 3 kept one) is still read: its `s` is undefined, its
//!    standard errors are undefined, and those at the host model's run noise
//!    ([`TermEstimate::se_at_run_noise`]) serve the calibrated model's intervals, which say
//!    so. A fixed cost the fit put at 0 is marked
//!    at its bound.
//! 6. **Leave-one-out.** Each run is predicted from a fit without it (terms identified again
//!    on the rest), its error reported beside the in-sample one.

pub mod host_inputs;
pub mod runs;
pub mod terms;

use argmin::core::{CostFunction, Executor, State};
use argmin::solver::neldermead::NelderMead;
use nalgebra::DMatrix;
use serde::{Deserialize, Serialize};

use crate::error::{ModelError, Result};
use crate::observe::{Measure, Observation};
use crate::perf::{ParamCovariance, PerfModel, PerfParams};
use crate::preset::ModelSpec;
use crate::strategy::Strategy;

pub use runs::{cache_slots, strategy_of, RunModel, SamplingConfig};
pub use terms::{apply_all, Term};

/// Default largest condition number of the admitted terms' Jacobian (columns in units of
/// [`Term::scale`]): beyond it two terms move the runs nearly alike and their split is noise.
pub const DEFAULT_MAX_CONDITION: f64 = 1e3;

/// Default smallest singular value of the admitted terms' Jacobian: a change of one
/// [`Term::scale`] must move the runs' log tok/s by at least 0.5% in all.
pub const DEFAULT_MIN_SENSITIVITY: f64 = 5e-3;

/// Nelder-Mead's iterations per round.
pub const DEFAULT_MAX_ITERS: u64 = 600;

/// Nelder-Mead rounds at most, each restarted from the best point so far: a fit still
/// improving after them is reported not converged.
pub const DEFAULT_MAX_ROUNDS: usize = 30;

/// The largest factor a fit may put on a rate (and the smallest, its inverse): a CPU side
/// serving at 20 times its bench, or a link at a twentieth of its rate, is a wrong host
/// input, not an engine term; a fit that reaches it is marked at its bound.
pub const MAX_FACTOR: f64 = 20.0;

/// Nelder-Mead's stopping tolerance on the simplex's cost spread.
const SD_TOLERANCE: f64 = 1e-12;

/// A restart that lowers the sum of squared log residuals by at most this share of it (plus
/// [`RESTART_ABS_TOL`]) has found nothing better: the fit has converged.
const RESTART_REL_TOL: f64 = 1e-6;

/// Absolute part of the restarts' tolerance: a sum of squares of log residuals (an rms of
/// about 1e-7 over a few runs) below which the fit is exact.
const RESTART_ABS_TOL: f64 = 1e-14;

/// Initial simplex step of each term's search coordinate.
const SIMPLEX_STEP: f64 = 0.3;

/// Relative finite-difference step of the Jacobians.
const DIFF_STEP: f64 = 1e-4;

/// What to fit and how.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct CalibrateConfig {
    /// How the runs' traffic is sampled.
    pub sampling: SamplingConfig,
    /// The terms that may be fitted (others stay neutral), in admission order.
    pub terms: Vec<Term>,
    /// Largest condition number of the fitted terms' Jacobian.
    pub max_condition: f64,
    /// Smallest singular value of the fitted terms' Jacobian.
    pub min_sensitivity: f64,
    /// Nelder-Mead iterations per round.
    pub max_iters: u64,
    /// Nelder-Mead rounds at most (each restarted from the best point so far).
    pub max_rounds: usize,
    /// Name the run that would identify the terms left out (samples candidate runs).
    pub suggest: bool,
    /// Predict each run from a fit without it.
    pub leave_one_out: bool,
}

impl Default for CalibrateConfig {
    fn default() -> Self {
        CalibrateConfig {
            sampling: SamplingConfig::default(),
            terms: Term::ALL.to_vec(),
            max_condition: DEFAULT_MAX_CONDITION,
            min_sensitivity: DEFAULT_MIN_SENSITIVITY,
            max_iters: DEFAULT_MAX_ITERS,
            max_rounds: DEFAULT_MAX_ROUNDS,
            suggest: true,
            leave_one_out: true,
        }
    }
}

/// One term's estimate.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TermEstimate {
    /// The term.
    pub term: Term,
    /// Its value ([`Term::neutral`] where not identified), in [`TermEstimate::unit`].
    pub value: f64,
    /// Its standard error (`None` where not identified, and where the fit has no residual
    /// degrees of freedom: as many fitted terms as runs leave no scatter to estimate it
    /// from, so it is undefined; see [`TermEstimate::se_at_run_noise`]).
    pub se: Option<f64>,
    /// Only where `se` is undefined for a fitted term (0 degrees of freedom): the standard
    /// error it would have if the runs scattered by the host model's run noise
    /// ([`PerfParams::run_noise_rel`]), an assumption, not an estimate. A calibrated
    /// model's intervals and `ft tune`'s estimates use it there, and say so.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub se_at_run_noise: Option<f64>,
    /// The unit of the value.
    pub unit: String,
    /// Whether the runs identified it (it was fitted).
    pub identified: bool,
    /// The fit put it at its bound: a fixed cost at 0 (costs are never negative), a factor
    /// at [`MAX_FACTOR`] or its inverse.
    pub at_bound: bool,
}

/// One run: measured against the host-only and the calibrated prediction.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RunFit {
    /// Data row in the observations file.
    pub row: usize,
    /// The run's label.
    pub label: Option<String>,
    /// The strategy as `ft predict` names it.
    pub strategy: String,
    /// Concurrent streams.
    pub streams: usize,
    /// Mean context of its decode steps.
    pub context: usize,
    /// What its tok/s measures.
    pub measure: Measure,
    /// Measured tok/s per stream.
    pub measured: f64,
    /// Predicted from the host inputs alone, tok/s per stream.
    pub host_only: f64,
    /// Predicted with the calibrated terms, tok/s per stream.
    pub calibrated: f64,
    /// Predicted by a fit without this run (`None` when leave-one-out was not run).
    pub leave_one_out: Option<f64>,
    /// The run's values that were derived, not given (column names).
    pub derived: Vec<String>,
}

impl RunFit {
    /// Relative error of a prediction against the measurement.
    pub fn error(&self, predicted: f64) -> f64 {
        predicted / self.measured - 1.0
    }
}

/// A term the runs did not identify.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Unidentified {
    /// The term.
    pub term: Term,
    /// Why, in words.
    pub reason: String,
}

/// One more run, and what it would identify.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SuggestedRun {
    /// The strategy as `ft predict` names it.
    pub strategy: String,
    /// Concurrent streams.
    pub streams: usize,
    /// Context, tokens.
    pub context: usize,
    /// Cache slots (the median of the given runs').
    pub cache_slots: usize,
    /// The left-out terms it would identify.
    pub identifies: Vec<Term>,
}

/// What the runs identify.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Identifiability {
    /// The terms fitted, in admission order.
    pub fitted: Vec<Term>,
    /// The terms held at their neutral value, with why.
    pub unidentified: Vec<Unidentified>,
    /// Condition number of the fitted terms' Jacobian (at the host model).
    pub condition: f64,
    /// The one more run that identifies most of the left-out terms, if any does.
    pub suggestion: Option<SuggestedRun>,
}

/// How the fit ended.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct FitSummary {
    /// Nelder-Mead iterations (all rounds).
    pub iterations: u64,
    /// Nelder-Mead rounds, each restarted from the best point of the one before.
    #[serde(default)]
    pub rounds: usize,
    /// Whether the fit converged: a restart from its best point found nothing better.
    #[serde(default)]
    pub converged: bool,
    /// How the fit ended, in words.
    pub termination: String,
    /// Runs.
    pub runs: usize,
    /// Residual degrees of freedom (runs less fitted terms).
    pub dof: usize,
    /// rms of the log-ratio residuals from the host inputs alone.
    pub rms_host_only: f64,
    /// rms of the log-ratio residuals after calibration.
    pub rms_calibrated: f64,
    /// rms of the leave-one-out log-ratio errors (`None` when not run).
    pub rms_leave_one_out: Option<f64>,
    /// The residual scale the standard errors use (relative); at 0 degrees of freedom the
    /// runs cannot estimate it and this is the host model's run noise, assumed.
    pub sigma: f64,
}

impl FitSummary {
    /// Whether the runs estimate the standard errors: false with as many fitted terms as
    /// runs (0 residual degrees of freedom), where they are undefined.
    pub fn standard_errors_defined(&self) -> bool {
        self.dof > 0
    }

    /// What 0 degrees of freedom means for the standard errors, in words (`None` where the
    /// runs estimate them).
    pub fn undefined_errors_note(&self) -> Option<String> {
        (!self.standard_errors_defined()).then(|| {
            format!(
                "0 degrees of freedom ({} runs for as many fitted terms): the fitted terms' \
                 standard errors are undefined; intervals assume the host model's run noise \
                 of {:.1}%, and one more run estimates them",
                self.runs,
                100.0 * self.sigma
            )
        })
    }
}

/// The result of [`calibrate`].
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Calibration {
    /// Every term considered, fitted or not.
    pub terms: Vec<TermEstimate>,
    /// Every run.
    pub runs: Vec<RunFit>,
    /// What the runs identify.
    pub identifiability: Identifiability,
    /// How the fit ended.
    pub fit: FitSummary,
    /// The host model's parameters with the fitted terms applied.
    pub params: PerfParams,
}

impl Calibration {
    /// The estimate of `term`, if it was considered.
    pub fn term(&self, term: Term) -> Option<&TermEstimate> {
        self.terms.iter().find(|t| t.term == term)
    }

    /// The calibrated model: `base` with the fitted parameters, the fitted terms' standard
    /// errors laid over the base covariance (on the parameters they move; at 0 degrees of
    /// freedom the errors at the assumed run noise, [`TermEstimate::se_at_run_noise`]), and
    /// the fit's degrees of freedom: `Some` whatever their number, since a fit to runs is
    /// calibrated (0 reads as "standard errors undefined", never as "uncalibrated").
    pub fn perf_model(&self, base: &PerfModel) -> PerfModel {
        let mut ids = Vec::new();
        let mut se = Vec::new();
        for t in &self.terms {
            if let (Some(id), Some(s), true) =
                (t.term.param(), t.se.or(t.se_at_run_noise), t.identified)
            {
                ids.push(id);
                se.push((s * t.term.param_slope(&base.params, t.value)).abs());
            }
        }
        PerfModel {
            params: self.params.clone(),
            covariance: base
                .covariance
                .overlay(&ParamCovariance::diagonal(ids, &se)),
            dof: Some(self.fit.dof),
            source: format!(
                "{}; calibrated to {} runs ({} terms{})",
                base.source,
                self.fit.runs,
                self.identifiability.fitted.len(),
                self.fit
                    .undefined_errors_note()
                    .map(|n| format!("; {n}"))
                    .unwrap_or_default()
            ),
        }
    }
}

/// What a calibrated profile keeps of its calibration (the profile's engine-terms section):
/// where the runs and the host came from, the host values that were derived, and the fit's
/// report. The fitted values themselves are in the profile's parameters.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CalibrationRecord {
    /// The observations file.
    pub observations: String,
    /// What the host model came from (a host file, a `benchbw.json`, a profile).
    pub host_inputs: String,
    /// Host values that were derived rather than given, each `key = value unit (how)`.
    #[serde(default)]
    pub derived: Vec<String>,
    /// Every term considered, fitted or not.
    pub terms: Vec<TermEstimate>,
    /// Every run.
    pub runs: Vec<RunFit>,
    /// What the runs identify.
    pub identifiability: Identifiability,
    /// How the fit ended.
    pub fit: FitSummary,
}

impl Calibration {
    /// The record a profile keeps of this calibration.
    pub fn record(
        &self,
        observations: String,
        host_inputs: String,
        derived: Vec<String>,
    ) -> CalibrationRecord {
        CalibrationRecord {
            observations,
            host_inputs,
            derived,
            terms: self.terms.clone(),
            runs: self.runs.clone(),
            identifiability: self.identifiability.clone(),
            fit: self.fit.clone(),
        }
    }
}

/// A finite number `>= lo` (and `<= hi`), or an error naming `field`.
fn check_range(field: String, v: f64, lo: f64, hi: f64) -> Result<()> {
    if !(v.is_finite() && v >= lo && v <= hi) {
        return Err(ModelError::invalid(
            field,
            format!("{v} is outside [{lo}, {hi}]"),
        ));
    }
    Ok(())
}

impl CalibrationRecord {
    /// Check the record as read from a profile: every number finite and in its range, the
    /// fitted terms those marked identified, the run count the fit's, at most
    /// [`crate::observe::MAX_OBSERVATIONS`] runs. Errors name the field
    /// (`calibration.terms[2].value`).
    pub fn validate(&self) -> Result<()> {
        use crate::limits::MAX_FIXED_US;
        let at = |what: String| format!("calibration.{what}");
        if self.runs.len() > crate::observe::MAX_OBSERVATIONS {
            return Err(ModelError::invalid(
                at("runs".into()),
                format!(
                    "{} runs, more than {}",
                    self.runs.len(),
                    crate::observe::MAX_OBSERVATIONS
                ),
            ));
        }
        if self.fit.runs != self.runs.len() || self.fit.dof > self.fit.runs {
            return Err(ModelError::invalid(
                at("fit.runs".into()),
                format!(
                    "{} runs and {} degrees of freedom for {} runs listed",
                    self.fit.runs,
                    self.fit.dof,
                    self.runs.len()
                ),
            ));
        }
        for (i, t) in self.terms.iter().enumerate() {
            let (lo, hi) = if t.term.is_factor() {
                (1.0 / MAX_FACTOR, MAX_FACTOR)
            } else {
                (0.0, MAX_FIXED_US)
            };
            check_range(at(format!("terms[{i}].value")), t.value, lo, hi)?;
            for (name, se) in [("se", t.se), ("se_at_run_noise", t.se_at_run_noise)] {
                if let Some(se) = se {
                    check_range(at(format!("terms[{i}].{name}")), se, 0.0, f64::MAX)?;
                }
            }
            if t.se.is_some() && !self.fit.standard_errors_defined() {
                return Err(ModelError::invalid(
                    at(format!("terms[{i}].se")),
                    "a standard error from a fit with 0 degrees of freedom (undefined)",
                ));
            }
            if t.identified != self.identifiability.fitted.contains(&t.term) {
                return Err(ModelError::invalid(
                    at(format!("terms[{i}].identified")),
                    format!(
                        "{} is marked {} but the fitted terms are {:?}",
                        t.term,
                        if t.identified {
                            "identified"
                        } else {
                            "not identified"
                        },
                        self.identifiability.fitted
                    ),
                ));
            }
        }
        for (i, r) in self.runs.iter().enumerate() {
            let hi = crate::observe::MAX_OBSERVED_TOK_S * 1e3;
            for (name, v) in [
                ("measured", Some(r.measured)),
                ("host_only", Some(r.host_only)),
                ("calibrated", Some(r.calibrated)),
                ("leave_one_out", r.leave_one_out),
            ] {
                if let Some(v) = v {
                    check_range(at(format!("runs[{i}].{name}")), v, f64::MIN_POSITIVE, hi)?;
                }
            }
        }
        let f = &self.fit;
        for (name, v) in [
            ("rms_host_only", f.rms_host_only),
            ("rms_calibrated", f.rms_calibrated),
            ("rms_leave_one_out", f.rms_leave_one_out.unwrap_or(0.0)),
            ("sigma", f.sigma),
        ] {
            check_range(at(format!("fit.{name}")), v, 0.0, f64::MAX)?;
        }
        let c = self.identifiability.condition;
        check_range(at("identifiability.condition".into()), c, 0.0, f64::MAX)?;
        Ok(())
    }
}

/// The search coordinate of a term's value.
fn to_x(t: Term, v: f64) -> f64 {
    if t.is_factor() {
        v.max(1e-9).ln()
    } else {
        v / t.scale()
    }
}

/// A term's value at search coordinate `x` (factors `exp(x)` within
/// [`MAX_FACTOR`]`^-1..=`[`MAX_FACTOR`], costs `scale |x|`).
fn from_x(t: Term, x: f64) -> f64 {
    if t.is_factor() {
        x.exp().clamp(1.0 / MAX_FACTOR, MAX_FACTOR)
    } else {
        t.scale() * x.abs()
    }
}

/// The runs, the model and the base: what a fit evaluates.
struct Problem<'a> {
    model: &'a ModelSpec,
    base: &'a PerfParams,
    runs: &'a [RunModel],
    measured: &'a [f64],
    sampling: &'a SamplingConfig,
}

impl Problem<'_> {
    fn residuals(&self, terms: &[Term], values: &[f64]) -> Vec<f64> {
        let p = apply_all(self.base, terms, values);
        self.runs
            .iter()
            .zip(self.measured)
            .map(|(r, m)| {
                let t = r.tok_s(self.model, &p, &self.sampling.prefill);
                if t.is_finite() && t > 0.0 {
                    (t / m).ln()
                } else {
                    1e3
                }
            })
            .collect()
    }

    /// Jacobian `n x k` of the residuals over the terms' values, each in units of its scale
    /// (`scaled`) or its own unit; central differences, one-sided at a cost's bound.
    fn jacobian(&self, terms: &[Term], values: &[f64], scaled: bool) -> DMatrix<f64> {
        let n = self.runs.len();
        let mut j = DMatrix::zeros(n, terms.len());
        for (c, t) in terms.iter().enumerate() {
            let h = DIFF_STEP * values[c].abs().max(t.scale());
            let mut up = values.to_vec();
            up[c] += h;
            let mut lo = values.to_vec();
            let width = if t.is_factor() || values[c] - h >= 0.0 {
                lo[c] -= h;
                2.0 * h
            } else {
                h
            };
            let (ru, rl) = (self.residuals(terms, &up), self.residuals(terms, &lo));
            let unit = if scaled { t.scale() } else { 1.0 };
            for r in 0..n {
                j[(r, c)] = (ru[r] - rl[r]) / width * unit;
            }
        }
        j
    }
}

struct Objective<'a, 'b> {
    problem: &'a Problem<'b>,
    terms: &'a [Term],
}

impl CostFunction for Objective<'_, '_> {
    type Param = Vec<f64>;
    type Output = f64;

    fn cost(&self, x: &Self::Param) -> std::result::Result<f64, argmin::core::Error> {
        let values: Vec<f64> = self
            .terms
            .iter()
            .zip(x)
            .map(|(t, x)| from_x(*t, *x))
            .collect();
        Ok(self
            .problem
            .residuals(self.terms, &values)
            .iter()
            .map(|r| r * r)
            .sum())
    }
}

/// Singular values of `j`'s columns `cols`, largest first.
fn singular_values(j: &DMatrix<f64>, cols: &[usize]) -> Vec<f64> {
    if cols.is_empty() {
        return Vec::new();
    }
    let sub = j.select_columns(cols);
    let mut s: Vec<f64> = sub.singular_values().iter().copied().collect();
    s.sort_by(|a, b| b.total_cmp(a));
    s
}

/// Admit terms (module docs, step 3): the admitted column indices and, for each left out,
/// why.
fn identify(
    j: &DMatrix<f64>,
    terms: &[Term],
    runs: usize,
    config: &CalibrateConfig,
) -> (Vec<usize>, Vec<Unidentified>, f64) {
    let mut admitted: Vec<usize> = Vec::new();
    let mut left = Vec::new();
    for (c, t) in terms.iter().enumerate() {
        let own = j.column(c).norm();
        if own < config.min_sensitivity {
            left.push(Unidentified {
                term: *t,
                reason: "no run moves it".into(),
            });
            continue;
        }
        if admitted.len() + 1 >= runs {
            left.push(Unidentified {
                term: *t,
                reason: format!(
                    "{runs} run{} fit at most {} term{}: one degree of freedom is kept to \
                     estimate the standard errors",
                    if runs == 1 { "" } else { "s" },
                    runs.saturating_sub(1),
                    if runs == 2 { "" } else { "s" }
                ),
            });
            continue;
        }
        let mut with = admitted.clone();
        with.push(c);
        let s = singular_values(j, &with);
        let cond = s[0] / s[s.len() - 1].max(1e-300);
        if s[s.len() - 1] < config.min_sensitivity || cond > config.max_condition {
            // Name the admitted term whose column it follows most closely.
            let col = j.column(c);
            let like = admitted
                .iter()
                .max_by(|&&a, &&b| {
                    let ca = (j.column(a).dot(&col) / (j.column(a).norm() * own)).abs();
                    let cb = (j.column(b).dot(&col) / (j.column(b).norm() * own)).abs();
                    ca.total_cmp(&cb)
                })
                .map(|&a| terms[a].name())
                .unwrap_or("the others");
            left.push(Unidentified {
                term: *t,
                reason: format!("moves the runs as {like} does (condition {cond:.0})"),
            });
            continue;
        }
        admitted.push(c);
    }
    let s = singular_values(j, &admitted);
    let cond = match (s.first(), s.last()) {
        (Some(a), Some(b)) if *b > 0.0 => a / b,
        _ => 1.0,
    };
    (admitted, left, cond)
}

/// How a fit ([`fit_terms`]) ended.
struct FitOutcome {
    /// The fitted values, in `terms`' order.
    values: Vec<f64>,
    /// Nelder-Mead iterations over all rounds.
    iterations: u64,
    /// Nelder-Mead rounds run.
    rounds: usize,
    /// Whether a restart from the best point stopped improving the objective.
    converged: bool,
    /// Why it ended, in words.
    termination: String,
}

/// The sum of squared residuals of `terms` at search point `x`.
fn objective(problem: &Problem<'_>, terms: &[Term], x: &[f64]) -> f64 {
    let values: Vec<f64> = terms.iter().zip(x).map(|(t, x)| from_x(*t, *x)).collect();
    problem
        .residuals(terms, &values)
        .iter()
        .map(|r| r * r)
        .sum()
}

/// The fitted values of `terms` from `start` (module docs, step 4): Nelder-Mead rounds of at
/// most `max_iters` iterations, each restarted from the best point so far with a fresh
/// simplex, until a round lowers the sum of squares by less than [`RESTART_REL_TOL`] of it
/// (converged) or `max_rounds` rounds have run (not converged).
fn fit_terms(
    problem: &Problem<'_>,
    terms: &[Term],
    start: &[f64],
    max_iters: u64,
    max_rounds: usize,
) -> Result<FitOutcome> {
    if terms.is_empty() {
        return Ok(FitOutcome {
            values: Vec::new(),
            iterations: 0,
            rounds: 0,
            converged: true,
            termination: "nothing to fit".into(),
        });
    }
    let err = |e: argmin::core::Error| ModelError::invalid("calibrate fit", e.to_string());
    let mut x: Vec<f64> = terms.iter().zip(start).map(|(t, v)| to_x(*t, *v)).collect();
    // Costs start off their kink at 0.
    for (xi, t) in x.iter_mut().zip(terms) {
        if !t.is_factor() && *xi == 0.0 {
            *xi = 0.1;
        }
    }
    let mut best = objective(problem, terms, &x);
    let mut iterations = 0;
    let mut rounds = 0;
    let mut converged = false;
    let mut last_gain = f64::INFINITY;
    while rounds < max_rounds.max(1) {
        let mut simplex = vec![x.clone()];
        for c in 0..x.len() {
            let mut v = x.clone();
            v[c] += SIMPLEX_STEP;
            simplex.push(v);
        }
        let solver = NelderMead::new(simplex)
            .with_sd_tolerance(SD_TOLERANCE)
            .map_err(err)?;
        let res = Executor::new(Objective { problem, terms }, solver)
            .configure(|s| s.max_iters(max_iters))
            .run()
            .map_err(err)?;
        let state = res.state();
        iterations += state.get_iter();
        rounds += 1;
        let (Some(p), cost) = (state.get_best_param(), state.get_best_cost()) else {
            break;
        };
        if cost >= best || cost.is_nan() {
            // No better point than the restart's: the best point is a minimum.
            converged = true;
            last_gain = 0.0;
            break;
        }
        last_gain = best - cost;
        x = p.clone();
        best = cost;
        if rounds > 1 && last_gain <= RESTART_REL_TOL * best + RESTART_ABS_TOL {
            converged = true;
            break;
        }
    }
    let values = terms.iter().zip(&x).map(|(t, x)| from_x(*t, *x)).collect();
    let termination = if converged {
        format!(
            "converged: restarted from its best point, Nelder-Mead lowered the sum of squares \
             by {last_gain:.1e} (of {best:.3e}) after {rounds} rounds"
        )
    } else {
        format!(
            "not converged: {rounds} rounds of at most {max_iters} iterations, the last lowered \
             the sum of squares by {last_gain:.1e} (of {best:.3e})"
        )
    };
    Ok(FitOutcome {
        values,
        iterations,
        rounds,
        converged,
        termination,
    })
}

fn rms(v: &[f64]) -> f64 {
    if v.is_empty() {
        return 0.0;
    }
    (v.iter().map(|x| x * x).sum::<f64>() / v.len() as f64).sqrt()
}

/// Fit the engine terms of `config.terms` that `observations` identify, on top of `base`
/// (the host model: a host spec's, a bench profile's or a probed profile's), for runs of
/// `model` (module docs). Errors when there is no run, or a run names what the model does
/// not have (more CPU layers than it has).
pub fn calibrate(
    model: &ModelSpec,
    base: &PerfModel,
    observations: &[Observation],
    config: &CalibrateConfig,
) -> Result<Calibration> {
    if observations.is_empty() {
        return Err(ModelError::invalid(
            "observations",
            "no runs to calibrate to",
        ));
    }
    model.validate()?;
    base.params.validate()?;
    // The engine's prefill chunk is a setting the runs were made with, not a fitted term:
    // the calibrated profile carries it so its predictions prefill as the engine does.
    let mut engine_base = base.params.clone();
    engine_base.engine.prefill_chunk_tokens = config.sampling.prefill.chunk_tokens;
    engine_base.validate()?;
    let base = &PerfModel {
        params: engine_base,
        ..base.clone()
    };
    let runs: Vec<RunModel> = observations
        .iter()
        .map(|o| RunModel::of_observation(model, o, &config.sampling))
        .collect::<Result<_>>()?;
    let measured: Vec<f64> = observations.iter().map(|o| o.tok_s_per_stream).collect();
    let problem = Problem {
        model,
        base: &base.params,
        runs: &runs,
        measured: &measured,
        sampling: &config.sampling,
    };
    let mut terms: Vec<Term> = Vec::new();
    for t in &config.terms {
        if !terms.contains(t) {
            terms.push(*t);
        }
    }
    let neutral: Vec<f64> = terms.iter().map(|t| t.neutral()).collect();
    let host_res = problem.residuals(&terms, &neutral);

    // Identification at the host model.
    let j0 = problem.jacobian(&terms, &neutral, true);
    let (admitted, unidentified, condition) = identify(&j0, &terms, runs.len(), config);
    let fitted: Vec<Term> = admitted.iter().map(|&c| terms[c]).collect();
    let start: Vec<f64> = fitted.iter().map(|t| t.neutral()).collect();
    let outcome = fit_terms(
        &problem,
        &fitted,
        &start,
        config.max_iters,
        config.max_rounds,
    )?;
    let values = outcome.values.clone();
    let fit_res = problem.residuals(&fitted, &values);
    let params = apply_all(&base.params, &fitted, &values);
    params.validate()?;

    // Standard errors.
    let n = runs.len();
    let k = fitted.len();
    let dof = n.saturating_sub(k);
    let rss: f64 = fit_res.iter().map(|r| r * r).sum();
    // With as many terms as runs the residuals are all but 0 whatever the noise: the runs
    // cannot estimate their scatter, so the errors are undefined and kept apart, at an
    // assumed scatter, as `se_at_run_noise`.
    let sigma = if dof > 0 {
        (rss / dof as f64).sqrt()
    } else {
        base.params.run_noise_rel
    };
    let se: Vec<Option<f64>> = if k > 0 {
        let j = problem.jacobian(&fitted, &values, false);
        let jtj = j.transpose() * &j;
        match jtj.try_inverse() {
            Some(inv) => (0..k)
                .map(|i| Some(sigma * inv[(i, i)].max(0.0).sqrt()))
                .collect(),
            None => vec![None; k],
        }
    } else {
        Vec::new()
    };

    let estimates: Vec<TermEstimate> = terms
        .iter()
        .map(|t| {
            let i = fitted.iter().position(|f| f == t);
            let value = i.map(|i| values[i]).unwrap_or(t.neutral());
            TermEstimate {
                term: *t,
                value,
                se: i.and_then(|i| se[i]).filter(|_| dof > 0),
                se_at_run_noise: i.and_then(|i| se[i]).filter(|_| dof == 0),
                unit: t.unit().into(),
                identified: i.is_some(),
                at_bound: i.is_some()
                    && if t.is_factor() {
                        value >= MAX_FACTOR * (1.0 - 1e-9) || value <= (1.0 + 1e-9) / MAX_FACTOR
                    } else {
                        value < 1e-6 * t.scale()
                    },
            }
        })
        .collect();

    // Leave-one-out.
    let loo: Vec<Option<f64>> = if config.leave_one_out && n > 1 {
        (0..n)
            .map(|i| {
                let keep: Vec<usize> = (0..n).filter(|&r| r != i).collect();
                let sub_runs: Vec<RunModel> = keep.iter().map(|&r| runs[r].clone()).collect();
                let sub_meas: Vec<f64> = keep.iter().map(|&r| measured[r]).collect();
                let sub = Problem {
                    runs: &sub_runs,
                    measured: &sub_meas,
                    ..problem
                };
                let sub_neutral: Vec<f64> = fitted.iter().map(|t| t.neutral()).collect();
                let js = sub.jacobian(&fitted, &sub_neutral, true);
                let (adm, _, _) = identify(&js, &fitted, sub_runs.len(), config);
                let sub_terms: Vec<Term> = adm.iter().map(|&c| fitted[c]).collect();
                let sub_start: Vec<f64> = adm.iter().map(|&c| values[c]).collect();
                let v = fit_terms(
                    &sub,
                    &sub_terms,
                    &sub_start,
                    config.max_iters,
                    config.max_rounds,
                )
                .ok()?
                .values;
                let p = apply_all(&base.params, &sub_terms, &v);
                Some(runs[i].tok_s(model, &p, &config.sampling.prefill))
            })
            .collect()
    } else {
        vec![None; n]
    };
    let loo_log: Vec<f64> = loo
        .iter()
        .zip(&measured)
        .filter_map(|(p, m)| p.map(|p| (p / m).ln()))
        .collect();

    let run_fits: Vec<RunFit> = observations
        .iter()
        .zip(runs.iter())
        .enumerate()
        .map(|(i, (o, r))| RunFit {
            row: o.row,
            label: o.label.clone(),
            strategy: r.strategy.cli_name(),
            streams: o.streams,
            context: o.context,
            measure: o.measure,
            measured: o.tok_s_per_stream,
            host_only: o.tok_s_per_stream * host_res[i].exp(),
            calibrated: o.tok_s_per_stream * fit_res[i].exp(),
            leave_one_out: loo[i],
            derived: o.derived.clone(),
        })
        .collect();

    let suggestion = if config.suggest && !unidentified.is_empty() {
        suggest(&problem, &terms, &fitted, &values, &runs, config)?
    } else {
        None
    };

    Ok(Calibration {
        terms: estimates,
        runs: run_fits,
        identifiability: Identifiability {
            fitted,
            unidentified,
            condition,
            suggestion,
        },
        fit: FitSummary {
            iterations: outcome.iterations,
            rounds: outcome.rounds,
            converged: outcome.converged,
            termination: outcome.termination,
            runs: n,
            dof,
            rms_host_only: rms(&host_res),
            rms_calibrated: rms(&fit_res),
            rms_leave_one_out: (!loo_log.is_empty()).then(|| rms(&loo_log)),
            sigma,
        },
        params,
    })
}

/// The candidate run (module docs, step 3) whose row admits most of the terms left out.
fn suggest(
    problem: &Problem<'_>,
    terms: &[Term],
    fitted: &[Term],
    values: &[f64],
    runs: &[RunModel],
    config: &CalibrateConfig,
) -> Result<Option<SuggestedRun>> {
    let mut slots: Vec<usize> = runs.iter().map(|r| r.slots).collect();
    slots.sort_unstable();
    let slot = slots[slots.len() / 2];
    let mut ctx: Vec<usize> = runs.iter().map(|r| r.shape.context as usize).collect();
    ctx.sort_unstable();
    let c0 = ctx[ctx.len() / 2].max(1);
    // The current estimate: fitted values, the rest neutral.
    let current: Vec<f64> = terms
        .iter()
        .map(|t| {
            fitted
                .iter()
                .position(|f| f == t)
                .map(|i| values[i])
                .unwrap_or(t.neutral())
        })
        .collect();
    let p = apply_all(problem.base, terms, &current);
    let measured: Vec<f64> = runs
        .iter()
        .map(|r| r.tok_s(problem.model, &p, &problem.sampling.prefill))
        .collect();
    let strategies = [
        Strategy::Offload,
        Strategy::Hybrid {
            fetch: crate::strategy::FetchFraction::Fixed(0.5),
        },
        Strategy::Cpu,
        Strategy::Resident,
    ];
    let before = fitted.len();
    // More terms first, then the term first in admission order (the one most runs need).
    let score = |g: &[Term]| {
        let first = g
            .iter()
            .filter_map(|t| terms.iter().position(|x| x == t))
            .min()
            .unwrap_or(terms.len());
        (g.len(), terms.len() - first)
    };
    let mut best: Option<SuggestedRun> = None;
    for s in strategies {
        for streams in [1usize, 4] {
            for context in [c0, c0 * 8] {
                let cand = RunModel::new(
                    problem.model,
                    s,
                    streams,
                    context,
                    slot,
                    crate::perf::prefill::MeasureSpec::decode(),
                    problem.sampling,
                )?;
                let mut all_runs = runs.to_vec();
                all_runs.push(cand.clone());
                let mut meas = measured.clone();
                meas.push(cand.tok_s(problem.model, &p, &problem.sampling.prefill));
                let with = Problem {
                    runs: &all_runs,
                    measured: &meas,
                    ..*problem
                };
                let j = with.jacobian(terms, &current, true);
                let (adm, _, _) = identify(&j, terms, all_runs.len(), config);
                let gained: Vec<Term> = adm
                    .iter()
                    .map(|&c| terms[c])
                    .filter(|t| !fitted.contains(t))
                    .collect();
                if adm.len() > before
                    && best
                        .as_ref()
                        .is_none_or(|b| score(&gained) > score(&b.identifies))
                {
                    best = Some(SuggestedRun {
                        strategy: s.cli_name(),
                        streams,
                        context,
                        cache_slots: slot,
                        identifies: gained,
                    });
                }
            }
        }
    }
    Ok(best)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::host::HostSpec;
    use crate::observe::{ObservedCache, ObservedStrategy};

    /// The field report's model cut to 4 layers, so each run samples in milliseconds.
    fn small_model() -> ModelSpec {
        let mut m = ModelSpec::preset("qwen3.8-flash-next").unwrap();
        m.geometry.moe_layers = 4;
        m
    }

    fn quick() -> CalibrateConfig {
        CalibrateConfig {
            sampling: SamplingConfig {
                warmup_steps: 20,
                steps: 20,
                seed: Some(7),
                ..SamplingConfig::default()
            },
            ..CalibrateConfig::default()
        }
    }

    fn obs(row: usize, strategy: ObservedStrategy, streams: usize, context: usize) -> Observation {
        Observation {
            row,
            label: None,
            strategy,
            streams,
            prompt_tokens: 0,
            output_tokens: 64,
            context,
            cache: strategy
                .needs_cache()
                .then_some(ObservedCache::Residency(0.3)),
            cache_options: None,
            tok_s_per_stream: 1.0,
            measure: Measure::Decode,
            miss_rate: None,
            fetched_per_layer: None,
            cpu_per_layer: None,
            layer_us: None,
            threads: None,
            derived: Vec::new(),
        }
    }

    /// Observations of `runs` measured as the model with `truth` predicts them, each moved by
    /// a deterministic +-`noise` (alternating), so the fit has residuals to scale its errors.
    fn measured_as(
        model: &ModelSpec,
        base: &PerfParams,
        truth: &[(Term, f64)],
        mut runs: Vec<Observation>,
        noise: f64,
        config: &CalibrateConfig,
    ) -> Vec<Observation> {
        let terms: Vec<Term> = truth.iter().map(|t| t.0).collect();
        let values: Vec<f64> = truth.iter().map(|t| t.1).collect();
        let p = apply_all(base, &terms, &values);
        for (i, o) in runs.iter_mut().enumerate() {
            let r = RunModel::of_observation(model, o, &config.sampling).unwrap();
            let sign = if i % 2 == 0 { 1.0 } else { -1.0 };
            o.tok_s_per_stream =
                r.tok_s(model, &p, &config.sampling.prefill) * (1.0 + sign * noise);
        }
        runs
    }

    #[test]
    fn recovers_planted_terms_within_their_standard_errors() {
        let model = small_model();
        let base = PerfModel::from_host(&HostSpec::field_report()).unwrap();
        let config = CalibrateConfig {
            terms: vec![
                Term::CpuServingRate,
                Term::FixedGatherAndCpu,
                Term::RestPerStream,
            ],
            ..quick()
        };
        let truth = [
            (Term::CpuServingRate, 0.35),
            (Term::FixedGatherAndCpu, 250.0),
            (Term::RestPerStream, 12.0),
        ];
        let h = |f| ObservedStrategy::Hybrid { fetch_fraction: f };
        let runs = vec![
            obs(1, ObservedStrategy::Offload, 1, 1024),
            obs(2, ObservedStrategy::Offload, 4, 1024),
            obs(3, h(0.3), 1, 1024),
            obs(4, h(0.3), 4, 1024),
            obs(5, ObservedStrategy::Cpu, 1, 1024),
            obs(6, h(0.6), 2, 1024),
            obs(7, ObservedStrategy::Cpu, 4, 1024),
        ];
        let runs = measured_as(&model, &base.params, &truth, runs, 0.01, &config);
        let cal = calibrate(&model, &base, &runs, &config).unwrap();
        assert!(
            cal.identifiability.unidentified.is_empty(),
            "{:?}",
            cal.identifiability
        );
        for (t, v) in truth {
            let e = cal.term(t).unwrap();
            let se = e.se.unwrap();
            assert!(
                (e.value - v).abs() <= 3.0 * se + 1e-9,
                "{t}: {} +- {se}, planted {v}",
                e.value
            );
            assert!(se < 0.5 * v, "{t}: se {se} of {v}");
        }
        assert!(cal.fit.rms_calibrated < 0.02, "{:?}", cal.fit);
        assert!(cal.fit.rms_host_only > 0.1, "{:?}", cal.fit);
        for r in &cal.runs {
            let loo = r.leave_one_out.unwrap();
            assert!(r.error(loo).abs() < 0.1, "{r:?}");
        }
        // The calibrated model carries the terms into every prediction.
        let m = cal.perf_model(&base);
        assert!(
            (m.params.cpu_serving_slowdown
                - (1.0 / cal.term(Term::CpuServingRate).unwrap().value - 1.0))
                .abs()
                < 1e-12
        );
        m.params.validate().unwrap();
    }

    #[test]
    fn a_thin_set_says_what_it_cannot_identify_and_which_run_would() {
        let model = small_model();
        let base = PerfModel::from_host(&HostSpec::field_report()).unwrap();
        let config = quick();
        // Offload alone, one stream count: nothing of the CPU side is seen.
        let runs = vec![
            obs(1, ObservedStrategy::Offload, 1, 1024),
            obs(2, ObservedStrategy::Offload, 1, 1024),
        ];
        let runs = measured_as(
            &model,
            &base.params,
            &[(Term::LinkRate, 0.7)],
            runs,
            0.0,
            &config,
        );
        let cal = calibrate(&model, &base, &runs, &config).unwrap();
        let left: Vec<Term> = cal
            .identifiability
            .unidentified
            .iter()
            .map(|u| u.term)
            .collect();
        assert!(left.contains(&Term::CpuServingRate), "{left:?}");
        assert!(left.contains(&Term::FixedGatherAndCpu), "{left:?}");
        let why = &cal
            .identifiability
            .unidentified
            .iter()
            .find(|u| u.term == Term::CpuServingRate)
            .unwrap()
            .reason;
        assert_eq!(why, "no run moves it");
        let cpu = cal.term(Term::CpuServingRate).unwrap();
        assert!(!cpu.identified && cpu.se.is_none() && cpu.value == 1.0);
        let s = cal
            .identifiability
            .suggestion
            .as_ref()
            .expect("a run to suggest");
        assert!(!s.identifies.is_empty(), "{s:?}");
        assert!(s.strategy != "offload", "{s:?}");
    }

    #[test]
    fn the_calibrated_profile_prefills_in_the_runs_chunks() {
        let model = small_model();
        let base = PerfModel::from_host(&HostSpec::field_report()).unwrap();
        let mut config = CalibrateConfig {
            terms: vec![Term::LinkRate],
            leave_one_out: false,
            ..quick()
        };
        config.sampling.prefill.chunk_tokens = 128;
        let runs = vec![
            obs(1, ObservedStrategy::Offload, 1, 1024),
            obs(2, ObservedStrategy::Offload, 2, 1024),
        ];
        let runs = measured_as(&model, &base.params, &[], runs, 0.01, &config);
        let cal = calibrate(&model, &base, &runs, &config).unwrap();
        let profile = cal.perf_model(&base);
        assert_eq!(profile.params.engine.prefill_chunk_tokens, 128);
        assert_eq!(profile.params.engine.prefill_config().chunk_tokens, 128);
        // A host model that never saw an engine prefills in the default chunk.
        assert_eq!(
            base.params.engine.prefill_chunk_tokens,
            crate::perf::prefill::DEFAULT_PREFILL_CHUNK_TOKENS
        );
        config.sampling.prefill.chunk_tokens = 0;
        let e = calibrate(&model, &base, &runs, &config)
            .unwrap_err()
            .to_string();
        assert!(e.contains("prefill_chunk_tokens"), "{e}");
    }

    /// n runs fit at most n - 1 terms: one run fits none (the term left out says why, and
    /// the suggested run would identify it), two fit one with a standard error of their
    /// own; whatever the runs, a fit keeps a degree of freedom.
    #[test]
    fn a_fit_keeps_a_degree_of_freedom() {
        let model = small_model();
        let base = PerfModel::from_host(&HostSpec::field_report()).unwrap();
        let config = CalibrateConfig {
            terms: vec![Term::LinkRate],
            leave_one_out: false,
            ..quick()
        };
        let planted = [(Term::LinkRate, 0.7)];
        let one = vec![obs(1, ObservedStrategy::Offload, 1, 1024)];
        let one = measured_as(&model, &base.params, &planted, one, 0.0, &config);
        let cal = calibrate(&model, &base, &one, &config).unwrap();
        assert_eq!((cal.fit.runs, cal.fit.dof), (1, 1), "{:?}", cal.fit);
        assert!(cal.identifiability.fitted.is_empty());
        let left = &cal.identifiability.unidentified;
        assert_eq!(left.len(), 1);
        assert_eq!(left[0].term, Term::LinkRate);
        assert!(left[0].reason.contains("degree of freedom"), "{left:?}");
        let s = cal.identifiability.suggestion.as_ref().expect("a run");
        assert_eq!(s.identifies, vec![Term::LinkRate], "{s:?}");

        let two = vec![
            obs(1, ObservedStrategy::Offload, 1, 1024),
            obs(2, ObservedStrategy::Offload, 2, 1024),
        ];
        let two = measured_as(&model, &base.params, &planted, two, 0.01, &config);
        let cal2 = calibrate(&model, &base, &two, &config).unwrap();
        assert_eq!(cal2.fit.dof, 1);
        let link = cal2.term(Term::LinkRate).unwrap();
        assert!(link.identified && link.se.is_some(), "{link:?}");
        assert!(link.se_at_run_noise.is_none(), "{link:?}");
        assert!(cal2.fit.undefined_errors_note().is_none());

        // Every term on two to four varied runs: never more terms than runs less one.
        let all = CalibrateConfig {
            suggest: false,
            leave_one_out: false,
            ..quick()
        };
        let h = ObservedStrategy::Hybrid {
            fetch_fraction: 0.4,
        };
        let pool = [
            obs(1, h, 1, 1024),
            obs(2, ObservedStrategy::Cpu, 4, 4096),
            obs(3, ObservedStrategy::Offload, 2, 2048),
            obs(4, h, 4, 8192),
        ];
        for n in 2..=pool.len() {
            let runs = measured_as(
                &model,
                &base.params,
                &[(Term::CpuServingRate, 0.5), (Term::RestPerStream, 40.0)],
                pool[..n].to_vec(),
                0.01,
                &all,
            );
            let c = calibrate(&model, &base, &runs, &all).unwrap();
            assert!(
                c.identifiability.fitted.len() < n,
                "{n}: {:?}",
                c.identifiability
            );
            assert!(c.fit.dof >= 1 && c.fit.standard_errors_defined());
        }
    }

    /// A calibration record with as many fitted terms as runs (0 degrees of freedom, as fits
    /// wrote before they kept one) is still read as calibrated: its standard errors are
    /// undefined and every output says that instead of showing errors the runs cannot give.
    #[test]
    fn a_zero_dof_record_is_calibrated_with_undefined_errors() {
        use crate::perf::breakeven::break_evens;
        use crate::perf::decide;
        use crate::perf::predict::{predict, PredictConfig};
        let model = small_model();
        let base = PerfModel::from_host(&HostSpec::field_report()).unwrap();
        let config = CalibrateConfig {
            terms: vec![Term::LinkRate],
            leave_one_out: false,
            ..quick()
        };
        let two = vec![
            obs(1, ObservedStrategy::Offload, 1, 1024),
            obs(2, ObservedStrategy::Offload, 2, 1024),
        ];
        let two = measured_as(
            &model,
            &base.params,
            &[(Term::LinkRate, 0.7)],
            two,
            0.01,
            &config,
        );
        let fitted = calibrate(&model, &base, &two, &config).unwrap();
        // The same fit as a record of one run would have it at 0 degrees of freedom.
        let mut cal = fitted.clone();
        cal.runs.truncate(1);
        cal.fit.runs = 1;
        cal.fit.dof = 0;
        cal.fit.sigma = base.params.run_noise_rel;
        for t in cal.terms.iter_mut().filter(|t| t.identified) {
            t.se_at_run_noise = t
                .se
                .take()
                .map(|se| se * base.params.run_noise_rel / fitted.fit.sigma.max(f64::MIN_POSITIVE));
        }
        assert!(!cal.fit.standard_errors_defined());
        let link = cal.term(Term::LinkRate).unwrap();
        assert!(
            link.identified && (link.value - 0.7).abs() < 0.02,
            "{link:?}"
        );
        let assumed = link.se_at_run_noise.expect("the error at the run noise");
        assert!(assumed > 0.0 && assumed.is_finite(), "{link:?}");
        let note = cal.fit.undefined_errors_note().unwrap();
        assert!(note.contains("standard errors are undefined"), "{note}");

        // The calibrated model is calibrated (dof Some(0), not the base's None) and its
        // intervals carry the assumed error on the parameter the term moves.
        let m = cal.perf_model(&base);
        assert_eq!(m.dof, Some(0));
        assert!(
            m.source.contains("standard errors are undefined"),
            "{}",
            m.source
        );
        let id = Term::LinkRate.param().unwrap();
        let want = (assumed * Term::LinkRate.param_slope(&base.params, link.value)).abs();
        assert!((m.covariance.se(id) - want).abs() <= 1e-9 * want, "{m:?}");

        let pc = PredictConfig {
            warmup_steps: 20,
            steps: 20,
            seed: Some(7),
            ..PredictConfig::default()
        };
        let pred = predict(&model, &m, &pc).unwrap();
        let b = break_evens(&model, &m, &pc, &pred, decide(&pred).kind).unwrap();
        assert!(b.calibrated && b.dof == Some(0), "{}", b.text);
        assert!(!b.text.contains("uncalibrated"), "{}", b.text);
        assert!(b.settling_run.is_none());
        assert!(
            b.text.contains("standard errors are undefined"),
            "{}",
            b.text
        );
        assert!(b.one_line().contains("0 degrees of freedom"));

        // The record says so too, and refuses an error a 0-dof fit cannot have.
        let rec = cal.record("o.csv".into(), "host".into(), Vec::new());
        rec.validate().unwrap();
        let mut bad = rec.clone();
        bad.terms.iter_mut().find(|t| t.identified).unwrap().se = Some(assumed);
        let e = bad.validate().unwrap_err().to_string();
        assert!(e.contains("calibration.terms[") && e.contains(".se"), "{e}");
    }

    /// Rounds too short for one Nelder-Mead run to settle: the restarts from the best point
    /// carry the fit on until it converges, at the planted terms (the runs are exact, so
    /// the optimum is the truth), where a single round stops short and says so.
    #[test]
    fn a_fit_that_needs_several_rounds_converges_to_the_planted_terms() {
        let model = small_model();
        let base = PerfModel::from_host(&HostSpec::field_report()).unwrap();
        let truth = [
            (Term::CpuServingRate, 0.4),
            (Term::LinkRate, 0.8),
            (Term::FixedGatherAndCpu, 150.0),
            (Term::RestPerStream, 30.0),
        ];
        let config = CalibrateConfig {
            terms: truth.iter().map(|t| t.0).collect(),
            max_iters: 40,
            leave_one_out: false,
            suggest: false,
            ..quick()
        };
        let h = |f| ObservedStrategy::Hybrid { fetch_fraction: f };
        let runs = vec![
            obs(1, ObservedStrategy::Offload, 1, 1024),
            obs(2, ObservedStrategy::Offload, 4, 1024),
            obs(3, h(0.3), 1, 1024),
            obs(4, h(0.3), 4, 1024),
            obs(5, ObservedStrategy::Cpu, 1, 1024),
            obs(6, h(0.6), 2, 1024),
            obs(7, ObservedStrategy::Cpu, 4, 1024),
        ];
        let runs = measured_as(&model, &base.params, &truth, runs, 0.0, &config);
        let one = calibrate(
            &model,
            &base,
            &runs,
            &CalibrateConfig {
                max_rounds: 1,
                ..config.clone()
            },
        )
        .unwrap();
        assert!(!one.fit.converged, "{:?}", one.fit);
        assert!(
            one.fit.termination.starts_with("not converged"),
            "{:?}",
            one.fit
        );
        let cal = calibrate(&model, &base, &runs, &config).unwrap();
        assert!(cal.fit.converged, "{:?}", cal.fit);
        assert!(cal.fit.rounds > 1, "{:?}", cal.fit);
        assert!(
            cal.fit.rms_calibrated < one.fit.rms_calibrated,
            "{:?}",
            cal.fit
        );
        assert_eq!(cal.identifiability.fitted.len(), truth.len());
        for (t, v) in truth {
            let e = cal.term(t).unwrap();
            assert!(
                (e.value - v).abs() <= 1e-3 * v,
                "{t}: {} planted {v} ({:?})",
                e.value,
                cal.fit
            );
        }
    }

    #[test]
    fn no_runs_is_an_error() {
        let model = small_model();
        let base = PerfModel::from_host(&HostSpec::field_report()).unwrap();
        let e = calibrate(&model, &base, &[], &quick())
            .unwrap_err()
            .to_string();
        assert!(e.contains("observations"), "{e}");
    }
}
