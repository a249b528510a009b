//! Host presets and `--host` resolution, for every command that predicts (predict, run,
//! serve, simulate) without needing the simulator.
//!
//! Each preset is a [`HostSpec`] TOML file in `model/hosts/` (embedded with `include_str!`),
//! whose header comment says where every number comes from: measured (a field report, this
//! project's GPU machine) or public specs and estimates. A `--host` argument is a preset
//! name, a path to any TOML file in the same form (unknown keys are refused by
//! [`HostSpec::from_toml_str`]), or a profile JSON written by `ft probe`
//! ([`crate::profile::Profile`]: fitted parameters instead of a spec).

use std::path::Path;

pub mod init;
pub mod show;

use crate::error::{ModelError, Result};
use crate::host::HostSpec;
use crate::perf::legacy::BenchBw;
use crate::perf::PerfModel;
use crate::profile::{CpuCheck, Profile};

/// A host as a command uses it: cost parameters with their uncertainty, from a spec
/// (through `PerfParams::from_host`) or a fitted profile.
#[derive(Debug, Clone, PartialEq)]
pub struct ResolvedHost {
    /// Name in tables.
    pub name: String,
    /// The parameters and their covariance.
    pub perf: PerfModel,
    /// The part of `perf.params.cpu_layer_us` that is the CPU pool's wake-up, us (from the
    /// spec's `engine.cpu_wake_us`; 0 for a profile, whose fit does not separate it, so the
    /// simulated pool then pays the whole fixed cost every layer, as the closed form does).
    pub wake_us: f64,
    /// A measured `ft bench bw` pair for the legacy rule (a profile's), if any.
    pub bench: Option<BenchBw>,
    /// The spec, when the host came from one.
    pub spec: Option<HostSpec>,
    /// The probe's CPU checks (a profile's; empty for a spec or an older profile): what a
    /// later check of the CPU side is set against (`ft run --fetch-fraction auto`).
    pub cpu_checks: Vec<CpuCheck>,
}

/// A host given by a spec (a preset or a TOML file), with the parameters it implies; it
/// dereferences to the [`HostSpec`].
#[derive(Debug, Clone, PartialEq)]
pub struct SpecHost {
    /// Name in tables (the spec's).
    pub name: String,
    /// `PerfModel::from_host` of the spec.
    pub perf: PerfModel,
    /// A measured bench pair for the legacy rule (none for a spec: the model derives it).
    pub bench: Option<BenchBw>,
    /// The spec.
    pub spec: HostSpec,
}

impl SpecHost {
    /// A host from a spec.
    pub fn new(spec: HostSpec) -> Result<Self> {
        Ok(SpecHost {
            name: spec.name.clone(),
            perf: PerfModel::from_host(&spec)?,
            bench: None,
            spec,
        })
    }
}

impl std::ops::Deref for SpecHost {
    type Target = HostSpec;

    fn deref(&self) -> &HostSpec {
        &self.spec
    }
}

impl From<SpecHost> for ResolvedHost {
    fn from(h: SpecHost) -> Self {
        ResolvedHost {
            name: h.name,
            perf: h.perf,
            wake_us: h.spec.engine.cpu_wake_us,
            bench: h.bench,
            spec: Some(h.spec),
            cpu_checks: Vec::new(),
        }
    }
}

impl ResolvedHost {
    /// A host from a spec.
    pub fn from_spec(spec: HostSpec) -> Result<Self> {
        Ok(SpecHost::new(spec)?.into())
    }

    /// A host from a profile JSON (`ft probe`'s output); errors name the file.
    pub fn from_profile(path: &Path) -> Result<Self> {
        let p = Profile::read(path)?;
        let name = path
            .file_stem()
            .map(|s| s.to_string_lossy().into_owned())
            .unwrap_or_else(|| "profile".to_string());
        Ok(ResolvedHost {
            perf: p.perf_model(&format!("profile {}", path.display())),
            name: format!("{name} ({})", p.key.host.gpu_name),
            wake_us: 0.0,
            bench: p.bench_bw,
            spec: None,
            cpu_checks: p.cpu_checks,
        })
    }
}

