//! An engine's lifecycle: start it in its own process group, wait until it answers, stop it
//! cleanly, and never leave a process of it behind.
//!
//! Engines are servers that fork (Python launchers, tensor-parallel ranks, shell wrappers), so
//! stopping the one child tune started is not enough: the engine is started as the leader of a
//! new process group and every signal goes to the group. [`Engine`] is the guard: stopping it
//! sends SIGTERM to the group, waits a grace period for every member to exit, then SIGKILLs the
//! group and checks that none is left; dropping it without a stop (an error, a panic, Ctrl-C
//! caught by the caller) does the same with a short grace. On Linux the leader also gets
//! SIGKILL if tune itself dies (`PR_SET_PDEATHSIG`), the one case no destructor runs.
//!
//! The engine's stdout and stderr go to files beside the run's observations, so that a crash or
//! a hang is reported with the end of its stderr and a long run cannot fill a pipe.

use std::collections::BTreeMap;
use std::io::{Read, Seek, SeekFrom};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use nix::errno::Errno;
use nix::sys::signal::{killpg, Signal};
use nix::unistd::Pid;
use tracing::{info, warn};

use crate::error::{Result, TuneError};

/// Bytes of the end of an engine's stderr shown in an error.
pub const STDERR_TAIL_BYTES: u64 = 4096;

/// Lines of the end of an engine's stderr shown in an error.
pub const STDERR_TAIL_LINES: usize = 20;

/// How often readiness and exit are polled while an engine starts or stops.
const POLL: Duration = Duration::from_millis(50);

/// Grace between SIGTERM and SIGKILL when an engine is dropped without a stop (an error
/// path): short, because the caller is already failing.
pub const DROP_GRACE: Duration = Duration::from_secs(2);

/// How long the group may take to vanish after SIGKILL (the kernel reaps at once; this only
/// covers a loaded machine).
const KILL_WAIT: Duration = Duration::from_secs(5);

/// Timeout of one readiness request.
const READY_REQUEST_TIMEOUT: Duration = Duration::from_secs(2);

/// Refuse a port that something already holds: it accepts connections on 127.0.0.1, or it
/// cannot be bound there.
pub fn check_port_free(port: u16) -> Result<()> {
    let addr = SocketAddr::from(([127, 0, 0, 1], port));
    if TcpStream::connect_timeout(&addr, Duration::from_millis(200)).is_ok() {
        return Err(TuneError::PortInUse {
            port,
            detail: "something accepts connections on it".into(),
        });
    }
    TcpListener::bind(addr)
        .map(drop)
        .map_err(|e| TuneError::PortInUse {
            port,
            detail: format!("binding it: {e}"),
        })
}

/// A port that is free now (the OS's choice), for `--port 0`.
pub fn free_port() -> Result<u16> {
    let l = TcpListener::bind(("127.0.0.1", 0)).map_err(|source| TuneError::Io {
        path: "127.0.0.1:0".into(),
        source,
    })?;
    l.local_addr()
        .map(|a| a.port())
        .map_err(|source| TuneError::Io {
            path: "127.0.0.1:0".into(),
            source,
        })
}

/// The last [`STDERR_TAIL_LINES`] lines of a log file (at most [`STDERR_TAIL_BYTES`] bytes).
pub fn tail(path: &Path) -> String {
    let Ok(mut f) = std::fs::File::open(path) else {
        return "(no stderr)".into();
    };
    let len = f.metadata().map_or(0, |m| m.len());
    let _ = f.seek(SeekFrom::Start(len.saturating_sub(STDERR_TAIL_BYTES)));
    let mut buf = Vec::new();
    let _ = f.read_to_end(&mut buf);
    let text = String::from_utf8_lossy(&buf);
    let lines: Vec<&str> = text.lines().collect();
    let start = lines.len().saturating_sub(STDERR_TAIL_LINES);
    let t = lines[start..].join("\n");
    if t.trim().is_empty() {
        "(stderr was empty)".into()
    } else {
        t
    }
}

