//! Probes and the fit of [`PerfParams`] to them.
//!
//! # What each probe measures
//!
//! Every sample is one timed operation, repeated and reduced to its median by the runtime
//! (so a sample's noise is the median's, not one run's). Times are wall-clock microseconds
//! from the start of the operation's submission to the moment its result is usable by the
//! next step, measured on the host against a GPU event where the GPU is involved.
//!
//! - [`GatherSample`] (`gather`): one layer's gather of `experts` distinct experts of
//!   `expert_bytes` bytes each from the pinned host bank into cache slots: from the first
//!   copy's submission to the completion event of the last, as the decode engine issues it.
//!   Isolated: nothing else runs. Contended: a CPU expert kernel with `contended_cpu_threads`
//!   threads streams other experts' weights throughout (started before, stopped after).
//!   Design: at least two expert counts (1 to 2 x top-k) and two sizes (the served and the
//!   bench's) so that the layer cost, the copy cost and the stream rate separate.
//! - [`CpuStepSample`] (`cpu-step`): one layer's CPU share: `experts` experts, each serving
//!   `tokens_per_expert` tokens, on the engine's pool of `threads` threads: from handing the
//!   activations to the pool (pool idle as between layers) to the merged output being in
//!   host memory. Contended: a gather at full rate runs throughout. Design: several expert
//!   counts, tokens 1 to the streams served, the served and the bench's expert size, and
//!   (for the thread exponent) a few thread counts.
//! - [`GpuExpertSample`] (`gpu-experts`): one launch over `experts` resident experts with
//!   `tokens_per_expert` tokens each: launch to completion event.
//! - [`DenseSample`] (`dense`): one layer's dense part at `streams` streams and `context`
//!   tokens of context each: launch of the first kernel to completion of the last.
//! - [`RoundTripSample`] (`round-trip`): a hybrid layer's synchronisation with no expert
//!   work: GPU records an event after writing `streams x hidden` activations, the host
//!   copies them out, signals a GPU-visible flag with a partial output of the same size,
//!   the GPU waits on it; from the event record to the GPU's wait returning.
//! - [`HostSample`] (`host`): the host thread's own time per layer (planning the layer,
//!   submitting its GPU work, launching the merge and combine after a CPU share: the
//!   runtime's host spans) over the layers of one calibration block of the `step` probe
//!   below that has a CPU share (`cpu`, `hybrid`), with the block's mean counts: no probe
//!   time of its own. In such a layer the host's time is serial with the CPU share.
//! - [`LinkSample`] (`link`): the link's busy time per layer (the runtime's copy spans) over
//!   the layers of one hybrid calibration block of the `step` probe that both gathered and
//!   computed on the CPU, with the block's mean counts and threads: the gather as it runs
//!   beside a decode layer's CPU share, which the contended `gather` probe (a CPU kernel
//!   streaming throughout) does not slow as much.
//! - [`StepSample`] (`step`): one decode step of a strategy end to end on the served model,
//!   with the per-layer counts the planner produced: the calibration runs fit the
//!   per-strategy overheads and the run noise; the **validation** runs are never fitted
//!   (their residuals are reported, that is all they are for).
//!
//! # How the fit works
//!
//! Stages, each an argmin Nelder-Mead minimisation of the mean squared *relative* residual
//! `(predicted - measured) / measured` over the stage's samples, in log parameters (every
//! fitted parameter is positive), started from the prior (a host spec's parameters) and
//! restarted once from its own optimum:
//! 1. `gather` (isolated): `gather_gbs`, `gather_layer_us`, `gather_copy_us`;
//! 2. `cpu-step` (isolated): `cpu_gbs`, `cpu_thread_exponent`, `cpu_layer_us`,
//!    `cpu_expert_us`, `cpu_token_gmacs`;
//! 3. `gpu-experts`: `gpu_hbm_gbs`, `gpu_launch_us`, `gpu_token_gmacs`; then `dense`:
//!    `dense_hbm_gbs`, `dense_layer_us` (its per-stream compute at the experts' token rate);
//! 4. `round-trip`: `sync_us`;
//! 5. contended `gather` and `cpu-step`: `dram_gbs`, `dma_dram_weight`, with 1 and 2 fixed,
//!    then `host`: the [`PerfParams::host`] costs (`layer_us`, `expert_us`, `cpu_expert_us`,
//!    `stream_us`) from the `host` samples.
//!
//! Then `link`: `link_serving_slowdown` from the `link` samples at the serving threads, with
//! the serving slowdown of stage 6 below estimated once before it (a link sample's gather
//! overlaps a CPU share as long as that slowdown makes it); stage 6 then fits the slowdown
//! again with the link's.
//!
//! A parameter the stage's samples cannot determine (its Jacobian column is zero or a
//! combination of the others', e.g. the thread exponent when every sample ran at the
//! serving thread count) is not fitted and keeps the prior. Standard errors: with `J` the
//! Jacobian of the relative residuals over the log parameters at the optimum (central
//! differences), `s^2 = RSS / (m - p)` and `C = s^2 (J^T J)^-1`, the standard error of a
//! parameter `v` is `v sqrt(C_ii)` (delta method); the covariance of later stages is
//! conditional on the earlier stages' estimates. Intervals use the t distribution on
//! `m - p` degrees of freedom (statrs).
//!
//! 6. `step` (calibration runs): the per-layer overhead of each strategy is the median over
//!    its blocks of the per-layer residual `(measured - predicted) / layers` (robust to one
//!    slow block), with standard error `s / sqrt(sum layers^2)`. Where blocks of the
//!    strategies with a CPU share (`cpu`, `hybrid`) exist, the CPU share's serving slowdown
//!    ([`PerfParams::cpu_serving_slowdown`]) is fitted with their overheads: the value in
//!    [[`MIN_FIT_SERVING_SLOWDOWN`], [`MAX_FIT_SERVING_SLOWDOWN`]] whose overheads (the
//!    medians at that value) give the least mean absolute relative residual over those
//!    blocks (a scan of [`SLOWDOWN_SCAN_POINTS`] values, then golden-section refinement);
//!    its standard error is the one-parameter least-squares one, `s / sqrt(sum j^2)` with
//!    `j` the derivative of the relative residuals over it. The overhead is a constant per
//!    layer; the slowdown grows with the CPU share's experts and bytes, which is what
//!    separates them (blocks at 1 and 4 streams). All of this uses the blocks that ran at
//!    the serving threads ([`StepSample::threads`]). Blocks at another count fit the
//!    slowdown there ([`PerfParams::cpu_serving_slowdown_at`]): one parameter, the same scan
//!    and refinement, the overheads held at the serving count's, the blocks predicted with
//!    the parameters re-expressed at their count (and the `cpu-step` rate measured there).
//!    The run noise is the relative standard deviation of the calibration residuals that
//!    remain, every count's.

use argmin::core::{CostFunction, Executor, State};
use argmin::solver::neldermead::NelderMead;
use serde::{Deserialize, Serialize};
use statrs::distribution::{ContinuousCDF, StudentsT};
use statrs::statistics::{Data, Median};

use super::cost::ExpertShape;
use super::linalg::spd_inverse;
use super::step::{LayerCounts, StepShape};
use super::{ParamCovariance, ParamId, PerfModel, PerfParams, ThreadSlowdown};
use crate::error::{ModelError, Result};
use crate::preset::DenseSpec;
use crate::schedule::LayerWork;
use crate::strategy::StrategyKind;

/// One `gather` probe measurement (module docs).
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct GatherSample {
    /// Experts gathered in the layer.
    pub experts: u32,
    /// Bytes of each expert.
    pub expert_bytes: f64,
    /// Threads of the CPU kernel running throughout; `None` for the isolated probe.
    #[serde(default)]
    pub contended_cpu_threads: Option<u32>,
    /// Measured time, in us.
    pub time_us: f64,
}

/// One `cpu-step` probe measurement (module docs).
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CpuStepSample {
    /// Experts of the step.
    pub experts: u32,
    /// Tokens routed to each expert.
    pub tokens_per_expert: u32,
    /// Bytes of each expert.
    pub expert_bytes: f64,
    /// Multiply-accumulates of one token through one expert.
    pub expert_macs: f64,
    /// Threads of the pool.
    pub threads: u32,
    /// True when a gather ran throughout.
    #[serde(default)]
    pub contended: bool,
    /// Measured time, in us.
    pub time_us: f64,
}

/// One `gpu-experts` probe measurement (module docs).
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct GpuExpertSample {
    /// Experts of the launch.
    pub experts: u32,
    /// Tokens routed to each expert.
    pub tokens_per_expert: u32,
    /// Bytes of each expert.
    pub expert_bytes: f64,
    /// Multiply-accumulates of one token through one expert.
    pub expert_macs: f64,
    /// Measured time, in us.
    pub time_us: f64,
}

/// One `dense` probe measurement (module docs).
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DenseSample {
    /// Streams.
    pub streams: u32,
    /// Context of each stream, in tokens.
    pub context: u32,
    /// The dense part measured.
    pub dense: DenseSpec,
    /// Measured time, in us.
    pub time_us: f64,
}

/// One `round-trip` probe measurement (module docs).
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RoundTripSample {
    /// Streams whose activations cross.
    pub streams: u32,
    /// Activation elements per stream.
    pub hidden: u32,
    /// Measured time, in us.
    pub time_us: f64,
}

/// One `host` measurement (module docs): the host thread's own time per layer (its
/// planning and submitting spans) over the layers of one calibration block of the `step`
/// probe, with the block's mean counts per layer.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct HostSample {
    /// Strategy of the block (for reports).
    pub strategy: StrategyKind,
    /// Streams of the block.
    pub streams: u32,
    /// Mean counts per layer.
    pub counts: LayerCounts,
    /// Mean host time per layer, in us.
    pub time_us: f64,
}

/// One `link` measurement (module docs): the link's busy time per layer over the layers
/// of one hybrid calibration block of the `step` probe that both gathered and computed on
/// the CPU, with the block's mean counts.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LinkSample {
    /// Streams of the block.
    pub streams: u32,
    /// Threads of the CPU pool; `None`: the serving threads.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub threads: Option<u32>,
    /// The routed expert.
    pub expert: ExpertShape,
    /// Mean counts per layer.
    pub counts: LayerCounts,
    /// Mean busy time of the link per layer, in us.
    pub time_us: f64,
}

/// Whether an end-to-end sample calibrates the model or only validates it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum SampleRole {
    /// Fitted (per-strategy overhead, run noise).
    #[default]
    Calibration,
    /// Never fitted; residuals reported.
    Validation,
}

/// One `step` probe measurement: a decode step end to end (module docs).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct StepSample {
    /// Strategy that ran.
    pub strategy: StrategyKind,
    /// Calibration or validation.
    #[serde(default)]
    pub role: SampleRole,
    /// The step's shape (expert, dense, streams, context).
    pub shape: StepShape,
    /// Counts of every layer, in order.
    pub layers: Vec<LayerCounts>,
    /// Measured step time, in us.
    pub time_us: f64,
    /// Threads of the CPU pool the step ran with; `None`: the serving threads (the fitted
    /// parameters' `cpu_threads`). Calibration blocks at another count fit the serving
    /// slowdown there ([`PerfParams::cpu_serving_slowdown_at`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub threads: Option<u32>,
}

