//! The GPU expert step against the f64 reference of ft-kernels (f32 path) and, bit for bit,
//! against the CPU W4A8/W8A8 kernels (int8 path), on fresh random inputs. The same bodies run
//! on the host-emulated device (always) and on CUDA (`cuda_*`, on the GPU machine).

use ft_kernels::reference::{reference_layer, relative_error};
use ft_kernels::step::{ActivationPath, CpuExperts, ExpertWork};
use ft_model::{ExpertFormat, MoeGeometry};
use ft_runtime::device::{Device, HostDeviceConfig};
use ft_runtime::gpu_experts::{step_geometry, ExpertStep, ExpertTask, TokenWeight, WEIGHTS_ALIGN};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

fn host() -> Device {
    Device::host(HostDeviceConfig {
        memory_bytes: 512 << 20,
        kernel_threads: 2,
        ..Default::default()
    })
    .unwrap()
}

/// A random layer: `n_experts` experts (seeded bytes), `tokens` tokens of random x, each
/// token routed to `k` distinct experts with weights summing to 1.
struct Case {
    step: ExpertStep,
    weights: Vec<u8>,
    x: Vec<f32>,
}

#[allow(clippy::too_many_arguments)]
fn case(
    format: ExpertFormat,
    act: ActivationPath,
    hidden: usize,
    inter: usize,
    n_experts: usize,
    tokens: usize,
    k: usize,
    seed: u64,
) -> Case {
    let g = MoeGeometry {
        hidden,
        intermediate: inter,
        experts: n_experts,
        top_k: k,
        moe_layers: 1,
        shared_experts: 0,
    };
    let eb = g.expert_bytes(format) as usize;
    let stride = eb.next_multiple_of(WEIGHTS_ALIGN);
    let mut weights = vec![0u8; stride * n_experts];
    for e in 0..n_experts {
        ft_kernels::fill_expert_from_seed(
            format,
            &g,
            seed,
            0,
            e,
            &mut weights[e * stride..e * stride + eb],
        )
        .unwrap();
    }
    let mut rng = StdRng::seed_from_u64(seed ^ 0x5eed);
    let x: Vec<f32> = (0..tokens * hidden)
        .map(|_| rng.random_range(-2.0f32..2.0))
        .collect();
    let mut step = ExpertStep::new(format, &g, act, tokens);
    step.experts = (0..n_experts)
        .map(|e| ExpertTask {
            weights_offset: e * stride,
            tokens: Vec::new(),
        })
        .collect();
    for t in 0..tokens {
        let mut chosen: Vec<usize> = Vec::new();
        while chosen.len() < k.min(n_experts) {
            let e = rng.random_range(0..n_experts);
            if !chosen.contains(&e) {
                chosen.push(e);
            }
        }
        let raw: Vec<f32> = chosen
            .iter()
            .map(|_| rng.random_range(0.1f32..1.0))
            .collect();
        let sum: f32 = raw.iter().sum();
        for (e, w) in chosen.into_iter().zip(raw) {
            step.experts[e].tokens.push(TokenWeight {
                token: t as u32,
                weight: w / sum,
            });
        }
    }
    Case { step, weights, x }
}

/// Run the case on `d`; returns y.
fn run_on(d: &Device, c: &Case) -> Vec<f32> {
    run_on_stream(d, &d.new_stream("compute").unwrap(), c)
}

/// Run the case on stream `s` of `d` (whose scratch, counters included, earlier launches on
/// `s` have used); returns y.
fn run_on_stream(d: &Device, s: &ft_runtime::device::Stream, c: &Case) -> Vec<f32> {
    let w = d.alloc(c.weights.len(), "weights").unwrap();
    let x = d.alloc(c.x.len() * 4, "x").unwrap();
    let y = d.alloc(c.x.len() * 4, "y").unwrap();
    s.upload(&c.weights, &w, 0).unwrap();
    s.upload_f32(&c.x, &x, 0).unwrap();
    // y starts as garbage: the launch must overwrite all of it.
    s.upload_f32(&vec![f32::NAN; c.x.len()], &y, 0).unwrap();
    s.launch_experts(&c.step, &w, &x, &y).unwrap();
    s.download_f32(&y, 0, c.x.len()).unwrap()
}

fn works<'a>(c: &'a Case, tokens: &'a [Vec<(u32, f32)>]) -> Vec<ExpertWork<'a>> {
    let eb = c.step.expert_bytes();
    c.step
        .experts
        .iter()
        .zip(tokens)
        .map(|(e, t)| ExpertWork {
            weights: &c.weights[e.weights_offset..e.weights_offset + eb],
            tokens: t,
        })
        .collect()
}

