//! The device API on every backend available: the same test bodies run on the
//! host-emulated device always, and on CUDA (GPU machine) through the `cuda_*` twins.

use ft_runtime::device::{Device, HostDeviceConfig};
use ft_runtime::gather::CopyRegion;
use ft_runtime::RuntimeError;

fn host() -> Device {
    Device::host(HostDeviceConfig {
        memory_bytes: 256 << 20,
        ..Default::default()
    })
    .unwrap()
}

fn pattern(n: usize, salt: u8) -> Vec<u8> {
    (0..n)
        .map(|i| (i as u8).wrapping_mul(31).wrapping_add(salt))
        .collect()
}

/// Copies in both directions, regions, memset, d2d, upload/download.
fn copies_round_trip(d: &Device) {
    let s = d.new_stream("copy").unwrap();
    let n = 1 << 20;
    let mut h = d.alloc_host(n, "src").unwrap();
    h.as_mut_slice().copy_from_slice(&pattern(n, 3));
    let dev = d.alloc(n, "dst").unwrap();
    s.copy_h2d(&h, 0, &dev, 0, n).unwrap();
    let back = d.alloc_host(n, "back").unwrap();
    s.copy_d2h(&dev, 0, &back, 0, n).unwrap();
    s.synchronize().unwrap();
    assert_eq!(back.as_slice(), h.as_slice());

    // Scattered regions (the gather's shape), both mechanisms, and the copy engines with one
    // copy each or one batched submission (`CopySubmit`); the host device copies the same
    // either way.
    let regions = [
        CopyRegion {
            src_offset: 4096,
            dst_offset: 0,
            bytes: 1000,
        },
        CopyRegion {
            src_offset: 0,
            dst_offset: 8192,
            bytes: 4096,
        },
        CopyRegion {
            src_offset: 300_000,
            dst_offset: 20_000,
            bytes: 70_001,
        },
    ];
    use ft_runtime::device::{CopySubmit, CudaTuning};
    let ways = [
        (false, CopySubmit::Each),
        (true, CopySubmit::Each),
        (false, CopySubmit::Batch),
    ];
    // The host device copies the same every way; a CUDA device submits each way.
    let opened = d.cuda_tuning();
    for (zero_copy, copies) in ways {
        let dst = d.alloc(1 << 17, "gather").unwrap();
        if let Some(t) = opened {
            d.set_cuda_tuning(CudaTuning { copies, ..t }).unwrap();
        }
        if zero_copy {
            s.gather_zero_copy(&h, &dst, &regions).unwrap();
        } else {
            s.copy_h2d_regions(&h, &dst, &regions).unwrap();
        }
        let mut got = vec![0u8; 1 << 17];
        s.download(&dst, 0, &mut got).unwrap();
        for r in &regions {
            let (so, dof, b) = (
                r.src_offset as usize,
                r.dst_offset as usize,
                r.bytes as usize,
            );
            assert_eq!(
                &got[dof..dof + b],
                &h.as_slice()[so..so + b],
                "zero_copy={zero_copy} copies={copies:?}"
            );
        }
        assert!(got[1000..8192].iter().all(|&b| b == 0));
    }
    if let Some(t) = opened {
        d.set_cuda_tuning(t).unwrap();
    }

    // upload / download / memset / d2d / add_f32
    let v: Vec<f32> = (0..1000).map(|i| i as f32 * 0.5).collect();
    let a = d.alloc(4000, "a").unwrap();
    let b = d.alloc(8000, "b").unwrap();
    s.upload_f32(&v, &a, 0).unwrap();
    s.copy_d2d(&a, 0, &b, 4000, 4000).unwrap();
    s.add_f32(&b, 4000, &a, 0, 1000).unwrap();
    s.memset_zero(&b, 4000, 400).unwrap();
    let got = s.download_f32(&b, 4000, 1000).unwrap();
    for i in 0..1000 {
        let want = if i < 100 { 0.0 } else { 2.0 * v[i] };
        assert_eq!(got[i], want, "{i}");
    }
}

