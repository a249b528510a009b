//! A phase of a layer call whose tiles the calling thread shares with a rayon pool's workers.
//!
//! Why it exists: the hybrid runtime's host thread waits for each layer's CPU share anyway.
//! Spinning idle beside `T` pool workers holds `T + 1` cores for `T` threads of work, and on
//! a host whose every core is then taken (15 workers and the host on 16 vCPUs) any other
//! thread that wakes (the GPU driver's, the OS's, a monitor's) preempts a worker, possibly in
//! the middle of a tile, and the whole layer waits for it: the H200 grid of 2026-12-04 saw
//! 77 steps slower than twice their run's median at 15 threads against 2 at 4 threads, all in
//! strategies with a CPU share. With the caller as one of the `T` computing threads
//! (`T - 1` workers), a core stays free for everything else.
//!
//! How: a phase of `n` tiles is a shared counter. The caller enlists up to `helpers` pool
//! workers with one small job each ([`rayon::ThreadPool::spawn`]: whichever worker is free
//! takes it), then takes tiles itself; every participant takes the next tile until none is
//! left. Tiles are handed out one at a time, so a worker that starts late (asleep,
//! descheduled) takes none and holds nothing back: the caller waits only for tiles in flight.
//! A helper job that starts after the phase closed returns without touching the phase's
//! borrowed tile function (the handshake is in [`run_phase`]).

use std::any::Any;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use rayon::ThreadPool;

/// The tile function, with its lifetime erased (see [`run_phase`] for why that is sound).
type TileFn = dyn Fn(usize) + Sync + 'static;

/// One phase's shared state; helper jobs hold it through an `Arc`, so a late job never
/// touches freed memory.
struct Phase {
    /// Next tile to hand out (may run past `tiles`).
    next: AtomicUsize,
    /// Tiles of the phase.
    tiles: usize,
    /// Helper jobs that have entered (and may be running tiles).
    active: AtomicUsize,
    /// Set by the caller once every tile is taken: a helper entering later returns at once.
    closed: AtomicBool,
    /// The tile function; valid until the caller has seen `closed` set and `active` at 0.
    f: *const TileFn,
    /// The first panic of a helper's tile, resumed on the caller.
    panic: Mutex<Option<Box<dyn Any + Send>>>,
}

// SAFETY: `f` points to a `Sync` closure, called from several threads only while the caller
// keeps it alive (see `run_phase`); everything else is atomics and a mutex.
unsafe impl Send for Phase {}
unsafe impl Sync for Phase {}

impl Phase {
    /// Take and run tiles until none is left.
    ///
    /// # Safety
    /// The caller of [`run_phase`] must still be inside it (so `f` is alive).
    unsafe fn drain(&self) {
        let f = &*self.f;
        loop {
            let i = self.next.fetch_add(1, Ordering::Relaxed);
            if i >= self.tiles {
                break;
            }
            f(i);
        }
    }

    /// A helper job's body: enter, run tiles unless the phase is closed, leave.
    fn help(&self) {
        // Dekker-style handshake with the caller (all SeqCst): the helper announces itself,
        // then reads `closed`; the caller sets `closed`, then reads `active`. In the single
        // order of these four operations either the helper sees `closed` (and touches
        // nothing) or the caller sees the helper in `active` (and waits for it).
        self.active.fetch_add(1, Ordering::SeqCst);
        if !self.closed.load(Ordering::SeqCst) {
            // SAFETY: the caller is still in `run_phase`: it cannot leave while `active` > 0.
            let r =
                std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| unsafe { self.drain() }));
            if let Err(e) = r {
                self.panic
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .get_or_insert(e);
            }
        }
        // Release: this helper's tile writes happen before the caller's acquire of 0.
        self.active.fetch_sub(1, Ordering::SeqCst);
    }
}

/// Run `f(i)` for every tile `i` in `0..tiles` on the calling thread and up to `helpers`
/// workers of `pool`, each tile exactly once; returns when every tile has run. A panic in
/// a tile (on any thread) is resumed on the caller after every tile in flight has finished.
///
/// The calling thread must not be a worker of `pool` that the phase needs (it would enlist
/// itself); callers inside the pool use rayon's own parallel iterators instead.
pub(crate) fn for_each(
    pool: &ThreadPool,
    helpers: usize,
    tiles: usize,
    f: &(dyn Fn(usize) + Sync),
) {
    run_phase(pool, helpers.min(tiles.saturating_sub(1)), tiles, f, None);
}

