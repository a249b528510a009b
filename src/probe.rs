//! `ft probe`: measure this host with the real runtime, fit the performance model to the
//! measurements, and cache the fitted profile; optionally export the model's decision as the
//! reference engine's `benchbw.json`.
//!
//! The probes themselves live in `ft_runtime::probe` (what is measured and how), the fit in
//! `ft_model::perf::fit`, the profile's key, location and atomic storage in
//! `ft_model::profile`; this command plans the run from the flags, reuses a fresh profile
//! unless `--force`, prints every parameter with its standard error and the fit's residuals
//! (a table, or `--json`), and writes the files asked for.
//!
//! `--export-freetoken PATH` writes a version-4 `benchbw.json` (the reference engine's
//! bandwidth profile, schema in `docs/probe.md`) whose per-format verdict and fetch fraction
//! are the model's: the reference engine, reading its usual fields, does what the model
//! decided. An existing file at PATH keeps its other formats' entries.

use anyhow::{bail, Context, Result};
use serde::Serialize;
use std::io::Write;
use std::path::{Path, PathBuf};

use ft_model::cache::CacheSize;
use ft_model::perf::fit::{
    FitConfig, FitReport, ParamEstimate, ProbeSamples, Residual, StageReport,
};
use ft_model::perf::legacy::{fraction_q16, BenchBw, LegacyRatio, FRACTION_ONE};
use ft_model::perf::predict::PredictConfig;
use ft_model::perf::{decide, predict, Decision, ExpertShape, Prediction};
use ft_model::profile::{self, Lookup, Profile, ProfileKey};
use ft_model::{ExpertFormat, ModelSpec, StrategyKind};
use ft_runtime::cpu_pool::PoolWait;
use ft_runtime::device::{Device, DeviceInfo, DeviceKind, DeviceSpec, HostDeviceConfig};
use ft_runtime::probe::{self as rprobe, CpuTopology, ProbeConfig, ProbeOutcome};

/// The model probed when `--model` is not given (the field report's).
pub const DEFAULT_MODEL: &str = "qwen3.8-flash-next";

/// The reference engine's profile layout version this command writes.
pub const FREETOKEN_VERSION: u32 = 4;

/// Smallest share of the contended pair given to the side the model's fraction leaves
/// empty (see [`encode_fraction`]): small enough that the Q16 fraction the reference engine
/// derives rounds to exactly 0 or 1 of the link, positive so that it derives one at all.
pub const EXPORT_MIN_SHARE: f64 = 1e-6;

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
    pub engine: ft_runtime::engine::EngineSettings,
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

/// What the export wrote, for the report.
#[derive(Debug, Clone, Serialize)]
pub struct ExportSummary {
    /// The file.
    pub path: String,
    /// The format key in the reference engine's profile.
    pub format_key: String,
    /// The model's verdict, in the reference engine's backend names.
    pub verdict: String,
    /// The model's fetch fraction (hybrid's share of misses over the link).
    pub fetch_fraction: f64,
    /// The same fraction in Q16, as the reference engine will derive it.
    pub fetch_fraction_q16: u64,
    /// The legacy rule's verdict on the same host.
    pub legacy_verdict: String,
}

