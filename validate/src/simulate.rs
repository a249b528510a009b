//! The simulator leg: every row of a grid simulated on the host its profile describes.

use std::collections::BTreeMap;
use std::path::Path;

use ft_model::perf::legacy;
use ft_model::{ModelSpec, StrategyKind};

use crate::error::Result;
use crate::rows::GridRow;

/// Simulate every row of a grid with the discrete-event simulator, on the host the row's
/// profile describes (`profiles/<geometry>-t<threads>.json`, the one its prediction used):
/// the row's strategy (hybrid at the fetch fraction the run planned with), its model at its
/// layers, cache slots, streams and context, `typical` routing and LRU as `ft run` uses, and
/// the run's measured and warm-up steps; a context that grows by one per step with no
/// request ending (the runtime's closed loop over one request per stream). Returns the rows
/// simulated; a row whose profile is missing keeps an empty column (and is logged).
pub fn simulate_rows(
    profiles: &Path,
    rows: &mut [GridRow],
    steps: u64,
    warmup: u64,
    seed: u64,
) -> Result<usize> {
    use ft_model::FetchFraction;
    use ft_sim::compare::{compare, CacheChoice, CompareConfig};
    let mut hosts: BTreeMap<String, Option<ft_sim::hosts::SimHost>> = BTreeMap::new();
    let mut done = 0;
    for r in rows.iter_mut() {
        let name = format!("{}-t{}", r.geometry, r.threads);
        let host = hosts.entry(name.clone()).or_insert_with(|| {
            let path = profiles.join(format!("{name}.json"));
            match ft_sim::hosts::resolve_host(&path.display().to_string()) {
                Ok(h) => Some(h),
                Err(e) => {
                    tracing::warn!("{}: {e}", path.display());
                    None
                }
            }
        });
        let Some(host) = host.as_ref() else {
            continue;
        };
        let model = ModelSpec::preset(&r.geometry)?.with_layers(r.layers);
        let kind: StrategyKind = match r.strategy.as_str() {
            "hybrid-legacy" => StrategyKind::Hybrid,
            s => s.parse()?,
        };
        let cfg = CompareConfig {
            streams: r.streams,
            strategies: vec![kind],
            fetch: FetchFraction::Fixed(r.fetch_fraction),
            cpu_layers: ft_model::CpuLayers::Auto,
            cache: CacheChoice::Slots {
                slots: r.cache_slots,
            },
            cache_options: Default::default(),
            routing: "typical".into(),
            warmup_steps: warmup,
            steps,
            seed,
            jitter: 0.0,
            workload: ft_sim::decode::Workload {
                prompt_tokens: r.context as u64,
                output_tokens: warmup + steps + 1,
                prefill_ns: 0,
            },
            threshold: legacy::DEFAULT_THRESHOLD,
        };
        let c = compare(host, &model, &cfg).map_err(|e| {
            crate::ValidateError::invalid(
                format!("simulating {} {}", r.config, r.strategy),
                e.to_string(),
            )
        })?;
        r.simulated_tok_s = c.row(kind.name()).map(|row| row.sim.tok_s_total);
        done += usize::from(r.simulated_tok_s.is_some());
    }
    Ok(done)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::stats::analyze;
    use ft_model::profile::Profile;

    /// A profile of the field report's host spec (its prior, no samples) for
    /// qwen3.8-flash-next, and that model.
    fn field_profile() -> (Profile, ModelSpec) {
        let model = ModelSpec::preset("qwen3.8-flash-next").unwrap();
        let host = ft_model::host::HostSpec::field_report();
        (Profile::of_host_spec(&host, &model).unwrap(), model)
    }

    #[test]
    fn the_simulator_leg_fills_the_rows_whose_profile_exists() {
        let (p, model) = field_profile();
        let dir = tempfile::tempdir().unwrap();
        let t = p.params.cpu_threads;
        std::fs::write(
            dir.path().join(format!("qwen3.8-flash-next-t{t}.json")),
            serde_json::to_vec(&p).unwrap(),
        )
        .unwrap();
        let row = |strategy: &str, f: f64, threads: u32| GridRow {
            config: "c00".into(),
            geometry: "qwen3.8-flash-next".into(),
            layers: 2,
            expert_bytes: model.expert_bytes(),
            residency: 0.15,
            cache_slots: 154,
            streams: 2,
            threads: threads as usize,
            context: 1024,
            strategy: strategy.into(),
            fetch_fraction: f,
            measured_tok_s: 100.0,
            measured_miss_rate: 0.5,
            predicted_tok_s: 100.0,
            predicted_tok_s_lo: None,
            predicted_tok_s_hi: None,
            predicted_miss_rate: None,
            abs_rel_error: 0.0,
            bench_cpu_moe_gbs: 46.12,
            bench_pcie_gather_gbs: 24.25,
            bench_cpu_moe_overlap_gbs: None,
            bench_pcie_gather_overlap_gbs: None,
            threshold: 2.0,
            simulated_tok_s: None,
            host_steal: None,
            stream_read_gbs: None,
            probe_stream_read_gbs: None,
            cpu_speed: None,
        };
        let mut rows = vec![
            row("offload", 1.0, t),
            row("hybrid", 0.4, t),
            row("cpu", 0.0, t),
            row("offload", 1.0, t + 1), // no profile at this thread count
        ];
        let n = simulate_rows(dir.path(), &mut rows, 4, 2, 0).unwrap();
        assert_eq!(n, 3);
        for r in &rows[..3] {
            let v = r.simulated_tok_s.expect("simulated");
            assert!(v.is_finite() && v > 0.0, "{}: {v}", r.strategy);
        }
        assert!(rows[3].simulated_tok_s.is_none());
        // On the field report's host hybrid at 0.4 beats offload, as the simulator says
        // elsewhere; and the analysis reports the simulator's errors.
        assert!(rows[1].simulated_tok_s > rows[0].simulated_tok_s);
        let s = analyze(&rows).unwrap();
        assert_eq!(s.sim_errors.as_ref().unwrap().n, 3);
    }
}
