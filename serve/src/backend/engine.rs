//! The runtime's decode engine as a [`StepBackend`]: the served model.
//!
//! The engine runs the MoE layers (dense part, planned experts on the GPU cache / the CPU,
//! combine) for a batch of rows, each an f32 hidden vector with its routing and context
//! length. This adapter adds what makes it a language model over the byte tokenizer:
//!
//! - **Embedding and LM head**: `VOCAB x hidden` f32 matrices, deterministic from the seed
//!   (splitmix64, uniform, scaled to unit RMS rows), computed on the host.
//! - **Stream state**: the engine keeps no per-stream state beyond context lengths, so the
//!   adapter carries one: a row's input is `rms(embed[token] + STATE_MIX * out_prev)`, with
//!   `out_prev` the stream's last output before this step. The output therefore depends on
//!   the whole history, and prefill chunks stay deterministic (every token of a chunk sees
//!   the state before the chunk).
//! - **Routing**: the engine takes each layer's routes up front (it does not read its own
//!   router's output), so the adapter's router is a deterministic function of the content:
//!   for (layer, token, previous token) it draws `top_k` distinct experts from the layer's
//!   popularity under the routing process (`ft_model::routing`, Zipf skew per layer) with a
//!   generator seeded by that triple, and decreasing weights. A stream's routes, and with
//!   them its output, depend only on its own tokens, never on the batch it shares; repeated
//!   tokens reuse experts, as real routers do.
//! - **Batching**: every token of the batch is one engine row; prompt chunks are rows too
//!   (batched prefill). Batches with more rows than the engine holds run as consecutive
//!   engine steps; their instrumentation is summed.

use std::collections::HashMap;
use std::time::Instant;

use ft_model::routing::{RoutingProcess, StepRouting, SyntheticRouting, TokenRoute};
use ft_model::{ModelSpec, Strategy};
use ft_runtime::engine::{BankSource, Engine, EngineConfig, StepInput};
use ft_runtime::Device;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use super::{
    BackendInfo, BusyTimes, ExpertCounts, StepBackend, StepOutput, StepStats, StreamId, StreamStep,
};
use crate::error::{Result, ServeError};
use crate::tokenizer::VOCAB;

/// Weight of the previous output in a row's input (the stream state's share).
pub const STATE_MIX: f32 = 0.5;
/// Mixed into the seed of the embedding ("EMBED" in ASCII).
const EMBED_SALT: u64 = 0x0045_4D42_4544;
/// Mixed into the seed of the LM head ("HEAD" in ASCII).
const HEAD_SALT: u64 = 0x4845_4144;
/// Draws rejected as duplicates before a route falls back to the most popular expert not
/// yet chosen.
const MAX_REJECTIONS: usize = 64;

