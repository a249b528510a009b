//! The seam between the scheduler and whatever computes decode steps.
//!
//! The scheduler (continuous batching, sampling, the self-check) is written against the small
//! [`StepBackend`] trait: run one step for the current set of active streams given their input
//! tokens and return each stream's next-token logits plus the step's instrumentation, free a
//! stream's state, and switch strategy between steps. Two implementations live here:
//!
//! - [`reference::ReferenceMoe`], a small deterministic MoE language model computed on the
//!   host in f32 whose layer plans (hits, fetches, CPU share) come from
//!   `ft_model::plan::plan_layer` over an `ft_model::cache::ExpertCache`, exactly as the
//!   runtime's engine plans them. Its outputs do not depend on the strategy or the cache (every
//!   expert is computed by the same code in the same order), so a run that switches strategy
//!   must produce bit-identical text to one that does not.
//! - [`paced::Paced`], a wrapper that stretches each step of another backend to a target
//!   duration per strategy and stream count (the what-if host of the self-check tests).
//!
//! - [`engine::EngineBackend`], the served model: the runtime's decode engine with an
//!   embedding, a stream state, a content-derived router and an LM head around it.

pub mod engine;
pub mod paced;
pub mod reference;

use ft_model::Strategy;
use serde::Serialize;

use crate::error::Result;
use crate::tokenizer::VOCAB;

/// The scheduler's id of a stream (one request), unique over the server's life.
pub type StreamId = u64;

/// One stream's input to a step.
#[derive(Debug, Clone, Copy)]
pub struct StreamStep<'a> {
    /// The stream.
    pub id: StreamId,
    /// Context position of `tokens[0]` (tokens the stream has already pushed).
    pub position: usize,
    /// Tokens to push: a chunk of the prompt (prefill) or the one token sampled last
    /// (decode). Never empty.
    pub tokens: &'a [u32],
}

/// What every backend checks of a step's batch before it runs it; the first problem, in
/// words that name the stream. Each stream appears once, pushes at least one token, every
/// token below [`VOCAB`], at the position the backend holds for it (`held`: the tokens it
/// holds of that stream, 0 for one it does not hold), and reaches at most `max_context`
/// tokens (`limit` says what bounds it: "the engine holds KV for").
pub(crate) fn check_batch(
    batch: &[StreamStep<'_>],
    held: impl Fn(StreamId) -> usize,
    max_context: usize,
    limit: &str,
) -> std::result::Result<(), String> {
    let mut seen = std::collections::HashSet::new();
    for s in batch {
        if !seen.insert(s.id) {
            return Err(format!("stream {} appears twice", s.id));
        }
        if s.tokens.is_empty() {
            return Err(format!("stream {} pushes no token", s.id));
        }
        if let Some(t) = s.tokens.iter().find(|&&t| t as usize >= VOCAB) {
            return Err(format!("stream {}: token {t} is not below {VOCAB}", s.id));
        }
        let have = held(s.id);
        if s.position != have {
            return Err(format!(
                "stream {} pushes at position {} but holds {have} tokens",
                s.id, s.position
            ));
        }
        let reach = s.position + s.tokens.len();
        if reach > max_context {
            return Err(format!(
                "stream {} would reach {reach} tokens; {limit} {max_context}",
                s.id
            ));
        }
    }
    Ok(())
}

/// Distinct experts of a step's layer plans, summed over layers (see `ft_model::plan`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct ExpertCounts {
    /// Experts found in the GPU cache.
    pub hits: u64,
    /// Experts not in the cache (`fetched + cpu`).
    pub misses: u64,
    /// Misses gathered over the link.
    pub fetched: u64,
    /// Misses computed on the CPU.
    pub cpu: u64,
    /// Expert bytes gathered over the link for the fetched misses.
    pub gathered_bytes: u64,
}

impl ExpertCounts {
    /// Misses over lookups (0 when nothing was looked up).
    pub fn miss_rate(&self) -> f64 {
        let n = self.hits + self.misses;
        if n == 0 {
            0.0
        } else {
            self.misses as f64 / n as f64
        }
    }

    /// Fetched share of the misses (1 when there was no miss).
    pub fn fetch_share(&self) -> f64 {
        if self.misses == 0 {
            1.0
        } else {
            self.fetched as f64 / self.misses as f64
        }
    }

    /// Element-wise sum.
    pub fn add(&mut self, o: &ExpertCounts) {
        self.hits += o.hits;
        self.misses += o.misses;
        self.fetched += o.fetched;
        self.cpu += o.cpu;
        self.gathered_bytes += o.gathered_bytes;
    }
}

