//! A small MoE language model computed on the host: the reference backend.
//!
//! It exists so that the server, its scheduler and its self-check can be exercised with a real
//! computation where no GPU (or no engine) is at hand, and so that tests have a slow, exact
//! baseline. The architecture follows the served model's shape: a token embedding, `layers`
//! blocks of (a dense token mixer, a top-k routed SwiGLU expert layer), and an LM head.
//!
//! - **Dense part** (the stand-in for attention): each layer keeps, per stream, an
//!   exponential moving average of its normalised inputs, `s = d s + (1 - d) rms(x)`, and adds
//!   `W_mix s` to the residual. It is causal and makes the output depend on the whole context,
//!   and a chunk of prompt tokens gives exactly the state that pushing them one by one gives.
//! - **Experts**: router logits `W_r rms(x)`, the `top_k` largest (ties to the lower id),
//!   softmax weights over those, `x += sum_e w_e down_e(silu(gate_e n) * up_e n)`.
//!
//! Weights are a pure function of (seed, tensor, index) (splitmix64), uniform in
//! `[-1, 1) / sqrt(fan_in)`. Each layer's routes are planned with
//! [`ft_model::plan::plan_layer`] over an [`ft_model::ExpertCache`] shared by all layers, so
//! the counts it reports (hits, fetched, CPU share) are the engine's; every expert is
//! nevertheless computed here by the same f32 code in the same order, whatever the plan says,
//! so outputs never depend on the strategy or on cache history.

use std::collections::HashMap;
use std::time::Instant;

use ft_model::plan::{fetch_fraction, plan_layer};
use ft_model::{CacheOptions, ExpertCache, MoeGeometry, Strategy, TokenRoute};
use serde::{Deserialize, Serialize};

use super::{
    check_batch, BackendInfo, ExpertCounts, StepBackend, StepOutput, StepStats, StreamId,
    StreamStep,
};
use crate::error::{Result, ServeError};
use crate::tokenizer::VOCAB;

/// Epsilon of the RMS normalisation (keeps an all-zero vector finite).
const RMS_EPS: f32 = 1e-6;

/// Shape, seed and limits of a [`ReferenceMoe`].
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ReferenceConfig {
    /// Model id (`/v1/models`).
    pub name: String,
    /// Residual width, elements.
    pub hidden: usize,
    /// Expert FFN width, elements.
    pub intermediate: usize,
    /// Routed experts per layer.
    pub experts: usize,
    /// Experts per token per layer.
    pub top_k: usize,
    /// MoE layers.
    pub layers: usize,
    /// Seed of every weight.
    pub seed: u64,
    /// Expert cache slots (shared by all layers) for offload, hybrid and cpu.
    pub cache_slots: usize,
    /// The cache's policy, topology and admission.
    #[serde(default)]
    pub cache_options: CacheOptions,
    /// Longest context, tokens.
    pub max_context: usize,
    /// Most streams per step.
    pub max_streams: usize,
    /// Decay `d` of the dense mixer's moving average (0..1).
    pub mixer_decay: f32,
}

impl ReferenceConfig {
    /// The tiny model tests use: 4 layers of 16 experts (top 4) at width 32, a cache of a
    /// quarter of the experts, contexts up to 4096 tokens.
    pub fn tiny(seed: u64) -> Self {
        ReferenceConfig {
            name: "ft-tiny-moe".to_string(),
            hidden: 32,
            intermediate: 32,
            experts: 16,
            top_k: 4,
            layers: 4,
            seed,
            cache_slots: 16,
            cache_options: CacheOptions::default(),
            max_context: 4096,
            max_streams: 64,
            mixer_decay: 0.9,
        }
    }

    /// The routed-expert geometry (no shared experts).
    pub fn geometry(&self) -> MoeGeometry {
        MoeGeometry {
            hidden: self.hidden,
            intermediate: self.intermediate,
            experts: self.experts,
            top_k: self.top_k,
            moe_layers: self.layers,
            shared_experts: 0,
        }
    }

