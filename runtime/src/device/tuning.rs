//! The switches of the CUDA paths that are still measured against each other.
//!
//! The expert kernels and the gather copies have alternative paths (staged weight tiles, a
//! dependent launch of the down kernel, the split-sign e2m1 dot, pipelined staging, the
//! hardware e4m3 decode, an L2 prefetch of the down matrices, a small launch table, the
//! small-grid kernels, a forced kernel instantiation, batched or split copies) whose
//! defaults follow the A/B measurements of
//! `experiments/gpu-backend` and `experiments/runtime-grid`. A script picks one with an
//! environment variable; the variables are read **once**, when a CUDA device opens, and
//! the result is a [`CudaTuning`] that the device keeps. So a decode step reads no
//! environment (a lock and an allocation per read, several per layer otherwise), a
//! malformed value is an error naming the variable instead of silently meaning "off", so is
//! an `FT_CUDA_` variable that is no switch (a misspelt one left a grid A/B comparing the
//! default with itself, 2026-12-06), and every report (`ft run`, `ft probe`, `ft bench bw`)
//! records in its `device` the paths it ran. A measurement that compares paths in one process (the `gpu_backend` micro-bench,
//! the device tests) sets them with [`crate::Device::set_cuda_tuning`] rather than the
//! environment, which is not safe to change while other threads may read it.

use serde::{Deserialize, Serialize};
use std::fmt;

use crate::error::{Result, RuntimeError};

/// `0` turns the staged weight tiles of the expert kernels off (default on): each block
/// then reads its weights from global memory as it computes.
pub const CUDA_STAGE_ENV: &str = "FT_CUDA_STAGE";

/// `0` turns the programmatic dependent launch of the down kernel off (default on).
pub const CUDA_PDL_ENV: &str = "FT_CUDA_PDL";

/// `0` turns the one-token kernels' split-sign e2m1 dot off (default on): two byte permutes
/// and two dp4a per four nvfp4/mxfp4 codes instead of a signed decode (`FT_E2M1_SPLIT` in
/// `kernels/cuda/experts.cu`), the same exact integers. On since 2026-12-05: bit-identical in
/// the GPU tests, 23.3 us against 27.2 for 10 experts at one token on the H200
/// (`experiments/gpu-backend/results/20261205T0157Z-split-batch`).
pub const CUDA_SPLIT_ENV: &str = "FT_CUDA_SPLIT";

/// Column stages (1 to 4) of the gate/up kernels' pipelined staged tiles (default 1, whole
/// tiles): each warp stages the rows it computes in that many column stages and computes
/// each as soon as it has landed (`FT_PIPE_STAGES` in `kernels/cuda/experts.cu`), the same
/// bits. Off: 11 to 36% slower on an H100 (2026-12-05), measured while each warp's first
/// stage also copied its rows' 2-byte factors with plain loads that stalled the warp before
/// its later stages were issued; since 2026-12-06 the factors are read from global memory
/// instead, not yet measured (`gpu_backend`'s `+pipe2` and `+pipe4` rows).
pub const CUDA_PIPE_ENV: &str = "FT_CUDA_PIPE";

/// The most column stages [`CUDA_PIPE_ENV`] takes (the kernels' `cp.async.wait_group` waits).
pub const CUDA_PIPE_MAX_STAGES: u8 = 4;

/// `0` turns off the hardware's e4m3 conversion of the nvfp4 block scales (default on;
/// `FT_E4M3_CVT` in `kernels/cuda/experts.cu`: two instructions instead of seven in the
/// innermost loop, the same f32 for every code but the NaNs, which stay NaN). On since
/// 2026-12-06: bit-identical in the GPU tests, 10 experts at one token 25.9 us against 26.7
/// on an H100 in two runs (`experiments/gpu-backend/results/20261206T0329Z-h100-switches`).
pub const CUDA_E4M3_CVT_ENV: &str = "FT_CUDA_E4M3_CVT";

/// `1` has each staged gate/up block prefetch its share of its task's down matrix into L2
/// (`FT_PREFETCH_DOWN` in `kernels/cuda/experts.cu`), so that the down blocks that start
/// after gate/up read their tiles from L2 instead of DRAM. A hint, the same bits. Off: 5%
/// slower at one token on an H100 (28.2 against 26.7 us for 10 experts, the prefetches
/// compete with gate/up's own tiles; `experiments/gpu-backend/results/
/// 20261206T0329Z-h100-switches`).
pub const CUDA_PREFETCH_DOWN_ENV: &str = "FT_CUDA_PREFETCH_DOWN";

/// `1` launches the expert kernels with a 512-byte table parameter where the launch's table
/// fits it (a one-token layer of up to 16 experts; larger tables take the 3 KiB parameter),
/// to measure what the parameter's size costs each launch (`FT_PARAM_TABLE_BYTES` in
/// `kernels/cuda/common.cuh`). Off: no difference measured on an H100 (0 tokens 7.00 against
/// 7.03 us, 1 token 26.70 against 26.70; `experiments/gpu-backend/results/
/// 20261206T0329Z-h100-switches`), so the parameter's size is not the launches' fixed cost.
pub const CUDA_SMALL_TABLE_ENV: &str = "FT_CUDA_SMALL_TABLE";

/// `0` turns off the small-grid instantiation (default on) that runs one-token launches of
/// at most one gate/up block per multiprocessor (a layer's last fetched chunk, a few
/// experts): a 512-thread gate/up kernel with one dot per half-warp and a down kernel of half
/// the rows per block (`ft_experts_gate_up_1w`, `ft_experts_down_1s` in
/// `kernels/cuda/experts.cu`), the same bits. On since 2026-12-06: bit-identical in the GPU
/// tests; one expert 10.5 us against 11.5, two 11.3 against 12.1 on an H100 in two runs
/// (`experiments/gpu-backend/results/20261206T0329Z-h100-switches`); the engine's quick
/// grid the same within its noise (`experiments/runtime-grid/results/
/// 20261206T0336Z-h100-small-grid`).
pub const CUDA_SMALL_GRID_ENV: &str = "FT_CUDA_SMALL_GRID";

