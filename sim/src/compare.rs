//! One host, one model, one stream count: every strategy simulated, the analytic model's
//! prediction beside it, and the legacy ratio's verdict.
//!
//! This is what `ft simulate` prints. The cache size is settled first (given in slots or
//! GiB, calibrated so that offload misses a given rate, or what the GPU's memory holds),
//! with ft-model's own functions, so the simulator and the analytic model run the same
//! cache on the same routing (the routing seed is [`routing_seed`] of the run's seed for
//! both). Hybrid's `auto` fetch fraction is the analytic model's optimum
//! ([`predict()`]'s fetch search).

use serde::{Deserialize, Serialize};

use ft_model::cache::{CacheOptions, CacheSize};
use ft_model::perf::predict::{
    calibrate_cache_slots_on, default_cache_slots, MissMode, PredictConfig,
};
use ft_model::perf::{predict, LegacyRatio, PerfModel, Prediction};
use ft_model::preset::ModelSpec;
use ft_model::strategy::{CpuLayers, FetchFraction, Strategy, StrategyKind};

use crate::costs::CostModel;
use crate::decode::Workload;
use crate::error::{Result, SimError};
use crate::hosts::SimHost;
use crate::run::{routing_seed, simulate, SimConfig, SimResult};

/// How the cache size is chosen.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "kebab-case", deny_unknown_fields)]
pub enum CacheChoice {
    /// `--cache-slots N`.
    Slots {
        /// Expert slots.
        slots: usize,
    },
    /// `--cache-gb X` (GiB).
    Gib {
        /// GiB of expert slots.
        gib: f64,
    },
    /// `--miss-rate R`: the size at which offload misses `rate` of its experts at `streams`
    /// streams (the compared stream count when `None`).
    MissRate {
        /// Offload's expert-level miss rate (0 to 1).
        rate: f64,
        /// Streams at which it is calibrated.
        streams: Option<usize>,
    },
    /// What the GPU's memory holds after the reserve, dense weights and KV cache.
    GpuMemory,
}

impl CacheChoice {
    /// The choice the flags make: `--cache-slots`, else `--cache-gb`, else `--miss-rate`;
    /// with none, the field report's 38% at two streams where the run is the field report's
    /// (`field_report`: its host and model), elsewhere what the GPU holds.
    pub fn from_flags(
        slots: Option<usize>,
        gib: Option<f64>,
        miss_rate: Option<f64>,
        field_report: bool,
    ) -> Self {
        use crate::field_report as fr;
        match (slots, gib, miss_rate) {
            (Some(slots), _, _) => CacheChoice::Slots { slots },
            (_, Some(gib), _) => CacheChoice::Gib { gib },
            (_, _, Some(rate)) => CacheChoice::MissRate {
                rate,
                streams: None,
            },
            _ if field_report => CacheChoice::MissRate {
                rate: fr::OFFLOAD_MISS_RATE,
                streams: Some(fr::MISS_RATE_STREAMS),
            },
            _ => CacheChoice::GpuMemory,
        }
    }
}

/// What to compare besides host and model.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CompareConfig {
    /// Concurrent streams.
    pub streams: usize,
    /// Strategies to simulate, in table order.
    pub strategies: Vec<StrategyKind>,
    /// Hybrid's fetch fraction (`auto`: the analytic model's optimum).
    pub fetch: FetchFraction,
    /// Layer split's CPU layers (`auto`: the analytic model's optimum under the GPU's
    /// memory).
    #[serde(default = "auto_cpu_layers")]
    pub cpu_layers: CpuLayers,
    /// The cache size.
    pub cache: CacheChoice,
    /// The cache's policy, topology and admission.
    #[serde(default)]
    pub cache_options: CacheOptions,
    /// Routing preset, process TOML or trace.
    pub routing: String,
    /// Unmeasured steps first.
    pub warmup_steps: u64,
    /// Measured steps.
    pub steps: u64,
    /// Seed of the run.
    pub seed: u64,
    /// Relative jitter on durations (0: none).
    pub jitter: f64,
    /// Requests of the closed loop.
    pub workload: Workload,
    /// Threshold of the legacy rule.
    pub threshold: f64,
}

