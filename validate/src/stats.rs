//! The statistics of a collected grid: prediction errors by group, interval coverage, the
//! machine's drift, and the model, the ratio rule and ferrox-core scored as choosers.

use serde::Serialize;
use std::collections::BTreeMap;

use ft_model::perf::legacy::{self, fraction_q16, LegacyVerdict};
use ft_runtime::instrument::STEAL_NOTABLE_FRACTION;

use crate::error::{Result, ValidateError};
use crate::grid::{
    TARGET_MEAN_LOSS, TARGET_MEDIAN_ERR, TARGET_P90_ERR, TARGET_SIM_MEDIAN_ERR, WRONG_PICK_GAP,
};
use crate::peer::peer;
use crate::rows::GridRow;

/// How one chooser did over the grid.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ChooserScore {
    /// Who chose (`model`, `ratio rule`, `ferrox-core`).
    pub chooser: String,
    /// Configurations scored (those where the chosen strategy was measured).
    pub configs: usize,
    /// Mean loss against the measured best: `1 - measured(choice) / measured(best)`.
    pub mean_loss: f64,
    /// Largest loss.
    pub max_loss: f64,
    /// Configurations where the choice was the measured best.
    pub best_picks: usize,
    /// Configurations where the choice was slower than the best by more than
    /// [`WRONG_PICK_GAP`].
    pub wrong_picks_over_gap: usize,
    /// How often each strategy was chosen.
    pub picks: BTreeMap<String, usize>,
}

/// Prediction errors of one group of rows.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ErrorStats {
    /// Rows.
    pub n: usize,
    /// Median absolute relative error.
    pub median: f64,
    /// 90th percentile absolute relative error.
    pub p90: f64,
    /// Mean signed relative error `(predicted - measured) / measured` (bias).
    pub mean_signed: f64,
    /// Largest absolute relative error.
    pub max: f64,
}

impl ErrorStats {
    /// The model's errors over `rows`.
    pub fn of(rows: &[&GridRow]) -> Option<ErrorStats> {
        Self::of_values(rows, |r| Some(r.predicted_tok_s))
    }

    /// The simulator's errors over the rows it simulated (`None` when it simulated none).
    pub fn of_simulated(rows: &[&GridRow]) -> Option<ErrorStats> {
        Self::of_values(rows, |r| r.simulated_tok_s)
    }

    /// Errors of the estimate `value` gives each row against its measured tok/s (rows
    /// without an estimate left out).
    pub fn of_values(
        rows: &[&GridRow],
        value: impl Fn(&GridRow) -> Option<f64>,
    ) -> Option<ErrorStats> {
        use statrs::statistics::{Data, OrderStatistics, Statistics};
        let signed: Vec<f64> = rows
            .iter()
            .filter_map(|r| value(r).map(|v| (v - r.measured_tok_s) / r.measured_tok_s))
            .collect();
        if signed.is_empty() {
            return None;
        }
        let abs: Vec<f64> = signed.iter().map(|x| x.abs()).collect();
        let mut d = Data::new(abs.clone());
        Some(ErrorStats {
            n: abs.len(),
            median: d.median(),
            p90: d.percentile(90),
            mean_signed: signed.mean(),
            max: abs.iter().copied().fold(0.0, f64::max),
        })
    }
}

/// One configuration's outcome.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ConfigOutcome {
    /// Configuration id.
    pub config: String,
    /// Geometry.
    pub geometry: String,
    /// Streams.
    pub streams: usize,
    /// The measured best strategy and its tok/s.
    pub best: String,
    /// Its measured tok/s.
    pub best_tok_s: f64,
    /// The model's choice (best predicted of offload, hybrid, cpu).
    pub model: String,
    /// The ratio rule's choice.
    pub ratio: String,
    /// ferrox-core's choice.
    pub ferrox: String,
    /// Losses of the three choices (absent where the chosen run is missing).
    pub model_loss: Option<f64>,
    /// See `model_loss`.
    pub ratio_loss: Option<f64>,
    /// See `model_loss`.
    pub ferrox_loss: Option<f64>,
}

