//! The per-job directory on the node: the spec, the shim's pid, its log and the outcome.

use std::io::Write;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};

use crate::error::RuntimeError;
use crate::spec::{ContainerSpec, Outcome};

/// Layout of one job's directory. Only root can read it (it is under the agent's state dir).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct JobDir {
    root: PathBuf,
}

impl JobDir {
    /// The directory at `root` (not created).
    pub fn new(root: PathBuf) -> Self {
        JobDir { root }
    }
    /// The directory itself.
    pub fn path(&self) -> &Path {
        &self.root
    }
    /// The container spec the shim runs.
    pub fn spec(&self) -> PathBuf {
        self.root.join("spec.json")
    }
    /// Where the agent writes signals for the task's processes (see [`crate::signals`]).
    pub fn signal_requests(&self) -> PathBuf {
        self.root.join("signals")
    }
    /// The newest signal request the agent passed on to the task (see [`crate::signals`]).
    pub fn signalled(&self) -> PathBuf {
        self.root.join("signalled")
    }
    /// The shim's pid.
    pub fn pid(&self) -> PathBuf {
        self.root.join("shim.pid")
    }
    /// Records the shim's pid and start time, which name it even after the pid is reused.
    /// Written whole (temp file and rename): the shim forked by the spawner writes it too.
    pub(crate) fn write_pid(&self, pid: u32, started: u64) -> Result<(), RuntimeError> {
        JobDir::replace_private(&self.pid(), format!("{pid} {started}").as_bytes())
            .map_err(|e| RuntimeError::io(self.pid().display(), e))
    }
    /// The pid in the pid file, and the start time when it records one (older agents did not).
    pub(crate) fn read_pid(&self) -> Option<(u32, Option<u64>)> {
        let text = std::fs::read_to_string(self.pid()).ok()?;
        let mut f = text.split_whitespace();
        let pid = f.next()?.parse().ok()?;
        Some((pid, f.next().and_then(|t| t.parse().ok())))
    }
    /// The shim's own log.
    pub fn log(&self) -> PathBuf {
        self.root.join("shim.log")
    }
    /// The outcome, written once at the end.
    pub fn outcome(&self) -> PathBuf {
        self.root.join("outcome.json")
    }
    /// Written (with the start time in ms) once the user's process has started.
    pub fn started(&self) -> PathBuf {
        self.root.join("started")
    }
    /// Written by the agent (with the reason) once it has passed a stop order to the shim.
    pub fn stop(&self) -> PathBuf {
        self.root.join("stop")
    }
    /// The job's time limit in seconds from its start: written at creation, and again whole
    /// by the agent when it changes after the launch (an admin's `wharf update --time` of a
    /// running job); read by the shim as it waits ([`JobDir::read_time_limit`]).
    pub fn time_limit(&self) -> PathBuf {
        self.root.join("time_limit")
    }
    /// Marks a step task whose time limit is the step's own (`srun -t`): a change of its
    /// job's limit does not move it.
    pub fn own_time_limit(&self) -> PathBuf {
        self.root.join("own_time_limit")
    }
    /// The time limit [`JobDir::time_limit`] holds, if it has one.
    pub fn read_time_limit(&self) -> Option<u64> {
        std::fs::read_to_string(self.time_limit())
            .ok()?
            .trim()
            .parse()
            .ok()
    }
    /// The time limit the job's supervisor holds it to: [`JobDir::time_limit`]'s, else (a
    /// directory made before it was written at creation) the spec's.
    pub fn held_time_limit(&self) -> Option<u64> {
        (self.read_time_limit()).or_else(|| self.read_spec().ok()?.time_limit)
    }
    /// Records a time limit changed after the launch, whole (temp file and rename), for the
    /// shim to take up within a second.
    pub fn write_time_limit(&self, secs: u64) -> std::io::Result<()> {
        JobDir::replace_private(&self.time_limit(), secs.to_string().as_bytes())
    }
    /// The agent's tally of the job's measured use while it runs.
    pub fn usage(&self) -> PathBuf {
        self.root.join("usage")
    }
    /// Where a task's stream goes when its spec captures it (`capture_stdout`/`_stderr`):
    /// root's file in this directory, which only the agent reads.
    pub fn captured(&self, stderr: bool) -> PathBuf {
        self.root.join(if stderr { "stderr" } else { "stdout" })
    }
    /// The directory of a task's standard input pipe ([`JobDir::stdin_pipe`]): root's, 0700,
    /// so no process of the job's user reaches the pipe by its name.
    pub fn input_dir(&self) -> PathBuf {
        self.root.join("input")
    }
    /// A task's standard input when its spec takes it from the agent (`capture_stdin`): a
    /// FIFO the shim makes and opens for the task, and the agent opens for writing.
    pub fn stdin_pipe(&self) -> PathBuf {
        self.input_dir().join("stdin")
    }
    /// Written by the agent once the controller knows the task takes no more input (it
    /// closed it, got its end or ended): the agent says so at every poll from then on.
    pub fn stdin_closed(&self) -> PathBuf {
        self.input_dir().join("closed")
    }
    /// How many bytes of the task's input the agent has written into [`JobDir::stdin_pipe`]
    /// (20 decimal digits, rewritten in place after each write): an agent that restarts goes
    /// on from there.
    pub fn stdin_written(&self) -> PathBuf {
        self.input_dir().join("written")
    }
    /// Written by the agent before [`JobDir::stdin_ready`] when it will write
    /// [`JobDir::stdin_end`] at the input's end (an agent from before that closes its writer
    /// as the end): the shim may then hold a writer of its own.
    pub fn stdin_hold(&self) -> PathBuf {
        self.input_dir().join("hold")
    }
    /// Written by the shim once it holds a writer of its own on [`JobDir::stdin_pipe`]: only
    /// then is it woken for the end, and does a restarted agent go on writing.
    pub fn stdin_held(&self) -> PathBuf {
        self.input_dir().join("held")
    }
    /// Written by the agent once it has written the input's end: the shim then closes its own
    /// writer on [`JobDir::stdin_pipe`] (held so that the pipe outlives a restarting agent),
    /// and the task reads its end.
    pub fn stdin_end(&self) -> PathBuf {
        self.input_dir().join("end")
    }
    /// Written by the agent once it holds [`JobDir::stdin_pipe`] open for writing: only then
    /// does the shim start the task, which would otherwise read the end of its input at once.
    pub fn stdin_ready(&self) -> PathBuf {
        self.input_dir().join("ready")
    }
    /// The shim's launch timeline (see [`crate::timeline`]).
    pub fn timeline(&self) -> PathBuf {
        self.root.join("timeline")
    }