fn token_lists(c: &Case) -> Vec<Vec<(u32, f32)>> {
    c.step
        .experts
        .iter()
        .map(|e| e.tokens.iter().map(|t| (t.token, t.weight)).collect())
        .collect()
}

/// How many of `got`'s values differ in any bit from `want`'s.
fn differing_bits(got: &[f32], want: &[f32]) -> usize {
    got.iter()
        .zip(want)
        .filter(|(a, b)| a.to_bits() != b.to_bits())
        .count()
}

/// The CPU kernels' output for the case (zeroed y first).
fn cpu(c: &Case) -> Vec<f32> {
    let tl = token_lists(c);
    let mut y = vec![0f32; c.x.len()];
    let mut k = CpuExperts::new(2).unwrap();
    k.run_layer(
        c.step.format,
        &step_geometry(&c.step),
        c.step.act,
        &works(c, &tl),
        &c.x,
        &mut y,
    )
    .unwrap();
    y
}

fn reference(c: &Case) -> Vec<f64> {
    let tl = token_lists(c);
    reference_layer(
        c.step.format,
        &step_geometry(&c.step),
        &works(c, &tl),
        &c.x,
        &vec![0f32; c.x.len()],
    )
    .unwrap()
}

/// f32 path: every format against the f64 reference.
fn f32_path_matches_reference(d: &Device) {
    for (i, f) in ExpertFormat::ALL.into_iter().enumerate() {
        for (hidden, inter, ne, tokens, k) in [(64, 32, 3, 1, 2), (128, 96, 7, 11, 3)] {
            let c = case(
                f,
                ActivationPath::F32,
                hidden,
                inter,
                ne,
                tokens,
                k,
                100 + i as u64,
            );
            let got = run_on(d, &c);
            let want = reference(&c);
            let err = relative_error(&got, &want);
            // f32 accumulation over a few hundred terms: far below 1e-5 relative.
            assert!(err < 1e-5, "{f} {hidden}x{inter}: relative error {err:e}");
            // Unrouted tokens are exactly 0, routed ones not all zero.
            assert!(got.iter().all(|v| v.is_finite()));
        }
    }
}

/// An int8 case with what every path must give for it: the CPU kernels' outputs (bit for
/// bit) and the f64 reference's (near).
struct Int8Check {
    label: String,
    case: Case,
    cpu: Vec<f32>,
    reference: Vec<f64>,
}

/// The int8 cases of `shapes` for every format with an int8 path, with the CPU's and the f64
/// reference's outputs, built once (in parallel, one thread a case) for every path a test
/// checks: building them, not the launches, is most of the test's time (about 40 s a path
/// on the GPU machine when each path built its own).
fn int8_checks(shapes: &[(usize, usize, usize, usize, usize)]) -> Vec<Int8Check> {
    let specs: Vec<_> = ExpertFormat::ALL
        .into_iter()
        .filter(|f| f.has_int8_activation_path())
        .flat_map(|f| shapes.iter().enumerate().map(move |(n, &s)| (f, n, s)))
        .collect();
    std::thread::scope(|scope| {
        let built: Vec<_> = specs
            .iter()
            .map(|&(f, n, (hidden, inter, ne, tokens, k))| {
                scope.spawn(move || {
                    let case = case(
                        f,
                        ActivationPath::Int8,
                        hidden,
                        inter,
                        ne,
                        tokens,
                        k,
                        7 + n as u64,
                    );
                    Int8Check {
                        label: format!("{f} {hidden}x{inter} experts {ne} tokens {tokens}"),
                        cpu: cpu(&case),
                        reference: reference(&case),
                        case,
                    }
                })
            })
            .collect();
        built.into_iter().map(|h| h.join().unwrap()).collect()
    })
}