impl StepSample {
    /// The threads the step ran with, under parameters serving `p.cpu_threads`.
    pub fn threads_under(&self, p: &PerfParams) -> u32 {
        self.threads.unwrap_or(p.cpu_threads)
    }
}

/// Every probe's samples.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ProbeSamples {
    /// `gather` samples, isolated and contended.
    pub gather: Vec<GatherSample>,
    /// `cpu-step` samples, isolated and contended.
    pub cpu_step: Vec<CpuStepSample>,
    /// `gpu-experts` samples.
    pub gpu_experts: Vec<GpuExpertSample>,
    /// `dense` samples.
    pub dense: Vec<DenseSample>,
    /// `round-trip` samples.
    pub round_trip: Vec<RoundTripSample>,
    /// `host` samples (from the `step` probe's calibration blocks with a CPU share).
    pub host: Vec<HostSample>,
    /// `link` samples (from the `step` probe's hybrid calibration blocks).
    pub link: Vec<LinkSample>,
    /// `step` samples.
    pub step: Vec<StepSample>,
}

/// Predicted time of a sample under `p`, in us.
pub trait Predict {
    /// Predicted time, in us.
    fn predict_us(&self, p: &PerfParams) -> f64;
    /// Measured time, in us.
    fn measured_us(&self) -> f64;
}

impl Predict for GatherSample {
    fn predict_us(&self, p: &PerfParams) -> f64 {
        let n = self.experts as f64;
        match self.contended_cpu_threads {
            Some(t) => p.gather_contended_us(n, self.expert_bytes, t as f64),
            None => p.gather_us(n, self.expert_bytes),
        }
    }
    fn measured_us(&self) -> f64 {
        self.time_us
    }
}

impl Predict for CpuStepSample {
    fn predict_us(&self, p: &PerfParams) -> f64 {
        let n = self.experts as f64;
        let tokens = n * self.tokens_per_expert as f64;
        let shape = ExpertShape {
            bytes: self.expert_bytes,
            macs: self.expert_macs,
        };
        if self.contended {
            p.cpu_step_contended_us(n, tokens, shape, self.threads as f64)
        } else {
            p.cpu_step_us(n, tokens, shape, self.threads as f64)
        }
    }
    fn measured_us(&self) -> f64 {
        self.time_us
    }
}

impl Predict for GpuExpertSample {
    fn predict_us(&self, p: &PerfParams) -> f64 {
        let n = self.experts as f64;
        let shape = ExpertShape {
            bytes: self.expert_bytes,
            macs: self.expert_macs,
        };
        p.gpu_experts_us(n, n * self.tokens_per_expert as f64, shape)
    }
    fn measured_us(&self) -> f64 {
        self.time_us
    }
}

impl Predict for DenseSample {
    fn predict_us(&self, p: &PerfParams) -> f64 {
        p.dense_us(&self.dense, self.streams as f64, self.context as f64)
    }
    fn measured_us(&self) -> f64 {
        self.time_us
    }
}

impl Predict for RoundTripSample {
    fn predict_us(&self, p: &PerfParams) -> f64 {
        p.sync_round_trip_us(self.streams as f64, self.hidden as f64)
    }
    fn measured_us(&self) -> f64 {
        self.time_us
    }
}

impl Predict for HostSample {
    fn predict_us(&self, p: &PerfParams) -> f64 {
        p.host_layer_us(&self.counts, self.streams as f64)
    }
    fn measured_us(&self) -> f64 {
        self.time_us
    }
}

impl Predict for LinkSample {
    /// The gather of [`PerfParams::overlapped`] under `p` re-expressed at the block's
    /// threads where they differ (as [`StepSample`]).
    fn predict_us(&self, p: &PerfParams) -> f64 {
        let t = self.threads.unwrap_or(p.cpu_threads);
        if t != p.cpu_threads {
            return self.predict_us(&p.at_threads(t));
        }
        let c = &self.counts;
        p.overlapped(c.fetched, c.cpu, c.cpu_tokens, self.expert, t as f64)
            .gather_us
    }
    fn measured_us(&self) -> f64 {
        self.time_us
    }
}

impl Predict for StepSample {
    /// Under `p` re-expressed at the step's threads along the thread laws
    /// ([`PerfParams::at_threads`]) where they differ; the fit passes parameters already
    /// at the step's count (with a rate measured there, as the profile's retarget does).
    fn predict_us(&self, p: &PerfParams) -> f64 {
        let t = self.threads_under(p);
        if t != p.cpu_threads {
            return self.predict_us(&p.at_threads(t));
        }
        let dense = p.dense_us(&self.shape.dense, self.shape.streams, self.shape.context);
        self.layers
            .iter()
            .map(|c| p.layer_time_with_dense(&self.shape, c, dense).total_us)
            .sum()
    }
    fn measured_us(&self) -> f64 {
        self.time_us
    }
}

/// Limits of the fit.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct FitConfig {
    /// Nelder-Mead iterations per stage and restart.
    pub max_iters: u64,
    /// Nelder-Mead's tolerance on the standard deviation of the simplex's costs (mean
    /// squared relative residual, dimensionless).
    pub sd_tolerance: f64,
    /// Relative size of the initial simplex in log parameters.
    pub initial_step: f64,
    /// Confidence of the reported parameter intervals.
    pub confidence: f64,
}

impl Default for FitConfig {
    /// 4000 iterations, tolerance 1e-18, a 10% simplex, 95% intervals.
    fn default() -> Self {
        FitConfig {
            max_iters: 4000,
            sd_tolerance: 1e-18,
            initial_step: 0.1,
            confidence: 0.95,
        }
    }
}

/// A fitted (or held) parameter.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ParamEstimate {
    /// The parameter.
    pub param: ParamId,
    /// Its value (in its unit).
    pub value: f64,
    /// Its standard error (0 when held at the prior).
    pub se: f64,
    /// Its interval at the fit's confidence.
    pub interval: [f64; 2],
    /// The stage that fitted it; `None` when held at the prior.
    pub stage: Option<String>,
}

/// How one stage of the fit went.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct StageReport {
    /// Stage name.
    pub name: String,
    /// Parameters fitted.
    pub fitted: Vec<ParamId>,
    /// Parameters the samples could not determine (held at the prior).
    pub held: Vec<ParamId>,
    /// Samples used.
    pub samples: usize,
    /// Residual degrees of freedom.
    pub dof: usize,
    /// Solver iterations (all restarts).
    pub iterations: u64,
    /// Why the solver stopped (last restart).
    pub termination: String,
    /// Root mean square relative residual at the optimum.
    pub rms_rel: f64,
}

/// One sample's residual.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Residual {
    /// The probe (`gather`, `cpu-step`, ...).
    pub probe: String,
    /// Index of the sample in its probe's list.
    pub index: usize,
    /// Measured time, in us.
    pub measured_us: f64,
    /// Predicted time, in us.
    pub predicted_us: f64,
    /// `(predicted - measured) / measured`.
    pub rel: f64,
}

/// The result of a fit.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct FitReport {
    /// The fitted parameters (the prior where not fitted).
    pub params: PerfParams,
    /// Covariance of the fitted parameters (block per stage).
    pub covariance: ParamCovariance,
    /// Every parameter with its standard error.
    pub estimates: Vec<ParamEstimate>,
    /// Stages in order.
    pub stages: Vec<StageReport>,
    /// Residuals of every fitted sample.
    pub residuals: Vec<Residual>,
    /// Residuals of the validation step samples (never fitted).
    pub validation: Vec<Residual>,
    /// Residual degrees of freedom over all stages.
    pub dof: usize,
}

impl FitReport {
    /// The estimate of one parameter.
    pub fn estimate(&self, id: ParamId) -> Option<&ParamEstimate> {
        self.estimates.iter().find(|e| e.param == id)
    }

    /// A model for prediction: the fitted parameters, their covariance over the prior's
    /// for what was not fitted.
    pub fn model(&self, prior: &ParamCovariance, source: &str) -> PerfModel {
        PerfModel {
            params: self.params.clone(),
            covariance: prior.overlay(&self.covariance),
            dof: Some(self.dof.max(1)),
            source: source.to_string(),
        }
    }
}

/// Relative residuals of a stage's samples under the parameters `theta` (log values of
/// `ids`) on top of `base`.
struct Stage<'a> {
    base: &'a PerfParams,
    ids: Vec<ParamId>,
    samples: Vec<&'a dyn Predict>,
}

impl Stage<'_> {
    fn params(&self, theta: &[f64]) -> PerfParams {
        let mut p = self.base.clone();
        for (id, t) in self.ids.iter().zip(theta) {
            p.set(*id, t.min(upper_log_bound(*id, self.base.get(*id))).exp());
        }
        p
    }

    fn residuals(&self, theta: &[f64]) -> Vec<f64> {
        let p = self.params(theta);
        self.samples
            .iter()
            .map(|s| (s.predict_us(&p) - s.measured_us()) / s.measured_us())
            .collect()
    }

    fn jacobian(&self, theta: &[f64]) -> Vec<Vec<f64>> {
        // Column j: d r / d theta_j.
        let h = 1e-6;
        (0..theta.len())
            .map(|j| {
                let mut up = theta.to_vec();
                let mut dn = theta.to_vec();
                up[j] += h;
                dn[j] -= h;
                let (ru, rd) = (self.residuals(&up), self.residuals(&dn));
                ru.iter()
                    .zip(&rd)
                    .map(|(a, b)| (a - b) / (2.0 * h))
                    .collect()
            })
            .collect()
    }
}

impl CostFunction for Stage<'_> {
    type Param = Vec<f64>;
    type Output = f64;

    fn cost(&self, theta: &Vec<f64>) -> std::result::Result<f64, argmin::core::Error> {
        let r = self.residuals(theta);
        let c = r.iter().map(|x| x * x).sum::<f64>() / r.len().max(1) as f64;
        Ok(if c.is_finite() { c } else { f64::MAX })
    }
}

/// Columns (of `cols`, in order) that add rank: Gram-Schmidt with a relative tolerance.
fn independent_columns(cols: &[Vec<f64>]) -> Vec<usize> {
    let mut basis: Vec<Vec<f64>> = Vec::new();
    let mut keep = Vec::new();
    for (j, c) in cols.iter().enumerate() {
        let norm0 = c.iter().map(|x| x * x).sum::<f64>().sqrt();
        if norm0 < 1e-12 {
            continue;
        }
        let mut v = c.clone();
        for b in &basis {
            let d: f64 = v.iter().zip(b).map(|(x, y)| x * y).sum();
            for (x, y) in v.iter_mut().zip(b) {
                *x -= d * y;
            }
        }
        let norm = v.iter().map(|x| x * x).sum::<f64>().sqrt();
        if norm > 1e-6 * norm0 {
            for x in &mut v {
                *x /= norm;
            }
            basis.push(v);
            keep.push(j);
        }
    }
    keep
}

