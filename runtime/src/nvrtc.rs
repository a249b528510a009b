//! NVRTC compilation of the kernels in `kernels/cuda/`, at first use, per device.
//!
//! A kernel is compiled for the device's own compute capability
//! (`--gpu-architecture=sm_XY`, read from the device attributes) so it uses that GPU's
//! instructions, and with `--fmad=false` so that no multiply and add is contracted into an
//! fma: the W4A8 GPU path must round exactly as the CPU path does. The options are built by
//! [`compile_options`], which needs no GPU and is tested here. A failed compilation is a
//! [`RuntimeError::Nvrtc`] carrying the kernel's name, the options and NVRTC's log.
//!
//! [`RuntimeError::Nvrtc`]: crate::error::RuntimeError::Nvrtc

use ft_kernels::cuda_sources::{KernelId, Specialization};

/// Environment variable with extra NVRTC options, for diagnostics only (e.g.
/// `--ptxas-options=-v` prints registers and spills into the compile log, which is logged).
pub const EXTRA_OPTIONS_ENV: &str = "FT_NVRTC_EXTRA_OPTIONS";

/// Environment variable capping how many kernel units a warm-up compiles at once
/// (`Device::warm_up_kernels`); unset: one per core; `1`: one at a time, as at first use.
pub const THREADS_ENV: &str = "FT_NVRTC_THREADS";

/// The most compiles at once [`THREADS_ENV`] asks for: `None` where unset or empty (one per
/// core), an error naming the variable for anything but a positive count.
pub fn compile_threads(value: Option<&str>) -> crate::error::Result<Option<usize>> {
    match value.map(str::trim).filter(|v| !v.is_empty()) {
        None => Ok(None),
        Some(v) => match v.parse::<usize>() {
            Ok(n) if n > 0 => Ok(Some(n)),
            _ => Err(crate::error::RuntimeError::invalid(
                THREADS_ENV,
                format!(
                    "'{v}' is not a number of compiles at once; use 1 or more, or leave it unset"
                ),
            )),
        },
    }
}

/// C++ dialect of the kernel sources.
pub const CXX_STD: &str = "--std=c++17";

/// The NVRTC options for `kernel` on a device of compute capability `(major, minor)`.
///
/// - `--gpu-architecture=sm_XY`: real architecture, so NVRTC emits machine code (cubin)
///   for this GPU and no PTX has to be JIT-compiled by the driver;
/// - `--fmad=false`: no fma contraction (bit-identical W4A8 with the CPU path);
/// - `--std=c++17`, `-default-device` (functions without qualifiers are device code),
///   `-lineinfo` (source lines in profiles), `-DFT_KERNEL_<NAME>` (which unit is compiled);
/// - the specialization's constants (`-DFT_FMT=..`, `-DFT_ACT=..` for the expert kernels).
pub fn compile_options(
    kernel: KernelId,
    compute_capability: (u32, u32),
    spec: Specialization,
) -> Vec<String> {
    let (major, minor) = compute_capability;
    let mut o = vec![
        format!("--gpu-architecture=sm_{major}{minor}"),
        "--fmad=false".to_string(),
        CXX_STD.to_string(),
        "-default-device".to_string(),
        "-lineinfo".to_string(),
        format!("-DFT_KERNEL_{}", kernel.name().to_ascii_uppercase()),
    ];
    o.extend(spec.defines());
    o
}

/// A compiled kernel unit: machine code (cubin) when NVRTC produced it, else PTX.
#[derive(Debug, Clone)]
pub struct CompiledKernel {
    /// Which unit.
    pub kernel: KernelId,
    /// The options it was compiled with.
    pub options: Vec<String>,
    /// The image (`cubin` bytes, or NUL-terminated PTX text).
    pub image: Vec<u8>,
    /// True when `image` is a cubin.
    pub is_cubin: bool,
    /// NVRTC's log (warnings), possibly empty.
    pub log: String,
    /// Compile time, milliseconds.
    pub compile_ms: f64,
}

