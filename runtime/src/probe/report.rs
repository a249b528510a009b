//! What `ft probe` reports (its `--json` document): the profile used (probed now or reused
//! from the cache), every fitted parameter with its standard error, how each stage of the
//! fit went, the residuals per probe, the legacy rule's verdict on the probed bench
//! bandwidths, and what an export wrote.

use serde::Serialize;

use ft_model::freetoken::ExportSummary;
use ft_model::perf::fit::{ParamEstimate, StageReport};
use ft_model::perf::legacy::{BenchBw, LegacyRatio};
use ft_model::perf::residuals::{residual_summaries, ResidualSummary};
use ft_model::profile::{Profile, ProfileKey};
use ft_model::ModelSpec;

use super::ProbeOutcome;
use crate::device::DeviceInfo;
use crate::engine::EngineSettings;

/// The `--json` document of `ft probe`.
#[derive(Debug, Serialize)]
pub struct ProbeReport {
    /// The model the profile is for.
    pub model: ModelSpec,
    /// The device probed.
    pub device: DeviceInfo,
    /// True when a fresh cached profile was reused (nothing was measured).
    pub reused: bool,
    /// Why a cached profile was not reused (stale key parts, a corrupt file).
    pub reprobe_reasons: Vec<String>,
    /// Where the profile is cached.
    pub profile_path: String,
    /// The `--profile-out` copy.
    pub profile_copy: Option<String>,
    /// The profile's key.
    pub key: ProfileKey,
    /// The engine's settings the profile describes (also in the key's GPU paths).
    pub engine: EngineSettings,
    /// What the probes measured (absent when reused).
    pub outcome: Option<ProbeOutcome>,
    /// Every parameter with its standard error and interval.
    pub estimates: Vec<ParamEstimate>,
    /// How each stage of the fit went.
    pub stages: Vec<StageReport>,
    /// Residuals per probe.
    pub residuals: Vec<ResidualSummary>,
    /// The legacy bench's bandwidths at its tuning geometry (measured by the probes).
    pub bench_bw: Option<BenchBw>,
    /// The legacy rule on them.
    pub legacy: Option<LegacyRatio>,
    /// What `--export-freetoken` wrote.
    pub export: Option<ExportSummary>,
    /// Why the fit is not to be trusted, where it is not: its validation runs missed by more
    /// than `ft_model::limits::MAX_TRUSTED_VALIDATION_RMS` (the profile is cached, marked).
    pub untrusted: Option<String>,
}

/// Where a report's profile came from and what was written beside it.
#[derive(Debug)]
pub struct ProfileUse {
    /// True when a fresh cached profile was reused.
    pub reused: bool,
    /// Why a cached profile was not reused.
    pub reprobe_reasons: Vec<String>,
    /// Where the profile is cached.
    pub profile_path: String,
    /// A copy written elsewhere.
    pub profile_copy: Option<String>,
    /// What the probes measured (absent when reused).
    pub outcome: Option<ProbeOutcome>,
    /// What an export wrote.
    pub export: Option<ExportSummary>,
    /// The profile's key as this machine computed it.
    pub key: ProfileKey,
}

impl ProbeReport {
    /// The report of `profile` for `model` on `device`: its fit's estimates, stages and
    /// residuals, and the legacy rule at `threshold` on its bench bandwidths.
    pub fn of(
        model: &ModelSpec,
        device: DeviceInfo,
        profile: &Profile,
        engine: EngineSettings,
        used: ProfileUse,
        threshold: f64,
    ) -> Self {
        let (estimates, stages, residuals) = match &profile.fit {
            Some(f) => (
                f.estimates.clone(),
                f.stages.clone(),
                residual_summaries(f, &profile.samples),
            ),
            None => (Vec::new(), Vec::new(), Vec::new()),
        };
        ProbeReport {
            model: model.clone(),
            device,
            reprobe_reasons: if used.reused {
                Vec::new()
            } else {
                used.reprobe_reasons
            },
            reused: used.reused,
            profile_path: used.profile_path,
            profile_copy: used.profile_copy,
            key: used.key,
            engine,
            outcome: used.outcome,
            estimates,
            stages,
            residuals,
            bench_bw: profile.bench_bw,
            legacy: profile
                .bench_bw
                .map(|b| LegacyRatio::from_bench(&b, threshold)),
            export: used.export,
            untrusted: profile.trust_issue(),
        }
    }
}
