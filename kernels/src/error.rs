//! The one error type of `ft-kernels`: every variant names the input that was wrong.

use thiserror::Error;

use crate::simd::SimdLevel;

/// Errors raised by the codecs and the CPU expert kernels.
#[derive(Debug, Error)]
pub enum KernelError {
    /// A buffer has the wrong length for its shape and format.
    #[error("{what}: expected {expected} elements or bytes, got {got}")]
    Size {
        /// Which buffer (e.g. `experts[3].weights`).
        what: String,
        /// Expected length (bytes for weights, elements for activations).
        expected: u64,
        /// Actual length.
        got: u64,
    },
    /// An argument holds a value the kernels cannot take.
    #[error("invalid {field}: {reason}")]
    Invalid {
        /// Which argument.
        field: String,
        /// Why it is refused.
        reason: String,
    },
    /// A SIMD level was forced that this CPU (or this build) cannot run.
    #[error("SIMD level {requested} is not supported on this CPU (widest detected: {detected})")]
    UnsupportedSimd {
        /// The level asked for.
        requested: SimdLevel,
        /// The widest level the CPU has.
        detected: SimdLevel,
    },
    /// The rayon thread pool could not be built.
    #[error("building a pool of {threads} threads: {message}")]
    Pool {
        /// Requested thread count.
        threads: usize,
        /// rayon's message.
        message: String,
    },
    /// A geometry or format check of the shared vocabulary failed.
    #[error(transparent)]
    Model(#[from] ft_model::ModelError),
}

impl KernelError {
    /// Shorthand for [`KernelError::Invalid`].
    pub fn invalid(field: impl Into<String>, reason: impl Into<String>) -> Self {
        KernelError::Invalid {
            field: field.into(),
            reason: reason.into(),
        }
    }

    /// Shorthand for [`KernelError::Size`].
    pub fn size(what: impl Into<String>, expected: u64, got: usize) -> Self {
        KernelError::Size {
            what: what.into(),
            expected,
            got: got as u64,
        }
    }
}

/// Result alias of this crate.
pub type Result<T, E = KernelError> = std::result::Result<T, E>;
