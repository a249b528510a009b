//! `ft host`: the host files `--host` takes, written for this machine and explained.
//!
//! `ft host init` writes a commented host TOML for the machine it runs on (GPU from
//! `nvidia-smi`, PCIe generation and width from sysfs, CPU from `/proc/cpuinfo` and
//! `/sys`, memory channels from `dmidecode` where readable, STREAM read measured here),
//! leaving out what ft-model derives, so the file is a starting point to edit for another
//! machine. `ft host show HOST` prints every value of a host with its unit and whether the
//! file gave it or it was derived (and how), and the plausibility warnings.
//! `ft host list` names the shipped presets. The machine is read by
//! `ft_runtime::machine`, the file written by `ft_model::hosts::init`, the values and their
//! sources listed by `ft_model::hosts::show`.

use anyhow::{Context, Result};
use std::io::Write;
use std::path::PathBuf;

use ft_model::host::HostSpec;

/// Arguments of `ft host`.
#[derive(Debug, clap::Args)]
pub struct Args {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, clap::Subcommand)]
enum Command {
    /// Write a commented host TOML for this machine (stdout, or --out).
    Init {
        /// Write it here instead of stdout (refused if the file exists, unless --force).
        #[arg(long)]
        out: Option<PathBuf>,
        /// Overwrite --out.
        #[arg(long)]
        force: bool,
        /// Bytes of the buffer STREAM read is measured on, in MiB.
        #[arg(long, default_value_t = 256)]
        stream_mib: usize,
    },
    /// Show every value of a host (a preset or a TOML file), its unit and its source.
    Show {
        /// The host, as `--host` takes it.
        host: String,
        /// Print JSON instead of the table.
        #[arg(long)]
        json: bool,
    },
    /// List the shipped host presets.
    List {
        /// Print JSON instead of the table.
        #[arg(long)]
        json: bool,
    },
}

/// Run `ft host`.
pub fn run(args: Args) -> Result<()> {
    let mut out = std::io::stdout().lock();
    match args.command {
        Command::Init {
            out: path,
            force,
            stream_mib,
        } => {
            if let Some(p) = &path {
                if p.exists() && !force {
                    anyhow::bail!(
                        "--out {}: the file exists (--force overwrites it)",
                        p.display()
                    );
                }
            }
            let facts =
                ft_runtime::machine::read_machine(stream_mib).context("reading this machine")?;
            let text = ft_model::hosts::init::host_toml(&facts);
            // What it wrote must read back: a host file that fails is no starting point.
            HostSpec::from_toml_str(&text, "ft host init's output")
                .context("ft host init wrote a host file that does not read back")?;
            match path {
                Some(p) => {
                    std::fs::write(&p, &text).with_context(|| format!("--out {}", p.display()))?;
                    eprintln!(
                        "wrote {}; `ft host show {}` explains it",
                        p.display(),
                        p.display()
                    );
                }
                None => out.write_all(text.as_bytes())?,
            }
        }
        Command::Show { host, json } => {
            let spec =
                ft_model::hosts::resolve_spec(&host).with_context(|| format!("host {host}"))?;
            let rows = ft_model::hosts::show::host_values(&spec);
            let warnings = spec.warnings();
            if json {
                let doc = serde_json::json!({
                    "host": spec,
                    "values": rows,
                    "warnings": warnings,
                });
                serde_json::to_writer_pretty(&mut out, &doc)?;
                writeln!(out)?;
            } else {
                writeln!(out, "host {}: {}", spec.name, spec.description)?;
                writeln!(out, "{:<22} {:>12} {:<6} source", "key", "value", "unit")?;
                for r in &rows {
                    writeln!(
                        out,
                        "{:<22} {:>12} {:<6} {}",
                        r.key,
                        format_value(r.value),
                        r.unit,
                        r.source
                    )?;
                }
                for w in &warnings {
                    writeln!(out, "warning: {w}")?;
                }
            }
        }
        Command::List { json } => {
            let hosts: Vec<HostSpec> = ft_model::hosts::preset_names()
                .into_iter()
                .map(ft_model::hosts::preset)
                .collect::<Result<_, _>>()?;
            if json {
                serde_json::to_writer_pretty(&mut out, &hosts)?;
                writeln!(out)?;
            } else {
                for h in hosts {
                    writeln!(out, "{:<26} {}", h.name, h.description)?;
                }
            }
        }
    }
    Ok(())
}

fn format_value(v: Option<f64>) -> String {
    match v {
        None => "-".to_string(),
        Some(v) if v.fract() == 0.0 && v.abs() < 1e9 => format!("{v:.0}"),
        Some(v) => format!("{v:.3}"),
    }
}