/// (name, TOML text) of every preset, in table order.
const PRESETS: [(&str, &str); 5] = [
    (
        "rtx4090-2x-xeon4310",
        include_str!("../hosts/rtx4090-2x-xeon4310.toml"),
    ),
    (
        "rtxpro4000-gen3-epyc7302",
        include_str!("../hosts/rtxpro4000-gen3-epyc7302.toml"),
    ),
    ("gh200", include_str!("../hosts/gh200.toml")),
    ("h200-xeon-emr", include_str!("../hosts/h200-xeon-emr.toml")),
    (
        "2x-rtx3090-tp-ryzen7950x",
        include_str!("../hosts/2x-rtx3090-tp-ryzen7950x.toml"),
    ),
];

/// The field report's host, the default `--host` of `ft predict` and `ft simulate`.
pub const DEFAULT_HOST: &str = "rtx4090-2x-xeon4310";

/// Names of the shipped presets.
pub fn preset_names() -> Vec<&'static str> {
    PRESETS.iter().map(|p| p.0).collect()
}

/// The TOML text of a preset (to print or copy as a starting point).
pub fn preset_toml(name: &str) -> Option<&'static str> {
    PRESETS.iter().find(|p| p.0 == name).map(|p| p.1)
}

/// A shipped preset by name.
pub fn preset(name: &str) -> Result<HostSpec> {
    let text = preset_toml(name).ok_or_else(|| ModelError::UnknownHost {
        name: name.to_string(),
        known: preset_names().join(", "),
    })?;
    let mut spec = HostSpec::from_toml_str(text, &format!("host preset {name}"))?;
    if spec.name.is_empty() {
        spec.name = name.to_string();
    }
    Ok(spec)
}

/// A preset name or a path to a host TOML file, with the parameters it implies (a profile
/// JSON has no spec: see [`resolve_host`]).
pub fn resolve(name_or_path: &str) -> Result<SpecHost> {
    SpecHost::new(resolve_spec(name_or_path)?)
}

/// A preset name or a path to a host TOML file, as a spec.
pub fn resolve_spec(name_or_path: &str) -> Result<HostSpec> {
    if preset_toml(name_or_path).is_some() {
        return preset(name_or_path);
    }
    let path = Path::new(name_or_path);
    let ext = path.extension().and_then(|e| e.to_str()).unwrap_or("");
    if ext.eq_ignore_ascii_case("toml") || (path.exists() && !ext.eq_ignore_ascii_case("json")) {
        return HostSpec::from_toml_file(path);
    }
    Err(ModelError::UnknownHost {
        name: name_or_path.to_string(),
        known: preset_names().join(", "),
    })
}

