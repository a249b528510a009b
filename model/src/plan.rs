//! The layer plan: THE decode-step semantics every view of `ft` shares.
//!
//! For one MoE layer of one decode step, [`plan_layer`] decides which experts hit in the GPU
//! cache, which misses cross the link (and into which slot, evicting whom) and which are
//! computed on the CPU, with the tokens routed to each. The runtime executes the plan, the
//! simulator times it and [`crate::traffic`] counts it; because all three call this function
//! their miss rates agree by construction.
//!
//! Semantics (deterministic for a given cache state and routes):
//! 1. **Union.** The unit of work is an expert, not a token: an expert routed from several
//!    streams is one [`ExpertWork`] serving all their tokens (stream, router weight), in
//!    ascending stream order.
//! 2. **Lookup.** Every expert of the union is looked up once, in ascending expert order (a
//!    hit touches the policy's recency or count).
//! 3. **Split of misses.** Of the `m` misses, `F = fetch_count(f, m)` cross the link
//!    (`f` = 1 for offload and resident, 0 for cpu, the fetch fraction for hybrid). Which
//!    `F` is the cache's [`AdmissionPolicy`]: by default most tokens first, then the most
//!    recently requested before this step's lookup ([`ExpertCache::last_request`]; never
//!    requested comes last), then the lowest expert id.
//! 4. **Admission.** The chosen misses are admitted in that order with every expert of this
//!    layer's union pinned, so nothing the layer needs is evicted. An admission the cache
//!    refuses (all slots pinned, or a static hot set that is full) leaves the expert
//!    **uncached**: it still crosses the link, into a staging buffer, is computed on the GPU,
//!    and is not cached ([`LayerPlan::uncached`]).
//! 5. **CPU.** The other misses are computed on the CPU from host memory and never enter the
//!    cache: in hybrid only fetched experts change the cache, so its history (and miss rate)
//!    differs from offload's. Their requests stay in the history the admission ranks by
//!    unless the policy's `cpu_history` is off, which forgets them.
//!
//! Admitting fewer misses is not always missing more: with temporal locality and a small
//! cache, offload lets every one-off expert evict a working-set expert, while a hybrid that
//! admits the recently requested misses (`--admission recent`) keeps the working set and
//! sends the one-off experts to the CPU, and can miss less than offload (the test
//! `recent_admission_misses_less_than_offload_on_typical` shows it on the `typical` process).

use serde::{Deserialize, Serialize};
use std::fmt;
use std::str::FromStr;

use crate::cache::{ExpertCache, SlotId};
use crate::error::{ModelError, Result};
use crate::geometry::ExpertId;
use crate::perf::LayerCounts;
use crate::routing::TokenRoute;
use crate::strategy::{FetchFraction, LayerPlacement, Strategy};

/// The order in which a layer that fetches only `F` of its `m` misses picks them (the first
/// `F` cross the link and are admitted, the rest are computed on the CPU). Offload (`F = m`)
/// fetches every miss under every order, but admits them in this order, which sets their
/// recency among themselves and so what is evicted later; cpu (`F = 0`) admits none.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum AdmissionOrder {
    /// Most tokens routed to the expert first (a fetched expert serves all of them, a CPU one
    /// costs compute per token), then the most recently requested, then the lowest id.
    #[default]
    Tokens,
    /// The most recently requested before this step first (never requested last), then most
    /// tokens, then the lowest id: under temporal locality an expert requested recently is
    /// the one likely to be requested again, so the cache keeps its working set and one-off
    /// experts stay on the CPU.
    Recent,
    /// Ascending expert id (the lookup order): an order that knows nothing of the experts,
    /// the baseline the others are measured against.
    Order,
}

impl AdmissionOrder {
    /// Names accepted by [`AdmissionPolicy::from_str`].
    pub const NAMES: [&'static str; 3] = ["tokens", "recent", "order"];

    /// The order's name.
    pub fn name(self) -> &'static str {
        match self {
            AdmissionOrder::Tokens => "tokens",
            AdmissionOrder::Recent => "recent",
            AdmissionOrder::Order => "order",
        }
    }
}

/// Which misses a hybrid layer fetches into the cache, and whether the misses it computes on
/// the CPU count toward the cache's request history (module docs, steps 3 and 5). Chosen
/// with `--admission ORDER[,cached-history]` or a `[cache.admission]` table.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default, rename_all = "kebab-case")]
pub struct AdmissionPolicy {
    /// The order the fetched misses are picked in.
    pub order: AdmissionOrder,
    /// Whether a miss computed on the CPU counts as a request in the history the `recent`
    /// and `tokens` orders rank by (true, the default: the router asked for it), or is
    /// forgotten, so only experts the GPU served (hits and fetched misses) have a history.
    pub cpu_history: bool,
}

impl Default for AdmissionPolicy {
    /// Most tokens first, CPU work counted.
    fn default() -> Self {
        AdmissionPolicy {
            order: AdmissionOrder::Tokens,
            cpu_history: true,
        }
    }
}

/// The `--admission` suffix that turns `cpu_history` off.
const CACHED_HISTORY: &str = "cached-history";

impl fmt::Display for AdmissionPolicy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.order.name())?;
        if !self.cpu_history {
            write!(f, ",{CACHED_HISTORY}")?;
        }
        Ok(())
    }
}

impl FromStr for AdmissionPolicy {
    type Err = ModelError;

    /// `ORDER` or `ORDER,cached-history` (the CPU's misses are no part of the history).
    fn from_str(s: &str) -> Result<Self> {
        let lower = s.trim().to_ascii_lowercase();
        let (name, rest) = match lower.split_once(',') {
            Some((n, r)) => (n.trim(), Some(r.trim())),
            None => (lower.as_str(), None),
        };
        let order = match name {
            "tokens" => AdmissionOrder::Tokens,
            "recent" => AdmissionOrder::Recent,
            "order" => AdmissionOrder::Order,
            _ => {
                return Err(ModelError::UnknownName {
                    kind: "admission order",
                    name: name.to_string(),
                    known: AdmissionOrder::NAMES.join(", "),
                })
            }
        };
        let cpu_history = match rest {
            None => true,
            Some(CACHED_HISTORY) => false,
            Some(other) => {
                return Err(ModelError::invalid(
                    "--admission",
                    format!("'{other}' after the order: the only option is '{CACHED_HISTORY}'"),
                ))
            }
        };
        Ok(AdmissionPolicy { order, cpu_history })
    }
}

/// One expert's work: which expert, where its weights are on the GPU (if they are), and the
/// tokens routed to it as (stream, router weight), ascending by stream.
#[derive(Debug, Clone, PartialEq)]
pub struct ExpertWork {
    /// The expert.
    pub id: ExpertId,
    /// Its cache slot for a hit; `None` for CPU and uncached work.
    pub slot: Option<SlotId>,
    /// Tokens routed to it: (stream index, router weight).
    pub tokens: Vec<(u32, f32)>,
}

