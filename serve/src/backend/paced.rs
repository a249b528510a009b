//! A backend wrapper that stretches every step to a target duration.
//!
//! It stands for a host whose speed differs from what the performance model predicts: the
//! inner backend does the real computation, then the wrapper sleeps until the step has taken
//! the time `pace(strategy, streams, tokens)` says (never less than the computation took).
//! The self-check tests use it to make realised tok/s diverge from the prediction; `ft serve`
//! does not use it.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use ft_model::Strategy;

use super::{BackendInfo, StepBackend, StepOutput, StreamId, StreamStep};
use crate::error::Result;

/// Target duration of a step from (strategy, streams, tokens pushed).
pub type PaceFn = dyn Fn(&Strategy, usize, usize) -> Duration + Send;

/// See the module docs.
pub struct Paced<B> {
    inner: B,
    pace: Box<PaceFn>,
    /// Strategy of every step run so far, in order (what the switch tests check).
    history: Arc<Mutex<Vec<Strategy>>>,
}

impl<B: StepBackend> Paced<B> {
    /// Wrap `inner`.
    pub fn new(inner: B, pace: Box<PaceFn>) -> Self {
        Paced {
            inner,
            pace,
            history: Arc::default(),
        }
    }

    /// A handle on the strategy each step ran under, in step order (readable while the
    /// backend runs on the scheduler's thread).
    pub fn history(&self) -> Arc<Mutex<Vec<Strategy>>> {
        Arc::clone(&self.history)
    }
}

impl<B: StepBackend> StepBackend for Paced<B> {
    fn info(&self) -> BackendInfo {
        let mut info = self.inner.info();
        info.name = format!("paced({})", info.name);
        info
    }

    fn strategy(&self) -> Strategy {
        self.inner.strategy()
    }

    fn set_strategy(&mut self, strategy: Strategy) -> Result<()> {
        self.inner.set_strategy(strategy)
    }

    fn step(&mut self, batch: &[StreamStep<'_>]) -> Result<StepOutput> {
        let start = Instant::now();
        let strategy = self.inner.strategy();
        let mut out = self.inner.step(batch)?;
        let tokens: usize = batch.iter().map(|s| s.tokens.len()).sum();
        let target = (self.pace)(&strategy, batch.len(), tokens);
        let spent = start.elapsed();
        if target > spent {
            std::thread::sleep(target - spent);
        }
        out.stats.wall_us = start.elapsed().as_secs_f64() * 1e6;
        if let Ok(mut h) = self.history.lock() {
            h.push(strategy);
        }
        Ok(out)
    }

    fn release(&mut self, id: StreamId) {
        self.inner.release(id)
    }
}