/// int8 path: bit-identical to the CPU kernels, and near the reference.
fn int8_path_is_bit_identical_to_cpu(d: &Device, checks: &[Int8Check]) {
    let mut report = Vec::new();
    for check in checks {
        let got = run_on(d, &check.case);
        let differ = differing_bits(&got, &check.cpu);
        let max_abs = got
            .iter()
            .zip(&check.cpu)
            .map(|(a, b)| (a - b).abs())
            .fold(0f32, f32::max);
        if differ > 0 {
            report.push(format!(
                "{}: {differ} of {} outputs differ, max |diff| {max_abs:e}",
                check.label,
                got.len()
            ));
        }
        let err = relative_error(&got, &check.reference);
        // int8 activations: a few 1e-3 relative (documented by ft-kernels).
        assert!(
            err < 3e-2,
            "{}: int8 path relative error {err:e} vs f64",
            check.label
        );
    }
    assert!(
        report.is_empty(),
        "int8 path not bit-identical:\n{}",
        report.join("\n")
    );
}

fn empty_and_unrouted(d: &Device) {
    let mut c = case(ExpertFormat::Nvfp4, ActivationPath::F32, 64, 32, 2, 3, 1, 5);
    c.step.experts[0].tokens.clear();
    c.step.experts[1].tokens.retain(|t| t.token != 1);
    let got = run_on(d, &c);
    assert!(
        got[64..128].iter().all(|&v| v == 0.0),
        "token 1 is routed nowhere"
    );
    c.step.experts.clear();
    let got = run_on(d, &c);
    assert!(got.iter().all(|&v| v == 0.0));
    // A bad step is refused when queued.
    let mut bad = case(ExpertFormat::Bf16, ActivationPath::Int8, 64, 32, 1, 1, 1, 5);
    let s = d.new_stream("s").unwrap();
    let w = d.alloc(bad.weights.len(), "w").unwrap();
    let x = d.alloc(256, "x").unwrap();
    let e = s
        .launch_experts(&bad.step, &w, &x, &x)
        .unwrap_err()
        .to_string();
    assert!(e.contains("int8"), "{e}");
    bad.step.act = ActivationPath::F32;
    bad.step.experts[0].weights_offset = 256;
    let e = s
        .launch_experts(&bad.step, &w, &x, &x)
        .unwrap_err()
        .to_string();
    assert!(e.contains("task 0 weights"), "{e}");
}

/// A launch gated on a flag waits for it: the weights start as zeros, another stream holds
/// (tens of ms), copies the real weights in and only then sets the flag; the gated launch,
/// queued at once, must see the real weights (the CPU kernels' bits), round after round on
/// the same flag with the next value. The values start just below the u32 wrap, so the
/// rounds wait for u32::MAX, then 0, 1, ... (the comparison is modular). A misplaced flag
/// is refused when queued.
fn gated_launch_waits_for_its_flag(d: &Device, shapes: &[(usize, usize, usize, usize, usize)]) {
    use ft_runtime::device::FlagGate;
    let compute = d.new_stream("compute").unwrap();
    let copy = d.new_stream("copy").unwrap();
    let flag = d.alloc(4, "flag").unwrap();
    let start = u32::MAX - 1;
    copy.write_flag(&FlagGate {
        flag: &flag,
        offset: 0,
        value: start,
    })
    .unwrap();
    copy.synchronize().unwrap();
    for (round, &(hidden, inter, ne, tokens, k)) in shapes.iter().enumerate() {
        let c = case(
            ExpertFormat::Nvfp4,
            ActivationPath::Int8,
            hidden,
            inter,
            ne,
            tokens,
            k,
            60 + round as u64,
        );
        let w = d.alloc(c.weights.len(), "weights").unwrap();
        let x = d.alloc(c.x.len() * 4, "x").unwrap();
        let y = d.alloc(c.x.len() * 4, "y").unwrap();
        let mut src = d.alloc_host(c.weights.len(), "weights").unwrap();
        src.as_mut_slice().copy_from_slice(&c.weights);
        compute.memset_zero(&w, 0, c.weights.len()).unwrap();
        compute.upload_f32(&c.x, &x, 0).unwrap();
        compute.synchronize().unwrap();
        let gate = FlagGate {
            flag: &flag,
            offset: 0,
            value: start.wrapping_add(round as u32 + 1),
        };
        copy.hold_us(30_000.0).unwrap();
        copy.copy_h2d(&src, 0, &w, 0, c.weights.len()).unwrap();
        copy.write_flag(&gate).unwrap();
        compute
            .launch_experts_gated(&c.step, &w, &x, &y, None, &gate)
            .unwrap();
        let got = compute.download_f32(&y, 0, c.x.len()).unwrap();
        copy.synchronize().unwrap();
        let want = cpu(&c);
        let differ = differing_bits(&got, &want);
        assert_eq!(differ, 0, "round {round} ({hidden}x{inter}, {ne} experts): {differ} outputs differ from the CPU's");
    }
    let c = case(
        ExpertFormat::Nvfp4,
        ActivationPath::Int8,
        64,
        64,
        2,
        1,
        1,
        9,
    );
    let w = d.alloc(c.weights.len(), "w").unwrap();
    let x = d.alloc(256, "x").unwrap();
    for (offset, says) in [(2, "multiple of 4"), (4, "flag")] {
        let gate = FlagGate {
            flag: &flag,
            offset,
            value: 1,
        };
        let e = compute
            .launch_experts_gated(&c.step, &w, &x, &x, None, &gate)
            .unwrap_err()
            .to_string();
        assert!(e.contains(says), "offset {offset}: {e}");
        let e = copy.write_flag(&gate).unwrap_err().to_string();
        assert!(e.contains(says), "offset {offset}: {e}");
    }
}

