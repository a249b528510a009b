//! The performance model of `ft_model::perf` as a [`Predictor`].
//!
//! Predictions come from [`ft_model::perf::predict()`] (per-stream tok/s with its interval, the
//! miss rate of each strategy's simulated cache, the bounding resource, hybrid at the fetch
//! fraction the model finds fastest). A refit turns the server's observations into
//! end-to-end step samples ([`StepSample`], calibration role: one per window, its mean step
//! time and mean counts spread evenly over the layers) and hands them, beside the samples
//! the predictor started with (a profile's probes), to [`ft_model::perf::fit::fit`] starting
//! from the current parameters; the fitted model replaces the current one.

use ft_model::perf::fit::{fit, FitConfig, ProbeSamples, SampleRole, StepSample};
use ft_model::perf::{
    predict, LayerCounts, LegacyVerdict as PerfVerdict, PerfModel, PredictConfig, StepShape,
};
use ft_model::{ModelSpec, StrategyKind};

use crate::error::Result;
use crate::predict::{Decision, Interval, LegacyVerdict, Observation, Predictor, StrategyEstimate};

/// Half-width of the miss-rate interval around the model's point prediction (absolute):
/// the simulated cache and the served routing differ by a few points in the runs seen so
/// far, and a divergence smaller than this is not worth a refit.
pub const MISS_RATE_HALF_WIDTH: f64 = 0.05;

/// See the module docs.
pub struct PerfPredictor {
    model: ModelSpec,
    perf: PerfModel,
    config: PredictConfig,
    samples: ProbeSamples,
    /// Decisions by stream count for the current parameters (a prediction simulates the
    /// caches of every strategy: worth computing once per stream count and fit).
    memo: std::sync::Mutex<std::collections::HashMap<usize, Decision>>,
}

impl PerfPredictor {
    /// A predictor for `model` from `perf`; `config` gives everything but the stream count;
    /// `samples` are the probe samples behind `perf` (empty for a host spec's prior).
    pub fn new(
        model: ModelSpec,
        perf: PerfModel,
        config: PredictConfig,
        samples: ProbeSamples,
    ) -> Self {
        PerfPredictor {
            model,
            perf,
            config,
            samples,
            memo: Default::default(),
        }
    }

    /// The current model.
    pub fn perf(&self) -> &PerfModel {
        &self.perf
    }
}

impl Predictor for PerfPredictor {
    fn predict(&self, streams: usize) -> Result<Decision> {
        if let Some(d) = self.memo.lock().ok().and_then(|m| m.get(&streams).cloned()) {
            return Ok(d);
        }
        let d = self.predict_uncached(streams)?;
        if let Ok(mut m) = self.memo.lock() {
            m.insert(streams, d.clone());
        }
        Ok(d)
    }

    fn refit(&mut self, observations: &[Observation]) -> Result<String> {
        let r = self.refit_inner(observations);
        if let Ok(mut m) = self.memo.lock() {
            m.clear();
        }
        r
    }
}

impl PerfPredictor {
    fn predict_uncached(&self, streams: usize) -> Result<Decision> {
        let mut c = self.config.clone();
        c.streams = streams.max(1);
        let p = predict(&self.model, &self.perf, &c)?;
        let estimates = p
            .strategies
            .iter()
            .map(|s| StrategyEstimate {
                strategy: s.strategy,
                tok_s: Interval {
                    value: s.tok_s_per_stream,
                    lo: s.tok_s_per_stream_interval[0],
                    hi: s.tok_s_per_stream_interval[1],
                },
                miss_rate: Some(Interval {
                    value: s.miss_rate,
                    lo: (s.miss_rate - MISS_RATE_HALF_WIDTH).max(0.0),
                    hi: (s.miss_rate + MISS_RATE_HALF_WIDTH).min(1.0),
                }),
                bound: Some(s.bound.name().to_string()),
                feasible: s.feasible,
                note: s.note.clone(),
            })
            .collect();
        let legacy = LegacyVerdict {
            ratio: p.legacy.ratio,
            threshold: p.legacy.threshold,
            verdict: match p.legacy.verdict {
                PerfVerdict::Offload => StrategyKind::Offload,
                PerfVerdict::Hybrid => StrategyKind::Hybrid,
            },
        };
        Decision::from_estimates(streams, p.source.clone(), Some(legacy), estimates)
    }

