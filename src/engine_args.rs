//! The engine's settings on the command line, one definition for `ft run`, `ft probe` and
//! `ft serve` (each flattens [`EngineArgs`]), so the engine a probe measures, a run reports
//! and a server serves is chosen the same way: a TOML file with an `[engine]` table, and
//! flags beside it that win over it. The settings themselves, their defaults and their
//! checks are the library's ([`EngineSettings`]).

use std::path::PathBuf;

use anyhow::Result;
use ft_runtime::engine::EngineSettings;

/// The engine flags every command that builds an engine takes.
#[derive(Debug, Clone, Default, clap::Args)]
pub struct EngineArgs {
    /// TOML file of the engine's settings, in an `[engine]` table (`fetch-chunks = 2`); a
    /// flag given beside it wins over the file.
    #[arg(long, value_name = "FILE")]
    pub engine_config: Option<PathBuf>,
    /// Most chunks a layer's fetched experts are gathered and computed in (1 to 4; default
    /// 4): each chunk's kernel runs as soon as its copies land, and each chunk is one
    /// submission of copies (fewer chunks: fewer submissions, a longer last kernel).
    #[arg(long, value_name = "N")]
    pub fetch_chunks: Option<usize>,
}

impl EngineArgs {
    /// The settings these flags ask for: the file's (or the defaults), then the flags; an
    /// error names the file, the flag, or a variable of the process environment that once
    /// chose an engine path and is read no more.
    pub fn settings(&self) -> Result<EngineSettings> {
        EngineSettings::refuse_removed_envs(
            std::env::vars_os().filter_map(|(k, _)| k.into_string().ok()),
        )?;
        let mut s = match &self.engine_config {
            Some(path) => EngineSettings::load(path)?,
            None => EngineSettings::default(),
        };
        if let Some(n) = self.fetch_chunks {
            s.fetch_chunks = n;
        }
        s.check()?;
        Ok(s)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write as _;

    #[test]
    fn flags_win_over_the_file_and_the_file_over_the_defaults() {
        let mut f = tempfile::NamedTempFile::new().unwrap();
        writeln!(f, "[engine]\nfetch-chunks = 2").unwrap();
        let none = EngineArgs::default();
        // (The test process sets none of the removed variables.)
        assert_eq!(none.settings().unwrap(), EngineSettings::default());
        let file = EngineArgs {
            engine_config: Some(f.path().to_path_buf()),
            fetch_chunks: None,
        };
        assert_eq!(file.settings().unwrap().fetch_chunks, 2);
        let both = EngineArgs {
            fetch_chunks: Some(1),
            ..file.clone()
        };
        assert_eq!(both.settings().unwrap().fetch_chunks, 1);
        let bad = EngineArgs {
            fetch_chunks: Some(7),
            ..file
        };
        let e = bad.settings().unwrap_err().to_string();
        assert!(e.contains("--fetch-chunks") && e.contains('7'), "{e}");
    }
}
