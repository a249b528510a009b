//! Every kernel source compiles with NVRTC for the GPUs we target. Needs libnvrtc (not a
//! GPU): it runs on the GPU machine, or anywhere NVRTC is on LD_LIBRARY_PATH.
#![cfg(feature = "cuda")]

use ft_kernels::cuda_sources::KernelId;

#[test]
#[ignore = "needs NVRTC (libnvrtc on LD_LIBRARY_PATH; present on the GPU machine)"]
fn every_kernel_compiles_for_hopper_and_ada() {
    for cc in [(9, 0), (8, 9)] {
        for k in KernelId::ALL {
            let c = ft_runtime::nvrtc::compile(k, cc).unwrap_or_else(|e| panic!("{e}"));
            assert!(!c.image.is_empty(), "{k}");
            assert!(c.options.contains(&"--fmad=false".to_string()));
            assert!(
                c.is_cubin,
                "{k}: NVRTC gave no cubin for a real architecture"
            );
            if !c.log.trim().is_empty() {
                eprintln!("{k} sm_{}{}: {}", cc.0, cc.1, c.log);
            }
        }
    }
}

#[test]
#[ignore = "needs NVRTC (libnvrtc on LD_LIBRARY_PATH; present on the GPU machine)"]
fn a_compile_error_carries_the_log() {
    // The options are right, the source is not: use the error path through a bad arch.
    let e = ft_runtime::nvrtc::compile(KernelId::Gather, (1, 0)).unwrap_err();
    let s = e.to_string();
    assert!(s.contains("gather") && s.contains("sm_10"), "{s}");
}
