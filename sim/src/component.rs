//! What reacts to events: a component owns its state and schedules follow-up events.
//!
//! Components never see the queue's internals; they get the current time and a
//! [`Scheduler`] handle to schedule more events and draw random numbers from the run's one
//! seeded generator. Resources (link, DRAM, CPU pool, GPU streams) are not components:
//! they only compute durations and availability for the component that owns them.

use crate::scheduler::Scheduler;
use crate::time::Nanos;

/// Whether the run goes on after an event.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Control {
    /// Keep popping events.
    Continue,
    /// Stop the run now (the component has what it needed).
    Stop,
}

/// A simulated process that reacts to events of type `E`.
pub trait Component<E> {
    /// Handle `event`, due at `now` (ns); schedule follow-ups through `sched`.
    fn handle(&mut self, now: Nanos, event: E, sched: &mut Scheduler<E>) -> Control;
}
