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
//! - [`CpuExecutor::run_layer`] injects the layer call ([`CpuExperts::run_layer`]) into the
//!   pool as one job; a spinner picks it up, and its parallel tiles are stolen by the other
//!   spinners. The host thread spins on an atomic flag instead of sleeping on a latch.
//! - [`CpuExecutor::end_step`] lowers the flag the spinners watch: they return, and rayon
//!   parks its workers as usual, so an idle process costs no CPU.
//!
//! With [`PoolWait::Park`] none of this happens: the host calls the kernels directly (rayon's
//! own wake-ups), which is the baseline the fixed-cost probe compares with, and the right
//! choice where cores are scarce (a 2-core machine running the host-emulated device).
//!
//! Threads: the pool has `threads` workers and the host thread spins beside them, so a hot
//! step occupies `threads + 1` cores; leave one core for the host (`--threads` = cores - 1).

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use ft_kernels::step::LayerTiming;
use ft_kernels::{ActivationPath, CpuExperts, ExpertWork};
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
    /// Workers and the host spin between layers within a step (lowest latency; needs
    /// `threads + 1` free cores).
    #[default]
    Spin,
    /// Workers park between layers and the host sleeps until a job is done (rayon's own
    /// behaviour): a wake-up per layer, but no core is held.
    Park,
}

impl PoolWait {
    /// Name on the command line and in JSON.
    pub fn name(self) -> &'static str {
        match self {
            PoolWait::Spin => "spin",
            PoolWait::Park => "park",
        }
    }
}

impl std::str::FromStr for PoolWait {
    type Err = RuntimeError;

    fn from_str(s: &str) -> Result<Self> {
        match s.to_ascii_lowercase().as_str() {
            "spin" => Ok(PoolWait::Spin),
            "park" => Ok(PoolWait::Park),
            _ => Err(RuntimeError::invalid(
                "--pool-wait",
                format!("'{s}' is neither 'spin' nor 'park'"),
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
    /// An executor over a new kernels pool of `threads` workers (at least 1).
    pub fn new(threads: usize, wait: PoolWait) -> Result<Self> {
        if threads == 0 {
            return Err(RuntimeError::invalid(
                "--threads",
                "the CPU pool needs at least 1 thread",
            ));
        }
        let kernels = CpuExperts::new(threads).map_err(|e| RuntimeError::Kernel(e.to_string()))?;
        Ok(Self::with_kernels(kernels, wait))
    }

    /// An executor over existing kernels (and their pool).
    pub fn with_kernels(kernels: CpuExperts, wait: PoolWait) -> Self {
        CpuExecutor {
            kernels,
            wait,
            state: Arc::new(SpinState::default()),
            in_step: false,
            jobs: 0,
        }
    }

    /// Worker threads of the pool (the host thread not counted).
    pub fn threads(&self) -> usize {
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

    /// Layer jobs run so far.
    pub fn jobs(&self) -> u64 {
        self.jobs
    }

    /// True between [`CpuExecutor::begin_step`] and [`CpuExecutor::end_step`].
    pub fn in_step(&self) -> bool {
        self.in_step
    }

    /// Open a step: with [`PoolWait::Spin`], wake every worker now (while the GPU runs the
    /// step's first layer) and keep it spinning until [`CpuExecutor::end_step`].
    pub fn begin_step(&mut self) {
        if self.in_step {
            return;
        }
        self.in_step = true;
        if self.wait != PoolWait::Spin {
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
        self.jobs += 1;
        let kernel_err = |e: ft_kernels::KernelError| RuntimeError::Kernel(e.to_string());
        if !(self.in_step && self.wait == PoolWait::Spin) {
            return self
                .kernels
                .run_layer(format, geometry, path, experts, x, y)
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
        while !done.load(Ordering::Acquire) {
            std::hint::spin_loop();
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
        for wait in [PoolWait::Spin, PoolWait::Park] {
            let mut exec = CpuExecutor::new(2, wait).unwrap();
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
    fn spinners_return_after_the_step() {
        let mut exec = CpuExecutor::new(2, PoolWait::Spin).unwrap();
        exec.begin_step();
        let _ = layer(&mut exec, ActivationPath::Int8);
        exec.end_step();
        assert_eq!(exec.state.live.load(Ordering::SeqCst), 0);
    }

    #[test]
    fn kernel_errors_come_back_as_errors_from_a_hot_pool() {
        let mut exec = CpuExecutor::new(1, PoolWait::Spin).unwrap();
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
        assert!(e.contains("token 5"), "{e}");
        // Still usable.
        let (got, want) = layer(&mut exec, ActivationPath::Int8);
        assert_eq!(got, want);
        exec.end_step();
    }

    #[test]
    fn zero_threads_is_refused_naming_the_flag() {
        let e = CpuExecutor::new(0, PoolWait::Spin).unwrap_err().to_string();
        assert!(e.contains("--threads"), "{e}");
        assert_eq!("park".parse::<PoolWait>().unwrap(), PoolWait::Park);
        assert!("nap"
            .parse::<PoolWait>()
            .unwrap_err()
            .to_string()
            .contains("--pool-wait"));
    }

    #[test]
    fn overhead_is_measured_for_both_policies() {
        for wait in [PoolWait::Spin, PoolWait::Park] {
            let mut exec = CpuExecutor::new(1, wait).unwrap();
            let us = measure_job_overhead_us(&mut exec, 20).unwrap();
            assert!(us > 0.0 && us.is_finite(), "{wait:?}: {us}");
            assert!(!exec.in_step());
        }
    }
}
