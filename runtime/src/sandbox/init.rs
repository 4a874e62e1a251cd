//! The container's init, from its clone to the exec of the job's program.
//!
//! It is born (see [`super::spawn`]) in new user, mount, pid, ipc and uts namespaces, inside
//! the job's cgroup on v2. It waits for the shim's BUILD (ids mapped, root prepared in its
//! mount namespace), then, as root of its own user namespace only:
//!
//! ```text
//!  proc, /dev (tmpfs, devpts, shm, standard and job devices), /sys (ro),
//!  /tmp, shared paths ─▶ masked and read-only paths ─▶ pivot_root ─▶ hostname ─▶ stdio
//!  ─▶ wait for START (in the job's cgroup by then) ─▶ drop every capability (bounding set
//!  too) ─▶ user, group, groups ─▶ no_new_privs ─▶ seccomp ─▶ working directory ─▶
//!  default signals ─▶ exec
//! ```
//!
//! Every mount target is resolved inside the root (openat2 `RESOLVE_IN_ROOT`) and mounted
//! through its descriptor, so a hostile image's symlinks cannot aim a mount at the host.
//! A failure is written to the report pipe and the init exits 127; a successful exec closes
//! the pipe (it is close-on-exec), which is how the shim learns the job has started.
//!
//! It runs in a fork of a single-threaded process, so it may allocate; it never returns.

use std::ffi::{CString, OsStr};
use std::os::fd::{AsFd, AsRawFd, OwnedFd};

use nix::fcntl::OFlag;
use nix::mount::{mount, umount2, MntFlags, MsFlags};
use nix::sys::stat::SFlag;
use nix::unistd::{Gid, Uid};

use super::plan::{
    reserved, Mount, Plan, Source, Target, DEV_SYMLINKS, MASKED_PATHS, READONLY_PATHS,
};
use crate::as_user::BindTree;
use crate::sandbox::rootfs::{mkdir_in_root, open_in_root, touch_in_root};
use crate::sys::{self, ATTR_NODEV, ATTR_NOEXEC, ATTR_NOSUID, ATTR_RDONLY};
use wharf_api::fault::FaultCode;

/// The descriptors the init is given.
#[derive(Debug)]
pub(crate) struct InitIo {
    /// Becomes the job's stdin, stdout and stderr.
    pub stdin: OwnedFd,
    pub stdout: OwnedFd,
    pub stderr: OwnedFd,
    /// The job's timeline, to record when the sandbox was built.
    pub timeline: Option<std::os::fd::RawFd>,
    /// The mount trees of the user's binds, opened by the shim as the user.
    pub trees: Vec<BindTree>,
}

/// What went wrong, for the report pipe.
type Failed = String;

fn fail(what: impl std::fmt::Display, e: impl std::fmt::Display) -> Failed {
    format!("{what}: {e}")
}

/// Separates a reason's fault code from its words on the report pipe.
pub(super) const CODE_END: char = '\u{1f}';

/// `why`, classified as `code` unless a step inside classified it already.
fn coded(code: FaultCode, why: Failed) -> Failed {
    if split_code(&why).0.is_some() {
        return why;
    }
    format!("{code}{CODE_END}{why}")
}

/// A failed step of the node's own part of the sandbox.
fn node(why: Failed) -> Failed {
    coded(FaultCode::Sandbox, why)
}

/// A reason's fault code (when it has one) and its words.
pub(super) fn split_code(why: &str) -> (Option<FaultCode>, &str) {
    match why.split_once(CODE_END) {
        Some((code, rest)) => match FaultCode::parse(code) {
            Some(code) => (Some(code), rest),
            None => (None, why),
        },
        None => (None, why),
    }
}

