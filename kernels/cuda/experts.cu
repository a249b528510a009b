// GPU expert kernels: all of a layer's routed experts (hits and fetched misses) for every
// token routed to them, every format, f32 and int8 activation paths.
//
// Semantics (runtime/src/gpu_experts.rs): y[t] = sum over tasks e in order, over e's pairs
// (t, w) in order, of w * down_e(silu(gate_e x[t]) * up_e x[t]); 0 for unrouted tokens.
//
// Two launches per layer:
//   ft_experts_gate_up: grid (intermediate / G, tasks); a block computes G consecutive rows
//     of gate and up for every token of its task, h = silu(g) * u, and (int8 path) quantizes
//     that block of h exactly as the CPU does;
//   ft_experts_down: grid (ceil(hidden / rows), tasks); a block computes a tile of rows of
//     down (16 per variant's DOWN_R) for its task's tokens into O[pair][row]; the last block
//     of each row tile (atomic ticket)
//     sums the tile's rows per token over the token's pairs in task order into y, and where
//     the runtime folds the layer's combine into this launch, combines the tile's columns
//     into the residual stream (FoldCombine below).
// Instantiations by tokens per pass (1, 2, 4, 8: _1, _2, _4 and the plain names), and for
// one-token launches of at most one gate/up block per multiprocessor the small-grid pair
// ft_experts_gate_up_1w (512 threads, one dot per half-warp) and ft_experts_down_1s. Each
// down kernel has a `_direct` twin for launches that do not stage their row tiles.
//
// The int8 path mirrors the specification in ft-kernels' w4a8 module docs operation by
// operation: per-block int8 activation quantization (IEEE division, roundf), exact integer
// block dots (dp4a), s = s_b * scale_b, t = f32(d) * s, 16 accumulators taken by the 16
// lanes of a half-warp (lane l owns blocks l, l + 16, ... in increasing order, i.e. acc[b%16]),
// the fixed reduction r8/r4/r2/r1 by shuffles, dot = r1 * f_r, the shared exp_ft/silu, and
// y = y + w * o in task order. Compiled with --fmad=false; every f32 operation of the spec is
// also written with an explicit _rn intrinsic so no contraction can occur.

#define FT_BF16 0
#define FT_INT8 1
#define FT_Q4_0 2
#define FT_NVFP4 3
#define FT_MXFP4 4

#define ACT_F32 0
#define ACT_INT8 1

// The runtime compiles one module per (format, activation path), with -DFT_FMT and -DFT_ACT:
// every format and path switch below then folds to one branch, and each format's kernels hold
// only the registers it needs (a format-generic kernel is sized for the widest, bf16, and
// spills in the one-token variants). Without them (a plain compile of this source) both stay
// run-time arguments. The arguments are passed either way.
#ifdef FT_FMT
#define FMT_OF(v) FT_FMT
#else
#define FMT_OF(v) (v)
#endif
#ifdef FT_ACT
#define ACT_OF(v) FT_ACT
#else
#define ACT_OF(v) (v)
#endif

// Tokens of a task handled per pass (register accumulators per lane).
#define MAXT 8
// Lanes per dot product: the spec's 16 accumulators.
#define HW 16
// Rows of down per half-warp of each variant (by tokens per pass); a block of 256 threads
// covers 16 times as many. The runtime's CudaVariant::down_rows must match.
#define DOWN_R_1 4
#define DOWN_R_2 2
#define DOWN_R_4 1
#define DOWN_R_8 1
// ... and of the small-grid one-token down kernel (ft_experts_down_1s).
#define DOWN_R_1S 2
// Pairs of a token whose partial rows the down kernel's combine loads at once.
#define COMBINE_UNROLL 8

struct Task {
    u64 weights;      // device address of the expert (gate, up, down)
    u32 pair_begin;   // first pair of the task
    u32 pair_count;   // pairs of the task
};

// The layer's fixed-order combine folded into the down kernel of its last launch (the
// runtime's `CudaFoldCombine`, from `Stream::launch_experts_then_combine`; all addresses, 0
// where absent): once the last block of a row tile
// has written the tile's rows of y, it runs combine_fixed_at (common.cuh) for the tile's
// columns of every stream, so the layer needs no combine launch after it. act == 0: no fold.
struct FoldCombine {
    u64 act;          // float*: the residual stream, block f32
    u64 parts;        // const float*: the hits' rows, k blocks of `block` f32
    u64 more[4];      // const float*: the fetched chunks' rows, in order (y among them)
    u64 block;        // f32 per row block: streams x hidden
    u64 k;            // row blocks
};

// The folded combine of the tile's columns (below, in down_impl), out of line: its stack and
// registers stay out of the down kernel's main loop.
__device__ __noinline__ void fold_combine_tile(const FoldCombine& fold, int H, int j0, int rows) {
    const u64 streams = fold.block / (u64)H;
    for (u64 idx = threadIdx.x; idx < streams * rows; idx += blockDim.x) {
        const u64 s = idx / rows;
        const int j = j0 + (int)(idx % rows);
        if (j >= H) continue;
        combine_fixed_at((float*)fold.act, (const float*)fold.parts,
                         (const float*)fold.more[0], (const float*)fold.more[1],
                         (const float*)fold.more[2], (const float*)fold.more[3],
                         fold.block, (int)fold.k, s * (u64)H + j);
    }
}

struct Pair {
    u32 index;        // token (task pairs) or pair index (token lists)
    float weight;     // routing weight
};

__device__ __forceinline__ int group_of(int fmt) {
    return (fmt == FT_NVFP4 || fmt == FT_BF16) ? 16 : 32;
}

__device__ __forceinline__ u64 values_row_bytes(int fmt, u64 cols) {
    switch (fmt) {
    case FT_BF16: return 2 * cols;
    case FT_INT8: return cols;
    case FT_Q4_0: return 18 * (cols / 32);
    default: return cols / 2;   // nvfp4, mxfp4
    }
}

__device__ __forceinline__ u64 matrix_bytes(int fmt, u64 rows, u64 cols) {
    switch (fmt) {
    case FT_BF16: return 2 * rows * cols;
    case FT_INT8: return rows * cols + 4 * rows;
    case FT_Q4_0: return rows * (cols / 32) * 18;
    case FT_NVFP4: return rows * cols / 2 + rows * cols / 16 + 2 * rows;
    default: return rows * cols / 2 + rows * cols / 32;   // mxfp4
    }
}

// Exact f16 -> f32.
__device__ __forceinline__ float f16_to_f32(u32 h) {
    u32 s = (h >> 15) & 1, e = (h >> 10) & 31, m = h & 1023;
    float v;
    if (e == 0) v = (float)m * 5.9604644775390625e-8f;   // m * 2^-24, exact
    else if (e == 31) v = __int_as_float(0x7f800000 | (m << 13));
    else v = __int_as_float(((e + 112) << 23) | (m << 13));
    return s ? -v : v;
}

// Exact OCP e4m3 -> f32 (bias 7, subnormals m * 2^-9, 0x7f NaN), without branches: the
// code's exponent and mantissa bits placed in an f32 (bits 26..20) read as 2^(e - 127) x
// 1.m, or for e = 0 as the f32 subnormal m/8 x 2^-126; times 2^120 that is e4m3's 2^(e - 7)
// x 1.m, or m x 2^-9, exactly (a power-of-two scaling of a value that stays finite; NVRTC
// keeps f32 subnormals, no -ftz). The same values as the CPU's decode table.
__device__ __forceinline__ float e4m3_to_f32(u32 b) {
    const u32 bits = ((b & 0x80u) << 24) | ((b & 0x7fu) << 20);
    const float v = __fmul_rn(__int_as_float(bits), __int_as_float(0x7b800000));   // 2^120
    return (b & 0x7fu) == 0x7fu ? __int_as_float(0x7fc00000) : v;
}

// The nvfp4 block scales decoded by the hardware (FT_E4M3_CVT=1, sm_89 and later):
// cvt.rn.f16x2.e4m3x2 widens the code to f16, exactly (every e4m3 value, subnormals
// included, is an f16 value), and f16 -> f32 is exact, so the f32 is e4m3_to_f32's for every
// code but the two NaNs (0x7f, 0xff), which stay NaN (a NaN's bits do not survive the
// arithmetic after it either way). Two instructions instead of seven, in the innermost loop
// of every nvfp4 kernel. The runtime builds every nvfp4 module with it (measured in
// experiments/gpu-backend, "Four kernel switches": 3% off a one-token layer).
#ifndef FT_E4M3_CVT
#define FT_E4M3_CVT 0
#endif

