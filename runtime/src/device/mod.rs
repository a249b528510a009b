//! The device abstraction: one API over a CUDA GPU and a host-emulated device.
//!
//! The decode engine orchestrates streams, copies, events and kernel launches. The same
//! orchestration must run (and be tested) on machines without a GPU, so every operation
//! exists on two backends:
//!
//! - **CUDA** (feature `cuda`, cudarc with dynamic loading): device memory from
//!   `cuMemAlloc`, page-locked host memory from `cuMemHostAlloc(PORTABLE | DEVICEMAP)` (not
//!   write-combined: the CPU kernels read the same bytes), streams, events and NVRTC-compiled
//!   kernels from `kernels/cuda/`.
//! - **host-emulated**: "device memory" is page-aligned host RAM, each stream is a worker
//!   thread executing its queued operations in order, a copy is a `memcpy` on that thread
//!   (optionally throttled to a configured link bandwidth), events synchronise workers,
//!   and the "GPU expert kernel" runs the CPU kernels of `ft-kernels`.
//!
//! The set of backends is closed, so dispatch is an enum match per operation rather than a
//! trait object: buffer, stream and event handles of one backend never need downcasting.
//!
//! # Ordering contract (the CUDA one, on both backends)
//! Operations queued on one [`Stream`] run in queue order. Operations on different streams
//! are ordered only through [`Event`]s: [`Stream::record`] then [`Stream::wait`] makes every
//! later operation of the waiting stream start after everything queued on the recording
//! stream before the record. The host may wait with [`Event::synchronize`] or
//! [`Stream::synchronize`]. Asynchronous operations read and write buffers when they run,
//! not when they are queued: the caller must not touch a region of a [`HostBuffer`] while a
//! queued copy into or out of it may still run. [`Stream::upload`] and [`Stream::download`]
//! are the exceptions for small activation buffers: `upload` has copied the source before it
//! returns, `download` returns once the data has arrived.
//!
//! # Errors
//! Arguments are checked when an operation is queued (offsets and lengths against buffer
//! sizes, devices of all handles); a failure while it runs (host backend) is kept by the
//! stream and returned by the next `synchronize` or queue call, like CUDA's sticky errors.

pub mod host;
pub mod tuning;

#[cfg(feature = "cuda")]
pub mod cuda;

use serde::{Deserialize, Serialize};
use std::fmt;
use std::str::FromStr;
use std::sync::Arc;
use std::time::Instant;

use crate::dense::DenseRead;
use crate::error::{Result, RuntimeError};
use crate::gather::CopyRegion;
use crate::gpu_experts::ExpertStep;
pub use tuning::{CopySubmit, CudaTuning};

/// Which backend a [`Device`] uses.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum DeviceKind {
    /// The host-emulated device (always available).
    Host,
    /// An NVIDIA GPU through CUDA (feature `cuda`).
    Cuda,
}

impl DeviceKind {
    /// Name used on the command line and in JSON.
    pub fn name(self) -> &'static str {
        match self {
            DeviceKind::Host => "host",
            DeviceKind::Cuda => "cuda",
        }
    }
}

impl fmt::Display for DeviceKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for DeviceKind {
    type Err = RuntimeError;

    fn from_str(s: &str) -> Result<Self> {
        match s.to_ascii_lowercase().as_str() {
            "host" => Ok(DeviceKind::Host),
            "cuda" | "gpu" => Ok(DeviceKind::Cuda),
            _ => Err(RuntimeError::invalid(
                "device",
                format!("'{s}' is not a device kind; known: host, cuda"),
            )),
        }
    }
}

/// What a device is, for logs, measurement records and the host fingerprint.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DeviceInfo {
    /// Backend.
    pub kind: DeviceKind,
    /// Device ordinal (CUDA) or 0 (host).
    pub ordinal: usize,
    /// Device name (`NVIDIA H200`, or `host-emulated (N threads)`).
    pub name: String,
    /// Compute capability `(major, minor)`; `None` on the host backend.
    #[serde(default)]
    pub compute_capability: Option<(u32, u32)>,
    /// Streaming multiprocessors (CUDA) or expert-kernel threads (host).
    pub multiprocessors: u32,
    /// Device memory, bytes (host backend: its configured capacity).
    pub total_mem_bytes: u64,
    /// CUDA driver version as `major.minor`; `None` on the host backend.
    #[serde(default)]
    pub driver_version: Option<String>,
    /// How host banks are allocated, in words (e.g. `cuMemHostAlloc portable|devicemap`).
    pub host_memory: String,
    /// The CUDA paths the device runs ([`CudaTuning`]); `None` on the host backend.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cuda_tuning: Option<CudaTuning>,
}

impl DeviceInfo {
    /// The device in words for a table's header: its name, backend and, on CUDA, the paths
    /// it runs (`NVIDIA H200 (cuda: staged+pdl+split+cvt+wide, copies batch)`).
    pub fn label(&self) -> String {
        match &self.cuda_tuning {
            Some(t) => format!("{} ({}: {t})", self.name, self.kind),
            None => format!("{} ({})", self.name, self.kind),
        }
    }
}

/// Options of the host-emulated device.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct HostDeviceConfig {
    /// Capacity of the emulated device memory, bytes; 0 = half of the host's available RAM.
    pub memory_bytes: u64,
    /// Emulated link bandwidth of host-to-device and device-to-host copies, GB/s (1e9 B/s);
    /// `None` copies at memcpy speed.
    pub link_gbps: Option<f64>,
    /// Threads the emulated expert kernel may use; 0 = the rayon global pool.
    pub kernel_threads: usize,
}

/// How a [`Device`] is asked for.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "kebab-case", deny_unknown_fields)]
pub enum DeviceSpec {
    /// The host-emulated device.
    Host(HostDeviceConfig),
    /// CUDA device `ordinal`.
    Cuda {
        /// Device ordinal, from 0.
        #[serde(default)]
        ordinal: usize,
    },
}

impl DeviceSpec {
    /// The default spec of a kind (host: default config; CUDA: device 0).
    pub fn of_kind(kind: DeviceKind) -> Self {
        match kind {
            DeviceKind::Host => DeviceSpec::Host(HostDeviceConfig::default()),
            DeviceKind::Cuda => DeviceSpec::Cuda { ordinal: 0 },
        }
    }
}

/// A host-clock interval known to contain a device event's time: the host read the clock
/// `before_us` just before recording the event on an idle device and `after_us` just after
/// seeing it complete. The event is placed at its middle, within half its width.
#[derive(Debug, Clone, Copy, PartialEq)]
#[cfg_attr(not(feature = "cuda"), allow(dead_code))]
pub(crate) struct Bracket {
    pub before_us: f64,
    pub after_us: f64,
}