/// A long copy on one stream, an event, and a dependent op on another stream.
fn events_order_streams(d: &Device) {
    let copy = d.new_stream("copy").unwrap();
    let compute = d.new_stream("compute").unwrap();
    let n = 32 << 20;
    let mut h = d.alloc_host(n, "src").unwrap();
    h.as_mut_slice().fill(7);
    let dst = d.alloc(n, "dst").unwrap();
    let out = d.alloc(n, "out").unwrap();
    let (e0, e1) = (d.new_event(true).unwrap(), d.new_event(true).unwrap());
    copy.record(&e0).unwrap();
    copy.copy_h2d(&h, 0, &dst, 0, n).unwrap();
    copy.record(&e1).unwrap();
    compute.wait(&e1).unwrap();
    compute.copy_d2d(&dst, 0, &out, 0, n).unwrap();
    let mut tail = vec![0u8; 16];
    compute.download(&out, n - 16, &mut tail).unwrap();
    assert_eq!(
        tail,
        vec![7u8; 16],
        "the dependent copy ran before the gather finished"
    );
    e1.synchronize().unwrap();
    assert!(e1.is_complete().unwrap());
    let us = e0.elapsed_us(&e1).unwrap();
    assert!(us > 0.0, "{us}");
    let t1 = e1.timeline_us().unwrap();
    assert!(t1 > 0.0 && t1 <= d.clock().now_us() + 50.0, "{t1}");
    // An event without timing refuses timestamps.
    let nt = d.new_event(false).unwrap();
    copy.record(&nt).unwrap();
    nt.synchronize().unwrap();
    assert!(nt.timeline_us().is_err());
}

/// An event recorded on an idle stream lands, on the host's clock, inside the host's bracket
/// around its record and completion: the device and host spans of a trace share one time
/// axis. Each record's distance outside its bracket (0 inside) is the mapping's error plus
/// that record's noise; the median over many records is the error (25 to 155 us on an H100
/// with an origin placed from one bracket instead of the narrowest of several).
fn events_land_on_the_hosts_clock(d: &Device) {
    let s = d.new_stream("s").unwrap();
    let clock = d.clock();
    let mut outside: Vec<f64> = (0..31)
        .map(|_| {
            let e = d.new_event(true).unwrap();
            let before = clock.now_us();
            s.record(&e).unwrap();
            e.synchronize().unwrap();
            let after = clock.now_us();
            let t = e.timeline_us().unwrap();
            (before - t).max(t - after).max(0.0)
        })
        .collect();
    outside.sort_by(f64::total_cmp);
    let median = outside[outside.len() / 2];
    assert!(
        median < 10.0,
        "events land {median:.1} us outside the host's brackets (all: {outside:?})"
    );
}

/// A hold keeps the stream busy at least that long, and work queued behind it waits.
fn holds_keep_the_stream_busy(d: &Device) {
    let s = d.new_stream("s").unwrap();
    let (e0, e1) = (d.new_event(true).unwrap(), d.new_event(true).unwrap());
    s.record(&e0).unwrap();
    s.hold_us(3000.0).unwrap();
    s.record(&e1).unwrap();
    e1.synchronize().unwrap();
    let us = e0.elapsed_us(&e1).unwrap();
    assert!((3000.0..1_000_000.0).contains(&us), "held {us} us for 3000");
}

/// Bad arguments are clear errors naming the input.
fn bad_arguments_are_errors(d: &Device) {
    let s = d.new_stream("s").unwrap();
    let h = d.alloc_host(100, "h").unwrap();
    let b = d.alloc(100, "b").unwrap();
    let e = s.copy_h2d(&h, 50, &b, 0, 60).unwrap_err();
    assert!(
        matches!(e, RuntimeError::Invalid { .. }) && e.to_string().contains("copy_h2d source"),
        "{e}"
    );
    let e = s.upload(&[0u8; 8], &b, 96).unwrap_err().to_string();
    assert!(e.contains("upload destination"), "{e}");
    let other = host();
    let ob = other.alloc(100, "ob").unwrap();
    let e = s.copy_d2d(&ob, 0, &b, 0, 10).unwrap_err();
    assert!(matches!(e, RuntimeError::DeviceMismatch { .. }), "{e}");
    let e = d.alloc(usize::MAX / 2, "huge").unwrap_err();
    assert!(matches!(e, RuntimeError::OutOfMemory { .. }), "{e}");
}

