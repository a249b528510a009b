//! One row per strategy run of a grid: the measured runs (`ft run --json`), the predictions
//! (`ft predict --json`) and the profiles collected into one CSV.

use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::path::Path;

use ft_model::perf::legacy;
use ft_model::profile::{CpuCheck, Profile};
use ft_model::{ModelSpec, StrategyKind};

use crate::error::{Result, ValidateError};
use crate::grid::{PlanRow, GRID_STRATEGIES};

/// One row of the grid CSV: one strategy run of one configuration with its prediction.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct GridRow {
    /// Configuration id.
    pub config: String,
    /// Expert geometry (model preset).
    pub geometry: String,
    /// Layers run.
    pub layers: usize,
    /// Bytes of one routed expert.
    pub expert_bytes: u64,
    /// Cache residency.
    pub residency: f64,
    /// Cache slots.
    pub cache_slots: usize,
    /// Streams.
    pub streams: usize,
    /// CPU threads.
    pub threads: usize,
    /// Context, tokens.
    pub context: usize,
    /// offload, hybrid (the model's fraction), hybrid-legacy (the rule's fraction) or cpu.
    pub strategy: String,
    /// Fetch fraction the run planned with.
    pub fetch_fraction: f64,
    /// Measured decode tok/s of all streams.
    pub measured_tok_s: f64,
    /// Measured expert-level miss rate.
    pub measured_miss_rate: f64,
    /// Predicted decode tok/s of all streams.
    pub predicted_tok_s: f64,
    /// Lower end of its interval (empty where the model gives none).
    pub predicted_tok_s_lo: Option<f64>,
    /// Upper end of its interval.
    pub predicted_tok_s_hi: Option<f64>,
    /// Predicted miss rate (empty where the model gives none).
    pub predicted_miss_rate: Option<f64>,
    /// `|predicted - measured| / measured`.
    pub abs_rel_error: f64,
    /// The legacy bench's CPU-MoE GB/s (alone), from the geometry's profile.
    pub bench_cpu_moe_gbs: f64,
    /// The legacy bench's PCIe-gather GB/s (alone).
    pub bench_pcie_gather_gbs: f64,
    /// CPU-MoE GB/s while the gather runs.
    pub bench_cpu_moe_overlap_gbs: Option<f64>,
    /// PCIe-gather GB/s while the CPU kernel runs.
    pub bench_pcie_gather_overlap_gbs: Option<f64>,
    /// The rule's threshold.
    pub threshold: f64,
    /// Decode tok/s of all streams the discrete-event simulator gives the same run with the
    /// same fitted profile (`ft validate simulate`; empty before it ran).
    #[serde(default)]
    pub simulated_tok_s: Option<f64>,
    /// Share of the machine's CPU time the hypervisor stole while the run decoded (the run
    /// report's `host_steal_fraction`; empty where the report has none).
    #[serde(default)]
    pub host_steal: Option<f64>,
    /// The same-run STREAM read of the host bank with the run's threads, GB/s (the run
    /// report's `cpu.stream_read_gbs`: the machine's CPU ceiling while it ran; empty for
    /// offload and for reports before it existed).
    #[serde(default)]
    pub stream_read_gbs: Option<f64>,
    /// The same reading taken by the geometry's probe (`probes/<geometry>.json`'s
    /// `outcome.stream_read_gbs`), where the row ran at the probe's thread count (empty
    /// otherwise): `stream_read_gbs` over it is how far the machine's CPU ceiling moved
    /// between the probe the prediction rests on and the run.
    #[serde(default)]
    pub probe_stream_read_gbs: Option<f64>,
    /// How many times faster the CPU side ran in this run than in the probe: the run's CPU
    /// check (`cpu.cpu_check`, taken before each round) against the profile's check of the
    /// same work (`Profile::cpu_speed`); empty for offload, for another thread count than
    /// the probe checked, and for runs or profiles from before the check existed.
    #[serde(default)]
    pub cpu_speed: Option<f64>,
}

