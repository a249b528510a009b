//! The layer schedule: one MoE layer-step's work on G GPUs, described once.
//!
//! Why it exists: the order of a layer's work (the dense part, the hits, the gather and the
//! fetched chunks, the CPU share and its round trip, the combines) was written out by hand
//! in each view of a decode step. Here it is data: a [`LayerSchedule`] lists the operations
//! of one layer for the counts each GPU plans ([`LayerCounts`], from
//! [`crate::plan::plan_layer_placed`]) with their dependencies. The analytic model evaluates
//! it in closed form ([`crate::perf::PerfParams::schedule_time`], one closed form for any
//! G); [`LayerSchedule::longest_path`] is the slow reference that closed form is tested
//! against; the simulator times the same operations as events
//! (`ft_sim::costs::CostModel::layer_on` takes the schedule's properties); the engine is
//! to issue it (one engine for any G).
//!
//! One layer on GPU `g` (every GPU holds the dense weights and runs the same graph on its
//! own link, stream and CPU workers):
//!
//! ```text
//!   layer start ──► Dense ──┬──► Hits ──► FetchedEarly ──► [LastLaunch] ──► LastChunk ──┐
//!        │                  ├──► Gather ───────────────────────────────────────┘        │
//!        └──► Issue ────────┴──► CpuShare ──► RoundTrip ───────────────► Combine ◄──────┘
//!                                                                           │
//!                        (all GPUs) ──► PeerCombine (G > 1) ──► Residual ◄──┘
//! ```
//!
//! - `Issue`: the host thread's own time in the layer (planning, submitting); it is one of
//!   the CPU pool's workers, so the CPU share waits for it ([`crate::perf::HostCost`]).
//! - `FetchedEarly`: the fetched chunks before the last
//!   ([`LayerSchedule::fetch_chunk_bounds`]: at most the engine's
//!   [`EngineSettings::fetch_chunks`], one of the schedule's inputs), each as its copies land
//!   beside the gather of the next; `LastChunk` needs the whole gather. A layer gathered in
//!   one chunk has no `FetchedEarly`. Where the last chunk is gated on a flag the copy stream sets
//!   ([`LayerSchedule::gated_last_chunk`], one GPU), its launch (`LastLaunch`) is paid when
//!   the stream reaches it, beside the gather.
//! - `Combine`: the GPU sums the CPU's partial output into the layer's (a CPU share only).
//!   The layer's own sum and residual add (the tree over its output rows) is part of the
//!   last operation of its stream; on one GPU without a CPU share it is folded into the
//!   last fetched chunk's launch ([`LayerSchedule::folded_combine`]: the same time, one
//!   launch fewer for the engine; with a CPU share the CPU's rows land after that launch).
//! - `PeerCombine`: the GPUs' partial outputs summed over the interconnect (G > 1).
//! - `Residual`: the calibrated fixed cost of a layer with this work
//!   ([`crate::perf::StrategyOverheads::of`], keyed by [`LayerWork`], never by a strategy's
//!   name).
//!
//! Operations without work (no hits, no fetched expert, no CPU share) are left out. Under
//! tensor parallelism every GPU runs the one plan and its CPU experts are dealt out over the
//! GPUs, each computed whole on one GPU's workers ([`LayerSchedule::counts_on`], as the
//! engine deals them).

use serde::{Deserialize, Serialize};

use crate::engine_settings::EngineSettings;
use crate::perf::step::LayerCounts;
use crate::placement::GpuLayout;

/// One operation of a layer's schedule.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum OpKind {
    /// The host thread's planning and submitting of the layer (serial with its CPU share).
    Issue,
    /// Attention, router and shared experts on the GPU.
    Dense,
    /// The hit experts' kernel.
    Hits,
    /// The fetched chunks before the last, back to back on the GPU stream.
    FetchedEarly,
    /// The last fetched chunk's launch, paid beside the gather (gated chunk only).
    LastLaunch,
    /// The gather of the fetched misses over the link.
    Gather,
    /// The last fetched chunk's kernel, after the whole gather.
    LastChunk,
    /// The CPU's share of the experts.
    CpuShare,
    /// The activations to the host and the partial output back, with the event round trip.
    RoundTrip,
    /// The GPU's sum of the CPU's partial output.
    Combine,
    /// The sum of the GPUs' partial outputs over the interconnect (several GPUs).
    PeerCombine,
    /// The calibrated fixed cost of the layer's work.
    Residual,
}

