//! AVX2 and AVX-512 row kernels, chosen at run time (never `target-cpu=native`).
//!
//! **int8 path.** Per group of 16 blocks, a row's packed weights are unpacked into the
//! canonical order of [`crate::w4a8::canonical_element`]: dword lane `l` of every weight
//! register holds 4 weights of block `16 g + l`, so one `vpdpbusd` chain (or
//! `vpmaddubsw` + `vpmaddwd` without VNNI) leaves each block's full integer dot product in its
//! own lane, and the spec's per-block f32 steps and `acc[b % 16]` accumulation are one vector
//! op each, lane for lane the scalar definition: results are bit-identical (tested).
//! - nvfp4: two 64-byte loads, two `vpermt2d` (even/odd dwords: dword `d` of each block),
//!   nibble split, `vpshufb` lookup of `2 * e2m1 + 12`.
//! - mxfp4: four loads and a 4x4 dword transpose (`vpermt2d`, `vshufi32x4`), same lookup.
//! - At the VNNI level with AVX-512 VBMI, the nibble lookup is one `vpermb` per plane (no
//!   masking); the AVX-512 (non-VNNI) level keeps `vpshufb`, so on a VBMI machine the tests
//!   cover both lookups.
//! - q4_0, int8: dword gathers (blocks are 18 bytes, resp. 8 dwords, apart).
//!
//! Weights are unsigned (`+ offset`) for `u8 x i8` products; `offset * sum(q)` is subtracted
//! per block. int8 weights without VNNI use `|w|` and `sign(w) * q` instead (no saturation).
//! AVX2 runs the same arithmetic on two 8-lane halves, with gathers for every format.
//!
//! **f32 path.** Each row is dequantized into an L1-resident f32 buffer (AVX-512: nibble
//! expand + `vpermps` lookup; AVX2: the scalar decoder), then one FMA dot product per token.
#![cfg(target_arch = "x86_64")]

use std::arch::x86_64::*;
use std::cell::RefCell;
use std::ops::Range;

use ft_model::ExpertFormat;
use half::f16;

use crate::codec::{decode_row, e4m3_to_f32, e8m0_to_f32, MatrixLayout, E2M1_VALUES};
use crate::simd::SimdLevel;
use crate::w4a8::QuantAct;

const F_NV: u8 = 0;
const F_MX: u8 = 1;
const F_Q4: u8 = 2;
const F_I8: u8 = 3;

/// `2 * e2m1 + 12` per nibble: the unsigned integer weights of nvfp4 and mxfp4.
const E2M1_U8_LUT: [i8; 16] = [12, 13, 14, 15, 16, 18, 20, 24, 12, 11, 10, 9, 8, 6, 4, 0];

/// Tokens per register block of the AVX-512 int8 kernel (8 accumulators + 8 weight registers).
const TOKENS_512: usize = 8;
/// Tokens per register block of the AVX2 int8 kernel (16 ymm registers only).
const TOKENS_256: usize = 4;

/// Software prefetch distance of the AVX-512 int8 kernel, bytes ahead in a row's values
/// (two rows of a 2560-column nvfp4 matrix): covers the latency of DRAM at the start of
/// every 4 KiB page, where the hardware streamer has to ramp up again.
const PREFETCH_AHEAD_BYTES: usize = 2560;

thread_local! {
    static F32_ROW: RefCell<Vec<f32>> = const { RefCell::new(Vec::new()) };
}

fn format_id(f: ExpertFormat) -> u8 {
    match f {
        ExpertFormat::Nvfp4 => F_NV,
        ExpertFormat::Mxfp4 => F_MX,
        ExpertFormat::Q4_0 => F_Q4,
        ExpertFormat::Int8 => F_I8,
        ExpertFormat::Bf16 => panic!("bf16 has no int8 path"),
        ExpertFormat::Ggml(_) => {
            unreachable!("{} has no kernel in ft (MatrixLayout::new refuses it)", f)
        }
    }
}

/// Where one call of a register-blocked kernel writes: `out[(r - r0) * stride + a0 + t]`.
#[derive(Clone, Copy)]
struct Out {
    ptr: *mut f32,
    stride: usize,
}

/// Prefetch the start of a tile: its first [`PREFETCH_AHEAD_BYTES`] of values (the in-loop
/// prefetch covers the rest) and all its block scales, so that the tile's first rows do not
/// wait for the hardware streamer to ramp up. Prefetches never fault; addresses stay in
/// `bytes`.
fn prefetch_tile(l: &MatrixLayout, bytes: &[u8], rows: &Range<usize>) {
    let p = bytes.as_ptr();
    let v0 = rows.start * l.values_row_bytes;
    let v1 = (rows.end * l.values_row_bytes).min(v0 + PREFETCH_AHEAD_BYTES);
    let s0 = l.block_scales_offset + rows.start * l.block_scales_row_bytes;
    let s1 = l.block_scales_offset + rows.end * l.block_scales_row_bytes;
    for range in [v0..v1, s0..s1] {
        for off in range.step_by(64) {
            // SAFETY: prefetch is a hint; the address lies inside `bytes`.
            unsafe { _mm_prefetch::<_MM_HINT_T0>(p.add(off).cast()) };
        }
    }
}

