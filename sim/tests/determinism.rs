//! Runs are deterministic for a seed; replaying a recorded plan times exactly as planning
//! live; jitter is seeded; context growth and concurrency act in the expected direction.

use std::sync::Arc;

use ft_model::strategy::{FetchFraction, Strategy};
use ft_sim::costs::CostModel;
use ft_sim::decode::{RecordedRouting, Workload};
use ft_sim::run::{
    plan_trace, plan_trace_recorded, routing_source, simulate, simulate_replay, SimConfig,
};

fn setup() -> (CostModel, ft_model::ModelSpec) {
    let h = ft_sim::hosts::preset("rtxpro4000-gen3-epyc7302").unwrap();
    let m = ft_model::ModelSpec::preset("qwen3.6-35b-a3b").unwrap();
    (CostModel::from_host(&h, &m).unwrap(), m)
}

fn cfg(seed: u64, jitter: f64) -> SimConfig {
    SimConfig {
        streams: 2,
        strategy: Strategy::Hybrid {
            fetch: FetchFraction::Fixed(0.5),
        },
        cache_slots: 2000,
        cache_options: Default::default(),
        routing: "typical".into(),
        warmup_steps: 16,
        steps: 40,
        seed,
        jitter,
        workload: Workload::default(),
        layout: Default::default(),
    }
}

#[test]
fn same_seed_same_result_other_seed_other_result() {
    let (c, m) = setup();
    let a = simulate(&c, &m, &cfg(7, 0.0)).unwrap();
    let b = simulate(&c, &m, &cfg(7, 0.0)).unwrap();
    assert_eq!(a, b);
    let d = simulate(&c, &m, &cfg(8, 0.0)).unwrap();
    assert_ne!(a.tok_s_total, d.tok_s_total);
    // Jitter is drawn from the run's generator: reproducible, and it changes the timing
    // but not the plans.
    let j1 = simulate(&c, &m, &cfg(7, 0.1)).unwrap();
    let j2 = simulate(&c, &m, &cfg(7, 0.1)).unwrap();
    assert_eq!(j1, j2);
    assert_ne!(j1.tok_s_total, a.tok_s_total);
    assert_eq!(j1.miss_rate, a.miss_rate);
    // Mean-one jitter moves the mean little over many layers.
    assert!((j1.tok_s_total / a.tok_s_total - 1.0).abs() < 0.1);
}

#[test]
fn replayed_plans_time_exactly_as_live_ones() {
    let (c, m) = setup();
    for policy in ["lru", "lfu", "static-hot"] {
        let mut k = cfg(3, 0.05);
        k.cache_options.policy = policy.parse().unwrap();
        let live = simulate(&c, &m, &k).unwrap();
        let (trace, warmup, slots) = plan_trace(&m, &k).unwrap();
        let replay = simulate_replay(&c, &k, Arc::new(trace.clone()), warmup, slots).unwrap();
        assert_eq!(live, replay, "{policy}");
        // And from routing recorded once.
        let mut src = routing_source(&m, &k.routing, k.seed).unwrap();
        let rec =
            RecordedRouting::record(src.as_mut(), k.streams, (k.warmup_steps + k.steps) as usize)
                .unwrap();
        let (t2, w2, s2) = plan_trace_recorded(&m, &k, &rec).unwrap();
        assert_eq!((&t2, w2, s2), (&trace, warmup, slots), "{policy}");
    }
    // A trace of other streams is refused, naming the trace.
    let k = cfg(3, 0.0);
    let (trace, warmup, slots) = plan_trace(&m, &k).unwrap();
    let mut other = k.clone();
    other.streams = 3;
    let e = simulate_replay(&c, &other, Arc::new(trace), warmup, slots)
        .unwrap_err()
        .to_string();
    assert!(e.contains("plan trace"), "{e}");
}

#[test]
fn longer_context_and_more_streams_slow_each_stream() {
    let (c, m) = setup();
    let mut k = cfg(1, 0.0);
    k.strategy = Strategy::Resident;
    let short = simulate(&c, &m, &k).unwrap();
    k.workload.prompt_tokens = 100_000;
    let long = simulate(&c, &m, &k).unwrap();
    assert!(long.tok_s_per_stream < short.tok_s_per_stream);
    let mut k = cfg(1, 0.0);
    // Streams that share popular experts (static skew, weak locality): batching then pays.
    // (Under `typical` each stream has its own working set, and four of them can outgrow a
    // cache that holds one, so the total may fall.)
    k.routing = "legacy-typical".into();
    k.streams = 1;
    let one = simulate(&c, &m, &k).unwrap();
    k.streams = 4;
    let four = simulate(&c, &m, &k).unwrap();
    assert!(four.tok_s_per_stream < one.tok_s_per_stream);
    assert!(
        four.tok_s_total > one.tok_s_total,
        "batching serves each fetched expert to every token routed to it"
    );
}

#[test]
fn prefill_is_excluded_from_decode_time() {
    let (c, m) = setup();
    let mut k = cfg(1, 0.0);
    k.workload.output_tokens = 8;
    let base = simulate(&c, &m, &k).unwrap();
    k.workload.prefill_ns = 50_000_000;
    let with = simulate(&c, &m, &k).unwrap();
    // The same decode steps; prefill time is not decode time. (The CPU pool parks during
    // a 50 ms prefill and pays its wake-up once after each, hence not bit-identical.)
    assert_eq!(base.steps, with.steps);
    assert!((with.tok_s_total / base.tok_s_total - 1.0).abs() < 0.01);
}

#[test]
fn bad_input_is_named() {
    let (c, m) = setup();
    let mut k = cfg(1, 0.0);
    k.streams = 0;
    assert!(simulate(&c, &m, &k)
        .unwrap_err()
        .to_string()
        .contains("--streams"));
    let mut k = cfg(1, 0.0);
    k.jitter = -1.0;
    assert!(simulate(&c, &m, &k)
        .unwrap_err()
        .to_string()
        .contains("--jitter"));
    let mut k = cfg(1, 0.0);
    k.strategy = Strategy::Hybrid {
        fetch: FetchFraction::Auto,
    };
    assert!(simulate(&c, &m, &k)
        .unwrap_err()
        .to_string()
        .contains("fetch fraction"));
    let mut k = cfg(1, 0.0);
    k.routing = "no-such-routing".into();
    assert!(simulate(&c, &m, &k)
        .unwrap_err()
        .to_string()
        .contains("no-such-routing"));
}