/// `1` runs each one-token int8 launch of the expert kernels as one launch for both halves
/// (`ft_experts_layer_1` in `kernels/cuda/experts.cu`): a block does a gate/up item, then a
/// down item once its task's h is complete, instead of a second, dependent launch whose
/// blocks wait for the first grid to leave the multiprocessors before they can stage their
/// tiles. The same arithmetic, so the same bits; where on it takes precedence over the
/// small-grid instantiation. Off: slower everywhere on an H100 (10 experts 28.9 against 25.8
/// us, one expert 13.0 against 10.5, no work 8.3 against 7.1: each block's chain of tickets
/// and fences costs more than the second launch, and a block stages its down tile only after
/// its gate/up item; `experiments/gpu-backend/results/20261206T0605Z-h100-fused`).
pub const CUDA_FUSED_ENV: &str = "FT_CUDA_FUSED";

/// `1` has one-token launches of the two-launch path that take the default instantiation
/// use the small-grid down kernel (`ft_experts_down_1s`: 32 rows per block instead of 64,
/// so twice the blocks and warps, each with half the rows), the profile's first suggestion
/// for the latency-bound down kernel of a one-token layer (2026-12-06). The same arithmetic,
/// so the same bits. Off: 10 experts 27.8 against 25.8 us on an H100 (the extra blocks start
/// only as gate/up blocks leave, and each row tile's fixed work doubles in count;
/// `experiments/gpu-backend/results/20261206T0605Z-h100-fused`).
pub const CUDA_SHORT_DOWN_ENV: &str = "FT_CUDA_SHORT_DOWN";

/// `1` launches the gate/up kernel as a programmatic dependent of the kernel before it on its
/// stream (a chained launch): once every block of that kernel has started (the previous
/// layer's down kernel signals at its start), gate/up's blocks are scheduled into the slots
/// its blocks leave and request their weight tiles, then wait for it to complete before they
/// read x or write h (`pdl_wait` in `kernels/cuda/experts.cu`'s gate_up_impl). The block
/// timelines of 2026-12-06 put 2.6 us between one layer's last block and the next one's
/// first, and gate/up's tiles landing 7.9 us after its start, both after the previous
/// layer had ended (`experiments/gpu-backend`, "Block timelines"). The same arithmetic and
/// order of every write, so the same bits.
pub const CUDA_CHAIN_ENV: &str = "FT_CUDA_CHAIN";

/// `1` runs the down half of one-token launches of 1 to 16 experts with staged tiles as the
/// cross-task kernel (`ft_experts_down_1x` in `kernels/cuda/experts.cu`): a block takes a
/// row tile of every task and adds the tasks' partial rows per token in shared memory,
/// instead of a block per row tile and task whose partial rows the tile's last block adds up
/// after an atomic ticket. The block timelines of 2026-12-06 put that last block's ticket
/// and combine at 2.3 us of a 24.7 us layer, after every other block (6.3 under a chained
/// launch). The same arithmetic and order of additions, so the same bits (the GPU tests run
/// it). Off: slower on an H100 while each thread issued its copies of every task (10
/// experts 29.4 against 24.8 us, offload at one stream x0.99; its blocks on one
/// multiprocessor passed the wait for h about 1 us apart), even with the default since the
/// copies are issued by warps (24.83 against 24.65 us; `experiments/gpu-backend`, "A down
/// kernel across tasks").
pub const CUDA_CROSS_DOWN_ENV: &str = "FT_CUDA_CROSS_DOWN";

/// Forces the cross-task down kernel's row groups per half-warp (1 or 2; unset: one,
/// `gpu_experts::cuda_cross_down`), so that one run can time both forms beside the default.
/// Two lost 3.6 us against one on an H100 (10 experts, 28.41 against 24.83 us; 2026-12-06).
pub const CUDA_CROSS_ROWS_ENV: &str = "FT_CUDA_CROSS_ROWS";

/// The most row groups per half-warp the cross-task down kernel takes (`CROSS_MAX_REPS` in
/// `kernels/cuda/experts.cu`).
pub const CUDA_CROSS_MAX_ROW_GROUPS: u8 = 2;

/// `1` stages the gate/up kernels' whole tiles by bulk copies (`FT_BULK_STAGE` in
/// `kernels/cuda/experts.cu`; sm_90): lane 0 of each warp hands the multiprocessor's tensor
/// memory accelerator one copy per contiguous range of the rows its half-warps compute, on
/// the warp's own mbarrier, and the warp computes as soon as its rows have landed, instead
/// of the whole block waiting for the whole tile. The block timelines put a one-token
/// layer's gate/up decode (3.5 us) after all of its tiles had landed, and the hope was that
/// the first warps' rows would land first. They do not: with every copy in flight at once,
/// warp 0's rows landed as late as the whole tile had. The same bytes in the same places, so
/// the same bits; staged whole tiles only (not with [`CUDA_PIPE_ENV`]). Off: no gain on an
/// H100 (24.75 against 24.65 us for 10 experts at one token, offload at one stream x0.993;
/// `experiments/gpu-backend/results/20261206T1410Z-h100-bulk`). Throttled to a few warps'
/// copies of a block in flight (`FT_CUDA_BULK_WARPS`, fe3ea04), the first rows landed earlier
/// but each request then waited about 2.5 us and the DRAM rate fell with the bytes in flight:
/// slower at every depth (10 experts at one token: 30.00, 26.61, 25.11 us with one, two, four
/// warps' copies in flight, against 25.01; `.../20261206T1518Z-h100-bulk-throttle`), so the
/// throttle was taken out again.
pub const CUDA_BULK_ENV: &str = "FT_CUDA_BULK";

