//! Row kernels: many rows of one matrix against a few activation vectors, per SIMD level.
//!
//! `out[(r - rows.start) * n + a]` receives row `r`'s dot product with activation `a`.
//! The scalar versions here are the int8 path's definition ([`crate::w4a8`]) and the f32
//! path's plain loop; `x86` holds the AVX2 and AVX-512 versions.

use std::cell::RefCell;
use std::ops::Range;

use ft_model::ExpertFormat;

use crate::codec::{decode_row, MatrixLayout};
use crate::simd::SimdLevel;
use crate::w4a8::{dot_integers, row_integers, QuantAct, W4a8Spec};

/// Intermediate rows per gate/up tile on the f32 path, and the least on the int8 path
/// (which uses the activation block, 16 or 32): small enough that a 10-expert call has
/// hundreds of tiles to spread evenly over 16 threads, large enough that a tile (16 rows of
/// gate and of up, ~46 KB at hidden 2560 in nvfp4) amortises its setup.
pub(crate) const F32_TILE_ROWS: usize = 16;

/// Hidden rows per down tile (each tile runs every expert of the call on its rows).
pub(crate) const DOWN_TILE_ROWS: usize = 16;

thread_local! {
    static F32_ROW: RefCell<Vec<f32>> = const { RefCell::new(Vec::new()) };
    static INT_ROW: RefCell<(Vec<i8>, Vec<f32>)> = const { RefCell::new((Vec::new(), Vec::new())) };
}

/// f32 path: dequantize each row once, then one f32 dot product per activation.
pub(crate) fn f32_rows(
    level: SimdLevel,
    l: &MatrixLayout,
    bytes: &[u8],
    rows: Range<usize>,
    acts: &[&[f32]],
    out: &mut [f32],
) {
    #[cfg(target_arch = "x86_64")]
    if level != SimdLevel::Scalar {
        crate::x86::f32_rows(level, l, bytes, rows, acts, out);
        return;
    }
    let _ = level;
    F32_ROW.with_borrow_mut(|buf| {
        buf.resize(l.cols, 0.0);
        let n = acts.len();
        for r in rows.clone() {
            decode_row(l.format, &l.row(bytes, r), buf);
            for (a, x) in acts.iter().enumerate() {
                out[(r - rows.start) * n + a] = dot_f32_scalar(buf, x);
            }
        }
    });
}

/// Plain f32 dot product with eight partial sums (lets the compiler vectorize at SSE2).
pub(crate) fn dot_f32_scalar(w: &[f32], x: &[f32]) -> f32 {
    let mut acc = [0f32; 8];
    let mut wc = w.chunks_exact(8);
    let mut xc = x.chunks_exact(8);
    for (a, b) in (&mut wc).zip(&mut xc) {
        for k in 0..8 {
            acc[k] += a[k] * b[k];
        }
    }
    let mut s: f32 = acc.iter().sum();
    for (a, b) in wc.remainder().iter().zip(xc.remainder()) {
        s += a * b;
    }
    s
}

/// int8 path: the spec's dot product of each row with each quantized activation.
pub(crate) fn int8_rows(
    level: SimdLevel,
    format: ExpertFormat,
    l: &MatrixLayout,
    bytes: &[u8],
    rows: Range<usize>,
    acts: &[&QuantAct],
    out: &mut [f32],
) {
    #[cfg(target_arch = "x86_64")]
    if level != SimdLevel::Scalar {
        crate::x86::int8_rows(level, format, l, bytes, rows, acts, out);
        return;
    }
    let _ = level;
    let spec = W4a8Spec::of(format).expect("format has an int8 path");
    INT_ROW.with_borrow_mut(|(w, s)| {
        w.resize(l.cols, 0);
        s.resize(l.cols / spec.group, 0.0);
        let n = acts.len();
        for r in rows.clone() {
            let f_r = row_integers(format, &l.row(bytes, r), w, s);
            for (a, act) in acts.iter().enumerate() {
                out[(r - rows.start) * n + a] = dot_integers(spec.group, w, s, f_r, act);
            }
        }
    });
}
