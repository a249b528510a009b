//! The decode engine on the host-emulated device: every strategy against `plan_layer`'s
//! counts and against the f64 reference forward, the placement invariance of the fixed
//! combine order, and the Chrome trace. Each body runs on the host-emulated device here and
//! on CUDA through the `cuda_*` twins (GPU machine: `--features cuda -- --ignored`).

use ft_kernels::ActivationPath;
use ft_model::cache::{build_cache, CachePolicy};
use ft_model::plan::plan_layer_placed;
use ft_model::routing::{self, StepRouting};
use ft_model::{
    CpuLayers, DenseSpec, ExpertFormat, FetchFraction, ModelSpec, MoeGeometry, Strategy,
    StrategyKind,
};
use ft_runtime::cpu_pool::PoolWait;
use ft_runtime::device::{Device, HostDeviceConfig};
use ft_runtime::engine::{
    decode, draw_routing, token_input, CombineOrder, DecodeOptions, Engine, EngineConfig,
    EngineSettings,
};
use ft_runtime::gather::GatherMethod;
use ft_runtime::instrument::{ChromeTrace, Lane};
use ft_runtime::numerics::{reference_forward, rel_l2_to_reference, Deviation};

/// A small model: 6 layers of 24 experts, top-4, nvfp4 (both activation paths exist).
fn tiny() -> ModelSpec {
    ModelSpec {
        name: "tiny".into(),
        format: ExpertFormat::Nvfp4,
        geometry: MoeGeometry {
            hidden: 128,
            intermediate: 64,
            experts: 24,
            top_k: 4,
            moe_layers: 6,
            shared_experts: 1,
        },
        dense: Some(DenseSpec {
            weight_bytes_per_layer: 64 << 10,
            kv_bytes_per_token: 64,
        }),
    }
}

fn device() -> Device {
    Device::host(HostDeviceConfig {
        memory_bytes: 512 << 20,
        kernel_threads: 1,
        ..Default::default()
    })
    .unwrap()
}

fn config(strategy: Strategy, slots: usize, streams: usize) -> EngineConfig {
    EngineConfig {
        strategy,
        cache_slots: slots,
        cache_options: Default::default(),
        max_streams: streams,
        max_context: 64,
        threads: 1,
        pool_wait: PoolWait::Park,
        gpu_path: ActivationPath::F32,
        cpu_path: ActivationPath::Int8,
        combine: CombineOrder::Fixed,
        gather: GatherMethod::CopyEngine,
        seed: 11,
        timeline: true,
        reserve_bytes: 0,
        ..EngineConfig::default()
    }
}

fn routing_for(model: &ModelSpec, streams: usize, steps: usize) -> Vec<StepRouting> {
    let mut src = routing::resolve("typical", &model.geometry, Some(5)).unwrap();
    draw_routing(src.as_mut(), streams, steps).unwrap()
}

fn options() -> DecodeOptions {
    DecodeOptions {
        context: 8,
        input_seed: 3,
        keep_spans: true,
        keep_outputs: true,
        block_stamps: false,
    }
}

fn hybrid(f: f64) -> Strategy {
    Strategy::Hybrid {
        fetch: FetchFraction::Fixed(f),
    }
}

fn layer_split(n: usize) -> Strategy {
    Strategy::LayerSplit {
        cpu_layers: CpuLayers::Fixed(n),
    }
}

fn layer_split_cached(n: usize) -> Strategy {
    Strategy::LayerSplitCached {
        cpu_layers: CpuLayers::Fixed(n),
    }
}

