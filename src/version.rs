//! `ft --version`: what was built and what this machine offers.

use anyhow::Result;

/// Print the version, git revision, SIMD level compiled in and detected, and CUDA status.
pub fn print() -> Result<()> {
    outln!("ft {}", env!("CARGO_PKG_VERSION"))?;
    outln!("git revision: {}", env!("FT_GIT_REV"))?;
    outln!(
        "simd compiled in: {}",
        ft_kernels::simd::SimdLevel::compiled()
    )?;
    outln!(
        "simd detected at run time: {}",
        ft_kernels::simd::SimdLevel::detect()
    )?;
    outln!(
        "cuda feature: {}",
        if cfg!(feature = "cuda") { "on" } else { "off" }
    )?;
    outln!("cuda driver: {}", ft_runtime::cuda_driver_status())?;
    Ok(())
}
