//! Estimates from the calibrated performance model: `ft_model::calibrate::calibrate` fitted
//! to the runs so far, on top of a host model (a host spec or a profile), then each candidate
//! predicted at the target.
//!
//! A candidate measured at the target keeps its measurements ([`Measured`]): the model is
//! fitted to those very runs, and where it misses them the runs are the better evidence. A
//! candidate not measured there is predicted: its standard error is the fitted terms' errors
//! carried through the prediction (each term moved by its standard error, the effects summed
//! in quadrature: the fit reports no correlations; with as many terms as runs, where the
//! errors are undefined, those at the host model's run noise), with the fit's residual noise (at least
//! `rel_noise`) added, since a calibrated model still misses an unseen configuration by about
//! as much as it misses the runs.
//!
//! With no runs there is nothing to calibrate to: a host model alone is the bench-only
//! prediction this command exists to check, so every candidate is "not yet known" and the
//! first is run.

use ft_model::cache::CacheSize;
use ft_model::calibrate::{self, apply_all, strategy_of, CalibrateConfig, RunModel};
use ft_model::observe::{Observation, ObservedStrategy};
use ft_model::perf::breakeven::{break_evens, ranked};
use ft_model::perf::predict::{predict, PredictConfig};
use ft_model::perf::prefill::MeasureSpec;
use ft_model::perf::PerfModel;
use ft_model::strategy::{CpuLayers, FetchFraction};
use ft_model::ModelSpec;

use crate::calib::{BreakEvenSection, Calibrator, Estimate, Measured, Target};
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

impl Model {
    /// `ft predict`'s configuration of the decision at `target`: its streams and context,
    /// the runs' cache, routing and sampling; hybrid at `choice`'s fraction (else the first
    /// hybrid candidate's) and a layer split at its N likewise, since the engine runs only
    /// the candidates' parameters.
    fn predict_config(
        &self,
        candidates: &[ObservedStrategy],
        target: &Target,
        choice: usize,
    ) -> PredictConfig {
        let first = |f: &dyn Fn(&ObservedStrategy) -> Option<f64>| {
            f(&candidates[choice]).or_else(|| candidates.iter().find_map(f))
        };
        let fraction = first(&|c| match c {
            ObservedStrategy::Hybrid { fetch_fraction } => Some(*fetch_fraction),
            _ => None,
        });
        let layers = first(&|c| match c {
            ObservedStrategy::LayerSplit { cpu_layers }
            | ObservedStrategy::LayerSplitCached { cpu_layers } => Some(*cpu_layers as f64),
            _ => None,
        });
        let total = self.model.geometry.total_experts().max(1) as usize;
        let sampling = &self.config.sampling;
        PredictConfig {
            streams: target.streams,
            context: (target.prompt_tokens + target.output_tokens / 2).max(1),
            // A cache of every expert is `resident`'s, not a cache: one slot fewer.
            cache: target.cache.map(|c| {
                CacheSize::Slots(
                    calibrate::cache_slots(&self.model, Some(c))
                        .min(total.saturating_sub(1).max(1)),
                )
            }),
            cache_options: sampling.cache.clone(),
            routing: sampling.routing.clone(),
            seed: sampling.seed,
            warmup_steps: sampling.warmup_steps,
            steps: sampling.steps.max(1),
            hybrid_fetch: fraction.map_or(FetchFraction::Auto, FetchFraction::Fixed),
            layer_split: layers.map(|n| CpuLayers::Fixed(n as usize)),
            ..PredictConfig::default()
        }
    }
}

