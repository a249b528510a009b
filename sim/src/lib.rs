//! `ft-sim`: a discrete-event simulator of MoE decode on what-if hosts.
//!
//! The simulator is the second of `ft`'s three views of a decode step (runtime, simulator,
//! analytic model; see `docs/DESIGN.md`). It shares with the others everything that is
//! not time: routing processes, the expert cache and `plan_layer` (which experts hit, which
//! misses are fetched, which go to the CPU), and the perf cost terms that give every
//! duration. What it adds is time as a timeline: queueing on the copy stream, DRAM
//! contention that starts and stops mid-transfer, CPU wake-ups, waits between the GPU and
//! CPU halves of a layer, batching of concurrent streams and context growth.
//!
//! Layout (after dslab/simcore): [`time`], [`event`] (the queue), [`component`] (what reacts
//! to events), [`scheduler`] (the run loop and the run's one seeded RNG); [`resources`]
//! compute durations and availability and never see events; [`reference`](mod@reference) is the naive
//! slow model the event engine is tested against.

pub mod compare;
pub mod component;
pub mod costs;
pub mod decode;
pub mod error;
pub mod event;
pub mod field_report;
pub mod hosts;
pub mod layer;
pub mod reference;
pub mod resources;
pub mod run;
pub mod scheduler;
pub mod sweep;
pub mod time;

pub use error::{Result, SimError};
