//! Per step and per layer timelines of the decode engine, their summaries, and the Chrome trace.
//!
//! The engine knows when each piece of work ran on which resource (a GPU kernel, a PCIe copy,
//! the CPU pool's share of a layer, the host blocked on the device) and what the layer's plan
//! said (hits, misses, fetched, CPU-computed). This module turns those into the numbers the
//! performance model is fitted to and that `ft run` prints: busy time per resource per layer
//! and per step, waits, counts, decode tok/s and utilisation; and into a Chrome trace
//! (JSON trace-event format, one lane per resource) that chrome://tracing and Perfetto open.
//!
//! Times are integer nanoseconds on the device's clock ([`crate::device::Clock`], whose
//! microseconds the engine converts with [`ns_of_us`]); GPU events are on the same axis. Busy time on a lane is the length of the union of its spans, so two
//! overlapping kernels on one lane are not counted twice.

use serde::{Deserialize, Serialize};
use std::io::Write;
use std::path::Path;

use crate::error::{Result, RuntimeError};

/// Nanoseconds per microsecond.
const NS_PER_US: f64 = 1e3;
/// Microseconds per second.
const US_PER_S: f64 = 1e6;

/// Nanoseconds (rounded, clamped at 0) of a time in microseconds on the device clock.
pub fn ns_of_us(us: f64) -> u64 {
    (us * NS_PER_US).round().max(0.0) as u64
}

/// The machine's CPU time since boot by kind, from the `cpu` line of Linux's `/proc/stat`
/// (clock ticks summed over every CPU). Two readings around a run give the share of the
/// machine's CPU time the hypervisor took from this VM while it ran ("steal"): a decode whose
/// CPU pool spins on every core stalls at each stolen slice, so a run measured while the host
/// stole time does not measure this machine's serving speed (`ft validate analyze` reports
/// the errors without such runs beside all of them).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct HostCpuTimes {
    /// Ticks doing work or waiting on nothing: user, nice, system, idle, iowait, irq, softirq.
    pub own: u64,
    /// Ticks stolen by the hypervisor.
    pub steal: u64,
}

impl HostCpuTimes {
    /// Parse the aggregate `cpu` line of a `/proc/stat` text; `None` if it has none (or too
    /// few fields: kernels before 2.6.11 had no steal column).
    pub fn parse(proc_stat: &str) -> Option<HostCpuTimes> {
        let line = proc_stat.lines().find(|l| l.starts_with("cpu "))?;
        let v: Vec<u64> = line
            .split_whitespace()
            .skip(1)
            .map(|f| f.parse().ok())
            .collect::<Option<Vec<u64>>>()?;
        if v.len() < 8 {
            return None;
        }
        Some(HostCpuTimes {
            own: v[..7].iter().sum(),
            steal: v[7],
        })
    }

    /// The reading now; `None` where `/proc/stat` cannot be read (not Linux).
    pub fn now() -> Option<HostCpuTimes> {
        Self::parse(&std::fs::read_to_string("/proc/stat").ok()?)
    }

    /// Ticks from `earlier` to `self`: (own, stolen).
    pub fn since(&self, earlier: &HostCpuTimes) -> (u64, u64) {
        (
            self.own.saturating_sub(earlier.own),
            self.steal.saturating_sub(earlier.steal),
        )
    }
}

/// Stolen share of the machine's CPU time above which a run's timing is not taken as the
/// machine's own (2%): on the H200 VM (2026-12-04) runs overlapping steal bursts of 10 to 17%
/// decoded two to three times slower than their neighbours, while the rest of the grid saw
/// at most 0.2%.
pub const STEAL_NOTABLE_FRACTION: f64 = 0.02;

/// Stolen share of the machine's CPU time over intervals: stolen ticks over all ticks.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct StealMeter {
    own: u64,
    steal: u64,
}

impl StealMeter {
    /// Add the interval between two readings.
    pub fn add(&mut self, start: &HostCpuTimes, end: &HostCpuTimes) {
        let (own, steal) = end.since(start);
        self.own += own;
        self.steal += steal;
    }

    /// The stolen share of every interval added, 0 to 1; `None` before any tick.
    pub fn fraction(&self) -> Option<f64> {
        let all = self.own + self.steal;
        (all > 0).then(|| self.steal as f64 / all as f64)
    }
}

/// A resource of the timeline: one lane (Chrome trace `tid`) each.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Lane {
    /// The GPU's compute stream: dense part, expert kernels, combine.
    GpuCompute,
    /// The copy engine and the PCIe link: expert gathers, activation copies.
    Copy,
    /// The CPU pool computing a layer's CPU share.
    CpuPool,
    /// The host thread: planning and submitting, and blocked on the device.
    HostSync,
}

impl Lane {
    /// Every lane, in trace order.
    pub const ALL: [Lane; 4] = [Lane::GpuCompute, Lane::Copy, Lane::CpuPool, Lane::HostSync];

    /// Chrome trace thread id of the lane.
    pub fn tid(self) -> u32 {
        match self {
            Lane::GpuCompute => 1,
            Lane::Copy => 2,
            Lane::CpuPool => 3,
            Lane::HostSync => 4,
        }
    }

    /// Name shown in the trace viewer.
    pub fn label(self) -> &'static str {
        match self {
            Lane::GpuCompute => "GPU compute",
            Lane::Copy => "copy / PCIe",
            Lane::CpuPool => "CPU pool",
            Lane::HostSync => "host sync",
        }
    }
}

/// What a span of work was.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum SpanKind {
    /// The dense part of a layer (attention and dense weights, KV reads).
    Dense,
    /// Preparing the experts' input rows (replicating the activations per top-k position).
    Prepare,
    /// Expert kernels over experts already resident (hits).
    HitExperts,
    /// Expert kernels over experts gathered this layer.
    FetchedExperts,
    /// Residual add of the combined expert output and normalisation.
    Combine,
    /// Host-to-device gather of missed experts into cache slots.
    Gather,
    /// Device-to-host copy of a layer's activations for the CPU pool.
    ActivationsDown,
    /// Host-to-device copy of the CPU pool's outputs (a zero-copy read of their rows).
    PartialUp,
    /// The CPU pool computing its experts.
    CpuExperts,
    /// The host planning the layer and submitting its work.
    Submit,
    /// The host blocked on the device (an event or a stream).
    Wait,
}

