//! Every kernel source compiles with NVRTC for the GPUs we target. Needs libnvrtc (not a
//! GPU): it runs on the GPU machine, or anywhere NVRTC is on LD_LIBRARY_PATH.
#![cfg(feature = "cuda")]

use ft_kernels::cuda_sources::{KernelId, Specialization};

#[test]
#[ignore = "needs NVRTC (libnvrtc on LD_LIBRARY_PATH; present on the GPU machine)"]
fn every_kernel_compiles_for_hopper_and_ada() {
    for cc in [(9, 0), (8, 9)] {
        // Every unit as the runtime builds it: the expert kernels once per format and
        // activation path, the others unspecialized; and the expert source unspecialized too.
        let mut units: Vec<(KernelId, Specialization)> = KernelId::ALL
            .iter()
            .map(|&k| (k, Specialization::NONE))
            .collect();
        for f in 0..5 {
            for a in 0..2 {
                units.push((KernelId::Experts, Specialization::experts(f, a)));
            }
        }
        for (k, spec) in units {
            let c = ft_runtime::nvrtc::compile(k, cc, spec).unwrap_or_else(|e| panic!("{e}"));
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
    let e = ft_runtime::nvrtc::compile(KernelId::Gather, (1, 0), Specialization::NONE).unwrap_err();
    let s = e.to_string();
    assert!(s.contains("gather") && s.contains("sm_10"), "{s}");
}

#[test]
#[ignore = "needs NVRTC (libnvrtc on LD_LIBRARY_PATH; present on the GPU machine)"]
fn compiles_on_several_threads_give_the_serial_images() {
    // The expert kernels of every format and activation path at once, one thread each (as
    // `Device::warm_up_kernels` compiles what it lacks), against the same compiled one by
    // one: NVRTC must be safe to call from several threads, and give the same cubins.
    let cc = (9, 0);
    let specs: Vec<Specialization> = (0..5)
        .flat_map(|f| (0..2).map(move |a| Specialization::experts(f, a)))
        .collect();
    let t0 = std::time::Instant::now();
    let serial: Vec<Vec<u8>> = specs
        .iter()
        .map(|&s| {
            ft_runtime::nvrtc::compile(KernelId::Experts, cc, s)
                .unwrap_or_else(|e| panic!("{e}"))
                .image
        })
        .collect();
    let serial_s = t0.elapsed().as_secs_f64();
    let t0 = std::time::Instant::now();
    let parallel: Vec<Vec<u8>> = std::thread::scope(|scope| {
        let handles: Vec<_> = specs
            .iter()
            .map(|&s| scope.spawn(move || ft_runtime::nvrtc::compile(KernelId::Experts, cc, s)))
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().unwrap().unwrap_or_else(|e| panic!("{e}")).image)
            .collect()
    });
    let parallel_s = t0.elapsed().as_secs_f64();
    eprintln!(
        "{} expert modules: {serial_s:.1} s one by one, {parallel_s:.1} s on {} threads",
        specs.len(),
        specs.len()
    );
    assert_eq!(serial, parallel, "the same cubins from every thread");
}
