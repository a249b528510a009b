//! Sweeps: the cross product of a few axes over a base configuration, run in parallel.
//!
//! `ft simulate --sweep KEY=V1,V2,...` builds [`SweepPoint`]s with [`expand`] and runs them
//! with [`run_sweep`] on rayon's pool. Work shared between points is done once: hosts and
//! models are resolved once per name, a `--miss-rate` calibration once per distinct
//! (model, routing, seed, streams, rate), and the analytic prediction (needed for hybrid's
//! `auto` fraction, or for the model column) once per distinct configuration. Rows come
//! back in the points' order, whatever the scheduling, so the CSV is deterministic.

use std::collections::{BTreeMap, HashMap};
use std::sync::Mutex;

use rayon::prelude::*;
use serde::{Deserialize, Serialize};

use ft_model::cache::{CachePolicy, CacheSize};
use ft_model::perf::{predict, Prediction};
use ft_model::preset::ModelSpec;
use ft_model::strategy::{CpuLayers, FetchFraction, Strategy, StrategyKind};

use crate::compare::{resolve_cache, CacheChoice, CompareConfig};
use crate::costs::CostModel;
use crate::decode::Workload;
use crate::error::{Result, SimError};
use crate::hosts::{self, SimHost};
use std::sync::Arc;

use crate::decode::RecordedRouting;
use crate::run::{plan_trace_recorded, routing_source, simulate_replay, SimConfig};

/// One configuration of a sweep.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SweepPoint {
    /// Host preset or file.
    pub host: String,
    /// Model preset or file.
    pub model: String,
    /// Strategy.
    pub strategy: StrategyKind,
    /// Everything else (its `strategies` field is ignored).
    pub config: CompareConfig,
}

/// The sweepable keys of `--sweep KEY=...`.
pub const SWEEP_KEYS: [&str; 16] = [
    "host",
    "model",
    "streams",
    "strategy",
    "fetch-fraction",
    "cache-slots",
    "cache-gb",
    "miss-rate",
    "context",
    "routing",
    "policy",
    "topology",
    "admission",
    "seed",
    "steps",
    "jitter",
];

fn parse<T: std::str::FromStr>(key: &str, v: &str) -> Result<T> {
    v.parse().map_err(|_| {
        SimError::invalid(
            format!("--sweep {key}"),
            format!("'{v}' is not a valid value"),
        )
    })
}

/// Apply one `key=value` to a point.
pub fn apply(point: &mut SweepPoint, key: &str, v: &str) -> Result<()> {
    let c = &mut point.config;
    match key {
        "host" => point.host = v.to_string(),
        "model" => point.model = v.to_string(),
        "streams" => {
            c.streams = parse(key, v)?;
            ft_model::limits::check_streams("--sweep streams", c.streams as u64)?;
        }
        // `hybrid:F` (hybrid at a fixed fraction) and `layer-split:N`, so one axis can mix
        // strategies and their parameters without repeating the others.
        "strategy" => {
            let s: Strategy = v.parse()?;
            point.strategy = s.kind();
            match s {
                Strategy::Hybrid { fetch } if v.contains(':') => c.fetch = fetch,
                Strategy::LayerSplit { cpu_layers } | Strategy::LayerSplitCached { cpu_layers } => {
                    c.cpu_layers = cpu_layers
                }
                Strategy::Hybrid { .. }
                | Strategy::Offload
                | Strategy::Resident
                | Strategy::Cpu => {}
            }
        }
        "fetch-fraction" => c.fetch = FetchFraction::parse("--sweep fetch-fraction", v)?,
        "cache-slots" => {
            c.cache = CacheChoice::Slots {
                slots: parse(key, v)?,
            }
        }
        "cache-gb" => {
            c.cache = CacheChoice::Gib {
                gib: parse(key, v)?,
            }
        }
        "miss-rate" => {
            c.cache = CacheChoice::MissRate {
                rate: parse(key, v)?,
                streams: None,
            }
        }
        "context" => {
            c.workload.prompt_tokens = parse(key, v)?;
            ft_model::limits::check_context("--sweep context", c.workload.prompt_tokens)?;
        }
        "routing" => c.routing = v.to_string(),
        "policy" => c.cache_options.policy = v.parse()?,
        "topology" => c.cache_options.topology = v.parse()?,
        "admission" => c.cache_options.admission = v.parse()?,
        "seed" => c.seed = parse(key, v)?,
        "steps" => {
            c.steps = parse(key, v)?;
            ft_model::limits::check_steps("--sweep steps", c.steps)?;
        }
        "jitter" => c.jitter = parse(key, v)?,
        _ => {
            return Err(SimError::invalid(
                "--sweep",
                format!("unknown key '{key}'; known: {}", SWEEP_KEYS.join(", ")),
            ))
        }
    }
    Ok(())
}

