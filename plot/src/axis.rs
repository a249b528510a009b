//! Axes, shared by every figure: the range an axis spans over its data, where its ticks go
//! and how their numbers read. One implementation, so that `ft plot`'s figures and the
//! decision figure pad, tick and label the same way.
//!
//! Log axes are labelled at every 1-2-5 step of each decade (plotters' own log axis labels
//! only powers of ten, so an axis from 0.02 to 16 showed 0.1, 1 and 10 and nothing beyond);
//! linear axes take as many decimals as their tick spacing needs, so that neighbouring
//! labels differ.

/// Share of the data's span added on each side of a padded axis, so that points do not
/// sit on the frame.
pub const PAD: f64 = 0.05;

/// Most ticks of a log axis: beyond it the 1-2-5 steps are thinned.
pub const MAX_LOG_TICKS: usize = 12;

/// Light grid lines between two labelled ones (more make a grey wash).
pub const LIGHT_LINES: usize = 4;

/// Labels a linear axis gets (what plotters' mesh draws by default): the tick spacing the
/// labels' decimals follow is the span over this.
const LINEAR_LABELS: f64 = 10.0;

/// How an axis is scaled.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Scale {
    /// Linear.
    Linear,
    /// Logarithmic (every value positive).
    Log,
}

impl Scale {
    /// `Log` when `log`.
    pub fn of(log: bool) -> Self {
        if log {
            Scale::Log
        } else {
            Scale::Linear
        }
    }
}

/// How an axis' range is taken from its data.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Fit {
    /// Share of the span added on each side ([`PAD`], or 0 for an axis that ends where
    /// its data does).
    pub pad: f64,
    /// Start at 0 (linear only): a bar length or a rate, where a small difference must
    /// look small.
    pub from_zero: bool,
}

impl Fit {
    /// Padded by [`PAD`] on both sides.
    pub const PADDED: Fit = Fit {
        pad: PAD,
        from_zero: false,
    };
    /// Exactly the data's span.
    pub const TIGHT: Fit = Fit {
        pad: 0.0,
        from_zero: false,
    };
    /// From 0 to the largest value, padded above.
    pub const FROM_ZERO: Fit = Fit {
        pad: PAD,
        from_zero: true,
    };
}

/// Smallest and largest finite value (`None` when there is none).
pub fn data_span(values: impl IntoIterator<Item = f64>) -> Option<(f64, f64)> {
    values
        .into_iter()
        .filter(|v| v.is_finite())
        .fold(None, |acc, v| match acc {
            None => Some((v, v)),
            Some((lo, hi)) => Some((lo.min(v), hi.max(v))),
        })
}

/// The range of an axis over `values` (non-finite values, and non-positive ones on a log
/// axis, are ignored): their span, padded by `fit.pad` of it on each side (of the span of
/// the logarithms on a log axis), from 0 when `fit.from_zero` on a linear axis; a unit
/// (or a factor of 2 on a log axis) around a single value; `[0, 1]` (`[1, 10]`) with no
/// value at all.
pub fn range(values: impl IntoIterator<Item = f64>, scale: Scale, fit: Fit) -> (f64, f64) {
    let values = values
        .into_iter()
        .filter(|v| scale == Scale::Linear || *v > 0.0);
    let Some((mut lo, hi)) = data_span(values) else {
        return match scale {
            Scale::Linear => (0.0, 1.0),
            Scale::Log => (1.0, 10.0),
        };
    };
    match scale {
        Scale::Log => {
            let (a, b) = (lo.log10(), hi.log10());
            if b - a < f64::EPSILON * a.abs().max(1.0) {
                return (lo / 2.0, hi * 2.0);
            }
            if fit.pad == 0.0 {
                return (lo, hi);
            }
            let pad = (b - a) * fit.pad;
            (10f64.powf(a - pad), 10f64.powf(b + pad))
        }
        Scale::Linear => {
            if fit.from_zero {
                lo = lo.min(0.0);
            }
            if hi - lo < f64::EPSILON * lo.abs().max(1.0) {
                let half = if lo == 0.0 { 1.0 } else { lo.abs() * 0.5 };
                return (lo - half, hi + half);
            }
            let pad = (hi - lo) * fit.pad;
            let lo = if fit.from_zero && lo >= 0.0 {
                0.0
            } else {
                lo - pad
            };
            (lo, hi + pad)
        }
    }
}