/// An idle task that holds its node: the program's place, running nothing until a signal
/// ends it (the shim's SIGTERM at the job's stop, or its SIGKILL). What an exec would do
/// here is done by hand: every descriptor closed (the report pipe's close is what tells the
/// shim the program started) and, since the shim's handlers came with the fork, every signal
/// back to its default and none blocked.
fn hold() -> ! {
    let _ = sys::close_from(0, false);
    for sig in 1..=64 {
        if sig != libc::SIGKILL && sig != libc::SIGSTOP {
            // SAFETY: sets a disposition to its default; no handler of this process runs.
            unsafe { libc::signal(sig, libc::SIG_DFL) };
        }
    }
    let _ = nix::sys::signal::sigprocmask(
        nix::sys::signal::SigmaskHow::SIG_SETMASK,
        Some(&nix::sys::signal::SigSet::empty()),
        None,
    );
    loop {
        // SAFETY: pause has no arguments and only returns after a caught signal (none is).
        unsafe { libc::pause() };
    }
}

/// The init's whole life. Never returns: it forks the job's program, which execs it or exits
/// 127 with the reason written to `report`, and reaps until the program ends (see [`reap`]),
/// saying on `status` which signal killed it, if one did.
pub(super) fn run(plan: &Plan, io: &InitIo, go: OwnedFd, report: OwnedFd, status: OwnedFd) -> ! {
    // A panic must not unwind through the shim's frames copied into this process: it becomes
    // a reason like any other.
    let why =
        std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| match setup(plan, io, go) {
            // SAFETY: this process is single-threaded (a fork of the single-threaded shim).
            Ok(()) => match unsafe { nix::unistd::fork() } {
                Ok(nix::unistd::ForkResult::Child) => match nix::unistd::setsid() {
                    // The program leads a session (and process group) of its own, as a batch
                    // job's script does: `kill -- -$$` reaches all of it and not the init.
                    Ok(_) if plan.idle && plan.hold => hold(),
                    // An idle task ends here, its sandbox made, as `exit 0` would end it.
                    // SAFETY: _exit in the forked child, which holds no state to unwind.
                    Ok(_) if plan.idle => unsafe { libc::_exit(0) },
                    Ok(_) => coded(FaultCode::Command, exec(plan)),
                    Err(e) => node(fail("setsid", e)),
                },
                // The program holds the report pipe, which closes at its exec; `reap` closes
                // this copy.
                Ok(nix::unistd::ForkResult::Parent { child }) => reap(child, status),
                // Out of processes (the user's RLIMIT_NPROC, taken with its ids): the job's.
                Err(e) => coded(
                    FaultCode::Command,
                    fail("starting the job's program (fork)", e),
                ),
            },
            Err(why) => why,
        }))
        .unwrap_or_else(|_| "internal error while building the sandbox (a panic)".into());
    // The shim reads at most MAX_MESSAGE bytes of it; a longer reason would be cut there.
    // The code goes first, untouched by the bound; a reason nobody classified is the job's.
    let (code, words) = split_code(&why);
    let code = code.unwrap_or(FaultCode::Other);
    let words = wharf_api::text::bounded(words, wharf_api::text::MAX_MESSAGE - 32);
    let why = format!(
        "{code}{CODE_END}{}",
        wharf_api::text::bound_message(words.into_owned())
    );
    let _ = nix::unistd::write(&report, why.as_bytes());
    // SAFETY: leaving the cloned child without running the parent's destructors.
    unsafe { libc::_exit(127) }
}

