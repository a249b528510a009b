//! What the server expects a decode step to cost: the start-up decision and its refits.
//!
//! The scheduler does not know how predictions are made; it talks to a [`Predictor`]: "for
//! B streams, what tok/s (with an interval) and miss rate does each strategy give, and which
//! is best?", and "here are measurements, refit". The performance model of `ft_model::perf`
//! is one predictor (adapted in [`crate::perf_adapter`]); [`TablePredictor`] is another, a
//! table of numbers given outright (what-if hosts, tests). [`Corrected`] wraps any predictor
//! and, on refit, first refits the inner one and then scales each strategy's prediction by
//! what was measured for it, so a prediction that stays wrong is corrected by the data the
//! server has seen.
//!
//! All tok/s here are per stream: at B streams one decode step yields B tokens, one per
//! stream, so per-stream tok/s is steps per second.

use std::collections::BTreeMap;

use ft_model::{Strategy, StrategyKind};
use serde::Serialize;

use crate::error::{Result, ServeError};

/// A value with an interval (`lo <= value <= hi`).
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct Interval {
    /// Point estimate.
    pub value: f64,
    /// Lower end.
    pub lo: f64,
    /// Upper end.
    pub hi: f64,
}

impl Interval {
    /// `value` with a symmetric relative half-width `rel` (0.1 = +-10%).
    pub fn relative(value: f64, rel: f64) -> Self {
        Interval {
            value,
            lo: value * (1.0 - rel),
            hi: value * (1.0 + rel),
        }
    }

    /// True when `x` lies in `[lo, hi]`.
    pub fn contains(&self, x: f64) -> bool {
        x >= self.lo && x <= self.hi
    }

    /// The interval scaled by `k > 0`.
    pub fn scaled(&self, k: f64) -> Self {
        Interval {
            value: self.value * k,
            lo: self.lo * k,
            hi: self.hi * k,
        }
    }

    /// True when the two intervals overlap.
    pub fn overlaps(&self, o: &Interval) -> bool {
        self.lo <= o.hi && o.lo <= self.hi
    }
}

/// One strategy's prediction at a stream count.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct StrategyEstimate {
    /// The strategy, hybrid with the fetch fraction the prediction is for.
    pub strategy: Strategy,
    /// Decode tok/s per stream.
    pub tok_s: Interval,
    /// Expert miss rate (misses over distinct experts looked up), where predicted.
    pub miss_rate: Option<Interval>,
    /// The resource that bounds the step, in words, where known.
    pub bound: Option<String>,
    /// False when the strategy cannot run here (e.g. resident does not fit in GPU memory).
    pub feasible: bool,
    /// Why it is infeasible, or another remark.
    pub note: Option<String>,
}

/// The legacy verdict: `cpu_moe_GBs / pcie_gather_GBs > threshold -> hybrid`.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct LegacyVerdict {
    /// The bandwidth ratio.
    pub ratio: f64,
    /// Its threshold (2.0 in the reference engine).
    pub threshold: f64,
    /// What the ratio picks.
    pub verdict: StrategyKind,
}

/// A prediction for every strategy at one stream count, and auto's choice.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Decision {
    /// Concurrent streams the prediction is for.
    pub streams: usize,
    /// Where the prediction comes from (profile, perf model with a host spec, table...).
    pub source: String,
    /// The legacy ratio's verdict, where the predictor knows the bandwidths.
    pub legacy: Option<LegacyVerdict>,
    /// One estimate per strategy, in table order.
    pub estimates: Vec<StrategyEstimate>,
    /// The feasible strategy with the highest predicted tok/s.
    pub choice: Strategy,
    /// Relative margin of the choice over the runner-up (0.21 = 21% faster); 0 without one.
    pub margin: f64,
    /// True when the choice's interval overlaps the runner-up's (a near tie).
    pub overlap: bool,
}

impl Decision {
    /// Build from estimates: choose the feasible one with the highest point tok/s (ties to
    /// table order), and compute the margin over the runner-up. Errors when none is feasible.
    pub fn from_estimates(
        streams: usize,
        source: String,
        legacy: Option<LegacyVerdict>,
        estimates: Vec<StrategyEstimate>,
    ) -> Result<Self> {
        let mut feasible: Vec<&StrategyEstimate> =
            estimates.iter().filter(|e| e.feasible).collect();
        feasible.sort_by(|a, b| b.tok_s.value.total_cmp(&a.tok_s.value));
        let Some(best) = feasible.first() else {
            return Err(ServeError::invalid(
                "prediction",
                format!("no strategy is feasible at {streams} stream(s)"),
            ));
        };
        let (margin, overlap) = match feasible.get(1) {
            Some(second) if second.tok_s.value > 0.0 => (
                best.tok_s.value / second.tok_s.value - 1.0,
                best.tok_s.overlaps(&second.tok_s),
            ),
            _ => (0.0, false),
        };
        Ok(Decision {
            streams,
            source,
            legacy,
            choice: best.strategy,
            margin,
            overlap,
            estimates,
        })
    }

