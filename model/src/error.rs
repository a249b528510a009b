//! The one error type of `ft-model`: every variant names the input that was wrong.

use thiserror::Error;

/// Errors raised while validating or loading the shared vocabulary.
#[derive(Debug, Error)]
pub enum ModelError {
    /// A field holds a value the geometry or format cannot take.
    #[error("invalid {field}: {reason}")]
    Invalid { field: String, reason: String },
    /// A name (model preset, host preset, format, policy) that is not known.
    #[error("unknown {kind} '{name}'; known: {known}")]
    UnknownName {
        kind: &'static str,
        name: String,
        known: String,
    },
    /// A host name that is neither a preset nor a readable file.
    #[error("unknown host '{name}': not a preset ({known}) and not a file")]
    UnknownHost { name: String, known: String },
    /// A file could not be read or written.
    #[error("{path}: {source}")]
    Io {
        path: String,
        #[source]
        source: std::io::Error,
    },
    /// A TOML file did not parse or had unknown keys.
    #[error("{path}: {message}")]
    Toml { path: String, message: String },
    /// A JSON document did not parse.
    #[error("{path}: {message}")]
    Json { path: String, message: String },
    /// A CSV file did not parse (a row, a column or the header).
    #[error("{path}: {message}")]
    Csv { path: String, message: String },
}

impl ModelError {
    /// Shorthand for [`ModelError::Invalid`].
    pub fn invalid(field: impl Into<String>, reason: impl Into<String>) -> Self {
        ModelError::Invalid {
            field: field.into(),
            reason: reason.into(),
        }
    }
}

/// Result alias of this crate.
pub type Result<T, E = ModelError> = std::result::Result<T, E>;

/// Parse a TOML document into `T` (unknown keys are refused by `T`'s serde attributes) and
/// validate it; every error names `origin` (a file path or a preset name) and, for invalid
/// values, the key. The one loader behind every TOML input of `ft-model`.
pub(crate) fn parse_toml<T: serde::de::DeserializeOwned>(
    text: &str,
    origin: &str,
    validate: impl FnOnce(&T) -> Result<()>,
) -> Result<T> {
    let value: T = toml::from_str(text).map_err(|e| ModelError::Toml {
        path: origin.to_string(),
        message: e.to_string(),
    })?;
    validate(&value).map_err(|e| match e {
        ModelError::Invalid { field, reason } => ModelError::Invalid {
            field: format!("{origin}: {field}"),
            reason,
        },
        other => other,
    })?;
    Ok(value)
}

/// Read a TOML input file, with the path in the error: at most
/// [`crate::limits::MAX_TOML_BYTES`], a regular file ([`crate::limits::read_bounded`]).
pub(crate) fn read_text(path: &std::path::Path) -> Result<String> {
    crate::limits::read_bounded(path, crate::limits::MAX_TOML_BYTES)
}
