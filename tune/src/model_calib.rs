//! Estimates from the calibrated performance model: `ft_model::calibrate::calibrate` fitted
//! to the runs so far, on top of a host model (a host spec or a profile), then each candidate
//! predicted at the target.
//!
//! A candidate measured at the target keeps its measurements ([`Measured`]): the model is
//! fitted to those very runs, and where it misses them the runs are the better evidence. A
//! candidate not measured there is predicted: its standard error is the fitted terms' errors
//! carried through the prediction (each term moved by its standard error, the effects summed
//! in quadrature: the fit reports no correlations), with the fit's residual noise (at least
//! `rel_noise`) added, since a calibrated model still misses an unseen configuration by about
//! as much as it misses the runs.
//!
//! With no runs there is nothing to calibrate to: a host model alone is the bench-only
//! prediction this command exists to check, so every candidate is "not yet known" and the
//! first is run.

use ft_model::calibrate::{self, apply_all, strategy_of, CalibrateConfig, RunModel};
use ft_model::observe::{Observation, ObservedStrategy};
use ft_model::perf::prefill::MeasureSpec;
use ft_model::perf::PerfModel;
use ft_model::ModelSpec;

use crate::calib::{Calibrator, Estimate, Measured, Target};
use crate::error::Result;

/// The calibrated model as a [`Calibrator`] (see the module docs).
#[derive(Debug, Clone)]
pub struct Model {
    /// The served model's geometry and format.
    pub model: ModelSpec,
    /// The host model the engine terms are fitted on top of.
    pub base: PerfModel,
    /// How the fit samples and which terms it may fit.
    pub config: CalibrateConfig,
    /// Measurements of a candidate at the target, and the noise floor.
    pub measured: Measured,
}

impl Model {
    /// A calibrator for `model` on `base`, with the fit's defaults less its extras (the
    /// leave-one-out refits and the suggested run: tune picks its own next run).
    pub fn new(model: ModelSpec, base: PerfModel, rel_noise: f64) -> Self {
        Model {
            model,
            base,
            config: CalibrateConfig {
                suggest: false,
                leave_one_out: false,
                ..CalibrateConfig::default()
            },
            measured: Measured { rel_noise },
        }
    }
}

impl Model {
    /// The candidate run at the target, its traffic sampled.
    fn run_model(&self, c: &ObservedStrategy, target: &Target) -> Result<RunModel> {
        Ok(RunModel::new(
            &self.model,
            strategy_of(c),
            target.streams,
            (target.prompt_tokens + target.output_tokens / 2).max(1),
            calibrate::cache_slots(&self.model, target.cache),
            MeasureSpec {
                measure: target.measure,
                prompt_tokens: target.prompt_tokens,
                output_tokens: target.output_tokens,
            },
            &self.config.sampling,
        )?)
    }
}

impl Calibrator for Model {
    fn host_only(
        &self,
        candidates: &[ObservedStrategy],
        target: &Target,
    ) -> Result<Vec<Option<f64>>> {
        candidates
            .iter()
            .map(|c| {
                let t = self.run_model(c, target)?.tok_s(
                    &self.model,
                    &self.base.params,
                    &self.config.sampling.prefill,
                );
                Ok((t.is_finite() && t > 0.0).then_some(t))
            })
            .collect()
    }

    fn name(&self) -> String {
        format!(
            "calibrated model ({} on {}; a configuration measured at the target keeps its runs)",
            self.model.name, self.base.source
        )
    }

    fn estimate(
        &self,
        runs: &[Observation],
        candidates: &[ObservedStrategy],
        target: &Target,
    ) -> Result<Vec<Option<Estimate>>> {
        let measured = self.measured.estimate(runs, candidates, target)?;
        if runs.is_empty() {
            return Ok(measured);
        }
        let cal = calibrate::calibrate(&self.model, &self.base, runs, &self.config)?;
        let fitted: Vec<_> = cal.terms.iter().filter(|t| t.identified).collect();
        let terms: Vec<_> = fitted.iter().map(|t| t.term).collect();
        let values: Vec<f64> = fitted.iter().map(|t| t.value).collect();
        let noise = cal.fit.sigma.max(self.measured.rel_noise);
        let mut out = Vec::with_capacity(candidates.len());
        for (c, m) in candidates.iter().zip(measured) {
            if m.is_some() {
                out.push(m);
                continue;
            }
            let run = self.run_model(c, target)?;
            let prefill = &self.config.sampling.prefill;
            let at = |v: &[f64]| {
                run.tok_s(
                    &self.model,
                    &apply_all(&self.base.params, &terms, v),
                    prefill,
                )
            };
            let tok_s = at(&values);
            if !(tok_s.is_finite() && tok_s > 0.0) {
                out.push(None);
                continue;
            }
            let mut var = (noise * tok_s).powi(2);
            for (i, t) in fitted.iter().enumerate() {
                if let Some(se) = t.se {
                    let mut v = values.clone();
                    v[i] += se;
                    let d = at(&v) - tok_s;
                    if d.is_finite() {
                        var += d * d;
                    }
                }
            }
            out.push(Some(Estimate {
                tok_s,
                se: var.sqrt(),
                runs: 0,
            }));
        }
        Ok(out)
    }
}
