//! One MoE layer of a decode step on G GPUs, timed on the resources: the per-layer process.
//!
//! The order is the layer schedule's (`ft_model::schedule::LayerSchedule`): the
//! [`LayerMachine`] walks its operations and starts each on its resource once the
//! operations it waits for have ended, with the durations [`crate::costs::CostModel::layer_on`]
//! gives each GPU ([`LayerCosts`]). Nothing here orders a layer's work by hand; the table on
//! [`LayerMachine`] maps each kind of operation to its resource. One GPU and several are the
//! same machine (one lane of resources per GPU, a peer combine where there are several), as
//! they are one schedule and one closed form in `ft_model`.
//!
//! Contention: while a copy stream moves bytes and the CPU reads weights, each gets its
//! contended DRAM bandwidth (over every GPU's lane: they share the host's DRAM); every start
//! or end of either re-rates the other's job and reschedules its completion (a stale
//! completion is recognised by its generation).

use ft_model::placement::GpuLayout;
use std::sync::Arc;

use ft_model::schedule::{LayerSchedule, OpKind};

use crate::resources::{CpuPool, Dram, DramUser, GpuStream, Link, Phase, PhasedJob, TransferJob};
use crate::scheduler::Scheduler;
use crate::time::{ceil_ns, Nanos};

/// Label of a gather job on the H2D link.
pub const TAG_GATHER: u8 = 0;
/// Label of a CPU result copy on the H2D link.
pub const TAG_RESULT: u8 = 1;

/// What one layer costs, from the perf cost terms (durations in ns, sizes in bytes).
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct LayerCosts {
    /// GPU time of the dense part at this step's batch and context, ns (its launches are
    /// part of it).
    pub dense_ns: f64,
    /// Launch overhead of each expert kernel and of the combine, ns (hidden when the
    /// stream is still busy with the previous kernel).
    pub launch_ns: f64,
    /// GPU time of the hit experts' kernel after its launch, ns (no kernel without hits).
    pub hit_kernel_ns: f64,
    /// Whether there is a hit kernel (a layer without hits launches none).
    pub has_hits: bool,
    /// GPU time of the fetched chunks before the last ([`ft_model::plan::fetch_chunk_bounds`])
    /// after their launches, ns: queued on the GPU stream after the hits, one launch each
    /// (`fetched_early_launches` x `launch_ns`, paid one after another), beside the gather
    /// whose earlier copies they compute (the analytic model's `early`).
    pub fetched_early_ns: f64,
    /// How many chunks come before the last.
    pub fetched_early_launches: u32,
    /// GPU time of the last fetched chunk's kernel after its launch, ns: it follows the
    /// gather's last copy and the kernels before it, its launch paid after both, or (gated)
    /// after the kernels before it alone.
    pub fetched_kernel_ns: f64,
    /// Whether the last fetched chunk is gated on a flag (the single-GPU runtime's default,
    /// `gate_last_chunk`): its launch overlaps the gather (the analytic model's `launch`).
    pub fetched_gated: bool,
    /// Calibrated fixed cost of the layer's work (`ft_model::schedule::LayerWork`), ns,
    /// added after the layer's last kernel (the schedule's `Residual`; 0 until an
    /// end-to-end probe fits it).
    pub overhead_ns: f64,
    /// The gather of the fetched (and staged) misses; `None` when there is none.
    pub gather: Option<TransferJob>,
    /// The CPU share; `None` when every miss is fetched.
    pub cpu: Option<CpuShare>,
}

/// The CPU half of a layer.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct CpuShare {
    /// The activations' copy to the host.
    pub d2h: TransferJob,
    /// GPU-to-host event round trip after the copy, ns.
    pub sync_ns: f64,
    /// Fixed CPU time (per-layer, per-expert and per-token compute costs), ns.
    pub fixed_ns: f64,
    /// Expert weight bytes the CPU reads from host DRAM.
    pub bytes: f64,
    /// The partial output's copy back to the GPU.
    pub result: TransferJob,
    /// GPU time of the sum of the two partial outputs after its launch, ns.
    pub sum_ns: f64,
}

/// Events of a layer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LayerEvent {
    /// An operation of the schedule waiting for this time may start (on a copy stream or
    /// the CPU).
    Wake,
    /// The H2D link finished its current job (stale unless `gen` matches).
    H2dDone(u32),
    /// The activations are on the host and the CPU was notified.
    CpuStart,
    /// The CPU's fixed costs are paid; it starts reading weights.
    CpuBytesStart,
    /// The CPU finished reading weights (stale unless `gen` matches).
    CpuBytesDone(u32),
    /// The layer's output is ready.
    LayerDone,
    /// The decode process starts its next step (after a prefill); not a layer event.
    StepStart,
}