fn fit_error(stage: &str, e: impl std::fmt::Display) -> ModelError {
    ModelError::invalid(format!("fit stage {stage}"), e.to_string())
}

struct StageOutcome {
    report: StageReport,
    covariance: ParamCovariance,
    estimates: Vec<ParamEstimate>,
}

/// Fit one stage in place on `params`.
fn run_stage(
    name: &'static str,
    params: &mut PerfParams,
    candidates: &[ParamId],
    samples: Vec<&dyn Predict>,
    config: &FitConfig,
) -> Result<Option<StageOutcome>> {
    if samples.is_empty() {
        return Ok(None);
    }
    for (i, s) in samples.iter().enumerate() {
        if !(s.measured_us().is_finite() && s.measured_us() > 0.0) {
            return Err(fit_error(
                name,
                format!(
                    "sample {i} has time {} us; times must be positive",
                    s.measured_us()
                ),
            ));
        }
    }
    // Which parameters the samples determine, at the start point.
    let mut base = params.clone();
    start_point(name, &mut base, &samples);
    let all = Stage {
        base: &base,
        ids: candidates.to_vec(),
        samples: samples.clone(),
    };
    let theta0: Vec<f64> = candidates
        .iter()
        .map(|id| base.get(*id).max(1e-12).ln())
        .collect();
    let keep = independent_columns(&all.jacobian(&theta0));
    let mut ids: Vec<ParamId> = keep.iter().map(|&j| candidates[j]).collect();
    // More parameters than samples cannot be fitted either.
    ids.truncate(samples.len());
    let held: Vec<ParamId> = candidates
        .iter()
        .copied()
        .filter(|c| !ids.contains(c))
        .collect();
    if ids.is_empty() {
        return Ok(None);
    }
    let stage = Stage {
        base: &base,
        ids: ids.clone(),
        samples,
    };
    let mut theta: Vec<f64> = ids.iter().map(|id| base.get(*id).max(1e-12).ln()).collect();
    let mut iterations = 0;
    let mut termination = String::new();
    for _restart in 0..2 {
        let mut simplex = vec![theta.clone()];
        for j in 0..theta.len() {
            let mut v = theta.clone();
            v[j] += config.initial_step;
            simplex.push(v);
        }
        let solver = NelderMead::new(simplex)
            .with_sd_tolerance(config.sd_tolerance)
            .map_err(|e| fit_error(name, e))?;
        let res = Executor::new(
            Stage {
                base: &base,
                ids: ids.clone(),
                samples: stage.samples.clone(),
            },
            solver,
        )
        .configure(|s| s.max_iters(config.max_iters))
        .run()
        .map_err(|e| fit_error(name, e))?;
        let st = res.state();
        iterations += st.get_iter();
        termination = st.get_termination_status().to_string();
        if let Some(best) = st.get_best_param() {
            theta = best.clone();
        }
    }
    // At the optimum a parameter may have left the region where the samples see it (no
    // contention observed at all): it keeps its fitted value but gets no standard error.
    let j_all = stage.jacobian(&theta);
    let seen = independent_columns(&j_all);
    let mut held = held;
    let unseen: Vec<ParamId> = (0..ids.len())
        .filter(|k| !seen.contains(k))
        .map(|k| ids[k])
        .collect();
    held.extend(unseen.iter().copied());
    let theta_all = theta.clone();
    let fitted = stage.params(&theta_all);
    let ids: Vec<ParamId> = seen.iter().map(|&k| ids[k]).collect();
    let theta: Vec<f64> = seen.iter().map(|&k| theta_all[k]).collect();
    let stage = Stage {
        base: &fitted,
        ids: ids.clone(),
        samples: stage.samples,
    };
    if ids.is_empty() {
        *params = fitted;
        return Ok(None);
    }
    let r = stage.residuals(&theta);
    let m = r.len();
    let p = ids.len();
    let dof = m.saturating_sub(p);
    let rss: f64 = r.iter().map(|x| x * x).sum();
    let s2 = if dof > 0 { rss / dof as f64 } else { 0.0 };
    let j = stage.jacobian(&theta);
    let mut jtj = vec![vec![0.0; p]; p];
    for a in 0..p {
        for b in 0..p {
            jtj[a][b] = j[a].iter().zip(&j[b]).map(|(x, y)| x * y).sum();
        }
    }
    let inv = spd_inverse(&jtj).ok_or_else(|| {
        fit_error(
            name,
            format!(
                "the samples do not determine {:?} together (singular J^T J)",
                ids
            ),
        )
    })?;
    // Covariance in the parameters' units: C_ab = v_a v_b s^2 inv_ab (delta method).
    let values: Vec<f64> = ids.iter().map(|id| fitted.get(*id)).collect();
    let mut cov = vec![vec![0.0; p]; p];
    for a in 0..p {
        for b in 0..p {
            cov[a][b] = values[a] * values[b] * s2 * inv[a][b];
        }
    }
    let q = t_quantile(config.confidence, dof);
    let estimates = ids
        .iter()
        .enumerate()
        .map(|(i, id)| {
            let se = cov[i][i].max(0.0).sqrt();
            ParamEstimate {
                param: *id,
                value: values[i],
                se,
                interval: [values[i] - q * se, values[i] + q * se],
                stage: Some(name.to_string()),
            }
        })
        .collect();
    *params = fitted;
    Ok(Some(StageOutcome {
        report: StageReport {
            name: name.to_string(),
            fitted: ids.clone(),
            held,
            samples: m,
            dof,
            iterations,
            termination,
            rms_rel: (rss / m.max(1) as f64).sqrt(),
        },
        covariance: ParamCovariance {
            params: ids,
            matrix: cov,
        },
        estimates,
    }))
}

/// Move the start of a stage where its samples can see every parameter: the contention
/// stage starts with DRAM short of the summed demand of its samples (the shares have no
/// gradient where nothing contends).
/// The host stage starts from half the mean measured time per layer and 1 us per expert
/// and stream where the prior has no host term (a zero has no log).
/// The dense stage starts from the straight line through its samples ([`linear_start`]).
fn start_point(name: &str, p: &mut PerfParams, samples: &[&dyn Predict]) {
    if name == "dense" {
        linear_start(p, samples, ParamId::DenseHbmGbs, ParamId::DenseLayerUs);
    }
    if name == "contention" && !samples.is_empty() {
        let demand = p.cpu_gbs + p.gather_gbs;
        if p.dram_gbs >= demand {
            p.dram_gbs = CONTENTION_START * demand;
        }
    }
    if name == "link" && !samples.is_empty() && p.link_serving_slowdown <= 0.0 {
        p.link_serving_slowdown = LINK_SLOWDOWN_START;
    }
    if name == "host" && !samples.is_empty() {
        let mean = samples.iter().map(|s| s.measured_us()).sum::<f64>() / samples.len() as f64;
        let h = &mut p.host;
        if h.layer_us <= 0.0 {
            h.layer_us = 0.5 * mean;
        }
        for v in [&mut h.expert_us, &mut h.cpu_expert_us, &mut h.stream_us] {
            if *v <= 0.0 {
                *v = HOST_START_US;
            }
        }
    }
}

/// Start a stage whose samples are linear in a fixed cost and a rate's bytes (`time = fixed
/// + bytes / rate + terms of neither`) at the least-squares line through them: a start far
/// from the data (a prior with no fixed cost, whose zero has no log; a rate so high that its
/// bytes cost nothing) leaves the stage no gradient to follow. The bytes and the other terms
/// of each sample are read off the samples' own predictions at two rates with the fixed
/// cost at zero, so any sample type of such a form works. Keeps `p` where the line does not
/// rise with the bytes; a fixed cost at or below zero starts at [`LINEAR_START_MIN_FIXED_US`].
fn linear_start(p: &mut PerfParams, samples: &[&dyn Predict], rate: ParamId, fixed: ParamId) {
    let r0 = p.get(rate);
    if samples.len() < 2 || !(r0.is_finite() && r0 > 0.0) {
        return;
    }
    let (mut at_r0, mut at_2r0) = (p.clone(), p.clone());
    at_r0.set(fixed, 0.0);
    at_2r0.set(fixed, 0.0);
    at_2r0.set(rate, 2.0 * r0);
    // u: the bytes' time at r0; y: what is left of the measurement for fixed + bytes.
    let (mut u, mut y) = (Vec::new(), Vec::new());
    for s in samples {
        let (a, b) = (s.predict_us(&at_r0), s.predict_us(&at_2r0));
        let bytes_us = 2.0 * (a - b);
        u.push(bytes_us);
        y.push(s.measured_us() - (a - bytes_us));
    }
    let n = u.len() as f64;
    let (mu, my) = (u.iter().sum::<f64>() / n, y.iter().sum::<f64>() / n);
    let sxx: f64 = u.iter().map(|x| (x - mu).powi(2)).sum();
    let sxy: f64 = u.iter().zip(&y).map(|(x, v)| (x - mu) * (v - my)).sum();
    if !(sxx > 0.0 && sxy > 0.0) {
        return;
    }
    let slope = sxy / sxx; // measured time per us of bytes at r0: the rate is r0 / slope
    p.set(rate, r0 / slope);
    p.set(fixed, (my - slope * mu).max(LINEAR_START_MIN_FIXED_US));
}

/// Where [`linear_start`] starts a fixed cost its line puts at or below zero, in us.
const LINEAR_START_MIN_FIXED_US: f64 = 0.1;

/// Where the host stage starts a per-expert or per-stream cost the prior has at zero, in us.
const HOST_START_US: f64 = 1.0;

/// Where the link stage starts a serving slowdown the prior has at zero (it is fitted in
/// log space, so the fit keeps it positive: a link never faster than its contended probe).
const LINK_SLOWDOWN_START: f64 = 0.05;

/// How far above its start a fitted parameter may go: a factor of 100.
///
/// Samples that no longer see a parameter (a kernel whose time does not grow with its bytes)
/// would let least squares drive it to infinity (an "infinitely fast" bandwidth, 1e49 GB/s
/// was seen). A hundredfold of a prior from the host's specification is past any physical
/// value and far enough that the bound never binds a parameter the samples do determine; a
/// parameter that ends at it has no gradient, so it is reported as held, without an error.
const MAX_FIT_FACTOR: f64 = 100.0;

/// Smallest start value the bound is taken from, so a zero prior does not pin a parameter.
const MIN_BOUND_BASE: f64 = 1e-3;

/// The log of the largest value the fit may give `id` from the start value `start`:
/// [`MAX_FIT_FACTOR`] times it, except the thread exponent, whose valid range ends at 1
/// (linear scaling; [`PerfParams::validate`] refuses more). On the H200 a noisy probe once
/// fitted 1.007, and the whole probe failed; at the bound the exponent has no gradient and
/// is reported as held, like any parameter at its bound.
fn upper_log_bound(id: ParamId, start: f64) -> f64 {
    if id == ParamId::CpuThreadExponent {
        return 0.0;
    }
    (start.max(MIN_BOUND_BASE) * MAX_FIT_FACTOR).ln()
}

