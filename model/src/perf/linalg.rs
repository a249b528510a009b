//! The little dense linear algebra the fit needs (a few dozen parameters at most): the
//! inverse of a symmetric positive definite matrix by Cholesky, in f64.

// Triangular factorisations read clearest with explicit indices.
#![allow(clippy::needless_range_loop)]

/// Inverse of a symmetric positive definite `n x n` matrix (row-major), or `None` when it is
/// not positive definite to working precision (a parameter the data does not determine).
pub(crate) fn spd_inverse(a: &[Vec<f64>]) -> Option<Vec<Vec<f64>>> {
    let n = a.len();
    // Cholesky: a = L L^T.
    let mut l = vec![vec![0.0; n]; n];
    for i in 0..n {
        for j in 0..=i {
            let mut s = a[i][j];
            for k in 0..j {
                s -= l[i][k] * l[j][k];
            }
            if i == j {
                // Relative to the column's own scale, so that badly scaled (but regular)
                // matrices pass and dependent columns do not.
                if s.is_nan() || s <= a[i][i].abs() * 1e-13 {
                    return None;
                }
                l[i][i] = s.sqrt();
            } else {
                l[i][j] = s / l[j][j];
            }
        }
    }
    // inv(L) by forward substitution, then inv(a) = inv(L)^T inv(L).
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
            let mut s = 0.0;
            for k in i.max(j)..n {
                s += li[k][i] * li[k][j];
            }
            inv[i][j] = s;
        }
    }
    Some(inv)
}

#[cfg(test)]
mod tests {
    use super::*;

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
