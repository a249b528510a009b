//! From a layer plan to the work the devices do: the GPU expert steps, the gather copies, the
//! CPU share, and where every expert output lands.
//!
//! # Output rows and the combine order
//! Every (stream `s`, top-k position `j`) pair of a layer contributes `w_sj * FFN_e(x_s)`.
//! Where it is computed (a hit, a fetched miss, the CPU) depends on the cache's history, so if
//! the per-stream sum were formed in placement order, the rounding of the output would depend
//! on that history too: the fresh-versus-warmed divergence of the field report. With
//! [`CombineOrder::Fixed`] (the default) each pair gets its own output row, `j * B + s`
//! (`B` streams), every row receives exactly one contribution from exactly one place, and
//! the rows are summed afterwards in one fixed order (a tree over `j`, the same for every
//! placement). Where the CPU and GPU kernels are bit-identical (the int8 path on both sides),
//! placement then never changes a bit of the output. [`CombineOrder::Fast`] sums in
//! placement order into one row per stream: fewer, smaller device operations, but outputs
//! that depend on where experts ran.

use ft_model::cache::SlotId;
use ft_model::plan::LayerPlan;
use ft_model::routing::TokenRoute;
use ft_model::ExpertId;
use serde::{Deserialize, Serialize};

use crate::error::{Result, RuntimeError};
use crate::gather::CopyRegion;
use crate::gpu_experts::{ExpertStep, ExpertTask, TokenWeight};
use crate::instrument::LayerCounts;
use crate::slots::SlotPool;

/// Bytes of one f32.
pub(crate) const F32_BYTES: usize = 4;

/// How a layer's expert outputs are combined (see the module docs).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum CombineOrder {
    /// One row per (stream, top-k position), summed in a fixed order: outputs do not depend
    /// on where an expert ran.
    #[default]
    Fixed,
    /// One row per stream, summed in placement order (hits, fetched, CPU).
    Fast,
}

impl CombineOrder {
    /// Name on the command line and in JSON.
    pub fn name(self) -> &'static str {
        match self {
            CombineOrder::Fixed => "fixed",
            CombineOrder::Fast => "fast",
        }
    }
}

impl std::str::FromStr for CombineOrder {
    type Err = RuntimeError;

    fn from_str(s: &str) -> Result<Self> {
        match s.to_ascii_lowercase().as_str() {
            "fixed" => Ok(CombineOrder::Fixed),
            "fast" => Ok(CombineOrder::Fast),
            _ => Err(RuntimeError::invalid(
                "--combine",
                format!("'{s}' is neither 'fixed' nor 'fast'"),
            )),
        }
    }
}

/// The output rows of one step's layers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Rows {
    pub order: CombineOrder,
    /// Streams in the step.
    pub streams: usize,
    /// Experts per token.
    pub top_k: usize,
}

impl Rows {
    /// Rows of the expert steps' inputs and outputs.
    pub fn count(&self) -> usize {
        match self.order {
            CombineOrder::Fixed => self.top_k * self.streams,
            CombineOrder::Fast => self.streams,
        }
    }

    /// The row of stream `s`'s `j`-th expert.
    pub fn row(&self, s: usize, j: usize) -> usize {
        match self.order {
            CombineOrder::Fixed => j * self.streams + s,
            CombineOrder::Fast => s,
        }
    }
}

/// The CPU share of a layer, ready for [`crate::cpu_pool::CpuExecutor::run_layer`].
#[derive(Debug, Clone, Default, PartialEq)]
pub(crate) struct CpuWork {
    /// Experts computed on the CPU.
    pub experts: Vec<ExpertId>,
    /// Per expert: (row of the CPU's `x`/`y`, scaled router weight).
    pub tokens: Vec<Vec<(u32, f32)>>,
    /// Per CPU row: the stream whose activation it holds.
    pub x_streams: Vec<u32>,
    /// Copies of CPU output rows (bytes of the host output buffer) into the device buffer
    /// that receives them.
    pub scatter: Vec<CopyRegion>,
}

impl CpuWork {
    /// Rows of the CPU's `x` and `y`.
    pub fn rows(&self) -> usize {
        self.x_streams.len()
    }
}

