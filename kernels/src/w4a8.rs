//! The int8-activation path (W4A8 for `q4_0`, `nvfp4`, `mxfp4`; W8A8 for `int8`): its exact
//! arithmetic, written so that a CUDA port reproduces it bit for bit, and its scalar
//! implementation (the definition every SIMD path is tested to match exactly).
//!
//! Hybrid decode sums the CPU's and the GPU's expert outputs; if both compute an expert the
//! same way, where an expert ran never changes the output. Everything below is plain IEEE-754
//! binary32 arithmetic, round to nearest even, **no fused multiply-add** (in CUDA:
//! `__fmul_rn`, `__fadd_rn`, `__fsub_rn`, `__fdiv_rn`, or compile with `--fmad=false`),
//! **no flush-to-zero** (NVRTC's default `--ftz=false`), and integers are exact.
//!
//! # 1. Weights as integers
//! A row of `C` weights is `C / G` blocks of `G` columns, `G` the format's group:
//!
//! | format | `G` | integer weight `w` (per column) | block factor `s_b` | row factor `f_r` |
//! |---|---|---|---|---|
//! | `nvfp4` | 16 | `2 * e2m1` (in `{0, +-1, +-2, +-3, +-4, +-6, +-8, +-12}`) | f32(e4m3 block scale) | f32(f16 row scale) * 0.5 |
//! | `mxfp4` | 32 | `2 * e2m1` | `2^(E - 127)` (e8m0; `E = 0` gives the f32 subnormal `2^-127`) | 0.5 |
//! | `q4_0` | 32 | `q - 8` | f32(f16 `d`) | 1.0 |
//! | `int8` | 32 | `q` | 1.0 | f32 row scale |
//!
//! The weight is exactly `w * s_b * f_r` (every conversion above is exact). `int8` has no
//! block scale; its activations are still blocked by 32.
//!
//! # 2. Activation quantization (per vector `x` of length `C`, per block of `G`)
//! ```text
//! a     = max_i |x_i|                      (exact)
//! if a == 0:   scale = 0, q_i = 0
//! else:        scale = a / 127             (f32 division)
//!              inv   = 127 / a             (f32 division)
//!              q_i   = clamp(round_half_away_from_zero(x_i * inv), -127, 127)   (f32 product)
//! ```
//! `round_half_away_from_zero` is C's `roundf` (Rust `f32::round`). `x` is the token's
//! activation for `gate`/`up`, and `h` (section 4) for `down`.
//!
//! # 3. Dot product of a row with a quantized vector
//! ```text
//! acc[0..16] = +0.0
//! for b in 0, 1, ..., C/G - 1 (increasing):
//!     d    = sum over the block's G columns of w_i * q_i      (i32, exact: |d| < 2^24)
//!     s    = s_b * scale_b                                    (f32 mul)
//!     t    = f32(d) * s                                       (exact conversion, f32 mul)
//!     acc[b % 16] = acc[b % 16] + t                            (f32 add)
//! r8[i] = acc[i] + acc[i + 8]     for i in 0..8
//! r4[i] = r8[i]  + r8[i + 4]      for i in 0..4
//! r2[i] = r4[i]  + r4[i + 2]      for i in 0..2
//! dot   = (r2[0] + r2[1]) * f_r                               (f32 add, f32 mul)
//! ```
//! (Sixteen accumulators are one AVX-512 register; a CUDA port may give each of 16 threads one
//! accumulator, or run them in one thread: only this order matters.)
//!
//! # 4. One expert for one token
//! ```text
//! g_r = dot(gate row r, Q(x)),  u_r = dot(up row r, Q(x))      r in 0..intermediate
//! h_r = silu(g_r) * u_r                                         (f32 mul)
//! o_r = dot(down row r, Q(h))                                   r in 0..hidden
//! silu(v) = v / (1 + exp_ft(-v))                                (f32 add, f32 div)
//! ```
//! `exp_ft` is [`exp_ft`]: Cephes' `expf` written with separate mul/add, identical on any
//! IEEE-754 machine (not libm's `expf` nor CUDA's `expf`, which differ in the last bit).
//! Constants are f32 bit patterns (CUDA: `__int_as_float`):
//! `LOG2E = 0x3fb8aa3b`, `C1 = 0x3f318000` (0.693359375), `C2 = 0xb95e8083` (-2.12194440e-4),
//! `P0..P5 = 0x39506967, 0x3ab743ce, 0x3c088908, 0x3d2aa9c1, 0x3e2aaaaa, 0x3f000000`.
//! ```text
//! v  = min(max(v, -87.0), 88.0)
//! n  = floorf(v * LOG2E + 0.5)                      (f32 mul, f32 add, exact floor)
//! r  = (v - n * C1) - n * C2                        (mul, sub, mul, sub; in this order)
//! p  = P0
//! p  = p * r + P1;  p = p * r + P2;  p = p * r + P3;  p = p * r + P4;  p = p * r + P5
//!                                                   (each: one f32 mul, then one f32 add)
//! e  = (p * (r * r) + r) + 1.0                      (mul r*r, mul, add, add)
//! exp_ft = e * 2^n                                  (2^n from bits: (int(n) + 127) << 23; exact)
//! ```

