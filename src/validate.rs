//! `ft validate`: the acceptance of the performance model against measured runs, and the
//! small helpers the GPU experiment (`experiments/validate-h200/run.sh`) needs between its
//! `ft probe`, `ft predict` and `ft run` calls.
//!
//! - `plan`: the grid of configurations (expert geometry x cache residency x streams x CPU
//!   threads x context), the layer-reduced model files and the order to run them in.
//! - `get`: one value of a JSON document by a dotted path (the script has no `jq`).
//! - `model-file`: a preset's geometry with fewer layers as a model TOML (the experiments'
//!   runtime halves describe their `ft run --layers N` to the simulator with it).
//! - `peer`: ferrox-core's verdict and fetch fraction (the reference engine's rule as the
//!   ferrox-core crate ports it) fed a profile's bench bandwidths.
//! - `retarget`: a profile re-expressed at another serving thread count (`ft predict` predicts
//!   at the profile's threads; the grid varies them).
//! - `collect`: the measured runs and the predictions of a grid into one CSV.
//! - `simulate`: the discrete-event simulator given the same fitted profile as the model,
//!   for every run of a collected grid (issue #6: simulator against runtime); it fills the
//!   CSV's `simulated_tok_s` column.
//! - `analyze`: from that CSV alone, the prediction errors, the model's choice against the
//!   measured best, and the same for the ratio rule and for ferrox-core as a peer; with the
//!   simulator's column, the simulator's errors too.
//!
//! Why ferrox-core is a dependency of the binary (and not a dev-dependency of an example):
//! the analysis is part of the acceptance, the GPU machine has no Rust toolchain, and the
//! one prebuilt `ft` carried there must do the measuring and the analysis; ferrox-core's
//! default features pull no GPU code, it is pure Rust, and only this file and the export of
//! `ft probe` use it. Using the crate itself (not ft's mirror of its rule in
//! `ft_model::perf::legacy`) is what makes it a peer: an independent implementation fed the
//! same bandwidths.

use anyhow::{bail, Context, Result};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::io::Write;
use std::path::{Path, PathBuf};

use ft_model::perf::legacy::{self, fraction_q16, LegacyVerdict, FRACTION_ONE};
use ft_model::profile::{CpuCheck, Profile};
use ft_model::{ModelSpec, StrategyKind};
use ft_runtime::instrument::STEAL_NOTABLE_FRACTION;

/// The expert geometries of the grid, with the layers each runs (a few layers of the real
/// geometry: the per-layer costs are what the model predicts, and a bank of every layer would
/// not fill in the grid's time; deepseek-v4-flash's 43 layers also exceed the host's RAM).
pub const GRID_GEOMETRIES: [(&str, usize); 3] = [
    ("qwen3.8-flash-next", 2),
    ("bench-nvfp4", 2),
    ("deepseek-v4-flash", 1),
];

/// Cache residencies of the grid (share of the run's routed experts the GPU cache holds).
pub const GRID_RESIDENCIES: [f64; 3] = [0.05, 0.15, 0.35];
/// Stream counts of the grid.
pub const GRID_STREAMS: [usize; 4] = [1, 2, 4, 8];
/// CPU threads of the grid (the H200 machine has 16 cores: 15 leaves one for the host).
pub const GRID_THREADS: [usize; 2] = [4, 15];
/// Contexts of the grid, tokens (short and long).
pub const GRID_CONTEXTS: [usize; 2] = [1024, 32768];
/// Configurations per (geometry, streams) in the full grid (`--quick`: 1).
pub const GRID_PER_CELL: usize = 4;

/// Targets of the acceptance: median and 90th percentile of the absolute relative error of
/// predicted decode tok/s, and the model's mean loss against the measured best.
pub const TARGET_MEDIAN_ERR: f64 = 0.05;
/// See [`TARGET_MEDIAN_ERR`].
pub const TARGET_P90_ERR: f64 = 0.10;
/// See [`TARGET_MEDIAN_ERR`].
pub const TARGET_MEAN_LOSS: f64 = 0.02;
/// A pick slower than the best by more than this is a wrong pick that matters.
pub const WRONG_PICK_GAP: f64 = 0.05;
/// Target of the simulator against the runtime (issue #6): median absolute relative error of
/// simulated decode tok/s at most this.
pub const TARGET_SIM_MEDIAN_ERR: f64 = 0.10;

/// The strategies a grid configuration runs, with their CSV names.
pub const GRID_STRATEGIES: [&str; 4] = ["offload", "hybrid", "hybrid-legacy", "cpu"];

/// Arguments of `ft validate`.
#[derive(Debug, clap::Args)]
pub struct Args {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, clap::Subcommand)]
enum Command {
    /// Write the grid's plan.csv and its layer-reduced model TOML files into --out.
    Plan {
        /// Output folder.
        #[arg(long)]
        out: PathBuf,
        /// One configuration per (geometry, streams) instead of four.
        #[arg(long)]
        quick: bool,
    },
    /// Write a model TOML of a preset's geometry with fewer MoE layers (what `ft run --layers
    /// N` decodes), for the simulator and the model to describe the same run.
    ModelFile {
        /// Model preset or TOML file.
        #[arg(long)]
        model: String,
        /// MoE layers.
        #[arg(long)]
        layers: usize,
        /// The file to write.
        #[arg(long)]
        out: PathBuf,
    },
    /// Print the value at a dotted path of a JSON file (`a.b.0.c`); strings unquoted.
    Get {
        /// The JSON file.
        file: PathBuf,
        /// The path (object keys and array indices separated by dots).
        path: String,
    },
    /// ferrox-core's verdict and fetch fraction from a profile's bench bandwidths.
    Peer {
        /// The profile (`ft probe --profile-out`).
        #[arg(long)]
        profile: PathBuf,
        /// Threshold of the rule.
        #[arg(long, default_value_t = legacy::DEFAULT_THRESHOLD)]
        threshold: f64,
        /// Print only this field: verdict, fraction, ratio-verdict.
        #[arg(long)]
        field: Option<String>,
        /// Print JSON.
        #[arg(long)]
        json: bool,
    },
    /// Write a profile re-expressed at another serving thread count.
    Retarget {
        /// The profile.
        #[arg(long)]
        profile: PathBuf,
        /// Serving threads.
        #[arg(long)]
        threads: u32,
        /// The profile to write.
        #[arg(long)]
        out: PathBuf,
    },
    /// Refit a profile from its own probe samples with this build's fitting (the same
    /// measurements, the current estimators), starting from its parameters.
    Refit {
        /// The profile.
        #[arg(long)]
        profile: PathBuf,
        /// The profile to write.
        #[arg(long)]
        out: PathBuf,
    },
    /// Collect a grid's runs and predictions (under --dir) into a CSV.
    Collect {
        /// The experiment's output folder (plan.csv, runs/, predictions/, profiles/).
        #[arg(long)]
        dir: PathBuf,
        /// The CSV to write.
        #[arg(long)]
        out: PathBuf,
    },
    /// Simulate every run of a grid CSV with the discrete-event simulator, given the same
    /// fitted profile as the model (`profiles/<geometry>-t<threads>.json` beside the CSV),
    /// and write the CSV back with its `simulated_tok_s` column filled.
    Simulate {
        /// The experiment's output folder (grid.csv, profiles/).
        #[arg(long)]
        dir: PathBuf,
        /// Measured steps of each simulated run (run.sh passes its runs' count).
        #[arg(long, default_value_t = 16)]
        steps: u64,
        /// Warm-up steps before them (likewise).
        #[arg(long, default_value_t = 8)]
        warmup: u64,
        /// Seed of the routing (the grid's `ft run` default: 0).
        #[arg(long, default_value_t = 0)]
        seed: u64,
    },
    /// Analyse a grid CSV: errors, the model's choice, the ratio rule, ferrox-core.
    Analyze {
        /// The CSV (`ft validate collect`).
        csv: PathBuf,
        /// Also write the summary JSON here.
        #[arg(long)]
        out: Option<PathBuf>,
        /// Exit with 1 when a target is missed.
        #[arg(long)]
        check: bool,
        /// Print JSON instead of the table.
        #[arg(long)]
        json: bool,
    },
}