/// A miss gathered over the link into a cache slot.
#[derive(Debug, Clone, PartialEq)]
pub struct FetchWork {
    /// The expert.
    pub id: ExpertId,
    /// The slot its weights are copied into.
    pub slot: SlotId,
    /// The expert that held the slot before (never one of this layer's experts).
    pub evicted: Option<ExpertId>,
    /// Tokens routed to it: (stream index, router weight).
    pub tokens: Vec<(u32, f32)>,
}

/// What one MoE layer of a decode step does with its experts.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct LayerPlan {
    /// MoE layer index.
    pub layer: usize,
    /// Resident experts, computed on the GPU from their slots (ascending expert id).
    pub hits: Vec<ExpertWork>,
    /// Misses gathered into cache slots and computed on the GPU, in issue (priority) order.
    pub fetched: Vec<FetchWork>,
    /// Misses gathered into a staging buffer (the cache refused them), computed on the GPU,
    /// not cached; in priority order. Empty unless every slot is pinned or a static hot set
    /// is full.
    pub uncached: Vec<ExpertWork>,
    /// Misses computed on the CPU from host memory (ascending expert id).
    pub cpu: Vec<ExpertWork>,
}

impl LayerPlan {
    /// Distinct experts the layer computes (hits + misses).
    pub fn unique(&self) -> usize {
        self.hits.len() + self.misses()
    }

    /// Experts that were not resident.
    pub fn misses(&self) -> usize {
        self.fetched.len() + self.uncached.len() + self.cpu.len()
    }

    /// Experts crossing the link (fetched into slots or staged uncached).
    pub fn link_experts(&self) -> usize {
        self.fetched.len() + self.uncached.len()
    }

    /// Experts computed on the GPU (hits, fetched and uncached).
    pub fn gpu_experts(&self) -> usize {
        self.hits.len() + self.link_experts()
    }

    /// (token, expert) routings served by each group: (hits, link, cpu).
    pub fn token_counts(&self) -> (usize, usize, usize) {
        let t = |w: &[ExpertWork]| w.iter().map(|e| e.tokens.len()).sum::<usize>();
        (
            t(&self.hits),
            self.fetched.iter().map(|e| e.tokens.len()).sum::<usize>() + t(&self.uncached),
            t(&self.cpu),
        )
    }
}

/// How many of `misses` misses cross the link at fetch fraction `f` (clamped to [0, 1]; NaN
/// counts as 0): `floor(f m)` or `ceil(f m)`, whichever minimises `max(F (1 - f), (m - F) f)`
/// (the balance the reference engine keeps between the link's and the CPU's share), ties to
/// the lower. `f = 1` gives `m`, `f = 0` gives 0.
pub fn fetch_count(f: f64, misses: usize) -> usize {
    let f = if f.is_nan() { 0.0 } else { f.clamp(0.0, 1.0) };
    let m = misses as f64;
    let lo = (f * m).floor().clamp(0.0, m);
    let hi = (f * m).ceil().clamp(0.0, m);
    let cost = |x: f64| (x * (1.0 - f)).max((m - x) * f);
    if cost(hi) < cost(lo) {
        hi as usize
    } else {
        lo as usize
    }
}

/// The fetch fraction a strategy that places every layer alike implies (1 offload/resident,
/// 0 cpu, the fixed fraction for hybrid); hybrid with `auto` is an error (resolve it
/// first), and so is layer split, whose layers differ: plan it by its
/// [`Strategy::policy`] with [`plan_layer_placed`].
pub fn fetch_fraction(strategy: &Strategy) -> Result<f64> {
    match strategy {
        Strategy::Hybrid {
            fetch: FetchFraction::Auto,
        } => Err(ModelError::invalid(
            "fetch fraction",
            "hybrid's 'auto' fetch fraction must be resolved to a number before planning",
        )),
        Strategy::LayerSplit { .. } | Strategy::LayerSplitCached { .. } => {
            Err(ModelError::invalid(
                "fetch fraction",
                format!(
                    "{strategy} places its layers differently: plan it by its per-layer policy"
                ),
            ))
        }
        Strategy::Offload | Strategy::Hybrid { .. } | Strategy::Resident | Strategy::Cpu => {
            Ok(strategy
                .fixed_fetch_fraction()
                .expect("every strategy but hybrid(auto) has a fixed fraction"))
        }
    }
}

/// Plan one MoE layer placed as `placement` says: [`plan_layer`] for a cached layer; for a
/// resident layer every expert of the union is a hit (no slot: the layer's experts are held
/// outside the shared cache), for a CPU-only one every expert is computed on the CPU. The
/// cache is touched by cached layers only.
pub fn plan_layer_placed(
    layer: usize,
    routes: &[TokenRoute],
    cache: &mut ExpertCache,
    placement: LayerPlacement,
) -> LayerPlan {
    let all = |routes: &[TokenRoute]| {
        let (union, groups) = union_of(routes);
        union
            .into_iter()
            .zip(groups)
            .map(|(e, tokens)| ExpertWork {
                id: ExpertId::new(layer, e as usize),
                slot: None,
                tokens,
            })
            .collect::<Vec<_>>()
    };
    match placement {
        LayerPlacement::Cached { fetch_fraction } => {
            plan_layer(layer, routes, cache, fetch_fraction)
        }
        LayerPlacement::Resident => LayerPlan {
            layer,
            hits: all(routes),
            ..LayerPlan::default()
        },
        LayerPlacement::CpuOnly => LayerPlan {
            layer,
            cpu: all(routes),
            ..LayerPlan::default()
        },
    }
}

/// The union of a layer's routes (module docs, step 1): the experts in ascending order and,
/// for each, its tokens as (stream, weight) in ascending stream order.
fn union_of(routes: &[TokenRoute]) -> (Vec<u32>, Vec<Vec<(u32, f32)>>) {
    let mut entries: Vec<(u32, u32, f32)> =
        Vec::with_capacity(routes.iter().map(|r| r.experts.len()).sum());
    for (s, r) in routes.iter().enumerate() {
        for (&e, &w) in r.experts.iter().zip(&r.weights) {
            entries.push((e, s as u32, w));
        }
    }
    entries.sort_unstable_by_key(|&(e, s, _)| (e, s));
    let mut union: Vec<u32> = Vec::new();
    let mut groups: Vec<Vec<(u32, f32)>> = Vec::new();
    for &(e, s, w) in &entries {
        if union.last() != Some(&e) {
            union.push(e);
            groups.push(Vec::new());
        }
        groups.last_mut().expect("pushed above").push((s, w));
    }
    (union, groups)
}

