//! Order statistics of measured samples, once for the whole workspace: the median and the
//! quantiles of timings, bandwidths and errors that the benches, the probe, the runtime's
//! records and the plots report.
//!
//! Two conventions are in use, each for a reason, and each is written here once:
//! - [`quantile`]: linear interpolation between order statistics (Hyndman and Fan's type 7,
//!   NumPy's and R's default): a smooth estimate for timing repeats and bench samples.
//! - [`nearest_rank`]: the smallest value with at least a share `q` of the values at or
//!   below it: always a value that was measured, as the runtime's per-step records and the
//!   plots' tables report.
//!
//! `statrs` (already a dependency) has order statistics, but its `quantile` is type 8, which
//! would move every reported p10/p90 of the benches; the two conventions above are a few
//! lines each on a sorted copy, and the tests hold them to the definitions.

/// Linear-interpolated quantile `q` (clamped to [0, 1]) of `v` (type 7); 0 for an empty
/// slice. NaNs sort last.
pub fn quantile(v: &[f64], q: f64) -> f64 {
    if v.is_empty() {
        return 0.0;
    }
    let s = sorted(v);
    let pos = q.clamp(0.0, 1.0) * (s.len() - 1) as f64;
    let (lo, hi) = (pos.floor() as usize, pos.ceil() as usize);
    s[lo] + (s[hi] - s[lo]) * (pos - lo as f64)
}

/// Median of `v` (the mean of the middle two for an even count); 0 for an empty slice.
pub fn median(v: &[f64]) -> f64 {
    quantile(v, 0.5)
}

/// Nearest-rank quantile `q` (0 < q <= 1) of `v`: the smallest value with at least a share
/// `q` of the values at or below it; NaN for an empty slice.
pub fn nearest_rank(v: &[f64], q: f64) -> f64 {
    if v.is_empty() {
        return f64::NAN;
    }
    let n = v.len();
    let rank = ((q * n as f64).ceil() as usize).clamp(1, n);
    sorted(v)[rank - 1]
}

/// A copy of `v` sorted by `total_cmp` (NaNs last).
fn sorted(v: &[f64]) -> Vec<f64> {
    let mut s = v.to_vec();
    s.sort_by(f64::total_cmp);
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Type 7 by its definition: the quantile `q` of n values is where the line through
    /// the points ((i - 1) / (n - 1), x_(i)) passes `q`.
    fn by_definition(v: &[f64], q: f64) -> f64 {
        let s = sorted(v);
        if s.len() == 1 {
            return s[0];
        }
        let n = s.len() as f64;
        (0..s.len() - 1)
            .find_map(|i| {
                let (p0, p1) = (i as f64 / (n - 1.0), (i + 1) as f64 / (n - 1.0));
                (q >= p0 && q <= p1).then(|| s[i] + (s[i + 1] - s[i]) * (q - p0) / (p1 - p0))
            })
            .unwrap()
    }

    /// Nearest rank by its definition: the least value with at least `q n` values at or
    /// below it.
    fn rank_by_definition(v: &[f64], q: f64) -> f64 {
        let s = sorted(v);
        *s.iter()
            .find(|&&x| s.iter().filter(|&&y| y <= x).count() as f64 >= q * s.len() as f64)
            .unwrap()
    }

    #[test]
    fn the_quantiles_meet_their_definitions() {
        use rand::{Rng, SeedableRng};
        let mut rng = rand::rngs::StdRng::seed_from_u64(7);
        for n in 1..40 {
            let v: Vec<f64> = (0..n).map(|_| rng.random_range(-5.0..100.0)).collect();
            for q in [0.0, 0.1, 0.25, 0.5, 0.9, 0.99, 1.0] {
                let d = by_definition(&v, q);
                assert!(
                    (quantile(&v, q) - d).abs() <= 1e-12 * d.abs().max(1.0),
                    "n {n} q {q}"
                );
                if q > 0.0 {
                    assert_eq!(
                        nearest_rank(&v, q),
                        rank_by_definition(&v, q),
                        "n {n} q {q}"
                    );
                }
            }
        }
        assert_eq!(median(&[3.0, 1.0, 2.0, 10.0]), 2.5);
        assert_eq!(median(&[]), 0.0);
        assert!(nearest_rank(&[], 0.5).is_nan());
        assert_eq!(nearest_rank(&[4.0, 1.0, 3.0], 0.9), 4.0);
    }
}
