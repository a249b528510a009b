//! Tick labels: compact numbers, and log axes labelled at every 1-2-5 step of each decade
//! (plotters' own log axis labels only powers of ten, so an axis from 0.02 to 16 showed 0.1,
//! 1 and 10 and nothing beyond).

/// Format an axis value compactly: integers as integers, large and small values in
/// exponent form, else three significant digits without trailing zeros.
pub fn tick(v: f64) -> String {
    let a = v.abs();
    if v == 0.0 {
        return "0".to_string();
    }
    if !(1e-3..1e7).contains(&a) {
        return format!("{v:.1e}");
    }
    if a.fract() == 0.0 || a >= 100.0 {
        return format!("{v:.0}");
    }
    let digits = (2 - a.log10().floor() as i32).max(0) as usize;
    let s = format!("{v:.digits$}");
    s.trim_end_matches('0').trim_end_matches('.').to_string()
}

/// Tick positions of a log axis over `[lo, hi]` (both positive): 1, 2 and 5 of every decade
/// inside it, thinned to 1 and 3 (then powers of ten) when that gives more than `max`.
pub fn log_ticks(lo: f64, hi: f64, max: usize) -> Vec<f64> {
    if !(lo > 0.0 && hi > lo && lo.is_finite() && hi.is_finite()) {
        return Vec::new();
    }
    let (d0, d1) = (lo.log10().floor() as i32, hi.log10().ceil() as i32);
    for mantissas in [&[1.0, 2.0, 5.0][..], &[1.0, 3.0][..], &[1.0][..]] {
        let v: Vec<f64> = (d0..=d1)
            .flat_map(|d| mantissas.iter().map(move |m| m * 10f64.powi(d)))
            .filter(|&x| x >= lo * (1.0 - 1e-9) && x <= hi * (1.0 + 1e-9))
            .collect();
        if v.len() <= max {
            return v;
        }
    }
    Vec::new()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn log_axes_are_labelled_beyond_ten() {
        let t = log_ticks(0.015, 16.0, 14);
        assert!(t.contains(&0.02) && t.contains(&0.1) && t.contains(&1.0) && t.contains(&10.0));
        assert!(t.iter().all(|&x| (0.015..=16.0).contains(&x)));
        let wide = log_ticks(1.0, 262_144.0, 8);
        assert!(wide.len() <= 8 && wide.contains(&100_000.0), "{wide:?}");
        assert!(log_ticks(0.0, 1.0, 10).is_empty());
    }

    #[test]
    fn ticks_are_compact() {
        assert_eq!(tick(0.25), "0.25");
        assert_eq!(tick(1024.0), "1024");
        assert_eq!(tick(12.5), "12.5");
        assert_eq!(tick(0.0), "0");
    }
}
