//! The engine's settings: the choices about how an engine runs a decode step that a user
//! makes, one typed value read the same way by `ft run`, `ft probe` and `ft serve`.
//!
//! Why one struct: a probe measures an engine, a run reports one and a server serves one. If
//! each command read its own switches, a profile could describe an engine other than the one
//! serving, and nothing would say so. So the settings are one value ([`EngineSettings`]),
//! parsed from the same flags or the same TOML file by all three commands
//! ([`EngineSettings::from_toml`], [`EngineSettings::load`]), recorded in every report, and
//! part of the profile key ([`EngineSettings::key`]): a profile probed with other settings
//! is stale.
//!
//! A setting stays a setting only while it is a real choice, one whose best value depends on
//! the workload. The alternatives that were measured and lost became code, and their
//! measurements are kept in `experiments/runtime-grid/README.md`:
//!
//! - the host queues a hybrid layer's GPU work while the activations travel and beside the
//!   CPU share, not all of it before the share ("The copy down queued first in a hybrid
//!   layer": x1.09, x1.02 and x1.05 at one stream, the same at eight);
//! - a layer without a CPU share folds its combine into its last fetched chunk's launch, and
//!   on one GPU with copy-engine gathers that launch is queued at once, gated on a device
//!   flag ("The last chunk gated on a flag, and the fold, on by default");
//! - the fetched experts are cut into halving chunks, not chunks sized by costs timed at
//!   start ("Timed fetch chunks": x1.014 and x1.001, within the noise).
//!
//! What is left: how many chunks a layer's fetched experts are gathered in, which trades
//! the link's fixed cost per submission against a longer last kernel, and the best count
//! moves with the streams ("The tail of an offload layer", "Two fetch chunks at two
//! streams"). The CUDA device's own choices are not engine settings: they are the device's
//! (`ft_runtime::device::CudaTuning`), recorded in each report's `device` and in the
//! profile key's GPU paths.
//!
//! Why here, in `ft-model`: the settings change the step the engine runs, so the layer
//! schedule is built from them ([`crate::schedule::LayerSchedule::new`]) and the analytic
//! model and the simulator read them where a prediction's parameters live
//! ([`crate::perf::PerfParams::engine_settings`]: a probed profile's, the default for a host
//! preset). The runtime re-exports the type as `ft_runtime::engine::EngineSettings`.

use std::path::Path;

use serde::{Deserialize, Serialize};

use crate::error::{ModelError, Result};
use crate::plan::MAX_FETCH_CHUNKS;

/// The engine's settings (module docs). Every field has a default, and a field this program
/// does not know is refused, so a misspelt setting never silently runs the default.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default, rename_all = "kebab-case")]
pub struct EngineSettings {
    /// Most chunks a layer's fetched experts are gathered and computed in, 1 to
    /// [`MAX_FETCH_CHUNKS`] ([`crate::schedule::LayerSchedule::fetch_chunk_bounds`]): each chunk's
    /// kernel runs as soon as its copies land, and each chunk is one submission of copies.
    pub fetch_chunks: usize,
}

impl Default for EngineSettings {
    fn default() -> Self {
        EngineSettings {
            fetch_chunks: MAX_FETCH_CHUNKS,
        }
    }
}

/// A TOML engine file: the settings in its `[engine]` table (the table may be absent: the
/// defaults). Other tables are refused.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct EngineFile {
    #[serde(default)]
    engine: EngineSettings,
}

/// Environment variables that once chose engine paths and are read by no command now. Each
/// is refused while set, with what replaced it, so a script that sets one does not believe
/// it measured something it did not.
pub const REMOVED_ENGINE_ENVS: [(&str, &str); 5] = [
    (
        "FT_FETCH_CHUNKS",
        "use --fetch-chunks N or `fetch-chunks` in the [engine] table of --engine-config",
    ),
    (
        "FT_HOST_SUBMIT",
        "the overlapped submission is the engine's one way (experiments/runtime-grid)",
    ),
    (
        "FT_FOLD_COMBINE",
        "the combine is folded wherever it can be (experiments/runtime-grid)",
    ),
    (
        "FT_GATE_LAST_CHUNK",
        "the last chunk is gated wherever it can be (experiments/runtime-grid)",
    ),
    (
        "FT_FETCH_CHUNKING",
        "the chunks halve; timed chunks were measured no better (experiments/runtime-grid)",
    ),
];

impl EngineSettings {
    /// Settings from the text of a TOML engine file: an `[engine]` table of the fields in
    /// kebab case (`fetch-chunks = 2`). `source` names the file in errors.
    pub fn from_toml(text: &str, source: &str) -> Result<Self> {
        let invalid = |why: String| ModelError::invalid(format!("engine config {source}"), why);
        let file: EngineFile = toml::from_str(text).map_err(|e| invalid(e.to_string()))?;
        file.engine.check().map_err(|e| invalid(e.to_string()))?;
        Ok(file.engine)
    }

