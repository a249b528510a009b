//! The legacy rule the model replaces, kept to be reported beside the model's choice.
//!
//! The reference engine (FreeToken, ported as ferrox-core 0.25 `qstar`) picks hybrid when
//! `cpu_moe_GBs > threshold * pcie_gather_GBs` (threshold 2 by default), both measured by
//! `ft bench bw` at the engine's tuning geometry, and splits each layer's misses with the
//! fetch fraction `p_ov / (p_ov + c_ov)` of the pair measured while the two contend (the
//! standalone `p / c`, capped at 1, when no contended pair exists). The split of `m` misses
//! is `balanced_fetch`: of `floor(f m)` and `floor(f m) + 1` the one with the smaller
//! `max(F (1 - f), (m - F) f)`, in Q16 fixed point. These functions mirror ferrox-core's
//! `recommend_backend`, `fetch_fraction_from_bandwidths`, `fetch_fraction_from_overlap` and
//! `balanced_fetch` exactly (a test compares them where ferrox-core is available).
//!
//! The verdict is taken on the standalone pair, as `ft bench bw` prints it and as the field
//! report quotes it (46.12 / 24.25 = 1.90 -> offload).

use serde::{Deserialize, Serialize};
use std::fmt;

use super::cost::ExpertShape;
use super::PerfParams;

/// The default threshold of the legacy rule.
pub const DEFAULT_THRESHOLD: f64 = 2.0;

/// Q16 fixed point: `FRACTION_ONE` means "fetch everything".
pub const FRACTION_ONE: u64 = 1 << 16;

/// What the legacy rule says.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum LegacyVerdict {
    /// Ratio at or below the threshold.
    Offload,
    /// Ratio above the threshold.
    Hybrid,
}

impl LegacyVerdict {
    /// Name in tables.
    pub fn name(self) -> &'static str {
        match self {
            LegacyVerdict::Offload => "offload",
            LegacyVerdict::Hybrid => "hybrid",
        }
    }
}

impl fmt::Display for LegacyVerdict {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// ferrox-core `recommend_backend`: hybrid iff `cpu_bw_gbs > threshold * pcie_bw_gbs`.
pub fn recommend(cpu_bw_gbs: f64, pcie_bw_gbs: f64, threshold: f64) -> LegacyVerdict {
    if cpu_bw_gbs > threshold * pcie_bw_gbs {
        LegacyVerdict::Hybrid
    } else {
        LegacyVerdict::Offload
    }
}

/// ferrox-core `fetch_fraction_from_bandwidths`: `min(p / c, 1)` from standalone numbers;
/// `None` unless both are positive.
pub fn fetch_fraction_from_bandwidths(cpu_gbs: f64, pcie_gbs: f64) -> Option<f64> {
    if cpu_gbs <= 0.0 || pcie_gbs <= 0.0 {
        return None;
    }
    Some((pcie_gbs / cpu_gbs).min(1.0))
}

/// ferrox-core `fetch_fraction_from_overlap`: `min(p_ov / (p_ov + c_ov), 1)` from the
/// contended pair; `None` unless both are positive.
pub fn fetch_fraction_from_overlap(cpu_overlap_gbs: f64, pcie_overlap_gbs: f64) -> Option<f64> {
    if cpu_overlap_gbs <= 0.0 || pcie_overlap_gbs <= 0.0 {
        return None;
    }
    Some((pcie_overlap_gbs / (pcie_overlap_gbs + cpu_overlap_gbs)).min(1.0))
}

/// A fraction in Q16, as ferrox-core's `QStarPolicy::from_fraction` rounds it.
pub fn fraction_q16(fraction: f64) -> u64 {
    (fraction * FRACTION_ONE as f64)
        .round()
        .clamp(0.0, FRACTION_ONE as f64) as u64
}

/// ferrox-core `balanced_fetch`: how many of `missing` misses to fetch at Q16 fraction
/// `fraction_q16`.
pub fn balanced_fetch(missing: usize, fraction_q16: u64) -> usize {
    if fraction_q16 == 0 || missing == 0 {
        return 0;
    }
    let m = missing as i128;
    let f = fraction_q16 as i128;
    let q = FRACTION_ONE as i128;
    let cost = |fetched: i128| -> i128 { (fetched * (q - f)).max((m - fetched) * f) };
    let lo = (m * f) >> 16;
    let best = if cost(lo) <= cost(lo + 1) { lo } else { lo + 1 };
    best.clamp(0, m) as usize
}

/// An `ft bench bw` measurement: CPU-MoE and PCIe-gather bandwidths (expert bytes over
/// step time) at one expert size, alone and while contending.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BenchBw {
    /// Bytes of the experts the bench used.
    pub expert_bytes: u64,
    /// Experts per bench step.
    pub experts: u32,
    /// CPU-MoE bandwidth alone, in GB/s.
    pub cpu_moe_gbs: f64,
    /// PCIe-gather bandwidth alone, in GB/s.
    pub pcie_gather_gbs: f64,
    /// CPU-MoE bandwidth while the gather runs, in GB/s.
    #[serde(default)]
    pub cpu_moe_overlap_gbs: Option<f64>,
    /// PCIe-gather bandwidth while the CPU kernel runs, in GB/s.
    #[serde(default)]
    pub pcie_gather_overlap_gbs: Option<f64>,
}

