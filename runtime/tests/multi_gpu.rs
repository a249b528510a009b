//! The engine on G host-emulated devices against the same engine on one: outputs
//! (bit-identical where every expert is computed whole on bit-identical kernels, within an
//! f32 tolerance where tensor parallelism splits an expert's sum), per-GPU cache counts
//! against a naive per-GPU `plan_layer` count, the CPU pool split, each GPU's planned memory
//! against what the engine allocates, and the errors. The `cuda_*` twins run the same on 2
//! or more NVIDIA GPUs (`--features cuda -- --ignored`). `ft run --gpus 2` as a library
//! (`ft_runtime::run`) on the host device: what it passes to the engine and reports.

use ft_kernels::ActivationPath;
use ft_model::cache::{build_cache, CachePolicy};
use ft_model::plan::plan_layer;
use ft_model::routing::{self, StepRouting};
use ft_model::{
    DenseSpec, ExpertFormat, FetchFraction, GpuLayout, GpuPlacement, ModelSpec, MoeGeometry,
    Strategy,
};
use ft_runtime::cpu_pool::PoolWait;
use ft_runtime::device::{Device, DeviceSpec, HostDeviceConfig};
use ft_runtime::engine::{
    decode, draw_routing, BankSource, CombineMethod, CombineOrder, DecodeOptions, Engine,
    EngineConfig, EngineMemory, GpuMemory,
};
use ft_runtime::gather::GatherMethod;
use ft_runtime::numerics::{bit_identical, rel_l2};
use ft_runtime::run::{self, MultiRunReport, NoProgress, RunOutcome, RunRequest};
use ft_runtime::RuntimeError;

/// Relative L2 tolerance of tensor-parallel outputs against the single engine's: the split
/// changes the order of the down projection's sum over the intermediate dimension (G
/// partial sums added at the combine), a few f32 roundings per layer on values of order 1.
const TP_REL_L2_TOL: f64 = 1e-5;

/// Relative L2 tolerance of f32 paths that compute every expert whole (sharded, f32): the
/// same kernels on the same rows, so only a combine of exact zeros separates them.
const F32_REL_L2_TOL: f64 = 1e-6;

