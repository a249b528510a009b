//! One engine configuration for `ft run`, `ft probe` and `ft serve`: the same `[engine]`
//! file and flags reach all three, each records the settings it ran with, and the profile
//! key carries them, so a server finds the profile probed with its own settings and no
//! other.

mod common;
use common::write;

#[test]
fn run_probe_and_serve_take_the_same_engine_settings() {
    let dir = tempfile::tempdir().unwrap();
    let cache = dir.path().join("cache");
    let m = &write(dir.path(), "tiny.toml", common::TINY_MODEL);
    let file = &write(dir.path(), "engine.toml", "[engine]\nfetch-chunks = 2\n");
    let asked = serde_json::json!({"fetch-chunks": 2});

    // ft run records what it ran with.
    let run = common::json_ok(&common::ft_cached(
        &cache,
        &[
            "run",
            "--device",
            "host",
            "--model",
            m,
            "--strategy",
            "offload",
            "--steps",
            "2",
            "--warmup",
            "1",
            "--cache-slots",
            "8",
            "--context",
            "16",
            "--threads",
            "1",
            "--engine-config",
            file,
            "--json",
        ],
    ));
    assert_eq!(run["engine"], asked);

    // ft probe records it in its report and in the profile key.
    let mut probe = vec!["probe", "--model", m, "--json", "--engine-config", file];
    probe.extend_from_slice(common::PROBE_FAST);
    let p = common::json_ok(&common::ft_cached(&cache, &probe));
    assert_eq!(p["engine"], asked);
    let paths = p["key"]["host"]["gpu_paths"].as_str().unwrap().to_string();
    assert!(paths.contains("fetch-chunks 2"), "{paths}");
    // ... and in the profile's parameters, which every prediction from it reads (the layer
    // schedule is built from them), and in the probe's outcome.
    let stored = |report: &serde_json::Value| -> serde_json::Value {
        let path = report["profile_path"].as_str().unwrap();
        serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap()
    };
    assert_eq!(stored(&p)["params"]["engine_settings"], asked);
    assert_eq!(p["outcome"]["engine"], asked);

    // ft serve: with the same settings it finds that profile; with others the key differs
    // in its GPU paths, so the profile is stale for it (and the host device has nothing to
    // probe: it predicts from a host spec instead).
    let serve = |extra: &[&str]| {
        let mut a = vec![
            "serve",
            "--device",
            "host",
            "--model",
            m,
            "--threads",
            "1",
            "--predict-only",
            "--json",
        ];
        a.extend_from_slice(extra);
        let out = common::ft_cached(&cache, &a);
        (
            common::json_ok(&out),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    };
    // Whether serve found the profile of its key: it serves from it, or (a tiny probe on the
    // host device can miss its own validation runs) found it and refused it as untrusted,
    // saying so; a profile of another key is neither.
    let found = |(v, err): &(serde_json::Value, String)| {
        v["source"].as_str().unwrap().contains("cached profile")
            || err.contains("untrusted cached profile")
    };
    let same = serve(&["--engine-config", file]);
    assert_eq!(same.0["engine"], asked);
    assert!(found(&same), "{} / {}", same.0["source"], same.1);
    // The flag alone is the same settings as the file.
    let flag = serve(&["--fetch-chunks", "2"]);
    assert!(found(&flag), "{} / {}", flag.0["source"], flag.1);
    let other = serve(&[]);
    assert_eq!(other.0["engine"], serde_json::json!({"fetch-chunks": 4}));
    assert!(!found(&other), "{} / {}", other.0["source"], other.1);

    // A probe with other settings finds the cached profile stale (its key's GPU paths
    // differ) and probes again; the server with those settings then finds it.
    let mut probe4 = vec!["probe", "--model", m, "--json", "--fetch-chunks", "4"];
    probe4.extend_from_slice(common::PROBE_FAST);
    let p4 = common::json_ok(&common::ft_cached(&cache, &probe4));
    assert_eq!(p4["reused"], false, "another key, so probed");
    let reasons = p4["reprobe_reasons"].to_string();
    assert!(reasons.contains("stale"), "{reasons}");
    assert_ne!(
        p4["key"]["host"]["gpu_paths"],
        p["key"]["host"]["gpu_paths"]
    );
    let now = serve(&[]);
    assert!(found(&now), "{} / {}", now.0["source"], now.1);
    // The default settings are what a profile that records none has.
    assert_eq!(stored(&p4)["params"].get("engine_settings"), None);
}
