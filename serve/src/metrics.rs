//! What `GET /metrics` shows, kept in a `prometheus` registry and rendered by its text
//! encoder (exposition format 0.0.4).
//!
//! Why it exists: the server is where the project's claim is paid for, so what it did has to
//! be readable by the tools operators already run. Everything that accumulates is a counter
//! (`_total`: requests, responses by status, tokens, expert hits, misses, fetched and
//! CPU-computed experts, bytes gathered, resource busy seconds), so `rate()` gives any window;
//! latencies are histograms in seconds (time to first token, inter-token latency, request
//! duration, decode step duration); gauges hold only what is true *now* (streams in the step,
//! requests queued, connections open, the strategy in use and its prediction), and the load
//! gauges return to zero when the server is idle. `ft_info` carries the version, model,
//! backend and strategy as labels; on Linux the registry also holds the crate's process
//! collector (`process_cpu_seconds_total`, `process_resident_memory_bytes`, open fds, ...).
//!
//! Each server has its own registry (not the crate's global one), so several servers in one
//! process (the tests) never mix their counts.

use std::sync::Mutex;

use ft_model::Strategy;
use prometheus::{
    Counter, CounterVec, Encoder, Gauge, GaugeVec, Histogram, HistogramOpts, IntCounter,
    IntCounterVec, IntGauge, IntGaugeVec, Opts, Registry, TextEncoder,
};

use crate::backend::{BackendInfo, StepStats};
use crate::error::{Result, ServeError};
use crate::predict::Interval;

/// Buckets of the time to first token, s: prefill of a long prompt on the host device takes
/// seconds, a short one on a GPU milliseconds.
const TTFT_BUCKETS_S: &[f64] = &[
    0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0,
];
/// Buckets of the inter-token latency and the decode step duration, s: a decode step of a
/// MoE model takes from a fraction of a millisecond (tiny model, few streams) to about a
/// second (a large model's experts computed on a slow CPU).
const STEP_BUCKETS_S: &[f64] = &[
    0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5,
];
/// Buckets of the whole request's duration, s (up to the field protocol's 256 tokens at a
/// few tok/s).
const REQUEST_BUCKETS_S: &[f64] = &[
    0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0,
];

/// How requests end, the values of `ft_requests_total`'s `outcome` label.
pub const OUTCOMES: [&str; 4] = ["completed", "cancelled", "failed", "rejected"];

/// Every metric of one server.
pub struct Metrics {
    registry: Registry,
    info: IntGaugeVec,
    /// Labels of `ft_info` other than the strategy: version, model, backend, mode.
    info_labels: [String; 4],
    strategy: IntGaugeVec,
    fetch_fraction: Gauge,
    predicted: GaugeVec,
    predicted_streams: IntGauge,
    realised: Gauge,
    active_streams: IntGauge,
    queued: IntGauge,
    /// Connections open now.
    pub connections: IntGauge,
    /// Requests inside the HTTP service now (headers read, response not yet started).
    pub http_in_flight: IntGauge,
    /// Connections closed because their request head did not arrive in time.
    pub header_timeouts: IntCounter,
    steps: IntCounter,
    generated_tokens: IntCounter,
    prompt_tokens: IntCounter,
    requests: IntCounterVec,
    responses: IntCounterVec,
    expert_hits: IntCounter,
    expert_misses: IntCounter,
    expert_fetched: IntCounter,
    expert_cpu: IntCounter,
    gathered_bytes: IntCounter,
    busy_seconds: CounterVec,
    divergences: IntCounter,
    refits: IntCounter,
    switches: IntCounter,
    ttft: Histogram,
    itl: Histogram,
    request_duration: Histogram,
    step_duration: Histogram,
    decode_seconds: Counter,
    /// Serialises `ft_info` and `ft_strategy` updates (a reset then a set).
    strategy_lock: Mutex<()>,
}