#[cfg_attr(not(feature = "cuda"), allow(dead_code))]
impl Bracket {
    pub fn width_us(&self) -> f64 {
        self.after_us - self.before_us
    }

    pub fn middle_us(&self) -> f64 {
        0.5 * (self.before_us + self.after_us)
    }

    /// The index of the narrowest of `brackets` (the first of equals); `None` when empty.
    pub fn narrowest(brackets: &[Bracket]) -> Option<usize> {
        (0..brackets.len()).reduce(|best, i| {
            if brackets[i].width_us() < brackets[best].width_us() {
                i
            } else {
                best
            }
        })
    }
}

/// A host-side monotonic clock shared by every timeline of one device.
///
/// Timestamps are microseconds since the device was opened; [`Event::timeline_us`] puts GPU
/// events on the same axis, and [`Event::timeline_us_from`] does it by an anchor event the
/// host recorded recently (what a decode step's timeline uses).
#[derive(Debug, Clone, Copy)]
pub struct Clock {
    origin: Instant,
}

impl Clock {
    /// A clock starting now.
    pub fn new() -> Self {
        Clock {
            origin: Instant::now(),
        }
    }

    /// Microseconds since the origin.
    pub fn now_us(&self) -> f64 {
        self.origin.elapsed().as_secs_f64() * 1e6
    }

    /// Microseconds from the origin to `t` (negative if `t` is earlier).
    pub fn us_at(&self, t: Instant) -> f64 {
        if t >= self.origin {
            (t - self.origin).as_secs_f64() * 1e6
        } else {
            -((self.origin - t).as_secs_f64() * 1e6)
        }
    }

    /// The instant of the origin.
    pub fn origin(&self) -> Instant {
        self.origin
    }
}

impl Default for Clock {
    fn default() -> Self {
        Self::new()
    }
}

pub(crate) enum Backend {
    Host(host::HostDevice),
    #[cfg(feature = "cuda")]
    Cuda(cuda::CudaDevice),
}

pub(crate) struct DeviceInner {
    pub(crate) backend: Backend,
    pub(crate) info: DeviceInfo,
    pub(crate) clock: Clock,
    /// Unique per opened device (to refuse mixing handles of two devices).
    pub(crate) uid: u64,
    /// Identity of the host memory this device shares: its own `uid`, or, for the devices
    /// of one [`Device::open_group`], the first one's (a host buffer of any of them may be
    /// the source or destination of every one's copies, as CUDA's portable pinned memory is).
    pub(crate) host_group: u64,
}

/// An opened device; cheap to clone (a shared handle).
#[derive(Clone)]
pub struct Device {
    pub(crate) inner: Arc<DeviceInner>,
}

impl fmt::Debug for Device {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Device")
            .field("kind", &self.info().kind)
            .field("name", &self.info().name)
            .finish()
    }
}

fn next_uid() -> u64 {
    use std::sync::atomic::{AtomicU64, Ordering};
    static NEXT: AtomicU64 = AtomicU64::new(1);
    NEXT.fetch_add(1, Ordering::Relaxed)
}

impl Device {
    /// Open a device. Asking for CUDA where it is not compiled in, or where no driver or
    /// GPU is present, is a [`RuntimeError::CudaUnavailable`] saying why (never a panic).
    pub fn open(spec: &DeviceSpec) -> Result<Device> {
        match spec {
            DeviceSpec::Host(cfg) => Device::host(cfg.clone()),
            DeviceSpec::Cuda { ordinal } => Device::cuda(*ordinal),
        }
    }

    /// Open the default device of a kind (see [`DeviceSpec::of_kind`]).
    pub fn open_kind(kind: DeviceKind) -> Result<Device> {
        Device::open(&DeviceSpec::of_kind(kind))
    }

    /// The host-emulated device.
    pub fn host(config: HostDeviceConfig) -> Result<Device> {
        Self::host_in(config, None, 0)
    }

    /// A host-emulated device sharing host memory with `group` (see `host_group`).
    fn host_in(config: HostDeviceConfig, group: Option<u64>, ordinal: usize) -> Result<Device> {
        let clock = Clock::new();
        let (backend, mut info) = host::HostDevice::new(config)?;
        info.ordinal = ordinal;
        let uid = next_uid();
        Ok(Device {
            inner: Arc::new(DeviceInner {
                backend: Backend::Host(backend),
                info,
                clock,
                uid,
                host_group: group.unwrap_or(uid),
            }),
        })
    }

    /// CUDA device `ordinal`.
    pub fn cuda(ordinal: usize) -> Result<Device> {
        Self::cuda_in(ordinal, None)
    }

    /// CUDA device `ordinal`, sharing host memory with `group` (see `host_group`).
    fn cuda_in(ordinal: usize, group: Option<u64>) -> Result<Device> {
        #[cfg(feature = "cuda")]
        {
            let clock = Clock::new();
            let (backend, info) = cuda::CudaDevice::new(ordinal, clock)?;
            let uid = next_uid();
            Ok(Device {
                inner: Arc::new(DeviceInner {
                    backend: Backend::Cuda(backend),
                    info,
                    clock,
                    uid,
                    host_group: group.unwrap_or(uid),
                }),
            })
        }
        #[cfg(not(feature = "cuda"))]
        {
            let _ = (ordinal, group);
            Err(RuntimeError::CudaUnavailable {
                reason: "this build has no CUDA support (rebuild with --features cuda)".into(),
            })
        }
    }

    /// `count` devices of one host that decode together (several GPUs): CUDA ordinals
    /// `ordinal .. ordinal + count` of `spec`, or `count` host-emulated devices of `spec`'s
    /// config (ordinals `0 .. count`). Host buffers allocated by any of them can be used by
    /// all of them (one pinned bank serves every GPU; CUDA: `PORTABLE` pinned memory, mapped
    /// at the same address in every context under unified addressing). Asking for more
    /// CUDA devices than the machine has is a [`RuntimeError::CudaUnavailable`] saying
    /// "asked for N GPUs, found M"; zero devices is [`RuntimeError::Invalid`].
    pub fn open_group(spec: &DeviceSpec, count: usize) -> Result<Vec<Device>> {
        if count == 0 {
            return Err(RuntimeError::invalid(
                "--gpus",
                "at least one GPU is needed",
            ));
        }
        let mut out: Vec<Device> = Vec::with_capacity(count);
        match spec {
            DeviceSpec::Host(cfg) => {
                for i in 0..count {
                    let group = out.first().map(|d| d.inner.host_group);
                    out.push(Self::host_in(cfg.clone(), group, i)?);
                }
            }
            DeviceSpec::Cuda { ordinal } => {
                let found = cuda_device_count()?;
                if ordinal + count > found {
                    return Err(RuntimeError::CudaUnavailable {
                        reason: if *ordinal == 0 {
                            format!("asked for {count} GPUs, found {found}")
                        } else {
                            format!(
                                "asked for {count} GPUs from device {ordinal} on, found {found}"
                            )
                        },
                    });
                }
                for i in 0..count {
                    let group = out.first().map(|d| d.inner.host_group);
                    out.push(Self::cuda_in(ordinal + i, group)?);
                }
            }
        }
        Ok(out)
    }