/// Format a value compactly: integers as integers, large and small values in exponent
/// form (`2e-5`, `1.5e8`), else three significant digits without trailing zeros.
pub fn tick(v: f64) -> String {
    let a = v.abs();
    if v == 0.0 {
        return "0".to_string();
    }
    if !(1e-3..1e7).contains(&a) {
        return exponent(v);
    }
    if a.fract() == 0.0 || a >= 100.0 {
        return format!("{v:.0}");
    }
    let digits = (2 - a.log10().floor() as i32).max(0) as usize;
    trim(format!("{v:.digits$}"))
}

/// `v` as mantissa and power of ten, the mantissa to two decimals without trailing zeros.
fn exponent(v: f64) -> String {
    let s = format!("{v:.2e}");
    match s.split_once('e') {
        Some((m, e)) => format!("{}e{e}", trim(m.to_string())),
        None => s,
    }
}

/// Trailing zeros (and a trailing point) of a decimal removed; "-0" read as "0".
fn trim(s: String) -> String {
    let s = if s.contains('.') {
        s.trim_end_matches('0').trim_end_matches('.').to_string()
    } else {
        s
    };
    if s == "-0" {
        "0".to_string()
    } else {
        s
    }
}

/// A tick label on an axis over `[lo, hi]`: on a linear axis with as many decimals as its
/// tick spacing needs (so that neighbouring labels differ), on a log axis [`tick`].
pub fn label(v: f64, (lo, hi): (f64, f64), scale: Scale) -> String {
    let step = (hi - lo) / LINEAR_LABELS;
    if scale == Scale::Log {
        return thousands(v).unwrap_or_else(|| tick(v));
    }
    if !(step > 0.0 && step.is_finite()) {
        return tick(v);
    }
    if v.abs() >= 1e7 || (v != 0.0 && v.abs() < 1e-3 && step < 1e-3) {
        return exponent(v);
    }
    let decimals = (-step.log10().floor()).max(0.0) as usize;
    trim(format!("{v:.decimals$}"))
}

/// A log axis' round value of 10 000 or more with a k, M or G suffix (`30k`, `1M`, `2.5G`),
/// where that loses nothing (a tenth of the unit at most): long runs of zeros are hard to
/// count at a glance.
fn thousands(v: f64) -> Option<String> {
    let (unit, suffix) = [(1e9, "G"), (1e6, "M"), (1e3, "k")]
        .into_iter()
        .find(|(u, _)| v.abs() >= *u)?;
    if v.abs() < 1e4 {
        return None;
    }
    let m = v / unit;
    ((m * 10.0).round() == m * 10.0).then(|| format!("{}{suffix}", tick(m)))
}

