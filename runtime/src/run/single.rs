//! A run on one GPU: one engine, built for the first variant that gathers, decodes every
//! variant in turn and in rounds (`--repeat`, each from an empty cache, the order rotated
//! every round), with the same-run ceilings read before each round.

use super::error::{Context, Result};
use super::memory::HOST_DEVICE_SLACK;
use super::plan::{RunPlan, Setup};
use super::report::{median_index, write_trace, BankReads, CpuBound, PcieBound, RunReport};
use super::variant::resolve_auto_at_check;
use super::{Progress, RunRequest};
use crate::device::{Device, DeviceKind, HostDeviceConfig};
use crate::engine::{decode, DecodeOptions, Engine};
use crate::numerics::compare_numerics;

/// Largest copy of the linear H2D probe, bytes.
const LINEAR_PROBE_BYTES: usize = 256 << 20;
/// Repetitions of the linear H2D probe (median).
const LINEAR_PROBE_REPS: usize = 5;
/// Experts of the bank between the starts of two rounds' CPU checks (a prime, so that the
/// rounds read different weights).
const CPU_CHECK_STRIDE: usize = 1009;

/// Decode `plan`'s variants on one GPU; one report per variant, in the order given.
pub fn run(req: &RunRequest, plan: RunPlan, progress: &mut dyn Progress) -> Result<Vec<RunReport>> {
    let RunPlan {
        setup:
            Setup {
                cores,
                kind,
                threads,
                pool_wait,
            },
        layout: _,
        full,
        model,
        mut variants,
        auto_host,
        cache_slots,
        cfg,
        memory,
        routing,
        popularity,
        notes,
    } = plan;
    let g = model.geometry;
    let policy = &cfg.cache_options;
    let strategy = cfg.strategy;
    let (warm, measured) = routing.split_at(req.warmup);
    let device = match kind {
        DeviceKind::Host => Device::host(HostDeviceConfig {
            memory_bytes: memory.device_bytes() + HOST_DEVICE_SLACK,
            link_gbps: req.link_gbps,
            kernel_threads: cores.saturating_sub(threads + 1).max(1),
        })?,
        DeviceKind::Cuda => {
            if req.link_gbps.is_some() {
                bail!("--link-gbps: only the host device emulates a link bandwidth");
            }
            Device::cuda(0)?
        }
    };
    if req.stamps_out.is_some() {
        match device.cuda_tuning() {
            None => bail!(
                "--stamps-out: the host-emulated device runs no CUDA kernels to time; use --device cuda"
            ),
            Some(t) if !t.block_stamps => bail!(
                "--stamps-out: the expert kernels were built without block timelines; set {}=1",
                crate::device::tuning::CUDA_STAMPS_ENV
            ),
            Some(_) => {}
        }
    }
    tracing::info!(device = %device.info().name, model = %model.name, %strategy, "building the engine");
    let mut engine =
        Engine::new(&device, &model, &cfg, popularity).context("building the engine")?;
    let linear = if variants.iter().any(|v| v.gathers) {
        Some(engine.measure_linear_h2d_gbs(LINEAR_PROBE_BYTES, LINEAR_PROBE_REPS)?)
    } else {
        None
    };

    let options = DecodeOptions {
        context: req.context,
        input_seed: req.seed,
        keep_spans: req.trace_out.is_some(),
        keep_outputs: req.compare_numerics,
        block_stamps: req.stamps_out.is_some(),
    };
    let per_rep = (req.warmup + req.steps) as u64;
    let n = variants.len();
    progress.start(per_rep * (req.repeat * n) as u64);
    // Round r decodes every variant once, starting at variant r mod n; each decode starts
    // from an empty cache (a fresh engine's state).
    let mut runs: Vec<Vec<crate::engine::Decoded>> =
        (0..n).map(|_| Vec::with_capacity(req.repeat)).collect();
    let mut steal = vec![crate::instrument::StealMeter::default(); n];
    // The CPU's same-run ceiling, read before each round (runs with a CPU share).
    let with_cpu = auto_host.is_some() || variants.iter().any(|v| v.uses_cpu);
    let mut bank_reads = if with_cpu {
        Some(BankReads::new(threads)?)
    } else {
        None
    };
    let mut done_runs = 0u64;
    for rep in 0..req.repeat {
        if let Some(b) = bank_reads.as_mut() {
            b.read(engine.bank().buffer().as_slice(), rep);
            let start = rep * CPU_CHECK_STRIDE;
            let check = engine
                .cpu_check(crate::cpu_check::CHECK_BUDGET, start)
                .context("the CPU check before a round")?;
            b.checks.push(check);
            if let (0, Some(host)) = (rep, &auto_host) {
                resolve_auto_at_check(
                    host,
                    &check,
                    &mut variants,
                    req,
                    &model,
                    cache_slots,
                    policy,
                )?;
                if n == 1 {
                    engine
                        .set_strategy(variants[0].strategy)
                        .context("the fraction decided at the CPU check")?;
                }
            }
        }
        for k in 0..n {
            let i = (rep + k) % n;
            let v = &variants[i];
            if n > 1 {
                engine
                    .set_strategy(v.strategy)
                    .with_context(|| format!("--interleave {}", v.label))?;
                progress.message(&v.label);
            } else if rep > 0 {
                engine.reset_cache()?;
            }
            let done_before = per_rep * done_runs;
            let cpu_start = crate::instrument::HostCpuTimes::now();
            runs[i].push(decode(
                &mut engine,
                warm,
                measured,
                &options,
                &mut |done, _| progress.position(done_before + done as u64),
            )?);
            if let (Some(a), Some(b)) = (cpu_start, crate::instrument::HostCpuTimes::now()) {
                steal[i].add(&a, &b);
            }
            done_runs += 1;
        }
    }
    progress.finish();

    let mut reports = Vec::with_capacity(n);
    for ((v, mut runs), steal) in variants.iter().zip(runs).zip(&steal) {
        let repeats: Vec<f64> = runs.iter().map(|d| d.summary.tok_s_total).collect();
        let decoded = runs.swap_remove(median_index(&repeats));
        if let Some(path) = &req.trace_out {
            write_trace(
                path,
                &format!("ft run {} {}", model.name, v.strategy),
                &decoded,
            )?;
        }
        if let (Some(path), Some(stamps)) = (&req.stamps_out, &decoded.stamps) {
            crate::block_stamps::write_csv(path, &stamps.records)
                .with_context(|| format!("--stamps-out {}", path.display()))?;
            tracing::info!(
                records = stamps.records.len(),
                dropped = stamps.dropped,
                path = %path.display(),
                "block timelines of the last measured step written"
            );
            if stamps.dropped > 0 {
                tracing::warn!(
                    dropped = stamps.dropped,
                    "blocks past the timeline buffer were not kept: fewer --layers keep them all"
                );
            }
        }
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
        let summary = decoded.summary.clone();
        let pcie = linear.filter(|_| v.gathers).map(|gbs| {
            let bound = summary.gathered_bytes_per_step / (gbs * 1e3);
            PcieBound {
                linear_h2d_gbs: gbs,
                gathered_bytes_per_step: summary.gathered_bytes_per_step,
                bound_step_us: bound,
                share_of_bound: if summary.step_us.mean > 0.0 {
                    bound / summary.step_us.mean
                } else {
                    0.0
                },
            }
        });
        let cpu = bank_reads
            .as_ref()
            .and_then(|b| CpuBound::of(&summary, g.moe_layers, model.expert_bytes(), threads, b));
        let mut notes = notes.clone();
        if n > 1 {
            let others: Vec<&str> = variants
                .iter()
                .filter(|o| o.label != v.label)
                .map(|o| o.label.as_str())
                .collect();
            notes.push(format!(
                "decoded in turn with {} on one engine, {} round(s) from an empty cache each (--interleave)",
                others.join(", "),
                req.repeat
            ));
        }
        if let Some(f) = steal.fraction() {
            if f > crate::instrument::STEAL_NOTABLE_FRACTION {
                notes.push(format!(
                    "the hypervisor took {:.1}% of the machine's CPU time while this ran (steal): \
                     its timing is not this machine's own",
                    100.0 * f
                ));
            }
        }
        reports.push(RunReport {
            label: v.label.clone(),
            model: model.name.clone(),
            format: model.format.name().into(),
            expert_bytes: model.expert_bytes(),
            layers: g.moe_layers,
            model_layers: full.geometry.moe_layers,
            strategy: v.strategy.to_string(),
            fetch_fraction: v.fetch,
            fetch_source: v.fetch_source.clone(),
            cpu_layers: v.cpu_layers,
            auto_cpu_speed: v.auto_cpu_speed,
            device: device.info(),
            threads,
            pool_wait: pool_wait.name().into(),
            engine: cfg.settings,
            gate_last_chunk: engine.gates_last_chunk(),
            gpu_act: cfg.gpu_path.name().into(),
            cpu_act: cfg.cpu_path.name().into(),
            combine: cfg.combine.name().into(),
            gather: cfg.gather.name().into(),
            streams: req.streams,
            context: req.context,
            cache_slots: engine.cache_slots(),
            staging_slots: engine.staging_slots(),
            policy: policy.policy.to_string(),
            cache_options: policy.clone(),
            routing: req.routing.clone(),
            seed: req.seed,
            memory,
            summary,
            pcie,
            cpu,
            numerics,
            notes,
            step_records: decoded.records,
            repeats,
            host_steal_fraction: steal.fraction(),
        });
    }
    Ok(reports)
}
