//! The documentation's commands, run: every fenced block whose info string is `sh test` in
//! README.md and docs/*.md is run with bash (`set -euo pipefail`) against the `ft` built for
//! the tests, in a fresh folder per page (the blocks of a page run in order and share it),
//! and must exit 0. So a renamed flag, a changed default or a removed preset fails here,
//! not in a user's terminal.
//!
//! Each folder starts with `config.json`, Qwen3-30B-A3B's published config (the keys that
//! matter), which the quick start's commands name as "your model".

mod common;
use common::repo_root;

use std::path::{Path, PathBuf};
use std::process::Command;

/// The info string that marks a block as runnable.
const RUNNABLE: &str = "sh test";

/// The config.json every page's folder starts with.
const CONFIG_JSON: &str = r#"{
  "architectures": ["Qwen3MoeForCausalLM"], "model_type": "qwen3_moe",
  "hidden_size": 2048, "intermediate_size": 6144, "moe_intermediate_size": 768,
  "num_hidden_layers": 48, "num_experts": 128, "num_experts_per_tok": 8,
  "num_attention_heads": 32, "num_key_value_heads": 4, "head_dim": 128,
  "torch_dtype": "bfloat16"
}
"#;

/// The runnable blocks of a Markdown text, with the line each starts on.
fn runnable_blocks(text: &str) -> Vec<(usize, String)> {
    let mut blocks = Vec::new();
    let mut current: Option<(usize, String)> = None;
    for (i, line) in text.lines().enumerate() {
        let fence = line.trim_start().starts_with("```");
        match (&mut current, fence) {
            (None, true) => {
                let info = line.trim_start().trim_start_matches('`').trim();
                if info == RUNNABLE {
                    current = Some((i + 1, String::new()));
                } else {
                    // Skip a block of another kind to its closing fence.
                    current = Some((0, String::new()));
                }
            }
            (Some(_), true) => {
                let (start, body) = current.take().expect("inside a block");
                if start > 0 {
                    blocks.push((start, body));
                }
            }
            (Some((_, body)), false) => {
                body.push_str(line);
                body.push('\n');
            }
            (None, false) => {}
        }
    }
    assert!(current.is_none(), "an unclosed fence");
    blocks
}

/// The pages whose commands are run.
fn pages() -> Vec<PathBuf> {
    let mut pages = vec![repo_root().join("README.md")];
    let mut docs: Vec<PathBuf> = std::fs::read_dir(repo_root().join("docs"))
        .expect("docs/ is readable")
        .map(|e| e.expect("a docs entry").path())
        .filter(|p| p.extension().is_some_and(|e| e == "md"))
        .collect();
    docs.sort();
    pages.extend(docs);
    pages
}

fn run_page(page: &Path) -> usize {
    let text = std::fs::read_to_string(page).expect("the page reads");
    let blocks = runnable_blocks(&text);
    if blocks.is_empty() {
        return 0;
    }
    let dir = tempfile::tempdir().expect("a temporary folder");
    std::fs::write(dir.path().join("config.json"), CONFIG_JSON).expect("config.json written");
    let bin = Path::new(env!("CARGO_BIN_EXE_ft"))
        .parent()
        .expect("the binary's folder")
        .to_path_buf();
    let path = std::env::join_paths(std::iter::once(bin).chain(std::env::split_paths(
        &std::env::var_os("PATH").unwrap_or_default(),
    )))
    .expect("a PATH");
    for (line, body) in &blocks {
        let out = Command::new("bash")
            .arg("-c")
            .arg(format!("set -euo pipefail\n{body}"))
            .current_dir(dir.path())
            .env("PATH", &path)
            // The profile cache of this folder, not the user's.
            .env("XDG_CACHE_HOME", dir.path().join("cache"))
            .output()
            .expect("bash runs");
        assert!(
            out.status.success(),
            "{}:{line}: the block failed ({}):\n{body}\n--- stdout\n{}\n--- stderr\n{}",
            page.display(),
            out.status,
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    }
    blocks.len()
}

#[test]
fn the_blocks_are_found_and_others_skipped() {
    let text = "intro\n```sh test\nft a\nft b\n```\n```sh\nnot run\n```\n```toml\nx = 1\n```\n```sh test\nft c\n```\n";
    let blocks = runnable_blocks(text);
    assert_eq!(
        blocks,
        vec![(2, "ft a\nft b\n".to_string()), (12, "ft c\n".to_string())]
    );
}

#[test]
fn every_runnable_command_of_the_docs_succeeds() {
    let mut ran = Vec::new();
    for page in pages() {
        let n = run_page(&page);
        if n > 0 {
            ran.push(page.file_name().unwrap().to_string_lossy().into_owned());
        }
    }
    // The pages that promise runnable commands have them (a renamed marker would otherwise
    // pass this test by running nothing).
    for page in [
        "README.md",
        "quick-start.md",
        "host-file.md",
        "model-file.md",
        "examples.md",
    ] {
        assert!(
            ran.iter().any(|p| p == page),
            "{page} ran no block; ran: {ran:?}"
        );
    }
}
