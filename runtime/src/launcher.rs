//! Starting and watching shims from the agent.

use std::fs;
use std::io::BufReader;
use std::os::unix::process::CommandExt;
use std::path::PathBuf;
use std::process::{Child, ChildStdin, ChildStdout, Command, Stdio};
use std::sync::{Arc, Mutex};

use nix::sys::signal::Signal;

use crate::error::{ErrorKind, RuntimeError};
use crate::jobdir::JobDir;
use crate::spawner::RequestError;
use crate::spec::{ContainerSpec, Outcome};
use wharf_api::fault::FaultCode;

/// What the agent can tell about a job from its directory.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum JobStatus {
    /// The shim is alive.
    Running {
        /// Shim pid.
        pid: u32,
        /// When the user's process started (ms); `None` while the sandbox is being made.
        started_ms: Option<u64>,
    },
    /// The shim wrote its outcome.
    Exited(Outcome),
    /// The shim is gone without an outcome (killed, or the node rebooted).
    Lost(String),
}

/// Starts shims and inspects them. Safe to use from many threads.
///
/// Shims are forked by a pre-started spawner (`<exe> shim --spawner`, see [`crate::spawner`]),
/// started by [`Launcher::warm_up`] (or the first launch) and again if it dies; if it cannot
/// be used, the shim is started directly as `<exe> shim DIR`.
#[derive(Debug, Clone)]
pub struct Launcher {
    exe: PathBuf,
    spawner: Arc<Mutex<Option<Spawner>>>,
}

/// The running spawner and its pipes.
#[derive(Debug)]
struct Spawner {
    child: Child,
    to: ChildStdin,
    from: BufReader<ChildStdout>,
}

