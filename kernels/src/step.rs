//! The CPU share of one MoE layer in one call: a set of experts, each for the tokens routed
//! to it, `y[token] += w * down(silu(gate x) * up x)`, on a persistent rayon pool.
//!
//! # Parallel structure: two phases, two barriers
//! 1. **gate/up**: tiles of `G` intermediate rows (`G` = the activation block of `down`'s
//!    input, 16 or 32) of every expert of the call, spread over all threads together (no
//!    per-expert barrier). A tile computes its gate and up rows for all the expert's tokens,
//!    forms `h = silu(g) * u` for those rows and, on the int8 path, quantizes those blocks of
//!    `h` (a tile is whole blocks, so quantization needs nothing from other tiles).
//! 2. **down**: tiles of hidden rows; a tile runs every expert of the call on its rows and adds
//!    into `y` in the spec's order (experts, then tokens, as given), so no two tiles write the
//!    same output and no reduction pass is needed.
//!
//! `down` needs all of `h`, which needs every gate/up row, so the second phase cannot start
//! before the first ends. The alternative, one phase with tiles spanning `down`'s columns,
//! would read `down` strided (a few hundred bytes per row) and need a cross-tile reduction of
//! partial outputs (a barrier plus a pass, and an f32 order the GPU would have to mirror);
//! two barriers is the cheaper choice. The token activations are quantized before phase 1
//! (inline for one token, in parallel across tokens otherwise).
//!
//! SIMD is chosen at run time ([`SimdLevel::detect`]) and can be forced
//! ([`CpuExperts::set_simd`]). Row kernels are in `rows` (scalar) and `x86` (AVX2, AVX-512).

use std::sync::Arc;

use rayon::prelude::*;
use rayon::ThreadPool;
use serde::{Deserialize, Serialize};

use ft_model::{ExpertFormat, MoeGeometry};

use crate::error::{KernelError, Result};
use crate::expert::ExpertLayout;
use crate::rows;
use crate::simd::SimdLevel;
use crate::w4a8::{silu, ActShape, QuantAct, QuantActPtr, W4a8Spec};

/// How activations enter the integer or float arithmetic.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum ActivationPath {
    /// f32 activations; weights dequantized on the fly (not bit-identical across paths).
    F32,
    /// int8 activations with a scale per block, integer dot products: W4A8 for the 4-bit
    /// formats, W8A8 for `int8`; bit-identical across SIMD levels and to the GPU (see
    /// [`crate::w4a8`]). Not available for `bf16`.
    Int8,
}

impl ActivationPath {
    /// Both paths.
    pub const ALL: [ActivationPath; 2] = [ActivationPath::F32, ActivationPath::Int8];

    /// Name used in tables, JSON and on the command line.
    pub fn name(self) -> &'static str {
        match self {
            ActivationPath::F32 => "f32",
            ActivationPath::Int8 => "int8",
        }
    }

    /// Whether `format` has this path.
    pub fn supports(self, format: ExpertFormat) -> bool {
        self == ActivationPath::F32 || W4a8Spec::of(format).is_some()
    }

    /// The path every default takes, on the GPU and the CPU alike: int8 where `format` has
    /// it, f32 otherwise (`bf16`). With int8 on both sides an expert's output is the same
    /// bits wherever it ran, so a hybrid step gives what offload gives; it is also the
    /// faster GPU path at decode sizes (the weights are read once either way, and the
    /// integer dot products do less work per byte).
    pub fn preferred(format: ExpertFormat) -> ActivationPath {
        if ActivationPath::Int8.supports(format) {
            ActivationPath::Int8
        } else {
            ActivationPath::F32
        }
    }
}

impl std::fmt::Display for ActivationPath {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

impl std::str::FromStr for ActivationPath {
    type Err = KernelError;

