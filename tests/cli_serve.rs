//! `ft serve` and `ft loadgen` as a user runs them: the binary on loopback, the runtime's
//! engine on the host-emulated device with a tiny model.

mod common;
use common::assert_ok;

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

const TINY: &str = r#"
name = "tiny-serve"
format = "bf16"

[geometry]
hidden = 64
intermediate = 64
experts = 16
top_k = 4
moe_layers = 2
"#;

fn ft() -> Command {
    Command::new(env!("CARGO_BIN_EXE_ft"))
}

/// A running `ft serve` and the URL it printed.
struct Server {
    child: Child,
    addr: String,
    stdout: Vec<String>,
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn serve(dir: &std::path::Path, extra: &[&str]) -> Server {
    let model = dir.join("tiny.toml");
    std::fs::write(&model, TINY).unwrap();
    let child = ft()
        .args([
            "serve",
            "--device",
            "host",
            "--port",
            "0",
            "--max-streams",
            "4",
            "--context-limit",
            "512",
        ])
        .arg("--model")
        .arg(&model)
        .args(extra)
        .env("FT_CACHE_DIR", dir)
        .stdout(Stdio::piped())
        .stderr(std::fs::File::create(dir.join("serve.log")).unwrap())
        .spawn()
        .unwrap();
    // The guard kills and reaps the child on every path, a panic included.
    let mut server = Server {
        child,
        addr: String::new(),
        stdout: Vec::new(),
    };
    let mut out = BufReader::new(server.child.stdout.take().unwrap());
    let mut lines = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let mut line = String::new();
        if out.read_line(&mut line).unwrap_or(0) == 0 || Instant::now() > deadline {
            let err = std::fs::read_to_string(dir.join("serve.log")).unwrap_or_default();
            panic!("ft serve ended before listening: {lines:?}\n{err}");
        }
        lines.push(line.trim_end().to_string());
        // `listening on http://ADDR ...`, or with --json a JSON object with `listening`.
        let addr = match serde_json::from_str::<serde_json::Value>(&line) {
            Ok(v) => v["listening"]
                .as_str()
                .map(|u| u.trim_start_matches("http://").to_string()),
            Err(_) => line
                .trim_end()
                .strip_prefix("listening on http://")
                .and_then(|rest| rest.split_whitespace().next())
                .map(str::to_string),
        };
        if let Some(addr) = addr {
            server.addr = addr;
            server.stdout = lines;
            return server;
        }
    }
}

/// One HTTP/1.1 request on a fresh connection; returns (status, body as received).
fn request(addr: &str, method: &str, path: &str, body: &str) -> (u16, String) {
    let mut s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(60))).unwrap();
    write!(
        s,
        "{method} {path} HTTP/1.1\r\nHost: {addr}\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    )
    .unwrap();
    let mut raw = String::new();
    s.read_to_string(&mut raw).unwrap();
    let status = raw.split_whitespace().nth(1).unwrap().parse().unwrap();
    let body = raw
        .split_once("\r\n\r\n")
        .map(|x| x.1.to_string())
        .unwrap_or_default();
    (status, body)
}