impl SpanKind {
    /// Name shown in the trace viewer.
    pub fn label(self) -> &'static str {
        match self {
            SpanKind::Dense => "dense",
            SpanKind::Prepare => "prepare inputs",
            SpanKind::HitExperts => "experts (hits)",
            SpanKind::FetchedExperts => "experts (fetched)",
            SpanKind::Combine => "combine",
            SpanKind::Gather => "gather",
            SpanKind::ActivationsDown => "activations D2H",
            SpanKind::PartialUp => "cpu partial H2D",
            SpanKind::CpuExperts => "cpu experts",
            SpanKind::Submit => "plan + submit",
            SpanKind::Wait => "wait",
        }
    }
}

/// One piece of work on one lane, on the run's clock.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Span {
    /// The resource it occupied.
    pub lane: Lane,
    /// What it was.
    pub kind: SpanKind,
    /// Decode step (the engine's count, from 0, warm-up included).
    pub step: u64,
    /// MoE layer.
    pub layer: u32,
    /// Start, ns on the run's clock.
    pub start_ns: u64,
    /// End, ns on the run's clock (at least `start_ns`).
    pub end_ns: u64,
    /// Bytes moved (copies) or read (kernels), where known; 0 otherwise.
    #[serde(default)]
    pub bytes: u64,
    /// Experts involved, where it applies; 0 otherwise.
    #[serde(default)]
    pub experts: u32,
}

impl Span {
    /// Duration in ns.
    pub fn dur_ns(&self) -> u64 {
        self.end_ns.saturating_sub(self.start_ns)
    }
}

/// Length (ns) of the union of `[start, end)` intervals.
pub fn union_ns(intervals: impl IntoIterator<Item = (u64, u64)>) -> u64 {
    let mut v: Vec<(u64, u64)> = intervals.into_iter().filter(|(s, e)| e > s).collect();
    v.sort_unstable();
    let mut total = 0u64;
    let mut cur: Option<(u64, u64)> = None;
    for (s, e) in v {
        match cur {
            Some((cs, ce)) if s <= ce => cur = Some((cs, ce.max(e))),
            Some((cs, ce)) => {
                total += ce - cs;
                cur = Some((s, e));
            }
            None => cur = Some((s, e)),
        }
    }
    if let Some((cs, ce)) = cur {
        total += ce - cs;
    }
    total
}

/// Busy time (us) of `lane` over the spans that `keep` selects.
fn busy_us(spans: &[Span], lane: Lane, keep: impl Fn(&Span) -> bool) -> f64 {
    union_ns(
        spans
            .iter()
            .filter(|s| s.lane == lane && keep(s))
            .map(|s| (s.start_ns, s.end_ns)),
    ) as f64
        / NS_PER_US
}

/// What a layer's plan said, as counts (from `ft_model::plan::LayerPlan`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LayerCounts {
    /// Distinct experts of the layer found in the cache.
    pub hits: u32,
    /// Distinct experts of the layer not in the cache (`fetched + cpu`).
    pub misses: u32,
    /// Misses gathered over the link into the cache.
    pub fetched: u32,
    /// Misses computed on the CPU from the host bank.
    pub cpu: u32,
    /// (token, expert) pairs computed on the GPU (hits and fetched).
    pub gpu_tokens: u32,
    /// (token, expert) pairs computed on the CPU.
    pub cpu_tokens: u32,
    /// Bytes gathered over the link for this layer's fetched experts.
    pub gathered_bytes: u64,
}

/// One layer of one step: what the plan said and what each resource did.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LayerRecord {
    /// MoE layer.
    pub layer: u32,
    /// The plan's counts.
    #[serde(flatten)]
    pub counts: LayerCounts,
    /// First span of the layer, us after the step's start.
    pub start_us: f64,
    /// Last span's end, us after the step's start.
    pub end_us: f64,
    /// GPU compute stream busy, us.
    pub gpu_busy_us: f64,
    /// Copy engine / PCIe busy, us.
    pub pcie_busy_us: f64,
    /// Bytes over PCIe in both directions (gathers and activation copies).
    pub pcie_bytes: u64,
    /// CPU pool busy, us.
    pub cpu_busy_us: f64,
    /// Host blocked on the device, us.
    pub host_wait_us: f64,
    /// Host planning and submitting, us.
    pub host_submit_us: f64,
}

/// One decode step: totals and the layers.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct StepRecord {
    /// Decode step (from 0, warm-up included).
    pub step: u64,
    /// True for a warm-up step (left out of the summary).
    pub warmup: bool,
    /// Concurrent streams (tokens decoded this step).
    pub streams: u32,
    /// Start of the step on the device clock, us.
    pub start_us: f64,
    /// Wall time of the step, us (submit of the first work to the outputs being ready).
    pub wall_us: f64,
    /// GPU compute busy, us.
    pub gpu_busy_us: f64,
    /// PCIe busy, us.
    pub pcie_busy_us: f64,
    /// Bytes over PCIe (both directions).
    pub pcie_bytes: u64,
    /// CPU pool busy, us.
    pub cpu_busy_us: f64,
    /// Host blocked on the device, us.
    pub host_wait_us: f64,
    /// Sum of the layers' counts.
    pub totals: LayerCounts,
    /// Per layer, in order.
    pub layers: Vec<LayerRecord>,
    /// What held the step while no gather was on the link ([`LinkIdle::of`]); `None` for a
    /// step without gathers (or recorded before it existed).
    #[serde(default)]
    pub link_idle: Option<LinkIdle>,
}

