//! The simulator experiments still reproduce their committed conclusions.
//!
//! Each experiment under `experiments/` with a simulator half commits an
//! `expected-conclusions.json`: the conclusions its script draws in quick mode (`FT_QUICK=1`),
//! the winners and the directions of its effects exactly, its magnitudes with a stated
//! tolerance. This test runs every such script in quick mode against this build's `ft`
//! (GPU halves off), reads the `conclusions.json` it writes and compares. A change to the
//! simulator, the model or a preset that turns a conclusion fails here, naming the
//! experiment, the conclusion and both values; a changed magnitude inside its tolerance
//! does not.
//!
//! `expected-conclusions.json` is `{"mode": "quick", "conclusions": {KEY: EXPECTED, ...}}`
//! where EXPECTED is a string, a boolean, null or a number (compared exactly), or
//! `{"value": X, "abs_tol": T}` / `{"value": X, "rel_tol": R}` (a number within T, or within
//! R times |X|, of X). Keys the script writes beyond the expected ones are allowed.
//!
//! The scripts need bash, jq and python3 (standard library only); the whole set runs in
//! well under a minute on two cores.

use serde_json::Value;
use std::path::{Path, PathBuf};
use std::process::Command;

/// The experiments with a simulator half, each checked by its own test below.
const SIMULATOR_EXPERIMENTS: [&str; 8] = [
    "ratio-vs-model",
    "expert-size",
    "concurrency",
    "contention",
    "context",
    "cache-history",
    "fetch-fraction",
    "multi-gpu",
];

fn experiments_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("experiments")
}

/// Why `actual` does not satisfy `expected`, or `None` when it does.
fn mismatch(expected: &Value, actual: &Value) -> Option<String> {
    if let Value::Object(spec) = expected {
        let Some(want) = spec.get("value").and_then(Value::as_f64) else {
            return Some(format!(
                "bad expectation {expected}: an object needs a numeric 'value'"
            ));
        };
        let tol = match (spec.get("abs_tol"), spec.get("rel_tol")) {
            (Some(a), None) => a.as_f64(),
            (None, Some(r)) => r.as_f64().map(|r| r * want.abs()),
            _ => None,
        };
        let Some(tol) = tol.filter(|t| *t >= 0.0) else {
            return Some(format!(
                "bad expectation {expected}: give one non-negative 'abs_tol' or 'rel_tol'"
            ));
        };
        return match actual.as_f64() {
            Some(got) if (got - want).abs() <= tol => None,
            Some(got) => Some(format!(
                "{got} is {:.4} from {want}, outside the tolerance {tol}",
                (got - want).abs()
            )),
            None => Some(format!(
                "{actual} is not a number (expected {want} +- {tol})"
            )),
        };
    }
    let same = match (expected, actual) {
        (Value::Number(a), Value::Number(b)) => a.as_f64() == b.as_f64(),
        (a, b) => a == b,
    };
    (!same).then(|| format!("{actual} where {expected} is committed"))
}

/// Every mismatch between an expected-conclusions document and a conclusions object.
fn compare(expected: &Value, actual: &Value) -> Vec<String> {
    let Some(want) = expected.get("conclusions").and_then(Value::as_object) else {
        return vec!["expected-conclusions.json has no 'conclusions' object".to_string()];
    };
    let mut out = Vec::new();
    for (key, e) in want {
        match actual.get(key) {
            None => out.push(format!("{key}: missing from conclusions.json")),
            Some(a) => {
                if let Some(why) = mismatch(e, a) {
                    out.push(format!("{key}: {why}"));
                }
            }
        }
    }
    out
}

fn read_json(path: &Path) -> Value {
    let text =
        std::fs::read_to_string(path).unwrap_or_else(|e| panic!("reading {}: {e}", path.display()));
    serde_json::from_str(&text).unwrap_or_else(|e| panic!("parsing {}: {e}", path.display()))
}

fn tool_present(tool: &str) -> bool {
    Command::new(tool)
        .arg("--version")
        .output()
        .map(|o| o.status.success())
        .unwrap_or(false)
}