    /// What this device is.
    /// What the device is now: its description at open, with the CUDA paths it runs at the
    /// time of the call (see [`Device::set_cuda_tuning`]).
    pub fn info(&self) -> DeviceInfo {
        DeviceInfo {
            cuda_tuning: self.cuda_tuning(),
            ..self.inner.info.clone()
        }
    }

    /// The CUDA paths this device runs; `None` on the host backend.
    pub fn cuda_tuning(&self) -> Option<CudaTuning> {
        match &self.inner.backend {
            Backend::Host(_) => None,
            #[cfg(feature = "cuda")]
            Backend::Cuda(c) => Some(c.0.tuning()),
        }
    }

    /// Run other CUDA paths from now on (launches and copies queued later), for A/B
    /// measurements in one process; a device opens with [`CudaTuning::from_env`]. A path
    /// the driver lacks is replaced by the one that runs (batched copies before CUDA 13: one
    /// copy each, with a warning), so [`Device::cuda_tuning`] says what runs. The host
    /// backend has no CUDA paths: an error.
    pub fn set_cuda_tuning(&self, tuning: CudaTuning) -> Result<()> {
        match &self.inner.backend {
            Backend::Host(_) => {
                let _ = tuning;
                Err(RuntimeError::invalid(
                    "CUDA tuning",
                    "the host-emulated device runs no CUDA paths",
                ))
            }
            #[cfg(feature = "cuda")]
            Backend::Cuda(c) => {
                tuning.check()?;
                c.0.set_tuning(tuning);
                Ok(())
            }
        }
    }

    /// Whether its streams can store flags and gate launches on them
    /// ([`Stream::write_flag`], [`Stream::launch_experts_gated`]): always on the host
    /// backend; on CUDA with a driver of 11.7 or later (`cuStreamWriteValue32_v2`).
    pub fn supports_flag_gates(&self) -> bool {
        match &self.inner.backend {
            Backend::Host(_) => true,
            #[cfg(feature = "cuda")]
            Backend::Cuda(c) => c.0.flag_writes(),
        }
    }

    /// Its backend.
    pub fn kind(&self) -> DeviceKind {
        self.inner.info.kind
    }

    /// The host clock all timelines of this device use.
    pub fn clock(&self) -> Clock {
        self.inner.clock
    }

    /// Free device memory now, bytes.
    pub fn free_mem_bytes(&self) -> Result<u64> {
        match &self.inner.backend {
            Backend::Host(h) => Ok(h.free_mem_bytes()),
            #[cfg(feature = "cuda")]
            Backend::Cuda(c) => c.free_mem_bytes(),
        }
    }

    /// Allocate `bytes` of device memory, zeroed. `what` names it in errors.
    pub fn alloc(&self, bytes: usize, what: &str) -> Result<DeviceBuffer> {
        let mem = match &self.inner.backend {
            Backend::Host(h) => BufMem::Host(h.alloc_device(bytes, what)?),
            #[cfg(feature = "cuda")]
            Backend::Cuda(c) => BufMem::Cuda(c.alloc_device(bytes, what)?),
        };
        Ok(DeviceBuffer {
            uid: self.inner.uid,
            len: bytes,
            mem,
        })
    }

    /// Allocate `bytes` of host memory the device can copy from and to asynchronously and
    /// read directly (zero-copy), zeroed. CUDA: `cuMemHostAlloc(PORTABLE | DEVICEMAP)`,
    /// page-locked and cached (not write-combined), so CPU kernels read it at full speed.
    /// Host backend: page-aligned heap memory.
    pub fn alloc_host(&self, bytes: usize, what: &str) -> Result<HostBuffer> {
        let mem = match &self.inner.backend {
            Backend::Host(_) => HostMemImpl::Host(host::HostMem::new(bytes, what)?),
            #[cfg(feature = "cuda")]
            Backend::Cuda(c) => HostMemImpl::Cuda(c.alloc_pinned(bytes, what)?),
        };
        Ok(HostBuffer {
            uid: self.inner.host_group,
            len: bytes,
            mem,
        })
    }

    /// A new stream (queue of operations executed in order). `name` appears in timelines.
    pub fn new_stream(&self, name: &str) -> Result<Stream> {
        let imp = match &self.inner.backend {
            Backend::Host(h) => StreamImpl::Host(h.new_stream(name, self.inner.clock)?),
            #[cfg(feature = "cuda")]
            Backend::Cuda(c) => StreamImpl::Cuda(c.new_stream(name)?),
        };
        Ok(Stream {
            device: self.clone(),
            name: name.to_string(),
            imp,
        })
    }

    /// A new event. With `timing`, [`Event::elapsed_us`] and [`Event::timeline_us`] work;
    /// without, recording is cheaper (CUDA `CU_EVENT_DISABLE_TIMING`).
    pub fn new_event(&self, timing: bool) -> Result<Event> {
        let imp = match &self.inner.backend {
            Backend::Host(_) => EventImpl::Host(host::HostEvent::new()),
            #[cfg(feature = "cuda")]
            Backend::Cuda(c) => EventImpl::Cuda(c.new_event(timing)?),
        };
        Ok(Event {
            device: self.clone(),
            timing,
            imp,
        })
    }

    /// Block until all work queued on every stream of this device has finished.
    pub fn synchronize(&self) -> Result<()> {
        match &self.inner.backend {
            Backend::Host(h) => h.synchronize_all(),
            #[cfg(feature = "cuda")]
            Backend::Cuda(c) => c.synchronize(),
        }
    }

    /// The block timelines the expert kernels recorded since the last call, every queued
    /// launch finished first (the device is synchronized), and the kernels' buffers emptied
    /// for the next ones: launches record only with [`CudaTuning::block_stamps`] on (module
    /// docs of [`crate::block_stamps`]). The host backend runs no CUDA kernels: an error.
    pub fn take_block_stamps(&self) -> Result<crate::block_stamps::BlockStamps> {
        match &self.inner.backend {
            Backend::Host(_) => Err(RuntimeError::invalid(
                "block stamps",
                "the host-emulated device runs no CUDA kernels to time",
            )),
            #[cfg(feature = "cuda")]
            Backend::Cuda(c) => c.0.take_block_stamps(),
        }
    }

