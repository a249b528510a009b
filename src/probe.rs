//! `ft probe`: measure this host with the real runtime, fit the performance model to the
//! measurements, and cache the fitted profile; optionally export the model's decision as the
//! reference engine's `benchbw.json`.
//!
//! The probes themselves live in `ft_runtime::probe` (what is measured and how), the fit in
//! `ft_model::perf::fit`, the profile's key, location and atomic storage in
//! `ft_model::profile`; this command plans the run from the flags, reuses a fresh profile
//! unless `--force`, prints every parameter with its standard error and the fit's residuals
//! (a table, or `--json`; the tables in `probe/table.rs`), and writes the files asked for.
//! The export is `ft_model::freetoken`, the report `ft_runtime::probe::report`.
//!
//! `--export-freetoken PATH` writes a version-4 `benchbw.json` (the reference engine's
//! bandwidth profile, schema in `docs/probe.md`) whose per-format verdict and fetch fraction
//! are the model's: the reference engine, reading its usual fields, does what the model
//! decided. An existing file at PATH keeps its other formats' entries.

use anyhow::{bail, Context, Result};
use std::io::Write;
use std::path::PathBuf;

use ft_model::cache::CacheSize;
use ft_model::freetoken::{self, ExportGpu, ExportRequest};
use ft_model::perf::fit::FitConfig;
use ft_model::profile::{self, write_atomic};
use ft_model::{ModelSpec, StrategyKind};
use ft_runtime::cpu_pool::PoolWait;
use ft_runtime::device::{Device, DeviceKind, DeviceSpec, HostDeviceConfig};
use ft_runtime::probe::report::{ProbeReport, ProfileUse};
use ft_runtime::probe::{self as rprobe, ProbeConfig};
use ft_runtime::profile_select::{device_kind, profile_key};

mod table;

/// The model probed when `--model` is not given (the field report's).
pub const DEFAULT_MODEL: &str = "qwen3.8-flash-next";