/// 4 layers of 24 experts, top-4, nvfp4; intermediate 192 splits into 2 or 3 slices of
/// whole 32-column tiles (CUDA) and 16-column nvfp4 blocks.
fn model() -> ModelSpec {
    ModelSpec {
        name: "tiny-multi".into(),
        format: ExpertFormat::Nvfp4,
        geometry: MoeGeometry {
            hidden: 128,
            intermediate: 192,
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

fn host_spec() -> DeviceSpec {
    DeviceSpec::Host(HostDeviceConfig {
        memory_bytes: 256 << 20,
        kernel_threads: 1,
        ..Default::default()
    })
}

fn config(strategy: Strategy, slots: usize, threads: usize, gpu: ActivationPath) -> EngineConfig {
    EngineConfig {
        strategy,
        cache_slots: slots,
        cache_options: Default::default(),
        max_streams: 3,
        max_context: 64,
        threads,
        pool_wait: PoolWait::Park,
        gpu_path: gpu,
        cpu_path: ActivationPath::Int8,
        combine: CombineOrder::Fixed,
        gather: GatherMethod::CopyEngine,
        seed: 5,
        timeline: true,
        reserve_bytes: 0,
        ..EngineConfig::default()
    }
}

fn hybrid(f: f64) -> Strategy {
    Strategy::Hybrid {
        fetch: FetchFraction::Fixed(f),
    }
}

fn routing_for(m: &ModelSpec, steps: usize) -> Vec<StepRouting> {
    let mut src = routing::resolve("typical", &m.geometry, Some(9)).unwrap();
    draw_routing(src.as_mut(), 3, steps).unwrap()
}

fn options() -> DecodeOptions {
    DecodeOptions {
        context: 8,
        input_seed: 2,
        keep_spans: false,
        keep_outputs: true,
        block_stamps: false,
    }
}

/// The single-GPU engine's measured outputs.
fn single(spec: &DeviceSpec, cfg: &EngineConfig, steps: &[StepRouting]) -> Vec<Vec<Vec<f32>>> {
    let d = Device::open(spec).unwrap();
    let mut e = Engine::new(&d, &model(), cfg, None).unwrap();
    decode(&mut e, &steps[..1], &steps[1..], &options(), &mut |_, _| {})
        .unwrap()
        .outputs
}

fn on_gpus(devs: &[Device], layout: GpuLayout, cfg: &EngineConfig) -> ft_runtime::Result<Engine> {
    Engine::on_gpus(
        devs,
        layout,
        &model(),
        cfg,
        None,
        BankSource::Seed(cfg.seed),
    )
}

fn multi_engine(spec: &DeviceSpec, layout: GpuLayout, cfg: &EngineConfig) -> Engine {
    let devs = Device::open_group(spec, layout.count()).unwrap();
    on_gpus(&devs, layout, cfg).unwrap()
}

fn flat(o: &[Vec<Vec<f32>>]) -> Vec<f32> {
    o.iter().flatten().flatten().copied().collect()
}

fn compare(
    spec: &DeviceSpec,
    gpus: u32,
    placement: GpuPlacement,
    s: Strategy,
    gpu: ActivationPath,
) -> (bool, f64) {
    let steps = routing_for(&model(), 4);
    let want = single(spec, &config(s, 10, 1, gpu), &steps);
    let layout = GpuLayout::new(gpus, placement).unwrap();
    let mut m = multi_engine(spec, layout, &config(s, 6, gpus as usize, gpu));
    let got = decode(&mut m, &steps[..1], &steps[1..], &options(), &mut |_, _| {})
        .unwrap()
        .outputs;
    assert_eq!(got.len(), want.len());
    let (a, b) = (flat(&got), flat(&want));
    assert!(a.iter().all(|v| v.is_finite()));
    (bit_identical(&a, &b), rel_l2(&a, &b))
}

/// Both combine orders, and layers whose fetched experts come in several chunks
/// (`fetch_chunk_bounds`: 3 or more fetched experts), which both engines compute alike.
fn one_gpu_is_the_single_engine_exactly(spec: &DeviceSpec) {
    let steps = routing_for(&model(), 4);
    let orders = [CombineOrder::Fixed, CombineOrder::Fast];
    for (s, combine) in [Strategy::Offload, hybrid(0.5), Strategy::Cpu]
        .into_iter()
        .flat_map(|s| orders.map(|o| (s, o)))
    {
        for gpu in [ActivationPath::F32, ActivationPath::Int8] {
            let cfg = EngineConfig {
                combine,
                ..config(s, 8, 1, gpu)
            };
            let d = Device::open(spec).unwrap();
            let mut e = Engine::new(&d, &model(), &cfg, None).unwrap();
            let want =
                decode(&mut e, &steps[..1], &steps[1..], &options(), &mut |_, _| {}).unwrap();
            let most_fetched = want
                .records
                .iter()
                .flat_map(|r| &r.layers)
                .map(|l| l.counts.fetched)
                .max()
                .unwrap_or(0);
            if s == Strategy::Offload {
                assert!(
                    most_fetched >= 3,
                    "a layer in several chunks: {most_fetched}"
                );
            }
            for p in [GpuPlacement::Sharded, GpuPlacement::TensorParallel] {
                let mut m = multi_engine(spec, GpuLayout::new(1, p).unwrap(), &cfg);
                let got =
                    decode(&mut m, &steps[..1], &steps[1..], &options(), &mut |_, _| {}).unwrap();
                assert!(
                    bit_identical(&flat(&got.outputs), &flat(&want.outputs)),
                    "{s} {gpu:?} {p:?} {combine:?}"
                );
                assert_eq!(
                    m.cache_of(0).unwrap().stats(),
                    e.cache().stats(),
                    "{s} {p:?}"
                );
                assert_eq!(m.combine_method(), CombineMethod::None);
                let c = got.gpu_counts()[0];
                let rec_hits: u64 = want
                    .records
                    .iter()
                    .filter(|r| !r.warmup)
                    .flat_map(|r| &r.layers)
                    .map(|l| l.counts.hits as u64)
                    .sum();
                assert_eq!(c.hits, rec_hits, "{s}");
                assert_eq!(c.combine_bytes, 0);
            }
        }
    }
}

fn sharded_matches_the_single_engine(spec: &DeviceSpec) {
    for gpus in [2, 3] {
        // W4A8 everywhere: every expert computed whole by bit-identical kernels.
        for s in [Strategy::Offload, hybrid(0.5), Strategy::Cpu] {
            let (same, err) = compare(spec, gpus, GpuPlacement::Sharded, s, ActivationPath::Int8);
            assert!(
                same,
                "sharded G={gpus} {s} W4A8 not bit-identical (rel L2 {err:e})"
            );
        }
        let (_, err) = compare(
            spec,
            gpus,
            GpuPlacement::Sharded,
            Strategy::Offload,
            ActivationPath::F32,
        );
        assert!(
            err <= F32_REL_L2_TOL,
            "sharded G={gpus} f32: rel L2 {err:e}"
        );
    }
}

fn tensor_parallel_matches_the_single_engine(spec: &DeviceSpec) {
    for gpus in [2, 3] {
        for s in [Strategy::Offload, hybrid(0.5)] {
            let (_, err) = compare(
                spec,
                gpus,
                GpuPlacement::TensorParallel,
                s,
                ActivationPath::F32,
            );
            assert!(err <= TP_REL_L2_TOL, "TP G={gpus} {s}: rel L2 {err:e}");
            assert!(
                err > 0.0 || gpus == 1,
                "a TP split that changes nothing is suspicious"
            );
        }
    }
}

/// Naive reference: one cache per GPU, `plan_layer` on `routes_on(g)` layer by layer.
fn per_gpu_counts_match_a_naive_count(spec: &DeviceSpec) {
    /// Slots per GPU: room for some reuse across steps (4 layers x 24 experts in all).
    const SLOTS: usize = 40;
    let m = model();
    let steps = routing_for(&m, 5);
    for (gpus, p) in [
        (2, GpuPlacement::Sharded),
        (3, GpuPlacement::Sharded),
        (2, GpuPlacement::TensorParallel),
    ] {
        for (s, f) in [(Strategy::Offload, 1.0), (hybrid(0.5), 0.5)] {
            let layout = GpuLayout::new(gpus, p).unwrap();
            let cfg = config(s, SLOTS, gpus as usize, ActivationPath::F32);
            let mut e = multi_engine(spec, layout, &cfg);
            let got = decode(&mut e, &steps[..1], &steps[1..], &options(), &mut |_, _| {}).unwrap();
            let counts = got.gpu_counts();
            for g in 0..gpus {
                let mut cache =
                    build_cache(s.kind(), &CachePolicy::Lru, &m.geometry, SLOTS, None).unwrap();
                let (mut hits, mut misses, mut fetched, mut cpu) = (0u64, 0u64, 0u64, 0u64);
                for (i, step) in steps.iter().enumerate() {
                    for (l, routes) in step.layers.iter().enumerate() {
                        let plan = plan_layer(l, &layout.routes_on(g, routes), &mut cache, f);
                        if i > 0 {
                            hits += plan.hits.len() as u64;
                            misses += plan.misses() as u64;
                            fetched += plan.link_experts() as u64;
                            cpu += plan.cpu.len() as u64;
                        }
                    }
                }
                let c = counts[g as usize];
                assert!(hits > 0 && misses > 0, "a count test needs hits and misses");
                assert_eq!(
                    (c.hits, c.misses, c.fetched),
                    (hits, misses, fetched),
                    "G{g} {p:?} {s}"
                );
                if p == GpuPlacement::Sharded {
                    assert_eq!(c.cpu, cpu, "G{g} {s}");
                }
                assert_eq!(e.cache_of(g as usize).unwrap().stats(), cache.stats());
                let per = e.expert_bytes_per_gpu() as u64;
                assert_eq!(c.gathered_bytes, c.fetched * per);
                // A slice's true size: down's per-row scales are not split, so it is a
                // little more than `GpuLayout::bytes_per_gpu`'s `expert_bytes / G`.
                let sliced = match p {
                    GpuPlacement::Sharded => m.expert_bytes(),
                    GpuPlacement::TensorParallel => MoeGeometry {
                        intermediate: m.geometry.intermediate / gpus as usize,
                        ..m.geometry
                    }
                    .expert_bytes(m.format),
                };
                assert_eq!(per, sliced);
                assert!(per >= layout.bytes_per_gpu(m.expert_bytes()));
                assert_eq!(
                    c.combine_bytes,
                    (steps.len() - 1) as u64
                        * m.geometry.moe_layers as u64
                        * layout.combine_bytes_per_gpu(3 * m.geometry.top_k, m.geometry.hidden)
                );
            }
            if p == GpuPlacement::TensorParallel {
                // The CPU experts of the (identical) plans are dealt out over the GPUs.
                let total_cpu: u64 = counts.iter().map(|c| c.cpu).sum();
                let per_gpu_misses_cpu = counts[0].misses - counts[0].fetched;
                assert_eq!(total_cpu, per_gpu_misses_cpu, "{s}");
            }
        }
    }
}

fn cpu_workers_are_disjoint_per_gpu(spec: &DeviceSpec) {
    for (gpus, threads) in [(2u32, 2usize), (3, 5), (3, 7)] {
        let layout = GpuLayout::new(gpus, GpuPlacement::Sharded).unwrap();
        let e = multi_engine(
            spec,
            layout,
            &config(hybrid(0.5), 6, threads, ActivationPath::F32),
        );
        let ranges = e.cpu_workers();
        let mut seen = vec![0; threads];
        for r in &ranges {
            assert!(!r.is_empty());
            for w in r.clone() {
                seen[w] += 1;
            }
        }
        assert!(seen.iter().all(|&c| c == 1), "{ranges:?}");
        let lens: Vec<usize> = ranges.iter().map(|r| r.len()).collect();
        assert_eq!(e.pool_threads(), lens);
    }
}

fn bad_layouts_are_clear_errors(spec: &DeviceSpec) {
    let e = Device::open_group(spec, 0).unwrap_err().to_string();
    assert!(e.contains("--gpus"), "{e}");
    let devs = Device::open_group(spec, 2).unwrap();
    let cfg = config(Strategy::Offload, 6, 2, ActivationPath::F32);
    let three = GpuLayout::new(3, GpuPlacement::Sharded).unwrap();
    let e = on_gpus(&devs, three, &cfg).unwrap_err().to_string();
    assert!(e.contains("--gpus"), "{e}");
    // 192 columns do not split into 5 equal slices.
    let devs5 = Device::open_group(spec, 5).unwrap();
    let tp5 = GpuLayout::new(5, GpuPlacement::TensorParallel).unwrap();
    let e = on_gpus(&devs5, tp5, &cfg).unwrap_err().to_string();
    assert!(e.contains("tensor-parallel") && e.contains("192"), "{e}");
    // A CPU share needs a worker per GPU.
    let two = GpuLayout::new(2, GpuPlacement::Sharded).unwrap();
    let e = on_gpus(&devs, two, &config(hybrid(0.5), 6, 1, ActivationPath::F32))
        .unwrap_err()
        .to_string();
    assert!(e.contains("--threads"), "{e}");
    // The engine settings the single-GPU engine checks.
    let bad = EngineConfig {
        settings: ft_runtime::engine::EngineSettings { fetch_chunks: 0 },
        ..cfg.clone()
    };
    let e = on_gpus(&devs, two, &bad).unwrap_err().to_string();
    assert!(e.contains("--fetch-chunks"), "{e}");
}

macro_rules! both {
    ($($body:ident),* $(,)?) => {
        mod host {
            $(#[test]
            fn $body() {
                super::$body(&super::host_spec());
            })*
        }
        #[cfg(feature = "cuda")]
        mod cuda {
            $(#[test]
            #[ignore = "needs 2 or more NVIDIA GPUs"]
            fn $body() {
                super::$body(&ft_runtime::device::DeviceSpec::Cuda { ordinal: 0 });
            })*
        }
    };
}

both!(
    one_gpu_is_the_single_engine_exactly,
    sharded_matches_the_single_engine,
    tensor_parallel_matches_the_single_engine,
    per_gpu_counts_match_a_naive_count,
    cpu_workers_are_disjoint_per_gpu,
);

#[test]
fn bad_layouts_are_clear_errors_on_the_host_device() {
    bad_layouts_are_clear_errors(&host_spec());
}

#[test]
fn host_buffers_are_shared_within_a_group_only() {
    let group = Device::open_group(&host_spec(), 2).unwrap();
    let mut hb = group[0].alloc_host(64, "shared").unwrap();
    hb.write_f32(0, &[1.0, 2.0, 3.0]).unwrap();
    let db = group[1].alloc(64, "on device 1").unwrap();
    let s = group[1].new_stream("copy").unwrap();
    s.copy_h2d(&hb, 0, &db, 0, 12).unwrap();
    assert_eq!(s.download_f32(&db, 0, 3).unwrap(), vec![1.0, 2.0, 3.0]);
    assert_eq!(group[1].info().ordinal, 1);
    let other = Device::open(&host_spec()).unwrap();
    let so = other.new_stream("copy").unwrap();
    let dbo = other.alloc(64, "elsewhere").unwrap();
    let e = so.copy_h2d(&hb, 0, &dbo, 0, 12).unwrap_err();
    assert!(matches!(e, RuntimeError::DeviceMismatch { .. }), "{e}");
}

/// Without a GPU (or without CUDA compiled in) asking for CUDA GPUs is an error, not a panic.
#[test]
fn cuda_groups_without_enough_gpus_are_errors() {
    if ft_runtime::cuda_available() {
        let n = ft_runtime::device::cuda_device_count().unwrap();
        let e = Device::open_group(&DeviceSpec::Cuda { ordinal: 0 }, n + 1).unwrap_err();
        assert!(
            e.to_string()
                .contains(&format!("asked for {} GPUs, found {n}", n + 1)),
            "{e}"
        );
    } else {
        let e = Device::open_group(&DeviceSpec::Cuda { ordinal: 0 }, 2).unwrap_err();
        assert!(matches!(e, RuntimeError::CudaUnavailable { .. }), "{e}");
    }
}

/// On 2 or more GPUs the combine runs through NCCL where the library loads.
#[cfg(feature = "cuda")]
#[test]
#[ignore = "needs 2 or more NVIDIA GPUs"]
fn cuda_combine_reports_its_method() {
    let spec = DeviceSpec::Cuda { ordinal: 0 };
    let layout = GpuLayout::new(2, GpuPlacement::Sharded).unwrap();
    let e = multi_engine(
        &spec,
        layout,
        &config(Strategy::Offload, 6, 2, ActivationPath::F32),
    );
    assert_ne!(e.combine_method(), CombineMethod::None);
    eprintln!("combine: {}", e.combine_method().name());
}

/// The tiny model of the `ft run --gpus N` tests, as a model TOML (what `--model` reads): the
/// one the CLI tests decode (`tests/common`).
const RUN_MODEL: &str = include_str!("../../tests/fixtures/tiny-run-model.toml");

/// `ft run --device host --gpus 2 --strategy STRATEGY` on [`RUN_MODEL`] (written into
/// `dir`): 2 streams, 4 steps after 2 warm-up, 12 cache slots per GPU, context 16, 2 CPU
/// workers.
fn run_request(dir: &std::path::Path, strategy: &str) -> RunRequest {
    let model = dir.join("tiny.toml");
    std::fs::write(&model, RUN_MODEL).unwrap();
    RunRequest {
        model: model.to_str().unwrap().into(),
        strategy: Some(strategy.into()),
        interleave: Vec::new(),
        fetch_fraction: None,
        host: None,
        no_cpu_check: false,
        streams: 2,
        steps: 4,
        warmup: 2,
        cache_slots: Some(12),
        cache_gb: None,
        cache_options: Default::default(),
        routing: "typical".into(),
        record: None,
        context: 16,
        threads: Some(2),
        device: "host".into(),
        layers: None,
        seed: 3,
        trace_out: None,
        stamps_out: None,
        compare_numerics: false,
        gpu_act: None,
        cpu_act: None,
        combine: "fixed".into(),
        gather: "copy-engine".into(),
        pool_wait: None,
        engine: Default::default(),
        link_gbps: None,
        no_timeline: false,
        repeat: 1,
        probe_overhead: false,
        gpus: 2,
        placement: "sharded".into(),
    }
}

fn run_multi(req: &RunRequest) -> ft_runtime::run::Result<MultiRunReport> {
    match run::run(req, &mut NoProgress)? {
        RunOutcome::Multi(r) => Ok(*r),
        other => panic!("--gpus {} ran as {other:?}", req.gpus),
    }
}

/// A static-hot cache without a hot list takes its hot set from the routing's popularity:
/// `ft run --gpus 2` passes it to the engine as one GPU's run does, each GPU taking the
/// experts it holds, so every GPU hits from its first step.
#[test]
fn a_run_on_two_gpus_passes_the_routing_popularity() {
    let dir = tempfile::tempdir().unwrap();
    let mut req = run_request(dir.path(), "offload");
    req.cache_options.policy = CachePolicy::StaticHot { hot: Vec::new() };
    let r = run_multi(&req).unwrap();
    assert_eq!(r.per_gpu.len(), 2);
    for g in &r.per_gpu {
        assert!(g.counts.hits > 0, "GPU {}: no hits from its hot set", g.gpu);
        assert!(g.counts.fetched > 0, "GPU {}: the rest is fetched", g.gpu);
    }
}

/// Each GPU's memory in the report is the engine's placement on the layout, not one GPU's:
/// sharded, each GPU holds half of layer split's resident layers; under tensor parallelism
/// each slot holds a slice.
#[test]
fn a_run_on_two_gpus_reports_each_gpus_memory() {
    let dir = tempfile::tempdir().unwrap();
    // 2 of 4 layers on the CPU: 2 resident layers of 16 experts, 8 on each GPU.
    let r = run_multi(&run_request(dir.path(), "layer-split:2")).unwrap();
    let whole = r.per_gpu[0].memory;
    for g in &r.per_gpu {
        assert_eq!(g.memory.resident_slots, 2 * 8, "GPU {}", g.gpu);
        assert_eq!(g.memory.cache_slots + g.memory.staging_slots, 0);
        // Every GPU holds the whole dense part and every stream's KV (4 layers, 2 streams,
        // up to 16 + 2 + 4 tokens of 64 bytes).
        assert_eq!(g.memory.dense_weight_bytes, 4 * 65536);
        assert_eq!(g.memory.kv_bytes, 4 * 2 * 22 * 64);
    }
    assert_eq!(r.memory.slot_bytes, whole.slot_bytes);
    // Tensor parallel: every expert of the cache in slices of half the width.
    let mut req = run_request(dir.path(), "offload");
    req.placement = "tensor-parallel".into();
    let tp = run_multi(&req).unwrap();
    let m = ModelSpec::resolve(&req.model).unwrap();
    let slice = MoeGeometry {
        intermediate: 32,
        ..m.geometry
    }
    .expert_bytes(m.format);
    for g in &tp.per_gpu {
        assert_eq!(g.memory.expert_bytes, slice);
        assert_eq!(g.memory.expert_bytes, g.expert_bytes);
        assert_eq!(g.memory.cache_slots, 12);
    }
    assert!(tp.memory.slot_bytes < EngineMemory::of(&m, &engine_config_of(&req)).slot_bytes);
}

/// The engine config a single-GPU run of `req` would plan, as far as memory goes.
fn engine_config_of(req: &RunRequest) -> EngineConfig {
    EngineConfig {
        strategy: req.strategy.as_deref().unwrap().parse().unwrap(),
        cache_slots: req.cache_slots.unwrap(),
        max_streams: req.streams,
        max_context: req.context + req.warmup + req.steps,
        ..EngineConfig::default()
    }
}

/// The memory planned for each GPU ([`GpuMemory::of`]) is what the engine allocates there:
/// the host-emulated device counts every allocation (rounded to pages).
#[test]
fn each_gpus_planned_memory_is_what_the_engine_allocates() {
    const CAPACITY: u64 = 256 << 20;
    /// Page rounding of each of the engine's device buffers, and the gate's flag.
    const ROUNDING: u64 = 32 * 4096;
    let m = model();
    for (gpus, placement, s) in [
        (1, GpuPlacement::Sharded, hybrid(0.5)),
        (2, GpuPlacement::Sharded, hybrid(0.5)),
        (
            2,
            GpuPlacement::Sharded,
            Strategy::LayerSplit {
                cpu_layers: ft_model::CpuLayers::Fixed(1),
            },
        ),
        (2, GpuPlacement::TensorParallel, Strategy::Offload),
        (3, GpuPlacement::TensorParallel, Strategy::Resident),
    ] {
        let layout = GpuLayout::new(gpus, placement).unwrap();
        let cfg = config(s, 10, gpus as usize, ActivationPath::F32);
        let devs = Device::open_group(&host_spec(), gpus as usize).unwrap();
        let e = on_gpus(&devs, layout, &cfg).unwrap();
        let planned = GpuMemory::of(&m, &cfg, &layout);
        for (g, d) in devs.iter().enumerate() {
            let used = CAPACITY - d.free_mem_bytes().unwrap();
            assert!(
                planned.device_bytes() <= used && used <= planned.device_bytes() + ROUNDING,
                "G={gpus} {placement:?} {s} GPU {g}: planned {} bytes, allocated {used}",
                planned.device_bytes()
            );
        }
        assert_eq!(planned.expert_bytes, e.expert_bytes_per_gpu() as u64);
        assert_eq!(planned.cache_slots, e.cache_slots());
        assert_eq!(planned.staging_slots, e.staging_slots());
        assert_eq!(planned.resident_slots, e.resident_slots());
    }
}

/// `--repeat`, `--trace-out` and `--compare-numerics` work on two GPUs as on one: every
/// repetition from an empty cache (the same routing, so the same counts), GPU 0's spans in
/// a Chrome trace, and the numerics of the same GPUs fresh and as offload.
#[test]
fn a_run_on_two_gpus_repeats_traces_and_compares_numerics() {
    let dir = tempfile::tempdir().unwrap();
    let trace = dir.path().join("trace.json");
    let mut req = run_request(dir.path(), "hybrid:0.5");
    req.repeat = 2;
    req.trace_out = Some(trace.clone());
    req.compare_numerics = true;
    // Int8 on both sides: the CPU and the GPU compute an expert alike.
    req.gpu_act = Some("int8".into());
    req.cpu_act = Some("int8".into());
    let r = run_multi(&req).unwrap();
    assert_eq!(r.repeats.len(), 2);
    assert!(r.repeats.iter().all(|&t| t > 0.0), "{:?}", r.repeats);
    let v: serde_json::Value =
        serde_json::from_slice(&std::fs::read(&trace).unwrap()).expect("the trace is JSON");
    let events = v["traceEvents"].as_array().expect("trace events");
    assert!(events.len() > 6, "spans and the 6 steps: {}", events.len());
    let n = r.numerics.expect("--compare-numerics");
    // Sharded, every expert whole wherever it runs: placement cannot change an output.
    assert!(n.expect_bit_identical && n.passed(), "{n:?}");
    assert!(n.fresh_vs_warmed.bit_identical);
    assert_eq!(n.fresh_vs_warmed.steps.len(), 4);
    let off = n.vs_offload.expect("hybrid against offload");
    assert_eq!(off.steps.len(), 4);
    // Tensor parallel with a CPU share: the CPU sums an expert whole, the GPUs in slices.
    req.placement = "tensor-parallel".into();
    req.repeat = 1;
    req.trace_out = None;
    let tp = run_multi(&req)
        .unwrap()
        .numerics
        .expect("--compare-numerics");
    assert!(!tp.expect_bit_identical && tp.passed(), "{tp:?}");
    assert!(tp.fresh_vs_warmed.max_rel_l2 < 1e-2, "{tp:?}");
}

/// `--stamps-out` stays one GPU's, and says why.
#[test]
fn block_timelines_on_two_gpus_are_refused_saying_why() {
    let dir = tempfile::tempdir().unwrap();
    let mut req = run_request(dir.path(), "offload");
    req.stamps_out = Some(dir.path().join("stamps.csv"));
    let e = run_multi(&req).unwrap_err().to_string();
    assert!(e.contains("--stamps-out") && e.contains("--gpus 1"), "{e}");
}
