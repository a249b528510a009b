//! `ft host`: the host files `--host` takes, written for this machine and explained.
//!
//! `ft host init` writes a commented host TOML for the machine it runs on (GPU from
//! `nvidia-smi`, PCIe generation and width from sysfs, CPU from `/proc/cpuinfo` and
//! `/sys`, memory channels from `dmidecode` where readable, STREAM read measured here),
//! leaving out what ft-model derives, so the file is a starting point to edit for another
//! machine. `ft host show HOST` prints every value of a host with its unit and whether the
//! file gave it or it was derived (and how), and the plausibility warnings.
//! `ft host list` names the shipped presets.

use anyhow::{Context, Result};
use std::fmt::Write as _;
use std::io::Write;
use std::path::PathBuf;

use ft_model::host::{gpu_table_entry, HostSpec};

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
            let text = init_toml(stream_mib)?;
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
                ft_sim::hosts::resolve_spec(&host).with_context(|| format!("host {host}"))?;
            let rows = values(&spec);
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
            let hosts: Vec<HostSpec> = ft_sim::hosts::preset_names()
                .into_iter()
                .map(ft_sim::hosts::preset)
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

/// One value of a host, for `ft host show`.
#[derive(Debug, serde::Serialize)]
struct ValueRow {
    key: &'static str,
    value: Option<f64>,
    unit: &'static str,
    /// True when the file left it out and it was derived.
    derived: bool,
    /// `given`, `default`, or `derived: how`.
    source: String,
}

fn format_value(v: Option<f64>) -> String {
    match v {
        None => "-".to_string(),
        Some(v) if v.fract() == 0.0 && v.abs() < 1e9 => format!("{v:.0}"),
        Some(v) => format!("{v:.3}"),
    }
}

/// Every value the model reads from a host, with its source.
fn values(h: &HostSpec) -> Vec<ValueRow> {
    let e = &h.engine;
    let dram_derived = e.dram_gbs.is_none();
    let threads_engine = e.cpu_threads.is_none();
    let rows: Vec<(&'static str, Option<f64>, &'static str, Option<String>)> = vec![
        ("gpu.count", Some(h.gpu.count as f64), "count", None),
        ("gpu.memory_gib", Some(h.gpu.memory_gib), "GiB", None),
        ("gpu.hbm_gbs", Some(h.gpu.hbm_gbs), "GB/s", None),
        ("pcie.h2d_gbs", Some(h.pcie.h2d_gbs), "GB/s", None),
        ("pcie.d2h_gbs", Some(h.pcie.d2h_gbs), "GB/s", None),
        ("pcie.latency_us", Some(h.pcie.latency_us), "us", None),
        ("pcie.gather_gbs", h.pcie.gather_gbs, "GB/s", None),
        ("cpu.cores", Some(h.cpu.cores as f64), "count", None),
        ("cpu.threads", Some(h.cpu.threads as f64), "count", None),
        (
            "cpu.numa_nodes",
            Some(h.cpu.numa_nodes as f64),
            "count",
            None,
        ),
        (
            "cpu.stream_read_gbs",
            Some(h.cpu.stream_read_gbs),
            "GB/s",
            None,
        ),
        ("cpu.moe_gbs", h.cpu.moe_gbs, "GB/s", None),
        (
            "engine.cpu_threads",
            Some(h.cpu_threads() as f64),
            "count",
            threads_engine.then(|| "derived: cpu.cores".to_string()),
        ),
        (
            "engine.dram_gbs",
            Some(h.dram_gbs()),
            "GB/s",
            dram_derived.then(|| {
                format!(
                    "derived: cpu.stream_read_gbs x {:.3} (DEFAULT_DRAM_OVER_STREAM)",
                    ft_model::host::DEFAULT_DRAM_OVER_STREAM
                )
            }),
        ),
    ];
    rows.into_iter()
        .map(|(key, value, unit, engine_derived)| {
            let d = h.derived().iter().find(|d| d.key == key);
            let (derived, source) = match (d, engine_derived) {
                (Some(d), _) => (true, format!("derived: {}", d.how)),
                (None, Some(how)) => (true, how),
                (None, None) if value.is_none() => (false, "not given".to_string()),
                (None, None) => (false, "given".to_string()),
            };
            ValueRow {
                key,
                value,
                unit,
                derived,
                source,
            }
        })
        .collect()
}

/// What `nvidia-smi` says about the first GPU.
struct GpuProbe {
    name: String,
    count: u32,
    memory_mib: f64,
}

