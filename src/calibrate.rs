//! `ft calibrate`: fit the engine terms a few measured runs identify, on top of the host
//! model, and write the result as a profile every other command accepts.
//!
//! Host inputs come as users have them: a host file (`--host`), FreeToken's `benchbw.json`
//! read directly (`--freetoken`, alone or over a host file), or a profile (`--profile`). The
//! fit is `ft_model::calibrate`, the host inputs `ft_model::calibrate::host_inputs`; this
//! command reads the flags, prints the terms with their
//! standard errors, what the runs could not identify and the one run that would, and every
//! run's host-only, calibrated and leave-one-out prediction (a table, or `--json`), and writes
//! the calibrated profile (`--out`).

use anyhow::{bail, Context, Result};
use std::io::Write;
use std::path::PathBuf;

use ft_model::calibrate::host_inputs::HostInputs;
use ft_model::calibrate::{
    calibrate, CalibrateConfig, Calibration, CalibrationRecord, SamplingConfig,
};
use ft_model::observe::read_observations;
use ft_model::perf::prefill::PrefillConfig;
use ft_model::profile::Profile;
use ft_model::ModelSpec;

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

impl Args {
    fn model(&self, profile: Option<&Profile>) -> Result<ModelSpec> {
        match (&self.model, profile) {
            (Some(m), _) => ModelSpec::resolve(m).with_context(|| format!("--model {m}")),
            (None, Some(p)) => Ok(p.probed_model()),
            (None, None) => bail!("--model is required (the model the runs served)"),
        }
    }

    /// The host model: `--profile` (already read as `given`), else `--host` and/or
    /// `--freetoken`.
    fn host(&self, given: Option<Profile>, model: &ModelSpec) -> Result<HostInputs> {
        match (given, &self.profile) {
            (Some(p), Some(path)) => Ok(HostInputs::from_profile(p, path, model)?),
            _ => {
                let host = HostInputs::from_host(
                    self.host.as_deref(),
                    self.freetoken.as_deref(),
                    self.cpu_cores,
                    model,
                );
                match (&self.host, &self.freetoken) {
                    (Some(h), _) => host.with_context(|| format!("--host {h}")),
                    _ => host.map_err(Into::into),
                }
            }
        }
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
    let host = args.host(given, &model)?;
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
            let profile = host
                .calibrated_profile(&cal, record.clone())
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
        let se = match (t.se, t.identified) {
            (Some(s), _) => format!("{s:.3}"),
            (None, true) => "undefined".into(),
            (None, false) => "-".into(),
        };
        let note = if !t.identified {
            "not identified (held neutral)".to_string()
        } else if let Some(s) = t.se_at_run_noise {
            format!(
                "{s:.3} at the assumed run noise (0 dof){}",
                if t.at_bound { "; at its bound" } else { "" }
            )
        } else if t.at_bound {
            "at its bound".to_string()
        } else {
            String::new()
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
        "fit: rms log error {:.3} from the host inputs alone, {:.3} calibrated{}; {} terms on {} runs ({} dof), condition {:.0}; Nelder-Mead {} iterations in {} rounds, {}",
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
        f.rounds,
        f.termination
    )?;
    if let Some(note) = f.undefined_errors_note() {
        writeln!(out, "{note}")?;
    }
    if let Some(w) = written {
        writeln!(
            out,
            "wrote {w} (use it as --profile or --host with predict, explain, simulate, serve)"
        )?;
    }
    Ok(())
}