/// Every strategy's per-layer counts (hits, fetched, CPU, tokens, bytes) are the model's
/// plan of the same routing ([`plan_layer_placed`] with the strategy's policy on a cache of
/// our own): the engine's traffic is the model's.
fn every_strategy_matches_plan_layer_counts(d: &Device) {
    let model = tiny();
    let (streams, slots) = (3, 20);
    let steps = routing_for(&model, streams, 5);
    for strategy in [
        Strategy::Offload,
        hybrid(0.5),
        Strategy::Resident,
        Strategy::Cpu,
        layer_split(2),
        layer_split_cached(2),
    ] {
        let cfg = config(strategy, slots, streams);
        let mut engine = Engine::new(d, &model, &cfg, None).unwrap();
        let run = decode(
            &mut engine,
            &steps[..2],
            &steps[2..],
            &options(),
            &mut |_, _| {},
        )
        .unwrap();
        // Replay the same routing through plan_layer on a cache of our own.
        let mut cache = build_cache(
            strategy.kind(),
            &CachePolicy::Lru,
            &model.geometry,
            slots,
            None,
        )
        .unwrap();
        let policy = strategy.policy(model.geometry.moe_layers).unwrap();
        for (r, routing) in run.records.iter().zip(&steps) {
            for (l, lr) in r.layers.iter().enumerate() {
                let plan = plan_layer_placed(l, &routing.layers[l], &mut cache, policy.layer(l));
                let c = lr.counts;
                assert_eq!(
                    c.hits as usize,
                    plan.hits.len(),
                    "{strategy} step {} layer {l}",
                    r.step
                );
                assert_eq!(c.misses as usize, plan.misses(), "{strategy}");
                assert_eq!(c.fetched as usize, plan.link_experts(), "{strategy}");
                assert_eq!(c.cpu as usize, plan.cpu.len(), "{strategy}");
                let (th, tl, tc) = plan.token_counts();
                assert_eq!(
                    (c.gpu_tokens as usize, c.cpu_tokens as usize),
                    (th + tl, tc)
                );
                assert_eq!(
                    c.gathered_bytes,
                    plan.link_experts() as u64 * model.expert_bytes()
                );
                // Busy times exist exactly where work was planned.
                assert!(
                    lr.gpu_busy_us > 0.0,
                    "{strategy}: the dense part always runs"
                );
                assert_eq!(
                    lr.cpu_busy_us > 0.0,
                    c.cpu > 0,
                    "{strategy} layer {l} cpu busy"
                );
                // The last layer also holds the step's final wait for its outputs.
                if l + 1 < r.layers.len() {
                    assert_eq!(
                        lr.host_wait_us > 0.0,
                        c.cpu > 0,
                        "{strategy}: one round trip per CPU layer"
                    );
                }
                if c.fetched > 0 {
                    assert!(lr.pcie_busy_us > 0.0 && lr.pcie_bytes >= c.gathered_bytes);
                }
            }
            assert_eq!(r.totals.misses, r.totals.fetched + r.totals.cpu);
        }
        let s = &run.summary;
        assert_eq!(
            (s.steps, s.warmup_steps, s.streams, s.layers),
            (3, 2, streams, 6)
        );
        assert!(
            s.tok_s_total > 0.0
                && (s.tok_s_total - streams as f64 * s.tok_s_per_stream).abs() < 1e-6
        );
        match strategy.kind() {
            StrategyKind::Resident => assert_eq!(s.miss_rate, 0.0),
            StrategyKind::Offload => assert!(s.miss_rate > 0.0 && s.cpu_per_layer == 0.0),
            StrategyKind::Cpu => assert!(s.fetched_per_layer == 0.0 && s.cpu_per_layer > 0.0),
            StrategyKind::Hybrid => assert!(s.fetched_per_layer > 0.0 && s.cpu_per_layer > 0.0),
            StrategyKind::LayerSplit => {
                assert!(s.fetched_per_layer == 0.0 && s.cpu_per_layer > 0.0);
                // The first two layers on the CPU, the others all hits.
                for r in &run.records {
                    for (l, lr) in r.layers.iter().enumerate() {
                        assert_eq!((lr.counts.hits == 0, lr.counts.cpu > 0), (l < 2, l < 2));
                    }
                }
            }
            StrategyKind::LayerSplitCached => {
                assert!(s.fetched_per_layer > 0.0 && s.cpu_per_layer > 0.0);
                for r in &run.records {
                    for lr in &r.layers[..2] {
                        assert_eq!((lr.counts.hits, lr.counts.fetched), (0, 0));
                    }
                    assert!(r.layers[2..].iter().all(|lr| lr.counts.cpu == 0));
                }
            }
        }
    }
}

