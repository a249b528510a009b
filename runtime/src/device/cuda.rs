//! The CUDA backend, through cudarc's driver API with dynamic loading.
//!
//! A build with feature `cuda` runs on machines without CUDA: `CudaDevice::new` checks
//! that libcuda can be loaded, that the driver initialises and that the ordinal exists
//! before touching anything else, and says which step failed. Memory is managed with raw
//! driver calls (cudarc's `CudaSlice` event tracking is turned off: ordering is the
//! engine's, through [`super::Event`]s, as on real CUDA). Kernel tables (regions, expert
//! tasks) are staged through a small per-stream ring of pinned buffers copied to the device
//! on the stream ahead of the launch, so a table can be rewritten as soon as the launch that
//! reads it is queued.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use cudarc::driver::sys::{self, CUdeviceptr};
use cudarc::driver::{
    result, CudaContext, CudaFunction, CudaStream, DeviceRepr, LaunchConfig, PushKernelArg,
};
use ft_kernels::cuda_sources::{KernelId, Specialization};

use super::{
    Bracket, Clock, CopySubmit, CudaTuning, DeviceBuffer, DeviceInfo, DeviceKind, FlagGate,
    HostBuffer,
};
use crate::dense::DenseRead;
use crate::error::{Result, RuntimeError};
use crate::gather::CopyRegion;
use crate::gpu_experts::{ExpertStep, CUDA_PARAM_TABLE_BYTES as PARAM_TABLE_BYTES};

/// `cuMemHostAlloc` flags of every host buffer: PORTABLE (usable from every context) and
/// DEVICEMAP (mapped, for the zero-copy gather). Deliberately not WRITECOMBINED: the CPU
/// kernels read banks, and write-combined memory is uncached for CPU reads.
pub const HOST_ALLOC_FLAGS: u32 = sys::CU_MEMHOSTALLOC_PORTABLE | sys::CU_MEMHOSTALLOC_DEVICEMAP;

/// Bytes one block of the gather and dense kernels works on (64 KiB: enough work per block
/// to amortise its start, small enough that a 2.77 MB expert spreads over ~43 blocks).
pub const CHUNK_BYTES: u64 = 64 * 1024;

/// Threads per block of the streaming kernels (gather, dense, add).
const STREAM_THREADS: u32 = 256;

/// Argument tables in flight per stream before the oldest must have been consumed.
const ARG_RING: usize = 8;

/// Initial bytes of one argument-table slot (grows on demand).
const ARG_SLOT_BYTES: usize = 64 * 1024;

/// The parameter-space table (`struct ParamTable` of the kernels).
#[repr(C, align(16))]
pub(crate) struct ParamTable(pub(crate) [u8; PARAM_TABLE_BYTES]);

// SAFETY: plain bytes with the kernels' layout (16-byte aligned, PARAM_TABLE_BYTES long).
unsafe impl DeviceRepr for ParamTable {}

/// An argument table as a launch passes it: in the parameter (`staged` 0) or, when larger,
/// staged in a ring slot whose address is `staged`. Give it back with
/// [`CudaStreamH::release_arg`] once the launch is queued.
pub(crate) struct TableArg {
    pub(crate) param: Box<ParamTable>,
    pub(crate) staged: u64,
    slot: Option<usize>,
}

fn cu(op: &str) -> impl FnOnce(result::DriverError) -> RuntimeError + '_ {
    move |e| RuntimeError::cuda(op, e)
}

