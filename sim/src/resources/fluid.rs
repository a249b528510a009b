//! Work whose byte rate may change while it runs: a sequence of fixed-time and byte phases.
//!
//! A gather is `latency, bytes, latency, bytes, ...`; the CPU's read of expert weights is
//! one byte phase. When DRAM contention starts or stops, the owner calls
//! [`PhasedJob::set_rate`]: the job first consumes the elapsed time at the old rate, then
//! reports its new finish time. Fixed phases are not affected by the rate. The phase vector
//! keeps its capacity between jobs, so a running simulation does not allocate.

use crate::time::{ceil_ns, Nanos};

/// One piece of a job.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Phase {
    /// A duration independent of bandwidth (a transfer's latency, a fixed cost), in ns.
    Fixed(f64),
    /// Bytes moved at the job's current rate.
    Bytes(f64),
}

/// A running (or idle) phased job.
#[derive(Debug, Clone, Default)]
pub struct PhasedJob {
    phases: Vec<Phase>,
    /// Index of the phase in progress.
    idx: usize,
    /// What is left of phase `idx`: ns for a fixed phase, bytes for a byte phase.
    left: f64,
    /// Time up to which progress has been accounted, ns.
    since: Nanos,
    /// Current rate of byte phases, bytes per ns (= GB/s).
    rate: f64,
    running: bool,
}

impl PhasedJob {
    /// An idle job.
    pub fn new() -> Self {
        PhasedJob {
            phases: Vec::with_capacity(64),
            ..Default::default()
        }
    }

    /// Forget the previous job and start describing a new one (call `push` then `start`).
    pub fn clear(&mut self) {
        self.phases.clear();
        self.idx = 0;
        self.left = 0.0;
        self.running = false;
    }

    /// Append a phase; zero-length phases are dropped.
    pub fn push(&mut self, phase: Phase) {
        let amount = match phase {
            Phase::Fixed(x) | Phase::Bytes(x) => x,
        };
        if amount > 0.0 {
            self.phases.push(phase);
        }
    }

    /// Start the described job at `now` (ns) with byte rate `rate` (bytes per ns); returns
    /// its finish time.
    pub fn start(&mut self, now: Nanos, rate: f64) -> Nanos {
        debug_assert!(rate > 0.0, "a byte rate must be positive");
        self.idx = 0;
        self.left = self.phases.first().map_or(0.0, amount);
        self.since = now;
        self.rate = rate;
        self.running = true;
        self.finish_at()
    }

    /// True between `start` and `complete`.
    pub fn is_running(&self) -> bool {
        self.running
    }

    /// Current byte rate, bytes per ns.
    pub fn rate(&self) -> f64 {
        self.rate
    }

    /// Mark the job done (at its finish event).
    pub fn complete(&mut self) {
        self.running = false;
        self.idx = self.phases.len();
        self.left = 0.0;
    }

    /// Time the job needs from `since` at the current rate, in fractional ns.
    fn remaining_ns(&self) -> f64 {
        let mut t = 0.0;
        for (i, p) in self.phases.iter().enumerate().skip(self.idx) {
            let a = if i == self.idx { self.left } else { amount(p) };
            t += match p {
                Phase::Fixed(_) => a,
                Phase::Bytes(_) => a / self.rate,
            };
        }
        t
    }

    /// Absolute finish time at the current rate, ns (rounded up).
    pub fn finish_at(&self) -> Nanos {
        self.since + ceil_ns(self.remaining_ns())
    }

    /// Account progress up to `now` (ns) at the current rate.
    pub fn advance(&mut self, now: Nanos) {
        if !self.running || now <= self.since {
            return;
        }
        let mut dt = (now - self.since) as f64;
        self.since = now;
        while self.idx < self.phases.len() && dt > 0.0 {
            let p = self.phases[self.idx];
            let need = match p {
                Phase::Fixed(_) => self.left,
                Phase::Bytes(_) => self.left / self.rate,
            };
            if dt >= need {
                dt -= need;
                self.idx += 1;
                self.left = self.phases.get(self.idx).map_or(0.0, amount);
            } else {
                self.left -= match p {
                    Phase::Fixed(_) => dt,
                    Phase::Bytes(_) => dt * self.rate,
                };
                dt = 0.0;
            }
        }
    }