/// The int8-path rows of one matrix at `level` (AVX2 or wider; see the module docs).
pub(crate) fn int8_rows(
    level: SimdLevel,
    format: ExpertFormat,
    l: &MatrixLayout,
    bytes: &[u8],
    rows: Range<usize>,
    acts: &[&QuantAct],
    out: &mut [f32],
) {
    assert!(level.available() && level != SimdLevel::Scalar);
    assert!(out.len() >= rows.len() * acts.len());
    for a in acts {
        assert!(a.q.len() == l.cols);
    }
    prefetch_tile(l, bytes, &rows);
    let f = format_id(format);
    let n = acts.len();
    let chunk = if level == SimdLevel::Avx2 {
        TOKENS_256
    } else {
        TOKENS_512
    };
    let mut a0 = 0;
    while a0 < n {
        let m = (n - a0).min(chunk);
        let c = if m >= 8 {
            8
        } else if m >= 4 {
            4
        } else if m >= 2 {
            2
        } else {
            1
        };
        let o = Out {
            // SAFETY: a0 < n and the kernel writes (rows.len() - 1) * n + a0 + c - 1 at most.
            ptr: unsafe { out.as_mut_ptr().add(a0) },
            stride: n,
        };
        let sub = &acts[a0..a0 + c];
        // SAFETY: the level's features were checked above; shapes were checked above and by
        // the layout (bytes holds the whole matrix).
        unsafe {
            macro_rules! go {
                ($func:ident) => {
                    match (f, c) {
                        (F_NV, 8) => $func::<F_NV, 8>(l, bytes, rows.clone(), sub, o),
                        (F_NV, 4) => $func::<F_NV, 4>(l, bytes, rows.clone(), sub, o),
                        (F_NV, 2) => $func::<F_NV, 2>(l, bytes, rows.clone(), sub, o),
                        (F_NV, _) => $func::<F_NV, 1>(l, bytes, rows.clone(), sub, o),
                        (F_MX, 8) => $func::<F_MX, 8>(l, bytes, rows.clone(), sub, o),
                        (F_MX, 4) => $func::<F_MX, 4>(l, bytes, rows.clone(), sub, o),
                        (F_MX, 2) => $func::<F_MX, 2>(l, bytes, rows.clone(), sub, o),
                        (F_MX, _) => $func::<F_MX, 1>(l, bytes, rows.clone(), sub, o),
                        (F_Q4, 8) => $func::<F_Q4, 8>(l, bytes, rows.clone(), sub, o),
                        (F_Q4, 4) => $func::<F_Q4, 4>(l, bytes, rows.clone(), sub, o),
                        (F_Q4, 2) => $func::<F_Q4, 2>(l, bytes, rows.clone(), sub, o),
                        (F_Q4, _) => $func::<F_Q4, 1>(l, bytes, rows.clone(), sub, o),
                        (_, 8) => $func::<F_I8, 8>(l, bytes, rows.clone(), sub, o),
                        (_, 4) => $func::<F_I8, 4>(l, bytes, rows.clone(), sub, o),
                        (_, 2) => $func::<F_I8, 2>(l, bytes, rows.clone(), sub, o),
                        (_, _) => $func::<F_I8, 1>(l, bytes, rows.clone(), sub, o),
                    }
                };
            }
            match level {
                SimdLevel::Avx512Vnni => go!(int8_512_vnni),
                SimdLevel::Avx512 => go!(int8_512_bw),
                _ => go!(int8_256),
            }
        }
        a0 += c;
    }
}

/// The VNNI level: with AVX-512 VBMI where the CPU has it (one `vpermb` per nibble plane
/// instead of a mask and a `vpshufb`), else without.
unsafe fn int8_512_vnni<const F: u8, const N: usize>(
    l: &MatrixLayout,
    bytes: &[u8],
    rows: Range<usize>,
    acts: &[&QuantAct],
    out: Out,
) {
    if has_vbmi() {
        int8_512_vnni_vbmi::<F, N>(l, bytes, rows, acts, out)
    } else {
        int8_512_vnni_plain::<F, N>(l, bytes, rows, acts, out)
    }
}

/// Whether the CPU has AVX-512 VBMI (detected once).
fn has_vbmi() -> bool {
    static VBMI: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *VBMI.get_or_init(|| std::is_x86_feature_detected!("avx512vbmi"))
}

#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx512vbmi,avx2,fma,f16c")]
unsafe fn int8_512_vnni_vbmi<const F: u8, const N: usize>(
    l: &MatrixLayout,
    bytes: &[u8],
    rows: Range<usize>,
    acts: &[&QuantAct],
    out: Out,
) {
    int8_body_512::<F, true, true, N>(l, bytes, rows, acts, out)
}

#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
unsafe fn int8_512_vnni_plain<const F: u8, const N: usize>(
    l: &MatrixLayout,
    bytes: &[u8],
    rows: Range<usize>,
    acts: &[&QuantAct],
    out: Out,
) {
    int8_body_512::<F, true, false, N>(l, bytes, rows, acts, out)
}

#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,fma,f16c")]
unsafe fn int8_512_bw<const F: u8, const N: usize>(
    l: &MatrixLayout,
    bytes: &[u8],
    rows: Range<usize>,
    acts: &[&QuantAct],
    out: Out,
) {
    int8_body_512::<F, false, false, N>(l, bytes, rows, acts, out)
}

/// The group size `G` of a format id.
const fn group_of(f: u8) -> usize {
    if f == F_NV {
        16
    } else {
        32
    }
}

/// Bytes of one group of 16 weight blocks in a row's values.
const fn group_weight_bytes(f: u8) -> usize {
    match f {
        F_NV => 16 * 8,
        F_MX => 16 * 16,
        F_Q4 => 16 * 18,
        _ => 16 * 32,
    }
}

/// Row `r`'s values and block-scale pointers and its row scale, without bounds checks or a
/// software f16 conversion (F16C's `vcvtph2ps` is exact, as is `half`'s).
///
/// # Safety
/// `r < l.rows`, `bytes` is the whole matrix, and the CPU has F16C.
#[inline(always)]
unsafe fn row_ptrs<const F: u8>(
    l: &MatrixLayout,
    bytes: &[u8],
    r: usize,
) -> (*const u8, *const u8, f32) {
    let p = bytes.as_ptr();
    let vals = p.add(r * l.values_row_bytes);
    let sc = p.wrapping_add(l.block_scales_offset + r * l.block_scales_row_bytes);
    let row_scale = match F {
        F_NV => {
            let h = (p.add(l.row_scales_offset + 2 * r) as *const u16).read_unaligned();
            _mm_cvtss_f32(_mm_cvtph_ps(_mm_cvtsi32_si128(h as i32)))
        }
        F_I8 => (p.add(l.row_scales_offset + 4 * r) as *const f32).read_unaligned(),
        _ => 1.0,
    };
    (vals, sc, row_scale)
}

