//! The ways a decode step can place a layer's experts, and the strategies built from them.
//!
//! A strategy is data: a per-layer placement policy ([`PlacementPolicy`]). Each layer's
//! experts are resident on the GPU, cached with a share of their misses gathered and the
//! rest computed on the CPU (offload: all gathered; hybrid: a fetch fraction; cpu: none),
//! or CPU-only. offload, hybrid(f), resident and cpu place every layer alike; layer split
//! (llama.cpp's `--n-cpu-moe N`) puts the experts of the first N layers on the CPU and keeps
//! the rest resident, or cached (`layer-split-cached`). What a layer costs follows from
//! its placement's work ([`crate::schedule`]), never from the strategy's name.

use serde::{Deserialize, Serialize};
use std::fmt;
use std::str::FromStr;

use crate::error::{ModelError, Result};

/// Hybrid's fetch fraction: a fixed share of each layer's misses, or the model's optimum.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum FetchFraction {
    /// Gather this share (0 to 1) of each layer's misses; compute the rest on the CPU.
    Fixed(f64),
    /// Take the fraction the performance model predicts fastest.
    Auto,
}

impl FetchFraction {
    /// Parse `auto` or a number in [0, 1]; errors name `field`.
    pub fn parse(field: &str, s: &str) -> Result<Self> {
        if s.eq_ignore_ascii_case("auto") {
            return Ok(FetchFraction::Auto);
        }
        let f: f64 = s.parse().map_err(|_| {
            ModelError::invalid(field, format!("'{s}' is neither 'auto' nor a number"))
        })?;
        Self::fixed(field, f)
    }

    /// A fixed fraction, checked to lie in [0, 1].
    pub fn fixed(field: &str, f: f64) -> Result<Self> {
        if !(0.0..=1.0).contains(&f) || f.is_nan() {
            return Err(ModelError::invalid(field, format!("{f} is outside [0, 1]")));
        }
        Ok(FetchFraction::Fixed(f))
    }
}

impl fmt::Display for FetchFraction {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            FetchFraction::Fixed(x) => write!(f, "{x:.3}"),
            FetchFraction::Auto => f.write_str("auto"),
        }
    }
}

/// The strategies, without parameters.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum StrategyKind {
    /// Every miss gathered over PCIe into the cache; all experts computed on the GPU.
    Offload,
    /// A fetch fraction of each layer's misses gathered, the rest computed on the CPU.
    Hybrid,
    /// Every expert resident on the GPU (the upper bound where memory allows).
    Resident,
    /// Every miss computed on the CPU; the cache holds only what it was given.
    Cpu,
    /// The experts of the first N layers on the CPU, the other layers' resident on the GPU
    /// (llama.cpp's `--n-cpu-moe N`).
    LayerSplit,
    /// The experts of the first N layers on the CPU, the other layers cached with every miss
    /// gathered (layer split mixed with offload).
    LayerSplitCached,
}

impl StrategyKind {
    /// All kinds, in table order.
    pub const ALL: [StrategyKind; 6] = [
        StrategyKind::Offload,
        StrategyKind::Hybrid,
        StrategyKind::Resident,
        StrategyKind::Cpu,
        StrategyKind::LayerSplit,
        StrategyKind::LayerSplitCached,
    ];

    /// Command-line name.
    pub fn name(self) -> &'static str {
        match self {
            StrategyKind::Offload => "offload",
            StrategyKind::Hybrid => "hybrid",
            StrategyKind::Resident => "resident",
            StrategyKind::Cpu => "cpu",
            StrategyKind::LayerSplit => "layer-split",
            StrategyKind::LayerSplitCached => "layer-split-cached",
        }
    }

    /// Whether the kind takes a number of CPU layers (`layer-split:N`).
    pub fn takes_cpu_layers(self) -> bool {
        match self {
            StrategyKind::LayerSplit | StrategyKind::LayerSplitCached => true,
            StrategyKind::Offload
            | StrategyKind::Hybrid
            | StrategyKind::Resident
            | StrategyKind::Cpu => false,
        }
    }
}

impl fmt::Display for StrategyKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for StrategyKind {
    type Err = ModelError;