/// A miss waiting for the split.
struct Miss {
    /// Its last request before this step's lookup.
    prev: Option<u64>,
    expert: u32,
    tokens: Vec<(u32, f32)>,
}

/// Plan one MoE layer (see the module docs for the exact semantics).
///
/// `routes` holds one route per stream (index = stream id) at this layer; `fetch_fraction` is
/// the share of misses to gather ([`fetch_fraction`] of the strategy). The cache is updated
/// (lookups, admissions, evictions) as the plan says.
pub fn plan_layer(
    layer: usize,
    routes: &[TokenRoute],
    cache: &mut ExpertCache,
    fetch_fraction: f64,
) -> LayerPlan {
    // 1. Union: (expert, stream, weight) sorted by expert then stream.
    let (union, groups) = union_of(routes);

    // 2. Lookup in ascending expert order.
    let mut plan = LayerPlan {
        layer,
        ..LayerPlan::default()
    };
    let mut misses: Vec<Miss> = Vec::new();
    for (&e, tokens) in union.iter().zip(groups) {
        let id = ExpertId::new(layer, e as usize);
        let prev = cache.last_request(id);
        match cache.lookup(id) {
            Some(slot) => plan.hits.push(ExpertWork {
                id,
                slot: Some(slot),
                tokens,
            }),
            None => misses.push(Miss {
                prev,
                expert: e,
                tokens,
            }),
        }
    }

    // 3. Split: the admission's order, first F cross the link.
    let admission = cache.admission();
    let n_fetch = fetch_count(fetch_fraction, misses.len());
    match admission.order {
        AdmissionOrder::Tokens => misses.sort_by(|a, b| {
            (b.tokens.len().cmp(&a.tokens.len()))
                .then(b.prev.cmp(&a.prev))
                .then(a.expert.cmp(&b.expert))
        }),
        AdmissionOrder::Recent => misses.sort_by(|a, b| {
            (b.prev.cmp(&a.prev))
                .then(b.tokens.len().cmp(&a.tokens.len()))
                .then(a.expert.cmp(&b.expert))
        }),
        // Lookup order is ascending id already.
        AdmissionOrder::Order => {}
    }
    let to_cpu = misses.split_off(n_fetch);

    // 4. Admission with the layer's experts pinned.
    let pinned = |x: ExpertId| x.layer as usize == layer && union.binary_search(&x.expert).is_ok();
    for Miss { expert, tokens, .. } in misses {
        let id = ExpertId::new(layer, expert as usize);
        match cache.admit(id, pinned) {
            Ok(a) => plan.fetched.push(FetchWork {
                id,
                slot: a.slot,
                evicted: a.evicted,
                tokens,
            }),
            Err(_) => plan.uncached.push(ExpertWork {
                id,
                slot: None,
                tokens,
            }),
        }
    }

    // 5. The rest on the CPU, ascending id; their requests forgotten unless they count.
    if !admission.cpu_history {
        for m in &to_cpu {
            cache.restore_request(ExpertId::new(layer, m.expert as usize), m.prev);
        }
    }
    plan.cpu = to_cpu
        .into_iter()
        .map(|m| ExpertWork {
            id: ExpertId::new(layer, m.expert as usize),
            slot: None,
            tokens: m.tokens,
        })
        .collect();
    plan.cpu.sort_unstable_by_key(|w| w.id);
    plan
}

/// What a layer plan holds, counted: experts and (token, expert) routings of each group.
/// [`plan_layer_counts`] gives it without building the plan's token lists.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct PlanCounts {
    /// Hits.
    pub hits: usize,
    /// Routings served by the hits.
    pub hit_tokens: usize,
    /// Misses fetched into cache slots.
    pub fetched: usize,
    /// Routings served by them.
    pub fetched_tokens: usize,
    /// Misses staged uncached.
    pub uncached: usize,
    /// Routings served by them.
    pub uncached_tokens: usize,
    /// Misses computed on the CPU.
    pub cpu: usize,
    /// Routings served by them.
    pub cpu_tokens: usize,
}

impl PlanCounts {
    /// The counts of a plan.
    pub fn of_plan(plan: &LayerPlan) -> Self {
        let t = |w: &[ExpertWork]| w.iter().map(|e| e.tokens.len()).sum::<usize>();
        PlanCounts {
            hits: plan.hits.len(),
            hit_tokens: t(&plan.hits),
            fetched: plan.fetched.len(),
            fetched_tokens: plan.fetched.iter().map(|e| e.tokens.len()).sum(),
            uncached: plan.uncached.len(),
            uncached_tokens: t(&plan.uncached),
            cpu: plan.cpu.len(),
            cpu_tokens: t(&plan.cpu),
        }
    }

    /// Experts crossing the link (fetched or staged).
    pub fn link_experts(&self) -> usize {
        self.fetched + self.uncached
    }

    /// Experts that were not resident.
    pub fn misses(&self) -> usize {
        self.link_experts() + self.cpu
    }

    /// The counts the cost terms take ([`LayerCounts::of_plan`] of the plan).
    pub fn layer_counts(&self) -> LayerCounts {
        LayerCounts {
            hits: self.hits as f64,
            hit_tokens: self.hit_tokens as f64,
            fetched: self.link_experts() as f64,
            fetched_tokens: (self.fetched_tokens + self.uncached_tokens) as f64,
            cpu: self.cpu as f64,
            cpu_tokens: self.cpu_tokens as f64,
        }
    }
}

/// A miss of [`plan_layer_counts`]: what its priority needs (step 3 of the module docs).
#[derive(Debug, Clone, Copy)]
struct CountedMiss {
    prev: Option<u64>,
    expert: u32,
    tokens: u32,
}

/// The buffers [`plan_layer_counts`] reuses from call to call, so that planning a layer
/// allocates nothing once they have grown to the largest layer.
#[derive(Debug, Clone, Default)]
pub struct PlanScratch {
    /// Every routed expert of the layer, sorted.
    routed: Vec<u32>,
    /// The union, ascending.
    union: Vec<u32>,
    /// Tokens routed to each expert of `union`.
    tokens: Vec<u32>,
    misses: Vec<CountedMiss>,
}

