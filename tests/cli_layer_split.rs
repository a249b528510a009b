//! Layer split end to end on the host-emulated device: `ft run --strategy layer-split:N`
//! and `layer-split-cached:N` decode, and their per-step traffic (hits, fetched and CPU
//! experts) is what `ft predict` plans for the same routing, seed, steps and cache.

mod common;
use common::{ft, json_ok, write, TINY_RUN_MODEL as TINY};

/// The run and the prediction share these: 2 streams, 4 steps after 2 warm-up, context 16,
/// the `typical` routing at seed 7.
const SHARED: &[&str] = &[
    "--streams",
    "2",
    "--steps",
    "4",
    "--warmup",
    "2",
    "--context",
    "16",
    "--routing",
    "typical",
    "--seed",
    "7",
];

fn run(model: &str, strategy: &str, cache: &[&str]) -> serde_json::Value {
    let mut args = vec![
        "run",
        "--device",
        "host",
        "--model",
        model,
        "--threads",
        "1",
        "--strategy",
        strategy,
        "--json",
    ];
    args.extend(SHARED);
    args.extend(cache);
    json_ok(&ft(&args))
}

fn predicted(model: &str, n: &str, cache: &[&str]) -> serde_json::Value {
    let mut args = vec!["predict", "--model", model, "--cpu-layers", n, "--json"];
    args.extend(SHARED);
    args.extend(cache);
    json_ok(&ft(&args))
}

/// Per-step counts of the run (its per-layer means times the layers).
fn run_counts(r: &serde_json::Value) -> [f64; 3] {
    let s = &r["summary"];
    let layers = r["layers"].as_f64().unwrap();
    ["hits_per_layer", "fetched_per_layer", "cpu_per_layer"]
        .map(|k| s[k].as_f64().unwrap() * layers)
}

fn predicted_counts(p: &serde_json::Value, kind: &str) -> [f64; 3] {
    let s = p["prediction"]["strategies"]
        .as_array()
        .unwrap()
        .iter()
        .find(|s| s["kind"] == kind)
        .unwrap_or_else(|| panic!("no {kind} in {p}"));
    let c = &s["counts"];
    ["hits", "fetched", "cpu"].map(|k| c[k].as_f64().unwrap())
}

/// Equal up to the rounding of a mean over steps.
fn same(a: [f64; 3], b: [f64; 3], what: &str) {
    for (x, y) in a.iter().zip(&b) {
        assert!(
            (x - y).abs() <= 1e-9 * x.abs().max(1.0),
            "{what}: run {a:?}, predict {b:?}"
        );
    }
}

#[test]
fn layer_split_runs_and_its_traffic_is_the_predicted_one() {
    let dir = tempfile::tempdir().unwrap();
    let model = write(dir.path(), "tiny.toml", TINY);
    let cache = ["--cache-slots", "24"];
    for n in [0usize, 1, 4] {
        let ns = n.to_string();
        let split = run(&model, &format!("layer-split:{n}"), &[]);
        assert_eq!(split["cpu_layers"], n);
        assert!(split["summary"]["tok_s_total"].as_f64().unwrap() > 0.0);
        let p = predicted(&model, &ns, &cache);
        let got = run_counts(&split);
        same(
            got,
            predicted_counts(&p, "layer-split"),
            &format!("layer-split:{n}"),
        );
        // The resident layers all hit, the CPU layers all run on the CPU, nothing crosses.
        assert_eq!(got[1], 0.0);
        assert_eq!(got[0] == 0.0, n == 4);
        assert_eq!(got[2] == 0.0, n == 0);
        if n < 4 {
            let cached = run(&model, &format!("layer-split-cached:{n}"), &cache);
            same(
                run_counts(&cached),
                predicted_counts(&p, "layer-split-cached"),
                &format!("layer-split-cached:{n}"),
            );
        }
    }
}

#[test]
fn layer_split_refuses_what_it_cannot_run() {
    let dir = tempfile::tempdir().unwrap();
    let model = write(dir.path(), "tiny.toml", TINY);
    for (strategy, says) in [
        ("layer-split:5", "more than the run's 4 MoE layers"),
        ("layer-split:x", "layer-split's CPU layers"),
        ("layer-split", "--host"),
        ("offload:2", "takes no parameter"),
    ] {
        let mut args = vec!["run", "--device", "host", "--model", &model];
        args.extend(["--strategy", strategy, "--cache-slots", "24"]);
        let out = ft(&args);
        assert!(!out.status.success(), "{strategy} was accepted");
        assert_eq!(out.status.code(), Some(2), "{strategy}");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.contains(says), "{strategy}: {err}");
    }
}
