//! One engine for any GPU count, on one and two host-emulated GPUs, for every strategy:
//! outputs against the f64 slow reference ([`reference_forward`]), each GPU's per-step
//! traffic against the model's plan ([`plan_layer_placed`] on a cache of our own per GPU, with
//! the routes the GPU holds), and each layer's issued operations against its
//! [`ft_model::schedule::LayerSchedule`] (the same operations, in an order that keeps every
//! dependency) with each GPU's work the schedule's (under tensor parallelism too, where the
//! CPU experts are dealt out over the GPUs).

use ft_kernels::ActivationPath;
use ft_model::cache::CacheOptions;
use ft_model::plan::plan_layer_placed;
use ft_model::routing::{self, StepRouting};
use ft_model::schedule::OpKind;
use ft_model::{
    CpuLayers, DenseSpec, ExpertFormat, FetchFraction, GpuLayout, GpuPlacement, ModelSpec,
    MoeGeometry, Strategy,
};
use ft_runtime::cpu_pool::PoolWait;
use ft_runtime::device::{Device, DeviceSpec, HostDeviceConfig};
use ft_runtime::engine::{
    draw_routing, token_input, BankSource, CombineOrder, Engine, EngineConfig, StepInput,
    StepResult,
};
use ft_runtime::gather::GatherMethod;
use ft_runtime::numerics::{reference_forward, rel_l2_to_reference};

/// 4 layers of 24 experts, top-4, nvfp4.
fn model() -> ModelSpec {
    ModelSpec {
        name: "tiny-one-engine".into(),
        format: ExpertFormat::Nvfp4,
        geometry: MoeGeometry {
            hidden: 128,
            intermediate: 64,
            experts: 24,
            top_k: 4,
            moe_layers: 4,
            shared_experts: 1,
        },
        dense: Some(DenseSpec {
            weight_bytes_per_layer: 16 << 10,
            kv_bytes_per_token: 64,
        }),
    }
}

const STREAMS: usize = 3;

fn config(strategy: Strategy) -> EngineConfig {
    EngineConfig {
        strategy,
        // Room for reuse across steps on each GPU, not for every expert: misses each step.
        cache_slots: 16,
        max_streams: STREAMS,
        max_context: 64,
        threads: 2,
        pool_wait: PoolWait::Park,
        gpu_path: ActivationPath::F32,
        cpu_path: ActivationPath::F32,
        combine: CombineOrder::Fixed,
        gather: GatherMethod::CopyEngine,
        seed: 7,
        timeline: true,
        reserve_bytes: 0,
        ..EngineConfig::default()
    }
}

fn strategies() -> Vec<Strategy> {
    vec![
        Strategy::Offload,
        Strategy::Hybrid {
            fetch: FetchFraction::Fixed(0.5),
        },
        Strategy::Resident,
        Strategy::Cpu,
        Strategy::LayerSplit {
            cpu_layers: CpuLayers::Fixed(2),
        },
        Strategy::LayerSplitCached {
            cpu_layers: CpuLayers::Fixed(1),
        },
    ]
}

fn engine(gpus: u32, strategy: Strategy) -> Engine {
    engine_placed(gpus, GpuPlacement::Sharded, strategy)
}

fn engine_placed(gpus: u32, placement: GpuPlacement, strategy: Strategy) -> Engine {
    engine_with(gpus, placement, &config(strategy))
}

fn engine_with(gpus: u32, placement: GpuPlacement, cfg: &EngineConfig) -> Engine {
    let spec = DeviceSpec::Host(HostDeviceConfig {
        memory_bytes: 128 << 20,
        kernel_threads: 1,
        ..Default::default()
    });
    let devices = Device::open_group(&spec, gpus as usize).unwrap();
    let layout = GpuLayout::new(gpus, placement).unwrap();
    Engine::on_gpus(
        &devices,
        layout,
        &model(),
        cfg,
        None,
        BankSource::Seed(cfg.seed),
    )
    .unwrap()
}

fn routing() -> Vec<StepRouting> {
    let m = model();
    let mut src = routing::resolve("typical", &m.geometry, Some(3)).unwrap();
    draw_routing(src.as_mut(), STREAMS, 4).unwrap()
}

fn inputs(step: usize) -> Vec<Vec<f32>> {
    (0..STREAMS)
        .map(|s| token_input(5, s, step as u64, model().geometry.hidden))
        .collect()
}

/// Run every step of `steps` on `e`, each with [`inputs`].
fn run(e: &mut Engine, steps: &[StepRouting]) -> Vec<(Vec<Vec<f32>>, StepResult)> {
    steps
        .iter()
        .enumerate()
        .map(|(i, routing)| {
            let x = inputs(i);
            let r = e
                .step(&StepInput {
                    routing,
                    contexts: &[8; STREAMS],
                    inputs: &x,
                    warmup: false,
                })
                .unwrap();
            (x, r)
        })
        .collect()
}