/// The one-launch fixed-order combine equals the add_f32 launches it replaces, bit for bit
/// (random values of mixed magnitude, so that the order of the additions shows).
fn combine_fixed_equals_its_adds(d: &Device) {
    use ft_runtime::device::fixed_tree_rounds;
    let s = d.new_stream("combine").unwrap();
    let block = 3 * 96;
    let mut seed = 0x2545_f491_4f6c_dd1du64;
    let mut rand = |n: usize| -> Vec<f32> {
        (0..n)
            .map(|_| {
                seed ^= seed << 13;
                seed ^= seed >> 7;
                seed ^= seed << 17;
                let m = (seed >> 40) as f32 / (1u64 << 24) as f32 - 0.5;
                m * 10f32.powi((seed % 7) as i32 - 3)
            })
            .collect()
    };
    for k in [1usize, 2, 3, 8, 10, 16] {
        for n_more in [0usize, 1, 4] {
            let act0 = rand(block);
            let parts = rand(k * block);
            let more: Vec<Vec<f32>> = (0..n_more).map(|_| rand(k * block)).collect();
            let buf = |v: &[f32], what: &str| {
                let b = d.alloc(v.len() * 4, what).unwrap();
                s.upload_f32(v, &b, 0).unwrap();
                b
            };
            // The adds: more onto parts, the tree rounds, the residual add.
            let (act_a, parts_a) = (buf(&act0, "a"), buf(&parts, "p"));
            for m in &more {
                s.add_f32(&parts_a, 0, &buf(m, "m"), 0, k * block).unwrap();
            }
            for (dst, src, n) in fixed_tree_rounds(k) {
                s.add_f32(
                    &parts_a,
                    dst * block * 4,
                    &parts_a,
                    src * block * 4,
                    n * block,
                )
                .unwrap();
            }
            s.add_f32(&act_a, 0, &parts_a, 0, block).unwrap();
            // The one launch.
            let (act_b, parts_b) = (buf(&act0, "a"), buf(&parts, "p"));
            let more_b: Vec<_> = more.iter().map(|m| buf(m, "m")).collect();
            let more_refs: Vec<_> = more_b.iter().collect();
            s.combine_fixed(&act_b, &parts_b, &more_refs, block, k)
                .unwrap();
            let a = s.download_f32(&act_a, 0, block).unwrap();
            let b = s.download_f32(&act_b, 0, block).unwrap();
            assert!(
                a.iter().zip(&b).all(|(x, y)| x.to_bits() == y.to_bits()),
                "k {k}, {n_more} added buffers"
            );
            assert_ne!(a, act0, "the residual changed");
        }
    }
    let a = d.alloc(64, "a").unwrap();
    let e = s.combine_fixed(&a, &a, &[], 16, 0).unwrap_err().to_string();
    assert!(e.contains("combine_fixed blocks"), "{e}");
    let e = s
        .combine_fixed(&a, &a, &[&a; 5], 16, 1)
        .unwrap_err()
        .to_string();
    assert!(e.contains("at most 4"), "{e}");
    let e = s.combine_fixed(&a, &a, &[], 16, 2).unwrap_err().to_string();
    assert!(e.contains("combine_fixed parts"), "{e}");
}

#[test]
fn host_combine_fixed_equals_its_adds() {
    combine_fixed_equals_its_adds(&host());
}

#[test]
fn host_copies_round_trip() {
    copies_round_trip(&host());
}

#[test]
fn host_events_order_streams() {
    events_order_streams(&host());
}

#[test]
fn host_events_land_on_the_hosts_clock() {
    events_land_on_the_hosts_clock(&host());
}

#[test]
fn host_holds_keep_the_stream_busy() {
    holds_keep_the_stream_busy(&host());
}

#[test]
fn host_bad_arguments_are_errors() {
    bad_arguments_are_errors(&host());
}

#[test]
fn host_link_emulation_throttles_copies() {
    let d = Device::host(HostDeviceConfig {
        memory_bytes: 64 << 20,
        link_gbps: Some(1.0),
        ..Default::default()
    })
    .unwrap();
    let s = d.new_stream("copy").unwrap();
    let h = d.alloc_host(8 << 20, "h").unwrap();
    let b = d.alloc(8 << 20, "b").unwrap();
    let t = std::time::Instant::now();
    s.copy_h2d(&h, 0, &b, 0, 8 << 20).unwrap();
    s.synchronize().unwrap();
    // 8 MiB at 1 GB/s is 8.4 ms.
    assert!(t.elapsed().as_secs_f64() >= 8.0e-3, "{:?}", t.elapsed());
}

