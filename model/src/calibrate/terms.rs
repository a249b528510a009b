//! The engine terms `ft calibrate` fits, and how each is applied to [`PerfParams`].

use serde::{Deserialize, Serialize};
use std::fmt;

use crate::perf::{ParamId, PerfParams};
use crate::schedule::LayerWork;

/// One engine term: what only end-to-end runs of an engine show, on top of the host model.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Term {
    /// The CPU side's serving rate as a multiple of its bench rate (dimensionless; 1 = the
    /// bench). Applied as [`PerfParams::cpu_serving_slowdown`] `= (1 + base) / r - 1`.
    CpuServingRate,
    /// The link's effective rate as a multiple of the host model's (dimensionless). Applied
    /// to [`PerfParams::gather_gbs`].
    LinkRate,
    /// Fixed cost of a layer-step with a gather and no CPU share, in us (added to
    /// [`crate::perf::StrategyOverheads::offload_us`]).
    FixedGather,
    /// Fixed cost of a layer-step with a gather and a CPU share, in us (`hybrid_us`).
    FixedGatherAndCpu,
    /// Fixed cost of a layer-step with a CPU share and no gather, in us (`cpu_us`).
    FixedCpu,
    /// Fixed cost of a layer-step with neither (resident experts only), in us (`resident_us`).
    FixedGpuOnly,
    /// The rest of the step per stream, in us per layer
    /// ([`crate::perf::EngineTerms::rest_stream_us`]).
    RestPerStream,
    /// The rest of the step's growth with context, in us per layer, stream and 1,000 tokens
    /// ([`crate::perf::EngineTerms::rest_context_us_per_ktok`]).
    RestPerContext,
    /// Hybrid's miss rate relative to offload's at the same cache (dimensionless;
    /// [`crate::perf::EngineTerms::hybrid_miss_factor`]).
    HybridMissFactor,
}

impl Term {
    /// Every term, in the order they are considered for identification (the ones most runs
    /// identify first).
    pub const ALL: [Term; 9] = [
        Term::CpuServingRate,
        Term::LinkRate,
        Term::RestPerStream,
        Term::FixedGather,
        Term::FixedGatherAndCpu,
        Term::FixedCpu,
        Term::FixedGpuOnly,
        Term::RestPerContext,
        Term::HybridMissFactor,
    ];

    /// The term's name in reports and JSON.
    pub fn name(self) -> &'static str {
        match self {
            Term::CpuServingRate => "cpu-serving-rate",
            Term::LinkRate => "link-rate",
            Term::FixedGather => "fixed-gather",
            Term::FixedGatherAndCpu => "fixed-gather-and-cpu",
            Term::FixedCpu => "fixed-cpu",
            Term::FixedGpuOnly => "fixed-gpu-only",
            Term::RestPerStream => "rest-per-stream",
            Term::RestPerContext => "rest-per-context",
            Term::HybridMissFactor => "hybrid-miss-factor",
        }
    }

    /// The unit of the term's value.
    pub fn unit(self) -> &'static str {
        match self {
            Term::CpuServingRate | Term::LinkRate => "x bench",
            Term::HybridMissFactor => "x offload's",
            Term::FixedGather | Term::FixedGatherAndCpu | Term::FixedCpu | Term::FixedGpuOnly => {
                "us/layer-step"
            }
            Term::RestPerStream => "us/layer/stream",
            Term::RestPerContext => "us/layer/stream/1k ctx",
        }
    }

    /// The value that changes nothing (ft's own runtime).
    pub fn neutral(self) -> f64 {
        if self.is_factor() {
            1.0
        } else {
            0.0
        }
    }

    /// Whether the term multiplies (fitted in log space) rather than adds a cost (fitted
    /// non-negative).
    pub fn is_factor(self) -> bool {
        matches!(
            self,
            Term::CpuServingRate | Term::LinkRate | Term::HybridMissFactor
        )
    }

    /// The size of a change of the term that matters, in its unit: the scale its
    /// identification is judged at and its search starts from.
    pub fn scale(self) -> f64 {
        match self {
            Term::CpuServingRate | Term::LinkRate | Term::HybridMissFactor => 1.0,
            Term::FixedGather | Term::FixedGatherAndCpu | Term::FixedCpu | Term::FixedGpuOnly => {
                100.0
            }
            Term::RestPerStream => 20.0,
            Term::RestPerContext => 2.0,
        }
    }

    /// The layer work of a fixed cost.
    pub fn work(self) -> Option<LayerWork> {
        match self {
            Term::FixedGather => Some(LayerWork::Gather),
            Term::FixedGatherAndCpu => Some(LayerWork::GatherAndCpuShare),
            Term::FixedCpu => Some(LayerWork::CpuShare),
            Term::FixedGpuOnly => Some(LayerWork::GpuOnly),
            _ => None,
        }
    }

    /// The model parameter the term moves, where one carries an uncertainty.
    pub fn param(self) -> Option<ParamId> {
        match self {
            Term::CpuServingRate => Some(ParamId::CpuServingSlowdown),
            Term::LinkRate => Some(ParamId::GatherGbs),
            Term::FixedGather => Some(ParamId::OverheadOffloadUs),
            Term::FixedGatherAndCpu => Some(ParamId::OverheadHybridUs),
            Term::FixedCpu => Some(ParamId::OverheadCpuUs),
            Term::FixedGpuOnly => Some(ParamId::OverheadResidentUs),
            Term::RestPerStream | Term::RestPerContext | Term::HybridMissFactor => None,
        }
    }

    /// Write the term's `value` into `p` on top of the base parameters `base`.
    pub fn apply(self, base: &PerfParams, p: &mut PerfParams, value: f64) {
        match self {
            Term::CpuServingRate => {
                p.cpu_serving_slowdown = (1.0 + base.cpu_serving_slowdown) / value - 1.0
            }
            Term::LinkRate => p.gather_gbs = base.gather_gbs * value,
            Term::FixedGather | Term::FixedGatherAndCpu | Term::FixedCpu | Term::FixedGpuOnly => {
                let w = self.work().expect("fixed cost");
                p.overhead.set(w, base.overhead.of(w) + value);
            }
            Term::RestPerStream => p.engine.rest_stream_us = base.engine.rest_stream_us + value,
            Term::RestPerContext => {
                p.engine.rest_context_us_per_ktok = base.engine.rest_context_us_per_ktok + value
            }
            Term::HybridMissFactor => {
                p.engine.hybrid_miss_factor = base.engine.hybrid_miss_factor * value
            }
        }
    }

    /// The derivative of [`ParamId`] `self.param()` over the term's value at `value`
    /// (for mapping standard errors onto the parameters).
    pub fn param_slope(self, base: &PerfParams, value: f64) -> f64 {
        match self {
            Term::CpuServingRate => -(1.0 + base.cpu_serving_slowdown) / (value * value),
            Term::LinkRate => base.gather_gbs,
            _ => 1.0,
        }
    }
}

impl std::str::FromStr for Term {
    type Err = crate::error::ModelError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Term::ALL
            .into_iter()
            .find(|t| t.name() == s)
            .ok_or_else(|| crate::error::ModelError::UnknownName {
                kind: "engine term",
                name: s.to_string(),
                known: Term::ALL.map(|t| t.name()).join(", "),
            })
    }
}

impl fmt::Display for Term {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// `base` with `values[i]` of `terms[i]` applied.
pub fn apply_all(base: &PerfParams, terms: &[Term], values: &[f64]) -> PerfParams {
    let mut p = base.clone();
    for (t, v) in terms.iter().zip(values) {
        t.apply(base, &mut p, *v);
    }
    p
}
