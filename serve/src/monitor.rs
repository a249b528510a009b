//! The server checking itself: realised decode speed and miss rate against the prediction.
//!
//! Decode steps (every stream pushing one token) are grouped into windows of
//! [`CheckConfig::window_steps`] consecutive steps at one strategy and stream count; a step
//! with prompt tokens in it, or a change of stream count or strategy, closes the window early
//! and discards it (its steps are not comparable). Each full window becomes an
//! [`Observation`] and is compared with the current prediction for that stream count: it is
//! *divergent* when its tok/s, or its miss rate where both are known, lies outside the
//! predicted interval. [`CheckConfig::sustain`] divergent windows in a row make a
//! [`Divergence`], which the scheduler answers by refitting and, under `auto`, possibly
//! switching strategy between two steps.

use std::collections::VecDeque;

use ft_model::Strategy;
use serde::{Deserialize, Serialize};

use crate::backend::{ExpertCounts, StepStats};
use crate::predict::{Decision, Observation, StrategyEstimate};

/// Observations kept for refits (oldest dropped first).
pub const KEPT_OBSERVATIONS: usize = 256;

/// How the self-check groups and judges steps.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct CheckConfig {
    /// Decode steps per window.
    pub window_steps: usize,
    /// Divergent windows in a row that count as sustained.
    pub sustain: usize,
    /// Whether to check at all.
    pub enabled: bool,
}

impl Default for CheckConfig {
    /// 32-step windows, 3 in a row: at 20-30 tok/s about 4 s of decoding before the server
    /// reacts, long enough that one slow step (a page fault, a preempted thread) does not
    /// count, short enough to matter within one 256-token request.
    fn default() -> Self {
        CheckConfig {
            window_steps: 32,
            sustain: 3,
            enabled: true,
        }
    }
}

/// A sustained disagreement between measurement and prediction.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Divergence {
    /// The last divergent window.
    pub observed: Observation,
    /// The prediction it was compared with.
    pub predicted: StrategyEstimate,
    /// What diverged, in words (tok/s, miss rate).
    pub what: Vec<String>,
}

#[derive(Debug, Clone, Default)]
struct Window {
    strategy: Option<Strategy>,
    streams: usize,
    steps: usize,
    wall_us: f64,
    counts: ExpertCounts,
    has_counts: bool,
    busy: [f64; 3],
    has_busy: bool,
}

/// See the module docs.
#[derive(Debug, Clone)]
pub struct Monitor {
    cfg: CheckConfig,
    window: Window,
    divergent_run: usize,
    observations: VecDeque<Observation>,
    last: Option<Observation>,
}

impl Monitor {
    /// A monitor with no history.
    pub fn new(cfg: CheckConfig) -> Self {
        Monitor {
            cfg,
            window: Window::default(),
            divergent_run: 0,
            observations: VecDeque::new(),
            last: None,
        }
    }

    /// The configuration.
    pub fn config(&self) -> &CheckConfig {
        &self.cfg
    }

    /// Observations kept, oldest first.
    pub fn observations(&self) -> Vec<Observation> {
        self.observations.iter().cloned().collect()
    }

    /// The latest full window.
    pub fn last(&self) -> Option<&Observation> {
        self.last.as_ref()
    }

    /// Forget the divergent run and the open window (after a refit or a switch).
    pub fn restart(&mut self) {
        self.divergent_run = 0;
        self.window = Window::default();
    }