    /// Compile (once per device) every kernel a decode step may use, so that the first step
    /// pays no NVRTC time: the streaming kernels, and the expert kernels for the format and
    /// activation path of each of `steps` (one module each) on the device's paths. No-op on
    /// the host backend.
    pub fn warm_up_kernels(&self, steps: &[&crate::gpu_experts::ExpertStep]) -> Result<()> {
        match &self.inner.backend {
            Backend::Host(_) => {
                let _ = steps;
                Ok(())
            }
            #[cfg(feature = "cuda")]
            Backend::Cuda(c) => self.warm_up_expert_paths(&[c.0.tuning()], steps),
        }
    }

    /// [`Device::warm_up_kernels`] for each of `tunings` at once (their modules compiled in
    /// parallel, then kept): for a caller that will switch between paths
    /// ([`Device::set_cuda_tuning`]), such as the GPU tests of every path. No-op on the host
    /// backend.
    pub fn warm_up_expert_paths(
        &self,
        tunings: &[CudaTuning],
        steps: &[&crate::gpu_experts::ExpertStep],
    ) -> Result<()> {
        match &self.inner.backend {
            Backend::Host(_) => {
                let _ = (tunings, steps);
                Ok(())
            }
            #[cfg(feature = "cuda")]
            Backend::Cuda(c) => {
                let mut specs = Vec::new();
                for tuning in tunings {
                    for s in steps {
                        specs.push(crate::gpu_experts::cuda_specialization(s, tuning));
                    }
                }
                c.warm_up_kernels(&specs)
            }
        }
    }

    /// Like [`Device::check_same`] for a host buffer: any device of this one's group.
    pub(crate) fn check_host(&self, uid: u64, op: &str, what: &str) -> Result<()> {
        if uid != self.inner.host_group {
            return Err(RuntimeError::DeviceMismatch {
                op: op.to_string(),
                reason: format!("{what} is host memory of a device outside the stream's group"),
            });
        }
        Ok(())
    }

    pub(crate) fn check_same(&self, uid: u64, op: &str, what: &str) -> Result<()> {
        if uid != self.inner.uid {
            return Err(RuntimeError::DeviceMismatch {
                op: op.to_string(),
                reason: format!("{what} belongs to another device than the stream"),
            });
        }
        Ok(())
    }
}

/// CUDA devices the driver reports; a [`RuntimeError::CudaUnavailable`] saying why when
/// there is no usable driver (or the build has no CUDA).
pub fn cuda_device_count() -> Result<usize> {
    #[cfg(feature = "cuda")]
    {
        if let Some(reason) = cuda::unavailable_reason() {
            return Err(RuntimeError::CudaUnavailable { reason });
        }
        cudarc::driver::result::device::get_count()
            .map(|n| n.max(0) as usize)
            .map_err(|e| RuntimeError::cuda("counting devices", e))
    }
    #[cfg(not(feature = "cuda"))]
    {
        Err(RuntimeError::CudaUnavailable {
            reason: "this build has no CUDA support (rebuild with --features cuda)".into(),
        })
    }
}

pub(crate) enum BufMem {
    Host(host::HostMem),
    #[cfg(feature = "cuda")]
    Cuda(cuda::CudaMem),
}

/// Device memory (bytes). Freed on drop; on CUDA the drop first waits for the device to be
/// idle, so a buffer can never be freed under a running operation.
pub struct DeviceBuffer {
    pub(crate) uid: u64,
    pub(crate) len: usize,
    pub(crate) mem: BufMem,
}

impl fmt::Debug for DeviceBuffer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "DeviceBuffer({} bytes)", self.len)
    }
}

impl DeviceBuffer {
    /// Size, bytes.
    pub fn len(&self) -> usize {
        self.len
    }

    /// True when the buffer has no bytes.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The device address of byte `offset` (CUDA `CUdeviceptr`; host backend: the host
    /// address). For logs and for kernels that take raw pointers.
    pub fn device_address(&self, offset: usize) -> u64 {
        let base = match &self.mem {
            BufMem::Host(m) => m.addr(),
            #[cfg(feature = "cuda")]
            BufMem::Cuda(m) => m.ptr(),
        };
        base + offset as u64
    }

    pub(crate) fn check_range(&self, field: &str, offset: usize, bytes: usize) -> Result<()> {
        check_range(field, self.len, offset, bytes)
    }
}

pub(crate) enum HostMemImpl {
    Host(host::HostMem),
    #[cfg(feature = "cuda")]
    Cuda(cuda::PinnedMem),
}

/// Host memory the device reads and writes asynchronously (page-locked on CUDA).
///
/// See the module's ordering contract: do not access a region while a queued copy of it
/// may still run.
pub struct HostBuffer {
    pub(crate) uid: u64,
    pub(crate) len: usize,
    pub(crate) mem: HostMemImpl,
}

impl fmt::Debug for HostBuffer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "HostBuffer({} bytes)", self.len)
    }
}

impl HostBuffer {
    /// Size, bytes.
    pub fn len(&self) -> usize {
        self.len
    }

    /// True when the buffer has no bytes.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    fn ptr(&self) -> *mut u8 {
        match &self.mem {
            HostMemImpl::Host(m) => m.ptr(),
            #[cfg(feature = "cuda")]
            HostMemImpl::Cuda(m) => m.ptr(),
        }
    }

    /// The bytes. Must not be called while a queued device-to-host copy into this buffer may
    /// still run (synchronise on an event first).
    pub fn as_slice(&self) -> &[u8] {
        if self.len == 0 {
            return &[];
        }
        // SAFETY: the allocation is `len` bytes and lives as long as `self`; concurrent
        // device writes are excluded by the documented contract.
        unsafe { std::slice::from_raw_parts(self.ptr(), self.len) }
    }

    /// The bytes, writable. The same contract as [`HostBuffer::as_slice`], for copies out of
    /// this buffer too.
    pub fn as_mut_slice(&mut self) -> &mut [u8] {
        if self.len == 0 {
            return &mut [];
        }
        // SAFETY: as in `as_slice`, and `&mut self` excludes other host references.
        unsafe { std::slice::from_raw_parts_mut(self.ptr(), self.len) }
    }

    /// The f32 values at byte `offset` (4-byte aligned), `n` of them.
    pub fn read_f32(&self, offset: usize, n: usize) -> Result<Vec<f32>> {
        check_range("host buffer read", self.len, offset, n * 4)?;
        Ok(bytes_to_f32(&self.as_slice()[offset..offset + n * 4]))
    }

    /// Write f32 values at byte `offset`.
    pub fn write_f32(&mut self, offset: usize, values: &[f32]) -> Result<()> {
        check_range("host buffer write", self.len, offset, values.len() * 4)?;
        self.as_mut_slice()[offset..offset + values.len() * 4]
            .copy_from_slice(f32_as_bytes(values));
        Ok(())
    }

    pub(crate) fn check_range(&self, field: &str, offset: usize, bytes: usize) -> Result<()> {
        check_range(field, self.len, offset, bytes)
    }
}

