//! A seeded synthetic routing process: temporal locality, popularity skew, token reuse and
//! layer correlation.
//!
//! Real routers are neither uniform nor independent. What engines measure on real models
//! (`docs/routing.md`) is strong temporal locality (a token re-uses experts that its stream
//! used a few tokens before at the same layer, so a small per-layer LRU cache hits often) with
//! weak static skew (a hot list learned on one part of a workload covers little more of
//! another part than a uniform one would). The cache's miss rate depends on both, and on the
//! layer-to-layer correlation, so the process has one knob per mechanism (see
//! [`RoutingProcess`]) and named presets fitted to published measurements (`ft routing fit`).
//!
//! Generation of one route (stream `s`, layer `l`), slot by slot (`j` = 0..top_k):
//! 1. **Locality** (the working set): with probability `locality(l)`, re-use an expert the
//!    stream used at layer `l` recently: draw an age `a` in tokens from a Lomax (Pareto II)
//!    law of scale `locality_tokens` and shape `locality_tail`, and take a uniformly chosen
//!    expert of the route of the token `floor(a)` tokens before the previous one (a = 0 is the
//!    previous token). Ages beyond the stream's history, or an expert already in the route,
//!    draw again, at most [`MAX_RECALL_TRIES`] times, then fall through. The working set so
//!    drifts: experts drop out of it as fresh draws (steps 2 to 4) replace them.
//! 2. **Slot reuse**: with probability `reuse(l)`, take the expert that a recent token of
//!    stream `s` had in slot `j` at layer `l`: the previous token when `reuse_window` is 1,
//!    else a token drawn uniformly from the stream's last `reuse_window` tokens;
//! 3. else, with probability `layer_correlation`, take the image of this token's slot-`j`
//!    expert at layer `l - 1` under the layer's rank-preserving map (the expert of popularity
//!    rank `r` at `l - 1` maps to the expert of rank `r` at `l`, so following it keeps the
//!    popularity marginal);
//! 4. else (or when the candidate is already in the route, or there is no history) draw from
//!    layer `l`'s popularity: a Zipf law of exponent `zipf(l)` (`rand_distr::Zipf`) over a
//!    per-layer random permutation of the experts (rejection of duplicates; after
//!    [`MAX_REJECTIONS`] draws, the most popular expert not yet chosen).
//!
//! Copying from the stream's own past keeps each layer's popularity as the stationary
//! marginal, so locality and static skew are separate knobs.
//!
//! Router weights are a Dirichlet(`weight_concentration`) draw sorted in decreasing order, so
//! slot 0 holds the largest weight as a real top-k router's output does.
//!
//! Every stream has its own random number generator, seeded from the process seed, the stream
//! index and how many times that stream index has (re)joined: stream `i`'s routing does not
//! depend on how many other streams run beside it. A mechanism whose probability is 0 draws
//! no random number, so adding one leaves the processes without it unchanged.

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use rand_distr::{Distribution, Gamma, Pareto, Zipf};
use serde::{Deserialize, Serialize};
use std::path::Path;

use super::{presets, RoutingSource, StepRouting, TokenRoute};
use crate::error::{ModelError, Result};
use crate::geometry::MoeGeometry;

/// Popularity draws rejected as duplicates before falling back to a deterministic pick (the
/// fallback only matters when `top_k` is close to `experts` under strong skew).
pub const MAX_REJECTIONS: usize = 64;

/// Draws of the locality mechanism (an age and a slot) before it gives the slot up to the
/// next mechanism: an age beyond the history or an expert already chosen for this route
/// draws again. Four keeps the mechanism's effective probability within a few percent of
/// `locality` for top-k up to 10 while bounding the work per slot.
pub const MAX_RECALL_TRIES: usize = 4;

/// Share of the locality mechanism's age law that the stream's history must cover: the
/// history holds the ages below this quantile (ages beyond it draw again, see
/// [`MAX_RECALL_TRIES`]).
pub const HISTORY_QUANTILE: f64 = 0.99;