#[test]
fn serve_answers_decides_and_drains_on_sigterm() {
    let dir = tempfile::tempdir().unwrap();
    let mut srv = serve(dir.path(), &["--moe-strategy", "offload"]);
    let decision = srv
        .stdout
        .iter()
        .find(|l| l.starts_with("decision:"))
        .unwrap();
    for needle in [
        "legacy ratio",
        "threshold",
        "offload (forced); auto would choose",
        "tok/s",
    ] {
        assert!(decision.contains(needle), "{needle} in {decision}");
    }

    let (s, body) = request(&srv.addr, "GET", "/health", "");
    assert_eq!(s, 200, "{body}");
    let (s, body) = request(
        &srv.addr,
        "POST",
        "/v1/completions",
        r#"{"prompt": "Hello", "max_tokens": 12, "temperature": 0, "ignore_eos": true}"#,
    );
    assert_eq!(s, 200, "{body}");
    let v: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert_eq!(v["usage"]["completion_tokens"], 12);
    let (s, again) = request(
        &srv.addr,
        "POST",
        "/v1/completions",
        r#"{"prompt": "Hello", "max_tokens": 12, "temperature": 0, "ignore_eos": true}"#,
    );
    assert_eq!(s, 200);
    let w: serde_json::Value = serde_json::from_str(&again).unwrap();
    assert_eq!(
        v["choices"][0]["text"], w["choices"][0]["text"],
        "greedy is deterministic"
    );
    let (s, body) = request(&srv.addr, "POST", "/v1/completions", "{not json");
    assert_eq!(s, 400, "{body}");
    assert!(body.contains("\"error\""));
    let (s, metrics) = request(&srv.addr, "GET", "/metrics", "");
    assert_eq!(s, 200);
    assert!(
        metrics.contains("ft_strategy{strategy=\"offload\"} 1"),
        "{metrics}"
    );
    assert!(
        metrics.contains("ft_predicted_tokens_per_second"),
        "{metrics}"
    );

    // A streamed request in flight when SIGTERM arrives completes whole.
    let addr = srv.addr.clone();
    let inflight = std::thread::spawn(move || {
        request(
            &addr,
            "POST",
            "/v1/chat/completions",
            r#"{"messages": [{"role": "user", "content": "long"}], "max_tokens": 300, "temperature": 0, "ignore_eos": true, "stream": true}"#,
        )
    });
    // Wait until the request is in flight (bounded), then SIGTERM.
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let (_, h) = request(&srv.addr, "GET", "/health", "");
        let v: serde_json::Value = serde_json::from_str(&h).unwrap();
        if v["in_flight"].as_u64() == Some(1) || Instant::now() > deadline {
            break;
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    let kill = Command::new("kill")
        .args(["-TERM", &srv.child.id().to_string()])
        .status()
        .unwrap();
    assert!(kill.success());
    let (s, body) = inflight.join().unwrap();
    assert_eq!(s, 200);
    assert!(body.contains("data: [DONE]"), "{body}");
    assert!(body.contains("\"finish_reason\":\"length\""), "{body}");
    let status = srv.child.wait().unwrap();
    assert!(status.success(), "{status:?}");
    assert!(
        TcpStream::connect(&srv.addr).is_err(),
        "no longer accepting"
    );
}

#[test]
fn loadgen_replays_the_protocol_against_serve() {
    let dir = tempfile::tempdir().unwrap();
    let srv = serve(dir.path(), &["--moe-strategy", "auto", "--json"]);
    let start: serde_json::Value = serde_json::from_str(&srv.stdout[0]).unwrap();
    assert_eq!(start["auto"], true);
    assert!(start["decision"]["estimates"].as_array().unwrap().len() == 4);
    let out = ft()
        .args(["loadgen", "--url", &format!("http://{}", srv.addr)])
        .args([
            "--streams",
            "1,2",
            "--warmup",
            "1",
            "--prompt-tokens",
            "48",
            "--max-tokens",
            "16",
            "--json",
        ])
        .output()
        .unwrap();
    assert_ok(&out);
    let r: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let runs = r["runs"].as_array().unwrap();
    assert_eq!(runs.len(), 2);
    assert_eq!(runs[1]["concurrency"], 2);
    for run in runs {
        assert_eq!(run["errors"], 0);
        for s in run["streams"].as_array().unwrap() {
            assert_eq!(s["completion_tokens"], 16);
            assert!(s["decode_tok_s"].as_f64().unwrap() > 0.0);
            assert_eq!(s["prompt_tokens"], 49, "BOS + 48 bytes");
        }
    }
    assert_eq!(r["warmup"].as_array().unwrap().len(), 1);
    let table = ft()
        .args(["loadgen", "--url", &format!("http://{}", srv.addr)])
        .args([
            "--streams",
            "1",
            "--warmup",
            "0",
            "--prompt-tokens",
            "16",
            "--max-tokens",
            "4",
        ])
        .output()
        .unwrap();
    let t = String::from_utf8_lossy(&table.stdout);
    assert!(t.contains("decode tok/s") && t.contains("mean"), "{t}");
}

/// A checkpoint for TINY's experts: every matrix an F32 tensor `[rows, cols]` (gate and up
/// `[intermediate, hidden]`, down `[hidden, intermediate]`), `layers` layers of them.
fn write_tiny_checkpoint(path: &std::path::Path, layers: usize) {
    use safetensors::tensor::TensorView;
    use safetensors::Dtype;
    let (h, i, experts) = (64usize, 64usize, 16usize);
    let mut owned: Vec<(String, Vec<usize>, Vec<u8>)> = Vec::new();
    for l in 0..layers {
        for e in 0..experts {
            for (m, which) in ["gate", "up", "down"].iter().enumerate() {
                let (rows, cols) = if m < 2 { (i, h) } else { (h, i) };
                let bytes: Vec<u8> = (0..rows * cols)
                    .flat_map(|k| {
                        let v = ((k * 31 + l * 7 + e * 3 + m) % 23) as f32 / 23.0 - 0.5;
                        (0.2 * v).to_le_bytes()
                    })
                    .collect();
                let name = format!("model.layers.{l}.mlp.experts.{e}.{which}_proj.weight");
                owned.push((name, vec![rows, cols], bytes));
            }
        }
    }
    let views: Vec<(String, TensorView<'_>)> = owned
        .iter()
        .map(|(n, s, b)| {
            (
                n.clone(),
                TensorView::new(Dtype::F32, s.clone(), b).unwrap(),
            )
        })
        .collect();
    safetensors::serialize_to_file(views, &None, path).unwrap();
}

#[test]
fn serve_decodes_with_checkpoint_experts() {
    let dir = tempfile::tempdir().unwrap();
    let ckpt = dir.path().join("experts.safetensors");
    write_tiny_checkpoint(&ckpt, 2);
    let ckpt_s = ckpt.to_str().unwrap();
    let mut srv = serve(
        dir.path(),
        &["--moe-strategy", "hybrid", "--expert-weights", ckpt_s],
    );
    let body = r#"{"prompt": "checkpoint", "max_tokens": 6, "temperature": 0}"#;
    let (s, a) = request(&srv.addr, "POST", "/v1/completions", body);
    assert_eq!(s, 200, "{a}");
    let (s, b) = request(&srv.addr, "POST", "/v1/completions", body);
    assert_eq!(s, 200, "{b}");
    let text = |r: &str| -> String {
        let j = r.find('{').map(|k| &r[k..]).unwrap_or(r);
        let v: serde_json::Value = serde_json::from_str(j).unwrap_or_default();
        v["choices"][0]["text"]
            .as_str()
            .unwrap_or_default()
            .to_string()
    };
    // Greedy decoding over the same checkpoint is deterministic.
    assert_eq!(text(&a), text(&b), "{a}\n{b}");
    assert!(a.contains("\"completion_tokens\":6"), "{a}");
    let _ = srv.child.kill();

    // A checkpoint with fewer layers than the model is refused, naming the missing tensor.
    let short = dir.path().join("short.safetensors");
    write_tiny_checkpoint(&short, 1);
    let model = dir.path().join("tiny.toml");
    let out = ft()
        .args([
            "serve",
            "--device",
            "host",
            "--port",
            "0",
            "--moe-strategy",
            "offload",
        ])
        .arg("--model")
        .arg(&model)
        .arg("--expert-weights")
        .arg(&short)
        .env("FT_CACHE_DIR", dir.path())
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("short.safetensors"), "{err}");
    assert!(
        err.contains("model.layers.1.mlp.experts.0.gate_proj.weight"),
        "{err}"
    );
    // The file as --model is pointed at --expert-weights.
    let out = ft().args(["serve", "--model", ckpt_s]).output().unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("--expert-weights"));
}