/// `1` builds the expert kernels with block timelines (`FT_STAMPS` in
/// `kernels/cuda/experts.cu`): every block notes when it starts, when its start condition is
/// met, when its tiles have landed, when its own work is done and when it ends, read back by
/// [`crate::Device::take_block_stamps`] (`gpu_backend --stamps`). Instrumentation: the same
/// results, a few hundred nanoseconds more per block; off by default.
pub const CUDA_STAMPS_ENV: &str = "FT_CUDA_STAMPS";

/// Forces one instantiation of the expert kernels by its tokens per pass (1, 2, 4 or 8),
/// for A/B measurements of the variants; unset: chosen by each launch's largest task.
pub const CUDA_VARIANT_ENV: &str = "FT_CUDA_EXPERT_VARIANT";

/// `1` (the default) submits a gather's copies in one batch (`cuMemcpyBatchAsync`, drivers of
/// CUDA 13 and later; one copy each, with a warning, on older ones), `0` one
/// `cuMemcpyHtoDAsync` each: the copies of a batch may run in any order, possibly on several
/// copy engines at once, which hides the few microseconds each copy costs beyond its bytes.
/// On since 2026-12-05: a gather of 8 experts at 98.7% of the linear copy against 94.6%, and
/// offload and hybrid 3 to 13% faster in the engine (`experiments/runtime-grid/results/
/// 20261205T0213Z-quick-batch`).
pub const CUDA_COPY_BATCH_ENV: &str = "FT_CUDA_COPY_BATCH";

/// `1` splits a gather's copies over two streams (every other copy on a second stream
/// forked from the copy stream and joined back), so that two copy engines run them at once
/// and each copy's fixed cost hides behind the other engine's bytes. Off by default: no gain
/// measured (`experiments/runtime-grid/results/20261205T0157Z-quick-split`). It wins over
/// the default batch where set. The host-emulated device copies the same either way.
pub const CUDA_COPY_SPLIT_ENV: &str = "FT_CUDA_COPY_SPLIT";

/// Every variable above, for scripts and error messages.
pub const CUDA_TUNING_ENVS: [&str; 18] = [
    CUDA_STAGE_ENV,
    CUDA_PDL_ENV,
    CUDA_SPLIT_ENV,
    CUDA_PIPE_ENV,
    CUDA_E4M3_CVT_ENV,
    CUDA_PREFETCH_DOWN_ENV,
    CUDA_SMALL_TABLE_ENV,
    CUDA_SMALL_GRID_ENV,
    CUDA_FUSED_ENV,
    CUDA_SHORT_DOWN_ENV,
    CUDA_CHAIN_ENV,
    CUDA_CROSS_DOWN_ENV,
    CUDA_CROSS_ROWS_ENV,
    CUDA_BULK_ENV,
    CUDA_STAMPS_ENV,
    CUDA_VARIANT_ENV,
    CUDA_COPY_BATCH_ENV,
    CUDA_COPY_SPLIT_ENV,
];

/// The expert kernels' instantiations by tokens per pass (`gpu_experts`' variants).
pub const CUDA_VARIANT_TOKENS: [usize; 4] = [1, 2, 4, 8];

/// How a gather's copies are submitted to the copy engines.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum CopySubmit {
    /// One `cuMemcpyHtoDAsync` per region, in order on the copy stream.
    Each,
    /// Every region in one `cuMemcpyBatchAsync` ([`CUDA_COPY_BATCH_ENV`]).
    #[default]
    Batch,
    /// Alternately on the copy stream and a sibling ([`CUDA_COPY_SPLIT_ENV`]).
    Split,
}

impl CopySubmit {
    /// Name in tables and JSON.
    pub fn name(self) -> &'static str {
        match self {
            CopySubmit::Each => "each",
            CopySubmit::Batch => "batch",
            CopySubmit::Split => "split",
        }
    }
}

/// Which of the alternative CUDA paths a device runs (module docs).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct CudaTuning {
    /// Stage each block's weight tile in shared memory before computing ([`CUDA_STAGE_ENV`]).
    pub staged_tiles: bool,
    /// Launch the down kernel as a programmatic dependent of gate/up ([`CUDA_PDL_ENV`]).
    pub dependent_launch: bool,
    /// The split-sign e2m1 dot of the one-token kernels ([`CUDA_SPLIT_ENV`]).
    pub e2m1_split: bool,
    /// Column stages of the staged gate/up tiles, 1 (whole tiles) to
    /// [`CUDA_PIPE_MAX_STAGES`] ([`CUDA_PIPE_ENV`]); staged tiles only.
    pub pipe_stages: u8,
    /// The hardware e4m3 decode of nvfp4 block scales ([`CUDA_E4M3_CVT_ENV`]).
    pub e4m3_cvt: bool,
    /// The staged gate/up blocks' L2 prefetch of the down matrices
    /// ([`CUDA_PREFETCH_DOWN_ENV`]); staged tiles only.
    pub prefetch_down: bool,
    /// The small launch table parameter where a launch's table fits it
    /// ([`CUDA_SMALL_TABLE_ENV`]).
    pub small_table: bool,
    /// The small-grid one-token instantiation where a launch has fewer gate/up blocks than
    /// multiprocessors ([`CUDA_SMALL_GRID_ENV`]).
    pub small_grid: bool,
    /// One launch for both halves of a one-token int8 layer ([`CUDA_FUSED_ENV`]).
    pub fused_layer: bool,
    /// The small-grid down kernel for every two-launch one-token layer
    /// ([`CUDA_SHORT_DOWN_ENV`]).
    pub short_down: bool,
    /// The gate/up kernel launched as a programmatic dependent of the kernel before it
    /// ([`CUDA_CHAIN_ENV`]).
    pub chained_launch: bool,
    /// The cross-task down kernel of one-token launches of up to 16 experts
    /// ([`CUDA_CROSS_DOWN_ENV`]).
    pub cross_down: bool,
    /// The cross-task down kernel's row groups per half-warp, forced (1 to
    /// [`CUDA_CROSS_MAX_ROW_GROUPS`]); `None`: one ([`CUDA_CROSS_ROWS_ENV`]).
    pub cross_row_groups: Option<u8>,
    /// The gate/up kernels' whole staged tiles by bulk copies, each warp's rows on its own
    /// mbarrier ([`CUDA_BULK_ENV`]); staged whole tiles only.
    pub bulk_copies: bool,
    /// Block timelines in the expert kernels ([`CUDA_STAMPS_ENV`]; instrumentation).
    pub block_stamps: bool,
    /// The forced instantiation, tokens per pass; `None`: by each launch's largest task
    /// ([`CUDA_VARIANT_ENV`]).
    pub expert_variant: Option<usize>,
    /// How a gather's copies are submitted.
    pub copies: CopySubmit,
}

