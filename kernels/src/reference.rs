//! The slow, obviously correct f64 reference of a layer's CPU share; every fast path of
//! [`crate::step`] is tested against it.
//!
//! Weights are decoded exactly (every format's values are f32-representable), then
//! everything is computed in f64 with `f64::exp`: `y[t] += w * down(silu(gate x_t) * up x_t)`.

use ft_model::{ExpertFormat, MoeGeometry};

use crate::codec::decode;
use crate::error::{KernelError, Result};
use crate::expert::ExpertLayout;
use crate::step::ExpertWork;

/// `y + sum over experts and their tokens of w * expert(x[token])`, in f64.
///
/// `x` and `y` are `tokens x hidden`, row-major.
pub fn reference_layer(
    format: ExpertFormat,
    geometry: &MoeGeometry,
    experts: &[ExpertWork<'_>],
    x: &[f32],
    y: &[f32],
) -> Result<Vec<f64>> {
    let layout = ExpertLayout::new(format, geometry)?;
    let (h, i) = (geometry.hidden, geometry.intermediate);
    if !x.len().is_multiple_of(h) || x.len() != y.len() {
        return Err(KernelError::size("y", x.len() as u64, y.len()));
    }
    let tokens = x.len() / h;
    let mut out: Vec<f64> = y.iter().map(|&v| v as f64).collect();
    for (e, work) in experts.iter().enumerate() {
        let (gate, up, down) = layout.split(&format!("experts[{e}].weights"), work.weights)?;
        let gate = decode(format, i, h, gate)?;
        let up = decode(format, i, h, up)?;
        let down = decode(format, h, i, down)?;
        for &(t, w) in work.tokens {
            let t = t as usize;
            if t >= tokens {
                return Err(KernelError::invalid(
                    format!("experts[{e}].tokens"),
                    format!("token {t} is not below {tokens}"),
                ));
            }
            let xt = &x[t * h..(t + 1) * h];
            let act: Vec<f64> = (0..i)
                .map(|r| {
                    let g: f64 = dot64(&gate[r * h..(r + 1) * h], xt);
                    let u: f64 = dot64(&up[r * h..(r + 1) * h], xt);
                    g / (1.0 + (-g).exp()) * u
                })
                .collect();
            for r in 0..h {
                let o: f64 = down[r * i..(r + 1) * i]
                    .iter()
                    .zip(&act)
                    .map(|(&a, &b)| a as f64 * b)
                    .sum();
                out[t * h + r] += w as f64 * o;
            }
        }
    }
    Ok(out)
}

fn dot64(a: &[f32], b: &[f32]) -> f64 {
    a.iter().zip(b).map(|(&p, &q)| p as f64 * q as f64).sum()
}

/// Norm-wise relative error `||got - want|| / ||want||` (2-norms, f64).
pub fn relative_error(got: &[f32], want: &[f64]) -> f64 {
    let num: f64 = got
        .iter()
        .zip(want)
        .map(|(&g, &w)| (g as f64 - w).powi(2))
        .sum();
    let den: f64 = want.iter().map(|w| w * w).sum();
    (num / den.max(f64::MIN_POSITIVE)).sqrt()
}
