//! The GPU expert step: one launch computing all of a layer's GPU-side routed experts.
//!
//! A decode step's layer has hits (experts resident in cache slots) and fetched misses
//! (gathered into slots this step); both are computed by one [`ExpertStep`] launch for every
//! token routed to them. This module fixes the step's semantics, which both backends
//! implement (CUDA: `kernels/cuda/experts.cu`; host-emulated: the CPU kernels of
//! `ft-kernels`), and checks a step against the buffers it names.
//!
//! Semantics: for every token `t` in `0..tokens`,
//! `y[t] = sum over tasks e (in order), over e's pairs (t, w): w * FFN_e(x[t])`,
//! where `FFN_e(x) = down_e(silu(gate_e x) * up_e x)` and a token with no pair gets 0.
//! The sum runs in task order, so the engine decides the order (and with it the rounding).

use ft_kernels::ActivationPath;
use ft_model::{ExpertFormat, MoeGeometry};
use serde::{Deserialize, Serialize};

use crate::device::CudaTuning;
use crate::error::{Result, RuntimeError};

/// Byte alignment required of an expert's offset in the weights buffer (the slot
/// alignment): 256 bytes keeps every matrix start aligned for 16-byte vector loads and
/// matches `cuMemAlloc`'s own alignment.
pub const WEIGHTS_ALIGN: usize = 256;

/// One token routed to an expert, with its routing weight.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct TokenWeight {
    /// Row of `x` and `y` (the stream's token index in the step).
    pub token: u32,
    /// Routing weight (the token's top-k weights sum to 1).
    pub weight: f32,
}

/// One expert of the step: where its weights are and which tokens it serves.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ExpertTask {
    /// Byte offset of the expert (gate, up, down, in the format's byte layout) in the
    /// weights buffer; a multiple of [`WEIGHTS_ALIGN`].
    pub weights_offset: usize,
    /// Tokens routed to it (each token at most once).
    pub tokens: Vec<TokenWeight>,
}

/// A layer's GPU-side expert work.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ExpertStep {
    /// Weight format of every expert.
    pub format: ExpertFormat,
    /// Model width, elements.
    pub hidden: usize,
    /// Expert FFN width, elements.
    pub intermediate: usize,
    /// Activation path.
    pub act: ActivationPath,
    /// Rows of `x` and `y`.
    pub tokens: usize,
    /// The experts, in summation order.
    pub experts: Vec<ExpertTask>,
}

impl ExpertStep {
    /// An empty step for a geometry.
    pub fn new(
        format: ExpertFormat,
        geometry: &MoeGeometry,
        act: ActivationPath,
        tokens: usize,
    ) -> Self {
        ExpertStep {
            format,
            hidden: geometry.hidden,
            intermediate: geometry.intermediate,
            act,
            tokens,
            experts: Vec::new(),
        }
    }

    /// The same step over the experts in `range` only (a chunk computed on its own; the
    /// rows it does not route get 0 like any unrouted row).
    pub fn part(&self, range: std::ops::Range<usize>) -> ExpertStep {
        ExpertStep {
            format: self.format,
            hidden: self.hidden,
            intermediate: self.intermediate,
            act: self.act,
            tokens: self.tokens,
            experts: self.experts[range].to_vec(),
        }
    }

    /// Bytes of one expert in this step's format and shape.
    pub fn expert_bytes(&self) -> usize {
        (2 * self.format.matrix_bytes(self.intermediate, self.hidden)
            + self.format.matrix_bytes(self.hidden, self.intermediate)) as usize
    }

    /// Byte offsets of (gate, up, down) within one expert.
    pub fn matrix_offsets(&self) -> [usize; 3] {
        let gu = self.format.matrix_bytes(self.intermediate, self.hidden) as usize;
        [0, gu, 2 * gu]
    }

    /// Total (expert, token) pairs.
    pub fn pairs(&self) -> usize {
        self.experts.iter().map(|e| e.tokens.len()).sum()
    }

    /// Check the step against buffer sizes (bytes) of weights, x and y.
    pub fn validate(&self, weights_len: usize, x_len: usize, y_len: usize) -> Result<()> {
        self.format.check_cols("expert step hidden", self.hidden)?;
        self.format
            .check_cols("expert step intermediate", self.intermediate)?;
        if self.act == ActivationPath::Int8 && !self.format.has_int8_activation_path() {
            return Err(RuntimeError::invalid(
                "expert step act",
                format!("{} has no int8 activation path", self.format),
            ));
        }
        if self.tokens > u32::MAX as usize {
            return Err(RuntimeError::invalid(
                "expert step tokens",
                "too many tokens",
            ));
        }
        let row = self.hidden * 4;
        for (name, len) in [("x", x_len), ("y", y_len)] {
            if len < self.tokens * row {
                return Err(RuntimeError::invalid(
                    format!("expert step {name}"),
                    format!(
                        "{len} bytes, needs {} ({} tokens x {} f32)",
                        self.tokens * row,
                        self.tokens,
                        self.hidden
                    ),
                ));
            }
        }
        let eb = self.expert_bytes();
        for (i, e) in self.experts.iter().enumerate() {
            if e.weights_offset % WEIGHTS_ALIGN != 0 {
                return Err(RuntimeError::invalid(
                    format!("expert step task {i} weights_offset"),
                    format!("{} is not a multiple of {WEIGHTS_ALIGN}", e.weights_offset),
                ));
            }
            crate::device::check_range(
                &format!("expert step task {i} weights"),
                weights_len,
                e.weights_offset,
                eb,
            )?;
            let mut seen = std::collections::HashSet::new();
            for tw in &e.tokens {
                if tw.token as usize >= self.tokens {
                    return Err(RuntimeError::invalid(
                        format!("expert step task {i} token"),
                        format!("{} is not below {} tokens", tw.token, self.tokens),
                    ));
                }
                if !seen.insert(tw.token) {
                    return Err(RuntimeError::invalid(
                        format!("expert step task {i} token"),
                        format!("token {} appears twice", tw.token),
                    ));
                }
                if !tw.weight.is_finite() {
                    return Err(RuntimeError::invalid(
                        format!("expert step task {i} weight"),
                        format!("{} is not finite", tw.weight),
                    ));
                }
            }
        }
        Ok(())
    }
}