impl CudaTuning {
    /// Every path switch off (direct reads, whole tiles), no forced variant, batched copies:
    /// what [`CudaTuning::default`] and [`CudaTuning::with_path`] turn switches on from.
    const PATHS_OFF: CudaTuning = CudaTuning {
        staged_tiles: false,
        dependent_launch: false,
        e2m1_split: false,
        pipe_stages: 1,
        e4m3_cvt: false,
        prefetch_down: false,
        small_table: false,
        small_grid: false,
        fused_layer: false,
        short_down: false,
        chained_launch: false,
        cross_down: false,
        cross_row_groups: None,
        bulk_copies: false,
        block_stamps: false,
        expert_variant: None,
        copies: CopySubmit::Batch,
    };
}

impl Default for CudaTuning {
    /// The paths the measurements made defaults (each variable's docs say when and why).
    fn default() -> Self {
        CudaTuning {
            staged_tiles: true,
            dependent_launch: true,
            e2m1_split: true,
            e4m3_cvt: true,
            small_grid: true,
            ..Self::PATHS_OFF
        }
    }
}

/// The error of a [`CUDA_CROSS_ROWS_ENV`] value that is no number of row groups.
fn not_row_groups(value: &str) -> RuntimeError {
    RuntimeError::invalid(
        CUDA_CROSS_ROWS_ENV,
        format!("'{value}' is not a number of row groups per half-warp; use 1 to {CUDA_CROSS_MAX_ROW_GROUPS}, or leave it unset"),
    )
}

/// The error of a [`CUDA_PIPE_ENV`] value that is no number of column stages.
fn not_pipe_stages(value: &str) -> RuntimeError {
    RuntimeError::invalid(
        CUDA_PIPE_ENV,
        format!("'{value}' is not a number of column stages; use 1 (whole tiles) to {CUDA_PIPE_MAX_STAGES}"),
    )
}

/// The error of an [`CUDA_VARIANT_ENV`] value that names no instantiation.
fn not_a_variant(value: &str) -> RuntimeError {
    RuntimeError::invalid(
        CUDA_VARIANT_ENV,
        format!("'{value}' is not an instantiation of the expert kernels; tokens per pass: {CUDA_VARIANT_TOKENS:?}"),
    )
}

/// The prefix of every CUDA tuning variable ([`CUDA_TUNING_ENVS`]).
pub const CUDA_TUNING_PREFIX: &str = "FT_CUDA_";

/// An error naming the first of `names` that carries [`CUDA_TUNING_PREFIX`] but is not one of
/// [`CUDA_TUNING_ENVS`], with the switches there are.
pub fn refuse_unknown_switches(names: impl IntoIterator<Item = String>) -> Result<()> {
    match names
        .into_iter()
        .find(|n| n.starts_with(CUDA_TUNING_PREFIX) && !CUDA_TUNING_ENVS.contains(&n.as_str()))
    {
        None => Ok(()),
        Some(name) => Err(RuntimeError::invalid(
            name,
            format!(
                "is not a CUDA tuning switch, so it would change nothing; the switches are {}",
                CUDA_TUNING_ENVS.join(", ")
            ),
        )),
    }
}

impl CudaTuning {
    /// The tuning the process environment asks for (module docs); a malformed value, or a
    /// variable named like a switch that is none (a misspelt switch would otherwise leave
    /// an A/B comparing the default with itself), is a [`RuntimeError::Invalid`] naming the
    /// variable.
    pub fn from_env() -> Result<Self> {
        refuse_unknown_switches(std::env::vars_os().filter_map(|(k, _)| k.into_string().ok()))?;
        Self::from_lookup(|name| std::env::var(name).ok())
    }