/// Parse `KEY=V1,V2,...`.
pub fn parse_axis(s: &str) -> Result<(String, Vec<String>)> {
    let (k, vs) = s
        .split_once('=')
        .ok_or_else(|| SimError::invalid("--sweep", format!("'{s}' is not KEY=V1,V2,...")))?;
    let k = k.trim().to_string();
    if !SWEEP_KEYS.contains(&k.as_str()) {
        return Err(SimError::invalid(
            "--sweep",
            format!("unknown key '{k}'; known: {}", SWEEP_KEYS.join(", ")),
        ));
    }
    let vals: Vec<String> = vs
        .split(',')
        .map(|v| v.trim().to_string())
        .filter(|v| !v.is_empty())
        .collect();
    if vals.is_empty() {
        return Err(SimError::invalid("--sweep", format!("'{s}' has no values")));
    }
    Ok((k, vals))
}

/// The axes of a sweep with the plain flags' stream counts and strategies added as axes,
/// unless `axes` sweeps them itself (streams first, strategies last).
pub fn with_flag_axes(
    mut axes: Vec<(String, Vec<String>)>,
    streams: &[usize],
    strategies: &[StrategyKind],
) -> Vec<(String, Vec<String>)> {
    if !axes.iter().any(|(k, _)| k == "streams") {
        axes.insert(
            0,
            (
                "streams".to_string(),
                streams.iter().map(|s| s.to_string()).collect(),
            ),
        );
    }
    if !axes.iter().any(|(k, _)| k == "strategy") {
        let names = strategies.iter().map(|k| k.name().to_string()).collect();
        axes.push(("strategy".to_string(), names));
    }
    axes
}

/// The cross product of `axes` over `base`, the last axis varying fastest. Its size is
/// checked against [`ft_model::limits::MAX_SWEEP_POINTS`] before any point is made.
pub fn expand(base: &SweepPoint, axes: &[(String, Vec<String>)]) -> Result<Vec<SweepPoint>> {
    use ft_model::limits::{self, MAX_SWEEP_POINTS};
    let sizes: Vec<String> = axes.iter().map(|(_, v)| v.len().to_string()).collect();
    let total = axes
        .iter()
        .try_fold(1usize, |n, (_, v)| n.checked_mul(v.len()))
        .unwrap_or(usize::MAX);
    limits::check(
        &format!("--sweep (a cross product of {} points)", sizes.join(" x ")),
        total,
        MAX_SWEEP_POINTS,
        "ft_model::limits::MAX_SWEEP_POINTS: each point is a simulation held in memory",
    )?;
    let mut points = vec![base.clone()];
    for (key, values) in axes {
        let mut next = Vec::with_capacity(points.len() * values.len());
        for p in &points {
            for v in values {
                let mut q = p.clone();
                apply(&mut q, key, v)?;
                next.push(q);
            }
        }
        points = next;
    }
    Ok(points)
}

