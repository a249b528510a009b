//! The statistics engines publish about their routing, computed for any [`RoutingSource`].
//!
//! A routing process is only as good as the numbers it reproduces, and the numbers engines
//! report about real models are these: the hit rate of an expert cache against its size
//! (per-layer slots as llama.cpp's `--moe-expert-cache`, or one global pool), the coverage of
//! a static hot list learned on one part of a workload and scored on another, how far back a
//! re-used expert was last used (reuse distance), how the union of experts per step grows
//! with concurrent streams, and how well one layer's routing predicts the next one's. `ft
//! routing stats` prints them, `ft routing fit` matches a process to them, and the simulator,
//! tune and calibrate can call [`routing_stats`] directly.
//!
//! Hit rates run the recorded steps through [`crate::traffic::run_traffic`] with the offload
//! strategy (every miss fetched), so they are the miss rates the model and the simulator see:
//! expert level (the union over streams of a layer-step is looked up once per expert).

use serde::{Deserialize, Serialize};
use std::collections::HashMap;

use super::{RoutingSource, StepRouting};
use crate::cache::{build_cache_with, CachePolicy, CacheTopology};
use crate::error::{ModelError, Result};
use crate::geometry::MoeGeometry;
use crate::strategy::StrategyKind;
use crate::traffic::{run_traffic, TrafficConfig};

/// Most expert ids the statistics hold in memory at once (`(warm-up + steps) x streams x
/// moe_layers x top_k`, 4 bytes each: 256 MiB). Larger requests are refused with the flags
/// to reduce.
pub const MAX_RECORDED_IDS: usize = 64 << 20;

/// Upper edges (in tokens, inclusive) of the reuse-distance buckets; a last bucket holds
/// longer distances. Powers of two resolve both the next-token repeats and the long tail.
pub const REUSE_EDGES: [u64; 9] = [1, 2, 4, 8, 16, 32, 64, 128, 256];

/// The name of each bucket of [`LayerReuse::shares`], in tokens: `1`, `2`, `3-4`, ... for the
/// buckets of [`REUSE_EDGES`], then `>256` and `never`.
pub fn reuse_bucket_labels() -> Vec<String> {
    let mut labels = Vec::with_capacity(REUSE_EDGES.len() + 2);
    let mut lo = 1;
    for &e in &REUSE_EDGES {
        labels.push(if lo == e {
            format!("{e}")
        } else {
            format!("{lo}-{e}")
        });
        lo = e + 1;
    }
    labels.push(format!(">{}", lo - 1));
    labels.push("never".to_string());
    labels
}

/// What to compute and over how many steps.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct StatsConfig {
    /// Steps run through the caches before counting (they fill the caches; a static hot set
    /// is chosen from them).
    pub warmup_steps: usize,
    /// Measured steps (the hot list learns on the first half and is scored on the second).
    pub steps: usize,
    /// Concurrent streams of every statistic but the union curve, which runs 1, 2, 4, ...
    /// up to `union_streams`.
    pub streams: usize,
    /// Largest stream count of the union curve (the steps are recorded with
    /// `max(streams, union_streams)` streams; stream `i` routes the same whatever the count).
    pub union_streams: usize,
    /// Per-layer cache sizes, in slots per layer.
    pub per_layer_slots: Vec<usize>,
    /// Global cache sizes, in slots per layer (the pool holds this many times the layer
    /// count, so the two topologies compare at the same memory).
    pub global_slots: Vec<usize>,
    /// Policies to measure at every size.
    pub policies: Vec<CachePolicy>,
    /// Hot-list sizes, in experts per layer.
    pub hot_k: Vec<usize>,
    /// Compute the reuse distances and the layer-to-layer prediction (the slowest parts).
    pub detail: bool,
}

impl Default for StatsConfig {
    fn default() -> Self {
        StatsConfig {
            warmup_steps: 200,
            steps: 1000,
            streams: 1,
            union_streams: 8,
            per_layer_slots: vec![32, 64, 128, 256],
            global_slots: vec![32, 64, 128, 256],
            policies: vec![
                CachePolicy::Lru,
                CachePolicy::Lfu { decay_every: 0 },
                CachePolicy::StaticHot { hot: Vec::new() },
            ],
            hot_k: vec![32],
            detail: true,
        }
    }
}