/// What the other resources were doing while no gather was on the link during a step, us.
///
/// In a step bounded by the link, every microsecond without a gather is one the link cannot
/// get back: its share of the step is what keeps offload from its PCIe bound. Each such
/// instant is charged to one thing, the first of: a GPU kernel (by kind), the CPU pool, an
/// activation copy, the host (submitting or waiting), and otherwise a gap (launch latency
/// and event hops nothing records). A gather span runs from the later of its layer's router
/// and the previous gather's end to its last copy landing, so the waits between a layer's
/// copies count as link time, not idle time (the link's own rate shows those).
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LinkIdle {
    /// Time in the step with no gather on the link.
    pub total_us: f64,
    /// ... while the GPU ran the dense part (before the router, and the shared experts).
    pub dense_us: f64,
    /// ... while the GPU prepared the experts' input rows.
    pub prepare_us: f64,
    /// ... while the GPU computed the hits.
    pub hit_experts_us: f64,
    /// ... while the GPU computed gathered experts (the last chunk's, after the last copy).
    pub fetched_experts_us: f64,
    /// ... while the GPU combined the experts' outputs.
    pub combine_us: f64,
    /// ... while only the CPU pool worked.
    pub cpu_us: f64,
    /// ... while only activation copies (down for the CPU, its partial rows up) ran.
    pub copies_us: f64,
    /// ... while only the host submitted or waited.
    pub host_us: f64,
    /// ... while nothing recorded ran.
    pub gaps_us: f64,
}

/// What an instant of idle link is charged to, in priority order (see [`LinkIdle`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum IdleCause {
    Dense,
    Prepare,
    HitExperts,
    FetchedExperts,
    Combine,
    Cpu,
    Copies,
    Host,
}

impl IdleCause {
    const COUNT: usize = 8;

    /// What a span would be charged as; `None` for a gather (the link busy).
    fn of(s: &Span) -> Option<IdleCause> {
        Some(match (s.lane, s.kind) {
            (_, SpanKind::Gather) => return None,
            (Lane::GpuCompute, SpanKind::Prepare) => IdleCause::Prepare,
            (Lane::GpuCompute, SpanKind::HitExperts) => IdleCause::HitExperts,
            (Lane::GpuCompute, SpanKind::FetchedExperts) => IdleCause::FetchedExperts,
            (Lane::GpuCompute, SpanKind::Combine) => IdleCause::Combine,
            (Lane::GpuCompute, _) => IdleCause::Dense,
            (Lane::CpuPool, _) => IdleCause::Cpu,
            (Lane::Copy, _) => IdleCause::Copies,
            (Lane::HostSync, _) => IdleCause::Host,
        })
    }
}

impl LinkIdle {
    /// The idle link of one step `[start_ns, end_ns)` with `spans` (spans are clipped to the
    /// step); `None` when no span is a gather. A sweep over the spans' ends, O(n log n).
    pub fn of(spans: &[Span], start_ns: u64, end_ns: u64) -> Option<LinkIdle> {
        if !spans.iter().any(|s| s.kind == SpanKind::Gather) {
            return None;
        }
        // (time, +1 / -1, slot): slot COUNT is the gather, the others an IdleCause.
        let mut edges: Vec<(u64, i32, usize)> = Vec::with_capacity(2 * spans.len());
        for s in spans {
            let (a, b) = (s.start_ns.max(start_ns), s.end_ns.min(end_ns));
            if b <= a {
                continue;
            }
            let slot = IdleCause::of(s).map_or(IdleCause::COUNT, |c| c as usize);
            edges.push((a, 1, slot));
            edges.push((b, -1, slot));
        }
        edges.sort_unstable();
        let mut active = [0i32; IdleCause::COUNT + 1];
        let mut charged = [0u64; IdleCause::COUNT];
        let (mut gaps, mut total) = (0u64, 0u64);
        let mut at = start_ns;
        let mut charge = |from: u64, to: u64, active: &[i32; IdleCause::COUNT + 1]| {
            if to <= from || active[IdleCause::COUNT] > 0 {
                return;
            }
            total += to - from;
            match active[..IdleCause::COUNT].iter().position(|&n| n > 0) {
                Some(c) => charged[c] += to - from,
                None => gaps += to - from,
            }
        };
        for (t, delta, slot) in edges {
            charge(at, t, &active);
            at = at.max(t);
            active[slot] += delta;
        }
        charge(at, end_ns, &active);
        let us = |ns: u64| ns as f64 / NS_PER_US;
        let c = |cause: IdleCause| us(charged[cause as usize]);
        Some(LinkIdle {
            total_us: us(total),
            dense_us: c(IdleCause::Dense),
            prepare_us: c(IdleCause::Prepare),
            hit_experts_us: c(IdleCause::HitExperts),
            fetched_experts_us: c(IdleCause::FetchedExperts),
            combine_us: c(IdleCause::Combine),
            cpu_us: c(IdleCause::Cpu),
            copies_us: c(IdleCause::Copies),
            host_us: c(IdleCause::Host),
            gaps_us: us(gaps),
        })
    }

    /// Every field scaled by `k` (a mean over steps, a share per layer).
    pub fn scaled(&self, k: f64) -> LinkIdle {
        let mut out = *self;
        for (o, v) in out.fields_mut().into_iter().zip(self.fields()) {
            *o = v * k;
        }
        out
    }

