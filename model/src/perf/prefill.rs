//! Prefill, time to first token, and tok/s as users measure it.
//!
//! Why it exists: field numbers are rarely decode-only. A client times its output tokens over
//! the whole request, so a 1.2K-token prompt prefilled with the experts in host RAM (every
//! expert a chunk routes to streamed over the link, or computed on the CPU) weighs on tok/s at
//! one stream, and at several streams one stream's prefill stalls the other streams' decode
//! steps (a serve A/B measured half the predicted 2-stream speed for that reason). A
//! prediction of decode steps alone cannot be set against such a number, nor calibrated to
//! it; this module turns a decode step time into each [`Measure`] an observation can carry.
//!
//! **Prefill's bound** ([`prefill`]): the prompt is prefilled in chunks of
//! [`PrefillConfig::chunk_tokens`]; each chunk runs every layer once. A chunk of `c` tokens
//! routes `c k` (token, expert) pairs over `u = E (1 - (1 - k/E)^c)` distinct experts of the
//! layer's `E` (each token's top-k drawn without regard to the others: at `c = 512`, `k = 8`,
//! `E = 128` that is every expert). Of them the cache holds `u r` (`r` its residency; 0 for a
//! layer that fetches none of its misses, as cpu's: only fetched misses enter the cache, so
//! its cache stays empty, as its decode's 100% miss rate says); the misses go where the layer's placement sends decode misses: gathered over the link and
//! computed on the GPU (offload, hybrid's fetched share), computed on the CPU from host
//! memory (cpu, hybrid's CPU share, a layer split's CPU layers). The layer's time is its dense
//! part (the weights read once, each token's dense compute at the GPU's token rate, the
//! engine's rest-of-step cost once: a chunk is one stream's step, and that cost is per stream
//! and step, not per token: a served engine whose decode puts it at 150 us per layer and
//! stream prefills 1,200 tokens in 0.36 s, where charging it per prompt token alone would
//! take 0.73 s) plus the longest of the link, the GPU's experts and
//! the CPU's share (they run at once), plus the layer's calibrated fixed cost. Prefill is the
//! sum over chunks and layers.
//!
//! **What a client measures** ([`end_to_end`]), with `P` prefill time, `T` the decode step at
//! `S` streams, `O` output tokens per request, all `S` streams' requests arriving together (the
//! field report's protocol) and each prefill stalling every stream's decode:
//! - `decode`: `1 / T` per stream;
//! - `server-gen` (the server's generation rate, decode time with the other streams'
//!   prefills in it): `O / ((S - 1) P + O T)`;
//! - `client-e2e`: `O / (S P + O T)` per stream (a request waits for its own prefill and,
//!   on average, for the others' before or during its decode);
//! - time to first token: the mean over streams of the prefills ahead of it and its own,
//!   `(S + 1) / 2 P`, plus one decode step.

use serde::{Deserialize, Serialize};

use super::cost::ExpertShape;
use super::step::Resource;
use super::PerfParams;
use crate::error::{ModelError, Result};
use crate::observe::Measure;
use crate::preset::ModelSpec;
use crate::schedule::LayerWork;
use crate::strategy::{LayerPlacement, PlacementPolicy};

/// Default tokens per prefill chunk: the chunk size of FreeToken's and llama.cpp's default
/// micro-batch (512).
pub const DEFAULT_PREFILL_CHUNK_TOKENS: usize = 512;

/// Bytes per dense weight (bf16), for the dense part's multiply-accumulates per token
/// ([`crate::preset::DenseSpec::estimate`] sizes the dense weights in bf16).
const DENSE_BYTES_PER_WEIGHT: f64 = 2.0;

/// How prefill is run.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct PrefillConfig {
    /// Prompt tokens per prefill chunk (each chunk runs every layer once).
    pub chunk_tokens: usize,
}

impl Default for PrefillConfig {
    fn default() -> Self {
        PrefillConfig {
            chunk_tokens: DEFAULT_PREFILL_CHUNK_TOKENS,
        }
    }
}

