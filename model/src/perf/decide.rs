//! The decision (best strategy, margin, near tie) and its explanation in numbers.
//!
//! The decision takes the feasible strategy of the highest predicted total tok/s. Its
//! margin is relative to the runner-up; a **near tie** is declared only when the two
//! strategies' tok/s intervals overlap *and* the margin is inside the noise of a measured
//! run ([`noise_margin`]: what two runs of the same decode differ by). Intervals that overlap
//! because the parameters are uncertain (a host spec's prior is wide) while the margin is
//! far beyond the noise are not a tie: the choice says that its margin rests on the
//! parameters, and the break-evens ([`super::breakeven`]) say how far they must be off.
//!
//! The explanation says per strategy which resource bounds it and with what numbers, and,
//! where the legacy ratio's verdict differs from the model's choice, which mechanisms the
//! ratio cannot see made the difference here: the bytes that never cross the link (CPU
//! experts), the expert size the bench measured at against the served one, hybrid's own
//! miss rate, DRAM contention, fixed costs and the dense part of the step.

use serde::{Deserialize, Serialize};
use std::fmt::Write as _;

use super::legacy::{BenchBw, LegacyRatio, LegacyVerdict};
use super::predict::{Prediction, StrategyPrediction};
use super::step::Resource;
use super::{ExpertShape, PerfParams};
use crate::strategy::{Strategy, StrategyKind};

/// The model's choice.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Decision {
    /// The chosen strategy (hybrid with its fetch fraction).
    pub choice: Strategy,
    /// Its kind.
    pub kind: StrategyKind,
    /// Predicted tok/s of all streams of the choice.
    pub tok_s_total: f64,
    /// The runner-up among the feasible strategies.
    pub runner_up: Option<StrategyKind>,
    /// `choice / runner-up - 1` in total tok/s (0 without a runner-up).
    pub margin: f64,
    /// True when the choice's and the runner-up's tok/s intervals overlap and the margin is
    /// inside the run-to-run noise ([`Decision::noise_margin`]).
    pub near_tie: bool,
    /// True when the choice's and the runner-up's tok/s intervals overlap.
    #[serde(default)]
    pub intervals_overlap: bool,
    /// The margin two measured runs of equal speed can show at the intervals' confidence
    /// (relative, 0.1 = 10%; [`noise_margin`]).
    #[serde(default)]
    pub noise_margin: f64,
    /// The legacy rule's verdict.
    pub legacy_verdict: LegacyVerdict,
    /// True when the legacy verdict names the chosen strategy.
    pub legacy_agrees: bool,
    /// The one line a serve start logs: legacy ratio and verdict, every prediction, the
    /// choice and its margin.
    pub log_line: String,
}

/// Decide from a prediction. A layer split with no CPU layer is resident's (or, cached,
/// offload's) work under another name: it is not ranked beside them.
pub fn decide(pred: &Prediction) -> Decision {
    let mut feasible: Vec<&StrategyPrediction> = pred
        .strategies
        .iter()
        .filter(|s| s.feasible && !(s.kind.takes_cpu_layers() && s.cpu_layers == Some(0)))
        .collect();
    feasible.sort_by(|a, b| b.tok_s_total.total_cmp(&a.tok_s_total));
    let best = feasible
        .first()
        .copied()
        .unwrap_or_else(|| pred.get(StrategyKind::Offload));
    let runner = feasible.get(1).copied();
    let margin = runner
        .map(|r| best.tok_s_total / r.tok_s_total - 1.0)
        .unwrap_or(0.0);
    let intervals_overlap = runner
        .map(|r| r.tok_s_total_interval[1] >= best.tok_s_total_interval[0])
        .unwrap_or(false);
    let noise = runner
        .map(|r| noise_margin(best, r, pred.config.confidence))
        .unwrap_or(0.0);
    let near_tie = intervals_overlap && margin <= noise;
    let legacy_agrees = match pred.legacy.verdict {
        LegacyVerdict::Offload => best.kind == StrategyKind::Offload,
        LegacyVerdict::Hybrid => best.kind == StrategyKind::Hybrid,
    };
    let mut line = format!(
        "legacy ratio {:.2} ({:.2}/{:.2} GB/s at {:.2} MB experts) vs threshold {:.2} -> {}; predicted tok/s per stream at {} stream(s):",
        pred.legacy.ratio,
        pred.legacy.cpu_moe_gbs,
        pred.legacy.pcie_gather_gbs,
        pred.legacy.expert_bytes as f64 / 1e6,
        pred.legacy.threshold,
        pred.legacy.verdict,
        pred.config.streams
    );
    for s in &pred.strategies {
        if s.feasible {
            let _ = write!(
                line,
                " {} {:.1} [{:.1}, {:.1}];",
                s.strategy,
                s.tok_s_per_stream,
                s.tok_s_per_stream_interval[0],
                s.tok_s_per_stream_interval[1]
            );
        } else {
            let _ = write!(line, " {} infeasible;", s.strategy);
        }
    }
    let _ = write!(line, " choice {}", best.strategy);
    if let Some(r) = runner {
        let _ = write!(line, ", {:+.1}% over {}", 100.0 * margin, r.kind);
    }
    line.push_str(&tie_note(near_tie, intervals_overlap, noise));
    Decision {
        choice: best.strategy,
        kind: best.kind,
        tok_s_total: best.tok_s_total,
        runner_up: runner.map(|r| r.kind),
        margin,
        near_tie,
        intervals_overlap,
        noise_margin: noise,
        legacy_verdict: pred.legacy.verdict,
        legacy_agrees,
        log_line: line,
    }
}

