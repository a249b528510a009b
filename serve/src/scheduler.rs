//! Continuous batching: the decode loop that turns requests into backend steps.
//!
//! One OS thread owns the [`StepBackend`] and runs steps back to back while there is work.
//! Each step holds every active stream once: a stream still in its prompt pushes the next
//! chunk of at most [`SchedulerConfig::prefill_chunk`] prompt tokens (chunked prefill through
//! the same step path as decode: the backend sees a multi-token input for that stream and
//! returns the logits after its last token), a stream in decode pushes the token it sampled
//! last. A request submitted while a step runs joins at the next step; a finished one (EOS,
//! `max_tokens`, the context limit) leaves after the step that finished it; a request whose
//! client went away (its event receiver dropped) is noticed before the next step and its slot
//! freed. Requests beyond [`SchedulerConfig::max_streams`] wait in a FIFO queue of at most
//! [`SchedulerConfig::max_queue`]; beyond that [`SchedulerHandle::submit`] refuses them
//! (HTTP 429).
//!
//! After every step the [`Monitor`] compares realised speed with the [`Predictor`]; on a
//! sustained divergence the loop refits the predictor and, under `auto`, switches the backend's
//! strategy before the next step if another is now predicted faster. A switch happens only
//! between steps and keeps every stream's context, so no request is dropped or restarted.

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{mpsc, Arc};
use std::thread::JoinHandle;

use ft_model::Strategy;
use serde::Serialize;
use tokio::sync::mpsc::{unbounded_channel, UnboundedReceiver, UnboundedSender};
use tracing::{debug, info, warn};

use crate::backend::{BackendInfo, StepBackend, StreamId, StreamStep};
use crate::error::{Result, ServeError};
use crate::metrics::Metrics;
use crate::monitor::{CheckConfig, Monitor};
use crate::predict::{Decision, Predictor};
use crate::sampling::{Sampler, SamplingParams};
use crate::tokenizer::EOS;

/// Limits and knobs of the decode loop.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct SchedulerConfig {
    /// Most streams in one step.
    pub max_streams: usize,
    /// Most requests waiting for a slot; more are refused.
    pub max_queue: usize,
    /// Most prompt tokens one stream pushes per step.
    pub prefill_chunk: usize,
    /// Longest context (prompt + generated tokens) of a stream.
    pub context_limit: usize,
    /// The self-check.
    pub check: CheckConfig,
}

impl SchedulerConfig {
    /// Defaults for a backend: its stream and context limits, a queue as deep as the stream
    /// limit, and prefill chunks of 128 tokens (long enough to amortise a step's fixed
    /// costs over many prompt tokens, short enough that streams in decode beside a
    /// prefilling one are not stalled for long).
    pub fn for_backend(info: &BackendInfo) -> Self {
        SchedulerConfig {
            max_streams: info.max_streams,
            max_queue: info.max_streams,
            prefill_chunk: 128,
            context_limit: info.max_context,
            check: CheckConfig::default(),
        }
    }

    fn validate(&self, info: &BackendInfo) -> Result<()> {
        if self.max_streams == 0 || self.max_streams > info.max_streams {
            return Err(ServeError::invalid(
                "--max-streams",
                format!(
                    "{} is not in 1..={} (the backend's limit)",
                    self.max_streams, info.max_streams
                ),
            ));
        }
        if self.context_limit < 2 || self.context_limit > info.max_context {
            return Err(ServeError::invalid(
                "--context-limit",
                format!(
                    "{} is not in 2..={} (the backend's limit)",
                    self.context_limit, info.max_context
                ),
            ));
        }
        if self.prefill_chunk == 0 {
            return Err(ServeError::invalid("--prefill-chunk", "must be at least 1"));
        }
        Ok(())
    }
}

/// How the strategy is chosen, and what predicts it.
pub struct SelfCheck {
    /// The predictor (absent: no self-check).
    pub predictor: Option<Box<dyn Predictor>>,
    /// True under `--moe-strategy auto`: the loop may switch strategy.
    pub auto: bool,
}

