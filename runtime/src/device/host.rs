//! The host-emulated device: CUDA's semantics on host threads.
//!
//! Its "device memory" is page-aligned host RAM with a capacity (so cache sizing can be
//! refused as on a GPU), each stream is a worker thread running its queued operations in
//! order, a host-device copy is a `memcpy` on that thread (optionally throttled to an
//! emulated link bandwidth), events are counters with a condition variable, and the "GPU
//! expert kernel" runs the CPU expert kernels of `ft-kernels`. The engine's orchestration
//! (overlap of gathers with compute, event waits between streams) therefore runs unchanged
//! and is tested on machines without a GPU.

use std::alloc::Layout;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::mpsc;
use std::sync::{Arc, Condvar, Mutex, Weak};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use super::{Clock, DeviceBuffer, DeviceInfo, DeviceKind, HostBuffer, HostDeviceConfig};
use crate::dense::DenseRead;
use crate::error::{Result, RuntimeError};
use crate::gather::CopyRegion;
use crate::gpu_experts::ExpertStep;

/// Alignment of every emulated allocation: one 4 KiB page, like pinned memory.
const PAGE: usize = 4096;

/// Longest a stream waits for a flag ([`HostStream::wait_flag`]) before it reports an
/// error: a flag never written is an engine bug, which should fail, not hang.
const FLAG_WAIT_LIMIT: Duration = Duration::from_secs(10);

/// Capacity used when the host's available memory cannot be read, bytes (4 GiB).
const FALLBACK_CAPACITY: u64 = 4 << 30;

/// One aligned heap allocation.
struct RawAlloc {
    ptr: *mut u8,
    layout: Layout,
    /// Device-memory accounting to give back on drop (`None` for host buffers).
    account: Option<Arc<AtomicU64>>,
}

// SAFETY: the allocation is plain memory; access is ordered by the stream contract.
unsafe impl Send for RawAlloc {}
// SAFETY: as above.
unsafe impl Sync for RawAlloc {}

impl Drop for RawAlloc {
    fn drop(&mut self) {
        // SAFETY: allocated with this layout in `HostMem::alloc`.
        unsafe { std::alloc::dealloc(self.ptr, self.layout) };
        if let Some(a) = &self.account {
            a.fetch_sub(self.layout.size() as u64, Ordering::Relaxed);
        }
    }
}

/// Shared handle to an emulated allocation (cloned into queued operations so the memory
/// outlives them).
#[derive(Clone)]
pub(crate) struct HostMem(Arc<RawAlloc>);

impl HostMem {
    /// A zeroed, page-aligned allocation of `bytes`.
    pub(crate) fn new(bytes: usize, what: &str) -> Result<HostMem> {
        Self::alloc(bytes, what, None)
    }

    fn alloc(bytes: usize, what: &str, account: Option<Arc<AtomicU64>>) -> Result<HostMem> {
        let layout = Layout::from_size_align(bytes.max(1), PAGE)
            .map_err(|e| RuntimeError::invalid(what, format!("{bytes} bytes: {e}")))?;
        // SAFETY: the layout has a non-zero size.
        let ptr = unsafe { std::alloc::alloc_zeroed(layout) };
        if ptr.is_null() {
            if let Some(a) = &account {
                a.fetch_sub(layout.size() as u64, Ordering::Relaxed);
            }
            return Err(RuntimeError::OutOfMemory {
                what: what.to_string(),
                requested: bytes as u64,
                available: 0,
                hint: "; the host allocator refused it".into(),
            });
        }
        Ok(HostMem(Arc::new(RawAlloc {
            ptr,
            layout,
            account,
        })))
    }

    pub(crate) fn ptr(&self) -> *mut u8 {
        self.0.ptr
    }

    pub(crate) fn addr(&self) -> u64 {
        self.0.ptr as u64
    }
}

/// The host-emulated device.
pub(crate) struct HostDevice {
    config: HostDeviceConfig,
    capacity: u64,
    allocated: Arc<AtomicU64>,
    pool: Option<Arc<rayon::ThreadPool>>,
    /// The emulated expert kernel (CPU kernels on `pool`), built at first use.
    experts: Arc<Mutex<Option<ft_kernels::step::CpuExperts>>>,
    streams: Mutex<Vec<Weak<StreamShared>>>,
}

