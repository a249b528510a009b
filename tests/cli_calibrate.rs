//! `ft calibrate` end to end: it recovers engine terms planted in the simulator (the slow
//! reference) from the runs `ft simulate` measures, says what a thin set of runs cannot
//! identify, reads FreeToken's `benchbw.json`, writes a profile the other commands accept,
//! and refuses malformed observation files by row and column (exit 2).

mod common;

use common::{ft, json_ok, stderr, write};
use ft_model::host::HostSpec;
use ft_model::profile::Profile;
use ft_model::ModelSpec;
use std::process::Output;

/// The field report's geometry cut to 4 layers: each run simulates in milliseconds.
const FLASH4: &str = r#"
name = "flash4"
format = "nvfp4"
[geometry]
hidden = 2560
intermediate = 640
experts = 512
top_k = 10
moe_layers = 4
shared_experts = 1
"#;

const HOST: &str = "rtx4090-2x-xeon4310";

/// Planted engine terms: the CPU side serving at 0.4x its bench, 150 us per hybrid
/// layer-step, 8 us per layer and stream for the rest of the step.
const CPU_RATE: f64 = 0.4;
const FIXED_HYBRID_US: f64 = 150.0;
const REST_STREAM_US: f64 = 8.0;

/// A profile of the field host with the planted terms, as `ft simulate --host` reads it.
fn planted_profile(dir: &std::path::Path, model: &str) -> String {
    let m = ModelSpec::resolve(model).unwrap();
    let mut p = Profile::of_host_spec(&HostSpec::field_report(), &m).unwrap();
    p.params.cpu_serving_slowdown = 1.0 / CPU_RATE - 1.0;
    p.params.overhead.hybrid_us = FIXED_HYBRID_US;
    p.params.engine.rest_stream_us = REST_STREAM_US;
    p.validate().unwrap();
    write(dir, "planted.json", &serde_json::to_string(&p).unwrap())
}

/// Observation rows of what `ft simulate` measures on `host` for `strategies` at fetch
/// fraction `f` and `streams`.
fn simulated_rows(
    host: &str,
    model: &str,
    strategies: &str,
    f: &str,
    streams: &str,
) -> Vec<String> {
    let out = ft(&[
        "simulate",
        "--host",
        host,
        "--model",
        model,
        "--strategy",
        strategies,
        "--fetch-fraction",
        f,
        "--streams",
        streams,
        "--cache-slots",
        "400",
        "--context",
        "1024",
        "--output-tokens",
        "64",
        "--steps",
        "60",
        "--warmup",
        "40",
        "--json",
    ]);
    let v = json_ok(&out);
    let list = match v {
        serde_json::Value::Array(a) => a,
        one => vec![one],
    };
    let mut rows = Vec::new();
    for r in list {
        let s = r["config"]["streams"].as_u64().unwrap();
        for st in r["strategies"].as_array().unwrap() {
            let name = st["strategy"].as_str().unwrap_or_default().to_string();
            let tok = st["sim"]["tok_s_per_stream"].as_f64().unwrap();
            let ff = st["fetch_fraction"].as_f64().unwrap();
            let (kind, fcol) = if name.starts_with("hybrid") {
                ("hybrid", format!("{ff}"))
            } else {
                (name.as_str(), String::new())
            };
            let kind = kind.to_string();
            rows.push(format!(
                "{kind},{fcol},{s},1024,64,400,{tok},stream,decode,sim-{kind}-{s}"
            ));
        }
    }
    rows
}

/// `ft calibrate` of the observations file `obs` for `model`, with `more` arguments (the host
/// inputs, the sampling, the output); its output.
fn calibrate(obs: &str, model: &str, more: &[&str]) -> Output {
    let mut args = vec!["calibrate", "--observations", obs, "--model", model];
    args.extend_from_slice(more);
    ft(&args)
}

const HEADER: &str =
    "strategy,fetch_fraction,streams,prompt_tokens,output_tokens,cache_slots,tok_s,per,measure,label";