    /// The estimate of a strategy kind.
    pub fn estimate(&self, kind: StrategyKind) -> Option<&StrategyEstimate> {
        self.estimates.iter().find(|e| e.strategy.kind() == kind)
    }

    /// The runner-up behind the choice.
    fn runner_up(&self) -> Option<&StrategyEstimate> {
        let mut f: Vec<&StrategyEstimate> = self.estimates.iter().filter(|e| e.feasible).collect();
        f.sort_by(|a, b| b.tok_s.value.total_cmp(&a.tok_s.value));
        f.get(1).copied()
    }

    /// The one start-up log line: the legacy ratio, its threshold and verdict, each
    /// strategy's prediction with its interval, the choice and the margin. With a forced
    /// strategy it says what auto would have chosen.
    pub fn log_line(&self, forced: Option<&Strategy>) -> String {
        let mut s = String::new();
        match &self.legacy {
            Some(l) => {
                s += &format!(
                    "legacy ratio {:.2} (threshold {:.1}: {}) | ",
                    l.ratio,
                    l.threshold,
                    if l.ratio > l.threshold {
                        format!("above -> {}", l.verdict)
                    } else {
                        format!("not above -> {}", l.verdict)
                    }
                )
            }
            None => s += "legacy ratio n/a | ",
        }
        s += &format!(
            "predicted at {} stream(s) [{}]: ",
            self.streams, self.source
        );
        let parts: Vec<String> = self
            .estimates
            .iter()
            .map(|e| {
                if e.feasible {
                    let mut p = format!(
                        "{} {:.1} [{:.1}, {:.1}] tok/s",
                        e.strategy, e.tok_s.value, e.tok_s.lo, e.tok_s.hi
                    );
                    if let Some(m) = e.miss_rate {
                        p += &format!(" miss {:.0}%", 100.0 * m.value);
                    }
                    if let Some(b) = &e.bound {
                        p += &format!(" ({b}-bound)");
                    }
                    p
                } else {
                    format!(
                        "{} n/a ({})",
                        e.strategy.kind(),
                        e.note.as_deref().unwrap_or("infeasible")
                    )
                }
            })
            .collect();
        s += &parts.join(", ");
        let runner = self
            .runner_up()
            .map(|r| format!(" over {}", r.strategy.kind()))
            .unwrap_or_default();
        let tie = if self.overlap {
            " (intervals overlap: a near tie)"
        } else {
            ""
        };
        match forced {
            None => {
                s += &format!(
                    " | choice {} (auto), margin {:+.1}%{runner}{tie}",
                    self.choice,
                    100.0 * self.margin
                );
            }
            Some(f) => {
                s += &format!(
                    " | strategy {f} (forced); auto would choose {}, margin {:+.1}%{runner}{tie}",
                    self.choice,
                    100.0 * self.margin
                );
                if f.kind() != self.choice.kind() {
                    if let (Some(a), Some(b)) =
                        (self.estimate(f.kind()), self.estimate(self.choice.kind()))
                    {
                        if b.tok_s.value > 0.0 && a.feasible {
                            s += &format!(
                                "; forced is predicted {:+.1}% against it",
                                100.0 * (a.tok_s.value / b.tok_s.value - 1.0)
                            );
                        }
                    }
                }
            }
        }
        s
    }
}

/// What the server measured over a window of decode steps at one strategy and stream count.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Observation {
    /// The strategy the steps ran under.
    pub strategy: Strategy,
    /// Streams per step.
    pub streams: usize,
    /// Steps in the window.
    pub steps: usize,
    /// Realised decode tok/s per stream (steps over their wall time).
    pub tok_s: f64,
    /// Realised miss rate, where the backend plans layers.
    pub miss_rate: Option<f64>,
    /// Mean distinct experts per step, summed over layers: (hits, fetched, cpu), where the
    /// backend plans layers.
    pub mean_experts: Option<[f64; 3]>,
    /// Mean step wall time, us.
    pub step_us: f64,
    /// Utilisation (busy over wall) of GPU, PCIe and CPU, where measured.
    pub utilisation: Option<[f64; 3]>,
}

