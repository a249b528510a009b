//! `ft validate`: the analysis of a grid runs on a CSV alone (no GPU), and agrees with a
//! slow reference computed here row by row; `collect` turns a grid's JSON documents into
//! that CSV; `plan` writes the grid.

mod common;
use common::{assert_ok, ft};

use std::path::Path;
use std::process::Output;

const HEADER: &str = "config,geometry,layers,expert_bytes,residency,cache_slots,streams,threads,context,strategy,fetch_fraction,measured_tok_s,measured_miss_rate,predicted_tok_s,predicted_tok_s_lo,predicted_tok_s_hi,predicted_miss_rate,abs_rel_error,bench_cpu_moe_gbs,bench_pcie_gather_gbs,bench_cpu_moe_overlap_gbs,bench_pcie_gather_overlap_gbs,threshold";

/// One synthetic row: measured and predicted tok/s of a strategy.
struct Row {
    config: usize,
    strategy: &'static str,
    measured: f64,
    predicted: f64,
}

/// The bench pair of the field report: the ratio rule (standalone 46.12 / 24.25 = 1.90) says
/// offload; ferrox-core's entry (contended 33.4 / 12.8 = 2.6) says hybrid.
const BENCH: (f64, f64, f64, f64) = (46.12, 24.25, 33.4, 12.8);

fn csv(rows: &[Row]) -> String {
    let mut s = String::from(HEADER);
    s.push('\n');
    for r in rows {
        let f = match r.strategy {
            "offload" => 1.0,
            "cpu" => 0.0,
            "hybrid" => 0.4,
            _ => 0.27700805664,
        };
        s.push_str(&format!(
            "c{:02},qwen3.8-flash-next,2,2772480,0.15,154,{},{},{},{},{f},{},0.3,{},{},{},,{},{},{},{},{},2\n",
            r.config,
            1 + r.config % 4,
            threads_of(r.config),
            context_of(r.config),
            r.strategy,
            r.measured,
            r.predicted,
            r.predicted * 0.95,
            r.predicted * 1.05,
            (r.predicted - r.measured).abs() / r.measured,
            BENCH.0,
            BENCH.1,
            BENCH.2,
            BENCH.3
        ));
    }
    s
}

/// CPU threads of configuration `c` in the test grids.
fn threads_of(c: usize) -> usize {
    if c.is_multiple_of(3) {
        4
    } else {
        15
    }
}

/// Context of configuration `c` in the test grids.
fn context_of(c: usize) -> usize {
    if c.is_multiple_of(2) {
        1024
    } else {
        32768
    }
}

/// A grid of `n` configurations: measured rates vary by configuration, the predicted ones
/// are off by a known relative error per row; in half the configurations hybrid is best, in
/// the other half offload.
fn grid(n: usize, err: impl Fn(usize) -> f64) -> Vec<Row> {
    let mut rows = Vec::new();
    let mut i = 0;
    for c in 0..n {
        let base = 20.0 + 3.0 * c as f64;
        let hybrid_wins = c % 2 == 0;
        let m = [
            ("offload", if hybrid_wins { base } else { base * 1.3 }),
            ("hybrid", if hybrid_wins { base * 1.4 } else { base * 0.9 }),
            ("hybrid-legacy", base * 1.1),
            ("cpu", base * 0.5),
        ];
        for (strategy, measured) in m {
            rows.push(Row {
                config: c,
                strategy,
                measured,
                predicted: measured * (1.0 + err(i)),
            });
            i += 1;
        }
    }
    rows
}

/// The R-8 quantile statrs uses, computed the slow way.
fn r8(mut v: Vec<f64>, q: f64) -> f64 {
    v.sort_by(f64::total_cmp);
    let n = v.len() as f64;
    let h = (n + 1.0 / 3.0) * q + 1.0 / 3.0;
    let hf = h.floor();
    if hf < 1.0 {
        return v[0];
    }
    if hf >= n {
        return v[v.len() - 1];
    }
    let (a, b) = (v[hf as usize - 1], v[hf as usize]);
    a + (h - hf) * (b - a)
}

fn analyze(path: &Path, extra: &[&str]) -> Output {
    let mut args = vec!["validate", "analyze", path.to_str().unwrap()];
    args.extend_from_slice(extra);
    ft(&args)
}