/// Available memory of this host from /proc/meminfo, bytes.
fn host_available_bytes() -> Option<u64> {
    let text = std::fs::read_to_string("/proc/meminfo").ok()?;
    let line = text.lines().find(|l| l.starts_with("MemAvailable:"))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib * 1024)
}

impl HostDevice {
    pub(crate) fn new(config: HostDeviceConfig) -> Result<(HostDevice, DeviceInfo)> {
        if let Some(g) = config.link_gbps {
            if !(g > 0.0 && g.is_finite()) {
                return Err(RuntimeError::invalid(
                    "host device link_gbps",
                    format!("{g} must be a positive number of GB/s"),
                ));
            }
        }
        let capacity = if config.memory_bytes > 0 {
            config.memory_bytes
        } else {
            host_available_bytes()
                .map(|b| b / 2)
                .unwrap_or(FALLBACK_CAPACITY)
        };
        let pool = if config.kernel_threads > 0 {
            Some(Arc::new(
                rayon::ThreadPoolBuilder::new()
                    .num_threads(config.kernel_threads)
                    .thread_name(|i| format!("ft-hostdev-k{i}"))
                    .build()
                    .map_err(|e| RuntimeError::HostWorker {
                        what: format!("cannot start the kernel pool: {e}"),
                    })?,
            ))
        } else {
            None
        };
        let threads = pool
            .as_ref()
            .map(|p| p.current_num_threads())
            .unwrap_or_else(rayon::current_num_threads);
        let info = DeviceInfo {
            kind: DeviceKind::Host,
            ordinal: 0,
            name: format!("host-emulated ({threads} kernel threads)"),
            compute_capability: None,
            multiprocessors: threads as u32,
            total_mem_bytes: capacity,
            driver_version: None,
            host_memory: format!(
                "page-aligned heap{}",
                match config.link_gbps {
                    Some(g) => format!(", link emulated at {g} GB/s"),
                    None => String::new(),
                }
            ),
            cuda_tuning: None,
        };
        Ok((
            HostDevice {
                config,
                capacity,
                allocated: Arc::new(AtomicU64::new(0)),
                pool,
                experts: Arc::new(Mutex::new(None)),
                streams: Mutex::new(Vec::new()),
            },
            info,
        ))
    }

    pub(crate) fn free_mem_bytes(&self) -> u64 {
        self.capacity
            .saturating_sub(self.allocated.load(Ordering::Relaxed))
    }

    pub(crate) fn alloc_device(&self, bytes: usize, what: &str) -> Result<HostMem> {
        let size = bytes.max(1).next_multiple_of(PAGE) as u64;
        let before = self.allocated.fetch_add(size, Ordering::Relaxed);
        if before + size > self.capacity {
            self.allocated.fetch_sub(size, Ordering::Relaxed);
            return Err(RuntimeError::OutOfMemory {
                what: what.to_string(),
                requested: bytes as u64,
                available: self.capacity.saturating_sub(before),
                hint: format!("; the host-emulated device holds {} bytes", self.capacity),
            });
        }
        // The allocation's drop gives back `layout.size()`, which is `size` rounded to a
        // page too, so the accounting balances.
        HostMem::alloc(size as usize, what, Some(self.allocated.clone()))
    }

    pub(crate) fn new_stream(&self, name: &str, clock: Clock) -> Result<HostStream> {
        let s = HostStream::spawn(
            name,
            clock,
            self.config.link_gbps,
            self.pool.clone(),
            self.experts.clone(),
        )?;
        let mut list = self.streams.lock().map_err(poisoned)?;
        list.retain(|w| w.strong_count() > 0);
        list.push(Arc::downgrade(&s.shared));
        Ok(s)
    }

    pub(crate) fn synchronize_all(&self) -> Result<()> {
        let list: Vec<Arc<StreamShared>> = self
            .streams
            .lock()
            .map_err(poisoned)?
            .iter()
            .filter_map(|w| w.upgrade())
            .collect();
        for s in list {
            s.synchronize()?;
        }
        Ok(())
    }
}