impl std::fmt::Debug for Metrics {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Metrics").finish_non_exhaustive()
    }
}

fn reg_err(e: prometheus::Error) -> ServeError {
    ServeError::invalid("metrics registry", e.to_string())
}

impl Metrics {
    /// A registry with every metric, for a server over `info` starting with `strategy`
    /// (`auto`: under `--moe-strategy auto`).
    pub fn new(info: &BackendInfo, strategy: Strategy, auto: bool) -> Result<Metrics> {
        let registry = Registry::new();
        macro_rules! reg {
            ($m:expr) => {{
                let m = $m.map_err(reg_err)?;
                registry.register(Box::new(m.clone())).map_err(reg_err)?;
                m
            }};
        }
        let hist = |name: &str, help: &str, buckets: &[f64]| {
            Histogram::with_opts(HistogramOpts::new(name, help).buckets(buckets.to_vec()))
        };
        let m = Metrics {
            info: reg!(IntGaugeVec::new(
                Opts::new(
                    "ft_info",
                    "The server: program version, served model, backend, strategy in use and whether auto may switch it (value 1)."
                ),
                &["version", "model", "backend", "strategy", "mode"]
            )),
            info_labels: [
                env!("CARGO_PKG_VERSION").to_string(),
                info.model.clone(),
                info.name.clone(),
                if auto { "auto" } else { "forced" }.to_string(),
            ],
            strategy: reg!(IntGaugeVec::new(
                Opts::new("ft_strategy", "1 for the MoE strategy in use, 0 for the others."),
                &["strategy"]
            )),
            fetch_fraction: reg!(Gauge::new(
                "ft_fetch_fraction",
                "Share of each layer's misses gathered over PCIe (1 offload, 0 cpu, NaN while hybrid's is not fixed)."
            )),
            predicted: reg!(GaugeVec::new(
                Opts::new(
                    "ft_predicted_tokens_per_second",
                    "Predicted decode tok/s per stream of the strategy in use at ft_predicted_streams, with its interval."
                ),
                &["bound"]
            )),
            predicted_streams: reg!(IntGauge::new(
                "ft_predicted_streams",
                "Stream count of the latest prediction."
            )),
            realised: reg!(Gauge::new(
                "ft_realised_tokens_per_second",
                "Realised decode tok/s per stream of the last full self-check window."
            )),
            active_streams: reg!(IntGauge::new(
                "ft_active_streams",
                "Streams holding a decode slot now."
            )),
            queued: reg!(IntGauge::new(
                "ft_queued_requests",
                "Requests waiting for a decode slot now."
            )),
            connections: reg!(IntGauge::new(
                "ft_http_connections",
                "HTTP connections open now (the scraper's own included)."
            )),
            http_in_flight: reg!(IntGauge::new(
                "ft_http_requests_in_flight",
                "HTTP requests whose response has not started yet (scrapes of /metrics not counted)."
            )),
            header_timeouts: reg!(IntCounter::new(
                "ft_http_header_timeouts_total",
                "Connections closed because a request head did not arrive within --header-timeout-s (no response is written)."
            )),
            steps: reg!(IntCounter::new("ft_steps_total", "Steps run (prefill and decode).")),
            generated_tokens: reg!(IntCounter::new(
                "ft_generated_tokens_total",
                "Tokens generated."
            )),
            prompt_tokens: reg!(IntCounter::new(
                "ft_prompt_tokens_total",
                "Prompt tokens pushed through the model."
            )),
            requests: reg!(IntCounterVec::new(
                Opts::new(
                    "ft_requests_total",
                    "Generation requests by outcome: completed, cancelled (client gone), failed (backend), rejected (a 4xx/5xx before decoding)."
                ),
                &["outcome"]
            )),
            responses: reg!(IntCounterVec::new(
                Opts::new(
                    "ft_http_responses_total",
                    "Every HTTP response, by status code (the server's own 400s for unparseable requests included)."
                ),
                &["status"]
            )),
            expert_hits: reg!(IntCounter::new(
                "ft_expert_hits_total",
                "Distinct experts per layer and step found in the GPU expert cache."
            )),
            expert_misses: reg!(IntCounter::new(
                "ft_expert_misses_total",
                "Distinct experts per layer and step not in the cache (fetched + CPU-computed)."
            )),
            expert_fetched: reg!(IntCounter::new(
                "ft_expert_fetched_total",
                "Missed experts gathered over PCIe into the cache."
            )),
            expert_cpu: reg!(IntCounter::new(
                "ft_expert_cpu_total",
                "Missed experts computed on the CPU from host memory."
            )),
            gathered_bytes: reg!(IntCounter::new(
                "ft_gathered_bytes_total",
                "Expert bytes gathered over PCIe."
            )),
            busy_seconds: reg!(CounterVec::new(
                Opts::new(
                    "ft_resource_busy_seconds_total",
                    "Busy time of each resource during decode steps (rate() over it is the utilisation)."
                ),
                &["resource"]
            )),
            divergences: reg!(IntCounter::new(
                "ft_divergences_total",
                "Sustained divergences of realised from predicted speed or miss rate."
            )),
            refits: reg!(IntCounter::new(
                "ft_refits_total",
                "Refits of the prediction to measurements."
            )),
            switches: reg!(IntCounter::new(
                "ft_strategy_switches_total",
                "Strategy switches between decode steps."
            )),
            ttft: reg!(hist(
                "ft_time_to_first_token_seconds",
                "From the request's arrival to its first generated token, s (requests that got one).",
                TTFT_BUCKETS_S
            )),
            itl: reg!(hist(
                "ft_inter_token_latency_seconds",
                "Between consecutive generated tokens of one request, s.",
                STEP_BUCKETS_S
            )),
            request_duration: reg!(hist(
                "ft_request_duration_seconds",
                "From the request's arrival to its last token, s (completed requests).",
                REQUEST_BUCKETS_S
            )),
            step_duration: reg!(hist(
                "ft_decode_step_duration_seconds",
                "Wall time of decode-only steps (no prompt chunk in them), s.",
                STEP_BUCKETS_S
            )),
            decode_seconds: reg!(Counter::new(
                "ft_decode_step_seconds_total",
                "Wall time of decode-only steps, s (the denominator of the busy shares)."
            )),
            registry,
            strategy_lock: Mutex::new(()),
        };
        #[cfg(target_os = "linux")]
        m.registry
            .register(Box::new(
                prometheus::process_collector::ProcessCollector::for_self(),
            ))
            .map_err(reg_err)?;
        for o in OUTCOMES {
            m.requests.with_label_values(&[o]);
        }
        for r in ["gpu", "pcie", "cpu"] {
            m.busy_seconds.with_label_values(&[r]);
        }
        m.set_strategy(strategy);
        Ok(m)
    }

