//! `ft-serve`: OpenAI-compatible serving of the MoE runtime.
//!
//! Why it exists: the project's claim is that a calibrated performance model picks the MoE
//! strategy better than the legacy bandwidth ratio, and the place that claim is paid for is a
//! server decoding real requests. This crate is that server and the tool that measures it:
//!
//! - [`backend`]: the [`backend::StepBackend`] seam (one decode step for the active streams,
//!   instrumentation, strategy switch between steps), a reference backend and a pacing wrapper;
//! - [`scheduler`]: continuous batching (a request joins at the next step, leaves when done,
//!   its slot is freed at the next step when its client disconnects), chunked prefill through
//!   the same step path, and the self-check that refits and switches under `auto`;
//! - [`setup`]: the decision at start (the strategy from the prediction, the engine's
//!   configuration, the same decision again at the CPU speed measured on the engine's bank);
//! - [`predict`] and [`monitor`]: the predictions the server holds itself to and the windows
//!   it measures;
//! - [`http`]: the axum routes (`/v1/completions`, `/v1/chat/completions` with SSE,
//!   `/v1/models`, `/health`, `/metrics`) served by hyper with header and body timeouts, a
//!   body limit and a shutdown deadline, errors in OpenAI's JSON shape (`docs/serve.md`);
//! - [`metrics`]: the Prometheus registry behind `/metrics` (histograms, counters, gauges);
//! - [`loadgen`]: the field report's A/B protocol as a client of any OpenAI-compatible server,
//!   and a bounded loopback stress test.

pub mod api;
pub mod backend;
pub mod error;
pub mod http;
pub mod loadgen;
pub mod metrics;
pub mod monitor;
pub mod perf_adapter;
pub mod predict;
pub mod sampling;
pub mod scheduler;
pub mod setup;
pub mod tokenizer;

pub use backend::{StepBackend, StreamStep};
pub use error::{Result, ServeError};
pub use predict::{Decision, Predictor};
pub use scheduler::{SchedulerConfig, SchedulerHandle, SelfCheck};