/// One row of a sweep's CSV.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SweepRow {
    /// Host name.
    pub host: String,
    /// Model name.
    pub model: String,
    /// Streams.
    pub streams: usize,
    /// Strategy kind.
    pub strategy: String,
    /// Fetch fraction used.
    pub fetch_fraction: f64,
    /// Cache slots.
    pub cache_slots: usize,
    /// Prompt tokens (context at a request's first decode step).
    pub context: u64,
    /// Routing.
    pub routing: String,
    /// Seed.
    pub seed: u64,
    /// Measured steps.
    pub steps: u64,
    /// Simulated tok/s per stream.
    pub tok_s_per_stream: f64,
    /// Simulated tok/s total.
    pub tok_s_total: f64,
    /// Simulated miss rate.
    pub miss_rate: f64,
    /// Simulated bound.
    pub bound: String,
    /// Mean step, ms.
    pub step_ms: f64,
    /// Events handled.
    pub events: u64,
    /// Analytic tok/s total, when the model was run.
    pub model_tok_s_total: Option<f64>,
    /// Analytic bound, when the model was run.
    pub model_bound: Option<String>,
    /// Simulated over analytic tok/s minus 1, when the model was run.
    pub sim_vs_model: Option<f64>,
    /// Share of simulated decode time in which a gather and CPU weight reads overlapped.
    pub sim_contended: f64,
    /// Analytic step time, ms.
    pub model_step_ms: Option<f64>,
    /// Time the analytic step charges to DRAM contention, ms.
    pub model_contention_ms: Option<f64>,
    /// The simulator's lead over the model beyond what the documented differences explain
    /// (the contention the closed form charges, the pool wake-ups it charges every layer),
    /// as a share of the analytic step (0 when fully explained or when the simulator is
    /// slower; a slower simulator shows in `sim_vs_model`).
    pub unexplained: Option<f64>,
    /// The legacy rule's CPU-MoE over PCIe-gather ratio for this host and model, when the
    /// model was run (the bench bandwidths are the model's).
    pub legacy_ratio: Option<f64>,
    /// The legacy rule's verdict (`offload` or `hybrid`) beside the simulated row.
    pub legacy_verdict: Option<String>,
}

/// Key of work shared between points (its JSON form).
fn key<T: Serialize>(t: &T) -> String {
    serde_json::to_string(t).expect("sweep keys serialize")
}

