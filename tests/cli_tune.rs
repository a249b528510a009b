//! `ft tune` as a user runs it: end to end against `ft serve --device host` started from the
//! shipped template with a tiny model, and the ways an engine fails (a template with a
//! missing placeholder, a port in use, an engine that exits at once, one that never answers,
//! Ctrl-C mid-run). After each, no process of the engine remains.

mod common;
use common::{json_ok, repo_root, stderr, write, TINY_MODEL};

use std::path::Path;
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

fn ft_tune(dir: &Path, args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_ft"))
        .arg("tune")
        .args(args)
        .env("FT_CACHE_DIR", dir.join("cache"))
        .current_dir(dir)
        .output()
        .expect("ft runs")
}

/// Whether a process is alive (not gone, not a zombie).
fn alive(pid: i32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Err(_) => false,
        Ok(stat) => {
            let state = stat
                .rfind(')')
                .and_then(|i| stat[i + 1..].split_whitespace().next().map(str::to_string));
            !matches!(state.as_deref(), Some("Z") | Some("X"))
        }
    }
}

/// Live processes whose command line mentions `needle` (a test's temporary folder).
fn processes_mentioning(needle: &str) -> Vec<String> {
    let mut found = Vec::new();
    for e in std::fs::read_dir("/proc").unwrap().flatten() {
        let Some(pid) = e.file_name().to_str().and_then(|s| s.parse::<i32>().ok()) else {
            continue;
        };
        let Ok(cmd) = std::fs::read(e.path().join("cmdline")) else {
            continue;
        };
        let cmd = String::from_utf8_lossy(&cmd).replace('\0', " ");
        if cmd.contains(needle) && alive(pid) {
            found.push(format!("{pid}: {cmd}"));
        }
    }
    found
}

