//! `ft --version`: what was built and what this machine offers.

use anyhow::Result;

/// Print the version, git revision, SIMD level compiled in and detected, and CUDA status.
pub fn print() -> Result<()> {
    println!("ft {}", env!("CARGO_PKG_VERSION"));
    println!("git revision: {}", env!("FT_GIT_REV"));
    println!(
        "simd compiled in: {}",
        ft_kernels::simd::SimdLevel::compiled()
    );
    println!(
        "simd detected at run time: {}",
        ft_kernels::simd::SimdLevel::detect()
    );
    println!(
        "cuda feature: {}",
        if cfg!(feature = "cuda") { "on" } else { "off" }
    );
    println!("cuda driver: {}", ft_runtime::cuda_driver_status());
    Ok(())
}
