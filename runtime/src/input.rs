//! A task's standard input: `/dev/null`, or, for a step's task that takes its caller's input
//! (`ContainerSpec::capture_stdin`), a FIFO in the job directory that the agent writes into.
//!
//! ```text
//!  shim: mkdir DIR/input (root's, 0700) ─▶ mkfifo DIR/input/stdin (the user's, 0600)
//!        ─▶ open it for reading, non-blocking ─▶ wait for DIR/input/ready ─▶ blocking ─▶ task
//!  agent: open DIR/input/stdin for writing (once the shim's reader is there) ─▶ ready
//!        ─▶ writes what the caller sent, as the task reads it ─▶ closes it: the task's EOF
//! ```
//!
//! **Why wait for `ready`**: a FIFO with no writer reads as its end; a task that read before
//! the agent opened it would see its input end at once. **Why the user's FIFO in root's
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

/// The task's standard input. `stop` is asked while the shim waits for the agent.
///
/// Errors: the FIFO cannot be made or opened, or the agent did not open it within
/// [`READY_WAIT`]; a stop asked meanwhile ends the wait as that stop.
pub(crate) fn open_input(
    spec: &ContainerSpec,
    jd: &JobDir,
    stop: &dyn Fn() -> Option<Stop>,
) -> Result<OwnedFd, Abort> {
    if !spec.capture_stdin {
        let null =
            std::fs::File::open("/dev/null").map_err(|e| RuntimeError::io("/dev/null", e))?;
        return Ok(null.into());
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
    Ok(fd)
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
        let null = open_input(&spec, &jd, &|| None).unwrap();
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
            std::fs::write(writer_jd.stdin_ready(), b"").unwrap();
            // The task must not see the end before the agent wrote anything.
            std::thread::sleep(Duration::from_millis(200));
            let mut w = w;
            w.write_all(b"a\nb\n").unwrap();
        });
        let fd = open_input(&spec, &jd, &|| None).unwrap();
        let mut text = String::new();
        std::fs::File::from(fd).read_to_string(&mut text).unwrap();
        agent.join().unwrap();
        assert_eq!(text, "a\nb\n");
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
