//! Wharf's own container create: one `clone3` into prepared namespaces and a prepared cgroup,
//! and a short, fixed sequence of system calls in the child before it execs the job.
//!
//! ```text
//!  shim (real root)                                init (new user, mount, pid, ipc, uts ns)
//!  ────────────────                                ────────────────────────────────────────
//!  JobCgroup::create (v2: limits, device filter)
//!  spawn: clone3 ─────────────────────────────────▶ born in the cgroup (v2), waits for go
//!  map_ids (uid_map, gid_map)
//!  in_mount_ns: prepare the root (overlay;
//!    idmapped via the init's user ns when asked)
//!  build ─────────────────────────────────────────▶ mounts, pivot_root, stdio
//!  (v1: make the cgroup, move the init in,            │ at the same time
//!   while the init mounts)                            ▼
//!  start ─────────────────────────────────────────▶ drop everything, take the job's ids, exec
//!         ◀──── report pipe: EOF at exec, or why ──
//!  wait (pidfd), time limit, cancel; remove cgroup
//! ```
//!
//! **Why not libcontainer** (the first design named it; docs/architecture.md records why not): its create forks twice, re-reads
//! `/proc/self/mountinfo` for every v1 controller, writes and re-reads state files, and
//! cannot write a multi-line id map itself, so the shim already made the user namespace and
//! the root; what was left for it cost most of a launch (3.8 ms of 6.2 on a cgroup v2 node,
//! about 6 of 9 on a v1 one). This is the same sandbox, built with the calls that make it.
//!
//! Lifecycle of an [`Init`]: spawned (waiting) ─build─▶ built (waiting) ─start─▶ running
//! (exec'd) ─▶ exited (the shim reaps it); spawned or built ─abort─▶ killed. A dropped,
//! unstarted `Init` is aborted.

pub(crate) mod cgroup_setup;
#[cfg(feature = "v2-devices")]
mod devices;
#[cfg(not(feature = "v2-devices"))]
#[path = "devices_stub.rs"]
mod devices;
mod init;
pub(crate) mod limits;
pub(crate) mod loopdev;
pub(crate) mod plan;
pub(crate) mod rootfs;
#[cfg(feature = "seccomp")]
pub(crate) mod seccomp;
#[cfg(not(feature = "seccomp"))]
#[path = "seccomp_stub.rs"]
pub(crate) mod seccomp;
pub(crate) mod userns;

use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::path::PathBuf;

use nix::fcntl::OFlag;
use nix::sched::CloneFlags;
use nix::sys::signal::{kill, Signal};
use nix::sys::wait::waitpid;
use nix::unistd::{pipe2, Pid};

pub(crate) use cgroup_setup::JobCgroup;
pub(crate) use init::InitIo;
pub(crate) use plan::Plan;

use wharf_api::fault::FaultCode;
use wharf_api::text::MAX_MESSAGE;

use crate::error::{ErrorKind, RuntimeError};
use crate::sys::{self, Cloned};

/// The namespaces the init is born in. Its mount namespace is a copy of the host's, owned by
/// its user namespace: the host's mounts in it are locked, and their propagation is one-way
/// (shared ones become slaves), so nothing mounted in it reaches the host.
const NAMESPACES: u64 = (libc::CLONE_NEWUSER
    | libc::CLONE_NEWNS
    | libc::CLONE_NEWPID
    | libc::CLONE_NEWIPC
    | libc::CLONE_NEWUTS) as u64;

/// Prepares, in the process that forks the shims, what every launch would otherwise do once
/// for itself (the cgroup v2 device filter's kernel probe).
pub(crate) fn warm_up() {
    if crate::cgroup_usage::is_v2() {
        devices::warm_up();
    }
}

/// What the shim tells the init, in this order: build the sandbox; then take the job's
/// identity and exec it.
pub(crate) const BUILD: u8 = b'b';
pub(crate) const START: u8 = b's';