/// The members of a process group that are alive (not zombies), or `None` where the group
/// is gone. A zombie cannot run again; only its parent's `wait` removes it, so it does not
/// count as a process left behind.
pub fn group_members(pgid: i32) -> Option<Vec<i32>> {
    if let Err(Errno::ESRCH) = killpg(Pid::from_raw(pgid), None) {
        return None;
    }
    #[cfg(target_os = "linux")]
    {
        let mut alive = Vec::new();
        let Ok(dir) = std::fs::read_dir("/proc") else {
            return Some(vec![]);
        };
        for e in dir.flatten() {
            let Some(pid) = e.file_name().to_str().and_then(|s| s.parse::<i32>().ok()) else {
                continue;
            };
            let Ok(stat) = std::fs::read_to_string(e.path().join("stat")) else {
                continue;
            };
            // "pid (comm) state ppid pgrp ...": comm may hold spaces and parentheses.
            let Some(after) = stat.rfind(')').map(|i| &stat[i + 1..]) else {
                continue;
            };
            let f: Vec<&str> = after.split_whitespace().collect();
            if f.len() > 2 && f[2] == pgid.to_string() && f[0] != "Z" && f[0] != "X" {
                alive.push(pid);
            }
        }
        if alive.is_empty() {
            None
        } else {
            Some(alive)
        }
    }
    #[cfg(not(target_os = "linux"))]
    {
        Some(vec![])
    }
}

/// What to start and how to reach it.
#[derive(Debug, Clone)]
pub struct EngineSpec {
    /// The command line, one argument per entry.
    pub argv: Vec<String>,
    /// Extra environment.
    pub env: BTreeMap<String, String>,
    /// The port it listens on (checked free before the start).
    pub port: u16,
    /// The path polled until it answers 2xx.
    pub ready_path: String,
    /// Bound on the start.
    pub startup_timeout: Duration,
    /// Time between SIGTERM and SIGKILL.
    pub stop_grace: Duration,
    /// Where its stdout and stderr go (`<log_stem>.stdout`, `<log_stem>.stderr`).
    pub log_stem: PathBuf,
}

impl EngineSpec {
    /// The command line as one string, for messages.
    pub fn command_line(&self) -> String {
        self.argv.join(" ")
    }

    /// The engine's base URL.
    pub fn url(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    /// The stderr file.
    pub fn stderr_path(&self) -> PathBuf {
        self.log_stem.with_extension("stderr")
    }
}

/// How an engine ended when it was stopped.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Stopped {
    /// It exited by itself before the stop.
    Exited(String),
    /// SIGTERM ended the group within the grace period.
    Terminated(String),
    /// The group was SIGKILLed after the grace period.
    Killed,
}

/// A running engine: the guard of its process group (see the module docs).
#[derive(Debug)]
pub struct Engine {
    spec: EngineSpec,
    child: Child,
    pgid: i32,
    done: bool,
}

impl Engine {
    /// Check the port, then start the engine in a new process group. Does not wait for it
    /// to answer: see [`Engine::wait_ready`].
    pub fn spawn(spec: EngineSpec) -> Result<Engine> {
        check_port_free(spec.port)?;
        let file = |ext: &str| {
            let p = spec.log_stem.with_extension(ext);
            std::fs::File::create(&p).map_err(|source| TuneError::Io {
                path: p.display().to_string(),
                source,
            })
        };
        let (out, err) = (file("stdout")?, file("stderr")?);
        let mut cmd = Command::new(&spec.argv[0]);
        cmd.args(&spec.argv[1..])
            .envs(&spec.env)
            .stdin(Stdio::null())
            .stdout(out)
            .stderr(err)
            .process_group(0);
        #[cfg(target_os = "linux")]
        // SAFETY: prctl(PR_SET_PDEATHSIG) is async-signal-safe and touches no memory of the
        // parent; it runs in the child between fork and exec.
        unsafe {
            cmd.pre_exec(|| {
                nix::sys::prctl::set_pdeathsig(Signal::SIGKILL).map_err(std::io::Error::from)
            });
        }
        let child = cmd.spawn().map_err(|source| TuneError::Spawn {
            command: spec.command_line(),
            source,
        })?;
        let pgid = child.id() as i32;
        info!(pid = pgid, command = %spec.command_line(), "engine started");
        Ok(Engine {
            spec,
            child,
            pgid,
            done: false,
        })
    }

    /// The process group (the leader's pid).
    pub fn pgid(&self) -> i32 {
        self.pgid
    }

    /// What was started.
    pub fn spec(&self) -> &EngineSpec {
        &self.spec
    }

