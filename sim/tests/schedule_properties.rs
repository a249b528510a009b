//! Properties of strategies as placement policies and of the layer schedule, over every host
//! preset and every fitted profile kept in the tree:
//!
//! - equal work costs the same whatever the strategy is called: hybrid with no CPU share
//!   predicts offload's step on the same traffic, layer split with no CPU layer predicts
//!   offload's (cached) and resident's (resident), within 0.1%;
//! - every fitted fixed cost is non-negative;
//! - every strategy has a CLI name that reads back, a policy, a schedule with finite model
//!   terms, a prediction and a simulation (a strategy added without them fails here);
//! - the simulator and the model agree within 2% on layer split.

use std::path::{Path, PathBuf};

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use ft_model::perf::predict::{predict, PredictConfig};
use ft_model::perf::{PerfModel, StepShape};
use ft_model::plan::plan_layer_placed;
use ft_model::routing::{self, StepRouting};
use ft_model::schedule::{LayerSchedule, LayerWork};
use ft_model::strategy::{CpuLayers, FetchFraction, Strategy, StrategyKind};
use ft_model::{CachePolicy, ExpertCache, GpuLayout, LayerPlacement, ModelSpec};
use ft_sim::compare::{compare, CacheChoice, CompareConfig};

/// Largest relative difference between two predictions of the same work (0.1%).
const SAME_WORK_TOLERANCE: f64 = 1e-3;

/// Largest relative difference between the simulated and the modelled layer split (2%).
const SPLIT_SIM_TOLERANCE: f64 = 0.02;

/// Every profile JSON under `experiments/` (fitted by `ft probe` on a real host).
fn tree_profiles() -> Vec<PathBuf> {
    fn walk(dir: &Path, out: &mut Vec<PathBuf>) {
        let Ok(entries) = std::fs::read_dir(dir) else {
            return;
        };
        for e in entries.flatten() {
            let p = e.path();
            if p.is_dir() {
                walk(&p, out);
            } else if p.extension().is_some_and(|x| x == "json")
                && p.parent().is_some_and(|d| d.ends_with("profiles"))
            {
                out.push(p);
            }
        }
    }
    let mut out = Vec::new();
    walk(
        &Path::new(env!("CARGO_MANIFEST_DIR")).join("../experiments"),
        &mut out,
    );
    out.sort();
    out
}

/// (name, model) of every host preset and every profile in the tree.
fn hosts() -> Vec<(String, PerfModel)> {
    let mut hosts: Vec<(String, PerfModel)> = ft_sim::hosts::preset_names()
        .into_iter()
        .map(|n| {
            let h = ft_sim::hosts::resolve_host(n).unwrap();
            (n.to_string(), h.perf)
        })
        .collect();
    for p in tree_profiles() {
        let h = ft_sim::hosts::resolve_host(p.to_str().unwrap()).unwrap();
        hosts.push((p.display().to_string(), h.perf));
    }
    assert!(
        hosts.len() > ft_sim::hosts::preset_names().len(),
        "a profile is in the tree"
    );
    hosts
}

fn quick(streams: usize, routing: &str) -> PredictConfig {
    PredictConfig {
        streams,
        routing: routing.to_string(),
        warmup_steps: 8,
        steps: 8,
        hybrid_fetch: FetchFraction::Fixed(1.0),
        layer_split: Some(CpuLayers::Fixed(0)),
        ..PredictConfig::default()
    }
}

fn close(a: f64, b: f64) -> bool {
    (a - b).abs() <= SAME_WORK_TOLERANCE * a.abs().max(b.abs())
}

#[test]
fn a_plan_without_cpu_share_predicts_what_the_same_traffic_costs_elsewhere() {
    let mut rng = StdRng::seed_from_u64(41);
    let models = ModelSpec::preset_names();
    let routings = ["uniform", "mild", "typical", "skewed"];
    for (name, perf) in hosts() {
        for _ in 0..2 {
            let model = ModelSpec::preset(models[rng.random_range(0..models.len())]).unwrap();
            let streams = rng.random_range(1..=8);
            let routing = routings[rng.random_range(0..routings.len())];
            let what = format!("{name} {} B={streams} {routing}", model.name);
            let p = predict(&model, &perf, &quick(streams, routing)).unwrap();
            let get = |k: StrategyKind| p.get(k);
            let (off, hy) = (get(StrategyKind::Offload), get(StrategyKind::Hybrid));
            assert_eq!(
                hy.counts.cpu, 0.0,
                "{what}: hybrid at f = 1 has no CPU share"
            );
            assert_eq!(hy.counts, off.counts, "{what}: the same traffic");
            assert!(
                close(hy.step_us, off.step_us),
                "{what}: hybrid {} vs offload {}",
                hy.step_us,
                off.step_us
            );
            let cached = get(StrategyKind::LayerSplitCached);
            assert_eq!(cached.cpu_layers, Some(0));
            assert!(
                close(cached.step_us, off.step_us),
                "{what}: layer-split-cached:0 {} vs offload {}",
                cached.step_us,
                off.step_us
            );
            let (split, res) = (get(StrategyKind::LayerSplit), get(StrategyKind::Resident));
            assert_eq!(
                split.counts, res.counts,
                "{what}: resident layers hit every expert"
            );
            assert!(
                close(split.step_us, res.step_us),
                "{what}: layer-split:0 {} vs resident {}",
                split.step_us,
                res.step_us
            );
        }
    }
}