/// The analysis of a grid.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Summary {
    /// Rows read.
    pub rows: usize,
    /// Configurations.
    pub configs: usize,
    /// Errors over every row.
    pub errors: ErrorStats,
    /// Errors per strategy.
    pub errors_by_strategy: BTreeMap<String, ErrorStats>,
    /// Errors per geometry.
    pub errors_by_geometry: BTreeMap<String, ErrorStats>,
    /// Errors per CPU thread count.
    pub errors_by_threads: BTreeMap<String, ErrorStats>,
    /// Errors per context length.
    pub errors_by_context: BTreeMap<String, ErrorStats>,
    /// Errors per thread count and strategy (the model's CPU terms scale with threads, and a
    /// bias of one strategy at one count is what a thread law gets wrong).
    pub errors_by_threads_and_strategy: BTreeMap<String, ErrorStats>,
    /// Errors over the configurations none of whose runs the hypervisor stole more than
    /// [`STEAL_NOTABLE_FRACTION`] of the CPU time from (absent where no row records steal).
    /// The targets are judged on every row all the same.
    pub errors_without_steal: Option<ErrorStats>,
    /// The configurations left out of `errors_without_steal`.
    pub stolen_configs: Vec<String>,
    /// The machine's CPU ceiling over the grid's runs: the same-run STREAM reads of the rows
    /// that recorded one, GB/s (absent where none did). Its spread is how far the machine
    /// itself moved while the grid ran.
    pub stream_read_gbs: Option<Spread>,
    /// Over the rows that recorded both readings: each run's ceiling over its probe's
    /// (`stream_read_gbs / probe_stream_read_gbs`), and the correlation of the rows'
    /// signed prediction errors with it (a model that is right up to the machine's drift
    /// errs high where the ratio is low).
    pub ceiling_drift: Option<CeilingDrift>,
    /// The same over the rows with a CPU speed (`cpu_speed`: the run's CPU check against the
    /// profile's): the CPU side's own speed, which the STREAM read only stands for.
    #[serde(default)]
    pub cpu_speed_drift: Option<CeilingDrift>,
    /// How often the measured tok/s fell inside the predicted interval (`ft predict`'s, 95%
    /// by default), over every row that has one (`all`) and per strategy: a model that knows
    /// its uncertainty covers about its confidence; empty where no row has an interval.
    pub interval_coverage: BTreeMap<String, Coverage>,
    /// The simulator's errors against the runtime over every simulated row (absent before
    /// `ft validate simulate`), and per strategy.
    pub sim_errors: Option<ErrorStats>,
    /// The simulator's errors per strategy.
    pub sim_errors_by_strategy: BTreeMap<String, ErrorStats>,
    /// The model, the ratio rule and ferrox-core as choosers.
    pub choosers: Vec<ChooserScore>,
    /// True when ferrox-core's split agreed with ft's planner at every geometry's fraction.
    pub ferrox_split_agrees: bool,
    /// Per configuration.
    pub outcomes: Vec<ConfigOutcome>,
    /// The targets.
    pub targets: BTreeMap<String, f64>,
    /// True when every target is met.
    pub targets_met: bool,
    /// The targets missed, in words.
    pub missed: Vec<String>,
}

/// The spread of a set of measurements.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct Spread {
    /// How many.
    pub n: usize,
    /// Their median.
    pub median: f64,
    /// The least.
    pub min: f64,
    /// The greatest.
    pub max: f64,
}

impl Spread {
    /// The spread of `v`; `None` when empty.
    pub fn of(v: &[f64]) -> Option<Self> {
        use statrs::statistics::{Data, OrderStatistics, Statistics};
        if v.is_empty() {
            return None;
        }
        Some(Spread {
            n: v.len(),
            median: Data::new(v.to_vec()).median(),
            min: v.min(),
            max: v.max(),
        })
    }
}

/// How many measurements fell inside their predicted interval (see
/// [`Summary::interval_coverage`]).
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct Coverage {
    /// Rows with an interval.
    pub n: usize,
    /// Of those, the rows whose measured tok/s is inside it.
    pub inside: usize,
}