/// Run every point; `with_model` adds the analytic prediction to every row; `progress` is
/// called once per finished unit of work with the total number of units.
pub fn run_sweep(
    points: &[SweepPoint],
    with_model: bool,
    progress: &(dyn Fn(u64, u64) + Sync),
) -> Result<Vec<SweepRow>> {
    // Names, once each.
    let mut hosts_by: BTreeMap<String, SimHost> = BTreeMap::new();
    let mut models_by: BTreeMap<String, ModelSpec> = BTreeMap::new();
    for p in points {
        if !hosts_by.contains_key(&p.host) {
            hosts_by.insert(p.host.clone(), hosts::resolve_host(&p.host)?);
        }
        if !models_by.contains_key(&p.model) {
            models_by.insert(p.model.clone(), ModelSpec::resolve(&p.model)?);
        }
    }
    let mut costs_by: HashMap<(String, String), CostModel> = HashMap::new();
    for p in points {
        let k = (p.host.clone(), p.model.clone());
        if let std::collections::hash_map::Entry::Vacant(e) = costs_by.entry(k) {
            e.insert(CostModel::from_sim_host(
                &hosts_by[&p.host],
                &models_by[&p.model],
            )?);
        }
    }

    // Cache sizes: distinct choices (a calibration is independent of the host; the
    // GPU-memory size is not, so only then is the host part of the key).
    let cache_key = |p: &SweepPoint| {
        let host = match p.config.cache {
            CacheChoice::GpuMemory => p.host.as_str(),
            _ => "",
        };
        key(&(
            host,
            hosts_by[&p.host].perf.params.layout,
            &p.model,
            &p.config.cache,
            p.config.streams,
            &p.config.routing,
            p.config.seed,
            &p.config.cache_options,
            p.config.warmup_steps,
            p.config.steps,
            p.config.workload,
        ))
    };
    let mut distinct_cache: Vec<&SweepPoint> = Vec::new();
    let mut seen = std::collections::HashSet::new();
    for p in points {
        if seen.insert(cache_key(p)) {
            distinct_cache.push(p);
        }
    }
    // Predictions: distinct configurations needing one.
    let needs_prediction = |p: &SweepPoint| {
        with_model
            || (p.strategy == StrategyKind::Hybrid && p.config.fetch == FetchFraction::Auto)
            || (p.strategy.takes_cpu_layers() && p.config.cpu_layers == CpuLayers::Auto)
    };
    let pred_key = |p: &SweepPoint| {
        key(&(
            &p.host,
            cache_key(p),
            p.config.fetch,
            p.config.cpu_layers,
            p.config.threshold,
        ))
    };
    let mut distinct_pred: Vec<&SweepPoint> = Vec::new();
    let mut seen = std::collections::HashSet::new();
    for p in points.iter().filter(|p| needs_prediction(p)) {
        if seen.insert(pred_key(p)) {
            distinct_pred.push(p);
        }
    }
    let total = (distinct_cache.len() + distinct_pred.len() + points.len()) as u64;
    let done = Mutex::new(0u64);
    let tick = || {
        let mut d = done.lock().expect("progress lock");
        *d += 1;
        progress(*d, total);
    };

    let caches: HashMap<String, usize> = distinct_cache
        .par_iter()
        .map(|p| {
            let r = resolve_cache(&models_by[&p.model], &hosts_by[&p.host].perf, &p.config)
                .map(|c| (cache_key(p), c.slots));
            tick();
            r
        })
        .collect::<Result<_>>()?;
    let predictions: HashMap<String, Prediction> = distinct_pred
        .par_iter()
        .map(|p| {
            let slots = caches[&cache_key(p)];
            let h = &hosts_by[&p.host];
            let cfg = p.config.predict_config_with(
                p.config.streams,
                Some(CacheSize::Slots(slots)),
                h.bench,
            );
            let r = predict(&models_by[&p.model], &h.perf, &cfg)
                .map(|pr| (pred_key(p), pr))
                .map_err(SimError::from);
            tick();
            r
        })
        .collect::<Result<_>>()?;

    // Each point's simulation configuration.
    let sims: Vec<SimConfig> = points
        .iter()
        .map(|p| {
            let slots = caches[&cache_key(p)];
            let pred = needs_prediction(p).then(|| &predictions[&pred_key(p)]);
            let strategy = match p.strategy {
                StrategyKind::Hybrid => Strategy::Hybrid {
                    fetch: FetchFraction::Fixed(match p.config.fetch {
                        FetchFraction::Fixed(f) => f,
                        FetchFraction::Auto => {
                            pred.expect("auto has a prediction")
                                .get(StrategyKind::Hybrid)
                                .fetch_fraction
                        }
                    }),
                },
                StrategyKind::LayerSplit | StrategyKind::LayerSplitCached => {
                    let n = match p.config.cpu_layers {
                        CpuLayers::Fixed(n) => n,
                        CpuLayers::Auto => pred
                            .expect("auto has a prediction")
                            .get(p.strategy)
                            .cpu_layers
                            .unwrap_or(0),
                    };
                    Strategy::from_parts(p.strategy, None, Some(CpuLayers::Fixed(n)))
                }
                StrategyKind::Offload | StrategyKind::Resident | StrategyKind::Cpu => {
                    Strategy::from_kind(p.strategy, None)
                }
            };
            let c = &p.config;
            SimConfig {
                streams: c.streams,
                strategy,
                cache_slots: slots,
                cache_options: c.cache_options.clone(),
                routing: c.routing.clone(),
                warmup_steps: c.warmup_steps,
                steps: c.steps,
                seed: c.seed,
                jitter: c.jitter,
                workload: c.workload,
                layout: hosts_by[&p.host].perf.params.layout,
            }
        })
        .collect();
    // Planning is host-independent but for the host's GPUs: group the points by what their
    // plans depend on, plan each group once and replay it for every point of the group.
    // The cache size does not change the plans of `resident` (every expert is held) nor of
    // `cpu` on a cache that starts empty (nothing is ever admitted, every lookup misses).
    let slots_matter = |i: usize| {
        let (p, s) = (&points[i], &sims[i]);
        match p.strategy {
            StrategyKind::Resident => false,
            StrategyKind::Cpu => matches!(&s.cache_options.policy, CachePolicy::StaticHot { .. }),
            StrategyKind::Offload
            | StrategyKind::Hybrid
            | StrategyKind::LayerSplit
            | StrategyKind::LayerSplitCached => true,
        }
    };
    let trace_key = |i: usize| {
        let s = &sims[i];
        let slots = if slots_matter(i) { s.cache_slots } else { 0 };
        key(&(
            &points[i].model,
            s.layout,
            &s.routing,
            s.seed,
            s.streams,
            &s.cache_options,
            s.strategy,
            slots,
            s.warmup_steps,
            s.steps,
        ))
    };
    let mut groups: BTreeMap<String, Vec<usize>> = BTreeMap::new();
    for i in 0..points.len() {
        groups.entry(trace_key(i)).or_default().push(i);
    }
    let mut groups: Vec<Vec<usize>> = groups.into_values().collect();
    // Largest first (planning grows with streams and steps), so that no long group starts
    // last and leaves a core idle at the end.
    groups.sort_by_key(|g| {
        let s = &sims[g[0]];
        std::cmp::Reverse(s.streams as u64 * (s.warmup_steps + s.steps))
    });
    // Routing depends on even less (model, routing, seed, streams, length): draw it once.
    let routing_key = |i: usize| {
        let s = &sims[i];
        key(&(
            &points[i].model,
            &s.routing,
            s.seed,
            s.streams,
            s.warmup_steps + s.steps,
        ))
    };
    let mut routing_points: BTreeMap<String, usize> = BTreeMap::new();
    for g in &groups {
        routing_points.entry(routing_key(g[0])).or_insert(g[0]);
    }
    let routings: HashMap<String, RecordedRouting> = routing_points
        .into_par_iter()
        .map(|(k, i)| {
            let s = &sims[i];
            let model = &models_by[&points[i].model];
            let mut src = routing_source(model, &s.routing, s.seed)?;
            let n = (s.warmup_steps + s.steps) as usize;
            Ok((k, RecordedRouting::record(src.as_mut(), s.streams, n)?))
        })
        .collect::<Result<_>>()?;
    let mut rows: Vec<(usize, SweepRow)> = groups
        .par_iter()
        .map(|members| -> Result<Vec<(usize, SweepRow)>> {
            let first = members[0];
            let model = &models_by[&points[first].model];
            let (trace, warmup, slots) =
                plan_trace_recorded(model, &sims[first], &routings[&routing_key(first)])?;
            let trace = Arc::new(trace);
            let mut out = Vec::with_capacity(members.len());
            for &i in members {
                let p = &points[i];
                let costs = &costs_by[&(p.host.clone(), p.model.clone())];
                // A group of several cache sizes reports each member's own, checked as
                // planning it would have.
                let slots = if slots_matter(i) || p.strategy == StrategyKind::Resident {
                    slots
                } else {
                    let s = &sims[i];
                    s.cache_options
                        .build(p.strategy, &model.geometry, s.cache_slots, None)?
                        .capacity()
                };
                let sim = simulate_replay(costs, &sims[i], trace.clone(), warmup, slots)?;
                let m = needs_prediction(p)
                    .then(|| &predictions[&pred_key(p)])
                    .filter(|_| with_model)
                    .map(|pr| pr.get(p.strategy));
                let legacy = needs_prediction(p)
                    .then(|| &predictions[&pred_key(p)].legacy)
                    .filter(|_| with_model);
                let c = &p.config;
                tick();
                out.push((
                    i,
                    SweepRow {
                        host: hosts_by[&p.host].name.clone(),
                        model: model.name.clone(),
                        streams: c.streams,
                        strategy: p.strategy.name().to_string(),
                        fetch_fraction: sim.fetch_fraction,
                        cache_slots: sim.cache_slots,
                        context: c.workload.prompt_tokens,
                        routing: c.routing.clone(),
                        seed: c.seed,
                        steps: c.steps,
                        tok_s_per_stream: sim.tok_s_per_stream,
                        tok_s_total: sim.tok_s_total,
                        miss_rate: sim.miss_rate,
                        bound: sim.bound.clone(),
                        step_ms: sim.step_ms,
                        events: sim.events,
                        model_tok_s_total: m.map(|m| m.tok_s_total),
                        model_bound: m.map(|m| m.bound.name().to_string()),
                        sim_vs_model: m.map(|m| sim.tok_s_total / m.tok_s_total - 1.0),
                        sim_contended: sim.contended,
                        model_step_ms: m.map(|m| m.step_us / 1e3),
                        model_contention_ms: m.map(|m| m.contention_us / 1e3),
                        unexplained: m.map(|m| {
                            let gain = m.step_us - sim.step_ms * 1e3;
                            let cpu_layers = sim.cpu_per_layer.min(1.0).ceil() * sim.layers as f64;
                            let explained =
                                m.contention_us + hosts_by[&p.host].wake_us * cpu_layers;
                            ((gain - explained) / m.step_us).max(0.0)
                        }),
                        legacy_ratio: legacy.map(|l| l.ratio),
                        legacy_verdict: legacy.map(|l| l.verdict.name().to_string()),
                    },
                ));
            }
            Ok(out)
        })
        .collect::<Result<Vec<_>>>()?
        .into_iter()
        .flatten()
        .collect();
    rows.sort_by_key(|(i, _)| *i);
    Ok(rows.into_iter().map(|(_, r)| r).collect())
}