/// The pids a test engine wrote to `file` (one a line), waiting a bounded while for it.
fn pids_in(file: &Path) -> Vec<i32> {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        if let Ok(t) = std::fs::read_to_string(file) {
            let pids: Vec<i32> = t.lines().filter_map(|l| l.trim().parse().ok()).collect();
            if pids.len() >= 2 {
                return pids;
            }
        }
        assert!(
            Instant::now() < deadline,
            "{} never written",
            file.display()
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// A template whose engine is `script` (run by sh), which may name `{dir}`.
fn script_template(dir: &Path, script: &str, startup_timeout_s: f64) -> String {
    let text = format!(
        r#"name = "script"
command = ["sh", "-c", {script:?}, "{{port}}"]
startup_timeout_s = {startup_timeout_s}
stop_grace_s = 1
[vars]
dir = {dir:?}
[strategies.offload]
args = []
"#,
        dir = dir.display().to_string()
    );
    write(dir, "engine.toml", &text)
}

/// Common flags of the failing-engine cases.
const QUICK: &[&str] = &[
    "--strategies",
    "offload",
    "--cache-gb",
    "1",
    "--budget-s",
    "30",
];

/// How long a failing engine case may take: a failure is found within the template's
/// start-up timeout (at most 20 s in these cases' templates, 1.5 s where it matters) and the
/// engine stopped within its 1 s grace.
const FAIL_BOUND: Duration = Duration::from_secs(15);

/// Run `ft tune` on `template` with [`QUICK`] and `extra`, asserting that it failed with
/// exit 2 within [`FAIL_BOUND`]; its stderr.
fn tune_fails(dir: &Path, template: &str, extra: &[&str]) -> String {
    let mut args = vec!["--template", template];
    args.extend(QUICK);
    args.extend(extra);
    let t = Instant::now();
    let out = ft_tune(dir, &args);
    assert!(
        t.elapsed() < FAIL_BOUND,
        "{:?}: {}",
        t.elapsed(),
        stderr(&out)
    );
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    stderr(&out)
}

#[test]
fn tune_settles_between_strategies_of_ft_serve_from_the_template() {
    let dir = tempfile::tempdir().unwrap();
    let model = write(dir.path(), "tiny.toml", TINY_MODEL);
    let template = repo_root().join("docs/templates/ft-serve.toml");
    let started = Instant::now();
    let out = ft_tune(
        dir.path(),
        &[
            "--template",
            template.to_str().unwrap(),
            "--model",
            &model,
            "--threads",
            "1",
            "--cache-gb",
            "0.0001,0.00005",
            "--strategies",
            "offload,hybrid",
            "--streams",
            "2",
            "--prompt-tokens",
            "24",
            "--output-tokens",
            "8",
            "--warmup",
            "1",
            "--max-runs",
            "4",
            "--budget-s",
            "60",
            "--out",
            "tuned",
            "--json",
        ],
    );
    let r = json_ok(&out);
    assert!(started.elapsed() < Duration::from_secs(90));
    let runs = r["runs"].as_array().unwrap();
    assert!((3..=4).contains(&runs.len()), "{r:#}");
    assert_eq!(runs[0]["config"], "offload");
    assert_eq!(runs[1]["config"], "hybrid:0.5");
    // Every strategy measured, the second cache size is run once, by the leader.
    assert_eq!(runs[2]["cache"]["value"], 0.00005, "{:#}", runs[2]);
    assert!(["offload", "hybrid:0.5"].contains(&runs[2]["config"].as_str().unwrap()));
    assert!(runs[2]["command"]
        .as_array()
        .unwrap()
        .iter()
        .any(|a| a == "0.00005"));
    for run in runs {
        let m = run["measured"].as_array().unwrap();
        assert_eq!(m.len(), 2, "1 stream and the target's 2");
        assert!(m.iter().all(|x| x["e2e_tok_s"].as_f64().unwrap() > 0.0));
        assert!(m.iter().all(|x| x["decode_tok_s"].as_f64().unwrap() > 0.0));
        assert!(m.iter().all(|x| x["decode_basis"].is_string()));
        assert!(run["command"]
            .as_array()
            .unwrap()
            .iter()
            .any(|a| a == "--no-check"));
    }
    let choice = &r["choice"];
    assert!(["offload", "hybrid:0.5"].contains(&choice["config"].as_str().unwrap()));
    let (lo, hi) = (
        choice["interval"][0].as_f64().unwrap(),
        choice["interval"][1].as_f64().unwrap(),
    );
    let tok_s = choice["estimate"]["tok_s"].as_f64().unwrap();
    assert!(lo < tok_s && tok_s < hi);
    let flags: Vec<&str> = choice["flags"]
        .as_array()
        .unwrap()
        .iter()
        .map(|f| f.as_str().unwrap())
        .collect();
    assert_eq!(flags[0], "--moe-strategy");
    assert!(["settled", "max-runs", "budget"].contains(&r["ended"].as_str().unwrap()));
    // Without host inputs there is no model to move an input of.
    assert_eq!(r["break_evens"]["status"], "not-available", "{r:#}");
    // Every run is two rows of the observations file per concurrency (client-side end to
    // end and decode), readable by ft-model.
    use ft_model::observe::{Measure, ObservedCache};
    let obs =
        ft_model::observe::read_observations(&dir.path().join("tuned/observations.csv")).unwrap();
    assert_eq!(obs.len(), 4 * runs.len());
    for m in [Measure::ClientE2e, Measure::Decode] {
        assert_eq!(
            obs.iter().filter(|o| o.measure == m).count(),
            2 * runs.len()
        );
    }
    assert!(obs.iter().all(|o| o.output_tokens == 8));
    assert_eq!(
        obs.iter()
            .filter(|o| o.cache == Some(ObservedCache::Gib(0.00005)))
            .count(),
        4
    );
    assert!(dir.path().join("tuned/report.json").is_file());
    let left = processes_mentioning(&dir.path().display().to_string());
    assert!(left.is_empty(), "left behind: {left:?}");

    // The same folder again is refused without --resume; with it the earlier runs count.
    let again = ft_tune(
        dir.path(),
        &[
            "--template",
            template.to_str().unwrap(),
            "--model",
            &model,
            "--threads",
            "1",
            "--cache-gb",
            "0.0001",
            "--out",
            "tuned",
        ],
    );
    assert_eq!(again.status.code(), Some(2));
    assert!(stderr(&again).contains("--resume"), "{}", stderr(&again));
}

#[test]
fn a_template_with_a_missing_placeholder_is_refused_before_anything_starts() {
    let dir = tempfile::tempdir().unwrap();
    let marker = dir.path().join("started");
    let template = write(
        dir.path(),
        "t.toml",
        &format!(
            "command = [\"touch\", {:?}, \"{{model}}\", \"{{gpu_name}}\"]\n[strategies.offload]\nargs = []\n",
            marker.display().to_string()
        ),
    );
    let out = ft_tune(
        dir.path(),
        &["--template", &template, "--model", "m", "--cache-gb", "1"],
    );
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    let e = stderr(&out);
    assert!(
        e.contains("{gpu_name}") && e.contains("t.toml") && e.contains("command[3]"),
        "{e}"
    );
    // Known but given no value: named with how to give it one.
    let out = ft_tune(
        dir.path(),
        &[
            "--template",
            &template,
            "--set",
            "gpu_name=x",
            "--cache-gb",
            "1",
        ],
    );
    assert_eq!(out.status.code(), Some(2));
    let e = stderr(&out);
    assert!(e.contains("{model}") && e.contains("--model"), "{e}");
    assert!(!marker.exists(), "no engine was started");
}

#[test]
fn a_port_in_use_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let held = std::net::TcpListener::bind(("127.0.0.1", 0)).unwrap();
    let port = held.local_addr().unwrap().port().to_string();
    let pidfile = dir.path().join("pids");
    let template = script_template(
        dir.path(),
        &format!("echo $$ > {}; sleep 60", pidfile.display()),
        5.0,
    );
    let e = tune_fails(dir.path(), &template, &["--port", &port]);
    assert!(
        e.contains(&format!("port {port}")) && e.contains("in use"),
        "{e}"
    );
    assert!(!pidfile.exists(), "no engine was started");
}

#[test]
fn an_engine_that_exits_at_once_is_a_clear_error_with_its_stderr() {
    let dir = tempfile::tempdir().unwrap();
    let template = script_template(
        dir.path(),
        "echo 'fatal: CUDA driver not found' >&2; exit 7",
        20.0,
    );
    let e = tune_fails(dir.path(), &template, &[]);
    assert!(
        e.contains("exited")
            && e.contains("exit status: 7")
            && e.contains("fatal: CUDA driver not found"),
        "{e}"
    );
}

#[test]
fn an_engine_that_never_answers_is_stopped_within_its_bound_and_leaves_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let pidfile = dir.path().join("pids");
    // The shell ignores SIGTERM and leaves a child: only SIGKILL to the group ends both.
    let script = format!(
        "trap '' TERM; echo $$ > {p}; sleep 60 & echo $! >> {p}; echo 'loading weights' >&2; wait",
        p = pidfile.display()
    );
    let template = script_template(dir.path(), &script, 1.5);
    let e = tune_fails(dir.path(), &template, &[]);
    assert!(
        e.contains("did not answer") && e.contains("loading weights"),
        "{e}"
    );
    for pid in pids_in(&pidfile) {
        assert!(!alive(pid), "process {pid} of the engine is left");
    }
}

#[test]
fn ctrl_c_stops_the_engine_on_the_way_out() {
    let dir = tempfile::tempdir().unwrap();
    let pidfile = dir.path().join("pids");
    let script = format!(
        "echo $$ > {p}; sleep 60 & echo $! >> {p}; wait",
        p = pidfile.display()
    );
    let template = script_template(dir.path(), &script, 60.0);
    let child = Command::new(env!("CARGO_BIN_EXE_ft"))
        .args(["tune", "--template", &template])
        .args(QUICK)
        .current_dir(dir.path())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let pids = pids_in(&pidfile);
    let kill = Command::new("kill")
        .args(["-INT", &child.id().to_string()])
        .status()
        .unwrap();
    assert!(kill.success());
    let out = child.wait_with_output().unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(
        stderr(&out).contains("interrupted (SIGINT)"),
        "{}",
        stderr(&out)
    );
    for pid in pids {
        assert!(!alive(pid), "process {pid} of the engine is left");
    }
}
