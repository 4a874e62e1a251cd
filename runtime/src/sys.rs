//! The few system calls the sandbox needs that nix does not wrap: `clone3`, the new mount API
//! (`open_tree`, `mount_setattr`, `move_mount`), and the init's last steps before exec.

use std::ffi::{CString, OsStr};
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::ffi::OsStrExt;

/// `clone3` flags not (portably) in libc.
pub(crate) const CLONE_PIDFD: u64 = 0x1000;
pub(crate) const CLONE_INTO_CGROUP: u64 = 0x2_0000_0000;

/// `mount_setattr` flags (linux/mount.h).
pub(crate) const ATTR_RDONLY: u64 = 0x1;
pub(crate) const ATTR_NOSUID: u64 = 0x2;
pub(crate) const ATTR_NODEV: u64 = 0x4;
pub(crate) const ATTR_NOEXEC: u64 = 0x8;
/// The mount's owners are seen through a user namespace.
const ATTR_IDMAP: u64 = 0x10_0000;

#[repr(C)]
#[derive(Default)]
struct CloneArgs {
    flags: u64,
    pidfd: u64,
    child_tid: u64,
    parent_tid: u64,
    exit_signal: u64,
    stack: u64,
    stack_size: u64,
    tls: u64,
    set_tid: u64,
    set_tid_size: u64,
    cgroup: u64,
}

#[repr(C)]
struct MountAttr {
    attr_set: u64,
    attr_clr: u64,
    propagation: u64,
    userns_fd: u64,
}

impl MountAttr {
    /// Sets `attrs`, clears nothing, leaves propagation alone.
    fn set(attrs: u64) -> MountAttr {
        MountAttr {
            attr_set: attrs,
            attr_clr: 0,
            propagation: 0,
            userns_fd: 0,
        }
    }
}

/// What `clone3` made, in the parent.
#[derive(Debug)]
pub(crate) enum Cloned {
    /// In the child (which shares nothing but a copy of memory and descriptors).
    Child,
    /// In the parent: the child's pid and a pidfd for it.
    Parent { pid: i32, pidfd: OwnedFd },
}

/// `clone3` like fork (a copy of this process, on a copy of its stack), with `flags`
/// (namespaces), a pidfd for the child and, given `cgroup`, born inside that cgroup v2
/// directory. The caller must be single-threaded: the child runs on from here.
pub(crate) fn clone(flags: u64, cgroup: Option<BorrowedFd<'_>>) -> std::io::Result<Cloned> {
    let mut pidfd: RawFd = -1;
    let mut args = CloneArgs {
        flags: flags | CLONE_PIDFD,
        pidfd: &mut pidfd as *mut RawFd as u64,
        exit_signal: libc::SIGCHLD as u64,
        ..Default::default()
    };
    if let Some(fd) = cgroup {
        args.flags |= CLONE_INTO_CGROUP;
        args.cgroup = fd.as_raw_fd() as u64;
    }
    // SAFETY: a valid clone_args of the size passed; with no stack given the child continues
    // on a copy of this one, as after fork, which is sound in a single-threaded process.
    let pid = unsafe {
        libc::syscall(
            libc::SYS_clone3,
            &args as *const CloneArgs,
            std::mem::size_of::<CloneArgs>(),
        )
    };
    match pid {
        -1 => Err(std::io::Error::last_os_error()),
        0 => Ok(Cloned::Child),
        pid => Ok(Cloned::Parent {
            pid: pid as i32,
            // SAFETY: the kernel gave us this descriptor.
            pidfd: unsafe { OwnedFd::from_raw_fd(pidfd) },
        }),
    }
}