    /// The tuning `lookup` (variable name to value) asks for. An empty value counts as
    /// unset.
    pub fn from_lookup(lookup: impl Fn(&str) -> Option<String>) -> Result<Self> {
        let get = |name: &str| lookup(name).filter(|v| !v.trim().is_empty());
        // A switch as set (`None` where unset).
        let switch = |name: &str| -> Result<Option<bool>> {
            match get(name) {
                None => Ok(None),
                Some(v) => match v.trim() {
                    "0" => Ok(Some(false)),
                    "1" => Ok(Some(true)),
                    other => Err(RuntimeError::invalid(
                        name,
                        format!("'{other}' is not a switch; use 0 or 1, or leave it unset"),
                    )),
                },
            }
        };
        let d = CudaTuning::default();
        let expert_variant = match get(CUDA_VARIANT_ENV) {
            None => None,
            Some(v) => match v.trim().parse::<usize>() {
                Ok(n) if CUDA_VARIANT_TOKENS.contains(&n) => Some(n),
                _ => return Err(not_a_variant(v.trim())),
            },
        };
        // A count of 1 to `max` as set (`None` where unset), or `refuse`'s error.
        let count = |name: &str, max: u8, refuse: fn(&str) -> RuntimeError| -> Result<Option<u8>> {
            get(name)
                .map(|v| {
                    let v = v.trim();
                    v.parse::<u8>()
                        .ok()
                        .filter(|n| (1..=max).contains(n))
                        .ok_or_else(|| refuse(v))
                })
                .transpose()
        };
        let cross_row_groups = count(
            CUDA_CROSS_ROWS_ENV,
            CUDA_CROSS_MAX_ROW_GROUPS,
            not_row_groups,
        )?;
        let pipe_stages =
            count(CUDA_PIPE_ENV, CUDA_PIPE_MAX_STAGES, not_pipe_stages)?.unwrap_or(d.pipe_stages);
        // Split where asked, batched where asked (the default), one each where batching is
        // turned off; both asked is a contradiction.
        let (batch, split) = (switch(CUDA_COPY_BATCH_ENV)?, switch(CUDA_COPY_SPLIT_ENV)?);
        let copies = match (batch, split) {
            (Some(true), Some(true)) => {
                return Err(RuntimeError::invalid(
                    CUDA_COPY_BATCH_ENV,
                    format!("{CUDA_COPY_BATCH_ENV} and {CUDA_COPY_SPLIT_ENV} are both 1; a gather submits its copies one way, choose one"),
                ))
            }
            (_, Some(true)) => CopySubmit::Split,
            (Some(true), _) => CopySubmit::Batch,
            (Some(false), _) => CopySubmit::Each,
            (None, _) => d.copies,
        };
        Ok(CudaTuning {
            staged_tiles: switch(CUDA_STAGE_ENV)?.unwrap_or(d.staged_tiles),
            dependent_launch: switch(CUDA_PDL_ENV)?.unwrap_or(d.dependent_launch),
            e2m1_split: switch(CUDA_SPLIT_ENV)?.unwrap_or(d.e2m1_split),
            pipe_stages,
            e4m3_cvt: switch(CUDA_E4M3_CVT_ENV)?.unwrap_or(d.e4m3_cvt),
            prefetch_down: switch(CUDA_PREFETCH_DOWN_ENV)?.unwrap_or(d.prefetch_down),
            small_table: switch(CUDA_SMALL_TABLE_ENV)?.unwrap_or(d.small_table),
            small_grid: switch(CUDA_SMALL_GRID_ENV)?.unwrap_or(d.small_grid),
            fused_layer: switch(CUDA_FUSED_ENV)?.unwrap_or(d.fused_layer),
            short_down: switch(CUDA_SHORT_DOWN_ENV)?.unwrap_or(d.short_down),
            chained_launch: switch(CUDA_CHAIN_ENV)?.unwrap_or(d.chained_launch),
            cross_down: switch(CUDA_CROSS_DOWN_ENV)?.unwrap_or(d.cross_down),
            cross_row_groups,
            bulk_copies: switch(CUDA_BULK_ENV)?.unwrap_or(d.bulk_copies),
            block_stamps: switch(CUDA_STAMPS_ENV)?.unwrap_or(d.block_stamps),
            expert_variant,
            copies,
        })
    }

    /// The environment that asks for this tuning (every variable, defaults included), so a
    /// script can reproduce a run from its report.
    pub fn env(&self) -> Vec<(&'static str, String)> {
        let bit = |b: bool| if b { "1" } else { "0" }.to_string();
        vec![
            (CUDA_STAGE_ENV, bit(self.staged_tiles)),
            (CUDA_PDL_ENV, bit(self.dependent_launch)),
            (CUDA_SPLIT_ENV, bit(self.e2m1_split)),
            (CUDA_PIPE_ENV, self.pipe_stages.to_string()),
            (CUDA_E4M3_CVT_ENV, bit(self.e4m3_cvt)),
            (CUDA_PREFETCH_DOWN_ENV, bit(self.prefetch_down)),
            (CUDA_SMALL_TABLE_ENV, bit(self.small_table)),
            (CUDA_SMALL_GRID_ENV, bit(self.small_grid)),
            (CUDA_FUSED_ENV, bit(self.fused_layer)),
            (CUDA_SHORT_DOWN_ENV, bit(self.short_down)),
            (CUDA_CHAIN_ENV, bit(self.chained_launch)),
            (CUDA_CROSS_DOWN_ENV, bit(self.cross_down)),
            (
                CUDA_CROSS_ROWS_ENV,
                self.cross_row_groups
                    .map(|n| n.to_string())
                    .unwrap_or_default(),
            ),
            (CUDA_BULK_ENV, bit(self.bulk_copies)),
            (CUDA_STAMPS_ENV, bit(self.block_stamps)),
            (
                CUDA_VARIANT_ENV,
                self.expert_variant
                    .map(|n| n.to_string())
                    .unwrap_or_default(),
            ),
            (CUDA_COPY_BATCH_ENV, bit(self.copies == CopySubmit::Batch)),
            (CUDA_COPY_SPLIT_ENV, bit(self.copies == CopySubmit::Split)),
        ]
    }
}

impl CudaTuning {
    /// A [`RuntimeError::Invalid`] naming the field where one is out of range: column stages
    /// outside 1 to [`CUDA_PIPE_MAX_STAGES`], a forced variant that is no instantiation, forced
    /// row groups outside 1 to [`CUDA_CROSS_MAX_ROW_GROUPS`].
    pub fn check(&self) -> Result<()> {
        if !(1..=CUDA_PIPE_MAX_STAGES).contains(&self.pipe_stages) {
            return Err(RuntimeError::invalid(
                "CUDA tuning pipe_stages",
                format!(
                    "{} column stages; use 1 (whole tiles) to {CUDA_PIPE_MAX_STAGES}",
                    self.pipe_stages
                ),
            ));
        }
        if let Some(n) = self.cross_row_groups {
            if !(1..=CUDA_CROSS_MAX_ROW_GROUPS).contains(&n) {
                return Err(not_row_groups(&n.to_string()));
            }
        }
        match self.expert_variant {
            Some(n) if !CUDA_VARIANT_TOKENS.contains(&n) => Err(not_a_variant(&n.to_string())),
            _ => Ok(()),
        }
    }