#[test]
fn the_analysis_matches_a_slow_reference() {
    let dir = tempfile::tempdir().unwrap();
    // Errors of -3% to +4.5% in a pattern, small enough that the model's picks are right.
    let err = |i: usize| ((i * 7) % 16) as f64 * 0.005 - 0.03;
    let rows = grid(12, err);
    let path = dir.path().join("grid.csv");
    std::fs::write(&path, csv(&rows)).unwrap();
    let out = analyze(&path, &["--json", "--check"]);
    assert_ok(&out);
    let s: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();

    // Errors: median and p90 of |predicted - measured| / measured over every row.
    let abs: Vec<f64> = rows
        .iter()
        .map(|r| (r.predicted - r.measured).abs() / r.measured)
        .collect();
    let median = r8(abs.clone(), 0.5);
    let p90 = r8(abs.clone(), 0.9);
    assert!((s["errors"]["median"].as_f64().unwrap() - median).abs() < 1e-9);
    assert!((s["errors"]["p90"].as_f64().unwrap() - p90).abs() < 1e-9);
    assert_eq!(s["rows"], 48);
    assert_eq!(s["configs"], 12);
    // The same per context and per thread count and strategy.
    let sub = |keep: &dyn Fn(&Row) -> bool| -> Vec<f64> {
        rows.iter()
            .filter(|r| keep(r))
            .map(|r| (r.predicted - r.measured).abs() / r.measured)
            .collect()
    };
    for ctx in [1024, 32768] {
        let e = sub(&|r| context_of(r.config) == ctx);
        let got = &s["errors_by_context"][format!("context {ctx}")];
        assert!((got["median"].as_f64().unwrap() - r8(e.clone(), 0.5)).abs() < 1e-9);
        assert_eq!(got["n"], e.len());
    }
    for (t, strategy) in [(4, "cpu"), (15, "hybrid")] {
        let e = sub(&|r| threads_of(r.config) == t && r.strategy == strategy);
        let got = &s["errors_by_threads_and_strategy"][format!("{t} threads, {strategy}")];
        assert!((got["p90"].as_f64().unwrap() - r8(e.clone(), 0.9)).abs() < 1e-9);
        assert_eq!(got["n"], e.len());
    }

    // Choosers: the model picks the best predicted of offload, hybrid, cpu; the ratio rule
    // offload (standalone pair); ferrox-core hybrid at the rules' fraction (contended pair).
    let mut model_loss = 0.0;
    let mut ratio_loss = 0.0;
    let mut ferrox_loss = 0.0;
    let mut wrong = 0;
    for c in 0..12 {
        let mine: Vec<&Row> = rows.iter().filter(|r| r.config == c).collect();
        let best = mine.iter().map(|r| r.measured).fold(0.0, f64::max);
        let pick = mine
            .iter()
            .filter(|r| r.strategy != "hybrid-legacy")
            .max_by(|a, b| a.predicted.total_cmp(&b.predicted))
            .unwrap();
        let loss_of =
            |s: &str| 1.0 - mine.iter().find(|r| r.strategy == s).unwrap().measured / best;
        let l = 1.0 - pick.measured / best;
        if l > 0.05 {
            wrong += 1;
        }
        model_loss += l;
        ratio_loss += loss_of("offload");
        ferrox_loss += loss_of("hybrid-legacy");
    }
    let ch = s["choosers"].as_array().unwrap();
    let by = |name: &str| ch.iter().find(|c| c["chooser"] == name).unwrap();
    assert!((by("model")["mean_loss"].as_f64().unwrap() - model_loss / 12.0).abs() < 1e-9);
    assert!((by("ratio rule")["mean_loss"].as_f64().unwrap() - ratio_loss / 12.0).abs() < 1e-9);
    assert!((by("ferrox-core")["mean_loss"].as_f64().unwrap() - ferrox_loss / 12.0).abs() < 1e-9);
    assert_eq!(by("model")["wrong_picks_over_gap"], wrong);
    assert_eq!(by("ratio rule")["picks"]["offload"], 12);
    assert_eq!(by("ferrox-core")["picks"]["hybrid-legacy"], 12);
    assert_eq!(s["ferrox_split_agrees"], true);
    assert_eq!(s["targets_met"], true, "{}", s["missed"]);

    // The table names the choosers.
    let out = analyze(&path, &[]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.contains("ratio rule") && text.contains("ferrox-core") && text.contains("median"),
        "{text}"
    );
}