impl BenchBw {
    /// What `ft bench bw` would measure on a host with these parameters: a step of
    /// `p.bench_experts` experts of `p.bench_expert` (one token each) on the CPU and over the
    /// link, alone and with the other side streaming throughout.
    pub fn modelled(p: &PerfParams) -> Self {
        Self::modelled_at(p, p.bench_expert, p.bench_experts)
    }

    /// [`BenchBw::modelled`] at another expert shape and step size (what the bench would say
    /// at the served model's geometry).
    pub fn modelled_at(p: &PerfParams, shape: ExpertShape, experts: u32) -> Self {
        let n = experts as f64;
        let t = p.cpu_threads as f64;
        let gbs = |us: f64| n * shape.bytes / (us * super::BYTES_PER_US_PER_GBS);
        BenchBw {
            expert_bytes: shape.bytes as u64,
            experts,
            cpu_moe_gbs: gbs(p.cpu_step_us(n, n, shape, t)),
            pcie_gather_gbs: gbs(p.gather_us(n, shape.bytes)),
            cpu_moe_overlap_gbs: Some(gbs(p.cpu_step_contended_us(n, n, shape, t))),
            pcie_gather_overlap_gbs: Some(gbs(p.gather_contended_us(n, shape.bytes, t))),
        }
    }
}

/// The legacy rule applied to a bench measurement.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct LegacyRatio {
    /// CPU-MoE bandwidth the verdict used, in GB/s.
    pub cpu_moe_gbs: f64,
    /// PCIe-gather bandwidth the verdict used, in GB/s.
    pub pcie_gather_gbs: f64,
    /// `cpu_moe_gbs / pcie_gather_gbs`.
    pub ratio: f64,
    /// The threshold.
    pub threshold: f64,
    /// The verdict.
    pub verdict: LegacyVerdict,
    /// The reference engine's fetch fraction (contended pair first), when computable.
    pub fetch_fraction: Option<f64>,
    /// True when `fetch_fraction` came from the contended pair.
    pub fraction_from_contended: bool,
    /// Bytes of the experts the bandwidths were measured at.
    pub expert_bytes: u64,
}

/// The legacy verdict of a standalone pair (no fetch fraction beyond the standalone one).
pub fn legacy_ratio(cpu_moe_gbs: f64, pcie_gather_gbs: f64, threshold: f64) -> LegacyRatio {
    LegacyRatio {
        cpu_moe_gbs,
        pcie_gather_gbs,
        ratio: cpu_moe_gbs / pcie_gather_gbs,
        threshold,
        verdict: recommend(cpu_moe_gbs, pcie_gather_gbs, threshold),
        fetch_fraction: fetch_fraction_from_bandwidths(cpu_moe_gbs, pcie_gather_gbs),
        fraction_from_contended: false,
        expert_bytes: 0,
    }
}