/// Opens `path` (`O_CLOEXEC` added to `flags`) as a descriptor we own.
pub(crate) fn open_fd(path: &std::path::Path, flags: nix::fcntl::OFlag) -> nix::Result<OwnedFd> {
    let fd = nix::fcntl::open(
        path,
        flags | nix::fcntl::OFlag::O_CLOEXEC,
        nix::sys::stat::Mode::empty(),
    )?;
    // SAFETY: a fresh descriptor we own.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// Opens again, with `flags` (never waiting, never a controlling terminal), the object open
/// at the `O_PATH` descriptor `at`, when it is a regular file; `None` when it is anything
/// else, which is never opened. Through `/proc/self/fd`, the same inode that was checked:
/// nothing swapped in at its path since is reached.
pub(crate) fn reopen_regular(
    at: &OwnedFd,
    flags: nix::fcntl::OFlag,
) -> nix::Result<Option<std::fs::File>> {
    use std::os::fd::AsRawFd;
    let st = nix::sys::stat::fstat(at.as_raw_fd())?;
    if st.st_mode & libc::S_IFMT != libc::S_IFREG {
        return Ok(None);
    }
    Ok(Some(reopen(at, flags)?.into()))
}

/// Opens again, with `flags` (never waiting, never a controlling terminal), the object open
/// at the `O_PATH` descriptor `at`, whatever it is: the caller has checked it. Through
/// `/proc/self/fd`, so it is the same inode, whatever was swapped in at its path since.
pub(crate) fn reopen(at: &OwnedFd, flags: nix::fcntl::OFlag) -> nix::Result<OwnedFd> {
    use std::os::fd::AsRawFd;
    let path = format!("/proc/self/fd/{}", at.as_raw_fd());
    open_fd(
        std::path::Path::new(&path),
        flags | nix::fcntl::OFlag::O_NONBLOCK | nix::fcntl::OFlag::O_NOCTTY,
    )
}

/// Waits up to `ms` milliseconds for `fd` to be readable (a pidfd: its process has ended).
/// False on timeout or when a signal interrupts the wait.
pub(crate) fn readable(fd: &OwnedFd, ms: u16) -> bool {
    use nix::poll::{poll, PollFd, PollFlags, PollTimeout};
    let mut fds = [PollFd::new(fd.as_fd(), PollFlags::POLLIN)];
    matches!(poll(&mut fds, PollTimeout::from(ms)), Ok(n) if n > 0)
}

/// A pidfd for process `pid` (close-on-exec; readable once the process has exited):
/// `pidfd_open`, Linux 5.3 and later.
pub fn pidfd_open(pid: u32) -> std::io::Result<OwnedFd> {
    // SAFETY: pidfd_open takes a pid and flags and returns a new descriptor or -1.
    let fd = check(unsafe { libc::syscall(libc::SYS_pidfd_open, pid as libc::pid_t, 0) })?;
    // SAFETY: a new descriptor that nothing else owns.
    Ok(unsafe { OwnedFd::from_raw_fd(fd as RawFd) })
}

/// Opens process `pid` as a pidfd, for the caller to check it is still the process it means
/// and then signal it through that ([`pidfd_send_signal`]). `Ok(None)` when the process is
/// gone, or when no pidfd is to be had (a kernel before 5.3, a filter on the syscall, no
/// descriptor left): then it has been sent `sig` by pid already, as before pidfds, so that a
/// stop never fails to reach it for want of one.
pub(crate) fn pidfd_or_kill(
    pid: u32,
    sig: nix::sys::signal::Signal,
) -> std::io::Result<Option<OwnedFd>> {
    match pidfd_open(pid) {
        Ok(fd) => Ok(Some(fd)),
        Err(e) if e.raw_os_error() == Some(libc::ESRCH) => Ok(None),
        Err(_) => match nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid as i32), sig) {
            Ok(()) | Err(nix::errno::Errno::ESRCH) => Ok(None),
            Err(e) => Err(e.into()),
        },
    }
}

/// Sends signal `sig` to the process of pidfd `fd`: `pidfd_send_signal`, Linux 5.1 and
/// later. Unlike `kill`, it can never reach another process that took the pid over.
pub fn pidfd_send_signal(fd: &OwnedFd, sig: nix::sys::signal::Signal) -> std::io::Result<()> {
    use std::os::fd::AsRawFd;
    // SAFETY: pidfd_send_signal takes a pidfd, a signal number, a null siginfo (as kill's)
    // and flags 0.
    check(unsafe {
        libc::syscall(
            libc::SYS_pidfd_send_signal,
            fd.as_raw_fd(),
            sig as libc::c_int,
            std::ptr::null::<libc::siginfo_t>(),
            0,
        )
    })
    .map(|_| ())
}

fn cstring(p: &OsStr) -> std::io::Result<CString> {
    CString::new(p.as_bytes())
        .map_err(|_| std::io::Error::new(std::io::ErrorKind::InvalidInput, "path contains NUL"))
}

fn check(rc: libc::c_long) -> std::io::Result<libc::c_long> {
    if rc < 0 {
        Err(std::io::Error::last_os_error())
    } else {
        Ok(rc)
    }
}

