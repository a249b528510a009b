//! The behaviour check of a refactor: `ft predict --json` and `ft simulate --json` on every
//! host preset x model preset x 1, 2 and 8 streams, against a committed baseline written by
//! the tree before the refactor (`tests/fixtures/behaviour-baseline.json`).
//!
//! Why it exists: the layer schedule replaced code that the analytic model and the simulator
//! each wrote out by hand; where nothing new is asked, nothing may move. Each row keeps the
//! choice and every strategy's tok/s per stream (and the fetch fraction it ran at); the check
//! requires the same choice and every tok/s within [`TOK_S_TOLERANCE`]. A strategy the
//! baseline does not know (one added since) may win the choice only where it predicts more
//! than the baseline's choice: the old strategies themselves must not move.
//!
//! Regenerate the baseline (from the tree whose behaviour is the reference, e.g. a build of
//! the commit before a refactor) with
//! `FT_BLESS_BASELINE=1 FT_BASELINE_BIN=path/to/ft cargo test --release --test behaviour_baseline`;
//! without `FT_BASELINE_BIN` the binary under test writes it.

mod common;

use serde_json::{json, Map, Value};
use std::path::PathBuf;
use std::process::Command;

/// Largest relative difference of a tok/s from its baseline (0.1%).
const TOK_S_TOLERANCE: f64 = 1e-3;

/// Largest difference of a fetch fraction from its baseline (the search's tolerance is 1e-4;
/// the same inputs give the same optimum, so any real move is far above this).
const FETCH_TOLERANCE: f64 = 1e-6;

/// Stream counts of the check.
const STREAMS: [usize; 3] = [1, 2, 8];

/// Traffic steps of `ft predict` (short: the check compares two trees on the same seeded
/// inputs, not a converged estimate).
const PREDICT_STEPS: [&str; 4] = ["--steps", "6", "--warmup", "6"];

/// Measured and warm-up steps of `ft simulate` (short, as above; the simulator is seeded).
const SIMULATE_STEPS: [&str; 4] = ["--steps", "6", "--warmup", "4"];

/// Commands run at once (the CI machine has 2 cores; the runs are single-threaded mostly).
const PARALLEL: usize = 2;

fn fixture() -> PathBuf {
    common::repo_root().join("tests/fixtures/behaviour-baseline.json")
}

/// The binary whose behaviour is recorded or checked.
fn binary() -> PathBuf {
    std::env::var_os("FT_BASELINE_BIN")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_BIN_EXE_ft")))
}

fn run_json(args: &[String]) -> Value {
    let out = Command::new(binary())
        .args(args)
        .output()
        .expect("the ft binary runs");
    assert!(
        out.status.success(),
        "ft {}: {}",
        args.join(" "),
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).unwrap_or_else(|e| panic!("ft {}: {e}", args.join(" ")))
}

/// One strategy's numbers: tok/s per stream (null where infeasible) and fetch fraction.
fn strategy_row(tok_s: &Value, fetch: &Value) -> Value {
    json!({ "tok_s_per_stream": tok_s, "fetch_fraction": fetch })
}

/// The summary of one `ft predict --json`.
fn predict_summary(v: &Value) -> Value {
    let mut strategies = Map::new();
    for s in v["prediction"]["strategies"]
        .as_array()
        .expect("strategies")
    {
        let name = s["kind"].as_str().expect("kind").to_string();
        strategies.insert(
            name,
            strategy_row(&s["tok_s_per_stream"], &s["fetch_fraction"]),
        );
    }
    json!({ "choice": v["decision"]["kind"], "strategies": strategies })
}

/// The summary of one stream count of `ft simulate --json`: the simulator's and the model's
/// tok/s of every strategy.
fn simulate_summary(v: &Value) -> Value {
    let mut strategies = Map::new();
    for s in v["strategies"].as_array().expect("strategies") {
        let name = s["strategy"].as_str().expect("strategy").to_string();
        strategies.insert(
            name.clone(),
            strategy_row(&s["sim"]["tok_s_per_stream"], &s["fetch_fraction"]),
        );
        strategies.insert(
            format!("{name} (model)"),
            strategy_row(&s["model"]["tok_s_per_stream"], &s["fetch_fraction"]),
        );
    }
    json!({ "choice": v["best"], "strategies": strategies })
}

/// Every command of the check: (row key, arguments, summarise).
type Job = (String, Vec<String>, fn(&Value) -> Vec<(String, Value)>);

fn jobs() -> Vec<Job> {
    let mut jobs: Vec<Job> = Vec::new();
    let s = |x: &str| x.to_string();
    for host in ft_sim::hosts::preset_names() {
        for model in ft_model::ModelSpec::preset_names() {
            for streams in STREAMS {
                let mut args = vec![
                    s("predict"),
                    s("--json"),
                    s("--host"),
                    s(host),
                    s("--model"),
                    s(model),
                    s("--streams"),
                    streams.to_string(),
                ];
                args.extend(PREDICT_STEPS.map(s));
                jobs.push((format!("predict {host} {model} {streams}"), args, |v| {
                    vec![(String::new(), predict_summary(v))]
                }));
            }
            let mut args = vec![
                s("simulate"),
                s("--json"),
                s("--host"),
                s(host),
                s("--model"),
                s(model),
                s("--streams"),
                STREAMS.map(|n| n.to_string()).join(","),
            ];
            args.extend(SIMULATE_STEPS.map(s));
            jobs.push((format!("simulate {host} {model}"), args, |v| {
                v.as_array()
                    .expect("one object per stream count")
                    .iter()
                    .map(|x| (format!(" {}", x["streams"]), simulate_summary(x)))
                    .collect()
            }));
        }
    }
    jobs
}