/// What a prediction is asked for: a measure and the request it is taken over.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MeasureSpec {
    /// What tok/s measures.
    pub measure: Measure,
    /// Prompt tokens per request.
    pub prompt_tokens: usize,
    /// Output tokens per request.
    pub output_tokens: usize,
}

impl MeasureSpec {
    /// Decode steps only (no request around them).
    pub fn decode() -> Self {
        MeasureSpec {
            measure: Measure::Decode,
            prompt_tokens: 0,
            output_tokens: 1,
        }
    }

    /// Check the request: at least one output token; errors name the option.
    pub fn validate(&self) -> Result<()> {
        if self.output_tokens == 0 {
            return Err(ModelError::invalid(
                "output_tokens",
                "must be at least 1 (tok/s is output tokens over time)",
            ));
        }
        if self.prompt_tokens > crate::observe::MAX_OBSERVED_TOKENS
            || self.output_tokens > crate::observe::MAX_OBSERVED_TOKENS
        {
            return Err(ModelError::invalid(
                "prompt_tokens/output_tokens",
                format!(
                    "at most {} tokens each",
                    crate::observe::MAX_OBSERVED_TOKENS
                ),
            ));
        }
        Ok(())
    }
}

/// One prompt's prefill under one placement.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct PrefillTime {
    /// Prompt tokens.
    pub prompt_tokens: usize,
    /// Chunks it was prefilled in.
    pub chunks: usize,
    /// Total time, in us (0 for an empty prompt).
    pub total_us: f64,
    /// Time on the link over all chunks and layers, in us.
    pub pcie_us: f64,
    /// Time of the CPU's expert shares, in us.
    pub cpu_us: f64,
    /// Time of the GPU's experts, in us.
    pub gpu_us: f64,
    /// Time of the dense parts, in us.
    pub dense_us: f64,
    /// The resource whose time decided most of the layers' expert part.
    pub bound: Resource,
}

/// Distinct experts of a layer of `experts` experts that `tokens` tokens routing to `top_k`
/// each touch, in expectation (independent draws).
pub fn chunk_union(experts: f64, top_k: f64, tokens: f64) -> f64 {
    if experts <= 0.0 || tokens <= 0.0 {
        return 0.0;
    }
    experts * (1.0 - (1.0 - (top_k / experts).min(1.0)).powf(tokens))
}

