//! The CPU expert pool: a team of threads that computes a layer's CPU share.
//!
//! What a CPU step costs (per-layer and per-task fixed costs, bytes read at the CPU's MoE
//! bandwidth) comes from the perf cost terms; the pool adds what only a timeline shows:
//! whether the threads are awake. A pool that went idle longer than its spin window ago
//! has parked its threads and pays the wake-up latency; within the window (the runtime
//! spin-waits between the layers of a step) it starts at once.

use crate::time::Nanos;

/// Parameters of the pool.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct CpuPoolParams {
    /// Worker threads (informational here: the cost terms already divide work over them).
    pub threads: usize,
    /// Latency to wake parked threads, in ns.
    pub wake_ns: f64,
    /// How long idle threads spin before parking, in ns (0: they park at once).
    pub spin_window_ns: f64,
}

/// The pool's state.
#[derive(Debug, Clone)]
pub struct CpuPool {
    params: CpuPoolParams,
    busy_since: Option<Nanos>,
    idle_since: Option<Nanos>,
    busy_ns: Nanos,
    wakes: u64,
}

impl CpuPool {
    /// A pool whose threads start parked.
    pub fn new(params: CpuPoolParams) -> Self {
        CpuPool {
            params,
            busy_since: None,
            idle_since: None,
            busy_ns: 0,
            wakes: 0,
        }
    }

    /// The parameters.
    pub fn params(&self) -> &CpuPoolParams {
        &self.params
    }

    /// Wake-up latency a task submitted at `now` pays, ns (0 while the threads spin).
    pub fn wake_latency_ns(&self, now: Nanos) -> f64 {
        match self.idle_since {
            Some(idle) if ((now - idle) as f64) <= self.params.spin_window_ns => 0.0,
            _ => self.params.wake_ns,
        }
    }

    /// A task starts at `now`: returns the wake-up latency it pays, ns.
    pub fn begin(&mut self, now: Nanos) -> f64 {
        debug_assert!(
            self.busy_since.is_none(),
            "the pool runs one layer's share at a time"
        );
        let wake = self.wake_latency_ns(now);
        if wake > 0.0 {
            self.wakes += 1;
        }
        self.busy_since = Some(now);
        wake
    }

    /// The task started by [`CpuPool::begin`] ends at `now`.
    pub fn end(&mut self, now: Nanos) {
        if let Some(s) = self.busy_since.take() {
            self.busy_ns += now - s;
        }
        self.idle_since = Some(now);
    }

    /// Total busy time (wake-ups included), ns.
    pub fn busy_ns(&self) -> Nanos {
        self.busy_ns
    }

    /// Times the threads had to be woken.
    pub fn wakes(&self) -> u64 {
        self.wakes
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn wakes_after_idle_spins_within_window() {
        let mut p = CpuPool::new(CpuPoolParams {
            threads: 16,
            wake_ns: 30_000.0,
            spin_window_ns: 100_000.0,
        });
        assert_eq!(p.begin(0), 30_000.0, "threads start parked");
        p.end(50_000);
        assert_eq!(p.begin(120_000), 0.0, "70 us idle: still spinning");
        p.end(130_000);
        assert_eq!(p.begin(300_000), 30_000.0, "170 us idle: parked");
        p.end(310_000);
        assert_eq!(p.busy_ns(), 50_000 + 10_000 + 10_000);
        assert_eq!(p.wakes(), 2);
    }
}