/// The row factor `f_r` (spec section 1).
#[inline(always)]
fn row_factor<const F: u8>(row_scale: f32) -> f32 {
    match F {
        F_NV => row_scale * 0.5,
        F_MX => 0.5,
        F_Q4 => 1.0,
        _ => row_scale,
    }
}

#[inline(always)]
#[allow(clippy::needless_range_loop)] // token-indexed register arrays read best indexed
unsafe fn int8_body_512<const F: u8, const VNNI: bool, const VB: bool, const N: usize>(
    l: &MatrixLayout,
    bytes: &[u8],
    rows: Range<usize>,
    acts: &[&QuantAct],
    out: Out,
) {
    let g_len = group_of(F);
    let v = g_len / 4;
    let blocks = l.cols / g_len;
    let groups = blocks.div_ceil(16);
    let gb = 16 * g_len;
    let wgb = group_weight_bytes(F);
    let ones = _mm512_set1_epi16(1);
    let r0 = rows.start;
    for r in rows {
        let (vals, sc, row_scale) = row_ptrs::<F>(l, bytes, r);
        let f_r = row_factor::<F>(row_scale);
        let mut acc = [_mm512_setzero_ps(); N];
        for g in 0..groups {
            let nb = (blocks - 16 * g).min(16);
            let m16: __mmask16 = if nb == 16 { 0xFFFF } else { (1u16 << nb) - 1 };
            let pf = vals.wrapping_add(g * wgb + PREFETCH_AHEAD_BYTES);
            for line in 0..wgb.div_ceil(64) {
                _mm_prefetch::<_MM_HINT_T0>(pf.wrapping_add(64 * line).cast());
            }
            let (mut w, ws) = decode_group_512::<F, VB>(vals, sc, g, nb, m16);
            let mut neg = [0u64; 8];
            if F == F_I8 {
                for k in 0..8 {
                    if VNNI {
                        w[k] = _mm512_xor_si512(w[k], _mm512_set1_epi8(0x80u8 as i8));
                    } else {
                        neg[k] = _mm512_movepi8_mask(w[k]);
                        w[k] = _mm512_abs_epi8(w[k]);
                    }
                }
            }
            for t in 0..N {
                let a = acts[t];
                let xp = a.canonical.as_ptr().add(g * gb);
                // Two independent chains (even and odd k) halve the dependency latency; integer
                // sums are exact, so the split does not change the result.
                let mut dps = [_mm512_setzero_si512(); 2];
                for k in 0..v {
                    let mut x = _mm512_loadu_si512(xp.add(64 * k).cast());
                    let dp = &mut dps[k % 2];
                    if VNNI {
                        *dp = _mm512_dpbusd_epi32(*dp, w[k], x);
                    } else {
                        if F == F_I8 {
                            x = _mm512_mask_sub_epi8(x, neg[k], _mm512_setzero_si512(), x);
                        }
                        *dp = _mm512_add_epi32(
                            *dp,
                            _mm512_madd_epi16(_mm512_maddubs_epi16(w[k], x), ones),
                        );
                    }
                }
                let dp = _mm512_add_epi32(dps[0], dps[1]);
                let idot = if F == F_I8 && !VNNI {
                    dp
                } else {
                    _mm512_sub_epi32(dp, _mm512_loadu_si512(a.offset.as_ptr().add(16 * g).cast()))
                };
                let s = _mm512_mul_ps(ws, _mm512_loadu_ps(a.scale.as_ptr().add(16 * g)));
                let tt = _mm512_mul_ps(_mm512_cvtepi32_ps(idot), s);
                acc[t] = _mm512_mask_add_ps(acc[t], m16, acc[t], tt);
            }
        }
        for t in 0..N {
            *out.ptr.add((r - r0) * out.stride + t) = reduce16_512(acc[t]) * f_r;
        }
    }
}

/// The spec's fixed reduction of 16 lanes (w4a8 section 3).
#[inline(always)]
unsafe fn reduce16_512(v: __m512) -> f32 {
    let lo = _mm512_castps512_ps256(v);
    let hi = _mm256_castpd_ps(_mm512_extractf64x4_pd::<1>(_mm512_castps_pd(v)));
    reduce8_256(lo, hi)
}

/// `r8 = lo + hi`, then the rest of the spec's reduction.
#[inline(always)]
unsafe fn reduce8_256(lo: __m256, hi: __m256) -> f32 {
    let s8 = _mm256_add_ps(lo, hi);
    let s4 = _mm_add_ps(_mm256_castps256_ps128(s8), _mm256_extractf128_ps::<1>(s8));
    let s2 = _mm_add_ps(s4, _mm_movehl_ps(s4, s4));
    let s1 = _mm_add_ss(s2, _mm_shuffle_ps::<1>(s2, s2));
    _mm_cvtss_f32(s1)
}

/// Masked 64-byte load of `len` (0..=64) bytes.
#[inline(always)]
unsafe fn load_partial_512(p: *const u8, len: usize) -> __m512i {
    let m: u64 = if len >= 64 { !0 } else { (1u64 << len) - 1 };
    _mm512_maskz_loadu_epi8(m, p.cast())
}

