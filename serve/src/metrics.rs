//! What `GET /metrics` shows: counters and gauges the scheduler and the HTTP layer update,
//! rendered in the Prometheus text exposition format (version 0.0.4).
//!
//! Rates (decode tok/s, miss rate, utilisation) are over the last [`RECENT_STEPS`] decode
//! steps, so they follow the current load; counters are totals since start.

use std::collections::VecDeque;
use std::fmt::Write as _;
use std::sync::Mutex;

use ft_model::Strategy;

use crate::backend::{BusyTimes, ExpertCounts, StepStats};
use crate::predict::Interval;

/// Decode steps the rates are computed over.
pub const RECENT_STEPS: usize = 64;

/// Everything `/metrics` reports (behind a mutex in [`Metrics`]).
#[derive(Debug, Clone, Default)]
pub struct MetricsState {
    /// Model id.
    pub model: String,
    /// Backend name.
    pub backend: String,
    /// Strategy in use.
    pub strategy: Option<Strategy>,
    /// True under `--moe-strategy auto`.
    pub auto: bool,
    /// Steps run (prefill and decode).
    pub steps_total: u64,
    /// Tokens generated (sampled) in all.
    pub generated_tokens_total: u64,
    /// Prompt tokens pushed.
    pub prompt_tokens_total: u64,
    /// Requests by outcome: completed, cancelled (client gone), failed.
    pub completed_total: u64,
    /// Requests whose client went away before the end.
    pub cancelled_total: u64,
    /// Requests that failed in the backend.
    pub failed_total: u64,
    /// Requests refused, by HTTP status.
    pub rejected_total: Vec<(u16, u64)>,
    /// Streams in the current step.
    pub active_streams: usize,
    /// Requests waiting for a slot.
    pub queued: usize,
    /// Recent decode steps: (wall us, streams, counts, busy).
    pub recent: VecDeque<(f64, usize, Option<ExpertCounts>, Option<BusyTimes>)>,
    /// The prediction for the current strategy at the current stream count.
    pub predicted: Option<Interval>,
    /// Stream count of that prediction.
    pub predicted_streams: usize,
    /// Realised tok/s per stream of the last full check window.
    pub realised_window: Option<f64>,
    /// Sustained divergences seen.
    pub divergences_total: u64,
    /// Refits done.
    pub refits_total: u64,
    /// Strategy switches done.
    pub switches_total: u64,
}

impl MetricsState {
    /// Record a decode step.
    pub fn record_decode(&mut self, s: &StepStats) {
        self.recent
            .push_back((s.wall_us, s.streams, s.experts, s.busy));
        while self.recent.len() > RECENT_STEPS {
            self.recent.pop_front();
        }
    }

    /// Per-stream decode tok/s over the recent steps (steps over their wall time).
    pub fn decode_tok_s_per_stream(&self) -> f64 {
        let wall: f64 = self.recent.iter().map(|r| r.0).sum();
        if wall > 0.0 {
            self.recent.len() as f64 * 1e6 / wall
        } else {
            0.0
        }
    }

    /// Aggregate decode tok/s over the recent steps (tokens over wall time).
    pub fn decode_tok_s_total(&self) -> f64 {
        let wall: f64 = self.recent.iter().map(|r| r.0).sum();
        let tokens: usize = self.recent.iter().map(|r| r.1).sum();
        if wall > 0.0 {
            tokens as f64 * 1e6 / wall
        } else {
            0.0
        }
    }

    fn recent_counts(&self) -> Option<ExpertCounts> {
        let mut total = ExpertCounts::default();
        let mut any = false;
        for c in self.recent.iter().filter_map(|r| r.2.as_ref()) {
            total.add(c);
            any = true;
        }
        any.then_some(total)
    }

    fn recent_utilisation(&self) -> Option<[f64; 3]> {
        let wall: f64 = self
            .recent
            .iter()
            .filter(|r| r.3.is_some())
            .map(|r| r.0)
            .sum();
        if wall <= 0.0 {
            return None;
        }
        let mut u = [0.0; 3];
        for b in self.recent.iter().filter_map(|r| r.3.as_ref()) {
            u[0] += b.gpu_us;
            u[1] += b.pcie_us;
            u[2] += b.cpu_us;
        }
        Some(u.map(|x| x / wall))
    }