    /// Settings from a TOML engine file ([`EngineSettings::from_toml`]).
    pub fn load(path: &Path) -> Result<Self> {
        let text = std::fs::read_to_string(path).map_err(|e| {
            ModelError::invalid(
                format!("engine config {}", path.display()),
                format!("cannot be read: {e}"),
            )
        })?;
        Self::from_toml(&text, &path.display().to_string())
    }

    /// A [`ModelError::Invalid`] naming the setting where one is out of range.
    pub fn check(&self) -> Result<()> {
        if !(1..=MAX_FETCH_CHUNKS).contains(&self.fetch_chunks) {
            return Err(ModelError::invalid(
                "--fetch-chunks",
                format!(
                    "{} chunks; a layer's fetched experts are gathered in 1 to {MAX_FETCH_CHUNKS}",
                    self.fetch_chunks
                ),
            ));
        }
        Ok(())
    }

    /// True for the defaults (what a host preset's prediction and a profile that records no
    /// settings assume).
    pub fn is_default(&self) -> bool {
        *self == EngineSettings::default()
    }

    /// The settings in words, for tables, logs and the profile key: `fetch-chunks 4`.
    pub fn key(&self) -> String {
        format!("fetch-chunks {}", self.fetch_chunks)
    }

    /// An error naming the first of `names` that is one of [`REMOVED_ENGINE_ENVS`], with what
    /// replaced it.
    pub fn refuse_removed_envs(names: impl IntoIterator<Item = String>) -> Result<()> {
        for name in names {
            if let Some((_, instead)) = REMOVED_ENGINE_ENVS.iter().find(|(n, _)| *n == name) {
                return Err(ModelError::invalid(
                    name,
                    format!("is no longer read by any command: {instead}"),
                ));
            }
        }
        Ok(())
    }
}

impl std::fmt::Display for EngineSettings {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.key())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_empty_file_or_table_gives_the_defaults() {
        let d = EngineSettings::default();
        assert_eq!(d.fetch_chunks, MAX_FETCH_CHUNKS);
        assert_eq!(EngineSettings::from_toml("", "f").unwrap(), d);
        assert_eq!(EngineSettings::from_toml("[engine]\n", "f").unwrap(), d);
        assert_eq!(d.key(), format!("fetch-chunks {MAX_FETCH_CHUNKS}"));
    }

    #[test]
    fn a_file_sets_its_fields() {
        let s = EngineSettings::from_toml("[engine]\nfetch-chunks = 2\n", "f").unwrap();
        assert_eq!(s.fetch_chunks, 2);
        assert_eq!(s.to_string(), "fetch-chunks 2");
        // JSON (as reports record it) reads back the same.
        let json = serde_json::to_string(&s).unwrap();
        assert_eq!(json, r#"{"fetch-chunks":2}"#);
        assert_eq!(serde_json::from_str::<EngineSettings>(&json).unwrap(), s);
    }

    #[test]
    fn unknown_fields_tables_and_bad_values_are_refused_by_name() {
        for (text, says) in [
            ("[engine]\nfetch-chunk = 2\n", "fetch-chunk"),
            ("[engine]\nfold-combine = false\n", "fold-combine"),
            ("[engine]\nfetch-chunks = 0\n", "1 to"),
            ("[engine]\nfetch-chunks = 9\n", "9 chunks"),
            ("[engine]\nfetch-chunks = \"two\"\n", "fetch-chunks"),
            ("[gpu]\nname = \"x\"\n", "gpu"),
            ("fetch-chunks = 2\n", "fetch-chunks"),
        ] {
            let e = EngineSettings::from_toml(text, "my.toml")
                .unwrap_err()
                .to_string();
            assert!(e.contains(says) && e.contains("my.toml"), "{text:?}: {e}");
        }
        assert!(serde_json::from_str::<EngineSettings>(r#"{"fetch_chunks": 2}"#).is_err());
    }

    #[test]
    fn a_missing_file_is_an_error_naming_it() {
        let e = EngineSettings::load(Path::new("/nonexistent/engine.toml"))
            .unwrap_err()
            .to_string();
        assert!(e.contains("/nonexistent/engine.toml"), "{e}");
    }

    #[test]
    fn each_setting_changes_the_key() {
        let d = EngineSettings::default();
        for n in 1..MAX_FETCH_CHUNKS {
            let s = EngineSettings { fetch_chunks: n };
            assert_ne!(s.key(), d.key(), "{n}");
        }
    }

    #[test]
    fn removed_variables_are_refused_with_their_replacement() {
        let names = |v: &[&str]| v.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        assert!(EngineSettings::refuse_removed_envs(names(&["PATH", "FT_THREADS"])).is_ok());
        for (name, _) in REMOVED_ENGINE_ENVS {
            let e = EngineSettings::refuse_removed_envs(names(&["PATH", name]))
                .unwrap_err()
                .to_string();
            assert!(e.contains(name) && e.contains("no longer"), "{e}");
        }
    }
}
