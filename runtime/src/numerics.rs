//! How far one run's outputs are from another's: per-step relative deviations and bit
//! identity.
//!
//! Hybrid may compute a layer's missed experts on the CPU with int8 activations (W4A8) while
//! offload computes them on the GPU, so the two are not numerically identical; and which
//! experts a hybrid step computes where depends on the cache's history. The field report
//! (shared/seeds) saw a fresh and a warmed hybrid service diverge on the same request. This
//! module measures both effects on the engine's real outputs (the hidden vector of every
//! stream after the last layer of each step): hybrid against offload with the same routing,
//! and a fresh hybrid run against a warmed one on the same request. Where the CPU and GPU
//! expert kernels are bit-identical (W4A8 on both sides) and the engine combines expert
//! outputs in a fixed order, the second comparison must be bit-exact.

use ft_model::routing::StepRouting;
use ft_model::{ExpertId, ModelSpec};
use serde::{Deserialize, Serialize};

use crate::bank::HostBank;
use crate::error::{Result, RuntimeError};

/// Outputs of one step: the final hidden vector of each stream, `[stream][hidden]`.
pub type StepOutputs = Vec<Vec<f32>>;

/// Smallest reference norm a relative deviation divides by (guards a zero output).
const MIN_NORM: f64 = 1e-30;

/// `||a - b||_2 / ||b||_2`, accumulated in f64 (`b` is the reference). Slices of different
/// lengths compare as infinitely far apart.
pub fn rel_l2(a: &[f32], b: &[f32]) -> f64 {
    if a.len() != b.len() {
        return f64::INFINITY;
    }
    let (mut num, mut den) = (0.0f64, 0.0f64);
    for (&x, &y) in a.iter().zip(b) {
        let d = x as f64 - y as f64;
        num += d * d;
        den += (y as f64) * (y as f64);
    }
    (num.sqrt()) / den.sqrt().max(MIN_NORM)
}

/// `max_i |a_i - b_i|` in f64 (infinite for different lengths).
pub fn max_abs_diff(a: &[f32], b: &[f32]) -> f64 {
    if a.len() != b.len() {
        return f64::INFINITY;
    }
    a.iter()
        .zip(b)
        .map(|(&x, &y)| (x as f64 - y as f64).abs())
        .fold(0.0, f64::max)
}

/// True when both hold the same f32 bit patterns (so `-0.0 != 0.0` and NaNs compare by
/// payload).
pub fn bit_identical(a: &[f32], b: &[f32]) -> bool {
    a.len() == b.len() && a.iter().zip(b).all(|(x, y)| x.to_bits() == y.to_bits())
}

/// The deviation of one step's outputs from the reference's.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct StepDeviation {
    /// Step index within the compared request (from 0).
    pub step: u64,
    /// Relative L2 deviation over all streams' outputs together.
    pub rel_l2: f64,
    /// Largest relative L2 deviation of one stream.
    pub max_stream_rel_l2: f64,
    /// Largest absolute element difference.
    pub max_abs: f64,
    /// Every output bit-identical.
    pub bit_identical: bool,
}

impl StepDeviation {
    /// Compare `candidate` with `reference` (the same streams, in order).
    pub fn of(step: u64, candidate: &StepOutputs, reference: &StepOutputs) -> Self {
        let flat = |o: &StepOutputs| o.iter().flatten().copied().collect::<Vec<f32>>();
        let (c, r) = (flat(candidate), flat(reference));
        let same_shape = candidate.len() == reference.len()
            && candidate
                .iter()
                .zip(reference)
                .all(|(a, b)| a.len() == b.len());
        let max_stream_rel_l2 = if same_shape {
            candidate
                .iter()
                .zip(reference)
                .map(|(a, b)| rel_l2(a, b))
                .fold(0.0, f64::max)
        } else {
            f64::INFINITY
        };
        StepDeviation {
            step,
            rel_l2: if same_shape {
                rel_l2(&c, &r)
            } else {
                f64::INFINITY
            },
            max_stream_rel_l2,
            max_abs: if same_shape {
                max_abs_diff(&c, &r)
            } else {
                f64::INFINITY
            },
            bit_identical: same_shape && bit_identical(&c, &r),
        }
    }
}

/// Deviation of a run's outputs from a reference run's, step by step.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Deviation {
    /// What is compared with what (e.g. `hybrid(f=0.300) vs offload`).
    pub label: String,
    /// Per step.
    pub steps: Vec<StepDeviation>,
    /// Largest per-step relative L2 deviation.
    pub max_rel_l2: f64,
    /// Mean per-step relative L2 deviation.
    pub mean_rel_l2: f64,
    /// Largest absolute element difference over all steps.
    pub max_abs: f64,
    /// Every step bit-identical (and the same number of steps).
    pub bit_identical: bool,
    /// First step whose outputs differ in any bit, if any.
    pub first_differing_step: Option<u64>,
}

