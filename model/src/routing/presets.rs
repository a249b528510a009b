//! Named routing presets, calibrated against published LRU hit rates (see `docs/routing.md`).
//!
//! The numbers below are the tuned knobs of [`RoutingProcess`]; the miss-rate curves they
//! produce are measured by the tests of this module and tabulated in `docs/routing.md`.

use super::RoutingProcess;
use crate::error::{ModelError, Result};

/// Names of the presets, in order of increasing locality.
pub const PRESET_NAMES: [&str; 4] = ["uniform", "mild", "typical", "skewed"];

/// Seed every preset starts from (any fixed value; `--seed` replaces it).
pub const DEFAULT_SEED: u64 = 0x00F7_5EED;

/// No skew, no reuse, no correlation: every route is a uniform draw of `top_k` distinct
/// experts. LRU hits at residency `r` are about `r` (no locality to exploit).
pub fn uniform() -> RoutingProcess {
    RoutingProcess {
        seed: DEFAULT_SEED,
        zipf: 0.0,
        edge_zipf: 0.0,
        edge_layers: 0,
        reuse: 0.0,
        reuse_window: 1,
        edge_reuse: 0.0,
        layer_correlation: 0.0,
        weight_concentration: 1.0,
    }
}

/// Weak locality: a flat popularity and little token-to-token reuse.
pub fn mild() -> RoutingProcess {
    RoutingProcess {
        seed: DEFAULT_SEED,
        zipf: 0.3,
        edge_zipf: 0.15,
        edge_layers: 2,
        reuse: 0.15,
        reuse_window: 1,
        edge_reuse: 0.06,
        layer_correlation: 0.1,
        weight_concentration: 1.0,
    }
}

/// The default: hit rates in the middle of the published range for LRU.
pub fn typical() -> RoutingProcess {
    RoutingProcess {
        seed: DEFAULT_SEED,
        zipf: 0.6,
        edge_zipf: 0.3,
        edge_layers: 2,
        reuse: 0.3,
        reuse_window: 2,
        edge_reuse: 0.12,
        layer_correlation: 0.2,
        weight_concentration: 1.0,
    }
}

/// Strong locality: a skewed popularity and frequent reuse (repetitive text, one domain).
pub fn skewed() -> RoutingProcess {
    RoutingProcess {
        seed: DEFAULT_SEED,
        zipf: 1.0,
        edge_zipf: 0.5,
        edge_layers: 2,
        reuse: 0.6,
        reuse_window: 8,
        edge_reuse: 0.24,
        layer_correlation: 0.3,
        weight_concentration: 1.0,
    }
}