impl CompareConfig {
    /// The field report's setting at `streams` streams: all strategies, auto fetch
    /// fraction, a cache at which offload misses 38% at two streams, LRU, `typical`
    /// routing, 1.2K-token prompts and 256-token outputs.
    pub fn field_report(streams: usize) -> Self {
        use crate::field_report as fr;
        CompareConfig {
            streams,
            strategies: StrategyKind::ALL.to_vec(),
            fetch: FetchFraction::Auto,
            cpu_layers: CpuLayers::Auto,
            cache: CacheChoice::MissRate {
                rate: fr::OFFLOAD_MISS_RATE,
                streams: Some(fr::MISS_RATE_STREAMS),
            },
            cache_options: CacheOptions::default(),
            routing: "typical".to_string(),
            warmup_steps: DEFAULT_WARMUP_STEPS,
            steps: DEFAULT_STEPS,
            seed: DEFAULT_SEED,
            jitter: 0.0,
            workload: Workload {
                prompt_tokens: fr::PROMPT_TOKENS,
                output_tokens: fr::OUTPUT_TOKENS,
                prefill_ns: 0,
            },
            threshold: ft_model::perf::legacy::DEFAULT_THRESHOLD,
        }
    }

    /// The analytic model's context for this workload: the mean context over a request
    /// (prompt plus half the output), since the model takes one fixed context.
    pub fn model_context(&self) -> usize {
        (self.workload.prompt_tokens + self.workload.output_tokens.saturating_sub(1) / 2) as usize
    }

    /// The prediction configuration matching this comparison (same routing and seed,
    /// warm-up and steps).
    pub fn predict_config(&self, streams: usize, cache: Option<CacheSize>) -> PredictConfig {
        self.predict_config_with(streams, cache, None)
    }

    /// [`CompareConfig::predict_config`] with a measured bench pair for the legacy rule.
    pub fn predict_config_with(
        &self,
        streams: usize,
        cache: Option<CacheSize>,
        bench: Option<ft_model::perf::legacy::BenchBw>,
    ) -> PredictConfig {
        PredictConfig {
            streams,
            context: self.model_context(),
            cache,
            cache_options: self.cache_options.clone(),
            routing: self.routing.clone(),
            seed: Some(routing_seed(self.seed)),
            warmup_steps: self.warmup_steps as usize,
            steps: self.steps as usize,
            miss: MissMode::Simulated,
            hybrid_fetch: self.fetch,
            layer_split: Some(self.cpu_layers),
            threshold: self.threshold,
            bench,
            ..PredictConfig::default()
        }
    }
}

fn auto_cpu_layers() -> CpuLayers {
    CpuLayers::Auto
}

/// Default unmeasured steps (they fill the cache).
pub const DEFAULT_WARMUP_STEPS: u64 = 64;
/// Default measured steps (a 256-token output, as in the field report).
pub const DEFAULT_STEPS: u64 = 256;
/// Default seed.
pub const DEFAULT_SEED: u64 = 1;

/// The analytic model's numbers for one strategy.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ModelView {
    /// Predicted tok/s per stream.
    pub tok_s_per_stream: f64,
    /// Its interval.
    pub tok_s_per_stream_interval: [f64; 2],
    /// Predicted tok/s over all streams.
    pub tok_s_total: f64,
    /// Predicted bounding resource.
    pub bound: String,
    /// Miss rate in the model's counting.
    pub miss_rate: f64,
    /// Predicted step time, us.
    pub step_us: f64,
    /// Time the closed form charges to DRAM contention per step, us (it starts both byte
    /// streams together; the timeline starts the CPU's later, so it may charge less).
    pub contention_us: f64,
}

impl StrategyRow {
    /// How much faster the simulated step is than the predicted one, us (negative when
    /// slower).
    pub fn step_gain_us(&self) -> f64 {
        self.model.step_us - self.sim.step_ms * 1e3
    }

    /// The part of the simulator's lead that the documented differences explain, us per
    /// step: the contention the closed form charges (the timeline may overlap less), and
    /// the pool wake-up the closed form charges every layer with a CPU share (the
    /// simulated pool spins within a step).
    pub fn explained_gain_us(&self, wake_us: f64) -> f64 {
        let layers_with_cpu = self.sim.cpu_per_layer.min(1.0).ceil() * self.sim.layers as f64;
        self.model.contention_us + wake_us * layers_with_cpu
    }
}

