//! `ft run`'s human tables: one per variant of a single-GPU run, one per multi-GPU run, and
//! `--probe-overhead`'s.

use anyhow::Result;
use std::io::Write;

use ft_runtime::engine::probe::OverheadReport;
use ft_runtime::numerics::NumericsReport;
use ft_runtime::run::{MultiRunReport, RunReport};

/// Bytes per GiB.
const GIB: f64 = (1u64 << 30) as f64;

/// Per-round readings for the table: `values` with `decimals` decimals, comma-separated.
fn rounds_text(values: &[f64], decimals: usize) -> String {
    values
        .iter()
        .map(|v| format!("{v:.decimals$}"))
        .collect::<Vec<_>>()
        .join(", ")
}

/// The table of one variant's report.
pub fn print(out: &mut impl Write, r: &RunReport) -> Result<()> {
    let s = &r.summary;
    writeln!(
        out,
        "ft run: {} ({}, {} B experts), {} of {} layers, {} (fetch fraction {:.3}, {})",
        r.model,
        r.format,
        r.expert_bytes,
        r.layers,
        r.model_layers,
        r.strategy,
        r.fetch_fraction,
        r.fetch_source
    )?;
    writeln!(
        out,
        "device {}, {} CPU workers ({}), act gpu {} / cpu {}, combine {}, gather {} (engine {}{})",
        r.device.label(),
        r.threads,
        r.pool_wait,
        r.gpu_act,
        r.cpu_act,
        r.combine,
        r.gather,
        r.engine,
        if r.gate_last_chunk {
            ", last chunk gated"
        } else {
            ""
        }
    )?;
    writeln!(
        out,
        "{} stream(s) at context {}, {} steps after {} warm-up, cache {} slots ({:.2} GiB, {}) + {} staging, routing {}",
        r.streams,
        r.context,
        s.steps,
        s.warmup_steps,
        r.cache_slots,
        r.cache_slots as f64 * r.expert_bytes as f64 / GIB,
        r.cache_options,
        r.staging_slots,
        r.routing
    )?;
    for n in &r.notes {
        writeln!(out, "note: {n}")?;
    }
    let mut rows: Vec<(&str, String)> = vec![
        (
            "decode tok/s per stream",
            format!("{:.2}", s.tok_s_per_stream),
        ),
        ("decode tok/s total", format!("{:.2}", s.tok_s_total)),
        (
            "step time, us (p50 / mean / p90)",
            format!(
                "{:.0} / {:.0} / {:.0}",
                s.step_us.p50, s.step_us.mean, s.step_us.p90
            ),
        ),
        ("miss rate", format!("{:.1}%", 100.0 * s.miss_rate)),
        (
            "per layer: hits / misses / fetched / cpu",
            format!(
                "{:.2} / {:.2} / {:.2} / {:.2}",
                s.hits_per_layer, s.misses_per_layer, s.fetched_per_layer, s.cpu_per_layer
            ),
        ),
        (
            "gathered per step, MB",
            format!("{:.2}", s.gathered_bytes_per_step / 1e6),
        ),
        (
            "busy per step, us (gpu / pcie / cpu / host wait)",
            format!(
                "{:.0} / {:.0} / {:.0} / {:.0}",
                s.gpu_busy_us, s.pcie_busy_us, s.cpu_busy_us, s.host_wait_us
            ),
        ),
        (
            "utilisation (gpu / pcie / cpu / host wait)",
            format!(
                "{:.0}% / {:.0}% / {:.0}% / {:.0}%",
                100.0 * s.utilisation.gpu,
                100.0 * s.utilisation.pcie,
                100.0 * s.utilisation.cpu,
                100.0 * s.utilisation.host_wait
            ),
        ),
    ];
    if let Some(idle) = &s.link_idle_per_layer {
        // What the link waits on: the part of a PCIe-bound layer no overlap can hide.
        let parts: Vec<String> = idle
            .causes()
            .into_iter()
            .filter(|(_, us)| *us >= 0.05)
            .map(|(name, us)| format!("{name} {us:.1}"))
            .collect();
        rows.push((
            "link idle per layer, us (while)",
            format!("{:.1} ({})", idle.total_us, parts.join(", ")),
        ));
    }
    let width = rows.iter().map(|(k, _)| k.len()).max().unwrap_or(0);
    for (k, v) in &rows {
        writeln!(out, "  {k:<width$}  {v}")?;
    }
    if let Some(p) = &r.pcie {
        writeln!(
            out,
            "  {:<width$}  {:.2} GB/s linear H2D; bound {:.0} us/step; at {:.0}% of the bound",
            "PCIe bound",
            p.linear_h2d_gbs,
            p.bound_step_us,
            100.0 * p.share_of_bound
        )?;
    }
    if let Some(c) = &r.cpu {
        writeln!(
            out,
            "  {:<width$}  {:.1} GB/s while busy; STREAM read of the bank {:.1} GB/s ({} threads; rounds {}); at {:.0}% of it",
            "CPU share",
            c.cpu_gbs_while_busy,
            c.stream_read_gbs,
            c.threads,
            rounds_text(&c.stream_read_rounds_gbs, 1),
            100.0 * c.share_of_stream
        )?;
        if let Some(check) = &c.cpu_check {
            writeln!(
                out,
                "  {:<width$}  {:.0} us for {} experts at 1 token ({} threads; rounds {})",
                "CPU check",
                check.time_us,
                check.experts,
                check.threads,
                rounds_text(&c.cpu_check_rounds_us, 0),
            )?;
        }
    }
    if let Some(n) = &r.numerics {
        print_numerics(out, n, width)?;
    }
    Ok(())
}