fn splitmix64(mut z: u64) -> u64 {
    z = z.wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// `rows x cols` uniform values, each row scaled to unit RMS.
fn unit_rows(seed: u64, rows: usize, cols: usize) -> Vec<f32> {
    let mut out = Vec::with_capacity(rows * cols);
    for r in 0..rows {
        let mut z = splitmix64(seed ^ (r as u64).wrapping_mul(0xA24B_AED4_963E_E407));
        let row: Vec<f32> = (0..cols)
            .map(|_| {
                z = splitmix64(z);
                (z >> 40) as f32 / (1u64 << 23) as f32 - 1.0
            })
            .collect();
        out.extend(rms_norm(&row));
    }
    out
}

fn rms_norm(x: &[f32]) -> Vec<f32> {
    /// Keeps an all-zero row finite.
    const EPS: f32 = 1e-6;
    let ms = x.iter().map(|v| v * v).sum::<f32>() / x.len().max(1) as f32;
    let k = 1.0 / (ms + EPS).sqrt();
    x.iter().map(|v| v * k).collect()
}

struct StreamCtx {
    position: usize,
    prev_token: u32,
    prev_out: Vec<f32>,
}

/// See the module docs.
pub struct EngineBackend {
    engine: Engine,
    model: ModelSpec,
    embed: Vec<f32>,
    head: Vec<f32>,
    /// Cumulative popularity per layer, ascending expert id.
    cdf: Vec<Vec<f64>>,
    seed: u64,
    streams: HashMap<StreamId, StreamCtx>,
    steps: u64,
    device: String,
}

impl EngineBackend {
    /// Build the engine for `model` on `device` with `config` (its `seed` seeds the experts,
    /// the embedding and the head), routing popularity from `routing`.
    pub fn new(
        device: &Device,
        model: &ModelSpec,
        config: &EngineConfig,
        routing: &RoutingProcess,
    ) -> Result<Self> {
        Self::with_bank_source(
            device,
            model,
            config,
            routing,
            BankSource::Seed(config.seed),
        )
    }

    /// [`EngineBackend::new`] with the expert weights from `source` (a safetensors
    /// checkpoint or a seed); the embedding and LM head stay synthetic from the seed.
    pub fn with_bank_source(
        device: &Device,
        model: &ModelSpec,
        config: &EngineConfig,
        routing: &RoutingProcess,
        source: BankSource<'_>,
    ) -> Result<Self> {
        let engine = Engine::with_bank_source(device, model, config, None, source)?;
        let g = model.geometry;
        let popularity = SyntheticRouting::new(routing, g)?.popularity();
        let cdf = (0..g.moe_layers)
            .map(|l| {
                let mut acc = 0.0;
                popularity[l * g.experts..(l + 1) * g.experts]
                    .iter()
                    .map(|p| {
                        acc += p;
                        acc
                    })
                    .collect()
            })
            .collect();
        let seed = config.seed;
        Ok(EngineBackend {
            embed: unit_rows(seed ^ EMBED_SALT, VOCAB, g.hidden),
            head: unit_rows(seed ^ HEAD_SALT, VOCAB, g.hidden),
            cdf,
            seed,
            engine,
            model: model.clone(),
            streams: HashMap::new(),
            steps: 0,
            device: format!("{} ({})", device.kind().name(), device.info().name),
        })
    }

    /// The engine.
    pub fn engine(&self) -> &Engine {
        &self.engine
    }

    /// The route of a token at a layer (module docs).
    fn route(&self, layer: usize, token: u32, prev: u32) -> TokenRoute {
        let g = &self.model.geometry;
        let cdf = &self.cdf[layer];
        let mut rng = StdRng::seed_from_u64(splitmix64(
            self.seed ^ ((layer as u64) << 40) ^ ((token as u64) << 20) ^ prev as u64,
        ));
        let total = *cdf.last().unwrap_or(&1.0);
        let mut experts: Vec<u32> = Vec::with_capacity(g.top_k);
        let mut rejections = 0;
        while experts.len() < g.top_k {
            let u: f64 = rng.random::<f64>() * total;
            let e = cdf.partition_point(|&c| c <= u).min(g.experts - 1) as u32;
            if !experts.contains(&e) {
                experts.push(e);
            } else {
                rejections += 1;
                if rejections > MAX_REJECTIONS {
                    let e = (0..g.experts as u32)
                        .filter(|e| !experts.contains(e))
                        .max_by(|&a, &b| {
                            let p = |e: u32| {
                                cdf[e as usize] - if e == 0 { 0.0 } else { cdf[e as usize - 1] }
                            };
                            p(a).total_cmp(&p(b)).then(b.cmp(&a))
                        })
                        .expect("top_k <= experts");
                    experts.push(e);
                }
            }
        }
        let mut w: Vec<f32> = (0..g.top_k)
            .map(|_| rng.random::<f32>() + f32::EPSILON)
            .collect();
        w.sort_by(|a, b| b.total_cmp(a));
        let sum: f32 = w.iter().sum();
        TokenRoute {
            experts,
            weights: w.iter().map(|x| x / sum).collect(),
        }
    }

    fn check(&self, batch: &[StreamStep<'_>]) -> std::result::Result<(), String> {
        let max_context = self.engine.config().max_context;
        let mut seen = std::collections::HashSet::new();
        for s in batch {
            if !seen.insert(s.id) {
                return Err(format!("stream {} appears twice", s.id));
            }
            if s.tokens.is_empty() {
                return Err(format!("stream {} pushes no token", s.id));
            }
            if let Some(t) = s.tokens.iter().find(|&&t| t as usize >= VOCAB) {
                return Err(format!("stream {}: token {t} is not below {VOCAB}", s.id));
            }
            let have = self.streams.get(&s.id).map_or(0, |c| c.position);
            if s.position != have {
                return Err(format!(
                    "stream {} pushes at position {} but holds {have} tokens",
                    s.id, s.position
                ));
            }
            if s.position + s.tokens.len() > max_context {
                return Err(format!(
                    "stream {} would reach {} tokens; the engine holds KV for {max_context}",
                    s.id,
                    s.position + s.tokens.len()
                ));
            }
        }
        Ok(())
    }
}

impl StepBackend for EngineBackend {
    fn info(&self) -> BackendInfo {
        BackendInfo {
            name: "engine".into(),
            model: self.model.name.clone(),
            vocab: VOCAB,
            max_context: self.engine.config().max_context,
            max_streams: self.engine.config().max_streams,
            device: self.device.clone(),
        }
    }

    fn strategy(&self) -> Strategy {
        self.engine.strategy()
    }

    fn set_strategy(&mut self, strategy: Strategy) -> Result<()> {
        self.engine
            .set_strategy(strategy)
            .map_err(|e| ServeError::Switch {
                backend: "engine".into(),
                strategy: strategy.to_string(),
                message: e.to_string(),
            })
    }

    fn step(&mut self, batch: &[StreamStep<'_>]) -> Result<StepOutput> {
        let start = Instant::now();
        self.check(batch).map_err(|message| ServeError::Step {
            step: self.steps,
            streams: batch.len(),
            backend: "engine".into(),
            message,
        })?;
        let h = self.model.geometry.hidden;
        let layers = self.model.geometry.moe_layers;
        // Rows: (input vector, context, route per layer), streams in order.
        let mut inputs: Vec<Vec<f32>> = Vec::new();
        let mut contexts: Vec<usize> = Vec::new();
        let mut routes: Vec<Vec<TokenRoute>> = vec![Vec::new(); layers];
        for s in batch {
            let ctx = self.streams.get(&s.id);
            let mut prev = ctx.map_or(crate::tokenizer::BOS, |c| c.prev_token);
            for (j, &t) in s.tokens.iter().enumerate() {
                let e = &self.embed[t as usize * h..(t as usize + 1) * h];
                let x: Vec<f32> = match ctx {
                    Some(c) => e
                        .iter()
                        .zip(&c.prev_out)
                        .map(|(a, b)| a + STATE_MIX * b)
                        .collect(),
                    None => e.to_vec(),
                };
                inputs.push(rms_norm(&x));
                contexts.push(s.position + j + 1);
                for (l, r) in routes.iter_mut().enumerate() {
                    r.push(self.route(l, t, prev));
                }
                prev = t;
            }
        }
        let max_rows = self.engine.config().max_streams.max(1);
        let mut outputs: Vec<Vec<f32>> = Vec::with_capacity(inputs.len());
        let mut counts = ExpertCounts::default();
        let mut busy = BusyTimes::default();
        for start_row in (0..inputs.len()).step_by(max_rows) {
            let end = (start_row + max_rows).min(inputs.len());
            let routing = StepRouting {
                step: self.steps,
                layers: routes.iter().map(|r| r[start_row..end].to_vec()).collect(),
            };
            let res = self.engine.step(&StepInput {
                routing: &routing,
                contexts: &contexts[start_row..end],
                inputs: &inputs[start_row..end],
                warmup: false,
            })?;
            self.steps += 1;
            let t = res.record.totals;
            counts.add(&ExpertCounts {
                hits: t.hits as u64,
                misses: t.misses as u64,
                fetched: t.fetched as u64,
                cpu: t.cpu as u64,
            });
            busy.gpu_us += res.record.gpu_busy_us;
            busy.pcie_us += res.record.pcie_busy_us;
            busy.cpu_us += res.record.cpu_busy_us;
            outputs.extend(res.outputs);
        }
        let mut logits = Vec::with_capacity(batch.len());
        let mut row = 0;
        for s in batch {
            row += s.tokens.len();
            let out = &outputs[row - 1];
            let n = rms_norm(out);
            let l: Vec<f32> = self
                .head
                .chunks_exact(h)
                .map(|w| w.iter().zip(&n).map(|(a, b)| a * b).sum())
                .collect();
            logits.push(l);
            let c = self.streams.entry(s.id).or_insert_with(|| StreamCtx {
                position: 0,
                prev_token: crate::tokenizer::BOS,
                prev_out: vec![0.0; h],
            });
            c.position += s.tokens.len();
            c.prev_token = *s.tokens.last().expect("checked non-empty");
            c.prev_out = out.clone();
        }
        Ok(StepOutput {
            logits,
            stats: StepStats {
                wall_us: start.elapsed().as_secs_f64() * 1e6,
                streams: batch.len(),
                tokens: inputs.len(),
                experts: Some(counts),
                busy: Some(busy),
            },
        })
    }

    fn release(&mut self, id: StreamId) {
        self.streams.remove(&id);
    }
}