/// A [`LayerEvent`] of one GPU's lane (0 on one GPU).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LaneEvent {
    /// The GPU whose layer machine the event is for.
    pub lane: u16,
    /// The event.
    pub event: LayerEvent,
}

impl From<LayerEvent> for LaneEvent {
    fn from(event: LayerEvent) -> Self {
        LaneEvent { lane: 0, event }
    }
}

/// The resources a layer runs on (they persist across layers and steps).
#[derive(Debug, Clone)]
pub struct Resources {
    /// GPU compute stream.
    pub gpu: GpuStream,
    /// Host-to-device copy stream.
    pub h2d: Link,
    /// Device-to-host copy stream.
    pub d2h: Link,
    /// Host DRAM shared by the CPU and DMA.
    pub dram: Dram,
    /// CPU expert pool.
    pub cpu: CpuPool,
}

/// Per-layer timeline (absolute times in ns; 0 where the piece did not happen).
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct LayerTimes {
    /// When the layer started.
    pub start: Nanos,
    /// When the dense part ended.
    pub dense_end: Nanos,
    /// When the hit kernel ended.
    pub hits_end: Nanos,
    /// When the gather ended.
    pub gather_end: Nanos,
    /// When the GPU side (dense, hits, fetched kernel) was done.
    pub gpu_side_end: Nanos,
    /// When the CPU began its share (after D2H and the round trip).
    pub cpu_start: Nanos,
    /// When the CPU finished its share.
    pub cpu_end: Nanos,
    /// When the CPU result reached the GPU.
    pub cpu_side_end: Nanos,
    /// When the output was ready.
    pub end: Nanos,
    /// Time the gather and CPU weight reads overlapped (contended), ns.
    pub contended_ns: Nanos,
}

/// Index of each resource in a [`CriticalSplit`], in `ft_model::perf::Resource::ALL`
/// order: pcie, cpu, gpu, sync, dense, other.
pub const CRITICAL_NAMES: [&str; 6] = ["pcie", "cpu", "gpu", "sync", "dense", "other"];

/// Critical-path time of each resource (see [`CRITICAL_NAMES`]), ns.
pub type CriticalSplit = [f64; 6];

impl LayerTimes {
    /// Attribute the layer's duration to the resources on its critical path, as the
    /// analytic model does: the dense part; then the later of the two sides (the GPU side:
    /// the gather if it ended after the hits, else the hits, then the fetched kernel; the
    /// CPU side: its compute, with the copies and round trip around it as sync); then the
    /// combine and the overhead after both (gpu, other).
    pub fn critical(&self, overhead_ns: f64) -> CriticalSplit {
        let mut c = [0.0; 6];
        let d = |a: Nanos, b: Nanos| b.saturating_sub(a) as f64;
        c[4] = d(self.start, self.dense_end);
        let body_end = self.gpu_side_end.max(self.cpu_side_end);
        if self.cpu_side_end > self.gpu_side_end {
            c[1] = d(self.cpu_start, self.cpu_end);
            c[3] = d(self.dense_end, self.cpu_start) + d(self.cpu_end, self.cpu_side_end);
        } else {
            let first = self.gather_end.max(self.hits_end).max(self.dense_end);
            if self.gather_end >= self.hits_end && self.gather_end > 0 {
                c[0] = d(self.dense_end, first);
            } else {
                c[2] = d(self.dense_end, first);
            }
            c[2] += d(first, self.gpu_side_end);
        }
        let tail = d(body_end, self.end);
        let other = overhead_ns.min(tail);
        c[5] = other;
        c[2] += tail - other;
        c
    }
}

/// Where the machine stands with one operation of the layer's schedule.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
enum OpState {
    /// Waiting for an operation it depends on (or, for a resource with events, for its
    /// ready time).
    #[default]
    Waiting,
    /// On a resource whose end comes as an event (a copy stream, the CPU).
    Running,
    /// Its end time is known.
    Done,
}

/// Whether `op` waits only for `dep`'s place in the GPU stream, not for its end: the GPU's
/// sum of the CPU's partial output is launched when that output lands, while the stream may
/// still run the kernels before it (its launch hides behind them). Every other dependency
/// waits for the end of what it depends on.
fn stream_order_only(op: OpKind, dep: OpKind) -> bool {
    op == OpKind::Combine
        && matches!(
            dep,
            OpKind::Dense | OpKind::Hits | OpKind::FetchedEarly | OpKind::LastChunk
        )
}

/// Whether an operation runs on the GPU's compute stream (what the GPU side of
/// [`LayerTimes`] spans; the combine is counted after it).
fn on_gpu_side(kind: OpKind) -> bool {
    matches!(
        kind,
        OpKind::Dense | OpKind::Hits | OpKind::FetchedEarly | OpKind::LastChunk
    )
}

