//! `ft run` end to end on the host-emulated device with a tiny model TOML.

mod common;
use common::{assert_ok, ft, write, TINY_RUN_MODEL as TINY};

/// The tiny run the tests start from: the host device, 2 streams, 4 steps after 2 warm-up,
/// 24 cache slots, context 16, one CPU thread.
fn tiny_run(model: &str) -> Vec<&str> {
    vec![
        "run",
        "--device",
        "host",
        "--model",
        model,
        "--streams",
        "2",
        "--steps",
        "4",
        "--warmup",
        "2",
        "--cache-slots",
        "24",
        "--context",
        "16",
        "--threads",
        "1",
    ]
}

#[test]
fn run_on_the_host_device_prints_json_a_trace_and_numerics() {
    let dir = tempfile::tempdir().unwrap();
    let model = write(dir.path(), "tiny.toml", TINY);
    let trace = dir.path().join("trace.json");
    let record = dir.path().join("routing.jsonl");
    let mut args = tiny_run(&model);
    args.extend([
        "--strategy",
        "hybrid",
        "--fetch-fraction",
        "0.5",
        "--compare-numerics",
        "--json",
        "--trace-out",
        trace.to_str().unwrap(),
        "--record",
        record.to_str().unwrap(),
    ]);
    let out = ft(&args);
    assert_ok(&out);
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("stdout is JSON");
    assert_eq!(v["model"], "tiny-cli");
    assert_eq!(v["strategy"], "hybrid(f=0.500)");
    assert_eq!(v["layers"], 4);
    assert_eq!(v["device"]["kind"], "host");
    assert_eq!(v["engine"]["fetch-chunks"], 4, "the engine's default");
    let s = &v["summary"];
    assert_eq!(s["steps"], 4);
    assert_eq!(s["warmup_steps"], 2);
    assert_eq!(s["streams"], 2);
    let per_stream = s["tok_s_per_stream"].as_f64().unwrap();
    let total = s["tok_s_total"].as_f64().unwrap();
    assert!(per_stream > 0.0 && (total - 2.0 * per_stream).abs() < 1e-6 * total);
    let miss = s["miss_rate"].as_f64().unwrap();
    assert!((0.0..=1.0).contains(&miss));
    // Every step, every layer, with the plan's counts adding up.
    let steps = v["step_records"].as_array().unwrap();
    assert_eq!(steps.len(), 6);
    for st in steps {
        let layers = st["layers"].as_array().unwrap();
        assert_eq!(layers.len(), 4);
        for l in layers {
            let m = l["misses"].as_u64().unwrap();
            assert_eq!(
                m,
                l["fetched"].as_u64().unwrap() + l["cpu"].as_u64().unwrap()
            );
        }
    }
    assert!(v["pcie"]["linear_h2d_gbs"].as_f64().unwrap() > 0.0);
    // What held the steps while no gather was on the link: the causes add up to the total,
    // which is no more than a layer's share of the step.
    let idle = &s["link_idle_per_layer"];
    let total = idle["total_us"].as_f64().unwrap();
    let causes = [
        "dense",
        "prepare",
        "hit_experts",
        "fetched_experts",
        "combine",
        "cpu",
        "copies",
        "host",
        "gaps",
    ];
    let parts: f64 = causes
        .iter()
        .map(|c| idle[format!("{c}_us")].as_f64().unwrap())
        .sum();
    assert!(
        total > 0.0 && (parts - total).abs() < 1e-6 * total,
        "{idle}"
    );
    assert!(
        total <= s["step_us"]["max"].as_f64().unwrap() / 4.0 + 1e-6,
        "{idle}"
    );
    // W4A8 on both sides by default and the fixed combine: fresh, warmed and offload are
    // bit-identical.
    let n = &v["numerics"];
    assert_eq!(n["gpu_act"], "int8");
    assert_eq!(n["cpu_act"], "int8");
    assert_eq!(n["expect_bit_identical"], true);
    assert_eq!(n["fresh_vs_warmed"]["bit_identical"], true);
    assert_eq!(n["vs_offload"]["max_rel_l2"].as_f64().unwrap(), 0.0, "{n}");
    // The trace parses and has the four lanes.
    let t: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&trace).unwrap()).unwrap();
    let names: Vec<String> = t["traceEvents"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|e| e["name"] == "thread_name")
        .map(|e| e["args"]["name"].as_str().unwrap().to_string())
        .collect();
    assert_eq!(
        names,
        ["GPU compute", "copy / PCIe", "CPU pool", "host sync"]
    );
    // The routing was recorded with each stream's requests (a warm-up one, then the
    // measured one), and `ft routing stats` reads them back.
    let text = std::fs::read_to_string(&record).unwrap();
    let records: Vec<serde_json::Value> = text
        .lines()
        .skip(1)
        .map(|l| serde_json::from_str(l).expect("a trace record"))
        .collect();
    assert_eq!(records.len(), 6 * 2 * 4, "steps x streams x layers");
    for r in &records {
        let (step, stream) = (r["step"].as_u64().unwrap(), r["stream"].as_u64().unwrap());
        let (phase, token) = if step < 2 {
            ("warmup", step)
        } else {
            ("measured", step - 2)
        };
        assert_eq!(r["request"], format!("s{stream}-{phase}"), "{r}");
        assert_eq!(r["token"], token, "{r}");
    }
    let out = ft(&[
        "routing",
        "stats",
        "--routing",
        record.to_str().unwrap(),
        "--steps",
        "4",
        "--warmup",
        "2",
        "--union-streams",
        "2",
        "--per-layer",
        "4",
        "--global",
        "4",
        "--hot",
        "2",
        "--json",
    ]);
    assert_ok(&out);
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("stdout is JSON");
    let q = &v["requests"];
    assert_eq!(q["steps"], 6);
    assert_eq!(q["tagged"], 12);
    assert_eq!(q["requests"], 4);
    assert_eq!(q["token_gaps"], 0);
    let ids: Vec<&str> = q["listed"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["request"].as_str().unwrap())
        .collect();
    assert_eq!(
        ids,
        ["s0-warmup", "s1-warmup", "s0-measured", "s1-measured"]
    );
}

