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
        if self.experts > u32::MAX as usize || self.moe_layers > u16::MAX as usize {
            return Err(ModelError::invalid(
                "geometry.experts",
                "too many experts or layers to index",
            ));
        }
        // gate/up consume `hidden` per row, down consumes `intermediate` per row.
        format.check_cols("geometry.hidden", self.hidden)?;
        format.check_cols("geometry.intermediate", self.intermediate)?;
        Ok(())
    }

    /// Exact bytes of one routed expert (gate + up + down) in `format`.
    pub fn expert_bytes(&self, format: ExpertFormat) -> u64 {
        2 * format.matrix_bytes(self.intermediate, self.hidden)
            + format.matrix_bytes(self.hidden, self.intermediate)
    }

    /// Weights (parameters) of one routed expert.
    pub fn expert_params(&self) -> u64 {
        3 * self.hidden as u64 * self.intermediate as u64
    }

    /// Multiply-accumulates of one expert for one token (the same as its parameter count).
    pub fn expert_macs_per_token(&self) -> u64 {
        self.expert_params()
    }

    /// Total routed experts over all layers.
    pub fn total_experts(&self) -> u64 {
        self.experts as u64 * self.moe_layers as u64
    }

    /// Bytes of all routed experts of all layers.
    pub fn total_expert_bytes(&self, format: ExpertFormat) -> u64 {
        self.total_experts() * self.expert_bytes(format)
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
    fn flat_ids() {
        let id = ExpertId::new(3, 7);
        assert_eq!(id.flat(512), 3 * 512 + 7);
        assert_eq!(id.to_string(), "L3E7");
    }
}
