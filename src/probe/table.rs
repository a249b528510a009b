//! `ft probe`'s tables: the profile used, every parameter with its standard error, the
//! fit's stages and residuals, the legacy rule and what an export wrote.

use anyhow::Result;
use std::io::Write;

use ft_runtime::probe::report::ProbeReport;

/// The report as tables.
pub fn write_tables(out: &mut impl Write, r: &ProbeReport) -> Result<()> {
    let how = match &r.outcome {
        Some(o) => format!("probed in {:.1} s", o.wall_s),
        None => "reused the cached profile (--force re-probes)".to_string(),
    };
    writeln!(
        out,
        "ft probe: {} ({}, {:.2} MB experts, {} layers) on {}: {how}",
        r.model.name,
        r.model.format,
        r.model.expert_bytes() as f64 / 1e6,
        r.model.geometry.moe_layers,
        r.device.label()
    )?;
    writeln!(out, "profile: {} (engine {})", r.profile_path, r.engine)?;
    if let Some(why) = &r.untrusted {
        writeln!(out, "UNTRUSTED fit: {why}")?;
    }
    if let Some(c) = &r.profile_copy {
        writeln!(out, "copy: {c}")?;
    }
    if let Some(o) = &r.outcome {
        if let Some(f) = o.host_steal_fraction {
            writeln!(
                out,
                "hypervisor steal during the probe: {:.1}% of the CPU time ({} probe{})",
                100.0 * f,
                o.attempts,
                if o.attempts == 1 { "" } else { "s" }
            )?;
        }
        if let Some(start) = o.stream_read_start_gbs {
            writeln!(
                out,
                "bank read rate (the CPU's ceiling): {start:.1} GB/s at the start, {:.1} at the end",
                o.stream_read_gbs
            )?;
        }
        writeln!(out)?;
        writeln!(
            out,
            "{:<32} {:>7} {:>7} {:>8}",
            "probe", "points", "reps", "wall s"
        )?;
        for t in &o.timings {
            writeln!(
                out,
                "{:<32} {:>7} {:>7} {:>8.2}",
                t.name, t.points, t.reps, t.wall_s
            )?;
        }
        writeln!(out)?;
        writeln!(
            out,
            "end to end ({} of {} layers, {} threads, pool {}):",
            o.e2e_layers,
            o.model.geometry.moe_layers,
            o.threads,
            o.pool_wait.name()
        )?;
        writeln!(
            out,
            "{:<18} {:>7} {:>7} {:>12} {:>12} {:>7}",
            "strategy", "threads", "streams", "tok/s/strm", "step us", "miss%"
        )?;
        for e in &o.e2e {
            writeln!(
                out,
                "{:<18} {:>7} {:>7} {:>12.1} {:>12.1} {:>7.1}",
                e.strategy.to_string(),
                e.threads,
                e.streams,
                e.tok_s_per_stream,
                e.step_us,
                100.0 * e.miss_rate
            )?;
        }
    }
    if !r.estimates.is_empty() {
        writeln!(out)?;
        writeln!(
            out,
            "{:<22} {:>12} {:>11} {:>27}  stage",
            "parameter", "value", "std err", "95% interval"
        )?;
        for e in &r.estimates {
            writeln!(
                out,
                "{:<22} {:>12.4} {:>11.4} [{:>11.4}, {:>11.4}]  {}",
                e.param.name(),
                e.value,
                e.se,
                e.interval[0],
                e.interval[1],
                e.stage
                    .as_deref()
                    .unwrap_or("not determined by the probes (no std err)")
            )?;
        }
        writeln!(out)?;
        writeln!(
            out,
            "{:<22} {:>7} {:>5} {:>9} {:>6}  termination",
            "stage", "samples", "dof", "rms rel", "iters"
        )?;
        for s in &r.stages {
            writeln!(
                out,
                "{:<22} {:>7} {:>5} {:>8.2}% {:>6}  {}",
                s.name,
                s.samples,
                s.dof,
                100.0 * s.rms_rel,
                s.iterations,
                s.termination
            )?;
        }
        writeln!(out)?;
        writeln!(
            out,
            "{:<28} {:>5} {:>8} {:>8} {:>9} {:>9} {:>9}",
            "residuals (pred-meas)/meas", "n", "mean", "rms", "median|r|", "p90|r|", "max|r|"
        )?;
        for s in &r.residuals {
            writeln!(
                out,
                "{:<28} {:>5} {:>7.2}% {:>7.2}% {:>8.2}% {:>8.2}% {:>8.2}%",
                s.probe,
                s.n,
                100.0 * s.mean_rel,
                100.0 * s.rms_rel,
                100.0 * s.median_abs_rel,
                100.0 * s.p90_abs_rel,
                100.0 * s.max_abs_rel
            )?;
        }
    }
    if let (Some(b), Some(l)) = (&r.bench_bw, &r.legacy) {
        writeln!(out)?;
        writeln!(
            out,
            "legacy bench ({:.2} MB experts x {}): cpu-moe {:.2} GB/s, pcie-gather {:.2} GB/s, ratio {:.2} vs {:.2} -> {}; contended {} / {} GB/s -> fetch fraction {}",
            b.expert_bytes as f64 / 1e6,
            b.experts,
            b.cpu_moe_gbs,
            b.pcie_gather_gbs,
            l.ratio,
            l.threshold,
            l.verdict,
            b.cpu_moe_overlap_gbs.map_or("-".into(), |v| format!("{v:.2}")),
            b.pcie_gather_overlap_gbs.map_or("-".into(), |v| format!("{v:.2}")),
            l.fetch_fraction.map_or("-".into(), |f| format!("{f:.3}"))
        )?;
    }
    if let Some(e) = &r.export {
        writeln!(out)?;
        writeln!(
            out,
            "exported {} for the reference engine: {} -> {} (fetch fraction {:.4}, Q16 {}); the legacy rule said {}",
            e.path, e.format_key, e.verdict, e.fetch_fraction, e.fetch_fraction_q16, e.legacy_verdict
        )?;
    }
    if let Some(o) = &r.outcome {
        for n in &o.notes {
            writeln!(out, "note: {n}")?;
        }
    }
    Ok(())
}

// ---------------------------------------------------------------------------------------