//! # 5. The layer's output
//! For the experts of a call in the order given, for each (token, router weight `w`) of the
//! expert in the order given: `y[token][r] = y[token][r] + w * o_r` (f32 mul, f32 add).
//!
//! # Implementation notes (not part of the arithmetic)
//! Integer sums are order-free, so SIMD paths read activations in a *canonical* order that
//! matches how they unpack weights: per group of 16 blocks, `G / 4` vectors of 64 bytes whose
//! dword `l` holds 4 activations of block `16 g + l` ([`canonical_element`]). Weights are made
//! unsigned for `vpdpbusd`/`vpmaddubsw` by adding [`W4a8Spec::offset`], which is subtracted
//! again through `offset * sum(q)` per block ([`QuantAct::offset`]).

use ft_model::ExpertFormat;
use half::f16;

use crate::codec::{e2m1_to_f32, e4m3_to_f32, e8m0_to_f32, RowRef};

/// f32 accumulators of the dot product (one AVX-512 register of f32).
pub const ACC_LANES: usize = 16;

/// Largest int8 activation magnitude (symmetric: -127..=127).
pub const Q_MAX: f32 = 127.0;

/// The int8-path constants of a format.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct W4a8Spec {
    /// Columns per block `G` (weight scale group; activation block).
    pub group: usize,
    /// Added to each integer weight to make it unsigned in SIMD paths (exactly undone).
    pub offset: i32,
}

impl W4a8Spec {
    /// The spec of `format`, or `None` for `bf16` (which has no int8 path).
    pub fn of(format: ExpertFormat) -> Option<W4a8Spec> {
        match format {
            ExpertFormat::Bf16 | ExpertFormat::Ggml(_) => None,
            ExpertFormat::Nvfp4 => Some(W4a8Spec {
                group: 16,
                offset: 12,
            }),
            ExpertFormat::Mxfp4 => Some(W4a8Spec {
                group: 32,
                offset: 12,
            }),
            ExpertFormat::Q4_0 => Some(W4a8Spec {
                group: 32,
                offset: 8,
            }),
            ExpertFormat::Int8 => Some(W4a8Spec {
                group: 32,
                offset: 128,
            }),
        }
    }

    /// 64-byte canonical vectors per group of 16 blocks (`G / 4`).
    pub fn vectors(&self) -> usize {
        self.group / 4
    }

    /// Bytes of one canonical group (16 blocks).
    pub fn group_bytes(&self) -> usize {
        ACC_LANES * self.group
    }
}

/// Which element of a block sits at byte `j` (0..4) of dword lane `l` of canonical vector
/// `k` of its group (for every `l`): the order the SIMD paths unpack weights in.
///
/// - `nvfp4`, `mxfp4` (byte `i` = columns `2i`, `2i + 1`): vector `k = 2d + h` is the low
///   (`h = 0`) or high nibbles of the block's packed dword `d`: element `8d + 2j + h`.
/// - `q4_0` (byte `i` = columns `i`, `i + 16`): element `4d + j + 16h`.
/// - `int8`: vector `k` is the block's dword `k`: element `4k + j`.
pub fn canonical_element(format: ExpertFormat, k: usize, j: usize) -> usize {
    let (d, h) = (k / 2, k % 2);
    match format {
        ExpertFormat::Nvfp4 | ExpertFormat::Mxfp4 => 8 * d + 2 * j + h,
        ExpertFormat::Q4_0 => 4 * d + j + 16 * h,
        ExpertFormat::Int8 | ExpertFormat::Bf16 | ExpertFormat::Ggml(_) => 4 * k + j,
    }
}