/// What one GPU's lane keeps while a layer runs: its costs, the generations of its
/// rescheduled completions, its CPU read and its timeline.
#[derive(Debug, Clone, Default)]
struct Lane {
    costs: LayerCosts,
    h2d_gen: u32,
    cpu_gen: u32,
    cpu_job: PhasedJob,
    cpu_reading: bool,
    overlap_since: Option<Nanos>,
    times: LayerTimes,
    /// Operations whose end is an event of this lane: the gather, the CPU share, the round
    /// trip's copy back.
    gather_op: Option<usize>,
    cpu_op: Option<usize>,
    trip_op: Option<usize>,
    /// Times a [`LayerEvent::Wake`] is pending for.
    wakes: Vec<Nanos>,
    /// The end of the lane's last operation (before the peer combine and the residual).
    body_end: Nanos,
}

/// The layer machine: one MoE layer on G GPUs, its events taken from the layer's
/// [`LayerSchedule`].
///
/// The machine walks the schedule's operations in order; an operation starts once every
/// operation it waits for has ended, on its resource:
///
/// | operation | resource | duration (from [`LayerCosts`] of its GPU) |
/// |---|---|---|
/// | `Dense` | GPU stream | `dense_ns`, no launch |
/// | `Hits` | GPU stream | launch + `hit_kernel_ns` |
/// | `FetchedEarly` | GPU stream | `fetched_early_launches` launches + `fetched_early_ns` |
/// | `Gather` | H2D copy stream (FIFO, DRAM-contended) | the gather job |
/// | `LastLaunch` | host | the last chunk's launch where it is gated, else nothing |
/// | `LastChunk` | GPU stream | `fetched_kernel_ns` (its launch here unless gated) |
/// | `Issue` | host | nothing here: the host's wait is part of the CPU share's fixed time |
/// | `CpuShare` | D2H stream, then the CPU pool | activations out, `sync_ns`, wake-up and fixed time, then the weight bytes (DRAM-contended) |
/// | `RoundTrip` | H2D copy stream (FIFO behind the gather) | the partial output back |
/// | `Combine` | GPU stream | launch + `sum_ns`, launched when the CPU's output lands |
/// | `PeerCombine` | interconnect | `combine_ns` (several GPUs) |
/// | `Residual` | none | `overhead_ns` |
///
/// Operations on the GPU stream and on the host have their end known when they start (the
/// stream is in order; a kernel starts at max(ready + launch, stream free)), so they cost no
/// event; an operation on a copy stream or the CPU starts at an event ([`LayerEvent::Wake`]
/// at its ready time) and ends at one. Each GPU has its own resources (its lane) whose
/// [`Dram`] is a view of the one host DRAM: after every event of one lane the others are
/// told what it now reads ([`Dram::set_others`]) and re-rated. One GPU is the G = 1 case:
/// one lane, no peer combine.
#[derive(Debug, Clone)]
pub struct LayerMachine {
    /// Each GPU's resources (they persist across layers and steps).
    pub res: Vec<Resources>,
    lanes: Vec<Lane>,
    schedule: Option<Arc<LayerSchedule>>,
    state: Vec<OpState>,
    /// Each operation's end (valid once `Done`) and the time it was resolved (issued).
    end: Vec<Nanos>,
    issued: Vec<Nanos>,
    start: Nanos,
    combine_ns: f64,
    slowest: usize,
    running: bool,
}

impl LayerMachine {
    /// A machine over `res` (one per GPU) whose layers combine the GPUs' outputs in
    /// `combine_ns` (several GPUs; unused on one).
    pub fn new(res: Vec<Resources>, combine_ns: f64) -> Self {
        let n = res.len();
        LayerMachine {
            res,
            lanes: (0..n)
                .map(|_| Lane {
                    cpu_job: PhasedJob::new(),
                    ..Default::default()
                })
                .collect(),
            schedule: None,
            state: Vec::new(),
            end: Vec::new(),
            issued: Vec::new(),
            start: 0,
            combine_ns,
            slowest: 0,
            running: false,
        }
    }

    /// Number of GPUs.
    pub fn gpus(&self) -> usize {
        self.res.len()
    }

    /// Timeline of GPU `g`'s part of the last (or current) layer.
    pub fn times(&self, g: usize) -> &LayerTimes {
        &self.lanes[g].times
    }

    /// Costs of GPU `g`'s part of the last (or current) layer.
    pub fn costs(&self, g: usize) -> &LayerCosts {
        &self.lanes[g].costs
    }

    /// Whether GPU `g`'s CPU share is reading weights now.
    pub fn cpu_reading(&self, g: usize) -> bool {
        self.lanes[g].cpu_reading
    }

    /// The GPU whose part of the layer ended last (its timeline is the layer's critical
    /// path).
    pub fn slowest(&self) -> usize {
        self.slowest
    }