    fn from_str(s: &str) -> Result<Self> {
        StrategyKind::ALL
            .into_iter()
            .find(|k| k.name().eq_ignore_ascii_case(s))
            .ok_or_else(|| ModelError::UnknownName {
                kind: "strategy",
                name: s.to_string(),
                known: StrategyKind::ALL.map(|k| k.name()).join(", "),
            })
    }
}

/// Layer split's number of CPU layers: given, or the model's optimum under the GPU memory
/// budget.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum CpuLayers {
    /// The experts of this many layers (the first ones) on the CPU.
    Fixed(usize),
    /// The number the performance model predicts fastest among those that fit.
    Auto,
}

impl CpuLayers {
    /// Parse `auto` or a whole number of layers; errors name `field`.
    pub fn parse(field: &str, s: &str) -> Result<Self> {
        if s.eq_ignore_ascii_case("auto") {
            return Ok(CpuLayers::Auto);
        }
        s.parse().map(CpuLayers::Fixed).map_err(|_| {
            ModelError::invalid(
                field,
                format!("'{s}' is neither 'auto' nor a number of layers"),
            )
        })
    }
}

impl fmt::Display for CpuLayers {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            CpuLayers::Fixed(n) => write!(f, "{n}"),
            CpuLayers::Auto => f.write_str("auto"),
        }
    }
}

/// A strategy with its parameters.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "kebab-case")]
pub enum Strategy {
    /// See [`StrategyKind::Offload`].
    Offload,
    /// See [`StrategyKind::Hybrid`].
    Hybrid {
        /// Share of each layer's misses gathered over the link.
        fetch: FetchFraction,
    },
    /// See [`StrategyKind::Resident`].
    Resident,
    /// See [`StrategyKind::Cpu`].
    Cpu,
    /// See [`StrategyKind::LayerSplit`].
    LayerSplit {
        /// Layers whose experts run on the CPU (the first ones).
        cpu_layers: CpuLayers,
    },
    /// See [`StrategyKind::LayerSplitCached`].
    LayerSplitCached {
        /// Layers whose experts run on the CPU (the first ones).
        cpu_layers: CpuLayers,
    },
}

impl Strategy {
    /// The kind without parameters.
    pub fn kind(&self) -> StrategyKind {
        match self {
            Strategy::Offload => StrategyKind::Offload,
            Strategy::Hybrid { .. } => StrategyKind::Hybrid,
            Strategy::Resident => StrategyKind::Resident,
            Strategy::Cpu => StrategyKind::Cpu,
            Strategy::LayerSplit { .. } => StrategyKind::LayerSplit,
            Strategy::LayerSplitCached { .. } => StrategyKind::LayerSplitCached,
        }
    }

    /// A `--strategy` list: `all` (every kind, numbers `auto`) or a comma list of
    /// [`Strategy`] names (`offload,hybrid:0.4,layer-split:12`).
    pub fn parse_list(list: &str) -> Result<Vec<Strategy>> {
        if list.eq_ignore_ascii_case("all") {
            return Ok(StrategyKind::ALL
                .iter()
                .map(|k| Strategy::from_kind(*k, None))
                .collect());
        }
        list.split(',').map(|s| s.trim().parse()).collect()
    }

    /// The CPU layers a list gives layer split (its first `layer-split:N` or
    /// `layer-split-cached:N` with a number), if any.
    pub fn given_cpu_layers(list: &[Strategy]) -> Option<CpuLayers> {
        list.iter()
            .find_map(Strategy::cpu_layers)
            .filter(|n| *n != CpuLayers::Auto)
    }

    /// Build from a kind and, for hybrid, a fetch fraction (`auto` when none is given); layer
    /// split's number of CPU layers is `auto`.
    pub fn from_kind(kind: StrategyKind, fetch: Option<FetchFraction>) -> Self {
        Self::from_parts(kind, fetch, None)
    }

    /// Build from a kind, hybrid's fetch fraction and layer split's CPU layers (each `auto`
    /// when not given; ignored by the kinds that do not take it).
    pub fn from_parts(
        kind: StrategyKind,
        fetch: Option<FetchFraction>,
        cpu_layers: Option<CpuLayers>,
    ) -> Self {
        let cpu_layers = cpu_layers.unwrap_or(CpuLayers::Auto);
        match kind {
            StrategyKind::Offload => Strategy::Offload,
            StrategyKind::Hybrid => Strategy::Hybrid {
                fetch: fetch.unwrap_or(FetchFraction::Auto),
            },
            StrategyKind::Resident => Strategy::Resident,
            StrategyKind::Cpu => Strategy::Cpu,
            StrategyKind::LayerSplit => Strategy::LayerSplit { cpu_layers },
            StrategyKind::LayerSplitCached => Strategy::LayerSplitCached { cpu_layers },
        }
    }

