//! `ft predict` and `ft explain` end to end: JSON twin, host files, profiles, errors.

mod common;
use common::{assert_ok, ft};

use ft_model::host::HostSpec;
use ft_model::profile::{store, Profile};
use ft_model::ModelSpec;

/// Short traffic runs keep the tests fast.
const QUICK: [&str; 4] = ["--steps", "60", "--warmup", "40"];

/// `ft predict --json` of the field report's host at 2 streams and a 38% offload miss rate,
/// with `extra` arguments.
fn predict_json(extra: &[&str]) -> serde_json::Value {
    let mut args = vec!["predict", "--streams", "2", "--miss-rate", "0.38", "--json"];
    args.extend(extra);
    args.extend(QUICK);
    let out = ft(&args);
    assert_ok(&out);
    serde_json::from_slice(&out.stdout).unwrap()
}

#[test]
fn predict_json_on_the_field_report() {
    let v = predict_json(&["--context", "1200"]);
    assert_eq!(v["decision"]["kind"], "hybrid");
    assert_eq!(v["decision"]["legacy_verdict"], "offload");
    assert_eq!(v["prediction"]["legacy"]["verdict"], "offload");
    let strategies = v["prediction"]["strategies"].as_array().unwrap();
    assert_eq!(strategies.len(), ft_model::StrategyKind::ALL.len());
    assert_eq!(strategies[0]["bound"], "pcie");
}

/// `--cpu-speed` (a what-if, or a speed measured elsewhere): the CPU side at half speed takes twice the CPU time per token
/// (the cpu strategy's CPU column), offload (no CPU share) is unchanged, and the source says
/// it.
#[test]
fn a_cpu_speed_what_if_scales_the_cpu_side_only() {
    let (full, half) = (
        predict_json(&["--cpu-speed", "1"]),
        predict_json(&["--cpu-speed", "0.5"]),
    );
    let get = |v: &serde_json::Value, kind: &str, path: &[&str]| -> f64 {
        let s = v["prediction"]["strategies"]
            .as_array()
            .unwrap()
            .iter()
            .find(|s| s["kind"] == kind)
            .unwrap();
        path.iter().fold(s, |x, k| &x[*k]).as_f64().unwrap()
    };
    assert_eq!(
        get(&full, "offload", &["step_us"]),
        get(&half, "offload", &["step_us"])
    );
    let (a, b) = (
        get(&full, "cpu", &["busy", "cpu_us"]),
        get(&half, "cpu", &["busy", "cpu_us"]),
    );
    assert!((b - 2.0 * a).abs() < 1e-6 * a, "cpu busy {a} -> {b}");
    assert!(get(&half, "cpu", &["step_us"]) > get(&full, "cpu", &["step_us"]));
    let source = half["prediction"]["source"].as_str().unwrap();
    assert!(
        source.contains("CPU side at 0.500x the probe's (given with --cpu-speed)"),
        "{source}"
    );
}

#[test]
fn predict_table_and_explain_text() {
    let mut args = vec!["predict", "--streams", "2"];
    args.extend(QUICK);
    let out = ft(&args);
    assert_ok(&out);
    let text = String::from_utf8(out.stdout).unwrap();
    for needle in [
        "offload",
        "hybrid(f=",
        "resident (n/a)",
        "choice:",
        "legacy ratio: 46.12 / 24.25 GB/s = 1.90",
        "threshold 2.00 -> offload",
    ] {
        assert!(text.contains(needle), "missing '{needle}' in\n{text}");
    }
    let mut args = vec!["explain", "--streams", "2"];
    args.extend(QUICK);
    let out = ft(&args);
    assert!(out.status.success());
    let text = String::from_utf8(out.stdout).unwrap();
    assert!(
        text.contains("Legacy rule: 46.12 / 24.25 GB/s = 1.90 <= 2.00 -> offload."),
        "{text}"
    );
    assert!(text.contains("verdict differs"), "{text}");
    // A host with two GPUs says so, and how its experts are placed.
    for cmd in ["predict", "explain"] {
        let mut args = vec![cmd, "--streams", "1", "--host", "2x-rtx3090-tp-ryzen7950x"];
        args.extend(QUICK);
        let out = ft(&args);
        assert!(out.status.success(), "{cmd}");
        let text = String::from_utf8(out.stdout).unwrap();
        assert!(
            text.contains("(2 GPUs, tensor-parallel; slots per GPU)"),
            "{cmd}: {text}"
        );
    }
}

