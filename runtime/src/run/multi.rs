//! A run on several GPUs: the multi-GPU engine decodes the warm-up and measured steps once,
//! and each GPU's share of the work is reported.

use super::error::{Context, Result};
use super::memory::HOST_DEVICE_SLACK;
use super::plan::{RunPlan, Setup};
use super::report::{GpuReport, MultiRunReport};
use super::{Progress, RunRequest};
use crate::device::{Device, DeviceKind, DeviceSpec, HostDeviceConfig};
use crate::engine::{decode, BankSource, CombineMethod, DecodeOptions, Engine, GpuCounts};

/// `--gpus N` with N > 1: decode `plan` on the multi-GPU engine.
pub fn run(req: &RunRequest, plan: RunPlan, progress: &mut dyn Progress) -> Result<MultiRunReport> {
    let RunPlan {
        setup: Setup { cores, kind, .. },
        layout,
        model,
        variants,
        cfg,
        memory,
        routing,
        mut notes,
        ..
    } = plan;
    if req.repeat > 1 {
        bail!(
            "--repeat {}: only a run on one GPU repeats (--gpus {})",
            req.repeat,
            layout.gpus
        );
    }
    if req.stamps_out.is_some() {
        bail!(
            "--stamps-out: only a run on one GPU keeps block timelines (--gpus {})",
            layout.gpus
        );
    }
    let fetch = variants[0].fetch;
    let (warm, measured) = routing.split_at(req.warmup);
    if req.compare_numerics || req.trace_out.is_some() {
        bail!("--compare-numerics and --trace-out are single-GPU only for now (drop --gpus)");
    }
    let n = layout.count();
    let spec = match kind {
        DeviceKind::Host => DeviceSpec::Host(HostDeviceConfig {
            memory_bytes: memory.device_bytes() + HOST_DEVICE_SLACK,
            link_gbps: req.link_gbps,
            kernel_threads: (cores.saturating_sub(cfg.threads + 1) / n).max(1),
        }),
        DeviceKind::Cuda => {
            if req.link_gbps.is_some() {
                bail!("--link-gbps: only the host device emulates a link bandwidth");
            }
            DeviceSpec::Cuda { ordinal: 0 }
        }
    };
    let devices = Device::open_group(&spec, n).context("--gpus")?;
    tracing::info!(
        gpus = n,
        placement = layout.placement.name(),
        model = %model.name,
        "building the multi-GPU engine"
    );
    let mut engine = Engine::on_gpus(
        &devices,
        layout,
        &model,
        &cfg,
        None,
        BankSource::Seed(cfg.seed),
    )
    .context("building the multi-GPU engine")?;
    let options = DecodeOptions {
        context: req.context,
        input_seed: req.seed,
        keep_spans: false,
        keep_outputs: false,
        block_stamps: false,
    };
    progress.start((warm.len() + measured.len()) as u64);
    let decoded = decode(&mut engine, warm, measured, &options, &mut |done, _| {
        progress.position(done as u64)
    })?;
    progress.finish();
    let steps: Vec<_> = decoded.records.iter().filter(|s| !s.warmup).collect();
    let ns = steps.len().max(1) as f64;
    let wall_us: f64 = steps.iter().map(|s| s.wall_us).sum();
    let combine_us_per_step = decoded.combine_us_per_step();
    let cpu_us_per_step = decoded.gpu_cpu_us_per_step();
    let counts = decoded.gpu_counts();
    let mut totals = GpuCounts::default();
    counts.iter().for_each(|c| totals.add(c));
    let workers = engine.cpu_workers();
    let per_gpu = counts
        .iter()
        .enumerate()
        .map(|(i, c)| GpuReport {
            gpu: i,
            device: devices[i].info(),
            cpu_workers: (workers[i].start, workers[i].end),
            miss_rate: c.miss_rate(),
            expert_bytes: engine.expert_bytes_per_gpu() as u64,
            gathered_bytes_per_step: c.gathered_bytes as f64 / ns,
            combine_bytes_per_step: c.combine_bytes as f64 / ns,
            cpu_us_per_step: cpu_us_per_step[i],
            combine_us_per_step,
            counts: *c,
        })
        .collect();
    if engine.combine_method() == CombineMethod::Host && kind == DeviceKind::Cuda {
        notes.push(
            "NCCL could not be used: the combine ran through the host (D2H + sum + H2D)".into(),
        );
    }
    let report = MultiRunReport {
        model: model.name.clone(),
        format: model.format.name().into(),
        layers: model.geometry.moe_layers,
        strategy: cfg.strategy.to_string(),
        fetch_fraction: fetch,
        gpus: layout.gpus,
        placement: layout.placement.name().into(),
        combine_method: engine.combine_method().name().into(),
        engine: cfg.settings,
        threads: cfg.threads,
        streams: req.streams,
        steps: steps.len(),
        cache_slots_per_gpu: cfg.cache_slots,
        tok_s_total: if wall_us > 0.0 {
            (steps.len() * req.streams) as f64 / (wall_us * 1e-6)
        } else {
            0.0
        },
        step_us_mean: wall_us / ns,
        combine_us_per_step,
        per_gpu,
        miss_rate: totals.miss_rate(),
        gathered_bytes_per_step: totals.gathered_bytes as f64 / ns,
        totals,
        memory_single_gpu: memory,
        notes,
    };
    Ok(report)
}
