//! Choosing the parameters a command predicts from: a given profile, a host spec, or the
//! cached profile of this machine, each checked the same way whichever command asks.
//!
//! `ft serve` and `ft run` both pick a profile before they predict; the rules live here so
//! that they cannot drift apart. A profile is used only when it fits what it is used for
//! ([`Profile::check_for`]: the model's format and per-layer geometry, the serving threads)
//! and its fit is trusted ([`Profile::trust_issue`]); one fitted at another thread count
//! than the serving pool's is re-expressed there ([`Profile::at_threads`]). The part that
//! needs a device (the fingerprint of this machine, probing it) is
//! `ft_runtime::profile_select`.

use std::path::Path;

use crate::error::Result;
use crate::hosts;
use crate::perf::fit::ProbeSamples;
use crate::perf::PerfModel;
use crate::preset::ModelSpec;
use crate::profile::{self, CpuCheck, Lookup, Profile, ProfileKey};

/// What a prediction rests on: the parameters, the probe's samples (for refits), where they
/// came from, and the probe's CPU checks (what a check of the CPU side at start is set
/// against; empty for a host spec or an older profile).
#[derive(Debug, Clone)]
pub struct PerfSource {
    /// Parameters with their uncertainty.
    pub perf: PerfModel,
    /// The probe's samples (empty for a host spec).
    pub samples: ProbeSamples,
    /// Where it came from, in words.
    pub label: String,
    /// The probe's CPU checks.
    pub cpu_checks: Vec<CpuCheck>,
}

/// A profile as a source, re-expressed at `threads` CPU threads where given and different
/// from the count it was fitted at; `label` says where it came from (and gains the
/// re-expression).
pub fn from_profile(p: Profile, label: String, threads: Option<u32>) -> Result<PerfSource> {
    let p = match threads {
        Some(t) if t != p.params.cpu_threads => {
            let probed = p.params.cpu_threads;
            let q = p.at_threads(t)?;
            let label =
                format!("{label}, re-expressed at the pool's {t} threads (fitted at {probed})");
            tracing::info!("{label}");
            return Ok(PerfSource {
                perf: q.perf_model(&label),
                samples: q.samples.clone(),
                cpu_checks: q.cpu_checks.clone(),
                label,
            });
        }
        _ => p,
    };
    Ok(PerfSource {
        perf: p.perf_model(&label),
        samples: p.samples.clone(),
        cpu_checks: p.cpu_checks.clone(),
        label,
    })
}

/// A host spec (a preset or a host TOML) as a source; `why`, where not empty, is logged as
/// the reason a spec stands in for this machine's profile.
pub fn from_host(name_or_path: &str, why: &str) -> Result<PerfSource> {
    let host = hosts::resolve(name_or_path)?;
    if !why.is_empty() {
        tracing::warn!(
            "{why}: predicting from the perf model with host spec '{}'",
            host.name
        );
    }
    Ok(PerfSource {
        label: format!("host spec {}", host.name),
        perf: host.perf,
        samples: ProbeSamples::default(),
        cpu_checks: Vec::new(),
    })
}

/// A profile named on the command line (`input`, e.g. `--profile P`), checked for `model`
/// and `threads` ([`Profile::check_for`]: a mismatch is an error naming `input`). Returns
/// `Ok(Err(why))` where the profile is well formed but its fit is untrusted: a caller
/// that would serve from it treats it as the cached path does (re-probe or fall back).
pub fn given_profile(
    path: &Path,
    input: &str,
    model: &ModelSpec,
    threads: Option<usize>,
) -> Result<std::result::Result<Profile, String>> {
    let p = Profile::read(path)?;
    p.check_for(input, model, threads)?;
    Ok(match p.trust_issue() {
        None => Ok(p),
        Some(why) => Err(why),
    })
}