#[test]
fn recovers_terms_planted_in_the_simulator_within_their_standard_errors() {
    let dir = tempfile::tempdir().unwrap();
    let model = write(dir.path(), "flash4.toml", FLASH4);
    let planted = planted_profile(dir.path(), &model);
    let mut rows = simulated_rows(&planted, &model, "offload,hybrid,cpu", "0.3", "1,2,4");
    rows.extend(simulated_rows(&planted, &model, "hybrid", "0.7", "1,4"));
    let csv = format!("{HEADER}\n{}\n", rows.join("\n"));
    let obs = write(dir.path(), "runs.csv", &csv);
    let out_profile = dir.path().join("cal.json");
    let out = calibrate(
        &obs,
        &model,
        &[
            "--host",
            HOST,
            "--terms",
            "cpu-serving-rate,fixed-gather-and-cpu,rest-per-stream,link-rate",
            "--out",
            out_profile.to_str().unwrap(),
            "--json",
        ],
    );
    let v = json_ok(&out);
    let terms = v["calibration"]["terms"].as_array().unwrap();
    let term = |name: &str| terms.iter().find(|t| t["term"] == name).unwrap().clone();
    for (name, truth) in [
        ("cpu-serving-rate", CPU_RATE),
        ("fixed-gather-and-cpu", FIXED_HYBRID_US),
        ("rest-per-stream", REST_STREAM_US),
        ("link-rate", 1.0),
    ] {
        let t = term(name);
        assert_eq!(t["identified"], true, "{t}");
        let (value, se) = (t["value"].as_f64().unwrap(), t["se"].as_f64().unwrap());
        // The simulator and the model differ by up to 2% per run (sim/tests/schedule_properties).
        assert!(
            (value - truth).abs() <= 3.0 * se + 0.05 * truth,
            "{name}: {value} +- {se}, planted {truth}"
        );
    }
    let fit = &v["calibration"]["fit"];
    assert!(fit["rms_calibrated"].as_f64().unwrap() < 0.03, "{fit}");
    assert!(fit["rms_host_only"].as_f64().unwrap() > 0.2, "{fit}");
    // The calibrated profile is one every command reads.
    let p = out_profile.to_str().unwrap();
    let pred = json_ok(&ft(&[
        "predict",
        "--profile",
        p,
        "--model",
        &model,
        "--cache-slots",
        "400",
        "--steps",
        "40",
        "--warmup",
        "20",
        "--measure",
        "client-e2e",
        "--json",
    ]));
    assert!(
        pred["measure"][0]["end_to_end"]["ttft_us"]
            .as_f64()
            .unwrap()
            > 0.0,
        "{pred}"
    );
    json_ok(&ft(&[
        "simulate",
        "--host",
        p,
        "--model",
        &model,
        "--streams",
        "1",
        "--cache-slots",
        "400",
        "--steps",
        "20",
        "--warmup",
        "10",
        "--json",
    ]));
}

#[test]
fn a_thin_set_names_what_it_cannot_identify_and_the_run_that_would() {
    let dir = tempfile::tempdir().unwrap();
    let model = write(dir.path(), "flash4.toml", FLASH4);
    let obs = write(
        dir.path(),
        "thin.csv",
        &format!("{HEADER}\noffload,,1,1024,64,400,500,stream,decode,a\noffload,,1,1024,64,400,510,stream,decode,b\n"),
    );
    let thin = |output: &str| {
        calibrate(
            &obs,
            &model,
            &["--host", HOST, "--steps", "40", "--warmup", "20", output],
        )
    };
    let v = json_ok(&thin("--json"));
    let id = &v["calibration"]["identifiability"];
    let left: Vec<&str> = id["unidentified"]
        .as_array()
        .unwrap()
        .iter()
        .map(|u| u["term"].as_str().unwrap())
        .collect();
    assert!(left.contains(&"cpu-serving-rate"), "{id}");
    assert!(left.contains(&"fixed-gather-and-cpu"), "{id}");
    let s = &id["suggestion"];
    assert_ne!(s["strategy"], "offload", "{id}");
    assert!(!s["identifies"].as_array().unwrap().is_empty(), "{id}");
    // The table says it in words.
    let out = thin("--no-loo");
    common::assert_ok(&out);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("not identified by these runs"), "{text}");
    assert!(text.contains("one more run that would identify"), "{text}");
}

