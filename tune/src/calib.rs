//! What tune asks of a calibration: every candidate configuration's tok/s at the decision's
//! target, with a standard error, from the runs so far.
//!
//! [`Calibrator`] is the seam. [`Measured`] answers from the measurements alone (the mean of
//! a configuration's runs at the target's streams, measure and cache, its standard error
//! from their spread with a noise
//! floor; nothing for a configuration not yet run): it needs no host inputs and assumes no
//! model, so it is also the reference a model-based calibrator is checked against on the
//! configurations both can see.

use ft_model::observe::{Measure, Observation, ObservedCache, ObservedStrategy};
use ft_model::perf::breakeven::BreakEvens;
use serde::Serialize;

use crate::error::Result;

/// Two-sided 95% normal quantile: intervals are `tok/s ± Z * se`.
pub const INTERVAL_Z: f64 = 1.96;

/// Relative run-to-run noise assumed where a configuration has fewer than two runs, and half
/// of it as the floor of a measured spread: two runs can agree by chance far more closely
/// than a service repeats (the field report's two offload services differed by 0.2%; ft
/// serve's host device by a few percent between services).
pub const DEFAULT_REL_NOISE: f64 = 0.05;

/// Fetch fractions closer than this are the same configuration.
const FRACTION_EPS: f64 = 1e-9;

/// What the decision is about: tok/s per stream at these streams and lengths, as `measure`.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct Target {
    /// Concurrent streams.
    pub streams: usize,
    /// Prompt length, tokens.
    pub prompt_tokens: usize,
    /// Output tokens per request.
    pub output_tokens: usize,
    /// What tok/s measures.
    pub measure: Measure,
    /// The engine's expert cache (for cached strategies).
    pub cache: Option<ObservedCache>,
}

/// What tune asks a [`Calibrator`]: the runs so far, the configurations to choose between,
/// and what the decision is about (one value, so every method and caller names them once).
#[derive(Debug, Clone, Copy)]
pub struct Question<'a> {
    /// The runs so far.
    pub runs: &'a [Observation],
    /// The configurations to choose between.
    pub candidates: &'a [ObservedStrategy],
    /// The decision's streams, lengths, measure and cache.
    pub target: &'a Target,
}

/// One candidate's estimate at the target.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct Estimate {
    /// tok/s per stream.
    pub tok_s: f64,
    /// Its standard error, tok/s.
    pub se: f64,
    /// Runs of this very configuration at the target behind it.
    pub runs: usize,
}

impl Estimate {
    /// The interval's bounds, `tok_s ± INTERVAL_Z * se`.
    pub fn interval(&self) -> (f64, f64) {
        (
            self.tok_s - INTERVAL_Z * self.se,
            self.tok_s + INTERVAL_Z * self.se,
        )
    }
}

/// Turns runs into estimates (see the module docs).
pub trait Calibrator {
    /// A name for reports (`measured`, `calibrate`).
    fn name(&self) -> String;

    /// Each candidate's estimate at the target (`None` where the runs say nothing of it).
    fn estimate(&self, q: Question<'_>) -> Result<Vec<Option<Estimate>>>;

    /// Each candidate's prediction at the target from host inputs alone (the runs unused),
    /// where the calibrator has a host model: the bench-only answer the runs are set against.
    fn host_only(&self, q: Question<'_>) -> Result<Vec<Option<f64>>> {
        Ok(vec![None; q.candidates.len()])
    }

    /// The break-evens of the decision for `q.candidates[choice]` at the target, from the
    /// model calibrated to the runs, where the calibrator has a model to move the inputs of.
    fn break_evens(&self, q: Question<'_>, choice: usize) -> Result<BreakEvenSection> {
        let _ = (q, choice);
        Ok(BreakEvenSection::NotAvailable {
            why: "no host model to move the inputs of: give --host or --profile".into(),
        })
    }
}

/// Tune's break-evens: how far each uncertain input must move for the decision to flip
/// (`ft_model::perf::breakeven`), or why there are none.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(tag = "status", rename_all = "kebab-case")]
pub enum BreakEvenSection {
    /// Computed from the calibrated model, in decode tok/s at the target's streams and
    /// context, among the candidates' strategies only.
    Computed {
        /// The strategy they are of: the calibrated model's choice among the candidates'
        /// strategies (as `ft predict` names it).
        of: String,
        /// Whether that is the strategy of tune's choice (made from the runs where a
        /// candidate was measured at the target).
        agrees_with_choice: bool,
        /// Every input's break-even.
        break_evens: BreakEvens,
    },
    /// Not computed, and why.
    NotAvailable {
        /// Why.
        why: String,
    },
}

/// Whether two configurations are the same (fetch fractions compared with a tolerance).
pub fn same_config(a: &ObservedStrategy, b: &ObservedStrategy) -> bool {
    match (a, b) {
        (
            ObservedStrategy::Hybrid { fetch_fraction: x },
            ObservedStrategy::Hybrid { fetch_fraction: y },
        ) => (x - y).abs() < FRACTION_EPS,
        _ => a == b,
    }
}

/// Estimates from the measurements alone (see the module docs).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Measured {
    /// Relative noise assumed below two runs (and half of it as a floor).
    pub rel_noise: f64,
}

