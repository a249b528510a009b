//! `ft-runtime`: the real runtime.

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
