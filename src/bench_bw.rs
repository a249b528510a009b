//! `ft bench bw`: the reference engine's measurement, rebuilt so it can be compared.
//!
//! The legacy rule is `cpu_moe_GBs / pcie_gather_GBs > threshold -> hybrid`. This bench
//! measures both numbers the way the rule means them, on the real paths of this runtime:
//! - **CPU-MoE GB/s**: the CPU expert step (`ft-kernels`, the hybrid CPU share) at batch 1
//!   (one token, routed to `n` experts, one token per expert), expert bytes per second;
//! - **PCIe-gather GB/s**: the real gather path (host bank to cache slots) of a whole layer
//!   of misses (`n` experts), by both mechanisms, the faster one kept (as the engine does);
//! - each **isolated** and **both at once** (contended: the CPU kernel and the gather loop
//!   run together for the same window), plus two ceilings measured in the same run: STREAM
//!   read with the CPU kernel's threads, and one linear pinned H2D copy of the same bytes;
//! - at the engine's tuning geometry (`bench-nvfp4`, 7.97 MB experts) and at the served
//!   model's (`--model`, default `qwen3.8-flash-next`, 2.77 MB experts).
//!
//! Every call reads cold bytes: the bank holds `--bank-mib` of distinct experts and calls
//! rotate through it. The verdict is `ratio > --threshold` (default 2.0) -> hybrid; the
//! fetch fraction is `pcie / (pcie + cpu)` from the contended pair.
//!
//! Saving: `--save PATH` writes the [`BwReport`] JSON. The profile (`ft_model::profile`)
//! holds a `BenchBw` per profile; [`BwRow::bench_bw`] converts the served model's row into
//! it, and the report carries it as `profile_bench_bw`, ready for `Profile::bench_bw`.

use std::io::Write;
use std::sync::{Arc, Barrier};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use serde::Serialize;

use ft_kernels::stream::{alloc_touched, median, stream_read};
use ft_kernels::{ActivationPath, CpuExperts, ExpertWork};
use ft_model::perf::legacy::BenchBw;
use ft_model::{ExpertId, ModelSpec};
use ft_runtime::bank::HostBank;
use ft_runtime::device::{Device, DeviceInfo, DeviceKind, DeviceSpec, HostDeviceConfig};
use ft_runtime::gather::{self, GatherMethod, GatherPoint};
use ft_runtime::slots::SlotPool;

/// The reference engine's threshold on the ratio.
const DEFAULT_THRESHOLD: f64 = 2.0;

/// Seed of the bank's synthetic experts (any fixed value: the bytes only need to be valid).
const BANK_SEED: u64 = 0x00B4_BE7C;

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

/// One geometry's measurements.
#[derive(Debug, Clone, Serialize)]
pub struct BwRow {
    /// Model name.
    pub model: String,
    /// Expert format.
    pub format: String,
    /// Bytes of one expert.
    pub expert_bytes: u64,
    /// Experts per step.
    pub experts: usize,
    /// CPU activation path.
    pub act: String,
    /// CPU-MoE alone, GB/s (median).
    pub cpu_moe_gbs: f64,
    /// PCIe gather alone, GB/s (median, the faster method).
    pub pcie_gather_gbs: f64,
    /// Both gather methods at this size.
    pub gather: GatherPoint,
    /// CPU-MoE while the gather loops, GB/s.
    pub cpu_moe_contended_gbs: f64,
    /// Gather while the CPU kernel loops, GB/s.
    pub pcie_gather_contended_gbs: f64,
    /// STREAM read with the same threads, GB/s (median).
    pub stream_read_gbs: f64,
    /// One linear pinned H2D copy of the same bytes, GB/s (median).
    pub linear_h2d_gbs: f64,
    /// cpu_moe / pcie_gather (isolated), the legacy ratio.
    pub ratio: f64,
    /// `hybrid` if ratio > threshold, else `offload`.
    pub verdict: String,
    /// pcie / (pcie + cpu) from the contended pair.
    pub fetch_fraction: f64,
}

impl BwRow {
    /// This row as the profile's `BenchBw`.
    pub fn bench_bw(&self) -> BenchBw {
        BenchBw {
            expert_bytes: self.expert_bytes,
            experts: self.experts as u32,
            cpu_moe_gbs: self.cpu_moe_gbs,
            pcie_gather_gbs: self.pcie_gather_gbs,
            cpu_moe_overlap_gbs: Some(self.cpu_moe_contended_gbs),
            pcie_gather_overlap_gbs: Some(self.pcie_gather_contended_gbs),
        }
    }
}

/// The whole report.
#[derive(Debug, Clone, Serialize)]
pub struct BwReport {
    /// The device the gather ran on.
    pub device: DeviceInfo,
    /// CPU threads of the CPU kernel.
    pub threads: usize,
    /// SIMD level of the CPU kernel.
    pub simd: String,
    /// Verdict threshold.
    pub threshold: f64,
    /// Tuning geometry first, then the served model.
    pub rows: Vec<BwRow>,
    /// The served model's row in the profile's form (`Profile::bench_bw`).
    pub profile_bench_bw: Option<BenchBw>,
}