/// Most tokens a stream's history holds (bounds memory for heavy-tailed age laws: a stream
/// holds `tokens x moe_layers x top_k` expert ids, 4 bytes each).
pub const MAX_HISTORY_TOKENS: usize = 512;

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
    /// Probability (0 to 1) that a slot re-uses an expert from the stream's recent routes at
    /// the same layer (its working set), in interior layers. Drawn first, before `reuse`.
    pub locality: f64,
    /// The same probability in the edge layers.
    pub edge_locality: f64,
    /// Scale of the age law of a re-used expert, in tokens (> 0): ages follow a Lomax law
    /// `P(age > a) = (1 + a / locality_tokens)^-locality_tail`; the median age is
    /// `locality_tokens * (2^(1/locality_tail) - 1)` tokens.
    pub locality_tokens: f64,
    /// Shape (tail exponent) of the age law (> 0): smaller is a heavier tail, which spreads
    /// re-use over older tokens and lets larger caches keep gaining hits.
    pub locality_tail: f64,
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

    /// A process named by a preset or a `.toml` file (a `--start` or `--routing` argument
    /// that must be a process, not a trace).
    pub fn named(name: &str) -> Result<Self> {
        if name.ends_with(".toml") {
            Self::from_toml_file(Path::new(name))
        } else {
            Self::preset(name)
        }
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
            ("routing.locality", self.locality),
            ("routing.edge_locality", self.edge_locality),
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
        for (field, v) in [
            ("routing.weight_concentration", self.weight_concentration),
            ("routing.locality_tokens", self.locality_tokens),
            ("routing.locality_tail", self.locality_tail),
        ] {
            if !(v.is_finite() && v > 0.0) {
                return Err(ModelError::invalid(
                    field,
                    format!("{v} is not a finite number > 0"),
                ));
            }
        }
        Ok(())
    }

    /// Locality probability at a layer.
    pub fn locality_at(&self, layer: usize, layers: usize) -> f64 {
        if self.is_edge_layer(layer, layers) {
            self.edge_locality
        } else {
            self.locality
        }
    }

    /// Tokens of history a stream keeps: the longest age any mechanism may copy from (the
    /// `reuse_window`, and the [`HISTORY_QUANTILE`] of the locality age law when locality is
    /// on), at most [`MAX_HISTORY_TOKENS`] and at least 1.
    pub fn history_tokens(&self) -> usize {
        let mut n = self.reuse_window.max(1);
        if self.locality > 0.0 || self.edge_locality > 0.0 {
            // Lomax quantile q: scale * ((1 - q)^(-1 / shape) - 1), plus the previous token.
            let age = self.locality_tokens
                * ((1.0 - HISTORY_QUANTILE).powf(-1.0 / self.locality_tail) - 1.0);
            let tokens = if age.is_finite() {
                (age.ceil() as usize).saturating_add(1)
            } else {
                MAX_HISTORY_TOKENS
            };
            n = n.max(tokens);
        }
        n.min(MAX_HISTORY_TOKENS)
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
    /// Popularity law over ranks (a draw `x` in `1..=experts` is rank `x - 1`).
    zipf: Zipf<f64>,
    /// Zipf exponent of the layer (for [`SyntheticRouting::popularity`]).
    exponent: f64,
    /// Expert of each popularity rank.
    by_rank: Vec<u32>,
    /// Popularity rank of each expert.
    rank_of: Vec<u32>,
    /// Reuse probability at this layer.
    reuse: f64,
    /// Locality probability at this layer.
    locality: f64,
}