/// Prefill of `prompt_tokens` tokens with every layer placed by `placement` on a cache holding
/// `residency` (0..=1) of each cached layer's experts (module docs).
pub fn prefill(
    p: &PerfParams,
    model: &ModelSpec,
    placement: &PlacementPolicy,
    residency: f64,
    prompt_tokens: usize,
    config: &PrefillConfig,
) -> Result<PrefillTime> {
    if config.chunk_tokens == 0 {
        return Err(ModelError::invalid(
            "prefill.chunk_tokens",
            "must be at least 1",
        ));
    }
    if !(0.0..=1.0).contains(&residency) {
        return Err(ModelError::invalid(
            "residency",
            format!("{residency} is outside [0, 1]"),
        ));
    }
    let g = model.geometry;
    let shape = ExpertShape::of(model);
    let dense = model.dense();
    let dense_macs = dense.weight_bytes_per_layer as f64 / DENSE_BYTES_PER_WEIGHT;
    let threads = p.cpu_threads as f64;
    let mut out = PrefillTime {
        prompt_tokens,
        chunks: prompt_tokens.div_ceil(config.chunk_tokens),
        total_us: 0.0,
        pcie_us: 0.0,
        cpu_us: 0.0,
        gpu_us: 0.0,
        dense_us: 0.0,
        bound: Resource::Dense,
    };
    let mut bound_time = [0.0f64; 3];
    let mut done = 0usize;
    while done < prompt_tokens {
        let c = config.chunk_tokens.min(prompt_tokens - done);
        let ctx = done as f64 + c as f64 / 2.0;
        done += c;
        let c = c as f64;
        let u = chunk_union(g.experts as f64, g.top_k as f64, c);
        let pairs = c * g.top_k as f64;
        // The chunk is one stream's step: the engine's rest-of-step cost (per stream, as
        // decode measures it) once, and each further token's dense compute.
        let dense_us = p.dense_us(&dense, 1.0, ctx)
            + (c - 1.0) * dense_macs / (p.gpu_token_gmacs * super::MACS_PER_US_PER_GMACS);
        for l in 0..g.moe_layers {
            let (gpu_n, fetched, cpu_n) = match placement.layer(l) {
                LayerPlacement::Resident => (u, 0.0, 0.0),
                LayerPlacement::CpuOnly => (0.0, 0.0, u),
                LayerPlacement::Cached { fetch_fraction } => {
                    // Only fetched misses enter the cache: a layer that fetches none (cpu)
                    // never fills it, so all its experts are misses.
                    let hits = if fetch_fraction > 0.0 {
                        u * residency
                    } else {
                        0.0
                    };
                    let misses = u - hits;
                    let f = misses * fetch_fraction;
                    (hits + f, f, misses - f)
                }
            };
            let per = if u > 0.0 { pairs / u } else { 0.0 };
            let link = p.gather_us(fetched, shape.bytes);
            let gpu = p.gpu_experts_us(gpu_n, gpu_n * per, shape);
            let cpu = if cpu_n > 0.0 {
                p.cpu_share_us(cpu_n, cpu_n * per, shape, threads)
                    + p.sync_round_trip_us(c, g.hidden as f64)
            } else {
                0.0
            };
            let work = match (fetched > 0.0, cpu_n > 0.0) {
                (true, false) => LayerWork::Gather,
                (true, true) => LayerWork::GatherAndCpuShare,
                (false, false) => LayerWork::GpuOnly,
                (false, true) => LayerWork::CpuShare,
            };
            let experts = link.max(gpu).max(cpu);
            let i = if experts == link {
                0
            } else if experts == cpu {
                1
            } else {
                2
            };
            bound_time[i] += experts;
            out.pcie_us += link;
            out.cpu_us += cpu;
            out.gpu_us += gpu;
            out.dense_us += dense_us;
            out.total_us += dense_us + experts + p.overhead.of(work);
        }
    }
    if prompt_tokens > 0 {
        let best = (0..3)
            .max_by(|&a, &b| bound_time[a].total_cmp(&bound_time[b]))
            .unwrap_or(2);
        out.bound = if out.dense_us > bound_time[best] {
            Resource::Dense
        } else {
            [Resource::Pcie, Resource::Cpu, Resource::Gpu][best]
        };
    }
    Ok(out)
}

/// A decode prediction turned into a measure.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct EndToEnd {
    /// What was asked for.
    pub spec: MeasureSpec,
    /// Decode tok/s per stream (decode steps only).
    pub decode_tok_s: f64,
    /// One prompt's prefill, in us.
    pub prefill_us: f64,
    /// Mean time to first token over the streams, in us.
    pub ttft_us: f64,
    /// tok/s per stream in the measure asked for.
    pub tok_s_per_stream: f64,
    /// tok/s summed over the streams in the measure asked for.
    pub tok_s_total: f64,
}

/// tok/s per stream in `spec`'s measure at `streams` streams, from a decode step of `step_us`
/// and one prompt's prefill of `prefill_us` (module docs).
pub fn end_to_end(step_us: f64, prefill_us: f64, streams: usize, spec: &MeasureSpec) -> EndToEnd {
    let s = streams.max(1) as f64;
    let o = spec.output_tokens.max(1) as f64;
    let decode = o * step_us;
    let per_stream_us = match spec.measure {
        Measure::Decode => decode,
        Measure::ServerGen => (s - 1.0) * prefill_us + decode,
        Measure::ClientE2e => s * prefill_us + decode,
    };
    let tok_s = o * 1e6 / per_stream_us;
    EndToEnd {
        spec: *spec,
        decode_tok_s: 1e6 / step_us,
        prefill_us,
        ttft_us: (s + 1.0) / 2.0 * prefill_us + step_us,
        tok_s_per_stream: tok_s,
        tok_s_total: tok_s * s,
    }
}

