//! A short timing of the CPU side's own work, to say how fast the machine's CPU side is now
//! against when it was probed.
//!
//! Why it exists: on a shared host the CPU side of a decode step moves by up to 3x within
//! minutes, in steps (experiments/validate-h200, the drift run of 2026-12-05), while a
//! profile is fitted to one probe of about 20 s, so the CPU-heavy predictions inherit the
//! probe's moment. [`measure`] times one layer of `top_k` experts at one token from the
//! served bank (the point of the `cpu-step` probe that a serving CPU share is made of), in a
//! fraction of a second, walking through the bank so that every repetition reads its
//! weights from DRAM rather than from the last level cache. `ft probe` keeps its checks in
//! the profile; `ft serve` at start and `ft run` before each round take their own; the
//! ratio ([`ft_model::profile::CpuCheck::speed_since`]) is the speed
//! `PerfParams::with_cpu_speed` scales the model's CPU side by.

use std::time::{Duration, Instant};

use ft_kernels::{ActivationPath, ExpertWork};
use ft_model::profile::CpuCheck;
use ft_model::{ExpertId, ModelSpec, MoeGeometry};

use crate::bank::HostBank;
use crate::cpu_pool::{CpuExecutor, PoolWait};
use crate::device::Device;
use crate::engine::token_input;
use crate::error::{Result, RuntimeError};

/// Wall-clock budget of one check: about 100 repetitions of a 1 ms layer.
pub const CHECK_BUDGET: Duration = Duration::from_millis(150);
/// Repetitions a check times at least (beyond the untimed first), whatever its budget.
const MIN_REPS: usize = 5;
/// Repetitions a check times at most.
const MAX_REPS: usize = 400;
/// Seed of the check's input row (any fixed value: the work, not the numbers, is timed).
const CHECK_SEED: u64 = 0xC7EC;

/// Time one layer of the bank's `top_k` experts at one token on `exec` (its threads and
/// wait policy), `path` activations, for about `budget` (at least `MIN_REPS` timed
/// repetitions after one untimed), starting at flat expert `start` of the bank and moving on
/// by `top_k` experts each repetition. Returns the median.
pub fn measure(
    exec: &mut CpuExecutor,
    bank: &HostBank,
    path: ActivationPath,
    budget: Duration,
    start: usize,
) -> Result<CpuCheck> {
    let layout = bank.layout();
    let g = layout.geometry;
    let total = g.experts * g.moe_layers;
    let k = g.top_k.min(total);
    if k == 0 {
        return Err(RuntimeError::invalid(
            "CPU check",
            "the bank holds no expert to time",
        ));
    }
    let x = token_input(CHECK_SEED, 0, 0, g.hidden);
    let mut y = vec![0f32; g.hidden];
    let routed = [(0u32, 1.0 / k as f32)];
    let mut flat = start % total;
    let mut times = Vec::new();
    let began = Instant::now();
    exec.begin_step();
    let result = (|| -> Result<()> {
        while times.len() <= MIN_REPS || (times.len() <= MAX_REPS && began.elapsed() < budget) {
            let experts = (0..k)
                .map(|i| {
                    let f = (flat + i) % total;
                    Ok(ExpertWork {
                        weights: bank.expert(ExpertId::new(f / g.experts, f % g.experts))?,
                        tokens: &routed,
                    })
                })
                .collect::<Result<Vec<_>>>()?;
            flat = (flat + k) % total;
            let t0 = Instant::now();
            exec.run_layer(layout.format, &g, path, &experts, &x, &mut y)?;
            times.push(t0.elapsed().as_secs_f64() * 1e6);
        }
        Ok(())
    })();
    exec.end_step();
    result?;
    // The first repetition is a warm-up (thread wake-up, first touch of the input).
    let timed = &mut times[1..];
    timed.sort_by(f64::total_cmp);
    Ok(CpuCheck {
        experts: k as u32,
        tokens_per_expert: 1,
        expert_bytes: layout.expert_bytes as f64,
        threads: exec.threads() as u32,
        time_us: timed[timed.len() / 2],
        reps: timed.len() as u32,
    })
}

