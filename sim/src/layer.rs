//! One MoE layer of a decode step, timed on the resources: the per-layer process.
//!
//! The order is the layer schedule's (`ft_model::schedule::LayerSchedule`, whose operations'
//! costs and properties [`crate::costs::CostModel::layer_on`] hands to the machine):
//! 1. the dense part (attention, router, shared experts) on the GPU stream;
//! 2. then, at once: the hit experts' kernel on the GPU stream, and behind it the fetched
//!    chunks before the last (`ft_model::plan::fetch_chunk_bounds`: each computes its
//!    copies as they land, beside the gather of the next); the gather of the fetched misses
//!    on the H2D copy stream; for a CPU share, the activations' copy to the host (D2H)
//!    followed by the event round trip that tells the CPU they are there;
//! 3. the last fetched chunk's kernel after the gather's last copy (and after the kernels
//!    before it: one stream); on one GPU gated, as the runtime's default, so its launch is
//!    paid when the stream reaches it, beside the gather, not after the last copy;
//! 4. the CPU share: wake-up (unless the pool spins), fixed costs, then the weight bytes at
//!    the CPU's DRAM bandwidth, contended while a copy runs;
//! 5. its result copied back on the same copy stream (behind the gather if that is still
//!    running) and summed into the output on the GPU;
//! 6. the layer is done when its last GPU kernel ends; the next layer starts then.
//!
//! Contention: while the copy stream moves bytes and the CPU reads weights, each gets its
//! contended DRAM bandwidth; every start or end of either re-rates the other's job and
//! reschedules its completion (a stale completion is recognised by its generation).

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
    /// The dense part ended.
    DenseDone,
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
    /// Every GPU finished the layer and their partial outputs are combined (several GPUs
    /// only); not an event of one GPU's [`LayerMachine`].
    CombineDone,
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

/// The state machine of the layer in progress.
#[derive(Debug, Clone, Default)]
pub struct LayerMachine {
    costs: LayerCosts,
    h2d_gen: u32,
    cpu_gen: u32,
    cpu_job: PhasedJob,
    gather_pending: bool,
    result_pending: bool,
    cpu_reading: bool,
    sum_deferred: bool,
    overlap_since: Option<Nanos>,
    times: LayerTimes,
    running: bool,
    lane: u16,
}

impl LayerMachine {
    /// An idle machine.
    pub fn new() -> Self {
        LayerMachine {
            cpu_job: PhasedJob::new(),
            ..Default::default()
        }
    }

    /// An idle machine for GPU `lane` (its events carry the lane).
    pub fn on_lane(lane: u16) -> Self {
        LayerMachine {
            lane,
            ..LayerMachine::new()
        }
    }

    fn ev(&self, event: LayerEvent) -> LaneEvent {
        LaneEvent {
            lane: self.lane,
            event,
        }
    }

    /// Whether the CPU share is reading weights now.
    pub fn cpu_reading(&self) -> bool {
        self.cpu_reading
    }

    /// Re-rate the running CPU read and link job at `now` to what DRAM gives them now (other
    /// lanes' readers started or stopped), rescheduling their completions when a rate
    /// changed.
    pub fn rerate(&mut self, now: Nanos, r: &mut Resources, s: &mut Scheduler<LaneEvent>) {
        if self.cpu_reading {
            let rate = r.dram.rate_gbs(DramUser::Cpu);
            if rate != self.cpu_job.rate() {
                let t = self.cpu_job.set_rate(now, rate);
                self.cpu_gen += 1;
                s.schedule_at(t, self.ev(LayerEvent::CpuBytesDone(self.cpu_gen)));
            }
        }
        if r.h2d.is_busy() {
            let rate = r.dram.rate_gbs(DramUser::Dma);
            if Some(rate) != r.h2d.rate() {
                if let Some(t) = r.h2d.set_rate(now, rate) {
                    self.h2d_gen += 1;
                    s.schedule_at(t, self.ev(LayerEvent::H2dDone(self.h2d_gen)));
                }
            }
        }
    }

    /// Timeline of the last (or current) layer.
    pub fn times(&self) -> &LayerTimes {
        &self.times
    }

    /// Costs of the last (or current) layer.
    pub fn costs(&self) -> &LayerCosts {
        &self.costs
    }

    /// Start a layer at `now`: enqueue its dense part.
    pub fn start(
        &mut self,
        now: Nanos,
        costs: LayerCosts,
        r: &mut Resources,
        s: &mut Scheduler<LaneEvent>,
    ) {
        self.costs = costs;
        self.gather_pending = costs.gather.is_some();
        self.result_pending = costs.cpu.is_some();
        self.cpu_reading = false;
        self.sum_deferred = false;
        self.overlap_since = None;
        self.times = LayerTimes {
            start: now,
            ..Default::default()
        };
        self.running = true;
        let end = r.gpu.submit(now, 0.0, costs.dense_ns);
        s.schedule_at(end, self.ev(LayerEvent::DenseDone));
    }

