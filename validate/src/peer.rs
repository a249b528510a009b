//! ferrox-core as a peer: its verdict and fetch fraction fed the same bench bandwidths as
//! ft's mirror of the ratio rule.

use serde::Serialize;

use ft_model::perf::legacy::{self, FRACTION_ONE};

use crate::error::{Result, ValidateError};

/// ferrox-core's answer for one set of bench bandwidths.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct PeerAnswer {
    /// ferrox-core `entry_from(..).recommended` (the contended pair where it exists).
    pub verdict: String,
    /// ferrox-core's fetch fraction (`KernelBandwidths::fetch_fraction`, contended pair
    /// first), Q16-rounded as `QStarPolicy::from_fraction` carries it.
    pub fraction: f64,
    /// Its Q16 value.
    pub fraction_q16: u64,
    /// The ratio rule's verdict (standalone pair, as `ft bench bw` prints it): ft's mirror.
    pub ratio_verdict: String,
    /// True when ferrox-core's split of every miss count 0..=64 at the fraction is the one
    /// ft's planner makes.
    pub split_agrees: bool,
}

/// Most misses at which the planner's split is compared with ferrox-core's.
const SPLIT_CHECK_MISSES: usize = 64;

/// ferrox-core fed `(cpu, pcie, cpu_ov, pcie_ov)` in GB/s.
pub fn peer(
    cpu: f64,
    pcie: f64,
    cpu_ov: Option<f64>,
    pcie_ov: Option<f64>,
    threshold: f64,
) -> Result<PeerAnswer> {
    use ferrox_core::bench_profile::{entry_from, Measured};
    let m = Measured {
        cpu_moe_gbs: Some(cpu),
        pcie_gather_gbs: Some(pcie),
        cpu_moe_overlap_gbs: cpu_ov,
        pcie_gather_overlap_gbs: pcie_ov,
    };
    let entry = entry_from(&m, threshold).map_err(|e| {
        ValidateError::invalid("bench bandwidths", format!("ferrox-core refused them: {e}"))
    })?;
    let verdict = match entry.recommended {
        Some(ferrox_core::qstar::MoeBackend::Hybrid) => "hybrid",
        Some(ferrox_core::qstar::MoeBackend::Cpu) => "cpu",
        Some(ferrox_core::qstar::MoeBackend::Fused) => "resident",
        _ => "offload",
    };
    let raw = entry.fetch_fraction().unwrap_or(1.0);
    let policy = ferrox_core::qstar::QStarPolicy::from_fraction(raw);
    let q = policy.fraction_q16();
    let f = q as f64 / FRACTION_ONE as f64;
    let split_agrees = (0..=SPLIT_CHECK_MISSES)
        .all(|m| policy.split(m).fetch == ft_model::plan::fetch_count(f, m));
    Ok(PeerAnswer {
        verdict: verdict.into(),
        fraction: f,
        fraction_q16: q,
        ratio_verdict: legacy::recommend(cpu, pcie, threshold).name().into(),
        split_agrees,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The field report's pair through ferrox-core: the ratio rule (standalone) says
    /// offload, ferrox-core's entry (contended pair preferred) says what its pair says, and
    /// the fraction is the contended pair's, Q16-rounded.
    #[test]
    fn the_peer_is_ferrox_cores_rule_on_the_same_numbers() {
        let a = peer(46.12, 24.25, Some(33.4), Some(12.8), 2.0).unwrap();
        assert_eq!(a.ratio_verdict, "offload");
        assert_eq!(a.verdict, "hybrid", "33.4 > 2 x 12.8 on the contended pair");
        let f = 12.8 / (12.8 + 33.4);
        assert!((a.fraction - f).abs() <= 0.5 / 65536.0 + 1e-12);
        assert!(a.split_agrees);
        let b = peer(46.12, 24.25, None, None, 2.0).unwrap();
        assert_eq!(b.verdict, "offload");
        assert!((b.fraction - (24.25f64 / 46.12).min(1.0)).abs() < 1e-4);
        assert!(peer(-1.0, 2.0, None, None, 2.0).is_err());
    }
}