/// The host-emulated device's expert kernel: `ft_kernels::step::CpuExperts::run_layer`
/// (the same code hybrid's CPU share runs) over the step's tasks, in task order, into `y`
/// zeroed first (`[tokens x hidden]`, overwritten), so it follows the same arithmetic
/// specification as the CUDA kernel.
pub(crate) fn host_expert_step(
    cpu: &mut ft_kernels::step::CpuExperts,
    step: &ExpertStep,
    weights: &[u8],
    x: &[f32],
    y: &mut [f32],
) -> Result<()> {
    let eb = step.expert_bytes();
    let geometry = step_geometry(step);
    let tokens: Vec<Vec<(u32, f32)>> = step
        .experts
        .iter()
        .map(|e| e.tokens.iter().map(|t| (t.token, t.weight)).collect())
        .collect();
    let work: Vec<ft_kernels::step::ExpertWork<'_>> = step
        .experts
        .iter()
        .zip(&tokens)
        .map(|(e, t)| ft_kernels::step::ExpertWork {
            weights: &weights[e.weights_offset..e.weights_offset + eb],
            tokens: t,
        })
        .collect();
    y.fill(0.0);
    cpu.run_layer(step.format, &geometry, step.act, &work, x, y)
        .map(|_| ())
        .map_err(|e| RuntimeError::Kernel(e.to_string()))
}

/// A geometry carrying the step's shape (the kernels only read hidden and intermediate).
pub fn step_geometry(step: &ExpertStep) -> MoeGeometry {
    MoeGeometry {
        hidden: step.hidden,
        intermediate: step.intermediate,
        experts: step.experts.len().max(1),
        top_k: 1,
        moe_layers: 1,
        shared_experts: 0,
    }
}

/// Bytes of dynamic shared memory the CUDA gate/up kernel may use for a pass's
/// activations (40 KiB: below the 48 KiB every GPU gives without an opt-in, leaving room for
/// the kernel's static buffers).
pub const CUDA_SHARED_BUDGET: usize = 40 * 1024;

/// Tokens per pass of the CUDA kernels (`MAXT` in experts.cu).
pub const CUDA_MAX_TOKENS_PER_PASS: usize = 8;

/// Threads per block of the CUDA expert kernels (16 half-warps; the small-grid gate/up
/// kernel twice as many).
const CUDA_THREADS: u32 = 256;

/// Bytes of a launch table that travels inside the launch itself (the kernels'
/// `__grid_constant__ ParamTable`, `FT_PARAM_TABLE_BYTES` in `kernels/cuda/common.cuh`): no
/// staging copy to device memory and no wait for a ring slot before the launch. With the
/// other arguments it stays under the 4 KiB parameter limit of every driver. A batch-1
/// layer's expert tables take about 350 bytes, a batch-8 layer's about 2.6 KiB; larger
/// tables are staged.
pub const CUDA_PARAM_TABLE_BYTES: usize = 3072;

/// Bytes at the start of the scratch reserved for the down kernel's row-tile counters
/// (zero between launches: the last block of each tile resets its counter).
const CUDA_COUNTER_BYTES: usize = 64 * 1024;

/// The kernels' format code (`FT_*` in experts.cu).
pub fn cuda_format_code(f: ExpertFormat) -> i32 {
    match f {
        ExpertFormat::Bf16 => 0,
        ExpertFormat::Int8 => 1,
        ExpertFormat::Q4_0 => 2,
        ExpertFormat::Nvfp4 => 3,
        ExpertFormat::Mxfp4 => 4,
        ExpertFormat::Ggml(_) => {
            unreachable!("{} has no kernel in ft (MatrixLayout::new refuses it)", f)
        }
    }
}

/// The kernels' activation path code (`ACT_*` in experts.cu).
pub fn cuda_act_code(a: ActivationPath) -> i32 {
    match a {
        ActivationPath::F32 => 0,
        ActivationPath::Int8 => 1,
    }
}

/// Activation block / weight group of the CUDA kernels per format (16 for nvfp4 and bf16,
/// else 32, as the W4A8 spec's `G`).
pub fn cuda_group(f: ExpertFormat) -> usize {
    match f {
        ExpertFormat::Nvfp4 | ExpertFormat::Bf16 => 16,
        _ => 32,
    }
}

/// The tables one CUDA launch reads, laid out in one staging buffer.
#[derive(Debug, Clone, PartialEq)]
pub struct CudaTables {
    /// The bytes (tasks, pairs, token starts, token pairs; each part 16-byte aligned).
    pub bytes: Vec<u8>,
    /// Byte offsets of (tasks, pairs, token starts, token pairs).
    pub offsets: [usize; 4],
    /// Total pairs.
    pub pairs: usize,
    /// Largest pair count of one task.
    pub max_task_pairs: usize,
}

fn push_u32(v: &mut Vec<u8>, x: u32) {
    v.extend_from_slice(&x.to_le_bytes());
}

fn align16(v: &mut Vec<u8>) -> usize {
    while v.len() & 15 != 0 {
        v.push(0);
    }
    v.len()
}

