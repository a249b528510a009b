//! One direction of the host-GPU link (PCIe, or NVLink-C2C on Grace Hopper).
//!
//! A job (a layer's gather, a CPU result copy) costs a setup once (link latency, launch and
//! completion of the layer's copies), and each of its transfers a fixed cost (descriptor,
//! submit) plus its bytes over the link's bandwidth. The runtime issues a layer's copies on
//! one copy stream, so transfers are served in submission order. With `max_in_flight = 1`
//! each transfer's fixed cost is paid in full, one after the other; with more in flight the
//! fixed cost of the next transfer overlaps the previous transfer's bytes (only the bytes
//! are serialised on the wire), so it adds only where it is longer than those bytes. Whole jobs (a layer's
//! gather, a CPU result copy) queue FIFO behind each other, as on one CUDA stream.

use std::collections::VecDeque;

use crate::resources::fluid::{Phase, PhasedJob};
use crate::time::{transfer_ns, Nanos};

/// Fixed parameters of a link direction.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct LinkParams {
    /// Bandwidth when nothing else reads host DRAM, in GB/s (used to decide how much of a
    /// transfer's fixed cost hides behind the previous transfer's bytes).
    pub isolated_gbs: f64,
    /// Transfers the copy stream keeps in flight (at least 1).
    pub max_in_flight: usize,
}

/// A batch of equal-size transfers submitted together (a layer's gather, a result copy).
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct TransferJob {
    /// The submitter's label, handed back at completion.
    pub tag: u8,
    /// Number of transfers.
    pub count: u32,
    /// Bytes of each transfer.
    pub bytes_each: f64,
    /// Fixed cost paid once before the first transfer (link latency, per-layer gather
    /// launch and completion), in ns.
    pub setup_ns: f64,
    /// Fixed cost of each transfer (descriptor, submit), in ns.
    pub per_transfer_ns: f64,
}

/// One link direction with its FIFO of jobs.
#[derive(Debug, Clone)]
pub struct Link {
    params: LinkParams,
    job: PhasedJob,
    current: Option<TransferJob>,
    queue: VecDeque<TransferJob>,
    busy_since: Nanos,
    busy_ns: Nanos,
    bytes_moved: f64,
}

impl Link {
    /// An idle link.
    pub fn new(params: LinkParams) -> Self {
        Link {
            params: LinkParams {
                max_in_flight: params.max_in_flight.max(1),
                ..params
            },
            job: PhasedJob::new(),
            current: None,
            queue: VecDeque::with_capacity(8),
            busy_since: 0,
            busy_ns: 0,
            bytes_moved: 0.0,
        }
    }

    /// The link's parameters.
    pub fn params(&self) -> &LinkParams {
        &self.params
    }

    /// True while a job is being served.
    pub fn is_busy(&self) -> bool {
        self.current.is_some()
    }

    /// The job being served.
    pub fn current(&self) -> Option<TransferJob> {
        self.current
    }

    /// Total time the link was busy, ns (up to the last completion).
    pub fn busy_ns(&self) -> Nanos {
        self.busy_ns
    }

    /// Total bytes of completed jobs.
    pub fn bytes_moved(&self) -> f64 {
        self.bytes_moved
    }

    /// Time `job` takes alone at `gbs` GB/s, in fractional ns (the closed form the phased
    /// job reproduces at a constant rate).
    pub fn job_ns(&self, job: &TransferJob, gbs: f64) -> f64 {
        if job.count == 0 {
            return 0.0;
        }
        let n = job.count as f64;
        let bytes_ns = transfer_ns(job.bytes_each, gbs);
        let exposed = if self.params.max_in_flight == 1 {
            n * job.per_transfer_ns
        } else {
            let hidden = transfer_ns(job.bytes_each, self.params.isolated_gbs);
            job.per_transfer_ns + (n - 1.0) * (job.per_transfer_ns - hidden).max(0.0)
        };
        job.setup_ns + exposed + n * bytes_ns
    }

    fn begin(&mut self, now: Nanos, job: TransferJob, gbs: f64) -> Nanos {
        self.job.clear();
        self.job.push(Phase::Fixed(job.setup_ns));
        let hidden = transfer_ns(job.bytes_each, self.params.isolated_gbs);
        for i in 0..job.count {
            let fixed = if i == 0 || self.params.max_in_flight == 1 {
                job.per_transfer_ns
            } else {
                (job.per_transfer_ns - hidden).max(0.0)
            };
            self.job.push(Phase::Fixed(fixed));
            self.job.push(Phase::Bytes(job.bytes_each));
        }
        self.current = Some(job);
        self.busy_since = now;
        self.job.start(now, gbs)
    }