    fn from_str(s: &str) -> Result<Self> {
        Self::ALL
            .into_iter()
            .find(|p| {
                p.name().eq_ignore_ascii_case(s)
                    || (s.eq_ignore_ascii_case("w4a8") && *p == ActivationPath::Int8)
            })
            .ok_or_else(|| {
                KernelError::invalid("activation path", format!("'{s}' is not f32, int8 or w4a8"))
            })
    }
}

/// How the calling thread waits for a layer call's work on the pool.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum WaitMode {
    /// `ThreadPool::install`: the caller sleeps on a latch (a futex wake at the end).
    Block,
    /// The work is handed to the pool and the caller spins (with `yield_now`) until it is
    /// done: no wake-up latency at the end, at the cost of the caller's core. Meant for a
    /// runtime that spin-waits between layers. The default: on the 2-core VM a 2.77 MB
    /// expert took 531 us per call with `Block` and 117 us with `Spin` (the kernels' own
    /// phases took 113 us), the rest being wake-up latency.
    #[default]
    Spin,
    /// The caller computes tiles beside the pool's workers (`crate::team`): a call on a
    /// pool of `N` workers runs on `N + 1` threads and holds no core idle. Meant for a
    /// runtime whose workers spin between layers (the hybrid executor), where the caller
    /// would otherwise spin idle beside them.
    Help,
}

/// Where a layer call's time went, measured on the pool (microseconds).
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LayerTiming {
    /// Quantizing the token activations (int8 path; 0 on the f32 path), us.
    pub prep_us: f64,
    /// Phase 1, gate/up of every expert and `h`, us.
    pub gate_up_us: f64,
    /// Phase 2, down of every expert into `y`, us.
    pub down_us: f64,
}

/// One expert of a layer call: its bytes in host memory and the tokens routed to it.
#[derive(Debug, Clone, Copy)]
pub struct ExpertWork<'a> {
    /// The expert's bytes (gate, up, down; [`ExpertLayout`]), `expert_bytes` long.
    pub weights: &'a [u8],
    /// `(token index into x and y, router weight)` per routed token.
    pub tokens: &'a [(u32, f32)],
}

/// A raw pointer that may be shared between the tiles of one call (each writes disjoint
/// elements; the call outlives every tile).
#[derive(Clone, Copy)]
struct SharedMut<T>(*mut T);
// SAFETY: see the type docs; every use states the disjointness it relies on.
unsafe impl<T> Send for SharedMut<T> {}
unsafe impl<T> Sync for SharedMut<T> {}

impl<T> SharedMut<T> {
    /// Pointer to element `i` (a method, so closures capture the whole `Sync` wrapper).
    ///
    /// # Safety
    /// `i` must be in bounds of the allocation and the element written by one thread only.
    #[inline]
    unsafe fn at(&self, i: usize) -> *mut T {
        self.0.add(i)
    }
}

/// Per-call scratch, kept between calls so that a layer call allocates nothing in steady state.
#[derive(Default)]
struct Scratch {
    /// Quantized token activations, per token index (int8 path).
    x_act: Vec<QuantAct>,
    /// Quantized `h`, per (expert, token slot) (int8 path).
    h_act: Vec<QuantAct>,
    /// f32 `h`, `slots x intermediate` (f32 path).
    h_f32: Vec<f32>,
    /// First slot of each expert (prefix sums of token counts), plus the total.
    slot0: Vec<usize>,
}

/// The CPU expert kernels of one process: a persistent thread pool, the SIMD level, scratch.
pub struct CpuExperts {
    pool: Arc<ThreadPool>,
    level: SimdLevel,
    wait: WaitMode,
    scratch: Scratch,
}

/// How one call's phases spread their tiles over threads.
#[derive(Clone, Copy)]
enum Spread<'p> {
    /// Rayon's parallel iterators over the pool's `threads` (the call runs on a pool thread).
    Rayon { threads: usize },
    /// Shared with the calling thread ([`crate::team::for_each`]), `helpers` workers at most.
    Team {
        pool: &'p ThreadPool,
        helpers: usize,
    },
}