/// `n` nibble split + lookup of a register of packed e2m1 bytes: (low, high) nibbles as
/// unsigned integer weights.
#[inline(always)]
unsafe fn e2m1_split_512<const VB: bool>(r: __m512i) -> (__m512i, __m512i) {
    if VB {
        // VBMI's vpermb indexes with the low 6 bits of each byte: a 64-entry table that
        // repeats the 16-entry one ignores the two bits above the nibble, so no masking.
        let t = _mm512_broadcast_i32x4(_mm_loadu_si128(E2M1_U8_LUT.as_ptr().cast()));
        let lo = _mm512_permutexvar_epi8(r, t);
        let hi = _mm512_permutexvar_epi8(_mm512_srli_epi16::<4>(r), t);
        return (lo, hi);
    }
    let lut = _mm512_broadcast_i32x4(_mm_loadu_si128(E2M1_U8_LUT.as_ptr().cast()));
    let m4 = _mm512_set1_epi8(0x0F);
    let lo = _mm512_and_si512(r, m4);
    let hi = _mm512_and_si512(_mm512_srli_epi16::<4>(r), m4);
    (_mm512_shuffle_epi8(lut, lo), _mm512_shuffle_epi8(lut, hi))
}

/// Exact e4m3 -> f32 of 16 bytes (matches `codec::e4m3_to_f32`): an e4m3 magnitude
/// shifted left by 7 is an f16 whose value is the e4m3 value times 2^-8 (subnormals
/// included), so convert as f16 and scale by 256 (exact).
#[inline(always)]
unsafe fn e4m3_to_f32_512(b: __m128i) -> __m512 {
    // b << 8, arithmetic >> 1: sign in bits 15 and 14, magnitude in bits 13..7; clear bit 14.
    let b16 = _mm256_cvtepu8_epi16(b);
    let h = _mm256_and_si256(
        _mm256_srai_epi16::<1>(_mm256_slli_epi16::<8>(b16)),
        _mm256_set1_epi16(0xBFFFu16 as i16),
    );
    let f = _mm512_mul_ps(_mm512_cvtph_ps(h), _mm512_set1_ps(256.0));
    // NaN codes (magnitude 0x7f) have h & 0x3f80 == 0x3f80.
    let nan = _mm256_cmpeq_epi16_mask(
        _mm256_and_si256(h, _mm256_set1_epi16(0x3F80)),
        _mm256_set1_epi16(0x3F80),
    );
    _mm512_mask_blend_ps(nan, f, _mm512_set1_ps(f32::NAN))
}

/// Exact e8m0 -> f32 of 16 bytes zero-extended to dwords (matches `codec::e8m0_to_f32`).
#[inline(always)]
unsafe fn e8m0_to_f32_512(e: __m512i) -> __m512 {
    let v = _mm512_slli_epi32::<23>(e);
    let zero = _mm512_cmpeq_epi32_mask(e, _mm512_setzero_si512());
    let v = _mm512_mask_blend_epi32(zero, v, _mm512_set1_epi32(0x0040_0000));
    let nan = _mm512_cmpeq_epi32_mask(e, _mm512_set1_epi32(255));
    _mm512_castsi512_ps(_mm512_mask_blend_epi32(
        nan,
        v,
        _mm512_set1_epi32(0x7FC0_0000),
    ))
}

/// Unpack group `g` (blocks `16 g ..`, `nb` of them) of a row into canonical weight registers
/// and the block factors `s_b` (lanes `>= nb` are zero weights).
#[inline(always)]
unsafe fn decode_group_512<const F: u8, const VB: bool>(
    vals: *const u8,
    sc: *const u8,
    g: usize,
    nb: usize,
    m16: __mmask16,
) -> ([__m512i; 8], __m512) {
    let z = _mm512_setzero_si512();
    let mut w = [z; 8];
    match F {
        F_NV => {
            let p = vals.wrapping_add(128 * g);
            let (a, b) = if nb == 16 {
                (
                    _mm512_loadu_si512(p.cast()),
                    _mm512_loadu_si512(p.add(64).cast()),
                )
            } else {
                let len = 8 * nb;
                (
                    load_partial_512(p, len.min(64)),
                    load_partial_512(p.wrapping_add(64), len.saturating_sub(64)),
                )
            };
            let even = _mm512_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30);
            let odd = _mm512_setr_epi32(1, 3, 5, 7, 9, 11, 13, 15, 17, 19, 21, 23, 25, 27, 29, 31);
            let d0 = _mm512_permutex2var_epi32(a, even, b);
            let d1 = _mm512_permutex2var_epi32(a, odd, b);
            (w[0], w[1]) = e2m1_split_512::<VB>(d0);
            (w[2], w[3]) = e2m1_split_512::<VB>(d1);
            let s = _mm_maskz_loadu_epi8(m16, sc.wrapping_add(16 * g).cast());
            (w, e4m3_to_f32_512(s))
        }
        F_MX => {
            let p = vals.wrapping_add(256 * g);
            let mut a = [z; 4];
            for (i, ai) in a.iter_mut().enumerate() {
                *ai = if nb == 16 {
                    _mm512_loadu_si512(p.add(64 * i).cast())
                } else {
                    load_partial_512(
                        p.wrapping_add(64 * i),
                        (16 * nb).saturating_sub(64 * i).min(64),
                    )
                };
            }
            let i01 = _mm512_setr_epi32(0, 4, 8, 12, 16, 20, 24, 28, 1, 5, 9, 13, 17, 21, 25, 29);
            let i23 = _mm512_setr_epi32(2, 6, 10, 14, 18, 22, 26, 30, 3, 7, 11, 15, 19, 23, 27, 31);
            let s0 = _mm512_permutex2var_epi32(a[0], i01, a[1]);
            let s1 = _mm512_permutex2var_epi32(a[0], i23, a[1]);
            let s2 = _mm512_permutex2var_epi32(a[2], i01, a[3]);
            let s3 = _mm512_permutex2var_epi32(a[2], i23, a[3]);
            let d = [
                _mm512_shuffle_i32x4::<0x44>(s0, s2),
                _mm512_shuffle_i32x4::<0xEE>(s0, s2),
                _mm512_shuffle_i32x4::<0x44>(s1, s3),
                _mm512_shuffle_i32x4::<0xEE>(s1, s3),
            ];
            for (k, dk) in d.into_iter().enumerate() {
                (w[2 * k], w[2 * k + 1]) = e2m1_split_512::<VB>(dk);
            }
            let s = _mm_maskz_loadu_epi8(m16, sc.wrapping_add(16 * g).cast());
            (w, e8m0_to_f32_512(_mm512_cvtepu8_epi32(s)))
        }
        F_Q4 => {
            let base = vals.wrapping_add(288 * g);
            let lane = _mm512_mullo_epi32(
                _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15),
                _mm512_set1_epi32(18),
            );
            let m4 = _mm512_set1_epi8(0x0F);
            for d in 0..4 {
                let idx = _mm512_add_epi32(lane, _mm512_set1_epi32(2 + 4 * d as i32));
                let r = _mm512_mask_i32gather_epi32::<1>(z, m16, idx, base.cast());
                w[2 * d] = _mm512_and_si512(r, m4);
                w[2 * d + 1] = _mm512_and_si512(_mm512_srli_epi16::<4>(r), m4);
            }
            let s = _mm512_mask_i32gather_epi32::<1>(z, m16, lane, base.cast());
            (w, _mm512_cvtph_ps(_mm512_cvtepi32_epi16(s)))
        }
        _ => {
            let base = vals.wrapping_add(512 * g);
            let lane = _mm512_slli_epi32::<5>(_mm512_setr_epi32(
                0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15,
            ));
            for (d, wd) in w.iter_mut().enumerate() {
                let idx = _mm512_add_epi32(lane, _mm512_set1_epi32(4 * d as i32));
                *wd = _mm512_mask_i32gather_epi32::<1>(z, m16, idx, base.cast());
            }
            (w, _mm512_set1_ps(1.0))
        }
    }
}

