//! The bad-input list (issue 44): every way a careless user or an attacker was seen to break
//! `ft` from its command line, and more, each run against the built binary under a 2 GiB
//! address-space limit (`RLIMIT_AS`, set in the child before `exec`) and a time bound.
//! Every case must end with exit code 2, a message on stderr naming the input, nothing on
//! stdout and no panic; an allocation the limit refuses aborts the child, which fails the
//! case (no exit code 2), so "bounded memory" is checked, not assumed.
//!
//! The fixtures (bad model TOMLs, mutated profiles, binary garbage, empty files, a symlink
//! to `/dev/zero`, a sparse file beyond the size limit) are written at run time into a
//! temporary folder, which is also `FT_CACHE_DIR`, so no case reads or writes the user's
//! profile cache.
//!
//! The HTTP half ([`every_bad_http_request_is_refused_cleanly_under_2_gib`]) runs one `ft
//! serve` under the same limit and sends it a table of malformed requests: each must get its
//! status with a JSON error body (or, for a client that never finishes its headers, the
//! connection closed at the header timeout), the server must go on serving, and SIGTERM must
//! stop it cleanly within its shutdown deadline.

use std::io::Read as _;
use std::os::unix::process::CommandExt as _;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use ft_model::host::HostSpec;
use ft_model::profile::Profile;
use ft_model::ModelSpec;

/// The address-space limit of every case, in bytes (the acceptance: 2 GiB).
pub const ADDRESS_SPACE_BYTES: u64 = 2 << 30;

/// Wall time one case may take before it counts as a hang, in s. Every case is refused
/// before any real work; a few ms each on the 2-core CI machine, a second at worst under
/// load.
pub const CASE_TIMEOUT: Duration = Duration::from_secs(20);

/// How a limited run ended.
pub struct Limited {
    /// Exit code (`None`: killed by a signal, e.g. an abort on a refused allocation, or by
    /// the timeout).
    pub code: Option<i32>,
    /// Its stdout.
    pub stdout: Vec<u8>,
    /// Its stderr, as text.
    pub stderr: String,
    /// Wall time.
    pub elapsed: Duration,
    /// True when it ran past the time bound and was killed.
    pub timed_out: bool,
}