    /// Creates the directory (mode 0711: the container's unprivileged ids must traverse it to
    /// reach the root bound inside; every file in it is 0600, see [`JobDir::open_private`])
    /// and writes the spec. Fails with `InvalidInput` if it exists. The spec is not fsynced: a job outlives
    /// an agent crash (the page cache keeps the file) but never a node crash, and the launch
    /// should not wait for the disk.
    pub fn create(&self, spec: &ContainerSpec) -> Result<(), RuntimeError> {
        use std::os::unix::fs::DirBuilderExt;
        std::fs::DirBuilder::new()
            .mode(0o711)
            .create(&self.root)
            .map_err(|e| {
                RuntimeError::io(format!("creating job directory {}", self.root.display()), e)
            })?;
        write_json(&self.spec(), spec, false)?;
        // Its time limit where the agent's reports read it (a small file, not the spec).
        if let Some(t) = spec.time_limit {
            JobDir::write_private(&self.time_limit(), t.to_string().as_bytes())
                .map_err(|e| RuntimeError::io(self.time_limit().display(), e))?;
        }
        Ok(())
    }

    /// Reads the spec.
    pub fn read_spec(&self) -> Result<ContainerSpec, RuntimeError> {
        read_json(&self.spec())
    }

    /// Reads the outcome, `None` when the job has not ended.
    pub fn read_outcome(&self) -> Option<Outcome> {
        read_json(&self.outcome()).ok()
    }