    /// The strategy in use from now on (`ft_info`, `ft_strategy`, `ft_fetch_fraction`).
    pub fn set_strategy(&self, strategy: Strategy) {
        let _g = self.strategy_lock.lock().unwrap_or_else(|e| e.into_inner());
        let name = strategy.kind().name();
        let [version, model, backend, mode] = &self.info_labels;
        self.info.reset();
        self.info
            .with_label_values(&[
                version.as_str(),
                model.as_str(),
                backend.as_str(),
                name,
                mode.as_str(),
            ])
            .set(1);
        for k in ft_model::StrategyKind::ALL {
            self.strategy
                .with_label_values(&[k.name()])
                .set(i64::from(k == strategy.kind()));
        }
        self.fetch_fraction
            .set(strategy.fixed_fetch_fraction().unwrap_or(f64::NAN));
    }

    /// A strategy switch made by the self-check.
    pub fn switched(&self, to: Strategy) {
        self.switches.inc();
        self.set_strategy(to);
    }

    /// Streams holding a slot and requests waiting, now.
    pub fn set_load(&self, active: usize, queued: usize) {
        self.active_streams.set(active as i64);
        self.queued.set(queued as i64);
    }

    /// A step: `generated` tokens sampled, `prompt_tokens` pushed, its instrumentation;
    /// `decode_only` when no stream pushed a prompt chunk (only those go to the step
    /// histogram and the busy shares).
    pub fn record_step(
        &self,
        stats: &StepStats,
        decode_only: bool,
        generated: u64,
        prompt_tokens: u64,
    ) {
        self.steps.inc();
        self.generated_tokens.inc_by(generated);
        self.prompt_tokens.inc_by(prompt_tokens);
        if let Some(c) = stats.experts {
            self.expert_hits.inc_by(c.hits);
            self.expert_misses.inc_by(c.misses);
            self.expert_fetched.inc_by(c.fetched);
            self.expert_cpu.inc_by(c.cpu);
            self.gathered_bytes.inc_by(c.gathered_bytes);
        }
        if decode_only {
            let wall_s = stats.wall_us.max(0.0) * 1e-6;
            self.step_duration.observe(wall_s);
            self.decode_seconds.inc_by(wall_s);
            if let Some(b) = stats.busy {
                for (r, us) in [("gpu", b.gpu_us), ("pcie", b.pcie_us), ("cpu", b.cpu_us)] {
                    self.busy_seconds
                        .with_label_values(&[r])
                        .inc_by(us.max(0.0) * 1e-6);
                }
            }
        }
    }

