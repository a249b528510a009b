//! The event queue: pending events ordered by (time, sequence number).
//!
//! The sequence number is assigned when an event is scheduled, so two events due at the
//! same nanosecond fire in the order they were scheduled: runs are deterministic without
//! relying on the heap's tie-breaking. The queue is a binary heap that keeps its capacity
//! between pushes, so a running simulation does not allocate per event.

use std::cmp::Ordering;
use std::collections::BinaryHeap;

use crate::time::Nanos;

/// One pending event: when it fires, its tie-breaking sequence number, and its payload.
#[derive(Debug, Clone, Copy)]
pub struct Scheduled<E> {
    /// Simulated time at which the event fires, in ns.
    pub time: Nanos,
    /// Order of scheduling; breaks ties between events at the same time.
    pub seq: u64,
    /// What happens.
    pub event: E,
}

impl<E> PartialEq for Scheduled<E> {
    fn eq(&self, other: &Self) -> bool {
        self.time == other.time && self.seq == other.seq
    }
}

impl<E> Eq for Scheduled<E> {}

impl<E> PartialOrd for Scheduled<E> {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

impl<E> Ord for Scheduled<E> {
    /// Reversed, so that [`BinaryHeap`] (a max-heap) pops the earliest (time, seq) first.
    fn cmp(&self, other: &Self) -> Ordering {
        (other.time, other.seq).cmp(&(self.time, self.seq))
    }
}

/// Pending events, earliest first.
#[derive(Debug)]
pub struct EventQueue<E> {
    heap: BinaryHeap<Scheduled<E>>,
    next_seq: u64,
}

impl<E> Default for EventQueue<E> {
    fn default() -> Self {
        Self::new()
    }
}

impl<E> EventQueue<E> {
    /// An empty queue.
    pub fn new() -> Self {
        EventQueue {
            heap: BinaryHeap::with_capacity(64),
            next_seq: 0,
        }
    }

    /// Add an event due at `time` (ns); returns its sequence number.
    pub fn push(&mut self, time: Nanos, event: E) -> u64 {
        let seq = self.next_seq;
        self.next_seq += 1;
        self.heap.push(Scheduled { time, seq, event });
        seq
    }

    /// Remove and return the earliest event.
    pub fn pop(&mut self) -> Option<Scheduled<E>> {
        self.heap.pop()
    }

    /// Time of the earliest event, if any.
    pub fn peek_time(&self) -> Option<Nanos> {
        self.heap.peek().map(|s| s.time)
    }

    /// Number of pending events.
    pub fn len(&self) -> usize {
        self.heap.len()
    }

    /// True when nothing is pending.
    pub fn is_empty(&self) -> bool {
        self.heap.is_empty()
    }

    /// Drop every pending event (the sequence counter keeps counting).
    pub fn clear(&mut self) {
        self.heap.clear();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pops_by_time_then_by_scheduling_order() {
        let mut q = EventQueue::new();
        q.push(30, 'a');
        q.push(10, 'b');
        q.push(30, 'c');
        q.push(10, 'd');
        q.push(20, 'e');
        let order: Vec<char> = std::iter::from_fn(|| q.pop().map(|s| s.event)).collect();
        assert_eq!(order, vec!['b', 'd', 'e', 'a', 'c']);
        assert!(q.is_empty());
    }

    /// Against a naive reference: a vector sorted by (time, seq).
    #[test]
    fn matches_a_sorted_vector() {
        use rand::{Rng, SeedableRng};
        let mut rng = rand::rngs::StdRng::seed_from_u64(7);
        let mut q = EventQueue::new();
        let mut reference: Vec<(Nanos, u64, u32)> = Vec::new();
        let mut popped = Vec::new();
        let mut expected = Vec::new();
        for i in 0..2000u32 {
            let t = rng.random_range(0..50u64);
            let seq = q.push(t, i);
            reference.push((t, seq, i));
            if rng.random_bool(0.4) {
                popped.push(q.pop().unwrap().event);
                reference.sort();
                expected.push(reference.remove(0).2);
            }
        }
        while let Some(s) = q.pop() {
            popped.push(s.event);
        }
        reference.sort();
        expected.extend(reference.iter().map(|r| r.2));
        assert_eq!(popped, expected);
    }
}
