//! The GPU expert cache: its slots, how they are shared between layers, and its replacement
//! policies.
//!
//! This is the one implementation of cache behaviour in `ft`: the runtime indexes its slot
//! memory by [`SlotId`], the simulator and [`crate::traffic`] count with the same object, so
//! their miss rates agree by construction. Every operation is O(1) (LRU) or O(log n) (LFU) in
//! the number of slots, apart from eviction skipping pinned experts (at most the experts of
//! one layer); it runs in the simulator's inner loop.
//!
//! Pinning: [`ExpertCache::admit`] never evicts an expert for which the `pinned` predicate
//! holds. [`crate::plan::plan_layer`] pins the experts of the layer being planned, so an
//! admission can never evict an expert the layer is about to compute. When every slot holds a
//! pinned expert (or a static hot set fills the cache) admission fails with a [`CacheError`]
//! and the plan computes that expert without caching it (see [`crate::plan::LayerPlan`]).
//!
//! Topology ([`CacheTopology`]): the slots form one pool shared by all layers (the default,
//! FreeToken's cache) or one equal partition per layer (llama.cpp's `--moe-expert-cache N`,
//! `N` slots per layer), where an expert can only evict an expert of its own layer. The two
//! differ most under the LRU cliff (see `docs/routing.md`): a global pool lets a layer that
//! needs more take slots from one that needs fewer, a partition cannot starve a layer.

use serde::{Deserialize, Serialize};
use std::collections::BTreeSet;
use std::fmt;
use std::str::FromStr;
use thiserror::Error;

use crate::error::{ModelError, Result};
use crate::geometry::{ExpertId, MoeGeometry};
use crate::plan::AdmissionPolicy;
use crate::strategy::StrategyKind;

/// Bytes in one GiB (`--cache-gb` counts in GiB).
pub const GIB: u64 = 1 << 30;

/// Marks "no slot" / "no expert" in the flat index tables.
const NONE: u32 = u32::MAX;

/// Take slot `s` out of one part's LRU list (`prev`/`next` the links of every slot, `head`
/// the most recent of the part, `tail` the least); its links are left at [`NONE`].
fn lru_unlink(prev: &mut [u32], next: &mut [u32], head: &mut u32, tail: &mut u32, s: u32) {
    let (p, n) = (prev[s as usize], next[s as usize]);
    if p != NONE {
        next[p as usize] = n;
    } else {
        *head = n;
    }
    if n != NONE {
        prev[n as usize] = p;
    } else {
        *tail = p;
    }
    prev[s as usize] = NONE;
    next[s as usize] = NONE;
}

/// Put slot `s`, in no list, at the front (most recent) of one part's LRU list.
fn lru_push_front(prev: &mut [u32], next: &mut [u32], head: &mut u32, tail: &mut u32, s: u32) {
    prev[s as usize] = NONE;
    next[s as usize] = *head;
    if *head != NONE {
        prev[*head as usize] = s;
    }
    *head = s;
    if *tail == NONE {
        *tail = s;
    }
}

/// A slot of the GPU expert cache (an index into the runtime's slot memory).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct SlotId(pub u32);

impl SlotId {
    /// The slot as an index.
    pub fn index(self) -> usize {
        self.0 as usize
    }
}

impl fmt::Display for SlotId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "S{}", self.0)
    }
}

/// Replacement policy of the expert cache.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "kebab-case", deny_unknown_fields)]
pub enum CachePolicy {
    /// Least recently used: a hit or an admission makes the expert most recent; the victim is
    /// the least recent expert that is not pinned.
    #[default]
    Lru,
    /// Least frequently used, counted while resident: an admission starts the count at 1 and
    /// each hit adds 1; the victim is the unpinned expert of the lowest count, ties to the one
    /// least recently used (hit or admitted). Counts restart from 1 after an eviction.
    Lfu {
        /// Aging: after every `decay_every` lookups all counts are halved (rounding down), so
        /// that experts popular long ago give way. 0 (the default) never ages. Each halving
        /// costs O(slots log slots).
        #[serde(default)]
        decay_every: u64,
    },
    /// A fixed hot set that never changes: hits are served, nothing is ever evicted, and a miss
    /// is admitted only while a slot is still free.
    StaticHot {
        /// The hot set. Empty (the default): chosen as the most popular experts from a warm-up
        /// or a routing popularity ([`hot_set`], [`build_cache`]).
        #[serde(default)]
        hot: Vec<ExpertId>,
    },
}

impl CachePolicy {
    /// Names accepted by [`CachePolicy::from_str`].
    pub const NAMES: [&'static str; 3] = ["lru", "lfu", "static-hot"];

    /// The policy's name (as in `kind`).
    pub fn name(&self) -> &'static str {
        match self {
            CachePolicy::Lru => "lru",
            CachePolicy::Lfu { .. } => "lfu",
            CachePolicy::StaticHot { .. } => "static-hot",
        }
    }
}

impl fmt::Display for CachePolicy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            CachePolicy::Lfu { decay_every } if *decay_every > 0 => {
                write!(f, "lfu(decay every {decay_every})")
            }
            CachePolicy::StaticHot { hot } if !hot.is_empty() => {
                write!(f, "static-hot({} experts)", hot.len())
            }
            other => f.write_str(other.name()),
        }
    }
}

impl FromStr for CachePolicy {
    type Err = ModelError;

    /// Parse a policy name with default parameters (`lru`, `lfu`, `static-hot`).
    fn from_str(s: &str) -> Result<Self> {
        match s.to_ascii_lowercase().as_str() {
            "lru" => Ok(CachePolicy::Lru),
            "lfu" => Ok(CachePolicy::Lfu { decay_every: 0 }),
            "static-hot" | "static_hot" => Ok(CachePolicy::StaticHot { hot: Vec::new() }),
            _ => Err(ModelError::UnknownName {
                kind: "cache policy",
                name: s.to_string(),
                known: Self::NAMES.join(", "),
            }),
        }
    }
}

/// How the cache's slots are shared between layers.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum CacheTopology {
    /// One pool shared by all layers: an admission may evict an expert of any layer.
    #[default]
    Global,
    /// Equal partitions, one per layer (slots `l * n .. (l + 1) * n` belong to layer `l`, with
    /// `n` = slots / layers): an admission evicts only an expert of its own layer.
    PerLayer,
}

impl CacheTopology {
    /// Names accepted by [`CacheTopology::from_str`].
    pub const NAMES: [&'static str; 2] = ["global", "per-layer"];

    /// The topology's name.
    pub fn name(self) -> &'static str {
        match self {
            CacheTopology::Global => "global",
            CacheTopology::PerLayer => "per-layer",
        }
    }

    /// Partitions of a cache for `layers` layers (1 for a global pool).
    pub fn partitions(self, layers: usize) -> usize {
        match self {
            CacheTopology::Global => 1,
            CacheTopology::PerLayer => layers,
        }
    }
}