/// `exp` as the spec defines it (module docs, section 4): Cephes' `expf` in plain f32 ops.
#[inline]
pub fn exp_ft(v: f32) -> f32 {
    // Cephes' constants, given by their f32 bit patterns (the spec's exact values).
    const LOG2E: f32 = f32::from_bits(0x3fb8_aa3b); // 1.44269504
    const C1: f32 = f32::from_bits(0x3f31_8000); // 0.693359375
    const C2: f32 = f32::from_bits(0xb95e_8083); // -2.12194440e-4
    const P0: f32 = f32::from_bits(0x3950_6967); // 1.9875691500e-4
    const P1: f32 = f32::from_bits(0x3ab7_43ce); // 1.3981999507e-3
    const P2: f32 = f32::from_bits(0x3c08_8908); // 8.3334519073e-3
    const P3: f32 = f32::from_bits(0x3d2a_a9c1); // 4.1665795894e-2
    const P4: f32 = f32::from_bits(0x3e2a_aaaa); // 1.6666665459e-1
    const P5: f32 = f32::from_bits(0x3f00_0000); // 5.0000001201e-1 rounds to 0.5
    let v = v.clamp(-87.0, 88.0);
    let n = floor_exact(v * LOG2E + 0.5);
    let r = (v - n * C1) - n * C2;
    let mut p = P0;
    p = p * r + P1;
    p = p * r + P2;
    p = p * r + P3;
    p = p * r + P4;
    p = p * r + P5;
    let e = (p * (r * r) + r) + 1.0;
    e * f32::from_bits(((n as i32 + 127) as u32) << 23)
}

/// SiLU as the spec defines it: `v / (1 + exp_ft(-v))`.
#[inline]
pub fn silu(v: f32) -> f32 {
    v / (1.0 + exp_ft(-v))
}

/// The fixed reduction of the 16 accumulators (module docs, section 3).
#[inline]
pub fn reduce16(acc: &[f32; ACC_LANES]) -> f32 {
    let mut r8 = [0f32; 8];
    for i in 0..8 {
        r8[i] = acc[i] + acc[i + 8];
    }
    let r4 = [r8[0] + r8[4], r8[1] + r8[5], r8[2] + r8[6], r8[3] + r8[7]];
    let r2 = [r4[0] + r4[2], r4[1] + r4[3]];
    r2[0] + r2[1]
}

/// Round half away from zero, as C's `roundf`, for `|v| < 2^31`; exact, and without a libm
/// call (x86-64's baseline has no rounding instruction): truncate, then step away from zero
/// if the (exactly computed) fraction is at least one half.
#[inline]
pub fn round_half_away(v: f32) -> f32 {
    let i = v as i32; // truncation toward zero
    let frac = v - i as f32; // exact for |v| < 2^24; for larger |v| there is no fraction
                             // Branch-free: the fraction's sign is random in activations, so branches mispredict.
    (i + (frac >= 0.5) as i32 - (frac <= -0.5) as i32) as f32
}

/// `floor(v)` for `|v| < 2^31`, exact, without a libm call.
#[inline]
fn floor_exact(v: f32) -> f32 {
    let i = v as i32;
    let t = i as f32;
    if t > v {
        t - 1.0
    } else {
        t
    }
}

/// Sizes of a quantized activation vector of `n` elements for a format.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ActShape {
    /// The format's constants.
    pub spec: W4a8Spec,
    /// Elements.
    pub n: usize,
    /// Blocks (`n / G`).
    pub blocks: usize,
    /// Groups of 16 blocks, the last possibly partial.
    pub groups: usize,
}

impl ActShape {
    /// Shape of `n` activations for `spec` (`n` a multiple of the group).
    pub fn new(spec: W4a8Spec, n: usize) -> Self {
        let blocks = n / spec.group;
        ActShape {
            spec,
            n,
            blocks,
            groups: blocks.div_ceil(ACC_LANES),
        }
    }