/// Where the contention stage starts when the prior's DRAM bandwidth would not contend:
/// this share of the two sides' summed demand.
const CONTENTION_START: f64 = 0.8;

fn t_quantile(confidence: f64, dof: usize) -> f64 {
    let p = 0.5 + confidence / 2.0;
    StudentsT::new(0.0, 1.0, dof.max(1) as f64)
        .map(|t| t.inverse_cdf(p))
        .unwrap_or(1.96)
}

fn residuals_of<T: Predict>(
    probe: &'static str,
    samples: &[T],
    p: &PerfParams,
    out: &mut Vec<Residual>,
) {
    for (index, s) in samples.iter().enumerate() {
        let predicted_us = s.predict_us(p);
        out.push(Residual {
            probe: probe.to_string(),
            index,
            measured_us: s.measured_us(),
            predicted_us,
            rel: (predicted_us - s.measured_us()) / s.measured_us(),
        });
    }
}

/// The work whose fixed cost the calibration blocks of `kind` fit: the work its layers do
/// (offload's gather, hybrid's gather and CPU share, resident's GPU compute, cpu's CPU
/// share). Layer split mixes two kinds of work in one step and is not a calibration
/// strategy: its layers take the costs the others fit.
fn calibrated_work(kind: StrategyKind) -> Option<LayerWork> {
    match kind {
        StrategyKind::Offload => Some(LayerWork::Gather),
        StrategyKind::Hybrid => Some(LayerWork::GatherAndCpuShare),
        StrategyKind::Resident => Some(LayerWork::GpuOnly),
        StrategyKind::Cpu => Some(LayerWork::CpuShare),
        StrategyKind::LayerSplit | StrategyKind::LayerSplitCached => None,
    }
}

/// The parameter of `work`'s fixed cost.
fn overhead_id(work: LayerWork) -> ParamId {
    match work {
        LayerWork::Gather => ParamId::OverheadOffloadUs,
        LayerWork::GatherAndCpuShare => ParamId::OverheadHybridUs,
        LayerWork::GpuOnly => ParamId::OverheadResidentUs,
        LayerWork::CpuShare => ParamId::OverheadCpuUs,
    }
}

/// The fixed cost of `work` from the calibration blocks `mine` of the strategy that does it
/// (set on `p` too), in us per layer: the median of the per-layer residuals, not the
/// least-squares mean: one slow block (the first after a strategy switch ran 65% over the
/// others on the H200, 2026-12-04) must not set the overhead of every layer of every
/// prediction. A fixed cost is not negative: the sum of absolute residuals is convex in it,
/// so its minimum over costs >= 0 is the median where that is >= 0, else 0.
fn median_overhead(p: &mut PerfParams, work: LayerWork, mine: &[&&StepSample]) -> f64 {
    p.overhead.set(work, 0.0);
    let per_layer: Vec<f64> = mine
        .iter()
        .map(|s| (s.time_us - s.predict_us(p)) / s.layers.len() as f64)
        .collect();
    // statrs' median: the middle value, the mean of the middle two for an even count.
    let o = Data::new(per_layer).median().max(0.0);
    p.overhead.set(work, o);
    o
}

/// The least serving slowdown the fit considers (dimensionless): a CPU share streaming
/// twice as fast in a decode step as in the isolated probe of the same call would be a
/// broken probe, not a property of serving.
pub const MIN_FIT_SERVING_SLOWDOWN: f64 = -0.5;

/// The largest serving slowdown the fit considers (dimensionless): a CPU share four times
/// slower in a decode step than in the isolated probe would be a broken probe too.
pub const MAX_FIT_SERVING_SLOWDOWN: f64 = 3.0;

/// Points of the serving slowdown's scan over its range (a step of 0.01 before the
/// refinement): the objective (a mean absolute residual through a median and a max) is not
/// smooth, so a local search alone could stop at a kink.
pub const SLOWDOWN_SCAN_POINTS: usize = 351;

/// Most golden-section steps of the refinement around the scan's best point (the bracket of
/// two scan steps shrinks by 0.618 each: to about 1e-9 of the range).
const SLOWDOWN_REFINE_STEPS: usize = 40;

/// Mean absolute relative residual of the calibration blocks `blocks` (grouped by strategy)
/// when the serving slowdown is `x` and every group's overhead is its median at `x`.
fn slowdown_objective(p: &PerfParams, blocks: &[(LayerWork, Vec<&&StepSample>)], x: f64) -> f64 {
    let mut q = p.clone();
    q.cpu_serving_slowdown = x;
    let mut sum = 0.0;
    let mut n = 0usize;
    for (work, mine) in blocks {
        median_overhead(&mut q, *work, mine);
        for s in mine {
            sum += ((s.predict_us(&q) - s.time_us) / s.time_us).abs();
            n += 1;
        }
    }
    sum / n.max(1) as f64
}

/// The CPU share's serving slowdown from the calibration blocks (module docs, stage 6), or
/// `None` where no calibration block has a CPU share or the blocks do not determine it
/// (the slowdown then keeps the prior's value).
fn fit_serving_slowdown(p: &PerfParams, calibration: &[&StepSample]) -> Option<Slowdown> {
    let has_cpu = |s: &StepSample| s.layers.iter().any(|c| c.cpu > 0.0);
    let blocks: Vec<(LayerWork, Vec<&&StepSample>)> = StrategyKind::ALL
        .into_iter()
        .filter_map(|k| {
            Some((
                calibrated_work(k)?,
                calibration
                    .iter()
                    .filter(|s| s.strategy == k)
                    .collect::<Vec<_>>(),
            ))
        })
        .filter(|(_, mine)| mine.iter().any(|s| has_cpu(s)))
        .collect();
    if blocks.is_empty() {
        return None;
    }
    let f = |x: f64| slowdown_objective(p, &blocks, x);
    let best = scan_and_refine(&f, MIN_FIT_SERVING_SLOWDOWN, MAX_FIT_SERVING_SLOWDOWN);
    // Standard error: least squares of the relative residuals over the slowdown and the
    // overheads of its strategies together (they trade off: a constant per layer takes
    // what the slowdown leaves where the blocks' CPU shares are alike).
    let mut q = p.clone();
    q.cpu_serving_slowdown = best;
    for (work, mine) in &blocks {
        median_overhead(&mut q, *work, mine);
    }
    let h = 1e-4;
    let rel = |q: &PerfParams, s: &StepSample| (s.predict_us(q) - s.time_us) / s.time_us;
    let k = 1 + blocks.len();
    let mut jtj = vec![vec![0.0; k]; k];
    let (mut rss, mut m) = (0.0, 0usize);
    for (g, (_, mine)) in blocks.iter().enumerate() {
        for s in mine {
            let mut up = q.clone();
            up.cpu_serving_slowdown += h;
            let mut dn = q.clone();
            dn.cpu_serving_slowdown -= h;
            // d rel / d slowdown; d rel / d overhead = layers / measured for its strategy.
            let mut j = vec![0.0; k];
            j[0] = (rel(&up, s) - rel(&dn, s)) / (2.0 * h);
            j[1 + g] = s.layers.len() as f64 / s.time_us;
            for a in 0..k {
                for b in 0..k {
                    jtj[a][b] += j[a] * j[b];
                }
            }
            rss += rel(&q, s).powi(2);
            m += 1;
        }
    }
    let dof = m.saturating_sub(k);
    // Blocks that cannot see the slowdown (no CPU share on a critical path) or cannot
    // separate it from the overheads leave it at the prior, like any parameter a stage
    // cannot determine.
    let inv = spd_inverse(&jtj)
        .filter(|inv| dof > 0 && jtj[0][0] > 0.0 && (0..k).all(|i| inv[i][i] > 0.0))?;
    let s2 = rss / dof as f64;
    let se = (s2 * inv[0][0]).sqrt();
    let overhead_se = blocks
        .iter()
        .enumerate()
        .map(|(g, (work, _))| (*work, (s2 * inv[1 + g][1 + g]).sqrt()))
        .collect();
    Some(Slowdown {
        value: best,
        se,
        dof,
        overhead_se,
    })
}

/// `p` re-expressed at `threads` for the step samples run there: the thread laws
/// ([`PerfParams::at_threads`]), and the streaming rate measured at that count where the
/// `cpu-step` probe ran there ([`crate::profile::cpu_rate_at_threads`]), as
/// [`crate::profile::Profile::at_threads`] does, so that what the fit sees at a count is what
/// a prediction at that count uses.
fn params_at(p: &PerfParams, threads: u32, cpu_step: &[CpuStepSample]) -> PerfParams {
    if threads == p.cpu_threads {
        return p.clone();
    }
    crate::profile::params_at_threads(p, cpu_step, threads).0
}

/// The serving slowdown at `threads` from that count's calibration blocks `blocks` with a
/// CPU share, every other parameter (the overheads included) as the serving count fitted
/// them: the value in [[`MIN_FIT_SERVING_SLOWDOWN`], [`MAX_FIT_SERVING_SLOWDOWN`]] with the
/// least mean absolute relative residual (scan, then golden section, as for the serving
/// count), its standard error the one-parameter least-squares one. `None` where the blocks
/// do not determine it (no block, or no sensitivity).
fn fit_slowdown_at(
    p: &PerfParams,
    threads: u32,
    blocks: &[&StepSample],
    cpu_step: &[CpuStepSample],
) -> Option<ThreadSlowdown> {
    let base = params_at(p, threads, cpu_step);
    let with = |x: f64| {
        let mut q = base.clone();
        q.cpu_serving_slowdown = x;
        q
    };
    let rel = |q: &PerfParams, s: &StepSample| (s.predict_us(q) - s.time_us) / s.time_us;
    let f = |x: f64| {
        let q = with(x);
        blocks.iter().map(|s| rel(&q, s).abs()).sum::<f64>() / blocks.len().max(1) as f64
    };
    if blocks.is_empty() {
        return None;
    }
    let value = scan_and_refine(&f, MIN_FIT_SERVING_SLOWDOWN, MAX_FIT_SERVING_SLOWDOWN);
    let (q, h) = (with(value), 1e-4);
    let (up, dn) = (with(value + h), with(value - h));
    let mut sjj = 0.0;
    let mut rss = 0.0;
    for s in blocks {
        let j = (rel(&up, s) - rel(&dn, s)) / (2.0 * h);
        sjj += j * j;
        rss += rel(&q, s).powi(2);
    }
    let dof = blocks.len().saturating_sub(1);
    if sjj.is_nan() || sjj <= 0.0 || dof == 0 {
        return None;
    }
    Some(ThreadSlowdown {
        threads,
        slowdown: value,
        se: (rss / dof as f64 / sjj).sqrt(),
    })
}

