//! An in-order GPU stream: kernels run one after another, each after a launch overhead.
//!
//! Launches are asynchronous: the host enqueues the next kernel while the previous one
//! runs, so the launch overhead only shows where the stream would otherwise be idle
//! (start = max(ready + launch, stream free)). Kernel durations and launch costs come from
//! the perf cost terms (which charge the launch to every kernel: the analytic model's
//! critical path never hides it).

use crate::time::{ceil_ns, Nanos};

/// One stream.
#[derive(Debug, Clone, Default)]
pub struct GpuStream {
    busy_until: Nanos,
    busy_ns: Nanos,
    kernels: u64,
}

impl GpuStream {
    /// An idle stream.
    pub fn new() -> Self {
        GpuStream::default()
    }

    /// Enqueue a kernel of `kernel_ns` ns with a launch overhead of `launch_ns` ns, whose
    /// inputs are ready at `ready` (ns); returns its end time.
    pub fn submit(&mut self, ready: Nanos, launch_ns: f64, kernel_ns: f64) -> Nanos {
        let start = (ready + ceil_ns(launch_ns)).max(self.busy_until);
        let d = ceil_ns(kernel_ns);
        self.busy_until = start + d;
        self.busy_ns += d;
        self.kernels += 1;
        self.busy_until
    }

    /// When the last enqueued kernel ends, ns.
    pub fn busy_until(&self) -> Nanos {
        self.busy_until
    }

    /// Time spent running kernels, ns.
    pub fn busy_ns(&self) -> Nanos {
        self.busy_ns
    }

    /// Kernels launched.
    pub fn kernels(&self) -> u64 {
        self.kernels
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn in_order_with_hidden_launches() {
        let mut s = GpuStream::new();
        assert_eq!(s.submit(0, 5_000.0, 20_000.0), 25_000, "idle: launch shows");
        assert_eq!(
            s.submit(1_000, 5_000.0, 10_000.0),
            35_000,
            "queued: launch hidden"
        );
        assert_eq!(s.submit(100_000, 5_000.0, 1_000.0), 106_000);
        assert_eq!(s.busy_ns(), 31_000);
        assert_eq!(s.kernels(), 3);
    }
}