    /// The fixed fetch fraction of the cached layers: 1 for offload, resident and layer
    /// split (whose GPU layers gather every miss, or have none), 0 for cpu, the given one
    /// for hybrid; `None` for hybrid with `auto` (not yet resolved).
    pub fn fixed_fetch_fraction(&self) -> Option<f64> {
        match self {
            Strategy::Offload
            | Strategy::Resident
            | Strategy::LayerSplit { .. }
            | Strategy::LayerSplitCached { .. } => Some(1.0),
            Strategy::Cpu => Some(0.0),
            Strategy::Hybrid {
                fetch: FetchFraction::Fixed(f),
            } => Some(*f),
            Strategy::Hybrid {
                fetch: FetchFraction::Auto,
            } => None,
        }
    }

    /// Layer split's number of CPU layers (`None` for the other kinds).
    pub fn cpu_layers(&self) -> Option<CpuLayers> {
        match self {
            Strategy::LayerSplit { cpu_layers } | Strategy::LayerSplitCached { cpu_layers } => {
                Some(*cpu_layers)
            }
            Strategy::Offload | Strategy::Hybrid { .. } | Strategy::Resident | Strategy::Cpu => {
                None
            }
        }
    }

    /// The strategy's per-layer placement for a model of `layers` MoE layers; an error for
    /// an unresolved `auto` (hybrid's fraction, layer split's N) or more CPU layers than the
    /// model has.
    pub fn policy(&self, layers: usize) -> Result<PlacementPolicy> {
        let cached = |f: f64| LayerPlacement::Cached { fetch_fraction: f };
        let split = |n: CpuLayers, rest: LayerPlacement| match n {
            CpuLayers::Auto => Err(ModelError::invalid(
                "cpu layers",
                "layer split's 'auto' number of CPU layers must be resolved before planning",
            )),
            CpuLayers::Fixed(n) if n > layers => Err(ModelError::invalid(
                "cpu layers",
                format!("{n} CPU layers asked of a model with {layers} MoE layers"),
            )),
            CpuLayers::Fixed(n) => Ok(PlacementPolicy {
                cpu_layers: n,
                rest,
            }),
        };
        match self {
            Strategy::Offload => Ok(PlacementPolicy::uniform(cached(1.0))),
            Strategy::Cpu => Ok(PlacementPolicy::uniform(cached(0.0))),
            // Resident runs on a cache that holds every expert (`crate::cache::build_cache`),
            // so every lookup hits: a cached layer with nothing to fetch.
            Strategy::Resident => Ok(PlacementPolicy::uniform(cached(1.0))),
            Strategy::Hybrid {
                fetch: FetchFraction::Fixed(f),
            } => Ok(PlacementPolicy::uniform(cached(*f))),
            Strategy::Hybrid {
                fetch: FetchFraction::Auto,
            } => Err(ModelError::invalid(
                "fetch fraction",
                "hybrid's 'auto' fetch fraction must be resolved to a number before planning",
            )),
            Strategy::LayerSplit { cpu_layers } => split(*cpu_layers, LayerPlacement::Resident),
            Strategy::LayerSplitCached { cpu_layers } => split(*cpu_layers, cached(1.0)),
        }
    }

    /// The name that [`Strategy`]'s `FromStr` reads back: `offload`, `hybrid:0.4`,
    /// `hybrid` (auto), `resident`, `cpu`, `layer-split:12`, `layer-split-cached:auto`.
    pub fn cli_name(&self) -> String {
        match self {
            Strategy::Hybrid {
                fetch: FetchFraction::Fixed(f),
            } => format!("hybrid:{f}"),
            Strategy::LayerSplit { cpu_layers } | Strategy::LayerSplitCached { cpu_layers } => {
                format!("{}:{cpu_layers}", self.kind().name())
            }
            Strategy::Offload
            | Strategy::Resident
            | Strategy::Cpu
            | Strategy::Hybrid {
                fetch: FetchFraction::Auto,
            } => self.kind().name().to_string(),
        }
    }
}