impl Spread<'_> {
    /// Threads that take tiles: the pool's, or the helpers and the caller.
    fn threads(self) -> usize {
        match self {
            Spread::Rayon { threads } => threads,
            Spread::Team { helpers, .. } => helpers + 1,
        }
    }

    /// Run `f(i)` for every `i` in `0..n`, in parallel; returns when all have run.
    fn for_each(self, n: usize, f: impl Fn(usize) + Sync + Send) {
        match self {
            Spread::Rayon { .. } => (0..n).into_par_iter().for_each(f),
            Spread::Team { pool, helpers } => crate::team::for_each(pool, helpers, n, &f),
        }
    }

    /// As [`Spread::for_each`], with the caller's `beside` work run on the caller while the
    /// helpers take the phase's first tiles ([`crate::team::for_each_after`]); where the
    /// phase runs on the pool, `beside` has already run (see [`run_phases`]).
    fn for_each_after(self, n: usize, f: impl Fn(usize) + Sync + Send, beside: &mut Beside<'_>) {
        match (self, beside.0.take()) {
            (Spread::Team { pool, helpers }, Some(first)) => {
                crate::team::for_each_after(pool, helpers, n, &f, first)
            }
            (spread, first) => {
                if let Some(first) = first {
                    first();
                }
                spread.for_each(n, f)
            }
        }
    }
}

/// The caller's own work during a layer call ([`CpuExperts::run_layer_beside`]), run once, on
/// the calling thread, by the first place that can overlap it with the pool's tiles.
struct Beside<'b>(Option<&'b mut dyn FnMut()>);

impl Beside<'_> {
    /// Run the work now unless it has run.
    fn run(&mut self) {
        if let Some(f) = self.0.take() {
            f();
        }
    }
}

/// Run a call's phases (`body`, given how to spread each phase's tiles) as `mode` says: on
/// the caller with the pool helping ([`WaitMode::Help`]), or on the pool ([`run_on`]).
///
/// The caller's `beside` work runs inside the body's phase that takes it (on the caller, with
/// the pool taking tiles) with [`WaitMode::Help`]; otherwise the body runs on the pool and
/// `beside` runs on the caller while it waits ([`WaitMode::Spin`]) or before ([`WaitMode::Block`],
/// or a caller inside the pool).
fn run_phases<F: FnOnce(Spread<'_>, &mut Beside<'_>) + Send>(
    pool: &ThreadPool,
    mode: WaitMode,
    beside: &mut Beside<'_>,
    body: F,
) {
    if mode == WaitMode::Help && pool.current_thread_index().is_none() {
        body(
            Spread::Team {
                pool,
                helpers: pool.current_num_threads(),
            },
            beside,
        );
    } else {
        let threads = pool.current_num_threads();
        run_on(pool, mode, beside, || {
            body(Spread::Rayon { threads }, &mut Beside(None))
        });
    }
}

/// Run `f` on `pool` and wait for it as `mode` says, running `beside` on the caller
/// meanwhile (before, where the caller blocks); from inside the pool, run it inline.
fn run_on<F: FnOnce() + Send>(pool: &ThreadPool, mode: WaitMode, beside: &mut Beside<'_>, f: F) {
    if mode == WaitMode::Block || pool.current_thread_index().is_some() {
        beside.run();
        pool.install(f);
        return;
    }
    use std::sync::atomic::{AtomicBool, Ordering};
    let done = Arc::new(AtomicBool::new(false));
    let panic: Arc<std::sync::Mutex<Option<Box<dyn std::any::Any + Send>>>> = Arc::default();
    let (d, p) = (Arc::clone(&done), Arc::clone(&panic));
    let job: Box<dyn FnOnce() + Send + '_> = Box::new(move || {
        if let Err(e) = std::panic::catch_unwind(std::panic::AssertUnwindSafe(f)) {
            *p.lock().unwrap_or_else(|e| e.into_inner()) = Some(e);
        }
        d.store(true, Ordering::Release);
    });
    // SAFETY: `job` borrows from the caller's frame; this function does not return (or
    // unwind) before `done` is set, which happens after `f` has run to completion or panicked
    // (caught above), so every borrow outlives its use.
    let job: Box<dyn FnOnce() + Send + 'static> = unsafe { std::mem::transmute(job) };
    pool.spawn(job);
    // The caller's own work while the pool computes; a panic in it waits for the job too.
    let mine = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| beside.run()));
    while !done.load(Ordering::Acquire) {
        std::thread::yield_now();
    }
    if let Err(e) = mine {
        std::panic::resume_unwind(e);
    }
    let payload = panic.lock().unwrap_or_else(|e| e.into_inner()).take();
    if let Some(e) = payload {
        std::panic::resume_unwind(e);
    }
}