fn offload_and_resident_match_the_f64_reference(d: &Device) {
    let model = tiny();
    let streams = 2;
    let steps = routing_for(&model, streams, 3);
    for strategy in [
        Strategy::Offload,
        Strategy::Resident,
        layer_split(2),
        layer_split_cached(3),
        layer_split(6),
    ] {
        let mut cfg = config(strategy, 12, streams);
        // f32 on both sides: the CPU layers compare at the GPU's tolerance.
        cfg.cpu_path = ActivationPath::F32;
        let mut engine = Engine::new(d, &model, &cfg, None).unwrap();
        let run = decode(&mut engine, &[], &steps, &options(), &mut |_, _| {}).unwrap();
        for (i, (out, routing)) in run.outputs.iter().zip(&steps).enumerate() {
            let inputs: Vec<Vec<f32>> = (0..streams)
                .map(|s| token_input(3, s, i as u64, model.geometry.hidden))
                .collect();
            let want = reference_forward(
                &model,
                engine.bank(),
                routing,
                &inputs,
                engine.weight_scale(),
            )
            .unwrap();
            let err = rel_l2_to_reference(out, &want);
            // f32 kernels against f64: a few ulps per layer.
            assert!(err < 1e-5, "{strategy} step {i}: relative deviation {err}");
            // And the experts did contribute: the output is not the input.
            let moved: f64 = out[0]
                .iter()
                .zip(&inputs[0])
                .map(|(a, b)| (a - b).abs() as f64)
                .sum();
            assert!(moved > 1e-3, "{strategy}: outputs equal inputs");
        }
    }
}

fn hybrid_w4a8_is_bit_identical_fresh_and_warmed(d: &Device) {
    let model = tiny();
    let streams = 2;
    let all = routing_for(&model, streams, 7);
    let (warm, request) = all.split_at(3);
    let mut cfg = config(hybrid(0.4), 40, streams);
    cfg.gpu_path = ActivationPath::Int8;
    let mut engine = Engine::new(d, &model, &cfg, None).unwrap();
    let warmed = decode(&mut engine, warm, request, &options(), &mut |_, _| {}).unwrap();
    engine.reset_cache().unwrap();
    let fresh = decode(&mut engine, &[], request, &options(), &mut |_, _| {}).unwrap();
    // The cache histories differ, so placements differ...
    let placements = |r: &ft_runtime::engine::Decoded| {
        r.records
            .iter()
            .filter(|s| !s.warmup)
            .map(|s| (s.totals.hits, s.totals.cpu))
            .collect::<Vec<_>>()
    };
    assert_ne!(
        placements(&warmed),
        placements(&fresh),
        "the test needs different placements"
    );
    // ...and the outputs do not.
    let dev = Deviation::between("fresh vs warmed", &fresh.outputs, &warmed.outputs);
    assert!(dev.bit_identical, "{dev:?}");

    // The fast combine order sums in placement order: the same kernels, other bits.
    let mut fast = cfg.clone();
    fast.combine = CombineOrder::Fast;
    let mut ef = Engine::new(d, &model, &fast, None).unwrap();
    let fast_warm = decode(&mut ef, warm, request, &options(), &mut |_, _| {}).unwrap();
    ef.reset_cache().unwrap();
    let fast_fresh = decode(&mut ef, &[], request, &options(), &mut |_, _| {}).unwrap();
    let dev = Deviation::between(
        "fast: fresh vs warmed",
        &fast_fresh.outputs,
        &fast_warm.outputs,
    );
    assert!(!dev.bit_identical && dev.max_rel_l2 < 1e-5, "{dev:?}");

    // Offload with int8 on the GPU computes the same pairs the same way: bit-identical too.
    engine.set_strategy(Strategy::Offload).unwrap();
    let offload = decode(&mut engine, warm, request, &options(), &mut |_, _| {}).unwrap();
    let dev = Deviation::between("hybrid vs offload", &warmed.outputs, &offload.outputs);
    assert!(dev.bit_identical, "{dev:?}");

    // With f32 on the GPU and int8 on the CPU, hybrid deviates from offload by the
    // activation quantization, and the fast combine order depends on placement.
    let mut cfg32 = config(hybrid(0.4), 40, streams);
    cfg32.combine = CombineOrder::Fast;
    let mut e32 = Engine::new(d, &model, &cfg32, None).unwrap();
    let h32 = decode(&mut e32, warm, request, &options(), &mut |_, _| {}).unwrap();
    e32.set_strategy(Strategy::Offload).unwrap();
    let o32 = decode(&mut e32, warm, request, &options(), &mut |_, _| {}).unwrap();
    let dev = Deviation::between(
        "hybrid(f32/int8) vs offload(f32)",
        &h32.outputs,
        &o32.outputs,
    );
    assert!(
        !dev.bit_identical && dev.max_rel_l2 > 1e-6 && dev.max_rel_l2 < 5e-2,
        "{dev:?}"
    );
}