impl FromStr for Strategy {
    type Err = ModelError;

    /// `KIND` or `KIND:PARAM`: hybrid's parameter is its fetch fraction (`auto` or a number
    /// in [0, 1]), layer split's its CPU layers (`auto` or a count); the other kinds take
    /// none. Without a parameter the number is `auto`.
    fn from_str(s: &str) -> Result<Self> {
        let (name, param) = match s.split_once(':') {
            Some((n, p)) => (n, Some(p)),
            None => (s, None),
        };
        let kind: StrategyKind = name.parse()?;
        match (kind, param) {
            (_, None) => Ok(Strategy::from_kind(kind, None)),
            (StrategyKind::Hybrid, Some(p)) => Ok(Strategy::Hybrid {
                fetch: FetchFraction::parse("hybrid's fetch fraction", p)?,
            }),
            (StrategyKind::LayerSplit | StrategyKind::LayerSplitCached, Some(p)) => {
                let n = CpuLayers::parse(&format!("{name}'s CPU layers"), p)?;
                Ok(Strategy::from_parts(kind, None, Some(n)))
            }
            (StrategyKind::Offload | StrategyKind::Resident | StrategyKind::Cpu, Some(p)) => {
                Err(ModelError::invalid(
                    "strategy",
                    format!("'{s}': {name} takes no parameter (got '{p}')"),
                ))
            }
        }
    }
}

impl fmt::Display for Strategy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Strategy::Hybrid { fetch } => write!(f, "hybrid(f={fetch})"),
            Strategy::LayerSplit { cpu_layers } | Strategy::LayerSplitCached { cpu_layers } => {
                write!(f, "{}(n={cpu_layers})", self.kind().name())
            }
            Strategy::Offload | Strategy::Resident | Strategy::Cpu => {
                f.write_str(self.kind().name())
            }
        }
    }
}

/// Where one layer's experts live and how its misses are served.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "kebab-case", deny_unknown_fields)]
pub enum LayerPlacement {
    /// Every expert of the layer resident on the GPU: all hits, nothing crosses the link,
    /// the shared cache is not used.
    Resident,
    /// In the shared GPU cache: this share of the misses gathered over the link, the rest
    /// computed on the CPU (1: offload, 0: cpu, between: hybrid).
    Cached {
        /// Share of the misses gathered (0 to 1).
        fetch_fraction: f64,
    },
    /// Every expert of the layer computed on the CPU from host memory; the layer never
    /// touches the GPU cache.
    CpuOnly,
}

/// A strategy as data: every layer's placement. The first `cpu_layers` layers are
/// [`LayerPlacement::CpuOnly`], the others `rest` (llama.cpp's `--n-cpu-moe N` counts from
/// the first layer too).
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PlacementPolicy {
    /// Layers (the first ones) whose experts are computed on the CPU.
    pub cpu_layers: usize,
    /// The placement of every other layer.
    pub rest: LayerPlacement,
}

impl PlacementPolicy {
    /// Every layer placed alike.
    pub fn uniform(rest: LayerPlacement) -> Self {
        PlacementPolicy {
            cpu_layers: 0,
            rest,
        }
    }

    /// Every layer cached with fetch fraction `f` (offload 1, cpu 0, hybrid between).
    pub fn cached(f: f64) -> Self {
        Self::uniform(LayerPlacement::Cached { fetch_fraction: f })
    }

    /// The placement of layer `layer`.
    pub fn layer(&self, layer: usize) -> LayerPlacement {
        if layer < self.cpu_layers {
            LayerPlacement::CpuOnly
        } else {
            self.rest
        }
    }