#[test]
fn a_host_file_and_a_profile_file() {
    let dir = tempfile::tempdir().unwrap();
    // A host of our own: a fast CPU and a slow link, so hybrid should win and the ratio agree.
    let mut host = HostSpec::field_report();
    host.name = "test-host".into();
    host.cpu.moe_gbs = Some(150.0);
    host.pcie.gather_gbs = Some(12.0);
    host.pcie.h2d_gbs = 12.5;
    host.engine.dram_gbs = Some(400.0);
    let path = dir.path().join("test-host.toml");
    std::fs::write(&path, host.to_toml()).unwrap();
    let mut args = vec!["predict", "--host", path.to_str().unwrap(), "--json"];
    args.extend(QUICK);
    let out = ft(&args);
    assert_ok(&out);
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["prediction"]["legacy"]["verdict"], "hybrid");
    // A strategy with a CPU share wins: hybrid, or a layer split where it predicts more.
    let kind = v["decision"]["kind"].as_str().unwrap().to_string();
    assert!(
        ["hybrid", "layer-split", "layer-split-cached"].contains(&kind.as_str()),
        "{kind}"
    );
    assert_eq!(v["decision"]["legacy_agrees"], kind == "hybrid");

    // The same parameters through a profile file.
    let model = ModelSpec::preset("qwen3.8-flash-next").unwrap();
    let profile = Profile::of_host_spec(&host, &model).unwrap();
    let stored = store(dir.path(), &profile).unwrap();
    let mut args = vec!["predict", "--profile", stored.to_str().unwrap(), "--json"];
    args.extend(QUICK);
    let out = ft(&args);
    assert_ok(&out);
    let w: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(w["decision"]["kind"], kind.as_str());
    let a = v["prediction"]["strategies"][0]["step_us"]
        .as_f64()
        .unwrap();
    let b = w["prediction"]["strategies"][0]["step_us"]
        .as_f64()
        .unwrap();
    assert!((a - b).abs() < 1e-6 * a, "{a} vs {b}");
}

/// A profile records the engine settings its probe ran (`params.engine_settings`), and the
/// prediction times that engine's schedule: a profile of an engine that gathers a layer's
/// fetched experts in one chunk predicts offload (which fetches several experts a layer)
/// otherwise than the default's, and the strategies that fetch nothing (resident, cpu,
/// layer split) the same.
#[test]
fn a_profiles_engine_settings_are_what_it_predicts() {
    use ft_model::EngineSettings;
    let dir = tempfile::tempdir().unwrap();
    let model = ModelSpec::preset("qwen3.8-flash-next").unwrap();
    let mut profile = Profile::of_host_spec(&HostSpec::field_report(), &model).unwrap();
    let predict = |profile: &Profile, sub: &str| {
        let stored = store(&dir.path().join(sub), profile).unwrap();
        let mut args = vec![
            "predict",
            "--profile",
            stored.to_str().unwrap(),
            "--streams",
            "2",
            "--json",
        ];
        args.extend(QUICK);
        let out = ft(&args);
        assert_ok(&out);
        let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        let step = |kind: &str| {
            v["prediction"]["strategies"]
                .as_array()
                .unwrap()
                .iter()
                .find(|s| s["kind"] == kind)
                .unwrap_or_else(|| panic!("{kind} in {v}"))["step_us"]
                .as_f64()
        };
        ["offload", "resident", "cpu", "layer-split"].map(step)
    };
    let default = predict(&profile, "default");
    profile.params.engine_settings = EngineSettings { fetch_chunks: 1 };
    let one = predict(&profile, "one");
    let (off_default, off_one) = (default[0].unwrap(), one[0].unwrap());
    assert!(
        (off_one - off_default).abs() > 1e-6 * off_default,
        "offload: {off_one} us a step in one chunk, {off_default} at the default"
    );
    for (i, kind) in ["resident", "cpu", "layer-split"].iter().enumerate() {
        assert_eq!(one[i + 1], default[i + 1], "{kind}");
    }
    assert!(default[2].is_some(), "cpu predicts a step");
}