fn gbs(bytes: u64, secs: f64) -> f64 {
    bytes as f64 / secs / 1e9
}

/// Run `ft bench bw`.
pub fn run(args: Args) -> Result<()> {
    if !(args.threshold > 0.0 && args.threshold.is_finite()) {
        bail!("--threshold {} must be a positive number", args.threshold);
    }
    if args.reps == 0 {
        bail!("--reps must be > 0");
    }
    let act: ActivationPath = args.act.parse().context("--act")?;
    let kind: DeviceKind = args.device.parse().context("--device")?;
    let served = ModelSpec::resolve(&args.model).context("--model")?;
    let tuning = ModelSpec::preset("bench-nvfp4")?;
    let device = Device::open(&match kind {
        DeviceKind::Host => DeviceSpec::Host(HostDeviceConfig::default()),
        DeviceKind::Cuda => DeviceSpec::Cuda { ordinal: 0 },
    })
    .context("opening the device")?;
    let mut cpu = CpuExperts::new(args.threads)?;
    let threads = cpu.threads();
    tracing::info!(device = %device.info().name, threads, simd = %cpu.simd(), "ft bench bw");

    // STREAM read once, with the CPU kernel's threads (a ceiling for CPU-MoE).
    let stream_buf = alloc_touched(cpu.pool(), (args.bank_mib.max(64) << 20) as usize);
    let stream = stream_read(cpu.pool(), &stream_buf, args.reps.clamp(3, 10)).median_gbs();
    drop(stream_buf);

    let mut rows = Vec::new();
    for spec in [&tuning, &served] {
        if !act.supports(spec.format) {
            bail!(
                "{} has no {act} activation path (use --act f32)",
                spec.format
            );
        }
        rows.push(measure(&device, &mut cpu, spec, act, stream, &args)?);
    }
    let report = BwReport {
        device: device.info(),
        threads,
        simd: cpu.simd().to_string(),
        threshold: args.threshold,
        profile_bench_bw: rows.last().map(BwRow::bench_bw),
        rows,
    };
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

/// The CPU side's step: `n` experts starting at bank expert `first` (cycling), one token.
fn cpu_works<'a>(
    bank: &'a HostBank,
    first: usize,
    n: usize,
    tok: &'a [(u32, f32)],
) -> Result<Vec<ExpertWork<'a>>> {
    let g = bank.layout().geometry;
    let total = g.experts * g.moe_layers;
    (0..n)
        .map(|i| {
            let f = (first + i) % total;
            Ok(ExpertWork {
                weights: bank.expert(ExpertId::new(f / g.experts, f % g.experts))?,
                tokens: tok,
            })
        })
        .collect()
}

