//! The naive slow reference: one layer evaluated tick by tick, to test the event engine.
//!
//! [`reference_layer`] advances simulated time in steps of one nanosecond and moves every
//! activity that may run by one tick's worth of work, deciding contention anew each tick
//! from which activities are reading DRAM. It shares no code with the event engine
//! (no queue, no phased jobs, no link or stream objects): only the [`LayerCosts`] input and
//! the documented rules (in-order GPU stream with launch overhead, FIFO copy stream,
//! contended rates while both DMA and CPU read, fixed costs hidden behind the previous
//! transfer's bytes when more than one copy is in flight). The engine's answer must match
//! it to within the rounding of its event times (a few ns).

use crate::layer::LayerCosts;
use crate::resources::DramParams;

/// Resource parameters the reference needs.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct ReferenceParams {
    /// DRAM rates (gather and CPU, alone and together), GB/s = bytes per ns.
    pub dram: DramParams,
    /// D2H bandwidth, GB/s.
    pub d2h_gbs: f64,
    /// Copies in flight on the H2D stream.
    pub in_flight: usize,
    /// Wake-up latency the CPU share pays, ns (0 if the pool spins).
    pub wake_ns: f64,
}

/// A piece of serial work: fixed ns or bytes at a rate.
#[derive(Debug, Clone, Copy)]
enum Piece {
    Fixed(f64),
    Bytes(f64),
}

/// A queue of pieces, consumed tick by tick.
#[derive(Debug, Clone, Default)]
struct Work {
    pieces: Vec<Piece>,
    i: usize,
}

impl Work {
    fn done(&self) -> bool {
        self.i >= self.pieces.len()
    }

    fn in_bytes(&self) -> bool {
        matches!(self.pieces.get(self.i), Some(Piece::Bytes(_)))
    }

    /// Consume up to 1 ns at `rate` bytes per ns.
    fn tick(&mut self, rate: f64) {
        let mut budget = 1.0f64;
        while budget > 1e-12 && !self.done() {
            match &mut self.pieces[self.i] {
                Piece::Fixed(left) => {
                    let take = left.min(budget);
                    *left -= take;
                    budget -= take;
                    if *left <= 1e-9 {
                        self.i += 1;
                    }
                }
                Piece::Bytes(left) => {
                    let take = left.min(budget * rate);
                    *left -= take;
                    budget -= take / rate;
                    if *left <= 1e-6 {
                        self.i += 1;
                    }
                }
            }
        }
    }
}

fn transfer_work(
    job: &crate::resources::TransferJob,
    in_flight: usize,
    iso_gbs: f64,
) -> Vec<Piece> {
    let mut v = vec![Piece::Fixed(job.setup_ns)];
    for i in 0..job.count {
        let fixed = if i == 0 || in_flight <= 1 {
            job.per_transfer_ns
        } else {
            (job.per_transfer_ns - job.bytes_each / iso_gbs).max(0.0)
        };
        v.push(Piece::Fixed(fixed));
        v.push(Piece::Bytes(job.bytes_each));
    }
    v
}