/// One strategy's row.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct StrategyRow {
    /// The strategy's kind (`offload`, `hybrid`, `resident`, `cpu`, `layer-split`,
    /// `layer-split-cached`).
    pub strategy: String,
    /// Simulated decode tok/s per stream.
    pub tok_s_per_stream: f64,
    /// Simulated decode tok/s over all streams.
    pub tok_s_total: f64,
    /// This strategy's expert-level miss rate (its own cache history).
    pub miss_rate: f64,
    /// Share of each layer's misses gathered.
    pub fetch_fraction: f64,
    /// Resource holding the largest share of the simulated critical path.
    pub bound: String,
    /// False when it cannot run on this GPU (resident without the memory).
    pub feasible: bool,
    /// Why not.
    pub note: Option<String>,
    /// The analytic prediction of the same configuration.
    pub model: ModelView,
    /// Simulated over predicted tok/s, minus 1.
    pub sim_vs_model: f64,
    /// The full simulation result.
    pub sim: SimResult,
}

/// The legacy rule as `--json` reports it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct LegacyView {
    /// CPU-MoE bandwidth, GB/s.
    pub cpu_moe_gbs: f64,
    /// PCIe-gather bandwidth, GB/s.
    pub pcie_gather_gbs: f64,
    /// Their ratio.
    pub ratio: f64,
    /// The threshold.
    pub threshold: f64,
    /// `offload` or `hybrid`.
    pub verdict: String,
    /// The reference engine's fetch fraction, when computable.
    pub fetch_fraction: Option<f64>,
}

impl From<&LegacyRatio> for LegacyView {
    fn from(l: &LegacyRatio) -> Self {
        LegacyView {
            cpu_moe_gbs: l.cpu_moe_gbs,
            pcie_gather_gbs: l.pcie_gather_gbs,
            ratio: l.ratio,
            threshold: l.threshold,
            verdict: l.verdict.name().to_string(),
            fetch_fraction: l.fetch_fraction,
        }
    }
}

/// How the cache was sized, for the output.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CacheView {
    /// Slots.
    pub slots: usize,
    /// GiB of slots.
    pub gib: f64,
    /// How it was chosen, in words (with how hybrid's miss rate follows).
    pub how: String,
}

/// The comparison: what `ft simulate --json` prints for one stream count.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Comparison {
    /// Host name.
    pub host: String,
    /// Model name.
    pub model: String,
    /// Streams.
    pub streams: usize,
    /// GPUs decoding together.
    pub gpus: u32,
    /// How experts are laid out over them (`sharded`, `tensor-parallel`).
    pub placement: String,
    /// The cache (each GPU's on several).
    pub cache: CacheView,
    /// One row per simulated strategy.
    pub strategies: Vec<StrategyRow>,
    /// The feasible strategy with the highest simulated total tok/s.
    pub best: String,
    /// The legacy rule.
    pub legacy: LegacyView,
    /// The configuration.
    pub config: CompareConfig,
}

impl Comparison {
    /// The row of one strategy, if it was simulated.
    pub fn row(&self, strategy: &str) -> Option<&StrategyRow> {
        self.strategies.iter().find(|r| r.strategy == strategy)
    }

    /// Hybrid's simulated tok/s per stream over offload's, minus one (`None` unless both
    /// were simulated).
    pub fn hybrid_gain(&self) -> Option<f64> {
        let off = self.row("offload")?;
        let hyb = self.row("hybrid")?;
        Some(hyb.tok_s_per_stream / off.tok_s_per_stream - 1.0)
    }
}

/// Slots of a cache choice for `model` on a GPU described by `perf`.
pub fn resolve_cache(
    model: &ModelSpec,
    perf: &PerfModel,
    cfg: &CompareConfig,
) -> Result<CacheView> {
    let total = model.geometry.total_experts();
    let layout = perf.params.layout;
    // On several GPUs a size is each GPU's, in slots of its share of an expert.
    let eb = layout.bytes_per_gpu(model.expert_bytes());
    let (slots, how) = match (cfg.cache_options.slots_per_layer, cfg.cache) {
        (Some(n), _) => (
            CacheSize::Slots(n.saturating_mul(model.geometry.moe_layers)).slots(eb, total)?,
            format!("given (--cache-slots-per-layer {n})"),
        ),
        (None, cache) => cache_slots_of(model, perf, cfg, cache, eb, total)?,
    };
    let slots = cfg
        .cache_options
        .fit_slots(slots, model.geometry.moe_layers)?;
    Ok(CacheView {
        slots,
        gib: slots as f64 * eb as f64 / ft_model::host::GIB,
        how,
    })
}