impl fmt::Display for CacheTopology {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for CacheTopology {
    type Err = ModelError;

    fn from_str(s: &str) -> Result<Self> {
        match s.to_ascii_lowercase().as_str() {
            "global" => Ok(CacheTopology::Global),
            "per-layer" | "per_layer" => Ok(CacheTopology::PerLayer),
            _ => Err(ModelError::UnknownName {
                kind: "cache topology",
                name: s.to_string(),
                known: Self::NAMES.join(", "),
            }),
        }
    }
}

/// Why the cache refused an operation.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum CacheError {
    /// Admitting an expert that is already resident.
    #[error("expert {id} is already resident in slot {slot}")]
    AlreadyResident { id: ExpertId, slot: SlotId },
    /// Every slot holds a pinned expert (the layer being planned needs more experts than the
    /// cache has slots).
    #[error(
        "no slot for expert {id}: all {slots} slots hold experts pinned by the layer being planned"
    )]
    AllPinned { id: ExpertId, slots: usize },
    /// No free slot, and the policy does not evict (static hot set), or the cache has 0 slots.
    #[error("no free slot for expert {id}: the {policy} cache's {slots} slots are full and it never evicts")]
    Full {
        id: ExpertId,
        slots: usize,
        policy: &'static str,
    },
    /// An expert outside the geometry the cache was built for.
    #[error("expert {id} is outside the cache's geometry ({layers} layers x {experts} experts)")]
    OutOfRange {
        id: ExpertId,
        layers: usize,
        experts: usize,
    },
    /// More slots than the model has experts.
    #[error("{slots} cache slots are more than the model's {total} routed experts")]
    TooManySlots { slots: usize, total: usize },
    /// A per-layer cache whose slots do not divide equally between the layers.
    #[error("{slots} cache slots do not divide into {layers} equal per-layer partitions")]
    UnevenPartition { slots: usize, layers: usize },
}

impl From<CacheError> for ModelError {
    fn from(e: CacheError) -> Self {
        ModelError::invalid("cache", e.to_string())
    }
}

/// A successful admission.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Admission {
    /// The slot the expert now occupies (the runtime copies its weights there).
    pub slot: SlotId,
    /// The expert that occupied the slot before, if any.
    pub evicted: Option<ExpertId>,
}

/// Counters of cache operations since creation or [`ExpertCache::reset_stats`]
/// ([`ExpertCache::warm_with`] is not counted).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct CacheStats {
    /// Calls to [`ExpertCache::lookup`].
    pub lookups: u64,
    /// Lookups that found the expert resident.
    pub hits: u64,
    /// Successful admissions.
    pub admissions: u64,
    /// Admissions that evicted another expert.
    pub evictions: u64,
    /// Admissions refused ([`CacheError::AllPinned`] or [`CacheError::Full`]).
    pub rejected: u64,
}

impl CacheStats {
    /// Hits over lookups (0 when there were none).
    pub fn hit_rate(&self) -> f64 {
        if self.lookups == 0 {
            0.0
        } else {
            self.hits as f64 / self.lookups as f64
        }
    }
}

/// Policy-specific bookkeeping, one order per partition (slot-indexed arrays are shared).
#[derive(Debug, Clone)]
enum Order {
    /// Doubly linked lists over slots, most recent at `head[partition]`.
    Lru {
        prev: Vec<u32>,
        next: Vec<u32>,
        head: Vec<u32>,
        tail: Vec<u32>,
    },
    /// Count and last-use tick per slot, and per partition the ordered set of
    /// (count, tick, slot).
    Lfu {
        decay_every: u64,
        count: Vec<u64>,
        last: Vec<u64>,
        set: Vec<BTreeSet<(u64, u64, u32)>>,
    },
    /// No order: nothing is evicted.
    Static,
}

/// The expert cache: `capacity` slots, shared by all layers or partitioned per layer
/// ([`CacheTopology`]).
#[derive(Debug, Clone)]
pub struct ExpertCache {
    policy: CachePolicy,
    topology: CacheTopology,
    experts: usize,
    layers: usize,
    capacity: usize,
    /// Slots of each partition (`capacity` for a global pool).
    per_part: usize,
    /// Slot of each expert (flat index), or `NONE`.
    slot_of: Vec<u32>,
    /// Expert (flat index) in each slot, or `NONE`.
    owner: Vec<u32>,
    /// Free slots of each partition, lowest on top.
    free: Vec<Vec<u32>>,
    /// Resident experts.
    resident: usize,
    order: Order,
    /// Operation counter (lookups and admissions), from 1.
    tick: u64,
    /// Tick of each expert's last lookup (hit or miss), 0 if never.
    last_request: Vec<u64>,
    /// Which misses a partial fetch admits ([`crate::plan::plan_layer`] reads it).
    admission: AdmissionPolicy,
    stats: CacheStats,
}

impl ExpertCache {
    /// An empty cache of `slots` slots shared by all layers ([`CacheTopology::Global`]). A
    /// static hot set given in the policy is admitted at once (it must fit).
    pub fn new(
        policy: &CachePolicy,
        geometry: &MoeGeometry,
        slots: usize,
    ) -> std::result::Result<Self, CacheError> {
        Self::with_topology(policy, geometry, slots, CacheTopology::Global)
    }

    /// An empty cache of `slots` slots in all, shared as `topology` says: for
    /// [`CacheTopology::PerLayer`], `slots` must be a multiple of the layer count (each layer
    /// gets `slots / moe_layers`). A static hot set given in the policy is admitted at once
    /// (it must fit, per layer for a partitioned cache).
    pub fn with_topology(
        policy: &CachePolicy,
        geometry: &MoeGeometry,
        slots: usize,
        topology: CacheTopology,
    ) -> std::result::Result<Self, CacheError> {
        let total = geometry.experts * geometry.moe_layers;
        if slots > total {
            return Err(CacheError::TooManySlots { slots, total });
        }
        let parts = topology.partitions(geometry.moe_layers).max(1);
        if !slots.is_multiple_of(parts) {
            return Err(CacheError::UnevenPartition {
                slots,
                layers: geometry.moe_layers,
            });
        }
        let per_part = slots / parts;
        let order = match policy {
            CachePolicy::Lru => Order::Lru {
                prev: vec![NONE; slots],
                next: vec![NONE; slots],
                head: vec![NONE; parts],
                tail: vec![NONE; parts],
            },
            CachePolicy::Lfu { decay_every } => Order::Lfu {
                decay_every: *decay_every,
                count: vec![0; slots],
                last: vec![0; slots],
                set: vec![BTreeSet::new(); parts],
            },
            CachePolicy::StaticHot { .. } => Order::Static,
        };
        let mut cache = ExpertCache {
            policy: policy.clone(),
            topology,
            experts: geometry.experts,
            layers: geometry.moe_layers,
            capacity: slots,
            per_part,
            slot_of: vec![NONE; total],
            owner: vec![NONE; slots],
            free: (0..parts)
                .map(|p| {
                    ((p * per_part) as u32..((p + 1) * per_part) as u32)
                        .rev()
                        .collect()
                })
                .collect(),
            resident: 0,
            order,
            tick: 0,
            last_request: vec![0; total],
            admission: AdmissionPolicy::default(),
            stats: CacheStats::default(),
        };
        if let CachePolicy::StaticHot { hot } = policy {
            if !hot.is_empty() {
                cache.warm_with(hot.iter().copied())?;
            }
        }
        Ok(cache)
    }