pub(crate) enum StreamImpl {
    Host(host::HostStream),
    #[cfg(feature = "cuda")]
    Cuda(cuda::CudaStreamH),
}

/// A queue of device operations executed in order (a CUDA stream, or a worker thread).
pub struct Stream {
    device: Device,
    name: String,
    pub(crate) imp: StreamImpl,
}

impl fmt::Debug for Stream {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Stream({})", self.name)
    }
}

/// Most row blocks [`Stream::combine_fixed`] sums (`COMBINE_MAX_BLOCKS` in
/// `kernels/cuda/common.cuh`): a top-k of at most 64.
pub const COMBINE_MAX_BLOCKS: usize = 64;

/// Most buffers [`Stream::combine_fixed`] adds onto its parts (the kernel's `m0` .. `m3`).
pub const COMBINE_MAX_PARTS: usize = 4;

/// A decode layer's fixed-order combine, as [`Stream::combine_fixed`] takes it: `k` row
/// blocks of `block` f32 in `parts`, each buffer of `more` added to them in turn, summed by
/// the fixed tree into the first `block` f32 of `act`.
#[derive(Debug, Clone, Copy)]
pub struct LayerCombine<'a> {
    /// The residual stream the sum is added to.
    pub act: &'a DeviceBuffer,
    /// The first rows summed (a layer's hits).
    pub parts: &'a DeviceBuffer,
    /// The rows added to them, in order (a layer's fetched chunks).
    pub more: &'a [&'a DeviceBuffer],
    /// f32 per row block (streams x hidden).
    pub block: usize,
    /// Row blocks (the top-k).
    pub k: usize,
}

/// A launch's start condition: a u32 flag in device memory that another stream sets
/// ([`Stream::write_flag`]) once what the launch reads is in place. A launch gated on it
/// ([`Stream::launch_experts_gated`]) is queued without an event wait and starts at once;
/// its work waits on the device until the flag has reached `value` (modular: values count
/// up and wrap), so its start overlaps the copies it depends on.
#[derive(Debug, Clone, Copy)]
pub struct FlagGate<'a> {
    /// The buffer holding the flag.
    pub flag: &'a DeviceBuffer,
    /// Byte offset of the flag in it (a multiple of 4).
    pub offset: usize,
    /// The value the launch waits for.
    pub value: u32,
}

impl FlagGate<'_> {
    /// Refuse a flag outside its buffer or unaligned, naming `op`.
    fn check(&self, op: &str) -> Result<()> {
        if !self.offset.is_multiple_of(4) {
            return Err(RuntimeError::invalid(
                op,
                format!("flag at byte {}: not a multiple of 4", self.offset),
            ));
        }
        self.flag.check_range(&format!("{op} flag"), self.offset, 4)
    }
}

/// The rounds (`dst block`, `src block`, `blocks`) of the fixed-order halving tree that sums
/// `blocks` row blocks into block 0: while more than one is left, the upper half is added
/// onto the lower (`ceil(log2 blocks)` rounds). One definition for the engine's combine and
/// both devices' [`Stream::combine_fixed`].
pub fn fixed_tree_rounds(blocks: usize) -> Vec<(usize, usize, usize)> {
    let mut out = Vec::new();
    let mut len = blocks;
    while len > 1 {
        let h = len / 2;
        out.push((0, len - h, h));
        len -= h;
    }
    out
}

/// Dispatch one stream operation to the backend.
macro_rules! on_stream {
    ($self:ident, $s:ident => $e:expr) => {
        match &$self.imp {
            StreamImpl::Host($s) => $e,
            #[cfg(feature = "cuda")]
            StreamImpl::Cuda($s) => $e,
        }
    };
}

impl Stream {
    /// The device of this stream.
    pub fn device(&self) -> &Device {
        &self.device
    }

    /// Its name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Queue a copy of `bytes` from `src[src_offset..]` (host) to `dst[dst_offset..]`.
    pub fn copy_h2d(
        &self,
        src: &HostBuffer,
        src_offset: usize,
        dst: &DeviceBuffer,
        dst_offset: usize,
        bytes: usize,
    ) -> Result<()> {
        let region = CopyRegion {
            src_offset: src_offset as u64,
            dst_offset: dst_offset as u64,
            bytes: bytes as u64,
        };
        self.copy_h2d_regions(src, dst, std::slice::from_ref(&region))
    }

    /// Queue one copy-engine transfer per region, host `src` to device `dst` (the "async
    /// copy" gather).
    pub fn copy_h2d_regions(
        &self,
        src: &HostBuffer,
        dst: &DeviceBuffer,
        regions: &[CopyRegion],
    ) -> Result<()> {
        self.check_regions("copy_h2d", src.uid, src.len, dst.uid, dst.len, regions)?;
        on_stream!(self, s => s.copy_h2d_regions(src, dst, regions))
    }

    /// Queue a copy of `bytes` from device `src[src_offset..]` to host `dst[dst_offset..]`.
    pub fn copy_d2h(
        &self,
        src: &DeviceBuffer,
        src_offset: usize,
        dst: &HostBuffer,
        dst_offset: usize,
        bytes: usize,
    ) -> Result<()> {
        self.device
            .check_same(src.uid, "copy_d2h", "source buffer")?;
        self.device
            .check_host(dst.uid, "copy_d2h", "destination buffer")?;
        src.check_range("copy_d2h source", src_offset, bytes)?;
        dst.check_range("copy_d2h destination", dst_offset, bytes)?;
        on_stream!(self, s => s.copy_d2h(src, src_offset, dst, dst_offset, bytes))
    }

    /// Queue a device-to-device copy.
    pub fn copy_d2d(
        &self,
        src: &DeviceBuffer,
        src_offset: usize,
        dst: &DeviceBuffer,
        dst_offset: usize,
        bytes: usize,
    ) -> Result<()> {
        self.device
            .check_same(src.uid, "copy_d2d", "source buffer")?;
        self.device
            .check_same(dst.uid, "copy_d2d", "destination buffer")?;
        src.check_range("copy_d2d source", src_offset, bytes)?;
        dst.check_range("copy_d2d destination", dst_offset, bytes)?;
        on_stream!(self, s => s.copy_d2d(src, src_offset, dst, dst_offset, bytes))
    }

    /// Queue a copy of a small host slice to the device; `src` has been copied (staged)
    /// when this returns, so it may be reused at once. For activation vectors.
    pub fn upload(&self, src: &[u8], dst: &DeviceBuffer, dst_offset: usize) -> Result<()> {
        self.device
            .check_same(dst.uid, "upload", "destination buffer")?;
        dst.check_range("upload destination", dst_offset, src.len())?;
        on_stream!(self, s => s.upload(src, dst, dst_offset))
    }