fn setup(plan: &Plan, io: &InitIo, go: OwnedFd) -> Result<(), Failed> {
    // Until it drops its ids, a shim that dies takes its init along.
    let _ = nix::sys::prctl::set_pdeathsig(nix::sys::signal::Signal::SIGKILL);
    // Nobody may ptrace it (and take the shim's descriptors it still holds) before the exec,
    // which makes it dumpable again, whatever fs.suid_dumpable says.
    nix::sys::prctl::set_dumpable(false).map_err(|e| node(fail("PR_SET_DUMPABLE", e)))?;
    wait_for(&go, super::BUILD);
    // A session of its own, as a batch job's leader: no controlling terminal, and nothing
    // sent to the shim's process group reaches it.
    nix::unistd::setsid().map_err(|e| node(fail("setsid", e)))?;
    // Root of the user namespace (an unprivileged id outside), so that what it makes in its
    // own filesystems has a mapped owner.
    nix::unistd::setresgid(Gid::from_raw(0), Gid::from_raw(0), Gid::from_raw(0))
        .map_err(|e| node(fail("becoming root of the user namespace (setresgid)", e)))?;
    nix::unistd::setgroups(&[]).map_err(|e| node(fail("clearing groups", e)))?;
    nix::unistd::setresuid(Uid::from_raw(0), Uid::from_raw(0), Uid::from_raw(0))
        .map_err(|e| node(fail("becoming root of the user namespace (setresuid)", e)))?;
    let root = sys::open_fd(&plan.root, OFlag::O_PATH | OFlag::O_DIRECTORY)
        .map_err(|e| node(fail(plan.root.display(), e)))?;
    for m in &plan.mounts {
        mount_one(&root, m, &io.trees)?;
    }
    dev_symlinks(&root).map_err(node)?;
    for path in MASKED_PATHS {
        mask(&root, path).map_err(node)?;
    }
    for path in READONLY_PATHS {
        read_only(&root, path).map_err(node)?;
    }
    pivot(&root).map_err(node)?;
    nix::unistd::sethostname(&plan.hostname).map_err(|e| node(fail("setting the hostname", e)))?;
    for (fd, target) in [(&io.stdin, 0), (&io.stdout, 1), (&io.stderr, 2)] {
        sys::dup_to(fd.as_raw_fd(), target).map_err(|e| node(fail("setting up stdio", e)))?;
    }
    if let Some(fd) = io.timeline {
        crate::timeline::mark_fd(fd, "built");
    }
    // The shim has put this process in the job's cgroup by now, or does so before it says go.
    wait_for(&go, super::START);
    drop(go);
    become_the_user(plan).map_err(node)?;
    crate::sandbox::seccomp::load().map_err(|e| node(fail("loading the seccomp profile", e)))?;
    nix::unistd::chdir(plan.cwd.as_str()).map_err(|e| {
        let why = fail(format!("entering the working directory {}", plan.cwd), e);
        coded(FaultCode::Workdir, why)
    })?;
    sys::default_signals();
    // Nothing of the shim's reaches the job: every descriptor but stdio closes at exec.
    sys::close_from(3, true).map_err(|e| node(fail("closing descriptors", e)))?;
    Ok(())
}

/// The init once the job's program (`program`, its only child) runs: pid 1 of the job's pid
/// namespace, as `docker run --init` puts a small init there. Were the program pid 1 itself,
/// the kernel would drop every signal it has no handler for, from inside the job or from the
/// shim: `kill $$` or `kill -9 $$` would do nothing, and a shell would go on past a cancel's
/// SIGTERM to its next command and end with 0. The init keeps the default dispositions, so it
/// ignores those signals itself (the shim sends each process of the job its own; SIGKILL ends
/// the init, and the kernel the rest with it). It reaps every process orphaned to it, and when
/// the program ends it exits with the program's code, or 128 + the signal that killed it,
/// having written that signal as one byte to `status` for the shim. Never returns.
fn reap(program: nix::unistd::Pid, status: OwnedFd) -> ! {
    use nix::sys::wait::{waitpid, WaitStatus};
    // What `ps` shows for it in the job (its command line stays the shim's it was forked from).
    let _ = nix::sys::prctl::set_name(c"wharf-init");
    // The shim's handlers came with the fork (no exec resets them): every signal back to its
    // default, so that the kernel drops those sent from inside the job, as for any init.
    for sig in 1..=64 {
        if sig != libc::SIGKILL && sig != libc::SIGSTOP {
            // SAFETY: sets a disposition to its default; no handler of this process runs.
            unsafe { libc::signal(sig, libc::SIG_DFL) };
        }
    }
    // Nothing of the shim's stays open here but `status`, and none of the job's files: the
    // program's output ends when its writers do.
    let status = status.as_raw_fd();
    for fd in 0..status {
        // SAFETY: the init uses no descriptor but `status` from here on.
        unsafe { libc::close(fd) };
    }
    let _ = sys::close_from(status as u32 + 1, false);
    let code = loop {
        match waitpid(None, None) {
            Ok(WaitStatus::Exited(pid, code)) if pid == program => break code,
            Ok(WaitStatus::Signaled(pid, sig, _)) if pid == program => {
                let sig = sig as i32;
                // SAFETY: a plain write of one byte to a descriptor this process holds.
                unsafe { libc::write(status, (&(sig as u8) as *const u8).cast(), 1) };
                break 128 + sig;
            }
            Ok(_) | Err(nix::Error::EINTR) => {}
            // No child left (cannot happen while the program runs): nothing to wait for.
            Err(_) => break 127,
        }
    };
    // SAFETY: leaving without the shim's destructors, as in `run`.
    unsafe { libc::_exit(code) }
}

