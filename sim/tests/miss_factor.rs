//! The simulator honours a profile's `hybrid_miss_factor` (hybrid's miss rate relative to
//! offload's at the same cache, a calibrated engine term): hybrid's simulated misses scale
//! by it, offload's do not move, and fewer misses make hybrid's step shorter.

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
