//! `ft bench bw`'s measurement: the reference engine's two numbers, measured the way its
//! rule means them, on the real paths of this runtime.
//!
//! The legacy rule is `cpu_moe_GBs / pcie_gather_GBs > threshold -> hybrid`. [`measure_bw`]
//! measures, per model geometry:
//! - **CPU-MoE GB/s**: the CPU expert step (`ft-kernels`, the hybrid CPU share) at batch 1
//!   (one token, routed to `n` experts, one token per expert), expert bytes per second;
//! - **PCIe-gather GB/s**: the real gather path (host bank to cache slots) of a whole layer
//!   of misses (`n` experts), by both mechanisms, the faster one kept (as the engine does);
//! - each **isolated** and **both at once** (contended: the CPU kernel and the gather loop
//!   run together for the same window), plus two ceilings measured in the same run: STREAM
//!   read with the CPU kernel's threads, and one linear pinned H2D copy of the same bytes.
//!
//! Every call reads cold bytes: the bank holds [`BwConfig::bank_mib`] of distinct experts
//! and calls rotate through it. The verdict is `ratio > threshold` -> hybrid; the fetch
//! fraction is `pcie / (pcie + cpu)` from the contended pair. The profile
//! (`ft_model::profile`) holds a `BenchBw`; [`BwRow::bench_bw`] converts a row into it.

use std::sync::{Arc, Barrier};
use std::time::{Duration, Instant};

use serde::Serialize;

use ft_kernels::stream::{alloc_touched, median, stream_read};
use ft_kernels::{ActivationPath, CpuExperts, ExpertWork};
use ft_model::perf::legacy::BenchBw;
use ft_model::{ExpertId, ModelSpec};

use crate::bank::HostBank;
use crate::device::{Device, DeviceInfo};
use crate::error::{Result, RuntimeError};
use crate::gather::{self, GatherMethod, GatherPoint};
use crate::slots::SlotPool;

/// Seed of the bank's synthetic experts (any fixed value: the bytes only need to be valid).
const BANK_SEED: u64 = 0x00B4_BE7C;

/// What to measure and how long.
#[derive(Debug, Clone, PartialEq)]
pub struct BwConfig {
    /// Experts per step (a layer of misses at batch 1); `None`: each model's top-k.
    pub experts: Option<usize>,
    /// Verdict threshold on cpu/pcie (the reference engine's is
    /// `ft_model::perf::legacy::DEFAULT_THRESHOLD`).
    pub threshold: f64,
    /// Distinct expert bytes in the bank, MiB (rotated through so reads are cold).
    pub bank_mib: u64,
    /// Timed repetitions of each isolated measurement (> 0).
    pub reps: usize,
    /// Duration of the contended window, ms.
    pub contended_ms: u64,
}

impl BwConfig {
    /// The threshold a positive finite number, the repetitions at least one.
    pub fn validate(&self) -> Result<()> {
        if !(self.threshold > 0.0 && self.threshold.is_finite()) {
            return Err(RuntimeError::invalid(
                "--threshold",
                format!("{} must be a positive number", self.threshold),
            ));
        }
        if self.reps == 0 {
            return Err(RuntimeError::invalid("--reps", "must be > 0"));
        }
        Ok(())
    }
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
    /// One per model measured, in the order given (`ft bench bw`: the tuning geometry,
    /// then the served model).
    pub rows: Vec<BwRow>,
    /// The last row (the served model's) in the profile's form (`Profile::bench_bw`).
    pub profile_bench_bw: Option<BenchBw>,
}

fn gbs(bytes: u64, secs: f64) -> f64 {
    bytes as f64 / secs / 1e9
}