    /// The causes by name with their time, largest first (the total left out).
    pub fn causes(&self) -> Vec<(&'static str, f64)> {
        let mut v: Vec<(&'static str, f64)> = Self::NAMES[1..]
            .iter()
            .copied()
            .zip(self.fields()[1..].iter().copied())
            .collect();
        v.sort_by(|a, b| b.1.total_cmp(&a.1));
        v
    }

    /// Field names in [`LinkIdle::fields`] order, as a table says them.
    const NAMES: [&'static str; 10] = [
        "total",
        "dense",
        "prepare",
        "hit experts",
        "fetched experts",
        "combine",
        "cpu",
        "activation copies",
        "host",
        "gaps",
    ];

    fn fields(&self) -> [f64; 10] {
        [
            self.total_us,
            self.dense_us,
            self.prepare_us,
            self.hit_experts_us,
            self.fetched_experts_us,
            self.combine_us,
            self.cpu_us,
            self.copies_us,
            self.host_us,
            self.gaps_us,
        ]
    }

    fn fields_mut(&mut self) -> [&mut f64; 10] {
        [
            &mut self.total_us,
            &mut self.dense_us,
            &mut self.prepare_us,
            &mut self.hit_experts_us,
            &mut self.fetched_experts_us,
            &mut self.combine_us,
            &mut self.cpu_us,
            &mut self.copies_us,
            &mut self.host_us,
            &mut self.gaps_us,
        ]
    }

    /// The sum of `items`, field by field.
    fn sum<'a>(items: impl IntoIterator<Item = &'a LinkIdle>) -> LinkIdle {
        let mut out = LinkIdle::default();
        for it in items {
            for (o, v) in out.fields_mut().into_iter().zip(it.fields()) {
                *o += v;
            }
        }
        out
    }
}

/// Collects the spans and counts of one step while the engine runs it.
#[derive(Debug, Clone)]
pub struct StepTimeline {
    step: u64,
    warmup: bool,
    streams: u32,
    start_ns: u64,
    spans: Vec<Span>,
    counts: Vec<LayerCounts>,
}

impl StepTimeline {
    /// Begin step `step` at `start_ns` (run clock) with `layers` MoE layers.
    pub fn new(step: u64, warmup: bool, streams: usize, layers: usize, start_ns: u64) -> Self {
        StepTimeline {
            step,
            warmup,
            streams: streams as u32,
            start_ns,
            spans: Vec::with_capacity(layers * 8),
            counts: vec![LayerCounts::default(); layers],
        }
    }

    /// The step index.
    pub fn step(&self) -> u64 {
        self.step
    }

    /// Record the plan's counts of `layer`.
    pub fn set_counts(&mut self, layer: usize, counts: LayerCounts) {
        self.counts[layer] = counts;
    }

    /// Record a span (ignored when it is empty).
    #[allow(clippy::too_many_arguments)]
    pub fn span(
        &mut self,
        lane: Lane,
        kind: SpanKind,
        layer: usize,
        start_ns: u64,
        end_ns: u64,
        bytes: u64,
        experts: u32,
    ) {
        self.spans.push(Span {
            lane,
            kind,
            step: self.step,
            layer: layer as u32,
            start_ns,
            end_ns: end_ns.max(start_ns),
            bytes,
            experts,
        });
    }

    /// The spans recorded so far.
    pub fn spans(&self) -> &[Span] {
        &self.spans
    }

    /// Close the step at `end_ns`: its record, and its spans (for a trace).
    pub fn finish(self, end_ns: u64) -> (StepRecord, Vec<Span>) {
        let rel = |ns: u64| ns.saturating_sub(self.start_ns) as f64 / NS_PER_US;
        let mut layers = Vec::with_capacity(self.counts.len());
        let mut totals = LayerCounts::default();
        for (l, c) in self.counts.iter().enumerate() {
            let of_layer = |s: &Span| s.layer as usize == l;
            let mine = self.spans.iter().filter(|s| of_layer(s));
            let (mut lo, mut hi) = (u64::MAX, 0u64);
            let mut pcie_bytes = 0u64;
            for s in mine {
                lo = lo.min(s.start_ns);
                hi = hi.max(s.end_ns);
                if s.lane == Lane::Copy {
                    pcie_bytes += s.bytes;
                }
            }
            if lo == u64::MAX {
                lo = self.start_ns;
                hi = self.start_ns;
            }
            layers.push(LayerRecord {
                layer: l as u32,
                counts: *c,
                start_us: rel(lo),
                end_us: rel(hi),
                gpu_busy_us: busy_us(&self.spans, Lane::GpuCompute, of_layer),
                pcie_busy_us: busy_us(&self.spans, Lane::Copy, of_layer),
                pcie_bytes,
                cpu_busy_us: busy_us(&self.spans, Lane::CpuPool, of_layer),
                host_wait_us: busy_us(&self.spans, Lane::HostSync, |s| {
                    of_layer(s) && s.kind == SpanKind::Wait
                }),
                host_submit_us: busy_us(&self.spans, Lane::HostSync, |s| {
                    of_layer(s) && s.kind == SpanKind::Submit
                }),
            });
            totals.hits += c.hits;
            totals.misses += c.misses;
            totals.fetched += c.fetched;
            totals.cpu += c.cpu;
            totals.gpu_tokens += c.gpu_tokens;
            totals.cpu_tokens += c.cpu_tokens;
            totals.gathered_bytes += c.gathered_bytes;
        }
        let all = |_: &Span| true;
        let record = StepRecord {
            step: self.step,
            warmup: self.warmup,
            streams: self.streams,
            start_us: self.start_ns as f64 / NS_PER_US,
            wall_us: rel(end_ns),
            gpu_busy_us: busy_us(&self.spans, Lane::GpuCompute, all),
            pcie_busy_us: busy_us(&self.spans, Lane::Copy, all),
            pcie_bytes: self
                .spans
                .iter()
                .filter(|s| s.lane == Lane::Copy)
                .map(|s| s.bytes)
                .sum(),
            cpu_busy_us: busy_us(&self.spans, Lane::CpuPool, all),
            host_wait_us: busy_us(&self.spans, Lane::HostSync, |s| s.kind == SpanKind::Wait),
            totals,
            layers,
            link_idle: LinkIdle::of(&self.spans, self.start_ns, end_ns),
        };
        (record, self.spans)
    }
}