/// A preset by name.
pub fn by_name(name: &str) -> Result<RoutingProcess> {
    match name {
        "uniform" => Ok(uniform()),
        "mild" => Ok(mild()),
        "typical" => Ok(typical()),
        "skewed" => Ok(skewed()),
        _ => Err(ModelError::UnknownName {
            kind: "routing preset",
            name: name.to_string(),
            known: PRESET_NAMES.join(", "),
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cache::CachePolicy;
    use crate::geometry::MoeGeometry;
    use crate::routing::SyntheticRouting;
    use crate::strategy::Strategy;
    use crate::traffic::{strategy_traffic, TrafficConfig};

    fn geo(experts: usize, top_k: usize, layers: usize) -> MoeGeometry {
        MoeGeometry::routing_test(experts, top_k, layers)
    }

    /// Warm-up and measured steps of every curve point.
    const WARMUP: usize = 200;
    const STEPS: usize = 400;

    /// LRU hit rate (expert level) of offload with `slots` slots.
    fn lru_hits(preset: &str, g: MoeGeometry, slots: usize, streams: usize) -> f64 {
        let p = by_name(preset).unwrap();
        let mut src = SyntheticRouting::new(&p, g).unwrap();
        let cfg = TrafficConfig {
            warmup_steps: WARMUP,
            steps: STEPS,
            streams,
        };
        let t =
            strategy_traffic(&mut src, &Strategy::Offload, &CachePolicy::Lru, slots, &cfg).unwrap();
        1.0 - t.total.miss_rate
    }

    fn slots_at(g: MoeGeometry, residency: f64) -> usize {
        ((g.experts * g.moe_layers) as f64 * residency).round() as usize
    }

    #[test]
    #[ignore = "prints the table of docs/routing.md"]
    fn print_curves() {
        for (e, k, l) in [(8, 2, 32), (128, 8, 48), (512, 10, 48)] {
            let g = geo(e, k, l);
            for name in PRESET_NAMES {
                let mut row = format!("| {name} | {e}x{k}x{l} |");
                for r in [0.125, 0.25, 0.4, 0.5, 0.75] {
                    row += &format!(" {:.2} |", lru_hits(name, g, slots_at(g, r), 1));
                }
                println!("{row}");
            }
        }
        let g = geo(256, 6, 61);
        for name in PRESET_NAMES {
            println!(
                "{name} 256x6x61 700 slots: {:.3} (2 streams {:.3})",
                lru_hits(name, g, 700, 1),
                lru_hits(name, g, 700, 2)
            );
        }
    }

    /// A documented band of LRU hit rates (expert level, one stream, offload).
    struct Band {
        preset: &'static str,
        /// (experts, top_k, layers)
        geometry: (usize, usize, usize),
        /// Cache slots over all routed experts.
        residency: f64,
        /// (low, high) hit rate.
        hits: (f64, f64),
        /// Where the band comes from (docs/routing.md); "theory" follows from the process.
        source: &'static str,
    }

    const fn band(
        preset: &'static str,
        geometry: (usize, usize, usize),
        residency: f64,
        hits: (f64, f64),
        source: &'static str,
    ) -> Band {
        Band {
            preset,
            geometry,
            residency,
            hits,
            source,
        }
    }

    const FINE: (usize, usize, usize) = (512, 10, 48);
    const MIXTRAL: (usize, usize, usize) = (8, 2, 32);
    const QWEN3_30B: (usize, usize, usize) = (128, 8, 48);
    const DSV4: (usize, usize, usize) = (256, 6, 61);

    const BANDS: &[Band] = &[
        band(
            "uniform",
            FINE,
            0.125,
            (0.075, 0.145),
            "theory: hits ~ residency",
        ),
        band("uniform", FINE, 0.25, (0.20, 0.27), "theory"),
        band("uniform", FINE, 0.5, (0.45, 0.52), "theory"),
        band("uniform", QWEN3_30B, 0.25, (0.20, 0.27), "theory"),
        band(
            "mild",
            DSV4,
            700.0 / (256.0 * 61.0),
            (0.08, 0.20),
            "FreeToken#174 8-18%",
        ),
        band(
            "typical",
            MIXTRAL,
            0.25,
            (0.25, 0.42),
            "Eliseev&Mazur k=2 (recalled)",
        ),
        band(
            "typical",
            MIXTRAL,
            0.5,
            (0.50, 0.70),
            "Eliseev&Mazur k=4 (recalled)",
        ),
        band(
            "typical",
            FINE,
            0.25,
            (0.45, 0.65),
            "imp#2061 18%:43.5%, 36%:62%",
        ),
        band("typical", FINE, 0.5, (0.65, 0.80), "imp#2061 54%:72%"),
        band(
            "skewed",
            FINE,
            0.125,
            (0.60, 0.80),
            "llama.cpp#27861 LRU-64 ~67%",
        ),
        band(
            "skewed",
            FINE,
            0.25,
            (0.75, 0.90),
            "llama.cpp#27861 LRU-128 ~81%",
        ),
        band(
            "skewed",
            QWEN3_30B,
            0.4,
            (0.82, 0.96),
            "imp#1359 90-95% at 40%",
        ),
    ];

    #[test]
    fn lru_curves_fall_in_their_bands() {
        for b in BANDS {
            let (name, (e, k, l), r, (lo, hi), source) =
                (b.preset, b.geometry, b.residency, b.hits, b.source);
            let g = geo(e, k, l);
            let h = lru_hits(name, g, slots_at(g, r), 1);
            assert!(
                (lo..=hi).contains(&h),
                "{name} {e}x{k}x{l} at {r:.3} residency: LRU hits {h:.3} outside [{lo}, {hi}] ({source})"
            );
        }
    }

    #[test]
    fn presets_are_ordered_by_locality() {
        for (e, k, l) in [(128, 8, 48), (512, 10, 48)] {
            let g = geo(e, k, l);
            for r in [0.125, 0.25, 0.5] {
                let hits: Vec<f64> = PRESET_NAMES
                    .iter()
                    .map(|n| lru_hits(n, g, slots_at(g, r), 1))
                    .collect();
                assert!(
                    hits.windows(2).all(|w| w[0] + 0.03 < w[1]),
                    "{e}x{k}x{l} at {r}: {hits:?}"
                );
                // More streams share experts: the union per layer is below streams x top_k.
            }
        }
    }

    #[test]
    fn lru_smaller_than_one_tokens_demand_never_hits() {
        // Layers are visited cyclically: an expert used at step t is looked up again at step
        // t + 1 only after every other layer's (at least top_k) experts, so it sits at LRU
        // depth >= top_k x (layers - 1) + 1: with that many slots or fewer no lookup can hit.
        // Between there and one token's demand (top_k x layers) the hit rate ramps up (only
        // experts touched late in their layer survive).
        for (e, k, l) in [(8, 2, 32), (128, 8, 48), (512, 10, 48)] {
            let g = geo(e, k, l);
            let demand = k * l;
            for name in PRESET_NAMES {
                for streams in [1, 3] {
                    let below = lru_hits(name, g, k * (l - 1), streams);
                    assert_eq!(
                        below, 0.0,
                        "{name} {e}x{k}x{l} x{streams}: hits below the cliff"
                    );
                }
                if name != "uniform" {
                    let above = lru_hits(name, g, 2 * demand, 1);
                    assert!(
                        above > 0.1,
                        "{name} {e}x{k}x{l}: only {above} hits at 2x demand"
                    );
                }
            }
        }
    }

    #[test]
    fn names_resolve() {
        for name in PRESET_NAMES {
            let p = by_name(name).unwrap();
            p.validate().unwrap();
            assert_eq!(p.seed, DEFAULT_SEED);
        }
        assert_eq!(RoutingProcess::default(), typical());
        let e = by_name("zipf").unwrap_err().to_string();
        assert!(e.contains("zipf") && e.contains("typical"), "{e}");
    }
}
