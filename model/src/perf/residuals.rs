//! The fit's residuals summarised per probe (relative errors: bias, RMS, median and p90 of
//! the absolute values), as `ft probe` reports them beside the fitted parameters.

use serde::Serialize;

use super::fit::{FitReport, ProbeSamples, Residual};
use crate::strategy::StrategyKind;

/// Residuals of one probe, summarised (statrs), relative: `(predicted - measured) / measured`.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ResidualSummary {
    /// The probe (`gather`, `cpu-step`, ..., `step`; `step (validation)` for the runs never
    /// fitted).
    pub probe: String,
    /// Samples.
    pub n: usize,
    /// Mean relative residual (bias).
    pub mean_rel: f64,
    /// Root mean square relative residual.
    pub rms_rel: f64,
    /// Median of the absolute relative residuals.
    pub median_abs_rel: f64,
    /// 90th percentile of the absolute relative residuals.
    pub p90_abs_rel: f64,
    /// Largest absolute relative residual.
    pub max_abs_rel: f64,
}

impl ResidualSummary {
    /// Summarise residuals of one probe (`None` when there are none).
    pub fn of(probe: &str, rels: &[f64]) -> Option<Self> {
        use statrs::statistics::{Data, OrderStatistics, Statistics};
        if rels.is_empty() {
            return None;
        }
        let abs: Vec<f64> = rels.iter().map(|r| r.abs()).collect();
        let mut data = Data::new(abs.clone());
        Some(ResidualSummary {
            probe: probe.to_string(),
            n: rels.len(),
            mean_rel: rels.mean(),
            rms_rel: rels.quadratic_mean(),
            median_abs_rel: data.median(),
            p90_abs_rel: data.percentile(90),
            max_abs_rel: abs.iter().copied().fold(0.0, f64::max),
        })
    }
}

/// Residual summaries of a fit: one per probe in order, then the validation runs.
pub fn residual_summaries(fit: &FitReport, samples: &ProbeSamples) -> Vec<ResidualSummary> {
    let mut probes: Vec<&str> = Vec::new();
    for r in &fit.residuals {
        if !probes.contains(&r.probe.as_str()) {
            probes.push(&r.probe);
        }
    }
    let of = |rs: &[&Residual]| rs.iter().map(|r| r.rel).collect::<Vec<f64>>();
    let mut out: Vec<ResidualSummary> = probes
        .iter()
        .filter_map(|p| {
            let rs: Vec<&Residual> = fit.residuals.iter().filter(|r| r.probe == *p).collect();
            ResidualSummary::of(p, &of(&rs))
        })
        .collect();
    for kind in StrategyKind::ALL {
        let rs: Vec<&Residual> = fit
            .validation
            .iter()
            .filter(|r| {
                samples
                    .step
                    .get(r.index)
                    .is_some_and(|s| s.strategy == kind)
            })
            .collect();
        if let Some(s) = ResidualSummary::of(&format!("step validation ({kind})"), &of(&rs)) {
            out.push(s);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn residual_summaries_use_absolute_relative_errors() {
        let s = ResidualSummary::of("x", &[0.01, -0.02, 0.03, -0.04]).unwrap();
        assert_eq!(s.n, 4);
        assert!((s.max_abs_rel - 0.04).abs() < 1e-12);
        assert!((s.mean_rel + 0.005).abs() < 1e-12);
        let rms = ((1.0 + 4.0 + 9.0 + 16.0) / 4.0f64).sqrt() / 100.0;
        assert!((s.rms_rel - rms).abs() < 1e-12);
        assert!(s.median_abs_rel > 0.01 && s.median_abs_rel < 0.04);
        assert!(ResidualSummary::of("x", &[]).is_none());
    }
}