/// Mean, median and spread of a sample (us).
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Stats {
    /// Arithmetic mean.
    pub mean: f64,
    /// Median.
    pub p50: f64,
    /// 90th percentile (nearest rank).
    pub p90: f64,
    /// Smallest value.
    pub min: f64,
    /// Largest value.
    pub max: f64,
    /// Sample standard deviation (0 for fewer than two values).
    pub stddev: f64,
}

impl Stats {
    /// Statistics of `xs` (all zero when empty).
    pub fn of(xs: &[f64]) -> Stats {
        if xs.is_empty() {
            return Stats::default();
        }
        let mut v = xs.to_vec();
        v.sort_by(f64::total_cmp);
        let n = v.len();
        let mean = v.iter().sum::<f64>() / n as f64;
        let stddev = if n > 1 {
            (v.iter().map(|x| (x - mean).powi(2)).sum::<f64>() / (n - 1) as f64).sqrt()
        } else {
            0.0
        };
        Stats {
            mean,
            p50: ft_model::stats::nearest_rank(&v, 0.5),
            p90: ft_model::stats::nearest_rank(&v, 0.9),
            min: v[0],
            max: v[n - 1],
            stddev,
        }
    }
}

/// Busy time of each resource as a share of the step's wall time (0 to 1).
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Utilisation {
    /// GPU compute stream.
    pub gpu: f64,
    /// Copy engine / PCIe.
    pub pcie: f64,
    /// CPU pool.
    pub cpu: f64,
    /// Host blocked on the device.
    pub host_wait: f64,
}

/// The measured steps of a run, summarised (warm-up steps left out).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RunSummary {
    /// Steps summarised.
    pub steps: usize,
    /// Warm-up steps run before them and left out.
    pub warmup_steps: usize,
    /// Concurrent streams.
    pub streams: usize,
    /// MoE layers run.
    pub layers: usize,
    /// Step wall time, us.
    pub step_us: Stats,
    /// Decode rate of each stream, tokens/s (one token per stream per step).
    pub tok_s_per_stream: f64,
    /// Decode rate of all streams together, tokens/s.
    pub tok_s_total: f64,
    /// Misses over hits plus misses (distinct experts per layer), over all measured layers.
    pub miss_rate: f64,
    /// Mean distinct experts per layer that hit.
    pub hits_per_layer: f64,
    /// Mean distinct experts per layer that missed.
    pub misses_per_layer: f64,
    /// Mean misses per layer gathered over the link.
    pub fetched_per_layer: f64,
    /// Mean misses per layer computed on the CPU.
    pub cpu_per_layer: f64,
    /// Mean bytes gathered over the link per step.
    pub gathered_bytes_per_step: f64,
    /// Mean bytes over PCIe per step (gathers plus activation copies).
    pub pcie_bytes_per_step: f64,
    /// Mean busy time per step, us: GPU compute.
    pub gpu_busy_us: f64,
    /// Mean busy time per step, us: PCIe.
    pub pcie_busy_us: f64,
    /// Mean busy time per step, us: CPU pool.
    pub cpu_busy_us: f64,
    /// Mean host wait per step, us.
    pub host_wait_us: f64,
    /// Busy shares of the step.
    pub utilisation: Utilisation,
    /// Gathered bytes over PCIe busy time while gathering, GB/s (1e9 B/s); 0 with no gather.
    pub pcie_gbs_while_busy: f64,
    /// Mean per layer of what held the steps while no gather was on the link
    /// ([`LinkIdle`]), over the measured steps with gathers; `None` when none had one.
    #[serde(default)]
    pub link_idle_per_layer: Option<LinkIdle>,
}

impl RunSummary {
    /// Summarise the non-warm-up steps of `records`.
    pub fn of(records: &[StepRecord]) -> RunSummary {
        let measured: Vec<&StepRecord> = records.iter().filter(|r| !r.warmup).collect();
        let warmup_steps = records.len() - measured.len();
        let n = measured.len().max(1) as f64;
        let walls: Vec<f64> = measured.iter().map(|r| r.wall_us).collect();
        let step_us = Stats::of(&walls);
        let streams = measured.first().map_or(0, |r| r.streams as usize);
        let layers = measured.first().map_or(0, |r| r.layers.len());
        let mean = |f: &dyn Fn(&StepRecord) -> f64| measured.iter().map(|r| f(r)).sum::<f64>() / n;
        let total_wall: f64 = walls.iter().sum();
        let tokens: f64 = measured.iter().map(|r| r.streams as f64).sum();
        let (tok_s_total, tok_s_per_stream) = if total_wall > 0.0 {
            let total = tokens / (total_wall / US_PER_S);
            (total, total / streams.max(1) as f64)
        } else {
            (0.0, 0.0)
        };
        let sum = |f: &dyn Fn(&LayerCounts) -> u32| {
            measured.iter().map(|r| f(&r.totals) as f64).sum::<f64>()
        };
        let (hits, misses) = (sum(&|c| c.hits), sum(&|c| c.misses));
        let layer_count = (measured.len() * layers).max(1) as f64;
        let share = |busy: f64| {
            if total_wall > 0.0 {
                busy * measured.len() as f64 / total_wall
            } else {
                0.0
            }
        };
        let gpu_busy_us = mean(&|r| r.gpu_busy_us);
        let pcie_busy_us = mean(&|r| r.pcie_busy_us);
        let cpu_busy_us = mean(&|r| r.cpu_busy_us);
        let host_wait_us = mean(&|r| r.host_wait_us);
        let gathered_bytes_per_step = mean(&|r| r.totals.gathered_bytes as f64);
        let idles: Vec<&LinkIdle> = measured
            .iter()
            .filter_map(|r| r.link_idle.as_ref())
            .collect();
        let link_idle_per_layer = (!idles.is_empty()).then(|| {
            LinkIdle::sum(idles.iter().copied()).scaled(1.0 / (idles.len() * layers.max(1)) as f64)
        });
        RunSummary {
            steps: measured.len(),
            warmup_steps,
            streams,
            layers,
            step_us,
            tok_s_per_stream,
            tok_s_total,
            miss_rate: if hits + misses > 0.0 {
                misses / (hits + misses)
            } else {
                0.0
            },
            hits_per_layer: hits / layer_count,
            misses_per_layer: misses / layer_count,
            fetched_per_layer: sum(&|c| c.fetched) / layer_count,
            cpu_per_layer: sum(&|c| c.cpu) / layer_count,
            gathered_bytes_per_step,
            pcie_bytes_per_step: mean(&|r| r.pcie_bytes as f64),
            gpu_busy_us,
            pcie_busy_us,
            cpu_busy_us,
            host_wait_us,
            utilisation: Utilisation {
                gpu: share(gpu_busy_us),
                pcie: share(pcie_busy_us),
                cpu: share(cpu_busy_us),
                host_wait: share(host_wait_us),
            },
            pcie_gbs_while_busy: if pcie_busy_us > 0.0 {
                mean(&|r| r.pcie_bytes as f64) / (pcie_busy_us * NS_PER_US)
            } else {
                0.0
            },
            link_idle_per_layer,
        }
    }
}