/// Limit the address space of the child `cmd` starts to `as_bytes` (`RLIMIT_AS`, set in the
/// child before `exec`). The piece the CLI and HTTP bad-input lists share.
pub fn limit_address_space(cmd: &mut Command, as_bytes: u64) {
    // SAFETY: the closure runs in the forked child before exec and calls only setrlimit,
    // which is async-signal-safe; it touches no memory shared with the parent.
    unsafe {
        cmd.pre_exec(move || {
            let lim = libc::rlimit {
                rlim_cur: as_bytes as libc::rlim_t,
                rlim_max: as_bytes as libc::rlim_t,
            };
            if libc::setrlimit(libc::RLIMIT_AS, &lim) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
}

/// Run `cmd` under an address-space limit of `as_bytes` and a wall-time bound, stdin closed;
/// killed at the bound.
pub fn run_limited(mut cmd: Command, as_bytes: u64, timeout: Duration) -> Limited {
    cmd.stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    limit_address_space(&mut cmd, as_bytes);
    let start = Instant::now();
    let mut child = cmd.spawn().expect("the command starts");
    // Drain both pipes on threads so that a chatty child never blocks on a full pipe.
    let drain = |mut r: Box<dyn std::io::Read + Send>| {
        std::thread::spawn(move || {
            let mut v = Vec::new();
            let _ = r.read_to_end(&mut v);
            v
        })
    };
    let out = drain(Box::new(child.stdout.take().unwrap()));
    let err = drain(Box::new(child.stderr.take().unwrap()));
    let mut timed_out = false;
    let status = loop {
        if let Some(s) = child.try_wait().expect("wait") {
            break s;
        }
        if start.elapsed() > timeout {
            timed_out = true;
            let _ = child.kill();
            break child.wait().expect("wait after kill");
        }
        std::thread::sleep(Duration::from_millis(5));
    };
    Limited {
        code: status.code(),
        stdout: out.join().unwrap(),
        stderr: String::from_utf8_lossy(&err.join().unwrap()).into_owned(),
        elapsed: start.elapsed(),
        timed_out,
    }
}

/// One bad input: the arguments and a piece of text stderr must hold (the input it names).
struct Case {
    args: Vec<String>,
    names: String,
}

/// The fixtures' folder and the cases' builder.
struct List {
    dir: tempfile::TempDir,
    cases: Vec<Case>,
}

impl List {
    fn path(&self, name: &str) -> String {
        self.dir.path().join(name).display().to_string()
    }

    /// Write a fixture; its path.
    fn file(&self, name: &str, bytes: impl AsRef<[u8]>) -> String {
        std::fs::write(self.dir.path().join(name), bytes).unwrap();
        self.path(name)
    }

    /// A case whose stderr must contain `names`.
    fn add(&mut self, args: &[&str], names: &str) {
        self.cases.push(Case {
            args: args.iter().map(|s| s.to_string()).collect(),
            names: names.to_string(),
        });
    }

    /// The same bad flag for several subcommands (with `prefix` arguments each).
    fn each(&mut self, commands: &[&[&str]], tail: &[&str], names: &str) {
        for c in commands {
            let mut a: Vec<&str> = c.to_vec();
            a.extend_from_slice(tail);
            self.add(&a, names);
        }
    }
}

/// A model TOML with the given geometry lines (and format).
fn model_toml(format: &str, geometry: &str) -> String {
    format!("name = \"bad\"\nformat = \"{format}\"\n[geometry]\n{geometry}\n")
}

const GOOD_GEOMETRY: &str =
    "hidden = 2560\nintermediate = 640\nexperts = 512\ntop_k = 10\nmoe_layers = 48";

fn build() -> List {
    let mut l = List {
        dir: tempfile::tempdir().unwrap(),
        cases: Vec::new(),
    };
    let d = l.dir.path().to_path_buf();

    // ---- fixtures
    let qwen = ModelSpec::preset("qwen3.8-flash-next").unwrap();
    let good_profile = Profile::of_host_spec(&HostSpec::field_report(), &qwen).unwrap();
    let profile_value = serde_json::to_value(&good_profile).unwrap();
    let good = l.file("good.json", serde_json::to_vec(&profile_value).unwrap());
    let mutated = |name: &str, edit: &dyn Fn(&mut serde_json::Value)| {
        let mut v = profile_value.clone();
        edit(&mut v);
        let p = d.join(name);
        std::fs::write(&p, serde_json::to_vec(&v).unwrap()).unwrap();
        p.display().to_string()
    };
    let cov_rows = mutated("cov-rows.json", &|v| {
        v["covariance"]["matrix"].as_array_mut().unwrap().pop();
    });
    let cov_cols = mutated("cov-cols.json", &|v| {
        v["covariance"]["matrix"][0]
            .as_array_mut()
            .unwrap()
            .push(1.0.into());
    });
    let cov_params = mutated("cov-params.json", &|v| {
        v["covariance"]["params"]
            .as_array_mut()
            .unwrap()
            .push("gather-gbs".into());
    });
    let fast = mutated("fast.json", &|v| v["params"]["gather_gbs"] = 1e12.into());
    let fast_dram = mutated("fast-dram.json", &|v| v["params"]["dram_gbs"] = 1e9.into());
    let null_param = mutated("null.json", &|v| {
        v["params"]["cpu_gbs"] = serde_json::Value::Null
    });
    let neg = mutated("neg.json", &|v| v["params"]["sync_us"] = (-5.0).into());
    let threads = mutated("threads.json", &|v| {
        v["params"]["cpu_threads"] = 100_000.into()
    });
    let bad_key = mutated("bad-key.json", &|v| {
        v["key"]["model"]["geometry"]["top_k"] = 100_000.into()
    });
    let unknown = mutated("unknown.json", &|v| v["surprise"] = 1.into());
    let bad_sample =
        mutated(
            "bad-sample.json",
            &|v| {
                v["samples"]["round_trip"] =
                    serde_json::json!([{"streams": 1, "hidden": 64, "time_us": -1.0}])
            },
        );
    let bad_check = mutated("bad-check.json", &|v| {
        v["cpu_checks"] = serde_json::json!([{"experts": 1, "tokens_per_expert": 1,
            "expert_bytes": 1.0, "threads": 0, "time_us": 0.0, "reps": 1}])
    });
    let truncated = {
        let text = serde_json::to_string(&profile_value).unwrap();
        l.file("truncated.json", &text[..text.len() / 2])
    };
    let array = l.file("array.json", "[1, 2, 3]");
    let empty_json = l.file("empty.json", "");
    let empty_toml = l.file("empty.toml", "");
    let garbage: Vec<u8> = (0..4096u32)
        .map(|i| (i.wrapping_mul(2_654_435_761) >> 13) as u8)
        .collect();
    let garbage_json = l.file("garbage.json", &garbage);
    let garbage_toml = l.file("garbage.toml", &garbage);
    let garbage_trace = l.file("garbage.jsonl", &garbage);
    let garbage_csv = l.file("garbage.csv", &garbage);
    let zero_json = l.path("zero.json");
    std::os::unix::fs::symlink("/dev/zero", &zero_json).unwrap();
    let zero_toml = l.path("zero.toml");
    std::os::unix::fs::symlink("/dev/zero", &zero_toml).unwrap();
    let urandom_toml = l.path("urandom.toml");
    std::os::unix::fs::symlink("/dev/urandom", &urandom_toml).unwrap();
    let loop_toml = l.path("loop.toml");
    std::os::unix::fs::symlink(&loop_toml, &loop_toml).unwrap();
    let dir_toml = l.path("folder.toml");
    std::fs::create_dir(&dir_toml).unwrap();
    let dir_json = l.path("folder.json");
    std::fs::create_dir(&dir_json).unwrap();
    let sparse = l.path("sparse.json");
    std::fs::File::create(&sparse)
        .unwrap()
        .set_len(ft_model::limits::MAX_PROFILE_BYTES + 1)
        .unwrap();
    let sparse_toml = l.path("sparse.toml");
    std::fs::File::create(&sparse_toml)
        .unwrap()
        .set_len(ft_model::limits::MAX_TOML_BYTES + 1)
        .unwrap();
    let models: Vec<(String, &str)> = vec![
        (
            model_toml("nvfp4", "hidden = 1099511627776\nintermediate = 1099511627776\nexperts = 512\ntop_k = 10\nmoe_layers = 48"),
            "geometry.hidden",
        ),
        (
            model_toml("bf16", "hidden = 131072\nintermediate = 131072\nexperts = 65536\ntop_k = 10\nmoe_layers = 1024"),
            "geometry.experts x geometry.moe_layers",
        ),
        (
            model_toml("nvfp4", "hidden = 2560\nintermediate = 640\nexperts = 100000000\ntop_k = 10\nmoe_layers = 48"),
            "geometry.experts",
        ),
        (
            model_toml("nvfp4", "hidden = 2560\nintermediate = 640\nexperts = 512\ntop_k = 10\nmoe_layers = 1000000"),
            "geometry.moe_layers",
        ),
        (
            model_toml("nvfp4", "hidden = 2560\nintermediate = 640\nexperts = 512\ntop_k = 600\nmoe_layers = 48"),
            "geometry.top_k",
        ),
        (
            model_toml("nvfp4", "hidden = 2561\nintermediate = 640\nexperts = 512\ntop_k = 10\nmoe_layers = 48"),
            "geometry.hidden",
        ),
        (
            model_toml("nvfp4", "hidden = 0\nintermediate = 640\nexperts = 512\ntop_k = 10\nmoe_layers = 48"),
            "geometry.hidden",
        ),
        (
            model_toml("nvfp4", "hidden = -2560\nintermediate = 640\nexperts = 512\ntop_k = 10\nmoe_layers = 48"),
            "hidden",
        ),
        (
            model_toml("nvfp4", "hidden = 2560.5\nintermediate = 640\nexperts = 512\ntop_k = 10\nmoe_layers = 48"),
            "hidden",
        ),
        (
            model_toml("nvfp4", "hidden = nan\nintermediate = 640\nexperts = 512\ntop_k = 10\nmoe_layers = 48"),
            "hidden",
        ),
        (
            model_toml("nvfp4", &format!("{GOOD_GEOMETRY}\nshared_experts = 1000000")),
            "geometry.shared_experts",
        ),
        (
            model_toml("nvfp4", &format!("{GOOD_GEOMETRY}\nhiden = 3")),
            "hiden",
        ),
        (model_toml("fp3", GOOD_GEOMETRY), "fp3"),
        (
            format!(
                "{}[dense]\nweight_bytes_per_layer = 1\nkv_bytes_per_token = 18446744073709551615\n",
                model_toml("nvfp4", GOOD_GEOMETRY)
            ),
            "kv_bytes_per_token",
        ),
        (
            format!(
                "{}[dense]\nweight_bytes_per_layer = 18446744073709551615\nkv_bytes_per_token = 1\n",
                model_toml("nvfp4", GOOD_GEOMETRY)
            ),
            "weight_bytes_per_layer",
        ),
        ("name = \"\"\nformat = \"nvfp4\"\n[geometry]\nhidden = 2560\nintermediate = 640\nexperts = 512\ntop_k = 10\nmoe_layers = 48\n".to_string(), "name"),
        ("[[[".to_string(), "bad-"),
    ];
    let model_files: Vec<(String, String)> = models
        .iter()
        .enumerate()
        .map(|(i, (text, names))| (l.file(&format!("bad-{i}.toml"), text), names.to_string()))
        .collect();
    let host_bad = l.file(
        "host-bad.toml",
        HostSpec::field_report()
            .to_toml()
            .replace("threads = ", "threads = 0\nx_threads = "),
    );
    let long_sweep = (1..=1000)
        .map(|i| i.to_string())
        .collect::<Vec<_>>()
        .join(",");
    let streams_sweep = format!("streams={long_sweep}");
    let context_sweep = format!("context={long_sweep}");
    let seed_sweep = format!("seed={long_sweep}");
    let out_missing = l.path("no/such/folder/out.csv");

    // ---- the reproductions
    l.add(
        &["simulate", "--steps", "1000000000000"],
        "--steps 1000000000000",
    );
    l.add(
        &["predict", "--streams", "100000000"],
        "--streams 100000000",
    );
    l.add(
        &[
            "run",
            "--model",
            "qwen3.8-flash-next",
            "--strategy",
            "offload",
            "--threads",
            "100000",
        ],
        "--threads 100000",
    );
    l.add(
        &["simulate", "--context", "18446744073709551615"],
        "--context 18446744073709551615",
    );
    l.add(
        &[
            "simulate",
            "--sweep",
            &streams_sweep,
            "--sweep",
            &context_sweep,
            "--sweep",
            &seed_sweep,
        ],
        "--sweep",
    );
    l.add(&["predict", "--profile", &zero_json], &zero_json);
    l.add(
        &["predict", "--model", &model_files[0].0],
        "geometry.hidden",
    );
    l.add(&["predict", "--profile", &cov_rows], "covariance.matrix");
    l.add(&["predict", "--profile", &fast], "gather_gbs");
    l.add(
        &["predict", "--profile", &good, "--model", "gpt-oss-120b"],
        "probed for model 'qwen3.8-flash-next'",
    );
    l.add(&["explain", "--profile", &cov_cols], "covariance.matrix");

    // ---- predict and explain: numbers
    let pe: &[&[&str]] = &[&["predict"], &["explain"]];
    l.each(pe, &["--streams", "0"], "--streams 0");
    l.each(pe, &["--streams=-1"], "--streams");
    l.each(pe, &["--streams", "abc"], "--streams");
    l.each(pe, &["--streams", ""], "--streams");
    l.each(pe, &["--context", "18446744073709551616"], "--context");
    l.each(pe, &["--context", "99999999999"], "--context 99999999999");
    l.add(
        &["predict", "--steps", "1000000000000"],
        "--steps 1000000000000",
    );
    l.add(
        &["predict", "--warmup", "1000000000000"],
        "--warmup 1000000000000",
    );
    l.add(&["predict", "--steps", "1e3"], "--steps");
    l.each(pe, &["--cache-gb", "nan"], "--cache-gb");
    l.each(pe, &["--cache-gb=-5"], "--cache-gb");
    l.add(&["predict", "--cache-gb", "inf"], "--cache-gb");
    l.add(&["predict", "--cache-gb", "0"], "--cache-gb");
    l.add(
        &["predict", "--cache-slots", "99999999999"],
        "--cache-slots 99999999999",
    );
    l.add(&["predict", "--cache-slots=-1"], "--cache-slots");
    l.add(&["predict", "--miss-rate", "2"], "miss");
    l.add(&["predict", "--miss-rate", "nan"], "miss");
    l.add(&["predict", "--fetch-fraction", "1.5"], "--fetch-fraction");
    l.add(&["predict", "--fetch-fraction", "nan"], "--fetch-fraction");
    l.add(&["predict", "--fetch-fraction", "half"], "--fetch-fraction");
    l.add(&["predict", "--threshold", "nan"], "--threshold");
    l.add(&["predict", "--threshold=-1"], "--threshold");
    l.add(&["predict", "--cpu-speed", "0"], "--cpu-speed");
    l.add(&["predict", "--cpu-speed", "inf"], "--cpu-speed");
    l.add(&["predict", "--seed", "-1"], "-1");
    l.add(&["predict", "--seed", "18446744073709551616"], "--seed");
    // names
    l.each(pe, &["--policy", "mru"], "mru");
    l.each(pe, &["--routing", "zipfian"], "zipfian");
    l.add(
        &["predict", "--routing", "/nonexistent/r.toml"],
        "/nonexistent/r.toml",
    );
    l.add(&["predict", "--routing", &garbage_trace], &garbage_trace);
    l.each(pe, &["--model", "llama-9000"], "llama-9000");
    l.add(
        &["predict", "--model", "/nonexistent/m.toml"],
        "/nonexistent/m.toml",
    );
    l.each(pe, &["--host", "cray-1"], "cray-1");
    l.add(
        &["predict", "--host", "/nonexistent/h.toml"],
        "/nonexistent/h.toml",
    );
    l.add(&["predict", "--cpu-check", "host"], "--profile");
    l.add(
        &["predict", "--profile", &good, "--host", "gh200"],
        "--host",
    );
    l.add(
        &["predict", "--cache-slots", "4", "--cache-gb", "1"],
        "--cache-gb",
    );
    l.add(&["predict", "--no-such-flag"], "--no-such-flag");
    l.add(&["predict", "--json=yes"], "--json");
    l.add(&["predict", "stray"], "stray");
    // files: every bad model file, through predict, and a few through simulate and run
    for (path, names) in &model_files {
        l.add(&["predict", "--model", path], names);
    }
    for (path, names) in model_files.iter().take(4) {
        l.add(&["simulate", "--model", path], names);
        l.add(&["probe", "--model", path], names);
    }
    for (path, names) in model_files.iter().take(2) {
        l.add(&["run", "--model", path, "--strategy", "offload"], names);
    }
    for (path, names) in [
        (&empty_toml, "name"),
        (&garbage_toml, garbage_toml.as_str()),
        (&zero_toml, zero_toml.as_str()),
        (&urandom_toml, urandom_toml.as_str()),
        (&loop_toml, loop_toml.as_str()),
        (&dir_toml, dir_toml.as_str()),
        (&sparse_toml, sparse_toml.as_str()),
    ] {
        l.add(&["predict", "--model", path], names);
        l.add(&["predict", "--host", path], path);
    }
    l.add(&["predict", "--host", &host_bad], &host_bad);
    l.add(&["simulate", "--host", &zero_toml], &zero_toml);
    l.add(&["simulate", "--routing", &zero_toml], &zero_toml);
    // profiles, through --profile, --host (a .json host is a profile) and simulate --host
    for (path, names) in [
        (&cov_rows, "covariance.matrix"),
        (&cov_cols, "covariance.matrix"),
        (&cov_params, "covariance"),
        (&fast, "gather_gbs"),
        (&fast_dram, "dram_gbs"),
        (&null_param, "params.cpu_gbs"),
        (&neg, "sync_us"),
        (&threads, "cpu_threads"),
        (&bad_key, "geometry.top_k"),
        (&unknown, "surprise"),
        (&bad_sample, "time_us"),
        (&bad_check, "cpu_checks"),
        (&truncated, truncated.as_str()),
        (&array, array.as_str()),
        (&empty_json, empty_json.as_str()),
        (&garbage_json, garbage_json.as_str()),
        (&zero_json, zero_json.as_str()),
        (&dir_json, dir_json.as_str()),
        (&sparse, "limit"),
    ] {
        l.add(&["predict", "--profile", path], names);
    }
    for (path, names) in [
        (&cov_rows, "covariance.matrix"),
        (&fast, "gather_gbs"),
        (&zero_json, zero_json.as_str()),
        (&garbage_json, garbage_json.as_str()),
    ] {
        l.add(&["predict", "--host", path], names);
        l.add(&["simulate", "--host", path], names);
        l.add(&["validate", "peer", "--profile", path], names);
    }
    l.add(
        &["predict", "--host", &good, "--model", "gpt-oss-120b"],
        "probed for model",
    );
    l.add(
        &["predict", "--profile", "/nonexistent/p.json"],
        "/nonexistent/p.json",
    );

    // ---- simulate
    let sim: &[&[&str]] = &[&["simulate"]];
    l.add(
        &["simulate", "--warmup", "1000000000000"],
        "--warmup 1000000000000",
    );
    l.add(
        &[
            "simulate",
            "--context",
            "16777216",
            "--output-tokens",
            "1000",
        ],
        "--context 16777216",
    );
    l.add(
        &["simulate", "--output-tokens", "18446744073709551615"],
        "--output-tokens",
    );
    l.add(&["simulate", "--streams", "0"], "--streams");
    l.add(
        &["simulate", "--streams", "100000000"],
        "--streams 100000000",
    );
    l.add(&["simulate", "--streams", "1,0"], "--streams");
    l.add(&["simulate", "--streams=-3"], "--streams");
    l.add(&["simulate", "--streams", "1,,x"], "--streams");
    l.add(&["simulate", "--sweep", "bogus=1,2"], "bogus");
    l.add(&["simulate", "--sweep", "streams"], "--sweep");
    l.add(&["simulate", "--sweep", "streams="], "--sweep");
    l.add(
        &["simulate", "--sweep", "steps=1000000000000"],
        "--sweep steps",
    );
    l.add(
        &["simulate", "--sweep", "context=99999999999"],
        "--sweep context",
    );
    l.add(&["simulate", "--sweep", "streams=0"], "--sweep streams");
    l.add(
        &["simulate", "--sweep", "streams=100000000"],
        "--sweep streams",
    );
    l.add(&["simulate", "--sweep", "streams=abc"], "--sweep streams");
    l.add(&["simulate", "--sweep", "policy=mru"], "mru");
    l.each(
        sim,
        &["--cache-slots", "99999999999"],
        "--cache-slots 99999999999",
    );
    l.add(&["simulate", "--strategy", "teleport"], "teleport");
    l.add(&["simulate", "--fetch-fraction", "7"], "--fetch-fraction");
    l.add(&["simulate", "--policy", "mru"], "mru");
    l.add(&["simulate", "--routing", "zipfian"], "zipfian");
    l.add(&["simulate", "--host", "cray-1"], "cray-1");
    l.add(&["simulate", "--model", "llama-9000"], "llama-9000");
    l.add(&["simulate", "--steps", "many"], "--steps");
    l.add(&["simulate", "--jitter", "x"], "--jitter");
    l.add(
        &[
            "simulate",
            "--streams",
            "1",
            "--steps",
            "4",
            "--warmup",
            "1",
            "--out",
            &out_missing,
        ],
        &out_missing,
    );

    // ---- run (the real runtime): refused before a device, bank or thread is made
    let run: &[&str] = &[
        "run",
        "--model",
        "qwen3.8-flash-next",
        "--strategy",
        "offload",
    ];
    let with =
        |tail: &[&str]| -> Vec<String> { run.iter().chain(tail).map(|s| s.to_string()).collect() };
    for (tail, names) in [
        (&["--threads", "0"][..], "--threads 0"),
        (&["--threads", "4294967296000"], "--threads"),
        (&["--streams", "0"], "--streams"),
        (&["--streams", "100000000"], "--streams 100000000"),
        (&["--steps", "0"], "--steps"),
        (&["--steps", "1000000000000"], "--steps 1000000000000"),
        (&["--warmup", "1000000000000"], "--warmup 1000000000000"),
        (&["--context", "99999999999"], "--context 99999999999"),
        (&["--repeat", "0"], "--repeat"),
        (&["--repeat", "1000000"], "--repeat 1000000"),
        (&["--layers", "100000"], "--layers 100000"),
        (&["--layers", "0"], "--layers"),
        (
            &["--cache-slots", "99999999999"],
            "--cache-slots 99999999999",
        ),
        (&["--device", "tpu"], "tpu"),
        (&["--pool-wait", "nap"], "nap"),
        (&["--policy", "mru"], "mru"),
    ] {
        let a = with(tail);
        l.add(&a.iter().map(String::as_str).collect::<Vec<_>>(), names);
    }
    l.add(
        &["run", "--model", "llama-9000", "--strategy", "offload"],
        "llama-9000",
    );
    l.add(
        &[
            "run",
            "--model",
            "qwen3.8-flash-next",
            "--strategy",
            "teleport",
        ],
        "teleport",
    );
    l.add(&["run", "--strategy", "offload"], "--cache-slots");
    l.add(
        &["run", "--model", &zero_toml, "--strategy", "offload"],
        &zero_toml,
    );

    // ---- probe: refused before the device is opened
    for (tail, names) in [
        (&["--threads", "100000"][..], "--threads 100000"),
        (&["--threads", "0"], "--threads 0"),
        (&["--streams", "0"], "--streams"),
        (&["--streams", "1,100000000"], "--streams 100000000"),
        (&["--budget-s", "nan"], "--budget-s"),
        (&["--budget-s=-1"], "--budget-s"),
        (&["--budget-s", "0"], "--budget-s"),
        (&["--budget-s", "inf"], "--budget-s"),
        (&["--steps", "0"], "--steps"),
        (&["--steps", "1000000000000"], "--steps 1000000000000"),
        (&["--warmup", "1000000000000"], "--warmup 1000000000000"),
        (&["--context", "0"], "--context"),
        (&["--context", "99999999999"], "--context 99999999999"),
        (
            &["--long-context", "99999999999"],
            "--long-context 99999999999",
        ),
        (&["--cache-residency", "1.5"], "--cache-residency"),
        (&["--cache-residency", "nan"], "--cache-residency"),
        (&["--hybrid-fractions", "0.5,2"], "--hybrid-fractions"),
        (&["--attempts", "0"], "--attempts"),
        (&["--max-steal", "2"], "--max-steal"),
        (&["--max-ceiling-drift", "nan"], "--max-ceiling-drift"),
        (&["--layers", "0"], "--layers"),
        (&["--layers", "100000"], "--layers 100000"),
        (&["--export-streams", "0"], "--export-streams"),
        (&["--model", "llama-9000"], "llama-9000"),
        (&["--device", "tpu"], "tpu"),
        (&["--pool-wait", "nap"], "nap"),
        (
            &["--slowdown-threads", "100000"],
            "--slowdown-threads 100000",
        ),
    ] {
        let mut a = vec!["probe"];
        a.extend_from_slice(tail);
        l.add(&a, names);
    }

    // ---- validate
    let missing_csv = l.path("none.csv");
    let out_file = l.path("retarget.json");
    l.add(
        &[
            "validate",
            "retarget",
            "--profile",
            &good,
            "--threads",
            "0",
            "--out",
            &out_file,
        ],
        "--threads 0",
    );
    l.add(
        &[
            "validate",
            "retarget",
            "--profile",
            &good,
            "--threads",
            "100000",
            "--out",
            &out_file,
        ],
        "--threads 100000",
    );
    l.add(
        &[
            "validate",
            "retarget",
            "--profile",
            &cov_rows,
            "--threads",
            "4",
            "--out",
            &out_file,
        ],
        "covariance.matrix",
    );
    l.add(
        &[
            "validate",
            "refit",
            "--profile",
            &zero_json,
            "--out",
            &out_file,
        ],
        &zero_json,
    );
    l.add(&["validate", "get", &zero_json, "/a"], &zero_json);
    l.add(&["validate", "get", &garbage_json, "/a"], &garbage_json);
    l.add(&["validate", "get", &dir_json, "/a"], &dir_json);
    l.add(
        &["validate", "get", &good, "/no/such/path"],
        "/no/such/path",
    );
    l.add(
        &[
            "validate",
            "model-file",
            "--model",
            "llama-9000",
            "--layers",
            "1",
            "--out",
            &out_file,
        ],
        "llama-9000",
    );
    l.add(
        &[
            "validate",
            "model-file",
            "--model",
            "qwen3.8-flash-next",
            "--layers",
            "0",
            "--out",
            &out_file,
        ],
        "--layers 0",
    );
    l.add(&["validate", "analyze", &missing_csv], &missing_csv);
    l.add(&["validate", "analyze", &garbage_csv], &garbage_csv);

    // ---- the command line itself
    l.add(&["teleport"], "teleport");
    l.add(&["--no-such-flag"], "--no-such-flag");
    l.add(&["simulate", "--streams"], "--streams");
    l.add(&["predict", "--model"], "--model");
    l
}

/// Every case of the list against the built `ft`, in parallel, each under the limits.
#[test]
fn every_bad_cli_input_is_refused_cleanly_under_2_gib() {
    let list = build();
    assert!(list.cases.len() >= 150, "{} cases", list.cases.len());
    let cache = list.dir.path().join("cache");
    let run_case = |c: &Case| {
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_ft"));
        cmd.args(&c.args)
            .env("FT_CACHE_DIR", &cache)
            .env_remove("RUST_LOG")
            .env_remove("FT_HOST_SUBMIT");
        run_limited(cmd, ADDRESS_SPACE_BYTES, CASE_TIMEOUT)
    };
    let workers = std::thread::available_parallelism().map_or(2, |n| n.get().min(4));
    let results: Vec<(usize, Limited)> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..workers)
            .map(|w| {
                let cases = &list.cases;
                let run_case = &run_case;
                s.spawn(move || {
                    (w..cases.len())
                        .step_by(workers)
                        .map(|i| (i, run_case(&cases[i])))
                        .collect::<Vec<_>>()
                })
            })
            .collect();
        handles
            .into_iter()
            .flat_map(|h| h.join().unwrap())
            .collect()
    });
    let mut failures = Vec::new();
    for (i, r) in &results {
        let c = &list.cases[*i];
        let mut why = Vec::new();
        if r.timed_out {
            why.push(format!("ran past {CASE_TIMEOUT:?}"));
        }
        if r.code != Some(2) {
            why.push(format!("exit {:?}, not 2", r.code));
        }
        if !r.stdout.is_empty() {
            why.push(format!(
                "stdout not empty: {}",
                String::from_utf8_lossy(&r.stdout[..r.stdout.len().min(200)])
            ));
        }
        if r.stderr.contains("panicked") {
            why.push("panicked".to_string());
        }
        if !r.stderr.contains(&c.names) {
            why.push(format!("stderr does not name '{}'", c.names));
        }
        if !why.is_empty() {
            failures.push(format!(
                "ft {}\n    {}\n    stderr: {}",
                c.args.join(" "),
                why.join("; "),
                r.stderr.trim().chars().take(400).collect::<String>()
            ));
        }
    }
    let slowest = results.iter().map(|(_, r)| r.elapsed).max().unwrap();
    eprintln!(
        "{} bad inputs, {} failed, slowest {slowest:?}",
        results.len(),
        failures.len()
    );
    assert!(
        failures.is_empty(),
        "{} of {} bad inputs were not refused cleanly:\n{}",
        failures.len(),
        results.len(),
        failures.join("\n")
    );
}