    /// The expert kernels' path as the micro-bench's `path` column names it: `staged` or
    /// `direct`, then `+pdl` and `+split` where on, `+pipeN` for N pipelined column stages
    /// of staged tiles, `+cvt` for the hardware scale decode, `+l2down` for the down
    /// matrices' prefetch from staged tiles, `+small` for the small launch table, `+wide`
    /// for the small-grid instantiation, `+fused` for the one-launch layer and `+short` for
    /// the short down blocks, `+chain` for the chained gate/up launch, `+cross` for the
    /// cross-task down kernel of staged tiles (`+cross1`, `+cross2` with its row groups
    /// forced), `+bulk` for whole staged gate/up tiles by bulk copies, `+stamps` for the
    /// block timelines (`staged+pdl`, `direct+split`,
    /// `staged+pdl+split+pipe4`, `staged+pdl+split+cvt+l2down`, ...).
    pub fn expert_path(&self) -> String {
        let mut s = String::from(if self.staged_tiles {
            "staged"
        } else {
            "direct"
        });
        if self.dependent_launch {
            s.push_str("+pdl");
        }
        if self.e2m1_split {
            s.push_str("+split");
        }
        if self.staged_tiles && self.pipe_stages > 1 {
            s.push_str(&format!("+pipe{}", self.pipe_stages));
        }
        if self.e4m3_cvt {
            s.push_str("+cvt");
        }
        if self.staged_tiles && self.prefetch_down {
            s.push_str("+l2down");
        }
        if self.small_table {
            s.push_str("+small");
        }
        if self.small_grid {
            s.push_str("+wide");
        }
        if self.fused_layer {
            s.push_str("+fused");
        }
        if self.short_down {
            s.push_str("+short");
        }
        if self.chained_launch {
            s.push_str("+chain");
        }
        if self.staged_tiles && self.cross_down {
            s.push_str("+cross");
            if let Some(n) = self.cross_row_groups {
                s.push_str(&n.to_string());
            }
        }
        if self.bulk_stage() {
            s.push_str("+bulk");
        }
        if self.block_stamps {
            s.push_str("+stamps");
        }
        s
    }

    /// This tuning with the expert-path switches as `path` names them, in the words of
    /// [`CudaTuning::expert_path`] (`staged+pdl+split+cvt+wide+cross2`): every switch the path
    /// does not name is off, the forced variant and the copy submission stay as they are. So
    /// a bench row or a test lists its paths by name, and `t.with_path(&t.expert_path())`
    /// gives `t` back for every tuning whose switches all change its kernels. A word that
    /// names no switch, a number where none belongs or out of range, or a word that needs
    /// staged tiles on a `direct` path is a [`RuntimeError::Invalid`] naming the path.
    pub fn with_path(&self, path: &str) -> Result<CudaTuning> {
        let invalid = |why: String| RuntimeError::invalid(format!("expert path '{path}'"), why);
        let mut words = path.split('+');
        let staged_tiles = match words.next() {
            Some("staged") => true,
            Some("direct") => false,
            _ => {
                return Err(invalid(
                    "it starts with neither 'staged' nor 'direct'".into(),
                ))
            }
        };
        let mut t = CudaTuning {
            staged_tiles,
            expert_variant: self.expert_variant,
            copies: self.copies,
            ..Self::PATHS_OFF
        };
        for word in words {
            // The number is the word's trailing digits (`cross2`; `l2down` has none).
            let name = word.trim_end_matches(|c: char| c.is_ascii_digit());
            let digits = &word[name.len()..];
            let number =
                if digits.is_empty() {
                    None
                } else {
                    Some(digits.parse::<u8>().map_err(|_| {
                        invalid(format!("'{word}': '{digits}' is not a small number"))
                    })?)
                };
            let staged_only = matches!(name, "pipe" | "l2down" | "cross" | "bulk");
            if staged_only && !staged_tiles {
                return Err(invalid(format!("'{word}' needs staged tiles")));
            }
            let numbered = matches!(name, "pipe" | "cross");
            if number.is_some() && !numbered {
                return Err(invalid(format!("'{word}' takes no number")));
            }
            match name {
                "pdl" => t.dependent_launch = true,
                "split" => t.e2m1_split = true,
                "pipe" => {
                    t.pipe_stages =
                        number.ok_or_else(|| invalid("'pipe' needs its number of stages".into()))?
                }
                "cvt" => t.e4m3_cvt = true,
                "l2down" => t.prefetch_down = true,
                "small" => t.small_table = true,
                "wide" => t.small_grid = true,
                "fused" => t.fused_layer = true,
                "short" => t.short_down = true,
                "chain" => t.chained_launch = true,
                "cross" => (t.cross_down, t.cross_row_groups) = (true, number),
                "bulk" => t.bulk_copies = true,
                "stamps" => t.block_stamps = true,
                _ => {
                    return Err(invalid(format!(
                        "'{word}' names no switch; the words are pdl, split, pipeN, cvt, \
                         l2down, small, wide, fused, short, chain, cross[N], bulk, stamps"
                    )))
                }
            }
        }
        if t.bulk_copies && t.pipe_stages > 1 {
            return Err(invalid(
                "'bulk' stages whole tiles, 'pipe' column stages: name one".into(),
            ));
        }
        t.check().map_err(|e| invalid(e.to_string()))?;
        Ok(t)
    }

    /// Whether the gate/up kernels stage their tiles by bulk copies: asked for, on staged
    /// whole tiles (the pipelined staging copies its own way).
    pub fn bulk_stage(&self) -> bool {
        self.bulk_copies && self.staged_tiles && self.pipe_stages == 1
    }
}