    /// Submit `job` at `now`; when the link was idle it starts at `gbs` GB/s and its finish
    /// time is returned, else it waits in the queue (`None`).
    pub fn submit(&mut self, now: Nanos, job: TransferJob, gbs: f64) -> Option<Nanos> {
        if self.current.is_none() {
            Some(self.begin(now, job, gbs))
        } else {
            self.queue.push_back(job);
            None
        }
    }

    /// The current job completes at `now`; returns it and, when another job was waiting,
    /// the finish time of that one, started at `gbs` GB/s.
    pub fn complete(&mut self, now: Nanos, gbs: f64) -> (Option<TransferJob>, Option<Nanos>) {
        let done = self.current.take();
        if let Some(d) = done {
            self.busy_ns += now - self.busy_since;
            self.bytes_moved += d.count as f64 * d.bytes_each;
        }
        self.job.complete();
        let next = self.queue.pop_front().map(|j| self.begin(now, j, gbs));
        (done, next)
    }

    /// Change the bandwidth of the job in progress at `now`; returns its new finish time.
    pub fn set_rate(&mut self, now: Nanos, gbs: f64) -> Option<Nanos> {
        self.current.map(|_| self.job.set_rate(now, gbs))
    }

    /// Rate of the job in progress, GB/s (`None` when idle).
    pub fn rate(&self) -> Option<f64> {
        self.current.map(|_| self.job.rate())
    }

    /// Finish time of the job in progress at its current rate.
    pub fn finish_at(&self) -> Option<Nanos> {
        self.current.map(|_| self.job.finish_at())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::time::ceil_ns;

    fn link(in_flight: usize) -> Link {
        Link::new(LinkParams {
            isolated_gbs: 24.0,
            max_in_flight: in_flight,
        })
    }

    fn job(tag: u8, n: u32, bytes: f64) -> TransferJob {
        TransferJob {
            tag,
            count: n,
            bytes_each: bytes,
            setup_ns: 3_000.0,
            per_transfer_ns: 7_000.0,
        }
    }

    #[test]
    fn serialised_copies_pay_every_fixed_cost() {
        let mut l = link(1);
        let t = l.submit(0, job(1, 3, 2.4e6), 24.0).unwrap();
        assert_eq!(t, 3_000 + 3 * (7_000 + 100_000));
        assert_eq!(t, ceil_ns(l.job_ns(&job(1, 3, 2.4e6), 24.0)));
    }

    #[test]
    fn copies_in_flight_hide_fixed_costs_behind_bytes() {
        let mut l = link(2);
        let t = l.submit(0, job(1, 3, 2.4e6), 24.0).unwrap();
        assert_eq!(t, 3_000 + 7_000 + 3 * 100_000);
        assert_eq!(t, ceil_ns(l.job_ns(&job(1, 3, 2.4e6), 24.0)));
        // Tiny transfers: the fixed cost does not hide, each adds (fixed - bytes time).
        let mut l = link(4);
        let t = l.submit(0, job(0, 3, 24_000.0), 24.0).unwrap();
        assert_eq!(t, 3_000 + 7_000 + 3 * 1_000 + 2 * 6_000);
        assert_eq!(t, ceil_ns(l.job_ns(&job(0, 3, 24_000.0), 24.0)));
    }

    #[test]
    fn jobs_queue_fifo_and_rates_change() {
        let mut l = link(1);
        let first = l.submit(0, job(1, 1, 2.4e6), 24.0).unwrap();
        assert_eq!(first, 110_000);
        assert_eq!(l.submit(50_000, job(2, 1, 24_000.0), 24.0), None);
        // Contention halves the rate at 60 us: 50 us of bytes were left, now 100 us.
        assert_eq!(l.set_rate(60_000, 12.0), Some(160_000));
        let (done, next) = l.complete(160_000, 24.0);
        assert_eq!(done.unwrap().tag, 1);
        assert_eq!(next, Some(160_000 + 3_000 + 7_000 + 1_000));
        let (done, next) = l.complete(171_000, 24.0);
        assert_eq!(done.unwrap().tag, 2);
        assert_eq!(next, None);
        assert!(!l.is_busy());
        assert_eq!(l.busy_ns(), 171_000);
        assert!((l.bytes_moved() - 2.424e6).abs() < 1e-6);
    }
}