    fn overlap_check(&mut self, now: Nanos, r: &Resources) {
        let both = r.h2d.is_busy() && self.cpu_reading;
        match (both, self.overlap_since) {
            (true, None) => self.overlap_since = Some(now),
            (false, Some(t)) => {
                self.times.contended_ns += now - t;
                self.overlap_since = None;
            }
            _ => {}
        }
    }

    /// The link's DMA became active or idle: tell DRAM and re-rate the CPU's reads.
    fn dma_active(
        &mut self,
        now: Nanos,
        active: bool,
        r: &mut Resources,
        s: &mut Scheduler<LaneEvent>,
    ) {
        if r.dram.set_active(DramUser::Dma, active) && self.cpu_reading {
            let t = self.cpu_job.set_rate(now, r.dram.rate_gbs(DramUser::Cpu));
            self.cpu_gen += 1;
            s.schedule_at(t, self.ev(LayerEvent::CpuBytesDone(self.cpu_gen)));
        }
        self.overlap_check(now, r);
    }

    /// The CPU started or stopped reading: tell DRAM and re-rate the link's job.
    fn cpu_active(
        &mut self,
        now: Nanos,
        active: bool,
        r: &mut Resources,
        s: &mut Scheduler<LaneEvent>,
    ) {
        self.cpu_reading = active;
        if r.dram.set_active(DramUser::Cpu, active) && r.h2d.is_busy() {
            if let Some(t) = r.h2d.set_rate(now, r.dram.rate_gbs(DramUser::Dma)) {
                self.h2d_gen += 1;
                s.schedule_at(t, self.ev(LayerEvent::H2dDone(self.h2d_gen)));
            }
        }
        self.overlap_check(now, r);
    }

    fn submit_h2d(
        &mut self,
        now: Nanos,
        job: TransferJob,
        r: &mut Resources,
        s: &mut Scheduler<LaneEvent>,
    ) {
        let idle = !r.h2d.is_busy();
        if idle {
            // DRAM first, so that the job starts at the rate it will get.
            self.dma_active(now, true, r, s);
        }
        if let Some(t) = r.h2d.submit(now, job, r.dram.rate_gbs(DramUser::Dma)) {
            self.h2d_gen += 1;
            s.schedule_at(t, self.ev(LayerEvent::H2dDone(self.h2d_gen)));
        }
    }

    fn submit_sum(&mut self, now: Nanos, r: &mut Resources) {
        let sum = self.costs.cpu.map_or(0.0, |c| c.sum_ns);
        r.gpu.submit(now, self.costs.launch_ns, sum);
    }

    fn maybe_done(&mut self, r: &Resources, s: &mut Scheduler<LaneEvent>) {
        if !self.gather_pending && !self.result_pending {
            let end = r.gpu.busy_until() + ceil_ns(self.costs.overhead_ns);
            s.schedule_at(end, self.ev(LayerEvent::LayerDone));
        }
    }