/// The relative margin two measured runs of equal speed can show at `confidence`: the
/// run-to-run noise and the routing's sampling error of both strategies' step times,
/// combined (`exp(q sqrt(a^2 + b^2)) - 1`, with `a` and `b` their relative standard
/// deviations without the parameters' part, `q` the normal quantile). The parameters'
/// uncertainty is left out on purpose: it moves both predictions together far more than
/// it separates them, and the break-evens say what it would take.
pub fn noise_margin(a: &StrategyPrediction, b: &StrategyPrediction, confidence: f64) -> f64 {
    let rel = |s: &StrategyPrediction| {
        let u = &s.uncertainty;
        (u.run_noise_us.powi(2) + u.sampling_us.powi(2)).sqrt() / s.step_us.max(f64::MIN_POSITIVE)
    };
    let q = statrs::distribution::Normal::new(0.0, 1.0)
        .map(|n| {
            use statrs::distribution::ContinuousCDF;
            n.inverse_cdf(0.5 + confidence.clamp(0.0, 0.999_999) / 2.0)
        })
        .unwrap_or(1.96);
    (q * (rel(a).powi(2) + rel(b).powi(2)).sqrt()).exp() - 1.0
}

/// The decision's note on its confidence, for one-line reports ("" when the intervals are
/// apart).
pub fn tie_note(near_tie: bool, overlap: bool, noise: f64) -> String {
    if near_tie {
        format!(
            " (near tie: the intervals overlap and the margin is inside the run-to-run noise of {:.1}%)",
            100.0 * noise
        )
    } else if overlap {
        format!(
            " (the intervals overlap through the parameters' uncertainty; the margin exceeds the run-to-run noise of {:.1}%)",
            100.0 * noise
        )
    } else {
        String::new()
    }
}

/// What one strategy's step is made of, in numbers (per step; every stream decodes one
/// token per step).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct StrategyStory {
    /// The strategy.
    pub strategy: Strategy,
    /// Whether it can run.
    pub feasible: bool,
    /// The bounding resource.
    pub bound: Resource,
    /// Step time, in ms.
    pub step_ms: f64,
    /// tok/s per stream.
    pub tok_s_per_stream: f64,
    /// Expert-level miss rate.
    pub miss_rate: f64,
    /// Misses per step.
    pub misses: f64,
    /// Experts crossing the link per step.
    pub link_experts: f64,
    /// Bytes crossing the link per step.
    pub link_bytes: f64,
    /// Link busy time per step, in ms.
    pub link_ms: f64,
    /// Experts computed on the CPU per step.
    pub cpu_experts: f64,
    /// CPU busy time per step, in ms.
    pub cpu_ms: f64,
    /// Hybrid round trips per step, in ms.
    pub sync_ms: f64,
    /// Dense part per step, in ms.
    pub dense_ms: f64,
    /// GPU expert compute per step, in ms.
    pub gpu_ms: f64,
    /// Time lost to DRAM contention per step, in ms.
    pub contention_ms: f64,
    /// The sentence describing it.
    pub text: String,
}