    /// Count a refused request.
    pub fn reject(&mut self, status: u16) {
        match self.rejected_total.iter_mut().find(|r| r.0 == status) {
            Some(r) => r.1 += 1,
            None => self.rejected_total.push((status, 1)),
        }
    }

    /// The Prometheus text.
    pub fn render(&self) -> String {
        let mut o = String::new();
        let mut metric = |name: &str, kind: &str, help: &str, samples: &[(String, f64)]| {
            let _ = writeln!(o, "# HELP {name} {help}");
            let _ = writeln!(o, "# TYPE {name} {kind}");
            for (labels, v) in samples {
                let _ = writeln!(o, "{name}{labels} {v}");
            }
        };
        let one = |v: f64| vec![(String::new(), v)];
        let strategy = self.strategy.map(|s| s.kind().name()).unwrap_or("none");
        metric(
            "ft_info",
            "gauge",
            "Served model, backend and strategy (value 1).",
            &[(
                format!(
                    "{{model=\"{}\",backend=\"{}\",strategy=\"{strategy}\",mode=\"{}\"}}",
                    esc(&self.model),
                    esc(&self.backend),
                    if self.auto { "auto" } else { "forced" }
                ),
                1.0,
            )],
        );
        let strategies: Vec<(String, f64)> = ft_model::StrategyKind::ALL
            .iter()
            .map(|k| {
                (
                    format!("{{strategy=\"{}\"}}", k.name()),
                    f64::from(u8::from(self.strategy.map(|s| s.kind()) == Some(*k))),
                )
            })
            .collect();
        metric(
            "ft_strategy",
            "gauge",
            "1 for the MoE strategy in use, 0 for the others.",
            &strategies,
        );
        if let Some(f) = self.strategy.and_then(|s| s.fixed_fetch_fraction()) {
            metric(
                "ft_fetch_fraction",
                "gauge",
                "Share of each layer's misses gathered over PCIe (1 offload, 0 cpu).",
                &one(f),
            );
        }
        metric(
            "ft_decode_tokens_per_second",
            "gauge",
            "Realised decode tok/s over the recent decode steps, per stream and in total.",
            &[
                (
                    "{scope=\"per_stream\"}".into(),
                    self.decode_tok_s_per_stream(),
                ),
                ("{scope=\"total\"}".into(), self.decode_tok_s_total()),
            ],
        );
        if let Some(p) = self.predicted {
            metric(
                "ft_predicted_tokens_per_second",
                "gauge",
                "Predicted decode tok/s per stream for the strategy in use at the current stream count, with its interval.",
                &[
                    ("{bound=\"point\"}".into(), p.value),
                    ("{bound=\"low\"}".into(), p.lo),
                    ("{bound=\"high\"}".into(), p.hi),
                ],
            );
            metric(
                "ft_predicted_streams",
                "gauge",
                "Stream count the prediction is for.",
                &one(self.predicted_streams as f64),
            );
        }
        if let Some(r) = self.realised_window {
            metric(
                "ft_realised_tokens_per_second",
                "gauge",
                "Realised decode tok/s per stream of the last full self-check window.",
                &one(r),
            );
        }
        if let Some(c) = self.recent_counts() {
            metric(
                "ft_expert_miss_rate",
                "gauge",
                "Misses over distinct experts looked up, recent decode steps.",
                &one(c.miss_rate()),
            );
            metric(
                "ft_expert_fetched_share",
                "gauge",
                "Fetched share of the misses, recent decode steps.",
                &one(c.fetch_share()),
            );
        }
        if let Some(u) = self.recent_utilisation() {
            metric(
                "ft_utilisation",
                "gauge",
                "Busy time over wall time per resource, recent decode steps.",
                &[
                    ("{resource=\"gpu\"}".into(), u[0]),
                    ("{resource=\"pcie\"}".into(), u[1]),
                    ("{resource=\"cpu\"}".into(), u[2]),
                ],
            );
        }
        metric(
            "ft_active_streams",
            "gauge",
            "Streams in the current decode step.",
            &one(self.active_streams as f64),
        );
        metric(
            "ft_queued_requests",
            "gauge",
            "Requests waiting for a stream slot.",
            &one(self.queued as f64),
        );
        metric(
            "ft_steps_total",
            "counter",
            "Steps run.",
            &one(self.steps_total as f64),
        );
        metric(
            "ft_generated_tokens_total",
            "counter",
            "Tokens generated.",
            &one(self.generated_tokens_total as f64),
        );
        metric(
            "ft_prompt_tokens_total",
            "counter",
            "Prompt tokens pushed through the model.",
            &one(self.prompt_tokens_total as f64),
        );
        let mut outcomes = vec![
            (
                "{outcome=\"completed\"}".to_string(),
                self.completed_total as f64,
            ),
            (
                "{outcome=\"cancelled\"}".to_string(),
                self.cancelled_total as f64,
            ),
            ("{outcome=\"failed\"}".to_string(), self.failed_total as f64),
        ];
        for (status, n) in &self.rejected_total {
            outcomes.push((
                format!("{{outcome=\"rejected\",status=\"{status}\"}}"),
                *n as f64,
            ));
        }
        metric(
            "ft_requests_total",
            "counter",
            "Requests by outcome.",
            &outcomes,
        );
        metric(
            "ft_divergences_total",
            "counter",
            "Sustained divergences of realised from predicted speed or miss rate.",
            &one(self.divergences_total as f64),
        );
        metric(
            "ft_refits_total",
            "counter",
            "Refits of the prediction to measurements.",
            &one(self.refits_total as f64),
        );
        metric(
            "ft_strategy_switches_total",
            "counter",
            "Strategy switches between decode steps.",
            &one(self.switches_total as f64),
        );
        o
    }
}

