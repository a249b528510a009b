//! Host presets and `--host` resolution live in [`ft_model::hosts`], where predict, run and
//! serve use them without the simulator; re-exported here for the simulator's callers.

pub use ft_model::hosts::*;

/// The simulator's name for a resolved host.
pub type SimHost = ResolvedHost;