/// Both combine orders, on one GPU, two sharded and two tensor-parallel: every layer's
/// output rows are summed from the expert steps that wrote them (a GPU or a layer without
/// hits, a gather or a CPU share launches nothing for it).
#[test]
fn every_strategy_matches_the_f64_reference_on_one_and_two_gpus() {
    let steps = routing();
    let layouts = [
        (1, GpuPlacement::Sharded),
        (2, GpuPlacement::Sharded),
        (2, GpuPlacement::TensorParallel),
    ];
    for ((gpus, placement), combine) in layouts
        .into_iter()
        .flat_map(|l| [CombineOrder::Fixed, CombineOrder::Fast].map(|c| (l, c)))
    {
        for s in strategies() {
            let cfg = EngineConfig {
                combine,
                ..config(s)
            };
            let mut e = engine_with(gpus, placement, &cfg);
            for (i, ((x, r), routing)) in run(&mut e, &steps).iter().zip(&steps).enumerate() {
                let want =
                    reference_forward(&model(), e.bank(), routing, x, e.weight_scale()).unwrap();
                let err = rel_l2_to_reference(&r.outputs, &want);
                // f32 kernels against f64: a few ulps per layer.
                assert!(
                    err < 1e-5,
                    "G={gpus} {placement:?} {combine:?} {s} step {i}: relative deviation {err}"
                );
                let moved: f64 = r.outputs[0]
                    .iter()
                    .zip(&x[0])
                    .map(|(a, b)| (a - b).abs() as f64)
                    .sum();
                assert!(moved > 1e-3, "G={gpus} {s}: outputs equal inputs");
            }
        }
    }
}

#[test]
fn each_gpus_traffic_is_the_models_plan_on_two_gpus() {
    let m = model();
    let g = m.geometry;
    let steps = routing();
    let layout = GpuLayout::new(2, GpuPlacement::Sharded).unwrap();
    for s in strategies() {
        let mut e = engine(2, s);
        let policy = s.policy(g.moe_layers).unwrap();
        let mut caches: Vec<_> = (0..2)
            .map(|_| {
                CacheOptions::default()
                    .build(s.kind(), &g, e.cache_slots(), None)
                    .unwrap()
            })
            .collect();
        let (mut fetched, mut cpu, mut hits) = (0u64, 0u64, 0u64);
        for (step, (_, r)) in run(&mut e, &steps).iter().enumerate() {
            assert_eq!(r.gpus.len(), 2);
            for (gpu, cache) in caches.iter_mut().enumerate() {
                let mut want = (0u64, 0u64, 0u64, 0u64);
                for (l, routes) in steps[step].layers.iter().enumerate() {
                    let mine = layout.routes_on(gpu as u32, routes);
                    let plan = plan_layer_placed(l, &mine, cache, policy.layer(l));
                    want.0 += plan.hits.len() as u64;
                    want.1 += plan.link_experts() as u64;
                    want.2 += plan.cpu.len() as u64;
                    want.3 += plan.link_experts() as u64 * m.expert_bytes();
                }
                let c = r.gpus[gpu].counts;
                assert_eq!(
                    (c.hits, c.fetched, c.cpu, c.gathered_bytes),
                    want,
                    "{s} step {step} GPU {gpu}"
                );
                (hits, fetched, cpu) = (hits + c.hits, fetched + c.fetched, cpu + c.cpu);
            }
            // The record's counts are the GPUs' summed.
            let t = r.record.totals;
            let (h0, h1) = (r.gpus[0].counts, r.gpus[1].counts);
            assert_eq!(t.hits as u64, h0.hits + h1.hits, "{s}");
            assert_eq!(t.cpu as u64, h0.cpu + h1.cpu, "{s}");
        }
        // Every kind of traffic the strategy has did occur (a test of counts that are all
        // zero would pass anything).
        use ft_model::StrategyKind as K;
        assert_eq!(
            (hits > 0, fetched > 0, cpu > 0),
            match s.kind() {
                K::Offload => (true, true, false),
                K::Hybrid | K::LayerSplitCached => (true, true, true),
                K::Resident => (true, false, false),
                K::Cpu => (false, false, true),
                K::LayerSplit => (true, false, true),
            },
            "{s}: hits {hits}, fetched {fetched}, cpu {cpu}"
        );
    }
}