    /// The peer combine's duration, ns.
    pub fn combine_ns(&self) -> f64 {
        self.combine_ns
    }

    /// The schedule of the last (or current) layer (its operations; the decode process
    /// shares one per structure of work, so its counts are those of the first layer with
    /// that structure: the durations are in [`LayerMachine::costs`]).
    pub fn schedule(&self) -> Option<&LayerSchedule> {
        self.schedule.as_deref()
    }

    fn ev(g: usize, event: LayerEvent) -> LaneEvent {
        LaneEvent {
            lane: g as u16,
            event,
        }
    }

    /// Start `schedule` at `now`, `costs[g]` on GPU `g`.
    pub fn start(
        &mut self,
        now: Nanos,
        schedule: Arc<LayerSchedule>,
        costs: &[LayerCosts],
        s: &mut Scheduler<LaneEvent>,
    ) {
        debug_assert_eq!(schedule.gpus as usize, self.res.len(), "one lane per GPU");
        let n = schedule.ops.len();
        self.state.clear();
        self.state.resize(n, OpState::Waiting);
        self.end.clear();
        self.end.resize(n, 0);
        self.issued.clear();
        self.issued.resize(n, 0);
        for (g, lane) in self.lanes.iter_mut().enumerate() {
            lane.costs = costs[g];
            lane.cpu_reading = false;
            lane.overlap_since = None;
            lane.times = LayerTimes {
                start: now,
                ..Default::default()
            };
            lane.gather_op = None;
            lane.cpu_op = None;
            lane.trip_op = None;
            lane.wakes.clear();
            lane.body_end = now;
        }
        for (i, op) in schedule.ops.iter().enumerate() {
            let lane = &mut self.lanes[op.gpu as usize];
            match op.kind {
                OpKind::Gather => lane.gather_op = Some(i),
                OpKind::CpuShare => lane.cpu_op = Some(i),
                OpKind::RoundTrip => lane.trip_op = Some(i),
                _ => {}
            }
        }
        self.schedule = Some(schedule);
        self.start = now;
        self.running = true;
        self.advance(now, s);
    }

    fn finish(&mut self, i: usize, now: Nanos, end: Nanos) {
        self.state[i] = OpState::Done;
        self.end[i] = end;
        self.issued[i] = now;
    }

    /// Start every operation whose dependencies have ended: those with a known end are
    /// resolved at once (in schedule order, so a chain resolves in one pass), those on a
    /// resource with events start now or at a wake-up at their ready time.
    fn advance(&mut self, now: Nanos, s: &mut Scheduler<LaneEvent>) {
        let Some(schedule) = self.schedule.take() else {
            return;
        };
        for (i, op) in schedule.ops.iter().enumerate() {
            if self.state[i] != OpState::Waiting {
                continue;
            }
            let mut ready = self.start;
            let mut blocked = false;
            for &d in &op.after {
                if self.state[d] != OpState::Done {
                    blocked = true;
                    break;
                }
                let t = if stream_order_only(op.kind, schedule.ops[d].kind) {
                    self.issued[d]
                } else {
                    self.end[d]
                };
                ready = ready.max(t);
            }
            if blocked {
                continue;
            }
            let g = op.gpu as usize;
            let c = self.lanes[g].costs;
            let gpu = &mut self.res[g].gpu;
            let end = match op.kind {
                OpKind::Dense => {
                    let e = gpu.submit(ready, 0.0, c.dense_ns);
                    self.lanes[g].times.dense_end = e;
                    e
                }
                OpKind::Hits if c.has_hits => {
                    let e = gpu.submit(ready, c.launch_ns, c.hit_kernel_ns);
                    self.lanes[g].times.hits_end = e;
                    e
                }
                OpKind::FetchedEarly if c.fetched_early_launches > 0 => {
                    let launches = c.fetched_early_launches as f64 * c.launch_ns;
                    gpu.submit(ready, launches, c.fetched_early_ns)
                }
                OpKind::Hits | OpKind::FetchedEarly | OpKind::Issue => ready,
                OpKind::LastLaunch if c.fetched_gated => ready + ceil_ns(c.launch_ns),
                OpKind::LastLaunch => ready,
                OpKind::LastChunk => {
                    let launch = if c.fetched_gated { 0.0 } else { c.launch_ns };
                    gpu.submit(ready, launch, c.fetched_kernel_ns)
                }
                OpKind::Combine => {
                    let sum = c.cpu.map_or(0.0, |x| x.sum_ns);
                    gpu.submit(ready, c.launch_ns, sum)
                }
                OpKind::PeerCombine => ready + ceil_ns(self.combine_ns),
                OpKind::Residual => ready + ceil_ns(c.overhead_ns),
                OpKind::Gather | OpKind::CpuShare | OpKind::RoundTrip => {
                    if ready > now {
                        let lane = &mut self.lanes[g];
                        if !lane.wakes.contains(&ready) {
                            lane.wakes.push(ready);
                            s.schedule_at(ready, Self::ev(g, LayerEvent::Wake));
                        }
                        continue;
                    }
                    self.state[i] = OpState::Running;
                    self.issue_evented(op.kind, g, now, s);
                    continue;
                }
            };
            self.finish(i, now, end);
            if on_gpu_side(op.kind) {
                let t = &mut self.lanes[g].times;
                t.gpu_side_end = t.gpu_side_end.max(end);
            }
            match op.kind {
                OpKind::PeerCombine => {}
                OpKind::Residual => self.layer_ends(end, s),
                _ => {
                    let lane = &mut self.lanes[g];
                    lane.body_end = lane.body_end.max(end);
                }
            }
        }
        self.schedule = Some(schedule);
    }

