//! The host model a calibration starts from, from the inputs users have: a host file, the
//! reference engine's (FreeToken's) `benchbw.json` read directly (alone, or over a host file
//! whose bench numbers it replaces), or a profile; and the calibrated profile written from
//! the fit. `ft calibrate` resolves its flags through [`HostInputs`].

use std::path::Path;

use ferrox_core::qstar::BandwidthProfile;

use super::{Calibration, CalibrationRecord};
use crate::error::{ModelError, Result};
use crate::format::ExpertFormat;
use crate::host::{EngineSpec, HostSpec};
use crate::perf::legacy::BenchBw;
use crate::perf::PerfModel;
use crate::preset::ModelSpec;
use crate::profile::Profile;

/// Largest `benchbw.json` read, bytes: the reference engine's document is a few KiB.
pub const MAX_BENCHBW_BYTES: u64 = 1 << 20;

/// The reference engine's key for an expert format (its bench names formats by kernel:
/// `mxfp4` is benched as `mxfp4_triton`; others pass through, as ferrox-core's
/// `bench_format` does).
pub fn freetoken_format_key(format: ExpertFormat) -> &'static str {
    match format {
        ExpertFormat::Mxfp4 => "mxfp4_triton",
        f => f.name(),
    }
}

/// The bench entry of a model's format in a `benchbw.json`, with the GPU it names.
#[derive(Debug, Clone, PartialEq)]
pub struct FreeTokenBench {
    /// The GPU the document names (empty if none).
    pub gpu_name: String,
    /// The bench pair, at the geometry it was measured at.
    pub bench: BenchBw,
    /// How the bench's geometry was found.
    pub geometry: String,
}

/// The bench entry of `model`'s format in the `benchbw.json` at `path` (at most
/// [`MAX_BENCHBW_BYTES`]). ft's export records the geometry its numbers were measured at;
/// the reference engine's own bench measures at its tuning geometry (`bench-nvfp4`).
pub fn read_freetoken(path: &Path, model: &ModelSpec) -> Result<FreeTokenBench> {
    let name = format!("--freetoken {}", path.display());
    let text = crate::limits::read_bounded(path, MAX_BENCHBW_BYTES)
        .map_err(|e| ModelError::invalid(&name, e.to_string()))?;
    let doc: BandwidthProfile = serde_json::from_str(&text).map_err(|e| ModelError::Json {
        path: name.clone(),
        message: format!("not a FreeToken bandwidth profile: {e}"),
    })?;
    let raw: serde_json::Value = serde_json::from_str(&text).map_err(|e| ModelError::Json {
        path: name.clone(),
        message: e.to_string(),
    })?;
    let key = freetoken_format_key(model.format);
    let entry = doc.dtype_kernels.get(key).ok_or_else(|| {
        ModelError::invalid(
            &name,
            format!(
                "no dtype_kernels entry for {key} (the model's format); it has: {}",
                doc.dtype_kernels
                    .keys()
                    .cloned()
                    .collect::<Vec<_>>()
                    .join(", ")
            ),
        )
    })?;
    let (Some(cpu), Some(pcie)) = (entry.cpu_moe_gbs, entry.pcie_gather_gbs) else {
        return Err(ModelError::invalid(
            &name,
            format!("dtype_kernels.{key} lacks cpu_moe_gbs or pcie_gather_gbs"),
        ));
    };
    for (field, v) in [("cpu_moe_gbs", cpu), ("pcie_gather_gbs", pcie)] {
        if !(v.is_finite() && v > 0.0 && v <= crate::limits::MAX_RATE_GBS) {
            return Err(ModelError::invalid(
                &name,
                format!("dtype_kernels.{key}.{field} = {v} is not a bandwidth (GB/s)"),
            ));
        }
    }
    let served = raw["dtype_kernels"][key]["expert"]["expert_bytes"].as_u64();
    let (expert_bytes, experts, geometry) = match served {
        Some(b) => (
            b,
            raw["dtype_kernels"][key]["expert"]["top_k"]
                .as_u64()
                .unwrap_or(model.geometry.top_k as u64) as u32,
            format!("measured at the served geometry ({b} B experts, ft's export)"),
        ),
        None => {
            let t = ModelSpec::preset("bench-nvfp4")?;
            (
                t.expert_bytes(),
                t.geometry.top_k as u32,
                "measured at FreeToken's tuning geometry (bench-nvfp4, derived)".to_string(),
            )
        }
    };
    Ok(FreeTokenBench {
        gpu_name: doc.gpu.name.clone().unwrap_or_default(),
        bench: BenchBw {
            expert_bytes,
            experts,
            cpu_moe_gbs: cpu,
            pcie_gather_gbs: pcie,
            cpu_moe_overlap_gbs: entry.cpu_moe_overlap_gbs,
            pcie_gather_overlap_gbs: entry.pcie_gather_overlap_gbs,
        },
        geometry,
    })
}