/// A request as the decode loop sees it.
#[derive(Debug, Clone, PartialEq)]
pub struct GenerateRequest {
    /// Prompt tokens (at least one).
    pub prompt: Vec<u32>,
    /// Most tokens to generate (at least one).
    pub max_tokens: usize,
    /// Sampling.
    pub sampling: SamplingParams,
}

/// Why generation ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum FinishReason {
    /// EOS (or, at the HTTP layer, a stop sequence).
    Stop,
    /// `max_tokens` or the context limit.
    Length,
}

impl FinishReason {
    /// OpenAI's name.
    pub fn name(self) -> &'static str {
        match self {
            FinishReason::Stop => "stop",
            FinishReason::Length => "length",
        }
    }
}

/// The end of a request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Finish {
    /// Why.
    pub reason: FinishReason,
    /// Prompt tokens.
    pub prompt_tokens: usize,
    /// Generated tokens (the EOS that stopped it included).
    pub completion_tokens: usize,
}

/// What the decode loop sends a request's handler.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TokenEvent {
    /// A generated token; `finish` is set on the last one.
    Token {
        /// The token.
        token: u32,
        /// Set when this token ends the request.
        finish: Option<Finish>,
    },
    /// The backend failed on a step that held the request.
    Failed(String),
}

/// Why a submission was refused.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SubmitError {
    /// Every slot and queue place is taken.
    Busy {
        /// Requests in flight (active and queued).
        in_flight: usize,
    },
    /// The request does not fit the context.
    TooLong {
        /// Prompt tokens + max_tokens.
        needed: usize,
        /// The limit.
        limit: usize,
    },
    /// The decode loop has stopped (shutting down).
    Stopped,
}

/// A strategy switch the loop made.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct SwitchRecord {
    /// Steps completed before the switch (the switch applies from this step index on).
    pub before_step: u64,
    /// Old strategy.
    pub from: Strategy,
    /// New strategy.
    pub to: Strategy,
    /// Streams at the time.
    pub streams: usize,
    /// What diverged.
    pub reason: String,
}

/// What the loop did, returned when it stops.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct SchedulerSummary {
    /// Steps run.
    pub steps: u64,
    /// Strategy switches.
    pub switches: Vec<SwitchRecord>,
    /// Sustained divergences.
    pub divergences: u64,
}

enum Command {
    Submit(Box<Pending>),
    Shutdown,
}

struct Pending {
    id: StreamId,
    req: GenerateRequest,
    events: UnboundedSender<TokenEvent>,
    _permit: Permit,
}

/// A place in flight; frees itself when the request leaves the loop.
struct Permit(Arc<AtomicUsize>);

impl Drop for Permit {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::AcqRel);
    }
}

/// The way into the decode loop (cheap to clone, shared by the HTTP handlers).
#[derive(Clone)]
pub struct SchedulerHandle {
    tx: mpsc::Sender<Command>,
    in_flight: Arc<AtomicUsize>,
    next_id: Arc<AtomicU64>,
    capacity: usize,
    context_limit: usize,
    metrics: Arc<Metrics>,
    info: BackendInfo,
}

impl SchedulerHandle {
    /// Hand a request to the loop; its tokens arrive on the returned receiver. Dropping the
    /// receiver cancels the request at the next step.
    pub fn submit(
        &self,
        req: GenerateRequest,
    ) -> std::result::Result<(StreamId, UnboundedReceiver<TokenEvent>), SubmitError> {
        let needed = req.prompt.len() + req.max_tokens;
        if needed > self.context_limit {
            return Err(SubmitError::TooLong {
                needed,
                limit: self.context_limit,
            });
        }
        let cap = self.capacity;
        self.in_flight
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| {
                (n < cap).then_some(n + 1)
            })
            .map_err(|n| SubmitError::Busy { in_flight: n })?;
        let permit = Permit(Arc::clone(&self.in_flight));
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let (events, rx) = unbounded_channel();
        self.tx
            .send(Command::Submit(Box::new(Pending {
                id,
                req,
                events,
                _permit: permit,
            })))
            .map_err(|_| SubmitError::Stopped)?;
        Ok((id, rx))
    }

    /// Ask the loop to stop once every request in flight has finished.
    pub fn shutdown(&self) {
        let _ = self.tx.send(Command::Shutdown);
    }

    /// Requests in flight (active and queued).
    pub fn in_flight(&self) -> usize {
        self.in_flight.load(Ordering::Acquire)
    }

    /// The shared metrics.
    pub fn metrics(&self) -> &Arc<Metrics> {
        &self.metrics
    }

    /// The backend's description.
    pub fn info(&self) -> &BackendInfo {
        &self.info
    }

    /// Longest context (prompt + max_tokens) a request may ask for.
    pub fn context_limit(&self) -> usize {
        self.context_limit
    }
}

