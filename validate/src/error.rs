//! The one error type of `ft-validate`: every variant names the file, row or input.

use thiserror::Error;

/// Errors raised while planning, collecting or analysing a validation grid.
#[derive(Debug, Error)]
pub enum ValidateError {
    /// An error from the shared vocabulary (a model, a profile, a strategy name).
    #[error(transparent)]
    Model(#[from] ft_model::ModelError),
    /// An error from the simulator.
    #[error(transparent)]
    Sim(#[from] ft_sim::SimError),
    /// A file could not be read or written.
    #[error("{path}: {source}")]
    Io {
        path: String,
        #[source]
        source: std::io::Error,
    },
    /// A file could not be read within its limit.
    #[error("reading {path}")]
    Read {
        path: String,
        #[source]
        source: ft_model::ModelError,
    },
    /// A file is not JSON.
    #[error("{path} is not JSON")]
    NotJson {
        path: String,
        #[source]
        source: serde_json::Error,
    },
    /// A CSV file did not parse or could not be written (the row, where known).
    #[error("{path}: {message}")]
    Csv { path: String, message: String },
    /// An input the analysis cannot take.
    #[error("{what}: {reason}")]
    Invalid { what: String, reason: String },
}

impl ValidateError {
    /// Shorthand for [`ValidateError::Invalid`].
    pub fn invalid(what: impl Into<String>, reason: impl Into<String>) -> Self {
        ValidateError::Invalid {
            what: what.into(),
            reason: reason.into(),
        }
    }

    /// Shorthand for [`ValidateError::Io`].
    pub fn io(path: &std::path::Path, source: std::io::Error) -> Self {
        ValidateError::Io {
            path: path.display().to_string(),
            source,
        }
    }
}

/// Result alias of this crate.
pub type Result<T, E = ValidateError> = std::result::Result<T, E>;