/// What the report pipe said.
enum Report {
    /// EOF alone: the init exec'd the job.
    Exec,
    /// The init's reason for not doing so.
    Failed(String),
    /// The shim stopped waiting (a cancel).
    GaveUp,
}

/// The container's init process, seen from the shim.
#[derive(Debug)]
pub(crate) struct Init {
    pid: Pid,
    pidfd: OwnedFd,
    /// Held until start: the init reads [`BUILD`], then [`START`]; closing it early ends it.
    go: Option<OwnedFd>,
    /// [`BUILD`] was sent.
    built: bool,
    /// EOF when the init has exec'd the job; its reason when it could not.
    report: OwnedFd,
    /// The signal that killed the job's program, one byte, written by the init as it exits
    /// (see [`Init::program_signal`]).
    status: OwnedFd,
}

/// Clones the init for `plan` into its namespaces (and, given a cgroup v2 `cgroup`, into it).
/// It waits for [`Init::build`]. Must be called from a single-threaded process.
pub(crate) fn spawn(
    plan: &Plan,
    io: InitIo,
    cgroup: Option<&JobCgroup>,
) -> Result<Init, RuntimeError> {
    let (go_r, go_w) = pipe2(OFlag::O_CLOEXEC).map_err(|e| RuntimeError::sys("pipe", e))?;
    let (report_r, report_w) = pipe2(OFlag::O_CLOEXEC).map_err(|e| RuntimeError::sys("pipe", e))?;
    let (status_r, status_w) =
        pipe2(OFlag::O_CLOEXEC | OFlag::O_NONBLOCK).map_err(|e| RuntimeError::sys("pipe", e))?;
    let cloned = sys::clone(
        NAMESPACES,
        cgroup.and_then(JobCgroup::clone_target).map(|fd| fd.as_fd()),
    ).map_err(|e| {
        RuntimeError::new(
            ErrorKind::Unavailable,
            format!("creating the container's namespaces (clone3): {e} (are user namespaces enabled: user.max_user_namespaces?)"),
        )
        .with_code(FaultCode::Namespaces)
    })?;
    match cloned {
        Cloned::Child => {
            drop(go_w);
            drop(report_r);
            drop(status_r);
            init::run(plan, &io, go_r, report_w, status_w)
        }
        Cloned::Parent { pid, pidfd } => Ok(Init {
            pid: Pid::from_raw(pid),
            pidfd,
            go: Some(go_w),
            built: false,
            report: report_r,
            status: status_r,
        }),
    }
}

impl Init {
    /// The init's pid (in the shim's pid namespace).
    pub(crate) fn pid(&self) -> Pid {
        self.pid
    }

    /// Whether the init ends within `ms` milliseconds (it is then left to reap). A signal
    /// to the shim ends the wait early.
    pub(crate) fn exits_within(&self, ms: u16) -> bool {
        sys::readable(&self.pidfd, ms)
    }

    /// The signal that killed the job's program, once the init (which runs it as its child,
    /// see `init::reap`) has exited: the init, pid 1 of the job's pid namespace, cannot die of
    /// a signal sent from inside it, so it exits 128 + the signal and says which here. `None`
    /// when the program exited, or the init itself was killed (its own wait status says so).
    pub(crate) fn program_signal(&self) -> Option<i32> {
        let mut byte = [0u8; 1];
        match nix::unistd::read(self.status.as_raw_fd(), &mut byte) {
            Ok(1) if byte[0] > 0 => Some(i32::from(byte[0])),
            _ => None,
        }
    }

    /// The init's user namespace, for idmapped mounts.
    pub(crate) fn userns_path(&self) -> PathBuf {
        PathBuf::from(format!("/proc/{}/ns/user", self.pid))
    }