#[target_feature(enable = "avx2,fma,f16c")]
#[allow(clippy::needless_range_loop)] // token-indexed register arrays read best indexed
unsafe fn int8_256<const F: u8, const N: usize>(
    l: &MatrixLayout,
    bytes: &[u8],
    rows: Range<usize>,
    acts: &[&QuantAct],
    out: Out,
) {
    let g_len = group_of(F);
    let v = g_len / 4;
    let blocks = l.cols / g_len;
    let groups = blocks.div_ceil(16);
    let gb = 16 * g_len;
    let ones = _mm256_set1_epi16(1);
    let lanes = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
    let r0 = rows.start;
    for r in rows {
        let (vals, sc, row_scale) = row_ptrs::<F>(l, bytes, r);
        let f_r = row_factor::<F>(row_scale);
        let mut acc = [[_mm256_setzero_ps(); 2]; N];
        for g in 0..groups {
            let nb = (blocks - 16 * g).min(16);
            for h in 0..2 {
                if nb <= 8 * h {
                    continue;
                }
                let nbh = (nb - 8 * h).min(8);
                let mask = _mm256_cmpgt_epi32(_mm256_set1_epi32(nbh as i32), lanes);
                let (mut w, ws) = decode_half_256::<F>(vals, sc, g, h, nbh, mask);
                let signs = w;
                if F == F_I8 {
                    for wk in w.iter_mut() {
                        *wk = _mm256_abs_epi8(*wk);
                    }
                }
                for t in 0..N {
                    let a = acts[t];
                    let xp = a.canonical.as_ptr().add(g * gb + 32 * h);
                    let mut dp = _mm256_setzero_si256();
                    for k in 0..v {
                        let mut x = _mm256_loadu_si256(xp.add(64 * k).cast());
                        if F == F_I8 {
                            x = _mm256_sign_epi8(x, signs[k]);
                        }
                        dp = _mm256_add_epi32(
                            dp,
                            _mm256_madd_epi16(_mm256_maddubs_epi16(w[k], x), ones),
                        );
                    }
                    let idot = if F == F_I8 {
                        dp
                    } else {
                        _mm256_sub_epi32(
                            dp,
                            _mm256_loadu_si256(a.offset.as_ptr().add(16 * g + 8 * h).cast()),
                        )
                    };
                    let s =
                        _mm256_mul_ps(ws, _mm256_loadu_ps(a.scale.as_ptr().add(16 * g + 8 * h)));
                    let tt = _mm256_mul_ps(_mm256_cvtepi32_ps(idot), s);
                    let sum = _mm256_add_ps(acc[t][h], tt);
                    acc[t][h] = _mm256_blendv_ps(acc[t][h], sum, _mm256_castsi256_ps(mask));
                }
            }
        }
        for t in 0..N {
            *out.ptr.add((r - r0) * out.stride + t) = reduce8_256(acc[t][0], acc[t][1]) * f_r;
        }
    }
}

