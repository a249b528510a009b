//! The hybrid CPU executor: the kernels' rayon pool, kept hot between the layers of a decode
//! step and left to park after it.
//!
//! Hybrid decode hands the CPU a small job once per layer (a few experts times a few tokens,
//! tens to hundreds of microseconds of work). A plain rayon call from the host thread pays
//! two wake-ups per layer: the pool's workers have gone to sleep on a futex between layers
//! (rayon parks idle workers within microseconds), and the host thread itself sleeps on a
//! latch until the job is done. With 48 layers these fixed costs are as large as the work for
//! 2-3 MB experts (design.md, mechanism 2). This executor removes both:
//!
//! - [`CpuExecutor::begin_step`] broadcasts one *spinner* job to every worker of the pool.
//!   A spinner loops on [`rayon::ThreadPool::yield_now`], so it executes any rayon work that
//!   appears (the layer's tiles) the moment it is queued, and spins (`spin_loop` hints)
//!   otherwise.
//! - [`CpuExecutor::run_layer`] runs the layer call ([`CpuExperts::run_layer`]) on the host
//!   thread with the spinners helping ([`ft_kernels::WaitMode::Help`]): each phase's tiles
//!   are handed out one at a time to the host and to whichever spinner is free, so nobody
//!   sleeps on a latch and the host, which would otherwise wait idle, computes.
//! - [`CpuExecutor::end_step`] lowers the flag the spinners watch: they return, and rayon
//!   parks its workers as usual, so an idle process costs no CPU.
//!
//! With [`PoolWait::Park`] none of this happens: the host calls the kernels directly (rayon's
//! own wake-ups), which is the baseline the fixed-cost probe compares with, and the right
//! choice where cores are scarce (a 2-core machine running the host-emulated device).
//!
//! Threads: `threads` counts the threads that compute, the host's included: with
//! [`PoolWait::Spin`] the pool has `threads - 1` workers, so a hot step holds `threads`
//! cores. Leave a core free for the GPU driver and the OS (`--threads` = cores - 1): with
//! every core spinning, any thread that wakes preempts a worker, possibly in the middle of a
//! tile, and the layer waits for it (the H200 grid of 2026-12-04 at 15 workers plus a
//! spinning host on 16 vCPUs: 77 steps over twice their run's median, against 2 at 4 threads).
//! [`PoolWait::SpinBeside`] keeps the earlier arrangement (`threads` workers, the host
//! spinning idle beside them, `threads + 1` cores) for comparison. With one thread the host
//! has no one to share with, and `Spin` runs as `SpinBeside`.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use ft_kernels::step::LayerTiming;
use ft_kernels::{ActivationPath, CpuExperts, ExpertWork, WaitMode};
use ft_model::{ExpertFormat, MoeGeometry};
use serde::{Deserialize, Serialize};

use crate::error::{Result, RuntimeError};

/// Longest a spinner spins without executing any work before it returns anyway (us): a guard
/// against burning cores when a step stalls (a long device wait, a debugger). Far longer than
/// the gap between two layers' CPU jobs in a healthy step; after it the pool behaves as with
/// [`PoolWait::Park`] until the next step.
pub const SPIN_LIMIT_IDLE_US: u64 = 50_000;

/// How the CPU pool waits between the layers of a step.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum PoolWait {
    /// Workers spin between layers within a step and the host computes beside them (lowest
    /// latency; `threads - 1` workers, `threads` cores held).
    #[default]
    Spin,
    /// As `Spin`, but with `threads` workers and the host spinning idle until the layer is
    /// done (`threads + 1` cores held): the arrangement before 2026-12-04, for comparison.
    SpinBeside,
    /// Workers park between layers and the host sleeps until a job is done (rayon's own
    /// behaviour): a wake-up per layer, but no core is held.
    Park,
}

impl PoolWait {
    /// Name on the command line and in JSON.
    pub fn name(self) -> &'static str {
        match self {
            PoolWait::Spin => "spin",
            PoolWait::SpinBeside => "spin-beside",
            PoolWait::Park => "park",
        }
    }
}

impl std::str::FromStr for PoolWait {
    type Err = RuntimeError;