/// With int8 activations on both sides every placement computes the same bits: layer split
/// (resident and cached) decodes exactly what offload decodes. Its resident slots are its
/// own: an engine switches between cached strategies but not into or out of layer split.
fn layer_split_decodes_offloads_bits(d: &Device) {
    let model = tiny();
    let streams = 2;
    let all = routing_for(&model, streams, 5);
    let (warm, request) = all.split_at(2);
    let int8 = |strategy| {
        let mut cfg = config(strategy, 30, streams);
        cfg.gpu_path = ActivationPath::Int8;
        cfg
    };
    let mut off = Engine::new(d, &model, &int8(Strategy::Offload), None).unwrap();
    let want = decode(&mut off, warm, request, &options(), &mut |_, _| {}).unwrap();
    for strategy in [layer_split(0), layer_split(3), layer_split_cached(4)] {
        let mut engine = Engine::new(d, &model, &int8(strategy), None).unwrap();
        let got = decode(&mut engine, warm, request, &options(), &mut |_, _| {}).unwrap();
        let dev = Deviation::between(
            format!("{strategy} vs offload"),
            &got.outputs,
            &want.outputs,
        );
        assert!(dev.bit_identical, "{dev:?}");
    }
    // layer-split-cached shares offload's slots; layer split's resident layers do not.
    off.set_strategy(layer_split_cached(2)).unwrap();
    let e = off.set_strategy(layer_split(2)).unwrap_err().to_string();
    assert!(e.contains("resident slots"), "{e}");
    let mut ls = Engine::new(d, &model, &int8(layer_split(2)), None).unwrap();
    assert_eq!(ls.resident_slots(), 4 * 24);
    ls.set_strategy(layer_split(2)).unwrap();
    assert!(ls.set_strategy(layer_split(3)).is_err());
    // N unresolved or past the layers: refused, naming the flag.
    let auto = Strategy::LayerSplit {
        cpu_layers: CpuLayers::Auto,
    };
    for s in [auto, layer_split(7)] {
        let e = Engine::new(d, &model, &int8(s), None)
            .unwrap_err()
            .to_string();
        assert!(e.contains("--strategy"), "{e}");
    }
}

fn cpu_and_hybrid_at_zero_agree(d: &Device) {
    let model = tiny();
    let steps = routing_for(&model, 2, 4);
    let mut outs = Vec::new();
    for strategy in [Strategy::Cpu, hybrid(0.0)] {
        let mut engine = Engine::new(d, &model, &config(strategy, 8, 2), None).unwrap();
        let run = decode(
            &mut engine,
            &steps[..1],
            &steps[1..],
            &options(),
            &mut |_, _| {},
        )
        .unwrap();
        assert!(run.records.iter().all(|r| r.totals.fetched == 0));
        outs.push(run);
    }
    let dev = Deviation::between("cpu vs hybrid(0)", &outs[0].outputs, &outs[1].outputs);
    assert!(dev.bit_identical, "{dev:?}");
    for (a, b) in outs[0].records.iter().zip(&outs[1].records) {
        assert_eq!(a.totals, b.totals);
    }
}