impl StatsConfig {
    /// Check the configuration against a geometry; errors name the field.
    pub fn validate(&self, g: &MoeGeometry) -> Result<()> {
        if self.steps < 2 {
            return Err(ModelError::invalid(
                "stats.steps",
                "needs at least 2 steps (the hot list learns on one half)",
            ));
        }
        if self.streams == 0 {
            return Err(ModelError::invalid("stats.streams", "must be at least 1"));
        }
        for (field, sizes) in [
            ("stats.per_layer_slots", &self.per_layer_slots),
            ("stats.global_slots", &self.global_slots),
            ("stats.hot_k", &self.hot_k),
        ] {
            if let Some(&n) = sizes.iter().find(|&&n| n == 0 || n > g.experts) {
                return Err(ModelError::invalid(
                    field,
                    format!("{n} is outside 1..={} (the experts per layer)", g.experts),
                ));
            }
        }
        let ids = (self.warmup_steps as u128 + self.steps as u128)
            * self.recorded_streams() as u128
            * g.moe_layers as u128
            * g.top_k as u128;
        if ids > MAX_RECORDED_IDS as u128 {
            return Err(ModelError::invalid(
                "stats.steps",
                format!(
                    "(warm-up + steps) x streams x layers x top_k = {ids} expert ids, more \
                     than the limit of {MAX_RECORDED_IDS}; use fewer steps or streams"
                ),
            ));
        }
        Ok(())
    }

    /// Streams the steps are recorded with.
    pub fn recorded_streams(&self) -> usize {
        self.streams.max(self.union_streams)
    }
}

/// The hit rate of one cache configuration.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct HitRatePoint {
    /// Replacement policy (`lru`, `lfu`, `static-hot`).
    pub policy: String,
    /// Slot sharing between layers.
    pub topology: CacheTopology,
    /// Slots per layer (a global pool holds this many times the layer count).
    pub slots_per_layer: usize,
    /// Slots over experts per layer (0 to 1).
    pub residency: f64,
    /// Expert-level hit rate over the measured steps (0 to 1).
    pub hit_rate: f64,
}

/// Coverage of a static hot list learned on the first half of the steps.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct HotPoint {
    /// Experts per layer in the list (the most routed of each layer in the first half).
    pub k: usize,
    /// Share of the second half's routings (token x layer x slot) that the list covers.
    pub coverage: f64,
    /// What a list would cover under uniform routing: `k / experts`.
    pub uniform: f64,
}

/// Reuse distances of one layer.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LayerReuse {
    /// The layer.
    pub layer: usize,
    /// Share of routings (0 to 1) whose expert the same stream last used at this layer
    /// `d` tokens before, per bucket of [`REUSE_EDGES`] (`d <= 1`, `1 < d <= 2`, ...), then
    /// beyond the last edge, then never before in the recorded steps.
    pub shares: Vec<f64>,
    /// Median distance in tokens over the re-used routings (0 when none was re-used).
    pub median_tokens: f64,
}

/// The union of experts per layer-step at a stream count.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct UnionPoint {
    /// Concurrent streams.
    pub streams: usize,
    /// Mean distinct experts per layer-step.
    pub unique: f64,
    /// `unique` over `streams x top_k` (1 when the streams share nothing).
    pub share_of_routings: f64,
}

/// How well layer `l`'s routing predicts layer `l + 1`'s, as a prefetcher would use it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LayerCorrelation {
    /// Share of layer `l + 1`'s experts found among the `top_k` most frequent successors
    /// (learned on the first half) of the token's layer-`l` experts, on the second half,
    /// averaged over the layer pairs.
    pub predicted: f64,
    /// The same for the `top_k` most routed experts of layer `l + 1` (first half): what
    /// popularity alone predicts.
    pub baseline: f64,
}

