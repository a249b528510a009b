//! The one error type of `ft-serve`: every variant names what failed and with which input.

use thiserror::Error;

/// Errors of the server, its backends and the load generator.
#[derive(Debug, Error)]
pub enum ServeError {
    /// A configuration value (flag, field) that cannot be used.
    #[error("invalid {field}: {reason}")]
    Invalid {
        /// The flag or field, e.g. `--max-streams`.
        field: String,
        /// Why it was refused.
        reason: String,
    },
    /// A decode step failed in the backend.
    #[error("decode step {step} with {streams} stream(s) failed in backend {backend}: {message}")]
    Step {
        /// The scheduler's step counter.
        step: u64,
        /// Streams in the step.
        streams: usize,
        /// The backend's name.
        backend: String,
        /// What the backend said.
        message: String,
    },
    /// The backend refused a strategy switch.
    #[error("backend {backend} cannot switch to strategy {strategy}: {message}")]
    Switch {
        /// The backend's name.
        backend: String,
        /// The strategy asked for.
        strategy: String,
        /// Why.
        message: String,
    },
    /// An error of the shared vocabulary or the performance model.
    #[error(transparent)]
    Model(#[from] ft_model::ModelError),
    /// An error of the runtime (device, banks, engine).
    #[error(transparent)]
    Runtime(#[from] ft_runtime::RuntimeError),
    /// Binding, accepting or serving a socket.
    #[error("{what}: {source}")]
    Io {
        /// What was being done, e.g. `binding 127.0.0.1:8000`.
        what: String,
        /// The OS error.
        #[source]
        source: std::io::Error,
    },
    /// A client-side failure of the load generator.
    #[error("{url}: {message}")]
    Client {
        /// The URL requested.
        url: String,
        /// What went wrong.
        message: String,
    },
    /// A step of the start-up failed: what was being done, and why.
    #[error("{context}")]
    Context {
        /// What was being done, e.g. `predicting the strategies at start`.
        context: String,
        /// Why it failed.
        #[source]
        source: Box<dyn std::error::Error + Send + Sync + 'static>,
    },
    /// The scheduler thread is gone (it stopped or panicked).
    #[error("the decode scheduler has stopped")]
    SchedulerGone,
}

impl ServeError {
    /// Shorthand for [`ServeError::Invalid`].
    pub fn invalid(field: impl Into<String>, reason: impl Into<String>) -> Self {
        ServeError::Invalid {
            field: field.into(),
            reason: reason.into(),
        }
    }
}

impl ServeError {
    /// Shorthand for [`ServeError::Context`].
    pub fn context(
        context: impl Into<String>,
        source: impl std::error::Error + Send + Sync + 'static,
    ) -> Self {
        ServeError::Context {
            context: context.into(),
            source: Box::new(source),
        }
    }
}

/// Result alias of this crate.
pub type Result<T, E = ServeError> = std::result::Result<T, E>;
