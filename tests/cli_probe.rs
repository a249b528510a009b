//! `ft probe` end to end on the host-emulated device with a tiny model: the probe runs, the
//! fit reports every parameter with its standard error and the residuals, the profile is
//! cached (and reused, and re-probed when stale or forced), the copy and the reference
//! engine's benchbw.json are written, and bad input is an error naming the input.

mod common;
use common::{assert_ok, stderr};

use std::path::Path;

#[test]
fn probe_fits_caches_reuses_and_exports() {
    let dir = tempfile::tempdir().unwrap();
    let m = &common::write(dir.path(), "tiny.toml", common::TINY_MODEL);
    let cache = dir.path().join("cache");
    let copy = dir.path().join("copy.json");
    let bb = dir.path().join("benchbw.json");
    let (c, b) = (copy.to_str().unwrap(), bb.to_str().unwrap());

    let mut args = vec![
        "probe",
        "--model",
        m,
        "--json",
        "--profile-out",
        c,
        "--export-freetoken",
        b,
    ];
    args.extend_from_slice(common::PROBE_FAST);
    let r = common::json_ok(&common::ft_cached(&cache, &args));
    assert_eq!(r["reused"], false);
    let outcome = &r["outcome"];
    assert!(outcome["wall_s"].as_f64().unwrap() < 20.0);
    // Every parameter has a value, a standard error and an interval; the fitted ones a
    // positive standard error.
    let est = r["estimates"].as_array().unwrap();
    assert!(est.len() >= 15, "{est:?}");
    let fitted: Vec<&serde_json::Value> = est.iter().filter(|e| !e["stage"].is_null()).collect();
    assert!(!fitted.is_empty());
    for e in &fitted {
        assert!(e["se"].as_f64().unwrap() >= 0.0, "{e}");
        let (lo, hi) = (
            e["interval"][0].as_f64().unwrap(),
            e["interval"][1].as_f64().unwrap(),
        );
        assert!(
            lo <= e["value"].as_f64().unwrap() && e["value"].as_f64().unwrap() <= hi,
            "{e}"
        );
    }
    // Residuals per probe, and for the end-to-end validation runs.
    let probes: Vec<&str> = r["residuals"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s["probe"].as_str().unwrap())
        .collect();
    for p in ["gather", "cpu-step", "gpu-experts", "dense", "round-trip"] {
        assert!(probes.contains(&p), "{probes:?}");
    }
    assert!(
        probes.iter().any(|p| p.starts_with("step validation")),
        "{probes:?}"
    );

    // The cached profile and its copy are the same profile.
    let cached = Path::new(r["profile_path"].as_str().unwrap());
    assert!(cached.starts_with(&cache), "{}", cached.display());
    let a: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(cached).unwrap()).unwrap();
    let b2: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&copy).unwrap()).unwrap();
    assert_eq!(a, b2);
    assert_eq!(a["key"]["model"]["geometry"]["moe_layers"], 2);

    // The export is what the reference engine reads, with the model's verdict and fraction.
    let doc: ferrox_core::qstar::BandwidthProfile =
        serde_json::from_str(&std::fs::read_to_string(&bb).unwrap()).unwrap();
    assert_eq!(doc.version, Some(4));
    let verdict = r["export"]["verdict"].as_str().unwrap();
    let backend = doc.backend_for("nvfp4").expect("an nvfp4 verdict");
    assert_eq!(serde_json::to_value(backend).unwrap(), verdict);
    let q = r["export"]["fetch_fraction_q16"].as_u64().unwrap();
    assert_eq!(doc.policy_for("nvfp4").fraction_q16(), q);
    assert!(doc.matches_gpu(Some(r["device"]["name"].as_str().unwrap())));

    // A second run reuses the fresh profile without measuring.
    let r2 = common::json_ok(&common::ft_cached(&cache, &args));
    assert_eq!(r2["reused"], true);
    assert!(r2["outcome"].is_null());
    assert_eq!(r2["estimates"], r["estimates"]);

    // A stale key (another program version) is re-probed, saying why.
    let mut stale = a.clone();
    stale["key"]["program_version"] = serde_json::json!("0.0.0-old");
    std::fs::write(cached, serde_json::to_vec(&stale).unwrap()).unwrap();
    let r3 = common::json_ok(&common::ft_cached(&cache, &args));
    assert_eq!(r3["reused"], false);
    let why = r3["reprobe_reasons"].to_string();
    assert!(why.contains("program version"), "{why}");

    // The human table names the parameters and the residuals.
    let mut table = vec!["probe", "--model", m, "--force"];
    table.extend_from_slice(common::PROBE_FAST);
    let out = common::ft_cached(&cache, &table);
    assert_ok(&out);
    let text = String::from_utf8_lossy(&out.stdout);
    for needle in [
        "gather_gbs",
        "std err",
        "residuals",
        "end to end",
        "cpu-step",
    ] {
        assert!(text.contains(needle), "missing {needle}:\n{text}");
    }

    // `ft run --fetch-fraction auto` takes the probed profile as its host.
    let run_args = vec![
        "run",
        "--device",
        "host",
        "--model",
        m,
        "--strategy",
        "hybrid",
        "--fetch-fraction",
        "auto",
        "--host",
        c,
        "--steps",
        "2",
        "--warmup",
        "1",
        "--cache-slots",
        "8",
        "--context",
        "16",
        "--threads",
        "1",
        "--json",
    ];
    let run = common::ft_cached(&cache, &run_args);
    let v = common::json_ok(&run);
    let f = v["fetch_fraction"].as_f64().unwrap();
    assert!((0.0..=1.0).contains(&f), "{f}");
    // The profile kept its CPU check at the run's one thread: the fraction is decided at the
    // check before the first round, and it is the one `ft predict` finds with the CPU side
    // at that speed.
    let source = v["fetch_source"].as_str().unwrap();
    assert!(
        source.contains("auto") && source.contains("CPU check before the first round"),
        "{source}"
    );
    let speed = v["auto_cpu_speed"].as_f64().unwrap();
    assert!(speed.is_finite() && speed > 0.0, "{speed}");
    let predict = |extra: &[&str]| {
        let mut a = vec![
            "predict",
            "--model",
            m,
            "--profile",
            c,
            "--cache-slots",
            "8",
            "--context",
            "16",
            "--streams",
            "1",
            "--steps",
            "2",
            "--warmup",
            "1",
            "--json",
        ];
        a.extend_from_slice(extra);
        common::json_ok(&common::ft_cached(&cache, &a))["prediction"]["fetch_search"]["chosen"]
            .as_f64()
            .unwrap()
    };
    let at_speed = predict(&["--cpu-speed", &speed.to_string()]);
    assert!(
        (f - at_speed).abs() < 1e-9,
        "run {f}, predict at {speed}x {at_speed}"
    );
    // --no-cpu-check: the fraction at the probed speed, no speed reported.
    let mut probed = run_args.clone();
    probed.push("--no-cpu-check");
    let w = common::json_ok(&common::ft_cached(&cache, &probed));
    assert!(w["auto_cpu_speed"].is_null(), "{}", w["auto_cpu_speed"]);
    let f0 = w["fetch_fraction"].as_f64().unwrap();
    assert!(
        (f0 - predict(&[])).abs() < 1e-9,
        "run {f0}, predict {}",
        predict(&[])
    );
}