/// Runs measured while the hypervisor stole CPU time: the analysis reports the errors without
/// their configurations beside all of them (the slow reference: the same statistic over the
/// other rows), names them, and still judges the targets on every row.
#[test]
fn configurations_with_host_steal_are_reported_apart() {
    let dir = tempfile::tempdir().unwrap();
    let err = |i: usize| ((i * 7) % 16) as f64 * 0.005 - 0.03;
    let mut rows = grid(8, err);
    // Configuration 3 ran through a steal burst: everything measured three times too slow.
    for r in rows.iter_mut().filter(|r| r.config == 3) {
        r.measured /= 3.0;
    }
    let steal = |r: &Row| if r.config == 3 { 0.12 } else { 0.001 };
    let mut text = csv(&rows).replacen(HEADER, &format!("{HEADER},host_steal"), 1);
    let lines: Vec<String> = text
        .lines()
        .enumerate()
        .map(|(i, l)| match i {
            0 => l.to_string(),
            _ => format!("{l},{}", steal(&rows[i - 1])),
        })
        .collect();
    text = lines.join("\n") + "\n";
    let path = dir.path().join("grid.csv");
    std::fs::write(&path, text).unwrap();
    let out = analyze(&path, &["--json", "--check"]);
    assert_eq!(out.status.code(), Some(1), "the targets count every row");
    let s: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let clean: Vec<f64> = rows
        .iter()
        .filter(|r| r.config != 3)
        .map(|r| (r.predicted - r.measured).abs() / r.measured)
        .collect();
    let e = &s["errors_without_steal"];
    assert_eq!(e["n"], 28);
    assert!((e["median"].as_f64().unwrap() - r8(clean.clone(), 0.5)).abs() < 1e-9);
    assert!((e["p90"].as_f64().unwrap() - r8(clean, 0.9)).abs() < 1e-9);
    assert_eq!(s["stolen_configs"], serde_json::json!(["c03"]));
    assert!(s["errors"]["p90"].as_f64().unwrap() > e["p90"].as_f64().unwrap());
    let table = String::from_utf8_lossy(&analyze(&path, &[]).stdout).to_string();
    assert!(
        table.contains("without host steal") && table.contains("left out: c03"),
        "{table}"
    );
    // A grid without the column has no such line.
    let plain = dir.path().join("plain.csv");
    std::fs::write(&plain, csv(&rows)).unwrap();
    let s: serde_json::Value =
        serde_json::from_slice(&analyze(&plain, &["--json"]).stdout).unwrap();
    assert!(s["errors_without_steal"].is_null());
}