/// Build the launch tables of `step` for weights at device address `weights`: per task
/// `{u64 address, u32 pair_begin, u32 pair_count}`, per pair `{u32 token, f32 weight}`,
/// then per token its pairs in task order (`{u32 pair, f32 weight}`, CSR by token).
pub fn cuda_tables(step: &ExpertStep, weights: u64) -> CudaTables {
    let mut b = Vec::new();
    let mut pairs: Vec<(u32, f32)> = Vec::new();
    let mut max_task_pairs = 0;
    for e in &step.experts {
        b.extend_from_slice(&(weights + e.weights_offset as u64).to_le_bytes());
        push_u32(&mut b, pairs.len() as u32);
        push_u32(&mut b, e.tokens.len() as u32);
        max_task_pairs = max_task_pairs.max(e.tokens.len());
        for tw in &e.tokens {
            pairs.push((tw.token, tw.weight));
        }
    }
    let o_pairs = align16(&mut b);
    for &(t, w) in &pairs {
        push_u32(&mut b, t);
        b.extend_from_slice(&w.to_le_bytes());
    }
    // Token lists in task order.
    let mut per_token: Vec<Vec<(u32, f32)>> = vec![Vec::new(); step.tokens];
    for (p, &(t, w)) in pairs.iter().enumerate() {
        per_token[t as usize].push((p as u32, w));
    }
    let o_begin = align16(&mut b);
    let mut acc = 0u32;
    push_u32(&mut b, 0);
    for l in &per_token {
        acc += l.len() as u32;
        push_u32(&mut b, acc);
    }
    let o_tok = align16(&mut b);
    for l in &per_token {
        for &(p, w) in l {
            push_u32(&mut b, p);
            b.extend_from_slice(&w.to_le_bytes());
        }
    }
    align16(&mut b);
    CudaTables {
        bytes: b,
        offsets: [0, o_pairs, o_begin, o_tok],
        pairs: pairs.len(),
        max_task_pairs,
    }
}

/// The module of the expert kernels that runs `step`: specialized for its format and
/// activation path (`kernels/cuda/experts.cu`), with the split-sign e2m1 dot where the step
/// can use it (nvfp4 and mxfp4, int8 path), the hardware scale decode for nvfp4, and the
/// block timelines where `tuning` asks for them (development only).
pub fn cuda_specialization(
    step: &ExpertStep,
    tuning: &CudaTuning,
) -> ft_kernels::cuda_sources::Specialization {
    let split = matches!(step.format, ExpertFormat::Nvfp4 | ExpertFormat::Mxfp4)
        && step.act == ActivationPath::Int8;
    ft_kernels::cuda_sources::Specialization::experts(
        cuda_format_code(step.format),
        cuda_act_code(step.act),
    )
    .with_e2m1_split(split)
    .with_e4m3_cvt(step.format == ExpertFormat::Nvfp4)
    .with_block_stamps(tuning.block_stamps)
}

/// Scratch layout of a CUDA launch: byte offsets of (O, hf, hq, hs) after the counters, and
/// the total.
pub fn cuda_scratch_layout(step: &ExpertStep, pairs: usize) -> ([usize; 4], usize) {
    let a = |x: usize| x.next_multiple_of(256);
    let (h, i) = (step.hidden, step.intermediate);
    let g = cuda_group(step.format);
    let o = CUDA_COUNTER_BYTES;
    let hf = o + a(pairs * h * 4);
    let hq = hf + a(pairs * i * 4);
    let hs = hq + a(pairs * i);
    let end = hs + a(pairs * (i / g) * 4);
    ([o, hf, hq, hs], end)
}

/// One instantiation of the expert kernels (`kernels/cuda/experts.cu`): its entry points
/// and how many tokens of a task it holds in registers per pass.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CudaVariant {
    /// Gate/up entry point.
    pub gate_up: &'static str,
    /// Down entry point of launches that stage their row tiles.
    pub down: &'static str,
    /// Down entry point of launches that read their rows from global memory (the same
    /// instantiation with its tile's pointers global, so each kernel holds the registers of
    /// one path).
    pub down_direct: &'static str,
    /// Tokens of one task per pass.
    pub tokens_per_pass: usize,
    /// Rows of down per block of the down kernel (16 half-warps times the kernel's
    /// `DOWN_R_<tokens>`): its grid's x is `hidden / down_rows`.
    pub down_rows: usize,
    /// Threads per block of the gate/up kernel.
    pub gate_up_threads: u32,
}

/// The instantiations, smallest first.
const CUDA_VARIANTS: [CudaVariant; 4] = [
    CudaVariant {
        gate_up: "ft_experts_gate_up_1",
        down: "ft_experts_down_1",
        down_direct: "ft_experts_down_1_direct",
        tokens_per_pass: 1,
        down_rows: 64,
        gate_up_threads: CUDA_THREADS,
    },
    CudaVariant {
        gate_up: "ft_experts_gate_up_2",
        down: "ft_experts_down_2",
        down_direct: "ft_experts_down_2_direct",
        tokens_per_pass: 2,
        down_rows: 32,
        gate_up_threads: CUDA_THREADS,
    },
    CudaVariant {
        gate_up: "ft_experts_gate_up_4",
        down: "ft_experts_down_4",
        down_direct: "ft_experts_down_4_direct",
        tokens_per_pass: 4,
        down_rows: 16,
        gate_up_threads: CUDA_THREADS,
    },
    CudaVariant {
        gate_up: "ft_experts_gate_up",
        down: "ft_experts_down",
        down_direct: "ft_experts_down_direct",
        tokens_per_pass: CUDA_MAX_TOKENS_PER_PASS,
        down_rows: 16,
        gate_up_threads: CUDA_THREADS,
    },
];

