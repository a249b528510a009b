//! `ft experiment list|run`: find and run the reproducible experiments under `experiments/`.
//!
//! Each experiment is a folder `experiments/<name>/` with an `experiment.toml` (its question,
//! its one-line finding, whether it needs a GPU, its script), a script that reproduces it from
//! scratch with `ft` commands, a README, and its committed results. This command only finds
//! and runs them; the science is in the folders.

use anyhow::{bail, Context, Result};
use serde::{Deserialize, Serialize};
use std::path::{Path, PathBuf};

/// Arguments of `ft experiment`.
#[derive(Debug, clap::Args)]
pub struct Args {
    #[command(subcommand)]
    command: ExperimentCommand,
    /// The experiments folder (default: `experiments/` in the current directory or above it,
    /// else the one this binary was built from).
    #[arg(long, global = true)]
    dir: Option<PathBuf>,
}

#[derive(Debug, clap::Subcommand)]
enum ExperimentCommand {
    /// List the experiments with their one-line findings.
    List {
        /// Print JSON instead of a table.
        #[arg(long)]
        json: bool,
    },
    /// Run one experiment's script, writing its results into `--out`.
    Run {
        /// The experiment's folder name.
        name: String,
        /// Where the results go (default: a fresh folder `results/<name>` under the
        /// current directory; the committed results are never overwritten by default).
        #[arg(long)]
        out: Option<PathBuf>,
        /// Reduced size (what CI runs to check the committed conclusions still hold).
        #[arg(long)]
        quick: bool,
    },
}

/// `experiment.toml`: what an experiment is and how to run it.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ExperimentConfig {
    /// The folder name.
    pub name: String,
    /// The question the experiment answers.
    pub question: String,
    /// The one-line finding, as committed.
    pub finding: String,
    /// True when it needs an NVIDIA GPU (it is skipped cleanly without one).
    #[serde(default)]
    pub needs_gpu: bool,
    /// The script, relative to the folder; it takes the output folder as its one argument.
    #[serde(default = "default_script")]
    pub script: String,
}

fn default_script() -> String {
    "run.sh".to_string()
}

/// Find the experiments folder: the flag, else `experiments/` here or in a parent, else the
/// source tree the binary was built from.
fn experiments_dir(flag: Option<PathBuf>) -> Result<PathBuf> {
    if let Some(dir) = flag {
        if !dir.is_dir() {
            bail!("--dir {}: not a folder", dir.display());
        }
        return Ok(dir);
    }
    let cwd = std::env::current_dir().context("reading the current directory")?;
    for dir in cwd.ancestors() {
        let candidate = dir.join("experiments");
        if candidate.join("README.md").is_file() {
            return Ok(candidate);
        }
    }
    let built = Path::new(env!("CARGO_MANIFEST_DIR")).join("experiments");
    if built.is_dir() {
        return Ok(built);
    }
    bail!("no experiments/ folder here or above; pass --dir")
}

/// Every experiment under `dir`, sorted by name.
pub fn load_all(dir: &Path) -> Result<Vec<ExperimentConfig>> {
    let mut out = Vec::new();
    for entry in std::fs::read_dir(dir).with_context(|| format!("reading {}", dir.display()))? {
        let path = entry?.path().join("experiment.toml");
        if !path.is_file() {
            continue;
        }
        let text = std::fs::read_to_string(&path)
            .with_context(|| format!("reading {}", path.display()))?;
        let config: ExperimentConfig =
            toml::from_str(&text).with_context(|| format!("parsing {}", path.display()))?;
        let folder = path
            .parent()
            .and_then(|p| p.file_name())
            .unwrap_or_default();
        if folder != config.name.as_str() {
            bail!(
                "{}: name '{}' differs from its folder '{}'",
                path.display(),
                config.name,
                folder.to_string_lossy()
            );
        }
        out.push(config);
    }
    out.sort_by(|a, b| a.name.cmp(&b.name));
    Ok(out)
}

/// Run `ft experiment`.
pub fn run(args: Args) -> Result<()> {
    let dir = experiments_dir(args.dir)?;
    let all = load_all(&dir)?;
    match args.command {
        ExperimentCommand::List { json } => {
            if json {
                outln!("{}", serde_json::to_string_pretty(&all)?)?;
            } else {
                outln!("{:<16} {:<4} finding", "experiment", "gpu")?;
                for e in &all {
                    let gpu = if e.needs_gpu { "yes" } else { "no" };
                    outln!("{:<16} {:<4} {}", e.name, gpu, e.finding)?;
                }
            }
            Ok(())
        }
        ExperimentCommand::Run { name, out, quick } => {
            let Some(config) = all.iter().find(|e| e.name == name) else {
                let known: Vec<&str> = all.iter().map(|e| e.name.as_str()).collect();
                bail!("unknown experiment '{name}'; known: {}", known.join(", "));
            };
            if config.needs_gpu && !ft_runtime::cuda_available() {
                outln!(
                    "skipped: experiment '{name}' needs an NVIDIA GPU and none is usable here ({})",
                    ft_runtime::cuda_driver_status()
                )?;
                return Ok(());
            }
            let out = out.unwrap_or_else(|| PathBuf::from("results").join(&name));
            std::fs::create_dir_all(&out)
                .with_context(|| format!("creating the output folder {}", out.display()))?;
            let script = dir.join(&config.name).join(&config.script);
            let exe = std::env::current_exe().context("locating the ft binary")?;
            tracing::info!(experiment = %name, out = %out.display(), quick, "running");
            let status = std::process::Command::new("bash")
                .arg(&script)
                .arg(&out)
                .env("FT", &exe)
                .env("FT_QUICK", if quick { "1" } else { "0" })
                .status()
                .with_context(|| format!("starting {}", script.display()))?;
            if !status.success() {
                bail!(
                    "experiment '{name}' failed: {} exited with {status}",
                    script.display()
                );
            }
            outln!("experiment '{name}' done; results in {}", out.display())?;
            Ok(())
        }
    }
}