    /// How the slots are shared between layers.
    pub fn topology(&self) -> CacheTopology {
        self.topology
    }

    /// Slots each partition holds: all of them for a global pool, slots per layer for a
    /// per-layer cache.
    pub fn slots_per_partition(&self) -> usize {
        self.per_part
    }

    /// Partition of an expert (flat index).
    fn part_of_expert(&self, flat: usize) -> usize {
        match self.topology {
            CacheTopology::Global => 0,
            CacheTopology::PerLayer => flat / self.experts,
        }
    }

    /// Partition of a slot (the cache has at least one slot when a slot exists).
    fn part_of_slot(&self, s: u32) -> usize {
        s as usize / self.per_part
    }

    /// The policy.
    pub fn policy(&self) -> &CachePolicy {
        &self.policy
    }

    /// Which misses a layer that fetches only part of them admits, and whether the misses it
    /// computes on the CPU count as requests ([`AdmissionPolicy`]; the default until
    /// [`ExpertCache::set_admission`]).
    pub fn admission(&self) -> AdmissionPolicy {
        self.admission
    }

    /// Choose the admission policy [`crate::plan::plan_layer`] applies with this cache.
    pub fn set_admission(&mut self, admission: AdmissionPolicy) {
        self.admission = admission;
    }

    /// Slots in the pool.
    pub fn capacity(&self) -> usize {
        self.capacity
    }

    /// Resident experts.
    pub fn len(&self) -> usize {
        self.resident
    }

    /// True when nothing is resident.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Experts per layer of the geometry the cache was built for.
    pub fn experts_per_layer(&self) -> usize {
        self.experts
    }

    /// Layers of the geometry the cache was built for.
    pub fn layers(&self) -> usize {
        self.layers
    }

    /// Counters since creation or the last reset.
    pub fn stats(&self) -> CacheStats {
        self.stats
    }

    /// Zero the counters.
    pub fn reset_stats(&mut self) {
        self.stats = CacheStats::default();
    }

    fn flat(&self, id: ExpertId) -> Option<usize> {
        if (id.layer as usize) < self.layers && (id.expert as usize) < self.experts {
            Some(id.flat(self.experts))
        } else {
            None
        }
    }

    fn id_of(&self, flat: u32) -> ExpertId {
        ExpertId::new(flat as usize / self.experts, flat as usize % self.experts)
    }

    /// The slot of a resident expert, without touching it (no effect on the policy).
    pub fn slot_of(&self, id: ExpertId) -> Option<SlotId> {
        let f = self.flat(id)?;
        let s = self.slot_of[f];
        (s != NONE).then_some(SlotId(s))
    }

    /// True when the expert is resident (no effect on the policy).
    pub fn contains(&self, id: ExpertId) -> bool {
        self.slot_of(id).is_some()
    }

    /// The expert in a slot, if any.
    pub fn expert_in(&self, slot: SlotId) -> Option<ExpertId> {
        let f = *self.owner.get(slot.index())?;
        (f != NONE).then(|| self.id_of(f))
    }

