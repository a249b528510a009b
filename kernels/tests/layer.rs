//! The layer call against the f64 reference, at every SIMD level this CPU has, and the
//! int8 path's bit-identity across levels and thread counts.

use ft_kernels::reference::{reference_layer, relative_error};
use ft_kernels::{
    fill_expert_from_seed, ActivationPath, CpuExperts, ExpertLayout, ExpertWork, SimdLevel,
};
use ft_model::{ExpertFormat, MoeGeometry};
use rand::{Rng, SeedableRng};

/// Tolerance of the f32 path against the f64 reference (norm-wise relative).
const F32_TOL: f64 = 1e-5;
/// Tolerance of the int8 path against the f64 reference (norm-wise relative).
const INT8_TOL: f64 = 2e-2;

/// Small, but with partial groups of 16 blocks in both matrices (320 = 20 nvfp4 blocks).
fn small() -> MoeGeometry {
    MoeGeometry {
        hidden: 320,
        intermediate: 96,
        experts: 8,
        top_k: 2,
        moe_layers: 1,
        shared_experts: 0,
    }
}

struct Case {
    banks: Vec<Vec<u8>>,
    routes: Vec<Vec<(u32, f32)>>,
    x: Vec<f32>,
    y0: Vec<f32>,
}

/// Three experts with 1, 3 and 9 tokens (register blocks of 8 + 1, 2 + 1, 1), 10 tokens,
/// some tokens in several experts; random x and a non-zero starting y.
fn case(format: ExpertFormat, g: &MoeGeometry, seed: u64) -> Case {
    let layout = ExpertLayout::new(format, g).unwrap();
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    let tokens = 10;
    let counts = [1usize, 3, 9];
    let banks = (0..counts.len())
        .map(|e| {
            let mut b = vec![0u8; layout.bytes];
            fill_expert_from_seed(format, g, seed, 0, e, &mut b).unwrap();
            b
        })
        .collect();
    let routes = counts
        .iter()
        .map(|&c| {
            (0..c)
                .map(|i| (((i * 7 + c) % tokens) as u32, rng.random::<f32>()))
                .collect()
        })
        .collect();
    let x = (0..tokens * g.hidden)
        .map(|_| rng.random::<f32>() * 2.0 - 1.0)
        .collect();
    let y0 = (0..tokens * g.hidden)
        .map(|_| rng.random::<f32>() * 0.1)
        .collect();
    Case {
        banks,
        routes,
        x,
        y0,
    }
}

fn work(c: &Case) -> Vec<ExpertWork<'_>> {
    c.banks
        .iter()
        .zip(&c.routes)
        .map(|(b, r)| ExpertWork {
            weights: b,
            tokens: r,
        })
        .collect()
}

fn run(
    k: &mut CpuExperts,
    f: ExpertFormat,
    g: &MoeGeometry,
    p: ActivationPath,
    c: &Case,
) -> Vec<f32> {
    let mut y = c.y0.clone();
    k.run_layer(f, g, p, &work(c), &c.x, &mut y).unwrap();
    y
}

/// Relative error of the layer's contribution (y - y0) against the reference's.
fn delta_error(y: &[f32], want: &[f64], y0: &[f32]) -> f64 {
    let d: Vec<f32> = y.iter().zip(y0).map(|(a, b)| a - b).collect();
    let w: Vec<f64> = want.iter().zip(y0).map(|(a, &b)| a - b as f64).collect();
    relative_error(&d, &w)
}

fn check_geometry(g: &MoeGeometry, formats: &[ExpertFormat]) {
    let mut k = CpuExperts::new(2).unwrap();
    for &f in formats {
        let c = case(f, g, 11);
        let want = reference_layer(f, g, &work(&c), &c.x, &c.y0).unwrap();
        for p in ActivationPath::ALL {
            if !p.supports(f) {
                continue;
            }
            let mut first: Option<Vec<f32>> = None;
            for level in SimdLevel::available_levels() {
                k.set_simd(level).unwrap();
                let y = run(&mut k, f, g, p, &c);
                let err = delta_error(&y, &want, &c.y0);
                let tol = if p == ActivationPath::F32 {
                    F32_TOL
                } else {
                    INT8_TOL
                };
                eprintln!("{f} {p} {level}: relative error {err:.3e}");
                assert!(
                    err <= tol,
                    "{f} {p} {level}: relative error {err:.3e} > {tol:e}"
                );
                if p == ActivationPath::Int8 {
                    match &first {
                        None => first = Some(y),
                        Some(s) => {
                            let same = s.iter().zip(&y).all(|(a, b)| a.to_bits() == b.to_bits());
                            assert!(same, "{f} int8 at {level} is not bit-identical to scalar");
                        }
                    }
                }
            }
        }
    }
}

#[test]
fn every_format_path_and_level_matches_the_reference() {
    check_geometry(&small(), &ExpertFormat::ALL);
}