#[test]
fn host_capacity_is_enforced_and_given_back() {
    let d = Device::host(HostDeviceConfig {
        memory_bytes: 1 << 20,
        ..Default::default()
    })
    .unwrap();
    let a = d.alloc(600 << 10, "a").unwrap();
    let e = d.alloc(600 << 10, "b").unwrap_err().to_string();
    assert!(e.contains("b") && e.contains("available"), "{e}");
    drop(a);
    assert_eq!(d.free_mem_bytes().unwrap(), 1 << 20);
    d.alloc(600 << 10, "c").unwrap();
}

/// The host device has no CUDA paths to choose: none reported, and setting them is an error.
#[test]
fn host_device_runs_no_cuda_paths() {
    let d = host();
    assert_eq!(d.cuda_tuning(), None);
    assert_eq!(d.info().cuda_tuning, None);
    assert!(d.info().label().ends_with("(host)"), "{}", d.info().label());
    let e = d
        .set_cuda_tuning(ft_runtime::device::CudaTuning::default())
        .unwrap_err();
    assert!(e.to_string().contains("CUDA tuning"), "{e}");
}

/// Without a GPU (this is CI's case), asking for CUDA is a clear error, never a panic.
#[test]
fn cuda_where_absent_is_a_clear_error() {
    if ft_runtime::cuda_available() {
        return; // a GPU machine: the cuda_* tests cover it
    }
    let e = Device::cuda(0).unwrap_err();
    match &e {
        RuntimeError::CudaUnavailable { reason } => assert!(!reason.is_empty()),
        other => panic!("expected CudaUnavailable, got {other}"),
    }
    let e = Device::open_kind("cuda".parse().unwrap()).unwrap_err();
    assert!(e.to_string().contains("CUDA device unavailable"), "{e}");
}

#[cfg(feature = "cuda")]
mod cuda {
    use super::*;

    fn gpu() -> Device {
        Device::cuda(0).expect("a CUDA device")
    }

    #[test]
    #[ignore = "needs an NVIDIA GPU (run on the GPU machine)"]
    fn cuda_combine_fixed_equals_its_adds() {
        combine_fixed_equals_its_adds(&gpu());
    }

    #[test]
    #[ignore = "needs an NVIDIA GPU (run on the GPU machine)"]
    fn cuda_copies_round_trip() {
        copies_round_trip(&gpu());
    }

    #[test]
    #[ignore = "needs an NVIDIA GPU (run on the GPU machine)"]
    fn cuda_events_order_streams() {
        events_order_streams(&gpu());
    }

    #[test]
    #[ignore = "needs an NVIDIA GPU (run on the GPU machine)"]
    fn cuda_events_land_on_the_hosts_clock() {
        events_land_on_the_hosts_clock(&gpu());
    }

    #[test]
    #[ignore = "needs an NVIDIA GPU (run on the GPU machine)"]
    fn cuda_holds_keep_the_stream_busy() {
        holds_keep_the_stream_busy(&gpu());
    }

    #[test]
    #[ignore = "needs an NVIDIA GPU (run on the GPU machine)"]
    fn cuda_bad_arguments_are_errors() {
        bad_arguments_are_errors(&gpu());
    }

    /// A device opens with the paths the environment asks for, reports them, and runs
    /// others once set.
    #[test]
    #[ignore = "needs an NVIDIA GPU (run on the GPU machine)"]
    fn cuda_tuning_is_read_at_open_and_reported() {
        use ft_runtime::device::{CopySubmit, CudaTuning};
        let d = gpu();
        let opened = CudaTuning::from_env().unwrap();
        assert_eq!(d.cuda_tuning(), Some(opened));
        assert_eq!(d.info().cuda_tuning, Some(opened));
        let other = CudaTuning {
            copies: CopySubmit::Each,
            block_stamps: !opened.block_stamps,
            ..opened
        };
        d.set_cuda_tuning(other).unwrap();
        assert_eq!(d.info().cuda_tuning, Some(other));
    }

    #[test]
    #[ignore = "needs an NVIDIA GPU (run on the GPU machine)"]
    fn cuda_out_of_range_ordinal_is_an_error() {
        let e = Device::cuda(999).unwrap_err();
        assert!(matches!(e, RuntimeError::CudaUnavailable { .. }), "{e}");
    }
}