/// Tick positions of a log axis over `[lo, hi]` (both positive): 1, 2 and 5 of every decade
/// inside it, thinned to 1 and 3, then to every decade, then to every other decade, when
/// that gives more than `max`. Every decade inside the range is labelled unless more than
/// `max` decades are.
pub fn log_ticks(lo: f64, hi: f64, max: usize) -> Vec<f64> {
    if !(lo > 0.0 && hi > lo && lo.is_finite() && hi.is_finite()) {
        return Vec::new();
    }
    let (d0, d1) = (lo.log10().floor() as i32, hi.log10().ceil() as i32);
    let inside = |x: &f64| *x >= lo * (1.0 - 1e-9) && *x <= hi * (1.0 + 1e-9);
    for mantissas in [&[1.0, 2.0, 5.0][..], &[1.0, 3.0][..], &[1.0][..]] {
        let v: Vec<f64> = (d0..=d1)
            .flat_map(|d| mantissas.iter().map(move |m| m * 10f64.powi(d)))
            .filter(inside)
            .collect();
        if (2..=max).contains(&v.len()) {
            return v;
        }
    }
    // Every k-th decade, or (inside a single decade) a few evenly spaced values.
    let decades: Vec<f64> = (d0..=d1).map(|d| 10f64.powi(d)).filter(inside).collect();
    if decades.len() >= 2 {
        let k = decades.len().div_ceil(max.max(1));
        return decades.into_iter().step_by(k.max(1)).collect();
    }
    let n = max.clamp(2, 5);
    (0..n)
        .map(|i| {
            let t = i as f64 / (n - 1) as f64;
            let v = 10f64.powf(lo.log10() + t * (hi.log10() - lo.log10()));
            // Two significant digits, so that the labels read.
            let p = 10f64.powi(v.log10().floor() as i32 - 1);
            (v / p).round() * p
        })
        .filter(inside)
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn log_axes_are_labelled_at_every_decade_and_beyond_ten() {
        let t = log_ticks(0.015, 16.0, 14);
        assert!(t.contains(&0.02) && t.contains(&0.1) && t.contains(&1.0) && t.contains(&10.0));
        assert!(t.iter().all(|&x| (0.015..=16.0).contains(&x)));
        // Steps and context: 1 to 256K labels 10, 100, 1000, 10000 and 100000.
        let wide = log_ticks(1.0, 262_144.0, 8);
        assert!(wide.len() <= 8, "{wide:?}");
        for d in [1.0, 10.0, 100.0, 1e3, 1e4, 1e5] {
            assert!(wide.contains(&d), "{d} missing from {wide:?}");
        }
        // Far more decades than labels: every other one, still past 10.
        let huge = log_ticks(1e-6, 1e6, 8);
        assert!(
            huge.len() <= 8 && huge.iter().any(|&x| x > 10.0),
            "{huge:?}"
        );
        // Inside one decade: still several labels.
        let narrow = log_ticks(200.0, 700.0, 12);
        assert!(narrow.len() >= 2, "{narrow:?}");
        assert!(log_ticks(0.0, 1.0, 10).is_empty());
    }

    #[test]
    fn ticks_are_compact_and_readable() {
        assert_eq!(tick(0.25), "0.25");
        assert_eq!(tick(1024.0), "1024");
        assert_eq!(tick(12.5), "12.5");
        assert_eq!(tick(123.4), "123");
        assert_eq!(tick(0.0), "0");
        assert_eq!(tick(1e-5), "1e-5");
        assert_eq!(tick(2.5e-5), "2.5e-5");
        assert_eq!(tick(1.5e8), "1.5e8");
        // On a linear axis the decimals follow the spacing: neighbours stay distinct.
        let labels: Vec<String> = (0..5)
            .map(|i| label(47.0 + 0.05 * i as f64, (47.0, 47.5), Scale::Linear))
            .collect();
        assert_eq!(labels, ["47", "47.05", "47.1", "47.15", "47.2"]);
        assert_eq!(label(16384.0, (0.0, 1e4), Scale::Linear), "16384");
        assert_eq!(label(-0.0001, (0.0, 1.0), Scale::Linear), "0");
        assert_eq!(label(0.25, (0.1, 10.0), Scale::Log), "0.25");
        // Log axes of contexts and steps: round thousands and millions with a suffix.
        let log = |v: f64| label(v, (1.0, 1e7), Scale::Log);
        assert_eq!(
            [
                log(5000.0),
                log(30_000.0),
                log(1e6),
                log(2.5e6),
                log(16_384.0)
            ],
            ["5000", "30k", "1M", "2.5M", "16384"]
        );
    }

    #[test]
    fn ranges_pad_start_at_zero_and_survive_degenerate_data() {
        assert_eq!(range([1.0, 3.0], Scale::Linear, Fit::TIGHT), (1.0, 3.0));
        let (lo, hi) = range([1.0, 3.0], Scale::Linear, Fit::PADDED);
        assert!((lo - 0.9).abs() < 1e-12 && (hi - 3.1).abs() < 1e-12);
        let (lo, hi) = range([2.0, 4.0], Scale::Linear, Fit::FROM_ZERO);
        assert_eq!(lo, 0.0);
        assert!((hi - 4.2).abs() < 1e-12);
        let (lo, hi) = range([1.0, 100.0], Scale::Log, Fit::PADDED);
        assert!((lo.log10() + 0.1).abs() < 1e-12 && (hi.log10() - 2.1).abs() < 1e-12);
        // A single value, no value, non-finite and (log) non-positive values.
        assert_eq!(range([5.0, 5.0], Scale::Linear, Fit::PADDED), (2.5, 7.5));
        assert_eq!(range([0.0], Scale::Linear, Fit::PADDED), (-1.0, 1.0));
        assert_eq!(range([4.0], Scale::Log, Fit::PADDED), (2.0, 8.0));
        assert_eq!(range([], Scale::Log, Fit::PADDED), (1.0, 10.0));
        assert_eq!(
            range([f64::NAN, 2.0, 0.0, 8.0], Scale::Log, Fit::TIGHT),
            (2.0, 8.0)
        );
        assert_eq!(data_span([f64::INFINITY]), None);
    }
}