/// What `--host` names (`ft simulate`, `ft predict`, `ft run --fetch-fraction auto`): a preset, a host TOML file, or a profile JSON of
/// `ft probe`.
pub fn resolve_host(name_or_path: &str) -> Result<ResolvedHost> {
    let path = Path::new(name_or_path);
    let ext = path.extension().and_then(|e| e.to_str()).unwrap_or("");
    if preset_toml(name_or_path).is_none() && ext.eq_ignore_ascii_case("json") {
        return ResolvedHost::from_profile(path);
    }
    Ok(resolve(name_or_path)?.into())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_preset_parses_and_names_itself() {
        for name in preset_names() {
            let h = preset(name).unwrap();
            assert_eq!(h.name, name);
            assert!(!h.description.is_empty(), "{name} has no description");
            // Each file starts with its sources.
            assert!(preset_toml(name).unwrap().starts_with('#'), "{name}");
        }
    }

    #[test]
    fn presets_carry_the_measured_figures() {
        let f = preset("rtx4090-2x-xeon4310").unwrap();
        assert_eq!(
            (f.pcie.h2d_gbs, f.pcie.gather_gbs, f.cpu.moe_gbs),
            (24.26, Some(24.25), Some(46.12))
        );
        assert_eq!((f.cpu.cores, f.cpu.numa_nodes), (24, 2));
        // The field host of ft-model is the same machine and engine: one description of it.
        let m = HostSpec::field_report();
        assert_eq!(
            (&f.gpu, &f.pcie, &f.cpu, &f.engine),
            (&m.gpu, &m.pcie, &m.cpu, &m.engine),
            "model/hosts/rtx4090-2x-xeon4310.toml has drifted from HostSpec::field_report()"
        );
        let g3 = preset("rtxpro4000-gen3-epyc7302").unwrap();
        assert_eq!(
            (
                g3.pcie.h2d_gbs,
                g3.pcie.gather_gbs,
                g3.cpu.stream_read_gbs,
                g3.cpu.moe_gbs
            ),
            (14.21, Some(13.09), 31.75, Some(29.97))
        );
        assert!((g3.dram_gbs() - (21.89 + 8.41)).abs() < 1e-9);
        assert_eq!(preset("gh200").unwrap().pcie.gather_gbs, Some(412.0));
        let h = preset("h200-xeon-emr").unwrap();
        assert_eq!((h.cpu.cores, h.cpu.stream_read_gbs), (16, 105.0));
        assert_eq!(h.engine.hybrid_round_trip_us, 10.0);
        let two = preset("2x-rtx3090-tp-ryzen7950x").unwrap();
        assert_eq!(
            two.gpu_layout(),
            crate::GpuLayout::new(2, crate::GpuPlacement::TensorParallel).unwrap()
        );
        assert_eq!((two.gpu.memory_gib, two.gpu.hbm_gbs), (24.0, 936.0));
        // No NVLink: the combine is staged through host memory.
        assert!(two.interconnect().peer_gbs < two.pcie.h2d_gbs);
        // Every other preset is one GPU.
        for name in preset_names() {
            if name != "2x-rtx3090-tp-ryzen7950x" {
                assert_eq!(
                    preset(name).unwrap().gpu_layout(),
                    crate::GpuLayout::single()
                );
            }
        }
    }

    #[test]
    fn resolve_files_and_errors() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("mine.toml");
        std::fs::write(&path, preset_toml("gh200").unwrap()).unwrap();
        let h = resolve_spec(path.to_str().unwrap()).unwrap();
        assert_eq!(h.gpu.name, "NVIDIA GH200 480GB");
        let r = resolve(path.to_str().unwrap()).unwrap();
        assert_eq!(
            r.gpu.name, h.gpu.name,
            "a SpecHost dereferences to its spec"
        );
        let sh = resolve_host(path.to_str().unwrap()).unwrap();
        assert_eq!(sh.spec.as_ref(), Some(&h));
        assert_eq!(
            sh.perf.params,
            crate::perf::PerfParams::from_host(&h).unwrap()
        );

        let bad = dir.path().join("bad.toml");
        let text = preset_toml("gh200")
            .unwrap()
            .replace("[cpu]", "[cpu]\ncorez = 3");
        std::fs::write(&bad, text).unwrap();
        let e = resolve(bad.to_str().unwrap()).unwrap_err().to_string();
        assert!(e.contains("bad.toml") && e.contains("corez"), "{e}");

        let e = resolve("no-such-host").unwrap_err().to_string();
        assert!(e.contains("no-such-host") && e.contains("gh200"), "{e}");
        let e = resolve("/nonexistent/profile.json")
            .unwrap_err()
            .to_string();
        assert!(e.contains("profile.json"), "{e}");
        let garbage = dir.path().join("garbage.json");
        std::fs::write(&garbage, "{}").unwrap();
        let e = resolve(garbage.to_str().unwrap()).unwrap_err().to_string();
        assert!(e.contains("garbage.json"), "{e}");
    }

    /// A profile written from a preset's parameters simulates like the preset, but with
    /// the wake-up folded into the fixed CPU cost (a fit does not separate it).
    #[test]
    fn a_profile_json_is_a_host() {
        use crate::profile::{HostFingerprint, Profile, ProfileKey};
        let spec = preset("h200-xeon-emr").unwrap();
        let model = crate::ModelSpec::preset("qwen3.8-flash-next").unwrap();
        let params = crate::perf::PerfParams::from_host(&spec).unwrap();
        let profile = Profile {
            key: ProfileKey::new(HostFingerprint::of_spec(&spec), &model),
            created_unix_s: 0,
            covariance: params.host_prior(&spec),
            params: params.clone(),
            dof: Some(12),
            fit: None,
            samples: Default::default(),
            bench_bw: None,
            probe_steal_fraction: None,
            cpu_checks: Vec::new(),
            untrusted: None,
            calibration: None,
        };
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("h200.json");
        std::fs::write(&path, serde_json::to_string(&profile).unwrap()).unwrap();
        let h = resolve_host(path.to_str().unwrap()).unwrap();
        assert_eq!(h.perf.params, params);
        assert_eq!(h.perf.dof, Some(12));
        assert_eq!(h.wake_us, 0.0);
        assert!(h.spec.is_none());
        assert!(h.name.contains("NVIDIA H200"), "{}", h.name);
        // `resolve` wants a spec and says so for a JSON file.
        assert!(resolve(path.to_str().unwrap()).is_err());
    }
}
