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
//!   each stream keeps a [`StreamState`] of the routing process (`ft_model::routing`, the
//!   same code the simulator and `ft run` route with: Zipf popularity per layer, reuse of
//!   the stream's recent experts, the layer map), and before each token its generator is
//!   reseeded from a hash of the stream's whole history and the token. A stream's routes,
//!   and with them its output, depend only on its own tokens, never on the batch it shares;
//!   and they follow the process the performance model predicts with. (Routing by the last
//!   two tokens alone, as an earlier version did, made a temperature-0 stream that falls
//!   into a short token cycle reuse a handful of experts forever: no misses at all.)
//! - **Batching**: every token of the batch is one engine row; prompt chunks are rows too
//!   (batched prefill). Batches with more rows than the engine holds run as consecutive
//!   engine steps; their instrumentation is summed.

use std::collections::HashMap;
use std::time::Instant;

use ft_model::profile::CpuCheck;
use ft_model::routing::{RoutingProcess, StepRouting, StreamState, SyntheticRouting, TokenRoute};
use ft_model::{ModelSpec, Strategy};
use ft_runtime::engine::{BankSource, Engine, EngineConfig, StepInput};
use ft_runtime::Device;

use super::{
    check_batch, BackendInfo, BusyTimes, ExpertCounts, StepBackend, StepOutput, StepStats,
    StreamId, StreamStep,
};
use crate::error::{Result, ServeError};
use crate::tokenizer::VOCAB;

/// Weight of the previous output in a row's input (the stream state's share).
pub const STATE_MIX: f32 = 0.5;
/// Mixed into the seed of the embedding ("EMBED" in ASCII).
const EMBED_SALT: u64 = 0x0045_4D42_4544;
/// Mixed into the seed of the LM head ("HEAD" in ASCII).
const HEAD_SALT: u64 = 0x4845_4144;
/// History hash of a stream before its first token.
const HISTORY_START: u64 = 0x5EED_0FF7_0000_0001;

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
    /// Hash of every token the stream has pushed (seeds its routes).
    history: u64,
    /// The stream's routing-process state (its recent experts).
    router: StreamState,
    prev_out: Vec<f32>,
}

/// See the module docs.
pub struct EngineBackend {
    engine: Engine,
    model: ModelSpec,
    embed: Vec<f32>,
    head: Vec<f32>,
    /// The routing process every stream's routes are drawn from.
    routing: SyntheticRouting,
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
        let routing = SyntheticRouting::new(routing, g)?;
        let seed = config.seed;
        Ok(EngineBackend {
            embed: unit_rows(seed ^ EMBED_SALT, VOCAB, g.hidden),
            head: unit_rows(seed ^ HEAD_SALT, VOCAB, g.hidden),
            routing,
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

    /// Time the CPU check on the engine ([`Engine::cpu_check`]): `ft serve` sets it against
    /// the profile's at start, to predict the CPU side at the machine's speed now.
    pub fn cpu_check(&mut self, budget: std::time::Duration) -> ft_runtime::Result<CpuCheck> {
        self.engine.cpu_check(budget, 0)
    }

    fn check(&self, batch: &[StreamStep<'_>]) -> std::result::Result<(), String> {
        check_batch(
            batch,
            |id| self.streams.get(&id).map_or(0, |c| c.position),
            self.engine.config().max_context,
            "the engine holds KV for",
        )
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
        // Each stream's history hash and routing state after this step's tokens.
        let mut advanced: Vec<(u64, StreamState)> = Vec::with_capacity(batch.len());
        for s in batch {
            let ctx = self.streams.get(&s.id);
            let (mut history, mut router) = match ctx {
                Some(c) => (c.history, c.router.clone()),
                None => (HISTORY_START, StreamState::new(0)),
            };
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
                router.reseed(splitmix64(self.seed ^ splitmix64(history ^ t as u64)));
                for (r, route) in routes.iter_mut().zip(self.routing.route_token(&mut router)) {
                    r.push(route);
                }
                history = splitmix64(history ^ (t as u64 + 1));
            }
            advanced.push((history, router));
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
                gathered_bytes: t.gathered_bytes,
            });
            busy.gpu_us += res.record.gpu_busy_us;
            busy.pcie_us += res.record.pcie_busy_us;
            busy.cpu_us += res.record.cpu_busy_us;
            outputs.extend(res.outputs);
        }
        let mut logits = Vec::with_capacity(batch.len());
        let mut row = 0;
        for (s, (history, router)) in batch.iter().zip(advanced) {
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
                history: HISTORY_START,
                router: StreamState::new(0),
                prev_out: vec![0.0; h],
            });
            c.position += s.tokens.len();
            c.history = history;
            c.router = router;
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

#[cfg(test)]
mod tests {
    use super::*;
    use ft_model::{DenseSpec, ExpertFormat, MoeGeometry};
    use ft_runtime::device::HostDeviceConfig;