fn poisoned<T>(_: T) -> RuntimeError {
    RuntimeError::HostWorker {
        what: "a lock was poisoned by a panicking worker".into(),
    }
}

type Op = Box<dyn FnOnce() -> Result<()> + Send>;

/// Progress of one stream: operations queued and finished, and the first failure.
struct StreamShared {
    name: String,
    queued: AtomicU64,
    done: Mutex<u64>,
    cv: Condvar,
    error: Mutex<Option<RuntimeError>>,
}

impl StreamShared {
    fn synchronize(&self) -> Result<()> {
        let target = self.queued.load(Ordering::Acquire);
        let mut done = self.done.lock().map_err(poisoned)?;
        while *done < target {
            done = self.cv.wait(done).map_err(poisoned)?;
        }
        drop(done);
        self.take_error()
    }

    fn take_error(&self) -> Result<()> {
        match self.error.lock().map_err(poisoned)?.take() {
            Some(e) => Err(e),
            None => Ok(()),
        }
    }
}

/// A stream of the host-emulated device: a worker thread and its queue.
pub(crate) struct HostStream {
    shared: Arc<StreamShared>,
    tx: Option<mpsc::Sender<Op>>,
    worker: Option<JoinHandle<()>>,
    link_gbps: Option<f64>,
    pool: Option<Arc<rayon::ThreadPool>>,
    experts: Arc<Mutex<Option<ft_kernels::step::CpuExperts>>>,
}

impl Drop for HostStream {
    fn drop(&mut self) {
        self.tx.take();
        if let Some(w) = self.worker.take() {
            // A worker that panicked has already recorded nothing more to report; drop
            // must not panic, so its join result is ignored.
            let _ = w.join();
        }
    }
}

/// Raw pointer that may be moved into a queued operation.
#[derive(Clone, Copy)]
struct SendPtr(*mut u8);
// SAFETY: the pointee is kept alive by a `HostMem` clone captured beside it, and accesses
// are ordered by the stream contract.
unsafe impl Send for SendPtr {}
// SAFETY: as above.
unsafe impl Sync for SendPtr {}

impl SendPtr {
    /// The pointer (a method, so closures capture the whole `Send` wrapper).
    fn get(self) -> *mut u8 {
        self.0
    }
}

