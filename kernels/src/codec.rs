//! Byte layouts of one weight matrix per [`ExpertFormat`], with encoders (quantize from f32)
//! and decoders (dequantize to f32).
//!
//! The CPU kernels, the GPU kernels and the host banks all read the bytes written here, so
//! the layout below is a contract. All multi-byte numbers are little-endian. A matrix is
//! `rows x cols` (row `r` is output `r`, column `c` multiplies input `c`); every format
//! blocks along the columns, and every size is exactly
//! [`ExpertFormat::matrix_bytes`]`(rows, cols)` (a test checks it).
//!
//! Offsets below are in bytes from the start of the matrix; `R = rows`, `C = cols`.
//!
//! | format | plane | offset | size | row `r` at | content |
//! |---|---|---|---|---|---|
//! | `bf16` | values | 0 | `2RC` | `2Cr` | bf16 weights, column order |
//! | `int8` | values | 0 | `RC` | `Cr` | i8 weights `q`, column order |
//! | `int8` | row scales | `RC` | `4R` | `RC + 4r` | f32 `d_r`; weight = `q * d_r` |
//! | `q4_0` | blocks | 0 | `18RC/32` | `18(C/32)r` | llama.cpp `block_q4_0` array, see below |
//! | `nvfp4` | values | 0 | `RC/2` | `(C/2)r` | e2m1 codes, two per byte, see below |
//! | `nvfp4` | block scales | `RC/2` | `RC/16` | `RC/2 + (C/16)r` | e4m3 `s_b`, one per 16 columns |
//! | `nvfp4` | row scales | `RC/2 + RC/16` | `2R` | `... + 2r` | f16 `t_r`; weight = `e2m1 * s_b * t_r` |
//! | `mxfp4` | values | 0 | `RC/2` | `(C/2)r` | e2m1 codes, two per byte, see below |
//! | `mxfp4` | block scales | `RC/2` | `RC/32` | `RC/2 + (C/32)r` | e8m0 `E_b`; weight = `e2m1 * 2^(E_b - 127)` |
//!
//! - **e2m1 packing** (`nvfp4`, `mxfp4`): byte `i` of a row holds column `2i` in its low
//!   nibble and column `2i + 1` in its high nibble (the OCP MX / NVIDIA order). A nibble is
//!   `s e1 e0 m`: sign bit 3; magnitudes by the low three bits are
//!   `0, 0.5, 1, 1.5, 2, 3, 4, 6` ([`E2M1_VALUES`]).
//! - **e4m3** (`nvfp4` block scales): OCP FP8 E4M3 (bias 7, no infinities, `0x7f` NaN,
//!   largest finite 448, subnormals `m * 2^-9`). Encoders write only non-negative finite codes.
//! - **e8m0** (`mxfp4` block scales): a biased exponent, value `2^(E - 127)`; `255` is NaN
//!   and is never written.
//! - **q4_0 block** (18 bytes, llama.cpp compatible): f16 `d` (2 bytes), then 16 bytes `qs`;
//!   column `j < 16` of the block is `qs[j] & 15`, column `j + 16` is `qs[j] >> 4`, and the
//!   weight is `(q - 8) * d`.
//!
//! Planes (values apart from scales) keep every row's values contiguous and 64-byte friendly
//! for SIMD loads and coalesced GPU loads; `q4_0` keeps llama.cpp's interleaved blocks so that
//! its bytes can be shared with GGUF files.
//!
//! Error bounds of the encoders (per element, `x` the input, `x'` the decoded value; tested):
//! - `bf16`: round to nearest even (8 significant bits), `|x - x'| <= 2^-8 |x|` (normal range).
//! - `int8`: `d_r = max|x| / 127`, `q = round(x / d_r)`: `|x - x'| <= d_r / 2` (plus f32 rounding).
//! - `q4_0` (llama.cpp's reference quantizer): `d = m / -8` with `m` the element of largest
//!   magnitude; codes reach `-8d` on `m`'s side but only `7d` on the other, so
//!   `|x - x'| <= |d| / 2 + max(0, |x| - 7.5|d|) + 8 |d - f16(d)|` (at most `|d|`).
//! - `nvfp4`: `t_r = f16(max|x| / 96)` (at least the smallest normal f16), so block scales stay
//!   below 16 and clear of e4m3 subnormals; `s_b = e4m3(max_b|x| / (6 t_r))`, codes round
//!   to nearest (ties to even code); with the block step `u = s_b t_r`:
//!   `|x - x'| <= u + max(0, |x| - 6u)` (half the largest gap, 2u, plus clipping at `6u`).
//! - `mxfp4` (OCP recipe): `E = floor(log2 max_b|x|) - 2 + 127`, step `u = 2^(E - 127)`:
//!   `|x - x'| <= u + max(0, |x| - 6u)` (the recipe clips values between `6u` and `8u`).