/// The statistics of a routing source.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RoutingStats {
    /// The geometry routed.
    pub geometry: MoeGeometry,
    /// What was computed.
    pub config: StatsConfig,
    /// Hit rate against cache size, per topology and policy.
    pub hit_rates: Vec<HitRatePoint>,
    /// Hot-list coverage per list size.
    pub hot: Vec<HotPoint>,
    /// Reuse distances per layer (empty without `detail`).
    pub reuse: Vec<LayerReuse>,
    /// Reuse distances of all layers together (empty without `detail`).
    pub reuse_all: Vec<f64>,
    /// Union of experts per layer-step against streams.
    pub union: Vec<UnionPoint>,
    /// Layer-to-layer prediction (absent without `detail` or with one layer).
    pub layer_correlation: Option<LayerCorrelation>,
}

impl RoutingStats {
    /// The hit rate of a configuration, if it was measured.
    pub fn hit_rate(
        &self,
        policy: &str,
        topology: CacheTopology,
        slots_per_layer: usize,
    ) -> Option<f64> {
        self.hit_rates
            .iter()
            .find(|p| {
                p.policy == policy && p.topology == topology && p.slots_per_layer == slots_per_layer
            })
            .map(|p| p.hit_rate)
    }

    /// The hot-list coverage of `k` experts per layer, if it was measured.
    pub fn coverage(&self, k: usize) -> Option<f64> {
        self.hot.iter().find(|h| h.k == k).map(|h| h.coverage)
    }
}

/// A [`RoutingSource`] over steps held in memory (the first `streams` of each).
#[derive(Debug, Clone)]
pub struct ReplaySource<'a> {
    geometry: MoeGeometry,
    steps: &'a [StepRouting],
    next: usize,
}

impl<'a> ReplaySource<'a> {
    /// Replay `steps` (each holding at least as many streams as will be asked for).
    pub fn new(geometry: MoeGeometry, steps: &'a [StepRouting]) -> Self {
        ReplaySource {
            geometry,
            steps,
            next: 0,
        }
    }
}

impl RoutingSource for ReplaySource<'_> {
    fn geometry(&self) -> &MoeGeometry {
        &self.geometry
    }

    fn next_step(&mut self, streams: usize) -> Result<StepRouting> {
        let Some(step) = self.steps.get(self.next) else {
            return Err(ModelError::invalid(
                "routing replay",
                format!("only {} steps were recorded", self.steps.len()),
            ));
        };
        if step.streams() < streams {
            return Err(ModelError::invalid(
                "routing replay",
                format!(
                    "step {} holds {} streams; {streams} were requested",
                    step.step,
                    step.streams()
                ),
            ));
        }
        self.next += 1;
        Ok(step.truncated(streams))
    }
}

/// Record the steps [`routing_stats`] needs from a source.
pub fn record(source: &mut dyn RoutingSource, config: &StatsConfig) -> Result<Vec<StepRouting>> {
    let g = *source.geometry();
    config.validate(&g)?;
    let streams = config.recorded_streams();
    (0..config.warmup_steps + config.steps)
        .map(|_| source.next_step(streams))
        .collect()
}

/// Every statistic of a source ([`record`], then [`stats_of_steps`]).
pub fn routing_stats(source: &mut dyn RoutingSource, config: &StatsConfig) -> Result<RoutingStats> {
    let g = *source.geometry();
    let steps = record(source, config)?;
    stats_of_steps(&g, &steps, config)
}

