//! A task's standard input: `/dev/null`, or, for a step's task that takes its caller's input
//! (`ContainerSpec::capture_stdin`), a FIFO in the job directory that the agent writes into.
//!
//! ```text
//!  shim: mkdir DIR/input (root's, 0700) ─▶ mkfifo DIR/input/stdin (the user's, 0600)
//!        ─▶ open it for reading, non-blocking ─▶ wait for DIR/input/ready ─▶ blocking ─▶ task
//!        ─▶ and for writing, held while the task runs ─▶ closed once DIR/input/end is there
//!  agent: open DIR/input/stdin for writing (once the shim's reader is there) ─▶ ready
//!        ─▶ writes what the caller sent, as the task reads it, DIR/input/written counting it
//!        ─▶ the input's end: DIR/input/end, the shim woken (SIGUSR1) ─▶ its writer closed
//!        ─▶ the task reads what is left in the pipe, then its EOF
//! ```
//!
//! **Why wait for `ready`**: a FIFO with no writer reads as its end; a task that read before
//! the agent opened it would see its input end at once. **Why the shim holds a writer**: for
//! the same reason, an agent that restarts (upgraded, or crashed) would otherwise end its
//! tasks' input; the new agent opens the pipe again and goes on from `written`. **Why the user's FIFO in root's
//! directory**: nothing of the job's user reaches it by name (the directory is root's), yet
//! the task may open its own input again (`/dev/stdin`, i.e. `/proc/self/fd/0`, which checks
//! the FIFO's own owner and mode only).

use std::os::fd::{AsRawFd, OwnedFd};
use std::time::{Duration, Instant};

use nix::fcntl::{fcntl, FcntlArg, OFlag};
use nix::sys::stat::Mode;

use crate::error::{ErrorKind, RuntimeError};
use crate::jobdir::JobDir;
use crate::shim::{Abort, Stop};
use crate::spec::ContainerSpec;

/// How long the shim waits for the agent to hold the task's input open before it gives up.
pub const READY_WAIT: Duration = Duration::from_secs(60);
/// How often it looks.
const READY_EVERY: Duration = Duration::from_millis(20);

/// The shim's own writer on a task's input pipe, held until the agent has written the
/// input's end (so that the task never reads an end the agent did not write).
#[derive(Debug)]
pub(crate) struct Holder {
    writer: Option<OwnedFd>,
    end: std::path::PathBuf,
}

impl Holder {
    /// Closes the writer once the agent wrote the input's end. True while it is held.
    pub(crate) fn release_when_ended(&mut self) -> bool {
        if self.writer.is_some() && self.end.exists() {
            self.writer = None;
        }
        self.writer.is_some()
    }
}

/// The task's standard input, and for input from the agent the shim's [`Holder`] of its
/// pipe. `stop` is asked while the shim waits for the agent.
///
/// Errors: the FIFO cannot be made or opened, or the agent did not open it within
/// [`READY_WAIT`]; a stop asked meanwhile ends the wait as that stop.
pub(crate) fn open_input(
    spec: &ContainerSpec,
    jd: &JobDir,
    stop: &dyn Fn() -> Option<Stop>,
) -> Result<(OwnedFd, Option<Holder>), Abort> {
    if !spec.capture_stdin {
        let null =
            std::fs::File::open("/dev/null").map_err(|e| RuntimeError::io("/dev/null", e))?;
        return Ok((null.into(), None));
    }
    let fd = make_pipe(jd, spec.uid, spec.gid)?;
    let since = Instant::now();
    while !jd.stdin_ready().exists() {
        if let Some(why) = stop() {
            return Err(Abort::Stop(why));
        }
        if since.elapsed() > READY_WAIT {
            return Err(RuntimeError::new(
                ErrorKind::Unavailable,
                format!(
                    "the node's agent did not open the task's standard input within {} s",
                    READY_WAIT.as_secs()
                ),
            )
            .into());
        }
        std::thread::sleep(READY_EVERY);
    }
    // The task reads as from any pipe: waiting for bytes.
    fcntl(fd.as_raw_fd(), FcntlArg::F_SETFL(OFlag::empty()))
        .map_err(|e| RuntimeError::sys("stdin pipe", e))?;
    // An agent that writes `input/end` says so before `ready`; one from before that closes
    // its writer as the end, so the shim must not hold one for it.
    if !jd.stdin_hold().exists() {
        return Ok((fd, None));
    }
    // The reader above is there, so this opens at once. Close-on-exec: the task never holds
    // it (it would never read its end).
    let path = jd.stdin_pipe();
    let writer = crate::sys::open_fd(
        &path,
        OFlag::O_WRONLY | OFlag::O_NONBLOCK | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC,
    )
    .map_err(|e| RuntimeError::sys(path.display(), e))?;
    JobDir::write_private(&jd.stdin_held(), b"")
        .map_err(|e| RuntimeError::io(jd.stdin_held().display(), e))?;
    let holder = Holder {
        writer: Some(writer),
        end: jd.stdin_end(),
    };
    Ok((fd, Some(holder)))
}

