//! A pre-started, single-threaded process that forks shims on request (`wharf shim
//! --spawner`), so that a launch does not wait for the kernel to exec the `wharf` binary and
//! for its start-up: about 2 ms of an 8 ms launch.
//!
//! The agent's [`crate::Launcher`] starts it once and writes one job directory per line to its
//! stdin; it forks, and answers `PID STARTTIME` (or `ERR message`) on stdout. The child is a
//! fresh shim in every way that matters: its own process group, stdin from /dev/null, stdout
//! and stderr to the job's `shim.log`, and no other file descriptor (closed at once, since no
//! exec will close them). The spawner reaps the shims it forked and exits when its stdin
//! closes, that is when the agent goes; shims live on without it.

use std::io::{BufRead, BufReader, Read, Write};
use std::os::fd::{AsFd, AsRawFd, BorrowedFd};
use std::path::Path;
use std::time::{Duration, Instant};

use nix::poll::{poll, PollFd, PollFlags, PollTimeout};
use nix::unistd::{fork, ForkResult, Pid};

/// Serves requests on stdin until it closes. Returns the process's exit status.
pub fn serve() -> i32 {
    // Forking is safe only because this process has one thread; refuse to run otherwise.
    let threads = crate::sys::proc_self_status("Threads").and_then(|v| v.parse::<u32>().ok());
    if threads != Some(1) {
        eprintln!("wharf shim --spawner: must be single-threaded, has {threads:?} threads");
        return 1;
    }
    crate::sandbox::warm_up();
    let mut out = std::io::stdout().lock();
    // SAFETY: fd 0 stays open for the life of the process.
    let stdin = unsafe { BorrowedFd::borrow_raw(0) };
    loop {
        crate::shim::reap_all();
        // Wake up now and then to reap shims even while no launch comes.
        let mut fds = [PollFd::new(stdin, PollFlags::POLLIN)];
        match poll(&mut fds, PollTimeout::from(1000u16)) {
            Ok(0) | Err(nix::errno::Errno::EINTR) => continue,
            Ok(_) => {}
            Err(_) => return 1,
        }
        let Some(dir) = read_line(stdin) else {
            return 0;
        };
        let reply = match spawn(Path::new(&dir)) {
            Ok((pid, started)) => format!("{pid} {started}\n"),
            Err(e) => format!("ERR {}\n", e.replace('\n', " ")),
        };
        if out
            .write_all(reply.as_bytes())
            .and_then(|_| out.flush())
            .is_err()
        {
            return 0;
        }
    }
}

/// One line from `fd`, unbuffered (so that poll sees what is left); `None` at the end.
fn read_line(fd: BorrowedFd<'_>) -> Option<String> {
    let mut line = Vec::new();
    let mut byte = [0u8; 1];
    loop {
        match nix::unistd::read(fd.as_raw_fd(), &mut byte) {
            Ok(0) => return None,
            Ok(_) if byte[0] == b'\n' => return String::from_utf8(line).ok(),
            Ok(_) if line.len() < 4096 => line.push(byte[0]),
            Err(nix::errno::Errno::EINTR) => {}
            Ok(_) | Err(_) => return None,
        }
    }
}

/// Forks a shim for `dir`. Returns its pid and start time.
fn spawn(dir: &Path) -> Result<(u32, u64), String> {
    if !dir.is_absolute() || !dir.is_dir() {
        return Err(format!("{} is not a job directory", dir.display()));
    }
    let log = crate::JobDir::open_private(&crate::JobDir::new(dir.to_path_buf()).log(), false)
        .map_err(|e| format!("creating {}/shim.log: {e}", dir.display()))?;
    let devnull = std::fs::File::open("/dev/null").map_err(|e| format!("/dev/null: {e}"))?;
    // SAFETY: this process is single-threaded (it never starts a thread), so the child may
    // run any code.
    match unsafe { fork() }.map_err(|e| format!("fork: {e}"))? {
        ForkResult::Child => {
            let status = match become_shim(dir, log, devnull) {
                Ok(()) => crate::shim::main(dir),
                Err(why) => {
                    // stderr is the job's shim.log by now, or the agent's log.
                    eprintln!("wharf shim: cannot start: {why}");
                    1
                }
            };
            // SAFETY: leaving the forked child without running the parent's destructors.
            unsafe { libc::_exit(status) }
        }
        ForkResult::Parent { child } => {
            let pid = child.as_raw() as u32;
            let started = crate::sys::start_time(pid).unwrap_or_default();
            Ok((pid, started))
        }
    }
}