    /// Requests that ended: one of [`OUTCOMES`].
    pub fn requests_ended(&self, outcome: &str, n: u64) {
        if n > 0 {
            self.requests.with_label_values(&[outcome]).inc_by(n);
        }
    }

    /// An HTTP response with `status` (every response passes here once).
    pub fn response(&self, status: u16) {
        self.responses
            .with_label_values(&[&status.to_string()])
            .inc();
    }

    /// Time to first token of a request, s.
    pub fn first_token(&self, s: f64) {
        self.ttft.observe(s);
    }

    /// Time between two tokens of a request, s.
    pub fn inter_token(&self, s: f64) {
        self.itl.observe(s);
    }

    /// A completed request's duration, s.
    pub fn request_done(&self, s: f64) {
        self.request_duration.observe(s);
    }

    /// The prediction for the strategy in use at `streams` streams.
    pub fn set_prediction(&self, p: Interval, streams: usize) {
        for (bound, v) in [("point", p.value), ("low", p.lo), ("high", p.hi)] {
            self.predicted.with_label_values(&[bound]).set(v);
        }
        self.predicted_streams.set(streams as i64);
    }

    /// Realised tok/s per stream of the last self-check window.
    pub fn set_realised(&self, tok_s: f64) {
        self.realised.set(tok_s);
    }

    /// A sustained divergence and the refit it caused.
    pub fn diverged(&self) {
        self.divergences.inc();
        self.refits.inc();
    }

    /// The Prometheus text of everything.
    pub fn render(&self) -> String {
        let mut out = Vec::new();
        let families = self.registry.gather();
        // Encoding into a Vec fails only on a malformed family, which `register` refuses.
        if let Err(e) = TextEncoder::new().encode(&families, &mut out) {
            return format!("# error encoding the metrics: {e}\n");
        }
        String::from_utf8(out).unwrap_or_default()
    }

    /// The content type of [`Metrics::render`]'s text.
    pub fn content_type() -> &'static str {
        prometheus::TEXT_FORMAT
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::{BusyTimes, ExpertCounts};

    fn info() -> BackendInfo {
        BackendInfo {
            name: "reference".into(),
            model: "m\"x".into(),
            vocab: 10,
            max_context: 10,
            max_streams: 1,
            device: "host".into(),
        }
    }