/// Run `ft validate`.
pub fn run(args: Args) -> Result<()> {
    match args.command {
        Command::Plan { out, quick } => plan(&out, quick),
        Command::ModelFile { model, layers, out } => {
            let m = ModelSpec::resolve(&model).with_context(|| format!("--model {model}"))?;
            let full = m.geometry.moe_layers;
            let mut m = m.first_layers(layers)?;
            if layers < full {
                m.name = format!("{}-{layers}-layers", m.name);
            }
            crate::probe::write_atomic(&out, m.to_toml().as_bytes())
        }
        Command::Get { file, path } => {
            let v = json_at(&file, &path)?;
            match v {
                serde_json::Value::String(s) => outln!("{s}")?,
                other => outln!("{other}")?,
            }
            Ok(())
        }
        Command::Peer {
            profile,
            threshold,
            field,
            json,
        } => peer_cmd(&profile, threshold, field.as_deref(), json),
        Command::Retarget {
            profile,
            threads,
            out,
        } => {
            ft_model::limits::check_threads("--threads", threads as u64)?;
            let p = Profile::read(&profile)
                .with_context(|| format!("--profile {}", profile.display()))?;
            let q = p.at_threads(threads)?;
            crate::probe::write_atomic(&out, &serde_json::to_vec_pretty(&q)?)
        }
        Command::Refit { profile, out } => {
            let p = Profile::read(&profile)
                .with_context(|| format!("--profile {}", profile.display()))?;
            let q = refit(&p).with_context(|| format!("refitting {}", profile.display()))?;
            crate::probe::write_atomic(&out, &serde_json::to_vec_pretty(&q)?)
        }
        Command::Collect { dir, out } => {
            let (rows, missing) = collect(&dir)?;
            write_csv(&out, &rows)?;
            eprintln!(
                "ft validate collect: {} rows, {} runs missing",
                rows.len(),
                missing.len()
            );
            for m in missing {
                tracing::warn!("missing: {m}");
            }
            Ok(())
        }
        Command::Simulate {
            dir,
            steps,
            warmup,
            seed,
        } => {
            let csv = dir.join("grid.csv");
            let mut rows = read_csv(&csv)?;
            let n = simulate_rows(&dir.join("profiles"), &mut rows, steps, warmup, seed)?;
            write_csv(&csv, &rows)?;
            eprintln!("ft validate simulate: {n} of {} rows simulated", rows.len());
            Ok(())
        }
        Command::Analyze {
            csv,
            out,
            check,
            json,
        } => {
            let rows = read_csv(&csv)?;
            let s = analyze(&rows)?;
            if let Some(path) = out {
                crate::probe::write_atomic(&path, &serde_json::to_vec_pretty(&s)?)?;
            }
            let mut o = std::io::stdout().lock();
            if json {
                serde_json::to_writer_pretty(&mut o, &s)?;
                writeln!(o)?;
            } else {
                write_summary(&mut o, &s)?;
            }
            if check && !s.targets_met {
                return Err(
                    crate::CheckFailed(format!("targets missed: {}", s.missed.join("; "))).into(),
                );
            }
            Ok(())
        }
    }
}

// ------------------------------------------------------------------------------ plan

/// One configuration of the grid.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PlanRow {
    /// Identifier (`c07`), also the file stem of its runs and prediction.
    pub config: String,
    /// Model preset of the expert geometry.
    pub geometry: String,
    /// Layers run.
    pub layers: usize,
    /// The layer-reduced model file, relative to the output folder.
    pub model_toml: String,
    /// Cache residency (share of the run's routed experts).
    pub residency: f64,
    /// Cache slots that residency gives.
    pub cache_slots: usize,
    /// Streams.
    pub streams: usize,
    /// CPU threads.
    pub threads: usize,
    /// Context, tokens.
    pub context: usize,
}

/// The grid's configurations in run order (see the module docs of the experiment): for each
/// geometry and stream count, [`GRID_PER_CELL`] of the 12 (residency, threads, context)
/// combinations, rotated so that over the stream counts every geometry meets all 12; ordered
/// round by round, so a run cut short by its time budget still covers every geometry and
/// stream count.
pub fn grid(quick: bool) -> Result<Vec<PlanRow>> {
    let per = if quick { 1 } else { GRID_PER_CELL };
    let combos: Vec<(f64, usize, usize)> = GRID_RESIDENCIES
        .iter()
        .flat_map(|&r| {
            GRID_THREADS
                .iter()
                .flat_map(move |&t| GRID_CONTEXTS.iter().map(move |&c| (r, t, c)))
        })
        .collect();
    let mut rows = Vec::new();
    for j in 0..per {
        for (si, &streams) in GRID_STREAMS.iter().enumerate() {
            for (gi, &(name, layers)) in GRID_GEOMETRIES.iter().enumerate() {
                let (residency, threads, context) = combos[(gi * 5 + si * per + j) % combos.len()];
                let model = ModelSpec::preset(name)?.with_layers(layers);
                let total = model.geometry.total_experts() as f64;
                let cache_slots = ((residency * total).round() as usize).max(1);
                rows.push(PlanRow {
                    config: String::new(),
                    geometry: name.to_string(),
                    layers,
                    model_toml: format!("models/{name}-L{layers}.toml"),
                    residency,
                    cache_slots,
                    streams,
                    threads,
                    context,
                });
            }
        }
    }
    for (i, r) in rows.iter_mut().enumerate() {
        r.config = format!("c{i:02}");
    }
    Ok(rows)
}

fn plan(out: &Path, quick: bool) -> Result<()> {
    let rows = grid(quick)?;
    std::fs::create_dir_all(out.join("models"))
        .with_context(|| format!("creating {}", out.display()))?;
    for &(name, layers) in &GRID_GEOMETRIES {
        let m = ModelSpec::preset(name)?.with_layers(layers);
        std::fs::write(
            out.join(format!("models/{name}-L{layers}.toml")),
            m.to_toml(),
        )?;
    }
    write_csv(&out.join("plan.csv"), &rows)?;
    outln!("{}", rows.len())?;
    Ok(())
}

// ------------------------------------------------------------------------------ helpers

/// The value at a dotted path of a JSON file; errors name the file and the path.
pub fn json_at(file: &Path, path: &str) -> Result<serde_json::Value> {
    let text = ft_model::limits::read_bounded(file, ft_model::limits::MAX_PROFILE_BYTES)
        .with_context(|| format!("reading {}", file.display()))?;
    let v: serde_json::Value =
        serde_json::from_str(&text).with_context(|| format!("{} is not JSON", file.display()))?;
    value_at(&v, path)
        .cloned()
        .with_context(|| format!("{}: no value at '{path}'", file.display()))
}

/// The value at a dotted path (`a.b.0.c`) of a JSON value.
pub fn value_at<'a>(v: &'a serde_json::Value, path: &str) -> Option<&'a serde_json::Value> {
    path.split('.')
        .filter(|p| !p.is_empty())
        .try_fold(v, |v, part| match v {
            serde_json::Value::Array(a) => part.parse::<usize>().ok().and_then(|i| a.get(i)),
            serde_json::Value::Object(o) => o.get(part),
            _ => None,
        })
}

/// ferrox-core's answer for one set of bench bandwidths.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct PeerAnswer {
    /// ferrox-core `entry_from(..).recommended` (the contended pair where it exists).
    pub verdict: String,
    /// ferrox-core's fetch fraction (`KernelBandwidths::fetch_fraction`, contended pair
    /// first), Q16-rounded as `QStarPolicy::from_fraction` carries it.
    pub fraction: f64,
    /// Its Q16 value.
    pub fraction_q16: u64,
    /// The ratio rule's verdict (standalone pair, as `ft bench bw` prints it): ft's mirror.
    pub ratio_verdict: String,
    /// True when ferrox-core's split of every miss count 0..=64 at the fraction is the one
    /// ft's planner makes.
    pub split_agrees: bool,
}