    /// Handle an event of this layer; returns the end time when the layer is done.
    pub fn handle(
        &mut self,
        now: Nanos,
        ev: LayerEvent,
        r: &mut Resources,
        s: &mut Scheduler<LaneEvent>,
    ) -> Option<Nanos> {
        // A rate change reschedules a completion and leaves the earlier event behind, stale;
        // it may come after the layer has ended (another lane's rate change, then the layer
        // finished sooner than the stale time).
        let stale = match ev {
            LayerEvent::H2dDone(gen) => gen != self.h2d_gen,
            LayerEvent::CpuBytesDone(gen) => gen != self.cpu_gen,
            _ => false,
        };
        if stale {
            return None;
        }
        debug_assert!(self.running, "event {ev:?} for an idle layer");
        match ev {
            LayerEvent::DenseDone => {
                self.times.dense_end = now;
                if self.costs.has_hits {
                    self.times.hits_end =
                        r.gpu
                            .submit(now, self.costs.launch_ns, self.costs.hit_kernel_ns);
                }
                if self.costs.fetched_early_launches > 0 {
                    let ready = r.gpu.busy_until().max(now);
                    let launches = self.costs.fetched_early_launches as f64 * self.costs.launch_ns;
                    r.gpu.submit(ready, launches, self.costs.fetched_early_ns);
                }
                if let Some(g) = self.costs.gather {
                    self.submit_h2d(now, g, r, s);
                }
                if let Some(c) = self.costs.cpu {
                    let t = r.d2h.submit(now, c.d2h, r.d2h.params().isolated_gbs);
                    let t = t.expect("the D2H stream is idle at a layer's start");
                    s.schedule_at(t + ceil_ns(c.sync_ns), self.ev(LayerEvent::CpuStart));
                }
                self.times.gpu_side_end = r.gpu.busy_until();
                self.maybe_done(r, s);
            }
            LayerEvent::CpuStart => {
                let c = self.costs.cpu.expect("a CPU share");
                let (_, next) = r.d2h.complete(now, r.d2h.params().isolated_gbs);
                debug_assert!(next.is_none());
                self.times.cpu_start = now;
                let wake = r.cpu.begin(now);
                s.schedule_at(
                    now + ceil_ns(wake + c.fixed_ns),
                    self.ev(LayerEvent::CpuBytesStart),
                );
            }
            LayerEvent::CpuBytesStart => {
                let c = self.costs.cpu.expect("a CPU share");
                self.cpu_active(now, true, r, s);
                self.cpu_job.clear();
                self.cpu_job.push(Phase::Bytes(c.bytes));
                let t = self.cpu_job.start(now, r.dram.rate_gbs(DramUser::Cpu));
                self.cpu_gen += 1;
                s.schedule_at(t, self.ev(LayerEvent::CpuBytesDone(self.cpu_gen)));
            }
            LayerEvent::CpuBytesDone(_) => {
                let c = self.costs.cpu.expect("a CPU share");
                self.cpu_job.complete();
                self.times.cpu_end = now;
                self.cpu_active(now, false, r, s);
                r.cpu.end(now);
                self.submit_h2d(now, c.result, r, s);
            }
            LayerEvent::H2dDone(_) => {
                let (done, next) = r.h2d.complete(now, r.dram.rate_gbs(DramUser::Dma));
                match next {
                    Some(t) => {
                        self.h2d_gen += 1;
                        s.schedule_at(t, self.ev(LayerEvent::H2dDone(self.h2d_gen)));
                    }
                    None => self.dma_active(now, false, r, s),
                }
                match done.map(|d| d.tag) {
                    Some(TAG_GATHER) => {
                        // Gated, the launch was paid from when the stream reached it: the
                        // kernel starts at max(now, stream free + launch).
                        let ready = if self.costs.fetched_gated {
                            now.saturating_sub(ceil_ns(self.costs.launch_ns))
                                .max(r.gpu.busy_until())
                        } else {
                            r.gpu.busy_until().max(now)
                        };
                        r.gpu
                            .submit(ready, self.costs.launch_ns, self.costs.fetched_kernel_ns);
                        self.gather_pending = false;
                        self.times.gather_end = now;
                        self.times.gpu_side_end = r.gpu.busy_until();
                        if self.sum_deferred {
                            // The result came first (possible only if the result copy had a
                            // stream of its own): the sum follows the fetched kernel.
                            self.sum_deferred = false;
                            self.submit_sum(now, r);
                        }
                    }
                    Some(_) => {
                        self.result_pending = false;
                        self.times.cpu_side_end = now;
                        if self.gather_pending {
                            self.sum_deferred = true;
                        } else {
                            self.submit_sum(now, r);
                        }
                    }
                    None => {}
                }
                self.maybe_done(r, s);
            }
            LayerEvent::LayerDone => {
                self.running = false;
                self.times.end = now;
                return Some(now);
            }
            LayerEvent::StepStart | LayerEvent::CombineDone => {}
        }
        None
    }
}

/// The layer machines of G GPUs over their lanes' resources, and the combine after them.
///
/// Each GPU runs one [`LayerMachine`] on its own [`Resources`] (GPU stream, links, its CPU
/// workers) whose [`Dram`] is a view of the one host DRAM: after every event of one lane
/// the others are told what it now reads ([`Dram::set_others`]) and re-rated
/// ([`LayerMachine::rerate`]). When every lane's layer is done the partial outputs are
/// combined (`combine_ns`, the perf model's `peer_combine_us`) and the layer ends. With one
/// GPU it is exactly the one machine (no combine, no cross-lane work).
#[derive(Debug, Clone)]
pub struct GpuLanes {
    /// Each GPU's resources.
    pub res: Vec<Resources>,
    machines: Vec<LayerMachine>,
    pending: usize,
    ends: Vec<Nanos>,
    combine_ns: f64,
    last: usize,
}

impl GpuLanes {
    /// Lanes over `res` (one per GPU) that combine in `combine_ns` after each layer.
    pub fn new(res: Vec<Resources>, combine_ns: f64) -> Self {
        let n = res.len();
        GpuLanes {
            machines: (0..n).map(|g| LayerMachine::on_lane(g as u16)).collect(),
            ends: vec![0; n],
            res,
            pending: 0,
            combine_ns,
            last: 0,
        }
    }