#[test]
fn the_human_table_names_the_strategy_and_layers() {
    let dir = tempfile::tempdir().unwrap();
    let model = write(dir.path(), "tiny.toml", TINY);
    let out = ft(&[
        "run",
        "--device",
        "host",
        "--model",
        &model,
        "--strategy",
        "offload",
        "--streams",
        "1",
        "--steps",
        "2",
        "--warmup",
        "1",
        "--cache-slots",
        "16",
        "--context",
        "8",
        "--layers",
        "2",
    ]);
    assert_ok(&out);
    let text = String::from_utf8(out.stdout).unwrap();
    assert!(
        text.contains("offload") && text.contains("2 of 4 layers"),
        "{text}"
    );
    assert!(
        text.contains("--layers"),
        "the note says fewer layers were run: {text}"
    );
    assert!(text.contains("decode tok/s per stream"), "{text}");
    assert!(text.contains("link idle per layer"), "{text}");
    assert!(
        !text.contains("CPU share"),
        "offload has no CPU share: {text}"
    );
    let mut cpu_run = tiny_run(&model);
    cpu_run.extend(["--strategy", "cpu"]);
    let cpu = ft(&cpu_run);
    assert_ok(&cpu);
    let text = String::from_utf8(cpu.stdout).unwrap();
    assert!(
        text.contains("CPU share") && text.contains("STREAM read of the bank"),
        "{text}"
    );
}

#[test]
fn a_model_too_large_for_this_machine_is_refused_naming_layers() {
    let dir = tempfile::tempdir().unwrap();
    // qwen3.8-flash-next's experts with 4000 layers: 5.7 TB of bank, more than any host.
    let huge = TINY
        .replace("hidden = 128", "hidden = 2560")
        .replace("intermediate = 64", "intermediate = 640")
        .replace("experts = 16", "experts = 512")
        .replace("top_k = 4", "top_k = 10")
        .replace("moe_layers = 4", "moe_layers = 4000");
    let model = write(dir.path(), "huge.toml", &huge);
    let out = ft(&[
        "run",
        "--device",
        "host",
        "--model",
        &model,
        "--strategy",
        "offload",
        "--cache-slots",
        "100",
    ]);
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("--layers") && err.contains("4000 layers x 512 experts"),
        "{err}"
    );
}