/// The limits themselves do not fail a good input: a normal prediction (and one from a good
/// profile) succeeds under the same address-space limit, so the failures above are the
/// inputs', not the harness's.
#[test]
fn good_inputs_succeed_under_the_same_limits() {
    let list = build();
    let good = list.path("good.json");
    for args in [
        vec!["predict", "--json"],
        vec!["predict", "--profile", good.as_str(), "--json"],
        vec!["predict", "--host", good.as_str(), "--json"],
        vec![
            "simulate",
            "--streams",
            "1",
            "--steps",
            "8",
            "--warmup",
            "2",
            "--json",
        ],
    ] {
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_ft"));
        cmd.args(&args)
            .env("FT_CACHE_DIR", list.dir.path().join("cache"));
        let r = run_limited(cmd, ADDRESS_SPACE_BYTES, CASE_TIMEOUT);
        assert_eq!(r.code, Some(0), "ft {}: {}", args.join(" "), r.stderr);
        let v: serde_json::Value = serde_json::from_slice(&r.stdout).expect("JSON on stdout");
        assert!(!v.is_null());
    }
}

/// Legal but implausible inputs answer, and say so: a cache larger than the GPU warns on
/// stderr and in `--json`; an untrusted profile's prediction carries the reason in both.
#[test]
fn implausible_inputs_warn_on_stderr_and_in_json() {
    let list = build();
    let run = |args: &[&str]| {
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_ft"));
        cmd.args(args)
            .env("FT_CACHE_DIR", list.dir.path().join("cache"));
        let r = run_limited(cmd, ADDRESS_SPACE_BYTES, CASE_TIMEOUT);
        assert_eq!(r.code, Some(0), "ft {}: {}", args.join(" "), r.stderr);
        let v: serde_json::Value = serde_json::from_slice(&r.stdout).expect("JSON on stdout");
        (v, r.stderr)
    };
    // The field report's host has a 24 GiB GPU.
    let (v, err) = run(&["predict", "--cache-gb", "60", "--json"]);
    let w = v["warnings"].as_array().unwrap();
    assert!(
        w.len() == 1 && w[0].as_str().unwrap().contains("--cache-gb 60"),
        "{v}"
    );
    assert!(
        err.contains("--cache-gb 60") && err.contains("larger than the GPU"),
        "{err}"
    );
    let (v, err) = run(&["predict", "--cache-gb", "4", "--json"]);
    assert_eq!(v["warnings"].as_array().unwrap().len(), 0, "{err}");
    assert!(v["profile_untrusted"].is_null());
    // An untrusted profile: predicted from, loudly.
    let mut p: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(list.path("good.json")).unwrap()).unwrap();
    p["untrusted"] =
        "the fit missed its own validation runs by more than 50% rms (offload 346%)".into();
    let path = list.file("untrusted.json", serde_json::to_vec(&p).unwrap());
    let (v, err) = run(&["predict", "--profile", &path, "--json"]);
    assert!(
        v["profile_untrusted"]
            .as_str()
            .unwrap()
            .contains("offload 346%"),
        "{v}"
    );
    assert!(err.contains("UNTRUSTED") && err.contains(&path), "{err}");
    // The profile's own model is the default --model: no refusal without --model.
    assert_eq!(v["prediction"]["model"], "qwen3.8-flash-next");
}