impl PlanScratch {
    /// The last planned layer's union (ascending) and the tokens routed to each expert.
    pub fn union_tokens(&self) -> impl Iterator<Item = (u32, usize)> + '_ {
        self.union
            .iter()
            .zip(&self.tokens)
            .map(|(&e, &t)| (e, t as usize))
    }

    fn union_of(&mut self, routes: &[TokenRoute]) {
        self.routed.clear();
        for r in routes {
            // As `union_of` pairs them: an expert without a weight is not routed.
            self.routed
                .extend_from_slice(&r.experts[..r.experts.len().min(r.weights.len())]);
        }
        self.routed.sort_unstable();
        self.union.clear();
        self.tokens.clear();
        for &e in &self.routed {
            if self.union.last() == Some(&e) {
                *self.tokens.last_mut().expect("pushed with the union") += 1;
            } else {
                self.union.push(e);
                self.tokens.push(1);
            }
        }
    }
}

/// [`plan_layer_placed`], counted: the same lookups, admissions and evictions in the same
/// order, so the cache ends in the same state, but only the counts of the plan come back
/// and nothing is allocated once `scratch` is warm. The simulator and the counting
/// simulation, which need no token lists, plan with it; a test holds it to
/// [`plan_layer_placed`].
pub fn plan_layer_counts(
    layer: usize,
    routes: &[TokenRoute],
    cache: &mut ExpertCache,
    placement: LayerPlacement,
    scratch: &mut PlanScratch,
) -> PlanCounts {
    scratch.union_of(routes);
    let (experts, routings) = (scratch.union.len(), scratch.routed.len());
    let fetch_fraction = match placement {
        LayerPlacement::Cached { fetch_fraction } => fetch_fraction,
        LayerPlacement::Resident => {
            return PlanCounts {
                hits: experts,
                hit_tokens: routings,
                ..PlanCounts::default()
            }
        }
        LayerPlacement::CpuOnly => {
            return PlanCounts {
                cpu: experts,
                cpu_tokens: routings,
                ..PlanCounts::default()
            }
        }
    };
    let mut c = PlanCounts::default();
    let PlanScratch {
        union,
        tokens,
        misses,
        ..
    } = scratch;
    misses.clear();
    for (&e, &t) in union.iter().zip(tokens.iter()) {
        let id = ExpertId::new(layer, e as usize);
        let prev = cache.last_request(id);
        if cache.lookup(id).is_some() {
            c.hits += 1;
            c.hit_tokens += t as usize;
        } else {
            misses.push(CountedMiss {
                prev,
                expert: e,
                tokens: t,
            });
        }
    }
    let admission = cache.admission();
    let n_fetch = fetch_count(fetch_fraction, misses.len());
    // plan_layer's orders; the expert breaks every tie, so an unstable sort gives the same
    // order, and with nothing fetched the order changes nothing.
    match admission.order {
        _ if n_fetch == 0 => {}
        AdmissionOrder::Tokens => misses.sort_unstable_by(|a, b| {
            (b.tokens.cmp(&a.tokens))
                .then(b.prev.cmp(&a.prev))
                .then(a.expert.cmp(&b.expert))
        }),
        AdmissionOrder::Recent => misses.sort_unstable_by(|a, b| {
            (b.prev.cmp(&a.prev))
                .then(b.tokens.cmp(&a.tokens))
                .then(a.expert.cmp(&b.expert))
        }),
        AdmissionOrder::Order => {}
    }
    let pinned = |x: ExpertId| x.layer as usize == layer && union.binary_search(&x.expert).is_ok();
    for m in &misses[..n_fetch] {
        match cache.admit(ExpertId::new(layer, m.expert as usize), pinned) {
            Ok(_) => {
                c.fetched += 1;
                c.fetched_tokens += m.tokens as usize;
            }
            Err(_) => {
                c.uncached += 1;
                c.uncached_tokens += m.tokens as usize;
            }
        }
    }
    for m in &misses[n_fetch..] {
        c.cpu += 1;
        c.cpu_tokens += m.tokens as usize;
        if !admission.cpu_history {
            cache.restore_request(ExpertId::new(layer, m.expert as usize), m.prev);
        }
    }
    c
}

/// Most chunks a layer's fetched experts are gathered and computed in (one device buffer of
/// output rows each).
pub const MAX_FETCH_CHUNKS: usize = 4;

/// The chunks a layer's `fetched` experts are gathered and computed in: index ranges in
/// gather order covering `0..fetched` (one empty range when there are none, which zeroes the
/// output rows). Each chunk's copies are followed by an event and its kernel runs as soon as
/// they land, so only the last chunk's kernel follows the last copy: the part of an offload
/// layer that cannot overlap the link. The runtime gathers and computes in these chunks, and
/// the analytic model and the simulator time a layer's fetched kernels by them. The chunks
/// therefore shrink towards the end: from the last, 1, 2, 4 ... experts while what is left
/// is at least twice the next size, the first chunk taking the rest, at most
/// [`MAX_FETCH_CHUNKS`]. A chunk's kernel (a few us per expert at decode, about 5 us of
/// launch on the H200 machine, `experiments/gpu-backend`) is far shorter than the next
/// chunk's copies (about 50 us per 2.77 MB expert), so the GPU keeps up; the last kernel is
/// one expert's instead of a quarter of the layer's.
pub fn fetch_chunk_bounds(fetched: usize) -> Vec<std::ops::Range<usize>> {
    fetch_chunk_bounds_at_most(fetched, MAX_FETCH_CHUNKS)
}