impl HostStream {
    fn spawn(
        name: &str,
        clock: Clock,
        link_gbps: Option<f64>,
        pool: Option<Arc<rayon::ThreadPool>>,
        experts: Arc<Mutex<Option<ft_kernels::step::CpuExperts>>>,
    ) -> Result<HostStream> {
        let _ = clock;
        let shared = Arc::new(StreamShared {
            name: name.to_string(),
            queued: AtomicU64::new(0),
            done: Mutex::new(0),
            cv: Condvar::new(),
            error: Mutex::new(None),
        });
        let (tx, rx) = mpsc::channel::<Op>();
        let sh = shared.clone();
        let worker = std::thread::Builder::new()
            .name(format!("ft-hostdev-{name}"))
            .spawn(move || {
                for op in rx {
                    let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(op))
                        .unwrap_or_else(|_| {
                            Err(RuntimeError::HostWorker {
                                what: format!("an operation on stream '{}' panicked", sh.name),
                            })
                        });
                    if let Err(e) = r {
                        if let Ok(mut slot) = sh.error.lock() {
                            slot.get_or_insert(e);
                        }
                    }
                    if let Ok(mut d) = sh.done.lock() {
                        *d += 1;
                    }
                    sh.cv.notify_all();
                }
            })
            .map_err(|e| RuntimeError::HostWorker {
                what: format!("cannot start the worker of stream '{name}': {e}"),
            })?;
        Ok(HostStream {
            shared,
            tx: Some(tx),
            worker: Some(worker),
            link_gbps,
            pool,
            experts,
        })
    }

    fn enqueue(&self, op: Op) -> Result<()> {
        self.shared.take_error()?;
        self.shared.queued.fetch_add(1, Ordering::AcqRel);
        let sent = self
            .tx
            .as_ref()
            .map(|tx| tx.send(op).is_ok())
            .unwrap_or(false);
        if !sent {
            self.shared.queued.fetch_sub(1, Ordering::AcqRel);
            return Err(RuntimeError::HostWorker {
                what: format!("the worker of stream '{}' has stopped", self.shared.name),
            });
        }
        Ok(())
    }

    /// Sleep until `bytes` would have crossed the emulated link since `start`.
    fn throttle(link_gbps: Option<f64>, start: Instant, bytes: u64) {
        if let Some(g) = link_gbps {
            let due = Duration::from_secs_f64(bytes as f64 / (g * 1e9));
            let spent = start.elapsed();
            if due > spent {
                std::thread::sleep(due - spent);
            }
        }
    }

    fn copy_regions_op(
        &self,
        src: (HostMem, SendPtr),
        dst: (HostMem, SendPtr),
        regions: &[CopyRegion],
        throttled: bool,
    ) -> Result<()> {
        let regions = regions.to_vec();
        let link = if throttled { self.link_gbps } else { None };
        self.enqueue(Box::new(move || {
            let _keep = (&src.0, &dst.0);
            let start = Instant::now();
            let mut total = 0u64;
            for r in &regions {
                // SAFETY: ranges were checked against both allocations when queued; the
                // stream contract excludes overlapping concurrent access.
                unsafe {
                    std::ptr::copy(
                        src.1.get().add(r.src_offset as usize),
                        dst.1.get().add(r.dst_offset as usize),
                        r.bytes as usize,
                    );
                }
                total += r.bytes;
            }
            Self::throttle(link, start, total);
            Ok(())
        }))
    }

    pub(crate) fn copy_h2d_regions(
        &self,
        src: &HostBuffer,
        dst: &DeviceBuffer,
        regions: &[CopyRegion],
    ) -> Result<()> {
        self.copy_regions_op(host_of(src)?, dev_of(dst)?, regions, true)
    }

    pub(crate) fn gather_zero_copy(
        &self,
        src: &HostBuffer,
        dst: &DeviceBuffer,
        regions: &[CopyRegion],
    ) -> Result<()> {
        // The emulated "kernel reading mapped host memory" is the same memcpy over the same
        // emulated link.
        self.copy_regions_op(host_of(src)?, dev_of(dst)?, regions, true)
    }

    pub(crate) fn copy_d2h(
        &self,
        src: &DeviceBuffer,
        src_offset: usize,
        dst: &HostBuffer,
        dst_offset: usize,
        bytes: usize,
    ) -> Result<()> {
        let r = CopyRegion {
            src_offset: src_offset as u64,
            dst_offset: dst_offset as u64,
            bytes: bytes as u64,
        };
        self.copy_regions_op(dev_of(src)?, host_of(dst)?, &[r], true)
    }

    pub(crate) fn copy_d2d(
        &self,
        src: &DeviceBuffer,
        src_offset: usize,
        dst: &DeviceBuffer,
        dst_offset: usize,
        bytes: usize,
    ) -> Result<()> {
        let r = CopyRegion {
            src_offset: src_offset as u64,
            dst_offset: dst_offset as u64,
            bytes: bytes as u64,
        };
        self.copy_regions_op(dev_of(src)?, dev_of(dst)?, &[r], false)
    }

    pub(crate) fn upload(&self, src: &[u8], dst: &DeviceBuffer, dst_offset: usize) -> Result<()> {
        let data = src.to_vec();
        let (mem, ptr) = dev_of(dst)?;
        let link = self.link_gbps;
        self.enqueue(Box::new(move || {
            let _keep = &mem;
            let start = Instant::now();
            // SAFETY: range checked when queued.
            unsafe {
                std::ptr::copy_nonoverlapping(data.as_ptr(), ptr.get().add(dst_offset), data.len())
            };
            Self::throttle(link, start, data.len() as u64);
            Ok(())
        }))
    }

    pub(crate) fn download(
        &self,
        src: &DeviceBuffer,
        src_offset: usize,
        dst: &mut [u8],
    ) -> Result<()> {
        let (mem, ptr) = dev_of(src)?;
        let n = dst.len();
        let link = self.link_gbps;
        let (tx, rx) = mpsc::channel::<Vec<u8>>();
        self.enqueue(Box::new(move || {
            let _keep = &mem;
            let start = Instant::now();
            let mut v = vec![0u8; n];
            // SAFETY: range checked when queued.
            unsafe { std::ptr::copy_nonoverlapping(ptr.get().add(src_offset), v.as_mut_ptr(), n) };
            Self::throttle(link, start, n as u64);
            let _ = tx.send(v);
            Ok(())
        }))?;
        match rx.recv() {
            Ok(v) => {
                dst.copy_from_slice(&v);
                self.shared.take_error()
            }
            Err(_) => {
                self.shared.take_error()?;
                Err(RuntimeError::HostWorker {
                    what: format!("download on stream '{}' did not complete", self.shared.name),
                })
            }
        }
    }

    pub(crate) fn memset_zero(
        &self,
        dst: &DeviceBuffer,
        offset: usize,
        bytes: usize,
    ) -> Result<()> {
        let (mem, ptr) = dev_of(dst)?;
        self.enqueue(Box::new(move || {
            let _keep = &mem;
            // SAFETY: range checked when queued.
            unsafe { std::ptr::write_bytes(ptr.get().add(offset), 0, bytes) };
            Ok(())
        }))
    }

    pub(crate) fn combine_fixed(
        &self,
        act: &DeviceBuffer,
        parts: &DeviceBuffer,
        more: &[&DeviceBuffer],
        block: usize,
        k: usize,
    ) -> Result<()> {
        let (am, ap) = dev_of(act)?;
        let (pm, pp) = dev_of(parts)?;
        let more = more.iter().map(|b| dev_of(b)).collect::<Result<Vec<_>>>()?;
        let rounds = super::fixed_tree_rounds(k);
        self.enqueue(Box::new(move || {
            let _keep = (&am, &pm, &more);
            // SAFETY: ranges checked when queued (k blocks of `block` f32 in parts and more,
            // one in act); the buffers are page-aligned, so f32 accesses are aligned.
            let at = |p: &SendPtr, i: usize| unsafe { p.get().add(4 * i) as *mut f32 };
            let mut v = vec![0f32; k];
            for e in 0..block {
                for (j, vj) in v.iter_mut().enumerate() {
                    // SAFETY: as above.
                    *vj = unsafe { *at(&pp, j * block + e) };
                    for (_, mp) in &more {
                        // SAFETY: as above.
                        *vj += unsafe { *at(mp, j * block + e) };
                    }
                }
                for &(dst, src, n) in &rounds {
                    for i in 0..n {
                        v[dst + i] += v[src + i];
                    }
                }
                // SAFETY: as above.
                unsafe { *at(&ap, e) += v[0] };
            }
            Ok(())
        }))
    }

    pub(crate) fn add_f32(
        &self,
        dst: &DeviceBuffer,
        dst_offset: usize,
        src: &DeviceBuffer,
        src_offset: usize,
        n: usize,
    ) -> Result<()> {
        let (dm, dp) = dev_of(dst)?;
        let (sm, sp) = dev_of(src)?;
        self.enqueue(Box::new(move || {
            let _keep = (&dm, &sm);
            // Byte-wise reads: the offsets are 4-aligned but the emulated memory is only
            // guaranteed page-aligned at its start, which keeps them aligned too.
            for i in 0..n {
                // SAFETY: ranges checked when queued; f32 reads at 4-aligned addresses.
                unsafe {
                    let d = dp.get().add(dst_offset + 4 * i) as *mut f32;
                    let s = sp.get().add(src_offset + 4 * i) as *const f32;
                    *d += *s;
                }
            }
            Ok(())
        }))
    }

    pub(crate) fn hold_us(&self, us: f64) -> Result<()> {
        let d = std::time::Duration::from_secs_f64(us.max(0.0) * 1e-6);
        self.enqueue(Box::new(move || {
            std::thread::sleep(d);
            Ok(())
        }))
    }

    pub(crate) fn launch_experts(
        &self,
        step: &ExpertStep,
        weights: &DeviceBuffer,
        x: &DeviceBuffer,
        y: &DeviceBuffer,
    ) -> Result<()> {
        let step = step.clone();
        let (wm, wp) = dev_of(weights)?;
        let wlen = weights.len();
        let (xm, xp) = dev_of(x)?;
        let (ym, yp) = dev_of(y)?;
        let pool = self.pool.clone();
        let experts = self.experts.clone();
        self.enqueue(Box::new(move || {
            let _keep = (&wm, &xm, &ym);
            let n = step.tokens * step.hidden;
            // SAFETY: sizes validated when queued; the stream contract orders access.
            let (w, xs, ys) = unsafe {
                (
                    std::slice::from_raw_parts(wp.get() as *const u8, wlen),
                    std::slice::from_raw_parts(xp.get() as *const f32, n),
                    std::slice::from_raw_parts_mut(yp.get() as *mut f32, n),
                )
            };
            let mut guard = experts.lock().map_err(poisoned)?;
            if guard.is_none() {
                let cpu = match &pool {
                    Some(p) => ft_kernels::step::CpuExperts::with_pool(p.clone()),
                    None => ft_kernels::step::CpuExperts::new(0)
                        .map_err(|e| RuntimeError::Kernel(e.to_string()))?,
                };
                *guard = Some(cpu);
            }
            let cpu = guard.as_mut().ok_or_else(|| RuntimeError::HostWorker {
                what: "the emulated expert kernel is missing".into(),
            })?;
            crate::gpu_experts::host_expert_step(cpu, &step, w, xs, ys)
        }))
    }

    /// Store `value` at `flag` + `offset` once every earlier op of this stream has run (a
    /// release store: their writes are visible to whoever reads the value).
    pub(crate) fn write_flag(&self, flag: &DeviceBuffer, offset: usize, value: u32) -> Result<()> {
        let (fm, fp) = dev_of(flag)?;
        self.enqueue(Box::new(move || {
            let _keep = &fm;
            flag_at(fp, offset).store(value, Ordering::Release);
            Ok(())
        }))
    }

    /// Hold this stream until the u32 at `flag` + `offset` has reached `value` (modular, as
    /// the CUDA kernels' `gate_wait`), an error after [`FLAG_WAIT_LIMIT`].
    pub(crate) fn wait_flag(&self, flag: &DeviceBuffer, offset: usize, value: u32) -> Result<()> {
        let (fm, fp) = dev_of(flag)?;
        let name = self.shared.name.clone();
        self.enqueue(Box::new(move || {
            let _keep = &fm;
            let a = flag_at(fp, offset);
            let start = Instant::now();
            while (a.load(Ordering::Acquire).wrapping_sub(value) as i32) < 0 {
                if start.elapsed() > FLAG_WAIT_LIMIT {
                    return Err(RuntimeError::HostWorker {
                        what: format!(
                            "stream '{name}' waited {} s for a flag to reach {value}",
                            FLAG_WAIT_LIMIT.as_secs()
                        ),
                    });
                }
                std::thread::yield_now();
            }
            Ok(())
        }))
    }

    pub(crate) fn launch_dense(&self, reads: &[DenseRead<'_>], out: &DeviceBuffer) -> Result<()> {
        let mut regions = Vec::with_capacity(reads.len());
        for r in reads {
            let (m, p) = dev_of(r.buffer)?;
            regions.push((m, p, r.offset, r.bytes));
        }
        let (om, op) = dev_of(out)?;
        let pool = self.pool.clone();
        self.enqueue(Box::new(move || {
            let _keep = &om;
            let run = || {
                let mut acc = 0u64;
                for (m, p, off, bytes) in &regions {
                    let _keep = m;
                    // SAFETY: range checked when queued.
                    let s = unsafe {
                        std::slice::from_raw_parts(p.get().add(*off) as *const u8, *bytes)
                    };
                    acc = acc.wrapping_add(crate::dense::fold_bytes(s));
                }
                acc
            };
            let acc = match &pool {
                Some(p) => p.install(run),
                None => run(),
            };
            // SAFETY: out holds at least DENSE_OUT_BYTES, checked when queued.
            unsafe { std::ptr::copy_nonoverlapping(acc.to_le_bytes().as_ptr(), op.get(), 8) };
            Ok(())
        }))
    }

    pub(crate) fn record(&self, ev: &HostEvent) -> Result<()> {
        let target = {
            let mut st = ev.0.state.lock().map_err(poisoned)?;
            st.recorded += 1;
            st.recorded
        };
        let e = ev.0.clone();
        self.enqueue(Box::new(move || {
            let mut st = e.state.lock().map_err(poisoned)?;
            if st.completed < target {
                st.completed = target;
                st.at = Some(Instant::now());
            }
            drop(st);
            e.cv.notify_all();
            Ok(())
        }))
    }

    pub(crate) fn wait(&self, ev: &HostEvent) -> Result<()> {
        let target = ev.0.state.lock().map_err(poisoned)?.recorded;
        let e = ev.0.clone();
        self.enqueue(Box::new(move || e.wait_for(target)))
    }

    pub(crate) fn synchronize(&self) -> Result<()> {
        self.shared.synchronize()
    }
}