__device__ __forceinline__ float e4m3_scale(u32 b) {
#if FT_E4M3_CVT && __CUDA_ARCH__ >= 890
    float f;
    asm("{\n\t.reg .b32 h2;\n\t.reg .b16 lo, hi;\n\t"
        "cvt.rn.f16x2.e4m3x2 h2, %1;\n\t"
        "mov.b32 {lo, hi}, h2;\n\t"
        "cvt.f32.f16 %0, lo;\n\t}"
        : "=f"(f) : "h"((unsigned short)b));
    return f;
#else
    return e4m3_to_f32(b);
#endif
}

// Exact e8m0 -> f32: 2^(E - 127); E = 0 is the subnormal 2^-127; 255 NaN.
__device__ __forceinline__ float e8m0_to_f32(u32 e) {
    if (e == 255) return __int_as_float(0x7fc00000);
    if (e == 0) return __int_as_float(0x00400000);
    return __int_as_float(e << 23);
}

// Four e2m1 codes (nibbles 0..3 of `sel`, elements in order) -> four int8 weights 2*e2m1.
__device__ __forceinline__ u32 e2m1x4_to_i8x4(u32 sel) {
    u32 s7 = sel & 0x7777u;
    u32 pos = __byte_perm(0x03020100u, 0x0C080604u, s7);   // 0 1 2 3 | 4 6 8 12
    u32 neg = __byte_perm(0xFDFEFF00u, 0xF4F8FAFCu, s7);   // negated
    u32 t = (sel >> 3) & 0x1111u;                           // sign of each code, 0/1 per nibble
    u32 m = __byte_perm(0x0000FF00u, 0u, t);                // 0xFF per negative byte
    return (pos & ~m) | (neg & m);
}

// The split-sign dot of e2m1 codes (FT_E2M1_SPLIT, the one-token variants of nvfp4 and
// mxfp4): instead of decoding each code to a signed int8 (three byte permutes and three
// logic operations per four codes, e2m1x4_to_i8x4), look the magnitude up with prmt in its
// sign-replicating mode, where a selector nibble with its top bit set (a negative code)
// yields the sign of the selected byte (0: the table's bytes are positive), and again with
// the sign bits flipped (only the negative codes' magnitudes): w.x = dp4a(p, x) - dp4a(q, x).
// Two permutes and two dp4a per four codes, one table, the same exact integer as the
// decoded dot. The runtime builds every nvfp4 and mxfp4 module of the int8 path with it, as
// a compile-time constant of the module (measured in experiments/gpu-backend).
#ifndef FT_E2M1_SPLIT
#define FT_E2M1_SPLIT 0
#endif

// Bytes 0..3 of the magnitude table 2 * |e2m1| = {0, 1, 2, 3 | 4, 6, 8, 12}, in a register
// the compiler cannot see through (it would otherwise rematerialize the constant before
// every permute that needs it in a register).
__device__ __forceinline__ u32 e2m1_table_lo() {
    u32 t;
    asm volatile("mov.b32 %0, 0x03020100;" : "=r"(t));
    return t;
}

// The same table word in a register of every thread of the block for a whole loop: thread 0
// publishes it in shared memory (e2m1_table_publish), and after a barrier every thread reads
// it (e2m1_table_read). Held as a constant, the compiler keeps it in a uniform register and
// copies it into a vector register before nearly every prmt that reads it (47 copies in the
// 314 instructions of the one-token gate/up loop's four blocks at sm_90); a value loaded from
// shared memory lives in one vector register instead (264 instructions). Only where the
// table comes from changes, not a result.
__shared__ u32 e2m1_table_smem;
__device__ __forceinline__ void e2m1_table_publish() {
    if (threadIdx.x == 0) e2m1_table_smem = e2m1_table_lo();
}
__device__ __forceinline__ u32 e2m1_table_read() { return e2m1_table_smem; }

// prmt.b32 in its default mode over the magnitude table (low bytes in `lo`): byte n of the
// result is table byte (sel >> 4n) & 7, or 0 where nibble n of sel has its top bit set.
__device__ __forceinline__ u32 e2m1_mag(u32 lo, u32 sel) {
    u32 d;
    asm("prmt.b32 %0, %1, %2, %3;" : "=r"(d) : "r"(lo), "n"(0x0C080604), "r"(sel));
    return d;
}

// Eight e2m1 codes (nibbles of w, elements in order) against eight int8 activations (x0:
// elements 0..3, x1: 4..7): adds the positive codes' products to pos, the negative ones' to neg.
__device__ __forceinline__ void e2m1_dot8(u32 w, int x0, int x1, u32 lo, int& pos, int& neg) {
    const u32 wn = w ^ 0x88888888u;
    pos = __dp4a((int)e2m1_mag(lo, w), x0, pos);
    neg = __dp4a((int)e2m1_mag(lo, wn), x0, neg);
    pos = __dp4a((int)e2m1_mag(lo, w >> 16), x1, pos);
    neg = __dp4a((int)e2m1_mag(lo, wn >> 16), x1, neg);
}

// The exact integer dot of block b of an e2m1 row (nvfp4: G = 16, mxfp4: G = 32) with the
// block's G int8 activations (a0: elements 0..15, a1: 16..31), by split signs: the value
// block_dot_i8 gives for the decoded weights.
__device__ __forceinline__ int e2m1_block_dot(const u8* vrow, int b, int G, int4 a0, int4 a1, u32 lo) {
    int pos = 0, neg = 0;
    if (G == 16) {
        const uint2 v = *(const uint2*)(vrow + (u64)b * 8);
        e2m1_dot8(v.x, a0.x, a0.y, lo, pos, neg);
        e2m1_dot8(v.y, a0.z, a0.w, lo, pos, neg);
    } else {
        const uint4 v = *(const uint4*)(vrow + (u64)b * 16);
        e2m1_dot8(v.x, a0.x, a0.y, lo, pos, neg);
        e2m1_dot8(v.y, a0.z, a0.w, lo, pos, neg);
        e2m1_dot8(v.z, a1.x, a1.y, lo, pos, neg);
        e2m1_dot8(v.w, a1.z, a1.w, lo, pos, neg);
    }
    return pos - neg;
}

// Whether a variant of MT tokens per pass takes the split-sign dot for format fmt.
__device__ __forceinline__ bool split_sign(int MT, int fmt) {
    return FT_E2M1_SPLIT && MT == 1 && (fmt == FT_NVFP4 || fmt == FT_MXFP4);
}

// Four q4_0 nibbles (one per byte, 0..15) -> four int8 weights q - 8.
__device__ __forceinline__ u32 q4_to_i8x4(u32 l) {
    return (l + 0x78787878u) ^ 0x80808080u;
}

// The G integer weights of block b of a row, as G/4 packed int8 dwords (elements in order).
__device__ __forceinline__ void load_w8(int fmt, const u8* vrow, int b, u32 W[8]) {
    if (fmt == FT_NVFP4) {
        uint2 v = *(const uint2*)(vrow + (u64)b * 8);
        W[0] = e2m1x4_to_i8x4(v.x);
        W[1] = e2m1x4_to_i8x4(v.x >> 16);
        W[2] = e2m1x4_to_i8x4(v.y);
        W[3] = e2m1x4_to_i8x4(v.y >> 16);
    } else if (fmt == FT_MXFP4) {
        uint4 v = *(const uint4*)(vrow + (u64)b * 16);
        W[0] = e2m1x4_to_i8x4(v.x); W[1] = e2m1x4_to_i8x4(v.x >> 16);
        W[2] = e2m1x4_to_i8x4(v.y); W[3] = e2m1x4_to_i8x4(v.y >> 16);
        W[4] = e2m1x4_to_i8x4(v.z); W[5] = e2m1x4_to_i8x4(v.z >> 16);
        W[6] = e2m1x4_to_i8x4(v.w); W[7] = e2m1x4_to_i8x4(v.w >> 16);
    } else if (fmt == FT_Q4_0) {
        const u16* p = (const u16*)(vrow + (u64)b * 18 + 2);
        u32 q[4];
#pragma unroll
        for (int k = 0; k < 4; k++) q[k] = (u32)p[2 * k] | ((u32)p[2 * k + 1] << 16);
#pragma unroll
        for (int k = 0; k < 4; k++) {
            W[k] = q4_to_i8x4(q[k] & 0x0F0F0F0Fu);             // columns 4k .. 4k+3
            W[4 + k] = q4_to_i8x4((q[k] >> 4) & 0x0F0F0F0Fu);  // columns 16+4k ..
        }
    } else {   // int8
        uint4 v0 = *(const uint4*)(vrow + (u64)b * 32);
        uint4 v1 = *(const uint4*)(vrow + (u64)b * 32 + 16);
        W[0] = v0.x; W[1] = v0.y; W[2] = v0.z; W[3] = v0.w;
        W[4] = v1.x; W[5] = v1.y; W[6] = v1.z; W[7] = v1.w;
    }
}