impl fmt::Display for CudaTuning {
    /// The expert path ([`CudaTuning::expert_path`]), the forced variant, and the copy
    /// submission: `staged+pdl+split+cvt+wide, copies batch`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.expert_path())?;
        if let Some(n) = self.expert_variant {
            write!(f, ", variant {n}")?;
        }
        write!(f, ", copies {}", self.copies.name())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    fn from(pairs: &[(&str, &str)]) -> Result<CudaTuning> {
        let m: HashMap<String, String> = pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        CudaTuning::from_lookup(|k| m.get(k).cloned())
    }

    #[test]
    fn a_path_parses_to_the_tuning_that_names_it() {
        let base = CudaTuning {
            expert_variant: Some(8),
            copies: CopySubmit::Split,
            ..CudaTuning::default()
        };
        for path in [
            "staged",
            "direct",
            "staged+pdl+split+cvt+wide",
            "direct+split+cvt+small+wide+fused+short+chain",
            "staged+pdl+split+pipe4+cvt+l2down",
            "staged+pdl+split+cvt+wide+cross2",
            "staged+pdl+split+cvt+l2down+small+wide+fused+short+chain+bulk",
            "staged+pdl+split+cvt+wide+chain+bulk+stamps",
        ] {
            let t = base.with_path(path).unwrap();
            assert_eq!(t.expert_path(), path);
            assert_eq!((t.expert_variant, t.copies), (Some(8), CopySubmit::Split));
        }
        let d = CudaTuning::default();
        assert_eq!(
            base.with_path(&d.expert_path()).unwrap().expert_path(),
            d.expert_path()
        );
        assert_eq!(d.with_path(&d.expert_path()).unwrap(), d);
        let t = d.with_path("staged+bulk").unwrap();
        assert_eq!((t.bulk_copies, t.e2m1_split), (true, false));
        let t = d.with_path("staged+cross").unwrap();
        assert_eq!((t.cross_down, t.cross_row_groups), (true, None));
    }

    #[test]
    fn a_malformed_path_is_an_error_naming_it() {
        let d = CudaTuning::default();
        for (path, says) in [
            ("", "neither"),
            ("pdl+staged", "neither"),
            ("staged+pdl+nope", "'nope' names no switch"),
            ("staged+pdl2", "takes no number"),
            ("staged+pipe", "number of stages"),
            ("staged+pipe9", "column stages"),
            ("staged+pipe2+bulk", "name one"),
            ("staged+bulk2", "takes no number"),
            ("staged+cross999", "not a small number"),
            ("staged+cross3", "row groups"),
            ("direct+bulk", "needs staged tiles"),
            ("direct+l2down", "needs staged tiles"),
        ] {
            let e = d.with_path(path).unwrap_err().to_string();
            assert!(e.contains(&format!("'{path}'")), "{path}: {e}");
            assert!(e.contains(says), "{path}: {e}");
        }
    }

    #[test]
    fn unset_and_empty_variables_give_the_defaults() {
        assert_eq!(from(&[]).unwrap(), CudaTuning::default());
        let empty: Vec<(&str, &str)> = CUDA_TUNING_ENVS.iter().map(|k| (*k, "")).collect();
        assert_eq!(from(&empty).unwrap(), CudaTuning::default());
    }

    #[test]
    fn a_misspelt_switch_is_refused_by_name() {
        let names = |v: &[&str]| v.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        assert!(refuse_unknown_switches(names(&["PATH", "FT_THREADS"])).is_ok());
        assert!(refuse_unknown_switches(names(&CUDA_TUNING_ENVS)).is_ok());
        let err = refuse_unknown_switches(names(&["PATH", "FT_CUDA_PIPELINE", "FT_CUDA_PIPE"]))
            .unwrap_err()
            .to_string();
        assert!(err.contains("FT_CUDA_PIPELINE"), "{err}");
        assert!(err.contains(CUDA_PIPE_ENV), "{err}");
    }

    #[test]
    fn each_variable_sets_its_path() {
        let t = from(&[
            (CUDA_STAGE_ENV, "0"),
            (CUDA_PDL_ENV, "0"),
            (CUDA_SPLIT_ENV, "1"),
            (CUDA_PIPE_ENV, "3"),
            (CUDA_E4M3_CVT_ENV, "1"),
            (CUDA_PREFETCH_DOWN_ENV, "1"),
            (CUDA_SMALL_TABLE_ENV, "1"),
            (CUDA_SMALL_GRID_ENV, "1"),
            (CUDA_FUSED_ENV, "1"),
            (CUDA_SHORT_DOWN_ENV, "1"),
            (CUDA_CHAIN_ENV, "1"),
            (CUDA_CROSS_DOWN_ENV, "1"),
            (CUDA_CROSS_ROWS_ENV, "2"),
            (CUDA_BULK_ENV, "1"),
            (CUDA_STAMPS_ENV, "1"),
            (CUDA_VARIANT_ENV, "4"),
            (CUDA_COPY_SPLIT_ENV, "1"),
        ])
        .unwrap();
        assert_eq!(
            t,
            CudaTuning {
                staged_tiles: false,
                dependent_launch: false,
                e2m1_split: true,
                pipe_stages: 3,
                e4m3_cvt: true,
                prefetch_down: true,
                small_table: true,
                small_grid: true,
                fused_layer: true,
                short_down: true,
                chained_launch: true,
                cross_down: true,
                cross_row_groups: Some(2),
                bulk_copies: true,
                block_stamps: true,
                expert_variant: Some(4),
                copies: CopySubmit::Split,
            }
        );
        // Pipelining, the prefetch, the cross-task down kernel and bulk copies work on staged
        // tiles only, so a direct path does not name them; bulk copies stage whole tiles, so a
        // pipelined path does not name them either.
        assert_eq!(
            t.to_string(),
            "direct+split+cvt+small+wide+fused+short+chain+stamps, variant 4, copies split"
        );
        assert_eq!(
            CudaTuning {
                staged_tiles: true,
                ..t
            }
            .expert_path(),
            "staged+split+pipe3+cvt+l2down+small+wide+fused+short+chain+cross2+stamps"
        );
        assert_eq!(
            CudaTuning {
                staged_tiles: true,
                pipe_stages: 1,
                ..t
            }
            .expert_path(),
            "staged+split+cvt+l2down+small+wide+fused+short+chain+cross2+bulk+stamps"
        );
        assert_eq!(
            from(&[(CUDA_COPY_BATCH_ENV, "1"), (CUDA_COPY_SPLIT_ENV, "0")])
                .unwrap()
                .copies,
            CopySubmit::Batch
        );
        assert_eq!(
            CudaTuning::default().to_string(),
            "staged+pdl+split+cvt+wide, copies batch"
        );
        // Turning batching off gives one copy each; asking for the split alone wins over
        // the default batch.
        assert_eq!(
            from(&[(CUDA_COPY_BATCH_ENV, "0")]).unwrap().copies,
            CopySubmit::Each
        );
        assert_eq!(
            from(&[(CUDA_COPY_SPLIT_ENV, "1")]).unwrap().copies,
            CopySubmit::Split
        );
        assert_eq!(
            from(&[(CUDA_COPY_SPLIT_ENV, "0")]).unwrap().copies,
            CopySubmit::Batch
        );
    }