/// Decode `steps` on a new engine of `cfg`, the first two as warm-up.
fn decode_two_warm(
    d: &Device,
    model: &ModelSpec,
    cfg: &EngineConfig,
    steps: &[StepRouting],
) -> ft_runtime::engine::Decoded {
    let mut engine = Engine::new(d, model, cfg, None).unwrap();
    decode(
        &mut engine,
        &steps[..2],
        &steps[2..],
        &options(),
        &mut |_, _| {},
    )
    .unwrap()
}

/// Keep the first run in `base`; every later one must have its outputs bit for bit and its
/// counts.
fn same_as_first(
    base: &mut Option<ft_runtime::engine::Decoded>,
    run: ft_runtime::engine::Decoded,
    what: &str,
) {
    match base {
        None => *base = Some(run),
        Some(b) => {
            let dev = Deviation::between(what, &b.outputs, &run.outputs);
            assert!(dev.bit_identical, "{dev:?}");
            for (x, y) in b.records.iter().zip(&run.records) {
                assert_eq!(x.totals, y.totals, "{what}");
            }
        }
    }
}

fn cpu_layers_decode_the_same_bits_in_every_pool_wait(d: &Device) {
    // The host queues a CPU layer's remaining GPU work while it waits and beside the CPU
    // share: the same work on the same streams in the same order per stream whichever way
    // the pool waits, so the same placements and outputs.
    let model = tiny();
    let streams = 3;
    let steps = routing_for(&model, streams, 5);
    for strategy in [hybrid(0.5), Strategy::Cpu, hybrid(1.0)] {
        let mut base: Option<ft_runtime::engine::Decoded> = None;
        for (pool_wait, threads) in [
            (PoolWait::Park, 1),
            (PoolWait::Spin, 2),
            (PoolWait::SpinBeside, 1),
        ] {
            let cfg = EngineConfig {
                pool_wait,
                threads,
                gpu_path: ActivationPath::Int8,
                ..config(strategy, 20, streams)
            };
            let run = decode_two_warm(d, &model, &cfg, &steps);
            let what = format!("{strategy} {pool_wait:?}");
            // Every CPU layer's share ran after its wait, on the CPU lane.
            for r in run.records.iter().filter(|r| !r.warmup) {
                for l in &r.layers {
                    assert_eq!(l.cpu_busy_us > 0.0, l.counts.cpu > 0, "{what}: {l:?}");
                }
            }
            same_as_first(&mut base, run, &what);
        }
    }
}