/// Makes the task's input FIFO (owned by `uid`:`gid`, in root's private directory) and
/// opens it for reading without waiting for a writer.
fn make_pipe(jd: &JobDir, uid: u32, gid: u32) -> Result<OwnedFd, RuntimeError> {
    use std::os::unix::fs::DirBuilderExt;
    let dir = jd.input_dir();
    std::fs::DirBuilder::new()
        .mode(0o700)
        .create(&dir)
        .map_err(|e| RuntimeError::io(dir.display(), e))?;
    let path = jd.stdin_pipe();
    nix::unistd::mkfifo(&path, Mode::from_bits_truncate(0o600))
        .map_err(|e| RuntimeError::sys(path.display(), e))?;
    std::os::unix::fs::lchown(&path, Some(uid), Some(gid))
        .map_err(|e| RuntimeError::io(path.display(), e))?;
    crate::sys::open_fd(
        &path,
        OFlag::O_RDONLY | OFlag::O_NONBLOCK | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC,
    )
    .map_err(|e| RuntimeError::sys(path.display(), e))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::{Read, Write};

    #[test]
    fn the_task_reads_what_the_agent_writes_and_then_its_end() {
        let dir = tempfile::tempdir().unwrap();
        let jd = JobDir::new(dir.path().join("t"));
        std::fs::create_dir(jd.path()).unwrap();
        let mut spec = crate::conformance::template("t", dir.path(), 1, 1);
        // Without capture: /dev/null, as always.
        let (null, holder) = open_input(&spec, &jd, &|| None).unwrap();
        assert!(holder.is_none());
        let mut f = std::fs::File::from(null);
        assert_eq!(f.read(&mut [0u8; 4]).unwrap(), 0);
        assert!(!jd.input_dir().exists());
        spec.capture_stdin = true;
        spec.uid = nix::unistd::getuid().as_raw();
        spec.gid = nix::unistd::getgid().as_raw();
        // The agent's side: open for writing once the reader is there, then say ready.
        let writer_jd = JobDir::new(jd.path().to_path_buf());
        let agent = std::thread::spawn(move || {
            let w = loop {
                use std::os::unix::fs::OpenOptionsExt;
                let opened = std::fs::OpenOptions::new()
                    .write(true)
                    .custom_flags(libc::O_NONBLOCK)
                    .open(writer_jd.stdin_pipe());
                match opened {
                    Ok(w) => break w,
                    Err(_) => std::thread::sleep(Duration::from_millis(5)),
                }
            };
            std::fs::write(writer_jd.stdin_hold(), b"").unwrap();
            std::fs::write(writer_jd.stdin_ready(), b"").unwrap();
            // The task must not see the end before the agent wrote anything.
            std::thread::sleep(Duration::from_millis(200));
            let mut w = w;
            w.write_all(b"a\n").unwrap();
            // The agent goes (a restart): the shim's writer keeps the input open, and the
            // next agent goes on.
            drop(w);
            std::thread::sleep(Duration::from_millis(200));
            let mut w = std::fs::OpenOptions::new()
                .write(true)
                .open(writer_jd.stdin_pipe())
                .unwrap();
            w.write_all(b"b\n").unwrap();
            std::fs::write(writer_jd.stdin_end(), b"").unwrap();
        });
        let (fd, holder) = open_input(&spec, &jd, &|| None).unwrap();
        let mut holder = holder.expect("a holder for input from the agent");
        assert!(jd.stdin_held().exists(), "the agent is told");
        assert!(holder.release_when_ended(), "held until the agent's end");
        let mut task = std::fs::File::from(fd);
        let mut text = vec![0u8; 2];
        task.read_exact(&mut text).unwrap();
        assert_eq!(text, b"a\n");
        let mut more = [0u8; 2];
        // No end while the agent is away: the next read waits for the next agent's bytes.
        task.read_exact(&mut more).unwrap();
        assert_eq!(&more, b"b\n");
        agent.join().unwrap();
        assert!(
            !holder.release_when_ended(),
            "closed once the end is written"
        );
        let mut rest = Vec::new();
        task.read_to_end(&mut rest).unwrap();
        assert!(rest.is_empty());
        use std::os::unix::fs::MetadataExt;
        let dir_mode = std::fs::metadata(jd.input_dir()).unwrap().mode();
        assert_eq!(dir_mode & 0o777, 0o700);
    }

    #[test]
    fn a_stop_ends_the_wait_for_the_agent() {
        let dir = tempfile::tempdir().unwrap();
        let jd = JobDir::new(dir.path().join("t"));
        std::fs::create_dir(jd.path()).unwrap();
        let mut spec = crate::conformance::template("t", dir.path(), 1, 1);
        spec.capture_stdin = true;
        spec.uid = nix::unistd::getuid().as_raw();
        spec.gid = nix::unistd::getgid().as_raw();
        let got = open_input(&spec, &jd, &|| Some(Stop::Cancelled));
        assert!(matches!(got, Err(Abort::Stop(Stop::Cancelled))));
    }
}
