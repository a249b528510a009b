//! `ft bench cpu --quick --json` runs a tiny grid and reports positive numbers in the
//! documented shape.

mod common;
use common::assert_ok;

use std::process::Command;

#[test]
fn bench_cpu_quick_json_has_the_documented_shape() {
    let dir = tempfile::tempdir().unwrap();
    let csv = dir.path().join("r.csv");
    let out = Command::new(env!("CARGO_BIN_EXE_ft"))
        .args([
            "bench",
            "cpu",
            "--quick",
            "--json",
            "--format",
            "nvfp4,q4_0",
            "--path",
            "int8,f32",
            "--threads",
            "1",
            "--working-set-mib",
            "16",
            "--stream-mib",
            "16",
            "--save-csv",
        ])
        .arg(&csv)
        .output()
        .expect("the ft binary runs");
    assert_ok(&out);
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("stdout is JSON");
    assert!(v["machine"]["logical_cpus"].as_u64().unwrap() >= 1);
    assert_eq!(v["target_ratio"].as_f64().unwrap(), 0.75);
    let stream = v["stream"].as_array().unwrap();
    assert_eq!(stream.len(), 1);
    assert!(stream[0]["median_gbs"].as_f64().unwrap() > 0.0);
    let rows = v["results"].as_array().unwrap();
    // 2 formats x 2 paths x 1 thread count x 1 token count x 2 expert counts.
    assert_eq!(rows.len(), 8);
    for r in rows {
        for key in [
            "median_us",
            "p10_us",
            "p90_us",
            "weight_gbs",
            "stream_gbs",
            "ratio",
        ] {
            let x = r[key]
                .as_f64()
                .unwrap_or_else(|| panic!("{key} missing in {r}"));
            assert!(x > 0.0 && x.is_finite(), "{key} = {x} in {r}");
        }
        assert!(r["p10_us"].as_f64() <= r["p90_us"].as_f64());
        assert_eq!(r["threads"], 1);
        assert_eq!(r["model"], "qwen3.8-flash-next");
    }
    let text = std::fs::read_to_string(&csv).unwrap();
    assert_eq!(text.lines().count(), 1 + rows.len());
    assert!(text.starts_with("model,format,path,threads"));
}

#[test]
fn bench_cpu_refuses_bad_flags_with_exit_code_2() {
    let out = Command::new(env!("CARGO_BIN_EXE_ft"))
        .args(["bench", "cpu", "--quick", "--tokens", "0"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("--tokens 0"));
    let out = Command::new(env!("CARGO_BIN_EXE_ft"))
        .args(["bench", "cpu", "--quick", "--model", "nope"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("nope"));
}
