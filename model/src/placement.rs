//! Where experts live on a host with several GPUs of one kind.
//!
//! A host with G GPUs shares one CPU pool and one host DRAM between G expert caches and G
//! PCIe links. Two layouts are common, and the runtime, the simulator and the analytic model
//! must agree on what each means, so it is defined once, here:
//!
//! - [`GpuPlacement::Sharded`]: every expert has one owner GPU (`expert % G`, round robin
//!   over a layer's experts, so a uniform router spreads evenly). Each GPU caches, gathers
//!   over its own link and computes only the experts it owns; a token's output is the sum of
//!   the partial outputs of the GPUs its experts live on (the combine).
//! - [`GpuPlacement::TensorParallel`]: every expert is split along its intermediate
//!   dimension into G slices, one per GPU. Every GPU holds the same experts (one slice
//!   each), so residency is identical across GPUs and one cache plan serves them all; a miss
//!   crosses all G links at once (a slice on each), and every layer ends in an all-reduce
//!   of the partial outputs.
//!
//! A plan per GPU is [`crate::plan_layer`] on that GPU's cache with the routes of
//! [`GpuLayout::routes_on`]: nothing else about a decode step changes with G.
//!
//! Units: bytes.

use serde::{Deserialize, Serialize};
use std::ops::Range;

use crate::error::{ModelError, Result};
use crate::routing::TokenRoute;

/// How experts are laid out over the GPUs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum GpuPlacement {
    /// Each expert on one GPU (`expert % G`).
    #[default]
    Sharded,
    /// Each expert split into G slices along its intermediate dimension, one per GPU.
    TensorParallel,
}

impl GpuPlacement {
    /// The name used in specs and on the command line.
    pub fn name(self) -> &'static str {
        match self {
            GpuPlacement::Sharded => "sharded",
            GpuPlacement::TensorParallel => "tensor-parallel",
        }
    }
}

impl std::str::FromStr for GpuPlacement {
    type Err = ModelError;
    fn from_str(s: &str) -> Result<Self> {
        match s {
            "sharded" => Ok(GpuPlacement::Sharded),
            "tensor-parallel" | "tp" => Ok(GpuPlacement::TensorParallel),
            other => Err(ModelError::invalid(
                "placement",
                format!("unknown GPU placement {other:?} (expected sharded or tensor-parallel)"),
            )),
        }
    }
}

/// G GPUs and the placement of experts over them. `gpus == 1` is the single-GPU case,
/// where both placements mean the same thing.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct GpuLayout {
    /// Number of GPUs decoding together (at least 1).
    pub gpus: u32,
    /// How experts are laid out over them.
    #[serde(default)]
    pub placement: GpuPlacement,
}

impl Default for GpuLayout {
    fn default() -> Self {
        GpuLayout::single()
    }
}

impl GpuLayout {
    /// One GPU.
    pub fn single() -> Self {
        GpuLayout {
            gpus: 1,
            placement: GpuPlacement::Sharded,
        }
    }

    /// `gpus` GPUs with `placement`; an error for zero GPUs.
    pub fn new(gpus: u32, placement: GpuPlacement) -> Result<Self> {
        if gpus == 0 {
            return Err(ModelError::invalid(
                "gpu.count",
                "at least one GPU is needed",
            ));
        }
        Ok(GpuLayout { gpus, placement })
    }

    /// Number of GPUs as a `usize`.
    pub fn count(&self) -> usize {
        self.gpus as usize
    }

    /// Whether more than one GPU takes part (a combine is needed).
    pub fn is_multi(&self) -> bool {
        self.gpus > 1
    }

    /// The GPU that owns expert `expert` of any layer; `None` under tensor parallelism,
    /// where every GPU holds a slice of it.
    pub fn owner(&self, expert: u32) -> Option<u32> {
        match self.placement {
            GpuPlacement::Sharded => Some(expert % self.gpus),
            GpuPlacement::TensorParallel => None,
        }
    }

