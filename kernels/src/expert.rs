//! One routed expert's bytes: where its three matrices lie, and a fast deterministic filler.
//!
//! An expert is `gate` (`intermediate x hidden`), `up` (`intermediate x hidden`) and `down`
//! (`hidden x intermediate`), each laid out as [`crate::codec`] documents, stored
//! contiguously in that order with no padding: `gate` at 0, `up` at `G`, `down` at `2G`, where
//! `G = ExpertFormat::matrix_bytes(intermediate, hidden)`; the expert is
//! `MoeGeometry::expert_bytes` long.
//!
//! [`fill_expert_from_seed`] writes valid bytes of random weights without going through f32
//! encoding (banks of many GiB are filled with it): codes and scales are drawn directly so that
//! every weight has mean zero and a standard deviation near `1 / sqrt(cols)`, the scale at
//! which `W x` keeps the magnitude of `x`.

use half::{bf16, f16};

use ft_model::{ExpertFormat, MoeGeometry};

use crate::codec::MatrixLayout;
use crate::error::{KernelError, Result};

/// The three matrices of an expert, in storage order.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Matrix {
    /// `intermediate x hidden`, at offset 0.
    Gate,
    /// `intermediate x hidden`, after `gate`.
    Up,
    /// `hidden x intermediate`, after `up`.
    Down,
}

/// Byte offsets and layouts of an expert's matrices.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ExpertLayout {
    /// Format of all three matrices.
    pub format: ExpertFormat,
    /// Layout of `gate` and of `up` (`intermediate x hidden`).
    pub gate_up: MatrixLayout,
    /// Layout of `down` (`hidden x intermediate`).
    pub down: MatrixLayout,
    /// Offset of `gate` (bytes; always 0).
    pub gate_offset: usize,
    /// Offset of `up` (bytes).
    pub up_offset: usize,
    /// Offset of `down` (bytes).
    pub down_offset: usize,
    /// Bytes of the whole expert (equals `MoeGeometry::expert_bytes`).
    pub bytes: usize,
}

impl ExpertLayout {
    /// The layout of one expert of `geometry` in `format`; errors name the bad field.
    pub fn new(format: ExpertFormat, geometry: &MoeGeometry) -> Result<Self> {
        format.check_cols("geometry.hidden", geometry.hidden)?;
        format.check_cols("geometry.intermediate", geometry.intermediate)?;
        let gate_up = MatrixLayout::new(format, geometry.intermediate, geometry.hidden)?;
        let down = MatrixLayout::new(format, geometry.hidden, geometry.intermediate)?;
        let bytes = 2 * gate_up.bytes + down.bytes;
        debug_assert_eq!(bytes as u64, geometry.expert_bytes(format));
        Ok(ExpertLayout {
            format,
            gate_up,
            down,
            gate_offset: 0,
            up_offset: gate_up.bytes,
            down_offset: 2 * gate_up.bytes,
            bytes,
        })
    }

    /// Rows x cols of the model this layout was made for: `(hidden, intermediate)`.
    pub fn dims(&self) -> (usize, usize) {
        (self.gate_up.cols, self.gate_up.rows)
    }

    /// Byte range of one matrix inside the expert.
    pub fn range(&self, m: Matrix) -> std::ops::Range<usize> {
        match m {
            Matrix::Gate => 0..self.up_offset,
            Matrix::Up => self.up_offset..self.down_offset,
            Matrix::Down => self.down_offset..self.bytes,
        }
    }

    /// Split an expert's bytes into `(gate, up, down)`; errors if the length is wrong.
    pub fn split<'a>(
        &self,
        what: &str,
        expert: &'a [u8],
    ) -> Result<(&'a [u8], &'a [u8], &'a [u8])> {
        if expert.len() != self.bytes {
            return Err(KernelError::size(what, self.bytes as u64, expert.len()));
        }
        let (gate, rest) = expert.split_at(self.up_offset);
        let (up, down) = rest.split_at(self.gate_up.bytes);
        Ok((gate, up, down))
    }
}

/// splitmix64: a fast, well-mixed 64-bit hash (used to derive per-matrix seeds).
#[inline]
fn splitmix64(mut z: u64) -> u64 {
    z = z.wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// wyrand: one multiply per 8 random bytes, good enough statistics for synthetic weights.
struct WyRand(u64);

impl WyRand {
    #[inline]
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0xA076_1D64_78BD_642F);
        let t = (self.0 as u128).wrapping_mul((self.0 ^ 0xE703_7ED1_A0B4_28DB) as u128);
        ((t >> 64) ^ t) as u64
    }

    fn fill(&mut self, out: &mut [u8]) {
        let mut chunks = out.chunks_exact_mut(8);
        for c in &mut chunks {
            c.copy_from_slice(&self.next().to_le_bytes());
        }
        let rest = chunks.into_remainder();
        let r = self.next().to_le_bytes();
        let n = rest.len();
        rest.copy_from_slice(&r[..n]);
    }
}