/// The number at a JSON pointer (RFC 6901, `/a/b/0`) of a document.
fn num(v: &serde_json::Value, pointer: &str) -> Option<f64> {
    v.pointer(pointer).and_then(serde_json::Value::as_f64)
}

fn read_json(path: &Path) -> Option<serde_json::Value> {
    let text = ft_model::limits::read_bounded(path, ft_model::limits::MAX_PROFILE_BYTES).ok()?;
    serde_json::from_str(&text).ok()
}

/// Read `dir/plan.csv`, every `runs/<config>-<strategy>.json` (`ft run --json`), every
/// `predictions/<config>.json` (`ft predict --json`) and `profiles/<geometry>.json`; the rows
/// and the runs that are missing or unreadable (a grid cut short).
pub fn collect(dir: &Path) -> Result<(Vec<GridRow>, Vec<String>)> {
    let plan: Vec<PlanRow> = read_rows(&dir.join("plan.csv"))?;
    let mut rows = Vec::new();
    let mut missing = Vec::new();
    let mut profiles: BTreeMap<String, Option<Profile>> = BTreeMap::new();
    // Each geometry's probe ceiling and the threads it read with.
    let mut probe_ceilings: BTreeMap<String, Option<(f64, usize)>> = BTreeMap::new();
    for p in &plan {
        let probe_ceiling = *probe_ceilings.entry(p.geometry.clone()).or_insert_with(|| {
            let probe = read_json(&dir.join(format!("probes/{}.json", p.geometry)))?;
            Some((
                num(&probe, "/outcome/stream_read_gbs")?,
                num(&probe, "/outcome/threads")? as usize,
            ))
        });
        let prof = profiles.entry(p.geometry.clone()).or_insert_with(|| {
            Profile::read(&dir.join(format!("profiles/{}.json", p.geometry))).ok()
        });
        let Some(prof) = prof.as_ref() else {
            missing.push(format!("profiles/{}.json", p.geometry));
            continue;
        };
        let Some(bench) = prof.bench_bw else {
            missing.push(format!(
                "profiles/{}.json has no bench bandwidths",
                p.geometry
            ));
            continue;
        };
        let pred_path = dir.join(format!("predictions/{}.json", p.config));
        let Some(pred) = read_json(&pred_path) else {
            missing.push(pred_path.display().to_string());
            continue;
        };
        let model = ModelSpec::preset(&p.geometry)?;
        for strategy in GRID_STRATEGIES {
            let run_path = dir.join(format!("runs/{}-{strategy}.json", p.config));
            let Some(run) = read_json(&run_path) else {
                missing.push(run_path.display().to_string());
                continue;
            };
            let (Some(measured), Some(miss), Some(f)) = (
                num(&run, "/summary/tok_s_total"),
                num(&run, "/summary/miss_rate"),
                num(&run, "/fetch_fraction"),
            ) else {
                missing.push(format!("{} (no summary)", run_path.display()));
                continue;
            };
            let kind = match strategy {
                "hybrid-legacy" => None,
                s => Some(s.parse::<StrategyKind>()?),
            };
            let strat = kind.and_then(|k| {
                pred.pointer("/prediction/strategies")
                    .and_then(serde_json::Value::as_array)
                    .and_then(|a| {
                        a.iter().find(|s| {
                            s.get("kind").and_then(serde_json::Value::as_str) == Some(k.name())
                        })
                    })
            });
            let (predicted, lo, hi, pmiss) = match strat {
                Some(s) => (
                    num(s, "/tok_s_total"),
                    num(s, "/tok_s_total_interval/0"),
                    num(s, "/tok_s_total_interval/1"),
                    num(s, "/miss_rate"),
                ),
                // The legacy fraction as the model evaluates it (one step of every stream).
                None => (
                    num(&pred, "/prediction/legacy_fraction_step_us")
                        .map(|us| p.streams as f64 * 1e6 / us),
                    None,
                    None,
                    None,
                ),
            };
            let Some(predicted) = predicted else {
                missing.push(format!(
                    "{} (no prediction for {strategy})",
                    pred_path.display()
                ));
                continue;
            };
            rows.push(GridRow {
                config: p.config.clone(),
                geometry: p.geometry.clone(),
                layers: p.layers,
                expert_bytes: model.expert_bytes(),
                residency: p.residency,
                cache_slots: p.cache_slots,
                streams: p.streams,
                threads: p.threads,
                context: p.context,
                strategy: strategy.to_string(),
                fetch_fraction: f,
                measured_tok_s: measured,
                measured_miss_rate: miss,
                predicted_tok_s: predicted,
                predicted_tok_s_lo: lo,
                predicted_tok_s_hi: hi,
                predicted_miss_rate: pmiss,
                abs_rel_error: (predicted - measured).abs() / measured,
                bench_cpu_moe_gbs: bench.cpu_moe_gbs,
                bench_pcie_gather_gbs: bench.pcie_gather_gbs,
                bench_cpu_moe_overlap_gbs: bench.cpu_moe_overlap_gbs,
                bench_pcie_gather_overlap_gbs: bench.pcie_gather_overlap_gbs,
                threshold: legacy::DEFAULT_THRESHOLD,
                simulated_tok_s: None,
                host_steal: num(&run, "/host_steal_fraction"),
                stream_read_gbs: num(&run, "/cpu/stream_read_gbs"),
                probe_stream_read_gbs: probe_ceiling
                    .filter(|&(_, threads)| threads == p.threads)
                    .map(|(gbs, _)| gbs),
                cpu_speed: run
                    .pointer("/cpu/cpu_check")
                    .and_then(|c| serde_json::from_value::<CpuCheck>(c.clone()).ok())
                    .and_then(|check| prof.cpu_speed(&check).ok().flatten()),
            });
        }
    }
    Ok((rows, missing))
}