    /// Bytes of the canonical copy (whole groups, unused lanes zero).
    pub fn canonical_len(&self) -> usize {
        self.groups * self.spec.group_bytes()
    }

    /// Entries of the per-block arrays (whole groups, unused lanes zero).
    pub fn padded_blocks(&self) -> usize {
        self.groups * ACC_LANES
    }
}

/// One quantized activation vector: natural-order codes (scalar path), the canonical copy
/// (SIMD paths), and per block the scale and `offset * sum(q)`.
#[derive(Debug, Clone, Default)]
pub struct QuantAct {
    /// Codes in natural order (`n`).
    pub q: Vec<i8>,
    /// Codes in canonical order (`ActShape::canonical_len`).
    pub canonical: Vec<i8>,
    /// f32 scale per block (padded with zeros to whole groups).
    pub scale: Vec<f32>,
    /// `offset * sum(q)` per block, i32 (padded with zeros).
    pub offset: Vec<i32>,
}

/// Raw, shareable pointers into a [`QuantAct`], so that threads can fill disjoint blocks.
#[derive(Debug, Clone, Copy)]
pub struct QuantActPtr {
    q: *mut i8,
    canonical: *mut i8,
    scale: *mut f32,
    offset: *mut i32,
    shape: ActShape,
    format: ExpertFormat,
}

// SAFETY: the pointers are only written through `write_blocks`, whose callers guarantee that
// concurrent writers touch disjoint blocks, and the target outlives every writer.
unsafe impl Send for QuantActPtr {}
unsafe impl Sync for QuantActPtr {}

impl QuantAct {
    /// Resize (zero-filled) for `shape`.
    pub fn reset(&mut self, shape: &ActShape) {
        self.q.clear();
        self.q.resize(shape.n, 0);
        self.canonical.clear();
        self.canonical.resize(shape.canonical_len(), 0);
        self.scale.clear();
        self.scale.resize(shape.padded_blocks(), 0.0);
        self.offset.clear();
        self.offset.resize(shape.padded_blocks(), 0);
    }

    /// Quantize `x` for `format` (which must have an int8 path).
    pub fn quantize(format: ExpertFormat, x: &[f32]) -> QuantAct {
        let spec = W4a8Spec::of(format).expect("format has an int8 activation path");
        let shape = ActShape::new(spec, x.len());
        let mut a = QuantAct::default();
        a.reset(&shape);
        let p = a.ptr(format, &shape);
        // SAFETY: `a` was sized for `shape` and is written by this thread only.
        unsafe { p.write_blocks(0, x) };
        a
    }

    /// Raw pointers for filling blocks from several threads; `self` must be `reset(shape)`.
    pub fn ptr(&mut self, format: ExpertFormat, shape: &ActShape) -> QuantActPtr {
        debug_assert_eq!(self.q.len(), shape.n);
        QuantActPtr {
            q: self.q.as_mut_ptr(),
            canonical: self.canonical.as_mut_ptr(),
            scale: self.scale.as_mut_ptr(),
            offset: self.offset.as_mut_ptr(),
            shape: *shape,
            format,
        }
    }
}

impl QuantActPtr {
    /// Quantize `x` (whole blocks) into blocks `b0, b0 + 1, ...` (module docs, section 2).
    ///
    /// # Safety
    /// The target `QuantAct` must be alive and `reset` for this shape; no other thread may
    /// write or read the same blocks concurrently; `b0 + x.len() / G <= blocks`.
    pub unsafe fn write_blocks(&self, b0: usize, x: &[f32]) {
        #[cfg(target_arch = "x86_64")]
        if std::is_x86_feature_detected!("avx2") {
            // The same IEEE operations, auto-vectorized with AVX2 (Rust never contracts to FMA).
            return self.write_blocks_avx2(b0, x);
        }
        self.write_blocks_body(b0, x)
    }

    /// [`QuantActPtr::write_blocks`] compiled for AVX2.
    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx2")]
    unsafe fn write_blocks_avx2(&self, b0: usize, x: &[f32]) {
        self.write_blocks_body(b0, x)
    }