    fn refit_inner(&mut self, observations: &[Observation]) -> Result<String> {
        let layers = self.model.geometry.moe_layers.max(1) as f64;
        let k = self.model.geometry.top_k as f64;
        let steps: Vec<StepSample> = observations
            .iter()
            .filter_map(|o| {
                let [hits, fetched, cpu] = o.mean_experts?;
                let (h, f, c) = (hits / layers, fetched / layers, cpu / layers);
                let unique = (h + f + c).max(1e-9);
                // Tokens routed per layer (streams x top_k), spread over the experts.
                let per = o.streams as f64 * k / unique;
                let counts = LayerCounts {
                    hits: h,
                    hit_tokens: h * per,
                    fetched: f,
                    fetched_tokens: f * per,
                    cpu: c,
                    cpu_tokens: c * per,
                };
                Some(StepSample {
                    strategy: o.strategy.kind(),
                    role: SampleRole::Calibration,
                    shape: StepShape::new(&self.model, o.streams, self.config.context),
                    layers: vec![counts; self.model.geometry.moe_layers],
                    time_us: o.step_us,
                    // The server's pool: the profile's serving threads.
                    threads: None,
                })
            })
            .collect();
        if steps.is_empty() {
            return Ok("no window with expert counts: the model is unchanged".into());
        }
        let mut samples = self.samples.clone();
        let n = steps.len();
        samples.step.extend(steps);
        let report = fit(&samples, &self.perf.params, &FitConfig::default())?;
        let rms: Vec<String> = report
            .stages
            .iter()
            .filter(|s| s.samples > 0)
            .map(|s| format!("{} rms {:.1}%", s.name, 100.0 * s.rms_rel))
            .collect();
        let source = format!("{} refitted to {n} serving window(s)", self.perf.source);
        self.perf = report.model(&self.perf.covariance, &source);
        Ok(format!(
            "perf model refitted to {n} window(s): {}",
            rms.join(", ")
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use ft_model::host::HostSpec;
    use ft_model::{ExpertFormat, MoeGeometry, Strategy};

    fn tiny() -> ModelSpec {
        ModelSpec {
            name: "tiny".into(),
            format: ExpertFormat::Nvfp4,
            geometry: MoeGeometry {
                hidden: 256,
                intermediate: 128,
                experts: 32,
                top_k: 4,
                moe_layers: 4,
                shared_experts: 0,
            },
            dense: None,
        }
    }

    fn predictor() -> PerfPredictor {
        let perf = PerfModel::from_host(&HostSpec::field_report()).unwrap();
        let config = PredictConfig {
            cache: Some(ft_model::CacheSize::Slots(32)),
            warmup_steps: 20,
            steps: 40,
            ..PredictConfig::default()
        };
        PerfPredictor::new(tiny(), perf, config, ProbeSamples::default())
    }

    /// The adapter reports the perf model's numbers unchanged, and a refit to measurements
    /// of a slower offload moves offload's prediction toward them.
    #[test]
    fn maps_the_perf_model_and_refits_to_observations() {
        let mut p = predictor();
        let d = p.predict(2).unwrap();
        let direct = predict(
            &tiny(),
            p.perf(),
            &PredictConfig {
                streams: 2,
                ..p.config.clone()
            },
        )
        .unwrap();
        assert_eq!(d.estimates.len(), 4);
        for (e, s) in d.estimates.iter().zip(&direct.strategies) {
            assert_eq!(e.strategy, s.strategy);
            assert_eq!(e.tok_s.value, s.tok_s_per_stream);
            assert!(e.tok_s.lo <= e.tok_s.value && e.tok_s.value <= e.tok_s.hi);
        }
        let legacy = d.legacy.as_ref().unwrap();
        assert_eq!(legacy.ratio, direct.legacy.ratio);
        assert!(d.log_line(None).contains("legacy ratio"));
        // Offload measured at half the predicted speed, with the predicted counts.
        let off = direct.get(StrategyKind::Offload);
        let obs: Vec<Observation> = (0..6)
            .map(|_| Observation {
                strategy: Strategy::Offload,
                streams: 2,
                steps: 32,
                tok_s: off.tok_s_per_stream / 2.0,
                miss_rate: Some(off.miss_rate),
                // Counts per step, summed over layers, as the monitor reports them.
                mean_experts: Some([off.counts.hits, off.counts.fetched, off.counts.cpu]),
                step_us: 2.0 * off.step_us,
                utilisation: None,
            })
            .collect();
        let summary = p.refit(&obs).unwrap();
        assert!(summary.contains("6 window"), "{summary}");
        let after = p.predict(2).unwrap();
        let before = d.estimate(StrategyKind::Offload).unwrap().tok_s.value;
        let now = after.estimate(StrategyKind::Offload).unwrap().tok_s.value;
        let target = off.tok_s_per_stream / 2.0;
        assert!(
            (now - target).abs() < 0.5 * (before - target).abs(),
            "offload {before:.1} -> {now:.1} tok/s, measured {target:.1}"
        );
    }
}
