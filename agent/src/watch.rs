//! Wakes the agent the moment what it reports may have changed, with no polling.
//!
//! inotify tells it that a job directory appeared or went, that a shim wrote `started` or
//! `outcome.json` (each written whole: `started` closed after writing, the outcome renamed
//! into place), or that an image was published or removed; a pidfd per live shim tells it
//! that a shim died, with or without an outcome. The shims know nothing of this: they write
//! their job directories as before, so a restarted agent watches every directory it finds and
//! misses nothing a shim did while it was away (the report it sends first reads them all).

use std::future::poll_fn;
use std::io;
use std::os::fd::{AsFd, AsRawFd, OwnedFd, RawFd};
use std::path::{Path, PathBuf};
use std::task::{ready, Context, Poll};

use nix::sys::inotify::{AddWatchFlags, InitFlags, InotifyEvent, WatchDescriptor};
use tokio::io::unix::AsyncFd;
use wharf_runtime::JobDir;

/// An inotify instance whose events are awaited on tokio's reactor.
#[derive(Debug)]
pub struct Inotify(AsyncFd<Fd>);

#[derive(Debug)]
struct Fd(nix::sys::inotify::Inotify);

impl AsRawFd for Fd {
    fn as_raw_fd(&self) -> RawFd {
        self.0.as_fd().as_raw_fd()
    }
}

impl AsRawFd for Inotify {
    fn as_raw_fd(&self) -> RawFd {
        self.0.get_ref().as_raw_fd()
    }
}

impl Inotify {
    /// A new instance (non-blocking, close-on-exec). Needs a tokio runtime.
    pub fn new() -> io::Result<Inotify> {
        let raw = nix::sys::inotify::Inotify::init(InitFlags::IN_NONBLOCK | InitFlags::IN_CLOEXEC)?;
        Ok(Inotify(readable(Fd(raw))?))
    }

    /// Watches `path` for the events in `mask`.
    pub fn add(&self, path: &Path, mask: AddWatchFlags) -> io::Result<WatchDescriptor> {
        Ok(self.0.get_ref().0.add_watch(path, mask)?)
    }

    /// The events queued now; waits for at least one.
    pub async fn events(&self) -> io::Result<Vec<InotifyEvent>> {
        poll_fn(|cx| self.poll_events(cx)).await
    }

    fn poll_events(&self, cx: &mut Context<'_>) -> Poll<io::Result<Vec<InotifyEvent>>> {
        loop {
            let mut guard = ready!(self.0.poll_read_ready(cx))?;
            if let Ok(read) = guard.try_io(|fd| Ok(fd.get_ref().0.read_events()?)) {
                return Poll::Ready(read);
            }
        }
    }
}

/// Events on the jobs directory and the image store's: entries made, renamed or removed.
const DIR_EVENTS: AddWatchFlags = AddWatchFlags::IN_CREATE
    .union(AddWatchFlags::IN_DELETE)
    .union(AddWatchFlags::IN_MOVED_TO)
    .union(AddWatchFlags::IN_MOVED_FROM)
    .union(AddWatchFlags::IN_ONLYDIR);

/// Events in a job directory: a file written whole, or renamed into place.
const JOB_EVENTS: AddWatchFlags = AddWatchFlags::IN_CLOSE_WRITE
    .union(AddWatchFlags::IN_MOVED_TO)
    .union(AddWatchFlags::IN_ONLYDIR);

/// What the agent watches: its jobs directory, each job directory in it, and the image
/// store's directory of images (for the OCI backend; the Docker engine's images are listed at
/// each poll).
#[derive(Debug)]
pub struct Changes {
    inotify: Inotify,
    jobs: (PathBuf, WatchDescriptor),
    images: Option<WatchDescriptor>,
    /// The names, in a job directory, of the files whose writing changes the job's report.
    reported: [std::ffi::OsString; 2],
}

impl Changes {
    /// Watches `jobs` and every directory in it, and `images` when given.
    pub fn new(jobs: &Path, images: Option<&Path>) -> io::Result<Changes> {
        let inotify = Inotify::new()?;
        let jobs_wd = inotify.add(jobs, DIR_EVENTS)?;
        let images = images.map(|i| inotify.add(i, DIR_EVENTS)).transpose()?;
        let names = JobDir::new(PathBuf::new());
        let name = |p: PathBuf| p.file_name().map(|n| n.to_owned()).unwrap_or_default();
        let changes = Changes {
            inotify,
            jobs: (jobs.to_path_buf(), jobs_wd),
            images,
            reported: [name(names.started()), name(names.outcome())],
        };
        for entry in std::fs::read_dir(jobs)?.flatten() {
            changes.watch_job(&entry.path());
        }
        Ok(changes)
    }

    fn watch_job(&self, dir: &Path) {
        // A directory removed meanwhile needs no watch; anything else is reported at the
        // next poll all the same, only later.
        match self.inotify.add(dir, JOB_EVENTS) {
            Err(e) if e.raw_os_error() == Some(libc::ENOENT) => {}
            Err(e) => {
                tracing::warn!(dir = %dir.display(), error = %e, "cannot watch job directory; its changes wait for the next poll")
            }
            Ok(_) => {}
        }
    }

