//! The one error type of `ft-sim`: every variant names the input or step that failed.

use thiserror::Error;

/// Errors raised while configuring or running a simulation.
#[derive(Debug, Error)]
pub enum SimError {
    /// An error from the shared vocabulary (model, routing, host file, cost terms).
    #[error(transparent)]
    Model(#[from] ft_model::ModelError),
    /// A configuration value the simulator cannot take.
    #[error("invalid {field}: {reason}")]
    Invalid { field: String, reason: String },
    /// A host name that is neither a preset nor a readable file.
    #[error("unknown host '{name}': not a preset ({known}) and not a file")]
    UnknownHost { name: String, known: String },
    /// A file could not be read.
    #[error("{path}: {source}")]
    Io {
        path: String,
        #[source]
        source: std::io::Error,
    },
    /// A host TOML or profile JSON did not parse.
    #[error("{path}: {message}")]
    Parse { path: String, message: String },
}

impl SimError {
    /// Shorthand for [`SimError::Invalid`].
    pub fn invalid(field: impl Into<String>, reason: impl Into<String>) -> Self {
        SimError::Invalid {
            field: field.into(),
            reason: reason.into(),
        }
    }
}

/// Result alias of this crate.
pub type Result<T, E = SimError> = std::result::Result<T, E>;
