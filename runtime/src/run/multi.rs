//! A run on several GPUs: the engine on the GPUs of the layout decodes the warm-up and
//! measured steps (`--repeat` times, each from an empty cache, the median reported), and
//! each GPU's share of the work and its memory are reported; `--trace-out` writes GPU 0's
//! spans and `--compare-numerics` decodes again fresh and as offload on the same GPUs, as a
//! run on one GPU does. Block timelines (`--stamps-out`) stay one GPU's.

use super::error::{Context, Result};
use super::memory::HOST_DEVICE_SLACK;
use super::plan::{RunPlan, Setup};
use super::report::{median_index, write_trace, GpuReport, MultiRunReport};
use super::{Progress, RunRequest};
use crate::device::{Device, DeviceKind, DeviceSpec, HostDeviceConfig};
use crate::engine::{
    decode, BankSource, CombineMethod, DecodeOptions, Engine, GpuCounts, GpuMemory,
};
use crate::numerics::compare_numerics;

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
        popularity,
        mut notes,
        ..
    } = plan;
    if req.stamps_out.is_some() {
        bail!(
            "--stamps-out: block timelines are read from one GPU's expert kernels (a run on {} \
             GPUs would keep GPU 0's share alone, and no CUDA machine has checked it); run with \
             --gpus 1",
            layout.gpus
        );
    }
    let fetch = variants[0].fetch;
    let (warm, measured) = routing.split_at(req.warmup);
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
        popularity,
        BankSource::Seed(cfg.seed),
    )
    .context("building the multi-GPU engine")?;
    let options = DecodeOptions {
        context: req.context,
        input_seed: req.seed,
        keep_spans: req.trace_out.is_some(),
        keep_outputs: req.compare_numerics,
        block_stamps: false,
    };
    // Each repetition from an empty cache (a fresh engine's state); the median one is
    // reported, as on one GPU.
    let per_rep = (warm.len() + measured.len()) as u64;
    progress.start(per_rep * req.repeat as u64);
    let mut runs = Vec::with_capacity(req.repeat);
    for rep in 0..req.repeat {
        if rep > 0 {
            engine.reset_cache()?;
        }
        let before = per_rep * rep as u64;
        runs.push(decode(
            &mut engine,
            warm,
            measured,
            &options,
            &mut |done, _| progress.position(before + done as u64),
        )?);
    }
    progress.finish();
    let repeats: Vec<f64> = runs.iter().map(|d| d.summary.tok_s_total).collect();
    let decoded = runs.swap_remove(median_index(&repeats));
    if let Some(path) = &req.trace_out {
        let title = format!(
            "ft run {} {} --gpus {} ({}; GPU 0's spans)",
            model.name,
            cfg.strategy,
            layout.gpus,
            layout.placement.name()
        );
        write_trace(path, &title, &decoded)?;
    }
    let steps: Vec<_> = decoded.records.iter().filter(|s| !s.warmup).collect();
    let ns = steps.len().max(1) as f64;
    let wall_us: f64 = steps.iter().map(|s| s.wall_us).sum();
    let combine_us_per_step = decoded.combine_us_per_step();
    let cpu_us_per_step = decoded.gpu_cpu_us_per_step();
    let counts = decoded.gpu_counts();
    let mut totals = GpuCounts::default();
    counts.iter().for_each(|c| totals.add(c));
    let workers = engine.cpu_workers();
    let gpu_memory = GpuMemory::of(&model, &cfg, &layout);
    let per_gpu = counts
        .iter()
        .enumerate()
        .map(|(i, c)| GpuReport {
            gpu: i,
            device: devices[i].info(),
            cpu_workers: (workers[i].start, workers[i].end),
            miss_rate: c.miss_rate(),
            expert_bytes: engine.expert_bytes_per_gpu() as u64,
            memory: gpu_memory,
            gathered_bytes_per_step: c.gathered_bytes as f64 / ns,
            combine_bytes_per_step: c.combine_bytes as f64 / ns,
            cpu_us_per_step: cpu_us_per_step[i],
            combine_us_per_step,
            counts: *c,
        })
        .collect();
    let combine_method = engine.combine_method();
    // Last: it decodes again, fresh and as offload, and leaves the engine as offload.
    let numerics = if req.compare_numerics {
        Some(compare_numerics(
            &mut engine,
            warm,
            measured,
            &options,
            &decoded.outputs,
        )?)
    } else {
        None
    };
    if combine_method == CombineMethod::Host && kind == DeviceKind::Cuda {
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
        combine_method: combine_method.name().into(),
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
        repeats,
        numerics,
        totals,
        memory,
        notes,
    };
    Ok(report)
}
