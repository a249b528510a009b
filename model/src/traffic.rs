//! Counting simulation: routing + cache + plan, with no time.
//!
//! The analytic model needs miss rates per strategy, and they depend on the strategy itself
//! (in hybrid only fetched misses enter the cache). [`run_traffic`] drives a [`RoutingSource`]
//! through [`crate::plan::plan_layer`] and an [`ExpertCache`] for some warm-up steps and some measured steps
//! and reports per-layer and total means per layer-step (hits, misses, fetched, uncached, CPU
//! experts, unique experts), tokens per expert, miss rates and the step-to-step variation.
//! It is the same semantics the runtime and the simulator execute, only counted.

use serde::{Deserialize, Serialize};

use crate::cache::{CacheOptions, CachePolicy, CacheStats, ExpertCache};
use crate::error::{ModelError, Result};
use crate::geometry::MoeGeometry;
use crate::placement::GpuLayout;
use crate::plan::{plan_layer_placed, LayerPlan};
use crate::routing::{RoutingSource, StepRouting, TokenRoute};
use crate::strategy::{PlacementPolicy, Strategy};

/// How long to run and with how many streams.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct TrafficConfig {
    /// Steps run before counting starts (they fill the cache).
    pub warmup_steps: usize,
    /// Steps counted.
    pub steps: usize,
    /// Concurrent streams (tokens per step).
    pub streams: usize,
}

impl Default for TrafficConfig {
    /// 100 warm-up and 300 measured steps of one stream.
    fn default() -> Self {
        TrafficConfig {
            warmup_steps: 100,
            steps: 300,
            streams: 1,
        }
    }
}

/// Mean, standard deviation (population), minimum and maximum of a series.
#[derive(Debug, Clone, Copy, PartialEq, Default, Serialize, Deserialize)]
pub struct Summary {
    /// Mean.
    pub mean: f64,
    /// Population standard deviation.
    pub std: f64,
    /// Smallest value.
    pub min: f64,
    /// Largest value.
    pub max: f64,
    /// Number of values.
    pub n: u64,
}

impl Summary {
    /// Summarise values (all zero for an empty series).
    pub fn of(values: &[f64]) -> Summary {
        if values.is_empty() {
            return Summary::default();
        }
        let n = values.len() as f64;
        let mean = values.iter().sum::<f64>() / n;
        let var = values.iter().map(|v| (v - mean) * (v - mean)).sum::<f64>() / n;
        Summary {
            mean,
            std: var.sqrt(),
            min: values.iter().copied().fold(f64::INFINITY, f64::min),
            max: values.iter().copied().fold(f64::NEG_INFINITY, f64::max),
            n: values.len() as u64,
        }
    }
}

/// Means per layer-step (experts unless noted) over the measured steps.
#[derive(Debug, Clone, Copy, PartialEq, Default, Serialize, Deserialize)]
pub struct TrafficCounts {
    /// Resident experts used.
    pub hits: f64,
    /// Experts not resident (fetched + uncached + cpu).
    pub misses: f64,
    /// Misses gathered into cache slots.
    pub fetched: f64,
    /// Misses gathered into staging (the cache refused them).
    pub uncached: f64,
    /// Misses computed on the CPU.
    pub cpu: f64,
    /// Distinct experts (hits + misses).
    pub unique: f64,
    /// (token, expert) routings (streams x top_k).
    pub routings: f64,
    /// Misses over distinct experts (expert-level miss rate; 0 when nothing was routed).
    pub miss_rate: f64,
    /// Routings served by a non-resident expert over all routings (token-level miss rate).
    pub token_miss_rate: f64,
    /// Mean tokens per expert crossing the link (0 when none did).
    pub tokens_per_link_expert: f64,
    /// Mean tokens per CPU-computed expert (0 when none was).
    pub tokens_per_cpu_expert: f64,
}

/// Running sums behind [`TrafficCounts`].
#[derive(Debug, Clone, Copy, Default)]
struct Sums {
    n: u64,
    hits: u64,
    fetched: u64,
    uncached: u64,
    cpu: u64,
    routings: u64,
    miss_routings: u64,
    link_tokens: u64,
    cpu_tokens: u64,
}

