//! The ways a decode step can treat the experts it misses in the GPU cache.

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

/// The four strategies, without parameters.
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
}

impl StrategyKind {
    /// All kinds, in table order.
    pub const ALL: [StrategyKind; 4] = [
        StrategyKind::Offload,
        StrategyKind::Hybrid,
        StrategyKind::Resident,
        StrategyKind::Cpu,
    ];

    /// Command-line name.
    pub fn name(self) -> &'static str {
        match self {
            StrategyKind::Offload => "offload",
            StrategyKind::Hybrid => "hybrid",
            StrategyKind::Resident => "resident",
            StrategyKind::Cpu => "cpu",
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
}

impl Strategy {
    /// The kind without parameters.
    pub fn kind(&self) -> StrategyKind {
        match self {
            Strategy::Offload => StrategyKind::Offload,
            Strategy::Hybrid { .. } => StrategyKind::Hybrid,
            Strategy::Resident => StrategyKind::Resident,
            Strategy::Cpu => StrategyKind::Cpu,
        }
    }

    /// Build from a kind and, for hybrid, a fetch fraction (`auto` when none is given).
    pub fn from_kind(kind: StrategyKind, fetch: Option<FetchFraction>) -> Self {
        match kind {
            StrategyKind::Offload => Strategy::Offload,
            StrategyKind::Hybrid => Strategy::Hybrid {
                fetch: fetch.unwrap_or(FetchFraction::Auto),
            },
            StrategyKind::Resident => Strategy::Resident,
            StrategyKind::Cpu => Strategy::Cpu,
        }
    }

    /// The fixed fetch fraction this strategy implies: 1 for offload and resident, 0 for cpu,
    /// the given one for hybrid; `None` for hybrid with `auto` (not yet resolved).
    pub fn fixed_fetch_fraction(&self) -> Option<f64> {
        match self {
            Strategy::Offload | Strategy::Resident => Some(1.0),
            Strategy::Cpu => Some(0.0),
            Strategy::Hybrid {
                fetch: FetchFraction::Fixed(f),
            } => Some(*f),
            Strategy::Hybrid {
                fetch: FetchFraction::Auto,
            } => None,
        }
    }
}

impl fmt::Display for Strategy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Strategy::Hybrid { fetch } => write!(f, "hybrid(f={fetch})"),
            other => f.write_str(other.kind().name()),
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
}
