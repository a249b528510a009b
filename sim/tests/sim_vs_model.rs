//! The simulator against the analytic model in steady state, on a small grid over the host
//! presets, two models, stream counts and cache sizes (the full grid is
//! experiments/sim-vs-model). They share routing, cache, plans and cost terms; they differ
//! only in how durations combine (events against the closed-form critical path), and the
//! documented differences (the pool spins instead of waking every layer; the CPU's bytes
//! start after its copy, round trip and fixed costs, so it contends less than the closed
//! form assumes; launches hide behind a busy stream) are allowed for: the simulated step is
//! never more than 5% slower, and at most 5% faster beyond the contention the closed form
//! charges and the wake-ups it charges every layer.

use ft_model::strategy::FetchFraction;
use ft_sim::compare::{compare, CacheChoice, CompareConfig};

#[test]
fn simulator_and_model_agree_within_five_percent() {
    let mut worst = (0.0f64, String::new());
    let mut n = 0;
    for host in ft_sim::hosts::preset_names() {
        let h = ft_sim::hosts::resolve_host(host).unwrap();
        for model in ["qwen3.8-flash-next", "gpt-oss-120b"] {
            let m = ft_model::ModelSpec::preset(model).unwrap();
            for (streams, share) in [(1, 0.15), (4, 0.5)] {
                let slots = (m.geometry.total_experts() as f64 * share) as usize;
                let mut cfg = CompareConfig::field_report(streams);
                cfg.cache = CacheChoice::Slots { slots };
                cfg.fetch = FetchFraction::Fixed(0.4);
                cfg.warmup_steps = 32;
                cfg.steps = 48;
                let c = compare(&h, &m, &cfg).unwrap();
                for r in &c.strategies {
                    n += 1;
                    let what = format!("{host} {model} B={streams} slots={slots} {}", r.strategy);
                    // The model's miss rate is counted on the same plans.
                    assert!((r.miss_rate - r.model.miss_rate).abs() < 1e-9, "{what}");
                    // Never more than 5% slower; faster by at most 5% plus what the
                    // documented differences explain.
                    let step = r.model.step_us;
                    let gain = r.step_gain_us();
                    let unexplained = (gain - r.explained_gain_us(h.wake_us)).max(0.0);
                    assert!(
                        gain > -0.05 * step,
                        "{what}: sim slower by {:.1} us of {step:.1}",
                        -gain
                    );
                    let d = (unexplained / step).max(-gain / step);
                    if d > worst.0 {
                        worst = (d, what);
                    }
                }
            }
        }
    }
    assert_eq!(
        n,
        ft_sim::hosts::preset_names().len() * 2 * 2 * ft_model::StrategyKind::ALL.len()
    );
    assert!(
        worst.0 < 0.05,
        "largest unexplained difference {:.2}% at {}",
        100.0 * worst.0,
        worst.1
    );
}

/// A host whose engine gathers a layer's fetched experts in one chunk
/// (`PerfParams::engine_settings`, what a probed profile records): the simulator and the
/// model both time offload's step otherwise than at the default chunks, and still agree; a
/// strategy that fetches nothing (resident, the CPU-only cpu) does not move in either.
#[test]
fn the_fetch_chunk_setting_moves_the_simulator_and_the_model_alike() {
    use ft_model::StrategyKind as K;
    let m = ft_model::ModelSpec::preset("qwen3.8-flash-next").unwrap();
    let mut cfg = CompareConfig::field_report(2);
    cfg.cache = CacheChoice::Slots {
        slots: (m.geometry.total_experts() as f64 * 0.3) as usize,
    };
    cfg.strategies = vec![K::Offload, K::Cpu];
    cfg.warmup_steps = 16;
    cfg.steps = 24;
    let mut h = ft_sim::hosts::resolve_host(ft_sim::hosts::preset_names()[0]).unwrap();
    let default = compare(&h, &m, &cfg).unwrap();
    h.perf.params.engine_settings = ft_model::EngineSettings { fetch_chunks: 1 };
    let one = compare(&h, &m, &cfg).unwrap();
    for (d, o) in default.strategies.iter().zip(&one.strategies) {
        let what = &d.strategy;
        let (sim_moved, model_moved) = (
            (o.sim.step_ms - d.sim.step_ms).abs() > 1e-9 * d.sim.step_ms,
            (o.model.step_us - d.model.step_us).abs() > 1e-9 * d.model.step_us,
        );
        let fetches = d.strategy == "offload";
        assert_eq!((sim_moved, model_moved), (fetches, fetches), "{what}");
        // Within the tolerance of the default's agreement (above).
        let (gain, step) = (o.step_gain_us(), o.model.step_us);
        let unexplained = gain - o.explained_gain_us(h.wake_us);
        assert!(
            gain > -0.05 * step && unexplained < 0.05 * step,
            "{what}: {gain} us"
        );
    }
}