/// A detached copy of the mount tree at `path` (relative to `dir`, or the object `dir` is
/// when `path` is empty), with its submounts when `recursive`: `open_tree(OPEN_TREE_CLONE)`.
pub(crate) fn clone_tree(
    dir: Option<BorrowedFd<'_>>,
    path: &OsStr,
    recursive: bool,
) -> std::io::Result<OwnedFd> {
    let c = cstring(path)?;
    let mut flags = (libc::OPEN_TREE_CLONE | libc::OPEN_TREE_CLOEXEC) as libc::c_uint;
    if recursive {
        flags |= libc::AT_RECURSIVE as libc::c_uint;
    }
    if path.is_empty() {
        flags |= libc::AT_EMPTY_PATH as libc::c_uint;
    }
    let dirfd = dir.map_or(libc::AT_FDCWD, |d| d.as_raw_fd());
    // SAFETY: a valid C string; the result is checked.
    let fd = check(unsafe { libc::syscall(libc::SYS_open_tree, dirfd, c.as_ptr(), flags) })?;
    // SAFETY: a fresh descriptor we own.
    Ok(unsafe { OwnedFd::from_raw_fd(fd as RawFd) })
}

fn setattr(
    dirfd: RawFd,
    path: &CString,
    flags: libc::c_int,
    attr: &MountAttr,
) -> std::io::Result<()> {
    // SAFETY: valid descriptor and C string, a mount_attr of the size passed.
    check(unsafe {
        libc::syscall(
            libc::SYS_mount_setattr,
            dirfd,
            path.as_ptr(),
            flags,
            attr as *const MountAttr,
            std::mem::size_of::<MountAttr>(),
        )
    })
    .map(drop)
}

/// Sets `attrs` (`ATTR_*`) on every mount of the detached `tree`. No-op for none.
pub(crate) fn set_attrs(tree: &OwnedFd, attrs: u64) -> std::io::Result<()> {
    if attrs == 0 {
        return Ok(());
    }
    setattr(
        tree.as_raw_fd(),
        &CString::default(),
        libc::AT_EMPTY_PATH | libc::AT_RECURSIVE,
        &MountAttr::set(attrs),
    )
}

/// Sets `attrs` on the mount at `path` and every mount under it.
pub(crate) fn set_attrs_at(path: &OsStr, attrs: u64) -> std::io::Result<()> {
    setattr(
        libc::AT_FDCWD,
        &cstring(path)?,
        libc::AT_RECURSIVE,
        &MountAttr::set(attrs),
    )
}

/// Makes the detached `tree` show its files' owners as mapped through the user namespace
/// open at `userns` (and read-only besides `attrs`).
pub(crate) fn idmap(tree: &OwnedFd, userns: &OwnedFd, attrs: u64) -> std::io::Result<()> {
    let attr = MountAttr {
        userns_fd: userns.as_raw_fd() as u64,
        ..MountAttr::set(ATTR_IDMAP | attrs)
    };
    setattr(
        tree.as_raw_fd(),
        &CString::default(),
        libc::AT_EMPTY_PATH,
        &attr,
    )
}

/// Attaches the detached `tree` on the object open at `target`.
pub(crate) fn move_tree(tree: &OwnedFd, target: &OwnedFd) -> std::io::Result<()> {
    let empty = CString::default();
    // SAFETY: valid descriptors and an empty C string with the EMPTY_PATH flags.
    check(unsafe {
        libc::syscall(
            libc::SYS_move_mount,
            tree.as_raw_fd(),
            empty.as_ptr(),
            target.as_raw_fd(),
            empty.as_ptr(),
            libc::MOVE_MOUNT_F_EMPTY_PATH | libc::MOVE_MOUNT_T_EMPTY_PATH,
        )
    })
    .map(drop)
}

/// Attaches the detached `tree` at `path`.
pub(crate) fn move_tree_to(tree: &OwnedFd, path: &OsStr) -> std::io::Result<()> {
    let (empty, dst) = (CString::default(), cstring(path)?);
    // SAFETY: valid descriptor and C strings.
    check(unsafe {
        libc::syscall(
            libc::SYS_move_mount,
            tree.as_raw_fd(),
            empty.as_ptr(),
            libc::AT_FDCWD,
            dst.as_ptr(),
            libc::MOVE_MOUNT_F_EMPTY_PATH,
        )
    })
    .map(drop)
}

/// Makes `target` a copy of `fd`, inherited across exec (dup2; for `fd == target`, clears
/// close-on-exec instead).
pub(crate) fn dup_to(fd: RawFd, target: RawFd) -> nix::Result<()> {
    if fd == target {
        return nix::fcntl::fcntl(
            fd,
            nix::fcntl::FcntlArg::F_SETFD(nix::fcntl::FdFlag::empty()),
        )
        .map(drop);
    }
    nix::unistd::dup2(fd, target).map(drop)
}

