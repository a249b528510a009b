//! The sanity check the model must reach (shared/seeds): on the field report's host with
//! qwen3.8-flash-next at two streams and a cache giving offload about 38% misses, offload
//! sits at its PCIe bound (about 24 tok/s per stream) and hybrid comes out ahead, while the
//! legacy ratio (46.12 / 24.25 = 1.90 <= 2.0) says offload.

use ft_model::host::HostSpec;
use ft_model::perf::predict::{MissMode, PredictConfig};
use ft_model::perf::{decide, explain, predict, LegacyVerdict, PerfModel, Reason, Resource};
use ft_model::{ModelSpec, StrategyKind};

fn field(streams: usize) -> ft_model::perf::Prediction {
    let host = HostSpec::field_report();
    let perf = PerfModel::from_host(&host).unwrap();
    let model = ModelSpec::preset("qwen3.8-flash-next").unwrap();
    let config = PredictConfig {
        streams,
        // The report's prompts were about 1.2K tokens.
        context: 1200,
        miss: MissMode::FixedOffload { miss_rate: 0.38 },
        ..PredictConfig::default()
    };
    predict(&model, &perf, &config).unwrap()
}

#[test]
fn two_streams_offload_is_pcie_bound_and_hybrid_wins_against_the_ratio() {
    let p = field(2);
    let off = p.get(StrategyKind::Offload);
    let hy = p.get(StrategyKind::Hybrid);
    assert!(
        (off.miss_rate - 0.38).abs() < 0.01,
        "offload miss rate {}",
        off.miss_rate
    );

    // Offload: at its PCIe bound.
    assert_eq!(off.bound, Resource::Pcie);
    let pcie_bound_tok_s = 1e6 / off.busy.pcie_us;
    assert!(
        (22.0..=26.5).contains(&pcie_bound_tok_s),
        "the PCIe bound is about 24 tok/s per stream: {pcie_bound_tok_s}"
    );
    assert!(
        off.tok_s_per_stream <= pcie_bound_tok_s && off.tok_s_per_stream >= 0.85 * pcie_bound_tok_s,
        "offload {} against its bound {pcie_bound_tok_s}",
        off.tok_s_per_stream
    );

    // Hybrid ahead, clearly (the report measured +55% per stream).
    assert!(
        hy.tok_s_per_stream > 1.3 * off.tok_s_per_stream,
        "{} vs {}",
        hy.tok_s_per_stream,
        off.tok_s_per_stream
    );
    assert!(hy.counts.fetched < off.counts.fetched);
    assert!(hy.fetch_fraction > 0.05 && hy.fetch_fraction < 0.95);

    // The legacy ratio says offload.
    assert_eq!(p.legacy.verdict, LegacyVerdict::Offload);
    assert!(
        (p.legacy.ratio - 46.12 / 24.25).abs() < 1e-3,
        "{}",
        p.legacy.ratio
    );
    let d = decide(&p);
    assert_eq!(d.kind, StrategyKind::Hybrid);
    assert!(!d.legacy_agrees);
    assert!(!d.near_tie, "{}", d.log_line);
    assert!(
        d.log_line.contains("1.90") && d.log_line.contains("-> offload"),
        "{}",
        d.log_line
    );

    // The explanation says why, in numbers.
    let host = HostSpec::field_report();
    let perf = PerfModel::from_host(&host).unwrap();
    let e = explain(&p, &perf.params);
    assert!(e.text.contains("offload is pcie-bound at 3"), "{}", e.text);
    // ... and where offload's step is not the link's: the link's share of the critical
    // path, and the rest in series with it, in the prediction's own numbers.
    let off = p.get(StrategyKind::Offload);
    let share = format!(
        "The link holds {:.0}% of the step's critical path; the other {:.1} ms",
        100.0 * off.critical.pcie_us / off.step_us,
        (off.step_us - off.critical.pcie_us) / 1e3
    );
    assert!(e.text.contains(&share), "{share}\n{}", e.text);
    let over_step = format!(
        "at {:.1} GB/s over the whole step",
        off.link_bytes_per_step / (off.step_us * 1e3)
    );
    assert!(e.text.contains(&over_step), "{over_step}\n{}", e.text);
    assert!(off.critical.dense_us > 0.0 && off.critical.pcie_us < off.step_us);
    assert!(e.text.contains("verdict differs"), "{}", e.text);
    assert!(
        e.text.contains("2.77 MB") && e.text.contains("7.97 MB"),
        "{}",
        e.text
    );
    // The host's time per hybrid layer: a host spec has no fitted term, so it is the
    // gather's issue at hybrid's mean fetched experts per layer.
    let hy = p.get(StrategyKind::Hybrid);
    let per_layer = hy.counts.scaled(1.0 / p.layers as f64);
    let issue = perf.params.gather_fixed_us(per_layer.fetched);
    let host_us = e
        .reasons
        .iter()
        .find_map(|r| match r {
            Reason::FixedCosts { host_layer_us, .. } => Some(*host_layer_us),
            _ => None,
        })
        .expect("a fixed-cost reason");
    assert!(
        issue > 0.0 && (host_us - issue).abs() < 1e-9 * issue,
        "{host_us} vs {issue}"
    );
    assert!(e.text.contains("planning and submitting"), "{}", e.text);
    // The reference engine's automatic fraction (the report: 27.7%).
    let f = p.legacy.fetch_fraction.unwrap();
    assert!((f - 0.277).abs() < 0.005, "reference fraction {f}");
}

#[test]
fn one_stream_hybrid_also_wins() {
    let p = field(1);
    let off = p.get(StrategyKind::Offload);
    let hy = p.get(StrategyKind::Hybrid);
    assert_eq!(off.bound, Resource::Pcie);
    assert!(
        hy.tok_s_per_stream > off.tok_s_per_stream,
        "{} vs {}",
        hy.tok_s_per_stream,
        off.tok_s_per_stream
    );
    // Resident cannot hold 68 GB of experts on a 24 GB card.
    assert!(!p.get(StrategyKind::Resident).feasible);
}