impl Deviation {
    /// Compare two runs' outputs step by step (`candidate[i]` with `reference[i]`).
    pub fn between(
        label: impl Into<String>,
        candidate: &[StepOutputs],
        reference: &[StepOutputs],
    ) -> Self {
        let steps: Vec<StepDeviation> = candidate
            .iter()
            .zip(reference)
            .enumerate()
            .map(|(i, (c, r))| StepDeviation::of(i as u64, c, r))
            .collect();
        let n = steps.len().max(1) as f64;
        Deviation {
            label: label.into(),
            max_rel_l2: steps.iter().map(|s| s.rel_l2).fold(0.0, f64::max),
            mean_rel_l2: steps.iter().map(|s| s.rel_l2).sum::<f64>() / n,
            max_abs: steps.iter().map(|s| s.max_abs).fold(0.0, f64::max),
            bit_identical: candidate.len() == reference.len()
                && steps.iter().all(|s| s.bit_identical),
            first_differing_step: steps.iter().find(|s| !s.bit_identical).map(|s| s.step),
            steps,
        }
    }
}

/// The numerics of a run: its outputs against offload's, and a fresh engine's against the
/// warmed one's, on the same request.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NumericsReport {
    /// The run's strategy.
    pub strategy: String,
    /// GPU activation path.
    pub gpu_act: String,
    /// CPU activation path.
    pub cpu_act: String,
    /// Combine order.
    pub combine: String,
    /// Whether placement cannot change an output here (the fixed combine order, and either
    /// no CPU work or int8 on both sides), so that fresh and warmed runs must be
    /// bit-identical.
    pub expect_bit_identical: bool,
    /// The run against offload with the same routing, inputs and warm-up (absent for
    /// offload itself and for resident, which has another cache size).
    pub vs_offload: Option<Deviation>,
    /// A fresh engine (empty cache, no warm-up) against the warmed run, same request.
    pub fresh_vs_warmed: Deviation,
}

impl NumericsReport {
    /// False when outputs were expected bit-identical and are not.
    pub fn passed(&self) -> bool {
        !self.expect_bit_identical || self.fresh_vs_warmed.bit_identical
    }
}

/// Measure the numerics of `engine`'s strategy (see [`NumericsReport`]): `warmed` holds the
/// outputs the engine produced on `measured` after the warm-up steps `warm`. The engine is
/// run again fresh (cache reset, no warm-up), then as offload after the same warm-up; it is
/// left as offload with a cache that has seen that run.
pub fn compare_numerics(
    engine: &mut crate::engine::Engine,
    warm: &[StepRouting],
    measured: &[StepRouting],
    options: &crate::engine::DecodeOptions,
    warmed: &[StepOutputs],
) -> Result<NumericsReport> {
    use crate::engine::{decode, CombineOrder};
    use ft_kernels::ActivationPath;
    let strategy = engine.strategy();
    let cfg = engine.config().clone();
    // Of the strategy measured (the engine is switched to offload below).
    let uses_cpu = engine.placement().cpu_layers > 0 || engine.fetch_fraction() < 1.0;
    let opts = crate::engine::DecodeOptions {
        keep_outputs: true,
        keep_spans: false,
        ..options.clone()
    };
    engine.reset_cache()?;
    let fresh = decode(engine, &[], measured, &opts, &mut |_, _| {})?;
    let fresh_vs_warmed = Deviation::between(
        format!("{strategy} fresh vs warmed"),
        &fresh.outputs,
        warmed,
    );
    use ft_model::StrategyKind as K;
    // Offload and resident compute every expert on the GPU already; layer split's resident
    // layers live in slots an offload engine does not have, so it cannot switch.
    let vs_offload = match strategy.kind() {
        K::Offload | K::Resident | K::LayerSplit => None,
        K::Hybrid | K::Cpu | K::LayerSplitCached => {
            engine.set_strategy(ft_model::Strategy::Offload)?;
            let off = decode(engine, warm, measured, &opts, &mut |_, _| {})?;
            Some(Deviation::between(
                format!("{strategy} vs offload"),
                warmed,
                &off.outputs,
            ))
        }
    };
    // Without CPU work every expert runs the same GPU kernel wherever it sits; with it, only
    // the int8 path is the same computation on both sides, and only where the GPU computes
    // an expert whole (under tensor parallelism its slices' sums meet in the peer combine,
    // where the CPU's whole expert is one sum).
    let layout = engine.layout();
    let split = layout.is_multi() && layout.placement == ft_model::GpuPlacement::TensorParallel;
    let same_kernels = !uses_cpu
        || (cfg.gpu_path == ActivationPath::Int8 && cfg.cpu_path == ActivationPath::Int8 && !split);
    Ok(NumericsReport {
        strategy: strategy.to_string(),
        gpu_act: cfg.gpu_path.name().into(),
        cpu_act: cfg.cpu_path.name().into(),
        combine: cfg.combine.name().into(),
        expect_bit_identical: same_kernels && cfg.combine == CombineOrder::Fixed,
        vs_offload,
        fresh_vs_warmed,
    })
}