/// One run fits no term: a fit keeps a degree of freedom for its standard errors, so the
/// table and the JSON say the term is left out and why, and name the run that would
/// identify it; with that run added the term is fitted with a standard error.
#[test]
fn one_run_fits_no_term_and_names_the_run_that_would() {
    let dir = tempfile::tempdir().unwrap();
    let model = write(dir.path(), "flash4.toml", FLASH4);
    let one_row = "offload,,1,1024,64,400,500,stream,decode,a";
    let calibrate_rows = |name: &str, rows: &str, more: &[&str]| {
        let obs = write(dir.path(), name, &format!("{HEADER}\n{rows}\n"));
        let mut args = vec![
            "--host",
            HOST,
            "--terms",
            "link-rate",
            "--steps",
            "40",
            "--warmup",
            "20",
        ];
        args.extend_from_slice(more);
        calibrate(&obs, &model, &args)
    };
    let v = json_ok(&calibrate_rows("one.csv", one_row, &["--json"]));
    let cal = &v["calibration"];
    assert_eq!(cal["fit"]["dof"], 1, "{cal}");
    let link = &cal["terms"][0];
    assert_eq!(link["identified"], false, "{link}");
    let left = &cal["identifiability"]["unidentified"][0];
    assert_eq!(left["term"], "link-rate", "{cal}");
    assert!(
        left["reason"]
            .as_str()
            .unwrap()
            .contains("degree of freedom"),
        "{left}"
    );
    let s = &cal["identifiability"]["suggestion"];
    assert_eq!(s["identifies"][0], "link-rate", "{cal}");
    let out = calibrate_rows("one.csv", one_row, &["--no-loo"]);
    common::assert_ok(&out);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("degree of freedom"), "{text}");
    assert!(text.contains("one more run that would identify"), "{text}");

    let rows = format!("{one_row}\noffload,,2,1024,64,400,260,stream,decode,b");
    let v = json_ok(&calibrate_rows("two.csv", &rows, &["--json", "--no-loo"]));
    let cal = &v["calibration"];
    assert_eq!(cal["fit"]["dof"], 1, "{cal}");
    let link = &cal["terms"][0];
    assert_eq!(link["identified"], true, "{link}");
    assert!(link["se"].as_f64().unwrap() > 0.0, "{link}");
}

#[test]
fn reads_freetoken_benchbw_json_and_marks_what_it_derived() {
    let dir = tempfile::tempdir().unwrap();
    let model = write(dir.path(), "flash4.toml", FLASH4);
    // FreeToken's own document (its bench at its tuning geometry).
    let bench = write(
        dir.path(),
        "benchbw.json",
        r#"{"version": 4, "threshold": 2.0,
            "gpu": {"index": 0, "name": "NVIDIA GeForce RTX 4090", "uuid": null},
            "dtypes": {"nvfp4": "offload"},
            "dtype_kernels": {"nvfp4": {"cpu_moe_gbs": 46.12, "pcie_gather_gbs": 24.25,
                "cpu_moe_overlap_gbs": 33.4, "pcie_gather_overlap_gbs": 12.8,
                "recommended": "offload"}},
            "workloads": {}}"#,
    );
    let obs = write(
        dir.path(),
        "runs.csv",
        &format!("{HEADER}\noffload,,1,1024,64,400,500,stream,decode,a\nhybrid,0.3,1,1024,64,400,300,stream,decode,b\n"),
    );
    let from_bench = |more: &[&str]| {
        let mut args = vec![
            "--freetoken",
            bench.as_str(),
            "--steps",
            "30",
            "--warmup",
            "20",
        ];
        args.extend_from_slice(more);
        args.push("--json");
        calibrate(&obs, &model, &args)
    };
    let out = from_bench(&[]);
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    assert!(stderr(&out).contains("--cpu-cores"), "{}", stderr(&out));
    let v = json_ok(&from_bench(&["--cpu-cores", "24"]));
    let rec = &v["calibration"];
    assert!(
        rec["host_inputs"]
            .as_str()
            .unwrap()
            .contains("benchbw.json"),
        "{rec}"
    );
    let derived: Vec<&str> = rec["derived"]
        .as_array()
        .unwrap()
        .iter()
        .map(|d| d.as_str().unwrap())
        .collect();
    assert!(
        derived.iter().any(|d| d.starts_with("pcie.h2d_gbs")),
        "{derived:?}"
    );
    assert!(
        derived.iter().any(|d| d.contains("tuning geometry")),
        "{derived:?}"
    );
}

#[test]
fn malformed_observations_name_the_row_and_column_and_exit_2() {
    let dir = tempfile::tempdir().unwrap();
    let model = write(dir.path(), "flash4.toml", FLASH4);
    for (csv, want) in [
        (format!("{HEADER}\noffload,,1,1024,64,400,500,stream,decode,a\noffload,,,1024,64,400,500,stream,decode,b\n"), "row 2: streams"),
        (format!("{HEADER}\nhybrid,,1,1024,64,400,500,stream,decode,a\n"), "row 1: fetch_fraction"),
        (format!("{HEADER}\noffload,,1,1024,64,400,-3,stream,decode,a\n"), "row 1: tok_s"),
        (format!("{HEADER},speed\noffload,,1,1024,64,400,5,stream,decode,a,9\n"), "speed"),
        (format!("{HEADER}\n"), "no runs"),
    ] {
        let obs = write(dir.path(), "bad.csv", &csv);
        let out = calibrate(&obs, &model, &["--host", HOST]);
        assert_eq!(out.status.code(), Some(2), "{csv}: {}", stderr(&out));
        let e = stderr(&out);
        assert!(e.contains(want) && e.contains("bad.csv"), "{csv}: {e}");
        assert!(!e.contains("panicked"), "{e}");
    }
}