    #[inline(always)]
    unsafe fn write_blocks_body(&self, b0: usize, x: &[f32]) {
        let g = self.shape.spec.group;
        debug_assert!(x.len().is_multiple_of(g) && b0 + x.len() / g <= self.shape.blocks);
        let mut canon_pos = [0usize; 32];
        for k in 0..g / 4 {
            for j in 0..4 {
                canon_pos[canonical_element(self.format, k, j)] = k * 64 + j;
            }
        }
        for (i, xb) in x.chunks_exact(g).enumerate() {
            let b = b0 + i;
            // max |x| on the bit patterns: for non-negative floats integer order is float order.
            let a = f32::from_bits(
                xb.iter()
                    .map(|v| v.to_bits() & 0x7FFF_FFFF)
                    .max()
                    .unwrap_or(0),
            );
            let (scale, inv) = if a > 0.0 {
                (a / Q_MAX, Q_MAX / a)
            } else {
                (0.0, 0.0)
            };
            let base = (b / ACC_LANES) * self.shape.spec.group_bytes() + (b % ACC_LANES) * 4;
            // Codes first in a simple loop (vectorizable), then the scatter to canonical order.
            let mut qb = [0i8; 32];
            for (q, &v) in qb.iter_mut().zip(xb) {
                *q = round_half_away(v * inv).clamp(-Q_MAX, Q_MAX) as i8;
            }
            let mut sum = 0i32;
            for (e, &q) in qb[..g].iter().enumerate() {
                sum += q as i32;
                *self.q.add(b * g + e) = q;
                *self.canonical.add(base + canon_pos[e]) = q;
            }
            *self.scale.add(b) = scale;
            *self.offset.add(b) = self.shape.spec.offset * sum;
        }
    }
}

/// A row's integer weights and block factors in natural order (section 1), for the scalar
/// path: `w` per column, `s_b` per block, and `f_r`.
pub fn row_integers(format: ExpertFormat, row: &RowRef<'_>, w: &mut [i8], s: &mut [f32]) -> f32 {
    match format {
        ExpertFormat::Bf16 => panic!("bf16 has no int8 path"),
        ExpertFormat::Ggml(_) => unreachable!(
            "{} has no kernel in ft (MatrixLayout::new refuses it)",
            format
        ),
        ExpertFormat::Int8 => {
            for (o, &q) in w.iter_mut().zip(row.values) {
                *o = q as i8;
            }
            s.fill(1.0);
            row.row_scale
        }
        ExpertFormat::Q4_0 => {
            for (b, blk) in row.values.chunks_exact(18).enumerate() {
                s[b] = f16::from_le_bytes([blk[0], blk[1]]).to_f32();
                for j in 0..16 {
                    w[32 * b + j] = (blk[2 + j] & 15) as i8 - 8;
                    w[32 * b + j + 16] = (blk[2 + j] >> 4) as i8 - 8;
                }
            }
            1.0
        }
        ExpertFormat::Nvfp4 | ExpertFormat::Mxfp4 => {
            for (i, &byte) in row.values.iter().enumerate() {
                w[2 * i] = (2.0 * e2m1_to_f32(byte & 15)) as i8;
                w[2 * i + 1] = (2.0 * e2m1_to_f32(byte >> 4)) as i8;
            }
            if format == ExpertFormat::Nvfp4 {
                for (o, &b) in s.iter_mut().zip(row.block_scales) {
                    *o = e4m3_to_f32(b);
                }
                row.row_scale * 0.5
            } else {
                for (o, &b) in s.iter_mut().zip(row.block_scales) {
                    *o = e8m0_to_f32(b);
                }
                0.5
            }
        }
    }
}

/// Section 3 on integer weights: the dot product of one row with one quantized vector.
pub fn dot_integers(group: usize, w: &[i8], s: &[f32], f_r: f32, act: &QuantAct) -> f32 {
    let mut acc = [0f32; ACC_LANES];
    for (b, (wb, qb)) in w
        .chunks_exact(group)
        .zip(act.q.chunks_exact(group))
        .enumerate()
    {
        let d: i32 = wb.iter().zip(qb).map(|(&a, &c)| a as i32 * c as i32).sum();
        let sb = s[b] * act.scale[b];
        let t = d as f32 * sb;
        acc[b % ACC_LANES] += t;
    }
    reduce16(&acc) * f_r
}