/// Most misses at which the planner's split is compared with ferrox-core's.
const SPLIT_CHECK_MISSES: usize = 64;

/// ferrox-core fed `(cpu, pcie, cpu_ov, pcie_ov)` in GB/s.
pub fn peer(
    cpu: f64,
    pcie: f64,
    cpu_ov: Option<f64>,
    pcie_ov: Option<f64>,
    threshold: f64,
) -> Result<PeerAnswer> {
    use ferrox_core::bench_profile::{entry_from, Measured};
    let m = Measured {
        cpu_moe_gbs: Some(cpu),
        pcie_gather_gbs: Some(pcie),
        cpu_moe_overlap_gbs: cpu_ov,
        pcie_gather_overlap_gbs: pcie_ov,
    };
    let entry = entry_from(&m, threshold)
        .map_err(|e| anyhow::anyhow!("ferrox-core refused the bandwidths: {e}"))?;
    let verdict = match entry.recommended {
        Some(ferrox_core::qstar::MoeBackend::Hybrid) => "hybrid",
        Some(ferrox_core::qstar::MoeBackend::Cpu) => "cpu",
        Some(ferrox_core::qstar::MoeBackend::Fused) => "resident",
        _ => "offload",
    };
    let raw = entry.fetch_fraction().unwrap_or(1.0);
    let policy = ferrox_core::qstar::QStarPolicy::from_fraction(raw);
    let q = policy.fraction_q16();
    let f = q as f64 / FRACTION_ONE as f64;
    let split_agrees = (0..=SPLIT_CHECK_MISSES)
        .all(|m| policy.split(m).fetch == ft_model::plan::fetch_count(f, m));
    Ok(PeerAnswer {
        verdict: verdict.into(),
        fraction: f,
        fraction_q16: q,
        ratio_verdict: legacy::recommend(cpu, pcie, threshold).name().into(),
        split_agrees,
    })
}

fn peer_cmd(profile: &Path, threshold: f64, field: Option<&str>, json: bool) -> Result<()> {
    let p = Profile::read(profile).with_context(|| format!("--profile {}", profile.display()))?;
    let b = p
        .bench_bw
        .with_context(|| format!("{}: the profile has no bench bandwidths (probe a geometry whose second size is the bench's)", profile.display()))?;
    let a = peer(
        b.cpu_moe_gbs,
        b.pcie_gather_gbs,
        b.cpu_moe_overlap_gbs,
        b.pcie_gather_overlap_gbs,
        threshold,
    )?;
    match field {
        Some("verdict") => outln!("{}", a.verdict)?,
        Some("fraction") => outln!("{}", a.fraction)?,
        Some("ratio-verdict") => outln!("{}", a.ratio_verdict)?,
        Some(other) => bail!("--field {other}: one of verdict, fraction, ratio-verdict"),
        None if json => outln!("{}", serde_json::to_string_pretty(&a)?)?,
        None => outln!(
            "ferrox-core: {} at fetch fraction {:.5} (Q16 {}); ratio rule: {}; splits agree with ft's planner: {}",
            a.verdict, a.fraction, a.fraction_q16, a.ratio_verdict, a.split_agrees
        )?,
    }
    Ok(())
}

/// A profile refitted from its own samples (`ft_model::perf::fit`), the fit starting from
/// its parameters: what `ft probe` of this build would have fitted to the same measurements.
/// The key, the samples and the bench bandwidths are kept.
pub fn refit(p: &Profile) -> Result<Profile> {
    use ft_model::perf::fit::{fit, FitConfig};
    let report = fit(&p.samples, &p.params, &FitConfig::default())?;
    // Parameters the samples do not determine keep the uncertainty the profile gave them.
    let model = report.model(&p.covariance, "ft validate refit");
    let mut q = p.clone();
    q.params = model.params;
    q.covariance = model.covariance;
    q.dof = model.dof;
    q.fit = Some(report);
    Ok(q)
}

// ------------------------------------------------------------------------------ collect

/// One row of the grid CSV: one strategy run of one configuration with its prediction.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct GridRow {
    /// Configuration id.
    pub config: String,
    /// Expert geometry (model preset).
    pub geometry: String,
    /// Layers run.
    pub layers: usize,
    /// Bytes of one routed expert.
    pub expert_bytes: u64,
    /// Cache residency.
    pub residency: f64,
    /// Cache slots.
    pub cache_slots: usize,
    /// Streams.
    pub streams: usize,
    /// CPU threads.
    pub threads: usize,
    /// Context, tokens.
    pub context: usize,
    /// offload, hybrid (the model's fraction), hybrid-legacy (the rule's fraction) or cpu.
    pub strategy: String,
    /// Fetch fraction the run planned with.
    pub fetch_fraction: f64,
    /// Measured decode tok/s of all streams.
    pub measured_tok_s: f64,
    /// Measured expert-level miss rate.
    pub measured_miss_rate: f64,
    /// Predicted decode tok/s of all streams.
    pub predicted_tok_s: f64,
    /// Lower end of its interval (empty where the model gives none).
    pub predicted_tok_s_lo: Option<f64>,
    /// Upper end of its interval.
    pub predicted_tok_s_hi: Option<f64>,
    /// Predicted miss rate (empty where the model gives none).
    pub predicted_miss_rate: Option<f64>,
    /// `|predicted - measured| / measured`.
    pub abs_rel_error: f64,
    /// The legacy bench's CPU-MoE GB/s (alone), from the geometry's profile.
    pub bench_cpu_moe_gbs: f64,
    /// The legacy bench's PCIe-gather GB/s (alone).
    pub bench_pcie_gather_gbs: f64,
    /// CPU-MoE GB/s while the gather runs.
    pub bench_cpu_moe_overlap_gbs: Option<f64>,
    /// PCIe-gather GB/s while the CPU kernel runs.
    pub bench_pcie_gather_overlap_gbs: Option<f64>,
    /// The rule's threshold.
    pub threshold: f64,
    /// Decode tok/s of all streams the discrete-event simulator gives the same run with the
    /// same fitted profile (`ft validate simulate`; empty before it ran).
    #[serde(default)]
    pub simulated_tok_s: Option<f64>,
    /// Share of the machine's CPU time the hypervisor stole while the run decoded (the run
    /// report's `host_steal_fraction`; empty where the report has none).
    #[serde(default)]
    pub host_steal: Option<f64>,
    /// The same-run STREAM read of the host bank with the run's threads, GB/s (the run
    /// report's `cpu.stream_read_gbs`: the machine's CPU ceiling while it ran; empty for
    /// offload and for reports before it existed).
    #[serde(default)]
    pub stream_read_gbs: Option<f64>,
    /// The same reading taken by the geometry's probe (`probes/<geometry>.json`'s
    /// `outcome.stream_read_gbs`), where the row ran at the probe's thread count (empty
    /// otherwise): `stream_read_gbs` over it is how far the machine's CPU ceiling moved
    /// between the probe the prediction rests on and the run.
    #[serde(default)]
    pub probe_stream_read_gbs: Option<f64>,
    /// How many times faster the CPU side ran in this run than in the probe: the run's CPU
    /// check (`cpu.cpu_check`, taken before each round) against the profile's check of the
    /// same work (`Profile::cpu_speed`); empty for offload, for another thread count than
    /// the probe checked, and for runs or profiles from before the check existed.
    #[serde(default)]
    pub cpu_speed: Option<f64>,
}

fn num(v: &serde_json::Value, path: &str) -> Option<f64> {
    value_at(v, path).and_then(serde_json::Value::as_f64)
}

fn read_json(path: &Path) -> Option<serde_json::Value> {
    let text = ft_model::limits::read_bounded(path, ft_model::limits::MAX_PROFILE_BYTES).ok()?;
    serde_json::from_str(&text).ok()
}