/// A mechanism the legacy ratio cannot see, with the numbers that make it matter here.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "kebab-case")]
pub enum Reason {
    /// CPU-computed experts never cross the link: the two sides add up instead of the
    /// slower one bounding.
    LinkBytes {
        /// Offload's bytes over the link per step.
        offload_bytes: f64,
        /// Hybrid's bytes over the link per step.
        hybrid_bytes: f64,
        /// Hybrid's CPU experts per step.
        hybrid_cpu_experts: f64,
        /// Offload's link time per step, in ms.
        offload_link_ms: f64,
        /// Hybrid's link and CPU busy times per step, in ms.
        hybrid_link_ms: f64,
        /// Hybrid's CPU busy time per step, in ms.
        hybrid_cpu_ms: f64,
        /// The sentence.
        text: String,
    },
    /// The bench measured at another expert size: at the served size fixed costs weigh
    /// differently.
    ExpertSize {
        /// Bytes of the bench's experts.
        bench_bytes: f64,
        /// Bytes of the served experts.
        served_bytes: f64,
        /// The model's bench at the served size: CPU-MoE, in GB/s.
        served_cpu_gbs: f64,
        /// The model's bench at the served size: gather, in GB/s.
        served_gather_gbs: f64,
        /// Their ratio.
        served_ratio: f64,
        /// The sentence.
        text: String,
    },
    /// Hybrid's cache fills only with fetched experts, so its miss rate differs.
    MissRates {
        /// Offload's miss rate.
        offload: f64,
        /// Hybrid's miss rate.
        hybrid: f64,
        /// The sentence.
        text: String,
    },
    /// CPU kernels and DMA share DRAM.
    Contention {
        /// The contended pair the reference engine's fraction uses: CPU, in GB/s.
        cpu_gbs: f64,
        /// The contended pair: gather, in GB/s.
        gather_gbs: f64,
        /// Hybrid's time lost to contention per step, in ms.
        lost_ms: f64,
        /// The sentence.
        text: String,
    },
    /// Fixed CPU costs per layer and per expert.
    FixedCosts {
        /// Hybrid's fixed CPU time per step, in ms.
        cpu_fixed_ms: f64,
        /// Hybrid's round trips per step, in ms.
        sync_ms: f64,
        /// The host thread's own time (planning, submitting) per hybrid layer at its mean
        /// counts, in us ([`PerfParams::host_layer_us`]).
        #[serde(default)]
        host_layer_us: f64,
        /// The sentence.
        text: String,
    },
    /// The dense part dilutes any MoE difference.
    Dense {
        /// Dense time per step, in ms.
        dense_ms: f64,
        /// Its share of the chosen strategy's step.
        share: f64,
        /// The sentence.
        text: String,
    },
}

impl Reason {
    /// The sentence.
    pub fn text(&self) -> &str {
        match self {
            Reason::LinkBytes { text, .. }
            | Reason::ExpertSize { text, .. }
            | Reason::MissRates { text, .. }
            | Reason::Contention { text, .. }
            | Reason::FixedCosts { text, .. }
            | Reason::Dense { text, .. } => text,
        }
    }
}

/// Why the model chose what it chose, and why the ratio said what it said.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Explanation {
    /// The decision.
    pub decision: Decision,
    /// The legacy rule.
    pub legacy: LegacyRatio,
    /// One story per strategy.
    pub strategies: Vec<StrategyStory>,
    /// Mechanisms behind the difference (all of them when the verdicts agree, as context).
    pub reasons: Vec<Reason>,
    /// The sentence on the intervals (near tie, what dominates the uncertainty).
    pub confidence: String,
    /// Everything as text.
    pub text: String,
}

fn mb(bytes: f64) -> f64 {
    bytes / 1e6
}