/// One event of the Chrome trace-event format (the subset `ft` writes).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TraceEvent {
    /// Event name shown on the slice.
    pub name: String,
    /// Category (comma-separated tags; here the span kind).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub cat: String,
    /// Phase: `X` for a complete slice, `M` for metadata.
    pub ph: String,
    /// Start, us.
    #[serde(default)]
    pub ts: f64,
    /// Duration, us (complete slices only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dur: Option<f64>,
    /// Process id (one per run).
    pub pid: u32,
    /// Thread id: the lane.
    pub tid: u32,
    /// Details: step, layer, bytes, experts; or the metadata's name.
    #[serde(default)]
    pub args: serde_json::Map<String, serde_json::Value>,
}

/// A Chrome trace (JSON object form).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ChromeTrace {
    /// The events.
    #[serde(rename = "traceEvents")]
    pub trace_events: Vec<TraceEvent>,
    /// Unit the viewer displays (`ms` or `ns`).
    #[serde(rename = "displayTimeUnit")]
    pub display_time_unit: String,
}

/// Process id of the run in the trace.
const TRACE_PID: u32 = 1;

impl ChromeTrace {
    /// A trace with one named lane per [`Lane`] and no slices yet.
    pub fn new(process_name: &str) -> Self {
        let meta = |name: &str, tid: u32, value: &str| {
            let mut args = serde_json::Map::new();
            args.insert("name".into(), value.into());
            TraceEvent {
                name: name.into(),
                cat: String::new(),
                ph: "M".into(),
                ts: 0.0,
                dur: None,
                pid: TRACE_PID,
                tid,
                args,
            }
        };
        let mut trace_events = vec![meta("process_name", 0, process_name)];
        for lane in Lane::ALL {
            trace_events.push(meta("thread_name", lane.tid(), lane.label()));
            let mut sort = meta("thread_sort_index", lane.tid(), "");
            sort.args.clear();
            sort.args.insert("sort_index".into(), lane.tid().into());
            trace_events.push(sort);
        }
        ChromeTrace {
            trace_events,
            display_time_unit: "ms".into(),
        }
    }

    /// Add spans as complete slices.
    pub fn add_spans(&mut self, spans: &[Span]) {
        for s in spans {
            let mut args = serde_json::Map::new();
            args.insert("step".into(), s.step.into());
            args.insert("layer".into(), s.layer.into());
            if s.bytes > 0 {
                args.insert("bytes".into(), s.bytes.into());
            }
            if s.experts > 0 {
                args.insert("experts".into(), s.experts.into());
            }
            self.trace_events.push(TraceEvent {
                name: format!("{} L{}", s.kind.label(), s.layer),
                cat: s.kind.label().into(),
                ph: "X".into(),
                ts: s.start_ns as f64 / NS_PER_US,
                dur: Some(s.dur_ns() as f64 / NS_PER_US),
                pid: TRACE_PID,
                tid: s.lane.tid(),
                args,
            });
        }
    }

    /// Add one slice per step on the host lane spanning the step (`start_ns`..`end_ns`).
    pub fn add_step(&mut self, step: u64, warmup: bool, start_ns: u64, end_ns: u64) {
        let mut args = serde_json::Map::new();
        args.insert("step".into(), step.into());
        args.insert("warmup".into(), warmup.into());
        self.trace_events.push(TraceEvent {
            name: format!("step {step}{}", if warmup { " (warm-up)" } else { "" }),
            cat: "step".into(),
            ph: "X".into(),
            ts: start_ns as f64 / NS_PER_US,
            dur: Some(end_ns.saturating_sub(start_ns) as f64 / NS_PER_US),
            pid: TRACE_PID,
            tid: Lane::HostSync.tid(),
            args,
        });
    }

