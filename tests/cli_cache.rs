//! The cache flags (`--cache-policy`, `--cache-topology`, `--cache-slots-per-layer`,
//! `--admission`) reach the result of every command that builds a cache: predict, simulate,
//! run, probe and serve.

mod common;
use common::{ft, json_ok, stderr, write};

/// Offload's (or another strategy's) miss rate in a `predict --json` document.
fn predicted_miss(v: &serde_json::Value, kind: &str) -> f64 {
    v["prediction"]["strategies"]
        .as_array()
        .unwrap()
        .iter()
        .find(|s| s["kind"] == kind)
        .unwrap_or_else(|| panic!("no {kind} in {v}"))["miss_rate"]
        .as_f64()
        .unwrap()
}

const QUICK: [&str; 4] = ["--steps", "40", "--warmup", "30"];

fn predict(extra: &[&str]) -> serde_json::Value {
    let mut args = vec!["predict", "--streams", "1", "--json"];
    args.extend(QUICK);
    args.extend(extra);
    json_ok(&ft(&args))
}

/// The default model has 48 MoE layers: 32 slots per layer are 1536 slots, and the same
/// 1536 slots in one pool miss otherwise; the admission changes hybrid's misses only.
#[test]
fn predict_takes_the_topology_and_the_admission() {
    let global = predict(&["--cache-slots", "1536", "--fetch-fraction", "0.5"]);
    let per_layer = predict(&["--cache-slots-per-layer", "32", "--fetch-fraction", "0.5"]);
    let options = &per_layer["prediction"]["config"]["cache_options"];
    assert_eq!(options["topology"], "per-layer", "{options}");
    assert_eq!(options["slots-per-layer"], 32, "{options}");
    assert_eq!(per_layer["prediction"]["cache_slots"], 1536);
    assert_eq!(global["prediction"]["cache_slots"], 1536);
    assert_ne!(
        predicted_miss(&global, "offload"),
        predicted_miss(&per_layer, "offload")
    );
    let order = predict(&[
        "--cache-slots-per-layer",
        "32",
        "--fetch-fraction",
        "0.5",
        "--admission",
        "order",
    ]);
    assert_eq!(
        order["prediction"]["config"]["cache_options"]["admission"]["order"],
        "order"
    );
    assert_ne!(
        predicted_miss(&order, "hybrid"),
        predicted_miss(&per_layer, "hybrid")
    );
    // A per-layer topology rounds a size down to a multiple of the layers.
    let rounded = predict(&["--cache-slots", "1000", "--cache-topology", "per-layer"]);
    assert_eq!(rounded["prediction"]["cache_slots"], 960);
}

#[test]
fn two_sizes_or_a_bad_option_are_refused_naming_the_flag() {
    for (args, needles) in [
        (
            vec![
                "predict",
                "--cache-slots",
                "100",
                "--cache-slots-per-layer",
                "2",
            ],
            vec!["--cache-slots-per-layer", "--cache-slots"],
        ),
        (
            vec![
                "simulate",
                "--miss-rate",
                "0.4",
                "--cache-slots-per-layer",
                "2",
            ],
            vec!["--cache-slots-per-layer", "--miss-rate"],
        ),
        (
            vec!["predict", "--admission", "weights"],
            vec!["--admission", "weights"],
        ),
        (
            vec!["predict", "--cache-topology", "ring"],
            vec!["--cache-topology", "ring"],
        ),
        (
            vec!["predict", "--cache-policy", "mru"],
            vec!["--cache-policy", "mru"],
        ),
        (
            vec!["predict", "--cache-slots-per-layer", "0"],
            vec!["--cache-slots-per-layer"],
        ),
    ] {
        let out = ft(&args);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {}", stderr(&out));
        let err = stderr(&out);
        for n in needles {
            assert!(err.contains(n), "{args:?}: {err}");
        }
    }
}