/// A profile fitted at another thread count than the server's CPU pool is re-expressed at
/// the pool's: the start-up prediction says so, and its CPU rate is the model's own at the
/// pool's threads.
#[test]
fn serve_predicts_at_its_pools_thread_count() {
    use ft_model::host::HostSpec;
    use ft_model::profile::{store, Profile};
    use ft_model::ModelSpec;
    let dir = tempfile::tempdir().unwrap();
    let model = ModelSpec::preset("qwen3.8-flash-next").unwrap();
    let profile = Profile::of_host_spec(&HostSpec::field_report(), &model).unwrap();
    let fitted_at = profile.params.cpu_threads;
    let path = store(dir.path(), &profile).unwrap();
    let predict = |threads: u32| {
        let t = threads.to_string();
        let out = ft()
            .args([
                "serve",
                "--backend",
                "reference",
                "--profile",
                path.to_str().unwrap(),
                "--threads",
                &t,
                "--predict-only",
                "--json",
            ])
            .output()
            .unwrap();
        assert_ok(&out);
        let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        v["source"].as_str().unwrap().to_string()
    };
    let other = if fitted_at == 6 { 5 } else { 6 };
    let source = predict(other);
    assert!(
        source.contains(&format!(
            "re-expressed at the pool's {other} threads (fitted at {fitted_at})"
        )),
        "{source}"
    );
    let same = predict(fitted_at);
    assert!(!same.contains("re-expressed"), "{same}");
}