/// A source of predictions that can be refitted to measurements.
pub trait Predictor: Send {
    /// Predict every strategy at `streams` concurrent streams.
    fn predict(&self, streams: usize) -> Result<Decision>;

    /// Refit to `observations` (all the server kept, oldest first). Returns a one-line
    /// summary of what changed.
    fn refit(&mut self, observations: &[Observation]) -> Result<String>;
}

impl<T: Predictor + ?Sized> Predictor for Box<T> {
    fn predict(&self, streams: usize) -> Result<Decision> {
        (**self).predict(streams)
    }
    fn refit(&mut self, observations: &[Observation]) -> Result<String> {
        (**self).refit(observations)
    }
}

/// One row of a [`TablePredictor`]: a strategy's speed at one stream and how it scales.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct TableRow {
    /// The strategy (hybrid with its fetch fraction).
    pub strategy: Strategy,
    /// Per-stream tok/s at one stream.
    pub tok_s_1: f64,
    /// Per-stream slowdown per extra stream: tok/s at B streams is
    /// `tok_s_1 / (1 + slowdown (B - 1))`.
    pub slowdown: f64,
    /// Relative half-width of the tok/s interval.
    pub rel_interval: f64,
    /// Predicted miss rate, where given.
    pub miss_rate: Option<Interval>,
}

/// Predictions given outright as a table (what-if hosts and tests). Refit does nothing:
/// wrap it in [`Corrected`] to learn from measurements.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct TablePredictor {
    /// Rows, one per strategy; kinds without a row are infeasible.
    pub rows: Vec<TableRow>,
}

impl Predictor for TablePredictor {
    fn predict(&self, streams: usize) -> Result<Decision> {
        let b = streams.max(1) as f64;
        let estimates = StrategyKind::ALL
            .iter()
            .map(
                |&kind| match self.rows.iter().find(|r| r.strategy.kind() == kind) {
                    Some(r) => StrategyEstimate {
                        strategy: r.strategy,
                        tok_s: Interval::relative(
                            r.tok_s_1 / (1.0 + r.slowdown * (b - 1.0)),
                            r.rel_interval,
                        ),
                        miss_rate: r.miss_rate,
                        bound: None,
                        feasible: true,
                        note: None,
                    },
                    None => StrategyEstimate {
                        strategy: Strategy::from_kind(kind, None),
                        tok_s: Interval::relative(0.0, 0.0),
                        miss_rate: None,
                        bound: None,
                        feasible: false,
                        note: Some("not in the table".into()),
                    },
                },
            )
            .collect();
        Decision::from_estimates(streams, "table".into(), None, estimates)
    }

    fn refit(&mut self, _observations: &[Observation]) -> Result<String> {
        Ok("table predictions are fixed".into())
    }
}

/// Observations kept per strategy kind for a correction (older ones are dropped).
const CORRECTION_WINDOW: usize = 16;

/// A predictor whose refit also learns a multiplicative correction per strategy kind (the
/// geometric mean of measured over predicted tok/s) and the measured miss rate, from the
/// latest `CORRECTION_WINDOW` observations of that kind. Kinds never measured keep the
/// inner prediction.
pub struct Corrected<P> {
    inner: P,
    /// Per kind: tok/s factor and, where measured, the mean miss rate with its spread.
    corrections: BTreeMap<StrategyKind, (f64, Option<Interval>)>,
}

impl<P: Predictor> Corrected<P> {
    /// Wrap `inner` with no correction yet.
    pub fn new(inner: P) -> Self {
        Corrected {
            inner,
            corrections: BTreeMap::new(),
        }
    }

    /// The inner predictor.
    pub fn inner(&self) -> &P {
        &self.inner
    }
}

impl<P: Predictor> Predictor for Corrected<P> {
    fn predict(&self, streams: usize) -> Result<Decision> {
        let base = self.inner.predict(streams)?;
        if self.corrections.is_empty() {
            return Ok(base);
        }
        let estimates = base
            .estimates
            .into_iter()
            .map(|mut e| {
                if let Some((k, miss)) = self.corrections.get(&e.strategy.kind()) {
                    e.tok_s = e.tok_s.scaled(*k);
                    if miss.is_some() {
                        e.miss_rate = *miss;
                    }
                    e.note = Some(format!("corrected x{k:.2} from measurements"));
                }
                e
            })
            .collect();
        Decision::from_estimates(
            streams,
            format!("{} + measured corrections", base.source),
            base.legacy,
            estimates,
        )
    }

