//! The error of a planned or executed run: an input that is wrong (the message names the
//! flag or file to change), or a step that failed, with what was being done.

use thiserror::Error;

use crate::error::RuntimeError;

/// Any error a run step wraps as its cause.
pub type BoxError = Box<dyn std::error::Error + Send + Sync + 'static>;

/// Errors of [`crate::run`].
#[derive(Debug, Error)]
pub enum RunError {
    /// An input is wrong or does not fit this machine; the message names the input and what
    /// to change.
    #[error("{0}")]
    Input(String),
    /// A step of the run failed: `context` says which (and names the input to blame where
    /// one is), `source` why.
    #[error("{context}")]
    Context {
        context: String,
        #[source]
        source: BoxError,
    },
    /// A runtime operation failed.
    #[error(transparent)]
    Runtime(#[from] RuntimeError),
    /// The shared vocabulary refused something (a model, a strategy, a limit).
    #[error(transparent)]
    Model(#[from] ft_model::ModelError),
    /// A CPU kernel or codec failed.
    #[error(transparent)]
    Kernel(#[from] ft_kernels::KernelError),
}

impl RunError {
    /// Shorthand for [`RunError::Input`].
    pub fn input(message: impl Into<String>) -> Self {
        RunError::Input(message.into())
    }
}

/// Result alias of [`crate::run`].
pub type Result<T, E = RunError> = std::result::Result<T, E>;

/// Wrap an error with what was being done ([`RunError::Context`]).
pub trait Context<T> {
    /// The error wrapped with `context`.
    fn context(self, context: impl Into<String>) -> Result<T>;
    /// The error wrapped with the context `f` gives (computed only on error).
    fn with_context<C: Into<String>>(self, f: impl FnOnce() -> C) -> Result<T>;
}

impl<T, E: std::error::Error + Send + Sync + 'static> Context<T> for std::result::Result<T, E> {
    fn context(self, context: impl Into<String>) -> Result<T> {
        self.map_err(|e| RunError::Context {
            context: context.into(),
            source: Box::new(e),
        })
    }

    fn with_context<C: Into<String>>(self, f: impl FnOnce() -> C) -> Result<T> {
        self.map_err(|e| RunError::Context {
            context: f().into(),
            source: Box::new(e),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn context_keeps_the_cause_as_the_source() {
        let e: Result<()> = Err(RuntimeError::invalid("x", "too big")).context("--flag 3");
        let e = e.unwrap_err();
        assert_eq!(e.to_string(), "--flag 3");
        let source = std::error::Error::source(&e).expect("a source");
        assert_eq!(source.to_string(), "invalid x: too big");
    }
}