/// Read `dir/plan.csv`, every `runs/<config>-<strategy>.json` (`ft run --json`), every
/// `predictions/<config>.json` (`ft predict --json`) and `profiles/<geometry>.json`; the rows
/// and the runs that are missing or unreadable (a grid cut short).
pub fn collect(dir: &Path) -> Result<(Vec<GridRow>, Vec<String>)> {
    let plan: Vec<PlanRow> = read_rows(&dir.join("plan.csv"))?;
    let mut rows = Vec::new();
    let mut missing = Vec::new();
    let mut profiles: BTreeMap<String, Option<Profile>> = BTreeMap::new();
    // Each geometry's probe ceiling and the threads it read with.
    let mut probe_ceilings: BTreeMap<String, Option<(f64, usize)>> = BTreeMap::new();
    for p in &plan {
        let probe_ceiling = *probe_ceilings.entry(p.geometry.clone()).or_insert_with(|| {
            let probe = read_json(&dir.join(format!("probes/{}.json", p.geometry)))?;
            Some((
                num(&probe, "outcome.stream_read_gbs")?,
                num(&probe, "outcome.threads")? as usize,
            ))
        });
        let prof = profiles.entry(p.geometry.clone()).or_insert_with(|| {
            Profile::read(&dir.join(format!("profiles/{}.json", p.geometry))).ok()
        });
        let Some(prof) = prof.as_ref() else {
            missing.push(format!("profiles/{}.json", p.geometry));
            continue;
        };
        let Some(bench) = prof.bench_bw else {
            missing.push(format!(
                "profiles/{}.json has no bench bandwidths",
                p.geometry
            ));
            continue;
        };
        let pred_path = dir.join(format!("predictions/{}.json", p.config));
        let Some(pred) = read_json(&pred_path) else {
            missing.push(pred_path.display().to_string());
            continue;
        };
        let model = ModelSpec::preset(&p.geometry)?;
        for strategy in GRID_STRATEGIES {
            let run_path = dir.join(format!("runs/{}-{strategy}.json", p.config));
            let Some(run) = read_json(&run_path) else {
                missing.push(run_path.display().to_string());
                continue;
            };
            let (Some(measured), Some(miss), Some(f)) = (
                num(&run, "summary.tok_s_total"),
                num(&run, "summary.miss_rate"),
                num(&run, "fetch_fraction"),
            ) else {
                missing.push(format!("{} (no summary)", run_path.display()));
                continue;
            };
            let kind = match strategy {
                "hybrid-legacy" => None,
                s => Some(s.parse::<StrategyKind>()?),
            };
            let strat = kind.and_then(|k| {
                value_at(&pred, "prediction.strategies")
                    .and_then(serde_json::Value::as_array)
                    .and_then(|a| {
                        a.iter().find(|s| {
                            s.get("kind").and_then(serde_json::Value::as_str) == Some(k.name())
                        })
                    })
            });
            let (predicted, lo, hi, pmiss) = match strat {
                Some(s) => (
                    num(s, "tok_s_total"),
                    num(s, "tok_s_total_interval.0"),
                    num(s, "tok_s_total_interval.1"),
                    num(s, "miss_rate"),
                ),
                // The legacy fraction as the model evaluates it (one step of every stream).
                None => (
                    num(&pred, "prediction.legacy_fraction_step_us")
                        .map(|us| p.streams as f64 * 1e6 / us),
                    None,
                    None,
                    None,
                ),
            };
            let Some(predicted) = predicted else {
                missing.push(format!(
                    "{} (no prediction for {strategy})",
                    pred_path.display()
                ));
                continue;
            };
            rows.push(GridRow {
                config: p.config.clone(),
                geometry: p.geometry.clone(),
                layers: p.layers,
                expert_bytes: model.expert_bytes(),
                residency: p.residency,
                cache_slots: p.cache_slots,
                streams: p.streams,
                threads: p.threads,
                context: p.context,
                strategy: strategy.to_string(),
                fetch_fraction: f,
                measured_tok_s: measured,
                measured_miss_rate: miss,
                predicted_tok_s: predicted,
                predicted_tok_s_lo: lo,
                predicted_tok_s_hi: hi,
                predicted_miss_rate: pmiss,
                abs_rel_error: (predicted - measured).abs() / measured,
                bench_cpu_moe_gbs: bench.cpu_moe_gbs,
                bench_pcie_gather_gbs: bench.pcie_gather_gbs,
                bench_cpu_moe_overlap_gbs: bench.cpu_moe_overlap_gbs,
                bench_pcie_gather_overlap_gbs: bench.pcie_gather_overlap_gbs,
                threshold: legacy::DEFAULT_THRESHOLD,
                simulated_tok_s: None,
                host_steal: num(&run, "host_steal_fraction"),
                stream_read_gbs: num(&run, "cpu.stream_read_gbs"),
                probe_stream_read_gbs: probe_ceiling
                    .filter(|&(_, threads)| threads == p.threads)
                    .map(|(gbs, _)| gbs),
                cpu_speed: value_at(&run, "cpu.cpu_check")
                    .and_then(|c| serde_json::from_value::<CpuCheck>(c.clone()).ok())
                    .and_then(|check| prof.cpu_speed(&check).ok().flatten()),
            });
        }
    }
    Ok((rows, missing))
}

// ------------------------------------------------------------------------------ simulate

/// Simulate every row of a grid with the discrete-event simulator, on the host the row's
/// profile describes (`profiles/<geometry>-t<threads>.json`, the one its prediction used):
/// the row's strategy (hybrid at the fetch fraction the run planned with), its model at its
/// layers, cache slots, streams and context, `typical` routing and LRU as `ft run` uses, and
/// the run's measured and warm-up steps; a context that grows by one per step with no
/// request ending (the runtime's closed loop over one request per stream). Returns the rows
/// simulated; a row whose profile is missing keeps an empty column (and is logged).
pub fn simulate_rows(
    profiles: &Path,
    rows: &mut [GridRow],
    steps: u64,
    warmup: u64,
    seed: u64,
) -> Result<usize> {
    use ft_model::FetchFraction;
    use ft_sim::compare::{compare, CacheChoice, CompareConfig};
    let mut hosts: BTreeMap<String, Option<ft_sim::hosts::SimHost>> = BTreeMap::new();
    let mut done = 0;
    for r in rows.iter_mut() {
        let name = format!("{}-t{}", r.geometry, r.threads);
        let host = hosts.entry(name.clone()).or_insert_with(|| {
            let path = profiles.join(format!("{name}.json"));
            match ft_sim::hosts::resolve_host(&path.display().to_string()) {
                Ok(h) => Some(h),
                Err(e) => {
                    tracing::warn!("{}: {e}", path.display());
                    None
                }
            }
        });
        let Some(host) = host.as_ref() else {
            continue;
        };
        let model = ModelSpec::preset(&r.geometry)?.with_layers(r.layers);
        let kind: StrategyKind = match r.strategy.as_str() {
            "hybrid-legacy" => StrategyKind::Hybrid,
            s => s.parse()?,
        };
        let cfg = CompareConfig {
            streams: r.streams,
            strategies: vec![kind],
            fetch: FetchFraction::Fixed(r.fetch_fraction),
            cpu_layers: ft_model::CpuLayers::Auto,
            cache: CacheChoice::Slots {
                slots: r.cache_slots,
            },
            cache_options: Default::default(),
            routing: "typical".into(),
            warmup_steps: warmup,
            steps,
            seed,
            jitter: 0.0,
            workload: ft_sim::decode::Workload {
                prompt_tokens: r.context as u64,
                output_tokens: warmup + steps + 1,
                prefill_ns: 0,
            },
            threshold: legacy::DEFAULT_THRESHOLD,
        };
        let c = compare(host, &model, &cfg)
            .with_context(|| format!("simulating {} {}", r.config, r.strategy))?;
        r.simulated_tok_s = c.row(kind.name()).map(|row| row.sim.tok_s_total);
        done += usize::from(r.simulated_tok_s.is_some());
    }
    Ok(done)
}