/// One malformed HTTP request and what the server must answer: a status with a JSON error
/// body, or (`None`) the connection closed without a response, within [`HTTP_CASE_TIMEOUT`].
struct HttpCase {
    /// What the case is, for the failure message.
    what: &'static str,
    /// The bytes the client sends (and then it waits, its side left open).
    request: Vec<u8>,
    /// The status the server must answer with.
    status: Option<u16>,
}

/// How long one HTTP case may wait for its answer, s: the server's header and body timeouts
/// in this test are 1 s each.
const HTTP_CASE_TIMEOUT: Duration = Duration::from_secs(15);

/// A POST of `body` to `path` with a matching Content-Length.
fn post(path: &str, body: &[u8]) -> Vec<u8> {
    let mut r = format!(
        "POST {path} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nConnection: close\r\nContent-Length: {}\r\n\r\n",
        body.len()
    )
    .into_bytes();
    r.extend_from_slice(body);
    r
}

/// A request head alone (`Connection: close`).
fn head(line: &str, headers: &str) -> Vec<u8> {
    format!("{line}\r\nHost: x\r\nConnection: close\r\n{headers}\r\n").into_bytes()
}

fn http_cases() -> Vec<HttpCase> {
    let c = |what, request, status| HttpCase {
        what,
        request,
        status,
    };
    let nested = format!("{{\"prompt\": {}", "[".repeat(50_000));
    let mut invalid_utf8 = b"{\"prompt\": \"".to_vec();
    invalid_utf8.extend_from_slice(&[0xff, 0xfe, 0xfd]);
    invalid_utf8.extend_from_slice(b"\"}");
    let chunk = "x".repeat(40_000);
    let chunked = format!(
        "POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nConnection: close\r\nTransfer-Encoding: chunked\r\n\r\n{:x}\r\n{chunk}\r\n{:x}\r\n{chunk}\r\n0\r\n\r\n",
        chunk.len(),
        chunk.len()
    );
    vec![
        c(
            "truncated JSON",
            post("/v1/completions", b"{\"prompt\": \"x\","),
            Some(400),
        ),
        c(
            "unknown field",
            post("/v1/completions", b"{\"prompt\": \"x\", \"bogus\": 1}"),
            Some(400),
        ),
        c(
            "wrong type",
            post("/v1/chat/completions", b"{\"messages\": \"x\"}"),
            Some(400),
        ),
        c("empty body", post("/v1/completions", b""), Some(400)),
        c(
            "JSON array body",
            post("/v1/completions", b"[1, 2, 3]"),
            Some(400),
        ),
        c(
            "invalid UTF-8",
            post("/v1/completions", &invalid_utf8),
            Some(400),
        ),
        c(
            "50,000-deep nesting",
            post("/v1/completions", nested.as_bytes()),
            Some(400),
        ),
        c(
            "negative temperature",
            post(
                "/v1/completions",
                b"{\"prompt\": \"x\", \"temperature\": -1}",
            ),
            Some(400),
        ),
        c(
            "max_tokens past the context",
            post(
                "/v1/completions",
                b"{\"prompt\": \"x\", \"max_tokens\": 100000000}",
            ),
            Some(400),
        ),
        c(
            "max_tokens beyond u64",
            post(
                "/v1/completions",
                b"{\"prompt\": \"x\", \"max_tokens\": 1e400}",
            ),
            Some(400),
        ),
        c(
            "n > 1",
            post("/v1/completions", b"{\"prompt\": \"x\", \"n\": 2}"),
            Some(400),
        ),
        c(
            "unknown model",
            post(
                "/v1/completions",
                b"{\"prompt\": \"x\", \"model\": \"gpt-9\"}",
            ),
            Some(404),
        ),
        c(
            "wrong method",
            head("GET /v1/completions HTTP/1.1", ""),
            Some(405),
        ),
        c(
            "unknown path",
            head("DELETE /nowhere HTTP/1.1", ""),
            Some(404),
        ),
        c(
            "unparsable request line",
            b"BOGUS\0 / HTTP/1.1\r\n\r\n".to_vec(),
            Some(400),
        ),
        c(
            "Content-Length 10^12",
            head(
                "POST /v1/completions HTTP/1.1",
                "Content-Type: application/json\r\nContent-Length: 1000000000000\r\n",
            ),
            Some(413),
        ),
        c(
            "chunked body over the limit",
            chunked.into_bytes(),
            Some(413),
        ),
        c(
            "body shorter than its Content-Length",
            {
                let mut r = head(
                    "POST /v1/completions HTTP/1.1",
                    "Content-Type: application/json\r\nContent-Length: 100\r\n",
                );
                r.extend_from_slice(b"{\"prompt\"");
                r
            },
            Some(408),
        ),
        c(
            "headers never finished",
            b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Le".to_vec(),
            None,
        ),
    ]
}

