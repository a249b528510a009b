//! One observed run as the model sees it: its traffic sampled once, its tok/s in its own
//! measure for any parameters.
//!
//! The fit evaluates every run hundreds of times while only the parameters move, so the
//! counting simulation (cache, routing, planner: the expensive part) is run once per run and
//! kept ([`RunModel::new`]); [`RunModel::tok_s`] is then the closed-form step
//! ([`crate::perf::predict::evaluate`]) and the prefill ([`crate::perf::prefill`]) of those
//! counts, exactly as `ft predict` evaluates a strategy.

use serde::{Deserialize, Serialize};
use std::collections::HashMap;

use crate::cache::CacheOptions;
use crate::error::{ModelError, Result};
use crate::host::GIB;
use crate::observe::{Measure, Observation, ObservedCache, ObservedStrategy};
use crate::perf::predict::{evaluate, sample_traffic, SampleRun, TrafficSamples};
use crate::perf::prefill::{end_to_end, prefill, MeasureSpec, PrefillConfig};
use crate::perf::{LayerCounts, PerfParams, StepShape};
use crate::preset::ModelSpec;
use crate::routing;
use crate::strategy::{CpuLayers, FetchFraction, PlacementPolicy, Strategy};

/// How the runs' traffic is sampled (the counting simulation of `ft predict`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct SamplingConfig {
    /// Routing: a preset name, a process TOML file or a trace ([`routing::resolve`]).
    pub routing: String,
    /// Seed replacing the routing process's.
    pub seed: Option<u64>,
    /// The engine's cache: policy, topology, slots per layer and admission (a run that
    /// gives its own, [`Observation::cache_options`], is sampled with those).
    pub cache: CacheOptions,
    /// Warm-up steps before counting.
    pub warmup_steps: usize,
    /// Counted steps.
    pub steps: usize,
    /// How prefill is chunked.
    pub prefill: PrefillConfig,
}

impl Default for SamplingConfig {
    /// `ft predict`'s defaults: the `typical` routing, the default cache (one LRU pool,
    /// admission by tokens), 100 warm-up and 200 counted steps.
    fn default() -> Self {
        SamplingConfig {
            routing: "typical".into(),
            seed: None,
            cache: CacheOptions::default(),
            warmup_steps: 100,
            steps: 200,
            prefill: PrefillConfig::default(),
        }
    }
}

/// The strategy an observation names, with its parameters fixed.
pub fn strategy_of(s: &ObservedStrategy) -> Strategy {
    match *s {
        ObservedStrategy::Offload => Strategy::Offload,
        ObservedStrategy::Hybrid { fetch_fraction } => Strategy::Hybrid {
            fetch: FetchFraction::Fixed(fetch_fraction),
        },
        ObservedStrategy::Cpu => Strategy::Cpu,
        ObservedStrategy::Resident => Strategy::Resident,
        ObservedStrategy::LayerSplit { cpu_layers } => Strategy::LayerSplit {
            cpu_layers: CpuLayers::Fixed(cpu_layers),
        },
        ObservedStrategy::LayerSplitCached { cpu_layers } => Strategy::LayerSplitCached {
            cpu_layers: CpuLayers::Fixed(cpu_layers),
        },
    }
}

/// Cache slots of an observed cache for `model` (at least 1, at most every expert); a run
/// without a cache holds every expert it needs.
pub fn cache_slots(model: &ModelSpec, cache: Option<ObservedCache>) -> usize {
    let total = model.geometry.total_experts().max(1) as f64;
    let slots = match cache {
        None => total,
        Some(ObservedCache::Slots(n)) => n as f64,
        Some(ObservedCache::Gib(g)) => (g * GIB / model.expert_bytes().max(1) as f64).floor(),
        Some(ObservedCache::Residency(r)) => (r * total).round(),
    };
    slots.clamp(1.0, total) as usize
}

/// One run, ready to be evaluated at any parameters.
#[derive(Debug, Clone)]
pub struct RunModel {
    /// The strategy it ran.
    pub strategy: Strategy,
    /// Its placement of every layer.
    pub placement: PlacementPolicy,
    /// Its step's shape (streams, context).
    pub shape: StepShape,
    /// Concurrent streams.
    pub streams: usize,
    /// Cache slots.
    pub slots: usize,
    /// Share of each layer's experts the cache holds (prefill's hits).
    pub residency: f64,
    /// What its tok/s measures, over which request.
    pub spec: MeasureSpec,
    /// The counting simulation's layer-steps.
    pub samples: TrafficSamples,
    /// One GPU: the distinct layer-steps of `samples` with their count per step (the mean
    /// step time is linear in them, so the fit evaluates each once).
    unique: Option<Vec<(LayerCounts, f64)>>,
}

/// The distinct layer-steps of one-GPU samples, each with its count per step.
fn distinct(samples: &TrafficSamples) -> Option<Vec<(LayerCounts, f64)>> {
    if samples.plans != 1 {
        return None;
    }
    let steps = samples.steps().max(1) as f64;
    let mut seen: HashMap<[u64; 6], usize> = HashMap::new();
    let mut out: Vec<(LayerCounts, f64)> = Vec::new();
    for c in &samples.counts {
        let key = [
            c.hits.to_bits(),
            c.hit_tokens.to_bits(),
            c.fetched.to_bits(),
            c.fetched_tokens.to_bits(),
            c.cpu.to_bits(),
            c.cpu_tokens.to_bits(),
        ];
        let i = *seen.entry(key).or_insert_with(|| {
            out.push((*c, 0.0));
            out.len() - 1
        });
        out[i].1 += 1.0 / steps;
    }
    Some(out)
}