#[test]
fn the_engine_issues_each_layers_schedule() {
    let steps = routing();
    let runs = [1u32, 2]
        .into_iter()
        .flat_map(|g| {
            strategies()
                .into_iter()
                .map(move |s| (g, GpuPlacement::Sharded, s))
        })
        .chain(
            strategies()
                .into_iter()
                .map(|s| (2, GpuPlacement::TensorParallel, s)),
        );
    for (gpus, placement, s) in runs {
        let mut e = engine_placed(gpus, placement, s);
        let mut seen = std::collections::HashSet::new();
        for (step, (_, r)) in run(&mut e, &steps).iter().enumerate() {
            assert_eq!(r.ops.len(), model().geometry.moe_layers);
            for (l, ops) in r.ops.iter().enumerate() {
                if let Err(why) = ops.check() {
                    panic!("G={gpus} {placement:?} {s} step {step} layer {l}: {why}\n{ops:?}");
                }
                assert_eq!(ops.schedule.gpus, gpus);
                seen.extend(ops.issued.iter().map(|&(k, _)| k));
            }
            // Each GPU's work in the schedule is the work the engine did there: under tensor
            // parallelism the model deals the CPU experts out as the engine does.
            for (g, done) in r.gpus.iter().enumerate() {
                let c = done.counts;
                let want = r.ops.iter().fold((0.0, 0.0, 0.0), |(h, f, p), o| {
                    let s = o.schedule.counts[g];
                    (h + s.hits, f + s.fetched, p + s.cpu)
                });
                assert_eq!(
                    (c.hits as f64, c.fetched as f64, c.cpu as f64),
                    want,
                    "G={gpus} {placement:?} {s} step {step} GPU {g}"
                );
            }
        }
        // The properties of the schedule apply where they can: the gate and the fold on
        // one GPU, the peer combine on two.
        let fetches = seen.contains(&OpKind::Gather);
        assert_eq!(
            seen.contains(&OpKind::LastLaunch),
            fetches && gpus == 1,
            "{s}"
        );
        assert_eq!(seen.contains(&OpKind::PeerCombine), gpus == 2, "{s}");
        assert!(seen.contains(&OpKind::Dense) && seen.contains(&OpKind::Residual));
        let cpu = !matches!(s, Strategy::Offload | Strategy::Resident);
        for k in [
            OpKind::Issue,
            OpKind::CpuShare,
            OpKind::RoundTrip,
            OpKind::Combine,
        ] {
            assert_eq!(seen.contains(&k), cpu, "G={gpus} {s} {k:?}");
        }
    }
}

/// The engine's chunk count is an input of each layer's schedule: at 1 and 2 chunks (and
/// the default) on one and two GPUs, the engine issues exactly the schedule built with it
/// (no early chunk at 1, so none issued), and decodes the same bits as at the default (the
/// fixed combine order sums the same rows in the same order whatever the chunks).
#[test]
fn the_fetch_chunk_setting_is_the_schedules_and_changes_no_output() {
    use ft_model::plan::MAX_FETCH_CHUNKS;
    use ft_runtime::engine::EngineSettings;
    let steps = routing();
    let fetching = [
        Strategy::Offload,
        Strategy::Hybrid {
            fetch: FetchFraction::Fixed(0.5),
        },
    ];
    for gpus in [1u32, 2] {
        for s in fetching {
            let decode = |fetch_chunks: usize| {
                let cfg = EngineConfig {
                    settings: EngineSettings { fetch_chunks },
                    ..config(s)
                };
                let mut e = engine_with(gpus, GpuPlacement::Sharded, &cfg);
                run(&mut e, &steps)
            };
            let default = decode(MAX_FETCH_CHUNKS);
            let mut early_at_default = false;
            for (_, r) in &default {
                early_at_default |= r
                    .ops
                    .iter()
                    .any(|o| o.issued.iter().any(|&(k, _)| k == OpKind::FetchedEarly));
            }
            assert!(early_at_default, "G={gpus} {s}: no layer fetched in chunks");
            for fetch_chunks in [1, 2] {
                let what = format!("G={gpus} {s} {fetch_chunks} chunk(s)");
                let runs = decode(fetch_chunks);
                for (step, ((_, r), (_, d))) in runs.iter().zip(&default).enumerate() {
                    for (l, ops) in r.ops.iter().enumerate() {
                        if let Err(why) = ops.check() {
                            panic!("{what} step {step} layer {l}: {why}\n{ops:?}");
                        }
                        assert_eq!(ops.schedule.fetch_chunks, fetch_chunks, "{what}");
                        if fetch_chunks == 1 {
                            assert!(
                                !ops.issued.iter().any(|&(k, _)| k == OpKind::FetchedEarly),
                                "{what} step {step} layer {l}"
                            );
                        }
                    }
                    assert_eq!(r.outputs, d.outputs, "{what} step {step}");
                }
            }
        }
    }
}