impl Default for Measured {
    fn default() -> Self {
        Measured {
            rel_noise: DEFAULT_REL_NOISE,
        }
    }
}

impl Calibrator for Measured {
    fn name(&self) -> String {
        "measured (no model: each configuration's own runs)".into()
    }

    fn estimate(&self, q: Question<'_>) -> Result<Vec<Option<Estimate>>> {
        let (runs, candidates, target) = (q.runs, q.candidates, q.target);
        Ok(candidates
            .iter()
            .map(|c| {
                let xs: Vec<f64> = runs
                    .iter()
                    .filter(|o| {
                        same_config(&o.strategy, c)
                            && o.streams == target.streams
                            && o.measure == target.measure
                            && (!c.needs_cache() || o.cache == target.cache)
                    })
                    .map(|o| o.tok_s_per_stream)
                    .collect();
                let n = xs.len();
                if n == 0 {
                    return None;
                }
                let mean = xs.iter().sum::<f64>() / n as f64;
                let prior = self.rel_noise * mean;
                let sd = if n >= 2 {
                    let var = xs.iter().map(|x| (x - mean).powi(2)).sum::<f64>() / (n - 1) as f64;
                    var.sqrt().max(prior / 2.0)
                } else {
                    prior
                };
                Some(Estimate {
                    tok_s: mean,
                    se: sd / (n as f64).sqrt(),
                    runs: n,
                })
            })
            .collect())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use ft_model::observe::parse_observations;

    #[test]
    fn measured_estimates_are_each_configurations_own_runs() {
        let runs = parse_observations(
            "strategy,fetch_fraction,streams,output_tokens,cache_gb,tok_s,measure\n\
             offload,,2,16,1,10,client-e2e\n\
             offload,,2,16,1,12,client-e2e\n\
             offload,,1,16,1,99,client-e2e\n\
             offload,,2,16,1,99,decode\n\
             offload,,2,16,2,99,client-e2e\n\
             hybrid,0.5,2,16,1,20,client-e2e\n",
            "t.csv",
        )
        .unwrap();
        let target = Target {
            streams: 2,
            prompt_tokens: 0,
            output_tokens: 16,
            measure: Measure::ClientE2e,
            cache: Some(ObservedCache::Gib(1.0)),
        };
        let cands = [
            ObservedStrategy::Offload,
            ObservedStrategy::Hybrid {
                fetch_fraction: 0.5,
            },
            ObservedStrategy::Cpu,
        ];
        let e = Measured::default()
            .estimate(Question {
                runs: &runs,
                candidates: &cands,
                target: &target,
            })
            .unwrap();
        let off = e[0].unwrap();
        assert_eq!((off.tok_s, off.runs), (11.0, 2));
        // sd of {10, 12} = sqrt(2); se = sqrt(2)/sqrt(2) = 1.
        assert!((off.se - 1.0).abs() < 1e-12, "{off:?}");
        let hy = e[1].unwrap();
        assert!((hy.se - 20.0 * DEFAULT_REL_NOISE).abs() < 1e-12);
        assert_eq!(e[2], None);
        let (lo, hi) = hy.interval();
        assert!(lo < 20.0 && hi > 20.0);
    }
}