/// The one-token instantiation for launches of no more gate/up blocks than the device has
/// multiprocessors ([`cuda_small_grid`]): each block then runs alone
/// on its multiprocessor, so the gate/up kernel takes 512 threads with one dot per
/// half-warp (`WIDE` in `kernels/cuda/experts.cu`) and the down kernel half the rows per
/// block of `ft_experts_down_1` (`DOWN_R_1S`). The same arithmetic, so the same bits.
pub const CUDA_SMALL_GRID_VARIANT: CudaVariant = CudaVariant {
    gate_up: "ft_experts_gate_up_1w",
    down: "ft_experts_down_1s",
    down_direct: "ft_experts_down_1s_direct",
    tokens_per_pass: 1,
    down_rows: 32,
    gate_up_threads: 2 * CUDA_THREADS,
};

/// Whether a launch of `gate_up_blocks` gate/up blocks with `variant` takes the small-grid
/// instantiation on a device of `multiprocessors`: one-token launches of at most one
/// gate/up block per multiprocessor.
pub fn cuda_small_grid(
    variant: CudaVariant,
    gate_up_blocks: usize,
    multiprocessors: usize,
) -> bool {
    variant.tokens_per_pass == 1 && gate_up_blocks <= multiprocessors
}

/// The instantiation for a launch whose largest task has `max_task_pairs` tokens: the
/// smallest that holds them all in one pass (the widest when none does). Every variant
/// runs the same arithmetic per token, so the choice never changes an output.
pub fn cuda_variant(max_task_pairs: usize) -> CudaVariant {
    CUDA_VARIANTS
        .iter()
        .copied()
        .find(|v| v.tokens_per_pass >= max_task_pairs)
        .unwrap_or(CUDA_VARIANTS[CUDA_VARIANTS.len() - 1])
}

#[cfg(feature = "cuda")]
fn forced_cuda_variant(tuning: &CudaTuning) -> Option<CudaVariant> {
    let want = tuning.expert_variant?;
    CUDA_VARIANTS
        .iter()
        .copied()
        .find(|v| v.tokens_per_pass == want)
}

/// Shared memory one token's activations take in the gate/up kernel, bytes.
fn cuda_token_shared_bytes(step: &ExpertStep) -> usize {
    let g = cuda_group(step.format);
    match step.act {
        ActivationPath::Int8 => step.hidden + 4 * (step.hidden / g),
        ActivationPath::F32 => 4 * step.hidden,
    }
}

/// Shared-memory bytes of a staged weight tile: `rows` consecutive rows of a matrix with
/// `cols` columns, each of its planes (values, block scales, row scales; the codec's
/// [`ft_kernels::codec::MatrixLayout`]) padded to 16 bytes (`staged_tile_bytes` in
/// `kernels/cuda/experts.cu`, which must agree).
pub fn cuda_staged_tile_bytes(format: ExpertFormat, cols: usize, rows: usize) -> Result<usize> {
    let l = ft_kernels::codec::MatrixLayout::new(format, rows.max(1), cols)
        .map_err(|e| RuntimeError::invalid("expert step", e.to_string()))?;
    let row_scale_bytes = if l.row_scales_offset > 0 {
        (l.bytes - l.row_scales_offset) / l.rows
    } else {
        0
    };
    let pad = |x: usize| x.next_multiple_of(16);
    Ok(pad(rows * l.values_row_bytes)
        + pad(rows * l.block_scales_row_bytes)
        + pad(rows * row_scale_bytes))
}

/// Most dynamic shared memory (bytes) a block of the expert kernels takes to stage its
/// weights: a larger tile (bf16 and int8 at common widths) is read from global memory
/// instead, since fewer than two blocks per multiprocessor would fit.
pub const CUDA_STAGED_SHARED_MAX: usize = 100 * 1024;

/// How one launch of the expert kernels uses shared memory: where the gate/up kernel's
/// staged tiles begin (0: not staged) and each kernel's dynamic shared memory, bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CudaStaging {
    /// Byte offset of the gate/up tiles after the pass's activations; 0 when not staged.
    pub gate_up_stage_off: usize,
    /// Dynamic shared memory of the gate/up launch.
    pub gate_up_shared: usize,
    /// Whether the down kernel stages its row tile.
    pub down_staged: bool,
    /// Dynamic shared memory of the down launch.
    pub down_shared: usize,
    /// The most dynamic shared memory a staged tile may take on this device (the device's
    /// limit, at most [`CUDA_STAGED_SHARED_MAX`]).
    pub shared_limit: usize,
}

/// The shared-memory plan of a launch of `variant` with `tch` tokens per gate/up pass, on a
/// device that lets a block have `max_shared` bytes of dynamic shared memory: a tile that
/// fits is staged, a larger one read from global memory as the block computes.
pub fn cuda_staging(
    step: &ExpertStep,
    variant: CudaVariant,
    tch: usize,
    max_shared: usize,
) -> Result<CudaStaging> {
    let act = tch * cuda_token_shared_bytes(step);
    let limit = max_shared.min(CUDA_STAGED_SHARED_MAX);
    let g = cuda_group(step.format);
    let off = act.next_multiple_of(16);
    let gate_up_staged = off + 2 * cuda_staged_tile_bytes(step.format, step.hidden, g)?;
    let down_rows = variant.down_rows.min(step.hidden);
    let down_staged = cuda_staged_tile_bytes(step.format, step.intermediate, down_rows)?;
    let (gate_up_stage_off, gate_up_shared) = if gate_up_staged <= limit {
        (off, gate_up_staged)
    } else {
        (0, act)
    };
    let down = down_staged <= limit;
    Ok(CudaStaging {
        gate_up_stage_off,
        gate_up_shared,
        down_staged: down,
        down_shared: if down { down_staged } else { 0 },
        shared_limit: limit,
    })
}