    fn from_str(s: &str) -> Result<Self> {
        match s.to_ascii_lowercase().as_str() {
            "spin" => Ok(PoolWait::Spin),
            "spin-beside" => Ok(PoolWait::SpinBeside),
            "park" => Ok(PoolWait::Park),
            _ => Err(RuntimeError::invalid(
                "--pool-wait",
                format!("'{s}' is none of 'spin', 'spin-beside' and 'park'"),
            )),
        }
    }
}

/// State the spinners share with the executor.
#[derive(Debug, Default)]
struct SpinState {
    /// True while a step is open: spinners keep spinning.
    hot: AtomicBool,
    /// Spinner jobs currently running.
    live: AtomicUsize,
}

/// The hybrid CPU executor (see the module docs).
pub struct CpuExecutor {
    kernels: CpuExperts,
    /// Threads that compute a layer call (the host's included under `Spin`).
    threads: usize,
    wait: PoolWait,
    state: Arc<SpinState>,
    in_step: bool,
    jobs: u64,
}

impl std::fmt::Debug for CpuExecutor {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CpuExecutor")
            .field("threads", &self.threads())
            .field("wait", &self.wait)
            .field("simd", &self.kernels.simd())
            .field("in_step", &self.in_step)
            .finish()
    }
}

/// A `Send` wrapper for the erased layer job (see [`CpuExecutor::run_layer`]).
struct ErasedJob(Box<dyn FnOnce() + Send + 'static>);

impl CpuExecutor {
    /// An executor whose layer calls compute on `threads` threads (at least 1; the module
    /// docs say which of them are the pool's workers).
    pub fn new(threads: usize, wait: PoolWait) -> Result<Self> {
        if threads == 0 {
            return Err(RuntimeError::invalid(
                "--threads",
                "the CPU pool needs at least 1 thread",
            ));
        }
        let wait = if wait == PoolWait::Spin && threads == 1 {
            PoolWait::SpinBeside
        } else {
            wait
        };
        let workers = match wait {
            PoolWait::Spin => threads - 1,
            PoolWait::SpinBeside | PoolWait::Park => threads,
        };
        let mut kernels =
            CpuExperts::new(workers).map_err(|e| RuntimeError::Kernel(e.to_string()))?;
        if wait == PoolWait::Spin {
            kernels.set_wait_mode(WaitMode::Help);
        }
        Ok(CpuExecutor {
            kernels,
            threads,
            wait,
            state: Arc::new(SpinState::default()),
            in_step: false,
            jobs: 0,
        })
    }

    /// Threads that compute a layer call (the host thread included under
    /// [`PoolWait::Spin`]).
    pub fn threads(&self) -> usize {
        self.threads
    }

    /// Workers of the pool (the host thread not counted).
    pub fn workers(&self) -> usize {
        self.kernels.threads()
    }

    /// How the pool waits between layers.
    pub fn wait_policy(&self) -> PoolWait {
        self.wait
    }

    /// The SIMD level of the kernels.
    pub fn simd(&self) -> ft_kernels::SimdLevel {
        self.kernels.simd()
    }

    /// True when the workers spin within a step.
    fn spins(&self) -> bool {
        matches!(self.wait, PoolWait::Spin | PoolWait::SpinBeside)
    }

    /// Layer jobs run so far.
    pub fn jobs(&self) -> u64 {
        self.jobs
    }

    /// True between [`CpuExecutor::begin_step`] and [`CpuExecutor::end_step`].
    pub fn in_step(&self) -> bool {
        self.in_step
    }

    /// Open a step: with [`PoolWait::Spin`] or [`PoolWait::SpinBeside`], wake every worker
    /// now (while the GPU runs the step's first layer) and keep it spinning until
    /// [`CpuExecutor::end_step`].
    pub fn begin_step(&mut self) {
        if self.in_step {
            return;
        }
        self.in_step = true;
        if !self.spins() {
            return;
        }
        self.state.hot.store(true, Ordering::SeqCst);
        let state = Arc::clone(&self.state);
        let pool = Arc::clone(self.kernels.pool());
        let pool_for_spin = Arc::clone(&pool);
        pool.spawn_broadcast(move |_| {
            state.live.fetch_add(1, Ordering::SeqCst);
            let mut idle_since = Instant::now();
            while state.hot.load(Ordering::Acquire) {
                match pool_for_spin.yield_now() {
                    Some(rayon::Yield::Executed) => idle_since = Instant::now(),
                    _ => {
                        if idle_since.elapsed() > Duration::from_micros(SPIN_LIMIT_IDLE_US) {
                            break;
                        }
                        for _ in 0..SPIN_BATCH {
                            std::hint::spin_loop();
                        }
                    }
                }
            }
            state.live.fetch_sub(1, Ordering::SeqCst);
        });
    }

    /// Close the step: spinners return and the pool parks. Waits (briefly) until every
    /// spinner has returned, so that the next step starts from a known state.
    pub fn end_step(&mut self) {
        if !self.in_step {
            return;
        }
        self.in_step = false;
        self.state.hot.store(false, Ordering::SeqCst);
        let t0 = Instant::now();
        // A spinner that has not started yet (its worker still waking) starts, sees the flag
        // down and returns at once; bound the wait regardless.
        while self.state.live.load(Ordering::SeqCst) > 0
            && t0.elapsed() < Duration::from_micros(SPIN_LIMIT_IDLE_US)
        {
            std::thread::yield_now();
        }
    }

    /// Compute a layer's CPU share: `y[t] += w * expert(x[t])` for every expert and token of
    /// `experts` ([`CpuExperts::run_layer`]'s semantics and errors), on the pool; returns
    /// the kernels' own split of the call's time.
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

    /// [`CpuExecutor::run_layer`], with `beside` run once on the calling (host) thread while
    /// the pool computes ([`CpuExperts::run_layer_beside`]: with [`PoolWait::Spin`] the
    /// spinners start the layer's gate/up tiles and the host joins when `beside` returns;
    /// with [`PoolWait::SpinBeside`] the host runs it instead of spinning idle; with
    /// [`PoolWait::Park`] before the call). It runs whatever the call's outcome.
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
        self.jobs += 1;
        let kernel_err = |e: ft_kernels::KernelError| RuntimeError::Kernel(e.to_string());
        // Spin: the host computes with the spinners helping (the kernels' `Help` mode); Park,
        // or outside a step: the kernels' own wait.
        if !(self.in_step && self.wait == PoolWait::SpinBeside) {
            return self
                .kernels
                .run_layer_beside(format, geometry, path, experts, x, y, beside)
                .map_err(kernel_err);
        }
        let done = AtomicBool::new(false);
        let outcome: Mutex<Option<std::thread::Result<ft_kernels::Result<LayerTiming>>>> =
            Mutex::new(None);
        let pool = Arc::clone(self.kernels.pool());
        {
            let kernels = &mut self.kernels;
            let (done_ref, outcome_ref) = (&done, &outcome);
            let job = move || {
                let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                    kernels.run_layer(format, geometry, path, experts, x, y)
                }));
                *outcome_ref.lock().unwrap_or_else(|e| e.into_inner()) = Some(r);
                // Last touch of borrowed data: after this store the host may return.
                done_ref.store(true, Ordering::Release);
            };
            let boxed: Box<dyn FnOnce() + Send + '_> = Box::new(job);
            // SAFETY: the job borrows `self.kernels`, `experts`, `x`, `y`, `done` and
            // `outcome`, all of which outlive this function; the loop below does not return
            // before the job's final store to `done` (a panic inside the kernels is caught
            // first, so the store always happens), and the job touches nothing after it.
            let erased: Box<dyn FnOnce() + Send + 'static> = unsafe { std::mem::transmute(boxed) };
            let job = ErasedJob(erased);
            pool.spawn(move || (job.0)());
        }
        // The host's own work while the pool computes; a panic in it waits for the job too.
        let mine = std::panic::catch_unwind(std::panic::AssertUnwindSafe(beside));
        while !done.load(Ordering::Acquire) {
            std::hint::spin_loop();
        }
        if let Err(e) = mine {
            std::panic::resume_unwind(e);
        }
        match outcome.into_inner().unwrap_or_else(|e| e.into_inner()) {
            Some(Ok(r)) => r.map_err(kernel_err),
            Some(Err(_)) => Err(RuntimeError::Kernel(
                "the CPU expert kernels panicked during a layer call".into(),
            )),
            None => Err(RuntimeError::Kernel(
                "a CPU layer job finished without a result".into(),
            )),
        }
    }
}

