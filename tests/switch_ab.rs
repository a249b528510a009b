//! `experiments/runtime-grid/switch_ab.py`, the A/B of an engine switch from alternated
//! `ft run --json` reports: medians over rounds against a naive recomputation here, the ratio
//! to the base setting, reports it cannot read skipped, an empty folder refused.

mod common;

use common::{ab_rows, python, python_failing, repo_root};
use serde_json::{json, Value};

/// A report as `ft run --json` writes its fields the script reads.
fn report(tok: f64, share: f64, idle: f64) -> Value {
    json!({
        "summary": {
            "tok_s_per_stream": tok,
            "link_idle_per_layer": {"total_us": idle, "dense_us": 19.0, "fetched_experts_us": idle - 19.0,
                                     "combine_us": 0.0, "host_us": 0.0, "gaps_us": 0.0}
        },
        "pcie": {"share_of_bound": share}
    })
}

#[test]
fn switch_ab_takes_the_median_round_and_compares_with_the_base() {
    let dir = tempfile::tempdir().unwrap();
    // Two settings at one stream, three rounds each; "on" is 5% faster in every round.
    let base = [100.0, 104.0, 98.0];
    for (r, &tok) in base.iter().enumerate() {
        for (label, k) in [("off", 1.0), ("on", 1.05)] {
            let path = dir.path().join(format!("b1-r{}-{label}.json", r + 1));
            std::fs::write(&path, report(tok * k, 0.8 * k, 40.0 / k).to_string()).unwrap();
        }
    }
    // One setting at two streams (its own base), and files the script must skip.
    std::fs::write(
        dir.path().join("b2-r1-on.json"),
        report(50.0, 0.9, 45.0).to_string(),
    )
    .unwrap();
    std::fs::write(dir.path().join("b2-r2-on.json"), "not json").unwrap();
    std::fs::write(dir.path().join("notes.txt"), "x").unwrap();
    let rows = ab_rows("experiments/runtime-grid/switch_ab.py", dir.path(), "off");
    let script = repo_root().join("experiments/runtime-grid/switch_ab.py");
    assert_eq!(rows.len(), 3, "{rows:?}");
    let row = |s: u64, l: &str| {
        rows.iter()
            .find(|r| r["streams"] == s && r["label"] == l)
            .unwrap_or_else(|| panic!("no row {s} {l}"))
    };
    // The median of three rounds by a naive sort.
    let mut sorted = base.to_vec();
    sorted.sort_by(f64::total_cmp);
    let median = sorted[1];
    let off = row(1, "off");
    assert_eq!(off["rounds"], 3);
    assert!((off["tok_s_per_stream"].as_f64().unwrap() - median).abs() < 1e-9);
    assert!((off["spread"].as_f64().unwrap() - (104.0 - 98.0) / median).abs() < 1e-9);
    let on = row(1, "on");
    assert!(
        (on["vs_base"].as_f64().unwrap() - 1.05).abs() < 1e-9,
        "{on}"
    );
    assert!((on["share_of_bound"].as_f64().unwrap() - 0.84).abs() < 1e-9);
    // The unreadable round is skipped; a stream count without the base compares with itself.
    let two = row(2, "on");
    assert_eq!(two["rounds"], 1);
    assert_eq!(two["base"], "on");
    assert!((two["vs_base"].as_f64().unwrap() - 1.0).abs() < 1e-12);
    // The table names each setting and the ratio.
    let table = python([script.as_os_str(), dir.path().as_os_str()]);
    let text = String::from_utf8_lossy(&table.stdout);
    assert!(text.contains("vs base") && text.contains("1.050"), "{text}");
    // A folder without reports is an error naming the folder.
    let empty = tempfile::tempdir().unwrap();
    let err = python_failing([script.as_os_str(), empty.path().as_os_str()]);
    assert!(err.contains("no b<streams>"), "{err}");
}
