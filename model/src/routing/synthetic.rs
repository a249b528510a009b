//! A seeded synthetic routing process with popularity skew, token reuse and layer correlation.
//!
//! Real routers are neither uniform nor independent: a few experts per layer are popular, a
//! token often picks experts its predecessor picked at the same layer, and the choice at layer
//! `l` predicts the choice at `l + 1`. The cache's miss rate depends on all three, so the
//! process has one knob per mechanism (see [`RoutingProcess`]) and named presets calibrated to
//! published LRU hit rates (`docs/routing.md`).
//!
//! Generation of one route (stream `s`, layer `l`), slot by slot (`j` = 0..top_k):
//! 1. with probability `reuse(l)`, take the expert that a recent token of stream `s` had in
//!    slot `j` at layer `l`: the previous token when `reuse_window` is 1 (the default), else a
//!    token drawn uniformly from the stream's last `reuse_window` tokens;
//! 2. else, with probability `layer_correlation`, take the image of this token's slot-`j`
//!    expert at layer `l - 1` under the layer's rank-preserving map (the expert of popularity
//!    rank `r` at `l - 1` maps to the expert of rank `r` at `l`, so following it keeps the
//!    popularity marginal);
//! 3. else (or when the candidate is already in the route, or there is no history) draw from
//!    layer `l`'s popularity: a Zipf law of exponent `zipf(l)` over a per-layer random
//!    permutation of the experts (rejection of duplicates; after [`MAX_REJECTIONS`] draws, the
//!    most popular expert not yet chosen).
//!
//! Router weights are a Dirichlet(`weight_concentration`) draw sorted in decreasing order, so
//! slot 0 holds the largest weight as a real top-k router's output does.
//!
//! Every stream has its own random number generator, seeded from the process seed, the stream
//! index and how many times that stream index has (re)joined: stream `i`'s routing does not
//! depend on how many other streams run beside it.

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use rand_distr::{Distribution, Gamma};
use serde::{Deserialize, Serialize};
use std::path::Path;

use super::{presets, RoutingSource, StepRouting, TokenRoute};
use crate::error::{ModelError, Result};
use crate::geometry::MoeGeometry;

/// Popularity draws rejected as duplicates before falling back to a deterministic pick (the
/// fallback only matters when `top_k` is close to `experts` under strong skew).
pub const MAX_REJECTIONS: usize = 64;

/// Parameters of the synthetic routing process. Every field has a default (the `typical`
/// preset); unknown fields are refused.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct RoutingProcess {
    /// Seed of every random choice of the process (permutations, streams).
    pub seed: u64,
    /// Zipf exponent of expert popularity in interior layers (0 = uniform; probability of
    /// the expert of rank `r` (from 0) is proportional to `(r + 1)^-zipf`).
    pub zipf: f64,
    /// Zipf exponent in the edge layers (the first and last `edge_layers` layers).
    pub edge_zipf: f64,
    /// Number of layers at each end of the stack that use the `edge_*` parameters.
    pub edge_layers: usize,
    /// Probability (0 to 1) that a slot repeats the previous token's expert of that slot at
    /// the same layer, in interior layers.
    pub reuse: f64,
    /// The same probability in the edge layers.
    pub edge_reuse: f64,
    /// How many of the stream's most recent tokens a reused slot may copy from (>= 1; 1 =
    /// only the previous token). Larger windows spread reuse distances out, which is what
    /// lets a larger LRU cache keep gaining hits.
    pub reuse_window: usize,
    /// Probability (0 to 1) that a slot not reused follows the layer map from this token's
    /// expert of the same slot at the previous layer (not applied at layer 0).
    pub layer_correlation: f64,
    /// Dirichlet concentration of the router weights (> 0; 1 is uniform on the simplex,
    /// smaller values concentrate weight on the first slot).
    pub weight_concentration: f64,
}

impl Default for RoutingProcess {
    fn default() -> Self {
        presets::typical()
    }
}

impl RoutingProcess {
    /// A named preset (see [`super::PRESET_NAMES`]).
    pub fn preset(name: &str) -> Result<Self> {
        presets::by_name(name)
    }

    /// Parse a TOML document holding a process; `origin` names it in errors.
    pub fn from_toml_str(text: &str, origin: &str) -> Result<Self> {
        crate::error::parse_toml(text, origin, Self::validate)
    }

    /// Load a process from a TOML file.
    pub fn from_toml_file(path: &Path) -> Result<Self> {
        let text = crate::error::read_text(path)?;
        Self::from_toml_str(&text, &path.display().to_string())
    }