impl Drop for CpuExecutor {
    fn drop(&mut self) {
        self.end_step();
    }
}

/// `spin_loop` hints between two polls of the pool (keeps a poll's cache traffic low).
const SPIN_BATCH: usize = 16;

/// The fixed cost of one layer job on `exec`: the mean wall time (us) of `jobs` calls that
/// each compute one expert for one token of a tiny geometry, inside an open step. Comparing
/// [`PoolWait::Spin`] with [`PoolWait::Park`] shows what spinning saves per layer.
pub fn measure_job_overhead_us(exec: &mut CpuExecutor, jobs: usize) -> Result<f64> {
    let geometry = MoeGeometry {
        hidden: PROBE_HIDDEN,
        intermediate: PROBE_INTERMEDIATE,
        experts: 1,
        top_k: 1,
        moe_layers: 1,
        shared_experts: 0,
    };
    let format = ExpertFormat::Q4_0;
    let mut weights = vec![0u8; geometry.expert_bytes(format) as usize];
    ft_kernels::fill_expert_from_seed(format, &geometry, 1, 0, 0, &mut weights)
        .map_err(|e| RuntimeError::Kernel(e.to_string()))?;
    let tokens = [(0u32, 1.0f32)];
    let work = [ExpertWork {
        weights: &weights,
        tokens: &tokens,
    }];
    let x = vec![0.5f32; PROBE_HIDDEN];
    let mut y = vec![0f32; PROBE_HIDDEN];
    let opened = !exec.in_step();
    exec.begin_step();
    // One call first so that the spinners are up and the scratch is sized.
    exec.run_layer(format, &geometry, ActivationPath::Int8, &work, &x, &mut y)?;
    let n = jobs.max(1);
    let t0 = Instant::now();
    for _ in 0..n {
        exec.run_layer(format, &geometry, ActivationPath::Int8, &work, &x, &mut y)?;
    }
    let us = t0.elapsed().as_secs_f64() * 1e6 / n as f64;
    if opened {
        exec.end_step();
    }
    Ok(us)
}