fn write_csv<T: Serialize>(path: &Path, rows: &[T]) -> Result<()> {
    if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::create_dir_all(dir)?;
    }
    let mut w =
        csv::Writer::from_path(path).with_context(|| format!("writing {}", path.display()))?;
    for r in rows {
        w.serialize(r)?;
    }
    w.flush()?;
    Ok(())
}

fn read_rows<T: for<'de> Deserialize<'de>>(path: &Path) -> Result<Vec<T>> {
    let mut r =
        csv::Reader::from_path(path).with_context(|| format!("reading {}", path.display()))?;
    r.deserialize()
        .enumerate()
        .map(|(i, row)| row.with_context(|| format!("{}: row {}", path.display(), i + 2)))
        .collect()
}

/// Read a grid CSV; errors name the file and row; a non-positive measured rate is refused.
pub fn read_csv(path: &Path) -> Result<Vec<GridRow>> {
    let rows: Vec<GridRow> = read_rows(path)?;
    if rows.is_empty() {
        bail!("{}: no rows", path.display());
    }
    for (i, r) in rows.iter().enumerate() {
        if !(r.measured_tok_s > 0.0 && r.predicted_tok_s > 0.0) {
            bail!("{}: row {}: tok/s must be positive", path.display(), i + 2);
        }
        if !GRID_STRATEGIES.contains(&r.strategy.as_str()) {
            bail!(
                "{}: row {}: strategy '{}' is not one of {}",
                path.display(),
                i + 2,
                r.strategy,
                GRID_STRATEGIES.join(", ")
            );
        }
    }
    Ok(rows)
}

// ------------------------------------------------------------------------------ analyze

/// How one chooser did over the grid.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ChooserScore {
    /// Who chose (`model`, `ratio rule`, `ferrox-core`).
    pub chooser: String,
    /// Configurations scored (those where the chosen strategy was measured).
    pub configs: usize,
    /// Mean loss against the measured best: `1 - measured(choice) / measured(best)`.
    pub mean_loss: f64,
    /// Largest loss.
    pub max_loss: f64,
    /// Configurations where the choice was the measured best.
    pub best_picks: usize,
    /// Configurations where the choice was slower than the best by more than
    /// [`WRONG_PICK_GAP`].
    pub wrong_picks_over_gap: usize,
    /// How often each strategy was chosen.
    pub picks: BTreeMap<String, usize>,
}

/// Prediction errors of one group of rows.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ErrorStats {
    /// Rows.
    pub n: usize,
    /// Median absolute relative error.
    pub median: f64,
    /// 90th percentile absolute relative error.
    pub p90: f64,
    /// Mean signed relative error `(predicted - measured) / measured` (bias).
    pub mean_signed: f64,
    /// Largest absolute relative error.
    pub max: f64,
}

impl ErrorStats {
    /// The model's errors over `rows`.
    fn of(rows: &[&GridRow]) -> Option<ErrorStats> {
        Self::of_values(rows, |r| Some(r.predicted_tok_s))
    }

    /// The simulator's errors over the rows it simulated (`None` when it simulated none).
    fn of_simulated(rows: &[&GridRow]) -> Option<ErrorStats> {
        Self::of_values(rows, |r| r.simulated_tok_s)
    }

    /// Errors of the estimate `value` gives each row against its measured tok/s (rows
    /// without an estimate left out).
    fn of_values(rows: &[&GridRow], value: impl Fn(&GridRow) -> Option<f64>) -> Option<ErrorStats> {
        use statrs::statistics::{Data, OrderStatistics, Statistics};
        let signed: Vec<f64> = rows
            .iter()
            .filter_map(|r| value(r).map(|v| (v - r.measured_tok_s) / r.measured_tok_s))
            .collect();
        if signed.is_empty() {
            return None;
        }
        let abs: Vec<f64> = signed.iter().map(|x| x.abs()).collect();
        let mut d = Data::new(abs.clone());
        Some(ErrorStats {
            n: abs.len(),
            median: d.median(),
            p90: d.percentile(90),
            mean_signed: signed.mean(),
            max: abs.iter().copied().fold(0.0, f64::max),
        })
    }
}

/// One configuration's outcome.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ConfigOutcome {
    /// Configuration id.
    pub config: String,
    /// Geometry.
    pub geometry: String,
    /// Streams.
    pub streams: usize,
    /// The measured best strategy and its tok/s.
    pub best: String,
    /// Its measured tok/s.
    pub best_tok_s: f64,
    /// The model's choice (best predicted of offload, hybrid, cpu).
    pub model: String,
    /// The ratio rule's choice.
    pub ratio: String,
    /// ferrox-core's choice.
    pub ferrox: String,
    /// Losses of the three choices (absent where the chosen run is missing).
    pub model_loss: Option<f64>,
    /// See `model_loss`.
    pub ratio_loss: Option<f64>,
    /// See `model_loss`.
    pub ferrox_loss: Option<f64>,
}

/// The analysis of a grid.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Summary {
    /// Rows read.
    pub rows: usize,
    /// Configurations.
    pub configs: usize,
    /// Errors over every row.
    pub errors: ErrorStats,
    /// Errors per strategy.
    pub errors_by_strategy: BTreeMap<String, ErrorStats>,
    /// Errors per geometry.
    pub errors_by_geometry: BTreeMap<String, ErrorStats>,
    /// Errors per CPU thread count.
    pub errors_by_threads: BTreeMap<String, ErrorStats>,
    /// Errors per context length.
    pub errors_by_context: BTreeMap<String, ErrorStats>,
    /// Errors per thread count and strategy (the model's CPU terms scale with threads, and a
    /// bias of one strategy at one count is what a thread law gets wrong).
    pub errors_by_threads_and_strategy: BTreeMap<String, ErrorStats>,
    /// Errors over the configurations none of whose runs the hypervisor stole more than
    /// [`STEAL_NOTABLE_FRACTION`] of the CPU time from (absent where no row records steal).
    /// The targets are judged on every row all the same.
    pub errors_without_steal: Option<ErrorStats>,
    /// The configurations left out of `errors_without_steal`.
    pub stolen_configs: Vec<String>,
    /// The machine's CPU ceiling over the grid's runs: the same-run STREAM reads of the rows
    /// that recorded one, GB/s (absent where none did). Its spread is how far the machine
    /// itself moved while the grid ran.
    pub stream_read_gbs: Option<Spread>,
    /// Over the rows that recorded both readings: each run's ceiling over its probe's
    /// (`stream_read_gbs / probe_stream_read_gbs`), and the correlation of the rows'
    /// signed prediction errors with it (a model that is right up to the machine's drift
    /// errs high where the ratio is low).
    pub ceiling_drift: Option<CeilingDrift>,
    /// The same over the rows with a CPU speed (`cpu_speed`: the run's CPU check against the
    /// profile's): the CPU side's own speed, which the STREAM read only stands for.
    #[serde(default)]
    pub cpu_speed_drift: Option<CeilingDrift>,
    /// How often the measured tok/s fell inside the predicted interval (`ft predict`'s, 95%
    /// by default), over every row that has one (`all`) and per strategy: a model that knows
    /// its uncertainty covers about its confidence; empty where no row has an interval.
    pub interval_coverage: BTreeMap<String, Coverage>,
    /// The simulator's errors against the runtime over every simulated row (absent before
    /// `ft validate simulate`), and per strategy.
    pub sim_errors: Option<ErrorStats>,
    /// The simulator's errors per strategy.
    pub sim_errors_by_strategy: BTreeMap<String, ErrorStats>,
    /// The model, the ratio rule and ferrox-core as choosers.
    pub choosers: Vec<ChooserScore>,
    /// True when ferrox-core's split agreed with ft's planner at every geometry's fraction.
    pub ferrox_split_agrees: bool,
    /// Per configuration.
    pub outcomes: Vec<ConfigOutcome>,
    /// The targets.
    pub targets: BTreeMap<String, f64>,
    /// True when every target is met.
    pub targets_met: bool,
    /// The targets missed, in words.
    pub missed: Vec<String>,
}