    /// The same process with another seed.
    pub fn with_seed(&self, seed: u64) -> Self {
        RoutingProcess {
            seed,
            ..self.clone()
        }
    }

    /// Check every field's range; errors name the field.
    pub fn validate(&self) -> Result<()> {
        for (field, v) in [
            ("routing.zipf", self.zipf),
            ("routing.edge_zipf", self.edge_zipf),
        ] {
            if !(v.is_finite() && v >= 0.0) {
                return Err(ModelError::invalid(
                    field,
                    format!("{v} is not a finite number >= 0"),
                ));
            }
        }
        for (field, v) in [
            ("routing.reuse", self.reuse),
            ("routing.edge_reuse", self.edge_reuse),
            ("routing.layer_correlation", self.layer_correlation),
        ] {
            if !(0.0..=1.0).contains(&v) {
                return Err(ModelError::invalid(field, format!("{v} is outside [0, 1]")));
            }
        }
        if self.reuse_window == 0 {
            return Err(ModelError::invalid(
                "routing.reuse_window",
                "must be at least 1 (the previous token)",
            ));
        }
        if !(self.weight_concentration.is_finite() && self.weight_concentration > 0.0) {
            return Err(ModelError::invalid(
                "routing.weight_concentration",
                format!("{} is not a finite number > 0", self.weight_concentration),
            ));
        }
        Ok(())
    }

    /// True when layer `layer` of a `layers`-layer stack takes the edge parameters.
    pub fn is_edge_layer(&self, layer: usize, layers: usize) -> bool {
        layer < self.edge_layers || layer + self.edge_layers >= layers
    }

    /// Zipf exponent at a layer.
    pub fn zipf_at(&self, layer: usize, layers: usize) -> f64 {
        if self.is_edge_layer(layer, layers) {
            self.edge_zipf
        } else {
            self.zipf
        }
    }

    /// Reuse probability at a layer.
    pub fn reuse_at(&self, layer: usize, layers: usize) -> f64 {
        if self.is_edge_layer(layer, layers) {
            self.edge_reuse
        } else {
            self.reuse
        }
    }
}