    /// [`Stream::upload`] of f32 values.
    pub fn upload_f32(&self, src: &[f32], dst: &DeviceBuffer, dst_offset: usize) -> Result<()> {
        self.upload(f32_as_bytes(src), dst, dst_offset)
    }

    /// Copy device bytes to a host slice after everything queued before on this stream;
    /// blocks until the data is there.
    pub fn download(&self, src: &DeviceBuffer, src_offset: usize, dst: &mut [u8]) -> Result<()> {
        self.device
            .check_same(src.uid, "download", "source buffer")?;
        src.check_range("download source", src_offset, dst.len())?;
        on_stream!(self, s => s.download(src, src_offset, dst))
    }

    /// [`Stream::download`] of `n` f32 values.
    pub fn download_f32(
        &self,
        src: &DeviceBuffer,
        src_offset: usize,
        n: usize,
    ) -> Result<Vec<f32>> {
        let mut bytes = vec![0u8; n * 4];
        self.download(src, src_offset, &mut bytes)?;
        Ok(bytes_to_f32(&bytes))
    }

    /// Queue zeroing of `bytes` of `dst` from `offset`.
    pub fn memset_zero(&self, dst: &DeviceBuffer, offset: usize, bytes: usize) -> Result<()> {
        self.device
            .check_same(dst.uid, "memset_zero", "destination buffer")?;
        dst.check_range("memset_zero", offset, bytes)?;
        on_stream!(self, s => s.memset_zero(dst, offset, bytes))
    }

    /// Queue a wait of `us` microseconds on the stream itself (a GPU-side spin on CUDA, a
    /// sleep of the worker on the host device): a benchmark queues the work it times behind
    /// it, so the timing holds the device's time and not the host's enqueue cost.
    pub fn hold_us(&self, us: f64) -> Result<()> {
        on_stream!(self, s => s.hold_us(us))
    }

    /// Queue `dst[i] += src[i]` for `n` f32 values at the given byte offsets (how hybrid adds
    /// the CPU experts' partial output to the GPU's).
    pub fn add_f32(
        &self,
        dst: &DeviceBuffer,
        dst_offset: usize,
        src: &DeviceBuffer,
        src_offset: usize,
        n: usize,
    ) -> Result<()> {
        self.device.check_same(dst.uid, "add_f32", "destination")?;
        self.device.check_same(src.uid, "add_f32", "source")?;
        dst.check_range("add_f32 destination", dst_offset, n * 4)?;
        src.check_range("add_f32 source", src_offset, n * 4)?;
        if (dst_offset | src_offset) & 3 != 0 {
            return Err(RuntimeError::invalid(
                "add_f32 offsets",
                "must be multiples of 4 bytes",
            ));
        }
        on_stream!(self, s => s.add_f32(dst, dst_offset, src, src_offset, n))
    }

    /// Queue a decode layer's fixed-order combine in one operation: with `k` row blocks of
    /// `block` f32 each in `parts` (and each buffer of `more`, at most
    /// [`COMBINE_MAX_PARTS`], added to them in turn), sum the blocks by the halving tree of
    /// [`fixed_tree_rounds`] and add the sum to the first `block` f32 of `act`. The same
    /// additions in the same order as one [`Stream::add_f32`] per buffer and per round (the
    /// outputs are bit for bit the same), in one launch.
    pub fn combine_fixed(
        &self,
        act: &DeviceBuffer,
        parts: &DeviceBuffer,
        more: &[&DeviceBuffer],
        block: usize,
        k: usize,
    ) -> Result<()> {
        self.check_combine(&LayerCombine {
            act,
            parts,
            more,
            block,
            k,
        })?;
        on_stream!(self, s => s.combine_fixed(act, parts, more, block, k))
    }

    /// [`Stream::launch_experts`] then [`Stream::combine_fixed`] with `combine`, the same
    /// bits; on CUDA in the expert kernels' launches, the combine folded into the down
    /// kernel (the last block of each row tile combines the tile's columns once it has
    /// written them), so the layer's last launch is its experts' and not a combine's.
    pub fn launch_experts_then_combine(
        &self,
        step: &ExpertStep,
        weights: &DeviceBuffer,
        x: &DeviceBuffer,
        y: &DeviceBuffer,
        combine: &LayerCombine<'_>,
    ) -> Result<()> {
        self.queue_experts(step, weights, x, y, Some(combine), None)
    }

    /// Check a combine's arguments ([`Stream::combine_fixed`]).
    fn check_combine(&self, c: &LayerCombine<'_>) -> Result<()> {
        let LayerCombine {
            act,
            parts,
            more,
            block,
            k,
        } = *c;
        if k == 0 || k > COMBINE_MAX_BLOCKS {
            return Err(RuntimeError::invalid(
                "combine_fixed blocks",
                format!("{k} row blocks (1 to {COMBINE_MAX_BLOCKS})"),
            ));
        }
        if more.len() > COMBINE_MAX_PARTS {
            return Err(RuntimeError::invalid(
                "combine_fixed parts",
                format!("{} added buffers (at most {COMBINE_MAX_PARTS})", more.len()),
            ));
        }
        self.device.check_same(act.uid, "combine_fixed", "act")?;
        self.device
            .check_same(parts.uid, "combine_fixed", "parts")?;
        act.check_range("combine_fixed act", 0, block * 4)?;
        parts.check_range("combine_fixed parts", 0, k * block * 4)?;
        for m in more {
            self.device
                .check_same(m.uid, "combine_fixed", "added buffer")?;
            m.check_range("combine_fixed added buffer", 0, k * block * 4)?;
        }
        Ok(())
    }

    /// Queue the zero-copy gather: one kernel that reads the regions of mapped host memory
    /// `src` directly over the link and writes them into `dst`.
    pub fn gather_zero_copy(
        &self,
        src: &HostBuffer,
        dst: &DeviceBuffer,
        regions: &[CopyRegion],
    ) -> Result<()> {
        self.check_regions(
            "gather_zero_copy",
            src.uid,
            src.len,
            dst.uid,
            dst.len,
            regions,
        )?;
        on_stream!(self, s => s.gather_zero_copy(src, dst, regions))
    }

    /// Queue one launch computing all of a layer's GPU-side routed experts (see
    /// [`ExpertStep`] for the semantics): `weights` holds the experts at the step's offsets
    /// (the cache's slot memory), `x` the f32 inputs `[step.tokens x hidden]`, and `y`
    /// receives the f32 outputs `[step.tokens x hidden]` (overwritten).
    pub fn launch_experts(
        &self,
        step: &ExpertStep,
        weights: &DeviceBuffer,
        x: &DeviceBuffer,
        y: &DeviceBuffer,
    ) -> Result<()> {
        self.queue_experts(step, weights, x, y, None, None)
    }

