//! What every CLI test shares: running the `ft` binary built for the tests, and checking
//! how it ended with its stderr in the failure message.
// Each test crate includes this module and uses a part of it.
#![allow(dead_code)]

use std::ffi::OsStr;
use std::path::Path;
use std::process::{Command, Output};

/// The repository's root (the workspace package's directory), where `experiments/` and
/// `scripts/` live.
pub fn repo_root() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

/// `python3` with `args`, run to its end, however it ended.
fn run_python<A: AsRef<OsStr>>(args: impl IntoIterator<Item = A>) -> Output {
    Command::new("python3")
        .args(args)
        .output()
        .expect("python3 runs")
}

/// Run `python3` with `args` (a script of the repository and its arguments, or `-c` and
/// code), asserting that it succeeded with its stderr in the failure message; its output.
pub fn python<A: AsRef<OsStr>>(args: impl IntoIterator<Item = A>) -> Output {
    let out = run_python(args);
    assert!(
        out.status.success(),
        "python3: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

/// Run `python3` with `args`, asserting that it failed (its stdout in the failure message);
/// its stderr, as text.
pub fn python_failing<A: AsRef<OsStr>>(args: impl IntoIterator<Item = A>) -> String {
    let out = run_python(args);
    assert!(
        !out.status.success(),
        "python3 succeeded: {}",
        String::from_utf8_lossy(&out.stdout)
    );
    stderr(&out)
}

/// Run an A/B reader of the repository (`experiments/*/..._ab.py`, relative to its root) on
/// `folder` with `--base base --json`, asserting that it succeeded; the rows it printed.
pub fn ab_rows(script: &str, folder: &Path, base: &str) -> Vec<serde_json::Value> {
    let script = repo_root().join(script);
    let out = python([
        script.as_os_str(),
        folder.as_os_str(),
        "--base".as_ref(),
        base.as_ref(),
        "--json".as_ref(),
    ]);
    serde_json::from_slice(&out.stdout).expect("the rows as JSON")
}

/// Write `text` to `dir/name` (a model TOML, a host file) and return its path as an argument.
pub fn write(dir: &Path, name: &str, text: &str) -> String {
    let p = dir.join(name);
    std::fs::write(&p, text).unwrap();
    p.to_str().unwrap().to_string()
}

/// Run `ft` with `args`, capturing its output.
pub fn ft(args: &[&str]) -> Output {
    ft_env(args, &[] as &[(&str, &str)])
}

/// Run `ft` with `args` and extra environment variables, capturing its output.
pub fn ft_env<K: AsRef<OsStr>, V: AsRef<OsStr>>(args: &[&str], env: &[(K, V)]) -> Output {
    let mut c = Command::new(env!("CARGO_BIN_EXE_ft"));
    c.args(args);
    for (k, v) in env {
        c.env(k, v);
    }
    c.output().expect("ft runs")
}

/// Run `ft` with `args` and its profile cache in `cache` (`FT_CACHE_DIR`).
pub fn ft_cached(cache: &Path, args: &[&str]) -> Output {
    ft_env(args, &[("FT_CACHE_DIR", cache)])
}

/// Assert that `ft` succeeded and parse its stdout as JSON.
pub fn json_ok(out: &Output) -> serde_json::Value {
    assert_ok(out);
    serde_json::from_slice(&out.stdout).expect("stdout is JSON")
}

/// Its stderr, as text.
pub fn stderr(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

/// Assert that `ft` succeeded; the failure message carries its exit status and stderr.
#[track_caller]
pub fn assert_ok(out: &Output) {
    assert!(
        out.status.success(),
        "ft failed ({}); stderr: {}",
        out.status,
        stderr(out)
    );
}

/// A tiny model: 16 experts of 64 x 32 in nvfp4, top-2, 2 layers (a few KB of experts), small
/// enough for a probe on the host device in a second.
pub const TINY_MODEL: &str = r#"
name = "tiny"
format = "nvfp4"
[geometry]
hidden = 64
intermediate = 32
experts = 16
top_k = 2
moe_layers = 2
"#;

/// The tiny model `ft run` tests decode on the host device: 16 experts of 64 x 128 in nvfp4,
/// top-4, 4 MoE layers, a shared expert and a dense part, so every strategy has work.
pub const TINY_RUN_MODEL: &str = include_str!("../fixtures/tiny-run-model.toml");

/// Flags that keep one probe to a couple of seconds on a 2-core machine.
pub const PROBE_FAST: &[&str] = &[
    "--device",
    "host",
    "--threads",
    "1",
    "--streams",
    "1,2",
    "--context",
    "16",
    "--long-context",
    "256",
    "--hybrid-fractions",
    "0.5",
    "--steps",
    "4",
    "--warmup",
    "2",
    "--budget-s",
    "1.5",
];

/// A GGUF header of a small MoE model (4 MoE blocks of 32 experts, 1024 wide, experts of
/// 512, q4_k gate/up and q6_k down as a `Q4_K_M` file has them), written by ft-model's test
/// writer (ferrox-gguf's encoder); the file is extended to its full length without writing
/// any tensor data.
pub fn write_gguf(path: &Path) {
    use ferrox_gguf::{GgmlType, GgufValue};
    let (h, i, e, layers) = (1024u64, 512u64, 32u64, 4u64);
    let meta = [
        ("general.architecture", GgufValue::String("qwen3moe".into())),
        ("general.name", GgufValue::String("walkthrough-moe".into())),
        ("qwen3moe.expert_used_count", GgufValue::U32(4)),
        ("qwen3moe.attention.head_count", GgufValue::U32(16)),
        ("qwen3moe.attention.head_count_kv", GgufValue::U32(4)),
    ];
    let mut tensors = Vec::new();
    for n in 0..layers {
        for (role, shape, t) in [
            ("attn_q", vec![h, h], GgmlType::Q8_0),
            ("attn_k", vec![h, h / 4], GgmlType::Q8_0),
            ("ffn_gate_inp", vec![h, e], GgmlType::F32),
            ("ffn_gate_exps", vec![h, i, e], GgmlType::Q4K),
            ("ffn_up_exps", vec![h, i, e], GgmlType::Q4K),
            ("ffn_down_exps", vec![i, h, e], GgmlType::Q6K),
        ] {
            tensors.push((format!("blk.{n}.{role}.weight"), shape, t));
        }
    }
    ft_model::import::gguf_test_support::write_header(path, &meta, tensors).unwrap();
}