/// The spread of a set of measurements.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct Spread {
    /// How many.
    pub n: usize,
    /// Their median.
    pub median: f64,
    /// The least.
    pub min: f64,
    /// The greatest.
    pub max: f64,
}

impl Spread {
    /// The spread of `v`; `None` when empty.
    pub fn of(v: &[f64]) -> Option<Self> {
        use statrs::statistics::{Data, OrderStatistics, Statistics};
        if v.is_empty() {
            return None;
        }
        Some(Spread {
            n: v.len(),
            median: Data::new(v.to_vec()).median(),
            min: v.min(),
            max: v.max(),
        })
    }
}

/// How many measurements fell inside their predicted interval (see
/// [`Summary::interval_coverage`]).
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct Coverage {
    /// Rows with an interval.
    pub n: usize,
    /// Of those, the rows whose measured tok/s is inside it.
    pub inside: usize,
}

impl Coverage {
    /// The coverage of `rows` (those without an interval do not count); `None` when none has
    /// one.
    pub fn of(rows: &[&GridRow]) -> Option<Self> {
        let with: Vec<(&GridRow, f64, f64)> = rows
            .iter()
            .filter_map(|r| Some((*r, r.predicted_tok_s_lo?, r.predicted_tok_s_hi?)))
            .collect();
        if with.is_empty() {
            return None;
        }
        Some(Coverage {
            n: with.len(),
            inside: with
                .iter()
                .filter(|(r, lo, hi)| (*lo..=*hi).contains(&r.measured_tok_s))
                .count(),
        })
    }

    /// The share inside, 0 to 1.
    pub fn share(&self) -> f64 {
        self.inside as f64 / self.n.max(1) as f64
    }
}

/// How the CPU ceiling moved between the probes and the runs (see [`Summary::ceiling_drift`]).
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct CeilingDrift {
    /// Run ceiling over probe ceiling, per row.
    pub ratio: Spread,
    /// Pearson correlation of the signed error (predicted over measured, minus 1) with the
    /// ratio; absent below 3 rows or without spread.
    pub error_correlation: Option<f64>,
}

impl CeilingDrift {
    /// "median M, LO to HI; correlation with the signed error C", for the summary table.
    fn describe(&self) -> String {
        format!(
            "median {:.3}, {:.3} to {:.3}; correlation with the signed error {}",
            self.ratio.median,
            self.ratio.min,
            self.ratio.max,
            self.error_correlation
                .map_or("n/a".to_string(), |c| format!("{c:+.2}"))
        )
    }

    /// Over the rows `ratio` gives a positive number for.
    fn of(rows: &[GridRow], ratio: impl Fn(&GridRow) -> Option<f64>) -> Option<Self> {
        use statrs::statistics::Statistics;
        let pairs: Vec<(f64, f64)> = rows
            .iter()
            .filter_map(|r| {
                let q = ratio(r)?;
                (q > 0.0 && r.measured_tok_s > 0.0)
                    .then(|| (q, r.predicted_tok_s / r.measured_tok_s - 1.0))
            })
            .collect();
        let ratios: Vec<f64> = pairs.iter().map(|p| p.0).collect();
        let errors: Vec<f64> = pairs.iter().map(|p| p.1).collect();
        let ratio = Spread::of(&ratios)?;
        let error_correlation = (pairs.len() >= 3)
            .then(|| {
                let c = ratios.iter().covariance(errors.iter());
                let d = ratios.iter().std_dev() * errors.iter().std_dev();
                (d > 0.0).then(|| c / d)
            })
            .flatten();
        Some(CeilingDrift {
            ratio,
            error_correlation,
        })
    }
}

/// The row a choice names: `offload`, `cpu`, or for hybrid the fraction it would run at
/// (the model's `hybrid`, the legacy rules' `hybrid-legacy`).
fn chosen_row<'a>(rows: &[&'a GridRow], strategy: &str) -> Option<&'a GridRow> {
    rows.iter().copied().find(|r| r.strategy == strategy)
}

/// `stats` of the rows grouped by `key`, the groups it gives nothing for left out.
fn group_rows<T>(
    rows: &[GridRow],
    key: &dyn Fn(&GridRow) -> String,
    stats: &dyn Fn(&[&GridRow]) -> Option<T>,
) -> BTreeMap<String, T> {
    let mut m: BTreeMap<String, Vec<&GridRow>> = BTreeMap::new();
    for r in rows {
        m.entry(key(r)).or_default().push(r);
    }
    m.into_iter()
        .filter_map(|(k, v)| stats(&v).map(|e| (k, e)))
        .collect()
}