/// A loaded module's entry points, by unit, specialization and name.
type FunctionMap = HashMap<(KernelId, Specialization, &'static str), CudaFunction>;

/// Whether the module of `kernel` built with `spec` is loaded in `map` (its entry points go
/// in together, so its first stands for all).
fn is_loaded(map: &FunctionMap, kernel: KernelId, spec: Specialization) -> bool {
    map.contains_key(&(kernel, spec, kernel.entry_points()[0]))
}

/// State shared by the device and its streams.
pub(crate) struct Shared {
    pub(crate) ctx: Arc<CudaContext>,
    pub(crate) cc: (u32, u32),
    /// Most dynamic shared memory one block may opt in to, bytes (the expert kernels' staged
    /// weight tiles can exceed the 48 KiB every launch gets without it).
    pub(crate) shared_optin_bytes: usize,
    /// Streaming multiprocessors.
    pub(crate) multiprocessors: usize,
    functions: Mutex<FunctionMap>,
    /// Origin of event timelines: an event recorded at open and its host time, us.
    origin: (sys::CUevent, f64),
    /// The driver's CUDA version (`cuDriverGetVersion`: 13000 for 13.0), 0 if unknown.
    driver_version: i32,
    /// The paths launches and copies take ([`CudaTuning`]: read from the environment at
    /// open, changed by `Device::set_cuda_tuning`).
    tuning: Mutex<CudaTuning>,
}

/// The first driver version with `cuMemcpyBatchAsync_v2` (CUDA 13.0).
const COPY_BATCH_DRIVER: i32 = 13000;

/// The first driver version with `cuStreamWriteValue32_v2` (CUDA 11.7), the flag store of
/// [`CudaStreamH::write_flag`]; stream memory operations are on by default from CUDA 12.
pub(crate) const FLAG_WRITE_DRIVER: i32 = 11070;

/// `tuning` as a driver of `driver_version` runs it, so that what a device reports is what
/// ran: batched copies need a CUDA 13 driver, and an older one copies one region at a time
/// (with a warning).
fn runnable(tuning: CudaTuning, driver_version: i32) -> CudaTuning {
    if tuning.copies == CopySubmit::Batch && driver_version < COPY_BATCH_DRIVER {
        tracing::info!(
            driver = driver_version,
            "batched gather copies need a CUDA {} driver: one copy each",
            COPY_BATCH_DRIVER / 1000
        );
        return CudaTuning {
            copies: CopySubmit::Each,
            ..tuning
        };
    }
    tuning
}

// SAFETY: CUevent is a driver handle usable from any thread of the process.
unsafe impl Send for Shared {}
// SAFETY: as above; the function map is behind a mutex.
unsafe impl Sync for Shared {}

impl Drop for Shared {
    fn drop(&mut self) {
        let _ = self.ctx.bind_to_thread();
        // SAFETY: created in `CudaDevice::new`, destroyed once.
        let _ = unsafe { result::event::destroy(self.origin.0) };
    }
}

impl Shared {
    /// Whether streams can store a flag ([`CudaStreamH::write_flag`]): the driver has
    /// `cuStreamWriteValue32_v2`.
    pub(crate) fn flag_writes(&self) -> bool {
        self.driver_version >= FLAG_WRITE_DRIVER
    }

    /// The paths launches and copies take now.
    pub(crate) fn tuning(&self) -> CudaTuning {
        *self.tuning.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Take other paths from now on, as far as this driver runs them ([`runnable`]).
    pub(crate) fn set_tuning(&self, tuning: CudaTuning) {
        *self.tuning.lock().unwrap_or_else(|p| p.into_inner()) =
            runnable(tuning, self.driver_version);
    }

    fn bind(&self) -> Result<()> {
        self.ctx
            .bind_to_thread()
            .map_err(cu("binding the CUDA context"))
    }

    /// The function `entry` of the unspecialized `kernel` (see [`Shared::function_spec`]).
    pub(crate) fn function(&self, kernel: KernelId, entry: &'static str) -> Result<CudaFunction> {
        self.function_spec(kernel, Specialization::NONE, entry)
    }

    /// The function `entry` of `kernel` built with `spec`, compiling and loading that module
    /// at first use (one module per specialization, cached for the device's lifetime).
    pub(crate) fn function_spec(
        &self,
        kernel: KernelId,
        spec: Specialization,
        entry: &'static str,
    ) -> Result<CudaFunction> {
        let mut map = self
            .functions
            .lock()
            .map_err(|_| RuntimeError::cuda("kernel cache", "poisoned lock"))?;
        if let Some(f) = map.get(&(kernel, spec, entry)) {
            return Ok(f.clone());
        }
        let compiled = crate::nvrtc::compile(kernel, self.cc, spec)?;
        self.load_compiled(&mut map, kernel, spec, compiled)?;
        map.get(&(kernel, spec, entry)).cloned().ok_or_else(|| {
            RuntimeError::cuda(
                format!("finding {entry} in kernel module '{kernel}'"),
                "not an entry point of that unit",
            )
        })
    }

    /// Compile every unit of `units` that is not loaded yet, on as many threads as the host
    /// has cores or [`crate::nvrtc::THREADS_ENV`] allows (NVRTC takes seconds for each
    /// specialization of the expert kernels, and gives the same image from any thread:
    /// `tests/nvrtc.rs`), then load them here, one by one. A device about to run many
    /// specializations (the GPU tests of every path) builds them at once instead of one at
    /// each first launch.
    pub(crate) fn load_units(&self, units: &[(KernelId, Specialization)]) -> Result<()> {
        use rayon::prelude::*;
        let missing: Vec<(KernelId, Specialization)> = {
            let map = self
                .functions
                .lock()
                .map_err(|_| RuntimeError::cuda("kernel cache", "poisoned lock"))?;
            let mut seen = std::collections::HashSet::new();
            units
                .iter()
                .filter(|&&(k, s)| !is_loaded(&map, k, s))
                .filter(|u| seen.insert(**u))
                .copied()
                .collect()
        };
        let threads = crate::nvrtc::compile_threads(
            std::env::var(crate::nvrtc::THREADS_ENV).ok().as_deref(),
        )?;
        let compile_all = || -> Result<Vec<crate::nvrtc::CompiledKernel>> {
            missing
                .par_iter()
                .map(|&(k, s)| crate::nvrtc::compile(k, self.cc, s))
                .collect()
        };
        let compiled = match threads {
            None => compile_all()?,
            Some(n) => rayon::ThreadPoolBuilder::new()
                .num_threads(n)
                .build()
                .map_err(|e| RuntimeError::invalid(crate::nvrtc::THREADS_ENV, e.to_string()))?
                .install(compile_all)?,
        };
        let mut map = self
            .functions
            .lock()
            .map_err(|_| RuntimeError::cuda("kernel cache", "poisoned lock"))?;
        for ((k, s), c) in missing.into_iter().zip(compiled) {
            // Another thread may have loaded it at a first launch meanwhile.
            if !is_loaded(&map, k, s) {
                self.load_compiled(&mut map, k, s, c)?;
            }
        }
        Ok(())
    }

    /// Load the module `compiled` of `kernel` built with `spec` and put its entry points in
    /// `map` (the lock's contents).
    fn load_compiled(
        &self,
        map: &mut FunctionMap,
        kernel: KernelId,
        spec: Specialization,
        compiled: crate::nvrtc::CompiledKernel,
    ) -> Result<()> {
        self.bind()?;
        let image = cudarc::nvrtc::Ptx::from_binary(compiled.image);
        let module = self
            .ctx
            .load_module(image)
            .map_err(cu(&format!("loading kernel module '{kernel}'")))?;
        for e in kernel.entry_points() {
            let f = module
                .load_function(e)
                .map_err(cu(&format!("finding {e} in kernel module '{kernel}'")))?;
            if kernel == KernelId::Experts {
                // Lets a launch ask for more than the default 48 KiB of dynamic shared memory
                // (staged weight tiles); what a launch gets is still what it asks for. The
                // kernel's static shared memory and the dynamic limit together must fit the
                // device's opt-in limit.
                let static_bytes = f
                    .get_attribute(sys::CUfunction_attribute::CU_FUNC_ATTRIBUTE_SHARED_SIZE_BYTES)
                    .map_err(cu(&format!("reading {e}'s static shared memory")))?;
                let dynamic = self
                    .shared_optin_bytes
                    .saturating_sub(static_bytes.max(0) as usize);
                f.set_attribute(
                    sys::CUfunction_attribute::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
                    dynamic as i32,
                )
                .map_err(cu(&format!("raising {e}'s dynamic shared memory limit")))?;
            }
            map.insert((kernel, spec, *e), f);
        }
        Ok(())
    }

    /// [`crate::Device::take_block_stamps`]: the records of every loaded module of the
    /// expert kernels built with block timelines (`ft_stamps`, `ft_stamp_count` in
    /// `experts.cu`), read after the device has finished its queued work, then the counts
    /// zeroed.
    pub(crate) fn take_block_stamps(&self) -> Result<crate::block_stamps::BlockStamps> {
        use crate::block_stamps::{BlockStamp, BlockStamps, STAMP_RECORD_BYTES};
        self.bind()?;
        self.ctx
            .synchronize()
            .map_err(cu("synchronizing before reading block stamps"))?;
        let map = self
            .functions
            .lock()
            .map_err(|_| RuntimeError::cuda("kernel cache", "poisoned lock"))?;
        let mut modules: Vec<sys::CUmodule> = Vec::new();
        for ((kernel, spec, _), f) in map.iter() {
            if *kernel != KernelId::Experts || !spec.block_stamps {
                continue;
            }
            let mut m: sys::CUmodule = std::ptr::null_mut();
            // SAFETY: a live function of a module the cache keeps loaded.
            unsafe { sys::cuFuncGetModule(&mut m, f.cu_function()) }
                .result()
                .map_err(cu("finding an expert kernel's module"))?;
            if !modules.contains(&m) {
                modules.push(m);
            }
        }
        let mut out = BlockStamps::default();
        for m in modules {
            let global = |name: &str| {
                let c = std::ffi::CString::new(name).expect("no NUL in a symbol name");
                // SAFETY: a loaded module (above).
                unsafe { result::module::get_global(m, c) }
                    .map_err(cu(&format!("finding {name} in the expert kernels")))
            };
            let (count_ptr, _) = global("ft_stamp_count")?;
            let (stamps_ptr, stamps_bytes) = global("ft_stamps")?;
            let mut count = [0u32];
            // SAFETY: the symbol is one u32; the device is idle (synchronized above).
            unsafe { result::memcpy_dtoh_sync(&mut count, count_ptr) }
                .map_err(cu("reading ft_stamp_count"))?;
            let kept = (count[0] as usize).min(stamps_bytes / STAMP_RECORD_BYTES);
            let mut raw = vec![0u64; kept * 8];
            if kept > 0 {
                // SAFETY: `kept` records lie inside the symbol's bytes.
                unsafe { result::memcpy_dtoh_sync(&mut raw, stamps_ptr) }
                    .map_err(cu("reading ft_stamps"))?;
            }
            // SAFETY: the count's 4 bytes; nothing runs on the device.
            unsafe { result::memset_d8_sync(count_ptr, 0, 4) }
                .map_err(cu("zeroing ft_stamp_count"))?;
            for r in raw.chunks_exact(8) {
                let r: &[u64; 8] = r.try_into().expect("chunks of 8");
                out.records.push(BlockStamp::from_raw(r)?);
            }
            out.dropped += count[0] as u64 - kept as u64;
        }
        Ok(out)
    }
}

/// An opened CUDA device.
pub(crate) struct CudaDevice(pub(crate) Arc<Shared>);

/// Why CUDA cannot be used here, or `None` when libcuda loads and a device exists.
pub fn unavailable_reason() -> Option<String> {
    // SAFETY: only probes whether the shared library can be loaded.
    if !unsafe { sys::is_culib_present() } {
        return Some("libcuda could not be loaded (no NVIDIA driver on this machine?)".into());
    }
    if let Err(e) = result::init() {
        return Some(format!("the CUDA driver failed to initialise: {e}"));
    }
    match result::device::get_count() {
        Ok(0) => Some("the CUDA driver reports no device".into()),
        Ok(_) => None,
        Err(e) => Some(format!("cannot count CUDA devices: {e}")),
    }
}

/// Brackets taken for the timeline origin (`CudaDevice::new`): the first is the context's
/// lazy start, the others a few microseconds each.
const ORIGIN_SAMPLES: usize = 5;

/// One event recorded on the idle legacy stream and waited for, with the host's bracket
/// around it; the event is the caller's to destroy.
fn origin_sample(clock: &Clock) -> Result<(sys::CUevent, Bracket)> {
    let ev = result::event::create(sys::CUevent_flags::CU_EVENT_DEFAULT)
        .map_err(cu("creating the timeline origin event"))?;
    let before_us = clock.now_us();
    // SAFETY: a live event on the legacy default stream, which is idle here.
    let done = unsafe {
        result::event::record(ev, std::ptr::null_mut())
            .and_then(|()| result::event::synchronize(ev))
    };
    let after_us = clock.now_us();
    if let Err(e) = done {
        // SAFETY: created above, destroyed once.
        let _ = unsafe { result::event::destroy(ev) };
        return Err(cu("recording the timeline origin event")(e));
    }
    Ok((
        ev,
        Bracket {
            before_us,
            after_us,
        },
    ))
}

impl CudaDevice {
    pub(crate) fn new(ordinal: usize, clock: Clock) -> Result<(CudaDevice, DeviceInfo)> {
        if let Some(reason) = unavailable_reason() {
            return Err(RuntimeError::CudaUnavailable { reason });
        }
        let count = result::device::get_count().map_err(cu("counting devices"))? as usize;
        if ordinal >= count {
            return Err(RuntimeError::CudaUnavailable {
                reason: format!("device {ordinal} asked for, but only {count} present"),
            });
        }
        let tuning = CudaTuning::from_env()?;
        let ctx = CudaContext::new(ordinal).map_err(cu("creating the CUDA context"))?;
        // SAFETY: no CudaSlice is used by this backend; ordering is explicit (events).
        unsafe { ctx.disable_event_tracking() };
        let attr = |a| ctx.attribute(a).map_err(cu("reading device attributes"));
        let major = attr(sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR)?;
        let minor = attr(sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR)?;
        let sms = attr(sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT)?;
        let shared_optin =
            attr(sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN)?;
        let mapped = attr(sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_CAN_MAP_HOST_MEMORY)?;
        if mapped == 0 {
            return Err(RuntimeError::CudaUnavailable {
                reason: format!(
                    "device {ordinal} cannot map host memory (needed for zero-copy gathers)"
                ),
            });
        }
        let name = ctx.name().map_err(cu("reading the device name"))?;
        let total = ctx.total_mem().map_err(cu("reading device memory"))? as u64;
        let mut version = 0i32;
        // SAFETY: writes one int.
        let driver_ok =
            unsafe { sys::cuDriverGetVersion(&mut version) } == sys::cudaError_enum::CUDA_SUCCESS;
        let driver_version =
            driver_ok.then(|| format!("{}.{}", version / 1000, (version % 1000) / 10));
        let driver_version_num = if driver_ok { version } else { 0 };
        let tuning = runnable(tuning, driver_version_num);
        // The origin of event timelines: an event recorded on the idle device, placed on the
        // host clock at the middle of the host's bracket around its record and completion
        // (`Bracket`). With one bracket, device spans can sit 25 to 155 us early against the
        // host's, depending on the process (routers before the host had queued them): a
        // first record on a fresh context that completes late, with a wide bracket, does
        // that, so the narrowest of ORIGIN_SAMPLES brackets is kept.
        // (A decode step's timeline does not depend on it: it places its events by its own
        // anchor, `Event::timeline_us_from`.)
        ctx.bind_to_thread()
            .map_err(cu("binding the CUDA context"))?;
        let mut samples: Vec<(sys::CUevent, Bracket)> = Vec::with_capacity(ORIGIN_SAMPLES);
        let destroy_all = |samples: &[(sys::CUevent, Bracket)]| {
            for &(ev, _) in samples {
                // SAFETY: created below, destroyed once.
                let _ = unsafe { result::event::destroy(ev) };
            }
        };
        for _ in 0..ORIGIN_SAMPLES {
            match origin_sample(&clock) {
                Ok(s) => samples.push(s),
                Err(e) => {
                    destroy_all(&samples);
                    return Err(e);
                }
            }
        }
        let brackets: Vec<Bracket> = samples.iter().map(|&(_, b)| b).collect();
        let kept = Bracket::narrowest(&brackets).expect("ORIGIN_SAMPLES > 0");
        let (origin_ev, origin) = samples.swap_remove(kept);
        destroy_all(&samples);
        tracing::debug!(
            first_us = brackets[0].width_us(),
            kept_us = origin.width_us(),
            "timeline origin: the narrowest of {ORIGIN_SAMPLES} record-to-completion brackets"
        );
        let info = DeviceInfo {
            kind: DeviceKind::Cuda,
            ordinal,
            name,
            compute_capability: Some((major as u32, minor as u32)),
            multiprocessors: sms as u32,
            total_mem_bytes: total,
            driver_version,
            host_memory: "cuMemHostAlloc portable|devicemap (cached, not write-combined)".into(),
            cuda_tuning: Some(tuning),
        };
        tracing::info!(device = %info.name, cc = ?info.compute_capability, paths = %tuning, "opened CUDA device");
        Ok((
            CudaDevice(Arc::new(Shared {
                ctx,
                cc: (major as u32, minor as u32),
                shared_optin_bytes: shared_optin.max(0) as usize,
                multiprocessors: sms.max(0) as usize,
                functions: Mutex::new(HashMap::new()),
                origin: (origin_ev, origin.middle_us()),
                driver_version: driver_version_num,
                tuning: Mutex::new(tuning),
            })),
            info,
        ))
    }

    pub(crate) fn free_mem_bytes(&self) -> Result<u64> {
        self.0.bind()?;
        let (free, _) = self
            .0
            .ctx
            .mem_get_info()
            .map_err(cu("reading free memory"))?;
        Ok(free as u64)
    }

    pub(crate) fn alloc_device(&self, bytes: usize, what: &str) -> Result<CudaMem> {
        self.0.bind()?;
        let free = self.free_mem_bytes().unwrap_or(0);
        // SAFETY: plain allocation; zeroed below before anyone reads it.
        let ptr = match unsafe { result::malloc_sync(bytes.max(1)) } {
            Ok(p) => p,
            Err(e) => {
                return Err(RuntimeError::OutOfMemory {
                    what: what.to_string(),
                    requested: bytes as u64,
                    available: free,
                    hint: format!("; cuMemAlloc: {e}"),
                })
            }
        };
        let mem = CudaMem {
            ptr,
            shared: self.0.clone(),
        };
        // SAFETY: `ptr` holds at least `bytes`.
        unsafe { result::memset_d8_sync(ptr, 0, bytes.max(1)) }
            .map_err(cu("zeroing a new buffer"))?;
        Ok(mem)
    }

    pub(crate) fn alloc_pinned(&self, bytes: usize, what: &str) -> Result<PinnedMem> {
        self.0.bind()?;
        // SAFETY: page-locked allocation; zeroed below.
        let host = match unsafe { result::malloc_host(bytes.max(1), HOST_ALLOC_FLAGS) } {
            Ok(p) => p as *mut u8,
            Err(e) => {
                return Err(RuntimeError::OutOfMemory {
                    what: what.to_string(),
                    requested: bytes as u64,
                    available: 0,
                    hint: format!("; cuMemHostAlloc (page-locked): {e}"),
                })
            }
        };
        let mut mem = PinnedMem {
            host,
            dev: 0,
            shared: self.0.clone(),
        };
        let mut dev: CUdeviceptr = 0;
        // SAFETY: `host` was allocated with DEVICEMAP.
        unsafe { sys::cuMemHostGetDevicePointer_v2(&mut dev, host as *mut _, 0) }
            .result()
            .map_err(cu("mapping pinned memory into the device"))?;
        // SAFETY: `host` holds at least `bytes`.
        unsafe { std::ptr::write_bytes(host, 0, bytes) };
        mem.dev = dev;
        Ok(mem)
    }

    pub(crate) fn new_stream(&self, name: &str) -> Result<CudaStreamH> {
        self.0.bind()?;
        let stream = self
            .0
            .ctx
            .new_stream()
            .map_err(cu(&format!("creating stream '{name}'")))?;
        Ok(CudaStreamH {
            shared: self.0.clone(),
            stream,
            ring: Mutex::new(ArgRing {
                slots: Vec::new(),
                next: 0,
            }),
            scratch: Mutex::new(None),
        })
    }

    pub(crate) fn new_event(&self, timing: bool) -> Result<CudaEventH> {
        self.0.bind()?;
        let flags = if timing {
            sys::CUevent_flags::CU_EVENT_DEFAULT
        } else {
            sys::CUevent_flags::CU_EVENT_DISABLE_TIMING
        };
        let ev = result::event::create(flags).map_err(cu("creating an event"))?;
        Ok(CudaEventH {
            ev,
            shared: self.0.clone(),
        })
    }

    pub(crate) fn synchronize(&self) -> Result<()> {
        self.0.bind()?;
        self.0
            .ctx
            .synchronize()
            .map_err(cu("synchronizing the device"))
    }

    /// Compile (in parallel) and load every kernel unit but the expert kernels, and the
    /// expert kernels in each of `experts`' specializations.
    pub(crate) fn warm_up_kernels(&self, experts: &[Specialization]) -> Result<()> {
        let units: Vec<(KernelId, Specialization)> = KernelId::ALL
            .into_iter()
            .filter(|&k| k != KernelId::Experts)
            .map(|k| (k, Specialization::NONE))
            .chain(experts.iter().map(|&s| (KernelId::Experts, s)))
            .collect();
        self.0.load_units(&units)
    }

    pub(crate) fn event_timeline_us(&self, e: &CudaEventH) -> Result<f64> {
        self.0.bind()?;
        // SAFETY: both events are live.
        let ms = unsafe { result::event::elapsed(self.0.origin.0, e.ev) }.map_err(cu(
            "reading an event's time (recorded, completed, with timing?)",
        ))?;
        Ok(self.0.origin.1 + ms as f64 * 1e3)
    }
}

/// Device memory.
pub(crate) struct CudaMem {
    ptr: CUdeviceptr,
    shared: Arc<Shared>,
}

impl CudaMem {
    pub(crate) fn ptr(&self) -> u64 {
        self.ptr
    }
}

impl Drop for CudaMem {
    fn drop(&mut self) {
        // Wait for the device, so nothing queued still uses the memory; errors cannot be
        // reported from drop and are logged.
        if self.shared.bind().is_ok() {
            if let Err(e) = self.shared.ctx.synchronize() {
                tracing::warn!("synchronize before freeing device memory failed: {e}");
            }
            // SAFETY: allocated by cuMemAlloc, freed once.
            if let Err(e) = unsafe { result::free_sync(self.ptr) } {
                tracing::warn!("cuMemFree failed: {e}");
            }
        }
    }
}

/// Page-locked, mapped host memory.
pub(crate) struct PinnedMem {
    host: *mut u8,
    dev: CUdeviceptr,
    shared: Arc<Shared>,
}

// SAFETY: plain host memory; access ordered by the stream contract.
unsafe impl Send for PinnedMem {}
// SAFETY: as above.
unsafe impl Sync for PinnedMem {}

impl PinnedMem {
    pub(crate) fn ptr(&self) -> *mut u8 {
        self.host
    }

    /// The device-side address of the mapping (for zero-copy kernels).
    pub(crate) fn dev_ptr(&self) -> u64 {
        self.dev
    }
}

impl Drop for PinnedMem {
    fn drop(&mut self) {
        if self.shared.bind().is_ok() {
            if let Err(e) = self.shared.ctx.synchronize() {
                tracing::warn!("synchronize before freeing pinned memory failed: {e}");
            }
            // SAFETY: allocated by cuMemHostAlloc, freed once.
            if let Err(e) = unsafe { result::free_host(self.host as *mut _) } {
                tracing::warn!("cuMemFreeHost failed: {e}");
            }
        }
    }
}

/// An event.
pub(crate) struct CudaEventH {
    ev: sys::CUevent,
    shared: Arc<Shared>,
}

// SAFETY: driver handle, usable from any thread.
unsafe impl Send for CudaEventH {}
// SAFETY: as above.
unsafe impl Sync for CudaEventH {}

impl Drop for CudaEventH {
    fn drop(&mut self) {
        let _ = self.shared.bind();
        // SAFETY: created by cuEventCreate, destroyed once (the driver defers it if pending).
        let _ = unsafe { result::event::destroy(self.ev) };
    }
}

impl CudaEventH {
    pub(crate) fn synchronize(&self) -> Result<()> {
        self.shared.bind()?;
        // SAFETY: live event.
        unsafe { result::event::synchronize(self.ev) }.map_err(cu("waiting for an event"))
    }

    /// Microseconds from this event to `later` (cuEventElapsedTime, 0.5 us resolution).
    pub(crate) fn elapsed_us(&self, later: &CudaEventH) -> Result<f64> {
        self.shared.bind()?;
        // SAFETY: both events are live.
        let ms = unsafe { result::event::elapsed(self.ev, later.ev) }.map_err(cu(
            "reading the time between two events (recorded, completed, with timing?)",
        ))?;
        Ok(ms as f64 * 1e3)
    }

    pub(crate) fn is_complete(&self) -> Result<bool> {
        self.shared.bind()?;
        // SAFETY: live event.
        match unsafe { result::event::query(self.ev) } {
            Ok(()) => Ok(true),
            Err(e) if e.0 == sys::cudaError_enum::CUDA_ERROR_NOT_READY => Ok(false),
            Err(e) => Err(RuntimeError::cuda("querying an event", e)),
        }
    }
}

/// One argument-table slot: pinned staging memory, its device copy, and the event after
/// the launch that reads it.
struct ArgSlot {
    host: PinnedMem,
    dev: CudaMem,
    cap: usize,
    done: sys::CUevent,
    used: bool,
}

// SAFETY: the event is a driver handle usable from any thread; the slot is behind a mutex.
unsafe impl Send for ArgSlot {}

impl Drop for ArgSlot {
    fn drop(&mut self) {
        let _ = self.host.shared.bind();
        // SAFETY: created with the slot, destroyed once.
        let _ = unsafe { result::event::destroy(self.done) };
    }
}

struct ArgRing {
    slots: Vec<ArgSlot>,
    next: usize,
}

/// Scratch memory of the expert kernel (grown on demand).
pub(crate) struct Scratch {
    pub(crate) mem: CudaMem,
    pub(crate) bytes: usize,
}

/// A stream.
pub(crate) struct CudaStreamH {
    shared: Arc<Shared>,
    stream: Arc<CudaStream>,
    ring: Mutex<ArgRing>,
    scratch: Mutex<Option<Scratch>>,
}

/// A gate as the expert kernels take it (none: address 0).
fn cuda_gate(gate: Option<FlagGate<'_>>) -> Result<crate::gpu_experts::CudaGate> {
    Ok(match gate {
        Some(g) => crate::gpu_experts::CudaGate {
            flag: dptr(g.flag)? + g.offset as u64,
            value: g.value,
        },
        None => Default::default(),
    })
}

fn dptr(b: &DeviceBuffer) -> Result<u64> {
    match &b.mem {
        super::BufMem::Cuda(m) => Ok(m.ptr),
        #[allow(unreachable_patterns)]
        _ => Err(super::backend_mismatch("CUDA operation")),
    }
}

fn pinned(b: &HostBuffer) -> Result<&PinnedMem> {
    match &b.mem {
        super::HostMemImpl::Cuda(m) => Ok(m),
        #[allow(unreachable_patterns)]
        _ => Err(super::backend_mismatch("CUDA copy")),
    }
}

/// View a slice of plain-old-data table entries as bytes.
pub(crate) fn pod_bytes<T: Copy>(v: &[T]) -> &[u8] {
    // SAFETY: T is a #[repr(C)] table entry of integers without padding.
    unsafe { std::slice::from_raw_parts(v.as_ptr() as *const u8, std::mem::size_of_val(v)) }
}

/// The `Region` entry of `kernels/cuda/common.cuh`.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub(crate) struct RegionEntry {
    pub(crate) src: u64,
    pub(crate) dst: u64,
    pub(crate) bytes: u64,
    pub(crate) first_block: u64,
}

/// Region table entries with `first_block` assigned for chunks of `chunk` bytes, and the
/// total number of blocks.
pub(crate) fn region_table(
    regions: impl Iterator<Item = (u64, u64, u64)>,
    chunk: u64,
) -> (Vec<RegionEntry>, u64) {
    let mut blocks = 0u64;
    let mut out = Vec::new();
    for (src, dst, bytes) in regions {
        if bytes == 0 {
            continue;
        }
        out.push(RegionEntry {
            src,
            dst,
            bytes,
            first_block: blocks,
        });
        blocks += bytes.div_ceil(chunk);
    }
    (out, blocks)
}

/// Most blocks of an element-wise launch: its threads stride over the rest.
const ELEMENTWISE_MAX_BLOCKS: u64 = 4096;

/// The launch of an element-wise kernel over `n` values: a thread per value, at most
/// [`ELEMENTWISE_MAX_BLOCKS`] blocks (the kernels loop with a grid stride).
fn elementwise_config(n: u64) -> LaunchConfig {
    let blocks = n
        .div_ceil(STREAM_THREADS as u64)
        .clamp(1, ELEMENTWISE_MAX_BLOCKS) as u32;
    LaunchConfig {
        grid_dim: (blocks, 1, 1),
        block_dim: (STREAM_THREADS, 1, 1),
        shared_mem_bytes: 0,
    }
}

/// Most blocks one launch's x dimension may have (CUDA's limit is 2^31 - 1).
const MAX_GRID_X: u64 = (1 << 31) - 1;

/// Queue one region of `src` (pinned host) to `dst` (device) on `stream`.
fn copy_h2d_raw(
    src: *mut u8,
    dst: CUdeviceptr,
    r: &CopyRegion,
    stream: sys::CUstream,
) -> Result<()> {
    // SAFETY: ranges checked by the caller; pinned source, device destination.
    unsafe {
        sys::cuMemcpyHtoDAsync_v2(
            dst + r.dst_offset,
            src.add(r.src_offset as usize) as *const _,
            r.bytes as usize,
            stream,
        )
        .result()
        .map_err(cu("queueing a host-to-device copy"))
    }
}

impl CudaStreamH {
    pub(crate) fn raw(&self) -> sys::CUstream {
        self.stream.cu_stream()
    }

    pub(crate) fn shared(&self) -> &Arc<Shared> {
        &self.shared
    }

    /// Queue `f` with `params` (one pointer to each argument's value, in the kernel's order)
    /// through `cuLaunchKernelEx`. With `programmatic` (a device of compute capability 9.0
    /// or later; ignored elsewhere) the launch is a programmatic dependent launch: the kernel
    /// may start before the stream's previous kernel completes, once every block of that one
    /// has run `griddepcontrol.launch_dependents`, and it must `griddepcontrol.wait` before
    /// reading anything that kernel writes (`pdl_wait` in `kernels/cuda/experts.cu`).
    ///
    /// # Safety
    /// `params` must match `f`'s signature, and every address in them must be valid for the
    /// kernel's accesses until it completes.
    pub(crate) unsafe fn launch_ex(
        &self,
        f: &CudaFunction,
        grid: (u32, u32, u32),
        block: (u32, u32, u32),
        shared_bytes: u32,
        params: &mut [*mut std::ffi::c_void],
        programmatic: bool,
    ) -> Result<()> {
        self.shared.bind()?;
        // SAFETY: an all-zero attribute value is a valid union value.
        let mut attr: sys::CUlaunchAttribute = unsafe { std::mem::zeroed() };
        attr.id = sys::CUlaunchAttributeID::CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION;
        attr.value.programmaticStreamSerializationAllowed = 1;
        let use_attr = programmatic && self.shared.cc.0 >= 9;
        let config = sys::CUlaunchConfig {
            gridDimX: grid.0,
            gridDimY: grid.1,
            gridDimZ: grid.2,
            blockDimX: block.0,
            blockDimY: block.1,
            blockDimZ: block.2,
            sharedMemBytes: shared_bytes,
            hStream: self.raw(),
            attrs: if use_attr {
                &mut attr
            } else {
                std::ptr::null_mut()
            },
            numAttrs: u32::from(use_attr),
        };
        // SAFETY: the caller guarantees the parameters; config and attr outlive the call.
        unsafe {
            sys::cuLaunchKernelEx(
                &config,
                f.cu_function(),
                params.as_mut_ptr(),
                std::ptr::null_mut(),
            )
        }
        .result()
        .map_err(cu("launching a kernel (cuLaunchKernelEx)"))
    }

    /// Stage `bytes` into a ring slot and queue its copy to the device; returns the slot
    /// index and the device address. Call [`CudaStreamH::release_table`] after the launch.
    pub(crate) fn stage_table(&self, bytes: &[u8]) -> Result<(usize, u64)> {
        let mut ring = self
            .ring
            .lock()
            .map_err(|_| RuntimeError::cuda("argument ring", "poisoned lock"))?;
        let idx = ring.next;
        ring.next = (ring.next + 1) % ARG_RING;
        let need = bytes.len().max(1);
        // Make sure the slot exists, is large enough and is no longer read.
        let grow = match ring.slots.get(idx) {
            None => true,
            Some(s) => s.cap < need,
        };
        if let Some(s) = ring.slots.get(idx) {
            if s.used {
                // SAFETY: live event.
                unsafe { result::event::synchronize(s.done) }
                    .map_err(cu("waiting for an argument slot"))?;
            }
        }
        if grow {
            let cap = need.next_power_of_two().max(ARG_SLOT_BYTES);
            let dev = CudaDevice(self.shared.clone());
            let slot = ArgSlot {
                host: dev.alloc_pinned(cap, "kernel argument table")?,
                dev: dev.alloc_device(cap, "kernel argument table")?,
                cap,
                done: {
                    self.shared.bind()?;
                    result::event::create(sys::CUevent_flags::CU_EVENT_DISABLE_TIMING)
                        .map_err(cu("creating an argument-slot event"))?
                },
                used: false,
            };
            if idx < ring.slots.len() {
                ring.slots[idx] = slot;
            } else {
                ring.slots.push(slot);
            }
        }
        let slot = &mut ring.slots[idx];
        // SAFETY: the slot's previous reader has finished (event above); `cap >= len`.
        unsafe { std::ptr::copy_nonoverlapping(bytes.as_ptr(), slot.host.host, bytes.len()) };
        self.shared.bind()?;
        // SAFETY: pinned source of `len` bytes, device destination of `cap >= len` bytes.
        unsafe {
            sys::cuMemcpyHtoDAsync_v2(
                slot.dev.ptr,
                slot.host.host as *const _,
                bytes.len(),
                self.raw(),
            )
            .result()
            .map_err(cu("staging a kernel argument table"))?;
        }
        slot.used = true;
        Ok((idx, slot.dev.ptr))
    }

    /// `bytes` as a launch's table argument: copied into the launch's parameter when it fits
    /// (no device copy), else staged like [`CudaStreamH::stage_table`].
    pub(crate) fn table_arg(&self, bytes: &[u8]) -> Result<TableArg> {
        let mut param = Box::new(ParamTable([0u8; PARAM_TABLE_BYTES]));
        if bytes.len() <= PARAM_TABLE_BYTES {
            param.0[..bytes.len()].copy_from_slice(bytes);
            return Ok(TableArg {
                param,
                staged: 0,
                slot: None,
            });
        }
        let (slot, staged) = self.stage_table(bytes)?;
        Ok(TableArg {
            param,
            staged,
            slot: Some(slot),
        })
    }

    /// Release a table argument after its launch was queued.
    pub(crate) fn release_arg(&self, t: TableArg) -> Result<()> {
        match t.slot {
            Some(slot) => self.release_table(slot),
            None => Ok(()),
        }
    }

    /// Mark a staged table's slot as free once the work queued so far has run.
    pub(crate) fn release_table(&self, idx: usize) -> Result<()> {
        let ring = self
            .ring
            .lock()
            .map_err(|_| RuntimeError::cuda("argument ring", "poisoned lock"))?;
        // SAFETY: live event and stream.
        unsafe { result::event::record(ring.slots[idx].done, self.raw()) }
            .map_err(cu("recording an argument-slot event"))
    }

    /// Device scratch of at least `bytes`, growing it (after the stream drains) if needed.
    pub(crate) fn scratch(&self, bytes: usize) -> Result<u64> {
        let mut s = self
            .scratch
            .lock()
            .map_err(|_| RuntimeError::cuda("scratch", "poisoned lock"))?;
        if let Some(sc) = s.as_ref() {
            if sc.bytes >= bytes {
                return Ok(sc.mem.ptr);
            }
        }
        self.synchronize()?;
        *s = None;
        let bytes = bytes.next_power_of_two().max(1 << 20);
        let mem = CudaDevice(self.shared.clone()).alloc_device(bytes, "expert kernel scratch")?;
        let p = mem.ptr;
        *s = Some(Scratch { mem, bytes });
        Ok(p)
    }

    pub(crate) fn copy_h2d_regions(
        &self,
        src: &HostBuffer,
        dst: &DeviceBuffer,
        regions: &[CopyRegion],
    ) -> Result<()> {
        let s = pinned(src)?.host;
        let d = dptr(dst)?;
        self.shared.bind()?;
        if regions.len() > 1 && self.shared.tuning().copies == CopySubmit::Batch {
            return self.copy_h2d_batch(s, d, regions);
        }
        for r in regions {
            copy_h2d_raw(s, d, r, self.raw())?;
        }
        Ok(())
    }

    /// Every region in one `cuMemcpyBatchAsync_v2` call: the source read in stream order
    /// (the bank is page-locked and lives as long as the engine), the copies in any order.
    fn copy_h2d_batch(&self, s: *mut u8, d: CUdeviceptr, regions: &[CopyRegion]) -> Result<()> {
        let mut dsts: Vec<CUdeviceptr> = regions.iter().map(|r| d + r.dst_offset).collect();
        // SAFETY (pointer arithmetic): the caller checked every region against the buffers.
        let mut srcs: Vec<CUdeviceptr> = regions
            .iter()
            .map(|r| unsafe { s.add(r.src_offset as usize) } as CUdeviceptr)
            .collect();
        let mut sizes: Vec<usize> = regions.iter().map(|r| r.bytes as usize).collect();
        let nowhere = sys::CUmemLocation {
            type_: sys::CUmemLocationType::CU_MEM_LOCATION_TYPE_INVALID,
            id: 0,
        };
        let mut attrs = [sys::CUmemcpyAttributes {
            srcAccessOrder: sys::CUmemcpySrcAccessOrder::CU_MEMCPY_SRC_ACCESS_ORDER_STREAM,
            // Hints apply to managed memory only.
            srcLocHint: nowhere,
            dstLocHint: nowhere,
            flags: 0,
        }];
        let mut first = [0usize];
        // SAFETY: three arrays of `regions.len()` entries and one attribute for all of them,
        // alive through the call (the driver copies the descriptions before it returns);
        // pinned source, device destination.
        unsafe {
            sys::cuMemcpyBatchAsync_v2(
                dsts.as_mut_ptr(),
                srcs.as_mut_ptr(),
                sizes.as_mut_ptr(),
                regions.len(),
                attrs.as_mut_ptr(),
                first.as_mut_ptr(),
                1,
                self.raw(),
            )
            .result()
            .map_err(cu("queueing a batch of host-to-device copies"))
        }
    }

    pub(crate) fn gather_zero_copy(
        &self,
        src: &HostBuffer,
        dst: &DeviceBuffer,
        regions: &[CopyRegion],
    ) -> Result<()> {
        let s = pinned(src)?.dev_ptr();
        let d = dptr(dst)?;
        let (table, blocks) = region_table(
            regions
                .iter()
                .map(|r| (s + r.src_offset, d + r.dst_offset, r.bytes)),
            CHUNK_BYTES,
        );
        if blocks == 0 {
            return Ok(());
        }
        if blocks > MAX_GRID_X {
            return Err(RuntimeError::invalid(
                "gather_zero_copy",
                "too many bytes for one launch",
            ));
        }
        let f = self
            .shared
            .function(KernelId::Gather, "ft_gather_zero_copy")?;
        let t = self.table_arg(pod_bytes(&table))?;
        let n = table.len() as i32;
        let chunk = CHUNK_BYTES;
        let cfg = LaunchConfig {
            grid_dim: (blocks as u32, 1, 1),
            block_dim: (STREAM_THREADS, 1, 1),
            shared_mem_bytes: 0,
        };
        let mut b = self.stream.launch_builder(&f);
        b.arg(&*t.param).arg(&t.staged).arg(&n).arg(&chunk);
        // SAFETY: argument types match
        // `ft_gather_zero_copy(ParamTable, u64 staged, int, u64)`.
        unsafe { b.launch(cfg) }.map_err(cu("launching the zero-copy gather"))?;
        self.release_arg(t)
    }

    pub(crate) fn copy_d2h(
        &self,
        src: &DeviceBuffer,
        so: usize,
        dst: &HostBuffer,
        dof: usize,
        bytes: usize,
    ) -> Result<()> {
        let s = dptr(src)?;
        let d = pinned(dst)?.host;
        self.shared.bind()?;
        // SAFETY: ranges checked by the caller.
        unsafe {
            sys::cuMemcpyDtoHAsync_v2(d.add(dof) as *mut _, s + so as u64, bytes, self.raw())
                .result()
                .map_err(cu("queueing a device-to-host copy"))
        }
    }

    pub(crate) fn copy_d2d(
        &self,
        src: &DeviceBuffer,
        so: usize,
        dst: &DeviceBuffer,
        dof: usize,
        bytes: usize,
    ) -> Result<()> {
        let (s, d) = (dptr(src)?, dptr(dst)?);
        self.shared.bind()?;
        // SAFETY: ranges checked by the caller.
        unsafe { result::memcpy_dtod_async(d + dof as u64, s + so as u64, bytes, self.raw()) }
            .map_err(cu("queueing a device-to-device copy"))
    }

    pub(crate) fn upload(&self, src: &[u8], dst: &DeviceBuffer, dof: usize) -> Result<()> {
        let d = dptr(dst)?;
        self.shared.bind()?;
        // A pageable source is staged by the driver before cuMemcpyHtoDAsync returns, so
        // `src` may be reused at once (CUDA's API synchronization behavior).
        // SAFETY: range checked by the caller.
        unsafe { result::memcpy_htod_async(d + dof as u64, src, self.raw()) }
            .map_err(cu("uploading to the device"))
    }

    pub(crate) fn download(&self, src: &DeviceBuffer, so: usize, dst: &mut [u8]) -> Result<()> {
        let s = dptr(src)?;
        self.shared.bind()?;
        // SAFETY: range checked by the caller; synchronize before the host reads `dst`.
        unsafe { result::memcpy_dtoh_async(dst, s + so as u64, self.raw()) }
            .map_err(cu("downloading from the device"))?;
        self.synchronize()
    }

    pub(crate) fn memset_zero(&self, dst: &DeviceBuffer, off: usize, bytes: usize) -> Result<()> {
        let d = dptr(dst)?;
        self.shared.bind()?;
        // SAFETY: range checked by the caller.
        unsafe { result::memset_d8_async(d + off as u64, 0, bytes, self.raw()) }
            .map_err(cu("queueing a memset"))
    }

    pub(crate) fn add_f32(
        &self,
        dst: &DeviceBuffer,
        dof: usize,
        src: &DeviceBuffer,
        so: usize,
        n: usize,
    ) -> Result<()> {
        if n == 0 {
            return Ok(());
        }
        let d = dptr(dst)? + dof as u64;
        let s = dptr(src)? + so as u64;
        let f = self.shared.function(KernelId::Elementwise, "ft_add_f32")?;
        let n64 = n as u64;
        let cfg = elementwise_config(n64);
        let mut b = self.stream.launch_builder(&f);
        b.arg(&d).arg(&s).arg(&n64);
        // SAFETY: argument types match `ft_add_f32(float*, const float*, u64)`.
        unsafe { b.launch(cfg) }.map_err(cu("launching ft_add_f32"))?;
        Ok(())
    }

    pub(crate) fn combine_fixed(
        &self,
        act: &DeviceBuffer,
        parts: &DeviceBuffer,
        more: &[&DeviceBuffer],
        block: usize,
        k: usize,
    ) -> Result<()> {
        if block == 0 {
            return Ok(());
        }
        let a = dptr(act)?;
        let p = dptr(parts)?;
        let mut m = [0u64; crate::device::COMBINE_MAX_PARTS];
        for (slot, b) in m.iter_mut().zip(more) {
            *slot = dptr(b)?;
        }
        let f = self
            .shared
            .function(KernelId::Elementwise, "ft_combine_fixed")?;
        let (n, k) = (block as u64, k as i32);
        let cfg = elementwise_config(n);
        let mut b = self.stream.launch_builder(&f);
        b.arg(&a)
            .arg(&p)
            .arg(&m[0])
            .arg(&m[1])
            .arg(&m[2])
            .arg(&m[3])
            .arg(&n)
            .arg(&k);
        // SAFETY: argument types match `ft_combine_fixed(float*, const float*, const float*
        // x4, u64, int)`; ranges checked by the caller.
        unsafe { b.launch(cfg) }.map_err(cu("launching ft_combine_fixed"))?;
        Ok(())
    }

    pub(crate) fn hold_us(&self, us: f64) -> Result<()> {
        let f = self.shared.function(KernelId::Elementwise, "ft_hold_ns")?;
        let ns = (us.max(0.0) * 1e3) as u64;
        let cfg = LaunchConfig {
            grid_dim: (1, 1, 1),
            block_dim: (1, 1, 1),
            shared_mem_bytes: 0,
        };
        let mut b = self.stream.launch_builder(&f);
        b.arg(&ns);
        // SAFETY: argument type matches `ft_hold_ns(u64)`.
        unsafe { b.launch(cfg) }.map_err(cu("launching ft_hold_ns"))?;
        Ok(())
    }

    /// The expert kernels, with the layer's fixed-order combine folded into the down kernel
    /// where `combine` is given (as [`Stream::combine_fixed`] takes it; checked by the
    /// caller) and every block waiting for `gate` first where it is given.
    pub(crate) fn launch_experts(
        &self,
        step: &ExpertStep,
        w: &DeviceBuffer,
        x: &DeviceBuffer,
        y: &DeviceBuffer,
        combine: Option<&crate::device::LayerCombine<'_>>,
        gate: Option<FlagGate<'_>>,
    ) -> Result<()> {
        let fold = match combine {
            Some(c) => {
                let mut more = [0u64; crate::device::COMBINE_MAX_PARTS];
                for (slot, b) in more.iter_mut().zip(c.more) {
                    *slot = dptr(b)?;
                }
                crate::gpu_experts::CudaFoldCombine {
                    act: dptr(c.act)?,
                    parts: dptr(c.parts)?,
                    more,
                    block: c.block as u64,
                    k: c.k as u64,
                }
            }
            None => Default::default(),
        };
        crate::gpu_experts::cuda_launch(
            self,
            step,
            dptr(w)?,
            dptr(x)?,
            dptr(y)?,
            fold,
            cuda_gate(gate)?,
        )
    }

    /// Store `value` at `flag` (a device address) once every earlier item of this stream has
    /// completed, with their writes visible device-wide before it (`cuStreamWriteValue32_v2`
    /// with its default memory barrier). The caller checked [`Shared::flag_writes`].
    pub(crate) fn write_flag(&self, flag: &DeviceBuffer, offset: usize, value: u32) -> Result<()> {
        self.shared.bind()?;
        let addr = dptr(flag)? + offset as u64;
        // SAFETY: a live stream; the caller checked that the 4 bytes at `addr` lie in
        // `flag`, which the engine keeps alive past the stream's use of it.
        unsafe { sys::cuStreamWriteValue32_v2(self.raw(), addr, value, 0) }
            .result()
            .map_err(cu("writing a stream flag (cuStreamWriteValue32_v2)"))
    }

    pub(crate) fn launch_dense(&self, reads: &[DenseRead<'_>], out: &DeviceBuffer) -> Result<()> {
        let o = dptr(out)?;
        let mut rs = Vec::with_capacity(reads.len());
        for r in reads {
            rs.push((dptr(r.buffer)? + r.offset as u64, 0u64, r.bytes as u64));
        }
        let (table, blocks) = region_table(rs.into_iter(), CHUNK_BYTES);
        if blocks == 0 {
            return Ok(());
        }
        if blocks > MAX_GRID_X {
            return Err(RuntimeError::invalid(
                "launch_dense",
                "too many bytes for one launch",
            ));
        }
        let f = self.shared.function(KernelId::Dense, "ft_dense_read")?;
        let t = self.table_arg(pod_bytes(&table))?;
        let n = table.len() as i32;
        let chunk = CHUNK_BYTES;
        let cfg = LaunchConfig {
            grid_dim: (blocks as u32, 1, 1),
            block_dim: (STREAM_THREADS, 1, 1),
            shared_mem_bytes: 0,
        };
        let mut b = self.stream.launch_builder(&f);
        b.arg(&*t.param).arg(&t.staged).arg(&n).arg(&chunk).arg(&o);
        // SAFETY: argument types match
        // `ft_dense_read(ParamTable, u64 staged, int, u64, u32*)`.
        unsafe { b.launch(cfg) }.map_err(cu("launching the dense kernel"))?;
        self.release_arg(t)
    }

    pub(crate) fn record(&self, e: &CudaEventH) -> Result<()> {
        self.shared.bind()?;
        // SAFETY: live event and stream.
        unsafe { result::event::record(e.ev, self.raw()) }.map_err(cu("recording an event"))
    }

    pub(crate) fn wait(&self, e: &CudaEventH) -> Result<()> {
        self.shared.bind()?;
        // SAFETY: live event and stream.
        unsafe {
            result::stream::wait_event(
                self.raw(),
                e.ev,
                sys::CUevent_wait_flags::CU_EVENT_WAIT_DEFAULT,
            )
        }
        .map_err(cu("making a stream wait for an event"))
    }

    pub(crate) fn synchronize(&self) -> Result<()> {
        self.shared.bind()?;
        self.stream
            .synchronize()
            .map_err(cu("synchronizing a stream"))
    }
}

/// NCCL communicators of a group of devices in one process (`ncclCommInitAll`), for the
/// multi-GPU engine's combine. NCCL is loaded at run time (cudarc's dynamic loading);
/// [`NcclComms::new`] says why when it cannot be used, and the engine falls back to a
/// combine through the host.
pub(crate) struct NcclComms {
    comms: Vec<cudarc::nccl::sys::ncclComm_t>,
}

// SAFETY: NCCL communicators may be used from any thread as long as calls on one are not
// concurrent; the engine issues every collective from its one host thread.
unsafe impl Send for NcclComms {}
// SAFETY: as above (no method takes `&self` concurrently with another on the same comm).
unsafe impl Sync for NcclComms {}

impl NcclComms {
    /// Communicators for the devices `ordinals` (rank `i` is `ordinals[i]`); the reason in
    /// words when libnccl cannot be loaded or initialisation fails.
    pub(crate) fn new(ordinals: &[usize]) -> std::result::Result<NcclComms, String> {
        use cudarc::nccl::{result as nr, sys as ns};
        // SAFETY: only probes whether the shared library can be loaded (calling into a
        // library that is absent would panic in cudarc's loader).
        if !unsafe { ns::is_culib_present() } {
            return Err("libnccl could not be loaded".into());
        }
        let devs: Vec<i32> = ordinals.iter().map(|&o| o as i32).collect();
        let mut comms: Vec<ns::ncclComm_t> = vec![std::ptr::null_mut(); devs.len()];
        // SAFETY: `comms` has room for one communicator per listed device.
        unsafe { nr::comm_init_all(comms.as_mut_ptr(), devs.len() as i32, devs.as_ptr()) }
            .map_err(|e| format!("ncclCommInitAll failed: {:?}", e.0))?;
        Ok(NcclComms { comms })
    }

    /// Queue an in-place sum all-reduce of the first `n` f32 of each buffer, rank `i`'s
    /// on stream `parts[i].0` (one group call, so NCCL sees every rank before it starts).
    pub(crate) fn all_reduce_sum_f32(
        &self,
        parts: &[(&super::Stream, &DeviceBuffer)],
        n: usize,
    ) -> Result<()> {
        use cudarc::nccl::{result as nr, sys as ns};
        if parts.len() != self.comms.len() {
            return Err(RuntimeError::invalid(
                "NCCL all-reduce",
                format!("{} buffers for {} ranks", parts.len(), self.comms.len()),
            ));
        }
        let nccl = |op: &str| {
            let op = op.to_string();
            move |e: nr::NcclError| RuntimeError::cuda(op, format!("NCCL error {:?}", e.0))
        };
        nr::group_start().map_err(nccl("ncclGroupStart"))?;
        for (comm, (stream, buf)) in self.comms.iter().zip(parts) {
            buf.check_range("NCCL all-reduce", 0, n * 4)?;
            let ptr = dptr(buf)? as *mut std::ffi::c_void;
            let raw = match &stream.imp {
                super::StreamImpl::Cuda(s) => s.raw(),
                #[allow(unreachable_patterns)]
                _ => return Err(super::backend_mismatch("NCCL all-reduce")),
            };
            // SAFETY: `ptr` is `n` f32 of live device memory on the comm's device (checked
            // above), the stream belongs to that device, and the buffer outlives the
            // queued operation (buffers are freed only after a device synchronisation).
            unsafe {
                nr::all_reduce(
                    ptr as *const _,
                    ptr,
                    n,
                    ns::ncclDataType_t::ncclFloat32,
                    ns::ncclRedOp_t::ncclSum,
                    *comm,
                    raw as ns::cudaStream_t,
                )
            }
            .map_err(nccl("ncclAllReduce"))?;
        }
        nr::group_end().map_err(nccl("ncclGroupEnd"))?;
        Ok(())
    }
}

impl Drop for NcclComms {
    fn drop(&mut self) {
        for c in &self.comms {
            // SAFETY: each communicator was created once by `ncclCommInitAll`.
            let _ = unsafe { cudarc::nccl::result::comm_destroy(*c) };
        }
    }
}