/// The minimiser of `f` over `[lo, hi]`: the best of [`SLOWDOWN_SCAN_POINTS`] evenly spaced
/// values (0 included, so a flat objective keeps no slowdown), then argmin's golden-section
/// search (at most [`SLOWDOWN_REFINE_STEPS`] steps) within one scan step of it; the scan's
/// point stands where the search finds nothing lower.
fn scan_and_refine(f: &dyn Fn(f64) -> f64, lo: f64, hi: f64) -> f64 {
    let step = (hi - lo) / (SLOWDOWN_SCAN_POINTS - 1) as f64;
    let (mut best, mut best_cost) = (0.0, f(0.0));
    for i in 0..SLOWDOWN_SCAN_POINTS {
        let x = lo + i as f64 * step;
        let c = f(x);
        if c < best_cost {
            (best, best_cost) = (x, c);
        }
    }
    let (a, b) = ((best - step).max(lo), (best + step).min(hi));
    match golden_section(f, a, b) {
        Some((x, c)) if c < best_cost => x,
        _ => best,
    }
}

/// Relative width of the bracket at which the golden-section search stops (about 1e-9 of
/// a bracket near 1, where the step budget also ends).
const SLOWDOWN_REFINE_TOLERANCE: f64 = 1e-10;

/// A one-dimensional objective as an argmin cost function.
struct Objective<'a>(&'a dyn Fn(f64) -> f64);

impl CostFunction for Objective<'_> {
    type Param = f64;
    type Output = f64;

    fn cost(&self, x: &f64) -> std::result::Result<f64, argmin::core::Error> {
        Ok((self.0)(*x))
    }
}

/// argmin's golden-section search for the minimum of `f` on `[a, b]` from its middle: the
/// best point and its cost, `None` for an empty bracket or a solver error.
fn golden_section(f: &dyn Fn(f64) -> f64, a: f64, b: f64) -> Option<(f64, f64)> {
    use argmin::solver::goldensectionsearch::GoldenSectionSearch;
    let solver = GoldenSectionSearch::new(a, b)
        .ok()?
        .with_tolerance(SLOWDOWN_REFINE_TOLERANCE)
        .ok()?;
    let res = Executor::new(Objective(f), solver)
        .configure(|s| {
            s.param((a + b) / 2.0)
                .max_iters(SLOWDOWN_REFINE_STEPS as u64)
        })
        .run()
        .ok()?;
    let state = res.state();
    Some((*state.get_best_param()?, state.get_best_cost()))
}

/// The fitted serving slowdown (see [`fit_serving_slowdown`]).
struct Slowdown {
    /// Its value, dimensionless.
    value: f64,
    /// Its standard error, dimensionless.
    se: f64,
    /// Residual degrees of freedom of the blocks it was fitted to.
    dof: usize,
    /// The standard error of each strategy's overhead fitted with it (empty where the
    /// blocks did not determine them together), in us per layer.
    overhead_se: Vec<(LayerWork, f64)>,
}

