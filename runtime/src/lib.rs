//! `ft-runtime`: the real runtime.
//!
//! Devices (CUDA through cudarc behind feature `cuda`, and a host-emulated device), the
//! page-locked host banks holding every expert, the GPU expert cache's slot memory, miss
//! gathers, the GPU expert and dense kernels, and the decode engine built on them. See
//! `docs/runtime-device.md` for the device API.

pub mod bank;
pub mod bench_bw;
pub mod block_stamps;
pub mod cpu_check;
pub mod cpu_pool;
pub mod dense;
pub mod device;
pub mod engine;
pub mod error;
pub mod gather;
pub mod gpu_experts;
pub mod instrument;
pub mod machine;
pub mod numerics;
pub mod nvrtc;
pub mod probe;
pub mod profile_select;
pub mod run;
pub mod slots;

pub use device::{Device, DeviceBuffer, DeviceKind, DeviceSpec, Event, HostBuffer, Stream};
pub use error::{Result, RuntimeError};

/// True when this build has CUDA and a driver with at least one device is usable here.
pub fn cuda_available() -> bool {
    #[cfg(feature = "cuda")]
    {
        device::cuda::unavailable_reason().is_none()
    }
    #[cfg(not(feature = "cuda"))]
    {
        false
    }
}

/// Whether a CUDA driver can be used here, in words (for `ft --version`).
pub fn cuda_driver_status() -> String {
    #[cfg(feature = "cuda")]
    {
        // SAFETY: only probes whether the shared library can be loaded.
        if !unsafe { cudarc::driver::sys::is_culib_present() } {
            return "not found (libcuda could not be loaded)".to_string();
        }
        match cudarc::driver::result::init() {
            Ok(()) => match cudarc::driver::result::device::get_count() {
                Ok(n) => format!("found ({n} device(s))"),
                Err(e) => format!("found, but no device: {e}"),
            },
            Err(e) => format!("found, but it failed to initialise: {e}"),
        }
    }
    #[cfg(not(feature = "cuda"))]
    {
        "not compiled in (build with --features cuda)".to_string()
    }
}