    /// Resident experts with their slots, in slot order.
    pub fn resident(&self) -> impl Iterator<Item = (SlotId, ExpertId)> + '_ {
        self.owner
            .iter()
            .enumerate()
            .filter(|(_, &f)| f != NONE)
            .map(|(s, &f)| (SlotId(s as u32), self.id_of(f)))
    }

    /// Tick of the expert's last [`ExpertCache::lookup`] (hit or miss; resident or not), or
    /// `None` if it was never looked up. Larger is more recent; ticks count lookups and
    /// admissions from 1. [`crate::plan::plan_layer`] uses it to prefer recently used misses.
    pub fn last_request(&self, id: ExpertId) -> Option<u64> {
        let t = self.last_request[self.flat(id)?];
        (t != 0).then_some(t)
    }

    /// Set an expert's last request back to `prev` (what [`ExpertCache::last_request`] gave
    /// before its lookup): the plan forgets the request of a miss computed on the CPU when the
    /// admission says CPU work is no part of the cache's history.
    pub(crate) fn restore_request(&mut self, id: ExpertId, prev: Option<u64>) {
        if let Some(f) = self.flat(id) {
            self.last_request[f] = prev.unwrap_or(0);
        }
    }

    /// Request an expert: a hit returns its slot and counts as a use for the policy (recency
    /// for LRU, count for LFU); a miss returns `None`. Either way the request is recorded
    /// ([`ExpertCache::last_request`]) and counted in the stats. An expert outside the geometry
    /// is a miss.
    pub fn lookup(&mut self, id: ExpertId) -> Option<SlotId> {
        self.stats.lookups += 1;
        self.tick += 1;
        let f = self.flat(id)?;
        self.last_request[f] = self.tick;
        let s = self.slot_of[f];
        let hit = if s != NONE {
            self.stats.hits += 1;
            self.touch(s);
            Some(SlotId(s))
        } else {
            None
        };
        if let Order::Lfu { decay_every, .. } = self.order {
            if decay_every > 0 && self.stats.lookups.is_multiple_of(decay_every) {
                self.decay();
            }
        }
        hit
    }

    /// Make slot `s` the most recent / count one more use.
    fn touch(&mut self, s: u32) {
        let tick = self.tick;
        let p = self.part_of_slot(s);
        match &mut self.order {
            Order::Lru {
                prev,
                next,
                head,
                tail,
            } => {
                let (head, tail) = (&mut head[p], &mut tail[p]);
                if *head == s {
                    return;
                }
                lru_unlink(prev, next, head, tail, s);
                lru_push_front(prev, next, head, tail, s);
            }
            Order::Lfu {
                count, last, set, ..
            } => {
                let (i, set) = (s as usize, &mut set[p]);
                set.remove(&(count[i], last[i], s));
                count[i] += 1;
                last[i] = tick;
                set.insert((count[i], last[i], s));
            }
            Order::Static => {}
        }
    }

    /// Halve every LFU count.
    fn decay(&mut self) {
        if let Order::Lfu {
            count, last, set, ..
        } = &mut self.order
        {
            for set in set.iter_mut() {
                let slots: Vec<u32> = set.iter().map(|&(_, _, s)| s).collect();
                set.clear();
                for s in slots {
                    let i = s as usize;
                    count[i] /= 2;
                    set.insert((count[i], last[i], s));
                }
            }
        }
    }

    /// Put slot `s` (just filled) into the policy's order as a new entry.
    fn insert_order(&mut self, s: u32) {
        let tick = self.tick;
        let p = self.part_of_slot(s);
        match &mut self.order {
            Order::Lru {
                prev,
                next,
                head,
                tail,
            } => {
                lru_push_front(prev, next, &mut head[p], &mut tail[p], s);
            }
            Order::Lfu {
                count, last, set, ..
            } => {
                count[s as usize] = 1;
                last[s as usize] = tick;
                set[p].insert((1, tick, s));
            }
            Order::Static => {}
        }
    }

    /// Remove slot `s` (about to be refilled) from the policy's order.
    fn remove_order(&mut self, s: u32) {
        let p = self.part_of_slot(s);
        match &mut self.order {
            Order::Lru {
                prev,
                next,
                head,
                tail,
            } => {
                lru_unlink(prev, next, &mut head[p], &mut tail[p], s);
            }
            Order::Lfu {
                count, last, set, ..
            } => {
                set[p].remove(&(count[s as usize], last[s as usize], s));
            }
            Order::Static => {}
        }
    }

    /// The slot of partition `p` the policy would evict, skipping pinned experts.
    fn victim(&self, p: usize, pinned: &impl Fn(ExpertId) -> bool) -> Option<u32> {
        match &self.order {
            Order::Lru { prev, tail, .. } => {
                let mut s = tail[p];
                while s != NONE {
                    if !pinned(self.id_of(self.owner[s as usize])) {
                        return Some(s);
                    }
                    s = prev[s as usize];
                }
                None
            }
            Order::Lfu { set, .. } => set[p]
                .iter()
                .map(|&(_, _, s)| s)
                .find(|&s| !pinned(self.id_of(self.owner[s as usize]))),
            Order::Static => None,
        }
    }

    /// Admit a non-resident expert: into a free slot of its partition (lowest first) if there
    /// is one, else into the slot of the policy's victim among the partition's experts for
    /// which `pinned` is false.
    ///
    /// Errors (the cache is unchanged): [`CacheError::AlreadyResident`],
    /// [`CacheError::OutOfRange`], [`CacheError::AllPinned`] when every resident expert is
    /// pinned, [`CacheError::Full`] when the policy never evicts (static hot) or there are no
    /// slots.
    pub fn admit(
        &mut self,
        id: ExpertId,
        pinned: impl Fn(ExpertId) -> bool,
    ) -> std::result::Result<Admission, CacheError> {
        let Some(f) = self.flat(id) else {
            return Err(CacheError::OutOfRange {
                id,
                layers: self.layers,
                experts: self.experts,
            });
        };
        if self.slot_of[f] != NONE {
            return Err(CacheError::AlreadyResident {
                id,
                slot: SlotId(self.slot_of[f]),
            });
        }
        let p = self.part_of_expert(f);
        let (slot, evicted) = if let Some(s) = self.free[p].pop() {
            self.resident += 1;
            (s, None)
        } else {
            let victim = match (&self.order, self.per_part) {
                (Order::Static, _) | (_, 0) => {
                    self.stats.rejected += 1;
                    return Err(CacheError::Full {
                        id,
                        slots: self.capacity,
                        policy: self.policy.name(),
                    });
                }
                _ => self.victim(p, &pinned),
            };
            let Some(s) = victim else {
                self.stats.rejected += 1;
                return Err(CacheError::AllPinned {
                    id,
                    slots: self.per_part,
                });
            };
            let old = self.owner[s as usize];
            self.remove_order(s);
            self.slot_of[old as usize] = NONE;
            self.stats.evictions += 1;
            (s, Some(self.id_of(old)))
        };
        self.tick += 1;
        self.owner[slot as usize] = f as u32;
        self.slot_of[f] = slot;
        self.insert_order(slot);
        self.stats.admissions += 1;
        Ok(Admission {
            slot: SlotId(slot),
            evicted,
        })
    }

    /// Fill free slots with `ids` in order (skipping those already resident), without evicting
    /// and without counting in the stats. Fails with [`CacheError::Full`] when the ids do not
    /// fit in the free slots (those admitted before the failure stay).
    pub fn warm_with(
        &mut self,
        ids: impl IntoIterator<Item = ExpertId>,
    ) -> std::result::Result<(), CacheError> {
        let saved = self.stats;
        let mut result = Ok(());
        for id in ids {
            if self.contains(id) {
                continue;
            }
            let part = self.flat(id).map_or(0, |f| self.part_of_expert(f));
            if self.free[part].is_empty() {
                result = Err(CacheError::Full {
                    id,
                    slots: self.capacity,
                    policy: self.policy.name(),
                });
                break;
            }
            if let Err(e) = self.admit(id, |_| false) {
                result = Err(e);
                break;
            }
        }
        self.stats = saved;
        result
    }
}

/// The `n` experts of highest score (ties to the lower [`ExpertId::flat`] index), in that
/// order: the static hot set that maximises expected hits when `scores` are per-layer request
/// probabilities or counts (every layer is visited once per token, so a global ranking is
/// optimal). `scores` is indexed by `ExpertId::flat`.
pub fn hot_set(scores: &[f64], geometry: &MoeGeometry, n: usize) -> Result<Vec<ExpertId>> {
    let total = geometry.experts * geometry.moe_layers;
    if scores.len() != total {
        return Err(ModelError::invalid(
            "popularity",
            format!(
                "{} scores for a model of {total} routed experts",
                scores.len()
            ),
        ));
    }
    let mut idx: Vec<usize> = (0..total).collect();
    idx.sort_by(|&a, &b| scores[b].total_cmp(&scores[a]).then(a.cmp(&b)));
    Ok(idx
        .into_iter()
        .take(n.min(total))
        .map(|f| ExpertId::new(f / geometry.experts, f % geometry.experts))
        .collect())
}

/// The `n` experts of highest score within each layer (ties to the lower expert index),
/// layer by layer: the static hot set of a per-layer cache of `n` slots per layer. `scores`
/// is indexed by [`ExpertId::flat`].
pub fn hot_set_per_layer(
    scores: &[f64],
    geometry: &MoeGeometry,
    n: usize,
) -> Result<Vec<ExpertId>> {
    let e = geometry.experts;
    if scores.len() != e * geometry.moe_layers {
        return Err(ModelError::invalid(
            "popularity",
            format!(
                "{} scores for a model of {} routed experts",
                scores.len(),
                e * geometry.moe_layers
            ),
        ));
    }
    let mut out = Vec::with_capacity(n.min(e) * geometry.moe_layers);
    for (l, layer) in scores.chunks_exact(e).enumerate() {
        let mut idx: Vec<usize> = (0..e).collect();
        idx.sort_by(|&a, &b| layer[b].total_cmp(&layer[a]).then(a.cmp(&b)));
        out.extend(idx.into_iter().take(n).map(|x| ExpertId::new(l, x)));
    }
    Ok(out)
}