/// Where offload's step is not the link's: the link's share of the step's critical path and
/// the parts in series with it, which a ratio of bandwidths takes as zero: the dense part (a
/// layer's fetch starts only after its router), the expert kernels the copies do not hide
/// (at least the last fetched chunk's, after the last copy), the calibrated fixed costs. On
/// the GPU machine at one stream this is what keeps offload at 81 to 84% of its PCIe bound
/// (experiments/runtime-grid, "What one and two streams can reach").
fn offload_off_link(s: &StrategyPrediction) -> String {
    let c = &s.critical;
    let off = (s.step_us - c.pcie_us).max(0.0);
    format!(
        "The link holds {:.0}% of the step's critical path; the other {:.1} ms are in series with it (the dense part, which the fetch waits for, {:.1}; expert kernels the link does not hide {:.1}; calibrated fixed costs {:.1}), so offload moves its bytes at {:.1} GB/s over the whole step, not at the link's {:.1}.",
        100.0 * c.pcie_us / s.step_us,
        off / 1e3,
        c.dense_us / 1e3,
        c.gpu_us / 1e3,
        (c.other_us + c.sync_us + c.cpu_us) / 1e3,
        s.link_bytes_per_step / (s.step_us * 1e3),
        s.link_bytes_per_step / (s.busy.pcie_us * 1e3),
    )
}

fn story(pred: &Prediction, s: &StrategyPrediction) -> StrategyStory {
    let misses = s.counts.misses();
    let link_ms = s.busy.pcie_us / 1e3;
    let cpu_ms = s.busy.cpu_us / 1e3;
    let step_ms = s.step_us / 1e3;
    let eb = pred.expert_bytes as f64;
    let link_gbs = if s.busy.pcie_us > 0.0 {
        s.link_bytes_per_step / (s.busy.pcie_us * 1e3)
    } else {
        0.0
    };
    let text = match s.kind {
        StrategyKind::Offload => {
            let mut text = format!(
                "offload is {}-bound at {:.1}% misses: {:.1} experts x {:.2} MB per step over {:.1} GB/s = {:.1} ms of its {:.1} ms step ({:.1} tok/s per stream; dense {:.1} ms).",
                s.bound,
                100.0 * s.miss_rate,
                s.counts.fetched,
                mb(eb),
                link_gbs,
                link_ms,
                step_ms,
                s.tok_s_per_stream,
                s.critical.dense_us / 1e3
            );
            if s.critical.pcie_us > 0.0 && s.busy.pcie_us > 0.0 {
                text.push(' ');
                text.push_str(&offload_off_link(s));
            }
            text
        }
        StrategyKind::Hybrid => {
            // The two resources holding most of the critical path (layers differ in which
            // side is longer).
            let mut on_path: Vec<(Resource, f64)> = Resource::ALL
                .iter()
                .map(|r| (*r, s.critical.get(*r)))
                .filter(|(r, t)| *t > 0.0 && *r != Resource::Dense)
                .collect();
            on_path.sort_by(|a, b| b.1.total_cmp(&a.1));
            let path: Vec<String> = on_path
                .iter()
                .take(2)
                .map(|(r, t)| format!("{r} {:.1} ms", t / 1e3))
                .collect();
            format!(
                "{} is {}-bound (critical path beyond dense: {}) at {:.1}% misses: it moves {:.1} of its {:.1} misses per step ({:.1}%) over the link in {:.1} ms and computes the other {:.1} on the CPU in {:.1} ms, both at once (round trips {:.1} ms; DRAM contention stretches the two sides by {:.1} ms in total); its step is {:.1} ms ({:.1} tok/s per stream).",
                s.strategy,
                s.bound,
                path.join(", "),
                100.0 * s.miss_rate,
                s.counts.fetched,
                misses,
                if misses > 0.0 { 100.0 * s.counts.fetched / misses } else { 0.0 },
                link_ms,
                s.counts.cpu,
                cpu_ms,
                s.busy.sync_us / 1e3,
                s.contention_us / 1e3,
                step_ms,
                s.tok_s_per_stream
            )
        }
        StrategyKind::Resident => {
            if s.feasible {
                format!(
                    "resident is {}-bound: every expert on the GPU, {:.1} ms per step ({:.1} tok/s per stream).",
                    s.bound, step_ms, s.tok_s_per_stream
                )
            } else {
                format!(
                    "resident would take {:.1} ms per step ({:.1} tok/s per stream) but cannot run: {}.",
                    step_ms,
                    s.tok_s_per_stream,
                    s.note.as_deref().unwrap_or("not enough GPU memory")
                )
            }
        }
        StrategyKind::Cpu => format!(
            "cpu is {}-bound: {:.1} experts per step on the CPU in {:.1} ms ({:.1} tok/s per stream).",
            s.bound, s.counts.cpu, cpu_ms, s.tok_s_per_stream
        ),
        StrategyKind::LayerSplit | StrategyKind::LayerSplitCached => {
            let split = pred.layer_split.clone().unwrap_or_default();
            let n = s.cpu_layers.unwrap_or(0);
            let rest = if s.kind == StrategyKind::LayerSplit {
                format!(
                    "the other {} resident (the GPU's expert memory holds {} layers' experts, so at least {} go to the CPU)",
                    pred.layers - n,
                    pred.layers - split.min_cpu_layers,
                    split.min_cpu_layers
                )
            } else {
                format!(
                    "the other {} cached with every miss gathered ({:.1} experts per step over the link in {:.1} ms)",
                    pred.layers - n,
                    s.counts.fetched,
                    link_ms
                )
            };
            let searched = if split.fixed {
                "N given".to_string()
            } else {
                let points = if s.kind == StrategyKind::LayerSplit {
                    &split.resident
                } else {
                    &split.cached
                };
                format!(
                    "N searched over {} count(s) from {} to {}",
                    points.len(),
                    points.first().map_or(0, |p| p.cpu_layers),
                    points.last().map_or(0, |p| p.cpu_layers)
                )
            };
            let verdict = if s.feasible {
                String::new()
            } else {
                format!(" It cannot run: {}.", s.note.as_deref().unwrap_or("not enough GPU memory"))
            };
            format!(
                "{} is {}-bound: the experts of the first {n} of {} layers on the CPU ({:.1} experts per step in {:.1} ms), {rest}; {:.1} ms per step ({:.1} tok/s per stream; {searched}).{verdict}",
                s.strategy,
                s.bound,
                pred.layers,
                s.counts.cpu,
                cpu_ms,
                step_ms,
                s.tok_s_per_stream
            )
        }
    };
    StrategyStory {
        strategy: s.strategy,
        feasible: s.feasible,
        bound: s.bound,
        step_ms,
        tok_s_per_stream: s.tok_s_per_stream,
        miss_rate: s.miss_rate,
        misses,
        link_experts: s.counts.fetched,
        link_bytes: s.link_bytes_per_step,
        link_ms,
        cpu_experts: s.counts.cpu,
        cpu_ms,
        sync_ms: s.busy.sync_us / 1e3,
        dense_ms: s.busy.dense_us / 1e3,
        gpu_ms: s.busy.gpu_us / 1e3,
        contention_ms: s.contention_us / 1e3,
        text,
    }
}