/// The u32 flag at `offset` of the allocation `p` points into ([`HostStream::write_flag`],
/// [`HostStream::wait_flag`]), as an atomic.
fn flag_at<'a>(p: SendPtr, offset: usize) -> &'a AtomicU32 {
    // SAFETY: `FlagGate::check` put 4 aligned bytes at `offset` inside the buffer when the
    // operation was queued; the caller's `HostMem` clone keeps the allocation alive while
    // the reference is used, and every stream touches a flag only atomically.
    unsafe { &*(p.get().add(offset) as *const AtomicU32) }
}

fn host_of(b: &HostBuffer) -> Result<(HostMem, SendPtr)> {
    match &b.mem {
        super::HostMemImpl::Host(m) => Ok((m.clone(), SendPtr(m.ptr()))),
        #[cfg(feature = "cuda")]
        _ => Err(super::backend_mismatch("host-emulated copy")),
    }
}

fn dev_of(b: &DeviceBuffer) -> Result<(HostMem, SendPtr)> {
    match &b.mem {
        super::BufMem::Host(m) => Ok((m.clone(), SendPtr(m.ptr()))),
        #[cfg(feature = "cuda")]
        _ => Err(super::backend_mismatch("host-emulated operation")),
    }
}

struct EventState {
    /// Records queued so far.
    recorded: u64,
    /// Highest record that has completed.
    completed: u64,
    /// When it completed.
    at: Option<Instant>,
}