/// The scalar int8-path dot product of `row` with `act` (sections 1 and 3), using `w` and
/// `s` as scratch (at least `cols` and `cols / G` long).
pub fn dot_row_scalar(
    format: ExpertFormat,
    row: &RowRef<'_>,
    act: &QuantAct,
    w: &mut [i8],
    s: &mut [f32],
) -> f32 {
    let spec = W4a8Spec::of(format).expect("format has an int8 path");
    let n = act.q.len();
    let f_r = row_integers(format, row, &mut w[..n], &mut s[..n / spec.group]);
    dot_integers(spec.group, &w[..n], &s[..n / spec.group], f_r, act)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// PTX `prmt.b32` in its default mode: byte `n` of the result is byte `(c >> 4n) & 7` of
    /// the eight bytes `b:a`, or, where bit 3 of that nibble is set, that byte's sign bit
    /// replicated over all eight bits (the PTX ISA's definition).
    fn prmt(a: u32, b: u32, c: u32) -> u32 {
        let bytes = ((b as u64) << 32 | a as u64).to_le_bytes();
        (0..4).fold(0u32, |d, n| {
            let sel = (c >> (4 * n)) & 15;
            let byte = bytes[(sel & 7) as usize];
            let out = if sel & 8 != 0 {
                if byte & 0x80 != 0 {
                    0xFF
                } else {
                    0
                }
            } else {
                byte
            };
            d | (out as u32) << (8 * n)
        })
    }

    /// The CUDA kernels' split-sign dot of e2m1 codes (`e2m1_dot8` in
    /// `kernels/cuda/experts.cu`, FT_E2M1_SPLIT): two magnitude lookups with prmt and two
    /// dp4a give the integer dot of the decoded weights, for every code and every activation
    /// byte. This checks the algorithm against the definition of prmt; the GPU tests check
    /// the hardware.
    #[test]
    fn the_split_sign_e2m1_dot_equals_the_decoded_dot() {
        let dp4a = |a: u32, b: u32| -> i32 {
            (0..4)
                .map(|k| (a >> (8 * k)) as u8 as i8 as i32 * (b >> (8 * k)) as u8 as i8 as i32)
                .sum()
        };
        let decoded = |code: u32| (2.0 * e2m1_to_f32(code as u8)) as i32;
        let (lo, hi) = (0x0302_0100u32, 0x0C08_0604u32);
        let mut rng = 0x9E37_79B9_7F4A_7C15u64;
        let mut next = move || {
            rng ^= rng << 13;
            rng ^= rng >> 7;
            rng ^= rng << 17;
            rng as u32
        };
        // Every 4-code selector, against several activation words (extremes included).
        for sel in 0..=0xFFFFu32 {
            for x in [0x8080_8080u32, 0x7F7F_7F7F, 0x0181_FF7F, next(), next()] {
                let p = prmt(lo, hi, sel);
                let q = prmt(lo, hi, sel ^ 0x8888);
                let want: i32 = (0..4)
                    .map(|k| decoded((sel >> (4 * k)) & 15) * ((x >> (8 * k)) as u8 as i8 as i32))
                    .sum();
                assert_eq!(dp4a(p, x) - dp4a(q, x), want, "codes {sel:04x}, x {x:08x}");
            }
        }
    }

    #[test]
    fn exp_ft_is_accurate_and_silu_is_silu() {
        let mut worst = 0f64;
        let mut v = -87.0f32;
        while v < 88.0 {
            let rel = (exp_ft(v) as f64 / (v as f64).exp() - 1.0).abs();
            worst = worst.max(rel);
            v += 0.0137;
        }
        assert!(
            worst < 4.0 * f32::EPSILON as f64,
            "exp_ft worst relative error {worst}"
        );
        assert_eq!(exp_ft(0.0), 1.0);
        assert_eq!(exp_ft(-1000.0), exp_ft(-87.0));
        // The libm-free rounding helpers agree with libm everywhere that matters.
        let mut v = -300.0f32;
        while v < 300.0 {
            for w in [v, v + 0.5, v - 0.5, f32::from_bits(v.to_bits() + 1)] {
                assert_eq!(round_half_away(w), w.round(), "round({w})");
                assert_eq!(floor_exact(w), w.floor(), "floor({w})");
            }
            v += 0.123;
        }
        for w in [
            0.49999997f32,
            -0.49999997,
            0.5,
            -0.5,
            2.5,
            -2.5,
            126.5,
            8388607.5,
        ] {
            assert_eq!(round_half_away(w), w.round(), "round({w})");
        }
        for v in [-20.0f32, -1.0, 0.0, 0.5, 3.0, 30.0] {
            let want = v as f64 / (1.0 + (-v as f64).exp());
            assert!(
                (silu(v) as f64 - want).abs() <= 1e-6 * want.abs().max(1e-3),
                "silu({v})"
            );
        }
    }

    #[test]
    fn quantization_follows_the_spec() {
        let mut x: Vec<f32> = (0..64).map(|i| (i as f32 - 20.5) * 0.1).collect();
        x[40..48].fill(0.0); // block 2 of 16 (nvfp4) has zeros
        x[32..48].fill(0.0);
        let a = QuantAct::quantize(ExpertFormat::Nvfp4, &x);
        assert_eq!(a.scale.len(), 16);
        assert_eq!(a.scale[2], 0.0);
        assert!(a.q[32..48].iter().all(|&q| q == 0));
        // Block 0: max |x| = 2.05 at x[0] -> q = -127.
        assert_eq!(a.q[0], -127);
        assert_eq!(a.scale[0], 2.05f32 / 127.0);
        let inv = 127.0 / 2.05f32;
        for (q, v) in a.q.iter().zip(&x).take(16) {
            assert_eq!(*q as f32, (v * inv).round().clamp(-127.0, 127.0));
        }
        let sum: i32 = a.q[..16].iter().map(|&q| q as i32).sum();
        assert_eq!(a.offset[0], 12 * sum);
        // Canonical order is a permutation of each block.
        for f in [
            ExpertFormat::Nvfp4,
            ExpertFormat::Mxfp4,
            ExpertFormat::Q4_0,
            ExpertFormat::Int8,
        ] {
            let g = W4a8Spec::of(f).unwrap().group;
            let mut seen = vec![false; g];
            for k in 0..g / 4 {
                for j in 0..4 {
                    seen[canonical_element(f, k, j)] = true;
                }
            }
            assert!(seen.iter().all(|&s| s), "{f}");
            let a = QuantAct::quantize(f, &x);
            for (e, &q) in a.q.iter().enumerate() {
                let (b, i) = (e / g, e % g);
                let pos = (0..g)
                    .find(|&p| canonical_element(f, p / 4, p % 4) == i)
                    .unwrap();
                let c = (b / 16) * 16 * g + (pos / 4) * 64 + (b % 16) * 4 + pos % 4;
                assert_eq!(a.canonical[c], q, "{f} element {e}");
            }
        }
    }

    #[test]
    fn scalar_dot_matches_f64_on_integers() {
        // With exactly representable activations the spec's dot is the exact dot up to f32
        // rounding of a few sums.
        let f = ExpertFormat::Nvfp4;
        let cols = 512;
        let x: Vec<f32> = (0..cols).map(|i| ((i * 37) % 255) as f32 - 127.0).collect();
        let w: Vec<f32> = (0..cols)
            .map(|i| ((i * 11) % 13) as f32 * 0.25 - 1.5)
            .collect();
        let enc = crate::codec::encode(f, 1, cols, &w).unwrap();
        let dec = crate::codec::decode(f, 1, cols, &enc).unwrap();
        let l = crate::codec::MatrixLayout::new(f, 1, cols).unwrap();
        let act = QuantAct::quantize(f, &x);
        let (mut wi, mut s) = (vec![0i8; cols], vec![0f32; cols]);
        let got = dot_row_scalar(f, &l.row(&enc, 0), &act, &mut wi, &mut s) as f64;
        let xq: Vec<f64> = act
            .q
            .iter()
            .enumerate()
            .map(|(i, &q)| q as f64 * act.scale[i / 16] as f64)
            .collect();
        let want: f64 = dec.iter().zip(&xq).map(|(&a, &b)| a as f64 * b).sum();
        assert!((got - want).abs() <= 1e-5 * want.abs(), "{got} vs {want}");
    }
}