impl LegacyRatio {
    /// The legacy rule on a bench measurement: verdict on the standalone pair, fetch fraction
    /// from the contended pair where both sides of it were measured.
    pub fn from_bench(b: &BenchBw, threshold: f64) -> Self {
        let mut r = legacy_ratio(b.cpu_moe_gbs, b.pcie_gather_gbs, threshold);
        r.expert_bytes = b.expert_bytes;
        if let (Some(c), Some(p)) = (b.cpu_moe_overlap_gbs, b.pcie_gather_overlap_gbs) {
            if let Some(f) = fetch_fraction_from_overlap(c, p) {
                r.fetch_fraction = Some(f);
                r.fraction_from_contended = true;
            }
        }
        r
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_field_reports_ratio_says_offload() {
        let r = legacy_ratio(46.12, 24.25, DEFAULT_THRESHOLD);
        assert_eq!(r.verdict, LegacyVerdict::Offload);
        assert!((r.ratio - 1.902).abs() < 5e-4);
        assert_eq!(recommend(100.0, 40.0, 2.0), LegacyVerdict::Hybrid);
        // Exactly at the threshold is not "above".
        assert_eq!(recommend(80.0, 40.0, 2.0), LegacyVerdict::Offload);
    }

    /// ferrox-core's own examples.
    #[test]
    fn fractions_and_splits_follow_the_reference_engine() {
        assert_eq!(fetch_fraction_from_bandwidths(100.0, 40.0), Some(0.4));
        assert_eq!(fetch_fraction_from_overlap(90.0, 30.0), Some(0.25));
        assert_eq!(fetch_fraction_from_bandwidths(10.0, 40.0), Some(1.0));
        assert_eq!(fetch_fraction_from_bandwidths(0.0, 40.0), None);
        assert_eq!(balanced_fetch(3, fraction_q16(0.415)), 1);
        assert_eq!(balanced_fetch(4, fraction_q16(0.415)), 2);
        assert_eq!(balanced_fetch(9, fraction_q16(1.0)), 9);
        assert_eq!(balanced_fetch(9, 0), 0);
    }

    /// `balanced_fetch` against a naive reference: the F in 0..=m minimising
    /// `max(F (1 - f), (m - F) f)` in exact integers, ties to the lower, restricted to the two
    /// neighbours of `f m` as the reference engine restricts it.
    #[test]
    fn balanced_fetch_matches_a_brute_force_search() {
        for q in [1u64, 1000, 16384, 27197, 32768, 50000, 65535, 65536] {
            for m in 0..=64usize {
                let got = balanced_fetch(m, q);
                if m == 0 {
                    assert_eq!(got, 0);
                    continue;
                }
                let (mi, fi, qi) = (m as i128, q as i128, FRACTION_ONE as i128);
                let lo = (mi * fi) / qi;
                let best = (lo..=(lo + 1).min(mi))
                    .min_by_key(|&f| ((f * (qi - fi)).max((mi - f) * fi), f))
                    .unwrap();
                assert_eq!(got as i128, best, "m={m} q={q}");
                assert!((got as f64 - q as f64 / 65536.0 * m as f64).abs() <= 1.0);
            }
        }
    }

    #[test]
    fn the_contended_pair_gives_the_fraction() {
        let b = BenchBw {
            expert_bytes: 7_974_912,
            experts: 8,
            cpu_moe_gbs: 100.0,
            pcie_gather_gbs: 40.0,
            cpu_moe_overlap_gbs: Some(90.0),
            pcie_gather_overlap_gbs: Some(30.0),
        };
        let r = LegacyRatio::from_bench(&b, DEFAULT_THRESHOLD);
        assert_eq!(r.verdict, LegacyVerdict::Hybrid);
        assert_eq!(r.fetch_fraction, Some(0.25));
        assert!(r.fraction_from_contended);
        let alone = BenchBw {
            cpu_moe_overlap_gbs: None,
            ..b
        };
        let r = LegacyRatio::from_bench(&alone, DEFAULT_THRESHOLD);
        assert_eq!(r.fetch_fraction, Some(0.4));
        assert!(!r.fraction_from_contended);
    }
}