impl Coverage {
    /// The coverage of `rows` (those without an interval do not count); `None` when none has
    /// one.
    pub fn of(rows: &[&GridRow]) -> Option<Self> {
        let with: Vec<(&GridRow, f64, f64)> = rows
            .iter()
            .filter_map(|r| Some((*r, r.predicted_tok_s_lo?, r.predicted_tok_s_hi?)))
            .collect();
        if with.is_empty() {
            return None;
        }
        Some(Coverage {
            n: with.len(),
            inside: with
                .iter()
                .filter(|(r, lo, hi)| (*lo..=*hi).contains(&r.measured_tok_s))
                .count(),
        })
    }

    /// The share inside, 0 to 1.
    pub fn share(&self) -> f64 {
        self.inside as f64 / self.n.max(1) as f64
    }
}

/// How the CPU ceiling moved between the probes and the runs (see [`Summary::ceiling_drift`]).
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct CeilingDrift {
    /// Run ceiling over probe ceiling, per row.
    pub ratio: Spread,
    /// Pearson correlation of the signed error (predicted over measured, minus 1) with the
    /// ratio; absent below 3 rows or without spread.
    pub error_correlation: Option<f64>,
}

impl CeilingDrift {
    /// Over the rows `ratio` gives a positive number for.
    pub fn of(rows: &[GridRow], ratio: impl Fn(&GridRow) -> Option<f64>) -> Option<Self> {
        use statrs::statistics::Statistics;
        let pairs: Vec<(f64, f64)> = rows
            .iter()
            .filter_map(|r| {
                let q = ratio(r)?;
                (q > 0.0 && r.measured_tok_s > 0.0)
                    .then(|| (q, r.predicted_tok_s / r.measured_tok_s - 1.0))
            })
            .collect();
        let ratios: Vec<f64> = pairs.iter().map(|p| p.0).collect();
        let errors: Vec<f64> = pairs.iter().map(|p| p.1).collect();
        let ratio = Spread::of(&ratios)?;
        let error_correlation = (pairs.len() >= 3)
            .then(|| {
                let c = ratios.iter().covariance(errors.iter());
                let d = ratios.iter().std_dev() * errors.iter().std_dev();
                (d > 0.0).then(|| c / d)
            })
            .flatten();
        Some(CeilingDrift {
            ratio,
            error_correlation,
        })
    }
}

/// The row a choice names: `offload`, `cpu`, or for hybrid the fraction it would run at
/// (the model's `hybrid`, the legacy rules' `hybrid-legacy`).
fn chosen_row<'a>(rows: &[&'a GridRow], strategy: &str) -> Option<&'a GridRow> {
    rows.iter().copied().find(|r| r.strategy == strategy)
}

/// `stats` of the rows grouped by `key`, the groups it gives nothing for left out.
fn group_rows<T>(
    rows: &[GridRow],
    key: &dyn Fn(&GridRow) -> String,
    stats: &dyn Fn(&[&GridRow]) -> Option<T>,
) -> BTreeMap<String, T> {
    let mut m: BTreeMap<String, Vec<&GridRow>> = BTreeMap::new();
    for r in rows {
        m.entry(key(r)).or_default().push(r);
    }
    m.into_iter()
        .filter_map(|(k, v)| stats(&v).map(|e| (k, e)))
        .collect()
}

