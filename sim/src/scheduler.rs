//! The run loop: the clock, the queue and the run's single seeded random generator.
//!
//! A run is deterministic for a seed: the queue orders by (time, sequence), and every
//! random draw (duration jitter, the routing process's seed) comes from [`Scheduler::rng`].

use rand::rngs::StdRng;
use rand::SeedableRng;

use crate::component::{Component, Control};
use crate::event::EventQueue;
use crate::time::Nanos;

/// Why a run ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RunEnd {
    /// No event was left.
    Drained,
    /// The component asked to stop.
    Stopped,
    /// The next event lay past the time limit.
    TimeLimit,
}

/// Clock, queue and random generator of one run.
#[derive(Debug)]
pub struct Scheduler<E> {
    now: Nanos,
    queue: EventQueue<E>,
    rng: StdRng,
    handled: u64,
}

impl<E> Scheduler<E> {
    /// A scheduler at time 0 whose generator is seeded with `seed`.
    pub fn new(seed: u64) -> Self {
        Scheduler {
            now: 0,
            queue: EventQueue::new(),
            rng: StdRng::seed_from_u64(seed),
            handled: 0,
        }
    }

    /// The current simulated time, in ns.
    pub fn now(&self) -> Nanos {
        self.now
    }

    /// Schedule `event` at absolute time `at` (ns); a time in the past fires now.
    pub fn schedule_at(&mut self, at: Nanos, event: E) {
        let at = at.max(self.now);
        self.queue.push(at, event);
    }

    /// Schedule `event` `delay` ns from now.
    pub fn schedule_in(&mut self, delay: Nanos, event: E) {
        self.queue.push(self.now.saturating_add(delay), event);
    }

    /// The run's random generator.
    pub fn rng(&mut self) -> &mut StdRng {
        &mut self.rng
    }

    /// Events handed to a component so far.
    pub fn handled(&self) -> u64 {
        self.handled
    }

    /// Events still pending.
    pub fn pending(&self) -> usize {
        self.queue.len()
    }

    /// Pop events and hand them to `component` until none is left, it asks to stop, or the
    /// next event lies after `until` (ns; `None` for no limit).
    pub fn run<C: Component<E>>(&mut self, component: &mut C, until: Option<Nanos>) -> RunEnd {
        loop {
            match self.queue.peek_time() {
                None => return RunEnd::Drained,
                Some(t) if until.is_some_and(|u| t > u) => return RunEnd::TimeLimit,
                Some(_) => {}
            }
            let Some(next) = self.queue.pop() else {
                return RunEnd::Drained;
            };
            debug_assert!(next.time >= self.now, "time went backwards");
            self.now = next.time;
            self.handled += 1;
            if component.handle(self.now, next.event, self) == Control::Stop {
                return RunEnd::Stopped;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::Rng;

    /// A ping-pong component: each event schedules the next after a random delay.
    struct Chain {
        times: Vec<Nanos>,
        left: u32,
    }

    impl Component<u32> for Chain {
        fn handle(&mut self, now: Nanos, event: u32, s: &mut Scheduler<u32>) -> Control {
            self.times.push(now);
            if self.left == 0 {
                return Control::Stop;
            }
            self.left -= 1;
            let d = s.rng().random_range(1..100);
            s.schedule_in(d, event + 1);
            Control::Continue
        }
    }

    fn run_chain(seed: u64) -> Vec<Nanos> {
        let mut s = Scheduler::new(seed);
        s.schedule_at(0, 0);
        let mut c = Chain {
            times: Vec::new(),
            left: 50,
        };
        assert_eq!(s.run(&mut c, None), RunEnd::Stopped);
        assert_eq!(s.handled(), 51);
        c.times
    }

    #[test]
    fn deterministic_for_a_seed() {
        assert_eq!(run_chain(3), run_chain(3));
        assert_ne!(run_chain(3), run_chain(4));
        let t = run_chain(3);
        assert!(t.windows(2).all(|w| w[0] < w[1]));
    }

    #[test]
    fn time_limit_and_drain() {
        struct Nop;
        impl Component<u8> for Nop {
            fn handle(&mut self, _: Nanos, _: u8, _: &mut Scheduler<u8>) -> Control {
                Control::Continue
            }
        }
        let mut s = Scheduler::new(0);
        s.schedule_at(10, 0);
        s.schedule_at(20, 0);
        assert_eq!(s.run(&mut Nop, Some(15)), RunEnd::TimeLimit);
        assert_eq!(s.now(), 10);
        assert_eq!(s.pending(), 1);
        assert_eq!(s.run(&mut Nop, None), RunEnd::Drained);
        assert_eq!(s.now(), 20);
    }
}
