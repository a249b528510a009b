//! `ft-tune`: probe a served engine end to end and decide its MoE strategy from the runs.
//!
//! Why it exists: ft's performance model is fitted to ft's own runtime, and the engines people
//! run have costs it does not see (CPU kernels serving below their bench rate, fixed costs per
//! layer-step, caches that admit differently: mechanism 5 of the design brief). The only view
//! of those is a few measured runs of the engine itself, in its serving conditions. This crate
//! makes those runs for any OpenAI-compatible engine and decides from them:
//!
//! - [`template`]: the TOML that says how to start the engine for a strategy and its
//!   parameters (placeholders, per-strategy flags), checked before anything starts;
//! - [`engine`]: the engine's lifecycle in its own process group, with a guard that never
//!   leaves a process behind;
//! - [`tuning`]: the loop (start, wait, the field report's protocol through
//!   `ft_serve::loadgen`, stop, record, calibrate, decide, next) within a wall budget;
//! - [`calib`]: the seam between runs and estimates, and the model-free reference;
//! - [`model_calib`]: estimates from `ft_model::calibrate` fitted to the runs;
//! - [`plan`]: the choice, whether it is settled, and the next run;
//! - [`setup`]: from tune's flags to the candidates, concurrencies and cache sizes it runs;
//! - [`report`]: the report's human table;
//! - [`obsfile`]: runs written as rows of the observations CSV (`ft_model::observe`).

pub mod calib;
pub mod engine;
pub mod error;
pub mod model_calib;
pub mod obsfile;
pub mod plan;
pub mod report;
pub mod setup;
pub mod template;
pub mod tuning;

pub use error::{Result, TuneError};