    /// The residual of the layer ends at `end`: every lane's timeline ends then (less the
    /// peer combine after the slowest), and the layer's end is an event.
    fn layer_ends(&mut self, end: Nanos, s: &mut Scheduler<LaneEvent>) {
        let residual = ceil_ns(self.lanes[0].costs.overhead_ns);
        for lane in &mut self.lanes {
            lane.times.end = lane.body_end + residual;
        }
        self.slowest = self
            .lanes
            .iter()
            .enumerate()
            .max_by_key(|(i, l)| (l.times.end, std::cmp::Reverse(*i)))
            .map_or(0, |(i, _)| i);
        s.schedule_at(end, Self::ev(0, LayerEvent::LayerDone));
    }

    /// Start an operation whose end comes as an event, on lane `g` at `now`.
    fn issue_evented(&mut self, kind: OpKind, g: usize, now: Nanos, s: &mut Scheduler<LaneEvent>) {
        let c = self.lanes[g].costs;
        match kind {
            OpKind::Gather => {
                let job = c.gather.expect("a gather in the costs of a Gather");
                self.submit_h2d(g, now, job, s);
            }
            OpKind::CpuShare => {
                let cpu = c.cpu.expect("a CPU share in the costs of a CpuShare");
                let r = &mut self.res[g];
                let t = r.d2h.submit(now, cpu.d2h, r.d2h.params().isolated_gbs);
                let t = t.expect("the D2H stream is idle at a layer's start");
                s.schedule_at(t + ceil_ns(cpu.sync_ns), Self::ev(g, LayerEvent::CpuStart));
            }
            OpKind::RoundTrip => {
                let cpu = c.cpu.expect("a CPU share in the costs of a RoundTrip");
                self.submit_h2d(g, now, cpu.result, s);
            }
            _ => unreachable!("{kind:?} ends when it starts"),
        }
    }

    /// Re-rate lane `g`'s running CPU read and link job at `now` to what DRAM gives them now
    /// (other lanes' readers started or stopped), rescheduling their completions when a rate
    /// changed.
    fn rerate(&mut self, g: usize, now: Nanos, s: &mut Scheduler<LaneEvent>) {
        let (lane, r) = (&mut self.lanes[g], &mut self.res[g]);
        if lane.cpu_reading {
            let rate = r.dram.rate_gbs(DramUser::Cpu);
            if rate != lane.cpu_job.rate() {
                let t = lane.cpu_job.set_rate(now, rate);
                lane.cpu_gen += 1;
                s.schedule_at(t, Self::ev(g, LayerEvent::CpuBytesDone(lane.cpu_gen)));
            }
        }
        if r.h2d.is_busy() {
            let rate = r.dram.rate_gbs(DramUser::Dma);
            if Some(rate) != r.h2d.rate() {
                if let Some(t) = r.h2d.set_rate(now, rate) {
                    lane.h2d_gen += 1;
                    s.schedule_at(t, Self::ev(g, LayerEvent::H2dDone(lane.h2d_gen)));
                }
            }
        }
    }

    fn overlap_check(&mut self, g: usize, now: Nanos) {
        let (lane, r) = (&mut self.lanes[g], &self.res[g]);
        let both = r.h2d.is_busy() && lane.cpu_reading;
        match (both, lane.overlap_since) {
            (true, None) => lane.overlap_since = Some(now),
            (false, Some(t)) => {
                lane.times.contended_ns += now - t;
                lane.overlap_since = None;
            }
            _ => {}
        }
    }

    /// Lane `g`'s DMA became active or idle: tell DRAM and re-rate the CPU's reads.
    fn dma_active(&mut self, g: usize, now: Nanos, active: bool, s: &mut Scheduler<LaneEvent>) {
        let (lane, r) = (&mut self.lanes[g], &mut self.res[g]);
        if r.dram.set_active(DramUser::Dma, active) && lane.cpu_reading {
            let t = lane.cpu_job.set_rate(now, r.dram.rate_gbs(DramUser::Cpu));
            lane.cpu_gen += 1;
            s.schedule_at(t, Self::ev(g, LayerEvent::CpuBytesDone(lane.cpu_gen)));
        }
        self.overlap_check(g, now);
    }

