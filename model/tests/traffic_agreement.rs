//! The analytic model's per-layer-step sampler against `ft_model::traffic`: the same cache,
//! planner and routing give the same totals.

use ft_model::cache::CachePolicy;
use ft_model::perf::predict::{sample_traffic, SampleRun};
use ft_model::routing::resolve;
use ft_model::traffic::{strategy_traffic, TrafficConfig};
use ft_model::{FetchFraction, MoeGeometry, Strategy, StrategyKind};

#[test]
fn sampled_counts_equal_the_traffic_simulation() {
    let g = MoeGeometry {
        hidden: 64,
        intermediate: 64,
        experts: 64,
        top_k: 4,
        moe_layers: 6,
        shared_experts: 0,
    };
    let config = TrafficConfig {
        warmup_steps: 20,
        steps: 60,
        streams: 3,
    };
    let cases = [
        (Strategy::Offload, CachePolicy::Lru),
        (
            Strategy::Hybrid {
                fetch: FetchFraction::Fixed(0.3),
            },
            CachePolicy::Lru,
        ),
        (
            Strategy::Hybrid {
                fetch: FetchFraction::Fixed(0.6),
            },
            CachePolicy::Lfu { decay_every: 0 },
        ),
        (Strategy::Cpu, CachePolicy::Lru),
        (Strategy::Resident, CachePolicy::Lru),
        (
            Strategy::Offload,
            CachePolicy::StaticHot { hot: Vec::new() },
        ),
    ];
    for (strategy, policy) in cases {
        let f = strategy.fixed_fetch_fraction().unwrap();
        let mut a = resolve("typical", &g, Some(5)).unwrap();
        let t = strategy_traffic(a.as_mut(), &strategy, &policy, 96, &config).unwrap();
        let mut b = resolve("typical", &g, Some(5)).unwrap();
        let options = ft_model::CacheOptions::from(&policy);
        let run = SampleRun {
            kind: strategy.kind(),
            placement: ft_model::PlacementPolicy::cached(f),
            cache: &options,
            slots: 96,
            warmup_steps: config.warmup_steps,
            steps: config.steps,
            streams: config.streams,
        };
        let s = sample_traffic(b.as_mut(), &run).unwrap();
        assert_eq!(s.counts.len(), config.steps * g.moe_layers);
        let m = s.mean_per_step();
        let layers = g.moe_layers as f64;
        let close = |x: f64, y: f64| (x - y).abs() < 1e-9;
        assert!(
            close(m.hits / layers, t.total.hits),
            "{strategy} {policy}: hits {} vs {}",
            m.hits / layers,
            t.total.hits
        );
        assert!(
            close(m.fetched / layers, t.total.fetched + t.total.uncached),
            "{strategy} {policy}: fetched"
        );
        assert!(
            close(m.cpu / layers, t.total.cpu),
            "{strategy} {policy}: cpu"
        );
        assert!(
            close(s.miss_rate(), t.total.miss_rate),
            "{strategy} {policy}: miss rate {} vs {}",
            s.miss_rate(),
            t.total.miss_rate
        );
        if strategy.kind() == StrategyKind::Resident {
            assert_eq!(m.misses(), 0.0);
        }
    }
}