#[test]
fn every_fitted_fixed_cost_is_non_negative() {
    for (name, perf) in hosts() {
        perf.params.validate().unwrap();
        for w in LayerWork::ALL {
            let v = perf.params.overhead.of(w);
            assert!(
                v.is_finite() && v >= 0.0,
                "{name}: {} costs {v} us",
                w.name()
            );
        }
    }
    for path in tree_profiles() {
        let p = ft_model::profile::Profile::read(&path).unwrap();
        if let Some(fit) = &p.fit {
            for e in &fit.estimates {
                if e.param.name().starts_with("overhead.") {
                    assert!(
                        e.value >= 0.0,
                        "{}: {} = {}",
                        path.display(),
                        e.param,
                        e.value
                    );
                }
            }
        }
    }
}

/// Every strategy, as data: a CLI name that reads back, a policy, a schedule per layer with
/// finite model terms, a row of the prediction and a simulation. A strategy added to
/// `StrategyKind::ALL` without any of these fails here.
#[test]
fn every_strategy_has_a_name_a_policy_a_schedule_and_model_terms() {
    let host = ft_sim::hosts::resolve_host(ft_sim::hosts::DEFAULT_HOST).unwrap();
    let mut model = ModelSpec::preset("qwen3.8-flash-next").unwrap();
    model.geometry.moe_layers = 4;
    let layers = model.geometry.moe_layers;
    let p = &host.perf.params;
    let shape = StepShape::new(&model, 2, 1024);
    let cfg = PredictConfig {
        streams: 2,
        warmup_steps: 4,
        steps: 4,
        layer_split: Some(CpuLayers::Auto),
        ..PredictConfig::default()
    };
    let prediction = predict(&model, &host.perf, &cfg).unwrap();
    for kind in StrategyKind::ALL {
        let s = Strategy::from_parts(
            kind,
            Some(FetchFraction::Fixed(0.5)),
            Some(CpuLayers::Fixed(2)),
        );
        assert_eq!(
            s.cli_name().parse::<Strategy>().unwrap(),
            s,
            "{kind}: CLI name"
        );
        assert_eq!(kind.name().parse::<StrategyKind>().unwrap(), kind);
        let policy = s.policy(layers).unwrap();
        let mut src = routing::resolve("typical", &model.geometry, Some(1)).unwrap();
        let mut step = StepRouting::default();
        src.next_step_into(2, &mut step).unwrap();
        let mut cache = ExpertCache::new(&CachePolicy::Lru, &model.geometry, 64).unwrap();
        for (l, routes) in step.layers.iter().enumerate() {
            let plan = plan_layer_placed(l, routes, &mut cache, policy.layer(l));
            let counts = ft_model::perf::LayerCounts::of_plan(&plan);
            let schedule = LayerSchedule::new(&GpuLayout::single(), &p.engine_settings, &[counts]);
            assert!(!schedule.ops.is_empty());
            let t = p.schedule_time(&schedule, &shape, p.dense_us(&shape.dense, 2.0, 1024.0));
            assert!(
                t.total_us.is_finite() && t.total_us > 0.0,
                "{kind} layer {l}"
            );
            if policy.layer(l) == LayerPlacement::CpuOnly {
                assert_eq!(schedule.work(), LayerWork::CpuShare, "{kind} layer {l}");
            }
        }
        let row = prediction.get(kind);
        assert!(
            row.step_us.is_finite() && row.step_us > 0.0,
            "{kind}: prediction"
        );
        assert_eq!(
            row.cpu_layers.is_some(),
            kind.takes_cpu_layers(),
            "{kind}: N in the JSON"
        );
        let mut c = CompareConfig::field_report(2);
        c.strategies = vec![kind];
        c.cache = CacheChoice::GpuMemory;
        c.warmup_steps = 2;
        c.steps = 3;
        let sim = compare(&host, &model, &c).unwrap();
        let r = &sim.strategies[0];
        assert_eq!(r.strategy, kind.name());
        assert!(
            r.tok_s_per_stream.is_finite() && r.tok_s_per_stream > 0.0,
            "{kind}: simulation"
        );
    }
}

#[test]
fn the_simulator_and_the_model_agree_on_layer_split_within_two_percent() {
    for host in ft_sim::hosts::preset_names() {
        let h = ft_sim::hosts::resolve_host(host).unwrap();
        for (model, streams) in [("qwen3.6-35b-a3b", 1), ("gpt-oss-120b", 4)] {
            let m = ModelSpec::preset(model).unwrap();
            let mut cfg = CompareConfig::field_report(streams);
            cfg.strategies = vec![StrategyKind::LayerSplit, StrategyKind::LayerSplitCached];
            cfg.cache = CacheChoice::GpuMemory;
            cfg.warmup_steps = 16;
            cfg.steps = 32;
            let c = compare(&h, &m, &cfg).unwrap();
            for r in &c.strategies {
                let what = format!(
                    "{host} {model} B={streams} {}:{}",
                    r.strategy, r.sim.cpu_layers
                );
                assert!(
                    (r.miss_rate - r.model.miss_rate).abs() < 1e-9,
                    "{what}: same plans"
                );
                assert!(
                    r.sim_vs_model.abs() < SPLIT_SIM_TOLERANCE,
                    "{what}: sim {:.2} tok/s, model {:.2} ({:+.2}%)",
                    r.tok_s_per_stream,
                    r.model.tok_s_per_stream,
                    100.0 * r.sim_vs_model
                );
            }
        }
    }
}