/// The slots and how they were chosen, for a cache sized by `cache`.
fn cache_slots_of(
    model: &ModelSpec,
    perf: &PerfModel,
    cfg: &CompareConfig,
    cache: CacheChoice,
    eb: u64,
    total: u64,
) -> Result<(usize, String)> {
    let layout = perf.params.layout;
    Ok(match cache {
        CacheChoice::Slots { slots } => (
            CacheSize::Slots(slots).slots(eb, total)?,
            "given (--cache-slots)".to_string(),
        ),
        CacheChoice::Gib { gib } => (
            CacheSize::GiB(gib).slots(eb, total)?,
            "given (--cache-gb)".to_string(),
        ),
        CacheChoice::MissRate { rate, streams } => {
            if !(rate.is_finite() && rate > 0.0 && rate < 1.0) {
                return Err(SimError::invalid(
                    "--miss-rate",
                    format!("{rate} is not a rate strictly between 0 and 1"),
                ));
            }
            let at = streams.unwrap_or(cfg.streams);
            let (slots, got) =
                calibrate_cache_slots_on(model, &cfg.predict_config(at, None), rate, &layout)?;
            (
                slots,
                format!(
                    "sized so that offload misses {:.1}% at {at} stream(s) (got {:.1}%); the \
                     other strategies' miss rates follow from the same cache and routing \
                     through their own histories (hybrid admits only the misses it fetches, \
                     chosen by its admission policy)",
                    100.0 * rate,
                    100.0 * got
                ),
            )
        }
        CacheChoice::GpuMemory => (
            default_cache_slots(model, &perf.params, cfg.streams, cfg.model_context()),
            "what the GPU holds after its reserve, the dense weights and the KV cache".to_string(),
        ),
    })
}

/// Compare the strategies of `cfg` on `host` with `model`.
pub fn compare(host: &SimHost, model: &ModelSpec, cfg: &CompareConfig) -> Result<Comparison> {
    if cfg.strategies.is_empty() {
        return Err(SimError::invalid("--strategy", "no strategy to simulate"));
    }
    let costs = CostModel::from_sim_host(host, model)?;
    let cache = resolve_cache(model, &host.perf, cfg)?;
    let prediction = predict(
        model,
        &host.perf,
        &cfg.predict_config_with(cfg.streams, Some(CacheSize::Slots(cache.slots)), host.bench),
    )?;
    compare_with(host, model, cfg, &costs, &prediction, cache)
}

