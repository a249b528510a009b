//! The event engine against the naive tick-by-tick reference, on random single layers.

use ft_sim::layer::{CpuShare, LayerCosts, LayerRunner, Resources, TAG_GATHER, TAG_RESULT};
use ft_sim::reference::{reference_layer, ReferenceParams};
use ft_sim::resources::{
    CpuPool, CpuPoolParams, Dram, DramParams, GpuStream, Link, LinkParams, TransferJob,
};
use rand::{Rng, SeedableRng};

fn resources(p: &ReferenceParams) -> Resources {
    Resources {
        gpu: GpuStream::new(),
        h2d: Link::new(LinkParams {
            isolated_gbs: p.dram.dma_isolated_gbs,
            max_in_flight: p.in_flight,
        }),
        d2h: Link::new(LinkParams {
            isolated_gbs: p.d2h_gbs,
            max_in_flight: 1,
        }),
        dram: Dram::new(p.dram),
        cpu: CpuPool::new(CpuPoolParams {
            threads: 8,
            wake_ns: p.wake_ns,
            spin_window_ns: 0.0,
        }),
    }
}

fn random_case(rng: &mut impl Rng) -> (LayerCosts, ReferenceParams) {
    let dma = rng.random_range(5.0..50.0);
    let cpu_iso = rng.random_range(5.0..80.0);
    let p = ReferenceParams {
        dram: DramParams {
            dma_isolated_gbs: dma,
            dma_contended_gbs: dma * rng.random_range(0.3..1.0),
            cpu_isolated_gbs: cpu_iso,
            cpu_contended_gbs: cpu_iso * rng.random_range(0.3..1.0),
        },
        d2h_gbs: rng.random_range(5.0..50.0),
        in_flight: rng.random_range(1..4),
        wake_ns: rng.random_range(0.0..20_000.0),
    };
    let gather = rng.random_bool(0.8).then(|| TransferJob {
        tag: TAG_GATHER,
        count: rng.random_range(1..8),
        bytes_each: rng.random_range(1e4..5e5),
        setup_ns: rng.random_range(0.0..10_000.0),
        per_transfer_ns: rng.random_range(0.0..10_000.0),
    });
    let cpu = rng.random_bool(0.7).then(|| CpuShare {
        d2h: TransferJob {
            tag: 0,
            count: 1,
            bytes_each: rng.random_range(1e3..1e5),
            setup_ns: rng.random_range(0.0..5_000.0),
            per_transfer_ns: 0.0,
        },
        sync_ns: rng.random_range(0.0..20_000.0),
        fixed_ns: rng.random_range(0.0..30_000.0),
        bytes: rng.random_range(1e4..2e6),
        result: TransferJob {
            tag: TAG_RESULT,
            count: 1,
            bytes_each: rng.random_range(1e3..1e5),
            setup_ns: rng.random_range(0.0..5_000.0),
            per_transfer_ns: 0.0,
        },
        sum_ns: rng.random_range(0.0..5_000.0),
    });
    let c = LayerCosts {
        dense_ns: rng.random_range(1_000.0..50_000.0),
        launch_ns: rng.random_range(0.0..5_000.0),
        hit_kernel_ns: rng.random_range(1_000.0..80_000.0),
        has_hits: rng.random_bool(0.8),
        fetched_early_ns: rng.random_range(0.0..40_000.0),
        fetched_early_launches: if gather.is_some() {
            rng.random_range(0..4)
        } else {
            0
        },
        fetched_kernel_ns: rng.random_range(1_000.0..30_000.0),
        fetched_gated: rng.random_bool(0.5),
        overhead_ns: rng.random_range(0.0..3_000.0),
        gather,
        cpu,
    };
    (c, p)
}

#[test]
fn single_layers_match_the_tick_reference() {
    let mut rng = rand::rngs::StdRng::seed_from_u64(2024);
    let mut contended_cases = 0;
    for case in 0..60 {
        let (c, p) = random_case(&mut rng);
        let expected = reference_layer(&c, &p);
        let (ends, events) = LayerRunner::new(resources(&p), vec![c]).run(0);
        assert_eq!(ends.len(), 1);
        let got = ends[0];
        // Each event time is rounded up to a ns; the reference ends on a whole tick.
        let tol = 8;
        assert!(
            got.abs_diff(expected) <= tol,
            "case {case}: engine {got} ns, reference {expected} ns ({events} events)\n{c:#?}\n{p:#?}"
        );
        if c.gather.is_some()
            && c.cpu.is_some()
            && p.dram.dma_contended_gbs < p.dram.dma_isolated_gbs
        {
            contended_cases += 1;
        }
    }
    assert!(
        contended_cases >= 10,
        "the random cases must exercise contention"
    );
}

/// With no contention and no CPU share, a layer is the closed form
/// dense + max(hits, gather) + fetched, with launches.
#[test]
fn offload_layer_is_the_closed_form() {
    let p = ReferenceParams {
        dram: DramParams {
            dma_isolated_gbs: 24.0,
            dma_contended_gbs: 24.0,
            cpu_isolated_gbs: 60.0,
            cpu_contended_gbs: 60.0,
        },
        d2h_gbs: 26.0,
        in_flight: 1,
        wake_ns: 0.0,
    };
    let c = LayerCosts {
        dense_ns: 50_000.0,
        launch_ns: 4_000.0,
        hit_kernel_ns: 20_000.0,
        has_hits: true,
        // Four experts gather in chunks of 3 and 1 (`fetch_chunk_bounds`).
        fetched_early_ns: 15_000.0,
        fetched_early_launches: 1,
        fetched_kernel_ns: 10_000.0,
        fetched_gated: false,
        overhead_ns: 0.0,
        gather: Some(TransferJob {
            tag: TAG_GATHER,
            count: 4,
            bytes_each: 2.4e6,
            setup_ns: 9_000.0,
            per_transfer_ns: 100.0,
        }),
        cpu: None,
    };
    let (ends, _) = LayerRunner::new(resources(&p), vec![c, c]).run(0);
    let gather = 9_000 + 4 * (100 + 100_000);
    // The fetched kernel waits for the gather (the hits ended long before): its launch shows.
    let one = 50_000 + gather + 4_000 + 10_000;
    assert_eq!(ends, vec![one, 2 * one]);
    assert_eq!(reference_layer(&c, &p), one);
    // Gated (the single-GPU runtime's default), its launch is paid beside the gather.
    let gated = LayerCosts {
        fetched_gated: true,
        ..c
    };
    let (ends, _) = LayerRunner::new(resources(&p), vec![gated]).run(0);
    let one = 50_000 + gather + 10_000;
    assert_eq!(ends, vec![one]);
    assert_eq!(reference_layer(&gated, &p), one);
}
