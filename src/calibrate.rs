//! `ft calibrate`: fit the engine terms a few measured runs identify, on top of the host
//! model, and write the result as a profile every other command accepts.
//!
//! Host inputs come as users have them: a host file (`--host`), FreeToken's `benchbw.json`
//! read directly (`--freetoken`, alone or over a host file), or a profile (`--profile`). The
//! fit is `ft_model::calibrate`; this command resolves the inputs, prints the terms with their
//! standard errors, what the runs could not identify and the one run that would, and every
//! run's host-only, calibrated and leave-one-out prediction (a table, or `--json`), and writes
//! the calibrated profile (`--out`).

use anyhow::{bail, Context, Result};
use std::io::Write;
use std::path::{Path, PathBuf};

use ferrox_core::qstar::BandwidthProfile;
use ft_model::calibrate::{
    calibrate, CalibrateConfig, Calibration, CalibrationRecord, SamplingConfig,
};
use ft_model::host::HostSpec;
use ft_model::observe::read_observations;
use ft_model::perf::legacy::BenchBw;
use ft_model::perf::prefill::PrefillConfig;
use ft_model::perf::PerfModel;
use ft_model::profile::Profile;
use ft_model::ModelSpec;

use crate::probe::freetoken_format_key;

/// Largest `benchbw.json` read, bytes: the reference engine's document is a few KiB.
const MAX_BENCHBW_BYTES: u64 = 1 << 20;

/// `ft calibrate` arguments.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// The measured runs (CSV, `docs/observations.md`).
    #[arg(long)]
    pub observations: PathBuf,
    /// Host: a preset or a host TOML file (with `--freetoken`, its bench numbers are
    /// replaced by the file's).
    #[arg(long, conflicts_with = "profile")]
    pub host: Option<String>,
    /// FreeToken's `benchbw.json` (as FreeToken's bench or `ft probe --export-freetoken`
    /// writes it): its GPU and bench bandwidths are the host inputs. Alone, the CPU and
    /// link values it lacks are derived (and marked); over `--host`, the host file gives them.
    #[arg(long, conflicts_with = "profile")]
    pub freetoken: Option<PathBuf>,
    /// With `--freetoken` alone: the CPU's physical cores (the engine's CPU threads).
    #[arg(long)]
    pub cpu_cores: Option<u32>,
    /// A profile (JSON, as `ft probe` or `ft calibrate` writes it) as the host model.
    #[arg(long)]
    pub profile: Option<PathBuf>,
    /// Model the runs served: a preset name, a model TOML file, a config.json or a GGUF.
    #[arg(long)]
    pub model: Option<String>,
    /// Write the calibrated profile here (JSON).
    #[arg(long)]
    pub out: Option<PathBuf>,
    /// Routing preset (uniform, mild, typical, skewed), process TOML or trace file.
    #[arg(long, default_value = "typical")]
    pub routing: String,
    /// The engine's cache (policy, topology, slots per layer, admission) where a run does
    /// not give its own (`--policy` still names the policy).
    #[command(flatten)]
    pub cache: crate::cache_args::CacheArgs,
    /// Counted steps of each run's traffic simulation.
    #[arg(long, default_value_t = 100)]
    pub steps: usize,
    /// Warm-up steps before counting.
    #[arg(long, default_value_t = 100)]
    pub warmup: usize,
    /// Seed replacing the routing process's.
    #[arg(long)]
    pub seed: Option<u64>,
    /// Prompt tokens per prefill chunk.
    #[arg(long, default_value_t = ft_model::perf::prefill::DEFAULT_PREFILL_CHUNK_TOKENS)]
    pub prefill_chunk: usize,
    /// Fit only these terms (a comma list; default all: cpu-serving-rate, link-rate,
    /// rest-per-stream, fixed-gather, fixed-gather-and-cpu, fixed-cpu, fixed-gpu-only,
    /// rest-per-context, hybrid-miss-factor).
    #[arg(long, value_delimiter = ',')]
    pub terms: Vec<ft_model::calibrate::Term>,
    /// Skip the leave-one-out refits.
    #[arg(long)]
    pub no_loo: bool,
    /// Print JSON instead of the table.
    #[arg(long)]
    pub json: bool,
}