/// Arguments of `ft probe`.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// cuda, host, or auto (CUDA where available, else the host-emulated device).
    #[arg(long, default_value = "auto")]
    device: String,
    /// CUDA device ordinal.
    #[arg(long, default_value_t = 0)]
    ordinal: usize,
    /// Model: a preset name or a model TOML file (the profile is for it, all its layers).
    #[arg(long, default_value = DEFAULT_MODEL)]
    model: String,
    /// Layers of the model's geometry the end-to-end probe runs (default: as many as fit in
    /// 4 GiB of host bank, at most 4; the per-layer costs are what is fitted).
    #[arg(long)]
    layers: Option<usize>,
    /// Serving threads of the CPU expert pool (default: cores - 1).
    #[arg(long)]
    threads: Option<usize>,
    /// Stream counts of the end-to-end probe (comma list); the largest also sets the most
    /// tokens per expert of the micro-probes.
    #[arg(long, value_delimiter = ',', default_value = "1,4")]
    streams: Vec<usize>,
    /// Context of the end-to-end probe and the dense probe's short context, tokens.
    #[arg(long, default_value_t = 1024)]
    context: usize,
    /// The dense probe's long context, tokens.
    #[arg(long, default_value_t = 32768)]
    long_context: usize,
    /// Share of the end-to-end model's experts the GPU cache holds (0 to 1).
    #[arg(long, default_value_t = 0.15)]
    cache_residency: f64,
    /// Hybrid's fetch fractions in the end-to-end probe (comma list).
    #[arg(long, value_delimiter = ',', default_value = "0.25,0.5,0.75")]
    hybrid_fractions: Vec<f64>,
    /// Further CPU pool sizes at which the end-to-end probe runs cpu and hybrid again, to
    /// measure the serving slowdown there (comma list; 0 alone: none; default: a quarter of
    /// --threads). `ft predict` at another count interpolates between the measured ones.
    #[arg(long, value_delimiter = ',')]
    slowdown_threads: Option<Vec<usize>>,
    /// Measured steps of each end-to-end run.
    #[arg(long, default_value_t = 24)]
    steps: usize,
    /// Warm-up steps of each end-to-end run.
    #[arg(long, default_value_t = 8)]
    warmup: usize,
    /// Routing of the end-to-end probe: preset, process TOML or trace file.
    #[arg(long, default_value = "typical")]
    routing: String,
    /// Seed of the probe's weights, inputs and routing.
    #[arg(long)]
    seed: Option<u64>,
    /// Wall-clock budget of the probes, seconds.
    #[arg(long, default_value_t = rprobe::DEFAULT_BUDGET_S)]
    budget_s: f64,
    /// Largest share of the CPU time the hypervisor may take (steal) during the probe
    /// before it counts as disturbed (0 to 1): a probe of a VM whose vCPUs were stolen fits
    /// a slower host than the one that serves.
    #[arg(long, default_value_t = ft_runtime::instrument::STEAL_NOTABLE_FRACTION)]
    max_steal: f64,
    /// Largest change of the bank's read rate between the probe's start and end, as a share,
    /// before it counts as disturbed (a neighbour's memory traffic shows here, not as steal).
    #[arg(long, default_value_t = 0.15)]
    max_ceiling_drift: f64,
    /// Most probes while they are disturbed; the least disturbed is fitted.
    #[arg(long, default_value_t = 2)]
    attempts: usize,
    /// How the CPU pool waits between layers: spin, spin-beside or park (`ft run
    /// --pool-wait`; default: spin where a core stays free).
    #[arg(long)]
    pool_wait: Option<String>,
    /// Re-probe even when a fresh profile is cached.
    #[arg(long)]
    force: bool,
    /// Also write the profile to this file.
    #[arg(long)]
    profile_out: Option<PathBuf>,
    /// Write the reference engine's benchbw.json (version 4) with the model's verdict and
    /// fetch fraction for this model's format (other formats in an existing file are kept).
    #[arg(long)]
    export_freetoken: Option<PathBuf>,
    /// Streams the exported decision is made for.
    #[arg(long, default_value_t = 1)]
    export_streams: usize,
    /// Context the exported decision is made for, tokens.
    #[arg(long, default_value_t = 1024)]
    export_context: usize,
    /// Expert cache of the exported decision, slots (default: what the GPU holds).
    #[arg(long, conflicts_with = "export_cache_gb")]
    export_cache_slots: Option<usize>,
    /// Expert cache of the exported decision, GiB.
    #[arg(long)]
    export_cache_gb: Option<f64>,
    /// Threshold of the legacy ratio rule (reported beside the model, written to the export).
    #[arg(long, default_value_t = ft_model::perf::legacy::DEFAULT_THRESHOLD)]
    threshold: f64,
    /// Print JSON instead of the tables.
    #[arg(long)]
    json: bool,
    /// The engine's settings the end-to-end probe runs with (`--engine-config FILE`,
    /// `--fetch-chunks N`), as `ft run` and `ft serve` take them; part of the profile key.
    #[command(flatten)]
    engine: crate::engine_args::EngineArgs,
    /// The cache the end-to-end probe runs and the export predicts with.
    #[command(flatten)]
    cache_args: crate::cache_args::CacheArgs,
}

/// The device `--device` and `--ordinal` name.
fn device_of(args: &Args) -> Result<Device> {
    let spec = match device_kind(&args.device).context("--device")? {
        DeviceKind::Cuda => DeviceSpec::Cuda {
            ordinal: args.ordinal,
        },
        DeviceKind::Host => DeviceSpec::Host(HostDeviceConfig::default()),
    };
    Device::open(&spec).with_context(|| format!("--device {}", args.device))
}

impl Args {
    fn probe_config(&self) -> Result<ProbeConfig> {
        use ft_model::limits;
        if let Some(t) = self.threads {
            limits::check_threads("--threads", t as u64)?;
        }
        for &t in self.slowdown_threads.iter().flatten() {
            limits::check_threads("--slowdown-threads", t.max(1) as u64)?;
        }
        for &b in &self.streams {
            limits::check_streams("--streams", b as u64)?;
        }
        limits::check_steps("--steps", self.steps as u64)?;
        limits::check_steps("--warmup", self.warmup as u64)?;
        limits::check_context("--context", self.context as u64)?;
        limits::check_context("--long-context", self.long_context as u64)?;
        limits::check_streams("--export-streams", self.export_streams as u64)?;
        if let Some(l) = self.layers {
            limits::check(
                &format!("--layers {l}"),
                l,
                limits::MAX_MOE_LAYERS,
                "ft_model::limits::MAX_MOE_LAYERS",
            )?;
        }
        let pool_wait = match &self.pool_wait {
            Some(s) => Some(s.parse::<PoolWait>()?),
            None => None,
        };
        let c = ProbeConfig {
            threads: self.threads.unwrap_or(0),
            pool_wait,
            streams: self.streams.clone(),
            context: self.context,
            long_context: self.long_context,
            layers: self.layers,
            cache_residency: self.cache_residency,
            hybrid_fractions: self.hybrid_fractions.clone(),
            strategies: StrategyKind::ALL.to_vec(),
            slowdown_threads: self.slowdown_threads.clone(),
            warmup_steps: self.warmup,
            steps: self.steps,
            blocks: ProbeConfig::default().blocks.min(self.steps.max(1)),
            routing: self.routing.clone(),
            seed: self.seed.unwrap_or(rprobe::PROBE_SEED),
            budget_s: self.budget_s,
            max_steal: self.max_steal,
            max_ceiling_drift: self.max_ceiling_drift,
            attempts: self.attempts,
            engine: self.engine.settings()?,
            cache_options: self.cache_args.options(None)?,
        };
        c.validate()?;
        Ok(c)
    }
}