#[test]
fn real_geometry_nvfp4_and_mxfp4() {
    // qwen3.8-flash-next's expert shape (2560 x 640): 10 full groups and 2.5 groups.
    let g = MoeGeometry {
        hidden: 2560,
        intermediate: 640,
        experts: 4,
        top_k: 2,
        moe_layers: 1,
        shared_experts: 0,
    };
    check_geometry(&g, &[ExpertFormat::Nvfp4, ExpertFormat::Q4_0]);
}

#[test]
fn int8_path_is_deterministic_across_thread_counts() {
    let g = small();
    let f = ExpertFormat::Mxfp4;
    let c = case(f, &g, 5);
    let mut one = CpuExperts::new(1).unwrap();
    let mut two = CpuExperts::new(2).unwrap();
    let a = run(&mut one, f, &g, ActivationPath::Int8, &c);
    let b = run(&mut two, f, &g, ActivationPath::Int8, &c);
    assert!(a.iter().zip(&b).all(|(p, q)| p.to_bits() == q.to_bits()));
    // A second call reuses the scratch and gives the same bits.
    let b2 = run(&mut two, f, &g, ActivationPath::Int8, &c);
    assert_eq!(b, b2);
}

#[test]
fn bad_input_is_refused_with_named_errors() {
    let g = small();
    let f = ExpertFormat::Nvfp4;
    let c = case(f, &g, 3);
    let mut k = CpuExperts::new(1).unwrap();
    let mut y = c.y0.clone();
    let short = &c.banks[0][..100];
    let w = [ExpertWork {
        weights: short,
        tokens: &c.routes[0],
    }];
    let e = k
        .run_layer(f, &g, ActivationPath::F32, &w, &c.x, &mut y)
        .unwrap_err();
    assert!(e.to_string().contains("experts[0].weights"), "{e}");
    let bad_token = [(99u32, 0.5f32)];
    let w = [ExpertWork {
        weights: &c.banks[0],
        tokens: &bad_token,
    }];
    let e = k
        .run_layer(f, &g, ActivationPath::F32, &w, &c.x, &mut y)
        .unwrap_err();
    assert!(e.to_string().contains("token 99"), "{e}");
    let nan = [(0u32, f32::NAN)];
    let w = [ExpertWork {
        weights: &c.banks[0],
        tokens: &nan,
    }];
    let e = k
        .run_layer(f, &g, ActivationPath::F32, &w, &c.x, &mut y)
        .unwrap_err();
    assert!(e.to_string().contains("not finite"), "{e}");
    let e = k
        .run_layer(f, &g, ActivationPath::F32, &work(&c), &c.x, &mut y[..5])
        .unwrap_err();
    assert!(e.to_string().contains('y'), "{e}");
    let b = case(ExpertFormat::Bf16, &g, 3);
    let mut yb = b.y0.clone();
    let e = k
        .run_layer(
            ExpertFormat::Bf16,
            &g,
            ActivationPath::Int8,
            &work(&b),
            &b.x,
            &mut yb,
        )
        .unwrap_err();
    assert!(e.to_string().contains("bf16 has no int8"), "{e}");
    // No experts: y is untouched.
    let mut y2 = c.y0.clone();
    k.run_layer(f, &g, ActivationPath::Int8, &[], &c.x, &mut y2)
        .unwrap();
    assert_eq!(y2, c.y0);
}

#[test]
fn encoded_weights_with_tiny_blocks_stay_bit_identical() {
    // Blocks spanning six decades drive nvfp4 scales into e4m3 subnormals and mxfp4 scales
    // to small exponents; the SIMD scale conversions must match the scalar ones exactly.
    let g = small();
    let mut rng = rand::rngs::StdRng::seed_from_u64(9);
    for f in [
        ExpertFormat::Nvfp4,
        ExpertFormat::Mxfp4,
        ExpertFormat::Q4_0,
        ExpertFormat::Int8,
    ] {
        let layout = ExpertLayout::new(f, &g).unwrap();
        let mut bytes = vec![0u8; layout.bytes];
        for (m, rows, cols) in [
            (ft_kernels::Matrix::Gate, g.intermediate, g.hidden),
            (ft_kernels::Matrix::Up, g.intermediate, g.hidden),
            (ft_kernels::Matrix::Down, g.hidden, g.intermediate),
        ] {
            let w: Vec<f32> = (0..rows * cols)
                .map(|i| {
                    let mag = 10f32.powi(-(((i / 16) % 7) as i32));
                    (rng.random::<f32>() * 2.0 - 1.0) * mag
                })
                .collect();
            let enc = ft_kernels::codec::encode(f, rows, cols, &w).unwrap();
            bytes[layout.range(m)].copy_from_slice(&enc);
        }
        let routes = vec![(0u32, 1.0f32), (1, 0.5), (2, 0.25)];
        let x: Vec<f32> = (0..3 * g.hidden)
            .map(|_| rng.random::<f32>() - 0.5)
            .collect();
        let w = [ExpertWork {
            weights: &bytes,
            tokens: &routes,
        }];
        let mut k = CpuExperts::new(2).unwrap();
        let mut outs = Vec::new();
        for level in SimdLevel::available_levels() {
            k.set_simd(level).unwrap();
            let mut y = vec![0f32; x.len()];
            k.run_layer(f, &g, ActivationPath::Int8, &w, &x, &mut y)
                .unwrap();
            outs.push((level, y));
        }
        let want = reference_layer(f, &g, &w, &x, &vec![0f32; x.len()]).unwrap();
        let err = relative_error(&outs[0].1, &want);
        assert!(err <= INT8_TOL, "{f}: {err:.3e}");
        for (level, y) in &outs[1..] {
            let same = y
                .iter()
                .zip(&outs[0].1)
                .all(|(a, b)| a.to_bits() == b.to_bits());
            assert!(same, "{f} at {level} differs from scalar");
        }
    }
}