/// `--slowdown-threads` runs the CPU strategies again with another pool size; the profile
/// carries the slowdown measured there, and `ft validate retarget` to that count uses it.
#[test]
fn a_second_thread_count_calibrates_the_slowdown_there() {
    let dir = tempfile::tempdir().unwrap();
    let m = &common::write(dir.path(), "tiny.toml", common::TINY_MODEL);
    let cache = dir.path().join("cache");
    let copy = dir.path().join("copy.json");
    let c = copy.to_str().unwrap();
    let mut args = vec!["probe", "--model", m, "--json", "--profile-out", c];
    // common::PROBE_FAST with two serving threads and a second count of one.
    let mut fast = common::PROBE_FAST.to_vec();
    let t = fast.iter().position(|a| *a == "--threads").unwrap();
    fast[t + 1] = "2";
    args.extend_from_slice(&fast);
    args.extend_from_slice(&["--slowdown-threads", "1"]);
    let r = common::json_ok(&common::ft_cached(&cache, &args));
    let runs = r["outcome"]["e2e"].as_array().unwrap();
    assert!(runs.iter().any(|e| e["threads"] == 1), "{runs:?}");
    let profile: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&copy).unwrap()).unwrap();
    let at = profile["params"]["cpu_serving_slowdown_at"]
        .as_array()
        .unwrap();
    assert_eq!(at.len(), 1, "{at:?}");
    assert_eq!(at[0]["threads"], 1);
    let measured = at[0]["slowdown"].as_f64().unwrap();
    let out = dir.path().join("t1.json");
    let o = common::ft_cached(
        &cache,
        &[
            "validate",
            "retarget",
            "--profile",
            c,
            "--threads",
            "1",
            "--out",
            out.to_str().unwrap(),
        ],
    );
    assert_ok(&o);
    let t1: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&out).unwrap()).unwrap();
    assert_eq!(t1["params"]["cpu_threads"], 1);
    assert_eq!(
        t1["params"]["cpu_serving_slowdown"].as_f64().unwrap(),
        measured
    );
    // The retargeted profile keeps the serving count as a knot (its standard error unknown,
    // JSON null) and reads back: a prediction from it runs.
    let knots = t1["params"]["cpu_serving_slowdown_at"].as_array().unwrap();
    assert!(knots.iter().any(|k| k["threads"] == 2), "{knots:?}");
    let o = common::ft_cached(
        &cache,
        &[
            "predict",
            "--profile",
            out.to_str().unwrap(),
            "--model",
            m,
            "--json",
        ],
    );
    assert_ok(&o);
    assert!(
        common::json_ok(&o)["prediction"].is_object(),
        "{}",
        stderr(&o)
    );
}

#[test]
fn bad_input_is_an_error_naming_it() {
    let dir = tempfile::tempdir().unwrap();
    let out = common::ft_cached(
        dir.path(),
        &["probe", "--model", "no-such-model", "--device", "host"],
    );
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("--model") && err.contains("no-such-model"),
        "{err}"
    );

    let m = &common::write(dir.path(), "tiny.toml", common::TINY_MODEL);
    let out = common::ft_cached(
        dir.path(),
        &[
            "probe",
            "--model",
            m,
            "--device",
            "host",
            "--cache-residency",
            "1.5",
        ],
    );
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("--cache-residency"));

    if !cfg!(feature = "cuda") {
        let out = common::ft_cached(dir.path(), &["probe", "--model", m, "--device", "cuda"]);
        assert_eq!(out.status.code(), Some(2));
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.contains("CUDA"), "{err}");
    }
}
