//! `ft model`: the models `--model` takes, and import from the files a user has.
//!
//! `ft model list` prints the built-in presets; `ft model show MODEL` any model `--model`
//! takes (a preset, a model TOML, a Hugging Face `config.json`, a GGUF file) with its
//! expert bytes; `ft model import FILE` turns a `config.json` or GGUF header into the model
//! TOML `--model` reads, with comments naming every value it did not read directly.

use anyhow::{Context, Result};
use std::io::Write;
use std::path::PathBuf;

use ft_model::import::{import_path, ImportOptions};
use ft_model::{ExpertFormat, ModelSpec};

/// Arguments of `ft model`.
#[derive(Debug, clap::Args)]
pub struct Args {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, clap::Subcommand)]
enum Command {
    /// List the built-in model presets.
    List {
        /// Print JSON instead of the table.
        #[arg(long)]
        json: bool,
    },
    /// Show a model (a preset, a model TOML, a config.json or a GGUF file): its geometry,
    /// format and sizes.
    Show {
        /// The model, as `--model` takes it.
        model: String,
        /// Print JSON instead of the table.
        #[arg(long)]
        json: bool,
    },
    /// Import a Hugging Face config.json (or its directory) or a GGUF file as a model TOML.
    Import {
        /// The config.json, a directory holding one, or a .gguf file (only its header is read).
        file: PathBuf,
        /// The expert format to model instead of the file's (e.g. q4_k, nvfp4); for a
        /// config.json, the format the experts will run in.
        #[arg(long)]
        format: Option<String>,
        /// The model's name instead of the file's.
        #[arg(long)]
        name: Option<String>,
        /// Write the TOML here instead of stdout.
        #[arg(long)]
        out: Option<PathBuf>,
        /// Print JSON (the model, its source and notes) instead of the TOML.
        #[arg(long)]
        json: bool,
    },
}

/// Run `ft model`.
pub fn run(args: Args) -> Result<()> {
    let mut out = std::io::stdout().lock();
    match args.command {
        Command::List { json } => {
            let models: Vec<ModelSpec> = ModelSpec::preset_names()
                .into_iter()
                .map(ModelSpec::preset)
                .collect::<Result<_, _>>()?;
            if json {
                let rows: Vec<_> = models.iter().map(summary).collect();
                serde_json::to_writer_pretty(&mut out, &rows)?;
                writeln!(out)?;
            } else {
                print_table(&mut out, &models)?;
            }
        }
        Command::Show { model, json } => {
            let m = ModelSpec::resolve(&model).with_context(|| format!("model {model}"))?;
            if json {
                serde_json::to_writer_pretty(&mut out, &summary(&m))?;
                writeln!(out)?;
            } else {
                print_table(&mut out, std::slice::from_ref(&m))?;
                let d = m.dense();
                writeln!(
                    out,
                    "dense part per MoE layer: {:.2} MB of weights, {} B of KV cache per token of context",
                    d.weight_bytes_per_layer as f64 / 1e6,
                    d.kv_bytes_per_token
                )?;
                if let Some(c) = ft_model::import::cpu_rate_caveat(m.format, None) {
                    writeln!(out, "note: {c}")?;
                }
            }
        }
        Command::Import {
            file,
            format,
            name,
            out: path,
            json,
        } => {
            let format = format
                .map(|f| f.parse::<ExpertFormat>())
                .transpose()
                .context("--format")?;
            let imported = import_path(&file, &ImportOptions { format, name })
                .with_context(|| format!("importing {}", file.display()))?;
            for n in &imported.notes {
                tracing::warn!("{}: {n}", imported.path);
            }
            let text = if json {
                let mut doc = serde_json::to_value(&imported)?;
                doc["expert_bytes"] = imported.spec.expert_bytes().into();
                serde_json::to_string_pretty(&doc)? + "\n"
            } else {
                imported.to_commented_toml()
            };
            match path {
                Some(p) => {
                    std::fs::write(&p, text).with_context(|| format!("--out {}", p.display()))?
                }
                None => out.write_all(text.as_bytes())?,
            }
        }
    }
    Ok(())
}

/// A model's row: its spec and the sizes that follow.
fn summary(m: &ModelSpec) -> serde_json::Value {
    serde_json::json!({
        "model": m,
        "expert_bytes": m.expert_bytes(),
        "total_expert_bytes": m.geometry.total_expert_bytes(m.format),
        "has_kernel": m.format.has_kernel(),
        "dense": m.dense(),
    })
}

fn print_table(out: &mut impl Write, models: &[ModelSpec]) -> std::io::Result<()> {
    writeln!(
        out,
        "{:<24} {:>7} {:>7} {:>8} {:>5} {:>7} {:>6} {:<8} {:>10} {:>11}",
        "model",
        "hidden",
        "inter",
        "experts",
        "top_k",
        "layers",
        "shared",
        "format",
        "expert MB",
        "experts GB"
    )?;
    for m in models {
        let g = &m.geometry;
        writeln!(
            out,
            "{:<24} {:>7} {:>7} {:>8} {:>5} {:>7} {:>6} {:<8} {:>10.3} {:>11.2}",
            m.name,
            g.hidden,
            g.intermediate,
            g.experts,
            g.top_k,
            g.moe_layers,
            g.shared_experts,
            m.format.name(),
            m.expert_bytes() as f64 / 1e6,
            g.total_expert_bytes(m.format) as f64 / 1e9
        )?;
    }
    Ok(())
}