impl Drop for Spawner {
    fn drop(&mut self) {
        // It exits when its stdin closes; make sure, and reap it.
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Launcher {
    /// A launcher for the shims of `exe`, normally the `wharf` binary itself.
    pub fn new(exe: PathBuf) -> Self {
        Launcher {
            exe,
            spawner: Arc::new(Mutex::new(None)),
        }
    }

    /// Writes the spec to `dir` and starts its shim in its own process group, so that it
    /// outlives an agent restart and a terminal's signals to the agent (SIGINT, SIGHUP).
    /// Returns the shim pid. Fails if the job directory exists.
    ///
    /// Its failures are the node's ([`FaultCode::Supervisor`], or a full disk), but for a
    /// job directory that exists already (a repeated order: nothing is wrong with the node).
    pub fn launch(&self, dir: &JobDir, spec: &ContainerSpec) -> Result<u32, RuntimeError> {
        self.launch_shim(dir, spec).map_err(|e| match e.kind {
            ErrorKind::InvalidInput => e,
            _ => e.with_code(FaultCode::Supervisor),
        })
    }

    fn launch_shim(&self, dir: &JobDir, spec: &ContainerSpec) -> Result<u32, RuntimeError> {
        dir.create(spec)?;
        let (pid, started) = match self.fork_shim(dir) {
            Ok(shim) => shim,
            // The spawner took the request (it made the log) and died: a shim may be running,
            // and a second one must not be started. A forked shim writes its pid file first
            // thing; if none appears, it was never forked (or died at once).
            Err(RequestError::Broken(e)) if dir.log().exists() => {
                let deadline = std::time::Instant::now() + std::time::Duration::from_secs(2);
                loop {
                    if let Some((pid, Some(started))) = dir.read_pid() {
                        break (pid, started);
                    }
                    if std::time::Instant::now() > deadline {
                        return Err(RuntimeError::new(
                            ErrorKind::Unavailable,
                            format!("the shim spawner failed while starting the shim: {e}"),
                        ));
                    }
                    std::thread::sleep(std::time::Duration::from_millis(10));
                }
            }
            // Nothing was forked: start the shim as a process of its own.
            Err(e) => {
                tracing::warn!(error = %e, "starting the shim directly");
                self.spawn_shim(dir)?
            }
        };
        dir.write_pid(pid, started)?;
        Ok(pid)
    }

    /// Starts the spawner now rather than with the first launch (which would then wait for
    /// it). The agent calls this when it starts.
    pub fn warm_up(&self) -> Result<(), RuntimeError> {
        let mut slot = self
            .spawner
            .lock()
            .map_err(|_| RuntimeError::new(ErrorKind::Unavailable, "spawner lock poisoned"))?;
        if slot.is_none() {
            *slot = Some(self.start_spawner().map_err(|e| {
                RuntimeError::io(format!("starting {} shim --spawner", self.exe.display()), e)
            })?);
        }
        Ok(())
    }

    /// Has the spawner fork the shim, starting the spawner first if it is not running, and
    /// once more if the one running has died.
    fn fork_shim(&self, dir: &JobDir) -> Result<(u32, u64), RequestError> {
        let mut slot = self
            .spawner
            .lock()
            .map_err(|_| RequestError::Refused("the spawner's lock is poisoned".into()))?;
        let mut tries = 0;
        loop {
            tries += 1;
            let s = match slot.as_mut() {
                Some(s) => s,
                None => slot.insert(
                    self.start_spawner()
                        .map_err(|e| RequestError::Refused(format!("cannot start it: {e}")))?,
                ),
            };
            let within = crate::spawner::ANSWER_WITHIN;
            match crate::spawner::request(&mut s.to, &mut s.from, dir.path(), within) {
                Ok(shim) => return Ok(shim),
                Err(e @ RequestError::Refused(_)) => return Err(e),
                Err(e) => {
                    *slot = None;
                    // Again with a new spawner only if the old one never took the request.
                    if tries == 2 || dir.log().exists() {
                        return Err(e);
                    }
                }
            }
        }
    }

    fn start_spawner(&self) -> std::io::Result<Spawner> {
        let mut child = Command::new(&self.exe)
            .args(["shim", "--spawner"])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .process_group(0)
            .spawn()?;
        let (Some(to), Some(from)) = (child.stdin.take(), child.stdout.take()) else {
            return Err(std::io::Error::other("spawner pipes missing"));
        };
        Ok(Spawner {
            child,
            to,
            from: BufReader::new(from),
        })
    }

    /// Starts the shim as its own process (`exe shim DIR`). Spawned without a pre-exec hook,
    /// so the standard library can use posix_spawn rather than fork the (large, threaded)
    /// agent.
    fn spawn_shim(&self, dir: &JobDir) -> Result<(u32, u64), RuntimeError> {
        let log = JobDir::open_private(&dir.log(), false)
            .map_err(|e| RuntimeError::io(dir.log().display(), e))?;
        let log2 = log.try_clone().map_err(|e| RuntimeError::io("dup", e))?;
        let mut cmd = Command::new(&self.exe);
        cmd.arg("shim")
            .arg(dir.path())
            .stdin(Stdio::null())
            .stdout(log)
            .stderr(log2)
            .process_group(0);
        let mut child = cmd
            .spawn()
            .map_err(|e| RuntimeError::io(format!("starting {} shim", self.exe.display()), e))?;
        let pid = child.id();
        let started = crate::sys::start_time(pid).unwrap_or_default();
        // Reap it when it ends; after an agent restart init does.
        std::thread::spawn(move || child.wait());
        Ok((pid, started))
    }

    /// The job's status, from its directory and the shim's pid.
    pub fn status(&self, dir: &JobDir) -> JobStatus {
        if let Some(o) = dir.read_outcome() {
            return JobStatus::Exited(o);
        }
        match self.live_pid(dir) {
            Some(pid) => JobStatus::Running {
                pid,
                started_ms: fs::read_to_string(dir.started())
                    .ok()
                    .and_then(|t| t.trim().parse().ok()),
            },
            // The shim may have written its outcome just now.
            None => match dir.read_outcome() {
                Some(o) => JobStatus::Exited(o),
                None => JobStatus::Lost(format!(
                    "the job's supervisor died without a result (see {})",
                    dir.log().display()
                )),
            },
        }
    }

    /// Asks the shim to cancel the job (SIGTERM; the shim then TERMs the job, waits the grace
    /// period and KILLs what is left). Idempotent; a finished job is not an error.
    pub fn cancel(&self, dir: &JobDir) -> Result<(), RuntimeError> {
        self.signal_shim(dir, Signal::SIGTERM)
            .map_err(|e| RuntimeError::io("signalling the job's shim", e))
    }

    /// Wakes the shim of a started job to look at its task's input end
    /// ([`crate::shim::INPUT_ENDED`]); before the start it looks by itself as it starts
    /// waiting, and a launch is not interrupted.
    /// A shim that holds no writer (one from before that) is left alone: it has no handler
    /// for the signal.
    pub fn input_ended(&self, dir: &JobDir) {
        if !dir.started().exists() || !dir.stdin_held().exists() {
            return;
        }
        let _ = self.signal_shim(dir, crate::shim::INPUT_ENDED);
    }

    /// Wakes the shim of a job to take the signal requests written for it
    /// ([`crate::signals`]). Only a shim that made the request directory is woken: it has
    /// a handler for the wake by then (an older shim has none, and would die of it).
    pub fn signals_requested(&self, dir: &JobDir) {
        if !dir.signal_requests().is_dir() {
            return;
        }
        let _ = self.signal_shim(dir, crate::shim::INPUT_ENDED);
    }

    /// Sends `sig` to the job's shim, if it is alive: through a pidfd opened and then checked
    /// to be the shim's, so that a process that took a dead shim's pid over is never sent
    /// it (most of these signals' default is to end a process). A shim that is gone is no
    /// error.
    fn signal_shim(&self, dir: &JobDir, sig: Signal) -> std::io::Result<()> {
        let Some(pid) = self.live_pid(dir) else {
            return Ok(());
        };
        let Some(fd) = crate::sys::pidfd_or_kill(pid, sig)? else {
            return Ok(());
        };
        if self.live_pid(dir) != Some(pid) {
            return Ok(());
        }
        match crate::sys::pidfd_send_signal(&fd, sig) {
            Err(e) if e.raw_os_error() == Some(libc::ESRCH) => Ok(()),
            r => r,
        }
    }

    /// The shim's pid if that process is alive and is this job's shim (not a reused pid: the
    /// start time recorded at launch must match; the command line is not used, since it is
    /// empty for a moment while the shim is being exec'd).
    fn live_pid(&self, dir: &JobDir) -> Option<u32> {
        let (pid, recorded) = dir.read_pid()?;
        let (state, started) = crate::sys::stat_of(pid)?;
        let ours = match recorded {
            Some(recorded) => started == recorded,
            // A pid file from an older agent: the shim's command line names the directory.
            None => fs::read(format!("/proc/{pid}/cmdline")).is_ok_and(|c| {
                let needle = dir.path().as_os_str().as_encoded_bytes();
                c.split(|&b| b == 0).any(|arg| arg == needle)
            }),
        };
        // A zombie has finished; its outcome is what counts.
        (ours && state != "Z").then_some(pid)
    }

    /// Removes a finished job's directory. Refuses while the shim runs. When the shim died
    /// without cleaning up (killed, say), whatever it left is removed first: every process in
    /// the job's cgroup, the container's state and cgroups, or the engine's container.
    pub fn remove(&self, dir: &JobDir) -> Result<(), RuntimeError> {
        // A shim that has written its outcome is on its way out (it syncs the outcome, then
        // exits): wait for its exit, 5 s at most.
        if let (Some(pid), Some(_)) = (self.live_pid(dir), dir.read_outcome()) {
            // Checked again once opened: the pidfd is the shim's, not a reused pid's.
            if let Ok(fd) = crate::sys::pidfd_open(pid) {
                if self.live_pid(dir) == Some(pid) {
                    crate::sys::readable(&fd, 5000);
                }
            }
        }
        if let Some(pid) = self.live_pid(dir) {
            return Err(RuntimeError::new(
                ErrorKind::InvalidInput,
                format!("job still running (shim {pid})"),
            ));
        }
        if dir.read_outcome().is_none() {
            if let Ok(spec) = dir.read_spec() {
                crate::shim::clean_up_after_lost_shim(&spec);
            }
        }
        // Binds staged for the Docker engine go first: the removal must not descend into them.
        crate::as_user::unstage(dir.path());
        match fs::remove_dir_all(dir.path()) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
                Err(RuntimeError::io(dir.path().display(), e))
            }
            _ => Ok(()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn dir_with_pid_file(text: &str) -> (tempfile::TempDir, JobDir) {
        let tmp = tempfile::tempdir().unwrap();
        let jd = JobDir::new(tmp.path().join("7"));
        fs::create_dir(jd.path()).unwrap();
        fs::write(jd.pid(), text).unwrap();
        (tmp, jd)
    }

    #[test]
    fn a_shim_is_known_by_its_pid_and_start_time() {
        let launcher = Launcher::new("/nonexistent".into());
        let me = std::process::id();
        let started = crate::sys::start_time(me).unwrap();
        let (_t, jd) = dir_with_pid_file(&format!("{me} {started}"));
        assert!(matches!(
            launcher.status(&jd),
            JobStatus::Running { pid, .. } if pid == me
        ));
        // The same pid with another start time is a reused pid: the shim is gone.
        let (_t, jd) = dir_with_pid_file(&format!("{me} {}", started + 1));
        assert!(matches!(launcher.status(&jd), JobStatus::Lost(_)));
        // An older pid file (pid only) falls back to the command line, which is not a shim's.
        let (_t, jd) = dir_with_pid_file(&me.to_string());
        assert!(matches!(launcher.status(&jd), JobStatus::Lost(_)));
    }
}
