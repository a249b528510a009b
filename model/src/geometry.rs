//! The shape of an MoE stack: how many experts, how large, how many are routed per token.

use serde::{Deserialize, Serialize};

use crate::error::{ModelError, Result};
use crate::format::ExpertFormat;

/// Geometry of the routed-expert part of an MoE model.
///
/// Each routed expert is a SwiGLU FFN: `gate` and `up` are `intermediate x hidden`, `down`
/// is `hidden x intermediate`, so `y = down(silu(gate x) * up x)`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MoeGeometry {
    /// Model (residual stream) width, in elements.
    pub hidden: usize,
    /// Expert FFN width, in elements.
    pub intermediate: usize,
    /// Routed experts per MoE layer.
    pub experts: usize,
    /// Routed experts chosen per token per layer.
    pub top_k: usize,
    /// Number of MoE layers.
    pub moe_layers: usize,
    /// Shared (always active, GPU-resident) experts per layer; they count in the dense part.
    #[serde(default)]
    pub shared_experts: usize,
}

impl MoeGeometry {
    /// A small routing-only geometry for tests (64 wide, no shared expert): the routing,
    /// cache and planning tests vary only experts, top-k and layers.
    #[cfg(test)]
    pub(crate) fn routing_test(experts: usize, top_k: usize, layers: usize) -> MoeGeometry {
        MoeGeometry {
            hidden: 64,
            intermediate: 64,
            experts,
            top_k,
            moe_layers: layers,
            shared_experts: 0,
        }
    }

    /// Validate the geometry for a format; errors name the offending field.
    pub fn validate(&self, format: ExpertFormat) -> Result<()> {
        for (field, v) in [
            ("geometry.hidden", self.hidden),
            ("geometry.intermediate", self.intermediate),
            ("geometry.experts", self.experts),
            ("geometry.top_k", self.top_k),
            ("geometry.moe_layers", self.moe_layers),
        ] {
            if v == 0 {
                return Err(ModelError::invalid(field, "must be greater than zero"));
            }
        }
        if self.top_k > self.experts {
            return Err(ModelError::invalid(
                "geometry.top_k",
                format!(
                    "{} is more than the {} routed experts",
                    self.top_k, self.experts
                ),
            ));
        }
        use crate::limits::{self, check};
        for (field, v, limit, why) in [
            (
                "geometry.hidden",
                self.hidden,
                limits::MAX_WIDTH,
                "MAX_WIDTH",
            ),
            (
                "geometry.intermediate",
                self.intermediate,
                limits::MAX_WIDTH,
                "MAX_WIDTH",
            ),
            (
                "geometry.experts",
                self.experts,
                limits::MAX_EXPERTS,
                "MAX_EXPERTS",
            ),
            ("geometry.top_k", self.top_k, limits::MAX_TOP_K, "MAX_TOP_K"),
            (
                "geometry.moe_layers",
                self.moe_layers,
                limits::MAX_MOE_LAYERS,
                "MAX_MOE_LAYERS",
            ),
            (
                "geometry.shared_experts",
                self.shared_experts,
                limits::MAX_SHARED_EXPERTS,
                "MAX_SHARED_EXPERTS",
            ),
        ] {
            check(field, v, limit, &format!("ft_model::limits::{why}"))?;
        }
        check(
            "geometry.experts x geometry.moe_layers",
            self.total_experts(),
            limits::MAX_TOTAL_EXPERTS,
            "ft_model::limits::MAX_TOTAL_EXPERTS: per-expert tables are allocated for all",
        )?;
        // gate/up consume `hidden` per row, down consumes `intermediate` per row.
        format.check_cols("geometry.hidden", self.hidden)?;
        format.check_cols("geometry.intermediate", self.intermediate)?;
        self.checked_total_expert_bytes(format)?;
        Ok(())
    }

    /// Exact bytes of one routed expert (gate + up + down) in `format` (saturating at
    /// `u64::MAX`; a validated geometry never reaches it).
    pub fn expert_bytes(&self, format: ExpertFormat) -> u64 {
        self.checked_expert_bytes(format).unwrap_or(u64::MAX)
    }

    /// [`MoeGeometry::expert_bytes`] with checked arithmetic: an error naming the geometry
    /// where the byte count overflows a `u64`.
    pub fn checked_expert_bytes(&self, format: ExpertFormat) -> Result<u64> {
        let gate_up = format.checked_matrix_bytes(self.intermediate, self.hidden);
        let down = format.checked_matrix_bytes(self.hidden, self.intermediate);
        gate_up
            .and_then(|g| g.checked_mul(2))
            .zip(down)
            .and_then(|(g, d)| g.checked_add(d))
            .ok_or_else(|| self.overflow(format, "one expert"))
    }

    /// [`MoeGeometry::total_expert_bytes`] with checked arithmetic.
    pub fn checked_total_expert_bytes(&self, format: ExpertFormat) -> Result<u64> {
        self.checked_expert_bytes(format)?
            .checked_mul(self.total_experts())
            .ok_or_else(|| self.overflow(format, "all experts"))
    }