/// Run one experiment's script in quick mode and check its conclusions.
fn reproduce(name: &str) {
    for tool in ["bash", "jq", "python3"] {
        assert!(
            tool_present(tool),
            "the experiment scripts need {tool}, which is not installed here"
        );
    }
    let dir = experiments_dir().join(name);
    let expected = read_json(&dir.join("expected-conclusions.json"));
    assert_eq!(
        expected.get("mode").and_then(Value::as_str),
        Some("quick"),
        "{name}: expected-conclusions.json must hold the quick mode's conclusions"
    );
    let out = tempfile::tempdir().expect("a temporary folder");
    let started = std::time::Instant::now();
    let result = Command::new("bash")
        .arg(dir.join("run.sh"))
        .arg(out.path())
        .env("FT", env!("CARGO_BIN_EXE_ft"))
        .env("FT_QUICK", "1")
        .env("FT_GPU", "0")
        .output()
        .expect("starting bash");
    assert!(
        result.status.success(),
        "{name}: run.sh failed ({}):\n{}",
        result.status,
        String::from_utf8_lossy(&result.stderr)
    );
    let actual = read_json(&out.path().join("conclusions.json"));
    let problems = compare(&expected, &actual);
    assert!(
        problems.is_empty(),
        "{name} no longer reproduces its committed conclusions:\n  {}\nall conclusions: {actual}",
        problems.join("\n  ")
    );
    // The script also writes its tables and plots; a plot is a valid, non-trivial SVG.
    let svgs: Vec<PathBuf> = std::fs::read_dir(out.path())
        .expect("listing the output")
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "svg"))
        .collect();
    assert!(!svgs.is_empty(), "{name}: run.sh wrote no plot");
    for svg in &svgs {
        let text = std::fs::read_to_string(svg).expect("reading a plot");
        assert!(
            text.trim_start().starts_with("<svg") && text.trim_end().ends_with("</svg>"),
            "{}: not an SVG document",
            svg.display()
        );
    }
    for file in ["summary.md", "env.txt"] {
        assert!(
            out.path().join(file).is_file(),
            "{name}: run.sh wrote no {file}"
        );
    }
    eprintln!(
        "{name}: {} conclusions reproduced in {:.1} s",
        expected["conclusions"].as_object().map_or(0, |c| c.len()),
        started.elapsed().as_secs_f64()
    );
}

macro_rules! reproduces {
    ($($test:ident => $name:literal),* $(,)?) => {
        $(
            #[test]
            fn $test() {
                reproduce($name);
            }
        )*
    };
}

reproduces! {
    ratio_vs_model_reproduces => "ratio-vs-model",
    expert_size_reproduces => "expert-size",
    concurrency_reproduces => "concurrency",
    contention_reproduces => "contention",
    context_reproduces => "context",
    cache_history_reproduces => "cache-history",
    fetch_fraction_reproduces => "fetch-fraction",
    multi_gpu_reproduces => "multi-gpu",
}

#[test]
fn every_simulator_experiment_is_complete_and_indexed() {
    let index = std::fs::read_to_string(experiments_dir().join("README.md"))
        .expect("reading experiments/README.md");
    for name in SIMULATOR_EXPERIMENTS {
        let dir = experiments_dir().join(name);
        for file in [
            "experiment.toml",
            "run.sh",
            "README.md",
            "expected-conclusions.json",
        ] {
            assert!(dir.join(file).is_file(), "{name} has no {file}");
        }
        let toml_text = std::fs::read_to_string(dir.join("experiment.toml")).unwrap();
        let config: toml::Value =
            toml::from_str(&toml_text).unwrap_or_else(|e| panic!("{name}/experiment.toml: {e}"));
        assert_eq!(config["name"].as_str(), Some(name));
        let finding = config["finding"].as_str().expect("a finding");
        assert!(
            index
                .lines()
                .any(|l| l.starts_with(&format!("| [{name}]")) && l.contains(finding)),
            "experiments/README.md has no row for {name} with its finding"
        );
        // The committed results: the raw CSV and at least one plot.
        let results = dir.join("results");
        let files: Vec<String> = std::fs::read_dir(&results)
            .unwrap_or_else(|e| panic!("{}: {e}", results.display()))
            .filter_map(|e| e.ok())
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .collect();
        assert!(
            files.iter().any(|f| f.ends_with(".csv")),
            "{name}: no CSV in results/"
        );
        assert!(
            files.iter().any(|f| f.ends_with(".svg")),
            "{name}: no plot in results/"
        );
    }
}

#[test]
fn comparison_takes_winners_exactly_and_magnitudes_within_tolerance() {
    let expected: Value = serde_json::json!({
        "mode": "quick",
        "conclusions": {
            "winner": "hybrid",
            "grows": true,
            "configs": 32,
            "share": {"value": 0.5, "abs_tol": 0.1},
            "gain": {"value": 20.0, "rel_tol": 0.25},
            "none_yet": null
        }
    });
    let good = serde_json::json!({
        "winner": "hybrid", "grows": true, "configs": 32.0, "share": 0.58, "gain": 24.9,
        "none_yet": null, "extra": 1
    });
    assert_eq!(compare(&expected, &good), Vec::<String>::new());
    let bad = serde_json::json!({
        "winner": "offload", "grows": false, "configs": 31, "share": 0.61, "gain": 25.1
    });
    let problems = compare(&expected, &bad);
    for key in ["winner", "grows", "configs", "share", "gain", "none_yet"] {
        assert!(
            problems.iter().any(|p| p.starts_with(&format!("{key}:"))),
            "{key} not reported: {problems:?}"
        );
    }
    assert_eq!(problems.len(), 6);
    // A malformed expectation is reported, not passed.
    let odd = serde_json::json!({"conclusions": {"x": {"value": 1.0}}});
    assert!(compare(&odd, &serde_json::json!({"x": 1.0}))[0].contains("abs_tol"));
    assert!(!compare(&serde_json::json!({}), &good).is_empty());
}