/// Compile `kernel`, specialized by `spec`, for a device of compute capability `cc` with
/// NVRTC.
#[cfg(feature = "cuda")]
pub fn compile(
    kernel: KernelId,
    cc: (u32, u32),
    spec: Specialization,
) -> crate::error::Result<CompiledKernel> {
    use crate::error::RuntimeError;
    use cudarc::nvrtc::{result, sys};
    use std::ffi::{CStr, CString};

    // SAFETY: only probes whether the shared library can be loaded.
    if !unsafe { sys::is_culib_present() } {
        return Err(RuntimeError::CudaUnavailable {
            reason: "libnvrtc could not be loaded (install the CUDA toolkit's NVRTC or add its \
                     directory to LD_LIBRARY_PATH)"
                .into(),
        });
    }
    let mut options = compile_options(kernel, cc, spec);
    if let Ok(extra) = std::env::var(EXTRA_OPTIONS_ENV) {
        options.extend(extra.split_whitespace().map(str::to_string));
    }
    let nvrtc_err = |log: String| RuntimeError::Nvrtc {
        kernel: kernel.name().to_string(),
        options: options.clone(),
        log,
    };
    let start = std::time::Instant::now();
    let src = CString::new(kernel.full_source())
        .map_err(|_| nvrtc_err("the source contains a NUL byte".into()))?;
    let name = CString::new(format!("{}.cu", kernel.name()))
        .map_err(|_| nvrtc_err("the name contains a NUL byte".into()))?;
    let prog = result::create_program(&src, Some(&name))
        .map_err(|e| nvrtc_err(format!("nvrtcCreateProgram failed: {e:?}")))?;
    struct Guard(sys::nvrtcProgram);
    impl Drop for Guard {
        fn drop(&mut self) {
            // SAFETY: created by nvrtcCreateProgram above, destroyed once.
            let _ = unsafe { result::destroy_program(self.0) };
        }
    }
    let guard = Guard(prog);
    // SAFETY: `prog` is a live program; the options are plain strings.
    let compiled = unsafe { result::compile_program(guard.0, &options) };
    // SAFETY: as above.
    let log = unsafe { result::get_program_log(guard.0) }
        .map(|raw| {
            // SAFETY: NVRTC returns a NUL-terminated log.
            unsafe { CStr::from_ptr(raw.as_ptr()) }
                .to_string_lossy()
                .into_owned()
        })
        .unwrap_or_default();
    if let Err(e) = compiled {
        return Err(nvrtc_err(format!("{e:?}\n{log}")));
    }
    // Prefer the cubin (real architecture); fall back to PTX.
    let mut size = 0usize;
    // SAFETY: size query on a compiled program.
    let cubin_ok = unsafe { sys::nvrtcGetCUBINSize(guard.0, &mut size) }
        == sys::nvrtcResult::NVRTC_SUCCESS
        && size > 0;
    let (image, is_cubin) = if cubin_ok {
        let mut buf = vec![0u8; size];
        // SAFETY: `buf` holds `size` bytes as NVRTC asked.
        let r = unsafe { sys::nvrtcGetCUBIN(guard.0, buf.as_mut_ptr() as *mut _) };
        if r != sys::nvrtcResult::NVRTC_SUCCESS {
            return Err(nvrtc_err(format!("nvrtcGetCUBIN failed: {r:?}")));
        }
        (buf, true)
    } else {
        // SAFETY: a compiled program.
        let ptx = unsafe { result::get_ptx(guard.0) }
            .map_err(|e| nvrtc_err(format!("nvrtcGetPTX failed: {e:?}")))?;
        (ptx.into_iter().map(|c| c as u8).collect(), false)
    };
    let compile_ms = start.elapsed().as_secs_f64() * 1e3;
    tracing::info!(
        kernel = kernel.name(),
        cubin = is_cubin,
        compile_ms,
        log = log.trim(),
        "compiled CUDA kernel"
    );
    Ok(CompiledKernel {
        kernel,
        options,
        image,
        is_cubin,
        log,
        compile_ms,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn compile_threads_are_a_positive_count_or_unset() {
        assert_eq!(compile_threads(None).unwrap(), None);
        assert_eq!(compile_threads(Some(" ")).unwrap(), None);
        assert_eq!(compile_threads(Some("1")).unwrap(), Some(1));
        assert_eq!(compile_threads(Some(" 8 ")).unwrap(), Some(8));
        for bad in ["0", "-2", "all"] {
            let e = compile_threads(Some(bad)).unwrap_err().to_string();
            assert!(e.contains(THREADS_ENV) && e.contains(bad), "{e}");
        }
    }

    #[test]
    fn options_target_the_device_and_forbid_fma() {
        let o = compile_options(KernelId::Experts, (9, 0), Specialization::experts(3, 1));
        assert!(o.contains(&"--gpu-architecture=sm_90".to_string()), "{o:?}");
        assert!(o.contains(&"-DFT_FMT=3".to_string()), "{o:?}");
        assert!(o.contains(&"--fmad=false".to_string()), "{o:?}");
        assert!(o.contains(&"-DFT_KERNEL_EXPERTS".to_string()), "{o:?}");
        let o = compile_options(KernelId::Gather, (8, 9), Specialization::NONE);
        assert!(!o.iter().any(|s| s.starts_with("-DFT_FMT")), "{o:?}");
        assert!(o.contains(&"--gpu-architecture=sm_89".to_string()), "{o:?}");
        assert!(!o
            .iter()
            .any(|s| s.contains("fast-math") || s.contains("fast_math")));
    }

    #[test]
    fn compile_error_message_keeps_name_options_and_log() {
        let e = crate::error::RuntimeError::Nvrtc {
            kernel: "experts".into(),
            options: compile_options(KernelId::Experts, (9, 0), Specialization::NONE),
            log: "experts.cu(3): error: identifier \"x\" is undefined".into(),
        };
        let s = e.to_string();
        assert!(
            s.contains("experts") && s.contains("sm_90") && s.contains("undefined"),
            "{s}"
        );
    }
}