/// Root-mean-square of an e2m1 code drawn uniformly from the 16 codes: `sqrt(68.5 / 8)`.
const E2M1_UNIFORM_RMS: f32 = 2.926_175;
/// RMS of `q - 8` for the q4_0 filler's codes: uniform 4-bit `q` with code 0 (-8) replaced by
/// 8 (zero), so that the weights have mean zero: `sqrt(280 / 16)`.
const Q4_UNIFORM_RMS: f32 = 4.183_3;
/// RMS of a uniform int8 code in `[-127, 127]`: `sqrt(127 * 128 / 3)`.
const I8_UNIFORM_RMS: f32 = 73.600_27;
/// nvfp4 filler: block scales are e4m3 codes with exponent field 10 (values `8 * (1 + m/8)`,
/// 8 to 15), whose RMS is this.
const NVFP4_FILL_BLOCK_RMS: f32 = 11.652_253;
/// e4m3 exponent field of the nvfp4 filler's block scales (2^(10 - 7) = 8).
const NVFP4_FILL_BLOCK_EXP: u8 = 10;

/// Fill one matrix of `l` with random valid codes and scales, weight std near `1/sqrt(cols)`.
fn fill_matrix(l: &MatrixLayout, rng: &mut WyRand, out: &mut [u8]) {
    let sigma = 1.0 / (l.cols as f32).sqrt();
    let values_bytes = l.rows * l.values_row_bytes;
    match l.format {
        ExpertFormat::Ggml(_) => unreachable!(
            "{} has no kernel in ft (MatrixLayout::new refuses it)",
            l.format
        ),
        ExpertFormat::Bf16 => {
            // Uniform in [-a, a] with a = sqrt(3) sigma has standard deviation sigma.
            let a = 3f32.sqrt() * sigma;
            for c in out[..values_bytes].chunks_exact_mut(8) {
                let r = rng.next();
                for k in 0..4 {
                    let u = ((r >> (16 * k)) & 0xFFFF) as f32 * (2.0 / 65536.0) - 1.0;
                    c[2 * k..2 * k + 2].copy_from_slice(&bf16::from_f32(u * a).to_le_bytes());
                }
            }
            // Rows of an odd number of elements leave up to 3 weights; write them too.
            let tail = values_bytes / 8 * 8;
            for c in out[tail..values_bytes].chunks_exact_mut(2) {
                let u = (rng.next() & 0xFFFF) as f32 * (2.0 / 65536.0) - 1.0;
                c.copy_from_slice(&bf16::from_f32(u * a).to_le_bytes());
            }
        }
        ExpertFormat::Int8 => {
            rng.fill(&mut out[..values_bytes]);
            for b in &mut out[..values_bytes] {
                if *b == 0x80 {
                    *b = 0x81; // -128 is outside the encoder's range [-127, 127]
                }
            }
            for r in 0..l.rows {
                // A row scale within +-12.5% of the nominal one.
                let jitter = 1.0 + ((rng.next() >> 40) as f32 / (1u64 << 24) as f32 - 0.5) * 0.25;
                let d = sigma / I8_UNIFORM_RMS * jitter;
                let o = l.row_scales_offset + 4 * r;
                out[o..o + 4].copy_from_slice(&d.to_le_bytes());
            }
        }
        ExpertFormat::Q4_0 => {
            rng.fill(&mut out[..values_bytes]);
            let d = f16::from_f32(sigma / Q4_UNIFORM_RMS).to_le_bytes();
            for blk in out[..values_bytes].chunks_exact_mut(18) {
                blk[..2].copy_from_slice(&d);
                for q in &mut blk[2..] {
                    // Code 0 (weight -8d) becomes 8 (weight 0): a symmetric, zero-mean grid.
                    if *q & 0x0F == 0 {
                        *q |= 0x08;
                    }
                    if *q & 0xF0 == 0 {
                        *q |= 0x80;
                    }
                }
            }
        }
        ExpertFormat::Nvfp4 => {
            rng.fill(&mut out[..values_bytes]);
            let scales = &mut out[l.block_scales_offset..l.row_scales_offset];
            rng.fill(scales);
            for s in scales.iter_mut() {
                *s = (NVFP4_FILL_BLOCK_EXP << 3) | (*s & 7);
            }
            let t = f16::from_f32(sigma / (E2M1_UNIFORM_RMS * NVFP4_FILL_BLOCK_RMS)).to_le_bytes();
            for r in 0..l.rows {
                let o = l.row_scales_offset + 2 * r;
                out[o..o + 2].copy_from_slice(&t);
            }
        }
        ExpertFormat::Mxfp4 => {
            rng.fill(&mut out[..values_bytes]);
            // Mix two neighbouring exponents so that the mean square weight is sigma^2:
            // a share p of blocks gets 2^(e+1), the rest 2^e, with 4^e (1 + 3p) = target^2.
            let target = sigma / E2M1_UNIFORM_RMS;
            let e = target.log2().floor();
            let p = ((target / 2f32.powf(e)).powi(2) - 1.0) / 3.0;
            let threshold = (p * 256.0) as u32;
            let e_lo = (127 + e as i32).clamp(1, 253) as u8;
            let scales = &mut out[l.block_scales_offset..l.bytes];
            rng.fill(scales);
            for s in scales.iter_mut() {
                *s = e_lo + u8::from((*s as u32) < threshold);
            }
        }
    }
}