/// [`fetch_chunk_bounds`] with at most `max_chunks` chunks (1 to [`MAX_FETCH_CHUNKS`];
/// others are clamped into that range): the same rule with fewer, larger chunks. Each chunk
/// is one submission of copies, and on the H200 machine each costs the link a few
/// microseconds beyond its bytes, so fewer chunks trade link time for a longer last kernel.
pub fn fetch_chunk_bounds_at_most(
    fetched: usize,
    max_chunks: usize,
) -> Vec<std::ops::Range<usize>> {
    let max_chunks = max_chunks.clamp(1, MAX_FETCH_CHUNKS);
    let mut tail = Vec::new(); // sizes, from the last chunk back
    let mut rest = fetched;
    let mut size = 1;
    while tail.len() + 1 < max_chunks && rest >= 2 * size {
        tail.push(size);
        rest -= size;
        size *= 2;
    }
    let mut start = 0;
    std::iter::once(rest)
        .chain(tail.into_iter().rev())
        .map(|len| {
            let r = start..start + len;
            start += len;
            r
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fetched_experts_split_into_chunks_that_shrink_to_one() {
        let sizes = |n| -> Vec<usize> { fetch_chunk_bounds(n).iter().map(|r| r.len()).collect() };
        assert_eq!(sizes(0), [0]);
        assert_eq!(sizes(1), [1]);
        assert_eq!(sizes(2), [1, 1]);
        assert_eq!(sizes(3), [2, 1]);
        assert_eq!(sizes(6), [3, 2, 1]);
        assert_eq!(sizes(7), [4, 2, 1]);
        assert_eq!(sizes(38), [31, 4, 2, 1]);
        let at_most = |n, m| -> Vec<usize> {
            fetch_chunk_bounds_at_most(n, m)
                .iter()
                .map(|r| r.len())
                .collect()
        };
        assert_eq!(at_most(6, 1), [6]);
        assert_eq!(at_most(6, 2), [5, 1]);
        assert_eq!(at_most(6, 3), [3, 2, 1]);
        assert_eq!(at_most(38, 0), [38]);
        assert_eq!(at_most(38, 9), [31, 4, 2, 1]);
        for n in 0..100 {
            for m in 1..=MAX_FETCH_CHUNKS {
                let b = fetch_chunk_bounds_at_most(n, m);
                let flat: Vec<usize> = b.iter().flat_map(|r| r.clone()).collect();
                assert_eq!(flat, (0..n).collect::<Vec<_>>(), "{n} {m}");
                assert!((1..=m).contains(&b.len()), "{n} {m}: {b:?}");
            }
        }
        for n in 0..200 {
            let b = fetch_chunk_bounds(n);
            // Every expert once, in gather order; at most MAX_FETCH_CHUNKS, none empty but
            // the only one of an empty layer.
            let flat: Vec<usize> = b.iter().flat_map(|r| r.clone()).collect();
            assert_eq!(flat, (0..n).collect::<Vec<_>>(), "{n}");
            assert!((1..=MAX_FETCH_CHUNKS).contains(&b.len()));
            assert!(n == 0 || b.iter().all(|r| !r.is_empty()), "{n}: {b:?}");
            // The last chunk is one expert as soon as there are two; after the first, each
            // chunk is half the one before, and the first is at least the second.
            if n >= 2 {
                assert_eq!(b.last().unwrap().len(), 1, "{n}");
                assert!(b[0].len() >= b[1].len(), "{n}: {b:?}");
            }
            for w in b[1..].windows(2) {
                assert_eq!(w[1].len() * 2, w[0].len(), "{n}: {b:?}");
            }
        }
    }
    use crate::cache::CachePolicy;
    use crate::geometry::MoeGeometry;
    use rand::rngs::StdRng;
    use rand::{Rng, SeedableRng};
    use std::collections::{BTreeMap, BTreeSet};

    fn geo(experts: usize, top_k: usize, layers: usize) -> MoeGeometry {
        MoeGeometry::routing_test(experts, top_k, layers)
    }

    fn route(experts: &[u32]) -> TokenRoute {
        let w = 1.0 / experts.len() as f32;
        TokenRoute {
            experts: experts.to_vec(),
            weights: vec![w; experts.len()],
        }
    }

    /// `streams` routes of `top_k` distinct experts each, drawn as the square root of a
    /// uniform draw below `span` (low ids are routed more often).
    fn skewed_routes(rng: &mut StdRng, streams: usize, top_k: usize, span: u32) -> Vec<TokenRoute> {
        (0..streams)
            .map(|_| {
                let mut ids = Vec::new();
                while ids.len() < top_k {
                    let e = (rng.random_range(0..span) as f64).sqrt() as u32;
                    if !ids.contains(&e) {
                        ids.push(e);
                    }
                }
                route(&ids)
            })
            .collect()
    }

    /// The slow reference planner: maps and sets, brute-force fetch count, selection sort.
    fn naive_plan(
        layer: usize,
        routes: &[TokenRoute],
        cache: &mut ExpertCache,
        f: f64,
    ) -> LayerPlan {
        let mut union: BTreeMap<u32, Vec<(u32, f32)>> = BTreeMap::new();
        for (s, r) in routes.iter().enumerate() {
            for (&e, &w) in r.experts.iter().zip(&r.weights) {
                union.entry(e).or_default().push((s as u32, w));
            }
        }
        let needed: BTreeSet<ExpertId> = union
            .keys()
            .map(|&e| ExpertId::new(layer, e as usize))
            .collect();
        let mut plan = LayerPlan {
            layer,
            ..LayerPlan::default()
        };
        let mut misses = Vec::new();
        for (&e, tokens) in &union {
            let id = ExpertId::new(layer, e as usize);
            let prev = cache.last_request(id);
            match cache.lookup(id) {
                Some(slot) => plan.hits.push(ExpertWork {
                    id,
                    slot: Some(slot),
                    tokens: tokens.clone(),
                }),
                None => misses.push((id, prev, tokens.clone())),
            }
        }
        let m = misses.len();
        let f = f.clamp(0.0, 1.0);
        let cost = |x: usize| (x as f64 * (1.0 - f)).max((m - x) as f64 * f);
        let n_fetch = (0..=m)
            .min_by(|&a, &b| cost(a).partial_cmp(&cost(b)).unwrap().then(a.cmp(&b)))
            .unwrap();
        let admission = cache.admission();
        let better = |a: &(ExpertId, Option<u64>, Vec<(u32, f32)>),
                      b: &(ExpertId, Option<u64>, Vec<(u32, f32)>)| {
            let (ra, rb) = (a.1.map_or(0, |t| t + 1), b.1.map_or(0, |t| t + 1));
            let keys = match admission.order {
                AdmissionOrder::Tokens => [(a.2.len(), b.2.len()), (ra as usize, rb as usize)],
                AdmissionOrder::Recent => [(ra as usize, rb as usize), (a.2.len(), b.2.len())],
                AdmissionOrder::Order => [(0, 0), (0, 0)],
            };
            for (x, y) in keys {
                if x != y {
                    return x > y;
                }
            }
            a.0 < b.0
        };
        for _ in 0..n_fetch {
            let mut best = 0;
            for i in 1..misses.len() {
                if better(&misses[i], &misses[best]) {
                    best = i;
                }
            }
            let (id, _, tokens) = misses.remove(best);
            match cache.admit(id, |x| needed.contains(&x)) {
                Ok(a) => plan.fetched.push(FetchWork {
                    id,
                    slot: a.slot,
                    evicted: a.evicted,
                    tokens,
                }),
                Err(_) => plan.uncached.push(ExpertWork {
                    id,
                    slot: None,
                    tokens,
                }),
            }
        }
        misses.sort_by_key(|m| m.0);
        if !admission.cpu_history {
            for (id, prev, _) in &misses {
                cache.restore_request(*id, *prev);
            }
        }
        plan.cpu = misses
            .into_iter()
            .map(|(id, _, tokens)| ExpertWork {
                id,
                slot: None,
                tokens,
            })
            .collect();
        plan
    }

    #[test]
    fn fetch_count_is_the_balanced_rounding() {
        for m in 0..60usize {
            for i in 0..=40 {
                let f = i as f64 / 40.0;
                let cost = |x: usize| (x as f64 * (1.0 - f)).max((m - x) as f64 * f);
                let brute = (0..=m)
                    .min_by(|&a, &b| cost(a).partial_cmp(&cost(b)).unwrap().then(a.cmp(&b)))
                    .unwrap();
                assert_eq!(fetch_count(f, m), brute, "f={f} m={m}");
                let x = f * m as f64;
                let got = fetch_count(f, m) as f64;
                assert!(got == x.floor() || got == x.ceil(), "f={f} m={m}");
            }
            assert_eq!(fetch_count(1.0, m), m);
            assert_eq!(fetch_count(0.0, m), 0);
            assert_eq!(fetch_count(f64::NAN, m), 0);
            assert_eq!(fetch_count(2.0, m), m);
        }
        assert_eq!(fetch_count(0.277, 10), 3);
        assert_eq!(fetch_count(0.25, 10), 2, "2.5: the tie goes to the lower");
    }

    #[test]
    fn plan_matches_the_naive_planner() {
        let g = geo(16, 3, 4);
        let policies = [
            CachePolicy::Lru,
            CachePolicy::Lfu { decay_every: 0 },
            CachePolicy::Lfu { decay_every: 13 },
            CachePolicy::StaticHot { hot: Vec::new() },
        ];
        let mut checked = [0usize; 4];
        for (pi, policy) in policies.iter().enumerate() {
            for slots in [0, 2, 3, 7, 20, 64] {
                for f in [0.0, 0.25, 0.5, 0.7, 1.0] {
                    let mut rng = StdRng::seed_from_u64(slots as u64 * 31 + (f * 8.0) as u64);
                    let mut fast = ExpertCache::new(policy, &g, slots).unwrap();
                    let mut slow = fast.clone();
                    for step in 0..60 {
                        let streams = rng.random_range(1..=5);
                        for layer in 0..g.moe_layers {
                            let routes = skewed_routes(&mut rng, streams, g.top_k, 256);
                            let a = plan_layer(layer, &routes, &mut fast, f);
                            let b = naive_plan(layer, &routes, &mut slow, f);
                            assert_eq!(a, b, "{policy:?} slots={slots} f={f} step={step}");
                            let ra: Vec<_> = fast.resident().collect();
                            let rb: Vec<_> = slow.resident().collect();
                            assert_eq!(ra, rb);
                            // Invariants.
                            let union: BTreeSet<ExpertId> = a
                                .hits
                                .iter()
                                .map(|w| w.id)
                                .chain(a.fetched.iter().map(|w| w.id))
                                .chain(a.uncached.iter().map(|w| w.id))
                                .chain(a.cpu.iter().map(|w| w.id))
                                .collect();
                            assert_eq!(union.len(), a.unique(), "an expert planned twice");
                            for w in &a.fetched {
                                if let Some(v) = w.evicted {
                                    assert!(
                                        !union.contains(&v),
                                        "evicted {v}, needed by the layer"
                                    );
                                }
                                assert_eq!(fast.slot_of(w.id), Some(w.slot));
                            }
                            for w in a.cpu.iter().chain(&a.uncached) {
                                assert!(!fast.contains(w.id), "{} not fetched yet cached", w.id);
                            }
                            for w in &a.hits {
                                assert_eq!(fast.slot_of(w.id), w.slot);
                            }
                            let tokens: usize =
                                a.token_counts().0 + a.token_counts().1 + a.token_counts().2;
                            assert_eq!(tokens, streams * g.top_k);
                            checked[pi] += 1;
                        }
                    }
                }
            }
        }
        assert!(checked.iter().all(|&c| c > 1000));
    }

    /// Every admission against the naive planner, on random routes, cache sizes, topologies,
    /// policies and fetch fractions: the same plans and the same cache, step after step.
    mod admission_props {
        use super::{
            geo, naive_plan, skewed_routes, AdmissionOrder, AdmissionPolicy, CachePolicy,
            ExpertCache, StdRng,
        };
        use crate::cache::CacheTopology;
        use crate::plan::plan_layer;
        use proptest::prelude::*;
        use rand::{Rng, SeedableRng};

        fn admission() -> impl Strategy<Value = AdmissionPolicy> {
            (0..3usize, any::<bool>()).prop_map(|(o, cpu_history)| AdmissionPolicy {
                order: [
                    AdmissionOrder::Tokens,
                    AdmissionOrder::Recent,
                    AdmissionOrder::Order,
                ][o],
                cpu_history,
            })
        }

        proptest! {
            #![proptest_config(ProptestConfig::with_cases(64))]
            #[test]
            fn plans_match_the_naive_planner(
                admission in admission(),
                per_layer in any::<bool>(),
                slots_per_layer in 0usize..6,
                lfu in any::<bool>(),
                f in 0.0f64..=1.0,
                seed in any::<u64>(),
            ) {
                let g = geo(12, 3, 3);
                let topology = if per_layer { CacheTopology::PerLayer } else { CacheTopology::Global };
                let policy = if lfu { CachePolicy::Lfu { decay_every: 7 } } else { CachePolicy::Lru };
                let mut fast = ExpertCache::with_topology(&policy, &g, slots_per_layer * 3, topology).unwrap();
                fast.set_admission(admission);
                let mut slow = fast.clone();
                let mut rng = StdRng::seed_from_u64(seed);
                for step in 0..25 {
                    let streams = rng.random_range(1..=4);
                    for layer in 0..g.moe_layers {
                        let routes = skewed_routes(&mut rng, streams, g.top_k, 144);
                        let a = plan_layer(layer, &routes, &mut fast, f);
                        let b = naive_plan(layer, &routes, &mut slow, f);
                        prop_assert_eq!(&a, &b, "step {}", step);
                        for w in &a.cpu {
                            prop_assert_eq!(fast.last_request(w.id), slow.last_request(w.id));
                        }
                        let ra: Vec<_> = fast.resident().collect();
                        let rb: Vec<_> = slow.resident().collect();
                        prop_assert_eq!(ra, rb);
                    }
                }
            }
        }
    }

    #[test]
    fn admission_orders_pick_the_misses_they_say() {
        let g = geo(8, 1, 1);
        // 3 and 5 requested before (5 more recently), on the CPU; then 4 misses at f = 0.5,
        // expert 0 with two tokens.
        let setup = |a: AdmissionPolicy| {
            let mut cache = ExpertCache::new(&CachePolicy::Lru, &g, 8).unwrap();
            cache.set_admission(a);
            plan_layer(0, &[route(&[3])], &mut cache, 0.0);
            plan_layer(0, &[route(&[5])], &mut cache, 0.0);
            let routes = [
                route(&[0]),
                route(&[0]),
                route(&[3]),
                route(&[5]),
                route(&[1]),
            ];
            let p = plan_layer(0, &routes, &mut cache, 0.5);
            let ids: Vec<u32> = p.fetched.iter().map(|w| w.id.expert).collect();
            ids
        };
        let with = |order, cpu_history| AdmissionPolicy { order, cpu_history };
        assert_eq!(setup(with(AdmissionOrder::Tokens, true)), vec![0, 5]);
        assert_eq!(setup(with(AdmissionOrder::Recent, true)), vec![5, 3]);
        assert_eq!(setup(with(AdmissionOrder::Order, true)), vec![0, 1]);
        // Without the CPU's history 3 and 5 were never requested: tokens, then ids.
        assert_eq!(setup(with(AdmissionOrder::Recent, false)), vec![0, 1]);
        assert_eq!(setup(with(AdmissionOrder::Tokens, false)), vec![0, 1]);
    }

    #[test]
    fn admission_parses_its_names_and_refuses_others() {
        for (text, order, cpu_history) in [
            ("tokens", AdmissionOrder::Tokens, true),
            ("Recent", AdmissionOrder::Recent, true),
            ("order,cached-history", AdmissionOrder::Order, false),
            ("recent, cached-history", AdmissionOrder::Recent, false),
        ] {
            let a: AdmissionPolicy = text.parse().unwrap();
            assert_eq!(a, AdmissionPolicy { order, cpu_history }, "{text}");
            assert_eq!(a.to_string().parse::<AdmissionPolicy>().unwrap(), a);
        }
        assert!("weights"
            .parse::<AdmissionPolicy>()
            .unwrap_err()
            .to_string()
            .contains("tokens"));
        let e = "recent,forget"
            .parse::<AdmissionPolicy>()
            .unwrap_err()
            .to_string();
        assert!(e.contains("forget") && e.contains("--admission"), "{e}");
        let t: AdmissionPolicy = toml::from_str("order = \"recent\"\ncpu-history = false").unwrap();
        assert_eq!(t, "recent,cached-history".parse().unwrap());
        assert!(toml::from_str::<AdmissionPolicy>("orders = \"recent\"").is_err());
    }

    /// The model can predict hybrid missing less than offload: on the `typical` process
    /// (temporal locality, weak static skew) with a small per-layer cache, offload lets every
    /// one-off expert evict part of the working set, while hybrid admitting its recently
    /// requested misses keeps it. (At one stream every miss has one token, so the default
    /// `tokens` order falls through to recency and picks the same misses.)
    #[test]
    fn recent_admission_misses_less_than_offload_on_typical() {
        use crate::cache::CacheTopology;
        use crate::routing::RoutingSource;
        use crate::traffic::{run_traffic, TrafficConfig};
        let g = geo(128, 8, 4);
        let cfg = TrafficConfig {
            warmup_steps: 100,
            steps: 400,
            streams: 1,
        };
        let miss = |f: f64, admission: AdmissionPolicy| {
            let process = crate::routing::RoutingProcess::preset("typical").unwrap();
            let mut src = crate::routing::SyntheticRouting::new(&process, g).unwrap();
            let mut cache = ExpertCache::with_topology(
                &CachePolicy::Lru,
                src.geometry(),
                16 * 4,
                CacheTopology::PerLayer,
            )
            .unwrap();
            cache.set_admission(admission);
            run_traffic(&mut src, &mut cache, f, &cfg)
                .unwrap()
                .total
                .miss_rate
        };
        let recent = AdmissionPolicy {
            order: AdmissionOrder::Recent,
            cpu_history: true,
        };
        let offload = miss(1.0, AdmissionPolicy::default());
        let hybrid = miss(0.5, recent);
        assert!(hybrid < offload - 0.01, "hybrid {hybrid} offload {offload}");
        assert_eq!(miss(0.5, AdmissionPolicy::default()), hybrid);
    }

    /// The counted planner against the plan it counts: same counts, same cache after every
    /// layer, for every placement, policy, admission, cache size and fetch fraction.
    #[test]
    fn counted_plan_matches_the_plan() {
        let g = geo(16, 3, 4);
        let policies = [
            CachePolicy::Lru,
            CachePolicy::Lfu { decay_every: 13 },
            CachePolicy::StaticHot { hot: Vec::new() },
        ];
        let admissions = [
            AdmissionPolicy::default(),
            AdmissionPolicy {
                order: AdmissionOrder::Recent,
                cpu_history: false,
            },
            AdmissionPolicy {
                order: AdmissionOrder::Order,
                cpu_history: true,
            },
        ];
        let mut scratch = PlanScratch::default();
        let mut checked = 0usize;
        for (policy, admission) in policies.iter().flat_map(|p| admissions.map(|a| (p, a))) {
            for slots in [0, 3, 7, 64] {
                for f in [0.0, 0.3, 0.5, 1.0] {
                    let mut rng = StdRng::seed_from_u64(slots as u64 * 17 + (f * 8.0) as u64);
                    let mut fast = ExpertCache::new(policy, &g, slots).unwrap();
                    fast.set_admission(admission);
                    let mut slow = fast.clone();
                    for step in 0..20 {
                        let streams = rng.random_range(1..=6);
                        for layer in 0..g.moe_layers {
                            let placement = match (step + layer) % 7 {
                                0 => LayerPlacement::Resident,
                                1 => LayerPlacement::CpuOnly,
                                _ => LayerPlacement::Cached { fetch_fraction: f },
                            };
                            let routes = skewed_routes(&mut rng, streams, g.top_k, 256);
                            let plan = plan_layer_placed(layer, &routes, &mut slow, placement);
                            let c = plan_layer_counts(
                                layer,
                                &routes,
                                &mut fast,
                                placement,
                                &mut scratch,
                            );
                            let at =
                                format!("{policy:?} {admission} slots={slots} f={f} step={step}");
                            assert_eq!(c, PlanCounts::of_plan(&plan), "{at}");
                            assert_eq!(c.layer_counts(), LayerCounts::of_plan(&plan), "{at}");
                            let ra: Vec<_> = fast.resident().collect();
                            let rb: Vec<_> = slow.resident().collect();
                            assert_eq!(ra, rb, "{at}");
                            assert_eq!(fast.stats(), slow.stats(), "{at}");
                            for e in 0..g.experts {
                                let id = ExpertId::new(layer, e);
                                assert_eq!(fast.last_request(id), slow.last_request(id), "{at}");
                            }
                            let union: Vec<(u32, usize)> = plan
                                .hits
                                .iter()
                                .chain(&plan.uncached)
                                .chain(&plan.cpu)
                                .map(|w| (w.id.expert, w.tokens.len()))
                                .chain(plan.fetched.iter().map(|w| (w.id.expert, w.tokens.len())))
                                .collect::<BTreeMap<_, _>>()
                                .into_iter()
                                .collect();
                            assert_eq!(scratch.union_tokens().collect::<Vec<_>>(), union);
                            checked += 1;
                        }
                    }
                }
            }
        }
        assert_eq!(checked, 3 * 3 * 4 * 4 * 20 * 4);
    }

    #[test]
    fn union_serves_every_stream_once() {
        let g = geo(8, 2, 1);
        let mut cache = ExpertCache::new(&CachePolicy::Lru, &g, 8).unwrap();
        let routes = [
            TokenRoute {
                experts: vec![3, 1],
                weights: vec![0.75, 0.25],
            },
            TokenRoute {
                experts: vec![1, 5],
                weights: vec![0.5, 0.5],
            },
        ];
        let p = plan_layer(0, &routes, &mut cache, 1.0);
        assert!(p.hits.is_empty() && p.cpu.is_empty() && p.uncached.is_empty());
        // Issue order: expert 1 has two tokens, then 3 and 5 (never requested: lower id).
        let ids: Vec<u32> = p.fetched.iter().map(|w| w.id.expert).collect();
        assert_eq!(ids, vec![1, 3, 5]);
        assert_eq!(p.fetched[0].tokens, vec![(0, 0.25), (1, 0.5)]);
        let p = plan_layer(0, &routes, &mut cache, 1.0);
        assert_eq!(p.hits.len(), 3);
        assert_eq!(p.misses(), 0);
    }

    #[test]
    fn hybrid_fetches_by_tokens_then_recency_and_caches_only_those() {
        let g = geo(8, 1, 1);
        let mut cache = ExpertCache::new(&CachePolicy::Lru, &g, 8).unwrap();
        // Request 6 then 2 on the CPU (f = 0): they stay out of the cache.
        let p = plan_layer(0, &[route(&[6])], &mut cache, 0.0);
        assert_eq!(p.cpu.len(), 1);
        plan_layer(0, &[route(&[2])], &mut cache, 0.0);
        assert!(cache.is_empty(), "cpu misses never enter the cache");
        // 4 misses of one token each at f = 0.5: two are fetched; 2 and 6 were requested
        // (2 more recently), 0 and 7 never.
        let routes = [route(&[0]), route(&[2]), route(&[6]), route(&[7])];
        let p = plan_layer(0, &routes, &mut cache, 0.5);
        let fetched: Vec<u32> = p.fetched.iter().map(|w| w.id.expert).collect();
        assert_eq!(fetched, vec![2, 6]);
        let cpu: Vec<u32> = p.cpu.iter().map(|w| w.id.expert).collect();
        assert_eq!(cpu, vec![0, 7]);
        assert_eq!(cache.len(), 2);
        // Most tokens first beats recency.
        let routes = [route(&[0]), route(&[7]), route(&[7])];
        let p = plan_layer(0, &routes, &mut cache, 0.5);
        assert_eq!(p.fetched.len(), 1);
        assert_eq!(p.fetched[0].id.expert, 7);
    }

    #[test]
    fn all_pinned_misses_are_staged_uncached() {
        let g = geo(8, 3, 2);
        let mut cache = ExpertCache::new(&CachePolicy::Lru, &g, 2).unwrap();
        let p = plan_layer(0, &[route(&[0, 1, 2])], &mut cache, 1.0);
        assert_eq!(p.fetched.len(), 2);
        assert_eq!(p.uncached.len(), 1);
        assert_eq!(p.uncached[0].id, ExpertId::new(0, 2));
        assert_eq!(p.link_experts(), 3);
        // The next layer may evict layer 0's experts.
        let p = plan_layer(1, &[route(&[0, 1, 2])], &mut cache, 1.0);
        assert_eq!(p.fetched.len(), 2);
        assert!(p
            .fetched
            .iter()
            .all(|w| w.evicted.map(|v| v.layer) == Some(0)));
    }

    #[test]
    fn resident_hits_everything_and_auto_is_refused() {
        let g = geo(8, 2, 3);
        let mut cache = crate::cache::build_cache(
            crate::StrategyKind::Resident,
            &CachePolicy::Lru,
            &g,
            1,
            None,
        )
        .unwrap();
        let f = fetch_fraction(&Strategy::Resident).unwrap();
        for l in 0..3 {
            let p = plan_layer(l, &[route(&[1, 7]), route(&[7, 4])], &mut cache, f);
            assert_eq!((p.hits.len(), p.misses()), (3, 0));
        }
        assert_eq!(fetch_fraction(&Strategy::Cpu).unwrap(), 0.0);
        assert_eq!(fetch_fraction(&Strategy::Offload).unwrap(), 1.0);
        let auto = Strategy::Hybrid {
            fetch: FetchFraction::Auto,
        };
        assert!(fetch_fraction(&auto).is_err());
    }

    /// A placed layer against the slow reading of its placement: a resident layer hits its
    /// whole union, a CPU-only one computes it on the CPU, neither touches the cache; a
    /// cached one is `plan_layer`. Layer split is refused by `fetch_fraction`.
    #[test]
    fn placed_layers_plan_their_whole_union_where_they_live() {
        let g = geo(8, 2, 2);
        let routes = [route(&[1, 7]), route(&[7, 4])];
        for placement in [LayerPlacement::Resident, LayerPlacement::CpuOnly] {
            let mut cache = ExpertCache::new(&CachePolicy::Lru, &g, 4).unwrap();
            let p = plan_layer_placed(1, &routes, &mut cache, placement);
            let (work, other) = match placement {
                LayerPlacement::Resident => (&p.hits, &p.cpu),
                _ => (&p.cpu, &p.hits),
            };
            let ids: Vec<u32> = work.iter().map(|w| w.id.expert).collect();
            assert_eq!(ids, vec![1, 4, 7]);
            assert!(work.iter().all(|w| w.id.layer == 1 && w.slot.is_none()));
            assert_eq!(work[2].tokens, vec![(0, 0.5), (1, 0.5)]);
            assert!(other.is_empty() && p.fetched.is_empty() && p.uncached.is_empty());
            assert!(cache.is_empty(), "{placement:?} left the cache alone");
        }
        let mut a = ExpertCache::new(&CachePolicy::Lru, &g, 4).unwrap();
        let mut b = a.clone();
        let cached = LayerPlacement::Cached {
            fetch_fraction: 0.5,
        };
        assert_eq!(
            plan_layer_placed(0, &routes, &mut a, cached),
            plan_layer(0, &routes, &mut b, 0.5)
        );
        let split = Strategy::LayerSplit {
            cpu_layers: crate::strategy::CpuLayers::Fixed(1),
        };
        assert!(fetch_fraction(&split).is_err());
    }
}