/// Waits for the shim to say `what`. A shim that gave up on this launch (or died) closes the
/// pipe instead: then there is nobody to report to, and nothing of the job's has run.
fn wait_for(go: &OwnedFd, what: u8) {
    let mut byte = [0u8; 1];
    loop {
        match nix::unistd::read(go.as_raw_fd(), &mut byte) {
            Ok(1) if byte[0] == what => return,
            Err(nix::Error::EINTR) => continue,
            // SAFETY: as in `run`.
            _ => unsafe { libc::_exit(126) },
        }
    }
}

/// Drops every capability the plan does not keep (the bounding set first, while it may), then
/// takes the job's ids and, as the plan says (always), forbids gaining privilege again: a
/// setuid binary in the image gives nothing.
fn become_the_user(plan: &Plan) -> Result<(), Failed> {
    let keep = &plan.privileges.capabilities;
    // Every capability this kernel has, not only those a library knows of.
    for cap in 0..64u8 {
        if keep.iter().any(|c| c.index() == cap) {
            continue;
        }
        // SAFETY: a plain prctl with integer arguments.
        if unsafe { libc::prctl(libc::PR_CAPBSET_DROP, libc::c_ulong::from(cap), 0, 0, 0) } != 0 {
            match nix::Error::last() {
                nix::Error::EINVAL => break, // past the last capability
                e => return Err(fail("dropping the bounding set", e)),
            }
        }
    }
    caps::clear(None, caps::CapSet::Ambient).map_err(|e| fail("dropping capabilities", e))?;
    let groups: Vec<Gid> = plan.groups.iter().map(|&g| Gid::from_raw(g)).collect();
    nix::unistd::setgroups(&groups).map_err(|e| fail("setting the job's groups", e))?;
    let gid = Gid::from_raw(plan.gid);
    nix::unistd::setresgid(gid, gid, gid)
        .map_err(|e| fail(format!("becoming group {}", plan.gid), e))?;
    let uid = Uid::from_raw(plan.uid);
    nix::unistd::setresuid(uid, uid, uid)
        .map_err(|e| fail(format!("becoming user {}", plan.uid), e))?;
    let kept: caps::CapsHashSet = keep.iter().copied().collect();
    for set in [
        caps::CapSet::Effective,
        caps::CapSet::Permitted,
        caps::CapSet::Inheritable,
    ] {
        caps::set(None, set, &kept).map_err(|e| fail("dropping capabilities", e))?;
    }
    if plan.privileges.no_new_privs {
        nix::sys::prctl::set_no_new_privs().map_err(|e| fail("setting no_new_privs", e))?;
    }
    Ok(())
}

/// Execs the job's program as execvp does, but with the job's `PATH`: a bare name is looked
/// up in it (an empty entry is the working directory), and a file without a `#!` line that the
/// kernel will not run is run by `/bin/sh`. Returns why not.
fn exec(plan: &Plan) -> Failed {
    let Some(prog) = plan.argv.first() else {
        return "the job has no command".into();
    };
    let cstr = |s: &str| CString::new(s).map_err(|_| format!("{s:?} contains a NUL byte"));
    let all = |list: &[String], what: &str| {
        list.iter()
            .map(|s| cstr(s))
            .collect::<Result<Vec<_>, _>>()
            .map_err(|why| format!("bad {what}: {why}"))
    };
    let (argv, env) = match (all(&plan.argv, "command"), all(&plan.env, "environment")) {
        (Ok(argv), Ok(env)) => (argv, env),
        (Err(why), _) | (_, Err(why)) => return why,
    };
    let path = plan
        .env
        .iter()
        .find_map(|e| e.strip_prefix("PATH="))
        .unwrap_or("/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin");
    let mut denied = false;
    for c in candidates(prog, path) {
        // Returns only on failure.
        let Ok(path) = cstr(&c) else { continue };
        let Err(e) = nix::unistd::execve(&path, &argv, &env);
        match e {
            nix::Error::ENOEXEC => {
                let mut sh = vec![c"/bin/sh".to_owned(), path];
                sh.extend(argv.iter().skip(1).cloned());
                let Err(e) = nix::unistd::execve(&sh[0], &sh, &env);
                return fail(
                    format!("cannot run {} (not a program; /bin/sh)", shown(&c)),
                    e,
                );
            }
            // A candidate that is missing or not ours to run lets the next one try.
            nix::Error::ENOENT | nix::Error::ENOTDIR | nix::Error::ESTALE => {}
            nix::Error::EACCES => denied = true,
            e => return fail(format!("cannot run {}", shown(&c)), e),
        }
    }
    if denied {
        fail(format!("cannot run {}", shown(prog)), nix::Error::EACCES)
    } else {
        format!("command not found in the image: {}", shown(prog))
    }
}

