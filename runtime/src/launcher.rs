//! Starting and watching shims from the agent.

use std::fs;
use std::os::unix::process::CommandExt;
use std::path::PathBuf;
use std::process::{Command, Stdio};

use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;

use crate::error::{ErrorKind, RuntimeError};
use crate::jobdir::JobDir;
use crate::spec::{ContainerSpec, Outcome};

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

/// Starts shims (`<exe> shim <dir>`) and inspects them. Safe to use from many threads.
#[derive(Debug, Clone)]
pub struct Launcher {
    exe: PathBuf,
}

impl Launcher {
    /// A launcher that runs `exe shim DIR`; `exe` is normally the `wharf` binary itself.
    pub fn new(exe: PathBuf) -> Self {
        Launcher { exe }
    }

    /// Writes the spec to `dir` and starts its shim, detached in its own session so that it
    /// outlives an agent restart. Returns the shim pid. Fails if the job directory exists.
    pub fn launch(&self, dir: &JobDir, spec: &ContainerSpec) -> Result<u32, RuntimeError> {
        dir.create(spec)?;
        let log =
            fs::File::create(dir.log()).map_err(|e| RuntimeError::io(dir.log().display(), e))?;
        let log2 = log.try_clone().map_err(|e| RuntimeError::io("dup", e))?;
        let mut cmd = Command::new(&self.exe);
        cmd.arg("shim")
            .arg(dir.path())
            .stdin(Stdio::null())
            .stdout(log)
            .stderr(log2);
        // SAFETY: setsid is async-signal-safe.
        unsafe {
            cmd.pre_exec(|| {
                if libc::setsid() < 0 {
                    return Err(std::io::Error::last_os_error());
                }
                Ok(())
            });
        }
        let mut child = cmd
            .spawn()
            .map_err(|e| RuntimeError::io(format!("starting {} shim", self.exe.display()), e))?;
        let pid = child.id();
        fs::write(dir.pid(), pid.to_string())
            .map_err(|e| RuntimeError::io(dir.pid().display(), e))?;
        // Reap it when it ends; after an agent restart init does.
        std::thread::spawn(move || child.wait());
        Ok(pid)
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
        match self.live_pid(dir) {
            Some(pid) => kill(Pid::from_raw(pid as i32), Signal::SIGTERM)
                .or_else(|e| {
                    if e == nix::errno::Errno::ESRCH {
                        Ok(())
                    } else {
                        Err(e)
                    }
                })
                .map_err(|e| RuntimeError::sys(format!("signalling shim {pid}"), e)),
            None => Ok(()),
        }
    }

    /// The shim's pid if that process is alive and is this job's shim (not a reused pid).
    fn live_pid(&self, dir: &JobDir) -> Option<u32> {
        let pid: u32 = fs::read_to_string(dir.pid()).ok()?.trim().parse().ok()?;
        let cmdline = fs::read(format!("/proc/{pid}/cmdline")).ok()?;
        let stat = fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
        // A zombie has finished; its outcome is what counts.
        let state = stat.rsplit(')').next()?.split_whitespace().next()?;
        let needle = dir.path().as_os_str().as_encoded_bytes();
        let ours = cmdline.split(|&b| b == 0).any(|arg| arg == needle);
        (ours && state != "Z").then_some(pid)
    }

    /// Removes a finished job's directory. Refuses while the shim runs. When the shim died
    /// without cleaning up (killed, say), whatever it left is removed first: every process in
    /// the job's cgroup, the container's state and cgroups, or the engine's container.
    pub fn remove(&self, dir: &JobDir) -> Result<(), RuntimeError> {
        if let Some(pid) = self.live_pid(dir) {
            return Err(RuntimeError::new(
                ErrorKind::InvalidInput,
                format!("job still running (shim {pid})"),
            ));
        }
        if dir.read_outcome().is_none() {
            if let Ok(spec) = dir.read_spec() {
                crate::shim::clean_up_after_lost_shim(dir, &spec);
            }
        }
        match fs::remove_dir_all(dir.path()) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
                Err(RuntimeError::io(dir.path().display(), e))
            }
            _ => Ok(()),
        }
    }
}