    fn overflow(&self, format: ExpertFormat, what: &str) -> ModelError {
        ModelError::invalid(
            "geometry",
            format!(
                "the bytes of {what} ({} x {} {format}, {} experts x {} layers) overflow 64 bits",
                self.hidden, self.intermediate, self.experts, self.moe_layers
            ),
        )
    }

    /// Weights (parameters) of one routed expert (saturating).
    pub fn expert_params(&self) -> u64 {
        (self.hidden as u64)
            .saturating_mul(self.intermediate as u64)
            .saturating_mul(3)
    }

    /// Multiply-accumulates of one expert for one token (the same as its parameter count).
    pub fn expert_macs_per_token(&self) -> u64 {
        self.expert_params()
    }

    /// Total routed experts over all layers (saturating).
    pub fn total_experts(&self) -> u64 {
        (self.experts as u64).saturating_mul(self.moe_layers as u64)
    }

    /// Bytes of all routed experts of all layers (saturating at `u64::MAX`; a validated
    /// geometry never reaches it).
    pub fn total_expert_bytes(&self, format: ExpertFormat) -> u64 {
        self.checked_total_expert_bytes(format).unwrap_or(u64::MAX)
    }

    /// The same geometry with fewer layers (to fit a memory budget).
    pub fn with_layers(&self, moe_layers: usize) -> Self {
        MoeGeometry {
            moe_layers,
            ..*self
        }
    }
}

/// One routed expert of one layer.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct ExpertId {
    /// MoE layer index, from 0.
    pub layer: u16,
    /// Expert index within the layer, from 0.
    pub expert: u32,
}

impl ExpertId {
    /// Make an id.
    pub fn new(layer: usize, expert: usize) -> Self {
        ExpertId {
            layer: layer as u16,
            expert: expert as u32,
        }
    }

    /// Dense index over all layers: `layer * experts + expert`.
    pub fn flat(&self, experts_per_layer: usize) -> usize {
        self.layer as usize * experts_per_layer + self.expert as usize
    }
}

impl std::fmt::Display for ExpertId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "L{}E{}", self.layer, self.expert)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn geo() -> MoeGeometry {
        MoeGeometry {
            hidden: 2560,
            intermediate: 640,
            experts: 512,
            top_k: 10,
            moe_layers: 48,
            shared_experts: 1,
        }
    }

    #[test]
    fn invalid_fields_are_named() {
        let mut g = geo();
        g.top_k = 600;
        let e = g.validate(ExpertFormat::Nvfp4).unwrap_err().to_string();
        assert!(e.contains("geometry.top_k"), "{e}");
        let mut g = geo();
        g.intermediate = 648; // not a multiple of 32
        let e = g.validate(ExpertFormat::Q4_0).unwrap_err().to_string();
        assert!(e.contains("geometry.intermediate"), "{e}");
        let mut g = geo();
        g.hidden = 0;
        let e = g.validate(ExpertFormat::Bf16).unwrap_err().to_string();
        assert!(e.contains("geometry.hidden"), "{e}");
    }

    #[test]
    fn sizes_beyond_the_limits_are_refused_naming_the_field() {
        type Edit = fn(&mut MoeGeometry);
        let cases: [(Edit, &str); 5] = [
            (|g| g.hidden = usize::MAX & !63, "geometry.hidden"),
            (|g| g.experts = 1 << 40, "geometry.experts"),
            (|g| g.moe_layers = 1 << 20, "geometry.moe_layers"),
            (|g| g.shared_experts = 1000, "geometry.shared_experts"),
            (
                |g| {
                    g.experts = 1 << 16;
                    g.moe_layers = 1000;
                },
                "geometry.experts x geometry.moe_layers",
            ),
        ];
        for (edit, field) in cases {
            let mut g = geo();
            edit(&mut g);
            let e = g.validate(ExpertFormat::Nvfp4).unwrap_err().to_string();
            assert!(e.contains(field) && e.contains("limit"), "{field}: {e}");
        }
    }

    #[test]
    fn byte_counts_are_checked_not_wrapped() {
        let g = geo();
        let f = ExpertFormat::Nvfp4;
        // The slow reference: u128 sums of the three matrices.
        let m = |r: usize, c: usize| f.matrix_bytes(r, c) as u128;
        let want = 2 * m(g.intermediate, g.hidden) + m(g.hidden, g.intermediate);
        assert_eq!(g.checked_expert_bytes(f).unwrap() as u128, want);
        assert_eq!(
            g.checked_total_expert_bytes(f).unwrap() as u128,
            want * (g.experts * g.moe_layers) as u128
        );
        // A geometry (not validated) whose bytes overflow is an error, never a small number.
        let huge = MoeGeometry {
            hidden: 1 << 40,
            intermediate: 1 << 40,
            ..g
        };
        let e = huge.checked_expert_bytes(f).unwrap_err().to_string();
        assert!(e.contains("overflow"), "{e}");
        assert_eq!(huge.expert_bytes(f), u64::MAX);
        assert_eq!(huge.total_expert_bytes(f), u64::MAX);
        assert!(huge.validate(f).is_err());
    }

    #[test]
    fn flat_ids() {
        let id = ExpertId::new(3, 7);
        assert_eq!(id.flat(512), 3 * 512 + 7);
        assert_eq!(id.to_string(), "L3E7");
    }
}