    fn refit(&mut self, observations: &[Observation]) -> Result<String> {
        let inner = self.inner.refit(observations)?;
        let mut out = vec![inner];
        let mut by_kind: BTreeMap<StrategyKind, Vec<&Observation>> = BTreeMap::new();
        for o in observations {
            by_kind.entry(o.strategy.kind()).or_default().push(o);
        }
        for (kind, obs) in by_kind {
            let obs = &obs[obs.len().saturating_sub(CORRECTION_WINDOW)..];
            let mut log_sum = 0.0;
            let mut n = 0usize;
            for o in obs {
                let predicted = self.inner.predict(o.streams)?;
                if let Some(e) = predicted.estimate(kind) {
                    if e.tok_s.value > 0.0 && o.tok_s > 0.0 {
                        log_sum += (o.tok_s / e.tok_s.value).ln();
                        n += 1;
                    }
                }
            }
            if n == 0 {
                continue;
            }
            let k = (log_sum / n as f64).exp();
            let misses: Vec<f64> = obs.iter().filter_map(|o| o.miss_rate).collect();
            let miss = (!misses.is_empty()).then(|| {
                let mean = misses.iter().sum::<f64>() / misses.len() as f64;
                let lo = misses.iter().copied().fold(f64::INFINITY, f64::min);
                let hi = misses.iter().copied().fold(f64::NEG_INFINITY, f64::max);
                Interval {
                    value: mean,
                    lo,
                    hi,
                }
            });
            self.corrections.insert(kind, (k, miss));
            out.push(format!("{kind}: x{k:.3} over {n} window(s)"));
        }
        Ok(out.join("; "))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use ft_model::FetchFraction;

    fn hybrid() -> Strategy {
        Strategy::Hybrid {
            fetch: FetchFraction::Fixed(0.3),
        }
    }

    fn table() -> TablePredictor {
        TablePredictor {
            rows: vec![
                TableRow {
                    strategy: Strategy::Offload,
                    tok_s_1: 100.0,
                    slowdown: 0.5,
                    rel_interval: 0.1,
                    miss_rate: None,
                },
                TableRow {
                    strategy: hybrid(),
                    tok_s_1: 80.0,
                    slowdown: 0.1,
                    rel_interval: 0.1,
                    miss_rate: None,
                },
            ],
        }
    }

    #[test]
    fn decision_picks_the_fastest_feasible_and_says_why() {
        let d = table().predict(1).unwrap();
        assert_eq!(d.choice, Strategy::Offload);
        assert!((d.margin - 0.25).abs() < 1e-12);
        assert!(!d.overlap, "[90,110] and [72,88] do not overlap");
        // At 3 streams offload is 100/2 = 50, hybrid 80/1.2 = 66.7.
        let d3 = table().predict(3).unwrap();
        assert_eq!(d3.choice.kind(), StrategyKind::Hybrid);
        let line = d3.log_line(None);
        for needle in [
            "legacy ratio n/a",
            "3 stream(s)",
            "hybrid(f=0.300) 66.7",
            "choice hybrid",
            "resident n/a",
        ] {
            assert!(line.contains(needle), "{needle} in {line}");
        }
        let forced = d3.log_line(Some(&Strategy::Offload));
        assert!(
            forced.contains("offload (forced); auto would choose hybrid"),
            "{forced}"
        );
        assert!(forced.contains("-25.0% against it"), "{forced}");
        let none = TablePredictor { rows: vec![] }.predict(1);
        assert!(none.is_err());
    }

    /// The correction is the geometric mean of measured over predicted, per kind, and it can
    /// flip the choice.
    #[test]
    fn corrected_refit_learns_from_measurements() {
        let mut p = Corrected::new(table());
        let obs = |tok_s: f64, streams: usize| Observation {
            strategy: Strategy::Offload,
            streams,
            steps: 32,
            tok_s,
            miss_rate: Some(0.4),
            mean_experts: None,
            step_us: 1e6 / tok_s,
            utilisation: None,
        };
        // Offload measured at 40 and 60 tok/s at 1 stream: factor sqrt(0.4 * 0.6).
        let summary = p.refit(&[obs(40.0, 1), obs(60.0, 1)]).unwrap();
        assert!(summary.contains("offload"), "{summary}");
        let d = p.predict(1).unwrap();
        let k = (0.4f64 * 0.6).sqrt();
        let off = d.estimate(StrategyKind::Offload).unwrap();
        assert!((off.tok_s.value - 100.0 * k).abs() < 1e-9);
        assert_eq!(off.miss_rate.unwrap().value, 0.4);
        assert_eq!(d.choice.kind(), StrategyKind::Hybrid, "80 beats 49");
        // Hybrid was never measured: unchanged.
        assert_eq!(d.estimate(StrategyKind::Hybrid).unwrap().tok_s.value, 80.0);
    }
}
