//! `ft`'s stdout closed by its reader before `ft` writes (`ft --version | head -0`): the
//! command ends quietly with success, never with a panic on the broken pipe.

use std::process::{Command, Stdio};

fn closed_early(args: &[&str]) {
    let mut child = Command::new(env!("CARGO_BIN_EXE_ft"))
        .args(args)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("ft starts");
    // Close the read end at once: the child is still starting, so its first write meets a
    // pipe without a reader.
    drop(child.stdout.take());
    let out = child.wait_with_output().expect("ft ends");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!stderr.contains("panicked"), "{args:?}: {stderr}");
    assert!(out.status.success(), "{args:?}: {:?} {stderr}", out.status);
}

#[test]
fn version_and_listing_end_quietly_when_the_reader_is_gone() {
    closed_early(&["--version"]);
    closed_early(&["experiment", "list"]);
    closed_early(&["experiment", "list", "--json"]);
}