use half::{bf16, f16};

use ft_model::ExpertFormat;

use crate::error::{KernelError, Result};

/// Magnitudes of the eight e2m1 codes `0..8` (bit 3 is the sign).
pub const E2M1_VALUES: [f32; 8] = [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0];

/// Largest finite e4m3 value.
pub const E4M3_MAX: f32 = 448.0;

/// Largest e2m1 magnitude.
pub const E2M1_MAX: f32 = 6.0;

/// `nvfp4` row scale divisor: the row scale is `max|x| / NVFP4_ROW_DIVISOR`, which puts the
/// largest block scale at `NVFP4_ROW_DIVISOR / 6 = 16` (e4m3 normals reach down to `2^-6`, so
/// a block 1000x smaller than the row's largest still keeps three mantissa bits), while the
/// f16 row scale stays normal for rows with `max|x| > 96 * 2^-14`.
pub const NVFP4_ROW_DIVISOR: f32 = 96.0;

/// Decode one e2m1 nibble (low 4 bits of `n`).
#[inline]
pub fn e2m1_to_f32(n: u8) -> f32 {
    let m = E2M1_VALUES[(n & 7) as usize];
    if n & 8 != 0 {
        -m
    } else {
        m
    }
}

/// Nearest e2m1 code of `v` (already divided by the block step), clipping at 6; ties go to
/// the even code (round half to even on the e2m1 grid).
#[inline]
pub fn f32_to_e2m1(v: f32) -> u8 {
    let a = v.abs();
    // Midpoints of the grid; `<=` at the midpoint keeps the even (lower) code, `<` the
    // odd code's upper midpoint goes to the next even code.
    let code = if a <= 0.25 {
        0
    } else if a < 0.75 {
        1
    } else if a <= 1.25 {
        2
    } else if a < 1.75 {
        3
    } else if a <= 2.5 {
        4
    } else if a < 3.5 {
        5
    } else if a <= 5.0 {
        6
    } else {
        7
    };
    // NaN compares false everywhere above and lands on 7; encoders never pass NaN scales.
    if v.is_sign_negative() && code != 0 {
        code | 8
    } else {
        code
    }
}

/// Decode an OCP e4m3 byte exactly.
#[inline]
pub fn e4m3_to_f32(b: u8) -> f32 {
    let mag = b & 0x7F;
    if mag == 0x7F {
        return f32::NAN;
    }
    let (e, m) = ((mag >> 3) as u32, (mag & 7) as u32);
    let v = if e == 0 {
        // Subnormal: m * 2^-9.
        m as f32 * (1.0 / 512.0)
    } else {
        // 2^(e - 7) * (1 + m / 8): rebias the exponent (127 - 7 = 120), widen the mantissa.
        f32::from_bits(((e + 120) << 23) | (m << 20))
    };
    if b & 0x80 != 0 {
        -v
    } else {
        v
    }
}

/// Nearest non-negative e4m3 code of `v >= 0` (round to nearest, ties to even code),
/// saturating at 448.
pub fn f32_to_e4m3(v: f32) -> u8 {
    if v.is_nan() || v <= 0.0 {
        return 0;
    }
    if v >= E4M3_MAX {
        return 0x7E;
    }
    // Codes 0..=0x7E are monotonic in value: binary search the bracketing pair.
    let (mut lo, mut hi) = (0u8, 0x7Eu8);
    while hi - lo > 1 {
        let mid = (lo + hi) / 2;
        if e4m3_to_f32(mid) <= v {
            lo = mid;
        } else {
            hi = mid;
        }
    }
    let (a, b) = (e4m3_to_f32(lo), e4m3_to_f32(hi));
    if v - a < b - v || (v - a == b - v && lo % 2 == 0) {
        lo
    } else {
        hi
    }
}