/// Send one case on a fresh connection and read until the server closes it: the status
/// (`None`: closed without a response) and the body.
fn send(addr: &str, case: &HttpCase) -> (Option<u16>, String, Duration) {
    use std::io::Write as _;
    let start = Instant::now();
    let mut s = std::net::TcpStream::connect(addr).expect("the server accepts");
    s.set_read_timeout(Some(HTTP_CASE_TIMEOUT)).unwrap();
    // A server that answers before the whole request is in may close under the writer.
    let _ = s.write_all(&case.request);
    let mut raw = Vec::new();
    let _ = s.read_to_end(&mut raw);
    let raw = String::from_utf8_lossy(&raw).into_owned();
    let status = raw
        .strip_prefix("HTTP/1.1 ")
        .and_then(|r| r.get(..3))
        .and_then(|c| c.parse().ok());
    let body = raw
        .find("\r\n\r\n")
        .map_or(String::new(), |i| raw[i + 4..].to_string());
    (status, body, start.elapsed())
}

/// The malformed requests against a real `ft serve` under the CLI list's 2 GiB limit: each
/// gets its status and a JSON error body (or, never finishing its headers, is disconnected at
/// the header timeout), a good request is served after them all, and SIGTERM stops the
/// server with exit 0 within its shutdown deadline.
#[test]
fn every_bad_http_request_is_refused_cleanly_under_2_gib() {
    use std::io::BufRead as _;
    let dir = tempfile::tempdir().unwrap();
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_ft"));
    cmd.args([
        "serve",
        "--backend",
        "reference",
        "--port",
        "0",
        "--json",
        "--header-timeout-s",
        "1",
        "--body-timeout-s",
        "1",
        "--max-body-bytes",
        "65536",
        "--shutdown-deadline-s",
        "2",
    ])
    .env("FT_CACHE_DIR", dir.path())
    .env_remove("RUST_LOG")
    .stdin(Stdio::null())
    .stdout(Stdio::piped())
    .stderr(Stdio::piped());
    limit_address_space(&mut cmd, ADDRESS_SPACE_BYTES);
    let mut child = cmd.spawn().expect("ft serve starts");
    let mut stdout = std::io::BufReader::new(child.stdout.take().unwrap());
    let mut stderr = child.stderr.take().unwrap();
    let err = std::thread::spawn(move || {
        let mut v = String::new();
        let _ = stderr.read_to_string(&mut v);
        v
    });
    let mut line = String::new();
    stdout.read_line(&mut line).expect("the start-up line");
    let v: serde_json::Value = serde_json::from_str(&line)
        .unwrap_or_else(|e| panic!("{e}: '{line}' (server stderr: {:?})", child.try_wait()));
    let addr = v["listening"]
        .as_str()
        .unwrap()
        .trim_start_matches("http://")
        .to_string();

    let cases = http_cases();
    assert!(cases.len() >= 15);
    for case in &cases {
        let (status, body, took) = send(&addr, case);
        assert_eq!(status, case.status, "{}: {body}", case.what);
        assert!(took < HTTP_CASE_TIMEOUT, "{}: {took:?}", case.what);
        if status.is_some() {
            let e: serde_json::Value = serde_json::from_str(body.trim())
                .unwrap_or_else(|e| panic!("{}: not a JSON body ({e}): {body}", case.what));
            assert!(
                e["error"]["message"]
                    .as_str()
                    .is_some_and(|m| !m.is_empty()),
                "{}: {e}",
                case.what
            );
        }
    }
    // Still serving.
    let good = HttpCase {
        what: "a good request",
        request: post(
            "/v1/completions",
            b"{\"prompt\": \"hello\", \"max_tokens\": 2}",
        ),
        status: Some(200),
    };
    let (status, body, _) = send(&addr, &good);
    assert_eq!(status, Some(200), "{body}");

    // SIGTERM: exit 0 within the deadline (2 s) and a margin for the loaded CI machine.
    let t = Instant::now();
    // SAFETY: kill(2) on the child's own pid, which this test spawned and has not reaped.
    assert_eq!(unsafe { libc::kill(child.id() as i32, libc::SIGTERM) }, 0);
    let status = loop {
        if let Some(s) = child.try_wait().unwrap() {
            break s;
        }
        if t.elapsed() > Duration::from_secs(20) {
            let _ = child.kill();
            panic!("ft serve did not stop within 20 s of SIGTERM");
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    let err = err.join().unwrap();
    assert_eq!(status.code(), Some(0), "{err}");
    assert!(!err.contains("panicked"), "{err}");
}