    /// Store `gate.value` at `gate`'s flag once every earlier item of this stream has
    /// completed, their writes visible with it: the signal a launch gated on the flag
    /// ([`Stream::launch_experts_gated`], on another stream) waits for. A device without
    /// flag writes ([`Device::supports_flag_gates`]) refuses it.
    pub fn write_flag(&self, gate: &FlagGate<'_>) -> Result<()> {
        self.check_gate(gate, "write_flag")?;
        on_stream!(self, s => s.write_flag(gate.flag, gate.offset, gate.value))
    }

    /// [`Stream::launch_experts`] (then the layer's combine where `combine` is given, as
    /// [`Stream::launch_experts_then_combine`]) with its work held until `gate`'s flag has
    /// reached its value: queued without waiting for an event, so the launch's start
    /// overlaps whatever the flag's writer is doing. The same bits as the ungated launch.
    pub fn launch_experts_gated(
        &self,
        step: &ExpertStep,
        weights: &DeviceBuffer,
        x: &DeviceBuffer,
        y: &DeviceBuffer,
        combine: Option<&LayerCombine<'_>>,
        gate: &FlagGate<'_>,
    ) -> Result<()> {
        self.check_gate(gate, "launch_experts_gated")?;
        self.queue_experts(step, weights, x, y, combine, Some(gate))
    }

    /// The expert launch behind [`Stream::launch_experts`],
    /// [`Stream::launch_experts_then_combine`] and [`Stream::launch_experts_gated`]: the
    /// experts of `step` (an empty step zeroes `y`), then the layer's combine where
    /// `combine` is given (on CUDA folded into the down kernel where it covers whole rows),
    /// the work held until `gate`'s flag where that is given. Every argument is checked
    /// before anything is queued, except the combine's, which its own launch checks.
    fn queue_experts(
        &self,
        step: &ExpertStep,
        weights: &DeviceBuffer,
        x: &DeviceBuffer,
        y: &DeviceBuffer,
        combine: Option<&LayerCombine<'_>>,
        gate: Option<&FlagGate<'_>>,
    ) -> Result<()> {
        self.check_experts(step, weights, x, y)?;
        // The host device's stream waits for the flag itself; CUDA's kernels do
        // (experts.cu's gate_wait), and an empty step there reads no weights.
        if let (StreamImpl::Host(s), Some(g)) = (&self.imp, gate) {
            s.wait_flag(g.flag, g.offset, g.value)?;
        }
        if step.experts.is_empty() {
            self.memset_zero(y, 0, step.tokens * step.hidden * 4)?;
        } else {
            match &self.imp {
                StreamImpl::Host(s) => s.launch_experts(step, weights, x, y)?,
                #[cfg(feature = "cuda")]
                StreamImpl::Cuda(s) => {
                    // The down kernel's tiles cover every column of the hidden size for
                    // every row; the fold covers every stream of `block` in them.
                    if let Some(cb) = combine.filter(|c| c.block.is_multiple_of(step.hidden)) {
                        self.check_combine(cb)?;
                        return s.launch_experts(step, weights, x, y, Some(cb), gate.copied());
                    }
                    s.launch_experts(step, weights, x, y, None, gate.copied())?;
                }
            }
        }
        match combine {
            Some(cb) => self.combine_fixed(cb.act, cb.parts, cb.more, cb.block, cb.k),
            None => Ok(()),
        }
    }

    /// Check a gate's flag: on this device, inside its buffer, and a device that has flag
    /// writes.
    fn check_gate(&self, gate: &FlagGate<'_>, op: &str) -> Result<()> {
        if !self.device.supports_flag_gates() {
            return Err(RuntimeError::invalid(
                op,
                "this device's driver has no stream flag writes (CUDA 11.7 or later)",
            ));
        }
        self.device.check_same(gate.flag.uid, op, "flag")?;
        gate.check(op)
    }

    /// Check an expert launch's buffers ([`Stream::launch_experts`]).
    fn check_experts(
        &self,
        step: &ExpertStep,
        weights: &DeviceBuffer,
        x: &DeviceBuffer,
        y: &DeviceBuffer,
    ) -> Result<()> {
        for (b, what) in [(weights, "weights"), (x, "x"), (y, "y")] {
            self.device.check_same(b.uid, "launch_experts", what)?;
        }
        step.validate(weights.len, x.len, y.len)
    }

    /// Queue the dense-part kernel: read every byte of every region (dense weights of a
    /// layer, each stream's KV bytes) and fold them into `out` (at least
    /// [`crate::dense::DENSE_OUT_BYTES`] bytes), so the reads cannot be elided.
    pub fn launch_dense(&self, reads: &[DenseRead<'_>], out: &DeviceBuffer) -> Result<()> {
        self.device.check_same(out.uid, "launch_dense", "output")?;
        if out.len < crate::dense::DENSE_OUT_BYTES {
            return Err(RuntimeError::invalid(
                "launch_dense output",
                format!(
                    "{} bytes, needs at least {}",
                    out.len,
                    crate::dense::DENSE_OUT_BYTES
                ),
            ));
        }
        for r in reads {
            self.device
                .check_same(r.buffer.uid, "launch_dense", "a read region")?;
            r.buffer
                .check_range("launch_dense read", r.offset, r.bytes)?;
        }
        on_stream!(self, s => s.launch_dense(reads, out))
    }

    /// Queue a record of `event`: it completes when everything queued before it here has.
    pub fn record(&self, event: &Event) -> Result<()> {
        self.device
            .check_same(event.device.inner.uid, "record", "event")?;
        match (&self.imp, &event.imp) {
            (StreamImpl::Host(s), EventImpl::Host(e)) => s.record(e),
            #[cfg(feature = "cuda")]
            (StreamImpl::Cuda(s), EventImpl::Cuda(e)) => s.record(e),
            #[allow(unreachable_patterns)]
            _ => Err(backend_mismatch("record")),
        }
    }

    /// Make every later operation of this stream wait for the last record of `event`.
    pub fn wait(&self, event: &Event) -> Result<()> {
        self.device
            .check_same(event.device.inner.uid, "wait", "event")?;
        match (&self.imp, &event.imp) {
            (StreamImpl::Host(s), EventImpl::Host(e)) => s.wait(e),
            #[cfg(feature = "cuda")]
            (StreamImpl::Cuda(s), EventImpl::Cuda(e)) => s.wait(e),
            #[allow(unreachable_patterns)]
            _ => Err(backend_mismatch("wait")),
        }
    }

    /// Block until everything queued here has finished; returns a failure of any of it.
    pub fn synchronize(&self) -> Result<()> {
        on_stream!(self, s => s.synchronize())
    }

    /// Time what `op` queues here, in us on the device: `start` recorded before it, `end`
    /// after, then wait for `end`. Queued behind other work (a [`Stream::hold_us`]), it is
    /// the device's time alone, not the host's cost of queueing it.
    pub fn time_us(
        &self,
        start: &Event,
        end: &Event,
        op: impl FnOnce() -> Result<()>,
    ) -> Result<f64> {
        self.record(start)?;
        op()?;
        self.record(end)?;
        end.synchronize()?;
        start.elapsed_us(end)
    }

    fn check_regions(
        &self,
        op: &str,
        src_uid: u64,
        src_len: usize,
        dst_uid: u64,
        dst_len: usize,
        regions: &[CopyRegion],
    ) -> Result<()> {
        self.device.check_host(src_uid, op, "source buffer")?;
        self.device.check_same(dst_uid, op, "destination buffer")?;
        for r in regions {
            check_range(
                &format!("{op} source"),
                src_len,
                r.src_offset as usize,
                r.bytes as usize,
            )?;
            check_range(
                &format!("{op} destination"),
                dst_len,
                r.dst_offset as usize,
                r.bytes as usize,
            )?;
        }
        Ok(())
    }
}

pub(crate) enum EventImpl {
    Host(host::HostEvent),
    #[cfg(feature = "cuda")]
    Cuda(cuda::CudaEventH),
}

/// A marker in a stream's queue (a CUDA event).
pub struct Event {
    device: Device,
    timing: bool,
    pub(crate) imp: EventImpl,
}

impl fmt::Debug for Event {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Event(timing: {})", self.timing)
    }
}