/// Fit parameters to probe samples, starting from `prior` (module docs).
pub fn fit(samples: &ProbeSamples, prior: &PerfParams, config: &FitConfig) -> Result<FitReport> {
    prior.validate()?;
    let mut params = prior.clone();
    let mut outcomes: Vec<StageOutcome> = Vec::new();

    let iso_gather: Vec<&dyn Predict> = samples
        .gather
        .iter()
        .filter(|s| s.contended_cpu_threads.is_none())
        .map(|s| s as &dyn Predict)
        .collect();
    let iso_cpu: Vec<&dyn Predict> = samples
        .cpu_step
        .iter()
        .filter(|s| !s.contended)
        .map(|s| s as &dyn Predict)
        .collect();
    let gpu: Vec<&dyn Predict> = samples
        .gpu_experts
        .iter()
        .map(|s| s as &dyn Predict)
        .collect();
    let dense: Vec<&dyn Predict> = samples.dense.iter().map(|s| s as &dyn Predict).collect();
    let sync: Vec<&dyn Predict> = samples
        .round_trip
        .iter()
        .map(|s| s as &dyn Predict)
        .collect();
    let host: Vec<&dyn Predict> = samples.host.iter().map(|s| s as &dyn Predict).collect();
    let contended: Vec<&dyn Predict> = samples
        .gather
        .iter()
        .filter(|s| s.contended_cpu_threads.is_some())
        .map(|s| s as &dyn Predict)
        .chain(
            samples
                .cpu_step
                .iter()
                .filter(|s| s.contended)
                .map(|s| s as &dyn Predict),
        )
        .collect();

    let stages: [(&'static str, &[ParamId], Vec<&dyn Predict>); 7] = [
        (
            "gather",
            &[
                ParamId::GatherGbs,
                ParamId::GatherLayerUs,
                ParamId::GatherCopyUs,
            ],
            iso_gather,
        ),
        (
            "cpu-step",
            &[
                ParamId::CpuGbs,
                ParamId::CpuLayerUs,
                ParamId::CpuExpertUs,
                ParamId::CpuTokenGmacs,
                ParamId::CpuThreadExponent,
            ],
            iso_cpu,
        ),
        (
            "gpu-experts",
            &[
                ParamId::GpuHbmGbs,
                ParamId::GpuLaunchUs,
                ParamId::GpuTokenGmacs,
            ],
            gpu,
        ),
        (
            "dense",
            &[ParamId::DenseHbmGbs, ParamId::DenseLayerUs],
            dense,
        ),
        ("round-trip", &[ParamId::SyncUs], sync),
        (
            "contention",
            &[ParamId::DramGbs, ParamId::DmaDramWeight],
            contended,
        ),
        (
            "host",
            &[
                ParamId::HostLayerUs,
                ParamId::HostExpertUs,
                ParamId::HostCpuExpertUs,
                ParamId::HostStreamUs,
            ],
            host,
        ),
    ];
    for (name, ids, s) in stages {
        if let Some(o) = run_stage(name, &mut params, ids, s, config)? {
            outcomes.push(o);
        }
    }

    // Stage 6: per-strategy overheads from the calibration steps at the serving threads (the
    // median per-layer residual of the blocks: robust to one slow block), the slowdown
    // with them; then the slowdown at every other count the blocks ran at.
    let serving = params.cpu_threads;
    let calibration: Vec<&StepSample> = samples
        .step
        .iter()
        .filter(|s| s.role == SampleRole::Calibration && s.threads_under(&params) == serving)
        .collect();
    let mut other_counts: Vec<u32> = samples
        .step
        .iter()
        .filter(|s| s.role == SampleRole::Calibration)
        .map(|s| s.threads_under(&params))
        .filter(|&t| t != serving)
        .collect();
    other_counts.sort_unstable();
    other_counts.dedup();
    for s in &samples.step {
        if !(s.time_us.is_finite() && s.time_us > 0.0) || s.layers.is_empty() {
            return Err(fit_error(
                "step",
                format!(
                    "a {} sample has time {} us and {} layers",
                    s.strategy,
                    s.time_us,
                    s.layers.len()
                ),
            ));
        }
    }
    // The link's serving slowdown (stage `link`): its samples' gathers overlap a decode
    // layer's CPU share, whose length is the serving slowdown's, so a first estimate of that
    // comes before (from the blocks, without the link's), and the final one after.
    let link: Vec<&dyn Predict> = samples
        .link
        .iter()
        .filter(|s| s.threads.is_none_or(|t| t == serving))
        .map(|s| s as &dyn Predict)
        .collect();
    if !link.is_empty() {
        let mut first = params.clone();
        if let Some(sd) = fit_serving_slowdown(&first, &calibration) {
            first.cpu_serving_slowdown = sd.value;
        }
        if let Some(o) = run_stage(
            "link",
            &mut first,
            &[ParamId::LinkServingSlowdown],
            link,
            config,
        )? {
            outcomes.push(o);
        }
        params.link_serving_slowdown = first.link_serving_slowdown;
    }
    let mut step_ids = Vec::new();
    let mut step_est = Vec::new();
    let mut step_var = Vec::new();
    let slowdown = fit_serving_slowdown(&params, &calibration);
    if let Some(sd) = &slowdown {
        params.cpu_serving_slowdown = sd.value;
        step_ids.push(ParamId::CpuServingSlowdown);
        step_est.push((sd.value, sd.se, sd.dof));
        step_var.push(sd.se * sd.se);
    }
    for kind in StrategyKind::ALL {
        let Some(work) = calibrated_work(kind) else {
            continue;
        };
        let mine: Vec<&&StepSample> = calibration.iter().filter(|s| s.strategy == kind).collect();
        if mine.is_empty() {
            continue;
        }
        let mut base = params.clone();
        let o = median_overhead(&mut base, work, &mine);
        let den: f64 = mine.iter().map(|s| (s.layers.len() as f64).powi(2)).sum();
        let n = mine.len();
        let rss: f64 = mine
            .iter()
            .map(|s| (s.time_us - s.predict_us(&base)).powi(2))
            .sum();
        // An overhead fitted with the slowdown has the joint fit's standard error (it
        // trades off with the slowdown), the others the one-parameter one.
        let joint = slowdown
            .as_ref()
            .and_then(|sd| sd.overhead_se.iter().find(|(w, _)| *w == work))
            .map(|(_, se)| *se);
        let se = if let Some(se) = joint {
            se
        } else if n > 1 {
            (rss / (n - 1) as f64 / den).sqrt()
        } else {
            super::PRIOR_SE_OVERHEAD_US
        };
        params.overhead.set(work, o);
        step_ids.push(overhead_id(work));
        step_est.push((o, se, n.saturating_sub(1)));
        step_var.push(se * se);
    }
    params.cpu_serving_slowdown_at.clear();
    for &t in &other_counts {
        let mine: Vec<&StepSample> = samples
            .step
            .iter()
            .filter(|s| {
                s.role == SampleRole::Calibration
                    && s.threads_under(&params) == t
                    && s.layers.iter().any(|c| c.cpu > 0.0)
            })
            .collect();
        if let Some(k) = fit_slowdown_at(&params, t, &mine, &samples.cpu_step) {
            params.cpu_serving_slowdown_at.push(k);
        }
    }
    // Every step sample predicted at its own count (the slowdowns just fitted included).
    let step_predicted: Vec<f64> = samples
        .step
        .iter()
        .map(|s| {
            s.predict_us(&params_at(
                &params,
                s.threads_under(&params),
                &samples.cpu_step,
            ))
        })
        .collect();
    let all_calibration: Vec<usize> = (0..samples.step.len())
        .filter(|&i| samples.step[i].role == SampleRole::Calibration)
        .collect();
    if all_calibration.len() >= 3 {
        let rel: Vec<f64> = all_calibration
            .iter()
            .map(|&i| (step_predicted[i] - samples.step[i].time_us) / samples.step[i].time_us)
            .collect();
        let n = all_calibration.len();
        let fitted = step_ids.len() + params.cpu_serving_slowdown_at.len();
        let dof = n - fitted.min(n - 1);
        params.run_noise_rel = (rel.iter().map(|x| x * x).sum::<f64>() / dof as f64).sqrt();
    }
    params.validate()?;

    // Assemble.
    let mut covariance = ParamCovariance::none();
    let mut estimates = Vec::new();
    let mut stages_out = Vec::new();
    let mut dof = 0;
    for o in outcomes {
        covariance = covariance.overlay(&o.covariance);
        estimates.extend(o.estimates);
        dof += o.report.dof;
        stages_out.push(o.report);
    }
    if !step_ids.is_empty() {
        covariance = covariance.overlay(&ParamCovariance::diagonal(
            step_ids.clone(),
            &step_var.iter().map(|v: &f64| v.sqrt()).collect::<Vec<_>>(),
        ));
        let mut stage_dof = 0;
        for (id, (o, se, d)) in step_ids.iter().zip(&step_est) {
            let q = t_quantile(config.confidence, *d);
            estimates.push(ParamEstimate {
                param: *id,
                value: *o,
                se: *se,
                interval: [o - q * se, o + q * se],
                stage: Some("step".to_string()),
            });
            stage_dof += d;
        }
        dof += stage_dof;
        stages_out.push(StageReport {
            name: "step".to_string(),
            fitted: step_ids.clone(),
            held: Vec::new(),
            samples: all_calibration.len(),
            dof: stage_dof,
            iterations: 1,
            termination: format!(
                "medians (overheads), scan and golden section (slowdown at {serving} threads{})",
                params
                    .cpu_serving_slowdown_at
                    .iter()
                    .map(|k| format!(", and at {}: {:.3} +- {:.3}", k.threads, k.slowdown, k.se))
                    .collect::<String>()
            ),
            rms_rel: (all_calibration
                .iter()
                .map(|&i| {
                    ((step_predicted[i] - samples.step[i].time_us) / samples.step[i].time_us)
                        .powi(2)
                })
                .sum::<f64>()
                / all_calibration.len().max(1) as f64)
                .sqrt(),
        });
    }
    for id in ParamId::ALL {
        if !estimates.iter().any(|e| e.param == id) {
            let v = params.get(id);
            estimates.push(ParamEstimate {
                param: id,
                value: v,
                se: 0.0,
                interval: [v, v],
                stage: None,
            });
        }
    }
    estimates.sort_by_key(|e| ParamId::ALL.iter().position(|p| *p == e.param));

    let mut residuals = Vec::new();
    residuals_of("gather", &samples.gather, &params, &mut residuals);
    residuals_of("cpu-step", &samples.cpu_step, &params, &mut residuals);
    residuals_of("gpu-experts", &samples.gpu_experts, &params, &mut residuals);
    residuals_of("dense", &samples.dense, &params, &mut residuals);
    residuals_of("round-trip", &samples.round_trip, &params, &mut residuals);
    residuals_of("host", &samples.host, &params, &mut residuals);
    residuals_of("link", &samples.link, &params, &mut residuals);
    let step_res: Vec<Residual> = samples
        .step
        .iter()
        .zip(&step_predicted)
        .enumerate()
        .map(|(index, (s, &predicted_us))| Residual {
            probe: "step".to_string(),
            index,
            measured_us: s.time_us,
            predicted_us,
            rel: (predicted_us - s.time_us) / s.time_us,
        })
        .collect();
    let (validation, calib): (Vec<Residual>, Vec<Residual>) = step_res
        .into_iter()
        .partition(|r| samples.step[r.index].role == SampleRole::Validation);
    residuals.extend(calib);

    Ok(FitReport {
        params,
        covariance,
        estimates,
        stages: stages_out,
        residuals,
        validation,
        dof,
    })
}

#[cfg(test)]
mod tests {
    /// The hand-written golden section argmin's replaced: `steps` steps on `[a, b]`, then the
    /// bracket's middle. The reference of [`golden_section`].
    fn reference_golden(f: &dyn Fn(f64) -> f64, mut a: f64, mut b: f64, steps: usize) -> f64 {
        let g = (5f64.sqrt() - 1.0) / 2.0;
        for _ in 0..steps {
            let (x1, x2) = (b - g * (b - a), a + g * (b - a));
            if f(x1) <= f(x2) {
                b = x2;
            } else {
                a = x1;
            }
        }
        (a + b) / 2.0
    }

    #[test]
    fn argmins_golden_section_finds_the_hand_written_minimum() {
        // Smooth, kinked (a mean absolute residual is piecewise linear) and off-centre.
        type Case<'a> = (&'a dyn Fn(f64) -> f64, f64, f64);
        let fs: [Case; 3] = [
            (&|x: f64| (x - 1.234_567).powi(2), 1.2, 1.26),
            (
                &|x: f64| (x - 0.71).abs() + 0.5 * (x - 0.73).abs(),
                0.70,
                0.74,
            ),
            (&|x: f64| (x - 2.0).powi(4) + 0.1 * x, 1.5, 2.5),
        ];
        for (i, (f, a, b)) in fs.into_iter().enumerate() {
            let want = reference_golden(f, a, b, SLOWDOWN_REFINE_STEPS);
            let (got, cost) = golden_section(f, a, b).unwrap();
            // Within the fit's resolution of the slowdown (1e-6) and no worse a cost.
            assert!((got - want).abs() < 1e-6, "{i}: {got} vs {want}");
            assert!(cost <= f(want) + 1e-12, "{i}");
        }
    }

    use super::*;
    use crate::host::HostSpec;
    use crate::preset::ModelSpec;
    use rand::rngs::StdRng;
    use rand::{Rng, SeedableRng};
    use rand_distr::{Distribution, Normal};

    /// Relative noise of the synthetic samples (a median of repeated runs).
    const NOISE: f64 = 0.01;

    fn truth() -> PerfParams {
        let mut p = PerfParams::from_host(&HostSpec::field_report()).unwrap();
        p.gather_gbs = 24.0;
        p.gather_layer_us = 9.0;
        p.gather_copy_us = 3.0;
        p.cpu_gbs = 47.0;
        p.cpu_thread_exponent = 0.8;
        p.cpu_layer_us = 14.0;
        p.cpu_expert_us = 2.0;
        p.cpu_token_gmacs = 1000.0;
        p.dram_gbs = 55.0;
        p.dma_dram_weight = 0.7;
        p.gpu_hbm_gbs = 750.0;
        p.gpu_launch_us = 5.0;
        p.gpu_token_gmacs = 40_000.0;
        p.dense_layer_us = 8.0;
        p.sync_us = 15.0;
        p.host = super::super::HostCost {
            layer_us: 60.0,
            expert_us: 2.5,
            cpu_expert_us: 1.5,
            stream_us: 4.0,
        };
        p.link_serving_slowdown = 0.08;
        p.overhead.offload_us = 6.0;
        p.overhead.hybrid_us = 11.0;
        p.cpu_serving_slowdown = 0.2;
        p
    }

    /// The prior the fit starts from: every fitted parameter off by 20 to 40%.
    fn prior(t: &PerfParams) -> PerfParams {
        let mut p = t.clone();
        for (i, id) in ParamId::ALL.into_iter().enumerate() {
            if id.positive() {
                let k = if i % 2 == 0 { 1.3 } else { 0.75 };
                p.set(
                    id,
                    (t.get(id) * k).min(if id == ParamId::CpuThreadExponent {
                        1.0
                    } else {
                        f64::MAX
                    }),
                );
            } else {
                p.set(id, 0.0);
            }
        }
        p
    }

    fn noisy(rng: &mut StdRng, t: f64) -> f64 {
        t * (1.0 + Normal::new(0.0, NOISE).unwrap().sample(rng))
    }

    fn samples(t: &PerfParams, seed: u64) -> ProbeSamples {
        let mut rng = StdRng::seed_from_u64(seed);
        let served = ExpertShape::of(&ModelSpec::preset("qwen3.8-flash-next").unwrap());
        let bench = ExpertShape::of(&ModelSpec::preset("bench-nvfp4").unwrap());
        let small = ExpertShape {
            bytes: 1e6,
            macs: 2e6,
        };
        let mut s = ProbeSamples::default();
        for shape in [small, served, bench] {
            for n in [1u32, 2, 4, 8, 12, 16, 20] {
                let mut g = GatherSample {
                    experts: n,
                    expert_bytes: shape.bytes,
                    contended_cpu_threads: None,
                    time_us: 0.0,
                };
                g.time_us = noisy(&mut rng, g.predict_us(t));
                s.gather.push(g);
            }
        }
        for shape in [served, bench] {
            for n in [4u32, 8, 16] {
                for threads in [12u32, 24] {
                    let mut g = GatherSample {
                        experts: n,
                        expert_bytes: shape.bytes,
                        contended_cpu_threads: Some(threads),
                        time_us: 0.0,
                    };
                    g.time_us = noisy(&mut rng, g.predict_us(t));
                    s.gather.push(g);
                    let mut c = CpuStepSample {
                        experts: n,
                        tokens_per_expert: 1,
                        expert_bytes: shape.bytes,
                        expert_macs: shape.macs,
                        threads,
                        contended: true,
                        time_us: 0.0,
                    };
                    c.time_us = noisy(&mut rng, c.predict_us(t));
                    s.cpu_step.push(c);
                }
            }
            for n in [1u32, 2, 4, 8, 16] {
                for tokens in [1u32, 2, 4] {
                    for threads in [6u32, 12, 24] {
                        let mut c = CpuStepSample {
                            experts: n,
                            tokens_per_expert: tokens,
                            expert_bytes: shape.bytes,
                            expert_macs: shape.macs,
                            threads,
                            contended: false,
                            time_us: 0.0,
                        };
                        c.time_us = noisy(&mut rng, c.predict_us(t));
                        s.cpu_step.push(c);
                    }
                }
            }
            for n in [1u32, 4, 16, 32] {
                for tokens in [1u32, 4, 16] {
                    let mut g = GpuExpertSample {
                        experts: n,
                        tokens_per_expert: tokens,
                        expert_bytes: shape.bytes,
                        expert_macs: shape.macs,
                        time_us: 0.0,
                    };
                    g.time_us = noisy(&mut rng, g.predict_us(t));
                    s.gpu_experts.push(g);
                }
            }
        }
        let dense = ModelSpec::preset("qwen3.8-flash-next").unwrap().dense();
        for streams in [1u32, 2, 4] {
            for context in [1u32, 4096, 32768, 131072] {
                let mut d = DenseSample {
                    streams,
                    context,
                    dense,
                    time_us: 0.0,
                };
                d.time_us = noisy(&mut rng, d.predict_us(t));
                s.dense.push(d);
            }
        }
        for streams in [1u32, 2, 4, 8] {
            for _ in 0..5 {
                let mut r = RoundTripSample {
                    streams,
                    hidden: 2560,
                    time_us: 0.0,
                };
                r.time_us = noisy(&mut rng, r.predict_us(t));
                s.round_trip.push(r);
            }
        }
        // Host spans of blocks with a CPU share: 1 to 8 streams, various splits.
        for streams in [1u32, 2, 4, 8] {
            for k in 0..4 {
                let gpu = (4 * k + streams) as f64;
                let cpu = (3 + k * k) as f64 + streams as f64;
                let counts = LayerCounts {
                    hits: gpu / 2.0,
                    hit_tokens: gpu / 2.0,
                    fetched: gpu / 2.0,
                    fetched_tokens: gpu / 2.0,
                    cpu,
                    cpu_tokens: cpu,
                };
                let mut h = HostSample {
                    strategy: StrategyKind::Hybrid,
                    streams,
                    counts,
                    time_us: 0.0,
                };
                h.time_us = noisy(&mut rng, h.predict_us(t));
                s.host.push(h);
                let mut l = LinkSample {
                    streams,
                    threads: None,
                    expert: ExpertShape {
                        bytes: 2.77e6,
                        macs: 3.0 * 2048.0 * 768.0,
                    },
                    counts,
                    time_us: 0.0,
                };
                l.time_us = noisy(&mut rng, l.predict_us(t));
                s.link.push(l);
            }
        }
        let model = ModelSpec::preset("qwen3.8-flash-next").unwrap();
        for (i, kind) in [StrategyKind::Offload, StrategyKind::Hybrid]
            .into_iter()
            .cycle()
            .take(24)
            .enumerate()
        {
            let shape = StepShape::new(&model, 2, 1200);
            let layers = (0..48)
                .map(|_| {
                    let hits = rng.random_range(8..16) as f64;
                    let misses = 20.0 - hits;
                    // Hybrid blocks alternately CPU-bound (fraction 0.3) and link-bound
                    // (0.7): what separates the serving slowdown from the overhead.
                    let fraction = if (i / 2) % 2 == 0 { 0.3 } else { 0.7 };
                    let fetched = if kind == StrategyKind::Hybrid {
                        (misses * fraction).round()
                    } else {
                        misses
                    };
                    LayerCounts {
                        hits,
                        hit_tokens: hits,
                        fetched,
                        fetched_tokens: fetched,
                        cpu: misses - fetched,
                        cpu_tokens: misses - fetched,
                    }
                })
                .collect();
            let mut st = StepSample {
                strategy: kind,
                role: if i >= 16 {
                    SampleRole::Validation
                } else {
                    SampleRole::Calibration
                },
                shape,
                layers,
                time_us: 0.0,
                threads: None,
            };
            st.time_us = noisy(&mut rng, st.predict_us(t));
            s.step.push(st);
        }
        s
    }

    #[test]
    fn the_fit_recovers_known_parameters_within_their_standard_errors() {
        let t = truth();
        let s = samples(&t, 7);
        let report = fit(&s, &prior(&t), &FitConfig::default()).unwrap();
        let fitted: Vec<&ParamEstimate> = report
            .estimates
            .iter()
            .filter(|e| e.stage.is_some())
            .collect();
        // Everything the design determines is fitted.
        for id in ParamId::ALL {
            if matches!(id, ParamId::OverheadResidentUs | ParamId::OverheadCpuUs) {
                continue;
            }
            assert!(
                fitted.iter().any(|e| e.param == id),
                "{id} not fitted: {:?}",
                report.stages
            );
        }
        for e in &fitted {
            let truth = t.get(e.param);
            let z = (e.value - truth) / e.se;
            assert!(e.se > 0.0, "{}: se {}", e.param, e.se);
            assert!(
                z.abs() < 4.0,
                "{}: {} vs truth {} (se {}, z {z:.2})",
                e.param,
                e.value,
                truth,
                e.se
            );
            assert!(e.interval[0] < e.value && e.value < e.interval[1]);
        }
        // The residuals are the noise: rms close to 1%.
        for st in &report.stages {
            assert!(st.rms_rel < 2.5 * NOISE, "{}: rms {}", st.name, st.rms_rel);
            assert!(st.iterations > 0);
        }
        assert!(
            report.params.run_noise_rel > 0.3 * NOISE && report.params.run_noise_rel < 3.0 * NOISE
        );
        assert_eq!(report.validation.len(), 8);
        assert!(report.validation.iter().all(|r| r.rel.abs() < 5.0 * NOISE));
    }

    /// The standard errors mean what they say: over repeated synthetic fits the spread of an
    /// estimate matches its reported standard error.
    #[test]
    fn standard_errors_match_the_spread_over_repeated_fits() {
        let t = truth();
        let mut values = Vec::new();
        let mut ses = Vec::new();
        for seed in 0..12 {
            let mut s = samples(&t, 100 + seed);
            s.step.clear();
            s.cpu_step.clear();
            s.gpu_experts.clear();
            s.dense.clear();
            s.round_trip.clear();
            s.gather.retain(|g| g.contended_cpu_threads.is_none());
            let r = fit(&s, &prior(&t), &FitConfig::default()).unwrap();
            let e = r.estimate(ParamId::GatherGbs).unwrap();
            values.push(e.value);
            ses.push(e.se);
        }
        let n = values.len() as f64;
        let mean = values.iter().sum::<f64>() / n;
        let sd = (values.iter().map(|v| (v - mean).powi(2)).sum::<f64>() / (n - 1.0)).sqrt();
        let se = ses.iter().sum::<f64>() / n;
        assert!(
            sd / se > 0.5 && sd / se < 2.0,
            "spread {sd} against reported {se}"
        );
    }

    /// The gather model is linear in (layer cost, copy cost, 1 / rate): the Nelder-Mead fit
    /// against the exact weighted linear least squares of the same relative residuals.
    #[test]
    fn the_gather_fit_matches_exact_linear_least_squares() {
        let t = truth();
        let mut s = samples(&t, 3);
        s.gather.retain(|g| g.contended_cpu_threads.is_none());
        let only = ProbeSamples {
            gather: s.gather.clone(),
            ..ProbeSamples::default()
        };
        let r = fit(&only, &prior(&t), &FitConfig::default()).unwrap();
        // Rows x = (1, n, n b) / y against 1.
        let mut a = vec![vec![0.0; 3]; 3];
        let mut rhs = [0.0; 3];
        for g in &s.gather {
            let n = g.experts as f64;
            let x = [
                1.0 / g.time_us,
                n / g.time_us,
                n * g.expert_bytes / g.time_us,
            ];
            for i in 0..3 {
                for j in 0..3 {
                    a[i][j] += x[i] * x[j];
                }
                rhs[i] += x[i];
            }
        }
        let inv = spd_inverse(&a).unwrap();
        let beta: Vec<f64> = (0..3)
            .map(|i| (0..3).map(|j| inv[i][j] * rhs[j]).sum())
            .collect();
        let gbs = 1.0 / (beta[2] * 1e3);
        let p = &r.params;
        assert!(
            (p.gather_layer_us - beta[0]).abs() < 1e-4 * beta[0].abs().max(1.0),
            "{} {}",
            p.gather_layer_us,
            beta[0]
        );
        assert!(
            (p.gather_copy_us - beta[1]).abs() < 1e-4 * beta[1].abs().max(1.0),
            "{} {}",
            p.gather_copy_us,
            beta[1]
        );
        assert!(
            (p.gather_gbs - gbs).abs() < 1e-5 * gbs,
            "{} {gbs}",
            p.gather_gbs
        );
    }

    #[test]
    fn validation_runs_are_never_fitted() {
        let t = truth();
        let s = samples(&t, 11);
        let a = fit(&s, &prior(&t), &FitConfig::default()).unwrap();
        let mut moved = s.clone();
        for st in moved
            .step
            .iter_mut()
            .filter(|st| st.role == SampleRole::Validation)
        {
            st.time_us *= 3.0;
        }
        let b = fit(&moved, &prior(&t), &FitConfig::default()).unwrap();
        assert_eq!(a.params, b.params);
        assert!(b.validation.iter().all(|r| r.rel < -0.5));
    }

    #[test]
    fn blocks_whose_cpu_share_is_never_critical_leave_the_slowdown_at_the_prior() {
        let t = truth();
        let mut s = samples(&t, 9);
        for st in s
            .step
            .iter_mut()
            .filter(|x| x.strategy == StrategyKind::Hybrid)
        {
            for c in &mut st.layers {
                // One CPU expert against a link full of the rest: the GPU side is critical.
                c.fetched += c.cpu - 1.0;
                c.fetched_tokens = c.fetched;
                c.cpu = 1.0;
                c.cpu_tokens = 1.0;
            }
            st.time_us = st.predict_us(&t);
        }
        // The link's samples saw the truth's CPU slowdown, which these blocks cannot
        // recover; this test is about the CPU's, so the link is given.
        s.link.clear();
        let mut pr = prior(&t);
        pr.cpu_serving_slowdown = 0.1;
        pr.link_serving_slowdown = t.link_serving_slowdown;
        let r = fit(&s, &pr, &FitConfig::default()).unwrap();
        let e = r.estimate(ParamId::CpuServingSlowdown).unwrap();
        assert!(e.stage.is_none(), "{e:?}");
        assert_eq!(r.params.cpu_serving_slowdown, 0.1);
        // The hybrid overhead is still calibrated (the truth's, up to the micro-fit).
        assert!((r.params.overhead.hybrid_us - t.overhead.hybrid_us).abs() < 5.0);
    }

    /// `cpu` calibration blocks at 1 and 4 streams (4 times the CPU experts), made with a
    /// planted serving slowdown and overhead, plus noise.
    fn cpu_blocks(t: &PerfParams, seed: u64) -> Vec<StepSample> {
        let mut rng = StdRng::seed_from_u64(seed);
        let model = ModelSpec::preset("qwen3.8-flash-next").unwrap();
        (0..12)
            .map(|i| {
                let streams = if i % 2 == 0 { 1 } else { 4 };
                let shape = StepShape::new(&model, streams, 1000);
                let k = 10 * streams as u32;
                let layers = (0..3)
                    .map(|_| {
                        let n = (k - rng.random_range(0..3)) as f64;
                        LayerCounts {
                            cpu: n,
                            cpu_tokens: k as f64,
                            ..Default::default()
                        }
                    })
                    .collect();
                let mut st = StepSample {
                    strategy: StrategyKind::Cpu,
                    role: SampleRole::Calibration,
                    shape,
                    layers,
                    time_us: 0.0,
                    threads: None,
                };
                st.time_us = noisy(&mut rng, st.predict_us(t));
                st
            })
            .collect()
    }

    #[test]
    fn a_planted_serving_slowdown_is_recovered_and_not_taken_by_the_overhead() {
        let mut t = truth();
        t.cpu_serving_slowdown = 0.27;
        t.overhead.cpu_us = 5.0;
        let mut pr = t.clone();
        pr.cpu_serving_slowdown = 0.0;
        pr.overhead.cpu_us = 0.0;
        let s = ProbeSamples {
            step: cpu_blocks(&t, 21),
            ..ProbeSamples::default()
        };
        let r = fit(&s, &pr, &FitConfig::default()).unwrap();
        let e = r.estimate(ParamId::CpuServingSlowdown).unwrap();
        assert_eq!(e.stage.as_deref(), Some("step"));
        assert!(e.se > 0.0 && e.se < 0.05, "se {}", e.se);
        assert!(
            ((e.value - 0.27) / e.se).abs() < 4.0,
            "{} vs 0.27 (se {})",
            e.value,
            e.se
        );
        let o = r.estimate(ParamId::OverheadCpuUs).unwrap();
        assert!(((o.value - 5.0) / o.se).abs() < 4.0, "{o:?}");
        // A constant per layer alone cannot follow it: the calibration residuals of the
        // fit without the slowdown (its overhead the median) are several times larger.
        let mut without = pr.clone();
        let mine: Vec<&StepSample> = s.step.iter().collect();
        let refs: Vec<&&StepSample> = mine.iter().collect();
        median_overhead(&mut without, LayerWork::CpuShare, &refs);
        let rms = |p: &PerfParams| {
            (s.step
                .iter()
                .map(|x| ((x.predict_us(p) - x.time_us) / x.time_us).powi(2))
                .sum::<f64>()
                / s.step.len() as f64)
                .sqrt()
        };
        assert!(
            rms(&without) > 3.0 * rms(&r.params),
            "{} vs {}",
            rms(&without),
            rms(&r.params)
        );
        // Without blocks of a strategy with a CPU share the slowdown keeps the prior's.
        let off = ProbeSamples {
            step: samples(&truth(), 3)
                .step
                .into_iter()
                .filter(|x| x.strategy == StrategyKind::Offload)
                .collect(),
            ..ProbeSamples::default()
        };
        let r = fit(&off, &pr, &FitConfig::default()).unwrap();
        assert_eq!(r.params.cpu_serving_slowdown, 0.0);
        assert!(r
            .estimate(ParamId::CpuServingSlowdown)
            .unwrap()
            .stage
            .is_none());
    }

    #[test]
    fn a_slowdown_at_a_second_thread_count_is_recovered_and_keeps_the_serving_one() {
        // Truth: 0.3 at the serving count, 0.05 at a quarter of it.
        let mut t = truth();
        let serving = t.cpu_threads;
        let quarter = serving.div_ceil(4);
        assert!(
            quarter < serving,
            "the field report's host serves {serving} threads"
        );
        t.cpu_serving_slowdown = 0.3;
        t.overhead.cpu_us = 5.0;
        t.cpu_serving_slowdown_at = vec![ThreadSlowdown {
            threads: quarter,
            slowdown: 0.05,
            se: 0.0,
        }];
        let mut pr = t.clone();
        pr.cpu_serving_slowdown = 0.0;
        pr.cpu_serving_slowdown_at.clear();
        pr.overhead.cpu_us = 0.0;
        let mut step = cpu_blocks(&t, 31);
        let mut at_quarter = cpu_blocks(&t.at_threads(quarter), 32);
        for st in &mut at_quarter {
            st.threads = Some(quarter);
        }
        step.extend(at_quarter.iter().cloned());
        let s = ProbeSamples {
            step,
            ..ProbeSamples::default()
        };
        let r = fit(&s, &pr, &FitConfig::default()).unwrap();
        let e = r.estimate(ParamId::CpuServingSlowdown).unwrap();
        assert!(((e.value - 0.3) / e.se).abs() < 4.0, "{e:?}");
        let k = r.params.cpu_serving_slowdown_at.as_slice();
        assert_eq!(k.len(), 1, "{k:?}");
        assert_eq!(k[0].threads, quarter);
        assert!(k[0].se > 0.0 && k[0].se < 0.05, "{k:?}");
        assert!(((k[0].slowdown - 0.05) / k[0].se).abs() < 4.0, "{k:?}");
        // The quarter-count blocks are predicted at their count: their residuals are noise.
        let quarter_res: Vec<f64> = r
            .residuals
            .iter()
            .filter(|x| x.probe == "step" && s.step[x.index].threads == Some(quarter))
            .map(|x| x.rel.abs())
            .collect();
        assert_eq!(quarter_res.len(), at_quarter.len());
        assert!(
            quarter_res.iter().all(|x| *x < 5.0 * NOISE),
            "{quarter_res:?}"
        );
        // The serving slowdown applied at the quarter count instead (the fit before it had
        // blocks there) misses those blocks by far more.
        let mut flat = r.params.clone();
        flat.cpu_serving_slowdown_at.clear();
        let worst = at_quarter
            .iter()
            .map(|x| ((x.predict_us(&flat) - x.time_us) / x.time_us).abs())
            .fold(0.0, f64::max);
        assert!(worst > 0.1, "{worst}");
        // Validation blocks at the quarter count are reported, never fitted.
        let mut v = s.clone();
        for st in v.step.iter_mut().filter(|x| x.threads.is_some()) {
            st.role = SampleRole::Validation;
        }
        let r = fit(&v, &pr, &FitConfig::default()).unwrap();
        assert!(r.params.cpu_serving_slowdown_at.is_empty());
        assert_eq!(r.validation.len(), at_quarter.len());
    }

    /// A fixed cost is fitted non-negative: blocks that a negative hybrid cost would fit
    /// best (a planted -20 us a layer) leave it at 0, and the others are fitted as before.
    #[test]
    fn fixed_costs_are_fitted_non_negative() {
        let mut t = truth();
        t.overhead.hybrid_us = -20.0;
        let r = fit(&samples(&t, 5), &prior(&truth()), &FitConfig::default()).unwrap();
        assert_eq!(r.params.overhead.hybrid_us, 0.0);
        for w in LayerWork::ALL {
            assert!(r.params.overhead.of(w) >= 0.0, "{}", w.name());
        }
        assert!(
            (r.params.overhead.offload_us - 6.0).abs() < 3.0,
            "{}",
            r.params.overhead.offload_us
        );
        r.params.validate().unwrap();
    }

    #[test]
    fn one_slow_calibration_block_does_not_set_the_overhead() {
        let t = truth();
        let clean = fit(&samples(&t, 3), &prior(&t), &FitConfig::default()).unwrap();
        let mut s = samples(&t, 3);
        let slow = s
            .step
            .iter_mut()
            .find(|x| x.strategy == StrategyKind::Hybrid && x.role == SampleRole::Calibration)
            .unwrap();
        let layers = slow.layers.len() as f64;
        slow.time_us *= 1.65;
        let r = fit(&s, &prior(&t), &FitConfig::default()).unwrap();
        let (a, b) = (clean.params.overhead.hybrid_us, r.params.overhead.hybrid_us);
        // The mean would move by 0.65 of a block over the blocks' layers; the median far less.
        let mean_shift = 0.65 * s.step[0].time_us
            / layers
            / s.step
                .iter()
                .filter(|x| x.strategy == StrategyKind::Hybrid && x.role == SampleRole::Calibration)
                .count() as f64;
        assert!(
            (b - a).abs() < 0.25 * mean_shift,
            "{a} -> {b} (mean would move {mean_shift})"
        );
    }

    #[test]
    fn a_superlinear_thread_scaling_stops_at_linear_instead_of_failing_the_fit() {
        // Linear scaling, then the samples below the serving threads 10% slower: the best
        // unconstrained exponent is above 1, which `PerfParams::validate` refuses.
        let mut t = truth();
        t.cpu_thread_exponent = 1.0;
        let mut s = samples(&t, 11);
        let serving = t.cpu_threads;
        for c in s.cpu_step.iter_mut().filter(|c| c.threads < serving) {
            c.time_us *= 1.1;
        }
        let r = fit(&s, &prior(&t), &FitConfig::default()).unwrap();
        let e = r.params.cpu_thread_exponent;
        assert!(e <= 1.0 && e > 0.9, "{e}");
    }

    #[test]
    fn undetermined_parameters_are_held_and_bad_samples_are_named() {
        let t = truth();
        let mut s = samples(&t, 5);
        // Every CPU sample at the serving thread count: the exponent cannot be seen.
        s.cpu_step.retain(|c| c.threads == 24);
        let r = fit(&s, &prior(&t), &FitConfig::default()).unwrap();
        let cpu = r.stages.iter().find(|st| st.name == "cpu-step").unwrap();
        assert!(cpu.held.contains(&ParamId::CpuThreadExponent), "{cpu:?}");
        assert!(r
            .estimate(ParamId::CpuThreadExponent)
            .unwrap()
            .stage
            .is_none());

        let mut bad = samples(&t, 5);
        bad.round_trip[0].time_us = -1.0;
        let e = fit(&bad, &prior(&t), &FitConfig::default())
            .unwrap_err()
            .to_string();
        assert!(e.contains("round-trip"), "{e}");
    }

    #[test]
    fn the_dense_stage_starts_on_its_samples_line_from_a_prior_far_from_it() {
        let t = truth();
        let s = samples(&t, 3);
        // A prior with no fixed dense cost (a zero has no log) and a dense rate so high that
        // its bytes cost nothing: without the line through the samples neither has a
        // gradient and the stage would hold both.
        let mut pr = prior(&t);
        pr.dense_layer_us = 0.0;
        pr.dense_hbm_gbs = Some(1000.0 * t.dense_rate_gbs());
        let r = fit(&s, &pr, &FitConfig::default()).unwrap();
        let dense = r.stages.iter().find(|st| st.name == "dense").unwrap();
        assert!(dense.held.is_empty(), "{dense:?}");
        for id in [ParamId::DenseHbmGbs, ParamId::DenseLayerUs] {
            let (got, want) = (r.params.get(id), t.get(id));
            assert!(
                (got / want - 1.0).abs() < 0.03,
                "{id}: {got} against {want}"
            );
        }
    }

    #[test]
    fn a_parameter_the_samples_stop_seeing_stays_bounded() {
        let t = truth();
        let mut s = samples(&t, 5);
        // GPU launches whose time does not grow with their bytes: least squares alone would
        // send the HBM bandwidth to infinity.
        for g in &mut s.gpu_experts {
            g.time_us = 20.0;
        }
        let pr = prior(&t);
        let r = fit(&s, &pr, &FitConfig::default()).unwrap();
        let hbm = r.params.get(ParamId::GpuHbmGbs);
        assert!(
            hbm.is_finite() && hbm <= pr.gpu_hbm_gbs * MAX_FIT_FACTOR * 1.000001,
            "{hbm}"
        );
        let gpu = r.stages.iter().find(|st| st.name == "gpu-experts").unwrap();
        assert!(
            gpu.held.contains(&ParamId::GpuHbmGbs),
            "{gpu:?} hbm {hbm} prior {}",
            pr.gpu_hbm_gbs
        );
    }

    #[test]
    fn samples_round_trip_through_json() {
        let s = samples(&truth(), 1);
        let json = serde_json::to_string(&s).unwrap();
        let back: ProbeSamples = serde_json::from_str(&json).unwrap();
        // serde_json parses floats to within one ulp.
        assert_eq!(back.gather.len(), s.gather.len());
        assert_eq!(back.step.len(), s.step.len());
        for (a, b) in back.cpu_step.iter().zip(&s.cpu_step) {
            assert!((a.time_us - b.time_us).abs() <= 1e-12 * b.time_us);
            assert_eq!(
                (a.experts, a.threads, a.contended),
                (b.experts, b.threads, b.contended)
            );
        }
        for (a, b) in back.step.iter().zip(&s.step) {
            assert_eq!(a.layers.len(), b.layers.len());
            assert_eq!(a.layers[0], b.layers[0]);
            assert!((a.time_us - b.time_us).abs() <= 1e-12 * b.time_us);
        }
        let e = serde_json::from_str::<ProbeSamples>(
            r#"{"gather":[{"experts":1,"expert_bytes":1.0,"time_us":1.0,"oops":1}]}"#,
        );
        assert!(e.is_err());
    }
}