/// [`measure`] on a bank of `model` filled for the check (in `device`'s host memory:
/// page-locked on a CUDA device, as the engine's bank), on a pool of its own
/// ([`measure_on`]): `ft predict --cpu-check` times the CPU side this way without an engine.
/// The bank is one layer of as many of the model's experts as fit [`CHECK_BANK_BYTES`] (at
/// least `top_k`): enough distinct weights that every repetition reads DRAM, filled in a
/// fraction of a second.
pub fn measure_model(
    device: &Device,
    model: &ModelSpec,
    threads: usize,
    wait: PoolWait,
    budget: Duration,
) -> Result<CpuCheck> {
    let g = model.geometry;
    let fit = (CHECK_BANK_BYTES / model.expert_bytes().max(1)) as usize;
    let geometry = MoeGeometry {
        experts: fit.clamp(g.top_k, g.experts.max(g.top_k)),
        moe_layers: 1,
        ..g
    };
    let bank = HostBank::from_seed(device, model.format, &geometry, CHECK_SEED)?;
    let path = ActivationPath::preferred(model.format);
    measure_on(threads, wait, &bank, path, budget, 0)
}

/// Most bytes of expert weights [`measure_model`] fills for its bank: above any last level
/// cache of the machines it runs on (at most 320 MB), and quick to fill.
pub const CHECK_BANK_BYTES: u64 = 768 << 20;

/// [`measure`] on a pool of its own: `threads` threads waiting by `wait` (the probe checks
/// the thread counts it has no serving executor for this way).
pub fn measure_on(
    threads: usize,
    wait: PoolWait,
    bank: &HostBank,
    path: ActivationPath,
    budget: Duration,
    start: usize,
) -> Result<CpuCheck> {
    let mut exec = CpuExecutor::new(threads, wait)?;
    measure(&mut exec, bank, path, budget, start)
}

/// `ft predict --cpu-check`: the CPU check taken now on a device of `kind` for `model`,
/// with `profile`'s threads and timed as the probe timed its own check
/// ([`crate::probe::probe_pool_wait`]), set against the profile's check of the same work.
/// An error names `--cpu-check` where the profile holds no check of that work.
pub fn check_against_profile(
    kind: crate::device::DeviceKind,
    profile: &ft_model::profile::Profile,
    model: &ModelSpec,
) -> Result<ft_model::report::CheckedSpeed> {
    use crate::probe::{probe_pool_wait, CpuTopology};
    let threads = profile.params.cpu_threads as usize;
    if profile.cpu_checks.is_empty() {
        return Err(RuntimeError::invalid(
            "--cpu-check",
            "the profile holds no CPU check (probed before the check existed): probe again",
        ));
    }
    let dev = Device::open(&crate::device::DeviceSpec::of_kind(kind))?;
    let wait = probe_pool_wait(kind, threads, CpuTopology::detect().threads as usize);
    let now = measure_model(&dev, model, threads, wait, CHECK_BUDGET)?;
    ft_model::report::CheckedSpeed::against(&profile.cpu_checks, now)?.ok_or_else(|| {
        RuntimeError::invalid(
            "--cpu-check",
            format!(
                "the profile holds no CPU check of this work ({} experts of {:.0} B at {threads} threads)",
                now.experts, now.expert_bytes
            ),
        )
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::device::HostDeviceConfig;
    use ft_model::ExpertFormat;

    fn small_bank() -> HostBank {
        let device = Device::host(HostDeviceConfig::default()).unwrap();
        let g = MoeGeometry {
            hidden: 256,
            intermediate: 128,
            experts: 8,
            top_k: 2,
            moe_layers: 2,
            shared_experts: 0,
        };
        HostBank::from_seed(&device, ExpertFormat::Int8, &g, 7).unwrap()
    }

    #[test]
    fn a_check_times_top_k_experts_at_one_token_with_the_executors_threads() {
        let bank = small_bank();
        let c = measure_on(
            2,
            PoolWait::Park,
            &bank,
            ActivationPath::F32,
            Duration::ZERO,
            5,
        )
        .unwrap();
        assert_eq!((c.experts, c.tokens_per_expert, c.threads), (2, 1, 2));
        assert_eq!(c.expert_bytes, bank.layout().expert_bytes as f64);
        assert!(c.reps as usize >= MIN_REPS, "{} reps", c.reps);
        assert!(c.time_us.is_finite() && c.time_us > 0.0);
        // Two checks of the same work compare; a check at other threads does not.
        let d = measure_on(
            2,
            PoolWait::Park,
            &bank,
            ActivationPath::F32,
            Duration::ZERO,
            0,
        )
        .unwrap();
        assert!(c.speed_since(&d).unwrap() > 0.0);
        let e = measure_on(
            1,
            PoolWait::Park,
            &bank,
            ActivationPath::F32,
            Duration::ZERO,
            0,
        )
        .unwrap();
        assert!(c.speed_since(&e).is_err());
    }
}