/// Write rows as CSV (header first).
pub fn write_csv<W: std::io::Write>(rows: &[SweepRow], w: W) -> Result<()> {
    let mut out = csv::Writer::from_writer(w);
    for r in rows {
        out.serialize(r)
            .map_err(|e| SimError::invalid("CSV output", e.to_string()))?;
    }
    out.flush().map_err(|e| SimError::Io {
        path: "CSV output".to_string(),
        source: e,
    })?;
    Ok(())
}

/// A default sweep point: the field report's configuration for `strategy`.
pub fn base_point(
    host: &str,
    model: &str,
    strategy: StrategyKind,
    config: CompareConfig,
) -> SweepPoint {
    SweepPoint {
        host: host.to_string(),
        model: model.to_string(),
        strategy,
        config,
    }
}

/// The policy of a name, for callers building points by hand.
pub fn policy(name: &str) -> Result<CachePolicy> {
    Ok(name.parse()?)
}

/// Requests with `prompt` tokens of prompt and `output` of output.
pub fn workload(prompt: u64, output: u64) -> Workload {
    Workload {
        prompt_tokens: prompt,
        output_tokens: output,
        prefill_ns: 0,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn flag_axes_are_added_unless_swept() {
        let kinds = [StrategyKind::Offload, StrategyKind::Hybrid];
        let axes = with_flag_axes(vec![parse_axis("seed=1,2").unwrap()], &[1, 4], &kinds);
        let keys: Vec<&str> = axes.iter().map(|(k, _)| k.as_str()).collect();
        assert_eq!(keys, ["streams", "seed", "strategy"]);
        assert_eq!(axes[0].1, ["1", "4"]);
        assert_eq!(axes[2].1, ["offload", "hybrid"]);
        let swept = vec![
            parse_axis("strategy=cpu").unwrap(),
            parse_axis("streams=8").unwrap(),
        ];
        assert_eq!(with_flag_axes(swept.clone(), &[1], &kinds), swept);
    }
}