/// Shapes for the bit-identity test: (hidden, intermediate, experts, tokens, top-k); tokens
/// beyond 8 exercise the kernels' passes.
const SHAPES: &[(usize, usize, usize, usize, usize)] =
    &[(64, 64, 2, 1, 1), (128, 96, 5, 9, 3), (256, 160, 12, 3, 4)];

#[test]
fn host_f32_path_matches_reference() {
    f32_path_matches_reference(&host());
}

#[test]
fn host_int8_path_is_bit_identical_to_cpu() {
    int8_path_is_bit_identical_to_cpu(&host(), &int8_checks(SHAPES));
}

#[test]
fn host_empty_and_unrouted() {
    empty_and_unrouted(&host());
}

#[test]
fn host_device_has_no_block_stamps() {
    let e = host().take_block_stamps().unwrap_err().to_string();
    assert!(e.contains("block stamps"), "{e}");
}

#[test]
fn host_gated_launch_waits_for_its_flag() {
    gated_launch_waits_for_its_flag(&host(), &[(64, 64, 2, 1, 1), (128, 96, 5, 3, 2)]);
}

#[cfg(feature = "cuda")]
mod cuda {
    use super::*;

    fn gpu() -> Device {
        Device::cuda(0).expect("a CUDA device")
    }

    /// Run `check` on a GPU once on the kernels' one path, once more per forced
    /// instantiation (every instantiation runs the same arithmetic per token, so each must
    /// give the same bits) and once with the block timelines compiled in (development only,
    /// the same results).
    ///
    /// Every tuning's expert modules for the formats and activation paths of `steps` are
    /// compiled first, at once (`Device::warm_up_expert_paths`, on every core), instead of
    /// one by one at each tuning's first launch.
    fn on_every_path(steps: &[&ExpertStep], check: impl Fn(&Device)) {
        use ft_runtime::device::tuning::CUDA_VARIANT_TOKENS;
        use ft_runtime::device::CudaTuning;
        let d = gpu();
        let opened = d.cuda_tuning().expect("a CUDA device has CUDA paths");
        let mut tunings = vec![opened];
        tunings.extend(CUDA_VARIANT_TOKENS.map(|n| CudaTuning {
            expert_variant: Some(n),
            ..opened
        }));
        tunings.push(CudaTuning {
            block_stamps: true,
            ..opened
        });
        let t0 = std::time::Instant::now();
        d.warm_up_expert_paths(&tunings, steps).unwrap();
        eprintln!(
            "{} tunings' expert modules built in {:.1} s",
            tunings.len(),
            t0.elapsed().as_secs_f64()
        );
        for t in tunings {
            d.set_cuda_tuning(t).unwrap();
            eprintln!("tuning {t}");
            check(&d);
            d.take_block_stamps().unwrap();
        }
        d.set_cuda_tuning(opened).unwrap();
    }

    #[test]
    #[ignore = "needs an NVIDIA GPU (run on the GPU machine)"]
    fn cuda_f32_path_matches_reference() {
        let g = MoeGeometry {
            hidden: 64,
            intermediate: 32,
            experts: 1,
            top_k: 1,
            moe_layers: 1,
            shared_experts: 0,
        };
        let steps: Vec<ExpertStep> = ExpertFormat::ALL
            .into_iter()
            .map(|f| ExpertStep::new(f, &g, ActivationPath::F32, 1))
            .collect();
        on_every_path(
            &steps.iter().collect::<Vec<_>>(),
            f32_path_matches_reference,
        );
    }