    /// Lane `g`'s CPU started or stopped reading: tell DRAM and re-rate the link's job.
    fn cpu_active(&mut self, g: usize, now: Nanos, active: bool, s: &mut Scheduler<LaneEvent>) {
        let (lane, r) = (&mut self.lanes[g], &mut self.res[g]);
        lane.cpu_reading = active;
        if r.dram.set_active(DramUser::Cpu, active) && r.h2d.is_busy() {
            if let Some(t) = r.h2d.set_rate(now, r.dram.rate_gbs(DramUser::Dma)) {
                lane.h2d_gen += 1;
                s.schedule_at(t, Self::ev(g, LayerEvent::H2dDone(lane.h2d_gen)));
            }
        }
        self.overlap_check(g, now);
    }

    fn submit_h2d(&mut self, g: usize, now: Nanos, job: TransferJob, s: &mut Scheduler<LaneEvent>) {
        if !self.res[g].h2d.is_busy() {
            // DRAM first, so that the job starts at the rate it will get.
            self.dma_active(g, now, true, s);
        }
        let r = &mut self.res[g];
        if let Some(t) = r.h2d.submit(now, job, r.dram.rate_gbs(DramUser::Dma)) {
            let lane = &mut self.lanes[g];
            lane.h2d_gen += 1;
            s.schedule_at(t, Self::ev(g, LayerEvent::H2dDone(lane.h2d_gen)));
        }
    }

    /// Operation `i` (on an event's resource) ended at `now`.
    fn evented_done(&mut self, i: Option<usize>, now: Nanos) {
        let i = i.expect("the operation of a running job");
        self.finish(i, now, now);
        let g = self.schedule.as_ref().map_or(0, |s| s.ops[i].gpu as usize);
        let lane = &mut self.lanes[g];
        lane.body_end = lane.body_end.max(now);
    }

    /// Handle an event; returns the layer's end time when it is done on every GPU.
    pub fn handle(
        &mut self,
        now: Nanos,
        ev: LaneEvent,
        s: &mut Scheduler<LaneEvent>,
    ) -> Option<Nanos> {
        let g = ev.lane as usize;
        let done = self.handle_lane(now, g, ev.event, s);
        if self.res.len() > 1 {
            self.share_dram(now, g, s);
        }
        done
    }

    fn handle_lane(
        &mut self,
        now: Nanos,
        g: usize,
        ev: LayerEvent,
        s: &mut Scheduler<LaneEvent>,
    ) -> Option<Nanos> {
        // A rate change reschedules a completion and leaves the earlier event behind, stale;
        // it may come after the layer has ended (another lane's rate change, then the layer
        // finished sooner than the stale time).
        let lane = &self.lanes[g];
        let stale = match ev {
            LayerEvent::H2dDone(gen) => gen != lane.h2d_gen,
            LayerEvent::CpuBytesDone(gen) => gen != lane.cpu_gen,
            _ => false,
        };
        if stale {
            return None;
        }
        debug_assert!(self.running, "event {ev:?} for an idle layer");
        match ev {
            LayerEvent::Wake => {
                self.lanes[g].wakes.retain(|&t| t > now);
            }
            LayerEvent::CpuStart => {
                let c = self.lanes[g].costs.cpu.expect("a CPU share");
                let r = &mut self.res[g];
                let (_, next) = r.d2h.complete(now, r.d2h.params().isolated_gbs);
                debug_assert!(next.is_none());
                self.lanes[g].times.cpu_start = now;
                let wake = r.cpu.begin(now);
                s.schedule_at(
                    now + ceil_ns(wake + c.fixed_ns),
                    Self::ev(g, LayerEvent::CpuBytesStart),
                );
                return None;
            }
            LayerEvent::CpuBytesStart => {
                let c = self.lanes[g].costs.cpu.expect("a CPU share");
                self.cpu_active(g, now, true, s);
                let rate = self.res[g].dram.rate_gbs(DramUser::Cpu);
                let lane = &mut self.lanes[g];
                lane.cpu_job.clear();
                lane.cpu_job.push(Phase::Bytes(c.bytes));
                let t = lane.cpu_job.start(now, rate);
                lane.cpu_gen += 1;
                s.schedule_at(t, Self::ev(g, LayerEvent::CpuBytesDone(lane.cpu_gen)));
                return None;
            }
            LayerEvent::CpuBytesDone(_) => {
                self.lanes[g].cpu_job.complete();
                self.lanes[g].times.cpu_end = now;
                self.cpu_active(g, now, false, s);
                self.res[g].cpu.end(now);
                self.evented_done(self.lanes[g].cpu_op, now);
            }
            LayerEvent::H2dDone(_) => {
                let r = &mut self.res[g];
                let (done, next) = r.h2d.complete(now, r.dram.rate_gbs(DramUser::Dma));
                match next {
                    Some(t) => {
                        let lane = &mut self.lanes[g];
                        lane.h2d_gen += 1;
                        s.schedule_at(t, Self::ev(g, LayerEvent::H2dDone(lane.h2d_gen)));
                    }
                    None => self.dma_active(g, now, false, s),
                }
                match done.map(|d| d.tag) {
                    Some(TAG_GATHER) => {
                        self.lanes[g].times.gather_end = now;
                        self.evented_done(self.lanes[g].gather_op, now);
                    }
                    Some(_) => {
                        self.lanes[g].times.cpu_side_end = now;
                        self.evented_done(self.lanes[g].trip_op, now);
                    }
                    None => return None,
                }
            }
            LayerEvent::LayerDone => {
                self.running = false;
                return Some(now);
            }
            LayerEvent::StepStart => return None,
        }
        self.advance(now, s);
        None
    }