/// Decode an e8m0 byte: `2^(e - 127)`, NaN for 255.
#[inline]
pub fn e8m0_to_f32(e: u8) -> f32 {
    match e {
        255 => f32::NAN,
        // 2^-127 is an f32 subnormal: its bit pattern is the mantissa's top bit.
        0 => f32::from_bits(0x0040_0000),
        e => f32::from_bits((e as u32) << 23),
    }
}

/// Where the planes of one matrix lie (byte offsets and strides; see the module docs).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MatrixLayout {
    /// Format of the matrix.
    pub format: ExpertFormat,
    /// Rows (outputs).
    pub rows: usize,
    /// Columns (inputs).
    pub cols: usize,
    /// Bytes of one row in the values (or, for `q4_0`, blocks) plane.
    pub values_row_bytes: usize,
    /// Offset of the block-scale plane (bytes); 0 where the format has none.
    pub block_scales_offset: usize,
    /// Bytes of one row in the block-scale plane; 0 where the format has none.
    pub block_scales_row_bytes: usize,
    /// Offset of the per-row scale plane (bytes); 0 where the format has none.
    pub row_scales_offset: usize,
    /// Total bytes (equals `ExpertFormat::matrix_bytes`).
    pub bytes: usize,
}

/// One row's bytes, split by plane.
#[derive(Debug, Clone, Copy)]
pub struct RowRef<'a> {
    /// The row's values (for `q4_0`, its 18-byte blocks).
    pub values: &'a [u8],
    /// The row's block scales (e4m3 or e8m0 bytes); empty where the format has none.
    pub block_scales: &'a [u8],
    /// The row scale (f32 of the stored f32/f16); 1.0 where the format has none.
    pub row_scale: f32,
}

impl MatrixLayout {
    /// The layout of a `rows x cols` matrix; errors if `cols` cannot be blocked by `format`.
    pub fn new(format: ExpertFormat, rows: usize, cols: usize) -> Result<Self> {
        if !format.has_kernel() {
            return Err(KernelError::invalid(
                "format",
                format!("ft has no kernel for {format}: it is sized and predicted, not run"),
            ));
        }
        format.check_cols("cols", cols)?;
        if rows == 0 {
            return Err(KernelError::invalid("rows", "must be greater than zero"));
        }
        let (r, c) = (rows, cols);
        let (values_row_bytes, bso, bsr, rso) = match format {
            ExpertFormat::Bf16 => (2 * c, 0, 0, 0),
            ExpertFormat::Int8 => (c, 0, 0, r * c),
            ExpertFormat::Q4_0 => (c / 32 * 18, 0, 0, 0),
            ExpertFormat::Nvfp4 => (c / 2, r * c / 2, c / 16, r * c / 2 + r * c / 16),
            ExpertFormat::Mxfp4 => (c / 2, r * c / 2, c / 32, 0),
            ExpertFormat::Ggml(_) => unreachable!("refused above"),
        };
        let bytes = format.matrix_bytes(rows, cols) as usize;
        Ok(MatrixLayout {
            format,
            rows,
            cols,
            values_row_bytes,
            block_scales_offset: bso,
            block_scales_row_bytes: bsr,
            row_scales_offset: rso,
            bytes,
        })
    }

    /// Check that `bytes` holds exactly one matrix of this layout.
    pub fn check(&self, what: &str, bytes: &[u8]) -> Result<()> {
        if bytes.len() != self.bytes {
            return Err(KernelError::size(what, self.bytes as u64, bytes.len()));
        }
        Ok(())
    }