/// The AVX2 twin of [`decode_group_512`] for half `h` (blocks `16 g + 8 h ..`, `nbh` of
/// them; `mask` has lanes `< nbh` set). int8 weights come back signed.
#[inline(always)]
unsafe fn decode_half_256<const F: u8>(
    vals: *const u8,
    sc: *const u8,
    g: usize,
    h: usize,
    nbh: usize,
    mask: __m256i,
) -> ([__m256i; 8], __m256) {
    let z = _mm256_setzero_si256();
    let mut w = [z; 8];
    let lane = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
    let m4 = _mm256_set1_epi8(0x0F);
    let lut = _mm256_broadcastsi128_si256(_mm_loadu_si128(E2M1_U8_LUT.as_ptr().cast()));
    // The half's block-scale bytes, copied so that a partial group reads nothing past them.
    let small_scales = || -> __m256i {
        let mut buf = [0u8; 8];
        std::ptr::copy_nonoverlapping(sc.wrapping_add(16 * g + 8 * h), buf.as_mut_ptr(), nbh);
        _mm256_cvtepu8_epi32(_mm_loadl_epi64(buf.as_ptr().cast()))
    };
    match F {
        F_NV | F_MX => {
            let bstride = group_of(F) / 2;
            let base = vals.wrapping_add(16 * bstride * g + 8 * bstride * h);
            let lanes_b = _mm256_mullo_epi32(lane, _mm256_set1_epi32(bstride as i32));
            for d in 0..bstride / 4 {
                let idx = _mm256_add_epi32(lanes_b, _mm256_set1_epi32(4 * d as i32));
                let r = _mm256_mask_i32gather_epi32::<1>(z, base.cast(), idx, mask);
                let lo = _mm256_and_si256(r, m4);
                let hi = _mm256_and_si256(_mm256_srli_epi16::<4>(r), m4);
                w[2 * d] = _mm256_shuffle_epi8(lut, lo);
                w[2 * d + 1] = _mm256_shuffle_epi8(lut, hi);
            }
            let b = small_scales();
            let ws = if F == F_NV {
                let mag = _mm256_and_si256(b, _mm256_set1_epi32(0x7F));
                let normal =
                    _mm256_add_epi32(_mm256_slli_epi32::<20>(mag), _mm256_set1_epi32(120 << 23));
                let m = _mm256_and_si256(b, _mm256_set1_epi32(7));
                let sub = _mm256_castps_si256(_mm256_mul_ps(
                    _mm256_cvtepi32_ps(m),
                    _mm256_set1_ps(1.0 / 512.0),
                ));
                let is_sub = _mm256_cmpgt_epi32(_mm256_set1_epi32(8), mag);
                let v = _mm256_blendv_epi8(normal, sub, is_sub);
                let sign = _mm256_slli_epi32::<24>(_mm256_and_si256(b, _mm256_set1_epi32(0x80)));
                let v = _mm256_or_si256(v, sign);
                let nan = _mm256_cmpeq_epi32(mag, _mm256_set1_epi32(0x7F));
                _mm256_castsi256_ps(_mm256_blendv_epi8(v, _mm256_set1_epi32(0x7FC0_0000), nan))
            } else {
                let v = _mm256_slli_epi32::<23>(b);
                let zero = _mm256_cmpeq_epi32(b, z);
                let v = _mm256_blendv_epi8(v, _mm256_set1_epi32(0x0040_0000), zero);
                let nan = _mm256_cmpeq_epi32(b, _mm256_set1_epi32(255));
                _mm256_castsi256_ps(_mm256_blendv_epi8(v, _mm256_set1_epi32(0x7FC0_0000), nan))
            };
            (w, ws)
        }
        F_Q4 => {
            let base = vals.wrapping_add(288 * g + 144 * h);
            let lanes_b = _mm256_mullo_epi32(lane, _mm256_set1_epi32(18));
            for d in 0..4 {
                let idx = _mm256_add_epi32(lanes_b, _mm256_set1_epi32(2 + 4 * d as i32));
                let r = _mm256_mask_i32gather_epi32::<1>(z, base.cast(), idx, mask);
                w[2 * d] = _mm256_and_si256(r, m4);
                w[2 * d + 1] = _mm256_and_si256(_mm256_srli_epi16::<4>(r), m4);
            }
            let s = _mm256_mask_i32gather_epi32::<1>(z, base.cast(), lanes_b, mask);
            // Keep the low 16 bits of each dword, pack them into 8 u16, convert f16 -> f32.
            let s = _mm256_and_si256(s, _mm256_set1_epi32(0xFFFF));
            let packed =
                _mm_packus_epi32(_mm256_castsi256_si128(s), _mm256_extracti128_si256::<1>(s));
            (w, _mm256_cvtph_ps(packed))
        }
        _ => {
            let base = vals.wrapping_add(512 * g + 256 * h);
            let lanes_b = _mm256_slli_epi32::<5>(lane);
            for (d, wd) in w.iter_mut().enumerate() {
                let idx = _mm256_add_epi32(lanes_b, _mm256_set1_epi32(4 * d as i32));
                *wd = _mm256_mask_i32gather_epi32::<1>(z, base.cast(), idx, mask);
            }
            (w, _mm256_set1_ps(1.0))
        }
    }
}

/// The f32-path rows of one matrix at `level` (AVX2 or wider).
pub(crate) fn f32_rows(
    level: SimdLevel,
    l: &MatrixLayout,
    bytes: &[u8],
    rows: Range<usize>,
    acts: &[&[f32]],
    out: &mut [f32],
) {
    assert!(level.available() && level != SimdLevel::Scalar);
    for a in acts {
        assert_eq!(a.len(), l.cols);
    }
    prefetch_tile(l, bytes, &rows);
    F32_ROW.with_borrow_mut(|buf| {
        buf.resize(l.cols, 0.0);
        let n = acts.len();
        for r in rows.clone() {
            let row = l.row(bytes, r);
            // SAFETY: features checked above; the buffer holds `cols` floats.
            unsafe {
                if level >= SimdLevel::Avx512 {
                    decode_row_512(l.format, &row, buf);
                } else {
                    decode_row(l.format, &row, buf);
                }
                let mut a0 = 0;
                while a0 < n {
                    let o = &mut out[(r - rows.start) * n + a0..];
                    let m = n - a0;
                    if m >= 4 {
                        let xs = [acts[a0], acts[a0 + 1], acts[a0 + 2], acts[a0 + 3]];
                        let d = if level >= SimdLevel::Avx512 {
                            dot4_f32_512(buf, xs)
                        } else {
                            dot4_f32_256(buf, xs)
                        };
                        o[..4].copy_from_slice(&d);
                        a0 += 4;
                    } else {
                        o[0] = if level >= SimdLevel::Avx512 {
                            dot_f32_512(buf, acts[a0])
                        } else {
                            dot_f32_256(buf, acts[a0])
                        };
                        a0 += 1;
                    }
                }
            }
        }
    });
}