/// Everything one layer asks of the devices.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct LayerWork {
    /// Hits, from their slots.
    pub hits: ExpertStep,
    /// Fetched and uncached misses, from their slots and staging slots.
    pub fetched: ExpertStep,
    /// The fetched and uncached misses and the slots they go to (for [`crate::gather`]).
    pub moves: Vec<(ExpertId, SlotId)>,
    /// The CPU share.
    pub cpu: CpuWork,
    /// The plan's counts.
    pub counts: LayerCounts,
}

/// What [`build_layer`] needs besides the plan.
pub(crate) struct BuildContext<'a> {
    pub rows: Rows,
    pub slots: &'a SlotPool,
    /// Slots of the cache proper; staging slots follow them.
    pub cache_slots: usize,
    /// Staging slots after the cache's.
    pub staging_slots: usize,
    /// Multiplies every router weight (the residual scale, see `Engine`).
    pub weight_scale: f32,
    /// Template of the expert steps (format, shape, activation path); `tokens` is set here.
    pub template: &'a ExpertStep,
    pub hidden: usize,
}

/// The top-k position of `expert` in stream `s`'s route.
fn position(routes: &[TokenRoute], s: u32, expert: u32, layer: usize) -> Result<usize> {
    routes
        .get(s as usize)
        .and_then(|r| r.experts.iter().position(|&e| e == expert))
        .ok_or_else(|| {
            RuntimeError::invalid(
                "layer plan",
                format!("layer {layer}: expert {expert} is not in stream {s}'s route"),
            )
        })
}

/// Turn one layer's plan into device work.
pub(crate) fn build_layer(
    plan: &LayerPlan,
    routes: &[TokenRoute],
    cx: &BuildContext<'_>,
) -> Result<LayerWork> {
    let layer = plan.layer;
    let rows = cx.rows;
    let step = |experts| ExpertStep {
        tokens: rows.count(),
        experts,
        ..cx.template.clone()
    };
    let tokens_of = |id: ExpertId, tokens: &[(u32, f32)]| -> Result<Vec<TokenWeight>> {
        tokens
            .iter()
            .map(|&(s, w)| {
                let j = position(routes, s, id.expert, layer)?;
                Ok(TokenWeight {
                    token: rows.row(s as usize, j) as u32,
                    weight: w * cx.weight_scale,
                })
            })
            .collect()
    };
    let slot_task = |id: ExpertId, slot: SlotId, tokens: &[(u32, f32)]| -> Result<ExpertTask> {
        Ok(ExpertTask {
            weights_offset: cx.slots.offset(slot)?,
            tokens: tokens_of(id, tokens)?,
        })
    };

    let mut hits = Vec::with_capacity(plan.hits.len());
    for w in &plan.hits {
        let slot = w.slot.ok_or_else(|| {
            RuntimeError::invalid("layer plan", format!("hit {} has no slot", w.id))
        })?;
        hits.push(slot_task(w.id, slot, &w.tokens)?);
    }
    let mut fetched = Vec::with_capacity(plan.link_experts());
    let mut moves = Vec::with_capacity(plan.link_experts());
    for f in &plan.fetched {
        fetched.push(slot_task(f.id, f.slot, &f.tokens)?);
        moves.push((f.id, f.slot));
    }
    if plan.uncached.len() > cx.staging_slots {
        return Err(RuntimeError::invalid(
            "expert cache",
            format!(
                "layer {layer} needs {} staging slots for experts the cache refused, the engine \
                 has {}; use a larger --cache-slots",
                plan.uncached.len(),
                cx.staging_slots
            ),
        ));
    }
    for (i, u) in plan.uncached.iter().enumerate() {
        let slot = SlotId((cx.cache_slots + i) as u32);
        fetched.push(slot_task(u.id, slot, &u.tokens)?);
        moves.push((u.id, slot));
    }

    // The CPU share: in fixed order one CPU row per (stream, position) pair, each scattered
    // into its device row; in fast order one row per stream, copied as one block.
    let mut cpu = CpuWork::default();
    let row_bytes = cx.hidden * F32_BYTES;
    match rows.order {
        CombineOrder::Fixed => {
            for w in &plan.cpu {
                let mut toks = Vec::with_capacity(w.tokens.len());
                for &(s, rw) in &w.tokens {
                    let j = position(routes, s, w.id.expert, layer)?;
                    let p = cpu.x_streams.len();
                    cpu.x_streams.push(s);
                    toks.push((p as u32, rw * cx.weight_scale));
                    cpu.scatter.push(CopyRegion {
                        src_offset: (p * row_bytes) as u64,
                        dst_offset: (rows.row(s as usize, j) * row_bytes) as u64,
                        bytes: row_bytes as u64,
                    });
                }
                cpu.experts.push(w.id);
                cpu.tokens.push(toks);
            }
        }
        CombineOrder::Fast => {
            if !plan.cpu.is_empty() {
                cpu.x_streams = (0..rows.streams as u32).collect();
                for w in &plan.cpu {
                    cpu.experts.push(w.id);
                    cpu.tokens.push(
                        w.tokens
                            .iter()
                            .map(|&(s, rw)| (s, rw * cx.weight_scale))
                            .collect(),
                    );
                }
                cpu.scatter.push(CopyRegion {
                    src_offset: 0,
                    dst_offset: 0,
                    bytes: (rows.streams * row_bytes) as u64,
                });
            }
        }
    }

    let (hit_tokens, link_tokens, cpu_tokens) = plan.token_counts();
    let counts = LayerCounts {
        hits: plan.hits.len() as u32,
        misses: plan.misses() as u32,
        fetched: plan.link_experts() as u32,
        cpu: plan.cpu.len() as u32,
        gpu_tokens: (hit_tokens + link_tokens) as u32,
        cpu_tokens: cpu_tokens as u32,
        gathered_bytes: moves.len() as u64 * cx.slots.expert_bytes() as u64,
    };
    Ok(LayerWork {
        hits: step(hits),
        fetched: step(fetched),
        moves,
        cpu,
        counts,
    })
}