    /// Feed one step. `decode_only`: every stream pushed exactly one token. `prediction`
    /// gives the current decision for the step's stream count, where there is one. Returns
    /// a divergence when one became sustained with this step.
    pub fn observe(
        &mut self,
        strategy: &Strategy,
        stats: &StepStats,
        decode_only: bool,
        prediction: Option<&Decision>,
    ) -> Option<Divergence> {
        if !decode_only || stats.streams == 0 {
            self.window = Window::default();
            return None;
        }
        let w = &mut self.window;
        if w.strategy.as_ref() != Some(strategy) || w.streams != stats.streams {
            *w = Window {
                strategy: Some(*strategy),
                streams: stats.streams,
                ..Window::default()
            };
        }
        w.steps += 1;
        w.wall_us += stats.wall_us;
        if let Some(c) = &stats.experts {
            w.counts.add(c);
            w.has_counts = true;
        }
        if let Some(b) = &stats.busy {
            w.busy[0] += b.gpu_us;
            w.busy[1] += b.pcie_us;
            w.busy[2] += b.cpu_us;
            w.has_busy = true;
        }
        if w.steps < self.cfg.window_steps.max(1) {
            return None;
        }
        let w = std::mem::take(&mut self.window);
        let obs = Observation {
            strategy: *strategy,
            streams: w.streams,
            steps: w.steps,
            tok_s: if w.wall_us > 0.0 {
                w.steps as f64 * 1e6 / w.wall_us
            } else {
                0.0
            },
            miss_rate: w.has_counts.then(|| w.counts.miss_rate()),
            mean_experts: w.has_counts.then(|| {
                let n = w.steps as f64;
                [
                    w.counts.hits as f64 / n,
                    w.counts.fetched as f64 / n,
                    w.counts.cpu as f64 / n,
                ]
            }),
            step_us: w.wall_us / w.steps as f64,
            utilisation: (w.has_busy && w.wall_us > 0.0).then(|| w.busy.map(|b| b / w.wall_us)),
        };
        self.observations.push_back(obs.clone());
        while self.observations.len() > KEPT_OBSERVATIONS {
            self.observations.pop_front();
        }
        self.last = Some(obs.clone());
        if !self.cfg.enabled {
            return None;
        }
        let estimate = prediction.and_then(|d| d.estimate(strategy.kind()))?;
        let mut what = Vec::new();
        if !estimate.tok_s.contains(obs.tok_s) {
            what.push(format!(
                "decode {:.1} tok/s per stream outside the predicted {:.1} [{:.1}, {:.1}]",
                obs.tok_s, estimate.tok_s.value, estimate.tok_s.lo, estimate.tok_s.hi
            ));
        }
        if let (Some(m), Some(p)) = (obs.miss_rate, estimate.miss_rate) {
            if !p.contains(m) {
                what.push(format!(
                    "miss rate {:.1}% outside the predicted {:.1}% [{:.1}%, {:.1}%]",
                    100.0 * m,
                    100.0 * p.value,
                    100.0 * p.lo,
                    100.0 * p.hi
                ));
            }
        }
        if what.is_empty() {
            self.divergent_run = 0;
            return None;
        }
        self.divergent_run += 1;
        if self.divergent_run < self.cfg.sustain.max(1) {
            return None;
        }
        self.divergent_run = 0;
        Some(Divergence {
            observed: obs,
            predicted: estimate.clone(),
            what,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::predict::{Predictor, TablePredictor, TableRow};

    fn stats(wall_us: f64, streams: usize) -> StepStats {
        StepStats {
            wall_us,
            streams,
            tokens: streams,
            experts: Some(ExpertCounts {
                hits: 3,
                misses: 1,
                fetched: 1,
                cpu: 0,
                gathered_bytes: 0,
            }),
            busy: None,
        }
    }

    fn decision() -> Decision {
        TablePredictor {
            rows: vec![TableRow {
                strategy: Strategy::Offload,
                tok_s_1: 100.0,
                slowdown: 0.0,
                rel_interval: 0.1,
                miss_rate: None,
            }],
        }
        .predict(1)
        .unwrap()
    }

    #[test]
    fn sustained_divergence_is_reported_once_per_run() {
        let cfg = CheckConfig {
            window_steps: 4,
            sustain: 2,
            enabled: true,
        };
        let mut m = Monitor::new(cfg);
        let d = decision();
        // Within the interval (100 tok/s = 10 ms): never divergent.
        for _ in 0..40 {
            assert!(m
                .observe(&Strategy::Offload, &stats(10_000.0, 1), true, Some(&d))
                .is_none());
        }
        assert_eq!(m.observations().len(), 10);
        let last = m.last().unwrap();
        assert!((last.tok_s - 100.0).abs() < 1e-9);
        assert_eq!(last.miss_rate, Some(0.25));
        // At 50 tok/s: the second full window reports.
        let mut reports = Vec::new();
        for i in 0..16 {
            if let Some(r) = m.observe(&Strategy::Offload, &stats(20_000.0, 1), true, Some(&d)) {
                reports.push((i, r));
            }
        }
        assert_eq!(
            reports.iter().map(|r| r.0).collect::<Vec<_>>(),
            vec![7, 15],
            "every second window"
        );
        assert!(
            reports[0].1.what[0].contains("50.0 tok/s"),
            "{:?}",
            reports[0].1.what
        );
        // A prefill step or another stream count discards the open window.
        for _ in 0..3 {
            m.observe(&Strategy::Offload, &stats(20_000.0, 1), true, Some(&d));
        }
        m.observe(&Strategy::Offload, &stats(20_000.0, 1), false, Some(&d));
        let n = m.observations().len();
        for _ in 0..3 {
            m.observe(&Strategy::Offload, &stats(20_000.0, 1), true, Some(&d));
        }
        assert_eq!(
            m.observations().len(),
            n,
            "window restarted after the prefill step"
        );
    }
}