    /// Whether GPU `gpu` computes (a part of) expert `expert`.
    pub fn holds(&self, gpu: u32, expert: u32) -> bool {
        self.owner(expert).is_none_or(|g| g == gpu)
    }

    /// The routes GPU `gpu` plans with: each token keeps only the experts that GPU holds,
    /// with their routing weights unchanged (the partial outputs are summed, not averaged,
    /// in the combine). Under tensor parallelism every GPU sees all routes.
    pub fn routes_on(&self, gpu: u32, routes: &[TokenRoute]) -> Vec<TokenRoute> {
        routes
            .iter()
            .map(|r| {
                let (experts, weights) = r
                    .experts
                    .iter()
                    .zip(&r.weights)
                    .filter(|(e, _)| self.holds(gpu, **e))
                    .map(|(e, w)| (*e, *w))
                    .unzip();
                TokenRoute { experts, weights }
            })
            .collect()
    }

    /// Bytes of one expert of `expert_bytes` that one GPU stores and gathers: the whole
    /// expert when sharded, one slice (rounded up) under tensor parallelism.
    pub fn bytes_per_gpu(&self, expert_bytes: u64) -> u64 {
        match self.placement {
            GpuPlacement::Sharded => expert_bytes,
            GpuPlacement::TensorParallel => expert_bytes.div_ceil(self.gpus as u64),
        }
    }

    /// Expert slots one GPU offers when it has `slot_bytes_budget` bytes for the cache and
    /// experts of `expert_bytes` bytes (a slice each under tensor parallelism).
    pub fn slots_per_gpu(&self, slot_bytes_budget: u64, expert_bytes: u64) -> usize {
        (slot_bytes_budget / self.bytes_per_gpu(expert_bytes).max(1)) as usize
    }

    /// Bytes each GPU sends in one layer's combine for `tokens` tokens of `hidden` f32
    /// outputs: zero on one GPU; a ring all-reduce sends `2 (G - 1) / G` of the buffer per
    /// GPU. Both placements combine the same buffer (a sharded combine of partial sums is an
    /// all-reduce too, since any GPU may hold a token's experts).
    pub fn combine_bytes_per_gpu(&self, tokens: usize, hidden: usize) -> u64 {
        if self.gpus <= 1 {
            return 0;
        }
        let buffer = (tokens * hidden * std::mem::size_of::<f32>()) as u64;
        let g = self.gpus as u64;
        (2 * (g - 1) * buffer).div_ceil(g)
    }

    /// The CPU workers of GPU `gpu`'s hybrid share when `threads` workers serve all GPUs:
    /// contiguous, disjoint ranges that together cover `0..threads` (the first
    /// `threads % G` GPUs get one more), so no two GPUs' pools pin the same core. A GPU may
    /// get an empty range when there are fewer workers than GPUs.
    pub fn cpu_workers(&self, gpu: u32, threads: usize) -> Range<usize> {
        let g = self.gpus as usize;
        let i = gpu as usize;
        let base = threads / g;
        let extra = threads % g;
        let start = i * base + i.min(extra);
        let len = base + usize::from(i < extra);
        start..start + len
    }

    /// Distinct cache plans a layer needs: one per GPU when sharded (each GPU caches and
    /// plans its own experts), one under tensor parallelism (every GPU holds a slice of the
    /// same experts, so one plan serves all; GPU `g` then uses plan `0`).
    pub fn plans(&self) -> usize {
        match self.placement {
            GpuPlacement::Sharded => self.count(),
            GpuPlacement::TensorParallel => 1,
        }
    }

    /// The plan GPU `gpu` executes (an index below [`GpuLayout::plans`]).
    pub fn plan_of(&self, gpu: u32) -> usize {
        match self.placement {
            GpuPlacement::Sharded => gpu as usize,
            GpuPlacement::TensorParallel => 0,
        }
    }