/// Build the cache a strategy starts from, with one pool shared by all layers
/// ([`build_cache_with`] and [`CacheTopology::Global`]).
pub fn build_cache(
    strategy: StrategyKind,
    policy: &CachePolicy,
    geometry: &MoeGeometry,
    slots: usize,
    popularity: Option<&[f64]>,
) -> Result<ExpertCache> {
    build_cache_with(
        strategy,
        policy,
        CacheTopology::Global,
        geometry,
        slots,
        popularity,
    )
}

/// Build the cache a strategy starts from:
/// - `resident`: every expert resident (capacity = all routed experts; `slots` is ignored);
/// - a `static-hot` policy: the policy's hot set, or else the `slots` most popular experts
///   by `popularity` ([`hot_set`], or [`hot_set_per_layer`] for a per-layer cache; indexed
///   by `ExpertId::flat`), an error naming `cache.hot` when neither is given;
/// - otherwise an empty (cold) cache of `slots` slots in all (a multiple of the layer count
///   for [`CacheTopology::PerLayer`]).
pub fn build_cache_with(
    strategy: StrategyKind,
    policy: &CachePolicy,
    topology: CacheTopology,
    geometry: &MoeGeometry,
    slots: usize,
    popularity: Option<&[f64]>,
) -> Result<ExpertCache> {
    let total = geometry.experts * geometry.moe_layers;
    if strategy == StrategyKind::Resident {
        let mut cache = ExpertCache::with_topology(policy, geometry, total, topology)?;
        cache.warm_with(
            (0..total).map(|f| ExpertId::new(f / geometry.experts, f % geometry.experts)),
        )?;
        return Ok(cache);
    }
    let mut cache = ExpertCache::with_topology(policy, geometry, slots, topology)?;
    if let CachePolicy::StaticHot { hot } = policy {
        if hot.is_empty() {
            let Some(pop) = popularity else {
                return Err(ModelError::invalid(
                    "cache.hot",
                    "a static-hot cache needs a hot set or a routing popularity to choose one",
                ));
            };
            let set = match topology {
                CacheTopology::Global => hot_set(pop, geometry, slots)?,
                CacheTopology::PerLayer => {
                    hot_set_per_layer(pop, geometry, cache.slots_per_partition())?
                }
            };
            cache.warm_with(set)?;
        }
    }
    Ok(cache)
}

/// Everything about the expert cache but its size: the replacement policy, how the slots are
/// shared between layers (with, for a per-layer cache, its slots per layer) and which misses a
/// partial fetch admits. One value of this type goes from the command line (`--cache-policy`,
/// `--cache-topology`, `--cache-slots-per-layer`, `--admission`) into every view that builds
/// a cache (predict, simulate, run, probe, serve), and into their reports.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default, rename_all = "kebab-case")]
pub struct CacheOptions {
    /// Replacement policy.
    pub policy: CachePolicy,
    /// How the slots are shared between layers.
    pub topology: CacheTopology,
    /// Slots of each layer (`--cache-slots-per-layer`): the cache is this many times the
    /// layer count, whatever size was given otherwise. `None`: the given size, which a
    /// per-layer cache rounds down to a multiple of the layer count.
    pub slots_per_layer: Option<usize>,
    /// Which misses a hybrid layer admits ([`AdmissionPolicy`]).
    pub admission: AdmissionPolicy,
}

impl From<CachePolicy> for CacheOptions {
    /// A global pool with the default admission, replacing by `policy`.
    fn from(policy: CachePolicy) -> Self {
        CacheOptions {
            policy,
            ..CacheOptions::default()
        }
    }
}

impl From<&CachePolicy> for CacheOptions {
    fn from(policy: &CachePolicy) -> Self {
        policy.clone().into()
    }
}

impl From<&CacheOptions> for CacheOptions {
    fn from(options: &CacheOptions) -> Self {
        options.clone()
    }
}

impl fmt::Display for CacheOptions {
    /// `lru global tokens`, `lru per-layer(64/layer) recent,cached-history`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} {}", self.policy, self.topology)?;
        if let Some(n) = self.slots_per_layer {
            write!(f, "({n}/layer)")?;
        }
        write!(f, " {}", self.admission)
    }
}

impl CacheOptions {
    /// The cache's slots in all for a model of `layers` MoE layers, from the `slots` a size
    /// gave: `slots_per_layer x layers` when slots per layer are set; for a per-layer cache,
    /// `slots` rounded down to a multiple of `layers`; else `slots`. Errors name the flag: 0
    /// slots per layer, or a per-layer cache smaller than one slot per layer.
    pub fn fit_slots(&self, slots: usize, layers: usize) -> Result<usize> {
        let layers = layers.max(1);
        if let Some(n) = self.slots_per_layer {
            if n == 0 {
                return Err(ModelError::invalid(
                    "--cache-slots-per-layer",
                    "0 slots per layer hold no expert",
                ));
            }
            return n.checked_mul(layers).ok_or_else(|| {
                ModelError::invalid(
                    "--cache-slots-per-layer",
                    format!("{n} slots for each of {layers} layers overflow"),
                )
            });
        }
        match self.topology {
            CacheTopology::Global => Ok(slots),
            CacheTopology::PerLayer if slots < layers => Err(ModelError::invalid(
                "--cache-topology",
                format!(
                    "a per-layer cache of {slots} slots has less than one slot for each of \
                     {layers} layers"
                ),
            )),
            CacheTopology::PerLayer => Ok(slots / layers * layers),
        }
    }

    /// The cache a strategy starts from ([`build_cache_with`]) with these options: `slots`
    /// fitted by [`CacheOptions::fit_slots`] (not for `resident`, which holds every expert),
    /// the topology, and the admission set.
    pub fn build(
        &self,
        strategy: StrategyKind,
        geometry: &MoeGeometry,
        slots: usize,
        popularity: Option<&[f64]>,
    ) -> Result<ExpertCache> {
        let slots = if strategy == StrategyKind::Resident {
            slots
        } else {
            self.fit_slots(slots, geometry.moe_layers)?
        };
        let mut cache = build_cache_with(
            strategy,
            &self.policy,
            self.topology,
            geometry,
            slots,
            popularity,
        )?;
        cache.set_admission(self.admission);
        Ok(cache)
    }
}

/// A cache size as the command line gives it.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum CacheSize {
    /// `--cache-slots N`: this many expert slots.
    Slots(usize),
    /// `--cache-gb X`: as many experts as fit in X GiB (2^30 bytes).
    GiB(f64),
}

