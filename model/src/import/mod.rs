//! Models from the files a user has: a Hugging Face `config.json` or a GGUF file.
//!
//! Why it exists: `--model` took only the built-in presets and `ft`'s own TOML, so a user
//! with a downloaded checkpoint had to read its config and translate the geometry by hand.
//! [`import_path`] reads either file into a [`ModelSpec`] (the routed-expert geometry, the
//! expert format and the dense part of each MoE layer) and says, in [`Imported::notes`],
//! every value it did not read directly (an estimate, an assumption, a mixed format), so
//! nothing is guessed silently.
//!
//! Inputs are bounded: a `config.json` is read only up to [`MAX_CONFIG_BYTES`]; of a GGUF
//! file only the header and the tensor infos are parsed (by the `ferrox-gguf` crate, over
//! a read-only memory map whose tensor pages are never touched).

mod gguf;
mod hf;

use serde::Serialize;
use std::path::Path;

use crate::error::{ModelError, Result};
use crate::format::ExpertFormat;
use crate::preset::ModelSpec;

pub use gguf::format_of_ggml;
#[doc(hidden)]
pub use gguf::test_support as gguf_test_support;

/// Largest `config.json` read, in bytes. Real configs are a few KiB; 4 MiB leaves room for
/// the largest (multimodal wrappers with long token maps) and bounds a wrong path.
pub const MAX_CONFIG_BYTES: u64 = 4 << 20;

/// Bytes per weight of the dense part (attention, router, shared experts) and of the KV
/// cache, where the file does not give their type: bf16, as GPU engines hold them.
pub const DENSE_BYTES_PER_WEIGHT: u64 = 2;

/// What the caller may set instead of the file.
#[derive(Debug, Clone, Default)]
pub struct ImportOptions {
    /// The expert format, replacing the file's (for a config.json: what the user will run,
    /// a GGUF quant or nvfp4, rather than the checkpoint's bf16).
    pub format: Option<ExpertFormat>,
    /// The model's name in tables; the file's own name when absent.
    pub name: Option<String>,
}

/// Which kind of file a model came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum ImportKind {
    /// A Hugging Face `config.json`.
    HfConfig,
    /// A GGUF file's header.
    Gguf,
}

/// An imported model and how each of its values was found.
#[derive(Debug, Clone, Serialize)]
pub struct Imported {
    /// The model.
    pub spec: ModelSpec,
    /// The file it came from.
    pub path: String,
    /// Its kind.
    pub kind: ImportKind,
    /// The architecture the file names (`model_type`, `general.architecture`).
    pub architecture: String,
    /// Values not read directly from the file, and why (estimates, assumptions, a mixed
    /// quantisation), one sentence each.
    pub notes: Vec<String>,
}

impl Imported {
    /// The model as a TOML document (the form `--model FILE.toml` reads), headed by comments
    /// naming the source and every note.
    pub fn to_commented_toml(&self) -> String {
        let mut out = format!(
            "# Imported by `ft model import` from {} ({}, architecture {}).\n",
            self.path,
            match self.kind {
                ImportKind::HfConfig => "Hugging Face config.json",
                ImportKind::Gguf => "GGUF header",
            },
            self.architecture
        );
        for n in &self.notes {
            out.push_str("# Note: ");
            out.push_str(n);
            out.push('\n');
        }
        out.push_str(&self.spec.to_toml());
        out
    }
}

/// True where `path` names a file [`import_path`] reads: a `.gguf` file, a `.json` file,
/// or a directory holding a `config.json` (a Hugging Face checkout).
pub fn is_importable(path: &Path) -> bool {
    let ext = path
        .extension()
        .and_then(|e| e.to_str())
        .unwrap_or("")
        .to_ascii_lowercase();
    ext == "gguf" || ext == "json" || (path.is_dir() && path.join("config.json").is_file())
}

/// Import a model from a GGUF file, a `config.json`, or a directory holding one; errors name
/// the file and, where one is missing or wrong, the key.
pub fn import_path(path: &Path, options: &ImportOptions) -> Result<Imported> {
    let path = if path.is_dir() {
        path.join("config.json")
    } else {
        path.to_path_buf()
    };
    let mut imported = if is_gguf(&path)? {
        gguf::import(&path, options)?
    } else {
        hf::import(&path, options)?
    };
    if let Some(name) = &options.name {
        imported.spec.name = name.clone();
    }
    imported.spec.validate().map_err(|e| match e {
        ModelError::Invalid { field, reason } => ModelError::Invalid {
            field: format!("{}: {field}", imported.path),
            reason,
        },
        other => other,
    })?;
    Ok(imported)
}

/// GGUF's magic, the first four bytes of every GGUF file.
const GGUF_MAGIC: &[u8; 4] = b"GGUF";

/// True when the file starts with GGUF's magic (whatever its extension).
fn is_gguf(path: &Path) -> Result<bool> {
    use std::io::Read;
    let io = |source| ModelError::Io {
        path: path.display().to_string(),
        source,
    };
    let mut f = std::fs::File::open(path).map_err(io)?;
    let mut magic = [0u8; 4];
    let mut got = 0;
    while got < 4 {
        let n = f.read(&mut magic[got..]).map_err(io)?;
        if n == 0 {
            break;
        }
        got += n;
    }
    Ok(got == 4 && &magic == GGUF_MAGIC)
}

/// An invalid-input error naming the file and the key.
fn invalid(path: &Path, key: &str, reason: impl Into<String>) -> ModelError {
    ModelError::invalid(format!("{}: {key}", path.display()), reason)
}

/// The file's stem, as a model name of last resort.
fn stem(path: &Path) -> String {
    // A checkout's config.json is named by its folder (made absolute: `config.json` alone
    // has an empty parent).
    let folder = (path.file_name().and_then(|n| n.to_str()) == Some("config.json"))
        .then(|| std::fs::canonicalize(path).ok())
        .flatten()
        .and_then(|p| p.parent().map(Path::to_path_buf));
    let p = folder.as_deref().unwrap_or(path);
    p.file_stem()
        .map(|s| s.to_string_lossy().into_owned())
        .filter(|s| !s.is_empty())
        .unwrap_or_else(|| "imported".to_string())
}

/// What the CPU side's rate means for a model in `format`, when `ft` has no CPU kernel for
/// it (`None` when it has): the analytic model's CPU rate is the host's `cpu.moe_gbs`
/// bench, else `ft`'s own kernel's share of STREAM read, and neither is a rate of this
/// format's kernel. The callers print it (a warning and a JSON field), so the hybrid and
/// CPU predictions of such a model are never taken for measured ones.
pub fn cpu_rate_caveat(format: ExpertFormat, host_bench_gbs: Option<f64>) -> Option<String> {
    if format.has_kernel() {
        return None;
    }
    Some(match host_bench_gbs {
        Some(gbs) => format!(
            "ft has no CPU kernel for {format}: the CPU side (hybrid, cpu) runs at the host's \
             cpu.moe_gbs bench ({gbs} GB/s, the bench engine's kernel), not a measured {format} \
             kernel; give the cpu.moe_gbs your engine's {format} kernel reaches"
        ),
        None => format!(
            "ft has no CPU kernel for {format} and the host gives no cpu.moe_gbs: the CPU side \
             (hybrid, cpu) is unknown and is predicted at ft's own kernel's share of STREAM \
             read (engine.cpu_kernel_efficiency); give the cpu.moe_gbs your engine's {format} \
             kernel reaches"
        ),
    })
}