/// Analyse grid rows (see the module docs); needs only the CSV.
pub fn analyze(rows: &[GridRow]) -> Result<Summary> {
    let mut by_config: BTreeMap<&str, Vec<&GridRow>> = BTreeMap::new();
    for r in rows {
        by_config.entry(&r.config).or_default().push(r);
    }
    let mut outcomes = Vec::new();
    let mut split_agrees = true;
    for (config, rs) in &by_config {
        let first = rs[0];
        let best = rs
            .iter()
            .copied()
            .max_by(|a, b| a.measured_tok_s.total_cmp(&b.measured_tok_s))
            .expect("a config has rows");
        let model_pick = rs
            .iter()
            .copied()
            .filter(|r| r.strategy != "hybrid-legacy")
            .max_by(|a, b| a.predicted_tok_s.total_cmp(&b.predicted_tok_s))
            .map(|r| r.strategy.clone())
            .unwrap_or_else(|| "offload".into());
        let ratio_pick = match legacy::recommend(
            first.bench_cpu_moe_gbs,
            first.bench_pcie_gather_gbs,
            first.threshold,
        ) {
            LegacyVerdict::Offload => "offload",
            LegacyVerdict::Hybrid => "hybrid-legacy",
        };
        let a = peer(
            first.bench_cpu_moe_gbs,
            first.bench_pcie_gather_gbs,
            first.bench_cpu_moe_overlap_gbs,
            first.bench_pcie_gather_overlap_gbs,
            first.threshold,
        )?;
        split_agrees &= a.split_agrees;
        if let Some(h) = chosen_row(rs, "hybrid-legacy") {
            // The run of the rules' hybrid must have used ferrox-core's fraction.
            if fraction_q16(h.fetch_fraction) != a.fraction_q16 {
                tracing::warn!(
                    config,
                    run = h.fetch_fraction,
                    ferrox = a.fraction,
                    "hybrid-legacy ran at another fraction than ferrox-core's"
                );
            }
        }
        let ferrox_pick = match a.verdict.as_str() {
            "hybrid" => "hybrid-legacy",
            "cpu" => "cpu",
            _ => "offload",
        };
        let loss =
            |s: &str| chosen_row(rs, s).map(|r| 1.0 - r.measured_tok_s / best.measured_tok_s);
        outcomes.push(ConfigOutcome {
            config: config.to_string(),
            geometry: first.geometry.clone(),
            streams: first.streams,
            best: best.strategy.clone(),
            best_tok_s: best.measured_tok_s,
            model_loss: loss(&model_pick),
            ratio_loss: loss(ratio_pick),
            ferrox_loss: loss(ferrox_pick),
            model: model_pick,
            ratio: ratio_pick.into(),
            ferrox: ferrox_pick.into(),
        });
    }
    let score =
        |name: &str, pick: &dyn Fn(&ConfigOutcome) -> (&str, Option<f64>)| -> ChooserScore {
            let mut picks = BTreeMap::new();
            let mut losses = Vec::new();
            let mut best_picks = 0;
            for o in &outcomes {
                let (s, l) = pick(o);
                *picks.entry(s.to_string()).or_insert(0) += 1;
                if let Some(l) = l {
                    losses.push(l);
                    if s == o.best || l <= 0.0 {
                        best_picks += 1;
                    }
                }
            }
            ChooserScore {
                chooser: name.into(),
                configs: losses.len(),
                mean_loss: if losses.is_empty() {
                    0.0
                } else {
                    losses.iter().sum::<f64>() / losses.len() as f64
                },
                max_loss: losses.iter().copied().fold(0.0, f64::max),
                best_picks,
                wrong_picks_over_gap: losses.iter().filter(|&&l| l > WRONG_PICK_GAP).count(),
                picks,
            }
        };
    let choosers = vec![
        score("model", &|o| (o.model.as_str(), o.model_loss)),
        score("ratio rule", &|o| (o.ratio.as_str(), o.ratio_loss)),
        score("ferrox-core", &|o| (o.ferrox.as_str(), o.ferrox_loss)),
    ];
    let all: Vec<&GridRow> = rows.iter().collect();
    let errors =
        ErrorStats::of(&all).ok_or_else(|| ValidateError::invalid("grid rows", "no rows"))?;
    // Errors per group of rows (`stats`: the model's or the simulator's).
    let group = |key: &dyn Fn(&GridRow) -> String,
                 stats: &dyn Fn(&[&GridRow]) -> Option<ErrorStats>| {
        group_rows(rows, key, stats)
    };
    let mut missed = Vec::new();
    if errors.median > TARGET_MEDIAN_ERR {
        missed.push(format!(
            "median error {:.1}% > {:.0}%",
            100.0 * errors.median,
            100.0 * TARGET_MEDIAN_ERR
        ));
    }
    if errors.p90 > TARGET_P90_ERR {
        missed.push(format!(
            "p90 error {:.1}% > {:.0}%",
            100.0 * errors.p90,
            100.0 * TARGET_P90_ERR
        ));
    }
    let m = &choosers[0];
    if m.mean_loss > TARGET_MEAN_LOSS {
        missed.push(format!(
            "model mean loss {:.2}% > {:.0}%",
            100.0 * m.mean_loss,
            100.0 * TARGET_MEAN_LOSS
        ));
    }
    if m.wrong_picks_over_gap > 0 {
        missed.push(format!(
            "the model picked a strategy slower than the best by more than {:.0}% in {} configuration(s)",
            100.0 * WRONG_PICK_GAP,
            m.wrong_picks_over_gap
        ));
    }
    let sim_errors = ErrorStats::of_simulated(&all);
    let sim_errors_by_strategy = group(&|r| r.strategy.clone(), &ErrorStats::of_simulated);
    if let Some(e) = &sim_errors {
        if e.median > TARGET_SIM_MEDIAN_ERR {
            missed.push(format!(
                "simulator median error {:.1}% > {:.0}%",
                100.0 * e.median,
                100.0 * TARGET_SIM_MEDIAN_ERR
            ));
        }
    }
    let targets = BTreeMap::from([
        (
            "sim_median_abs_rel_error".to_string(),
            TARGET_SIM_MEDIAN_ERR,
        ),
        ("median_abs_rel_error".to_string(), TARGET_MEDIAN_ERR),
        ("p90_abs_rel_error".to_string(), TARGET_P90_ERR),
        ("model_mean_loss".to_string(), TARGET_MEAN_LOSS),
        ("wrong_pick_gap".to_string(), WRONG_PICK_GAP),
    ]);
    let stolen_configs: Vec<String> = by_config
        .iter()
        .filter(|(_, rs)| {
            rs.iter()
                .any(|r| r.host_steal.is_some_and(|f| f > STEAL_NOTABLE_FRACTION))
        })
        .map(|(c, _)| c.to_string())
        .collect();
    let errors_without_steal = if rows.iter().any(|r| r.host_steal.is_some()) {
        let clean: Vec<&GridRow> = rows
            .iter()
            .filter(|r| !stolen_configs.contains(&r.config))
            .collect();
        ErrorStats::of(&clean)
    } else {
        None
    };
    let readings: Vec<f64> = rows.iter().filter_map(|r| r.stream_read_gbs).collect();
    let mut interval_coverage = group_rows(rows, &|r| r.strategy.clone(), &Coverage::of);
    if let Some(c) = Coverage::of(&rows.iter().collect::<Vec<_>>()) {
        interval_coverage.insert("all".into(), c);
    }
    Ok(Summary {
        interval_coverage,
        stream_read_gbs: Spread::of(&readings),
        ceiling_drift: CeilingDrift::of(rows, |r| {
            let probe = r.probe_stream_read_gbs.filter(|&p| p > 0.0)?;
            Some(r.stream_read_gbs? / probe)
        }),
        cpu_speed_drift: CeilingDrift::of(rows, |r| r.cpu_speed),
        rows: rows.len(),
        configs: outcomes.len(),
        errors,
        errors_by_strategy: group(&|r| r.strategy.clone(), &ErrorStats::of),
        errors_by_geometry: group(&|r| r.geometry.clone(), &ErrorStats::of),
        errors_by_threads: group(&|r| format!("{} threads", r.threads), &ErrorStats::of),
        errors_by_context: group(&|r| format!("context {}", r.context), &ErrorStats::of),
        errors_by_threads_and_strategy: group(
            &|r| format!("{} threads, {}", r.threads, r.strategy),
            &ErrorStats::of,
        ),
        errors_without_steal,
        stolen_configs,
        sim_errors,
        sim_errors_by_strategy,
        choosers,
        ferrox_split_agrees: split_agrees,
        outcomes,
        targets,
        targets_met: missed.is_empty(),
        missed,
    })
}