/// A program name as a reason quotes it: a command may be 128 KiB long, the reason not (the
/// errno after the name must survive the reason's own bound).
fn shown(name: &str) -> std::borrow::Cow<'_, str> {
    wharf_api::text::bounded(name, 512)
}

/// Where execvp would look for `prog` along `path`.
fn candidates(prog: &str, path: &str) -> Vec<String> {
    if prog.contains('/') {
        return vec![prog.to_string()];
    }
    path.split(':')
        .map(|d| if d.is_empty() { "." } else { d })
        .map(|d| format!("{}/{prog}", d.trim_end_matches('/')))
        .collect()
}

/// `/proc/self/fd/N`: a path that reaches exactly the object open at `fd`.
fn fd_path(fd: &OwnedFd) -> String {
    format!("/proc/self/fd/{}", fd.as_raw_fd())
}

/// The mount point of `m` inside the root, made first where the plan says so. A bind's is
/// checked where it resolves to (see [`Target::Bind`]).
fn target(root: &OwnedFd, m: &Mount) -> Result<OwnedFd, Failed> {
    let made = match m.target {
        Target::Existing | Target::Bind { .. } => Ok(()),
        Target::Dir => mkdir_in_root(root, &m.path),
        Target::File => touch_in_root(root, &m.path),
    };
    made.map_err(|e| e.to_string())?;
    let opened = match m.target {
        Target::Bind { symlinks: false } => open_in_root_no_symlinks(root, &m.path),
        _ => open_in_root(root, &m.path, OFlag::O_PATH),
    };
    let at = opened.map_err(|e| match (m.target, e) {
        // The shim made the mount points in an image's job layer; one inside another bind
        // (or in the host's root) must be there already: the sandbox makes nothing there.
        (Target::Existing | Target::Bind { .. }, nix::Error::ENOENT) => format!(
            "mount point {} is missing: inside another bind, or in the host's root, it must \
             already exist (the sandbox makes nothing in a bound directory)",
            m.path
        ),
        (Target::Bind { symlinks: false }, nix::Error::ELOOP | nix::Error::EXDEV) => format!(
            "mount point {} is, or passes through, a symlink (in the image, the host's root or \
             another bind): a --mount destination must be reached through no symlink; give \
             the path it points to",
            m.path
        ),
        (_, e) => fail(format!("mount point {} in the root", m.path), e),
    })?;
    if let Target::Bind { .. } = m.target {
        let lands = lands_at(root, &at)?;
        if let Some(dir) = reserved(&lands) {
            return Err(format!(
                "mount point {} leads to {lands}, at or under {dir}, which the sandbox makes \
                 itself: no bind may land there (choose another destination)",
                m.path
            ));
        }
    }
    Ok(at)
}