impl Sums {
    fn add(&mut self, p: &LayerPlan) {
        let (th, tl, tc) = p.token_counts();
        self.n += 1;
        self.hits += p.hits.len() as u64;
        self.fetched += p.fetched.len() as u64;
        self.uncached += p.uncached.len() as u64;
        self.cpu += p.cpu.len() as u64;
        self.routings += (th + tl + tc) as u64;
        self.miss_routings += (tl + tc) as u64;
        self.link_tokens += tl as u64;
        self.cpu_tokens += tc as u64;
    }

    fn merge(&mut self, o: &Sums) {
        self.n += o.n;
        self.hits += o.hits;
        self.fetched += o.fetched;
        self.uncached += o.uncached;
        self.cpu += o.cpu;
        self.routings += o.routings;
        self.miss_routings += o.miss_routings;
        self.link_tokens += o.link_tokens;
        self.cpu_tokens += o.cpu_tokens;
    }

    fn counts(&self) -> TrafficCounts {
        let ratio = |a: u64, b: u64| if b == 0 { 0.0 } else { a as f64 / b as f64 };
        let n = self.n.max(1) as f64;
        let misses = self.fetched + self.uncached + self.cpu;
        let link = self.fetched + self.uncached;
        TrafficCounts {
            hits: self.hits as f64 / n,
            misses: misses as f64 / n,
            fetched: self.fetched as f64 / n,
            uncached: self.uncached as f64 / n,
            cpu: self.cpu as f64 / n,
            unique: (self.hits + misses) as f64 / n,
            routings: self.routings as f64 / n,
            miss_rate: ratio(misses, self.hits + misses),
            token_miss_rate: ratio(self.miss_routings, self.routings),
            tokens_per_link_expert: ratio(self.link_tokens, link),
            tokens_per_cpu_expert: ratio(self.cpu_tokens, self.cpu),
        }
    }
}

/// Result of a counting simulation.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TrafficStats {
    /// The run's configuration.
    pub config: TrafficConfig,
    /// Fetch fraction used (1 offload/resident, 0 cpu).
    pub fetch_fraction: f64,
    /// Slots of the cache.
    pub cache_slots: usize,
    /// Means per layer-step, per layer.
    pub per_layer: Vec<TrafficCounts>,
    /// Means per layer-step over all layers.
    pub total: TrafficCounts,
    /// `tokens_per_expert[t]`: distinct (layer-step, expert) pairs served to `t` tokens
    /// (index 0 unused), over the measured steps.
    pub tokens_per_expert: Vec<u64>,
    /// Misses per step (summed over layers).
    pub step_misses: Summary,
    /// Experts crossing the link per step (fetched + uncached, summed over layers).
    pub step_link: Summary,
    /// CPU-computed experts per step (summed over layers).
    pub step_cpu: Summary,
    /// Misses per layer-step (the spread a per-layer critical path sees).
    pub layer_step_misses: Summary,
    /// Cache counters over the measured steps.
    pub cache: CacheStats,
}

/// Run `config.warmup_steps` then `config.steps` decode steps of `source` through
/// [`crate::plan::plan_layer`] with `cache` at `fetch_fraction`, counting the measured ones.
/// The cache keeps its state (its stats are reset when counting starts).
pub fn run_traffic(
    source: &mut dyn RoutingSource,
    cache: &mut ExpertCache,
    fetch_fraction: f64,
    config: &TrafficConfig,
) -> Result<TrafficStats> {
    run_traffic_placed(
        source,
        cache,
        &PlacementPolicy::cached(fetch_fraction),
        config,
    )
}