impl Event {
    /// Block the host until the last record of this event has completed (immediately if it
    /// was never recorded).
    pub fn synchronize(&self) -> Result<()> {
        match &self.imp {
            EventImpl::Host(e) => e.synchronize(),
            #[cfg(feature = "cuda")]
            EventImpl::Cuda(e) => e.synchronize(),
        }
    }

    /// True when the last record has completed (or there was none).
    pub fn is_complete(&self) -> Result<bool> {
        match &self.imp {
            EventImpl::Host(e) => Ok(e.is_complete()),
            #[cfg(feature = "cuda")]
            EventImpl::Cuda(e) => e.is_complete(),
        }
    }

    /// Microseconds from this event's completion to `later`'s; both must have been recorded
    /// and completed, and both created with timing.
    pub fn elapsed_us(&self, later: &Event) -> Result<f64> {
        if !self.timing || !later.timing {
            return Err(RuntimeError::invalid(
                "event",
                "elapsed time needs events created with timing",
            ));
        }
        match (&self.imp, &later.imp) {
            #[cfg(feature = "cuda")]
            (EventImpl::Cuda(a), EventImpl::Cuda(b)) => a.elapsed_us(b),
            _ => Ok(later.timeline_us()? - self.timeline_us()?),
        }
    }

    /// When this event completed on the device's [`Clock`], placed by an `anchor` event that
    /// the host recorded at `anchor_us` (its clock, just before the record) on an idle
    /// stream: `anchor_us` plus the elapsed time from the anchor. So a step's device spans
    /// sit on the host's axis within the few microseconds an idle stream takes to reach a
    /// record, whatever the device clock's drift or the origin's error since the device
    /// opened. The host device's events carry host times already and keep them.
    #[cfg_attr(not(feature = "cuda"), allow(unused_variables))]
    pub fn timeline_us_from(&self, anchor: &Event, anchor_us: f64) -> Result<f64> {
        match &self.imp {
            EventImpl::Host(_) => self.timeline_us(),
            #[cfg(feature = "cuda")]
            EventImpl::Cuda(_) => Ok(anchor_us + anchor.elapsed_us(self)?),
        }
    }

    /// When this event completed, in microseconds on the device's [`Clock`] (the same axis
    /// as [`Clock::now_us`]); the event must have been recorded, completed, and created
    /// with timing. CUDA: the elapsed time from an origin event recorded when the device was
    /// opened, plus that origin's host time (resolution about 0.5 us).
    pub fn timeline_us(&self) -> Result<f64> {
        if !self.timing {
            return Err(RuntimeError::invalid(
                "event",
                "timestamps need an event created with timing",
            ));
        }
        match &self.imp {
            EventImpl::Host(e) => e.completed_at().map(|t| self.device.clock().us_at(t)),
            #[cfg(feature = "cuda")]
            EventImpl::Cuda(e) => match &self.device.inner.backend {
                Backend::Cuda(c) => c.event_timeline_us(e),
                #[allow(unreachable_patterns)]
                _ => Err(backend_mismatch("timeline_us")),
            },
        }
    }
}

fn backend_mismatch(op: &str) -> RuntimeError {
    RuntimeError::DeviceMismatch {
        op: op.to_string(),
        reason: "handles of two backends".into(),
    }
}

/// Every handle of the API is `Send + Sync` on every backend (checked at compile time).
const _: () = {
    const fn send_sync<T: Send + Sync>() {}
    send_sync::<Device>();
    send_sync::<DeviceBuffer>();
    send_sync::<HostBuffer>();
    send_sync::<Stream>();
    send_sync::<Event>();
};

/// Check `offset + bytes <= len` without overflow; the error names `field`.
pub(crate) fn check_range(field: &str, len: usize, offset: usize, bytes: usize) -> Result<()> {
    match offset.checked_add(bytes) {
        Some(end) if end <= len => Ok(()),
        _ => Err(RuntimeError::invalid(
            field,
            format!("bytes {offset}..{offset}+{bytes} lie outside a buffer of {len} bytes"),
        )),
    }
}

/// View f32 values as their bytes (little-endian on every supported target).
pub fn f32_as_bytes(v: &[f32]) -> &[u8] {
    // SAFETY: f32 has no padding and any byte pattern of it is a valid u8 sequence.
    unsafe { std::slice::from_raw_parts(v.as_ptr() as *const u8, std::mem::size_of_val(v)) }
}

/// Decode little-endian f32 values from bytes (length a multiple of 4).
pub fn bytes_to_f32(b: &[u8]) -> Vec<f32> {
    b.chunks_exact(4)
        .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::Bracket;

    #[test]
    fn the_narrowest_bracket_places_the_event() {
        let b = |before_us: f64, after_us: f64| Bracket {
            before_us,
            after_us,
        };
        // A first record on a fresh context that completes late, then quick ones.
        let samples = [
            b(0.0, 300.0),
            b(310.0, 322.0),
            b(330.0, 338.0),
            b(340.0, 348.0),
        ];
        assert_eq!(Bracket::narrowest(&samples), Some(2));
        assert_eq!(samples[2].middle_us(), 334.0);
        assert_eq!(samples[2].width_us(), 8.0);
        assert_eq!(Bracket::narrowest(&[]), None);
    }
}
