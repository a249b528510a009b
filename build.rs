//! Records the git revision in the binary for `ft --version`.
fn main() {
    let rev = std::process::Command::new("git")
        .args(["rev-parse", "--short=12", "HEAD"])
        .output()
        .ok()
        .filter(|o| o.status.success())
        .and_then(|o| String::from_utf8(o.stdout).ok())
        .map(|s| s.trim().to_string())
        .unwrap_or_else(|| "unknown".to_string());
    let dirty = std::process::Command::new("git")
        .args(["status", "--porcelain", "--untracked-files=no"])
        .output()
        .ok()
        .map(|o| !o.stdout.is_empty())
        .unwrap_or(false);
    let rev = if dirty && rev != "unknown" {
        format!("{rev}-dirty")
    } else {
        rev
    };
    println!("cargo:rustc-env=FT_GIT_REV={rev}");
    // Again when HEAD moves (a commit moves the branch's ref, not .git/HEAD), when the index
    // changes, and when any workspace source changes: without the sources, an edit after the
    // last build-script run would be built into a binary that still says "clean" (a rerun of
    // the experiments on 2026-12-05 recorded a stale revision that way).
    println!("cargo:rerun-if-changed=.git/HEAD");
    println!("cargo:rerun-if-changed=.git/index");
    if let Ok(head) = std::fs::read_to_string(".git/HEAD") {
        if let Some(r) = head.trim().strip_prefix("ref: ") {
            println!("cargo:rerun-if-changed=.git/{r}");
        }
    }
    for dir in [
        "src",
        "model/src",
        "sim/src",
        "runtime/src",
        "kernels/src",
        "kernels/cuda",
        "serve/src",
    ] {
        println!("cargo:rerun-if-changed={dir}");
    }
}