/// The simulator plans with the options it is given, so its miss rate is the model's on
/// either topology.
#[test]
fn simulate_runs_the_topology_the_model_predicts() {
    let sim = |extra: &[&str]| {
        let mut args = vec![
            "simulate",
            "--json",
            "--streams",
            "1",
            "--strategy",
            "offload",
            "--steps",
            "40",
            "--warmup",
            "30",
        ];
        args.extend(extra);
        json_ok(&ft(&args))
    };
    let per_layer = sim(&["--cache-slots-per-layer", "32"]);
    assert_eq!(per_layer["cache"]["slots"], 1536);
    assert!(per_layer["cache"]["how"]
        .as_str()
        .unwrap()
        .contains("--cache-slots-per-layer 32"));
    assert_eq!(
        per_layer["config"]["cache_options"]["topology"],
        "per-layer"
    );
    let global = sim(&["--cache-slots", "1536"]);
    let row = |v: &serde_json::Value| {
        let r = &v["strategies"][0];
        (
            r["miss_rate"].as_f64().unwrap(),
            r["model"]["miss_rate"].as_f64().unwrap(),
        )
    };
    let (p_sim, p_model) = row(&per_layer);
    let (g_sim, g_model) = row(&global);
    assert!((p_sim - p_model).abs() < 1e-9, "{p_sim} {p_model}");
    assert!((g_sim - g_model).abs() < 1e-9, "{g_sim} {g_model}");
    assert_ne!(p_sim, g_sim);
}

const TINY: &str = r#"
name = "tiny-cache"
format = "nvfp4"

[geometry]
hidden = 128
intermediate = 64
experts = 16
top_k = 4
moe_layers = 4

[dense]
weight_bytes_per_layer = 65536
kv_bytes_per_token = 64
"#;

/// `ft run` builds the engine's cache from the flags and reports them.
#[test]
fn run_reports_the_cache_it_ran() {
    let dir = tempfile::tempdir().unwrap();
    let model = write(dir.path(), "tiny.toml", TINY);
    let run = |extra: &[&str]| {
        let mut args = vec![
            "run",
            "--device",
            "host",
            "--model",
            &model,
            "--streams",
            "2",
            "--steps",
            "6",
            "--warmup",
            "2",
            "--context",
            "16",
            "--threads",
            "1",
            "--strategy",
            "hybrid",
            "--fetch-fraction",
            "0.5",
            "--json",
        ];
        args.extend(extra);
        json_ok(&ft(&args))
    };
    let v = run(&[
        "--cache-slots-per-layer",
        "3",
        "--admission",
        "recent,cached-history",
    ]);
    assert_eq!(v["cache_slots"], 12, "{}", v["cache_slots"]);
    let o = &v["cache_options"];
    assert_eq!(o["topology"], "per-layer");
    assert_eq!(o["admission"]["order"], "recent");
    assert_eq!(o["admission"]["cpu-history"], false);
    let rounded = run(&["--cache-slots", "14", "--cache-topology", "per-layer"]);
    assert_eq!(rounded["cache_slots"], 12);
}

/// A probe with another cache is another profile: the options are in its key.
#[test]
fn probe_keys_its_profile_by_the_cache() {
    let dir = tempfile::tempdir().unwrap();
    let m = write(dir.path(), "tiny.toml", common::TINY_MODEL);
    let cache = dir.path().join("cache");
    let mut args = vec![
        "probe",
        "--model",
        &m,
        "--json",
        "--cache-topology",
        "per-layer",
        "--admission",
        "recent",
    ];
    args.extend_from_slice(common::PROBE_FAST);
    let r = json_ok(&common::ft_cached(&cache, &args));
    let path = std::path::Path::new(r["profile_path"].as_str().unwrap());
    let doc: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
    let paths = doc["key"]["host"]["gpu_paths"].as_str().unwrap();
    assert!(paths.ends_with("; cache lru per-layer recent"), "{paths}");
}

/// `ft serve` predicts with the cache it serves with.
#[test]
fn serve_predicts_with_its_cache() {
    let serve = |extra: &[&str]| {
        let mut args = vec![
            "serve",
            "--backend",
            "reference",
            "--host",
            "rtx4090-2x-xeon4310",
            "--cache-gb",
            "4",
            "--predict-only",
            "--json",
        ];
        args.extend(extra);
        json_ok(&ft(&args))
    };
    let miss = |v: &serde_json::Value| {
        v["decision"]["estimates"]
            .as_array()
            .unwrap()
            .iter()
            .find(|e| e["strategy"].to_string().contains("offload"))
            .unwrap_or_else(|| panic!("{v}"))["miss_rate"]
            .clone()
    };
    let global = serve(&[]);
    let per_layer = serve(&["--cache-topology", "per-layer"]);
    assert_eq!(global["cache"]["topology"], "global");
    assert_eq!(per_layer["cache"]["topology"], "per-layer");
    assert_ne!(miss(&global), miss(&per_layer));
}