    /// The end of its stderr so far.
    pub fn stderr_tail(&self) -> String {
        tail(&self.spec.stderr_path())
    }

    /// An error if the engine has exited (with the end of its stderr); `when` says when.
    pub fn check_alive(&mut self, when: &str) -> Result<()> {
        match self.child.try_wait() {
            Ok(Some(status)) => Err(TuneError::EngineExited {
                command: self.spec.command_line(),
                status: status.to_string(),
                when: when.to_string(),
                stderr_tail: self.stderr_tail(),
            }),
            Ok(None) | Err(_) => Ok(()),
        }
    }

    /// Poll the ready path until it answers 2xx, the engine exits, or the start-up bound
    /// (or `deadline`, if sooner) passes. On a timeout the engine is stopped.
    pub async fn wait_ready(&mut self, deadline: Option<Instant>) -> Result<Duration> {
        let start = Instant::now();
        let mut until = start + self.spec.startup_timeout;
        if let Some(d) = deadline {
            until = until.min(d);
        }
        let url = format!("{}{}", self.spec.url(), self.spec.ready_path);
        let http = reqwest::Client::builder()
            .timeout(READY_REQUEST_TIMEOUT)
            .build()
            .map_err(|e| TuneError::Protocol {
                url: url.clone(),
                config: "readiness".into(),
                message: e.to_string(),
            })?;
        loop {
            self.check_alive(&format!("before it answered on {url}"))?;
            if let Ok(r) = http.get(&url).send().await {
                if r.status().is_success() {
                    return Ok(start.elapsed());
                }
            }
            if Instant::now() >= until {
                let timeout_s = (until - start).as_secs_f64();
                // Stop it here, so the error comes after the group is gone.
                let _ = self.stop_with(Duration::from_secs(1));
                return Err(TuneError::EngineNotReady {
                    command: self.spec.command_line(),
                    url,
                    timeout_s: (timeout_s * 10.0).round() / 10.0,
                    stderr_tail: self.stderr_tail(),
                });
            }
            tokio::time::sleep(POLL).await;
        }
    }

    /// Stop the engine: SIGTERM to the group, the grace period, SIGKILL, and a check that
    /// nothing of it is left.
    pub fn stop(mut self) -> Result<Stopped> {
        let grace = self.spec.stop_grace;
        self.stop_with(grace)
    }

    /// Wait until no member of the group is alive, reaping the leader, or `until` passes.
    fn wait_group(&mut self, until: Instant) -> bool {
        loop {
            let _ = self.child.try_wait();
            if group_members(self.pgid).is_none() {
                return true;
            }
            if Instant::now() >= until {
                return false;
            }
            std::thread::sleep(POLL);
        }
    }

    fn stop_with(&mut self, grace: Duration) -> Result<Stopped> {
        if self.done {
            return Ok(Stopped::Killed);
        }
        let raw = self.pgid;
        let pgid = Pid::from_raw(raw);
        let exited_before = self.child.try_wait().ok().flatten();
        let sig = |s: Signal, what: &str| match killpg(pgid, s) {
            Ok(()) | Err(Errno::ESRCH) => Ok(()),
            Err(source) => Err(TuneError::Signal {
                operation: what.into(),
                pgid: raw,
                source,
            }),
        };
        sig(Signal::SIGTERM, "SIGTERM")?;
        if self.wait_group(Instant::now() + grace) {
            self.done = true;
            let status = self.child.try_wait().ok().flatten();
            return Ok(match exited_before {
                Some(s) => Stopped::Exited(s.to_string()),
                None => Stopped::Terminated(status.map_or("?".into(), |s| s.to_string())),
            });
        }
        warn!(
            pgid = self.pgid,
            grace_s = grace.as_secs_f64(),
            "the engine outlived SIGTERM; SIGKILL"
        );
        sig(Signal::SIGKILL, "SIGKILL")?;
        if self.wait_group(Instant::now() + KILL_WAIT) {
            self.done = true;
            let _ = self.child.wait();
            return Ok(Stopped::Killed);
        }
        Err(TuneError::LeftBehind {
            pgid: self.pgid,
            pids: group_members(self.pgid).unwrap_or_default(),
        })
    }
}