    #[test]
    #[ignore = "needs an NVIDIA GPU (run on the GPU machine)"]
    fn cuda_int8_path_is_bit_identical_to_cpu() {
        let mut shapes = SHAPES.to_vec();
        // Many more shapes on the GPU: the served geometry with a batch of streams, and the
        // widths of bench-nvfp4 and deepseek-v4-flash (the largest staged tiles).
        shapes.extend([
            (96, 64, 3, 17, 2),
            (512, 256, 16, 8, 8),
            (1024, 384, 9, 5, 3),
            (2560, 640, 20, 4, 10),
            (2560, 640, 10, 1, 10),
            // One-token launches of fewer gate/up blocks than multiprocessors (the
            // small-grid kernels where on).
            (2560, 640, 2, 1, 2),
            (4096, 2048, 1, 1, 1),
            (3072, 1536, 8, 2, 8),
            (4096, 2048, 6, 1, 6),
        ]);
        let checks = int8_checks(&shapes);
        let steps: Vec<&ExpertStep> = checks.iter().map(|c| &c.case.step).collect();
        on_every_path(&steps, |d| int8_path_is_bit_identical_to_cpu(d, &checks));
    }

    /// A gated launch waits on the GPU for its flag (`gated_launch_waits_for_its_flag`).
    #[test]
    #[ignore = "needs an NVIDIA GPU (run on the GPU machine)"]
    fn cuda_gated_launch_waits_for_its_flag() {
        // The served one-token layer (two launches, the dependent down kernel waiting too),
        // a few tokens, and a small layer.
        gated_launch_waits_for_its_flag(
            &gpu(),
            &[
                (2560, 640, 10, 1, 10),
                (2560, 640, 8, 4, 6),
                (256, 160, 3, 2, 2),
            ],
        );
    }

    /// The block timelines: a stamped one-token layer gives the CPU's bits, and one record
    /// per block comes back, each in order
    /// (entry <= start condition <= tiles <= own work <= exit), gate/up's grid and down's
    /// whole, with the launch cut as one; the count is zero after a read.
    #[test]
    #[ignore = "needs an NVIDIA GPU (run on the GPU machine)"]
    fn cuda_block_stamps_time_every_block() {
        use ft_runtime::block_stamps::{launches, StampedKernel};
        use ft_runtime::device::CudaTuning;
        let d = gpu();
        let opened = d.cuda_tuning().expect("a CUDA device has CUDA paths");
        let c = case(
            ExpertFormat::Nvfp4,
            ActivationPath::Int8,
            2560,
            640,
            10,
            1,
            10,
            41,
        );
        let want = cpu(&c);
        d.set_cuda_tuning(CudaTuning {
            block_stamps: true,
            ..opened
        })
        .unwrap();
        d.take_block_stamps().unwrap();
        let got = run_on(&d, &c);
        assert_eq!(differing_bits(&got, &want), 0);
        let st = d.take_block_stamps().unwrap();
        assert_eq!(st.dropped, 0);
        let count = |k| st.records.iter().filter(|b| b.kernel == k).count();
        // 640 / 16 gate/up row blocks and a down tile per 64 rows, per expert (or per 32
        // rows where the small-grid kernels take the launch).
        assert_eq!(count(StampedKernel::GateUp), 10 * 640 / 16);
        let down = count(StampedKernel::Down);
        assert!(
            down == 10 * 2560 / 64 || down == 10 * 2560 / 32,
            "{down} down blocks"
        );
        for b in &st.records {
            let mut last = b.entry_ns;
            for t in [b.condition_ns, b.ready_ns, b.work_ns]
                .into_iter()
                .flatten()
            {
                assert!(t >= last, "{b:?}");
                last = t;
            }
            assert!(b.exit_ns >= last, "{b:?}");
        }
        assert_eq!(launches(&st.records).len(), 1);
        assert!(d.take_block_stamps().unwrap().records.is_empty());
        d.set_cuda_tuning(opened).unwrap();
    }