    /// Writes `value` as JSON to `path` so that readers see all of it or none, and it
    /// survives a node crash once this returns (temp file, rename, fsync).
    pub fn write_atomic<T: serde::Serialize>(path: &Path, value: &T) -> Result<(), RuntimeError> {
        write_json(path, value, true)
    }

    /// Writes `value` as JSON to `path` so that readers see all of it or none, without
    /// waiting for the disk: for what a node crash loses anyway (a running job's samples).
    pub fn write_replace<T: serde::Serialize>(path: &Path, value: &T) -> Result<(), RuntimeError> {
        write_json(path, value, false)
    }

    /// Opens `path`, a file of a job directory, for writing: appending when `append`, else
    /// emptied. The file is mode 0600 whatever the umask (created so, and made so if it
    /// existed): the directory is 0711, and a user who guesses a name in it must not read
    /// another job's command, shim errors or timings. Never through a symlink; close-on-exec;
    /// anything but a regular file is refused (`InvalidInput`), and not emptied first.
    pub fn open_private(path: &Path, append: bool) -> std::io::Result<std::fs::File> {
        use std::os::unix::fs::PermissionsExt;
        let f = std::fs::OpenOptions::new()
            .write(true)
            .append(append)
            .create(true)
            .mode(0o600)
            .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK | libc::O_NOCTTY | libc::O_CLOEXEC)
            .open(path)?;
        if !f.metadata()?.is_file() {
            return Err(std::io::Error::new(
                std::io::ErrorKind::InvalidInput,
                format!("{} is not a regular file", path.display()),
            ));
        }
        f.set_permissions(std::fs::Permissions::from_mode(0o600))?;
        // Non-blocking was for the open only (a FIFO would have blocked it).
        use nix::fcntl::{fcntl, FcntlArg, OFlag};
        use std::os::fd::AsRawFd;
        let flags = OFlag::from_bits_retain(fcntl(f.as_raw_fd(), FcntlArg::F_GETFL)?);
        fcntl(f.as_raw_fd(), FcntlArg::F_SETFL(flags - OFlag::O_NONBLOCK))?;
        if !append {
            f.set_len(0)?;
        }
        Ok(f)
    }

    /// Writes `bytes` as the whole of `path`, a private file of a job directory (see
    /// [`JobDir::open_private`]).
    pub fn write_private(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
        Self::open_private(path, false)?.write_all(bytes)
    }

    /// [`JobDir::write_private`] whole: into a temp file beside `path`, named for this
    /// process, then renamed over it, so a reader (or another writer) sees the old bytes or
    /// the new, never part.
    pub fn replace_private(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
        let mut name = path.file_name().unwrap_or_default().to_os_string();
        name.push(format!(".{}.tmp", std::process::id()));
        let tmp = path.with_file_name(name);
        Self::write_private(&tmp, bytes)?;
        std::fs::rename(&tmp, path)
    }
}

/// Writes `value` as JSON to a temp file renamed over `path`; when `durable`, fsynced after
/// the rename. Readers see the whole file the moment it is written (the agent reports a job's
/// outcome while the shim's fsync runs, not after it), and it is on disk once this returns;
/// a node that crashes in between leaves no outcome, or one that does not parse, which
/// readers take alike for none.
fn write_json<T: serde::Serialize>(
    path: &Path,
    value: &T,
    durable: bool,
) -> Result<(), RuntimeError> {
    let tmp = path.with_extension("tmp");
    let body = serde_json::to_vec_pretty(value)
        .map_err(|e| RuntimeError::new(crate::ErrorKind::InvalidInput, e.to_string()))?;
    let mut f =
        JobDir::open_private(&tmp, false).map_err(|e| RuntimeError::io(tmp.display(), e))?;
    f.write_all(&body)
        .map_err(|e| RuntimeError::io(tmp.display(), e))?;
    std::fs::rename(&tmp, path).map_err(|e| RuntimeError::io(path.display(), e))?;
    if durable {
        f.sync_all()
            .map_err(|e| RuntimeError::io(path.display(), e))?;
    }
    Ok(())
}