/// Closes every descriptor from `first` up, or with `on_exec` marks them close-on-exec.
pub(crate) fn close_from(first: u32, on_exec: bool) -> std::io::Result<()> {
    let flags = if on_exec {
        libc::CLOSE_RANGE_CLOEXEC
    } else {
        0
    };
    // SAFETY: the caller no longer uses these descriptors (or only until exec). The raw call
    // needs no glibc of 2.34 or later.
    if unsafe { libc::syscall(libc::SYS_close_range, first, u32::MAX, flags) } == 0 {
        return Ok(());
    }
    // Kernels without close_range (before 5.9; its CLOEXEC flag came in 5.11): one by one.
    let fds: Vec<RawFd> = std::fs::read_dir("/proc/self/fd")?
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse().ok())
        .filter(|&fd| fd >= first as RawFd)
        .collect();
    for fd in fds {
        // SAFETY: as above; a number that was the directory listing's own just fails.
        unsafe {
            if on_exec {
                libc::fcntl(fd, libc::F_SETFD, libc::FD_CLOEXEC);
            } else {
                libc::close(fd);
            }
        }
    }
    Ok(())
}

/// Every signal the process ignores back to its default action, and none blocked: what the
/// shim or its ancestors ignore or block is not the job's business (an ignored SIGPIPE, or a
/// real-time signal, would stay ignored across exec; handled ones are reset by exec itself).
/// The raw system call reaches the two real-time signals libc keeps for itself.
pub(crate) fn default_signals() {
    #[repr(C)]
    struct KernelSigaction {
        handler: usize,
        flags: libc::c_ulong,
        restorer: usize,
        mask: u64,
    }
    let dfl = KernelSigaction {
        handler: libc::SIG_DFL,
        flags: 0,
        restorer: 0,
        mask: 0,
    };
    // Bit n-1 of SigIgn is signal n; unreadable, every signal is reset.
    let ignored = proc_self_status("SigIgn")
        .and_then(|v| u64::from_str_radix(&v, 16).ok())
        .unwrap_or(u64::MAX);
    for sig in 1..=libc::SIGRTMAX() {
        if ignored & (1 << (sig - 1)) != 0 && sig != libc::SIGKILL && sig != libc::SIGSTOP {
            // SAFETY: a valid kernel sigaction for the default action; no old action asked.
            unsafe {
                libc::syscall(
                    libc::SYS_rt_sigaction,
                    sig,
                    &dfl as *const KernelSigaction,
                    std::ptr::null_mut::<KernelSigaction>(),
                    std::mem::size_of::<u64>(),
                )
            };
        }
    }
    let _ = nix::sys::signal::sigprocmask(
        nix::sys::signal::SigmaskHow::SIG_SETMASK,
        Some(&nix::sys::signal::SigSet::empty()),
        None,
    );
}

/// A field of `/proc/self/status` (`CapEff`, `Threads`, ...), trimmed.
pub(crate) fn proc_self_status(key: &str) -> Option<String> {
    std::fs::read_to_string("/proc/self/status")
        .ok()?
        .lines()
        .find_map(|l| {
            l.strip_prefix(key)?
                .strip_prefix(':')
                .map(|v| v.trim().to_string())
        })
}

/// One read of `/proc/PID/stat`: process `pid`'s state letter, parent and start time (clock
/// ticks after boot), fields 3, 4 and 22 (the command name before them may hold any byte).
struct Stat {
    state: String,
    parent: u32,
    start: u64,
}

fn stat(pid: u32) -> Option<Stat> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let after_name: Vec<&str> = text.rsplit_once(')')?.1.split_whitespace().collect();
    Some(Stat {
        state: after_name.first()?.to_string(),
        parent: after_name.get(1)?.parse().ok()?,
        start: after_name.get(19)?.parse().ok()?,
    })
}

/// State letter and start time of process `pid` (see [`stat`]).
pub(crate) fn stat_of(pid: u32) -> Option<(String, u64)> {
    stat(pid).map(|s| (s.state, s.start))
}

/// The parent of process `pid` and its start time, from one read of `/proc/PID/stat`.
pub(crate) fn parent_and_start(pid: u32) -> Option<(u32, u64)> {
    stat(pid).map(|s| (s.parent, s.start))
}

pub(crate) fn start_time(pid: u32) -> Option<u64> {
    stat_of(pid).map(|(_, t)| t)
}