struct Active {
    id: StreamId,
    prompt: Vec<u32>,
    /// Tokens pushed through the model so far.
    fed: usize,
    generated: usize,
    max_tokens: usize,
    last: u32,
    sampler: Sampler,
    events: UnboundedSender<TokenEvent>,
    /// Released just before the last token is sent, so that a client who got its answer
    /// and sends the next request at once finds the place free.
    permit: Option<Permit>,
}

/// Start the decode loop on its own thread. `backend` must already run the strategy to start
/// with.
pub fn spawn(
    backend: Box<dyn StepBackend>,
    cfg: SchedulerConfig,
    check: SelfCheck,
) -> Result<(SchedulerHandle, JoinHandle<SchedulerSummary>)> {
    let info = backend.info();
    cfg.validate(&info)?;
    let metrics = Arc::new(Metrics::new(&info, backend.strategy(), check.auto)?);
    let (tx, rx) = mpsc::channel();
    let handle = SchedulerHandle {
        tx,
        in_flight: Arc::new(AtomicUsize::new(0)),
        next_id: Arc::new(AtomicU64::new(1)),
        capacity: cfg.max_streams + cfg.max_queue,
        context_limit: cfg.context_limit,
        metrics: Arc::clone(&metrics),
        info,
    };
    let mut lp = Loop {
        backend,
        cfg,
        check,
        rx,
        metrics,
        queue: VecDeque::new(),
        active: Vec::new(),
        monitor: Monitor::new(cfg.check),
        decisions: HashMap::new(),
        summary: SchedulerSummary::default(),
        draining: false,
        predict_failed: false,
    };
    let join = std::thread::Builder::new()
        .name("ft-decode".into())
        .spawn(move || {
            lp.run();
            lp.summary
        })
        .map_err(|source| ServeError::Io {
            what: "starting the decode thread".into(),
            source,
        })?;
    Ok((handle, join))
}

struct Loop {
    backend: Box<dyn StepBackend>,
    cfg: SchedulerConfig,
    check: SelfCheck,
    rx: mpsc::Receiver<Command>,
    metrics: Arc<Metrics>,
    queue: VecDeque<Box<Pending>>,
    active: Vec<Active>,
    monitor: Monitor,
    decisions: HashMap<usize, Decision>,
    summary: SchedulerSummary,
    draining: bool,
    predict_failed: bool,
}

impl Loop {
    fn run(&mut self) {
        loop {
            if self.active.is_empty() && self.queue.is_empty() {
                // Idle: the load gauges read zero until the next request.
                self.metrics.set_load(0, 0);
                if self.draining {
                    break;
                }
                match self.rx.recv() {
                    Ok(cmd) => self.command(cmd),
                    Err(_) => break,
                }
            }
            while let Ok(cmd) = self.rx.try_recv() {
                self.command(cmd);
            }
            self.drop_cancelled();
            self.admit();
            if self.active.is_empty() {
                continue;
            }
            self.step();
            self.metrics.set_load(self.active.len(), self.queue.len());
        }
        info!(
            steps = self.summary.steps,
            switches = self.summary.switches.len(),
            "decode loop stopped"
        );
    }

    fn command(&mut self, cmd: Command) {
        match cmd {
            Command::Submit(p) => self.queue.push_back(p),
            Command::Shutdown => self.draining = true,
        }
    }

