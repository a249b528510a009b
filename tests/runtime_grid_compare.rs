//! `experiments/runtime-grid/compare.py`, the A/B of two runs of the runtime grid, on a
//! committed grid against a copy with known changes: points matched by what they ran (not by
//! name), ratios, verdicts against the noise floor, a point only one side has.

mod common;

use common::{python, repo_root};
use serde_json::Value;
use std::process::Command;

/// `grid` with every `strategy` row's tok/s (total and per stream) times `k`, renamed.
fn scaled(grid: &str, changes: &[(&str, f64)], drop_strategy: &str) -> String {
    let mut lines = grid.lines();
    let header = lines.next().expect("a header");
    let cols: Vec<&str> = header.split(',').collect();
    let at = |name: &str| cols.iter().position(|c| *c == name).expect(name);
    let (strategy, name) = (at("strategy"), at("name"));
    let tok = [at("tok_s_total"), at("tok_s_per_stream")];
    let mut out = vec![header.to_string()];
    for line in lines {
        let mut f: Vec<String> = line.split(',').map(str::to_string).collect();
        if f[strategy] == drop_strategy {
            continue;
        }
        if let Some((_, k)) = changes.iter().find(|(s, _)| *s == f[strategy]) {
            for &i in &tok {
                let v: f64 = f[i].parse().expect("tok/s");
                f[i] = (v * k).to_string();
            }
        }
        f[name] = format!("renamed-{}", f[name]);
        out.push(f.join(","));
    }
    out.join("\n") + "\n"
}

#[test]
fn compare_matches_points_by_what_they_ran_and_judges_against_the_noise() {
    assert!(
        Command::new("python3").arg("--version").output().is_ok(),
        "compare.py needs python3"
    );
    let base = repo_root().join("experiments/runtime-grid/results/20261204T2034Z");
    let grid = std::fs::read_to_string(base.join("grid.csv")).expect("the committed grid");
    let dir = tempfile::tempdir().unwrap();
    let new = dir.path().join("grid.csv");
    std::fs::write(
        &new,
        scaled(&grid, &[("offload", 1.10), ("hybrid", 0.99)], "resident"),
    )
    .unwrap();
    let out = python([
        repo_root()
            .join("experiments/runtime-grid/compare.py")
            .as_os_str(),
        base.as_os_str(),
        new.as_os_str(),
        "--json".as_ref(),
    ]);
    let doc: Value = serde_json::from_slice(&out.stdout).expect("JSON");
    let points = doc["points"].as_array().expect("points");
    let mut seen = 0;
    for p in points {
        let strategy = p["key"]["strategy"].as_str().unwrap();
        match strategy {
            "resident" => assert_eq!(p["missing"], "new", "{p}"),
            "offload" => {
                assert!((p["ratio"].as_f64().unwrap() - 1.10).abs() < 1e-9, "{p}");
                assert_eq!(p["verdict"], "faster", "{p}");
                assert_eq!(
                    p["base_share_of_pcie_bound"], p["new_share_of_pcie_bound"],
                    "{p}"
                );
            }
            "hybrid" => assert_eq!(p["verdict"], "same", "a 1% change is within 3%: {p}"),
            "cpu" => assert_eq!(p["ratio"].as_f64(), Some(1.0), "{p}"),
            other => panic!("unexpected strategy {other}"),
        }
        seen += 1;
    }
    assert_eq!(
        seen,
        grid.lines().count() - 1,
        "every committed point is listed"
    );
    let s = &doc["summary"];
    assert!((s["offload"]["geomean_ratio"].as_f64().unwrap() - 1.10).abs() < 1e-9);
    assert_eq!(s["offload"]["faster"], 2);
    assert_eq!(s["hybrid"]["slower"], 0);
    assert!(
        s.get("resident").is_none(),
        "no resident point on both sides"
    );

    // The table names the switches each run took.
    let table = python([
        repo_root()
            .join("experiments/runtime-grid/compare.py")
            .as_os_str(),
        base.as_os_str(),
        base.as_os_str(),
    ]);
    let text = String::from_utf8_lossy(&table.stdout);
    assert!(text.contains("geometric mean new/base 1.000"), "{text}");
    assert!(text.starts_with("base: "), "{text}");
}
