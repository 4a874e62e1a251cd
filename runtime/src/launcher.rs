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

/// State letter and start time (clock ticks after boot) of process `pid`, from
/// `/proc/PID/stat` (fields 3 and 22; the command name before them may hold any byte).
fn stat_of(pid: u32) -> Option<(String, u64)> {
    let stat = fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let after_name: Vec<&str> = stat.rsplit_once(')')?.1.split_whitespace().collect();
    Some((
        after_name.first()?.to_string(),
        after_name.get(19)?.parse().ok()?,
    ))
}

fn start_time(pid: u32) -> Option<u64> {
    stat_of(pid).map(|(_, t)| t)
}

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

    /// Writes the spec to `dir` and starts its shim in its own process group, so that it
    /// outlives an agent restart and a terminal's signals to the agent (SIGINT, SIGHUP).
    /// Spawned without a pre-exec hook, so the standard library can use posix_spawn rather
    /// than fork the (large, threaded) agent. Returns the shim pid. Fails if the job directory
    /// exists.
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
            .stderr(log2)
            .process_group(0);
        let mut child = cmd
            .spawn()
            .map_err(|e| RuntimeError::io(format!("starting {} shim", self.exe.display()), e))?;
        let pid = child.id();
        // The pid and the process's start time name this shim even after the pid is reused.
        let started = start_time(pid).unwrap_or_default();
        fs::write(dir.pid(), format!("{pid} {started}"))
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

    /// The shim's pid if that process is alive and is this job's shim (not a reused pid: the
    /// start time recorded at launch must match; the command line is not used, since it is
    /// empty for a moment while the shim is being exec'd).
    fn live_pid(&self, dir: &JobDir) -> Option<u32> {
        let text = fs::read_to_string(dir.pid()).ok()?;
        let mut fields = text.split_whitespace();
        let pid: u32 = fields.next()?.parse().ok()?;
        let (state, started) = stat_of(pid)?;
        let ours = match fields.next().and_then(|t| t.parse::<u64>().ok()) {
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
        // A shim that has written its outcome is on its way out: give it a moment.
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
        while self.live_pid(dir).is_some()
            && dir.read_outcome().is_some()
            && std::time::Instant::now() < deadline
        {
            std::thread::sleep(std::time::Duration::from_millis(10));
        }
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
        let started = start_time(me).unwrap();
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