/// History of one stream: its generator and the experts of its last
/// [`RoutingProcess::history_tokens`] tokens.
/// The source keeps one per stream index; a caller that routes streams itself (the served
/// model's router) keeps its own and routes with [`SyntheticRouting::route_token`].
#[derive(Debug, Clone)]
pub struct StreamState {
    rng: StdRng,
    /// The last tokens' experts, a ring of `[token][layer * top_k + slot]`.
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
    /// Age law of the locality mechanism (a Pareto draw minus its scale is a Lomax draw).
    age: Pareto<f64>,
    /// Tokens of history each stream keeps.
    history_tokens: usize,
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
                let zipf = Zipf::new(n as f64, s)
                    .map_err(|e| ModelError::invalid("routing.zipf", e.to_string()))?;
                Ok(LayerTable {
                    zipf,
                    exponent: s,
                    by_rank,
                    rank_of,
                    reuse: process.reuse_at(l, geometry.moe_layers),
                    locality: process.locality_at(l, geometry.moe_layers),
                })
            })
            .collect::<Result<Vec<_>>>()?;
        let weight_gamma = Gamma::new(process.weight_concentration, 1.0)
            .map_err(|e| ModelError::invalid("routing.weight_concentration", e.to_string()))?;
        let age = Pareto::new(process.locality_tokens, process.locality_tail)
            .map_err(|e| ModelError::invalid("routing.locality_tokens", e.to_string()))?;
        Ok(SyntheticRouting {
            process: process.clone(),
            geometry,
            layers,
            weight_gamma,
            age,
            history_tokens: process.history_tokens(),
            streams: Vec::new(),
            joins: Vec::new(),
            step: 0,
        })
    }

    /// The process this source runs.
    pub fn process(&self) -> &RoutingProcess {
        &self.process
    }

    /// Base popularity of every expert, indexed by [`crate::ExpertId::flat`]: the Zipf
    /// probability mass of its rank in its layer, `(r + 1)^-s / sum over ranks` (summing to 1
    /// per layer). The process's stationary marginal is close to it (locality, reuse and the
    /// rank-preserving layer map keep it; duplicate rejection flattens it slightly). Used to
    /// choose a static hot set without a warm-up.
    pub fn popularity(&self) -> Vec<f64> {
        let n = self.geometry.experts;
        let mut out = vec![0.0; n * self.geometry.moe_layers];
        for (l, t) in self.layers.iter().enumerate() {
            let mass: Vec<f64> = (0..n).map(|r| ((r + 1) as f64).powf(-t.exponent)).collect();
            let total: f64 = mass.iter().sum();
            for (r, m) in mass.iter().enumerate() {
                out[l * n + t.by_rank[r] as usize] = m / total;
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
        let cap = self.history_tokens;
        let rng = &mut state.rng;
        let filled = state.history.len();
        // Ring index of the token `age` tokens before the previous one (age < filled).
        let at = |age: usize| (state.next + filled - 1 - age) % filled;
        for l in 0..layers {
            let table = &self.layers[l];
            let (done, rest) = current.split_at_mut(l * k);
            let route = &mut rest[..k];
            for j in 0..k {
                let chosen = &route[..j];
                let mut pick: Option<u32> = None;
                if filled > 0 && table.locality > 0.0 && rng.random_bool(table.locality) {
                    for _ in 0..MAX_RECALL_TRIES {
                        let age = self.age.sample(rng) - self.process.locality_tokens;
                        let slot = rng.random_range(0..k);
                        if age < filled as f64 {
                            let e = state.history[at(age as usize)][l * k + slot];
                            if !chosen.contains(&e) {
                                pick = Some(e);
                                break;
                            }
                        }
                    }
                }
                if pick.is_none() && filled > 0 && rng.random_bool(table.reuse) {
                    let reach = filled.min(window);
                    let age = if reach == 1 {
                        0
                    } else {
                        rng.random_range(0..reach)
                    };
                    let e = state.history[at(age)][l * k + j];
                    if !chosen.contains(&e) {
                        pick = Some(e);
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
                            let e = table.by_rank[draw_rank(&table.zipf, table.by_rank.len(), rng)];
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
        if state.history.len() < cap {
            state.history.push(current.to_vec());
            state.next = state.history.len() % cap;
        } else {
            state.history[state.next].copy_from_slice(current);
            state.next = (state.next + 1) % cap;
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

/// Draw a popularity rank (from 0) from a layer's Zipf law.
fn draw_rank(zipf: &Zipf<f64>, experts: usize, rng: &mut StdRng) -> usize {
    // The law draws integers 1..=experts as f64; the cast is exact.
    (zipf.sample(rng) as usize).clamp(1, experts) - 1
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
    use crate::routing::{RoutingSource, PRESET_NAMES};

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
            reuse: 1.0,
            edge_reuse: 1.0,
            reuse_window: 1,
            ..RoutingProcess::preset("uniform").unwrap()
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
            layer_correlation: 1.0,
            ..RoutingProcess::preset("uniform").unwrap()
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
            ..RoutingProcess::preset("uniform").unwrap()
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
            (
                "routing.locality",
                RoutingProcess {
                    locality: -0.1,
                    ..RoutingProcess::default()
                },
            ),
            (
                "routing.locality_tokens",
                RoutingProcess {
                    locality_tokens: 0.0,
                    ..RoutingProcess::default()
                },
            ),
            (
                "routing.locality_tail",
                RoutingProcess {
                    locality_tail: f64::INFINITY,
                    ..RoutingProcess::default()
                },
            ),
        ] {
            let e = SyntheticRouting::new(&p, g).unwrap_err().to_string();
            assert!(e.contains(field), "{e}");
        }
        let e = SyntheticRouting::new(&RoutingProcess::default(), geo(2, 3, 1)).unwrap_err();
        assert!(e.to_string().contains("top_k"), "{e}");
        let text = "zipf = 0.5\nreuse = 0.2\nlocality_tokens = 3.5\n";
        let p = RoutingProcess::from_toml_str(text, "r.toml").unwrap();
        assert_eq!((p.zipf, p.reuse, p.locality_tokens), (0.5, 0.2, 3.5));
        // The fields not given are the default preset's.
        assert_eq!(p.locality, RoutingProcess::default().locality);
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
    /// Distance in tokens from each routing of stream 0, layer 0, to the stream's previous
    /// routing of the same expert, bucketed (1, 2, 3-4, 5-8, 9-16, 17-64, longer or never).
    fn distance_histogram(seq: &[Vec<u32>]) -> Vec<f64> {
        let edges = [1usize, 2, 4, 8, 16, 64];
        let mut last = std::collections::HashMap::new();
        let mut h = vec![0.0; edges.len() + 1];
        for (t, experts) in seq.iter().enumerate() {
            for &e in experts {
                let b = match last.insert(e, t) {
                    Some(prev) => edges.partition_point(|&x| x < t - prev),
                    None => edges.len(),
                };
                h[b] += 1.0;
            }
        }
        let n: f64 = h.iter().sum();
        h.iter().map(|c| c / n).collect()
    }

    #[test]
    fn locality_follows_its_age_law_against_a_slow_reference() {
        // Top-1 over many uniform experts: fresh draws almost never coincide, so the reuse
        // distances are the locality mechanism's alone. The reference draws the same law
        // directly from a list of the past tokens.
        let p = RoutingProcess {
            locality: 0.7,
            locality_tokens: 2.0,
            locality_tail: 1.3,
            ..RoutingProcess::preset("uniform").unwrap()
        };
        let g = geo(1 << 16, 1, 1);
        let n = 30_000;
        let fast: Vec<Vec<u32>> = steps(&p, g, n, 1)
            .into_iter()
            .map(|s| s.layers[0][0].experts.clone())
            .collect();
        let cap = p.history_tokens();
        let mut rng = StdRng::seed_from_u64(11);
        let lomax = Pareto::new(p.locality_tokens, p.locality_tail).unwrap();
        let mut slow: Vec<Vec<u32>> = Vec::with_capacity(n);
        for t in 0..n {
            let mut pick = None;
            if t > 0 && rng.random_bool(p.locality) {
                for _ in 0..MAX_RECALL_TRIES {
                    let age = lomax.sample(&mut rng) - p.locality_tokens;
                    if age < t.min(cap) as f64 {
                        pick = Some(slow[t - 1 - age as usize][0]);
                        break;
                    }
                }
            }
            slow.push(vec![pick.unwrap_or_else(|| rng.random_range(0..1u32 << 16))]);
        }
        let (a, b) = (distance_histogram(&fast), distance_histogram(&slow));
        for (i, (x, y)) in a.iter().zip(&b).enumerate() {
            assert!(
                (x - y).abs() < 0.02,
                "bucket {i}: {x:.4} vs {y:.4} ({a:?} vs {b:?})"
            );
        }
        // The history covers the law's 99th percentile, bounded.
        let q = p.locality_tokens * (0.01f64.powf(-1.0 / p.locality_tail) - 1.0);
        assert_eq!(cap, q.ceil() as usize + 1);
        let heavy = RoutingProcess {
            locality_tail: 0.05,
            ..p.clone()
        };
        assert_eq!(heavy.history_tokens(), MAX_HISTORY_TOKENS);
    }

    #[test]
    fn zipf_draws_match_the_inverse_cdf_reference() {
        // rand_distr's Zipf against a cumulative table searched by inversion (the slow
        // reference): the rank frequencies agree within 5 binomial standard deviations.
        let (n, s, draws) = (32usize, 0.9, 200_000usize);
        let mut cdf: Vec<f64> = (0..n).map(|r| ((r + 1) as f64).powf(-s)).collect();
        let mut acc = 0.0;
        for c in cdf.iter_mut() {
            acc += *c;
            *c = acc;
        }
        let zipf = Zipf::new(n as f64, s).unwrap();
        let mut rng = StdRng::seed_from_u64(3);
        let (mut fast, mut slow) = (vec![0.0; n], vec![0.0; n]);
        for _ in 0..draws {
            fast[draw_rank(&zipf, n, &mut rng)] += 1.0;
            let u: f64 = rng.random::<f64>() * acc;
            slow[cdf.partition_point(|&c| c <= u).min(n - 1)] += 1.0;
        }
        for r in 0..n {
            let p = (cdf[r] - if r == 0 { 0.0 } else { cdf[r - 1] }) / acc;
            let sd = (p * (1.0 - p) / draws as f64).sqrt();
            let (f, g) = (fast[r] / draws as f64, slow[r] / draws as f64);
            assert!(
                (f - p).abs() < 5.0 * sd && (g - p).abs() < 5.0 * sd,
                "rank {r}: {f} {g} {p}"
            );
        }
    }
}