/// Turns the forked child into a fresh shim: its own process group, a name of its own, stdin
/// from /dev/null, stdout and stderr to the log, no other descriptor, and a pid file naming it
/// (so that the agent learns of it even if the spawner dies before answering).
fn become_shim(dir: &Path, log: std::fs::File, devnull: std::fs::File) -> Result<(), String> {
    nix::unistd::setpgid(Pid::from_raw(0), Pid::from_raw(0))
        .map_err(|e| format!("setpgid: {e}"))?;
    for (from, to) in [(&devnull, 0), (&log, 1), (&log, 2)] {
        nix::unistd::dup2(from.as_raw_fd(), to).map_err(|e| format!("dup2: {e}"))?;
    }
    drop(log);
    drop(devnull);
    crate::sys::close_from(3, false).map_err(|e| format!("closing descriptors: {e}"))?;
    // `ps` shows the spawner's command line for every shim; the name at least differs.
    let _ = nix::sys::prctl::set_name(c"wharf-shim");
    let me = std::process::id();
    let started = crate::sys::start_time(me).unwrap_or_default();
    crate::JobDir::new(dir.to_path_buf())
        .write_pid(me, started)
        .map_err(|e| e.to_string())
}

/// Why a request to the spawner did not give a shim.
#[derive(Debug)]
pub(crate) enum RequestError {
    /// The spawner answered that it forked nothing (the reason); it is still good.
    Refused(String),
    /// The spawner is gone or garbled; it may or may not have forked.
    Broken(std::io::Error),
}

impl std::fmt::Display for RequestError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            RequestError::Refused(why) => write!(f, "the shim spawner refused: {why}"),
            RequestError::Broken(e) => write!(f, "the shim spawner failed: {e}"),
        }
    }
}

/// How long the agent waits for the spawner's answer. It forks and answers in about a
/// millisecond; one that has not answered in this time is wedged (stopped, or stuck in the
/// kernel), and the agent must not wait on it with every launch of the node behind it.
pub(crate) const ANSWER_WITHIN: Duration = Duration::from_secs(10);

/// Hands a line to the spawner and reads its answer, waiting at most `within` for it.
pub(crate) fn request<R: Read + AsFd>(
    to: &mut impl Write,
    from: &mut BufReader<R>,
    dir: &Path,
    within: Duration,
) -> Result<(u32, u64), RequestError> {
    let text = dir.to_str().filter(|s| !s.contains('\n')).ok_or_else(|| {
        RequestError::Refused(format!("{} is not a plain-text path", dir.display()))
    })?;
    let broken = RequestError::Broken;
    to.write_all(format!("{text}\n").as_bytes())
        .and_then(|_| to.flush())
        .map_err(broken)?;
    if from.buffer().is_empty() && !answers_within(from.get_ref().as_fd(), within) {
        return Err(broken(std::io::Error::new(
            std::io::ErrorKind::TimedOut,
            format!("no answer within {within:?}"),
        )));
    }
    let mut answer = String::new();
    if from.read_line(&mut answer).map_err(broken)? == 0 {
        return Err(broken(std::io::Error::other("it closed its output")));
    }
    if let Some(err) = answer.strip_prefix("ERR ") {
        return Err(RequestError::Refused(err.trim().to_string()));
    }
    let mut fields = answer.split_whitespace();
    let parse = |f: Option<&str>| f.and_then(|v| v.parse::<u64>().ok());
    match (parse(fields.next()), parse(fields.next())) {
        (Some(pid), Some(started)) => Ok((pid as u32, started)),
        _ => Err(broken(std::io::Error::other(format!(
            "it answered {answer:?}"
        )))),
    }
}

/// Whether `fd` has something to read (or is at its end) within `within`. Signals do not cut
/// the wait short.
fn answers_within(fd: BorrowedFd<'_>, within: Duration) -> bool {
    let deadline = Instant::now() + within;
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        let ms = u16::try_from(left.as_millis()).unwrap_or(u16::MAX);
        let mut fds = [PollFd::new(fd, PollFlags::POLLIN)];
        match poll(&mut fds, PollTimeout::from(ms)) {
            Ok(n) if n > 0 => return true,
            Ok(_) if left.is_zero() => return false,
            Ok(_) | Err(nix::errno::Errno::EINTR) => {}
            Err(_) => return true, // let the read say what is wrong
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_spawner_that_does_not_answer_is_given_up_on() {
        let (r, w) = nix::unistd::pipe().unwrap();
        let mut from = BufReader::new(std::fs::File::from(r));
        let mut to = Vec::new();
        let started = Instant::now();
        let got = request(
            &mut to,
            &mut from,
            Path::new("/jobs/1"),
            Duration::from_millis(200),
        );
        assert!(matches!(got, Err(RequestError::Broken(_))), "{got:?}");
        assert!(started.elapsed() < Duration::from_secs(5));
        assert_eq!(to, b"/jobs/1\n");
        // An answer that is there is read.
        nix::unistd::write(&w, b"42 7\n").unwrap();
        let got = request(
            &mut to,
            &mut from,
            Path::new("/jobs/2"),
            Duration::from_millis(200),
        );
        assert_eq!(got.unwrap(), (42, 7));
    }
}