/// The runs' same-run STREAM reads (the machine's CPU ceiling while each ran) are summarised
/// over the rows that have one: how many, the median (by sorting here), the extremes.
#[test]
fn the_cpu_ceiling_of_the_runs_is_summarised() {
    let dir = tempfile::tempdir().unwrap();
    let rows = grid(8, |i| ((i * 5) % 9) as f64 * 0.01);
    let reading =
        |i: usize, r: &Row| (r.strategy != "offload").then(|| 80.0 + ((i * 13) % 11) as f64);
    // The probe read 85 GB/s at its threads (15); 4-thread rows have no probe reading.
    let probe = |r: &Row| (threads_of(r.config) != 4).then_some(85.0);
    // The CPU check's speed against the probe's, on the rows with a CPU share.
    let speed = |i: usize, r: &Row| (r.strategy != "offload").then_some(0.6 + 0.1 * (i % 7) as f64);
    let mut text = csv(&rows).replacen(
        HEADER,
        &format!("{HEADER},stream_read_gbs,probe_stream_read_gbs,cpu_speed"),
        1,
    );
    let cell = |v: Option<f64>| v.map_or(String::new(), |g| g.to_string());
    let lines: Vec<String> = text
        .lines()
        .enumerate()
        .map(|(i, l)| match i {
            0 => l.to_string(),
            _ => format!(
                "{l},{},{},{}",
                cell(reading(i, &rows[i - 1])),
                cell(probe(&rows[i - 1])),
                cell(speed(i, &rows[i - 1]))
            ),
        })
        .collect();
    text = lines.join("\n") + "\n";
    let path = dir.path().join("grid.csv");
    std::fs::write(&path, text).unwrap();
    let mut want: Vec<f64> = rows
        .iter()
        .enumerate()
        .filter_map(|(i, r)| reading(i + 1, r))
        .collect();
    want.sort_by(f64::total_cmp);
    let n = want.len();
    let median = if n % 2 == 1 {
        want[n / 2]
    } else {
        0.5 * (want[n / 2 - 1] + want[n / 2])
    };
    let out = analyze(&path, &["--json"]);
    let s: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let c = &s["stream_read_gbs"];
    assert_eq!(c["n"], n, "{c}");
    assert!((c["median"].as_f64().unwrap() - median).abs() < 1e-9, "{c}");
    assert_eq!(c["min"].as_f64(), Some(want[0]));
    assert_eq!(c["max"].as_f64(), Some(want[n - 1]));
    // The drift: run over probe per row with both, and its Pearson correlation with the
    // signed error, computed here the slow way.
    let pairs: Vec<(f64, f64)> = rows
        .iter()
        .enumerate()
        .filter_map(|(i, r)| {
            let ratio = reading(i + 1, r)? / probe(r)?;
            Some((ratio, r.predicted / r.measured - 1.0))
        })
        .collect();
    let pearson_of = |pairs: &[(f64, f64)]| {
        let m = pairs.len() as f64;
        let (mx, my) = (
            pairs.iter().map(|p| p.0).sum::<f64>() / m,
            pairs.iter().map(|p| p.1).sum::<f64>() / m,
        );
        let sxy: f64 = pairs.iter().map(|p| (p.0 - mx) * (p.1 - my)).sum();
        let sxx: f64 = pairs.iter().map(|p| (p.0 - mx).powi(2)).sum();
        let syy: f64 = pairs.iter().map(|p| (p.1 - my).powi(2)).sum();
        sxy / (sxx * syy).sqrt()
    };
    let pearson = pearson_of(&pairs);
    // The CPU check's speed, summarised the same way over every row that has one (4-thread
    // rows included: the probe checks every thread count it ran).
    let speed_pairs: Vec<(f64, f64)> = rows
        .iter()
        .enumerate()
        .filter_map(|(i, r)| Some((speed(i + 1, r)?, r.predicted / r.measured - 1.0)))
        .collect();
    let d = &s["cpu_speed_drift"];
    assert_eq!(d["ratio"]["n"], speed_pairs.len(), "{d}");
    assert!(
        (d["error_correlation"].as_f64().unwrap() - pearson_of(&speed_pairs)).abs() < 1e-9,
        "{d}"
    );
    let d = &s["ceiling_drift"];
    assert_eq!(d["ratio"]["n"], pairs.len(), "{d}");
    assert!(
        (d["error_correlation"].as_f64().unwrap() - pearson).abs() < 1e-9,
        "{d} against {pearson}"
    );
    let lowest = pairs.iter().map(|p| p.0).fold(f64::INFINITY, f64::min);
    assert!((d["ratio"]["min"].as_f64().unwrap() - lowest).abs() < 1e-12);
    let table = String::from_utf8_lossy(&analyze(&path, &[]).stdout).to_string();
    assert!(table.contains("CPU ceiling during the runs"), "{table}");
    assert!(table.contains("against the probes'"), "{table}");
    assert!(
        table.contains("CPU speed of the runs against the probes"),
        "{table}"
    );
    let plain = dir.path().join("plain.csv");
    std::fs::write(&plain, csv(&rows)).unwrap();
    let s: serde_json::Value =
        serde_json::from_slice(&analyze(&plain, &["--json"]).stdout).unwrap();
    assert!(s["stream_read_gbs"].is_null());
    assert!(s["ceiling_drift"].is_null());
}

#[test]
fn missed_targets_fail_the_check_and_bad_files_are_named() {
    let dir = tempfile::tempdir().unwrap();
    // 20% errors everywhere: the error targets are missed.
    let rows = grid(4, |i| if i % 2 == 0 { 0.2 } else { -0.2 });
    let path = dir.path().join("bad.csv");
    std::fs::write(&path, csv(&rows)).unwrap();
    let out = analyze(&path, &["--check"]);
    assert_eq!(
        out.status.code(),
        Some(1),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(String::from_utf8_lossy(&out.stderr).contains("median error"));
    // Without --check the same analysis succeeds.
    assert!(analyze(&path, &[]).status.success());

    let broken = dir.path().join("broken.csv");
    std::fs::write(
        &broken,
        format!("{HEADER}\nc00,qwen,2,1,0.1,1,1,1,1,offload,1,notanumber\n"),
    )
    .unwrap();
    let out = analyze(&broken, &[]);
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("broken.csv"));
    let out = analyze(&dir.path().join("none.csv"), &[]);
    assert_eq!(out.status.code(), Some(2));
}