    /// Change the byte rate at `now` (ns); returns the new finish time.
    pub fn set_rate(&mut self, now: Nanos, rate: f64) -> Nanos {
        debug_assert!(rate > 0.0, "a byte rate must be positive");
        self.advance(now);
        self.rate = rate;
        self.finish_at()
    }

    /// Total bytes of the job's byte phases.
    pub fn total_bytes(&self) -> f64 {
        self.phases
            .iter()
            .map(|p| match p {
                Phase::Bytes(b) => *b,
                Phase::Fixed(_) => 0.0,
            })
            .sum()
    }
}

fn amount(p: &Phase) -> f64 {
    match p {
        Phase::Fixed(x) | Phase::Bytes(x) => *x,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn constant_rate_is_sum_of_phases() {
        let mut j = PhasedJob::new();
        j.push(Phase::Fixed(7_000.0));
        j.push(Phase::Bytes(2.4e6));
        j.push(Phase::Fixed(0.0));
        j.push(Phase::Fixed(7_000.0));
        j.push(Phase::Bytes(2.4e6));
        // 24 bytes/ns: 100 us per 2.4 MB.
        assert_eq!(j.start(1_000, 24.0), 1_000 + 2 * 7_000 + 2 * 100_000);
        assert!((j.total_bytes() - 4.8e6).abs() < 1e-9);
    }

    /// Halving the rate half-way through the first byte phase: the remaining 1.2 MB of it
    /// and all of the second take twice as long.
    #[test]
    fn rate_change_mid_phase() {
        let mut j = PhasedJob::new();
        j.push(Phase::Fixed(10_000.0));
        j.push(Phase::Bytes(2.4e6));
        j.push(Phase::Fixed(10_000.0));
        j.push(Phase::Bytes(2.4e6));
        j.start(0, 24.0);
        let t = j.set_rate(10_000 + 50_000, 12.0);
        assert_eq!(t, 60_000 + 100_000 + 10_000 + 200_000);
        // Back to full rate during the second fixed phase: only the last byte phase changes.
        let t = j.set_rate(165_000, 24.0);
        assert_eq!(t, 165_000 + 5_000 + 100_000);
        j.complete();
        assert!(!j.is_running());
    }

    /// Against a naive reference that walks the job in 1 ns ticks under a random rate
    /// schedule.
    #[test]
    fn matches_tick_by_tick_reference() {
        use rand::{Rng, SeedableRng};
        let mut rng = rand::rngs::StdRng::seed_from_u64(11);
        for _ in 0..20 {
            let mut j = PhasedJob::new();
            let mut phases = Vec::new();
            for _ in 0..rng.random_range(1..6) {
                let p = if rng.random_bool(0.5) {
                    Phase::Fixed(rng.random_range(1..300) as f64)
                } else {
                    Phase::Bytes(rng.random_range(1..3000) as f64)
                };
                phases.push(p);
                j.push(p);
            }
            let rates = [1.0, 2.0, 4.0];
            let mut rate = rates[rng.random_range(0..3)];
            let mut finish = j.start(0, rate);
            // Reference: per tick, progress 1 ns of fixed or `rate` bytes.
            let mut left: Vec<f64> = phases
                .iter()
                .map(|p| match p {
                    Phase::Fixed(x) | Phase::Bytes(x) => *x,
                })
                .collect();
            let mut t: Nanos = 0;
            let mut i = 0;
            while i < left.len() {
                if rng.random_bool(0.01) {
                    rate = rates[rng.random_range(0..3)];
                    finish = j.set_rate(t, rate);
                }
                let mut budget = 1.0;
                while budget > 1e-12 && i < left.len() {
                    let per = match phases[i] {
                        Phase::Fixed(_) => 1.0,
                        Phase::Bytes(_) => rate,
                    };
                    let take = (budget * per).min(left[i]);
                    left[i] -= take;
                    budget -= take / per;
                    if left[i] <= 1e-9 {
                        i += 1;
                    }
                }
                t += 1;
            }
            // The fluid finish is exact; the reference rounds to whole ticks.
            assert!(finish.abs_diff(t) <= 1, "fluid {finish} vs reference {t}");
        }
    }
}
