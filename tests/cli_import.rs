//! The walk-through of a user with their own host and model: import a `config.json` and a
//! GGUF header the test writes, predict on them; write this machine's host with `ft host
//! init`, read it back, show its derived values and predict on it. Also the small CLI
//! promises: no colour codes in a log that is not a terminal, `ft run`'s default `--model`.
//! (`ft explain --plot` does not exist yet; when it does, the walk-through plots too.)

mod common;
use common::{assert_ok, ft, stderr, write, write_gguf};

use ft_model::host::HostSpec;
use ft_model::{ExpertFormat, ModelSpec};

/// Short traffic runs keep the tests fast.
const QUICK: [&str; 4] = ["--steps", "40", "--warmup", "20"];

/// Mixtral-8x7B's config.json (the keys that matter, and some it ignores).
const MIXTRAL: &str = r#"{
  "architectures": ["MixtralForCausalLM"], "model_type": "mixtral",
  "hidden_size": 4096, "intermediate_size": 14336, "num_hidden_layers": 32,
  "num_local_experts": 8, "num_experts_per_tok": 2, "num_attention_heads": 32,
  "num_key_value_heads": 8, "torch_dtype": "bfloat16", "rope_theta": 1e6,
  "vocab_size": 32000, "sliding_window": null
}"#;

fn predict(model: &str, host: &str) -> (serde_json::Value, String) {
    let mut args = vec!["predict", "--model", model, "--host", host, "--json"];
    args.extend(QUICK);
    let out = ft(&args);
    assert_ok(&out);
    (
        serde_json::from_slice(&out.stdout).expect("predict's JSON"),
        stderr(&out),
    )
}

#[test]
fn a_config_json_imports_and_predicts_like_its_toml() {
    let dir = tempfile::tempdir().unwrap();
    let config = write(dir.path(), "config.json", MIXTRAL);
    let toml = dir.path().join("mixtral.toml");
    let out = ft(&[
        "model",
        "import",
        &config,
        "--format",
        "q4_k",
        "--out",
        toml.to_str().unwrap(),
    ]);
    assert_ok(&out);
    let spec = ModelSpec::from_toml_file(&toml).unwrap();
    assert_eq!(spec.format, "q4_k".parse::<ExpertFormat>().unwrap());
    assert_eq!(
        (
            spec.geometry.experts,
            spec.geometry.top_k,
            spec.geometry.moe_layers
        ),
        (8, 2, 32)
    );
    // 3 matrices of 4096 x 14336 weights at 4.5 bits each.
    assert_eq!(spec.expert_bytes(), 3 * 4096 * 14336 / 256 * 144);

    // The config itself as --model, and its directory, predict as the TOML does (bf16
    // there, so compare the bf16 import).
    let bf16 = dir.path().join("bf16.toml");
    assert_ok(&ft(&[
        "model",
        "import",
        &config,
        "--out",
        bf16.to_str().unwrap(),
    ]));
    let (a, _) = predict(&config, "rtx4090-2x-xeon4310");
    let (b, _) = predict(bf16.to_str().unwrap(), "rtx4090-2x-xeon4310");
    let (c, _) = predict(dir.path().to_str().unwrap(), "rtx4090-2x-xeon4310");
    assert_eq!(a["prediction"]["strategies"], b["prediction"]["strategies"]);
    assert_eq!(a["prediction"]["strategies"], c["prediction"]["strategies"]);
    assert_eq!(
        a["prediction"]["strategies"].as_array().unwrap().len(),
        ft_model::StrategyKind::ALL.len()
    );

    // The JSON twin of the import.
    let out = ft(&["model", "import", &config, "--json"]);
    assert_ok(&out);
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["kind"], "hf-config");
    assert_eq!(v["architecture"], "mixtral");
    assert_eq!(v["expert_bytes"], 3 * 4096 * 14336 * 2);
}

#[test]
fn a_gguf_header_imports_and_predicts_with_its_caveat() {
    let dir = tempfile::tempdir().unwrap();
    let gguf = dir.path().join("walk.gguf");
    write_gguf(&gguf);
    let gguf = gguf.to_str().unwrap();
    let out = ft(&["model", "import", gguf, "--json"]);
    assert_ok(&out);
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["kind"], "gguf");
    assert_eq!(v["spec"]["format"], "q4_k");
    assert_eq!(v["spec"]["geometry"]["experts"], 32);
    assert_eq!(v["spec"]["geometry"]["moe_layers"], 4);
    assert_eq!(v["expert_bytes"], (2 * 512 * 4 + 1024 * 2) * 144);
    // The q4_k/q6_k mix is a note, on stderr too.
    assert!(v["notes"][0].as_str().unwrap().contains("Q6K"), "{v}");
    assert!(stderr(&out).contains("mix types"), "{}", stderr(&out));

    // Predicting for a format ft has no kernel for says where the CPU rate comes from.
    let (p, err) = predict(gguf, "rtx4090-2x-xeon4310");
    assert_eq!(
        p["prediction"]["strategies"].as_array().unwrap().len(),
        ft_model::StrategyKind::ALL.len()
    );
    assert!(
        err.contains("no CPU kernel for q4_k") && err.contains("cpu.moe_gbs bench (46.12 GB/s"),
        "{err}"
    );
    let (_, err) = predict(gguf, "h200-xeon-emr");
    assert!(err.contains("is unknown"), "{err}");
    // No colour codes in a log that is not a terminal.
    assert!(!err.contains('\u{1b}'), "{err:?}");

    // The runtime refuses it, naming why.
    let out = ft(&[
        "run",
        "--model",
        gguf,
        "--strategy",
        "offload",
        "--device",
        "host",
        "--steps",
        "1",
        "--warmup",
        "0",
    ]);
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    assert!(
        stderr(&out).contains("no kernel for q4_k"),
        "{}",
        stderr(&out)
    );
}