    fn backend(cache_slots: usize) -> EngineBackend {
        let model = ModelSpec {
            name: "small".into(),
            format: ExpertFormat::Nvfp4,
            geometry: MoeGeometry {
                hidden: 64,
                intermediate: 32,
                experts: 32,
                top_k: 4,
                moe_layers: 2,
                shared_experts: 0,
            },
            dense: Some(DenseSpec {
                weight_bytes_per_layer: 4 << 10,
                kv_bytes_per_token: 16,
            }),
        };
        let device = Device::host(HostDeviceConfig {
            memory_bytes: 64 << 20,
            kernel_threads: 1,
            ..Default::default()
        })
        .unwrap();
        let config = EngineConfig {
            strategy: Strategy::Offload,
            cache_slots,
            max_streams: 2,
            max_context: 256,
            threads: 1,
            seed: 5,
            reserve_bytes: 0,
            ..EngineConfig::default()
        };
        let routing = RoutingProcess::preset("typical").unwrap();
        EngineBackend::new(&device, &model, &config, &routing).unwrap()
    }

    /// Push `tokens` one by one on stream 1 from context position `start` (alone, or beside
    /// a second stream pushing `other`), returning the steps' misses and stream 1's logits.
    fn decode(
        b: &mut EngineBackend,
        start: usize,
        tokens: &[u32],
        other: Option<&[u32]>,
    ) -> (u64, Vec<Vec<f32>>) {
        let (mut misses, mut logits) = (0, Vec::new());
        for (i, t) in tokens.iter().enumerate() {
            let mut batch = vec![StreamStep {
                id: 1,
                position: start + i,
                tokens: std::slice::from_ref(t),
            }];
            if let Some(o) = other {
                batch.push(StreamStep {
                    id: 2,
                    position: start + i,
                    tokens: std::slice::from_ref(&o[i]),
                });
            }
            let out = b.step(&batch).unwrap();
            misses += out.stats.experts.unwrap().misses;
            logits.push(out.logits[0].clone());
        }
        (misses, logits)
    }

    #[test]
    fn a_stream_stuck_on_one_token_still_misses() {
        // A temperature-0 stream that repeats one token: routes follow the process (the
        // history changes every token), so a cache of a quarter of the experts keeps
        // missing, as the model predicts; by the last two tokens alone it would not.
        let mut b = backend(16);
        let tokens = vec![b'a' as u32; 96];
        decode(&mut b, 0, &tokens[..32], None);
        let (misses, _) = decode(&mut b, 32, &tokens[32..], None);
        let lookups = 64 * 2 * 4;
        let rate = misses as f64 / lookups as f64;
        assert!(rate > 0.2, "miss rate {rate} over the repeated token");
    }

    #[test]
    fn routes_depend_on_the_stream_alone() {
        let tokens: Vec<u32> = (0..24).map(|i| (i * 7 % 50) as u32 + 40).collect();
        let other: Vec<u32> = (0..24).map(|i| (i * 3 % 40) as u32 + 60).collect();
        let (_, alone) = decode(&mut backend(64), 0, &tokens, None);
        let (_, shared) = decode(&mut backend(64), 0, &tokens, Some(&other));
        assert_eq!(alone, shared);
    }
}