/// An operation, the GPU it belongs to (0 for the layer-wide ones) and the operations it
/// waits for (indices into [`LayerSchedule::ops`], all earlier).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Op {
    /// What it does.
    pub kind: OpKind,
    /// Its GPU.
    pub gpu: u32,
    /// The operations that must end before it starts.
    pub after: Vec<usize>,
}

/// Which optional operations a layer holds: what its calibrated fixed cost is keyed by.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum LayerWork {
    /// Only GPU compute of resident experts (and the dense part).
    GpuOnly,
    /// A gather of misses, no CPU share.
    Gather,
    /// A CPU share, no gather.
    CpuShare,
    /// A gather and a CPU share.
    GatherAndCpuShare,
}

impl LayerWork {
    /// Every kind of work, in report order.
    pub const ALL: [LayerWork; 4] = [
        LayerWork::GpuOnly,
        LayerWork::Gather,
        LayerWork::CpuShare,
        LayerWork::GatherAndCpuShare,
    ];

    /// The work of a layer whose GPUs plan `counts` (a gather or a CPU share on any GPU).
    pub fn of(counts: &[LayerCounts]) -> Self {
        let gather = counts.iter().any(|c| c.fetched > 0.0);
        let cpu = counts.iter().any(|c| c.cpu > 0.0);
        match (gather, cpu) {
            (false, false) => LayerWork::GpuOnly,
            (true, false) => LayerWork::Gather,
            (false, true) => LayerWork::CpuShare,
            (true, true) => LayerWork::GatherAndCpuShare,
        }
    }

    /// Name in tables.
    pub fn name(self) -> &'static str {
        match self {
            LayerWork::GpuOnly => "gpu-only",
            LayerWork::Gather => "gather",
            LayerWork::CpuShare => "cpu-share",
            LayerWork::GatherAndCpuShare => "gather+cpu-share",
        }
    }
}

/// One layer-step's operations on the GPUs of a layout, with their dependencies.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct LayerSchedule {
    /// GPUs the layer runs on.
    pub gpus: u32,
    /// What each GPU computes (`counts[g]`; [`GpuLayout::plan_of`] maps a GPU to its plan).
    pub counts: Vec<LayerCounts>,
    /// Whether the last fetched chunk is gated on a flag the copy stream sets, so that its
    /// launch overlaps the gather: where one host thread drives one GPU (G = 1).
    pub gated_last_chunk: bool,
    /// Whether the layer's sum (the tree and the residual add) is folded into the last
    /// fetched chunk's launch: on one GPU where the layer fetches and has no CPU share, whose
    /// rows would land after that launch (the time is the same; the engine saves a launch).
    pub folded_combine: bool,
    /// Most chunks a GPU's fetched experts are gathered and computed in (the engine's
    /// [`EngineSettings::fetch_chunks`]): the chunks themselves are
    /// [`LayerSchedule::fetch_chunk_bounds`], for every view.
    pub fetch_chunks: usize,
    /// The operations, in an order where every operation comes after those it waits for.
    pub ops: Vec<Op>,
}

impl LayerSchedule {
    /// What GPU `gpu` of `layout` computes of a layer whose plans are `plans`: its plan
    /// ([`GpuLayout::plan_of`]), under tensor parallelism with its dealt share of the plan's
    /// CPU experts ([`GpuLayout::cpu_experts_on`]: the engine computes each CPU expert whole
    /// on one GPU's workers) and their tokens in proportion.
    pub fn counts_on(layout: &GpuLayout, plans: &[LayerCounts], gpu: u32) -> LayerCounts {
        let c = plans[layout.plan_of(gpu).min(plans.len().saturating_sub(1))];
        let cpu = layout.cpu_experts_on(gpu, c.cpu);
        LayerCounts {
            cpu,
            cpu_tokens: if c.cpu > 0.0 {
                c.cpu_tokens * cpu / c.cpu
            } else {
                0.0
            },
            ..c
        }
    }