/// Tokens per pass of the gate/up kernel and its dynamic shared memory, bytes.
pub fn cuda_pass_tokens(step: &ExpertStep) -> Result<(usize, usize)> {
    let per_token = cuda_token_shared_bytes(step);
    let tch = (CUDA_SHARED_BUDGET / per_token).min(CUDA_MAX_TOKENS_PER_PASS);
    if tch == 0 {
        return Err(RuntimeError::invalid(
            "expert step hidden",
            format!(
                "{} is too wide for the CUDA kernel's {} KiB of shared activations",
                step.hidden,
                CUDA_SHARED_BUDGET / 1024
            ),
        ));
    }
    Ok((tch, tch * per_token))
}

/// The down kernel's `FoldCombine` argument (`kernels/cuda/experts.cu`): the layer's
/// fixed-order combine run by the down kernel's last block of each row tile, as device
/// addresses, 0 where absent (`act == 0`: no fold).
#[cfg(feature = "cuda")]
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct CudaFoldCombine {
    pub act: u64,
    pub parts: u64,
    pub more: [u64; 4],
    pub block: u64,
    pub k: u64,
}

/// A launch's start condition (experts.cu's `gate_wait`): every block waits until the u32 at
/// device address `flag` has reached `value`; `flag` 0: none.
#[cfg(feature = "cuda")]
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct CudaGate {
    pub flag: u64,
    pub value: u32,
}