    fn validate(&self) -> Result<()> {
        for (field, v) in [
            ("hidden", self.hidden),
            ("intermediate", self.intermediate),
            ("experts", self.experts),
            ("top_k", self.top_k),
            ("layers", self.layers),
            ("max_context", self.max_context),
            ("max_streams", self.max_streams),
        ] {
            if v == 0 {
                return Err(ServeError::invalid(
                    format!("reference model {field}"),
                    "must be greater than zero",
                ));
            }
        }
        if self.top_k > self.experts {
            return Err(ServeError::invalid(
                "reference model top_k",
                format!("{} is more than the {} experts", self.top_k, self.experts),
            ));
        }
        if !(0.0..1.0).contains(&self.mixer_decay) {
            return Err(ServeError::invalid(
                "reference model mixer_decay",
                format!("{} is outside [0, 1)", self.mixer_decay),
            ));
        }
        Ok(())
    }
}

/// splitmix64: a bijective mixer, the weights' counter-based generator.
fn splitmix64(mut z: u64) -> u64 {
    z = z.wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// `n` weights of tensor `tensor`, uniform in `[-1, 1) / sqrt(fan_in)`.
fn tensor(seed: u64, tensor: u64, n: usize, fan_in: usize) -> Vec<f32> {
    /// 24 bits of mantissa: the uniform's resolution.
    const BITS: u32 = 24;
    let scale = 1.0 / (fan_in as f32).sqrt();
    let base = splitmix64(seed ^ splitmix64(tensor));
    (0..n as u64)
        .map(|i| {
            let r = splitmix64(base ^ i.wrapping_mul(0xD6E8_FEB8_6659_FD93)) >> (64 - BITS);
            ((r as f32 / (1u64 << BITS) as f32) * 2.0 - 1.0) * scale
        })
        .collect()
}

/// `out = W x` for a row-major `rows x cols` matrix.
fn matvec(w: &[f32], x: &[f32], out: &mut [f32]) {
    let cols = x.len();
    for (o, row) in out.iter_mut().zip(w.chunks_exact(cols)) {
        *o = row.iter().zip(x).map(|(a, b)| a * b).sum();
    }
}

fn rms_norm(x: &[f32]) -> Vec<f32> {
    let ms = x.iter().map(|v| v * v).sum::<f32>() / x.len() as f32;
    let k = 1.0 / (ms + RMS_EPS).sqrt();
    x.iter().map(|v| v * k).collect()
}

fn silu(x: f32) -> f32 {
    x / (1.0 + (-x).exp())
}

struct Layer {
    mix: Vec<f32>,
    router: Vec<f32>,
    gate: Vec<f32>,
    up: Vec<f32>,
    down: Vec<f32>,
}

struct StreamState {
    position: usize,
    /// The mixer's moving average, per layer.
    mixer: Vec<Vec<f32>>,
}

/// The reference backend (see the module docs).
pub struct ReferenceMoe {
    cfg: ReferenceConfig,
    geometry: MoeGeometry,
    embed: Vec<f32>,
    layers: Vec<Layer>,
    head: Vec<f32>,
    strategy: Strategy,
    cache: ExpertCache,
    streams: HashMap<StreamId, StreamState>,
}

impl ReferenceMoe {
    /// Build the model (weights from `cfg.seed`) under `strategy` (hybrid with a fixed
    /// fraction).
    pub fn new(cfg: ReferenceConfig, strategy: Strategy) -> Result<Self> {
        cfg.validate()?;
        let geometry = cfg.geometry();
        let (h, i, e) = (cfg.hidden, cfg.intermediate, cfg.experts);
        let s = cfg.seed;
        // Tensor ids: 0 embedding, 1 head, 16 + 8 l + k for layer l's k-th tensor.
        let layers = (0..cfg.layers as u64)
            .map(|l| {
                let id = |k: u64| 16 + 8 * l + k;
                Layer {
                    mix: tensor(s, id(0), h * h, h),
                    router: tensor(s, id(1), e * h, h),
                    gate: tensor(s, id(2), e * i * h, h),
                    up: tensor(s, id(3), e * i * h, h),
                    down: tensor(s, id(4), e * h * i, i),
                }
            })
            .collect();
        let mut model = ReferenceMoe {
            embed: tensor(s, 0, VOCAB * h, 1),
            head: tensor(s, 1, VOCAB * h, h),
            layers,
            cache: Self::cache_for(&cfg, &geometry, &strategy)?,
            strategy,
            geometry,
            cfg,
            streams: HashMap::new(),
        };
        model.set_strategy(strategy)?;
        Ok(model)
    }

    fn cache_for(
        cfg: &ReferenceConfig,
        geometry: &MoeGeometry,
        strategy: &Strategy,
    ) -> Result<ExpertCache> {
        let slots = cfg.cache_slots.min(geometry.total_experts() as usize);
        Ok(cfg
            .cache_options
            .build(strategy.kind(), geometry, slots, None)?)
    }

    /// The configuration.
    pub fn config(&self) -> &ReferenceConfig {
        &self.cfg
    }

    /// Route one normalised row: top-k of the router logits, softmax over them.
    fn route(&self, layer: &Layer, n: &[f32]) -> TokenRoute {
        let mut logits = vec![0.0f32; self.cfg.experts];
        matvec(&layer.router, n, &mut logits);
        let mut order: Vec<u32> = (0..self.cfg.experts as u32).collect();
        order.sort_by(|&a, &b| {
            logits[b as usize]
                .total_cmp(&logits[a as usize])
                .then(a.cmp(&b))
        });
        order.truncate(self.cfg.top_k);
        let max = logits[order[0] as usize];
        let z: Vec<f32> = order
            .iter()
            .map(|&e| (logits[e as usize] - max).exp())
            .collect();
        let sum: f32 = z.iter().sum();
        TokenRoute {
            experts: order,
            weights: z.iter().map(|v| v / sum).collect(),
        }
    }

    /// `y += w * expert_e(n)`.
    /// Bytes of one expert's weights as this model holds them (gate, up and down in f32):
    /// what a fetched expert would move over the link.
    fn expert_bytes(&self) -> u64 {
        self.geometry.expert_params() * std::mem::size_of::<f32>() as u64
    }

    fn expert_into(&self, layer: &Layer, e: usize, w: f32, n: &[f32], y: &mut [f32]) {
        let (h, i) = (self.cfg.hidden, self.cfg.intermediate);
        let mut g = vec![0.0f32; i];
        let mut u = vec![0.0f32; i];
        matvec(&layer.gate[e * i * h..(e + 1) * i * h], n, &mut g);
        matvec(&layer.up[e * i * h..(e + 1) * i * h], n, &mut u);
        let a: Vec<f32> = g.iter().zip(&u).map(|(g, u)| silu(*g) * u).collect();
        let mut d = vec![0.0f32; h];
        matvec(&layer.down[e * h * i..(e + 1) * h * i], &a, &mut d);
        for (y, d) in y.iter_mut().zip(&d) {
            *y += w * d;
        }
    }

    fn check(&self, batch: &[StreamStep<'_>]) -> std::result::Result<(), String> {
        if batch.len() > self.cfg.max_streams {
            return Err(format!(
                "{} streams; the backend holds at most {}",
                batch.len(),
                self.cfg.max_streams
            ));
        }
        check_batch(
            batch,
            |id| self.streams.get(&id).map_or(0, |st| st.position),
            self.cfg.max_context,
            "the context limit is",
        )
    }
}

impl StepBackend for ReferenceMoe {
    fn info(&self) -> BackendInfo {
        BackendInfo {
            name: "reference".to_string(),
            model: self.cfg.name.clone(),
            vocab: VOCAB,
            max_context: self.cfg.max_context,
            max_streams: self.cfg.max_streams,
            device: "host (reference f32, every expert computed on the host)".to_string(),
        }
    }

    fn strategy(&self) -> Strategy {
        self.strategy
    }

    fn set_strategy(&mut self, strategy: Strategy) -> Result<()> {
        fetch_fraction(&strategy).map_err(|e| ServeError::Switch {
            backend: "reference".into(),
            strategy: strategy.to_string(),
            message: e.to_string(),
        })?;
        let was_resident = self.strategy.kind() == ft_model::StrategyKind::Resident;
        let is_resident = strategy.kind() == ft_model::StrategyKind::Resident;
        if was_resident != is_resident {
            self.cache = Self::cache_for(&self.cfg, &self.geometry, &strategy)?;
        }
        self.strategy = strategy;
        Ok(())
    }

    fn step(&mut self, batch: &[StreamStep<'_>]) -> Result<StepOutput> {
        let start = Instant::now();
        self.check(batch).map_err(|message| ServeError::Step {
            step: 0,
            streams: batch.len(),
            backend: "reference".into(),
            message,
        })?;
        let h = self.cfg.hidden;
        let f = fetch_fraction(&self.strategy)?;
        // Rows: every token of every stream, streams in batch order, tokens in order.
        let mut rows: Vec<(usize, Vec<f32>)> = Vec::new();
        for (si, s) in batch.iter().enumerate() {
            for &t in s.tokens {
                let t = t as usize;
                rows.push((si, self.embed[t * h..(t + 1) * h].to_vec()));
            }
        }
        let mut states: Vec<StreamState> = batch
            .iter()
            .map(|s| {
                self.streams.remove(&s.id).unwrap_or_else(|| StreamState {
                    position: 0,
                    mixer: vec![vec![0.0; h]; self.cfg.layers],
                })
            })
            .collect();
        let d = self.cfg.mixer_decay;
        let mut counts = ExpertCounts::default();
        let mut mixed = vec![0.0f32; h];
        for (l, layer) in self.layers.iter().enumerate() {
            // Dense part, row by row (causal within each stream).
            for (si, x) in rows.iter_mut() {
                let n = rms_norm(x);
                let st = &mut states[*si].mixer[l];
                for (s, v) in st.iter_mut().zip(&n) {
                    *s = d * *s + (1.0 - d) * v;
                }
                matvec(&layer.mix, st, &mut mixed);
                for (x, m) in x.iter_mut().zip(&mixed) {
                    *x += m;
                }
            }
            // Experts: route every row, plan the layer, compute.
            let normed: Vec<Vec<f32>> = rows.iter().map(|(_, x)| rms_norm(x)).collect();
            let routes: Vec<TokenRoute> = normed.iter().map(|n| self.route(layer, n)).collect();
            let plan = plan_layer(l, &routes, &mut self.cache, f);
            counts.add(&ExpertCounts {
                hits: plan.hits.len() as u64,
                misses: plan.misses() as u64,
                fetched: plan.link_experts() as u64,
                cpu: plan.cpu.len() as u64,
                gathered_bytes: plan.link_experts() as u64 * self.expert_bytes(),
            });
            for ((_, x), (n, r)) in rows.iter_mut().zip(normed.iter().zip(&routes)) {
                let mut y = vec![0.0f32; h];
                for (&e, &w) in r.experts.iter().zip(&r.weights) {
                    self.expert_into(layer, e as usize, w, n, &mut y);
                }
                for (x, y) in x.iter_mut().zip(&y) {
                    *x += y;
                }
            }
        }
        // Logits after each stream's last row.
        let mut logits = Vec::with_capacity(batch.len());
        let mut row = 0;
        for s in batch {
            row += s.tokens.len();
            let n = rms_norm(&rows[row - 1].1);
            let mut out = vec![0.0f32; VOCAB];
            matvec(&self.head, &n, &mut out);
            logits.push(out);
        }
        for (s, mut st) in batch.iter().zip(states) {
            st.position += s.tokens.len();
            self.streams.insert(s.id, st);
        }
        Ok(StepOutput {
            logits,
            stats: StepStats {
                wall_us: start.elapsed().as_secs_f64() * 1e6,
                streams: batch.len(),
                tokens: rows.len(),
                experts: Some(counts),
                busy: None,
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
    use ft_model::FetchFraction;

    fn hybrid(f: f64) -> Strategy {
        Strategy::Hybrid {
            fetch: FetchFraction::Fixed(f),
        }
    }

    /// Pushing a prompt in one chunk, in pieces, or token by token, alone or beside another
    /// stream, under any strategy, gives bit-identical logits.
    #[test]
    fn outputs_do_not_depend_on_batching_chunking_or_strategy() {
        let prompt: Vec<u32> = b"the quick brown fox".iter().map(|&b| b as u32).collect();
        let other: Vec<u32> = b"jumps over".iter().map(|&b| b as u32).collect();
        let mut a = ReferenceMoe::new(ReferenceConfig::tiny(3), Strategy::Offload).unwrap();
        let whole = a
            .step(&[StreamStep {
                id: 1,
                position: 0,
                tokens: &prompt,
            }])
            .unwrap();
        for strategy in [hybrid(0.3), Strategy::Cpu, Strategy::Resident] {
            let mut b = ReferenceMoe::new(ReferenceConfig::tiny(3), strategy).unwrap();
            let mut last = None;
            for (p, t) in prompt.iter().enumerate() {
                let mut batch = vec![StreamStep {
                    id: 7,
                    position: p,
                    tokens: std::slice::from_ref(t),
                }];
                if p < other.len() {
                    batch.push(StreamStep {
                        id: 8,
                        position: p,
                        tokens: std::slice::from_ref(&other[p]),
                    });
                }
                last = Some(b.step(&batch).unwrap().logits[0].clone());
            }
            assert_eq!(last.unwrap(), whole.logits[0], "{strategy}");
        }
        // A different seed gives different weights.
        let mut c = ReferenceMoe::new(ReferenceConfig::tiny(4), Strategy::Offload).unwrap();
        let other_seed = c
            .step(&[StreamStep {
                id: 1,
                position: 0,
                tokens: &prompt,
            }])
            .unwrap();
        assert_ne!(other_seed.logits[0], whole.logits[0]);
    }

    /// The counts follow the strategy: resident never misses, cpu never fetches, offload
    /// fetches every miss, hybrid a share.
    #[test]
    fn plan_counts_follow_the_strategy() {
        let prompt: Vec<u32> = (0..64u32).map(|i| (i * 37) % 256).collect();
        let mut seen = Vec::new();
        for strategy in [
            Strategy::Offload,
            hybrid(0.5),
            Strategy::Cpu,
            Strategy::Resident,
        ] {
            let mut m = ReferenceMoe::new(ReferenceConfig::tiny(5), strategy).unwrap();
            let out = m
                .step(&[StreamStep {
                    id: 1,
                    position: 0,
                    tokens: &prompt,
                }])
                .unwrap();
            let c = out.stats.experts.unwrap();
            assert_eq!(c.misses, c.fetched + c.cpu);
            match strategy.kind() {
                ft_model::StrategyKind::Resident => assert_eq!(c.misses, 0),
                ft_model::StrategyKind::Cpu => assert_eq!(c.fetched, 0),
                ft_model::StrategyKind::Offload => assert_eq!(c.cpu, 0),
                ft_model::StrategyKind::Hybrid => assert!(c.fetched > 0 && c.cpu > 0),
                ft_model::StrategyKind::LayerSplit | ft_model::StrategyKind::LayerSplitCached => {
                    unreachable!("not among the strategies of this test")
                }
            }
            assert!(c.hits + c.misses > 0);
            seen.push(out.logits[0].clone());
        }
        assert!(seen.windows(2).all(|w| w[0] == w[1]));
    }

    #[test]
    fn bad_steps_are_refused_without_changing_state() {
        let mut m = ReferenceMoe::new(ReferenceConfig::tiny(1), Strategy::Offload).unwrap();
        let t = [65u32];
        let e = m
            .step(&[StreamStep {
                id: 1,
                position: 3,
                tokens: &t,
            }])
            .unwrap_err()
            .to_string();
        assert!(e.contains("position 3"), "{e}");
        let bad = [9999u32];
        assert!(m
            .step(&[StreamStep {
                id: 1,
                position: 0,
                tokens: &bad,
            }])
            .is_err());
        m.step(&[StreamStep {
            id: 1,
            position: 0,
            tokens: &t,
        }])
        .unwrap();
        m.release(1);
        // Released: the stream starts over at 0.
        m.step(&[StreamStep {
            id: 1,
            position: 0,
            tokens: &t,
        }])
        .unwrap();
        let auto = Strategy::Hybrid {
            fetch: FetchFraction::Auto,
        };
        assert!(m.set_strategy(auto).is_err());
        assert!(ReferenceMoe::new(
            ReferenceConfig {
                top_k: 99,
                ..ReferenceConfig::tiny(1)
            },
            Strategy::Offload
        )
        .is_err());
    }
}