fn read_json<T: serde::de::DeserializeOwned>(path: &Path) -> Result<T, RuntimeError> {
    let body = std::fs::read(path).map_err(|e| RuntimeError::io(path.display(), e))?;
    serde_json::from_slice(&body).map_err(|e| {
        RuntimeError::new(
            crate::ErrorKind::InvalidInput,
            format!("{}: {e}", path.display()),
        )
    })
}

/// When a running task's time limit is up, counted from its start: the spec's limit, or the
/// one the agent wrote since ([`JobDir::time_limit`]: a running job's limit changed), looked
/// for at most once each `every`. The one clock both backends' supervisors hold a task to.
pub(crate) struct Deadline {
    started: std::time::Instant,
    at: Option<std::time::Instant>,
    every: std::time::Duration,
    looked: Option<std::time::Instant>,
}

impl Deadline {
    /// From `started`, `limit` seconds (none: no limit); a changed limit looked for at most
    /// once each `every`.
    pub(crate) fn new(
        started: std::time::Instant,
        limit: Option<u64>,
        every: std::time::Duration,
    ) -> Deadline {
        Deadline {
            started,
            at: limit.and_then(|t| Self::after(started, t)),
            every,
            looked: None,
        }
    }

    /// `t` seconds after `started`; a limit past what a clock can hold is no limit.
    fn after(started: std::time::Instant, t: u64) -> Option<std::time::Instant> {
        started.checked_add(std::time::Duration::from_secs(t))
    }

    /// Takes up a limit the agent wrote in `jd` since, looking at most once each `every`.
    pub(crate) fn refresh(&mut self, jd: &JobDir) {
        let due = self.looked.is_none_or(|l| l.elapsed() >= self.every);
        if due {
            self.looked = Some(std::time::Instant::now());
            if let Some(t) = jd.read_time_limit() {
                self.at = Self::after(self.started, t);
            }
        }
    }

    /// When the limit is up; `None` without one.
    pub(crate) fn at(&self) -> Option<std::time::Instant> {
        self.at
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    fn mode(p: &Path) -> u32 {
        std::fs::metadata(p).unwrap().permissions().mode() & 0o7777
    }

    #[test]
    fn private_files_are_0600_whatever_the_umask_and_were() {
        let tmp = tempfile::tempdir().unwrap();
        let fresh = tmp.path().join("fresh");
        JobDir::write_private(&fresh, b"a").unwrap();
        assert_eq!(mode(&fresh), 0o600);
        // A file left by an older version, readable by all, is narrowed and emptied.
        let old = tmp.path().join("old");
        std::fs::write(&old, "old text").unwrap();
        std::fs::set_permissions(&old, std::fs::Permissions::from_mode(0o644)).unwrap();
        JobDir::write_private(&old, b"new").unwrap();
        assert_eq!(
            (mode(&old), std::fs::read_to_string(&old).unwrap()),
            (0o600, "new".into())
        );
        // Appending keeps what is there.
        let mut f = JobDir::open_private(&old, true).unwrap();
        f.write_all(b"+").unwrap();
        assert_eq!(std::fs::read_to_string(&old).unwrap(), "new+");
    }

    #[test]
    fn private_files_are_never_opened_through_a_symlink_or_a_fifo() {
        let tmp = tempfile::tempdir().unwrap();
        let target = tmp.path().join("target");
        std::fs::write(&target, "keep").unwrap();
        let link = tmp.path().join("link");
        std::os::unix::fs::symlink(&target, &link).unwrap();
        assert!(JobDir::write_private(&link, b"x").is_err());
        assert_eq!(std::fs::read_to_string(&target).unwrap(), "keep");
        // A FIFO with no reader would block a plain open for writing.
        let fifo = tmp.path().join("fifo");
        nix::unistd::mkfifo(&fifo, nix::sys::stat::Mode::from_bits_truncate(0o600)).unwrap();
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || tx.send(JobDir::write_private(&fifo, b"x").is_err()));
        let refused = rx.recv_timeout(std::time::Duration::from_secs(10));
        assert_eq!(refused, Ok(true), "a FIFO was opened (or blocked the open)");
    }
}