/// Four dot products of one decoded row (each weight load feeds four FMAs).
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,fma,f16c")]
unsafe fn dot4_f32_512(w: &[f32], x: [&[f32]; 4]) -> [f32; 4] {
    let n = w.len();
    let pw = w.as_ptr();
    let px = x.map(|v| v.as_ptr());
    let mut acc = [[_mm512_setzero_ps(); 2]; 4];
    let mut i = 0;
    while i + 32 <= n {
        let w0 = _mm512_loadu_ps(pw.add(i));
        let w1 = _mm512_loadu_ps(pw.add(i + 16));
        for t in 0..4 {
            acc[t][0] = _mm512_fmadd_ps(w0, _mm512_loadu_ps(px[t].add(i)), acc[t][0]);
            acc[t][1] = _mm512_fmadd_ps(w1, _mm512_loadu_ps(px[t].add(i + 16)), acc[t][1]);
        }
        i += 32;
    }
    let mut outv = [0f32; 4];
    for t in 0..4 {
        outv[t] = _mm512_reduce_add_ps(_mm512_add_ps(acc[t][0], acc[t][1]));
        for j in i..n {
            outv[t] += w[j] * x[t][j];
        }
    }
    outv
}

/// AVX2 twin of [`dot4_f32_512`].
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn dot4_f32_256(w: &[f32], x: [&[f32]; 4]) -> [f32; 4] {
    let n = w.len();
    let pw = w.as_ptr();
    let px = x.map(|v| v.as_ptr());
    let mut acc = [[_mm256_setzero_ps(); 2]; 4];
    let mut i = 0;
    while i + 16 <= n {
        let w0 = _mm256_loadu_ps(pw.add(i));
        let w1 = _mm256_loadu_ps(pw.add(i + 8));
        for t in 0..4 {
            acc[t][0] = _mm256_fmadd_ps(w0, _mm256_loadu_ps(px[t].add(i)), acc[t][0]);
            acc[t][1] = _mm256_fmadd_ps(w1, _mm256_loadu_ps(px[t].add(i + 8)), acc[t][1]);
        }
        i += 16;
    }
    let mut outv = [0f32; 4];
    for t in 0..4 {
        let s = _mm256_add_ps(acc[t][0], acc[t][1]);
        let s4 = _mm_add_ps(_mm256_castps256_ps128(s), _mm256_extractf128_ps::<1>(s));
        let s2 = _mm_add_ps(s4, _mm_movehl_ps(s4, s4));
        outv[t] = _mm_cvtss_f32(_mm_add_ss(s2, _mm_shuffle_ps::<1>(s2, s2)));
        for j in i..n {
            outv[t] += w[j] * x[t][j];
        }
    }
    outv
}

#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,fma,f16c")]
unsafe fn decode_row_512(format: ExpertFormat, row: &crate::codec::RowRef<'_>, out: &mut [f32]) {
    let cols = out.len();
    let o = out.as_mut_ptr();
    let v = row.values.as_ptr();
    match format {
        ExpertFormat::Nvfp4 | ExpertFormat::Mxfp4 if cols.is_multiple_of(32) => {
            let lut = _mm512_loadu_ps(
                [
                    E2M1_VALUES[0],
                    E2M1_VALUES[1],
                    E2M1_VALUES[2],
                    E2M1_VALUES[3],
                    E2M1_VALUES[4],
                    E2M1_VALUES[5],
                    E2M1_VALUES[6],
                    E2M1_VALUES[7],
                    -E2M1_VALUES[0],
                    -E2M1_VALUES[1],
                    -E2M1_VALUES[2],
                    -E2M1_VALUES[3],
                    -E2M1_VALUES[4],
                    -E2M1_VALUES[5],
                    -E2M1_VALUES[6],
                    -E2M1_VALUES[7],
                ]
                .as_ptr(),
            );
            let m4 = _mm256_set1_epi16(0x0F);
            for c in 0..cols / 32 {
                let b = _mm256_cvtepu8_epi16(_mm_loadu_si128(v.add(16 * c).cast()));
                let lo = _mm256_and_si256(b, m4);
                let hi = _mm256_slli_epi16::<8>(_mm256_srli_epi16::<4>(b));
                let nib = _mm256_or_si256(lo, hi);
                let n0 = _mm512_cvtepu8_epi32(_mm256_castsi256_si128(nib));
                let n1 = _mm512_cvtepu8_epi32(_mm256_extracti128_si256::<1>(nib));
                let (s0, s1) = if format == ExpertFormat::Nvfp4 {
                    (
                        e4m3_to_f32(row.block_scales[2 * c]) * row.row_scale,
                        e4m3_to_f32(row.block_scales[2 * c + 1]) * row.row_scale,
                    )
                } else {
                    let s = e8m0_to_f32(row.block_scales[c]);
                    (s, s)
                };
                _mm512_storeu_ps(
                    o.add(32 * c),
                    _mm512_mul_ps(_mm512_permutexvar_ps(n0, lut), _mm512_set1_ps(s0)),
                );
                _mm512_storeu_ps(
                    o.add(32 * c + 16),
                    _mm512_mul_ps(_mm512_permutexvar_ps(n1, lut), _mm512_set1_ps(s1)),
                );
            }
        }
        ExpertFormat::Q4_0 => {
            let m4 = _mm_set1_epi8(0x0F);
            let eight = _mm512_set1_epi32(8);
            for (b, blk) in row.values.chunks_exact(18).enumerate() {
                let d = _mm512_set1_ps(f16::from_le_bytes([blk[0], blk[1]]).to_f32());
                let q = _mm_loadu_si128(blk.as_ptr().add(2).cast());
                let lo = _mm512_cvtepu8_epi32(_mm_and_si128(q, m4));
                let hi = _mm512_cvtepu8_epi32(_mm_and_si128(_mm_srli_epi16::<4>(q), m4));
                let lo = _mm512_cvtepi32_ps(_mm512_sub_epi32(lo, eight));
                let hi = _mm512_cvtepi32_ps(_mm512_sub_epi32(hi, eight));
                _mm512_storeu_ps(o.add(32 * b), _mm512_mul_ps(lo, d));
                _mm512_storeu_ps(o.add(32 * b + 16), _mm512_mul_ps(hi, d));
            }
        }
        ExpertFormat::Int8 if cols.is_multiple_of(16) => {
            let d = _mm512_set1_ps(row.row_scale);
            for c in 0..cols / 16 {
                let q = _mm512_cvtepi8_epi32(_mm_loadu_si128(v.add(16 * c).cast()));
                _mm512_storeu_ps(o.add(16 * c), _mm512_mul_ps(_mm512_cvtepi32_ps(q), d));
            }
        }
        ExpertFormat::Bf16 if cols.is_multiple_of(16) => {
            for c in 0..cols / 16 {
                let h = _mm512_cvtepu16_epi32(_mm256_loadu_si256(v.add(32 * c).cast()));
                _mm512_storeu_ps(
                    o.add(16 * c),
                    _mm512_castsi512_ps(_mm512_slli_epi32::<16>(h)),
                );
            }
        }
        _ => decode_row(format, row, out),
    }
}