    /// Whether GPU `gpu`'s CPU workers compute the `i`-th CPU expert of the plan it runs:
    /// sharded, each GPU computes its own plan's CPU experts; under tensor parallelism every
    /// GPU runs the one shared plan, and its CPU experts are dealt out in turn (expert `i`
    /// to GPU `i mod G`), so each GPU's workers compute about `1/G` of them, whole.
    pub fn computes_cpu_expert(&self, gpu: u32, i: usize) -> bool {
        match self.placement {
            GpuPlacement::Sharded => true,
            GpuPlacement::TensorParallel => i % self.count().max(1) == gpu as usize,
        }
    }

    /// How many of its plan's `cpu` CPU experts GPU `gpu` computes
    /// ([`GpuLayout::computes_cpu_expert`]): a whole count exactly as the experts are
    /// dealt; an expected (fractional) count deals its whole experts alike and its fraction
    /// to the GPU whose turn is next, so the GPUs' shares sum to `cpu`.
    pub fn cpu_experts_on(&self, gpu: u32, cpu: f64) -> f64 {
        match self.placement {
            GpuPlacement::Sharded => cpu,
            GpuPlacement::TensorParallel => {
                let n = self.count().max(1) as f64;
                let (g, x) = (f64::from(gpu), cpu.max(0.0));
                let whole = x.floor();
                // Experts 0 .. whole - 1 dealt in turn: those with i mod n == g.
                let dealt = if whole > g {
                    ((whole - 1.0 - g) / n).floor() + 1.0
                } else {
                    0.0
                };
                let next = whole % n == g;
                dealt + if next { x - whole } else { 0.0 }
            }
        }
    }

    /// Check that `model` can be laid out this way; an error names `gpu.placement`.
    ///
    /// Tensor parallelism splits every expert along its intermediate dimension: `gate` and
    /// `up` lose rows, `down` loses columns, so each GPU's `down` slice has
    /// `intermediate / G` columns, which must be a whole number and a multiple of the
    /// format's block (group) length ([`crate::ExpertFormat::check_cols`]). Sharding takes
    /// any geometry, but more GPUs than experts per layer leave some GPUs without experts.
    pub fn check_model(&self, model: &crate::preset::ModelSpec) -> Result<()> {
        let g = self.count();
        let inter = model.geometry.intermediate;
        match self.placement {
            GpuPlacement::Sharded => {
                if g > model.geometry.experts {
                    return Err(ModelError::invalid(
                        "gpu.count",
                        format!(
                            "{g} GPUs sharded over {} experts per layer leave GPUs without experts",
                            model.geometry.experts
                        ),
                    ));
                }
                Ok(())
            }
            GpuPlacement::TensorParallel if g == 1 => Ok(()),
            GpuPlacement::TensorParallel => {
                if !inter.is_multiple_of(g) {
                    return Err(ModelError::invalid(
                        "gpu.placement",
                        format!(
                            "tensor-parallel over {g} GPUs needs geometry.intermediate ({inter}) \
                             divisible by {g}"
                        ),
                    ));
                }
                model
                    .format
                    .check_cols("geometry.intermediate / gpu.count", inter / g)
                    .map_err(|e| {
                        ModelError::invalid(
                            "gpu.placement",
                            format!(
                                "tensor-parallel over {g} GPUs gives each GPU a down slice of \
                                 {} columns, which {} cannot block: {e}",
                                inter / g,
                                model.format.name()
                            ),
                        )
                    })
            }
        }
    }

