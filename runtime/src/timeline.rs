//! The shim's launch timeline: when each step of making a job's sandbox ended, as
//! `STEP NANOSECONDS` lines (CLOCK_MONOTONIC, which every namespace shares) appended to the job
//! directory's `timeline` file. It answers "why did this job take long to start?" and gives
//! the launch benchmark its breakdown.

use crate::jobdir::JobDir;

/// The monotonic clock, in nanoseconds.
pub fn monotonic_ns() -> i64 {
    let mut t = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: a valid pointer to a timespec.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut t) };
    t.tv_sec * 1_000_000_000 + t.tv_nsec
}

/// A job's timeline, open for appending (kept open: a launch should not pay for opening the
/// file at every step).
#[derive(Debug)]
pub(crate) struct Timeline(Option<std::fs::File>);

impl Timeline {
    /// Opens (creates) the job's timeline. Best effort: a timeline never fails a job.
    pub(crate) fn open(jd: &JobDir) -> Timeline {
        Timeline(JobDir::open_private(&jd.timeline(), true).ok())
    }

    /// The open file, for a process cloned from this one to add its own steps with
    /// [`mark_fd`] (it is close-on-exec).
    pub(crate) fn raw_fd(&self) -> Option<std::os::fd::RawFd> {
        self.0.as_ref().map(std::os::fd::AsRawFd::as_raw_fd)
    }

    /// Records that `step` has just ended.
    pub(crate) fn mark(&self, step: &str) {
        if let Some(fd) = self.raw_fd() {
            mark_fd(fd, step);
        }
    }
}

/// Records `step` in the timeline open at `fd` (see [`Timeline::raw_fd`]). One write: lines
/// from the shim and its container's init do not mix.
pub(crate) fn mark_fd(fd: std::os::fd::RawFd, step: &str) {
    let line = format!("{step} {}\n", monotonic_ns());
    // SAFETY: the descriptor is open for as long as the caller holds it; a stale one fails.
    let fd = unsafe { std::os::fd::BorrowedFd::borrow_raw(fd) };
    let _ = nix::unistd::write(fd, line.as_bytes());
}

/// The steps recorded so far, in order.
pub fn read(jd: &JobDir) -> Vec<(String, i64)> {
    std::fs::read_to_string(jd.timeline())
        .unwrap_or_default()
        .lines()
        .filter_map(|l| {
            let (step, ns) = l.split_once(' ')?;
            Some((step.to_string(), ns.parse().ok()?))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn steps_read_back_in_order() {
        let tmp = tempfile::tempdir().unwrap();
        let jd = JobDir::new(tmp.path().to_path_buf());
        let t = Timeline::open(&jd);
        t.mark("shim");
        t.mark("root");
        let steps = read(&jd);
        let names: Vec<&str> = steps.iter().map(|(s, _)| s.as_str()).collect();
        assert_eq!(names, ["shim", "root"]);
        assert!(steps[0].1 <= steps[1].1);
    }
}
