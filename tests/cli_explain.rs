//! `ft predict` and `ft explain` on a model a user imports (a Hugging Face config.json and a
//! GGUF header the test writes): the break-evens in both reports, the near tie honest,
//! `--plot` an SVG that parses and names its series, `--observations` reconciling measured
//! runs (issue 45's walk-through, issue 42's break-evens and published-case explanation).

mod common;
use common::{assert_ok, ft, write, write_gguf};

/// Short traffic runs keep the tests fast.
const QUICK: [&str; 4] = ["--steps", "30", "--warmup", "20"];

/// A small Qwen3-MoE config.json (the keys the importer reads).
const QWEN3_MOE: &str = r#"{
  "architectures": ["Qwen3MoeForCausalLM"], "model_type": "qwen3_moe",
  "hidden_size": 2048, "moe_intermediate_size": 768, "num_hidden_layers": 24,
  "num_experts": 64, "num_experts_per_tok": 8, "num_attention_heads": 32,
  "num_key_value_heads": 4, "head_dim": 128, "torch_dtype": "bfloat16",
  "vocab_size": 151936
}"#;

fn json(args: &[&str]) -> serde_json::Value {
    let mut a = args.to_vec();
    a.extend(QUICK);
    a.push("--json");
    let out = ft(&a);
    assert_ok(&out);
    serde_json::from_slice(&out.stdout).expect("JSON on stdout")
}

/// Every input has a break-even entry with its sentence; an uncalibrated decision says so.
fn check_break_evens(b: &serde_json::Value) {
    let inputs = b["inputs"].as_array().expect("break_evens.inputs");
    let names: Vec<&str> = inputs
        .iter()
        .map(|i| i["input"].as_str().unwrap())
        .collect();
    assert_eq!(
        names,
        [
            "cpu-serving",
            "cpu-layer-fixed",
            "miss-rate",
            "link-rate",
            "context"
        ]
    );
    for i in inputs {
        let t = i["text"].as_str().unwrap();
        assert!(t.starts_with(i["input"].as_str().unwrap()), "{t}");
        for side in ["below", "above"] {
            if let Some(at) = i[side]["at"].as_f64() {
                let [lo, hi] = [
                    i["range"][0].as_f64().unwrap(),
                    i["range"][1].as_f64().unwrap(),
                ];
                assert!(lo <= at && at <= hi, "{t}");
            }
        }
    }
    assert_eq!(b["calibrated"], false);
    assert!(b["text"].as_str().unwrap().contains("uncalibrated"));
}

