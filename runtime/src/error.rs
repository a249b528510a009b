//! The one error type of `ft-runtime`.
//!
//! Every variant carries what was being done and with which sizes or names, so that a
//! failure on a remote GPU machine can be diagnosed from its message alone. Other runtime
//! modules (engine, CPU pool, instrumentation) may add variants here.

use thiserror::Error;

/// Errors of the runtime: devices, host banks, cache slots, kernels, engines.
#[derive(Debug, Error)]
pub enum RuntimeError {
    /// CUDA was asked for but cannot be used here (not compiled in, no driver, no device).
    #[error("CUDA device unavailable: {reason}")]
    CudaUnavailable { reason: String },
    /// A CUDA driver call failed.
    #[error("CUDA error during {op}: {message}")]
    Cuda { op: String, message: String },
    /// NVRTC refused a kernel source; the log is NVRTC's own.
    #[error("NVRTC could not compile kernel '{kernel}' with options [{}]:\n{log}", options.join(" "))]
    Nvrtc {
        kernel: String,
        options: Vec<String>,
        log: String,
    },
    /// A device or pinned-host allocation does not fit.
    #[error(
        "cannot allocate {what}: {requested} bytes requested, {available} bytes available{hint}"
    )]
    OutOfMemory {
        what: String,
        requested: u64,
        available: u64,
        /// Extra advice (what would fit), starting with "; " when present.
        hint: String,
    },
    /// An argument (a size, an offset, a shape, a configuration field) is wrong.
    #[error("invalid {field}: {reason}")]
    Invalid { field: String, reason: String },
    /// Two objects from different devices (or backends) were combined in one operation.
    #[error("device mismatch in {op}: {reason}")]
    DeviceMismatch { op: String, reason: String },
    /// A worker thread of the host-emulated device stopped (it panicked or was shut down).
    #[error("host-emulated device: {what}")]
    HostWorker { what: String },
    /// A file could not be read or written.
    #[error("{path}: {source}")]
    Io {
        path: String,
        #[source]
        source: std::io::Error,
    },
    /// A safetensors checkpoint is malformed or lacks a tensor.
    #[error("safetensors {path}: {message}")]
    Safetensors { path: String, message: String },
    /// An error from the shared vocabulary (geometry, formats, cache).
    #[error(transparent)]
    Model(#[from] ft_model::ModelError),
    /// A CPU kernel or codec of `ft-kernels` failed.
    #[error("CPU kernel: {0}")]
    Kernel(String),
}

impl RuntimeError {
    /// Shorthand for [`RuntimeError::Invalid`].
    pub fn invalid(field: impl Into<String>, reason: impl Into<String>) -> Self {
        RuntimeError::Invalid {
            field: field.into(),
            reason: reason.into(),
        }
    }

    /// Shorthand for [`RuntimeError::Cuda`].
    pub fn cuda(op: impl Into<String>, message: impl std::fmt::Display) -> Self {
        RuntimeError::Cuda {
            op: op.into(),
            message: message.to_string(),
        }
    }
}

/// Result alias of this crate.
pub type Result<T, E = RuntimeError> = std::result::Result<T, E>;