// A weight matrix in the codec's byte layout.
struct Mat {
    const u8* base;
    u64 rows, cols;
};

// Bytes per row of each part of a matrix in the codec's layout: values (q4_0's blocks carry
// their scale), separate block scales (nvfp4 e4m3, mxfp4 e8m0) and row factors (nvfp4 f16,
// int8 f32). Each part holds its rows one after the other, so consecutive rows of a part are
// one contiguous range.
__device__ __forceinline__ u64 scale_row_bytes(int fmt, u64 cols) {
    return fmt == FT_NVFP4 ? cols / 16 : (fmt == FT_MXFP4 ? cols / 32 : 0);
}
__device__ __forceinline__ u64 factor_row_bytes(int fmt) {
    return fmt == FT_NVFP4 ? 2 : (fmt == FT_INT8 ? 4 : 0);
}

// Where the rows of a tile (rows r0 .. r0 + n of a matrix; row k of the tile is row r0 + k)
// are read from: in the matrix itself (global memory, `tile_at`) or staged in shared memory
// (`stage_tile`). The arithmetic reads through a Tile either way, so staging changes where
// the bytes come from and nothing else (the W4A8 bit-identity with the CPU holds).
struct Tile {
    const u8* vals;      // row k at vals + k * values_row_bytes
    const u8* scales;    // row k's block scales at scales + k * scale_row_bytes (nvfp4, mxfp4)
    const u8* factors;   // row k's factor at factors + k * factor_row_bytes (nvfp4, int8)
};

__device__ __forceinline__ Tile tile_at(int fmt, const Mat& m, u64 r0) {
    const u64 vrb = values_row_bytes(fmt, m.cols), srb = scale_row_bytes(fmt, m.cols);
    const u8* scales = m.base + m.rows * vrb;
    const u8* factors = scales + m.rows * srb;
    return {m.base + r0 * vrb, scales + r0 * srb, factors + r0 * factor_row_bytes(fmt)};
}

__device__ __forceinline__ u64 round16(u64 x) { return (x + 15) & ~(u64)15; }

// Shared-memory bytes of a staged tile of n rows (each part 16-byte aligned). The runtime's
// `cuda_staged_tile_bytes` must match.
__device__ __forceinline__ u64 staged_tile_bytes(int fmt, u64 cols, u64 n) {
    return round16(n * values_row_bytes(fmt, cols)) + round16(n * scale_row_bytes(fmt, cols)) +
           round16(n * factor_row_bytes(fmt));
}

// Copy `bytes` at global `src` into shared `dst`, every thread of the block taking part: on
// sm_80 and later as asynchronous 16-byte copies (cp.async, L1 bypassed) where both ends and
// the size are 16-byte aligned, so that the whole range is in flight at once and the block
// can do other work meanwhile; otherwise with plain loads. `stage_wait` completes them.
// `stage_async_by` is the same with `n` threads taking part, this one being thread `k` of
// them (a warp staging its own rows: k = its lane, n = 32).
__device__ __forceinline__ void stage_async_by(u8* dst, const u8* src, u64 bytes, u32 k, u32 n) {
#if __CUDA_ARCH__ >= 800
    if ((((u64)src | (u64)dst | bytes) & 15) == 0) {
        const u32 d = (u32)__cvta_generic_to_shared(dst);
        for (u64 i = (u64)k * 16; i < bytes; i += (u64)n * 16)
            asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(d + (u32)i), "l"(src + i)
                         : "memory");
        return;
    }
#endif
    for (u64 i = k; i < bytes; i += n) dst[i] = src[i];
}
__device__ __forceinline__ void stage_async(u8* dst, const u8* src, u64 bytes) {
    stage_async_by(dst, src, bytes, threadIdx.x, blockDim.x);
}

// Wait for this thread's asynchronous copies; a __syncthreads must follow before any thread
// reads what the others staged.
__device__ __forceinline__ void stage_wait() {
#if __CUDA_ARCH__ >= 800
    asm volatile("cp.async.wait_all;\n" ::: "memory");
#endif
}

// The tile of n rows of a matrix of `cols` columns staged in shared memory at `dst`
// (staged_tile_bytes long): values, then block scales, then row factors.
__device__ __forceinline__ Tile tile_in(int fmt, u64 cols, u64 n, u8* dst) {
    u8* ds = dst + round16(n * values_row_bytes(fmt, cols));
    return {dst, ds, ds + round16(n * scale_row_bytes(fmt, cols))};
}

// Start staging rows r0 .. r0 + n of m into shared memory at `dst` (staged_tile_bytes long),
// `nthreads` threads taking part (this one thread `k` of them), the row factors too where
// `factors`, and return the tile that reads them there (valid after stage_wait and a
// barrier; where not `factors`, its factors pointer is still the shared one, unfilled).
__device__ __forceinline__ Tile stage_tile_by(int fmt, const Mat& m, u64 r0, u64 n, u8* dst, u32 k, u32 nthreads,
                                              bool factors) {
    const Tile g = tile_at(fmt, m, r0), t = tile_in(fmt, m.cols, n, dst);
    const u64 sb = n * scale_row_bytes(fmt, m.cols), fb = factors ? n * factor_row_bytes(fmt) : 0;
    stage_async_by(dst, g.vals, n * values_row_bytes(fmt, m.cols), k, nthreads);
    if (sb) stage_async_by((u8*)t.scales, g.scales, sb, k, nthreads);
    if (fb) stage_async_by((u8*)t.factors, g.factors, fb, k, nthreads);
    return t;
}
// The whole block stages the whole tile.
__device__ __forceinline__ Tile stage_tile(int fmt, const Mat& m, u64 r0, u64 n, u8* dst) {
    return stage_tile_by(fmt, m, r0, n, dst, threadIdx.x, blockDim.x, true);
}