fn fetch_chunks_and_gathers_decode_the_same_bits(d: &Device) {
    // The fetched experts in 1 to 4 chunks, gathered by the copy engine (the last chunk's
    // launch gated on a flag) or by zero-copy reads (behind its event): the same operations
    // on the same buffers in the same dependency order, so the same outputs bit for bit and
    // the same counts. Offload folds every layer's combine into its last chunk's launch;
    // hybrid mixes layers with a CPU share (never folded) and without; with and without the
    // timeline's events.
    let model = tiny();
    let streams = 3;
    let steps = routing_for(&model, streams, 5);
    for strategy in [Strategy::Offload, hybrid(0.75), Strategy::Resident] {
        let mut base: Option<ft_runtime::engine::Decoded> = None;
        for timeline in [true, false] {
            for gather in [GatherMethod::CopyEngine, GatherMethod::ZeroCopy] {
                for fetch_chunks in 1..=ft_model::plan::MAX_FETCH_CHUNKS {
                    let cfg = EngineConfig {
                        settings: EngineSettings { fetch_chunks },
                        gather,
                        timeline,
                        gpu_path: ActivationPath::Int8,
                        ..config(strategy, 12, streams)
                    };
                    let run = decode_two_warm(d, &model, &cfg, &steps);
                    let what = format!("{strategy} {gather} {fetch_chunks} chunks {timeline}");
                    if timeline
                        && strategy != Strategy::Resident
                        && gather == GatherMethod::CopyEngine
                    {
                        // The gathers and the fetched experts are on the timeline.
                        let fetched: u64 =
                            run.records.iter().map(|r| r.totals.fetched as u64).sum();
                        assert!(fetched > 0, "{what}");
                        assert!(run.records.iter().any(|r| r.pcie_busy_us > 0.0), "{what}");
                    }
                    same_as_first(&mut base, run, &what);
                }
            }
        }
    }
    let cfg = EngineConfig {
        settings: EngineSettings { fetch_chunks: 0 },
        ..config(Strategy::Offload, 12, 1)
    };
    let e = Engine::new(d, &model, &cfg, None).unwrap_err().to_string();
    assert!(e.contains("--fetch-chunks"), "{e}");
    // A gate holds multiprocessors a zero-copy gather's kernel would need: not gated there.
    for (gather, gated) in [
        (GatherMethod::CopyEngine, true),
        (GatherMethod::ZeroCopy, false),
    ] {
        let cfg = EngineConfig {
            gather,
            ..config(Strategy::Offload, 12, 1)
        };
        let engine = Engine::new(d, &model, &cfg, None).unwrap();
        assert_eq!(engine.gates_last_chunk(), gated, "{gather}");
    }
}

fn chrome_trace_has_a_lane_per_resource(d: &Device) {
    let model = tiny();
    let steps = routing_for(&model, 2, 2);
    let mut engine = Engine::new(d, &model, &config(hybrid(0.5), 8, 2), None).unwrap();
    let run = decode(&mut engine, &[], &steps, &options(), &mut |_, _| {}).unwrap();
    let mut trace = ChromeTrace::new("ft run test");
    trace.add_spans(&run.spans);
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("trace.json");
    trace.write(&path).unwrap();
    let v: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
    let events = v["traceEvents"].as_array().unwrap();
    for lane in Lane::ALL {
        let slices = events
            .iter()
            .filter(|e| e["ph"] == "X" && e["tid"] == lane.tid())
            .count();
        assert!(slices > 0, "no slice on lane {}", lane.label());
    }
    // Slices are well formed: non-negative durations, step and layer arguments.
    for e in events.iter().filter(|e| e["ph"] == "X") {
        assert!(e["dur"].as_f64().unwrap() >= 0.0);
        assert!(e["args"]["layer"].as_u64().unwrap() < 6);
    }
    // The device's spans sit on the host's axis: none starts before its step did (a device
    // clock placed tens of microseconds early put routers before the host had queued them).
    for sp in &run.spans {
        let step = run.records.iter().find(|r| r.step == sp.step).unwrap();
        let start_ns = step.start_us * 1e3;
        assert!(
            sp.start_ns as f64 >= start_ns - 1e3,
            "{:?} {:?} of layer {} starts {:.1} us before step {}",
            sp.lane,
            sp.kind,
            sp.layer,
            (start_ns - sp.start_ns as f64) / 1e3,
            sp.step
        );
    }
}