/// Width of the fixed-cost probe's expert (elements): small enough that the work is a few
/// microseconds, a multiple of every format's block.
const PROBE_HIDDEN: usize = 64;
/// FFN width of the fixed-cost probe's expert (elements).
const PROBE_INTERMEDIATE: usize = 32;

#[cfg(test)]
mod tests {
    use super::*;

    fn geometry() -> MoeGeometry {
        MoeGeometry {
            hidden: 64,
            intermediate: 32,
            experts: 3,
            top_k: 2,
            moe_layers: 1,
            shared_experts: 0,
        }
    }

    /// Run a small layer through the executor and through the kernels directly.
    fn layer(exec: &mut CpuExecutor, path: ActivationPath) -> (Vec<f32>, Vec<f32>) {
        let g = geometry();
        let format = ExpertFormat::Nvfp4;
        let eb = g.expert_bytes(format) as usize;
        let mut w = vec![0u8; 3 * eb];
        for e in 0..3 {
            ft_kernels::fill_expert_from_seed(format, &g, 5, 0, e, &mut w[e * eb..(e + 1) * eb])
                .unwrap();
        }
        let t0 = [(0u32, 0.25f32), (2, 0.5)];
        let t1 = [(1u32, 0.75f32)];
        let t2 = [(0u32, 0.75f32), (1, 0.25), (2, 0.5)];
        let work = [
            ExpertWork {
                weights: &w[..eb],
                tokens: &t0,
            },
            ExpertWork {
                weights: &w[eb..2 * eb],
                tokens: &t1,
            },
            ExpertWork {
                weights: &w[2 * eb..],
                tokens: &t2,
            },
        ];
        let x: Vec<f32> = (0..3 * g.hidden)
            .map(|i| ((i * 37 % 101) as f32 / 50.0) - 1.0)
            .collect();
        let mut y = vec![0f32; x.len()];
        exec.run_layer(format, &g, path, &work, &x, &mut y).unwrap();
        let mut direct = CpuExperts::new(1).unwrap();
        let mut want = vec![0f32; x.len()];
        direct
            .run_layer(format, &g, path, &work, &x, &mut want)
            .unwrap();
        (y, want)
    }

