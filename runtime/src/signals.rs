//! Signals for a running task's processes that do not stop it (`wharf cancel --signal`):
//! the agent writes a request into the task's directory and wakes its shim, which sends the
//! signal from outside the sandbox, as it sends a cancel's SIGTERM.
//!
//! The shim makes the request directory ([`JobDir::signal_requests`]) once it supervises a
//! started program, and takes requests from it at each wake of its wait: a task without it
//! (still launching, ended, idle, or run by an older shim that cannot take requests) takes
//! none, and [`request`] says so. The Docker backend's shim passes them to the engine, which
//! reaches the container's program alone (`crate::docker`).
//!
//! ```no_run
//! use wharf_runtime::{signals, JobDir};
//! let dir = JobDir::new("/var/lib/wharf/agent/jobs/7".into());
//! // The agent: SIGUSR1 to every process of the task, as its request number 3.
//! let taken = signals::request(&dir, 3, signals::Request { signal: 10, script_only: false })?;
//! # Ok::<(), std::io::Error>(())
//! ```

use std::path::PathBuf;

use crate::jobdir::JobDir;

/// One signal for a task's processes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Request {
    /// The signal's number.
    pub signal: i32,
    /// Only the program the sandbox runs (a batch script's shell), not its children.
    pub script_only: bool,
}

impl Request {
    /// The signal to send, or `None`, said on the shim's error output, for a number that is
    /// no signal.
    pub(crate) fn to_send(self) -> Option<nix::sys::signal::Signal> {
        let sig = nix::sys::signal::Signal::try_from(self.signal).ok();
        if sig.is_none() {
            eprintln!("wharf shim: {} is not a signal; not sent", self.signal);
        }
        sig
    }

    /// The request file's text: `SIGNAL` or `SIGNAL script`.
    fn text(self) -> String {
        match self.script_only {
            true => format!("{} script", self.signal),
            false => self.signal.to_string(),
        }
    }

    fn parse(text: &str) -> Option<Request> {
        let mut words = text.split_whitespace();
        let signal = words.next()?.parse().ok()?;
        let script_only = match words.next() {
            None => false,
            Some("script") => true,
            Some(_) => return None,
        };
        words.next().is_none().then_some(Request {
            signal,
            script_only,
        })
    }
}

/// Writes request number `seq` for the task of `dir`. `Ok(false)` when the task takes no
/// signals now (see the module doc); the caller then wakes the shim
/// ([`crate::Backend::signals_requested`]). Idempotent for one `seq`.
pub fn request(dir: &JobDir, seq: u64, req: Request) -> std::io::Result<bool> {
    let requests = dir.signal_requests();
    if !requests.is_dir() {
        return Ok(false);
    }
    // Whole or not at all: the shim may look at any moment (its temp name is no number).
    JobDir::replace_private(&requests.join(seq.to_string()), req.text().as_bytes())?;
    Ok(true)
}

/// Makes the request directory: from now on the shim takes requests.
/// Only root may write in it (the agent), whatever the umask; a name already there that is
/// not such a directory (a link) is refused.
pub(crate) fn open(dir: &JobDir) -> std::io::Result<()> {
    use std::os::unix::fs::{DirBuilderExt, MetadataExt, PermissionsExt};
    let path = dir.signal_requests();
    match std::fs::DirBuilder::new().mode(0o700).create(&path) {
        Err(e) if e.kind() != std::io::ErrorKind::AlreadyExists => return Err(e),
        _ => {}
    }
    let meta = std::fs::symlink_metadata(&path)?;
    let mine = meta.uid() == nix::unistd::geteuid().as_raw();
    if !meta.is_dir() || !mine {
        return Err(std::io::Error::other(format!(
            "{} is not a directory of this process's user",
            path.display()
        )));
    }
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o700))
}

/// Removes the request directory (the program has ended or is being stopped): later
/// requests are refused rather than left unread.
pub(crate) fn close(dir: &JobDir) {
    let _ = std::fs::remove_dir_all(dir.signal_requests());
}

/// Takes every request written since the last look, oldest first, removing each; a file
/// that does not read as a request is dropped.
pub(crate) fn take(dir: &JobDir) -> Vec<Request> {
    let Ok(entries) = std::fs::read_dir(dir.signal_requests()) else {
        return vec![];
    };
    let mut found: Vec<(u64, PathBuf)> = entries
        .flatten()
        .filter_map(|e| Some((e.file_name().to_str()?.parse().ok()?, e.path())))
        .collect();
    found.sort();
    found
        .into_iter()
        .filter_map(|(_, path)| {
            let text = std::fs::read_to_string(&path).ok();
            let _ = std::fs::remove_file(&path);
            Request::parse(&text?)
        })
        .collect()
}

/// The newest request number the agent passed on to the task of `dir` (0: none).
pub fn passed_on(dir: &JobDir) -> u64 {
    std::fs::read_to_string(dir.signalled())
        .ok()
        .and_then(|t| t.trim().parse().ok())
        .unwrap_or(0)
}

/// Records `seq` as the newest request number passed on to the task of `dir`.
pub fn record_passed_on(dir: &JobDir, seq: u64) -> std::io::Result<()> {
    JobDir::replace_private(&dir.signalled(), seq.to_string().as_bytes())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn requests_are_taken_once_oldest_first_and_only_while_open() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = JobDir::new(tmp.path().to_path_buf());
        let usr1 = Request {
            signal: 10,
            script_only: false,
        };
        let term = Request {
            signal: 15,
            script_only: true,
        };
        assert!(!request(&dir, 1, usr1).unwrap(), "not open yet");
        open(&dir).unwrap();
        assert!(request(&dir, 12, term).unwrap());
        assert!(request(&dir, 9, usr1).unwrap());
        std::fs::write(dir.signal_requests().join("10"), "nonsense here").unwrap();
        assert_eq!(take(&dir), vec![usr1, term]);
        assert_eq!(take(&dir), vec![]);
        close(&dir);
        assert!(!request(&dir, 13, usr1).unwrap());
    }

    #[test]
    fn what_was_passed_on_reads_back() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = JobDir::new(tmp.path().to_path_buf());
        assert_eq!(passed_on(&dir), 0);
        record_passed_on(&dir, 7).unwrap();
        assert_eq!(passed_on(&dir), 7);
    }
}

#[cfg(test)]
mod open_tests {
    use std::os::unix::fs::PermissionsExt;

    use super::*;

    #[test]
    fn the_request_directory_is_root_s_alone_and_a_link_in_its_place_is_refused() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = JobDir::new(tmp.path().join("a"));
        std::fs::create_dir(dir.path()).unwrap();
        // Only its owner may even read it, whatever the umask (not changed here: it is the
        // whole test process's).
        open(&dir).unwrap();
        let mode = std::fs::metadata(dir.signal_requests())
            .unwrap()
            .permissions()
            .mode();
        assert_eq!(mode & 0o777, 0o700);
        // A link where it goes is not followed (its target stays as it was).
        let other = JobDir::new(tmp.path().join("b"));
        std::fs::create_dir(other.path()).unwrap();
        let target = tmp.path().join("elsewhere");
        std::fs::create_dir(&target).unwrap();
        std::fs::set_permissions(&target, std::fs::Permissions::from_mode(0o777)).unwrap();
        std::os::unix::fs::symlink(&target, other.signal_requests()).unwrap();
        assert!(open(&other).is_err());
        let mode = std::fs::metadata(&target).unwrap().permissions().mode();
        assert_eq!(mode & 0o777, 0o777);
    }
}