/// What one step cost, as the backend measured it.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct StepStats {
    /// Wall time of the step, us.
    pub wall_us: f64,
    /// Streams in the step.
    pub streams: usize,
    /// Tokens pushed (streams in decode push one, prefill chunks more).
    pub tokens: usize,
    /// Expert counts of the layer plans, where the backend plans layers.
    pub experts: Option<ExpertCounts>,
    /// Busy time per resource, us, where the backend measures it.
    pub busy: Option<BusyTimes>,
}

/// Busy time of each resource during a step, us.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize)]
pub struct BusyTimes {
    /// GPU compute stream.
    pub gpu_us: f64,
    /// Copy engine / PCIe link.
    pub pcie_us: f64,
    /// CPU expert pool.
    pub cpu_us: f64,
}

/// The result of a step.
#[derive(Debug, Clone)]
pub struct StepOutput {
    /// Logits over the vocabulary after each stream's last token, in the order of the input.
    pub logits: Vec<Vec<f32>>,
    /// Instrumentation.
    pub stats: StepStats,
}

/// What the server needs to know about a backend.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct BackendInfo {
    /// Backend name (logs, errors, `/metrics`).
    pub name: String,
    /// Served model id (`/v1/models`).
    pub model: String,
    /// Vocabulary size (logits per stream).
    pub vocab: usize,
    /// Longest context a stream may reach, tokens.
    pub max_context: usize,
    /// Most streams one step may hold.
    pub max_streams: usize,
    /// Device the experts are computed on, in words.
    pub device: String,
}

/// One decode step at a time over a changing set of streams.
pub trait StepBackend: Send {
    /// Name, model, limits.
    fn info(&self) -> BackendInfo;

    /// The strategy in use (hybrid's fetch fraction resolved to a number).
    fn strategy(&self) -> Strategy;

    /// Use `strategy` from the next step on. Called only between steps; per-stream state
    /// (the context) is kept, so in-flight streams continue. Hybrid must come with a fixed
    /// fetch fraction.
    fn set_strategy(&mut self, strategy: Strategy) -> Result<()>;

    /// Run one step: push every stream's tokens through the model and return the logits after
    /// each stream's last token. A stream id not seen before starts a new context at
    /// position 0.
    fn step(&mut self, batch: &[StreamStep<'_>]) -> Result<StepOutput>;

    /// Forget a stream's state (finished, cancelled or disconnected).
    fn release(&mut self, id: StreamId);
}

impl<T: StepBackend + ?Sized> StepBackend for Box<T> {
    fn info(&self) -> BackendInfo {
        (**self).info()
    }
    fn strategy(&self) -> Strategy {
        (**self).strategy()
    }
    fn set_strategy(&mut self, strategy: Strategy) -> Result<()> {
        (**self).set_strategy(strategy)
    }
    fn step(&mut self, batch: &[StreamStep<'_>]) -> Result<StepOutput> {
        (**self).step(batch)
    }
    fn release(&mut self, id: StreamId) {
        (**self).release(id)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Each rule of a batch refused on its own, in words naming the stream, and a batch
    /// that keeps them all accepted.
    #[test]
    fn a_batch_is_checked_stream_by_stream() {
        let held = |id: StreamId| if id == 7 { 5 } else { 0 };
        let check = |batch: &[StreamStep<'_>]| check_batch(batch, held, 8, "the limit is");
        let step = |id, position, tokens| StreamStep {
            id,
            position,
            tokens,
        };
        let one = [65u32];
        assert_eq!(check(&[step(7, 5, &one), step(1, 0, &[1, 2, 3])]), Ok(()));
        let refused = [
            (
                vec![step(1, 0, &one), step(1, 0, &one)],
                "stream 1 appears twice".to_string(),
            ),
            (vec![step(2, 0, &[])], "stream 2 pushes no token".into()),
            (
                vec![step(3, 0, &[1, VOCAB as u32])],
                format!("stream 3: token {VOCAB} is not below {VOCAB}"),
            ),
            (
                vec![step(7, 4, &one)],
                "stream 7 pushes at position 4 but holds 5 tokens".into(),
            ),
            (
                vec![step(7, 5, &[1, 2, 3, 4])],
                "stream 7 would reach 9 tokens; the limit is 8".into(),
            ),
        ];
        for (batch, want) in refused {
            assert_eq!(check(&batch).unwrap_err(), want);
        }
    }
}