    /// The chunks `fetched` experts are gathered and computed in where a layer's fetched
    /// experts come in at most `fetch_chunks` chunks: [`crate::plan::fetch_chunk_bounds_at_most`]
    /// of the nearest whole count, at least one expert where there are any (counts may be
    /// means); one empty chunk for none. The one rule the schedule, the closed form, the
    /// simulator and the engine all chunk by ([`LayerSchedule::fetch_chunk_bounds`]).
    pub fn chunk_bounds(fetch_chunks: usize, fetched: f64) -> Vec<std::ops::Range<usize>> {
        let n = if fetched > 0.0 {
            fetched.round().max(1.0) as usize
        } else {
            0
        };
        crate::plan::fetch_chunk_bounds_at_most(n, fetch_chunks)
    }

    /// Whether `fetched` experts come in more than one chunk ([`LayerSchedule::chunk_bounds`]
    /// has several ranges), without building the chunks: the simulator asks it of every
    /// layer. The rule splits off a last chunk as soon as two chunks are allowed and there
    /// are two experts.
    pub fn several_chunks(fetch_chunks: usize, fetched: f64) -> bool {
        fetch_chunks.clamp(1, crate::plan::MAX_FETCH_CHUNKS) >= 2 && fetched.round() >= 2.0
    }

    /// The chunks this layer's `fetched` experts (a GPU's count; a mean allowed) are
    /// gathered and computed in ([`LayerSchedule::chunk_bounds`] at the schedule's
    /// [`LayerSchedule::fetch_chunks`]).
    pub fn fetch_chunk_bounds(&self, fetched: f64) -> Vec<std::ops::Range<usize>> {
        LayerSchedule::chunk_bounds(self.fetch_chunks, fetched)
    }

    /// The schedule of one layer on the GPUs of `layout` run by an engine with `settings`,
    /// plan `p` doing `plans[p]` (one plan on one GPU and under tensor parallelism, one per
    /// GPU when sharded; each GPU's counts are [`LayerSchedule::counts_on`]).
    pub fn new(layout: &GpuLayout, settings: &EngineSettings, plans: &[LayerCounts]) -> Self {
        let gpus = layout.gpus.max(1);
        let single = !layout.is_multi();
        let counts: Vec<LayerCounts> = (0..gpus)
            .map(|g| LayerSchedule::counts_on(layout, plans, g))
            .collect();
        let mut ops: Vec<Op> = Vec::new();
        let mut push = |kind: OpKind, gpu: u32, after: Vec<usize>| {
            ops.push(Op { kind, gpu, after });
            ops.len() - 1
        };
        let mut ends = Vec::with_capacity(gpus as usize);
        let mut folded = false;
        for (g, c) in counts.iter().enumerate() {
            let g = g as u32;
            let has_cpu = c.cpu > 0.0;
            let has_fetched = c.fetched > 0.0;
            let issue = has_cpu.then(|| push(OpKind::Issue, g, vec![]));
            let dense = push(OpKind::Dense, g, vec![]);
            let mut stream = dense;
            if c.hits > 0.0 {
                stream = push(OpKind::Hits, g, vec![stream]);
            }
            if has_fetched {
                if LayerSchedule::several_chunks(settings.fetch_chunks, c.fetched) {
                    stream = push(OpKind::FetchedEarly, g, vec![stream]);
                }
                let gather = push(OpKind::Gather, g, vec![dense]);
                if single {
                    stream = push(OpKind::LastLaunch, g, vec![stream]);
                }
                stream = push(OpKind::LastChunk, g, vec![stream, gather]);
            }
            if has_cpu {
                let cpu = push(
                    OpKind::CpuShare,
                    g,
                    vec![dense, issue.expect("pushed with the CPU share")],
                );
                let trip = push(OpKind::RoundTrip, g, vec![cpu]);
                stream = push(OpKind::Combine, g, vec![stream, trip]);
            }
            folded |= single && has_fetched && !has_cpu;
            ends.push(stream);
        }
        let last = if single {
            ends
        } else {
            vec![push(OpKind::PeerCombine, 0, ends)]
        };
        push(OpKind::Residual, 0, last);
        LayerSchedule {
            gpus,
            counts,
            gated_last_chunk: single,
            folded_combine: folded,
            fetch_chunks: settings.fetch_chunks,
            ops,
        }
    }

    /// The work the layer holds ([`LayerWork::of`] its GPUs' counts).
    pub fn work(&self) -> LayerWork {
        LayerWork::of(&self.counts)
    }