/// Run `ft probe`.
pub fn run(args: Args) -> Result<()> {
    let model =
        ModelSpec::resolve(&args.model).with_context(|| format!("--model {}", args.model))?;
    let config = args.probe_config()?;
    if args.export_streams == 0 {
        bail!("--export-streams must be at least 1");
    }
    let device = device_of(&args)?;
    let key = profile_key(&device, &model, &config.engine, &config.cache_options);
    let dir = profile::profile_dir()?;
    let mut reasons = Vec::new();
    let cached = if args.force {
        reasons.push("--force".to_string());
        None
    } else {
        match ft_model::profile_select::cached(&dir, &key, true)? {
            Ok(p) => Some(p),
            Err(why) => {
                reasons = why;
                None
            }
        }
    };
    let reused = cached.is_some();
    let (profile, outcome) = match cached {
        Some(p) => {
            tracing::info!(model = %model.name, "reusing the cached profile (--force re-probes)");
            (p, None)
        }
        None => {
            let bar = indicatif::ProgressBar::new(1000).with_style(
                indicatif::ProgressStyle::with_template("probe {bar:30} {msg} [{elapsed}]")
                    .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar()),
            );
            if args.json {
                bar.set_draw_target(indicatif::ProgressDrawTarget::hidden());
            }
            let outcome = rprobe::run(&device, &model, &config, &mut |phase, share| {
                bar.set_message(phase.to_string());
                bar.set_position((share.clamp(0.0, 1.0) * 1000.0) as u64);
            })
            .context("probing")?;
            bar.set_message("fit");
            let (profile, _, _) =
                rprobe::fit_profile(&device, &outcome, key.host.clone(), &FitConfig::default())
                    .context("fitting the probes")?;
            bar.finish_and_clear();
            (profile, Some(outcome))
        }
    };
    let path = if reused {
        dir.join(key.file_name())
    } else {
        profile::store(&dir, &profile)?
    };
    if let Some(why) = profile.trust_issue() {
        tracing::warn!(
            "the profile is cached as UNTRUSTED: {why}; predictions from it say so, and ft serve re-probes"
        );
    }
    let copy = match &args.profile_out {
        Some(out) => {
            write_atomic(out, &serde_json::to_vec_pretty(&profile)?)?;
            Some(out.display().to_string())
        }
        None => None,
    };
    let info = device.info();
    let export = match &args.export_freetoken {
        Some(out) => {
            let req = ExportRequest {
                streams: args.export_streams,
                context: args.export_context,
                cache: match (args.export_cache_slots, args.export_cache_gb) {
                    (Some(n), _) => Some(CacheSize::Slots(n)),
                    (_, Some(g)) => Some(CacheSize::GiB(g)),
                    _ => None,
                },
                cache_options: args.cache_args.options(None)?,
                threshold: args.threshold,
            };
            let gpu = ExportGpu {
                index: info.ordinal as u32,
                name: info.name.clone(),
                uuid: None,
            };
            let summary = freetoken::export(&model, &profile, &gpu, &req, out)
                .with_context(|| format!("--export-freetoken {}", out.display()))?;
            Some(summary)
        }
        None => None,
    };
    let used = ProfileUse {
        reused,
        reprobe_reasons: reasons,
        profile_path: path.display().to_string(),
        profile_copy: copy,
        outcome,
        export,
        key,
    };
    let report = ProbeReport::of(&model, info, &profile, config.engine, used, args.threshold);
    let mut out = std::io::stdout().lock();
    if args.json {
        serde_json::to_writer_pretty(&mut out, &report)?;
        writeln!(out)?;
    } else {
        table::write_tables(&mut out, &report)?;
    }
    Ok(())
}