#[test]
fn plan_and_collect_build_the_csv_from_the_grids_documents() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let out = ft(&["validate", "plan", "--out", d.to_str().unwrap(), "--quick"]);
    assert_ok(&out);
    assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), "12");
    assert!(d.join("models/deepseek-v4-flash-L1.toml").is_file());
    let plan = std::fs::read_to_string(d.join("plan.csv")).unwrap();
    let first: Vec<&str> = plan.lines().nth(1).unwrap().split(',').collect();
    let (config, geometry, streams) = (first[0], first[1], first[6].parse::<f64>().unwrap());

    // A profile with bench bandwidths for that geometry.
    use ft_model::host::HostSpec;
    use ft_model::perf::legacy::BenchBw;
    use ft_model::profile::Profile;
    let host = HostSpec::field_report();
    let model = ft_model::ModelSpec::preset(geometry).unwrap();
    let profile = Profile {
        bench_bw: Some(BenchBw {
            expert_bytes: 7_974_912,
            experts: 8,
            cpu_moe_gbs: BENCH.0,
            pcie_gather_gbs: BENCH.1,
            cpu_moe_overlap_gbs: Some(BENCH.2),
            pcie_gather_overlap_gbs: Some(BENCH.3),
        }),
        ..Profile::of_host_spec(&host, &model).unwrap()
    };
    std::fs::create_dir_all(d.join("profiles")).unwrap();
    std::fs::write(
        d.join(format!("profiles/{geometry}.json")),
        serde_json::to_vec(&profile).unwrap(),
    )
    .unwrap();
    // The rules' fraction, as the script gets it.
    let out = ft(&[
        "validate",
        "peer",
        "--profile",
        d.join(format!("profiles/{geometry}.json"))
            .to_str()
            .unwrap(),
        "--field",
        "fraction",
    ]);
    assert_ok(&out);
    let f_legacy: f64 = String::from_utf8_lossy(&out.stdout).trim().parse().unwrap();
    assert!((f_legacy - 12.8 / (12.8 + 33.4)).abs() < 1e-4);

    // A prediction (the shape `ft predict --json` writes) and four runs (`ft run --json`).
    let kinds = ["offload", "hybrid", "resident", "cpu"];
    let strategies: Vec<serde_json::Value> = kinds
        .iter()
        .enumerate()
        .map(|(i, k)| {
            let t = 10.0 * (i + 1) as f64;
            serde_json::json!({"kind": k, "tok_s_total": t, "tok_s_total_interval": [t * 0.9, t * 1.1], "miss_rate": 0.2})
        })
        .collect();
    let pred = serde_json::json!({
        "prediction": {"strategies": strategies, "fetch_search": {"chosen": 0.4}, "legacy_fraction_step_us": 50_000.0},
        "decision": {}
    });
    std::fs::create_dir_all(d.join("predictions")).unwrap();
    std::fs::write(
        d.join(format!("predictions/{config}.json")),
        pred.to_string(),
    )
    .unwrap();
    let out = ft(&[
        "validate",
        "get",
        d.join(format!("predictions/{config}.json"))
            .to_str()
            .unwrap(),
        "/prediction/fetch_search/chosen",
    ]);
    assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), "0.4");
    std::fs::create_dir_all(d.join("runs")).unwrap();
    for (s, measured, f) in [
        ("offload", 11.0, 1.0),
        ("hybrid", 19.0, 0.4),
        ("hybrid-legacy", 15.0, f_legacy),
        ("cpu", 42.0, 0.0),
    ] {
        let run = serde_json::json!({"fetch_fraction": f, "summary": {"tok_s_total": measured, "miss_rate": 0.25}});
        std::fs::write(d.join(format!("runs/{config}-{s}.json")), run.to_string()).unwrap();
    }
    let csv_path = d.join("grid.csv");
    let out = ft(&[
        "validate",
        "collect",
        "--dir",
        d.to_str().unwrap(),
        "--out",
        csv_path.to_str().unwrap(),
    ]);
    assert_ok(&out);
    let text = std::fs::read_to_string(&csv_path).unwrap();
    let mut r = csv::Reader::from_reader(text.as_bytes());
    let headers = r.headers().unwrap().clone();
    let col = |name: &str| headers.iter().position(|h| h == name).unwrap();
    let rows: Vec<csv::StringRecord> = r.records().map(|x| x.unwrap()).collect();
    assert_eq!(rows.len(), 4, "only the first configuration has documents");
    for row in &rows {
        let strategy = &row[col("strategy")];
        let predicted: f64 = row[col("predicted_tok_s")].parse().unwrap();
        let want = match strategy {
            "offload" => 10.0,
            "hybrid" => 20.0,
            "cpu" => 40.0,
            // The legacy fraction's step time over every stream's token.
            _ => streams * 1e6 / 50_000.0,
        };
        assert!(
            (predicted - want).abs() < 1e-9,
            "{strategy}: {predicted} vs {want}"
        );
        let measured: f64 = row[col("measured_tok_s")].parse().unwrap();
        let e: f64 = row[col("abs_rel_error")].parse().unwrap();
        assert!((e - (predicted - measured).abs() / measured).abs() < 1e-12);
    }
    // And the CSV it wrote is one the analysis reads.
    assert!(analyze(&csv_path, &["--json"]).status.success());
}