    /// Runs `f` in the init's mount namespace, then returns to the shim's own: what `f` mounts
    /// (the job's root) is the init's, made by real root (so not locked: pivot_root takes it),
    /// and goes when the init's namespace does. Must be called from a single-threaded process.
    pub(crate) fn in_mount_ns<T>(
        &self,
        f: impl FnOnce() -> Result<T, RuntimeError>,
    ) -> Result<T, RuntimeError> {
        let open = |p: &str| {
            std::fs::File::open(p).map_err(|e| RuntimeError::io(format!("opening {p}"), e))
        };
        let own = open("/proc/self/ns/mnt")?;
        let theirs = open(&format!("/proc/{}/ns/mnt", self.pid))?;
        nix::sched::setns(&theirs, CloneFlags::CLONE_NEWNS)
            .map_err(|e| RuntimeError::sys("entering the container's mount namespace", e))?;
        let result = f();
        nix::sched::setns(&own, CloneFlags::CLONE_NEWNS)
            .map_err(|e| RuntimeError::sys("leaving the container's mount namespace", e))?;
        result
    }

    /// Writes the init's id maps (from outside, as real root: any number of lines).
    pub(crate) fn map_ids(&self, uid_map: &str, gid_map: &str) -> Result<(), RuntimeError> {
        let proc = PathBuf::from(format!("/proc/{}", self.pid));
        std::fs::write(proc.join("uid_map"), uid_map).map_err(|e| {
            RuntimeError::io(format!("writing uid_map {uid_map:?}"), e)
                .with_code(FaultCode::Namespaces)
        })?;
        std::fs::write(proc.join("gid_map"), gid_map).map_err(|e| {
            RuntimeError::io(format!("writing gid_map {gid_map:?}"), e)
                .with_code(FaultCode::Namespaces)
        })
    }

    /// Lets the init build the sandbox (mounts, pivot_root); it then waits for
    /// [`Init::start`] before it takes the job's identity. The shim may meanwhile put it in its
    /// cgroup: nothing of the job's has run yet.
    pub(crate) fn build(&mut self) -> Result<(), RuntimeError> {
        self.signal(BUILD)
    }

    /// Lets the init (built or not) take the job's identity and exec the job. Returns `true`
    /// once it has exec'd; `false` when `give_up` (asked while waiting) said to stop first,
    /// after killing and reaping it; or why it could not (it has then exited and been reaped).
    pub(crate) fn start(&mut self, give_up: impl Fn() -> bool) -> Result<bool, RuntimeError> {
        let sent = if self.built { Ok(()) } else { self.build() };
        let sent = sent.and_then(|()| self.signal(START));
        // From here the init reads no more: closing the pipe changes nothing for it.
        self.go = None;
        // Whatever the write did, the report says what the init did.
        match self.read_report(&give_up)? {
            Report::Exec => match sent {
                Ok(()) => Ok(true),
                Err(e) => {
                    // It could not be told to start: it is gone, with nothing to say.
                    let _ = waitpid(self.pid, None);
                    Err(e)
                }
            },
            Report::Failed(why) => {
                let _ = waitpid(self.pid, None);
                Err(init_failed(&why))
            }
            Report::GaveUp => {
                let _ = kill(self.pid, Signal::SIGKILL);
                let _ = waitpid(self.pid, None);
                Ok(false)
            }
        }
    }

    /// `e`, or the init's own reason when it has already failed (it may have, while the shim
    /// was busy with its cgroup).
    pub(crate) fn explain(&mut self, e: RuntimeError) -> RuntimeError {
        if self.exits_within(0) {
            if let Ok(Report::Failed(why)) = self.read_report(&|| false) {
                return init_failed(&why);
            }
        }
        e
    }

