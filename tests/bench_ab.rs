//! `experiments/gpu-backend/bench_ab.py`, the A/B of two expert-kernel builds from alternated
//! `gpu_backend` runs: medians over rounds against a naive recomputation here, the ratio to
//! the base build, runs it cannot read skipped, an empty folder refused.

mod common;

use common::{ab_rows, python, python_failing, repo_root};
use serde_json::{json, Value};

/// A `gpu_backend.json` with the fields the script reads: one kernel row per (tokens, us).
fn run(rows: &[(u64, f64)]) -> Value {
    let kernel: Vec<Value> = rows
        .iter()
        .map(|&(tokens, us)| {
            json!({"act": "int8", "tokens": tokens, "variant": "auto",
                   "path": "staged+pdl", "experts": 10, "queued_us": us,
                   "over_copy_rw": 10.0 / us})
        })
        .collect();
    json!({ "kernel": kernel })
}

#[test]
fn bench_ab_takes_the_median_round_and_compares_with_the_base() {
    let dir = tempfile::tempdir().unwrap();
    // Two builds, three rounds; "after" is 4% faster at one token in every round and the
    // same at none.
    let one = [25.0, 25.4, 24.9];
    for (r, &us) in one.iter().enumerate() {
        for (label, k) in [("before", 1.0), ("after", 0.96)] {
            let sub = dir.path().join(format!("{label}{}", r + 1));
            std::fs::create_dir(&sub).unwrap();
            let body = run(&[(1, us * k), (0, 7.0)]);
            std::fs::write(sub.join("gpu_backend.json"), body.to_string()).unwrap();
        }
    }
    // What the script must skip: a run it cannot read, a folder without a round, a file.
    std::fs::create_dir(dir.path().join("after4")).unwrap();
    std::fs::write(dir.path().join("after4/gpu_backend.json"), "{").unwrap();
    std::fs::create_dir(dir.path().join("stamps")).unwrap();
    std::fs::write(
        dir.path().join("stamps/gpu_backend.json"),
        run(&[(1, 1.0)]).to_string(),
    )
    .unwrap();
    std::fs::write(dir.path().join("notes.txt"), "x").unwrap();
    let rows = ab_rows("experiments/gpu-backend/bench_ab.py", dir.path(), "before");
    let script = repo_root().join("experiments/gpu-backend/bench_ab.py");
    assert_eq!(rows.len(), 4, "{rows:?}");
    let row = |case: &str, l: &str| {
        rows.iter()
            .find(|r| r["case"] == case && r["label"] == l)
            .unwrap_or_else(|| panic!("no row {case} {l}"))
    };
    let mut sorted = one.to_vec();
    sorted.sort_by(f64::total_cmp);
    let before = row("int8/1/auto/staged+pdl/10", "before");
    assert_eq!(before["rounds"], 3);
    assert!((before["queued_us"].as_f64().unwrap() - sorted[1]).abs() < 1e-9);
    assert!((before["queued_us_max"].as_f64().unwrap() - 25.4).abs() < 1e-9);
    assert!((before["over_copy_rw"].as_f64().unwrap() - 10.0 / sorted[1]).abs() < 1e-9);
    let after = row("int8/1/auto/staged+pdl/10", "after");
    assert!(
        (after["vs_base"].as_f64().unwrap() - 0.96).abs() < 1e-9,
        "{after}"
    );
    let none = row("int8/0/auto/staged+pdl/10", "after");
    assert!((none["vs_base"].as_f64().unwrap() - 1.0).abs() < 1e-12);
    // The base comes first in the table, the others with their ratio.
    let table = python([
        script.as_os_str(),
        dir.path().as_os_str(),
        "--base".as_ref(),
        "before".as_ref(),
    ]);
    let text = String::from_utf8_lossy(&table.stdout);
    let lines: Vec<&str> = text.lines().collect();
    assert!(
        lines[1].contains("before") && lines[1].ends_with("base"),
        "{text}"
    );
    assert!(
        lines[2].contains("after") && lines[2].ends_with("0.960"),
        "{text}"
    );
    // A folder without runs is an error naming the expected layout.
    let empty = tempfile::tempdir().unwrap();
    let err = python_failing([script.as_os_str(), empty.path().as_os_str()]);
    assert!(err.contains("<label><round>"), "{err}");
}