#[test]
fn every_wait_mode_gives_the_same_bits() {
    // Block and Spin run the call on the pool (rayon's parallel iterators); Help runs it on
    // the caller, tiles shared with the workers. The int8 path is bit-identical whoever
    // computes a tile; f32 stays within the reference's tolerance.
    use ft_kernels::WaitMode;
    let g = small();
    for f in [ExpertFormat::Nvfp4, ExpertFormat::Q4_0] {
        let c = case(f, &g, 21);
        let want = reference_layer(f, &g, &work(&c), &c.x, &c.y0).unwrap();
        let mut k = CpuExperts::new(2).unwrap();
        k.set_wait_mode(WaitMode::Block);
        let base = run(&mut k, f, &g, ActivationPath::Int8, &c);
        for mode in [WaitMode::Block, WaitMode::Spin, WaitMode::Help] {
            k.set_wait_mode(mode);
            assert_eq!(k.wait_mode(), mode);
            for _ in 0..3 {
                let y = run(&mut k, f, &g, ActivationPath::Int8, &c);
                assert_eq!(y, base, "{f} int8 with {mode:?}");
                let fy = run(&mut k, f, &g, ActivationPath::F32, &c);
                let err = delta_error(&fy, &want, &c.y0);
                assert!(err <= F32_TOL, "{f} f32 with {mode:?}: {err:.3e}");
            }
        }
    }
}

#[test]
fn work_beside_a_layer_call_runs_once_on_the_caller_and_changes_no_bit() {
    // The hybrid runtime's host submits GPU work beside the pool's tiles
    // (`run_layer_beside`): in every wait mode it runs exactly once, on the calling thread,
    // the layer's bits are those of `run_layer`; also when the call has no work or fails.
    use ft_kernels::WaitMode;
    let g = small();
    let f = ExpertFormat::Nvfp4;
    let c = case(f, &g, 33);
    let caller = std::thread::current().id();
    for threads in [1, 3] {
        let mut k = CpuExperts::new(threads).unwrap();
        for mode in [WaitMode::Block, WaitMode::Spin, WaitMode::Help] {
            k.set_wait_mode(mode);
            for p in [ActivationPath::Int8, ActivationPath::F32] {
                let want = run(&mut k, f, &g, p, &c);
                let mut ran = Vec::new();
                let mut y = c.y0.clone();
                k.run_layer_beside(f, &g, p, &work(&c), &c.x, &mut y, &mut || {
                    ran.push(std::thread::current().id())
                })
                .unwrap();
                assert_eq!(ran, vec![caller], "{threads} threads, {mode:?}, {p}");
                assert_eq!(y, want, "{threads} threads, {mode:?}, {p}");
            }
            // No work: it still runs; a refused call: it still runs, and the error comes back.
            let mut n = 0;
            let mut y = c.y0.clone();
            let t = k.run_layer_beside(f, &g, ActivationPath::Int8, &[], &c.x, &mut y, &mut || {
                n += 1
            });
            assert_eq!(t.unwrap(), Default::default());
            assert_eq!(y, c.y0);
            let mut short = vec![0f32; 3];
            let e = k.run_layer_beside(
                f,
                &g,
                ActivationPath::Int8,
                &work(&c),
                &c.x,
                &mut short,
                &mut || n += 1,
            );
            assert!(e.unwrap_err().to_string().contains('y'));
            assert_eq!(n, 2, "{threads} threads, {mode:?}");
        }
    }
}

#[test]
fn the_preferred_path_is_int8_wherever_a_format_has_it() {
    for f in ExpertFormat::ALL {
        let want = if f == ExpertFormat::Bf16 {
            ActivationPath::F32
        } else {
            ActivationPath::Int8
        };
        assert_eq!(ActivationPath::preferred(f), want, "{f}");
        assert!(ActivationPath::preferred(f).supports(f), "{f}");
    }
}