impl std::fmt::Debug for CpuExperts {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CpuExperts")
            .field("threads", &self.threads())
            .field("level", &self.level)
            .finish()
    }
}

/// Build a dedicated rayon pool of `threads` threads (0: one per available CPU), named
/// `ft-cpu-N`.
pub fn build_pool(threads: usize) -> Result<Arc<ThreadPool>> {
    let n = if threads == 0 {
        std::thread::available_parallelism().map_or(1, |n| n.get())
    } else {
        threads
    };
    rayon::ThreadPoolBuilder::new()
        .num_threads(n)
        .thread_name(|i| format!("ft-cpu-{i}"))
        .build()
        .map(Arc::new)
        .map_err(|e| KernelError::Pool {
            threads: n,
            message: e.to_string(),
        })
}

impl CpuExperts {
    /// Kernels on a new pool of `threads` threads (0: all CPUs), at the widest SIMD level.
    pub fn new(threads: usize) -> Result<Self> {
        Ok(Self::with_pool(build_pool(threads)?))
    }

    /// Kernels on a pool the caller owns (the hybrid runtime shares its pool this way).
    pub fn with_pool(pool: Arc<ThreadPool>) -> Self {
        CpuExperts {
            pool,
            level: SimdLevel::detect(),
            wait: WaitMode::default(),
            scratch: Scratch::default(),
        }
    }

    /// The pool the layer calls run on.
    pub fn pool(&self) -> &Arc<ThreadPool> {
        &self.pool
    }

    /// Threads of the pool.
    pub fn threads(&self) -> usize {
        self.pool.current_num_threads()
    }

    /// The SIMD level in use.
    pub fn simd(&self) -> SimdLevel {
        self.level
    }

    /// How the caller waits for a layer call.
    pub fn wait_mode(&self) -> WaitMode {
        self.wait
    }

    /// Choose how the caller waits for a layer call (see [`WaitMode`]).
    pub fn set_wait_mode(&mut self, mode: WaitMode) {
        self.wait = mode;
    }

    /// Force a SIMD level (tests, benches); errors if this CPU cannot run it.
    pub fn set_simd(&mut self, level: SimdLevel) -> Result<()> {
        if !level.available() {
            return Err(KernelError::UnsupportedSimd {
                requested: level,
                detected: SimdLevel::detect(),
            });
        }
        self.level = level;
        Ok(())
    }