/// The derived values of a host spec, one line each (`key = value unit (how)`).
fn derived_lines(spec: &HostSpec) -> Vec<String> {
    spec.derived()
        .iter()
        .map(|d| format!("{} = {} {} ({})", d.key, d.value, d.unit, d.how))
        .collect()
}

/// A host spec from a `benchbw.json` alone: its GPU by name (ft's GPU table), the link's
/// rate derived from the gather bench, the CPU's memory bandwidth from the CPU-MoE bench;
/// every derived value listed. `cores` (the engine's CPU threads) is required: the document
/// does not record them.
pub fn host_from_freetoken(
    ft: &FreeTokenBench,
    cores: Option<u32>,
) -> Result<(HostSpec, Vec<String>)> {
    let Some(cores) = cores else {
        return Err(ModelError::invalid(
            "--cpu-cores",
            "--freetoken without --host needs --cpu-cores N (the engine's CPU threads; benchbw.json does not record them)",
        ));
    };
    let engine = EngineSpec::default();
    let h2d = ft.bench.pcie_gather_gbs / engine.gather_efficiency;
    let stream = ft.bench.cpu_moe_gbs / engine.cpu_kernel_efficiency;
    let toml = format!(
        "name = \"freetoken\"\n[gpu]\nname = {gpu:?}\n[pcie]\nh2d_gbs = {h2d}\ngather_gbs = {g}\n\
         [cpu]\nname = \"from benchbw.json\"\ncores = {cores}\nstream_read_gbs = {stream}\nmoe_gbs = {c}\n",
        gpu = ft.gpu_name,
        g = ft.bench.pcie_gather_gbs,
        c = ft.bench.cpu_moe_gbs,
    );
    let spec = HostSpec::from_toml_str(&toml, "--freetoken").map_err(|e| {
        ModelError::invalid(
            "--freetoken",
            format!(
                "GPU '{}' (a GPU outside ft's table needs --host with memory_gib and hbm_gbs): {e}",
                ft.gpu_name
            ),
        )
    })?;
    let mut derived = vec![
        format!(
            "pcie.h2d_gbs = {h2d:.2} GB/s (the gather bench over the engine's gather efficiency {})",
            engine.gather_efficiency
        ),
        format!(
            "cpu.stream_read_gbs = {stream:.2} GB/s (the CPU-MoE bench over the engine's kernel efficiency {})",
            engine.cpu_kernel_efficiency
        ),
    ];
    derived.extend(derived_lines(&spec));
    Ok((spec, derived))
}

/// Put a bench's numbers into a host spec (its geometry as the tuning model where ft's export
/// recorded the served one).
fn apply_bench(spec: &mut HostSpec, ft: &FreeTokenBench, model: &ModelSpec) {
    spec.pcie.gather_gbs = Some(ft.bench.pcie_gather_gbs);
    spec.cpu.moe_gbs = Some(ft.bench.cpu_moe_gbs);
    if ft.bench.expert_bytes == model.expert_bytes() && ModelSpec::preset(&model.name).is_ok() {
        spec.engine.tuning_model = model.name.clone();
        spec.engine.tuning_experts = Some(ft.bench.experts);
    }
}

/// The host model a calibration starts from and where it came from.
#[derive(Debug, Clone)]
pub struct HostInputs {
    /// The host model.
    pub base: PerfModel,
    /// A profile to extend (a given profile, else one made from the host spec).
    pub profile: Profile,
    /// Where the host came from, in words (`host H`, `benchbw.json P`, `profile P`).
    pub label: String,
    /// Every value that was derived rather than given, one line each.
    pub derived: Vec<String>,
}

impl HostInputs {
    /// A profile as the host model, checked against `model`.
    pub fn from_profile(profile: Profile, path: &Path, model: &ModelSpec) -> Result<Self> {
        profile.check_for(&format!("--profile {}", path.display()), model, None)?;
        let label = format!("profile {}", path.display());
        Ok(HostInputs {
            base: profile.perf_model(&label),
            profile,
            label,
            derived: Vec::new(),
        })
    }

    /// A host file (`host`: a preset or a TOML file), FreeToken's `benchbw.json`
    /// (`freetoken`), or both (the bench's numbers over the file's); with the bench alone,
    /// `cpu_cores` gives the CPU's physical cores.
    pub fn from_host(
        host: Option<&str>,
        freetoken: Option<&Path>,
        cpu_cores: Option<u32>,
        model: &ModelSpec,
    ) -> Result<Self> {
        let bench = freetoken.map(|p| read_freetoken(p, model)).transpose()?;
        let (mut spec, mut derived, mut label) = match (host, &bench) {
            (Some(h), _) => {
                let spec = crate::hosts::resolve_spec(h)?;
                let derived = derived_lines(&spec);
                (spec, derived, format!("host {h}"))
            }
            (None, Some(b)) => {
                let (spec, derived) = host_from_freetoken(b, cpu_cores)?;
                (spec, derived, String::new())
            }
            (None, None) => {
                return Err(ModelError::invalid(
                    "the host",
                    "give the host: --host H, --freetoken benchbw.json or --profile P",
                ))
            }
        };
        if let (Some(b), Some(path)) = (&bench, freetoken) {
            apply_bench(&mut spec, b, model);
            spec.validate()?;
            derived.push(format!("bench geometry: {}", b.geometry));
            let from = format!("benchbw.json {}", path.display());
            label = if label.is_empty() {
                from
            } else {
                format!("{label} with {from}")
            };
        }
        let base = PerfModel::from_host(&spec)?;
        let mut profile = Profile::of_host_spec(&spec, model)?;
        profile.bench_bw = bench.map(|b| b.bench);
        Ok(HostInputs {
            base,
            profile,
            label,
            derived,
        })
    }