    #[test]
    fn counters_histograms_and_labels_render() {
        let m = Metrics::new(&info(), Strategy::Offload, false).unwrap();
        let stats = StepStats {
            wall_us: 10_000.0,
            streams: 2,
            tokens: 2,
            experts: Some(ExpertCounts {
                hits: 3,
                misses: 1,
                fetched: 1,
                cpu: 0,
                gathered_bytes: 4096,
            }),
            busy: Some(BusyTimes {
                gpu_us: 5000.0,
                pcie_us: 2500.0,
                cpu_us: 0.0,
            }),
        };
        for _ in 0..10 {
            m.record_step(&stats, true, 2, 0);
        }
        m.requests_ended("rejected", 2);
        m.response(429);
        m.response(429);
        m.first_token(0.02);
        m.switched(Strategy::Cpu);
        let text = m.render();
        let parsed =
            prometheus_parse::Scrape::parse(text.lines().map(|l| Ok(l.to_string()))).unwrap();
        let value = |name: &str, label: Option<(&str, &str)>| -> f64 {
            let s = parsed
                .samples
                .iter()
                .find(|s| s.metric == name && label.is_none_or(|(k, v)| s.labels.get(k) == Some(v)))
                .unwrap_or_else(|| panic!("{name} {label:?} in\n{text}"));
            match &s.value {
                prometheus_parse::Value::Counter(v)
                | prometheus_parse::Value::Gauge(v)
                | prometheus_parse::Value::Untyped(v) => *v,
                other => panic!("{name}: {other:?}"),
            }
        };
        assert_eq!(value("ft_expert_hits_total", None), 30.0);
        assert_eq!(value("ft_expert_misses_total", None), 10.0);
        assert_eq!(value("ft_gathered_bytes_total", None), 40960.0);
        assert_eq!(value("ft_generated_tokens_total", None), 20.0);
        assert!(
            (value("ft_resource_busy_seconds_total", Some(("resource", "pcie"))) - 0.025).abs()
                < 1e-12
        );
        assert!((value("ft_decode_step_seconds_total", None) - 0.1).abs() < 1e-12);
        assert_eq!(
            value("ft_requests_total", Some(("outcome", "rejected"))),
            2.0
        );
        assert_eq!(
            value("ft_http_responses_total", Some(("status", "429"))),
            2.0
        );
        assert_eq!(value("ft_strategy", Some(("strategy", "cpu"))), 1.0);
        assert_eq!(value("ft_strategy", Some(("strategy", "offload"))), 0.0);
        assert_eq!(value("ft_strategy_switches_total", None), 1.0);
        // One ft_info series, with the strategy in use and the version, the model's quote
        // escaped.
        let info: Vec<_> = parsed
            .samples
            .iter()
            .filter(|s| s.metric == "ft_info")
            .collect();
        assert_eq!(info.len(), 1, "{text}");
        assert_eq!(info[0].labels.get("strategy"), Some("cpu"));
        assert_eq!(
            info[0].labels.get("version"),
            Some(env!("CARGO_PKG_VERSION"))
        );
        assert!(text.contains(r#"model="m\"x""#), "{text}");
        let step = parsed
            .samples
            .iter()
            .find(|s| s.metric == "ft_decode_step_duration_seconds")
            .unwrap();
        match &step.value {
            prometheus_parse::Value::Histogram(h) => {
                let count = h.iter().map(|b| b.count).fold(0.0, f64::max);
                assert_eq!(count, 10.0, "{h:?}");
                let le_10ms = h.iter().find(|b| b.less_than == 0.01).unwrap();
                assert_eq!(le_10ms.count, 10.0);
            }
            other => panic!("{other:?}"),
        }
        #[cfg(target_os = "linux")]
        assert!(
            value("process_resident_memory_bytes", None) > 0.0,
            "process metrics"
        );
    }
}