/// Measure every model of `models` on `device` (the gather) and `cpu` (the CPU step) with
/// `act` activations: STREAM read once with `cpu`'s threads, then each geometry's row.
pub fn measure_bw(
    device: &Device,
    cpu: &mut CpuExperts,
    models: &[&ModelSpec],
    act: ActivationPath,
    cfg: &BwConfig,
) -> Result<BwReport> {
    cfg.validate()?;
    for spec in models {
        if !act.supports(spec.format) {
            return Err(RuntimeError::invalid(
                "--act",
                format!(
                    "{} has no {act} activation path (use --act f32)",
                    spec.format
                ),
            ));
        }
    }
    // STREAM read once, with the CPU kernel's threads (a ceiling for CPU-MoE).
    let stream_buf = alloc_touched(cpu.pool(), (cfg.bank_mib.max(64) << 20) as usize);
    let stream = stream_read(cpu.pool(), &stream_buf, cfg.reps.clamp(3, 10)).median_gbs();
    drop(stream_buf);
    let mut rows = Vec::new();
    for spec in models {
        rows.push(measure(device, cpu, spec, act, stream, cfg)?);
    }
    Ok(BwReport {
        device: device.info(),
        threads: cpu.threads(),
        simd: cpu.simd().to_string(),
        threshold: cfg.threshold,
        profile_bench_bw: rows.last().map(BwRow::bench_bw),
        rows,
    })
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
    cfg: &BwConfig,
) -> Result<BwRow> {
    let g = spec.geometry;
    let eb = spec.expert_bytes();
    let n = cfg.experts.unwrap_or(g.top_k).max(1);
    // One bank "layer" holding enough distinct experts for cold reads (at least 2 steps).
    let want = ((cfg.bank_mib << 20) / eb).max(2 * n as u64) as usize;
    // A valid geometry however small the bank: at least top_k experts in its one layer.
    let bank_geo = ft_model::MoeGeometry {
        experts: want.min(g.experts * g.moe_layers).max(2 * n).max(g.top_k),
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
    let geo1 = step_geometry(&g, n);

    // CPU-MoE isolated.
    let mut cpu_s = Vec::new();
    let mut first = 0usize;
    for rep in 0..=cfg.reps {
        let works = cpu_works(&bank, first, n, &tok)?;
        first = (first + n) % total;
        let t = Instant::now();
        cpu.run_layer(spec.format, &geo1, act, &works, &x, &mut y)
            .map_err(kernel)?;
        if rep > 0 {
            cpu_s.push(gbs(step_bytes, t.elapsed().as_secs_f64()));
        }
    }
    // Gather isolated, both mechanisms, rotating sources.
    let mut times = [Vec::new(), Vec::new()];
    for (m, method) in GatherMethod::ALL.into_iter().enumerate() {
        for _ in 0..=cfg.reps {
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
        reps: cfg.reps,
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
    for rep in 0..=cfg.reps {
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
        cfg.contended_ms,
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
        verdict: if ratio > cfg.threshold {
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
        let geo1 = step_geometry(&g, n);
        let mut first = 0usize;
        let mut bytes = 0u64;
        barrier.wait();
        let start = Instant::now();
        while start.elapsed() < window {
            let works = cpu_works(bank, first, n, &tok)?;
            first = (first + n) % total;
            cpu.run_layer(spec.format, &geo1, act, &works, &x, &mut y)
                .map_err(kernel)?;
            bytes += n as u64 * eb;
        }
        let cpu_gbs = gbs(bytes, start.elapsed().as_secs_f64());
        let pcie = gpu_side
            .join()
            .map_err(|_| RuntimeError::invalid("the contended gather", "its thread panicked"))??;
        Ok((cpu_gbs, pcie))
    })
}

/// The geometry of one CPU step of `n` experts (its top-k at most `n`, so that
/// `--experts` below the model's top-k is a valid step).
fn step_geometry(g: &ft_model::MoeGeometry, n: usize) -> ft_model::MoeGeometry {
    ft_model::MoeGeometry {
        experts: n,
        top_k: g.top_k.min(n),
        ..*g
    }
}

fn kernel(e: ft_kernels::KernelError) -> RuntimeError {
    RuntimeError::Kernel(e.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::device::{DeviceKind, DeviceSpec};

    /// A short run on the host-emulated device: every number a positive rate, the ratio and
    /// the verdict consistent with them, the profile's pair the last row's.
    #[test]
    fn a_host_device_run_measures_consistent_rows() {
        let device = Device::open(&DeviceSpec::of_kind(DeviceKind::Host)).unwrap();
        let mut cpu = CpuExperts::new(2).unwrap();
        let tiny = ModelSpec::preset("bench-nvfp4").unwrap();
        let cfg = BwConfig {
            experts: Some(2),
            threshold: 2.0,
            bank_mib: 16,
            reps: 2,
            contended_ms: 20,
        };
        let r = measure_bw(&device, &mut cpu, &[&tiny], ActivationPath::F32, &cfg).unwrap();
        assert_eq!(r.rows.len(), 1);
        let row = &r.rows[0];
        for v in [
            row.cpu_moe_gbs,
            row.pcie_gather_gbs,
            row.cpu_moe_contended_gbs,
            row.pcie_gather_contended_gbs,
            row.stream_read_gbs,
            row.linear_h2d_gbs,
        ] {
            assert!(v.is_finite() && v > 0.0, "{row:?}");
        }
        assert!((row.ratio - row.cpu_moe_gbs / row.pcie_gather_gbs).abs() < 1e-12);
        let want = if row.ratio > cfg.threshold {
            "hybrid"
        } else {
            "offload"
        };
        assert_eq!(row.verdict, want);
        assert!(row.fetch_fraction > 0.0 && row.fetch_fraction < 1.0);
        assert_eq!(r.profile_bench_bw, Some(row.bench_bw()));
        assert_eq!(row.experts, 2);

        let bad = BwConfig {
            reps: 0,
            ..cfg.clone()
        };
        assert!(measure_bw(&device, &mut cpu, &[&tiny], ActivationPath::F32, &bad).is_err());
        let bad = BwConfig {
            threshold: f64::NAN,
            ..cfg
        };
        let e = measure_bw(&device, &mut cpu, &[&tiny], ActivationPath::F32, &bad)
            .unwrap_err()
            .to_string();
        assert!(e.contains("--threshold"), "{e}");
    }
}