/// [`run_traffic`] with every layer placed by `policy` ([`plan_layer_placed`]).
pub fn run_traffic_placed(
    source: &mut dyn RoutingSource,
    cache: &mut ExpertCache,
    policy: &PlacementPolicy,
    config: &TrafficConfig,
) -> Result<TrafficStats> {
    let geometry = *source.geometry();
    if cache.layers() != geometry.moe_layers || cache.experts_per_layer() != geometry.experts {
        return Err(ModelError::invalid(
            "cache",
            format!(
                "built for {} layers x {} experts; the routing has {} x {}",
                cache.layers(),
                cache.experts_per_layer(),
                geometry.moe_layers,
                geometry.experts
            ),
        ));
    }
    if config.streams == 0 {
        return Err(ModelError::invalid("streams", "must be at least 1"));
    }
    let mut step = StepRouting::default();
    warm_up(source, cache, policy, config.warmup_steps, config.streams)?;
    cache.reset_stats();
    let layers = geometry.moe_layers;
    let mut per_layer = vec![Sums::default(); layers];
    let mut hist = vec![0u64; config.streams + 1];
    let mut step_misses = Vec::with_capacity(config.steps);
    let mut step_link = Vec::with_capacity(config.steps);
    let mut step_cpu = Vec::with_capacity(config.steps);
    let mut layer_step_misses = Vec::with_capacity(config.steps * layers);
    for _ in 0..config.steps {
        source.next_step_into(config.streams, &mut step)?;
        let (mut misses, mut link, mut cpu) = (0usize, 0usize, 0usize);
        for (l, routes) in step.layers.iter().enumerate() {
            let p = plan_layer_placed(l, routes, cache, policy.layer(l));
            per_layer[l].add(&p);
            let tokens = p
                .hits
                .iter()
                .chain(&p.uncached)
                .chain(&p.cpu)
                .map(|w| w.tokens.len())
                .chain(p.fetched.iter().map(|w| w.tokens.len()));
            for t in tokens {
                if t >= hist.len() {
                    hist.resize(t + 1, 0);
                }
                hist[t] += 1;
            }
            misses += p.misses();
            link += p.link_experts();
            cpu += p.cpu.len();
            layer_step_misses.push(p.misses() as f64);
        }
        step_misses.push(misses as f64);
        step_link.push(link as f64);
        step_cpu.push(cpu as f64);
    }
    let mut all = Sums::default();
    for s in &per_layer {
        all.merge(s);
    }
    Ok(TrafficStats {
        config: *config,
        fetch_fraction: policy.fetch_fraction(),
        cache_slots: cache.capacity(),
        per_layer: per_layer.iter().map(Sums::counts).collect(),
        total: all.counts(),
        tokens_per_expert: hist,
        step_misses: Summary::of(&step_misses),
        step_link: Summary::of(&step_link),
        step_cpu: Summary::of(&step_cpu),
        layer_step_misses: Summary::of(&layer_step_misses),
        cache: cache.stats(),
    })
}

/// Request counts of every expert (indexed by [`crate::ExpertId::flat`]) over `steps` steps of
/// `streams` streams: the popularity a static hot set is chosen from after a warm-up.
pub fn measure_popularity(
    source: &mut dyn RoutingSource,
    steps: usize,
    streams: usize,
) -> Result<Vec<f64>> {
    let g = *source.geometry();
    let mut counts = vec![0.0; g.experts * g.moe_layers];
    let mut step = StepRouting::default();
    for _ in 0..steps {
        source.next_step_into(streams, &mut step)?;
        for (l, routes) in step.layers.iter().enumerate() {
            for r in routes {
                for &e in &r.experts {
                    counts[l * g.experts + e as usize] += 1.0;
                }
            }
        }
    }
    Ok(counts)
}

/// The counting simulation of a strategy from a cold start: builds the strategy's cache
/// ([`CacheOptions::build`]; a static-hot policy without a hot set takes the most requested experts
/// of the warm-up steps, which then count as its warm-up), then runs [`run_traffic`].
pub fn strategy_traffic(
    source: &mut dyn RoutingSource,
    strategy: &Strategy,
    cache: impl Into<CacheOptions>,
    slots: usize,
    config: &TrafficConfig,
) -> Result<TrafficStats> {
    let placement = strategy.policy(source.geometry().moe_layers)?;
    let (mut cache, warmup_steps) = strategy_cache(
        source,
        strategy.kind(),
        cache,
        slots,
        config.warmup_steps,
        config.streams,
    )?;
    let cfg = TrafficConfig {
        warmup_steps,
        ..*config
    };
    let mut stats = run_traffic_placed(source, &mut cache, &placement, &cfg)?;
    stats.config = *config;
    Ok(stats)
}