/// Every statistic of recorded steps: the first `config.warmup_steps` warm the caches, the
/// next `config.steps` are measured.
pub fn stats_of_steps(
    g: &MoeGeometry,
    steps: &[StepRouting],
    config: &StatsConfig,
) -> Result<RoutingStats> {
    config.validate(g)?;
    let need = config.warmup_steps + config.steps;
    if steps.len() < need {
        return Err(ModelError::invalid(
            "routing",
            format!(
                "{} steps recorded; the statistics need {need} (warm-up + measured)",
                steps.len()
            ),
        ));
    }
    let measured = &steps[config.warmup_steps..need];
    let mut hit_rates = Vec::new();
    for (topology, sizes) in [
        (CacheTopology::PerLayer, &config.per_layer_slots),
        (CacheTopology::Global, &config.global_slots),
    ] {
        for &n in sizes {
            for policy in &config.policies {
                hit_rates.push(HitRatePoint {
                    policy: policy.name().to_string(),
                    topology,
                    slots_per_layer: n,
                    residency: n as f64 / g.experts as f64,
                    hit_rate: hit_rate(g, steps, config, policy, topology, n)?,
                });
            }
        }
    }
    let hot = config
        .hot_k
        .iter()
        .map(|&k| HotPoint {
            k,
            coverage: hot_coverage(g, measured, config.streams, k),
            uniform: k as f64 / g.experts as f64,
        })
        .collect();
    let (reuse, reuse_all) = if config.detail {
        reuse_distances(g, measured, config.streams)
    } else {
        (Vec::new(), Vec::new())
    };
    let layer_correlation =
        (config.detail && g.moe_layers > 1).then(|| layer_prediction(g, measured, config.streams));
    Ok(RoutingStats {
        geometry: *g,
        config: config.clone(),
        hit_rates,
        hot,
        reuse,
        reuse_all,
        union: union_curve(g, measured, config.recorded_streams()),
        layer_correlation,
    })
}

/// The expert-level hit rate of offload on a cache of `slots_per_layer` slots per layer
/// (in all, `x moe_layers`) over the measured steps, after the warm-up steps.
pub fn hit_rate(
    g: &MoeGeometry,
    steps: &[StepRouting],
    config: &StatsConfig,
    policy: &CachePolicy,
    topology: CacheTopology,
    slots_per_layer: usize,
) -> Result<f64> {
    let slots = slots_per_layer * g.moe_layers;
    let warm = &steps[..config.warmup_steps];
    let popularity = matches!(policy, CachePolicy::StaticHot { hot } if hot.is_empty())
        .then(|| counts(g, warm, config.streams));
    if popularity.is_some() && config.warmup_steps == 0 {
        return Err(ModelError::invalid(
            "stats.warmup_steps",
            "a static-hot cache learns its hot set on the warm-up steps; give some",
        ));
    }
    let mut cache = build_cache_with(
        StrategyKind::Offload,
        policy,
        topology,
        g,
        slots,
        popularity.as_deref(),
    )?;
    let mut source = ReplaySource::new(*g, steps);
    let t = run_traffic(
        &mut source,
        &mut cache,
        1.0,
        &TrafficConfig {
            warmup_steps: config.warmup_steps,
            steps: config.steps,
            streams: config.streams,
        },
    )?;
    Ok(1.0 - t.total.miss_rate)
}

/// Routings of every expert (indexed by [`crate::ExpertId::flat`]) over `steps`, first
/// `streams` streams.
fn counts(g: &MoeGeometry, steps: &[StepRouting], streams: usize) -> Vec<f64> {
    let mut c = vec![0.0; g.experts * g.moe_layers];
    for s in steps {
        for (l, routes) in s.layers.iter().enumerate() {
            for r in routes.iter().take(streams) {
                for &e in &r.experts {
                    c[l * g.experts + e as usize] += 1.0;
                }
            }
        }
    }
    c
}

/// The `k` most frequent of each layer (ties to the lower id), as a membership table.
fn top_per_layer(g: &MoeGeometry, counts: &[f64], k: usize) -> Vec<bool> {
    let mut member = vec![false; counts.len()];
    for (l, layer) in counts.chunks_exact(g.experts).enumerate() {
        let mut idx: Vec<usize> = (0..g.experts).collect();
        idx.sort_by(|&a, &b| layer[b].total_cmp(&layer[a]).then(a.cmp(&b)));
        for &e in idx.iter().take(k) {
            member[l * g.experts + e] = true;
        }
    }
    member
}

