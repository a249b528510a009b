//! The field report's directions (shared/seeds): on its host and model at a 38% offload
//! miss rate, offload sits at its PCIe bound (about 24 tok/s per stream at two streams) and
//! hybrid comes out ahead at one and at two streams, while the legacy ratio says offload.

use ft_sim::compare::{compare, CompareConfig, Comparison};
use ft_sim::field_report as fr;

fn run(streams: usize) -> Comparison {
    let host = ft_sim::hosts::resolve_host(fr::HOST).unwrap();
    let model = ft_model::ModelSpec::preset(fr::MODEL).unwrap();
    compare(&host, &model, &CompareConfig::field_report(streams)).unwrap()
}

#[test]
fn offload_is_pcie_bound_and_hybrid_wins_at_one_and_two_streams() {
    let two = run(2);
    let off = two.row("offload").unwrap();
    let hyb = two.row("hybrid").unwrap();
    // The cache was sized to the report's miss rate at two streams.
    assert!(
        (off.miss_rate - fr::OFFLOAD_MISS_RATE).abs() < 0.01,
        "{}",
        off.miss_rate
    );
    // Offload at its PCIe bound: the link holds most of its critical path, and the bound it
    // implies is the report's "about 24 tok/s per stream".
    assert_eq!(off.bound, "pcie");
    let pcie = off.sim.critical["pcie"];
    assert!(pcie > 0.8, "pcie share of offload's critical path {pcie}");
    let bound_tok_s = off.tok_s_per_stream / pcie;
    assert!(
        (22.0..26.0).contains(&bound_tok_s),
        "PCIe bound {bound_tok_s} tok/s per stream"
    );
    assert!(off.tok_s_per_stream <= bound_tok_s);
    assert!(
        (off.tok_s_per_stream - fr::OFFLOAD_TOK_S_PER_STREAM_2).abs()
            / fr::OFFLOAD_TOK_S_PER_STREAM_2
            < 0.15,
        "offload {} tok/s per stream against the reported ~{}",
        off.tok_s_per_stream,
        fr::OFFLOAD_TOK_S_PER_STREAM_2
    );
    // Hybrid exceeds offload's bound: its CPU-computed experts never cross the link.
    assert!(hyb.tok_s_per_stream > bound_tok_s);
    assert!(hyb.tok_s_per_stream > off.tok_s_per_stream * (1.0 + fr::HYBRID_GAIN_2 / 2.0));
    // Here hybrid misses a little more than offload on the same cache (only the misses it
    // fetches enter it); with a small per-layer cache and `recent` admission it can miss
    // less (`ft_model::plan`).
    assert!(hyb.miss_rate > off.miss_rate);
    assert_eq!(two.best, "hybrid");

    let one = run(1);
    let off1 = one.row("offload").unwrap();
    let hyb1 = one.row("hybrid").unwrap();
    assert!(hyb1.tok_s_per_stream > off1.tok_s_per_stream * (1.0 + fr::HYBRID_GAIN_1 / 2.0));
    assert_eq!(one.best, "hybrid");
    // The same cache at one stream: fewer distinct experts per layer, a lower miss rate.
    assert_eq!(one.cache.slots, two.cache.slots);
    assert!(off1.miss_rate < off.miss_rate);

    // The legacy rule, on the report's bench pair, keeps offload: the miss the report is about.
    for c in [&one, &two] {
        assert!(
            (c.legacy.ratio - fr::BENCH_RATIO).abs() < 1e-3,
            "{}",
            c.legacy.ratio
        );
        assert_eq!(c.legacy.verdict, "offload");
        assert_ne!(c.legacy.verdict, c.best);
    }

    // The figures printed beside the simulation: every row, each from the run it names.
    let rows = fr::beside(&[one.clone(), two.clone()]);
    let labels: Vec<&str> = rows.iter().map(|r| r.label.as_str()).collect();
    assert_eq!(
        labels,
        [
            "offload miss rate, 2 streams",
            "offload PCIe bound, 2 streams, tok/s/stream",
            "offload, 2 streams, tok/s/stream",
            "hybrid over offload per stream, 1 stream(s)",
            "hybrid over offload per stream, 2 stream(s)",
            "hybrid fetch fraction, 1 stream(s)",
            "legacy ratio -> verdict",
        ]
    );
    assert_eq!(rows[0].simulated, format!("{:.1}%", 100.0 * off.miss_rate));
    assert_eq!(rows[1].simulated, format!("{bound_tok_s:.1}"));
    let gain1 = one.hybrid_gain().unwrap();
    assert!((gain1 - (hyb1.tok_s_per_stream / off1.tok_s_per_stream - 1.0)).abs() < 1e-12);
    assert_eq!(rows[3].simulated, format!("{:+.0}%", 100.0 * gain1));
    assert_eq!(rows[6].reported, "1.902 -> offload");
    // Without the two-stream run, its rows are left out.
    assert_eq!(fr::beside(std::slice::from_ref(&one)).len(), 3);
    let json = serde_json::to_value(fr::reported()).unwrap();
    assert_eq!(json["offload_miss_rate_2_streams"], fr::OFFLOAD_MISS_RATE);
}