    fn drop_cancelled(&mut self) {
        let backend = &mut self.backend;
        let mut cancelled = 0u64;
        self.active.retain(|a| {
            let gone = a.events.is_closed();
            if gone {
                debug!(stream = a.id, "client gone: slot freed");
                backend.release(a.id);
                cancelled += 1;
            }
            !gone
        });
        let before = self.queue.len();
        self.queue.retain(|p| !p.events.is_closed());
        cancelled += (before - self.queue.len()) as u64;
        self.metrics.requests_ended("cancelled", cancelled);
    }

    fn admit(&mut self) {
        while self.active.len() < self.cfg.max_streams {
            let Some(p) = self.queue.pop_front() else {
                break;
            };
            let Pending {
                id,
                req,
                events,
                _permit,
            } = *p;
            if req.prompt.is_empty() || req.max_tokens == 0 {
                let _ = events.send(TokenEvent::Failed(
                    "a request needs a prompt token and max_tokens >= 1".into(),
                ));
                continue;
            }
            self.active.push(Active {
                id,
                fed: 0,
                generated: 0,
                max_tokens: req.max_tokens,
                last: 0,
                sampler: Sampler::new(req.sampling),
                prompt: req.prompt,
                events,
                permit: Some(_permit),
            });
        }
        self.metrics.set_load(self.active.len(), self.queue.len());
    }

    fn decision(&mut self, streams: usize) -> Option<&Decision> {
        let predictor = self.check.predictor.as_ref()?;
        if let std::collections::hash_map::Entry::Vacant(slot) = self.decisions.entry(streams) {
            match predictor.predict(streams) {
                Ok(d) => {
                    slot.insert(d);
                }
                Err(e) => {
                    if !self.predict_failed {
                        warn!("no prediction at {streams} stream(s): {e}; not checking");
                        self.predict_failed = true;
                    }
                    return None;
                }
            }
        }
        self.decisions.get(&streams)
    }

    fn step(&mut self) {
        let step_index = self.summary.steps;
        let inputs: Vec<(StreamId, usize, Vec<u32>)> = self
            .active
            .iter()
            .map(|a| {
                let tokens = if a.fed < a.prompt.len() {
                    let end = (a.fed + self.cfg.prefill_chunk).min(a.prompt.len());
                    a.prompt[a.fed..end].to_vec()
                } else {
                    vec![a.last]
                };
                (a.id, a.fed, tokens)
            })
            .collect();
        let batch: Vec<StreamStep<'_>> = inputs
            .iter()
            .map(|(id, position, tokens)| StreamStep {
                id: *id,
                position: *position,
                tokens,
            })
            .collect();
        let strategy = self.backend.strategy();
        let result = self.backend.step(&batch);
        self.summary.steps += 1;
        let out = match result {
            Ok(out) => out,
            Err(e) => {
                let msg = match e {
                    ServeError::Step { message, .. } => ServeError::Step {
                        step: step_index,
                        streams: batch.len(),
                        backend: self.backend.info().name,
                        message,
                    }
                    .to_string(),
                    other => other.to_string(),
                };
                warn!("{msg}; failing the {} request(s) of the step", batch.len());
                let n = self.active.len() as u64;
                for a in self.active.drain(..) {
                    self.backend.release(a.id);
                    let _ = a.events.send(TokenEvent::Failed(msg.clone()));
                }
                self.metrics.requests_ended("failed", n);
                return;
            }
        };
        let decode_only = inputs.iter().all(|i| i.2.len() == 1)
            && self.active.iter().all(|a| a.fed >= a.prompt.len());
        let prompt_tokens: usize = self
            .active
            .iter()
            .zip(&inputs)
            .filter(|(a, _)| a.fed < a.prompt.len())
            .map(|(_, i)| i.2.len())
            .sum();
        // Sample and emit.
        let mut generated = 0u64;
        let mut finished: Vec<usize> = Vec::new();
        let mut completed = 0u64;
        let mut cancelled = 0u64;
        for (i, (a, logits)) in self.active.iter_mut().zip(&out.logits).enumerate() {
            a.fed += inputs[i].2.len();
            if a.fed < a.prompt.len() {
                continue;
            }
            let token = a.sampler.sample(logits);
            a.generated += 1;
            a.last = token;
            generated += 1;
            let reason = if token == EOS {
                Some(FinishReason::Stop)
            } else if a.generated >= a.max_tokens || a.fed + 1 > self.cfg.context_limit {
                Some(FinishReason::Length)
            } else {
                None
            };
            let finish = reason.map(|reason| Finish {
                reason,
                prompt_tokens: a.prompt.len(),
                completion_tokens: a.generated,
            });
            if finish.is_some() {
                a.permit = None;
            }
            if a.events.send(TokenEvent::Token { token, finish }).is_err() {
                finished.push(i);
                cancelled += 1;
            } else if finish.is_some() {
                finished.push(i);
                completed += 1;
            }
        }
        for &i in finished.iter().rev() {
            let a = self.active.remove(i);
            self.backend.release(a.id);
        }
        let streams = out.stats.streams;
        self.metrics
            .record_step(&out.stats, decode_only, generated, prompt_tokens as u64);
        self.metrics.requests_ended("completed", completed);
        self.metrics.requests_ended("cancelled", cancelled);
        self.self_check(&strategy, &out.stats, decode_only, streams);
    }