    /// Layers of different shapes and token counts queued back to back on one stream with
    /// no wait between them (each down kernel a dependent launch of its gate/up kernel)
    /// share the stream's scratch (h, the row tiles' counters), and each must give what it
    /// gives alone, into its own y, over three rounds.
    #[test]
    #[ignore = "needs an NVIDIA GPU (run on the GPU machine)"]
    fn cuda_queued_layers_share_a_stream() {
        let d = gpu();
        let nv = ExpertFormat::Nvfp4;
        let i8p = ActivationPath::Int8;
        let cases = [
            case(nv, i8p, 2560, 640, 10, 1, 10, 51),
            case(nv, i8p, 256, 160, 3, 1, 1, 52),
            case(nv, i8p, 2560, 640, 8, 4, 6, 53),
            case(ExpertFormat::Mxfp4, i8p, 3072, 1536, 8, 1, 8, 54),
            case(nv, ActivationPath::F32, 2560, 640, 10, 1, 10, 55),
            case(nv, i8p, 2560, 640, 1, 1, 1, 56),
        ];
        // What each layer gives launched alone: the CPU's bits on the int8 path
        // (checked), the f32 path's own.
        let alone: Vec<Vec<f32>> = cases.iter().map(|c| run_on(&d, c)).collect();
        for (c, a) in cases.iter().zip(&alone) {
            if c.step.act == ActivationPath::Int8 {
                assert_eq!(differing_bits(a, &cpu(c)), 0);
            }
        }
        {
            let s = d.new_stream("compute").unwrap();
            let inputs: Vec<_> = cases
                .iter()
                .map(|c| {
                    let w = d.alloc(c.weights.len(), "weights").unwrap();
                    let x = d.alloc(c.x.len() * 4, "x").unwrap();
                    s.upload(&c.weights, &w, 0).unwrap();
                    s.upload_f32(&c.x, &x, 0).unwrap();
                    (w, x)
                })
                .collect();
            let rounds = 3;
            let mut outputs = Vec::new();
            for _ in 0..rounds {
                for c in &cases {
                    let y = d.alloc(c.x.len() * 4, "y").unwrap();
                    s.upload_f32(&vec![f32::NAN; c.x.len()], &y, 0).unwrap();
                    outputs.push(y);
                }
                // The launches back to back: no upload or wait between them.
                let ys = &outputs[outputs.len() - cases.len()..];
                for ((c, (w, x)), y) in cases.iter().zip(&inputs).zip(ys) {
                    s.launch_experts(&c.step, w, x, y).unwrap();
                }
            }
            for (n, y) in outputs.iter().enumerate() {
                let (round, k) = (n / cases.len(), n % cases.len());
                let got = s.download_f32(y, 0, cases[k].x.len()).unwrap();
                let differ = differing_bits(&got, &alone[k]);
                assert_eq!(
                    differ, 0,
                    "round {round}, case {k}: {differ} outputs differ"
                );
            }
        }
    }

    /// The down kernel leaves its row tiles' counters zero for the next launch on the same
    /// stream: one-token int8 layers of different task counts (empty tasks and a token
    /// routed nowhere among them) launched one after the other on one stream, three rounds,
    /// each bit-identical to the CPU.
    #[test]
    #[ignore = "needs an NVIDIA GPU (run on the GPU machine)"]
    fn cuda_layers_repeat_on_one_stream() {
        let d = gpu();
        let mut cases = vec![
            case(
                ExpertFormat::Nvfp4,
                ActivationPath::Int8,
                2560,
                640,
                10,
                1,
                10,
                31,
            ),
            case(
                ExpertFormat::Nvfp4,
                ActivationPath::Int8,
                256,
                160,
                3,
                1,
                1,
                32,
            ),
            case(
                ExpertFormat::Mxfp4,
                ActivationPath::Int8,
                3072,
                1536,
                8,
                1,
                8,
                33,
            ),
            case(
                ExpertFormat::Nvfp4,
                ActivationPath::Int8,
                2560,
                640,
                1,
                1,
                1,
                34,
            ),
        ];
        // Two empty tasks (one token routed to one expert of three), and a layer whose
        // every task is empty (its token routed nowhere: y is zero).
        let mut nowhere = case(
            ExpertFormat::Nvfp4,
            ActivationPath::Int8,
            256,
            160,
            3,
            1,
            1,
            35,
        );
        for e in &mut nowhere.step.experts {
            e.tokens.clear();
        }
        cases.push(nowhere);
        let s = d.new_stream("compute").unwrap();
        for round in 0..3 {
            for (n, c) in cases.iter().enumerate() {
                let got = run_on_stream(&d, &s, c);
                let want = cpu(c);
                let differ = differing_bits(&got, &want);
                assert_eq!(
                    differ, 0,
                    "round {round}, case {n}: {differ} outputs differ"
                );
            }
        }
    }

    #[test]
    #[ignore = "needs an NVIDIA GPU (run on the GPU machine)"]
    fn cuda_empty_and_unrouted() {
        empty_and_unrouted(&gpu());
    }
}