fn nvidia_smi() -> Option<GpuProbe> {
    let out = std::process::Command::new("nvidia-smi")
        .args([
            "--query-gpu=name,memory.total",
            "--format=csv,noheader,nounits",
        ])
        .output()
        .ok()
        .filter(|o| o.status.success())?;
    let text = String::from_utf8_lossy(&out.stdout);
    let lines: Vec<&str> = text.lines().filter(|l| !l.trim().is_empty()).collect();
    let (name, mem) = lines.first()?.rsplit_once(',')?;
    Some(GpuProbe {
        name: name.trim().to_string(),
        count: lines.len() as u32,
        memory_mib: mem.trim().parse().ok()?,
    })
}

/// The PCIe generation and width of the first NVIDIA display or 3D controller in sysfs:
/// the generation from `max_link_speed` (the device's and slot's best, not the idle
/// downclocked `current_link_speed`), the width from `current_link_width`.
fn sysfs_pcie() -> Option<(u32, u32, String)> {
    /// PCI vendor id of NVIDIA.
    const NVIDIA_VENDOR: &str = "0x10de";
    let dir = std::fs::read_dir("/sys/bus/pci/devices").ok()?;
    for entry in dir.flatten() {
        let p = entry.path();
        let read = |f: &str| std::fs::read_to_string(p.join(f)).map(|s| s.trim().to_string());
        let (Ok(vendor), Ok(class)) = (read("vendor"), read("class")) else {
            continue;
        };
        // 0x0300xx VGA, 0x0302xx 3D controller.
        if vendor != NVIDIA_VENDOR || !(class.starts_with("0x0300") || class.starts_with("0x0302"))
        {
            continue;
        }
        let speed = read("max_link_speed").ok()?;
        let width: u32 = read("current_link_width").ok()?.parse().ok()?;
        let gts: f64 = speed.split_whitespace().next()?.parse().ok()?;
        let generation = match gts as u32 {
            2 => 1,
            5 => 2,
            8 => 3,
            16 => 4,
            32 => 5,
            64 => 6,
            _ => return None,
        };
        return Some((generation, width, format!("{speed}, x{width}")));
    }
    None
}

/// Populated DIMMs and their configured speed from `dmidecode -t memory` (needs root; `None`
/// where it cannot run).
fn dmidecode_memory() -> Option<(u32, u32)> {
    let out = std::process::Command::new("dmidecode")
        .args(["-t", "memory"])
        .output()
        .ok()
        .filter(|o| o.status.success())?;
    let text = String::from_utf8_lossy(&out.stdout);
    let mut dimms = 0u32;
    let mut mts = 0u32;
    for line in text.lines().map(str::trim) {
        if let Some(size) = line.strip_prefix("Size:") {
            let size = size.trim();
            if !size.starts_with("No Module") && !size.starts_with("0") {
                dimms += 1;
            }
        }
        if let Some(speed) = line
            .strip_prefix("Configured Memory Speed:")
            .or_else(|| line.strip_prefix("Configured Clock Speed:"))
        {
            if let Some(v) = speed.split_whitespace().next().and_then(|v| v.parse().ok()) {
                mts = mts.max(v);
            }
        }
    }
    (dimms > 0 && mts > 0).then_some((dimms, mts))
}