    #[test]
    fn spinning_and_parked_executors_compute_what_the_kernels_compute() {
        for wait in [PoolWait::Spin, PoolWait::SpinBeside, PoolWait::Park] {
            let mut exec = CpuExecutor::new(3, wait).unwrap();
            for step in 0..3 {
                exec.begin_step();
                for _ in 0..3 {
                    let (got, want) = layer(&mut exec, ActivationPath::Int8);
                    // The int8 path is bit-identical whatever the threads.
                    assert!(
                        got.iter()
                            .zip(&want)
                            .all(|(a, b)| a.to_bits() == b.to_bits()),
                        "{wait:?} step {step}"
                    );
                    let (got, want) = layer(&mut exec, ActivationPath::F32);
                    let err = got
                        .iter()
                        .zip(&want)
                        .map(|(a, b)| (a - b).abs())
                        .fold(0f32, f32::max);
                    assert!(err < 1e-5, "{wait:?}: f32 path differs by {err}");
                }
                exec.end_step();
                assert!(!exec.in_step());
            }
            assert_eq!(exec.jobs(), 18);
        }
    }

    #[test]
    fn threads_count_the_computing_threads_and_spin_leaves_the_host_one() {
        for (threads, wait, workers, runs_as) in [
            (4, PoolWait::Spin, 3, PoolWait::Spin),
            (4, PoolWait::SpinBeside, 4, PoolWait::SpinBeside),
            (4, PoolWait::Park, 4, PoolWait::Park),
            // Nobody to share with: one worker computes, the host spins beside it.
            (1, PoolWait::Spin, 1, PoolWait::SpinBeside),
        ] {
            let exec = CpuExecutor::new(threads, wait).unwrap();
            assert_eq!(exec.threads(), threads, "{wait:?}");
            assert_eq!(exec.workers(), workers, "{wait:?} x {threads}");
            assert_eq!(exec.wait_policy(), runs_as, "{wait:?} x {threads}");
        }
    }

    #[test]
    fn spinners_return_after_the_step() {
        for wait in [PoolWait::Spin, PoolWait::SpinBeside] {
            let mut exec = CpuExecutor::new(2, wait).unwrap();
            exec.begin_step();
            let _ = layer(&mut exec, ActivationPath::Int8);
            exec.end_step();
            assert_eq!(exec.state.live.load(Ordering::SeqCst), 0, "{wait:?}");
        }
    }

    #[test]
    fn kernel_errors_come_back_as_errors_from_a_hot_pool() {
        for wait in [PoolWait::Spin, PoolWait::SpinBeside] {
            let mut exec = CpuExecutor::new(2, wait).unwrap();
            exec.begin_step();
            let g = geometry();
            let tokens = [(5u32, 1.0f32)];
            let w = vec![0u8; g.expert_bytes(ExpertFormat::Nvfp4) as usize];
            let work = [ExpertWork {
                weights: &w,
                tokens: &tokens,
            }];
            let x = vec![0f32; g.hidden];
            let mut y = vec![0f32; g.hidden];
            let e = exec
                .run_layer(
                    ExpertFormat::Nvfp4,
                    &g,
                    ActivationPath::Int8,
                    &work,
                    &x,
                    &mut y,
                )
                .unwrap_err()
                .to_string();
            assert!(e.contains("token 5"), "{wait:?}: {e}");
            // Still usable.
            let (got, want) = layer(&mut exec, ActivationPath::Int8);
            assert_eq!(got, want, "{wait:?}");
            exec.end_step();
        }
    }

    #[test]
    fn zero_threads_is_refused_naming_the_flag() {
        let e = CpuExecutor::new(0, PoolWait::Spin).unwrap_err().to_string();
        assert!(e.contains("--threads"), "{e}");
        for w in [PoolWait::Spin, PoolWait::SpinBeside, PoolWait::Park] {
            assert_eq!(w.name().parse::<PoolWait>().unwrap(), w);
        }
        assert!("nap"
            .parse::<PoolWait>()
            .unwrap_err()
            .to_string()
            .contains("--pool-wait"));
    }

    #[test]
    fn overhead_is_measured_for_both_policies() {
        for wait in [PoolWait::Spin, PoolWait::SpinBeside, PoolWait::Park] {
            let mut exec = CpuExecutor::new(2, wait).unwrap();
            let us = measure_job_overhead_us(&mut exec, 20).unwrap();
            assert!(us > 0.0 && us.is_finite(), "{wait:?}: {us}");
            assert!(!exec.in_step());
        }
    }
}