    /// The slow reference of the closed form: the end of the last operation when each
    /// starts as soon as all it waits for have ended, with `duration(op)` in us.
    pub fn longest_path(&self, duration: impl Fn(&Op) -> f64) -> f64 {
        let mut end = vec![0.0f64; self.ops.len()];
        for (i, op) in self.ops.iter().enumerate() {
            let start = op.after.iter().map(|&j| end[j]).fold(0.0, f64::max);
            end[i] = start + duration(op);
        }
        end.iter().copied().fold(0.0, f64::max)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::placement::GpuPlacement;

    /// The fast test of several chunks is the chunking's own answer.
    #[test]
    fn several_chunks_is_what_the_chunk_bounds_say() {
        for most in 0..=crate::plan::MAX_FETCH_CHUNKS + 1 {
            for tenths in 0..=200 {
                let fetched = f64::from(tenths) / 10.0;
                assert_eq!(
                    LayerSchedule::several_chunks(most, fetched),
                    LayerSchedule::chunk_bounds(most, fetched).len() > 1,
                    "{most} chunks, {fetched} fetched"
                );
            }
        }
    }

    fn counts(hits: f64, fetched: f64, cpu: f64) -> LayerCounts {
        LayerCounts::one_token_each(hits, fetched, cpu)
    }

    fn kinds(s: &LayerSchedule) -> Vec<OpKind> {
        s.ops.iter().map(|o| o.kind).collect()
    }

    #[test]
    fn the_schedule_holds_the_work_there_is_in_dependency_order() {
        use OpKind::*;
        let one = GpuLayout::single();
        let s = LayerSchedule::new(&one, &EngineSettings::default(), &[counts(5.0, 6.0, 2.0)]);
        assert_eq!(
            kinds(&s),
            vec![
                Issue,
                Dense,
                Hits,
                FetchedEarly,
                Gather,
                LastLaunch,
                LastChunk,
                CpuShare,
                RoundTrip,
                Combine,
                Residual
            ]
        );
        assert!(s.gated_last_chunk && !s.folded_combine);
        assert_eq!(s.work(), LayerWork::GatherAndCpuShare);
        for (i, op) in s.ops.iter().enumerate() {
            assert!(op.after.iter().all(|&j| j < i), "{op:?}");
        }
        // Resident work: the dense part, the hits, the residual.
        let r = LayerSchedule::new(&one, &EngineSettings::default(), &[counts(9.0, 0.0, 0.0)]);
        assert_eq!(kinds(&r), vec![Dense, Hits, Residual]);
        assert_eq!(r.work(), LayerWork::GpuOnly);
        // One fetched expert: one chunk, no early part.
        let f = LayerSchedule::new(&one, &EngineSettings::default(), &[counts(0.0, 1.0, 0.0)]);
        assert_eq!(
            kinds(&f),
            vec![Dense, Gather, LastLaunch, LastChunk, Residual]
        );
        assert!(f.folded_combine);
        // Two GPUs: no gate, no fold, a peer combine after both.
        let two = GpuLayout::new(2, GpuPlacement::Sharded).unwrap();
        let t = LayerSchedule::new(
            &two,
            &EngineSettings::default(),
            &[counts(1.0, 3.0, 1.0), counts(2.0, 0.0, 0.0)],
        );
        assert!(!t.gated_last_chunk && !t.folded_combine);
        assert_eq!(t.gpus, 2);
        let peer = t
            .ops
            .iter()
            .position(|o| o.kind == PeerCombine)
            .expect("a peer combine");
        assert_eq!(t.ops[peer].after.len(), 2);
        assert!(!kinds(&t).contains(&LastLaunch));
        // Tensor parallel: one plan, run by every GPU, its CPU experts dealt out.
        let tp = GpuLayout::new(2, GpuPlacement::TensorParallel).unwrap();
        let p = LayerSchedule::new(&tp, &EngineSettings::default(), &[counts(1.0, 2.0, 0.0)]);
        assert_eq!(p.counts, vec![counts(1.0, 2.0, 0.0); 2]);
        let d = LayerSchedule::new(&tp, &EngineSettings::default(), &[counts(1.0, 2.0, 3.0)]);
        assert_eq!(d.counts, vec![counts(1.0, 2.0, 2.0), counts(1.0, 2.0, 1.0)]);
        // One CPU expert: the second GPU has no CPU share, so no issue, round trip or
        // combine of its own.
        let one = LayerSchedule::new(&tp, &EngineSettings::default(), &[counts(1.0, 2.0, 1.0)]);
        let on = |g: u32, k: OpKind| one.ops.iter().any(|o| o.gpu == g && o.kind == k);
        assert!(on(0, CpuShare) && !on(1, CpuShare) && !on(1, Issue) && !on(1, Combine));
    }

    /// The engine's chunk count is an input of the schedule: a layer gathered in one chunk
    /// has no early chunk, and at every count the schedule holds `FetchedEarly` exactly
    /// where its own chunks ([`LayerSchedule::fetch_chunk_bounds`], the engine's) are more
    /// than one.
    #[test]
    fn the_fetch_chunk_setting_decides_the_early_chunks() {
        use crate::placement::GpuPlacement;
        use crate::plan::MAX_FETCH_CHUNKS;
        let layouts = [
            GpuLayout::single(),
            GpuLayout::new(2, GpuPlacement::Sharded).unwrap(),
            GpuLayout::new(2, GpuPlacement::TensorParallel).unwrap(),
        ];
        for layout in layouts {
            for fetched in [0.0, 1.0, 1.4, 2.0, 3.0, 6.0, 38.0] {
                let plans = vec![counts(2.0, fetched, 1.0); layout.plans()];
                let one = EngineSettings { fetch_chunks: 1 };
                let s = LayerSchedule::new(&layout, &one, &plans);
                assert!(!kinds(&s).contains(&OpKind::FetchedEarly), "{fetched}");
                assert_eq!(s.fetch_chunk_bounds(fetched).len(), 1);
                for fetch_chunks in 1..=MAX_FETCH_CHUNKS {
                    let settings = EngineSettings { fetch_chunks };
                    let s = LayerSchedule::new(&layout, &settings, &plans);
                    assert_eq!(s.fetch_chunks, fetch_chunks);
                    let bounds = s.fetch_chunk_bounds(fetched);
                    assert_eq!(
                        bounds,
                        crate::plan::fetch_chunk_bounds_at_most(
                            fetched.round() as usize,
                            fetch_chunks
                        )
                    );
                    let early = s.ops.iter().filter(|o| o.kind == OpKind::FetchedEarly);
                    let want = if bounds.len() > 1 { s.gpus as usize } else { 0 };
                    assert_eq!(early.count(), want, "{layout:?} {fetched} {fetch_chunks}");
                }
            }
        }
    }

    #[test]
    fn the_longest_path_waits_for_every_predecessor() {
        let s = LayerSchedule::new(
            &GpuLayout::single(),
            &EngineSettings::default(),
            &[counts(2.0, 4.0, 1.0)],
        );
        // Every operation 1 us: the longest chain is Dense, Hits, FetchedEarly, LastLaunch,
        // LastChunk, Combine, Residual.
        assert_eq!(s.longest_path(|_| 1.0), 7.0);
        // A slow CPU share makes its chain the longest: Issue/Dense, CpuShare, RoundTrip,
        // Combine, Residual.
        let t = s.longest_path(|o| {
            if o.kind == OpKind::CpuShare {
                100.0
            } else {
                1.0
            }
        });
        assert_eq!(t, 1.0 + 100.0 + 1.0 + 1.0 + 1.0);
    }

    #[test]
    fn work_is_keyed_by_the_operations_present() {
        assert_eq!(LayerWork::of(&[counts(3.0, 0.0, 0.0)]), LayerWork::GpuOnly);
        assert_eq!(LayerWork::of(&[counts(0.0, 1.0, 0.0)]), LayerWork::Gather);
        assert_eq!(LayerWork::of(&[counts(0.0, 0.0, 1.0)]), LayerWork::CpuShare);
        assert_eq!(
            LayerWork::of(&[counts(0.0, 1.0, 0.0), counts(0.0, 0.0, 1.0)]),
            LayerWork::GatherAndCpuShare
        );
        let names: std::collections::BTreeSet<_> =
            LayerWork::ALL.iter().map(|w| w.name()).collect();
        assert_eq!(names.len(), LayerWork::ALL.len());
    }
}
