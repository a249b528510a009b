//! The one error type of `ft-tune`: every variant names what failed and with which input
//! (the template file, the placeholder, the port, the engine's command and its stderr).

use thiserror::Error;

/// Errors of templates, the engine's lifecycle, the protocol and the tuning loop.
#[derive(Debug, Error)]
pub enum TuneError {
    /// A template that cannot be used: unreadable, not TOML, or a field out of range.
    #[error("template {path}: {reason}")]
    Template {
        /// The template file (or `<inline>`).
        path: String,
        /// Why it was refused.
        reason: String,
    },
    /// A placeholder the template names that tune does not know and no `[vars]` entry or
    /// `--set` defines.
    #[error("template {path}: unknown placeholder {{{name}}} in {place}; known: {known}")]
    UnknownPlaceholder {
        /// The template file.
        path: String,
        /// The placeholder's name, without braces.
        name: String,
        /// Where it appears (`command[3]`, `strategies.hybrid.args[1]`, `env.FOO`).
        place: String,
        /// The names tune knows, with those the template defines.
        known: String,
    },
    /// A placeholder that is known but has no value for this run.
    #[error("template {path}: placeholder {{{name}}} in {place} has no value: {hint}")]
    MissingPlaceholder {
        /// The template file.
        path: String,
        /// The placeholder's name, without braces.
        name: String,
        /// Where it appears.
        place: String,
        /// How to give it a value.
        hint: String,
    },
    /// A flag or setting of the tuning run that cannot be used.
    #[error("invalid {field}: {reason}")]
    Invalid {
        /// The flag or field, e.g. `--streams`.
        field: String,
        /// Why it was refused.
        reason: String,
    },
    /// The engine's port already answers or cannot be bound: another server holds it.
    #[error("port {port} on 127.0.0.1 is already in use ({detail}); stop what holds it or pass another --port")]
    PortInUse {
        /// The port.
        port: u16,
        /// What the check saw.
        detail: String,
    },
    /// The engine's command could not be started at all.
    #[error("starting the engine `{command}`: {source}")]
    Spawn {
        /// The command line.
        command: String,
        /// The OS error.
        source: std::io::Error,
    },
    /// The engine exited before it answered (or while it was measured).
    #[error(
        "the engine `{command}` exited ({status}) {when}; the end of its stderr:\n{stderr_tail}"
    )]
    EngineExited {
        /// The command line.
        command: String,
        /// Its exit status, as the OS reports it.
        status: String,
        /// When (`before it answered on http://127.0.0.1:8000/v1/models`).
        when: String,
        /// The last lines of its stderr.
        stderr_tail: String,
    },
    /// The engine did not answer within its start-up bound; it was stopped.
    #[error("the engine `{command}` did not answer {url} within {timeout_s} s (stopped); the end of its stderr:\n{stderr_tail}")]
    EngineNotReady {
        /// The command line.
        command: String,
        /// The URL polled.
        url: String,
        /// The bound, s.
        timeout_s: f64,
        /// The last lines of its stderr.
        stderr_tail: String,
    },
    /// A process of the engine's group outlived SIGTERM and SIGKILL.
    #[error("the engine's process group {pgid} still has processes after SIGKILL: {pids:?}")]
    LeftBehind {
        /// The process group.
        pgid: i32,
        /// The processes still in it.
        pids: Vec<i32>,
    },
    /// A signal or process-group call failed.
    #[error("{operation} on the engine's process group {pgid}: {source}")]
    Signal {
        /// What was being done (`SIGTERM`, `SIGKILL`, `waiting for`).
        operation: String,
        /// The process group.
        pgid: i32,
        /// The OS error.
        source: nix::Error,
    },
    /// The protocol's requests failed against a running engine.
    #[error("the protocol against {url} for {config}: {message}")]
    Protocol {
        /// The engine's URL.
        url: String,
        /// The configuration measured.
        config: String,
        /// What went wrong.
        message: String,
    },
    /// The tuning run was interrupted (Ctrl-C, SIGTERM); the engine was stopped.
    #[error("interrupted ({signal}); the engine was stopped")]
    Interrupted {
        /// The signal.
        signal: String,
    },
    /// A file tune writes or reads (the observations, the engine's logs).
    #[error("{path}: {source}")]
    Io {
        /// The file.
        path: String,
        /// The OS error.
        source: std::io::Error,
    },
    /// An error of the shared vocabulary or the performance model (observations, calibration).
    #[error(transparent)]
    Model(#[from] ft_model::ModelError),
    /// An error of the load generator.
    #[error(transparent)]
    Serve(#[from] ft_serve::ServeError),
}

impl TuneError {
    /// An [`TuneError::Invalid`] for `field`.
    pub fn invalid(field: impl Into<String>, reason: impl Into<String>) -> Self {
        TuneError::Invalid {
            field: field.into(),
            reason: reason.into(),
        }
    }
}

/// Results of this crate.
pub type Result<T, E = TuneError> = std::result::Result<T, E>;