    /// The fetch fraction of the cached layers (1 where none is cached: nothing is left
    /// for the CPU there).
    pub fn fetch_fraction(&self) -> f64 {
        match self.rest {
            LayerPlacement::Cached { fetch_fraction } => fetch_fraction,
            LayerPlacement::Resident | LayerPlacement::CpuOnly => 1.0,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fetch_fraction_parsing() {
        assert_eq!(
            FetchFraction::parse("f", "auto").unwrap(),
            FetchFraction::Auto
        );
        assert_eq!(
            FetchFraction::parse("f", "0.25").unwrap(),
            FetchFraction::Fixed(0.25)
        );
        let e = FetchFraction::parse("--fetch-fraction", "1.5")
            .unwrap_err()
            .to_string();
        assert!(e.contains("--fetch-fraction"), "{e}");
        assert!(FetchFraction::parse("f", "x").is_err());
    }

    #[test]
    fn strategy_names_and_fractions() {
        for k in StrategyKind::ALL {
            assert_eq!(k.name().parse::<StrategyKind>().unwrap(), k);
        }
        assert!("fused".parse::<StrategyKind>().is_err());
        let h = Strategy::from_kind(StrategyKind::Hybrid, Some(FetchFraction::Fixed(0.3)));
        assert_eq!(h.fixed_fetch_fraction(), Some(0.3));
        assert_eq!(Strategy::Offload.fixed_fetch_fraction(), Some(1.0));
        assert_eq!(Strategy::Cpu.fixed_fetch_fraction(), Some(0.0));
        let json = serde_json::to_string(&h).unwrap();
        let back: Strategy = serde_json::from_str(&json).unwrap();
        assert_eq!(back, h);
    }

    /// Every kind has a CLI name that reads back, with and without its parameter, and a
    /// policy once its parameter is resolved: a kind added without them fails here.
    #[test]
    fn every_strategy_has_a_cli_name_and_a_policy() {
        let layers = 12;
        for kind in StrategyKind::ALL {
            for s in [
                Strategy::from_parts(kind, None, None),
                Strategy::from_parts(
                    kind,
                    Some(FetchFraction::Fixed(0.25)),
                    Some(CpuLayers::Fixed(5)),
                ),
            ] {
                assert_eq!(s.kind(), kind);
                assert_eq!(
                    s.cli_name().parse::<Strategy>().unwrap(),
                    s,
                    "{}",
                    s.cli_name()
                );
                let json = serde_json::to_string(&s).unwrap();
                assert_eq!(serde_json::from_str::<Strategy>(&json).unwrap(), s);
            }
            let resolved = Strategy::from_parts(
                kind,
                Some(FetchFraction::Fixed(0.25)),
                Some(CpuLayers::Fixed(5)),
            );
            let p = resolved.policy(layers).unwrap();
            assert_eq!(kind.takes_cpu_layers(), p.cpu_layers == 5, "{kind}");
            for l in 0..layers {
                let expected = if l < p.cpu_layers {
                    LayerPlacement::CpuOnly
                } else {
                    p.rest
                };
                assert_eq!(p.layer(l), expected);
            }
        }
        let e = "layer-split:x".parse::<Strategy>().unwrap_err().to_string();
        assert!(e.contains("layer-split's CPU layers"), "{e}");
        assert!("offload:3".parse::<Strategy>().is_err());
        assert!("hybrid:2".parse::<Strategy>().is_err());
        let too_many = Strategy::LayerSplit {
            cpu_layers: CpuLayers::Fixed(13),
        };
        assert!(too_many.policy(12).is_err());
        assert!("layer-split"
            .parse::<Strategy>()
            .unwrap()
            .policy(12)
            .is_err());
        assert_eq!(
            "layer-split-cached:3"
                .parse::<Strategy>()
                .unwrap()
                .policy(12)
                .unwrap(),
            PlacementPolicy {
                cpu_layers: 3,
                rest: LayerPlacement::Cached {
                    fetch_fraction: 1.0
                }
            }
        );
    }

    #[test]
    fn strategy_lists_parse_all_or_names() {
        let all = Strategy::parse_list("ALL").unwrap();
        assert_eq!(all.len(), StrategyKind::ALL.len());
        assert_eq!(Strategy::given_cpu_layers(&all), None);
        let some = Strategy::parse_list("offload, layer-split:12,hybrid:0.4").unwrap();
        assert_eq!(some[0], Strategy::Offload);
        assert_eq!(some[2].kind(), StrategyKind::Hybrid);
        assert_eq!(
            Strategy::given_cpu_layers(&some),
            Some(CpuLayers::Fixed(12))
        );
        assert!(Strategy::parse_list("offload,nosuch").is_err());
    }
}