#[test]
fn imported_models_predict_and_explain_with_break_evens_and_a_plot() {
    let dir = tempfile::tempdir().unwrap();
    let config = write(dir.path(), "config.json", QWEN3_MOE);
    let gguf = dir.path().join("walk.gguf");
    write_gguf(&gguf);
    let gguf = gguf.to_str().unwrap();

    // predict on the config.json: the decision and its break-evens.
    let p = json(&["predict", "--model", &config]);
    check_break_evens(&p["break_evens"]);
    let d = &p["decision"];
    assert!(d["noise_margin"].as_f64().unwrap() > 0.0);
    if d["near_tie"] == true {
        assert!(d["margin"].as_f64().unwrap() <= d["noise_margin"].as_f64().unwrap());
    }

    // explain on the GGUF header, with its picture.
    let svg_path = dir.path().join("decision.svg");
    let svg_arg = svg_path.to_str().unwrap();
    let e = json(&["explain", "--model", gguf, "--plot", svg_arg]);
    check_break_evens(&e["break_evens"]);
    let svg = std::fs::read_to_string(&svg_path).expect("--plot wrote the SVG");
    let doc = roxmltree::Document::parse(&svg).expect("the SVG parses as XML");
    assert_eq!(doc.root_element().tag_name().name(), "svg");
    let texts: Vec<&str> = doc
        .descendants()
        .filter_map(|n| n.text())
        .map(str::trim)
        .collect();
    // Every ranked strategy is named (bars and curves), and the marks and axes are labelled.
    let strategies = e["prediction"]["strategies"].as_array().unwrap();
    let ranked: Vec<String> = strategies
        .iter()
        .filter(|s| s["feasible"] == true)
        .filter(|s| s["cpu_layers"].as_u64() != Some(0))
        .map(|s| {
            let kind = s["kind"].as_str().unwrap();
            // The figure names strategies as the reports do.
            match kind {
                "hybrid" => format!("hybrid(f={:.3})", s["fetch_fraction"].as_f64().unwrap()),
                "layer-split" | "layer-split-cached" => {
                    format!("{kind}(n={})", s["cpu_layers"].as_u64().unwrap())
                }
                _ => kind.to_string(),
            }
        })
        .collect();
    assert!(ranked.len() >= 2, "{ranked:?}");
    for name in &ranked {
        assert!(
            texts.iter().any(|t| t == name),
            "{name} is not in the SVG: {texts:?}"
        );
    }
    for label in [
        "this host",
        "CPU serving rate",
        "offload's miss rate (%)",
        "context per stream (tokens, log)",
        "tok/s, all streams",
        "ms per step",
        "concurrent streams (log)",
    ] {
        assert!(texts.iter().any(|t| t.contains(label)), "{label} missing");
    }
    // Polylines: a curve per strategy and panel, the streams panel's included.
    let lines = doc
        .descendants()
        .filter(|n| n.has_tag_name("polyline"))
        .count();
    assert!(lines >= ranked.len() * 5, "{lines} polylines");
    assert!(texts.contains(&"streams"), "no streams panel");

    // The human twins carry the same sentences.
    let mut a = vec!["explain", "--model", gguf];
    a.extend(QUICK);
    let out = ft(&a);
    assert_ok(&out);
    let text = String::from_utf8(out.stdout).unwrap();
    assert!(text.contains("What would flip the choice"), "{text}");
    assert!(text.contains("uncalibrated"), "{text}");
}

#[test]
fn explain_reconciles_measured_runs_with_the_mechanism_at_work() {
    let dir = tempfile::tempdir().unwrap();
    // Hybrid measured far below its bench-only prediction, offload as predicted (the
    // field's "hybrid 20 to 40 times slower" shape).
    let base = json(&[
        "predict",
        "--host",
        "rtx4090-2x-xeon4310",
        "--fetch-fraction",
        "0.3",
    ]);
    let row = |kind: &str| {
        base["prediction"]["strategies"]
            .as_array()
            .unwrap()
            .iter()
            .find(|s| s["kind"] == kind)
            .unwrap()["tok_s_per_stream"]
            .as_f64()
            .unwrap()
    };
    let slots = base["prediction"]["cache_slots"].as_u64().unwrap();
    let csv = format!(
        "strategy,fetch_fraction,streams,output_tokens,context,cache_slots,tok_s,label\n\
         hybrid,0.3,1,256,1024,{slots},{:.3},slow hybrid\n\
         offload,,1,256,1024,{slots},{:.3},offload\n",
        row("hybrid") / 8.0,
        row("offload")
    );
    let obs = write(dir.path(), "runs.csv", &csv);
    let e = json(&[
        "explain",
        "--host",
        "rtx4090-2x-xeon4310",
        "--observations",
        &obs,
    ]);
    let case = &e["observations"];
    let runs = case["runs"].as_array().unwrap();
    assert_eq!(runs.len(), 2);
    assert!(
        runs[0]["gap"].as_f64().unwrap() < -0.5,
        "{}",
        runs[0]["text"]
    );
    assert_eq!(runs[1]["within_noise"], true, "{}", runs[1]["text"]);
    assert_eq!(case["ranking"][0][0], "cpu-serving", "{}", case["text"]);
    let verdict = case["verdict"].as_str().unwrap();
    assert!(verdict.contains("serving capacity"), "{verdict}");

    // A malformed file is a clear error naming it, exit 2.
    let bad = write(dir.path(), "bad.csv", "strategy,streams\nwarp,1\n");
    let out = ft(&["explain", "--observations", &bad]);
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("bad.csv"), "{err}");
}