/// Run every job (at most [`PARALLEL`] at once); the summaries by key.
fn observe() -> Map<String, Value> {
    let jobs = jobs();
    let next = std::sync::atomic::AtomicUsize::new(0);
    let rows = std::sync::Mutex::new(Map::new());
    std::thread::scope(|scope| {
        for _ in 0..PARALLEL {
            scope.spawn(|| loop {
                let i = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                let Some((key, args, summarise)) = jobs.get(i) else {
                    break;
                };
                let v = run_json(args);
                let mut rows = rows.lock().unwrap();
                for (suffix, row) in summarise(&v) {
                    rows.insert(format!("{key}{suffix}"), row);
                }
            });
        }
    });
    rows.into_inner().unwrap()
}

fn tok_s(row: &Value, strategy: &str) -> Option<f64> {
    row["strategies"][strategy]["tok_s_per_stream"].as_f64()
}

/// Every difference between `now` and `base` that the check refuses, in words.
fn differences(base: &Map<String, Value>, now: &Map<String, Value>) -> Vec<String> {
    let mut bad = Vec::new();
    for (key, b) in base {
        let Some(n) = now.get(key) else {
            bad.push(format!("{key}: missing"));
            continue;
        };
        let known = b["strategies"].as_object().expect("strategies");
        for (name, bs) in known {
            let ns = &n["strategies"][name];
            match (
                bs["tok_s_per_stream"].as_f64(),
                ns["tok_s_per_stream"].as_f64(),
            ) {
                (Some(x), Some(y)) => {
                    if (y - x).abs() > TOK_S_TOLERANCE * x.abs() {
                        bad.push(format!("{key} {name}: {y} tok/s, baseline {x}"));
                    }
                }
                (None, None) => {}
                (x, y) => bad.push(format!("{key} {name}: {y:?} tok/s, baseline {x:?}")),
            }
            if let (Some(x), Some(y)) =
                (bs["fetch_fraction"].as_f64(), ns["fetch_fraction"].as_f64())
            {
                if (y - x).abs() > FETCH_TOLERANCE {
                    bad.push(format!("{key} {name}: fetch fraction {y}, baseline {x}"));
                }
            }
        }
        let (bc, nc) = (b["choice"].as_str(), n["choice"].as_str());
        if bc != nc {
            // A new strategy may win where it predicts more than the baseline's choice.
            let new = nc.is_some_and(|c| !known.contains_key(c));
            let better = match (nc, bc) {
                (Some(c), Some(old)) => tok_s(n, c) > tok_s(n, old),
                _ => false,
            };
            if !(new && better) {
                bad.push(format!("{key}: choice {nc:?}, baseline {bc:?}"));
            }
        }
    }
    bad
}

#[test]
fn predict_and_simulate_match_the_committed_baseline() {
    let now = observe();
    assert_eq!(
        now.len(),
        ft_sim::hosts::preset_names().len()
            * ft_model::ModelSpec::preset_names().len()
            * STREAMS.len()
            * 2,
        "one predict and one simulate row per host, model and stream count"
    );
    if std::env::var_os("FT_BLESS_BASELINE").is_some() {
        let text = serde_json::to_string_pretty(&Value::Object(now)).unwrap();
        std::fs::create_dir_all(fixture().parent().unwrap()).unwrap();
        std::fs::write(fixture(), text + "\n").unwrap();
        return;
    }
    let base: Map<String, Value> =
        serde_json::from_str(&std::fs::read_to_string(fixture()).expect("the baseline exists"))
            .expect("the baseline is JSON");
    assert_eq!(base.len(), now.len(), "the baseline covers the same rows");
    let bad = differences(&base, &now);
    assert!(bad.is_empty(), "behaviour moved:\n{}", bad.join("\n"));
}

/// A map of one row, `k`.
fn one(row: Value) -> Map<String, Value> {
    Map::from_iter([("k".to_string(), row)])
}

/// The comparison itself: a moved tok/s, a moved fraction and a changed choice are refused;
/// a new strategy winning by predicting more is accepted.
#[test]
fn the_comparison_refuses_moves_and_accepts_a_better_new_strategy() {
    let row = |choice: &str, off: f64, f: f64, extra: Option<(&str, f64)>| {
        let mut s = json!({
            "offload": strategy_row(&json!(off), &json!(1.0)),
            "hybrid": strategy_row(&json!(100.0), &json!(f)),
        });
        if let Some((name, t)) = extra {
            s[name] = strategy_row(&json!(t), &json!(1.0));
        }
        json!({ "choice": choice, "strategies": s })
    };
    let base: Map<String, Value> = one(row("hybrid", 90.0, 0.5, None));
    let same: Map<String, Value> = one(row("hybrid", 90.05, 0.5, None));
    assert!(differences(&base, &same).is_empty());
    let moved: Map<String, Value> = one(row("hybrid", 91.0, 0.5, None));
    assert_eq!(differences(&base, &moved).len(), 1);
    let frac: Map<String, Value> = one(row("hybrid", 90.0, 0.6, None));
    assert_eq!(differences(&base, &frac).len(), 1);
    let flip: Map<String, Value> = one(row("offload", 90.0, 0.5, None));
    assert_eq!(differences(&base, &flip).len(), 1);
    let better: Map<String, Value> =
        one(row("layer-split", 90.0, 0.5, Some(("layer-split", 120.0))));
    assert!(differences(&base, &better).is_empty());
    let worse: Map<String, Value> = one(row("layer-split", 90.0, 0.5, Some(("layer-split", 80.0))));
    assert_eq!(differences(&base, &worse).len(), 1);
    let missing = Map::new();
    assert_eq!(differences(&base, &missing).len(), 1);
}
