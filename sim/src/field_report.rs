//! The field report's measured figures (shared/seeds: the reference engine's issue #664),
//! printed beside the simulated ones and checked for direction by the tests.
//!
//! Host: RTX 4090 + 2 x Xeon Silver 4310 (`rtx4090-2x-xeon4310`); model: Qwen3.8-Flash-Next
//! NVFP4 (`qwen3.8-flash-next`); about 1.2K prompt tokens, 256 output tokens.

use serde::Serialize;

use crate::compare::Comparison;

/// Preset name of the report's host.
pub const HOST: &str = "rtx4090-2x-xeon4310";
/// Preset name of the report's model.
pub const MODEL: &str = "qwen3.8-flash-next";
/// Offload's miss rate at two distinct streams, as the report estimates it ("about 38%").
pub const OFFLOAD_MISS_RATE: f64 = 0.38;
/// Streams at which that miss rate was seen.
pub const MISS_RATE_STREAMS: usize = 2;
/// Offload's PCIe bound per stream at two streams ("roughly 23.9 tok/s per stream").
pub const OFFLOAD_TOK_S_PER_STREAM_2: f64 = 23.9;
/// Hybrid over offload, one stream: "about 21% faster".
pub const HYBRID_GAIN_1: f64 = 0.21;
/// Hybrid over offload per stream, two streams: "about 55% faster".
pub const HYBRID_GAIN_2: f64 = 0.55;
/// Hybrid's automatic fetch fraction in the report's runs (the reference engine's, from the
/// contended bench pair).
pub const HYBRID_FETCH_FRACTION: f64 = 0.277;
/// The fresh (not warmed) hybrid service, one stream, tok/s.
pub const HYBRID_FRESH_TOK_S_1: f64 = 30.81;
/// `ft bench bw` of the latest run: CPU-MoE and PCIe-gather GB/s, and their ratio.
pub const BENCH_CPU_MOE_GBS: f64 = 46.12;
/// See [`BENCH_CPU_MOE_GBS`].
pub const BENCH_PCIE_GATHER_GBS: f64 = 24.25;
/// The ratio the legacy rule saw (1.902 -> offload at threshold 2).
pub const BENCH_RATIO: f64 = 1.902;
/// Prompt tokens of the report's requests.
pub const PROMPT_TOKENS: u64 = 1200;
/// Output tokens of the report's requests.
pub const OUTPUT_TOKENS: u64 = 256;

/// The report's figures as `ft simulate --json` carries them beside a field-report run
/// (fields in alphabetical order, the order of the JSON).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ReportedFigures {
    /// [`HYBRID_FETCH_FRACTION`].
    pub hybrid_fetch_fraction: f64,
    /// [`HYBRID_GAIN_1`].
    pub hybrid_gain_1_stream: f64,
    /// [`HYBRID_GAIN_2`].
    pub hybrid_gain_per_stream_2_streams: f64,
    /// [`BENCH_RATIO`].
    pub legacy_ratio: f64,
    /// [`OFFLOAD_MISS_RATE`].
    pub offload_miss_rate_2_streams: f64,
    /// [`OFFLOAD_TOK_S_PER_STREAM_2`].
    pub offload_pcie_bound_tok_s_per_stream_2_streams: f64,
    /// Where the figures come from.
    pub source: &'static str,
}

/// The report's figures.
pub fn reported() -> ReportedFigures {
    ReportedFigures {
        hybrid_fetch_fraction: HYBRID_FETCH_FRACTION,
        hybrid_gain_1_stream: HYBRID_GAIN_1,
        hybrid_gain_per_stream_2_streams: HYBRID_GAIN_2,
        legacy_ratio: BENCH_RATIO,
        offload_miss_rate_2_streams: OFFLOAD_MISS_RATE,
        offload_pcie_bound_tok_s_per_stream_2_streams: OFFLOAD_TOK_S_PER_STREAM_2,
        source: "shared/seeds (reference engine issue #664)",
    }
}

/// One figure of the report beside the simulation's, as text.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct BesideRow {
    /// What is compared.
    pub label: String,
    /// The report's figure.
    pub reported: String,
    /// The simulation's.
    pub simulated: String,
}

fn pct(x: f64) -> String {
    format!("{:.1}%", 100.0 * x)
}

/// The report's figures beside those of the simulated comparisons `cs` (one per stream
/// count): offload's miss rate, PCIe bound and speed at two streams, hybrid's gain at one
/// and two, hybrid's fetch fraction and the legacy verdict at the first stream count. A
/// figure whose comparison or strategy was not simulated is left out.
pub fn beside(cs: &[Comparison]) -> Vec<BesideRow> {
    let row = |label: String, reported: String, simulated: String| BesideRow {
        label,
        reported,
        simulated,
    };
    let by = |b: usize| cs.iter().find(|c| c.streams == b);
    let mut rows = Vec::new();
    if let Some(off) = by(2).and_then(|c| c.row("offload")) {
        let pcie_share = off.sim.critical.get("pcie").copied().unwrap_or(0.0);
        let bound = if pcie_share > 0.0 {
            off.tok_s_per_stream / pcie_share
        } else {
            f64::NAN
        };
        rows.push(row(
            "offload miss rate, 2 streams".into(),
            pct(OFFLOAD_MISS_RATE),
            pct(off.miss_rate),
        ));
        rows.push(row(
            "offload PCIe bound, 2 streams, tok/s/stream".into(),
            format!("~{OFFLOAD_TOK_S_PER_STREAM_2:.1}"),
            format!("{bound:.1}"),
        ));
        rows.push(row(
            "offload, 2 streams, tok/s/stream".into(),
            "near the bound".into(),
            format!("{:.1}", off.tok_s_per_stream),
        ));
    }
    for (b, reported) in [(1, HYBRID_GAIN_1), (2, HYBRID_GAIN_2)] {
        if let Some(g) = by(b).and_then(Comparison::hybrid_gain) {
            rows.push(row(
                format!("hybrid over offload per stream, {b} stream(s)"),
                format!("+{:.0}%", 100.0 * reported),
                format!("{:+.0}%", 100.0 * g),
            ));
        }
    }
    if let Some(c) = cs.first() {
        if let Some(h) = c.row("hybrid") {
            rows.push(row(
                format!("hybrid fetch fraction, {} stream(s)", c.streams),
                format!("{} (legacy)", pct(HYBRID_FETCH_FRACTION)),
                format!("{} (model)", pct(h.fetch_fraction)),
            ));
        }
        rows.push(row(
            "legacy ratio -> verdict".into(),
            format!("{BENCH_RATIO:.3} -> offload"),
            format!("{:.3} -> {}", c.legacy.ratio, c.legacy.verdict),
        ));
    }
    rows
}
