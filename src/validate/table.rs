//! `ft validate analyze`'s table: the prediction errors by group, the CPU side's drift during
//! the runs, the choosers' losses and whether the targets were met.

use anyhow::Result;
use std::io::Write;

use ft_runtime::instrument::STEAL_NOTABLE_FRACTION;
use ft_validate::stats::{CeilingDrift, ErrorStats, Summary};

/// "median M, LO to HI; correlation with the signed error C", for the summary table.
fn describe(d: &CeilingDrift) -> String {
    format!(
        "median {:.3}, {:.3} to {:.3}; correlation with the signed error {}",
        d.ratio.median,
        d.ratio.min,
        d.ratio.max,
        d.error_correlation
            .map_or("n/a".to_string(), |c| format!("{c:+.2}"))
    )
}

/// The analysis's summary as a table.
pub fn write_summary(o: &mut impl Write, s: &Summary) -> Result<()> {
    writeln!(o, "{} rows over {} configurations", s.rows, s.configs)?;
    writeln!(o)?;
    writeln!(
        o,
        "{:<28} {:>5} {:>9} {:>9} {:>9} {:>9}",
        "prediction error", "n", "median", "p90", "bias", "max"
    )?;
    let line = |o: &mut dyn Write, name: &str, e: &ErrorStats| {
        writeln!(
            o,
            "{:<28} {:>5} {:>8.2}% {:>8.2}% {:>8.2}% {:>8.2}%",
            name,
            e.n,
            100.0 * e.median,
            100.0 * e.p90,
            100.0 * e.mean_signed,
            100.0 * e.max
        )
    };
    line(o, "all", &s.errors)?;
    for (k, e) in s
        .errors_by_strategy
        .iter()
        .chain(&s.errors_by_geometry)
        .chain(&s.errors_by_threads)
        .chain(&s.errors_by_context)
        .chain(&s.errors_by_threads_and_strategy)
    {
        line(o, k, e)?;
    }
    if let Some(e) = &s.errors_without_steal {
        line(o, "without host steal", e)?;
        if !s.stolen_configs.is_empty() {
            writeln!(
                o,
                "  (left out: {}, whose runs lost more than {:.0}% of the machine's CPU time to the hypervisor)",
                s.stolen_configs.join(", "),
                100.0 * STEAL_NOTABLE_FRACTION
            )?;
        }
    }
    if let Some(r) = &s.stream_read_gbs {
        writeln!(
            o,
            "CPU ceiling during the runs (same-run STREAM read of the bank, {} rows): median {:.1} GB/s, {:.1} to {:.1}",
            r.n, r.median, r.min, r.max
        )?;
    }
    if let Some(d) = &s.ceiling_drift {
        writeln!(
            o,
            "  against the probes' (rows at the probe's threads, {}): run over probe {}",
            d.ratio.n,
            describe(d)
        )?;
    }
    if let Some(d) = &s.cpu_speed_drift {
        writeln!(
            o,
            "CPU speed of the runs against the probes (the CPU check, {} rows): {}",
            d.ratio.n,
            describe(d)
        )?;
    }
    if let Some(all) = s.interval_coverage.get("all") {
        writeln!(
            o,
            "measured inside the predicted interval: {} of {} rows ({:.0}%; {})",
            all.inside,
            all.n,
            100.0 * all.share(),
            s.interval_coverage
                .iter()
                .filter(|(k, _)| k.as_str() != "all")
                .map(|(k, c)| format!("{k} {:.0}%", 100.0 * c.share()))
                .collect::<Vec<_>>()
                .join(", ")
        )?;
    }
    if let Some(e) = &s.sim_errors {
        writeln!(o)?;
        writeln!(
            o,
            "{:<28} {:>5} {:>9} {:>9} {:>9} {:>9}",
            "simulator error", "n", "median", "p90", "bias", "max"
        )?;
        line(o, "all", e)?;
        for (k, e) in &s.sim_errors_by_strategy {
            line(o, k, e)?;
        }
    }
    writeln!(o)?;
    writeln!(
        o,
        "{:<12} {:>7} {:>10} {:>9} {:>6} {:>10}  picks",
        "chooser", "configs", "mean loss", "max loss", "best", "wrong >5%"
    )?;
    for c in &s.choosers {
        let picks: Vec<String> = c.picks.iter().map(|(k, v)| format!("{k} {v}")).collect();
        writeln!(
            o,
            "{:<12} {:>7} {:>9.2}% {:>8.2}% {:>6} {:>10}  {}",
            c.chooser,
            c.configs,
            100.0 * c.mean_loss,
            100.0 * c.max_loss,
            c.best_picks,
            c.wrong_picks_over_gap,
            picks.join(", ")
        )?;
    }
    writeln!(
        o,
        "ferrox-core's split equals ft's planner at the rules' fraction: {}",
        s.ferrox_split_agrees
    )?;
    writeln!(o)?;
    if s.targets_met {
        writeln!(
            o,
            "targets met (median <= 5%, p90 <= 10%, mean loss <= 2%, no wrong pick over 5%{})",
            if s.sim_errors.is_some() {
                "; simulator median <= 10%"
            } else {
                ""
            }
        )?;
    } else {
        writeln!(o, "targets missed: {}", s.missed.join("; "))?;
    }
    Ok(())
}
