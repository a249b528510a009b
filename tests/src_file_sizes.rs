//! The binary stays thin: `src/` holds clap definitions and printing, the logic lives in the
//! library crates, and no file of `src/` is over [`MAX_LINES`] lines.
//!
//! [`KNOWN_EXCEPTIONS`] is empty: every file of `src/` meets the limit. A file that has to go
//! over it while its logic moves is listed there with who is moving it.

use std::path::{Path, PathBuf};

/// Most lines a file of `src/` may have.
const MAX_LINES: usize = 400;

/// Files of `src/` (relative to it) still over the limit, with who is moving their logic
/// into a library crate.
const KNOWN_EXCEPTIONS: &[(&str, &str)] = &[];

/// Every `.rs` file under `dir`, recursively.
fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).expect("src/ is readable") {
        let path = entry.expect("a directory entry").path();
        if path.is_dir() {
            rust_files(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

#[test]
fn no_file_of_the_binary_is_over_the_limit() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut files = Vec::new();
    rust_files(&src, &mut files);
    assert!(
        files.iter().any(|f| f.ends_with("main.rs")),
        "the walk found src/main.rs"
    );
    let mut over = Vec::new();
    for f in &files {
        let rel = f.strip_prefix(&src).expect("under src/");
        let name = rel.to_string_lossy().replace('\\', "/");
        let lines = std::fs::read_to_string(f)
            .expect("readable")
            .lines()
            .count();
        if lines > MAX_LINES && !KNOWN_EXCEPTIONS.iter().any(|(n, _)| *n == name) {
            over.push(format!("src/{name}: {lines} lines"));
        }
    }
    assert!(
        over.is_empty(),
        "over {MAX_LINES} lines (move the logic into a library crate, keep clap and printing): {}",
        over.join(", ")
    );
}
