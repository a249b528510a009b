//! `ft bench bw`: the reference engine's measurement, rebuilt so it can be compared.
//!
//! The legacy rule is `cpu_moe_GBs / pcie_gather_GBs > threshold -> hybrid`; this command
//! measures both numbers (`ft_runtime::bench_bw`: the CPU step and the real gather path, each
//! isolated and both at once, with STREAM read and a linear H2D copy as ceilings) at the
//! engine's tuning geometry (`bench-nvfp4`, 7.97 MB experts) and at the served model's
//! (`--model`, default `qwen3.8-flash-next`, 2.77 MB experts), and prints them.
//!
//! Saving: `--save PATH` writes the `BwReport` JSON; it carries the served model's row as
//! `profile_bench_bw`, ready for `Profile::bench_bw`.

use std::io::Write;

use anyhow::{Context, Result};

use ft_kernels::{ActivationPath, CpuExperts};
use ft_model::perf::legacy::DEFAULT_THRESHOLD;
use ft_model::ModelSpec;
use ft_runtime::bench_bw::{measure_bw, BwConfig, BwReport};
use ft_runtime::device::{Device, DeviceKind, DeviceSpec};
use ft_runtime::gather::GatherMethod;

/// Arguments of `ft bench bw`.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// The served model (preset or TOML file); the tuning geometry bench-nvfp4 is always run too.
    #[arg(long, default_value = "qwen3.8-flash-next")]
    model: String,
    /// Device: cuda or host (the host-emulated device: the gather is a memcpy).
    #[arg(long, default_value = "cuda")]
    device: String,
    /// Verdict threshold on cpu/pcie.
    #[arg(long, default_value_t = DEFAULT_THRESHOLD)]
    threshold: f64,
    /// Experts per step (a layer of misses at batch 1); default: the model's top-k.
    #[arg(long)]
    experts: Option<usize>,
    /// CPU threads (0: all).
    #[arg(long, default_value_t = 0)]
    threads: usize,
    /// CPU activation path: int8 (W4A8, the reference engine's) or f32.
    #[arg(long, default_value = "int8")]
    act: String,
    /// Distinct expert bytes in the bank, MiB (rotated through so reads are cold).
    #[arg(long, default_value_t = 1024)]
    bank_mib: u64,
    /// Timed repetitions of each isolated measurement.
    #[arg(long, default_value_t = 20)]
    reps: usize,
    /// Duration of the contended window, ms.
    #[arg(long, default_value_t = 500)]
    contended_ms: u64,
    /// Print JSON instead of the table.
    #[arg(long)]
    json: bool,
    /// Write the JSON report to this file.
    #[arg(long)]
    save: Option<std::path::PathBuf>,
}

/// Run `ft bench bw`.
pub fn run(args: Args) -> Result<()> {
    let cfg = BwConfig {
        experts: args.experts,
        threshold: args.threshold,
        bank_mib: args.bank_mib,
        reps: args.reps,
        contended_ms: args.contended_ms,
    };
    cfg.validate()?;
    let act: ActivationPath = args.act.parse().context("--act")?;
    let kind: DeviceKind = args.device.parse().context("--device")?;
    let served = ModelSpec::resolve(&args.model).context("--model")?;
    let tuning = ModelSpec::preset("bench-nvfp4")?;
    let device = Device::open(&DeviceSpec::of_kind(kind)).context("opening the device")?;
    let mut cpu = CpuExperts::new(args.threads)?;
    tracing::info!(device = %device.info().name, threads = cpu.threads(), simd = %cpu.simd(), "ft bench bw");
    let report = measure_bw(&device, &mut cpu, &[&tuning, &served], act, &cfg)?;
    if let Some(path) = &args.save {
        let text = serde_json::to_string_pretty(&report)?;
        std::fs::write(path, text).with_context(|| format!("writing {}", path.display()))?;
    }
    let mut out = std::io::stdout().lock();
    if args.json {
        serde_json::to_writer_pretty(&mut out, &report)?;
        writeln!(out)?;
    } else {
        print_table(&mut out, &report)?;
    }
    Ok(())
}

fn print_table(out: &mut impl Write, r: &BwReport) -> std::io::Result<()> {
    writeln!(
        out,
        "device: {} | CPU: {} threads, {} | threshold {:.2}",
        r.device.label(),
        r.threads,
        r.simd,
        r.threshold
    )?;
    writeln!(
        out,
        "{:<20} {:<6} {:>9} {:>8} {:>12} {:>15} {:>7} {:>8} {:>11}",
        "model",
        "format",
        "expert MB",
        "experts",
        "CPU-MoE GB/s",
        "PCIe-gather GB/s",
        "ratio",
        "verdict",
        "fetch frac"
    )?;
    for row in &r.rows {
        writeln!(
            out,
            "{:<20} {:<6} {:>9.2} {:>8} {:>12.2} {:>15.2} {:>7.3} {:>8} {:>11.3}",
            row.model,
            row.format,
            row.expert_bytes as f64 / 1e6,
            row.experts,
            row.cpu_moe_gbs,
            row.pcie_gather_gbs,
            row.ratio,
            row.verdict,
            row.fetch_fraction
        )?;
    }
    writeln!(out)?;
    writeln!(
        out,
        "{:<20} {:>14} {:>14} {:>12} {:>12} {:>12} {:>12}",
        "model",
        "CPU contended",
        "PCIe contended",
        "STREAM read",
        "linear H2D",
        "copy-engine",
        "zero-copy"
    )?;
    for row in &r.rows {
        writeln!(
            out,
            "{:<20} {:>14.2} {:>14.2} {:>12.2} {:>12.2} {:>12.2} {:>12.2}",
            row.model,
            row.cpu_moe_contended_gbs,
            row.pcie_gather_contended_gbs,
            row.stream_read_gbs,
            row.linear_h2d_gbs,
            row.gather.gbps(GatherMethod::CopyEngine),
            row.gather.gbps(GatherMethod::ZeroCopy)
        )?;
    }
    writeln!(out, "(GB/s = 1e9 B/s; gather columns: both mechanisms, isolated; the faster is the PCIe-gather figure)")
}