/// As [`for_each`], but the calling thread first runs `first` (once, whatever the tile
/// count) while the helpers already take tiles, and joins them afterwards. This is how the
/// hybrid runtime's host thread submits the GPU work that the CPU share does not wait for
/// while the pool computes: the helpers start at once, and the caller takes the tiles still
/// left when it is done. A panic in `first` reaches the caller after every tile in flight
/// has finished (the caller then takes no tiles).
pub(crate) fn for_each_after(
    pool: &ThreadPool,
    helpers: usize,
    tiles: usize,
    f: &(dyn Fn(usize) + Sync),
    first: &mut dyn FnMut(),
) {
    // The caller is busy first: even a single tile goes to a helper.
    run_phase(pool, helpers.min(tiles), tiles, f, Some(first));
}

/// One phase on the caller and `helpers` workers, the caller running `first` before its
/// tiles.
fn run_phase(
    pool: &ThreadPool,
    helpers: usize,
    tiles: usize,
    f: &(dyn Fn(usize) + Sync),
    mut first: Option<&mut dyn FnMut()>,
) {
    if helpers == 0 {
        if let Some(first) = first {
            first();
        }
        (0..tiles).for_each(f);
        return;
    }
    // SAFETY (lifetime erasure): `f` is only called from `Phase::drain`, by the caller below
    // or by a helper that entered before the caller closed the phase; the caller does not
    // return (or unwind) before `active` is back to 0 after closing, so no call outlives
    // the borrow. Late helpers see `closed` and never dereference `f`.
    let f: *const TileFn =
        unsafe { std::mem::transmute::<*const (dyn Fn(usize) + Sync + '_), *const TileFn>(f) };
    let phase = Arc::new(Phase {
        next: AtomicUsize::new(0),
        tiles,
        active: AtomicUsize::new(0),
        closed: AtomicBool::new(false),
        f,
        panic: Mutex::new(None),
    });
    for _ in 0..helpers {
        let p = Arc::clone(&phase);
        pool.spawn(move || p.help());
    }
    // SAFETY: we are inside `run_phase`, so `f` is alive.
    let mine = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        if let Some(first) = first.as_mut() {
            first();
        }
        unsafe { phase.drain() }
    }));
    phase.closed.store(true, Ordering::SeqCst);
    while phase.active.load(Ordering::SeqCst) != 0 {
        std::hint::spin_loop();
    }
    if let Err(e) = mine {
        std::panic::resume_unwind(e);
    }
    let theirs = phase.panic.lock().unwrap_or_else(|e| e.into_inner()).take();
    if let Some(e) = theirs {
        std::panic::resume_unwind(e);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicU32;

    fn pool(n: usize) -> ThreadPool {
        rayon::ThreadPoolBuilder::new()
            .num_threads(n)
            .build()
            .unwrap()
    }

    #[test]
    fn every_tile_runs_exactly_once_for_any_helper_count() {
        let p = pool(3);
        for helpers in [0, 1, 3, 8] {
            for tiles in [0, 1, 2, 7, 64, 1000] {
                let hits: Vec<AtomicU32> = (0..tiles).map(|_| AtomicU32::new(0)).collect();
                for_each(&p, helpers, tiles, &|i| {
                    hits[i].fetch_add(1, Ordering::Relaxed);
                });
                assert!(
                    hits.iter().all(|h| h.load(Ordering::Relaxed) == 1),
                    "helpers {helpers}, tiles {tiles}"
                );
            }
        }
    }

    #[test]
    fn tile_writes_are_visible_to_the_caller_and_several_threads_take_part() {
        let p = pool(2);
        let caller = std::thread::current().id();
        let threads = Mutex::new(std::collections::HashSet::new());
        let helper_ran = AtomicBool::new(false);
        let out: Vec<AtomicU32> = (0..256).map(|_| AtomicU32::new(0)).collect();
        for _ in 0..50 {
            for_each(&p, 2, out.len(), &|i| {
                let me = std::thread::current().id();
                threads.lock().unwrap().insert(me);
                if me != caller {
                    helper_ran.store(true, Ordering::Release);
                } else {
                    // On a loaded machine (a 2-core CI runner with every test at once) the
                    // caller can take all the tiles before a worker is scheduled: it waits
                    // here, for at most 10 s, until a helper has taken one. So this test
                    // checks that helpers take part, not how quickly the OS wakes them.
                    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
                    while !helper_ran.load(Ordering::Acquire)
                        && std::time::Instant::now() < deadline
                    {
                        std::thread::sleep(std::time::Duration::from_micros(100));
                    }
                }
                // A little work per tile so that the helpers get a share.
                let mut acc = i as u32;
                for k in 0..2000u32 {
                    acc = acc.wrapping_mul(1_664_525).wrapping_add(k);
                }
                std::hint::black_box(acc);
                out[i].store(i as u32 + 1, Ordering::Relaxed);
            });
            assert!(out
                .iter()
                .enumerate()
                .all(|(i, v)| v.load(Ordering::Relaxed) == i as u32 + 1));
        }
        let seen = threads.into_inner().unwrap();
        assert!(seen.contains(&caller), "the caller ran no tile");
        assert!(seen.len() >= 2, "only {} thread(s) ran tiles", seen.len());
    }

    #[test]
    fn a_panicking_tile_reaches_the_caller_after_the_phase() {
        let p = pool(2);
        for bad in [0usize, 63] {
            let ran = AtomicU32::new(0);
            let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                for_each(&p, 2, 64, &|i| {
                    ran.fetch_add(1, Ordering::Relaxed);
                    if i == bad {
                        panic!("tile {i}");
                    }
                })
            }));
            let msg = r
                .unwrap_err()
                .downcast_ref::<String>()
                .cloned()
                .unwrap_or_default();
            assert_eq!(msg, format!("tile {bad}"));
            // The pool still works afterwards.
            let n = AtomicU32::new(0);
            for_each(&p, 2, 10, &|_| {
                n.fetch_add(1, Ordering::Relaxed);
            });
            assert_eq!(n.load(Ordering::Relaxed), 10);
        }
    }

    #[test]
    fn work_first_runs_once_on_the_caller_while_helpers_take_tiles() {
        let p = pool(2);
        let caller = std::thread::current().id();
        for helpers in [0, 1, 2] {
            for tiles in [0, 1, 5, 200] {
                let hits: Vec<AtomicU32> = (0..tiles).map(|_| AtomicU32::new(0)).collect();
                let mut first = Vec::new();
                for_each_after(
                    &p,
                    helpers,
                    tiles,
                    &|i| {
                        hits[i].fetch_add(1, Ordering::Relaxed);
                    },
                    &mut || first.push(std::thread::current().id()),
                );
                assert_eq!(first, vec![caller], "helpers {helpers}, tiles {tiles}");
                assert!(
                    hits.iter().all(|h| h.load(Ordering::Relaxed) == 1),
                    "helpers {helpers}, tiles {tiles}"
                );
            }
        }
        // While the caller is held in `first`, the helpers run the whole phase.
        let done = AtomicU32::new(0);
        let others = AtomicU32::new(0);
        for_each_after(
            &p,
            2,
            8,
            &|_| {
                if std::thread::current().id() != caller {
                    others.fetch_add(1, Ordering::Relaxed);
                }
                done.fetch_add(1, Ordering::Relaxed);
            },
            &mut || {
                let t0 = std::time::Instant::now();
                while done.load(Ordering::Relaxed) < 8 && t0.elapsed().as_secs() < 5 {
                    std::hint::spin_loop();
                }
            },
        );
        assert_eq!(done.load(Ordering::Relaxed), 8);
        assert_eq!(
            others.load(Ordering::Relaxed),
            8,
            "the caller ran tiles while held"
        );
    }

    #[test]
    fn a_panic_in_the_work_first_reaches_the_caller_after_the_helpers() {
        let p = pool(2);
        let ran = AtomicU32::new(0);
        let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            for_each_after(
                &p,
                2,
                64,
                &|_| {
                    ran.fetch_add(1, Ordering::Relaxed);
                },
                &mut || panic!("first"),
            )
        }));
        let msg = r
            .unwrap_err()
            .downcast_ref::<&str>()
            .copied()
            .unwrap_or_default();
        assert_eq!(msg, "first");
        // The pool still works afterwards.
        let n = AtomicU32::new(0);
        for_each(&p, 2, 10, &|_| {
            n.fetch_add(1, Ordering::Relaxed);
        });
        assert_eq!(n.load(Ordering::Relaxed), 10);
    }

    #[test]
    fn a_busy_pool_does_not_hold_the_phase_back() {
        // Every worker is busy for a long time: the caller runs every tile itself and
        // returns without waiting for the late helper jobs, which later return untouched.
        let p = pool(1);
        let release = Arc::new(AtomicBool::new(false));
        let r2 = Arc::clone(&release);
        p.spawn(move || {
            while !r2.load(Ordering::Acquire) {
                std::hint::spin_loop();
            }
        });
        let count = AtomicU32::new(0);
        let t0 = std::time::Instant::now();
        for_each(&p, 1, 100, &|_| {
            count.fetch_add(1, Ordering::Relaxed);
        });
        assert_eq!(count.load(Ordering::Relaxed), 100);
        assert!(t0.elapsed() < std::time::Duration::from_secs(5));
        release.store(true, Ordering::Release);
    }
}