fn bad_inputs_are_errors_naming_them(d: &Device) {
    let model = tiny();
    let auto = Strategy::Hybrid {
        fetch: FetchFraction::Auto,
    };
    let e = Engine::new(d, &model, &config(auto, 8, 1), None)
        .unwrap_err()
        .to_string();
    assert!(e.contains("--fetch-fraction"), "{e}");
    let mut engine = Engine::new(d, &model, &config(Strategy::Offload, 8, 1), None).unwrap();
    let steps = routing_for(&model, 2, 1);
    let e = decode(&mut engine, &[], &steps, &options(), &mut |_, _| {})
        .unwrap_err()
        .to_string();
    assert!(e.contains("streams"), "{e}");
    let mut bf = model.clone();
    bf.format = ExpertFormat::Bf16;
    let mut cfg = config(Strategy::Offload, 8, 1);
    cfg.gpu_path = ActivationPath::Int8;
    let e = Engine::new(d, &bf, &cfg, None).unwrap_err().to_string();
    assert!(e.contains("--gpu-act"), "{e}");
    let e = Engine::new(d, &model, &config(Strategy::Resident, 0, 1), None)
        .and_then(|mut en| en.set_strategy(Strategy::Offload))
        .unwrap_err()
        .to_string();
    assert!(e.contains("resident"), "{e}");
}

/// One `#[test]` per body on the host device, and an ignored CUDA twin.
macro_rules! on_devices {
    ($($body:ident),* $(,)?) => {
        mod host {
            $(#[test]
            fn $body() {
                super::$body(&super::device());
            })*
        }
        #[cfg(feature = "cuda")]
        mod cuda {
            $(#[test]
            #[ignore = "needs an NVIDIA GPU (run on the GPU machine)"]
            fn $body() {
                super::$body(&ft_runtime::device::Device::cuda(0).expect("a CUDA device"));
            })*
        }
    };
}

/// `DecodeOptions::block_stamps`: the last measured step's block timelines. The host device
/// runs no CUDA kernels and says so; on CUDA, with the timelines compiled in, the step's
/// expert launches come back (gate/up and down blocks, each in order), and nothing where
/// the option is off.
fn block_timelines_of_the_last_step(d: &Device) {
    let model = tiny();
    let steps = routing_for(&model, 2, 4);
    let cfg = config(Strategy::Offload, 12, 2);
    let stamped = DecodeOptions {
        block_stamps: true,
        ..options()
    };
    let Some(opened) = d.cuda_tuning() else {
        let mut e = Engine::new(d, &model, &cfg, None).unwrap();
        let err = decode(&mut e, &steps[..2], &steps[2..], &stamped, &mut |_, _| {})
            .unwrap_err()
            .to_string();
        assert!(err.contains("block stamps"), "{err}");
        return;
    };
    d.set_cuda_tuning(ft_runtime::device::CudaTuning {
        block_stamps: true,
        ..opened
    })
    .unwrap();
    let mut e = Engine::new(d, &model, &cfg, None).unwrap();
    let run = decode(&mut e, &steps[..2], &steps[2..], &stamped, &mut |_, _| {}).unwrap();
    let plain = decode(&mut e, &steps[..2], &steps[2..], &options(), &mut |_, _| {}).unwrap();
    d.set_cuda_tuning(opened).unwrap();
    let stamps = run.stamps.expect("the last step's timelines");
    assert!(plain.stamps.is_none());
    assert!(!stamps.records.is_empty() && stamps.dropped == 0);
    for r in &stamps.records {
        assert!(r.entry_ns <= r.exit_ns, "{r:?}");
    }
    let launches = ft_runtime::block_stamps::launches(&stamps.records);
    assert!(!launches.is_empty());
}

on_devices!(
    block_timelines_of_the_last_step,
    every_strategy_matches_plan_layer_counts,
    offload_and_resident_match_the_f64_reference,
    hybrid_w4a8_is_bit_identical_fresh_and_warmed,
    cpu_and_hybrid_at_zero_agree,
    layer_split_decodes_offloads_bits,
    cpu_layers_decode_the_same_bits_in_every_pool_wait,
    fetch_chunks_and_gathers_decode_the_same_bits,
    chrome_trace_has_a_lane_per_resource,
    bad_inputs_are_errors_naming_them,
);