/// Escape a Prometheus label value.
fn esc(s: &str) -> String {
    s.replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}

/// The shared metrics.
#[derive(Debug, Default)]
pub struct Metrics(pub Mutex<MetricsState>);

impl Metrics {
    /// Run `f` on the state (a poisoned lock is recovered: metrics never stop the server).
    pub fn with<R>(&self, f: impl FnOnce(&mut MetricsState) -> R) -> R {
        let mut g = self.0.lock().unwrap_or_else(|e| e.into_inner());
        f(&mut g)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rates_and_text_format() {
        let mut m = MetricsState {
            model: "m\"x".into(),
            strategy: Some(Strategy::Offload),
            ..MetricsState::default()
        };
        for _ in 0..(RECENT_STEPS + 10) {
            m.record_decode(&StepStats {
                wall_us: 10_000.0,
                streams: 2,
                tokens: 2,
                experts: Some(ExpertCounts {
                    hits: 3,
                    misses: 1,
                    fetched: 1,
                    cpu: 0,
                }),
                busy: Some(BusyTimes {
                    gpu_us: 5000.0,
                    pcie_us: 2500.0,
                    cpu_us: 0.0,
                }),
            });
        }
        assert_eq!(m.recent.len(), RECENT_STEPS);
        assert!((m.decode_tok_s_per_stream() - 100.0).abs() < 1e-9);
        assert!((m.decode_tok_s_total() - 200.0).abs() < 1e-9);
        m.reject(429);
        m.reject(429);
        let text = m.render();
        for needle in [
            "ft_decode_tokens_per_second{scope=\"per_stream\"} 100",
            "ft_expert_miss_rate 0.25",
            "ft_utilisation{resource=\"pcie\"} 0.25",
            "ft_strategy{strategy=\"offload\"} 1",
            "ft_fetch_fraction 1",
            "model=\"m\\\"x\"",
            "ft_requests_total{outcome=\"rejected\",status=\"429\"} 2",
        ] {
            assert!(text.contains(needle), "{needle} in\n{text}");
        }
        // Every sample line is `name{labels} value` with a parseable value.
        for line in text.lines().filter(|l| !l.starts_with('#')) {
            let v = line.rsplit(' ').next().unwrap();
            assert!(v.parse::<f64>().is_ok(), "{line}");
        }
    }
}