    /// Compute a layer's CPU share: `y[t] += sum over experts e routed to t of
    /// w_{e,t} * down_e(silu(gate_e x_t) * up_e x_t)`.
    ///
    /// `x` and `y` are `tokens x hidden` row-major f32 (`tokens = x.len() / hidden`); each
    /// expert's `weights` is one expert of `geometry` in `format`. Errors (never panics) on a
    /// wrong length, a token index out of range, a non-finite router weight, or the int8 path
    /// with `bf16`.
    pub fn run_layer(
        &mut self,
        format: ExpertFormat,
        geometry: &MoeGeometry,
        path: ActivationPath,
        experts: &[ExpertWork<'_>],
        x: &[f32],
        y: &mut [f32],
    ) -> Result<LayerTiming> {
        self.run_layer_beside(format, geometry, path, experts, x, y, &mut || {})
    }

    /// [`CpuExperts::run_layer`], with `beside` run once on the calling thread while the
    /// pool computes: with [`WaitMode::Help`] during the gate/up phase (the pool's workers
    /// take its first tiles, the caller joins when `beside` returns), with
    /// [`WaitMode::Spin`] while the caller waits for the pool, with [`WaitMode::Block`]
    /// before the call. It runs whatever the call's outcome (also when the call has no work
    /// or fails its checks), so a caller may put work there that must happen in any case.
    /// The hybrid runtime submits the GPU work its CPU share does not wait for this way.
    #[allow(clippy::too_many_arguments)]
    pub fn run_layer_beside(
        &mut self,
        format: ExpertFormat,
        geometry: &MoeGeometry,
        path: ActivationPath,
        experts: &[ExpertWork<'_>],
        x: &[f32],
        y: &mut [f32],
        beside: &mut dyn FnMut(),
    ) -> Result<LayerTiming> {
        let mut beside = Beside(Some(beside));
        let r = self.layer_call(format, geometry, path, experts, x, y, &mut beside);
        beside.run();
        r
    }

    /// The body of [`CpuExperts::run_layer_beside`].
    #[allow(clippy::too_many_arguments)]
    fn layer_call(
        &mut self,
        format: ExpertFormat,
        geometry: &MoeGeometry,
        path: ActivationPath,
        experts: &[ExpertWork<'_>],
        x: &[f32],
        y: &mut [f32],
        beside: &mut Beside<'_>,
    ) -> Result<LayerTiming> {
        let layout = ExpertLayout::new(format, geometry)?;
        let (hidden, inter) = (geometry.hidden, geometry.intermediate);
        if !x.len().is_multiple_of(hidden) {
            return Err(KernelError::invalid(
                "x",
                format!("length {} is not a multiple of hidden = {hidden}", x.len()),
            ));
        }
        if y.len() != x.len() {
            return Err(KernelError::size("y", x.len() as u64, y.len()));
        }
        if !path.supports(format) {
            return Err(KernelError::invalid(
                "activation path",
                format!("{format} has no {path} path"),
            ));
        }
        let tokens = x.len() / hidden;
        for (e, w) in experts.iter().enumerate() {
            if w.weights.len() != layout.bytes {
                return Err(KernelError::size(
                    format!("experts[{e}].weights"),
                    layout.bytes as u64,
                    w.weights.len(),
                ));
            }
            for &(t, rw) in w.tokens {
                if t as usize >= tokens {
                    return Err(KernelError::invalid(
                        format!("experts[{e}].tokens"),
                        format!("token {t} is not below the {tokens} tokens of x"),
                    ));
                }
                if !rw.is_finite() {
                    return Err(KernelError::invalid(
                        format!("experts[{e}].tokens"),
                        format!("router weight {rw} of token {t} is not finite"),
                    ));
                }
            }
        }
        let level = self.level;
        let wait = self.wait;
        let s = &mut self.scratch;
        s.slot0.clear();
        let mut total = 0;
        for w in experts {
            s.slot0.push(total);
            total += w.tokens.len();
        }
        s.slot0.push(total);
        if total == 0 {
            return Ok(LayerTiming::default());
        }
        let mut timing = LayerTiming::default();
        let timing_ref = &mut timing;
        let pool = Arc::clone(&self.pool);
        // Tiles of phase 1: `tile1` intermediate rows, whole activation blocks of `down`.
        let spec = W4a8Spec::of(format);
        let tile1 = spec
            .map_or(rows::F32_TILE_ROWS, |s| s.group)
            .max(rows::F32_TILE_ROWS);
        let tiles_per_expert = inter.div_ceil(tile1);
        let tiles1 = experts.len() * tiles_per_expert;
        let tiles2 = hidden.div_ceil(rows::DOWN_TILE_ROWS);
        let y_ptr = SharedMut(y.as_mut_ptr());

        match path {
            ActivationPath::F32 => {
                s.h_f32.clear();
                s.h_f32.resize(total * inter, 0.0);
                let h_ptr = SharedMut(s.h_f32.as_mut_ptr());
                let slot0 = &s.slot0;
                let h_f32 = &s.h_f32;
                run_phases(&pool, wait, beside, |spread, beside| {
                    let t0 = std::time::Instant::now();
                    spread.for_each_after(
                        tiles1,
                        |tile| {
                            let (e, r0) =
                                (tile / tiles_per_expert, (tile % tiles_per_expert) * tile1);
                            let r1 = (r0 + tile1).min(inter);
                            let work = &experts[e];
                            let acts: Vec<&[f32]> = work
                                .tokens
                                .iter()
                                .map(|&(t, _)| &x[t as usize * hidden..(t as usize + 1) * hidden])
                                .collect();
                            let n = acts.len();
                            let mut g = vec![0f32; (r1 - r0) * n];
                            let mut u = vec![0f32; (r1 - r0) * n];
                            let (gate, up, _) = split(&layout, work.weights);
                            rows::f32_rows(level, &layout.gate_up, gate, r0..r1, &acts, &mut g);
                            rows::f32_rows(level, &layout.gate_up, up, r0..r1, &acts, &mut u);
                            for (k, slot) in (slot0[e]..slot0[e + 1]).enumerate() {
                                for r in r0..r1 {
                                    let i = (r - r0) * n + k;
                                    // SAFETY: (slot, r) is written by this tile only.
                                    unsafe { *h_ptr.at(slot * inter + r) = silu(g[i]) * u[i] };
                                }
                            }
                        },
                        beside,
                    );
                    let t1 = std::time::Instant::now();
                    timing_ref.gate_up_us = (t1 - t0).as_secs_f64() * 1e6;
                    spread.for_each(tiles2, |tile| {
                        let r0 = tile * rows::DOWN_TILE_ROWS;
                        let r1 = (r0 + rows::DOWN_TILE_ROWS).min(hidden);
                        let mut o = Vec::new();
                        for (e, work) in experts.iter().enumerate() {
                            let acts: Vec<&[f32]> = (slot0[e]..slot0[e + 1])
                                .map(|slot| &h_f32[slot * inter..(slot + 1) * inter])
                                .collect();
                            let n = acts.len();
                            if n == 0 {
                                continue;
                            }
                            o.clear();
                            o.resize((r1 - r0) * n, 0.0);
                            let (_, _, down) = split(&layout, work.weights);
                            rows::f32_rows(level, &layout.down, down, r0..r1, &acts, &mut o);
                            accumulate(y_ptr, hidden, work.tokens, r0..r1, &o);
                        }
                    });
                    timing_ref.down_us = t1.elapsed().as_secs_f64() * 1e6;
                });
            }
            ActivationPath::Int8 => {
                let spec = spec.expect("checked by supports");
                let xshape = ActShape::new(spec, hidden);
                let hshape = ActShape::new(spec, inter);
                if s.x_act.len() < tokens {
                    s.x_act.resize_with(tokens, QuantAct::default);
                }
                if s.h_act.len() < total {
                    s.h_act.resize_with(total, QuantAct::default);
                }
                let mut used = vec![false; tokens];
                for w in experts {
                    for &(t, _) in w.tokens {
                        used[t as usize] = true;
                    }
                }
                let used_count = used.iter().filter(|&&u| u).count();
                let mut xptrs: Vec<Option<QuantActPtr>> = vec![None; tokens];
                for (t, a) in s.x_act.iter_mut().enumerate().take(tokens) {
                    if used[t] {
                        a.reset(&xshape);
                        xptrs[t] = Some(a.ptr(format, &xshape));
                    }
                }
                let hptrs: Vec<QuantActPtr> = s.h_act[..total]
                    .iter_mut()
                    .map(|a| {
                        a.reset(&hshape);
                        a.ptr(format, &hshape)
                    })
                    .collect();
                let slot0 = &s.slot0;
                let x_act = &s.x_act;
                let h_act = &s.h_act;
                run_phases(&pool, wait, beside, |spread, beside| {
                    let t0 = std::time::Instant::now();
                    // (token, block chunk) tasks: few tokens still spread over the threads.
                    let chunks = prep_chunks(xshape.blocks, used_count, spread.threads());
                    let per = xshape.blocks.div_ceil(chunks);
                    spread.for_each(tokens * chunks, |task| {
                        let (t, c) = (task / chunks, task % chunks);
                        if let Some(p) = &xptrs[t] {
                            let (b0, b1) = (c * per, ((c + 1) * per).min(xshape.blocks));
                            if b0 < b1 {
                                let xs =
                                    &x[t * hidden + b0 * spec.group..t * hidden + b1 * spec.group];
                                // SAFETY: blocks b0..b1 of token t are written by this task only.
                                unsafe { p.write_blocks(b0, xs) };
                            }
                        }
                    });
                    let t1 = std::time::Instant::now();
                    timing_ref.prep_us = (t1 - t0).as_secs_f64() * 1e6;
                    spread.for_each_after(
                        tiles1,
                        |tile| {
                            let (e, r0) =
                                (tile / tiles_per_expert, (tile % tiles_per_expert) * tile1);
                            let r1 = (r0 + tile1).min(inter);
                            let work = &experts[e];
                            let acts: Vec<&QuantAct> = work
                                .tokens
                                .iter()
                                .map(|&(t, _)| &x_act[t as usize])
                                .collect();
                            let n = acts.len();
                            let mut g = vec![0f32; (r1 - r0) * n];
                            let mut u = vec![0f32; (r1 - r0) * n];
                            let (gate, up, _) = split(&layout, work.weights);
                            rows::int8_rows(
                                level,
                                format,
                                &layout.gate_up,
                                gate,
                                r0..r1,
                                &acts,
                                &mut g,
                            );
                            rows::int8_rows(
                                level,
                                format,
                                &layout.gate_up,
                                up,
                                r0..r1,
                                &acts,
                                &mut u,
                            );
                            let mut h = vec![0f32; r1 - r0];
                            for (k, slot) in (slot0[e]..slot0[e + 1]).enumerate() {
                                for r in r0..r1 {
                                    let i = (r - r0) * n + k;
                                    h[r - r0] = silu(g[i]) * u[i];
                                }
                                // SAFETY: blocks r0/G.. of this slot belong to this tile only.
                                unsafe { hptrs[slot].write_blocks(r0 / spec.group, &h) };
                            }
                        },
                        beside,
                    );
                    let t2 = std::time::Instant::now();
                    timing_ref.gate_up_us = (t2 - t1).as_secs_f64() * 1e6;
                    spread.for_each(tiles2, |tile| {
                        let r0 = tile * rows::DOWN_TILE_ROWS;
                        let r1 = (r0 + rows::DOWN_TILE_ROWS).min(hidden);
                        let mut o = Vec::new();
                        for (e, work) in experts.iter().enumerate() {
                            let acts: Vec<&QuantAct> =
                                (slot0[e]..slot0[e + 1]).map(|slot| &h_act[slot]).collect();
                            let n = acts.len();
                            if n == 0 {
                                continue;
                            }
                            o.clear();
                            o.resize((r1 - r0) * n, 0.0);
                            let (_, _, down) = split(&layout, work.weights);
                            rows::int8_rows(
                                level,
                                format,
                                &layout.down,
                                down,
                                r0..r1,
                                &acts,
                                &mut o,
                            );
                            accumulate(y_ptr, hidden, work.tokens, r0..r1, &o);
                        }
                    });
                    timing_ref.down_us = t2.elapsed().as_secs_f64() * 1e6;
                });
            }
        }
        Ok(timing)
    }
}

/// Least blocks per activation-quantization task (a few hundred elements: below that the
/// task hand-off costs more than the work).
const PREP_MIN_BLOCKS: usize = 8;

/// Chunks per token for quantizing `used` tokens of `blocks` blocks on `threads` threads:
/// enough tasks for every thread, none smaller than [`PREP_MIN_BLOCKS`].
fn prep_chunks(blocks: usize, used: usize, threads: usize) -> usize {
    let want = threads.div_ceil(used.max(1));
    want.min(blocks / PREP_MIN_BLOCKS).max(1)
}

/// An expert's (gate, up, down) bytes; lengths were checked by `run_layer`.
#[inline]
fn split<'a>(l: &ExpertLayout, w: &'a [u8]) -> (&'a [u8], &'a [u8], &'a [u8]) {
    (
        &w[..l.up_offset],
        &w[l.up_offset..l.down_offset],
        &w[l.down_offset..],
    )
}

/// `y[t][r] += w * o[r][k]` for token slot k = (t, w), rows `rows` (spec section 5).
#[inline]
fn accumulate(
    y: SharedMut<f32>,
    hidden: usize,
    tokens: &[(u32, f32)],
    rows: std::ops::Range<usize>,
    o: &[f32],
) {
    let n = tokens.len();
    for (k, &(t, w)) in tokens.iter().enumerate() {
        for r in rows.clone() {
            // SAFETY: rows of y in `rows` are written by this tile only, and t < tokens.
            unsafe {
                let p = y.at(t as usize * hidden + r);
                *p += w * o[(r - rows.start) * n + k];
            }
        }
    }
}