/// The slow reference forward of one step: every layer's routed experts for every stream in
/// f64 ([`ft_kernels::reference::reference_layer`]: weights decoded exactly, f64 arithmetic,
/// `f64::exp`), the residual stream carried in f64 and rounded to f32 only as each layer's
/// expert input. Router weights are scaled by `weight_scale` as the engine scales them.
/// Single-threaded; for tests and small models.
pub fn reference_forward(
    model: &ModelSpec,
    bank: &HostBank,
    routing: &StepRouting,
    inputs: &[Vec<f32>],
    weight_scale: f32,
) -> Result<Vec<Vec<f64>>> {
    let g = model.geometry;
    let h = g.hidden;
    let b = routing.streams();
    if inputs.len() != b || inputs.iter().any(|v| v.len() != h) {
        return Err(RuntimeError::invalid(
            "reference inputs",
            format!("{} inputs for {b} streams of hidden {h}", inputs.len()),
        ));
    }
    let mut x: Vec<f64> = inputs.iter().flatten().map(|&v| v as f64).collect();
    for (l, routes) in routing.layers.iter().enumerate() {
        // One expert work per (stream, expert): the f64 sum is exact enough for any order.
        let tokens: Vec<Vec<(u32, f32)>> = routes
            .iter()
            .enumerate()
            .flat_map(|(s, r)| {
                r.weights
                    .iter()
                    .map(move |&w| vec![(s as u32, w * weight_scale)])
            })
            .collect();
        let ids: Vec<ExpertId> = routes
            .iter()
            .flat_map(|r| r.experts.iter().map(move |&e| ExpertId::new(l, e as usize)))
            .collect();
        let work = ids
            .iter()
            .zip(&tokens)
            .map(|(&id, t)| {
                Ok(ft_kernels::ExpertWork {
                    weights: bank.expert(id)?,
                    tokens: t,
                })
            })
            .collect::<Result<Vec<_>>>()?;
        let xf: Vec<f32> = x.iter().map(|&v| v as f32).collect();
        let zero = vec![0f32; xf.len()];
        let y = ft_kernels::reference::reference_layer(model.format, &g, &work, &xf, &zero)
            .map_err(|e| RuntimeError::Kernel(e.to_string()))?;
        x.iter_mut().zip(&y).for_each(|(a, d)| *a += d);
    }
    Ok(x.chunks_exact(h).map(|c| c.to_vec()).collect())
}

/// `||a - b|| / ||b||` of an f32 output against an f64 reference (all streams together).
pub fn rel_l2_to_reference(outputs: &StepOutputs, reference: &[Vec<f64>]) -> f64 {
    let (mut num, mut den) = (0.0f64, 0.0f64);
    if outputs.len() != reference.len() {
        return f64::INFINITY;
    }
    for (o, r) in outputs.iter().zip(reference) {
        if o.len() != r.len() {
            return f64::INFINITY;
        }
        for (&a, &b) in o.iter().zip(r) {
            num += (a as f64 - b).powi(2);
            den += b * b;
        }
    }
    num.sqrt() / den.sqrt().max(MIN_NORM)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn deviations_against_hand_values() {
        assert_eq!(rel_l2(&[3.0, 4.0], &[3.0, 4.0]), 0.0);
        // ||(0, 1)|| / ||(3, 4)|| = 1 / 5
        assert!((rel_l2(&[3.0, 5.0], &[3.0, 4.0]) - 0.2).abs() < 1e-15);
        assert_eq!(max_abs_diff(&[1.0, -2.0], &[1.5, 2.0]), 4.0);
        assert!(rel_l2(&[1.0], &[1.0, 2.0]).is_infinite());
        assert!(bit_identical(&[1.0, 2.0], &[1.0, 2.0]));
        assert!(!bit_identical(&[0.0], &[-0.0]));
        assert_eq!(rel_l2(&[0.0], &[0.0]), 0.0);
    }

    #[test]
    fn run_deviation_finds_the_first_differing_step() {
        let a = vec![vec![vec![1.0f32, 2.0]], vec![vec![3.0, 4.0]]];
        let mut b = a.clone();
        let d = Deviation::between("same", &a, &b);
        assert!(d.bit_identical && d.first_differing_step.is_none());
        assert_eq!(d.max_rel_l2, 0.0);
        b[1][0][1] = 5.0;
        let d = Deviation::between("x vs y", &b, &a);
        assert!(!d.bit_identical);
        assert_eq!(d.first_differing_step, Some(1));
        assert!((d.steps[1].rel_l2 - 0.2).abs() < 1e-15);
        assert!((d.mean_rel_l2 - 0.1).abs() < 1e-15);
        assert_eq!(d.max_abs, 1.0);
        let d = Deviation::between("short", &a[..1], &a);
        assert!(!d.bit_identical, "a missing step is not identical");
    }
}