    /// Tell every lane what the others read now and re-rate the lanes other than `changed`
    /// (whose own event already rated its jobs against an unchanged rest).
    fn share_dram(&mut self, now: Nanos, changed: usize, s: &mut Scheduler<LaneEvent>) {
        let demand = |d: &Dram, u: DramUser| {
            if d.is_active(u) {
                d.demand_gbs(u)
            } else {
                0.0
            }
        };
        let (total_c, total_d) = self.res.iter().fold((0.0, 0.0), |(c, d), r| {
            (
                c + demand(&r.dram, DramUser::Cpu),
                d + demand(&r.dram, DramUser::Dma),
            )
        });
        for j in 0..self.res.len() {
            let own = &self.res[j].dram;
            let (c, d) = (
                total_c - demand(own, DramUser::Cpu),
                total_d - demand(own, DramUser::Dma),
            );
            self.res[j].dram.set_others(c, d);
            if j != changed {
                self.rerate(j, now, s);
            }
        }
    }
}

/// The schedule of one GPU's layer whose costs are `c`: the operations its costs hold (a
/// hit kernel, a gather in one chunk or several, a CPU share), for timing hand-made costs.
pub fn schedule_of(c: &LayerCosts) -> LayerSchedule {
    let counts = ft_model::perf::LayerCounts {
        hits: f64::from(u8::from(c.has_hits)),
        hit_tokens: 0.0,
        // Two experts gather in two chunks, one in one (`ft_model::plan::fetch_chunk_bounds`).
        fetched: c.gather.map_or(0.0, |_| {
            if c.fetched_early_launches > 0 {
                2.0
            } else {
                1.0
            }
        }),
        fetched_tokens: 0.0,
        cpu: f64::from(u8::from(c.cpu.is_some())),
        cpu_tokens: 0.0,
    };
    // At the default chunk count (two experts: two chunks).
    LayerSchedule::new(
        &GpuLayout::single(),
        &ft_model::EngineSettings::default(),
        &[counts],
    )
}

/// Runs layers back to back on one GPU's [`LayerMachine`]: the engine alone, without
/// routing or planning (for tests against [`crate::reference`] and for measuring the
/// engine's event rate).
#[derive(Debug)]
pub struct LayerRunner {
    machine: LayerMachine,
    costs: Vec<LayerCosts>,
    next: usize,
    ends: Vec<Nanos>,
}

impl LayerRunner {
    /// A runner that will time `costs`, one layer after the other ([`schedule_of`] each),
    /// on `resources`.
    pub fn new(resources: Resources, costs: Vec<LayerCosts>) -> Self {
        LayerRunner {
            machine: LayerMachine::new(vec![resources], 0.0),
            ends: Vec::with_capacity(costs.len()),
            costs,
            next: 0,
        }
    }

    /// Run every layer from time 0; returns each layer's end time (ns) and the events
    /// handled.
    pub fn run(mut self, seed: u64) -> (Vec<Nanos>, u64) {
        let mut s = Scheduler::new(seed);
        if !self.costs.is_empty() {
            s.schedule_at(0, LaneEvent::from(LayerEvent::StepStart));
        }
        s.run(&mut self, None);
        (self.ends, s.handled())
    }
}

