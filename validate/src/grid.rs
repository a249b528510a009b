//! The validation grid: which configurations a GPU run measures, and in what order.

use serde::{Deserialize, Serialize};
use std::path::Path;

use ft_model::ModelSpec;

use crate::error::{Result, ValidateError};

/// The expert geometries of the grid, with the layers each runs (a few layers of the real
/// geometry: the per-layer costs are what the model predicts, and a bank of every layer would
/// not fill in the grid's time; deepseek-v4-flash's 43 layers also exceed the host's RAM).
pub const GRID_GEOMETRIES: [(&str, usize); 3] = [
    ("qwen3.8-flash-next", 2),
    ("bench-nvfp4", 2),
    ("deepseek-v4-flash", 1),
];

/// Cache residencies of the grid (share of the run's routed experts the GPU cache holds).
pub const GRID_RESIDENCIES: [f64; 3] = [0.05, 0.15, 0.35];
/// Stream counts of the grid.
pub const GRID_STREAMS: [usize; 4] = [1, 2, 4, 8];
/// CPU threads of the grid (the H200 machine has 16 cores: 15 leaves one for the host).
pub const GRID_THREADS: [usize; 2] = [4, 15];
/// Contexts of the grid, tokens (short and long).
pub const GRID_CONTEXTS: [usize; 2] = [1024, 32768];
/// Configurations per (geometry, streams) in the full grid (`--quick`: 1).
pub const GRID_PER_CELL: usize = 4;

/// Targets of the acceptance: median and 90th percentile of the absolute relative error of
/// predicted decode tok/s, and the model's mean loss against the measured best.
pub const TARGET_MEDIAN_ERR: f64 = 0.05;
/// See [`TARGET_MEDIAN_ERR`].
pub const TARGET_P90_ERR: f64 = 0.10;
/// See [`TARGET_MEDIAN_ERR`].
pub const TARGET_MEAN_LOSS: f64 = 0.02;
/// A pick slower than the best by more than this is a wrong pick that matters.
pub const WRONG_PICK_GAP: f64 = 0.05;
/// Target of the simulator against the runtime (issue #6): median absolute relative error of
/// simulated decode tok/s at most this.
pub const TARGET_SIM_MEDIAN_ERR: f64 = 0.10;

/// The strategies a grid configuration runs, with their CSV names.
pub const GRID_STRATEGIES: [&str; 4] = ["offload", "hybrid", "hybrid-legacy", "cpu"];

/// One configuration of the grid.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PlanRow {
    /// Identifier (`c07`), also the file stem of its runs and prediction.
    pub config: String,
    /// Model preset of the expert geometry.
    pub geometry: String,
    /// Layers run.
    pub layers: usize,
    /// The layer-reduced model file, relative to the output folder.
    pub model_toml: String,
    /// Cache residency (share of the run's routed experts).
    pub residency: f64,
    /// Cache slots that residency gives.
    pub cache_slots: usize,
    /// Streams.
    pub streams: usize,
    /// CPU threads.
    pub threads: usize,
    /// Context, tokens.
    pub context: usize,
}

/// The grid's configurations in run order (see the module docs of the experiment): for each
/// geometry and stream count, [`GRID_PER_CELL`] of the 12 (residency, threads, context)
/// combinations, rotated so that over the stream counts every geometry meets all 12; ordered
/// round by round, so a run cut short by its time budget still covers every geometry and
/// stream count.
pub fn grid(quick: bool) -> Result<Vec<PlanRow>> {
    let per = if quick { 1 } else { GRID_PER_CELL };
    let combos: Vec<(f64, usize, usize)> = GRID_RESIDENCIES
        .iter()
        .flat_map(|&r| {
            GRID_THREADS
                .iter()
                .flat_map(move |&t| GRID_CONTEXTS.iter().map(move |&c| (r, t, c)))
        })
        .collect();
    let mut rows = Vec::new();
    for j in 0..per {
        for (si, &streams) in GRID_STREAMS.iter().enumerate() {
            for (gi, &(name, layers)) in GRID_GEOMETRIES.iter().enumerate() {
                let (residency, threads, context) = combos[(gi * 5 + si * per + j) % combos.len()];
                let model = ModelSpec::preset(name)?.with_layers(layers);
                let total = model.geometry.total_experts() as f64;
                let cache_slots = ((residency * total).round() as usize).max(1);
                rows.push(PlanRow {
                    config: String::new(),
                    geometry: name.to_string(),
                    layers,
                    model_toml: format!("models/{name}-L{layers}.toml"),
                    residency,
                    cache_slots,
                    streams,
                    threads,
                    context,
                });
            }
        }
    }
    for (i, r) in rows.iter_mut().enumerate() {
        r.config = format!("c{i:02}");
    }
    Ok(rows)
}

/// Write the grid's `plan.csv` and its layer-reduced model TOML files into `out`; returns the
/// rows.
pub fn write_plan(out: &Path, quick: bool) -> Result<Vec<PlanRow>> {
    let rows = grid(quick)?;
    let models = out.join("models");
    std::fs::create_dir_all(&models).map_err(|e| ValidateError::io(&models, e))?;
    for &(name, layers) in &GRID_GEOMETRIES {
        let m = ModelSpec::preset(name)?.with_layers(layers);
        let path = out.join(format!("models/{name}-L{layers}.toml"));
        std::fs::write(&path, m.to_toml()).map_err(|e| ValidateError::io(&path, e))?;
    }
    crate::rows::write_csv(&out.join("plan.csv"), &rows)?;
    Ok(rows)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_grid_covers_every_level_of_every_factor() {
        let g = grid(false).unwrap();
        assert_eq!(g.len(), 3 * 4 * GRID_PER_CELL);
        for &(name, _) in &GRID_GEOMETRIES {
            let mine: Vec<&PlanRow> = g.iter().filter(|r| r.geometry == name).collect();
            let mut combos: Vec<(u64, usize, usize)> = mine
                .iter()
                .map(|r| ((r.residency * 100.0) as u64, r.threads, r.context))
                .collect();
            combos.sort_unstable();
            combos.dedup();
            assert_eq!(
                combos.len(),
                12,
                "{name}: every (residency, threads, context) once at least"
            );
            for s in GRID_STREAMS {
                assert_eq!(
                    mine.iter().filter(|r| r.streams == s).count(),
                    GRID_PER_CELL
                );
            }
        }
        // The first round covers every (geometry, streams) pair.
        let first: std::collections::BTreeSet<(String, usize)> = g
            .iter()
            .take(12)
            .map(|r| (r.geometry.clone(), r.streams))
            .collect();
        assert_eq!(first.len(), 12);
        let ids: std::collections::BTreeSet<&str> = g.iter().map(|r| r.config.as_str()).collect();
        assert_eq!(ids.len(), g.len());
        assert_eq!(grid(true).unwrap().len(), 12);
        // Residency becomes slots of the run's experts.
        let r = g
            .iter()
            .find(|r| r.geometry == "deepseek-v4-flash" && r.residency == 0.05)
            .unwrap();
        assert_eq!(r.cache_slots, 13);
    }
}