/// Analyse grid rows (see the module docs); needs only the CSV.
pub fn analyze(rows: &[GridRow]) -> Result<Summary> {
    let mut by_config: BTreeMap<&str, Vec<&GridRow>> = BTreeMap::new();
    for r in rows {
        by_config.entry(&r.config).or_default().push(r);
    }
    let mut outcomes = Vec::new();
    let mut split_agrees = true;
    for (config, rs) in &by_config {
        let first = rs[0];
        let best = rs
            .iter()
            .copied()
            .max_by(|a, b| a.measured_tok_s.total_cmp(&b.measured_tok_s))
            .expect("a config has rows");
        let model_pick = rs
            .iter()
            .copied()
            .filter(|r| r.strategy != "hybrid-legacy")
            .max_by(|a, b| a.predicted_tok_s.total_cmp(&b.predicted_tok_s))
            .map(|r| r.strategy.clone())
            .unwrap_or_else(|| "offload".into());
        let ratio_pick = match legacy::recommend(
            first.bench_cpu_moe_gbs,
            first.bench_pcie_gather_gbs,
            first.threshold,
        ) {
            LegacyVerdict::Offload => "offload",
            LegacyVerdict::Hybrid => "hybrid-legacy",
        };
        let a = peer(
            first.bench_cpu_moe_gbs,
            first.bench_pcie_gather_gbs,
            first.bench_cpu_moe_overlap_gbs,
            first.bench_pcie_gather_overlap_gbs,
            first.threshold,
        )?;
        split_agrees &= a.split_agrees;
        if let Some(h) = chosen_row(rs, "hybrid-legacy") {
            // The run of the rules' hybrid must have used ferrox-core's fraction.
            if fraction_q16(h.fetch_fraction) != a.fraction_q16 {
                tracing::warn!(
                    config,
                    run = h.fetch_fraction,
                    ferrox = a.fraction,
                    "hybrid-legacy ran at another fraction than ferrox-core's"
                );
            }
        }
        let ferrox_pick = match a.verdict.as_str() {
            "hybrid" => "hybrid-legacy",
            "cpu" => "cpu",
            _ => "offload",
        };
        let loss =
            |s: &str| chosen_row(rs, s).map(|r| 1.0 - r.measured_tok_s / best.measured_tok_s);
        outcomes.push(ConfigOutcome {
            config: config.to_string(),
            geometry: first.geometry.clone(),
            streams: first.streams,
            best: best.strategy.clone(),
            best_tok_s: best.measured_tok_s,
            model_loss: loss(&model_pick),
            ratio_loss: loss(ratio_pick),
            ferrox_loss: loss(ferrox_pick),
            model: model_pick,
            ratio: ratio_pick.into(),
            ferrox: ferrox_pick.into(),
        });
    }
    let score =
        |name: &str, pick: &dyn Fn(&ConfigOutcome) -> (&str, Option<f64>)| -> ChooserScore {
            let mut picks = BTreeMap::new();
            let mut losses = Vec::new();
            let mut best_picks = 0;
            for o in &outcomes {
                let (s, l) = pick(o);
                *picks.entry(s.to_string()).or_insert(0) += 1;
                if let Some(l) = l {
                    losses.push(l);
                    if s == o.best || l <= 0.0 {
                        best_picks += 1;
                    }
                }
            }
            ChooserScore {
                chooser: name.into(),
                configs: losses.len(),
                mean_loss: if losses.is_empty() {
                    0.0
                } else {
                    losses.iter().sum::<f64>() / losses.len() as f64
                },
                max_loss: losses.iter().copied().fold(0.0, f64::max),
                best_picks,
                wrong_picks_over_gap: losses.iter().filter(|&&l| l > WRONG_PICK_GAP).count(),
                picks,
            }
        };
    let choosers = vec![
        score("model", &|o| (o.model.as_str(), o.model_loss)),
        score("ratio rule", &|o| (o.ratio.as_str(), o.ratio_loss)),
        score("ferrox-core", &|o| (o.ferrox.as_str(), o.ferrox_loss)),
    ];
    let all: Vec<&GridRow> = rows.iter().collect();
    let errors = ErrorStats::of(&all).context("no rows")?;
    // Errors per group of rows (`stats`: the model's or the simulator's).
    let group = |key: &dyn Fn(&GridRow) -> String,
                 stats: &dyn Fn(&[&GridRow]) -> Option<ErrorStats>| {
        group_rows(rows, key, stats)
    };
    let mut missed = Vec::new();
    if errors.median > TARGET_MEDIAN_ERR {
        missed.push(format!(
            "median error {:.1}% > {:.0}%",
            100.0 * errors.median,
            100.0 * TARGET_MEDIAN_ERR
        ));
    }
    if errors.p90 > TARGET_P90_ERR {
        missed.push(format!(
            "p90 error {:.1}% > {:.0}%",
            100.0 * errors.p90,
            100.0 * TARGET_P90_ERR
        ));
    }
    let m = &choosers[0];
    if m.mean_loss > TARGET_MEAN_LOSS {
        missed.push(format!(
            "model mean loss {:.2}% > {:.0}%",
            100.0 * m.mean_loss,
            100.0 * TARGET_MEAN_LOSS
        ));
    }
    if m.wrong_picks_over_gap > 0 {
        missed.push(format!(
            "the model picked a strategy slower than the best by more than {:.0}% in {} configuration(s)",
            100.0 * WRONG_PICK_GAP,
            m.wrong_picks_over_gap
        ));
    }
    let sim_errors = ErrorStats::of_simulated(&all);
    let sim_errors_by_strategy = group(&|r| r.strategy.clone(), &ErrorStats::of_simulated);
    if let Some(e) = &sim_errors {
        if e.median > TARGET_SIM_MEDIAN_ERR {
            missed.push(format!(
                "simulator median error {:.1}% > {:.0}%",
                100.0 * e.median,
                100.0 * TARGET_SIM_MEDIAN_ERR
            ));
        }
    }
    let targets = BTreeMap::from([
        (
            "sim_median_abs_rel_error".to_string(),
            TARGET_SIM_MEDIAN_ERR,
        ),
        ("median_abs_rel_error".to_string(), TARGET_MEDIAN_ERR),
        ("p90_abs_rel_error".to_string(), TARGET_P90_ERR),
        ("model_mean_loss".to_string(), TARGET_MEAN_LOSS),
        ("wrong_pick_gap".to_string(), WRONG_PICK_GAP),
    ]);
    let stolen_configs: Vec<String> = by_config
        .iter()
        .filter(|(_, rs)| {
            rs.iter()
                .any(|r| r.host_steal.is_some_and(|f| f > STEAL_NOTABLE_FRACTION))
        })
        .map(|(c, _)| c.to_string())
        .collect();
    let errors_without_steal = if rows.iter().any(|r| r.host_steal.is_some()) {
        let clean: Vec<&GridRow> = rows
            .iter()
            .filter(|r| !stolen_configs.contains(&r.config))
            .collect();
        ErrorStats::of(&clean)
    } else {
        None
    };
    let readings: Vec<f64> = rows.iter().filter_map(|r| r.stream_read_gbs).collect();
    let mut interval_coverage = group_rows(rows, &|r| r.strategy.clone(), &Coverage::of);
    if let Some(c) = Coverage::of(&rows.iter().collect::<Vec<_>>()) {
        interval_coverage.insert("all".into(), c);
    }
    Ok(Summary {
        interval_coverage,
        stream_read_gbs: Spread::of(&readings),
        ceiling_drift: CeilingDrift::of(rows, |r| {
            let probe = r.probe_stream_read_gbs.filter(|&p| p > 0.0)?;
            Some(r.stream_read_gbs? / probe)
        }),
        cpu_speed_drift: CeilingDrift::of(rows, |r| r.cpu_speed),
        rows: rows.len(),
        configs: outcomes.len(),
        errors,
        errors_by_strategy: group(&|r| r.strategy.clone(), &ErrorStats::of),
        errors_by_geometry: group(&|r| r.geometry.clone(), &ErrorStats::of),
        errors_by_threads: group(&|r| format!("{} threads", r.threads), &ErrorStats::of),
        errors_by_context: group(&|r| format!("context {}", r.context), &ErrorStats::of),
        errors_by_threads_and_strategy: group(
            &|r| format!("{} threads, {}", r.threads, r.strategy),
            &ErrorStats::of,
        ),
        errors_without_steal,
        stolen_configs,
        sim_errors,
        sim_errors_by_strategy,
        choosers,
        ferrox_split_agrees: split_agrees,
        outcomes,
        targets,
        targets_met: missed.is_empty(),
        missed,
    })
}