/// Write `rows` as a CSV file (its folder created), a header from the field names.
pub fn write_csv<T: Serialize>(path: &Path, rows: &[T]) -> Result<()> {
    if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::create_dir_all(dir).map_err(|e| ValidateError::io(dir, e))?;
    }
    let mut w = csv::Writer::from_path(path).map_err(|e| csv_error(path, "writing", e))?;
    for r in rows {
        w.serialize(r).map_err(|e| csv_error(path, "writing", e))?;
    }
    w.flush().map_err(|e| ValidateError::io(path, e))?;
    Ok(())
}

/// Read a CSV file of `T` rows; errors name the file and the row.
pub fn read_rows<T: for<'de> Deserialize<'de>>(path: &Path) -> Result<Vec<T>> {
    let mut r = csv::Reader::from_path(path).map_err(|e| csv_error(path, "reading", e))?;
    r.deserialize()
        .enumerate()
        .map(|(i, row)| row.map_err(|e| csv_error(path, &format!("row {}", i + 2), e)))
        .collect()
}

/// Read a grid CSV; errors name the file and row; a non-positive measured rate is refused.
pub fn read_csv(path: &Path) -> Result<Vec<GridRow>> {
    let rows: Vec<GridRow> = read_rows(path)?;
    if rows.is_empty() {
        return Err(ValidateError::invalid(
            path.display().to_string(),
            "no rows",
        ));
    }
    for (i, r) in rows.iter().enumerate() {
        if !(r.measured_tok_s > 0.0 && r.predicted_tok_s > 0.0) {
            return Err(ValidateError::invalid(
                format!("{}: row {}", path.display(), i + 2),
                "tok/s must be positive",
            ));
        }
        if !GRID_STRATEGIES.contains(&r.strategy.as_str()) {
            return Err(ValidateError::invalid(
                format!("{}: row {}", path.display(), i + 2),
                format!(
                    "strategy '{}' is not one of {}",
                    r.strategy,
                    GRID_STRATEGIES.join(", ")
                ),
            ));
        }
    }
    Ok(rows)
}

fn csv_error(path: &Path, what: &str, e: csv::Error) -> ValidateError {
    ValidateError::Csv {
        path: path.display().to_string(),
        message: format!("{what}: {e}"),
    }
}