    fn self_check(
        &mut self,
        strategy: &Strategy,
        stats: &crate::backend::StepStats,
        decode_only: bool,
        streams: usize,
    ) {
        if self.check.predictor.is_none() {
            return;
        }
        let prediction = if decode_only {
            self.decision(streams).cloned()
        } else {
            None
        };
        if let Some(d) = &prediction {
            if let Some(e) = d.estimate(strategy.kind()) {
                self.metrics.set_prediction(e.tok_s, d.streams);
            }
        }
        let divergence = self
            .monitor
            .observe(strategy, stats, decode_only, prediction.as_ref());
        if let Some(obs) = self.monitor.last() {
            self.metrics.set_realised(obs.tok_s);
        }
        let Some(div) = divergence else {
            return;
        };
        self.summary.divergences += 1;
        let what = div.what.join("; ");
        warn!(
            "self-check: {what} (strategy {strategy}, {streams} stream(s), {} windows of {} steps)",
            self.cfg.check.sustain, self.cfg.check.window_steps
        );
        let observations = self.monitor.observations();
        let Some(predictor) = self.check.predictor.as_mut() else {
            return;
        };
        match predictor.refit(&observations) {
            Ok(summary) => info!(
                "self-check: refitted to {} window(s): {summary}",
                observations.len()
            ),
            Err(e) => warn!("self-check: refit failed: {e}"),
        }
        self.decisions.clear();
        self.metrics.diverged();
        self.monitor.restart();
        let Some(d) = self.decision(streams).cloned() else {
            return;
        };
        info!(
            "self-check: {}",
            d.log_line(if self.check.auto {
                None
            } else {
                Some(strategy)
            })
        );
        if !self.check.auto || d.choice.kind() == strategy.kind() {
            return;
        }
        let current = d.estimate(strategy.kind()).map(|e| e.tok_s.value);
        let best = d.estimate(d.choice.kind()).map(|e| e.tok_s.value);
        if let (Some(c), Some(b)) = (current, best) {
            if b <= c {
                return;
            }
        }
        match self.backend.set_strategy(d.choice) {
            Ok(()) => {
                warn!(
                    "self-check: switching strategy {strategy} -> {} before step {} ({streams} stream(s) continue)",
                    d.choice, self.summary.steps
                );
                self.summary.switches.push(SwitchRecord {
                    before_step: self.summary.steps,
                    from: *strategy,
                    to: d.choice,
                    streams,
                    reason: what,
                });
                self.metrics.switched(d.choice);
            }
            Err(e) => warn!("self-check: could not switch to {}: {e}", d.choice),
        }
    }
}