    /// Waits until the report may have changed: a job directory came or went, a shim wrote
    /// its start or outcome, an image came or went, or one of the shims `shims` (pids) ended.
    /// A new job directory is watched from here on.
    pub async fn next(&self, shims: &[u32]) {
        let mut pidfds = Vec::new();
        for &pid in shims {
            match pidfd(pid) {
                Ok(fd) => pidfds.push(fd),
                // Gone already.
                Err(e) if e.raw_os_error() == Some(libc::ESRCH) => return,
                // Without pidfds (before Linux 5.3), a shim that dies without an outcome is
                // seen at the next poll.
                Err(e) => tracing::debug!(pid, error = %e, "cannot watch shim"),
            }
        }
        loop {
            let woke = poll_fn(|cx| {
                if pidfds.iter().any(|fd| fd.poll_read_ready(cx).is_ready()) {
                    return Poll::Ready(None);
                }
                self.inotify.poll_events(cx).map(Some)
            })
            .await;
            match woke {
                None => return,
                Some(Ok(events)) => {
                    if self.any_reported(&events) {
                        return;
                    }
                }
                Some(Err(e)) => {
                    // Not expected of inotify; the next poll still carries the report.
                    tracing::error!(error = %e, "reading inotify events failed");
                    std::future::pending::<()>().await;
                }
            }
        }
    }

    /// Whether `events` may change the report; watches the job directories they make.
    fn any_reported(&self, events: &[InotifyEvent]) -> bool {
        let mut any = false;
        for ev in events {
            let made = AddWatchFlags::IN_CREATE | AddWatchFlags::IN_MOVED_TO;
            any |= if ev.mask.contains(AddWatchFlags::IN_Q_OVERFLOW) {
                // Events were lost: look at everything again.
                true
            } else if ev.wd == self.jobs.1 {
                // A job's ready mark is a file: only task directories are watched, a job's
                // and a step's (whose end is reported as soon as a job's is).
                let task = |n: &std::ffi::OsString| {
                    n.to_str().is_some_and(|n| {
                        crate::launch::parse_task_dir_name(n).is_some()
                            || crate::step::parse_dir_name(n).is_some()
                    })
                };
                if let Some(name) = ev
                    .name
                    .as_ref()
                    .filter(|n| ev.mask.intersects(made) && task(n))
                {
                    self.watch_job(&self.jobs.0.join(name));
                }
                true
            } else if Some(ev.wd) == self.images {
                true
            } else {
                // `started` counts when closed after writing; the outcome when renamed into
                // place (its file is closed only after that, once synced: that close is
                // the same change again).
                let [started, outcome] = &self.reported;
                ev.name.as_ref().is_some_and(|n| {
                    (n == started && ev.mask.contains(AddWatchFlags::IN_CLOSE_WRITE))
                        || (n == outcome && ev.mask.contains(AddWatchFlags::IN_MOVED_TO))
                })
            };
        }
        any
    }
}

/// A pidfd for process `pid` on tokio's reactor (readable once it has exited).
fn pidfd(pid: u32) -> io::Result<AsyncFd<OwnedFd>> {
    readable(wharf_runtime::pidfd_open(pid)?)
}

/// `fd` on tokio's reactor, for reading.
fn readable<T: AsRawFd>(fd: T) -> io::Result<AsyncFd<T>> {
    // SAFETY: `fd` owns its descriptor, which stays open, and the same, until the AsyncFd
    // that owns `fd` is dropped.
    Ok(unsafe { AsyncFd::register_with_interest(fd, tokio::io::Interest::READABLE) }?)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    async fn woken_within(changes: &Changes, shims: &[u32], ms: u64) -> bool {
        tokio::time::timeout(Duration::from_millis(ms), changes.next(shims))
            .await
            .is_ok()
    }

    async fn woken(changes: &Changes, shims: &[u32]) -> bool {
        tokio::time::timeout(Duration::from_secs(5), changes.next(shims))
            .await
            .is_ok()
    }

    #[tokio::test]
    async fn a_new_job_and_its_start_and_outcome_wake_the_agent() {
        let tmp = tempfile::tempdir().unwrap();
        let jobs = tmp.path().join("jobs");
        std::fs::create_dir(&jobs).unwrap();
        let changes = Changes::new(&jobs, None).unwrap();
        let job = JobDir::new(jobs.join("7"));
        std::fs::create_dir(job.path()).unwrap();
        assert!(woken(&changes, &[]).await, "a new job directory");
        // A shim's log and timeline change nothing in the report.
        JobDir::write_private(&job.log(), b"log").unwrap();
        JobDir::write_private(&job.started(), b"1").unwrap();
        assert!(woken(&changes, &[]).await, "the start");
        JobDir::write_atomic(&job.outcome(), &wharf_runtime::Outcome::default()).unwrap();
        assert!(woken(&changes, &[]).await, "the outcome");
        JobDir::write_private(&job.log(), b"more").unwrap();
        assert!(!woken_within(&changes, &[], 300).await, "the log alone");
    }

    #[tokio::test]
    async fn a_step_tasks_start_and_outcome_wake_the_agent() {
        let tmp = tempfile::tempdir().unwrap();
        let jobs = tmp.path().join("jobs");
        std::fs::create_dir(&jobs).unwrap();
        let changes = Changes::new(&jobs, None).unwrap();
        let task = JobDir::new(jobs.join(crate::step::dir_name(7, 2, 1)));
        std::fs::create_dir(task.path()).unwrap();
        assert!(woken(&changes, &[]).await, "a new step task directory");
        JobDir::write_private(&task.started(), b"1").unwrap();
        assert!(woken(&changes, &[]).await, "the start");
        JobDir::write_atomic(&task.outcome(), &wharf_runtime::Outcome::default()).unwrap();
        assert!(woken(&changes, &[]).await, "the outcome");
    }

    #[tokio::test]
    async fn a_shim_that_dies_wakes_the_agent() {
        let tmp = tempfile::tempdir().unwrap();
        let changes = Changes::new(tmp.path(), None).unwrap();
        let mut child = std::process::Command::new("sleep")
            .arg("0.2")
            .spawn()
            .unwrap();
        assert!(woken(&changes, &[child.id()]).await);
        child.wait().unwrap();
    }
}