#[test]
fn flags_are_checked_before_any_work() {
    let dir = tempfile::tempdir().unwrap();
    let model = write(dir.path(), "tiny.toml", TINY);
    let cases: &[(&[&str], &str)] = &[
        (
            &[
                "--strategy",
                "hybrid",
                "--fetch-fraction",
                "auto",
                "--cache-slots",
                "8",
            ],
            "--host",
        ),
        (
            &["--strategy", "hybrid", "--cache-slots", "8"],
            "--fetch-fraction",
        ),
        (&["--strategy", "offload"], "--cache-slots"),
        (&["--strategy", "fused", "--cache-slots", "8"], "--strategy"),
        (
            &[
                "--strategy",
                "offload",
                "--cache-slots",
                "8",
                "--layers",
                "9",
            ],
            "--layers",
        ),
        (
            &[
                "--strategy",
                "hybrid",
                "--fetch-fraction",
                "1.5",
                "--cache-slots",
                "8",
            ],
            "--fetch-fraction",
        ),
        (
            &[
                "--strategy",
                "hybrid",
                "--fetch-fraction",
                "0.5",
                "--cache-slots",
                "8",
                "--host-submit",
                "sideways",
            ],
            "--host-submit",
        ),
    ];
    for (extra, flag) in cases {
        let mut args = vec!["run", "--device", "host", "--model", &model];
        args.extend_from_slice(extra);
        let out = ft(&args);
        assert_eq!(out.status.code(), Some(2), "{extra:?}");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.contains(flag), "{extra:?}: {err}");
    }
}

#[test]
fn the_overhead_probe_reports_per_layer_costs() {
    let out = ft(&[
        "run",
        "--probe-overhead",
        "--device",
        "host",
        "--threads",
        "1",
        "--json",
    ]);
    assert_ok(&out);
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let f = |k: &str| {
        v[k].as_f64()
            .unwrap_or_else(|| panic!("{k} missing in {v}"))
    };
    // What the report is made of, not how fast this machine ran it (a loaded CI machine
    // can make any layer slow): every time is a finite non-negative number, the CPU share
    // did work, and the overhead is what the layer took beyond the resident layer and the
    // CPU's own busy time.
    for k in [
        "resident_layer_us",
        "cpu_layer_us",
        "cpu_busy_layer_us",
        "host_wait_layer_us",
        "pool_job_spin_us",
        "pool_job_spin_beside_us",
        "pool_job_park_us",
    ] {
        assert!(f(k).is_finite() && f(k) >= 0.0, "{k}: {v}");
    }
    assert!(f("cpu_busy_layer_us") > 0.0, "{v}");
    let beyond = f("cpu_layer_us") - f("resident_layer_us") - f("cpu_busy_layer_us");
    assert!((f("overhead_layer_us") - beyond).abs() <= 1e-6 * f("cpu_layer_us").max(1.0));
    assert_eq!(v["threads"], 1);
    assert_eq!(v["target_us"], 15.0);
}

#[test]
fn repeat_reports_the_median_repetition_and_every_repetitions_speed() {
    let dir = tempfile::tempdir().unwrap();
    let model = write(dir.path(), "tiny.toml", TINY);
    let mut args = tiny_run(&model);
    args.extend(["--strategy", "offload", "--repeat", "3", "--json"]);
    let out = ft(&args);
    assert_ok(&out);
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("stdout is JSON");
    let reps: Vec<f64> = v["repeats"]
        .as_array()
        .expect("repeats")
        .iter()
        .map(|x| x.as_f64().unwrap())
        .collect();
    assert_eq!(reps.len(), 3);
    let mut sorted = reps.clone();
    sorted.sort_by(f64::total_cmp);
    assert_eq!(v["summary"]["tok_s_total"].as_f64().unwrap(), sorted[1]);
    // The records are the reported repetition's: one decode's warm-up and measured steps
    // (tiny_run's 2 + 4).
    assert_eq!(v["step_records"].as_array().unwrap().len(), 6);

    let bad = ft(&[
        "run", "--device", "host", "--model", &model, "--repeat", "0",
    ]);
    assert_eq!(bad.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&bad.stderr).contains("--repeat"));
}