/// Fill `out` (exactly `geometry.expert_bytes(format)` long) with the expert `expert` of
/// layer `layer`, drawn from `seed`: the same arguments always give the same bytes.
///
/// Codes and scales are generated directly (no f32 encoding): about 1 GB/s per core or more.
pub fn fill_expert_from_seed(
    format: ExpertFormat,
    geometry: &MoeGeometry,
    seed: u64,
    layer: usize,
    expert: usize,
    out: &mut [u8],
) -> Result<()> {
    let layout = ExpertLayout::new(format, geometry)?;
    if out.len() != layout.bytes {
        return Err(KernelError::size(
            "expert buffer",
            layout.bytes as u64,
            out.len(),
        ));
    }
    let base = splitmix64(seed ^ splitmix64(layer as u64 ^ splitmix64(expert as u64)));
    for (i, m) in [Matrix::Gate, Matrix::Up, Matrix::Down]
        .into_iter()
        .enumerate()
    {
        let l = if m == Matrix::Down {
            layout.down
        } else {
            layout.gate_up
        };
        let mut rng = WyRand(splitmix64(base.wrapping_add(i as u64)));
        fill_matrix(&l, &mut rng, &mut out[layout.range(m)]);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::codec::decode;

    fn geo() -> MoeGeometry {
        MoeGeometry {
            hidden: 256,
            intermediate: 128,
            experts: 4,
            top_k: 2,
            moe_layers: 2,
            shared_experts: 0,
        }
    }

    #[test]
    fn layout_offsets_and_sizes() {
        let g = geo();
        for f in ExpertFormat::ALL {
            let l = ExpertLayout::new(f, &g).unwrap();
            assert_eq!(l.bytes as u64, g.expert_bytes(f));
            assert_eq!(l.up_offset as u64, f.matrix_bytes(128, 256));
            assert_eq!(l.down_offset, 2 * l.up_offset);
            assert_eq!(l.range(Matrix::Down).len() as u64, f.matrix_bytes(256, 128));
        }
        let bad = MoeGeometry { hidden: 40, ..g };
        let e = ExpertLayout::new(ExpertFormat::Q4_0, &bad).unwrap_err();
        assert!(e.to_string().contains("geometry.hidden"), "{e}");
    }

    #[test]
    fn filled_experts_are_deterministic_valid_and_well_scaled() {
        let g = geo();
        for f in ExpertFormat::ALL {
            let l = ExpertLayout::new(f, &g).unwrap();
            let mut a = vec![0u8; l.bytes];
            let mut b = vec![0u8; l.bytes];
            fill_expert_from_seed(f, &g, 7, 1, 3, &mut a).unwrap();
            fill_expert_from_seed(f, &g, 7, 1, 3, &mut b).unwrap();
            assert_eq!(a, b, "{f}: same seed, same bytes");
            fill_expert_from_seed(f, &g, 7, 1, 2, &mut b).unwrap();
            assert_ne!(a, b, "{f}: another expert, other bytes");
            let (gate, _, down) = l.split("expert", &a).unwrap();
            for (m, bytes, cols) in [("gate", gate, 256), ("down", down, 128)] {
                let rows = if m == "gate" { 128 } else { 256 };
                let w = decode(f, rows, cols, bytes).unwrap();
                assert!(w.iter().all(|v| v.is_finite()), "{f} {m}");
                let n = w.len() as f64;
                let mean = w.iter().map(|&v| v as f64).sum::<f64>() / n;
                let std = (w.iter().map(|&v| (v as f64 - mean).powi(2)).sum::<f64>() / n).sqrt();
                let want = 1.0 / (cols as f64).sqrt();
                assert!(
                    (std / want - 1.0).abs() < 0.3,
                    "{f} {m}: std {std} want {want}"
                );
                assert!(mean.abs() < 0.1 * want, "{f} {m}: mean {mean}");
            }
        }
        let e =
            fill_expert_from_seed(ExpertFormat::Nvfp4, &g, 0, 0, 0, &mut [0u8; 10]).unwrap_err();
        assert!(e.to_string().contains("expert buffer"), "{e}");
    }
}
