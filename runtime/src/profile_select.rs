//! The profile a command on this machine predicts from, and the device it runs on: the part
//! of choosing a profile that needs a device (this machine's fingerprint, probing it).
//!
//! Order ([`select`]): a given profile (`--profile`), checked for the model and the pool's
//! threads and used only where its fit is trusted; a host spec (`--host`: a what-if); the
//! cached profile whose key matches this machine, this model and this version; on a CUDA
//! device without one, `ft probe` run here (within its budget) and stored atomically in the
//! cache; else the fallback host spec, loudly. The rules shared with commands that need no
//! device are [`ft_model::profile_select`].

use std::path::Path;

use ft_kernels::ActivationPath;
use ft_model::cache::CacheOptions;
use ft_model::perf::fit::FitConfig;
use ft_model::profile::{self, ProfileKey};
use ft_model::profile_select::{self as select_rules, PerfSource};
use ft_model::ModelSpec;

use crate::engine::EngineSettings;
use crate::error::{Result, RuntimeError};
use crate::probe as rprobe;
use crate::{Device, DeviceKind, DeviceSpec};

/// A device by name: `cuda` (or `gpu`), `host`, or `auto` (CUDA where available, else the
/// host-emulated device, logged); errors name the input.
pub fn device_kind(name: &str) -> Result<DeviceKind> {
    if name.eq_ignore_ascii_case("auto") {
        return Ok(if crate::cuda_available() {
            DeviceKind::Cuda
        } else {
            tracing::info!("no CUDA device here: using the host-emulated device");
            DeviceKind::Host
        });
    }
    name.parse()
}

/// Open the device `name` names ([`device_kind`]).
pub fn open_device(name: &str) -> Result<Device> {
    Device::open(&DeviceSpec::of_kind(device_kind(name)?))
}

/// What a command asked for.
#[derive(Debug, Clone, Copy)]
pub struct Selection<'a> {
    /// A profile file to predict from (`--profile`).
    pub profile: Option<&'a Path>,
    /// A host spec to predict from instead of this machine (`--host`).
    pub host: Option<&'a str>,
    /// The serving pool's CPU threads: a profile fitted at another count is re-expressed
    /// there.
    pub threads: u32,
    /// The host spec used where nothing else is (no device, nothing probed).
    pub fallback_host: &'a str,
    /// Probe a CUDA device that has no usable cached profile.
    pub probe: bool,
    /// The cache the command runs with: part of the profile's key, and what a probe uses.
    pub cache_options: &'a CacheOptions,
}

/// The key of this machine's profile for `model` with `settings` and `cache`.
pub fn profile_key(
    device: &Device,
    model: &ModelSpec,
    settings: &EngineSettings,
    cache: &CacheOptions,
) -> ProfileKey {
    ProfileKey::new(
        rprobe::host_fingerprint(
            device,
            &rprobe::CpuTopology::detect(),
            ActivationPath::preferred(model.format),
            settings,
            cache,
        ),
        model,
    )
}