fn measure(
    device: &Device,
    cpu: &mut CpuExperts,
    spec: &ModelSpec,
    act: ActivationPath,
    stream_gbs: f64,
    args: &Args,
) -> Result<BwRow> {
    let g = spec.geometry;
    let eb = spec.expert_bytes();
    let n = args.experts.unwrap_or(g.top_k).max(1);
    // One bank "layer" holding enough distinct experts for cold reads (at least 2 steps).
    let want = ((args.bank_mib << 20) / eb).max(2 * n as u64) as usize;
    let bank_geo = ft_model::MoeGeometry {
        experts: want.min(g.experts * g.moe_layers).max(2 * n),
        moe_layers: 1,
        ..g
    };
    let bank = HostBank::from_seed(device, spec.format, &bank_geo, BANK_SEED)?;
    let total = bank_geo.experts;
    let pool = SlotPool::new(device, eb, n, 0)?;
    let copy = device.new_stream("copy")?;
    let step_bytes = n as u64 * eb;
    let weight = 1.0 / n as f32;
    let tok = vec![(0u32, weight)];
    let x = vec![0.5f32; g.hidden];
    let mut y = vec![0f32; g.hidden];
    let geo1 = ft_model::MoeGeometry { experts: n, ..g };

    // CPU-MoE isolated.
    let mut cpu_s = Vec::new();
    let mut first = 0usize;
    for rep in 0..=args.reps {
        let works = cpu_works(&bank, first, n, &tok)?;
        first = (first + n) % total;
        let t = Instant::now();
        cpu.run_layer(spec.format, &geo1, act, &works, &x, &mut y)?;
        if rep > 0 {
            cpu_s.push(gbs(step_bytes, t.elapsed().as_secs_f64()));
        }
    }
    // Gather isolated, both mechanisms, rotating sources.
    let mut times = [Vec::new(), Vec::new()];
    for (m, method) in GatherMethod::ALL.into_iter().enumerate() {
        for _ in 0..=args.reps {
            let moves: Vec<_> = (0..n)
                .map(|i| {
                    let f = (first + i) % total;
                    (ExpertId::new(0, f), ft_model::cache::SlotId(i as u32))
                })
                .collect();
            first = (first + n) % total;
            let t = gather::time_gather(device, &copy, &bank, &pool, &moves, method, 1)?;
            times[m].push(t[0]);
        }
        times[m].remove(0);
    }
    let (ce, zc) = (median(&times[0]), median(&times[1]));
    let point = GatherPoint {
        experts: n,
        expert_bytes: eb,
        copy_engine_us: ce,
        zero_copy_us: zc,
        reps: args.reps,
        chosen: if zc < ce {
            GatherMethod::ZeroCopy
        } else {
            GatherMethod::CopyEngine
        },
    };
    // Linear pinned H2D of the same bytes (one copy).
    let dst = device.alloc(step_bytes as usize, "linear H2D destination")?;
    let (e0, e1) = (device.new_event(true)?, device.new_event(true)?);
    let mut lin = Vec::new();
    for rep in 0..=args.reps {
        let src = ((first * eb as usize) % (bank.buffer().len() - step_bytes as usize + 1)) & !4095;
        first = (first + n) % total;
        copy.record(&e0)?;
        copy.copy_h2d(bank.buffer(), src, &dst, 0, step_bytes as usize)?;
        copy.record(&e1)?;
        e1.synchronize()?;
        if rep > 0 {
            lin.push(step_bytes as f64 / (e0.elapsed_us(&e1)? * 1e3));
        }
    }
    drop(dst);
    // Contended: both loops for the same window.
    let (cpu_c, pcie_c) = contended(
        device,
        cpu,
        spec,
        act,
        &bank,
        &pool,
        n,
        point.chosen,
        args.contended_ms,
    )?;

    let cpu_gbs = median(&cpu_s);
    let pcie = point.chosen_gbps();
    let ratio = cpu_gbs / pcie;
    Ok(BwRow {
        model: spec.name.clone(),
        format: spec.format.to_string(),
        expert_bytes: eb,
        experts: n,
        act: act.to_string(),
        cpu_moe_gbs: cpu_gbs,
        pcie_gather_gbs: pcie,
        gather: point,
        cpu_moe_contended_gbs: cpu_c,
        pcie_gather_contended_gbs: pcie_c,
        stream_read_gbs: stream_gbs,
        linear_h2d_gbs: median(&lin),
        ratio,
        verdict: if ratio > args.threshold {
            "hybrid"
        } else {
            "offload"
        }
        .to_string(),
        fetch_fraction: pcie_c / (pcie_c + cpu_c),
    })
}

/// CPU kernel and gather loops started together for `ms`; each side's GB/s over its window.
#[allow(clippy::too_many_arguments)]
fn contended(
    device: &Device,
    cpu: &mut CpuExperts,
    spec: &ModelSpec,
    act: ActivationPath,
    bank: &HostBank,
    pool: &SlotPool,
    n: usize,
    method: GatherMethod,
    ms: u64,
) -> Result<(f64, f64)> {
    let window = Duration::from_millis(ms.max(1));
    let barrier = Arc::new(Barrier::new(2));
    let total = bank.layout().geometry.experts;
    let eb = spec.expert_bytes();
    let g = spec.geometry;
    let copy = device.new_stream("copy-contended")?;
    std::thread::scope(|s| -> Result<(f64, f64)> {
        let b2 = barrier.clone();
        let gpu_side = s.spawn(move || -> Result<f64> {
            let (e0, e1) = (device.new_event(true)?, device.new_event(true)?);
            let mut first = total / 2;
            let mut bytes = 0u64;
            let mut us = 0f64;
            b2.wait();
            let start = Instant::now();
            while start.elapsed() < window {
                let moves: Vec<_> = (0..n)
                    .map(|i| {
                        (
                            ExpertId::new(0, (first + i) % total),
                            ft_model::cache::SlotId(i as u32),
                        )
                    })
                    .collect();
                first = (first + n) % total;
                copy.record(&e0)?;
                gather::gather(&copy, bank, pool, &moves, method)?;
                copy.record(&e1)?;
                e1.synchronize()?;
                us += e0.elapsed_us(&e1)?;
                bytes += n as u64 * eb;
            }
            Ok(bytes as f64 / (us * 1e3))
        });
        let tok = vec![(0u32, 1.0 / n as f32)];
        let x = vec![0.5f32; g.hidden];
        let mut y = vec![0f32; g.hidden];
        let geo1 = ft_model::MoeGeometry { experts: n, ..g };
        let mut first = 0usize;
        let mut bytes = 0u64;
        barrier.wait();
        let start = Instant::now();
        while start.elapsed() < window {
            let works = cpu_works(bank, first, n, &tok)?;
            first = (first + n) % total;
            cpu.run_layer(spec.format, &geo1, act, &works, &x, &mut y)?;
            bytes += n as u64 * eb;
        }
        let cpu_gbs = gbs(bytes, start.elapsed().as_secs_f64());
        let pcie = gpu_side
            .join()
            .map_err(|_| anyhow::anyhow!("the gather thread panicked"))??;
        Ok((cpu_gbs, pcie))
    })
}