    /// The calibrated profile: this host's profile with `cal`'s parameters and `record`,
    /// validated.
    pub fn calibrated_profile(
        &self,
        cal: &Calibration,
        record: CalibrationRecord,
    ) -> Result<Profile> {
        let perf = cal.perf_model(&self.base);
        let profile = Profile {
            params: perf.params,
            covariance: perf.covariance,
            dof: perf.dof,
            created_unix_s: crate::profile::now_unix_s(),
            calibration: Some(record),
            ..self.profile.clone()
        };
        profile.validate()?;
        Ok(profile)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn qwen() -> ModelSpec {
        ModelSpec::preset("qwen3.8-flash-next").unwrap()
    }

    fn benchbw(dir: &Path, entry: &str) -> std::path::PathBuf {
        let path = dir.join("benchbw.json");
        let key = freetoken_format_key(qwen().format);
        std::fs::write(
            &path,
            format!(
                "{{\"version\": 4, \"gpu\": {{\"name\": \"NVIDIA GeForce RTX 4090\"}}, \"dtype_kernels\": {{\"{key}\": {entry}}}}}"
            ),
        )
        .unwrap();
        path
    }

    #[test]
    fn format_keys_follow_the_reference_bench() {
        assert_eq!(freetoken_format_key(ExpertFormat::Mxfp4), "mxfp4_triton");
        assert_eq!(
            freetoken_format_key(ExpertFormat::Nvfp4),
            ExpertFormat::Nvfp4.name()
        );
    }

    #[test]
    fn a_benchbw_alone_or_over_a_host_file_is_a_host_model() {
        let dir = tempfile::tempdir().unwrap();
        let path = benchbw(
            dir.path(),
            "{\"cpu_moe_gbs\": 30.0, \"pcie_gather_gbs\": 12.5}",
        );
        let m = qwen();
        let b = read_freetoken(&path, &m).unwrap();
        assert_eq!((b.bench.cpu_moe_gbs, b.bench.pcie_gather_gbs), (30.0, 12.5));
        assert!(b.geometry.contains("tuning geometry"), "{}", b.geometry);
        assert_eq!(b.gpu_name, "NVIDIA GeForce RTX 4090");

        let e = HostInputs::from_host(None, Some(&path), None, &m)
            .unwrap_err()
            .to_string();
        assert!(e.contains("--cpu-cores"), "{e}");
        let alone = HostInputs::from_host(None, Some(&path), Some(16), &m).unwrap();
        assert!(alone.label.starts_with("benchbw.json "), "{}", alone.label);
        assert!(alone.derived.iter().any(|d| d.starts_with("pcie.h2d_gbs")));
        assert_eq!(alone.profile.bench_bw, Some(b.bench));

        let over =
            HostInputs::from_host(Some(crate::hosts::DEFAULT_HOST), Some(&path), None, &m).unwrap();
        assert!(over.label.contains(" with benchbw.json "), "{}", over.label);
        let plain =
            HostInputs::from_host(Some(crate::hosts::DEFAULT_HOST), None, None, &m).unwrap();
        assert_eq!(plain.label, format!("host {}", crate::hosts::DEFAULT_HOST));
        assert!(plain.profile.bench_bw.is_none());
        assert!(HostInputs::from_host(None, None, None, &m).is_err());
    }

    #[test]
    fn a_bad_benchbw_is_refused_with_its_name() {
        let dir = tempfile::tempdir().unwrap();
        for (entry, want) in [
            ("{\"cpu_moe_gbs\": 30.0}", "lacks"),
            (
                "{\"cpu_moe_gbs\": -1.0, \"pcie_gather_gbs\": 12.5}",
                "not a bandwidth",
            ),
        ] {
            let path = benchbw(dir.path(), entry);
            let e = read_freetoken(&path, &qwen()).unwrap_err().to_string();
            assert!(e.contains(want) && e.contains("benchbw.json"), "{e}");
        }
        let path = dir.path().join("junk.json");
        std::fs::write(&path, "not json {").unwrap();
        let e = read_freetoken(&path, &qwen()).unwrap_err().to_string();
        assert!(e.contains("not a FreeToken bandwidth profile"), "{e}");
        let e = read_freetoken(Path::new("/nonexistent/b.json"), &qwen())
            .unwrap_err()
            .to_string();
        assert!(e.contains("--freetoken /nonexistent/b.json"), "{e}");
    }
}