/// At start the engine backend times the CPU side's own work (the CPU check) and, where the
/// profile holds a check of the same work, predicts the CPU side at that speed and says so;
/// `--no-cpu-check` keeps the probed speed.
#[test]
fn serve_scales_the_cpu_side_by_the_check_at_start() {
    use ft_model::host::HostSpec;
    use ft_model::profile::{store, CpuCheck, Profile};
    use ft_model::ModelSpec;
    let dir = tempfile::tempdir().unwrap();
    let toml = dir.path().join("tiny.toml");
    std::fs::write(&toml, TINY).unwrap();
    let model = ModelSpec::resolve(toml.to_str().unwrap()).unwrap();
    let mut profile = Profile::of_host_spec(&HostSpec::field_report(), &model).unwrap();
    // The probe's check of the work the server times (top_k experts at one token, one
    // thread), slow enough that any machine runs it faster now.
    profile.cpu_checks = vec![CpuCheck {
        experts: model.geometry.top_k as u32,
        tokens_per_expert: 1,
        expert_bytes: model.expert_bytes() as f64,
        threads: 1,
        time_us: 1e9,
        reps: 1,
    }];
    let profiles = dir.path().join("profiles");
    let path = store(&profiles, &profile).unwrap();
    let source = |extra: &[&str]| {
        let mut args = vec![
            "--profile",
            path.to_str().unwrap(),
            "--threads",
            "1",
            "--json",
        ];
        args.extend_from_slice(extra);
        let srv = serve(dir.path(), &args);
        let v: serde_json::Value = serde_json::from_str(srv.stdout.last().unwrap()).unwrap();
        v["source"].as_str().unwrap().to_string()
    };
    let checked = source(&[]);
    assert!(
        checked.contains("x the probe's (the CPU check at start:"),
        "{checked}"
    );
    let speed: f64 = checked
        .split("CPU side at ")
        .nth(1)
        .and_then(|r| r.split('x').next())
        .unwrap()
        .parse()
        .unwrap();
    assert!(speed > 1.0, "{checked}");
    let probed = source(&["--no-cpu-check"]);
    assert!(!probed.contains("CPU side at"), "{probed}");
}

#[test]
fn bad_arguments_are_named() {
    let out = ft()
        .args(["serve", "--expected-streams", "0", "--backend", "reference"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("--expected-streams"));
    let out = ft()
        .args(["serve", "--fetch-fraction", "2", "--backend", "reference"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("--fetch-fraction"));
    let out = ft()
        .args([
            "loadgen",
            "--url",
            "http://10.1.2.3:1",
            "--stress-clients",
            "2",
        ])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("loopback"));
}

/// `--strategy layer-split:N` serves: the first layer's experts on the CPU, the other's
/// resident, greedy completions as deterministic as any other strategy's.
#[test]
fn serve_runs_layer_split() {
    let dir = tempfile::tempdir().unwrap();
    let srv = serve(dir.path(), &["--strategy", "layer-split:1", "--json"]);
    let start: serde_json::Value = serde_json::from_str(&srv.stdout[0]).unwrap();
    assert_eq!(start["auto"], false);
    assert_eq!(start["strategy"]["kind"], "layer-split", "{start}");
    assert_eq!(start["strategy"]["cpu_layers"]["fixed"], 1, "{start}");
    let body = r#"{"prompt": "Hello", "max_tokens": 8, "temperature": 0, "ignore_eos": true}"#;
    let (s, a) = request(&srv.addr, "POST", "/v1/completions", body);
    assert_eq!(s, 200, "{a}");
    let v: serde_json::Value = serde_json::from_str(&a).unwrap();
    assert_eq!(v["usage"]["completion_tokens"], 8);
}