impl Calibrator for Model {
    fn break_evens(
        &self,
        runs: &[Observation],
        candidates: &[ObservedStrategy],
        target: &Target,
        choice: usize,
    ) -> Result<BreakEvenSection> {
        if runs.is_empty() {
            return Ok(BreakEvenSection::NotAvailable {
                why: "no run to calibrate the model to".into(),
            });
        }
        let cal = calibrate::calibrate(&self.model, &self.base, runs, &self.config)?;
        let perf = cal.perf_model(&self.base);
        let config = self.predict_config(candidates, target, choice);
        let mut pred = predict(&self.model, &perf, &config)?;
        // Only what the engine can run takes part.
        let kinds: Vec<_> = candidates.iter().map(|c| strategy_of(c).kind()).collect();
        pred.strategies.retain(|s| kinds.contains(&s.kind));
        let want = kinds[choice];
        let best = pred
            .strategies
            .iter()
            .filter(|s| ranked(s))
            .max_by(|a, b| a.tok_s_total.total_cmp(&b.tok_s_total));
        let Some(best) = best else {
            return Ok(BreakEvenSection::NotAvailable {
                why: "the calibrated model finds none of the candidates feasible".into(),
            });
        };
        let (of, kind) = (best.strategy.to_string(), best.kind);
        let flips = break_evens(&self.model, &perf, &config, &pred, kind)?;
        Ok(BreakEvenSection::Computed {
            of,
            agrees_with_choice: kind == want,
            break_evens: flips,
        })
    }

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
                if let Some(se) = t.se.or(t.se_at_run_noise) {
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

#[cfg(test)]
mod tests {
    use super::*;
    use ft_model::calibrate::Term;
    use ft_model::host::HostSpec;
    use ft_model::observe::{parse_observations, Measure, ObservedCache};
    use ft_model::strategy::StrategyKind;

    /// The field report's model cut to 4 layers, sampled briefly: a fit in well under a
    /// second.
    fn quick_model() -> Model {
        let mut m = ModelSpec::preset("qwen3.8-flash-next").unwrap();
        m.geometry.moe_layers = 4;
        let base = PerfModel::from_host(&HostSpec::field_report()).unwrap();
        let mut c = Model::new(m, base, 0.05);
        c.config.sampling.warmup_steps = 20;
        c.config.sampling.steps = 20;
        c.config.sampling.seed = Some(7);
        c
    }

    /// Offload and hybrid at 1 and 2 streams, measured as the host model with the CPU side
    /// serving at half its bench rate predicts them.
    fn runs(c: &Model) -> Vec<Observation> {
        let mut runs = parse_observations(
            "strategy,fetch_fraction,streams,output_tokens,cache_residency,tok_s,measure\n\
             offload,,1,64,0.3,1,decode\n\
             offload,,2,64,0.3,1,decode\n\
             hybrid,0.5,1,64,0.3,1,decode\n\
             hybrid,0.5,2,64,0.3,1,decode\n",
            "t.csv",
        )
        .unwrap();
        let p = apply_all(&c.base.params, &[Term::CpuServingRate], &[0.5]);
        for o in &mut runs {
            let r = RunModel::of_observation(&c.model, o, &c.config.sampling).unwrap();
            o.tok_s_per_stream = r.tok_s(&c.model, &p, &c.config.sampling.prefill);
        }
        runs
    }

    #[test]
    fn break_evens_are_of_the_calibrated_model_among_the_candidates() {
        let c = quick_model();
        let runs = runs(&c);
        let candidates = [
            ObservedStrategy::Offload,
            ObservedStrategy::Hybrid {
                fetch_fraction: 0.5,
            },
        ];
        let target = Target {
            streams: 2,
            prompt_tokens: 0,
            output_tokens: 64,
            measure: Measure::Decode,
            cache: Some(ObservedCache::Residency(0.3)),
        };
        let est = c.estimate(&runs, &candidates, &target).unwrap();
        let choice = if est[0].unwrap().tok_s >= est[1].unwrap().tok_s {
            0
        } else {
            1
        };
        let section = c.break_evens(&runs, &candidates, &target, choice).unwrap();
        let BreakEvenSection::Computed {
            of,
            agrees_with_choice,
            break_evens,
        } = &section
        else {
            panic!("{section:?}");
        };
        assert_eq!(break_evens.inputs.len(), 5);
        // Only the candidates' strategies take over: never cpu, resident or a layer split.
        let kinds = [StrategyKind::Offload, StrategyKind::Hybrid];
        for b in &break_evens.inputs {
            for f in b.below.iter().chain(b.above.iter()) {
                assert!(kinds.contains(&f.to.kind()), "{}", b.text);
            }
        }
        // The runs are decode at the target: the model's choice is the measured one.
        assert!(*agrees_with_choice, "{of} vs {:?}", candidates[choice]);
        // In the report's JSON: a status and the break-evens as `ft predict` writes them.
        let v = serde_json::to_value(&section).unwrap();
        assert_eq!(v["status"], "computed");
        assert_eq!(v["break_evens"]["inputs"].as_array().unwrap().len(), 5);
        // One line per input (and, where the fit left no degree of freedom, the
        // uncalibrated note of `perf::breakeven`).
        assert!(v["break_evens"]["text"].as_str().unwrap().lines().count() >= 5);
        // No runs: nothing to calibrate, so none.
        let none = c.break_evens(&[], &candidates, &target, choice).unwrap();
        assert!(matches!(none, BreakEvenSection::NotAvailable { .. }));
        // The model-free calibrator has no input to move.
        let m = Measured::default()
            .break_evens(&runs, &candidates, &target, choice)
            .unwrap();
        let v = serde_json::to_value(&m).unwrap();
        assert_eq!(v["status"], "not-available");
        assert!(v["why"].as_str().unwrap().contains("--host"));
    }
}
