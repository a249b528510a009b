//! `ft routing stats|fit|import` end to end: JSON shapes, a trace imported from a CSV the
//! test writes and read back by `stats` on its own geometry, a small fit, and errors that
//! name the input with exit code 2.

mod common;
use common::{assert_ok, ft};

fn json(args: &[&str]) -> serde_json::Value {
    let out = ft(args);
    assert_ok(&out);
    serde_json::from_slice(&out.stdout).expect("stdout is JSON")
}

#[test]
fn stats_of_a_preset_and_of_an_imported_trace() {
    let v = json(&[
        "routing",
        "stats",
        "--layers",
        "2",
        "--steps",
        "60",
        "--warmup",
        "20",
        "--per-layer",
        "16,64",
        "--global",
        "16",
        "--hot",
        "32",
        "--union-streams",
        "2",
        "--json",
    ]);
    let st = &v["stats"];
    assert_eq!(st["geometry"]["experts"], 512);
    assert_eq!(st["geometry"]["moe_layers"], 2);
    let hits = st["hit_rates"].as_array().unwrap();
    // 2 per-layer sizes + 1 global, 3 policies each.
    assert_eq!(hits.len(), 9);
    let lru = |n: u64| {
        hits.iter()
            .find(|h| {
                h["policy"] == "lru" && h["topology"] == "per-layer" && h["slots_per_layer"] == n
            })
            .unwrap()["hit_rate"]
            .as_f64()
            .unwrap()
    };
    assert!(
        lru(64) > lru(16) && lru(16) > 0.0,
        "{} {}",
        lru(16),
        lru(64)
    );
    assert_eq!(st["hot"][0]["k"], 32);
    assert_eq!(st["reuse"].as_array().unwrap().len(), 2);
    assert_eq!(st["union"].as_array().unwrap().len(), 2);

    let dir = tempfile::tempdir().unwrap();
    let csv = dir.path().join("log.csv");
    let mut text = String::from("request,token,layer,experts\n");
    for t in 0..40 {
        for layer in [3, 5] {
            let a = (t / 4) % 16;
            text += &format!("r,{t},{layer},{a} {}\n", a + 16);
        }
    }
    std::fs::write(&csv, text).unwrap();
    let trace = dir.path().join("log.jsonl");
    let v = json(&[
        "routing",
        "import",
        csv.to_str().unwrap(),
        trace.to_str().unwrap(),
        "--json",
    ]);
    assert_eq!(
        (v["steps"].as_u64(), v["top_k"].as_u64()),
        (Some(40), Some(2))
    );
    assert_eq!(v["moe_layers"], 2);
    let v = json(&[
        "routing",
        "stats",
        "--routing",
        trace.to_str().unwrap(),
        "--steps",
        "30",
        "--warmup",
        "10",
        "--per-layer",
        "4",
        "--global",
        "4",
        "--policy",
        "lru",
        "--hot",
        "2",
        "--union-streams",
        "1",
        "--json",
    ]);
    let st = &v["stats"];
    assert_eq!(st["geometry"]["experts"], 26); // largest id 25, + 1
                                               // Each token repeats its predecessor's pair 3 times in 4: a per-layer LRU of 4 hits.
    assert!(st["hit_rates"][0]["hit_rate"].as_f64().unwrap() > 0.7);
    // The imported request comes back: one request of 40 consecutive tokens on stream 0.
    let q = &v["requests"];
    assert_eq!(
        (
            q["requests"].as_u64(),
            q["tagged"].as_u64(),
            q["token_gaps"].as_u64()
        ),
        (Some(1), Some(40), Some(0))
    );
    assert_eq!(q["listed"][0]["request"], "r");
    assert_eq!(q["listed"][0]["first_token"], 0);
    assert_eq!(q["listed"][0]["last_token"], 39);
    let human = ft(&[
        "routing",
        "stats",
        "--routing",
        "skewed",
        "--layers",
        "2",
        "--steps",
        "20",
        "--warmup",
        "4",
    ]);
    assert_ok(&human);
    let text = String::from_utf8(human.stdout).unwrap();
    assert!(text.contains("STATIC SKEW") && text.contains("per-layer") && text.contains("uniform"));
}

#[test]
fn fit_prints_every_points_residual() {
    let dir = tempfile::tempdir().unwrap();
    let points = dir.path().join("p.toml");
    std::fs::write(
        &points,
        "source = \"test\"\nexperts = 64\ntop_k = 4\nmoe_layers = 2\nfit = [\"locality\"]\n\
         warmup_steps = 20\nsteps = 120\n\
         [[point]]\nkind = \"hit-rate\"\nslots_per_layer = 16\nvalue = 0.5\n",
    )
    .unwrap();
    let out_toml = dir.path().join("fitted.toml");
    let v = json(&[
        "routing",
        "fit",
        "--points",
        points.to_str().unwrap(),
        "--out",
        out_toml.to_str().unwrap(),
        "--json",
    ]);
    let p = &v["points"][0];
    assert_eq!(p["label"], "per-layer lru 16");
    assert!(p["residual"].as_f64().unwrap().abs() < 0.05, "{p}");
    let fitted = std::fs::read_to_string(&out_toml).unwrap();
    assert!(fitted.contains("locality"), "{fitted}");
}

#[test]
fn bad_input_is_named_with_exit_code_2() {
    for (args, want) in [
        (vec!["routing", "stats", "--routing", "nosuch"], "nosuch"),
        (
            vec!["routing", "stats", "--per-layer", "9999"],
            "per_layer_slots",
        ),
        (vec!["routing", "stats", "--layers", "0"], "--layers"),
        (
            vec!["routing", "fit", "--points", "/nonexistent/p.toml"],
            "/nonexistent/p.toml",
        ),
        (
            vec!["routing", "import", "/nonexistent.csv", "/tmp/x.jsonl"],
            "/nonexistent.csv",
        ),
    ] {
        let out = ft(&args);
        assert_eq!(out.status.code(), Some(2), "{args:?}");
        assert!(out.stdout.is_empty(), "{args:?}");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.contains(want), "{args:?}: {err}");
    }
}