/// The cache a strategy starts from, and how many of `warmup_steps` are left to run.
///
/// A static hot set given without experts is chosen from the popularity measured over the
/// warm-up steps, which are then spent (0 left); every other cache is built as
/// [`CacheOptions::build`] builds it and keeps its whole warm-up.
pub fn strategy_cache(
    source: &mut dyn RoutingSource,
    kind: crate::strategy::StrategyKind,
    cache: impl Into<CacheOptions>,
    slots: usize,
    warmup_steps: usize,
    streams: usize,
) -> Result<(ExpertCache, usize)> {
    let options: CacheOptions = cache.into();
    let geometry: MoeGeometry = *source.geometry();
    if needs_popularity(&options, kind) {
        let pop = measure_popularity(source, warmup_steps, streams)?;
        Ok((options.build(kind, &geometry, slots, Some(&pop))?, 0))
    } else {
        Ok((options.build(kind, &geometry, slots, None)?, warmup_steps))
    }
}

/// Whether a strategy's cache needs a routing popularity to start from (a static hot set
/// given without experts, for any strategy but resident).
fn needs_popularity(options: &CacheOptions, kind: crate::strategy::StrategyKind) -> bool {
    matches!(&options.policy, CachePolicy::StaticHot { hot } if hot.is_empty())
        && kind != crate::strategy::StrategyKind::Resident
}

/// The caches several GPUs start from ([`crate::GpuLayout::plans`] of them, one per plan),
/// and how many of `warmup_steps` are left to run: [`strategy_cache`] for each, each of
/// `slots` slots (slots are per GPU). A static hot set chosen from the warm-up's popularity
/// holds, on each GPU, only the experts it holds ([`crate::GpuLayout::popularity_on`]). One
/// GPU gets exactly [`strategy_cache`]'s cache.
pub fn strategy_caches(
    source: &mut dyn RoutingSource,
    kind: crate::strategy::StrategyKind,
    cache: impl Into<CacheOptions>,
    slots: usize,
    warmup_steps: usize,
    streams: usize,
    layout: &GpuLayout,
) -> Result<(Vec<ExpertCache>, usize)> {
    let options: CacheOptions = cache.into();
    if layout.plans() == 1 {
        let (cache, left) = strategy_cache(source, kind, options, slots, warmup_steps, streams)?;
        return Ok((vec![cache], left));
    }
    let geometry: MoeGeometry = *source.geometry();
    if needs_popularity(&options, kind) {
        let pop = measure_popularity(source, warmup_steps, streams)?;
        let caches = (0..layout.gpus)
            .map(|g| {
                let mine = layout.popularity_on(g, &pop, geometry.experts);
                options.build(kind, &geometry, slots, Some(&mine))
            })
            .collect::<Result<Vec<_>>>()?;
        Ok((caches, 0))
    } else {
        let caches = (0..layout.plans())
            .map(|_| options.build(kind, &geometry, slots, None))
            .collect::<Result<Vec<_>>>()?;
        Ok((caches, warmup_steps))
    }
}

/// Plan one layer on several GPUs: one [`plan_layer_placed`] per plan (the layer placed as
/// `policy` says), each on its own cache (`caches[p]`) with the routes of
/// [`GpuLayout::routes_on`] (sharded: GPU `p`'s experts only; tensor parallel: one plan of
/// every expert, whose slices every GPU holds). The simulator calls this, so its per-GPU
/// miss rates are the model's.
pub fn plan_layer_gpus(
    layer: usize,
    routes: &[TokenRoute],
    caches: &mut [ExpertCache],
    layout: &GpuLayout,
    policy: &PlacementPolicy,
) -> Vec<LayerPlan> {
    let placement = policy.layer(layer);
    if layout.plans() == 1 {
        return vec![plan_layer_placed(layer, routes, &mut caches[0], placement)];
    }
    caches
        .iter_mut()
        .enumerate()
        .map(|(g, cache)| {
            let mine = layout.routes_on(g as u32, routes);
            plan_layer_placed(layer, &mine, cache, placement)
        })
        .collect()
}