impl Drop for Engine {
    fn drop(&mut self) {
        if !self.done {
            if let Err(e) = self.stop_with(DROP_GRACE) {
                warn!("stopping the engine on the way out: {e}");
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(dir: &Path, script: &str, port: u16) -> EngineSpec {
        EngineSpec {
            argv: vec!["sh".into(), "-c".into(), script.into()],
            env: BTreeMap::new(),
            port,
            ready_path: "/".into(),
            startup_timeout: Duration::from_millis(800),
            stop_grace: Duration::from_millis(300),
            log_stem: dir.join("engine"),
        }
    }

    fn rt() -> tokio::runtime::Runtime {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap()
    }

    #[test]
    fn an_engine_that_exits_at_once_is_an_error_with_its_stderr() {
        let dir = tempfile::tempdir().unwrap();
        let mut e = Engine::spawn(spec(
            dir.path(),
            "echo loading; echo 'no such model: m.gguf' >&2; exit 3",
            free_port().unwrap(),
        ))
        .unwrap();
        let pgid = e.pgid();
        let err = rt().block_on(e.wait_ready(None)).unwrap_err();
        assert!(matches!(err, TuneError::EngineExited { .. }), "{err}");
        let msg = err.to_string();
        assert!(
            msg.contains("no such model: m.gguf") && msg.contains("exit status: 3"),
            "{msg}"
        );
        drop(e);
        assert_eq!(group_members(pgid), None);
    }

    #[test]
    fn an_engine_that_never_answers_is_stopped_within_its_bound() {
        let dir = tempfile::tempdir().unwrap();
        // A child that ignores SIGTERM, in the background: SIGKILL must reach it.
        let mut e = Engine::spawn(spec(
            dir.path(),
            "trap '' TERM; echo starting >&2; sleep 30 & sleep 30",
            free_port().unwrap(),
        ))
        .unwrap();
        let pgid = e.pgid();
        let t = Instant::now();
        let err = rt().block_on(e.wait_ready(None)).unwrap_err();
        assert!(t.elapsed() < Duration::from_secs(10), "{:?}", t.elapsed());
        let msg = err.to_string();
        assert!(
            matches!(err, TuneError::EngineNotReady { .. }) && msg.contains("starting"),
            "{msg}"
        );
        assert_eq!(group_members(pgid), None, "nothing of the engine is left");
        drop(e);
    }

    #[test]
    fn a_port_in_use_is_refused_before_anything_starts() {
        let dir = tempfile::tempdir().unwrap();
        let held = TcpListener::bind(("127.0.0.1", 0)).unwrap();
        let port = held.local_addr().unwrap().port();
        let marker = dir.path().join("started");
        let err = Engine::spawn(spec(
            dir.path(),
            &format!("touch {}", marker.display()),
            port,
        ))
        .unwrap_err();
        assert!(
            matches!(err, TuneError::PortInUse { port: p, .. } if p == port),
            "{err}"
        );
        assert!(err.to_string().contains(&port.to_string()));
        std::thread::sleep(Duration::from_millis(100));
        assert!(!marker.exists(), "the engine was not started");
    }

    #[test]
    fn a_ready_engine_and_its_children_are_stopped_by_sigterm_or_by_drop() {
        let dir = tempfile::tempdir().unwrap();
        // A server (python's http.server) behind a shell that also leaves a child running,
        // each start on a port of its own: a port just released may be handed to a test
        // running beside this one.
        let server = || {
            let port = free_port().unwrap();
            let script = format!("sleep 30 & exec python3 -m http.server {port} --bind 127.0.0.1");
            let mut s = spec(dir.path(), &script, port);
            s.startup_timeout = Duration::from_secs(20);
            s
        };
        let mut e = Engine::spawn(server()).unwrap();
        let pgid = e.pgid();
        rt().block_on(e.wait_ready(None)).unwrap();
        assert!(group_members(pgid).unwrap().len() >= 2);
        let stopped = e.stop().unwrap();
        assert!(matches!(stopped, Stopped::Terminated(_)), "{stopped:?}");
        assert_eq!(group_members(pgid), None);
        // The same, dropped without a stop (an error path).
        let e = Engine::spawn(server()).unwrap();
        let pgid = e.pgid();
        drop(e);
        assert_eq!(group_members(pgid), None);
    }
}