/// `path` inside `root`, as an `O_PATH` descriptor, through no symlink at all.
fn open_in_root_no_symlinks(root: &OwnedFd, path: &str) -> Result<OwnedFd, nix::Error> {
    use std::os::fd::FromRawFd;
    let rel = path.trim_start_matches('/');
    let rel = if rel.is_empty() { "." } else { rel };
    let how = nix::fcntl::OpenHow::new()
        .flags(OFlag::O_PATH | OFlag::O_CLOEXEC)
        .resolve(
            nix::fcntl::ResolveFlag::RESOLVE_IN_ROOT | nix::fcntl::ResolveFlag::RESOLVE_NO_SYMLINKS,
        );
    let fd = nix::fcntl::openat2(root.as_raw_fd(), rel, how)?;
    // SAFETY: a fresh descriptor we own.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// Where `at` (opened inside `root`) lies in the root, as the kernel names it: the path the
/// job will see, whatever symlinks led there.
fn lands_at(root: &OwnedFd, at: &OwnedFd) -> Result<String, Failed> {
    let name = |fd: &OwnedFd| {
        std::fs::read_link(fd_path(fd))
            .map_err(|e| fail("naming a mount point", e))
            .map(|p| p.to_string_lossy().into_owned())
    };
    let (root_name, at_name) = (name(root)?, name(at)?);
    let inside = match at_name.strip_prefix(root_name.trim_end_matches('/')) {
        Some("") => Some("/"),
        Some(rest) if rest.starts_with('/') => Some(rest),
        _ => None,
    };
    inside
        .map(str::to_string)
        .ok_or_else(|| format!("mount point {at_name} lies outside the root"))
}

/// Mounts `m`: a failure is the user's where they chose the bind (`--mount`), the node's for
/// its own filesystems and binds.
fn mount_one(root: &OwnedFd, m: &Mount, trees: &[BindTree]) -> Result<(), Failed> {
    let users = matches!(m.source, Source::Opened { .. });
    let code = if users {
        FaultCode::Mount
    } else {
        FaultCode::Sandbox
    };
    let at = target(root, m).map_err(|why| {
        if users {
            coded(FaultCode::Mount, why)
        } else {
            why
        }
    })?;
    mount_source(root, m, &at, trees).map_err(|why| coded(code, why))
}

fn mount_source(root: &OwnedFd, m: &Mount, at: &OwnedFd, trees: &[BindTree]) -> Result<(), Failed> {
    match &m.source {
        Source::Fs {
            fstype,
            flags,
            data,
        } => mount(
            Some(*fstype),
            fd_path(at).as_str(),
            Some(*fstype),
            *flags,
            Some(data.as_str()),
        )
        .map_err(|e| fail(format!("mounting {fstype} at {}", m.path), e)),
        Source::Bind { host, attrs } => {
            let tree = sys::clone_tree(None, host.as_os_str(), true)
                .map_err(|e| fail(format!("binding {}", host.display()), e))?;
            sys::set_attrs(&tree, *attrs)
                .map_err(|e| fail(format!("restricting {}", host.display()), e))?;
            sys::move_tree(&tree, at)
                .map_err(|e| fail(format!("binding {} at {}", host.display(), m.path), e))
        }
        Source::Written { contents } => {
            let file = open_in_root(
                root,
                &m.path,
                OFlag::O_WRONLY | OFlag::O_TRUNC | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC,
            )
            .map_err(|e| fail(format!("opening {}", m.path), e))?;
            let mut file = std::fs::File::from(file);
            std::io::Write::write_all(&mut file, contents.as_bytes())
                .map_err(|e| fail(format!("writing {}", m.path), e))?;
            nix::sys::stat::fchmod(
                file.as_raw_fd(),
                nix::sys::stat::Mode::from_bits_truncate(0o444),
            )
            .map_err(|e| fail(format!("making {} read-only", m.path), e))
        }
        Source::Opened { bind, attrs } => {
            let tree = trees
                .iter()
                .find(|t| t.bind == *bind)
                .map(|t| &t.tree)
                .ok_or_else(|| format!("internal error: no source opened for {}", m.path))?;
            sys::set_attrs(tree, *attrs).map_err(|e| fail(format!("restricting {}", m.path), e))?;
            sys::move_tree(tree, at).map_err(|e| fail(format!("binding at {}", m.path), e))
        }
    }
}

fn dev_symlinks(root: &OwnedFd) -> Result<(), Failed> {
    let dev = open_in_root(root, "/dev", OFlag::O_PATH | OFlag::O_DIRECTORY)
        .map_err(|e| fail("/dev in the root", e))?;
    for (to, link) in DEV_SYMLINKS {
        let name = link.trim_start_matches("/dev/");
        nix::unistd::symlinkat(to, Some(dev.as_raw_fd()), name)
            .map_err(|e| fail(format!("making {link}"), e))?;
    }
    Ok(())
}

/// Hides `path` when the root has it: a directory under an empty read-only tmpfs, a file
/// under `/dev/null`.
fn mask(root: &OwnedFd, path: &str) -> Result<(), Failed> {
    let at = match open_in_root(root, path, OFlag::O_PATH) {
        Ok(fd) => fd,
        Err(nix::Error::ENOENT) => return Ok(()),
        Err(e) => return Err(fail(format!("masking {path}"), e)),
    };
    let st = nix::sys::stat::fstat(at.as_raw_fd()).map_err(|e| fail(path, e))?;
    let masked = if SFlag::from_bits_truncate(st.st_mode & libc::S_IFMT) == SFlag::S_IFDIR {
        mount(
            Some("tmpfs"),
            fd_path(&at).as_str(),
            Some("tmpfs"),
            MsFlags::MS_RDONLY | MsFlags::MS_NOSUID | MsFlags::MS_NODEV | MsFlags::MS_NOEXEC,
            Some("size=0"),
        )
        .map_err(std::io::Error::from)
    } else {
        sys::clone_tree(None, OsStr::new("/dev/null"), false)
            .and_then(|tree| sys::move_tree(&tree, &at))
    };
    masked.map_err(|e| fail(format!("masking {path}"), e))
}

/// Makes `path` (and everything under it) read-only, when the root has it.
fn read_only(root: &OwnedFd, path: &str) -> Result<(), Failed> {
    let at = match open_in_root(root, path, OFlag::O_PATH) {
        Ok(fd) => fd,
        Err(nix::Error::ENOENT) => return Ok(()),
        Err(e) => return Err(fail(format!("making {path} read-only"), e)),
    };
    sys::clone_tree(Some(at.as_fd()), OsStr::new(""), true)
        .and_then(|tree| {
            sys::set_attrs(&tree, ATTR_RDONLY | ATTR_NOSUID | ATTR_NODEV | ATTR_NOEXEC)?;
            sys::move_tree(&tree, &at)
        })
        .map_err(|e| fail(format!("making {path} read-only"), e))
}

/// Makes the root `/`, leaving nothing of the host's tree reachable.
fn pivot(root: &OwnedFd) -> Result<(), Failed> {
    nix::unistd::fchdir(root.as_raw_fd()).map_err(|e| fail("entering the root", e))?;
    // The old root lands on top of the new one, and is then detached from it.
    nix::unistd::pivot_root(".", ".").map_err(|e| fail("pivot_root", e))?;
    umount2(".", MntFlags::MNT_DETACH).map_err(|e| fail("detaching the host's root", e))?;
    nix::unistd::chdir("/").map_err(|e| fail("chdir /", e))
}

#[cfg(test)]
mod tests {
    use super::candidates;
    use super::{coded, node, split_code, FaultCode};

    #[test]
    fn a_reason_keeps_the_innermost_code() {
        let why = coded(FaultCode::Mount, "binding at /data: EACCES".into());
        assert_eq!(
            split_code(&why),
            (Some(FaultCode::Mount), "binding at /data: EACCES")
        );
        // A step around it does not reclassify it.
        assert_eq!(split_code(&node(why.clone())).0, Some(FaultCode::Mount));
        assert_eq!(
            split_code(&node("setsid: EPERM".into())).0,
            Some(FaultCode::Sandbox)
        );
        assert_eq!(split_code("plain words"), (None, "plain words"));
    }

    #[test]
    fn bare_names_are_looked_up_like_execvp() {
        assert_eq!(candidates("/bin/true", "/x"), ["/bin/true"]);
        assert_eq!(candidates("./run.sh", "/x"), ["./run.sh"]);
        assert_eq!(
            candidates("python", "/opt/bin/::/usr/bin"),
            ["/opt/bin/python", "./python", "/usr/bin/python"]
        );
    }
}