/// The commented host TOML of this machine.
fn init_toml(stream_mib: usize) -> Result<String> {
    let cpu = ft_runtime::probe::CpuTopology::detect();
    let gpu = nvidia_smi();
    let pcie = sysfs_pcie();
    let memory = dmidecode_memory();
    let stream = {
        let k = ft_kernels::CpuExperts::new(0)?;
        let bytes = stream_mib.max(16) << 20;
        let buf = ft_kernels::stream::alloc_touched(k.pool(), bytes);
        /// Reads of the buffer; the median is kept.
        const STREAM_REPEATS: usize = 5;
        let r = ft_kernels::stream::stream_read(k.pool(), &buf, STREAM_REPEATS);
        (r.median_gbs(), r.threads)
    };

    let mut t = String::new();
    let w = &mut t;
    writeln!(
        w,
        "# Host file written by `ft host init` for the machine it ran on. Edit it for another"
    )?;
    writeln!(
        w,
        "# machine: docs/host-file.md lists every key, its unit and its default. Keys left out"
    )?;
    writeln!(
        w,
        "# (or commented out) are derived when the file is read; `ft host show FILE` prints"
    )?;
    writeln!(
        w,
        "# every value and says which were derived, and how. `ft probe` measures the rest."
    )?;
    writeln!(
        w,
        "description = \"written by ft host init: {}\"",
        match &gpu {
            Some(g) => format!("{} x {} + {}", g.count, g.name, cpu.model),
            None => format!(
                "no NVIDIA GPU found, the field report's RTX 4090 assumed + {}",
                cpu.model
            ),
        }
        .replace('"', "'")
    )?;
    writeln!(w)?;
    writeln!(w, "[gpu]")?;
    match &gpu {
        Some(g) => {
            writeln!(w, "name = \"{}\"  # nvidia-smi", g.name.replace('"', "'"))?;
            writeln!(w, "count = {}  # GPUs nvidia-smi lists", g.count)?;
            writeln!(
                w,
                "memory_gib = {:.1}  # nvidia-smi: {} MiB",
                g.memory_mib / 1024.0,
                g.memory_mib
            )?;
            match gpu_table_entry(&g.name) {
                Some(row) => writeln!(
                    w,
                    "# hbm_gbs = {}  # derived from the name ({}'s published memory bandwidth)",
                    row.hbm_gbs, row.name
                )?,
                None => {
                    tracing::warn!(
                        "{} is not in ft's GPU table: hbm_gbs is a placeholder to edit",
                        g.name
                    );
                    writeln!(
                        w,
                        "hbm_gbs = 1000.0  # PLACEHOLDER: {} is not in ft's GPU table; edit from its spec sheet",
                        g.name
                    )?
                }
            }
        }
        None => {
            writeln!(
                w,
                "# No NVIDIA GPU was found here (nvidia-smi did not run): the field report's"
            )?;
            writeln!(
                w,
                "# RTX 4090 on PCIe 4.0 x16 stands in. Edit [gpu] and [pcie] for your GPU."
            )?;
            writeln!(w, "name = \"NVIDIA GeForce RTX 4090\"")?;
            writeln!(w, "count = 1")?;
            writeln!(
                w,
                "# memory_gib and hbm_gbs: derived from the name (ft's GPU table)"
            )?;
        }
    }
    writeln!(w)?;
    writeln!(w, "[pcie]")?;
    match (&gpu, pcie) {
        (Some(_), Some((generation, lanes, raw))) => {
            writeln!(
                w,
                "generation = {generation}  # sysfs max_link_speed and current_link_width: {raw}"
            )?;
            writeln!(w, "lanes = {lanes}")?;
        }
        (Some(_), None) => {
            writeln!(
                w,
                "# The GPU's link was not readable in sysfs: PCIe 4.0 x16 assumed; edit."
            )?;
            writeln!(w, "generation = 4")?;
            writeln!(w, "lanes = 16")?;
        }
        (None, _) => {
            writeln!(w, "generation = 4")?;
            writeln!(w, "lanes = 16")?;
        }
    }
    writeln!(
        w,
        "# h2d_gbs = ...    # derived: lanes x lane rate x 0.85; `ft probe` measures it"
    )?;
    writeln!(w, "# d2h_gbs = ...    # derived: h2d_gbs")?;
    writeln!(w, "# latency_us = 2.0 # derived: an estimate")?;
    writeln!(w)?;
    writeln!(w, "[cpu]")?;
    writeln!(
        w,
        "name = \"{}\"  # /proc/cpuinfo",
        cpu.model.replace('"', "'")
    )?;
    writeln!(w, "cores = {}  # distinct (socket, core) pairs", cpu.cores)?;
    writeln!(
        w,
        "threads = {}  # hardware threads online",
        cpu.threads.max(cpu.cores)
    )?;
    writeln!(
        w,
        "numa_nodes = {}  # /sys/devices/system/node",
        cpu.numa_nodes
    )?;
    match memory {
        Some((dimms, mts)) => {
            writeln!(w, "memory_channels = {dimms}  # populated DIMMs (dmidecode); two DIMMs per channel count once: edit")?;
            writeln!(
                w,
                "memory_mts = {mts}  # dmidecode: configured memory speed"
            )?;
        }
        None => {
            writeln!(w, "# memory_channels = ?  # not readable here (`sudo dmidecode -t memory`): populated channels")?;
            writeln!(w, "# memory_mts = ?       # and their MT/s (DDR5-4800 is 4800); plausibility checks use them")?;
        }
    }
    writeln!(
        w,
        "stream_read_gbs = {:.1}  # measured by ft host init: {} threads reading {} MiB, median of 5",
        stream.0,
        stream.1,
        stream_mib.max(16)
    )?;
    writeln!(
        w,
        "# moe_gbs = ...  # the CPU-MoE GB/s your engine's bench reports, at engine.tuning_model"
    )?;
    Ok(t)
}