fn write_summary(o: &mut impl Write, s: &Summary) -> Result<()> {
    writeln!(o, "{} rows over {} configurations", s.rows, s.configs)?;
    writeln!(o)?;
    writeln!(
        o,
        "{:<28} {:>5} {:>9} {:>9} {:>9} {:>9}",
        "prediction error", "n", "median", "p90", "bias", "max"
    )?;
    let line = |o: &mut dyn Write, name: &str, e: &ErrorStats| {
        writeln!(
            o,
            "{:<28} {:>5} {:>8.2}% {:>8.2}% {:>8.2}% {:>8.2}%",
            name,
            e.n,
            100.0 * e.median,
            100.0 * e.p90,
            100.0 * e.mean_signed,
            100.0 * e.max
        )
    };
    line(o, "all", &s.errors)?;
    for (k, e) in s
        .errors_by_strategy
        .iter()
        .chain(&s.errors_by_geometry)
        .chain(&s.errors_by_threads)
        .chain(&s.errors_by_context)
        .chain(&s.errors_by_threads_and_strategy)
    {
        line(o, k, e)?;
    }
    if let Some(e) = &s.errors_without_steal {
        line(o, "without host steal", e)?;
        if !s.stolen_configs.is_empty() {
            writeln!(
                o,
                "  (left out: {}, whose runs lost more than {:.0}% of the machine's CPU time to the hypervisor)",
                s.stolen_configs.join(", "),
                100.0 * STEAL_NOTABLE_FRACTION
            )?;
        }
    }
    if let Some(r) = &s.stream_read_gbs {
        writeln!(
            o,
            "CPU ceiling during the runs (same-run STREAM read of the bank, {} rows): median {:.1} GB/s, {:.1} to {:.1}",
            r.n, r.median, r.min, r.max
        )?;
    }
    if let Some(d) = &s.ceiling_drift {
        writeln!(
            o,
            "  against the probes' (rows at the probe's threads, {}): run over probe {}",
            d.ratio.n,
            d.describe()
        )?;
    }
    if let Some(d) = &s.cpu_speed_drift {
        writeln!(
            o,
            "CPU speed of the runs against the probes (the CPU check, {} rows): {}",
            d.ratio.n,
            d.describe()
        )?;
    }
    if let Some(all) = s.interval_coverage.get("all") {
        writeln!(
            o,
            "measured inside the predicted interval: {} of {} rows ({:.0}%; {})",
            all.inside,
            all.n,
            100.0 * all.share(),
            s.interval_coverage
                .iter()
                .filter(|(k, _)| k.as_str() != "all")
                .map(|(k, c)| format!("{k} {:.0}%", 100.0 * c.share()))
                .collect::<Vec<_>>()
                .join(", ")
        )?;
    }
    if let Some(e) = &s.sim_errors {
        writeln!(o)?;
        writeln!(
            o,
            "{:<28} {:>5} {:>9} {:>9} {:>9} {:>9}",
            "simulator error", "n", "median", "p90", "bias", "max"
        )?;
        line(o, "all", e)?;
        for (k, e) in &s.sim_errors_by_strategy {
            line(o, k, e)?;
        }
    }
    writeln!(o)?;
    writeln!(
        o,
        "{:<12} {:>7} {:>10} {:>9} {:>6} {:>10}  picks",
        "chooser", "configs", "mean loss", "max loss", "best", "wrong >5%"
    )?;
    for c in &s.choosers {
        let picks: Vec<String> = c.picks.iter().map(|(k, v)| format!("{k} {v}")).collect();
        writeln!(
            o,
            "{:<12} {:>7} {:>9.2}% {:>8.2}% {:>6} {:>10}  {}",
            c.chooser,
            c.configs,
            100.0 * c.mean_loss,
            100.0 * c.max_loss,
            c.best_picks,
            c.wrong_picks_over_gap,
            picks.join(", ")
        )?;
    }
    writeln!(
        o,
        "ferrox-core's split equals ft's planner at the rules' fraction: {}",
        s.ferrox_split_agrees
    )?;
    writeln!(o)?;
    if s.targets_met {
        writeln!(
            o,
            "targets met (median <= 5%, p90 <= 10%, mean loss <= 2%, no wrong pick over 5%{})",
            if s.sim_errors.is_some() {
                "; simulator median <= 10%"
            } else {
                ""
            }
        )?;
    } else {
        writeln!(o, "targets missed: {}", s.missed.join("; "))?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_grid_covers_every_level_of_every_factor() {
        let g = grid(false).unwrap();
        assert_eq!(g.len(), 3 * 4 * GRID_PER_CELL);
        for &(name, _) in &GRID_GEOMETRIES {
            let mine: Vec<&PlanRow> = g.iter().filter(|r| r.geometry == name).collect();
            let mut combos: Vec<(u64, usize, usize)> = mine
                .iter()
                .map(|r| ((r.residency * 100.0) as u64, r.threads, r.context))
                .collect();
            combos.sort_unstable();
            combos.dedup();
            assert_eq!(
                combos.len(),
                12,
                "{name}: every (residency, threads, context) once at least"
            );
            for s in GRID_STREAMS {
                assert_eq!(
                    mine.iter().filter(|r| r.streams == s).count(),
                    GRID_PER_CELL
                );
            }
        }
        // The first round covers every (geometry, streams) pair.
        let first: std::collections::BTreeSet<(String, usize)> = g
            .iter()
            .take(12)
            .map(|r| (r.geometry.clone(), r.streams))
            .collect();
        assert_eq!(first.len(), 12);
        let ids: std::collections::BTreeSet<&str> = g.iter().map(|r| r.config.as_str()).collect();
        assert_eq!(ids.len(), g.len());
        assert_eq!(grid(true).unwrap().len(), 12);
        // Residency becomes slots of the run's experts.
        let r = g
            .iter()
            .find(|r| r.geometry == "deepseek-v4-flash" && r.residency == 0.05)
            .unwrap();
        assert_eq!(r.cache_slots, 13);
    }

    #[test]
    fn dotted_paths_reach_into_objects_and_arrays() {
        let v = serde_json::json!({"a": {"b": [1, {"c": "x"}]}});
        assert_eq!(value_at(&v, "a.b.0"), Some(&serde_json::json!(1)));
        assert_eq!(value_at(&v, "a.b.1.c"), Some(&serde_json::json!("x")));
        assert!(value_at(&v, "a.z").is_none());
        assert!(value_at(&v, "a.b.9").is_none());
    }

    /// The field report's pair through ferrox-core: the ratio rule (standalone) says
    /// offload, ferrox-core's entry (contended pair preferred) says what its pair says, and
    /// the fraction is the contended pair's, Q16-rounded.
    #[test]
    fn the_peer_is_ferrox_cores_rule_on_the_same_numbers() {
        let a = peer(46.12, 24.25, Some(33.4), Some(12.8), 2.0).unwrap();
        assert_eq!(a.ratio_verdict, "offload");
        assert_eq!(a.verdict, "hybrid", "33.4 > 2 x 12.8 on the contended pair");
        let f = 12.8 / (12.8 + 33.4);
        assert!((a.fraction - f).abs() <= 0.5 / 65536.0 + 1e-12);
        assert!(a.split_agrees);
        let b = peer(46.12, 24.25, None, None, 2.0).unwrap();
        assert_eq!(b.verdict, "offload");
        assert!((b.fraction - (24.25f64 / 46.12).min(1.0)).abs() < 1e-4);
        assert!(peer(-1.0, 2.0, None, None, 2.0).is_err());
    }

    /// A profile of the field report's host spec (its prior, no samples) for
    /// qwen3.8-flash-next, and that model.
    fn field_profile() -> (Profile, ModelSpec) {
        let model = ModelSpec::preset("qwen3.8-flash-next").unwrap();
        let host = ft_model::host::HostSpec::field_report();
        (Profile::of_host_spec(&host, &model).unwrap(), model)
    }

    #[test]
    fn the_simulator_leg_fills_the_rows_whose_profile_exists() {
        let (p, model) = field_profile();
        let dir = tempfile::tempdir().unwrap();
        let t = p.params.cpu_threads;
        std::fs::write(
            dir.path().join(format!("qwen3.8-flash-next-t{t}.json")),
            serde_json::to_vec(&p).unwrap(),
        )
        .unwrap();
        let row = |strategy: &str, f: f64, threads: u32| GridRow {
            config: "c00".into(),
            geometry: "qwen3.8-flash-next".into(),
            layers: 2,
            expert_bytes: model.expert_bytes(),
            residency: 0.15,
            cache_slots: 154,
            streams: 2,
            threads: threads as usize,
            context: 1024,
            strategy: strategy.into(),
            fetch_fraction: f,
            measured_tok_s: 100.0,
            measured_miss_rate: 0.5,
            predicted_tok_s: 100.0,
            predicted_tok_s_lo: None,
            predicted_tok_s_hi: None,
            predicted_miss_rate: None,
            abs_rel_error: 0.0,
            bench_cpu_moe_gbs: 46.12,
            bench_pcie_gather_gbs: 24.25,
            bench_cpu_moe_overlap_gbs: None,
            bench_pcie_gather_overlap_gbs: None,
            threshold: 2.0,
            simulated_tok_s: None,
            host_steal: None,
            stream_read_gbs: None,
            probe_stream_read_gbs: None,
            cpu_speed: None,
        };
        let mut rows = vec![
            row("offload", 1.0, t),
            row("hybrid", 0.4, t),
            row("cpu", 0.0, t),
            row("offload", 1.0, t + 1), // no profile at this thread count
        ];
        let n = simulate_rows(dir.path(), &mut rows, 4, 2, 0).unwrap();
        assert_eq!(n, 3);
        for r in &rows[..3] {
            let v = r.simulated_tok_s.expect("simulated");
            assert!(v.is_finite() && v > 0.0, "{}: {v}", r.strategy);
        }
        assert!(rows[3].simulated_tok_s.is_none());
        // On the field report's host hybrid at 0.4 beats offload, as the simulator says
        // elsewhere; and the analysis reports the simulator's errors.
        assert!(rows[1].simulated_tok_s > rows[0].simulated_tok_s);
        let s = analyze(&rows).unwrap();
        assert_eq!(s.sim_errors.as_ref().unwrap().n, 3);
    }
}