/// The copies (`src block`, `dst block`, `blocks`) that replicate block 0 into blocks
/// `1..blocks` by doubling (`ceil(log2 blocks)` copies).
pub(crate) fn replicate_rounds(blocks: usize) -> Vec<(usize, usize, usize)> {
    let mut out = Vec::new();
    let mut have = 1;
    while have < blocks {
        let n = have.min(blocks - have);
        out.push((0, have, n));
        have += n;
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::device::fixed_tree_rounds as tree_rounds;

    #[test]
    fn rows_are_unique_per_pair_in_fixed_order() {
        let r = Rows {
            order: CombineOrder::Fixed,
            streams: 3,
            top_k: 4,
        };
        let mut seen = std::collections::HashSet::new();
        for s in 0..3 {
            for j in 0..4 {
                assert!(seen.insert(r.row(s, j)));
                assert!(r.row(s, j) < r.count());
            }
        }
        let f = Rows {
            order: CombineOrder::Fast,
            ..r
        };
        assert_eq!((f.count(), f.row(2, 3)), (3, 2));
    }

    /// Naive reference: sum blocks one by one, in the tree's order, on f64-free integers.
    #[test]
    fn tree_and_replication_cover_every_block_once() {
        for blocks in 1..=17 {
            // Tree: simulate with sets of contributing blocks.
            let mut sets: Vec<Vec<usize>> = (0..blocks).map(|b| vec![b]).collect();
            for (dst, src, n) in tree_rounds(blocks) {
                for i in 0..n {
                    let moved = sets[src + i].clone();
                    sets[dst + i].extend(moved);
                }
            }
            let mut got = sets[0].clone();
            got.sort_unstable();
            assert_eq!(got, (0..blocks).collect::<Vec<_>>(), "tree of {blocks}");
            assert!(tree_rounds(blocks).len() <= (blocks as f64).log2().ceil() as usize);
            // Every source range lies above every destination range of its round.
            for (dst, src, n) in tree_rounds(blocks) {
                assert!(dst + n <= src && src + n <= blocks);
            }
            // Replication: every block filled exactly once, from filled blocks.
            let mut filled = vec![false; blocks];
            filled[0] = true;
            for (src, dst, n) in replicate_rounds(blocks) {
                for i in 0..n {
                    assert!(filled[src + i] && !filled[dst + i]);
                    filled[dst + i] = true;
                }
            }
            assert!(filled.iter().all(|&f| f), "replicate {blocks}");
        }
        assert_eq!(tree_rounds(10).len(), 4);
        assert_eq!(replicate_rounds(10).len(), 4);
    }
}