/// `--interleave` decodes several strategies on one engine in rounds: each variant's report
/// (file and stdout) carries its label, every round's tok/s, and the same cache counts as a
/// plain run of that strategy (each decode starts from an empty cache, so no variant leaks
/// cache state into the next).
#[test]
fn interleaved_variants_report_what_plain_runs_of_them_report() {
    let dir = tempfile::tempdir().unwrap();
    let model = write(dir.path(), "tiny.toml", TINY);
    let prefix = format!("{}/c00-", dir.path().display());
    let mut common = tiny_run(&model);
    common.push("--json");
    let mut args = common.clone();
    args.extend([
        "--interleave",
        "offload,hybrid:0.5,rules=hybrid:0.25,cpu",
        "--repeat",
        "2",
        "--report-prefix",
        &prefix,
    ]);
    let out = ft(&args);
    assert_ok(&out);
    let all: Vec<serde_json::Value> = serde_json::from_slice(&out.stdout).expect("a JSON array");
    let labels: Vec<&str> = all.iter().map(|r| r["label"].as_str().unwrap()).collect();
    assert_eq!(labels, ["offload", "hybrid", "rules", "cpu"]);
    for (label, strategy, fetch) in [
        ("offload", "offload", None),
        ("hybrid", "hybrid", Some("0.5")),
        ("rules", "hybrid", Some("0.25")),
        ("cpu", "cpu", None),
    ] {
        let text = std::fs::read_to_string(format!("{prefix}{label}.json")).expect("report file");
        let file: serde_json::Value = serde_json::from_str(&text).unwrap();
        let printed = all.iter().find(|r| r["label"] == label).unwrap();
        assert_eq!(&file, printed, "{label}: the file is the printed report");
        assert_eq!(
            file["repeats"].as_array().unwrap().len(),
            2,
            "{label}: two rounds"
        );
        assert!(
            file["notes"].to_string().contains("--interleave"),
            "{label}: says how it ran"
        );
        // The CPU's same-run ceiling: one STREAM read of the bank per round, shared by every
        // variant of the process, and the CPU share against it where there is one.
        let cpu = &file["cpu"];
        if label == "offload" {
            assert!(cpu.is_null(), "offload computes nothing on the CPU: {cpu}");
        } else {
            let rounds = cpu["stream_read_rounds_gbs"].as_array().expect("rounds");
            assert_eq!(rounds.len(), 2, "{label}: one reading per round");
            assert!(rounds.iter().all(|g| g.as_f64().unwrap() > 0.0), "{cpu}");
            let (busy, stream, share) = (
                cpu["cpu_gbs_while_busy"].as_f64().unwrap(),
                cpu["stream_read_gbs"].as_f64().unwrap(),
                cpu["share_of_stream"].as_f64().unwrap(),
            );
            assert!(busy > 0.0 && stream > 0.0, "{label}: {cpu}");
            assert!((share - busy / stream).abs() < 1e-9, "{label}: {cpu}");
            let per_step = file["summary"]["cpu_per_layer"].as_f64().unwrap()
                * file["layers"].as_f64().unwrap()
                * file["expert_bytes"].as_f64().unwrap();
            assert!(
                (cpu["cpu_bytes_per_step"].as_f64().unwrap() - per_step).abs() < 1e-6 * per_step,
                "{label}: {cpu}"
            );
        }
        let mut plain = common.to_vec();
        plain.extend(["--strategy", strategy]);
        if let Some(f) = fetch {
            plain.extend(["--fetch-fraction", f]);
        }
        let alone = ft(&plain);
        assert_ok(&alone);
        let alone: serde_json::Value = serde_json::from_slice(&alone.stdout).unwrap();
        assert_eq!(file["strategy"], alone["strategy"], "{label}");
        for key in [
            "miss_rate",
            "hits_per_layer",
            "fetched_per_layer",
            "cpu_per_layer",
        ] {
            assert_eq!(
                file["summary"][key], alone["summary"][key],
                "{label}: {key} as in a plain run"
            );
        }
    }
}

#[test]
fn interleave_refuses_resident_hybrid_without_a_fraction_and_duplicate_labels() {
    let dir = tempfile::tempdir().unwrap();
    let model = write(dir.path(), "tiny.toml", TINY);
    for (list, says) in [
        ("offload,resident", "resident needs an engine of its own"),
        ("offload,hybrid", "hybrid needs its fetch fraction"),
        (
            "hybrid:0.5,hybrid:0.25",
            "two variants are labelled 'hybrid'",
        ),
        ("offload:0.5", "only hybrid takes a fetch fraction"),
    ] {
        let out = ft(&[
            "run",
            "--device",
            "host",
            "--model",
            &model,
            "--cache-slots",
            "24",
            "--steps",
            "2",
            "--interleave",
            list,
        ]);
        assert!(!out.status.success(), "{list} was accepted");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.contains(says), "{list}: {err}");
    }
}