#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,fma,f16c")]
unsafe fn dot_f32_512(w: &[f32], x: &[f32]) -> f32 {
    let n = w.len();
    let (pw, px) = (w.as_ptr(), x.as_ptr());
    let mut acc = [_mm512_setzero_ps(); 4];
    let mut i = 0;
    while i + 64 <= n {
        for (k, a) in acc.iter_mut().enumerate() {
            *a = _mm512_fmadd_ps(
                _mm512_loadu_ps(pw.add(i + 16 * k)),
                _mm512_loadu_ps(px.add(i + 16 * k)),
                *a,
            );
        }
        i += 64;
    }
    while i + 16 <= n {
        acc[0] = _mm512_fmadd_ps(
            _mm512_loadu_ps(pw.add(i)),
            _mm512_loadu_ps(px.add(i)),
            acc[0],
        );
        i += 16;
    }
    let s = _mm512_add_ps(_mm512_add_ps(acc[0], acc[1]), _mm512_add_ps(acc[2], acc[3]));
    let mut total = _mm512_reduce_add_ps(s);
    while i < n {
        total += w[i] * x[i];
        i += 1;
    }
    total
}

#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn dot_f32_256(w: &[f32], x: &[f32]) -> f32 {
    let n = w.len();
    let (pw, px) = (w.as_ptr(), x.as_ptr());
    let mut acc = [_mm256_setzero_ps(); 4];
    let mut i = 0;
    while i + 32 <= n {
        for (k, a) in acc.iter_mut().enumerate() {
            *a = _mm256_fmadd_ps(
                _mm256_loadu_ps(pw.add(i + 8 * k)),
                _mm256_loadu_ps(px.add(i + 8 * k)),
                *a,
            );
        }
        i += 32;
    }
    while i + 8 <= n {
        acc[0] = _mm256_fmadd_ps(
            _mm256_loadu_ps(pw.add(i)),
            _mm256_loadu_ps(px.add(i)),
            acc[0],
        );
        i += 8;
    }
    let s = _mm256_add_ps(_mm256_add_ps(acc[0], acc[1]), _mm256_add_ps(acc[2], acc[3]));
    let s4 = _mm_add_ps(_mm256_castps256_ps128(s), _mm256_extractf128_ps::<1>(s));
    let s2 = _mm_add_ps(s4, _mm_movehl_ps(s4, s4));
    let mut total = _mm_cvtss_f32(_mm_add_ss(s2, _mm_shuffle_ps::<1>(s2, s2)));
    while i < n {
        total += w[i] * x[i];
        i += 1;
    }
    total
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn simd_scale_conversions_match_scalar_for_every_byte() {
        if !SimdLevel::Avx512.available() {
            return;
        }
        for base in (0..256).step_by(16) {
            let bytes: Vec<u8> = (base..base + 16).map(|b| b as u8).collect();
            let mut got = [0f32; 16];
            let mut got8 = [0f32; 16];
            // SAFETY: AVX-512 checked above; 16 readable bytes, 16 writable floats.
            unsafe { check_512(&bytes, &mut got, &mut got8) };
            for (i, &b) in bytes.iter().enumerate() {
                let (want, want8) = (e4m3_to_f32(b), e8m0_to_f32(b));
                assert_eq!(
                    got[i].to_bits(),
                    want.to_bits(),
                    "e4m3 {b:#04x}: {} vs {want}",
                    got[i]
                );
                assert_eq!(got8[i].to_bits(), want8.to_bits(), "e8m0 {b:#04x}");
            }
        }
    }

    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,fma,f16c")]
    unsafe fn check_512(bytes: &[u8], e4: &mut [f32; 16], e8: &mut [f32; 16]) {
        let s = _mm_loadu_si128(bytes.as_ptr().cast());
        _mm512_storeu_ps(e4.as_mut_ptr(), e4m3_to_f32_512(s));
        _mm512_storeu_ps(e8.as_mut_ptr(), e8m0_to_f32_512(_mm512_cvtepu8_epi32(s)));
    }
}