/// Coverage of the second half's routings by each layer's `k` most routed experts of the
/// first half.
pub fn hot_coverage(g: &MoeGeometry, measured: &[StepRouting], streams: usize, k: usize) -> f64 {
    let half = measured.len() / 2;
    let learned = counts(g, &measured[..half], streams);
    let hot = top_per_layer(g, &learned, k);
    let (mut hit, mut all) = (0u64, 0u64);
    for s in &measured[half..] {
        for (l, routes) in s.layers.iter().enumerate() {
            for r in routes.iter().take(streams) {
                for &e in &r.experts {
                    all += 1;
                    hit += hot[l * g.experts + e as usize] as u64;
                }
            }
        }
    }
    if all == 0 {
        0.0
    } else {
        hit as f64 / all as f64
    }
}

/// Reuse distances per layer and over all layers (see [`LayerReuse::shares`]).
fn reuse_distances(
    g: &MoeGeometry,
    measured: &[StepRouting],
    streams: usize,
) -> (Vec<LayerReuse>, Vec<f64>) {
    let buckets = REUSE_EDGES.len() + 2;
    // Token index (from 1) of each (stream, layer, expert)'s last routing; 0 = never.
    let mut last = vec![0u64; streams * g.moe_layers * g.experts];
    let mut hist = vec![vec![0u64; buckets]; g.moe_layers];
    let mut dists: Vec<Vec<u64>> = vec![Vec::new(); g.moe_layers];
    for (t, s) in measured.iter().enumerate() {
        let now = t as u64 + 1;
        for (l, routes) in s.layers.iter().enumerate() {
            for (st, r) in routes.iter().take(streams).enumerate() {
                for &e in &r.experts {
                    let at = &mut last[(st * g.moe_layers + l) * g.experts + e as usize];
                    let b = if *at == 0 {
                        buckets - 1
                    } else {
                        let d = now - *at;
                        dists[l].push(d);
                        REUSE_EDGES.partition_point(|&edge| edge < d)
                    };
                    hist[l][b] += 1;
                    *at = now;
                }
            }
        }
    }
    let shares = |h: &[u64]| {
        let n: u64 = h.iter().sum();
        h.iter()
            .map(|&c| if n == 0 { 0.0 } else { c as f64 / n as f64 })
            .collect::<Vec<f64>>()
    };
    let median = |d: &mut Vec<u64>| {
        if d.is_empty() {
            0.0
        } else {
            d.sort_unstable();
            d[(d.len() - 1) / 2] as f64
        }
    };
    let mut total = vec![0u64; buckets];
    let per_layer = hist
        .iter()
        .zip(dists.iter_mut())
        .enumerate()
        .map(|(layer, (h, d))| {
            for (t, c) in total.iter_mut().zip(h) {
                *t += c;
            }
            LayerReuse {
                layer,
                shares: shares(h),
                median_tokens: median(d),
            }
        })
        .collect();
    (per_layer, shares(&total))
}

/// Mean distinct experts per layer-step for 1, 2, 4, ... streams up to `max_streams` (and
/// `max_streams` itself).
fn union_curve(g: &MoeGeometry, measured: &[StepRouting], max_streams: usize) -> Vec<UnionPoint> {
    let mut counts: Vec<usize> = std::iter::successors(Some(1usize), |&b| b.checked_mul(2))
        .take_while(|&b| b < max_streams)
        .collect();
    counts.push(max_streams);
    let mut seen = vec![0u64; g.experts];
    let mut stamp = 0u64;
    counts
        .into_iter()
        .map(|b| {
            let mut unique = 0u64;
            let mut layer_steps = 0u64;
            for s in measured {
                for routes in &s.layers {
                    stamp += 1;
                    layer_steps += 1;
                    for r in routes.iter().take(b) {
                        for &e in &r.experts {
                            if seen[e as usize] != stamp {
                                seen[e as usize] = stamp;
                                unique += 1;
                            }
                        }
                    }
                }
            }
            let mean = unique as f64 / layer_steps.max(1) as f64;
            UnionPoint {
                streams: b,
                unique: mean,
                share_of_routings: mean / (b * g.top_k) as f64,
            }
        })
        .collect()
}