/// The source a command predicts from (see the module docs); `device` is the one the
/// command runs on (`None` where it runs none, e.g. the reference backend).
pub fn select(
    sel: &Selection<'_>,
    model: &ModelSpec,
    device: Option<&Device>,
    settings: &EngineSettings,
) -> Result<PerfSource> {
    let threads = Some(sel.threads);
    let mut why_not_given = None;
    if let Some(path) = sel.profile {
        let input = format!("--profile {}", path.display());
        match select_rules::given_profile(path, &input, model, Some(sel.threads as usize))? {
            Ok(p) => {
                return Ok(select_rules::from_profile(
                    p,
                    format!("profile {}", path.display()),
                    threads,
                )?)
            }
            Err(why) => {
                tracing::warn!("{input}: UNTRUSTED profile, not used: {why}");
                why_not_given = Some(format!("{input} is untrusted ({why})"));
            }
        }
    }
    if let Some(name) = sel.host {
        return select_rules::from_host(name, "")
            .map_err(|e| RuntimeError::invalid("--host", format!("{name}: {e}")));
    }
    let Some(device) = device else {
        let why = why_not_given.unwrap_or_else(|| "there is no device to probe".to_string());
        return Ok(select_rules::from_host(sel.fallback_host, &why)?);
    };
    let key = profile_key(device, model, settings, sel.cache_options);
    let dir = profile::profile_dir()?;
    let mut why = match select_rules::cached(&dir, &key, false) {
        Ok(Ok(p)) => {
            let label = format!(
                "cached profile {} (key matches this host, model and version)",
                dir.join(key.file_name()).display()
            );
            return Ok(select_rules::from_profile(p, label, threads)?);
        }
        Ok(Err(reasons)) => format!(
            "no usable cached profile for this host, model and version ({})",
            reasons.join("; ")
        ),
        Err(e) => format!("the profile cache cannot be read ({e})"),
    };
    if let Some(w) = why_not_given {
        why = format!("{w}, and {why}");
    }
    if device.kind() != DeviceKind::Cuda || !sel.probe {
        let what = if device.kind() != DeviceKind::Cuda {
            "the host-emulated device has nothing real to probe"
        } else {
            "probing is off"
        };
        return Ok(select_rules::from_host(
            sel.fallback_host,
            &format!("{why}, and {what}"),
        )?);
    }
    tracing::info!(
        "{why}: probing this machine (ft probe, at most {:.0} s)",
        rprobe::ProbeConfig::default().budget_s
    );
    let config = rprobe::ProbeConfig {
        threads: sel.threads as usize,
        engine: *settings,
        cache_options: sel.cache_options.clone(),
        ..rprobe::ProbeConfig::default()
    };
    let t0 = std::time::Instant::now();
    let probed = rprobe::run(device, model, &config, &mut |_, _| {}).and_then(|outcome| {
        rprobe::fit_profile(device, &outcome, key.host.clone(), &FitConfig::default())
    });
    match probed {
        Ok((profile, _, _)) => {
            let path = profile::store(&dir, &profile)?;
            let label = format!(
                "profile probed at start in {:.1} s (stored as {})",
                t0.elapsed().as_secs_f64(),
                path.display()
            );
            tracing::info!("{label}");
            Ok(select_rules::from_profile(profile, label, threads)?)
        }
        Err(e) => Ok(select_rules::from_host(
            sel.fallback_host,
            &format!("{why}, and probing failed ({e})"),
        )?),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn device_names() {
        assert_eq!(device_kind("host").unwrap(), DeviceKind::Host);
        assert_eq!(device_kind("GPU").unwrap(), DeviceKind::Cuda);
        let auto = device_kind("auto").unwrap();
        assert_eq!(auto == DeviceKind::Cuda, crate::cuda_available());
        let e = device_kind("tpu").unwrap_err().to_string();
        assert!(e.contains("tpu"), "{e}");
    }

    /// Without a device: a host spec as asked, else the fallback; an untrusted given
    /// profile falls back loudly instead of being used.
    #[test]
    fn without_a_device_the_fallback_stands_in() {
        let model = ModelSpec::preset("qwen3.8-flash-next").unwrap();
        let settings = EngineSettings::default();
        let sel = Selection {
            profile: None,
            host: Some("gh200"),
            threads: 4,
            fallback_host: ft_model::hosts::DEFAULT_HOST,
            probe: false,
            cache_options: &CacheOptions::default(),
        };
        let s = select(&sel, &model, None, &settings).unwrap();
        assert_eq!(s.label, "host spec gh200");
        let s = select(&Selection { host: None, ..sel }, &model, None, &settings).unwrap();
        assert_eq!(
            s.label,
            format!("host spec {}", ft_model::hosts::DEFAULT_HOST)
        );
        let e = select(
            &Selection {
                host: Some("no-such"),
                ..sel
            },
            &model,
            None,
            &settings,
        )
        .unwrap_err()
        .to_string();
        assert!(e.contains("--host") && e.contains("no-such"), "{e}");
    }
}
