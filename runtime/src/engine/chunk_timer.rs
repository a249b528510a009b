//! What the engine's timed fetch chunks are timed by ([`FetchChunking::Timed`],
//! [`ft_model::plan::fetch_chunk_bounds_timed`]): the expert kernels' launch, their time per
//! expert and per further token of an expert, and one expert's copy, measured once on the
//! engine's own streams, slots and bank when it starts (three shapes of launch, a dozen
//! queued launches each, and one gather).
//!
//! Why measured and not taken from a profile: the chunk rule weighs a kernel against the
//! copies it runs beside, on this device with this engine's launch path (staged tiles,
//! dependent launch, copy batches), and a run needs no profile. Timed chunks are off by
//! default (no gain beyond the noise yet, `experiments/runtime-grid`, "Timed fetch
//! chunks"), and the model times a layer's fetched kernels in the halving chunks; where
//! timed chunks become the default, the model's must follow through the same rule.

use ft_kernels::stream::warm_median;
use ft_model::plan::ChunkCosts;

use crate::bank::HostBank;
use crate::device::{Device, DeviceBuffer, Stream};
use crate::error::Result;
use crate::gather::{self, GatherMethod};
use crate::gpu_experts::{ExpertStep, ExpertTask, TokenWeight};
use crate::slots::SlotPool;
use ft_model::cache::SlotId;
use ft_model::ExpertId;

/// How a layer's fetched experts are cut into chunks.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum FetchChunking {
    /// From the last chunk, 1, 2, 4 ... experts ([`ft_model::plan::fetch_chunk_bounds`]).
    #[default]
    Halving,
    /// As large as each chunk's kernels allow beside the next chunk's copies, timed on the
    /// device when the engine starts ([`ChunkTimer`]).
    Timed,
}

impl FetchChunking {
    /// Name on the command line and in JSON.
    pub fn name(self) -> &'static str {
        match self {
            FetchChunking::Halving => "halving",
            FetchChunking::Timed => "timed",
        }
    }
}

impl std::str::FromStr for FetchChunking {
    type Err = crate::error::RuntimeError;

    fn from_str(s: &str) -> Result<Self> {
        match s.trim() {
            "halving" => Ok(FetchChunking::Halving),
            "timed" => Ok(FetchChunking::Timed),
            other => Err(crate::error::RuntimeError::invalid(
                "--fetch-chunking",
                format!("'{other}' is not halving or timed"),
            )),
        }
    }
}

/// Measured costs of the expert kernels and of one expert's copy (module docs), us.
#[derive(Debug, Clone, Copy, PartialEq, serde::Serialize, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ChunkTimer {
    /// A launch of the expert kernels beyond its experts' and pairs' time.
    pub launch_us: f64,
    /// Each expert at one token, beyond the launch.
    pub expert_us: f64,
    /// Each further token of an expert.
    pub pair_us: f64,
    /// One expert's copy over the link, in a batch of several.
    pub copy_us: f64,
}

/// Experts and tokens per expert of the measured launches (fewer where the slots or the
/// input rows are fewer).
const MEASURE_EXPERTS: usize = 8;
const MEASURE_TOKENS: usize = 8;
/// Launches per queued batch, and batches (the median is kept).
const BATCH: usize = 4;
const ROUNDS: usize = 3;
/// The hold queued before each batch, us (long enough for the host to queue the batch).
const HOLD_US: f64 = 300.0;

/// What [`ChunkTimer::measure`] times with: the engine's streams, bank, slots (empty when
/// the engine starts, so overwriting them is harmless) and its input and output rows.
pub(crate) struct MeasureOn<'a> {
    pub device: &'a Device,
    pub compute: &'a Stream,
    pub copy: &'a Stream,
    pub bank: &'a HostBank,
    pub slots: &'a SlotPool,
    pub template: &'a ExpertStep,
    /// Input rows, `rows x hidden` f32, and an output buffer of as many.
    pub x: &'a DeviceBuffer,
    pub y: &'a DeviceBuffer,
    pub rows: usize,
}

impl ChunkTimer {
    /// Time the expert kernels and a gather (module docs). `None` where the engine has
    /// fewer than two slots or input rows (nothing to fit a time per expert or per pair
    /// from: the halving chunks then).
    pub(crate) fn measure(on: &MeasureOn<'_>) -> Result<Option<ChunkTimer>> {
        let g = &on.bank.layout().geometry;
        let experts = MEASURE_EXPERTS.min(on.slots.count()).min(g.experts);
        let tokens = MEASURE_TOKENS.min(on.rows);
        if experts < 2 || tokens < 2 {
            return Ok(None);
        }
        // The experts into the first slots (their bytes, so the kernels read real weights).
        let moves: Vec<_> = (0..experts)
            .map(|e| (ExpertId::new(0, e), SlotId(e as u32)))
            .collect();
        let (a, b) = (on.device.new_event(true)?, on.device.new_event(true)?);
        let copy_us = warm_median(ROUNDS, |_| {
            on.copy.hold_us(HOLD_US)?;
            on.copy.time_us(&a, &b, || {
                gather::gather(on.copy, on.bank, on.slots, &moves, GatherMethod::CopyEngine)
            })
        })? / experts as f64;
        let step = |n: usize, t: usize| {
            let mut s = on.template.clone();
            s.tokens = t;
            s.experts = (0..n)
                .map(|e| ExpertTask {
                    weights_offset: e * on.slots.stride(),
                    tokens: (0..t)
                        .map(|token| TokenWeight {
                            token: token as u32,
                            weight: 0.5,
                        })
                        .collect(),
                })
                .collect();
            s
        };
        let time = |s: &ExpertStep| -> Result<f64> {
            let us = warm_median(ROUNDS, |_| {
                on.compute.hold_us(HOLD_US)?;
                on.compute.time_us(&a, &b, || {
                    (0..BATCH).try_for_each(|_| {
                        on.compute.launch_experts(s, on.slots.buffer(), on.x, on.y)
                    })
                })
            })?;
            Ok(us / BATCH as f64)
        };
        let one = time(&step(1, 1))?;
        let many = time(&step(experts, 1))?;
        let paired = time(&step(experts, tokens))?;
        let expert_us = ((many - one) / (experts - 1) as f64).max(0.0);
        let pair_us = ((paired - many) / (experts * (tokens - 1)) as f64).max(0.0);
        Ok(Some(ChunkTimer {
            launch_us: (one - expert_us).max(0.0),
            expert_us,
            pair_us,
            copy_us,
        }))
    }

    /// The chunk rule's costs for a layer's fetched `step`, each expert at the tokens of
    /// its busiest: a launch's kernels are instantiated for its largest task's tokens and
    /// every expert of it runs that instantiation (on the H100 machine, 2026-12-06T01:19Z,
    /// costs at the mean tokens let a chunk of 18 experts at eight streams outlast the last
    /// chunk's copy by 15 us).
    pub fn costs(&self, step: &ExpertStep) -> ChunkCosts {
        let busiest = step
            .experts
            .iter()
            .map(|e| e.tokens.len())
            .max()
            .unwrap_or(1);
        let extra_pairs = busiest.saturating_sub(1) as f64;
        ChunkCosts {
            copy_us: self.copy_us,
            launch_us: self.launch_us,
            kernel_us: self.expert_us + extra_pairs * self.pair_us,
        }
    }
}