/// The host model and where it came from.
struct HostInputs {
    base: PerfModel,
    /// A profile to extend (`--profile`), else one made from the host spec.
    profile: Profile,
    label: String,
    derived: Vec<String>,
}

/// The bench entry of `model`'s format in a `benchbw.json`, with the GPU it names.
struct FreeTokenBench {
    gpu_name: String,
    bench: BenchBw,
    /// How the bench's geometry was found.
    geometry: String,
}

fn read_freetoken(path: &Path, model: &ModelSpec) -> Result<FreeTokenBench> {
    let name = format!("--freetoken {}", path.display());
    let text = ft_model::limits::read_bounded(path, MAX_BENCHBW_BYTES).context(name.clone())?;
    let doc: BandwidthProfile = serde_json::from_str(&text)
        .with_context(|| format!("{name}: not a FreeToken bandwidth profile"))?;
    let raw: serde_json::Value = serde_json::from_str(&text).context(name.clone())?;
    let key = freetoken_format_key(model.format);
    let entry = doc.dtype_kernels.get(key).with_context(|| {
        format!(
            "{name}: no dtype_kernels entry for {key} (the model's format); it has: {}",
            doc.dtype_kernels
                .keys()
                .cloned()
                .collect::<Vec<_>>()
                .join(", ")
        )
    })?;
    let (Some(cpu), Some(pcie)) = (entry.cpu_moe_gbs, entry.pcie_gather_gbs) else {
        bail!("{name}: dtype_kernels.{key} lacks cpu_moe_gbs or pcie_gather_gbs");
    };
    for (field, v) in [("cpu_moe_gbs", cpu), ("pcie_gather_gbs", pcie)] {
        if !(v.is_finite() && v > 0.0 && v <= ft_model::limits::MAX_RATE_GBS) {
            bail!("{name}: dtype_kernels.{key}.{field} = {v} is not a bandwidth (GB/s)");
        }
    }
    // ft's export records the geometry its numbers were measured at; FreeToken's own bench
    // measures at its tuning geometry.
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

/// A host spec from a `benchbw.json` alone: its GPU by name (ft's GPU table), the link's
/// rate derived from the gather bench, the CPU's memory bandwidth from the CPU-MoE bench;
/// every derived value listed.
fn host_from_freetoken(ft: &FreeTokenBench, cores: Option<u32>) -> Result<(HostSpec, Vec<String>)> {
    let Some(cores) = cores else {
        bail!("--freetoken without --host needs --cpu-cores N (the engine's CPU threads; benchbw.json does not record them)");
    };
    let engine = ft_model::host::EngineSpec::default();
    let h2d = ft.bench.pcie_gather_gbs / engine.gather_efficiency;
    let stream = ft.bench.cpu_moe_gbs / engine.cpu_kernel_efficiency;
    let toml = format!(
        "name = \"freetoken\"\n[gpu]\nname = {gpu:?}\n[pcie]\nh2d_gbs = {h2d}\ngather_gbs = {g}\n\
         [cpu]\nname = \"from benchbw.json\"\ncores = {cores}\nstream_read_gbs = {stream}\nmoe_gbs = {c}\n",
        gpu = ft.gpu_name,
        g = ft.bench.pcie_gather_gbs,
        c = ft.bench.cpu_moe_gbs,
    );
    let spec = HostSpec::from_toml_str(&toml, "--freetoken").with_context(|| {
        format!(
            "--freetoken: GPU '{}' (a GPU outside ft's table needs --host with memory_gib and hbm_gbs)",
            ft.gpu_name
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
    derived.extend(
        spec.derived()
            .iter()
            .map(|d| format!("{} = {} {} ({})", d.key, d.value, d.unit, d.how)),
    );
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

impl Args {
    fn model(&self, profile: Option<&Profile>) -> Result<ModelSpec> {
        match (&self.model, profile) {
            (Some(m), _) => ModelSpec::resolve(m).with_context(|| format!("--model {m}")),
            (None, Some(p)) => Ok(p.probed_model()),
            (None, None) => bail!("--model is required (the model the runs served)"),
        }
    }

    fn host(&self, model: &ModelSpec) -> Result<HostInputs> {
        if let Some(path) = &self.profile {
            let input = format!("--profile {}", path.display());
            let p = Profile::read(path).with_context(|| input.clone())?;
            p.check_for(&input, model, None)?;
            let label = format!("profile {}", path.display());
            return Ok(HostInputs {
                base: p.perf_model(&label),
                profile: p,
                label,
                derived: Vec::new(),
            });
        }
        let bench = self
            .freetoken
            .as_ref()
            .map(|p| read_freetoken(p, model))
            .transpose()?;
        let (mut spec, mut derived, mut label) = match (&self.host, &bench) {
            (Some(h), _) => {
                let spec = ft_sim::hosts::resolve_spec(h).with_context(|| format!("--host {h}"))?;
                let derived = spec
                    .derived()
                    .iter()
                    .map(|d| format!("{} = {} {} ({})", d.key, d.value, d.unit, d.how))
                    .collect();
                (spec, derived, format!("host {h}"))
            }
            (None, Some(b)) => {
                let (spec, derived) = host_from_freetoken(b, self.cpu_cores)?;
                (spec, derived, String::new())
            }
            (None, None) => {
                bail!("give the host: --host H, --freetoken benchbw.json or --profile P")
            }
        };
        if let (Some(b), Some(path)) = (&bench, &self.freetoken) {
            apply_bench(&mut spec, b, model);
            spec.validate().context("--freetoken")?;
            derived.push(format!("bench geometry: {}", b.geometry));
            let from = format!("benchbw.json {}", path.display());
            label = if label.is_empty() {
                from
            } else {
                format!("{label} with {from}")
            };
        }
        let base = PerfModel::from_host(&spec).with_context(|| label.clone())?;
        let mut profile = Profile::of_host_spec(&spec, model)?;
        profile.bench_bw = bench.map(|b| b.bench);
        Ok(HostInputs {
            base,
            profile,
            label,
            derived,
        })
    }
}

/// Run `ft calibrate`.
pub fn run(args: Args) -> Result<()> {
    let given = args
        .profile
        .as_ref()
        .map(|p| Profile::read(p).with_context(|| format!("--profile {}", p.display())))
        .transpose()?;
    let model = args.model(given.as_ref())?;
    let host = args.host(&model)?;
    let observations = read_observations(&args.observations)
        .with_context(|| format!("--observations {}", args.observations.display()))?;
    let cache = args.cache.options(None)?;
    let config = CalibrateConfig {
        sampling: SamplingConfig {
            routing: args.routing.clone(),
            seed: args.seed,
            cache,
            warmup_steps: args.warmup,
            steps: args.steps,
            prefill: PrefillConfig {
                chunk_tokens: args.prefill_chunk,
            },
        },
        leave_one_out: !args.no_loo,
        terms: if args.terms.is_empty() {
            ft_model::calibrate::Term::ALL.to_vec()
        } else {
            args.terms.clone()
        },
        ..CalibrateConfig::default()
    };
    let cal = calibrate(&model, &host.base, &observations, &config)
        .with_context(|| format!("calibrating to {}", args.observations.display()))?;
    let record = cal.record(
        args.observations.display().to_string(),
        host.label.clone(),
        host.derived.clone(),
    );
    let written = match &args.out {
        Some(out) => {
            let perf = cal.perf_model(&host.base);
            let profile = Profile {
                params: perf.params,
                covariance: perf.covariance,
                dof: perf.dof,
                created_unix_s: ft_model::profile::now_unix_s(),
                calibration: Some(record.clone()),
                ..host.profile
            };
            profile
                .validate()
                .context("the calibrated profile does not validate")?;
            std::fs::write(out, serde_json::to_vec_pretty(&profile)?)
                .with_context(|| format!("--out {}", out.display()))?;
            Some(out.display().to_string())
        }
        None => None,
    };
    let mut out = std::io::stdout().lock();
    if args.json {
        let doc = serde_json::json!({
            "model": model.name,
            "calibration": record,
            "profile": written,
        });
        serde_json::to_writer_pretty(&mut out, &doc)?;
        writeln!(out)?;
    } else {
        write_table(&mut out, &model, &cal, &record, written.as_deref())?;
    }
    Ok(())
}

fn pct(x: f64) -> String {
    format!("{:+.0}%", 100.0 * x)
}

fn write_table(
    out: &mut impl Write,
    model: &ModelSpec,
    cal: &Calibration,
    rec: &CalibrationRecord,
    written: Option<&str>,
) -> Result<()> {
    writeln!(
        out,
        "calibrate: {} runs of {} on {}",
        cal.fit.runs, model.name, rec.host_inputs
    )?;
    for d in &rec.derived {
        writeln!(out, "  derived: {d}")?;
    }
    writeln!(out)?;
    writeln!(
        out,
        "{:<22} {:>10} {:>10}  {:<24} note",
        "term", "value", "se", "unit"
    )?;
    for t in &cal.terms {
        let se =
            t.se.map(|s| format!("{s:.3}"))
                .unwrap_or_else(|| "-".into());
        let note = if !t.identified {
            "not identified (held neutral)"
        } else if t.at_bound {
            "at its bound"
        } else {
            ""
        };
        writeln!(
            out,
            "{:<22} {:>10.3} {:>10}  {:<24} {note}",
            t.term.name(),
            t.value,
            se,
            t.unit
        )?;
    }
    let id = &cal.identifiability;
    if !id.unidentified.is_empty() {
        writeln!(out)?;
        writeln!(out, "not identified by these runs:")?;
        for u in &id.unidentified {
            writeln!(out, "  {}: {}", u.term, u.reason)?;
        }
        match &id.suggestion {
            Some(s) => writeln!(
                out,
                "one more run that would identify {}: {} at {} stream(s), context {}, {} cache slots",
                s.identifies
                    .iter()
                    .map(|t| t.name())
                    .collect::<Vec<_>>()
                    .join(", "),
                s.strategy,
                s.streams,
                s.context,
                s.cache_slots
            )?,
            None => writeln!(out, "no single run of the candidates identifies them")?,
        }
    }
    writeln!(out)?;
    writeln!(
        out,
        "{:>4} {:<14} {:>7} {:>7} {:<10} {:>9} {:>16} {:>16} {:>16}",
        "row",
        "strategy",
        "streams",
        "context",
        "measure",
        "measured",
        "host only",
        "calibrated",
        "leave-one-out"
    )?;
    for r in &cal.runs {
        let cell = |v: f64| format!("{v:.1} ({})", pct(r.error(v)));
        let measure = serde_json::to_value(r.measure)?
            .as_str()
            .unwrap_or_default()
            .to_string();
        writeln!(
            out,
            "{:>4} {:<14} {:>7} {:>7} {:<10} {:>9.1} {:>16} {:>16} {:>16}",
            r.row,
            r.strategy,
            r.streams,
            r.context,
            measure,
            r.measured,
            cell(r.host_only),
            cell(r.calibrated),
            r.leave_one_out.map(cell).unwrap_or_else(|| "-".into())
        )?;
    }
    let f = &cal.fit;
    writeln!(out)?;
    writeln!(
        out,
        "fit: rms log error {:.3} from the host inputs alone, {:.3} calibrated{}; {} terms on {} runs ({} dof), condition {:.0}; Nelder-Mead {} iterations ({})",
        f.rms_host_only,
        f.rms_calibrated,
        f.rms_leave_one_out
            .map(|l| format!(", {l:.3} leave-one-out"))
            .unwrap_or_default(),
        id.fitted.len(),
        f.runs,
        f.dof,
        id.condition,
        f.iterations,
        f.termination
    )?;
    if let Some(w) = written {
        writeln!(
            out,
            "wrote {w} (use it as --profile or --host with predict, explain, simulate, serve)"
        )?;
    }
    Ok(())
}