/// One strategy of a prediction in a measure.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct StrategyMeasure {
    /// The strategy as `ft predict` names it (with its chosen fetch fraction or N).
    pub strategy: String,
    /// Its prefill's bound.
    pub prefill_bound: Resource,
    /// The prediction in the measure.
    pub end_to_end: EndToEnd,
}

/// Every feasible strategy of `pred` in `spec`'s measure: each one's prefill on the
/// prediction's cache, its decode step, and the two combined ([`end_to_end`]).
pub fn measure_prediction(
    p: &PerfParams,
    model: &ModelSpec,
    pred: &super::Prediction,
    spec: &MeasureSpec,
    config: &PrefillConfig,
) -> Result<Vec<StrategyMeasure>> {
    spec.validate()?;
    let total = model.geometry.total_experts().max(1) as f64;
    let residency = (pred.cache_slots as f64 / total).min(1.0);
    pred.strategies
        .iter()
        .filter(|s| s.feasible)
        .map(|s| {
            let placement = s.strategy.policy(model.geometry.moe_layers)?;
            let pre = prefill(p, model, &placement, residency, spec.prompt_tokens, config)?;
            Ok(StrategyMeasure {
                strategy: s.strategy.cli_name(),
                prefill_bound: pre.bound,
                end_to_end: end_to_end(s.step_us, pre.total_us, pred.config.streams, spec),
            })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::host::HostSpec;
    use crate::preset::ModelSpec;

    fn setup() -> (PerfParams, ModelSpec) {
        let host = HostSpec::field_report();
        let p = PerfParams::from_host(&host).unwrap();
        let m = ModelSpec::preset("qwen3.8-flash-next").unwrap();
        (p, m)
    }

    fn placed(cpu_layers: usize, rest: LayerPlacement) -> PlacementPolicy {
        PlacementPolicy { cpu_layers, rest }
    }

    #[test]
    fn chunk_union_is_every_expert_for_a_long_chunk_and_k_for_one_token() {
        assert!((chunk_union(128.0, 8.0, 1.0) - 8.0).abs() < 1e-9);
        assert!(chunk_union(128.0, 8.0, 512.0) > 127.99);
        assert_eq!(chunk_union(128.0, 8.0, 0.0), 0.0);
    }

    #[test]
    fn offload_prefill_streams_the_misses_and_a_full_cache_streams_nothing() {
        let (p, m) = setup();
        let off = placed(
            0,
            LayerPlacement::Cached {
                fetch_fraction: 1.0,
            },
        );
        let cold = prefill(&p, &m, &off, 0.0, 1200, &PrefillConfig::default()).unwrap();
        let warm = prefill(&p, &m, &off, 1.0, 1200, &PrefillConfig::default()).unwrap();
        assert_eq!(cold.chunks, 3);
        assert!(cold.pcie_us > 0.0 && warm.pcie_us == 0.0);
        assert!(cold.total_us > warm.total_us);
        // Three chunks of nearly every expert: the link moves about 3 x layers x E experts.
        let g = m.geometry;
        let bytes = m.expert_bytes() as f64;
        let expect = 3.0 * g.moe_layers as f64 * g.experts as f64 * bytes
            / (p.gather_gbs * super::super::BYTES_PER_US_PER_GBS);
        assert!(
            (cold.pcie_us - expect).abs() / expect < 0.05,
            "{} {expect}",
            cold.pcie_us
        );
        assert_eq!(
            prefill(&p, &m, &off, 0.0, 0, &PrefillConfig::default())
                .unwrap()
                .total_us,
            0.0
        );
    }

    /// The engine's rest-of-step cost is per stream and step: a chunk pays it once per layer,
    /// whatever its tokens.
    #[test]
    fn the_rest_of_the_step_is_paid_once_per_chunk() {
        let (p, m) = setup();
        let mut q = p.clone();
        q.engine.rest_stream_us += 100.0;
        let cfg = PrefillConfig::default();
        let off = placed(
            0,
            LayerPlacement::Cached {
                fetch_fraction: 1.0,
            },
        );
        for tokens in [1, 600, 1200] {
            let a = prefill(&p, &m, &off, 0.3, tokens, &cfg).unwrap();
            let b = prefill(&q, &m, &off, 0.3, tokens, &cfg).unwrap();
            let want = (a.chunks * m.geometry.moe_layers) as f64 * 100.0;
            let got = b.total_us - a.total_us;
            assert!(
                (got - want).abs() <= 1e-9 * a.total_us,
                "{tokens}: {got} {want}"
            );
        }
    }

    /// cpu fetches nothing, so nothing enters its cache: its prefill computes every expert a
    /// chunk routes to on the CPU whatever the cache's size, as a layer placed on the CPU
    /// does; a layer that fetches some of its misses keeps its cache's hits on the GPU.
    #[test]
    fn cpu_prefill_ignores_the_cache_it_never_fills() {
        let (p, m) = setup();
        let cfg = PrefillConfig::default();
        let cpu = placed(
            0,
            LayerPlacement::Cached {
                fetch_fraction: 0.0,
            },
        );
        let all_cpu = placed(m.geometry.moe_layers, LayerPlacement::Resident);
        let empty = prefill(&p, &m, &cpu, 0.0, 1200, &cfg).unwrap();
        for r in [0.2, 0.6] {
            let a = prefill(&p, &m, &cpu, r, 1200, &cfg).unwrap();
            let b = prefill(&p, &m, &all_cpu, r, 1200, &cfg).unwrap();
            assert_eq!(a, empty, "residency {r}");
            assert_eq!(a.total_us, b.total_us, "residency {r}");
            assert_eq!(a.gpu_us, 0.0);
            let hybrid = placed(
                0,
                LayerPlacement::Cached {
                    fetch_fraction: 0.3,
                },
            );
            let h0 = prefill(&p, &m, &hybrid, 0.0, 1200, &cfg).unwrap();
            let h = prefill(&p, &m, &hybrid, r, 1200, &cfg).unwrap();
            assert!(h.cpu_us < h0.cpu_us && h.gpu_us > h0.gpu_us, "{h:?} {h0:?}");
        }
    }

    #[test]
    fn cpu_prefill_is_cpu_bound_and_slower_when_the_cpu_serves_slower() {
        let (p, m) = setup();
        let cpu = placed(
            0,
            LayerPlacement::Cached {
                fetch_fraction: 0.0,
            },
        );
        let a = prefill(&p, &m, &cpu, 0.0, 1200, &PrefillConfig::default()).unwrap();
        assert_eq!(a.bound, Resource::Cpu);
        let slow = p.with_cpu_speed(0.25).unwrap();
        let b = prefill(&slow, &m, &cpu, 0.0, 1200, &PrefillConfig::default()).unwrap();
        assert!(b.total_us > 2.0 * a.total_us);
    }

    #[test]
    fn measures_agree_at_one_stream_without_a_prompt_and_order_as_documented() {
        let spec = |measure| MeasureSpec {
            measure,
            prompt_tokens: 1200,
            output_tokens: 256,
        };
        let d = end_to_end(20_000.0, 2e6, 2, &spec(Measure::Decode));
        let g = end_to_end(20_000.0, 2e6, 2, &spec(Measure::ServerGen));
        let c = end_to_end(20_000.0, 2e6, 2, &spec(Measure::ClientE2e));
        assert!((d.tok_s_per_stream - 50.0).abs() < 1e-9);
        assert!(d.tok_s_per_stream > g.tok_s_per_stream && g.tok_s_per_stream > c.tok_s_per_stream);
        // 256 tokens over 2 prefills of 2 s and 256 steps of 20 ms.
        assert!((c.tok_s_per_stream - 256.0 / (4.0 + 5.12)).abs() < 1e-9);
        assert!((c.ttft_us - (1.5 * 2e6 + 20_000.0)).abs() < 1e-6);
        let one = end_to_end(20_000.0, 0.0, 1, &spec(Measure::ClientE2e));
        assert!((one.tok_s_per_stream - 50.0).abs() < 1e-9);
        let sg1 = end_to_end(20_000.0, 2e6, 1, &spec(Measure::ServerGen));
        assert!((sg1.tok_s_per_stream - 50.0).abs() < 1e-9);
    }
}
