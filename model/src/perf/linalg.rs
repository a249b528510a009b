//! The little dense linear algebra the fit needs (a few dozen parameters at most): the
//! inverse of a symmetric positive definite matrix, by nalgebra's Cholesky, in f64.

use nalgebra::DMatrix;

/// A pivot of the factor at most this share of its diagonal entry marks a matrix that is not
/// positive definite to working precision. Relative to the column's own scale, so that badly
/// scaled (but regular) matrices pass and dependent columns do not.
const PIVOT_REL_TOL: f64 = 1e-13;

/// Inverse of a symmetric positive definite `n x n` matrix (row-major), or `None` when it is
/// not positive definite to working precision (a parameter the data does not determine).
pub(crate) fn spd_inverse(a: &[Vec<f64>]) -> Option<Vec<Vec<f64>>> {
    let n = a.len();
    let m = DMatrix::from_fn(n, n, |i, j| a[i][j]);
    let chol = m.cholesky()?;
    let l = chol.l_dirty();
    // The squared pivot is what is left of the diagonal entry after the earlier columns.
    if (0..n).any(|i| {
        let p = l[(i, i)] * l[(i, i)];
        p.is_nan() || p <= a[i][i].abs() * PIVOT_REL_TOL
    }) {
        return None;
    }
    let inv = chol.inverse();
    Some(
        (0..n)
            .map(|i| (0..n).map(|j| inv[(i, j)]).collect())
            .collect(),
    )
}

#[cfg(test)]
mod tests {
    // Triangular factorisations read clearest with explicit indices.
    #![allow(clippy::needless_range_loop)]

    use super::*;

    /// The hand-written Cholesky inverse nalgebra replaced, kept as the reference.
    fn reference_inverse(a: &[Vec<f64>]) -> Option<Vec<Vec<f64>>> {
        let n = a.len();
        let mut l = vec![vec![0.0; n]; n];
        for i in 0..n {
            for j in 0..=i {
                let mut s = a[i][j];
                for k in 0..j {
                    s -= l[i][k] * l[j][k];
                }
                if i == j {
                    if s.is_nan() || s <= a[i][i].abs() * PIVOT_REL_TOL {
                        return None;
                    }
                    l[i][i] = s.sqrt();
                } else {
                    l[i][j] = s / l[j][j];
                }
            }
        }
        let mut li = vec![vec![0.0; n]; n];
        for c in 0..n {
            for i in c..n {
                let mut s = if i == c { 1.0 } else { 0.0 };
                for k in c..i {
                    s -= l[i][k] * li[k][c];
                }
                li[i][c] = s / l[i][i];
            }
        }
        let mut inv = vec![vec![0.0; n]; n];
        for i in 0..n {
            for j in 0..n {
                inv[i][j] = (i.max(j)..n).map(|k| li[k][i] * li[k][j]).sum();
            }
        }
        Some(inv)
    }

    #[test]
    fn nalgebra_inverts_as_the_hand_written_cholesky_did() {
        use rand::{Rng, SeedableRng};
        let mut rng = rand::rngs::StdRng::seed_from_u64(3);
        for n in 1..12 {
            // B^T B + d I, with columns of very different scales.
            let scale: Vec<f64> = (0..n).map(|i| 10f64.powi(i as i32 % 5 - 2)).collect();
            let b: Vec<Vec<f64>> = (0..n + 2)
                .map(|_| {
                    (0..n)
                        .map(|j| rng.random_range(-1.0..1.0) * scale[j])
                        .collect()
                })
                .collect();
            let a: Vec<Vec<f64>> = (0..n)
                .map(|i| {
                    (0..n)
                        .map(|j| {
                            b.iter().map(|r| r[i] * r[j]).sum::<f64>()
                                + if i == j {
                                    1e-3 * scale[i] * scale[i]
                                } else {
                                    0.0
                                }
                        })
                        .collect()
                })
                .collect();
            let (got, want) = (spd_inverse(&a).unwrap(), reference_inverse(&a).unwrap());
            for i in 0..n {
                for j in 0..n {
                    let tol = 1e-9 * (want[i][i] * want[j][j]).sqrt();
                    assert!((got[i][j] - want[i][j]).abs() <= tol, "n {n} ({i},{j})");
                }
            }
        }
        // Dependent columns: neither inverts.
        let a = vec![
            vec![1.0, 2.0, 0.0],
            vec![2.0, 4.0, 0.0],
            vec![0.0, 0.0, 1.0],
        ];
        assert!(spd_inverse(&a).is_none() && reference_inverse(&a).is_none());
    }

    #[test]
    fn the_inverse_times_the_matrix_is_the_identity() {
        // A = B^T B + I for a fixed B is SPD.
        let b = [
            [1.0, 2.0, 0.5, -1.0],
            [0.0, 3.0, 1.0, 2.0],
            [4.0, -1.0, 0.0, 1.0],
        ];
        let n = 4;
        let mut a = vec![vec![0.0; n]; n];
        for i in 0..n {
            for j in 0..n {
                a[i][j] =
                    (0..3).map(|k| b[k][i] * b[k][j]).sum::<f64>() + if i == j { 1.0 } else { 0.0 };
            }
        }
        let inv = spd_inverse(&a).unwrap();
        for i in 0..n {
            for j in 0..n {
                let p: f64 = (0..n).map(|k| a[i][k] * inv[k][j]).sum();
                assert!(
                    (p - if i == j { 1.0 } else { 0.0 }).abs() < 1e-12,
                    "{i},{j}: {p}"
                );
            }
        }
    }

    #[test]
    fn badly_scaled_matrices_invert() {
        let a = vec![vec![1e-6, 1e-2], vec![1e-2, 1e8]];
        let inv = spd_inverse(&a).unwrap();
        for i in 0..2 {
            for j in 0..2 {
                let p: f64 = (0..2).map(|k| a[i][k] * inv[k][j]).sum();
                assert!(
                    (p - if i == j { 1.0 } else { 0.0 }).abs() < 1e-9,
                    "{i},{j}: {p}"
                );
            }
        }
    }

    #[test]
    fn a_singular_matrix_has_no_inverse() {
        let a = vec![vec![1.0, 2.0], vec![2.0, 4.0]];
        assert!(spd_inverse(&a).is_none());
    }
}