/// [`warm_up`] for several GPUs' caches ([`plan_layer_gpus`]).
pub fn warm_up_gpus(
    source: &mut dyn RoutingSource,
    caches: &mut [ExpertCache],
    layout: &GpuLayout,
    policy: &PlacementPolicy,
    steps: usize,
    streams: usize,
) -> Result<()> {
    let mut step = StepRouting::default();
    for _ in 0..steps {
        source.next_step_into(streams, &mut step)?;
        for (l, routes) in step.layers.iter().enumerate() {
            plan_layer_gpus(l, routes, caches, layout, policy);
        }
    }
    Ok(())
}

/// Plan `steps` steps of `streams` streams placed by `policy` without recording them, to
/// warm `cache`.
pub fn warm_up(
    source: &mut dyn RoutingSource,
    cache: &mut ExpertCache,
    policy: &PlacementPolicy,
    steps: usize,
    streams: usize,
) -> Result<()> {
    warm_up_gpus(
        source,
        std::slice::from_mut(cache),
        &GpuLayout::single(),
        policy,
        steps,
        streams,
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cache::ExpertCache;
    use crate::plan::fetch_count;
    use crate::routing::{RoutingProcess, SyntheticRouting};
    use crate::strategy::FetchFraction;

    fn geo(experts: usize, top_k: usize, layers: usize) -> MoeGeometry {
        MoeGeometry::routing_test(experts, top_k, layers)
    }

    fn source(preset: &str, g: MoeGeometry) -> SyntheticRouting {
        SyntheticRouting::new(&RoutingProcess::preset(preset).unwrap(), g).unwrap()
    }

    fn hybrid(f: f64) -> Strategy {
        Strategy::Hybrid {
            fetch: FetchFraction::Fixed(f),
        }
    }

    #[test]
    fn large_runs_are_fast() {
        // 48 layers x 512 experts x 8 streams x 300 steps.
        let g = geo(512, 10, 48);
        let cfg = TrafficConfig {
            warmup_steps: 0,
            steps: 300,
            streams: 8,
        };
        let start = std::time::Instant::now();
        let t = strategy_traffic(
            &mut source("typical", g),
            &Strategy::Offload,
            &CachePolicy::Lru,
            512 * 48 / 4,
            &cfg,
        )
        .unwrap();
        let secs = start.elapsed().as_secs_f64();
        println!("48 x 512 x 8 streams x 300 steps: {secs:.3} s");
        assert!(t.total.unique > 10.0);
        // A guard against an accidental quadratic, not a benchmark: it takes about 0.4 s in
        // release here, and the limit leaves room for a loaded 2-core CI machine.
        let limit = if cfg!(debug_assertions) { 120.0 } else { 30.0 };
        assert!(secs < limit, "{secs} s");
    }

    #[test]
    fn counts_are_consistent() {
        let g = geo(64, 4, 6);
        for streams in [1, 5] {
            for strategy in [Strategy::Offload, hybrid(0.4), Strategy::Cpu] {
                let cfg = TrafficConfig {
                    warmup_steps: 20,
                    steps: 50,
                    streams,
                };
                let t = strategy_traffic(
                    &mut source("typical", g),
                    &strategy,
                    &CachePolicy::Lru,
                    96,
                    &cfg,
                )
                .unwrap();
                let n = (cfg.steps * g.moe_layers) as f64;
                let c = t.total;
                assert!((c.hits * n - t.cache.hits as f64).abs() < 1e-6);
                assert!((c.unique * n - t.cache.lookups as f64).abs() < 1e-6);
                assert!((c.hits + c.misses - c.unique).abs() < 1e-9);
                assert!((c.fetched + c.uncached + c.cpu - c.misses).abs() < 1e-9);
                assert!((c.routings - (streams * g.top_k) as f64).abs() < 1e-9);
                assert!((c.fetched * n - t.cache.admissions as f64).abs() < 1e-6);
                let hist: u64 = t.tokens_per_expert.iter().sum();
                assert_eq!(hist as f64, (c.unique * n).round());
                assert_eq!(t.tokens_per_expert[0], 0);
                assert!(t.tokens_per_expert.len() <= streams + 1);
                let weighted: u64 = t
                    .tokens_per_expert
                    .iter()
                    .enumerate()
                    .map(|(i, &k)| i as u64 * k)
                    .sum();
                assert_eq!(weighted as f64, (c.routings * n).round());
                if streams == 1 {
                    assert!((c.miss_rate - c.token_miss_rate).abs() < 1e-12);
                } else {
                    assert!(c.unique < (streams * g.top_k) as f64, "union is sublinear");
                }
                assert!((t.step_misses.mean - c.misses * g.moe_layers as f64).abs() < 1e-6);
                assert!((t.layer_step_misses.mean - c.misses).abs() < 1e-9);
                assert!(t.step_misses.min <= t.step_misses.mean);
                assert!(t.step_misses.mean <= t.step_misses.max);
                let mean_layer: f64 =
                    t.per_layer.iter().map(|l| l.misses).sum::<f64>() / g.moe_layers as f64;
                assert!((mean_layer - c.misses).abs() < 1e-9);
                if strategy == Strategy::Cpu {
                    assert_eq!((c.hits, c.fetched), (0.0, 0.0));
                }
            }
        }
    }

    #[test]
    fn strategies_split_misses_as_documented() {
        let g = geo(128, 8, 12);
        let cfg = TrafficConfig {
            warmup_steps: 50,
            steps: 100,
            streams: 2,
        };
        let run = |s: &Strategy| {
            strategy_traffic(&mut source("typical", g), s, &CachePolicy::Lru, 400, &cfg).unwrap()
        };
        let resident = run(&Strategy::Resident);
        assert_eq!(resident.total.misses, 0.0);
        assert_eq!(resident.cache_slots, 128 * 12);
        // hybrid(1) is offload, hybrid(0) is cpu.
        assert_eq!(
            run(&hybrid(1.0)).per_layer,
            run(&Strategy::Offload).per_layer
        );
        assert_eq!(run(&hybrid(0.0)).per_layer, run(&Strategy::Cpu).per_layer);
        // Per layer-step the link share is fetch_count(f, misses): within half an expert of f.
        let h = run(&hybrid(0.3));
        let link = h.total.fetched + h.total.uncached;
        assert!(
            (link - 0.3 * h.total.misses).abs() <= 0.5,
            "{link} vs {}",
            h.total.misses
        );
        // In hybrid only fetched misses enter the cache, so it holds a different history.
        let o = run(&Strategy::Offload);
        assert_ne!(h.total.miss_rate, o.total.miss_rate);
        assert!(fetch_count(0.3, 10) == 3);
    }

    /// Layer split places its first N layers on the CPU and keeps the others resident (no
    /// miss) or cached (offload's misses, on a cache the CPU layers leave alone).
    #[test]
    fn layer_split_places_the_first_layers_on_the_cpu() {
        use crate::strategy::CpuLayers;
        let g = geo(128, 8, 12);
        let cfg = TrafficConfig {
            warmup_steps: 20,
            steps: 40,
            streams: 2,
        };
        let run = |s: &Strategy| {
            strategy_traffic(&mut source("typical", g), s, &CachePolicy::Lru, 300, &cfg).unwrap()
        };
        let n = 5;
        let split = run(&Strategy::LayerSplit {
            cpu_layers: CpuLayers::Fixed(n),
        });
        let cached = run(&Strategy::LayerSplitCached {
            cpu_layers: CpuLayers::Fixed(n),
        });
        for (l, (a, b)) in split.per_layer.iter().zip(&cached.per_layer).enumerate() {
            if l < n {
                for c in [a, b] {
                    assert_eq!((c.hits, c.fetched), (0.0, 0.0), "layer {l}");
                    assert!((c.cpu - c.unique).abs() < 1e-12 && c.cpu > 0.0);
                }
            } else {
                assert_eq!((a.misses, a.cpu), (0.0, 0.0), "layer {l}");
                assert!(b.hits > 0.0 && b.fetched > 0.0 && b.cpu == 0.0, "layer {l}");
            }
        }
        // No CPU layer: the cached split is offload.
        let none = run(&Strategy::LayerSplitCached {
            cpu_layers: CpuLayers::Fixed(0),
        });
        assert_eq!(none.per_layer, run(&Strategy::Offload).per_layer);
        let auto = Strategy::LayerSplit {
            cpu_layers: CpuLayers::Auto,
        };
        let e = strategy_traffic(&mut source("typical", g), &auto, &CachePolicy::Lru, 4, &cfg);
        assert!(e.unwrap_err().to_string().contains("auto"));
    }

    #[test]
    fn static_hot_hits_its_popularity_mass() {
        let g = geo(64, 2, 8);
        let p = RoutingProcess::preset("skewed").unwrap();
        let src = SyntheticRouting::new(&p, g).unwrap();
        let pop = src.popularity();
        let slots = 128;
        let policy = CachePolicy::StaticHot { hot: Vec::new() };
        let mut cache =
            crate::cache::build_cache(crate::StrategyKind::Offload, &policy, &g, slots, Some(&pop))
                .unwrap();
        // Expected hits per expert request: the hot set's share of each layer's popularity.
        let hot: Vec<usize> = cache.resident().map(|(_, id)| id.flat(64)).collect();
        let expected = hot.iter().map(|&f| pop[f]).sum::<f64>() / g.moe_layers as f64;
        let cfg = TrafficConfig {
            warmup_steps: 0,
            steps: 3000,
            streams: 1,
        };
        let mut src = src;
        let t = run_traffic(&mut src, &mut cache, 1.0, &cfg).unwrap();
        let measured = 1.0 - t.total.miss_rate;
        // Duplicate rejection (top_k = 2) flattens the marginal a little.
        assert!(
            (measured - expected).abs() < 0.05,
            "{measured} vs {expected}"
        );
        assert_eq!(t.total.fetched, 0.0, "a full static cache never admits");
        assert!((t.total.uncached - t.total.misses).abs() < 1e-12);
        // Chosen from the warm-up instead: about the same.
        let w = strategy_traffic(
            &mut SyntheticRouting::new(&p, g).unwrap(),
            &Strategy::Offload,
            &policy,
            slots,
            &TrafficConfig {
                warmup_steps: 500,
                steps: 3000,
                streams: 1,
            },
        )
        .unwrap();
        assert!((1.0 - w.total.miss_rate - measured).abs() < 0.05);
    }

    #[test]
    fn runs_are_deterministic_and_errors_are_named() {
        let g = geo(32, 4, 4);
        let cfg = TrafficConfig {
            warmup_steps: 10,
            steps: 20,
            streams: 3,
        };
        let run = || {
            strategy_traffic(
                &mut source("mild", g),
                &hybrid(0.5),
                &CachePolicy::Lfu { decay_every: 0 },
                40,
                &cfg,
            )
            .unwrap()
        };
        assert_eq!(run(), run());
        let auto = Strategy::Hybrid {
            fetch: FetchFraction::Auto,
        };
        let e = strategy_traffic(&mut source("mild", g), &auto, &CachePolicy::Lru, 4, &cfg);
        assert!(e.unwrap_err().to_string().contains("auto"));
        let mut wrong = ExpertCache::new(&CachePolicy::Lru, &geo(16, 4, 4), 4).unwrap();
        let e = run_traffic(&mut source("mild", g), &mut wrong, 1.0, &cfg).unwrap_err();
        assert!(e.to_string().contains("cache"), "{e}");
        let zero = TrafficConfig { streams: 0, ..cfg };
        let mut c = ExpertCache::new(&CachePolicy::Lru, &g, 4).unwrap();
        assert!(run_traffic(&mut source("mild", g), &mut c, 1.0, &zero).is_err());
        let s = Summary::of(&[1.0, 3.0]);
        assert_eq!((s.mean, s.std, s.min, s.max, s.n), (2.0, 1.0, 1.0, 3.0, 2));
        assert_eq!(Summary::of(&[]), Summary::default());
    }
}