    /// Row `r` of the matrix in `bytes` (which must be `self.bytes` long).
    #[inline]
    pub fn row<'a>(&self, bytes: &'a [u8], r: usize) -> RowRef<'a> {
        let v0 = r * self.values_row_bytes;
        let values = &bytes[v0..v0 + self.values_row_bytes];
        let block_scales = if self.block_scales_row_bytes > 0 {
            let s0 = self.block_scales_offset + r * self.block_scales_row_bytes;
            &bytes[s0..s0 + self.block_scales_row_bytes]
        } else {
            &[]
        };
        let row_scale = match self.format {
            ExpertFormat::Int8 => {
                let o = self.row_scales_offset + 4 * r;
                f32::from_le_bytes([bytes[o], bytes[o + 1], bytes[o + 2], bytes[o + 3]])
            }
            ExpertFormat::Nvfp4 => {
                let o = self.row_scales_offset + 2 * r;
                f16::from_le_bytes([bytes[o], bytes[o + 1]]).to_f32()
            }
            _ => 1.0,
        };
        RowRef {
            values,
            block_scales,
            row_scale,
        }
    }
}

/// Decode one row to f32 (exact: every format's value is representable in f32).
pub fn decode_row(format: ExpertFormat, row: &RowRef<'_>, out: &mut [f32]) {
    match format {
        ExpertFormat::Ggml(_) => unreachable!(
            "{} has no kernel in ft (MatrixLayout::new refuses it)",
            format
        ),
        ExpertFormat::Bf16 => {
            for (o, b) in out.iter_mut().zip(row.values.chunks_exact(2)) {
                *o = bf16::from_le_bytes([b[0], b[1]]).to_f32();
            }
        }
        ExpertFormat::Int8 => {
            for (o, &q) in out.iter_mut().zip(row.values) {
                *o = q as i8 as f32 * row.row_scale;
            }
        }
        ExpertFormat::Q4_0 => {
            for (o, blk) in out.chunks_exact_mut(32).zip(row.values.chunks_exact(18)) {
                let d = f16::from_le_bytes([blk[0], blk[1]]).to_f32();
                for j in 0..16 {
                    let q = blk[2 + j];
                    o[j] = ((q & 15) as i32 - 8) as f32 * d;
                    o[j + 16] = ((q >> 4) as i32 - 8) as f32 * d;
                }
            }
        }
        ExpertFormat::Nvfp4 | ExpertFormat::Mxfp4 => {
            let g = format.block_len();
            for (b, o) in out.chunks_exact_mut(g).enumerate() {
                let s = if format == ExpertFormat::Nvfp4 {
                    e4m3_to_f32(row.block_scales[b]) * row.row_scale
                } else {
                    e8m0_to_f32(row.block_scales[b])
                };
                let bytes = &row.values[b * g / 2..(b + 1) * g / 2];
                for (pair, &q) in o.chunks_exact_mut(2).zip(bytes) {
                    pair[0] = e2m1_to_f32(q & 15) * s;
                    pair[1] = e2m1_to_f32(q >> 4) * s;
                }
            }
        }
    }
}

/// Check an f32 matrix argument's length.
fn check_f32(what: &str, rows: usize, cols: usize, data: &[f32]) -> Result<()> {
    if data.len() != rows * cols {
        return Err(KernelError::size(what, (rows * cols) as u64, data.len()));
    }
    if let Some(i) = data.iter().position(|v| !v.is_finite()) {
        return Err(KernelError::invalid(
            what,
            format!("element {i} is {} (weights must be finite)", data[i]),
        ));
    }
    Ok(())
}

/// Quantize a row-major `rows x cols` f32 matrix into a new buffer.
pub fn encode(format: ExpertFormat, rows: usize, cols: usize, data: &[f32]) -> Result<Vec<u8>> {
    let layout = MatrixLayout::new(format, rows, cols)?;
    let mut out = vec![0u8; layout.bytes];
    encode_into(format, rows, cols, data, &mut out)?;
    Ok(out)
}

/// Quantize a row-major `rows x cols` f32 matrix into `out` (exactly `matrix_bytes` long).
pub fn encode_into(
    format: ExpertFormat,
    rows: usize,
    cols: usize,
    data: &[f32],
    out: &mut [u8],
) -> Result<()> {
    let l = MatrixLayout::new(format, rows, cols)?;
    check_f32("weights", rows, cols, data)?;
    l.check("encoded matrix", out)?;
    for (r, x) in data.chunks_exact(cols).enumerate() {
        encode_row(&l, r, x, out);
    }
    Ok(())
}