// A 32-bit load with acquire semantics at device scope: the loads after it see what the
// writer released (its writes before the release that this load observes).
__device__ __forceinline__ u32 ld_acquire_gpu(const u32* p) {
    u32 v;
    asm volatile("ld.acquire.gpu.global.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
    return v;
}

// Device-scope hand-offs between blocks without a sequentially consistent fence.
// `__threadfence()` compiles to MEMBAR.SC.GPU (with an L1 invalidate) on sm_90, which waits
// behind every memory request in flight on the chip (in the block timelines a row tile's
// last down block took 2.7 us from its own work to its end, 2.3 with the hand-off below;
// experiments/gpu-backend, "Block timelines"). The pattern the CUDA memory model gives
// instead (as CUTLASS's barriers use it): the block's
// threads write, a barrier, then thread 0 releases at device scope (its release is
// cumulative over the writes the barrier ordered before it); the receiving thread 0
// acquires the same location, then a barrier orders its block's reads after it. The values
// written and read are the same, so the same bits.
__device__ __forceinline__ u32 atom_add_acq_rel_gpu(u32* p, u32 v) {
    u32 old;
    asm volatile("atom.acq_rel.gpu.global.add.u32 %0, [%1], %2;" : "=r"(old) : "l"(p), "r"(v) : "memory");
    return old;
}

// The GPU's global timer, ns.
__device__ __forceinline__ u64 globaltimer_ns() {
    u64 t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    return t;
}

// A launch gated on a flag (the runtime's `Stream::launch_experts_gated`): the launch is
// queued before the bytes it reads have landed, and another stream stores `value` at `gate`
// once they have (`Stream::write_flag`, a stream memory operation ordered after that
// stream's copies, their writes visible with it). Every block waits here before it reads a
// weight, so the launch's own start (its scheduling, the tables, the dependent down kernel's
// launch) overlaps the last copy instead of following it. The comparison is modular (the
// runtime's values count up and wrap). Thread 0 polls with an acquire load, then the barrier
// orders the block's reads after it. A flag not reached within 10 s traps (an error on the
// stream, never a silent hang).
__device__ __forceinline__ void gate_wait(const u32* gate, u32 value) {
    if (gate == nullptr) return;
    if (threadIdx.x == 0) {
        const u64 t0 = globaltimer_ns();
        while ((int)(ld_acquire_gpu(gate) - value) < 0) {
            __nanosleep(128);
            if (globaltimer_ns() - t0 > 10000000000ull) __trap();
        }
    }
    __syncthreads();
}

// Block timelines (FT_STAMPS=1, the runtime's FT_CUDA_STAMPS; off by default, and then none
// of this is compiled). Thread 0 of every block of the expert kernels notes the global timer
// at five points of the block's life and appends one record at its end: where a layer's time
// goes (the gaps between launches, how long blocks take to become resident, the wait for
// their weights, for gate/up's h, the compute and the combine), which the profiler's counters
// do not show for a launch of a few microseconds. Only thread 0 writes and reads the block's
// stamps (ft_stamp_t), so they need no barrier. The runtime reads ft_stamps and
// ft_stamp_count from the module (`Device::take_block_stamps`) and zeroes the count; records
// past FT_STAMP_CAP are counted, not kept. Record layout, 8 u64 (the runtime's BlockStamp):
//   [0] kernel << 56 | sm << 40 | blockIdx.y << 20 | blockIdx.x
//   [1..6) globaltimer, ns: 0 entry, 1 start condition met (the gate; for down, gate/up's h
//          ready), 2 weights and activations in shared memory, 3 own work done (down: before
//          its row tile's ticket; 0 where not noted), 4 exit
//   [6], [7] clock64 at entry and exit (the multiprocessor's cycles, for its clock rate)
#ifndef FT_STAMPS
#define FT_STAMPS 0
#endif
#define FT_STAMP_CAP 32768
#define STAMP_GATE_UP 1
#define STAMP_DOWN 2
#if FT_STAMPS
__device__ u32 ft_stamp_count;
__device__ u64 ft_stamps[FT_STAMP_CAP][8];
__shared__ u64 ft_stamp_t[4];
__shared__ u64 ft_stamp_c0;
__device__ __forceinline__ void stamp_begin() {
    if (threadIdx.x == 0) {
        ft_stamp_c0 = clock64();
        ft_stamp_t[0] = globaltimer_ns();
        ft_stamp_t[1] = ft_stamp_t[2] = ft_stamp_t[3] = 0;
    }
}
__device__ __forceinline__ void stamp(int i) {
    if (threadIdx.x == 0) ft_stamp_t[i] = globaltimer_ns();
}
__device__ __forceinline__ void stamp_end(u32 kernel, u32 bx, u32 by) {
    if (threadIdx.x != 0) return;
    const u64 c1 = clock64();
    const u64 t4 = globaltimer_ns();
    u32 sm;
    asm volatile("mov.u32 %0, %%smid;" : "=r"(sm));
    const u32 k = atomicAdd(&ft_stamp_count, 1u);
    if (k >= FT_STAMP_CAP) return;
    u64* r = ft_stamps[k];
    r[0] = (u64)kernel << 56 | (u64)(sm & 0xffff) << 40 | (u64)(by & 0xfffff) << 20 | (u64)(bx & 0xfffff);
    for (int i = 0; i < 4; i++) r[1 + i] = ft_stamp_t[i];
    r[5] = t4;
    r[6] = ft_stamp_c0;
    r[7] = c1;
}
#else
__device__ __forceinline__ void stamp_begin() {}
__device__ __forceinline__ void stamp(int) {}
__device__ __forceinline__ void stamp_end(u32, u32, u32) {}
#endif

// Programmatic dependent launch (sm_90): a primary kernel lets the next kernel of its stream
// start early (`pdl_launch_dependents`), and that kernel waits for the primary to complete
// and its writes to be visible (`pdl_wait`) before it reads them. Without the launch
// attribute (or before sm_90) the wait returns at once and the launch is ordered as usual.
__device__ __forceinline__ void pdl_launch_dependents() {
#if __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.launch_dependents;\n" ::: "memory");
#endif
}
__device__ __forceinline__ void pdl_wait() {
#if __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.wait;\n" ::: "memory");
#endif
}

// Block factor s_b of block b of the tile's row k (section 1 of the spec); 1 for int8 and bf16.
__device__ __forceinline__ float block_scale(int fmt, const Tile& t, u64 cols, u64 k, int b) {
    if (fmt == FT_NVFP4) return e4m3_scale(t.scales[k * (cols / 16) + b]);
    if (fmt == FT_MXFP4) return e8m0_to_f32(t.scales[k * (cols / 32) + b]);
    if (fmt == FT_Q4_0) return f16_to_f32(*(const u16*)(t.vals + k * values_row_bytes(fmt, cols) + (u64)b * 18));
    return 1.0f;
}

// Block b's scale of an e2m1 row (nvfp4, mxfp4) whose scales start at srow: block_scale
// with the row's address found by the caller.
__device__ __forceinline__ float e2m1_block_scale(int fmt, const u8* srow, int b) {
    return fmt == FT_NVFP4 ? e4m3_scale(srow[b]) : e8m0_to_f32(srow[b]);
}

// Row factor f_r of the tile's row k.
__device__ __forceinline__ float row_factor(int fmt, const Tile& t, u64 k) {
    if (fmt == FT_NVFP4) return __fmul_rn(f16_to_f32(*(const u16*)(t.factors + 2 * k)), 0.5f);
    if (fmt == FT_MXFP4) return 0.5f;
    if (fmt == FT_INT8) return *(const float*)(t.factors + 4 * k);
    return 1.0f;
}

// Signed byte k of w as f32 (exact): 2^23 + (byte ^ 0x80) - (2^23 + 128).
__device__ __forceinline__ float i8_at(u32 w, int k) {
    return __int_as_float(__byte_perm(w ^ 0x80808080u, 0x4B000000u, 0x7440u | (u32)k)) - 8388736.0f;
}

// f32-path partial dot of one block: sum of w_i * x_i (any order; f32 path has a tolerance).
__device__ __forceinline__ float block_dot_f32(int fmt, const u8* vrow, int b, int G, const float* xb) {
    float p = 0.0f;
    if (fmt == FT_BF16) {
        const uint4* v = (const uint4*)(vrow + (u64)b * 32);
        uint4 a = v[0], c = v[1];
        u32 w[8] = {a.x, a.y, a.z, a.w, c.x, c.y, c.z, c.w};
#pragma unroll
        for (int k = 0; k < 8; k++) {
            p = fmaf(__int_as_float(w[k] << 16), xb[2 * k], p);
            p = fmaf(__int_as_float(w[k] & 0xFFFF0000u), xb[2 * k + 1], p);
        }
        return p;
    }
    u32 W[8];
    load_w8(fmt, vrow, b, W);
    int nd = G / 4;
#pragma unroll
    for (int d = 0; d < 8; d++) {
        if (d < nd) {
            p = fmaf(i8_at(W[d], 0), xb[4 * d], p);
            p = fmaf(i8_at(W[d], 1), xb[4 * d + 1], p);
            p = fmaf(i8_at(W[d], 2), xb[4 * d + 2], p);
            p = fmaf(i8_at(W[d], 3), xb[4 * d + 3], p);
        }
    }
    return p;
}

// int8-path exact integer dot of a block with G quantized activations (16-byte aligned).
__device__ __forceinline__ int block_dot_i8(const u32 W[8], int G, const i8* qb) {
    const int4* a = (const int4*)qb;
    int4 a0 = a[0];
    int d = __dp4a((int)W[0], a0.x, 0);
    d = __dp4a((int)W[1], a0.y, d);
    d = __dp4a((int)W[2], a0.z, d);
    d = __dp4a((int)W[3], a0.w, d);
    if (G == 32) {
        int4 a1 = a[1];
        d = __dp4a((int)W[4], a1.x, d);
        d = __dp4a((int)W[5], a1.y, d);
        d = __dp4a((int)W[6], a1.z, d);
        d = __dp4a((int)W[7], a1.w, d);
    }
    return d;
}

// The same dot with the block's activations already in registers (a[1] unused when G = 16).
__device__ __forceinline__ int block_dot_i8_regs(const u32 W[8], int G, const int4 a[2]) {
    int d = __dp4a((int)W[0], a[0].x, 0);
    d = __dp4a((int)W[1], a[0].y, d);
    d = __dp4a((int)W[2], a[0].z, d);
    d = __dp4a((int)W[3], a[0].w, d);
    if (G == 32) {
        d = __dp4a((int)W[4], a[1].x, d);
        d = __dp4a((int)W[5], a[1].y, d);
        d = __dp4a((int)W[6], a[1].z, d);
        d = __dp4a((int)W[7], a[1].w, d);
    }
    return d;
}

// The spec's fixed reduction of the 16 accumulators held by the 16 lanes of a half-warp;
// the result is valid in lane 0 of the half-warp. All 32 lanes must call it.
__device__ __forceinline__ float reduce16(float acc) {
    acc = __fadd_rn(acc, __shfl_down_sync(0xffffffffu, acc, 8, 16));
    acc = __fadd_rn(acc, __shfl_down_sync(0xffffffffu, acc, 4, 16));
    acc = __fadd_rn(acc, __shfl_down_sync(0xffffffffu, acc, 2, 16));
    acc = __fadd_rn(acc, __shfl_down_sync(0xffffffffu, acc, 1, 16));
    return acc;
}

// exp as the spec defines it (Cephes expf in plain f32 operations). The constants are the
// exact f32 bit patterns of ft-kernels' `w4a8::exp_ft` (its code is the definition; note
// that its P1 literal 1.3982e-3 rounds to 0x3ab743cf, one ulp above Cephes' 1.3981999507e-3).
__device__ __forceinline__ float exp_ft(float v) {
    const float LOG2E = __int_as_float(0x3fb8aa3b);
    const float C1 = __int_as_float(0x3f318000);   // 0.693359375
    const float C2 = __int_as_float(0xb95e8083);   // -2.1219444e-4
    v = fminf(fmaxf(v, -87.0f), 88.0f);
    float n = floorf(__fadd_rn(__fmul_rn(v, LOG2E), 0.5f));
    float r = __fsub_rn(__fsub_rn(v, __fmul_rn(n, C1)), __fmul_rn(n, C2));
    float p = __int_as_float(0x39506967);                          // P0 1.9875691e-4
    p = __fadd_rn(__fmul_rn(p, r), __int_as_float(0x3ab743cf));    // P1 1.3982e-3
    p = __fadd_rn(__fmul_rn(p, r), __int_as_float(0x3c088908));    // P2 8.333452e-3
    p = __fadd_rn(__fmul_rn(p, r), __int_as_float(0x3d2aa9c1));    // P3 4.1665796e-2
    p = __fadd_rn(__fmul_rn(p, r), __int_as_float(0x3e2aaaaa));    // P4 1.6666665e-1
    p = __fadd_rn(__fmul_rn(p, r), __int_as_float(0x3f000000));    // P5 5.0000001e-1
    float e = __fadd_rn(__fadd_rn(__fmul_rn(p, __fmul_rn(r, r)), r), 1.0f);
    return __fmul_rn(e, __int_as_float(((int)n + 127) << 23));
}

__device__ __forceinline__ float silu_ft(float v) {
    return __fdiv_rn(v, __fadd_rn(1.0f, exp_ft(-v)));
}

// Quantize one block of G activations (spec section 2) into q[0..G), returning the scale.
// GT is the block size (16 or 32) as a constant, so the loads are vectorized and the loops
// unrolled; the arithmetic per element is the same for every GT (max is order-free).
template <int GT>
__device__ __forceinline__ float quantize_block_t(const float* xb, i8* q) {
    float v[GT];
#pragma unroll
    for (int k = 0; k < GT / 4; k++) {
        float4 f = ((const float4*)xb)[k];
        v[4 * k] = f.x; v[4 * k + 1] = f.y; v[4 * k + 2] = f.z; v[4 * k + 3] = f.w;
    }
    float a = 0.0f;
#pragma unroll
    for (int i = 0; i < GT; i++) a = fmaxf(a, fabsf(v[i]));
    u32 packed[GT / 4];
    if (a == 0.0f) {
#pragma unroll
        for (int k = 0; k < GT / 4; k++) packed[k] = 0;
    } else {
        float inv = __fdiv_rn(127.0f, a);
#pragma unroll
        for (int k = 0; k < GT / 4; k++) {
            u32 w = 0;
#pragma unroll
            for (int j = 0; j < 4; j++) {
                float r = roundf(__fmul_rn(v[4 * k + j], inv));
                int c = (int)fminf(fmaxf(r, -127.0f), 127.0f);
                w |= ((u32)c & 0xFFu) << (8 * j);
            }
            packed[k] = w;
        }
    }
#pragma unroll
    for (int k = 0; k < GT / 4; k++) ((u32*)q)[k] = packed[k];
    return a == 0.0f ? 0.0f : __fdiv_rn(a, 127.0f);
}

// The same for a block size known only at run time (16 or 32); xb and q 16-byte aligned.
__device__ __forceinline__ float quantize_block(const float* xb, int G, i8* q) {
    return G == 16 ? quantize_block_t<16>(xb, q) : quantize_block_t<32>(xb, q);
}

// MT: tokens per pass held in registers (8, or 1 for the batch-1 variant, which keeps few
// registers and unrolls its block loop instead). The arithmetic is the same for both.
//
// stage_off: 0 reads the block's rows of gate and up from global memory as it computes;
// otherwise the block first starts copying its whole tile of both (G rows each, about 46 KB
// for a 2.77 MB nvfp4 expert) into dynamic shared memory at that byte offset, quantizes its
// activations while the copies fly, and computes from shared memory: every weight byte of
// the block is requested at once instead of a few loads per lane at a time, which is what a
// one-token layer (one wave of short blocks) needs to approach the HBM rate. STAGED is
// stage_off != 0 as a compile-time constant (the kernels branch once, at entry): the tiles'
// pointers then come from shared memory alone and the compiler reads them with shared loads
// (LDS) instead of generic ones, with 32-bit addressing.
//
// WIDE (the small-grid one-token kernel, 512 threads): each half-warp computes one dot, gate
// or up of one row (dot d = hw, hw + 32, ... below 2 G: gate of row d for d < G, up of row
// d - G after), instead of both of a row; the block's rows then join in shared memory. A
// launch with fewer blocks than multiprocessors runs each block alone on its
// multiprocessor, where a warp's chain of dependent loads and dots is the block's time:
// twice the warps with half the chain each. The same operations per dot, so the same bits.
//
// (bx, by): the block's row block of h and its task (blockIdx).
template <int MT, bool STAGED, bool WIDE = false>
__device__ __forceinline__ void gate_up_impl(
    const Task* __restrict__ tasks, const Pair* __restrict__ pairs, int fmt_arg, int act_arg,
    int H, int I, const float* __restrict__ x, int tch,
    float* __restrict__ hf, i8* __restrict__ hq, float* __restrict__ hs, u32 stage_off,
    int bx, int by)
{
    constexpr int UNROLL = MT == 1 ? 4 : (MT == 2 ? 2 : 1);
    const int fmt = FMT_OF(fmt_arg), act = ACT_OF(act_arg);
    extern __shared__ __align__(16) u8 smem[];
    __shared__ __align__(16) float hbuf[MAXT][32];
    const int G = group_of(fmt);
    const Task task = tasks[by];
    if (task.pair_count == 0) return;
    const int r0 = bx * G;
    const int lane = threadIdx.x & (HW - 1);
    const int hw = threadIdx.x / HW;
    const int nhw = blockDim.x / HW;
    const int nb = H / G;
    const Mat gate = {(const u8*)task.weights, (u64)I, (u64)H};
    const Mat up = {(const u8*)task.weights + matrix_bytes(fmt, I, H), (u64)I, (u64)H};
    const u64 vrb = values_row_bytes(fmt, H);
    // Read after the barrier below (the split-sign dot's table alone).
    if (split_sign(MT, fmt)) e2m1_table_publish();
    Tile tg, tu;
    if (STAGED) {
        tg = stage_tile(fmt, gate, r0, G, smem + stage_off);
        tu = stage_tile(fmt, up, r0, G, smem + stage_off + staged_tile_bytes(fmt, H, G));
    } else {
        tg = tile_at(fmt, gate, r0);
        tu = tile_at(fmt, up, r0);
    }
    // The down kernel may be scheduled now: it stages its own weights while this one runs.
    pdl_launch_dependents();
    // Shared activations of the pass: int8 codes [tch][H] then scales [tch][nb]; or f32 [tch][H].
    i8* sq = (i8*)smem;
    float* ss = (float*)(smem + (u64)tch * H);
    float* sx = (float*)smem;

    for (u32 c0 = 0; c0 < task.pair_count; c0 += tch) {
        const int nt = min((u32)tch, task.pair_count - c0);
        if (act == ACT_INT8) {
            for (int job = threadIdx.x; job < nt * nb; job += blockDim.x) {
                int t = job / nb, b = job % nb;
                u32 tok = pairs[task.pair_begin + c0 + t].index;
                ss[t * nb + b] = quantize_block(x + (u64)tok * H + (u64)b * G, G, sq + (u64)t * H + (u64)b * G);
            }
        } else {
            for (int job = threadIdx.x; job < nt * (H / 4); job += blockDim.x) {
                int t = job / (H / 4), k = job % (H / 4);
                u32 tok = pairs[task.pair_begin + c0 + t].index;
                ((float4*)(sx + (u64)t * H))[k] = ((const float4*)(x + (u64)tok * H))[k];
            }
        }
        stage_wait();
        __syncthreads();
        stamp(2);
        const u32 e2m1_lo = split_sign(MT, fmt) ? e2m1_table_read() : 0u;
        if constexpr (WIDE) {
            static_assert(MT == 1, "the wide kernel is the one-token variant");
            // The rows' gate and up values, in rows of hbuf that one token leaves unused (no
            // more static shared memory than the other kernels: the runtime's
            // KERNEL_STATIC_SHARED_BYTES).
            float* gsh = hbuf[1];
            float* ush = hbuf[2];
            // 2 G is a multiple of the 32 half-warps (G is 16 or 32), so both half-warps of
            // a warp make the same number of passes and reach reduce16 together.
            for (int d = hw; d < 2 * G; d += nhw) {
                const int rr = d % G;
                const bool is_up = d >= G;
                // Field by field, so the selection stays in registers.
                const Tile tm = {is_up ? tu.vals : tg.vals, is_up ? tu.scales : tg.scales,
                                 is_up ? tu.factors : tg.factors};
                const u8* mrow = tm.vals + (u64)rr * vrb;
                float acc = 0.0f;
#pragma unroll 4
                for (int b = lane; b < nb; b += HW) {
                    // Token 0 of the pass (nt = 1): the arithmetic of the loop below.
                    const float sm = block_scale(fmt, tm, H, rr, b);
                    if (act == ACT_INT8 && split_sign(MT, fmt)) {
                        const int4* qa = (const int4*)(sq + (u64)b * G);
                        const int4 a0 = qa[0], a1 = G == 32 ? qa[1] : make_int4(0, 0, 0, 0);
                        const int dm = e2m1_block_dot(mrow, b, G, a0, a1, e2m1_lo);
                        acc = __fadd_rn(acc, __fmul_rn((float)dm, __fmul_rn(sm, ss[b])));
                    } else if (act == ACT_INT8) {
                        u32 W[8];
                        load_w8(fmt, mrow, b, W);
                        const int dm = block_dot_i8(W, G, sq + (u64)b * G);
                        acc = __fadd_rn(acc, __fmul_rn((float)dm, __fmul_rn(sm, ss[b])));
                    } else {
                        acc = fmaf(block_dot_f32(fmt, mrow, b, G, sx + (u64)b * G), sm, acc);
                    }
                }
                const float v = __fmul_rn(reduce16(acc), row_factor(fmt, tm, rr));
                if (lane == 0) (is_up ? ush : gsh)[rr] = v;
            }
            __syncthreads();
            for (int rr = threadIdx.x; rr < G; rr += blockDim.x)
                hbuf[0][rr] = __fmul_rn(silu_ft(gsh[rr]), ush[rr]);
        } else
        for (int rr = hw; rr < G; rr += nhw) {
            float ga[MT], ua[MT];
#pragma unroll
            for (int t = 0; t < MT; t++) { ga[t] = 0.0f; ua[t] = 0.0f; }
            const u8* grow = tg.vals + (u64)rr * vrb;
            const u8* urow = tu.vals + (u64)rr * vrb;
            // Unrolled (one-token variant) so that several blocks' loads are in flight per lane.
#pragma unroll UNROLL
            for (int b = lane; b < nb; b += HW) {
                if (act == ACT_INT8 && split_sign(MT, fmt)) {
                    // One token (t = 0 < nt): the loop below's arithmetic, split-sign dots.
                    const int4* qa = (const int4*)(sq + (u64)b * G);
                    const int4 a0 = qa[0], a1 = G == 32 ? qa[1] : make_int4(0, 0, 0, 0);
                    const float sg = block_scale(fmt, tg, H, rr, b);
                    const float su = block_scale(fmt, tu, H, rr, b);
                    const float sc = ss[b];
                    const int dg = e2m1_block_dot(grow, b, G, a0, a1, e2m1_lo);
                    const int du = e2m1_block_dot(urow, b, G, a0, a1, e2m1_lo);
                    ga[0] = __fadd_rn(ga[0], __fmul_rn((float)dg, __fmul_rn(sg, sc)));
                    ua[0] = __fadd_rn(ua[0], __fmul_rn((float)du, __fmul_rn(su, sc)));
                } else if (act == ACT_INT8) {
                    u32 Wg[8], Wu[8];
                    load_w8(fmt, grow, b, Wg);
                    load_w8(fmt, urow, b, Wu);
                    float sg = block_scale(fmt, tg, H, rr, b);
                    float su = block_scale(fmt, tu, H, rr, b);
#pragma unroll
                    for (int t = 0; t < MT; t++) {
                        if (t < nt) {
                            const i8* qb = sq + (u64)t * H + (u64)b * G;
                            float sc = ss[t * nb + b];
                            int dg = block_dot_i8(Wg, G, qb);
                            int du = block_dot_i8(Wu, G, qb);
                            ga[t] = __fadd_rn(ga[t], __fmul_rn((float)dg, __fmul_rn(sg, sc)));
                            ua[t] = __fadd_rn(ua[t], __fmul_rn((float)du, __fmul_rn(su, sc)));
                        }
                    }
                } else {
                    float sg = block_scale(fmt, tg, H, rr, b);
                    float su = block_scale(fmt, tu, H, rr, b);
#pragma unroll
                    for (int t = 0; t < MT; t++) {
                        if (t < nt) {
                            const float* xb = sx + (u64)t * H + (u64)b * G;
                            ga[t] = fmaf(block_dot_f32(fmt, grow, b, G, xb), sg, ga[t]);
                            ua[t] = fmaf(block_dot_f32(fmt, urow, b, G, xb), su, ua[t]);
                        }
                    }
                }
            }
            const float fg = row_factor(fmt, tg, rr);
            const float fu = row_factor(fmt, tu, rr);
#pragma unroll
            for (int t = 0; t < MT; t++) {
                float g = __fmul_rn(reduce16(ga[t]), fg);
                float u = __fmul_rn(reduce16(ua[t]), fu);
                if (lane == 0 && t < nt) hbuf[t][rr] = __fmul_rn(silu_ft(g), u);
            }
        }
        __syncthreads();
        if (act == ACT_INT8) {
            // Quantize this block of h per token (the down matrix's activation block r0 / G).
            for (int t = threadIdx.x; t < nt; t += blockDim.x) {
                u32 p = task.pair_begin + c0 + t;
                hs[(u64)p * (I / G) + bx] = quantize_block(&hbuf[t][0], G, hq + (u64)p * I + r0);
            }
        } else {
            for (int k = threadIdx.x; k < nt * G; k += blockDim.x) {
                int t = k / G, rr = k % G;
                u32 p = task.pair_begin + c0 + t;
                hf[(u64)p * I + r0 + rr] = hbuf[t][rr];
            }
        }
        __syncthreads();
    }
}

// The value and scale offsets in a tile of rows r0 + step k (k < R) of an e2m1 matrix of I
// columns, for e2m1_rows_dot. A dead row (live[k] false: past the matrix's end) gets row
// r0's, which must be live; its sum is never written, so the live rows get the same bits as
// with a branch per row.
template <int R>
__device__ __forceinline__ void e2m1_row_offsets(int fmt, u64 vrb, int I, int r0, int step, const bool (&live)[R],
                                                 u32 (&voff)[R], u32 (&soff)[R]) {
#pragma unroll
    for (int k = 0; k < R; k++) {
        const u32 rk = live[k] ? r0 + step * k : r0;
        voff[k] = rk * (u32)vrb;
        soff[k] = rk * (u32)scale_row_bytes(fmt, I);
    }
}

// The one-token split-sign loop of the down kernel (down_impl): R rows of a tile (offsets
// from e2m1_row_offsets) against one token's int8 h (codes at ha, block scales at hsa), the
// lane's blocks lane, lane + HW, ... in order, acc[k] += f32(d) * (s_b * scale_b) as the int8
// path does, with no address arithmetic and no branch per row.
template <int R, int UNROLL>
__device__ __forceinline__ void e2m1_rows_dot(int fmt, const Tile& td, const u32 (&voff)[R], const u32 (&soff)[R],
                                              const i8* ha, const float* hsa, int nb, int G, int lane, u32 lo,
                                              float (&acc)[R]) {
#pragma unroll UNROLL
    for (int b = lane; b < nb; b += HW) {
        const int4* a = (const int4*)(ha + (u64)b * G);
        const int4 q0 = a[0];
        const int4 q1 = G == 32 ? a[1] : make_int4(0, 0, 0, 0);
        const float sa = hsa[b];
#pragma unroll
        for (int k = 0; k < R; k++) {
            const float sb = e2m1_block_scale(fmt, td.scales + soff[k], b);
            const int d = e2m1_block_dot(td.vals + voff[k], b, G, q0, q1, lo);
            acc[k] = __fadd_rn(acc[k], __fmul_rn((float)d, __fmul_rn(sb, sa)));
        }
    }
}

// MT: tokens per pass, as in gate_up_impl. R: rows of down per half-warp, interleaved
// (row hw + 16 k of the block's tile, k < R) and loaded together, so that a one-token lane
// has R rows' blocks in flight instead of one; the block's tile is 16 R rows. Each row's
// arithmetic is the same whichever half-warp runs it. (bx, by): the row tile and the task;
// n_tasks: the launch's tasks (the row tile's last block combines it).
//
// STAGED: the block's rows of down are staged in shared memory first (the launch's `stage`
// argument, a compile-time constant here as in gate_up_impl: the tile's pointers then come
// from shared memory alone, so the compiler reads them with shared loads and 32-bit
// addresses instead of generic loads and 64-bit arithmetic).
template <int MT, int R, bool STAGED>
__device__ __forceinline__ void down_impl(
    const Task* __restrict__ tasks, const Pair* __restrict__ pairs,
    const u32* __restrict__ tok_begin, const Pair* __restrict__ tok_pairs,
    int fmt_arg, int act_arg, int H, int I, int T,
    float* O, const float* __restrict__ hf, const i8* __restrict__ hq, const float* __restrict__ hs,
    u32* counters, float* y, const FoldCombine& fold,
    int bx, int by, int n_tasks)
{
    constexpr int UNROLL = MT == 1 ? (R >= 4 ? 2 : 4) : (MT == 2 ? 2 : 1);
    constexpr int ROWS = (256 / HW) * R;   // the block's row tile (blockDim.x is 256)
    const int fmt = FMT_OF(fmt_arg), act = ACT_OF(act_arg);
    extern __shared__ __align__(16) u8 smem[];
    __shared__ u32 ticket;
    const int G = group_of(fmt);
    const Task task = tasks[by];
    const int lane = threadIdx.x & (HW - 1);
    const int hw = threadIdx.x / HW;
    const int j0 = bx * ROWS;
    const int nb = I / G;
    const Mat down = {(const u8*)task.weights + 2 * matrix_bytes(fmt, I, H), (u64)H, (u64)I};
    const u64 vrb = values_row_bytes(fmt, I);
    // Read after the barrier below (the split-sign dot's table alone).
    if (split_sign(MT, fmt)) e2m1_table_publish();
    // STAGED: the block's rows of down are copied into dynamic shared memory first (as
    // gate_up_impl's stage_off), before waiting for the gate/up kernel, so that with a
    // programmatic dependent launch the weights stream in while gate/up still runs. A block
    // of an empty task stages nothing and reads no row.
    Tile td;
    if (STAGED) {
        const u64 n = (u64)min(ROWS, H - j0);
        td = tile_in(fmt, I, n, smem);
        if (task.pair_count > 0) stage_tile(fmt, down, j0, n, smem);
    } else {
        td = tile_at(fmt, down, j0);
    }
    // The gate/up kernel's h (and nothing it writes is read before this).
    pdl_wait();
    stamp(1);
    stage_wait();
    __syncthreads();
    stamp(2);
    const u32 e2m1_lo = split_sign(MT, fmt) ? e2m1_table_read() : 0u;
    // Row j0 + hw + 16 k exists for every hw of the block or for none (H % 32 == 0 and
    // j0 + 16 k is a multiple of 16), so `live[k]` is uniform and every lane reaches the
    // shuffles of reduce16.
    bool live[R];
    float f[R];
#pragma unroll
    for (int k = 0; k < R; k++) {
        live[k] = j0 + 16 * k < H;
        f[k] = live[k] && task.pair_count > 0 ? row_factor(fmt, td, hw + 16 * k) : 0.0f;
    }
    // The split-sign loop's rows (row hw, the half-warp's first, is live whenever the block is).
    u32 voff[R], soff[R];
    e2m1_row_offsets<R>(fmt, vrb, I, hw, 16, live, voff, soff);
    for (u32 c0 = 0; c0 < task.pair_count; c0 += MT) {
        const int nt = min((u32)MT, task.pair_count - c0);
        const u32 p0 = task.pair_begin + c0;
        float acc[R][MT];
#pragma unroll
        for (int k = 0; k < R; k++)
#pragma unroll
            for (int t = 0; t < MT; t++) acc[k][t] = 0.0f;
        // Unrolled (few-token variants) so that several blocks' loads are in flight per lane.
        // The split-sign dot (one token, int8, e2m1 formats) has its own loop (e2m1_rows_dot;
        // at sm_90, 289 instructions per two blocks of four rows where this shared loop took
        // 373), the same arithmetic as the int8 branch below for t = 0.
        if (act == ACT_INT8 && split_sign(MT, fmt)) {
            float a1[R];
#pragma unroll
            for (int k = 0; k < R; k++) a1[k] = 0.0f;
            e2m1_rows_dot<R, UNROLL>(fmt, td, voff, soff, hq + (u64)p0 * I, hs + (u64)p0 * nb, nb, G, lane,
                                     e2m1_lo, a1);
#pragma unroll
            for (int k = 0; k < R; k++) acc[k][0] = a1[k];
        } else
#pragma unroll UNROLL
        for (int b = lane; b < nb; b += HW) {
            if (act == ACT_INT8 && R > 1) {
                // The block's activations of each token (codes and scale), loaded once for
                // the R rows that use them (the few-token variants; with one row per
                // half-warp there is nothing to share and the registers are better left).
                int4 qa[MT][2];
                float sa[MT];
#pragma unroll
                for (int t = 0; t < MT; t++) {
                    if (t < nt) {
                        const u64 p = p0 + t;
                        const int4* a = (const int4*)(hq + p * I + (u64)b * G);
                        qa[t][0] = a[0];
                        qa[t][1] = G == 32 ? a[1] : make_int4(0, 0, 0, 0);
                        sa[t] = hs[p * nb + b];
                    }
                }
#pragma unroll
                for (int k = 0; k < R; k++) {
                    if (!live[k]) continue;
                    const u8* row = td.vals + (u64)(hw + 16 * k) * vrb;
                    const float sb = block_scale(fmt, td, I, hw + 16 * k, b);
                    u32 W[8];
                    load_w8(fmt, row, b, W);
#pragma unroll
                    for (int t = 0; t < MT; t++) {
                        if (t < nt) {
                            int d = block_dot_i8_regs(W, G, qa[t]);
                            float s = __fmul_rn(sb, sa[t]);
                            acc[k][t] = __fadd_rn(acc[k][t], __fmul_rn((float)d, s));
                        }
                    }
                }
            } else if (act == ACT_INT8) {
#pragma unroll
                for (int k = 0; k < R; k++) {
                    if (!live[k]) continue;
                    const u8* row = td.vals + (u64)(hw + 16 * k) * vrb;
                    const float sb = block_scale(fmt, td, I, hw + 16 * k, b);
                    u32 W[8];
                    load_w8(fmt, row, b, W);
#pragma unroll
                    for (int t = 0; t < MT; t++) {
                        if (t < nt) {
                            const u64 p = p0 + t;
                            int d = block_dot_i8(W, G, hq + p * I + (u64)b * G);
                            float s = __fmul_rn(sb, hs[p * nb + b]);
                            acc[k][t] = __fadd_rn(acc[k][t], __fmul_rn((float)d, s));
                        }
                    }
                }
            } else {
#pragma unroll
                for (int k = 0; k < R; k++) {
                    if (!live[k]) continue;
                    const u8* row = td.vals + (u64)(hw + 16 * k) * vrb;
                    const float sb = block_scale(fmt, td, I, hw + 16 * k, b);
#pragma unroll
                    for (int t = 0; t < MT; t++) {
                        if (t < nt) {
                            const u64 p = p0 + t;
                            acc[k][t] = fmaf(block_dot_f32(fmt, row, b, G, hf + p * I + (u64)b * G), sb, acc[k][t]);
                        }
                    }
                }
            }
        }
#pragma unroll
        for (int k = 0; k < R; k++) {
            if (!live[k]) continue;
#pragma unroll
            for (int t = 0; t < MT; t++) {
                float o = __fmul_rn(reduce16(acc[k][t]), f[k]);
                if (lane == 0 && t < nt) O[(u64)(p0 + t) * H + j0 + hw + 16 * k] = o;
            }
        }
    }
    // Take a ticket that releases this block's O (the barrier first: every thread's writes)
    // and acquires the earlier blocks'; the last block of the row tile combines the tile,
    // its reads ordered after the acquire by the second barrier.
    stamp(3);
    __syncthreads();
    if (threadIdx.x == 0) ticket = atom_add_acq_rel_gpu(&counters[bx], 1u);
    __syncthreads();
    if (ticket != (u32)n_tasks - 1) return;
    for (int idx = threadIdx.x; idx < T * ROWS; idx += blockDim.x) {
        const int t = idx / ROWS;
        const int j = j0 + idx % ROWS;
        if (j >= H) continue;
        // The token's pairs in task order, COMBINE_UNROLL loads in flight before their sum
        // (the same additions in the same order as one pair at a time).
        float acc = 0.0f;
        const u32 k1 = tok_begin[t + 1];
        for (u32 k0 = tok_begin[t]; k0 < k1; k0 += COMBINE_UNROLL) {
            float o[COMBINE_UNROLL], w[COMBINE_UNROLL];
#pragma unroll
            for (int u = 0; u < COMBINE_UNROLL; u++) {
                if (k0 + u < k1) {
                    const Pair tp = tok_pairs[k0 + u];
                    o[u] = __ldcg(&O[(u64)tp.index * H + j]);
                    w[u] = tp.weight;
                }
            }
#pragma unroll
            for (int u = 0; u < COMBINE_UNROLL; u++)
                if (k0 + u < k1) acc = __fadd_rn(acc, __fmul_rn(w[u], o[u]));
        }
        y[(u64)t * H + j] = acc;
    }
    if (fold.act) {
        // Every row of the tile's columns is in y now (this block's writes, visible to it
        // after the barrier), and every other part was written by an earlier launch.
        __syncthreads();
        fold_combine_tile(fold, H, j0, ROWS);
    }
    if (threadIdx.x == 0) counters[bx] = 0;
}

// Entry points. The launch's tables (tasks, then pairs at byte o_pairs, token starts at
// o_begin, token pairs at o_tok) come in `tab` or, when too large for it, staged (common.cuh).
// gate, gate_value: the launch's start condition (the runtime's `FlagGate`; gate 0: none):
// every block waits at its start until the u32 at gate has reached gate_value (gate_wait).
#define TABLE_ARGS const __grid_constant__ ParamTable tab, u64 staged, u32 o_pairs, u32 o_begin, u32 o_tok, \
    const u32* gate, u32 gate_value
#define TASK_LIST \
    stamp_begin(); \
    gate_wait(gate, gate_value); \
    stamp(1); \
    const u8* tb = table_base(tab, staged); \
    const Task* tasks = (const Task*)tb;
#define TOKEN_LISTS \
    const u32* tok_begin = (const u32*)(tb + o_begin); \
    const Pair* tok_pairs = (const Pair*)(tb + o_tok);
#define TASK_TABLES TASK_LIST \
    const Pair* pairs = (const Pair*)(tb + o_pairs);
#define TABLES TASK_TABLES TOKEN_LISTS
#define GATE_UP_ARGS \
    TABLE_ARGS, int fmt, int act, int H, int I, const float* __restrict__ x, int tch, \
    float* __restrict__ hf, i8* __restrict__ hq, float* __restrict__ hs, u32 stage_off
// Whether a launch stages its row tiles is its choice of entry point (ft_experts_down_*
// staged, ft_experts_down_*_direct not), so each kernel holds one instantiation and the
// registers it needs (one kernel holding both spilled in some formats).
#define DOWN_ARGS \
    TABLE_ARGS, int fmt, int act, int H, int I, int T, \
    float* O, const float* __restrict__ hf, const i8* __restrict__ hq, const float* __restrict__ hs, \
    u32* counters, float* y, const FoldCombine fold
// A gate/up entry point: gate_up_impl<MT, staged, WIDE> with TCH tokens per pass, staged or
// not as the launch's stage_off says.
#define GATE_UP_ENTRY(MT, WIDE, TCH) \
    TASK_TABLES (void)o_begin; (void)o_tok; \
    if (stage_off) gate_up_impl<MT, true, WIDE>(tasks, pairs, fmt, act, H, I, x, TCH, hf, hq, hs, stage_off, blockIdx.x, blockIdx.y); \
    else gate_up_impl<MT, false, WIDE>(tasks, pairs, fmt, act, H, I, x, TCH, hf, hq, hs, stage_off, blockIdx.x, blockIdx.y); \
    stamp_end(STAMP_GATE_UP, blockIdx.x, blockIdx.y);
// A down entry point: down_impl<MT, R, STAGED>.
#define DOWN_ENTRY(MT, R, STAGED) \
    TABLES \
    down_impl<MT, R, STAGED>(tasks, pairs, tok_begin, tok_pairs, fmt, act, H, I, T, O, hf, hq, hs, counters, y, \
                             fold, blockIdx.x, blockIdx.y, gridDim.y); \
    stamp_end(STAMP_DOWN, blockIdx.x, blockIdx.y);

// One instantiation per largest task size (tokens routed to one expert): 1, 2, 4 and 8
// tokens per pass. Fewer register accumulators leave room for more blocks per SM and more
// loads in flight, which is what a memory-bound decode step needs.
extern "C" __global__ void __launch_bounds__(256, 2) ft_experts_gate_up(GATE_UP_ARGS) { GATE_UP_ENTRY(MAXT, false, tch) }
extern "C" __global__ void __launch_bounds__(256, 4) ft_experts_gate_up_1(GATE_UP_ARGS) { GATE_UP_ENTRY(1, false, 1) }
// The small-grid one-token kernel (WIDE above), 512 threads.
extern "C" __global__ void __launch_bounds__(512, 2) ft_experts_gate_up_1w(GATE_UP_ARGS) { GATE_UP_ENTRY(1, true, 1) }
extern "C" __global__ void __launch_bounds__(256, 3) ft_experts_gate_up_2(GATE_UP_ARGS) { GATE_UP_ENTRY(2, false, min(tch, 2)) }
extern "C" __global__ void __launch_bounds__(256, 2) ft_experts_gate_up_4(GATE_UP_ARGS) { GATE_UP_ENTRY(4, false, min(tch, 4)) }
extern "C" __global__ void __launch_bounds__(256, 2) ft_experts_down(DOWN_ARGS) { DOWN_ENTRY(MAXT, DOWN_R_8, true) }
extern "C" __global__ void __launch_bounds__(256, 2) ft_experts_down_direct(DOWN_ARGS) { DOWN_ENTRY(MAXT, DOWN_R_8, false) }
extern "C" __global__ void __launch_bounds__(256, 4) ft_experts_down_1(DOWN_ARGS) { DOWN_ENTRY(1, DOWN_R_1, true) }
extern "C" __global__ void __launch_bounds__(256, 4) ft_experts_down_1_direct(DOWN_ARGS) { DOWN_ENTRY(1, DOWN_R_1, false) }
// The small-grid one-token down kernel: DOWN_R_1S rows per half-warp, so a launch of few
// experts spreads its rows over more blocks (more multiprocessors) than ft_experts_down_1.
extern "C" __global__ void __launch_bounds__(256, 4) ft_experts_down_1s(DOWN_ARGS) { DOWN_ENTRY(1, DOWN_R_1S, true) }
extern "C" __global__ void __launch_bounds__(256, 4) ft_experts_down_1s_direct(DOWN_ARGS) { DOWN_ENTRY(1, DOWN_R_1S, false) }
extern "C" __global__ void __launch_bounds__(256, 4) ft_experts_down_2(DOWN_ARGS) { DOWN_ENTRY(2, DOWN_R_2, true) }
extern "C" __global__ void __launch_bounds__(256, 4) ft_experts_down_2_direct(DOWN_ARGS) { DOWN_ENTRY(2, DOWN_R_2, false) }
extern "C" __global__ void __launch_bounds__(256, 2) ft_experts_down_4(DOWN_ARGS) { DOWN_ENTRY(4, DOWN_R_4, true) }
extern "C" __global__ void __launch_bounds__(256, 2) ft_experts_down_4_direct(DOWN_ARGS) { DOWN_ENTRY(4, DOWN_R_4, false) }