    /// Number of GPUs.
    pub fn gpus(&self) -> usize {
        self.res.len()
    }

    /// The machine of GPU `g`.
    pub fn machine(&self, g: usize) -> &LayerMachine {
        &self.machines[g]
    }

    /// The GPU whose layer ended last (its timeline is the layer's critical path).
    pub fn slowest(&self) -> usize {
        self.last
    }

    /// The combine's duration, ns.
    pub fn combine_ns(&self) -> f64 {
        self.combine_ns
    }

    /// Start a layer at `now` on every GPU, `costs[g]` on GPU `g`.
    pub fn start(&mut self, now: Nanos, costs: &[LayerCosts], s: &mut Scheduler<LaneEvent>) {
        self.pending = self.machines.len();
        for (g, m) in self.machines.iter_mut().enumerate() {
            m.start(now, costs[g], &mut self.res[g], s);
        }
    }

    /// Handle an event; returns the end time when the layer is done on every GPU and
    /// combined.
    pub fn handle(
        &mut self,
        now: Nanos,
        ev: LaneEvent,
        s: &mut Scheduler<LaneEvent>,
    ) -> Option<Nanos> {
        if ev.event == LayerEvent::CombineDone {
            return Some(now);
        }
        let g = ev.lane as usize;
        let done = self.machines[g].handle(now, ev.event, &mut self.res[g], s);
        if self.machines.len() == 1 {
            return done;
        }
        self.share_dram(now, g, s);
        let end = done?;
        self.ends[g] = end;
        self.pending -= 1;
        if self.pending > 0 {
            return None;
        }
        let (last, latest) = self
            .ends
            .iter()
            .enumerate()
            .max_by_key(|(i, t)| (**t, std::cmp::Reverse(*i)))
            .map(|(i, t)| (i, *t))
            .unwrap_or((0, now));
        self.last = last;
        s.schedule_at(
            latest + ceil_ns(self.combine_ns),
            LaneEvent {
                lane: 0,
                event: LayerEvent::CombineDone,
            },
        );
        None
    }

    /// Tell every lane what the others read now and re-rate the lanes other than `changed`
    /// (whose own event already rated its jobs against an unchanged rest).
    fn share_dram(&mut self, now: Nanos, changed: usize, s: &mut Scheduler<LaneEvent>) {
        let demand: Vec<(f64, f64)> = self
            .res
            .iter()
            .map(|r| {
                let d = &r.dram;
                (
                    if d.is_active(DramUser::Cpu) {
                        d.demand_gbs(DramUser::Cpu)
                    } else {
                        0.0
                    },
                    if d.is_active(DramUser::Dma) {
                        d.demand_gbs(DramUser::Dma)
                    } else {
                        0.0
                    },
                )
            })
            .collect();
        for j in 0..self.res.len() {
            let (mut c, mut d) = (0.0, 0.0);
            for (k, (ck, dk)) in demand.iter().enumerate() {
                if k != j {
                    c += ck;
                    d += dk;
                }
            }
            self.res[j].dram.set_others(c, d);
            if j != changed {
                self.machines[j].rerate(now, &mut self.res[j], s);
            }
        }
    }
}

/// Runs [`LayerMachine`]s back to back: the engine alone, without routing or planning (for
/// tests against [`crate::reference`] and for measuring the engine's event rate).
#[derive(Debug)]
pub struct LayerRunner {
    /// The resources, persisting across layers.
    pub resources: Resources,
    machine: LayerMachine,
    costs: Vec<LayerCosts>,
    next: usize,
    ends: Vec<Nanos>,
}

impl LayerRunner {
    /// A runner that will time `costs`, one layer after the other, on `resources`.
    pub fn new(resources: Resources, costs: Vec<LayerCosts>) -> Self {
        LayerRunner {
            resources,
            machine: LayerMachine::new(),
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
        let ev = ev.event;
        let start = if ev == LayerEvent::StepStart {
            true
        } else if let Some(end) = self.machine.handle(now, ev, &mut self.resources, s) {
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
            self.machine.start(now, c, &mut self.resources, s);
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
        let mut r = cm.resources();
        let mut s = Scheduler::new(0);
        let mut lm = LayerMachine::on_lane(1);
        lm.h2d_gen = 3;
        lm.cpu_gen = 2;
        for ev in [LayerEvent::H2dDone(2), LayerEvent::CpuBytesDone(1)] {
            assert_eq!(lm.handle(10, ev, &mut r, &mut s), None);
        }
        assert_eq!(s.pending(), 0, "a stale event schedules nothing");
        assert_eq!(lm.times(), &LayerTimes::default());
    }
}