/// Encode row `r` (f32 values `x`) into its places in `out`.
fn encode_row(l: &MatrixLayout, r: usize, x: &[f32], out: &mut [u8]) {
    let vrow = r * l.values_row_bytes;
    match l.format {
        ExpertFormat::Ggml(_) => unreachable!(
            "{} has no kernel in ft (MatrixLayout::new refuses it)",
            l.format
        ),
        ExpertFormat::Bf16 => {
            for (c, &v) in x.iter().enumerate() {
                out[vrow + 2 * c..vrow + 2 * c + 2]
                    .copy_from_slice(&bf16::from_f32(v).to_le_bytes());
            }
        }
        ExpertFormat::Int8 => {
            let amax = x.iter().fold(0f32, |m, v| m.max(v.abs()));
            let d = amax / 127.0;
            let inv = if d > 0.0 { 1.0 / d } else { 0.0 };
            for (c, &v) in x.iter().enumerate() {
                out[vrow + c] = (v * inv).round().clamp(-127.0, 127.0) as i8 as u8;
            }
            let o = l.row_scales_offset + 4 * r;
            out[o..o + 4].copy_from_slice(&d.to_le_bytes());
        }
        ExpertFormat::Q4_0 => {
            // llama.cpp `quantize_row_q4_0_ref`.
            for (b, xb) in x.chunks_exact(32).enumerate() {
                let (mut amax, mut max) = (0f32, 0f32);
                for &v in xb {
                    if amax < v.abs() {
                        amax = v.abs();
                        max = v;
                    }
                }
                let d = max / -8.0;
                let id = if d != 0.0 { 1.0 / d } else { 0.0 };
                let o = vrow + 18 * b;
                out[o..o + 2].copy_from_slice(&f16::from_f32(d).to_le_bytes());
                for j in 0..16 {
                    let q0 = ((xb[j] * id + 8.5) as i8).min(15) as u8;
                    let q1 = ((xb[j + 16] * id + 8.5) as i8).min(15) as u8;
                    out[o + 2 + j] = q0 | (q1 << 4);
                }
            }
        }
        ExpertFormat::Nvfp4 => {
            let amax = x.iter().fold(0f32, |m, v| m.max(v.abs()));
            let t = if amax > 0.0 {
                f16::from_f32(amax / NVFP4_ROW_DIVISOR).max(f16::MIN_POSITIVE)
            } else {
                f16::ZERO
            };
            let tf = t.to_f32();
            let o = l.row_scales_offset + 2 * r;
            out[o..o + 2].copy_from_slice(&t.to_le_bytes());
            for (b, xb) in x.chunks_exact(16).enumerate() {
                let bmax = xb.iter().fold(0f32, |m, v| m.max(v.abs()));
                let s = if tf > 0.0 {
                    f32_to_e4m3(bmax / E2M1_MAX / tf)
                } else {
                    0
                };
                out[l.block_scales_offset + r * l.block_scales_row_bytes + b] = s;
                let u = e4m3_to_f32(s) * tf;
                let inv = if u > 0.0 { 1.0 / u } else { 0.0 };
                for j in 0..8 {
                    let lo = f32_to_e2m1(xb[2 * j] * inv);
                    let hi = f32_to_e2m1(xb[2 * j + 1] * inv);
                    out[vrow + 8 * b + j] = lo | (hi << 4);
                }
            }
        }
        ExpertFormat::Mxfp4 => {
            for (b, xb) in x.chunks_exact(32).enumerate() {
                let bmax = xb.iter().fold(0f32, |m, v| m.max(v.abs()));
                let e = if bmax > 0.0 {
                    // floor(log2(bmax)) from the f32 exponent (bmax is normal or subnormal).
                    let lg = bmax.log2().floor() as i32;
                    (lg - 2 + 127).clamp(0, 254) as u8
                } else {
                    0
                };
                out[l.block_scales_offset + r * l.block_scales_row_bytes + b] = e;
                let u = e8m0_to_f32(e);
                for j in 0..16 {
                    // Divide rather than multiply by 1/u: 1/2^-127 overflows f32.
                    let lo = f32_to_e2m1(xb[2 * j] / u);
                    let hi = f32_to_e2m1(xb[2 * j + 1] / u);
                    out[vrow + 16 * b + j] = lo | (hi << 4);
                }
            }
        }
    }
}