/// Mix two 64-bit values into a well-spread seed (splitmix64 finaliser).
fn mix_seed(a: u64, b: u64) -> u64 {
    let mut z = a ^ b.wrapping_mul(0x9E37_79B9_7F4A_7C15);
    z = z.wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// Salt of the seed that draws the per-layer permutations (distinct from any stream's).
const PERMUTATION_SALT: u64 = 0x5045_524D; // "PERM"

/// Per-layer tables derived from the process and the geometry.
#[derive(Debug, Clone)]
struct LayerTable {
    /// Cumulative popularity over ranks (last entry 1.0).
    cdf: Vec<f64>,
    /// Expert of each popularity rank.
    by_rank: Vec<u32>,
    /// Popularity rank of each expert.
    rank_of: Vec<u32>,
    /// Reuse probability at this layer.
    reuse: f64,
}

/// History of one stream: its generator and the experts of its last `reuse_window` tokens.
/// The source keeps one per stream index; a caller that routes streams itself (the served
/// model's router) keeps its own and routes with [`SyntheticRouting::route_token`].
#[derive(Debug, Clone)]
pub struct StreamState {
    rng: StdRng,
    /// The last `reuse_window` tokens' experts, a ring of `[token][layer * top_k + slot]`.
    history: Vec<Vec<u32>>,
    /// Ring position of the next token to write.
    next: usize,
}

impl StreamState {
    /// A fresh stream whose generator starts from `seed`.
    pub fn new(seed: u64) -> Self {
        StreamState {
            rng: StdRng::seed_from_u64(seed),
            history: Vec::new(),
            next: 0,
        }
    }

    /// Restart the generator from `seed`, keeping the reuse history (a router whose draws
    /// are a function of content reseeds before each token).
    pub fn reseed(&mut self, seed: u64) {
        self.rng = StdRng::seed_from_u64(seed);
    }
}

/// The synthetic process running on a geometry: a [`RoutingSource`].
#[derive(Debug, Clone)]
pub struct SyntheticRouting {
    process: RoutingProcess,
    geometry: MoeGeometry,
    layers: Vec<LayerTable>,
    weight_gamma: Gamma<f64>,
    streams: Vec<StreamState>,
    /// How many times each stream index has joined (seeds its generator).
    joins: Vec<u64>,
    step: u64,
}

impl SyntheticRouting {
    /// Build the process on a geometry (validates both).
    pub fn new(process: &RoutingProcess, geometry: MoeGeometry) -> Result<Self> {
        process.validate()?;
        if geometry.experts == 0 || geometry.top_k == 0 || geometry.moe_layers == 0 {
            return Err(ModelError::invalid(
                "geometry",
                "experts, top_k and moe_layers must be greater than zero",
            ));
        }
        if geometry.top_k > geometry.experts {
            return Err(ModelError::invalid(
                "geometry.top_k",
                format!(
                    "{} is more than the {} routed experts",
                    geometry.top_k, geometry.experts
                ),
            ));
        }
        let mut rng = StdRng::seed_from_u64(mix_seed(process.seed, PERMUTATION_SALT));
        let n = geometry.experts;
        let layers = (0..geometry.moe_layers)
            .map(|l| {
                let mut by_rank: Vec<u32> = (0..n as u32).collect();
                // Fisher-Yates with the process generator (explicit so it is stable).
                for i in (1..n).rev() {
                    let j = rng.random_range(0..=i);
                    by_rank.swap(i, j);
                }
                let mut rank_of = vec![0u32; n];
                for (r, &e) in by_rank.iter().enumerate() {
                    rank_of[e as usize] = r as u32;
                }
                let s = process.zipf_at(l, geometry.moe_layers);
                let mut cdf: Vec<f64> = (0..n).map(|r| ((r + 1) as f64).powf(-s)).collect();
                let mut acc = 0.0;
                for p in cdf.iter_mut() {
                    acc += *p;
                    *p = acc;
                }
                for p in cdf.iter_mut() {
                    *p /= acc;
                }
                *cdf.last_mut().expect("experts > 0") = 1.0;
                LayerTable {
                    cdf,
                    by_rank,
                    rank_of,
                    reuse: process.reuse_at(l, geometry.moe_layers),
                }
            })
            .collect();
        let weight_gamma = Gamma::new(process.weight_concentration, 1.0)
            .map_err(|e| ModelError::invalid("routing.weight_concentration", e.to_string()))?;
        Ok(SyntheticRouting {
            process: process.clone(),
            geometry,
            layers,
            weight_gamma,
            streams: Vec::new(),
            joins: Vec::new(),
            step: 0,
        })
    }

    /// The process this source runs.
    pub fn process(&self) -> &RoutingProcess {
        &self.process
    }

    /// Base popularity of every expert, indexed by [`crate::ExpertId::flat`]: the Zipf law of
    /// its layer (probabilities sum to 1 per layer). The process's stationary marginal is
    /// close to it (reuse and the rank-preserving layer map keep it; duplicate rejection
    /// flattens it slightly). Used to choose a static hot set without a warm-up.
    pub fn popularity(&self) -> Vec<f64> {
        let n = self.geometry.experts;
        let mut out = vec![0.0; n * self.geometry.moe_layers];
        for (l, t) in self.layers.iter().enumerate() {
            let mut prev = 0.0;
            for (r, &c) in t.cdf.iter().enumerate() {
                out[l * n + t.by_rank[r] as usize] = c - prev;
                prev = c;
            }
        }
        out
    }

    /// The routes of one token of the stream `state`, one per layer: the process's draw
    /// (reuse of the stream's recent experts, the layer map, Zipf popularity), advancing
    /// the stream's generator and history exactly as [`RoutingSource::next_step`] does for
    /// each of its own streams.
    pub fn route_token(&self, state: &mut StreamState) -> Vec<TokenRoute> {
        let (k, layers) = (self.geometry.top_k, self.geometry.moe_layers);
        let mut routes = vec![TokenRoute::default(); layers];
        let mut current = vec![0u32; layers * k];
        let mut gammas = vec![0.0f64; k];
        self.route_into(state, &mut current, &mut gammas, |l, experts, g, sum| {
            routes[l].experts.extend_from_slice(experts);
            routes[l].weights.extend(g.iter().map(|g| (g / sum) as f32));
        });
        routes
    }

    /// One token of one stream: `emit(layer, experts, gammas, sum of gammas)` per layer (the
    /// weights are `gamma / sum`), then the stream's history. `current` holds
    /// `layers * top_k` entries, `gammas` `top_k`.
    fn route_into(
        &self,
        state: &mut StreamState,
        current: &mut [u32],
        gammas: &mut [f64],
        mut emit: impl FnMut(usize, &[u32], &[f64], f64),
    ) {
        let k = self.geometry.top_k;
        let layers = self.geometry.moe_layers;
        let rho = self.process.layer_correlation;
        let window = self.process.reuse_window;
        let rng = &mut state.rng;
        for l in 0..layers {
            let table = &self.layers[l];
            let (done, rest) = current.split_at_mut(l * k);
            let route = &mut rest[..k];
            for j in 0..k {
                let chosen = &route[..j];
                let mut pick: Option<u32> = None;
                if !state.history.is_empty() && rng.random_bool(table.reuse) {
                    let filled = state.history.len();
                    let age = if filled == 1 {
                        0
                    } else {
                        rng.random_range(0..filled)
                    };
                    // The token `age` tokens before the previous one.
                    let t = (state.next + filled - 1 - age) % filled;
                    {
                        let e = state.history[t][l * k + j];
                        if !chosen.contains(&e) {
                            pick = Some(e);
                        }
                    }
                }
                if pick.is_none() && l > 0 && rho > 0.0 && rng.random_bool(rho) {
                    let above = done[(l - 1) * k + j];
                    let rank = self.layers[l - 1].rank_of[above as usize] as usize;
                    let e = table.by_rank[rank];
                    if !chosen.contains(&e) {
                        pick = Some(e);
                    }
                }
                let e = match pick {
                    Some(e) => e,
                    None => {
                        let mut found = None;
                        for _ in 0..MAX_REJECTIONS {
                            let e = table.by_rank[draw_rank(&table.cdf, rng)];
                            if !chosen.contains(&e) {
                                found = Some(e);
                                break;
                            }
                        }
                        found.unwrap_or_else(|| {
                            *table
                                .by_rank
                                .iter()
                                .find(|e| !chosen.contains(e))
                                .expect("top_k <= experts leaves an expert unchosen")
                        })
                    }
                };
                route[j] = e;
            }
            // Router weights: a sorted Dirichlet draw.
            let mut sum = 0.0;
            for g in gammas.iter_mut() {
                *g = self.weight_gamma.sample(rng).max(f64::MIN_POSITIVE);
                sum += *g;
            }
            gammas.sort_by(|a, b| b.total_cmp(a));
            emit(l, route, gammas, sum);
        }
        if state.history.len() < window {
            state.history.push(current.to_vec());
            state.next = state.history.len() % window;
        } else {
            state.history[state.next].copy_from_slice(current);
            state.next = (state.next + 1) % window;
        }
    }

    /// Adjust the stream list to `streams`: new indices start fresh, dropped ones forget.
    fn set_streams(&mut self, streams: usize) {
        self.streams.truncate(streams);
        if self.joins.len() < streams {
            self.joins.resize(streams, 0);
        }
        while self.streams.len() < streams {
            let i = self.streams.len();
            let join = self.joins[i];
            self.joins[i] += 1;
            let seed = mix_seed(mix_seed(self.process.seed, i as u64 + 1), join);
            self.streams.push(StreamState::new(seed));
        }
    }
}

/// Draw a rank from a cumulative distribution.
fn draw_rank(cdf: &[f64], rng: &mut StdRng) -> usize {
    let u: f64 = rng.random();
    cdf.partition_point(|&c| c <= u).min(cdf.len() - 1)
}

impl RoutingSource for SyntheticRouting {
    fn geometry(&self) -> &MoeGeometry {
        &self.geometry
    }

    fn next_step(&mut self, streams: usize) -> Result<StepRouting> {
        let mut out = StepRouting::default();
        self.next_step_into(streams, &mut out)?;
        Ok(out)
    }

    fn next_step_into(&mut self, streams: usize, out: &mut StepRouting) -> Result<()> {
        self.set_streams(streams);
        let k = self.geometry.top_k;
        let layers = self.geometry.moe_layers;
        out.step = self.step;
        out.layers.resize_with(layers, Vec::new);
        for routes in out.layers.iter_mut() {
            routes.resize_with(streams, TokenRoute::default);
        }
        let mut current = vec![0u32; layers * k];
        let mut gammas = vec![0.0f64; k];
        let mut states = std::mem::take(&mut self.streams);
        for (s, state) in states.iter_mut().enumerate() {
            self.route_into(state, &mut current, &mut gammas, |l, experts, g, sum| {
                let tr = &mut out.layers[l][s];
                tr.experts.clear();
                tr.experts.extend_from_slice(experts);
                tr.weights.clear();
                tr.weights.extend(g.iter().map(|g| (g / sum) as f32));
            });
        }
        self.streams = states;
        self.step += 1;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::routing::PRESET_NAMES;

    fn geo(experts: usize, top_k: usize, layers: usize) -> MoeGeometry {
        MoeGeometry::routing_test(experts, top_k, layers)
    }

    #[test]
    fn route_token_is_the_sources_own_draw() {
        // A caller-held stream state routes exactly as the source routes its stream 0.
        let p = RoutingProcess::preset("typical").unwrap();
        let g = geo(64, 6, 4);
        let mut src = SyntheticRouting::new(&p, g).unwrap();
        let mut state = StreamState::new(mix_seed(mix_seed(p.seed, 1), 0));
        for _ in 0..20 {
            let step = src.next_step(1).unwrap();
            let mine = src.route_token(&mut state);
            for (l, r) in mine.iter().enumerate() {
                assert_eq!(r.experts, step.layers[l][0].experts);
                assert_eq!(r.weights, step.layers[l][0].weights);
            }
        }
    }

    fn steps(p: &RoutingProcess, g: MoeGeometry, n: usize, streams: usize) -> Vec<StepRouting> {
        let mut src = SyntheticRouting::new(p, g).unwrap();
        (0..n).map(|_| src.next_step(streams).unwrap()).collect()
    }

    #[test]
    fn every_preset_produces_valid_routes() {
        // Including top_k = experts (the rejection fallback) and a single layer.
        for (e, k, l) in [(64, 6, 8), (8, 2, 5), (4, 4, 3), (16, 2, 1)] {
            let g = geo(e, k, l);
            for name in PRESET_NAMES {
                let p = RoutingProcess::preset(name).unwrap();
                for (i, s) in steps(&p, g, 30, 3).iter().enumerate() {
                    assert_eq!(s.step, i as u64);
                    assert_eq!(s.streams(), 3);
                    // Distinct ids in range, weights sum to 1.
                    s.validate(&g, name).unwrap();
                    for r in s.layers.iter().flatten() {
                        let sum: f64 = r.weights.iter().map(|&w| w as f64).sum();
                        assert!((sum - 1.0).abs() < 1e-5, "{sum}");
                        assert!(r.weights.windows(2).all(|w| w[0] >= w[1]), "sorted weights");
                    }
                }
            }
        }
    }

    #[test]
    fn deterministic_per_seed_and_streams_independent() {
        let g = geo(32, 4, 6);
        let p = RoutingProcess::preset("typical").unwrap();
        assert_eq!(steps(&p, g, 20, 2), steps(&p, g, 20, 2));
        assert_ne!(steps(&p, g, 20, 2), steps(&p.with_seed(7), g, 20, 2));
        // Stream 0 routes the same whether it runs alone or beside three others.
        let alone = steps(&p, g, 20, 1);
        let four = steps(&p, g, 20, 4);
        for (a, b) in alone.iter().zip(&four) {
            assert_eq!(
                a.layers.iter().map(|l| &l[0]).collect::<Vec<_>>(),
                b.layers.iter().map(|l| &l[0]).collect::<Vec<_>>()
            );
        }
        // Streams differ from each other.
        assert_ne!(four[5].layers[2][0], four[5].layers[2][1]);
    }

    #[test]
    fn reuse_repeats_and_a_rejoining_stream_starts_fresh() {
        let g = geo(64, 4, 5);
        let p = RoutingProcess {
            zipf: 0.0,
            edge_zipf: 0.0,
            reuse: 1.0,
            edge_reuse: 1.0,
            reuse_window: 1,
            layer_correlation: 0.0,
            ..RoutingProcess::default()
        };
        let mut src = SyntheticRouting::new(&p, g).unwrap();
        let first = src.next_step(2).unwrap();
        let second = src.next_step(2).unwrap();
        for l in 0..5 {
            for s in 0..2 {
                assert_eq!(first.layers[l][s].experts, second.layers[l][s].experts);
            }
        }
        // Stream 1 leaves and comes back: it has no history, so it does not repeat.
        src.next_step(1).unwrap();
        let back = src.next_step(2).unwrap();
        assert_eq!(back.layers[0][0].experts, first.layers[0][0].experts);
        let same = (0..5)
            .filter(|&l| back.layers[l][1].experts == first.layers[l][1].experts)
            .count();
        assert!(same < 5, "a rejoined stream repeated its old history");
    }

    #[test]
    fn layer_correlation_follows_the_rank_map() {
        let g = geo(32, 3, 6);
        let p = RoutingProcess {
            zipf: 0.8,
            edge_zipf: 0.8,
            reuse: 0.0,
            edge_reuse: 0.0,
            layer_correlation: 1.0,
            ..RoutingProcess::default()
        };
        let src = SyntheticRouting::new(&p, g).unwrap();
        let pop = src.popularity();
        for s in steps(&p, g, 10, 2) {
            for l in 1..6 {
                for st in 0..2 {
                    let (a, b) = (&s.layers[l - 1][st], &s.layers[l][st]);
                    // Same rank => same popularity (all layers share the exponent).
                    for j in 0..3 {
                        let pa = pop[(l - 1) * 32 + a.experts[j] as usize];
                        let pb = pop[l * 32 + b.experts[j] as usize];
                        assert!((pa - pb).abs() < 1e-12, "layer {l} slot {j}");
                    }
                }
            }
        }
    }

    #[test]
    fn popularity_matches_the_measured_frequencies() {
        let g = geo(16, 1, 4);
        let p = RoutingProcess {
            zipf: 1.0,
            edge_zipf: 0.0,
            edge_layers: 1,
            reuse: 0.0,
            edge_reuse: 0.0,
            layer_correlation: 0.0,
            ..RoutingProcess::default()
        };
        let src = SyntheticRouting::new(&p, g).unwrap();
        let pop = src.popularity();
        let n = 20_000;
        let mut counts = vec![0.0; 64];
        for s in steps(&p, g, n, 1) {
            for (l, routes) in s.layers.iter().enumerate() {
                counts[l * 16 + routes[0].experts[0] as usize] += 1.0;
            }
        }
        for l in 0..4 {
            let sum: f64 = pop[l * 16..(l + 1) * 16].iter().sum();
            assert!((sum - 1.0).abs() < 1e-9);
            for e in 0..16 {
                let (want, got) = (pop[l * 16 + e], counts[l * 16 + e] / n as f64);
                // 5 binomial standard deviations.
                let tol = 5.0 * (want * (1.0 - want) / n as f64).sqrt();
                assert!(
                    (want - got).abs() <= tol,
                    "layer {l} expert {e}: {got} vs {want}"
                );
            }
        }
        // Edge layers (0 and 3) are flat, interior ones skewed.
        let max = |l: usize| {
            pop[l * 16..(l + 1) * 16]
                .iter()
                .cloned()
                .fold(0.0, f64::max)
        };
        assert!((max(0) - 1.0 / 16.0).abs() < 1e-12 && (max(3) - 1.0 / 16.0).abs() < 1e-12);
        assert!(max(1) > 0.25 && max(2) > 0.25);
    }

    #[test]
    fn invalid_processes_are_named() {
        let g = geo(8, 2, 4);
        for (field, p) in [
            (
                "routing.reuse",
                RoutingProcess {
                    reuse: 1.5,
                    ..RoutingProcess::default()
                },
            ),
            (
                "routing.zipf",
                RoutingProcess {
                    zipf: -1.0,
                    ..RoutingProcess::default()
                },
            ),
            (
                "routing.reuse_window",
                RoutingProcess {
                    reuse_window: 0,
                    ..RoutingProcess::default()
                },
            ),
            (
                "routing.weight_concentration",
                RoutingProcess {
                    weight_concentration: 0.0,
                    ..RoutingProcess::default()
                },
            ),
            (
                "routing.layer_correlation",
                RoutingProcess {
                    layer_correlation: f64::NAN,
                    ..RoutingProcess::default()
                },
            ),
        ] {
            let e = SyntheticRouting::new(&p, g).unwrap_err().to_string();
            assert!(e.contains(field), "{e}");
        }
        let e = SyntheticRouting::new(&RoutingProcess::default(), geo(2, 3, 1)).unwrap_err();
        assert!(e.to_string().contains("top_k"), "{e}");
        let text = "zipf = 0.5\nreuse = 0.2\n";
        let p = RoutingProcess::from_toml_str(text, "r.toml").unwrap();
        assert_eq!((p.zipf, p.reuse, p.reuse_window), (0.5, 0.2, 2));
        let e = RoutingProcess::from_toml_str("zipff = 1", "r.toml")
            .unwrap_err()
            .to_string();
        assert!(e.contains("r.toml") && e.contains("zipff"), "{e}");
        let e = RoutingProcess::from_toml_str("reuse = 2.0", "r.toml")
            .unwrap_err()
            .to_string();
        assert!(e.contains("r.toml") && e.contains("routing.reuse"), "{e}");
        assert!(RoutingProcess::preset("zipfian").is_err());
    }
}