/// The numerics lines, labels `width` wide.
fn print_numerics(out: &mut impl Write, n: &NumericsReport, width: usize) -> Result<()> {
    if let Some(d) = &n.vs_offload {
        writeln!(
            out,
            "  {:<width$}  max rel. L2 {:.2e}, mean {:.2e}, bit-identical {}",
            "numerics vs offload", d.max_rel_l2, d.mean_rel_l2, d.bit_identical
        )?;
    }
    let d = &n.fresh_vs_warmed;
    writeln!(
        out,
        "  {:<width$}  max rel. L2 {:.2e}, bit-identical {} (expected {})",
        "numerics fresh vs warmed", d.max_rel_l2, d.bit_identical, n.expect_bit_identical
    )?;
    Ok(())
}

/// The table of a multi-GPU run.
pub fn print_multi(out: &mut impl Write, r: &MultiRunReport) -> Result<()> {
    writeln!(
        out,
        "ft run: {} ({}), {} layers, {} (fetch fraction {:.3}) on {} GPUs, {}, combine {}",
        r.model,
        r.format,
        r.layers,
        r.strategy,
        r.fetch_fraction,
        r.gpus,
        r.placement,
        r.combine_method
    )?;
    writeln!(
        out,
        "{} stream(s), {} steps, {} cache slots per GPU, {} CPU workers in all",
        r.streams, r.steps, r.cache_slots_per_gpu, r.threads
    )?;
    for n in &r.notes {
        writeln!(out, "note: {n}")?;
    }
    writeln!(
        out,
        "  {:>4}  {:<28} {:>9} {:>10} {:>12} {:>11} {:>10} {:>11}",
        "gpu",
        "device",
        "workers",
        "miss rate",
        "gathered MB",
        "combine MB",
        "cpu us",
        "combine us"
    )?;
    for g in &r.per_gpu {
        writeln!(
            out,
            "  {:>4}  {:<28} {:>9} {:>9.1}% {:>12.2} {:>11.3} {:>10.0} {:>11.0}",
            g.gpu,
            g.device.name,
            format!("{}..{}", g.cpu_workers.0, g.cpu_workers.1),
            100.0 * g.miss_rate,
            g.gathered_bytes_per_step / 1e6,
            g.combine_bytes_per_step / 1e6,
            g.cpu_us_per_step,
            g.combine_us_per_step
        )?;
    }
    writeln!(
        out,
        "  {:>4}  {:<28} {:>9} {:>9.1}% {:>12.2} {:>11.3} {:>10} {:>11.0}",
        "all",
        "",
        "",
        100.0 * r.miss_rate,
        r.gathered_bytes_per_step / 1e6,
        r.totals.combine_bytes as f64 / r.steps.max(1) as f64 / 1e6,
        "",
        r.combine_us_per_step
    )?;
    writeln!(
        out,
        "  decode tok/s total {:.2}, step {:.0} us (mean)",
        r.tok_s_total, r.step_us_mean
    )?;
    if r.repeats.len() > 1 {
        writeln!(
            out,
            "  repetitions (tok/s, the median reported): {}",
            rounds_text(&r.repeats, 2)
        )?;
    }
    if let Some(g) = r.per_gpu.first() {
        let m = &g.memory;
        writeln!(
            out,
            "  memory of each GPU: slots {:.3} GiB ({} cache, {} staging, {} resident of {:.2} MB), \
             dense {:.3} GiB, KV {:.3} GiB, activations {:.3} GiB; host bank {:.2} GiB",
            m.slot_bytes as f64 / GIB,
            m.cache_slots,
            m.staging_slots,
            m.resident_slots,
            m.expert_bytes as f64 / 1e6,
            m.dense_weight_bytes as f64 / GIB,
            m.kv_bytes as f64 / GIB,
            m.activation_bytes as f64 / GIB,
            r.memory.bank_bytes as f64 / GIB
        )?;
    }
    if let Some(n) = &r.numerics {
        print_numerics(out, n, 24)?;
    }
    Ok(())
}

/// `--probe-overhead`'s table.
pub fn print_overhead(out: &mut impl Write, r: &OverheadReport) -> Result<()> {
    writeln!(
        out,
        "hybrid fixed cost per layer on {} ({} CPU threads, {}), {} layers of tiny experts",
        r.device,
        r.threads,
        r.pool_wait.name(),
        r.layers
    )?;
    for (k, v) in [
        ("resident layer, us", r.resident_layer_us),
        ("cpu layer (one round trip), us", r.cpu_layer_us),
        ("CPU busy per layer, us", r.cpu_busy_layer_us),
        ("host wait per layer, us", r.host_wait_layer_us),
        ("overhead beyond the work, us", r.overhead_layer_us),
        ("target, us", r.target_us),
        (
            "pool job alone, spinning, host computing, us",
            r.pool_job_spin_us,
        ),
        (
            "pool job alone, spinning, host idle beside, us",
            r.pool_job_spin_beside_us,
        ),
        ("pool job alone, parked, us", r.pool_job_park_us),
    ] {
        writeln!(out, "  {k:<46} {v:>8.1}")?;
    }
    writeln!(out, "  {:<46} {:>8}", "meets the target", r.meets_target())?;
    Ok(())
}