/// Layer-to-layer prediction: successors learned on the first half, scored on the second.
fn layer_prediction(g: &MoeGeometry, measured: &[StepRouting], streams: usize) -> LayerCorrelation {
    let half = measured.len() / 2;
    let (k, e) = (g.top_k, g.experts);
    let (mut predicted, mut baseline, mut pairs) = (0.0, 0.0, 0usize);
    let mut votes = vec![0u32; e];
    for l in 0..g.moe_layers - 1 {
        // successors[x] = counts of layer-(l+1) experts after expert x at layer l.
        let mut successors: Vec<HashMap<u32, u32>> = vec![HashMap::new(); e];
        let mut popular = vec![0.0f64; e];
        for s in &measured[..half] {
            for (a, b) in s.layers[l].iter().zip(&s.layers[l + 1]).take(streams) {
                for &x in &a.experts {
                    for &y in &b.experts {
                        *successors[x as usize].entry(y).or_insert(0) += 1;
                    }
                }
                for &y in &b.experts {
                    popular[y as usize] += 1.0;
                }
            }
        }
        let mut idx: Vec<usize> = (0..e).collect();
        idx.sort_by(|&a, &b| popular[b].total_cmp(&popular[a]).then(a.cmp(&b)));
        let mut top = vec![false; e];
        for &x in idx.iter().take(k) {
            top[x] = true;
        }
        let (mut hit, mut base, mut all) = (0u64, 0u64, 0u64);
        for s in &measured[half..] {
            for (a, b) in s.layers[l].iter().zip(&s.layers[l + 1]).take(streams) {
                votes.iter_mut().for_each(|v| *v = 0);
                for &x in &a.experts {
                    for (&y, &c) in &successors[x as usize] {
                        votes[y as usize] += c;
                    }
                }
                let mut order: Vec<usize> = (0..e).filter(|&y| votes[y] > 0).collect();
                order.sort_by(|&p, &q| votes[q].cmp(&votes[p]).then(p.cmp(&q)));
                order.truncate(k);
                for &y in &b.experts {
                    all += 1;
                    hit += order.contains(&(y as usize)) as u64;
                    base += top[y as usize] as u64;
                }
            }
        }
        if all > 0 {
            predicted += hit as f64 / all as f64;
            baseline += base as f64 / all as f64;
            pairs += 1;
        }
    }
    let n = pairs.max(1) as f64;
    LayerCorrelation {
        predicted: predicted / n,
        baseline: baseline / n,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cache::ExpertCache;
    use crate::geometry::ExpertId;
    use crate::routing::{RoutingProcess, SyntheticRouting, TokenRoute};
    use std::collections::VecDeque;

    fn geo(experts: usize, top_k: usize, layers: usize) -> MoeGeometry {
        MoeGeometry::routing_test(experts, top_k, layers)
    }

    fn steps_of(p: &RoutingProcess, g: MoeGeometry, n: usize, streams: usize) -> Vec<StepRouting> {
        let mut src = SyntheticRouting::new(p, g).unwrap();
        (0..n).map(|_| src.next_step(streams).unwrap()).collect()
    }

    /// Slow reference of a per-layer LRU of one stream: a queue per layer, most recent in
    /// front. As the plan does: the token's experts are looked up in ascending id order (a hit
    /// moves to the front), then the misses are pushed in front, the most recently requested
    /// before this step first (never requested last, then ascending id), the oldest dropped.
    fn naive_per_layer_lru(g: &MoeGeometry, steps: &[StepRouting], warm: usize, n: usize) -> f64 {
        let mut q: Vec<VecDeque<u32>> = vec![VecDeque::new(); g.moe_layers];
        let mut last: HashMap<(usize, u32), u64> = HashMap::new();
        let mut clock = 0u64;
        let (mut hits, mut lookups) = (0u64, 0u64);
        for (t, s) in steps.iter().enumerate() {
            let count = t >= warm;
            for (l, routes) in s.layers.iter().enumerate() {
                let mut ids = routes[0].experts.clone();
                ids.sort_unstable();
                let mut misses = Vec::new();
                for e in ids {
                    clock += 1;
                    let prev = last.insert((l, e), clock);
                    lookups += count as u64;
                    if let Some(i) = q[l].iter().position(|&x| x == e) {
                        hits += count as u64;
                        q[l].remove(i);
                        q[l].push_front(e);
                    } else {
                        misses.push((prev, e));
                    }
                }
                misses.sort_by(|a, b| b.0.cmp(&a.0).then(a.1.cmp(&b.1)));
                for (_, e) in misses {
                    if q[l].len() == n {
                        q[l].pop_back();
                    }
                    q[l].push_front(e);
                }
            }
        }
        hits as f64 / lookups as f64
    }

    #[test]
    fn per_layer_lru_hit_rate_matches_a_naive_queue() {
        let g = geo(32, 4, 3);
        let p = RoutingProcess::preset("typical").unwrap();
        let steps = steps_of(&p, g, 300, 1);
        let cfg = StatsConfig {
            warmup_steps: 100,
            steps: 200,
            ..StatsConfig::default()
        };
        for n in [4, 6, 12, 32] {
            let fast = hit_rate(
                &g,
                &steps,
                &cfg,
                &CachePolicy::Lru,
                CacheTopology::PerLayer,
                n,
            )
            .unwrap();
            let slow = naive_per_layer_lru(&g, &steps, 100, n);
            assert!((fast - slow).abs() < 1e-12, "{n} slots: {fast} vs {slow}");
        }
        // All experts resident per layer: everything hits after the warm-up but first uses.
        let all = hit_rate(
            &g,
            &steps,
            &cfg,
            &CachePolicy::Lru,
            CacheTopology::PerLayer,
            32,
        )
        .unwrap();
        assert!(all > 0.99, "{all}");
    }

    #[test]
    fn hand_made_steps_give_known_statistics() {
        // One layer, 8 experts, top-2; stream 0 alternates {0,1} and {2,3}, stream 1 always
        // {0,1}.
        let g = geo(8, 2, 2);
        let route = |a: u32, b: u32| TokenRoute {
            experts: vec![a, b],
            weights: vec![0.5, 0.5],
        };
        let steps: Vec<StepRouting> = (0..8)
            .map(|t| {
                let s0 = if t % 2 == 0 { route(0, 1) } else { route(2, 3) };
                StepRouting {
                    step: t,
                    layers: vec![vec![s0.clone(), route(0, 1)], vec![s0, route(4, 5)]],
                }
            })
            .collect();
        let cfg = StatsConfig {
            warmup_steps: 0,
            steps: 8,
            streams: 1,
            union_streams: 2,
            per_layer_slots: vec![2, 4],
            global_slots: vec![2],
            policies: vec![CachePolicy::Lru],
            hot_k: vec![2],
            detail: true,
        };
        let st = stats_of_steps(&g, &steps, &cfg).unwrap();
        // Per-layer LRU of 2 slots: every token evicts the other pair: 0 hits. Of 4: all but
        // the first two tokens hit.
        assert_eq!(st.hit_rate("lru", CacheTopology::PerLayer, 2), Some(0.0));
        assert_eq!(
            st.hit_rate("lru", CacheTopology::PerLayer, 4),
            Some(6.0 / 8.0)
        );
        // Hot list of 2 learned on the first 4 tokens (ties to the lower ids: {0, 1}) covers
        // half of the last 4.
        assert_eq!(st.coverage(2), Some(0.5));
        assert_eq!(st.hot[0].uniform, 0.25);
        // Reuse: first uses (4 per layer: 2 experts x 2 pairs), then all at distance 2.
        let r = &st.reuse[0];
        assert_eq!(r.median_tokens, 2.0);
        assert!(
            (r.shares[1] - 4.0 / 16.0 * 3.0).abs() < 1e-12,
            "{:?}",
            r.shares
        );
        assert!((r.shares[REUSE_EDGES.len() + 1] - 0.25).abs() < 1e-12);
        // Union: 1 stream 2 experts; 2 streams: layer 0 shares {0,1} half the time (3 on
        // average), layer 1 never (4).
        assert_eq!(st.union[0].unique, 2.0);
        assert_eq!(st.union[1].unique, 3.5);
        // Layer 1 repeats layer 0's experts: successors predict all of it.
        let c = st.layer_correlation.unwrap();
        assert_eq!(c.predicted, 1.0);
        assert_eq!(c.baseline, 0.5);
    }

    #[test]
    fn global_topology_and_static_hot_use_the_cache() {
        let g = geo(16, 2, 4);
        let p = RoutingProcess::preset("skewed").unwrap();
        let steps = steps_of(&p, g, 300, 1);
        let cfg = StatsConfig {
            warmup_steps: 100,
            steps: 200,
            ..StatsConfig::default()
        };
        // A global pool of 4 slots per layer, checked against ExpertCache driven by hand.
        let got = hit_rate(
            &g,
            &steps,
            &cfg,
            &CachePolicy::Lru,
            CacheTopology::Global,
            4,
        )
        .unwrap();
        let mut c = ExpertCache::new(&CachePolicy::Lru, &g, 16).unwrap();
        let (mut hits, mut lookups) = (0u64, 0u64);
        for (t, s) in steps.iter().enumerate() {
            for (l, routes) in s.layers.iter().enumerate() {
                let mut ids = routes[0].experts.clone();
                ids.sort_unstable();
                // As the plan: every lookup first, then the misses admitted, the most
                // recently requested before this step first.
                let mut misses = Vec::new();
                for &e in &ids {
                    let id = ExpertId::new(l, e as usize);
                    let prev = c.last_request(id);
                    let hit = c.lookup(id).is_some();
                    if !hit {
                        misses.push((prev, e));
                    }
                    if t >= 100 {
                        lookups += 1;
                        hits += hit as u64;
                    }
                }
                misses.sort_by(|a, b| b.0.cmp(&a.0).then(a.1.cmp(&b.1)));
                let pinned = |x: ExpertId| x.layer as usize == l && ids.contains(&x.expert);
                for (_, e) in misses {
                    c.admit(ExpertId::new(l, e as usize), pinned).unwrap();
                }
            }
        }
        assert!((got - hits as f64 / lookups as f64).abs() < 1e-12);
        // A static hot set learned on the warm-up hits more than nothing under strong skew.
        let hot = CachePolicy::StaticHot { hot: Vec::new() };
        let h = hit_rate(&g, &steps, &cfg, &hot, CacheTopology::PerLayer, 4).unwrap();
        assert!(h > 0.3, "{h}");
        let none = StatsConfig {
            warmup_steps: 0,
            ..cfg.clone()
        };
        let e = hit_rate(&g, &steps, &none, &hot, CacheTopology::PerLayer, 4).unwrap_err();
        assert!(e.to_string().contains("warmup"), "{e}");
    }

    #[test]
    fn bad_configurations_name_the_field() {
        let g = geo(512, 2, 4);
        let cases = [
            (
                StatsConfig {
                    steps: 1,
                    ..StatsConfig::default()
                },
                "stats.steps",
            ),
            (
                StatsConfig {
                    per_layer_slots: vec![513],
                    ..StatsConfig::default()
                },
                "stats.per_layer_slots",
            ),
            (
                StatsConfig {
                    hot_k: vec![0],
                    ..StatsConfig::default()
                },
                "stats.hot_k",
            ),
            (
                StatsConfig {
                    steps: usize::MAX / 2,
                    ..StatsConfig::default()
                },
                "limit",
            ),
        ];
        for (cfg, want) in cases {
            let e = cfg.validate(&g).unwrap_err().to_string();
            assert!(e.contains(want), "{want}: {e}");
        }
        let g = geo(16, 2, 4);
        let short = steps_of(&RoutingProcess::default(), g, 3, 1);
        let cfg = StatsConfig {
            per_layer_slots: vec![4],
            global_slots: vec![],
            hot_k: vec![4],
            ..StatsConfig::default()
        };
        assert!(stats_of_steps(&g, &short, &cfg).is_err());
    }

    #[test]
    fn reuse_bucket_labels_name_every_share() {
        let l = reuse_bucket_labels();
        assert_eq!(l.len(), REUSE_EDGES.len() + 2);
        assert_eq!(&l[..4], ["1", "2", "3-4", "5-8"]);
        assert_eq!(&l[l.len() - 2..], [">256", "never"]);
    }
}