#[test]
fn host_init_writes_a_host_that_reads_back_and_predicts() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("this.toml");
    let p = path.to_str().unwrap();
    let out = ft(&["host", "init", "--out", p, "--stream-mib", "32"]);
    assert_ok(&out);
    let text = std::fs::read_to_string(&path).unwrap();
    assert!(
        text.starts_with("# Host file written by `ft host init`"),
        "{text}"
    );
    let host = HostSpec::from_toml_file(&path).unwrap();
    assert_eq!(host.name, "this");
    assert!(host.cpu.stream_read_gbs > 0.0);
    // The link was given as generation and width: its rates are derived and marked.
    let derived: Vec<&str> = host.derived().iter().map(|d| d.key).collect();
    assert!(
        derived.contains(&"pcie.h2d_gbs") && derived.contains(&"pcie.latency_us"),
        "{derived:?}"
    );
    // A second init refuses to overwrite.
    let again = ft(&["host", "init", "--out", p]);
    assert_eq!(again.status.code(), Some(2));
    assert!(stderr(&again).contains("--force"), "{}", stderr(&again));

    let out = ft(&["host", "show", p, "--json"]);
    assert_ok(&out);
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let rows = v["values"].as_array().unwrap();
    let h2d = rows.iter().find(|r| r["key"] == "pcie.h2d_gbs").unwrap();
    assert_eq!(h2d["derived"], true);
    assert!(
        h2d["source"].as_str().unwrap().contains("x16")
            || h2d["source"].as_str().unwrap().contains("PCIe")
    );
    let stream = rows
        .iter()
        .find(|r| r["key"] == "cpu.stream_read_gbs")
        .unwrap();
    assert_eq!(stream["derived"], false);
    assert_eq!(stream["value"], host.cpu.stream_read_gbs);

    let (pred, err) = predict("qwen3.8-flash-next", p);
    assert_eq!(
        pred["prediction"]["strategies"].as_array().unwrap().len(),
        ft_model::StrategyKind::ALL.len()
    );
    assert!(err.contains("derived, not measured"), "{err}");
}

#[test]
fn implausible_rates_are_warned_on_stderr_and_in_json() {
    let dir = tempfile::tempdir().unwrap();
    let text = HostSpec::field_report().to_toml().replace(
        "h2d_gbs = 24.26",
        "h2d_gbs = 24.26\ngeneration = 3\nlanes = 16",
    );
    let path = write(dir.path(), "fast.toml", &text);
    let out = ft(&["host", "show", &path, "--json"]);
    assert_ok(&out);
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let w = v["warnings"].as_array().unwrap();
    // Gen 3 x16 moves 15.75 GB/s raw: 24.26 (h2d), 26 (d2h) and 24.25 (gather) exceed it.
    assert_eq!(w.len(), 3, "{w:?}");
    assert!(w[0].as_str().unwrap().contains("15.8 GB/s"), "{w:?}");
    assert!(
        stderr(&out).contains("pcie.h2d_gbs = 24.26 GB/s is more than"),
        "{}",
        stderr(&out)
    );
}

#[test]
fn model_list_and_show_have_json_twins() {
    let out = ft(&["model", "list", "--json"]);
    assert_ok(&out);
    let v: Vec<serde_json::Value> = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v.len(), ModelSpec::preset_names().len());
    let field = v
        .iter()
        .find(|m| m["model"]["name"] == "qwen3.8-flash-next")
        .unwrap();
    assert_eq!(field["expert_bytes"], 2_772_480);
    let out = ft(&["model", "list"]);
    assert_ok(&out);
    let table = String::from_utf8_lossy(&out.stdout);
    assert!(
        table.contains("qwen3.8-flash-next") && table.contains("expert MB"),
        "{table}"
    );
    let out = ft(&["model", "show", "nope.gguf"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(stderr(&out).contains("nope.gguf"), "{}", stderr(&out));
}

#[test]
fn ft_run_defaults_its_model_like_the_others() {
    let out = ft(&["run", "--help"]);
    assert_ok(&out);
    let help = String::from_utf8_lossy(&out.stdout);
    let model = help
        .lines()
        .skip_while(|l| !l.trim_start().starts_with("--model"))
        .take(3)
        .collect::<String>();
    assert!(model.contains("[default: qwen3.8-flash-next]"), "{model}");
}