#[test]
fn engine_settings_come_from_flags_or_a_file_and_are_reported() {
    let dir = tempfile::tempdir().unwrap();
    let model = write(dir.path(), "tiny.toml", TINY);
    let mut args = tiny_run(&model);
    args.extend(["--strategy", "offload", "--json"]);
    let json = |out: &std::process::Output| -> serde_json::Value {
        assert_ok(out);
        let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        v.as_array().map_or(v.clone(), |a| a[0].clone())
    };
    let plain = json(&ft(&args));
    // Gated by default (one GPU, copy-engine gathers); at most 4 chunks.
    assert_eq!(plain["gate_last_chunk"], true);
    assert_eq!(plain["engine"], serde_json::json!({"fetch-chunks": 4}));
    // A file's [engine] table, and a flag beside it that wins.
    let file = write(dir.path(), "engine.toml", "[engine]\nfetch-chunks = 2\n");
    let mut from_file = args.clone();
    from_file.extend(["--engine-config", &file]);
    let set = json(&ft(&from_file));
    assert_eq!(set["engine"]["fetch-chunks"], 2);
    // The same counts either way (the engine test checks the bits).
    assert_eq!(
        plain["summary"]["misses_per_layer"],
        set["summary"]["misses_per_layer"]
    );
    let mut flag_wins = from_file.clone();
    flag_wins.extend(["--fetch-chunks", "1"]);
    assert_eq!(json(&ft(&flag_wins))["engine"]["fetch-chunks"], 1);
    // A zero-copy gather is never gated.
    let mut zero_copy = args.clone();
    zero_copy.extend(["--gather", "zero-copy"]);
    assert_eq!(json(&ft(&zero_copy))["gate_last_chunk"], false);
    // Out of range, an unknown setting, a missing file: exit 2, naming the input.
    let unknown = write(dir.path(), "bad.toml", "[engine]\nfold-combine = false\n");
    for (extra, says) in [
        (vec!["--fetch-chunks", "9"], "--fetch-chunks".to_string()),
        (
            vec!["--engine-config", &unknown],
            "fold-combine".to_string(),
        ),
        (
            vec!["--engine-config", "/nonexistent/engine.toml"],
            "/nonexistent/engine.toml".to_string(),
        ),
    ] {
        let mut a = args.clone();
        a.extend(extra);
        let out = ft(&a);
        assert_eq!(out.status.code(), Some(2), "{says}");
        assert!(
            common::stderr(&out).contains(&says),
            "{}",
            common::stderr(&out)
        );
    }
    // A variable that once chose an engine path is refused, not silently ignored.
    let old = common::ft_env(&args, &[("FT_FOLD_COMBINE", "0")]);
    assert_eq!(old.status.code(), Some(2));
    assert!(
        common::stderr(&old).contains("FT_FOLD_COMBINE"),
        "{}",
        common::stderr(&old)
    );
}

#[test]
fn block_timelines_are_refused_where_no_cuda_kernels_run() {
    let dir = tempfile::tempdir().unwrap();
    let model = write(dir.path(), "tiny.toml", TINY);
    let csv = dir.path().join("stamps.csv");
    let csv = csv.to_str().unwrap();
    let mut args = tiny_run(&model);
    args.extend(["--strategy", "offload", "--stamps-out", csv]);
    // The host device: refused before any engine is built, with or without the switch.
    for env in [vec![], vec![("FT_CUDA_STAMPS", "1")]] {
        let out = common::ft_env(&args, &env);
        assert!(!out.status.success());
        let e = common::stderr(&out);
        assert!(
            e.contains("--stamps-out") && e.contains("--device cuda"),
            "{e}"
        );
    }
    assert!(!std::path::Path::new(csv).exists(), "nothing written");
    // One strategy at a time.
    let mut both = tiny_run(&model);
    both.extend(["--interleave", "offload,cpu", "--stamps-out", csv]);
    let out = ft(&both);
    assert_eq!(out.status.code(), Some(2));
    assert!(common::stderr(&out).contains("--stamps-out"));
}