/// The expert kernels' parameters by name, in their order: what every kernel begins with
/// (`kernels/cuda/experts.cu`'s TABLE_ARGS, then format, path and shape); then the gate/up
/// kernels' own (GATE_UP_ARGS) and the down kernels' (DOWN_ARGS). [`cuda_launch`] passes one
/// pointer per name in this order, and a test reads the names back out of the source, so a
/// parameter added on one side only fails here instead of on a GPU.
pub const CUDA_COMMON_PARAMS: [&str; 11] = [
    "tab",
    "staged",
    "o_pairs",
    "o_begin",
    "o_tok",
    "gate",
    "gate_value",
    "fmt",
    "act",
    "H",
    "I",
];
/// See [`CUDA_COMMON_PARAMS`].
pub const CUDA_GATE_UP_PARAMS: [&str; 6] = ["x", "tch", "hf", "hq", "hs", "stage_off"];
/// See [`CUDA_COMMON_PARAMS`].
pub const CUDA_DOWN_PARAMS: [&str; 8] = ["T", "O", "hf", "hq", "hs", "counters", "y", "fold"];
/// Queue the CUDA expert kernels of `step` (weights, x, y are device addresses), with the
/// layer's combine folded into the down kernel where `fold.act` is set, every block waiting
/// for `gate` first where it is set.
#[cfg(feature = "cuda")]
pub(crate) fn cuda_launch(
    stream: &crate::device::cuda::CudaStreamH,
    step: &ExpertStep,
    weights: u64,
    x: u64,
    y: u64,
    fold: CudaFoldCombine,
    gate: CudaGate,
) -> Result<()> {
    use crate::device::cuda::ParamTable as ParamTableArg;
    use ft_kernels::cuda_sources::KernelId;

    if (step.hidden | step.intermediate) & 31 != 0 {
        return Err(RuntimeError::invalid(
            "expert step",
            format!(
                "the CUDA expert kernel needs hidden and intermediate multiples of 32 (got {} and {})",
                step.hidden, step.intermediate
            ),
        ));
    }
    if step.experts.len() > 65_535 {
        return Err(RuntimeError::invalid(
            "expert step",
            "more than 65535 experts in one launch",
        ));
    }
    let t = cuda_tables(step, weights);
    let (tch, _) = cuda_pass_tokens(step)?;
    let tuning = stream.shared().tuning();
    let variant = match forced_cuda_variant(&tuning) {
        Some(v) => v,
        None => cuda_variant(t.max_task_pairs),
    };
    let variant = if cuda_small_grid(
        variant,
        step.experts.len() * step.intermediate / cuda_group(step.format),
        stream.shared().multiprocessors,
    ) {
        CUDA_SMALL_GRID_VARIANT
    } else {
        variant
    };
    let down_tiles = step.hidden.div_ceil(variant.down_rows);
    if down_tiles * 4 > CUDA_COUNTER_BYTES {
        return Err(RuntimeError::invalid(
            "expert step hidden",
            "too wide for the CUDA kernel",
        ));
    }
    let tch = tch.min(variant.tokens_per_pass);
    let staging = cuda_staging(step, variant, tch, stream.shared().shared_optin_bytes)?;
    let ([o_off, hf_off, hq_off, hs_off], total) = cuda_scratch_layout(step, t.pairs.max(1));
    let scratch = stream.scratch(total)?;
    let spec = cuda_specialization(step, &tuning);
    // The launch's kernels (compiled at first use), looked up before its table takes an
    // argument slot.
    let kernel = |entry: &'static str| {
        stream
            .shared()
            .function_spec(KernelId::Experts, spec, entry)
    };
    let down_entry = if staging.down_staged {
        variant.down
    } else {
        variant.down_direct
    };
    let (gate_up, down) = (kernel(variant.gate_up)?, kernel(down_entry)?);
    let table = stream.table_arg(&t.bytes)?;
    let [_, o_pairs, o_begin, o_tok] = t.offsets.map(|o| o as u32);
    let (o, hf, hq, hs) = (
        scratch + o_off as u64,
        scratch + hf_off as u64,
        scratch + hq_off as u64,
        scratch + hs_off as u64,
    );
    let counters = scratch;
    let fmt = cuda_format_code(step.format);
    let act = cuda_act_code(step.act);
    let (h, i, tokens, tch) = (
        step.hidden as i32,
        step.intermediate as i32,
        step.tokens as i32,
        tch as i32,
    );
    let n_tasks = step.experts.len() as u32;
    let g = cuda_group(step.format);
    let stage_off = staging.gate_up_stage_off as u32;
    // One pointer to each argument, in the kernels' order (CUDA_COMMON_PARAMS and the
    // others: experts.cu's GATE_UP_ARGS and DOWN_ARGS).
    fn p<T>(v: &T) -> *mut std::ffi::c_void {
        v as *const T as *mut std::ffi::c_void
    }
    let param: &ParamTableArg = &table.param;
    // The arguments every kernel begins with (TABLE_ARGS, then format, path and shape).
    let (gate_flag, gate_value) = (gate.flag, gate.value);
    let common = [
        p(param),
        p(&table.staged),
        p(&o_pairs),
        p(&o_begin),
        p(&o_tok),
        p(&gate_flag),
        p(&gate_value),
        p(&fmt),
        p(&act),
        p(&h),
        p(&i),
    ];
    let mut gate_up_args: Vec<_> = common
        .iter()
        .copied()
        .chain([p(&x), p(&tch), p(&hf), p(&hq), p(&hs), p(&stage_off)])
        .collect();
    let mut down_args: Vec<_> = common
        .iter()
        .copied()
        .chain([
            p(&tokens),
            p(&o),
            p(&hf),
            p(&hq),
            p(&hs),
            p(&counters),
            p(&y),
            p(&fold),
        ])
        .collect();
    debug_assert_eq!(
        gate_up_args.len(),
        CUDA_COMMON_PARAMS.len() + CUDA_GATE_UP_PARAMS.len()
    );
    debug_assert_eq!(
        down_args.len(),
        CUDA_COMMON_PARAMS.len() + CUDA_DOWN_PARAMS.len()
    );
    // SAFETY: the argument lists match ft_experts_gate_up* and ft_experts_down*; every
    // address was checked (validate) or allocated for this launch, and the values live until
    // the calls return (the driver copies them at launch).
    unsafe {
        stream.launch_ex(
            &gate_up,
            ((step.intermediate / g) as u32, n_tasks, 1),
            (variant.gate_up_threads, 1, 1),
            staging.gate_up_shared as u32,
            &mut gate_up_args,
            false,
        )?;
        // The down kernel is a programmatic dependent of gate/up: it may start while gate/up
        // runs, staging its own tiles, and waits for h in the kernel.
        stream.launch_ex(
            &down,
            (down_tiles as u32, n_tasks, 1),
            (CUDA_THREADS, 1, 1),
            staging.down_shared as u32,
            &mut down_args,
            true,
        )?;
    }
    stream.release_arg(table)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Bit patterns of the exp_ft constants in `kernels/cuda/experts.cu`, in order
    /// LOG2E, C1, C2, P0..P5.
    const CU_EXP_CONSTANTS: [u32; 9] = [
        0x3fb8aa3b, 0x3f318000, 0xb95e8083, 0x39506967, 0x3ab743cf, 0x3c088908, 0x3d2aa9c1,
        0x3e2aaaaa, 0x3f000000,
    ];

    /// The CUDA exp_ft, operation by operation, with the .cu file's constants.
    fn cu_exp_ft(v: f32) -> f32 {
        let k = CU_EXP_CONSTANTS.map(f32::from_bits);
        let v = v.clamp(-87.0, 88.0);
        let n = (v * k[0] + 0.5).floor();
        let r = (v - n * k[1]) - n * k[2];
        let mut p = k[3];
        for c in &k[4..] {
            p = p * r + c;
        }
        let e = (p * (r * r) + r) + 1.0;
        e * f32::from_bits(((n as i32 + 127) as u32) << 23)
    }

    #[test]
    fn cuda_exp_constants_are_ft_kernels_own() {
        let src = ft_kernels::cuda_sources::KernelId::Experts.source();
        for c in CU_EXP_CONSTANTS {
            assert!(
                src.contains(&format!("0x{c:08x}")),
                "experts.cu lacks 0x{c:08x}"
            );
        }
        let mut v = -100.0f32;
        while v < 100.0 {
            assert_eq!(
                cu_exp_ft(v).to_bits(),
                ft_kernels::w4a8::exp_ft(v).to_bits(),
                "exp_ft({v})"
            );
            v += 0.00731;
        }
    }

    /// The parameter names of a comma-separated C parameter list (the last identifier of
    /// each declaration), with a macro that stands for others (TABLE_ARGS, DOWN_ARGS)
    /// replaced by its own list.
    fn cu_params(src: &str, list: &str) -> Vec<String> {
        let mut out = Vec::new();
        for decl in list.split(',') {
            let decl = decl.trim();
            if decl.is_empty() {
                continue;
            }
            if decl.chars().all(|c| c.is_ascii_uppercase() || c == '_') {
                out.extend(cu_params(src, &cu_macro(src, decl)));
                continue;
            }
            let name = decl
                .rsplit(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
                .next()
                .unwrap();
            out.push(name.to_string());
        }
        out
    }

    /// The body of a kernel source's `#define NAME ...` line, with its continuation lines
    /// joined.
    fn cu_macro(src: &str, name: &str) -> String {
        let prefix = format!("#define {name} ");
        let mut lines = src.lines().skip_while(|l| !l.starts_with(&prefix));
        let first = lines.next().unwrap_or_else(|| panic!("no #define {name}"));
        let mut body = String::new();
        for line in std::iter::once(first).chain(lines) {
            let line = line.trim_end();
            match line.strip_suffix('\\') {
                Some(l) => body.push_str(l),
                None => {
                    body.push_str(line);
                    break;
                }
            }
            body.push(' ');
        }
        body[prefix.len()..].trim().to_string()
    }

    #[test]
    fn the_launch_passes_the_kernels_parameters_in_their_order() {
        let src = ft_kernels::cuda_sources::KernelId::Experts.source();
        let with_common = |own: &[&str]| -> Vec<String> {
            CUDA_COMMON_PARAMS
                .iter()
                .chain(own)
                .map(|s| s.to_string())
                .collect()
        };
        assert_eq!(
            cu_params(src, &cu_macro(src, "GATE_UP_ARGS")),
            with_common(&CUDA_GATE_UP_PARAMS)
        );
        assert_eq!(
            cu_params(src, &cu_macro(src, "DOWN_ARGS")),
            with_common(&CUDA_DOWN_PARAMS)
        );
    }

    /// The `#define NAME value` of a kernel source, as a number.
    fn cu_define(src: &str, name: &str) -> usize {
        cu_macro(src, name).parse().unwrap()
    }

    #[test]
    fn launch_constants_match_the_kernel_sources() {
        use ft_kernels::cuda_sources::{KernelId, COMMON};
        let experts = KernelId::Experts.source();
        for v in CUDA_VARIANTS {
            let r = match v.tokens_per_pass {
                CUDA_MAX_TOKENS_PER_PASS => cu_define(experts, "DOWN_R_8"),
                n => cu_define(experts, &format!("DOWN_R_{n}")),
            };
            assert_eq!(v.down_rows, 16 * r, "{v:?}");
            for entry in [v.gate_up, v.down, v.down_direct] {
                assert!(experts.contains(&format!(" {entry}(")), "{v:?}");
                assert!(KernelId::Experts.entry_points().contains(&entry), "{v:?}");
            }
        }
        let wide = CUDA_SMALL_GRID_VARIANT;
        assert_eq!(wide.down_rows, 16 * cu_define(experts, "DOWN_R_1S"));
        assert!(experts.contains(&format!(" {}(", wide.gate_up)));
        assert!(experts.contains(&format!(" {}(", wide.down)));
        assert!(experts.contains(&format!(" {}(", wide.down_direct)));
        assert!(experts.contains(&format!(
            "__launch_bounds__({}, 2) {}(",
            wide.gate_up_threads, wide.gate_up
        )));
        assert_eq!(cu_define(experts, "MAXT"), CUDA_MAX_TOKENS_PER_PASS);
        assert_eq!(
            cu_define(experts, "ACT_F32") as i32,
            cuda_act_code(ActivationPath::F32)
        );
        assert_eq!(
            cu_define(experts, "ACT_INT8") as i32,
            cuda_act_code(ActivationPath::Int8)
        );
        assert_eq!(
            cu_define(COMMON, "FT_PARAM_TABLE_BYTES"),
            CUDA_PARAM_TABLE_BYTES
        );
    }

    /// A staged tile holds a tile's rows of every plane of the codec's layout: all rows of
    /// a matrix take its bytes plus at most 15 bytes of padding per plane.
    #[test]
    fn a_staged_tile_holds_the_codec_planes_of_its_rows() {
        for f in ExpertFormat::ALL {
            for (rows, cols) in [(16, 2560), (64, 640), (32, 3072), (7, 64)] {
                let whole = cuda_staged_tile_bytes(f, cols, rows).unwrap();
                let matrix = f.matrix_bytes(rows, cols) as usize;
                assert!(
                    whole >= matrix && whole < matrix + 3 * 16,
                    "{f} {rows}x{cols}: {whole} vs {matrix}"
                );
                assert_eq!(whole % 16, 0);
            }
        }
        // The kernel's own formula has the same three padded planes.
        let src = ft_kernels::cuda_sources::KernelId::Experts.source();
        assert!(src.contains(
            "return round16(n * values_row_bytes(fmt, cols)) + round16(n * scale_row_bytes(fmt, cols)) +"
        ));
    }

    #[test]
    fn staging_takes_the_served_tiles_and_leaves_the_wide_ones() {
        let g = |hidden, intermediate| ft_model::MoeGeometry {
            hidden,
            intermediate,
            experts: 8,
            top_k: 2,
            moe_layers: 1,
            shared_experts: 0,
        };
        let optin = 227 * 1024;
        // qwen3.8-flash-next at one token: activations (2560 codes + 160 scales) then the
        // two 16-row tiles of 1442 bytes a row (1280 values, 160 scales, 2 factor bytes).
        let st = ExpertStep::new(ExpertFormat::Nvfp4, &g(2560, 640), ActivationPath::Int8, 1);
        let v = cuda_variant(1);
        let p = cuda_staging(&st, v, 1, optin).unwrap();
        assert_eq!(
            p.gate_up_stage_off,
            (2560 + 4 * 160usize).next_multiple_of(16)
        );
        assert_eq!(
            p.gate_up_shared,
            p.gate_up_stage_off + 2 * (16 * 1280 + 16 * 160 + 32)
        );
        assert!(p.down_staged);
        assert_eq!(p.down_shared, 64 * 320 + 64 * 40 + 128);
        // bf16 at the same width: 160 KiB of tiles, read from global memory instead.
        let wide = ExpertStep::new(ExpertFormat::Bf16, &g(2560, 640), ActivationPath::F32, 1);
        let p = cuda_staging(&wide, v, 1, optin).unwrap();
        assert_eq!(p.gate_up_stage_off, 0);
        assert!(p.gate_up_shared <= CUDA_SHARED_BUDGET);
        // A device with only the default 48 KiB stages nothing of the served gate/up tile.
        let small = cuda_staging(&st, v, 1, 48 * 1024).unwrap();
        assert_eq!(small.gate_up_stage_off, 0);
        assert!(small.down_staged);
    }

    #[test]
    fn a_batch_1_layer_travels_in_the_launch_parameters() {
        let g = ft_model::MoeGeometry {
            hidden: 2560,
            intermediate: 640,
            experts: 512,
            top_k: 10,
            moe_layers: 1,
            shared_experts: 0,
        };
        for tokens in [1usize, 8] {
            let mut st = ExpertStep::new(ExpertFormat::Nvfp4, &g, ActivationPath::Int8, tokens);
            st.experts = (0..10 * tokens)
                .map(|e| ExpertTask {
                    weights_offset: e * 4096,
                    tokens: vec![TokenWeight {
                        token: (e / 10) as u32,
                        weight: 0.1,
                    }],
                })
                .collect();
            let t = cuda_tables(&st, 1 << 40);
            assert!(
                t.bytes.len() <= CUDA_PARAM_TABLE_BYTES,
                "{tokens} tokens: {} bytes",
                t.bytes.len()
            );
        }
    }

    /// The small-grid kernels for one-token launches of at most one gate/up block per
    /// multiprocessor, and for no other.
    #[test]
    fn small_grid_kernels_only_for_small_one_token_grids() {
        let one = cuda_variant(1);
        assert!(cuda_small_grid(one, 132, 132));
        assert!(cuda_small_grid(one, 1, 132));
        assert!(!cuda_small_grid(one, 133, 132));
        for tokens in [2, 4, 8] {
            assert!(!cuda_small_grid(cuda_variant(tokens), 8, 132));
        }
    }

    /// Every module takes the format's own definitions: the split-sign dot for the e2m1
    /// formats on the int8 path, the hardware scale decode for nvfp4; the timelines only
    /// where the tuning asks.
    #[test]
    fn the_specialization_follows_the_format_and_the_timelines_alone() {
        let g = ft_model::ModelSpec::preset("qwen3.8-flash-next")
            .unwrap()
            .geometry;
        for f in ExpertFormat::ALL {
            for act in [ActivationPath::F32, ActivationPath::Int8] {
                let st = ExpertStep::new(f, &g, act, 1);
                for stamps in [false, true] {
                    let t = CudaTuning {
                        block_stamps: stamps,
                        ..CudaTuning::default()
                    };
                    let sp = cuda_specialization(&st, &t);
                    let e2m1 = matches!(f, ExpertFormat::Nvfp4 | ExpertFormat::Mxfp4);
                    assert_eq!(sp.e2m1_split, e2m1 && act == ActivationPath::Int8);
                    assert_eq!(sp.e4m3_cvt, f == ExpertFormat::Nvfp4);
                    assert_eq!(sp.block_stamps, stamps);
                    assert_eq!(sp.format, Some(cuda_format_code(f)));
                }
            }
        }
    }

    #[test]
    fn the_tuning_names_exactly_the_instantiations() {
        let tokens: Vec<usize> = CUDA_VARIANTS.iter().map(|v| v.tokens_per_pass).collect();
        assert_eq!(tokens, crate::device::tuning::CUDA_VARIANT_TOKENS);
    }

    #[test]
    fn the_variant_is_the_smallest_that_holds_the_largest_task() {
        for pairs in 0..=20usize {
            let v = cuda_variant(pairs);
            let naive = if pairs <= 1 {
                1
            } else if pairs <= 2 {
                2
            } else if pairs <= 4 {
                4
            } else {
                CUDA_MAX_TOKENS_PER_PASS
            };
            assert_eq!(v.tokens_per_pass, naive, "{pairs} pairs");
            let src = ft_kernels::cuda_sources::KernelId::Experts.source();
            assert!(src.contains(&format!(" {}(", v.gate_up)), "{}", v.gate_up);
            assert!(src.contains(&format!(" {}(", v.down)), "{}", v.down);
        }
    }

    #[test]
    fn tables_list_tokens_in_task_order() {
        let g = MoeGeometry {
            hidden: 64,
            intermediate: 32,
            experts: 3,
            top_k: 2,
            moe_layers: 1,
            shared_experts: 0,
        };
        let mut st = ExpertStep::new(ExpertFormat::Nvfp4, &g, ActivationPath::Int8, 3);
        let tw = |token, weight| TokenWeight { token, weight };
        st.experts = vec![
            ExpertTask {
                weights_offset: 0,
                tokens: vec![tw(2, 0.5), tw(0, 0.25)],
            },
            ExpertTask {
                weights_offset: 256,
                tokens: vec![],
            },
            ExpertTask {
                weights_offset: 512,
                tokens: vec![tw(0, 0.75)],
            },
        ];
        let t = cuda_tables(&st, 1 << 40);
        let u32_at = |o: usize| u32::from_le_bytes(t.bytes[o..o + 4].try_into().unwrap());
        let u64_at = |o: usize| u64::from_le_bytes(t.bytes[o..o + 8].try_into().unwrap());
        assert_eq!(t.pairs, 3);
        assert_eq!(t.max_task_pairs, 2);
        assert_eq!(u64_at(32), (1 << 40) + 512);
        assert_eq!((u32_at(40), u32_at(44)), (2, 1));
        // token starts: token 0 has pairs 1 (task 0) then 2 (task 2); token 1 none; token 2 pair 0
        let b = t.offsets[2];
        assert_eq!(
            [u32_at(b), u32_at(b + 4), u32_at(b + 8), u32_at(b + 12)],
            [0, 2, 2, 3]
        );
        let tp = t.offsets[3];
        assert_eq!([u32_at(tp), u32_at(tp + 8), u32_at(tp + 16)], [1, 2, 0]);
        assert!(t.offsets.iter().all(|o| o % 16 == 0));
        let (offs, total) = cuda_scratch_layout(&st, 3);
        assert!(offs.windows(2).all(|w| w[0] < w[1]) && total > offs[3]);
        assert_eq!(cuda_pass_tokens(&st).unwrap().0, CUDA_MAX_TOKENS_PER_PASS);
    }
}