/// [`compare`] with the cost model and the prediction already computed.
pub fn compare_with(
    host: &SimHost,
    model: &ModelSpec,
    cfg: &CompareConfig,
    costs: &CostModel,
    prediction: &Prediction,
    cache: CacheView,
) -> Result<Comparison> {
    let hybrid_f = match cfg.fetch {
        FetchFraction::Fixed(f) => f,
        FetchFraction::Auto => prediction.get(StrategyKind::Hybrid).fetch_fraction,
    };
    let mut rows = Vec::new();
    for &kind in &cfg.strategies {
        // The model's N where the caller left it to the model (the prediction ran with the
        // caller's N when one was given).
        let n = prediction.get(kind).cpu_layers.map(CpuLayers::Fixed);
        let strategy = Strategy::from_parts(kind, Some(FetchFraction::Fixed(hybrid_f)), n);
        let sim = simulate(
            costs,
            model,
            &SimConfig {
                streams: cfg.streams,
                strategy,
                cache_slots: cache.slots,
                cache_options: cfg.cache_options.clone(),
                routing: cfg.routing.clone(),
                warmup_steps: cfg.warmup_steps,
                steps: cfg.steps,
                seed: cfg.seed,
                jitter: cfg.jitter,
                workload: cfg.workload,
                layout: costs.layout,
            },
        )?;
        let p = prediction.get(kind);
        let model_view = ModelView {
            tok_s_per_stream: p.tok_s_per_stream,
            tok_s_per_stream_interval: p.tok_s_per_stream_interval,
            tok_s_total: p.tok_s_total,
            bound: p.bound.name().to_string(),
            miss_rate: p.miss_rate,
            step_us: p.step_us,
            contention_us: p.contention_us,
        };
        rows.push(StrategyRow {
            strategy: kind.name().to_string(),
            tok_s_per_stream: sim.tok_s_per_stream,
            tok_s_total: sim.tok_s_total,
            miss_rate: sim.miss_rate,
            fetch_fraction: sim.fetch_fraction,
            bound: sim.bound.clone(),
            feasible: p.feasible,
            note: p.note.clone(),
            sim_vs_model: sim.tok_s_total / p.tok_s_total - 1.0,
            model: model_view,
            sim,
        });
    }
    // The fastest feasible row. A layer split wins only where it is strictly faster: with no
    // CPU layer it is resident's (or offload's) work, simulated alike.
    let split = |r: &&StrategyRow| {
        r.strategy == StrategyKind::LayerSplit.name()
            || r.strategy == StrategyKind::LayerSplitCached.name()
    };
    fn fastest<'a>(rows: impl Iterator<Item = &'a StrategyRow>) -> Option<&'a StrategyRow> {
        rows.filter(|r| r.feasible)
            .max_by(|a, b| a.tok_s_total.total_cmp(&b.tok_s_total))
    }
    let alike = fastest(rows.iter().filter(|r| !split(r)));
    let best = match (alike, fastest(rows.iter().filter(split))) {
        (Some(a), Some(s)) if s.tok_s_total > a.tok_s_total => Some(s),
        (None, s) => s,
        (a, _) => a,
    }
    .map(|r| r.strategy.clone())
    .unwrap_or_else(|| "none".to_string());
    Ok(Comparison {
        host: host.name.clone(),
        model: model.name.clone(),
        streams: cfg.streams,
        gpus: costs.layout.gpus,
        placement: costs.layout.placement.name().to_string(),
        cache,
        strategies: rows,
        best,
        legacy: LegacyView::from(&prediction.legacy),
        config: cfg.clone(),
    })
}

/// The rows of comparisons as CSV (header first): one row per stream count and strategy.
pub fn write_csv<W: std::io::Write>(cs: &[Comparison], w: W) -> Result<()> {
    let err = |e: csv::Error| SimError::invalid("CSV output", e.to_string());
    let mut out = csv::Writer::from_writer(w);
    out.write_record([
        "host",
        "model",
        "streams",
        "cache_slots",
        "strategy",
        "fetch_fraction",
        "miss_rate",
        "tok_s_per_stream",
        "tok_s_total",
        "bound",
        "model_tok_s_per_stream",
        "model_bound",
        "sim_vs_model",
    ])
    .map_err(err)?;
    for c in cs {
        for r in &c.strategies {
            out.write_record([
                c.host.clone(),
                c.model.clone(),
                c.streams.to_string(),
                c.cache.slots.to_string(),
                r.strategy.clone(),
                format!("{:.4}", r.fetch_fraction),
                format!("{:.4}", r.miss_rate),
                format!("{:.3}", r.tok_s_per_stream),
                format!("{:.3}", r.tok_s_total),
                r.bound.clone(),
                format!("{:.3}", r.model.tok_s_per_stream),
                r.model.bound.clone(),
                format!("{:.5}", r.sim_vs_model),
            ])
            .map_err(err)?;
        }
    }
    out.flush().map_err(|e| SimError::Io {
        path: "CSV output".to_string(),
        source: e,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_cache_flags_choose_in_order() {
        let f = CacheChoice::from_flags;
        assert_eq!(
            f(Some(9), Some(1.0), None, true),
            CacheChoice::Slots { slots: 9 }
        );
        assert_eq!(
            f(None, Some(1.5), Some(0.2), true),
            CacheChoice::Gib { gib: 1.5 }
        );
        assert_eq!(
            f(None, None, Some(0.2), true),
            CacheChoice::MissRate {
                rate: 0.2,
                streams: None
            }
        );
        assert_eq!(
            f(None, None, None, true),
            CacheChoice::MissRate {
                rate: crate::field_report::OFFLOAD_MISS_RATE,
                streams: Some(crate::field_report::MISS_RATE_STREAMS)
            }
        );
        assert_eq!(f(None, None, None, false), CacheChoice::GpuMemory);
    }
}