impl crate::component::Component<LaneEvent> for LayerRunner {
    fn handle(
        &mut self,
        now: Nanos,
        ev: LaneEvent,
        s: &mut Scheduler<LaneEvent>,
    ) -> crate::component::Control {
        use crate::component::Control;
        let start = if ev.event == LayerEvent::StepStart {
            true
        } else if let Some(end) = self.machine.handle(now, ev, s) {
            self.ends.push(end);
            true
        } else {
            false
        };
        if start {
            if self.next == self.costs.len() {
                return Control::Stop;
            }
            let c = self.costs[self.next];
            self.next += 1;
            self.machine.start(now, Arc::new(schedule_of(&c)), &[c], s);
        }
        Control::Continue
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::costs::CostModel;
    use ft_model::ModelSpec;

    /// Stale completions (left behind by a rate change) are ignored, also once the layer has
    /// ended: the two-GPU presets re-rate one lane's link when the other's readers change,
    /// and a debug build asserted on the stale event (`experiments/multi-gpu`).
    #[test]
    fn stale_completions_after_the_layer_are_ignored() {
        let h = crate::hosts::preset(crate::hosts::DEFAULT_HOST).unwrap();
        let m = ModelSpec::preset("qwen3.8-flash-next").unwrap();
        let cm = CostModel::from_host(&h, &m).unwrap();
        let mut s = Scheduler::new(0);
        let mut lm = LayerMachine::new(vec![cm.resources(), cm.resources()], 0.0);
        lm.lanes[1].h2d_gen = 3;
        lm.lanes[1].cpu_gen = 2;
        for event in [LayerEvent::H2dDone(2), LayerEvent::CpuBytesDone(1)] {
            assert_eq!(lm.handle(10, LaneEvent { lane: 1, event }, &mut s), None);
        }
        assert_eq!(s.pending(), 0, "a stale event schedules nothing");
        assert_eq!(lm.times(1), &LayerTimes::default());
    }

    /// The machine's order is the schedule's: every operation starts after those it waits
    /// for, on one GPU and on two (the two GPUs' layers end, then the peer combine, then the
    /// residual).
    #[test]
    fn operations_start_after_what_they_wait_for() {
        let h = crate::hosts::preset(crate::hosts::DEFAULT_HOST).unwrap();
        let m = ModelSpec::preset("qwen3.8-flash-next").unwrap();
        let cm = CostModel::from_host(&h, &m).unwrap();
        let c = ft_model::perf::LayerCounts {
            hits: 5.0,
            hit_tokens: 5.0,
            fetched: 6.0,
            fetched_tokens: 6.0,
            cpu: 3.0,
            cpu_tokens: 3.0,
        };
        for layout in [
            GpuLayout::single(),
            GpuLayout::new(2, ft_model::placement::GpuPlacement::TensorParallel).unwrap(),
        ] {
            let schedule = LayerSchedule::new(&layout, &cm.params.engine_settings, &[c]);
            let costs: Vec<LayerCosts> = (0..layout.gpus)
                .map(|g| cm.layer_on(&schedule, 2, 40_000.0, g))
                .collect();
            let res = (0..layout.gpus).map(|_| cm.resources()).collect();
            let mut lm = LayerMachine::new(res, 7_000.0);
            let mut s = Scheduler::new(0);
            lm.start(0, Arc::new(schedule), &costs, &mut s);
            struct Run<'a>(&'a mut LayerMachine, Option<Nanos>);
            impl crate::component::Component<LaneEvent> for Run<'_> {
                fn handle(
                    &mut self,
                    now: Nanos,
                    ev: LaneEvent,
                    s: &mut Scheduler<LaneEvent>,
                ) -> crate::component::Control {
                    self.1 = self.0.handle(now, ev, s).or(self.1);
                    crate::component::Control::Continue
                }
            }
            let mut run = Run(&mut lm, None);
            s.run(&mut run, None);
            let layer_end = run.1.expect("the layer ends");
            let sched = lm.schedule().unwrap();
            for (i, op) in sched.ops.iter().enumerate() {
                assert_eq!(lm.state[i], OpState::Done, "{op:?}");
                for &d in &op.after {
                    let waited = if stream_order_only(op.kind, sched.ops[d].kind) {
                        lm.issued[d]
                    } else {
                        lm.end[d]
                    };
                    assert!(
                        lm.end[i] >= waited,
                        "{op:?} ended before {:?}",
                        sched.ops[d]
                    );
                }
            }
            assert_eq!(layer_end, *lm.end.last().unwrap());
            let residual = ceil_ns(costs[0].overhead_ns);
            if layout.is_multi() {
                let peer = sched
                    .ops
                    .iter()
                    .position(|o| o.kind == OpKind::PeerCombine)
                    .unwrap();
                let body = (0..2).map(|g| lm.times(g).end).max().unwrap() - residual;
                assert_eq!(lm.end[peer], body + 7_000);
                assert_eq!(layer_end, body + 7_000 + residual);
            } else {
                assert_eq!(lm.times(0).end, layer_end);
            }
            let t = lm.times(0);
            assert!(t.dense_end < t.gather_end && t.gather_end <= t.gpu_side_end);
            assert!(t.cpu_start < t.cpu_end && t.cpu_end <= t.cpu_side_end);
        }
    }
}