impl RunModel {
    /// Sample the traffic of a run of `strategy` at `streams` streams and `context` tokens of
    /// context on a cache of `slots` slots.
    pub fn new(
        model: &ModelSpec,
        strategy: Strategy,
        streams: usize,
        context: usize,
        slots: usize,
        spec: MeasureSpec,
        sampling: &SamplingConfig,
    ) -> Result<Self> {
        let placement = strategy.policy(model.geometry.moe_layers)?;
        let mut src = routing::resolve(&sampling.routing, &model.geometry, sampling.seed)?;
        let cache = &sampling.cache;
        // A cache's size as its options fit it (slots per layer, a per-layer multiple); a
        // strategy without a cache holds what it holds.
        let slots = match strategy {
            Strategy::Resident | Strategy::LayerSplit { .. } => slots,
            _ => cache.fit_slots(slots, model.geometry.moe_layers)?,
        };
        let samples = sample_traffic(
            src.as_mut(),
            &SampleRun {
                kind: strategy.kind(),
                placement,
                cache,
                slots,
                warmup_steps: sampling.warmup_steps,
                steps: sampling.steps.max(1),
                streams,
            },
        )?;
        let total = model.geometry.total_experts().max(1) as f64;
        Ok(RunModel {
            strategy,
            placement,
            shape: StepShape::new(model, streams, context),
            streams,
            slots,
            residency: (slots as f64 / total).min(1.0),
            spec,
            unique: distinct(&samples),
            samples,
        })
    }

    /// The model of an observed run.
    pub fn of_observation(
        model: &ModelSpec,
        o: &Observation,
        sampling: &SamplingConfig,
    ) -> Result<Self> {
        if let ObservedStrategy::LayerSplit { cpu_layers }
        | ObservedStrategy::LayerSplitCached { cpu_layers } = o.strategy
        {
            if cpu_layers > model.geometry.moe_layers {
                return Err(ModelError::invalid(
                    format!("row {}: cpu_layers", o.row),
                    format!(
                        "{cpu_layers} is more than the model's {} MoE layers",
                        model.geometry.moe_layers
                    ),
                ));
            }
        }
        let own;
        let sampling = match &o.cache_options {
            Some(c) => {
                own = SamplingConfig {
                    cache: c.clone(),
                    ..sampling.clone()
                };
                &own
            }
            None => sampling,
        };
        RunModel::new(
            model,
            strategy_of(&o.strategy),
            o.streams,
            o.context,
            cache_slots(model, o.cache),
            MeasureSpec {
                measure: o.measure,
                prompt_tokens: o.prompt_tokens,
                output_tokens: o.output_tokens,
            },
            sampling,
        )
    }

    /// Decode step time at `p`, in us: the mean over the sampled steps, as
    /// [`crate::perf::predict::evaluate`] gives it (on one GPU from the distinct layer-steps,
    /// each evaluated once; a test checks the two agree).
    pub fn step_us(&self, p: &PerfParams) -> f64 {
        let Some(unique) = &self.unique else {
            return evaluate(p, &self.shape, &self.samples).step_us;
        };
        let dense = p.dense_us(&self.shape.dense, self.shape.streams, self.shape.context);
        unique
            .iter()
            .map(|(c, w)| {
                let c = p.engine.apply_miss_factor(c);
                w * p
                    .layer_time_gpus(&self.shape, std::slice::from_ref(&c), dense)
                    .total_us
            })
            .sum()
    }

    /// Predicted tok/s per stream in the run's own measure at `p` (prefill only where the
    /// measure includes it).
    pub fn tok_s(&self, model: &ModelSpec, p: &PerfParams, prefill_cfg: &PrefillConfig) -> f64 {
        let step = self.step_us(p);
        let pre = match self.spec.measure {
            Measure::Decode => 0.0,
            Measure::ServerGen | Measure::ClientE2e => prefill(
                p,
                model,
                &self.placement,
                self.residency,
                self.spec.prompt_tokens,
                prefill_cfg,
            )
            .map(|x| x.total_us)
            .unwrap_or(f64::INFINITY),
        };
        end_to_end(step, pre, self.streams, &self.spec).tok_s_per_stream
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::host::HostSpec;
    use crate::perf::EngineTerms;

    #[test]
    fn the_distinct_layer_steps_give_evaluate_s_mean() {
        let mut m = ModelSpec::preset("qwen3.8-flash-next").unwrap();
        m.geometry.moe_layers = 4;
        let mut p = PerfParams::from_host(&HostSpec::field_report()).unwrap();
        let sampling = SamplingConfig {
            warmup_steps: 10,
            steps: 30,
            seed: Some(3),
            ..SamplingConfig::default()
        };
        let hybrid = Strategy::Hybrid {
            fetch: FetchFraction::Fixed(0.4),
        };
        let r = RunModel::new(&m, hybrid, 2, 2048, 600, MeasureSpec::decode(), &sampling).unwrap();
        let unique = r.unique.as_ref().unwrap().len();
        assert!(unique < r.samples.counts.len(), "{unique}");
        for miss in [1.0, 0.6] {
            p.engine = EngineTerms {
                hybrid_miss_factor: miss,
                rest_stream_us: 7.0,
                ..EngineTerms::default()
            };
            let slow = evaluate(&p, &r.shape, &r.samples).step_us;
            let fast = r.step_us(&p);
            assert!((slow - fast).abs() <= 1e-9 * slow, "{slow} {fast}");
        }
    }
}