/// Explain a prediction made with parameters `p` (needed to evaluate the bench at the served
/// expert size).
pub fn explain(pred: &Prediction, p: &PerfParams) -> Explanation {
    let decision = decide(pred);
    let stories: Vec<StrategyStory> = pred.strategies.iter().map(|s| story(pred, s)).collect();
    let off = pred.get(StrategyKind::Offload);
    let hy = pred.get(StrategyKind::Hybrid);
    let chosen = pred.get(decision.kind);
    let legacy = pred.legacy;
    let mut reasons = Vec::new();

    // 1. Bytes over the link.
    {
        let text = format!(
            "A CPU-computed expert never crosses the link: offload moves {:.0} MB per step in {:.1} ms, hybrid {:.0} MB in {:.1} ms while its CPU computes {:.1} experts in {:.1} ms beside it. The ratio asks whether the CPU alone beats the link by {:.1}x; overlapped, the two add up, so hybrid can win with a slower CPU (and lose when fixed costs, contention or its higher miss rate eat the gain).",
            mb(off.link_bytes_per_step),
            off.busy.pcie_us / 1e3,
            mb(hy.link_bytes_per_step),
            hy.busy.pcie_us / 1e3,
            hy.counts.cpu,
            hy.busy.cpu_us / 1e3,
            legacy.threshold
        );
        reasons.push(Reason::LinkBytes {
            offload_bytes: off.link_bytes_per_step,
            hybrid_bytes: hy.link_bytes_per_step,
            hybrid_cpu_experts: hy.counts.cpu,
            offload_link_ms: off.busy.pcie_us / 1e3,
            hybrid_link_ms: hy.busy.pcie_us / 1e3,
            hybrid_cpu_ms: hy.busy.cpu_us / 1e3,
            text,
        });
    }
    // 2. Expert size.
    {
        let served = ExpertShape {
            bytes: pred.expert_bytes as f64,
            macs: p.bench_expert.macs * pred.expert_bytes as f64 / p.bench_expert.bytes,
        };
        let at = BenchBw::modelled_at(p, served, p.bench_experts);
        let ratio = at.cpu_moe_gbs / at.pcie_gather_gbs;
        let text = format!(
            "The bench measured {:.2} MB experts; the served ones are {:.2} MB. At that size the model's bench reads CPU-MoE {:.2} GB/s and gather {:.2} GB/s (ratio {:.2}, against {:.2} at the bench's size): per-expert and per-layer fixed costs weigh {} on small experts.",
            mb(legacy.expert_bytes as f64),
            mb(pred.expert_bytes as f64),
            at.cpu_moe_gbs,
            at.pcie_gather_gbs,
            ratio,
            legacy.ratio,
            if ratio < legacy.ratio { "more against the CPU" } else { "more against the link" }
        );
        reasons.push(Reason::ExpertSize {
            bench_bytes: legacy.expert_bytes as f64,
            served_bytes: pred.expert_bytes as f64,
            served_cpu_gbs: at.cpu_moe_gbs,
            served_gather_gbs: at.pcie_gather_gbs,
            served_ratio: ratio,
            text,
        });
    }
    // 3. Miss rates.
    reasons.push(Reason::MissRates {
        offload: off.miss_rate,
        hybrid: hy.miss_rate,
        text: format!(
            "Only fetched misses enter hybrid's cache, so its miss rate is {:.1}% against offload's {:.1}% on the same cache and routing ({} slots, {} stream(s)).",
            100.0 * hy.miss_rate,
            100.0 * off.miss_rate,
            pred.cache_slots,
            pred.config.streams
        ),
    });
    // 4. Contention.
    {
        let c = legacy.cpu_moe_gbs;
        let g = legacy.pcie_gather_gbs;
        let m = BenchBw::modelled(p);
        let (co, go) = (
            m.cpu_moe_overlap_gbs.unwrap_or(c),
            m.pcie_gather_overlap_gbs.unwrap_or(g),
        );
        reasons.push(Reason::Contention {
            cpu_gbs: co,
            gather_gbs: go,
            lost_ms: hy.contention_us / 1e3,
            text: format!(
                "CPU kernels and DMA share host DRAM ({:.0} GB/s): contending, the bench's pair falls from {:.2} / {:.2} to {:.2} / {:.2} GB/s (CPU / gather), which costs hybrid {:.2} ms per step; the reference engine's fraction from that pair is {:.1}%, the model's optimum {:.1}%.",
                p.dram_gbs,
                m.cpu_moe_gbs,
                m.pcie_gather_gbs,
                co,
                go,
                hy.contention_us / 1e3,
                100.0 * legacy.fetch_fraction.unwrap_or(f64::NAN),
                100.0 * hy.fetch_fraction
            ),
        });
    }
    // 5. Fixed costs.
    {
        // Every layer with CPU work pays the layer cost; at these counts that is (nearly)
        // every layer, so this is an upper bound.
        let fixed = if hy.counts.cpu > 0.0 {
            pred.layers as f64 * p.cpu_layer_us
                + hy.counts.cpu * p.cpu_expert_cost_us(p.cpu_threads as f64)
        } else {
            0.0
        };
        let per_layer = hy.counts.scaled(1.0 / (pred.layers as f64).max(1.0));
        let host = p.host_layer_us(&per_layer, pred.config.streams as f64);
        reasons.push(Reason::FixedCosts {
            cpu_fixed_ms: fixed / 1e3,
            sync_ms: hy.busy.sync_us / 1e3,
            host_layer_us: host,
            text: format!(
                "Fixed costs the bandwidths do not show: hybrid's CPU pays up to {:.0} us per layer and {:.1} us per expert ({:.2} ms per step), and {:.2} ms of GPU-CPU round trips, the host's own time among them: {:.0} us per layer planning and submitting the layer, which the one host thread does between CPU shares.",
                p.cpu_layer_us,
                p.cpu_expert_us,
                fixed / 1e3,
                hy.busy.sync_us / 1e3,
                host
            ),
        });
    }
    // 6. Dense.
    {
        let dense_ms = chosen.critical.dense_us / 1e3;
        let share = chosen.critical.dense_us / chosen.step_us;
        reasons.push(Reason::Dense {
            dense_ms,
            share,
            text: format!(
                "The dense part (attention at {} tokens of context, router, shared experts) takes {:.1} ms per step, {:.0}% of the chosen step; it is the same for every strategy and shrinks their differences as context grows.",
                pred.config.context,
                dense_ms,
                100.0 * share
            ),
        });
    }

    let confidence = {
        let mut t = if decision.near_tie {
            format!(
                "Near tie: the intervals of {} and {} overlap and the margin of {:.1}% is inside the run-to-run noise ({:.1}%), so no measurement of one run each could separate them.",
                decision.kind,
                decision.runner_up.map(|k| k.name()).unwrap_or("-"),
                100.0 * decision.margin,
                100.0 * decision.noise_margin
            )
        } else if let (true, Some(r)) = (decision.intervals_overlap, decision.runner_up) {
            format!(
                "The intervals of {} and {} overlap, but the margin of {:.1}% is beyond the run-to-run noise ({:.1}%): what could reverse it is the parameters being off, by the amounts the break-evens give.",
                decision.kind,
                r,
                100.0 * decision.margin,
                100.0 * decision.noise_margin
            )
        } else if let Some(r) = decision.runner_up {
            format!(
                "The intervals of {} and {} do not overlap: the margin of {:.1}% is larger than the uncertainty.",
                decision.kind,
                r,
                100.0 * decision.margin
            )
        } else {
            "No other strategy can run.".to_string()
        };
        if !chosen.uncertainty.top_params.is_empty() {
            let names: Vec<String> = chosen
                .uncertainty
                .top_params
                .iter()
                .map(|(id, sd)| format!("{id} ({:.2} ms)", sd / 1e3))
                .collect();
            let _ = write!(
                t,
                " The chosen strategy's interval is widest from {}; a probe fit narrows it.",
                names.join(", ")
            );
        }
        t
    };

    let mut text = String::new();
    let _ = writeln!(
        text,
        "Legacy rule: {:.2} / {:.2} GB/s = {:.2} {} {:.2} -> {}.",
        legacy.cpu_moe_gbs,
        legacy.pcie_gather_gbs,
        legacy.ratio,
        if legacy.ratio > legacy.threshold {
            ">"
        } else {
            "<="
        },
        legacy.threshold,
        legacy.verdict
    );
    let _ = writeln!(
        text,
        "Model: {} at {:.1} tok/s per stream ({:.1} total), {:+.1}% over {}.",
        decision.choice,
        chosen.tok_s_per_stream,
        chosen.tok_s_total,
        100.0 * decision.margin,
        decision.runner_up.map(|k| k.name()).unwrap_or("-")
    );
    if decision.legacy_agrees {
        let _ = writeln!(text, "The ratio's verdict and the model agree.");
    } else {
        let legacy_tok_s = match legacy.verdict {
            LegacyVerdict::Offload => off.tok_s_per_stream,
            LegacyVerdict::Hybrid => pred
                .legacy_fraction_step_us
                .map(|t| 1e6 / t)
                .unwrap_or(hy.tok_s_per_stream),
        };
        let _ = writeln!(
            text,
            "The ratio's verdict differs: the model predicts {} at {:.1} tok/s per stream against {:.1} for {} ({:+.1}%).",
            legacy.verdict,
            legacy_tok_s,
            chosen.tok_s_per_stream,
            decision.choice,
            100.0 * (chosen.tok_s_per_stream / legacy_tok_s - 1.0)
        );
    }
    text.push('\n');
    for s in &stories {
        let _ = writeln!(text, "- {}", s.text);
    }
    if let (Some(f), Some(t)) = (legacy.fetch_fraction, pred.legacy_fraction_step_us) {
        let _ = writeln!(
            text,
            "- hybrid at the reference engine's fraction {:.1}% would take {:.1} ms per step ({:.1} tok/s per stream).",
            100.0 * f,
            t / 1e3,
            1e6 / t
        );
    }
    text.push('\n');
    let _ = writeln!(
        text,
        "{} the ratio cannot see:",
        if decision.legacy_agrees {
            "Mechanisms"
        } else {
            "Why the verdicts differ: mechanisms"
        }
    );
    for r in &reasons {
        let _ = writeln!(text, "- {}", r.text());
    }
    text.push('\n');
    let _ = writeln!(text, "{confidence}");

    Explanation {
        decision,
        legacy,
        strategies: stories,
        reasons,
        confidence,
        text,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::host::HostSpec;
    use crate::perf::predict::{predict, PredictConfig};
    use crate::perf::PerfModel;
    use crate::preset::ModelSpec;

    fn prediction() -> Prediction {
        let model = ModelSpec::preset("qwen3.8-flash-next").unwrap();
        let perf = PerfModel::from_host(&HostSpec::field_report()).unwrap();
        let config = PredictConfig {
            warmup_steps: 20,
            steps: 30,
            ..PredictConfig::default()
        };
        predict(&model, &perf, &config).unwrap()
    }

    /// Set offload's and hybrid's tok/s and intervals (total = per stream at one stream), and
    /// make the others infeasible.
    fn two(pred: &mut Prediction, offload: [f64; 3], hybrid: [f64; 3]) {
        for s in &mut pred.strategies {
            let v = match s.kind {
                StrategyKind::Offload => offload,
                StrategyKind::Hybrid => hybrid,
                _ => {
                    s.feasible = false;
                    continue;
                }
            };
            s.feasible = true;
            s.tok_s_total = v[1];
            s.tok_s_per_stream = v[1];
            s.tok_s_total_interval = [v[0], v[2]];
            s.step_us = 1e6 / v[1];
        }
    }

    #[test]
    fn a_wide_margin_with_overlapping_intervals_is_not_a_near_tie() {
        let mut pred = prediction();
        // The docs' example 3 before the fix: +36% and +55% margins labelled near ties
        // because a host prior's intervals are wide.
        two(&mut pred, [14.1, 19.6, 32.2], [20.0, 30.4, 40.5]);
        let d = decide(&pred);
        assert_eq!(d.kind, StrategyKind::Hybrid);
        assert!(d.margin > 0.5, "{}", d.margin);
        assert!(d.intervals_overlap);
        assert!(
            d.noise_margin > 0.0 && d.noise_margin < 0.2,
            "{}",
            d.noise_margin
        );
        assert!(!d.near_tie, "{}", d.log_line);
        assert!(
            d.log_line.contains("exceeds the run-to-run noise"),
            "{}",
            d.log_line
        );
    }

    #[test]
    fn a_margin_inside_the_noise_with_overlapping_intervals_is_a_near_tie() {
        let mut pred = prediction();
        two(&mut pred, [70.0, 84.0, 99.0], [72.0, 85.0, 100.0]);
        let d = decide(&pred);
        assert!(d.margin < d.noise_margin, "{} {}", d.margin, d.noise_margin);
        assert!(d.near_tie, "{}", d.log_line);
        assert!(d.log_line.contains("near tie"), "{}", d.log_line);
        // Apart intervals are never a tie, however small the margin.
        two(&mut pred, [83.0, 84.0, 84.5], [84.6, 85.0, 86.0]);
        let d = decide(&pred);
        assert!(!d.intervals_overlap && !d.near_tie, "{}", d.log_line);
    }

    #[test]
    fn the_noise_margin_grows_with_the_run_noise() {
        let pred = prediction();
        let (o, h) = (
            pred.get(StrategyKind::Offload),
            pred.get(StrategyKind::Hybrid),
        );
        let m = noise_margin(o, h, 0.95);
        let mut noisier = h.clone();
        noisier.uncertainty.run_noise_us *= 3.0;
        assert!(noise_margin(o, &noisier, 0.95) > m);
        assert!(noise_margin(o, h, 0.5) < m);
    }
}