/// End time (ns) of a layer that starts at 0 on idle resources, evaluated tick by tick.
pub fn reference_layer(c: &LayerCosts, p: &ReferenceParams) -> u64 {
    // GPU: the dense part, then the hit kernel.
    let dense_end = c.dense_ns;
    let mut gpu_free = dense_end;
    if c.has_hits {
        gpu_free = (dense_end + c.launch_ns).max(gpu_free) + c.hit_kernel_ns;
    }
    // The fetched chunks before the last, queued after the hits, one launch each.
    if c.fetched_early_launches > 0 {
        gpu_free += c.fetched_early_launches as f64 * c.launch_ns + c.fetched_early_ns;
    }
    let mut gather = c.gather.map(|g| Work {
        pieces: transfer_work(&g, p.in_flight, p.dram.dma_isolated_gbs),
        i: 0,
    });
    // CPU side, as a sequence of stages.
    let mut cpu_ready_at = None; // when the CPU may start (D2H + sync done)
    let mut cpu_fixed = None; // wake + fixed, then bytes
    let mut cpu_bytes: Option<Work> = None;
    let mut result: Option<Work> = None;
    let mut result_done_at = None;
    if let Some(cpu) = c.cpu {
        let d2h = cpu.d2h.setup_ns + cpu.d2h.bytes_each / p.d2h_gbs;
        cpu_ready_at = Some(dense_end + d2h + cpu.sync_ns);
    }
    let mut gather_done_at = if gather.is_none() {
        Some(dense_end)
    } else {
        None
    };
    let mut t = 0.0f64;
    let limit = 1e12;
    loop {
        let gather_active = t >= dense_end && gather.as_ref().is_some_and(|g| !g.done());
        let result_active = !gather_active && result.as_ref().is_some_and(|r| !r.done());
        let dma = gather_active || result_active;
        let cpu_reading = cpu_bytes.as_ref().is_some_and(|w| !w.done());
        let dma_rate = if cpu_reading {
            p.dram.dma_contended_gbs
        } else {
            p.dram.dma_isolated_gbs
        };
        let cpu_rate = if dma {
            p.dram.cpu_contended_gbs
        } else {
            p.dram.cpu_isolated_gbs
        };
        // Start CPU stages whose time has come.
        if let (Some(at), Some(cpu)) = (cpu_ready_at, c.cpu) {
            if t >= at && cpu_fixed.is_none() {
                cpu_fixed = Some(Work {
                    pieces: vec![Piece::Fixed(p.wake_ns + cpu.fixed_ns)],
                    i: 0,
                });
            }
        }
        // Advance one tick.
        if gather_active {
            let g = gather.as_mut().expect("active");
            g.tick(dma_rate);
            if g.done() {
                gather_done_at = Some(t + 1.0);
            }
        } else if result_active {
            let r = result.as_mut().expect("active");
            r.tick(dma_rate);
            if r.done() {
                result_done_at = Some(t + 1.0);
            }
        }
        if let Some(w) = cpu_fixed.as_mut() {
            if !w.done() {
                w.tick(1.0);
                if w.done() {
                    cpu_bytes = Some(Work {
                        pieces: vec![Piece::Bytes(c.cpu.expect("cpu").bytes)],
                        i: 0,
                    });
                }
            }
        }
        if cpu_reading {
            let w = cpu_bytes.as_mut().expect("reading");
            let _ = w.in_bytes();
            w.tick(cpu_rate);
            if w.done() {
                let cpu = c.cpu.expect("cpu");
                result = Some(Work {
                    pieces: transfer_work(&cpu.result, p.in_flight, p.dram.dma_isolated_gbs),
                    i: 0,
                });
            }
        }
        t += 1.0;
        let gpu_side = gather_done_at.is_some();
        let cpu_side = c.cpu.is_none() || result_done_at.is_some();
        if gpu_side && cpu_side {
            break;
        }
        assert!(t < limit, "reference did not finish");
    }
    // GPU tail: the last fetched chunk after the gather and the kernels before it, its
    // launch after both (gated: after the kernels before it alone); the sum after the
    // result.
    if let (Some(g), Some(_)) = (gather_done_at, c.gather) {
        gpu_free = if c.fetched_gated {
            // Its launch paid from when the stream reached it, beside the gather.
            g.max(gpu_free + c.launch_ns) + c.fetched_kernel_ns
        } else {
            g.max(gpu_free) + c.launch_ns + c.fetched_kernel_ns
        };
    }
    if let (Some(r), Some(cpu)) = (result_done_at, c.cpu) {
        gpu_free = (r + c.launch_ns).max(gpu_free) + cpu.sum_ns;
    }
    (gpu_free + c.overhead_ns).ceil() as u64
}