    /// Reads the report pipe to its end: EOF alone at exec, the reason if the init failed.
    /// Checks `give_up` every 200 ms and whenever a signal interrupts the wait. Keeps at most
    /// [`MAX_MESSAGE`] bytes of a reason (and drains the rest, so that the init is not left
    /// blocked on a full pipe).
    fn read_report(&mut self, give_up: &dyn Fn() -> bool) -> Result<Report, RuntimeError> {
        let mut why = Vec::new();
        let mut dropped = 0usize;
        let mut buf = [0u8; 512];
        loop {
            if !sys::readable(&self.report, 200) {
                if give_up() {
                    return Ok(Report::GaveUp);
                }
                continue;
            }
            match nix::unistd::read(self.report.as_raw_fd(), &mut buf) {
                Ok(0) => break,
                Ok(n) => {
                    let keep = n.min(MAX_MESSAGE - why.len());
                    why.extend_from_slice(&buf[..keep]);
                    dropped += n - keep;
                }
                Err(nix::Error::EINTR | nix::Error::EAGAIN) => continue,
                Err(e) => return Err(RuntimeError::sys("waiting for the container to start", e)),
            }
        }
        Ok(if why.is_empty() {
            Report::Exec
        } else {
            let total = why.len() + dropped;
            let mut why = String::from_utf8_lossy(&why).into_owned();
            if dropped > 0 {
                let note = format!("... [cut from {total} bytes]");
                let mut end = MAX_MESSAGE.saturating_sub(note.len()).min(why.len());
                while !why.is_char_boundary(end) {
                    end -= 1;
                }
                why.truncate(end);
                why.push_str(&note);
            }
            Report::Failed(why)
        })
    }

    fn signal(&mut self, byte: u8) -> Result<(), RuntimeError> {
        let Some(go) = &self.go else {
            return Err(RuntimeError::new(
                ErrorKind::InvalidInput,
                "container already started",
            ));
        };
        nix::unistd::write(go, &[byte])
            .map_err(|e| RuntimeError::sys("starting the container", e))?;
        self.built |= byte == BUILD;
        Ok(())
    }

    /// Ends an init that has not started (it has run nothing of the job's) and reaps it.
    /// Idempotent.
    pub(crate) fn abort(&mut self) {
        if self.go.take().is_some() {
            let _ = kill(self.pid, Signal::SIGKILL);
            let _ = waitpid(self.pid, None);
        }
    }
}

impl Drop for Init {
    fn drop(&mut self) {
        self.abort();
    }
}

/// The init's reason as an error: the fault code it put first, its words after.
fn init_failed(why: &str) -> RuntimeError {
    let (code, words) = init::split_code(why);
    let e = RuntimeError::new(
        ErrorKind::Unavailable,
        format!("starting the container: {words}"),
    );
    match code {
        // A full disk is the node's whatever the step.
        Some(FaultCode::Other) | None if crate::error::is_disk_full(words) => {
            e.with_code(FaultCode::DiskFull)
        }
        Some(code) => e.with_code(code),
        None => e,
    }
}

#[cfg(test)]
mod fault_tests {
    use super::*;

    #[test]
    fn the_inits_reason_carries_its_code_and_a_full_disk_is_the_nodes() {
        let sep = init::CODE_END;
        let e = init_failed(&format!("command{sep}command not found in the image: x"));
        assert_eq!(e.code, Some(FaultCode::Command));
        assert_eq!(
            e.message,
            "starting the container: command not found in the image: x"
        );
        let e = init_failed(&format!("sandbox{sep}pivot_root: EINVAL"));
        assert_eq!(e.fault().kind, wharf_api::fault::FaultKind::Node);
        let e = init_failed(&format!(
            "other{sep}mount point /x: No space left on device"
        ));
        assert_eq!(e.code, Some(FaultCode::DiskFull));
        // No code (an init of another version): the words whole, the job's fault.
        let e = init_failed("something");
        assert_eq!((e.code, e.fault().code), (None, FaultCode::Other));
        // A code nobody knows is not taken for one.
        let e = init_failed(&format!("cosmic{sep}ray"));
        assert_eq!(e.code, None);
        assert!(e.message.ends_with(&format!("cosmic{sep}ray")));
    }
}
