//! The simulator honours a profile's `hybrid_miss_factor` (hybrid's miss rate relative to
//! offload's at the same cache, a calibrated engine term): hybrid's simulated misses scale
//! by it, offload's do not move, and fewer misses make hybrid's step shorter. The analytic
//! model reports the miss rate the simulator measures under the same factor (`ft compare`).

use ft_model::strategy::{FetchFraction, Strategy};
use ft_sim::costs::CostModel;
use ft_sim::decode::Workload;
use ft_sim::run::{simulate, SimConfig, SimResult};

fn run(factor: f64, strategy: Strategy) -> SimResult {
    let h = ft_sim::hosts::preset(ft_sim::hosts::DEFAULT_HOST).unwrap();
    let m = ft_model::ModelSpec::preset("qwen3.6-35b-a3b").unwrap();
    let mut c = CostModel::from_host(&h, &m).unwrap();
    c.params.engine.hybrid_miss_factor = factor;
    c.params.validate().unwrap();
    let cfg = SimConfig {
        streams: 2,
        strategy,
        cache_slots: 2000,
        cache_options: Default::default(),
        routing: "typical".into(),
        warmup_steps: 16,
        steps: 48,
        seed: 3,
        jitter: 0.0,
        workload: Workload::default(),
        layout: Default::default(),
    };
    simulate(&c, &m, &cfg).unwrap()
}

#[test]
fn a_miss_factor_scales_hybrids_simulated_misses() {
    let hybrid = Strategy::Hybrid {
        fetch: FetchFraction::Fixed(0.5),
    };
    let base = run(1.0, hybrid);
    assert!(
        base.miss_rate > 0.05,
        "the case must miss: {}",
        base.miss_rate
    );
    for factor in [0.8, 1.2] {
        let scaled = run(factor, hybrid);
        let ratio = scaled.miss_rate / base.miss_rate;
        assert!(
            (ratio - factor).abs() < 0.01,
            "factor {factor}: miss rate {} against {} (x{ratio:.4})",
            scaled.miss_rate,
            base.miss_rate
        );
        if factor < 1.0 {
            assert!(
                scaled.tok_s_total > base.tok_s_total,
                "fewer misses, faster"
            );
        } else {
            assert!(scaled.tok_s_total < base.tok_s_total, "more misses, slower");
        }
    }
    // Offload has no CPU share: the factor leaves it as it is.
    assert_eq!(run(0.8, Strategy::Offload), run(1.0, Strategy::Offload));
}

/// `ft compare` of a host whose profile carries `factor`: the model's reported hybrid miss
/// rate (not only its step time) honours the factor as the simulator does, so the two agree
/// up to the simulator's whole-expert rounding; offload's is the counted one either way.
#[test]
fn the_model_reports_the_miss_rate_the_simulator_measures_under_a_factor() {
    use ft_model::strategy::StrategyKind;
    use ft_sim::compare::{compare, CacheChoice, CompareConfig};
    let m = ft_model::ModelSpec::preset("qwen3.6-35b-a3b").unwrap();
    let mut cfg = CompareConfig::field_report(2);
    cfg.strategies = vec![StrategyKind::Offload, StrategyKind::Hybrid];
    cfg.cache = CacheChoice::Slots { slots: 2000 };
    cfg.fetch = FetchFraction::Fixed(0.5);
    cfg.warmup_steps = 16;
    cfg.steps = 48;
    let at = |factor: f64| {
        let mut h = ft_sim::hosts::resolve_host(ft_sim::hosts::DEFAULT_HOST).unwrap();
        h.perf.params.engine.hybrid_miss_factor = factor;
        compare(&h, &m, &cfg).unwrap()
    };
    let row = |c: &ft_sim::compare::Comparison, kind: StrategyKind| {
        c.strategies
            .iter()
            .find(|r| r.strategy == kind.name())
            .unwrap()
            .clone()
    };
    let base = at(1.0);
    let base_hybrid = row(&base, StrategyKind::Hybrid);
    assert!(base_hybrid.model.miss_rate > 0.05, "{base_hybrid:?}");
    for factor in [0.8, 1.2] {
        let c = at(factor);
        let (hy, off) = (
            row(&c, StrategyKind::Hybrid),
            row(&c, StrategyKind::Offload),
        );
        assert!(
            (hy.miss_rate - hy.model.miss_rate).abs() < 1e-3 * hy.miss_rate,
            "factor {factor}: simulated {} against the model's {}",
            hy.miss_rate,
            hy.model.miss_rate
        );
        let ratio = hy.model.miss_rate / base_hybrid.model.miss_rate;
        assert!(
            (ratio - factor).abs() < 0.01,
            "factor {factor}: x{ratio:.4}"
        );
        assert_eq!(
            off.model.miss_rate,
            row(&base, StrategyKind::Offload).model.miss_rate
        );
        assert!((off.miss_rate - off.model.miss_rate).abs() < 1e-9);
    }
}