#[test]
fn model_file_writes_the_geometry_with_fewer_layers_and_refuses_impossible_counts() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("m.toml");
    let o = ft(&[
        "validate",
        "model-file",
        "--model",
        "qwen3.8-flash-next",
        "--layers",
        "2",
        "--out",
        out.to_str().unwrap(),
    ]);
    assert_ok(&o);
    let text = std::fs::read_to_string(&out).unwrap();
    assert!(text.contains("moe_layers = 2"), "{text}");
    assert!(
        text.contains("hidden = 2560") && text.contains("experts = 512"),
        "{text}"
    );
    assert!(text.contains("qwen3.8-flash-next-2-layers"), "{text}");
    // The file is a model the other commands read.
    let p = ft(&[
        "predict",
        "--model",
        out.to_str().unwrap(),
        "--streams",
        "1",
        "--json",
    ]);
    assert_ok(&p);
    let bad = ft(&[
        "validate",
        "model-file",
        "--model",
        "qwen3.8-flash-next",
        "--layers",
        "49",
        "--out",
        out.to_str().unwrap(),
    ]);
    assert_eq!(bad.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&bad.stderr).contains("--layers 49"));
}

/// The share of measurements inside their predicted interval, over every row and per
/// strategy, against a count made here (the rows' intervals are the prediction +-5%).
#[test]
fn interval_coverage_counts_the_measurements_inside_their_interval() {
    let dir = tempfile::tempdir().unwrap();
    // Errors of -10% to +12.5%: some rows inside +-5% of the prediction, some outside.
    let err = |i: usize| ((i * 5) % 10) as f64 * 0.025 - 0.1;
    let rows = grid(6, err);
    let path = dir.path().join("grid.csv");
    std::fs::write(&path, csv(&rows)).unwrap();
    let s: serde_json::Value = serde_json::from_slice(&analyze(&path, &["--json"]).stdout).unwrap();
    let inside = |r: &&Row| r.measured >= 0.95 * r.predicted && r.measured <= 1.05 * r.predicted;
    let all = rows.iter().filter(inside).count();
    assert!(
        all > 0 && all < rows.len(),
        "the test needs both kinds: {all}"
    );
    let c = &s["interval_coverage"];
    assert_eq!(c["all"]["n"], rows.len(), "{c}");
    assert_eq!(c["all"]["inside"], all, "{c}");
    for strategy in ["offload", "hybrid", "hybrid-legacy", "cpu"] {
        let mine: Vec<&Row> = rows.iter().filter(|r| r.strategy == strategy).collect();
        assert_eq!(c[strategy]["n"], mine.len(), "{strategy}: {c}");
        assert_eq!(
            c[strategy]["inside"],
            mine.iter().copied().filter(inside).count(),
            "{strategy}"
        );
    }
    let table = String::from_utf8_lossy(&analyze(&path, &[]).stdout).to_string();
    assert!(
        table.contains(&format!(
            "measured inside the predicted interval: {all} of {}",
            rows.len()
        )),
        "{table}"
    );
}
