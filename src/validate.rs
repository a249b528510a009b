//! `ft validate`: the acceptance of the performance model against measured runs, and the
//! small helpers the GPU experiment (`experiments/validate-h200/run.sh`) needs between its
//! `ft probe`, `ft predict` and `ft run` calls. The work is `ft_validate`'s; this file holds
//! the arguments and the printing (the analysis's table in `validate/table.rs`).
//!
//! - `plan`: the grid of configurations and the layer-reduced model files.
//! - `get`: one value of a JSON document by a JSON pointer (`/a/b/0`; the script has no `jq`).
//! - `model-file`: a preset's geometry with fewer layers as a model TOML (the experiments'
//!   runtime halves describe their `ft run --layers N` to the simulator with it).
//! - `peer`: ferrox-core's verdict and fetch fraction fed a profile's bench bandwidths.
//! - `retarget`: a profile re-expressed at another serving thread count.
//! - `refit`: a profile refitted from its own samples with this build's fitting.
//! - `collect`, `simulate`, `analyze`: the grid's rows, the simulator's column, the
//!   statistics.

use anyhow::{bail, Context, Result};
use std::io::Write;
use std::path::{Path, PathBuf};

mod table;

use ft_model::perf::legacy;
use ft_model::profile::Profile;
use ft_model::ModelSpec;
use ft_validate::grid::write_plan;
use ft_validate::peer::peer;
use ft_validate::refit;
use ft_validate::rows::{collect, read_csv, write_csv};
use ft_validate::simulate::simulate_rows;
use ft_validate::stats::analyze;

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
    /// Print the value at a JSON pointer of a JSON file (`/a/b/0/c`, RFC 6901); strings
    /// unquoted.
    Get {
        /// The JSON file.
        file: PathBuf,
        /// The pointer (`/` before each object key or array index).
        pointer: String,
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
        Command::Plan { out, quick } => {
            let rows = write_plan(&out, quick)?;
            outln!("{}", rows.len())?;
            Ok(())
        }
        Command::ModelFile { model, layers, out } => {
            let m = ModelSpec::resolve(&model).with_context(|| format!("--model {model}"))?;
            let full = m.geometry.moe_layers;
            let mut m = m.first_layers(layers)?;
            if layers < full {
                m.name = format!("{}-{layers}-layers", m.name);
            }
            Ok(ft_model::profile::write_atomic(
                &out,
                m.to_toml().as_bytes(),
            )?)
        }
        Command::Get { file, pointer } => {
            let v = ft_validate::json::value_at(&file, &pointer)?;
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
            Ok(ft_model::profile::write_atomic(
                &out,
                &serde_json::to_vec_pretty(&q)?,
            )?)
        }
        Command::Refit { profile, out } => {
            let p = Profile::read(&profile)
                .with_context(|| format!("--profile {}", profile.display()))?;
            let q = refit(&p).with_context(|| format!("refitting {}", profile.display()))?;
            Ok(ft_model::profile::write_atomic(
                &out,
                &serde_json::to_vec_pretty(&q)?,
            )?)
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
                ft_model::profile::write_atomic(&path, &serde_json::to_vec_pretty(&s)?)?;
            }
            let mut o = std::io::stdout().lock();
            if json {
                serde_json::to_writer_pretty(&mut o, &s)?;
                writeln!(o)?;
            } else {
                table::write_summary(&mut o, &s)?;
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
