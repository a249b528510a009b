//! The field report's measured figures (shared/seeds: the reference engine's issue #664),
//! printed beside the simulated ones and checked for direction by the tests.
//!
//! Host: RTX 4090 + 2 x Xeon Silver 4310 (`rtx4090-2x-xeon4310`); model: Qwen3.8-Flash-Next
//! NVFP4 (`qwen3.8-flash-next`); about 1.2K prompt tokens, 256 output tokens.

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