impl CacheSize {
    /// The number of slots for experts of `expert_bytes` bytes in a model of `total_experts`
    /// routed experts: `N`, or `floor(X * 2^30 / expert_bytes)`. Errors name the flag: a size
    /// of 0 slots, a negative or non-finite GiB, or more slots than the model has experts
    /// (hold them all with the `resident` strategy instead).
    pub fn slots(&self, expert_bytes: u64, total_experts: u64) -> Result<usize> {
        let (flag, value, slots) = match *self {
            CacheSize::Slots(n) => ("--cache-slots", n.to_string(), n as u64),
            CacheSize::GiB(x) => {
                if !(x.is_finite() && x >= 0.0) {
                    return Err(ModelError::invalid(
                        "--cache-gb",
                        format!("{x} is not a finite size in GiB"),
                    ));
                }
                if expert_bytes == 0 {
                    return Err(ModelError::invalid("--cache-gb", "experts of 0 bytes"));
                }
                let slots = (x * GIB as f64 / expert_bytes as f64).floor() as u64;
                ("--cache-gb", format!("{x}"), slots)
            }
        };
        if slots == 0 {
            return Err(ModelError::invalid(
                flag,
                format!("{value} holds no expert of {expert_bytes} bytes"),
            ));
        }
        if slots > total_experts {
            return Err(ModelError::invalid(
                flag,
                format!(
                    "{value} is {slots} slots, more than the model's {total_experts} routed \
                     experts; use the resident strategy to hold them all"
                ),
            ));
        }
        Ok(slots as usize)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::rngs::StdRng;
    use rand::{Rng, SeedableRng};

    fn geo(experts: usize, layers: usize) -> MoeGeometry {
        MoeGeometry::routing_test(experts, 1, layers)
    }

    /// The slow reference: a vector scanned linearly, with explicit last-use ticks and counts.
    /// With `per_layer = Some((experts, n))` it is partitioned: `n` slots per layer, slots
    /// `l * n ..` belong to layer `l`, victims only among the admitted expert's layer.
    struct Naive {
        policy: CachePolicy,
        capacity: usize,
        per_layer: Option<(usize, usize)>,
        /// (expert, slot, last-use tick, count)
        entries: Vec<(ExpertId, u32, u64, u64)>,
        tick: u64,
        lookups: u64,
    }

    impl Naive {
        fn new(policy: &CachePolicy, capacity: usize) -> Self {
            Naive {
                policy: policy.clone(),
                capacity,
                per_layer: None,
                entries: Vec::new(),
                tick: 0,
                lookups: 0,
            }
        }

        fn lookup(&mut self, id: ExpertId) -> Option<SlotId> {
            self.tick += 1;
            self.lookups += 1;
            let tick = self.tick;
            let r = self.entries.iter_mut().find(|e| e.0 == id).map(|e| {
                e.2 = tick;
                e.3 += 1;
                SlotId(e.1)
            });
            if let CachePolicy::Lfu { decay_every } = self.policy {
                if decay_every > 0 && self.lookups.is_multiple_of(decay_every) {
                    for e in &mut self.entries {
                        e.3 /= 2;
                    }
                }
            }
            r
        }

        fn admit(
            &mut self,
            id: ExpertId,
            pinned: impl Fn(ExpertId) -> bool,
        ) -> std::result::Result<Admission, CacheError> {
            if let Some(e) = self.entries.iter().find(|e| e.0 == id) {
                return Err(CacheError::AlreadyResident {
                    id,
                    slot: SlotId(e.1),
                });
            }
            // The slots this expert may take, and whether an entry shares its partition.
            let (range, same) = match self.per_layer {
                None => (0..self.capacity as u32, None),
                Some((_, n)) => {
                    let l = id.layer as u32;
                    (l * n as u32..(l + 1) * n as u32, Some(id.layer))
                }
            };
            let room = range.len();
            let in_part = |e: &(ExpertId, u32, u64, u64)| same.is_none_or(|l| e.0.layer == l);
            let used = self.entries.iter().filter(|e| in_part(e)).count();
            let (slot, evicted, index) = if used < room {
                let slot = range
                    .clone()
                    .find(|s| !self.entries.iter().any(|e| e.1 == *s))
                    .unwrap();
                (slot, None, None)
            } else {
                let key = |e: &(ExpertId, u32, u64, u64)| match self.policy {
                    CachePolicy::Lru => (0, e.2),
                    _ => (e.3, e.2),
                };
                if matches!(self.policy, CachePolicy::StaticHot { .. }) || room == 0 {
                    return Err(CacheError::Full {
                        id,
                        slots: self.capacity,
                        policy: self.policy.name(),
                    });
                }
                let Some((i, v)) = self
                    .entries
                    .iter()
                    .enumerate()
                    .filter(|(_, e)| in_part(e) && !pinned(e.0))
                    .min_by_key(|(_, e)| key(e))
                else {
                    return Err(CacheError::AllPinned { id, slots: room });
                };
                (v.1, Some(v.0), Some(i))
            };
            if let Some(i) = index {
                self.entries.remove(i);
            }
            self.tick += 1;
            self.entries.push((id, slot, self.tick, 1));
            Ok(Admission {
                slot: SlotId(slot),
                evicted,
            })
        }
    }

    fn check_against_naive(
        policy: CachePolicy,
        topology: CacheTopology,
        capacity: usize,
        seed: u64,
    ) {
        let g = geo(6, 3);
        let mut fast = ExpertCache::with_topology(&policy, &g, capacity, topology).unwrap();
        let mut naive = Naive::new(&policy, capacity);
        if topology == CacheTopology::PerLayer {
            naive.per_layer = Some((6, capacity / 3));
        }
        let mut rng = StdRng::seed_from_u64(seed);
        let (mut hits, mut evictions) = (0, 0);
        for op in 0..4000 {
            // A skewed id so that there are hits.
            let l = rng.random_range(0..3usize);
            let e = (rng.random_range(0..36usize) as f64).sqrt() as usize;
            let id = ExpertId::new(l, e);
            if rng.random_bool(0.6) {
                let a = fast.lookup(id);
                let b = naive.lookup(id);
                assert_eq!(a, b, "op {op}: lookup {id}");
                hits += a.is_some() as usize;
            } else {
                let mask: u64 = rng.random();
                let pinned = move |x: ExpertId| (mask >> (x.flat(6) % 64)) & 1 == 1;
                let a = fast.admit(id, pinned);
                let b = naive.admit(id, pinned);
                assert_eq!(a, b, "op {op}: admit {id} ({policy:?}, {capacity} slots)");
                if let Ok(Admission {
                    evicted: Some(v), ..
                }) = a
                {
                    evictions += 1;
                    assert!(!pinned(v), "evicted a pinned expert");
                }
            }
            let mut r1: Vec<(SlotId, ExpertId)> = fast.resident().collect();
            let mut r2: Vec<(SlotId, ExpertId)> =
                naive.entries.iter().map(|e| (SlotId(e.1), e.0)).collect();
            r1.sort();
            r2.sort();
            assert_eq!(r1, r2, "op {op}: resident sets");
            assert_eq!(fast.len(), naive.entries.len());
        }
        if capacity > 0 && capacity < 18 {
            assert!(hits > 0, "{policy:?}: the sequence had no hits");
            if !matches!(policy, CachePolicy::StaticHot { .. }) {
                assert!(evictions > 0, "{policy:?}: the sequence had no evictions");
            }
        }
    }

    #[test]
    fn every_policy_matches_the_naive_reference() {
        let policies = [
            CachePolicy::Lru,
            CachePolicy::Lfu { decay_every: 0 },
            CachePolicy::Lfu { decay_every: 7 },
            CachePolicy::StaticHot { hot: Vec::new() },
        ];
        for policy in policies {
            for capacity in [0, 1, 2, 5, 11, 18] {
                for seed in 0..3 {
                    check_against_naive(policy.clone(), CacheTopology::Global, capacity, seed);
                }
            }
            // Per layer (3 layers): 0, 1, 2, 4 and all 6 slots per layer.
            for capacity in [0, 3, 6, 12, 18] {
                for seed in 0..3 {
                    check_against_naive(policy.clone(), CacheTopology::PerLayer, capacity, seed);
                }
            }
        }
    }

    #[test]
    fn per_layer_partitions_keep_layers_apart() {
        let g = geo(4, 3);
        let e = ExpertCache::with_topology(&CachePolicy::Lru, &g, 7, CacheTopology::PerLayer)
            .unwrap_err();
        assert!(
            matches!(
                e,
                CacheError::UnevenPartition {
                    slots: 7,
                    layers: 3
                }
            ),
            "{e}"
        );
        assert!(matches!(
            ExpertCache::with_topology(&CachePolicy::Lru, &g, 15, CacheTopology::PerLayer),
            Err(CacheError::TooManySlots { .. })
        ));
        let mut c =
            ExpertCache::with_topology(&CachePolicy::Lru, &g, 6, CacheTopology::PerLayer).unwrap();
        assert_eq!((c.capacity(), c.slots_per_partition()), (6, 2));
        assert_eq!(c.topology(), CacheTopology::PerLayer);
        // Layer 1 fills its two slots (2 and 3); a third layer-1 expert evicts a layer-1
        // expert although layer 0 and 2 slots are free.
        let a = c.admit(ExpertId::new(1, 0), |_| false).unwrap();
        let b = c.admit(ExpertId::new(1, 1), |_| false).unwrap();
        assert_eq!((a.slot, b.slot), (SlotId(2), SlotId(3)));
        let v = c.admit(ExpertId::new(1, 2), |_| false).unwrap();
        assert_eq!(v.evicted, Some(ExpertId::new(1, 0)));
        assert_eq!(c.len(), 2);
        // Both layer-1 experts pinned: refused with the partition's size, nothing changes.
        let e = c.admit(ExpertId::new(1, 3), |_| true).unwrap_err();
        assert!(matches!(e, CacheError::AllPinned { slots: 2, .. }), "{e}");
        // A global cache of the same size takes a free slot instead.
        let mut gl = ExpertCache::new(&CachePolicy::Lru, &g, 6).unwrap();
        for x in 0..3 {
            assert_eq!(
                gl.admit(ExpertId::new(1, x), |_| false).unwrap().evicted,
                None
            );
        }
        // Static hot sets per layer: the top experts of each layer by score.
        let scores: Vec<f64> = (0..12).map(|f| ((f * 7) % 12) as f64).collect();
        let hot = hot_set_per_layer(&scores, &g, 1).unwrap();
        assert_eq!(hot.len(), 3);
        for (l, h) in hot.iter().enumerate() {
            assert_eq!(h.layer as usize, l);
            let best = (0..4).max_by(|&a, &b| scores[l * 4 + a].total_cmp(&scores[l * 4 + b]));
            assert_eq!(h.expert as usize, best.unwrap());
        }
        let p = CachePolicy::StaticHot { hot: Vec::new() };
        let c = build_cache_with(
            StrategyKind::Offload,
            &p,
            CacheTopology::PerLayer,
            &g,
            3,
            Some(&scores),
        )
        .unwrap();
        assert!(hot.iter().all(|&h| c.contains(h)));
        assert_eq!(
            "per-layer".parse::<CacheTopology>().unwrap(),
            CacheTopology::PerLayer
        );
        assert!("ring".parse::<CacheTopology>().is_err());
        let t: CacheTopology = serde_json::from_str("\"per-layer\"").unwrap();
        assert_eq!(t, CacheTopology::PerLayer);
    }

    #[test]
    fn pinned_everything_fails_cleanly() {
        let g = geo(4, 2);
        let mut c = ExpertCache::new(&CachePolicy::Lru, &g, 2).unwrap();
        c.admit(ExpertId::new(0, 0), |_| false).unwrap();
        c.admit(ExpertId::new(0, 1), |_| false).unwrap();
        let e = c.admit(ExpertId::new(0, 2), |_| true).unwrap_err();
        assert!(matches!(e, CacheError::AllPinned { slots: 2, .. }), "{e}");
        assert!(e.to_string().contains("pinned"), "{e}");
        // Unchanged.
        assert!(c.contains(ExpertId::new(0, 0)) && c.contains(ExpertId::new(0, 1)));
        assert_eq!(c.stats().rejected, 1);
        // Only L0E0 pinned: the other one goes although it is the more recent.
        c.lookup(ExpertId::new(0, 1));
        let a = c
            .admit(ExpertId::new(1, 3), |x| x == ExpertId::new(0, 0))
            .unwrap();
        assert_eq!(a.evicted, Some(ExpertId::new(0, 1)));
        let e = c.admit(ExpertId::new(1, 3), |_| false).unwrap_err();
        assert!(matches!(e, CacheError::AlreadyResident { .. }));
        let e = c.admit(ExpertId::new(2, 0), |_| false).unwrap_err();
        assert!(matches!(e, CacheError::OutOfRange { .. }), "{e}");
        assert_eq!(c.lookup(ExpertId::new(5, 9)), None);
    }

    #[test]
    fn lru_and_lfu_choose_the_documented_victims() {
        let g = geo(8, 1);
        let id = |e| ExpertId::new(0, e);
        let mut lru = ExpertCache::new(&CachePolicy::Lru, &g, 3).unwrap();
        let mut lfu = ExpertCache::new(&CachePolicy::Lfu { decay_every: 0 }, &g, 3).unwrap();
        for c in [&mut lru, &mut lfu] {
            c.warm_with([id(0), id(1), id(2)]).unwrap();
            assert_eq!(c.stats(), CacheStats::default(), "warm-up is not counted");
            // 0 used twice, 1 once (most recently), 2 never.
            c.lookup(id(0));
            c.lookup(id(0));
            c.lookup(id(2));
            c.lookup(id(1));
        }
        // LRU: the least recent is 0.
        assert_eq!(lru.admit(id(5), |_| false).unwrap().evicted, Some(id(0)));
        // LFU: counts 0:3, 1:2, 2:2; tie between 1 and 2 goes to the least recent (2).
        assert_eq!(lfu.admit(id(5), |_| false).unwrap().evicted, Some(id(2)));
        // Aging halves counts.
        let mut aged = ExpertCache::new(&CachePolicy::Lfu { decay_every: 2 }, &g, 2).unwrap();
        aged.warm_with([id(0), id(1)]).unwrap();
        for _ in 0..6 {
            aged.lookup(id(0));
        }
        aged.lookup(id(1));
        aged.lookup(id(1));
        // Without aging 0 (count 7) would stay. Halving after every 2nd lookup: 0 goes
        // 1 -> 3 -> 1 -> 3 -> 1 -> 3 -> 1, then 1's two lookups: 1 -> 3 -> halved to 1 while 0
        // is halved to 0.
        assert_eq!(aged.admit(id(4), |_| false).unwrap().evicted, Some(id(0)));
    }

    #[test]
    fn static_hot_never_evicts() {
        let g = geo(4, 2);
        let hot = vec![ExpertId::new(1, 2), ExpertId::new(0, 3)];
        let p = CachePolicy::StaticHot { hot: hot.clone() };
        let mut c = ExpertCache::new(&p, &g, 3).unwrap();
        assert_eq!(c.len(), 2);
        assert!(hot.iter().all(|&h| c.contains(h)));
        // One free slot: a miss is admitted, then never again.
        c.admit(ExpertId::new(0, 0), |_| false).unwrap();
        let e = c.admit(ExpertId::new(0, 1), |_| false).unwrap_err();
        assert!(matches!(e, CacheError::Full { .. }), "{e}");
        assert!(e.to_string().contains("static-hot"), "{e}");
        assert_eq!(c.len(), 3);
        // A hot set larger than the cache is an error.
        let big = CachePolicy::StaticHot {
            hot: (0..4).map(|e| ExpertId::new(0, e)).collect(),
        };
        assert!(ExpertCache::new(&big, &g, 3).is_err());
    }

    #[test]
    fn hot_set_and_build_cache() {
        let g = geo(3, 2);
        let scores = [0.1, 0.5, 0.4, 0.5, 0.0, 0.2];
        let hot = hot_set(&scores, &g, 3).unwrap();
        // Ties (0.5 at flat 1 and 3) to the lower flat index.
        assert_eq!(
            hot,
            vec![
                ExpertId::new(0, 1),
                ExpertId::new(1, 0),
                ExpertId::new(0, 2)
            ]
        );
        assert!(hot_set(&scores[..4], &g, 2).is_err());
        let p = CachePolicy::StaticHot { hot: Vec::new() };
        let c = build_cache(StrategyKind::Cpu, &p, &g, 2, Some(&scores)).unwrap();
        assert!(c.contains(ExpertId::new(0, 1)) && c.contains(ExpertId::new(1, 0)));
        let e = build_cache(StrategyKind::Offload, &p, &g, 2, None).unwrap_err();
        assert!(e.to_string().contains("cache.hot"), "{e}");
        let r = build_cache(StrategyKind::Resident, &CachePolicy::Lru, &g, 1, None).unwrap();
        assert_eq!((r.len(), r.capacity()), (6, 6));
        let o = build_cache(StrategyKind::Offload, &CachePolicy::Lru, &g, 4, None).unwrap();
        assert_eq!((o.len(), o.capacity()), (0, 4));
        assert!(matches!(
            ExpertCache::new(&CachePolicy::Lru, &g, 7),
            Err(CacheError::TooManySlots { slots: 7, total: 6 })
        ));
    }

    #[test]
    fn policy_serde_and_names() {
        let cases = [
            (r#"{"kind":"lru"}"#, CachePolicy::Lru),
            (r#"{"kind":"lfu"}"#, CachePolicy::Lfu { decay_every: 0 }),
            (
                r#"{"kind":"lfu","decay_every":100}"#,
                CachePolicy::Lfu { decay_every: 100 },
            ),
            (
                r#"{"kind":"static-hot"}"#,
                CachePolicy::StaticHot { hot: Vec::new() },
            ),
            (
                r#"{"kind":"static-hot","hot":[{"layer":1,"expert":2}]}"#,
                CachePolicy::StaticHot {
                    hot: vec![ExpertId::new(1, 2)],
                },
            ),
        ];
        for (json, policy) in cases {
            let back: CachePolicy = serde_json::from_str(json).unwrap();
            assert_eq!(back, policy, "{json}");
            let again: CachePolicy =
                serde_json::from_str(&serde_json::to_string(&policy).unwrap()).unwrap();
            assert_eq!(again, policy);
            assert_eq!(
                policy.name().parse::<CachePolicy>().unwrap().name(),
                policy.name()
            );
        }
        assert!(serde_json::from_str::<CachePolicy>(r#"{"kind":"lfu","decay":1}"#).is_err());
        assert!(serde_json::from_str::<CachePolicy>(r#"{"kind":"arc"}"#).is_err());
        let toml_policy: CachePolicy = toml::from_str("kind = \"lfu\"\ndecay_every = 5").unwrap();
        assert_eq!(toml_policy, CachePolicy::Lfu { decay_every: 5 });
        assert_eq!(CachePolicy::default(), CachePolicy::Lru);
        let e = "mru".parse::<CachePolicy>().unwrap_err().to_string();
        assert!(e.contains("mru") && e.contains("static-hot"), "{e}");
    }

    #[test]
    fn cache_size_from_flags() {
        let bytes = 2_772_480u64; // one qwen3.8-flash-next nvfp4 expert
        let total = 512 * 48;
        assert_eq!(CacheSize::Slots(100).slots(bytes, total).unwrap(), 100);
        // floor(8 GiB / bytes)
        let n = CacheSize::GiB(8.0).slots(bytes, total).unwrap();
        assert_eq!(n as u64, 8 * GIB / bytes);
        let e = CacheSize::GiB(0.001)
            .slots(bytes, total)
            .unwrap_err()
            .to_string();
        assert!(e.contains("--cache-gb"), "{e}");
        let e = CacheSize::Slots(0)
            .slots(bytes, total)
            .unwrap_err()
            .to_string();
        assert!(e.contains("--cache-slots"), "{e}");
        let e = CacheSize::Slots(total as usize + 1)
            .slots(bytes, total)
            .unwrap_err()
            .to_string();
        assert!(e.contains("--cache-slots") && e.contains("resident"), "{e}");
        let e = CacheSize::GiB(1000.0)
            .slots(bytes, total)
            .unwrap_err()
            .to_string();
        assert!(e.contains("--cache-gb"), "{e}");
        assert!(CacheSize::GiB(f64::NAN).slots(bytes, total).is_err());
        assert!(CacheSize::GiB(-1.0).slots(bytes, total).is_err());
    }
}