    #[test]
    fn the_env_of_a_tuning_reads_back_as_the_same_tuning() {
        for copies in [CopySubmit::Each, CopySubmit::Batch, CopySubmit::Split] {
            for bits in 0..8192u32 {
                for (expert_variant, pipe_stages, cross_row_groups) in
                    [(None, 1, None), (Some(2), 4, Some(1)), (None, 2, Some(2))]
                {
                    let t = CudaTuning {
                        staged_tiles: bits & 1 != 0,
                        dependent_launch: bits & 2 != 0,
                        e2m1_split: bits & 4 != 0,
                        pipe_stages,
                        e4m3_cvt: bits & 8 != 0,
                        prefetch_down: bits & 16 != 0,
                        small_table: bits & 32 != 0,
                        small_grid: bits & 64 != 0,
                        fused_layer: bits & 128 != 0,
                        short_down: bits & 256 != 0,
                        block_stamps: bits & 512 != 0,
                        chained_launch: bits & 1024 != 0,
                        cross_down: bits & 2048 != 0,
                        cross_row_groups,
                        bulk_copies: bits & 4096 != 0,
                        expert_variant,
                        copies,
                    };
                    let env = t.env();
                    assert_eq!(env.len(), CUDA_TUNING_ENVS.len());
                    let pairs: Vec<(&str, &str)> =
                        env.iter().map(|(k, v)| (*k, v.as_str())).collect();
                    assert_eq!(from(&pairs).unwrap(), t);
                }
            }
        }
    }

    #[test]
    fn malformed_values_are_errors_naming_the_variable() {
        for (name, value) in [
            (CUDA_STAGE_ENV, "off"),
            (CUDA_PDL_ENV, "2"),
            (CUDA_SPLIT_ENV, "yes"),
            (CUDA_E4M3_CVT_ENV, "on"),
            (CUDA_PREFETCH_DOWN_ENV, "-1"),
            (CUDA_SMALL_TABLE_ENV, "512"),
            (CUDA_SMALL_GRID_ENV, "few"),
            (CUDA_FUSED_ENV, "one"),
            (CUDA_SHORT_DOWN_ENV, "short"),
            (CUDA_STAMPS_ENV, "on"),
            (CUDA_CHAIN_ENV, "yes"),
            (CUDA_CROSS_DOWN_ENV, "across"),
            (CUDA_CROSS_ROWS_ENV, "0"),
            (CUDA_CROSS_ROWS_ENV, "3"),
            (CUDA_CROSS_ROWS_ENV, "two"),
            (CUDA_BULK_ENV, "tma"),
            (CUDA_PIPE_ENV, "0"),
            (CUDA_PIPE_ENV, "5"),
            (CUDA_PIPE_ENV, "two"),
            (CUDA_VARIANT_ENV, "3"),
            (CUDA_VARIANT_ENV, "many"),
            (CUDA_COPY_SPLIT_ENV, "true"),
        ] {
            let e = from(&[(name, value)]).unwrap_err().to_string();
            assert!(e.contains(name) && e.contains(value), "{name}={value}: {e}");
        }
        let both = from(&[(CUDA_COPY_BATCH_ENV, "1"), (CUDA_COPY_SPLIT_ENV, "1")])
            .unwrap_err()
            .to_string();
        assert!(both.contains("choose one"), "{both}");
        for bad in [
            CudaTuning {
                pipe_stages: 0,
                ..CudaTuning::default()
            },
            CudaTuning {
                pipe_stages: CUDA_PIPE_MAX_STAGES + 1,
                ..CudaTuning::default()
            },
            CudaTuning {
                expert_variant: Some(3),
                ..CudaTuning::default()
            },
            CudaTuning {
                cross_row_groups: Some(3),
                ..CudaTuning::default()
            },
        ] {
            assert!(bad.check().is_err(), "{bad:?}");
        }
        assert!(CudaTuning::default().check().is_ok());
    }

    #[test]
    fn json_round_trips_and_refuses_unknown_fields() {
        let t = CudaTuning {
            e2m1_split: true,
            copies: CopySubmit::Batch,
            ..CudaTuning::default()
        };
        let s = serde_json::to_string(&t).unwrap();
        assert_eq!(serde_json::from_str::<CudaTuning>(&s).unwrap(), t);
        assert_eq!(
            serde_json::from_str::<CudaTuning>("{}").unwrap(),
            CudaTuning::default()
        );
        assert!(serde_json::from_str::<CudaTuning>(r#"{"stage": true}"#).is_err());
    }
}