/// On the GPU machine: the fixed-cost probe and a few decode steps of qwen3.8-flash-next's
/// geometry (8 layers) per strategy, printed for the record
/// (`cargo test -p ft-runtime --release --features cuda --test engine -- --ignored --nocapture cuda_perf`).
#[cfg(feature = "cuda")]
#[test]
#[ignore = "needs an NVIDIA GPU (run on the GPU machine)"]
fn cuda_perf_smoke() {
    use ft_runtime::engine::probe::probe_hybrid_overhead;
    let d = Device::cuda(0).expect("a CUDA device");
    let threads = std::thread::available_parallelism().map_or(2, |n| n.get()) - 1;
    for wait in [PoolWait::Spin, PoolWait::Park] {
        let r = probe_hybrid_overhead(&d, threads, wait).unwrap();
        println!("probe {wait:?}: {r:?}");
        assert!(r.cpu_layer_us > 0.0);
    }
    let model = ModelSpec::preset("qwen3.8-flash-next")
        .unwrap()
        .with_layers(8);
    let total = model.geometry.total_experts() as usize;
    for streams in [1usize, 8] {
        let steps = {
            let mut src = routing::resolve("typical", &model.geometry, Some(1)).unwrap();
            draw_routing(src.as_mut(), streams, 24).unwrap()
        };
        for (strategy, combine) in [
            (Strategy::Offload, CombineOrder::Fast),
            (Strategy::Offload, CombineOrder::Fixed),
            (hybrid(0.5), CombineOrder::Fast),
            (hybrid(0.25), CombineOrder::Fast),
            (Strategy::Resident, CombineOrder::Fast),
            (Strategy::Cpu, CombineOrder::Fast),
        ] {
            let mut cfg = config(strategy, total / 4, streams);
            cfg.max_context = 2048;
            cfg.threads = threads;
            cfg.pool_wait = PoolWait::Spin;
            cfg.combine = combine;
            cfg.reserve_bytes = 1 << 30;
            let mut e = Engine::new(&d, &model, &cfg, None).unwrap();
            let gbs = if strategy.kind() == StrategyKind::Resident {
                0.0
            } else {
                e.measure_linear_h2d_gbs(256 << 20, 5).unwrap()
            };
            let opts = DecodeOptions {
                context: 1024,
                input_seed: 1,
                keep_spans: false,
                keep_outputs: false,
                block_stamps: false,
            };
            let run = decode(&mut e, &steps[..8], &steps[8..], &opts, &mut |_, _| {}).unwrap();
            let s = &run.summary;
            let bound = if gbs > 0.0 {
                s.gathered_bytes_per_step / (gbs * 1e3) / s.step_us.mean
            } else {
                0.0
            };
            let l = model.geometry.moe_layers as f64;
            println!(
                "{strategy} {} b={streams}: {:.1} tok/s/stream, step {:.0} us ({:.1} us/layer), miss {:.0}%, \
                 fetched {:.1} cpu {:.1} /layer, busy/layer gpu {:.1} pcie {:.1} cpu {:.1} wait {:.1} us, \
                 H2D {gbs:.1} GB/s, {:.0}% of PCIe bound",
                combine.name(),
                s.tok_s_per_stream,
                s.step_us.mean,
                s.step_us.mean / l,
                100.0 * s.miss_rate,
                s.fetched_per_layer,
                s.cpu_per_layer,
                s.gpu_busy_us / l,
                s.pcie_busy_us / l,
                s.cpu_busy_us / l,
                s.host_wait_us / l,
                100.0 * bound
            );
            assert!(s.tok_s_total > 0.0);
        }
    }
}

#[test]
fn resident_that_does_not_fit_suggests_fewer_layers() {
    let model = tiny();
    // Room for about two of the six layers' experts.
    let per_layer = 24 * model.expert_bytes().next_multiple_of(256);
    let d = Device::host(HostDeviceConfig {
        memory_bytes: 2 * per_layer + (1 << 20),
        kernel_threads: 1,
        ..Default::default()
    })
    .unwrap();
    let e = Engine::new(&d, &model, &config(Strategy::Resident, 0, 1), None)
        .unwrap_err()
        .to_string();
    assert!(e.contains("resident") && e.contains("--layers"), "{e}");
}