/// Dequantize a whole `rows x cols` matrix to row-major f32.
pub fn decode(format: ExpertFormat, rows: usize, cols: usize, bytes: &[u8]) -> Result<Vec<f32>> {
    let l = MatrixLayout::new(format, rows, cols)?;
    l.check("encoded matrix", bytes)?;
    let mut out = vec![0f32; rows * cols];
    for (r, o) in out.chunks_exact_mut(cols).enumerate() {
        decode_row(format, &l.row(bytes, r), o);
    }
    Ok(out)
}

/// The documented per-element error bound of `format` for element `c` of row `r`, given the
/// original row `x` and the encoded matrix (the bound depends on the scales chosen).
pub fn error_bound(l: &MatrixLayout, bytes: &[u8], r: usize, x: &[f32], c: usize) -> f32 {
    let row = l.row(bytes, r);
    let v = x[c].abs();
    // Slack for the f32 rounding of the products inside the encoder and decoder.
    let slack = 4.0 * f32::EPSILON * v;
    match l.format {
        ExpertFormat::Ggml(_) => unreachable!(
            "{} has no kernel in ft (MatrixLayout::new refuses it)",
            l.format
        ),
        ExpertFormat::Bf16 => v * 2f32.powi(-8) + f32::MIN_POSITIVE,
        ExpertFormat::Int8 => row.row_scale / 2.0 * (1.0 + 1e-5) + slack,
        ExpertFormat::Q4_0 => {
            let blk = &row.values[18 * (c / 32)..];
            let d16 = f16::from_le_bytes([blk[0], blk[1]]).to_f32().abs();
            // d itself (before f16 rounding) is within 2^-11 of d16.
            d16 / 2.0 * (1.0 + 2f32.powi(-10))
                + (v - 7.5 * d16).max(0.0)
                + 8.0 * d16 * 2f32.powi(-10)
                + slack
        }
        ExpertFormat::Nvfp4 | ExpertFormat::Mxfp4 => {
            let b = c / l.format.block_len();
            let u = if l.format == ExpertFormat::Nvfp4 {
                e4m3_to_f32(row.block_scales[b]) * row.row_scale
            } else {
                e8m0_to_f32(row.block_scales[b])
            };
            u + (v - E2M1_MAX * u).max(0.0) + slack
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::{Rng, SeedableRng};

    fn random(rows: usize, cols: usize, seed: u64) -> Vec<f32> {
        let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
        (0..rows * cols)
            .map(|i| {
                // Rows of very different magnitudes, and a few blocks of zeros.
                let row_mag = 10f32.powi((i / cols) as i32 % 5 - 3);
                if (i / 32) % 17 == 3 {
                    0.0
                } else {
                    (rng.random::<f32>() * 2.0 - 1.0) * row_mag
                }
            })
            .collect()
    }

    #[test]
    fn sizes_agree_with_the_model() {
        for f in ExpertFormat::ALL {
            for (r, c) in [(1, 32), (4, 64), (7, 2560), (3, 640)] {
                let l = MatrixLayout::new(f, r, c).unwrap();
                assert_eq!(l.bytes as u64, f.matrix_bytes(r, c), "{f} {r}x{c}");
                let enc = encode(f, r, c, &random(r, c, 1)).unwrap();
                assert_eq!(enc.len() as u64, f.matrix_bytes(r, c));
            }
        }
    }

    #[test]
    fn round_trip_within_documented_bounds() {
        for f in ExpertFormat::ALL {
            let (rows, cols) = (10, 256);
            let x = random(rows, cols, 7);
            let enc = encode(f, rows, cols, &x).unwrap();
            let dec = decode(f, rows, cols, &enc).unwrap();
            let l = MatrixLayout::new(f, rows, cols).unwrap();
            let mut worst = 0f32;
            for r in 0..rows {
                let xr = &x[r * cols..(r + 1) * cols];
                for c in 0..cols {
                    let err = (xr[c] - dec[r * cols + c]).abs();
                    let bound = error_bound(&l, &enc, r, xr, c);
                    assert!(
                        err <= bound,
                        "{f} r{r} c{c}: {} -> {} (bound {bound})",
                        xr[c],
                        dec[r * cols + c]
                    );
                    worst = worst.max(err / xr.iter().fold(0f32, |m, v| m.max(v.abs())).max(1e-30));
                }
            }
            // The bounds are not vacuous: the error relative to the row max is small.
            let limit = match f {
                ExpertFormat::Bf16 => 4e-3,
                ExpertFormat::Int8 => 4.1e-3,
                _ => 0.34,
            };
            assert!(worst <= limit, "{f}: worst error {worst} of row max");
        }
    }

    #[test]
    fn scalar_conversions_are_exact() {
        for b in 0..=0x7Eu8 {
            assert_eq!(f32_to_e4m3(e4m3_to_f32(b)), b, "e4m3 code {b:#x}");
        }
        assert_eq!(e4m3_to_f32(0x7E), 448.0);
        assert_eq!(e4m3_to_f32(0x01), 2f32.powi(-9));
        assert!(e4m3_to_f32(0x7F).is_nan());
        for n in 0..16u8 {
            assert_eq!(f32_to_e2m1(e2m1_to_f32(n)), if n == 8 { 0 } else { n });
        }
        // Ties go to the even code.
        assert_eq!(f32_to_e2m1(0.25), 0);
        assert_eq!(f32_to_e2m1(0.75), 2);
        assert_eq!(f32_to_e2m1(5.0), 6);
        assert_eq!(f32_to_e2m1(-100.0), 15);
        assert_eq!(e8m0_to_f32(127), 1.0);
        assert_eq!(e8m0_to_f32(0), 2f32.powi(-127));
    }

    #[test]
    fn layout_matches_the_documented_offsets() {
        // nvfp4: one row of 32 = 16 value bytes, 2 scale bytes, then an f16 row scale.
        let mut x = vec![0f32; 64];
        x[1] = 6.0; // column 1: high nibble of byte 0 of row 0
        x[32 + 2] = -1.0; // row 1, column 2: low nibble of byte 1 of row 1
        let enc = encode(ExpertFormat::Nvfp4, 2, 32, &x).unwrap();
        assert_eq!(enc.len(), 2 * 16 + 2 * 2 + 2 * 2);
        assert_eq!(enc[0] & 15, 0);
        assert_eq!(enc[0] >> 4, 7);
        assert_eq!(enc[16 + 1] & 15, 8 | 7);
        let t0 = f16::from_le_bytes([enc[36], enc[37]]).to_f32();
        assert_eq!(t0, f16::from_f32(6.0 / NVFP4_ROW_DIVISOR).to_f32());
        assert_eq!(e4m3_to_f32(enc[32]) * t0 * 6.0, 6.0);
        // q4_0: the element of largest magnitude gets code 0 and d = -m/8.
        let mut y = vec![0.5f32; 32];
        y[20] = -4.0;
        let q = encode(ExpertFormat::Q4_0, 1, 32, &y).unwrap();
        assert_eq!(f16::from_le_bytes([q[0], q[1]]).to_f32(), 0.5);
        assert_eq!(q[2 + 4] >> 4, 0);
        assert_eq!(q[2] & 15, 9);
    }

    #[test]
    fn bad_input_is_refused_with_a_named_error() {
        let e = encode(ExpertFormat::Nvfp4, 2, 24, &[0.0; 48]).unwrap_err();
        assert!(e.to_string().contains("cols"), "{e}");
        let e = encode(ExpertFormat::Int8, 2, 4, &[0.0; 7]).unwrap_err();
        assert!(e.to_string().contains("weights"), "{e}");
        let e = encode(ExpertFormat::Bf16, 1, 2, &[f32::NAN, 0.0]).unwrap_err();
        assert!(e.to_string().contains("finite"), "{e}");
        let e = decode(ExpertFormat::Mxfp4, 1, 32, &[0; 3]).unwrap_err();
        assert!(e.to_string().contains("expected 17"), "{e}");
    }
}