    /// Write as JSON to `path`.
    pub fn write(&self, path: &Path) -> Result<()> {
        let io = |source| RuntimeError::Io {
            path: path.display().to_string(),
            source,
        };
        let file = std::fs::File::create(path).map_err(io)?;
        let mut w = std::io::BufWriter::new(file);
        serde_json::to_writer(&mut w, self).map_err(|e| RuntimeError::Io {
            path: path.display().to_string(),
            source: e.into(),
        })?;
        w.flush().map_err(io)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn host_cpu_times_read_the_steal_column() {
        let a = "cpu  100 5 50 1000 10 1 2 7 0 0\ncpu0 50 2 25 500 5 0 1 3 0 0\nintr 1\n";
        let t = HostCpuTimes::parse(a).unwrap();
        assert_eq!(
            t,
            HostCpuTimes {
                own: 1168,
                steal: 7
            }
        );
        let b = "cpu  200 5 60 1100 10 1 2 47 0 0\n";
        let u = HostCpuTimes::parse(b).unwrap();
        let mut m = StealMeter::default();
        assert_eq!(m.fraction(), None);
        m.add(&t, &u);
        // 210 own ticks and 40 stolen.
        assert_eq!(u.since(&t), (210, 40));
        assert!((m.fraction().unwrap() - 40.0 / 250.0).abs() < 1e-12);
        assert_eq!(HostCpuTimes::parse("intr 1\n"), None);
        assert_eq!(HostCpuTimes::parse("cpu  1 2 3\n"), None);
        assert_eq!(HostCpuTimes::parse("cpu  1 x 3 4 5 6 7 8\n"), None);
    }

    /// Naive reference: mark every ns covered.
    fn union_naive(iv: &[(u64, u64)]) -> u64 {
        let hi = iv.iter().map(|x| x.1).max().unwrap_or(0);
        (0..hi)
            .filter(|t| iv.iter().any(|(s, e)| s <= t && t < e))
            .count() as u64
    }

    #[test]
    fn union_matches_naive() {
        let cases: Vec<Vec<(u64, u64)>> = vec![
            vec![],
            vec![(3, 3)],
            vec![(0, 10), (5, 15), (20, 25)],
            vec![(10, 20), (0, 5), (4, 11), (30, 31), (30, 40), (35, 36)],
            vec![(7, 2)],
        ];
        for c in cases {
            assert_eq!(union_ns(c.iter().copied()), union_naive(&c), "{c:?}");
        }
    }

    /// Naive reference of [`LinkIdle::of`]: every ns of the step, charged by looking at each
    /// span in priority order.
    fn link_idle_naive(spans: &[Span], start: u64, end: u64) -> Option<[u64; 10]> {
        if !spans.iter().any(|s| s.kind == SpanKind::Gather) {
            return None;
        }
        let order: [(Lane, Option<SpanKind>); 8] = [
            (Lane::GpuCompute, Some(SpanKind::Dense)),
            (Lane::GpuCompute, Some(SpanKind::Prepare)),
            (Lane::GpuCompute, Some(SpanKind::HitExperts)),
            (Lane::GpuCompute, Some(SpanKind::FetchedExperts)),
            (Lane::GpuCompute, Some(SpanKind::Combine)),
            (Lane::CpuPool, None),
            (Lane::Copy, None),
            (Lane::HostSync, None),
        ];
        let mut out = [0u64; 10];
        for t in start..end {
            let covers = |s: &&Span| s.start_ns <= t && t < s.end_ns;
            if spans
                .iter()
                .filter(covers)
                .any(|s| s.kind == SpanKind::Gather)
            {
                continue;
            }
            out[0] += 1;
            let slot = order.iter().position(|(lane, kind)| {
                spans
                    .iter()
                    .filter(covers)
                    .any(|s| s.lane == *lane && kind.is_none_or(|k| s.kind == k))
            });
            out[1 + slot.unwrap_or(8)] += 1;
        }
        Some(out)
    }

    #[test]
    fn link_idle_matches_the_naive_sweep() {
        use rand::{Rng, SeedableRng};
        let kinds = [
            (Lane::GpuCompute, SpanKind::Dense),
            (Lane::GpuCompute, SpanKind::Prepare),
            (Lane::GpuCompute, SpanKind::HitExperts),
            (Lane::GpuCompute, SpanKind::FetchedExperts),
            (Lane::GpuCompute, SpanKind::Combine),
            (Lane::Copy, SpanKind::Gather),
            (Lane::Copy, SpanKind::ActivationsDown),
            (Lane::Copy, SpanKind::PartialUp),
            (Lane::CpuPool, SpanKind::CpuExperts),
            (Lane::HostSync, SpanKind::Submit),
            (Lane::HostSync, SpanKind::Wait),
        ];
        let mut rng = rand::rngs::StdRng::seed_from_u64(7);
        for case in 0..300 {
            let n = rng.random_range(0..12);
            let spans: Vec<Span> = (0..n)
                .map(|_| {
                    let (lane, kind) = kinds[rng.random_range(0..kinds.len())];
                    let a = rng.random_range(0..120u64);
                    Span {
                        lane,
                        kind,
                        step: 0,
                        layer: 0,
                        start_ns: a,
                        end_ns: a + rng.random_range(0..40u64),
                        bytes: 0,
                        experts: 0,
                    }
                })
                .collect();
            let (start, end) = (rng.random_range(0..20u64), rng.random_range(60..150u64));
            let fast = LinkIdle::of(&spans, start, end);
            let naive = link_idle_naive(&spans, start, end);
            match (fast, naive) {
                (None, None) => {}
                (Some(f), Some(n)) => {
                    let got: Vec<u64> = f.fields().iter().map(|us| ns_of_us(*us)).collect();
                    assert_eq!(
                        got,
                        n.to_vec(),
                        "case {case}: {spans:?} in [{start}, {end})"
                    );
                    let parts: f64 = f.causes().iter().map(|c| c.1).sum();
                    assert!((parts - f.total_us).abs() < 1e-9);
                }
                (f, n) => panic!("case {case}: {f:?} against {n:?}"),
            }
        }
    }

    #[test]
    fn an_offload_layer_charges_the_link_idle_to_dense_and_the_last_chunk() {
        // Layer 0: dense 0-10, gather 10-50, hits 12-20, last chunk 50-56, combine 56-58;
        // layer 1's dense 58-70, its gather 70-100, a gap to the step's end at 110.
        let mut t = StepTimeline::new(0, false, 1, 2, 0);
        t.span(Lane::GpuCompute, SpanKind::Dense, 0, 0, 10_000, 0, 0);
        t.span(Lane::Copy, SpanKind::Gather, 0, 10_000, 50_000, 1, 2);
        t.span(
            Lane::GpuCompute,
            SpanKind::HitExperts,
            0,
            12_000,
            20_000,
            0,
            3,
        );
        t.span(
            Lane::GpuCompute,
            SpanKind::FetchedExperts,
            0,
            50_000,
            56_000,
            0,
            2,
        );
        t.span(Lane::GpuCompute, SpanKind::Combine, 0, 56_000, 58_000, 0, 0);
        t.span(Lane::GpuCompute, SpanKind::Dense, 1, 58_000, 70_000, 0, 0);
        t.span(Lane::Copy, SpanKind::Gather, 1, 70_000, 100_000, 1, 2);
        let (r, _) = t.finish(110_000);
        let idle = r.link_idle.unwrap();
        assert_eq!(idle.total_us, 40.0);
        assert_eq!(idle.dense_us, 22.0);
        assert_eq!(idle.fetched_experts_us, 6.0);
        assert_eq!(idle.combine_us, 2.0);
        assert_eq!(idle.gaps_us, 10.0);
        assert_eq!(idle.hit_experts_us, 0.0);
        let s = RunSummary::of(&[r]);
        assert_eq!(s.link_idle_per_layer.unwrap().total_us, 20.0);
        assert_eq!(s.link_idle_per_layer.unwrap().causes()[0], ("dense", 11.0));
        // A step without gathers has none.
        let (r, _) = StepTimeline::new(1, false, 1, 1, 0).finish(5_000);
        assert_eq!(r.link_idle, None);
        assert_eq!(RunSummary::of(&[r]).link_idle_per_layer, None);
    }

    #[test]
    fn step_record_per_layer_and_totals() {
        let mut t = StepTimeline::new(3, false, 2, 2, 1_000);
        t.set_counts(
            0,
            LayerCounts {
                hits: 3,
                misses: 2,
                fetched: 1,
                cpu: 1,
                gpu_tokens: 5,
                cpu_tokens: 1,
                gathered_bytes: 100,
            },
        );
        t.set_counts(
            1,
            LayerCounts {
                hits: 4,
                misses: 0,
                ..Default::default()
            },
        );
        t.span(Lane::GpuCompute, SpanKind::Dense, 0, 1_000, 2_000, 0, 0);
        t.span(
            Lane::GpuCompute,
            SpanKind::HitExperts,
            0,
            1_500,
            3_000,
            0,
            3,
        );
        t.span(Lane::Copy, SpanKind::Gather, 0, 2_000, 4_000, 100, 1);
        t.span(Lane::CpuPool, SpanKind::CpuExperts, 0, 2_000, 2_500, 0, 1);
        t.span(Lane::HostSync, SpanKind::Wait, 0, 2_000, 2_200, 0, 0);
        t.span(Lane::GpuCompute, SpanKind::Dense, 1, 4_000, 5_000, 0, 0);
        let (r, spans) = t.finish(6_000);
        assert_eq!(spans.len(), 6);
        assert_eq!(r.wall_us, 5.0);
        assert_eq!(r.layers[0].gpu_busy_us, 2.0);
        assert_eq!(r.layers[0].pcie_busy_us, 2.0);
        assert_eq!(r.layers[0].pcie_bytes, 100);
        assert_eq!(r.layers[0].cpu_busy_us, 0.5);
        assert_eq!(r.layers[0].host_wait_us, 0.2);
        assert_eq!(r.layers[0].start_us, 0.0);
        assert_eq!(r.layers[0].end_us, 3.0);
        assert_eq!(r.layers[1].gpu_busy_us, 1.0);
        assert_eq!(r.gpu_busy_us, 3.0);
        assert_eq!(r.totals.hits, 7);
        assert_eq!(r.totals.misses, 2);

        let warm = StepTimeline::new(2, true, 2, 2, 0).finish(100_000).0;
        let s = RunSummary::of(&[warm, r]);
        assert_eq!(s.steps, 1);
        assert_eq!(s.warmup_steps, 1);
        assert_eq!(s.step_us.mean, 5.0);
        assert!((s.tok_s_total - 2.0 / 5e-6).abs() < 1e-6);
        assert!((s.tok_s_per_stream - 1.0 / 5e-6).abs() < 1e-6);
        assert!((s.miss_rate - 2.0 / 9.0).abs() < 1e-12);
        assert!((s.utilisation.gpu - 3.0 / 5.0).abs() < 1e-12);
        // 100 bytes in 2 us = 100 B / 2000 ns = 0.05 GB/s.
        assert!((s.pcie_gbs_while_busy - 100.0 / 2000.0).abs() < 1e-12);
    }

    #[test]
    fn stats_nearest_rank() {
        let s = Stats::of(&[5.0, 1.0, 3.0, 2.0, 4.0]);
        assert_eq!((s.min, s.p50, s.max, s.mean), (1.0, 3.0, 5.0, 3.0));
        assert_eq!(s.p90, 5.0);
        assert!((s.stddev - 2.5f64.sqrt()).abs() < 1e-12);
        assert_eq!(Stats::of(&[]), Stats::default());
    }

    #[test]
    fn chrome_trace_round_trips_with_lanes() {
        let mut tr = ChromeTrace::new("ft run");
        let mut t = StepTimeline::new(0, false, 1, 1, 0);
        t.span(Lane::Copy, SpanKind::Gather, 0, 10, 2_010, 4096, 2);
        tr.add_spans(t.spans());
        tr.add_step(0, false, 0, 3_000);
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("t.json");
        tr.write(&path).unwrap();
        let v: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
        let events = v["traceEvents"].as_array().unwrap();
        let names: Vec<&str> = events
            .iter()
            .filter(|e| e["name"] == "thread_name")
            .map(|e| e["args"]["name"].as_str().unwrap())
            .collect();
        assert_eq!(names, Lane::ALL.map(|l| l.label()).to_vec());
        let gather = events.iter().find(|e| e["cat"] == "gather").unwrap();
        assert_eq!(gather["tid"], Lane::Copy.tid());
        assert_eq!(gather["ts"], 0.01);
        assert_eq!(gather["dur"], 2.0);
        assert_eq!(gather["args"]["bytes"], 4096);
        let back: ChromeTrace = serde_json::from_value(v).unwrap();
        assert_eq!(back, tr);
    }
}