fn device_of(args: &Args) -> Result<Device> {
    let kind = match args.device.as_str() {
        "auto" => {
            if ft_runtime::cuda_available() {
                DeviceKind::Cuda
            } else {
                DeviceKind::Host
            }
        }
        s => s.parse::<DeviceKind>().context("--device")?,
    };
    let spec = match kind {
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

/// The cached profile of `key` in `dir` when its key matches and its fit is trusted (`Ok`),
/// else why it cannot be used, one phrase per reason (`stale: ...` per mismatch, `no cached
/// profile`, `corrupt: ...`, `untrusted: ...`), each also logged. The one lookup `ft probe`
/// and `ft serve` share; through this entry (the server's) a profile whose fit missed its
/// own validation runs (`Profile::trust_issue`) is re-probed, never served from.
pub fn cached_profile(
    dir: &Path,
    key: &ProfileKey,
) -> Result<std::result::Result<Profile, Vec<String>>> {
    cached_profile_as(dir, key, false)
}

/// [`cached_profile`], reusing an untrusted profile where `keep_untrusted` (`ft probe`: the
/// user sees the mark and `--force` re-probes; a server re-probes instead).
fn cached_profile_as(
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

/// Write `bytes` to `path` atomically: a temporary file beside it, synced, renamed over it.
pub fn write_atomic(path: &Path, bytes: &[u8]) -> Result<()> {
    let dir = path
        .parent()
        .filter(|p| !p.as_os_str().is_empty())
        .unwrap_or(Path::new("."));
    std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    let name = path
        .file_name()
        .with_context(|| format!("{} is not a file path", path.display()))?
        .to_string_lossy()
        .into_owned();
    let tmp = dir.join(format!(".{name}.{}.partial", std::process::id()));
    let write = || -> std::io::Result<()> {
        let mut f = std::fs::File::create(&tmp)?;
        f.write_all(bytes)?;
        f.sync_all()
    };
    if let Err(e) = write().and_then(|_| std::fs::rename(&tmp, path)) {
        let _ = std::fs::remove_file(&tmp);
        return Err(e).with_context(|| format!("writing {}", path.display()));
    }
    Ok(())
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
    let cpu = CpuTopology::detect();
    let gpu_act = ft_kernels::ActivationPath::preferred(model.format);
    let key = ProfileKey::new(
        rprobe::host_fingerprint(
            &device,
            &cpu,
            gpu_act,
            &config.engine,
            &config.cache_options,
        ),
        &model,
    );
    let dir = profile::profile_dir()?;
    let mut reasons = Vec::new();
    let cached = if args.force {
        reasons.push("--force".to_string());
        None
    } else {
        match cached_profile_as(&dir, &key, true)? {
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
    let untrusted = profile.trust_issue();
    if let Some(why) = &untrusted {
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
    let export = match &args.export_freetoken {
        Some(out) => Some(export_freetoken(
            &args,
            &model,
            &profile,
            &device.info(),
            out,
        )?),
        None => None,
    };
    let fit = profile.fit.clone();
    let (estimates, stages, residuals) = match &fit {
        Some(f) => (
            f.estimates.clone(),
            f.stages.clone(),
            residual_summaries(f, &profile.samples),
        ),
        None => (Vec::new(), Vec::new(), Vec::new()),
    };
    let legacy = profile
        .bench_bw
        .map(|b| LegacyRatio::from_bench(&b, args.threshold));
    let report = ProbeReport {
        model: model.clone(),
        device: device.info(),
        reused,
        reprobe_reasons: if reused { Vec::new() } else { reasons },
        profile_path: path.display().to_string(),
        profile_copy: copy,
        key,
        engine: config.engine,
        outcome,
        estimates,
        stages,
        residuals,
        bench_bw: profile.bench_bw,
        legacy,
        export,
        untrusted,
    };
    let mut out = std::io::stdout().lock();
    if args.json {
        serde_json::to_writer_pretty(&mut out, &report)?;
        writeln!(out)?;
    } else {
        write_tables(&mut out, &report)?;
    }
    Ok(())
}

fn write_tables(out: &mut impl Write, r: &ProbeReport) -> Result<()> {
    let how = match &r.outcome {
        Some(o) => format!("probed in {:.1} s", o.wall_s),
        None => "reused the cached profile (--force re-probes)".to_string(),
    };
    writeln!(
        out,
        "ft probe: {} ({}, {:.2} MB experts, {} layers) on {}: {how}",
        r.model.name,
        r.model.format,
        r.model.expert_bytes() as f64 / 1e6,
        r.model.geometry.moe_layers,
        r.device.label()
    )?;
    writeln!(out, "profile: {} (engine {})", r.profile_path, r.engine)?;
    if let Some(why) = &r.untrusted {
        writeln!(out, "UNTRUSTED fit: {why}")?;
    }
    if let Some(c) = &r.profile_copy {
        writeln!(out, "copy: {c}")?;
    }
    if let Some(o) = &r.outcome {
        if let Some(f) = o.host_steal_fraction {
            writeln!(
                out,
                "hypervisor steal during the probe: {:.1}% of the CPU time ({} probe{})",
                100.0 * f,
                o.attempts,
                if o.attempts == 1 { "" } else { "s" }
            )?;
        }
        if let Some(start) = o.stream_read_start_gbs {
            writeln!(
                out,
                "bank read rate (the CPU's ceiling): {start:.1} GB/s at the start, {:.1} at the end",
                o.stream_read_gbs
            )?;
        }
        writeln!(out)?;
        writeln!(
            out,
            "{:<32} {:>7} {:>7} {:>8}",
            "probe", "points", "reps", "wall s"
        )?;
        for t in &o.timings {
            writeln!(
                out,
                "{:<32} {:>7} {:>7} {:>8.2}",
                t.name, t.points, t.reps, t.wall_s
            )?;
        }
        writeln!(out)?;
        writeln!(
            out,
            "end to end ({} of {} layers, {} threads, pool {}):",
            o.e2e_layers,
            o.model.geometry.moe_layers,
            o.threads,
            o.pool_wait.name()
        )?;
        writeln!(
            out,
            "{:<18} {:>7} {:>7} {:>12} {:>12} {:>7}",
            "strategy", "threads", "streams", "tok/s/strm", "step us", "miss%"
        )?;
        for e in &o.e2e {
            writeln!(
                out,
                "{:<18} {:>7} {:>7} {:>12.1} {:>12.1} {:>7.1}",
                e.strategy.to_string(),
                e.threads,
                e.streams,
                e.tok_s_per_stream,
                e.step_us,
                100.0 * e.miss_rate
            )?;
        }
    }
    if !r.estimates.is_empty() {
        writeln!(out)?;
        writeln!(
            out,
            "{:<22} {:>12} {:>11} {:>27}  stage",
            "parameter", "value", "std err", "95% interval"
        )?;
        for e in &r.estimates {
            writeln!(
                out,
                "{:<22} {:>12.4} {:>11.4} [{:>11.4}, {:>11.4}]  {}",
                e.param.name(),
                e.value,
                e.se,
                e.interval[0],
                e.interval[1],
                e.stage
                    .as_deref()
                    .unwrap_or("not determined by the probes (no std err)")
            )?;
        }
        writeln!(out)?;
        writeln!(
            out,
            "{:<22} {:>7} {:>5} {:>9} {:>6}  termination",
            "stage", "samples", "dof", "rms rel", "iters"
        )?;
        for s in &r.stages {
            writeln!(
                out,
                "{:<22} {:>7} {:>5} {:>8.2}% {:>6}  {}",
                s.name,
                s.samples,
                s.dof,
                100.0 * s.rms_rel,
                s.iterations,
                s.termination
            )?;
        }
        writeln!(out)?;
        writeln!(
            out,
            "{:<28} {:>5} {:>8} {:>8} {:>9} {:>9} {:>9}",
            "residuals (pred-meas)/meas", "n", "mean", "rms", "median|r|", "p90|r|", "max|r|"
        )?;
        for s in &r.residuals {
            writeln!(
                out,
                "{:<28} {:>5} {:>7.2}% {:>7.2}% {:>8.2}% {:>8.2}% {:>8.2}%",
                s.probe,
                s.n,
                100.0 * s.mean_rel,
                100.0 * s.rms_rel,
                100.0 * s.median_abs_rel,
                100.0 * s.p90_abs_rel,
                100.0 * s.max_abs_rel
            )?;
        }
    }
    if let (Some(b), Some(l)) = (&r.bench_bw, &r.legacy) {
        writeln!(out)?;
        writeln!(
            out,
            "legacy bench ({:.2} MB experts x {}): cpu-moe {:.2} GB/s, pcie-gather {:.2} GB/s, ratio {:.2} vs {:.2} -> {}; contended {} / {} GB/s -> fetch fraction {}",
            b.expert_bytes as f64 / 1e6,
            b.experts,
            b.cpu_moe_gbs,
            b.pcie_gather_gbs,
            l.ratio,
            l.threshold,
            l.verdict,
            b.cpu_moe_overlap_gbs.map_or("-".into(), |v| format!("{v:.2}")),
            b.pcie_gather_overlap_gbs.map_or("-".into(), |v| format!("{v:.2}")),
            l.fetch_fraction.map_or("-".into(), |f| format!("{f:.3}"))
        )?;
    }
    if let Some(e) = &r.export {
        writeln!(out)?;
        writeln!(
            out,
            "exported {} for the reference engine: {} -> {} (fetch fraction {:.4}, Q16 {}); the legacy rule said {}",
            e.path, e.format_key, e.verdict, e.fetch_fraction, e.fetch_fraction_q16, e.legacy_verdict
        )?;
    }
    if let Some(o) = &r.outcome {
        for n in &o.notes {
            writeln!(out, "note: {n}")?;
        }
    }
    Ok(())
}

// ---------------------------------------------------------------------------------------
// The reference engine's benchbw.json (version 4).

/// The reference engine's key for an expert format (its bench names formats by kernel:
/// `mxfp4` is benched as `mxfp4_triton`; others pass through, as ferrox-core's
/// `bench_format` does).
pub fn freetoken_format_key(format: ExpertFormat) -> &'static str {
    match format {
        ExpertFormat::Mxfp4 => "mxfp4_triton",
        f => f.name(),
    }
}

/// The reference engine's backend name of a strategy (`resident` is its `fused`).
pub fn freetoken_backend(kind: StrategyKind) -> &'static str {
    match kind {
        StrategyKind::Offload => "offload",
        StrategyKind::Hybrid => "hybrid",
        StrategyKind::Cpu => "cpu",
        StrategyKind::Resident => "fused",
        // The reference engine places every layer alike; the export's prediction leaves
        // layer split out (`PredictConfig::layer_split` is `None`), so it never chooses one.
        StrategyKind::LayerSplit | StrategyKind::LayerSplitCached => "offload",
    }
}

/// The contended pair `(cpu, pcie)` in GB/s whose reference-engine fraction
/// `pcie / (pcie + cpu)` is `fraction`, with the measured contended total `total_gbs`
/// between them. A side left empty gets [`EXPORT_MIN_SHARE`] of the total (the reference
/// engine derives no fraction from a zero), and a fraction below one Q16 step is raised to
/// it: the reference engine reads a Q16 fraction of 0 as "none configured", which fetches
/// every miss.
pub fn encode_fraction(fraction: f64, total_gbs: f64) -> (f64, f64) {
    let min_q16 = 1.0 / FRACTION_ONE as f64;
    let f = fraction.clamp(min_q16, 1.0 - EXPORT_MIN_SHARE);
    ((1.0 - f) * total_gbs, f * total_gbs)
}

/// The served geometry in an export entry.
#[derive(Debug, Clone, Serialize)]
pub struct ExportExpert {
    /// Expert format (ft's name).
    pub format: String,
    /// Model width, elements.
    pub hidden: usize,
    /// Expert FFN width, elements.
    pub intermediate: usize,
    /// Routed experts per layer.
    pub experts: usize,
    /// Experts per token.
    pub top_k: usize,
    /// MoE layers.
    pub moe_layers: usize,
    /// Bytes of one routed expert.
    pub expert_bytes: u64,
}

/// The bandwidths measured at the served geometry (top-k experts, one token, the serving
/// threads), GB/s, and where each came from.
#[derive(Debug, Clone, Serialize)]
pub struct ServedBandwidths {
    /// CPU-MoE alone.
    pub cpu_moe_gbs: f64,
    /// PCIe gather alone.
    pub pcie_gather_gbs: f64,
    /// CPU-MoE while a gather runs.
    pub cpu_moe_overlap_gbs: f64,
    /// PCIe gather while the CPU kernel runs.
    pub pcie_gather_overlap_gbs: f64,
    /// `measured` (probe samples) or `modelled` (fitted model, a point was not probed).
    pub source: String,
}

/// One format's entry of `dtype_kernels`: the reference engine's fields first
/// (`cpu_moe_gbs`, `pcie_gather_gbs`, `cpu_moe_overlap_gbs`, `pcie_gather_overlap_gbs`,
/// `recommended`), then what its bench also writes (`ratio`, `verdict`, `fetch_fraction`),
/// then ft's own (ignored by the reference engine's reader).
#[derive(Debug, Clone, Serialize)]
pub struct ExportEntry {
    /// CPU-MoE bandwidth alone at the served geometry, GB/s (measured).
    pub cpu_moe_gbs: f64,
    /// PCIe-gather bandwidth alone at the served geometry, GB/s (measured).
    pub pcie_gather_gbs: f64,
    /// The contended CPU-MoE bandwidth, re-split to carry the model's fraction, GB/s.
    pub cpu_moe_overlap_gbs: f64,
    /// The contended PCIe-gather bandwidth, re-split to carry the model's fraction, GB/s.
    pub pcie_gather_overlap_gbs: f64,
    /// The model's verdict (reference engine backend name).
    pub recommended: String,
    /// `cpu_moe_gbs / pcie_gather_gbs` (informational; the verdict is not the ratio's).
    pub ratio: f64,
    /// The model's verdict (same as `recommended`).
    pub verdict: String,
    /// The model's fetch fraction (hybrid: share of each layer's misses over the link;
    /// 1 for offload and fused, 0 for cpu).
    pub fetch_fraction: f64,
    /// The Q16 fraction the reference engine derives from the contended pair.
    pub fetch_fraction_q16: u64,
    /// The served geometry.
    pub expert: ExportExpert,
    /// The bandwidths as measured (the contended pair before re-splitting).
    pub measured: ServedBandwidths,
    /// The legacy bench at its tuning geometry (measured by the probes), if probed.
    pub bench: Option<BenchBw>,
    /// The legacy rule's verdict at the tuning geometry.
    pub legacy_verdict: Option<String>,
    /// Who decided.
    pub decided_by: String,
    /// The prediction behind the decision: streams, context, cache, tok/s per strategy.
    pub decision: ExportDecision,
}

/// The prediction behind an exported verdict.
#[derive(Debug, Clone, Serialize)]
pub struct ExportDecision {
    /// Streams.
    pub streams: usize,
    /// Context, tokens.
    pub context: usize,
    /// Expert cache slots.
    pub cache_slots: usize,
    /// Predicted total tok/s per feasible strategy.
    pub tok_s_total: std::collections::BTreeMap<String, f64>,
    /// Margin over the runner-up (relative).
    pub margin: f64,
    /// True when the choice and the runner-up's intervals overlap.
    pub near_tie: bool,
}

/// Which GPU the profile describes (the reference engine's `gpu`).
#[derive(Debug, Clone, Serialize)]
pub struct ExportGpu {
    /// Device ordinal.
    pub index: u32,
    /// Name as the driver reports it (the reference engine refuses a profile of another).
    pub name: String,
    /// UUID (not known to ft: null, which the reference engine accepts).
    pub uuid: Option<String>,
}

/// The measured bandwidths at the served geometry (samples where probed, else the model).
pub fn served_bandwidths(profile: &Profile, model: &ModelSpec) -> ServedBandwidths {
    let s = &profile.samples;
    let k = model.geometry.top_k as u32;
    let b = model.expert_bytes() as f64;
    let same = |x: f64| (x - b).abs() < 0.5;
    let threads = s
        .cpu_step
        .iter()
        .map(|c| c.threads)
        .max()
        .unwrap_or(profile.params.cpu_threads);
    let ct = s
        .gather
        .iter()
        .filter_map(|g| g.contended_cpu_threads)
        .max()
        .unwrap_or(threads);
    let gbs = |us: f64| k as f64 * b / (us * 1e3);
    let gather = |c: Option<u32>| {
        s.gather
            .iter()
            .find(|g| g.experts == k && same(g.expert_bytes) && g.contended_cpu_threads == c)
            .map(|g| gbs(g.time_us))
    };
    let cpu = |contended: bool| {
        s.cpu_step
            .iter()
            .find(|c| {
                c.experts == k
                    && c.tokens_per_expert == 1
                    && c.threads == threads
                    && same(c.expert_bytes)
                    && c.contended == contended
            })
            .map(|c| gbs(c.time_us))
    };
    match (cpu(false), gather(None), cpu(true), gather(Some(ct))) {
        (Some(c), Some(p), Some(co), Some(po)) => ServedBandwidths {
            cpu_moe_gbs: c,
            pcie_gather_gbs: p,
            cpu_moe_overlap_gbs: co,
            pcie_gather_overlap_gbs: po,
            source: "measured".into(),
        },
        _ => {
            let m = BenchBw::modelled_at(&profile.params, ExpertShape::of(model), k);
            ServedBandwidths {
                cpu_moe_gbs: m.cpu_moe_gbs,
                pcie_gather_gbs: m.pcie_gather_gbs,
                cpu_moe_overlap_gbs: m.cpu_moe_overlap_gbs.unwrap_or(m.cpu_moe_gbs),
                pcie_gather_overlap_gbs: m.pcie_gather_overlap_gbs.unwrap_or(m.pcie_gather_gbs),
                source: "modelled".into(),
            }
        }
    }
}

/// The model's verdict and fraction of a prediction: the best feasible strategy.
pub fn verdict_of(pred: &Prediction, decision: &Decision) -> (StrategyKind, f64) {
    let kind = decision.kind;
    let f = match kind {
        StrategyKind::Hybrid => pred.get(StrategyKind::Hybrid).fetch_fraction,
        StrategyKind::Cpu => 0.0,
        _ => 1.0,
    };
    (kind, f)
}

/// Build (and merge into `existing`, a previous file's JSON) the reference engine's profile
/// for one format. Returns the document and the entry written.
#[allow(clippy::too_many_arguments)]
pub fn freetoken_document(
    existing: Option<serde_json::Value>,
    model: &ModelSpec,
    profile: &Profile,
    gpu: &DeviceInfo,
    pred: &Prediction,
    decision: &Decision,
    threshold: f64,
) -> Result<(serde_json::Value, ExportEntry)> {
    use serde_json::{json, Value};
    let (kind, fraction) = verdict_of(pred, decision);
    let measured = served_bandwidths(profile, model);
    let total = measured.cpu_moe_overlap_gbs + measured.pcie_gather_overlap_gbs;
    let (cpu_ov, pcie_ov) = encode_fraction(fraction, total);
    let q16 = fraction_q16(pcie_ov / (pcie_ov + cpu_ov));
    let g = model.geometry;
    let legacy = profile
        .bench_bw
        .map(|b| LegacyRatio::from_bench(&b, threshold));
    let entry = ExportEntry {
        cpu_moe_gbs: measured.cpu_moe_gbs,
        pcie_gather_gbs: measured.pcie_gather_gbs,
        cpu_moe_overlap_gbs: cpu_ov,
        pcie_gather_overlap_gbs: pcie_ov,
        recommended: freetoken_backend(kind).into(),
        ratio: measured.cpu_moe_gbs / measured.pcie_gather_gbs,
        verdict: freetoken_backend(kind).into(),
        fetch_fraction: fraction,
        fetch_fraction_q16: q16,
        expert: ExportExpert {
            format: model.format.name().into(),
            hidden: g.hidden,
            intermediate: g.intermediate,
            experts: g.experts,
            top_k: g.top_k,
            moe_layers: g.moe_layers,
            expert_bytes: model.expert_bytes(),
        },
        measured,
        bench: profile.bench_bw,
        legacy_verdict: legacy.map(|l| l.verdict.name().to_string()),
        decided_by: format!(
            "ft {} performance model (ft probe profile of {})",
            env!("CARGO_PKG_VERSION"),
            profile.key.host.gpu_name
        ),
        decision: ExportDecision {
            streams: pred.config.streams,
            context: pred.config.context,
            cache_slots: pred.cache_slots,
            tok_s_total: pred
                .strategies
                .iter()
                .filter(|s| s.feasible)
                .map(|s| (s.strategy.to_string(), s.tok_s_total))
                .collect(),
            margin: decision.margin,
            near_tie: decision.near_tie,
        },
    };
    let key = freetoken_format_key(model.format);
    let mut doc = match existing {
        Some(Value::Object(m)) => Value::Object(m),
        _ => json!({}),
    };
    let obj = doc.as_object_mut().expect("an object");
    let same_gpu = obj
        .get("gpu")
        .and_then(|g| g.get("name"))
        .and_then(Value::as_str)
        .is_none_or(|n| n == gpu.name);
    if !same_gpu {
        // Another card's numbers are worse than none: start over rather than mix.
        tracing::warn!("the existing profile describes another GPU; its entries are dropped");
        obj.clear();
    }
    obj.insert("version".into(), json!(FREETOKEN_VERSION));
    obj.insert("threshold".into(), json!(threshold));
    obj.insert(
        "gpu".into(),
        serde_json::to_value(ExportGpu {
            index: gpu.ordinal as u32,
            name: gpu.name.clone(),
            uuid: None,
        })?,
    );
    for section in ["dtypes", "dtype_kernels", "workloads"] {
        if !obj.get(section).is_some_and(Value::is_object) {
            obj.insert(section.into(), json!({}));
        }
    }
    obj["dtypes"][key] = json!(freetoken_backend(kind));
    obj["dtype_kernels"][key] = serde_json::to_value(&entry)?;
    obj.insert(
        "ft".into(),
        json!({
            "program_version": env!("CARGO_PKG_VERSION"),
            "profile_key": profile.key,
            "profile_created_unix_s": profile.created_unix_s,
            "note": "verdicts and fetch fractions are ft's performance model's; see docs/probe.md",
        }),
    );
    Ok((doc, entry))
}

fn export_freetoken(
    args: &Args,
    model: &ModelSpec,
    profile: &Profile,
    gpu: &DeviceInfo,
    out: &Path,
) -> Result<ExportSummary> {
    let cache = match (args.export_cache_slots, args.export_cache_gb) {
        (Some(n), _) => Some(CacheSize::Slots(n)),
        (_, Some(g)) => Some(CacheSize::GiB(g)),
        _ => None,
    };
    let config = PredictConfig {
        streams: args.export_streams,
        context: args.export_context,
        cache,
        cache_options: args.cache_args.options(None)?,
        threshold: args.threshold,
        bench: profile.bench_bw,
        ..PredictConfig::default()
    };
    let perf = profile.perf_model("ft probe profile");
    let pred = predict(model, &perf, &config).context("predicting for --export-freetoken")?;
    let decision = decide(&pred);
    let existing = match std::fs::read_to_string(out) {
        Ok(text) => match serde_json::from_str(&text) {
            Ok(v) => Some(v),
            Err(e) => {
                tracing::warn!(path = %out.display(), "not JSON ({e}); it is replaced");
                None
            }
        },
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => None,
        Err(e) => return Err(e).with_context(|| format!("--export-freetoken {}", out.display())),
    };
    let (doc, entry) = freetoken_document(
        existing,
        model,
        profile,
        gpu,
        &pred,
        &decision,
        args.threshold,
    )?;
    write_atomic(out, &serde_json::to_vec_pretty(&doc)?)?;
    Ok(ExportSummary {
        path: out.display().to_string(),
        format_key: freetoken_format_key(model.format).into(),
        verdict: entry.verdict,
        fetch_fraction: entry.fetch_fraction,
        fetch_fraction_q16: entry.fetch_fraction_q16,
        legacy_verdict: pred.legacy.verdict.name().into(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use ft_model::host::HostSpec;

    fn profile(model: &ModelSpec) -> Profile {
        let host = HostSpec::field_report();
        Profile {
            bench_bw: Some(BenchBw {
                expert_bytes: 7_974_912,
                experts: 8,
                cpu_moe_gbs: 46.12,
                pcie_gather_gbs: 24.25,
                cpu_moe_overlap_gbs: Some(33.4),
                pcie_gather_overlap_gbs: Some(12.8),
            }),
            ..Profile::of_host_spec(&host, model).unwrap()
        }
    }

    fn gpu() -> DeviceInfo {
        DeviceInfo {
            kind: DeviceKind::Cuda,
            ordinal: 0,
            name: "NVIDIA GeForce RTX 4090".into(),
            compute_capability: Some((8, 9)),
            multiprocessors: 128,
            total_mem_bytes: 24 << 30,
            driver_version: Some("12.4".into()),
            host_memory: "test".into(),
            cuda_tuning: None,
        }
    }

    #[test]
    fn format_keys_follow_the_reference_engine() {
        for f in ExpertFormat::ALL {
            assert_eq!(
                freetoken_format_key(f),
                ferrox_core::bench_profile::bench_format(f.name()),
                "{f}"
            );
        }
    }

    /// The encoded pair gives back the fraction through the reference engine's own rule and
    /// Q16 rounding, for fractions across [0, 1] including both ends.
    #[test]
    fn the_encoded_pair_carries_the_fraction_through_the_reference_rule() {
        for i in 0..=200 {
            let f = i as f64 / 200.0;
            let (c, p) = encode_fraction(f, 37.5);
            assert!((c + p - 37.5).abs() < 1e-9);
            let back =
                ferrox_core::qstar::fetch_fraction_from_overlap(c, p).expect("both positive");
            let policy = ferrox_core::qstar::QStarPolicy::from_fraction(back);
            let want = fraction_q16(f).max(1);
            assert_eq!(policy.fraction_q16(), want, "f = {f}");
            // The split of misses is the one ft's planner makes at the same fraction.
            for m in 0..=40usize {
                let fq = want as f64 / FRACTION_ONE as f64;
                assert_eq!(
                    policy.split(m).fetch,
                    ft_model::plan::fetch_count(fq, m),
                    "f = {f}, m = {m}"
                );
            }
        }
        // Zero stays "fetch nothing", never the reference engine's unconfigured default.
        let (c, p) = encode_fraction(0.0, 10.0);
        let q = ferrox_core::qstar::QStarPolicy::from_fraction(p / (p + c));
        assert_eq!(q.split(12).fetch, 0);
    }

    /// The document parses as the reference engine's profile, names the model's verdict,
    /// yields the model's fraction, and keeps another format's entry.
    #[test]
    fn the_document_is_read_by_the_reference_engine_as_the_model_decided() {
        let model = ModelSpec::preset("qwen3.8-flash-next").unwrap();
        let p = profile(&model);
        assert_eq!(p.params.cpu_threads, 24);
        let config = PredictConfig {
            streams: 2,
            steps: 60,
            warmup_steps: 30,
            bench: p.bench_bw,
            cache: Some(CacheSize::Slots(4000)),
            ..PredictConfig::default()
        };
        let pred = predict(&model, &p.perf_model("test"), &config).unwrap();
        let decision = decide(&pred);
        let existing = serde_json::json!({
            "version": 4,
            "gpu": {"name": "NVIDIA GeForce RTX 4090"},
            "dtypes": {"bf16": "offload"},
            "dtype_kernels": {"bf16": {"cpu_moe_gbs": 10.0, "pcie_gather_gbs": 20.0}},
        });
        let (doc, entry) =
            freetoken_document(Some(existing), &model, &p, &gpu(), &pred, &decision, 2.0).unwrap();
        let read: ferrox_core::qstar::BandwidthProfile =
            serde_json::from_value(doc.clone()).unwrap();
        assert_eq!(read.version, Some(4));
        assert!(read.matches_gpu(Some("NVIDIA GeForce RTX 4090")));
        let want = match decision.kind {
            StrategyKind::Offload => ferrox_core::qstar::MoeBackend::Offload,
            StrategyKind::Hybrid => ferrox_core::qstar::MoeBackend::Hybrid,
            StrategyKind::Cpu => ferrox_core::qstar::MoeBackend::Cpu,
            StrategyKind::Resident => ferrox_core::qstar::MoeBackend::Fused,
            StrategyKind::LayerSplit | StrategyKind::LayerSplitCached => {
                unreachable!("the export's prediction leaves layer split out")
            }
        };
        assert_eq!(read.backend_for("nvfp4"), Some(want));
        let (_, f) = verdict_of(&pred, &decision);
        assert_eq!(
            read.policy_for("nvfp4").fraction_q16(),
            fraction_q16(f).max(1)
        );
        assert_eq!(entry.fetch_fraction_q16, fraction_q16(f).max(1));
        // The other format's entry is kept.
        assert_eq!(
            read.backend_for("bf16"),
            Some(ferrox_core::qstar::MoeBackend::Offload)
        );
        assert_eq!(
            doc["dtype_kernels"]["nvfp4"]["expert"]["expert_bytes"],
            2_772_480
        );
        // With no samples the served bandwidths are the model's.
        assert_eq!(entry.measured.source, "modelled");
        // Another GPU's file is not mixed with this one's.
        let other = serde_json::json!({"gpu": {"name": "Other"}, "dtypes": {"bf16": "hybrid"}});
        let (doc, _) =
            freetoken_document(Some(other), &model, &p, &gpu(), &pred, &decision, 2.0).unwrap();
        assert!(doc["dtypes"].get("bf16").is_none());
    }

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

    #[test]
    fn atomic_writes_leave_no_partial_file() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("sub").join("p.json");
        write_atomic(&path, b"{}").unwrap();
        write_atomic(&path, b"{\"a\":1}").unwrap();
        assert_eq!(std::fs::read_to_string(&path).unwrap(), "{\"a\":1}");
        let names: Vec<_> = std::fs::read_dir(path.parent().unwrap()).unwrap().collect();
        assert_eq!(names.len(), 1);
    }
}