struct EventShared {
    state: Mutex<EventState>,
    cv: Condvar,
}

impl EventShared {
    fn wait_for(&self, target: u64) -> Result<()> {
        let mut st = self.state.lock().map_err(poisoned)?;
        while st.completed < target {
            st = self.cv.wait(st).map_err(poisoned)?;
        }
        Ok(())
    }
}

/// An event of the host-emulated device.
pub(crate) struct HostEvent(Arc<EventShared>);

impl HostEvent {
    pub(crate) fn new() -> HostEvent {
        HostEvent(Arc::new(EventShared {
            state: Mutex::new(EventState {
                recorded: 0,
                completed: 0,
                at: None,
            }),
            cv: Condvar::new(),
        }))
    }

    pub(crate) fn synchronize(&self) -> Result<()> {
        let target = self.0.state.lock().map_err(poisoned)?.recorded;
        self.0.wait_for(target)
    }

    pub(crate) fn is_complete(&self) -> bool {
        self.0
            .state
            .lock()
            .map(|s| s.completed >= s.recorded)
            .unwrap_or(false)
    }

    pub(crate) fn completed_at(&self) -> Result<Instant> {
        let st = self.0.state.lock().map_err(poisoned)?;
        match st.at {
            Some(t) if st.completed >= st.recorded => Ok(t),
            _ => Err(RuntimeError::invalid(
                "event",
                "not recorded, or its last record has not completed",
            )),
        }
    }
}