#[test]
fn bad_input_is_an_error_naming_it() {
    for (args, needle) in [
        (vec!["predict", "--streams", "0"], "--streams"),
        (
            vec!["predict", "--host", "/nonexistent/host.toml"],
            "host.toml",
        ),
        (vec!["predict", "--model", "llama"], "llama"),
        (vec!["explain", "--fetch-fraction", "2"], "--fetch-fraction"),
        (
            vec!["predict", "--profile", "/nonexistent/p.json"],
            "p.json",
        ),
        (vec!["predict", "--cpu-speed", "0"], "--cpu-speed"),
        (vec!["predict", "--cpu-speed=-0.5"], "--cpu-speed"),
    ] {
        let out = ft(&args);
        assert_eq!(out.status.code(), Some(2), "{args:?}");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.contains(needle), "{args:?}: {err}");
    }
}

/// `--cpu-check host`: the CPU side is timed here (a bank of the model on the host device)
/// and set against the profile's own check of the same work; the prediction's CPU side is
/// scaled by exactly that speed (the cpu strategy's CPU busy time divided by it), the JSON
/// says both checks, and a profile without checks is refused naming the flag.
#[test]
fn a_cpu_check_scales_the_cpu_side_by_the_speed_it_measures() {
    use ft_model::profile::CpuCheck;
    let dir = tempfile::tempdir().unwrap();
    let toml = dir.path().join("tiny.toml");
    std::fs::write(
        &toml,
        "name = \"tiny-check\"\nformat = \"int8\"\n\n[geometry]\nhidden = 128\nintermediate = 64\nexperts = 16\ntop_k = 4\nmoe_layers = 2\n",
    )
    .unwrap();
    let model = ModelSpec::resolve(toml.to_str().unwrap()).unwrap();
    let mut profile = Profile::of_host_spec(&HostSpec::field_report(), &model).unwrap();
    profile.params.cpu_threads = 1;
    let plain = store(&dir.path().join("plain"), &profile).unwrap();
    profile.cpu_checks = vec![CpuCheck {
        experts: 4,
        tokens_per_expert: 1,
        expert_bytes: model.expert_bytes() as f64,
        threads: 1,
        time_us: 1e6,
        reps: 1,
    }];
    let checked = store(&dir.path().join("checked"), &profile).unwrap();
    let run = |profile: &std::path::Path, extra: &[&str]| {
        let mut args = vec![
            "predict",
            "--model",
            toml.to_str().unwrap(),
            "--profile",
            profile.to_str().unwrap(),
            "--json",
        ];
        args.extend(extra);
        args.extend(QUICK);
        ft(&args)
    };
    let base: serde_json::Value = {
        let out = run(&checked, &[]);
        assert_ok(&out);
        serde_json::from_slice(&out.stdout).unwrap()
    };
    assert!(base["cpu_check"].is_null());
    let out = run(&checked, &["--cpu-check", "host"]);
    assert_ok(&out);
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let c = &v["cpu_check"];
    let (now, probe) = (
        c["now"]["time_us"].as_f64().unwrap(),
        c["probe"]["time_us"].as_f64().unwrap(),
    );
    let speed = c["speed"].as_f64().unwrap();
    assert_eq!(probe, 1e6);
    assert!((speed - probe / now).abs() < 1e-9 * speed, "{c}");
    assert_eq!(c["now"]["experts"], 4);
    assert_eq!(c["now"]["threads"], 1);
    let cpu_busy = |v: &serde_json::Value| {
        v["prediction"]["strategies"]
            .as_array()
            .unwrap()
            .iter()
            .find(|s| s["kind"] == "cpu")
            .unwrap()["busy"]["cpu_us"]
            .as_f64()
            .unwrap()
    };
    let (a, b) = (cpu_busy(&base), cpu_busy(&v));
    assert!(
        (b * speed - a).abs() < 1e-6 * a,
        "cpu busy {a} -> {b} at {speed}x"
    );
    let source = v["prediction"]["source"].as_str().unwrap();
    assert!(
        source.contains("the probe's (the CPU check now:"),
        "{source}"
    );
    // A profile without checks, a device that is not one, a check without a profile.
    let out = run(&plain, &["--cpu-check", "host"]);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("--cpu-check") && err.contains("no CPU check"),
        "{err}"
    );
    let out = run(&checked, &["--cpu-check", "tpu"]);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("--cpu-check tpu"), "{err}");
    let out = ft(&["predict", "--cpu-check", "host"]);
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("--profile"));
}