/// The cached profile for `key` in `dir`, or why there is none usable (stale, missing,
/// corrupt or, unless `keep_untrusted`, untrusted), each reason logged.
pub fn cached(
    dir: &Path,
    key: &ProfileKey,
    keep_untrusted: bool,
) -> Result<std::result::Result<Profile, Vec<String>>> {
    Ok(match profile::load(dir, key)? {
        Lookup::Fresh(p) => match p.trust_issue() {
            None => Ok(*p),
            Some(_) if keep_untrusted => Ok(*p),
            Some(why) => {
                tracing::warn!(path = %dir.join(key.file_name()).display(), "untrusted cached profile, re-probing: {why}");
                Err(vec![format!("untrusted: {why}")])
            }
        },
        Lookup::Stale { path, mismatches } => Err(mismatches
            .iter()
            .map(|m| {
                tracing::info!(path = %path.display(), "stale profile: {m}");
                format!("stale: {m}")
            })
            .collect()),
        Lookup::Missing { .. } => Err(vec!["no cached profile".to_string()]),
        Lookup::Corrupt { path, reason } => {
            tracing::warn!(path = %path.display(), "corrupt profile, re-probing: {reason}");
            Err(vec![format!("corrupt: {reason}")])
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::perf::PerfParams;
    use crate::profile::HostFingerprint;

    fn profile(threads: u32, model: &ModelSpec) -> Profile {
        let spec = hosts::preset("h200-xeon-emr").unwrap();
        let mut params = PerfParams::from_host(&spec).unwrap();
        params.cpu_threads = threads;
        Profile {
            key: ProfileKey::new(HostFingerprint::of_spec(&spec), model),
            created_unix_s: 0,
            covariance: params.host_prior(&spec),
            params,
            dof: Some(12),
            fit: None,
            samples: Default::default(),
            bench_bw: None,
            probe_steal_fraction: None,
            cpu_checks: Vec::new(),
            untrusted: None,
            calibration: None,
        }
    }

    #[test]
    fn a_profile_is_re_expressed_at_the_pool_threads_only_when_they_differ() {
        let model = ModelSpec::preset("qwen3.8-flash-next").unwrap();
        let p = profile(16, &model);
        let same = from_profile(p.clone(), "p".into(), Some(16)).unwrap();
        assert_eq!(same.perf.params, p.params);
        assert_eq!(same.label, "p");
        let other = from_profile(p.clone(), "p".into(), Some(8)).unwrap();
        assert_eq!(other.perf.params, p.at_threads(8).unwrap().params);
        assert!(other.label.contains("fitted at 16"), "{}", other.label);
    }

    #[test]
    fn a_given_profile_is_checked_and_gated() {
        let model = ModelSpec::preset("qwen3.8-flash-next").unwrap();
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("p.json");
        let mut p = profile(16, &model);
        std::fs::write(&path, serde_json::to_string(&p).unwrap()).unwrap();
        assert!(given_profile(&path, "--profile p", &model, Some(16))
            .unwrap()
            .is_ok());
        // Another model's geometry: an error naming the input.
        let other = ModelSpec::preset("qwen3.6-35b-a3b").unwrap();
        let e = given_profile(&path, "--profile p", &other, None)
            .unwrap_err()
            .to_string();
        assert!(e.contains("--profile p"), "{e}");
        // An untrusted fit is well formed but not used.
        p.untrusted = Some("validation rms 346%".into());
        std::fs::write(&path, serde_json::to_string(&p).unwrap()).unwrap();
        let why = given_profile(&path, "--profile p", &model, Some(16))
            .unwrap()
            .unwrap_err();
        assert!(why.contains("346%"), "{why}");
    }

    #[test]
    fn the_cache_path_gives_reasons() {
        let model = ModelSpec::preset("qwen3.8-flash-next").unwrap();
        let dir = tempfile::tempdir().unwrap();
        let p = profile(16, &model);
        let r = cached(dir.path(), &p.key, false).unwrap().unwrap_err();
        assert_eq!(r, vec!["no cached profile".to_string()]);
        profile::store(dir.path(), &p).unwrap();
        assert!(cached(dir.path(), &p.key, false).unwrap().is_ok());
        let mut u = p.clone();
        u.untrusted = Some("bad fit".into());
        profile::store(dir.path(), &u).unwrap();
        let r = cached(dir.path(), &p.key, false).unwrap().unwrap_err();
        assert!(r[0].starts_with("untrusted"), "{r:?}");
        assert!(cached(dir.path(), &p.key, true).unwrap().is_ok());
    }
}