    /// A routing popularity (indexed by [`crate::ExpertId::flat`] over `experts_per_layer`
    /// experts per layer) with the experts GPU `gpu` does not hold ranked below every held
    /// one (`-inf`), so a static hot set chosen from it holds only that GPU's experts.
    pub fn popularity_on(
        &self,
        gpu: u32,
        popularity: &[f64],
        experts_per_layer: usize,
    ) -> Vec<f64> {
        popularity
            .iter()
            .enumerate()
            .map(|(f, &p)| {
                let expert = (f % experts_per_layer.max(1)) as u32;
                if self.holds(gpu, expert) {
                    p
                } else {
                    f64::NEG_INFINITY
                }
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The expected count of each GPU's CPU experts against dealing them one by one.
    #[test]
    fn cpu_experts_are_dealt_out_under_tensor_parallelism() {
        for gpus in 1..=4u32 {
            let tp = GpuLayout::new(gpus, GpuPlacement::TensorParallel).unwrap();
            let sharded = GpuLayout::new(gpus, GpuPlacement::Sharded).unwrap();
            for cpu in 0..=11usize {
                let mut total = 0.0;
                for g in 0..gpus {
                    let naive = (0..cpu).filter(|&i| tp.computes_cpu_expert(g, i)).count();
                    assert_eq!(tp.cpu_experts_on(g, cpu as f64), naive as f64);
                    assert_eq!(sharded.cpu_experts_on(g, cpu as f64), cpu as f64);
                    total += tp.cpu_experts_on(g, cpu as f64 + 0.25);
                }
                // A fraction goes to the GPU whose turn is next; the shares sum to the count.
                assert!((total - (cpu as f64 + 0.25)).abs() < 1e-12, "{gpus} {cpu}");
                assert_eq!(
                    tp.cpu_experts_on(cpu as u32 % gpus, cpu as f64 + 0.25),
                    tp.cpu_experts_on(cpu as u32 % gpus, cpu as f64) + 0.25
                );
            }
        }
    }

    fn route(experts: &[u32]) -> TokenRoute {
        let w = 1.0 / experts.len() as f32;
        TokenRoute {
            experts: experts.to_vec(),
            weights: vec![w; experts.len()],
        }
    }

    #[test]
    fn sharded_routes_partition_every_token_s_experts() {
        let l = GpuLayout::new(3, GpuPlacement::Sharded).unwrap();
        let routes = vec![route(&[0, 1, 2, 3, 7]), route(&[5, 9, 11])];
        let per: Vec<Vec<TokenRoute>> = (0..3).map(|g| l.routes_on(g, &routes)).collect();
        for (t, r) in routes.iter().enumerate() {
            let mut all: Vec<(u32, f32)> = per
                .iter()
                .flat_map(|p| {
                    p[t].experts
                        .iter()
                        .copied()
                        .zip(p[t].weights.iter().copied())
                })
                .collect();
            all.sort_by_key(|x| x.0);
            let mut want: Vec<(u32, f32)> = r
                .experts
                .iter()
                .copied()
                .zip(r.weights.iter().copied())
                .collect();
            want.sort_by_key(|x| x.0);
            assert_eq!(all, want);
        }
        for (g, p) in per.iter().enumerate() {
            assert!(p.iter().flat_map(|r| &r.experts).all(|e| e % 3 == g as u32));
        }
    }

    #[test]
    fn tensor_parallel_gpus_see_everything_and_hold_slices() {
        let l = GpuLayout::new(4, GpuPlacement::TensorParallel).unwrap();
        let routes = vec![route(&[0, 1, 2]), route(&[3])];
        for g in 0..4 {
            assert_eq!(l.routes_on(g, &routes), routes);
        }
        assert_eq!(l.bytes_per_gpu(2_772_480), 693_120);
        assert_eq!(l.bytes_per_gpu(10), 3);
        assert_eq!(l.slots_per_gpu(693_120 * 5, 2_772_480), 5);
    }

    #[test]
    fn one_gpu_is_the_single_gpu_case() {
        for p in [GpuPlacement::Sharded, GpuPlacement::TensorParallel] {
            let l = GpuLayout::new(1, p).unwrap();
            let routes = vec![route(&[4, 8, 15])];
            assert_eq!(l.routes_on(0, &routes), routes);
            assert_eq!(l.bytes_per_gpu(1000), 1000);
            assert_eq!(l.combine_bytes_per_gpu(8, 2560), 0);
            assert_eq!(l.cpu_workers(0, 15), 0..15);
        }
        assert!(GpuLayout::new(0, GpuPlacement::Sharded).is_err());
    }

    #[test]
    fn cpu_workers_are_disjoint_and_cover_the_pool() {
        for g in 1..=5u32 {
            let l = GpuLayout::new(g, GpuPlacement::Sharded).unwrap();
            for threads in 0..20 {
                let mut seen = vec![0u32; threads];
                for gpu in 0..g {
                    for w in l.cpu_workers(gpu, threads) {
                        seen[w] += 1;
                    }
                }
                assert!(seen.iter().all(|&c| c == 1), "g {g} threads {threads}");
            }
        }
    }

    #[test]
    fn ring_all_reduce_bytes_match_a_naive_count() {
        // Naive ring: G - 1 reduce-scatter steps and G - 1 all-gather steps, each sending
        // one 1/G chunk of the buffer.
        for g in 2..=8u32 {
            let l = GpuLayout::new(g, GpuPlacement::TensorParallel).unwrap();
            let buffer = (3 * 2048 * 4) as u64;
            let chunk = buffer as f64 / g as f64;
            let naive = (2 * (g - 1)) as f64 * chunk;
            let got = l.combine_bytes_per_gpu(3, 2048) as f64;
            assert!((got - naive).abs() <= 1.0, "g {g}: {got} vs {naive}");
        }
    }

    #[test]
    fn tensor_parallel_needs_a_blockable_slice_and_says_which_field() {
        let m = crate::preset::ModelSpec::preset("qwen3.8-flash-next").unwrap();
        let inter = m.geometry.intermediate;
        let block = m.format.block_len().max(1);
        for g in 1..=8u32 {
            let l = GpuLayout::new(g, GpuPlacement::TensorParallel).unwrap();
            let g = g as usize;
            // Naive reference: whole slice and a multiple of the block (and even for 4 bits).
            let ok = g == 1
                || (inter.is_multiple_of(g)
                    && (inter / g).is_multiple_of(block)
                    && (!m.format.is_4bit() || (inter / g).is_multiple_of(2)));
            let r = l.check_model(&m);
            assert_eq!(r.is_ok(), ok, "g {g}: {r:?}");
            if let Err(e) = r {
                assert!(e.to_string().contains("gpu.placement"), "{e}");
            }
        }
        let mut odd = m.clone();
        odd.geometry.intermediate = 48; // 48 / 2 = 24, not a multiple of nvfp4's 16
        odd.format = crate::ExpertFormat::Nvfp4;
        let e = GpuLayout::new(2, GpuPlacement::TensorParallel)
            .unwrap()
            .check_model(&odd)
            .unwrap_err()
            .to_string();
        assert!(e.contains("gpu.placement") && e.contains("24"), "{e}");
        assert!(GpuLayout::new(2, GpuPlacement::Sharded)
            .unwrap()
            .check_model(&odd)
            .is_ok());
    }

    #[test]
    fn plans_and_popularity_follow_the_placement() {
        let s = GpuLayout::new(2, GpuPlacement::Sharded).unwrap();
        let t = GpuLayout::new(2, GpuPlacement::TensorParallel).unwrap();
        assert_eq!((s.plans(), s.plan_of(1)), (2, 1));
        assert_eq!((t.plans(), t.plan_of(1)), (1, 0));
        let pop = [5.0, 4.0, 3.0, 2.0, 1.0, 0.5];
        let on1 = s.popularity_on(1, &pop, 3);
        // Layer 0: experts 0,1,2; layer 1: 0,1,2. GPU 1 holds expert 1 only.
        assert_eq!(on1[1], 4.0);
        assert_eq!(on1[4], 1.0);
        assert!(on1[0].is_infinite() && on1[2].is_infinite() && on1[3].is_infinite());
        assert_eq!(t.popularity_on(1, &pop, 3), pop.to_vec());
    }

    #[test]
    fn placement_names_round_trip() {
        for p in [GpuPlacement::Sharded, GpuPlacement::TensorParallel] {
            assert_eq!(p.name().parse::<GpuPlacement>().unwrap(), p);
        }
        assert!("striped".parse::<GpuPlacement>().is_err());
    }
}
