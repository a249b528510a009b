//! `ft-model`: the vocabulary every part of `ft` speaks, and the analytic performance model.
//!
//! The runtime, the simulator and the analytic model are three views of one decode step
//! (see `docs/DESIGN.md`). Whatever is not time lives here, once: the MoE geometry and
//! expert formats, model presets, strategies, routing processes and traces, cache policies
//! and the split of a layer's misses between the link and the CPU. Because the runtime and
//! the simulator call the same code for these, their miss rates agree by construction.

pub mod cache;
pub mod calibrate;
pub mod engine_settings;
pub mod error;
pub mod format;
pub mod freetoken;
pub mod geometry;
pub mod host;
pub mod hosts;
pub mod import;
pub mod limits;
pub mod observe;
pub mod perf;
pub mod placement;
pub mod plan;
pub mod preset;
pub mod profile;
pub mod profile_select;
pub mod report;
pub mod resolve;
pub mod routing;
pub mod schedule;
pub mod stats;
pub mod strategy;
pub mod traffic;

pub use cache::{CacheOptions, CachePolicy, CacheSize, CacheTopology, ExpertCache, SlotId};
pub use engine_settings::EngineSettings;
pub use error::ModelError;
pub use format::{ExpertFormat, GgmlQuant};
pub use geometry::{ExpertId, MoeGeometry};
pub use placement::{GpuLayout, GpuPlacement};
pub use plan::{plan_layer, AdmissionOrder, AdmissionPolicy, LayerPlan};
pub use preset::{DenseSpec, ModelSpec};
pub use routing::{RoutingProcess, RoutingSource, StepRouting, TokenRoute};
pub use strategy::{
    CpuLayers, FetchFraction, LayerPlacement, PlacementPolicy, Strategy, StrategyKind,
};
